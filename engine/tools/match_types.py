"""The data of a ``cyzero match``: time controls, openings, engine specs, games, the config, the result.

Shared by the match's modules (:mod:`engine.tools.match_openings`, ``match_engine``,
``match_play``, ``match_pgn``, ``match_summary``); imports none of them.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, field
from typing import Callable, Optional

import chess

from engine.tools.sprt import Sprt

HANDSHAKE_TIMEOUT = 10.0  # default seconds for an engine to start and answer `uci` with `uciok`


class MatchError(Exception):
    """The match cannot be played as asked (bad argument, an engine that cannot start, ...)."""


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
