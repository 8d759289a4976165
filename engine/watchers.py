"""The watchers that propose a new network: the ``WeightsFile`` watcher and the ``TrainerEndpoint`` follower.

Each runs on its own daemon thread and hands :class:`engine.swap.Proposal`
objects to a :class:`engine.swap.NetworkSwap`; neither loads nor swaps
anything itself.  ``log`` is called from their threads, so it must be
thread-safe (the UCI session's is: ``uci.session.Floor``).

* :class:`WeightsFileWatcher` stats the file every ``poll_interval`` seconds
  (mtime_ns, size, inode, and the same for its ``.sha256`` side file).  When
  that changes, it waits until the file is stable (the same stat on two polls
  in a row, so a writer that is still copying is not read half-way), hashes it
  and proposes it when the sha256 is new.  A side file ``<file>.sha256``
  (:mod:`trainer.atomic` writes both) must match; a mismatch is refused and
  looked at again when either file changes.
* :class:`TrainerFollower` follows a training daemon (docs/contracts.md, "Following a trainer"):
  a ZeroMQ SUB socket reads :mod:`engine.announce` announcements, optionally
  as a CurveZMQ client; a generation older than the newest in use or on its
  way is ignored with a line, the same generation again (the daemon
  re-announces every few seconds) quietly.  When the announced path cannot be
  read here, a DEALER fetches the bytes from the daemon's ROUTER in pieces
  (:class:`engine.announce.RangeFetch`) into a local cache (written as they
  come, atomically, checked against the announced size and sha256).  Silence for
  :data:`SILENCE_S` seconds after connecting is reported once.
"""

from __future__ import annotations

import os
import re
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Optional

from engine.announce import (
    FETCH_PIECE_BYTES,
    FETCH_VERSION,
    MAX_HEADER_BYTES,
    MAX_MESSAGE_BYTES,
    MAX_NETWORK_BYTES,
    TOPIC,
    AnnouncementError,
    ClientKeys,
    FetchError,
    NetworkAnnouncement,
    RangeFetch,
    decode_network_announcement,
    is_wildcard,
    rehost,
)
from engine.files import atomic_open, file_signature, sha256_file, sha256_path
from engine.network import NetworkError
from engine.swap import Proposal
from engine.weights import WeightsError, read_side_digest, short_sha, without_file_name

if TYPE_CHECKING:
    from engine.swap import NetworkSwap

__all__ = [
    "FETCH_TIMEOUT_S",
    "POLL_INTERVAL_S",
    "SILENCE_S",
    "RateLimit",
    "TrainerFollower",
    "WeightsFileWatcher",
    "default_cache_dir",
    "validate_endpoint",
]

POLL_INTERVAL_S = 0.5  # how often the WeightsFile is stat'ed
SILENCE_S = 10.0  # no announcement this long after connecting: say so (once)
FETCH_TIMEOUT_S = 120.0  # a whole fetch, every piece of it, must arrive within this
CACHE_KEEP = 4  # fetched networks kept in the cache (the newest)
_SUB_POLL_MS = 100


# --------------------------------------------------------------------------- the WeightsFile


class _Watcher:
    """A proposer on its own daemon thread: stops with :meth:`close` or when the swap closes."""

    _stop: threading.Event
    _swap: "NetworkSwap"
    thread: threading.Thread

    def close(self, timeout: float = 1.0) -> None:
        self._stop.set()
        if self.thread is not threading.current_thread():
            self.thread.join(timeout)

    def _stopped(self) -> bool:
        return self._stop.is_set() or self._swap.closed


