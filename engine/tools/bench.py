"""``cyzero bench ...``: speed measured side by side in one run.

Each benchmark is registered under a name and becomes the subcommand
``cyzero bench <name>``.  A benchmark adds its own arguments and returns a
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
    bundled network in (:data:`NN_CPU_RUNTIMES`: ONNX Runtime fp32 and int8,
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
    nothing (:class:`NullNetwork`: fixed outputs shaped as lc0's random backend),
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
import importlib
import json
import math
import os
import platform
import sys
import threading
import time
from dataclasses import dataclass
from typing import Callable

from engine import __version__, processor
from engine.params import SearchParams
from engine.sessions import BACKENDS


class BenchError(Exception):
    """A benchmark could not produce a trustworthy result (e.g. node counts disagree)."""


# --------------------------------------------------------------------------- registry


@dataclass(frozen=True)
class Benchmark:
    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


BENCHMARKS: dict[str, Benchmark] = {}


def register(name: str, help: str, add_arguments: Callable[[argparse.ArgumentParser], None]):
    """Decorator: register ``run(args) -> exit code`` as ``cyzero bench <name>``."""

    def decorator(run: Callable[[argparse.Namespace], int]):
        if name in BENCHMARKS:
            raise ValueError(f"benchmark {name!r} registered twice")
        BENCHMARKS[name] = Benchmark(name, help, add_arguments, run)
        return run

    return decorator


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


def _json_and_seconds(parser: argparse.ArgumentParser, seconds: float, what: str) -> None:
    parser.add_argument(
        "--json", action="store_true", help="print one JSON object on stdout and nothing else"
    )
    parser.add_argument(
        "--seconds",
        type=_positive_float,
        default=seconds,
        metavar="S",
        help=f"target time of each {what} in seconds (default {seconds})",
    )


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be a positive number: {text!r}")
    return value


def _run_facts(started: float) -> dict:
    """The JSON keys every timed bench ends with: how long it ran (from ``started``, a
    time.perf_counter() value) and where."""
    return {"wall_seconds": round(time.perf_counter() - started, 3),
            "environment": {**_environment(), "cpu_count": os.cpu_count()}}


def _environment() -> dict:
    import chess

    return {
        "cyzero_version": __version__,
        "python_chess_version": chess.__version__,
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "machine": platform.machine(),
        "system": platform.system(),
    }


# --------------------------------------------------------------------------- perft


@dataclass(frozen=True)
class PerftPosition:
    name: str
    fen: str
    chess960: bool
    counts: tuple[int, ...]  # published node counts at depth 1, 2, ...


# Node counts from the Chess Programming Wiki's "Perft Results" and
# "Chess960 Perft Results" pages.
PERFT_POSITIONS: tuple[PerftPosition, ...] = (
    PerftPosition(
        "startpos",
        "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1",
        False,
        (20, 400, 8902, 197281, 4865609, 119060324, 3195901860),
    ),
    PerftPosition(
        "kiwipete",
        "r3k2r/p1ppqpb1/bn2pnp1/3PN3/1p2P3/2N2Q1p/PPPBBPPP/R3K2R w KQkq - 0 1",
        False,
        (48, 2039, 97862, 4085603, 193690690, 8031647685),
    ),
    PerftPosition(
        "position3",
        "8/2p5/3p4/KP5r/1R3p1k/8/4P1P1/8 w - - 0 1",
        False,
        (14, 191, 2812, 43238, 674624, 11030083, 178633661, 3009794393),
    ),
    PerftPosition(
        "position4",
        "r3k2r/Pppp1ppp/1b3nbN/nP6/BBP1P3/q4N2/Pp1P2PP/R2Q1RK1 w kq - 0 1",
        False,
        (6, 264, 9467, 422333, 15833292, 706045033),
    ),
    PerftPosition(
        "position5",
        "rnbq1k1r/pp1Pbppp/2p5/8/2B5/8/PPP1NnPP/RNBQK2R w KQ - 1 8",
        False,
        (44, 1486, 62379, 2103487, 89941194),
    ),
    PerftPosition(
        "position6",
        "r4rk1/1pp1qppp/p1np1n2/2b1p1B1/2B1P1b1/P1NP1N2/1PP1QPPP/R4RK1 w - - 0 10",
        False,
        (46, 2079, 89890, 3894594, 164075551, 6923051137),
    ),
    PerftPosition(
        "chess960",
        "bqnb1rkr/pp3ppp/3ppn2/2p5/5P2/P2P4/NPP1P1PP/BQ1BNRKR w HFhf - 2 9",
        True,
        (21, 528, 12189, 326672, 8146062, 227689589),
    ),
)

MAX_DEPTH = 12  # never deepen past this, whatever the timings say


def python_chess_perft(board, depth: int) -> int:
    """Bulk-counting perft on python-chess: count the legal moves at depth 1."""
    if depth <= 0:
        return 1
    if depth == 1:
        return board.legal_moves.count()
    nodes = 0
    for move in board.legal_moves:
        board.push(move)
        nodes += python_chess_perft(board, depth - 1)
        board.pop()
    return nodes


@dataclass
class Measurement:
    depth: int
    nodes: int  # node count of one run
    runs: int
    seconds: float  # all runs together

    @property
    def total_nodes(self) -> int:
        return self.nodes * self.runs

    @property
    def nps(self) -> float:
        return self.total_nodes / self.seconds if self.seconds > 0 else 0.0

    def as_dict(self) -> dict:
        return {
            "depth": self.depth,
            "nodes": self.nodes,
            "runs": self.runs,
            "seconds": round(self.seconds, 6),
            "nps": round(self.nps, 1),
        }


def measure(perft: Callable[[int], int], seconds: float) -> Measurement:
    """Time ``perft`` at the deepest depth whose one run is predicted to stay under ~2x ``seconds``.

    Deepens from depth 1, predicting the next depth's time from the last
    run's time and the growth of the node count.  The chosen depth is then
    repeated until the runs together take at least ``seconds``, so even a
    fast depth is measured over a stable stretch of time.
    """
    prev_nodes = 0
    depth = 0
    while True:
        depth += 1
        start = time.perf_counter()
        nodes = perft(depth)
        elapsed = time.perf_counter() - start
        growth = max(nodes / prev_nodes, 2.0) if prev_nodes else 40.0
        prev_nodes = nodes
        if depth >= MAX_DEPTH or elapsed * growth > 2.0 * seconds:
            break
    result = Measurement(depth, nodes, 1, elapsed)
    while result.seconds < seconds:
        start = time.perf_counter()
        again = perft(depth)
        result.seconds += time.perf_counter() - start
        result.runs += 1
        if again != nodes:
            raise BenchError(f"perft({depth}) gave {nodes} and then {again} nodes")
    return result


def _check_known(pos: PerftPosition, engine: str, depth: int, nodes: int) -> int | None:
    if depth > len(pos.counts):
        return None
    known = pos.counts[depth - 1]
    if nodes != known:
        raise BenchError(
            f"{pos.name}: {engine} perft({depth}) = {nodes}, the published count is {known}"
        )
    return known


def run_perft_position(pos: PerftPosition, seconds: float) -> dict:
    import chess

    from engine.board import Board

    core_board = Board(pos.fen, chess960=pos.chess960)
    py_board = chess.Board(pos.fen, chess960=pos.chess960)

    py = measure(lambda d: python_chess_perft(py_board, d), seconds)
    core = measure(core_board.perft, seconds)

    # Both move generators must agree with each other at a common depth
    # (python-chess's depth: the core reaches it easily) and with the published counts.
    common = min(py.depth, core.depth)
    core_common = core.nodes if common == core.depth else core_board.perft(common)
    py_common = py.nodes if common == py.depth else python_chess_perft(py_board, common)
    if core_common != py_common:
        raise BenchError(
            f"{pos.name}: perft({common}) disagrees: core {core_common}, "
            f"python-chess {py_common} (fen {pos.fen!r})"
        )
    _check_known(pos, "python-chess", py.depth, py.nodes)
    _check_known(pos, "core", core.depth, core.nodes)
    known = _check_known(pos, "both engines", common, core_common)

    return {
        "name": pos.name,
        "fen": pos.fen,
        "chess960": pos.chess960,
        "core": core.as_dict(),
        "python_chess": py.as_dict(),
        "common_depth": common,
        "common_nodes": core_common,
        "known_nodes": known,
        "ratio": round(core.nps / py.nps, 2) if py.nps else None,
    }


def _fmt_int(n: float) -> str:
    return f"{int(round(n)):,}"


def _print_position(result: dict) -> None:
    print(f"{result['name']}  {result['fen']}" + ("  (chess960)" if result["chess960"] else ""))
    print(f"  {'engine':<14}{'depth':>6}{'nodes/run':>16}{'runs':>6}{'seconds':>10}{'nodes/s':>16}")
    for label, key in (("core", "core"), ("python-chess", "python_chess")):
        m = result[key]
        print(
            f"  {label:<14}{m['depth']:>6}{_fmt_int(m['nodes']):>16}"
            f"{m['runs']:>6}{m['seconds']:>10.3f}{_fmt_int(m['nps']):>16}"
        )
    known = result["known_nodes"]
    print(
        f"  counts agree at depth {result['common_depth']}: {_fmt_int(result['common_nodes'])} nodes"
        + (" (the published count)" if known is not None else "")
        + f"; core is {result['ratio']:.1f}x python-chess here"
    )
    print(flush=True)


def _require_core(module: str) -> None:
    """BenchError with the fix when the Cython core is not built."""
    try:
        importlib.import_module(module)
    except ImportError as e:
        raise BenchError(f"the Cython core is not built ({e}); run `make build`") from None


def _add_perft_arguments(parser: argparse.ArgumentParser) -> None:
    _json_and_seconds(parser, 1.0, "measurement (per position and engine)")


@register(
    "perft",
    "bulk-counting perft: the Cython core against python-chess, over 7 positions",
    _add_perft_arguments,
)
def bench_perft(args: argparse.Namespace) -> int:
    _require_core("engine.board")

    started = time.perf_counter()
    positions = []
    for pos in PERFT_POSITIONS:
        result = run_perft_position(pos, args.seconds)
        positions.append(result)
        if not args.json:
            _print_position(result)

    def total_nps(key: str) -> float:
        nodes = sum(p[key]["nodes"] * p[key]["runs"] for p in positions)
        secs = sum(p[key]["seconds"] for p in positions)
        return nodes / secs if secs else 0.0

    core_nps = total_nps("core")
    py_nps = total_nps("python_chess")
    ratio = core_nps / py_nps if py_nps else float("nan")
    geomean = math.exp(sum(math.log(p["ratio"]) for p in positions) / len(positions))
    summary = {
        "benchmark": "perft",
        "core_nps": round(core_nps, 1),
        "python_chess_nps": round(py_nps, 1),
        "ratio": round(ratio, 2),
        "ratio_geomean": round(geomean, 2),
        "seconds_target": args.seconds,
        "wall_seconds": round(time.perf_counter() - started, 3),
        "positions": positions,
        "environment": _environment(),
    }
    if args.json:
        print(json.dumps(summary))
    else:
        print(
            f"total: core {_fmt_int(core_nps)} nodes/s, python-chess {_fmt_int(py_nps)} nodes/s, "
            f"ratio {ratio:.1f} (geometric mean over positions {geomean:.1f}), "
            f"{summary['wall_seconds']:.1f} s"
        )
    return 0


# --------------------------------------------------------------------------- nn

NN_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
# The bundled network and its export variants, in the order they are reported.
NN_VARIANTS = (
    ("fp32", "default.onnx"),
    ("fp16", "default.fp16.onnx"),
    ("int8", "default.int8.onnx"),
)
# On a CPU: every runtime and precision the engine can run the bundled network in, as
# (label, file, backend, precision, arithmetic); today's ``Backend=cpu`` first, the
# baseline of the ratios. bf16 only where the processor has it in hardware.
NN_CPU_RUNTIMES = (
    ("cpu int8", "default.int8.onnx", "cpu", None, "int8"),
    ("cpu fp32", "default.onnx", "cpu", None, "fp32"),
    ("openvino int8", "default.int8.onnx", "openvino", None, "int8"),
    ("openvino bf16", "default.onnx", "openvino", "bf16", "bf16"),
    ("openvino fp32", "default.onnx", "openvino", "fp32", "fp32"),
)


def _batch_list(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(sorted({int(word) for word in text.replace(" ", "").split(",") if word}))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected whole numbers separated by commas: {text!r}"
        ) from None
    if not sizes or sizes[0] < 1:
        raise argparse.ArgumentTypeError(f"batch sizes must be 1 or more: {text!r}")
    return sizes


def _add_nn_arguments(parser: argparse.ArgumentParser) -> None:
    _json_and_seconds(parser, 0.5, "measurement (per batch size and variant)")
    parser.add_argument(
        "--batches",
        type=_batch_list,
        default=NN_BATCHES,
        metavar="B,B,...",
        help="batch sizes to time (default " + ",".join(map(str, NN_BATCHES)) + ")",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        metavar="T",
        help="ONNX Runtime intra-op threads (default: its own, one per physical core)",
    )
    parser.add_argument(
        "--backend",
        choices=BACKENDS,
        default="auto",
        help="execution provider (default auto: TensorRT, then CUDA, then the CPU; on the CPU every "
             "runtime and precision is timed side by side: cpu int8 is today's Backend=cpu)",
    )
    parser.add_argument(
        "--cuda-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a CUDA provider option to measure, e.g. cudnn_conv_algo_search=EXHAUSTIVE (repeatable; "
             "the default is HEURISTIC, see engine/sessions.py)",
    )
    parser.add_argument(
        "--net",
        action="append",
        default=None,
        metavar="PATH",
        help="time this network file (.onnx, or an lc0 .pb.gz) instead of the bundled variants (repeatable)",
    )


def _nn_inputs(n: int) -> tuple[np.ndarray, str]:
    """``n`` encoded positions from seeded random games, or random planes without the encoder."""
    import numpy as np

    try:
        from engine import encoding
        from engine.board import Board
    except ImportError:
        rng = np.random.default_rng(0)
        planes = (rng.random((n, 112, 8, 8)) < 0.05).astype(np.float32)
        planes[:, 111] = 1.0
        return planes, "random planes (engine.encoding is not built)"
    import random

    rng = random.Random(0)
    boards = []
    board = Board()
    while len(boards) < n:
        moves = board.legal_moves()
        if not moves or board.ply() >= 120:
            board = Board()
            continue
        board.push_uci(rng.choice(moves))
        boards.append(board.copy())
    return encoding.encode_boards(boards), "encoded positions (seeded random games)"


NN_ROUNDS = 4  # each batch size's time is split into rounds that alternate the variants


def _time_slice(net, planes, outputs, seconds: float) -> tuple[int, float]:
    """Runs of ``net`` on ``planes`` until ``seconds`` have passed: (runs, seconds taken)."""
    policy, wdl, mlh = outputs
    runs = 0
    start = time.perf_counter()
    while True:
        net.evaluate_into(planes, policy, wdl, mlh)
        runs += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return runs, elapsed


def _time_batch(networks, planes, outputs, seconds: float) -> dict[str, dict]:
    """Every network at one batch size: a warm-up run each, then alternating timed rounds.

    Alternating in short rounds, rather than timing one network after the
    other, spreads any change in machine load over all of them alike.
    """
    for _, net in networks:
        net.evaluate_into(planes, *outputs)
    totals = {label: [0, 0.0] for label, _ in networks}
    for _ in range(NN_ROUNDS):
        for label, net in networks:
            runs, elapsed = _time_slice(net, planes, outputs, seconds / NN_ROUNDS)
            totals[label][0] += runs
            totals[label][1] += elapsed
    n = planes.shape[0]
    return {
        label: {"runs": runs, "seconds": round(secs, 6), "pps": n * runs / secs}
        for label, (runs, secs) in totals.items()
    }


def _cuda_options(pairs: list[str]) -> dict[str, str]:
    options = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise BenchError(f"--cuda-option takes KEY=VALUE, got {pair!r}")
        options[key.strip()] = value.strip()
    return options


def _width(label: str) -> int:
    """Column width for ``label``'s positions/s in bench nn's table."""
    return max(16, len(label) + 8)


def _nn_networks(args: argparse.Namespace, cpu: bool) -> list[tuple[str | None, str, str, str | None]]:
    """[(label, path, backend, precision)] to time: the --net files (label None) on
    ``--backend``; on a CPU every runtime and precision of the bundled network
    (:data:`NN_CPU_RUNTIMES`) that this machine has; else the bundled variants that exist."""
    if args.net:
        return [(None, path, args.backend, None) for path in args.net]
    from engine.sessions import openvino_missing
    from engine.weights import default_weights_path

    nets_dir = os.path.dirname(default_weights_path())
    if cpu:
        found = [(label, os.path.join(nets_dir, name), backend, precision)
                 for label, name, backend, precision, arithmetic in NN_CPU_RUNTIMES
                 if (backend != "openvino" or openvino_missing() is None)
                 and (arithmetic != "bf16" or processor.native_bf16())]
    else:
        found = [(label, os.path.join(nets_dir, name), args.backend, None) for label, name in NN_VARIANTS]
    found = [entry for entry in found if os.path.exists(entry[1])]
    if not found:
        raise BenchError(
            f"no bundled network in {nets_dir} (expected default.onnx); use --net PATH"
        )
    return found


def macs_per_position(path: str) -> int | None:
    """Multiply-adds one position costs in the network at ``path`` (an ONNX file): every Conv
    on the 8x8 board and every Gemm/MatMul, from their weights (a quantized file's weights
    through their DequantizeLinear); None where the file cannot be read so."""
    try:
        import onnx
        from onnx import numpy_helper

        model = onnx.load(path)
    except Exception:  # noqa: BLE001 - an lc0 file, or no onnx: no figure
        return None
    shapes = {t.name: list(t.dims) for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "DequantizeLinear" and node.input[0] in shapes:
            shapes[node.output[0]] = shapes[node.input[0]]
        elif node.op_type == "Constant" and node.attribute:
            shapes[node.output[0]] = list(numpy_helper.to_array(node.attribute[0].t).shape)
    total = 0
    for node in model.graph.node:
        weight = shapes.get(node.input[1]) if len(node.input) > 1 else None
        if weight is None:
            continue
        if node.op_type == "Conv" and len(weight) == 4:
            total += math.prod(weight) * 64   # 'same' padding: the output is 8x8
        elif node.op_type in ("Gemm", "MatMul") and len(weight) == 2:
            total += math.prod(weight)
    return total or None


@register(
    "nn",
    "network speed: positions/s per batch size for the bundled network on every CPU runtime and "
    "precision (or its fp16/int8 variants on a GPU), with the share of the core's peak",
    _add_nn_arguments,
)
def bench_nn(args: argparse.Namespace) -> int:
    import numpy as np

    from engine.network import OPENVINO, POLICY_SIZE, Network, NetworkError
    from engine.sessions import CPU

    if args.threads is not None and args.threads < 0:
        raise BenchError(f"--threads must be 0 or more, got {args.threads}")
    started = time.perf_counter()
    batches = args.batches
    max_batch = max(batches)
    said: set[str] = set()

    def log(line: str) -> None:  # the backend line, once, on stderr (stdout may be JSON)
        if line not in said:
            said.add(line)
            print(line, file=sys.stderr, flush=True)

    def load(path: str, backend: str, precision: str | None):
        digest_file = path + ".sha256"
        expected = None
        if os.path.exists(digest_file):
            with open(digest_file, encoding="utf-8") as f:
                expected = f.read()
        try:
            return Network(path, backend=backend, intra_threads=args.threads, max_batch=max_batch,
                           log=log, expected_sha256=expected, warmup_batch=1, precision=precision,
                           cuda_options=_cuda_options(args.cuda_option))
        except NetworkError as e:
            raise BenchError(str(e)) from None

    # Which side of the machine is timed: one load of the fp32 file on --backend tells.
    cpu = False
    if not args.net:
        from engine.weights import default_weights_path

        probe = load(default_weights_path(), args.backend, None)
        cpu = probe.provider in (CPU, OPENVINO)
        probe.close()
    networks = [(label, load(path, backend, precision))
                for label, path, backend, precision in _nn_networks(args, cpu)]
    if networks[0][0] is None:
        # --net files: by variant (fp32, fp16, int8) where those tell them apart, else by file name
        variants = [net.variant for _, net in networks]
        names = variants if len(set(variants)) == len(variants) else \
            [os.path.basename(net.path) for _, net in networks]
        networks = [(name + "'" * names[:i].count(name), net)
                    for i, (name, (_, net)) in enumerate(zip(names, networks))]

    planes_all, inputs = _nn_inputs(max_batch)
    outputs = (
        np.empty((max_batch, POLICY_SIZE), np.float32),
        np.empty((max_batch, 3), np.float32),
        np.empty(max_batch, np.float32),
    )
    labels = [label for label, _ in networks]
    first = networks[0][1]
    # The ratio column: each network over the first (today's Backend=cpu on a CPU), or int8
    # over fp32 (a GPU's variants).
    if cpu and len(labels) > 1:
        base, ratio_of = labels[0], labels[1:]
    elif "fp32" in labels and "int8" in labels:
        base, ratio_of = "fp32", ["int8"]
    elif len(labels) == 2:   # two files side by side (e.g. an lc0 file and lc0's own export)
        base, ratio_of = labels[1], [labels[0]]
    else:
        base, ratio_of = None, []
    machine = processor.describe()
    if not args.json:
        threads = args.threads if args.threads else "default"
        print(f"machine: {machine}; threads: {threads}; inputs: {inputs}")
        if processor.isa_cap():
            print(f"ONEDNN_MAX_CPU_ISA={processor.isa_cap()} holds OpenVINO to it; ONNX Runtime's CPU "
                  f"path knows no such cap and runs on {processor.vector_isa(processor.cpuinfo_flags())}")
        for label, net in networks:
            print(f"  {label:<14} {net.description}")
        print()
        header = f"{'batch':>6}" + "".join(f"{label + ' pos/s':>{_width(label)}}" for label in labels)
        # on a CPU each ratio column is that runtime over the first (today's Backend=cpu)
        header += "".join(f"{r + ' x' if cpu else r + '/' + base:>{_width(r) - 4}}" for r in ratio_of)
        print(header, flush=True)

    results: dict[str, dict] = {label: {} for label in labels}
    # Batch by batch, the networks alternating: drifts in machine load hit all of them alike.
    for batch in batches:
        planes = np.ascontiguousarray(planes_all[:batch])
        for label, measured in _time_batch(networks, planes, outputs, args.seconds).items():
            results[label][batch] = measured
        if not args.json:
            row = f"{batch:>6}" + "".join(
                f"{_fmt_int(results[l][batch]['pps']):>{_width(l)}}" for l in labels
            )
            row += "".join(f"{results[r][batch]['pps'] / results[base][batch]['pps']:>{_width(r) - 5}.2f}x"
                           for r in ratio_of)
            print(row, flush=True)

    variants = {}
    for label, net in networks:
        per_batch = results[label]
        best = max(per_batch, key=lambda b: per_batch[b]["pps"])
        macs = macs_per_position(net.path)
        arithmetic = "bf16" if net.precision == "bf16" else ("int8" if net.precision == "int8" else "fp32")
        # ONEDNN_MAX_CPU_ISA holds OpenVINO only: ONNX Runtime's rows run on the whole processor
        flags = processor.features() if net.provider == OPENVINO else processor.cpuinfo_flags()
        peak = processor.peak_macs(arithmetic, flags) if net.provider in (CPU, OPENVINO) else None
        threads_used = args.threads or 1
        variants[label] = {
            "file": os.path.basename(net.path),
            "sha256": net.sha256,
            "variant": net.variant,
            "precision": net.precision,
            "provider": net.provider,
            "description": net.description,
            "positions_per_second": {str(b): round(m["pps"], 1) for b, m in per_batch.items()},
            "runs": {str(b): m["runs"] for b, m in per_batch.items()},
            "best_batch": best,
            "best_positions_per_second": round(per_batch[best]["pps"], 1),
            "macs_per_position": macs,
            # of the cores' nominal peak for this arithmetic (engine/processor.py), at the best batch
            "share_of_peak": round(per_batch[best]["pps"] * macs / (peak * threads_used), 3)
            if macs and peak else None,
        }

    def speedup(a: str, b: str):
        if a not in variants or b not in variants:
            return None, None
        by_batch = {str(n): round(results[a][n]["pps"] / results[b][n]["pps"], 3) for n in batches}
        best = variants[a]["best_positions_per_second"] / variants[b]["best_positions_per_second"]
        return round(best, 3), by_batch

    int8_speedup, int8_by_batch = speedup("int8", "fp32")
    fp16_speedup, fp16_by_batch = speedup("fp16", "fp32")
    over_base = {r: dict(zip(("best", "by_batch"), speedup(r, base))) for r in ratio_of} if cpu else {}
    import onnxruntime

    summary = {
        "benchmark": "nn",
        "provider": first.provider,
        "backend": args.backend,
        "intra_threads": args.threads,
        "inputs": inputs,
        "batches": list(batches),
        "seconds_target": args.seconds,
        "variants": variants,
        "int8_speedup": int8_speedup,
        "int8_speedup_by_batch": int8_by_batch,
        "fp16_speedup": fp16_speedup,
        "fp16_speedup_by_batch": fp16_by_batch,
        "baseline": base if cpu else None,
        "speedup_over_baseline": over_base,
        "wall_seconds": round(time.perf_counter() - started, 3),
        "environment": {
            **_environment(),
            "onnxruntime_version": onnxruntime.__version__,
            "openvino_version": _openvino_version(),
            "cpu_count": os.cpu_count(),
            "processor": machine,
            "vector_isa": processor.vector_isa(),
            "onednn_max_cpu_isa": processor.isa_cap() or None,
            "clock_ghz": processor.clock_ghz(),
        },
    }
    if args.json:
        print(json.dumps(summary))
        return 0
    print()
    for label in labels:
        v = variants[label]
        share = f", {v['share_of_peak']:.0%} of the nominal {v['precision'] if v['precision'] in ('int8', 'bf16') else 'fp32'} " \
                f"peak ({v['macs_per_position'] / 1e6:.1f}M MACs a position)" if v["share_of_peak"] else ""
        print(f"best {label}: {_fmt_int(v['best_positions_per_second'])} pos/s at batch {v['best_batch']}{share}")
    for r, ratio in over_base.items():
        print(f"{r} over {base}: {ratio['best']:.2f}x at the best batch sizes, "
              f"{ratio['by_batch'].get('8', float('nan')):.2f}x at batch 8 (the search's)")
    for name, value, by_batch in (
        ("int8", int8_speedup, int8_by_batch),
        ("fp16", fp16_speedup, fp16_by_batch),
    ):
        if value is not None:
            slower = "" if value >= 1 else f" ({name} is slower here)"
            print(
                f"{name} over fp32 on {_LABEL_OF.get(first.provider, first.provider)}: "
                f"{value:.2f}x at the best batch sizes{slower}"
            )
    if cpu:
        print("peak: the processor's instruction set at its clock, two vector ports a core "
              "(engine/processor.py); AVX-512 on 256-bit units (AMD Zen 4) reaches half of it")
    print(f"{summary['wall_seconds']:.1f} s")
    return 0


def _openvino_version() -> str | None:
    from engine.sessions import import_openvino

    try:
        openvino = import_openvino()
    except ImportError:
        return None
    return openvino.__version__


_LABEL_OF = {
    "OpenVINO": "OpenVINO",
    "CPUExecutionProvider": "CPU",
    "CUDAExecutionProvider": "CUDA",
    "TensorrtExecutionProvider": "TensorRT",
}


# --------------------------------------------------------------------------- tree

# The start position and two middlegames (perft position 6, and a Queen's Gambit
# Declined structure): 20, 46 and 37 legal moves at the root.
TREE_POSITIONS = (
    ("startpos", "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1"),
    ("middlegame", "r4rk1/1pp1qppp/p1np1n2/2b1p1B1/2B1P1b1/P1NP1N2/1PP1QPPP/R4RK1 w - - 0 10"),
    ("qgd", "r1bq1rk1/pp2bppp/2n1pn2/2pp4/3P4/2PBPN2/PP1N1PPP/R1BQ1RK1 w - - 0 8"),
)
TREE_BATCH = 256
# Past this many nodes the Cython tree starts over (a long --seconds stays in memory).
TREE_MAX_NODES = 3_000_000
TREE_NOTE = (
    "null evaluator (uniform policy, value 0: wdl [0,1,0]) and the default SearchParams for "
    "both. Headline ratio: equal "
    "work, i.e. Cython searches of as many playouts as the Python search managed, gathering "
    "{batch} leaves a batch without writing input planes (the null evaluator reads none, and "
    "the Python search, with Node objects, dicts of children and python-chess push/pop, "
    "encodes none). Also shown: one Cython search growing for the whole time and encoding "
    "every leaf's 112x8x8 planes as the real search must."
)


def _add_tree_arguments(parser: argparse.ArgumentParser) -> None:
    _json_and_seconds(parser, 3.0, "measurement (per position and search)")
    parser.add_argument(
        "--batch",
        type=int,
        default=TREE_BATCH,
        metavar="B",
        help=f"leaves the Cython tree gathers per batch (default {TREE_BATCH})",
    )


def _null_outputs(batch: int):
    import numpy as np

    from engine.encoding import POLICY_SIZE

    policy = np.zeros((batch, POLICY_SIZE), np.float32)
    wdl = np.zeros((batch, 3), np.float32)
    wdl[:, 1] = 1.0
    return policy, wdl


def _check_tree(tree, label: str) -> None:
    """Never report a speed for a tree whose numbers do not add up."""
    children = tree.root_children()
    visits = sum(c["n"] for c in children)
    if tree.nodes != tree.playouts or (tree.nodes and visits != tree.nodes - 1):
        raise BenchError(
            f"{label}: the Cython tree is inconsistent: {tree.playouts} playouts, "
            f"{tree.nodes} root visits, {visits} visits below the root"
        )


class _CythonTreeTimer:
    """The Cython tree with the null evaluator, timed in slices: one search that grows as
    it goes (a fresh one past TREE_MAX_NODES), or, with ``playouts_per_search``, fresh
    searches of that many playouts one after another."""

    def __init__(self, fen: str, batch_size: int, playouts_per_search: int = 0, encode: bool = True) -> None:
        from engine.board import Board
        from engine.tree import Batch

        self.fen = fen
        self.board = Board(fen)
        self.policy, self.wdl = _null_outputs(batch_size)
        self.batch = Batch(batch_size, encode=encode)
        self.limit = playouts_per_search or TREE_MAX_NODES
        self.tree = None
        self.playouts = 0  # finished searches' playouts; the current tree's are added on read
        self.searches = 0
        self.seconds = 0.0
        self.largest = (0, 0.0)  # (root visits, bytes per node) of the largest tree

    def _finish(self) -> None:
        tree = self.tree
        _check_tree(tree, self.fen)
        self.playouts += tree.playouts
        if tree.nodes >= self.largest[0]:
            self.largest = (tree.nodes, tree.bytes_per_node)
        self.tree = None

    def run(self, seconds: float) -> None:
        from engine.tree import Tree

        start = time.perf_counter()
        elapsed = 0.0
        while elapsed < seconds:
            if self.tree is None:
                self.tree = Tree(self.board, seed=0, **SearchParams().tree_settings())
                self.searches += 1
            tree, batch = self.tree, self.batch
            tree.gather(batch, max_visits=self.limit - tree.playouts)
            n = len(batch)
            if n:
                batch.backup(self.policy[:n], self.wdl[:n])
            elif tree.root_proven is not None:
                raise BenchError(f"{self.fen}: the root is decided, nothing to time")
            if tree.playouts >= self.limit:
                self._finish()
            elapsed = time.perf_counter() - start
        self.seconds += elapsed

    def result(self) -> dict:
        if self.tree is not None:
            self._finish()
        return {
            "playouts": self.playouts,
            "seconds": round(self.seconds, 6),
            "playouts_per_s": round(self.playouts / self.seconds, 1),
            "searches": self.searches,
            "largest_tree_nodes": self.largest[0],
            "bytes_per_node": round(self.largest[1], 2),
        }


def run_tree_position(name: str, fen: str, seconds: float, batch_size: int) -> dict:
    """Both searches for ``seconds`` each, alternating in short slices so that a change
    in the machine's load hits both alike."""
    import chess

    from engine.tools.puct_reference import PythonPuct, null_evaluator

    python = PythonPuct(chess.Board(fen), SearchParams(), null_evaluator)
    python_seconds = 0.0
    cython = _CythonTreeTimer(fen, batch_size)
    step = min(0.5, seconds)
    while python_seconds < seconds or cython.seconds < seconds:
        if python_seconds < seconds:
            python_seconds += python.run(step)[1]
        if cython.seconds < seconds:
            cython.run(step)
    if python.root.n != python.playouts:
        raise BenchError(f"{fen}: the Python search counted {python.root.n} root visits "
                         f"for {python.playouts} playouts")
    py = {
        "playouts": python.playouts,
        "seconds": round(python_seconds, 6),
        "playouts_per_s": round(python.playouts / python_seconds, 1),
    }
    # Equal work: Cython searches as large as the Python one (a tree many times larger
    # pays in cache misses that the small Python tree never meets), no planes written.
    same_size = _CythonTreeTimer(fen, batch_size, python.playouts, encode=False)
    same_size.run(max(seconds / 3, 0.2))
    cy, same = cython.result(), same_size.result()
    return {
        "name": name,
        "fen": fen,
        "cython_growing_encoded": cy,
        "python": py,
        "cython": same,
        "ratio": round(same["playouts_per_s"] / py["playouts_per_s"], 2),
        "ratio_growing_encoded": round(cy["playouts_per_s"] / py["playouts_per_s"], 2),
    }


