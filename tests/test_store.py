"""The replay store: durable group commits, the manifest log, retention, lc0 imports."""

import gzip
import io
import json
import logging
import multiprocessing
import os
import tarfile

import numpy as np
import pytest

from trainer.config import is_validation
from trainer.loader import ReplayLoader, ReplaySampler, WindowConfig
from trainer.records import RECORD_DTYPE, read_chunk
from trainer.store import ReplayStore, import_lc0_chunks

NO_VAL = dict(val_percent=0.0)


def _game(ids):
    """Records that say who they are: ``plies_left`` holds each position's id."""
    records = np.zeros(len(ids), dtype=RECORD_DTYPE)
    records["version"] = 6
    records["input_format"] = 1
    records["plies_left"] = ids
    records["probabilities"] = -1.0
    records["probabilities"][:, 0] = 1.0
    records["result_d"] = 1.0
    return records


def _fill(store, sizes, start=0, source="selfplay"):
    """One chunk per size, ids counting up from ``start`` in commit order; returns the entries."""
    entries = []
    for size in sizes:
        entries.append(store.append_games([_game(np.arange(start, start + size))], generation=1, source=source))
        start += size
    return entries


def test_group_commit_is_one_chunk_and_the_same_fsyncs_however_many_games(tmp_path, monkeypatch):
    store = ReplayStore(tmp_path)
    calls = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (calls.append(fd), real_fsync(fd))[1])
    store.append_games([_game([7])], generation=3, source="teacher")   # creates the manifest
    calls.clear()
    one = store.append_games([_game([0, 1])], generation=3, source="teacher")
    fsyncs_for_one = len(calls)
    calls.clear()
    many = store.append_games([_game([i, i]) for i in range(50)], generation=3, source="teacher")
    assert len(calls) == fsyncs_for_one == 3   # the chunk file, its directory, the manifest line
    assert (many.games, many.positions, many.generation, many.source) == (50, 100, 3, "teacher")
    assert one.name != many.name and many.name.startswith("teacher-g00003-") and many.name.endswith(".gz")
    assert len(os.listdir(store.chunks_dir)) == 3   # no temp files left
    assert store.entries()[1:] == [one, many]
    assert ReplayStore(tmp_path).entries()[1:] == [one, many]   # what another process reads
    assert store.total_positions() == 103
    assert np.array_equal(read_chunk(store.chunks_dir / many.name)["plies_left"], np.repeat(np.arange(50), 2))


def test_writer_commits_groups_and_the_rest_on_exit(tmp_path):
    store = ReplayStore(tmp_path)
    with store.writer(generation=0, source="pgn", positions_per_chunk=10) as writer:
        results = [writer.add_game(_game(range(4))) for _ in range(5)]
        assert [r is not None for r in results] == [False, False, True, False, False]
        assert writer.buffered_positions == 8
    assert [e.positions for e in store.entries()] == [12, 8]
    assert writer.committed == store.entries()
    with pytest.raises(ValueError, match="input format 3"):
        bad = _game([1])
        bad["input_format"] = 3
        writer.add_game(bad)
    with pytest.raises(ValueError, match="source"):
        store.append_games([_game([1])], generation=0, source="../x")


def test_torn_manifest_line_is_ignored_and_later_appends_work(tmp_path, caplog):
    store = ReplayStore(tmp_path)
    first = _fill(store, [3])[0]
    with open(store.manifest, "ab") as f:   # a writer killed in the middle of its line
        f.write(b'{"op":"add","name":"selfplay-g00001-dead.gz","posi')
    assert store.entries() == [first]
    second = _fill(store, [4], start=3)[0]
    lines = store.manifest.read_bytes().split(b"\n")
    assert lines[1] == b'{"op":"add","name":"selfplay-g00001-dead.gz","posi' and lines[-1] == b""
    with caplog.at_level(logging.WARNING, logger="cyzero.replay"):
        fresh = ReplayStore(tmp_path)
        assert fresh.entries() == [first, second]
    assert any("torn or malformed line" in r.getMessage() for r in caplog.records)
    # A complete line whose newline has not arrived yet is not read until it has.
    line = json.dumps({"op": "add", "name": "x-g00000-1.gz", "positions": 1, "games": 1, "generation": 0,
                       "source": "x", "time": 1.0})
    with open(store.manifest, "ab") as f:
        f.write(line.encode())
    assert fresh.entries() == [first, second]
    with open(store.manifest, "ab") as f:
        f.write(b"\n")
    assert [e.name for e in fresh.entries()] == [first.name, second.name, "x-g00000-1.gz"]


