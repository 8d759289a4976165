"""How the learner's batches reach the device (trainer/loader.py's loader, trainer/learner.py's
DeviceFeed and stop vote): packed host buffers, pinned memory and side-stream copies on CUDA only,
and on the CPU the same batches in the same order as ever, so runs and resumes stay identical.

The CUDA paths are marked ``gpu`` and skip here; nothing here times anything.
"""

from __future__ import annotations

import os
import random

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

from trainer.config import CONFIG_FILE, load_config
from trainer.learner import DeviceFeed, Launch, Learner, StopVote, learn, pinned_transfer
from trainer.ranks import join_group, rendezvous_store
from trainer.loader import Batch, ReplayLoader, ReplaySampler, WindowConfig, _pack, _unpack
from trainer.records import decode_records, read_chunk
from trainer.rundir import checkpoint_path
from trainer.store import ReplayStore

from test_learner import TINY, make_run, random_game

pytestmark = [pytest.mark.timeout(180), pytest.mark.usefixtures("one_thread")]


def _store(path, chunks: int = 4, seed: int = 0) -> ReplayStore:
    store = ReplayStore(path)
    rng = random.Random(seed)
    for _ in range(chunks):
        store.append_games([random_game(rng) for _ in range(3)], generation=0, source="test")
    return store


def _expected(store: ReplayStore, sampler: ReplaySampler, k: int, rank: int = 0, world: int = 1) -> list[np.ndarray]:
    """Batch ``k`` of ``sampler``'s plan (this rank's slice), decoded field by field from the chunks."""
    rows = [read_chunk(store.chunks_dir / name)[offsets] for name, offsets in sampler.plan(k)]
    records = np.concatenate(rows)
    a, b = rank * sampler.batch_size // world, (rank + 1) * sampler.batch_size // world
    return list(decode_records(records[a:b]))


def _assert_batch(batch, expected: list[np.ndarray]) -> None:
    assert isinstance(batch, Batch)
    for got, want in zip(batch, expected):
        assert got.dtype == torch.float32 and got.is_contiguous()
        assert np.array_equal(got.numpy(), want.astype(np.float32))


# --------------------------------------------------------------------------- which path


def test_pinned_memory_and_side_stream_copies_are_for_cuda_devices_only():
    assert pinned_transfer("cuda") and pinned_transfer("cuda:1") and pinned_transfer(torch.device("cuda", 0))
    assert not pinned_transfer("cpu") and not pinned_transfer(torch.device("cpu"))
    assert not pinned_transfer("meta")
    assert DeviceFeed("cpu").stream is None


def test_the_cpu_feed_hands_the_loaders_tensors_through_untouched(tmp_path):
    store = _store(tmp_path)
    sampler = ReplaySampler(store, WindowConfig(floor=1000, val_percent=0.0), batch_size=24, seed=3)
    with ReplayLoader(store, sampler, workers=0, pin_memory=True) as loader:
        assert loader.pin_memory is torch.cuda.is_available()
        batch = next(loader)
    moved = DeviceFeed("cpu")(batch)
    assert type(moved) is Batch and all(a is b for a, b in zip(moved, batch))


# --------------------------------------------------------------------------- packed host buffers


def test_a_packed_batch_is_one_buffer_whose_views_are_the_decoded_fields(tmp_path):
    store = _store(tmp_path)
    records = read_chunk(store.chunks_dir / store.entries()[0].name)[:7]
    for shared in (False, True):
        flat = _pack(records, shared=shared)
        assert flat.dim() == 1 and flat.dtype == torch.float32 and flat.is_shared() == shared
        batch = _unpack(flat)
        _assert_batch(batch, list(decode_records(records)))
        assert [tuple(t.shape) for t in batch] == [(7, 112, 8, 8), (7, 1858), (7, 3), (7,)]
        assert all(t.untyped_storage().data_ptr() == flat.untyped_storage().data_ptr() for t in batch)
        assert sum(t.numel() for t in batch) == flat.numel()  # no gaps, no overlaps
    with pytest.raises(ValueError, match="multiple of"):
        _unpack(torch.zeros(flat.numel() + 1))


