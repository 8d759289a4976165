"""``cyzero-train bench store``: one daemon's replay store at scale (docs/scale.md, "Storage").

It makes a store of ``--positions`` synthetic self-play positions the way the daemon writes one
(64 games of about 40 V6 records a chunk, each game the gzip member a worker sent, through
:meth:`trainer.store.ReplayStore.append_games`, held-out games in chunks of their own, a new
generation every 100,000 positions), then measures what reads it:

* the bytes a position takes on disk, chunks and manifest apart, and the decompressed cache the
  loader wants for the window (and for the whole store), against the room the disk has for it;
* the manifest's load time (a fresh :class:`ReplayStore` reading it all) and the sampler's build
  time and memory (tracemalloc, and the process's resident growth);
* the loader's samples/s for 1 rank and for 8 ranks (8 :class:`ReplayLoader` instances stepped
  in lockstep as 8 DDP ranks step, each with its own worker processes), from the cache and from
  the gzip chunks (``cache=False``: what the loader does when the disk has no room for the cache),
  beside what 8 GPU ranks of the config consume.

The store is made only in a folder the bench made (it leaves ``bench-store.json`` there), so that
a mistyped ``--run`` never writes into a real run; a second call on the same folder adds only the
positions missing, so a large store can be made in several goes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
import tracemalloc
import uuid
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from engine.files import atomic_open

__all__ = ["bench_store", "make_store", "format_store_report", "MARK"]

MARK = "bench-store.json"        # in a folder the bench made: what it asked for and wrote
GAMES_PER_CHUNK = 64             # the games a daemon flush writes (docs/scale.md: 64 games in 13 ms)
POSITIONS_PER_GENERATION = 100_000   # about 9 s of the 64-GPU fleet: many generations, as a long run has
TEMPLATE_GAMES = 64              # distinct games the store is made of (each stored with a fresh id)
# What one learner rank of the gpu config consumes: docs/training.md ("Figures"), a 20x256 at
# batch 1024 in bf16 on one H100: 14,303 samples/s.
GPU_RANK_SAMPLES_PER_S = 14_303
GPU_RANKS = 8


def _log_default(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _read_mark(folder: str) -> dict | None:
    try:
        with open(os.path.join(folder, MARK), encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        return None


def _claim(folder: str, input_format: int) -> None:
    """Make ``folder`` the bench's: ValueError if it holds anything the bench did not make."""
    if os.path.isdir(folder) and os.listdir(folder) and _read_mark(folder) is None:
        raise ValueError(f"{folder} is not empty and not a store `bench store` made (no {MARK}): "
                         "name a new folder")
    mark = _read_mark(folder)
    if mark is not None and mark.get("input_format") != input_format:
        raise ValueError(f"{folder} holds records of input format {mark.get('input_format')}, "
                         f"the config's is {input_format}: name a new folder")
    if mark is None:
        os.makedirs(folder, exist_ok=True)
        with atomic_open(os.path.join(folder, MARK), "w") as f:
            json.dump({"made_by": "cyzero-train bench store", "input_format": input_format}, f)


