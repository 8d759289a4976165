"""``cyzero match``: play one UCI engine against another and measure the difference.

Two engine commands (cyzero by default, Debian's ``stockfish`` with
``UCI_LimitStrength``/``UCI_Elo`` as a convenience) play N games through
python-chess's asyncio engine API:

- under a clock (``10+0.1``: base seconds + increment), a fixed number of
  nodes, or a fixed time per move; an engine may also have nodes of its own
  (``--engine1-nodes 1``, cutechess-cli's per-engine ``nodes=``), sent besides the
  clock (``go wtime .. btime .. winc .. binc .. nodes 1``), which is still kept: a
  Maia at one node can play Stockfish on a clock;
- from a bundled set of varied, balanced openings (``engine/tools/openings.txt``),
  each opening played twice with colours reversed, so games come in pairs;
- K games at once (``--concurrency``), each worker with its own two engine
  processes;
- the runner keeps the clocks: it measures the wall time of every move and
  subtracts it; a move that arrives after the clock has run out loses on
  time, and the overshoot is recorded. A hard wall-clock guard per move (the
  time the engine may still use plus ``guard`` seconds) kills an engine that
  hangs, so no engine can hang the match;
- an engine that plays an illegal move, gives no move, hangs, crashes or
  breaks the protocol loses that game; the event is counted per engine, never
  a crash of the runner, and a dead engine is restarted for its next game;
- games end only by the rules (python-chess's outcome, draws claimed at once)
  or by the optional adjudications: a draw after ``adjudicate_moves`` full
  moves, and resignation with ``resign=(CP, MOVES)``;
- a PGN of all games, in game-number order: each game is appended as soon as
  it and every game before it have finished, and the whole file is rewritten
  atomically (temp file, fsync, rename) at the end;
- an optional early end (``MatchConfig.on_game`` / ``should_stop``), which the
  trainer's SPRT gating uses to stop once its test is decided;
- an optional SPRT (``--sprt ELO0,ELO1``, :mod:`engine.tools.sprt`): the GSPRT on the
  pentanomial counts of the finished pairs, after every game; the match stops as soon as it
  accepts H1 (engine1 is ELO1 stronger) or H0 (ELO0), and games under way then are abandoned
  (counted, not scored). When ``games`` runs out first, the test is "inconclusive";
- a summary: W/L/D from engine1's view, score, Elo difference with a 95%
  interval (trinomial model), LOS, failure counts per engine, time taken.

The command-line arguments are defined by :func:`add_parser`; :func:`main` takes
the parsed namespace. :func:`run_match` is the programmatic entry point.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import io
import json
import logging
import math
import os
import random
import re
import shlex
import shutil
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Optional

import chess
import chess.engine
import chess.pgn

from engine.tools.sprt import Sprt, parse_elo_bounds

OPENINGS_PATH = Path(__file__).with_name("openings.txt")
STOCKFISH_FALLBACK = "/usr/games/stockfish"  # Debian installs it outside the usual PATH

HANDSHAKE_TIMEOUT = 10.0  # default seconds for an engine to start and answer `uci` with `uciok`
FAILED_STARTS = 2  # games an engine may lose before its first move in the match; then the match stops
READY_TIMEOUT = 30.0  # seconds to answer `isready` after `ucinewgame`
QUIT_TIMEOUT = 5.0  # seconds to exit after `quit` before it is killed
KILL_WAIT = 5.0  # seconds to wait for a killed engine's last command to finish
STOP_POLL = 0.1  # seconds between two questions to MatchConfig.should_stop

MATE_SCORE = 100_000


class MatchError(Exception):
    """The match cannot be played as asked (bad argument, an engine that cannot start, ...)."""


# --------------------------------------------------------------------------- statistics


def elo_from_score(score: float) -> float:
    """Elo difference for an expected score in [0, 1]: -400 log10(1/score - 1); +-inf at the ends."""
    if score <= 0.0:
        return -math.inf
    if score >= 1.0:
        return math.inf
    return -400.0 * math.log10(1.0 / score - 1.0)


def likelihood_of_superiority(wins: int, losses: int) -> float:
    """LOS = 0.5 (1 + erf((W - L) / sqrt(2 (W + L)))); 0.5 when there are no decisive games."""
    if wins + losses == 0:
        return 0.5
    return 0.5 * (1.0 + math.erf((wins - losses) / math.sqrt(2.0 * (wins + losses))))


@dataclass(frozen=True)
class ScoreStats:
    """Score statistics from one side's view (trinomial model: each game is 1, 1/2 or 0)."""

    wins: int
    losses: int
    draws: int
    games: int
    score: Optional[float]  # mean score per game, None with no games
    stderr: Optional[float]  # standard error of the mean score
    elo: Optional[float]  # may be +-inf
    elo_low: Optional[float]  # 95% interval; bounds outside (0, 1) become -inf / +inf
    elo_high: Optional[float]
    los: float


def score_stats(wins: int, losses: int, draws: int) -> ScoreStats:
    """Mean score, Elo difference with a 95% interval and LOS for W/L/D counts."""
    n = wins + losses + draws
    los = likelihood_of_superiority(wins, losses)
    if n == 0:
        return ScoreStats(wins, losses, draws, 0, None, None, None, None, None, los)
    mu = (wins + 0.5 * draws) / n
    var = (wins * (1.0 - mu) ** 2 + draws * (0.5 - mu) ** 2 + losses * (0.0 - mu) ** 2) / n
    se = math.sqrt(var / n)
    low, high = mu - 1.96 * se, mu + 1.96 * se
    return ScoreStats(
        wins, losses, draws, n, mu, se, elo_from_score(mu), elo_from_score(low), elo_from_score(high), los
    )


@dataclass(frozen=True)
class PairStats:
    """Score statistics over game pairs (pentanomial model).

    Each opening is played twice with colours reversed, so a pair scores 0, 1/2, 1, 3/2 or 2
    for engine 1.  Treating the pair as the unit removes the variance the openings add (one
    side's opening advantage cancels within a pair), so the interval is honest, and usually
    narrower than the trinomial one, which assumes independent games.  A pair with a game
    missing (a match stopped early) is left out.
    """

    counts: tuple  # pairs scoring 0, 1/2, 1, 3/2, 2 for engine 1
    pairs: int
    score: Optional[float]  # mean score per game
    stderr: Optional[float]
    elo: Optional[float]
    elo_low: Optional[float]
    elo_high: Optional[float]


