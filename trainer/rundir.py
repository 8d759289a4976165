"""The run folder: every file and folder name in it, the one run lock, process liveness, and the
config a start uses.

The learner, the daemon, the store, the ladder, the bootstrap and ``cyzero-train status`` all
name a run's files through this module, so a name lives in one place. It imports neither torch
nor numpy nor the engine (``status`` answers at once), only :mod:`trainer.config` and
:mod:`trainer.atomic`. The layout is described in ``docs/training.md``.

Readers here never fail on what a writer left: another process may be writing any of these
files, so a torn or garbled line or file is skipped, a missing one is empty.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import re
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

from trainer.atomic import json_objects
from trainer.config import CONFIG_FILE, EFFECTIVE_CONFIG_FILE, TrainConfig, load_config, load_run_config, named_config_path

__all__ = [
    "CONFIG_FILE", "EFFECTIVE_CONFIG_FILE", "CHECKPOINT_DIR", "NETWORK_DIR", "METRICS_FILE", "GENERATIONS_FILE",
    "TENSORBOARD_DIR", "PROGRESS_FILE", "DAEMON_FILE", "WORKERS_FILE", "PUBLISHED_FILE", "GATING_FILE", "PGN_DIR",
    "LOG_DIR", "EVALUATION_FILE", "RATINGS_FILE", "REPLAY_DIR", "MANIFEST", "BOOTSTRAP_DIR", "RUN_MARKERS",
    "LEARNER_LOCK", "DAEMON_LOCK", "EVALUATION_LOCK", "RunBusy", "run_lock", "lock_path", "checkpoint_path",
    "network_path", "bootstrap_state_path", "list_checkpoints", "check_run_dir", "resolve_config", "pid_alive", "process_runs", "Chunk",
    "CHUNK_NAME", "manifest_record", "ManifestLog", "read_manifest", "read_evaluations", "read_ratings", "OPPONENT",
    "read_log", "read_log_tail",
    "read_json_object", "as_number", "as_int", "as_text",
]

# The learner's (trainer.learner)
CHECKPOINT_DIR = "checkpoints"       # step-XXXXXXXX.pt
NETWORK_DIR = "networks"             # gen-XXXXX.onnx and their .sha256
METRICS_FILE = "metrics.jsonl"
GENERATIONS_FILE = "generations.jsonl"
TENSORBOARD_DIR = "tensorboard"
PROGRESS_FILE = "learner.json"       # where the learner is now, for status
# The daemon's (trainer.daemon)
DAEMON_FILE = "daemon.json"
WORKERS_FILE = "workers.json"
PUBLISHED_FILE = "published.jsonl"
GATING_FILE = "gating.jsonl"
PGN_DIR = "pgn"
LOG_DIR = "logs"
# The ladder's (trainer.evaluate)
EVALUATION_FILE = "evaluation.jsonl"
RATINGS_FILE = "ratings.json"
# The store's (trainer.store still names its manifest itself: tests/test_report.py checks they agree)
REPLAY_DIR = "replay"
MANIFEST = os.path.join(REPLAY_DIR, "manifest.jsonl")
# The bootstrap's progress files and locks (trainer.bootstrap)
BOOTSTRAP_DIR = "bootstrap"

# The locks run_lock takes: name -> (the file, who holds it, as an error names them).
LEARNER_LOCK = "learner"
DAEMON_LOCK = "daemon"
EVALUATION_LOCK = "evaluation"
_LOCKS = {
    LEARNER_LOCK: ("learner.lock", "another learner"),
    DAEMON_LOCK: ("daemon.lock", "another daemon"),
    EVALUATION_LOCK: ("evaluation.lock", "another `cyzero-train evaluate`"),
    "teacher": (os.path.join(BOOTSTRAP_DIR, "teacher.lock"), "another bootstrap (teacher)"),
    "pgn": (os.path.join(BOOTSTRAP_DIR, "pgn.lock"), "another bootstrap (pgn)"),
}

#: What makes a folder a run directory: any one of these (a run that only has its config counts).
RUN_MARKERS = (CONFIG_FILE, EFFECTIVE_CONFIG_FILE, MANIFEST, CHECKPOINT_DIR, NETWORK_DIR, METRICS_FILE,
               GENERATIONS_FILE, PROGRESS_FILE, _LOCKS[LEARNER_LOCK][0], DAEMON_FILE, _LOCKS[DAEMON_LOCK][0],
               WORKERS_FILE, PUBLISHED_FILE, GATING_FILE, EVALUATION_FILE, RATINGS_FILE)


def checkpoint_path(run_dir: str | os.PathLike, step: int) -> str:
    return os.path.join(os.fspath(run_dir), CHECKPOINT_DIR, f"step-{step:08d}.pt")


def network_path(run_dir: str | os.PathLike, generation: int) -> str:
    return os.path.join(os.fspath(run_dir), NETWORK_DIR, f"gen-{generation:05d}.onnx")


def bootstrap_state_path(run_dir: str | os.PathLike, source: str) -> str:
    """RUN/bootstrap/SOURCE.json: how far the bootstrap from ``source`` (``teacher``, ``pgn``) has got."""
    return os.path.join(os.fspath(run_dir), BOOTSTRAP_DIR, f"{source}.json")


def list_checkpoints(run_dir: str | os.PathLike) -> list[tuple[int, str]]:
    """``(step, path)`` of every ``checkpoints/step-XXXXXXXX.pt``, oldest first."""
    folder = os.path.join(os.fspath(run_dir), CHECKPOINT_DIR)
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    found = []
    for name in names:
        match = re.fullmatch(r"step-(\d{8,})\.pt", name)
        if match:
            found.append((int(match.group(1)), os.path.join(folder, name)))
    return sorted(found)


def check_run_dir(run_dir: str | os.PathLike) -> str:
    """``run_dir`` as a string; ValueError "... is not a run directory" for a folder that does
    not exist or holds none of a run's files (so ``status /tmp`` does not show an empty run)."""
    run_dir = os.fspath(run_dir)
    if not os.path.isdir(run_dir):
        raise ValueError(f"{run_dir} is not a run directory: there is no such folder")
    if not any(os.path.exists(os.path.join(run_dir, name)) for name in RUN_MARKERS):
        raise ValueError(f"{run_dir} is not a run directory: it holds none of a run's files ({CONFIG_FILE}, "
                         f"{MANIFEST}, {CHECKPOINT_DIR}/, {METRICS_FILE}, {DAEMON_FILE}, ...); "
                         "`cyzero-train run RUN` or `cyzero-train bootstrap RUN ...` makes one")
    return run_dir


