"""The daemon's publishing, without torch: each generation the learner exports (RUN/generations.jsonl)
is announced to the workers and followers (:class:`engine.announce.Announcer`, which also serves its
bytes in pieces) and written to RUN/published.jsonl, after a gating match against the current best
when ``[gating]`` is on (its verdicts in RUN/gating.jsonl). A restarted daemon announces again what
it last published."""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Callable, Optional

import zmq

from engine.announce import Announcer
from trainer.atomic import append_jsonl, read_jsonl
from trainer.config import GatingConfig
from trainer.endpoints import port_in_use
from trainer.rundir import GATING_FILE, GENERATIONS_FILE, PUBLISHED_FILE

__all__ = ["Publisher"]

Log = Callable[[str], Any]


class Publisher:
    """The announced generation of run ``name`` in ``run_dir`` and the gating thread that decides the
    next. ``since_start`` gives the daemon's start (unix time, 0 before it), named when a generation
    is published. The gating thread publishes too: the announced record is read under a lock."""

    def __init__(self, run_dir: str, name: str, gating: GatingConfig, log: Log, since_start: Callable[[], float]):
        self.run_dir, self.name, self.gating, self.log, self.since_start = run_dir, name, gating, log, since_start
        self.endpoint = self.fetch_endpoint = ""
        self._announcer: Any = None
        self._lock = threading.Lock()  # the published state (the gating thread publishes too)
        self._current: Optional[dict] = None  # the announced generation's record
        self._considered = -1  # the newest generation published, gated or queued
        self._gate_cv = threading.Condition()
        self._gate_next: Optional[dict] = None
        self._gate_stop = threading.Event()
        self._gate_thread: Optional[threading.Thread] = None

    def bind(self, context: Any, publish: str, fetch: str, server_keys: Optional[tuple[bytes, bytes]],
             fetch_log: Log) -> None:
        """Bind the announcements' PUB socket on ``publish`` and the fetch ROUTER on ``fetch``
        (ValueError, naming who holds a taken port, when either cannot be bound)."""
        try:
            self._announcer = Announcer(publish, fetch_endpoint=fetch, server_keys=server_keys, context=context,
                                        log=fetch_log)
        except zmq.ZMQError as e:
            raise ValueError(f"cannot bind daemon.publish {publish} or daemon.fetch {fetch}: "
                             f"{e}{port_in_use([publish, fetch], e)}") from None
        self.endpoint = self._announcer.endpoint
        self.fetch_endpoint = self._announcer.fetch_endpoint or ""

    def close(self) -> None:
        if self._announcer is not None:
            self._announcer.close()
            self._announcer = None

    def current(self) -> Optional[dict]:
        """The announced generation's record (``generation``, ``onnx``, ``sha256``), None before one."""
        with self._lock:
            return self._current

    def current_generation(self) -> Optional[int]:
        current = self.current()
        return None if current is None else current["generation"]

    def restore(self) -> None:
        """Re-announce the last published generation; publish the newest one when none was."""
        from trainer.run_setup import newest_generation

        published = [r for r in read_jsonl(os.path.join(self.run_dir, PUBLISHED_FILE))
                     if isinstance(r.get("generation"), int) and isinstance(r.get("onnx"), str)
                     and isinstance(r.get("sha256"), str)]
        gated = [r["generation"] for r in read_jsonl(os.path.join(self.run_dir, GATING_FILE))
                 if isinstance(r.get("generation"), int)]
        for record in reversed(published):
            if os.path.isfile(os.path.join(self.run_dir, record["onnx"])):
                self._announce(record)
                break
        self._considered = max([r["generation"] for r in published] + gated + [-1])
        if self._current is None:
            newest = newest_generation(self.run_dir)
            if newest is not None:
                self._publish(newest, gated=False)

    def poll(self) -> None:
        """Publish (or queue for gating) each generation the learner exported since the last look."""
        fresh = []
        for record in read_jsonl(os.path.join(self.run_dir, GENERATIONS_FILE)):
            generation, onnx, sha = record.get("generation"), record.get("onnx"), record.get("sha256")
            if (isinstance(generation, int) and generation > self._considered and isinstance(onnx, str)
                    and isinstance(sha, str) and os.path.isfile(os.path.join(self.run_dir, onnx))):
                fresh.append(record)
        fresh.sort(key=lambda r: r["generation"])
        if not fresh:
            return
        if not self.gating.enabled:
            for record in fresh:
                self._publish(record, gated=False)
            return
        self._considered = fresh[-1]["generation"]
        with self._gate_cv:
            self._gate_next = fresh[-1]  # a gate in progress finishes; then only the newest is taken
            self._gate_cv.notify()

    def start_gating(self) -> None:
        """Start the gating thread when ``[gating]`` is on."""
        if self.gating.enabled:
            self._gate_thread = threading.Thread(target=self._gating, name="cyzero-gating", daemon=True)
            self._gate_thread.start()

    def hurry(self) -> None:
        """End a gating match at once (a second stop signal)."""
        self._gate_stop.set()

    def stop_gating(self) -> None:
        """Ask the gating thread to end: a match in play stops, and is no verdict."""
        self._gate_stop.set()
        with self._gate_cv:
            self._gate_cv.notify_all()

    def join_gating(self, timeout: float) -> None:
        if self._gate_thread is not None:
            self._gate_thread.join(timeout)

    def _announce(self, record: dict) -> None:
        with self._lock:
            self._current = record
        self._announcer.announce(record["generation"], os.path.join(self.run_dir, record["onnx"]), record["sha256"],
                                 run=self.name)

    def _publish(self, record: dict, *, gated: bool) -> None:
        line = {"generation": record["generation"], "onnx": record["onnx"], "sha256": record["sha256"],
                "time": time.time(), "gated": gated}
        self._announce(line)  # first: whoever reads the line finds the generation announced
        append_jsonl(os.path.join(self.run_dir, PUBLISHED_FILE), line)
        with self._lock:
            self._considered = max(self._considered, record["generation"])
        started = self.since_start()
        self.log(f"published generation {record['generation']} ({record['onnx']}) at {time.strftime('%H:%M:%S')}"
                 + (f", {(time.time() - started) / 60:.1f} min after this daemon's start" if started else ""))

    def _gating(self) -> None:
        """The gating thread: each queued generation plays the current best; published if accepted."""
        from trainer.gating import gate

        while not self._gate_stop.is_set():
            with self._gate_cv:
                while self._gate_next is None and not self._gate_stop.is_set():
                    self._gate_cv.wait(0.5)
                candidate, self._gate_next = self._gate_next, None
            if candidate is None:
                return
            best = self.current()
            if best is None:
                self._publish(candidate, gated=True)
                continue
            self.log(f"gating generation {candidate['generation']} against generation {best['generation']}")
            try:
                result = gate(os.path.join(self.run_dir, candidate["onnx"]), os.path.join(self.run_dir, best["onnx"]),
                              self.gating, self.log, stop=self._gate_stop)
            except Exception as e:  # noqa: BLE001 - a match that cannot be played must not end the run
                self.log(f"gating generation {candidate['generation']} failed: {e}")
                continue
            if not result.accepted and self._gate_stop.is_set():
                return  # stopped: not a verdict (gated again after a restart)
            result.generation, result.best = candidate["generation"], best["generation"]
            append_jsonl(os.path.join(self.run_dir, GATING_FILE), result.to_dict())
            self.log(f"gating generation {candidate['generation']}: {'accepted' if result.accepted else 'rejected'} "
                     f"(+{result.wins} ={result.draws} -{result.losses}, {result.reason})")
            if result.accepted:
                self._publish(candidate, gated=True)
