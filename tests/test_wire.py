"""trainer.wire: the worker/daemon messages, their frame codec, and that bad input is only ever WireError."""

from __future__ import annotations

import ast
import dataclasses
import pathlib
import random
import struct
from typing import Any

import msgpack
import numpy as np
import pytest

from trainer import wire
from trainer.records import RECORD_BYTES, RECORD_DTYPE, compress_records
from trainer.wire import (
    MAX_FRAME_BYTES,
    MAX_FRAMES,
    MAX_HEADER_BYTES,
    Ack,
    ErrorReply,
    Game,
    Heartbeat,
    Refused,
    Register,
    Registered,
    Stop,
    WireError,
    decode,
    decode_arrays,
    encode,
    encode_arrays,
)

SHA = "0123456789abcdef" * 4
PGN = '[Event "self-play"]\n[Result "1-0"]\n\n1. e4 e5 2. Qh5 Nc6 3. Bc4 Nf6 4. Qxf7# 1-0\n'


def records(n: int) -> np.ndarray:
    """``n`` V6 records in input format 1, with a distinct byte pattern so a mix-up shows."""
    out = np.zeros(n, dtype=RECORD_DTYPE)
    out["version"] = 6
    out["input_format"] = 1
    out["visits"] = np.arange(n) + 100
    out["probabilities"][:, 7] = 0.5
    return out


def game(n: int = 7, **changes) -> Game:
    fields: dict[str, Any] = dict(worker="w-host1-12", game_id="9f" * 16, generation=3, result="1-0", termination="checkmate",
                  records=records(n), pgn=PGN)
    fields.update(changes)
    return Game(**fields)


MESSAGES = [
    Register("w-host1-12", "host1.example", 4242, ("cuda:0", "cuda:1"), "cyzero 0.3.0"),
    Registered("run-2026-11", 5, "/runs/r/networks/gen-5.onnx", SHA, credit=8),
    Registered("run-2026-11"),
    Heartbeat("w-host1-12", 64, 1234.5, 5),
    Ack(("a" * 32, "b" * 32), 64),
    Ack(()),
    Refused("records are not V6", "a" * 32),
    Refused("unknown worker"),
    ErrorReply("replay store: no space left on device", "a" * 32),
    Stop("run stopping"),
    Stop(),
]


# --------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_round_trip(message):
    frames = encode(message)
    assert all(isinstance(f, bytes) for f in frames) and len(frames) == 1
    assert decode(frames) == message
    assert decode([memoryview(f) for f in frames]) == message  # zmq frames arrive as buffers too


def test_game_round_trip():
    sent = game(7, pgn=PGN + "{ünïcode comment}")
    frames = encode(sent)
    assert len(frames) == 3
    assert frames[1] == compress_records(sent.records)       # one gzip member, the sender's work
    assert len(frames[1]) < 7 * RECORD_BYTES / 10
    got = decode(frames)
    assert isinstance(got, Game)
    for field in dataclasses.fields(Game):
        if field.name not in ("records", "member"):
            assert getattr(got, field.name) == getattr(sent, field.name), field.name
    assert got.member == frames[1]                            # stored as it came
    assert got.positions == 7
    assert got.records.dtype == RECORD_DTYPE
    assert got.records.tobytes() == sent.records.tobytes()
    assert list(got.records["visits"]) == list(range(100, 107))


def test_registered_carries_the_publish_endpoint_settings_and_openings():
    fens = ("rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1", "8/8/8/4k3/8/8/4K3/7R w - - 0 1")
    sent = Registered("run-1", 2, "/runs/r/networks/gen-2.onnx", SHA, "tcp://*:5781",
                      {"visits": 200, "resign": False, "noise_alpha": 0.3, "resign_q": -0.9, "openings": "book.epd"}, fens)
    frames = encode(sent)
    assert len(frames) == 2 and frames[1] == "\n".join(fens).encode()
    assert decode(frames) == sent


@pytest.mark.parametrize("selfplay, error", [
    ({"Visits": 1}, "lower-case name"),
    ({"visits": [1, 2]}, "boolean, number or string"),
    ({"visits": float("nan")}, "selfplay.visits"),
    ({"resign_q": float("-inf")}, "selfplay.resign_q"),
    ({f"k{i}": 1 for i in range(65)}, "at most 64"),
])
def test_registered_refuses_bad_settings(selfplay, error):
    header = msgpack.unpackb(encode(Registered("run-1"))[0])
    header["selfplay"] = selfplay
    with pytest.raises(WireError, match=error):
        decode([msgpack.packb(header)])


