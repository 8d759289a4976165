"""The self-play worker: plays games with the daemon's network and sends them to the daemon.

``cyzero-train worker --connect tcp://HOST:PORT [--keys DIR] [--devices ...]`` runs
:func:`run_workers`: one :class:`Worker` per device (several devices: one
subprocess each).  The protocol (trainer/wire.py has the messages):

* a DEALER (a CurveZMQ client with ``--keys``) sends ``Register`` every 5 s until
  the daemon answers ``Registered`` with the run's ``[selfplay]`` settings, its
  openings and the current generation;
* the network comes through an :class:`engine.network_manager.NetworkManager`:
  the announced file when this machine can read it, else the first announcement
  on the daemon's PUB socket (the follower fetches the bytes and checks the
  sha256); each new generation is swapped in between moves, games go on;
* every finished game is sent as a ``Game`` (while fewer than the daemon's ``credit`` of
  its games await acks; the others wait here) and kept until an ``Ack`` lists it
  (a game with no record, a short one in which no move got a full search, is
  counted as finished but not sent: it teaches nothing, and the replay store
  keeps no empty game),
  resent every 8-12 s meanwhile (spread, so that a fleet does not resend at once; the
  daemon drops a game id it has), so neither a lost message nor a daemon restart
  (ZeroMQ reconnects) loses a game;
* the games awaiting their acks are bounded (``max_unacked_games``, ``max_unacked_bytes``):
  at the bound self-play pauses (said in the log, at most once a minute) until acks make
  room, so a worker whose daemon is down stops growing instead of filling its memory; no
  game is dropped (a stop with games still unacknowledged says how many);
* ``Heartbeat`` every 2 s; ``Stop``, SIGTERM or SIGINT: stop playing, resend
  the unacknowledged games, wait up to 10 s for their acks, exit 0.

The socket belongs to one thread (:class:`_Link`), so heartbeats and acks
keep flowing while a long search step runs.  Needs the engine only, never torch.
"""

from __future__ import annotations

import collections
import os
import queue
import random
import re
import signal
import socket as socketlib
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Optional

from engine import __version__
from engine.announce import load_client_keys, waiting
from engine.book import Tablebases
from engine.network_manager import NetworkManager
from engine.swap import Proposal
from engine.watchers import RateLimit, peer_endpoint, validate_endpoint
from trainer import wire
from trainer.devices import selfplay_devices
from trainer.selfplay import FinishedGame, SelfPlay, settings_from_config, worker_max_batch
from trainer.stop_signals import stop_on_signals

__all__ = ["HEARTBEAT_S", "MAX_UNACKED_BYTES", "MAX_UNACKED_GAMES", "REGISTER_S", "RESEND_S", "STOP_WAIT_S",
           "Worker", "configure_dealer", "run_workers"]

REGISTER_S = 5.0      # Register is resent this often until Registered
HEARTBEAT_S = 2.0     # a Heartbeat this often
LINK_TIMEOUT_S = 10.0  # no answer to ZeroMQ's own pings for this long: the connection is dropped
RESEND_S = 10.0       # a game not acknowledged within this is sent again
STOP_WAIT_S = 10.0    # on stop, how long to wait for the last acks
STATS_S = 60.0        # one line of games/h, positions/s and generation this often
WAITING_SAY_S = 10.0  # no Registered this long: say where we are waiting, once
MAX_UNACKED_GAMES = 1024         # games awaiting acks at which self-play pauses
MAX_UNACKED_BYTES = 256 << 20    # ... or their records and PGNs this large (a game of 40 records: ~330 KB)
PAUSED_SAY_S = 60.0   # "self-play paused" at most this often
# A lost daemon is dialled again after RECONNECT_S (each worker its own, at random in this range), then
# twice as long each time up to RECONNECT_MAX_S: a fleet whose daemon restarts does not call at once.
RECONNECT_S = (0.1, 0.3)
RECONNECT_MAX_S = 2.0
_RETRY_S = 0.2        # a send refused for want of a connection is tried again this soon
_POLL_MS = 50
_ID_BAD = re.compile(r"[^A-Za-z0-9._:-]")