@register(
    "tree",
    "MCTS playouts/s: the Cython tree against a plain-Python PUCT search on python-chess",
    _add_tree_arguments,
)
def bench_tree(args: argparse.Namespace) -> int:
    _require_core("engine.tree")
    if args.batch < 1:
        raise BenchError(f"--batch must be 1 or more, got {args.batch}")

    started = time.perf_counter()
    note = TREE_NOTE.format(batch=args.batch)
    if not args.json:
        print(note)
        print()
        print(
            f"{'position':<12}{'cython playouts/s':>19}{'python playouts/s':>19}{'ratio':>9}"
            f"{'growing+planes':>16}{'bytes/node':>12}{'tree visits':>13}"
        )
    positions = []
    for name, fen in TREE_POSITIONS:
        result = run_tree_position(name, fen, args.seconds, args.batch)
        positions.append(result)
        if not args.json:
            c, p, g = result["cython"], result["python"], result["cython_growing_encoded"]
            print(
                f"{name:<12}{_fmt_int(c['playouts_per_s']):>19}{_fmt_int(p['playouts_per_s']):>19}"
                f"{result['ratio']:>8.1f}x{result['ratio_growing_encoded']:>15.1f}x"
                f"{g['bytes_per_node']:>12.1f}{_fmt_int(g['largest_tree_nodes']):>13}",
                flush=True,
            )

    def total(key: str) -> float:
        playouts = sum(p[key]["playouts"] for p in positions)
        secs = sum(p[key]["seconds"] for p in positions)
        return playouts / secs if secs else 0.0

    cython_pps, python_pps, growing_pps = total("cython"), total("python"), total("cython_growing_encoded")
    ratio = cython_pps / python_pps if python_pps else float("nan")
    geomean = math.exp(sum(math.log(p["ratio"]) for p in positions) / len(positions))
    start_bpn = positions[0]["cython_growing_encoded"]["bytes_per_node"]
    summary = {
        "benchmark": "tree",
        "ratio": round(ratio, 2),
        "ratio_geomean": round(geomean, 2),
        "ratio_growing_encoded": round(growing_pps / python_pps, 2) if python_pps else None,
        "cython_playouts_per_s": round(cython_pps, 1),
        "python_playouts_per_s": round(python_pps, 1),
        "bytes_per_node": start_bpn,
        "bytes_per_node_max": max(p["cython_growing_encoded"]["bytes_per_node"] for p in positions),
        "batch": args.batch,
        "seconds_target": args.seconds,
        "measures": note,
        "wall_seconds": round(time.perf_counter() - started, 3),
        "positions": positions,
        "environment": {**_environment(), "cpu_count": os.cpu_count()},
    }
    if args.json:
        print(json.dumps(summary))
        return 0
    print()
    print(
        f"total: cython {_fmt_int(cython_pps)} playouts/s, python {_fmt_int(python_pps)} playouts/s, "
        f"ratio {ratio:.1f}x (geometric mean over positions {geomean:.1f}x; "
        f"{summary['ratio_growing_encoded']:.1f}x for one growing Cython search that also writes planes)"
    )
    print(
        f"bytes per node: {start_bpn:.1f} from the start position "
        f"(up to {summary['bytes_per_node_max']:.1f}: a node with more legal moves has more edges); "
        f"{summary['wall_seconds']:.1f} s"
    )
    return 0


