"""``cyzero bench null``: the search's own cost per node on :class:`NullNetwork`, a network
that costs nothing, beside lc0's ``random`` backend when an lc0 binary is given."""

from __future__ import annotations

import argparse
import os
import time
from typing import Iterator

from engine import processor
from engine.params import SearchParams
from engine.tools.bench_common import (
    BenchError, batch_list, fmt_int, json_and_seconds, register, report, require_core, run_facts,
)
from engine.tools.bench_search import timed_search
from engine.tools.bench_tree import TREE_POSITIONS
from engine.tools.bench_uci import UciProcess


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
    json_and_seconds(parser, NULL_SECONDS, "search (go movetime), per position, batch and engine")
    parser.add_argument("--batches", type=batch_list, default=NULL_BATCHES, metavar="B,B,...",
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
        engine = UciProcess(command, subprocess.DEVNULL)
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
    timed_search(searcher, TREE_POSITIONS[0][1], 0.05)    # warm up: the driver and its planes buffer
    return searcher


def _cyzero_null_search(searcher, net: NullNetwork, fen: str, seconds: float) -> dict:
    calls, positions = net.calls, net.positions
    cpu = time.process_time()
    playouts, elapsed, bytes_per_node = timed_search(searcher, fen, seconds)
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
    require_core("engine.tree")
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
            line = (f"{batch:>6}  {name:<12}{fmt_int(row['cyzero_nodes_per_s']):>12}"
                    f"{fmt_int(row['cyzero_nodes_per_cpu_s']):>13}"
                    f"{cy['evaluated'] / max(1, cy['calls']):>12.1f}{cy['average_depth']:>7.1f}")
            if lc0:
                lc = lc0_search(lc0, fen, batch, args.seconds)
                row.update(lc0=lc, lc0_nodes_per_s=round(_rate([lc]), 1),
                           lc0_nodes_per_cpu_s=round(_rate([lc], "cpu_seconds"), 1))
                row["ratio"] = _ratio(row["cyzero_nodes_per_s"], row["lc0_nodes_per_s"])
                row["cpu_ratio"] = _ratio(row["cyzero_nodes_per_cpu_s"], row["lc0_nodes_per_cpu_s"])
                line += (f"{fmt_int(row['lc0_nodes_per_s']):>12}{fmt_int(row['lc0_nodes_per_cpu_s']):>13}"
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
        **run_facts(started),
    }
    return report(args, summary, _null_text)


def _null_text(summary: dict) -> Iterator[str]:
    """The totals of each MinibatchSize and the machine's load; the table's rows came as they
    were measured."""
    lc0 = summary["lc0"]
    yield ""
    for batch, total in summary["totals"].items():
        yield (f"total, MinibatchSize {batch}: cyzero {fmt_int(total['cyzero_nodes_per_s'])} nodes/s "
               f"({fmt_int(total['cyzero_nodes_per_cpu_s'])} a CPU second)"
               + (f", lc0 {fmt_int(total['lc0_nodes_per_s'])} nodes/s ({fmt_int(total['lc0_nodes_per_cpu_s'])} "
                  f"a CPU second): cyzero / lc0 = {total['ratio'] or 0:.2f} ({total['cpu_ratio'] or 0:.2f} per "
                  "CPU second)" if lc0 else ""))
    if not lc0:
        yield f"(set {LC0_ENV} to an lc0 binary, or pass --lc0, to measure lc0's random backend beside it)"
    load = summary["load_average"]   # rounded to 2 places, as the line shows them
    yield (f"machine: {summary['processor']}; load average {load['start'][0]:.2f} at the start, "
           f"{load['end'][0]:.2f} at the end; {summary['wall_seconds']:.1f} s")