def test_zmq_frames_decode_without_a_copy():
    """A ROUTER receiving with copy=False hands over zmq.Frame objects; the records view their memory."""
    zmq = pytest.importorskip("zmq")
    got = decode([zmq.Frame(f) for f in encode(game(3))])
    assert isinstance(got, Game) and got.positions == 3 and got.pgn == PGN


def test_game_header_describes_its_frames():
    frames = encode(game(2))
    header = msgpack.unpackb(frames[0])
    assert header["frames"] == [{"dtype": "uint8", "shape": [len(frames[1])]}, {"dtype": "uint8", "shape": [len(PGN)]}]
    assert header["positions"] == 2 and header["game"] == "9f" * 16


def test_unknown_header_keys_are_ignored():
    header = msgpack.unpackb(encode(MESSAGES[3])[0])
    header["later_field"] = {"nested": [1, 2]}
    assert decode([msgpack.packb(header)]) == MESSAGES[3]


# --------------------------------------------------------------------------- golden bytes


def _s(text: str) -> bytes:
    """msgpack fixstr, written by hand."""
    assert len(text) < 32
    return bytes([0xA0 | len(text)]) + text.encode()


def test_heartbeat_header_golden_bytes():
    """The schema cannot drift silently: the bytes are spelt out from the msgpack spec, not msgpack's packer."""
    expected = (
        bytes([0x86])  # fixmap of 6
        + _s("type") + _s("heartbeat")
        + _s("version") + bytes([0x03])
        + _s("worker") + _s("w1")
        + _s("playing") + bytes([0x03])
        + _s("positions_per_s") + bytes([0xCB]) + struct.pack(">d", 12.5)
        + _s("generation") + bytes([0xCD, 0x01, 0x2C])  # uint16 300
    )
    assert encode(Heartbeat("w1", 3, 12.5, 300)) == [expected]
    assert decode([expected]) == Heartbeat("w1", 3, 12.5, 300)


def test_game_header_golden_bytes():
    member = compress_records(records(1))
    assert len(member) < 0x80   # a positive fixint in the shape below
    expected = (
        bytes([0x88])
        + _s("type") + _s("game")
        + _s("version") + bytes([0x03])
        + _s("worker") + _s("w1")
        + _s("game") + _s("g1")
        + _s("generation") + bytes([0x00])
        + _s("positions") + bytes([0x01])
        + _s("result") + _s("0-1")
        + _s("termination") + _s("resigned")
    )
    frames_key = (
        _s("frames") + bytes([0x92])
        + bytes([0x82]) + _s("dtype") + _s("uint8") + _s("shape") + bytes([0x91, len(member)])
        + bytes([0x82]) + _s("dtype") + _s("uint8") + _s("shape") + bytes([0x91, 0x02])
    )
    expected = bytes([0x89]) + expected[1:] + frames_key
    frames = encode(Game("w1", "g1", 0, "0-1", "resigned", records(1), "*\n"))
    assert frames[1] == member
    assert frames[0] == expected
    assert frames[2] == b"*\n"


# --------------------------------------------------------------------------- refusals


def _header(message) -> dict:
    return msgpack.unpackb(encode(message)[0])


def _with(message, **changes) -> list[bytes]:
    frames = encode(message)
    header = msgpack.unpackb(frames[0])
    header.update(changes)
    for key in [k for k, v in changes.items() if v is ...]:
        del header[key]
    return [msgpack.packb(header), *frames[1:]]


@pytest.mark.parametrize(
    "message, changes, words",
    [
        (MESSAGES[3], {"type": "hearbeat"}, "unknown message type"),
        (MESSAGES[3], {"type": 7}, "unknown message type"),
        (MESSAGES[3], {"version": 1}, "version 1"),   # an older worker's
        (MESSAGES[3], {"version": True}, "'version' must be an integer"),
        (MESSAGES[3], {"version": ...}, "'version' must be an integer"),
        (MESSAGES[3], {"worker": ...}, "no 'worker'"),
        (MESSAGES[3], {"playing": "64"}, "'playing' must be an integer"),
        (MESSAGES[3], {"playing": -1}, "'playing' must be in"),
        (MESSAGES[3], {"positions_per_s": float("nan")}, "finite"),
        (MESSAGES[3], {"generation": 1.5}, "'generation' must be an integer"),
        (MESSAGES[0], {"worker": "has space"}, "'worker' must be"),
        (MESSAGES[0], {"devices": []}, "'devices'"),
        (MESSAGES[0], {"host": b"bytes"}, "'host' must be a string"),
        (MESSAGES[1], {"sha256": "XYZ"}, "'sha256'"),
        (MESSAGES[1], {"path": "relative/net.onnx"}, "absolute"),
        (MESSAGES[1], {"sha256": ...}, "together"),
        (MESSAGES[4], {"games": ["ok", 5]}, "'games' must be"),
        (MESSAGES[4], {"games": ["x"] * 5000}, "more than"),
        (MESSAGES[6], {"reason": "x" * 5000}, "'reason'"),
        (MESSAGES[3], {"frames": [{"dtype": "uint8", "shape": [1]}]}, "describes 1 frames, 0 came"),
        (MESSAGES[4], {"credit": ...}, "no 'credit'"),      # a version 2 daemon's ack
        (MESSAGES[4], {"credit": 0}, "at least 1"),
        (MESSAGES[4], {"credit": 4097}, "'credit' must be in"),
        (MESSAGES[1], {"credit": ...}, "no 'credit'"),
        (MESSAGES[1], {"credit": 2.5}, "'credit' must be an integer"),
    ],
)
def test_malformed_headers_are_wire_errors(message, changes, words):
    with pytest.raises(WireError, match=words.replace("(", r"\(")):
        decode(_with(message, **changes))


