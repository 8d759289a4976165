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
(:func:`compute_losses`). Every ``checkpoint_every`` steps and at the end, every rank takes
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
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import datetime
import faulthandler
import json
import math
import os
import re
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from trainer.atomic import append_jsonl, atomic_write_text, read_jsonl
from trainer.checkpoints import CHECKPOINT_FORMAT, read_learner_checkpoint, write_checkpoint
from trainer.config import (
    LossConfig, ModelConfig, OptimizerConfig, TrainConfig, TrainingConfig, from_dict, load_config, model_differences,
    named_config_path, to_toml,
)
from trainer.devices import Devices, learner_devices
from trainer.lifeline import end_with
from trainer.model import Net, NetConfig, NetOutput, build_net, deepen
from trainer.rundir import (
    CONFIG_FILE, EFFECTIVE_CONFIG_FILE, GENERATIONS_FILE, LEARNER_LOCK, METRICS_FILE, NETWORK_DIR, PROGRESS_FILE,
    TENSORBOARD_DIR, checkpoint_path, list_checkpoints, network_path, resolve_config, run_lock,
)
from trainer.stop_signals import StopSignals, on_signals, stop_on_signals

__all__: Sequence[str] = [
    "learn", "net_config", "model_section", "compute_losses", "policy_cross_entropy", "train_step", "evaluate",
    "lr_at", "make_optimizer", "WeightAverager", "load_newest_checkpoint", "initialize_run", "newest_generation",
    "configure_device", "pinned_transfer", "DeviceFeed", "rendezvous_store", "join_group",
]

PROGRESS_EVERY_S = 2.0  # rank 0 rewrites RUN/learner.json (rundir.PROGRESS_FILE), for ``status``, this often
RATE_WINDOW_S = 60.0  # learner.json's samples/s: the last minute of training (waits left out)
#: Fault injection for the tests: "RANK:STEP" makes that rank exit with code 3 right after that
#: step, "RANK:STEP:kill" makes it SIGKILL itself there (no cleanup of any kind), and
#: "RANK:STEP:abort" makes it abort as a native crash would.
EXIT_HOOK_ENV = "CYZERO_LEARNER_TEST_EXIT"
_TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
_EXPORT_CHECK_POSITIONS = 64

Log = Callable[[str], Any]


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _quiet(line: str) -> None:
    pass


def net_config(config: TrainConfig) -> NetConfig:
    """The :class:`NetConfig` the ``[model]`` section describes."""
    m = config.model
    family = {key: value for key, value in (("activation", m.activation), ("mlh_activation", m.mlh_activation))
              if value}  # empty: the family's own (NetConfig.from_name)
    if m.input_format != 1:
        family["input_format"] = m.input_format
    if m.net.strip().lower().startswith("bt-"):  # the attention body's sizes (0: derived from the embedding)
        family.update({key: getattr(m, key) for key in _BODY_KEYS})
    return NetConfig.from_name(
        m.net, se_ratio=m.se_ratio, policy_head=m.policy_head, moves_left=m.moves_left, se=m.se,
        policy_channels=m.policy_channels, value_channels=m.value_channels,
        value_hidden=m.value_hidden, mlh_channels=m.mlh_channels, mlh_hidden=m.mlh_hidden, **family)


#: The [model] keys of an attention body beside the name's embedding, layers and heads.
_BODY_KEYS = ("ffn_hidden", "ffn_activation", "smolgen", "smolgen_channels", "smolgen_hidden", "smolgen_gen",
              "pe_channels", "policy_embedding", "policy_d_model")


def model_section(config: NetConfig) -> dict[str, Any]:
    """The ``[model]`` keys that describe ``config`` (:func:`net_config` reads them back)."""
    section = {"net": config.name, "se_ratio": config.se_ratio, "policy_head": config.policy_head,
               "moves_left": config.moves_left, "se": config.se, "activation": config.activation,
               "policy_channels": config.policy_channels, "value_channels": config.value_channels,
               "value_hidden": config.value_hidden, "mlh_channels": config.mlh_channels,
               "mlh_hidden": config.mlh_hidden, "mlh_activation": config.mlh_activation,
               "input_format": config.input_format}
    if config.body == "attention":
        section.update({key: getattr(config, key) for key in _BODY_KEYS})
    return section


