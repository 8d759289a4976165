"""The DDP learner: trains the run's network on its replay store, checkpoints and exports ONNX.

``learn(RUN, devices="cpu:2")`` starts one process per device (``torch.multiprocessing``;
gloo on CPU, with the ranks forked from a forkserver that has imported torch once, nccl on
CUDA, spawned), or, when started by ``torchrun`` (``RANK``/``WORLD_SIZE``/
``LOCAL_RANK`` set), runs as the one rank torchrun made::

    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29400 \\
        -m trainer.cli learn RUN --devices cuda

(each process then uses ``cuda:LOCAL_RANK``; RUN must be the same shared folder on every node).

Each step every rank takes its slice of the same global batch (``ReplayLoader``), DDP averages
the gradients, and every rank applies the same update (:func:`train_step`). Losses are lc0's
(:func:`trainer.losses.compute_losses`). Every ``checkpoint_every`` steps and at the end, every rank takes
the same new snapshot of the replay manifest, then rank 0 writes ``checkpoints/step-XXXXXXXX.pt``
atomically (with that snapshot's cursor), exports ``networks/gen-XXXXX.onnx`` (with its sha256)
through :func:`trainer.export.export_onnx` (the EMA/SWA weights when they score better on the
validation batch) and appends the generation to ``generations.jsonl``. Running the same
command again resumes from the newest checkpoint that loads, at its step and with its
sampling cursor, and samples the batches the first run would have; ``steps`` is the step to
stop at, counted from the start of the run, so a resumed command finishes where the first
one would have. When the sampling cap is reached the learner stops (final checkpoint) or,
with ``follow``, waits for new games.

A rank that dies takes the group down: the parent sees it, stops the others and says which
rank and how it ended; a rank blocked on a dead peer fails after the process-group timeout
(``train.dist_timeout_s``) instead of hanging (under torchrun, its agent restarts the group).

This module is the loop, read top to bottom: a step, a rank's :class:`Learner`, :func:`run_rank`,
:func:`learn`. Beside it: :mod:`trainer.losses` (losses, optimiser, schedule, weight averaging),
:mod:`trainer.training_report` (rank 0's metrics and progress), :mod:`trainer.ranks` (spawning and
supervising the ranks) and :mod:`trainer.run_setup` (the network's shape, ``train.init_from`` and
the checks of a start).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import math
import os
import re
import signal
import socket
import sys
import threading
import time
from collections.abc import Sequence

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from trainer.atomic import append_jsonl, read_jsonl
from trainer.checkpoints import CHECKPOINT_FORMAT, read_learner_checkpoint, write_checkpoint
from trainer.config import LossConfig, TrainConfig, from_dict, load_config, named_config_path
from trainer.devices import Devices, learner_devices
from trainer.losses import (
    WeightAverager, apply_hyperparameters, compute_losses, evaluate, lr_at, make_optimizer, set_lr,
)
from trainer.model import Net, build_net, deepen
from trainer.ranks import end_rank_process, join_group, rendezvous_store, run_ranks
from trainer.run_setup import (
    Log, grown_config, init_from_path, net_config, newest_generation, prepare_run, read_init_network,
)
from trainer.rundir import (
    GENERATIONS_FILE, LEARNER_LOCK, NETWORK_DIR, checkpoint_path, list_checkpoints, network_path, run_lock,
)
from trainer.stop_signals import stop_on_signals
from trainer.training_report import TrainingReporter

__all__: Sequence[str] = [
    "learn", "initialize_run", "run_rank", "train_step", "Launch", "Learner", "StopVote", "configure_device",
    "pinned_transfer", "DeviceFeed", "EXIT_HOOK_ENV",
]

#: Fault injection for the tests: "RANK:STEP" makes that rank exit with code 3 right after that
#: step, "RANK:STEP:kill" makes it SIGKILL itself there (no cleanup of any kind), and
#: "RANK:STEP:abort" makes it abort as a native crash would.
EXIT_HOOK_ENV = "CYZERO_LEARNER_TEST_EXIT"
_TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
_EXPORT_CHECK_POSITIONS = 64


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _quiet(line: str) -> None:
    pass


def configure_device(device: torch.device) -> None:
    """What a CUDA rank trains with (the bench's raw step too): its GPU as the current device,
    cuDNN's autotuner (every step has the same shapes) and TF32 float32 matmuls. Nothing on a CPU."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.backends.cudnn.benchmark = True
        torch.set_float32_matmul_precision("high")


def pinned_transfer(device: torch.device | str) -> bool:
    """Whether batches for ``device`` come in pinned (page-locked) host memory and go to it by
    non-blocking copies on a side stream (:class:`DeviceFeed`): on CUDA only. A CPU rank uses
    the loader's tensors as they are (pinning needs a CUDA build, and a copy would only cost)."""
    return torch.device(device).type == "cuda"


class DeviceFeed:
    """Moves the loader's batches to the training device.

    On CUDA (:func:`pinned_transfer`) the loader hands a batch over in pinned memory and its
    copy is queued with ``non_blocking=True`` on a side stream. The host queues step k's kernels
    and goes on to batch k + 1 without waiting for the GPU (the loop does not sync between log
    intervals), so batch k + 1's copy runs while the GPU still computes step k: one batch
    prefetched onto the device, the copy engine beside the compute instead of in front of it.
    The compute stream waits for the copy (an event, on the device, not the host) before it
    uses the batch, and ``record_stream`` stops the caching allocator from giving the batch's
    memory to a later copy while the step still reads it. On the CPU a batch goes through as
    it is (``Tensor.to`` of a tensor already there returns it).
    """

    def __init__(self, device: torch.device | str):
        self.device = torch.device(device)
        self.stream = torch.cuda.Stream(self.device) if pinned_transfer(self.device) else None

    def __call__(self, batch):
        """``batch`` (a NamedTuple of tensors) on the device, ready for the current stream to use."""
        if self.stream is None:
            return type(batch)(*(t.to(self.device) for t in batch))
        compute = torch.cuda.current_stream(self.device)
        with torch.cuda.stream(self.stream):
            moved = [t.to(self.device, non_blocking=True) for t in batch]
        compute.wait_stream(self.stream)
        for t in moved:
            t.record_stream(compute)
        return type(batch)(*moved)


# --------------------------------------------------------------------------- a step


def _autocast(device: torch.device, amp_dtype: torch.dtype | None):
    if amp_dtype is None or device.type != "cuda":
        return contextlib.nullcontext()
    return torch.autocast(device_type="cuda", dtype=amp_dtype)


def train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    batches: Sequence,
    loss_cfg: LossConfig,
    *,
    clip_grad_norm: float = 0.0,
    scaler: torch.amp.GradScaler | None = None,
    amp_dtype: torch.dtype | None = None,
) -> dict[str, torch.Tensor]:
    """One optimiser step over ``batches`` (micro-batches whose gradients are accumulated,
    each weighing 1/len(batches)); under DDP the gradients are averaged over the ranks.

    So one rank stepping on ``[half0, half1]`` takes the same step as two ranks stepping on
    ``[half0]`` and ``[half1]`` (batch norm normalises each micro-batch on its own in both).
    Batches must be on the model's device. Returns the mean losses and the gradient norm
    (before clipping) as detached tensors on the device: no host sync here.
    """
    optimizer.zero_grad(set_to_none=True)
    n = len(batches)
    sums: dict[str, torch.Tensor] = {}
    for i, batch in enumerate(batches):
        sync = i == n - 1 or not isinstance(model, DistributedDataParallel)
        with contextlib.nullcontext() if sync else model.no_sync():  # type: ignore[operator]
            with _autocast(batch.planes.device, amp_dtype):
                out = model(batch.planes)
            losses = compute_losses(out, batch, loss_cfg)
            loss = losses["total"] / n
            (scaler.scale(loss) if scaler is not None else loss).backward()
        for key, value in losses.items():
            sums[key] = sums[key] + value.detach() if key in sums else value.detach()
    if scaler is not None:
        scaler.unscale_(optimizer)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    norm = torch.nn.utils.clip_grad_norm_(params, clip_grad_norm if clip_grad_norm > 0 else math.inf)
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
    stats = {key: value / n for key, value in sums.items()}
    stats["grad_norm"] = norm.detach()
    return stats


