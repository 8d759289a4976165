"""The learner (trainer/learner.py): lc0's losses, the DDP step, checkpoints, resume, rank failure.

Everything runs on the CPU with tiny networks (1x8, 2x16); the multi-process tests use gloo.
GPU paths (nccl, mixed precision) are marked ``gpu`` and skip with the reason shown here.
"""

from __future__ import annotations

import math
import os
import socket
from typing import NamedTuple

import pytest
import torch
import torch.multiprocessing as mp

from engine.encoding import PLANES, POLICY_SIZE
from trainer.config import LossConfig, OptimizerConfig, default_config
from trainer.learner import (
    WeightAverager, compute_losses, evaluate, lr_at, make_optimizer, policy_cross_entropy, train_step,
)
from trainer.model import NetConfig, NetOutput, build_net

pytestmark = pytest.mark.timeout(120)


class FakeBatch(NamedTuple):
    planes: torch.Tensor
    policy: torch.Tensor
    wdl: torch.Tensor
    plies_left: torch.Tensor


def synthetic_batch(n: int, seed: int) -> FakeBatch:
    """Random 0/1 planes, a random visit distribution over a random legal set (-1 elsewhere)."""
    g = torch.Generator().manual_seed(seed)
    planes = (torch.rand(n, PLANES, 8, 8, generator=g) < 0.1).float()
    planes[:, PLANES - 1] = 1.0
    legal = torch.rand(n, POLICY_SIZE, generator=g) < 0.02
    legal[:, 0] = True
    visits = torch.rand(n, POLICY_SIZE, generator=g) * legal
    policy = torch.where(legal, visits / visits.sum(1, keepdim=True), torch.full_like(visits, -1.0))
    wdl = torch.nn.functional.one_hot(torch.randint(0, 3, (n,), generator=g), 3).float()
    plies_left = torch.randint(1, 150, (n,), generator=g).float()
    return FakeBatch(planes, policy, wdl, plies_left)


# --------------------------------------------------------------------------- losses


def test_policy_loss_is_cross_entropy_over_legal_moves_only():
    target = torch.full((1, POLICY_SIZE), -1.0)
    target[0, [3, 7, 11]] = torch.tensor([0.5, 0.25, 0.25])
    logits = torch.randn(1, POLICY_SIZE)
    legal_logits = logits[0, [3, 7, 11]]
    expected = -(target[0, [3, 7, 11]] * torch.log_softmax(legal_logits, 0)).sum()
    assert torch.allclose(policy_cross_entropy(logits, target)[0], expected, atol=1e-6)

    # Illegal logits neither change the loss nor receive gradient, however large they are.
    moved = logits.clone()
    moved[0, 100] = 1e4
    moved.requires_grad_(True)
    loss = policy_cross_entropy(moved, target).sum()
    loss.backward()
    assert torch.allclose(loss, expected, atol=1e-6)
    grad = moved.grad[0]
    assert torch.count_nonzero(grad[target[0] < 0]) == 0
    assert torch.isfinite(grad).all() and torch.count_nonzero(grad[[3, 7, 11]]) == 3


def test_policy_loss_is_least_at_the_target_and_never_nan():
    target = torch.full((2, POLICY_SIZE), -1.0)
    target[0, [1, 2]] = torch.tensor([0.75, 0.25])
    best = torch.zeros(2, POLICY_SIZE)
    best[0, 1], best[0, 2] = math.log(0.75), math.log(0.25)
    entropy = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))
    loss = policy_cross_entropy(best, target)
    assert loss[0].item() == pytest.approx(entropy, abs=1e-6)
    assert loss[1].item() == 0.0  # a row with no legal move (never written) adds nothing, not NaN
    worse = best.clone()
    worse[0, 2] += 1.0
    assert policy_cross_entropy(worse, target)[0] > loss[0]


def test_value_and_moves_left_losses_as_lc0():
    cfg = LossConfig()
    n = 3
    target = FakeBatch(torch.zeros(n, PLANES, 8, 8), torch.zeros(n, POLICY_SIZE),
                       torch.tensor([[1.0, 0, 0], [0, 1.0, 0], [0.2, 0.5, 0.3]]), torch.tensor([10.0, 10.0, 10.0]))
    wdl_logits = torch.log(torch.tensor([[0.5, 0.3, 0.2]] * n))
    # predictions 10, 15 and 40 plies: /20 -> differences 0, 0.25 (quadratic) and 1.5 (linear beyond 0.5)
    mlh = torch.tensor([[10.0], [15.0], [40.0]])
    out = NetOutput(torch.zeros(n, POLICY_SIZE), wdl_logits, mlh)
    losses = compute_losses(out, target, cfg)
    p = torch.tensor([0.5, 0.3, 0.2]).log()
    value = (-p[0] - p[1] - (0.2 * p[0] + 0.5 * p[1] + 0.3 * p[2])) / 3
    assert losses["value"].item() == pytest.approx(value.item(), abs=1e-6)
    huber = (0.0 + 0.5 * 0.25 ** 2 + 0.5 * (1.5 - 0.25)) / 3
    assert losses["moves_left"].item() == pytest.approx(huber, abs=1e-6)
    assert losses["total"].item() == pytest.approx(
        losses["policy"].item() + losses["value"].item() + losses["moves_left"].item(), abs=1e-6)
    weighted = compute_losses(out, target, LossConfig(policy=0.0, value=2.0, moves_left=0.5))
    assert weighted["total"].item() == pytest.approx(2 * value.item() + 0.5 * huber, abs=1e-6)


