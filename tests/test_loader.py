"""The loader: the window, the cursor, the batches per rank, unreadable chunks, the cache."""

import collections
import errno
import gzip
import json
import logging
import math
import os

import numpy as np
import pytest

import trainer.loader as loader_mod
import trainer.store as store_mod
from trainer.config import is_validation, window_size
from trainer.loader import DataStarved, ReplayLoader, ReplaySampler, WindowConfig, validation_batch
from trainer.records import read_chunk
from trainer.store import ReplayStore

from test_store import NO_VAL, _fill, _game


def _ids(batch):
    return batch.plies_left.numpy().astype(np.int64)


def test_window_size_is_katagos_formula():
    # floor 250,000, alpha 0.65, beta 0.4, N = 1,000,000 positions, by hand:
    #   N^0.65 = 10^3.9 = 7943.282;  250000^0.65 = e^(0.65 * 12.429216) = e^8.078990 = 3225.975
    #   250000^-0.35 = e^(-4.350226) = 0.01290390;  alpha * that = 0.00838754
    #   W = 250000 + 0.4 * (7943.282 - 3225.975) / 0.00838754 = 250000 + 1886.923 / 0.00838754 = 474967.5
    assert abs(window_size(1_000_000, floor=250_000) - 474_967) <= 1
    # N = 10,000,000: N^0.65 = 10^4.55 = 35481.339; W = 250000 + 0.4 * 32255.364 / 0.00838754 = 1,788,252
    assert abs(window_size(10_000_000, floor=250_000) - 1_788_252) <= 1
    # Small run, floor 1000, N 4000, beta 0.5, alpha 0.5: W = 1000 + 0.5 * (63.2456 - 31.6228) / (0.5 / 31.6228)
    #   = 1000 + 0.5 * 31.6228 * 63.2456 = 1000 + 1000.0 = 2000
    assert window_size(4000, floor=1000, alpha=0.5, beta=0.5) == 2000
    assert window_size(250_000, floor=250_000) == 250_000
    assert window_size(1234, floor=250_000) == 1234
    assert window_size(0, floor=10) == 0
    with pytest.raises(ValueError, match="floor"):
        window_size(10, floor=0)


def test_sampling_is_uniform_over_the_window_of_training_positions(tmp_path):
    store = ReplayStore(tmp_path)
    _fill(store, [100, 50, 150, 100, 100])   # ids 0..499
    window = WindowConfig(floor=200, alpha=0.5, beta=0.5, **NO_VAL)
    # W = 200 + 0.5 * (sqrt(500) - sqrt(200)) / (0.5 / sqrt(200)) = 200 + (22.3607 - 14.1421) * 14.1421 = 316
    sampler = ReplaySampler(store, window, batch_size=256, seed=7)
    assert (sampler.training_positions, sampler.window_positions) == (500, 316)
    counts = np.zeros(500, dtype=np.int64)
    for k in range(200):
        plan = sampler.plan(k)
        assert sum(len(o) for _, o in plan) == 256
        again = sampler.plan(k)
        assert len(plan) == len(again) and all(
            a[0] == b[0] and np.array_equal(a[1], b[1]) for a, b in zip(plan, again))
        for name, offsets in plan:
            ids = read_ids(store, name)[offsets]
            np.add.at(counts, ids, 1)
    assert counts[: 500 - 316].sum() == 0
    inside = counts[500 - 316:]
    expected = 200 * 256 / 316
    chi2 = ((inside - expected) ** 2 / expected).sum()
    assert chi2 < 316 + 6 * math.sqrt(2 * 316)   # 315 degrees of freedom, six sigma
    assert inside.min() > 0.6 * expected and inside.max() < 1.4 * expected
    # Different seeds, different batches, different plans.
    assert not np.array_equal(replay_flat(sampler, 0), replay_flat(sampler, 1))


_ID_CACHE = {}


def read_ids(store, name):
    if name not in _ID_CACHE:
        _ID_CACHE[name] = read_chunk(store.chunks_dir / name)["plies_left"].astype(np.int64)
    return _ID_CACHE[name]