def _writer_process(run_dir, worker, chunks):
    store = ReplayStore(run_dir)
    for i in range(chunks):
        ids = np.full(1 + (i % 3), worker * 1000 + i)
        store.append_games([_game(ids)], generation=worker, source=f"w{worker}")


def test_concurrent_writers_with_a_reader(tmp_path):
    ctx = multiprocessing.get_context("fork")
    writers = [ctx.Process(target=_writer_process, args=(tmp_path, w, 40)) for w in range(4)]
    ReplayStore(tmp_path)
    for p in writers:
        p.start()
    reader = ReplayStore(tmp_path)
    seen = []
    while any(p.is_alive() for p in writers) or len(seen) < 160:
        entries = reader.entries()
        assert entries[: len(seen)] == seen   # the log only grows
        for entry in entries[len(seen):]:     # every listed chunk is complete and readable
            records = read_chunk(reader.chunks_dir / entry.name)
            assert len(records) == entry.positions
            assert set(records["plies_left"].tolist()) == {records["plies_left"][0]}
        seen = entries
        if len(seen) >= 160:
            break
    for p in writers:
        p.join(30)
        assert p.exitcode == 0
    entries = ReplayStore(tmp_path).entries()
    assert len(entries) == len({e.name for e in entries}) == 160
    for w in range(4):   # each writer's chunks are in its own order
        mine = [e for e in entries if e.source == f"w{w}"]
        assert [int(read_chunk(tmp_path / "replay" / "chunks" / e.name)["plies_left"][0]) for e in mine] == [
            w * 1000 + i for i in range(40)]
    assert all(json.loads(line) for line in (tmp_path / "replay" / "manifest.jsonl").read_text().splitlines())


def test_prune_drops_the_oldest_chunks_outside_the_kept_positions(tmp_path):
    store = ReplayStore(tmp_path)
    entries = _fill(store, [100, 100, 100, 100])
    window = WindowConfig(floor=1000, **NO_VAL)
    with ReplayLoader(store, ReplaySampler(store, window, batch_size=64), workers=0) as loader:
        next(loader)   # builds the cache files
    assert len(os.listdir(store.cache_dir)) == 4
    assert store.prune(400) == [] and store.prune(301) == []
    assert store.prune(250) == [entries[0].name]               # chunk 1 holds part of the newest 250
    assert store.entries() == entries[1:]
    assert sorted(os.listdir(store.chunks_dir)) == sorted(e.name for e in entries[1:])
    assert len(os.listdir(store.cache_dir)) == 3
    assert store.prune(0) == [e.name for e in entries[1:]]
    assert store.entries() == [] and os.listdir(store.chunks_dir) == [] and os.listdir(store.cache_dir) == []
    ops = [json.loads(line)["op"] for line in store.manifest.read_text().splitlines()]
    assert ops == ["add"] * 4 + ["prune", "prune"]
    assert ReplayStore(tmp_path).entries() == []
    with pytest.raises(ValueError, match="keep_positions"):
        store.prune(-1)


