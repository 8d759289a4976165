"""Child processes that end with the process that started them.

The daemon's workers and learner, the learner's ranks and the self-play bench's measuring
processes each watch the process that started them, so a SIGKILLed parent leaves nothing
behind training, holding a run's files, or holding a test's stdout.

Two rules, each learnt from a hang:

- The parent names itself (its pid, passed down), rather than the child reading
  ``os.getppid()`` once it runs: a parent killed while the child was still starting had
  left it an orphan whose ``getppid()`` already named init, and it watched init for good.
- The watch goes by a pidfd where Linux has one, not by the pid (:class:`Watched`).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

from trainer.rundir import pid_alive


class Watched:
    """One process, watched until it exits: through a pidfd where Linux has them, else by its pid.

    A pid outlives its process: a SIGKILLed learner stays a zombie until it is reaped, and then its
    pid may be taken by another process. Once it was taken by a kernel thread, and a finished CPU
    rank, whose parent (the forkserver) lived on, waited 90 minutes for a learner long gone. A pidfd
    names the process itself, and reads as ended as soon as it exits."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._fd: int | None = None
        self._gone = False
        try:
            self._fd = os.pidfd_open(pid)
        except ProcessLookupError:
            self._gone = True
        except (AttributeError, OSError):  # no pidfd here (not Linux 5.3+): the pid it is
            pass

    def alive(self) -> bool:
        if self._gone:
            return False
        if self._fd is not None:
            import select

            self._gone = bool(select.select([self._fd], [], [], 0)[0])
            return not self._gone
        return pid_alive(self.pid) is not False  # unknown counts as alive, as another user's process does


def _exit_now() -> None:
    os._exit(1)


def end_with(parent: int, stop: Callable[[], None] = _exit_now, interval: float = 1.0) -> None:
    """Call ``stop`` (by default: end this process outright) once process ``parent`` has exited,
    from a daemon thread that checks every ``interval`` seconds. A parent already gone when this
    is called counts as exited."""
    watched = Watched(parent)

    def watch() -> None:
        while watched.alive():
            time.sleep(interval)
        stop()

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()