def pair_stats(games: Iterable["GameRecord"]) -> PairStats:
    """Pentanomial counts, mean score and Elo with its 95% interval; games 2k and 2k+1 are a pair."""
    scores: dict[int, list] = {}
    for g in games:
        scores.setdefault(g.index // 2, []).append(g.engine1_score())
    counts = [0] * 5
    for pair in scores.values():
        if len(pair) == 2:
            counts[round(2 * sum(pair))] += 1
    n = sum(counts)
    if n == 0:
        return PairStats(tuple(counts), 0, None, None, None, None, None)
    values = [k / 4 for k in range(5)]  # a pair's mean score per game
    mu = sum(c * v for c, v in zip(counts, values)) / n
    var = sum(c * (v - mu) ** 2 for c, v in zip(counts, values)) / n
    se = math.sqrt(var / n)
    return PairStats(tuple(counts), n, mu, se, elo_from_score(mu), elo_from_score(mu - 1.96 * se),
                     elo_from_score(mu + 1.96 * se))


def sprt_state(games: Iterable["GameRecord"], test: Sprt) -> dict:
    """The SPRT over the finished pairs of ``games`` (pentanomial): its settings, ``llr``, the
    ``lower``/``upper`` bounds, and ``decision``: "H1", "H0" or "inconclusive" (no bound reached)."""
    ps = pair_stats(games)
    value = test.llr_pentanomial(ps.counts)
    lower, upper = test.bounds
    return {
        "elo0": test.elo0,
        "elo1": test.elo1,
        "alpha": test.alpha,
        "beta": test.beta,
        "model": "pentanomial",
        "pairs": ps.pairs,
        "llr": value,
        "lower": lower,
        "upper": upper,
        "decision": test.verdict(value) or "inconclusive",
    }


# --------------------------------------------------------------------------- time controls


@dataclass(frozen=True)
class TimeControl:
    """Exactly one of: a clock (base + increment, seconds), nodes per move, or time per move."""

    base: Optional[float] = None
    increment: float = 0.0
    nodes: Optional[int] = None
    movetime: Optional[float] = None  # seconds

    @classmethod
    def parse(cls, text: str) -> "TimeControl":
        """``10+0.1``, ``60`` or ``1:30+1`` (minutes:seconds): base seconds and increment."""
        m = re.fullmatch(r"\s*(?:(\d+):)?(\d+(?:\.\d*)?|\.\d+)\s*(?:\+\s*(\d+(?:\.\d*)?|\.\d+))?\s*", text)
        if not m:
            raise MatchError(f"time control must look like 10+0.1 (seconds + increment), got {text!r}")
        base = float(m.group(2)) + 60.0 * int(m.group(1) or 0)
        inc = float(m.group(3) or 0.0)
        if base <= 0:
            raise MatchError(f"time control needs a base time above 0, got {text!r}")
        return cls(base=base, increment=inc)

    @property
    def kind(self) -> str:
        return "clock" if self.base is not None else "nodes" if self.nodes is not None else "movetime"

    def __str__(self) -> str:
        if self.base is not None:
            return f"{self.base:g}+{self.increment:g}"
        if self.nodes is not None:
            return f"nodes={self.nodes}"
        return f"movetime={self.movetime * 1000:g}ms"

    def pgn_tag(self) -> str:
        """The PGN TimeControl tag: ``base+inc`` in seconds, ``-`` for node or move-time limits."""
        return f"{self.base:g}+{self.increment:g}" if self.base is not None else "-"


# --------------------------------------------------------------------------- openings


@dataclass(frozen=True)
class Opening:
    """A start position (``fen`` None: the standard one) and the moves played from it."""

    name: str
    eco: str = ""
    fen: Optional[str] = None
    moves: tuple = ()

    def start_board(self) -> chess.Board:
        return chess.Board() if self.fen is None else chess.Board(self.fen)

    def board(self) -> chess.Board:
        """The position the engines start from (moves kept in the move stack)."""
        board = self.start_board()
        for move in self.moves:
            board.push(move)
        return board


_MOVE_NUMBER = re.compile(r"\d+\.(\.\.)?|\d+\.\.\.")


def _parse_san_moves(board: chess.Board, text: str) -> tuple:
    moves = []
    for token in text.split():
        token = _MOVE_NUMBER.sub("", token)
        if not token:
            continue
        moves.append(board.push_san(token))  # raises ValueError for illegal / ambiguous moves
    return tuple(moves)


def parse_openings(text: str, source: str = "<openings>") -> list[Opening]:
    """Openings from text: one a line, ``ECO | name | SAN moves`` or a FEN / EPD position.

    Blank lines and lines starting with ``#`` are skipped. An EPD line may name
    itself with an ``id`` operation. A PGN text (one that has ``[`` tags) is read
    game by game: the FEN tag and the main line of moves.
    """
    if re.search(r"^\s*\[\w+\s+\"", text, re.MULTILINE):
        return _parse_pgn_openings(text, source)
    openings = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        where = f"{source}:{number}"
        try:
            if "|" in line:
                fields = [f.strip() for f in line.split("|")]
                if len(fields) != 3:
                    raise ValueError("expected 'ECO | name | moves'")
                eco, name, moves_text = fields
                board = chess.Board()
                moves = _parse_san_moves(board, moves_text)
                openings.append(Opening(name=name or moves_text, eco=eco, moves=moves))
            else:
                try:
                    board = chess.Board(line)
                    name = line
                except ValueError:
                    board, ops = chess.Board.from_epd(line)
                    name = str(ops.get("id") or board.fen())
                if not board.is_valid():
                    raise ValueError(f"not a valid position: {board.status()!r}")
                openings.append(Opening(name=name, fen=board.fen()))
        except ValueError as e:
            raise MatchError(f"{where}: cannot read opening {line!r}: {e}") from None
    return openings


def _parse_pgn_openings(text: str, source: str) -> list[Opening]:
    openings = []
    stream = io.StringIO(text)
    while True:
        game = chess.pgn.read_game(stream)
        if game is None:
            break
        if game.errors:
            raise MatchError(f"{source}: game {len(openings) + 1}: {game.errors[0]}")
        start = game.board()
        fen = None if start == chess.Board() else start.fen()
        h = game.headers
        name = h.get("Opening") or h.get("Event") or f"{source} #{len(openings) + 1}"
        openings.append(Opening(name=name, eco=h.get("ECO", ""), fen=fen, moves=tuple(game.mainline_moves())))
    return openings


def load_openings(path: Optional[str | os.PathLike] = None) -> list[Opening]:
    """The openings in ``path`` (default: the bundled set); each must leave a game still to play."""
    path = Path(path) if path is not None else OPENINGS_PATH
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise MatchError(f"cannot read openings {str(path)!r}: {e.strerror or e}") from None
    openings = parse_openings(text, str(path))
    if not openings:
        raise MatchError(f"no openings in {str(path)!r}")
    for opening in openings:
        board = opening.board()
        if board.is_game_over(claim_draw=True):
            raise MatchError(f"{str(path)!r}: opening {opening.name!r} is already decided")
    return openings


# --------------------------------------------------------------------------- engines


@dataclass
class EngineSpec:
    """How to start and configure one side of the match."""

    command: list[str]
    options: list[tuple[str, str]] = field(default_factory=list)
    name: Optional[str] = None  # overrides the engine's `id name`
    clamp: frozenset = frozenset()  # spin options clamped into the engine's range instead of refused
    nodes: Optional[int] = None  # its own nodes per move, sent besides the match's limit (replaces --nodes)


@dataclass
class EngineStats:
    """Failure events of one engine over the whole match, and how fast it searched.

    The speed is there because a match at a clock measures the machine too: an engine
    limited by its nodes (cyzero) gains Elo on a faster core where one limited by a set
    strength (Stockfish's ``UCI_Elo``) does not, so figures from two machines compare only
    together with their nodes a move.
    """

    time_forfeits: int = 0
    illegal_moves: int = 0
    crashes: int = 0
    disconnects: int = 0
    restarts: int = 0
    max_overshoot_ms: float = 0.0  # largest time a move arrived after the clock ran out
    move_seconds: list = field(default_factory=list)  # each move's time, as the clock charged it
    move_nodes: list = field(default_factory=list)    # each move's last reported nodes, where it said

    def as_dict(self) -> dict:
        return {
            "time_forfeits": self.time_forfeits,
            "illegal_moves": self.illegal_moves,
            "crashes": self.crashes,
            "disconnects": self.disconnects,
            "restarts": self.restarts,
            "max_overshoot_ms": round(self.max_overshoot_ms, 1),
            "moves": len(self.move_seconds),
            "median_move_seconds": round(statistics.median(self.move_seconds), 4) if self.move_seconds else None,
            "median_move_nodes": statistics.median(self.move_nodes) if self.move_nodes else None,
        }


def stockfish_command() -> str:
    """Debian's stockfish: on PATH, or in /usr/games where Debian puts it."""
    found = shutil.which("stockfish")
    if found:
        return found
    if os.access(STOCKFISH_FALLBACK, os.X_OK):
        return STOCKFISH_FALLBACK
    raise MatchError("stockfish not found on PATH or at /usr/games/stockfish (apt-get install stockfish)")


def default_engine_command() -> list[str]:
    """cyzero: the console script next to the running Python, else ``python -m uci``."""
    script = Path(sys.executable).with_name("cyzero")
    if os.access(script, os.X_OK):
        return [str(script)]
    return [sys.executable, "-m", "uci"]


def parse_command(text: str) -> list[str]:
    """A shell-like command string -> argv; a bare name missing from PATH is looked up in /usr/games."""
    try:
        argv = shlex.split(text)
    except ValueError as e:
        raise MatchError(f"cannot parse engine command {text!r}: {e}") from None
    if not argv:
        raise MatchError("empty engine command")
    if os.sep not in argv[0] and shutil.which(argv[0]) is None:
        games = os.path.join("/usr/games", argv[0])
        if os.access(games, os.X_OK):
            argv[0] = games
    return argv


def parse_option(text: str) -> tuple[str, str]:
    """``NAME=VALUE`` (the name may contain spaces, e.g. ``Move Overhead=100``)."""
    name, sep, value = text.partition("=")
    if not sep or not name.strip():
        raise MatchError(f"engine option must be NAME=VALUE, got {text!r}")
    return name.strip(), value.strip()


_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


class _Engine:
    """One engine process of one worker: start, configure, play moves, restart, close."""

    def __init__(self, spec: EngineSpec, label: str, stats: EngineStats, notes: Callable[[str], None],
                 handshake_timeout: float = HANDSHAKE_TIMEOUT):
        self.spec = spec
        self.label = label
        self.handshake_timeout = handshake_timeout
        self.stats = stats
        self.notes = notes
        self.transport: Optional[asyncio.SubprocessTransport] = None
        self.protocol: Optional[chess.engine.UciProtocol] = None
        self.id_name: Optional[str] = None
        self.applied_options: dict = {}
        self.started_once = False

    @property
    def alive(self) -> bool:
        return self.protocol is not None and not self.protocol.returncode.done()

    def exit_code(self) -> Optional[int]:
        if self.protocol is not None and self.protocol.returncode.done():
            return self.protocol.returncode.result()
        return None

    async def start(self) -> None:
        """Start the process and configure it; MatchError (process cleaned up) when it cannot."""
        await self.kill()
        command = " ".join(shlex.quote(a) for a in self.spec.command)
        try:
            transport, protocol = await chess.engine.UciProtocol.popen(self.spec.command)
        except OSError as e:
            raise MatchError(f"{self.label}: cannot start {command!r}: {e.strerror or e}") from None
        self.transport, self.protocol = transport, protocol
        try:
            await asyncio.wait_for(protocol.initialize(), self.handshake_timeout)
            await self._configure(protocol)
        except asyncio.TimeoutError:
            await self.kill()
            raise MatchError(
                f"{self.label}: {command!r} did not answer `uci` with `uciok` within {self.handshake_timeout:g} s: "
                "is it a UCI engine? (--handshake-timeout S waits longer)"
            ) from None
        except chess.engine.EngineTerminatedError as e:
            await self.kill()
            raise MatchError(f"{self.label}: {command!r} exited during start-up ({e})") from None
        except (chess.engine.EngineError, MatchError) as e:
            await self.kill()
            raise MatchError(str(e) if isinstance(e, MatchError) else f"{self.label}: {command!r}: {e}") from None
        if self.started_once:
            self.stats.restarts += 1
        self.started_once = True
        self.id_name = protocol.id.get("name") or os.path.basename(self.spec.command[0])

    async def _configure(self, protocol: chess.engine.UciProtocol) -> None:
        config: dict = {}
        for name, value in self.spec.options:
            if name not in protocol.options:
                known = ", ".join(sorted(protocol.options)) or "none"
                raise MatchError(f"{self.label}: the engine has no option {name!r} (it has: {known})")
            option = protocol.options[name]
            name = option.name
            if option.type == "check":
                if value.lower() not in _TRUE | _FALSE:
                    raise MatchError(f"{self.label}: option {name} is true or false, got {value!r}")
                config[name] = value.lower() in _TRUE
            elif option.type == "spin":
                try:
                    number = int(value)
                except ValueError:
                    raise MatchError(f"{self.label}: option {name} takes a whole number, got {value!r}") from None
                low = option.min if option.min is not None else number
                high = option.max if option.max is not None else number
                if not low <= number <= high:
                    if name not in self.spec.clamp:
                        raise MatchError(f"{self.label}: option {name}={number} is outside the engine's range {low}..{high}")
                    clamped = min(max(number, low), high)
                    self.notes(f"{self.label}: the engine accepts {name} {low}..{high}; using {clamped} instead of {number}")
                    number = clamped
                config[name] = number
            elif option.type == "button":
                config[name] = None
            else:
                config[name] = value
        try:
            await protocol.configure(config)
        except chess.engine.EngineError as e:
            raise MatchError(f"{self.label}: cannot set options {config}: {e}") from None
        self.applied_options = {k: v for k, v in config.items() if v is not None}

    async def kill(self) -> None:
        """Kill the process (if any) and forget it; a later start() starts a fresh one."""
        transport, self.transport, self.protocol = self.transport, None, None
        if transport is None:
            return
        with contextlib.suppress(Exception):
            transport.kill()
        with contextlib.suppress(Exception):
            transport.close()
        await asyncio.sleep(0)

    async def close(self) -> None:
        """Ask the engine to quit; kill it when it does not."""
        if self.alive:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.protocol.quit(), QUIT_TIMEOUT)
        await self.kill()

    async def new_game(self) -> Optional[str]:
        """Make sure the engine runs and has seen ``ucinewgame``; an error text when it cannot."""
        for _ in range(2):
            if self.protocol is not None and not self.alive:
                self.stats.crashes += 1  # died between games
                await self.kill()
            if self.protocol is None:
                try:
                    await self.start()
                except MatchError as e:
                    self.stats.disconnects += 1
                    return f"could not be started: {e}"
            # ucinewgame and its isready round trip happen before the clock starts
            # (python-chess's play() is then called with game=None, so it does not repeat them).
            try:
                self.protocol.send_line("ucinewgame")
                await asyncio.wait_for(self.protocol.ping(), READY_TIMEOUT)
                return None
            except asyncio.TimeoutError:
                self.stats.disconnects += 1
                await self.kill()
            except chess.engine.EngineError:
                if self.alive:  # otherwise the next round counts the crash
                    self.stats.disconnects += 1
                    await self.kill()
        return "did not answer `isready` after `ucinewgame`"

    async def play(self, board: chess.Board, limit: chess.engine.Limit, guard: float):
        """One move. Returns (kind, value, elapsed seconds): ("move", PlayResult), ("hang", None),
        ("crash", text), ("illegal", text) or ("disconnect", text)."""
        protocol = self.protocol
        if protocol is None:
            return "crash", "the engine is not running", 0.0
        t0 = time.monotonic()
        task = asyncio.ensure_future(
            protocol.play(board, limit, info=chess.engine.INFO_BASIC | chess.engine.INFO_SCORE)
        )
        try:
            done, _ = await asyncio.wait({task}, timeout=guard)
        except asyncio.CancelledError:  # the match is being stopped
            task.cancel()
            task.add_done_callback(lambda t: t.cancelled() or t.exception())
            raise
        elapsed = time.monotonic() - t0
        if not done:
            await self._kill_with_task(task)
            return "hang", None, elapsed
        try:
            return "move", task.result(), elapsed
        except chess.engine.EngineTerminatedError as e:
            code = self.exit_code()
            await self.kill()
            return "crash", f"the engine process died (exit code {code})" if code is not None else str(e), elapsed
        except chess.engine.EngineError as e:
            cause = e.args[0] if e.args else None
            if isinstance(cause, ValueError):  # python-chess could not play the move it sent
                return "illegal", str(cause), elapsed
            await self.kill()
            return "disconnect", f"protocol error: {e}", elapsed

    async def _kill_with_task(self, task: asyncio.Future) -> None:
        transport = self.transport
        if transport is not None:
            with contextlib.suppress(Exception):
                transport.kill()
        # python-chess fails the command once it sees the process exit; retrieve that.
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(task, KILL_WAIT)
        if not task.done():
            task.cancel()
        await self.kill()


