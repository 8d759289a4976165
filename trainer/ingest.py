"""The daemon's ingest, without torch: the ROUTER the workers talk to (:mod:`trainer.wire`).

``Register`` -> ``Registered``; heartbeats; finished games, buffered and written to the replay
store and only then acknowledged (durable-then-ack), a game whose id is among the newest stored
(``RECENT_GAME_IDS``, a bounded memory) dropped, so a worker may resend until it sees its ``Ack``
and no game is stored twice. Flow control is credit: each ack and handshake says how many games
a worker may have in flight. A malformed message is logged (rate-limited) and dropped, never fatal.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import os
import time
from typing import Any, Callable, Iterable, Optional, Sequence

import zmq

from engine.announce import waiting
from trainer import wire
from trainer.atomic import append_durably
from trainer.config import TrainConfig
from trainer.endpoints import port_in_use
from trainer.rundir import PGN_DIR
from trainer.supervision import Child

__all__ = ["ALIVE_S", "Ingest", "RECENT_GAME_IDS", "Worker"]

Log = Callable[[str], Any]

ALIVE_S = 10.0  # a worker heard from within this (5 of trainer.worker's heartbeats) counts as alive
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


@dataclasses.dataclass
class _Load:
    """The daemon's time spent receiving and storing since ``since`` (monotonic), and its games then."""

    since: float = dataclasses.field(default_factory=time.monotonic)
    busy: float = 0.0
    games: int = 0
    full_since: Optional[float] = None  # at capacity since then (None: keeping up)


@dataclasses.dataclass
class Worker:
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
    child: Optional[Child] = None
    silent_since: Optional[float] = None  # monotonic time it was said to be silent (None: heard lately)
    buffered: int = 0  # its games received and not yet stored


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


