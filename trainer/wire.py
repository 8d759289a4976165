"""The daemon's wire: messages between self-play workers (DEALER) and the training daemon (ROUTER).

Every message is ``[msgpack header, raw frame, ...]``.  The header is a map with
``type``, ``version`` (:data:`WIRE_VERSION`), the message's ids and fields, and
``frames``: one ``{"dtype", "shape"}`` entry per raw frame that follows, so a
receiver rebuilds each array with ``np.frombuffer`` after checking its dtype
against :data:`DTYPES`, its shape and its byte count.  Never pickle.

==============  ======================  ======================================================
type            sent by                 header fields (frames)
==============  ======================  ======================================================
``register``    worker                  ``worker``, ``host``, ``pid``, ``devices``, ``software``
``registered``  daemon                  ``run``, ``generation``?, ``path``?, ``sha256``?,
                                        ``publish``?, ``selfplay``, ``credit`` (frames: the
                                        openings' FENs as ``uint8 [bytes]``, one per line, or none)
``heartbeat``   worker                  ``worker``, ``playing``, ``positions_per_s``, ``generation``
``game``        worker                  ``worker``, ``game``, ``generation``, ``positions``,
                                        ``result``, ``termination`` (frames: the V6 records as
                                        one gzip member, ``uint8 [bytes]``, which the daemon
                                        inflates to check and stores as it is; the PGN as
                                        ``uint8 [bytes]``)
``ack``         daemon                  ``games``: the game ids now durable in the replay store;
                                        ``credit``: the games this worker may have sent and not
                                        yet seen acknowledged, from now on
``refused``     daemon                  ``reason``, ``game``?: never resend this message as it is
``error``       daemon                  ``reason``, ``game``?: a failure on the daemon's side;
                                        keep the game and resend it later
``stop``        daemon                  ``reason``: stop playing and exit
==============  ======================  ======================================================

Flow control is credit: a worker sends a game only while fewer than ``credit`` of
its games await their acks (the rest wait on the worker, which has them anyway), so
what a fleet has in flight is what the daemon granted, however many games it plays.

Limits: a header at most :data:`MAX_HEADER_BYTES` (64 KiB, as the announcements'),
a raw frame at most :data:`MAX_FRAME_BYTES` (64 MiB: a game of up to 8,031
positions), at most :data:`MAX_FRAMES` raw frames of at most 8 dimensions; ids
are 1-128 characters of ``A-Za-z0-9._:-`` (a uuid hex for a game).

Unknown header keys are ignored (room for later fields in version 1); another
``version`` is refused.  :func:`decode` raises only :class:`WireError` for bad
input (one line saying what is wrong), which the receiver logs and drops.
Needs numpy and msgpack, never torch.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from typing import Any, Iterable, Optional, Sequence, Union

import msgpack
import numpy as np

from engine.announce import MAX_HEADER_BYTES, unpack_header
from engine.files import is_sha256_hex
from trainer.records import RECORD_BYTES, RECORD_DTYPE, check_records, compress_records, inflate_records

__all__ = [
    "DTYPES",
    "MAX_CREDIT",
    "MAX_FRAMES",
    "MAX_FRAME_BYTES",
    "MAX_HEADER_BYTES",
    "RESULTS",
    "WIRE_VERSION",
    "Ack",
    "ErrorReply",
    "Game",
    "Heartbeat",
    "Message",
    "Refused",
    "Register",
    "Registered",
    "Stop",
    "WireError",
    "decode",
    "decode_arrays",
    "encode",
    "encode_arrays",
]

# 2: a game's records travel as one gzip member (the worker compresses, not the daemon);
# 3: registered and ack carry the worker's credit, which replaces version 2's hold
WIRE_VERSION = 3
MAX_FRAME_BYTES = 64 << 20  # one raw frame; a game of 8,031 positions fills it
MAX_FRAMES = 8  # raw frames after the header
MAX_DIMS = 8
MAX_ID_CHARS = 128
MAX_TEXT_CHARS = 1000  # host, software, termination, reasons
MAX_DEVICES = 64
MAX_ACK_GAMES = 4096
MAX_CREDIT = 4096  # the most games a daemon may let one worker have awaiting acks (MAX_ACK_GAMES: one ack)
MAX_COUNT = 2**31 - 1
RESULTS = ("1-0", "0-1", "1/2-1/2")

# The frame dtypes a peer may declare, by wire name; all little-endian, so both ends agree.
DTYPES: dict[str, np.dtype] = {
    "uint8": np.dtype("<u1"),
    "int32": np.dtype("<i4"),
    "int64": np.dtype("<i8"),
    "float16": np.dtype("<f2"),
    "float32": np.dtype("<f4"),
}
_ID = re.compile(r"[A-Za-z0-9._:-]{1,%d}" % MAX_ID_CHARS)


class WireError(ValueError):
    """A malformed message: unknown type, other version, missing or mistyped field, bad or oversized frame."""


# --------------------------------------------------------------------------- messages


@dataclasses.dataclass(frozen=True)
class Register:
    """A worker introducing itself; ``worker`` is its id for the whole run (it chooses it)."""

    worker: str
    host: str
    pid: int
    devices: tuple[str, ...]
    software: str


@dataclasses.dataclass(frozen=True)
class Registered:
    """The daemon's welcome: its run, the generation to play (all three ``None`` before the first),
    where it announces new generations (``publish``; a ``*`` host means the host the worker
    connected to), how to play (``selfplay``: the run's ``[selfplay]`` keys), the start
    positions (``openings``: FENs, sent as one text frame) and the worker's first ``credit``."""

    run: str
    generation: Optional[int] = None
    path: Optional[str] = None
    sha256: Optional[str] = None
    publish: Optional[str] = None
    selfplay: dict = dataclasses.field(default_factory=dict)
    openings: tuple[str, ...] = ()
    credit: int = 1


@dataclasses.dataclass(frozen=True)
class Heartbeat:
    """A worker's pulse: games in progress, positions/s, and the generation it plays."""

    worker: str
    playing: int  # games in progress
    positions_per_s: float
    generation: int


@dataclasses.dataclass(frozen=True, eq=False)
class Game:
    """One finished game: its V6 records (a RECORD_DTYPE array, one per position) and its PGN.

    ``game_id`` is unique across the run (a uuid hex): the daemon drops a game it already stored,
    so a worker may resend until it sees the ack.  ``generation`` is the network that played it.
    ``member``: the records as one gzip member, as they travel and are stored (compressed by
    :func:`encode` when empty: the sender's work, once a game).
    """

    worker: str
    game_id: str
    generation: int
    result: str
    termination: str
    records: np.ndarray
    pgn: str
    member: bytes = b""

    @property
    def positions(self) -> int:
        return len(self.records)


@dataclasses.dataclass(frozen=True)
class Ack:
    """These games are in the replay store and fsynced: the worker may forget them. ``credit``: how
    many of its games the worker may have sent and unacknowledged from now on (the daemon's share of
    what it can take, for each of its workers)."""

    game_ids: tuple[str, ...]
    credit: int = 1


@dataclasses.dataclass(frozen=True)
class Refused:
    """The daemon will not take this message (bad records, unknown worker): resending it is useless."""

    reason: str
    game_id: Optional[str] = None


@dataclasses.dataclass(frozen=True)
class ErrorReply:
    """The daemon failed to take a message (disk full, store busy): keep the game and resend it later."""

    reason: str
    game_id: Optional[str] = None


@dataclasses.dataclass(frozen=True)
class Stop:
    """The daemon asks a worker to stop (run stopping, worker replaced)."""

    reason: str = ""


Message = Union[Register, Registered, Heartbeat, Game, Ack, Refused, ErrorReply, Stop]


# --------------------------------------------------------------------------- field checks


def _int(value: Any, name: str, limit: int = 2**63 - 1) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise WireError(f"{name!r} must be an integer, got {type(value).__name__}")
    if not 0 <= value <= limit:
        raise WireError(f"{name!r} must be in 0..{limit}, got {value}")
    return value


def _float(value: Any, name: str) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise WireError(f"{name!r} must be a number, got {type(value).__name__}")
    value = float(value)
    if not math.isfinite(value) or value < 0:
        raise WireError(f"{name!r} must be a finite number >= 0, got {value}")
    return value


def _text(value: Any, name: str, limit: int = MAX_TEXT_CHARS) -> str:
    if not isinstance(value, str):
        raise WireError(f"{name!r} must be a string, got {type(value).__name__}")
    if len(value) > limit or "\x00" in value:
        raise WireError(f"{name!r} must be a string of at most {limit} characters without NUL")
    return value


def _id(value: Any, name: str) -> str:
    if not isinstance(value, str) or not _ID.fullmatch(value):
        shown = value[:40] if isinstance(value, str) else type(value).__name__
        raise WireError(f"{name!r} must be 1-{MAX_ID_CHARS} characters of A-Z a-z 0-9 . _ : -, got {shown!r}")
    return value


def _ids(value: Any, name: str, limit: int) -> tuple[str, ...]:
    if not isinstance(value, (list, tuple)):
        raise WireError(f"{name!r} must be a list, got {type(value).__name__}")
    if len(value) > limit:
        raise WireError(f"{name!r} holds {len(value)} entries, more than {limit}")
    return tuple(_id(item, name) for item in value)


def _optional_id(value: Any, name: str) -> Optional[str]:
    return None if value is None else _id(value, name)


def _field(header: dict, key: str) -> Any:
    if key not in header:
        raise WireError(f"{header['type']} header has no {key!r}")
    return header[key]


# --------------------------------------------------------------------------- frames


def _buffer(frame: Any, index: int) -> memoryview:
    """A byte view of frame ``index`` (bytes, bytearray, memoryview or a zmq.Frame), not copied."""
    try:
        view = memoryview(frame)
    except TypeError:
        raise WireError(f"frame {index} is a {type(frame).__name__}, not bytes") from None
    if not view.c_contiguous:
        raise WireError(f"frame {index} is not a contiguous buffer")
    if view.format == "B" and view.ndim == 1:
        return view
    try:
        return view.cast("B")
    except (TypeError, ValueError):  # a format memoryview will not cast
        raise WireError(f"frame {index} is not a byte buffer") from None


def encode_arrays(arrays: Sequence[np.ndarray]) -> tuple[list[dict], list[bytes]]:
    """The header's ``frames`` entries and the raw frames of ``arrays`` (dtypes from :data:`DTYPES`).

    Frames are numbered as in the message, the header being frame 0.
    """
    if len(arrays) > MAX_FRAMES:
        raise WireError(f"{len(arrays)} frames, more than {MAX_FRAMES}")
    specs, frames = [], []
    for i, array in enumerate(arrays, 1):
        array = np.asarray(array)
        little = array.dtype.newbyteorder("<")  # a big-endian array is sent in the wire's byte order
        name = next((key for key, dtype in DTYPES.items() if little == dtype), None)
        if name is None:
            raise WireError(f"frame {i} has dtype {array.dtype}, not one of {', '.join(DTYPES)}")
        array = array.astype(DTYPES[name], copy=False)
        if array.ndim > MAX_DIMS or array.nbytes > MAX_FRAME_BYTES:
            raise WireError(f"frame {i} of shape {array.shape} is larger than the wire allows")
        specs.append({"dtype": name, "shape": list(array.shape)})
        frames.append(np.ascontiguousarray(array).tobytes())
    return specs, frames


def decode_arrays(specs: Any, frames: Sequence[Any]) -> list[np.ndarray]:
    """Arrays viewing ``frames`` (no copy) as the header's ``frames`` entries describe them; WireError otherwise.

    ``frames`` are the frames after the header, numbered from 1 in messages.
    """
    if not isinstance(specs, (list, tuple)):
        raise WireError(f"'frames' must be a list, got {type(specs).__name__}")
    if len(specs) != len(frames):
        raise WireError(f"the header describes {len(specs)} frames, {len(frames)} came")
    arrays = []
    for i, (spec, frame) in enumerate(zip(specs, frames), 1):
        if not isinstance(spec, dict):
            raise WireError(f"frame {i}'s description must be a map, got {type(spec).__name__}")
        name, shape = spec.get("dtype"), spec.get("shape")
        if not isinstance(name, str) or name not in DTYPES:
            raise WireError(f"frame {i} has dtype {str(name)[:40]!r}, not one of {', '.join(DTYPES)}")
        if not isinstance(shape, (list, tuple)) or len(shape) > MAX_DIMS:
            raise WireError(f"frame {i}'s shape must be a list of at most {MAX_DIMS} sizes")
        dims = tuple(_int(n, f"frame {i} shape") for n in shape)
        dtype = DTYPES[name]
        # Python ints, so a huge declared shape cannot overflow; the zeros left out because numpy
        # refuses a shape whose other sizes overflow even when one size is 0.
        if math.prod(max(n, 1) for n in dims) * dtype.itemsize > MAX_FRAME_BYTES:
            raise WireError(f"frame {i} declares {name} {list(dims)[:MAX_DIMS]}, more than {MAX_FRAME_BYTES} bytes")
        size = math.prod(dims) * dtype.itemsize
        data = _buffer(frame, i)
        if len(data) != size:
            raise WireError(f"frame {i} holds {len(data)} bytes, its {name} {list(dims)} needs {size}")
        arrays.append(np.frombuffer(data, dtype=dtype).reshape(dims))
    return arrays


# --------------------------------------------------------------------------- encode


def _fields(message: Message) -> tuple[dict, list[np.ndarray]]:
    """The header fields and arrays of ``message``, checked as :func:`decode` checks them."""
    if isinstance(message, Register):
        return _register(message.worker, message.host, message.pid, message.devices, message.software), []
    if isinstance(message, Registered):
        fields = _registered(message.run, message.generation, message.path, message.sha256, message.publish,
                             message.selfplay, message.credit)
        openings = tuple(_text(fen, "openings", 200) for fen in message.openings)
        if any("\n" in fen for fen in openings):
            raise WireError("an opening FEN holds a newline")
        return fields, ([np.frombuffer("\n".join(openings).encode(), dtype=np.uint8)] if openings else [])
    if isinstance(message, Heartbeat):
        return _heartbeat(message.worker, message.playing, message.positions_per_s, message.generation), []
    if isinstance(message, Game):
        records = message.records
        if not isinstance(records, np.ndarray) or records.dtype != RECORD_DTYPE or records.ndim != 1:
            raise WireError("a game's records must be a one-dimensional RECORD_DTYPE array")
        pgn = np.frombuffer(_text(message.pgn, "pgn", MAX_FRAME_BYTES).encode(), dtype=np.uint8)
        header = _game(message.worker, message.game_id, message.generation, len(records), message.result,
                       message.termination)
        _check_game_records(records)
        member = message.member or compress_records(records)
        if len(member) > MAX_FRAME_BYTES:
            raise WireError(f"a game's compressed records are {len(member):,} bytes, more than {MAX_FRAME_BYTES:,}")
        return header, [np.frombuffer(member, dtype=np.uint8), pgn]
    if isinstance(message, Ack):
        return {"games": list(_ids(message.game_ids, "games", MAX_ACK_GAMES)), "credit": _credit(message.credit)}, []
    if isinstance(message, (Refused, ErrorReply)):
        return _reply(message.reason, message.game_id), []
    if isinstance(message, Stop):
        return {"reason": _text(message.reason, "reason")}, []
    raise WireError(f"{type(message).__name__} is not a wire message")


_TYPES: dict[type, str] = {
    Register: "register",
    Registered: "registered",
    Heartbeat: "heartbeat",
    Game: "game",
    Ack: "ack",
    Refused: "refused",
    ErrorReply: "error",
    Stop: "stop",
}


def encode(message: Message) -> list[bytes]:
    """``[msgpack header, raw frame, ...]`` for ``message``; WireError when a field is out of bounds."""
    fields, arrays = _fields(message)
    specs, frames = encode_arrays(arrays)
    header = {"type": _TYPES[type(message)], "version": WIRE_VERSION}
    header.update((key, value) for key, value in fields.items() if value is not None)
    if specs:
        header["frames"] = specs
    data = msgpack.packb(header, use_bin_type=True)
    if len(data) > MAX_HEADER_BYTES:
        raise WireError(f"header of {len(data)} bytes is larger than {MAX_HEADER_BYTES}")
    return [data, *frames]


# --------------------------------------------------------------------------- decode


def _register(worker: Any, host: Any, pid: Any, devices: Any, software: Any) -> dict:
    if not isinstance(devices, (list, tuple)) or not 1 <= len(devices) <= MAX_DEVICES:
        raise WireError(f"'devices' must be a list of 1-{MAX_DEVICES} device names")
    return {
        "worker": _id(worker, "worker"),
        "host": _text(host, "host"),
        "pid": _int(pid, "pid", MAX_COUNT),
        "devices": [_text(d, "devices", MAX_ID_CHARS) for d in devices],
        "software": _text(software, "software"),
    }


def _settings(value: Any) -> dict:
    """A flat map of setting names to booleans, numbers and short strings (``[selfplay]``)."""
    if value is None:
        return {}
    if not isinstance(value, dict) or len(value) > 64:
        raise WireError("'selfplay' must be a map of at most 64 settings")
    out = {}
    for key, item in value.items():
        if not isinstance(key, str) or not re.fullmatch(r"[a-z_][a-z0-9_]{0,63}", key):
            raise WireError(f"'selfplay' setting name {str(key)[:40]!r} is not a lower-case name")
        if isinstance(item, str):
            item = _text(item, f"selfplay.{key}")
        elif isinstance(item, float):
            if not math.isfinite(item):  # signed: resign_q is below 0
                raise WireError(f"'selfplay.{key}' must be a finite number, got {item}")
        elif isinstance(item, int) and not isinstance(item, bool) and abs(item) >= 2**63:
            raise WireError(f"'selfplay.{key}' is out of range")
        elif not isinstance(item, (bool, int)):
            raise WireError(f"'selfplay.{key}' must be a boolean, number or string")
        out[key] = item
    return out


def _credit(value: Any) -> int:
    credit = _int(value, "credit", MAX_CREDIT)
    if credit < 1:
        raise WireError("'credit' must be at least 1: a worker always may send one game")
    return credit


def _registered(run: Any, generation: Any, path: Any, sha256: Any, publish: Any, selfplay: Any,
                credit: Any) -> dict:
    fields: dict[str, Any] = {"run": _id(run, "run"), "generation": None, "path": None, "sha256": None,
                              "publish": None if publish is None else _text(publish, "publish", 300),
                              "selfplay": _settings(selfplay), "credit": _credit(credit)}
    if generation is None and path is None and sha256 is None:
        return fields
    if generation is None or path is None or sha256 is None:
        raise WireError("'generation', 'path' and 'sha256' come together or not at all")
    fields["generation"] = _int(generation, "generation")
    path = _text(path, "path", 4096)
    if not os.path.isabs(path):
        raise WireError(f"'path' must be absolute, got {path[:100]!r}")
    fields["path"] = path
    if not is_sha256_hex(sha256):
        raise WireError(f"'sha256' must be 64 lower-case hex digits, got {str(sha256)[:80]!r}")
    fields["sha256"] = sha256
    return fields


def _heartbeat(worker: Any, playing: Any, positions_per_s: Any, generation: Any) -> dict:
    return {
        "worker": _id(worker, "worker"),
        "playing": _int(playing, "playing", MAX_COUNT),
        "positions_per_s": _float(positions_per_s, "positions_per_s"),
        "generation": _int(generation, "generation"),
    }


def _game(worker: Any, game_id: Any, generation: Any, positions: Any, result: Any, termination: Any) -> dict:
    if result not in RESULTS:
        raise WireError(f"'result' must be one of {', '.join(RESULTS)}, got {str(result)[:40]!r}")
    positions = _int(positions, "positions", MAX_FRAME_BYTES // RECORD_BYTES)
    if positions == 0:
        raise WireError("a game needs at least one position")
    return {
        "worker": _id(worker, "worker"),
        "game": _id(game_id, "game"),
        "generation": _int(generation, "generation"),
        "positions": positions,
        "result": result,
        "termination": _text(termination, "termination", MAX_ID_CHARS),
    }


def _check_game_records(records: np.ndarray) -> None:
    try:
        check_records(records)
    except ValueError as e:
        raise WireError(f"game records refused: {e}") from None


def _reply(reason: Any, game_id: Any) -> dict:
    return {"reason": _text(reason, "reason"), "game": _optional_id(game_id, "game")}


def _decode_game(header: dict, arrays: list[np.ndarray]) -> Game:
    fields = _game(*(_field(header, key) for key in
                     ("worker", "game", "generation", "positions", "result", "termination")))
    if len(arrays) != 2:
        raise WireError(f"a game carries 2 frames (records, pgn), got {len(arrays)}")
    member, pgn = arrays
    if member.dtype != np.uint8 or member.ndim != 1:
        raise WireError(f"a game's first frame must be uint8 [bytes] (its records as one gzip member), "
                        f"got {member.dtype} {list(member.shape)}")
    if pgn.dtype != np.uint8 or pgn.ndim != 1:
        raise WireError(f"a game's second frame must be uint8 [bytes] (the PGN), got {pgn.dtype} {list(pgn.shape)}")
    try:
        records = inflate_records(member.data, fields["positions"])
    except ValueError as e:
        raise WireError(f"game records refused: {e}") from None
    try:
        text = pgn.tobytes().decode()
    except UnicodeDecodeError:
        raise WireError("a game's PGN is not UTF-8") from None
    if "\x00" in text:
        raise WireError("a game's PGN holds a NUL character")
    return Game(fields["worker"], fields["game"], fields["generation"], fields["result"], fields["termination"],
                records, text, member.tobytes())


def _decode_fields(kind: str, header: dict, arrays: list[np.ndarray]) -> Message:
    if kind == "game":
        return _decode_game(header, arrays)
    if kind == "registered":
        f = _registered(_field(header, "run"), header.get("generation"), header.get("path"), header.get("sha256"),
                        header.get("publish"), header.get("selfplay"), _field(header, "credit"))
        if len(arrays) > 1 or (arrays and (arrays[0].dtype != np.uint8 or arrays[0].ndim != 1)):
            raise WireError("a registered message carries at most one frame, the openings as uint8 text")
        try:
            text = arrays[0].tobytes().decode() if arrays else ""
        except UnicodeDecodeError:
            raise WireError("the openings frame is not UTF-8") from None
        return Registered(**f, openings=tuple(line for line in text.split("\n") if line))
    if arrays:
        raise WireError(f"a {kind} message carries no frames, got {len(arrays)}")
    if kind == "register":
        f = _register(*(_field(header, key) for key in ("worker", "host", "pid", "devices", "software")))
        return Register(f["worker"], f["host"], f["pid"], tuple(f["devices"]), f["software"])
    if kind == "heartbeat":
        f = _heartbeat(*(_field(header, key) for key in ("worker", "playing", "positions_per_s", "generation")))
        return Heartbeat(**f)
    if kind == "ack":
        return Ack(_ids(_field(header, "games"), "games", MAX_ACK_GAMES), _credit(_field(header, "credit")))
    if kind in ("refused", "error"):
        f = _reply(_field(header, "reason"), header.get("game"))
        return (Refused if kind == "refused" else ErrorReply)(f["reason"], f["game"])
    return Stop(_text(header.get("reason", ""), "reason"))


_KINDS = frozenset(_TYPES.values())


def _header(frames: Sequence[Any]) -> tuple[str, dict]:
    """The message's type and header, checked (type known, this side's version)."""
    if not frames:
        raise WireError("no frames: a message starts with its msgpack header")
    header = unpack_header(_buffer(frames[0], 0), WireError)
    kind = header.get("type")
    if not isinstance(kind, str) or kind not in _KINDS:
        raise WireError(f"unknown message type {str(kind)[:40]!r}")
    version = header.get("version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise WireError(f"header 'version' must be an integer, got {type(version).__name__}")
    if version != WIRE_VERSION:
        raise WireError(f"unsupported {kind} message version {version} (this side reads version {WIRE_VERSION})")
    return kind, header


def decode(frames: Iterable[Any]) -> Message:
    """The message in ``frames`` (a DEALER's frames, or a ROUTER's without the identity frame).

    Raises only :class:`WireError`, whose one-line message says what is wrong.
    """
    try:
        frames = list(frames)
    except TypeError:
        raise WireError(f"expected a list of frames, got {type(frames).__name__}") from None
    if len(frames) > MAX_FRAMES + 1:
        raise WireError(f"{len(frames)} frames, more than a header and {MAX_FRAMES}")
    kind, header = _header(frames)
    arrays = decode_arrays(header.get("frames", []), frames[1:])
    return _decode_fields(kind, header, arrays)