# --------------------------------------------------------------------------- init-from


def init_from_path(config: TrainConfig, run_dir: str | os.PathLike) -> str:
    """``train.init_from`` as a path: ``~`` expanded, a relative one taken from the run directory."""
    path = os.path.expanduser(config.train.init_from)
    return os.path.abspath(path if os.path.isabs(path) else os.path.join(os.fspath(run_dir), path))


_INIT_NETWORKS: dict[tuple, tuple[Net, str]] = {}


def _read_init_network(path: str) -> tuple[Net, str]:
    """:func:`trainer.lc0_import.read_network` of ``path`` (remembered for the file as it is, so
    the start's checks and the learner that loads it read it once)."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise ValueError(f"train.init_from: cannot read {path}: {exc.strerror or exc}") from None
    key = (path, st.st_mtime_ns, st.st_size)
    if key not in _INIT_NETWORKS:
        from trainer.lc0_import import read_network

        try:
            found = read_network(path)
        except ValueError as exc:
            raise ValueError(f"train.init_from: {exc}") from None
        _INIT_NETWORKS.clear()
        _INIT_NETWORKS[key] = found
    return _INIT_NETWORKS[key]


def _grown_config(source: NetConfig, config: TrainConfig) -> NetConfig:
    """The shape a run from ``source`` trains: the file's, with ``train.init_blocks`` blocks when set."""
    blocks = config.train.init_blocks
    if not blocks or blocks == source.blocks:
        return source
    if blocks < source.blocks or source.activation != "relu":
        raise ValueError(f"train.init_blocks = {blocks}: the file's {source.name} network can only grow, and only "
                         f"with ReLU activations (it has {source.blocks} blocks, {source.activation})")
    return dataclasses.replace(source, blocks=blocks)


def _apply_init_from(run_dir: str, config: TrainConfig, log: Log) -> TrainConfig:
    """A new run with ``train.init_from``: ``config`` with the file's network shape as its ``[model]``."""
    path = init_from_path(config, run_dir)
    net, description = _read_init_network(path)
    model = model_section(_grown_config(net.config, config))
    before = config.model
    changed = [f"{key} {json.dumps(getattr(before, key))} -> {json.dumps(value)}" for key, value in model.items()
               if getattr(before, key) != value]
    log(f"learner: a new run from {description}; the network's shape comes from the file, not from the "
        f"config's [model]" + (f" ({', '.join(changed)})" if changed else " (the same shape)"))
    return config.replace(model=model)


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


# --------------------------------------------------------------------------- losses