def test_pruning_to_the_window_keeps_every_training_chunk_inside_it(tmp_path):
    """The window counts training positions only, so held-out chunks among the newest must not
    count toward what prune keeps: counting them would cut the window's oldest chunk."""
    store = ReplayStore(tmp_path)
    window = WindowConfig(floor=300, val_percent=50.0)
    for _ in range(200):   # chunk names are random: add until a held-out chunk lies inside the window
        _fill(store, [100])
        sampler = ReplaySampler(store, window, batch_size=16)
        if not sampler._plan.names:   # every chunk so far is held out: no window yet
            continue
        first = [e.name for e in store.entries()].index(sampler._plan.names[0])
        held_inside = [e for e in store.entries()[first:] if is_validation(e.name, 50.0)]
        if sampler.training_positions > 600 and held_inside:
            break
    else:
        raise AssertionError("no held-out chunk ever fell inside the window")
    planned = list(sampler._plan.names)
    removed = store.prune(sampler.window_positions, val_percent=50.0)
    assert removed and not set(removed) & set(planned)
    assert [e.name for e in store.entries() if not is_validation(e.name, 50.0)] == planned


def test_prune_clears_what_killed_processes_left_after_an_hour(tmp_path):
    store = ReplayStore(tmp_path)
    kept = _fill(store, [10])[0]
    leftovers = [store.chunks_dir / ".selfplay-g00001-x.gz.tmp-1-ab", store.chunks_dir / "selfplay-g00001-y.gz",
                 store.cache_dir / ".selfplay-g00001-z.rec.tmp-1-cd"]   # the last: a chunk never listed
    for path in leftovers:
        path.write_bytes(b"x")
    young = store.chunks_dir / "selfplay-g00001-young.gz"   # may be a chunk whose line is on its way
    young.write_bytes(b"x")
    for path in leftovers:
        os.utime(path, (1e9, 1e9))
    os.utime(store.chunks_dir / kept.name, (1e9, 1e9))
    assert store.prune(100) == []
    assert sorted(os.listdir(store.chunks_dir)) == sorted([kept.name, young.name])
    assert os.listdir(store.cache_dir) == []


def _lc0_bytes(records):
    return gzip.compress(records.tobytes())


def test_import_lc0_chunks_converts_format_2_and_takes_canonical_ones_into_a_canonical_store(tmp_path, caplog):
    classical = _game(np.arange(0, 5))
    classical["castling_us_oo"] = 1
    fmt2 = _game(np.arange(5, 12))
    fmt2["input_format"] = 2
    fmt2["castling_us_ooo"], fmt2["castling_us_oo"] = 1 << 0, 1 << 7
    fmt2["castling_them_oo"] = 1 << 7
    fmt3 = _game(np.arange(12, 15))
    fmt3["input_format"] = 3
    data = tmp_path / "lc0"
    data.mkdir()
    (data / "training.1.gz").write_bytes(_lc0_bytes(classical))
    (data / "training.2.gz").write_bytes(_lc0_bytes(fmt2))
    (data / "training.3.gz").write_bytes(_lc0_bytes(fmt3))
    (data / "training.4.gz").write_bytes(_lc0_bytes(classical)[:40])   # truncated
    archive = tmp_path / "training-run1.tar"
    with tarfile.open(archive, "w") as tar:
        for i, game in enumerate((_game(np.arange(20, 23)), _game(np.arange(30, 34)))):
            raw = _lc0_bytes(game)
            info = tarfile.TarInfo(f"training-run1/training.{100 + i}.gz")
            info.size = len(raw)
            tar.addfile(info, io.BytesIO(raw))
    store = ReplayStore(tmp_path / "run")
    with caplog.at_level(logging.WARNING, logger="cyzero.replay"):
        summary = import_lc0_chunks(store, [data, archive], positions_per_chunk=10)
    assert (summary.files, summary.positions) == (4, 5 + 7 + 3 + 4)
    assert len(summary.skipped) == 2 and len(caplog.records) == 2
    assert "training.3.gz" in summary.skipped[0] and "input format 3 (INPUT_112_WITH_CANONICALIZATION)" in \
        summary.skipped[0]
    assert "training.4.gz" in summary.skipped[1]
    entries = store.entries()
    assert str(summary) == "imported 4 lc0 games (19 positions) into 2 chunks; skipped 2 files"
    assert entries == summary.chunks and [e.positions for e in entries] == [12, 7]
    assert all(e.source == "lc0" and e.generation == 0 for e in entries)
    assert [e.games for e in entries] == [2, 2]
    records = np.concatenate([read_chunk(store.chunks_dir / e.name) for e in entries])
    assert records["plies_left"].tolist() == [*range(0, 12), 20, 21, 22, 30, 31, 32, 33]
    assert (records["input_format"] == 1).all()
    converted = records[5:12]
    assert (converted["castling_us_ooo"] == 1).all() and (converted["castling_us_oo"] == 1).all()
    assert (converted["castling_them_oo"] == 1).all() and (converted["castling_them_ooo"] == 0).all()
    with pytest.raises(FileNotFoundError, match="nowhere"):
        import_lc0_chunks(store, [tmp_path / "nowhere"])

    canonical = ReplayStore(tmp_path / "canonical", 3)   # a run whose network reads format 3 takes lc0's own
    summary = import_lc0_chunks(canonical, [data], positions_per_chunk=10)
    assert (summary.files, summary.positions) == (1, 3) and len(summary.skipped) == 3
    assert all("cannot be converted to input format 3" in reason for reason in summary.skipped[:2])
    (entry,) = canonical.entries()
    assert read_chunk(canonical.chunks_dir / entry.name, 3).tobytes() == fmt3.tobytes()


