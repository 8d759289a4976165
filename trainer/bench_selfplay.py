"""``cyzero-train bench selfplay``: network evaluations/s in self-play against raw batched
inference at the same batch sizes, in the processes a self-play worker would use.

Nothing here imports torch (only ``--config`` exports a fresh network, through
:mod:`trainer.export`): the measuring processes are spawned, and each would otherwise import it
again for nothing, seconds of CPU apiece on a small machine.
"""

from __future__ import annotations

import atexit
import dataclasses
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from trainer.devices import usable_cores
from trainer.lifeline import end_with

__all__: Sequence[str] = ["bench_selfplay", "format_selfplay_report"]

SELFPLAY_TARGET = 0.85  # self-play should keep this share of raw batched inference


SELFPLAY_ROUNDS = 4  # the measuring time is split into rounds that alternate self-play and raw inference


def _selfplay_job(job: dict, barrier: Any) -> dict:
    """One process: self-play and raw ``evaluate`` on one network, alternating in rounds.

    After a warm-up step of self-play, each of :data:`SELFPLAY_ROUNDS` rounds plays self-play
    steps for ``seconds / rounds`` and then replays that round's network calls back to back:
    the same sizes, padded the same way, so raw inference is measured at the sizes self-play
    really sends. Alternating spreads a shared machine's changing load over both. Processes
    measured together wait on ``barrier`` before each phase, so they run the same one.
    Positions are counted by the wrapper around ``evaluate``.
    """
    from engine.network import POLICY_SIZE, Network
    from engine.tools.bench_nn import nn_inputs
    from engine.tools.bench_search import CountingNetwork, replay
    from trainer.selfplay import SelfPlay, SelfPlaySettings, settings_from_config, worker_max_batch

    device = job.get("device", "cpu")
    settings = settings_from_config(job["selfplay"]) if job.get("selfplay") else SelfPlaySettings()
    gpu_options = {"max_batch": worker_max_batch(job["games"], settings)}
    if job.get("simulate_gpu"):
        from engine.tools.gpu_standin import simulated_network

        profile = job["simulate_gpu"] if isinstance(job["simulate_gpu"], str) else "h100"
        net, _ = simulated_network(job["network"], profile=profile, **gpu_options)
    elif device == "cpu":
        net = Network(job["network"], backend="cpu", intra_threads=job["threads"])
    else:  # cuda:N, the worker's choice of provider (TensorRT, else CUDA)
        net = Network(job["network"], backend="auto", device_id=int(device.split(":")[1]), **gpu_options)
    counted = CountingNetwork(net)
    share = job["seconds"] / SELFPLAY_ROUNDS
    figures = {"positions": 0, "calls": 0, "plies": 0, "seconds": 0.0, "raw_positions": 0, "raw_seconds": 0.0,
               "finished_plies": [], "sizes": {}, "batch_sizes": list(net.batch_sizes)}
    selfplay = SelfPlay(counted, settings, job["games"], pipeline=job["pipeline"])
    planes = np.zeros((0, 112, 8, 8), np.float32)
    try:
        selfplay.step()  # warm-up: the trees and the first batches
        for _ in range(SELFPLAY_ROUNDS):
            barrier.wait()
            positions, calls, moves = counted.positions, counted.calls, selfplay.moves
            counted.sizes = []
            start = time.perf_counter()
            while time.perf_counter() - start < share:
                figures["finished_plies"] += [game.plies for game in selfplay.step()]
            figures["seconds"] += time.perf_counter() - start
            figures["positions"] += counted.positions - positions
            figures["calls"] += counted.calls - calls
            figures["plies"] += selfplay.moves - moves
            sizes = counted.sizes
            for n in sizes:
                figures["sizes"][n] = figures["sizes"].get(n, 0) + 1
            largest = max(sizes, default=1)
            if len(planes) < largest:
                planes = nn_inputs(largest)[0]
                outputs = (np.empty((largest, POLICY_SIZE), np.float32), np.empty((largest, 3), np.float32),
                           np.empty(largest, np.float32) if net.has_mlh else None)
            barrier.wait()
            figures["raw_seconds"] += replay(net, sizes, planes, outputs)
            figures["raw_positions"] += sum(sizes)
    finally:
        selfplay.close()
    return figures


def _selfplay_child(job: dict, barrier: Any, results: Any, parent: int) -> None:
    # a measuring process left waiting on the barrier for the others held the bench's stdout open
    end_with(parent)
    try:
        results.put(_selfplay_job(job, barrier))
    except BaseException as e:  # reported by the parent as one line
        barrier.abort()
        results.put({"error": f"{type(e).__name__}: {e}"})


