"""SIGTERM and SIGINT as a request to stop cleanly, the one place every command of the trainer
turns them into a stop (torch-free): the first signal sets an event, so the work ends at its next
safe point (a step with its checkpoint, a committed game); a later one interrupts at once."""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable, Iterator

#: The signals that ask a process to stop: systemd's and ``kill``'s, and Ctrl-C.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)

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
def on_signals(handler: Callable[[int], object],
               signals: tuple[int, ...] = STOP_SIGNALS) -> Iterator[None]:
    """``handler(signum)`` runs for each of ``signals`` until the block ends, then the old handlers
    are back. Only in the main thread, where alone Python sets handlers (a test may run the work
    from another)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {sig: signal.signal(sig, lambda signum, frame: handler(signum)) for sig in signals}
    try:
        yield
    finally:
        for sig, previous in old.items():
            signal.signal(sig, previous)


@contextlib.contextmanager
def stop_on_signals(stop: threading.Event, signals: tuple[int, ...] = STOP_SIGNALS, *,
                    interrupt_again: bool = True) -> Iterator[None]:
    """``signals`` set ``stop`` instead of killing the process; with ``interrupt_again`` a second
    one interrupts at once (:class:`StopSignals`), without it the work's own stop is the only one
    (a worker, the ladder: what they hold is safe as soon as they stop)."""
    signals_seen = StopSignals()

    def handler(signum: int) -> None:
        if interrupt_again:
            signals_seen.is_first()
        stop.set()

    with on_signals(handler, signals):
        yield
