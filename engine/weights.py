"""Locating, verifying and hot-swapping networks.

    >>> manager = NetworkManager(resolve_weights("<default>"), backend="cpu", log=print)
    >>> net = manager.get()                   # loads on first use (isready, or the first go)
    loaded network default.onnx sha256:1e24186e84ad CPU fp32 6x64, float32 io
    >>> manager.set_endpoint("tcp://127.0.0.1:5557")   # follow a training daemon
    ...                                       # (a new network is loaded and verified in the background)
    >>> manager.apply_pending(searcher.network_changed)   # between searches only
    True
    >>> manager.close()

Where new networks come from
----------------------------
* The ``WeightsFile``: a background thread stats it every ``poll_interval``
  seconds (mtime_ns, size, inode, and the same for its ``.sha256`` side file).
  When that changes, it waits until the file is stable (the same stat on two
  polls in a row, so a writer that is still copying is not read half-way),
  hashes it and, when the sha256 differs from the networks in use, pending or
  loading, loads it.  When a side file ``<file>.sha256`` exists, the file must
  match it (:mod:`trainer.atomic` writes both; a mismatch is refused and looked
  at again when either file changes).
* A training daemon: with :meth:`NetworkManager.set_endpoint`, a ZeroMQ SUB
  socket (on its own thread) listens for announcements
  ``[b"network", msgpack header]`` (:func:`encode_network_announcement`,
  :func:`decode_network_announcement`); the announced file is loaded and must
  have the announced sha256.  A generation older than the newest in use,
  pending or loading is ignored with a log line; the same generation again
  (a daemon re-announcing for late subscribers) is ignored quietly.

Every candidate is built by ``loader`` (:class:`engine.network.Network`,
which checks the I/O contract and warms up) with the same backend, device
and threads as the network in use, then evaluated once more on the start
position (:func:`verify_network`: finite outputs, a WDL that sums to 1).  A
verified candidate waits in :meth:`NetworkManager.swap_pending` until the
UCI layer calls :meth:`NetworkManager.apply_pending` between searches; a
search in progress keeps the network it started with (``get()`` hands out a
reference; nothing here closes a network that was handed out).  A candidate
that fails is refused with one log line, the old network stays, and the same
bad file (same sha256) is not tried again until it changes.

Threads and logging
-------------------
Up to three daemon threads: the file watcher, the loader (builds candidates
one at a time; the newest request wins) and the subscriber.  ``log`` is
called from them, so it must be thread-safe (the UCI writer is).
:meth:`NetworkManager.close` stops them promptly (< 1 s); a load that is in
progress (a TensorRT engine build can take minutes) is left to finish on its
daemon thread and its result is dropped.

Security
--------
The SUB socket only connects; it is the daemon that binds (on 127.0.0.1 by
default).  A daemon on another host is reachable with a ``tcp://host:port``
endpoint, but announcements travel unauthenticated; remote daemons will need
CurveZMQ keys (a later issue).  Announcements are msgpack, never pickle;
anything malformed is dropped with a log line, never a crash.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
import re
import threading
import time
from typing import Any, Callable, Iterable, Optional

import msgpack
import numpy as np

from engine.files import file_signature, is_sha256_hex, read_sha256, sha256_file, sha256_path
from engine.network import POLICY_SIZE, Network, NetworkError

__all__ = [
    "ANNOUNCEMENT_TYPE",
    "ANNOUNCEMENT_VERSION",
    "DEFAULT_WEIGHTS",
    "TOPIC",
    "AnnouncementError",
    "NetworkAnnouncement",
    "NetworkManager",
    "WeightsError",
    "decode_network_announcement",
    "default_weights_path",
    "encode_network_announcement",
    "resolve_weights",
    "validate_endpoint",
    "verify_network",
]

DEFAULT_WEIGHTS = "<default>"  # the UCI option value that names the bundled network
TOPIC = b"network"  # first frame of an announcement (the SUB socket subscribes to it)
ANNOUNCEMENT_TYPE = "network"
ANNOUNCEMENT_VERSION = 1
MAX_HEADER_BYTES = 64 * 1024
MAX_MESSAGE_BYTES = 1 << 20  # ZMQ_MAXMSGSIZE: a peer sending more is disconnected
MAX_PATH_CHARS = 4096
MAX_RUN_CHARS = 256
POLL_INTERVAL_S = 0.5
_SUB_POLL_MS = 100

_logger = logging.getLogger(__name__)


class WeightsError(ValueError):
    """A ``WeightsFile`` or ``TrainerEndpoint`` value that cannot be used."""


class AnnouncementError(ValueError):
    """A malformed network announcement (wrong frames, not msgpack, wrong fields or types)."""


# --------------------------------------------------------------------------- locating


def default_weights_path() -> str:
    """The bundled network, ``engine/nets/default.onnx`` (next to this package)."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "nets", "default.onnx")


