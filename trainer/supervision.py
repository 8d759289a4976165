"""The daemon's child processes, without torch: the local self-play workers, the learner and the
strength ladder, each started, watched, restarted after a backoff when it exits or (a worker) falls
silent, and stopped with the daemon. What each child runs is the daemon's to say
(``Daemon.worker_command`` and its siblings); how it is kept running is said here, once."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from typing import Any, Callable, Mapping, Optional, Protocol

from trainer import EXIT_WITH_PARENT_ENV

__all__ = ["Child", "Supervisor", "STOP_WAIT_S"]

Log = Callable[[str], Any]

STOP_WAIT_S = 90.0  # children's time to stop cleanly (the learner's final checkpoint and export)
MAX_BACKOFF_S = 60.0
QUICK_DEATH_S = 60.0  # a child dying sooner after its start doubles its next backoff
SUPERVISE_EVERY_S = 0.2  # the daemon's loop looks at its children this often


class Child:
    """A supervised process (a local worker, the learner or the ladder): started, watched, restarted with backoff."""

    def __init__(self, name: str, command: list[str], log_path: str, base_backoff: float,
                 env: Optional[dict[str, str]] = None):
        self.name, self.command, self.log_path = name, command, log_path
        self.env = env or {}  # added to the daemon's environment
        self.cores: Optional[set[int]] = None  # its CPU affinity (None: the daemon's)
        self.base_backoff = base_backoff
        self.backoff = base_backoff
        self.proc: Optional[subprocess.Popen] = None
        self.started = 0.0  # monotonic
        self.started_wall = 0.0
        self.next_start: Optional[float] = 0.0  # monotonic; None: not to be restarted (stopping)
        self.restarts = 0
        self.spawned = 0

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def spawn(self) -> None:
        os.makedirs(os.path.dirname(self.log_path), exist_ok=True)
        with open(self.log_path, "ab") as out:  # the child holds its own descriptor
            # EXIT_WITH_PARENT_ENV: a SIGKILLed daemon leaves no worker or learner behind
            env = dict(os.environ, PYTHONUNBUFFERED="1", **self.env, **{EXIT_WITH_PARENT_ENV: str(os.getpid())})
            self.proc = subprocess.Popen(self.command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                         env=env, start_new_session=True)  # the daemon orders its stop
        if self.cores is not None:  # at once: the threads and processes it starts inherit it
            try:
                os.sched_setaffinity(self.proc.pid, self.cores)
            except OSError:
                pass  # it has just exited; the supervisor sees it
        if self.spawned:
            self.restarts += 1
        self.spawned += 1
        self.started, self.started_wall = time.monotonic(), time.time()
        self.next_start = None

    def died(self, now: float) -> float:
        """Schedule the restart after a death; returns the wait."""
        quick = now - self.started < QUICK_DEATH_S
        wait = self.backoff if quick else self.base_backoff
        self.backoff = min(wait * 2, MAX_BACKOFF_S) if quick else self.base_backoff
        self.proc = None
        self.next_start = now + wait
        return wait

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.proc.send_signal(sig)
            except ProcessLookupError:
                pass


class HeardFrom(Protocol):
    """What the supervisor reads and writes of a worker the daemon knows (``trainer.ingest.Worker``)."""

    last_heard: float  # monotonic
    pid: int
    started: float  # unix time


class Supervisor:
    """The daemon's children: ``workers`` (the local workers' children by worker id), ``learner`` and
    ``ladder`` (None when not started here). ``heard`` is the daemon's record of each worker id, read
    to kill a local worker silent for ``heartbeat_timeout_s`` and given its pid at each start."""

    def __init__(self, run_dir: str, log: Log, heartbeat_timeout_s: float, heard: Mapping[str, HeardFrom]):
        self.run_dir, self.log, self.heartbeat_timeout_s, self.heard = run_dir, log, heartbeat_timeout_s, heard
        self.workers: dict[str, Child] = {}
        self.learner: Optional[Child] = None
        self.ladder: Optional[Child] = None  # the strength ladder (trainer.evaluate --follow)

    def children(self) -> list[Child]:
        return list(self.workers.values()) + [child for child in (self.learner, self.ladder) if child is not None]

    def supervise(self) -> None:
        """Start what is due, notice deaths and silent workers, schedule restarts."""
        now = time.monotonic()
        timeout = self.heartbeat_timeout_s
        for child in self.children():
            if child.proc is not None:
                code = child.proc.poll()
                if code is None:
                    worker = self.heard.get(child.name)
                    if worker is not None and now - max(worker.last_heard, child.started) > timeout:
                        pid = child.proc.pid
                        child.proc.kill()
                        child.proc.wait()
                        wait = child.died(now)
                        self.log(f"{child.name} (pid {pid}) silent for {timeout:g} s: killed, restart in {wait:g} s")
                    continue
                pid = child.proc.pid
                wait = child.died(now)
                self.log(f"{child.name} (pid {pid}) exited with code {code}: restart in {wait:g} s "
                         f"(see {os.path.relpath(child.log_path, self.run_dir)})")
            if child.next_start is not None and now >= child.next_start:
                try:
                    child.spawn()
                except OSError as e:
                    wait = child.died(now)
                    self.log(f"cannot start {child.name}: {e}; retry in {wait:g} s")
                    continue
                worker = self.heard.get(child.name)
                if worker is not None:
                    worker.pid = child.proc.pid if child.proc else 0
                    worker.started = child.started_wall
                if child.restarts:
                    self.log(f"{child.name} restarted (pid {child.proc.pid if child.proc else '?'}, "
                             f"restart {child.restarts})")

    def kill(self) -> None:
        """SIGKILL to every child at once (a second stop signal)."""
        for child in self.children():
            child.signal(signal.SIGKILL)

    def stop(self, meanwhile: Callable[[], None], hurry: threading.Event) -> None:
        """SIGTERM to every child, ``meanwhile()`` called again and again while any runs (for
        :data:`STOP_WAIT_S` at most, not once ``hurry`` is set), then SIGKILL to those left; returns
        once all have exited."""
        children = self.children()
        for child in children:
            child.next_start = None
            child.signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_WAIT_S
        while any(c.alive() for c in children) and time.monotonic() < deadline and not hurry.is_set():
            meanwhile()
        for child in children:
            if child.alive():
                self.log(f"{child.name} did not stop in {STOP_WAIT_S:g} s: killed")
                child.signal(signal.SIGKILL)
            if child.proc is not None:
                child.proc.wait()

    def kill_leftovers(self) -> None:
        """Kill and reap any child still running (a failed start leaves none behind)."""
        for child in self.children():
            if child.proc is not None and child.proc.poll() is None:
                child.proc.kill()
                child.proc.wait()
