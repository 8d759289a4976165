"""lc0's protobuf: the wire format (read and write) and what lc0's ``proto/net.proto`` says.

One codec for every lc0 file the project reads or writes: the engine's reader
(:mod:`engine.lc0`), the trainer's writer (:mod:`trainer.lc0_export`) and the tests' own writer
(``tests/lc0_files.py``) all encode and walk messages with it. Only the handful of wire rules
lc0's files use are here (varints, fixed32/64, length-delimited fields), not the ``protobuf``
package, so the engine installs without it.

net.proto's knowledge lives here once: the field numbers of each message (the classes below,
named as net.proto names them), its enums, and the weight encodings of a ``Layer``.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

import numpy as np

#: ``Net.magic``: the fixed32 every lc0 network file starts with.
MAGIC = 0x1C0


class ProtoError(ValueError):
    """A message that is cut short or not protobuf at all."""


# --------------------------------------------------------------------------- writing


def varint(value: int) -> bytes:
    """Base-128 varint; a negative value as 64-bit two's complement (proto int32/int64/enum)."""
    if value < 0:
        value += 1 << 64
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def key(number: int, wire_type: int) -> bytes:
    return varint(number << 3 | wire_type)


def uint(number: int, value: int) -> bytes:
    """A varint field (uint32, int32, enum, bool)."""
    return key(number, 0) + varint(int(value))


def fixed32(number: int, value: int) -> bytes:
    return key(number, 5) + struct.pack("<I", value)


def float32(number: int, value: float) -> bytes:
    return key(number, 5) + struct.pack("<f", value)


def length_delimited(number: int, payload: bytes) -> bytes:
    """A bytes, string (given encoded) or embedded message field."""
    return key(number, 2) + varint(len(payload)) + bytes(payload)


def string(number: int, text: str) -> bytes:
    return length_delimited(number, text.encode("utf-8"))


# --------------------------------------------------------------------------- reading


def read_varint(buf: bytes, i: int) -> tuple[int, int]:
    """The varint at ``buf[i]`` and the index after it; at most ten bytes, as protobuf allows."""
    shift = value = 0
    while True:
        if i >= len(buf):
            raise ProtoError("truncated varint")
        if shift > 63:
            raise ProtoError("a varint longer than ten bytes")
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, i
        shift += 7


_FIXED = {1: (8, "fixed64"), 5: (4, "fixed32")}


def walk(buf: bytes) -> Iterator[tuple[int, int, slice, int | bytes]]:
    """A message's fields in order: (number, wire type, where the whole field lies in ``buf``,
    value), the value an int for a varint, bytes for the others (fixed32/64 payloads as their
    bytes). The span is a slice, not a copy: a network's weights field is most of the file."""
    i, n = 0, len(buf)
    while i < n:
        start = i
        tag, i = read_varint(buf, i)
        number, wire = tag >> 3, tag & 7
        if number == 0:
            raise ProtoError("field number 0")
        if wire == 0:
            value, i = read_varint(buf, i)
        elif wire == 2 or wire in _FIXED:
            size, what = _FIXED.get(wire, (None, "length-delimited field"))
            if size is None:
                size, i = read_varint(buf, i)
            if i + size > n:
                raise ProtoError(f"truncated {what}")
            value, i = bytes(buf[i:i + size]), i + size
        else:
            raise ProtoError(f"wire type {wire} in field {number}")
        yield number, wire, slice(start, i), value


def fields(buf: bytes) -> dict[int, list]:
    """One message's fields: number -> values, in order (a repeated field has several)."""
    out: dict[int, list] = {}
    for number, _, _, value in walk(buf):
        out.setdefault(number, []).append(value)
    return out


def last(f: dict, number: int, default=None):
    """A field's value as protobuf reads a non-repeated field: the last one written."""
    values = f.get(number)
    return values[-1] if values else default


def message(f: dict, number: int) -> dict | None:
    value = last(f, number)
    if value is None:
        return None
    if not isinstance(value, (bytes, memoryview)):
        raise ProtoError(f"field {number} is not a message")
    return fields(bytes(value))


def float_(f: dict, number: int, default: float = 0.0) -> float:
    value = last(f, number)
    if value is None:
        return default
    if not isinstance(value, bytes) or len(value) != 4:
        raise ProtoError(f"field {number} is not a float")
    return struct.unpack("<f", value)[0]


def int_(f: dict, number: int, default: int = 0) -> int:
    value = last(f, number, default)
    if not isinstance(value, int):
        raise ProtoError(f"field {number} is not a varint")
    return value


def text(f: dict, number: int) -> str:
    value = last(f, number, b"")
    return bytes(value).decode("utf-8", "replace") if isinstance(value, bytes) else ""


# --------------------------------------------------------------------------- net.proto's messages