def default_name() -> str:
    """``HOST-PID`` in the wire's id characters."""
    return _ID_BAD.sub("-", f"{socketlib.gethostname()}-{os.getpid()}")[:128]


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _check_bounds(max_games: Any, max_bytes: Any) -> None:
    for name, value in (("max_unacked_games", max_games), ("max_unacked_bytes", max_bytes)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")


# --------------------------------------------------------------------------- the socket's thread


class _Link:
    """The DEALER and its thread: Register, Heartbeat, games out and resent, replies in.

    The playing thread only calls :meth:`submit` and :meth:`wait_for_room`, sets :attr:`playing`,
    :attr:`generation`, :attr:`positions`, reads :attr:`registered` and calls :meth:`finish`.

    The games submitted and not yet acknowledged, refused or dropped are *held*; :meth:`full` is
    true once ``max_games`` are held or their records and PGNs reach ``max_bytes``.
    """

    def __init__(self, connect: str, register: wire.Register, keys: Any, stop: threading.Event,
                 say: Callable[[str], None], context: Any = None, *, max_games: int = MAX_UNACKED_GAMES,
                 max_bytes: int = MAX_UNACKED_BYTES) -> None:
        import zmq

        _check_bounds(max_games, max_bytes)

        self._zmq = zmq
        self.connect = connect
        self._register = wire.encode(register)
        self.worker = register.worker
        self._keys = keys
        self._stop = stop          # set when the daemon says Stop
        self._say = say
        self._context = context or zmq.Context.instance()
        self._outbox: "queue.Queue[tuple[FinishedGame, int]]" = queue.Queue()   # (game, its bytes)
        self.unacked: dict[str, list] = {}   # game id -> [frames, next send time, bytes, sent]; this thread only
        self.credit = 1            # games that may await acks at once (the daemon's Registered and Acks say)
        self.in_flight = 0         # unacked games sent at least once
        self.max_games, self.max_bytes = max_games, max_bytes
        self._room = threading.Condition()   # guards the two counts below; notified when games leave
        self.held_games = 0        # games in the outbox or unacked
        self.held_bytes = 0        # their records' and PGNs' bytes
        self.pauses = 0            # times self-play paused at the bound
        self._paused_said = -PAUSED_SAY_S
        self._pauses_unsaid = 0
        self.registered: Optional[wire.Registered] = None
        self.registered_event = threading.Event()
        self.playing = 0
        self.generation = 0
        self.positions = 0         # training positions played so far (the playing thread counts)
        self.games = 0             # games sent (first sends)
        self.empty = 0             # finished games with no record, never sent (the playing thread counts)
        self.acked = 0
        self.refused = 0
        self._limit = RateLimit()
        self._drain_until: Optional[float] = None
        self._jitter = random.Random()   # resends spread out, so that workers do not all send at once
        self._down_since: Optional[float] = None  # monotonic time the daemon became unreachable
        self._closing = threading.Event()
        self.error: Optional[BaseException] = None
        self.thread = threading.Thread(target=self._run, name="cyzero-worker-link", daemon=True)
        self.thread.start()

    # -- the playing thread's side -------------------------------------------------------

    def submit(self, game: FinishedGame) -> None:
        """Send a finished game. A game with no record (under playout cap randomisation a short game
        may have had no full search) is only counted: the replay store refuses an empty game."""
        if len(game.records) == 0:
            self.empty += 1
            return
        size = int(game.records.nbytes) + len(game.pgn.encode())
        with self._room:
            self.held_games += 1
            self.held_bytes += size
        self._outbox.put((game, size))

    def full(self) -> bool:
        """True when the games awaiting acks are at the bound (self-play pauses)."""
        with self._room:
            return self._full()

    def _full(self) -> bool:
        return self.held_games >= self.max_games or self.held_bytes >= self.max_bytes

    def wait_for_room(self, stop: threading.Event) -> None:
        """Block while :meth:`full` (self-play paused) until acks make room, ``stop`` is set or the link
        ends; says so (at most once every ``PAUSED_SAY_S``), and again when it resumes."""
        with self._room:
            if not self._full():
                return
            games, size = self.held_games, self.held_bytes
        self.pauses += 1
        start = time.monotonic()
        said = start - self._paused_said >= PAUSED_SAY_S
        if said:
            self._paused_said = start
            unsaid, self._pauses_unsaid = self._pauses_unsaid, 0
            self._say(f"{games} games ({size / 2**20:.1f} MiB) await the daemon's acknowledgement, the most this "
                      f"worker keeps (max_unacked_games {self.max_games}, max_unacked_bytes "
                      f"{self.max_bytes / 2**20:g} MiB): "
                      f"self-play paused until acks come back; no game is dropped"
                      + (f" ({unsaid} shorter pauses since this was last said)" if unsaid else ""))
        else:
            self._pauses_unsaid += 1
        with self._room:
            while self._full() and not stop.is_set() and not self._closing.is_set() and self.thread.is_alive():
                self._room.wait(0.2)
            full = self._full()
        if said and not full:
            self._say(f"self-play resumed after {time.monotonic() - start:.0f} s: the daemon acknowledged games")

    def _release(self, size: int) -> None:
        """A held game left (acknowledged, refused or dropped): room for another."""
        with self._room:
            self.held_games -= 1
            self.held_bytes -= size
            self._room.notify_all()

    def finish(self, timeout: float) -> int:
        """Resend what is unacknowledged, wait up to ``timeout`` s for the acks, stop; returns how many stay unacked."""
        self._drain_until = time.monotonic() + timeout
        self.thread.join(timeout + 5.0)
        return len(self.unacked) + self._outbox.qsize()

    def close(self) -> None:
        self._closing.set()
        self.thread.join(5.0)

    # -- the thread ----------------------------------------------------------------------

    def _run(self) -> None:
        zmq = self._zmq
        sock = self._context.socket(zmq.DEALER)
        try:
            configure_dealer(sock, self._keys, self._jitter)
            sock.connect(self.connect)
            self._loop(sock)
        except BaseException as e:  # noqa: BLE001 - the playing thread sees it and exits with an error
            self.error = e
            self._say(f"the connection to the daemon failed: {type(e).__name__}: {e}")
            self._stop.set()
        finally:
            sock.close(0)

    def _send(self, sock: Any, frames: list) -> bool:
        try:
            sock.send_multipart(frames, self._zmq.NOBLOCK)
            return True
        except self._zmq.Again:
            return False

    def _loop(self, sock: Any) -> None:
        start = time.monotonic()
        next_register = start
        next_heartbeat = start
        next_stats = start + STATS_S
        said_waiting = False
        samples: collections.deque = collections.deque()  # (time, positions, games) for the rates
        draining = False
        while not self._closing.is_set():
            now = time.monotonic()
            if self.registered is None and now >= next_register:
                next_register = now + (REGISTER_S if self._send(sock, self._register) else _RETRY_S)
                if not said_waiting and now - start >= WAITING_SAY_S:
                    said_waiting = True
                    self._say(f"waiting for the daemon at {self.connect} (is it running, and are these the "
                              f"keys it admits?)")
            while True:
                try:
                    game, size = self._outbox.get_nowait()
                except queue.Empty:
                    break
                self._queue_game(game, size, now)
            if self._drain_until is not None and not draining:
                draining = True
                for entry in self.unacked.values():
                    entry[1] = now  # resend everything once now
            for entry in self.unacked.values():
                if now >= entry[1] and (entry[3] or self.in_flight < self.credit):
                    if not self._send(sock, entry[0]):
                        entry[1] = now + _RETRY_S
                        break  # no connection now: the others wait too
                    entry[1] = now + RESEND_S * self._jitter.uniform(0.8, 1.2)
                    if not entry[3]:
                        entry[3] = True
                        self.in_flight += 1
            if self.registered is not None and now >= next_heartbeat:
                rate = self._rate(samples, now)
                reached = self._send(sock, wire.encode(wire.Heartbeat(self.worker, int(self.playing), rate[0],
                                                                      int(self.generation))))
                self._link(reached, now)
                next_heartbeat = now + HEARTBEAT_S
            if now >= next_stats:
                positions_per_s, games_per_h = self._rate(samples, now)
                self._say(f"{games_per_h:.0f} games/h, {positions_per_s:.1f} positions/s, generation "
                          f"{self.generation}, {len(self.unacked)} games awaiting acks ({self.in_flight} sent, "
                          f"the daemon's credit {self.credit})"
                          + (" (self-play paused at the bound)" if self.full() else ""))
                next_stats = now + STATS_S
            if draining and (not self.unacked or now >= self._drain_until):  # type: ignore[operator]
                return
            if sock.poll(_POLL_MS, self._zmq.POLLIN):
                for frames in waiting(sock, 256, copy=False):
                    self._receive(frames)

    def _link(self, reached: bool, now: float) -> None:
        """Say when the daemon stops being reachable (a heartbeat finds no connection) and when it is
        again: the outage as this worker saw it, beside the daemon's "silent" and "back" lines."""
        if not reached and self._down_since is None:
            self._down_since = now
            self._say(f"the daemon at {self.connect} is unreachable since {time.strftime('%H:%M:%S')}: self-play "
                      f"goes on, finished games are kept ({len(self.unacked)} unacknowledged) and sent when it is back")
        elif reached and self._down_since is not None:
            self._say(f"the daemon at {self.connect} is reachable again after {now - self._down_since:,.0f} s")
            self._down_since = None

    def _rate(self, samples: collections.deque, now: float) -> tuple[float, float]:
        """(positions/s, games/h) over about the last minute; games/h counts the games without a record too."""
        samples.append((now, self.positions, self.games + self.empty))
        while len(samples) > 2 and now - samples[1][0] >= STATS_S:
            samples.popleft()
        t0, p0, g0 = samples[0]
        span = now - t0
        if span <= 0:
            return 0.0, 0.0
        return (self.positions - p0) / span, (self.games + self.empty - g0) * 3600.0 / span

    def _queue_game(self, game: FinishedGame, size: int, now: float) -> None:
        try:
            frames = wire.encode(wire.Game(self.worker, game.game_id, game.generation, game.result,
                                           game.termination, game.records, game.pgn))
        except wire.WireError as e:
            self._say(f"game {game.game_id} cannot be sent ({e}); dropped")
            self._release(size)
            return
        self.unacked[game.game_id] = [frames, now, size, False]
        self.games += 1

    def _receive(self, frames: list) -> None:
        try:
            message = wire.decode(frames)
        except wire.WireError as e:
            self._limited(f"dropped a malformed message from the daemon: {e}")
            return
        if isinstance(message, wire.Ack):
            self.credit = message.credit
            for game_id in message.game_ids:
                entry = self._forget(game_id)
                if entry is not None:
                    self.acked += 1
        elif isinstance(message, wire.Registered):
            if self.registered is None:
                self.registered = message
                self.credit = message.credit
                self.registered_event.set()
                self._say(f"registered with run {message.run} at {self.connect}"
                          + ("" if message.generation is None else f", generation {message.generation}"))
        elif isinstance(message, wire.Refused):
            entry = None if message.game_id is None else self._forget(message.game_id)
            if entry is not None:
                self.refused += 1
                self._say(f"the daemon refused game {message.game_id}: {message.reason}; dropped")
            else:
                self._limited(f"the daemon refused a message: {message.reason}")
        elif isinstance(message, wire.ErrorReply):
            self._limited(f"the daemon could not take {'a message' if message.game_id is None else 'game ' + message.game_id}"
                          f": {message.reason}; it will be resent")
        elif isinstance(message, wire.Stop):
            self._say(f"the daemon asks to stop{': ' + message.reason if message.reason else ''}")
            self._stop.set()
        else:
            self._limited(f"ignored a {type(message).__name__} message from the daemon")

    def _forget(self, game_id: str) -> Optional[list]:
        """An unacked game the daemon answered for good (stored, or refused): its entry, or None."""
        entry = self.unacked.pop(game_id, None)
        if entry is not None:
            self.in_flight -= entry[3]
            self._release(entry[2])
        return entry

    def _limited(self, text: str) -> None:
        dropped = self._limit.admit()
        if dropped is not None:
            self._say(text + (f" ({dropped} similar lines suppressed)" if dropped else ""))


def configure_dealer(sock: Any, keys: Any, rng: random.Random) -> None:
    """A worker's DEALER to the daemon (the bench's simulated workers use it too)."""
    import zmq

    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.IMMEDIATE, 1)  # nothing queued for a daemon that is not there: resends cover it
    # ZMTP pings: a link cut without a reset (a cable, a firewall) drops the connection within
    # LINK_TIMEOUT_S instead of TCP's minutes, so sends fail and the outage is seen and said
    sock.setsockopt(zmq.HEARTBEAT_IVL, int(HEARTBEAT_S * 1000))
    sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, int(LINK_TIMEOUT_S * 1000))
    sock.setsockopt(zmq.RECONNECT_IVL, int(rng.uniform(*RECONNECT_S) * 1000))
    sock.setsockopt(zmq.RECONNECT_IVL_MAX, int(RECONNECT_MAX_S * 1000))
    sock.setsockopt(zmq.MAXMSGSIZE, wire.MAX_FRAME_BYTES)
    if keys is not None:
        keys.apply(sock)