def _run_together(jobs: list[dict]) -> list[dict]:
    """Run ``jobs`` in as many spawned processes at once; their results (RuntimeError on a failure)."""
    import multiprocessing
    import queue

    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(len(jobs)), ctx.Queue()
    processes = [ctx.Process(target=_selfplay_child, args=(job, barrier, results, os.getpid()), daemon=True)
                 for job in jobs]
    for process in processes:
        process.start()
    out: list[dict] = []
    try:
        while len(out) < len(jobs):
            try:
                out.append(results.get(timeout=1.0))
            except queue.Empty:
                if any(p.exitcode not in (None, 0) for p in processes) or not any(p.is_alive() for p in processes):
                    codes = [p.exitcode for p in processes]
                    raise RuntimeError(f"bench selfplay: a measuring process died (exit codes {codes})") from None
    finally:
        for process in processes:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()
    errors = [r["error"] for r in out if "error" in r]
    if errors:
        raise RuntimeError(f"bench selfplay: {errors[0]}")
    return out


def format_selfplay_report(figures: dict) -> str:
    """The self-play figures as a person reads them."""
    f = figures
    lines = [
        f"cyzero-train bench selfplay: {os.path.basename(f['network'])} on "
        + (f"the CPU ({f['cores']} cores), " if f.get("device", "cpu") == "cpu" else f"{f['device']}, ")
        + (f"config {f['config']}'s [selfplay], " if f.get("config") else "") +
        f"{f['games_per_worker']} games per worker, visits {f['visits']} (fast {f['fast_visits']}, "
        f"full-search share {f['full_search_prob']:g}), pipeline {'on' if f['pipeline'] else 'off'}, "
        f"{f['seconds']:g} s of self-play and {f['seconds']:g} s of raw inference per process, alternating",
    ]
    for key, run in f["runs"].items():
        ok = "ok" if run["ratio"] >= SELFPLAY_TARGET else "BELOW TARGET"
        lines += [
            f"  {key} worker(s), {run['threads_per_worker']} thread(s) each, mean batch {run['batch']:.0f}:",
            f"    raw evaluate                {run['raw_evals_per_s']:>10,.0f} evals/s",
            f"    self-play                   {run['selfplay_evals_per_s']:>10,.0f} evals/s  "
            f"({run['ratio']:.0%} of raw, target >= {SELFPLAY_TARGET:.0%}: {ok})",
            f"    plies/s {run['plies_per_s']:.2f}; games/hour >= {run['games_per_hour']:.1f} "
            f"(plies/s x 3600 / {f['max_plies']}, the longest a game can be)"
            + (f"; {run['games_per_hour_finished']:.1f} with the mean length {run['mean_finished_plies']:.0f} "
               f"of the {run['games_finished']} games that finished (biased short)"
               if run["games_finished"] else "; no game finished in the measurement"),
        ]
    return "\n".join(lines)


