"""The follower contract's messages: network announcements and fetches of a network's bytes in pieces.

Both sides import this module: the training daemon publishes with
:class:`Announcer` and the engine's ``TrainerEndpoint`` follower
(:mod:`engine.watchers`) reads what it sends; :class:`RangeFetch` is the
follower's half of a fetch, without the socket.  docs/contracts.md
("Following a trainer") is the contract in prose; this module is its one
implementation.

* PUB/SUB announcement (version 1): ``[TOPIC, msgpack header]``, header
  ``{"type": "network", "version": 1, "generation", "path", "sha256", "run"?,
  "fetch"?, "fetch_version"?}``, re-announced every :data:`REANNOUNCE_S`
  seconds because PUB/SUB drops what was sent before a subscriber joined.
  ``fetch_version`` says which fetch messages the ``fetch`` endpoint speaks
  (absent: 1, the whole file in one reply, which this side no longer speaks).
* DEALER/ROUTER fetch in pieces (version :data:`FETCH_VERSION`, 2), for an
  engine that cannot read ``path``: request ``[{"type": "fetch_network",
  "version": 2, "generation", "sha256", "offset", "length"}]``; reply
  ``[{"type": "network_bytes", "version": 2, "generation", "sha256", "size",
  "offset", "length"}, piece]`` with bytes ``offset .. offset + length`` of
  the file (``length`` is the asked length cut at ``size``), or
  ``[{"type": "fetch_refused", "version": 2, "generation", "sha256",
  "offset"?, "reason"}]`` (not offered or superseded, unreadable, too large, a
  bad range).  The follower keeps :data:`FETCH_CREDIT` pieces of
  :data:`FETCH_PIECE_BYTES` asked and asks the next as each arrives; the daemon
  reads each piece from the file when asked, so its memory is bounded by
  :func:`fetch_memory_bound`, not by copies of the file.  A request of another
  version is answered by a refusal in that version, so neither side waits.
* CurveZMQ: keys are certificate files as ``zmq.auth.create_certificates``
  writes them (:func:`load_client_keys`, :func:`load_server_keys`).

Never pickle; every decoder raises only :class:`AnnouncementError` for bad
input, which the receiver logs and drops.  Needs msgpack and pyzmq, never torch.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import re
import threading
import time
from typing import Any, Callable, Iterable, Iterator, Optional

import msgpack

from engine.files import is_sha256_hex

__all__ = [
    "ANNOUNCEMENT_TYPE",
    "ANNOUNCEMENT_VERSION",
    "FETCH_CREDIT",
    "FETCH_PIECE_BYTES",
    "FETCH_QUEUE",
    "FETCH_VERSION",
    "MAX_NETWORK_BYTES",
    "PIECE_TIMEOUT_S",
    "REANNOUNCE_S",
    "TOPIC",
    "AnnouncementError",
    "Announcer",
    "ClientKeys",
    "FetchError",
    "FetchReply",
    "FetchRequest",
    "KeyFileError",
    "NetworkAnnouncement",
    "RangeFetch",
    "decode_fetch_reply",
    "decode_fetch_request",
    "decode_network_announcement",
    "encode_fetch_refusal",
    "encode_fetch_reply",
    "encode_fetch_request",
    "encode_network_announcement",
    "fetch_memory_bound",
    "load_client_keys",
    "load_server_keys",
    "unpack_header",
]

TOPIC = b"network"  # first frame of an announcement (what a SUB socket subscribes to)
ANNOUNCEMENT_TYPE = "network"
FETCH_REQUEST_TYPE = "fetch_network"
FETCH_REPLY_TYPE = "network_bytes"
FETCH_REFUSED_TYPE = "fetch_refused"
ANNOUNCEMENT_VERSION = 1  # the version of an announcement
FETCH_VERSION = 2  # the version of a fetch request, reply and refusal: 2 is in pieces
REANNOUNCE_S = 2.0  # the daemon repeats its current announcement this often
MAX_HEADER_BYTES = 64 * 1024
MAX_MESSAGE_BYTES = 1 << 20  # ZMQ_MAXMSGSIZE of the SUB socket: a peer sending more is disconnected
# A fetch in pieces (docs/scale.md, "Publishing networks", has the figures that chose these):
FETCH_PIECE_BYTES = 1 << 20  # the largest piece a request may ask for, and what a follower asks
FETCH_CREDIT = 4  # the pieces a follower keeps asked and not yet received
FETCH_QUEUE = 2 * FETCH_CREDIT  # replies the daemon queues for one follower (its ROUTER's SNDHWM): more are dropped
PIECE_TIMEOUT_S = 10.0  # a piece not received this long after it was asked is asked again
MAX_NETWORK_BYTES = 1 << 30  # the largest network a fetch accepts (a 20x256 net is ~100 MB)
MAX_PATH_CHARS = 4096
MAX_RUN_CHARS = 256
MAX_ENDPOINT_CHARS = 512
MAX_REASON_CHARS = 1000

_logger = logging.getLogger(__name__)


_WILDCARD = re.compile(r"tcp://(\*|0\.0\.0\.0|\[::\]):([0-9]+|\*)")


def is_wildcard(endpoint: str) -> bool:
    """Whether ``endpoint`` is a bound wildcard (``*``, ``0.0.0.0``, ``[::]``): not a host to dial."""
    return _WILDCARD.fullmatch(endpoint.strip()) is not None


def rehost(endpoint: str, host: str, ipv6_host: Optional[str] = None) -> str:
    """``endpoint`` with ``host`` in place of a wildcard host (``ipv6_host`` for ``[::]`` when given);
    any other endpoint as it is. The one place a wildcard is rewritten: announced as ``*``, dialled by a
    local child, shown to a remote machine, or filled in by the peer that dialled this host."""
    match = _WILDCARD.fullmatch(endpoint.strip())
    if match is None:
        return endpoint
    chosen = ipv6_host if ipv6_host is not None and match.group(1) == "[::]" else host
    return f"tcp://{chosen}:{match.group(2)}"



class AnnouncementError(ValueError):
    """A malformed message (wrong frames, not msgpack, wrong fields or types, another version)."""


class KeyFileError(ValueError):
    """A CurveZMQ certificate file that is missing or unusable; the message names the file."""


# --------------------------------------------------------------------------- frames and headers


def _frame_bytes(frame: Any, which: str) -> bytes:
    if isinstance(frame, (bytes, bytearray)):
        return bytes(frame)
    if isinstance(frame, memoryview):
        return frame.tobytes()
    data = getattr(frame, "bytes", None)  # a zmq.Frame
    if isinstance(data, bytes):
        return data
    raise AnnouncementError(f"the {which} frame is a {type(frame).__name__}, not bytes")


def _frames(frames: Iterable[Any]) -> list:
    try:
        return list(frames)
    except TypeError:
        raise AnnouncementError(f"expected a list of frames, got {type(frames).__name__}") from None


def _pack(kind: str, version: int = ANNOUNCEMENT_VERSION, **fields: Any) -> bytes:
    header = {"type": kind, "version": version}
    header.update((key, value) for key, value in fields.items() if value is not None)
    return msgpack.packb(header, use_bin_type=True)


def unpack_header(data: bytes | memoryview, error: type[ValueError] = ValueError) -> dict:
    """A message's msgpack header as a dict (at most MAX_HEADER_BYTES, a map), or ``error``
    with a one-line reason; shared by this contract and the trainer's wire messages."""
    if len(data) > MAX_HEADER_BYTES:
        raise error(f"header of {len(data)} bytes is larger than {MAX_HEADER_BYTES}")
    try:
        header = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except Exception as e:  # noqa: BLE001 - FormatError, ExtraData, StackError, UnicodeDecodeError, ...
        raise error(f"header is not valid msgpack ({type(e).__name__})") from None
    if not isinstance(header, dict):
        raise error(f"header must be a msgpack map, got {type(header).__name__}")
    return header


