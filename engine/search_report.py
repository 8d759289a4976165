"""What a search reports: the UCI info snapshot (:class:`Info`, one :class:`Line` a MultiPV
move), the result of a move's search (:class:`SearchResult`), and lc0's mappings of the root
value to centipawns and win/draw/loss permille.

Its own module so that the move search (which returns a result) and the UCI
search and protocol (which report info lines) share the types without
importing each other.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

__all__ = ["Info", "Line", "SearchResult", "q_to_cp", "wdl_permille"]


@dataclass
class Line:
    """One root move's line for an info report (MultiPV rank ``multipv``)."""

    multipv: int
    move: str
    pv: list[str]
    visits: int
    q: float                 # W - L for the side to move at the root
    d: float                 # draw probability
    mate: Optional[int]      # moves to mate (negative: we get mated), when proven
    wdl: tuple[int, int, int]  # permille, for the side to move

    @property
    def cp(self) -> int:
        """Centipawns from Q, as lc0 maps them."""
        return q_to_cp(self.q)


@dataclass
class Info:
    """A snapshot of the search for a UCI ``info`` report."""

    depth: int
    seldepth: int
    nodes: int
    nps: int
    time_ms: int
    lines: list[Line]

    def same_search_state(self, other: Optional["Info"]) -> bool:
        """Whether ``other`` reports the same tree (time and speed aside): no need to say it twice."""
        return other is not None and (self.depth, self.seldepth, self.nodes, self.lines) == \
            (other.depth, other.seldepth, other.nodes, other.lines)


@dataclass
class SearchResult:
    """The end of one move's search: the move to play (and to ponder on), the final info, and
    what a training record takes from the root (its visits and value)."""

    best: Optional[str]      # None when the root has no legal move, or when ``error`` is set
    ponder: Optional[str]
    info: Optional[Info]
    error: Optional[str] = None   # the search could not run (no network): say so, play no move
    visits: dict[str, int] = field(default_factory=dict)  # root visits per move: the policy target
    q: float = 0.0           # root value W - L for the side to move
    d: float = 0.0           # root draw probability
    nodes: int = 0           # root visits


def q_to_cp(q: float) -> int:
    """lc0's centipawn mapping of Q (W - L) in [-1, 1]."""
    q = max(-0.9999, min(0.9999, q))
    return int(round(90.0 * math.tan(1.5637541897 * q)))


def wdl_permille(q: float, d: float) -> tuple[int, int, int]:
    """Win/draw/loss in permille (summing to 1000) from Q = W - L and D."""
    d = max(0.0, min(1.0, d))
    w = max(0.0, min(1.0, (1.0 - d + q) / 2.0))
    win = int(round(w * 1000))
    draw = int(round(d * 1000))
    draw = min(draw, 1000 - win)
    return win, draw, 1000 - win - draw