def policy_cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Per-position cross-entropy of the policy against ``target`` over the legal moves only.

    ``target`` holds lc0's -1 on illegal moves: their logits become -inf before the
    log-softmax (so the softmax spreads over legal moves alone, as the search does) and
    they add nothing to the loss. A row with no legal entry (never written by our
    records) contributes 0 rather than NaN.
    """
    legal = target >= 0
    legal = legal | ~legal.any(dim=1, keepdim=True)
    logp = torch.log_softmax(logits.float().masked_fill(~legal, float("-inf")), dim=1)
    return -(target.clamp(min=0) * logp.masked_fill(~legal, 0.0)).sum(dim=1)


def compute_losses(out: NetOutput, batch, cfg: LossConfig) -> dict[str, torch.Tensor]:
    """lc0's training loss, averaged over the batch: ``{"policy", "value", "moves_left", "total"}``.

    * policy: cross-entropy against the visit distribution over legal moves
      (:func:`policy_cross_entropy`);
    * value: cross-entropy of the WDL head against the game result (win, draw, loss);
    * moves left: Huber loss on plies left, prediction and target divided by
      ``moves_left_scale`` (20 plies, lc0's scale, so the loss is of the other heads'
      order) with delta ``huber_delta / moves_left_scale`` (lc0: 10 plies);
    * total: the weighted sum. L2 is the optimiser's weight decay, not a loss term.
    """
    policy = policy_cross_entropy(out.policy, batch.policy).mean()
    value = -(batch.wdl * torch.log_softmax(out.wdl.float(), dim=1)).sum(dim=1).mean()
    if out.mlh is not None:
        scale = cfg.moves_left_scale
        moves_left = F.huber_loss(out.mlh.float().squeeze(1) / scale, batch.plies_left.float() / scale,
                                  delta=cfg.huber_delta / scale)
    else:
        moves_left = torch.zeros((), device=policy.device)
    total = cfg.policy * policy + cfg.value * value + cfg.moves_left * moves_left
    return {"policy": policy, "value": value, "moves_left": moves_left, "total": total}


# --------------------------------------------------------------------------- optimiser


def make_optimizer(model: nn.Module, cfg: OptimizerConfig) -> torch.optim.Optimizer:
    """SGD (Nesterov) or AdamW; weight decay only on conv and linear weights (lc0's L2 term):
    the first param group holds those, the second the batch-norm and layer-norm parameters, the
    biases and an attention body's input gates (a gain around 1 and a shift, not weights)."""
    decay: list[nn.Parameter] = []
    plain: list[nn.Parameter] = []
    for name, param in model.named_parameters():
        (decay if param.dim() > 1 and not name.endswith("_gate") else plain).append(param)
    groups = [{"params": decay}, {"params": plain}]
    if cfg.kind == "sgd":
        optimizer: torch.optim.Optimizer = torch.optim.SGD(groups, lr=cfg.lr)
    else:
        optimizer = torch.optim.AdamW(groups, lr=cfg.lr)
    _apply_hyperparameters(optimizer, cfg)
    return optimizer


def _apply_hyperparameters(optimizer: torch.optim.Optimizer, cfg: OptimizerConfig) -> None:
    """Set the config's momentum, betas and weight decay on every param group (also after a
    checkpoint's state was loaded, which brings back the values it was saved with)."""
    for i, group in enumerate(optimizer.param_groups):
        group["weight_decay"] = cfg.weight_decay if i == 0 else 0.0
        if cfg.kind == "sgd":
            group["momentum"] = cfg.momentum
            group["nesterov"] = cfg.nesterov and cfg.momentum > 0
        else:
            group["betas"] = (cfg.momentum, cfg.beta2)


def lr_at(step: int, cfg: OptimizerConfig) -> float:
    """The learning rate of step ``step`` (0 for the first): linear warm-up, then the schedule."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    if cfg.schedule == "cosine":
        t = min(step - cfg.warmup_steps, cfg.decay_steps) / cfg.decay_steps
        return cfg.min_lr + (cfg.lr - cfg.min_lr) * 0.5 * (1.0 + math.cos(math.pi * t))
    if cfg.schedule == "step":
        return cfg.lr * cfg.gamma ** sum(1 for m in cfg.milestones if step >= m)
    return cfg.lr


def _set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


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


@torch.no_grad()
def evaluate(net: Net, batch, loss_cfg: LossConfig, *, chunk: int = 256) -> dict[str, float]:
    """Held-out metrics of ``net`` (eval mode) on ``batch``: policy top-1 agreement with the
    target's most likely move, policy and value cross-entropy, moves-left loss, weighted total."""
    was_training = net.training
    net.eval()
    device = next(net.parameters()).device
    n = len(batch.planes)
    sums = {"policy_ce": 0.0, "value_ce": 0.0, "moves_left": 0.0, "total": 0.0, "policy_top1": 0.0}
    try:
        for start in range(0, n, chunk):
            part = type(batch)(*(t[start:start + chunk].to(device) for t in batch))
            out = net(part.planes)
            losses = compute_losses(out, part, loss_cfg)
            k = len(part.planes)
            legal = part.policy >= 0
            guess = out.policy.float().masked_fill(~legal, float("-inf")).argmax(dim=1)
            sums["policy_top1"] += float((guess == part.policy.argmax(dim=1)).float().sum())
            sums["policy_ce"] += float(losses["policy"]) * k
            sums["value_ce"] += float(losses["value"]) * k
            sums["moves_left"] += float(losses["moves_left"]) * k
            sums["total"] += float(losses["total"]) * k
    finally:
        net.train(was_training)
    result = {key: value / n for key, value in sums.items()}
    if not net.has_mlh:
        del result["moves_left"]
    return result


# --------------------------------------------------------------------------- weight averaging


class WeightAverager:
    """EMA or lc0-style SWA of a network's weights and batch-norm statistics.

    * ``ema``: after every step ``avg += (w - avg) * (1 - d)`` with
      ``d = min(decay, (1 + n) / (10 + n))`` (n updates so far), so the first steps are not
      dominated by the random initialisation;
    * ``swa``: every ``every`` steps ``avg += (w - avg) / (n + 1)`` and ``n = min(n + 1, max_n)``:
      lc0's running average, in which a new snapshot weighs at least ``1 / max_n``.

    Integer buffers (batch norm's ``num_batches_tracked``) are copied.
    """

    def __init__(self, kind: str, *, decay: float = 0.999, every: int = 1, max_n: int = 10):
        if kind not in ("ema", "swa"):
            raise ValueError(f"weight averaging must be ema or swa, got {kind!r}")
        self.kind = kind
        self.decay = decay
        self.every = every
        self.max_n = max_n
        self.count = 0
        self.weights: dict[str, torch.Tensor] | None = None

    @classmethod
    def from_config(cls, cfg: TrainingConfig) -> "WeightAverager | None":
        if cfg.average == "none":
            return None
        if cfg.average == "ema":
            return cls("ema", decay=cfg.ema_decay)
        return cls("swa", every=cfg.swa_every, max_n=cfg.swa_max_n)

    def update(self, net: nn.Module, step: int) -> None:
        """Fold in ``net``'s current weights after step number ``step`` (1 for the first)."""
        if self.kind == "swa" and step % self.every:
            return
        state = net.state_dict()
        if self.weights is None:
            self.weights = {k: v.detach().clone() for k, v in state.items()}
            self.count = 1
            return
        floats = [k for k, v in state.items() if v.is_floating_point()]
        if self.kind == "ema":
            weight = 1.0 - min(self.decay, (1 + self.count) / (10 + self.count))
            self.count += 1
        else:
            weight = 1.0 / (self.count + 1)
            self.count = min(self.count + 1, self.max_n)
        torch._foreach_lerp_([self.weights[k] for k in floats], [state[k].detach() for k in floats], weight)
        for key, value in state.items():
            if not value.is_floating_point():
                self.weights[key].copy_(value)

    def averaged(self, config: NetConfig) -> Net | None:
        """A CPU :class:`Net` with the averaged weights, in eval mode (None before the first update)."""
        if self.weights is None:
            return None
        net = Net(config, seed=None)
        net.load_state_dict({k: v.detach().to("cpu") for k, v in self.weights.items()})
        return net.eval()

    def state_dict(self) -> dict:
        weights = None if self.weights is None else {k: v.detach().to("cpu") for k, v in self.weights.items()}
        return {"kind": self.kind, "count": self.count, "weights": weights}

    def load_state_dict(self, state: dict, device: torch.device) -> None:
        if state.get("kind") != self.kind:
            return  # the config switched between ema and swa: start the new average afresh
        self.count = int(state["count"])
        weights = state.get("weights")
        self.weights = None if weights is None else {k: v.to(device) for k, v in weights.items()}


# --------------------------------------------------------------------------- run files


def load_newest_checkpoint(run_dir: str | os.PathLike, log: Log = _stderr) -> tuple[dict, str] | None:
    """The newest checkpoint that loads, and its path; a damaged one is skipped with a log line."""
    for step, path in reversed(list_checkpoints(run_dir)):
        try:
            return read_learner_checkpoint(path, step), path
        except ValueError as exc:
            log(f"learner: skipping damaged checkpoint: {exc}")
    return None


# --------------------------------------------------------------------------- the training loop


@dataclasses.dataclass(frozen=True)
class _Launch:
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


class _StopVote:
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


class _Learner:
    """One rank's training loop (rank 0 also writes the run's files)."""

    def __init__(self, launch: _Launch, rank: int, world: int, device: torch.device, log: Log):
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
        self._pending = 0  # steps whose losses are summed in _sums, not yet logged
        self._sums = torch.zeros(5, device=device)
        self.reporter = _Reporter(self, launch) if rank == 0 and launch.report else None
        self._exit_at = _exit_hook(rank)
        self.stop_requested = threading.Event()  # set by SIGTERM/SIGINT (see _run_rank)
        self.stopped = False  # the loop ended because a stop was asked for (not --steps, not out of data)
        self._waits = 0  # times this run waited for new data (--follow)
        self._rank_clock = time.perf_counter()  # this rank's own rate, between log lines (ranks > 0 say it)
        self._rank_waited = 0.0
        self._stop_vote = _StopVote(device, lagged=device.type == "cuda") if world > 1 else None
        self.feed = DeviceFeed(device)

    def _should_stop(self, *, now: bool = False) -> bool:
        """Whether any rank was asked to stop; every rank calls it at the same points (after each
        step, at each look for data), so all of them stop after the same step (on CUDA, ranks
        agree one step later, so that the host never waits for the step it has just queued:
        :class:`_StopVote`; ``now``: at once, as while waiting for data)."""
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
        from trainer.lc0_import import calibrate_batch_norm, has_folded_batch_norm

        path = init_from_path(self.cfg, self.run_dir)
        source, _ = _read_init_network(path)
        if _grown_config(source.config, self.cfg) != self.net_config:
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
            _apply_hyperparameters(self.optimizer, self.cfg.optimizer)  # the config's, not the checkpoint's
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
        val = self._validation_batch()
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

    def _validation_batch(self):
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
                _set_lr(self.optimizer, lr_at(self.step, self.cfg.optimizer))
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
            if self._pending:
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
        self._sums = values if not self._pending else self._sums + values
        self._pending += 1
        if self.reporter is not None:
            self.reporter.tick(self.cfg.train.batch_size)

    def _log_metrics(self) -> None:
        """All-reduce the interval's mean losses; rank 0 adds validation and writes them."""
        sums = self._sums / self._pending
        if self.world > 1:
            dist.all_reduce(sums)
            sums /= self.world
        values = dict(zip(("policy", "value", "moves_left", "total", "grad_norm"), sums.tolist()))
        steps, self._pending = self._pending, 0
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


class _Reporter:
    """Rank 0's reporting: metrics.jsonl, TensorBoard, the progress bar, console lines, and
    RUN/learner.json (:data:`PROGRESS_FILE`: where the learner is now, for ``cyzero-train status``)."""

    def __init__(self, learner: _Learner, launch: _Launch):
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
        self._steps_before = self.learner._pending
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
        val = learner._validation_batch()
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


# --------------------------------------------------------------------------- processes


def rendezvous_store(world: int, timeout_s: float = 60.0) -> dist.TCPStore:
    """The store that spawned ranks meet at (:func:`join_group`), held by their parent on a port
    the system picked, and bound while the ranks live. A port found free and named to the ranks
    to bind later was a race: any process could take it in between (the suite runs many learners
    at once), and a rank could then meet another run's ranks. The parent binds the socket itself,
    on loopback: a store left to bind its own listens on every interface."""
    listener = socket.socket()
    try:
        listener.bind(("127.0.0.1", 0))
        listener.listen(128)
        store = dist.TCPStore("127.0.0.1", listener.getsockname()[1], world, is_master=True, wait_for_workers=False,
                              timeout=datetime.timedelta(seconds=timeout_s), master_listen_fd=listener.fileno())
    except BaseException:
        listener.close()
        raise
    listener.detach()  # the store owns the descriptor now, and closes it
    return store


def join_group(backend: str, rank: int, world: int, store_port: int, timeout_s: float = 60.0) -> None:
    """Rank ``rank`` joins the process group at the parent's :func:`rendezvous_store`."""
    timeout = datetime.timedelta(seconds=timeout_s)
    store = dist.TCPStore("127.0.0.1", store_port, world, is_master=False, timeout=timeout)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)


