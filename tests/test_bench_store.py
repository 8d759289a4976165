"""trainer.bench_store: a small store made as the daemon writes one, and figures that agree with the
files and with what the loaders report. No speed assertions: the figures belong in the benchmark's
report, and this machine is shared."""

from __future__ import annotations

import json
import os

import pytest

pytest.importorskip("torch", reason="the loader is torch's DataLoader (pip install 'cyzero[train]')")

from trainer.bench_store import MARK, bench_store, format_store_report, make_store  # noqa: E402
from trainer.config import is_validation  # noqa: E402
from trainer.records import RECORD_BYTES, read_chunk  # noqa: E402
from trainer.store import ReplayStore  # noqa: E402

pytestmark = pytest.mark.timeout(300)


def test_the_store_is_made_as_the_daemon_writes_it_and_completed_not_rewritten(tmp_path):
    folder = str(tmp_path / "store")
    written = make_store(folder, 6000, val_percent=5.0, positions_per_generation=2000)
    store = ReplayStore(folder)
    entries = store.entries()
    assert written["positions"] == sum(e.positions for e in entries) >= 6000
    assert written["chunks"] == len(entries) and written["games"] == sum(e.games for e in entries)
    train = [e for e in entries if not is_validation(e.name, 5.0)]
    assert written["games"] % 64 == 0 and len(train) == written["games"] // 64   # a flush of 64 games, a chunk
    assert all(e.games >= 56 for e in train)                                      # (less the held out)
    assert sorted({e.generation for e in entries}) == [0, 1, 2, 3][:len({e.generation for e in entries})]
    held = sum(e.positions for e in entries if is_validation(e.name, 5.0))
    assert 0.04 < held / written["positions"] < 0.06
    # every game is its own gzip member, as a worker sent it, and the chunk reads as one stream
    assert sum(len(read_chunk(store.chunks_dir / e.name)) for e in entries) == written["positions"]
    assert len(store.newest_game_ids()) == written["games"]
    # a second call adds only what is missing
    assert make_store(folder, 6000)["positions"] == 0
    more = make_store(folder, 9000, val_percent=5.0)
    assert more["positions"] > 0 and ReplayStore(folder).total_positions() == written["positions"] + more["positions"]


def test_it_refuses_a_folder_it_did_not_make(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.toml").write_text("")
    with pytest.raises(ValueError, match="not a store `bench store` made"):
        make_store(str(run), 100)
    assert sorted(os.listdir(run)) == ["config.toml"]


def test_the_figures_agree_with_the_files_and_the_gzip_figures_read_gzip(tmp_path):
    folder = tmp_path / "store"
    figures = bench_store(run_dir=str(folder), positions=8000, window_positions=5000, batches=1, ranks=(1, 2),
                          rank_workers=0, log=lambda line: None)
    assert json.loads((folder / MARK).read_text())["input_format"] == 1
    store = ReplayStore(folder)
    s = figures["store"]
    assert s["positions"] == store.total_positions() == figures["written_now"]["positions"]
    chunk_bytes = sum(os.path.getsize(store.chunks_dir / e.name) for e in store.entries())
    assert s["chunk_bytes"] == chunk_bytes and s["chunk_bytes_per_position"] == chunk_bytes / s["positions"]
    assert s["manifest_bytes"] == os.path.getsize(store.manifest)
    assert 150 < s["chunk_bytes_per_position"] < 250   # self-play records, compressed as a worker compresses them
    m, c = figures["manifest"], figures["cache"]
    assert m["training_positions"] + m["held_out_positions"] == s["positions"]
    assert m["window_positions"] == 5000 and c["window_bytes"] == 5000 * RECORD_BYTES
    assert c["window_fits"] and c["measured_window_positions"] == 5000
    rows = {(r["mode"], r["ranks"]): r for r in figures["loader"]}
    assert sorted(rows) == [("cache", 1), ("cache", 2), ("gzip", 1), ("gzip", 2)]
    for (mode, ranks), r in rows.items():
        other = "gzip" if mode == "cache" else "cache"
        assert r["chunk_loads"][mode] > 0 and r["chunk_loads"][other] == 0, r
        assert r["samples_per_s"] > 0 and r["batch_size"] == 1024   # the gpu config's global batch
    report = format_store_report(figures)
    assert f"{s['positions']:,} positions" in report and "gzip  2 rank(s)" in report