def test_game_ids_are_kept_in_the_manifest_for_the_duplicate_check(tmp_path):
    store = ReplayStore(tmp_path)
    store.append_games([_game([1, 2]), _game([3])], generation=2, source="selfplay", game_ids=["a1", "b2"])
    store.append_games([_game([4])], generation=2, source="selfplay")  # ids are optional
    assert store.newest_game_ids() == ["a1", "b2"]
    assert ReplayStore(tmp_path).newest_game_ids(1) == ["b2"]  # a restarted daemon reads them back
    names = [e.name for e in store.entries()]
    store.prune(1)  # pruned chunks' games stay known: a late resend is still a duplicate
    assert len(ReplayStore(tmp_path).entries()) < len(names)
    assert ReplayStore(tmp_path).newest_game_ids() == ["a1", "b2"]
    with pytest.raises(ValueError, match="one string per game"):
        store.append_games([_game([5])], generation=2, source="selfplay", game_ids=["x", "y"])


def test_status_and_the_store_replay_the_manifest_alike(tmp_path):
    """One parser of the log (trainer.rundir.ManifestLog): the live chunks `status` reads are the
    store's, whatever torn, malformed, unknown or pruning lines the log holds."""
    from trainer.rundir import read_manifest

    store = ReplayStore(tmp_path)
    chunks = _fill(store, [3, 2, 4])
    store.append_games([_game([9])], generation=1, source="selfplay", game_ids=["g1"])
    good = {"op": "add", "name": "x-g00000-1.gz", "positions": 1, "games": 1, "generation": 0, "source": "x",
            "time": 1.0}
    with open(store.manifest, "ab") as f:
        for line in (json.dumps({**good, "positions": 0}), json.dumps({**good, "games": True}),
                     json.dumps({**good, "name": "../up.gz"}), json.dumps({**good, "op": "rename"}),
                     json.dumps({"op": "prune", "names": [chunks[1].name]}), '[1, 2]', 'not json',
                     json.dumps({**good, "name": chunks[0].name})):   # a chunk added twice counts once
            f.write(line.encode() + b"\n")
    expected = [chunks[0], chunks[2]]
    assert store.entries()[:2] == expected and len(store.entries()) == 3
    assert read_manifest(str(tmp_path)) == ReplayStore(tmp_path).entries()
