"""The real daemon under ``cyzero-train bench fleet``: started (or attached to), watched, killed and started again.

``cyzero-train run RUN`` with no local worker and no learner, started here (``--profile``: under
cProfile) or one already serving a run this bench made (``--attach``); ``--kill-at`` SIGKILLs it
under load and starts it again on its ports. psutil samples its CPU and resident memory and this
process's own; /proc gives its CPU by thread and its peak memory (VmHWM), which the followers reset
for each generation's fetches.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Optional

import numpy as np
import psutil

from trainer import EXIT_WITH_PARENT_ENV
from trainer.atomic import atomic_write_text

if TYPE_CHECKING:
    from trainer.fleet_workers import Fleet

__all__ = ["BENCH_CONFIG", "SAMPLE_S", "DaemonProcess", "Restart", "Sampler", "peak_rss", "proc_bytes",
           "profile_by_function", "reset_peak_rss", "thread_cpu"]

BENCH_CONFIG = "bench-fleet.toml"  # the started daemon's config in RUN; it marks a run the bench made
START_TIMEOUT_S = 600.0   # the daemon's start: torch's import and generation 0's export
STOP_TIMEOUT_S = 120.0    # a SIGINT'ed daemon must be gone by then
SAMPLE_S = 0.25           # the daemon's memory sampled this often (its CPU every fourth sample)


def proc_bytes(pid: int, field: str) -> Optional[int]:
    """A size line of ``/proc/PID/status`` (``VmRSS``, ``VmHWM``: the peak) in bytes; None where there is none."""
    try:
        with open(f"/proc/{pid}/status", encoding="utf-8") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


_cleared_peaks: dict[int, int] = {}  # pid -> the largest VmHWM that reset_peak_rss cleared


def reset_peak_rss(pid: int) -> bool:
    """Make the process's peak resident memory (VmHWM) its present one (Linux: ``5`` into clear_refs), to
    measure a stretch of its life; :func:`peak_rss` still knows the peak before."""
    peak = proc_bytes(pid, "VmHWM")
    try:
        with open(f"/proc/{pid}/clear_refs", "w", encoding="ascii") as f:
            f.write("5")
    except OSError:
        return False
    if peak is not None:
        _cleared_peaks[pid] = max(peak, _cleared_peaks.get(pid, 0))
    return True


def peak_rss(pid: int) -> Optional[int]:
    """The process's peak resident memory over its life, in bytes, including what a reset here cleared."""
    peak = proc_bytes(pid, "VmHWM")
    return None if peak is None else max(peak, _cleared_peaks.get(pid, 0))


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds of a process's threads by kind: its main thread (the daemon's loop: receive, decode,
    store, ack), ZeroMQ's I/O threads, and its other threads (the announcer, which serves fetches)."""
    out: collections.Counter[str] = collections.Counter()
    try:
        threads = psutil.Process(pid).threads()
    except psutil.Error:
        return {}
    for thread in threads:
        try:
            with open(f"/proc/{pid}/task/{thread.id}/comm", encoding="utf-8") as f:
                comm = f.read().strip()
        except OSError:
            comm = "?"
        kind = ("main thread" if thread.id == pid else "ZeroMQ threads" if comm.startswith("ZMQbg")
                else "other threads")
        out[kind] += thread.user_time + thread.system_time
    return dict(out)


class Sampler:
    """The daemon's resident memory every SAMPLE_S, and its CPU, this process's and the fleet thread's
    every fourth sample (percent of one core), on a thread of its own."""

    def __init__(self, pid: int, fleet_thread: int) -> None:
        self.daemon = psutil.Process(pid)
        self.me = psutil.Process()
        self.fleet_thread = fleet_thread
        self.rss: list[tuple[float, int]] = []
        self.cpu: list[tuple[float, float, float, float, float]] = []   # t, daemon, bench, fleet thread, machine
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="bench-fleet-sampler", daemon=True)
        self.thread.start()

    def _thread_time(self) -> float:
        return next((t.user_time + t.system_time for t in self.me.threads() if t.id == self.fleet_thread), 0.0)

    def _run(self) -> None:
        self.daemon.cpu_percent(None)
        self.me.cpu_percent(None)
        psutil.cpu_percent(None)
        last, last_thread = time.monotonic(), self._thread_time()
        k = 0
        while not self._stop.wait(SAMPLE_S):
            now = time.monotonic()
            try:
                self.rss.append((now, self.daemon.memory_info().rss))
                k += 1
                if k % 4 == 0:
                    thread = self._thread_time()
                    self.cpu.append((now, self.daemon.cpu_percent(None), self.me.cpu_percent(None),
                                     100.0 * (thread - last_thread) / max(now - last, 1e-6), psutil.cpu_percent(None)))
                    last, last_thread = now, thread
            except psutil.Error:
                continue  # the daemon is gone (the main loop sees it too) or killed and starting again

    def follow(self, pid: int) -> None:
        """Sample this daemon from now on (the one started again after a kill)."""
        daemon = psutil.Process(pid)
        daemon.cpu_percent(None)
        self.daemon = daemon

    def close(self) -> None:
        self._stop.set()
        self.thread.join(5.0)