def fresh_network(cfg: Any) -> str:
    """A freshly initialised network of ``cfg``'s model, exported to a temporary ONNX file (removed
    when this process exits: the bench's measuring processes read it until then)."""
    from trainer.export import export_onnx
    from trainer.run_setup import net_config
    from trainer.model import build_net

    folder = tempfile.mkdtemp(prefix="cyzero-bench-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    path = os.path.join(folder, f"fresh-{cfg.model.net}.onnx")
    export_onnx(build_net(net_config(cfg), seed=cfg.train.seed), path, "fp32", check_positions=8)
    return path


def bench_selfplay(print_report: bool = True, seconds: float = 20.0, *, network: str | None = None,
                   workers: Sequence[int] = (1, 2), games: int | None = None,
                   pipeline: bool | None = None, config: str | None = None, device: str = "cpu",
                   simulate_gpu: bool | str = False, log: Callable[[str], Any] | None = None) -> dict:
    """Network evaluations/s during self-play against raw batched inference, one after the other.

    For each count K in ``workers``: K processes at once, the CPU's cores split among them as
    ONNX Runtime threads, each with ``SelfPlay`` at the default ``SelfPlaySettings`` (``games``
    games, default 32 as a CPU worker plays) and, in alternating rounds (:func:`_selfplay_job`),
    raw ``Network.evaluate`` at the mean batch self-play sent; ``seconds`` of each per process,
    after a warm-up step. Evaluations are counted by a wrapper around ``evaluate``.
    ``network``: an ONNX file (default the bundled one). ``pipeline``: two batches in flight
    (default as a worker does on the CPU: off, ``engine.search.default_pipeline``).
    ``device``: ``cpu``, or ``cuda:N`` (every worker process on that GPU, two batches in flight
    by default, as a GPU worker plays). ``simulate_gpu``: the network runs on the GPU stand-in
    (``engine.tools.gpu_standin``, one simulated GPU per process) as a GPU worker would, with the
    costs of the profile it names (``h100`` when it is just true).
    ``config``: a training config (a bundled name such as ``cpu``, or a file) whose ``[selfplay]``
    settings and games per worker are played instead of the defaults, with a freshly
    initialised network of its ``[model]`` size unless ``network`` is given: what ``cyzero-train
    run`` with that config plays.

    Games/hour: plies/s x 3600 / ``max_plies`` (450 by default), a lower bound since no game is
    longer; games finished during the measurement also give a second figure from their mean
    length, biased short (only the short games finish in a short run).

    Returns ``{"network", "cores", "games_per_worker", "visits", "fast_visits", "full_search_prob",
    "max_plies", "pipeline", "seconds", "target", "runs": {"K": {"workers", "threads_per_worker",
    "batch" (mean positions per evaluate call in self-play), "selfplay_evals_per_s",
    "raw_evals_per_s", "ratio" (self-play / raw), "plies_per_s", "games_per_hour",
    "games_finished", "mean_finished_plies", "games_per_hour_finished"}}}``; rates are summed over
    the K processes.
    """
    from engine.weights import default_weights_path
    from trainer.selfplay import SelfPlaySettings

    log = log or (lambda line: print(line, file=sys.stderr, flush=True))
    if not seconds > 0:
        raise ValueError(f"seconds must be above 0, got {seconds}")
    if not workers or any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in workers):
        raise ValueError(f"workers must be whole numbers >= 1, got {workers!r}")
    selfplay_keys = None
    if config is not None:
        from trainer.config import load_named_config

        cfg = load_named_config(config)
        selfplay_keys = dataclasses.asdict(cfg.selfplay)
        games = games or cfg.selfplay.games_per_worker or None
        if network is None:
            network = fresh_network(cfg)
    games = 32 if games is None else games
    if isinstance(games, bool) or not isinstance(games, int) or games < 1:
        raise ValueError(f"games must be a whole number >= 1, got {games!r}")
    path = os.path.abspath(network or default_weights_path())
    if not os.path.isfile(path):
        raise ValueError(f"no network at {path}")
    if not re.fullmatch(r"cpu|cuda:\d+", device):
        raise ValueError(f"device must be cpu or cuda:N, got {device!r}")
    if simulate_gpu:
        from engine.tools.gpu_standin import profile_costs

        profile_costs(simulate_gpu if isinstance(simulate_gpu, str) else "h100")   # a wrong name, now
        device = "cuda:0"
    if pipeline is None:  # what a worker does (trainer.worker; engine.search.default_pipeline)
        pipeline = device != "cpu"
    from trainer.selfplay import settings_from_config

    settings = settings_from_config(selfplay_keys) if selfplay_keys else SelfPlaySettings()
    cores = usable_cores()
    figures: dict[str, Any] = {
        "network": path, "cores": cores, "games_per_worker": games, "visits": settings.visits,
        "fast_visits": settings.fast_visits, "full_search_prob": settings.full_search_prob,
        "max_plies": settings.max_plies, "pipeline": pipeline, "seconds": seconds, "target": SELFPLAY_TARGET,
        "config": config, "device": device, "simulated_gpu": simulate_gpu, "runs": {},
    }
    for k in workers:
        threads = max(1, cores // k)
        job = {"network": path, "threads": threads, "seconds": seconds, "games": games, "pipeline": pipeline,
               "selfplay": selfplay_keys, "device": device, "simulate_gpu": simulate_gpu}
        results = _run_together([job] * k)
        positions = sum(r["positions"] for r in results)
        calls = sum(r["calls"] for r in results)
        if not calls:
            raise RuntimeError("bench selfplay: self-play sent nothing to the network in the measurement")
        selfplay_rate = sum(r["positions"] / r["seconds"] for r in results)
        raw_rate = sum(r["raw_positions"] / r["raw_seconds"] for r in results)
        plies_per_s = sum(r["plies"] / r["seconds"] for r in results)
        finished = [n for r in results for n in r["finished_plies"]]
        mean_finished = statistics.mean(finished) if finished else None
        run = figures["runs"][str(k)] = {
            "workers": k, "threads_per_worker": threads, "batch": positions / calls,
            "selfplay_evals_per_s": selfplay_rate, "raw_evals_per_s": raw_rate,
            "ratio": selfplay_rate / raw_rate, "plies_per_s": plies_per_s,
            "games_per_hour": plies_per_s * 3600.0 / settings.max_plies,
            "games_finished": len(finished), "mean_finished_plies": mean_finished,
            "games_per_hour_finished": plies_per_s * 3600.0 / mean_finished if mean_finished else None,
            "batch_sizes": results[0]["batch_sizes"],
            "sizes_sent": dict(sorted(_merge_counts(r["sizes"] for r in results).items())),
        }
        log(f"bench selfplay: {k} worker(s): self-play {selfplay_rate:,.0f} evals/s, raw {raw_rate:,.0f} evals/s "
            f"at batch {run['batch']:.0f} ({run['ratio']:.0%})")
    figures["efficiency"] = min(run["ratio"] for run in figures["runs"].values())
    if print_report:
        print(format_selfplay_report(figures), flush=True)
    return figures


def _merge_counts(counts) -> dict[int, int]:
    merged: dict[int, int] = {}
    for one in counts:
        for size, n in one.items():
            merged[int(size)] = merged.get(int(size), 0) + n
    return merged