def test_game_frame_checks():
    frames = encode(game(3))
    with pytest.raises(WireError, match="needs"):
        decode([frames[0], frames[1][:-1], frames[2]])
    with pytest.raises(WireError, match="2 frames"):
        decode(_with(game(3), frames=[{"dtype": "uint8", "shape": [len(frames[1])]}])[:2])
    with pytest.raises(WireError, match="does not hold exactly 4 records"):
        decode(_with(game(3), positions=4))
    with pytest.raises(WireError, match="does not hold exactly 2 records"):   # longer than said: cut off
        decode(_with(game(3), positions=2))
    with pytest.raises(WireError, match=r"must be uint8 \[bytes\] \(its records"):
        decode(_with(game(3), frames=[{"dtype": "int32", "shape": [3]}, {"dtype": "uint8", "shape": [len(PGN)]}])[:1]
               + [bytes(12), frames[2]])
    with pytest.raises(WireError, match="not a gzip member"):
        decode(_with(game(3), frames=[{"dtype": "uint8", "shape": [3 * RECORD_BYTES]},
                                      {"dtype": "uint8", "shape": [len(PGN)]}])[:1] + [records(3).tobytes(), frames[2]])
    with pytest.raises(WireError, match="does not hold exactly 3 records"):   # two members
        twice = frames[1] + frames[1]
        decode(_with(game(3), frames=[{"dtype": "uint8", "shape": [len(twice)]},
                                      {"dtype": "uint8", "shape": [len(PGN)]}])[:1] + [twice, frames[2]])
    with pytest.raises(WireError, match="result"):
        decode(_with(game(3), result="*"))
    with pytest.raises(WireError, match="UTF-8"):
        decode([frames[0], frames[1], b"\xff" * len(PGN)])
    with pytest.raises(WireError, match="at least one position"):
        encode(game(0))


@pytest.mark.parametrize("field, value, words", [("version", 5, "version 5"), ("input_format", 3, "input format 3")])
def test_records_that_are_not_v6_input_format_1_are_refused(field, value, words):
    bad = records(4)
    bad[2][field] = value
    with pytest.raises(WireError, match=f"game records refused: record 2 .*{words}"):
        encode(game(records=bad))
    good = encode(game(4))
    sent = compress_records(bad)   # a sender that skips the check: the daemon inflates and refuses
    with pytest.raises(WireError, match=f"game records refused: record 2 .*{words}"):
        decode(_with(game(4), frames=[{"dtype": "uint8", "shape": [len(sent)]},
                                      {"dtype": "uint8", "shape": [len(PGN)]}])[:1] + [sent, good[2]])


def test_frame_codec_round_trip_and_allow_list():
    arrays = [np.arange(6, dtype=np.int32).reshape(2, 3), np.array([1.5, -2], dtype=np.float16),
              np.zeros((0, 4), dtype=np.int64), np.array([0.25], dtype=np.float32), np.arange(3, dtype=np.uint8)]
    specs, frames = encode_arrays(arrays)
    assert [s["dtype"] for s in specs] == ["int32", "float16", "int64", "float32", "uint8"]
    for sent, got in zip(arrays, decode_arrays(specs, frames)):
        assert got.dtype == sent.dtype and got.shape == sent.shape and np.array_equal(got, sent)
    big_endian = np.arange(3, dtype=">i4")
    assert np.array_equal(decode_arrays(*encode_arrays([big_endian]))[0], big_endian)
    with pytest.raises(WireError, match="float64"):
        encode_arrays([np.zeros(2)])
    with pytest.raises(WireError, match="'object'"):
        decode_arrays([{"dtype": "object", "shape": [1]}], [b"\0" * 8])
    with pytest.raises(WireError, match="more than"):
        decode_arrays([{"dtype": "int64", "shape": [2**40, 2**40]}], [b""])
    with pytest.raises(WireError, match="shape"):
        decode_arrays([{"dtype": "uint8", "shape": [-1]}], [b""])
    for shape in ([0] + [2**26] * 7, [2**26] * 7 + [0], [0, 2**60]):  # numpy refuses these even empty
        with pytest.raises(WireError, match="more than"):
            decode_arrays([{"dtype": "int64", "shape": shape}], [b""])
    assert decode_arrays([{"dtype": "int64", "shape": [0, 1000, 3]}], [b""])[0].shape == (0, 1000, 3)


