"""One tree's search of one move: its budget and stop rules, and the move it chooses.

:class:`MoveSearch` applies what the time manager allowed (nodes, depth, mate,
the soft and hard time with lc0's extension while the best move is unstable)
and smart pruning, and picks the move (temperature) and what a training record
needs. It reads the root through :class:`RootSummary`, asked of the tree once
per round. The batched loop that runs move searches is :mod:`engine.driver`.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

from engine.board import Board
from engine.limits import Budget, GoParams
from engine.params import SearchParams
from engine.search_report import SearchResult
from engine.tree import Tree

__all__ = ["CPU_MINIBATCH", "EXTENSION_MIN_VISIT_SHARE", "EXTENSION_RECENT_SHARE", "MoveSearch", "RootSummary",
           "game_ply", "root_tree", "summary_of"]

# MinibatchSize 0 on a network of variable shapes (the CPU): leaves per batch. At the few
# hundred nodes a move a CPU searches, a big batch is one virtual-loss sweep rather than a
# best-first search: at 10+0.1, 8 beat 256 by 36-2-2 and 16 by 49-34-17 (docs/engine.md, "Search
# parameters", has the matches).
CPU_MINIBATCH = 8
# Time extension: another move is "better by value" when its Q beats the most visited
# move's and it has at least this share of its visits (a Q of a few visits is noise) ...
EXTENSION_MIN_VISIT_SHARE = 0.1
# ... and the best move "changed recently" when that happened within this share of the
# soft target before now.
EXTENSION_RECENT_SHARE = 0.1


class RootSummary(NamedTuple):
    """What the stop rules read of the root, the first of ``root_children()``'s order among the
    moves the search may play (``Tree.root_summary``, or :func:`summary_of`): named, as the
    tuple the tree returns is positional."""

    move: Optional[str]          # the first move (None: no allowed move, or nothing searched)
    n: int                       # its visits
    q: Optional[float]           # its W - L for the side to move at the root (None before a visit)
    proven: Optional[int]        # +1/0/-1 once its result is exact, else None
    m: Optional[float]           # its plies left (exact plies to the end once proven)
    second_n: Optional[int]      # the second allowed move's visits (None: only one)
    better_q: bool               # another allowed move with max(1, share x n) visits has the higher q


def game_ply(board: Board) -> int:
    """Half-moves since the game's first move, from the fullmove number (as python-chess counts)."""
    return 2 * (board.fullmove_number - 1) + (0 if board.turn else 1)


def root_tree(tree: Tree, board: Board, go: GoParams) -> None:
    """Root ``tree`` at ``board`` for the search ``go`` asks for (its searchmoves already legal).

    The tree is reused when ``board`` extends its last position, except under ``go depth``:
    depth is the average depth of this search's own playouts (lc0's measure), and in a
    reused tree the very first playouts already run as deep as the old search went, so a
    ``go depth 3`` answered at once with a depth-9 tree. A depth-limited search starts from
    an empty tree instead, so that ``go depth N`` always searches to depth N, as a fresh
    engine does (the network cache still spares it re-evaluations).
    """
    if go.depth is not None:
        tree.reset()
    tree.set_position(board)
    tree.set_searchmoves(go.searchmoves)


def summary_of(children: list, share: float) -> tuple:
    """``Tree.root_summary(share)`` in Python, from a ``root_children()`` list already limited to
    the allowed moves (what the C summary means, field by field in :class:`RootSummary`;
    stand-in trees in the tests use it)."""
    if not children:
        return (None, 0, None, None, None, None, False)
    top = children[0]
    second_n = children[1]["n"] if len(children) > 1 else None
    better = False
    if top["n"] and top["proven"] is None:
        enough = max(1, share * top["n"])
        better = any(c["n"] >= enough and c["q"] is not None and c["q"] > top["q"] for c in children[1:])
    return (top["move"], top["n"], top["q"], top["proven"], top["m"], second_n, better)