#: What a CPU rank imports before it can train (torch, and the torch._dynamo its optimizer pulls
#: in), done once in the forkserver its ranks are forked from rather than again in each rank:
#: about 5 s of CPU a rank on a small machine.
_FORKSERVER_PRELOAD = ["torch", "torch._dynamo", "torch.distributed", "trainer.learner"]


def _start_method(kind: str) -> str:
    """``forkserver`` for CPU ranks (forked from a process that has imported torch but never ran
    anything: no CUDA, and no thread but numpy's idle OpenBLAS pool), ``spawn`` for CUDA ranks,
    as torch recommends."""
    import multiprocessing

    if kind == "cuda" or "forkserver" not in multiprocessing.get_all_start_methods():
        return "spawn"
    multiprocessing.set_forkserver_preload(_FORKSERVER_PRELOAD)
    _start_forkserver_deaf_to_sigterm()
    return "forkserver"


def _start_forkserver_deaf_to_sigterm() -> None:
    """Start the forkserver with SIGTERM ignored (it ignores SIGINT itself). `timeout` and
    systemd signal the whole process group: a forkserver killed by that left the learner
    unable to read its ranks' exit codes ("rank 0 exited with code 255"), and it stopped the
    ranks before their final checkpoint. Each rank takes SIGTERM back (:func:`_spawned`).
    Outside the main thread no handler can be set: the ranks' start then starts it as it is."""
    from multiprocessing import forkserver

    if threading.current_thread() is not threading.main_thread():
        return
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        forkserver.ensure_running()
    finally:
        signal.signal(signal.SIGTERM, previous)


