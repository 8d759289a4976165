"""lc0's network files (``.pb.gz``, ``.pb``): read them, and build the contract's ONNX graph.

Leela's classical networks and the Maia networks are published as lc0 weight files: a gzipped
protobuf message (``pblczero.Net``, defined in lc0's ``proto/net.proto``). This module reads
that message with a small protobuf wire reader of its own, checks from the file's
``network_format`` that it is a network cyzero can run (the classical residual family), and
builds the same graph lc0's own ``leela2onnx`` builds, with the ``onnx`` package, in memory.
:class:`engine.network.Network` runs it like any ONNX file. ``onnx`` is imported only here, so
an engine that plays an ``.onnx`` file never loads it.

What the proto does not say, and what lc0 does (checked against a real file and lc0's own
export of it in the tests):

- ``bn_stddivs`` holds variances; batch norm is folded into the convolution with epsilon
  1e-5, and the convolution's own bias is subtracted from the mean first. Old files have no
  ``bn_gammas``/``bn_betas`` (1 and 0).
- The convolutional policy head has 80 output planes; 73 are moves: 56 queen-line planes
  (direction N, NE, E, SE, S, SW, W, NW, then distance 1-7), 8 knight planes (clockwise from
  one file right, two ranks up), 9 promotion planes (capture left, straight, capture right,
  each for the suffixes ``r``, ``b``, ``q`` of lc0's 1858 moves). :data:`CONV_POLICY_MAP` says
  where each of the 1858 moves is. (cyzero's own 73-plane head orders the promotion planes
  ``q``, ``r``, ``b``: see ``trainer/lc0_import.py``.)
- The classical input (format 1) is fed as cyzero's encoder writes it: the rule50 plane holds
  the raw count of plies.
- A network without ``network_format`` is classical: classical policy and value heads.
"""

from __future__ import annotations

import gzip
import os
import struct
import zlib
from dataclasses import dataclass, field

import numpy as np

from engine.contract import INPUT_NAME, MLH_NAME, POLICY_NAME, WDL_NAME
from engine.encoding import POLICY_INDEX, POLICY_SIZE

__all__ = [
    "ATTENTION_POLICY_MAP",
    "AttentionPolicy",
    "CONV_POLICY_MAP",
    "ConvLayer",
    "Dense",
    "Lc0Error",
    "Lc0Net",
    "Lc0Weights",
    "Residual",
    "SEUnit",
    "is_lc0_file",
    "lc0_to_onnx",
    "read_lc0",
    "read_lc0_file",
]

MAGIC = 0x1C0
BN_EPSILON = 1e-5
INPUT_PLANES = 112
CONV_POLICY_PLANES = 80
#: Suffixes that end a file name lc0 reads (``.pb.gz`` is what lc0's networks are published as).
SUFFIXES = (".pb.gz", ".pb")

QUEEN_DIRECTIONS = ((0, 1), (1, 1), (1, 0), (1, -1), (0, -1), (-1, -1), (-1, 0), (-1, 1))  # (file, rank)
KNIGHT_JUMPS = ((1, 2), (2, 1), (2, -1), (1, -2), (-1, -2), (-2, -1), (-2, 1), (-1, 2))
_PROMOTION_SUFFIXES = "rbq"

# network_format's enums, by name for the messages (net.proto).
_INPUT_FORMATS = {
    1: "classical 112-plane", 2: "112-plane with castling plane", 3: "112-plane canonical",
    4: "112-plane canonical with hectoplies", 5: "112-plane canonical v2",
    132: "112-plane canonical with hectoplies (armageddon)", 133: "112-plane canonical v2 (armageddon)",
}
_NETWORKS = {1: "classical", 2: "SE", 3: "classical", 4: "SE", 5: "ONNX", 6: "attention body",
             7: "attention body (multihead)", 134: "attention body (legacy multihead)"}
_POLICIES = {1: "classical", 2: "convolution", 3: "attention"}
_VALUES = {1: "classical", 2: "WDL", 3: "parametric"}
_ACTIVATIONS = {0: "relu", 1: "mish"}
# Weights fields that only attention-body networks have (encoder stacks, embeddings). The
# attention policy head's own (4, 5, 17-22, 24) sit on residual towers too (T60-T78).
_BODY_FIELDS = {25, 26, 27, 28, 33, 34, 35, 36}


class Lc0Error(ValueError):
    """An lc0 file cyzero cannot use; the message names what the file is, in one line."""


