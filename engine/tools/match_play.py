"""Playing a match: the schedule of openings and colours, K workers each with its own two engine
processes, the clocks, adjudication, the early stops (``on_game``, ``should_stop``, the SPRT),
and the PGN appended as games finish."""

from __future__ import annotations

import asyncio
import datetime
import os
import random
import time
from typing import Callable, Optional

import chess
import chess.engine

from engine.tools.match_engine import EngineProcess
from engine.tools.match_openings import load_openings
from engine.tools.match_pgn import pgn_text, write_pgn
from engine.tools.match_summary import sprt_state
from engine.tools.match_types import EngineSpec, EngineStats, GameRecord, MatchConfig, MatchError, MatchResult, Opening

FAILED_STARTS = 2  # games an engine may lose before its first move in the match; then the match stops
STOP_POLL = 0.1  # seconds between two questions to MatchConfig.should_stop
MATE_SCORE = 100_000


def _score_text(pov_score: Optional[chess.engine.Score]) -> str:
    if pov_score is None:
        return ""
    mate = pov_score.mate()
    if mate is not None:
        return f"+M{mate}" if mate > 0 else f"-M{-mate}"
    return f"{pov_score.score() / 100:+.2f}"


def _side(color: chess.Color) -> str:
    return "White" if color == chess.WHITE else "Black"