@pytest.mark.parametrize("workers", [0, 2])
def test_the_loader_yields_the_planned_batches_in_order(tmp_path, workers):
    """Worker processes hand over shared-memory buffers, the loader alone plain ones: both are
    the plan's positions decoded, batch after batch, and the cursor counts what was handed over."""
    store = _store(tmp_path)
    window = WindowConfig(floor=1000, val_percent=0.0)
    sampler = ReplaySampler(store, window, batch_size=24, seed=7)
    plan = ReplaySampler(store, window, batch_size=24, seed=7)
    with ReplayLoader(store, sampler, workers=workers, prefetch=3) as loader:
        for k in range(6):
            _assert_batch(next(loader), _expected(store, plan, k))
            assert sampler.next_batch == k + 1
    for world in (2, 3):
        for rank in range(world):
            sampler = ReplaySampler(store, window, batch_size=24, seed=7)
            with ReplayLoader(store, sampler, rank=rank, world=world, workers=workers) as loader:
                for k in range(2):
                    _assert_batch(next(loader), _expected(store, plan, k, rank, world))


# --------------------------------------------------------------------------- the learner's data path


def _learner(run: str, steps: int | None = None) -> Learner:
    config = load_config(os.path.join(run, CONFIG_FILE))
    launch = Launch(run_dir=run, config=config.to_dict(), kind="cpu", steps=steps, follow=False, progress=False,
                    checkpoint=None, report=False)
    return Learner(launch, 0, 1, torch.device("cpu"), lambda line: None)


@pytest.mark.parametrize("workers", [0, 1])
def test_the_learner_trains_on_the_planned_batches_and_takes_none_ahead(tmp_path, workers):
    """The batches the loop gets are the sampler's plan, in order, and the cursor a checkpoint
    saves has counted exactly the batches trained on (none taken ahead from the loader)."""
    run = make_run(tmp_path / "run", TINY.replace("workers = 0", f"workers = {workers}"))
    learner = _learner(run)
    plan = ReplaySampler(learner.store, learner.window, learner.cfg.train.batch_size, seed=learner.cfg.train.seed)
    plan.refresh()
    try:
        for k in range(5):
            batch = learner._next_batch()
            _assert_batch(batch, _expected(learner.store, plan, k))
            assert learner.sampler.state_dict()["next_batch"] == k + 1
    finally:
        learner.loader.close()


def test_runs_are_identical_with_or_without_loader_workers_and_across_a_resume(tmp_path, one_thread):
    straight = make_run(tmp_path / "straight", TINY.replace("workers = 0", "workers = 1"))
    resumed = make_run(tmp_path / "resumed")
    assert learn(straight, steps=6, progress=False, log=lambda line: None) == 0
    assert learn(resumed, steps=4, progress=False, log=lambda line: None) == 0
    assert learn(resumed, steps=6, progress=False, log=lambda line: None) == 0
    a = torch.load(checkpoint_path(straight, 6), weights_only=True)
    b = torch.load(checkpoint_path(resumed, 6), weights_only=True)
    assert a["sampler"] == b["sampler"] and a["sampler"]["next_batch"] == 6
    for key, value in a["model"].items():
        assert torch.allclose(b["model"][key].float(), value.float(), atol=1e-6), key
    for key, value in a["average"]["weights"].items():
        assert torch.allclose(b["average"]["weights"][key].float(), value.float(), atol=1e-6), key


# --------------------------------------------------------------------------- the stop vote


CALLS = 6
ASKED_AT = 2  # rank 1 is asked to stop before its call number 2 (0-based)