def move_plane(df: int, dr: int) -> int | None:
    """The conv policy plane (0..63) of a queen-line or knight displacement (files, ranks), None
    for anything else; lc0's order, which cyzero's own conv policy head shares."""
    if (df, dr) in KNIGHT_JUMPS:
        return 56 + KNIGHT_JUMPS.index((df, dr))
    dist = max(abs(df), abs(dr))
    if dist == 0 or not (df == 0 or dr == 0 or abs(df) == abs(dr)):
        return None
    return QUEEN_DIRECTIONS.index(((df > 0) - (df < 0), (dr > 0) - (dr < 0))) * 7 + dist - 1


def _conv_policy_map() -> np.ndarray:
    flat = np.empty(POLICY_SIZE, np.int64)
    for i, move in enumerate(POLICY_INDEX):
        f0, r0, f1, r1 = ord(move[0]) - 97, int(move[1]) - 1, ord(move[2]) - 97, int(move[3]) - 1
        if len(move) == 5:
            plane = 64 + 3 * (f1 - f0 + 1) + _PROMOTION_SUFFIXES.index(move[4])
        else:
            plane = move_plane(f1 - f0, r1 - r0)
        flat[i] = plane * 64 + r0 * 8 + f0
    return flat


#: For each of the 1858 policy moves, its index ``plane * 64 + from_square`` in the 80x8x8
#: output of lc0's convolutional policy head.
CONV_POLICY_MAP = _conv_policy_map()


# --------------------------------------------------------------------------- the wire format


class _Corrupt(Exception):
    pass


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        if i >= len(buf) or shift > 63:
            raise _Corrupt
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, i
        shift += 7