# --------------------------------------------------------------------------- games


@dataclass
class GameRecord:
    """One finished game. Colours: ``engine1_white`` says who had White."""

    index: int  # 0-based game number
    opening: Opening
    engine1_white: bool
    white: str
    black: str
    result: str  # "1-0", "0-1", "1/2-1/2"
    termination: str  # PGN Termination: normal, time forfeit, illegal move, abandoned, adjudication
    reason: str  # human words: "checkmate", "White lost on time (0.213 s over)", ...
    moves: list = field(default_factory=list)  # chess.Move played after the opening
    comments: list = field(default_factory=list)  # one per move ("" for none)
    seconds: float = 0.0

    def engine1_score(self) -> float:
        if self.result == "1/2-1/2":
            return 0.5
        white_won = self.result == "1-0"
        return 1.0 if white_won == self.engine1_white else 0.0


@dataclass
class MatchConfig:
    engine1: EngineSpec
    engine2: EngineSpec
    games: int = 20
    time_control: TimeControl = field(default_factory=lambda: TimeControl(base=10.0, increment=0.1))
    concurrency: int = 1
    openings: Optional[list] = None  # list[Opening]; None: the bundled set
    openings_source: str = ""
    pgn_path: Optional[str] = None
    seed: Optional[int] = None
    adjudicate_moves: int = 300  # draw after this many full moves; 0 = never
    resign: Optional[tuple] = None  # (centipawns, moves): both engines agree for MOVES moves each
    time_margin: float = 0.0  # seconds a move may arrive after the clock ran out
    guard: float = 5.0  # hard wall-clock slack per move beyond the time the engine may use
    nodes_guard: float = 60.0  # hard wall-clock limit per move with a nodes limit
    handshake_timeout: float = HANDSHAKE_TIMEOUT  # seconds to start and answer `uci` with `uciok`
    event: str = "cyzero match"
    # Ending a match early (the trainer's SPRT gating): ``on_game`` sees each finished game and
    # ``should_stop`` is asked before each game and every STOP_POLL seconds; either returning True
    # ends the match: no game starts after it, games under way are abandoned (not in the result).
    on_game: Optional[Callable[["GameRecord"], bool]] = None
    should_stop: Optional[Callable[[], bool]] = None
    # Stop as soon as this SPRT decides (pentanomial, over finished pairs), in the same way.
    sprt: Optional[Sprt] = None


