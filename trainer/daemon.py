"""``cyzero-train run``: the training daemon (self-play workers, the learner, publishing).

One process per run directory (an flock on ``RUN/daemon.lock``) that

* serves the workers' ROUTER (:mod:`trainer.wire`): ``Register`` -> ``Registered``,
  heartbeats, and finished games, which it writes to the replay store and only then
  acknowledges (durable-then-ack), dropping a game whose id is among the newest stored
  (``RECENT_GAME_IDS``, a bounded memory), so a worker may resend until it sees its ``Ack``
  and no game is stored twice;
* starts and supervises the local workers (``cyzero-train worker``, one per device and
  slot) and the learner (``cyzero-train learn --follow``): a child that exits, or a worker
  silent for ``daemon.heartbeat_timeout_s``, is restarted after a backoff;
* polls ``RUN/generations.jsonl`` for the learner's exports and announces each new one on
  the PUB socket (:class:`engine.announce.Announcer`, which also serves the bytes to
  followers that cannot read the run), after a gating match when ``[gating]`` is on.

The spec of the run directory's files (``daemon.json``, ``workers.json``,
``published.jsonl``, ``gating.jsonl``, ``pgn/``, ``logs/``) is in docs/training.md.
A malformed message is logged (rate-limited) and dropped, never fatal. Binding anything
but loopback needs CurveZMQ keys. No pickle; torch only through :func:`initialize_run` and
the device check at start.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import fcntl
import ipaddress
import json
import logging
import math
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Iterable, Optional, Sequence

import zmq

from engine.announce import rehost
from trainer import EXIT_WITH_PARENT_ENV, wire
from trainer.atomic import append_durably, append_jsonl, atomic_write_text, read_jsonl
from trainer.config import TrainConfig, load_config, named_config_path
from trainer.devices import (
    NO_LEARNER, check_cuda, learner_devices, learner_ranks, selfplay_devices, usable_core_ids, usable_cores,
)
from trainer.report import describe_share, reachable  # the words status uses too (report imports nothing heavy)
from trainer.rundir import (
    CONFIG_FILE, DAEMON_FILE, DAEMON_LOCK, EFFECTIVE_CONFIG_FILE, GATING_FILE, GENERATIONS_FILE, LOG_DIR, PGN_DIR,
    PUBLISHED_FILE, WORKERS_FILE, resolve_config, run_lock,
)
from trainer.stop_signals import on_signals

__all__ = ["Daemon", "run_daemon", "check_bind"]

Log = Callable[[str], Any]

WORKERS_EVERY_S = 5.0  # workers.json rewritten this often
GENERATIONS_EVERY_S = 1.0  # generations.jsonl polled this often
STOP_WAIT_S = 90.0  # children's time to stop cleanly (the learner's final checkpoint and export)
MAX_BACKOFF_S = 60.0
QUICK_DEATH_S = 60.0  # a child dying sooner after its start doubles its next backoff
ALIVE_S = 10.0  # a worker heard from within this (5 of trainer.worker's heartbeats) counts as alive
SILENT_S = 30.0  # a worker not heard from for this long is said to be silent (and again when it is back)
FORGET_S = 3600.0  # a remote worker silent this long leaves the workers list (a one-off client, a machine gone)
RECENT_GAME_IDS = 100_000  # stored game ids remembered to drop resends: about 13 MB (see _RecentIds)
# Flow control is credit (trainer/wire.py): the live workers share IN_FLIGHT_GAMES games sent and not
# yet acknowledged, 1 to MAX_CREDIT each, so what waits for the daemon stays about half a second of its
# work (it stores about 1,000 games/s: docs/scale.md) however many games the fleet plays; each worker
# keeps its other games and pauses self-play at its own bound.
IN_FLIGHT_GAMES = 512
MAX_CREDIT = 64
CREDIT_EVERY_S = 1.0  # the live workers counted again this often
RECEIVE_BATCH = 256  # messages read per poll before the loop looks at its timers
# A peer's messages queued here at most: its credit's games and its heartbeats. A peer that sends more
# (credit ignored) waits in TCP, so the daemon's memory stays bounded by its peers, not their games.
PEER_QUEUE = 4 * MAX_CREDIT
# The daemon says it is at capacity when receiving and storing took AT_CAPACITY of a LOAD_WINDOW_S,
# and that it keeps up again below KEEPING_UP: the fleet then waits on credit, which is by design.
LOAD_WINDOW_S = 10.0
AT_CAPACITY = 0.9
KEEPING_UP = 0.7
MAX_ROUTER_MESSAGE = wire.MAX_FRAME_BYTES * 2 + wire.MAX_HEADER_BYTES  # a game: records, PGN and header
_RUN_CHARS = re.compile(r"[^A-Za-z0-9._:-]")


def _print(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _stderr(line: str) -> None:
    _print(f"cyzero-train run: {line}")


class _DaemonLog:
    """The daemon's lines on stderr and, with the time, in RUN/logs/daemon.log (beside its children's)."""

    def __init__(self, run_dir: str):
        self.path = os.path.join(run_dir, LOG_DIR, "daemon.log")
        self._lock = threading.Lock()
        self.echo: Log = _print  # the live display's write while it is on: the line goes above it

    def __call__(self, line: str) -> None:
        self.echo(f"cyzero-train run: {line}")
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        with self._lock:
            try:
                os.makedirs(os.path.dirname(self.path), exist_ok=True)
                with open(self.path, "a", encoding="utf-8") as f:
                    f.write(f"{stamp} {line}\n")
            except OSError:
                pass  # stderr has it


# --------------------------------------------------------------------------- small helpers


def _host(endpoint: str) -> Optional[str]:
    """The host of a ``tcp://HOST:PORT`` endpoint (None for ipc:// and inproc://, which stay local)."""
    match = re.fullmatch(r"tcp://(.+):([0-9]+|\*)", endpoint.strip())
    if match is None:
        if endpoint.startswith(("ipc://", "inproc://")):
            return None
        raise ValueError(f"endpoint {endpoint!r} is not tcp://HOST:PORT (a PORT of * picks a free one)")
    return match.group(1).strip("[]")


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # an interface name or a host name: reachable from elsewhere


def check_bind(endpoints: Sequence[str], keys: str) -> None:
    """ValueError when an endpoint is not loopback and no keys are set (nothing may listen open)."""
    for endpoint in endpoints:
        host = _host(endpoint)
        if host is not None and not _is_loopback(host) and not keys:
            raise ValueError(f"binding {endpoint} needs CurveZMQ keys: run `cyzero-train keys DIR` and set "
                             "daemon.keys")


def on_ports(config: TrainConfig, port: str) -> TrainConfig:
    """``config`` with the daemon's three sockets (endpoint, publish, fetch) on PORT, PORT+1 and PORT+2,
    each keeping its host; ``auto``: on free ports, which RUN/daemon.json and the log then name."""
    d = config.daemon
    if port == "auto":
        ports = ["*"] * 3
    else:
        try:
            base = int(port)
        except ValueError:
            raise ValueError(f"--port {port!r}: a port number (it and the next two are used) or auto") from None
        if not 1 <= base <= 65533:
            raise ValueError(f"--port {base}: between 1 and 65533 (it and the next two are used)")
        ports = [str(base + i) for i in range(3)]
    endpoints = {}
    for name, port_ in zip(("endpoint", "publish", "fetch"), ports):
        current = getattr(d, name)
        if _host(current) is None:
            raise ValueError(f"--port: daemon.{name} is {current}, not a tcp:// endpoint")
        endpoints[name] = f"{current.strip().rsplit(':', 1)[0]}:{port_}"
    return config.replace(daemon=endpoints)