def _run_rank(rank: int, world: int, local: int, launch: _Launch, log: Log,
              stop_signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT), end_process: bool = False) -> int:
    """Train as rank ``rank`` of ``world``; the exit code. ``end_process``: the process is this
    rank's alone (spawned, or made by torchrun), and it ends here once the work is done
    (:func:`_end_rank_process`)."""
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
        learner = _Learner(launch, rank, world, device, log)
        with stop_on_signals(learner.stop_requested, stop_signals):
            code = learner.run()
    finally:
        if world > 1:
            dist.destroy_process_group()
    if end_process:
        _end_rank_process(code)
    return code


def _end_rank_process(code: int) -> None:
    """End a finished rank's process now, its learner (the DDP model, and the process group the
    model holds) still referenced, so that no teardown of either runs in Python.

    Freeing them deadlocked a finished rank (tests/test_learner.py, once in a few runs of the
    rank-dies test): the main thread, holding the GIL, freed the model, and gloo's destructor
    joined its work threads while one of them, freeing the final barrier's earlier all-reduce,
    waited for the GIL to free a gradient's Python object. The interpreter's own teardown has
    aborted a finished rank the same way ("terminate called without an active exception",
    SIGABRT). Its checkpoint is written and its log lines are in the pipe (a SimpleQueue writes
    as it puts)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code or 0)


def _spawned(local: int, world: int, launch: _Launch, lines) -> None:
    """``spawn``'s entry: rank ``local`` of ``world``; its log lines go to the parent through
    ``lines`` (a queue); a non-zero return becomes the exit code. A rank that dies by a signal
    (a native abort or crash) dumps every thread's Python stack to stderr first, so the parent's
    one-line failure has a stack beside it to say where."""
    faulthandler.enable(all_threads=True)
    if launch.environ is not None:
        os.environ.clear()
        os.environ.update(launch.environ)
    if launch.parent_pid is not None:
        # the learner, not getppid(): a CPU rank's parent is the forkserver, which outlives the
        # learner while its ranks live
        end_with(launch.parent_pid)
    # The parent passes SIGINT and SIGTERM on as one SIGTERM (a Ctrl-C reaches every process);
    # the forkserver's ignored SIGTERM (_start_forkserver_deaf_to_sigterm) is not the rank's.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _run_rank(local, world, local, launch, lines.put, stop_signals=(signal.SIGTERM,), end_process=True)


@contextlib.contextmanager
def _forward_stop(processes: Sequence):
    """The spawning parent's SIGTERM or SIGINT becomes one SIGTERM to each rank (which stop
    together after a step, with a checkpoint); a second signal (:class:`~trainer.stop_signals.StopSignals`)
    interrupts the parent, whose ``spawn`` context then kills the ranks."""
    signals_seen = StopSignals()

    def handler(signum: int) -> None:
        if not signals_seen.is_first():
            return
        for process in processes:
            if process.is_alive():
                with contextlib.suppress(OSError):
                    os.kill(process.pid, signal.SIGTERM)

    with on_signals(handler):
        yield


def _forward(lines, log: Log) -> None:
    """The parent's end of the ranks' log queue (None ends it)."""
    while (line := lines.get()) is not None:
        log(line)


def _write_run_config(run_dir: str, config: TrainConfig, config_path: str | os.PathLike | None, log: Log) -> None:
    """RUN/config.toml, the user's file, is written only when the run has none (every key with its
    meaning) and never rewritten, so the user's edits and comments stay; the config in use goes to
    RUN/config.effective.toml (atomically, every key), which ``status`` and the daemon's learner read."""
    run_file = os.path.join(run_dir, CONFIG_FILE)
    effective_file = os.path.join(run_dir, EFFECTIVE_CONFIG_FILE)
    text = to_toml(config)
    if not os.path.exists(run_file):
        atomic_write_text(run_file, text)
    elif config_path is not None:
        source = os.path.abspath(named_config_path(config_path))
        if source not in (os.path.abspath(run_file), os.path.abspath(effective_file)) \
                and _config_or_none(run_file) != config:
            log(f"learner: {run_file} is left as you wrote it; this start uses {config_path} "
                f"(every key in {EFFECTIVE_CONFIG_FILE})")
    try:
        with open(effective_file, encoding="utf-8") as f:
            old = f.read()
    except FileNotFoundError:
        old = None
    if old != text:
        atomic_write_text(effective_file, text)