class _Match:
    def __init__(self, config: MatchConfig, progress: Optional[Callable[[str], None]]):
        self.config = config
        self.progress = progress
        self.stats = (EngineStats(), EngineStats())
        self._notes: list[str] = []
        self.records: dict[int, GameRecord] = {}
        self.next_to_append = 0
        self.wld = [0, 0, 0]
        self.names = ("engine1", "engine2")
        self.started = False  # engines up, games under way
        self.stopping = False  # on_game, should_stop or the SPRT ended the match
        self.games_started = 0
        self.sprt_decision: Optional[str] = None  # "H1" or "H0" once the SPRT has decided
        # An engine that loses FAILED_STARTS games before it has made one move in the match cannot
        # play at all (no network, a bad option, a broken build): the match stops with its reason
        # instead of scoring a hundred forfeits.
        self.has_moved: set[str] = set()
        self.failed_starts = {"engine1": 0, "engine2": 0}
        self.cannot_play: Optional[str] = None

    def note(self, text: str) -> None:
        if text not in self._notes:
            self._notes.append(text)
            if self.progress:
                self.progress(text)

    # ------------------------------------------------------------------ schedule

    def schedule(self, openings: list, seed: int) -> list:
        order = list(range(len(openings)))
        random.Random(seed).shuffle(order)
        games = []
        for index in range(self.config.games):
            pair = index // 2
            opening = openings[order[pair % len(order)]]
            games.append((index, opening, index % 2 == 0))
        return games

    # ------------------------------------------------------------------ one game

    def _limit(self, clocks: dict, spec: EngineSpec) -> chess.engine.Limit:
        """What one engine's ``go`` says: the match's limit, and the engine's own nodes besides it
        (as cutechess-cli sends ``go wtime .. btime .. nodes N``; they replace ``--nodes``)."""
        tc = self.config.time_control
        if tc.kind == "clock":
            return chess.engine.Limit(
                white_clock=max(clocks[chess.WHITE], 0.001),
                black_clock=max(clocks[chess.BLACK], 0.001),
                white_inc=tc.increment,
                black_inc=tc.increment,
                nodes=spec.nodes,
            )
        if tc.kind == "nodes":
            return chess.engine.Limit(nodes=spec.nodes if spec.nodes is not None else tc.nodes)
        return chess.engine.Limit(time=tc.movetime, nodes=spec.nodes)

    def _guard(self, clock: float) -> float:
        tc = self.config.time_control
        if tc.kind == "clock":
            return max(clock, 0.0) + self.config.guard
        if tc.kind == "movetime":
            return tc.movetime + self.config.guard
        return self.config.nodes_guard

    async def play_game(self, index: int, opening: Opening, engine1_white: bool, engines: tuple) -> GameRecord:
        cfg = self.config
        t_start = time.monotonic()
        e1, e2 = engines
        by_color = {chess.WHITE: e1 if engine1_white else e2, chess.BLACK: e2 if engine1_white else e1}
        white_name = self.names[0] if engine1_white else self.names[1]
        black_name = self.names[1] if engine1_white else self.names[0]
        record = GameRecord(index, opening, engine1_white, white_name, black_name, "*", "", "")

        def finish(result: str, termination: str, reason: str) -> GameRecord:
            record.result, record.termination, record.reason = result, termination, reason
            record.seconds = time.monotonic() - t_start
            return record

        def lose(color: chess.Color, termination: str, reason: str) -> GameRecord:
            return finish("0-1" if color == chess.WHITE else "1-0", termination, reason)

        for color in (chess.WHITE, chess.BLACK):
            error = await by_color[color].new_game()
            if error:
                return lose(color, "abandoned", f"{_side(color)} ({by_color[color].label}) {error}")

        board = opening.board()
        tc = cfg.time_control
        clocks = {chess.WHITE: tc.base or 0.0, chess.BLACK: tc.base or 0.0}
        scores: dict = {chess.WHITE: [], chess.BLACK: []}
        while True:
            outcome = board.outcome(claim_draw=True)
            if outcome is not None:
                reason = outcome.termination.name.lower().replace("_", " ")
                return finish(outcome.result(), "normal", reason)
            if cfg.adjudicate_moves and board.fullmove_number > cfg.adjudicate_moves:
                return finish("1/2-1/2", "adjudication", f"draw by adjudication after {cfg.adjudicate_moves} moves")

            color = board.turn
            engine = by_color[color]
            side = f"{_side(color)} ({engine.label})"
            limit = self._limit(clocks, engine.spec)
            kind, value, elapsed = await engine.play(board, limit, self._guard(clocks[color]))

            if kind == "hang":
                engine.stats.time_forfeits += 1
                overshoot = elapsed - clocks[color] if tc.kind == "clock" else None
                if overshoot is not None:
                    engine.stats.max_overshoot_ms = max(engine.stats.max_overshoot_ms, overshoot * 1000)
                return self._time_loss(board, color, finish, lose, f"{side} did not move within {elapsed:.1f} s and was stopped")
            if kind == "crash":
                engine.stats.crashes += 1
                return lose(color, "abandoned", f"{side} crashed: {value}")
            if kind == "disconnect":
                engine.stats.disconnects += 1
                return lose(color, "abandoned", f"{side} disconnected: {value}")
            if kind == "illegal":
                engine.stats.illegal_moves += 1
                return lose(color, "illegal move", f"{side} sent an illegal move: {value}")

            result: chess.engine.PlayResult = value
            move = result.move
            if move is None or not move or move not in board.legal_moves:
                engine.stats.illegal_moves += 1
                what = "no move" if move is None else f"the null move" if not move else f"illegal move {move.uci()}"
                said = result.info.get("string")  # e.g. lc0's and cyzero's "error: no network loaded: ..."
                return lose(color, "illegal move", f"{side} sent {what}" + (f" ({said})" if said else ""))
            self.has_moved.add(engine.label)

            if tc.kind == "clock":
                clocks[color] -= elapsed
                if clocks[color] < -cfg.time_margin:
                    overshoot = -clocks[color]
                    engine.stats.time_forfeits += 1
                    engine.stats.max_overshoot_ms = max(engine.stats.max_overshoot_ms, overshoot * 1000)
                    return self._time_loss(
                        board, color, finish, lose, f"{side} lost on time ({overshoot * 1000:.0f} ms over)"
                    )
                clocks[color] += tc.increment

            engine.stats.move_seconds.append(elapsed)
            if result.info.get("nodes") is not None:
                engine.stats.move_nodes.append(result.info["nodes"])
            pov = result.info.get("score")
            pov = pov.pov(color) if pov is not None else None
            depth = result.info.get("depth")
            comment = _score_text(pov)
            if comment and depth:
                comment += f"/{depth}"
            comment = f"{comment} {elapsed:.3f}s".strip()
            record.moves.append(move)
            record.comments.append(comment)
            board.push(move)

            if cfg.resign is not None:
                scores[color].append(pov.score(mate_score=MATE_SCORE) if pov is not None else None)
                loser = self._resigns(scores)
                if loser is not None:
                    return lose(loser, "adjudication", f"{_side(loser)} resigns by adjudication")

    def _time_loss(self, board, color, finish, lose, reason):
        if board.has_insufficient_material(not color):
            return finish("1/2-1/2", "time forfeit", f"{reason}; {_side(not color)} cannot mate: draw")
        return lose(color, "time forfeit", reason)

    def _resigns(self, scores: dict) -> Optional[chess.Color]:
        cp, moves = self.config.resign
        for color in (chess.WHITE, chess.BLACK):
            mine, theirs = scores[color][-moves:], scores[not color][-moves:]
            if len(mine) < moves or len(theirs) < moves:
                continue
            if all(s is not None and s <= -cp for s in mine) and all(s is not None and s >= cp for s in theirs):
                return color
        return None

    # ------------------------------------------------------------------ bookkeeping

    def _check_can_play(self, record: GameRecord) -> None:
        """Count a forfeit by an engine that has not moved yet; two of them set ``cannot_play``."""
        if record.termination not in ("illegal move", "abandoned", "time forfeit") or record.result == "1/2-1/2":
            return
        loser = "engine1" if (record.result == "0-1") == record.engine1_white else "engine2"
        if loser in self.has_moved:
            return
        self.failed_starts[loser] += 1
        if self.failed_starts[loser] >= FAILED_STARTS and self.cannot_play is None:
            name = self.names[0 if loser == "engine1" else 1]
            self.cannot_play = (f"{loser} ({name}) lost its first {FAILED_STARTS} games without making a move, "
                                f"so it cannot play; the last: {record.reason}")

    def finished(self, record: GameRecord) -> None:
        self.records[record.index] = record
        self._check_can_play(record)
        s = record.engine1_score()
        self.wld[0 if s == 1.0 else 1 if s == 0.0 else 2] += 1
        test = self.config.sprt
        sprt_text = ""
        if test is not None:
            state = sprt_state(self.records.values(), test)
            lower, upper = test.bounds
            sprt_text = f" | LLR {state['llr']:+.2f} [{lower:+.2f}, {upper:+.2f}]"
            if state["decision"] != "inconclusive":
                self.sprt_decision = state["decision"]
        if self.progress:
            w, l, d = self.wld
            total = self.config.games
            self.progress(
                f"[{len(self.records):>{len(str(total))}}/{total}] game {record.index + 1}: "
                f"{record.white} - {record.black} {record.result} ({record.reason}, "
                f"{len(record.opening.moves) + len(record.moves)} plies, {record.seconds:.1f} s) | "
                f"{self.names[0]} +{w} -{l} ={d}{sprt_text}"
            )
        if self.config.pgn_path:
            with open(self.config.pgn_path, "a", encoding="utf-8") as f:
                while self.next_to_append in self.records:
                    f.write(pgn_text(self.records[self.next_to_append], self.config, self.date))
                    self.next_to_append += 1

    async def run(self) -> MatchResult:
        cfg = self.config
        if cfg.games < 1:
            raise MatchError(f"--games must be 1 or more, got {cfg.games}")
        if cfg.concurrency < 1:
            raise MatchError(f"--concurrency must be 1 or more, got {cfg.concurrency}")
        openings = cfg.openings if cfg.openings is not None else load_openings()
        if not openings:
            raise MatchError("no openings")
        self.seed = cfg.seed if cfg.seed is not None else random.SystemRandom().randrange(2**31)
        schedule = self.schedule(openings, self.seed)
        self.date = datetime.date.today().strftime("%Y.%m.%d")
        workers = min(cfg.concurrency, cfg.games)
        self.t0 = time.monotonic()

        self.pairs = [
            (
                EngineProcess(cfg.engine1, "engine1", self.stats[0], self.note, cfg.handshake_timeout),
                EngineProcess(cfg.engine2, "engine2", self.stats[1], self.note, cfg.handshake_timeout),
            )
            for _ in range(workers)
        ]
        try:
            # Start every process before the first game, so that a bad command fails at once.
            engines = [e for pair in self.pairs for e in pair]
            results = await asyncio.gather(*(e.start() for e in engines), return_exceptions=True)
            errors = [r for r in results if isinstance(r, BaseException)]
            if errors:
                if isinstance(errors[0], MatchError):
                    raise errors[0]
                raise MatchError(f"cannot start the engines: {errors[0]!r}")
            self.names = _display_names(self.pairs[0], cfg)
            if cfg.pgn_path:
                _prepare_output(cfg.pgn_path)
            self.started = True
            queue = list(reversed(schedule))
            tasks: list = []

            def stop() -> None:
                self.stopping = True
                for task in tasks:
                    if task is not asyncio.current_task():
                        task.cancel()

            async def worker(pair):
                while queue and not self.stopping:
                    if cfg.should_stop is not None and cfg.should_stop():
                        return stop()
                    index, opening, engine1_white = queue.pop()
                    self.games_started += 1
                    try:
                        record = await self.play_game(index, opening, engine1_white, pair)
                    except asyncio.CancelledError:
                        if self.stopping:
                            return
                        raise
                    if self.stopping:
                        return
                    self.finished(record)
                    if self.cannot_play is not None:
                        return stop()
                    done = cfg.on_game is not None and cfg.on_game(record)
                    if self.sprt_decision is not None:
                        running = self.games_started - len(self.records)
                        self.note(f"SPRT: {self.sprt_decision} accepted after {len(self.records)} of {cfg.games} games"
                                  + (f"; {running} under way abandoned" if running else ""))
                        done = True
                    if done:
                        return stop()

            async def watch():
                while True:
                    await asyncio.sleep(STOP_POLL)
                    if cfg.should_stop():
                        return stop()

            tasks += [asyncio.ensure_future(worker(pair)) for pair in self.pairs]
            watcher = asyncio.ensure_future(watch()) if cfg.should_stop is not None else None
            try:
                await asyncio.gather(*tasks)
            except asyncio.CancelledError:
                # A worker cancelled before it ever ran ends as cancelled; only a stop of ours is swallowed.
                if not self.stopping or asyncio.current_task().cancelling():
                    raise
                await asyncio.gather(*tasks, return_exceptions=True)
            finally:
                if watcher is not None:
                    watcher.cancel()
        finally:
            await asyncio.gather(*(e.close() for pair in self.pairs for e in pair), return_exceptions=True)
        if self.cannot_play is not None:
            self.result()  # the PGN of the games played, as after any stop
            raise MatchError(self.cannot_play)
        return self.result()

    def result(self) -> MatchResult:
        """The games finished so far; writes the PGN (atomically) when one was asked for."""
        cfg = self.config
        games = [self.records[i] for i in sorted(self.records)]
        if cfg.pgn_path:
            write_pgn(cfg.pgn_path, games, cfg, self.date)
        return MatchResult(
            config=cfg,
            names=self.names,
            games=games,
            stats=self.stats,
            options=(self.pairs[0][0].applied_options, self.pairs[0][1].applied_options),
            seed=self.seed,
            seconds=time.monotonic() - self.t0,
            notes=list(self._notes),
            abandoned=self.games_started - len(games),
        )


