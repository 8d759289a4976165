"""The batched loop: gather -> evaluate -> backup for any number of move searches.

:class:`Driver` puts the leaves of every active :class:`~engine.move_search.MoveSearch`
into one :class:`~engine.tree.Batch`, has one network call evaluate them, and
hands each tree its rows in the backup. With ``pipeline`` it keeps two batches in
flight (the network runs on a helper thread while the next batch is gathered;
ONNX Runtime releases the GIL). Timed searches get batches sized from the time
left and the network's speed as :class:`EvalSpeed` measures it while the search
runs, so that a short search still gets many batches. Both the UCI search and
self-play (:mod:`engine.search`) run it.
"""

from __future__ import annotations

import contextlib
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

from engine.move_search import MoveSearch
from engine.tree import Batch

__all__ = ["BATCHES_PER_BUDGET", "FIRST_TIMED_BATCH", "SHARED_WAIT_S", "Driver", "EvalSpeed"]

# A timed search plans at least this many batches into its time (fewer, larger ones
# leave a short search with a handful of nodes and a long tail at the deadline).
BATCHES_PER_BUDGET = 8
# The batch of a timed search before the network's speed has been measured once.
FIRST_TIMED_BATCH = 16
# A search thread with nothing to gather (another's batch holds the leaves) waits at most this
# long for that backup before it looks again (a stop is seen within this time).
SHARED_WAIT_S = 0.005


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