def resolve_weights(value: str | os.PathLike | None) -> str:
    """The absolute network path for a ``WeightsFile`` option value.

    ``"<default>"``, an empty value or ``None`` name the bundled network;
    anything else is a path (``~`` expanded, relative to the working
    directory).  Raises :class:`WeightsError` if there is no such file.
    """
    text = "" if value is None else os.fspath(value).strip()
    if text == "" or text.lower() == DEFAULT_WEIGHTS:
        path = default_weights_path()
        if not os.path.isfile(path):
            raise WeightsError(
                f"the bundled network is missing: {path} (an incomplete install? reinstall cyzero, "
                f"or set WeightsFile to an .onnx network)"
            )
        return path
    path = os.path.abspath(os.path.expanduser(text))
    if not os.path.exists(path):
        raise WeightsError(f"WeightsFile not found: {path}")
    if os.path.isdir(path):
        raise WeightsError(f"WeightsFile is a directory, not an .onnx file: {path}")
    return path


# --------------------------------------------------------------------------- endpoints

_TCP_CONNECT = re.compile(
    r"^(?:\[(?P<ipv6>[0-9A-Fa-f:.]+(?:%[\w.-]+)?)\]|(?P<host>[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?))"
    r":(?P<port>\d{1,5})$"
)


def validate_endpoint(endpoint: str) -> str:
    """Check a ``TrainerEndpoint`` to connect to; returns it normalised (scheme in lower case).

    Accepted: ``tcp://HOST:PORT`` (a host name, an IPv4 address or ``[IPv6]``,
    and a port 1-65535; not a bind address such as ``tcp://*:5557``),
    ``ipc://PATH`` and ``inproc://NAME``.  Raises :class:`WeightsError`.
    Connecting to a daemon on another host is allowed, but its announcements
    are not authenticated until CurveZMQ keys are supported (a later issue).
    """
    if not isinstance(endpoint, str):
        raise WeightsError(f"TrainerEndpoint must be a string, got {type(endpoint).__name__}")
    text = endpoint.strip()
    usage = "expected tcp://HOST:PORT (e.g. tcp://127.0.0.1:5557), ipc://PATH or inproc://NAME"
    scheme, sep, rest = text.partition("://")
    scheme = scheme.lower()
    if not sep or scheme not in ("tcp", "ipc", "inproc"):
        raise WeightsError(f"bad TrainerEndpoint {endpoint!r}: {usage}")
    if not rest or "\x00" in rest or rest.startswith("*"):
        raise WeightsError(f"bad TrainerEndpoint {endpoint!r}: {usage} (an address to connect to)")
    if scheme == "tcp":
        match = _TCP_CONNECT.match(rest)
        if not match:
            raise WeightsError(f"bad TrainerEndpoint {endpoint!r}: {usage}")
        port = int(match.group("port"))
        if not 1 <= port <= 65535:
            raise WeightsError(f"bad TrainerEndpoint {endpoint!r}: port {port} is not in 1-65535")
    return f"{scheme}://{rest}"


# --------------------------------------------------------------------------- announcements


@dataclasses.dataclass(frozen=True)
class NetworkAnnouncement:
    """A training daemon's "generation N is at this path, with this sha256"."""

    generation: int
    path: str
    sha256: str
    run: Optional[str] = None