class Net:
    MAGIC = 1
    LICENSE = 2
    MIN_VERSION = 3
    FORMAT = 4
    TRAINING_PARAMS = 5
    WEIGHTS = 10
    ONNX_MODEL = 11


class EngineVersion:
    MAJOR = 1
    MINOR = 2
    PATCH = 3


class Format:
    WEIGHTS_ENCODING = 1
    NETWORK_FORMAT = 2


class NetworkFormat:
    INPUT = 1
    OUTPUT = 2
    NETWORK = 3
    POLICY = 4
    VALUE = 5
    MOVES_LEFT = 6
    DEFAULT_ACTIVATION = 7
    SMOLGEN_ACTIVATION = 8
    FFN_ACTIVATION = 9
    INPUT_EMBEDDING = 10


class TrainingParams:
    TRAINING_STEPS = 1
    LEARNING_RATE = 2
    MSE_LOSS = 3
    POLICY_LOSS = 4
    ACCURACY = 5
    LC0_PARAMS = 6


class OnnxModel:
    MODEL = 1
    DATA_TYPE = 2
    INPUT_PLANES = 3
    OUTPUT_VALUE = 4
    OUTPUT_WDL = 5
    OUTPUT_POLICY = 6
    OUTPUT_MLH = 7


class Layer:
    MIN_VAL = 1
    MAX_VAL = 2
    PARAMS = 3
    ENCODING = 4


class ConvBlock:
    WEIGHTS = 1
    BIASES = 2
    BN_MEANS = 3
    BN_STDDIVS = 4
    BN_GAMMAS = 5
    BN_BETAS = 6


class SEunit:
    W1 = 1
    B1 = 2
    W2 = 3
    B2 = 4


class Residual:
    CONV1 = 1
    CONV2 = 2
    SE = 3


class Smolgen:
    COMPRESS = 1
    DENSE1_W = 2
    DENSE1_B = 3
    LN1_GAMMAS = 4
    LN1_BETAS = 5
    DENSE2_W = 6
    DENSE2_B = 7
    LN2_GAMMAS = 8
    LN2_BETAS = 9


class MHA:
    Q_W = 1
    Q_B = 2
    K_W = 3
    K_B = 4
    V_W = 5
    V_B = 6
    DENSE_W = 7
    DENSE_B = 8
    SMOLGEN = 9
    RPE_Q = 10
    RPE_K = 11
    RPE_V = 12


class FFN:
    DENSE1_W = 1
    DENSE1_B = 2
    DENSE2_W = 3
    DENSE2_B = 4


class EncoderLayer:
    MHA = 1
    LN1_GAMMAS = 2
    LN1_BETAS = 3
    FFN = 4
    LN2_GAMMAS = 5
    LN2_BETAS = 6


class PolicyHead:
    IP_POL_W = 1
    IP_POL_B = 2
    IP2_POL_W = 3
    IP2_POL_B = 4
    IP3_POL_W = 5
    IP3_POL_B = 6
    IP4_POL_W = 7
    POL_ENCODER = 8
    POL_HEADCOUNT = 9


class ValueHead:
    IP_VAL_W = 1
    IP_VAL_B = 2
    IP1_VAL_W = 3
    IP1_VAL_B = 4
    IP2_VAL_W = 5
    IP2_VAL_B = 6


class PolicyHeads:
    """The shared embedding, then the heads (``HEADS``: their names, as lc0 names them)."""

    IP_POL_W = 1
    IP_POL_B = 2
    VANILLA = 3
    OPTIMISTIC = 4
    SOFT = 5
    OPPONENT = 6
    HEADS = {VANILLA: "vanilla", OPTIMISTIC: "optimistic", SOFT: "soft", OPPONENT: "opponent"}


class ValueHeads:
    WINNER = 1
    Q = 2
    ST = 3
    HEADS = {WINNER: "winner", Q: "q", ST: "st"}


class Weights:
    INPUT = 1
    RESIDUAL = 2
    POLICY = 3
    IP_POL_W = 4
    IP_POL_B = 5
    VALUE = 6
    IP1_VAL_W = 7
    IP1_VAL_B = 8
    IP2_VAL_W = 9
    IP2_VAL_B = 10
    POLICY1 = 11
    MOVES_LEFT = 12
    IP1_MOV_W = 13
    IP1_MOV_B = 14
    IP2_MOV_W = 15
    IP2_MOV_B = 16
    IP2_POL_W = 17
    IP2_POL_B = 18
    IP3_POL_W = 19
    IP3_POL_B = 20
    POL_ENCODER = 21
    IP4_POL_W = 22
    POL_HEADCOUNT = 24
    IP_EMB_W = 25
    IP_EMB_B = 26
    ENCODER = 27
    HEADCOUNT = 28
    IP_VAL_W = 29
    IP_VAL_B = 30
    IP_MOV_W = 31
    IP_MOV_B = 32
    IP_MULT_GATE = 33
    IP_ADD_GATE = 34
    SMOLGEN_W = 35
    SMOLGEN_B = 36
    IP_EMB_PREPROC_W = 37
    IP_EMB_PREPROC_B = 38
    IP_EMB_LN_GAMMAS = 39
    IP_EMB_LN_BETAS = 40
    IP_EMB_FFN = 41
    IP_EMB_FFN_LN_GAMMAS = 42
    IP_EMB_FFN_LN_BETAS = 43
    VALUE_HEADS = 44
    POLICY_HEADS = 45
    #: The fields only attention-body networks have (encoder stacks, embeddings). The attention
    #: policy head's own (4, 5, 17-22, 24) sit on residual towers too (T60-T78).
    BODY_ONLY = frozenset({25, 26, 27, 28, 33, 34, 35, 36})


