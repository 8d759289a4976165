"""Time management: how long one ``go`` may think.

:class:`TimeManager` turns a :class:`~engine.limits.GoParams` into a
:class:`~engine.limits.Budget`: a *soft* target and a *hard* cap in milliseconds (or no time
limit at all), plus the ``nodes``/``depth``/``mate`` limits copied for the
search loop. It never reads a clock itself; the search measures elapsed time
with :func:`time.monotonic` from the moment it starts (or from ``ponderhit``)
and reports the time it used back through :meth:`TimeManager.record`.

Contract with the search loop
-----------------------------

* Never run past ``hard_ms``: check it every round, and let the watchdog that
  answers ``stop`` also fire at the hard deadline, so that a batch in flight
  never delays the best move.
* Stop at ``soft_ms``, or earlier when smart pruning shows that no other move
  can overtake the best one before ``soft_ms``. Going on past ``soft_ms``
  (up to ``hard_ms``) is allowed only while the best move is unstable: the
  time extension (``SearchParams.time_extension``, UCI ``TimeExtension``,
  on by default) goes on, as lc0 thinks longer, while another root move has
  a better value (Q) than the most visited one on at least 10 % of its
  visits, or while the most visited move changed within the last 10 % of
  ``soft_ms``; while it is unstable, smart pruning looks as far as
  ``hard_ms``. ``engine.move_search.MoveSearch.should_stop`` applies these rules.
  A movetime budget has ``soft_ms == hard_ms``: nothing to extend.
* ``hard_ms == 0`` (see :attr:`Budget.immediate`) means "play at once": the
  search returns after its first minimal evaluation (or the first legal move
  if even that is not possible). Zero, tiny and negative clocks give this.
* ``infinite`` means there is no time limit; ``until_stop`` (``go infinite``,
  ``go ponder``) means the search must not end by itself either: the best
  move is reported only after ``stop`` or ``ponderhit``, even if a nodes,
  depth or mate limit was reached or the tree was solved.
* At ``ponderhit`` the ponder search goes on as a timed search with the same
  :class:`GoParams`: call :meth:`TimeManager.ponderhit_budget` and measure
  the deadlines from the ``ponderhit`` (the clock times in a ``go ponder``
  are the times at which our own clock starts, i.e. at ``ponderhit``).

Formulas (all times in ms; inputs are ints, negative values count as 0)
----------------------------------------------------------------------

``O`` is the Move Overhead (network and GUI lag, charged by the clock on
every move), ``S`` is ``safety_ms`` (our own delay from the hard deadline to
the ``bestmove`` line leaving the process). Results are rounded down.

``go movetime N``::

    soft = hard = max(0, N - O - S)

With Move Overhead 0 and the default ``S = 5``, ``go movetime N`` stops at
``N - 5`` and answers well inside ``N + 20``.

Clock (``wtime``/``btime`` with ``winc``/``binc`` and ``movestogo``): ``T`` is
our remaining time, ``I`` our increment, ``M`` the moves to plan for::

    avail = T - O - S                 # the most one move can take without flagging
    if avail <= 0: soft = hard = 0    # play at once
    M     = min(movestogo, moves_left(ply))   # movestogo <= 0 is ignored
    R     = movestogo if given, else M        # moves whose lag the clock must still pay
    spend = min(saved, bank_fraction * avail) # time saved earlier, spent now
    plan  = max(0, (T - spend + I*(M-1)) / M - O - S)
    soft  = slowmover * plan + spend
    hard  = max(0, min(hard_ratio * soft,  f(M) * avail,  avail - (R-1) * max(0, O + S + 1 - I)))
    soft  = min(soft, hard)
    f(M)  = max_move_fraction + (last_move_fraction - max_move_fraction) / M

``moves_left`` is lc0's log-logistic estimate of the moves still to play
(median game length ``midpoint`` = 51.5 moves, ``steepness`` = 7: 51.5 at the
start, about 31 at move 20, about 14 at move 40), but never below
``min_moves_left`` = 20: lc0's curve bottoms out near 8 moves, which in sudden
death spends the clock too fast for a long endgame (Stockfish plans with a
horizon of about 20 moves late in the game, too). ``ply`` ``None`` counts as
the start of the game (the most moves left, so the smallest budget).

The caps on ``hard``:

* ``hard_ratio * soft`` (3x): room for the time extension.
* ``f(M) * avail``: one move never takes more than 30 % of the clock, plus a
  share that grows as the time control nears; with ``movestogo`` = 1,
  ``f(1)`` = 0.9, so the move may use most, but never all, of the clock.
  Every move leaves ``T - hard - O - S >= (1 - f(M)) * avail > 0``: as long
  as the real lag stays within ``O + S``, no move is lost on time.
* ``avail - (R-1) * max(0, O + S + 1 - I)``: the clock keeps the lag (+1 ms)
  of every move still to come before the control, less their increments.
  With a known ``movestogo`` the control is therefore reached even if every
  move runs to its hard cap, whenever that is possible at all
  (``T >= R * (O + S + 1)`` without increment); when it is not, the move is
  played at once. In sudden death without increment no budget can promise
  that for ever: a fixed lag per move ends any clock after enough moves.

Both budgets grow (never shrink) with more time ``T`` or a larger increment
``I``.

Saved time (lc0's "piggy bank", ``ImmediateTimeUse`` = 1): a clock-timed move
that stops before its ``soft`` target (smart pruning, a forced move) saves
``soft - used``; one that runs past ``soft`` (unstable best move) pays the
excess back. The balance ``saved_ms`` is spent on the next clock-timed move
on top of its share of the clock, at most ``bank_fraction`` (10 %) of the
available time per move, and taken out of the time that is planned over the
remaining moves, so nothing is counted twice (the saved time is on the clock
already). ``movetime``, infinite and ponder searches neither add to nor take
from it. :meth:`TimeManager.reset` (``ucinewgame``) empties it.

The opponent's clock is not used for budgeting (as in lc0): MCTS has no use
for it. It is used only as a stand-in when a ``go`` names the opponent's
clock but not ours (a broken GUI), so that a timed game never becomes an
endless search.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Optional

from engine.limits import Budget, GoParams
from engine.params import SearchParams

__all__ = ["TimeManager", "estimated_moves_left"]

DEFAULT_MOVE_OVERHEAD_MS = SearchParams.row("move_overhead_ms").default


def estimated_moves_left(ply: int, midpoint: float = 51.5, steepness: float = 7.0) -> float:
    """Median number of moves (per side) still to be played after ``ply`` half-moves.

    lc0's time curve: game lengths follow a log-logistic distribution, and
    this is its median residual life, ``midpoint * (1 + 2 * (m /
    midpoint) ** steepness) ** (1 / steepness) - m`` with ``m = ply / 2``.
    """
    move = max(0, ply) / 2.0
    return midpoint * (1.0 + 2.0 * (move / midpoint) ** steepness) ** (1.0 / steepness) - move


def _nonneg(value: Optional[float]) -> Optional[int]:
    """A ``go`` number as an int; negative counts as 0, ``None`` stays ``None``."""
    return None if value is None else max(0, int(value))


class TimeManager:
    """Budgets each move of a game; one instance per engine (per game in play).

    ``budget`` only reads the state; ``record`` (after each move) and
    ``reset`` (new game) change it. Use it from one thread at a time.
    """

    def __init__(
        self,
        move_overhead_ms: int = DEFAULT_MOVE_OVERHEAD_MS,
        slowmover: float = 1.0,
        *,
        safety_ms: int = 5,
        hard_ratio: float = 3.0,
        max_move_fraction: float = 0.3,
        last_move_fraction: float = 0.9,
        bank_fraction: float = 0.1,
        midpoint: float = 51.5,
        steepness: float = 7.0,
        min_moves_left: float = 20.0,
    ) -> None:
        if move_overhead_ms < 0 or safety_ms < 0:
            raise ValueError("move_overhead_ms and safety_ms must be >= 0")
        if not slowmover > 0:
            raise ValueError(f"slowmover must be > 0, got {slowmover}")
        if not hard_ratio >= 1:
            raise ValueError(f"hard_ratio must be >= 1, got {hard_ratio}")
        if not 0 < max_move_fraction <= last_move_fraction < 1:
            raise ValueError("need 0 < max_move_fraction <= last_move_fraction < 1")
        if not 0 <= bank_fraction < 1:
            raise ValueError(f"bank_fraction must be in [0, 1), got {bank_fraction}")
        if not (midpoint > 0 and steepness > 0 and min_moves_left >= 1):
            raise ValueError("need midpoint > 0, steepness > 0 and min_moves_left >= 1")
        self.move_overhead_ms = int(move_overhead_ms)
        self.slowmover = float(slowmover)
        self.safety_ms = int(safety_ms)
        self.hard_ratio = float(hard_ratio)
        self.max_move_fraction = float(max_move_fraction)
        self.last_move_fraction = float(last_move_fraction)
        self.bank_fraction = float(bank_fraction)
        self.midpoint = float(midpoint)
        self.steepness = float(steepness)
        self.min_moves_left = float(min_moves_left)
        self.saved_ms = 0
        self._last: Optional[Budget] = None

    # -- state ---------------------------------------------------------------

    def reset(self) -> None:
        """New game: forget the time saved on earlier moves."""
        self.saved_ms = 0
        self._last = None

    def record(self, used_ms: int, budget: Optional[Budget] = None) -> None:
        """After a move: the search of ``budget`` (default: the last one issued) took ``used_ms``.

        Moves timed by the clock move the savings balance by ``soft - used``
        (less the savings they were given); other budgets leave it alone.
        Without ``budget``, a second call for the same move does nothing.
        """
        if budget is None:
            budget, self._last = self._last, None
        elif budget is self._last:
            self._last = None
        if budget is None or not budget.clock:
            return
        used = max(0, int(used_ms))
        self.saved_ms = max(0, self.saved_ms - budget.banked_ms + budget.soft_ms - used)

    # -- budgets -------------------------------------------------------------

    def budget(self, go: GoParams, white_to_move: bool, ply: Optional[int] = None) -> Budget:
        """The budget for ``go`` with ``white_to_move`` to play, ``ply`` half-moves into the game."""
        nodes = _nonneg(go.nodes)
        depth = _nonneg(go.depth)
        mate = go.mate if go.mate is not None and go.mate > 0 else None
        limits = dict(nodes=nodes, depth=depth, mate=mate)
        if go.infinite or go.ponder:
            result = Budget(None, None, infinite=True, until_stop=True, **limits)
        else:
            timed = [b for b in (self._movetime_budget(go), self._clock_budget(go, white_to_move, ply))
                     if b is not None]
            if not timed:
                result = Budget(None, None, infinite=True, **limits)
            elif len(timed) == 1:
                result = replace(timed[0], **limits)
            else:  # movetime and a clock: the tighter of the two, no savings
                soft = min(b.soft_ms for b in timed)
                hard = min(b.hard_ms for b in timed)
                result = Budget(soft, hard, **limits)
        self._last = result
        return result

    def ponderhit_budget(self, go: GoParams, white_to_move: bool, ply: Optional[int] = None) -> Budget:
        """The timed budget a ``go ponder`` turns into at ``ponderhit`` (clock measured from then)."""
        return self.budget(replace(go, ponder=False), white_to_move, ply)

    def moves_to_go(self, movestogo: Optional[int], ply: Optional[int]) -> float:
        """The number of moves the clock must last: the sooner of the time control and the game's end."""
        estimate = max(self.min_moves_left,
                       estimated_moves_left(0 if ply is None else ply, self.midpoint, self.steepness))
        if movestogo is not None and 0 < movestogo < estimate:
            return float(movestogo)
        return estimate

    def _movetime_budget(self, go: GoParams) -> Optional[Budget]:
        movetime = _nonneg(go.movetime)
        if movetime is None:
            return None
        ms = max(0, movetime - self.move_overhead_ms - self.safety_ms)
        return Budget(ms, ms)

    def _clock_budget(self, go: GoParams, white_to_move: bool, ply: Optional[int]) -> Optional[Budget]:
        ours, theirs = (go.wtime, go.btime) if white_to_move else (go.btime, go.wtime)
        time_left = _nonneg(ours if ours is not None else theirs)
        if time_left is None:
            return None
        increment = _nonneg(go.winc if white_to_move else go.binc) or 0
        lag = self.move_overhead_ms + self.safety_ms
        avail = time_left - lag
        if avail <= 0:
            return Budget(0, 0, clock=True)
        moves = self.moves_to_go(go.movestogo, ply)
        spend = min(self.saved_ms, self.bank_fraction * avail)
        plan = max(0.0, (time_left - spend + increment * (moves - 1)) / moves - lag)
        target = self.slowmover * plan
        fraction = self.max_move_fraction + (self.last_move_fraction - self.max_move_fraction) / moves
        # Keep on the clock the lag (+1 ms, so it stays above zero) of the moves
        # still to come, less their increments: with a movestogo, every move to
        # the control, even when the game is expected to end sooner.
        to_control = go.movestogo if go.movestogo is not None and go.movestogo > 0 else moves
        reserve = (max(moves, to_control) - 1) * max(0, lag + 1 - increment)
        hard = max(0, math.floor(min(self.hard_ratio * (target + spend), fraction * avail, avail - reserve)))
        soft = min(math.floor(target + spend), hard)
        banked = max(0, soft - math.floor(target))
        return Budget(soft, hard, banked_ms=banked, clock=True)
