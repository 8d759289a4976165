"""The live display of ``cyzero-train run`` (``make train``) on its terminal.

Three lines, what ``cyzero-train status`` would say in short (the same
:func:`trainer.report.run_status` and :mod:`trainer.estimate`, read from the run's files)::

    self-play  38 games finished, 64 in play; 5.5 positions/s played, games/h measuring
    learner    step 27, 83 samples/s, waiting for games; window 903 positions
    next gen   generation 1 at step 100: measuring until the first 64 games end (38 have)

On a terminal they are tqdm lines updated in place every :data:`REFRESH_S`, and the
daemon's own lines (``published generation 1``, a worker restarted) are written above them;
anywhere else (a log file, a pipe) one plain line is printed every :data:`PLAIN_EVERY_S`.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

from trainer.estimate import duration, learner_rate
from trainer.report import describe_next_generation, describe_selfplay, run_status

REFRESH_S = 2.0        # a terminal's lines are redrawn this often
PLAIN_EVERY_S = 60.0   # elsewhere, one plain line this often


def display_lines(status: dict) -> tuple[str, ...]:
    """The display's lines: self-play, the learner and its window, the next generation."""
    selfplay = status.get("selfplay")
    play = describe_selfplay(selfplay, short=True) if selfplay else "no game yet"
    learner = status.get("learner")
    workers = status.get("workers")
    if not learner and workers and workers.get("learner") is None:
        learn = "none on this machine: a learner elsewhere writes into the run folder (none has yet)"
    elif not learner:
        learn = "not started yet"
    elif learner.get("state") == "stopped":
        learn = f"stopped at step {learner['step']:,}"
    elif learner.get("running") is False:
        learn = f"step {learner['step']:,}: not running (logs/learner.log says why)"
    else:
        rate = learner_rate(learner, status.get("metrics"))
        learn = (f"step {learner['step']:,}, " + (f"{rate:,.0f} samples/s" if rate else "samples/s measuring")
                 + (", waiting for games" if learner.get("state") == "waiting" else "")
                 + (f", exporting generation {learner.get('generation')}" if learner.get("state") == "exporting"
                    else ""))
    window = (status.get("data") or {}).get("window")
    if window is not None:
        learn += f"; window {window:,} positions"
    lines = [f"self-play  {play}", f"learner    {learn}"]
    nxt = status.get("next_generation")
    if nxt:
        lines.append(f"next gen   generation {nxt['generation']} at step {nxt['step']:,}: "
                     f"{describe_next_generation(nxt, status, short=True)}")
    return tuple(lines)


class RunDisplay:
    """The live display of one run on ``stream`` (stderr). :meth:`update` is called often (the
    daemon's loop); it reads the run at most every :data:`REFRESH_S` on a terminal, and prints a
    plain line every ``plain_every_s`` elsewhere. :meth:`write` puts a line above it. ``tty``
    (default: whether ``stream`` is a terminal), ``clock`` and ``read`` (the status reader) are for
    tests. A display that fails says so once and stops: it never stops the run."""

    def __init__(self, run_dir: str, *, stream: TextIO | None = None, tty: bool | None = None,
                 clock: Callable[[], float] = time.time, read: Callable[..., dict] = run_status,
                 plain_every_s: float = PLAIN_EVERY_S):
        self.run_dir = run_dir
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(tty if tty is not None else getattr(self.stream, "isatty", lambda: False)())
        self.clock, self.read, self.plain_every_s = clock, read, plain_every_s
        self.started = clock()
        self._next = self.started + (0.0 if self.tty else plain_every_s)
        self._bars: list[Any] = []
        self._broken = False

    def update(self) -> None:
        now = self.clock()
        if self._broken or now < self._next:
            return
        self._next = now + (REFRESH_S if self.tty else self.plain_every_s)
        try:
            lines = display_lines(self.read(self.run_dir, now=now))
            if self.tty:
                self._draw(lines)
            else:
                self.stream.write(f"{time.strftime('%H:%M:%S', time.localtime(now))} "
                                  f"(+{duration(now - self.started)}) {' | '.join(lines)}\n")
                self.stream.flush()
        except Exception as exc:  # noqa: BLE001 - a display is never worth a run
            self._broken = True
            self.close()
            self.write(f"the live display stopped ({type(exc).__name__}: {exc}); `cyzero-train status RUN` "
                       "shows the same")

    def _draw(self, lines: tuple[str, ...]) -> None:
        if len(self._bars) != len(lines):  # the first draw, or a line came or went (the learner started)
            from tqdm import tqdm

            self.close()
            try:  # a terminal that tells no size (a pty without one, as `script` makes): 160 x 24, not 0 x 0,
                known = os.get_terminal_size(self.stream.fileno()).columns > 0  # where tqdm would hide every line
            except (AttributeError, OSError, ValueError):
                known = False
            self._bars = [tqdm(total=None, bar_format="{desc}", desc=line, position=i, file=self.stream,
                               dynamic_ncols=known, ncols=None if known else 160, nrows=None if known else 24,
                               leave=True)
                          for i, line in enumerate(lines)]
            return
        for bar, line in zip(self._bars, lines):
            bar.set_description_str(line, refresh=True)

    def write(self, line: str) -> None:
        """A line above the display (the daemon's own lines)."""
        if self._bars:
            from tqdm import tqdm

            tqdm.write(line, file=self.stream)
        else:
            self.stream.write(line + "\n")
            self.stream.flush()

    def close(self) -> None:
        """Leave the last lines on the terminal, and stop updating."""
        bars, self._bars = self._bars, []
        for bar in bars:
            bar.close()


__all__ = ["RunDisplay", "display_lines", "REFRESH_S", "PLAIN_EVERY_S"]