# --------------------------------------------------------------------------- the training loop


@dataclasses.dataclass(frozen=True)
class Launch:
    """What every rank needs to start (picklable: it crosses ``spawn``)."""

    run_dir: str
    config: dict
    kind: str  # "cpu" or "cuda"
    steps: int | None
    follow: bool
    progress: bool
    checkpoint: str | None
    # Spawned ranks: the port of the rendezvous store the learner holds open (rendezvous_store);
    # None under torchrun, whose environment names the rendezvous (env://)
    store_port: int | None = None
    device_ids: tuple[int, ...] = ()
    parent_pid: int | None = None
    report: bool = True  # metrics, TensorBoard and the progress bar (rank 0)
    # The learner's environment when it started its ranks: a rank forked from a forkserver would
    # otherwise have the forkserver's, from whenever that started.
    environ: dict | None = None


class StopVote:
    """Whether any rank was asked to stop, agreed by every rank at the same call: a MAX
    all-reduce of each rank's flag (every rank calls it at the same points of the loop).

    Unlagged (gloo on the CPU), each call answers with its own reduction. ``lagged`` (nccl on
    CUDA): reading a reduced flag at once would make the host wait, every step, for the step it
    has just queued, and the GPU would then idle while the host fetches the next batch and
    queues its kernels. So each call queues its flag's all-reduce behind the step, with a
    non-blocking copy of the result into pinned host memory, and answers with the previous
    call's result: the host waits at most for the step before, while this one is queued. Every
    rank reads the same reduced value at the same call, so all of them still stop after the
    same step, one step later than they would at once. ``now=True`` answers with this call's
    own reduction (the learner waiting for data asks so: no step is queued to hide the wait).
    """

    def __init__(self, device: torch.device, *, lagged: bool):
        self.lagged = lagged
        self.flag = torch.zeros(1, device=device)
        on_cuda = device.type == "cuda"
        self.host = torch.zeros(2, pin_memory=on_cuda)  # the results of the last two calls
        self.events = [torch.cuda.Event() for _ in range(2)] if on_cuda else None
        self.calls = 0

    def __call__(self, requested: bool, *, now: bool = False) -> bool:
        self.flag.fill_(1.0 if requested else 0.0)
        dist.all_reduce(self.flag, op=dist.ReduceOp.MAX)
        if not self.lagged:
            return bool(self.flag.item())
        slot = self.calls % 2
        self.calls += 1
        self.host[slot].copy_(self.flag[0], non_blocking=True)
        if self.events is not None:
            self.events[slot].record()
        if now:
            return self._read(slot)
        return self.calls > 1 and self._read(1 - slot)

    def _read(self, slot: int) -> bool:
        if self.events is not None:
            self.events[slot].synchronize()
        return bool(self.host[slot] > 0)


