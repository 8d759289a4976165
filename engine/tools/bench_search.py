"""``cyzero bench search``: the whole search loop's nodes/s against raw ``evaluate`` at the
same batch sizes, ``go movetime`` against what raw evaluate could do, and one backend against
another; :class:`CountingNetwork` and :func:`replay` are reused by ``cyzero-train bench selfplay``."""

from __future__ import annotations

import argparse
import threading
import time
from typing import Iterator

from engine import processor
from engine.params import SearchParams
from engine.sessions import BACKENDS
from engine.tools.bench_common import BenchError, fmt_int, json_and_seconds, register, report, run_facts
from engine.tools.bench_nn import nn_inputs
from engine.tools.bench_tree import TREE_POSITIONS


def _add_search_arguments(parser: argparse.ArgumentParser) -> None:
    json_and_seconds(parser, 3.0, "search measurement per position and mode")
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


class CountingNetwork:
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


def replay(net, sizes: list[int], planes, outputs) -> float:
    """Seconds raw ``evaluate_into`` takes for calls of these sizes, back to back (the network
    pads each to the size it runs, as it did in the search)."""
    policy, wdl, mlh = outputs
    start = time.perf_counter()
    for n in sizes:
        net.evaluate_into(planes[:n], policy, wdl, mlh)
    return time.perf_counter() - start


def timed_search(searcher, fen: str, seconds: float) -> tuple[int, float, float]:
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

    from engine.network import POLICY_SIZE
    from engine.params import SearchParams
    from engine.search import Searcher, default_pipeline, search_batch
    from engine.timeman import TimeManager

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
    counted = CountingNetwork(net)
    # Move Overhead 0 and no smart pruning: every search runs its whole movetime.
    params = SearchParams(minibatch_size=args.batch, smart_pruning_factor=0.0, move_overhead_ms=0)
    batch = search_batch(params, net)
    searchers = {label: Searcher(lambda: counted, params.replace(search_threads=threads), TimeManager(safety_ms=0),
                                 pipeline=pipeline)
                 for label, pipeline, threads in SEARCH_MODES}
    uci_pipeline = default_pipeline(counted)   # what the UCI search picks here
    largest = max(batch, net.max_batch)
    planes, _ = nn_inputs(largest)
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
                nodes, secs, bytes_per_node = timed_search(searchers[label], fen, half)
                mode = per_mode[label]
                mode["nodes"] += nodes
                mode["seconds"] += secs
                mode["calls"] += counted.calls - calls
                mode["positions"] += counted.positions - evaluated
                mode["raw_seconds"] += replay(net, counted.sizes, planes, outputs)
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
                f"{fmt_int(m['search_nodes_per_s']):>24}{fmt_int(m['raw_positions_per_s']):>11}"
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
    raw_batch = replay(net, [batch] * 8, planes, outputs)
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
        **run_facts(started),
    }
    return report(args, summary, _search_text)


def _search_text(summary: dict) -> Iterator[str]:
    """The totals of each mode, the short movetime and the baseline; the table's rows came as
    they were measured."""
    yield ""
    for label, mode in summary["modes"].items():
        yield (f"total, {label}{' (the UCI search here)' if label == summary['uci_mode'] else ''}: search "
               f"{fmt_int(mode['search_nodes_per_s'])} nodes/s, raw evaluate at the same sizes "
               f"{fmt_int(mode['raw_positions_per_s'])} positions/s: efficiency {mode['efficiency']:.1%} "
               f"(target >= 90%); the network was busy {mode['network_busy']:.1%} of the time")
    yield f"{summary['bytes_per_node']:.1f} bytes per node"
    yield ""
    short = summary["short_movetime"]
    yield (f"go movetime {short['movetime_ms']}: nodes vs raw capacity (UCI defaults, Move Overhead "
           f"{short['move_overhead_ms']} ms: {short['budget_ms']} ms to search): median "
           f"{fmt_int(short['median_nodes'])} nodes of {fmt_int(short['raw_capacity'])} = "
           f"{short['ratio']:.0%} (target >= 50%); all {short['nodes']}")
    baseline = summary["baseline"]
    if baseline:
        yield ""
        yield (f"the engine's nodes/s, {baseline['network']} against {baseline['baseline_network']}, "
               f"alternating over the same positions: {fmt_int(baseline['search_nodes_per_s'])} against "
               f"{fmt_int(baseline['baseline_nodes_per_s'])} = {baseline['ratio']:.2f}x")
    yield f"machine: {summary['processor']}; threads: {summary['threads'] or 'the runtime default'}"
    yield f"{summary['wall_seconds']:.1f} s"


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
                nodes, secs, _ = timed_search(searcher, fen, seconds)
                totals[label][1] += nodes
                totals[label][2] += secs
    nps = {label: nodes / secs for label, (_, nodes, secs) in totals.items()}
    return {"network": net.description, "baseline_network": other.description,
            "search_nodes_per_s": round(nps["net"], 1), "baseline_nodes_per_s": round(nps["other"], 1),
            "ratio": round(nps["net"] / nps["other"], 3)}