class DaemonProcess:
    """``cyzero-train run RUN`` started here with no local worker and no learner (or one attached to)."""

    def __init__(self, run_dir: str, *, attach: bool, profile: Optional[str], log: Callable[[str], None],
                 port: Optional[str] = "auto") -> None:
        self.run_dir, self.log = run_dir, log
        self.proc: Optional[subprocess.Popen] = None
        self.profile = profile
        self.stderr_path = os.path.join(run_dir, "logs", "bench-fleet-daemon.stderr")
        self.started_s = 0.0
        self.info: dict = {}  # RUN/daemon.json: its pid and endpoints
        if attach:
            info = self._daemon_json()
            if info is None or not psutil.pid_exists(info["pid"]):
                raise ValueError(f"--attach: no daemon serves {run_dir} (its daemon.json names no running process)")
            self.info = info
            return
        command = [sys.executable] + (["-m", "cProfile", "-o", profile] if profile else []) + [
            "-m", "trainer.cli", "run", run_dir, *(["--port", port] if port else []), "--config",
            os.path.join(run_dir, BENCH_CONFIG), "--devices", "cpu", "--workers-per-device", "0",
            "--learner-devices", "none"]
        os.makedirs(os.path.dirname(self.stderr_path), exist_ok=True)
        start = time.monotonic()
        with open(self.stderr_path, "ab") as err:
            self.proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=err, stderr=err,
                                         env={**os.environ, EXIT_WITH_PARENT_ENV: str(os.getpid())})
        log(f"started the daemon (pid {self.proc.pid}{', under cProfile' if profile else ''}); waiting for it to serve "
            f"(generation 0 is made first)")
        while True:
            info = self._daemon_json()
            if info is not None and info.get("pid") == self.proc.pid:
                self.info = info
                break
            if self.proc.poll() is not None:
                raise RuntimeError(f"the daemon exited with code {self.proc.returncode} before serving: "
                                   f"{self.tail()}")
            if time.monotonic() - start > START_TIMEOUT_S:
                self.stop()
                raise RuntimeError(f"the daemon did not serve within {START_TIMEOUT_S:g} s: {self.tail()}")
            time.sleep(0.2)
        self.started_s = time.monotonic() - start

    def _daemon_json(self) -> Optional[dict]:
        from trainer.rundir import DAEMON_FILE

        try:
            with open(os.path.join(self.run_dir, DAEMON_FILE), encoding="utf-8") as f:
                info = json.load(f)
        except (OSError, ValueError):
            return None
        return info if isinstance(info, dict) and isinstance(info.get("pid"), int) else None

    @property
    def pid(self) -> int:
        return self.proc.pid if self.proc is not None else int(self.info["pid"])

    def exited(self) -> Optional[int]:
        if self.proc is not None:
            return self.proc.poll()
        return None if psutil.pid_exists(self.pid) else -1

    def tail(self, lines: int = 8) -> str:
        try:
            with open(self.stderr_path, encoding="utf-8", errors="replace") as f:
                return " | ".join(line.strip() for line in f.readlines()[-lines:])
        except OSError:
            return "(no output)"

    def stop(self) -> dict:
        """SIGINT and wait, as Ctrl-C stops it; killed after STOP_TIMEOUT_S. What happened, for the report."""
        if self.proc is None:
            return {"stopped": None, "note": "attached: left running"}
        start = time.monotonic()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            code = self.proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return {"stopped": False, "note": f"did not stop within {STOP_TIMEOUT_S:g} s of SIGINT: killed"}
        return {"stopped": code == 0, "exit_code": code, "stop_s": time.monotonic() - start}


