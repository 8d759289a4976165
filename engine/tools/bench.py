"""``cyzero bench ...``: speed measured side by side in one run.

Each benchmark is registered under a name (:func:`engine.tools.bench_common.register`)
and becomes the subcommand ``cyzero bench <name>``; each family lives in its own
module, ``engine/tools/bench_<name>.py``.  A benchmark adds its own arguments and returns a
process exit code; with ``--json`` it prints exactly one JSON object on
stdout and nothing else.

Registered so far:

``perft``
    bulk-counting perft of the Cython core (``engine.board.Board.perft``)
    against a bulk-counting perft written on python-chess, over a fixed set
    of positions.  Before a speed is reported, both engines' node counts are
    checked against each other at a common depth and against the published
    counts, so the bench never reports a speed for a wrong move generator.

``nn``
    the network through ``engine.network``, like lc0's ``backendbench``:
    positions/s at batch sizes 1 to 256, the networks alternating in short
    rounds. On a CPU, every runtime and precision the engine can run the
    bundled network in (:data:`engine.tools.bench_nn.NN_CPU_RUNTIMES`: ONNX Runtime fp32 and int8,
    OpenVINO int8, bf16 and fp32), each as a share of the core's nominal peak
    for its arithmetic (``engine.processor``) and as a ratio over ``cpu int8``,
    today's ``Backend=cpu``; on a GPU, the bundled export variants (fp32,
    fp16, int8) and their speed-ups over fp32. ``--net PATH`` times other
    files instead.

``tree``
    playouts/s of the Cython MCTS (``engine.tree``) against a plain-Python
    PUCT search on python-chess (``engine.tools.puct_reference``: Node objects with
    dicts of children, Board push/pop, legal moves per expansion, one playout
    at a time), both with the null evaluator (uniform policy, a draw), from
    the start position and two middlegames.  The headline ratio is equal
    work: Cython searches as large as the Python search got, writing no input
    planes (neither side needs them with a null evaluator).  Also reported:
    one Cython search growing for the whole time and encoding every leaf's
    planes, and bytes per node.

``search``
    engine nodes/s with the bundled network (the whole search loop: gather,
    evaluate, backup, callbacks) next to the raw ``evaluate`` throughput at
    the same batch size, alternating in one run, with one batch and with two
    batches in flight; ``efficiency`` is their ratio, and bytes per node of
    the trees built. Then ``go movetime 200`` with the UCI defaults: median
    nodes against what raw evaluate could do in its time (target >= 50 %); then
    the engine's nodes/s on ``--backend`` and on ``--baseline`` (default ``cpu``),
    alternating over the same positions.

``null``
    the search's own cost per node: the UCI ``Searcher`` on a network that costs
    nothing (:class:`engine.tools.bench_null.NullNetwork`: fixed outputs shaped as lc0's random backend),
    nodes/s at MinibatchSize 8, 64 and 256 (``--batches``) from fixed positions;
    when ``CYZERO_LC0`` (or ``--lc0``) names an lc0 binary, lc0's ``random``
    backend with one thread and no task workers at the same MinibatchSize on the
    same positions, alternating with cyzero, and the ratio cyzero / lc0.

``uci``
    protocol latencies over pipes, as a GUI sees them, on real engine
    processes (Backend cpu, Move Overhead 0): ``stop`` to ``bestmove`` and
    ``isready`` to ``readyok`` during ``go infinite`` after random delays,
    process start to ``uciok`` over fresh processes, and the overshoot of
    ``go movetime N`` (time to ``bestmove`` minus N), with p50/p99/max and
    the targets (p99: stop < 1 ms, isready < 1 ms, uciok < 500 ms,
    overshoot < 20 ms) met or missed.

``mates``
    not a speed: the share of forced mates in 1, 2 and 3 (``engine/tools/mates.epd``,
    generated with Stockfish) where the engine's best move at each node budget
    mates as fast as possible, and the mean time per search (``engine.tools.mates``).
"""

from __future__ import annotations

import argparse
import sys

# Each family module registers its benchmark on import: this order is the order of the help.
from engine.tools import (  # noqa: F401
    bench_perft, bench_nn, bench_tree, bench_uci, bench_search, bench_null, bench_mates,
)
from engine.tools.bench_common import BENCHMARKS, BenchError


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Add ``bench`` and one sub-subcommand per registered benchmark to a CLI's subparsers."""
    parser = subparsers.add_parser(
        "bench",
        help="speed benchmarks, measured side by side in one run",
        description="Speed benchmarks. Each prints ratios measured side by side in one run.",
    )
    names = parser.add_subparsers(dest="benchmark", metavar="BENCHMARK")
    names.required = True
    for bench in BENCHMARKS.values():
        sub = names.add_parser(bench.name, help=bench.help, description=bench.help)
        bench.add_arguments(sub)
        sub.set_defaults(bench_run=bench.run)
    parser.set_defaults(func=main)
    return parser


def main(args: argparse.Namespace) -> int:
    """Run the benchmark the parsed arguments name; returns the process exit code."""
    try:
        return args.bench_run(args)
    except BenchError as e:
        print(f"cyzero bench {args.benchmark}: {e}", file=sys.stderr)
        return 1