def _config_or_none(path: str) -> TrainConfig | None:
    try:
        return load_config(path)
    except ValueError:
        return None


def _prepare(run_dir: str, config_path, devices_world: int, lead: bool, log: Log,
             config: TrainConfig | None = None, init_from: str | None = None) -> tuple[TrainConfig, str | None]:
    """Config and checkpoint checks made before the training starts (clear one-line errors), then
    (``lead``: this process writes the run's files and logs, not the other torchrun ranks) the
    run's config files. ``config``: this config instead of ``config_path``'s (the daemon's).
    ``init_from`` (``--init-from``): sets ``train.init_from``. With ``train.init_from``, a new run
    takes its ``[model]`` from that network; a run with a checkpoint resumes and ignores it."""
    if not lead:
        log = _quiet
    if config is None:
        config = resolve_config(run_dir, config_path)
    if init_from:
        config = config.replace(train={"init_from": os.path.abspath(os.path.expanduser(os.fspath(init_from)))})
    if config.train.batch_size % devices_world:
        raise ValueError(f"train.batch_size {config.train.batch_size} is not a multiple of the "
                         f"{devices_world} ranks")
    found = load_newest_checkpoint(run_dir, log)
    path = None
    if found is None and config.train.init_from:
        config = _apply_init_from(run_dir, config, log)
    if found is not None:
        data, path = found
        started_from = data["train_config"].get("train", {}).get("init_from")
        if config.train.init_from or started_from:  # resuming wins; the run's shape is its checkpoint's
            if config.train.init_from:
                log(f"learner: train.init_from {config.train.init_from} is not used: the run resumes from {path}")
            model = {**dataclasses.asdict(ModelConfig()), **data["train_config"].get("model", {})}
            config = config.replace(model=model)
        differs = model_differences(config, data["train_config"])
        if differs:
            raise ValueError(f"the config changes the network's shape ({', '.join(differs)}) from checkpoint "
                             f"{path}: start a new run directory, or restore the run's [model] section")
    if lead:
        _write_run_config(run_dir, config, config_path, log)
    return config, path