# --------------------------------------------------------------------------- net.proto's enums

#: ``Format.Encoding`` and ``Layer.Encoding``.
LINEAR16, FLOAT16, BFLOAT16, FLOAT32 = 1, 2, 3, 4

# NetworkFormat's enums, by name for the messages.
INPUT_FORMATS = {
    1: "classical 112-plane", 2: "112-plane with castling plane", 3: "112-plane canonical",
    4: "112-plane canonical with hectoplies", 5: "112-plane canonical v2",
    132: "112-plane canonical with hectoplies (armageddon)", 133: "112-plane canonical v2 (armageddon)",
}
NETWORKS = {1: "classical", 2: "SE", 3: "classical", 4: "SE", 5: "ONNX", 6: "attention body",
            7: "attention body (multihead)", 134: "attention body (legacy multihead)"}
POLICIES = {1: "classical", 2: "convolution", 3: "attention"}
VALUES = {1: "classical", 2: "WDL", 3: "parametric"}
#: ``DefaultActivation``.
ACTIVATIONS = {0: "relu", 1: "mish"}
#: ``ActivationFunction`` (0 is the default activation, 9 softmax).
FUNCTIONS = {1: "mish", 2: "relu", 3: "none", 4: "tanh", 5: "sigmoid", 6: "selu", 7: "swish", 8: "relu2"}
FUNCTION_NUMBERS = {name: number for number, name in FUNCTIONS.items()}


# --------------------------------------------------------------------------- a Layer's values


class UnknownEncoding(ValueError):
    """A ``Layer`` whose encoding net.proto does not define."""

    def __init__(self, encoding: int):
        super().__init__(f"a layer has an unknown weights encoding ({encoding})")
        self.encoding = encoding


def decode_layer(f: dict | None) -> np.ndarray:
    """A ``Layer`` message's values as float32 (empty when absent), in any of its encodings, as lc0
    computes them; ProtoError for an odd byte count, UnknownEncoding for an encoding net.proto lacks."""
    if f is None:
        return np.zeros(0, np.float32)
    params = bytes(last(f, Layer.PARAMS, b""))
    encoding = int_(f, Layer.ENCODING, LINEAR16)
    size = 4 if encoding == FLOAT32 else 2
    if len(params) % size:
        raise ProtoError("a layer's bytes do not make whole values")
    if encoding in (0, LINEAR16):   # uint16 scaled into [min_val, max_val], as lc0 computes it
        theta = np.frombuffer(params, "<u2").astype(np.float32) / np.float32(65535)
        lo, hi = np.float32(float_(f, Layer.MIN_VAL)), np.float32(float_(f, Layer.MAX_VAL))
        return (lo * (np.float32(1) - theta) + hi * theta).astype(np.float32)
    if encoding == FLOAT16:
        return np.frombuffer(params, "<f2").astype(np.float32)
    if encoding == BFLOAT16:        # the top half of a float32
        return (np.frombuffer(params, "<u2").astype(np.uint32) << 16).view(np.float32).copy()
    if encoding == FLOAT32:
        return np.frombuffer(params, "<f4").astype(np.float32)
    raise UnknownEncoding(encoding)


def linear16_layer(values: np.ndarray) -> bytes:
    """A LINEAR16 ``Layer`` of ``values`` (row-major, computed in float64 from what is given): each
    value as round((v - min) / (max - min) * 65535), no encoding field (LINEAR16 is the default),
    as lc0's trainer writes them."""
    flat = np.asarray(values, dtype=np.float64).ravel()
    lo, hi = np.float32(flat.min()), np.float32(flat.max())
    span = float(hi) - float(lo)
    q = np.rint((flat - float(lo)) / span * 65535.0) if span > 0 else np.zeros_like(flat)
    params = np.clip(q, 0, 65535).astype("<u2").tobytes()
    return (float32(Layer.MIN_VAL, float(lo)) + float32(Layer.MAX_VAL, float(hi))
            + length_delimited(Layer.PARAMS, params))
