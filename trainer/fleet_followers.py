"""The simulated followers of ``cyzero-train bench fleet``: M engines following the daemon's networks, on one thread.

Each has a SUB for the announcements and, for each newer generation, a DEALER that fetches its
bytes as :class:`engine.watchers.TrainerFollower` does: in pieces, :data:`engine.announce.FETCH_CREDIT`
of them asked at a time, through the same :class:`engine.announce.RangeFetch`, which hashes them;
at the end the size and sha256 are checked and the swap counted. Nothing is written or kept (a
follower holds at most its credit of pieces), so one thread serves many followers. Given the
daemon's pid, the daemon's peak resident memory is measured for each generation's fetches: the
kernel's high-water mark (VmHWM) is reset when the first follower hears the generation and read
when the last has it.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any, Optional

import zmq

from engine.announce import (
    FETCH_PIECE_BYTES, FETCH_VERSION, MAX_HEADER_BYTES, TOPIC, AnnouncementError, NetworkAnnouncement, RangeFetch,
    decode_network_announcement, waiting,
)
from engine.watchers import FETCH_TIMEOUT_S, peer_endpoint
from trainer.fleet_daemon import proc_bytes, reset_peak_rss

__all__ = ["Followers"]

_DRAIN = 64  # replies read from one socket before the loop looks at the others


@dataclasses.dataclass
class _Fetch:
    announcement: NetworkAnnouncement
    socket: Any
    started: float
    fetch: RangeFetch


class Followers:
    """M followers of the run's networks on a thread of their own (and their own ZeroMQ context, so
    that the bytes of big fetches do not hold up the workers' acks in one I/O thread)."""

    def __init__(self, publish: str, count: int, keys: Any, daemon_pid: Optional[int] = None) -> None:
        self.publish, self.keys, self.daemon_pid = publish, keys, daemon_pid
        self.ctx = zmq.Context()
        self.subs = []
        for _ in range(count):
            sub = self._socket(zmq.SUB)
            sub.setsockopt(zmq.SUBSCRIBE, TOPIC)
            sub.connect(publish)
            self.subs.append(sub)
        self.have = [-1] * count                    # the generation each has swapped to
        self.wanted: list[Optional[NetworkAnnouncement]] = [None] * count
        self.fetching: list[Optional[_Fetch]] = [None] * count
        self.failed: list[set[int]] = [set() for _ in range(count)]
        self.results: list[dict] = []              # one per fetch: generation, follower, bytes, seconds, error
        self.heard: dict[int, float] = {}          # generation -> when a follower first heard it (monotonic)
        self.memory: dict[int, dict] = {}          # generation -> the daemon's RSS when heard, its peak until all had it
        self.asked_again = 0                       # pieces asked again after engine.announce.PIECE_TIMEOUT_S
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self.error: Optional[BaseException] = None
        self.thread = threading.Thread(target=self._run, name="bench-fleet-followers", daemon=True)
        self.thread.start()

    def _socket(self, kind: int) -> Any:
        sock = self.ctx.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        if self.keys is not None:
            self.keys.apply(sock)
        return sock

    def newest(self) -> int:
        """The newest generation every follower has swapped to (-1: none yet)."""
        return min(self.have) if self.have else -1

    def done(self, generation: int) -> bool:
        """Whether every follower has swapped to ``generation`` (or a newer one) or given it up."""
        return all(have >= generation or generation in failed for have, failed in zip(self.have, self.failed))

    def _run(self) -> None:
        poller = zmq.Poller()
        for sub in self.subs:
            poller.register(sub, zmq.POLLIN)
        owner = {sub: i for i, sub in enumerate(self.subs)}
        try:
            while not self._stop.is_set():
                for sock, _ in poller.poll(50):
                    i = owner[sock]
                    if sock is self.subs[i]:
                        self._announcements(i)
                    elif self._replies(i):
                        poller.unregister(sock)
                        del owner[sock]
                now = time.monotonic()
                for i, fetch in enumerate(self.fetching):
                    if fetch is not None:
                        if now - fetch.started > FETCH_TIMEOUT_S:
                            poller.unregister(fetch.socket)
                            del owner[fetch.socket]
                            self._finish(i, f"not all of it within {FETCH_TIMEOUT_S:g} s (where the real follower "
                                            "gives up)")
                        else:
                            self._ask(fetch, now)  # pieces overdue are asked again
                    if self.fetching[i] is None and self.wanted[i] is not None:
                        fetch = self._start(i)
                        if fetch is not None:
                            poller.register(fetch.socket, zmq.POLLIN)
                            owner[fetch.socket] = i
        except BaseException as e:  # noqa: BLE001 - the report says the followers failed, and why
            self.error = e

    def _announcements(self, i: int) -> None:
        for frames in waiting(self.subs[i], _DRAIN):
            try:
                a = decode_network_announcement(frames)
            except AnnouncementError:
                continue
            if a.generation not in self.heard:
                self._heard(a.generation)
            current = self.fetching[i]
            newest = max(self.have[i], current.announcement.generation if current else -1)
            if a.generation > newest and a.generation not in self.failed[i]:
                self.wanted[i] = a

    def _heard(self, generation: int) -> None:
        """A generation's first announcement: the daemon's memory from here until every follower has it."""
        with self.lock:
            self.heard[generation] = time.monotonic()
        if self.daemon_pid is not None:
            reset = reset_peak_rss(self.daemon_pid)
            self.memory[generation] = {"rss_before": proc_bytes(self.daemon_pid, "VmRSS"), "peak": None,
                                       "peak_reset": reset}

    def _start(self, i: int) -> Optional[_Fetch]:
        a, self.wanted[i] = self.wanted[i], None
        assert a is not None
        if a.fetch is None or a.fetch_version != FETCH_VERSION:
            why = "no fetch endpoint" if a.fetch is None else f"a fetch endpoint of version {a.fetch_version}"
            self._record(i, a, 0, 0.0, f"the daemon announced {why}")
            return None
        sock = self._socket(zmq.DEALER)
        # as the real follower: a frame over a piece (and CURVE's framing) drops the peer
        sock.setsockopt(zmq.MAXMSGSIZE, FETCH_PIECE_BYTES + MAX_HEADER_BYTES)
        sock.connect(peer_endpoint(a.fetch, self.publish, "fetch endpoint", "the publish endpoint"))
        now = time.monotonic()
        self.fetching[i] = fetch = _Fetch(a, sock, now, RangeFetch(a.generation, a.sha256, where="the daemon"))
        self._ask(fetch, now)
        return fetch

    def _ask(self, fetch: _Fetch, now: float) -> None:
        for request in fetch.fetch.requests(now):
            try:
                fetch.socket.send_multipart(request, zmq.NOBLOCK)
            except zmq.Again:
                pass  # asked again after PIECE_TIMEOUT_S, as a lost one

    def _replies(self, i: int) -> bool:
        """Read what came for follower ``i``'s fetch and ask for more; True when the fetch has ended."""
        fetch = self.fetching[i]
        assert fetch is not None
        for frames in waiting(fetch.socket, _DRAIN, copy=False):
            try:
                fetch.fetch.receive(frames)  # hashed there; nothing is kept
                if fetch.fetch.done:
                    fetch.fetch.verify()
                    self._finish(i, None, fetch.fetch.received)
                    return True
            except AnnouncementError as e:
                self._finish(i, str(e))
                return True
        self._ask(fetch, time.monotonic())
        return False

    def _finish(self, i: int, error: Optional[str], size: int = 0) -> None:
        fetch = self.fetching[i]
        assert fetch is not None
        fetch.socket.close(0)
        self.fetching[i] = None
        self.asked_again += fetch.fetch.asked_again
        self._record(i, fetch.announcement, size, time.monotonic() - fetch.started, error)

    def _record(self, i: int, a: NetworkAnnouncement, size: int, seconds: float, error: Optional[str]) -> None:
        with self.lock:
            self.results.append({"generation": a.generation, "follower": i, "bytes": size, "seconds": seconds,
                                 "sha256": a.sha256, "error": error, "end": time.monotonic()})
        if error is None:
            self.have[i] = max(self.have[i], a.generation)  # the swap
        else:
            self.failed[i].add(a.generation)
        memory = self.memory.get(a.generation)
        if memory is not None and memory["peak"] is None and self.done(a.generation):
            memory["peak"] = proc_bytes(self.daemon_pid, "VmHWM") if memory["peak_reset"] else None

    def close(self) -> None:
        if self.ctx.closed:
            return
        self._stop.set()
        self.thread.join(10.0)
        for fetch in self.fetching:
            if fetch is not None:
                fetch.socket.close(0)
        for sub in self.subs:
            sub.close(0)
        self.ctx.term()
