"""A command whose reader went away (``cyzero-train status RUN | head``) stops quietly, as Unix
tools do, instead of printing an error about a broken pipe or a traceback.

Only stdout's own reader counts: a broken pipe to a child process (an engine that died) is still an
error for the command to report.
"""

from __future__ import annotations

import functools
import os
import select
import sys
from typing import Callable, TypeVar

__all__ = ["SIGPIPE_EXIT", "quiet_when_reader_gone", "reader_gone"]

#: The status a shell reports for a tool that SIGPIPE ended (128 + 13).
SIGPIPE_EXIT = 141

Main = TypeVar("Main", bound=Callable[..., int])


def reader_gone(exc: BaseException) -> bool:
    """Whether ``exc`` is a broken pipe and stdout is a pipe whose reading end is closed."""
    if not isinstance(exc, BrokenPipeError):
        return False
    try:
        fd = sys.__stdout__.fileno()
    except (AttributeError, ValueError, OSError):
        return False
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(events & select.POLLERR for _, events in poller.poll(0))


def quiet_when_reader_gone(main: Main) -> Main:
    """Wrap a command's ``main``: its output is flushed before it returns, and a closed stdout ends it
    with :data:`SIGPIPE_EXIT` and nothing on stderr (stdout is pointed at /dev/null, so the
    interpreter's last flush has nowhere to fail)."""

    @functools.wraps(main)
    def run(*args, **kwargs) -> int:
        try:
            code = main(*args, **kwargs)
            sys.stdout.flush()
            return code
        except BrokenPipeError as exc:
            if not reader_gone(exc):
                raise
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.__stdout__.fileno())
            os.close(devnull)
            return SIGPIPE_EXIT

    return run  # type: ignore[return-value]