def port_in_use(endpoints: Sequence[str], error: zmq.ZMQError) -> str:
    """For a bind that failed because a port is taken: who holds it (another cyzero run: its folder),
    the first of ``endpoints`` that is held, and how to choose other ports. Empty for any other failure."""
    if error.errno != zmq.EADDRINUSE:
        return ""
    ports = [int(m.group(1)) for m in (re.fullmatch(r"tcp://.+:([0-9]+)", e.strip()) for e in endpoints) if m]
    holder = next((h for h in map(_port_holder, ports) if h), "")
    return (f"{holder}. Give this run other ports: `cyzero-train run RUN --port 5790` (5790, 5791 and 5792; with "
            "make: make train PORT=5790), --port auto for free ones, or daemon.endpoint, publish and fetch "
            "in RUN/config.toml")


def _port_holder(port: int) -> str:
    """``": held by the cyzero run in FOLDER (pid N)"``, ``": held by NAME (pid N)"``, or "" where the
    holder cannot be seen (no psutil, another user's process)."""
    try:
        import psutil

        pids = {c.pid for c in psutil.net_connections(kind="inet")
                if c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN and c.pid}
        for pid in sorted(pids):
            process = psutil.Process(pid)
            run = _run_folder_of(process.cmdline(), process.cwd())
            if run is not None:
                return f": held by the cyzero run in {run} (pid {pid})"
            return f": held by {process.name()} (pid {pid})"
    except Exception:  # noqa: BLE001 - naming the holder is a courtesy; the error stands without it
        pass
    return ""


def _run_folder_of(cmdline: Sequence[str], cwd: str) -> Optional[str]:
    """The run folder of a ``cyzero-train run RUN`` command line (None for any other command), checked
    against that folder's daemon.json."""
    words = list(cmdline)
    for i, word in enumerate(words[:-1]):
        if word == "run" and any(w.endswith(("cyzero-train", "trainer.cli")) for w in words[:i]):
            folder = os.path.normpath(os.path.join(cwd, words[i + 1]))
            return folder if os.path.exists(os.path.join(folder, DAEMON_FILE)) else None
    return None


def machine_addresses() -> list[str]:
    """This machine's addresses another machine may reach it at (not loopback), best first: the
    one the default route leaves from, the host name's own, then the host name itself."""
    found: list[str] = []
    try:  # a UDP "connect" sends nothing: it only asks the kernel which address the route uses
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("192.0.2.1", 9))  # TEST-NET-1: never a real peer
            found.append(probe.getsockname()[0])
    except OSError:
        pass
    found += _interface_addresses()
    try:
        found += [info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)]
    except OSError:
        pass
    addresses = [a for a in dict.fromkeys(found) if not _is_loopback(a) and a != "0.0.0.0"]
    return addresses + [socket.gethostname()]


def _interface_addresses() -> list[str]:
    """Each network interface's IPv4 address (Linux's SIOCGIFADDR; elsewhere none): a machine with no
    default route (a cluster's private network) is still reachable at them."""
    found = []
    try:
        names = [name for _, name in socket.if_nameindex()]
    except OSError:
        return []
    for name in names:
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
                packed = fcntl.ioctl(probe.fileno(), 0x8915, struct.pack("256s", name[:15].encode()))  # SIOCGIFADDR
        except OSError:
            continue  # no IPv4 address on it
        found.append(socket.inet_ntoa(packed[20:24]))
    return found


def run_name(run_dir: str) -> str:
    """The run's name on the wire: the folder's name in the id charset."""
    name = _RUN_CHARS.sub("-", os.path.basename(os.path.abspath(run_dir)))[:128]
    return name or "run"


class _Limited:
    """A log that writes at most ``burst`` lines per ``period`` seconds, then says how many it held back."""

    def __init__(self, log: Log, burst: int = 5, period: float = 10.0):
        self._log, self._burst, self._period = log, burst, period
        self._start = 0.0
        self._count = 0
        self._held = 0
        self._lock = threading.Lock()  # the ZAP thread writes refusals through one

    def __call__(self, line: str) -> None:
        with self._lock:
            now = time.monotonic()
            if now - self._start >= self._period:
                self._say_held()
                self._start, self._count = now, 0
            if self._count < self._burst:
                self._count += 1
                self._log(line)
            else:
                self._held += 1

    def flush(self) -> None:
        """Say how many lines were held back once the period is over, even when no new line comes."""
        with self._lock:
            if self._held and time.monotonic() - self._start >= self._period:
                self._say_held()

    def _say_held(self) -> None:
        if self._held:
            self._log(f"({self._held} more such lines held back)")
        self._held = 0


class _Refusals(logging.Handler):
    """pyzmq's ZAP authenticator's debug lines -> one daemon line per refused CURVE handshake (its
    address and why), through a :class:`_Limited` log: a client without an authorised key is seen."""

    def __init__(self, log: Log, authorized: str):
        super().__init__(logging.DEBUG)
        self._log, self._authorized = log, authorized
        self._address = "?"

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        args = record.args if isinstance(record.args, tuple) else ()
        if text.startswith("version:") and len(args) >= 4:
            self._address = str(args[3])  # the request being decided: its peer's address
        elif text.startswith("DENIED"):
            self._log(f"refused a handshake from {self._address}: {text} (not a key in {self._authorized})")
        elif record.levelno >= logging.ERROR:
            self._log(f"refused a handshake from {self._address}: {text}")


def _refusal_logger(log: Log, authorized: str) -> logging.Logger:
    logger = logging.getLogger(f"cyzero.daemon.zap.{id(log)}")
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    logger.handlers = [_Refusals(log, authorized)]
    return logger


# --------------------------------------------------------------------------- children



class _Child:
    """A supervised process (a local worker or the learner): started, watched, restarted with backoff."""

    def __init__(self, name: str, command: list[str], log_path: str, base_backoff: float,
                 env: Optional[dict[str, str]] = None):
        self.name, self.command, self.log_path = name, command, log_path
        self.env = env or {}  # added to the daemon's environment
        self.cores: Optional[set[int]] = None  # its CPU affinity (None: the daemon's)
        self.base_backoff = base_backoff
        self.backoff = base_backoff
        self.proc: Optional[subprocess.Popen] = None
        self.started = 0.0  # monotonic
        self.started_wall = 0.0
        self.next_start: Optional[float] = 0.0  # monotonic; None: not to be restarted (stopping)
        self.restarts = 0
        self.spawned = 0

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def spawn(self) -> None:
        os.makedirs(os.path.dirname(self.log_path), exist_ok=True)
        with open(self.log_path, "ab") as out:  # the child holds its own descriptor
            # EXIT_WITH_PARENT_ENV: a SIGKILLed daemon leaves no worker or learner behind
            env = dict(os.environ, PYTHONUNBUFFERED="1", **self.env, **{EXIT_WITH_PARENT_ENV: str(os.getpid())})
            self.proc = subprocess.Popen(self.command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                         env=env, start_new_session=True)  # the daemon orders its stop
        if self.cores is not None:  # at once: the threads and processes it starts inherit it
            try:
                os.sched_setaffinity(self.proc.pid, self.cores)
            except OSError:
                pass  # it has just exited; the supervisor sees it
        if self.spawned:
            self.restarts += 1
        self.spawned += 1
        self.started, self.started_wall = time.monotonic(), time.time()
        self.next_start = None

    def died(self, now: float) -> float:
        """Schedule the restart after a death; returns the wait."""
        quick = now - self.started < QUICK_DEATH_S
        wait = self.backoff if quick else self.base_backoff
        self.backoff = min(wait * 2, MAX_BACKOFF_S) if quick else self.base_backoff
        self.proc = None
        self.next_start = now + wait
        return wait

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.proc.send_signal(sig)
            except ProcessLookupError:
                pass