def resolve_config(run_dir: str | os.PathLike, config: str | os.PathLike | None = None) -> TrainConfig:
    """The config a start uses: ``config`` (a path or a bundled config's name) if given, else
    RUN/config.toml, else the defaults (``learn``, ``run`` and ``evaluate`` alike)."""
    if config is None:
        return load_run_config(run_dir)
    return load_config(named_config_path(config))


# --------------------------------------------------------------------------- the run lock


class RunBusy(ValueError):
    """Another process holds the lock this one asked for (the message names it and its pid)."""


def lock_path(run_dir: str | os.PathLike, name: str) -> str:
    return os.path.join(os.fspath(run_dir), _LOCKS[name][0])


@contextlib.contextmanager
def run_lock(run_dir: str | os.PathLike, name: str) -> Iterator[None]:
    """One process of a kind per run (``name``: :data:`LEARNER_LOCK`, :data:`DAEMON_LOCK`,
    :data:`EVALUATION_LOCK`, ``teacher`` or ``pgn``): an exclusive flock, which the kernel drops
    when the holder dies, on a file that holds the holder's pid; :class:`RunBusy` while another
    holds it."""
    path = lock_path(run_dir, name)
    if os.path.dirname(_LOCKS[name][0]):  # the bootstrap's, in its own folder
        os.makedirs(os.path.dirname(path), exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
            raise RunBusy(f"{_LOCKS[name][1]} is running on {os.fspath(run_dir)} (pid {holder})") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)


# --------------------------------------------------------------------------- processes


def pid_alive(pid: Any) -> bool | None:
    """Whether process ``pid`` exists on this machine (None: not a pid)."""
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, under another user
        return True
    except OSError:
        return None
    return True


_CLI_NAMES = ("cyzero-train", "trainer.cli", "cli.py")


