"""The search driver: gather -> evaluate -> backup, for one game or many at once.

One driver serves both the UCI search and self-play (docs/architecture.md):

* :class:`MoveSearch` is one tree's search of one move: its budget and stop
  rules (limits, smart pruning, the time extension), the move it chooses
  (temperature) and what a training record needs (visits, root value).
* :class:`Driver` is the batched loop over any number of move searches: the
  leaves of every active search go into one :class:`~engine.tree.Batch`, one
  network call evaluates them, the backup hands each tree its rows. With
  ``pipeline`` it keeps two batches in flight (the network runs on a helper
  thread while the next batch is gathered; ONNX Runtime releases the GIL).
  Timed searches get batches sized from the time left and the network speed
  the driver measures as it runs, so a short search still gets many batches.
* :class:`Searcher` is the UCI search: one move search on its own thread,
  with ``stop``, ``ponderhit``, a watchdog for the hard deadline and info
  callbacks. Nothing here touches stdout: only ``uci/`` writes protocol text.
* :class:`MultiSearch` is what a self-play worker calls: many games, one tree
  each, searched together.

``stop`` is answered from the tree at once, never after the batch in flight:
the search thread holds ``_tree_lock`` only while it gathers or backs up (the
network call runs outside it), so :meth:`Searcher.stop` can read the best
move while the network is busy and the thread's later results are dropped.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Hashable, Mapping, Optional, Sequence, Union

from engine.board import Board
from engine.limits import Budget, GoParams
from engine.params import SearchParams
from engine.timeman import TimeManager
from engine.tree import Batch, NNCache, Tree

__all__ = ["CPU_MINIBATCH", "Driver", "EvalSpeed", "default_pipeline", "search_batch", "Info",
           "Line", "MoveSearch", "MultiSearch", "SearchResult", "Searcher", "game_ply", "q_to_cp", "wdl_permille"]

# A timed search plans at least this many batches into its time (fewer, larger ones
# leave a short search with a handful of nodes and a long tail at the deadline).
BATCHES_PER_BUDGET = 8
# The batch of a timed search before the network's speed has been measured once.
FIRST_TIMED_BATCH = 16
# MinibatchSize 0 on a network of variable shapes (the CPU): leaves per batch. At the few
# hundred nodes a move a CPU searches, a big batch is one virtual-loss sweep rather than a
# best-first search: at 10+0.1, 8 beat 256 by 36-2-2 and 16 by 49-34-17 (docs/engine.md, "Search
# parameters", has the matches).
CPU_MINIBATCH = 8
# stop: how long the best move waits for the tree lock (held by the search thread while it
# gathers or backs up a batch, about 0.1 ms) before it is taken from the last info report instead.
STOP_TREE_WAIT_S = 0.0003
# A hard deadline that comes before the search's first evaluation is back waits for it this long at
# most, looking every FIRST_EVALUATION_POLL_S (Searcher._stop_generation); once the search has its
# network (the root's evaluation is under way) up to FIRST_EVALUATION_LIMIT_S: the move that
# stopping would play costs that same evaluation again, on the same busy machine.
FIRST_EVALUATION_GRACE_S = 1.0
FIRST_EVALUATION_LIMIT_S = 5.0
FIRST_EVALUATION_POLL_S = 0.002
# A search thread with nothing to gather (another's batch holds the leaves) waits at most this
# long for that backup before it looks again (a stop is seen within this time).
SHARED_WAIT_S = 0.005
# Time extension: another move is "better by value" when its Q beats the most visited
# move's and it has at least this share of its visits (a Q of a few visits is noise) ...
EXTENSION_MIN_VISIT_SHARE = 0.1
# ... and the best move "changed recently" when that happened within this share of the
# soft target before now.
EXTENSION_RECENT_SHARE = 0.1


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


def game_ply(board: Board) -> int:
    """Half-moves since the game's first move, from the fullmove number (as python-chess counts)."""
    return 2 * (board.fullmove_number - 1) + (0 if board.turn else 1)


def wdl_permille(q: float, d: float) -> tuple[int, int, int]:
    """Win/draw/loss in permille (summing to 1000) from Q = W - L and D."""
    d = max(0.0, min(1.0, d))
    w = max(0.0, min(1.0, (1.0 - d + q) / 2.0))
    win = int(round(w * 1000))
    draw = int(round(d * 1000))
    draw = min(draw, 1000 - win)
    return win, draw, 1000 - win - draw


