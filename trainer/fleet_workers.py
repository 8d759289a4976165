"""The simulated self-play workers of ``cyzero-train bench fleet``: N workers on one thread, one DEALER each.

Each registers, heartbeats and sends its games as :mod:`trainer.worker` does: a game is sent while
fewer than the daemon's credit of its games await acks (the others wait on the worker), held until
its ``Ack``, resent every ``RESEND_S``, and a worker holding ``MAX_UNACKED_GAMES`` skips its next
games (a real worker pauses self-play there). The fleet's games follow a schedule, game k due
k / rate seconds after the start, dealt round-robin. Each game is a real wire message
(:mod:`trainer.wire`) with a fresh id, carrying the records and PGN of one of a few games made once
(:func:`template_games`) in the run's input format: its records' gzip member is compressed once too
(a real worker compresses each game, on cores of its own), so that one process can send a fleet's games.
"""

from __future__ import annotations

import collections
import dataclasses
import heapq
import math
import os
import random
import socket as socketlib
import time
import uuid
from typing import Any, Callable, Optional

import numpy as np
import zmq

from engine import __version__
from engine.announce import waiting
from trainer import wire
from trainer.worker import HEARTBEAT_S, MAX_UNACKED_GAMES, REGISTER_S, RESEND_S, configure_dealer

__all__ = ["MAX_POSITIONS_PER_GAME", "POSITIONS_PER_GAME", "TEMPLATES", "Fleet", "Template", "game_frames",
           "template_games"]

POSITIONS_PER_GAME = 40   # records a game: about 160 plies at the gpu config's full_search_prob 0.25
MAX_POSITIONS_PER_GAME = 200
TEMPLATES = 8             # games made once; every game sent is one of them with a fresh id
_MAX_PLIES = 400          # a template's random game is this long at most (about half of them get there)
_RETRY_S = 0.2            # a send ZeroMQ had no room for is tried again this soon
_SEND_BURST = 256         # games sent at most before the loop reads its replies
_ID_MARK = "x" * 32       # in a template's PGN: the game id
_GEN_MARK = "GENERATION"  # in a template's PGN: the generation


# --------------------------------------------------------------------------- the games


@dataclasses.dataclass(frozen=True)
class Template:
    """One game made once; every game sent from it shares its records' gzip member."""

    records: np.ndarray
    member: bytes         # the records as one gzip member, as the wire carries them
    pgn: str              # with _ID_MARK and _GEN_MARK in place of the id and the generation
    result: str
    termination: str


def _random_game(rng: np.random.Generator, plies: int) -> list[str]:
    from engine.board import Board

    board = Board()
    moves: list[str] = []
    while len(moves) < plies and not board.is_game_over():
        legal = board.legal_moves()
        moves.append(legal[int(rng.integers(len(legal)))])
        board.push_uci(moves[-1])
    return moves


