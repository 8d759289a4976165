"""``cyzero bench tree``: playouts/s of the Cython MCTS against the plain-Python PUCT
reference, both with the null evaluator."""

from __future__ import annotations

import argparse
import math
import os
import time
from typing import Iterator

from engine.params import SearchParams
from engine.tools.bench_common import (
    BenchError, environment, fmt_int, json_and_seconds, register, report, require_core,
)


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
    json_and_seconds(parser, 3.0, "measurement (per position and search)")
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
    require_core("engine.tree")
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
                f"{name:<12}{fmt_int(c['playouts_per_s']):>19}{fmt_int(p['playouts_per_s']):>19}"
                f"{result['ratio']:>8.1f}x{result['ratio_growing_encoded']:>15.1f}x"
                f"{g['bytes_per_node']:>12.1f}{fmt_int(g['largest_tree_nodes']):>13}",
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
        "environment": {**environment(), "cpu_count": os.cpu_count()},
    }
    return report(args, summary, lambda summary: _tree_text(summary, cython_pps, python_pps, ratio, geomean))


def _tree_text(summary: dict, cython_pps: float, python_pps: float, ratio: float, geomean: float) -> Iterator[str]:
    """The totals (unrounded; the summary's are rounded) and bytes per node; the table's rows
    came as they were measured."""
    yield ""
    yield (f"total: cython {fmt_int(cython_pps)} playouts/s, python {fmt_int(python_pps)} playouts/s, "
           f"ratio {ratio:.1f}x (geometric mean over positions {geomean:.1f}x; "
           f"{summary['ratio_growing_encoded']:.1f}x for one growing Cython search that also writes planes)")
    yield (f"bytes per node: {summary['bytes_per_node']:.1f} from the start position "
           f"(up to {summary['bytes_per_node_max']:.1f}: a node with more legal moves has more edges); "
           f"{summary['wall_seconds']:.1f} s")
