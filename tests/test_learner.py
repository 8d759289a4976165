"""The learner (trainer/learner.py): lc0's losses, the DDP step, checkpoints, resume, rank failure.

Everything runs on the CPU with tiny networks (1x8, 2x16); the multi-process tests use gloo.
GPU paths (nccl, mixed precision) are marked ``gpu`` and skip with the reason shown here.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from typing import NamedTuple
from unittest import mock

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

from engine.board import Board
from engine.encoding import PLANES, POLICY_SIZE
from trainer.config import CONFIG_FILE, LossConfig, OptimizerConfig, is_validation, load_config, to_toml
from trainer.learner import EXIT_HOOK_ENV, learn, train_step
from trainer.losses import WeightAverager, compute_losses, evaluate, lr_at, make_optimizer, policy_cross_entropy
from trainer.ranks import join_group, rendezvous_store
from trainer.loader import ReplaySampler, WindowConfig
from trainer.model import NetConfig, NetOutput, build_net
from trainer.records import RECORD_DTYPE, Eval, make_record
from trainer.rundir import checkpoint_path, list_checkpoints
from tiny_configs import tiny_config
from trainer.store import ReplayStore

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("one_thread")]


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
    opt = make_optimizer(net, OptimizerConfig(kind="sgd", weight_decay=1e-4))
    decayed, plain = opt.param_groups
    assert decayed["weight_decay"] == 1e-4 and plain["weight_decay"] == 0.0
    assert all(p.dim() > 1 for p in decayed["params"]) and all(p.dim() == 1 for p in plain["params"])
    assert len(decayed["params"]) + len(plain["params"]) == len(list(net.parameters()))
    assert isinstance(opt, torch.optim.SGD) and all(g["nesterov"] and g["momentum"] == 0.9 for g in opt.param_groups)
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


KINDS = ("sgd", "adamw")
CLIP = {"sgd": 0.0, "adamw": 1.0}  # SGD unclipped: clipping and Adam would hide a wrong gradient scale
#: (network, optimiser) pairs the DDP check trains: a residual tower with both, an attention body with AdamW.
DDP_CASES = [("2x16", kind) for kind in KINDS] + [("bt-16x1x2h", "adamw")]


def _ddp_rank(rank: int, port: int, out_dir: str) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    join_group("gloo", rank, 2, port)
    try:
        for name, kind in DDP_CASES:
            net = build_net(name, seed=1)
            model = DistributedDataParallel(net)
            opt = make_optimizer(net, OptimizerConfig(kind=kind, lr=0.05))
            for step in range(3):
                half = synthetic_batch(16, seed=10 * step + rank)
                train_step(model, opt, [half], LossConfig(), clip_grad_norm=CLIP[kind])
            torch.save(dict(net.named_parameters()), os.path.join(out_dir, f"{name}-{kind}{rank}.pt"))
        # as the learner does: a rank that tore the group down while the other's gloo threads
        # still read from it once aborted that rank ("terminate called without an active exception")
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_the_ranks_store_holds_its_port_from_the_start():
    """The spawned ranks' rendezvous port is bound by their parent before they are named it: no
    other process can take it in between (a port found free and bound later by rank 0 could be);
    and it listens on loopback only."""
    import socket

    store = rendezvous_store(2, timeout_s=5.0)
    with socket.socket() as other, pytest.raises(OSError):
        other.bind(("127.0.0.1", store.port))
    listening = []  # the local addresses listening on the store's port, from Linux's tables
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                address, port = local.split(":")
                if state == "0A" and int(port, 16) == store.port:
                    listening.append(address)
    assert listening == ["0100007F"], listening  # 127.0.0.1 alone, not 0.0.0.0 or ::


def test_two_gloo_ranks_match_one_rank_accumulating_the_two_halves(tmp_path, one_thread):
    """BatchNorm normalises each rank's half on its own, so the exact single-process equivalent
    is gradient accumulation over the same two halves; weights must agree to float rounding (an
    attention body's layer norms are per position, the same either way)."""
    store = rendezvous_store(2)
    mp.spawn(_ddp_rank, args=(store.port, str(tmp_path)), nprocs=2, join=True)
    for name, kind in DDP_CASES:
        net = build_net(name, seed=1)
        opt = make_optimizer(net, OptimizerConfig(kind=kind, lr=0.05))
        start = {k: v.detach().clone() for k, v in net.named_parameters()}
        for step in range(3):
            halves = [synthetic_batch(16, seed=10 * step + r) for r in range(2)]
            train_step(net, opt, halves, LossConfig(), clip_grad_norm=CLIP[kind])
        ranks = [torch.load(tmp_path / f"{name}-{kind}{r}.pt", weights_only=True) for r in range(2)]
        for key, param in net.named_parameters():
            assert torch.equal(ranks[0][key], ranks[1][key]), key  # DDP keeps the ranks identical
            assert torch.allclose(ranks[0][key], param.detach(), atol=1e-5, rtol=1e-4), (name, kind, key)
        moved = max((p.detach() - start[n]).abs().max().item() for n, p in net.named_parameters())
        assert moved > 1e-3  # the comparison is not between untouched weights


# --------------------------------------------------------------------------- runs on a replay store

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TINY = tiny_config(optimizer={"warmup_steps": 2}, train={"checkpoint_every": 4, "keep_checkpoints": 2},
                   replay={"floor": 100000, "val_percent": 30, "workers": 0, "validation_positions": 48},
                   log={"interval": 2})


def random_game(rng: random.Random, input_format: int = 1) -> np.ndarray:
    """A random game's records in lc0's ``input_format``: a few legal moves per position with random
    visit shares."""
    board = Board()
    records = []
    length = rng.randrange(12, 40)
    for ply in range(length):
        moves = sorted(board.legal_moves())
        if not moves or board.is_game_over():
            break
        visits = {m: rng.random() + 0.01 for m in rng.sample(moves, min(len(moves), 4))}
        played = rng.choice(sorted(visits))
        q = rng.choice((-1.0, 0.0, 1.0))
        records.append(make_record(board, visits, result_q=q, result_d=1.0 - abs(q), plies_left=float(length - ply),
                                   played=played, root=Eval(0.0, 0.5, 20.0), input_format=input_format))
        board.push_uci(played)
    return np.array(records, dtype=RECORD_DTYPE)


def make_run(path, config: str = TINY, game=None, games_per_chunk: int = 3, seed: int = 0,
             positions: int = 0, input_format: int = 1):
    """A run folder with RUN/config.toml and a store of at least 2 validation and 4 training chunks
    and ``positions`` in all (which chunks are held out depends on their names, so keep adding
    until both are there). The chunks' names, random in the store, are drawn from ``seed`` here:
    the same call makes the same split, so a test's held-out set does not change from run to run.
    ``game`` (default: :func:`random_game` in ``input_format``) makes one game's records from an rng."""
    path = str(path)
    game = game or (lambda rng: random_game(rng, input_format))
    store = ReplayStore(path, input_format)
    with open(os.path.join(path, CONFIG_FILE), "w") as f:
        f.write(config)
    val_percent = load_config(os.path.join(path, CONFIG_FILE)).replay.val_percent
    rng = random.Random(seed)
    names_rng = random.Random(f"chunk names {seed}")
    with mock.patch("trainer.store.uuid.uuid4", lambda: uuid.UUID(int=names_rng.getrandbits(128))):
        for _ in range(1000):
            names = [e.name for e in store.entries()]
            held = sum(is_validation(n, val_percent) for n in names)
            if held >= 2 and len(names) - held >= 4 and store.total_positions() >= positions:
                return path
            store.append_games([game(rng) for _ in range(games_per_chunk)], generation=0, source="test")
    raise AssertionError("could not make a store with both validation and training chunks")


def run_learn(run, **kw) -> tuple[int, list[str]]:
    lines: list[str] = []
    code = learn(run, progress=False, log=lines.append, **kw)
    return code, lines


def test_learn_writes_checkpoints_networks_generations_and_metrics(tmp_path):
    from engine.network import Network
    from trainer.atomic import verify_sha256
    from trainer.model import load_net

    run = make_run(tmp_path / "run")
    code, lines = run_learn(run, steps=10)
    assert code == 0, lines
    assert [s for s, _ in list_checkpoints(run)] == [8, 10]  # keep_checkpoints = 2
    final = torch.load(checkpoint_path(run, 10), weights_only=True)
    assert final["step"] == 10 and final["generation"] == 3
    assert final["sampler"]["next_batch"] == 10 and final["sampler"]["samples_drawn"] == 160
    assert final["train_config"] == load_config(os.path.join(run, CONFIG_FILE)).to_dict()
    assert load_net(final).config.name == "1x8"  # what `cyzero-train export --checkpoint` reads
    assert final["average"]["kind"] == "ema" and final["optimizer"]["state"]

    generations = [json.loads(line) for line in open(os.path.join(run, "generations.jsonl"))]
    assert [(g["generation"], g["step"]) for g in generations] == [(1, 4), (2, 8), (3, 10)]
    for g in generations:
        path = os.path.join(run, g["onnx"])
        assert verify_sha256(path) and g["sha256"] == hashlib.sha256(open(path, "rb").read()).hexdigest()
        assert g["weights"] in ("raw", "ema")
        assert set(g["val"]) == {"policy_top1", "policy_ce", "value_ce", "moves_left", "total"}
        other = "ema" if g["weights"] == "raw" else "raw"
        assert g[f"val_{other}"]["total"] >= g["val"]["total"]  # the export is the better of the two
    net = Network(os.path.join(run, generations[-1]["onnx"]), backend="cpu")
    policy, wdl, mlh = net.evaluate(np.zeros((2, PLANES, 8, 8), np.float32))
    assert policy.shape == (2, POLICY_SIZE) and np.allclose(wdl.sum(1), 1, atol=1e-5)
    assert mlh is not None and len(mlh) == 2

    metrics = [json.loads(line) for line in open(os.path.join(run, "metrics.jsonl"))]
    assert [m["step"] for m in metrics] == [2, 4, 6, 8, 10]
    for m in metrics:
        for key in ("loss_policy", "loss_value", "loss_moves_left", "loss_total", "lr", "window", "generation",
                    "val_policy_top1", "val_policy_ce", "val_value_ce", "val_moves_left"):
            assert math.isfinite(m[key]), key
    assert metrics[0]["lr"] == pytest.approx(0.003) and metrics[-1]["generation"] == 2
    assert metrics[0]["window"] == ReplaySampler(ReplayStore(run), WindowConfig(floor=100000, val_percent=30),
                                                 16).window_positions
    assert any(name.startswith("events.out.tfevents") for name in os.listdir(os.path.join(run, "tensorboard")))

    # The same command again has nothing left to do; a longer one continues from step 10.
    code, lines = run_learn(run, steps=10)
    assert code == 0 and "already at step 10" in lines[-1]
    code, lines = run_learn(run, steps=12)
    assert code == 0 and any("resuming at step 10" in ln for ln in lines)
    assert [s for s, _ in list_checkpoints(run)] == [10, 12]


def test_sigkill_mid_run_resumes_at_the_checkpoint_step_and_cursor(tmp_path, caplog, one_thread):
    config = TINY.replace("workers = 0", "workers = 1")
    run = make_run(tmp_path / "run", config)
    twin = str(tmp_path / "twin")
    shutil.copytree(run, twin)
    code = ("import sys; from trainer.learner import learn; "
            "sys.exit(learn(sys.argv[1], steps=10, progress=False))")
    env = {**one_thread, EXIT_HOOK_ENV: "0:6:kill"}  # SIGKILL itself after step 6 (checkpoint at 4)
    proc = subprocess.run([sys.executable, "-c", code, run], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert [s for s, _ in list_checkpoints(run)] == [4]
    # A newer checkpoint cut short (say, a copy that failed) is skipped with a line naming it.
    whole = open(checkpoint_path(run, 4), "rb").read()
    with open(checkpoint_path(run, 5), "wb") as f:
        f.write(whole[: len(whole) // 2])

    caplog.set_level(logging.WARNING, logger="cyzero.replay")
    code, lines = run_learn(run, steps=10)
    assert code == 0, lines
    assert any("skipping damaged checkpoint" in ln and "step-00000005.pt" in ln for ln in lines)
    assert any("resuming at step 4" in ln for ln in lines)
    code, twin_lines = run_learn(twin, steps=10)
    assert code == 0, twin_lines

    resumed = torch.load(checkpoint_path(run, 10), weights_only=True)
    straight = torch.load(checkpoint_path(twin, 10), weights_only=True)
    assert resumed["sampler"] == straight["sampler"]
    assert resumed["generation"] == straight["generation"] == 3
    for key, value in straight["model"].items():
        assert torch.allclose(resumed["model"][key].float(), value.float(), atol=1e-6), key
    for key, value in straight["average"]["weights"].items():
        assert torch.allclose(resumed["average"]["weights"][key].float(), value.float(), atol=1e-6), key
    assert ReplayStore(run).bad_chunks() == {}
    assert not [r for r in caplog.records if "skipping chunk" in r.getMessage()]


def test_a_rank_that_dies_takes_the_group_down_with_a_clear_message(tmp_path, monkeypatch):
    run = make_run(tmp_path / "run", TINY.replace("checkpoint_every = 4", "checkpoint_every = 2"))
    monkeypatch.setenv(EXIT_HOOK_ENV, "1:3")
    code, lines = run_learn(run, devices="cpu:2", steps=6)
    assert code == 1
    assert "rank 1 exited with code 3" in lines[-1] and "running the same command again" in lines[-1]
    monkeypatch.delenv(EXIT_HOOK_ENV)
    code, lines = run_learn(run, devices="cpu:2", steps=6)
    assert code == 0, lines[-3:]
    assert sum("joined the gloo group" in ln for ln in lines) == 2  # spawned ranks say it too
    assert any("resuming at step 2" in ln for ln in lines)
    assert list_checkpoints(run)[-1][0] == 6


def test_a_rank_that_crashes_natively_leaves_its_python_stack_beside_the_failure(tmp_path, one_thread):
    """A rank killed by a native abort (a C++ terminate, say) cannot raise: the parent names the
    signal, and the rank's own stack on stderr says where it was."""
    run = make_run(tmp_path / "run")
    proc = subprocess.run([sys.executable, "-m", "trainer.cli", "learn", run, "--devices", "cpu:2", "--steps", "6",
                           "--no-progress"], cwd=REPO, env={**one_thread, EXIT_HOOK_ENV: "1:3:abort"},
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 1, proc.stderr
    assert "rank 1 was killed by SIGABRT" in proc.stderr.strip().splitlines()[-1], proc.stderr
    dump = proc.stderr[proc.stderr.index("Fatal Python error: Aborted"):]
    assert "in _die" in dump and "in run" in dump, proc.stderr


def _descendants(pid: int) -> set[int]:
    """Every process below ``pid``, from Linux's /proc/PID/task/TID/children."""
    found: set[int] = set()
    todo = [pid]
    while todo:
        parent = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                with open(f"/proc/{parent}/task/{task}/children") as f:
                    children = [int(c) for c in f.read().split()]
            except OSError:
                continue
            todo += [c for c in children if c not in found]
            found.update(children)
    return found


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state first), or None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def _identity(pid: int) -> tuple[int, str] | None:
    """``(pid, start time)``: a pid names one process only until it is reaped and reused, which
    a busy machine with a pid_max of 32768 can do within the minute this file waits."""
    fields = _stat(pid)
    return None if fields is None else (pid, fields[19])


def _running(process: tuple[int, str]) -> bool:
    """The same process, alive and not a zombie (an orphan's zombie waits for whoever reaps it here)."""
    fields = _stat(process[0])
    return fields is not None and fields[19] == process[1] and fields[0] != "Z"


def _command(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


@pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="reads the process tree from /proc (Linux)")
def test_a_sigkilled_learner_leaves_no_rank_behind(tmp_path, one_thread):
    """The ranks (and the forkserver CPU ranks are forked from) end when their learner is
    SIGKILLed: nothing is left training, or holding the run's files, for good."""
    run = make_run(tmp_path / "run")
    proc = subprocess.Popen([sys.executable, "-m", "trainer.cli", "learn", run, "--devices", "cpu:2", "--follow",
                             "--no-progress"], cwd=REPO, env=one_thread, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        seen = []
        for line in proc.stderr:   # rank 0's first report: the group is up and training
            seen.append(line)
            if line.startswith("learner: step"):
                break
        assert seen and seen[-1].startswith("learner: step"), "".join(seen)[-3000:]
        below = {i for i in map(_identity, _descendants(proc.pid)) if i is not None}
        assert len(below) >= 2, below      # the two ranks at least
        proc.kill()
        proc.wait(30)
        _wait_for(lambda: not any(_running(p) for p in below), "the ranks to end after their learner", 60.0,
                  lambda: [f"{p[0]}: {_command(p[0])}" for p in below if _running(p)])
    finally:
        proc.kill()
        proc.wait(30)
        proc.stderr.close()


def _wait_for(predicate, what: str, timeout: float = 60.0, details=lambda: "") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}: {details()}"
        time.sleep(0.1)


@pytest.mark.parametrize("devices, workers, whole_group", [("cpu:1", 0, False), ("cpu:2", 0, False),
                                                           ("cpu:2", 1, True)])
def test_sigterm_stops_the_learner_after_a_step_with_a_final_checkpoint(tmp_path, devices, workers, whole_group):
    """The daemon stops its learner with SIGTERM: every rank stops after the same step, and the
    final checkpoint holds that step (nothing trained is lost). A Ctrl-C in a terminal signals the
    whole process group, loader workers and the forkserver of the CPU ranks included: they leave
    the stop to the learner."""
    config = TINY.replace("checkpoint_every = 4", "checkpoint_every = 1000").replace("workers = 0",
                                                                                   f"workers = {workers}")
    run = make_run(tmp_path / "run", config)
    process = subprocess.Popen(
        [sys.executable, "-m", "trainer.cli", "learn", run, "--devices", devices, "--follow", "--no-progress"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=os.path.dirname(os.path.dirname(__file__)),
        start_new_session=whole_group)
    try:
        metrics = os.path.join(run, "metrics.jsonl")
        _wait_for(lambda: os.path.exists(metrics) and os.path.getsize(metrics) > 0, "the first metrics line")
        if whole_group:
            os.killpg(process.pid, signal.SIGTERM)
        else:
            process.send_signal(signal.SIGTERM)
        out, _ = process.communicate(timeout=90)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, out
    stopped = [ln for ln in out.splitlines() if "asked to stop at step" in ln]
    assert stopped, out
    step = int(stopped[0].split("at step ")[1].split(":")[0].split()[0].replace(",", ""))
    assert step >= 2 and list_checkpoints(run)[-1][0] == step
    # A stop is not on the schedule (a generation every 1,000 steps): it keeps a checkpoint, and
    # exports no network (the daemon would publish every one of them)
    assert not os.path.exists(os.path.join(run, "generations.jsonl")), out
    assert not os.path.exists(os.path.join(run, "networks")), out
    assert f"checkpoint checkpoints/step-{step:08d}.pt (a stop: no network exported; generation 1 comes at " \
           "step 1,000)" in out


@pytest.mark.parametrize("which", ["rank", "parent"])
def test_a_stop_signal_delivered_twice_is_one_stop_and_a_later_one_interrupts(monkeypatch, which):
    """`timeout` and systemd signal the whole process group: the spawning parent gets SIGTERM
    twice, and each rank gets the group's and then the parent's forward. That is one stop
    after the step; only a signal REPEATED_SIGNAL_S or more after the first interrupts at once."""
    from trainer import ranks, stop_signals

    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers are installed only in the main thread")
    monkeypatch.setattr(stop_signals, "REPEATED_SIGNAL_S", 0.3)
    before = signal.getsignal(signal.SIGTERM)
    stop = threading.Event()
    context = (stop_signals.stop_on_signals(stop, (signal.SIGTERM,)) if which == "rank"
               else ranks.forward_stop([]))

    def deliver() -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)   # Python runs the handler between bytecodes, before the next signal

    with context:
        try:
            deliver()
            deliver()
        except KeyboardInterrupt:   # (a KeyboardInterrupt left to pytest would end the whole run)
            pytest.fail("a signal repeated within REPEATED_SIGNAL_S interrupted instead of stopping once")
        assert stop.is_set() == (which == "rank")
        time.sleep(0.3)
        with pytest.raises(KeyboardInterrupt):
            deliver()
    assert signal.getsignal(signal.SIGTERM) == before


def test_initialize_run_makes_generation_zero_where_the_learner_starts(tmp_path):
    from engine.network import Network
    from trainer.learner import initialize_run

    run = make_run(tmp_path / "run")
    record = initialize_run(run, log=lambda line: None)
    assert record["generation"] == 0 and record["step"] == 0
    assert [s for s, _ in list_checkpoints(run)] == [0]
    path = os.path.join(run, record["onnx"])
    assert hashlib.sha256(open(path, "rb").read()).hexdigest() == record["sha256"]
    Network(path, backend="cpu").close()
    assert initialize_run(run, log=lambda line: None) == record  # a second call changes nothing
    code, lines = run_learn(run, steps=4)
    assert code == 0 and any("a new run: starting at step 0 from generation 0" in ln for ln in lines), lines
    generations = [json.loads(ln)["generation"] for ln in open(os.path.join(run, "generations.jsonl"))]
    assert generations == [0, 1]


def test_starved_learner_stops_cleanly_or_waits_with_follow(tmp_path):
    run = make_run(tmp_path / "run", TINY.replace("[replay]\n", "[replay]\nmax_samples_per_position = 0.5\n"))
    train = ReplaySampler(ReplayStore(run), WindowConfig(floor=100000, val_percent=30), 16).training_positions
    cap = int(0.5 * train) // 16
    code, lines = run_learn(run, steps=1000)
    assert code == 0
    assert any(f"stopping at step {cap}" in ln for ln in lines)
    assert list_checkpoints(run)[-1][0] == cap  # the final checkpoint is written all the same

    # With follow it waits, and goes on once new games arrive.
    cfg = load_config(os.path.join(run, CONFIG_FILE)).replace(train={"starved_poll_s": 0.1})
    path = tmp_path / "follow.toml"
    path.write_text(to_toml(cfg))
    lines: list[str] = []
    result: list[int] = []
    thread = threading.Thread(target=lambda: result.append(
        learn(run, steps=cap + 3, config_path=path, follow=True, progress=False, log=lines.append)))
    thread.start()
    deadline = time.monotonic() + 60
    while not any("waiting for self-play games" in ln for ln in lines) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert any("waiting for self-play games" in ln for ln in lines)
    rng = random.Random(99)
    store = ReplayStore(run)
    while ReplaySampler(store, WindowConfig(floor=100000, val_percent=30, max_samples_per_position=0.5),
                        16).batches_available() < cap + 3:
        store.append_games([random_game(rng) for _ in range(3)], generation=1, source="test")
    thread.join(60)
    assert result == [0] and list_checkpoints(run)[-1][0] == cap + 3


def test_a_following_learner_says_once_that_it_waits_for_games(tmp_path, capsys, one_thread):
    """Under the daemon (--follow) the learner reaches the sampling cap again and again as games
    come in: it says so once, in the daemon's words, not at every step; `status` shows the rest."""
    from trainer.cli import main as cli

    run = make_run(tmp_path / "run", TINY.replace("[replay]\n", "[replay]\nmax_samples_per_position = 0.5\n")
                   .replace("[train]\n", "[train]\nstarved_poll_s = 0.05\n"))
    train = ReplaySampler(ReplayStore(run), WindowConfig(floor=100000, val_percent=30), 16).training_positions
    cap = int(0.5 * train) // 16
    log = tmp_path / "learner.log"
    with open(log, "wb") as out:  # as the daemon starts it: a process of its own, its output in a log
        process = subprocess.Popen([sys.executable, "-m", "trainer.cli", "learn", run, "--steps", str(cap + 6),
                                    "--follow", "--no-progress"], stdout=out, stderr=subprocess.STDOUT, cwd=REPO,
                                   env=one_thread)
    progress = os.path.join(run, "learner.json")

    def learner_state():
        try:
            with open(progress) as f:
                record = json.load(f)
        except (OSError, ValueError):
            return None, -1
        return record["state"], record["step"]

    store = ReplayStore(run)
    rng = random.Random(5)
    waits = 0
    deadline = time.monotonic() + 90
    while process.poll() is None and time.monotonic() < deadline:
        state, step = learner_state()
        if state == "waiting":
            waits += 1
            capsys.readouterr()
            assert cli(["status", run]) == 0
            assert f"  training    step {step}: waiting for self-play games" in capsys.readouterr().out
            while learner_state() == (state, step) and time.monotonic() < deadline:  # games for about a step
                store.append_games([random_game(rng)], generation=1, source="test")
                time.sleep(0.1)
        time.sleep(0.02)
    try:
        assert process.wait(60) == 0
    finally:
        if process.poll() is None:
            process.kill()
    lines = log.read_text().splitlines()
    assert waits >= 3, (waits, lines)
    said = [ln for ln in lines if "waiting" in ln or "new games" in ln]
    assert len([ln for ln in said if "waiting for self-play games" in ln]) == 1, said
    assert len(said) == 2 and "new games came in, training goes on" in said[1], said
    assert "`cyzero-train status RUN` shows the learner's step" in said[0]
    capsys.readouterr()
    assert cli(["status", run]) == 0
    assert f"  training    stopped at step {cap + 6}" in capsys.readouterr().out


def test_the_users_config_is_never_rewritten(tmp_path, capsys):
    """RUN/config.toml is the user's: their comments and the keys they left out stay; the config
    in use, every key, is RUN/config.effective.toml, and `status` reads that one."""
    from trainer.cli import main as cli

    mine = "# my experiment: a tiny net\n" + TINY.replace("floor = 100000", "floor = 100000  # keep it all")
    run = make_run(tmp_path / "run", mine)
    assert run_learn(run, steps=2)[0] == 0
    assert open(os.path.join(run, CONFIG_FILE)).read() == mine
    effective = open(os.path.join(run, "config.effective.toml")).read()
    assert effective == to_toml(load_config(os.path.join(run, CONFIG_FILE)))

    other = tmp_path / "other.toml"
    other.write_text(TINY.replace("floor = 100000", "floor = 123456"))
    code, lines = run_learn(run, steps=4, config_path=other)
    assert code == 0, lines
    assert open(os.path.join(run, CONFIG_FILE)).read() == mine
    assert any(f"{os.path.join(run, CONFIG_FILE)} is left as you wrote it; this start uses {other}" in ln
               for ln in lines), lines
    assert "floor = 123456" in open(os.path.join(run, "config.effective.toml")).read()
    capsys.readouterr()
    assert cli(["status", run]) == 0
    assert "(floor 123,456)" in capsys.readouterr().out


def test_bad_starts_are_one_line_errors(tmp_path):
    run = make_run(tmp_path / "run")
    assert run_learn(run, steps=2)[0] == 0
    bigger = tmp_path / "bigger.toml"
    bigger.write_text(TINY.replace('net = "1x8"', 'net = "2x8"'))
    code, lines = run_learn(run, steps=4, config_path=bigger)
    assert code == 2 and "model.net" in lines[-1] and "shape" in lines[-1]
    code, lines = run_learn(run, steps=4, devices="gpu:1")
    assert code == 2 and "--devices" in lines[-1]
    code, lines = run_learn(run, steps=4, devices="cpu:3")
    assert code == 2 and "not a multiple of the 3 ranks" in lines[-1]
    import fcntl

    with open(os.path.join(run, "learner.lock"), "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        code, lines = run_learn(run, steps=4)
    assert code == 2 and "another learner is running" in lines[-1]


STOCKFISH = shutil.which("stockfish") or ("/usr/games/stockfish" if os.path.exists("/usr/games/stockfish") else None)


def stockfish_games(n_positions: int, seed: int = 0, input_format: int = 1) -> list[np.ndarray]:
    """Games of stockfish (depth 4, a third of the moves random), every position labelled as a
    teacher would: MultiPV 4 scores softmaxed at 100 cp as the policy, stockfish's WDL as the value,
    the plies to the game's end as moves left; records in lc0's ``input_format``. About 2 ms a position."""
    import chess
    import chess.engine

    rng = random.Random(seed)
    games, total = [], 0
    with chess.engine.SimpleEngine.popen_uci(STOCKFISH) as engine:
        engine.configure({"UCI_ShowWDL": True, "Threads": 1, "Hash": 16})
        while total < n_positions:
            reference, board, records = chess.Board(), Board(), []
            for _ in range(rng.randrange(20, 80)):
                if reference.is_game_over():
                    break
                infos = engine.analyse(reference, chess.engine.Limit(depth=4), multipv=4)
                scores = np.array([i["score"].pov(reference.turn).score(mate_score=3000) for i in infos], float)
                weights = np.exp((scores - scores.max()) / 100.0)
                moves = [i["pv"][0].uci() for i in infos]
                wdl = infos[0]["wdl"].pov(reference.turn)
                win, draw, loss = wdl.wins / 1000, wdl.draws / 1000, wdl.losses / 1000
                played = moves[0] if rng.random() > 0.3 else rng.choice(list(reference.legal_moves)).uci()
                records.append(make_record(board, dict(zip(moves, weights)), result_q=win - loss, result_d=draw,
                                           plies_left=40.0, played=played, root=Eval(win - loss, draw, 40.0),
                                           input_format=input_format))
                reference.push_uci(played)
                board.push_uci(played)
            game = np.array(records, dtype=RECORD_DTYPE)
            game["plies_left"] = np.arange(len(game), 0, -1)
            games.append(game)
            total += len(game)
    return games


@pytest.mark.skipif(STOCKFISH is None, reason="needs stockfish (Debian: apt install stockfish)")
def test_a_tiny_net_trained_on_stockfish_labels_lowers_its_held_out_loss(tmp_path):
    from trainer.run_setup import net_config
    from trainer.loader import validation_batch

    stream = iter(stockfish_games(2000))
    config = TINY.replace('net = "1x8"', 'net = "2x16"').replace("batch_size = 16", "batch_size = 32").replace(
        "checkpoint_every = 4", "checkpoint_every = 100").replace("interval = 2", "interval = 20").replace(
        "validation_positions = 48", "validation_positions = 256").replace("warmup_steps = 2", "warmup_steps = 2\nlr = 0.006")
    run = make_run(tmp_path / "run", config, game=lambda rng: next(stream), games_per_chunk=1, positions=1800)
    code, lines = run_learn(run, steps=50)
    assert code == 0, lines
    cfg = load_config(os.path.join(run, CONFIG_FILE))
    window = WindowConfig(floor=cfg.replay.floor, val_percent=cfg.replay.val_percent)
    held_out = validation_batch(ReplayStore(run), window, 256)
    before = evaluate(build_net(net_config(cfg), seed=cfg.train.seed), held_out, cfg.loss)
    trained = build_net(net_config(cfg), seed=None)
    trained.load_state_dict(torch.load(checkpoint_path(run, 50), weights_only=True)["model"])
    after = evaluate(trained, held_out, cfg.loss)
    # About one pass over ~1,400 training positions (AdamW 6e-3). Measured over four runs (the
    # held-out chunks differ each time): total -0.31..-0.83, policy CE -0.10..-0.22, top-1
    # +0.06..+0.12; the value CE moves either way on a dozen held-out games.
    assert after["total"] < before["total"] - 0.2, (before, after)
    assert after["policy_ce"] < before["policy_ce"] - 0.05, (before, after)
    assert after["policy_top1"] > before["policy_top1"], (before, after)


# --------------------------------------------------------------------------- GPU paths


@pytest.mark.gpu
@pytest.mark.parametrize("net_name", ["2x16", "bt-32x2x2h"])
@pytest.mark.parametrize("amp", ["bf16", "fp16"])
def test_mixed_precision_step_on_cuda_tracks_float32(amp, net_name):
    """The tower and the attention body (its fused attention, smolgen's bias in bf16) alike."""
    device = torch.device("cuda")
    batch = FakeBatch(*(t.to(device) for t in synthetic_batch(64, 0)))
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[amp]
    results = {}
    for precision in ("fp32", amp):
        net = build_net(net_name, seed=1).to(device)
        opt = make_optimizer(net, OptimizerConfig(kind="sgd", lr=0.01))
        scaler = torch.amp.GradScaler("cuda") if precision == "fp16" else None
        first = None
        for _ in range(3):
            stats = train_step(net, opt, [batch], LossConfig(), clip_grad_norm=10.0, scaler=scaler,
                               amp_dtype=None if precision == "fp32" else dtype)
            first = stats["total"].item() if first is None else first
        assert all(torch.isfinite(p).all() for p in net.parameters())
        results[precision] = (first, stats["total"].item())
    assert results[amp][0] == pytest.approx(results["fp32"][0], rel=0.05)
    assert results[amp][1] < results[amp][0]  # three steps on one batch: it fits it


@pytest.mark.gpu
@pytest.mark.parametrize("amp", ["bf16", "fp16"])
def test_learn_on_one_gpu_checkpoints_and_resumes(tmp_path, amp):
    run = make_run(tmp_path / "run", TINY.replace("[train]\n", f'[train]\namp = "{amp}"\n'))
    code, lines = run_learn(run, devices="cuda:0", steps=4)
    assert code == 0, lines
    ckpt = torch.load(checkpoint_path(run, 4), weights_only=True)
    assert (ckpt["scaler"] is not None) == (amp == "fp16")
    code, lines = run_learn(run, devices="cuda:0", steps=6)
    assert code == 0 and any("resuming at step 4" in ln for ln in lines)
    assert os.path.exists(os.path.join(run, "networks", "gen-00002.onnx"))


@pytest.mark.gpu
def test_nccl_ranks_on_two_gpus(tmp_path):
    if torch.cuda.device_count() < 2:
        pytest.skip(f"gpu test: nccl DDP needs two CUDA devices, this machine has {torch.cuda.device_count()}")
    run = make_run(tmp_path / "run")
    code, lines = run_learn(run, devices="cuda:0,1", steps=6)
    assert code == 0, lines
    assert [s for s, _ in list_checkpoints(run)] == [4, 6]


def test_bench_train_measures_every_figure_in_one_run(capsys):
    from trainer.bench import bench_train

    figures = bench_train(device="cpu", net="1x8", batch_size=16, steps=4, log_interval=2, chunks=2,
                          chunk_positions=64, rank_workers=0, loader_workers=1, log=lambda line: None)
    for key in ("raw_samples_per_s", "learner_1_rank_samples_per_s", "learner_2_ranks_samples_per_s",
                "loader_samples_per_s", "learner_1_rank_over_raw", "loader_over_learner", "learner_2_ranks_over_1"):
        assert figures[key] > 0, key
    assert figures["loader_over_learner"] == pytest.approx(
        figures["loader_samples_per_s"] / figures["learner_1_rank_samples_per_s"])
    out = capsys.readouterr().out
    assert "learner / raw" in out and "loader / learner" in out
    json.dumps(figures)  # what --json prints


def test_runs_unchanged_under_torchrun(tmp_path, one_thread):
    """torchrun makes the processes (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT): learn joins as a rank."""
    run = make_run(tmp_path / "run")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "trainer.cli", "learn", run, "--devices", "cpu", "--steps", "4", "--no-progress"]
    proc = subprocess.run(cmd, cwd=REPO, env=one_thread, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert [s for s, _ in list_checkpoints(run)] == [4]
    assert proc.stderr.count("learner: done at step 4") == 1  # rank 0 alone reports
    for rank in (0, 1):  # but every rank says that it joined, and where
        assert re.search(rf"learner: rank {rank} of 2 joined the gloo group on cpu \(.+, pid \d+\)", proc.stderr)
    # and rank 1 its own rate at each log line (rank 0 writes the run's)
    assert re.search(r"learner: rank 1 of 2 on cpu \(.+\): step 2, [\d,]+ samples/s of its slice \(\d+ a step\)",
                     proc.stderr), proc.stderr[-2000:]
    generations = [json.loads(line) for line in open(os.path.join(run, "generations.jsonl"))]
    assert [g["step"] for g in generations] == [4]


def test_resume_exports_a_lost_generation_and_never_reuses_a_number(tmp_path):
    run = make_run(tmp_path / "run")
    assert run_learn(run, steps=8)[0] == 0  # generations 1 (step 4) and 2 (step 8)
    path = os.path.join(run, "generations.jsonl")
    lines = open(path).readlines()
    # Killed between the checkpoint at step 8 and its export: generation 2 is not in the log.
    with open(path, "w") as f:
        f.writelines(lines[:1])
    code, out = run_learn(run, steps=10)
    assert code == 0 and any("generation 2 of step 8 was not exported" in ln for ln in out)
    assert [json.loads(ln)["generation"] for ln in open(path)] == [1, 2, 3]
    # The checkpoints after step 8 are lost, but generation 3 was announced: the next is 4.
    os.remove(checkpoint_path(run, 10))
    code, out = run_learn(run, steps=12)
    assert code == 0 and any("the next generation is 4" in ln for ln in out)
    assert [(g["generation"], g["step"]) for g in map(json.loads, open(path))] == [(1, 4), (2, 8), (3, 10), (4, 12)]


def test_retention_prunes_old_chunks_outside_the_window_and_old_networks(tmp_path):
    """replay.keep_positions and replay.keep_networks act at each checkpoint; a chunk inside the
    window the learner samples is never pruned, whatever keep_positions says."""
    config = TINY.replace("floor = 100000", "floor = 40\nkeep_positions = 1\nkeep_networks = 1")
    run = make_run(tmp_path / "run", config=config, games_per_chunk=1, positions=600)
    store = ReplayStore(run)
    before = store.entries()
    code, lines = run_learn(run, steps=8)
    assert code == 0, lines
    after = store.entries()
    removed = [e for e in before if e not in after]
    assert removed and after == before[len(removed):]  # the oldest went, in order
    assert any("retention: pruned" in line for line in lines)
    for e in removed:
        assert not os.path.exists(os.path.join(run, "replay", "chunks", e.name))
    sampler = ReplaySampler(store, WindowConfig(floor=40, val_percent=30), 16)
    sampler.refresh()
    assert 0 < sampler.window_positions <= sampler.training_positions  # the window is still all there
    assert sorted(os.listdir(os.path.join(run, "networks"))) == ["gen-00002.onnx", "gen-00002.onnx.sha256"]


def test_exporting_a_checkpoint_gives_the_network_the_learner_exported_for_it(tmp_path):
    """`cyzero-train export --checkpoint` (what ships a trained network) takes the weights the
    learner chose for that step (raw or averaged), not always the raw ones."""
    import onnxruntime as ort

    from trainer.cli import main
    from trainer.export import sample_positions

    run = make_run(tmp_path / "run")
    code, lines = run_learn(run, steps=4)
    assert code == 0, lines
    record = json.loads(open(os.path.join(run, "generations.jsonl")).readline())
    planes, _ = sample_positions(16, seed=3)

    def wdl(path):
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        return session.run(["/output/wdl"], {"/input/planes": planes})[0]

    exported = {}
    for weights in ("auto", "raw", "average"):
        out = tmp_path / weights
        args = ["export", "--checkpoint", checkpoint_path(run, 4), "--out", str(out), "--variants", "fp32",
                "--name", "net", "--weights", weights, "--positions", "8"]
        assert main(args) == 0
        exported[weights] = wdl(out / "net.onnx")
    generation = wdl(os.path.join(run, record["onnx"]))
    assert not np.allclose(exported["raw"], exported["average"], atol=1e-4)   # four steps apart
    assert np.allclose(exported["auto"], generation, atol=1e-5)
    assert np.allclose(exported["raw" if record["weights"] == "raw" else "average"], generation, atol=1e-5)
