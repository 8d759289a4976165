"""The loader: the sampling window and its cursor over the store, and the batches, per rank.

Sampling (KataGo's shuffle rule): the window is the newest ``window_size(N)``
training positions of a snapshot of the manifest; batch ``k`` draws its
positions uniformly from it with ``numpy.random.default_rng([seed, k])``, so a
plan depends only on the seed, the batch number and the snapshot.  The cursor
(:meth:`ReplaySampler.state_dict`) names the snapshot by the number of manifest
records it used, so a resumed learner plans the same batches.  Chunks whose name
hashes into the validation share never enter the window.

Loading: worker processes read planned positions from memory-mapped
decompressed copies of the chunks and decode them with the vectorised
:func:`trainer.records.decode_records`.  A chunk that cannot be read is marked
once (``NAME.bad``, one log line naming it) and its positions are redrawn,
deterministically, from other chunks.  Where the disk has no room for the cache, a chunk of
the daemon's (one gzip member a game) is read game by game from its gzip file, and any
other chunk whole.

The store itself (chunks, manifest, hold-out, pruning) is :mod:`trainer.store`, which imports no
torch; this module is the learner's side of it.
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import math
import multiprocessing
import os
import secrets
import shutil
import signal
import time
import zlib
from collections import OrderedDict
from pathlib import Path
from typing import Iterator, NamedTuple

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info

from engine.encoding import POLICY_SIZE
from engine.files import atomic_open
from trainer.config import ReplayConfig, is_validation, window_size
from trainer.records import (
    INPUT_FORMAT_CLASSICAL,
    INPUT_PLANES,
    RECORD_BYTES,
    RECORD_DTYPE,
    RECORD_VERSION,
    ChunkError,
    decode_records,
    parse_chunk,
    read_chunk,
)
from trainer.rundir import Chunk
from trainer.store import ReplayStore, cache_paths

__all__ = [
    "WindowConfig",
    "DataStarved",
    "ReplaySampler",
    "Batch",
    "ReplayLoader",
    "validation_batch",
    "loader_throughput",
    "warm_cache",
    "cache_reserve",
]

log = logging.getLogger("cyzero.replay")   # the store's channel: one for the replay data


# Redraws of a position whose chunk is unreadable before giving up (all of the window unreadable).
_MAX_REDRAWS = 64
# Memory maps a loader worker keeps open (each holds a file descriptor).
_MAX_OPEN_CHUNKS = 256
# Decompressed chunks a loader worker keeps in memory when the disk has no room to cache them.
_MAX_LOOSE_BYTES = 1 << 30
# The cache (about 8 KB a position, derived) never takes the disk below this share of its size or
# this many bytes, whichever is more: checkpoints, chunks and the manifest need the room more.
_CACHE_RESERVE_SHARE = 0.1
_CACHE_RESERVE_BYTES = 2 << 30


def cache_reserve(disk_bytes: int) -> int:
    """Bytes the cache leaves free on a disk of ``disk_bytes``: ``bench store`` sizes by the same rule."""
    return max(_CACHE_RESERVE_BYTES, int(disk_bytes * _CACHE_RESERVE_SHARE))


def _cache_room(cache_dir: Path, nbytes: int) -> int | None:
    """None when ``nbytes`` more of cache leave the disk its reserve (:func:`cache_reserve`); else the
    bytes free now. The cache is derived, so a loader without room reads the chunks themselves."""
    usage = shutil.disk_usage(cache_dir)
    return None if usage.free - nbytes >= cache_reserve(usage.total) else usage.free


# -- the window ----------------------------------------------------------------------------
# is_validation and window_size live in trainer.config (status reads them without torch).


#: The window's settings (floor, alpha, beta, max_samples_per_position, val_percent) are the
#: ``[replay]`` section of the training config: one table, declared once in trainer.config.
WindowConfig = ReplayConfig


class DataStarved(RuntimeError):
    """The cap would be exceeded: the learner must wait for new data (then ``refresh``)."""


class _Window:
    """The plan's inputs at one snapshot: the training chunks overlapping the window, oldest first.

    Positions are numbered through the snapshot's training chunks in manifest
    order; the window is ``[lo, hi)``, the newest ``hi - lo`` of them.
    Picklable (it goes to the loader's workers).
    """

    def __init__(self, seed: int, batch_size: int, names: list[str], sizes: np.ndarray, starts: np.ndarray,
                 lo: int, hi: int):
        self.seed = seed
        self.batch_size = batch_size
        self.names = names
        self.sizes = sizes
        self.starts = starts
        self.ends = starts + sizes
        self.lo = lo
        self.hi = hi

    def draw(self, batch: int, attempt: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """(chunk index, record offset) of each position of global batch ``batch`` (redraw ``attempt``)."""
        if self.hi <= self.lo:
            raise DataStarved("the replay store has no training positions yet: bootstrap, import or self-play first")
        key = [self.seed, batch] if attempt == 0 else [self.seed, batch, attempt]
        index = np.random.default_rng(key).integers(self.lo, self.hi, size=self.batch_size)
        chunk = np.searchsorted(self.ends, index, side="right")
        return chunk, index - self.starts[chunk]


class ReplaySampler:
    """The deterministic plan of which positions batch k holds, and the cursor through it.

    ``refresh()`` takes a new snapshot of the manifest; ``plan(k)`` depends only on
    the seed, k and the snapshot.  ``advance()`` records batch ``next_batch`` as
    consumed (the loader calls it as it hands a batch over) and raises
    :class:`DataStarved` when that would draw more than ``max_samples_per_position``
    times the snapshot's training positions in all.  Save :meth:`state_dict`
    after any ``refresh`` of that step, so a resumed run uses the same snapshot.
    """

    def __init__(self, store: ReplayStore, window: WindowConfig, batch_size: int, seed: int = 0):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.store = store
        self.window = window
        self.batch_size = int(batch_size)
        self.seed = int(seed)
        self.next_batch = 0
        self.samples_drawn = 0
        self.chunk_samples: dict[str, int] = {}
        self.version = 0               # bumped whenever the plan changes (new snapshot, new cursor)
        self.snapshot_records = -1     # manifest records the snapshot replays
        self.training_positions = 0
        self.held_out_positions = 0    # in chunks held out for validation (replay.val_percent)
        self.window_positions = 0
        self._plan = _Window(self.seed, self.batch_size, [], np.zeros(0, np.int64), np.zeros(0, np.int64), 0, 0)
        self.refresh()

    def _use(self, entries: list[Chunk], records: int) -> None:
        train = [e for e in entries if not is_validation(e.name, self.window.val_percent)]
        sizes = np.array([e.positions for e in train], dtype=np.int64)
        ends = np.cumsum(sizes)
        total = int(ends[-1]) if sizes.size else 0
        size = window_size(total, floor=self.window.floor, alpha=self.window.alpha, beta=self.window.beta)
        first = int(np.searchsorted(ends, total - size, side="right"))
        self._plan = _Window(self.seed, self.batch_size, [e.name for e in train[first:]], sizes[first:],
                             (ends - sizes)[first:], total - size, total)
        self.training_positions = total
        self.held_out_positions = sum(e.positions for e in entries) - total
        self.window_positions = size
        live = {e.name for e in entries}
        self.chunk_samples = {n: c for n, c in self.chunk_samples.items() if n in live}
        self.snapshot_records = records
        self.version += 1

    def refresh(self, records: int | None = None) -> None:
        """Take a new snapshot of the manifest (a no-op when nothing was appended or pruned).

        ``records`` takes the snapshot of the manifest's first ``records`` records
        instead of all of them: DDP ranks refresh to the ``snapshot_records`` that
        rank 0 broadcasts, so that they all plan from the same snapshot.
        """
        if records is not None and records == self.snapshot_records:
            return
        entries, records = self.store.snapshot(records)
        if records != self.snapshot_records:
            self._use(entries, records)

    def plan(self, batch: int) -> list[tuple[str, np.ndarray]]:
        """(chunk name, record offsets) runs of global batch ``batch``, in batch order."""
        chunk, offsets = self._plan.draw(batch)
        cuts = np.flatnonzero(np.diff(chunk)) + 1
        bounds = [0, *cuts.tolist(), chunk.size]
        return [(self._plan.names[chunk[a]], offsets[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]

    def batches_available(self) -> int:
        """How many more batches the cap allows on this snapshot."""
        if self.training_positions == 0:
            return 0
        cap = self.window.max_samples_per_position * self.training_positions
        if math.isinf(cap):
            return 1 << 62
        return max(0, int((cap - self.samples_drawn) // self.batch_size))

    def starved_message(self) -> str:
        if self.training_positions == 0 and self.held_out_positions:
            # The split is by chunk name (as KataGo's), so with one or a few chunks it can take them all.
            return (f"all {self.held_out_positions:,} positions in {self.store.manifest} are in chunks held out "
                    f"for validation (replay.val_percent = {self.window.val_percent:g} picks chunks by the hash "
                    "of their names): add more data, or set replay.val_percent = 0 in the run's config.toml")
        if self.training_positions == 0:
            return (f"{self.store.manifest} lists no training positions yet: add data first "
                    "(cyzero-train bootstrap, or self-play)")
        cap = self.window.max_samples_per_position
        return (
            f"batch {self.next_batch} would bring the samples drawn to "
            f"{self.samples_drawn + self.batch_size:,}, past the cap of {cap:g} per training position x "
            f"{self.training_positions:,} positions = {cap * self.training_positions:,.0f}: add data "
            "(bootstrap, self-play) and run again, or raise replay.max_samples_per_position"
        )

    def advance(self) -> None:
        """Count batch ``next_batch`` as drawn and move on; DataStarved if the cap forbids it."""
        if self.batches_available() < 1:
            raise DataStarved(self.starved_message())
        chunk, _ = self._plan.draw(self.next_batch)
        counts = np.bincount(chunk, minlength=len(self._plan.names))
        for i in np.flatnonzero(counts):
            name = self._plan.names[i]
            self.chunk_samples[name] = self.chunk_samples.get(name, 0) + int(counts[i])
        self.samples_drawn += self.batch_size
        self.next_batch += 1

    def state_dict(self) -> dict:
        """The cursor, JSON-able: seed, next batch, snapshot size, samples drawn, per-chunk sample counts."""
        return {
            "seed": self.seed,
            "batch_size": self.batch_size,
            "next_batch": self.next_batch,
            "snapshot_records": self.snapshot_records,
            "samples_drawn": self.samples_drawn,
            "chunk_samples": dict(self.chunk_samples),
        }

    def load_state_dict(self, state: dict) -> None:
        """Continue from a cursor: the same snapshot of the manifest, the same next batch."""
        missing = {"seed", "next_batch", "snapshot_records", "samples_drawn", "chunk_samples"} - set(state)
        if missing:
            raise ValueError(f"replay cursor lacks {sorted(missing)}")
        entries, records = self.store.snapshot(int(state["snapshot_records"]))
        if state.get("batch_size", self.batch_size) != self.batch_size:
            log.warning("replay cursor was taken with batch size %s, now %d: later batches differ from "
                        "the run's own", state.get("batch_size"), self.batch_size)
        self.seed = int(state["seed"])
        self.next_batch = int(state["next_batch"])
        self.samples_drawn = int(state["samples_drawn"])
        self.chunk_samples = {str(k): int(v) for k, v in state["chunk_samples"].items()}
        self._use(entries, records)


# -- loading -------------------------------------------------------------------------------


class Batch(NamedTuple):
    """Torch tensors, CPU: consecutive views of one float32 buffer (:func:`_pack`)."""

    planes: torch.Tensor      # float32 [n,112,8,8]
    policy: torch.Tensor      # float32 [n,1858], -1 on illegal moves
    wdl: torch.Tensor         # float32 [n,3]
    plies_left: torch.Tensor  # float32 [n]


#: One position's share of a packed batch, field by field in Batch's order.
_FIELD_SHAPES: tuple[tuple[int, ...], ...] = ((INPUT_PLANES, 8, 8), (POLICY_SIZE,), (3,), ())
_FIELD_FLOATS = tuple(math.prod(shape) for shape in _FIELD_SHAPES)
_POSITION_FLOATS = sum(_FIELD_FLOATS)


def _pack(records: np.ndarray, *, shared: bool = False, q_ratio: float = 0.0,
          input_format: int = INPUT_FORMAT_CLASSICAL) -> torch.Tensor:
    """The decoded ``records`` as ONE 1-D float32 tensor: all the planes, then all the policies,
    the WDLs and the plies left (:func:`_unpack` gives the :class:`Batch` of views).

    A loader worker hands the learner one shared-memory segment a batch instead of four (one
    descriptor to pass and one buffer to unpickle, in the learner's process, where that work
    competes with the training loop for the GIL), which the loader pins in one copy on CUDA.
    ``shared``: the buffer is made in shared memory, so handing it over copies nothing more.
    ``q_ratio``: the search's share of the value target, ``input_format`` the planes' format
    (:func:`trainer.records.decode_records`).
    """
    sample = decode_records(records, q_ratio=q_ratio, input_format=input_format)
    n = len(records)
    count = n * _POSITION_FLOATS
    new_shared = getattr(torch.UntypedStorage, "_new_shared", None)
    if shared and new_shared is not None and count:
        flat = torch.empty(0, dtype=torch.float32).set_(new_shared(count * 4))
    else:
        flat = torch.empty(count, dtype=torch.float32)
    out = flat.numpy()
    at = 0
    for values, floats in zip(sample, _FIELD_FLOATS):
        out[at:at + n * floats] = np.asarray(values, dtype=np.float32).reshape(-1)
        at += n * floats
    return flat


def _unpack(flat: torch.Tensor) -> Batch:
    """The :class:`Batch` whose fields are views of a buffer :func:`_pack` made (no copy)."""
    n, rest = divmod(flat.numel(), _POSITION_FLOATS)
    if rest or flat.dim() != 1:
        raise ValueError(f"a packed batch is 1-D with a multiple of {_POSITION_FLOATS} floats, got {tuple(flat.shape)}")
    fields, at = [], 0
    for shape, floats in zip(_FIELD_SHAPES, _FIELD_FLOATS):
        fields.append(flat[at:at + n * floats].view(n, *shape))
        at += n * floats
    return Batch(*fields)


def _to_batch(records: np.ndarray, input_format: int = INPUT_FORMAT_CLASSICAL) -> Batch:
    return _unpack(_pack(records, input_format=input_format))


def _is_transient(exc: BaseException) -> bool:
    """An OS error such as too many open files, which says nothing about the chunk's bytes."""
    cause = exc if isinstance(exc, OSError) else exc.__cause__
    return isinstance(cause, OSError) and cause.errno not in (None, errno.ENOENT, errno.EIO)


def _mark_bad(path: Path, reason: str) -> bool:
    """Create marker ``path`` holding ``reason``, atomically and exclusively: True for the one process that did."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
    try:
        tmp.write_text(reason + "\n")
        try:
            os.link(tmp, path)
            return True
        except FileExistsError:
            return False
    finally:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass


# A self-play chunk is its games' gzip members one after another (compress_records' header: magic,
# deflate, no flags), so a reader without room for the cache can inflate one game instead of the chunk.
_MEMBER_HEADER = b"\x1f\x8b\x08\x00"


def _member_index(raw: bytes, size: int) -> tuple[np.ndarray, np.ndarray] | None:
    """(byte offset, first record) of each gzip member of a chunk of ``size`` records, found by their
    headers and checked by their trailers (each member's ISIZE whole records, ``size`` in all); None
    for a chunk of one member (``write_chunk``, lc0's) or of members these do not delimit."""
    starts, at = [], raw.find(_MEMBER_HEADER) if raw[:4] == _MEMBER_HEADER else -1
    while at >= 0:
        starts.append(at)
        at = raw.find(_MEMBER_HEADER, at + 18)   # a member is at least 18 bytes: 10 of header, 8 of trailer
    if len(starts) < 2:
        return None
    bounds = np.array([*starts, len(raw)], dtype=np.int64)
    isize = np.array([int.from_bytes(raw[b - 4:b], "little") for b in bounds[1:]], dtype=np.int64)
    if (isize <= 0).any() or (isize % RECORD_BYTES).any() or int(isize.sum()) != size * RECORD_BYTES:
        return None   # a header's bytes inside compressed data, or a chunk not of whole members: read it whole
    return bounds, np.concatenate([[0], np.cumsum(isize // RECORD_BYTES)])


class _GzipChunk:
    """A chunk read from its gzip file, game by game (no room for the cache, or ``cache`` False):
    ``chunk[offsets]`` inflates only the members that hold those records, each only as far as the
    last record wanted. A 40-record game is about 1/64 of a daemon's chunk: inflating whole chunks
    (and keeping a GiB of them a worker) gave a window of a few hundred chunks about 100 samples/s a
    core, as nearly every position drawn needed a chunk of its own inflated."""

    def __init__(self, path: Path, raw: bytes, index: tuple[np.ndarray, np.ndarray], input_format: int):
        self.path, self.input_format = path, input_format
        self.raw = raw                          # the compressed chunk, about 185 B a record
        self.bounds, self.first = index
        self.nbytes = len(raw)                  # what the reader's loose-bytes bound counts
        self.size = int(self.first[-1])

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, offsets: np.ndarray) -> np.ndarray:
        offsets = np.asarray(offsets)
        out = np.empty(len(offsets), dtype=RECORD_DTYPE)
        member = np.searchsorted(self.first, offsets, side="right") - 1
        for m in np.unique(member):
            rows = np.flatnonzero(member == m)
            base = int(self.first[m])
            need = (int(offsets[rows].max()) - base + 1) * RECORD_BYTES
            try:
                data = zlib.decompressobj(wbits=31).decompress(self.raw[self.bounds[m]:self.bounds[m + 1]], need)
            except zlib.error as exc:
                raise ChunkError(f"chunk {self.path} cannot be read: game {m}: {exc}") from exc
            if len(data) != need:
                raise ChunkError(f"chunk {self.path}: game {m} holds fewer records than its trailer says")
            out[rows] = parse_chunk(data, str(self.path), self.input_format)[offsets[rows] - base]
        return out


class _BatchReader(Dataset):
    """(batch number, window) -> (number, rank's batch packed (:func:`_pack`), new bad-chunk
    messages, seconds spent): the loader's dataset.

    Runs in the worker processes, which live as long as the loader: the window comes with each
    item (a new snapshot is a new window, never new workers), and the chunks it touched stay
    memory-mapped, by name, from one window to the next.
    """

    def __init__(self, store: ReplayStore, rank: int, world: int, q_ratio: float = 0.0, cache: bool = True):
        self.chunks_dir = store.chunks_dir
        self.q_ratio = q_ratio
        self.cache = cache
        self.input_format = store.input_format
        self.cache_dir = store.cache_dir
        self.rank, self.world = rank, world
        self._open: OrderedDict[str, np.ndarray] = OrderedDict()   # least recently used first
        self._loose_bytes = 0   # of the arrays in _open that are in memory, not mapped
        self._maps = 0          # of the arrays in _open that are mapped
        self._bad: set[str] = set()
        self._found: list[str] = []
        self._loads = [0, 0]    # chunks loaded since the last item: mapped from the cache, inflated from gzip
        self._warned_full = False

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_open"] = OrderedDict()
        state["_loose_bytes"] = 0
        state["_maps"] = 0
        state["_found"] = []
        state["_loads"] = [0, 0]
        return state

    def _load(self, name: str, size: int) -> np.ndarray | None:
        cache, bad = cache_paths(self.cache_dir, name)
        if bad.exists():
            return None
        try:
            mapped = np.memmap(cache, dtype=RECORD_DTYPE, mode="r") if self.cache else None
            if (mapped is not None and len(mapped) == size and int(mapped[0]["version"]) == RECORD_VERSION
                    and int(mapped[0]["input_format"]) == self.input_format):
                self._loads[0] += 1
                return mapped
        except (FileNotFoundError, ValueError):   # ValueError: an empty file cannot be mapped
            pass
        path = self.chunks_dir / name
        free = _cache_room(self.cache_dir, size * RECORD_BYTES) if self.cache else None
        if free is not None and not self._warned_full:   # the learner logs it, as it logs unreadable chunks
            self._warned_full = True
            self._found.append(f"replay cache: {free / 1e9:.1f} GB free on {self.cache_dir}, too little to "
                               "cache more chunks; reading them from their gzip files, which is slower "
                               "(free space or move the run)")
        try:
            if free is not None or not self.cache:
                raw = path.read_bytes()
                index = _member_index(raw, size)
                if index is not None:   # game by game: each game read is checked as it is read
                    self._loads[1] += 1
                    return _GzipChunk(path, raw, index, self.input_format)
            records = read_chunk(path, self.input_format)
            if len(records) != size:
                raise ChunkError(f"chunk {path} holds {len(records)} records, the manifest says {size}")
        except (ChunkError, OSError) as exc:
            self._skip(exc, path, bad)
            return None
        if free is not None or not self.cache:
            self._loads[1] += 1
            return records
        try:
            with atomic_open(cache, "wb") as f:
                f.write(records.tobytes())
        except OSError as exc:   # a full disk slows the loader down; it does not stop the learner
            log.warning("cannot cache %s (%s): reading it from memory", cache, exc)
            self._loads[1] += 1
            return records
        self._loads[0] += 1
        return np.memmap(cache, dtype=RECORD_DTYPE, mode="r")

    def _skip(self, exc: Exception, path: Path, bad: Path) -> None:
        """Mark chunk ``path`` unreadable (once, whichever process finds it) for ``exc``; a transient
        error of the system is raised instead."""
        if _is_transient(exc):   # the system's trouble, not the chunk's: never mark good data bad
            raise exc
        reason = f"skipping chunk {path}: {exc}; its positions are drawn from other chunks"
        if _mark_bad(bad, reason):
            self._found.append(reason)

    def _chunk(self, name: str, size: int) -> np.ndarray | _GzipChunk | None:
        if name in self._bad:
            return None
        data = self._open.get(name)
        if data is not None:
            self._open.move_to_end(name)
            return data
        data = self._load(name, size)
        if data is None:
            self._bad.add(name)
            return None
        self._open[name] = data
        if isinstance(data, np.memmap):
            self._maps += 1
        else:
            self._loose_bytes += data.nbytes
        # each map holds a file descriptor; each loose chunk, 21 MB of memory (a _GzipChunk, its 0.5 MB of
        # gzip, so that a GiB holds a window of 5 million positions: evicted, it costs a read of its file)
        while self._maps > _MAX_OPEN_CHUNKS or (self._loose_bytes > _MAX_LOOSE_BYTES and len(self._open) > 1):
            _, old = self._open.popitem(last=False)
            if isinstance(old, np.memmap):
                self._maps -= 1
            else:
                self._loose_bytes -= old.nbytes
        return data

    def __getitem__(self, item: tuple[int, _Window]) -> tuple[int, torch.Tensor, list[str], float, list[int]]:
        start = time.perf_counter()
        batch, w = item
        a, b = self.rank * w.batch_size // self.world, (self.rank + 1) * w.batch_size // self.world
        chunk, offsets = w.draw(batch)
        chunk, offsets = chunk[a:b].copy(), offsets[a:b].copy()
        records = np.empty(b - a, dtype=RECORD_DTYPE)
        done = np.zeros(b - a, dtype=bool)
        for attempt in range(_MAX_REDRAWS + 1):
            todo = np.flatnonzero(~done)
            if not todo.size:
                break
            if attempt:   # positions in unreadable chunks: the same redraw whoever finds them, whenever
                redraw_chunk, redraw_offsets = w.draw(batch, attempt)
                chunk[todo], offsets[todo] = redraw_chunk[a + todo], redraw_offsets[a + todo]
            for c in np.unique(chunk[todo]):
                data = self._chunk(w.names[c], int(w.sizes[c]))
                if data is None:
                    continue
                rows = todo[chunk[todo] == c]
                try:
                    records[rows] = data[offsets[rows]]
                except ChunkError as exc:   # a game read alone (_GzipChunk) found broken
                    self._skip(exc, data.path, cache_paths(self.cache_dir, w.names[c])[1])
                    self._bad.add(w.names[c])
                    self._loose_bytes -= self._open.pop(w.names[c]).nbytes
                    continue
                done[rows] = True
        else:
            raise RuntimeError(f"no readable chunk among {len(w.names)} in the replay window: see replay/cache/*.bad")
        found, self._found = self._found, []
        loads, self._loads = self._loads, [0, 0]
        packed = _pack(records, shared=get_worker_info() is not None, q_ratio=self.q_ratio,
                       input_format=self.input_format)
        return batch, packed, found, time.perf_counter() - start, loads


def _ignore_stop_signals(worker_id: int) -> None:
    """Loader workers leave SIGINT and SIGTERM to the learner, which stops after its step and
    then shuts them down: a Ctrl-C reaches the terminal's whole process group, and a worker
    ended by it would end the learner with an error instead of a final checkpoint. (A worker
    whose learner is gone still exits: the DataLoader watches its parent.)"""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _identity(item):
    return item


class _Feed:
    """The loader's index stream: ``(batch number, window)`` for the batches the sampler allows
    now, from its next batch on. Iterated afresh (in the learner's process) at each new plan."""

    def __init__(self) -> None:
        self.window: _Window | None = None
        self.first = self.count = 0

    def __iter__(self) -> Iterator[tuple[int, _Window]]:
        window, first, count = self.window, self.first, self.count
        return ((n, window) for n in range(first, first + count))


class ReplayLoader:
    """Batches from worker processes: this rank's slice of each global batch, in batch order.

    Iterating yields the batches ``sampler.next_batch``, ``+1``, ... and advances
    the sampler as each is handed over; ``next()`` raises :class:`DataStarved`
    when the cap is reached (call ``sampler.refresh()`` when new data came, then
    ``next()`` again).  The worker processes start once and live as long as the
    loader: a new snapshot or a loaded cursor is a new plan sent to the same workers
    (each item carries its window), and batches prefetched from the old plan are
    dropped. (Restarting them after every wait for games cost about three batches'
    time each, which under the daemon was most of what the learner did.)

    ``pin_memory`` (for a CUDA learner; ignored where torch has no CUDA): every batch is
    handed over in page-locked memory, so that its copy to the GPU can be asynchronous
    (``non_blocking``). With workers, the DataLoader's pinning thread copies each packed
    batch (one buffer, :func:`_pack`) into pinned memory ahead of time; without workers the
    batch is pinned as it is handed over.

    ``q_ratio``: the search's share of the value target (``loss.value_q_ratio``); the
    validation batch keeps the game result, so held-out losses stay comparable between runs.

    :meth:`rates` says which side limits: what the workers could deliver (their positions
    per second of work, times their number) and the share of the learner's time spent
    waiting for a batch.

    ``cache`` False: never map or write the decompressed cache, read every chunk from its gzip
    file, as a loader does when the disk has no room for the cache (``bench store`` measures
    that path so). :attr:`chunk_loads` counts the chunks its workers loaded each way.
    """

    def __init__(self, store: ReplayStore, sampler: ReplaySampler, *, rank: int = 0, world: int = 1,
                 workers: int = 2, prefetch: int = 4, pin_memory: bool = False, q_ratio: float = 0.0,
                 cache: bool = True):
        if not 0 <= rank < world:
            raise ValueError(f"rank {rank} is not in a world of {world}")
        if sampler.batch_size < world:
            raise ValueError(f"batch size {sampler.batch_size} cannot be split among {world} ranks")
        if workers < 0 or prefetch < 1:
            raise ValueError(f"need workers >= 0 and prefetch >= 1, got {workers} and {prefetch}")
        self.store, self.sampler = store, sampler
        self.rank, self.world = rank, world
        self.workers, self.prefetch = workers, prefetch
        self.q_ratio = q_ratio
        self.pin_memory = bool(pin_memory) and torch.cuda.is_available()
        self._reader = _BatchReader(store, rank, world, q_ratio, cache=cache)
        self._feed = _Feed()
        self._loader: DataLoader | None = None
        self._iter: Iterator | None = None
        self._state: tuple[int, int] | None = None   # (sampler version, next batch) the stream follows
        self._left = 0
        self.plans = 0            # plans started (a new snapshot or cursor each)
        self._work_s = 0.0        # workers' seconds spent on the batches handed over
        self._wait_s = 0.0        # the caller's seconds inside next()
        self._positions = 0       # positions handed over
        #: chunks the workers loaded for the batches handed over: mapped from the cache, or
        #: inflated from their gzip files (no room for the cache, or ``cache`` False)
        self.chunk_loads = {"cache": 0, "gzip": 0}

    def _start(self) -> None:
        s = self.sampler
        self._state = (s.version, s.next_batch)
        self._left = s.batches_available()
        self._iter = None
        if self._left == 0:
            return
        self.plans += 1
        self._feed.window, self._feed.first, self._feed.count = s._plan, s.next_batch, self._left
        if self.workers == 0:
            self._iter = map(self._reader.__getitem__, iter(self._feed))
            return
        if self._loader is None:
            context = "fork" if "fork" in multiprocessing.get_all_start_methods() else None
            self._loader = DataLoader(
                self._reader, batch_size=None, sampler=self._feed, num_workers=self.workers, collate_fn=_identity,
                prefetch_factor=max(1, -(-self.prefetch // self.workers)), pin_memory=self.pin_memory,
                multiprocessing_context=context, worker_init_fn=_ignore_stop_signals, persistent_workers=True,
            )
        self._iter = iter(self._loader)   # persistent workers: the same processes, the new plan

    def __iter__(self) -> "ReplayLoader":
        return self

    def __next__(self) -> Batch:
        s = self.sampler
        start = time.perf_counter()
        if self._state != (s.version, s.next_batch):
            self._start()
        if self._left == 0 or self._iter is None:
            raise DataStarved(s.starved_message())
        number, flat, found, work_s, loads = next(self._iter)
        self.chunk_loads["cache"] += loads[0]
        self.chunk_loads["gzip"] += loads[1]
        if number != s.next_batch:
            raise RuntimeError(f"replay loader delivered batch {number}, expected {s.next_batch}")
        for reason in found:
            log.warning("%s", reason)
        s.advance()
        self._left -= 1
        self._state = (s.version, s.next_batch)
        if self.pin_memory and not flat.is_pinned():   # no workers: no pinning thread either
            flat = flat.pin_memory()
        batch = _unpack(flat)
        self._work_s += work_s
        self._wait_s += time.perf_counter() - start
        self._positions += len(batch.planes)
        return batch

    def rates(self, busy_s: float) -> dict[str, float]:
        """Since the last call: ``loader_samples_per_s``, what the workers could deliver (positions
        per second of their work, times the workers, times the ranks: global samples, as the
        learner's own rate), and ``loader_wait_share``, the share of ``busy_s`` (the caller's
        training time) it spent waiting inside ``next()`` (near 0: the loader keeps ahead; near 1:
        the loader is what limits)."""
        out: dict[str, float] = {}
        if self._positions and self._work_s > 0:
            out["loader_samples_per_s"] = self._positions / self._work_s * max(1, self.workers) * self.world
        if busy_s > 0:
            out["loader_wait_share"] = min(1.0, self._wait_s / busy_s)
        self._work_s = self._wait_s = 0.0
        self._positions = 0
        return out

    def close(self) -> None:
        it, self._iter, self._loader = self._iter, None, None
        shutdown = getattr(it, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()
        self._state = None

    def __enter__(self) -> "ReplayLoader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


_reported: set[str] = set()


VALIDATION_SPREAD = 4   # validation_batch samples from this many times the positions it returns


def validation_batch(store: ReplayStore, window: WindowConfig, positions: int, seed: int = 0) -> Batch | None:
    """A fixed sample of ``positions`` held-out positions from the newest validation chunks; None if none.

    The sample is drawn from :data:`VALIDATION_SPREAD` times as many positions, so that it
    spans several chunks' games rather than the forty-odd of the newest one: a sample from
    one chunk's few games moved a network's loss by hundredths from one chunk to the next.
    The same store contents and seed give the same sample.
    """
    if positions < 1:
        raise ValueError(f"positions must be >= 1, got {positions}")
    held_out = [e for e in store.entries() if is_validation(e.name, window.val_percent)]
    arrays, total = [], 0
    for entry in reversed(held_out):
        if total >= VALIDATION_SPREAD * positions:
            break
        try:
            records = read_chunk(store.chunks_dir / entry.name, store.input_format)
        except (ChunkError, OSError) as exc:
            if entry.name not in _reported:
                _reported.add(entry.name)
                log.warning("skipping validation chunk %s: %s", entry.name, exc)
            continue
        arrays.append(records)
        total += len(records)
    if not arrays:
        return None
    records = np.concatenate(arrays[::-1])
    pick = np.random.default_rng([seed]).choice(len(records), size=min(positions, len(records)), replace=False)
    return _to_batch(records[np.sort(pick)], store.input_format)


def warm_cache(sampler: ReplaySampler) -> int:
    """Build the decompressed cache of the chunks in ``sampler``'s window now, as the loader's workers
    would as they go, so that a measurement after it times the loader warm; returns those chunks."""
    reader, plan = _BatchReader(sampler.store, 0, 1), sampler._plan
    for name, size in zip(plan.names, plan.sizes):
        reader._chunk(name, int(size))
    return len(plan.names)


def loader_throughput(store: ReplayStore, window: WindowConfig, batch_size: int, workers: int,
                      batches: int) -> float:
    """Samples/s a :class:`ReplayLoader` delivers once warm (caches built, workers running)."""
    sampler = ReplaySampler(store, dataclasses.replace(window, max_samples_per_position=math.inf), batch_size)
    warm_cache(sampler)
    loader = ReplayLoader(store, sampler, workers=workers, prefetch=max(2, 2 * workers))
    try:
        next(loader)
        start = time.perf_counter()
        for _ in range(batches):
            next(loader)
        return batches * batch_size / (time.perf_counter() - start)
    finally:
        loader.close()