def _check_fields(generation: Any, path: Any, sha256: Any, run: Any) -> NetworkAnnouncement:
    if not isinstance(generation, int) or isinstance(generation, bool):
        raise AnnouncementError(f"'generation' must be an integer, got {type(generation).__name__}")
    if not 0 <= generation < 2**63:
        raise AnnouncementError(f"'generation' must be >= 0, got {generation}")
    if not isinstance(path, str):
        raise AnnouncementError(f"'path' must be a string, got {type(path).__name__}")
    if not path or len(path) > MAX_PATH_CHARS or "\x00" in path:
        raise AnnouncementError(f"'path' must be a file path of 1-{MAX_PATH_CHARS} characters")
    if not os.path.isabs(path):
        raise AnnouncementError(f"'path' must be absolute, got {path[:100]!r}")
    if not isinstance(sha256, str):
        raise AnnouncementError(f"'sha256' must be a string, got {type(sha256).__name__}")
    if not is_sha256_hex(sha256.lower()):
        raise AnnouncementError(f"'sha256' must be 64 hex digits, got {sha256[:80]!r}")
    if run is not None and (not isinstance(run, str) or len(run) > MAX_RUN_CHARS):
        raise AnnouncementError(f"'run' must be a string of at most {MAX_RUN_CHARS} characters")
    return NetworkAnnouncement(generation, path, sha256.lower(), run)


def encode_network_announcement(
    generation: int, path: str | os.PathLike, sha256: str, run: Optional[str] = None
) -> list[bytes]:
    """The frames ``[TOPIC, msgpack header]`` announcing a network; raises :class:`AnnouncementError`.

    Header: ``{"type": "network", "version": 1, "generation": int, "path":
    str (absolute), "sha256": 64 hex digits, "run": str (optional)}``.
    """
    ann = _check_fields(generation, os.fspath(path), sha256, run)
    header: dict[str, Any] = {
        "type": ANNOUNCEMENT_TYPE,
        "version": ANNOUNCEMENT_VERSION,
        "generation": ann.generation,
        "path": ann.path,
        "sha256": ann.sha256,
    }
    if ann.run is not None:
        header["run"] = ann.run
    return [TOPIC, msgpack.packb(header, use_bin_type=True)]


def _frame_bytes(frame: Any, which: str) -> bytes:
    if isinstance(frame, (bytes, bytearray)):
        return bytes(frame)
    if isinstance(frame, memoryview):
        return frame.tobytes()
    data = getattr(frame, "bytes", None)  # a zmq.Frame
    if isinstance(data, bytes):
        return data
    raise AnnouncementError(f"the {which} frame is a {type(frame).__name__}, not bytes")