def _describe_failure(exc: BaseException, processes: Sequence, error_files: Sequence[str]) -> str:
    """One line naming the rank whose end brought the group down, and how it ended.

    ``spawn`` reports the first failure it noticed; when a rank dies, its peers fail too
    (their collectives lose the connection) and the rest are stopped with SIGTERM, so a rank
    that ended by itself without a Python exception (an exit code, a signal such as the OOM
    killer's SIGKILL) is named first, before ranks that raised or were terminated.
    """
    rank = getattr(exc, "error_index", 0)
    for i, process in enumerate(processes):
        code = process.exitcode
        if code and code != -signal.SIGTERM and not os.path.exists(error_files[i]):
            rank = i
            break
    code = processes[rank].exitcode if rank < len(processes) else None
    if code is not None and code < 0:
        try:
            how = f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            how = f"was killed by signal {-code}"
    elif code and not os.path.exists(error_files[rank]):
        how = f"exited with code {code}"
    else:
        lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
        how = f"failed: {lines[-1] if lines else type(exc).__name__}"
    return (f"learner: rank {rank} {how}; the other ranks were stopped. "
            "Resume by running the same command again (it continues from the last checkpoint)")


def newest_generation(run_dir: str | os.PathLike) -> dict | None:
    """The newest line of RUN/generations.jsonl whose network file is there (None: none yet)."""
    run_dir = os.fspath(run_dir)
    for record in reversed(read_jsonl(os.path.join(run_dir, GENERATIONS_FILE))):
        onnx = record.get("onnx")
        if (isinstance(record.get("generation"), int) and isinstance(onnx, str) and isinstance(record.get("sha256"), str)
                and os.path.isfile(os.path.join(run_dir, onnx))):
            return record
    return None