class Learner:
    """One rank's training loop (rank 0 also writes the run's files)."""

    def __init__(self, launch: Launch, rank: int, world: int, device: torch.device, log: Log):
        self.launch = launch
        self.run_dir = launch.run_dir
        self.cfg = from_dict(launch.config)
        self.rank, self.world, self.device = rank, world, device
        self.log = log if rank == 0 else _quiet
        self.rank_log = log  # a rank's own lines (its rate): every rank says them
        self.net_config = net_config(self.cfg)
        self.net = build_net(self.net_config, seed=self.cfg.train.seed).to(device)
        if launch.checkpoint is None and self.cfg.train.init_from:
            self._init_from()
        self.net.train()
        self.optimizer = make_optimizer(self.net, self.cfg.optimizer)
        amp = self.cfg.train.amp if device.type == "cuda" else "off"
        self.amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "off": None}[amp]
        self.scaler = torch.amp.GradScaler("cuda") if amp == "fp16" else None
        self.averager = WeightAverager.from_config(self.cfg.train)
        self.step = 0
        self.generation = 0
        self.checkpoint_step = 0
        sampler_state = None
        if launch.checkpoint is not None:
            sampler_state = self._load(launch.checkpoint)
        self.model: nn.Module = self.net
        self.loader = None
        self.val_batch = None
        if world > 1:
            self.model = DistributedDataParallel(
                self.net, device_ids=[device.index] if device.type == "cuda" else None,
                gradient_as_bucket_view=True)
        from trainer.loader import ReplaySampler
        from trainer.store import ReplayStore

        self.window = self.cfg.replay
        self.store = ReplayStore(self.run_dir, self.cfg.model.input_format)
        self.store.check_format()
        self.sampler = ReplaySampler(self.store, self.window, self.cfg.train.batch_size, seed=self.cfg.train.seed)
        if sampler_state is not None:
            self.sampler.load_state_dict(sampler_state)
        else:
            self._refresh()
        self.pending_steps = 0  # steps whose losses are summed in _sums, not yet logged
        self._sums = torch.zeros(5, device=device)
        self.reporter = TrainingReporter(self, launch) if rank == 0 and launch.report else None
        self._exit_at = _exit_hook(rank)
        self.stop_requested = threading.Event()  # set by SIGTERM/SIGINT (see run_rank)
        self.stopped = False  # the loop ended because a stop was asked for (not --steps, not out of data)
        self._waits = 0  # times this run waited for new data (--follow)
        self._rank_clock = time.perf_counter()  # this rank's own rate, between log lines (ranks > 0 say it)
        self._rank_waited = 0.0
        self._stop_vote = StopVote(device, lagged=device.type == "cuda") if world > 1 else None
        self.feed = DeviceFeed(device)

    def _should_stop(self, *, now: bool = False) -> bool:
        """Whether any rank was asked to stop; every rank calls it at the same points (after each
        step, at each look for data), so all of them stop after the same step (on CUDA, ranks
        agree one step later, so that the host never waits for the step it has just queued:
        :class:`StopVote`; ``now``: at once, as while waiting for data)."""
        if self._stop_vote is None:
            return self.stop_requested.is_set()
        return self._stop_vote(self.stop_requested.is_set(), now=now)

    # ---------------------------------------------------------------- checkpoints

    def _init_from(self) -> None:
        """A new run's network from ``train.init_from``: a checkpoint's weights as they are; an lc0
        file's or an ONNX export's (batch norm folded into the convolutions) with its batch norms
        calibrated on the run's held-out positions (else positions from random games), so that
        training mode starts from the function the file computes
        (:func:`trainer.lc0_import.calibrate_batch_norm`; eval mode's outputs do not change)."""
        from trainer.lc0_import import calibrate_batch_norm
        from trainer.network_files import has_folded_batch_norm

        path = init_from_path(self.cfg, self.run_dir)
        source, _ = read_init_network(path)
        if grown_config(source.config, self.cfg) != self.net_config:
            raise ValueError(f"train.init_from: {path} holds a {source.config.name} network unlike the run's "
                             f"[model] ({self.net_config.name}); the file changed since the run started?")
        start = Net(source.config, seed=None)
        start.load_state_dict(source.state_dict())
        calibrated = ""
        if has_folded_batch_norm(path):  # a cyzero checkpoint's batch norms have their statistics already
            planes = self._calibration_planes()
            calibrate_batch_norm(start, planes)
            calibrated = f" (batch norms calibrated on {len(planes)} positions)"
        grown = ""
        if start.config.blocks != self.net_config.blocks:
            start = deepen(start, self.net_config.blocks, seed=self.cfg.train.seed)
            grown = f", deepened to {self.net_config.name} by blocks that start as the identity"
        self.net.load_state_dict(start.state_dict())
        self.log(f"learner: step 0 starts from {path}{calibrated}{grown}")

    def _calibration_planes(self) -> np.ndarray:
        """Positions to calibrate a folded file's batch norms on: the run's held-out ones, else
        positions from random games."""
        if self.cfg.replay.validation_positions > 0:
            from trainer.loader import validation_batch
            from trainer.store import ReplayStore

            batch = validation_batch(ReplayStore(self.run_dir, self.cfg.model.input_format), self.cfg.replay,
                                     self.cfg.replay.validation_positions, seed=self.cfg.train.seed)
            if batch is not None and len(batch.planes):
                return batch.planes.numpy()
        from trainer.export import sample_positions

        planes, _ = sample_positions(512, seed=self.cfg.train.seed)
        return planes

    def _load(self, path: str) -> dict:
        data = read_learner_checkpoint(path, int(os.path.basename(path)[5:-3]))
        self.net.load_state_dict(data["model"])
        before = data["train_config"].get("optimizer", {}).get("kind")
        if before == self.cfg.optimizer.kind:
            self.optimizer.load_state_dict(data["optimizer"])
            apply_hyperparameters(self.optimizer, self.cfg.optimizer)  # the config's, not the checkpoint's
        else:
            self.log(f"learner: the optimizer changed from {before} to {self.cfg.optimizer.kind}: its state starts afresh")
        if self.scaler is not None and data.get("scaler"):
            self.scaler.load_state_dict(data["scaler"])
        if self.averager is not None and data.get("average"):
            self.averager.load_state_dict(data["average"], self.device)
        self.step = self.checkpoint_step = int(data["step"])
        self.generation = int(data["generation"])
        if self.step == 0:  # the run's start made generation 0 as the step-0 checkpoint: nothing is resumed
            self.log(f"learner: a new run: starting at step 0 from generation 0 ({path})")
        else:
            self.log(f"learner: resuming at step {self.step:,} (generation {self.generation}) from {path}")
        return data["sampler"]

    def _checkpoint_dict(self) -> dict:
        return {
            "format": CHECKPOINT_FORMAT,
            "step": self.step,
            "generation": self.generation,
            "time": time.time(),
            "config": self.net_config.to_dict(),  # what trainer.model.load_net and `export --checkpoint` read
            "train_config": self.cfg.to_dict(),
            "model": {k: v.detach().to("cpu") for k, v in self.net.state_dict().items()},
            "optimizer": _to_cpu(self.optimizer.state_dict()),
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "average": self.averager.state_dict() if self.averager is not None else None,
            "sampler": self.sampler.state_dict(),
        }

    def _write_checkpoint(self) -> str:
        path = checkpoint_path(self.run_dir, self.step)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        write_checkpoint(path, self._checkpoint_dict())
        for _, old in list_checkpoints(self.run_dir)[:-self.cfg.train.keep_checkpoints]:
            with contextlib.suppress(FileNotFoundError):
                os.remove(old)
        return path

    def _export_generation(self) -> None:
        """Export this step's network as ``self.generation`` and record it (rank 0).

        With weight averaging, both the raw and the averaged weights are scored on the
        validation batch; the one with the lower total loss is exported (the raw weights
        when there is no validation data to decide with)."""
        candidates: dict[str, Net] = {"raw": self.net}
        averaged = self.averager.averaged(self.net_config) if self.averager is not None else None
        if averaged is not None:
            candidates[self.averager.kind] = averaged.to(self.device)  # type: ignore[union-attr]
        scores: dict[str, dict[str, float]] = {}
        chosen = "raw"
        val = self.validation_batch()
        if val is not None:
            for name, net in candidates.items():
                scores[name] = evaluate(net, val, self.cfg.loss)
            chosen = min(scores, key=lambda name: scores[name]["total"])
        from trainer.export import export_onnx

        path = network_path(self.run_dir, self.generation)
        if val is not None:
            check = val.planes[:_EXPORT_CHECK_POSITIONS].numpy()
            masks = (val.policy[:_EXPORT_CHECK_POSITIONS] >= 0).numpy()
            report = export_onnx(candidates[chosen], path, "fp32", check_planes=check, check_masks=masks)
        else:
            report = export_onnx(candidates[chosen], path, "fp32", check_positions=_EXPORT_CHECK_POSITIONS)
        record = {
            "generation": self.generation,
            "step": self.step,
            "onnx": os.path.relpath(path, self.run_dir),
            "sha256": report.sha256,
            "time": time.time(),
            "weights": chosen,
            "val": scores.get(chosen, {}),
        }
        for name, score in scores.items():
            if name != chosen:
                record[f"val_{name}"] = score
        append_jsonl(os.path.join(self.run_dir, GENERATIONS_FILE), record)
        self.log(f"learner: step {self.step:,}: generation {self.generation} -> {record['onnx']} "
                 f"({chosen} weights{_fmt_val(scores.get(chosen))})")

    def _repair_generation(self) -> None:
        """After a resume: export the checkpoint's generation if the last run died before it did.

        Generation numbers are never reused: engines ignore a generation they have seen, so
        when generations.jsonl lists newer ones than the checkpoint (their checkpoints were
        damaged or deleted), the numbering continues after the newest."""
        recorded = {r.get("generation") for r in read_jsonl(os.path.join(self.run_dir, GENERATIONS_FILE))}
        newest = max((g for g in recorded if isinstance(g, int)), default=0)
        if newest > self.generation:
            self.log(f"learner: generations up to {newest} came from checkpoints after step {self.step:,} that "
                     f"are gone; the next generation is {newest + 1}")
            self.generation = newest
        elif self.generation >= 1 and self.generation not in recorded:
            self.log(f"learner: generation {self.generation} of step {self.step:,} was not exported; exporting it")
            self._export_generation()

    def _checkpoint(self) -> None:
        """A new data snapshot on every rank, then (rank 0) the checkpoint, which holds the new
        snapshot's cursor (so a resumed run samples what this one will), and its generation's export."""
        self.generation += 1
        if self.reporter is not None:  # status: this generation is on its way, not "at step N" still to come
            self.reporter.write_progress("exporting", force=True)
        self._refresh()
        self.val_batch = None
        if self.rank == 0:
            path = self._write_checkpoint()
            self.log(f"learner: step {self.step:,}: checkpoint {os.path.relpath(path, self.run_dir)}")
            self._export_generation()
            self._apply_retention()
            if self.reporter is not None:
                self.reporter.restart_clock()
        self.checkpoint_step = self.step

    def _stop_checkpoint(self) -> None:
        """A stop's checkpoint: what was trained since the last one is kept (rank 0 writes it, with the
        cursor as it stands, so the resumed run samples what this one would have), but no network is
        exported: a generation comes only every ``train.checkpoint_every`` steps (and at the end of a
        ``--steps`` or out-of-data run), however often the learner is stopped."""
        if self.rank == 0:
            path = self._write_checkpoint()
            every = self.cfg.train.checkpoint_every
            self.log(f"learner: step {self.step:,}: checkpoint {os.path.relpath(path, self.run_dir)} (a stop: no "
                     f"network exported; generation {self.generation + 1} comes at step "
                     f"{(self.step // every + 1) * every:,})")
        self.checkpoint_step = self.step

    def _apply_retention(self) -> None:
        """``replay.keep_positions`` and ``replay.keep_networks``: drop old chunks (never one inside
        the window just snapshotted) and old generations' networks."""
        keep = self.cfg.replay.keep_positions
        if keep:
            removed = self.store.prune(max(keep, self.sampler.window_positions),
                                       val_percent=self.cfg.replay.val_percent)
            if removed:
                self.log(f"learner: retention: pruned {len(removed)} chunks outside the newest "
                         f"{max(keep, self.sampler.window_positions):,} training positions")
        keep = self.cfg.replay.keep_networks
        if keep:
            folder = os.path.join(self.run_dir, NETWORK_DIR)
            for name in os.listdir(folder):
                match = re.fullmatch(r"gen-(\d+)\.onnx(?:\.sha256)?", name)
                if match and int(match.group(1)) <= self.generation - keep:
                    with contextlib.suppress(FileNotFoundError):
                        os.remove(os.path.join(folder, name))

    # ---------------------------------------------------------------- data

    def _refresh(self) -> None:
        """A new manifest snapshot, the same on every rank: rank 0 reads the manifest and the
        others take its first ``snapshot_records`` records (the daemon may append in between)."""
        if self.rank == 0:
            self.sampler.refresh()
        if self.world > 1:
            records = torch.tensor([self.sampler.snapshot_records], dtype=torch.int64, device=self.device)
            dist.broadcast(records, src=0)
            if self.rank != 0:
                self.sampler.refresh(int(records))

    def validation_batch(self):
        """The held-out sample validation scores on: fixed from one checkpoint to the next, so that
        the log lines between compare; while the store holds fewer held-out positions than
        ``replay.validation_positions`` (a young run), drawn again at each call as they grow."""
        wanted = self.cfg.replay.validation_positions
        if self.val_batch is not None and len(self.val_batch.planes) < wanted:
            self.val_batch = None
        if self.val_batch is None and wanted > 0:
            from trainer.loader import validation_batch

            self.val_batch = validation_batch(self.store, self.window, self.cfg.replay.validation_positions,
                                              seed=self.cfg.train.seed)
        return self.val_batch

    def _next_batch(self):
        """The rank's slice of the next global batch on the device, or None to stop (data starved)."""
        from trainer.loader import DataStarved, ReplayLoader

        if self.loader is None:  # it follows the sampler: a new snapshot restarts its workers
            self.loader = ReplayLoader(self.store, self.sampler, rank=self.rank, world=self.world,
                                       workers=self.cfg.replay.workers, prefetch=self.cfg.replay.prefetch,
                                       pin_memory=pinned_transfer(self.device),
                                       q_ratio=self.cfg.loss.value_q_ratio)
        waiting = False
        while True:
            try:
                batch = next(self.loader)
            except DataStarved as exc:  # every rank at the same batch: same snapshot, same cursor
                if not self.launch.follow:
                    self.log(f"learner: stopping at step {self.step:,}: {exc} (--follow waits for new data)")
                    return None
                if not waiting:
                    waiting = True
                    if self.reporter is not None:
                        self.reporter.waiting(True)
                    if self._waits == 0:  # with --follow (under the daemon) waiting for games is normal: said once
                        self.log(self._waiting_line())
                    self._waits += 1
                started = time.perf_counter()
                self.stop_requested.wait(self.cfg.train.starved_poll_s)
                self._rank_waited += time.perf_counter() - started
                if self.reporter is not None:
                    self.reporter.write_progress("waiting")  # status sees the learner alive while it waits
                if self._should_stop(now=True):
                    self.log(f"learner: asked to stop at step {self.step:,} while waiting for data")
                    self.stopped = True
                    return None
                self._refresh()
                continue
            if waiting:
                if self.reporter is not None:
                    self.reporter.waiting(False)
                if self._waits == 1:
                    self.log(f"learner: step {self.step:,}: new games came in, training goes on")
            return self.feed(batch)

    def _waiting_line(self) -> str:
        """The one line a --follow learner says the first time it waits for games."""
        sampler, cap = self.sampler, self.window.max_samples_per_position
        if sampler.training_positions == 0:
            why = "the replay store has no training positions yet"
        else:
            why = (f"the sampling cap: {sampler.samples_drawn:,} samples drawn, and replay.max_samples_per_position "
                   f"= {cap:g} x {sampler.training_positions:,} training positions allows "
                   f"{cap * sampler.training_positions:,.0f}")
        return (f"learner: step {self.step:,}: waiting for self-play games ({why}); training goes on as the "
                "workers add games. While self-play catches up this is normal, so it is said once: "
                "`cyzero-train status RUN` shows the learner's step and whether it waits")

    # ---------------------------------------------------------------- loop

    def run(self) -> int:
        if self.rank == 0:
            self._repair_generation()
        target = self.launch.steps
        if target is not None and self.step >= target:
            self.log(f"learner: already at step {self.step:,} (--steps {target:,}): nothing to do")
            return 0
        if self.reporter is not None:
            self.reporter.start(self.step, target)
        tc = self.cfg.train
        try:
            while target is None or self.step < target:
                batch = self._next_batch()
                if batch is None:
                    break
                set_lr(self.optimizer, lr_at(self.step, self.cfg.optimizer))
                stats = train_step(self.model, self.optimizer, [batch], self.cfg.loss,
                                   clip_grad_norm=tc.clip_grad_norm, scaler=self.scaler, amp_dtype=self.amp_dtype)
                self.step += 1
                if self.averager is not None:
                    self.averager.update(self.net, self.step)
                self._collect(stats)
                if self._exit_at is not None and self.step == self._exit_at[0]:
                    _die(self._exit_at[1])
                if self.step % self.cfg.log.interval == 0:
                    self._log_metrics()
                if self.step % tc.checkpoint_every == 0:
                    self._checkpoint()
                if self._should_stop():
                    self.log(f"learner: asked to stop at step {self.step:,}: writing a final checkpoint")
                    self.stopped = True
                    break
            if self.pending_steps:
                self._log_metrics()
            if self.step > self.checkpoint_step:
                if self.stopped:  # a stop keeps what was trained; generations follow train.checkpoint_every
                    self._stop_checkpoint()
                else:
                    self._checkpoint()
        finally:
            if self.loader is not None:
                self.loader.close()
            if self.reporter is not None:
                self.reporter.close()
        if self.world > 1:  # no rank tears the group down while rank 0 still writes and exports
            dist.barrier()
        self.log(f"learner: done at step {self.step:,}, generation {self.generation}")
        return 0

    def _collect(self, stats: dict[str, torch.Tensor]) -> None:
        keys = ("policy", "value", "moves_left", "total", "grad_norm")
        values = torch.stack([stats[k].float() for k in keys])
        self._sums = values if not self.pending_steps else self._sums + values
        self.pending_steps += 1
        if self.reporter is not None:
            self.reporter.tick(self.cfg.train.batch_size)

    def _log_metrics(self) -> None:
        """All-reduce the interval's mean losses; rank 0 adds validation and writes them."""
        sums = self._sums / self.pending_steps
        if self.world > 1:
            dist.all_reduce(sums)
            sums /= self.world
        values = dict(zip(("policy", "value", "moves_left", "total", "grad_norm"), sums.tolist()))
        steps, self.pending_steps = self.pending_steps, 0
        if self.reporter is not None:
            self.reporter.metrics(values, steps)
        if self.rank != 0:  # rank 0 writes the run's rate; under torchrun a node's log shows its own ranks
            now = time.perf_counter()
            busy = max(now - self._rank_clock - self._rank_waited, 1e-9)
            share = self.cfg.train.batch_size // self.world
            self.rank_log(f"learner: rank {self.rank} of {self.world} on {self.device} ({socket.gethostname()}): step "
                     f"{self.step:,}, {steps * share / busy:,.0f} samples/s of its slice ({share} a step)")
        self._rank_clock, self._rank_waited = time.perf_counter(), 0.0


