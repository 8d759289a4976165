"""trainer.lifeline: a child ends with the process that started it, even one already gone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from trainer import EXIT_WITH_PARENT_ENV
from trainer.lifeline import Watched

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _wait_for(predicate, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])


def _reap(*procs: subprocess.Popen) -> None:
    for proc in procs:
        proc.kill()
        proc.wait()
        if proc.stdout:
            proc.stdout.close()


def _gone_pid() -> int:
    """The pid of a process that has exited and been reaped."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _child(body: str, ready: bool = True, **env: str) -> subprocess.Popen:
    """A Python child that runs ``body`` (a watch), says "ready" and sleeps; with ``ready``, once
    it has said so."""
    code = textwrap.dedent(body) + "\nprint('ready', flush=True)\nimport time\ntime.sleep(120)\n"
    child = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, env=dict(os.environ, **env),
                             stdout=subprocess.PIPE, text=True)
    if ready:
        assert child.stdout.readline().strip() == "ready"
    return child


@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="pidfds are Linux's (5.3+)")
def test_a_watch_sees_a_sigkilled_process_gone_while_its_pid_still_answers():
    """A SIGKILLed learner's pid answers kill(pid, 0) until it is reaped (and, reaped, may be
    given to another process): the watch a rank keeps on its learner must not go by the pid."""
    learner = _sleeper()
    try:
        watched = Watched(learner.pid)
        assert watched.alive()
        learner.kill()
        _wait_for(lambda: not watched.alive(), "the watch to see the SIGKILLed process gone", 30.0)
        os.kill(learner.pid, 0)   # still answers: a zombie, not yet reaped
    finally:
        _reap(learner)


def test_end_with_ends_the_child_once_its_parent_is_gone_and_not_before():
    parent = _sleeper()
    child = _child(f"from trainer.lifeline import end_with\nend_with({parent.pid}, interval=0.05)")
    try:
        time.sleep(0.5)   # ten checks of a live parent
        assert child.poll() is None, "the child ended while its parent lived"
        parent.kill()
        assert child.wait(timeout=60) == 1
    finally:
        _reap(parent, child)


def test_end_with_a_parent_gone_before_the_watch_began_ends_the_child():
    """The hang it was written for: a bench killed while its child was still starting. The child's
    getppid() named init by then, and a watch begun from getppid() watched init for good."""
    child = _child(f"from trainer.lifeline import end_with\nend_with({_gone_pid()}, interval=0.05)", ready=False)
    try:
        assert child.wait(timeout=60) == 1
    finally:
        _reap(child)


def test_a_daemon_child_is_sigtermed_when_the_daemon_it_names_is_gone():
    """``cyzero-train`` under the daemon (EXIT_WITH_PARENT_ENV = the daemon's pid) stops as on
    SIGTERM, the clean stop that keeps a learner's last checkpoint, once the daemon is gone."""
    daemon = _sleeper()
    child = _child("from trainer.cli import _stop_with_parent\n_stop_with_parent()",
                   **{EXIT_WITH_PARENT_ENV: str(daemon.pid)})
    try:
        daemon.kill()
        assert child.wait(timeout=60) == -signal.SIGTERM
    finally:
        _reap(daemon, child)


def test_a_cyzero_train_outside_the_daemon_watches_nothing():
    child = _child("from trainer.cli import _stop_with_parent\n_stop_with_parent()",
                   **{EXIT_WITH_PARENT_ENV: "not a pid"})
    try:
        time.sleep(0.5)
        assert child.poll() is None
    finally:
        _reap(child)