def process_runs(pid: Any, command: str, run_dir: str) -> bool | None:
    """Whether process ``pid`` is ``cyzero-train COMMAND RUN`` (or ``python -m trainer.cli COMMAND
    RUN``) on this run directory, not another process that got the pid after the one recorded
    ended: its command line (``/proc/PID/cmdline``) is read, and a relative RUN is taken from its
    working directory. None: ``pid`` is not a pid. Without /proc (not Linux), whether it exists."""
    alive = pid_alive(pid)
    if not alive or not os.path.isdir("/proc/self"):
        return alive
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            args = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except FileNotFoundError:
        return False  # it ended meanwhile
    except OSError:
        return alive
    try:
        cwd: str | None = os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        cwd = None
    target = os.path.realpath(run_dir)
    for i, arg in enumerate(args):
        if arg in _CLI_NAMES or os.path.basename(arg) in _CLI_NAMES[:1] or arg.endswith("/trainer/cli.py"):
            rest = args[i + 1:]
            if command not in rest:
                continue
            for candidate in rest[rest.index(command) + 1:]:
                if candidate.startswith("-"):
                    continue
                if os.path.isabs(candidate) or cwd is not None:
                    if os.path.realpath(os.path.join(cwd or "/", candidate)) == target:
                        return True
                elif os.path.basename(os.path.normpath(candidate)) == os.path.basename(target):
                    return True  # its working directory is not ours to read: the folder's name must do
    return False


# --------------------------------------------------------------------------- readers


def read_log(path: str) -> list[dict]:
    """The JSON objects of a log (a torn or garbled line skipped; nothing for a missing file)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return []
    return json_objects(data.split(b"\n"))


def read_log_tail(path: str, n: int = 2, tail: int = 1 << 16) -> list[dict]:
    """The last ``n`` JSON objects of an append-only log, read from its end (a long log costs
    nothing more); fewer when the log has fewer."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            while True:
                start = max(0, size - tail)
                f.seek(start)
                data = f.read(size - start)
                lines = data.split(b"\n")
                if start > 0:
                    lines = lines[1:]  # the first may be the end of a line cut by the seek
                found = json_objects(lines)
                if len(found) >= n or start == 0:
                    return found[-n:]
                tail *= 4
    except OSError:
        return []