def replay_flat(sampler, k):
    return np.concatenate([read_ids(sampler.store, n)[o] for n, o in sampler.plan(k)])


def test_validation_chunks_are_held_out(tmp_path, monkeypatch):
    counter = iter(range(1, 1000))
    monkeypatch.setattr(store_mod.uuid, "uuid4", lambda: store_mod.uuid.UUID(int=next(counter)))  # fixed names
    names = [f"selfplay-g00001-{i:032x}.gz" for i in range(4000)]
    share = sum(is_validation(n, 5.0) for n in names) / len(names)
    assert 0.035 < share < 0.065
    assert [is_validation(n, 5.0) for n in names[:50]] == [is_validation(n, 5.0) for n in names[:50]]
    assert not any(is_validation(n, 0.0) for n in names) and all(is_validation(n, 100.0) for n in names)

    store = ReplayStore(tmp_path)
    assert validation_batch(store, WindowConfig(), 10) is None
    entries = _fill(store, [20] * 12)
    window = WindowConfig(floor=10_000, val_percent=40.0)
    held = {e.name for e in entries if is_validation(e.name, 40.0)}
    assert 2 <= len(held) <= 10
    held_ids = np.concatenate([read_ids(store, n) for n in held])
    sampler = ReplaySampler(store, window, batch_size=64)
    assert sampler.training_positions == 20 * (12 - len(held))
    drawn = np.concatenate([replay_flat(sampler, k) for k in range(30)])
    assert not np.isin(drawn, held_ids).any()
    val = validation_batch(store, window, 25, seed=3)
    assert val.planes.shape == (25, 112, 8, 8) and val.policy.shape == (25, 1858)
    assert np.isin(_ids(val), held_ids).all() and len(set(_ids(val))) == 25
    assert np.array_equal(_ids(validation_batch(store, window, 25, seed=3)), _ids(val))   # fixed


def test_held_out_games_keep_their_share_from_the_first_game_and_name_their_chunks_so(tmp_path):
    """Issue 46: a young run held nothing out (5% of whole chunks by their names' hash). hold_out
    holds out the first game and then keeps the held-out share at val_percent; append_games names
    such a chunk so that is_validation, which every reader uses, agrees with the choice."""
    assert store_mod.hold_out([70], 0, 0, 5.0) == [True]            # the first game of a run
    flags = store_mod.hold_out([70] * 100, 0, 0, 5.0)
    held = 70 * sum(flags)
    assert flags[0] and 0.05 * 7000 <= held <= 0.05 * 7000 + 70   # 5%, at most one game over
    assert all(flags[i] for i in (0, 20, 40, 60, 80)) and not any(flags[1:20])
    assert store_mod.hold_out([70, 70], 55, 1000, 5.0) == [False, True]  # the store's own share counts
    assert store_mod.hold_out([70] * 5, 0, 0, 0.0) == [False] * 5

    store = ReplayStore(tmp_path)
    games = [_game(np.arange(i * 10, i * 10 + 10)) for i in range(3)]
    chosen = [store.append_games([g], generation=1, source="selfplay", held_out=flag, val_percent=5.0)
              for g, flag in zip(games, (True, False, True))]
    assert [is_validation(e.name, 5.0) for e in chosen] == [True, False, True]
    assert store.held_out_positions(5.0) == (20, 30)
    sampler = ReplaySampler(store, WindowConfig(floor=1000, val_percent=5.0), batch_size=4)
    assert (sampler.training_positions, sampler.held_out_positions) == (10, 20)
    assert set(_ids(validation_batch(store, WindowConfig(val_percent=5.0), 20))) == set(range(0, 10)) | set(range(20, 30))
    with pytest.raises(ValueError, match="val_percent = 0"):
        store.append_games([games[0]], generation=1, source="selfplay", held_out=True, val_percent=0.0)