# --------------------------------------------------------------------------- uci
#
# ``uci``: the UCI front end's latencies, measured on real engine processes over pipes, as a
# GUI sees them.  Times are taken in this process with time.perf_counter() right after a line
# is written to the engine's stdin and right after the answer is read from its stdout (a
# blocking read, no reader thread in between).

UCI_MOVETIMES = (50, 100, 200, 300)
# stop and isready: Stockfish answers in about 0.3 ms; a GUI that stops a search waits this long.
UCI_TARGETS_MS = {"stop": 1.0, "isready": 1.0, "uciok": 500.0, "movetime_overshoot": 20.0}
UCI_POSITIONS = (
    "position startpos",
    "position startpos moves e2e4 e7e5 g1f3 b8c6 f1b5 a7a6",
    "position fen r1bq1rk1/pp2bppp/2n1pn2/2pp4/3P4/2PBPN2/PP1N1PPP/R1BQ1RK1 w - - 0 8",
    "position fen 8/5pk1/6p1/8/3R4/6P1/5PK1/8 b - - 0 40",
)


def _percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100), interpolated linearly between the closest ranks."""
    data = sorted(values)
    if not data:
        return float("nan")
    pos = (len(data) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


#: Fewer samples than this and a 99th percentile is only the largest one: no p99 is reported.
P99_SAMPLES = 100


def _summary_ms(values_s: list[float]) -> dict:
    """n, p50, p99 (None below :data:`P99_SAMPLES` samples) and max, in milliseconds."""
    ms = [v * 1000.0 for v in values_s]
    return {
        "n": len(ms),
        "p50_ms": round(_percentile(ms, 50), 3),
        "p99_ms": round(_percentile(ms, 99), 3) if len(ms) >= P99_SAMPLES else None,
        "max_ms": round(max(ms), 3) if ms else float("nan"),
    }


class _UciProcess:
    """One engine process on pipes, read line by line on the calling thread."""

    def __init__(self, command: list[str], stderr) -> None:
        import subprocess

        self.started = time.perf_counter()
        self.proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=stderr, bufsize=0)
        self._out = self.proc.stdout

    def send(self, line: str) -> float:
        self.proc.stdin.write(line.encode() + b"\n")
        self.proc.stdin.flush()
        return time.perf_counter()

    def read_until(self, word: str, timeout: float = 60.0) -> tuple[float, str]:
        """(time read, line) of the next line starting with ``word``."""
        line = self.lines_until(word, timeout)[-1]
        return time.perf_counter(), line

    def lines_until(self, word: str, timeout: float = 60.0) -> list[str]:
        """Every line up to and including the next one starting with ``word``."""
        import select

        deadline = time.perf_counter() + timeout
        lines: list[str] = []
        buffered = getattr(self, "_pending", b"")
        while True:
            while b"\n" in buffered:
                raw, buffered = buffered.split(b"\n", 1)
                line = raw.decode("utf-8", "replace").strip()
                lines.append(line)
                if line == word or line.startswith(word + " "):
                    self._pending = buffered
                    return lines
            left = deadline - time.perf_counter()
            if left <= 0:
                raise BenchError(f"no {word!r} from the engine within {timeout:g} s")
            ready, _, _ = select.select([self._out], [], [], left)
            if ready:
                chunk = os.read(self._out.fileno(), 1 << 16)
                if not chunk:
                    raise BenchError(f"the engine exited (status {self.proc.poll()}) while we waited for {word!r}")
                buffered += chunk

    def close(self) -> None:
        import subprocess

        try:
            self.send("quit")
            self.proc.wait(10)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()


def _uci_command(args: argparse.Namespace) -> list[str]:
    import shlex

    if args.engine_command:
        return shlex.split(args.engine_command)
    # What the `cyzero` console script runs (uci.cli), with this interpreter.
    return [sys.executable, "-m", "uci.cli"]


def _add_uci_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout and nothing else")
    parser.add_argument("--trials", type=int, default=200, metavar="N",
                        help="stop/isready trials and go movetime trials, each (default 200)")
    parser.add_argument("--starts", type=int, default=20, metavar="K",
                        help="fresh processes timed from start to uciok (default 20)")
    parser.add_argument("--movetimes", type=_batch_list, default=UCI_MOVETIMES, metavar="MS,MS,...",
                        help="go movetime values, used in turn (default "
                        + ",".join(map(str, UCI_MOVETIMES)) + ")")
    parser.add_argument("--backend", choices=BACKENDS, default="cpu",
                        help="the engine's Backend option (default cpu)")
    parser.add_argument("--threads", type=int, default=None, metavar="T",
                        help="the engine's Threads option (default: its own default)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random delays and positions")
    parser.add_argument("--engine", dest="engine_command", default=None, metavar="COMMAND",
                        help="engine command line (default: this Python running uci.cli, i.e. cyzero)")


def _uci_configure(engine: _UciProcess, args: argparse.Namespace) -> None:
    engine.send("uci")
    engine.read_until("uciok")
    engine.send(f"setoption name Backend value {args.backend}")
    engine.send("setoption name Move Overhead value 0")
    if args.threads is not None:
        engine.send(f"setoption name Threads value {args.threads}")
    engine.send("isready")
    engine.read_until("readyok", timeout=600)      # loads the network (TensorRT may build an engine)
    engine.send("ucinewgame")
    engine.send(UCI_POSITIONS[0])
    engine.send("go nodes 50")                      # warm up: the first search pays one-time costs
    engine.read_until("bestmove")


@register(
    "uci",
    "UCI latencies over pipes: stop -> bestmove, isready during a search, start -> uciok, movetime overshoot",
    _add_uci_arguments,
)
def bench_uci(args: argparse.Namespace) -> int:
    import random
    import tempfile

    if args.trials < 1 or args.starts < 1:
        raise BenchError("--trials and --starts must be at least 1")
    command = _uci_command(args)
    rng = random.Random(args.seed)
    started = time.perf_counter()
    say = (lambda text: None) if args.json else (lambda text: print(text, file=sys.stderr, flush=True))

    with tempfile.TemporaryFile() as stderr:
        def failed(engine: _UciProcess, error: BenchError) -> BenchError:
            stderr.seek(0)
            tail = stderr.read().decode("utf-8", "replace").strip().splitlines()[-5:]
            return BenchError(f"{error}" + (f"; engine stderr: {' | '.join(tail)}" if tail else ""))

        # 1. Start-up: process start -> uciok, fresh processes.
        say(f"timing {args.starts} fresh starts to uciok ...")
        uciok = []
        for _ in range(args.starts):
            engine = _UciProcess(command, stderr)
            try:
                engine.send("uci")
                when, _ = engine.read_until("uciok", timeout=60)
                uciok.append(when - engine.started)
            except BenchError as e:
                raise failed(engine, e) from None
            finally:
                engine.close()

        engine = _UciProcess(command, stderr)
        try:
            _uci_configure(engine, args)
            # 2. During go infinite: isready -> readyok, then stop -> bestmove.
            say(f"{args.trials} go infinite searches: isready, then stop, after random delays ...")
            stop, isready = [], []
            for _ in range(args.trials):
                engine.send(rng.choice(UCI_POSITIONS))
                engine.send("go infinite")
                time.sleep(rng.uniform(0.02, 0.12))
                sent = engine.send("isready")
                got, _ = engine.read_until("readyok")
                isready.append(got - sent)
                time.sleep(rng.uniform(0.005, 0.05))
                sent = engine.send("stop")
                got, _ = engine.read_until("bestmove")
                stop.append(got - sent)
            # 3. go movetime N: time to bestmove minus N.
            say(f"{args.trials} go movetime searches ({', '.join(map(str, args.movetimes))} ms) ...")
            overshoot: dict[int, list[float]] = {n: [] for n in args.movetimes}
            for i in range(args.trials):
                n = args.movetimes[i % len(args.movetimes)]
                engine.send(rng.choice(UCI_POSITIONS))
                sent = engine.send(f"go movetime {n}")
                got, _ = engine.read_until("bestmove")
                overshoot[n].append(got - sent - n / 1000.0)
        except BenchError as e:
            raise failed(engine, e) from None
        finally:
            engine.close()

    all_overshoot = [v for values in overshoot.values() for v in values]
    results = {
        "stop": _summary_ms(stop),
        "isready": _summary_ms(isready),
        "uciok": _summary_ms(uciok),
        "movetime_overshoot": _summary_ms(all_overshoot),
    }
    results["movetime_overshoot"]["min_ms"] = round(min(all_overshoot) * 1000.0, 3)
    results["movetime_overshoot"]["by_movetime"] = {str(n): _summary_ms(v) for n, v in overshoot.items()}
    # A target is judged only where there are samples enough for a p99 (None: not judged).
    met = {key: None if results[key]["p99_ms"] is None else results[key]["p99_ms"] < target
           for key, target in UCI_TARGETS_MS.items()}
    summary = {
        "benchmark": "uci",
        "command": command,
        "backend": args.backend,
        "threads": args.threads,
        "move_overhead_ms": 0,
        "trials": args.trials,
        "starts": args.starts,
        "movetimes": list(args.movetimes),
        "results": results,
        "targets_p99_ms": UCI_TARGETS_MS,
        "targets_met": met,
        "all_targets_met": None if None in met.values() else all(met.values()),
        **_run_facts(started),
    }
    if args.json:
        print(json.dumps(summary))
        return 0
    labels = {
        "stop": "stop -> bestmove (go infinite)",
        "isready": "isready -> readyok (searching)",
        "uciok": "process start -> uciok",
        "movetime_overshoot": "go movetime N: bestmove - N",
    }
    print(f"engine: {' '.join(command)}; Backend {args.backend}, Move Overhead 0, "
          + (f"Threads {args.threads}" if args.threads is not None else "Threads: the engine's default")
          + f"; {os.cpu_count()} CPUs")
    print(f"{'measurement':<34}{'n':>6}{'p50 ms':>10}{'p99 ms':>10}{'max ms':>10}  {'target':<14}{'met':>4}")
    def p99(r: dict) -> str:
        return f"{r['p99_ms']:>10.2f}" if r["p99_ms"] is not None else f"{'-':>10}"

    for key, label in labels.items():
        r = results[key]
        target = f"p99 < {UCI_TARGETS_MS[key]:g} ms"
        verdict = {True: "yes", False: "NO", None: "-"}[met[key]]
        print(f"{label:<34}{r['n']:>6}{r['p50_ms']:>10.2f}{p99(r)}{r['max_ms']:>10.2f}  "
              f"{target:<14}{verdict:>4}")
    for n, r in results["movetime_overshoot"]["by_movetime"].items():
        print(f"  {'movetime ' + n + ' ms':<32}{r['n']:>6}{r['p50_ms']:>10.2f}{p99(r)}{r['max_ms']:>10.2f}")
    missed = [labels[k] for k, ok in met.items() if ok is False]
    unjudged = [labels[k] for k, ok in met.items() if ok is None]
    print(f"targets met: {sum(ok is True for ok in met.values())} of {len(met)}"
          + (f" (missed: {'; '.join(missed)})" if missed else "")
          + (f"; not judged, fewer than {P99_SAMPLES} samples for a p99 (--trials, --starts): "
             f"{'; '.join(unjudged)}" if unjudged else "")
          + f"; {summary['wall_seconds']:.1f} s")
    return 0


# --------------------------------------------------------------------------- search


def _add_search_arguments(parser: argparse.ArgumentParser) -> None:
    _json_and_seconds(parser, 3.0, "search measurement per position and mode")
    parser.add_argument("--batch", type=int, default=0, metavar="B",
                        help="MinibatchSize of the search (default 0: the backend's choice, as the UCI "
                             "engine plays)")
    parser.add_argument("--backend", default="auto", choices=BACKENDS,
                        help="backend (default auto, as the engine chooses)")
    parser.add_argument("--net", default=None, metavar="PATH",
                        help="network to use (default: the bundled network, in the file the engine "
                             "loads for the backend it lands on)")
    parser.add_argument("--threads", type=int, default=None, metavar="T",
                        help="the runtime's threads, as the UCI option Threads (default: the runtime's own)")
    parser.add_argument("--baseline", default="cpu", choices=BACKENDS + ("none",),
                        help="after the measurement, the engine's nodes/s on this backend and on "
                             "--backend side by side (default cpu: ONNX Runtime's CPU path, today's "
                             "Backend=cpu; none: skip; skipped when both land on the same runtime)")
    _simulate_gpu_argument(parser)


def _simulate_gpu_argument(parser: argparse.ArgumentParser) -> None:
    from engine.tools.gpu_standin import PROFILES

    parser.add_argument("--simulate-gpu", nargs="?", const="h100", default=None, choices=sorted(PROFILES),
                        metavar="PROFILE",
                        help="run the network on the GPU stand-in (engine.tools.gpu_standin: an H100's "
                             "costs for a 6x64, or h200: half of them; a stall at each new input shape) "
                             "instead of ONNX Runtime, to see the search and the batching without a GPU "
                             "(default profile: h100)")


class _CountingNetwork:
    """Wraps a network to count positions, calls and seconds spent inside evaluate, and to keep
    the size of every call (the raw side replays them)."""

    def __init__(self, net) -> None:
        self.net = net
        self.provider = net.provider
        self.batch_sizes = net.batch_sizes   # the search sizes its batches by these
        self.gpu = getattr(net, "gpu", None)
        self.positions = 0
        self.calls = 0
        self.seconds = 0.0
        self.sizes: list[int] = []
        self._counting = threading.Lock()   # several search threads call at once

    def evaluate(self, planes):
        start = time.perf_counter()
        result = self.net.evaluate(planes)
        with self._counting:
            self.seconds += time.perf_counter() - start
            self.positions += len(planes)
            self.calls += 1
            self.sizes.append(len(planes))
        return result


def _replay(net, sizes: list[int], planes, outputs) -> float:
    """Seconds raw ``evaluate_into`` takes for calls of these sizes, back to back (the network
    pads each to the size it runs, as it did in the search)."""
    policy, wdl, mlh = outputs
    start = time.perf_counter()
    for n in sizes:
        net.evaluate_into(planes[:n], policy, wdl, mlh)
    return time.perf_counter() - start


def _timed_search(searcher, fen: str, seconds: float) -> tuple[int, float, float]:
    """One fresh search of ``seconds``: (playouts, wall seconds, bytes per node)."""
    from engine.board import Board
    from engine.limits import GoParams

    done = threading.Event()
    searcher.new_game()
    start = time.perf_counter()
    searcher.start(Board(fen), GoParams(movetime=int(seconds * 1000)), lambda info: None,
                   lambda result: done.set())
    if not done.wait(seconds + 30):
        searcher.stop()
        raise BenchError(f"{fen}: the search did not return a best move")
    elapsed = time.perf_counter() - start
    searcher.wait()
    return searcher.tree.playouts, elapsed, searcher.tree.bytes_per_node


# The positions of a short-time-control check: go movetime 200 with the UCI defaults.
MOVETIME_SHORT = 200
MOVETIME_FENS = (
    "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1",
    "r1bqkbnr/pppp1ppp/2n5/4p3/4P3/5N2/PPPP1PPP/RNBQKB1R w KQkq - 2 3",
    "r2q1rk1/pp2bppp/2n1pn2/3p4/3P4/2NBPN2/PP3PPP/R2Q1RK1 w - - 0 10",
)
MOVETIME_REPEATS = 3
# (label, pipeline, SearchThreads): one search thread with one or two batches in flight, and two
# search threads with one batch each (lc0's arrangement on a GPU).
SEARCH_MODES = (("one batch", False, 1), ("two batches", True, 1), ("two threads", False, 2))


def _short_movetime(counted, raw_positions_per_s: float) -> dict:
    """``go movetime 200`` with the UCI defaults (MinibatchSize, Move Overhead, smart pruning,
    pipelining), a new game each time: median nodes against what raw evaluate could do in the
    time the budget leaves after the overhead and the safety margin."""
    import statistics

    from engine.board import Board
    from engine.limits import GoParams
    from engine.params import SearchParams
    from engine.search import Searcher

    params = SearchParams()
    searcher = Searcher(lambda: counted, params)
    nodes = []
    for _ in range(MOVETIME_REPEATS):
        for fen in MOVETIME_FENS:
            searcher.new_game()
            done = threading.Event()
            searcher.start(Board(fen), GoParams(movetime=MOVETIME_SHORT), lambda info: None,
                           lambda result: done.set())
            if not done.wait(30):
                searcher.stop()
                raise BenchError(f"{fen}: go movetime {MOVETIME_SHORT} did not return a best move")
            searcher.wait()
            nodes.append(searcher.tree.nodes)
    budget_ms = max(0, MOVETIME_SHORT - params.move_overhead_ms - searcher.timeman.safety_ms)
    capacity = raw_positions_per_s * budget_ms / 1000.0
    median = statistics.median(nodes)
    return {
        "movetime_ms": MOVETIME_SHORT,
        "move_overhead_ms": params.move_overhead_ms,
        "budget_ms": budget_ms,
        "median_nodes": median,
        "nodes": sorted(nodes),
        "raw_capacity": round(capacity, 1),
        "ratio": round(median / capacity, 4) if capacity else 0.0,
    }


@register(
    "search",
    "engine nodes/s with the bundled network next to raw evaluate throughput at the same batch",
    _add_search_arguments,
)
def bench_search(args: argparse.Namespace) -> int:
    """Search nodes/s over fixed positions against raw evaluate at the sizes the search sent:
    after each search its network calls are replayed back to back (the same sizes, padded the
    same way), so ``efficiency`` is the share of what the network computes that the search
    turns into nodes. Measured with one batch and with two batches in flight, alternately in
    one run. Then ``go movetime 200`` with the UCI defaults: nodes against the raw capacity of
    its time."""
    import numpy as np

    from engine.network import POLICY_SIZE, Network
    from engine.params import SearchParams
    from engine.search import Searcher, default_pipeline, search_batch
    from engine.timeman import TimeManager
    from engine.weights import default_weights_path

    if args.batch < 0:
        raise BenchError(f"--batch must be 0 (the backend's choice) or more, got {args.batch}")
    started = time.perf_counter()
    notes = []
    options = {"max_batch": args.batch} if args.batch > 256 else {}
    if args.simulate_gpu:
        from engine.tools.gpu_standin import simulated_network

        net, _ = simulated_network(args.net, profile=args.simulate_gpu, log=notes.append, **options)
    else:
        net = _engine_network(args.net, args.backend, args.threads, options, notes.append)
    counted = _CountingNetwork(net)
    # Move Overhead 0 and no smart pruning: every search runs its whole movetime.
    params = SearchParams(minibatch_size=args.batch, smart_pruning_factor=0.0, move_overhead_ms=0)
    batch = search_batch(params, net)
    searchers = {label: Searcher(lambda: counted, params.replace(search_threads=threads), TimeManager(safety_ms=0),
                                 pipeline=pipeline)
                 for label, pipeline, threads in SEARCH_MODES}
    uci_pipeline = default_pipeline(counted)   # what the UCI search picks here
    largest = max(batch, net.max_batch)
    planes, _ = _nn_inputs(largest)
    outputs = (np.empty((largest, POLICY_SIZE), np.float32), np.empty((largest, 3), np.float32),
               np.empty((largest,), np.float32) if net.has_mlh else None)
    sizes_note = f"; the network runs batches of {'/'.join(map(str, net.batch_sizes))}" if net.batch_sizes else ""
    if not args.json:
        for line in notes:
            print(line)
        print(f"network: {net.description}; search batch {batch}{sizes_note}")
        print()
        print(f"{'position':<12}" + "".join(
            f"{label + ' nodes/s':>24}{'raw pos/s':>11}{'eff.':>7}{'batch':>7}" for label, _, _ in SEARCH_MODES)
            + f"{'bytes/node':>12}")
    positions = []
    half = max(0.05, args.seconds / 2)  # a search shorter than 50 ms is mostly its start and stop
    for name, fen in TREE_POSITIONS:
        per_mode = {label: dict(nodes=0, seconds=0.0, calls=0, positions=0, raw_seconds=0.0)
                    for label, _, _ in SEARCH_MODES}
        bytes_per_node = 0.0
        for _ in range(2):  # alternate, so that a change in the machine's load hits all alike
            for label, _, _ in SEARCH_MODES:
                counted.sizes = []
                calls, evaluated = counted.calls, counted.positions
                nodes, secs, bytes_per_node = _timed_search(searchers[label], fen, half)
                mode = per_mode[label]
                mode["nodes"] += nodes
                mode["seconds"] += secs
                mode["calls"] += counted.calls - calls
                mode["positions"] += counted.positions - evaluated
                mode["raw_seconds"] += _replay(net, counted.sizes, planes, outputs)
        result = {"name": name, "fen": fen, "bytes_per_node": round(bytes_per_node, 2), "modes": {}}
        for label, _, _ in SEARCH_MODES:
            mode = per_mode[label]
            nps = mode["nodes"] / mode["seconds"]
            raw = mode["positions"] / mode["raw_seconds"] if mode["raw_seconds"] else 0.0
            result["modes"][label] = {
                "search_nodes_per_s": round(nps, 1),
                "raw_positions_per_s": round(raw, 1),
                "efficiency": round(nps / raw, 4) if raw else 0.0,
                # Positions the network evaluated per second of search (nodes also count cache hits
                # and terminal positions) against raw: the share of the time the network was busy.
                "network_busy": round(mode["positions"] / mode["seconds"] / raw, 4) if raw else 0.0,
                "mean_batch": round(mode["positions"] / mode["calls"], 1) if mode["calls"] else 0.0,
            }
        positions.append(result)
        if not args.json:
            print(f"{name:<12}" + "".join(
                f"{_fmt_int(m['search_nodes_per_s']):>24}{_fmt_int(m['raw_positions_per_s']):>11}"
                f"{m['efficiency']:>7.1%}{m['mean_batch']:>7.0f}"
                for m in result["modes"].values()) + f"{result['bytes_per_node']:>12.1f}", flush=True)
    modes = {}
    for label, _, _ in SEARCH_MODES:
        nps = sum(p["modes"][label]["search_nodes_per_s"] for p in positions) / len(positions)
        raw = sum(p["modes"][label]["raw_positions_per_s"] for p in positions) / len(positions)
        busy = sum(p["modes"][label]["network_busy"] for p in positions) / len(positions)
        modes[label] = {"search_nodes_per_s": round(nps, 1), "raw_positions_per_s": round(raw, 1),
                        "efficiency": round(nps / raw, 4) if raw else 0.0, "network_busy": round(busy, 4)}
    uci_mode = SEARCH_MODES[1][0] if uci_pipeline else SEARCH_MODES[0][0]
    # The capacity of a short search: raw evaluate at the search's own batch, back to back.
    raw_batch = _replay(net, [batch] * 8, planes, outputs)
    short = _short_movetime(counted, 8 * batch / raw_batch)
    baseline = None
    if args.baseline != "none" and not args.simulate_gpu:
        other = _engine_network(args.net, args.baseline, args.threads, options, notes.append)
        if (other.provider, other.path) != (net.provider, net.path):
            baseline = _versus_baseline(net, other, params, half)
        other.close()
    summary = {
        "benchmark": "search",
        "baseline": baseline,
        "processor": processor.describe(),
        "threads": args.threads,
        "efficiency": modes[uci_mode]["efficiency"],
        "search_nodes_per_s": modes[uci_mode]["search_nodes_per_s"],
        "raw_positions_per_s": modes[uci_mode]["raw_positions_per_s"],
        "network_busy": modes[uci_mode]["network_busy"],
        "uci_mode": uci_mode,
        "modes": modes,
        "short_movetime": short,
        "bytes_per_node": round(sum(p["bytes_per_node"] for p in positions) / len(positions), 2),
        "batch": batch,
        "batch_sizes": list(net.batch_sizes),
        "simulated_gpu": args.simulate_gpu or False,
        "provider": net.provider,
        "network": net.description,
        "positions": positions,
        **_run_facts(started),
    }
    if args.json:
        print(json.dumps(summary))
        return 0
    print()
    for label, mode in modes.items():
        print(f"total, {label}{' (the UCI search here)' if label == uci_mode else ''}: search "
              f"{_fmt_int(mode['search_nodes_per_s'])} nodes/s, raw evaluate at the same sizes "
              f"{_fmt_int(mode['raw_positions_per_s'])} positions/s: efficiency {mode['efficiency']:.1%} "
              f"(target >= 90%); the network was busy {mode['network_busy']:.1%} of the time")
    print(f"{summary['bytes_per_node']:.1f} bytes per node")
    print()
    print(f"go movetime {short['movetime_ms']}: nodes vs raw capacity (UCI defaults, Move Overhead "
          f"{short['move_overhead_ms']} ms: {short['budget_ms']} ms to search): median "
          f"{_fmt_int(short['median_nodes'])} nodes of {_fmt_int(short['raw_capacity'])} = "
          f"{short['ratio']:.0%} (target >= 50%); all {short['nodes']}")
    if baseline:
        print()
        print(f"the engine's nodes/s, {baseline['network']} against {baseline['baseline_network']}, "
              f"alternating over the same positions: {_fmt_int(baseline['search_nodes_per_s'])} against "
              f"{_fmt_int(baseline['baseline_nodes_per_s'])} = {baseline['ratio']:.2f}x")
    print(f"machine: {summary['processor']}; threads: {args.threads or 'the runtime default'}")
    print(f"{summary['wall_seconds']:.1f} s")
    return 0


def _engine_network(path: str | None, backend: str, threads: int | None, options: dict, log):
    """The network as the engine loads it: the bundled one in the file for the runtime it lands
    on (``engine.weights.NetworkBuilder``), or ``path``."""
    from engine.weights import NetworkBuilder, resolve_weights

    builder = NetworkBuilder(backend=backend, threads=threads, options=options, log=log)
    return builder.load_weights_file(resolve_weights(path)).network


def _versus_baseline(net, other, params, seconds: float) -> dict:
    """Nodes/s of the UCI search (one batch in flight, as on a CPU) on ``net`` and on ``other``,
    alternating over the same positions, and their ratio."""
    from engine.search import Searcher
    from engine.timeman import TimeManager

    totals = {}
    for label, network in (("net", net), ("other", other)):
        totals[label] = [Searcher(lambda network=network: network, params, TimeManager(safety_ms=0),
                                  pipeline=False), 0, 0.0]
    for _ in range(2):
        for _, fen in TREE_POSITIONS:
            for label in ("net", "other"):
                searcher, _, _ = totals[label]
                nodes, secs, _ = _timed_search(searcher, fen, seconds)
                totals[label][1] += nodes
                totals[label][2] += secs
    nps = {label: nodes / secs for label, (_, nodes, secs) in totals.items()}
    return {"network": net.description, "baseline_network": other.description,
            "search_nodes_per_s": round(nps["net"], 1), "baseline_nodes_per_s": round(nps["other"], 1),
            "ratio": round(nps["net"] / nps["other"], 3)}


# --------------------------------------------------------------------------- null
#
# ``null``: the search's own work per node. The real UCI ``Searcher`` (gather, encode, NN cache,
# expansion, backup, the Driver's Python round) on a network that costs nothing, and, when
# CYZERO_LC0 names an lc0 binary, lc0 on its ``random`` backend over the same positions, alternating
# with cyzero in one run (issue 47).

NULL_BATCHES = (8, 64, 256)
NULL_SECONDS = 3.0
# lc0's random backend, one search thread and no task workers (its search's own cost on one core);
# smart pruning off and no move overhead on both sides, so that every search runs its whole movetime.
LC0_FLAGS = ("--backend=random", "--threads=1", "--task-workers=0", "--smart-pruning-factor=0",
             "--move-overhead=0")
LC0_ENV = "CYZERO_LC0"
NULL_NOTE = (
    "the UCI Searcher (one thread, one batch in flight, Move Overhead 0, no smart pruning, "
    "a new game before each search) on a network that costs nothing: fixed outputs built once "
    "and sliced per batch, shaped as lc0's random backend (policy logits uniform in [0, 3), "
    "Q uniform in [-1, 1], D uniform in [0, 1 - |Q|]), so that the trees are alike; "
    "nodes/s = playouts over the wall time from go to bestmove; nodes/cpu-s = over the CPU time "
    "the process used meanwhile (cyzero: this process; lc0: its process, start-up included), which "
    "a busy machine disturbs less"
)


class NullNetwork:
    """A network that costs nothing: ``rows`` fixed outputs built once, the first ``n`` of them
    returned for a batch of ``n`` (row i of every batch gets the same policy and value).

    Shaped as lc0's ``random`` backend: policy logits uniform in [0, 3) (after the softmax the
    least likely move has 1/20 of the likeliest's weight, as there), Q uniform in [-1, 1] and D
    uniform in [0, 1 - |Q|]. Seeded: the same ``seed`` gives the same outputs."""

    batch_sizes: tuple[int, ...] = ()    # variable shapes, as the CPU runtimes
    gpu = False
    provider = "null"
    has_mlh = False
    description = "null network (fixed outputs, lc0 random-backend shape)"

    def __init__(self, rows: int, seed: int = 0) -> None:
        import numpy as np

        from engine.encoding import POLICY_SIZE

        if rows < 1:
            raise ValueError(f"a null network needs at least one row, got {rows}")
        rng = np.random.default_rng(seed)
        self.rows = rows
        self.policy = rng.uniform(0.0, 3.0, (rows, POLICY_SIZE)).astype(np.float32)
        q = rng.uniform(-1.0, 1.0, rows)
        d = (1.0 - np.abs(q)) * rng.uniform(0.0, 1.0, rows)
        self.wdl = np.stack([(1.0 - d + q) / 2, d, (1.0 - d - q) / 2], axis=1).clip(0.0, 1.0).astype(np.float32)
        self.calls = 0
        self.positions = 0

    def evaluate(self, planes):
        n = len(planes)
        if n > self.rows:
            raise ValueError(f"the null network holds {self.rows} rows, asked for {n}")
        self.calls += 1
        self.positions += n
        return self.policy[:n], self.wdl[:n], None


def _add_null_arguments(parser: argparse.ArgumentParser) -> None:
    _json_and_seconds(parser, NULL_SECONDS, "search (go movetime), per position, batch and engine")
    parser.add_argument("--batches", type=_batch_list, default=NULL_BATCHES, metavar="B,B,...",
                        help="MinibatchSize values, each measured on its own (default "
                             + ",".join(map(str, NULL_BATCHES)) + ")")
    parser.add_argument("--lc0", default=None, metavar="PATH",
                        help=f"an lc0 binary to measure beside cyzero (default: ${LC0_ENV}; "
                             "none: cyzero only)")
    parser.add_argument("--positions", type=int, default=len(TREE_POSITIONS), metavar="K",
                        help=f"use the first K of the bench positions (default all {len(TREE_POSITIONS)}: "
                             + ", ".join(name for name, _ in TREE_POSITIONS) + ")")


def parse_lc0_info(lines: list[str]) -> dict:
    """nodes, nps and time (ms) of the last ``info`` line that has nodes (lc0's final report)."""
    for line in reversed(lines):
        words = line.split()
        if not words or words[0] != "info" or "nodes" not in words:
            continue
        found = {}
        for key in ("nodes", "nps", "time"):
            if key in words:
                i = words.index(key)
                try:
                    found[key] = int(words[i + 1])
                except (IndexError, ValueError):
                    raise BenchError(f"lc0 wrote an {key} that is not a number: {line!r}") from None
        return found
    raise BenchError("lc0 reported no nodes before its bestmove")


def lc0_search(binary: str, fen: str, batch: int, seconds: float) -> dict:
    """One ``go movetime`` of a fresh lc0 process (an empty tree and an empty NN cache, as the
    cyzero side's new game): nodes and the wall time from go to bestmove, and lc0's own nps."""
    import subprocess

    import resource

    command = [binary, *LC0_FLAGS, f"--minibatch-size={batch}"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        engine = _UciProcess(command, subprocess.DEVNULL)
    except OSError as e:
        raise BenchError(f"cannot run lc0 ({binary}): {e}") from None
    try:
        engine.send("uci")
        engine.lines_until("uciok")
        engine.send(f"position fen {fen}")
        engine.send("isready")
        engine.lines_until("readyok")
        sent = engine.send(f"go movetime {int(round(seconds * 1000))}")
        lines = engine.lines_until("bestmove", timeout=seconds + 60)
        elapsed = time.perf_counter() - sent
    except BenchError as e:
        raise BenchError(f"lc0 ({binary}): {e}") from None
    finally:
        engine.close()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)   # the process has been waited for
    info = parse_lc0_info(lines)
    return {"nodes": info["nodes"], "seconds": elapsed, "lc0_nps": info.get("nps"),
            "lc0_time_ms": info.get("time"),
            "cpu_seconds": (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)}


def _null_searcher(net: NullNetwork, batch: int):
    from engine.search import Searcher
    from engine.timeman import TimeManager

    params = SearchParams(minibatch_size=batch, smart_pruning_factor=0.0, move_overhead_ms=0)
    searcher = Searcher(lambda: net, params, TimeManager(safety_ms=0), pipeline=False)
    _timed_search(searcher, TREE_POSITIONS[0][1], 0.05)    # warm up: the driver and its planes buffer
    return searcher


def _cyzero_null_search(searcher, net: NullNetwork, fen: str, seconds: float) -> dict:
    calls, positions = net.calls, net.positions
    cpu = time.process_time()
    playouts, elapsed, bytes_per_node = _timed_search(searcher, fen, seconds)
    return {"nodes": playouts, "seconds": elapsed, "cpu_seconds": time.process_time() - cpu,
            "calls": net.calls - calls,
            "evaluated": net.positions - positions, "average_depth": round(searcher.tree.average_depth, 2),
            "bytes_per_node": round(bytes_per_node, 2)}


def _rate(runs: list[dict], key: str = "seconds") -> float:
    seconds = sum(r[key] for r in runs)
    return sum(r["nodes"] for r in runs) / seconds if seconds else 0.0


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 3) if b else None