class Ingest:
    """The workers' side of the daemon: the ROUTER (``router``), the replay store it writes (``store``,
    from :meth:`open`), the games buffered until a flush, the credit, and the counts of what is stored.

    ``workers`` is the daemon's record of every worker id (shared: the daemon adds its local workers
    and reports them); ``registered()`` the handshake a worker gets; ``dropped`` a rate-limited log
    for what is refused or lost; ``recent_game_ids`` how many of the newest stored game ids are
    remembered to drop a worker's resends (:class:`_RecentIds`).
    """

    def __init__(self, run_dir: str, config: TrainConfig, workers: dict[str, Worker],
                 registered: Callable[[], wire.Registered], log: Log, dropped: Log, recent_game_ids: int):
        self.run_dir, self.config, self.workers, self.registered = run_dir, config, workers, registered
        self.log, self.dropped = log, dropped
        self.router: Any = None
        self.store: Any = None
        self.stored = _RecentIds(recent_game_ids)  # the newest stored game ids: resends are dropped
        self.games_total = 0
        self.positions_total = 0
        self.load = _Load()   # the share of time spent receiving and storing: at capacity or not
        self._buffer: dict[str, tuple[wire.Game, set[bytes]]] = {}
        self._first_buffered = 0.0
        self._credit = MAX_CREDIT   # each worker's share of IN_FLIGHT_GAMES (see credit_now)
        self._credit_at = -math.inf
        self._credit_spent = False  # a worker has as many games buffered as its credit

    def bind(self, context: Any, endpoint: str, server_keys: Optional[tuple[bytes, bytes]]) -> str:
        """Bind the ROUTER on ``endpoint`` (a CURVE server with ``server_keys``); returns the endpoint
        bound. ValueError, naming who holds a taken port, when it cannot be bound."""
        router = context.socket(zmq.ROUTER)
        self.router = router
        router.setsockopt(zmq.LINGER, 1000)
        router.setsockopt(zmq.MAXMSGSIZE, MAX_ROUTER_MESSAGE)
        router.setsockopt(zmq.RCVHWM, PEER_QUEUE)
        if server_keys is not None:
            router.curve_server = True
            router.curve_publickey, router.curve_secretkey = server_keys
        try:
            router.bind(endpoint)
        except zmq.ZMQError as e:
            raise ValueError(f"cannot bind daemon.endpoint {endpoint}: {e}{port_in_use([endpoint], e)}") from None
        return router.getsockopt_string(zmq.LAST_ENDPOINT)

    def close(self) -> None:
        if self.router is not None:
            self.router.close()
            self.router = None

    def open(self, store: Any) -> None:
        """Store into ``store`` (a :class:`trainer.store.ReplayStore`): its newest game ids and its
        self-play totals are read back."""
        self.store = store
        self.stored = _RecentIds(self.stored.limit, store.newest_game_ids(self.stored.limit))
        for entry in store.entries():
            if entry.source == "selfplay":
                self.games_total += entry.games
                self.positions_total += entry.positions

    # -- receiving -------------------------------------------------------------------------

    def credit_now(self) -> int:
        """A worker's credit: IN_FLIGHT_GAMES shared by the workers heard within ALIVE_S (counted again
        every CREDIT_EVERY_S, and when a worker joins), 1 to MAX_CREDIT each."""
        now = time.monotonic()
        if now - self._credit_at >= CREDIT_EVERY_S:
            alive = sum(1 for w in self.workers.values() if now - w.last_heard < ALIVE_S)
            self._credit = max(1, min(MAX_CREDIT, IN_FLIGHT_GAMES // max(1, alive)))
            self._credit_at = now
        return self._credit

    def receive(self) -> None:
        """Read what waits (RECEIVE_BATCH messages at most), storing a chunk whenever flush_games are
        buffered; at the end, store what a worker waits on (it sent all its credit allows)."""
        for frames in waiting(self.router, RECEIVE_BATCH, copy=False):
            try:
                message = wire.decode(frames[1:])
            except wire.WireError as e:
                self.dropped(f"dropped a malformed message: {e}")
                continue
            try:
                self._handle(frames[0].bytes, message)
            except wire.WireError as e:  # a reply that cannot be encoded: dropped as a bad message is
                self.dropped(f"dropped a message: {e}")
            if len(self._buffer) >= self.config.daemon.flush_games:
                self.flush()
        if self._credit_spent:
            self.flush()  # a worker sent all its credit allows: waiting for flush_s would idle it

    def flush_if_due(self, now: float) -> None:
        d = self.config.daemon
        if self._buffer and (now - self._first_buffered >= d.flush_s or len(self._buffer) >= d.flush_games):
            self.flush()

    def note_load(self, now: float, busy: float = 0.0) -> None:
        """Count ``busy`` seconds more spent receiving and storing; each LOAD_WINDOW_S, say when that
        fills the daemon's time (the fleet offers more than it stores, and waits on credit) and when
        it no longer does."""
        load = self.load
        load.busy += busy
        if now - load.since < LOAD_WINDOW_S:
            return
        share = load.busy / (now - load.since)
        stored = self.games_total - load.games
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
        load.since, load.busy, load.games = now, 0.0, self.games_total

    def send(self, identity: bytes, message: Any) -> None:
        try:
            self.router.send_multipart([identity, *wire.encode(message)], zmq.NOBLOCK)
        except zmq.Again:
            self.dropped("a worker is not reading its replies: one dropped")
        except zmq.ZMQError as e:
            self.dropped(f"reply not sent: {e}")

    def stop_workers(self, reason: str) -> None:
        """Send Stop to every worker that has talked to the daemon."""
        for worker in self.workers.values():
            if worker.identity is not None:
                self.send(worker.identity, wire.Stop(reason))

    def _send_ids(self, identity: bytes, ids: list[str], message: Callable[[tuple[str, ...]], Any]) -> None:
        """``message(ids)`` for game ids (an Ack), in as many messages as the wire's limit needs."""
        for i in range(0, len(ids), wire.MAX_ACK_GAMES):
            self.send(identity, message(tuple(ids[i:i + wire.MAX_ACK_GAMES])))

    def _worker(self, worker_id: str, identity: bytes) -> Worker:
        """The worker of this id (one the daemon does not know is taken in: it may have restarted)."""
        worker = self.workers.get(worker_id)
        if worker is None:
            worker = self.workers[worker_id] = Worker(worker_id)
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
            self.send(identity, self.registered())
        elif isinstance(message, wire.Heartbeat):
            worker = self._worker(message.worker, identity)
            worker.playing, worker.positions_per_s = message.playing, message.positions_per_s
            worker.generation = message.generation
        elif isinstance(message, wire.Game):
            worker = self._worker(message.worker, identity)
            played = int(message.records["input_format"][0])   # wire.py checked: one format a game
            if played != self.store.input_format:
                reason = (f"its records are lc0's input format {played}, and this run's network reads format "
                          f"{self.store.input_format}")
                self.dropped(f"refused game {message.game_id} of {message.worker}: {reason}")
                self.send(identity, wire.Refused(reason, message.game_id))
            elif message.game_id in self.stored:
                self.send(identity, wire.Ack((message.game_id,), self.credit_now()))
            elif message.game_id in self._buffer:
                self._buffer[message.game_id][1].add(identity)
            else:
                if not self._buffer:
                    self._first_buffered = time.monotonic()
                self._buffer[message.game_id] = (message, {identity})
                worker.buffered += 1
                self._credit_spent = self._credit_spent or worker.buffered >= self._credit
        else:
            self.dropped(f"dropped a {type(message).__name__} message: workers do not send those")

    # -- storing games ---------------------------------------------------------------------

    def flush(self) -> None:
        """Write the buffered games (one chunk per generation, and another for its games held out for
        validation: ``trainer.store.hold_out`` keeps their share at ``replay.val_percent`` from the
        first game on), then their PGNs, then acknowledge them."""
        if not self._buffer:
            return
        buffered, self._buffer = self._buffer, {}
        self._credit_spent = False
        for game, _ in buffered.values():
            worker = self.workers.get(game.worker)
            if worker is not None:
                worker.buffered = 0
        by_generation: dict[int, list[tuple[wire.Game, set[bytes]]]] = {}
        for game, senders in buffered.values():
            by_generation.setdefault(game.generation, []).append((game, senders))
        from trainer.store import hold_out

        acks: dict[bytes, list[str]] = {}
        val_percent = self.config.replay.val_percent
        held, total = self.store.held_out_positions(val_percent)
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
                self.store.append_games([g.records for g in games], generation=generation, source="selfplay",
                                        game_ids=[g.game_id for g in games], held_out=held_out,
                                        val_percent=val_percent, members=[g.member for g in games])
            except (OSError, ValueError) as e:
                reason = f"replay store: {e}"
                self.log(f"{len(games)} games of generation {generation} not stored ({e}): the workers resend them")
                for game, senders in entries:
                    for identity in senders:
                        self.send(identity, wire.ErrorReply(reason[:wire.MAX_TEXT_CHARS], game.game_id))
                continue
            self.stored.update(g.game_id for g in games)
            self._append_pgn(generation, games)
            for game, senders in entries:
                worker = self.workers.get(game.worker)
                if worker is not None:
                    worker.games += 1
                    worker.positions += game.positions
                self.games_total += 1
                self.positions_total += game.positions
                for identity in senders:
                    acks.setdefault(identity, []).append(game.game_id)
        credit = self.credit_now()
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