class VersionError(AnnouncementError):
    """A well-formed header of another ``version``: ``header`` lets the daemon answer in that version."""

    def __init__(self, message: str, header: dict) -> None:
        super().__init__(message)
        self.header = header


def _unpack(frame: Any, kinds: tuple[str, ...], expected: int = ANNOUNCEMENT_VERSION) -> dict:
    """The checked header of one of ``kinds`` (type and version); AnnouncementError otherwise."""
    header = unpack_header(_frame_bytes(frame, "header"), AnnouncementError)
    kind = header.get("type")
    if kind not in kinds:
        raise AnnouncementError(f"header 'type' must be {' or '.join(map(repr, kinds))}, got {str(kind)[:40]!r}")
    version = header.get("version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise AnnouncementError(f"header 'version' must be an integer, got {type(version).__name__}")
    if version != expected:
        raise VersionError(f"unsupported {kind} message version {version} (this side reads version {expected})",
                           header)
    return header


def _required(header: dict, *keys: str) -> None:
    for key in keys:
        if key not in header:
            raise AnnouncementError(f"header has no {key!r}")


def _generation(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise AnnouncementError(f"'generation' must be an integer, got {type(value).__name__}")
    if not 0 <= value < 2**63:
        raise AnnouncementError(f"'generation' must be >= 0, got {value}")
    return value


def _sha256(value: Any) -> str:
    if not isinstance(value, str):
        raise AnnouncementError(f"'sha256' must be a string, got {type(value).__name__}")
    if not is_sha256_hex(value.lower()):
        raise AnnouncementError(f"'sha256' must be 64 hex digits, got {value[:80]!r}")
    return value.lower()


def _text(value: Any, name: str, limit: int) -> Optional[str]:
    if value is not None and (not isinstance(value, str) or len(value) > limit or "\x00" in value):
        raise AnnouncementError(f"{name!r} must be a string of at most {limit} characters")
    return value


def _count(value: Any, name: str, limit: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= limit:
        raise AnnouncementError(f"{name!r} must be an integer in 0..{limit}, got {str(value)[:40]}")
    return value


# --------------------------------------------------------------------------- announcements


@dataclasses.dataclass(frozen=True)
class NetworkAnnouncement:
    """A training daemon's "generation N is at this path, with this sha256".

    ``fetch``: the daemon's ROUTER endpoint that serves the bytes to an engine
    that cannot read ``path`` (``tcp://*:PORT``: the host of the endpoint the
    announcement came from); ``None`` when the daemon serves none.
    """

    generation: int
    path: str
    sha256: str
    run: Optional[str] = None
    fetch: Optional[str] = None
    fetch_version: Optional[int] = None  # the fetch messages ``fetch`` speaks (None when there is no ``fetch``)


def _announcement(generation: Any, path: Any, sha256: Any, run: Any, fetch: Any,
                  fetch_version: Any = FETCH_VERSION) -> NetworkAnnouncement:
    generation = _generation(generation)
    if not isinstance(path, str):
        raise AnnouncementError(f"'path' must be a string, got {type(path).__name__}")
    if not path or len(path) > MAX_PATH_CHARS or "\x00" in path:
        raise AnnouncementError(f"'path' must be a file path of 1-{MAX_PATH_CHARS} characters")
    if not os.path.isabs(path):
        raise AnnouncementError(f"'path' must be absolute, got {path[:100]!r}")
    sha256 = _sha256(sha256)
    run = _text(run, "run", MAX_RUN_CHARS)
    fetch = _text(fetch, "fetch", MAX_ENDPOINT_CHARS)
    if fetch is not None and "://" not in fetch:
        raise AnnouncementError(f"'fetch' must be an endpoint such as tcp://HOST:PORT, got {fetch[:80]!r}")
    if fetch is None:
        fetch_version = None
    else:
        fetch_version = _count(fetch_version, "fetch_version", 2**31)
    return NetworkAnnouncement(generation, path, sha256, run, fetch, fetch_version)


def encode_network_announcement(
    generation: int,
    path: str | os.PathLike,
    sha256: str,
    run: Optional[str] = None,
    fetch: Optional[str] = None,
) -> list[bytes]:
    """The frames ``[TOPIC, msgpack header]`` announcing a network; raises :class:`AnnouncementError`."""
    a = _announcement(generation, os.fspath(path), sha256, run, fetch)
    header = _pack(ANNOUNCEMENT_TYPE, generation=a.generation, path=a.path, sha256=a.sha256, run=a.run, fetch=a.fetch,
                   fetch_version=a.fetch_version)
    return [TOPIC, header]


def decode_network_announcement(frames: Iterable[Any]) -> NetworkAnnouncement:
    """Parse and check ``[TOPIC, msgpack header]``; raises :class:`AnnouncementError` on anything else.

    Unknown header keys are ignored (room for later fields in version 1); a
    different ``version`` is refused.
    """
    frames = _frames(frames)
    if len(frames) != 2:
        raise AnnouncementError(f"expected 2 frames (topic, header), got {len(frames)}")
    topic = _frame_bytes(frames[0], "topic")
    if topic != TOPIC:
        raise AnnouncementError(f"unknown topic {topic[:40]!r}, expected {TOPIC!r}")
    header = _unpack(frames[1], (ANNOUNCEMENT_TYPE,))
    _required(header, "generation", "path", "sha256")
    return _announcement(header["generation"], header["path"], header["sha256"], header.get("run"),
                         header.get("fetch"), header.get("fetch_version", 1))  # a daemon from before pieces: 1


# --------------------------------------------------------------------------- fetching


def fetch_memory_bound(followers: int) -> int:
    """The most bytes of pieces the daemon holds at once for ``followers`` fetching together that keep to
    :data:`FETCH_CREDIT` (each piece is read from the file when asked and let go once sent): followers x
    credit x piece size, whatever the network's size. A peer that asks for more than its credit is held to
    :data:`FETCH_QUEUE` queued replies and the one being sent; the rest are dropped and it asks again."""
    return followers * FETCH_CREDIT * FETCH_PIECE_BYTES


class FetchError(AnnouncementError):
    """A fetch that cannot go on (refused, a wrong or malformed reply, the wrong bytes); says which, and from where."""


@dataclasses.dataclass(frozen=True)
class FetchRequest:
    """An engine asking for ``length`` bytes at ``offset`` of an announced network."""

    generation: int
    sha256: str
    offset: int = 0
    length: int = FETCH_PIECE_BYTES


@dataclasses.dataclass(frozen=True)
class FetchReply:
    """The header of a fetch reply: one raw frame of ``length`` bytes at ``offset`` of a file of ``size``
    follows it, unless ``refused`` says why the daemon will not serve it (then no frame follows)."""

    generation: int
    sha256: str
    size: int = 0
    offset: int = 0
    length: int = 0
    refused: Optional[str] = None


def encode_fetch_request(generation: int, sha256: str, offset: int = 0,
                         length: int = FETCH_PIECE_BYTES) -> list[bytes]:
    """``[msgpack header]`` asking for a piece of generation ``generation`` with this sha256 (a DEALER sends it)."""
    return [_pack(FETCH_REQUEST_TYPE, FETCH_VERSION, generation=_generation(generation), sha256=_sha256(sha256),
                  offset=_count(offset, "offset", 2**62), length=_count(length, "length", 2**62))]


def decode_fetch_request(frames: Iterable[Any]) -> FetchRequest:
    """Parse a request as the daemon's ROUTER passes it on, without the routing identity frame.

    A request of another version raises :class:`VersionError` (its header lets the daemon refuse in
    kind); whether the range is one the daemon serves is the daemon's question (a refusal, not a drop)."""
    frames = _frames(frames)
    if len(frames) != 1:
        raise AnnouncementError(f"expected 1 frame (the request header), got {len(frames)}")
    header = _unpack(frames[0], (FETCH_REQUEST_TYPE,), FETCH_VERSION)
    _required(header, "generation", "sha256", "offset", "length")
    return FetchRequest(_generation(header["generation"]), _sha256(header["sha256"]),
                        _count(header["offset"], "offset", 2**62), _count(header["length"], "length", 2**62))


def encode_fetch_reply(generation: int, sha256: str, size: int, offset: int, piece: Any) -> list:
    """``[header, piece]``: ``piece`` (bytes or a buffer) is the file's bytes at ``offset``; the file has ``size``."""
    length = memoryview(piece).nbytes
    header = _pack(FETCH_REPLY_TYPE, FETCH_VERSION, generation=_generation(generation), sha256=_sha256(sha256),
                   size=_count(size, "size", 2**62), offset=_count(offset, "offset", 2**62), length=length)
    return [header, piece]


def encode_fetch_refusal(generation: int, sha256: str, reason: str, offset: Optional[int] = None,
                         version: int = FETCH_VERSION) -> list[bytes]:
    """``[header]`` saying why a request is not served (not offered, unreadable, too large, a bad range);
    ``version``: the requester's, for one of another version (a version-1 refusal has the same fields)."""
    return [_pack(FETCH_REFUSED_TYPE, version, generation=_generation(generation), sha256=_sha256(sha256),
                  offset=offset, reason=str(reason)[:MAX_REASON_CHARS])]


def decode_fetch_reply(frame: Any) -> FetchReply:
    """Parse the first frame of a reply; the caller checks that one frame of ``length`` bytes follows."""
    header = _unpack(frame, (FETCH_REPLY_TYPE, FETCH_REFUSED_TYPE), FETCH_VERSION)
    _required(header, "generation", "sha256")
    generation, sha256 = _generation(header["generation"]), _sha256(header["sha256"])
    if header["type"] == FETCH_REFUSED_TYPE:
        reason = _text(header.get("reason"), "reason", MAX_REASON_CHARS) or "no reason given"
        offset = header.get("offset")
        return FetchReply(generation, sha256, offset=0 if offset is None else _count(offset, "offset", 2**62),
                          refused=reason)
    _required(header, "size", "offset", "length")
    size = _count(header["size"], "size", 2**62)
    offset = _count(header["offset"], "offset", size)
    length = _count(header["length"], "length", min(FETCH_PIECE_BYTES, size - offset))
    return FetchReply(generation, sha256, size, offset, length)


class RangeFetch:
    """One follower's fetch of one network in pieces, without the socket (the engine's follower and the
    bench's simulated ones drive it alike).

    Send every message :meth:`requests` returns, hand each reply to :meth:`receive` and write the pieces
    it returns, in that order (they are hashed here); when :attr:`done`, :meth:`verify` checks the
    size and sha256. :data:`FETCH_CREDIT` pieces are kept asked: a piece that came before an earlier
    one waits here (so at most credit x piece bytes), and a piece not received ``piece_timeout``
    seconds after it was asked is asked again. :class:`FetchError` says why a fetch cannot go on,
    naming ``where`` the bytes come from.
    """

    def __init__(self, generation: int, sha256: str, *, where: str = "the daemon",
                 max_bytes: int = MAX_NETWORK_BYTES, credit: int = FETCH_CREDIT, piece: int = FETCH_PIECE_BYTES,
                 piece_timeout: float = PIECE_TIMEOUT_S) -> None:
        self.generation, self.sha256, self.where = generation, sha256, where
        self.max_bytes, self.credit, self.piece, self.piece_timeout = max_bytes, credit, piece, piece_timeout
        self.size: Optional[int] = None  # from the first reply
        self.received = 0  # bytes handed on in order (and hashed)
        self.asked_again = 0  # pieces asked again after piece_timeout
        self._next = 0  # the next offset not asked yet
        self._asked: dict[int, float] = {}  # offset -> when it was last asked
        self._early: dict[int, Any] = {}  # pieces received before an earlier one
        self._digest = hashlib.sha256()

    @property
    def done(self) -> bool:
        return self.size is not None and self.received == self.size

    def requests(self, now: float) -> list[list[bytes]]:
        """The requests to send now: pieces overdue, then new ones up to the credit."""
        out = []
        for offset, asked in self._asked.items():
            if now - asked >= self.piece_timeout:
                self._asked[offset] = now
                self.asked_again += 1
                out.append(encode_fetch_request(self.generation, self.sha256, offset, self.piece))
        end = self.piece if self.size is None else self.size  # the first reply says the size: ask one piece till then
        while (self._next == 0 or self._next < end) and len(self._asked) + len(self._early) < self.credit:
            self._asked[self._next] = now
            out.append(encode_fetch_request(self.generation, self.sha256, self._next, self.piece))
            self._next += self.piece
        return out

    def receive(self, frames: list) -> list:
        """The pieces a reply lets this side write now, in order (none for a duplicate or an early piece)."""
        where = self.where
        try:
            reply = decode_fetch_reply(frames[0]) if frames else None
        except AnnouncementError as e:
            raise FetchError(f"malformed reply from {where}: {e}") from None
        if reply is None:
            raise FetchError(f"malformed reply from {where}: no frames")
        if (reply.generation, reply.sha256) != (self.generation, self.sha256):
            raise FetchError(f"{where} answered for generation {reply.generation}, not {self.generation}")
        if reply.refused is not None:
            raise FetchError(f"{where} refused to send it: {reply.refused}")
        if reply.size > self.max_bytes:
            raise FetchError(f"{where} offers {reply.size} bytes, more than {self.max_bytes}")
        if self.size is not None and reply.size != self.size:
            raise FetchError(f"{where} said the file has {self.size} bytes, then {reply.size}")
        if len(frames) != 2:
            raise FetchError(f"the reply from {where} has {len(frames) - 1} frames of bytes, not 1")
        data = _frame_buffer(frames[1])
        if memoryview(data).nbytes != reply.length or reply.length != min(self.piece, reply.size - reply.offset):
            raise FetchError(f"the reply from {where} carries {memoryview(data).nbytes} bytes at {reply.offset} "
                             f"where its header says {reply.length} and {min(self.piece, reply.size - reply.offset)} "
                             "were asked")
        if self.size is None:
            self.size = reply.size
        if self._asked.pop(reply.offset, None) is None:
            return []  # a piece asked again that came twice
        self._early[reply.offset] = data
        out = []
        while self.received in self._early:
            piece = self._early.pop(self.received)
            self._digest.update(piece)
            self.received += memoryview(piece).nbytes
            out.append(piece)
            if self.done:
                break
        return out

    def verify(self) -> None:
        """FetchError unless every byte came and they have the announced sha256."""
        if not self.done:
            raise FetchError(f"{self.where} sent {self.received} of {self.size} bytes")
        digest = self._digest.hexdigest()
        if digest != self.sha256:
            raise FetchError(f"the bytes fetched from {self.where} have sha256 {digest[:12]}, "
                             f"not the announced {self.sha256[:12]}")


def _frame_buffer(frame: Any) -> Any:
    """A received frame's bytes without a copy (a zmq.Frame's buffer), or the bytes as they are."""
    buffer = getattr(frame, "buffer", None)
    if buffer is not None:
        return buffer
    if isinstance(frame, (bytes, bytearray, memoryview)):
        return frame
    raise AnnouncementError(f"a piece is a {type(frame).__name__}, not bytes")


# --------------------------------------------------------------------------- CurveZMQ keys


@dataclasses.dataclass(frozen=True)
class ClientKeys:
    """What a follower needs to talk to a daemon that requires CurveZMQ (z85-encoded keys)."""

    server_public: bytes
    public: bytes
    secret: bytes

    def apply(self, socket: Any) -> None:
        """Make ``socket`` a CURVE client of the daemon (before it connects)."""
        socket.curve_serverkey = self.server_public
        socket.curve_publickey = self.public
        socket.curve_secretkey = self.secret


SERVER_PUBLIC_FILE = "server.key"
CLIENT_SECRET_FILE = "client.key_secret"


def _load_certificate(path: str) -> tuple[bytes, Optional[bytes]]:
    """(public, secret or None) from a zmq.auth certificate; :class:`KeyFileError` naming ``path``."""
    from zmq.auth.certs import load_certificate
    from zmq.utils import z85

    if not os.path.isfile(path):
        raise KeyFileError(f"CurveZMQ key file not found: {path}")
    try:
        public, secret = load_certificate(path)
    except (OSError, ValueError) as e:
        raise KeyFileError(f"unreadable CurveZMQ key file {path}: {e}") from None
    for name, key in (("public", public), ("secret", secret)):
        if key is None:
            continue
        try:
            ok = len(key) == 40 and len(z85.decode(key)) == 32
        except ValueError:
            ok = False
        if not ok:
            raise KeyFileError(f"{path}: the {name} key is not 40 z85 characters (a damaged certificate?)")
    return public, secret


def _load_key_pair(path: str) -> tuple[bytes, bytes]:
    public, secret = _load_certificate(path)
    if secret is None:
        raise KeyFileError(
            f"{path} holds no secret key (a public .key file; the key pair is the .key_secret file)"
        )
    return public, secret


def load_client_keys(location: str | os.PathLike) -> ClientKeys:
    """Read a follower's keys: a directory holding the daemon's public ``server.key`` and the
    client's key pair (``client.key_secret``, or the only ``*.key_secret`` there).

    Raises :class:`KeyFileError` naming the file that is missing or bad.
    """
    folder = os.path.abspath(os.path.expanduser(os.fspath(location)))
    if not os.path.isdir(folder):
        raise KeyFileError(
            f"TrainerKeys must name a directory holding {SERVER_PUBLIC_FILE} and {CLIENT_SECRET_FILE}, "
            f"not {folder}"
        )
    server_public, _ = _load_certificate(os.path.join(folder, SERVER_PUBLIC_FILE))
    client = os.path.join(folder, CLIENT_SECRET_FILE)
    if not os.path.exists(client):
        pairs = sorted(
            name for name in os.listdir(folder)
            if name.endswith(".key_secret") and name != SERVER_PUBLIC_FILE + "_secret"
        )
        if len(pairs) != 1:
            found = f" (found {', '.join(pairs)})" if pairs else ""
            raise KeyFileError(f"CurveZMQ key file not found: {client}{found}")
        client = os.path.join(folder, pairs[0])
    public, secret = _load_key_pair(client)
    return ClientKeys(server_public, public, secret)


def load_server_keys(secret_file: str | os.PathLike) -> tuple[bytes, bytes]:
    """The daemon's (public, secret) key pair from its ``.key_secret`` certificate."""
    return _load_key_pair(os.path.abspath(os.fspath(secret_file)))


# --------------------------------------------------------------------------- the daemon's side



def waiting(socket: Any, most: int, copy: bool = True) -> Iterator[Any]:
    """The messages ``socket`` holds now, ``most`` at most, read without blocking, each when the one
    before is handled: one socket's burst must not keep a loop from its other work (the daemon's
    ingest and announcer, a worker, the fleet bench's simulated peers)."""
    import zmq

    for _ in range(most):
        try:
            frames = socket.recv_multipart(zmq.NOBLOCK, copy=copy)
        except zmq.Again:
            return
        yield frames


class Announcer:
    """The daemon's publisher: binds PUB (and a ROUTER serving the announced bytes, if asked).

    :meth:`announce` sends at once; a thread repeats the current announcement
    every ``interval`` seconds for subscribers that joined since, and answers
    fetch requests for the current network, each piece read from the file
    (one descriptor a generation) when it is asked: the pieces held at once
    are bounded by :func:`fetch_memory_bound`, and a follower that stops
    asking holds up no other.  With ``server_keys`` (from
    :func:`load_server_keys`) both sockets are CURVE servers: run a
    ``zmq.auth`` authenticator on ``context`` to say which clients may connect.
    Never needs torch.
    """

    def __init__(
        self,
        endpoint: str,
        *,
        fetch_endpoint: Optional[str] = None,
        interval: float = REANNOUNCE_S,
        server_keys: Optional[tuple[bytes, bytes]] = None,
        context: Any = None,
        log: Optional[Callable[[str], object]] = None,
    ) -> None:
        import zmq

        self._zmq = zmq
        self._interval = float(interval)
        self._log = log or _logger.warning
        context = context or zmq.Context.instance()
        self._pub = context.socket(zmq.PUB)
        self._router = context.socket(zmq.ROUTER) if fetch_endpoint else None
        try:
            for socket in (self._pub, self._router):
                if socket is None:
                    continue
                socket.setsockopt(zmq.LINGER, 0)
                if server_keys is not None:
                    socket.curve_server = True
                    socket.curve_publickey, socket.curve_secretkey = server_keys
            if self._router is not None:
                self._router.setsockopt(zmq.MAXMSGSIZE, MAX_HEADER_BYTES)  # requests are one small header
                self._router.setsockopt(zmq.SNDHWM, FETCH_QUEUE)  # replies queued a follower: the memory bound
            self._pub.bind(endpoint)
            self.endpoint = self._pub.getsockopt_string(zmq.LAST_ENDPOINT)
            self.fetch_endpoint: Optional[str] = None
            if self._router is not None:
                self._router.bind(fetch_endpoint)
                bound = self._router.getsockopt_string(zmq.LAST_ENDPOINT)
                # A wildcard bind is announced as "*": followers put in the host they subscribed to.
                self.fetch_endpoint = rehost(bound, "*")
        except BaseException:
            self._close_sockets()
            raise
        self._lock = threading.Lock()
        self._current: Optional[NetworkAnnouncement] = None
        self._served: Optional[tuple[NetworkAnnouncement, int, int]] = None  # (announcement, fd, size): the thread's
        self._send_now = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cyzero-announcer", daemon=True)
        self._thread.start()

    def announce(self, generation: int, path: str | os.PathLike, sha256: str, run: Optional[str] = None) -> None:
        """Make this the current network (sent now, then every ``interval`` seconds)."""
        path = os.path.abspath(os.fspath(path))
        announcement = _announcement(generation, path, sha256, run, self.fetch_endpoint)
        with self._lock:
            self._current = announcement
        self._send_now.set()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10.0)  # it polls every 50 ms; a loaded machine may still be slow to run it
        if not self._thread.is_alive():  # else its sockets stay open rather than be closed under it
            self._close_sockets()
            self._close_served()

    def __enter__(self) -> "Announcer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _close_sockets(self) -> None:
        for socket in (self._pub, self._router):
            if socket is not None:
                socket.close(0)

    def _run(self) -> None:
        zmq = self._zmq
        router = self._router
        poller = zmq.Poller()
        if router is not None:
            poller.register(router, zmq.POLLIN)
        next_send = time.monotonic()
        while not self._stop.is_set():
            try:
                if router is not None:
                    if router in dict(poller.poll(50)):
                        self._answer_fetches(router)
                else:
                    self._send_now.wait(0.05)
                if self._send_now.is_set() or time.monotonic() >= next_send:
                    self._send_now.clear()
                    with self._lock:
                        current = self._current
                    if current is not None:
                        self._pub.send_multipart(
                            encode_network_announcement(current.generation, current.path, current.sha256,
                                                        current.run, current.fetch)
                        )
                    next_send = time.monotonic() + self._interval
            except zmq.ZMQError as e:
                if e.errno == zmq.ETERM:
                    return
                self._log(f"announcer: {e}")
                self._stop.wait(0.5)

    def _answer_fetches(self, router: Any) -> None:
        for frames in waiting(router, 64):
            identity, body = frames[0], frames[1:]
            try:
                reply = self._reply(decode_fetch_request(body))
            except VersionError as e:
                reply = self._version_refusal(e)
                if reply is None:
                    self._log(f"dropped a malformed fetch request: {e}")
                    continue
            except AnnouncementError as e:
                self._log(f"dropped a malformed fetch request: {e}")
                continue
            router.send_multipart([identity, *reply], copy=False)  # a reply to a departed follower is dropped

    def _version_refusal(self, e: VersionError) -> Optional[list]:
        """A refusal in the requester's version, which it reads: a clear error rather than a wait."""
        header = e.header
        try:
            return encode_fetch_refusal(
                _generation(header.get("generation")), _sha256(header.get("sha256")),
                f"this daemon serves fetches in pieces (fetch version {FETCH_VERSION}), not version "
                f"{header['version']}: run the same cyzero version on the engine and the daemon",
                version=header["version"])
        except AnnouncementError:
            return None

    def _reply(self, request: FetchRequest) -> list:
        with self._lock:
            current = self._current
        refuse = lambda reason: encode_fetch_refusal(request.generation, request.sha256, reason, request.offset)  # noqa: E731
        if current is None or (current.generation, current.sha256) != (request.generation, request.sha256):
            offered = "nothing" if current is None else f"generation {current.generation}"
            return refuse(f"generation {request.generation} with that sha256 is not offered (offered: {offered})")
        try:
            fd, size = self._open(current)
        except OSError as e:
            return refuse(f"cannot serve {current.path}: {e}")
        if request.offset > size or not 1 <= request.length <= FETCH_PIECE_BYTES:
            return refuse(f"bad range: {request.length} bytes at {request.offset} of a file of {size} bytes "
                          f"(a piece is 1-{FETCH_PIECE_BYTES} bytes within the file)")
        try:
            piece = os.pread(fd, min(request.length, size - request.offset), request.offset)
        except OSError as e:
            return refuse(f"cannot serve {current.path}: {e}")
        if len(piece) != min(request.length, size - request.offset):
            return refuse(f"cannot serve {current.path}: it is shorter than the {size} bytes it had")
        return encode_fetch_reply(request.generation, request.sha256, size, request.offset, piece)

    def _open(self, current: NetworkAnnouncement) -> tuple[int, int]:
        """The descriptor and size of the current network's file, opened on its first request: a file
        renamed over or removed later is still served as announced."""
        if self._served is not None and self._served[0] is current:
            return self._served[1], self._served[2]
        self._close_served()
        fd = os.open(current.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        try:
            size = os.fstat(fd).st_size
            if size > MAX_NETWORK_BYTES:
                raise OSError(f"{size} bytes is more than {MAX_NETWORK_BYTES}")
        except OSError:
            os.close(fd)
            raise
        self._served = (current, fd, size)
        return fd, size

    def _close_served(self) -> None:
        if self._served is not None:
            os.close(self._served[1])
            self._served = None