@dataclass
class MatchResult:
    config: MatchConfig
    names: tuple  # (engine1 name, engine2 name)
    games: list  # list[GameRecord], in game order
    stats: tuple  # (EngineStats, EngineStats)
    options: tuple  # (dict, dict): options as applied
    seed: int
    seconds: float
    notes: list
    abandoned: int = 0  # games started but not finished: under way when the match was stopped early


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
                _Engine(cfg.engine1, "engine1", self.stats[0], self.note, cfg.handshake_timeout),
                _Engine(cfg.engine2, "engine2", self.stats[1], self.note, cfg.handshake_timeout),
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

        def suffix(engine: _Engine) -> str:
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


# --------------------------------------------------------------------------- PGN


def engine_limit(tc: TimeControl, spec: EngineSpec) -> str:
    """One engine's limit in words: the match's, with its own nodes (``10+0.1, nodes=1``)."""
    if spec.nodes is None:
        return str(tc)
    if tc.kind == "nodes":
        return f"nodes={spec.nodes}"
    return f"{tc}, nodes={spec.nodes}"


def game_to_pgn(record: GameRecord, config: MatchConfig, date: str = "????.??.??") -> chess.pgn.Game:
    game = chess.pgn.Game()
    h = game.headers
    h["Event"] = config.event
    h["Site"] = "cyzero match"
    h["Date"] = date
    h["Round"] = str(record.index + 1)
    h["White"] = record.white
    h["Black"] = record.black
    h["Result"] = record.result
    opening = record.opening
    if opening.fen is not None:
        game.setup(opening.start_board())  # FEN and SetUp tags
    if opening.eco:
        h["ECO"] = opening.eco
    h["Opening"] = opening.name
    h["TimeControl"] = config.time_control.pgn_tag()
    if config.time_control.kind != "clock":
        h["SearchLimit"] = str(config.time_control)
    if config.engine1.nodes is not None or config.engine2.nodes is not None:
        white, black = (config.engine1, config.engine2) if record.engine1_white else (config.engine2, config.engine1)
        h["WhiteSearchLimit"] = engine_limit(config.time_control, white)
        h["BlackSearchLimit"] = engine_limit(config.time_control, black)
    h["Termination"] = record.termination
    h["PlyCount"] = str(len(opening.moves) + len(record.moves))
    node = game
    for move in opening.moves:
        node = node.add_variation(move)
    if opening.moves:
        node.comment = "book"
    for move, comment in zip(record.moves, record.comments):
        node = node.add_variation(move)
        node.comment = comment
    node.comment = f"{node.comment}; {record.reason}" if node.comment else record.reason
    return game


