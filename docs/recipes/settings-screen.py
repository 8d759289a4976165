"""Screen search settings on scored positions: each setting's move at a fixed node count,
and the expected score it gives up against Stockfish's best move.

    python docs/recipes/settings-screen.py NODES POSITIONS.jsonl OUT.json SETTING ...

A SETTING is ``name=value,...`` over ``engine.params.SearchParams`` fields (``''`` is the
defaults; ``cpuct`` and ``fpu_value`` set their root values too). Positions come from
``settings-positions.py``. Every setting searches the same positions with the bundled
network's CPU file on one thread, a fresh tree each, so the comparison is paired; the
expected score of a centipawn value is 1 / (1 + exp(-0.00368 cp)). OUT keeps each
setting's moves and per-position losses. It screens only: it resolves about one doubling
of the node count on 1,200 positions, so a setting is decided by a match.
"""
import json
import math
import sys
import time

from engine.board import Board
from engine.limits import GoParams
from engine.params import SearchParams
from engine.search import MultiSearch
from engine.weights import NetworkBuilder, resolve_weights


def expected_score(cp: float) -> float:
    return 1 / (1 + math.exp(-0.00368208 * cp))


def main() -> None:
    nodes, posfile, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    positions = [json.loads(line) for line in open(posfile)]
    net = NetworkBuilder(backend="cpu", threads=1).load_weights_file(resolve_weights(None)).network
    results = {}
    for setting in sys.argv[4:]:
        kw = {k: float(v) for k, v in (part.split("=") for part in setting.split(",") if part)}
        for name in ("cpuct", "fpu_value"):
            if name in kw:
                kw.setdefault(f"{name}_root", kw[name])
        params = SearchParams(**kw)
        started, moves = time.time(), []
        for i in range(0, len(positions), 32):   # 32 trees a batch, as self-play searches
            games = MultiSearch(net, params, pipeline=False)
            moves += [r.best for r in games.search([(Board(p["fen"]), GoParams(nodes=nodes))
                                                   for p in positions[i:i + 32]])]
            games.close()
        losses = [expected_score(max(p["cp"].values())) - expected_score(p["cp"].get(m, -10000))
                  for p, m in zip(positions, moves)]
        results[setting or "default"] = {"moves": moves, "losses": losses}
        print(f"{setting or 'default':40s} mean loss {sum(losses) / len(losses):.4f} "
              f"({time.time() - started:.0f} s)", flush=True)
    with open(out, "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main()