def _fields(buf: bytes) -> dict[int, list]:
    """One message's fields: number -> values (ints for varints and fixed32/64, bytes otherwise)."""
    out: dict[int, list] = {}
    i, n = 0, len(buf)
    while i < n:
        key, i = _varint(buf, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(buf, i)
        elif wire == 2:
            length, i = _varint(buf, i)
            value, i = buf[i:i + length], i + length
        elif wire == 5:
            value, i = buf[i:i + 4], i + 4
        elif wire == 1:
            value, i = buf[i:i + 8], i + 8
        else:
            raise _Corrupt
        if i > n or number == 0:
            raise _Corrupt
        out.setdefault(number, []).append(value)
    return out


def _last(f: dict, number: int, default=None):
    values = f.get(number)
    return values[-1] if values else default


def _message(f: dict, number: int) -> dict | None:
    value = _last(f, number)
    if value is None:
        return None
    if not isinstance(value, (bytes, memoryview)):
        raise _Corrupt
    return _fields(bytes(value))


def _float(f: dict, number: int, default: float = 0.0) -> float:
    value = _last(f, number)
    if value is None:
        return default
    if not isinstance(value, bytes) or len(value) != 4:
        raise _Corrupt
    return struct.unpack("<f", value)[0]


def _int(f: dict, number: int, default: int = 0) -> int:
    value = _last(f, number, default)
    if not isinstance(value, int):
        raise _Corrupt
    return value


def _text(f: dict, number: int) -> str:
    value = _last(f, number, b"")
    return bytes(value).decode("utf-8", "replace") if isinstance(value, bytes) else ""


def _layer(f: dict | None) -> np.ndarray:
    """A Layer's values as float32 (empty when absent), in any of lc0's encodings."""
    if f is None:
        return np.zeros(0, np.float32)
    params = bytes(_last(f, 3, b""))
    encoding = _int(f, 4, 1)
    size = 4 if encoding == 4 else 2
    if len(params) % size:
        raise _Corrupt
    if encoding in (0, 1):   # LINEAR16: uint16 scaled into [min_val, max_val], as lc0 computes it
        theta = np.frombuffer(params, "<u2").astype(np.float32) / np.float32(65535)
        lo, hi = np.float32(_float(f, 1)), np.float32(_float(f, 2))
        return (lo * (np.float32(1) - theta) + hi * theta).astype(np.float32)
    if encoding == 2:
        return np.frombuffer(params, "<f2").astype(np.float32)
    if encoding == 3:        # bfloat16: the top half of a float32
        return (np.frombuffer(params, "<u2").astype(np.uint32) << 16).view(np.float32).copy()
    if encoding == 4:
        return np.frombuffer(params, "<f4").astype(np.float32)
    raise Lc0Error(f"a layer has an unknown weights encoding ({encoding})")


# --------------------------------------------------------------------------- the weights


@dataclass
class ConvLayer:
    """A convolution with lc0's batch norm folded in: ``w`` [out, in, k, k], ``b`` [out]."""

    w: np.ndarray
    b: np.ndarray


@dataclass
class Dense:
    """A fully connected layer in lc0's layout: ``w`` [out, in], ``b`` [out]."""

    w: np.ndarray
    b: np.ndarray


@dataclass
class SEUnit:
    """lc0's squeeze-excitation: ``g = w2 @ act(w1 @ mean(x) + b1) + b2``, then
    ``sigmoid(g[:F]) * x + g[F:]``; ``w1`` [S, F], ``w2`` [2F, S]."""

    w1: np.ndarray
    b1: np.ndarray
    w2: np.ndarray
    b2: np.ndarray


@dataclass
class Residual:
    conv1: ConvLayer
    conv2: ConvLayer
    se: SEUnit | None


@dataclass
class AttentionPolicy:
    """lc0's attention policy head on a residual tower (T60-T78): each square's features ``x``
    [64, F] give ``e = selu(x @ embedding.w.T + b)`` [64, E], queries ``q = e @ wq.w.T + b`` and
    keys ``k`` [64, D]; ``q[from] . k[to] / sqrt(D)`` is the from-to logit, and a promotion adds
    ``(k[56 + to_file] @ ppo.T)[piece] + (...)[3]`` to its pawn move's logit (pieces q, r, b)."""

    embedding: Dense     # [E, F]
    wq: Dense            # [D, E]
    wk: Dense            # [D, E]
    ppo: np.ndarray      # [4, D]


def _attention_policy_map() -> np.ndarray:
    """For each of the 1858 policy entries, its place among the attention head's 4096 from-to
    logits and 192 promotion logits (``4096 + 24 * from_file + 3 * to_file + q/r/b``)."""
    out = np.empty(POLICY_SIZE, np.int64)
    for i, move in enumerate(POLICY_INDEX):
        frm = (ord(move[0]) - 97) + 8 * (int(move[1]) - 1)
        to = (ord(move[2]) - 97) + 8 * (int(move[3]) - 1)
        if len(move) == 5:
            out[i] = 4096 + 24 * (frm % 8) + 3 * (to % 8) + "qrb".index(move[4])
        else:
            out[i] = frm * 64 + to
    return out


#: Where each of the 1858 moves is in the attention policy head's 4288 logits.
ATTENTION_POLICY_MAP = _attention_policy_map()


@dataclass
class Lc0Weights:
    """A classical lc0 network's weights, batch norm folded; see the module doc for the graph."""

    input: ConvLayer
    residual: list[Residual]
    policy: str                     # "convolution", "classical" or "attention"
    policy1: ConvLayer | None       # convolution: 3x3 F -> F, activation
    policy_conv: ConvLayer | None   # convolution: 3x3 F -> 80; classical: 1x1 F -> C, activation
    ip_pol: Dense | None            # classical: [1858, C*64]
    value_conv: ConvLayer           # 1x1 F -> Cv, activation
    ip1_val: Dense                  # [H, Cv*64], activation
    ip2_val: Dense                  # [3, H] (softmax) or [1, H] (tanh)
    wdl: bool
    mlh_conv: ConvLayer | None      # 1x1 F -> Cm, activation
    ip1_mov: Dense | None           # [Hm, Cm*64], activation
    ip2_mov: Dense | None           # [1, Hm], then ReLU
    activation: str                 # "relu" or "mish"
    attention_policy: AttentionPolicy | None = None

    @property
    def blocks(self) -> int:
        return len(self.residual)

    @property
    def filters(self) -> int:
        return int(self.input.b.shape[0])

    @property
    def se(self) -> bool:
        return any(r.se is not None for r in self.residual)

    @property
    def moves_left(self) -> bool:
        return self.mlh_conv is not None


@dataclass
class Lc0Net:
    """An lc0 file as read: its weights (or the ONNX model it holds) and what it says of itself."""

    weights: Lc0Weights | None
    description: str
    input_format: int = 1
    license: str = ""
    min_version: str = ""
    training: dict = field(default_factory=dict)
    onnx_model: bytes | None = None      # a NETWORK_ONNX file's own graph


def _fold(block: dict | None, what: str, inputs: int, out: int | None = None,
          kernels: tuple[int, ...] = (1, 3)) -> ConvLayer | None:
    """A ConvBlock as one convolution: batch norm folded in as lc0 folds it."""
    if block is None:
        return None
    w, b = _layer(_message(block, 1)), _layer(_message(block, 2))
    means, variances = _layer(_message(block, 3)), _layer(_message(block, 4))
    gammas, betas = _layer(_message(block, 5)), _layer(_message(block, 6))
    if not w.size:
        return None
    n = out or (b.size or means.size)
    if not n:
        raise Lc0Error(f"{what}: a convolution without biases or batch norm, so of unknown width")
    k2 = w.size / (n * inputs)
    k = int(round(k2 ** 0.5))
    if k * k * n * inputs != w.size or k not in kernels:
        raise Lc0Error(f"{what}: {w.size} weights do not make a {'/'.join(f'{x}x{x}' for x in kernels)} "
                       f"convolution from {inputs} to {n} channels")
    w = w.reshape(n, inputs, k, k).astype(np.float32)
    b = b if b.size else np.zeros(n, np.float32)
    if means.size:
        if not (means.size == variances.size == n and b.size == n):
            raise Lc0Error(f"{what}: batch norm of the wrong width")
        gammas = gammas if gammas.size else np.ones(n, np.float32)
        betas = betas if betas.size else np.zeros(n, np.float32)
        scale = gammas / np.sqrt(variances + np.float32(BN_EPSILON))
        w = w * scale[:, None, None, None]
        b = -scale * (means - b) + betas
    if b.size != n:
        raise Lc0Error(f"{what}: {b.size} biases for {n} channels")
    return ConvLayer(np.ascontiguousarray(w, np.float32), np.ascontiguousarray(b, np.float32))


def _dense(f: dict, w_field: int, b_field: int, what: str, inputs: int,
           out: int | None = None) -> Dense:
    w, b = _layer(_message(f, w_field)), _layer(_message(f, b_field))
    n = out or b.size
    if not n or w.size != n * inputs or b.size != n:
        raise Lc0Error(f"{what}: {w.size} weights and {b.size} biases do not make a layer "
                       f"from {inputs} inputs" + (f" to {out}" if out else ""))
    return Dense(w.reshape(n, inputs).astype(np.float32), b.astype(np.float32))


def _weights(w: dict, policy: str, wdl: bool, moves_left: bool, activation: str) -> Lc0Weights:
    stem = _fold(_message(w, 1), "input convolution", INPUT_PLANES, kernels=(3,))
    if stem is None:
        raise Lc0Error("no input convolution: not a residual network")
    f = stem.b.shape[0]
    residual = []
    for i, raw in enumerate(w.get(2, [])):
        r = _fields(bytes(raw))
        conv1 = _fold(_message(r, 1), f"block {i} conv1", f, f, kernels=(3,))
        conv2 = _fold(_message(r, 2), f"block {i} conv2", f, f, kernels=(3,))
        if conv1 is None or conv2 is None:
            raise Lc0Error(f"block {i} has no convolutions")
        se = None
        s = _message(r, 3)
        if s is not None:
            b1 = _layer(_message(s, 2))
            w1, w2, b2 = _layer(_message(s, 1)), _layer(_message(s, 3)), _layer(_message(s, 4))
            if b1.size:
                c = b1.size
                if w1.size != c * f or w2.size != 2 * f * c or b2.size != 2 * f:
                    raise Lc0Error(f"block {i}: an SE unit of the wrong size")
                se = SEUnit(w1.reshape(c, f), b1, w2.reshape(2 * f, c), b2)
        residual.append(Residual(conv1, conv2, se))
    attention = None
    if policy == "convolution":
        policy1 = _fold(_message(w, 11), "policy conv1", f, f, kernels=(3,))
        policy_conv = _fold(_message(w, 3), "policy conv2", f, CONV_POLICY_PLANES, kernels=(3,))
        if policy1 is None or policy_conv is None:
            raise Lc0Error("the file says convolutional policy, but its policy convolutions are missing")
        ip_pol = None
    elif policy == "attention":
        policy1 = policy_conv = ip_pol = None
        if w.get(21):
            raise Lc0Error(f"an attention policy with {len(w[21])} policy encoder layers, which cyzero does "
                           "not run yet (the head without them it does)")
        embedding = _dense(w, 4, 5, "attention policy embedding", f)
        wq = _dense(w, 17, 18, "attention policy queries", embedding.b.size)
        wk = _dense(w, 19, 20, "attention policy keys", embedding.b.size, wq.b.size)
        ppo = _layer(_message(w, 22))
        if ppo.size != 4 * wq.b.size:
            raise Lc0Error(f"attention policy promotion offsets: {ppo.size} weights, not 4 x {wq.b.size}")
        attention = AttentionPolicy(embedding, wq, wk, ppo.reshape(4, wq.b.size).astype(np.float32))
    else:
        policy1 = None
        policy_conv = _fold(_message(w, 3), "policy convolution", f, kernels=(1,))
        if policy_conv is None:
            raise Lc0Error("no policy head")
        ip_pol = _dense(w, 4, 5, "policy dense layer", policy_conv.b.size * 64, POLICY_SIZE)
    value_conv = _fold(_message(w, 6), "value convolution", f, kernels=(1,))
    if value_conv is None:
        raise Lc0Error("no value head")
    ip1_val = _dense(w, 7, 8, "value dense layer 1", value_conv.b.size * 64)
    ip2_val = _dense(w, 9, 10, "value dense layer 2", ip1_val.b.size, 3 if wdl else 1)
    mlh_conv = ip1_mov = ip2_mov = None
    if moves_left:
        mlh_conv = _fold(_message(w, 12), "moves-left convolution", f, kernels=(1,))
        if mlh_conv is None:
            raise Lc0Error("the file says it has a moves-left head, but its weights are missing")
        ip1_mov = _dense(w, 13, 14, "moves-left dense layer 1", mlh_conv.b.size * 64)
        ip2_mov = _dense(w, 15, 16, "moves-left dense layer 2", ip1_mov.b.size, 1)
    return Lc0Weights(stem, residual, policy, policy1, policy_conv, ip_pol, value_conv, ip1_val,
                      ip2_val, wdl, mlh_conv, ip1_mov, ip2_mov, activation, attention)


def _describe(fmt: dict, weights: Lc0Weights | None, training: dict, license: str) -> str:
    if weights is None:
        text = "lc0 network holding an ONNX model"
    else:
        text = (f"lc0 network {weights.blocks}x{weights.filters}{' SE' if weights.se else ''}, "
                f"{_INPUT_FORMATS.get(fmt['input'], fmt['input'])} input, {weights.policy} policy, "
                f"{'WDL' if weights.wdl else 'single'} value, "
                f"{'moves-left head' if weights.moves_left else 'no moves-left head'}, "
                f"{'Mish' if weights.activation == 'mish' else 'ReLU'}")
    if training:
        parts = [f"{training['training_steps']} steps" if "training_steps" in training else ""]
        for key, label in (("learning_rate", "lr"), ("policy_loss", "policy loss"),
                           ("mse_loss", "mse"), ("accuracy", "accuracy")):
            if key in training:
                parts.append(f"{label} {training[key]:.4g}")
        text += "; trained " + ", ".join(p for p in parts if p)
    if license:
        text += f"; license {license}"
    return text


def read_lc0(data: bytes, name: str = "network") -> Lc0Net:
    """Read an lc0 weight file's bytes (gzipped or not); :class:`Lc0Error` names what is wrong."""
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as e:
            raise Lc0Error(f"{name}: a corrupt or truncated gzip file ({e})") from None
    if data[:2] in (b"1\n", b"2\n"):
        raise Lc0Error(f"{name}: an lc0 text-format weights file (format {data[:1].decode()}), which lc0 "
                       "itself no longer reads; convert it with lc0's tools first")
    # The header: field 1 (fixed32) is lc0's magic, and serializers write it first.
    if data[:1] != b"\x0d" or data[1:5] != struct.pack("<I", MAGIC):
        looks_onnx = b"onnx" in data[:64].lower() or b"/input/planes" in data[:4096]
        raise Lc0Error(f"{name}: not an lc0 network file (no lc0 weights header)"
                       + ("; it looks like an ONNX model: name it .onnx" if looks_onnx else ""))
    try:
        return _read(_fields(data), name)
    except _Corrupt:
        raise Lc0Error(f"{name}: a corrupt or truncated lc0 network file") from None


def _read(net: dict, name: str) -> Lc0Net:
    version = _message(net, 3) or {}
    min_version = ".".join(str(_int(version, k)) for k in (1, 2, 3)) if version else ""
    license = _text(net, 2)
    t = _message(net, 5) or {}
    training: dict = {}
    if 1 in t:
        training["training_steps"] = _int(t, 1)
    for key, number in (("learning_rate", 2), ("mse_loss", 3), ("policy_loss", 4), ("accuracy", 5)):
        if number in t:
            training[key] = _float(t, number)
    if 6 in t:
        training["lc0_params"] = _text(t, 6)
    format_ = _message(net, 4) or {}
    nf = _message(format_, 2)
    if nf is None:   # older files: lc0 reads them as classical
        fmt = {"input": 1, "network": 1, "policy": 1, "value": 1, "moves_left": 0, "activation": 0}
    else:
        fmt = {"input": _int(nf, 1), "network": _int(nf, 3), "policy": _int(nf, 4),
               "value": _int(nf, 5), "moves_left": _int(nf, 6), "activation": _int(nf, 7)}
        if fmt["network"] in (1, 2):   # before head formats: classical heads
            fmt["policy"], fmt["value"] = 1, 1
    weights_fields = _message(net, 10)
    network = fmt["network"]
    if network == 5:
        return _onnx_inside(net, fmt, name, training, license, min_version)
    if network in (6, 7, 134) or (weights_fields and _BODY_FIELDS & set(weights_fields)):
        raise Lc0Error(f"{name}: an lc0 attention-body (transformer) network; cyzero runs the classical "
                       "residual family only (convolution and SE towers)")
    if network not in (1, 2, 3, 4):
        raise Lc0Error(f"{name}: an lc0 network of unknown structure ({network}); cyzero runs the "
                       "classical residual family only")
    if fmt["input"] != 1:
        label = _INPUT_FORMATS.get(fmt["input"], f"unknown input format {fmt['input']}")
        raise Lc0Error(f"{name}: an lc0 network for the {label} input (format {fmt['input']}); cyzero's "
                       "encoder writes the classical 112-plane input (format 1)")
    if fmt["policy"] not in (1, 2, 3):
        raise Lc0Error(f"{name}: an lc0 network with an unknown policy head (format {fmt['policy']}); "
                       "cyzero runs classical, convolutional and attention heads")
    if fmt["value"] not in (1, 2):
        raise Lc0Error(f"{name}: an lc0 network with a {_VALUES.get(fmt['value'], 'unknown')} value head "
                       f"(format {fmt['value']}); cyzero runs classical and WDL heads")
    if fmt["moves_left"] not in (0, 1):
        raise Lc0Error(f"{name}: an lc0 network with an unknown moves-left head ({fmt['moves_left']})")
    if fmt["activation"] not in _ACTIVATIONS:
        raise Lc0Error(f"{name}: an lc0 network with an unknown activation ({fmt['activation']})")
    if weights_fields is None:
        raise Lc0Error(f"{name}: an lc0 network file without weights")
    try:
        weights = _weights(weights_fields, _POLICIES[fmt["policy"]], fmt["value"] == 2,
                           fmt["moves_left"] == 1, _ACTIVATIONS[fmt["activation"]])
    except Lc0Error as e:
        raise Lc0Error(f"{name}: {e}") from None
    return Lc0Net(weights, _describe(fmt, weights, training, license), fmt["input"], license,
                  min_version, training)


def _onnx_inside(net: dict, fmt: dict, name: str, training: dict, license: str,
                 min_version: str) -> Lc0Net:
    """A NETWORK_ONNX file: lc0's own graph, used as it is when it speaks the contract."""
    model = _message(net, 11)
    if model is None or not _last(model, 1):
        raise Lc0Error(f"{name}: an lc0 file that says it holds an ONNX model but has none")
    names = {"input": _text(model, 3), "wdl": _text(model, 5), "policy": _text(model, 6)}
    if names != {"input": INPUT_NAME, "wdl": WDL_NAME, "policy": POLICY_NAME}:
        raise Lc0Error(f"{name}: an lc0 file holding an ONNX model with input {names['input']!r}, "
                       f"policy {names['policy']!r} and WDL {names['wdl'] or '(none)'!r}; cyzero needs "
                       f"{INPUT_NAME!r}, {POLICY_NAME!r} and {WDL_NAME!r}")
    return Lc0Net(None, _describe(fmt, None, training, license), fmt["input"], license, min_version,
                  training, onnx_model=bytes(_last(model, 1)))


def read_lc0_file(path: str | os.PathLike) -> Lc0Net:
    """Read an lc0 weight file from disk; :class:`Lc0Error` names what is wrong."""
    name = os.path.basename(os.fspath(path))
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise Lc0Error(f"cannot read {path}: {e.strerror or e}") from None
    return read_lc0(data, name)


def is_lc0_file(path: str | os.PathLike) -> bool:
    """Whether ``path`` names an lc0 weight file (by its suffix, as lc0's own files are named)."""
    return os.fspath(path).lower().endswith(SUFFIXES)


# --------------------------------------------------------------------------- the ONNX graph


def lc0_to_onnx(net: Lc0Net, dtype: str = "float32") -> bytes:
    """The contract's graph for ``net`` (as lc0's ``leela2onnx`` builds it), serialized.

    ``dtype``: ``"float32"`` or ``"float16"`` (weights, input and outputs).
    """
    if net.onnx_model is not None:
        return net.onnx_model
    from onnx import TensorProto, helper, numpy_helper

    if dtype not in ("float32", "float16"):
        raise ValueError(f"dtype must be float32 or float16, got {dtype!r}")
    np_type = np.float16 if dtype == "float16" else np.float32
    elem = TensorProto.FLOAT16 if dtype == "float16" else TensorProto.FLOAT
    w = net.weights
    nodes: list = []
    inits: list = []

    def const(name: str, array: np.ndarray, cast: bool = True) -> str:
        inits.append(numpy_helper.from_array(array.astype(np_type) if cast else array, name))
        return name

    def node(op: str, inputs: list[str], name: str, **attrs) -> str:
        nodes.append(helper.make_node(op, inputs, [name], name=name, **attrs))
        return name

    def act(x: str, name: str) -> str:
        if w.activation == "mish":
            soft = node("Softplus", [x], name + "/softplus")
            return node("Mul", [x, node("Tanh", [soft], name + "/tanh")], name + "/mish")
        return node("Relu", [x], name + "/relu")

    def conv(x: str, layer: ConvLayer, name: str, activation: bool = True) -> str:
        k = layer.w.shape[-1]
        y = node("Conv", [x, const(name + "/w/kernel", layer.w), const(name + "/w/bias", layer.b)], name,
                 pads=[k // 2] * 4, kernel_shape=[k, k])
        return act(y, name) if activation else y

    def dense(x: str, layer: Dense, name: str) -> str:
        y = node("MatMul", [x, const(name + "/matmul/w", np.ascontiguousarray(layer.w.T))], name + "/matmul")
        return node("Add", [y, const(name + "/add/w", layer.b)], name + "/add")

    def flatten(x: str, width: int, name: str) -> str:
        return node("Reshape", [x, const(name + "/shape", np.array([-1, width], np.int64), cast=False)], name)

    def attention_policy(tower: str) -> None:
        a = w.attention_policy
        shape = const("/policy/squares/shape", np.array([-1, 64, w.filters], np.int64), cast=False)
        x = node("Reshape", [node("Transpose", [tower], "/policy/nhwc", perm=[0, 2, 3, 1]), shape],
                 "/policy/squares")                                       # [N, 64, F], a1..h8
        e = node("Selu", [dense(x, a.embedding, "/policy/embedding")], "/policy/embedding/selu")
        q = dense(e, a.wq, "/policy/q")
        k = dense(e, a.wk, "/policy/k")
        logits = node("Mul", [node("MatMul", [q, node("Transpose", [k], "/policy/kt", perm=[0, 2, 1])],
                                   "/policy/qk"),
                              const("/policy/scale", np.array([1.0 / np.sqrt(a.wq.b.size)], np.float32))],
                      "/policy/logits")                                   # [N, from, to]

        def rows(x: str, start: int, end: int, axis: int, name: str) -> str:
            return node("Slice", [x, const(name + "/starts", np.array([start], np.int64), cast=False),
                                  const(name + "/ends", np.array([end], np.int64), cast=False),
                                  const(name + "/axes", np.array([axis], np.int64), cast=False)], name)

        ranked8 = rows(k, 56, 64, 1, "/policy/k8")                        # keys of the 8th rank
        offsets = node("MatMul", [ranked8, const("/policy/ppo", np.ascontiguousarray(a.ppo.T))],
                       "/policy/promotion/offsets")                       # [N, to file, 4]
        offsets = node("Add", [rows(offsets, 0, 3, 2, "/policy/promotion/pieces"),
                               rows(offsets, 3, 4, 2, "/policy/promotion/shared")], "/policy/promotion/add")
        pawns = rows(rows(logits, 48, 56, 1, "/policy/rank7"), 56, 64, 2, "/policy/rank7to8")  # [N, 8, 8]
        promotions = node("Add", [node("Unsqueeze", [pawns, const("/policy/axis3", np.array([3], np.int64),
                                                                  cast=False)], "/policy/pawns"),
                                  node("Unsqueeze", [offsets, const("/policy/axis1", np.array([1], np.int64),
                                                                    cast=False)], "/policy/offsets")],
                          "/policy/promotions")                           # [N, from file, to file, q/r/b]
        flat = node("Concat", [flatten(logits, 4096, "/policy/flat"), flatten(promotions, 192, "/policy/flat_promo")],
                    "/policy/all", axis=1)
        node("Gather", [flat, const("/policy/mapping_table", ATTENTION_POLICY_MAP, cast=False)], POLICY_NAME,
             axis=1)

    flow = conv(INPUT_NAME, w.input, "/inputconv")
    for i, block in enumerate(w.residual):
        name = f"/block{i}"
        skip = flow
        flow = conv(flow, block.conv1, name + "/conv1")
        flow = conv(flow, block.conv2, name + "/conv2", activation=False)
        if block.se is not None:
            se, f = block.se, w.filters
            pooled = node("ReduceMean", [flow], name + "/se/reduce_mean", axes=[2, 3], keepdims=0)
            h = act(dense(pooled, Dense(se.w1, se.b1), name + "/se/dense1"), name + "/se")
            g = dense(h, Dense(se.w2, se.b2), name + "/se/dense2")
            g = node("Reshape", [g, const(name + "/se/shape", np.array([-1, 2 * f, 1, 1], np.int64),
                                          cast=False)], name + "/se/reshape")
            nodes.append(helper.make_node("Split", [g, const(name + "/se/split/sizes", np.array([f, f], np.int64),
                                                             cast=False)],
                                          [name + "/se/gamma", name + "/se/beta"], name=name + "/se/split", axis=1))
            gated = node("Mul", [node("Sigmoid", [name + "/se/gamma"], name + "/se/sigmoid"), flow],
                         name + "/se/mul")
            flow = node("Add", [gated, name + "/se/beta"], name + "/se/add")
        flow = act(node("Add", [flow, skip], name + "/mixin"), name)
    tower = flow

    if w.policy == "attention":
        attention_policy(tower)
    elif w.policy == "convolution":
        p = conv(tower, w.policy1, "/policy/conv1")
        p = conv(p, w.policy_conv, "/policy/conv2", activation=False)
        p = flatten(p, CONV_POLICY_PLANES * 64, "/policy/flatten")
        node("Gather", [p, const("/policy/mapping_table", CONV_POLICY_MAP, cast=False)], POLICY_NAME, axis=1)
    else:
        p = conv(tower, w.policy_conv, "/policy/conv")
        p = flatten(p, w.policy_conv.b.size * 64, "/policy/flatten")
        y = node("MatMul", [p, const("/policy/dense/matmul/w", np.ascontiguousarray(w.ip_pol.w.T))],
                 "/policy/dense/matmul")
        node("Add", [y, const("/policy/dense/add/w", w.ip_pol.b)], POLICY_NAME)

    v = conv(tower, w.value_conv, "/value/conv")
    v = flatten(v, w.value_conv.b.size * 64, "/value/flatten")
    v = act(dense(v, w.ip1_val, "/value/dense1"), "/value/dense1")
    v = dense(v, w.ip2_val, "/value/dense2")
    if w.wdl:
        node("Softmax", [v], WDL_NAME, axis=1)
    else:   # a single value: W - L = tanh, D = 0
        t = node("Tanh", [v], "/value/tanh")
        half = const("/value/half", np.array([0.5], np.float32))
        win = node("Add", [half, node("Mul", [t, half], "/value/half_tanh")], "/value/win")
        loss = node("Sub", [half, "/value/half_tanh"], "/value/loss")
        draw = node("Mul", [t, const("/value/zero", np.array([0.0], np.float32))], "/value/draw")
        node("Concat", [win, draw, loss], WDL_NAME, axis=1)
    outputs = [helper.make_tensor_value_info(POLICY_NAME, elem, ["batch", POLICY_SIZE]),
               helper.make_tensor_value_info(WDL_NAME, elem, ["batch", 3])]
    if w.moves_left:
        m = conv(tower, w.mlh_conv, "/mlh/conv")
        m = flatten(m, w.mlh_conv.b.size * 64, "/mlh/flatten")
        m = act(dense(m, w.ip1_mov, "/mlh/dense1"), "/mlh/dense1")
        node("Relu", [dense(m, w.ip2_mov, "/mlh/dense2")], MLH_NAME)
        outputs.append(helper.make_tensor_value_info(MLH_NAME, elem, ["batch", 1]))

    graph = helper.make_graph(nodes, "lc0", [helper.make_tensor_value_info(INPUT_NAME, elem,
                                                                            ["batch", INPUT_PLANES, 8, 8])],
                              outputs, initializer=inits)
    model = helper.make_model(graph, producer_name="cyzero (from an lc0 weights file)",
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    import json

    for key, value in (("cyzero.variant", "fp16" if dtype == "float16" else "fp32"),
                       ("cyzero.config", json.dumps({"blocks": w.blocks, "filters": w.filters})),
                       ("lc0.description", net.description)):
        entry = model.metadata_props.add()
        entry.key, entry.value = key, value
    return model.SerializeToString()
