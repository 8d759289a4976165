"""The replay store: durable chunks of V6 records, the manifest log, hold-out, retention, lc0 imports.

Layout under the run directory (see ``docs/training.md``)::

    replay/manifest.jsonl   append-only log, one JSON object a line, never rewritten
    replay/chunks/NAME.gz   gzip chunks of V6 records (:func:`trainer.records.write_chunk`)
    replay/cache/NAME.rec   decompressed copies for random access (derived, deletable any time)
    replay/cache/NAME.bad   a chunk found unreadable, with the reason (delete it to try again)

Writing: a group of games becomes one chunk (temp name, fsync, rename), then one
manifest line ``{"op": "add", ...}`` is appended under ``flock`` with ``O_APPEND``
and fsynced: one chunk and three fsyncs (the chunk, its folder, the manifest)
per group, however many games.  The games are durable (the daemon may
acknowledge them) when :meth:`ReplayStore.append_games` returns.  Several
writer processes may append while readers read.  A writer killed mid-line
leaves a torn line: readers skip it and the next writer starts a new line.
Retention appends ``{"op": "prune", "names": [...]}`` instead of rewriting the
log.  lc0's own training data comes in through :func:`import_lc0_chunks`.

No torch here (tests/test_architecture.py imports it without): the daemon, bootstrap and status
write and read the store; the sampler and the batches over it are :mod:`trainer.loader`'s.
"""

from __future__ import annotations

import collections
import gzip
import io
import json
import logging
import math
import os
import re
import tarfile
import threading
import time
import uuid
import zlib
from pathlib import Path
from typing import Iterable, Iterator, NamedTuple, Sequence

import numpy as np

from trainer.atomic import append_durably, read_jsonl
from trainer.config import is_validation
from trainer.rundir import Chunk, ManifestLog
from trainer.records import (
    INPUT_FORMAT_CLASSICAL,
    RECORD_DTYPE,
    ChunkError,
    check_records,
    parse_chunk,
    readable_as,
    write_chunk,
    write_chunk_members,
)

__all__ = [
    "MANIFEST",
    "ChunkWriter",
    "ReplayStore",
    "hold_out",
    "cache_paths",
    "ImportSummary",
    "import_lc0_chunks",
]

# The loader logs under the same name: one channel for the replay data, written or read.
log = logging.getLogger("cyzero.replay")

MANIFEST = "manifest.jsonl"
_SOURCE = re.compile(r"[A-Za-z0-9_]+")

# Age after which prune removes what a killed process left (temp files, chunks never listed).
_STALE_S = 3600.0
# One lc0 game is at most a few MB of records; more is not a game (or a gzip bomb).
_MAX_LC0_GAME_BYTES = 64 << 20


def _game_array(records: np.ndarray, input_format: int, checked: bool = False) -> np.ndarray:
    """``records`` as one game's array, in the store's format. ``checked``: already found all of one
    format by :func:`trainer.records.inflate_records`, so its first record's format is the game's."""
    array = np.atleast_1d(np.asarray(records))
    if array.dtype != RECORD_DTYPE:
        raise TypeError(f"a game is an array of RECORD_DTYPE records, got dtype {array.dtype}")
    if array.ndim != 1 or array.size == 0:
        raise ValueError(f"a game is a non-empty 1-D array of records, got shape {array.shape}")
    check_records(array[:1] if checked else array, input_format)   # a store holds one format: its network's
    return array


