"""The search loop: gather -> evaluate -> backup on a search thread.

A :class:`GoParams` goes in (lc0's plain struct of optional ``go`` fields);
thinking info (:class:`Info`) and the best move come out through callbacks.
Nothing here touches stdout: only ``uci/`` turns results into protocol text.

``stop`` is answered from the tree at once, never after the batch in flight:
the search thread holds ``_tree_lock`` only while it gathers or backs up (the
network call runs outside it), so :meth:`Searcher.stop` can read the best
move while the network is busy and the thread's later results are dropped.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Optional

import numpy as np

from engine.board import Board
from engine.limits import Budget, GoParams
from engine.params import SearchParams
from engine.timeman import TimeManager
from engine.tree import Batch, NNCache, Tree


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


@dataclass
class SearchResult:
    best: Optional[str]      # None when the root has no legal move, or when ``error`` is set
    ponder: Optional[str]
    info: Optional[Info]
    error: Optional[str] = None   # the search could not run (no network): say so, play no move


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


class Searcher:
    """Runs one search at a time on its own thread and reports through callbacks.

    ``network`` is a zero-argument callable returning an object with
    ``evaluate(planes) -> (policy, wdl, mlh)``; it is called on the search
    thread, so a lazy network load is charged to the first move's time.
    """

    def __init__(self, network: Callable[[], object], params: Optional[SearchParams] = None,
                 timeman: Optional[TimeManager] = None) -> None:
        self._network = network
        self.params = params or SearchParams()
        self.info_interval_s = 1.0          # at most this long between info reports
        self.timeman = timeman or TimeManager()
        self.timeman.move_overhead_ms = self.params.move_overhead_ms
        self.cache = NNCache(self.params.nn_cache_size)
        self.tree = Tree(cache=self.cache, max_bytes=self.params.hash_mb << 20, **self.params.tree_settings())
        self._tree_lock = threading.Lock()
        self._thread: Optional[threading.Thread] = None
        self._stop = threading.Event()
        self._ponderhit = threading.Event()
        self._done_lock = threading.Lock()
        self._done = True
        self._generation = 0             # counts the go commands; a search acts only for its own
        self._positioned = -1            # the generation whose position the tree holds
        self._on_info: Callable[[Info], None] = lambda info: None
        self._on_best: Callable[[SearchResult], None] = lambda result: None
        self._start = 0.0                # the budget counts from here (the go, or the ponderhit)
        self._go_start = 0.0             # when the go arrived: info time and nps count from here
        self._budget: Optional[Budget] = None
        self._go = GoParams()
        self._board = Board()
        self._watchdog: Optional[threading.Timer] = None
        self._batch: Optional[Batch] = None
        self._inflight: Optional[Batch] = None   # the batch at the network now (tree lock)
        self._snapshot: Optional[tuple[str, Optional[str]]] = None   # (best, ponder) as last reported
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

    def network_changed(self) -> None:
        """A new network was swapped in: old evaluations no longer apply."""
        self.wait()
        with self._tree_lock:
            self.tree.reset()
            self.cache.clear()

    # -- searching -----------------------------------------------------------

    @property
    def searching(self) -> bool:
        return not self._done

    def start(self, board: Board, go: GoParams, on_info: Callable[[Info], None],
              on_bestmove: Callable[[SearchResult], None], start_time: Optional[float] = None) -> None:
        """Begin searching ``board`` under ``go``; returns at once.

        ``start_time`` (time.monotonic) is when the ``go`` arrived: the budget
        counts from then. Exactly one ``on_bestmove`` call follows, unless the
        search is stopped through :meth:`stop` (which then makes it) or
        :meth:`abort`.

        The caller's thread never waits here for the previous search's thread
        (a stopped search still finishes the network batch in flight, one batch
        time: tens of ms on a CPU): that batch is dropped from the tree at once,
        the tree gets the new position, and the new search thread waits for the
        old one before it evaluates anything, so that the UCI reader stays free
        to answer ``isready`` and ``stop`` at once.  Each search has its own stop
        event and generation, so the previous thread can neither report for nor
        stop the new search.
        """
        if self.searching:
            self.stop()             # one bestmove per go: the running search reports first
        previous = self._thread
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
            self._start = self._go_start = started
            self._go = go
            self._board = board
            self._on_info = on_info
            self._on_best = on_bestmove
            self._stop = stop = threading.Event()
            self._ponderhit = threading.Event()
            self._budget = self.timeman.budget(go, board.turn, board.ply())
            self._generation += 1
            generation = self._generation
            self._done = False
            self._snapshot = None
            # The tree holds the new position before anything can stop this search: a stop (or a
            # watchdog firing at once on an empty clock) would otherwise report the previous
            # position's best move. The previous search's leaves at the network are dropped first
            # (its thread discards the results), since they point into the old tree.
            with self._tree_lock:
                if self._inflight is not None:
                    self._inflight.clear()
                    self._inflight = None
                self.tree.set_position(board)
                self.tree.set_searchmoves(go.searchmoves)
                self._positioned = generation
            self._arm_watchdog()
        self._thread = threading.Thread(target=self._run, args=(previous, stop, generation),
                                        name="cyzero-search", daemon=True)
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
        if self._done or not self._go.ponder:
            return
        self._start = time.monotonic()
        self._budget = self.timeman.ponderhit_budget(self._go, self._board.turn, self._board.ply())
        self._go = replace(self._go, ponder=False)
        self._arm_watchdog()
        self._ponderhit.set()

    def wait(self, timeout: Optional[float] = None) -> None:
        """Block until the search thread (and so every earlier one) has ended."""
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    # -- the thread ----------------------------------------------------------

    def _run(self, previous: Optional[threading.Thread], stop: threading.Event, generation: int) -> None:
        try:
            if previous is not None:
                previous.join()     # it was stopped; it may still be waiting for its network batch
            if not stop.is_set():
                self._search(stop)
        except Exception as exc:  # never leave a go without a bestmove
            self.log(f"error: search failed: {type(exc).__name__}: {exc}")
        finally:
            self._finish(generation)

    def _stop_generation(self, generation: int) -> None:
        """The watchdog: stop search ``generation`` if it is still the current one."""
        with self._done_lock:
            if generation != self._generation or self._done:
                return
            self._stop.set()
        self._finish(generation)

    def _arm_watchdog(self) -> None:
        """Stop at the hard deadline even while a network batch is in flight."""
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        budget = self._budget
        if budget is None or budget.infinite:
            return
        delay = max(0.0, self._start + budget.hard_ms / 1000.0 - time.monotonic())
        self._watchdog = threading.Timer(delay, self._stop_generation, args=(self._generation,))
        self._watchdog.daemon = True
        self._watchdog.start()

    def _search(self, stop: threading.Event) -> None:
        ponderhit = self._ponderhit
        network = self._network()
        root_moves = len(self._board.legal_moves())
        if not root_moves:
            # No move to play; still, go infinite / go ponder end only at stop (or ponderhit).
            while self._budget.until_stop and not stop.is_set() and not ponderhit.is_set():
                stop.wait(0.005)
            return
        # One batch kept across searches: a new 7 MB planes buffer per go cost time, and, freed on
        # a different short-lived search thread each time, left memory behind in glibc's
        # per-thread arenas (RSS crept up over hundreds of games).
        size = max(1, self.params.minibatch_size)
        batch = self._batch
        if batch is None or batch.capacity != size or len(batch):
            batch = self._batch = Batch(size)
        last_info = time.monotonic()
        last_best = None
        while not stop.is_set():
            with self._tree_lock:
                if stop.is_set():
                    return
                budget = self._budget
                # A nodes limit caps the batch, so that go nodes N stops close to N.
                left = budget.nodes - self.tree.nodes if budget.nodes is not None else 0
                self.tree.gather(batch, max_leaves=max(1, left) if budget.nodes is not None else 0)
                self._inflight = batch if len(batch) else None
            if len(batch):
                policy, wdl, mlh = network.evaluate(batch.planes[:len(batch)])
            with self._tree_lock:
                if stop.is_set():
                    batch.clear()   # a no-op when a new search already dropped it
                    return
                self._inflight = None
                if len(batch):
                    batch.backup(policy, wdl, mlh)
                best = self.tree.best_move()
                now = time.monotonic()
                if best != last_best or now - last_info >= self.info_interval_s:
                    last_best = best
                    last_info = now
                    info = self.info()
                    self._on_info(info)
                    pv = info.lines[0].pv if info.lines and info.lines[0].move == best else []
                    self._snapshot = (best, pv[1] if len(pv) > 1 else None) if best else None
                done = self._should_stop(now, root_moves)
            if done:
                if not self._budget.until_stop:
                    return
                # go infinite / go ponder: only stop (or ponderhit) ends the search.
                while not stop.is_set() and not ponderhit.is_set():
                    stop.wait(0.005)
                if stop.is_set():
                    return
            if ponderhit.is_set():
                ponderhit.clear()

    def _should_stop(self, now: float, root_moves: int) -> bool:
        budget = self._budget
        tree = self.tree
        if tree.root_proven is not None or tree.out_of_memory:
            return True
        if budget.nodes is not None and tree.nodes >= budget.nodes:
            return True
        if budget.depth is not None and tree.average_depth >= budget.depth:
            return True
        if budget.mate is not None:
            best = tree.root_children()
            if best and best[0]["proven"] == 1 and (best[0]["m"] + 2) // 2 <= budget.mate:
                return True
        if budget.infinite:
            return False
        elapsed_ms = (now - self._start) * 1000.0
        if elapsed_ms >= budget.hard_ms or elapsed_ms >= budget.soft_ms:
            return True
        if root_moves == 1 or (self._go.searchmoves and len(self._go.searchmoves) == 1):
            return True
        return self._pruned(elapsed_ms, budget.soft_ms)

    def _pruned(self, elapsed_ms: float, soft_ms: float) -> bool:
        """Smart pruning: no other move can catch the best one in the time that is left."""
        factor = self.params.smart_pruning_factor
        if factor <= 0 or elapsed_ms < 100 or self.tree.playouts < 100:
            return False
        nps = self.tree.playouts / (elapsed_ms / 1000.0)
        remaining = nps * max(0.0, soft_ms - elapsed_ms) / 1000.0 / factor
        children = self.tree.root_children()
        if len(children) < 2:
            return True
        return children[0]["n"] - children[1]["n"] > remaining

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
            # The search thread holds the tree lock while it gathers or backs up a batch (a few
            # ms, up to ~15 ms on a slow CPU as the tree grows): rather than wait, report the
            # best move of the last info line (the final info is then that line).
            if self._tree_lock.acquire(timeout=0.001):
                try:
                    result = self._result()
                finally:
                    self._tree_lock.release()
            else:
                result = self._snapshot_result()
            used = int((time.monotonic() - self._start) * 1000)
            if self._budget is not None and not self._budget.until_stop:
                self.timeman.record(used, self._budget)
            if result.info is not None:
                self._on_info(result.info)
            self._on_best(result)

    # -- reports -------------------------------------------------------------

    def _result(self) -> SearchResult:
        legal = self._board.legal_moves()
        if not legal:
            return SearchResult(None, None, None)
        if self._positioned != self._generation:
            # Stopped before the search thread set up the tree (e.g. an empty clock's watchdog):
            # the tree still holds the previous position.
            allowed = [m for m in legal if not self._go.searchmoves or m in self._go.searchmoves] or legal
            return SearchResult(allowed[0], None, None)
        has_info = bool(self.tree.playouts or self.tree.nodes)
        best = None
        if self.tree.nodes:
            temperature = self.params.temperature
            cutoff = self.params.temp_cutoff_ply
            if cutoff and game_ply(self._board) >= cutoff:
                temperature = 0.0
            best = self.tree.choose_move(temperature) if temperature > 0 else self.tree.best_move()
        allowed = [m for m in legal if not self._go.searchmoves or m in self._go.searchmoves] or legal
        if best is not None and best not in allowed:
            # The tree's best move ignores searchmoves (e.g. a reused tree whose favourite was
            # excluded): play the best move that was allowed, as the info lines report it.
            ranked = [c["move"] for c in self.tree.root_children() if c["move"] in allowed]
            best = ranked[0] if ranked else None
        if best is None or best not in legal:
            best = allowed[0]
            info = self.info(first=best) if has_info else None
            if info is not None and info.lines and info.lines[0].move != best:
                info.lines = []      # the final info's pv must start with the move played
            return SearchResult(best, None, info)
        # The final info's first line is the move played (it differs from the most visited
        # move when Temperature > 0), so that its pv[0] is the bestmove.
        info = self.info(first=best) if has_info else None
        pv = self.tree.pv(best)
        ponder = pv[1] if len(pv) > 1 else None
        return SearchResult(best, ponder, info)

    def _snapshot_result(self) -> SearchResult:
        """The best move (and ponder move) of the last info report, without touching the tree."""
        legal = self._board.legal_moves()
        if not legal:
            return SearchResult(None, None, None)
        allowed = [m for m in legal if not self._go.searchmoves or m in self._go.searchmoves] or legal
        snapshot = self._snapshot
        if snapshot is not None and snapshot[0] in allowed:
            return SearchResult(snapshot[0], snapshot[1], None)
        return SearchResult(allowed[0], None, None)

    def info(self, first: Optional[str] = None) -> Info:
        """The search as it stands (call with the tree lock held or while no search runs).

        ``first``: a root move to report as the first line (the move about to be played).
        """
        tree = self.tree
        elapsed = max(1e-6, time.monotonic() - self._go_start)
        lines = []
        children = tree.root_children() if tree.nodes else []
        if self._go.searchmoves:
            children = [c for c in children if c["move"] in self._go.searchmoves] or children
        if first is not None:
            children = sorted(children, key=lambda c: c["move"] != first)  # stable: the rest keep their order
        for rank, child in enumerate(children[: max(1, self.params.multipv)], start=1):
            if child["n"] == 0 and child["proven"] is None and rank > 1:
                break
            q = child["q"] if child["q"] is not None else -tree.root_q[0]
            d = child["d"] if child["d"] is not None else tree.root_q[1]
            mate = None
            if child["proven"] in (1, -1):
                mate = int(child["proven"] * ((child["m"] + 2) // 2))
            lines.append(Line(rank, child["move"], tree.pv(child["move"]), child["n"], q, d, mate,
                              wdl_permille(q, d)))
        return Info(depth=max(1, int(round(tree.average_depth))), seldepth=max(1, tree.seldepth),
                    nodes=tree.nodes, nps=int(tree.playouts / elapsed), time_ms=int(elapsed * 1000),
                    lines=lines)