class WeightsFileWatcher(_Watcher):
    """Proposes ``path`` to ``swap`` again whenever it is replaced by a new network.

    ``baseline`` is the :meth:`signature` the network in use was loaded at (a
    change during the first load is noticed).
    """

    def __init__(
        self,
        path: str,
        swap: "NetworkSwap",
        log: Callable[[str], object],
        *,
        baseline: tuple,
        poll_interval: float = POLL_INTERVAL_S,
    ) -> None:
        self.path = path
        self._swap = swap
        self._log = log
        self._poll = float(poll_interval)
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._watch, args=(baseline,), name="cyzero-weights-watch",
                                       daemon=True)
        self.thread.start()

    def signature(self) -> tuple:
        """The stat of the file and of its side file (``None`` for one that is missing)."""
        return signature_of(self.path)

    def _watch(self, baseline: tuple) -> None:
        seen = baseline  # the (file, side file) stat last dealt with
        candidate = None  # a new stat seen once; acted on when the next poll sees it again
        while not self._stop.wait(self._poll) and not self._swap.closed:
            try:
                signature = self.signature()
                if signature == seen:
                    candidate = None
                    continue
                if signature[0] is None:
                    if seen[0] is not None:
                        self._log(f"network file {self.path} disappeared{self._swap.keeping()}")
                    seen, candidate = signature, None
                    continue
                if signature != candidate:
                    candidate = signature  # still changing? look again next time
                    continue
                candidate = None
                if self._examine(signature):
                    seen = signature
            except Exception as e:  # noqa: BLE001 - the watcher must survive anything
                self._log(f"error while watching {self.path}: {type(e).__name__}: {e}")
                seen = self.signature()

    def _examine(self, signature: tuple) -> bool:
        """Hash the (stable) file and propose it if new; False when it changed meanwhile."""
        try:
            sha = sha256_file(self.path, cancelled=self._stopped)
        except OSError:
            return False  # gone or unreadable for a moment: look again
        if sha is None:
            return True  # closing
        if self.signature() != signature:
            return False
        try:
            side, side_error = read_side_digest(self.path), None
        except NetworkError as e:
            side, side_error = "unusable", str(e)
        key = ("file", sha, side)
        if self._swap.was_refused(key) or self._swap.knows(sha):
            return True  # the same bad file, or the network we have: nothing to do
        if side_error is None and (side is None or side == sha):
            self._swap.propose(Proposal(self.path, sha, key, superseded=lambda: self._superseded(signature)))
            return True
        self._swap.refuse(key)
        if side_error is not None:
            reason = without_file_name(side_error, self.path)
        else:
            reason = (
                f"its sha256 {short_sha(sha)} does not match {short_sha(side)} recorded in "
                f"{os.path.basename(sha256_path(self.path))} (still being published, or a stale .sha256 file?)"
            )
        self._log(f"refused network {self.path}: {reason}{self._swap.keeping()}")
        return True

    def _superseded(self, signature: tuple) -> bool:
        """After a failed load: a writer may still be at work; look once more before complaining."""
        return self._stop.wait(self._poll) or self.signature() != signature


def signature_of(path: str) -> tuple:
    """What a cheap ``stat`` says about a network file and its ``.sha256`` side file."""
    return file_signature(path), file_signature(sha256_path(path))


# --------------------------------------------------------------------------- endpoints

_TCP_CONNECT = re.compile(
    r"^(?:\[(?P<ipv6>[0-9A-Fa-f:.]+(?:%[\w.-]+)?)\]|(?P<host>[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?))"
    r":(?P<port>\d{1,5})$"
)


def validate_endpoint(endpoint: str, what: str = "TrainerEndpoint") -> str:
    """Check an endpoint to connect to; returns it normalised (scheme in lower case).

    Accepted: ``tcp://HOST:PORT`` (a host name, an IPv4 address or ``[IPv6]``,
    and a port 1-65535; not a bind address such as ``tcp://*:5781``),
    ``ipc://PATH`` and ``inproc://NAME``.  Raises :class:`WeightsError`.
    """
    if not isinstance(endpoint, str):
        raise WeightsError(f"{what} must be a string, got {type(endpoint).__name__}")
    text = endpoint.strip()
    usage = "expected tcp://HOST:PORT (e.g. tcp://127.0.0.1:5781, the training daemon's default), ipc://PATH or inproc://NAME"
    scheme, sep, rest = text.partition("://")
    scheme = scheme.lower()
    if not sep or scheme not in ("tcp", "ipc", "inproc"):
        raise WeightsError(f"bad {what} {endpoint!r}: {usage}")
    if not rest or "\x00" in rest or rest.startswith("*"):
        raise WeightsError(f"bad {what} {endpoint!r}: {usage} (an address to connect to)")
    if scheme == "tcp":
        match = _TCP_CONNECT.match(rest)
        if not match:
            raise WeightsError(f"bad {what} {endpoint!r}: {usage}")
        port = int(match.group("port"))
        if not 1 <= port <= 65535:
            raise WeightsError(f"bad {what} {endpoint!r}: port {port} is not in 1-65535")
    return f"{scheme}://{rest}"