def test_the_validation_sample_spans_the_newest_held_out_chunks(tmp_path):
    store = ReplayStore(tmp_path)
    entries = _fill(store, [100] * 6)
    window = WindowConfig(floor=10_000, val_percent=100.0)
    chunk_of = {i: e.name for e in entries for i in read_ids(store, e.name)}
    val = validation_batch(store, window, 50, seed=1)
    used = {chunk_of[i] for i in _ids(val)}
    newest = {e.name for e in entries[-2:]}   # 4 x 50 positions: the two newest chunks
    assert used == newest


def test_a_store_whose_every_chunk_is_held_out_says_so_and_how_to_train(tmp_path):
    store = ReplayStore(tmp_path)
    _fill(store, [30])
    sampler = ReplaySampler(store, WindowConfig(floor=1000, val_percent=100.0), batch_size=8)
    assert (sampler.training_positions, sampler.held_out_positions) == (0, 30)
    with pytest.raises(DataStarved) as exc:
        sampler.advance()
    message = str(exc.value)
    assert "all 30 positions" in message and "held out for validation" in message
    assert "replay.val_percent = 0" in message and "\n" not in message
    assert ReplaySampler(store, WindowConfig(floor=1000, **NO_VAL), batch_size=8).held_out_positions == 0


def test_the_loader_blends_the_search_value_into_the_target_but_validation_keeps_the_result(tmp_path):
    store = ReplayStore(tmp_path)
    records = _game(np.arange(64))
    records["result_q"], records["result_d"] = 1.0, 0.0       # every position's game was won
    records["best_q"], records["best_d"] = -0.5, 0.5          # the search thought it was lost
    store.append_games([records], generation=1, source="selfplay")
    window = WindowConfig(floor=1000, **NO_VAL)
    for q_ratio, expected in ((0.0, [1.0, 0.0, 0.0]), (0.25, [0.75, 0.125, 0.125])):
        for workers in (0, 1):
            loader = ReplayLoader(store, ReplaySampler(store, window, batch_size=16), workers=workers,
                                  q_ratio=q_ratio)
            with loader:
                np.testing.assert_allclose(next(loader).wdl.numpy(), np.tile(expected, (16, 1)), atol=1e-6)
    held_out = WindowConfig(floor=1000, val_percent=100.0)
    np.testing.assert_allclose(validation_batch(store, held_out, 8).wdl.numpy(), np.tile([1.0, 0, 0], (8, 1)))


def test_cap_starves_the_loader_until_new_data_arrives(tmp_path):
    store = ReplayStore(tmp_path)
    _fill(store, [40, 40])
    window = WindowConfig(floor=1000, max_samples_per_position=2.0, **NO_VAL)
    sampler = ReplaySampler(store, window, batch_size=32)
    loader = ReplayLoader(store, sampler, workers=0)
    got = [next(loader) for _ in range(5)]       # 2 x 80 = 160 samples: five batches of 32
    assert sampler.samples_drawn == 160
    with pytest.raises(DataStarved, match=r"192.*cap of 2 per training position x 80 positions = 160.*add data"):
        next(loader)
    sampler.refresh()                            # nothing new: still starved
    with pytest.raises(DataStarved):
        next(loader)
    _fill(store, [40], start=80)
    sampler.refresh()                            # 2 x 120 = 240: two more batches
    got += [next(loader), next(loader)]
    with pytest.raises(DataStarved):
        next(loader)
    assert sampler.next_batch == 7 and sum(sampler.chunk_samples.values()) == 7 * 32
    assert all(b.planes.shape == (32, 112, 8, 8) for b in got)
    empty = ReplaySampler(ReplayStore(tmp_path / "empty"), window, batch_size=8)
    with pytest.raises(DataStarved, match="no training positions"):
        next(ReplayLoader(empty.store, empty, workers=0))


