"""The network in use, the verified candidate waiting to replace it, and the loader between them.

Watchers (:mod:`engine.watchers`) :meth:`NetworkSwap.propose` a new network;
one loader thread builds and verifies proposals one at a time (the newest
proposal wins); a verified candidate waits until the UCI layer calls
:meth:`NetworkSwap.apply_pending` between searches.  A search in progress
keeps the network it started with (``get()`` hands out a reference; nothing
here closes a network that was handed out).  A proposal that fails is
refused with one log line, the old network stays, and the same proposal
(its ``key``) is not tried again.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
from typing import Any, Callable, Optional

from engine.network import NetworkError
from engine.weights import Candidate, NoNetworkError, close_quietly, without_file_name

__all__ = ["NetworkSwap", "Proposal"]

_REFUSALS_KEPT = 64


@dataclasses.dataclass
class Proposal:
    """A network a watcher would like to use.

    ``key`` is what is remembered when it is refused (the same bad file or
    announcement is not tried twice).  ``fetch(stop)``, when given, returns a
    local file with the bytes (a daemon's network on another host) and is run
    on the loader thread.  ``superseded()``, when given, is asked after a
    failure: true means the source changed meanwhile and will propose again,
    so the failure is not a refusal (a file still being written).

    A *reload* (``load``, a zero-argument builder of the candidate) is the network
    in use built again with new settings (UCI ``Backend``, ``Threads``...): it
    runs on the loader like any proposal, is never displaced from the queue by a
    watcher's proposal (the watcher proposes again; the reload reads the file as
    it is then), and its failure is said with ``failed(reason)``.
    """

    path: str
    sha256: Optional[str]
    key: tuple
    generation: Optional[int] = None
    run: Optional[str] = None
    fetch: Optional[Callable[[threading.Event], str]] = None
    superseded: Optional[Callable[[], bool]] = None
    load: Optional[Callable[[], Candidate]] = None
    failed: Optional[Callable[[str], str]] = None


class NetworkSwap:
    """Holds the network in use and swaps in verified candidates between searches.

    ``first_load()`` returns the first :class:`Candidate` (the ``WeightsFile``);
    ``build(path, sha256, generation=, run=, reported_path=)`` builds a
    proposal's candidate (:meth:`engine.weights.NetworkBuilder.build`).
    ``fallback``: a network to keep (said once) when ``first_load`` fails, such
    as the one loaded before a ``WeightsFile`` change.  ``log`` is called from
    any thread.
    """

    def __init__(
        self,
        first_load: Callable[[], Candidate],
        build: Callable[..., Candidate],
        log: Callable[[str], object],
        fallback: Optional[Candidate] = None,
    ) -> None:
        self._first_load = first_load
        self._build = build
        self._log = log
        self.fallback = fallback
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._first_load_lock = threading.Lock()
        self.stop = threading.Event()  # set by close(); long work (a fetch) watches it
        self._current: Optional[Candidate] = None
        self._pending: Optional[Candidate] = None
        self._next: Optional[Proposal] = None  # the newest proposal (newest wins)
        self._loading: Optional[Proposal] = None
        self._refused: collections.OrderedDict[tuple, None] = collections.OrderedDict()
        self.loader_thread: Optional[threading.Thread] = None

    # ------------------------------------------------------------------ the network in use

    @property
    def current(self) -> Optional[Candidate]:
        """The network in use (still readable after :meth:`close`: a search may hold it)."""
        return self._current

    @property
    def closed(self) -> bool:
        return self.stop.is_set()

    def get(self) -> Any:
        """The network in use, loaded (and verified) on the first call.

        Raises :class:`engine.weights.NoNetworkError` when there is none to
        use; the next call tries again.  Thread-safe.
        """
        with self._lock:
            self._check_open()
            if self._current is not None:
                return self._current.network
        with self._first_load_lock:
            with self._lock:
                self._check_open()
                if self._current is not None:
                    return self._current.network
                if self._pending is not None:  # a trainer's network verified before the first use
                    self._current, self._pending = self._pending, None
                    loaded = self._current
                else:
                    loaded = None
            kept = False
            if loaded is None:
                try:
                    loaded = self._first_load()
                except (NetworkError, ValueError, OSError) as e:
                    if self.fallback is None:
                        raise NoNetworkError(str(e)) from None
                    loaded, kept = self.fallback, True
                    self._say(f"{e}; keeping network {loaded.label()}")
                with self._lock:
                    if self.closed:
                        if not kept:
                            close_quietly(loaded.network)
                        self._check_open()
                    self._current = loaded
            if not kept:
                self._say(f"loaded network {loaded.label(long=True)}")
            return loaded.network

    def swap_pending(self) -> bool:
        """Whether a verified network is waiting for :meth:`apply_pending`."""
        with self._lock:
            return self._pending is not None and not self.closed

    def apply_pending(self, clear_cache: Optional[Callable[[], object]] = None) -> bool:
        """Install the verified candidate, if any; call between searches only.  Returns whether it swapped.

        ``clear_cache`` (e.g. ``Searcher.network_changed``) is called after the
        swap, before the line that says so.
        """
        with self._lock:
            candidate = self._pending
            if candidate is None or self.closed:
                return False
            self._pending = None
            self._current = candidate
        if clear_cache is not None:
            clear_cache()
        self._say(
            f"switched to network {candidate.label(long=True)}"
            + ("; search cache cleared" if clear_cache is not None else "")
        )
        return True

    def wait_pending(self, timeout: Optional[float] = None) -> bool:
        """Block until a candidate is pending (or ``timeout`` seconds pass); returns :meth:`swap_pending`."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._pending is None and not self.closed:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                self._cond.wait(left)
            return self._pending is not None and not self.closed

    def keeping(self) -> str:
        """``"; keeping <network>"`` for a refusal line ("" before the first load)."""
        current = self._current
        return "" if current is None else f"; keeping {current.label()}"

    # ------------------------------------------------------------------ proposals

    def propose(self, proposal: Proposal) -> bool:
        """Queue ``proposal`` for the loader; returns whether it was queued.

        Not queued: the same proposal was refused before, its network is in
        use, pending or loading (by sha256), or, for a daemon's generation, a
        generation at least as new is, or a reload is waiting. A reload replaces
        whatever waits.
        """
        with self._cond:
            if self.closed or proposal.key in self._refused:
                return False
            if proposal.load is None:
                if self._next is not None and self._next.load is not None:
                    return False    # a reload waits: it builds what is in use, with the new settings
                if proposal.generation is not None:
                    newest = self.newest_generation()
                    if newest is not None and proposal.generation <= newest:
                        return False
                elif proposal.sha256 is not None and self.knows(proposal.sha256):
                    return False
            self._next = proposal
            if self.loader_thread is None:
                self.loader_thread = threading.Thread(target=self._load_loop, name="cyzero-weights-load",
                                                      daemon=True)
                self.loader_thread.start()
            self._cond.notify_all()
            return True

    def knows(self, sha256: str) -> bool:
        """Whether that network is in use, pending, loading or about to load."""
        with self._lock:
            return any(
                slot is not None and slot.sha256 == sha256
                for slot in (self._current, self._pending, self._loading, self._next)
            )

    def newest_generation(self) -> Optional[int]:
        """The newest daemon generation in use, pending, loading or about to load."""
        with self._lock:
            generations = [
                slot.generation
                for slot in (self._current, self._pending, self._loading, self._next)
                if slot is not None and slot.generation is not None
            ]
        return max(generations, default=None)

    def reloading(self) -> bool:
        """Whether a reload (:class:`Proposal` ``load``) is waiting or being built."""
        with self._lock:
            return any(slot is not None and slot.load is not None for slot in (self._next, self._loading))

    def wait_reloaded(self, timeout: Optional[float] = None) -> bool:
        """Block until no reload is waiting or being built (or ``timeout`` passes); returns whether
        none is. What a reload built is then pending, or it was refused and said so."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self.reloading() and not self.closed:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(left)
            return True

    def was_refused(self, key: tuple) -> bool:
        with self._lock:
            return key in self._refused

    def refuse(self, key: tuple) -> None:
        """Remember a refusal (the caller says why): that proposal is not tried again."""
        with self._lock:
            self._refused[key] = None
            while len(self._refused) > _REFUSALS_KEPT:
                self._refused.popitem(last=False)

    # ------------------------------------------------------------------ the loader

    def _load_loop(self) -> None:
        while True:
            with self._cond:
                while self._next is None and not self.closed:
                    self._cond.wait()
                proposal = self._next
                if self.closed or proposal is None:
                    return
                self._next = None
                self._loading = proposal
            try:
                self._process(proposal)
            except Exception as e:  # noqa: BLE001 - the loader thread must survive anything
                self._say(f"error while loading network {proposal.path}: {type(e).__name__}: {e}")
            finally:
                with self._cond:
                    self._loading = None
                    self._cond.notify_all()    # wait_reloaded

    def _process(self, p: Proposal) -> None:
        if p.load is not None:
            self._reload(p)
            return
        with self._lock:
            have = next(
                (s for s in (self._current, self._pending) if s is not None and s.sha256 == p.sha256), None
            )
            if have is not None and p.generation is not None:
                # Already have it (a daemon announcing the file the watcher saw, say): take the generation.
                have.generation, have.run = p.generation, p.run
        if have is not None:
            if have is self._current and p.generation is not None:
                self._say(f"the network in use is {have.label()}")
            return
        local = p.path
        try:
            if p.fetch is not None:
                local = p.fetch(self.stop)
            candidate = self._build(local, p.sha256, generation=p.generation, run=p.run, reported_path=p.path)
        except Exception as e:  # noqa: BLE001 - NetworkError, or anything ONNX Runtime raises
            if self.closed or (p.superseded is not None and p.superseded()):
                return
            reason = str(e) if isinstance(e, NetworkError) else f"{type(e).__name__}: {e}"
            self.refuse(p.key)
            what = "" if p.generation is None else f" (generation {p.generation})"
            reason = without_file_name(without_file_name(reason, local), p.path)
            self._say(f"refused network {p.path}{what}: {reason}{self.keeping()}")
            return
        if self._offer(candidate):
            self._say(f"new network {candidate.label()} verified; switching before the next search")

    def _reload(self, p: Proposal) -> None:
        """Build a reload; said only when it fails (the switch says which network it is)."""
        try:
            candidate = p.load()
        except Exception as e:  # noqa: BLE001 - NetworkError, or anything ONNX Runtime raises
            if self.closed:
                return
            reason = str(e) if isinstance(e, (NetworkError, ValueError, OSError)) else f"{type(e).__name__}: {e}"
            self.refuse(p.key)
            self._say(p.failed(reason) if p.failed is not None else f"refused network {p.path}: {reason}"
                      f"{self.keeping()}")
            return
        self._offer(candidate)

    def _offer(self, candidate: Candidate) -> bool:
        """Make ``candidate`` the pending network (dropping an older pending one); False once closed."""
        replaced: Optional[Candidate]
        with self._cond:
            if self.closed:
                replaced = candidate
            else:
                replaced, self._pending = self._pending, candidate
                self._cond.notify_all()
        if replaced is not None:
            close_quietly(replaced.network)  # never handed out
        return replaced is not candidate

    # ------------------------------------------------------------------ closing

    def close(self, timeout: float = 1.0) -> None:
        """Stop the loader and drop a pending candidate; the network in use stays readable.

        A load in progress (a TensorRT engine build can take minutes) cannot be
        interrupted: it is left to finish on its daemon thread and dropped.
        Idempotent.
        """
        with self._cond:
            if self.closed:
                return
            self.stop.set()
            pending, self._pending, self._next = self._pending, None, None
            loading = self._loading is not None
            self._cond.notify_all()
        thread = self.loader_thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(min(timeout, 0.05) if loading else timeout)
        if pending is not None:
            close_quietly(pending.network)

    def _check_open(self) -> None:
        if self.closed:
            raise RuntimeError("the network manager is closed")

    def _say(self, text: str) -> None:
        try:
            self._log(text)
        except Exception:  # noqa: BLE001 - a broken log callable must not kill a thread
            pass
