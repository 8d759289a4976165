"""Two cyzero checkouts searching the same positions at fixed nodes: do they play the same?

Issue 47 made the search cheaper per node and promised the same tree. This starts both
engines (each checkout's own ``python -m uci``, with its own in-place build, on the bundled
network) and, position by position, sends each ``ucinewgame`` and ``go nodes N``, then
compares the bestmove and the last info line (score, nodes, pv). The positions are the match
openings followed by 0 to 40 plies of Stockfish at depth 5, drawn among its three best moves
(sensible, varied games), seeded.

    python docs/recipes/same-search.py OLD_CHECKOUT [--nodes 300 3000] [--positions 200] [--seed 1]

OLD_CHECKOUT is a clone of the old commit with ``python setup.py build_ext --inplace`` run in
it. Exits 1 at the first difference, with both answers.
"""
import argparse
import random
import sys
from pathlib import Path

import chess
import chess.engine

NEW = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(NEW))
from engine.tools.match import load_openings  # noqa: E402


def positions(count: int, seed: int, stockfish: str) -> list[chess.Board]:
    rng = random.Random(seed)
    openings = load_openings()
    out = []
    with chess.engine.SimpleEngine.popen_uci(stockfish) as sf:
        while len(out) < count:
            board = openings[rng.randrange(len(openings))].board()
            for _ in range(rng.randrange(0, 41)):
                if board.is_game_over():
                    break
                infos = sf.analyse(board, chess.engine.Limit(depth=5), multipv=3)
                board.push(infos[rng.randrange(len(infos))]["pv"][0])
            if not board.is_game_over():
                out.append(board)
    return out


def answer(engine: chess.engine.SimpleEngine, board: chess.Board, nodes: int) -> tuple:
    result = engine.play(board, chess.engine.Limit(nodes=nodes), game=object(), info=chess.engine.INFO_ALL)
    info = result.info
    return (result.move.uci(), str(info.get("score")), info.get("nodes"),
            " ".join(m.uci() for m in info.get("pv", [])))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old", type=Path)
    parser.add_argument("--nodes", type=int, nargs="+", default=[300, 3000])
    parser.add_argument("--positions", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--stockfish", default="/usr/games/stockfish")
    args = parser.parse_args()
    boards = positions(args.positions, args.seed, args.stockfish)
    engines = {name: chess.engine.SimpleEngine.popen_uci([sys.executable, "-m", "uci"], cwd=str(path))
               for name, path in (("new", NEW), ("old", args.old.resolve()))}
    try:
        for nodes in args.nodes:
            for i, board in enumerate(boards):
                new, old = (answer(engines[name], board, nodes) for name in ("new", "old"))
                if new != old:
                    print(f"differ at {nodes} nodes, position {i}: {board.fen()}\n  new {new}\n  old {old}")
                    return 1
            print(f"{nodes} nodes: the same bestmove, score, nodes and pv in all {len(boards)} positions "
                  f"(seed {args.seed})", flush=True)
    finally:
        for engine in engines.values():
            engine.quit()
    return 0


if __name__ == "__main__":
    sys.exit(main())
