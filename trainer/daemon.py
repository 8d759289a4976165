"""``cyzero-train run``: the training daemon (self-play workers, the learner, publishing).

One process per run directory (an flock on ``RUN/daemon.lock``) that

* serves the workers' ROUTER (:mod:`trainer.ingest`, speaking :mod:`trainer.wire`): games stored
  durably, then acknowledged, with credit-based flow control;
* starts and supervises the local workers (``cyzero-train worker``, one per device and
  slot), the learner (``cyzero-train learn --follow``) and the ladder (:mod:`trainer.supervision`):
  a child that exits, or a worker silent for ``daemon.heartbeat_timeout_s``, is restarted after a
  backoff;
* polls ``RUN/generations.jsonl`` for the learner's exports and announces each new one on
  the PUB socket (:mod:`trainer.publishing`), after a gating match when ``[gating]`` is on.

This module binds them together: the start (lock, generation 0, sockets, children), the loop, the
reports (``daemon.json``, ``workers.json``) and the stop. The spec of the run directory's files
(``daemon.json``, ``workers.json``, ``published.jsonl``, ``gating.jsonl``, ``pgn/``, ``logs/``) is
in docs/training.md. Binding anything but loopback needs CurveZMQ keys (:mod:`trainer.endpoints`).
No pickle; torch only through :func:`initialize_run` and the device check at start.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import re
import signal
import socket
import sys
import threading
import time
from typing import Any, Callable, Optional

import zmq

from engine.announce import rehost
from trainer import wire
from trainer.atomic import atomic_write_text
from trainer.config import TrainConfig, load_config, named_config_path
from trainer.devices import (
    NO_LEARNER, check_cuda, learner_devices, learner_ranks, selfplay_devices, usable_core_ids, usable_cores,
)
from trainer.endpoints import check_bind, machine_addresses, on_ports
from trainer.ingest import ALIVE_S, RECENT_GAME_IDS, Ingest, Worker
from trainer.publishing import Publisher
from trainer.report import describe_share, reachable  # the words status uses too (report imports nothing heavy)
from trainer.rundir import (
    CONFIG_FILE, DAEMON_FILE, DAEMON_LOCK, EFFECTIVE_CONFIG_FILE, LOG_DIR, WORKERS_FILE, resolve_config, run_lock,
)
from trainer.stop_signals import on_signals
from trainer.supervision import SUPERVISE_EVERY_S, Child, Supervisor

__all__ = ["Daemon", "run_daemon"]

Log = Callable[[str], Any]

WORKERS_EVERY_S = 5.0  # workers.json rewritten this often
GENERATIONS_EVERY_S = 1.0  # generations.jsonl polled this often
SILENT_S = 30.0  # a worker not heard from for this long is said to be silent (and again when it is back)
FORGET_S = 3600.0  # a remote worker silent this long leaves the workers list (a one-off client, a machine gone)
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


# --------------------------------------------------------------------------- the daemon


class Daemon:
    """The training daemon of one run directory; :func:`run_daemon` drives it.

    ``start()`` takes the run's lock, creates generation 0, binds the sockets and starts the
    children; ``serve(stop)`` runs the loop until ``stop`` is set; ``stop()`` flushes, stops
    everyone and releases the run. ``worker_command``/``learner_command`` (callables with the
    methods' signatures) replace the child commands, for tests. ``recent_game_ids``: how many of
    the newest stored game ids are remembered to drop a worker's resends (:class:`trainer.ingest.Ingest`).
    The workers' side, the children and the publishing are its parts: ``_ingest``, ``_supervisor``
    and ``_publisher``.
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
        # What start() takes, closed in reverse by _close(): the run's lock, the children, the context,
        # the authenticator, the workers' ROUTER, the announcer.
        self._resources = contextlib.ExitStack()
        self._workers: dict[str, Worker] = {}  # every worker id heard from, and the local ones started here
        self._ingest = Ingest(self.run_dir, config, self._workers, self._registered, self.log, self._dropped,
                              recent_game_ids)
        self._publisher = Publisher(self.run_dir, self.name, config.gating, self.log, lambda: self.started)
        self._supervisor = Supervisor(self.run_dir, self.log, d.heartbeat_timeout_s, self._workers)
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
        self._resources.enter_context(run_lock(self.run_dir, DAEMON_LOCK))
        self._resources.callback(self._supervisor.kill_leftovers)  # a failed start leaves no child running

    def _start(self) -> None:
        from trainer.learner import initialize_run
        from trainer.store import ReplayStore

        self._openings = self._resolve_openings()
        self._bind()  # first: a port that is taken stops the start before generation 0 is made
        self._initialize(initialize_run)
        self._ingest.open(ReplayStore(self.run_dir, self.config.model.input_format))
        self._publisher.restore()
        try:  # what every worker gets must be sendable: a bad [selfplay] or opening is the config's fault
            wire.encode(self._registered())
        except wire.WireError as e:
            raise ValueError(f"the workers' settings cannot be sent: {e}") from None
        self.started = time.time()
        self._write_daemon_json()
        self._start_children()
        self._publisher.start_gating()
        generation, games = self._publisher.current_generation(), self._ingest.games_total
        self.log(f"serving {self.name}: workers at {self.advertised(self.endpoint)}, announcements at "
                 f"{self.advertised(self.publish)}"
                 f"{' (CurveZMQ)' if self.keys_dir else ''}; generation {generation}")
        if games:
            self.log(f"resuming the run: generation {generation} published, "
                     f"{games:,} self-play game{'s' if games != 1 else ''} stored (the learner "
                     "resumes at its last checkpoint)")
        else:
            self.log("a new run: no self-play game stored yet")
        for device, share in self.device_split().items():
            if share["selfplay_workers"] or share["learner_ranks"]:
                self.log(f"{device}: {describe_share(share)}")
        if self._workers and self._supervisor.learner is not None:  # the cores' share matters only when both run here
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
        """The sockets, each closed by _close(): the workers' ROUTER, then the announcements' PUB and
        the fetch ROUTER; with keys, all CURVE servers behind an authenticator of RUN's clients."""
        from engine.announce import load_server_keys

        d = self.config.daemon
        context = zmq.Context()
        self._resources.callback(context.term)
        server_keys = None
        if self.keys_dir is not None:
            from zmq.auth.thread import ThreadAuthenticator
            from trainer.keys import create_keys

            create_keys(self.keys_dir, ["local"])  # the local workers' pair; existing keys are kept
            server_keys = load_server_keys(os.path.join(self.keys_dir, "server", "server.key_secret"))
            authorized = os.path.join(self.keys_dir, "authorized")
            auth = ThreadAuthenticator(context, log=_refusal_logger(self._refused, authorized))
            self._resources.callback(auth.stop)
            auth.start()
            auth.configure_curve(domain="*", location=os.path.join(self.keys_dir, "authorized"))
        self._resources.callback(self._ingest.close)
        self.endpoint = self._ingest.bind(context, d.endpoint, server_keys)
        self._resources.callback(self._publisher.close)
        self._publisher.bind(context, d.publish, d.fetch, server_keys, self._fetch_log)
        self.publish, self.fetch = self._publisher.endpoint, self._publisher.fetch_endpoint

    def _write_daemon_json(self) -> None:
        info = {"pid": os.getpid(), "started": time.time(), "run": self.name, "endpoint": self.endpoint,
                "publish": self.publish, "fetch": self.fetch, "keys": self.keys_dir is not None,
                "addresses": self.addresses}
        atomic_write_text(os.path.join(self.run_dir, DAEMON_FILE), json.dumps(info, indent=1) + "\n")

    # -- children --------------------------------------------------------------------------

    def _start_children(self) -> None:
        """The learner (unless it runs elsewhere), the ladder (``[ladder]``) and the local workers, handed
        to the supervisor, which starts them."""
        d = self.config.daemon
        logs = os.path.join(self.run_dir, LOG_DIR)
        children = self._supervisor
        if not self.remote_learner:
            children.learner = Child("learner", self.learner_command(self.run_dir, self.learner_devices),
                                     os.path.join(logs, "learner.log"), d.restart_backoff_s, env=self.learner_env())
        if self.config.ladder.enabled:
            children.ladder = Child("ladder", self.ladder_command(self.run_dir), os.path.join(logs, "ladder.log"),
                                    d.restart_backoff_s)
        learner_cores, worker_cores = self.core_split()
        if children.learner is not None:
            children.learner.cores = learner_cores
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
                child = Child(wid, self.worker_command(device, k, connect, games, threads, client_keys),
                              os.path.join(logs, f"worker-{device.replace(':', '')}-{k}.log"), d.restart_backoff_s)
                child.cores = worker_cores
                children.workers[wid] = child
                self._workers[wid] = Worker(wid, host=socket.gethostname(), devices=(device,), local=True,
                                            child=child)
        children.supervise()

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

    # -- the loop --------------------------------------------------------------------------

    def serve(self, stop: threading.Event, tick: Optional[Callable[[], Any]] = None) -> None:
        """Receive, flush, supervise, publish and report until ``stop`` is set; ``tick`` (the live
        display's update, which keeps its own pace) is called at each turn of the loop."""
        if not self._started:
            raise RuntimeError("Daemon.serve before start()")
        ingest = self._ingest
        poller = zmq.Poller()
        poller.register(ingest.router, zmq.POLLIN)
        next_generations = next_workers = next_supervise = 0.0
        while not stop.is_set() and not self._hurry.is_set():
            ready = dict(poller.poll(100)).get(ingest.router)
            began = time.monotonic()
            if ready:
                ingest.receive()
            ingest.flush_if_due(time.monotonic())
            now = time.monotonic()
            ingest.note_load(now, busy=now - began)
            if now >= next_supervise:
                self._supervisor.supervise()
                next_supervise = now + SUPERVISE_EVERY_S
            if now >= next_generations:
                self._publisher.poll()
                next_generations = now + GENERATIONS_EVERY_S
            if now >= next_workers:
                self._watch_workers()
                self._write_workers()
                next_workers = now + WORKERS_EVERY_S
                for limited in (self._dropped, self._refused, self._fetch_log):
                    limited.flush()
            if tick is not None:
                tick()

    def _registered(self) -> wire.Registered:
        """What a worker gets when it registers: the run, the announced network, the self-play settings,
        the openings and its credit."""
        current = self._publisher.current()
        credit = self._ingest.credit_now()
        selfplay = dataclasses.asdict(self.config.selfplay)
        publish = rehost(self.publish, "*")  # the peer puts in the host it dialled
        if current is None:
            return wire.Registered(self.name, publish=publish, selfplay=selfplay, openings=self._openings,
                                   credit=credit)
        return wire.Registered(self.name, current["generation"], os.path.join(self.run_dir, current["onnx"]),
                               current["sha256"], publish, selfplay, self._openings, credit)

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
        report = {"time": now, "generation": self._publisher.current_generation(),
                  "games": self._ingest.games_total, "positions": self._ingest.positions_total, "workers": rows,
                  "devices": self.device_split()}
        learner = self._supervisor.learner
        if learner is not None:
            report["learner"] = {"pid": learner.proc.pid if learner.alive() else None, "alive": learner.alive(),
                                 "devices": self.learner_devices, "restarts": learner.restarts,
                                 "started": learner.started_wall or None}
        ladder = self._supervisor.ladder
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
        self._publisher.hurry()
        self._supervisor.kill()

    def stop(self) -> None:
        """Flush, send Stop to every worker, stop the children (SIGTERM, then SIGKILL after
        ``trainer.supervision.STOP_WAIT_S``), acknowledge what they resend meanwhile, write
        workers.json, release the run."""
        if self._stopped or not self._started:
            return
        self._stopped = True
        self._publisher.stop_gating()
        ingest = self._ingest
        ingest.flush()
        ingest.stop_workers("the training daemon is stopping")
        poller = zmq.Poller()
        poller.register(ingest.router, zmq.POLLIN)

        def receive(timeout_ms: int) -> None:  # workers resend their unacknowledged games before they exit
            if dict(poller.poll(timeout_ms)).get(ingest.router):
                ingest.receive()
            ingest.flush()

        self._supervisor.stop(lambda: receive(100), self._hurry)
        receive(0)
        self._write_workers()
        self._publisher.join_gating(5.0)
        self._close()
        self.log(f"stopped; {ingest.games_total} self-play games in the store")

    def _close(self) -> None:
        """Close what start() took, in reverse: the announcer, the ROUTER, the authenticator, the
        context, any child still running, the run's lock."""
        self._resources.close()


# --------------------------------------------------------------------------- entry point


def run_daemon(run_dir: str | os.PathLike, *, config: Optional[str | os.PathLike] = None,
               devices: Optional[str] = None, workers_per_device: Optional[int] = None,
               learner_devices: Optional[str] = None, log: Optional[Log] = None,
               simulate_gpu: bool = False, init_from: Optional[str | os.PathLike] = None,
               port: Optional[str] = None) -> int:
    """``cyzero-train run``: serve the run until SIGINT/SIGTERM (a second one kills the children at once).

    ``init_from`` (``--init-from``): ``train.init_from``, the network a new run starts from.
    ``port`` (``--port``): the daemon's three ports, from a number or ``auto`` (:func:`trainer.endpoints.on_ports`).
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