def test_the_loader_keeps_its_worker_processes_from_one_snapshot_to_the_next(tmp_path):
    """Under the daemon the learner reaches the cap, waits for games and takes a new snapshot many
    times an hour: the loader's worker processes are started once, each new plan goes to the same
    ones, and the batches are those a loader without workers gives (the plan, not the workers,
    decides them). Its rates say what the workers could deliver and how long the caller waited."""
    def play(workers):
        store = ReplayStore(tmp_path / f"w{workers}")
        _fill(store, [40, 40])
        window = WindowConfig(floor=1000, max_samples_per_position=2.0, **NO_VAL)
        sampler = ReplaySampler(store, window, batch_size=32, seed=3)
        got, pids = [], []
        with ReplayLoader(store, sampler, workers=workers, prefetch=2) as loader:
            for start in (80, 120, 160, 200):
                while True:
                    try:
                        got.append(_ids(next(loader)))
                    except DataStarved:
                        break
                    if workers:
                        pids.append(tuple(sorted(w.pid for w in loader._iter._workers)))
                _fill(store, [40], start=start)   # new games
                sampler.refresh()
            rates = loader.rates(busy_s=1.0)
            assert loader.plans == 4
        return got, set(pids), rates

    direct, _, _ = play(0)
    pooled, pids, rates = play(2)
    assert len(direct) == 5 + 2 + 3 + 2 and all(np.array_equal(a, b) for a, b in zip(direct, pooled))
    assert len(pids) == 1 and len(next(iter(pids))) == 2       # the same two processes for all four plans
    assert rates["loader_samples_per_s"] > 0 and 0 <= rates["loader_wait_share"] <= 1


def test_a_resumed_cursor_plans_and_loads_the_same_batches(tmp_path):
    store = ReplayStore(tmp_path)
    _fill(store, [30, 50, 20])
    window = WindowConfig(floor=60, **NO_VAL)
    first = ReplaySampler(store, window, batch_size=16, seed=11)
    with ReplayLoader(store, first, workers=0) as loader:
        for _ in range(4):
            next(loader)
        state = json.loads(json.dumps(first.state_dict()))
        assert state["next_batch"] == 4 and state["samples_drawn"] == 64 and state["seed"] == 11
        assert sum(state["chunk_samples"].values()) == 64
        later = [_ids(next(loader)) for _ in range(6)]
    _fill(store, [100], start=100)    # data that arrived after the checkpoint
    resumed = ReplaySampler(ReplayStore(tmp_path), window, batch_size=16)
    assert resumed.training_positions == 200
    resumed.load_state_dict(state)
    assert resumed.training_positions == 100 and resumed.next_batch == 4
    for k in range(4, 10):
        a, b = first.plan(k), resumed.plan(k)
        assert [n for n, _ in a] == [n for n, _ in b]
        assert all(np.array_equal(x, y) for (_, x), (_, y) in zip(a, b))
    with ReplayLoader(resumed.store, resumed, workers=2) as loader:
        again = [_ids(next(loader)) for _ in range(6)]
    assert all(np.array_equal(x, y) for x, y in zip(later, again))
    assert resumed.state_dict() == first.state_dict()
    resumed.refresh()                 # the new chunk enters the window from here on
    assert resumed.training_positions == 200
    with pytest.raises(ValueError, match="cursor was taken at 99"):
        resumed.load_state_dict({**state, "snapshot_records": 99})


def test_rank_slices_partition_the_global_batch(tmp_path):
    store = ReplayStore(tmp_path)
    _fill(store, [50, 70])
    window = WindowConfig(floor=1000, **NO_VAL)
    whole = ReplayLoader(store, ReplaySampler(store, window, batch_size=30, seed=5), workers=0)
    expected = [next(whole) for _ in range(3)]
    for world in (2, 4):
        ranks = [ReplayLoader(store, ReplaySampler(store, window, batch_size=30, seed=5), rank=r, world=world,
                              workers=0) for r in range(world)]
        for batch in expected:
            parts = [next(r) for r in ranks]
            assert [len(p.plies_left) for p in parts] == [(r + 1) * 30 // world - r * 30 // world
                                                          for r in range(world)]
            for field in range(4):
                assert np.array_equal(np.concatenate([p[field].numpy() for p in parts]), batch[field].numpy())