@dataclasses.dataclass
class _Load:
    """The daemon's time spent receiving and storing since ``since`` (monotonic), and its games then."""

    since: float = dataclasses.field(default_factory=time.monotonic)
    busy: float = 0.0
    games: int = 0
    full_since: Optional[float] = None  # at capacity since then (None: keeping up)


@dataclasses.dataclass
class _Worker:
    """What the daemon knows of one worker id (local or remote)."""

    id: str
    host: str = "?"
    pid: int = 0
    devices: tuple = ()
    local: bool = False
    identity: Optional[bytes] = None  # its DEALER's routing id
    last_seen: float = 0.0  # unix time of its last message (0: none yet)
    last_heard: float = 0.0  # monotonic
    generation: Optional[int] = None
    playing: int = 0
    positions_per_s: float = 0.0
    games: int = 0
    positions: int = 0
    started: float = dataclasses.field(default_factory=time.time)
    child: Optional[_Child] = None
    silent_since: Optional[float] = None  # monotonic time it was said to be silent (None: heard lately)
    buffered: int = 0  # its games received and not yet stored


# --------------------------------------------------------------------------- the daemon


class _RecentIds:
    """The ids of the newest ``limit`` games stored, oldest forgotten first: the duplicate check.

    A worker resends only the games it holds unacknowledged (trainer.worker keeps at most
    ``MAX_UNACKED_GAMES`` of them, pausing self-play at that bound), a few seconds after
    sending them or right after a daemon restart, so a resent game is among the newest
    stored ones; remembering every id ever stored cost about 100 bytes a game, forever.
    A resend of a game stored more than ``limit`` games ago (a worker cut off for that
    long whose ack was lost) is stored a second time: one duplicate, not a lost game.
    About 130 bytes an id (the 32-character string, its set slot and its queue slot).
    """

    def __init__(self, limit: int, ids: Iterable[str] = ()) -> None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"recent_game_ids must be a whole number >= 1, got {limit!r}")
        self.limit = limit
        self._ids: set[str] = set()
        self._order: collections.deque[str] = collections.deque()
        self.update(ids)

    def __contains__(self, game_id: object) -> bool:
        return game_id in self._ids

    def __len__(self) -> int:
        return len(self._ids)

    def update(self, ids: Iterable[str]) -> None:
        """Remember ``ids`` (oldest first) as the newest stored; forget the oldest past the limit."""
        for game_id in ids:
            if game_id in self._ids:
                continue
            self._ids.add(game_id)
            self._order.append(game_id)
            if len(self._order) > self.limit:
                self._ids.discard(self._order.popleft())