def decode_network_announcement(frames: Iterable[Any]) -> NetworkAnnouncement:
    """Parse and check ``[TOPIC, msgpack header]``; raises :class:`AnnouncementError` on anything else.

    Never unpickles and never raises anything but :class:`AnnouncementError`
    for bad input.  Unknown header keys are ignored (room for later fields in
    version 1); a different ``version`` is refused.
    """
    try:
        frames = list(frames)
    except TypeError:
        raise AnnouncementError(f"expected a list of frames, got {type(frames).__name__}") from None
    if len(frames) != 2:
        raise AnnouncementError(f"expected 2 frames (topic, header), got {len(frames)}")
    topic = _frame_bytes(frames[0], "topic")
    if topic != TOPIC:
        raise AnnouncementError(f"unknown topic {topic[:40]!r}, expected {TOPIC!r}")
    data = _frame_bytes(frames[1], "header")
    if len(data) > MAX_HEADER_BYTES:
        raise AnnouncementError(f"header of {len(data)} bytes is larger than {MAX_HEADER_BYTES}")
    try:
        header = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except Exception as e:  # noqa: BLE001 - FormatError, ExtraData, StackError, UnicodeDecodeError, ...
        raise AnnouncementError(f"header is not valid msgpack ({type(e).__name__})") from None
    if not isinstance(header, dict):
        raise AnnouncementError(f"header must be a msgpack map, got {type(header).__name__}")
    kind = header.get("type")
    if kind != ANNOUNCEMENT_TYPE:
        raise AnnouncementError(f"header 'type' must be {ANNOUNCEMENT_TYPE!r}, got {str(kind)[:40]!r}")
    version = header.get("version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise AnnouncementError(f"header 'version' must be an integer, got {type(version).__name__}")
    if version != ANNOUNCEMENT_VERSION:
        raise AnnouncementError(
            f"unsupported announcement version {version} (this engine reads version {ANNOUNCEMENT_VERSION})"
        )
    for key in ("generation", "path", "sha256"):
        if key not in header:
            raise AnnouncementError(f"header has no {key!r}")
    return _check_fields(header["generation"], header["path"], header["sha256"], header.get("run"))


# --------------------------------------------------------------------------- verification


def verify_network(network: Any) -> None:
    """One test evaluation of the start position; raises :class:`NetworkError` if it looks wrong.

    Checks that the policy is [1,1858] and finite, the WDL [1,3], finite,
    non-negative and summing to 1, and the moves-left output (if any) finite.
    """
    from engine.encoding import encode_position  # the Cython encoder, on first use only

    name = getattr(network, "name", "the network")
    planes = np.ascontiguousarray(encode_position(), dtype=np.float32)[None]
    try:
        policy, wdl, mlh = network.evaluate(planes)
    except NetworkError:
        raise
    except Exception as e:  # noqa: BLE001 - whatever the runtime says, the network is unusable
        raise NetworkError(f"{name}: the test evaluation failed: {type(e).__name__}: {e}") from None
    policy = np.asarray(policy, dtype=np.float64)
    wdl = np.asarray(wdl, dtype=np.float64)
    if policy.shape != (1, POLICY_SIZE) or wdl.shape != (1, 3):
        raise NetworkError(
            f"{name}: the test evaluation gave policy {list(policy.shape)} and wdl {list(wdl.shape)}, "
            f"expected [1,{POLICY_SIZE}] and [1,3]"
        )
    if not (np.isfinite(policy).all() and np.isfinite(wdl).all()):
        raise NetworkError(f"{name}: the outputs for the start position are not finite (NaN or inf)")
    if mlh is not None and not np.isfinite(np.asarray(mlh, dtype=np.float64)).all():
        raise NetworkError(f"{name}: the moves-left output for the start position is not finite")
    total = float(wdl.sum())
    if (wdl < -1e-6).any() or abs(total - 1.0) > 1e-2:
        raise NetworkError(
            f"{name}: the WDL for the start position is not a probability distribution "
            f"({', '.join(f'{v:.4g}' for v in wdl[0])}, sum {total:.4g})"
        )


# --------------------------------------------------------------------------- the manager


@dataclasses.dataclass
class _Loaded:
    network: Any
    sha256: str
    path: str
    generation: Optional[int] = None
    run: Optional[str] = None


@dataclasses.dataclass
class _Request:
    path: str
    sha256: str  # expected: computed by the watcher, or announced
    source: str  # "file" or "trainer"
    key: tuple  # what is remembered when it is refused
    generation: Optional[int] = None
    run: Optional[str] = None
    signature: Any = None  # file requests: the (file, side file) stat it was hashed at


class _RateLimit:
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


def _short_sha(sha: Optional[str]) -> str:
    return f"{sha[:12]}..." if sha else "?"


def _strip_name(message: str, path: str) -> str:
    name = os.path.basename(path)
    return message[len(name) + 2 :] if message.startswith(name + ": ") else message


class NetworkManager:
    """Owns the network in use and hot-swaps new ones between searches.

    Parameters
    ----------
    path
        The network file (see :func:`resolve_weights`); also the file watched
        for replacements.
    backend, device_id, threads
        Passed to ``loader`` for every network (``threads`` is ONNX Runtime's
        intra-op thread count; ``None`` or 0 for its default).
    log
        Called (from any thread) with one line for the user: loads, swaps,
        refusals, dropped messages.  The UCI layer prints them as ``info string``.
    loader
        ``loader(path, backend=, device_id=, intra_threads=, log=, expected_sha256=, **network_options)``
        returns a network (:class:`engine.network.Network`); tests pass fakes.
    endpoint
        A ``TrainerEndpoint`` to subscribe to at once (see :meth:`set_endpoint`).
    watch
        Watch ``path`` for replacements (after the first load).
    poll_interval
        Seconds between two looks at the file.
    network_options
        More keyword arguments for ``loader`` (``max_batch``, ``trt_fp16``, ...).
    zmq_context
        The ZeroMQ context for the SUB socket (default ``zmq.Context.instance()``,
        which ``inproc://`` publishers must share).
    """

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        backend: str = "auto",
        device_id: int = 0,
        threads: Optional[int] = None,
        log: Optional[Callable[[str], object]] = None,
        loader: Callable[..., Any] = Network,
        endpoint: Optional[str] = None,
        watch: bool = True,
        poll_interval: float = POLL_INTERVAL_S,
        network_options: Optional[dict] = None,
        zmq_context: Any = None,
    ) -> None:
        self.path = os.path.abspath(os.fspath(path))
        self.backend = backend
        self.device_id = device_id
        self.threads = threads
        self._log_fn = log if log is not None else _logger.warning
        self._loader = loader
        self._watch_enabled = watch
        self._poll = float(poll_interval)
        self._network_options = dict(network_options or {})
        self._zmq_context = zmq_context

        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._first_load = threading.Lock()
        self._stop = threading.Event()
        self._closed = False
        self._current: Optional[_Loaded] = None
        self._pending: Optional[_Loaded] = None
        self._next: Optional[_Request] = None  # the newest load request (newest wins)
        self._loading: Optional[_Request] = None
        self._refused: collections.OrderedDict[tuple, None] = collections.OrderedDict()
        self._said: set[str] = set()  # loader lines already passed on (one GPU-fallback line, not one per load)
        self._watcher: Optional[threading.Thread] = None
        self._loader_thread: Optional[threading.Thread] = None
        self._subscriber: Optional[threading.Thread] = None
        self._subscriber_stop: Optional[threading.Event] = None
        self.endpoint: Optional[str] = None
        self.message_limit = _RateLimit()
        if endpoint:
            self.set_endpoint(endpoint)

    # ------------------------------------------------------------------ the UCI layer's API

    def get(self) -> Any:
        """The network in use, loaded (and verified) on the first call.

        Raises :class:`engine.network.NetworkError` (a ``ValueError``) when the
        file cannot be used; the next call tries again.  Thread-safe; the
        caller keeps the returned reference for a whole search.
        """
        with self._lock:
            self._check_open()
            if self._current is not None:
                return self._current.network
        with self._first_load:
            with self._lock:
                self._check_open()
                if self._current is not None:
                    return self._current.network
                if self._pending is not None:  # a trainer's network verified before the first use
                    self._current, self._pending = self._pending, None
                    loaded = self._current
                else:
                    loaded = None
            signature = self._signatures()
            if loaded is None:
                loaded = self._load_initial()
                with self._lock:
                    self._check_open()
                    self._current = loaded
            self._say(f"loaded network {self._label(loaded, long=True)}")
            if self._watch_enabled:
                self._start_watcher(signature)
            return loaded.network

    def swap_pending(self) -> bool:
        """Whether a verified network is waiting for :meth:`apply_pending`."""
        with self._lock:
            return self._pending is not None and not self._closed

    def apply_pending(self, clear_cache: Optional[Callable[[], object]] = None) -> bool:
        """Install the verified candidate, if any; call between searches only.  Returns whether it swapped.

        ``clear_cache`` (e.g. ``Searcher.network_changed``) is called after the
        swap, before the ``info`` line that says so.  A search that is still
        running keeps the network it started with.
        """
        with self._lock:
            candidate = self._pending
            if candidate is None or self._closed:
                return False
            self._pending = None
            self._current = candidate
        if clear_cache is not None:
            clear_cache()
        self._say(
            f"switched to network {self._label(candidate, long=True)}"
            + ("; search cache cleared" if clear_cache is not None else "")
        )
        return True

    def wait_pending(self, timeout: Optional[float] = None) -> bool:
        """Block until a candidate is pending (or ``timeout`` seconds pass); returns :meth:`swap_pending`."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._pending is None and not self._closed:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                self._cond.wait(left)
            return self._pending is not None and not self._closed

    @property
    def loaded(self) -> bool:
        return self._current is not None

    @property
    def generation(self) -> Optional[int]:
        """The training generation of the network in use (``None``: not from a trainer)."""
        current = self._current
        return None if current is None else current.generation

    @property
    def sha256(self) -> Optional[str]:
        current = self._current
        return None if current is None else current.sha256

    @property
    def network_path(self) -> str:
        """The file of the network in use (the announced path after a trainer's swap)."""
        current = self._current
        return self.path if current is None else current.path

    @property
    def description(self) -> str:
        """One line about the network in use, for ``info string``."""
        current = self._current
        if current is None:
            return f"{os.path.basename(self.path)} (not loaded yet)"
        return self._label(current, long=True)

    def set_endpoint(self, endpoint: Optional[str]) -> None:
        """Follow a training daemon's announcements at ``endpoint`` (``None`` or ``""``: stop).

        Raises :class:`WeightsError` for an endpoint that is not
        ``tcp://HOST:PORT``, ``ipc://PATH`` or ``inproc://NAME``.  Connecting is
        asynchronous (ZeroMQ reconnects by itself), so a daemon that starts
        later is picked up.  A daemon on another host needs CurveZMQ keys to be
        trusted (a later issue); until then use it only on a trusted network.
        """
        new = validate_endpoint(endpoint) if endpoint else None
        with self._lock:
            self._check_open()
            if new == self.endpoint:
                return
            old_thread, old_stop = self._subscriber, self._subscriber_stop
            self._subscriber = self._subscriber_stop = None
            self.endpoint = new
        if old_stop is not None:
            old_stop.set()
            old_thread.join(1.0)
        if new is None:
            return
        import zmq  # the engine only needs pyzmq when it follows a trainer

        context = self._zmq_context or zmq.Context.instance()
        stop = threading.Event()
        thread = threading.Thread(
            target=self._subscribe, args=(zmq, context, new, stop), name="cyzero-weights-sub", daemon=True
        )
        with self._lock:
            self._subscriber, self._subscriber_stop = thread, stop
        thread.start()

    def close(self, timeout: float = 1.0) -> None:
        """Stop the threads (within about ``timeout`` seconds) and drop the networks.

        The network in use is not closed (a search may still hold it; it is
        freed with its last reference); a pending one is.  Idempotent.
        """
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._stop.set()
            if self._subscriber_stop is not None:
                self._subscriber_stop.set()
            pending, self._pending, self._next = self._pending, None, None
            self._current = None
            loading = self._loading is not None
            self._cond.notify_all()
        deadline = time.monotonic() + timeout
        for thread in (self._subscriber, self._watcher, self._loader_thread):
            if thread is not None and thread is not threading.current_thread():
                left = max(0.0, deadline - time.monotonic())
                # A load in progress cannot be interrupted: it ends on its own and is dropped.
                thread.join(min(left, 0.05) if thread is self._loader_thread and loading else left)
        if pending is not None:
            _close_quietly(pending.network)

    def __enter__(self) -> "NetworkManager":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<NetworkManager {self.description}>"

    # ------------------------------------------------------------------ loading

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the network manager is closed")

    def _say(self, text: str) -> None:
        try:
            self._log_fn(text)
        except Exception:  # noqa: BLE001 - a broken log callable must not kill a thread
            _logger.exception("log callable failed")

    def _loader_log(self, text: str) -> None:
        if text not in self._said:
            self._said.add(text)
            self._say(text)

    def _signatures(self) -> tuple:
        return file_signature(self.path), file_signature(sha256_path(self.path))

    def _side_digest(self, path: str) -> Optional[str]:
        """The digest in ``path.sha256``, ``None`` without one; NetworkError when it is unreadable."""
        try:
            return read_sha256(path)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            raise NetworkError(f"{os.path.basename(path)}: unusable sha256 side file: {e}") from None

    def _build(self, path: str, expected_sha256: Optional[str]) -> Any:
        network = self._loader(
            path,
            backend=self.backend,
            device_id=self.device_id,
            intra_threads=self.threads or None,
            log=self._loader_log,
            expected_sha256=expected_sha256,
            **self._network_options,
        )
        try:
            verify_network(network)
        except BaseException:
            _close_quietly(network)
            raise
        return network

    def _load_initial(self) -> _Loaded:
        side = self._side_digest(self.path)
        try:
            network = self._build(self.path, side)
        except NetworkError as e:
            if side is not None and "sha256 mismatch" in str(e):
                raise NetworkError(
                    f"{e} recorded in {os.path.basename(sha256_path(self.path))} (a truncated or "
                    f"replaced file? if it was replaced on purpose, update or delete the .sha256 file)"
                ) from None
            raise
        sha = getattr(network, "sha256", None) or side or sha256_file(self.path)
        return _Loaded(network, sha, self.path)

    def _label(self, loaded: _Loaded, long: bool = False) -> str:
        if long:
            text = getattr(loaded.network, "description", None) or (
                f"{os.path.basename(loaded.path)} sha256:{loaded.sha256[:12]}"
            )
        else:
            text = f"{os.path.basename(loaded.path)} (sha256 {_short_sha(loaded.sha256)})"
        if loaded.generation is not None:
            text += f", generation {loaded.generation}"
        if loaded.run:
            text += f", run {loaded.run}"
        return text

    def _keeping(self) -> str:
        current = self._current
        return "" if current is None else f"; keeping {self._label(current)}"

    def _request(self, request: _Request) -> None:
        with self._cond:
            if self._closed:
                return
            self._next = request
            if self._loader_thread is None:
                self._loader_thread = threading.Thread(
                    target=self._load_loop, name="cyzero-weights-load", daemon=True
                )
                self._loader_thread.start()
            self._cond.notify_all()

    def _refuse(self, key: tuple) -> None:
        self._refused[key] = None
        while len(self._refused) > 64:
            self._refused.popitem(last=False)

    def _known_sha(self, sha: str) -> bool:
        """Whether ``sha`` is in use, pending, loading or about to load (caller holds the lock)."""
        return any(
            slot is not None and slot.sha256 == sha
            for slot in (self._current, self._pending, self._loading, self._next)
        )

    def _load_loop(self) -> None:
        while True:
            with self._cond:
                while self._next is None and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                request, self._next = self._next, None
                self._loading = request
            try:
                self._process(request)
            except Exception as e:  # noqa: BLE001 - the loader thread must survive anything
                self._say(f"error while loading network {request.path}: {type(e).__name__}: {e}")
            finally:
                with self._lock:
                    self._loading = None

    def _process(self, request: _Request) -> None:
        with self._lock:
            have = next(
                (s for s in (self._current, self._pending) if s is not None and s.sha256 == request.sha256),
                None,
            )
            tagged = False
            if have is not None and request.generation is not None and (
                have.generation is None or request.generation > have.generation
            ):
                # Already have it (a daemon announcing the file the watcher saw, say): take the generation.
                have.generation, have.run = request.generation, request.run
                tagged = have is self._current
        if have is not None:
            if tagged:
                self._say(f"the network in use is {self._label(have)}")
            return
        try:
            network = self._build(request.path, request.sha256)
        except Exception as e:  # noqa: BLE001 - NetworkError, or anything ONNX Runtime raises
            if self._stop.is_set():
                return
            if request.source == "file":
                # A writer may still be at work: look once more before complaining.
                if self._stop.wait(self._poll) or self._signatures() != request.signature:
                    return  # changed (or closing): the watcher looks at it again
            reason = str(e) if isinstance(e, NetworkError) else f"{type(e).__name__}: {e}"
            with self._lock:
                self._refuse(request.key)
                keeping = self._keeping()
            what = "" if request.generation is None else f" (generation {request.generation})"
            self._say(f"refused network {request.path}{what}: {_strip_name(reason, request.path)}{keeping}")
            return
        sha = getattr(network, "sha256", None) or request.sha256
        candidate = _Loaded(network, sha, request.path, request.generation, request.run)
        with self._cond:
            if self._closed:
                replaced = candidate
            else:
                replaced, self._pending = self._pending, candidate
                self._cond.notify_all()
        if replaced is not None:
            _close_quietly(replaced.network)  # never handed out
        if replaced is not candidate:
            self._say(f"new network {self._label(candidate)} verified; switching before the next search")

    # ------------------------------------------------------------------ the file watcher

    def _start_watcher(self, baseline: tuple) -> None:
        with self._lock:
            if self._watcher is not None or self._closed:
                return
            self._watcher = threading.Thread(
                target=self._watch, args=(baseline,), name="cyzero-weights-watch", daemon=True
            )
            self._watcher.start()

    def _watch(self, baseline: tuple) -> None:
        seen = baseline  # the (file, side file) stat last dealt with
        candidate = None  # a new stat seen once; acted on when the next poll sees it again
        while not self._stop.wait(self._poll):
            try:
                signature = self._signatures()
                if signature == seen:
                    candidate = None
                    continue
                if signature[0] is None:
                    if seen[0] is not None:
                        self._say(f"network file {self.path} disappeared{self._keeping()}")
                    seen, candidate = signature, None
                    continue
                if signature != candidate:
                    candidate = signature  # still changing? look again next time
                    continue
                candidate = None
                if self._examine(signature):
                    seen = signature
            except Exception as e:  # noqa: BLE001 - the watcher must survive anything
                self._say(f"error while watching {self.path}: {type(e).__name__}: {e}")
                seen = self._signatures()

    def _examine(self, signature: tuple) -> bool:
        """Hash the (stable) file and queue it if new; False when it changed meanwhile."""
        try:
            sha = sha256_file(self.path, cancelled=self._stop.is_set)
        except OSError:
            return False  # gone or unreadable for a moment: look again
        if sha is None:
            return True  # closing
        if self._signatures() != signature:
            return False
        try:
            side = self._side_digest(self.path)
        except NetworkError as e:
            side, side_error = "unusable", str(e)
        else:
            side_error = None
        key = ("file", sha, side)
        with self._lock:
            if key in self._refused or self._known_sha(sha):
                return True  # the same bad file, or the network we have: nothing to do
            if side_error is None and (side is None or side == sha):
                request = _Request(self.path, sha, "file", key, signature=signature)
            else:
                self._refuse(key)
                request = None
                keeping = self._keeping()
        if request is not None:
            self._request(request)
            return True
        if side_error is not None:
            reason = _strip_name(side_error, self.path)
        else:
            reason = (
                f"its sha256 {_short_sha(sha)} does not match {_short_sha(side)} recorded in "
                f"{os.path.basename(sha256_path(self.path))} (still being published, or a stale .sha256 file?)"
            )
        self._say(f"refused network {self.path}: {reason}{keeping}")
        return True

    # ------------------------------------------------------------------ the trainer subscription

    def _subscribe(self, zmq: Any, context: Any, endpoint: str, stop: threading.Event) -> None:
        try:
            socket = context.socket(zmq.SUB)
        except Exception as e:  # noqa: BLE001 - e.g. a terminated context
            self._say(f"cannot follow TrainerEndpoint {endpoint}: {type(e).__name__}: {e}")
            return
        try:
            socket.setsockopt(zmq.LINGER, 0)
            socket.setsockopt(zmq.RCVHWM, 64)
            socket.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
            socket.setsockopt(zmq.SUBSCRIBE, TOPIC)
            socket.connect(endpoint)
        except zmq.ZMQError as e:
            self._say(f"cannot follow TrainerEndpoint {endpoint}: {e}")
            socket.close(0)
            return
        poller = zmq.Poller()
        poller.register(socket, zmq.POLLIN)
        try:
            while not stop.is_set():
                try:
                    ready = dict(poller.poll(_SUB_POLL_MS))
                except zmq.ZMQError as e:
                    if e.errno == zmq.ETERM:
                        break
                    self._say(f"TrainerEndpoint {endpoint}: {e}")
                    stop.wait(0.5)
                    continue
                if socket not in ready:
                    continue
                for _ in range(256):  # drain what is there, then look at the stop flag again
                    if stop.is_set():
                        break
                    try:
                        frames = socket.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    self._on_message(frames, endpoint)
        except Exception as e:  # noqa: BLE001 - say why the subscription ended, never crash
            self._say(f"stopped following TrainerEndpoint {endpoint}: {type(e).__name__}: {e}")
        finally:
            socket.close(0)

    def _limited(self, text: str) -> None:
        dropped = self.message_limit.admit()
        if dropped is not None:
            self._say(text + (f" ({dropped} similar lines suppressed)" if dropped else ""))

    def _on_message(self, frames: list, endpoint: str) -> None:
        try:
            announcement = decode_network_announcement(frames)
        except AnnouncementError as e:
            self._limited(f"dropped a malformed message from {endpoint}: {e}")
            return
        except Exception as e:  # noqa: BLE001 - never crash on input from a socket
            self._limited(f"dropped a malformed message from {endpoint}: {type(e).__name__}")
            return
        self.announce(announcement)

    def announce(self, announcement: NetworkAnnouncement) -> bool:
        """Act on a (decoded) announcement as if it came from the daemon; returns whether a load was queued.

        Used by the subscriber thread; a process that receives announcements
        by other means (a self-play worker) may call it too.
        """
        a = announcement
        with self._lock:
            if self._closed:
                return False
            key = ("trainer", a.generation, a.sha256)
            if key in self._refused:
                return False  # re-announced, still the same bad file
            generations = [
                slot.generation
                for slot in (self._current, self._pending, self._loading, self._next)
                if slot is not None and slot.generation is not None
            ]
            newest = max(generations, default=None)
            if newest is not None and a.generation <= newest:
                older = a.generation < newest
            else:
                older = None
                self._request(_Request(a.path, a.sha256, "trainer", key, a.generation, a.run))
        if older:
            self._limited(
                f"ignored network announcement of generation {a.generation} ({a.path}): "
                f"generation {newest} is newer"
            )
        return older is None


def _close_quietly(network: Any) -> None:
    close = getattr(network, "close", None)
    if close is not None:
        try:
            close()
        except Exception:  # noqa: BLE001
            pass