def make_store(folder: str, positions: int, *, input_format: int = 1, val_percent: float = 5.0,
               positions_per_game: int = 40, games_per_chunk: int = GAMES_PER_CHUNK,
               positions_per_generation: int = POSITIONS_PER_GENERATION, seed: int = 0,
               log: Callable[[str], Any] = _log_default) -> dict:
    """Add synthetic self-play chunks to the store in ``folder`` until it holds ``positions``
    positions, as the daemon writes them; returns what was written now (positions, games, chunks,
    seconds). The games are :func:`trainer.fleet_workers.template_games`, stored with fresh ids."""
    from tqdm import tqdm

    from trainer.fleet_workers import template_games
    from trainer.store import ReplayStore, hold_out

    if positions < 1:
        raise ValueError(f"positions must be >= 1, got {positions}")
    _claim(folder, input_format)
    store = ReplayStore(folder, input_format)
    held, total = store.held_out_positions(val_percent)
    written = {"positions": 0, "games": 0, "chunks": 0, "seconds": 0.0}
    if total >= positions:
        return written
    templates = template_games(input_format, positions_per_game, count=TEMPLATE_GAMES, seed=seed)
    rng = np.random.default_rng([seed, total])
    start = time.perf_counter()
    with tqdm(total=positions, initial=total, unit="pos", unit_scale=True, desc="bench store: making",
              file=sys.stderr, disable=None) as bar:
        while total < positions:
            games = [templates[i] for i in rng.integers(0, len(templates), games_per_chunk)]
            sizes = [len(g.records) for g in games]
            generation = total // positions_per_generation
            flags = hold_out(sizes, held, total, val_percent)
            for held_out in (True, False):   # the daemon's flush: the held-out games are a chunk of their own
                part = [g for g, flag in zip(games, flags) if flag is held_out]
                if part:
                    store.append_games([g.records for g in part], generation=generation, source="selfplay",
                                       game_ids=[uuid.uuid4().hex for _ in part], held_out=held_out,
                                       val_percent=val_percent, members=[g.member for g in part])
                    written["chunks"] += 1
            added = sum(sizes)
            held += sum(n for n, flag in zip(sizes, flags) if flag)
            total += added
            written["positions"] += added
            written["games"] += len(games)
            bar.update(added)
    written["seconds"] = time.perf_counter() - start
    log(f"bench store: wrote {written['positions']:,} positions in {written['chunks']:,} chunks in "
        f"{written['seconds']:.1f} s ({written['positions'] / written['seconds']:,.0f} positions/s)")
    return written


def _disk(folder: str) -> dict:
    """The file system ``folder`` is on, as ``df`` names it, and its room."""
    path, best = os.path.realpath(folder), ("?", "/", "?")
    with contextlib.suppress(OSError), open("/proc/mounts", encoding="utf-8") as f:
        for line in f:
            source, mount, fstype = line.split()[:3]
            if (path == mount or path.startswith(mount.rstrip("/") + "/")) and len(mount) >= len(best[1]):
                best = (source, mount, fstype)
    usage = shutil.disk_usage(folder)
    return {"source": best[0], "mount": best[1], "fstype": best[2], "total_bytes": usage.total,
            "free_bytes": usage.free}


def _machine() -> dict:
    model = "?"
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8") as f:
        model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "?")
    import psutil

    return {"cpu": model, "cores": os.cpu_count(), "memory_bytes": psutil.virtual_memory().total}


def _files_bytes(folder: str) -> tuple[int, int, int]:
    """(files, bytes, bytes allocated) of the files directly in ``folder``."""
    count = size = blocks = 0
    with os.scandir(folder) as it:
        for entry in it:
            if entry.is_file() and not entry.name.startswith("."):
                st = entry.stat()
                count, size, blocks = count + 1, size + st.st_size, blocks + st.st_blocks * 512
    return count, size, blocks


def _manifest_figures(folder: str, window, batch_size: int, input_format: int) -> dict:
    """The manifest's load time and the sampler's time and memory to build over it."""
    import psutil

    from trainer.loader import ReplaySampler
    from trainer.store import ReplayStore

    loads, builds = [], []
    for _ in range(3):
        start = time.perf_counter()
        store = ReplayStore(folder, input_format)
        entries = store.entries()
        loads.append(time.perf_counter() - start)
        start = time.perf_counter()
        sampler = ReplaySampler(store, window, batch_size)
        builds.append(time.perf_counter() - start)
        del store, sampler
    gc.collect()
    rss = psutil.Process().memory_info().rss
    tracemalloc.start()
    try:
        store = ReplayStore(folder, input_format)
        sampler = ReplaySampler(store, window, batch_size)
        current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    rss_growth = psutil.Process().memory_info().rss - rss
    return {"manifest_records": sampler.snapshot_records, "live_chunks": len(entries),
            "manifest_load_s": statistics.median(loads), "sampler_build_s": statistics.median(builds),
            "store_and_sampler_bytes": current, "store_and_sampler_peak_bytes": peak,
            "rss_growth_bytes": rss_growth, "window_chunks": len(sampler._plan.names),
            "window_positions": sampler.window_positions, "training_positions": sampler.training_positions,
            "held_out_positions": sampler.held_out_positions}