# --------------------------------------------------------------------------- the worker


class Worker:
    """One self-play worker on one device (``cpu`` or ``cuda:N``); :meth:`run` until stopped.

    ``keys``: a CurveZMQ client key folder (:func:`engine.announce.load_client_keys`), for the
    daemon's sockets and the follower's.  ``games``: games played at once (None: the run's
    ``selfplay.games_per_worker``, else 256 on a GPU, 32 on the CPU).  ``threads``: ONNX
    Runtime's intra-op threads on the CPU.  ``stop``: set it (a signal handler does) to stop.
    ``simulate_gpu``: on ``cuda:N``, the network runs on the GPU stand-in
    (``engine.tools.gpu_standin``), which exercises the GPU path on a machine without one.
    ``log``: called with each line, already prefixed ``worker NAME:`` (default: stderr).
    ``max_unacked_games``, ``max_unacked_bytes``: the games awaiting the daemon's acks at which
    self-play pauses until acks make room (checked before each step, so one step's finished
    games may go past it).
    """

    def __init__(self, connect: str, *, keys: Optional[str] = None, device: str = "cpu",
                 name: Optional[str] = None, games: Optional[int] = None, threads: Optional[int] = None,
                 log: Optional[Callable[[str], object]] = None, stop: Optional[threading.Event] = None,
                 context: Any = None, simulate_gpu: bool = False, max_unacked_games: int = MAX_UNACKED_GAMES,
                 max_unacked_bytes: int = MAX_UNACKED_BYTES) -> None:
        self.connect = validate_endpoint(connect, "--connect")
        (self.device,) = selfplay_devices(device)
        self.name = name or default_name()
        if _ID_BAD.search(self.name) or not 1 <= len(self.name) <= 128:
            raise ValueError(f"--name {self.name!r}: use 1-128 letters, digits, '.', '_', ':' or '-'")
        if games is not None and (isinstance(games, bool) or not isinstance(games, int) or games < 1):
            raise ValueError(f"--games must be a whole number >= 1, got {games!r}")
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 0):
            raise ValueError(f"--threads must be a whole number >= 0, got {threads!r}")
        self.keys_dir = keys
        self.keys = load_client_keys(keys) if keys else None  # a bad folder: KeyFileError now, not later
        self.games = games
        self.threads = threads
        self.simulate_gpu = simulate_gpu and self.device != "cpu"
        self._log = log or _stderr
        self.stop = stop or threading.Event()
        self._context = context
        _check_bounds(max_unacked_games, max_unacked_bytes)
        self.max_unacked = (max_unacked_games, max_unacked_bytes)
        self.link: Optional[_Link] = None
        self.selfplay: Optional[SelfPlay] = None

    def say(self, text: str) -> None:
        try:
            self._log(f"worker {self.name}: {text}")
        except Exception:  # noqa: BLE001 - a broken log must not stop the games
            pass

    def run(self) -> int:
        """Play until stopped; 0 after a clean stop (Stop, a signal); raises on a crash."""
        register = wire.Register(self.name, socketlib.gethostname()[:wire.MAX_TEXT_CHARS], os.getpid(),
                                 (self.device,), f"cyzero {__version__}")
        link = self.link = _Link(self.connect, register, self.keys, self.stop, self.say, self._context,
                                 max_games=self.max_unacked[0], max_bytes=self.max_unacked[1])
        try:
            self._play(link)
            if link.error is None:
                left = link.finish(STOP_WAIT_S)
                self.say("stopped" + (f"; {left} games were not acknowledged" if left else ""))
        finally:
            link.close()
        if link.error is not None:
            raise RuntimeError(f"the connection to the daemon failed: {link.error}")
        return 0

    def _play(self, link: _Link) -> None:
        """Register, load the network and play until :attr:`stop` is set."""
        while not self.stop.is_set() and not link.registered_event.wait(0.1):
            pass
        registered = link.registered
        if registered is None:  # stopped before the daemon answered
            return
        settings = settings_from_config(registered.selfplay, registered.openings)
        games = self.games or int(registered.selfplay.get("games_per_worker") or 0) or (
            32 if self.device == "cpu" else 256)
        tablebases = self._tablebases(str(registered.selfplay.get("syzygy") or ""))
        manager = self._manager(registered, worker_max_batch(games, settings))
        try:
            network = self._first_network(manager, registered)
            if network is None:
                return
            generation = manager.generation or 0
            self.selfplay = selfplay = SelfPlay(network, settings, games, generation=generation,
                                                pipeline=self.device != "cpu", tablebases=tablebases)
            link.playing, link.generation = games, generation
            self.say(f"playing {games} games at once on {self.device}, generation {generation}")
            try:
                while not self.stop.is_set():
                    if link.full():  # the daemon is not acknowledging: keep no more games in memory
                        link.wait_for_room(self.stop)
                        continue
                    if manager.apply_pending():
                        generation = manager.generation if manager.generation is not None else generation
                        selfplay.set_network(manager.get(), generation)
                        link.generation = generation
                    for game in selfplay.step():
                        link.submit(game)   # a game without a record is counted, not sent
                    link.positions = selfplay.positions
            finally:
                selfplay.close()
        finally:
            manager.close()
            if tablebases is not None:
                tablebases.close()

    # -- pieces of run() -----------------------------------------------------------------

    def _tablebases(self, paths: str) -> Optional[Tablebases]:
        if not paths.strip():
            return None
        try:
            return Tablebases(paths)
        except ValueError as e:
            self.say(f"{e}; playing without Syzygy adjudication")
            return None

    def _manager(self, registered: wire.Registered, max_batch: int) -> NetworkManager:
        """``max_batch``: the largest batch of the network on a GPU (its fixed sizes go up to it)."""
        if self.device == "cpu":
            backend, device_id, options = "cpu", 0, {}
        else:
            backend, device_id = "tensorrt", int(self.device.split(":")[1])  # falls back to CUDA, said once
            options = {"max_batch": max_batch}
            if self.simulate_gpu:
                from engine.tools.gpu_standin import SimulatedGPU

                backend, options["session_factory"] = "cuda", SimulatedGPU()
        manager = NetworkManager(registered.path, backend=backend, device_id=device_id, threads=self.threads,
                                 network_options=options, log=self.say, keys=self.keys_dir, watch=False,
                                 zmq_context=self._context)
        if registered.publish:
            try:
                manager.set_endpoint(peer_endpoint(registered.publish, self.connect, "publish endpoint", "--connect"))
            except ValueError as e:
                self.say(f"cannot follow new generations: {e}")
        return manager

    def _first_network(self, manager: NetworkManager, registered: wire.Registered) -> Any:
        """The daemon's current network: its file when readable here, else the first announcement's."""
        path, sha256, generation = registered.path, registered.sha256, registered.generation
        if path and sha256 and generation is not None and os.path.isfile(path) and os.access(path, os.R_OK):
            manager.swap.propose(Proposal(path, sha256, ("trainer", generation, sha256), generation,
                                          registered.run))
        elif manager.follower is None:
            raise RuntimeError("the daemon named no network readable here and no publish endpoint to fetch one")
        start = time.monotonic()
        said = False
        while not self.stop.is_set():
            if manager.wait_pending(0.2):
                return manager.get()
            if not said and time.monotonic() - start >= 30.0:
                said = True
                self.say(f"waiting for the daemon's network (announced on {manager.endpoint})")
        return None