def pgn_text(record: GameRecord, config: MatchConfig, date: str = "????.??.??") -> str:
    exporter = chess.pgn.StringExporter(headers=True, variations=True, comments=True)
    return game_to_pgn(record, config, date).accept(exporter) + "\n\n"


def write_pgn(path: str, games: Iterable[GameRecord], config: MatchConfig, date: str = "????.??.??") -> None:
    """Write all games at once: temp file in the same folder, fsync, rename, fsync the folder."""
    path = os.path.abspath(path)
    directory = os.path.dirname(path)
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            for record in games:
                f.write(pgn_text(record, config, date))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


# --------------------------------------------------------------------------- summary


def _finite(x: Optional[float], digits: int = 1) -> Optional[float]:
    return None if x is None or math.isinf(x) or math.isnan(x) else round(x, digits)


def interval_too_small(stats: "ScoreStats | PairStats") -> bool:
    """Whether the sample is too small for the normal approximation's 95% interval to mean anything:
    every game (or pair) scored the same (a zero-width interval: 2-0 gave [+inf, +inf], ten draws
    [0, 0]), or a bound falls outside the possible scores (-inf / +inf Elo)."""
    if stats.score is None:
        return False
    bounds = (stats.elo_low, stats.elo_high)
    return not stats.stderr or any(b is None or math.isinf(b) or math.isnan(b) for b in bounds)


def _ci95(stats: "ScoreStats | PairStats") -> list:
    """The 95% interval's bounds for JSON: both null when the sample is too small for one."""
    if interval_too_small(stats):
        return [None, None]
    return [_finite(stats.elo_low), _finite(stats.elo_high)]


