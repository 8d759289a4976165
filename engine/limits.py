"""The limits of one search: what ``go`` asked for, and what time management allows.

:class:`GoParams` is lc0's plain struct of optional ``go`` fields (the UCI
parser fills it; self-play fills it too). :class:`Budget` is what
:mod:`engine.timeman` turns it into and what :mod:`engine.search` obeys. Both
modules import them from here, so neither imports the other.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Optional

__all__ = ["Budget", "GoParams"]


@dataclass
class GoParams:
    """The limits of one ``go`` command; ``None`` means not given."""

    wtime: Optional[int] = None        # ms on white's clock
    btime: Optional[int] = None        # ms on black's clock
    winc: Optional[int] = None         # ms increment per move
    binc: Optional[int] = None
    movestogo: Optional[int] = None    # moves to the next time control
    movetime: Optional[int] = None     # ms for this move exactly
    nodes: Optional[int] = None        # root visits to reach
    depth: Optional[int] = None        # average depth, as lc0 defines it
    mate: Optional[int] = None         # stop once a mate in this many moves is proven
    infinite: bool = False             # search until stop
    ponder: bool = False               # pondering: search until ponderhit or stop
    searchmoves: list[str] = field(default_factory=list)  # restrict the root to these UCI moves

    def with_node_cap(self, cap: int) -> "GoParams":
        """This ``go`` under a standing cap of ``cap`` nodes per move (UCI ``NodesPerMove``; 0: none).

        The one place of the rule. A cap caps: ``go nodes N`` searches ``min(N, cap)``; every
        other ``go`` (a clock, ``movetime``, ``depth``, ``mate``, a bare ``go``) gets ``nodes
        cap`` besides its own limits and stops at whichever comes first, so a clock is never
        spent past the cap. ``go ponder`` is capped too: a capped engine's move after
        ``ponderhit`` must come from as many nodes as any other (a Maia at one node pondering
        on would play stronger than its rating band). Only ``go infinite`` is not: it is an
        analysis the user asked to run until ``stop``, not a move of a game.
        """
        if not cap or self.infinite:
            return self
        return replace(self, nodes=cap if self.nodes is None else min(self.nodes, cap))


@dataclass(frozen=True)
class Budget:
    """How long one search may run, and its other limits.

    ``soft_ms``/``hard_ms`` are ``None`` exactly when ``infinite`` is true.
    ``banked_ms`` is the part of ``soft_ms`` that is time saved on earlier
    moves; ``clock`` tells whether the budget came from the game clock (only
    those take part in the savings).
    """

    soft_ms: Optional[int]          # target: stop here (or earlier, smart pruning)
    hard_ms: Optional[int]          # cap: never run past it
    infinite: bool = False          # no time limit at all
    until_stop: bool = False        # go infinite / go ponder: never end by itself
    nodes: Optional[int] = None
    depth: Optional[int] = None
    mate: Optional[int] = None
    banked_ms: int = 0
    clock: bool = False

    def __post_init__(self) -> None:
        if self.infinite != (self.soft_ms is None) or self.infinite != (self.hard_ms is None):
            raise ValueError("a Budget has both soft_ms and hard_ms exactly when it is not infinite")
        if not self.infinite and not 0 <= self.soft_ms <= self.hard_ms:
            raise ValueError(f"need 0 <= soft_ms <= hard_ms, got {self.soft_ms}, {self.hard_ms}")

    @property
    def immediate(self) -> bool:
        """True when the engine must play at once (after one minimal evaluation)."""
        return self.hard_ms == 0

    def soft_deadline(self, start: float) -> Optional[float]:
        """The soft target as a :func:`time.monotonic` value, for a search started at ``start``."""
        return None if self.soft_ms is None else start + self.soft_ms / 1000.0

    def hard_deadline(self, start: float) -> Optional[float]:
        """The hard cap as a :func:`time.monotonic` value, for a search started at ``start``."""
        return None if self.hard_ms is None else start + self.hard_ms / 1000.0