class Restart:
    """The daemon SIGKILLed ``at`` s into the run, then started again on the ports it had (the bench's
    config rewritten with them) on a thread of its own, so that the fleet plays on meanwhile as a real
    one does: its workers keep their games and call on the daemon until it is back."""

    def __init__(self, daemon: DaemonProcess, cfg: Any, at: float, log: Callable[[str], None]) -> None:
        self.daemon, self.cfg, self.at, self.log = daemon, cfg, at, log
        self.killed_at: Optional[float] = None    # monotonic
        self.serving_at: Optional[float] = None
        self.acked_before: frozenset[str] = frozenset()
        self.error: Optional[BaseException] = None
        self.thread: Optional[threading.Thread] = None

    def due(self, now: float, t0: float) -> bool:
        return self.killed_at is None and now >= t0 + self.at

    @property
    def restarting(self) -> bool:
        return self.killed_at is not None and self.serving_at is None and self.error is None

    def kill(self, acked: set[str]) -> None:
        """SIGKILL now (what was acknowledged until now is noted), and start the daemon again on a thread."""
        from trainer.config import to_toml

        proc = self.daemon.proc
        assert proc is not None
        self.acked_before = frozenset(acked)
        proc.kill()
        proc.wait()
        self.killed_at = time.monotonic()
        self.log(f"killed the daemon (pid {proc.pid}, SIGKILL) with {len(acked):,} games acknowledged; starting "
                 "it again on its ports")
        ports = {name: str(self.daemon.info[name]).rsplit(":", 1)[1] for name in ("endpoint", "publish", "fetch")}
        cfg = self.cfg.replace(daemon={name: f"{getattr(self.cfg.daemon, name).rsplit(':', 1)[0]}:{port}"
                                       for name, port in ports.items()})
        atomic_write_text(os.path.join(self.daemon.run_dir, BENCH_CONFIG), to_toml(cfg))
        self.thread = threading.Thread(target=self._start, name="bench-fleet-restart", daemon=True)
        self.thread.start()

    def _start(self) -> None:
        try:
            self.daemon = DaemonProcess(self.daemon.run_dir, attach=False, profile=None, log=self.log, port=None)
            self.serving_at = time.monotonic()
        except BaseException as e:  # noqa: BLE001 - the run reports it
            self.error = e

    def figures(self, fleet: Fleet, rate: float) -> dict:
        """When it was killed and served again, when acks came back and reached the fleet's rate, and how
        the workers' resends came after it."""
        out: dict[str, Any] = {"kill_s": self.at, "acked_before_kill": len(self.acked_before),
                               "acked_before_kill_stored": None, "restart_s": None}
        if self.killed_at is None or self.serving_at is None:
            return out
        t_kill, t_back = self.killed_at - fleet.t0, self.serving_at - fleet.t0
        out["restart_s"] = t_back - t_kill
        after = np.array(sorted(a[0] for a in fleet.acks if a[0] >= t_back))
        out["first_ack_after_s"] = float(after[0] - t_back) if after.size else None
        # back at rate: the first second after the restart whose acks reach 90% of the fleet's rate
        seconds = np.floor(after - t_back).astype(int) if after.size else np.array([], dtype=int)
        counts = np.bincount(seconds) if seconds.size else np.array([])
        at_rate = np.nonzero(counts >= 0.9 * rate)[0]
        out["at_rate_after_s"] = float(at_rate[0] + 1) if at_rate.size else None
        resends = np.array([t - fleet.t0 - t_back for t in fleet.resend_times if t - fleet.t0 >= t_back])
        per_s = np.bincount(np.floor(resends).astype(int)) if resends.size else np.array([0])
        out["resends_after"] = int(resends.size)
        out["resends_most_in_a_second"] = int(per_s.max())
        return out


def profile_by_function(path: str, count: int = 12) -> dict:
    """The daemon's main thread's time by function (cProfile sees that thread only), the heaviest first."""
    import pstats

    stats = pstats.Stats(path)
    rows = [{"function": f"{os.path.basename(file)}:{line}({name})", "calls": nc, "tottime_s": tt, "cumtime_s": ct}
            for (file, line, name), (_, nc, tt, ct, _) in stats.stats.items()]  # type: ignore[attr-defined]
    return {"total_s": stats.total_tt,  # type: ignore[attr-defined]
            "by_own_time": sorted(rows, key=lambda r: -r["tottime_s"])[:count],
            "by_cumulative_time": sorted(rows, key=lambda r: -r["cumtime_s"])[:count]}
