"""``cyzero bench perft``: the Cython core's bulk-counting perft against python-chess's,
the counts checked against each other and the published ones before a speed is reported."""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass
from typing import Callable, Iterator

from engine.tools.bench_common import (
    BenchError, environment, fmt_int, json_and_seconds, register, report, require_core,
)


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


def _print_position(result: dict) -> None:
    print(f"{result['name']}  {result['fen']}" + ("  (chess960)" if result["chess960"] else ""))
    print(f"  {'engine':<14}{'depth':>6}{'nodes/run':>16}{'runs':>6}{'seconds':>10}{'nodes/s':>16}")
    for label, key in (("core", "core"), ("python-chess", "python_chess")):
        m = result[key]
        print(
            f"  {label:<14}{m['depth']:>6}{fmt_int(m['nodes']):>16}"
            f"{m['runs']:>6}{m['seconds']:>10.3f}{fmt_int(m['nps']):>16}"
        )
    known = result["known_nodes"]
    print(
        f"  counts agree at depth {result['common_depth']}: {fmt_int(result['common_nodes'])} nodes"
        + (" (the published count)" if known is not None else "")
        + f"; core is {result['ratio']:.1f}x python-chess here"
    )
    print(flush=True)


def _add_perft_arguments(parser: argparse.ArgumentParser) -> None:
    json_and_seconds(parser, 1.0, "measurement (per position and engine)")


@register(
    "perft",
    "bulk-counting perft: the Cython core against python-chess, over 7 positions",
    _add_perft_arguments,
)
def bench_perft(args: argparse.Namespace) -> int:
    require_core("engine.board")

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
        "environment": environment(),
    }
    return report(args, summary, lambda summary: _perft_text(summary, core_nps, py_nps, ratio, geomean))


def _perft_text(summary: dict, core_nps: float, py_nps: float, ratio: float, geomean: float) -> Iterator[str]:
    """The total line, its figures unrounded (the summary's are rounded); each position's lines
    came as it was measured."""
    yield (f"total: core {fmt_int(core_nps)} nodes/s, python-chess {fmt_int(py_nps)} nodes/s, "
           f"ratio {ratio:.1f} (geometric mean over positions {geomean:.1f}), "
           f"{summary['wall_seconds']:.1f} s")