class ReplayStore:
    """The run's replay directory: chunks, the manifest log, the cache.

    Not shared between threads without care: one instance per thread, or the
    internal lock (it guards the manifest view and appends) is all there is.
    """

    def __init__(self, run_dir: str | os.PathLike, input_format: int = INPUT_FORMAT_CLASSICAL):
        self.run_dir = Path(run_dir)
        self.input_format = input_format   # what its readers ask of a chunk: the network's format
        self.dir = self.run_dir / "replay"
        self.chunks_dir = self.dir / "chunks"
        self.cache_dir = self.dir / "cache"
        self.manifest = self.dir / MANIFEST
        for d in (self.chunks_dir, self.cache_dir):
            d.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._log = ManifestLog(self.manifest, warn=log.warning)   # replayed as it grows, under the lock

    # -- the manifest log ------------------------------------------------------------------

    def snapshot(self, records: int | None = None) -> tuple[list[Chunk], int]:
        """The live chunks after the manifest's first ``records`` records (all of them: None), and that
        count: the snapshot that a sampler (:class:`trainer.loader.ReplaySampler`) plans from."""
        with self._lock:
            self._log.read()
            held = len(self._log.records)
            if records is None:
                return list(self._log.live.values()), held
            if records > held:
                raise ValueError(
                    f"{self.manifest} holds {held} records but the replay cursor was taken "
                    f"at {records}: this is not the run the checkpoint came from, or its manifest was lost"
                )
            return self._log.live_after(records), records

    def _append(self, obj: dict) -> None:
        with self._lock:
            append_durably(self.manifest, (json.dumps(obj, separators=(",", ":")) + "\n").encode())

    def entries(self) -> list[Chunk]:
        """The live chunks, oldest first (re-reads the manifest; a torn line is ignored)."""
        return self.snapshot()[0]

    def total_positions(self) -> int:
        return sum(e.positions for e in self.entries())

    def check_format(self) -> None:
        """``ValueError`` when the oldest or newest live chunk holds records of another input format
        than the store's (its network's): a run trains on records written in its network's format,
        and a mismatch found here is said in one line before any step, not chunk by chunk."""
        entries = self.entries()
        for entry in dict.fromkeys([entries[0], entries[-1]] if entries else []):
            try:
                with gzip.open(self.chunks_dir / entry.name, "rb") as gz:
                    header = gz.read(8)
            except (OSError, EOFError, zlib.error):
                continue   # an unreadable chunk is the loader's to skip, with its own message
            if len(header) == 8:
                fmt = int(np.frombuffer(header, dtype="<u4")[1])
                if not readable_as(fmt, self.input_format):
                    raise ValueError(
                        f"the replay store {self.dir} holds records of lc0's input format {fmt} (chunk {entry.name}), "
                        f"and the network reads input format {self.input_format}: records are written in the "
                        "network's format, so start a new run folder for it (its bootstrap and self-play write it)")

    def newest_game_ids(self, limit: int | None = None) -> list[str]:
        """The ids of the newest ``limit`` games committed with :meth:`append_games` (all when
        None; pruned chunks' too), oldest first, read from the manifest: the daemon's duplicate
        check after a restart. Not kept in memory: a long run stores millions of games."""
        newest: collections.deque[str] = collections.deque(maxlen=limit)
        for record in read_jsonl(self.manifest):
            ids = record.get("game_ids") if record.get("op") == "add" else None
            if isinstance(ids, list):
                newest.extend(i for i in ids if isinstance(i, str))
        return list(newest)

    # -- writing ---------------------------------------------------------------------------

    def append_games(self, games: Sequence[np.ndarray], *, generation: int, source: str,
                     game_ids: Sequence[str] | None = None, held_out: bool | None = None,
                     val_percent: float = 0.0, members: Sequence[bytes] | None = None) -> Chunk:
        """Commit ``games`` (each a RECORD_DTYPE array, one game's positions in order) as ONE new chunk.

        Durable when it returns: the chunk is fsynced and renamed into place,
        then its manifest line is appended and fsynced.  ``game_ids`` (one per
        game) go into that line, so a game sent twice is recognised after a restart.
        ``held_out`` True (False) gives the chunk a name that :func:`is_validation` at
        ``val_percent`` holds out (trains on); None, a random name (held out by chance).
        ``members``: each game's records already compressed (a worker's gzip member, inflated
        and checked into ``games`` by :func:`trainer.records.inflate_records`): written as they
        are, so that storing costs no compression and no second check.
        """
        if game_ids is not None and (len(game_ids) != len(games) or not all(isinstance(i, str) for i in game_ids)):
            raise ValueError("game_ids must be one string per game")
        if members is not None and len(members) != len(games):
            raise ValueError("members must be one gzip member per game")
        if not _SOURCE.fullmatch(source):
            raise ValueError(f"source {source!r} must be letters, digits and '_' (it is part of file names)")
        if not isinstance(generation, int) or generation < 0:
            raise ValueError(f"generation must be an integer >= 0, got {generation!r}")
        arrays = [_game_array(g, self.input_format, checked=members is not None) for g in games]
        if not arrays:
            raise ValueError("append_games needs at least one game")
        name = _chunk_name(source, generation, held_out, val_percent)
        if members is None:
            write_chunk(self.chunks_dir / name, np.concatenate(arrays))
        else:
            write_chunk_members(self.chunks_dir / name, members)
        entry = Chunk(name, sum(a.size for a in arrays), len(arrays), generation, source, time.time())
        line = {"op": "add", **entry._asdict()}
        if game_ids is not None:
            line["game_ids"] = list(game_ids)
        self._append(line)
        return entry

    def held_out_positions(self, val_percent: float) -> tuple[int, int]:
        """``(held out, all)`` positions of the live chunks, held out as :func:`is_validation` says."""
        entries = self.entries()
        held = sum(e.positions for e in entries if is_validation(e.name, val_percent))
        return held, sum(e.positions for e in entries)

    def writer(self, *, generation: int, source: str, positions_per_chunk: int = 4096) -> "ChunkWriter":
        """A buffer of games that commits a chunk whenever ``positions_per_chunk`` is reached."""
        return ChunkWriter(self, generation=generation, source=source, positions_per_chunk=positions_per_chunk)

    # -- retention -------------------------------------------------------------------------

    def prune(self, keep_positions: int, val_percent: float = 0.0) -> list[str]:
        """Delete the oldest chunks lying wholly outside the newest ``keep_positions``; returns their names.

        With ``val_percent``, the positions of held-out chunks (``is_validation``) do not count:
        ``keep_positions`` is then in training positions, the unit of the sampler's window, so
        pruning to the window never cuts a training chunk inside it.

        The removal is a ``prune`` line in the manifest (written before any file
        goes), then the chunk files and their cache files are deleted, along
        with cache files of chunks no longer in the manifest.  Leftovers of
        killed processes older than an hour go too: temporary files, and chunk
        files whose manifest line was never written.
        """
        if keep_positions < 0:
            raise ValueError(f"keep_positions must be >= 0, got {keep_positions}")
        cached = [n for n in os.listdir(self.cache_dir) if not n.startswith(".")]   # before the read
        stale = time.time() - _STALE_S
        old_files = [d / n for d in (self.chunks_dir, self.cache_dir) for n in os.listdir(d)
                     if _mtime(d / n) < stale]
        entries = self.entries()
        newer = 0
        cut = 0
        for i in range(len(entries) - 1, -1, -1):
            if newer >= keep_positions:
                cut = i + 1
                break
            if not (val_percent and is_validation(entries[i].name, val_percent)):
                newer += entries[i].positions
        names = [e.name for e in entries[:cut]]
        if names:
            self._append({"op": "prune", "names": names, "time": time.time()})
        live = {Path(e.name).stem for e in entries[cut:]}
        for name in names:
            try:
                os.unlink(self.chunks_dir / name)
            except FileNotFoundError:
                pass
        listed = {e.name for e in entries}
        doomed = [self.cache_dir / f for f in cached if Path(f).stem not in live]
        doomed += [p for p in old_files
                   if p.name.startswith(".") or (p.parent == self.chunks_dir and p.name not in listed)]
        for path in doomed:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        return names

    def bad_chunks(self) -> dict[str, str]:
        """Chunks a loader found unreadable: name -> reason (from the cache's ``.bad`` markers)."""
        found = {}
        for file in sorted(os.listdir(self.cache_dir)):
            if file.endswith(".bad") and not file.startswith("."):
                try:
                    reason = (self.cache_dir / file).read_text(errors="replace").strip()
                except FileNotFoundError:
                    continue
                found[file[:-4] + ".gz"] = reason
        return found