class MoveSearch:
    """One tree's search of one move: budget, stop rules, and the move it chooses.

    Time is passed in (``now``, a :func:`time.monotonic`-like value), never read
    here, so the rules can be tested with an injected clock. The caller roots
    ``tree`` at ``board`` (with ``go.searchmoves`` set) before the search starts.
    """

    def __init__(self, tree: Tree, board: Board, go: GoParams, budget: Budget, params: SearchParams,
                 start: float, analysis: bool = False) -> None:
        self.tree = tree
        self.board = board
        self.go = go
        self.params = params
        self.legal: list[str] = board.legal_moves()
        self.allowed = [m for m in self.legal if not go.searchmoves or m in go.searchmoves] or self.legal
        self.in_flight = 0              # leaves at the network (or gathered for it), counted by the Driver
        self.error: Optional[str] = None
        self.network_ready = False      # the network was had (Searcher: loaded lazily on its thread)
        self.extending = False          # past the soft target because the best move is unstable
        self.batch = params.minibatch_size or CPU_MINIBATCH   # leaves per batch (search_batch)
        self.pruned_at_ms: Optional[int] = None   # smart pruning ended the search this many ms in
        # Smart pruning ends a search early once its move is settled: not in analysis, where the
        # user asked for the whole time and for every MultiPV line's own value.
        self.prunes = params.smart_pruning_factor > 0 and params.multipv == 1 and not analysis
        self._best: Optional[str] = None
        self._best_since = start        # when the most visited move last changed
        self.rebudget(budget, start)    # budget, start, and done (set by update() from then on)

    def rebudget(self, budget: Budget, start: float) -> None:
        """A new budget from ``start`` on (the first, and a ponderhit's); the search goes on.
        A root without moves has nothing to search: it is done at once."""
        self.budget = budget
        self.start = start
        self._best_since = max(self._best_since, start)
        self.done = not self.legal

    # -- stop rules ----------------------------------------------------------

    def update(self, now: float) -> bool:
        """After a backup: note the best move, decide whether to stop (``done``)."""
        summary = None
        if not self.budget.infinite:   # the time rules follow the best move (go infinite needs none)
            summary = self._summary()
            best = summary.move if summary.n else None
            if best != self._best:
                self._best = best
                self._best_since = now
        self.done = self.should_stop(now, summary)
        return self.done

    def should_stop(self, now: float, summary: Optional[RootSummary] = None) -> bool:
        tree = self.tree
        budget = self.budget
        if not self.legal or tree.root_proven is not None or tree.out_of_memory:
            return True
        if budget.nodes is not None and tree.nodes >= budget.nodes:
            return True
        if budget.depth is not None and tree.average_depth >= budget.depth:
            return True
        if budget.mate is not None:
            summary = self._summary() if summary is None else summary
            if summary.proven == 1 and (summary.m + 2) // 2 <= budget.mate:   # moves to mate
                return True
        soft, hard = budget.soft_ms, budget.hard_ms
        if soft is None or hard is None:      # no time limit
            return False
        summary = self._summary() if summary is None else summary
        elapsed_ms = (now - self.start) * 1000.0
        if elapsed_ms >= hard:
            return True
        if len(self.allowed) == 1:
            return True
        unstable = self.params.time_extension and hard > soft and self.unstable(now, summary)
        if elapsed_ms >= soft and not unstable:
            return True
        self.extending = elapsed_ms >= soft
        # While the best move is unstable, smart pruning looks as far as the hard limit.
        if self._pruned(elapsed_ms, hard if unstable else soft, summary):
            self.pruned_at_ms = int(elapsed_ms)
            return True
        return False

    def unstable(self, now: float, summary: RootSummary) -> bool:
        """The best move may still change: another move has the better value (Q) on enough
        visits, or the most visited move changed recently (lc0's reasons to think longer)."""
        if summary.move is None or not summary.n or summary.proven is not None:
            return False
        if (now - self._best_since) * 1000.0 < EXTENSION_RECENT_SHARE * (self.budget.soft_ms or 0):
            return True
        return summary.better_q

    def _pruned(self, elapsed_ms: float, deadline_ms: float, summary: RootSummary) -> bool:
        """Smart pruning: no other move can catch the best one before the deadline at this speed."""
        factor = self.params.smart_pruning_factor
        tree = self.tree
        if not self.prunes or elapsed_ms < 100 or tree.playouts < 100:
            return False
        nps = tree.playouts / (elapsed_ms / 1000.0)
        remaining = nps * max(0.0, deadline_ms - elapsed_ms) / 1000.0 / factor
        if summary.move is None or summary.second_n is None:    # fewer than two moves
            return True
        return summary.n - summary.second_n > remaining

    def _summary(self) -> RootSummary:
        """The root as the stop rules read it, only the moves the search may play (once a round)."""
        return RootSummary._make(self.tree.root_summary(EXTENSION_MIN_VISIT_SHARE))

    # -- batch sizing --------------------------------------------------------

    def leaf_cap(self) -> int:
        """The most visits this tree may add to the next batch for its nodes and depth limits
        (``batch`` without them; 0: none now, its last ones are still in flight)."""
        cap = self.batch
        budget = self.budget
        tree = self.tree
        if budget.nodes is not None:
            cap = min(cap, budget.nodes - tree.nodes - self.in_flight)
        if budget.depth is not None:
            cap = min(cap, self._depth_cap(budget.depth))
        return max(0, cap)

    def _depth_cap(self, depth: int) -> int:
        """Visits that keep lc0's average depth below ``depth + 1`` even if each new one lands one
        ply below the one before, starting below the deepest so far: ``go depth N`` stops at
        depth N, not past it. (Visits chain within one gather: a cache hit is expanded on the
        spot, so the next visit can go one ply further down the same line.)"""
        tree = self.tree
        playouts = tree.playouts + self.in_flight
        deepest = tree.seldepth + 1
        total_depth = tree.average_depth * tree.playouts + self.in_flight * deepest
        visits = 0
        while visits < self.batch:
            total_depth += deepest + visits
            if total_depth >= (depth + 1) * (playouts + visits + 1):
                break
            visits += 1
        return max(1, visits)

    def time_window(self, now: float) -> Optional[tuple[float, float]]:
        """(seconds the move may take, seconds left of them), or None when time is no limit."""
        deadline_ms = self.budget.hard_ms if self.extending else self.budget.soft_ms
        if deadline_ms is None:
            return None
        return deadline_ms / 1000.0, max(0.0, deadline_ms / 1000.0 - (now - self.start))

    # -- the result ----------------------------------------------------------

    def choose(self) -> Optional[str]:
        """The move to play: drawn with probability visits^(1/Temperature) before TempCutoffPly
        (self-play), else the most visited; always one the search was allowed to play."""
        tree = self.tree
        if not tree.nodes:
            return None
        temperature = self.params.temperature
        cutoff = self.params.temp_cutoff_ply
        if cutoff and game_ply(self.board) >= cutoff:
            temperature = 0.0
        best = tree.choose_move(temperature) if temperature > 0 else tree.best_move()
        if best is not None and best not in self.allowed:
            # The tree's best move ignores searchmoves (e.g. a reused tree whose favourite was
            # excluded): play the best move that was allowed.
            ranked = [c["move"] for c in tree.root_children() if c["move"] in self.allowed]
            best = ranked[0] if ranked else None
        return best if best in self.legal else None

    def result(self) -> SearchResult:
        """The move chosen, the root's visit distribution and value (no info: self-play needs none)."""
        if self.error is not None:
            return SearchResult(None, None, None, error=self.error)
        if not self.legal:
            return SearchResult(None, None, None)
        tree = self.tree
        best = self.choose() or self.allowed[0]
        pv = tree.pv(best) if tree.nodes else []
        q, d = tree.root_q if tree.nodes else (0.0, 0.0)
        return SearchResult(best, pv[1] if len(pv) > 1 else None, None, visits=tree.visit_distribution(),
                            q=q, d=d, nodes=tree.nodes)