def _to_cpu(value):
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu")
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to_cpu(v) for v in value)
    return value


def _fmt_val(score: dict | None) -> str:
    if not score:
        return ""
    return ", val " + " ".join(f"{k} {v:.4g}" for k, v in score.items())


def _exit_hook(rank: int) -> tuple[int, str] | None:
    """(step, how) at which this rank is to die, from :data:`EXIT_HOOK_ENV` ("RANK:STEP" exits
    with code 3; "RANK:STEP:kill" and "RANK:STEP:abort" end it by SIGKILL and by a native abort)."""
    spec = os.environ.get(EXIT_HOOK_ENV, "")
    match = re.fullmatch(r"(\d+):(\d+)(?::(kill|abort))?", spec.strip())
    if match and int(match.group(1)) == rank:
        return int(match.group(2)), match.group(3) or "exit"
    return None


def _die(how: str) -> None:
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if how == "abort":
        os.abort()
    os._exit(3)


# --------------------------------------------------------------------------- a rank


def run_rank(rank: int, world: int, local: int, launch: Launch, log: Log,
             stop_signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT), end_process: bool = False) -> int:
    """Train as rank ``rank`` of ``world``; the exit code. ``end_process``: the process is this
    rank's alone (spawned, or made by torchrun), and it ends here once the work is done
    (:func:`end_rank_process`)."""
    cfg = from_dict(launch.config)
    if launch.kind == "cuda":
        device = torch.device("cuda", launch.device_ids[local] if launch.device_ids else local)
        configure_device(device)
    else:
        device = torch.device("cpu")
        if world > 1:  # the ranks share the cores (or OMP_NUM_THREADS, torch's default, if set)
            torch.set_num_threads(max(1, torch.get_num_threads() // world))
    if world > 1:
        backend = "nccl" if launch.kind == "cuda" else "gloo"
        if launch.store_port is not None:
            join_group(backend, rank, world, launch.store_port, cfg.train.dist_timeout_s)
        else:
            dist.init_process_group(backend, init_method="env://", rank=rank, world_size=world,
                                    timeout=datetime.timedelta(seconds=cfg.train.dist_timeout_s))
        # every rank says so, not only rank 0 (which alone logs the training): under torchrun a
        # node's log otherwise shows nothing of its ranks
        log(f"learner: rank {rank} of {world} joined the {backend} group on {device} "
            f"({socket.gethostname()}, pid {os.getpid()})")
    try:
        learner = Learner(launch, rank, world, device, log)
        with stop_on_signals(learner.stop_requested, stop_signals):
            code = learner.run()
    finally:
        if world > 1:
            dist.destroy_process_group()
    if end_process:
        end_rank_process(code)
    return code


def _write_generation_zero(run_dir: str, config: TrainConfig, log: Log) -> str:
    """The step-0 checkpoint and generation 0 of a new run: the config's fresh network, or the
    one ``train.init_from`` names. Returns the checkpoint's path (the caller holds the run's lock)."""
    launch = Launch(run_dir=run_dir, config=config.to_dict(), kind="cpu", steps=0, follow=False,
                    progress=False, checkpoint=None, report=False)
    learner = Learner(launch, 0, 1, torch.device("cpu"), log)
    path = learner._write_checkpoint()
    learner._export_generation()
    return path


def initialize_run(run_dir: str | os.PathLike, *, config_path: str | os.PathLike | None = None,
                   config: TrainConfig | None = None, log: Log | None = None) -> dict:
    """Generation 0 for a run that has none: the config's freshly initialised network, as the
    step-0 checkpoint (where the learner starts) and ``networks/gen-00000.onnx``, so self-play has
    a network to play before the first training step. Returns the newest generation's record;
    a run with a checkpoint or a generation is left as it is. ``config``: this config instead of
    ``config_path``'s or the run's (the daemon's). ValueError: a bad config, or a learner running
    on the run."""
    log = log or _stderr
    run_dir = os.path.abspath(os.fspath(run_dir))
    os.makedirs(run_dir, exist_ok=True)
    with run_lock(run_dir, LEARNER_LOCK):
        config, checkpoint = prepare_run(run_dir, config_path, 1, True, log, config)
        newest = newest_generation(run_dir)
        if checkpoint is None and newest is None:
            _write_generation_zero(run_dir, config, log)
            newest = newest_generation(run_dir)
    if newest is None:
        raise ValueError(f"{run_dir} has a checkpoint but no exported network yet: run `cyzero-train learn` "
                         "on it, or start a new run directory")
    return newest


def learn(
    run_dir: str | os.PathLike,
    *,
    devices: str = "cpu:1",
    steps: int | None = None,
    config_path: str | os.PathLike | None = None,
    follow: bool = False,
    progress: bool = True,
    log: Log | None = None,
    init_from: str | os.PathLike | None = None,
) -> int:
    """Train the run in ``run_dir``; returns the exit code (0: done or out of data).

    ``devices``: ``cpu:N`` or ``cuda:0,1,...`` (see :func:`trainer.devices.learner_devices`); ignored but for its
    kind under torchrun. ``steps``: the step to stop at, counted from the run's start (None:
    until the data runs out, or forever with ``follow``). ``config_path``: a TOML config
    (default RUN/config.toml, else the defaults). ``follow``: wait for new data when the
    sampling cap is reached instead of stopping. ``log``: where one-line messages go (default
    stderr; spawned ranks send theirs to this process, except while a progress bar is on the
    console, which rank 0 then writes above the bar itself). ``init_from``: a new run starts
    from this network (an lc0 weights file, one of cyzero's fp32 ONNX exports or a cyzero
    checkpoint; ``train.init_from``), which becomes the step-0 checkpoint and generation 0
    (under torchrun every rank loads it instead); a run that has a checkpoint resumes from it and
    ignores ``init_from``.
    """
    log = log or _stderr
    run_dir = os.path.abspath(os.fspath(run_dir))
    if steps is not None and steps < 1:
        log("learner: error: --steps must be at least 1")
        return 2
    torchrun = all(k in os.environ for k in _TORCHRUN_ENV)
    with contextlib.ExitStack() as stack:
        try:
            if torchrun:  # torchrun made the processes: --devices only says cpu or cuda
                parsed = Devices("cuda" if devices.strip().lower().startswith("cuda") else "cpu", ())
                rank, world, local = (int(os.environ[k]) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))
            else:
                parsed = learner_devices(devices)
                rank, world, local = 0, parsed.world, 0
            if config_path is not None:
                load_config(named_config_path(config_path))  # a bad --config creates nothing
            os.makedirs(run_dir, exist_ok=True)
            if rank == 0:
                stack.enter_context(run_lock(run_dir, LEARNER_LOCK))
            config, checkpoint = prepare_run(run_dir, config_path, world, rank == 0, log,
                                          init_from=os.fspath(init_from) if init_from else None)
            if checkpoint is None and config.train.init_from and not torchrun and newest_generation(run_dir) is None:
                checkpoint = _write_generation_zero(run_dir, config, log)  # the ranks resume from it
        except (ValueError, OSError) as exc:
            log(f"learner: error: {exc}")
            return 2
        launch = Launch(run_dir=run_dir, config=config.to_dict(), kind=parsed.kind, steps=steps,
                        follow=follow, progress=progress, checkpoint=checkpoint, device_ids=parsed.ids)
        if torchrun:
            return run_rank(rank, world, local, launch, log, end_process=world > 1)
        if world == 1:
            return run_rank(0, 1, 0, launch, log)
        store = rendezvous_store(world, config.train.dist_timeout_s)  # held until this function returns
        launch = dataclasses.replace(launch, store_port=store.port, parent_pid=os.getpid(), environ=dict(os.environ))
        return run_ranks(run_rank, world, parsed.kind, launch, log)