def _warm_cache(folder: str, window, batch_size: int, input_format: int) -> tuple[float, int]:
    """Build the decompressed cache of the window's chunks (seconds, the window's chunks)."""
    from trainer.loader import ReplaySampler, warm_cache
    from trainer.store import ReplayStore

    sampler = ReplaySampler(ReplayStore(folder, input_format), window, batch_size)
    start = time.perf_counter()
    chunks = warm_cache(sampler)
    return time.perf_counter() - start, chunks


def loader_rate(folder: str, window, batch_size: int, *, ranks: int, workers: int, cache: bool, batches: int,
                warm_batches: int = 2, input_format: int = 1) -> dict:
    """Global samples/s of ``ranks`` loaders of ``workers`` processes each, stepped in lockstep (each
    rank takes its slice of every global batch, as DDP ranks do); and the chunks they loaded each way."""
    from trainer.loader import ReplayLoader, ReplaySampler
    from trainer.store import ReplayStore

    loaders = []
    with warnings.catch_warnings(), contextlib.ExitStack() as stack:
        # torch warns of more loader processes than cores: here that is the point (the ranks' workers
        # as a GPU box runs them), and the report says the figures are bound by these cores.
        warnings.filterwarnings("ignore", message="This DataLoader will create")
        for rank in range(ranks):
            store = ReplayStore(folder, input_format)   # each rank reads the manifest itself
            sampler = ReplaySampler(store, dataclasses.replace(window, max_samples_per_position=math.inf),
                                    batch_size)
            loaders.append(stack.enter_context(ReplayLoader(store, sampler, rank=rank, world=ranks, workers=workers,
                                                            prefetch=max(2, 2 * workers), cache=cache)))
        for _ in range(warm_batches):
            for loader in loaders:
                next(loader)
        start = time.perf_counter()
        for _ in range(batches):
            for loader in loaders:
                next(loader)
        seconds = time.perf_counter() - start
    loads = {k: sum(loader.chunk_loads[k] for loader in loaders) for k in ("cache", "gzip")}
    return {"mode": "cache" if cache else "gzip", "ranks": ranks, "workers_per_rank": workers,
            "batch_size": batch_size, "batches": batches, "seconds": seconds,
            "samples_per_s": batches * batch_size / seconds, "chunk_loads": loads}


