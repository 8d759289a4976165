"""The two searches that run the driver: the UCI search and self-play's many games.

The parts (docs/architecture.md): :mod:`engine.move_search` is one tree's
search of one move (budget, stop rules, the move chosen), :mod:`engine.driver`
the batched loop gather -> evaluate -> backup over any number of them, and
:mod:`engine.search_report` what a search reports. Here:

* :class:`Searcher` is the UCI search: one move search on its own thread,
  with ``stop``, ``ponderhit``, a watchdog for the hard deadline and info
  callbacks. Nothing here touches stdout: only ``uci/`` writes protocol text.
* :class:`MultiSearch` is what a self-play worker calls: many games, one tree
  each, searched together.
* :func:`search_batch` and :func:`default_pipeline`: the batch size and the
  pipelining the backend calls for.

``stop`` is answered from the tree at once, never after the batch in flight:
the search thread holds ``_tree_lock`` only while it gathers or backs up (the
network call runs outside it), so :meth:`Searcher.stop` can read the best
move while the network is busy and the thread's later results are dropped.
"""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from typing import Any, Callable, Hashable, Mapping, Optional, Sequence, Union

from engine.board import Board
from engine.driver import Driver, EvalSpeed
from engine.limits import GoParams
from engine.move_search import CPU_MINIBATCH, MoveSearch, root_tree
from engine.params import SearchParams
from engine.search_report import Info, Line, SearchResult, wdl_permille
from engine.timeman import TimeManager
from engine.tree import NNCache, Tree

__all__ = ["MultiSearch", "Searcher", "default_pipeline", "search_batch"]

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


def _reason(exc: BaseException) -> str:
    """An exception as one line of a report (its message, else its type)."""
    return str(exc) or type(exc).__name__


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
                # The snapshot before the report: a stop that finds the tree lock held (this thread,
                # writing the line to a slow stdout) plays the snapshot's move, and found none here
                # (the first round's line half written) it evaluated the root again to play the
                # policy's move, "not searched", though the line the GUI then read had searched it.
                pv = info.lines[0].pv if info.lines and info.lines[0].move == best else []
                self._snapshot = (best, pv[1] if len(pv) > 1 else None) if best else None
                self._on_info(info)

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