def _vote_rank(rank: int, port: int, answers) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    join_group("gloo", rank, 2, port)
    try:
        for lagged in (False, True):
            vote = StopVote(torch.device("cpu"), lagged=lagged)
            got = [vote(rank == 1 and i >= ASKED_AT) for i in range(CALLS)]
            answers.put((rank, lagged, "steps", got))
        vote = StopVote(torch.device("cpu"), lagged=True)
        got = [vote(False), vote(rank == 0, now=True)]
        answers.put((rank, True, "now", got))
    finally:
        dist.destroy_process_group()


def test_every_rank_reads_the_same_stop_vote_at_the_same_call():
    """At once on the CPU; on CUDA (lagged) one call later, so the host never waits for the step
    it has just queued; all ranks agree either way, and ``now`` answers at once."""
    answers = mp.get_context("spawn").SimpleQueue()
    store = rendezvous_store(2)
    mp.spawn(_vote_rank, args=(store.port, answers), nprocs=2, join=True)
    got: dict = {}
    while not answers.empty():
        rank, lagged, kind, values = answers.get()
        got[rank, lagged, kind] = values
    at_once = [i >= ASKED_AT for i in range(CALLS)]
    one_later = [i >= ASKED_AT + 1 for i in range(CALLS)]
    for rank in (0, 1):
        assert got[rank, False, "steps"] == at_once
        assert got[rank, True, "steps"] == one_later
        assert got[rank, True, "now"] == [False, True]


# --------------------------------------------------------------------------- CUDA


@pytest.mark.gpu
@pytest.mark.parametrize("workers", [0, 2])
def test_cuda_batches_come_pinned_and_reach_the_device_intact_behind_a_busy_stream(tmp_path, workers):
    device = torch.device("cuda", 0)
    store = _store(tmp_path)
    window = WindowConfig(floor=1000, val_percent=0.0)
    plan = ReplaySampler(store, window, batch_size=24, seed=7)
    feed = DeviceFeed(device)
    assert feed.stream is not None and feed.stream != torch.cuda.current_stream(device)
    sampler = ReplaySampler(store, window, batch_size=24, seed=7)
    with ReplayLoader(store, sampler, workers=workers, pin_memory=True) as loader:
        for k in range(4):
            batch = next(loader)
            assert all(t.is_pinned() for t in batch)
            busy = torch.randn(4096, 4096, device=device)
            for _ in range(8):  # keep the compute stream busy while the copy is queued beside it
                busy = busy @ busy / 64
            moved = feed(batch)
            assert all(t.device == device for t in moved)
            sums = [t.double().sum() for t in moved]  # on the compute stream, after the copy's event
            expected = _expected(store, plan, k)
            for total, want in zip(sums, expected):
                assert total.item() == pytest.approx(float(want.astype(np.float64).sum()), rel=1e-9, abs=1e-6)
            del batch
    torch.cuda.synchronize(device)


@pytest.mark.gpu
def test_the_cuda_stop_vote_answers_one_call_later_or_at_once(tmp_path):
    import torch.distributed as dist

    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
    try:
        vote = StopVote(device, lagged=True)
        assert vote.host.is_pinned()
        assert [vote(False), vote(True), vote(True), vote(True)] == [False, False, True, True]
        vote = StopVote(device, lagged=True)
        assert [vote(False), vote(True, now=True)] == [False, True]
    finally:
        dist.destroy_process_group()


@pytest.mark.gpu
def test_a_cuda_learner_runs_and_resumes_through_the_feed(tmp_path):
    run = make_run(tmp_path / "run", TINY.replace("workers = 0", "workers = 2"))
    assert learn(run, devices="cuda:0", steps=4, progress=False, log=lambda line: None) == 0
    assert learn(run, devices="cuda:0", steps=6, progress=False, log=lambda line: None) == 0
    final = torch.load(checkpoint_path(run, 6), weights_only=True)
    assert final["sampler"]["next_batch"] == 6
    assert all(torch.isfinite(v.float()).all() for v in final["model"].values())