def _display_names(pair: tuple, cfg: MatchConfig) -> tuple:
    e1, e2 = pair
    n1 = cfg.engine1.name or e1.id_name or "engine1"
    n2 = cfg.engine2.name or e2.id_name or "engine2"
    if n1 == n2:

        def suffix(engine: EngineProcess) -> str:
            opts = [f"{k}={v}" for k, v in engine.applied_options.items() if k not in ("UCI_LimitStrength",)]
            if engine.spec.nodes is not None:
                opts.append(f"nodes={engine.spec.nodes}")
            return f" ({', '.join(opts)})" if opts else ""

        s1, s2 = suffix(e1), suffix(e2)
        if s1 == s2:
            s1, s2 = " #1", " #2"
        n1, n2 = n1 + s1, n2 + s2
    return n1, n2


def _prepare_output(path: str) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise MatchError(f"cannot write PGN {path!r}: no folder {directory!r}")
    try:
        open(path, "w", encoding="utf-8").close()
    except OSError as e:
        raise MatchError(f"cannot write PGN {path!r}: {e.strerror or e}") from None


class MatchInterrupted(Exception):
    """The match was interrupted (Ctrl-C); ``result`` holds the games finished before, PGN written."""

    def __init__(self, result: MatchResult):
        super().__init__("interrupted")
        self.result = result


def run_match(config: MatchConfig, progress: Optional[Callable[[str], None]] = None) -> MatchResult:
    """Play the match (blocking); ``progress`` gets one line per finished game and per note.

    MatchError when it cannot be played; MatchInterrupted on Ctrl-C once games are under way.
    """
    match = _Match(config, progress)
    try:
        return asyncio.run(match.run())
    except KeyboardInterrupt:
        if not match.started:
            raise
        raise MatchInterrupted(match.result()) from None