def peer_endpoint(announced: str, dialled: str, what: str, via: str) -> str:
    """Where to dial an endpoint a peer announced: ``announced``, a wildcard host in it replaced by the
    peer's host as this side knows it (the host of ``dialled``, where it reached the peer: ``via``)."""
    if is_wildcard(announced):
        match = _TCP_CONNECT.match(dialled.partition("://")[2]) if dialled.startswith("tcp://") else None
        if match is None:
            raise WeightsError(f"the announced {what} {announced} needs a tcp:// {via}")
        announced = rehost(announced, f"[{match.group('ipv6')}]" if match.group("ipv6") else match.group("host"))
    return validate_endpoint(announced, what)


def default_cache_dir() -> str:
    """Where fetched networks are kept: ``$XDG_CACHE_HOME/cyzero/networks`` (``~/.cache`` by default)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "cyzero", "networks")


# --------------------------------------------------------------------------- the trainer follower


class RateLimit:
    """At most ``burst`` lines per ``window`` seconds; the rest are counted and summarised."""

    def __init__(self, burst: int = 20, window: float = 10.0) -> None:
        self.burst, self.window = burst, window
        self._start = -1e18
        self._count = 0
        self.suppressed = 0
        self._lock = threading.Lock()

    def admit(self) -> Optional[int]:
        """``None``: drop the line; otherwise the number of lines dropped before it."""
        with self._lock:
            now = time.monotonic()
            if now - self._start >= self.window:
                self._start, self._count = now, 0
            if self._count >= self.burst:
                self.suppressed += 1
                return None
            self._count += 1
            dropped, self.suppressed = self.suppressed, 0
            return dropped


class TrainerFollower(_Watcher):
    """Follows a training daemon's announcements at ``endpoint`` and proposes each new generation.

    ``keys``: CurveZMQ client keys (:func:`engine.announce.load_client_keys`)
    for a daemon that requires them.  ``context``: the ZeroMQ context
    (``inproc://`` publishers must share it).  ``cache_dir``: where fetched
    networks are written.  ``silence_s``: say so once when no announcement
    arrived this long after connecting (default :data:`SILENCE_S`).
    """

    def __init__(
        self,
        endpoint: str,
        swap: "NetworkSwap",
        log: Callable[[str], object],
        *,
        keys: Optional[ClientKeys] = None,
        context: Any = None,
        cache_dir: Optional[str] = None,
        silence_s: Optional[float] = None,
        max_network_bytes: int = MAX_NETWORK_BYTES,
    ) -> None:
        import zmq  # the engine only needs pyzmq when it follows a trainer

        self.endpoint = validate_endpoint(endpoint)
        self._zmq = zmq
        self._context = context or zmq.Context.instance()
        self._swap = swap
        self._log = log
        self.keys = keys
        self.cache_dir = cache_dir or default_cache_dir()
        self.silence_s = float(SILENCE_S if silence_s is None else silence_s)
        self.max_network_bytes = int(max_network_bytes)
        self.message_limit = RateLimit()
        self.heard = threading.Event()  # set by the first valid announcement
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._subscribe, name="cyzero-weights-sub", daemon=True)
        self.thread.start()

    # ------------------------------------------------------------------ announcements

    def _socket(self, kind: int) -> Any:
        zmq = self._zmq
        socket = self._context.socket(kind)
        try:
            socket.setsockopt(zmq.LINGER, 0)
            if self.keys is not None:
                self.keys.apply(socket)
        except BaseException:
            socket.close(0)
            raise
        return socket

    def _subscribe(self) -> None:
        zmq = self._zmq
        try:
            socket = self._socket(zmq.SUB)
            socket.setsockopt(zmq.RCVHWM, 64)
            socket.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
            socket.setsockopt(zmq.SUBSCRIBE, TOPIC)
            socket.connect(self.endpoint)
        except zmq.ZMQError as e:
            self._say(f"cannot follow TrainerEndpoint {self.endpoint}: {e}")
            return
        poller = zmq.Poller()
        poller.register(socket, zmq.POLLIN)
        silent_until: Optional[float] = time.monotonic() + self.silence_s
        try:
            while not self._stopped():
                if silent_until is not None and not self.heard.is_set() and time.monotonic() >= silent_until:
                    silent_until = None
                    self._say(self._silence_message())
                try:
                    ready = dict(poller.poll(_SUB_POLL_MS))
                except zmq.ZMQError as e:
                    if e.errno == zmq.ETERM:
                        break
                    self._say(f"TrainerEndpoint {self.endpoint}: {e}")
                    self._stop.wait(0.5)
                    continue
                if socket not in ready:
                    continue
                for _ in range(256):  # drain what is there, then look at the stop flag again
                    if self._stopped():
                        break
                    try:
                        frames = socket.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    self.on_message(frames)
        except Exception as e:  # noqa: BLE001 - say why the subscription ended, never crash
            self._say(f"stopped following TrainerEndpoint {self.endpoint}: {type(e).__name__}: {e}")
        finally:
            socket.close(0)

    def _silence_message(self) -> str:
        keys = (
            "does it accept these TrainerKeys?" if self.keys is not None
            else "does it require CurveZMQ keys (set TrainerKeys)?"
        )
        return (
            f"no network announcement from TrainerEndpoint {self.endpoint} within {self.silence_s:g} s: "
            f"is a training daemon publishing there, and {keys}"
        )

    def _limited(self, text: str) -> None:
        dropped = self.message_limit.admit()
        if dropped is not None:
            self._say(text + (f" ({dropped} similar lines suppressed)" if dropped else ""))

    def on_message(self, frames: list) -> None:
        """Decode one message from the SUB socket and act on it; anything malformed is dropped with a line."""
        try:
            announcement = decode_network_announcement(frames)
        except AnnouncementError as e:
            self._limited(f"dropped a malformed message from {self.endpoint}: {e}")
            return
        except Exception as e:  # noqa: BLE001 - never crash on input from a socket
            self._limited(f"dropped a malformed message from {self.endpoint}: {type(e).__name__}")
            return
        self.heard.set()
        self.announce(announcement)

    def announce(self, a: NetworkAnnouncement) -> bool:
        """Propose an announced network; returns whether it was queued.

        A process that receives announcements by other means (a self-play
        worker) may call it too.
        """
        proposal = Proposal(a.path, a.sha256, ("trainer", a.generation, a.sha256), a.generation, a.run,
                            fetch=lambda stop: self.local_copy(a, stop))
        if self._swap.propose(proposal):
            return True
        newest = self._swap.newest_generation()
        if newest is not None and a.generation < newest:
            self._limited(
                f"ignored network announcement of generation {a.generation} ({a.path}): "
                f"generation {newest} is newer"
            )
        return False  # refused before, the network we have, or the same generation again: quietly

    # ------------------------------------------------------------------ fetching

    def local_copy(self, a: NetworkAnnouncement, stop: threading.Event) -> str:
        """A file here with the announced network: its path when readable, else a fetched copy.

        Raises :class:`NetworkError` when it can be neither read nor fetched.
        """
        if os.path.isfile(a.path) and os.access(a.path, os.R_OK):
            return a.path
        if a.fetch is None:
            raise NetworkError(f"cannot read {a.path} here, and the daemon announced no fetch endpoint")
        stem = os.path.splitext(os.path.basename(a.path))[0][:100] or "network"
        target = os.path.join(self.cache_dir, f"{stem}.{a.sha256[:12]}.onnx")
        try:
            if os.path.isfile(target) and sha256_file(target) == a.sha256:
                return target  # fetched before
            os.makedirs(self.cache_dir, exist_ok=True)
            self._fetch(a, a.fetch, target, stop)
        except OSError as e:
            raise NetworkError(f"cannot write the fetched network to {target}: {e}") from None
        self._prune_cache(keep=target)
        return target

    def _fetch(self, a: NetworkAnnouncement, announced: str, target: str, stop: threading.Event) -> None:
        zmq = self._zmq
        try:
            endpoint = peer_endpoint(announced, self.endpoint, "fetch endpoint", "TrainerEndpoint")
        except WeightsError as e:
            raise NetworkError(f"cannot read {a.path} here, and cannot fetch it: {e}") from None
        where = f"the daemon at {endpoint}"
        if a.fetch_version != FETCH_VERSION:
            raise NetworkError(f"cannot read {a.path} here, and {where} serves fetch version {a.fetch_version}, "
                               f"this engine version {FETCH_VERSION}: run the same cyzero version on both")
        fetch = RangeFetch(a.generation, a.sha256, where=where, max_bytes=self.max_network_bytes)
        socket = self._socket(zmq.DEALER)
        try:
            # per frame as it arrives, a larger one drops the peer: a piece, plus the room CURVE's
            # framing takes around it (a limit of the piece alone dropped every full piece over CURVE)
            socket.setsockopt(zmq.MAXMSGSIZE, FETCH_PIECE_BYTES + MAX_HEADER_BYTES)
            socket.connect(endpoint)
            deadline = time.monotonic() + FETCH_TIMEOUT_S
            with atomic_open(target, "wb") as f:
                while not fetch.done:
                    for request in fetch.requests(time.monotonic()):
                        try:
                            socket.send_multipart(request, zmq.NOBLOCK)
                        except zmq.Again:
                            pass  # no room: asked again after PIECE_TIMEOUT_S like a lost one
                    if stop.is_set() or self._stopped():
                        raise NetworkError("the fetch was abandoned: no longer following this daemon")
                    if socket.poll(100, zmq.POLLIN):
                        for piece in fetch.receive(socket.recv_multipart(copy=False)):
                            f.write(piece)
                    if not fetch.done and time.monotonic() >= deadline:
                        got = "no reply" if fetch.size is None else f"{fetch.received} of {fetch.size} bytes"
                        raise NetworkError(f"{got} from {where} within {FETCH_TIMEOUT_S:g} s")
                fetch.verify()  # inside the with: wrong bytes are never renamed into the cache
        except FetchError as e:
            raise NetworkError(str(e)) from None
        finally:
            socket.close(0)
        self._say(f"fetched {os.path.basename(a.path)} (generation {a.generation}, {fetch.received} bytes) from {where}")

    def _prune_cache(self, keep: str) -> None:
        """Keep the newest :data:`CACHE_KEEP` fetched networks (a network in use lives in memory)."""
        try:
            entries = [
                os.path.join(self.cache_dir, name) for name in os.listdir(self.cache_dir)
                if re.fullmatch(r".+\.[0-9a-f]{12}\.onnx", name)
            ]
            entries.sort(key=lambda p: os.stat(p).st_mtime_ns, reverse=True)
            for path in entries[CACHE_KEEP:]:
                if path != keep:
                    os.remove(path)
        except OSError:
            pass  # a cache that cannot be tidied is not an error

    def _say(self, text: str) -> None:
        try:
            self._log(text)
        except Exception:  # noqa: BLE001 - a broken log callable must not kill a thread
            pass
