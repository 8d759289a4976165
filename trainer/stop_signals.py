"""SIGTERM and SIGINT as a request to stop cleanly, shared by the learner's ranks and the
labelling (torch-free): the first signal sets an event, so the work ends at its next safe
point (a step with its checkpoint, a committed game); a later one interrupts at once."""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Iterator

#: A stop signal this soon after the first is the same stop delivered twice: a signal to the
#: whole process group (``timeout``, ``kill -- -PGID``, systemd) reaches the learner's spawning
#: parent twice from ``timeout`` and a spawned rank twice (the group's and the parent's forward).
REPEATED_SIGNAL_S = 1.0


class StopSignals:
    """The stop signals a process has had: the first asks for a clean stop; another,
    :data:`REPEATED_SIGNAL_S` or more later, for a stop at once."""

    def __init__(self) -> None:
        self.first: float | None = None

    def is_first(self) -> bool:
        """Whether this signal is the first; raises KeyboardInterrupt if it is a later, second stop."""
        now = time.monotonic()
        if self.first is None:
            self.first = now
            return True
        if now - self.first >= REPEATED_SIGNAL_S:
            raise KeyboardInterrupt
        return False


@contextlib.contextmanager
def stop_on_signals(stop: threading.Event,
                    signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT)) -> Iterator[None]:
    """``signals`` set ``stop`` instead of killing the process; a second one interrupts at once
    (:class:`StopSignals`). Only in the main thread (a test may run the work from another)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    signals_seen = StopSignals()

    def handler(signum, frame):
        signals_seen.is_first()
        stop.set()

    old = {sig: signal.signal(sig, handler) for sig in signals}
    try:
        yield
    finally:
        for sig, previous in old.items():
            signal.signal(sig, previous)