# --------------------------------------------------------------------------- the command


def run_workers(connect: str, *, keys: Optional[str] = None, devices: str = "cpu", name: Optional[str] = None,
                games: Optional[int] = None, threads: Optional[int] = None,
                log: Optional[Callable[[str], object]] = None, simulate_gpu: bool = False) -> int:
    """``cyzero-train worker``: one worker per device, until stopped; the exit status.

    A single device plays in this process; several devices get one subprocess each
    (named ``NAME-cudaN``), which SIGTERM/SIGINT are passed on to.
    """
    out = log or _stderr
    try:
        device_list = selfplay_devices(devices)
        validate_endpoint(connect, "--connect")
    except ValueError as e:
        out(f"cyzero-train worker: {e}")
        return 2
    base = name or default_name()
    if len(device_list) == 1:
        stop = threading.Event()
        with stop_on_signals(stop, interrupt_again=False):
            try:
                worker = Worker(connect, keys=keys, device=device_list[0], name=base, games=games, threads=threads,
                                log=log, stop=stop, simulate_gpu=simulate_gpu)
                return worker.run()
            except ValueError as e:  # bad arguments or keys, bad settings from the daemon
                out(f"worker {base}: {e}")
                return 2
    children = []
    for device in device_list:
        command = [sys.executable, "-m", "trainer.cli", "worker", "--connect", connect, "--devices", device,
                   "--name", f"{base}-{device.replace(':', '')}"]
        command += (["--keys", keys] if keys else []) + (["--games", str(games)] if games else [])
        command += ["--threads", str(threads)] if threads is not None else []
        command += ["--simulate-gpu"] if simulate_gpu and device != "cpu" else []
        children.append(subprocess.Popen(command))
    stop = threading.Event()
    with stop_on_signals(stop, interrupt_again=False):
        while any(child.poll() is None for child in children):
            if stop.wait(0.2):
                for child in children:
                    if child.poll() is None:
                        child.send_signal(signal.SIGTERM)
                for child in children:
                    child.wait()
        return max(abs(child.returncode) for child in children)