def _chunk_name(source: str, generation: int, held_out: bool | None, val_percent: float) -> str:
    """A new chunk's file name; with ``held_out``, one drawn until :func:`is_validation` agrees."""
    if held_out is not None and not (held_out and val_percent > 0 or not held_out and val_percent < 100):
        raise ValueError(f"no chunk name is {'held out' if held_out else 'trained on'} at "
                         f"val_percent = {val_percent:g}")
    while True:
        name = f"{source}-g{generation:05d}-{uuid.uuid4().hex}.gz"
        if held_out is None or is_validation(name, val_percent) is held_out:
            return name


def hold_out(sizes: Sequence[int], held: int, total: int, val_percent: float) -> list[bool]:
    """Which of these games (``sizes``: their positions, in order) to hold out for validation, when the
    store holds ``held`` of ``total`` positions held out: each game is held out while the held-out share,
    counting it, would still be under ``val_percent``. So the very first game is held out, and the
    share stays at ``val_percent`` from the first chunk on, where a split of whole chunks by their
    names' hash (:func:`is_validation`) leaves a young run with nothing held out by chance."""
    share = val_percent / 100.0
    flags = []
    for n in sizes:
        flag = share > 0 and held < share * (total + n)
        flags.append(flag)
        held += n if flag else 0
        total += n
    return flags


def cache_paths(cache_dir: Path, name: str) -> tuple[Path, Path]:
    """The decompressed copy of chunk ``name`` in ``cache_dir`` and its unreadable-chunk marker: the
    store's layout, which the loader's worker processes follow without a store of their own."""
    stem = name[:-3] if name.endswith(".gz") else name
    return cache_dir / f"{stem}.rec", cache_dir / f"{stem}.bad"


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except FileNotFoundError:
        return math.inf