class Daemon:
    """The training daemon of one run directory; :func:`run_daemon` drives it.

    ``start()`` takes the run's lock, creates generation 0, binds the sockets and starts the
    children; ``serve(stop)`` runs the loop until ``stop`` is set; ``stop()`` flushes, stops
    everyone and releases the run. ``worker_command``/``learner_command`` (callables with the
    methods' signatures) replace the child commands, for tests. ``recent_game_ids``: how many of
    the newest stored game ids are remembered to drop a worker's resends (:class:`_RecentIds`).
    """

    def __init__(self, run_dir: str | os.PathLike, config: TrainConfig, *, devices: Optional[str] = None,
                 workers_per_device: Optional[int] = None, learner_devices: Optional[str] = None,
                 log: Optional[Log] = None, worker_command: Optional[Callable[..., list[str]]] = None,
                 learner_command: Optional[Callable[[str, str], list[str]]] = None,
                 ladder_command: Optional[Callable[[str], list[str]]] = None, simulate_gpu: bool = False,
                 config_source: Optional[str] = None, recent_game_ids: int = RECENT_GAME_IDS):
        self.run_dir = os.path.abspath(os.fspath(run_dir))
        self.config = config
        self.config_source = config_source  # the file ``config`` was read from (--config), if any
        d = config.daemon
        self._devices_flag = "--devices" if devices is not None else "daemon.devices"
        self.devices = selfplay_devices(devices if devices is not None else d.devices, self._devices_flag)
        self.workers_per_device = workers_per_device if workers_per_device is not None else d.workers_per_device
        if not isinstance(self.workers_per_device, int) or self.workers_per_device < 0:
            raise ValueError(f"workers per device must be 0 (remote workers only) or more, "
                             f"got {self.workers_per_device!r}")
        self.learner_devices = learner_devices if learner_devices is not None else d.learner_devices
        self._learner_flag = "--learner-devices" if learner_devices is not None else "daemon.learner_devices"
        self.simulate_gpu = simulate_gpu   # the GPU workers' networks run on the stand-in
        self.log: Log = log or _stderr
        self._dropped = _Limited(self.log)
        self._refused = _Limited(self.log)  # refused CURVE handshakes
        self._fetch_log = _Limited(self.log)  # the fetch socket's malformed requests
        if worker_command is not None:
            self.worker_command = worker_command  # type: ignore[method-assign]
        if learner_command is not None:
            self.learner_command = learner_command  # type: ignore[method-assign, assignment]
        if ladder_command is not None:
            self.ladder_command = ladder_command  # type: ignore[method-assign, assignment]
        self.name = run_name(self.run_dir)
        self.keys_dir = self._keys_dir(d.keys)
        self._run_lock: Optional[contextlib.ExitStack] = None  # held from start() to close()
        self._ctx: Optional[zmq.Context] = None
        self._auth: Any = None
        self._router: Any = None
        self._announcer: Any = None
        self._store: Any = None
        self._stored = _RecentIds(recent_game_ids)  # the newest stored game ids: resends are dropped
        self._buffer: dict[str, tuple[wire.Game, set[bytes]]] = {}
        self._first_buffered = 0.0
        self._load = _Load()   # the share of time spent receiving and storing: at capacity or not
        self._credit = MAX_CREDIT   # each worker's share of IN_FLIGHT_GAMES (see _credit_now)
        self._credit_at = -math.inf
        self._credit_spent = False  # a worker has as many games buffered as its credit
        self._workers: dict[str, _Worker] = {}
        self._learner: Optional[_Child] = None
        self._ladder: Optional[_Child] = None  # the strength ladder (trainer.evaluate --follow)
        self._lock = threading.Lock()  # the published state (the gating thread publishes too)
        self._current: Optional[dict] = None  # the announced generation's record
        self._considered = -1  # the newest generation published, gated or queued
        self._games_total = 0
        self._positions_total = 0
        self._gate_cv = threading.Condition()
        self._gate_next: Optional[dict] = None
        self._gate_stop = threading.Event()
        self._gate_thread: Optional[threading.Thread] = None
        self._hurry = threading.Event()
        self._started = False
        self._stopped = False
        self.endpoint = self.publish = self.fetch = ""
        self.addresses = machine_addresses()  # where remote machines reach a wildcard bind
        self.started = 0.0  # unix time of start()

    # -- commands --------------------------------------------------------------------------

    def worker_command(self, device: str, k: int, endpoint: str, games: int, threads: Optional[int],
                       keys_dir: Optional[str]) -> list[str]:
        """The ``cyzero-train worker`` process for slot ``k`` of ``device``."""
        command = [sys.executable, "-m", "trainer.cli", "worker", "--connect", endpoint, "--devices", device,
                   "--name", self.worker_id(device, k), "--games", str(games)]
        if threads is not None:
            command += ["--threads", str(threads)]
        if keys_dir is not None:
            command += ["--keys", keys_dir]
        if self.simulate_gpu and device != "cpu":
            command.append("--simulate-gpu")
        if self.config.daemon.worker_nice:
            command += ["--nice", str(self.config.daemon.worker_nice)]
        return command

    def learner_command(self, run_dir: str, learner_devices: str) -> list[str]:
        """The ``cyzero-train learn --follow`` process, on the daemon's own config (RUN/config.effective.toml,
        written at start); it resumes at its checkpoint."""
        return [sys.executable, "-m", "trainer.cli", "learn", run_dir, "--devices", learner_devices, "--follow",
                "--no-progress", "--config", os.path.join(run_dir, EFFECTIVE_CONFIG_FILE)]

    def advertised(self, endpoint: str) -> str:
        """``endpoint`` as a remote machine dials it (its first reachable form)."""
        return reachable(endpoint, self.addresses)[0]

    def ladder_command(self, run_dir: str) -> list[str]:
        """The strength ladder, ``cyzero-train evaluate RUN --follow`` on the daemon's config, as low in
        priority as the workers (its games take self-play's time, never the learner's)."""
        command = [sys.executable, "-m", "trainer.cli", "evaluate", run_dir, "--follow",
                   "--config", os.path.join(run_dir, EFFECTIVE_CONFIG_FILE)]
        if self.config.daemon.worker_nice:
            command += ["--nice", str(self.config.daemon.worker_nice)]
        return command

    @property
    def remote_learner(self) -> bool:
        """No learner child: ``learner_devices`` is :data:`NO_LEARNER` (a torchrun learner elsewhere
        writes the run's checkpoints and generations; the daemon publishes what it exports)."""
        return str(self.learner_devices).strip().lower() == NO_LEARNER

    def core_split(self) -> tuple[Optional[set[int]], Optional[set[int]]]:
        """(the learner's cores, the workers') with ``daemon.learner_cores``: the last N of the cores this
        process may use go to a CPU learner, the others to the workers; (None, None): all share all."""
        n = self.config.daemon.learner_cores
        if not n or self.remote_learner or "cpu" not in learner_ranks(self.learner_devices):
            return None, None
        usable = usable_core_ids()
        if n >= len(usable):
            raise ValueError(f"daemon.learner_cores = {n} leaves the workers none of the {len(usable)} usable cores")
        return set(usable[-n:]), set(usable[:-n])

    def describe_cores(self) -> str:
        """How the CPU's cores are shared between the learner and the local workers, in one line."""
        learner, workers = self.core_split()
        d = self.config.daemon
        threads = f"{d.learner_threads} torch thread(s) a learner rank" if d.learner_threads else "torch's own threads"
        if learner is not None:
            return (f"cores: the learner has {sorted(learner)} to itself ({threads}), the workers {sorted(workers or ())} "
                    "(daemon.learner_cores)")
        nice = f", the workers at nice {d.worker_nice} (the learner first when it trains)" if d.worker_nice else ""
        return f"cores: all {usable_cores()} shared ({threads}{nice}; daemon.learner_cores gives the learner its own)"

    def learner_env(self) -> dict[str, str]:
        """The learner's torch threads on a CPU (OMP_NUM_THREADS, which its ranks divide among them):
        ``daemon.learner_threads`` a rank, so that it and the self-play workers (lower in priority,
        ``daemon.worker_nice``) do not all spin on every core. Torch's default took both cores of a
        2-core machine beside a worker's two ONNX Runtime threads, and the learner trained at a fifth
        of its rate alone."""
        threads = self.config.daemon.learner_threads
        ranks = learner_ranks(self.learner_devices).get("cpu", 0)
        return {"OMP_NUM_THREADS": str(threads * ranks)} if threads and ranks else {}

    @staticmethod
    def worker_id(device: str, k: int) -> str:
        return f"local-{device.replace(':', '')}-{k}"

    def _keys_dir(self, keys: str) -> Optional[str]:
        """The keys folder (a relative path is taken from the run directory, as selfplay.openings)."""
        if not keys:
            return None
        path = os.path.expanduser(keys)
        return os.path.abspath(path if os.path.isabs(path) else os.path.join(self.run_dir, path))

    # -- start -----------------------------------------------------------------------------

    def check_devices(self) -> None:
        """ValueError, the line ``learn`` gives, when a self-play or learner device is a GPU this machine
        does not have (self-play GPUs on the stand-in, ``simulate_gpu``, need none)."""
        gpus = [int(device.split(":")[1]) for device in self.devices if device != "cpu"]
        if gpus and not self.simulate_gpu:
            check_cuda(",".join(self.devices), gpus, self._devices_flag)
        if not self.remote_learner:
            learner_devices(self.learner_devices, self._learner_flag)

    def start(self) -> None:
        """Check the devices, lock the run, create generation 0, bind, announce and start the children;
        ValueError for a bad config, a missing GPU, a second daemon or an open non-loopback bind."""
        d = self.config.daemon
        check_bind([d.endpoint, d.publish, d.fetch], d.keys)
        self.check_devices()
        self.core_split()  # a learner_cores that leaves the workers nothing is the config's fault
        os.makedirs(self.run_dir, exist_ok=True)
        self._take_lock()
        try:
            self._start()
        except BaseException:
            self._close()
            raise
        self._started = True

    def _take_lock(self) -> None:
        held = contextlib.ExitStack()
        held.enter_context(run_lock(self.run_dir, DAEMON_LOCK))
        self._run_lock = held

    def _start(self) -> None:
        from trainer.learner import initialize_run
        from trainer.store import ReplayStore

        self._openings = self._resolve_openings()
        self._bind()  # first: a port that is taken stops the start before generation 0 is made
        self._initialize(initialize_run)
        self._store = ReplayStore(self.run_dir, self.config.model.input_format)
        self._stored = _RecentIds(self._stored.limit, self._store.newest_game_ids(self._stored.limit))
        for entry in self._store.entries():
            if entry.source == "selfplay":
                self._games_total += entry.games
                self._positions_total += entry.positions
        self._restore_published()
        try:  # what every worker gets must be sendable: a bad [selfplay] or opening is the config's fault
            wire.encode(self._registered())
        except wire.WireError as e:
            raise ValueError(f"the workers' settings cannot be sent: {e}") from None
        self.started = time.time()
        self._write_daemon_json()
        self._start_children()
        if self.config.gating.enabled:
            self._gate_thread = threading.Thread(target=self._gating, name="cyzero-gating", daemon=True)
            self._gate_thread.start()
        self.log(f"serving {self.name}: workers at {self.advertised(self.endpoint)}, announcements at "
                 f"{self.advertised(self.publish)}"
                 f"{' (CurveZMQ)' if self.keys_dir else ''}; generation {self._current_generation()}")
        if self._games_total:
            self.log(f"resuming the run: generation {self._current_generation()} published, "
                     f"{self._games_total:,} self-play game{'s' if self._games_total != 1 else ''} stored (the learner "
                     "resumes at its last checkpoint)")
        else:
            self.log("a new run: no self-play game stored yet")
        for device, share in self.device_split().items():
            if share["selfplay_workers"] or share["learner_ranks"]:
                self.log(f"{device}: {describe_share(share)}")
        if self._workers and self._learner is not None:  # the cores' share matters only when both run here
            self.log(self.describe_cores())
        if not self._workers:
            self.log(f"no self-play worker on this machine: the games come from remote workers "
                     f"(`cyzero-train worker --connect {self.advertised(self.endpoint)}`)")
        if self.remote_learner:
            self.log(f"no learner on this machine ({self._learner_flag} = {NO_LEARNER}): the networks come from a "
                     f"learner elsewhere that writes into {self.run_dir} (`cyzero-train learn RUN --follow`, "
                     "under torchrun on a shared folder)")

    def _resolve_openings(self) -> tuple[str, ...]:
        """selfplay.openings as FENs: bundled, a file relative to the run, or none."""
        spec = self.config.selfplay.openings.strip()
        if not spec:
            return ()
        from engine.tools.match import MatchError, load_openings

        try:
            if spec == "bundled":
                openings = load_openings()
            else:
                path = os.path.expanduser(spec)
                openings = load_openings(path if os.path.isabs(path) else os.path.join(self.run_dir, path))
        except MatchError as e:
            raise ValueError(f"selfplay.openings: {e}") from None
        return tuple(opening.board().fen() for opening in openings)

    def _initialize(self, initialize_run: Callable[..., dict]) -> None:
        """Generation 0, with the config checked against the run's checkpoint. RUN/config.toml is the
        user's: written (by the learner's start) only when the run has none, never rewritten; the
        daemon's config goes to RUN/config.effective.toml, which its learner reads."""
        run_file = os.path.join(self.run_dir, CONFIG_FILE)
        if os.path.exists(run_file) and self.config_source is not None:
            try:
                same = load_config(run_file) == self.config
            except ValueError:
                same = False
            if not same:
                self.log(f"{CONFIG_FILE} is left as you wrote it; this run uses {self.config_source} "
                         f"(every key in {EFFECTIVE_CONFIG_FILE})")
        initialize_run(self.run_dir, config=self.config, log=self.log)  # writes RUN/config.effective.toml

    def _bind(self) -> None:
        from engine.announce import Announcer, load_server_keys

        d = self.config.daemon
        self._ctx = zmq.Context()
        server_keys = None
        if self.keys_dir is not None:
            from zmq.auth.thread import ThreadAuthenticator
            from trainer.keys import create_keys

            create_keys(self.keys_dir, ["local"])  # the local workers' pair; existing keys are kept
            server_keys = load_server_keys(os.path.join(self.keys_dir, "server", "server.key_secret"))
            authorized = os.path.join(self.keys_dir, "authorized")
            self._auth = ThreadAuthenticator(self._ctx, log=_refusal_logger(self._refused, authorized))
            self._auth.start()
            self._auth.configure_curve(domain="*", location=os.path.join(self.keys_dir, "authorized"))
        router = self._ctx.socket(zmq.ROUTER)
        self._router = router
        router.setsockopt(zmq.LINGER, 1000)
        router.setsockopt(zmq.MAXMSGSIZE, MAX_ROUTER_MESSAGE)
        router.setsockopt(zmq.RCVHWM, PEER_QUEUE)
        if server_keys is not None:
            router.curve_server = True
            router.curve_publickey, router.curve_secretkey = server_keys
        try:
            router.bind(d.endpoint)
        except zmq.ZMQError as e:
            raise ValueError(f"cannot bind daemon.endpoint {d.endpoint}: {e}{port_in_use([d.endpoint], e)}") from None
        self.endpoint = router.getsockopt_string(zmq.LAST_ENDPOINT)
        try:
            self._announcer = Announcer(d.publish, fetch_endpoint=d.fetch, server_keys=server_keys,
                                        context=self._ctx, log=self._fetch_log)
        except zmq.ZMQError as e:
            raise ValueError(f"cannot bind daemon.publish {d.publish} or daemon.fetch {d.fetch}: "
                             f"{e}{port_in_use([d.publish, d.fetch], e)}") from None
        self.publish = self._announcer.endpoint
        self.fetch = self._announcer.fetch_endpoint or ""

    def _write_daemon_json(self) -> None:
        info = {"pid": os.getpid(), "started": time.time(), "run": self.name, "endpoint": self.endpoint,
                "publish": self.publish, "fetch": self.fetch, "keys": self.keys_dir is not None,
                "addresses": self.addresses}
        atomic_write_text(os.path.join(self.run_dir, DAEMON_FILE), json.dumps(info, indent=1) + "\n")

    # -- children --------------------------------------------------------------------------

    def _start_children(self) -> None:
        d = self.config.daemon
        logs = os.path.join(self.run_dir, LOG_DIR)
        if not self.remote_learner:
            self._learner = _Child("learner", self.learner_command(self.run_dir, self.learner_devices),
                                   os.path.join(logs, "learner.log"), d.restart_backoff_s, env=self.learner_env())
        if self.config.ladder.enabled:
            self._ladder = _Child("ladder", self.ladder_command(self.run_dir), os.path.join(logs, "ladder.log"),
                                  d.restart_backoff_s)
        learner_cores, worker_cores = self.core_split()
        if self._learner is not None:
            self._learner.cores = learner_cores
        cpu_workers = sum(self.workers_per_device for device in self.devices if device == "cpu")
        connect = rehost(self.endpoint, "127.0.0.1", "[::1]")  # a wildcard bind is this host
        client_keys = os.path.join(self.keys_dir, "clients", "local") if self.keys_dir else None
        for device in self.devices:
            cpu = device == "cpu"
            games = self.config.selfplay.games_per_worker or (32 if cpu else 256)
            cores = len(worker_cores) if worker_cores is not None else usable_cores()
            threads = (d.worker_threads or max(1, cores // max(1, cpu_workers))) if cpu else None
            for k in range(self.workers_per_device):
                wid = self.worker_id(device, k)
                child = _Child(wid, self.worker_command(device, k, connect, games, threads, client_keys),
                               os.path.join(logs, f"worker-{device.replace(':', '')}-{k}.log"), d.restart_backoff_s)
                child.cores = worker_cores
                self._workers[wid] = _Worker(wid, host=socket.gethostname(), devices=(device,), local=True,
                                             child=child)
        self._supervise()

    def device_split(self) -> dict[str, dict]:
        """What runs on each device: self-play workers (their games and the largest batch of their
        network on a GPU) and learner ranks; a GPU that has both shares its time between them."""
        from trainer.selfplay import settings_from_config, worker_max_batch

        split: dict[str, dict] = {}
        for device in self.devices:
            games = self.config.selfplay.games_per_worker or (32 if device == "cpu" else 256)
            gpu_batch = None if device == "cpu" else worker_max_batch(
                games, settings_from_config(self.config.selfplay))
            split[device] = {"selfplay_workers": self.workers_per_device, "games_per_worker": games,
                             "network_max_batch": gpu_batch, "learner_ranks": 0}
        for device, ranks in learner_ranks(self.learner_devices).items():
            split.setdefault(device, {"selfplay_workers": 0, "games_per_worker": 0, "network_max_batch": None,
                                      "learner_ranks": 0})["learner_ranks"] = ranks
        return split

    def _children(self) -> list[_Child]:
        children = [w.child for w in self._workers.values() if w.child is not None]
        return children + [child for child in (self._learner, self._ladder) if child is not None]

    def _supervise(self) -> None:
        """Start what is due, notice deaths and silent workers, schedule restarts."""
        now = time.monotonic()
        timeout = self.config.daemon.heartbeat_timeout_s
        for child in self._children():
            if child.proc is not None:
                code = child.proc.poll()
                if code is None:
                    worker = self._workers.get(child.name)
                    if worker is not None and now - max(worker.last_heard, child.started) > timeout:
                        pid = child.proc.pid
                        child.proc.kill()
                        child.proc.wait()
                        wait = child.died(now)
                        self.log(f"{child.name} (pid {pid}) silent for {timeout:g} s: killed, restart in {wait:g} s")
                    continue
                pid = child.proc.pid
                wait = child.died(now)
                self.log(f"{child.name} (pid {pid}) exited with code {code}: restart in {wait:g} s "
                         f"(see {os.path.relpath(child.log_path, self.run_dir)})")
            if child.next_start is not None and now >= child.next_start:
                try:
                    child.spawn()
                except OSError as e:
                    wait = child.died(now)
                    self.log(f"cannot start {child.name}: {e}; retry in {wait:g} s")
                    continue
                worker = self._workers.get(child.name)
                if worker is not None:
                    worker.pid = child.proc.pid if child.proc else 0
                    worker.started = child.started_wall
                if child.restarts:
                    self.log(f"{child.name} restarted (pid {child.proc.pid if child.proc else '?'}, "
                             f"restart {child.restarts})")

    # -- the loop --------------------------------------------------------------------------

    def serve(self, stop: threading.Event, tick: Optional[Callable[[], Any]] = None) -> None:
        """Receive, flush, supervise, publish and report until ``stop`` is set; ``tick`` (the live
        display's update, which keeps its own pace) is called at each turn of the loop."""
        if not self._started:
            raise RuntimeError("Daemon.serve before start()")
        poller = zmq.Poller()
        poller.register(self._router, zmq.POLLIN)
        next_generations = next_workers = next_supervise = 0.0
        while not stop.is_set() and not self._hurry.is_set():
            ready = dict(poller.poll(100)).get(self._router)
            began = time.monotonic()
            if ready:
                self._receive()
            self._flush_if_due(time.monotonic())
            now = time.monotonic()
            self._load.busy += now - began
            self._note_load(now)
            if now >= next_supervise:
                self._supervise()
                next_supervise = now + 0.2
            if now >= next_generations:
                self._poll_generations()
                next_generations = now + GENERATIONS_EVERY_S
            if now >= next_workers:
                self._watch_workers()
                self._write_workers()
                next_workers = now + WORKERS_EVERY_S
                for limited in (self._dropped, self._refused, self._fetch_log):
                    limited.flush()
            if tick is not None:
                tick()

    def _flush_if_due(self, now: float) -> None:
        d = self.config.daemon
        if self._buffer and (now - self._first_buffered >= d.flush_s or len(self._buffer) >= d.flush_games):
            self._flush()

    def _credit_now(self) -> int:
        """A worker's credit: IN_FLIGHT_GAMES shared by the workers heard within ALIVE_S (counted again
        every CREDIT_EVERY_S, and when a worker joins), 1 to MAX_CREDIT each."""
        now = time.monotonic()
        if now - self._credit_at >= CREDIT_EVERY_S:
            alive = sum(1 for w in self._workers.values() if now - w.last_heard < ALIVE_S)
            self._credit = max(1, min(MAX_CREDIT, IN_FLIGHT_GAMES // max(1, alive)))
            self._credit_at = now
        return self._credit

    def _receive(self) -> None:
        """Read what waits (RECEIVE_BATCH messages at most), storing a chunk whenever flush_games are
        buffered; at the end, store what a worker waits on (it sent all its credit allows)."""
        for _ in range(RECEIVE_BATCH):
            try:
                frames = self._router.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            try:
                message = wire.decode(frames[1:])
            except wire.WireError as e:
                self._dropped(f"dropped a malformed message: {e}")
                continue
            try:
                self._handle(frames[0].bytes, message)
            except wire.WireError as e:  # a reply that cannot be encoded: dropped as a bad message is
                self._dropped(f"dropped a message: {e}")
            if len(self._buffer) >= self.config.daemon.flush_games:
                self._flush()
        if self._credit_spent:
            self._flush()  # a worker sent all its credit allows: waiting for flush_s would idle it

    def _note_load(self, now: float) -> None:
        """Each LOAD_WINDOW_S: say when receiving and storing fill the daemon's time (the fleet offers
        more than it stores, and waits on credit) and when they no longer do."""
        load = self._load
        if now - load.since < LOAD_WINDOW_S:
            return
        share = load.busy / (now - load.since)
        stored = self._games_total - load.games
        rate = stored / (now - load.since)
        if load.full_since is None and share >= AT_CAPACITY:
            load.full_since = load.since
            self.log(f"at capacity: receiving and storing took {share:.0%} of the last {now - load.since:.0f} s "
                     f"({rate:,.0f} games/s stored); the workers keep the games their credit ({self._credit} each) "
                     f"does not let in, and pause self-play at their own bound: nothing is lost")
        elif load.full_since is not None and share < KEEPING_UP:
            self.log(f"keeping up again after {now - load.full_since:,.0f} s at capacity ({share:.0%} busy, "
                     f"{rate:,.0f} games/s stored)")
            load.full_since = None
        load.since, load.busy, load.games = now, 0.0, self._games_total

    def _send(self, identity: bytes, message: Any) -> None:
        try:
            self._router.send_multipart([identity, *wire.encode(message)], zmq.NOBLOCK)
        except zmq.Again:
            self._dropped("a worker is not reading its replies: one dropped")
        except zmq.ZMQError as e:
            self._dropped(f"reply not sent: {e}")

    def _send_ids(self, identity: bytes, ids: list[str], message: Callable[[tuple[str, ...]], Any]) -> None:
        """``message(ids)`` for game ids (an Ack), in as many messages as the wire's limit needs."""
        for i in range(0, len(ids), wire.MAX_ACK_GAMES):
            self._send(identity, message(tuple(ids[i:i + wire.MAX_ACK_GAMES])))

    def _worker(self, worker_id: str, identity: bytes) -> _Worker:
        """The worker of this id (one the daemon does not know is taken in: it may have restarted)."""
        worker = self._workers.get(worker_id)
        if worker is None:
            worker = self._workers[worker_id] = _Worker(worker_id)
            self._credit_at = -math.inf  # one more to share the credit with
        if worker.silent_since is not None:
            self.log(f"{worker_id} is back after {time.monotonic() - worker.last_heard:,.0f} s silent")
            worker.silent_since = None
        worker.identity = identity
        worker.last_seen = time.time()
        worker.last_heard = time.monotonic()
        return worker

    def _handle(self, identity: bytes, message: Any) -> None:
        if isinstance(message, wire.Register):
            worker = self._worker(message.worker, identity)
            worker.host, worker.pid, worker.devices = message.host, message.pid, tuple(message.devices)
            self._send(identity, self._registered())
        elif isinstance(message, wire.Heartbeat):
            worker = self._worker(message.worker, identity)
            worker.playing, worker.positions_per_s = message.playing, message.positions_per_s
            worker.generation = message.generation
        elif isinstance(message, wire.Game):
            worker = self._worker(message.worker, identity)
            played = int(message.records["input_format"][0])   # wire.py checked: one format a game
            if played != self._store.input_format:
                reason = (f"its records are lc0's input format {played}, and this run's network reads format "
                          f"{self._store.input_format}")
                self._dropped(f"refused game {message.game_id} of {message.worker}: {reason}")
                self._send(identity, wire.Refused(reason, message.game_id))
            elif message.game_id in self._stored:
                self._send(identity, wire.Ack((message.game_id,), self._credit_now()))
            elif message.game_id in self._buffer:
                self._buffer[message.game_id][1].add(identity)
            else:
                if not self._buffer:
                    self._first_buffered = time.monotonic()
                self._buffer[message.game_id] = (message, {identity})
                worker.buffered += 1
                self._credit_spent = self._credit_spent or worker.buffered >= self._credit
        else:
            self._dropped(f"dropped a {type(message).__name__} message: workers do not send those")

    def _registered(self) -> wire.Registered:
        with self._lock:
            current = self._current
        selfplay = dataclasses.asdict(self.config.selfplay)
        publish = rehost(self.publish, "*")  # the peer puts in the host it dialled
        if current is None:
            return wire.Registered(self.name, publish=publish, selfplay=selfplay, openings=self._openings,
                                   credit=self._credit_now())
        return wire.Registered(self.name, current["generation"], os.path.join(self.run_dir, current["onnx"]),
                               current["sha256"], publish, selfplay, self._openings, self._credit_now())

    # -- storing games ---------------------------------------------------------------------

    def _flush(self) -> None:
        """Write the buffered games (one chunk per generation, and another for its games held out for
        validation: ``trainer.store.hold_out`` keeps their share at ``replay.val_percent`` from the
        first game on), then their PGNs, then acknowledge them."""
        if not self._buffer:
            return
        buffered, self._buffer = self._buffer, {}
        self._credit_spent = False
        for game, _ in buffered.values():
            worker = self._workers.get(game.worker)
            if worker is not None:
                worker.buffered = 0
        by_generation: dict[int, list[tuple[wire.Game, set[bytes]]]] = {}
        for game, senders in buffered.values():
            by_generation.setdefault(game.generation, []).append((game, senders))
        from trainer.store import hold_out

        acks: dict[bytes, list[str]] = {}
        val_percent = self.config.replay.val_percent
        held, total = self._store.held_out_positions(val_percent)
        parts = []  # (generation, held out, entries): the held-out games of a generation are a chunk of their own
        for generation in sorted(by_generation):
            entries = by_generation[generation]
            flags = hold_out([game.positions for game, _ in entries], held, total, val_percent)
            for held_out in (True, False):
                part = [entry for entry, flag in zip(entries, flags) if flag is held_out]
                if part:
                    parts.append((generation, held_out, part))
            held += sum(game.positions for (game, _), flag in zip(entries, flags) if flag)
            total += sum(game.positions for game, _ in entries)
        for generation, held_out, entries in parts:
            games = [game for game, _ in entries]
            try:
                self._store.append_games([g.records for g in games], generation=generation, source="selfplay",
                                         game_ids=[g.game_id for g in games], held_out=held_out,
                                         val_percent=val_percent, members=[g.member for g in games])
            except (OSError, ValueError) as e:
                reason = f"replay store: {e}"
                self.log(f"{len(games)} games of generation {generation} not stored ({e}): the workers resend them")
                for game, senders in entries:
                    for identity in senders:
                        self._send(identity, wire.ErrorReply(reason[:wire.MAX_TEXT_CHARS], game.game_id))
                continue
            self._stored.update(g.game_id for g in games)
            self._append_pgn(generation, games)
            for game, senders in entries:
                worker = self._workers.get(game.worker)
                if worker is not None:
                    worker.games += 1
                    worker.positions += game.positions
                self._games_total += 1
                self._positions_total += game.positions
                for identity in senders:
                    acks.setdefault(identity, []).append(game.game_id)
        credit = self._credit_now()
        for identity, ids in acks.items():
            self._send_ids(identity, ids, lambda part: wire.Ack(part, credit))

    def _append_pgn(self, generation: int, games: Sequence[wire.Game]) -> None:
        """RUN/pgn/games-gNNNNN.pgn gets the games' PGNs (after their chunk is durable)."""
        folder = os.path.join(self.run_dir, PGN_DIR)
        text = "".join(g.pgn.rstrip("\n") + "\n\n" for g in games)
        try:
            os.makedirs(folder, exist_ok=True)
            append_durably(os.path.join(folder, f"games-g{generation:05d}.pgn"), text.encode())
        except OSError as e:  # the games are stored: a PGN lost is not worth a resend
            self.log(f"PGNs of generation {generation} not written: {e}")

    # -- publishing ------------------------------------------------------------------------

    def _current_generation(self) -> Optional[int]:
        with self._lock:
            return None if self._current is None else self._current["generation"]

    def _restore_published(self) -> None:
        """Re-announce the last published generation; publish the newest one when none was."""
        from trainer.run_setup import newest_generation

        published = [r for r in read_jsonl(os.path.join(self.run_dir, PUBLISHED_FILE))
                     if isinstance(r.get("generation"), int) and isinstance(r.get("onnx"), str)
                     and isinstance(r.get("sha256"), str)]
        gated = [r["generation"] for r in read_jsonl(os.path.join(self.run_dir, GATING_FILE))
                 if isinstance(r.get("generation"), int)]
        for record in reversed(published):
            if os.path.isfile(os.path.join(self.run_dir, record["onnx"])):
                self._announce(record)
                break
        self._considered = max([r["generation"] for r in published] + gated + [-1])
        if self._current is None:
            newest = newest_generation(self.run_dir)
            if newest is not None:
                self._publish(newest, gated=False)

    def _announce(self, record: dict) -> None:
        with self._lock:
            self._current = record
        self._announcer.announce(record["generation"], os.path.join(self.run_dir, record["onnx"]), record["sha256"],
                                 run=self.name)

    def _publish(self, record: dict, *, gated: bool) -> None:
        line = {"generation": record["generation"], "onnx": record["onnx"], "sha256": record["sha256"],
                "time": time.time(), "gated": gated}
        self._announce(line)  # first: whoever reads the line finds the generation announced
        append_jsonl(os.path.join(self.run_dir, PUBLISHED_FILE), line)
        with self._lock:
            self._considered = max(self._considered, record["generation"])
        self.log(f"published generation {record['generation']} ({record['onnx']}) at {time.strftime('%H:%M:%S')}"
                 + (f", {(time.time() - self.started) / 60:.1f} min after this daemon's start" if self.started else ""))

    def _poll_generations(self) -> None:
        """Publish (or queue for gating) each generation the learner exported since the last look."""
        fresh = []
        for record in read_jsonl(os.path.join(self.run_dir, GENERATIONS_FILE)):
            generation, onnx, sha = record.get("generation"), record.get("onnx"), record.get("sha256")
            if (isinstance(generation, int) and generation > self._considered and isinstance(onnx, str)
                    and isinstance(sha, str) and os.path.isfile(os.path.join(self.run_dir, onnx))):
                fresh.append(record)
        fresh.sort(key=lambda r: r["generation"])
        if not fresh:
            return
        if not self.config.gating.enabled:
            for record in fresh:
                self._publish(record, gated=False)
            return
        self._considered = fresh[-1]["generation"]
        with self._gate_cv:
            self._gate_next = fresh[-1]  # a gate in progress finishes; then only the newest is taken
            self._gate_cv.notify()

    def _gating(self) -> None:
        """The gating thread: each queued generation plays the current best; published if accepted."""
        from trainer.gating import gate

        while not self._gate_stop.is_set():
            with self._gate_cv:
                while self._gate_next is None and not self._gate_stop.is_set():
                    self._gate_cv.wait(0.5)
                candidate, self._gate_next = self._gate_next, None
            if candidate is None:
                return
            with self._lock:
                best = self._current
            if best is None:
                self._publish(candidate, gated=True)
                continue
            self.log(f"gating generation {candidate['generation']} against generation {best['generation']}")
            try:
                result = gate(os.path.join(self.run_dir, candidate["onnx"]), os.path.join(self.run_dir, best["onnx"]),
                              self.config.gating, self.log, stop=self._gate_stop)
            except Exception as e:  # noqa: BLE001 - a match that cannot be played must not end the run
                self.log(f"gating generation {candidate['generation']} failed: {e}")
                continue
            if not result.accepted and self._gate_stop.is_set():
                return  # stopped: not a verdict (gated again after a restart)
            result.generation, result.best = candidate["generation"], best["generation"]
            append_jsonl(os.path.join(self.run_dir, GATING_FILE), result.to_dict())
            self.log(f"gating generation {candidate['generation']}: {'accepted' if result.accepted else 'rejected'} "
                     f"(+{result.wins} ={result.draws} -{result.losses}, {result.reason})")
            if result.accepted:
                self._publish(candidate, gated=True)

    # -- reports ---------------------------------------------------------------------------

    def _write_workers(self) -> None:
        now, mono = time.time(), time.monotonic()
        alive_s = ALIVE_S
        rows = []
        for w in self._workers.values():
            running = w.child.alive() if w.child is not None else True
            hours = max(now - w.started, 1.0) / 3600.0
            rows.append({
                "id": w.id, "host": w.host, "pid": w.pid, "devices": list(w.devices), "local": w.local,
                "alive": bool(running and w.last_seen and mono - w.last_heard <= alive_s),
                "last_seen": w.last_seen or None, "generation": w.generation, "playing": w.playing,
                "positions_per_s": w.positions_per_s, "games": w.games, "positions": w.positions,
                "games_per_hour": round(w.games / hours, 1),
                "restarts": w.child.restarts if w.child is not None else 0, "started": w.started,
            })
        report = {"time": now, "generation": self._current_generation(), "games": self._games_total,
                  "positions": self._positions_total, "workers": rows, "devices": self.device_split()}
        learner = self._learner
        if learner is not None:
            report["learner"] = {"pid": learner.proc.pid if learner.alive() else None, "alive": learner.alive(),
                                 "devices": self.learner_devices, "restarts": learner.restarts,
                                 "started": learner.started_wall or None}
        ladder = self._ladder
        if ladder is not None:
            report["ladder"] = {"pid": ladder.proc.pid if ladder.alive() else None, "alive": ladder.alive(),
                                "restarts": ladder.restarts}
        try:
            atomic_write_text(os.path.join(self.run_dir, WORKERS_FILE), json.dumps(report, indent=1) + "\n")
        except OSError as e:
            self._dropped(f"{WORKERS_FILE} not written: {e}")

    # -- stop ------------------------------------------------------------------------------

    def _watch_workers(self) -> None:
        """Say when a worker falls silent (once) and forget remote ones silent for :data:`FORGET_S`."""
        now = time.monotonic()
        for worker_id, worker in list(self._workers.items()):
            if not worker.last_heard:
                continue
            quiet = now - worker.last_heard
            if worker.silent_since is None and quiet >= SILENT_S:
                worker.silent_since = now
                where = "" if worker.local else f" on {worker.host}"
                self.log(f"{worker_id}{where} silent for {quiet:,.0f} s (last heard at "
                         f"{time.strftime('%H:%M:%S', time.localtime(worker.last_seen))})")
            if not worker.local and quiet >= FORGET_S:
                del self._workers[worker_id]
                self.log(f"{worker_id} forgotten: silent for {quiet / 60:,.0f} min (its games stay stored)")

    def games_in_play(self) -> int:
        """Games the workers last said they were playing (lost at a stop: a game is kept only once it ends)."""
        return sum(w.playing for w in self._workers.values() if w.last_seen)

    def hurry(self) -> None:
        """A second signal: kill the children at once (the stop skips its waits)."""
        self._hurry.set()
        self._gate_stop.set()
        for child in self._children():
            child.signal(signal.SIGKILL)

    def stop(self) -> None:
        """Flush, send Stop to every worker, stop the children (SIGTERM, then SIGKILL after 30 s),
        acknowledge what they resend meanwhile, write workers.json, release the run."""
        if self._stopped or not self._started:
            return
        self._stopped = True
        self._gate_stop.set()
        with self._gate_cv:
            self._gate_cv.notify_all()
        self._flush()
        for worker in self._workers.values():
            if worker.identity is not None:
                self._send(worker.identity, wire.Stop("the training daemon is stopping"))
        children = self._children()
        for child in children:
            child.next_start = None
            child.signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_WAIT_S
        poller = zmq.Poller()
        poller.register(self._router, zmq.POLLIN)
        while any(c.alive() for c in children) and time.monotonic() < deadline and not self._hurry.is_set():
            if dict(poller.poll(100)).get(self._router):
                self._receive()  # workers resend their unacknowledged games before they exit
            self._flush()
        for child in children:
            if child.alive():
                self.log(f"{child.name} did not stop in {STOP_WAIT_S:g} s: killed")
                child.signal(signal.SIGKILL)
            if child.proc is not None:
                child.proc.wait()
        if dict(poller.poll(0)).get(self._router):
            self._receive()
        self._flush()
        self._write_workers()
        if self._gate_thread is not None:
            self._gate_thread.join(5.0)
        self._close()
        self.log(f"stopped; {self._games_total} self-play games in the store")

    def _close(self) -> None:
        if self._announcer is not None:
            self._announcer.close()
            self._announcer = None
        if self._router is not None:
            self._router.close()
            self._router = None
        if self._auth is not None:
            self._auth.stop()
            self._auth = None
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None
        for child in self._children():  # a failed start leaves none running
            if child.proc is not None and child.proc.poll() is None:
                child.proc.kill()
                child.proc.wait()
        if self._run_lock is not None:
            self._run_lock.close()
            self._run_lock = None


# --------------------------------------------------------------------------- entry point


def run_daemon(run_dir: str | os.PathLike, *, config: Optional[str | os.PathLike] = None,
               devices: Optional[str] = None, workers_per_device: Optional[int] = None,
               learner_devices: Optional[str] = None, log: Optional[Log] = None,
               simulate_gpu: bool = False, init_from: Optional[str | os.PathLike] = None,
               port: Optional[str] = None) -> int:
    """``cyzero-train run``: serve the run until SIGINT/SIGTERM (a second one kills the children at once).

    ``init_from`` (``--init-from``): ``train.init_from``, the network a new run starts from.
    ``port`` (``--port``): the daemon's three ports, from a number or ``auto`` (:func:`on_ports`).
    Returns the exit code: 0 after a clean stop, 2 for bad input (one line on ``log``)."""
    run_dir = os.path.abspath(os.fspath(run_dir))
    early = log or _stderr  # until the run is taken, errors create nothing (no RUN/logs)
    display = None
    if log is None:
        from trainer.progress import RunDisplay

        log = _DaemonLog(run_dir)
        display = RunDisplay(run_dir)  # what the run does, on stderr: in place on a terminal, a line a minute elsewhere
        log.echo = display.write
    stop = threading.Event()
    try:
        resolved = resolve_config(run_dir, config)
        if init_from:
            resolved = resolved.replace(train={"init_from": os.path.abspath(os.path.expanduser(os.fspath(init_from)))})
        if port is not None:
            resolved = on_ports(resolved, port)
        daemon = Daemon(run_dir, resolved, devices=devices,
                        workers_per_device=workers_per_device, learner_devices=learner_devices, log=log,
                        simulate_gpu=simulate_gpu,
                        config_source=named_config_path(config) if config is not None else None)
        daemon.check_devices()
    except (ValueError, OSError) as e:
        early(f"error: {str(e).splitlines()[0] if str(e) else type(e).__name__}")
        return 2
    try:
        daemon.start()
    except (ValueError, OSError) as e:
        log(f"error: {str(e).splitlines()[0] if str(e) else type(e).__name__}")
        return 2

    def on_signal(signum: int) -> None:
        if stop.is_set():
            log("second signal: killing the children")
            daemon.hurry()
        else:
            playing = daemon.games_in_play()
            log(f"{signal.Signals(signum).name}: stopping (a second one kills at once): every finished game is "
                f"stored; the {playing:,} game{'s' if playing != 1 else ''} in play here end unfinished and are "
                "not kept; the learner writes its checkpoint")
            stop.set()

    with on_signals(on_signal):
        try:
            daemon.serve(stop, tick=display.update if display is not None else None)
        finally:
            if display is not None:
                display.close()
                log.echo = _print  # type: ignore[attr-defined]
            daemon.stop()
    return 0
