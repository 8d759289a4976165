"""Rank 0's reporting while it trains: metrics.jsonl, TensorBoard, the progress bar, console lines,
and RUN/learner.json (where the learner is now, for ``cyzero-train status``)."""

from __future__ import annotations

import collections
import json
import math
import os
import socket
import sys
import time
from collections.abc import Sequence
from typing import Any

from trainer.atomic import append_jsonl, atomic_write_text
from trainer.losses import evaluate
from trainer.rundir import METRICS_FILE, PROGRESS_FILE, TENSORBOARD_DIR

__all__: Sequence[str] = ["PROGRESS_EVERY_S", "RATE_WINDOW_S", "TrainingReporter"]

PROGRESS_EVERY_S = 2.0  # rank 0 rewrites RUN/learner.json (rundir.PROGRESS_FILE), for ``status``, this often
RATE_WINDOW_S = 60.0  # learner.json's samples/s: the last minute of training (waits left out)


class TrainingReporter:
    """Rank 0's reporting: metrics.jsonl, TensorBoard, the progress bar, console lines, and
    RUN/learner.json (:data:`PROGRESS_FILE`: where the learner is now, for ``cyzero-train status``).
    It reads the state of rank 0's :class:`trainer.learner.Learner` (its step, sampler, optimiser),
    which it is handed rather than imports: the learner imports this module."""

    def __init__(self, learner, launch):
        self.learner = learner
        self.log = learner.log
        self.bar: Any = None
        self.writer = None
        self.progress = launch.progress
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:
            self.log(f"learner: no TensorBoard scalars ({exc.name or exc} is not installed)")
        else:
            self.writer = SummaryWriter(os.path.join(learner.run_dir, TENSORBOARD_DIR))
        self._t = time.perf_counter()
        self._steps_before = 0
        # learner.json: the training rate over the last RATE_WINDOW_S of training (waits for data and
        # checkpoints left out), as (steps, seconds) pieces, one per write
        self._pid = launch.parent_pid or os.getpid()  # the `learn` process (a spawned rank's parent)
        self._started = time.time()
        self._mark: float | None = None
        self._busy_steps, self._busy_s = 0, 0.0
        self._pieces: collections.deque[tuple[int, float]] = collections.deque()
        self._written = -math.inf
        self._progress_failed = False
        self._waiting_since: float | None = None
        self._waited_s = 0.0
        self._interval_wait = 0.0  # seconds waited for data since the samples/s clock started
        self.loader_rates: dict[str, float] = {}  # ReplayLoader.rates at the last log line

    def start(self, step: int, target: int | None) -> None:
        batch = self.learner.cfg.train.batch_size
        self._t = time.perf_counter()
        self._mark = time.perf_counter()
        self.write_progress("training", force=True)
        if self.progress:
            from tqdm import tqdm

            self.bar = tqdm(total=None if target is None else target * batch, initial=step * batch,
                            unit="pos", unit_scale=True, dynamic_ncols=True, desc="learn", file=sys.stderr,
                            disable=None)
            if not self.bar.disable:
                self.log = self.bar.write
                self.learner.log = self.bar.write

    def restart_clock(self) -> None:
        """Samples/s counts training only: the clock restarts after a checkpoint and export."""
        self._t = time.perf_counter()
        self._steps_before = self.learner.pending_steps
        self._interval_wait = 0.0
        self._mark = time.perf_counter()
        self.write_progress("training", force=True)

    def tick(self, positions: int) -> None:
        if self.bar is not None:
            self.bar.update(positions)
        now = time.perf_counter()
        if self._mark is not None:
            self._busy_steps += 1
            self._busy_s += now - self._mark
        self._mark = now
        self.write_progress("training")

    def waiting(self, starts: bool) -> None:
        """The learner starts (``starts``) or stops waiting for new data: the wait is not training time."""
        if starts:
            self._waiting_since = time.time()
            self.write_progress("waiting", force=True)
        else:
            if self._waiting_since is not None:
                waited = max(0.0, time.time() - self._waiting_since)
                self._waited_s += waited
                self._interval_wait += waited
            self._waiting_since = None
            self._mark = time.perf_counter()
            self.write_progress("training", force=True)

    def _rate(self) -> tuple[float | None, int]:
        """Samples per second of training over about the last :data:`RATE_WINDOW_S` of it, and the
        steps it was measured over (``status`` calls a rate of a few steps "measuring")."""
        if self._busy_steps:
            self._pieces.append((self._busy_steps, self._busy_s))
            self._busy_steps, self._busy_s = 0, 0.0
        while len(self._pieces) > 1 and sum(t for _, t in list(self._pieces)[1:]) >= RATE_WINDOW_S:
            self._pieces.popleft()
        steps = sum(n for n, _ in self._pieces)
        seconds = sum(t for _, t in self._pieces)
        return (steps * self.learner.cfg.train.batch_size / seconds if steps and seconds > 0 else None), steps

    def write_progress(self, state: str, *, force: bool = False) -> None:
        """RUN/learner.json, atomically, at most every :data:`PROGRESS_EVERY_S` unless ``force``:
        the step, the training rate, the window, the sampling cap, the next generation's step."""
        now = time.monotonic()
        if not force and now - self._written < PROGRESS_EVERY_S:
            return
        self._written = now
        learner = self.learner
        sampler, cfg = learner.sampler, learner.cfg
        every = cfg.train.checkpoint_every
        available = sampler.batches_available()
        rate, rate_steps = self._rate()
        record = {
            "pid": self._pid, "host": socket.gethostname(), "started": self._started, "time": time.time(),
            "state": state, "step": learner.step, "target_step": learner.launch.steps,
            "generation": learner.generation, "checkpoint_step": learner.checkpoint_step,
            "checkpoint_every": every, "next_generation_step": (learner.step // every + 1) * every,
            "batch_size": cfg.train.batch_size, "world": learner.world, "device": learner.device.type,
            "samples_per_s": rate, "rate_steps": rate_steps,
            "loader_samples_per_s": self.loader_rates.get("loader_samples_per_s"),
            "loader_wait_share": self.loader_rates.get("loader_wait_share"),
            "window_positions": sampler.window_positions, "training_positions": sampler.training_positions,
            "samples_drawn": sampler.samples_drawn,
            "max_samples_per_position": cfg.replay.max_samples_per_position,
            "batches_available": min(available, 1 << 53),
            "waiting_since": self._waiting_since,
            "waited_s": self._waited_s + (time.time() - self._waiting_since if self._waiting_since else 0.0),
            "follow": learner.launch.follow,
        }
        try:
            atomic_write_text(os.path.join(learner.run_dir, PROGRESS_FILE), json.dumps(record) + "\n")
        except OSError as exc:
            if not self._progress_failed:  # said once: training goes on without it
                self._progress_failed = True
                self.log(f"learner: {PROGRESS_FILE} not written ({exc}): `status` will not show the learner's step")

    def metrics(self, losses: dict[str, float], steps: int) -> None:
        learner = self.learner
        now = time.perf_counter()
        timed = steps - self._steps_before
        self._steps_before = 0
        # samples/s while training: the time waited for new games is left out
        busy = max(now - self._t - self._interval_wait, 1e-9)
        rate = timed * learner.cfg.train.batch_size / busy if timed > 0 else None
        self._interval_wait = 0.0
        if learner.loader is not None:  # which side limits: the loader's capacity, and its share of the time
            self.loader_rates = learner.loader.rates(busy)
        record: dict[str, Any] = {
            "step": learner.step,
            "time": time.time(),
            "loss_policy": losses["policy"],
            "loss_value": losses["value"],
            "loss_moves_left": losses["moves_left"],
            "loss_total": losses["total"],
            "grad_norm": losses["grad_norm"],
            "lr": learner.optimizer.param_groups[0]["lr"],
            "window": learner.sampler.window_positions,
            "generation": learner.generation,
        }
        if rate is not None:
            record["samples_per_s"] = rate
            record.update(self.loader_rates)
        val = learner.validation_batch()
        if val is not None:
            for key, value in evaluate(learner.net, val, learner.cfg.loss).items():
                record[f"val_{key}"] = value
        append_jsonl(os.path.join(learner.run_dir, METRICS_FILE), record)
        if self.writer is not None:
            for key, value in record.items():
                if key not in ("step", "time"):
                    self.writer.add_scalar(key.replace("_", "/", 1) if key.startswith(("loss_", "val_")) else key,
                                           value, learner.step)
            self.writer.flush()
        if self.bar is not None and not self.bar.disable:
            self.bar.set_postfix(loss=f"{losses['total']:.3f}", lr=f"{record['lr']:.3g}", refresh=False)
        else:
            self.log(f"learner: step {learner.step:,}: loss {losses['total']:.4f} (policy {losses['policy']:.4f}, "
                     f"value {losses['value']:.4f}, moves left {losses['moves_left']:.4f}), lr {record['lr']:.3g}"
                     + (f", {rate:,.0f} pos/s" if rate is not None else "") + (f", val top-1 {record['val_policy_top1']:.3f}"
                                              if "val_policy_top1" in record else ""))
        self._t = time.perf_counter()

    def close(self) -> None:
        self._waiting_since = None
        self.write_progress("stopped", force=True)
        if self.bar is not None:
            self.bar.close()
        if self.writer is not None:
            self.writer.close()