def read_json_object(path: str) -> dict | None:
    """A JSON object file, or None when it is missing, unreadable or not an object."""
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def as_number(value: Any) -> int | float | None:
    """A finite number, or None (so a garbled field reads as unknown and stays valid JSON)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return value if math.isfinite(value) else None


def as_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def as_text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


class Chunk(NamedTuple):
    """One chunk added to the replay manifest."""

    name: str          # file name under replay/chunks
    positions: int
    games: int
    generation: int    # network generation that played the games (0 = bootstrap/PGN/teacher)
    source: str        # "teacher", "pgn", "selfplay", "lc0", ...
    time: float        # unix time it became durable


CHUNK_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*\.gz")
_GAME_IDS = b',"game_ids":'


def manifest_record(line: bytes) -> Chunk | list[str]:
    """What one line of the replay manifest records: an added chunk, or the names a prune removed;
    ``ValueError`` for a torn or malformed line. A self-play line ends with its game ids, most of
    its bytes: they are cut off before the line is parsed (the whole line is parsed when the cut
    one is not JSON); only the duplicate check reads them (``ReplayStore.newest_game_ids``)."""
    cut = line.find(_GAME_IDS)
    try:
        obj = json.loads(line[:cut] + b"}" if cut > 0 else line)
    except ValueError:
        obj = json.loads(line)
    if not isinstance(obj, dict):
        raise ValueError("not a JSON object")
    op = obj.get("op")
    if op == "prune":
        if not isinstance(obj.get("names"), list):
            raise ValueError("a prune line lists names")
        return [str(name) for name in obj["names"]]
    if op != "add":
        raise ValueError(f"unknown op {op!r}")
    name, source, when = obj.get("name"), obj.get("source"), as_number(obj.get("time"))
    if not (isinstance(name, str) and CHUNK_NAME.fullmatch(name)):
        raise ValueError(f"bad chunk name {name!r}")
    counts = [obj.get(field) for field in ("positions", "games", "generation")]
    for field, value in zip(("positions", "games", "generation"), counts):
        if as_int(value) is None or value < 0:
            raise ValueError(f"bad {field} {value!r}")
    if counts[0] == 0 or not isinstance(source, str) or when is None:
        raise ValueError("a chunk needs positions, a source and a time")
    return Chunk(name, *counts, source, float(when))


class ManifestLog:
    """The replay manifest (an append-only log) replayed: its records in order, and the live chunks.

    :meth:`read` parses only the complete lines appended since its last call, under a shared
    ``flock`` so that no half-written line is taken; a torn or malformed line is skipped (said
    through ``warn``). The one parser of the log: the store, ``status``, ``plot`` and the ladder.
    """

    def __init__(self, path: str | os.PathLike, warn: Callable[[str], None] | None = None) -> None:
        self.path = path
        self.offset = 0                               # bytes parsed so far
        self.records: list[Chunk | list[str]] = []   # each line: an added chunk, or pruned names
        self.live: dict[str, Chunk] = {}              # the log replayed to its end, oldest first
        self._warn = warn

    def read(self) -> ManifestLog:
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return self
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            blocks = []
            offset = self.offset
            while block := os.pread(fd, 1 << 20, offset):
                blocks.append(block)
                offset += len(block)
        finally:
            os.close(fd)
        data = b"".join(blocks)
        for line in data[: data.rfind(b"\n") + 1].split(b"\n")[:-1]:   # a last line without its newline is in progress
            at = self.offset
            self.offset += len(line) + 1
            if not line.strip():
                continue
            try:
                record = manifest_record(line)
            except ValueError as exc:
                if self._warn:
                    self._warn(f"{self.path}: ignoring a torn or malformed line at byte {at} ({exc})")
                continue
            self.records.append(record)
            if isinstance(record, Chunk):
                self.live.setdefault(record.name, record)
            else:
                for name in record:
                    self.live.pop(name, None)
        return self

    def live_after(self, records: int) -> list[Chunk]:
        """The live chunks after the log's first ``records`` records (a sampler's snapshot)."""
        live: dict[str, Chunk] = {}
        for record in self.records[:records]:
            if isinstance(record, Chunk):
                live.setdefault(record.name, record)
            else:
                for name in record:
                    live.pop(name, None)
        return list(live.values())


def read_manifest(run_dir: str) -> list[Chunk]:
    """The live chunks of RUN/replay/manifest.jsonl, oldest first."""
    return list(ManifestLog(os.path.join(run_dir, MANIFEST)).read().live.values())


OPPONENT = re.compile(r"random|gen\d+|sf-skill\d+")  # the ladder's players (trainer.evaluate)


def read_evaluations(run_dir: str) -> list[dict]:
    """The well-formed lines of ``RUN/evaluation.jsonl``, in file order: a torn, garbled or
    incomplete line is skipped (another process may be appending); numbers that are not finite
    read as None. (``trainer.evaluate`` writes them and reads them back with this.)"""
    rows = []
    for r in read_log(os.path.join(run_dir, EVALUATION_FILE)):
        row = {"generation": as_int(r.get("generation")), "opponent": r.get("opponent"),
               **{k: as_int(r.get(k)) for k in ("wins", "draws", "losses", "games", "nodes")},
               **{k: (None if as_number(r.get(k)) is None else r[k] + 0.0)
                  for k in ("score", "elo", "elo_error", "time")}}
        if (row["generation"] is None or not isinstance(row["opponent"], str)
                or not OPPONENT.fullmatch(row["opponent"]) or row["nodes"] is None
                or None in (row["wins"], row["draws"], row["losses"], row["games"])):
            continue
        rows.append(row)
    return rows


def read_ratings(run_dir: str) -> dict | None:
    """``RUN/ratings.json`` (the ladder's fit, trainer.evaluate.write_ratings) with its generations'
    fields checked; None when absent or unreadable."""
    data = read_json_object(os.path.join(run_dir, RATINGS_FILE))
    if not isinstance(data, dict) or not isinstance(data.get("generations"), list):
        return None
    keys = ("elo", "low", "high", "hours")
    curve = []
    for row in data["generations"]:
        if isinstance(row, dict) and as_int(row.get("generation")) is not None and as_number(row.get("elo")) is not None:
            curve.append({"generation": row["generation"], **{k: as_number(row.get(k)) for k in keys},
                          "games": as_int(row.get("games")), "selfplay_games": as_int(row.get("selfplay_games"))})
    players = data.get("players")
    players = players if isinstance(players, dict) else {}
    anchors = {name: {k: as_number(p.get(k)) for k in ("elo", "low", "high")} for name, p in players.items()
               if isinstance(p, dict) and as_number(p.get("elo")) is not None and not re.fullmatch(r"gen\d+", name)}
    return {"nodes": as_int(data.get("nodes")), "time": as_number(data.get("time")), "generations": curve,
            "anchors": anchors}