def test_corrupt_chunk_is_logged_once_and_replaced_deterministically(tmp_path, caplog):
    store = ReplayStore(tmp_path)
    entries = _fill(store, [40, 40, 40, 40, 40])
    truncated = store.chunks_dir / entries[1].name
    truncated.write_bytes(truncated.read_bytes()[:100])
    old_version = _game(np.arange(120, 160))
    old_version["version"] = 5
    (store.chunks_dir / entries[3].name).write_bytes(gzip.compress(old_version.tobytes()))
    window = WindowConfig(floor=1000, **NO_VAL)
    with caplog.at_level(logging.WARNING, logger="cyzero.replay"):
        with ReplayLoader(store, ReplaySampler(store, window, batch_size=64, seed=1), workers=2) as loader:
            first = [_ids(next(loader)) for _ in range(8)]
    lines = sorted((r.getMessage() for r in caplog.records), key=lambda line: entries[3].name in line)
    assert len(lines) == 2 and all("skipping chunk" in line for line in lines)
    assert entries[1].name in lines[0] and entries[3].name in lines[1] and "version 5" in lines[1]
    drawn = np.concatenate(first)
    assert not np.isin(drawn, np.arange(40, 80)).any() and not np.isin(drawn, np.arange(120, 160)).any()
    for good in (0, 2, 4):
        assert np.isin(np.arange(40 * good, 40 * good + 40), drawn).any()
    assert sorted(store.bad_chunks()) == sorted([entries[1].name, entries[3].name])
    # Another loader (another rank, a resumed run) makes the same replacements, without a new log line.
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="cyzero.replay"):
        with ReplayLoader(store, ReplaySampler(store, window, batch_size=64, seed=1), workers=0) as loader:
            second = [_ids(next(loader)) for _ in range(8)]
    assert not caplog.records
    assert all(np.array_equal(a, b) for a, b in zip(first, second))
    # The replacement does not depend on who found the chunk bad: a fresh cache gives the same batches.
    for file in os.listdir(store.cache_dir):
        os.unlink(store.cache_dir / file)
    with ReplayLoader(store, ReplaySampler(store, window, batch_size=64, seed=1), workers=0) as loader:
        assert all(np.array_equal(a, _ids(next(loader))) for a in first)


def test_loader_throughput_runs(tmp_path):
    store = ReplayStore(tmp_path)
    _fill(store, [200, 200])
    rate = loader_mod.loader_throughput(store, WindowConfig(floor=1000, **NO_VAL), batch_size=64, workers=1, batches=3)
    assert rate > 0


def test_ranks_refresh_to_the_snapshot_rank_0_took(tmp_path):
    store = ReplayStore(tmp_path)
    _fill(store, [30, 30])
    window = WindowConfig(floor=1000, **NO_VAL)
    rank0 = ReplaySampler(store, window, batch_size=8, seed=2)
    _fill(store, [30], start=60)          # arrives between rank 0's refresh and rank 1's
    rank1 = ReplaySampler(ReplayStore(tmp_path), window, batch_size=8, seed=2)
    assert rank1.training_positions == 90
    rank1.refresh(rank0.snapshot_records)
    assert rank1.training_positions == 60 and rank1.state_dict() == rank0.state_dict()
    assert np.array_equal(replay_flat(rank0, 3), replay_flat(rank1, 3))