def test_net_without_moves_left_head_has_zero_moves_left_loss():
    net = build_net(NetConfig.from_name("1x8", moves_left=False))
    batch = synthetic_batch(4, 0)
    losses = compute_losses(net(batch.planes), batch, LossConfig())
    assert losses["moves_left"].item() == 0.0
    assert "moves_left" not in evaluate(net, batch, LossConfig())


# --------------------------------------------------------------------------- schedule and averaging


def test_learning_rate_warm_up_and_schedules():
    cos = OptimizerConfig(lr=0.1, warmup_steps=10, schedule="cosine", decay_steps=100, min_lr=0.001)
    assert lr_at(0, cos) == pytest.approx(0.01)
    assert lr_at(9, cos) == pytest.approx(0.1)
    assert lr_at(10, cos) == pytest.approx(0.1)
    assert lr_at(60, cos) == pytest.approx(0.001 + 0.099 * 0.5)
    assert lr_at(110, cos) == pytest.approx(0.001) and lr_at(10_000, cos) == pytest.approx(0.001)
    step = OptimizerConfig(lr=0.2, warmup_steps=0, schedule="step", milestones=[5, 8], gamma=0.1)
    assert [round(lr_at(s, step), 6) for s in (0, 4, 5, 7, 8, 100)] == [0.2, 0.2, 0.02, 0.02, 0.002, 0.002]
    const = OptimizerConfig(lr=0.05, warmup_steps=0, schedule="constant")
    assert lr_at(123_456, const) == 0.05


def test_weight_decay_only_on_conv_and_linear_weights():
    net = build_net("1x8")
    opt = make_optimizer(net, OptimizerConfig(weight_decay=1e-4))
    decayed, plain = opt.param_groups
    assert decayed["weight_decay"] == 1e-4 and plain["weight_decay"] == 0.0
    assert all(p.dim() > 1 for p in decayed["params"]) and all(p.dim() == 1 for p in plain["params"])
    assert len(decayed["params"]) + len(plain["params"]) == len(list(net.parameters()))
    assert isinstance(opt, torch.optim.SGD) and opt.defaults["nesterov"]
    assert isinstance(make_optimizer(net, OptimizerConfig(kind="adamw")), torch.optim.AdamW)


def test_ema_and_swa_follow_their_formulas():
    net = torch.nn.Linear(1, 1, bias=False)
    ema = WeightAverager("ema", decay=0.5)
    swa = WeightAverager("swa", every=2, max_n=2)
    ema_expected = None
    for step, w in enumerate([1.0, 3.0, 5.0, 7.0, 9.0], start=1):
        net.weight.data.fill_(w)
        ema.update(net, step)
        swa.update(net, step)
        if ema_expected is None:
            ema_expected, n = w, 1
        else:
            d = min(0.5, (1 + n) / (10 + n))
            ema_expected = d * ema_expected + (1 - d) * w
            n += 1
        assert ema.weights["weight"].item() == pytest.approx(ema_expected)
    # swa snapshots at steps 2 (w=3) and 4 (w=7): 3, then (3*1 + 7)/2 = 5; max_n 2 keeps n at 2
    assert swa.weights["weight"].item() == pytest.approx(5.0) and swa.count == 2


# --------------------------------------------------------------------------- the DDP step


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


KINDS = ("sgd", "adamw")
CLIP = {"sgd": 0.0, "adamw": 1.0}  # SGD unclipped: clipping and Adam would hide a wrong gradient scale


def _ddp_rank(rank: int, port: int, out_dir: str) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        for kind in KINDS:
            net = build_net("2x16", seed=1)
            model = DistributedDataParallel(net)
            opt = make_optimizer(net, OptimizerConfig(kind=kind, lr=0.05))
            for step in range(3):
                half = synthetic_batch(16, seed=10 * step + rank)
                train_step(model, opt, [half], LossConfig(), clip_grad_norm=CLIP[kind])
            torch.save(dict(net.named_parameters()), os.path.join(out_dir, f"{kind}{rank}.pt"))
    finally:
        dist.destroy_process_group()


def test_two_gloo_ranks_match_one_rank_accumulating_the_two_halves(tmp_path):
    """BatchNorm normalises each rank's half on its own, so the exact single-process equivalent
    is gradient accumulation over the same two halves; weights must agree to float rounding."""
    mp.spawn(_ddp_rank, args=(_free_port(), str(tmp_path)), nprocs=2, join=True)
    torch.set_num_threads(1)
    for kind in KINDS:
        net = build_net("2x16", seed=1)
        opt = make_optimizer(net, OptimizerConfig(kind=kind, lr=0.05))
        start = {k: v.detach().clone() for k, v in net.named_parameters()}
        for step in range(3):
            halves = [synthetic_batch(16, seed=10 * step + r) for r in range(2)]
            train_step(net, opt, halves, LossConfig(), clip_grad_norm=CLIP[kind])
        ranks = [torch.load(tmp_path / f"{kind}{r}.pt", weights_only=True) for r in range(2)]
        for name, param in net.named_parameters():
            assert torch.equal(ranks[0][name], ranks[1][name]), name  # DDP keeps the ranks identical
            assert torch.allclose(ranks[0][name], param.detach(), atol=1e-5, rtol=1e-4), (kind, name)
        moved = max((p.detach() - start[n]).abs().max().item() for n, p in net.named_parameters())
        assert moved > 1e-3  # the comparison is not between untouched weights