def bench_store(*, run_dir: str | None = None, positions: int = 10_000_000, config: str | None = "gpu",
                window_positions: int | None = None, cache_window_positions: int | None = None,
                batches: int = 10, ranks: tuple[int, ...] = (1, GPU_RANKS), rank_workers: int | None = None,
                seed: int = 0, log: Callable[[str], Any] = _log_default) -> dict:
    """Make (or complete) the store in ``run_dir`` (default: a temporary folder, removed at the end)
    and measure it; returns the figures (:func:`format_store_report` prints them).

    ``config``: the training config whose window rule, batch size, loader workers and input
    format are used (default ``gpu``). ``window_positions``: a fixed window instead of the
    config's rule at the store's size. ``cache_window_positions``: the window the cached rate is
    measured on when the window's cache has no room on the disk (default: a million positions);
    the gzip rate is always measured on the window itself. ``rank_workers``: loader processes a
    rank (default: the config's ``replay.workers``, fewer where the ranks would have more than
    two a core between them).
    """
    from trainer.config import default_config, load_named_config
    from trainer.loader import cache_reserve
    from trainer.records import RECORD_BYTES
    from trainer.store import ReplayStore

    cfg = load_named_config(config) if config else default_config()
    input_format, batch_size = cfg.model.input_format, cfg.train.batch_size
    # A fixed window: the floor, with a growth too small to add a position (window_size wants beta > 0).
    window = cfg.replay if window_positions is None else dataclasses.replace(cfg.replay, floor=window_positions,
                                                                            beta=1e-9)
    window = dataclasses.replace(window, max_samples_per_position=math.inf)
    figures: dict[str, Any] = {"config": config or "default", "batch_size": batch_size,
                               "machine": _machine(), "positions_asked": positions}
    with contextlib.ExitStack() as stack:
        if run_dir is None:
            run_dir = os.path.join(stack.enter_context(tempfile.TemporaryDirectory(prefix="cyzero-bench-store-")),
                                   "store")
        figures["run"] = run_dir
        figures["written_now"] = make_store(run_dir, positions, input_format=input_format,
                                            val_percent=cfg.replay.val_percent, seed=seed, log=log)
        store = ReplayStore(run_dir, input_format)
        entries = store.entries()
        stored = sum(e.positions for e in entries)
        chunk_files, chunk_bytes, chunk_alloc = _files_bytes(str(store.chunks_dir))
        manifest_bytes = os.path.getsize(store.manifest)
        figures["store"] = {"positions": stored, "games": sum(e.games for e in entries), "chunks": len(entries),
                            "chunk_files": chunk_files, "generations": len({e.generation for e in entries}),
                            "chunk_bytes": chunk_bytes, "chunk_allocated_bytes": chunk_alloc,
                            "manifest_bytes": manifest_bytes, "chunk_bytes_per_position": chunk_bytes / stored,
                            "chunk_allocated_per_position": chunk_alloc / stored,
                            "manifest_bytes_per_position": manifest_bytes / stored}
        log(f"bench store: {stored:,} positions, {chunk_bytes / stored:.1f} B a position of chunks, "
            f"{manifest_bytes / stored:.2f} B of manifest")
        m = _manifest_figures(run_dir, window, batch_size, input_format)
        figures["manifest"] = m
        log(f"bench store: manifest of {m['manifest_records']:,} records read in {m['manifest_load_s']:.3f} s; "
            f"sampler over {m['window_positions']:,} positions built in {m['sampler_build_s']:.3f} s")

        disk = _disk(run_dir)
        room = disk["free_bytes"] - cache_reserve(disk["total_bytes"])
        cached_now = _files_bytes(str(store.cache_dir))[1]
        want_window = m["window_positions"] * RECORD_BYTES
        figures["disk"] = disk
        figures["cache"] = {"record_bytes": RECORD_BYTES, "window_bytes": want_window,
                            "store_bytes": (m["training_positions"] + m["held_out_positions"]) * RECORD_BYTES,
                            "room_bytes": room, "cached_bytes": cached_now,
                            "window_fits": want_window <= room + cached_now}
        # The cached rate: on the window when its cache fits, else on a window of the newest positions that does.
        cache_window = window
        if not figures["cache"]["window_fits"]:
            fixed = cache_window_positions or 1_000_000
            cache_window = dataclasses.replace(window, floor=fixed, beta=1e-9)
            if fixed * RECORD_BYTES > room + cached_now:
                cache_window = None
        if cache_window is None:
            figures["cache"]["measured_window_positions"] = None
        elif cache_window is window:
            figures["cache"]["measured_window_positions"] = m["window_positions"]
        else:
            figures["cache"]["measured_window_positions"] = min(cache_window.floor, m["training_positions"])

        cores = os.cpu_count() or 1
        base_workers = cfg.replay.workers if rank_workers is None else rank_workers
        rates = []
        for mode in ("cache", "gzip"):
            use = cache_window if mode == "cache" else window
            if use is None:
                log("bench store: no room on the disk for a million positions' cache: no cached rate")
                continue
            if mode == "cache":
                seconds, built = _warm_cache(run_dir, use, batch_size, input_format)
                figures["cache"]["build_s"], figures["cache"]["built_chunks"] = seconds, built
                log(f"bench store: cache of the window's {built:,} chunks built in {seconds:.1f} s")
            for n in ranks:
                workers = base_workers if rank_workers is not None else max(1, min(base_workers, 2 * cores // n))
                rate = loader_rate(run_dir, use, batch_size, ranks=n, workers=workers, cache=mode == "cache",
                                   batches=batches, input_format=input_format)
                rate["window_positions"] = figures["cache"]["measured_window_positions"] if mode == "cache" \
                    else m["window_positions"]
                rate["per_core_samples_per_s"] = rate["samples_per_s"] / max(1, min(cores, n * workers))
                rates.append(rate)
                log(f"bench store: loader from {mode}, {n} rank(s) x {workers} worker(s): "
                    f"{rate['samples_per_s']:,.0f} samples/s")
        figures["loader"] = rates
        figures["consumer"] = {"ranks": GPU_RANKS, "rank_samples_per_s": GPU_RANK_SAMPLES_PER_S,
                               "samples_per_s": GPU_RANKS * GPU_RANK_SAMPLES_PER_S}
    return figures


def format_store_report(f: dict) -> str:
    """The figures as the lines docs/scale.md quotes."""
    s, m, c, d = f["store"], f["manifest"], f["cache"], f["disk"]
    gb = 1e9
    lines = [
        f"cyzero-train bench store: {f['machine']['cpu']}, {f['machine']['cores']} cores, "
        f"{f['machine']['memory_bytes'] / 2**30:.0f} GiB; disk {d['source']} ({d['fstype']}) at {d['mount']}, "
        f"{d['free_bytes'] / gb:.0f} GB free of {d['total_bytes'] / gb:.0f} GB",
        f"store        {s['positions']:,} positions, {s['games']:,} games, {s['chunks']:,} chunks, "
        f"{s['generations']} generations",
        f"on disk      chunks {s['chunk_bytes'] / gb:.2f} GB ({s['chunk_bytes_per_position']:.1f} B a position, "
        f"{s['chunk_allocated_per_position']:.1f} B allocated); manifest {s['manifest_bytes'] / 1e6:.1f} MB "
        f"({s['manifest_bytes_per_position']:.2f} B a position)",
        f"window       {m['window_positions']:,} of {m['training_positions']:,} training positions "
        f"({m['window_chunks']:,} chunks; {m['held_out_positions']:,} held out)",
        f"cache        the window wants {c['window_bytes'] / gb:.1f} GB, the whole store {c['store_bytes'] / gb:.1f} GB "
        f"({c['record_bytes']:,} B a position); room for the cache {max(0, c['room_bytes']) / gb:.1f} GB: "
        f"the window's {'fits' if c['window_fits'] else 'does NOT fit: the loader reads gzip'}",
        f"manifest     {m['manifest_records']:,} records read in {m['manifest_load_s'] * 1e3:.0f} ms; "
        f"sampler built in {m['sampler_build_s'] * 1e3:.0f} ms",
        f"memory       store + sampler {m['store_and_sampler_bytes'] / 1e6:.1f} MB traced "
        f"({m['store_and_sampler_bytes'] / max(1, m['live_chunks']):,.0f} B a chunk; peak "
        f"{m['store_and_sampler_peak_bytes'] / 1e6:.1f} MB), resident +{m['rss_growth_bytes'] / 1e6:.1f} MB",
    ]
    if "build_s" in c:
        lines.append(f"cache build  {c['built_chunks']:,} chunks in {c['build_s']:.1f} s")
    for r in f["loader"]:
        lines.append(f"loader       {r['mode']:5} {r['ranks']} rank(s) x {r['workers_per_rank']} worker(s), window "
                     f"{r['window_positions']:,}: {r['samples_per_s']:,.0f} samples/s "
                     f"({r['per_core_samples_per_s']:,.0f} a busy core); chunks loaded from cache "
                     f"{r['chunk_loads']['cache']:,}, from gzip {r['chunk_loads']['gzip']:,}")
    consumer = f["consumer"]
    lines.append(f"consumer     {consumer['ranks']} GPU ranks of the gpu config: {consumer['samples_per_s']:,} samples/s "
                 f"({consumer['rank_samples_per_s']:,} a rank, docs/training.md)")
    return "\n".join(lines)