def template_games(input_format: int = 1, positions: int = POSITIONS_PER_GAME, count: int = TEMPLATES,
                   full_search_prob: float = 0.25, visits: int = 800, seed: int = 0) -> list[Template]:
    """``count`` games of ``positions`` V6 records on average (0.75 to 1.25 times it), as self-play
    keeps them: random legal play, a record at a share ``full_search_prob`` of the plies, each with
    ``visits`` spread over the legal moves (half on the move played, half by a Dirichlet draw)."""
    import chess
    import chess.pgn

    from engine.board import Board
    from trainer.records import RECORD_DTYPE, Eval, compress_records, make_record

    if not 1 <= positions <= MAX_POSITIONS_PER_GAME:
        raise ValueError(f"positions a game must be 1-{MAX_POSITIONS_PER_GAME}, got {positions}")
    rng = np.random.default_rng(seed)
    templates = []
    for i in range(count):
        n = max(1, round(positions * (0.75 + 0.5 * i / max(count - 1, 1))))
        plies = max(n, min(round(n / max(full_search_prob, 1e-3)), _MAX_PLIES))
        moves = next((m for m in (_random_game(rng, plies) for _ in range(200)) if len(m) == plies), None)
        if moves is None:
            raise ValueError(f"no random game of {plies} plies in 200 tries: ask for fewer positions a game")
        result = wire.RESULTS[i % 3]
        recorded = set(rng.choice(plies, n, replace=False).tolist())
        board, records = Board(), []
        for ply, move in enumerate(moves):
            if ply in recorded:
                legal = board.legal_moves()
                counts = dict(zip(legal, rng.multinomial(visits // 2, rng.dirichlet([0.3] * len(legal))).tolist()))
                counts[move] += visits - visits // 2
                mover_won = (result == "1-0") == board.turn
                result_q, result_d = (0.0, 1.0) if result == "1/2-1/2" else (1.0 if mover_won else -1.0, 0.0)
                root = Eval(float(rng.uniform(-0.3, 0.3)), float(rng.uniform(0.1, 0.6)), float(plies - ply))
                records.append(make_record(board, counts, result_q=result_q, result_d=result_d,
                                           plies_left=plies - ply, played=move, root=root,
                                           input_format=input_format))
            board.push_uci(move)
        game = chess.pgn.Game()
        termination = "max_plies" if result == "1/2-1/2" else "resignation"
        for key, value in (("Event", "cyzero self-play"), ("White", "cyzero"), ("Black", "cyzero"),
                           ("Result", result), ("Termination", termination), ("Generation", _GEN_MARK),
                           ("GameId", _ID_MARK)):
            game.headers[key] = value
        node: Any = game
        for move in moves:
            node = node.add_variation(chess.Move.from_uci(move))
        array = np.array(records, dtype=RECORD_DTYPE)
        templates.append(Template(array, compress_records(array), str(game), result, termination))
    return templates


def game_frames(template: Template, worker: str, game_id: str, generation: int) -> list:
    """A ``Game`` message from ``template`` with this id, as :func:`trainer.wire.encode` makes it."""
    pgn = template.pgn.replace(_ID_MARK, game_id).replace(_GEN_MARK, str(generation))
    frames = wire.encode(wire.Game(worker, game_id, generation, template.result, template.termination,
                                   template.records, pgn, template.member))
    frames[1] = template.member  # the same bytes: a template's games share one copy while they await acks
    return frames


# --------------------------------------------------------------------------- the workers


@dataclasses.dataclass
class _Held:
    """A game a simulated worker keeps until its ack."""

    frames: list
    positions: int
    made: float
    next_send: float
    first_sent: Optional[float] = None


class _SimWorker:
    def __init__(self, name: str, sock: Any, index: int, count: int) -> None:
        self.name, self.socket, self.index = name, sock, index
        self.phase = index / count  # its share of HEARTBEAT_S: the fleet's heartbeats spread, not in one burst
        self.registered: Optional[wire.Registered] = None
        self.next_register = 0.0
        self.next_heartbeat = 0.0
        self.held: dict[str, _Held] = {}
        self.credit = 1        # games it may have sent and unacknowledged (the daemon's Registered and Acks)
        self.in_flight = 0     # held games sent at least once
        self.waiting: collections.deque[str] = collections.deque()  # held games not sent yet: no credit left
        self.stopped = False


class Fleet:
    """N simulated workers on the calling thread: their DEALERs on one poller, the games on a schedule.

    A reply is handled by the method :attr:`REPLIES` names for its type: a new reply of the
    daemon's (a back-pressure message, say) needs its entry there and its method; until then it
    is counted as unhandled and shown in the report."""

    REPLIES = {wire.Ack: "_on_ack", wire.Registered: "_on_registered", wire.Refused: "_on_refused",
               wire.ErrorReply: "_on_error", wire.Stop: "_on_stop"}

    def __init__(self, endpoint: str, count: int, rate: float, templates: list[Template], keys: Any,
                 generation: Callable[[], int], max_unacked: int = MAX_UNACKED_GAMES) -> None:
        self.ctx = zmq.Context()
        self.rate, self.templates, self.max_unacked = rate, templates, max_unacked
        self.generation = generation
        self.mean_positions = float(np.mean([len(t.records) for t in templates]))
        self.workers: list[_SimWorker] = []
        self._jitter = random.Random(0)   # resends and reconnects spread, as trainer.worker's
        self.by_socket: dict[Any, _SimWorker] = {}
        self.poller = zmq.Poller()
        for i in range(count):
            sock = self.ctx.socket(zmq.DEALER)
            configure_dealer(sock, keys, self._jitter)
            sock.connect(endpoint)
            worker = _SimWorker(f"fleet-{os.getpid()}-{i:03d}", sock, i, count)
            self.workers.append(worker)
            self.by_socket[sock] = worker
            self.poller.register(sock, zmq.POLLIN)
        self.register_frames = {w.name: wire.encode(wire.Register(
            w.name, socketlib.gethostname()[:wire.MAX_TEXT_CHARS], os.getpid(), ("cuda:0",),
            f"cyzero {__version__} (bench fleet)")) for w in self.workers}
        self.t0 = 0.0
        self.issued = 0           # games the schedule dealt so far
        self.made = 0             # of them, played (the others: their worker was at its bound or stopped)
        self.sent = 0             # of those, sent at least once
        self.paused = 0           # dealt to a worker holding max_unacked games: not played
        self.credit_waits = 0     # games that waited on their worker for credit before their first send
        self.unsendable = 0       # dealt to a worker the daemon stopped
        self.resends = 0
        self.resend_times: list[float] = []   # monotonic, one a resend: how a restarted daemon is called on
        self.no_room = 0          # sends ZeroMQ refused (no connection, or its queue full): tried again
        self.held_total = 0
        self.acked_ids: set[str] = set()
        self.acks: list[tuple[float, int, float, float]] = []  # (s since t0, positions, from first send, from made)
        self.lags: list[float] = []
        self.repeated_acks = 0
        self.refused: list[str] = []
        self.errors: list[str] = []
        self.stops = 0
        self.malformed = 0
        self.unhandled: collections.Counter = collections.Counter()
        self._resend_heap: list[tuple[float, int, int, str]] = []
        self._seq = 0

    # -- sending ----------------------------------------------------------------------

    def _send(self, worker: _SimWorker, frames: list) -> bool:
        try:
            worker.socket.send_multipart(frames, zmq.NOBLOCK, copy=False)
            return True
        except zmq.Again:
            self.no_room += 1
            return False

    def _send_game(self, index: int, game_id: str, held: _Held, now: float) -> None:
        """Send (or resend) a held game now, if its worker's credit allows a first send; schedule what comes next."""
        worker = self.workers[index]
        if held.first_sent is None and worker.in_flight >= worker.credit:
            worker.waiting.appendleft(game_id)  # others took the credit while this one waited to be tried again
            return
        if self._send(worker, held.frames):
            if held.first_sent is None:
                held.first_sent = now
                worker.in_flight += 1
                self.sent += 1
            else:
                self.resends += 1
                self.resend_times.append(now)
            held.next_send = now + RESEND_S * self._jitter.uniform(0.8, 1.2)  # spread, as trainer.worker's
        else:
            held.next_send = now + _RETRY_S
        self._schedule(index, game_id, held)

    def _schedule(self, index: int, game_id: str, held: _Held) -> None:
        self._seq += 1
        heapq.heappush(self._resend_heap, (held.next_send, self._seq, index, game_id))

    def _send_due(self, now: float, end: float = math.inf) -> None:
        """Deal the games due by ``now`` (those due before ``end``), at most _SEND_BURST a turn."""
        for _ in range(_SEND_BURST):
            due = self.t0 + self.issued / self.rate
            if due > now or due >= end:
                return
            index = self.issued % len(self.workers)
            worker = self.workers[index]
            template = self.templates[(self.issued // len(self.workers)) % len(self.templates)]
            self.issued += 1
            if worker.stopped or worker.registered is None:
                self.unsendable += 1
            elif len(worker.held) >= self.max_unacked:
                self.paused += 1
            else:
                game_id = uuid.uuid4().hex
                held = _Held(game_frames(template, worker.name, game_id, self.generation()), len(template.records),
                             now, now)
                worker.held[game_id] = held
                self.held_total += 1
                self.made += 1
                self.lags.append(now - due)
                if worker.waiting or worker.in_flight >= worker.credit:
                    worker.waiting.append(game_id)  # as trainer.worker: kept until the credit lets it go
                    self.credit_waits += 1
                else:
                    self._send_game(index, game_id, held, now)

    def _resend_due(self, now: float) -> None:
        """The resends that are due, at most _SEND_BURST a turn: a fleet's workers send in parallel, so
        one worker's burst (after a daemon's restart, say) must not hold the others' sends and replies up here."""
        heap = self._resend_heap
        for _ in range(_SEND_BURST):
            if not heap or heap[0][0] > now:
                return
            when, _, index, game_id = heapq.heappop(heap)
            held = self.workers[index].held.get(game_id)
            if held is not None and held.next_send == when:
                self._send_game(index, game_id, held, now)

    def _timers(self, now: float) -> None:
        """Register until registered (every REGISTER_S), then a heartbeat every HEARTBEAT_S."""
        per_worker = self.rate / len(self.workers) if self.rate else 0.0
        for worker in self.workers:
            if worker.registered is None and now >= worker.next_register:
                worker.next_register = now + (REGISTER_S if self._send(worker, self.register_frames[worker.name])
                                              else _RETRY_S)
            elif worker.registered is not None and not worker.stopped and now >= worker.next_heartbeat:
                playing = int(worker.registered.selfplay.get("games_per_worker") or 256)
                self._send(worker, wire.encode(wire.Heartbeat(worker.name, playing, per_worker * self.mean_positions,
                                                              self.generation())))
                worker.next_heartbeat = now + HEARTBEAT_S

    # -- replies ----------------------------------------------------------------------

    def _read(self, worker: _SimWorker, now: float) -> None:
        for frames in waiting(worker.socket, 256, copy=False):
            try:
                message = wire.decode(frames)
            except wire.WireError:
                self.malformed += 1
                continue
            handler = self.REPLIES.get(type(message))
            if handler is None:
                self.unhandled[type(message).__name__] += 1
            else:
                getattr(self, handler)(worker, message, now)

    def _on_ack(self, worker: _SimWorker, message: wire.Ack, now: float) -> None:
        worker.credit = message.credit
        for game_id in message.game_ids:
            held = self._forget(worker, game_id)
            if held is None:
                self.repeated_acks += 1  # a resend's second ack
                continue
            self.acked_ids.add(game_id)
            self.acks.append((now - self.t0, held.positions, now - (held.first_sent or now), now - held.made))
        self._send_waiting(worker, now)

    def _forget(self, worker: _SimWorker, game_id: str) -> Optional[_Held]:
        """A held game answered for good (acknowledged, refused): its credit comes back."""
        held = worker.held.pop(game_id, None)
        if held is not None:
            self.held_total -= 1
            if held.first_sent is not None:
                worker.in_flight -= 1
        return held

    def _send_waiting(self, worker: _SimWorker, now: float) -> None:
        """First sends of the games that waited for credit, as far as it goes now."""
        while worker.waiting and worker.in_flight < worker.credit:
            game_id = worker.waiting.popleft()
            held = worker.held.get(game_id)
            if held is not None:
                self._send_game(worker.index, game_id, held, now)

    def _on_registered(self, worker: _SimWorker, message: wire.Registered, now: float) -> None:
        if worker.registered is None:
            worker.registered = message
            worker.credit = message.credit
            worker.next_heartbeat = now + HEARTBEAT_S * worker.phase

    def _on_refused(self, worker: _SimWorker, message: wire.Refused, now: float) -> None:
        """Never resent as it is: the game is dropped (and the report says why)."""
        if message.game_id is not None:
            self._forget(worker, message.game_id)
            self._send_waiting(worker, now)
        self.refused.append(message.reason)

    def _on_error(self, worker: _SimWorker, message: wire.ErrorReply, now: float) -> None:
        """The daemon's failure: the game stays held and is resent at its time."""
        self.errors.append(message.reason)

    def _on_stop(self, worker: _SimWorker, message: wire.Stop, now: float) -> None:
        worker.stopped = True
        self.stops += 1

    # -- the loop ---------------------------------------------------------------------

    def serve(self, until: float, *, schedule: bool, tick: Callable[[float], bool],
              until_empty: bool = False) -> bool:
        """Send, resend, heartbeat and read replies until ``until`` (monotonic), or with ``until_empty``
        until no game is held; False when ``tick`` (called about once a second) stopped it first."""
        next_timers = next_tick = 0.0
        while True:
            now = time.monotonic()
            if now >= until or (until_empty and self.held_total == 0):
                while schedule and self.t0 + self.issued / self.rate < until:
                    self._send_due(time.monotonic(), until)  # every game due in the run, late if this loop was
                return True
            if schedule:
                self._send_due(now, until)
            self._resend_due(now)
            if now >= next_timers:
                self._timers(now)
                next_timers = now + 0.1
            if now >= next_tick:
                if not tick(now):
                    return False
                next_tick = now + 1.0
            wake = min(until, next_timers, next_tick)
            if schedule:
                wake = min(wake, self.t0 + self.issued / self.rate)
            if self._resend_heap:
                wake = min(wake, self._resend_heap[0][0])
            for sock, _ in self.poller.poll(math.ceil(max(0.0, wake - time.monotonic()) * 1000)):
                self._read(self.by_socket[sock], time.monotonic())

    def register(self, timeout: float, tick: Callable[[float], bool]) -> None:
        deadline = time.monotonic() + timeout
        while any(w.registered is None for w in self.workers):
            if time.monotonic() >= deadline:
                missing = sum(w.registered is None for w in self.workers)
                raise RuntimeError(f"{missing} of {len(self.workers)} simulated workers got no Registered "
                                   f"within {timeout:g} s")
            if not self.serve(min(deadline, time.monotonic() + 0.2), schedule=False, tick=tick):
                raise RuntimeError("stopped before every simulated worker registered")

    def close(self) -> None:
        if self.ctx.closed:
            return
        for worker in self.workers:
            worker.socket.close(0)
        self.ctx.term()