def _write_generation_zero(run_dir: str, config: TrainConfig, log: Log) -> str:
    """The step-0 checkpoint and generation 0 of a new run: the config's fresh network, or the
    one ``train.init_from`` names. Returns the checkpoint's path (the caller holds the run's lock)."""
    launch = _Launch(run_dir=run_dir, config=config.to_dict(), kind="cpu", steps=0, follow=False,
                     progress=False, checkpoint=None, report=False)
    learner = _Learner(launch, 0, 1, torch.device("cpu"), log)
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
        config, checkpoint = _prepare(run_dir, config_path, 1, True, log, config)
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
            config, checkpoint = _prepare(run_dir, config_path, world, rank == 0, log,
                                          init_from=os.fspath(init_from) if init_from else None)
            if checkpoint is None and config.train.init_from and not torchrun and newest_generation(run_dir) is None:
                checkpoint = _write_generation_zero(run_dir, config, log)  # the ranks resume from it
        except (ValueError, OSError) as exc:
            log(f"learner: error: {exc}")
            return 2
        launch = _Launch(run_dir=run_dir, config=config.to_dict(), kind=parsed.kind, steps=steps,
                         follow=follow, progress=progress, checkpoint=checkpoint, device_ids=parsed.ids)
        if torchrun:
            return _run_rank(rank, world, local, launch, log, end_process=world > 1)
        if world == 1:
            return _run_rank(0, 1, 0, launch, log)
        store = rendezvous_store(world, config.train.dist_timeout_s)  # held until this function returns
        launch = dataclasses.replace(launch, store_port=store.port, parent_pid=os.getpid(), environ=dict(os.environ))
        import torch.multiprocessing as mp

        method = _start_method(parsed.kind)
        lines = mp.get_context(method).SimpleQueue()
        forward = threading.Thread(target=_forward, args=(lines, log), name="rank-logs", daemon=True)
        forward.start()
        context = mp.start_processes(_spawned, args=(world, launch, lines), nprocs=world, join=False,
                                     start_method=method)
        try:
            with _forward_stop(context.processes):
                while not context.join():
                    pass
        except (mp.ProcessExitedException, mp.ProcessRaisedException) as exc:
            failure = _describe_failure(exc, context.processes, context.error_files)
        else:
            failure = ""
        finally:
            lines.put(None)
            forward.join(5.0)
        if failure:
            log(failure)
            return 1
        return 0