@register(
    "null",
    "the search's own cost: the UCI search's nodes/s on a network that costs nothing, "
    f"beside lc0's random backend when ${LC0_ENV} names an lc0 binary",
    _add_null_arguments,
)
def bench_null(args: argparse.Namespace) -> int:
    """cyzero's Searcher on :class:`NullNetwork` at each MinibatchSize, and lc0 (``random``
    backend, ``--threads=1 --task-workers=0``, ``--minibatch-size`` the same) on the same
    positions, cyzero then lc0 for each position, in one run; nodes/s and their ratio."""
    _require_core("engine.tree")
    if not args.batches or min(args.batches) < 1:
        raise BenchError(f"--batches must be sizes of 1 or more, got {args.batches}")
    if not 1 <= args.positions <= len(TREE_POSITIONS):
        raise BenchError(f"--positions must be 1 to {len(TREE_POSITIONS)}, got {args.positions}")
    lc0 = args.lc0 if args.lc0 is not None else os.environ.get(LC0_ENV) or None
    if lc0 == "none":
        lc0 = None
    if lc0 is not None and not (os.path.isfile(lc0) and os.access(lc0, os.X_OK)):
        raise BenchError(f"no lc0 binary at {lc0!r} ({'--lc0' if args.lc0 else LC0_ENV})")
    positions = TREE_POSITIONS[: args.positions]
    started = time.perf_counter()
    load_before = os.getloadavg()
    net = NullNetwork(max(args.batches))
    say = (lambda text: None) if args.json else (lambda text: print(text, flush=True))
    say(NULL_NOTE)
    if lc0:
        say(f"lc0: {lc0} {' '.join(LC0_FLAGS)} --minibatch-size=B (a fresh process per search: "
            f"an empty tree and NN cache, as cyzero's new game); ratio = cyzero / lc0")
    say(f"machine: {processor.describe()}; load average {load_before[0]:.2f} at the start")
    say("")
    say(f"{'':>20}{'--------- cyzero ---------':>42}" + (f"{'----------- lc0 -----------':>30}" if lc0 else ""))
    say(f"{'batch':>6}  {'position':<12}{'nodes/s':>12}{'nodes/cpu-s':>13}{'mean batch':>12}{'depth':>7}"
        + (f"{'nodes/s':>12}{'nodes/cpu-s':>13}{'ratio':>7}{'cpu ratio':>11}" if lc0 else ""))
    rows = []
    for batch in args.batches:
        searcher = _null_searcher(net, batch)
        for name, fen in positions:
            cy = _cyzero_null_search(searcher, net, fen, args.seconds)
            row = {"batch": batch, "name": name, "fen": fen, "cyzero": cy,
                   "cyzero_nodes_per_s": round(_rate([cy]), 1),
                   "cyzero_nodes_per_cpu_s": round(_rate([cy], "cpu_seconds"), 1)}
            line = (f"{batch:>6}  {name:<12}{_fmt_int(row['cyzero_nodes_per_s']):>12}"
                    f"{_fmt_int(row['cyzero_nodes_per_cpu_s']):>13}"
                    f"{cy['evaluated'] / max(1, cy['calls']):>12.1f}{cy['average_depth']:>7.1f}")
            if lc0:
                lc = lc0_search(lc0, fen, batch, args.seconds)
                row.update(lc0=lc, lc0_nodes_per_s=round(_rate([lc]), 1),
                           lc0_nodes_per_cpu_s=round(_rate([lc], "cpu_seconds"), 1))
                row["ratio"] = _ratio(row["cyzero_nodes_per_s"], row["lc0_nodes_per_s"])
                row["cpu_ratio"] = _ratio(row["cyzero_nodes_per_cpu_s"], row["lc0_nodes_per_cpu_s"])
                line += (f"{_fmt_int(row['lc0_nodes_per_s']):>12}{_fmt_int(row['lc0_nodes_per_cpu_s']):>13}"
                         f"{row['ratio'] or 0:>7.2f}{row['cpu_ratio'] or 0:>11.2f}")
            rows.append(row)
            say(line)
        searcher.abort()
        searcher.wait()
    totals = {}
    for batch in args.batches:
        mine = [r for r in rows if r["batch"] == batch]
        total = {"cyzero_nodes_per_s": round(_rate([r["cyzero"] for r in mine]), 1),
                 "cyzero_nodes_per_cpu_s": round(_rate([r["cyzero"] for r in mine], "cpu_seconds"), 1)}
        if lc0:
            total["lc0_nodes_per_s"] = round(_rate([r["lc0"] for r in mine]), 1)
            total["lc0_nodes_per_cpu_s"] = round(_rate([r["lc0"] for r in mine], "cpu_seconds"), 1)
            total["ratio"] = _ratio(total["cyzero_nodes_per_s"], total["lc0_nodes_per_s"])
            total["cpu_ratio"] = _ratio(total["cyzero_nodes_per_cpu_s"], total["lc0_nodes_per_cpu_s"])
        totals[str(batch)] = total
    load_after = os.getloadavg()
    summary = {
        "benchmark": "null",
        "measures": NULL_NOTE,
        "totals": totals,
        "lc0": {"binary": lc0, "flags": list(LC0_FLAGS) + ["--minibatch-size=<batch>"]} if lc0 else None,
        "batches": list(args.batches),
        "seconds_target": args.seconds,
        "processor": processor.describe(),
        "load_average": {"start": [round(x, 2) for x in load_before], "end": [round(x, 2) for x in load_after]},
        "rows": rows,
        **_run_facts(started),
    }
    if args.json:
        print(json.dumps(summary))
        return 0
    print()
    for batch, total in totals.items():
        print(f"total, MinibatchSize {batch}: cyzero {_fmt_int(total['cyzero_nodes_per_s'])} nodes/s "
              f"({_fmt_int(total['cyzero_nodes_per_cpu_s'])} a CPU second)"
              + (f", lc0 {_fmt_int(total['lc0_nodes_per_s'])} nodes/s ({_fmt_int(total['lc0_nodes_per_cpu_s'])} "
                 f"a CPU second): cyzero / lc0 = {total['ratio'] or 0:.2f} ({total['cpu_ratio'] or 0:.2f} per "
                 "CPU second)" if lc0 else ""))
    if not lc0:
        print(f"(set {LC0_ENV} to an lc0 binary, or pass --lc0, to measure lc0's random backend beside it)")
    print(f"machine: {summary['processor']}; load average {load_before[0]:.2f} at the start, "
          f"{load_after[0]:.2f} at the end; {summary['wall_seconds']:.1f} s")
    return 0


# --------------------------------------------------------------------------- mates


def _add_mates_arguments(parser: argparse.ArgumentParser) -> None:
    from engine.tools.mates import add_arguments

    add_arguments(parser)


@register(
    "mates",
    "share of forced mates in 1, 2 and 3 the engine finds at each node budget (engine/tools/mates.epd)",
    _add_mates_arguments,
)
def bench_mates(args: argparse.Namespace) -> int:
    """See :mod:`engine.tools.mates`."""
    from engine.tools.mates import MatesError, run_bench

    try:
        return run_bench(args)
    except MatesError as e:
        raise BenchError(str(e)) from None