def test_few_open_maps_and_transient_errors(tmp_path, monkeypatch):
    store = ReplayStore(tmp_path)
    _fill(store, [10] * 6)
    window = WindowConfig(floor=1000, **NO_VAL)
    with ReplayLoader(store, ReplaySampler(store, window, batch_size=32, seed=4), workers=0) as loader:
        expected = [_ids(next(loader)) for _ in range(4)]
    monkeypatch.setattr(loader_mod, "_MAX_OPEN_CHUNKS", 2)
    with ReplayLoader(store, ReplaySampler(store, window, batch_size=32, seed=4), workers=0) as loader:
        assert all(np.array_equal(e, _ids(next(loader))) for e in expected)
    # Too many open files says nothing about a chunk: the loader stops rather than mark it bad.
    for file in os.listdir(store.cache_dir):
        os.unlink(store.cache_dir / file)

    def emfile(path, input_format=1):
        raise OSError(errno.EMFILE, "Too many open files", str(path))

    monkeypatch.setattr(loader_mod, "read_chunk", emfile)
    with ReplayLoader(store, ReplaySampler(store, window, batch_size=32, seed=4), workers=0) as loader:
        with pytest.raises(OSError, match="Too many open files"):
            next(loader)
    assert store.bad_chunks() == {}


def test_a_disk_near_full_gets_no_more_cache_and_the_batches_stay_the_same(tmp_path, monkeypatch, caplog):
    store = ReplayStore(tmp_path)
    _fill(store, [10] * 6)
    window = WindowConfig(floor=1000, **NO_VAL)
    with ReplayLoader(store, ReplaySampler(store, window, batch_size=32, seed=4), workers=0) as loader:
        expected = [_ids(next(loader)) for _ in range(4)]
    cached = sorted(os.listdir(store.cache_dir))
    assert len(cached) == 6
    for file in cached:
        os.unlink(store.cache_dir / file)
    # 5% of the disk free, under the reserve: nothing is cached, the chunks are read as they are,
    # at most 2 kept in memory, and the learner's log says why it is slower, once.
    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(loader_mod.shutil, "disk_usage", lambda path: usage(100 << 30, 95 << 30, 5 << 30))
    monkeypatch.setattr(loader_mod, "_MAX_LOOSE_BYTES", 2 * 10 * loader_mod.RECORD_BYTES)
    readers = []

    class Reader(loader_mod._BatchReader):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            readers.append(self)

    monkeypatch.setattr(loader_mod, "_BatchReader", Reader)
    with caplog.at_level(logging.WARNING, logger="cyzero.replay"):
        with ReplayLoader(store, ReplaySampler(store, window, batch_size=32, seed=4), workers=0) as loader:
            for e in expected:
                assert np.array_equal(e, _ids(next(loader)))
                assert len(readers[0]._open) <= 2 and readers[0]._loose_bytes <= 2 * 10 * loader_mod.RECORD_BYTES
    assert os.listdir(store.cache_dir) == []
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "5.4 GB free" in lines[0] and "too little to cache" in lines[0]
    # 20% free: the cache fills again.
    monkeypatch.setattr(loader_mod.shutil, "disk_usage", lambda path: usage(100 << 30, 80 << 30, 20 << 30))
    with ReplayLoader(store, ReplaySampler(store, window, batch_size=32, seed=4), workers=0) as loader:
        assert all(np.array_equal(e, _ids(next(loader))) for e in expected)
    assert sorted(os.listdir(store.cache_dir)) == cached


def test_the_learner_samples_only_games_of_the_generations_inside_its_window(tmp_path):
    """Self-play chunks carry the generation that played them: as the run grows, the window
    slides past the oldest generations' games and the sampler never draws them again."""
    store = ReplayStore(tmp_path)
    for generation in range(10):   # 100 positions a generation, in the order they were played
        store.append_games([_game(np.arange(100 * generation, 100 * (generation + 1)))],
                           generation=generation, source="selfplay", game_ids=[f"g{generation}"])
    window = WindowConfig(floor=250, alpha=0.5, beta=0.5, **NO_VAL)
    sampler = ReplaySampler(store, window, batch_size=64, seed=3)
    generation_of = {e.name: e.generation for e in store.entries()}
    drawn = collections.Counter()
    for k in range(100):
        for name, offsets in sampler.plan(k):
            drawn[generation_of[name]] += len(offsets)
    oldest_inside = (1000 - sampler.window_positions) // 100
    assert sampler.window_positions < 1000 and oldest_inside >= 1
    assert min(drawn) == oldest_inside and max(drawn) == 9
    assert all(drawn[g] > 0 for g in range(oldest_inside + 1, 10))