def summary(result: MatchResult) -> dict:
    """All the numbers of a match as one JSON-ready dict (infinite Elo values are null)."""
    games = result.games
    w = sum(1 for g in games if g.engine1_score() == 1.0)
    l = sum(1 for g in games if g.engine1_score() == 0.0)
    d = len(games) - w - l
    st = score_stats(w, l, d)
    ps = pair_stats(games)

    def colour(white: bool) -> dict:
        sub = [g for g in games if g.engine1_white == white]
        return {
            "wins": sum(1 for g in sub if g.engine1_score() == 1.0),
            "losses": sum(1 for g in sub if g.engine1_score() == 0.0),
            "draws": sum(1 for g in sub if g.engine1_score() == 0.5),
        }

    terminations: dict = {}
    for g in games:
        terminations[g.termination] = terminations.get(g.termination, 0) + 1
    engines = []
    for i, spec in enumerate((result.config.engine1, result.config.engine2)):
        engines.append(
            {
                "name": result.names[i],
                "command": spec.command,
                "options": {k: v for k, v in result.options[i].items()},
                "nodes": spec.nodes,
                "limit": engine_limit(result.config.time_control, spec),
                **result.stats[i].as_dict(),
            }
        )
    cfg = result.config
    return {
        "engine1": engines[0],
        "engine2": engines[1],
        "games": len(games),
        "games_scheduled": cfg.games,
        "games_abandoned": result.abandoned,
        "wins": w,
        "losses": l,
        "draws": d,
        "score": None if st.score is None else round(st.score, 4),
        "score_pct": None if st.score is None else round(100 * st.score, 2),
        "elo": _finite(st.elo),
        "elo_ci95": _ci95(st),       # null bounds: the sample is too small for an interval
        "elo_infinite": None if st.elo is None or not math.isinf(st.elo) else ("+inf" if st.elo > 0 else "-inf"),
        "los": round(st.los, 4),
        "pairs": ps.pairs,
        "pentanomial": list(ps.counts),
        "pair_elo": _finite(ps.elo),
        "pair_elo_ci95": _ci95(ps),
        "engine1_white": colour(True),
        "engine1_black": colour(False),
        "terminations": terminations,
        "time_control": str(cfg.time_control),
        "concurrency": cfg.concurrency,
        "openings": cfg.openings_source or str(OPENINGS_PATH),
        "seed": result.seed,
        "pgn": cfg.pgn_path,
        "total_seconds": round(result.seconds, 2),
        "notes": result.notes,
        "sprt": None if cfg.sprt is None else sprt_state(games, cfg.sprt),
    }


def _elo_text(x: Optional[float]) -> str:
    if x is None:
        return "?"
    if math.isinf(x):
        return "+inf" if x > 0 else "-inf"
    return f"{x:+.1f}"


def _interval_text(stats: "ScoreStats | PairStats", unit: str) -> str:
    """``95% interval [low, high]``, or why there is none yet."""
    count = stats.games if isinstance(stats, ScoreStats) else stats.pairs
    if stats.score is None:
        return f"95% interval: none (no {unit}s)"
    if interval_too_small(stats):
        same = " that all scored the same" if not stats.stderr and count > 1 else ""
        return f"95% interval: sample too small ({count} {unit}{'s' if count != 1 else ''}{same})"
    return f"95% interval [{_elo_text(stats.elo_low)}, {_elo_text(stats.elo_high)}]"


def _sprt_text(sprt: dict, name1: str, s: dict) -> str:
    """The SPRT line of the summary: its test, LLR, bounds, decision and where the match stopped."""
    elo0, elo1 = _elo_text(sprt["elo0"]), _elo_text(sprt["elo1"])
    head = (f"SPRT [{elo0}, {elo1}] (alpha {sprt['alpha']:g}, beta {sprt['beta']:g}), pentanomial over "
            f"{sprt['pairs']} pairs: LLR {sprt['llr']:+.2f} in [{sprt['lower']:+.2f}, {sprt['upper']:+.2f}]: ")
    played = f"{s['games']} of {s['games_scheduled']} games played"
    if s["games_abandoned"]:
        played += f", {s['games_abandoned']} under way abandoned"
    decision = sprt["decision"]
    if decision == "inconclusive":
        return head + f"inconclusive ({played})"
    accepted, rejected = (elo1, elo0) if decision == "H1" else (elo0, elo1)
    return head + f"{decision} accepted, {name1} is {accepted} Elo rather than {rejected} ({played})"


def _speed_text(engine: dict) -> str:
    """One engine's median nodes and time a move, for comparing matches across machines."""
    if not engine["moves"]:
        return "no moves"
    nodes = engine["median_move_nodes"]
    said = "nodes not reported" if nodes is None else f"{nodes:,.0f} nodes"
    return f"{said} in {engine['median_move_seconds']:.3f} s"


def format_summary(result: MatchResult) -> str:
    s = summary(result)
    games = result.games
    w, l, d = s["wins"], s["losses"], s["draws"]
    st = score_stats(w, l, d)
    ps = pair_stats(games)
    n1, n2 = result.names
    width = max(len(n1), len(n2), 6)
    lines = [
        f"{n1} vs {n2}: {s['games']} games, {s['time_control']}, concurrency {s['concurrency']}, "
        f"openings {os.path.basename(s['openings'])} (seed {s['seed']})",
    ]
    if s["engine1"]["nodes"] is not None or s["engine2"]["nodes"] is not None:
        lines.append(f"limits: {n1} {s['engine1']['limit']}; {n2} {s['engine2']['limit']}")
    lines += [
        "",
        f"{'engine':<{width}}  {'wins':>5} {'losses':>6} {'draws':>5} {'score':>7}",
    ]
    for name, (ww, ll) in ((n1, (w, l)), (n2, (l, w))):
        pct = "?" if not games else f"{100 * (ww + 0.5 * d) / len(games):.1f}%"
        lines.append(f"{name:<{width}}  {ww:>5} {ll:>6} {d:>5} {pct:>7}")
    lines += [
        "",
        f"Elo difference ({n1} - {n2}): {_elo_text(st.elo)}, {_interval_text(st, 'game')}; "
        f"LOS {100 * st.los:.1f}%",
        f"pairs (same opening, colours reversed): {ps.pairs}, pentanomial 0/0.5/1/1.5/2 "
        f"{' '.join(str(c) for c in ps.counts)}; Elo from pairs {_elo_text(ps.elo)}, "
        f"{_interval_text(ps, 'pair')}",
        f"{n1} as White: +{s['engine1_white']['wins']} -{s['engine1_white']['losses']} ={s['engine1_white']['draws']}; "
        f"as Black: +{s['engine1_black']['wins']} -{s['engine1_black']['losses']} ={s['engine1_black']['draws']}",
        "",
        f"{'failures':<{width}}  {'time forfeits':>13} {'illegal moves':>13} {'crashes':>7} {'disconnects':>11} {'restarts':>8}",
    ]
    for name, e in ((n1, s["engine1"]), (n2, s["engine2"])):
        over = f"   (worst overshoot {e['max_overshoot_ms']:.0f} ms)" if e["max_overshoot_ms"] else ""
        lines.append(
            f"{name:<{width}}  {e['time_forfeits']:>13} {e['illegal_moves']:>13} {e['crashes']:>7} "
            f"{e['disconnects']:>11} {e['restarts']:>8}{over}"
        )
    lines += ["", "speed (median a move): " + "; ".join(
        f"{name} {_speed_text(e)}" for name, e in ((n1, s["engine1"]), (n2, s["engine2"])))]
    sprt = s["sprt"]
    if sprt is not None:
        lines += ["", _sprt_text(sprt, n1, s)]
    terms = ", ".join(f"{k} {v}" for k, v in sorted(s["terminations"].items())) or "none"
    lines += ["", f"terminations: {terms}", f"total time {s['total_seconds']:.1f} s"]
    if s["pgn"]:
        lines.append(f"PGN: {s['pgn']}")
    return "\n".join(lines)