def test_oversized_inputs():
    with pytest.raises(WireError, match="larger than"):
        decode([b"\x80" + b"\0" * MAX_HEADER_BYTES])
    with pytest.raises(WireError, match="more than a header"):
        decode([encode(Stop())[0]] + [b""] * (MAX_FRAMES + 1))
    huge = [{"dtype": "uint8", "shape": [MAX_FRAME_BYTES + 1]}]
    with pytest.raises(WireError, match="more than"):
        decode(_with(Stop(), frames=huge) + [b""])
    with pytest.raises(WireError, match="larger than"):
        encode(Ack(tuple(f"{i:0128d}" for i in range(MAX_HEADER_BYTES // 128 + 1))))


def test_not_frames():
    for frames in (None, 5, [], [None], ["text"], [12]):
        with pytest.raises(WireError):
            decode(frames)
    with pytest.raises(WireError, match="frame 1 is not a contiguous buffer"):
        decode_arrays([{"dtype": "uint8", "shape": [2]}], [np.arange(4, dtype=np.uint8)[::2]])
    with pytest.raises(WireError, match="not a wire message"):
        encode("register")


# --------------------------------------------------------------------------- fuzz


def _mutations(rng: random.Random, frames: list[bytes]):
    """Random damage to a valid message: flipped, truncated, extended, dropped and added frames."""
    choice = rng.randrange(8)
    frames = list(frames)
    i = rng.randrange(len(frames))
    if choice == 0 and frames[i]:
        data = bytearray(frames[i])
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        frames[i] = bytes(data)
    elif choice == 1:
        frames[i] = frames[i][: rng.randrange(len(frames[i]) + 1)]
    elif choice == 2:
        frames[i] = frames[i] + rng.randbytes(rng.randint(1, 16))
    elif choice == 3:
        del frames[i]
    elif choice == 4:
        frames.insert(i, rng.randbytes(rng.randint(0, 64)))
    elif choice == 5:
        frames = [rng.randbytes(rng.randint(0, 200)) for _ in range(rng.randint(0, 4))]
    elif choice == 6:  # random frame descriptions (huge, zero, negative sizes) over random frames
        header = msgpack.unpackb(frames[0])
        count = rng.randint(0, 3)
        sizes = [0, 1, 2, 3, 8356, -1, 2**26, 2**31, 2**62, 2**63 - 1]
        header["frames"] = [
            {"dtype": rng.choice(["uint8", "int32", "int64", "float16", "float32", "float64"]),
             "shape": [rng.choice(sizes) for _ in range(rng.randint(0, 9))]}
            for _ in range(count)
        ]
        frames = [msgpack.packb(header)] + [rng.randbytes(rng.choice([0, 1, 4, 8, 8356])) for _ in range(count)]
    else:  # a valid msgpack header with random field values and declared frames
        header = msgpack.unpackb(frames[0])
        key = rng.choice(sorted(header))
        header[key] = rng.choice([None, -1, 2**64 - 1, 1.5, "", "x" * 70000, [], {}, [[[]]], b"\xff", True,
                                  [{"dtype": "int64", "shape": [2**62]}], [{"dtype": "uint8"}], ["uint8"]])
        try:
            frames[0] = msgpack.packb(header)
        except (OverflowError, ValueError):
            frames[0] = b"\xc1"
    return frames


def test_fuzz_only_wire_errors():
    rng = random.Random(1234)
    valid = [encode(m) for m in MESSAGES] + [encode(game(n)) for n in (1, 2, 5)]
    decoded = refused = 0
    for _ in range(6000):
        frames = _mutations(rng, rng.choice(valid))
        try:
            decode(frames)
            decoded += 1
        except WireError as e:
            assert "\n" not in str(e) and str(e)
            refused += 1
    assert refused > 1000 and decoded > 100  # both paths were exercised


# --------------------------------------------------------------------------- no pickle


def test_module_never_imports_pickle():
    source = pathlib.Path(wire.__file__).read_text()
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            names.add((node.module or "").split(".")[0])
    assert not names & {"pickle", "cPickle", "dill", "cloudpickle", "marshal", "torch"}, names
    assert "allow_pickle" not in source and "np.load" not in source