def _fill_as_the_daemon(store, chunks, games=4, size=10):
    """Chunks of ``games`` games of ``size`` records, each game its own gzip member (the daemon's
    write, ``members=``), ids counting up in commit order."""
    from trainer.records import compress_records

    start = 0
    for _ in range(chunks):
        arrays = [_game(np.arange(start + g * size, start + (g + 1) * size)) for g in range(games)]
        store.append_games(arrays, generation=1, source="selfplay", members=[compress_records(a) for a in arrays])
        start += games * size


def test_without_the_cache_a_daemon_chunk_is_read_game_by_game_and_the_batches_stay_the_same(tmp_path):
    store = ReplayStore(tmp_path)
    _fill_as_the_daemon(store, 5)
    window = WindowConfig(floor=1000, **NO_VAL)
    readers = []

    class Reader(loader_mod._BatchReader):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            readers.append(self)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(loader_mod, "_BatchReader", Reader)
        with ReplayLoader(store, ReplaySampler(store, window, batch_size=32, seed=4), workers=0,
                          cache=False) as loader:
            gzip_batches = [_ids(next(loader)) for _ in range(4)]
            assert loader.chunk_loads == {"cache": 0, "gzip": 5}
    # each chunk kept as its compressed bytes, indexed by game: no cache written, no chunk inflated whole
    assert os.listdir(store.cache_dir) == []
    assert all(isinstance(c, loader_mod._GzipChunk) and len(c.bounds) == 5 for c in readers[0]._open.values())
    assert readers[0]._loose_bytes == sum(os.path.getsize(store.chunks_dir / e.name) for e in store.entries())
    with ReplayLoader(store, ReplaySampler(store, window, batch_size=32, seed=4), workers=0) as loader:
        assert all(np.array_equal(b, _ids(next(loader))) for b in gzip_batches)
        assert loader.chunk_loads == {"cache": 5, "gzip": 0}
    assert len(os.listdir(store.cache_dir)) == 5


def test_a_broken_game_read_alone_marks_its_chunk_bad_and_its_positions_are_redrawn(tmp_path, caplog):
    store = ReplayStore(tmp_path)
    _fill_as_the_daemon(store, 3)
    entry = store.entries()[1]
    path = store.chunks_dir / entry.name
    raw = bytearray(path.read_bytes())
    first, _ = loader_mod._member_index(bytes(raw), entry.positions)
    raw[first[2] + 12:first[3] - 8] = bytes(len(raw[first[2] + 12:first[3] - 8]))   # game 2's deflate data zeroed
    path.write_bytes(bytes(raw))
    window = WindowConfig(floor=1000, **NO_VAL)
    with caplog.at_level(logging.WARNING, logger="cyzero.replay"):
        with ReplayLoader(store, ReplaySampler(store, window, batch_size=64, seed=1), workers=0,
                          cache=False) as loader:
            ids = np.concatenate([_ids(next(loader)) for _ in range(3)])
    assert ((ids < 40) | (ids >= 80)).all()            # chunk 1 holds ids 40-79: none drawn once it was found bad
    assert list(store.bad_chunks()) == [entry.name]
    assert any(entry.name in r.getMessage() for r in caplog.records)


def test_member_index_reads_only_whole_game_members(tmp_path):
    from trainer.records import compress_records

    games = [_game(np.arange(i * 7, i * 7 + 7)) for i in range(3)]
    raw = b"".join(compress_records(g) for g in games)
    bounds, first = loader_mod._member_index(raw, 21)
    assert first.tolist() == [0, 7, 14, 21] and bounds[-1] == len(raw)
    assert loader_mod._member_index(raw, 20) is None                          # the trailers do not add up: read whole
    assert loader_mod._member_index(gzip.compress(np.concatenate(games).tobytes()), 21) is None   # one member