# --------------------------------------------------------------------------- command line


def parse_resign(text: Optional[str]) -> Optional[tuple]:
    if text is None:
        return None
    m = re.fullmatch(r"\s*(\d+)\s*:\s*(\d+)\s*", text)
    if not m or int(m.group(2)) < 1:
        raise MatchError(f"--resign takes CP:MOVES (e.g. 600:4), got {text!r}")
    return int(m.group(1)), int(m.group(2))


def config_from_args(args: argparse.Namespace) -> MatchConfig:
    """The match :func:`add_parser` parsed; MatchError for arguments that make no sense."""
    e1_command = parse_command(args.engine1) if args.engine1 else default_engine_command()
    e1 = EngineSpec(e1_command, [parse_option(o) for o in args.engine1_option or []], args.engine1_name,
                    nodes=args.engine1_nodes)
    if args.engine2:
        e2_command = parse_command(args.engine2)
    elif args.stockfish_elo is not None:
        e2_command = [stockfish_command()]
    else:
        raise MatchError("give the opponent with --engine2 CMD or --stockfish-elo ELO")
    e2_options = [parse_option(o) for o in args.engine2_option or []]
    clamp = frozenset()
    if args.stockfish_elo is not None:
        e2_options += [("UCI_LimitStrength", "true"), ("UCI_Elo", str(args.stockfish_elo))]
        clamp = frozenset({"UCI_Elo"})
    e2 = EngineSpec(e2_command, e2_options, args.engine2_name, clamp, nodes=args.engine2_nodes)

    if args.nodes is not None:
        if args.nodes < 1:
            raise MatchError(f"--nodes must be 1 or more, got {args.nodes}")
        tc = TimeControl(nodes=args.nodes)
    elif args.movetime is not None:
        if args.movetime <= 0:
            raise MatchError(f"--movetime must be above 0 ms, got {args.movetime}")
        tc = TimeControl(movetime=args.movetime / 1000.0)
    else:
        tc = TimeControl.parse(args.tc)
    for name in ("guard", "nodes_guard", "time_margin"):
        if getattr(args, name) < 0:
            raise MatchError(f"--{name.replace('_', '-')} must be 0 or more")
    if not args.handshake_timeout > 0:
        raise MatchError(f"--handshake-timeout must be above 0 seconds, got {args.handshake_timeout:g}")
    if args.adjudicate_moves < 0:
        raise MatchError("--adjudicate-moves must be 0 (never) or more")
    sprt = None
    if args.sprt is not None:
        elo0, elo1 = args.sprt
        alpha = args.sprt_alpha if args.sprt_alpha is not None else 0.05
        beta = args.sprt_beta if args.sprt_beta is not None else 0.05
        sprt = Sprt(elo0, elo1, alpha, beta)
    elif args.sprt_alpha is not None or args.sprt_beta is not None:
        raise MatchError("--sprt-alpha and --sprt-beta need --sprt ELO0,ELO1")
    openings = load_openings(args.openings) if args.openings else load_openings()
    return MatchConfig(
        engine1=e1,
        engine2=e2,
        games=args.games,
        time_control=tc,
        concurrency=args.concurrency,
        openings=openings,
        openings_source=str(args.openings or OPENINGS_PATH),
        pgn_path=args.pgn,
        seed=args.seed,
        adjudicate_moves=args.adjudicate_moves,
        resign=parse_resign(args.resign),
        time_margin=args.time_margin / 1000.0,
        guard=args.guard,
        nodes_guard=args.nodes_guard,
        handshake_timeout=args.handshake_timeout,
        event=args.event,
        sprt=sprt,
    )