def _reason(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


# --------------------------------------------------------------------------- one move of one tree


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
    the allowed moves (what the C summary means; stand-in trees in the tests use it)."""
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
        self.budget = budget
        self.start = start
        self.legal: list[str] = board.legal_moves()
        self.allowed = [m for m in self.legal if not go.searchmoves or m in go.searchmoves] or self.legal
        self.done = not self.legal      # set by update(); a root without moves has nothing to search
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

    def rebudget(self, budget: Budget, start: float) -> None:
        """A new budget from ``start`` on (ponderhit); the search goes on."""
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
            best = summary[0] if summary[1] else None
            if best != self._best:
                self._best = best
                self._best_since = now
        self.done = self.should_stop(now, summary)
        return self.done

    def should_stop(self, now: float, summary: Optional[tuple] = None) -> bool:
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
            if summary[3] == 1 and (summary[4] + 2) // 2 <= budget.mate:
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

    def unstable(self, now: float, summary: tuple) -> bool:
        """The best move may still change: another move has the better value (Q) on enough
        visits, or the most visited move changed recently (lc0's reasons to think longer)."""
        move, n, _q, proven, _m, _second_n, better_q = summary
        if move is None or not n or proven is not None:
            return False
        if (now - self._best_since) * 1000.0 < EXTENSION_RECENT_SHARE * (self.budget.soft_ms or 0):
            return True
        return better_q

    def _pruned(self, elapsed_ms: float, deadline_ms: float, summary: tuple) -> bool:
        """Smart pruning: no other move can catch the best one before the deadline at this speed."""
        factor = self.params.smart_pruning_factor
        tree = self.tree
        if not self.prunes or elapsed_ms < 100 or tree.playouts < 100:
            return False
        nps = tree.playouts / (elapsed_ms / 1000.0)
        remaining = nps * max(0.0, deadline_ms - elapsed_ms) / 1000.0 / factor
        if summary[0] is None or summary[5] is None:    # fewer than two moves
            return True
        return summary[1] - summary[5] > remaining

    def _summary(self) -> tuple:
        """The root as the stop rules read it, only the moves the search may play
        (``Tree.root_summary``: the best move, its n/q/proven/m, the second's visits,
        whether a move with enough visits has the better q)."""
        return self.tree.root_summary(EXTENSION_MIN_VISIT_SHARE)

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


# --------------------------------------------------------------------------- the batched loop


class EvalSpeed:
    """Seconds per network call, measured as the search runs, priced by the size it really runs.

    A network of fixed sizes (a GPU: ``sizes``, its ``batch_sizes``) costs the
    same for any batch that pads to one size, so each size is measured on its
    own. A network of variable shapes (the CPU) costs about the same per
    position, so sizes are grouped by powers of two and priced per position. A
    size never measured is priced at the per-position speed of the nearest one
    measured, so it is neither trusted blindly nor ruled out.

    Two kinds of call are not counted: the first of each size (a first call
    can include a plan: on an H100, half a second for a 6x64) and one far
    slower than its size's mean (another process took the machine for a
    moment), unless several come in a row. Counted, either once priced every
    larger batch out of a timed search and kept its batches at one position.
    """

    OUTLIER = 4.0          # a call this many times its size's mean is not counted ...
    OUTLIERS_IN_A_ROW = 3  # ... unless it is the third such in a row: the speed really changed

    def __init__(self, sizes: Sequence[int] = (), weight: float = 0.3) -> None:
        self.weight = weight
        self._timing = threading.Lock()
        self.reset(sizes)

    def reset(self, sizes: Sequence[int] = ()) -> None:
        """Forget every measurement (a new network), in place: the drivers of several search
        threads share one speed."""
        self.sizes = tuple(sorted(sizes))
        self._seen: set[int] = set()
        self._means: dict[int, list[float]] = {}    # key -> [mean size, mean seconds]
        self._outliers: dict[int, int] = {}
        self._busy_until = 0.0         # when the network finished its last call (the drivers' clock)

    def served(self, start: float, end: float) -> float:
        """The seconds the network spent on a call made at ``start`` and answered at ``end``: one
        that waited behind another call (of any driver sharing this speed) counts from when that
        one was answered."""
        with self._timing:
            seconds = end - max(start, self._busy_until)
            self._busy_until = max(self._busy_until, end)
        return seconds

    @property
    def measured(self) -> bool:
        return bool(self._means)

    def padded(self, size: int) -> int:
        """The size the network runs a batch of ``size`` at."""
        for fixed in self.sizes:
            if fixed >= size:
                return fixed
        return size

    def _key(self, size: int) -> int:
        return self.padded(size) if self.sizes else size.bit_length()

    def record(self, size: int, seconds: float) -> None:
        if size <= 0 or seconds <= 0:
            return
        key = self._key(size)
        if key not in self._seen:
            self._seen.add(key)
            return
        priced = float(self.padded(size))
        mean = self._means.get(key)
        if mean is None:
            self._means[key] = [priced, seconds]
            return
        if seconds > self.OUTLIER * mean[1]:
            self._outliers[key] = self._outliers.get(key, 0) + 1
            if self._outliers[key] < self.OUTLIERS_IN_A_ROW:
                return
            mean[0], mean[1] = priced, seconds
        else:
            mean[0] += self.weight * (priced - mean[0])
            mean[1] += self.weight * (seconds - mean[1])
        self._outliers[key] = 0

    def seconds_for(self, size: int) -> Optional[float]:
        """The expected seconds of a call of ``size`` positions (None before any measurement):
        its own size's mean if measured, else a line through the measured sizes around it (a
        call has a fixed cost besides its positions), never below the cheapest rate seen."""
        if not self._means:
            return None
        key = self._key(size)
        if self.sizes and key in self._means:
            return self._means[key][1]
        x = float(self.padded(size))
        points = sorted(self._means.values())
        cheapest = min(t / n for n, t in points) * x
        if len(points) == 1:
            return points[0][1] / points[0][0] * x
        i = next((i for i in range(1, len(points) - 1) if x <= points[i][0]), len(points) - 1)
        (n0, t0), (n1, t1) = points[i - 1], points[i]
        if n1 <= n0:
            return max(cheapest, t1 / n1 * x)
        return max(cheapest, t0 + (t1 - t0) / (n1 - n0) * (x - n0))

    def largest_within(self, seconds: float, cap: int) -> int:
        """The largest batch (1 to ``cap``) expected to take at most ``seconds`` (1 if none).

        With fixed sizes the answer is one of them (or ``cap``): a batch padded to a size costs
        that size, so the search may as well fill it."""
        cap = max(1, cap)
        if self.sizes:
            for size in sorted({min(cap, fixed) for fixed in self.sizes}, reverse=True):
                expected = self.seconds_for(size)
                if expected is None or expected <= seconds:
                    return size
            return 1
        size = cap
        for _ in range(16):
            expected = self.seconds_for(size)
            if expected is None:
                return size
            per = expected / size
            fits = int(seconds / per)
            if fits >= size:
                return size
            if fits < 1:
                return 1
            size = fits
        return size


@dataclass
class _Gathered:
    batch: Batch
    taken: list[tuple[MoveSearch, int]]   # leaves each search put in
    future: Optional[Future] = None
    outputs: Any = None


class Driver:
    """gather -> evaluate -> backup for any number of move searches, one batch per network call.

    ``capacity`` is the size of each batch (the sum of the searches' leaves per
    round). With ``pipeline``, two batches are in flight: one at the network (on
    a helper thread) while the next is gathered. The batches are kept between
    runs (their planes buffers are large), so one driver serves one search
    thread at a time.
    """

    def __init__(self, capacity: int, pipeline: bool = False, clock: Callable[[], float] = time.monotonic,
                 speed: Optional[EvalSpeed] = None) -> None:
        if capacity < 1:
            raise ValueError(f"batch capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.pipeline = pipeline
        self.clock = clock
        self.speed = EvalSpeed() if speed is None else speed   # shared by the drivers of one search
        self._batches = [Batch(capacity) for _ in range(2 if pipeline else 1)]
        self._executor: Optional[ThreadPoolExecutor] = None
        self._start_index = 0          # round-robin start when the batch cannot hold every search

    def drop(self) -> None:
        """Forget every gathered leaf (a new search re-roots the trees); call with the trees' lock held."""
        for batch in self._batches:
            if len(batch):
                batch.clear()

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    def run(self, network: Any, searches: Sequence[MoveSearch], *, lock: Any = None,
            stopped: Optional[Callable[[], bool]] = None,
            on_round: Optional[Callable[[float], None]] = None, shared: bool = False) -> None:
        """Search until every search is done or ``stopped()``.

        ``lock`` is held while the trees are touched (gather, backup, ``on_round``),
        never during the network call. ``on_round(now)`` runs after each backup.
        A network error propagates (the searches keep what they had).

        ``shared``: other drivers search the same trees at once, each on its own
        thread with its own batches (``SearchThreads``): their leaves' visits in
        flight steer each other's gathers away, as one driver's two batches do.
        They share ``lock``, then a :class:`threading.Condition`: a driver that
        finds nothing to gather while another's leaves are at the network waits
        on it for a backup rather than spin.
        """
        lock = contextlib.nullcontext() if lock is None else lock
        stopped = stopped or (lambda: False)
        sizes = tuple(getattr(network, "batch_sizes", ()) or ())
        if self.speed.sizes != sizes:      # priced by the sizes this network really runs
            self.speed.reset(sizes)
        free = list(self._batches)
        inflight: list[_Gathered] = []      # at the network, oldest first
        gathered: Optional[_Gathered] = None
        try:
            while True:
                gathered = None
                with lock:
                    if stopped():
                        return
                    active = [s for s in searches if not s.done]
                    if active and free:
                        playouts = sum(s.tree.playouts for s in active)
                        ahead = sum(len(g.batch) for g in inflight)
                        if shared:      # the other drivers' leaves are at the network too
                            ahead = max(ahead, sum(s.in_flight for s in active))
                        gathered = self._gather(free.pop(), active, ahead)
                        if not len(gathered.batch):
                            free.append(gathered.batch)
                            gathered = None
                            if not inflight:
                                if shared and any(s.in_flight for s in active):
                                    lock.wait(SHARED_WAIT_S)   # another driver's batch holds the leaves
                                    continue
                                # Nothing for the network: every visit was resolved in the tree (or none
                                # could be made). Judge the searches again, and give up on any that
                                # cannot move at all.
                                now = self.clock()
                                stuck = sum(s.tree.playouts for s in active) == playouts
                                for s in active:
                                    s.update(now)
                                    if stuck and not s.in_flight:
                                        s.done = True
                                if on_round is not None:
                                    on_round(now)
                                continue
                    elif not active and not inflight:
                        return
                if gathered is not None and (not inflight or self._send_early(gathered, inflight, stopped)):
                    # With two batches, the second goes to the network as soon as it is gathered and
                    # waits there, not here: the network goes from one to the next without waiting
                    # for this thread to collect, back up and submit (on a GPU that gap was a
                    # quarter of its time).
                    inflight.append(self._submit(network, gathered))
                    gathered = None
                    if self.pipeline and free:
                        continue      # gather the next batch while this one is at the network
                if not inflight:
                    continue
                collected = inflight[0]   # stays listed until backed up: the finally below unwinds it
                outputs, seconds, size = self._collect(collected)
                with lock:
                    if stopped():
                        return
                    inflight.pop(0)
                    self.speed.record(size, seconds)
                    if all(s.done for s, _ in collected.taken):
                        collected.batch.clear()   # done meanwhile: its leaves are no longer wanted
                    else:
                        collected.batch.backup(*outputs)
                    for s, added in collected.taken:
                        s.in_flight -= added
                    free.append(collected.batch)
                    now = self.clock()
                    for s in searches:
                        if not s.done:
                            s.update(now)
                    if on_round is not None:
                        on_round(now)
                    if gathered is not None and all(s.done for s, _ in gathered.taken):
                        gathered.batch.clear()   # stopped meanwhile: its leaves are no longer wanted
                        for s, added in gathered.taken:
                            s.in_flight -= added
                        free.append(gathered.batch)
                        gathered = None
                    if shared:
                        lock.notify_all()
                if gathered is not None:
                    inflight.append(self._submit(network, gathered))
                    gathered = None
        finally:
            for waiting in inflight:
                if waiting.future is not None:
                    try:
                        waiting.future.result()   # its thread reads the planes until it returns
                    except Exception:
                        pass
            with lock:
                # Only this driver's leaves: another driver on the same searches may still have some.
                for unfinished in inflight + ([gathered] if gathered is not None else []):
                    for s, added in unfinished.taken:
                        s.in_flight -= added
                for batch in self._batches:
                    if len(batch):
                        batch.clear()
                if shared:
                    lock.notify_all()

    # -- one round -----------------------------------------------------------

    def _send_early(self, gathered: _Gathered, ahead: list[_Gathered], stopped: Callable[[], bool]) -> bool:
        """Whether the batch just gathered may go to the network now, behind the ``ahead`` batches
        still there, rather than after the oldest is backed up: yes, unless the search is
        stopped or a timed search in it might be past its time before the batch came back
        (then the backup decides, as it may end the search)."""
        if stopped():
            return False
        now = self.clock()
        expected = sum(self.speed.seconds_for(len(g.batch)) or 0.0 for g in (*ahead, gathered))
        for s, _ in gathered.taken:
            window = s.time_window(now)
            if window is not None and window[1] < 1.5 * expected:
                return False
        return True

    def _gather(self, batch: Batch, active: list[MoveSearch], ahead: int) -> _Gathered:
        """Fill ``batch`` from the active searches; ``ahead`` leaves are at the network before it."""
        now = self.clock()
        timed = self._time_cap(active, now, ahead)
        if timed is not None:   # the batch the time allows, split among the searches (at least one)
            share, extra = divmod(max(1, timed), len(active))
        taken = []
        order = active
        if len(active) > 1:   # when the batch fills up, a different search goes first next round
            start = self._start_index % len(active)
            order = active[start:] + active[:start]
            self._start_index += 1
        for i, s in enumerate(order):
            room = self.capacity - len(batch)
            if room <= 0:
                break
            cap = s.leaf_cap()
            if timed is not None:
                cap = min(cap, share + (i < extra))
            cap = min(cap, room)
            if cap <= 0:
                continue
            limited = s.budget.nodes is not None or s.budget.depth is not None
            added = s.tree.gather(batch, max_leaves=cap, max_visits=cap if limited else 0)
            if added:
                s.in_flight += added
                taken.append((s, added))
        return _Gathered(batch, taken)

    def _time_cap(self, active: list[MoveSearch], now: float, ahead: int) -> Optional[int]:
        """The batch that fits the most urgent timed search: at most 1/BATCHES_PER_BUDGET of its
        time, and no more than the time it has left after the ``ahead`` leaves at the network
        (None: no search is timed)."""
        windows = [w for w in (s.time_window(now) for s in active) if w is not None]
        if not windows:
            return None
        if not self.speed.measured:
            return FIRST_TIMED_BATCH
        busy = (self.speed.seconds_for(ahead) or 0.0) if ahead else 0.0
        allowed = min(min(total / BATCHES_PER_BUDGET, left - busy) for total, left in windows)
        return self.speed.largest_within(allowed, self.capacity)

    def _submit(self, network: Any, gathered: _Gathered) -> _Gathered:
        size = len(gathered.batch)
        padded = self.speed.padded(size)
        if padded <= gathered.batch.capacity:
            # A network of fixed sizes runs the batch at ``padded`` rows anyway: hand it the
            # batch's own buffer that far (the rows past ``size`` are stale and ignored), so it
            # need not copy the planes into a padded buffer of its own.
            size = padded
        planes = gathered.batch.planes[:size]
        if self.pipeline:
            if self._executor is None:
                # Two: the second batch waits at the network while the first runs.
                self._executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="cyzero-network")
            gathered.future = self._executor.submit(self._evaluate, network, planes)
        else:
            gathered.outputs = self._evaluate(network, planes)
        return gathered

    def _evaluate(self, network: Any, planes: Any) -> tuple[Any, float, int]:
        """The outputs, the seconds the network spent on this batch, and its size. A batch that
        waited at the network for the one before it is timed from when that one was done."""
        start = self.clock()
        outputs = network.evaluate(planes)
        return outputs, self.speed.served(start, self.clock()), len(planes)

    @staticmethod
    def _collect(gathered: _Gathered) -> tuple[Any, float, int]:
        if gathered.future is not None:
            return gathered.future.result()
        return gathered.outputs


# --------------------------------------------------------------------------- self-play


GameKey = Hashable


class MultiSearch:
    """Many games searched together: one tree per game, their leaves in one batch per network call.

    What a self-play worker calls, move after move::

        games = MultiSearch(network, SearchParams(noise_epsilon=0.25, temperature=1.0, temp_cutoff_ply=30))
        results = games.search({game_id: (board, GoParams(nodes=800)) for ...})

    ``search`` takes a list of ``(board, go)`` (keys 0, 1, ...) or a dict keyed by game,
    and returns results in the same shape: the move to play (temperature applied),
    the root's visit distribution and value. Each game keeps its tree between
    moves (reused when the next board extends the last) until :meth:`new_game`.
    ``network`` has ``evaluate(planes) -> (policy, wdl, mlh)``.
    """

    def __init__(self, network: Any, params: Optional[SearchParams] = None, *, pipeline: bool = True,
                 max_batch: Optional[int] = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.network = network
        self.params = params or SearchParams()
        self.pipeline = pipeline
        self.max_batch = max_batch
        self.clock = clock
        self.cache = NNCache(self.params.nn_cache_size)
        self.trees: dict[GameKey, Tree] = {}
        self._timemans: dict[GameKey, TimeManager] = {}
        self._driver: Optional[Driver] = None
        self._created = 0

    def new_game(self, key: GameKey, seed: Optional[int] = None) -> None:
        """Start game ``key`` afresh; ``seed`` fixes its noise and temperature draws (default:
        SearchParams.seed plus a game counter, or a random seed when that is 0)."""
        self.forget(key)
        self._tree(key, seed)

    def forget(self, key: GameKey) -> None:
        """Drop game ``key``'s tree (the game is over)."""
        self.trees.pop(key, None)
        self._timemans.pop(key, None)

    def search(self, games: Union[Sequence[tuple[Board, GoParams]], Mapping[GameKey, tuple[Board, GoParams]]]
               ) -> Union[list[SearchResult], dict[GameKey, SearchResult]]:
        keyed = dict(games) if isinstance(games, Mapping) else dict(enumerate(games))
        start = self.clock()
        searches = {}
        input_format = getattr(self.network, "input_format", 1)
        for key, (board, go) in keyed.items():
            tree = self._tree(key)
            if tree.input_format != input_format:   # a network of another format: nothing kept applies
                self.cache.clear()
                tree.input_format = input_format
            go = replace(go, searchmoves=[m for m in go.searchmoves if board.is_legal(m)])
            root_tree(tree, board, go)
            budget = self._timemans[key].budget(go, board.turn, board.ply())
            searches[key] = MoveSearch(tree, board, go, budget, self.params, start)
        if searches:
            self._driver_for(len(searches)).run(self.network, list(searches.values()))
        used_ms = int((self.clock() - start) * 1000)
        results = {}
        for key, s in searches.items():
            self._timemans[key].record(used_ms, s.budget)
            results[key] = s.result()
        return results if isinstance(games, Mapping) else [results[k] for k in range(len(keyed))]

    def close(self) -> None:
        if self._driver is not None:
            self._driver.close()

    def _tree(self, key: GameKey, seed: Optional[int] = None) -> Tree:
        tree = self.trees.get(key)
        if tree is None:
            if seed is None and self.params.seed:
                seed = self.params.seed + self._created
            self._created += 1
            tree = Tree(cache=self.cache, seed=seed, max_bytes=self.params.hash_mb << 20,
                        **self.params.tree_settings())
            self.trees[key] = tree
            self._timemans[key] = TimeManager(self.params.move_overhead_ms)
        return tree

    def _driver_for(self, games: int) -> Driver:
        """A driver whose batch holds every game's leaves, up to ``max_batch`` and, on a network
        of fixed sizes, its largest: the games take turns filling batches of the sizes it runs."""
        capacity = games * (self.params.minibatch_size or CPU_MINIBATCH)
        if self.max_batch is not None:
            capacity = min(capacity, self.max_batch)
        sizes = getattr(self.network, "batch_sizes", ())
        if sizes:
            capacity = min(capacity, max(sizes))
        driver = self._driver
        if driver is None or driver.capacity < capacity:
            if driver is not None:
                driver.close()
            driver = self._driver = Driver(capacity, self.pipeline, self.clock)
        return driver


# --------------------------------------------------------------------------- the UCI search


def _on_gpu(network: object) -> bool:
    """Whether ``network`` runs on a GPU: its ``gpu`` flag, or, for a network without one (a
    stand-in), whether it runs fixed batch sizes. OpenVINO runs fixed sizes on the CPU too."""
    gpu = getattr(network, "gpu", None)
    return bool(getattr(network, "batch_sizes", ())) if gpu is None else bool(gpu)


def default_pipeline(network: object) -> bool:
    """Whether the UCI search keeps two batches in flight with ``network``: on a GPU only. On a
    CPU the gather competes with the runtime's threads for the same cores, and ``cyzero bench
    search`` (which measures both) shows no gain there."""
    return _on_gpu(network)


def search_batch(params: SearchParams, network: object) -> int:
    """Leaves per batch: ``MinibatchSize``, or when it is 0 the backend's choice, as lc0's
    MinibatchSize 0 is: the network's largest fixed size on a GPU, where a small batch wastes
    it, and :data:`CPU_MINIBATCH` on the CPU, where a big batch costs strength."""
    if params.minibatch_size:
        return params.minibatch_size
    sizes = getattr(network, "batch_sizes", ())
    return max(sizes) if sizes and _on_gpu(network) else CPU_MINIBATCH



class Searcher:
    """Runs one search at a time on its own thread and reports through callbacks.

    ``network`` is a zero-argument callable returning an object with
    ``evaluate(planes) -> (policy, wdl, mlh)``; it is called on the search
    thread, so a lazy network load is charged to the first move's time. When
    it raises, the search reports ``SearchResult.error`` and no move.

    ``pipeline``: keep two batches in flight (see :class:`Driver`). ``None``
    (the default) turns it on only for a network on a GPU provider: on a CPU
    the gather competes with ONNX Runtime's threads for the cores
    (``cyzero bench search`` measures both).
    """

    def __init__(self, network: Callable[[], object], params: Optional[SearchParams] = None,
                 timeman: Optional[TimeManager] = None, *, pipeline: Optional[bool] = None) -> None:
        self._network = network
        self.params = params or SearchParams()
        self.pipeline = pipeline
        self.info_interval_s = 1.0          # at most this long between info reports
        self.analysis = False               # UCI_AnalyseMode: no smart pruning
        self.verbose = False                # UCI debug: why a search ended early, where its time went
        self.timeman = timeman or TimeManager()
        self.timeman.move_overhead_ms = self.params.move_overhead_ms
        self.cache = NNCache(self.params.nn_cache_size)
        self.tree = Tree(cache=self.cache, max_bytes=self.params.hash_mb << 20, **self.params.tree_settings())
        # A Condition: the search threads (SearchThreads) wait on it for each other's backups.
        self._tree_lock = threading.Condition(threading.Lock())
        self._thread: Optional[threading.Thread] = None
        self._stop = threading.Event()
        self._ponderhit = threading.Event()
        self._done_lock = threading.Lock()
        # Orders the reports: held while an info or the best move is sent, never while waiting
        # for another lock (see _on_round).
        self._report_lock = threading.Lock()
        self._done = True
        self._generation = 0             # counts the go commands; a search acts only for its own
        self._positioned = -1            # the generation whose position the tree holds
        self._on_info: Callable[[Info], None] = lambda info: None
        self._on_best: Callable[[SearchResult], None] = lambda result: None
        self._go_start = 0.0             # when the go arrived: info time and nps count from here
        self._go = GoParams()
        self._board = Board()
        self._move: Optional[MoveSearch] = None
        self._watchdog: Optional[threading.Timer] = None
        # One driver (and its batches) per search thread, kept across searches: a new 7 MB planes
        # buffer per go cost time, and, freed on a different short-lived search thread each time,
        # left memory behind in glibc's per-thread arenas (RSS crept up over hundreds of games).
        # Two sets: a search stopped with a batch at the network keeps its set until that batch is
        # back, and the next search takes the other at once instead of waiting for it (on a network
        # of 50 ms a call, the wait took a third of a go movetime 200's time before its first batch).
        self._driver_sets: list[list[Driver]] = [[], []]
        self._set_users: list[Optional[threading.Thread]] = [None, None]   # the search thread of each set
        self._slot = 0                       # the set of the latest search
        self._speed = EvalSpeed()            # the network's speed, as all the drivers measure it
        self._snapshot: Optional[tuple[str, Optional[str]]] = None   # (best, ponder) as last reported
        self._marks: dict[str, float] = {}   # when this go's search reached each step (verbose)
        # Why the network could not be had, the last time it was asked for: a search stopped before
        # it asked (an empty clock's watchdog) says so rather than invent a move.
        self._network_failure: Optional[str] = None
        self._last_info: Optional[Info] = None   # the last info reported for this go
        self._last_info_at = 0.0
        self._last_best: Optional[str] = None
        self.log: Callable[[str], None] = lambda text: None   # diagnostics (UCI: info string)

    # -- configuration -------------------------------------------------------

    def apply_options(self) -> None:
        """Re-read ``params`` (between searches)."""
        self.wait()
        params = self.params
        with self._tree_lock:
            self.tree.configure(**params.tree_settings())
            self.tree.max_bytes = params.hash_mb << 20
            if self.cache.capacity != params.nn_cache_size:
                self.cache = NNCache(params.nn_cache_size)
                self.tree = Tree(cache=self.cache, max_bytes=params.hash_mb << 20, **params.tree_settings())
            else:
                self.cache.clear()  # the policy temperature may have changed
            self.tree.seed(params.seed or None)
        self.timeman.move_overhead_ms = params.move_overhead_ms

    def new_game(self) -> None:
        """``ucinewgame``: forget the tree, the cache and the time savings."""
        self.wait()
        with self._tree_lock:
            self.tree.reset()
            self.tree.seed(self.params.seed or None)   # a fixed seed makes every game's search repeat
            self.cache.clear()
        self.timeman.reset()

    def network_unavailable(self, reason: Optional[str]) -> None:
        """The caller found (``reason``) or cleared (None) a failure to load the network.

        A search stopped before it asked for its network reports this failure
        instead of inventing a move.
        """
        self._network_failure = None if reason is None else f"no network loaded: {reason}"

    def network_changed(self) -> None:
        """A new network was swapped in: old evaluations and speed measurements no longer apply."""
        self.wait()
        with self._tree_lock:
            self.tree.reset()
            self.cache.clear()
            self._speed.reset()

    # -- searching -----------------------------------------------------------

    @property
    def searching(self) -> bool:
        return not self._done

    @property
    def bounded(self) -> bool:
        """The search in progress ends by itself: it has a nodes, depth or time limit (a clock, a
        movetime, or a ponder search after its ponderhit), and is neither ``go infinite`` nor a
        ``go ponder`` still waiting for its ponderhit."""
        move = self._move
        if self._done or move is None:
            return False
        budget = move.budget
        return not budget.until_stop and (budget.hard_ms is not None or budget.nodes is not None
                                          or budget.depth is not None)

    def start(self, board: Board, go: GoParams, on_info: Callable[[Info], None],
              on_bestmove: Callable[[SearchResult], None], start_time: Optional[float] = None) -> None:
        """Begin searching ``board`` under ``go``; returns at once.

        ``start_time`` (time.monotonic) is when the ``go`` arrived: the budget
        counts from then. Exactly one ``on_bestmove`` call follows, unless the
        search is stopped through :meth:`stop` (which then makes it) or
        :meth:`abort`.

        Nothing waits for the previous search's thread (a stopped search still
        finishes the network batch in flight, one batch time: tens of ms on a
        CPU, more on a big network): that batch is dropped from the tree at once,
        the tree gets the new position, and the new search gathers into the other
        of the two sets of batches while the old call finishes, so that the UCI
        reader stays free to answer ``isready`` and ``stop`` at once and the new
        search's first batch goes out at once.  Each search has its own stop
        event and generation, so the previous thread can neither report for nor
        stop the new search.
        """
        if self.searching:
            self.stop()             # one bestmove per go: the running search reports first
        previous = self._thread
        slot = 1 - self._slot if previous is not None and previous.is_alive() else self._slot
        wait_for = self._set_users[slot]   # still at the network only after two stops in a row
        started = time.monotonic() if start_time is None else start_time
        if go.searchmoves:
            # Only legal moves restrict the root; naming none (e.g. ``searchmoves 0000``) restricts
            # nothing. Left unfiltered, a list of only illegal moves made the tree select nothing
            # (a search that never reached its node limit) and a one-word list stop at once.
            legal = [m for m in go.searchmoves if board.is_legal(m)]
            if len(legal) != len(go.searchmoves):
                dropped = " ".join(m for m in go.searchmoves if m not in legal)
                self.log(f"searchmoves: ignoring {dropped} (not legal here)"
                         + ("" if legal else "; searching all moves"))
            go = replace(go, searchmoves=legal)
        # Under _done_lock: the previous search may be reporting its best move right now (its
        # _finish holds the lock), and must do so with its own position and limits.
        with self._done_lock:
            self._go_start = started
            self._go = go
            self._board = board
            self._on_info = on_info
            self._on_best = on_bestmove
            self._stop = stop = threading.Event()
            self._ponderhit = threading.Event()
            budget = self.timeman.budget(go, board.turn, board.ply())
            self._generation += 1
            generation = self._generation
            self._done = False
            self._snapshot = None
            self._marks = {}
            self._last_info = None
            self._last_best = None
            self._last_info_at = started
            # The tree holds the new position before anything can stop this search: a stop (or a
            # watchdog firing at once on an empty clock) would otherwise report the previous
            # position's best move. The previous search's leaves at the network are dropped first
            # (its thread discards the results), since they point into the old tree.
            with self._tree_lock:
                for drivers in self._driver_sets:
                    for driver in drivers:
                        driver.drop()
                root_tree(self.tree, board, go)
                self._move = move = MoveSearch(self.tree, board, go, budget, self.params, started,
                                               analysis=self.analysis)
                self._positioned = generation
            self._arm_watchdog()
        self._slot = slot
        self._thread = threading.Thread(target=self._run, args=(wait_for, stop, move, generation, slot),
                                        name="cyzero-search", daemon=True)
        self._set_users[slot] = self._thread
        self._thread.start()

    def stop(self) -> None:
        """Stop now and report the best move from the tree as it stands (at most once per go)."""
        self._stop.set()
        self._finish()

    def abort(self) -> None:
        """Stop without reporting a best move (quit)."""
        with self._done_lock:
            self._done = True
        self._stop.set()

    def ponderhit(self) -> None:
        """The ponder move was played: go on as a timed search from now."""
        move = self._move
        if self._done or not self._go.ponder or move is None:
            return
        board = self._board
        budget = self.timeman.ponderhit_budget(self._go, board.turn, board.ply())
        self._go = replace(self._go, ponder=False)
        move.rebudget(budget, time.monotonic())
        self._arm_watchdog()
        self._ponderhit.set()

    def wait(self, timeout: Optional[float] = None) -> None:
        """Block until every search thread has ended (a stopped one may still be at the network)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for thread in (*self._set_users, self._thread):
            if thread is not None and thread is not threading.current_thread():
                thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))

    # -- the thread ----------------------------------------------------------

    def _run(self, wait_for: Optional[threading.Thread], stop: threading.Event, move: MoveSearch,
             generation: int, slot: int) -> None:
        try:
            if wait_for is not None:
                wait_for.join()     # the last user of this driver set: its batch may be at the network
            if not stop.is_set():
                self._search(stop, move, slot)
        except Exception as exc:  # never leave a go without a bestmove
            if move.legal and not move.tree.nodes:
                move.error = f"network evaluation failed: {_reason(exc)}"   # nothing searched to play
            else:
                self.log(f"error: search failed: {type(exc).__name__}: {exc}")
        finally:
            self._finish(generation)

    def _stop_generation(self, generation: int, waited: float = 0.0) -> None:
        """The watchdog: stop search ``generation`` if it is still the current one.

        At a deadline that came before anything was evaluated (the machine was busy, or a network
        was being built beside the search), it waits for the search's first evaluation, for at
        most FIRST_EVALUATION_GRACE_S, or FIRST_EVALUATION_LIMIT_S once the search has its network:
        stopping then would evaluate the root once more, beside the evaluation already under way,
        only to play the policy's move unsearched (and no sooner: a CI machine running the test
        suite on both cores beside a reload took more than a second). The search ends itself once
        that evaluation is backed up, as its time is over.
        """
        with self._done_lock:
            if generation != self._generation or self._done:
                return
            move = self._move
            limit = FIRST_EVALUATION_LIMIT_S if move is not None and move.network_ready else FIRST_EVALUATION_GRACE_S
            if (waited < limit and move is not None and move.legal and move.error is None
                    and self._network_failure is None and not self.tree.nodes):
                self._watchdog = threading.Timer(FIRST_EVALUATION_POLL_S, self._stop_generation,
                                                 args=(generation, waited + FIRST_EVALUATION_POLL_S))
                self._watchdog.daemon = True
                self._watchdog.start()
                return
            self._stop.set()
        self._finish(generation)

    def _arm_watchdog(self) -> None:
        """Stop at the hard deadline even while a network batch is in flight."""
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        move = self._move
        if move is None or move.budget.hard_ms is None:    # no time limit
            return
        delay = max(0.0, move.start + move.budget.hard_ms / 1000.0 - time.monotonic())
        self._watchdog = threading.Timer(delay, self._stop_generation, args=(self._generation,))
        self._watchdog.daemon = True
        self._watchdog.start()

    def _search(self, stop: threading.Event, move: MoveSearch, slot: int = 0) -> None:
        ponderhit = self._ponderhit
        marks = self._marks
        marks["thread started"] = time.monotonic()
        try:
            network = self._network()
        except Exception as exc:
            move.error = self._network_failure = f"no network loaded: {_reason(exc)}"
            return
        self._network_failure = None
        move.network_ready = True
        marks["network ready"] = time.monotonic()
        input_format = getattr(network, "input_format", 1)
        if self.tree.input_format != input_format:
            with self._tree_lock:    # the tree and the cache hold another format's evaluations
                self.cache.clear()
                self.tree.input_format = input_format
                root_tree(self.tree, move.board, move.go)
        if not move.legal:
            # No move to play; still, go infinite / go ponder end only at stop (or ponderhit).
            while move.budget.until_stop and not stop.is_set() and not ponderhit.is_set():
                stop.wait(0.005)
            return
        move.batch = search_batch(self.params, network)
        drivers = self._drivers_for(network, move.batch, self.params.search_threads, slot)
        while True:
            if ponderhit.is_set():      # the ponder search goes on as a timed one, unless done already
                ponderhit.clear()
                with self._tree_lock:
                    if stop.is_set() or move.update(time.monotonic()):
                        return
            self._run_drivers(drivers, network, move, stop)
            if stop.is_set():
                return
            if ponderhit.is_set():
                continue
            if not move.budget.until_stop:
                return
            # go infinite / go ponder: only stop (or ponderhit) ends the search.
            while not stop.is_set() and not ponderhit.is_set():
                stop.wait(0.005)

    def _drivers_for(self, network: object, size: int, threads: int, slot: int) -> list[Driver]:
        pipeline = default_pipeline(network) if self.pipeline is None else self.pipeline
        drivers = self._driver_sets[slot]
        if len(drivers) != threads or any(d.capacity != size or d.pipeline != pipeline for d in drivers):
            for driver in drivers:
                driver.close()
            drivers = self._driver_sets[slot] = [Driver(size, pipeline, speed=self._speed) for _ in range(threads)]
        return drivers

    def _run_drivers(self, drivers: list[Driver], network: object, move: MoveSearch,
                     stop: threading.Event) -> None:
        """Search ``move`` with every driver until it is done or stopped: the first on this thread,
        each other one on a search thread of its own. The first error stops them all and is
        raised once all have ended."""
        failed = threading.Event()
        errors: list[BaseException] = []

        def search(driver: Driver) -> None:
            try:
                driver.run(network, [move], lock=self._tree_lock,
                           stopped=lambda: stop.is_set() or failed.is_set(),
                           on_round=lambda now: self._on_round(now, stop), shared=len(drivers) > 1)
            except BaseException as exc:
                errors.append(exc)
                failed.set()

        helpers = [threading.Thread(target=search, args=(driver,), name=f"cyzero-search-{i}", daemon=True)
                   for i, driver in enumerate(drivers[1:], start=2)]
        for helper in helpers:
            helper.start()
        search(drivers[0])
        for helper in helpers:
            helper.join()
        if errors:
            raise errors[0]

    def _on_round(self, now: float, stop: threading.Event) -> None:
        """After each backup (tree lock held): an info report when the best move changed or
        ``info_interval_s`` passed.

        Never after the best move: ``stop`` (or the watchdog) may report it from the last
        snapshot while this thread still holds the tree lock, so the check and the report
        happen under ``_report_lock``, which ``_finish`` reports under. (Not ``_done_lock``:
        ``start`` holds that while it waits for the tree lock this thread holds.)
        """
        self._marks.setdefault("first evaluation back", now)
        best = self.tree.best_move()
        if best != self._last_best or now - self._last_info_at >= self.info_interval_s:
            with self._report_lock:
                if self._done or stop.is_set():
                    return
                self._last_best = best
                self._last_info_at = now
                info = self.info()
                self._last_info = info
                self._on_info(info)
                pv = info.lines[0].pv if info.lines and info.lines[0].move == best else []
                self._snapshot = (best, pv[1] if len(pv) > 1 else None) if best else None

    def _finish(self, generation: Optional[int] = None) -> None:
        """Report the best move once per go (from stop() or the thread, whichever is first).

        ``generation``: the search thread's own; it must not finish a newer search.
        """
        with self._done_lock:     # held throughout: a new go waits until this one has reported
            if self._done or (generation is not None and generation != self._generation):
                return
            self._done = True
            if self._watchdog is not None:
                self._watchdog.cancel()
                self._watchdog = None
            try:
                # The search thread holds the tree lock while it gathers or backs up a batch (about
                # 0.1 ms, a few ms on a slow CPU as the tree grows, more when it is descheduled):
                # rather than wait longer than that, report the best move of the last info line (the
                # final info is then that line).
                if self._tree_lock.acquire(timeout=STOP_TREE_WAIT_S):
                    try:
                        result = self._result()
                    finally:
                        self._tree_lock.release()
                else:
                    result = self._snapshot_result()
                move = self._move
                if move is not None and not move.budget.until_stop:
                    self.timeman.record(int((time.monotonic() - move.start) * 1000), move.budget)
                if self.verbose and move is not None:
                    self._say_how_it_went(move, result)
                with self._report_lock:
                    if result.info is not None and not result.info.same_search_state(self._last_info):
                        self._on_info(result.info)
                    self._on_best(result)
            except Exception as exc:  # noqa: BLE001 - a GUI must get its bestmove whatever failed here
                # Once _done is set nothing else reports this go: without a move here the GUI waits forever.
                self.log(f"error: reporting the search failed: {type(exc).__name__}: {exc}")
                with self._report_lock:
                    self._on_best(self._last_resort())

    # -- reports -------------------------------------------------------------

    def _say_how_it_went(self, move: MoveSearch, result: SearchResult) -> None:
        """UCI ``debug on``: when each step of the search came after the ``go`` (a short search
        that plays an unsearched move shows where its time went), and why it ended early."""
        steps = ", ".join(f"{name} {int((at - self._go_start) * 1000)} ms"
                          for name, at in sorted(self._marks.items(), key=lambda item: item[1]))
        self.log(f"search: {steps or 'never started'}; {self.tree.nodes} nodes in "
                 f"{int((time.monotonic() - self._go_start) * 1000)} ms")
        if move.pruned_at_ms is not None and self._go.movetime and result.best:
            # As lc0, smart pruning stops once no other move can overtake the best in the time left.
            self.log(f"stopped after {move.pruned_at_ms} ms of {self._go.movetime}: no other move "
                     f"can overtake {result.best} in the time left; setoption name "
                     "SmartPruningFactor value 0 searches the whole time")

    def _result(self) -> SearchResult:
        move = self._move
        legal = self._board.legal_moves()
        if not legal:
            return SearchResult(None, None, None)
        error = self._error(move)
        if error is not None:
            return SearchResult(None, None, None, error=error)
        allowed = [m for m in legal if not self._go.searchmoves or m in self._go.searchmoves] or legal
        if self._positioned != self._generation or move is None:
            # Stopped before the search thread set up the tree (e.g. an empty clock's watchdog):
            # the tree still holds the previous position.
            return self._unsearched(allowed, cache=True)
        has_info = bool(self.tree.playouts or self.tree.nodes)
        best = move.choose()
        if best is None:
            unsearched = self._unsearched(allowed, cache=True)
            best = unsearched.best
            if best is None:
                return unsearched    # the network could not be had: why, and no move
            info = self.info(first=best) if has_info else None
            if info is not None and info.lines and info.lines[0].move != best:
                info.lines = []      # the final info's pv must start with the move played
            return SearchResult(best, None, info)
        # The final info's first line is the move played (it differs from the most visited
        # move when Temperature > 0), so that its pv[0] is the bestmove.
        info = self.info(first=best) if has_info else None
        # The pv once: the final info's first line has it (stop waits for this).
        pv = info.lines[0].pv if info is not None and info.lines and info.lines[0].move == best \
            else self.tree.pv(best)
        q, d = self.tree.root_q
        return SearchResult(best, pv[1] if len(pv) > 1 else None, info, visits=self.tree.visit_distribution(),
                            q=q, d=d, nodes=self.tree.nodes)

    def _unsearched(self, allowed: list[str], cache: bool = False) -> SearchResult:
        """Stopped before anything was searched (an empty clock, quit right after go): a clock
        needs a move, so the network's best policy move among ``allowed`` is played (one
        evaluation of the root, or its evaluation in the NN cache), but never silently. Without
        a network to ask: why, and no move (never the first legal move).

        ``cache``: the caller holds the tree lock, so the NN cache may be read.
        """
        board = self._board
        try:
            priors = None
            cached = self.cache.lookup(board) if cache else None
            if cached is not None:
                priors = cached[3]
            else:
                from engine.encoding import encode_board, legal_policy

                network = self._network()
                input_format = getattr(network, "input_format", 1)
                policy = network.evaluate(encode_board(board, input_format=input_format)[None])[0]
                moves, probabilities = legal_policy(board, policy[0], input_format=input_format)
                priors = dict(zip(moves, probabilities.tolist()))
            move = max(allowed, key=lambda m: priors.get(m, -1.0))
        except Exception as exc:
            return SearchResult(None, None, None, error=f"no move was searched and the network cannot "
                                                        f"choose one: {_reason(exc)}")
        self.log(f"warning: stopped before the search began; {move}, the network's policy choice, "
                 "is not searched")
        return SearchResult(move, None, None)

    def _last_resort(self) -> SearchResult:
        """A legal move when reporting the search's own failed: the last info line's, else the first."""
        try:
            return self._snapshot_result()
        except Exception:  # noqa: BLE001 - the board alone still gives a legal move
            legal = self._board.legal_moves()
            return SearchResult(legal[0] if legal else None, None, None)

    def _snapshot_result(self) -> SearchResult:
        """The best move (and ponder move) of the last info report, without touching the tree."""
        legal = self._board.legal_moves()
        if not legal:
            return SearchResult(None, None, None)
        error = self._error(self._move)
        if error is not None:
            return SearchResult(None, None, None, error=error)
        allowed = [m for m in legal if not self._go.searchmoves or m in self._go.searchmoves] or legal
        snapshot = self._snapshot
        if snapshot is not None and snapshot[0] in allowed:
            return SearchResult(snapshot[0], snapshot[1], None)
        return self._unsearched(allowed)

    def _error(self, move: Optional[MoveSearch]) -> Optional[str]:
        """Why this search could not run, if it could not."""
        if move is None:
            return None
        if move.error is None and not move.network_ready:
            return self._network_failure
        return move.error

    def info(self, first: Optional[str] = None) -> Info:
        """The search as it stands (call with the tree lock held or while no search runs).

        ``first``: a root move to report as the first line (the move about to be played).
        Depth is lc0's: the mean depth of this search's playouts, rounded down.
        """
        tree = self.tree
        elapsed = max(1e-6, time.monotonic() - self._go_start)
        lines = []
        children = tree.root_children() if tree.nodes else []
        if self._go.searchmoves:
            children = [c for c in children if c["move"] in self._go.searchmoves] or children
        if first is not None:
            children = sorted(children, key=lambda c: c["move"] != first)  # stable: the rest keep their order
        # Each line's score is its own move's, from its own subtree: a move without a value of its
        # own (not visited yet) is no line, except the first, the move to play, which before any
        # visit (go nodes 1) has the root's value, the value of playing it. MultiPV above 1 gives
        # every one of the best N moves its share of the visits (the tree's _multipv_edge), so
        # that N lines are there after the first few batches.
        valued = [c for i, c in enumerate(children) if i == 0 or c["q"] is not None]
        for rank, child in enumerate(valued[: max(1, self.params.multipv)], start=1):
            q = child["q"] if child["q"] is not None else tree.root_q[0]
            d = child["d"] if child["d"] is not None else tree.root_q[1]
            mate = None
            if child["proven"] in (1, -1):
                mate = int(child["proven"] * ((child["m"] + 2) // 2))
            lines.append(Line(rank, child["move"], tree.pv(child["move"]), child["n"], q, d, mate,
                              wdl_permille(q, d)))
        return Info(depth=max(1, int(tree.average_depth)), seldepth=max(1, tree.seldepth),
                    nodes=tree.nodes, nps=int(tree.playouts / elapsed), time_ms=int(elapsed * 1000),
                    lines=lines)