class ChunkWriter:
    """Buffers whole games and commits them in groups (:meth:`ReplayStore.writer`).

    As a context manager it commits what is buffered on exit, also when the
    body raised (the buffered games are complete; they are not lost).
    """

    def __init__(self, store: ReplayStore, *, generation: int, source: str, positions_per_chunk: int = 4096):
        if positions_per_chunk < 1:
            raise ValueError(f"positions_per_chunk must be >= 1, got {positions_per_chunk}")
        if not _SOURCE.fullmatch(source):
            raise ValueError(f"source {source!r} must be letters, digits and '_' (it is part of file names)")
        self.store = store
        self.generation = generation
        self.source = source
        self.positions_per_chunk = positions_per_chunk
        self.committed: list[Chunk] = []
        self._games: list[np.ndarray] = []
        self._positions = 0

    @property
    def buffered_positions(self) -> int:
        return self._positions

    def add_game(self, records: np.ndarray) -> Chunk | None:
        """Buffer one game (a copy); returns the chunk it committed, if this game filled one."""
        game = _game_array(records, self.store.input_format).copy()
        self._games.append(game)
        self._positions += game.size
        if self._positions >= self.positions_per_chunk:
            return self.commit()
        return None

    def commit(self) -> Chunk | None:
        """Commit the buffered games as one chunk now (None when there are none)."""
        if not self._games:
            return None
        entry = self.store.append_games(self._games, generation=self.generation, source=self.source)
        self._games, self._positions = [], 0
        self.committed.append(entry)
        return entry

    def __enter__(self) -> "ChunkWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.commit()
            return
        try:
            self.commit()
        except Exception:   # the body's exception is the one to see
            log.exception("could not commit the buffered games after an error")


# -- lc0's training data -------------------------------------------------------------------


class ImportSummary(NamedTuple):
    files: int            # lc0 chunk files (one game each) imported
    positions: int
    chunks: list[Chunk]
    skipped: list[str]    # one line per file that could not be read or converted

    def __str__(self) -> str:
        return (f"imported {self.files:,} lc0 games ({self.positions:,} positions) into {len(self.chunks)} "
                f"chunks; skipped {len(self.skipped)} files")


_LC0_SUFFIXES = (".gz", ".tar", ".tgz")


def _lc0_files(paths: Iterable[str | os.PathLike]) -> Iterator[tuple[str, bytes | Exception]]:
    """(label, gzip bytes or the error reading them) of every lc0 chunk under ``paths``."""
    for path in paths:
        path = Path(path)
        if path.is_dir():
            found = (p for p in path.rglob("*") if p.is_file() and p.name.endswith(_LC0_SUFFIXES))
            yield from _lc0_files(sorted(found))
            continue
        if path.name.endswith((".tar", ".tar.gz", ".tgz")):
            try:
                with tarfile.open(path) as tar:
                    for member in tar:
                        if member.isfile():
                            f = tar.extractfile(member)
                            yield f"{path}:{member.name}", f.read() if f else b""
            except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:
                yield str(path), exc
            continue
        try:
            yield str(path), path.read_bytes()
        except OSError as exc:
            yield str(path), exc


def _lc0_game(label: str, raw: bytes, input_format: int) -> np.ndarray:
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(raw)) as gz:
            data = gz.read(_MAX_LC0_GAME_BYTES + 1)
    except (OSError, EOFError, zlib.error) as exc:
        raise ChunkError(f"lc0 chunk {label} cannot be read: {exc}") from exc
    if len(data) > _MAX_LC0_GAME_BYTES:
        raise ChunkError(f"lc0 chunk {label} holds more than {_MAX_LC0_GAME_BYTES >> 20} MiB: not one game")
    return parse_chunk(data, f"lc0 chunk {label}", input_format)


def import_lc0_chunks(store: ReplayStore, paths: Sequence[str | os.PathLike], *,
                      positions_per_chunk: int = 4096) -> ImportSummary:
    """Import lc0's training data: gzip chunk files of one game each, ``.tar`` archives of them, or folders.

    A folder is searched for ``*.gz``, ``*.tar`` and ``*.tgz`` files, in name order.

    V6 records of the store's input format are taken as they are, format 2 converted to format 1
    (:func:`trainer.records.in_format`); any other file is skipped with one log line naming it.
    Committed in groups as source ``"lc0"``, generation 0.
    """
    for path in paths:
        if not os.path.exists(path):
            raise FileNotFoundError(f"no such lc0 data file or folder: {path}")
    files = positions = 0
    skipped: list[str] = []
    with store.writer(generation=0, source="lc0", positions_per_chunk=positions_per_chunk) as writer:
        for label, raw in _lc0_files(paths):
            try:
                if isinstance(raw, Exception):
                    raise ChunkError(f"lc0 data {label} cannot be read: {raw}")
                game = _lc0_game(label, raw, store.input_format)
            except ChunkError as exc:
                log.warning("skipping %s", exc)
                skipped.append(str(exc))
                continue
            writer.add_game(game)
            files += 1
            positions += len(game)
    return ImportSummary(files, positions, list(writer.committed), skipped)
