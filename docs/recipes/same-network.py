"""cyzero and lc0 on the same lc0 network file, at fixed nodes: do they choose the same moves?

Issue 53's check of a trained network both engines play (the match itself is ``cyzero match
--engine2 'lc0 ...' --nodes 300``, docs/playing.md). This starts cyzero (``python -m uci`` of this
checkout, ``Threads 1``, ``WeightsFile NET``) and lc0 (``--weights=NET --threads=1``, its defaults
otherwise) and, position by position, sends each ``ucinewgame`` and ``go nodes N`` for every N given,
then counts the positions where both play the same move. The positions are those of
docs/recipes/same-search.py: the match openings followed by 0 to 40 plies of Stockfish at depth 5
drawn among its three best moves, seeded. One node is each engine's raw policy (its first choice);
more is the search on top of it.

    python docs/recipes/same-network.py NET --lc0 /path/to/lc0 [--nodes 1 300] [--positions 200] [--seed 1]
        [--cyzero-backend cpu]

Prints one line per node count: the share of positions with the same move, and each engine's seconds.
"""
import argparse
import importlib.util
import sys
import time
from pathlib import Path

import chess
import chess.engine

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
_spec = importlib.util.spec_from_file_location("same_search", Path(__file__).with_name("same-search.py"))
same_search = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(same_search)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("weights", type=Path, help="an lc0 network file both engines play")
    parser.add_argument("--lc0", required=True, help="lc0 v0.32.1")
    parser.add_argument("--backend", default="eigen", help="lc0's backend (default eigen)")
    parser.add_argument("--cyzero-backend", default="auto",
                        help="cyzero's Backend option (default auto: OpenVINO bf16 where the processor has it; "
                             "cpu: ONNX Runtime in float32, lc0's own arithmetic)")
    parser.add_argument("--nodes", type=int, nargs="+", default=[1, 300])
    parser.add_argument("--positions", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--stockfish", default="/usr/games/stockfish")
    args = parser.parse_args()
    boards = same_search.positions(args.positions, args.seed, args.stockfish)
    weights = str(args.weights.resolve())
    cyzero = chess.engine.SimpleEngine.popen_uci([sys.executable, "-m", "uci"], cwd=str(REPO))
    cyzero.configure({"Threads": 1, "WeightsFile": weights, "Backend": args.cyzero_backend})
    lc0 = chess.engine.SimpleEngine.popen_uci([args.lc0, f"--weights={weights}", "--threads=1",
                                               f"--backend={args.backend}"])
    try:
        for nodes in args.nodes:
            same, seconds, differ = 0, {"cyzero": 0.0, "lc0": 0.0}, []
            for board in boards:
                moves = {}
                for name, engine in (("cyzero", cyzero), ("lc0", lc0)):
                    start = time.perf_counter()
                    moves[name] = engine.play(board, chess.engine.Limit(nodes=nodes), game=object()).move
                    seconds[name] += time.perf_counter() - start
                if moves["cyzero"] == moves["lc0"]:
                    same += 1
                else:
                    differ.append(f"{board.fen()}: cyzero {moves['cyzero']}, lc0 {moves['lc0']}")
            print(f"{nodes} nodes: the same move in {same} of {len(boards)} positions ({100 * same / len(boards):.1f}%, "
                  f"seed {args.seed}); seconds cyzero {seconds['cyzero']:.1f}, lc0 {seconds['lc0']:.1f}", flush=True)
            for line in differ[:5]:
                print("  differ:", line)
    finally:
        cyzero.quit()
        lc0.quit()
    return 0


if __name__ == "__main__":
    sys.exit(main())
