"""lc0's training losses, the held-out metrics, the optimiser, its learning-rate schedule and the
weight averaging (EMA or SWA) of the exported networks: what :mod:`trainer.learner`'s step computes
and updates, apart from the loop that runs it."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from trainer.config import LossConfig, OptimizerConfig, TrainingConfig
from trainer.model import Net, NetConfig, NetOutput

__all__: Sequence[str] = [
    "policy_cross_entropy", "compute_losses", "evaluate", "make_optimizer", "apply_hyperparameters", "lr_at",
    "set_lr", "WeightAverager",
]


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
    apply_hyperparameters(optimizer, cfg)
    return optimizer


def apply_hyperparameters(optimizer: torch.optim.Optimizer, cfg: OptimizerConfig) -> None:
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


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


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
