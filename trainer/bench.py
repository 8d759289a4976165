"""``cyzero-train bench train``: what the learner gets out of the hardware, measured side by side
with its ceiling (``bench selfplay``, the self-play workers' counterpart, is
:mod:`trainer.bench_selfplay`). In one run, on one temporary replay store of synthetic records:

* **raw**: forward, backward and optimiser step of the model on one batch already in memory,
  in a loop (:func:`trainer.learner.train_step`, nothing else): the ceiling;
* **learner, 1 rank** and **learner, 2 ranks**: :func:`trainer.learner.learn` itself (the real
  loader, DDP over gloo or nccl, metrics), its samples/s read from ``metrics.jsonl`` (which
  leaves out the checkpoints and validation), the first log interval dropped as warm-up;
* **loader**: :func:`trainer.loader.loader_throughput`, what the worker processes deliver alone.

The ratios are the point: the learner should keep at least 90% of the raw rate (the loader
and the bookkeeping hide behind the step) and the loader should deliver at least five times
what the learner consumes. On a CPU each rank gets one torch thread by default, so that two
ranks on two cores compare with one rank on one core as two GPUs do with one; on a machine
whose cores are busy with other work the two ranks cannot show that, and say so only by
falling short of 2x.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from trainer.config import default_config, to_toml

__all__: Sequence[str] = ["bench_train", "format_report", "synthetic_records"]


def synthetic_records(n: int, seed: int = 0, input_format: int = 1) -> np.ndarray:
    """``n`` V6 records (lc0's ``input_format``) of positions from random games, with random visit
    shares on a few legal moves."""
    from engine.board import Board
    from trainer.records import RECORD_DTYPE, Eval, make_record

    rng = random.Random(seed)
    records: list[np.void] = []
    while len(records) < n:
        board = Board()
        length = rng.randrange(20, 120)
        for ply in range(length):
            moves = sorted(board.legal_moves())
            if not moves or board.is_game_over() or len(records) >= n:
                break
            visits = {m: rng.random() + 0.01 for m in rng.sample(moves, min(len(moves), 6))}
            played = rng.choice(sorted(visits))
            q = rng.choice((-1.0, 0.0, 1.0))
            records.append(make_record(board, visits, result_q=q, result_d=1.0 - abs(q),
                                       plies_left=float(length - ply), played=played, root=Eval(0.0, 0.5, 40.0),
                                       input_format=input_format))
            board.push_uci(played)
    return np.array(records, dtype=RECORD_DTYPE)


def _make_store(folder: str, chunks: int, chunk_positions: int, seed: int, input_format: int) -> None:
    """A replay store of ``chunks`` chunks drawn (with repeats) from a few thousand distinct positions."""
    from trainer.store import ReplayStore

    base = synthetic_records(min(4000, chunks * chunk_positions), seed, input_format)
    store = ReplayStore(folder, input_format)
    rng = np.random.default_rng(seed)
    for _ in range(chunks):
        store.append_games([base[rng.integers(0, len(base), chunk_positions)]], generation=0, source="bench")


def _raw_rates(shape, batch, device: torch.device, amp: str, interval: int, intervals: int) -> list[float]:
    """samples/s of train_step alone on one batch, per ``interval`` steps (after one interval of warm-up)."""
    from trainer.config import LossConfig, OptimizerConfig
    from trainer.learner import train_step
    from trainer.losses import make_optimizer
    from trainer.model import build_net

    net = build_net(shape).to(device)
    opt = make_optimizer(net, OptimizerConfig())
    batch = type(batch)(*(t.to(device) for t in batch))
    amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(amp) if device.type == "cuda" else None
    scaler = torch.amp.GradScaler("cuda") if amp_dtype is torch.float16 else None
    rates = []
    for i in range(intervals + 1):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        for _ in range(interval):
            train_step(net, opt, [batch], LossConfig(), clip_grad_norm=10.0, scaler=scaler, amp_dtype=amp_dtype)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if i:
            rates.append(interval * len(batch.planes) / (time.perf_counter() - start))
    return rates


def _learner_rate(base: str, devices: str, config_text: str, steps: int, replay: str | None = None) -> float:
    """samples/s of ``learn`` on the store in ``base`` (or the replay folder ``replay``), the median
    of the log intervals after the first."""
    from trainer.learner import learn

    run = tempfile.mkdtemp(prefix="run-", dir=base)
    os.symlink(replay or os.path.join(base, "store", "replay"), os.path.join(run, "replay"))
    with open(os.path.join(run, "config.toml"), "w", encoding="utf-8") as f:
        f.write(config_text)
    lines: list[str] = []
    code = learn(run, devices=devices, steps=steps, progress=False, log=lines.append)
    if code != 0:
        raise RuntimeError(f"learn --devices {devices} failed (exit {code}): " + " | ".join(lines[-3:]))
    rates = []
    with open(os.path.join(run, "metrics.jsonl"), encoding="utf-8") as f:
        for line in f:
            record = json.loads(line)
            if "samples_per_s" in record:
                rates.append(record["samples_per_s"])
    if len(rates) < 2:
        raise RuntimeError(f"learn --devices {devices} logged {len(rates)} intervals; need at least 2")
    return statistics.median(rates[1:])


DAEMON_INTERVALS = 20  # bench train --run: the run's last this many log intervals with a rate


def _daemon_rate(run_dir: str, bench_rate: float) -> dict:
    """The run learner's own samples/s under the daemon (RUN/metrics.jsonl: the median of its last
    :data:`DAEMON_INTERVALS` log intervals, each measured while training, waits for games left
    out) and its share of ``bench_rate``; empty when the run has no rate yet."""
    from trainer.rundir import METRICS_FILE, read_log

    rows = [r for r in read_log(os.path.join(run_dir, METRICS_FILE)) if isinstance(r.get("samples_per_s"), (int, float))]
    rows = rows[1:][-DAEMON_INTERVALS:]  # the first interval holds the warm-up
    if not rows:
        return {}
    rate = statistics.median(r["samples_per_s"] for r in rows)
    out = {"daemon_samples_per_s": rate, "daemon_over_learner": rate / bench_rate, "daemon_intervals": len(rows)}
    loaders = [r["loader_samples_per_s"] for r in rows if isinstance(r.get("loader_samples_per_s"), (int, float))]
    if loaders:
        out["daemon_loader_samples_per_s"] = statistics.median(loaders)
    return out


def _restore_env(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


def format_report(figures: dict) -> str:
    """The figures as a person reads them, ratios against their targets."""
    f = figures

    def mark(ok: bool) -> str:
        return "ok" if ok else "BELOW TARGET"

    lines = [
        f"cyzero-train bench train: {f['net']} net, batch {f['batch_size']}, {f['device']} "
        f"({f['cores']} cores, torch {f['torch']}"
        + (f", {f['threads_per_rank']} thread(s) per rank" if f.get("threads_per_rank") else "")
        + f"), {f['steps']} learner steps per run",
        f"  raw forward-backward-step   {f['raw_samples_per_s']:>10,.0f} samples/s",
    ]
    if f.get("run"):
        lines[0] += f"; on the replay store of {f['run']}"
    for key, label in (("learner_1_rank", "learner, 1 rank"), ("learner_2_ranks", "learner, 2 ranks")):
        if key + "_samples_per_s" in f:
            lines.append(f"  {label:<27} {f[key + '_samples_per_s']:>10,.0f} samples/s  "
                         f"({f[key + '_over_raw']:.0%} of raw)")
    lines.append(f"  loader ({f['loader_workers']} workers)          {f['loader_samples_per_s']:>10,.0f} samples/s")
    lines.append(f"  learner / raw        {f['learner_1_rank_over_raw']:.0%}   (target >= 90%: "
                 f"{mark(f['learner_1_rank_over_raw'] >= 0.9)})")
    lines.append(f"  loader / learner     {f['loader_over_learner']:.1f}x  (target >= 5x: "
                 f"{mark(f['loader_over_learner'] >= 5)})")
    if f.get("daemon_samples_per_s"):
        lines.append(f"  under the daemon     {f['daemon_samples_per_s']:,.0f} samples/s, {f['daemon_over_learner']:.0%} of "
                     f"the learner here (target >= 90%: {mark(f['daemon_over_learner'] >= 0.9)}; median of "
                     f"{f['daemon_intervals']} log intervals of RUN/metrics.jsonl"
                     + (f", loader {f['daemon_loader_samples_per_s']:,.0f} samples/s" if f.get("daemon_loader_samples_per_s")
                        else "") + ")")
    elif f.get("run"):
        lines.append("  under the daemon     no rate in RUN/metrics.jsonl yet (the learner logs one every log.interval "
                     "steps of training)")
    if "learner_2_ranks_over_1" in f:
        lines.append(f"  2 ranks / 1 rank     {f['learner_2_ranks_over_1']:.2f}x  (ideal 2x: the global batch split "
                     "over twice the devices)")
    return "\n".join(lines)


def bench_train(
    print_report: bool = True,
    *,
    device: str | None = None,
    net: str = "6x64",
    batch_size: int = 256,
    steps: int = 24,
    log_interval: int = 6,
    loader_workers: int = 2,
    rank_workers: int | None = None,
    threads: int = 1,
    chunks: int = 8,
    chunk_positions: int = 1024,
    seed: int = 0,
    run_dir: str | None = None,
    config_name: str | None = None,
    log: Callable[[str], Any] | None = None,
) -> dict:
    """Measure raw step, learner (1 and 2 ranks) and loader samples/s in one run; returns the figures.

    ``run_dir`` (``--run``): on that run's replay store, with its config's network, batch size,
    loader workers and learner threads (``daemon.learner_threads``), one rank: the learner as the
    daemon runs it, measured alone, beside the rate the run's learner logged under the daemon
    (``daemon_over_learner``, the share of its own rate it keeps there; nothing in the run is
    written but the replay cache).

    ``config_name`` (``--config``): a training config's network, batch size, loader workers and
    precision (``train.amp``) on synthetic records of its input format, so that a config such as
    ``gpu-bt`` is measured as its learner would run before any game exists.

    ``device``: "cpu" or "cuda" (default: cuda when there is a GPU). Two ranks run on a CPU,
    and on CUDA when there are two GPUs. ``rank_workers``: loader workers per learner rank
    (default: the config's ``replay.workers``; the loader alone is measured with ``loader_workers``).
    ``threads``: torch threads per rank on a CPU (one by default: every rank then has a core to
    itself, as it has a GPU to itself, and a shared machine's other load cannot stall an op's
    threads). The default takes about a minute on a 2-core CPU. ``print_report`` prints :func:`format_report` to stdout; progress goes
    to ``log`` (default stderr).
    """
    from trainer.loader import Batch, ReplayLoader, ReplaySampler, WindowConfig, loader_throughput
    from trainer.store import ReplayStore

    log = log or (lambda line: print(line, file=sys.stderr, flush=True))
    kind = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if kind not in ("cpu", "cuda"):
        raise ValueError(f"device must be cpu or cuda, got {device!r}")
    if steps < 2 * log_interval:
        raise ValueError(f"steps ({steps}) must cover at least two log intervals of {log_interval}")
    torch_device = torch.device("cuda", 0) if kind == "cuda" else torch.device("cpu")
    if run_dir is not None and config_name is not None:
        raise ValueError("give a run (--run) or a config (--config), not both: a run has its own config")
    base_config = default_config()
    if config_name is not None:
        from trainer.config import load_named_config

        base_config = load_named_config(config_name)
        net, batch_size = base_config.model.net, base_config.train.batch_size
    if run_dir is not None:
        from trainer.config import load_run_config
        from trainer.rundir import check_run_dir

        run_dir = check_run_dir(run_dir)
        base_config = load_run_config(run_dir)
        net, batch_size = base_config.model.net, base_config.train.batch_size
        rank_workers = base_config.replay.workers if rank_workers is None else rank_workers
        threads = base_config.daemon.learner_threads or threads
    if rank_workers is None:
        rank_workers = base_config.replay.workers
    config = base_config.replace(
        model={"net": net},
        optimizer={"warmup_steps": 0},
        train={"batch_size": batch_size, "checkpoint_every": 10 * steps, "average": "none", "seed": seed,
               "init_from": ""},
        replay={"val_percent": 0.0 if run_dir is None else base_config.replay.val_percent,
                "floor": 10**9 if run_dir is None else base_config.replay.floor, "workers": rank_workers,
                "validation_positions": 0, "max_samples_per_position": 1e6, "keep_positions": 0,
                "keep_networks": 0},
        log={"interval": log_interval},
    )
    figures: dict[str, Any] = {
        "device": kind if kind == "cpu" else torch.cuda.get_device_name(0),
        "cores": os.cpu_count(),
        "torch": torch.__version__,
        "net": net,
        "batch_size": batch_size,
        "steps": steps,
        "loader_workers": loader_workers,
        "rank_workers": rank_workers,
        "threads_per_rank": threads if kind == "cpu" else None,
        "run": run_dir,
    }
    with contextlib.ExitStack() as stack:
        base = stack.enter_context(tempfile.TemporaryDirectory(prefix="cyzero-bench-train-"))
        if kind == "cpu":
            stack.callback(_restore_env, "OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS"))
        start = time.perf_counter()
        if run_dir is None:
            _make_store(os.path.join(base, "store"), chunks, chunk_positions, seed, config.model.input_format)
            log(f"bench train: store of {chunks} x {chunk_positions} synthetic positions in "
                f"{time.perf_counter() - start:.1f} s")
            store = ReplayStore(os.path.join(base, "store"), config.model.input_format)
            window = WindowConfig(floor=10**9, val_percent=0.0)
        else:
            store = ReplayStore(run_dir, config.model.input_format)
            window = config.replay

        sampler = ReplaySampler(store, dataclasses.replace(window, max_samples_per_position=1e6), batch_size,
                                seed=seed)
        with contextlib.closing(ReplayLoader(store, sampler, workers=0)) as loader:
            batch: Batch = next(loader)
        intervals = steps // log_interval - 1
        if kind == "cpu":
            stack.callback(torch.set_num_threads, torch.get_num_threads())
            torch.set_num_threads(threads)
        else:  # the raw step runs with the learner's CUDA settings (cuDNN autotuner, TF32), before and after it
            from trainer.learner import configure_device

            configure_device(torch_device)
        from trainer.run_setup import net_config

        shape = net_config(config)
        raw = _raw_rates(shape, batch, torch_device, config.train.amp, log_interval, intervals)
        log(f"bench train: raw {statistics.median(raw):,.0f} samples/s")

        runs = [("learner_1_rank", f"{kind}:1" if kind == "cpu" else "cuda:0")]
        if run_dir is not None:
            pass  # one rank, as the daemon's learner
        elif kind == "cpu":
            runs.append(("learner_2_ranks", "cpu:2"))
        elif torch.cuda.device_count() >= 2:
            runs.append(("learner_2_ranks", "cuda:0,1"))
        learner = {}
        for key, devices in runs:
            if kind == "cpu":  # spawned ranks divide torch's default threads (OMP_NUM_THREADS) among them
                os.environ["OMP_NUM_THREADS"] = str(threads * int(devices.split(":")[1]))
            learner[key] = _learner_rate(base, devices, to_toml(config), steps,
                                         None if run_dir is None else str(store.dir))
            log(f"bench train: {key.replace('_', ' ')} ({devices}) {learner[key]:,.0f} samples/s")
        # The raw rate again after the learners, so that both sides sample the machine's load
        # (shared machines vary) over the same span; the median of all raw intervals counts.
        raw += _raw_rates(shape, batch, torch_device, config.train.amp, log_interval, intervals)
        figures["raw_samples_per_s"] = statistics.median(raw)
        for key, rate in learner.items():
            figures[key + "_samples_per_s"] = rate
            figures[key + "_over_raw"] = rate / figures["raw_samples_per_s"]

        figures["loader_samples_per_s"] = loader_throughput(store, window, batch_size, loader_workers,
                                                            batches=max(8, steps))
        log(f"bench train: loader {figures['loader_samples_per_s']:,.0f} samples/s")
    figures["loader_over_learner"] = figures["loader_samples_per_s"] / figures["learner_1_rank_samples_per_s"]
    if run_dir is not None:
        figures.update(_daemon_rate(run_dir, figures["learner_1_rank_samples_per_s"]))
    if "learner_2_ranks_samples_per_s" in figures:
        figures["learner_2_ranks_over_1"] = (figures["learner_2_ranks_samples_per_s"]
                                             / figures["learner_1_rank_samples_per_s"])
    if print_report:
        print(format_report(figures), flush=True)
    return figures