class _QuietInfoLines(logging.Filter):
    """Drop python-chess's warnings about ``info`` lines an engine sends outside a search
    (e.g. ``info string`` while it starts or answers ``isready``): they are legal UCI."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Unexpected engine output: 'info" not in record.getMessage()


def _sprt_elos(text: str) -> tuple:
    """argparse type of --sprt: ``ELO0,ELO1``."""
    try:
        return parse_elo_bounds(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _sprt_rate(text: str) -> float:
    """argparse type of --sprt-alpha / --sprt-beta: a probability above 0 and below 0.5."""
    try:
        rate = float(text)
    except ValueError:
        rate = math.nan
    if not 0.0 < rate < 0.5:
        raise argparse.ArgumentTypeError(f"must be a probability above 0 and below 0.5 (e.g. 0.05), got {text!r}")
    return rate


def _engine_nodes(text: str) -> int:
    """argparse type of --engine1-nodes / --engine2-nodes: a whole number of nodes, 1 or more."""
    try:
        nodes = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number of nodes, 1 or more, got {text!r}") from None
    if nodes < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of nodes, 1 or more, got {text!r}")
    return nodes


def add_parser(commands) -> argparse.ArgumentParser:
    match = commands.add_parser(
        "match",
        help="play one UCI engine against another",
        description="Play two UCI engines against each other (engine1 is cyzero unless given): "
        "openings from a bundled balanced set, each played twice with colours reversed; "
        "prints W/L/D from engine1's view, the Elo difference with a 95% interval, LOS, "
        "and time forfeits, illegal moves and crashes per engine. Progress goes to stderr.",
    )
    for n in (1, 2):
        default = "cyzero (the console script next to this Python, or `python -m uci`)" if n == 1 else None
        match.add_argument(
            f"--engine{n}",
            metavar="CMD",
            help=f"engine {n}'s command line, split like a shell does"
            + (f"; default: {default}" if default else "; or use --stockfish-elo"),
        )
        match.add_argument(
            f"--engine{n}-option",
            action="append",
            metavar="NAME=VALUE",
            help=f"set a UCI option of engine {n} (repeatable)",
        )
        match.add_argument(f"--engine{n}-name", metavar="NAME", help=f"engine {n}'s name (default: its `id name`)")
        match.add_argument(
            f"--engine{n}-nodes",
            type=_engine_nodes,
            metavar="N",
            help=f"engine {n}'s own nodes per move, as cutechess-cli's per-engine nodes=N: its `go` "
            "carries `nodes N` besides the clock or --movetime (`go wtime .. btime .. nodes N`), "
            "whose time is still kept and can still run out; with --nodes it replaces that for "
            f"engine {n}. E.g. a Maia network at one node (--engine{n}-option WeightsFile=maia-1100.pb.gz "
            f"--engine{n}-nodes 1) against Stockfish on a clock",
        )
    match.add_argument(
        "--stockfish-elo",
        type=int,
        metavar="ELO",
        help="engine2 is Debian's stockfish (unless --engine2 is given) with UCI_LimitStrength "
        "and this UCI_Elo, clamped into the range the installed stockfish accepts. At fast time "
        "controls also give it --engine2-option 'Move Overhead=100': Stockfish 15.1 at limited "
        "strength can overrun a clock of a fraction of a second",
    )
    match.add_argument("--games", type=int, default=20, metavar="N",
                       help="games to play (default 20); with --sprt, the most it plays")
    match.add_argument(
        "--sprt",
        type=_sprt_elos,
        metavar="ELO0,ELO1",
        help="stop as soon as a sequential probability ratio test (GSPRT, logistic Elo, pentanomial "
        "over the finished pairs) decides between H0: engine1 is ELO0 Elo stronger and H1: it is "
        "ELO1 stronger (e.g. 0,10; a negative ELO0 is written --sprt=-5,5); if --games runs out "
        "first the result is inconclusive. With --concurrency, games under way when it decides "
        "are abandoned",
    )
    match.add_argument("--sprt-alpha", type=_sprt_rate, metavar="P",
                       help="the SPRT's chance of accepting H1 when H0 holds (default 0.05)")
    match.add_argument("--sprt-beta", type=_sprt_rate, metavar="P",
                       help="the SPRT's chance of accepting H0 when H1 holds (default 0.05)")
    limit = match.add_mutually_exclusive_group()
    limit.add_argument(
        "--tc", default="10+0.1", metavar="BASE+INC", help="clock: base seconds + increment (default 10+0.1)"
    )
    limit.add_argument("--nodes", type=int, metavar="N", help="fixed nodes per move instead of a clock")
    limit.add_argument("--movetime", type=float, metavar="MS", help="fixed time per move instead of a clock")
    match.add_argument("--concurrency", type=int, default=1, metavar="K", help="games at once (default 1)")
    match.add_argument("--openings", metavar="FILE", help="openings: 'ECO | name | moves' lines, FEN/EPD lines or PGN")
    match.add_argument("--pgn", metavar="OUT.pgn", help="write the games here")
    match.add_argument("--seed", type=int, metavar="S", help="seed for the order of the openings (default: random)")
    match.add_argument(
        "--adjudicate-moves",
        type=int,
        default=300,
        metavar="N",
        help="draw after N full moves (default 300; 0: never)",
    )
    match.add_argument(
        "--resign",
        metavar="CP:MOVES",
        help="adjudicate a loss when, for MOVES moves each, the loser's score is -CP or worse "
        "and the winner's +CP or better (default: off)",
    )
    match.add_argument(
        "--time-margin",
        type=float,
        default=0.0,
        metavar="MS",
        help="how late a move may arrive after the clock ran out (default 0)",
    )
    match.add_argument(
        "--guard",
        type=float,
        default=5.0,
        metavar="S",
        help="a move not made within the rest of the clock (or --movetime) plus S seconds is "
        "stopped and loses on time (default 5)",
    )
    match.add_argument(
        "--nodes-guard",
        type=float,
        default=60.0,
        metavar="S",
        help="with --nodes (and no clock or --movetime), a move not made within S seconds is stopped "
        "and loses on time (default 60)",
    )
    match.add_argument(
        "--handshake-timeout",
        type=float,
        default=HANDSHAKE_TIMEOUT,
        metavar="S",
        help=f"an engine that does not answer `uci` with `uciok` within S seconds of starting is "
        f"not a UCI engine: the match stops with an error (default {HANDSHAKE_TIMEOUT:g})",
    )
    match.add_argument("--event", default="cyzero match", help="the PGN Event tag")
    match.add_argument("--json", action="store_true", help="print one JSON object on stdout and nothing else")
    match.set_defaults(func=main)
    return match


def main(args: argparse.Namespace) -> int:
    """``cyzero match``: play, print the summary (or one JSON object with --json)."""

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    quiet = _QuietInfoLines()
    logger = logging.getLogger("chess.engine")
    logger.addFilter(quiet)
    status = 0
    try:
        config = config_from_args(args)
        result = run_match(config, progress)
    except MatchError as e:
        print(f"cyzero match: {e}", file=sys.stderr)
        return 2
    except MatchInterrupted as e:
        progress(f"cyzero match: interrupted after {len(e.result.games)} of {e.result.config.games} games")
        result, status = e.result, 130
    finally:
        logger.removeFilter(quiet)
    if args.json:
        data = summary(result)
        data["interrupted"] = status != 0
        print(json.dumps(data))
    else:
        print(format_summary(result))
    return status
