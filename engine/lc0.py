"""lc0's network files (``.pb.gz``, ``.pb``): read them, and build the contract's ONNX graph.

Leela's classical networks and the Maia networks are published as lc0 weight files: a gzipped
protobuf message (``pblczero.Net``, defined in lc0's ``proto/net.proto``). This module reads
that message with a small protobuf wire reader of its own, checks from the file's
``network_format`` that it is a network cyzero can run (the classical residual family, and the
attention-body transformers of formats 6, 7 and 134: see :class:`AttentionBody`), and builds
the same graph lc0's own ``leela2onnx`` builds, with the ``onnx`` package, in memory (for an
attention body: what lc0 v0.32.1's CPU backend computes, ``network_blas.cc``, which its
``leela2onnx`` does not quite, for the PE-dense embedding's FFN activation).
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
    "AttentionBody",
    "AttentionPolicy",
    "CONV_POLICY_MAP",
    "ConvLayer",
    "Dense",
    "EncoderLayer",
    "Lc0Error",
    "Lc0Net",
    "Lc0Weights",
    "LayerNorm",
    "PE_MAP",
    "Residual",
    "SEUnit",
    "Smolgen",
    "ValueHead",
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
    # The head's own encoder layers (``pol_encoder``) with their head count: on a residual tower
    # they have no smolgen and a SELU FFN, on an attention body the body's activations.
    encoders: list = field(default_factory=list)
    heads: int = 0


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
    body: "AttentionBody | None" = None  # an attention-body (transformer) network's weights


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
        embedding = _dense(w, 4, 5, "attention policy embedding", f)
        # The head's own encoder layers (pol_encoder, pol_headcount); no smolgen on a residual tower
        # (its smolgen_w is an attention body's field).
        heads = _int(w, 24)
        encoders = [_encoder_layer(raw, f"attention policy encoder {i}", embedding.b.size, heads, None)
                    for i, raw in enumerate(w.get(21, []))]
        wq = _dense(w, 17, 18, "attention policy queries", embedding.b.size)
        wk = _dense(w, 19, 20, "attention policy keys", embedding.b.size, wq.b.size)
        ppo = _layer(_message(w, 22))
        if ppo.size != 4 * wq.b.size:
            raise Lc0Error(f"attention policy promotion offsets: {ppo.size} weights, not 4 x {wq.b.size}")
        attention = AttentionPolicy(embedding, wq, wk, ppo.reshape(4, wq.b.size).astype(np.float32),
                                    encoders, heads if encoders else 0)
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


# --------------------------------------------------------------------------- attention bodies


def _pe_map() -> np.ndarray:
    """lc0's positional encoding of the PE-map embedding: row ``i`` (a square, a1..h8) is -1 at
    ``i`` and 1 at each square a queen-line or knight move away from it."""
    out = np.zeros((64, 64), np.float32)
    for i in range(64):
        for j in range(64):
            out[i, j] = -1.0 if i == j else float(move_plane(j % 8 - i % 8, j // 8 - i // 8) is not None)
    return out


#: The PE map's 64 positional channels per square (lc0's ``kPosEncoding``, derived from chess rules).
PE_MAP = _pe_map()

# ActivationFunction (net.proto) as the CPU backend computes them; 0 is the default activation.
_FUNCTIONS = {1: "mish", 2: "relu", 3: "none", 4: "tanh", 5: "sigmoid", 6: "selu", 7: "swish", 8: "relu2"}
_FUNCTION_NAMES = {"mish": "Mish", "relu": "ReLU", "none": "none", "tanh": "tanh", "sigmoid": "sigmoid",
                   "selu": "SELU", "swish": "swish", "relu2": "ReLU^2"}
_POLICY_HEADS = {3: "vanilla", 4: "optimistic", 5: "soft", 6: "opponent"}   # PolicyHeads' fields
_VALUE_HEADS = {1: "winner", 2: "q", 3: "st"}                               # ValueHeads' fields


@dataclass
class LayerNorm:
    """Over the last axis: ``(x - mean) / sqrt(var + epsilon) * gammas + betas``."""

    gammas: np.ndarray
    betas: np.ndarray


@dataclass
class Smolgen:
    """lc0's smolgen: per-square ``compress`` [C, E] (no bias), flattened to 64*C, ``dense1`` and
    ``ln1``, ``dense2`` and ``ln2`` (activation after each dense), then per head the net-wide
    ``smolgen_w`` [4096, G/heads] gives a 64x64 term added to that head's attention logits."""

    compress: np.ndarray
    dense1: Dense
    ln1: LayerNorm
    dense2: Dense
    ln2: LayerNorm


@dataclass
class EncoderLayer:
    """One transformer layer as lc0 runs it (post-norm, DeepNorm ``alpha`` on the branch):
    ``x = ln1(alpha * out(mha(x)) + x)``, ``x = ln2(alpha * ffn2(act(ffn1(x))) + x)``."""

    q: Dense
    k: Dense
    v: Dense
    out: Dense
    smolgen: Smolgen | None
    ln1: LayerNorm
    ffn1: Dense
    ffn2: Dense
    ln2: LayerNorm


@dataclass
class ValueHead:
    """From the body: ``embedding`` per square (default activation), flattened (square-major),
    ``ip1`` (default activation) and ``ip2`` (3 WDL logits, or 1 for tanh)."""

    embedding: Dense
    ip1: Dense
    ip2: Dense


@dataclass
class AttentionBody:
    """An lc0 attention-body (transformer) network, as lc0 v0.32.1's CPU backend computes it.

    The input embedding: per square, the 112 input planes and 64 positional channels (``PE_MAP``)
    or, for the PE-dense embedding, ``preproc`` [64*P, 768] of the first 12 planes (square-major)
    read as P channels per square; ``ip_emb`` with the default activation, then (PE dense) a layer
    norm, the input gates ``x * mult_gate + add_gate`` ([E, 64]), and (PE dense) an FFN with its
    layer norm and DeepNorm alpha. Then the encoder layers. ``epsilon``: 1e-3 (PE dense) or 1e-6.
    """

    embedding: str                     # "pe_map" or "pe_dense"
    preproc: Dense | None
    ip_emb: Dense                      # [E, 112 + 64] or [E, 112 + P]
    emb_ln: LayerNorm | None
    mult_gate: np.ndarray | None       # [E, 64]
    add_gate: np.ndarray | None
    emb_ffn: tuple[Dense, Dense, LayerNorm] | None
    encoders: list[EncoderLayer]
    heads: int
    smolgen_w: np.ndarray | None       # [4096, G / heads]
    activation: str                    # the default activation: "relu" or "mish"
    smolgen_activation: str
    ffn_activation: str
    policy_heads: dict[str, AttentionPolicy]
    value_heads: dict[str, ValueHead]
    policy_head: str                   # the heads the graph plays
    value_head: str
    wdl: bool
    moves_left: tuple[Dense, Dense, Dense] | None   # ip_mov (per square), ip1_mov, ip2_mov
    multihead: bool

    @property
    def width(self) -> int:
        return int(self.ip_emb.b.size)

    @property
    def epsilon(self) -> float:
        return 1e-3 if self.embedding == "pe_dense" else 1e-6

    @property
    def alpha(self) -> float:
        return float((2.0 * len(self.encoders)) ** -0.25) if self.encoders else 1.0

    @property
    def smolgen(self) -> bool:
        return any(e.smolgen is not None for e in self.encoders)


def _vector(f: dict, number: int, what: str, size: int) -> np.ndarray:
    v = _layer(_message(f, number))
    if v.size != size:
        raise Lc0Error(f"{what}: {v.size} values, not {size}")
    return v.astype(np.float32)


def _norm(f: dict, g: int, b: int, what: str, size: int) -> LayerNorm:
    return LayerNorm(_vector(f, g, what + " gammas", size), _vector(f, b, what + " betas", size))


def _encoder_layer(raw: bytes, what: str, width: int, heads: int, smolgen_rows: int | None) -> EncoderLayer:
    e = _fields(bytes(raw))
    mha = _message(e, 1) or {}
    if any(k in mha for k in (10, 11, 12)):
        raise Lc0Error(f"{what}: relative position encodings (RPE), which lc0 v0.32.1 does not run either")
    q = _dense(mha, 1, 2, f"{what} attention queries", width)
    d = q.b.size
    if heads < 1 or d % heads:
        raise Lc0Error(f"{what}: {d}-wide queries do not split into {heads} heads")
    k = _dense(mha, 3, 4, f"{what} attention keys", width, d)
    v = _dense(mha, 5, 6, f"{what} attention values", width, d)
    out = _dense(mha, 7, 8, f"{what} attention output", d, width)
    smolgen = None
    s = _message(mha, 9)
    if s is not None:
        compress = _layer(_message(s, 1))
        if not compress.size or compress.size % width:
            raise Lc0Error(f"{what} smolgen compress: {compress.size} weights are not C x {width}")
        c = compress.size // width
        dense1 = _dense(s, 2, 3, f"{what} smolgen dense 1", 64 * c)
        ln1 = _norm(s, 4, 5, f"{what} smolgen layer norm 1", dense1.b.size)
        dense2 = _dense(s, 6, 7, f"{what} smolgen dense 2", dense1.b.size)
        ln2 = _norm(s, 8, 9, f"{what} smolgen layer norm 2", dense2.b.size)
        g = dense2.b.size
        if g % heads:
            raise Lc0Error(f"{what} smolgen dense 2: {g} outputs do not split into {heads} heads")
        if smolgen_rows is None:
            raise Lc0Error(f"{what} has smolgen, but the file has no global smolgen weights (smolgen_w)")
        if smolgen_rows != g // heads:
            raise Lc0Error(f"{what} smolgen: {g // heads} values per head, but smolgen_w takes {smolgen_rows}")
        smolgen = Smolgen(compress.reshape(c, width).astype(np.float32), dense1, ln1, dense2, ln2)
    ln1 = _norm(e, 2, 3, f"{what} layer norm 1", width)
    ffn = _message(e, 4) or {}
    ffn1 = _dense(ffn, 1, 2, f"{what} FFN dense 1", width)
    ffn2 = _dense(ffn, 3, 4, f"{what} FFN dense 2", ffn1.b.size, width)
    ln2 = _norm(e, 5, 6, f"{what} layer norm 2", width)
    return EncoderLayer(q, k, v, out, smolgen, ln1, ffn1, ffn2, ln2)


def _function(value: int, default: str, what: str) -> str:
    if value == 0:
        return default
    if value == 9:
        raise Lc0Error(f"a softmax {what} activation (9), which lc0's CPU backend does not run either")
    if value not in _FUNCTIONS:
        raise Lc0Error(f"an unknown {what} activation ({value})")
    return _FUNCTIONS[value]


def _read_body(net: dict, fmt: dict, name: str, training: dict, license: str, min_version: str,
               heads: tuple[str | None, str | None]) -> Lc0Net:
    """An attention-body network (formats 6, 7, 134, or an SE format holding encoder layers), with
    lc0's fix-ups of older files (loader.cc) and its multihead reading (network_legacy.cc)."""
    nf = _message(_message(net, 4) or {}, 2) or {}
    w = _message(net, 10)
    if w is None:
        raise Lc0Error(f"{name}: an lc0 network file without weights")
    network, smolgen_act, ffn_act = fmt["network"], _int(nf, 8), _int(nf, 9)
    embedding_format = _int(nf, 10)
    if network == 4:        # an attention body written with an older proto
        network = 6
        if 35 in w:
            smolgen_act, ffn_act = 7, 8     # swish and relu^2, as lc0 overrides them
    if network == 134:
        network = 7
    if network == 6:
        if 44 in w and 45 in w:
            network, embedding_format = 7, 2
        elif 10 not in nf:
            embedding_format = 1
    try:
        if fmt["activation"] not in _ACTIVATIONS:
            raise Lc0Error(f"an unknown default activation ({fmt['activation']})")
        activation = _ACTIVATIONS[fmt["activation"]]
        body = _body(w, fmt, network, activation, _function(smolgen_act, activation, "smolgen"),
                     _function(ffn_act, activation, "FFN"), embedding_format == 2, heads)
    except Lc0Error as e:
        raise Lc0Error(f"{name}: {e}") from None
    return Lc0Net(None, _describe_body(fmt, body, training, license), fmt["input"], license, min_version,
                  training, body=body)


def _body(w: dict, fmt: dict, network: int, activation: str, smolgen_activation: str, ffn_activation: str,
          pe_dense: bool, heads: tuple[str | None, str | None]) -> AttentionBody:
    if w.get(2):
        raise Lc0Error(f"an attention body on a residual tower of {len(w[2])} blocks (a hybrid network), "
                       "which cyzero does not run")
    if fmt["policy"] != 3:
        raise Lc0Error(f"an attention body with a {_POLICIES.get(fmt['policy'], 'unknown')} policy head "
                       f"(format {fmt['policy']}); lc0 runs attention bodies with attention policy only")
    if fmt["value"] not in (1, 2):
        raise Lc0Error(f"a {_VALUES.get(fmt['value'], 'unknown')} value head (format {fmt['value']}); "
                       "cyzero runs classical and WDL heads")
    if fmt["moves_left"] not in (0, 1):
        raise Lc0Error(f"an unknown moves-left head ({fmt['moves_left']})")
    e_b = _layer(_message(w, 26))
    width = e_b.size
    if not width:
        raise Lc0Error("an attention body without an input embedding (ip_emb)")
    preproc = emb_ln = emb_ffn = None
    if pe_dense:
        pb = _layer(_message(w, 38))
        if not pb.size or pb.size % 64:
            raise Lc0Error(f"PE-dense embedding preprocessing (ip_emb_preproc): {pb.size} biases are not 64 x P")
        preproc = _dense(w, 37, 38, "PE-dense embedding preprocessing (ip_emb_preproc)", 64 * 12)
        channels = pb.size // 64
    else:
        channels = 64
    ip_emb = _dense(w, 25, 26, "input embedding (ip_emb)", INPUT_PLANES + channels)
    if pe_dense:
        emb_ln = _norm(w, 39, 40, "input embedding layer norm", width)
    mult = _layer(_message(w, 33))
    add = _layer(_message(w, 34))
    if mult.size and add.size:
        if mult.size != 64 * width or add.size != 64 * width:
            raise Lc0Error(f"input gates (ip_mult_gate, ip_add_gate): {mult.size} and {add.size} values, "
                           f"not {width} x 64")
        mult, add = mult.reshape(width, 64), add.reshape(width, 64)
    else:
        mult = add = None
    if pe_dense:
        ffn = _message(w, 41) or {}
        ffn1 = _dense(ffn, 1, 2, "input embedding FFN dense 1 (ip_emb_ffn)", width)
        ffn2 = _dense(ffn, 3, 4, "input embedding FFN dense 2 (ip_emb_ffn)", ffn1.b.size, width)
        emb_ffn = (ffn1, ffn2, _norm(w, 42, 43, "input embedding FFN layer norm", width))
    smolgen_w = None
    rows = None
    if 35 in w:
        sw = _layer(_message(w, 35))
        if not sw.size or sw.size % 4096:
            raise Lc0Error(f"global smolgen weights (smolgen_w): {sw.size} values are not 4096 x G")
        rows = sw.size // 4096
        smolgen_w = sw.reshape(4096, rows).astype(np.float32)
    head_count = _int(w, 28)
    encoders = [_encoder_layer(raw, f"encoder {i}", width, head_count, rows) for i, raw in enumerate(w.get(27, []))]
    if not encoders:
        raise Lc0Error("an attention body without encoder layers")

    def policy_head(f: dict, numbers: tuple, shared: tuple[np.ndarray, np.ndarray], what: str) -> AttentionPolicy:
        e_w, e_bias = _layer(_message(f, numbers[0])), _layer(_message(f, numbers[1]))
        if not e_w.size:
            e_w, e_bias = shared
        if not e_bias.size or e_w.size != e_bias.size * width:
            raise Lc0Error(f"{what} embedding: {e_w.size} weights and {e_bias.size} biases do not make a "
                           f"layer from {width} inputs")
        embedding = Dense(e_w.reshape(e_bias.size, width).astype(np.float32), e_bias.astype(np.float32))
        pe = embedding.b.size
        pol_heads = _int(f, numbers[8])
        pol_encoders = [_encoder_layer(raw, f"{what} encoder {i}", pe, pol_heads, rows)
                        for i, raw in enumerate(f.get(numbers[7], []))]
        wq = _dense(f, numbers[2], numbers[3], f"{what} queries", pe)
        wk = _dense(f, numbers[4], numbers[5], f"{what} keys", pe, wq.b.size)
        ppo = _layer(_message(f, numbers[6]))
        if ppo.size != 4 * wq.b.size:
            raise Lc0Error(f"{what} promotion offsets: {ppo.size} weights, not 4 x {wq.b.size}")
        return AttentionPolicy(embedding, wq, wk, ppo.reshape(4, wq.b.size).astype(np.float32),
                               pol_encoders, pol_heads)

    def value_head(f: dict, numbers: tuple, what: str) -> ValueHead:
        embedding = _dense(f, numbers[0], numbers[1], f"{what} embedding", width)
        ip1 = _dense(f, numbers[2], numbers[3], f"{what} dense 1", embedding.b.size * 64)
        ip2 = _dense(f, numbers[4], numbers[5], f"{what} dense 2", ip1.b.size, 3 if fmt["value"] == 2 else 1)
        return ValueHead(embedding, ip1, ip2)

    top_policy = (4, 5, 17, 18, 19, 20, 22, 21, 24)
    head_policy = (1, 2, 3, 4, 5, 6, 7, 8, 9)
    ph = _message(w, 45)
    shared = (_layer(_message(ph, 1)) if ph and 1 in ph else _layer(_message(w, 4)),
              _layer(_message(ph, 2)) if ph and 2 in ph else _layer(_message(w, 5)))
    policy_fields: dict[str, tuple] = {}
    if ph is not None:
        for number, head in _POLICY_HEADS.items():
            if number in ph or head == "vanilla":
                policy_fields[head] = (_message(ph, number) or {}, head_policy)
    elif any(k in w for k in (3, 11, 4)):
        policy_fields["vanilla"] = (w, top_policy)
    else:
        raise Lc0Error("no policy head weights")
    vh = _message(w, 44)
    value_fields: dict[str, tuple] = {}
    if vh is not None:
        for number, head in _VALUE_HEADS.items():
            if number in vh or head == "winner":
                value_fields[head] = (_message(vh, number) or {}, (1, 2, 3, 4, 5, 6))
    elif 6 in w or 29 in w:
        value_fields["winner"] = (w, (29, 30, 7, 8, 9, 10))
    else:
        raise Lc0Error("no value head weights")
    chosen_value, chosen_policy = heads[0] or "winner", heads[1] or "vanilla"
    for kind, chosen, names in (("value", chosen_value, value_fields), ("policy", chosen_policy, policy_fields)):
        if chosen not in names:
            raise Lc0Error(f"no {kind} head named {chosen!r}; its {kind} heads: {', '.join(names)}")
    policy_heads = {n: policy_head(f, numbers, shared, f"{n} policy head" if ph is not None else "policy head")
                    for n, (f, numbers) in policy_fields.items()
                    if n == chosen_policy or f.get(numbers[2])}
    value_heads = {n: value_head(f, numbers, f"{n} value head" if vh is not None else "value head")
                   for n, (f, numbers) in value_fields.items() if n == chosen_value or f.get(numbers[0])}
    moves_left = None
    if fmt["moves_left"] == 1:
        ip_mov = _dense(w, 31, 32, "moves-left embedding (ip_mov)", width)
        ip1_mov = _dense(w, 13, 14, "moves-left dense 1", ip_mov.b.size * 64)
        moves_left = (ip_mov, ip1_mov, _dense(w, 15, 16, "moves-left dense 2", ip1_mov.b.size, 1))
    return AttentionBody("pe_dense" if pe_dense else "pe_map", preproc, ip_emb, emb_ln, mult, add, emb_ffn,
                         encoders, head_count, smolgen_w, activation, smolgen_activation, ffn_activation,
                         policy_heads, value_heads, chosen_policy, chosen_value, fmt["value"] == 2, moves_left,
                         network == 7)


def _describe_body(fmt: dict, b: AttentionBody, training: dict, license: str) -> str:
    pol = "attention policy" + _policy_encoders(b.policy_heads[b.policy_head])
    if b.multihead:
        pol += f" (head {b.policy_head} of {'/'.join(b.policy_heads)})"
    value = "WDL value" if b.wdl else "single value"
    if b.multihead:
        value += f" (head {b.value_head} of {'/'.join(b.value_heads)})"
    text = (f"lc0 network attention body {b.width}x{len(b.encoders)}x{b.heads}h"
            f"{', smolgen' if b.smolgen else ''}, {'PE dense' if b.embedding == 'pe_dense' else 'PE map'} "
            f"embedding{', input gating' if b.mult_gate is not None else ''}, "
            f"{_INPUT_FORMATS.get(fmt['input'], fmt['input'])} input, {pol}, {value}, "
            f"{'moves-left head' if b.moves_left else 'no moves-left head'}, "
            f"{_FUNCTION_NAMES[b.activation]}, FFN {_FUNCTION_NAMES[b.ffn_activation]}"
            + (f", smolgen {_FUNCTION_NAMES[b.smolgen_activation]}" if b.smolgen else ""))
    return text + _describe(fmt, None, training, license)[len("lc0 network holding an ONNX model"):]


def _policy_encoders(policy: AttentionPolicy | None) -> str:
    """What an attention policy head's own encoder layers add to a network's description."""
    return f" with {len(policy.encoders)} encoder layers x {policy.heads}h" if policy and policy.encoders else ""


def _describe(fmt: dict, weights: Lc0Weights | None, training: dict, license: str) -> str:
    if weights is None:
        text = "lc0 network holding an ONNX model"
    else:
        text = (f"lc0 network {weights.blocks}x{weights.filters}{' SE' if weights.se else ''}, "
                f"{_INPUT_FORMATS.get(fmt['input'], fmt['input'])} input, {weights.policy} policy"
                f"{_policy_encoders(weights.attention_policy)}, "
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


def read_lc0(data: bytes, name: str = "network", *, value_head: str | None = None,
             policy_head: str | None = None) -> Lc0Net:
    """Read an lc0 weight file's bytes (gzipped or not); :class:`Lc0Error` names what is wrong.

    ``value_head`` / ``policy_head``: which heads of an attention-body network the graph plays
    (lc0's defaults: ``"winner"`` and ``"vanilla"``; a multihead file may also have ``"q"``,
    ``"st"`` and ``"optimistic"``, ``"soft"``, ``"opponent"``); a missing name is an
    :class:`Lc0Error` naming the heads the file has. Residual networks have one of each.
    """
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
        return _read(_fields(data), name, (value_head, policy_head))
    except _Corrupt:
        raise Lc0Error(f"{name}: a corrupt or truncated lc0 network file") from None


def _read(net: dict, name: str, heads: tuple[str | None, str | None] = (None, None)) -> Lc0Net:
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
    # An attention body: formats 6, 7, 134, or encoder layers behind the SE format (lc0 reads such
    # a file, written with an older proto, as format 6).
    body = network in (6, 7, 134) or (network == 4 and bool(weights_fields and weights_fields.get(27)))
    if not body and weights_fields and _BODY_FIELDS & set(weights_fields):
        raise Lc0Error(f"{name}: an lc0 network that says it is a {_NETWORKS.get(network, 'residual')} "
                       f"tower (format {network}) but holds attention-body (transformer) weights")
    if network not in (1, 2, 3, 4) and not body:
        raise Lc0Error(f"{name}: an lc0 network of unknown structure ({network}); cyzero runs the "
                       "classical residual family and attention bodies only")
    if fmt["input"] not in _INPUT_FORMATS:
        raise Lc0Error(f"{name}: an lc0 network for an unknown input format ({fmt['input']}); cyzero's "
                       f"encoder writes lc0's formats {', '.join(map(str, _INPUT_FORMATS))}")
    if body:
        return _read_body(net, fmt, name, training, license, min_version, heads)
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


def read_lc0_file(path: str | os.PathLike, *, value_head: str | None = None,
                  policy_head: str | None = None) -> Lc0Net:
    """Read an lc0 weight file from disk (heads: as :func:`read_lc0`); :class:`Lc0Error` names what
    is wrong."""
    name = os.path.basename(os.fspath(path))
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise Lc0Error(f"cannot read {path}: {e.strerror or e}") from None
    return read_lc0(data, name, value_head=value_head, policy_head=policy_head)


def is_lc0_file(path: str | os.PathLike) -> bool:
    """Whether ``path`` names an lc0 weight file (by its suffix, as lc0's own files are named)."""
    return os.fspath(path).lower().endswith(SUFFIXES)


# --------------------------------------------------------------------------- the ONNX graph


class _Graph:
    """An ONNX graph being built, in one dtype: its nodes and initializers, and the ops both graph
    builders (the residual tower's and the attention body's) are made of. Each op returns the name
    of its output."""

    def __init__(self, dtype: str):
        from onnx import TensorProto, helper, numpy_helper

        if dtype not in ("float32", "float16"):
            raise ValueError(f"dtype must be float32 or float16, got {dtype!r}")
        self.helper, self.numpy_helper = helper, numpy_helper
        self.dtype = dtype
        self.np_type = np.float16 if dtype == "float16" else np.float32
        self.elem = TensorProto.FLOAT16 if dtype == "float16" else TensorProto.FLOAT
        self.nodes: list = []
        self.inits: list = []

    def const(self, name: str, array: np.ndarray, cast: bool = True) -> str:
        array = np.asarray(array)
        self.inits.append(self.numpy_helper.from_array(array.astype(self.np_type) if cast else array, name))
        return name

    def ints(self, name: str, values) -> str:
        return self.const(name, np.array(values, np.int64), cast=False)

    def node(self, op: str, inputs: list[str], name: str, **attrs) -> str:
        self.nodes.append(self.helper.make_node(op, inputs, [name], name=name, **attrs))
        return name

    def act(self, x: str, kind: str, name: str) -> str:
        node = self.node
        if kind == "none":
            return x
        if kind == "mish":
            soft = node("Softplus", [x], name + "/softplus")
            return node("Mul", [x, node("Tanh", [soft], name + "/tanh")], name + "/mish")
        if kind == "relu":
            return node("Relu", [x], name + "/relu")
        if kind == "relu2":
            r = node("Relu", [x], name + "/relu")
            return node("Mul", [r, r], name + "/relu2")
        if kind == "swish":
            return node("Mul", [x, node("Sigmoid", [x], name + "/sigmoid")], name + "/swish")
        if kind == "selu":
            return node("Selu", [x], name + "/selu")
        if kind == "tanh":
            return node("Tanh", [x], name + "/tanh")
        if kind == "sigmoid":
            return node("Sigmoid", [x], name + "/sigmoid")
        raise Lc0Error(f"an unknown activation {kind!r}")

    def dense(self, x: str, layer: Dense, name: str, kind: str = "none") -> str:
        y = self.node("MatMul", [x, self.const(name + "/matmul/w", np.ascontiguousarray(layer.w.T))],
                      name + "/matmul")
        return self.act(self.node("Add", [y, self.const(name + "/add/w", layer.b)], name + "/add"), kind, name)

    def reshape(self, x: str, shape, name: str) -> str:
        return self.node("Reshape", [x, self.ints(name + "/shape", shape)], name)

    def rows(self, t: str, start: int, end: int, axis: int, name: str) -> str:
        return self.node("Slice", [t, self.ints(name + "/starts", [start]), self.ints(name + "/ends", [end]),
                                   self.ints(name + "/axes", [axis])], name)

    def norm(self, x: str, ln: LayerNorm, eps: float, name: str) -> str:
        """A layer norm over the last axis, from elementary ops (float16 included)."""
        node, const = self.node, self.const
        mean = node("ReduceMean", [x], name + "/mean", axes=[-1], keepdims=1)
        centred = node("Sub", [x, mean], name + "/centred")
        var = node("ReduceMean", [node("Mul", [centred, centred], name + "/square")], name + "/var",
                   axes=[-1], keepdims=1)
        std = node("Sqrt", [node("Add", [var, const(name + "/epsilon", np.array([eps], np.float32))],
                                 name + "/var_eps")], name + "/std")
        y = node("Mul", [node("Div", [centred, std], name + "/normed"), const(name + "/gammas", ln.gammas)],
                 name + "/scaled")
        return node("Add", [y, const(name + "/betas", ln.betas)], name)

    def skip_norm(self, x: str, skip: str, ln: LayerNorm, alpha: float, eps: float, name: str) -> str:
        if alpha != 1.0:
            x = self.node("Mul", [x, self.const(name + "/alpha", np.array([alpha], np.float32))], name + "/deepnorm")
        return self.norm(self.node("Add", [x, skip], name + "/skip"), ln, eps, name)

    def encoder(self, x: str, layer: EncoderLayer, heads: int, smolgen_act: str, ffn_act: str,
                alpha: float, eps: float, name: str) -> str:
        """One lc0 encoder layer on [N, 64, E] (network_blas.cc's ForwardEncoderLayer); its smolgen
        reads the net-wide ``/smolgen_w``, which the caller adds."""
        node, const, dense, reshape, norm = self.node, self.const, self.dense, self.reshape, self.norm
        d = layer.q.b.size
        depth = d // heads

        def split(t: str, part: str) -> str:   # [N, 64, d] -> [N, heads, 64, depth]
            return node("Transpose", [reshape(t, [-1, 64, heads, depth], f"{name}/mha/{part}/heads")],
                        f"{name}/mha/{part}/split", perm=[0, 2, 1, 3])

        q = split(dense(x, layer.q, name + "/mha/Q"), "Q")
        k = node("Transpose", [reshape(dense(x, layer.k, name + "/mha/K"), [-1, 64, heads, depth],
                                       name + "/mha/K/heads")], name + "/mha/K/split", perm=[0, 2, 3, 1])
        v = split(dense(x, layer.v, name + "/mha/V"), "V")
        logits = node("Mul", [node("MatMul", [q, k], name + "/mha/QK"),
                              const(name + "/mha/scale", np.array([1.0 / np.sqrt(depth)], np.float32))],
                      name + "/mha/QK/scaled")                                # [N, heads, 64, 64]
        s = layer.smolgen
        if s is not None:
            c = s.compress.shape[0]
            g = node("MatMul", [x, const(name + "/smolgen/compress/w", np.ascontiguousarray(s.compress.T))],
                     name + "/smolgen/compress")
            g = reshape(g, [-1, 64 * c], name + "/smolgen/flatten")
            g = norm(dense(g, s.dense1, name + "/smolgen/dense1", smolgen_act), s.ln1, 1e-3, name + "/smolgen/ln1")
            g = norm(dense(g, s.dense2, name + "/smolgen/dense2", smolgen_act), s.ln2, 1e-3, name + "/smolgen/ln2")
            g = reshape(g, [-1, heads, s.dense2.b.size // heads], name + "/smolgen/heads")
            g = node("MatMul", [g, "/smolgen_w"], name + "/smolgen/weights")
            logits = node("Add", [logits, reshape(g, [-1, heads, 64, 64], name + "/smolgen/square")],
                          name + "/mha/QK/smolgen")
        weights = node("Softmax", [logits], name + "/mha/softmax", axis=-1)
        attended = node("Transpose", [node("MatMul", [weights, v], name + "/mha/attended")],
                        name + "/mha/merge", perm=[0, 2, 1, 3])
        attended = reshape(attended, [-1, 64, d], name + "/mha/concat")
        x = self.skip_norm(dense(attended, layer.out, name + "/mha/out"), x, layer.ln1, alpha, eps, name + "/ln1")
        y = dense(dense(x, layer.ffn1, name + "/ffn/dense1", ffn_act), layer.ffn2, name + "/ffn/dense2")
        return self.skip_norm(y, x, layer.ln2, alpha, eps, name + "/ln2")

    def attention_policy(self, x: str, a: AttentionPolicy, activation: str, smolgen_act: str, ffn_act: str) -> None:
        """lc0's attention policy head on square features ``x`` [N, 64, F] (network_blas.cc): the
        embedding with ``activation``, the head's own encoder layers (DeepNorm alpha 1, epsilon
        1e-6), queries and keys, the from-to logits and the promotions' offsets, as the contract's
        policy output."""
        node, const, ints, rows, reshape = self.node, self.const, self.ints, self.rows, self.reshape
        e = self.dense(x, a.embedding, "/policy/embedding", activation)
        for i, layer in enumerate(a.encoders):
            e = self.encoder(e, layer, a.heads, smolgen_act, ffn_act, 1.0, 1e-6, f"/policy/encoder{i}")
        q = self.dense(e, a.wq, "/policy/q")
        k = self.dense(e, a.wk, "/policy/k")
        logits = node("Mul", [node("MatMul", [q, node("Transpose", [k], "/policy/kt", perm=[0, 2, 1])], "/policy/qk"),
                              const("/policy/scale", np.array([1.0 / np.sqrt(a.wq.b.size)], np.float32))],
                      "/policy/logits")                                               # [N, from, to]
        offsets = node("MatMul", [rows(k, 56, 64, 1, "/policy/k8"),                       # the 8th rank's keys
                                  const("/policy/ppo", np.ascontiguousarray(a.ppo.T))],
                       "/policy/promotion/offsets")                                   # [N, to file, 4]
        offsets = node("Add", [rows(offsets, 0, 3, 2, "/policy/promotion/pieces"),
                               rows(offsets, 3, 4, 2, "/policy/promotion/shared")], "/policy/promotion/add")
        pawns = rows(rows(logits, 48, 56, 1, "/policy/rank7"), 56, 64, 2, "/policy/rank7to8")   # [N, 8, 8]
        promotions = node("Add", [node("Unsqueeze", [pawns, ints("/policy/axis3", [3])], "/policy/pawns"),
                                  node("Unsqueeze", [offsets, ints("/policy/axis1", [1])], "/policy/offsets")],
                          "/policy/promotions")                                       # [N, from file, to file, q/r/b]
        flat = node("Concat", [reshape(logits, [-1, 4096], "/policy/flat"),
                               reshape(promotions, [-1, 192], "/policy/flat_promo")], "/policy/all", axis=1)
        node("Gather", [flat, ints("/policy/mapping_table", ATTENTION_POLICY_MAP)], POLICY_NAME, axis=1)

    def wdl(self, v: str, wdl: bool) -> None:
        """The contract's WDL output from the value head's logits: 3 (softmax) or 1 (tanh: W - L, D = 0)."""
        node, const = self.node, self.const
        if wdl:
            node("Softmax", [v], WDL_NAME, axis=1)
            return
        t = node("Tanh", [v], "/value/tanh")
        half = const("/value/half", np.array([0.5], np.float32))
        win = node("Add", [half, node("Mul", [t, half], "/value/half_tanh")], "/value/win")
        loss = node("Sub", [half, "/value/half_tanh"], "/value/loss")
        draw = node("Mul", [t, const("/value/zero", np.array([0.0], np.float32))], "/value/draw")
        node("Concat", [win, draw, loss], WDL_NAME, axis=1)

    def model(self, moves_left: bool, config: dict, description: str) -> bytes:
        """The serialized model: the contract's input and outputs (MLH where ``moves_left``), with
        cyzero's metadata (its variant, ``config``) and lc0's description."""
        import json

        helper, elem = self.helper, self.elem
        outputs = [helper.make_tensor_value_info(POLICY_NAME, elem, ["batch", POLICY_SIZE]),
                   helper.make_tensor_value_info(WDL_NAME, elem, ["batch", 3])]
        if moves_left:
            outputs.append(helper.make_tensor_value_info(MLH_NAME, elem, ["batch", 1]))
        graph = helper.make_graph(self.nodes, "lc0", [helper.make_tensor_value_info(INPUT_NAME, elem,
                                                                                     ["batch", INPUT_PLANES, 8, 8])],
                                  outputs, initializer=self.inits)
        model = helper.make_model(graph, producer_name="cyzero (from an lc0 weights file)",
                                  opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 8
        for key, value in (("cyzero.variant", "fp16" if self.dtype == "float16" else "fp32"),
                           ("cyzero.config", json.dumps(config)), ("lc0.description", description)):
            entry = model.metadata_props.add()
            entry.key, entry.value = key, value
        return model.SerializeToString()


def lc0_to_onnx(net: Lc0Net, dtype: str = "float32", *, value_head: str | None = None,
                policy_head: str | None = None) -> bytes:
    """The contract's graph for ``net`` (as lc0's ``leela2onnx`` builds it), serialized.

    ``dtype``: ``"float32"`` or ``"float16"`` (weights, input and outputs). ``value_head`` /
    ``policy_head``: another of an attention-body network's heads than the one it was read with.
    """
    if net.onnx_model is not None:
        return net.onnx_model
    if net.body is not None:
        return _body_to_onnx(net, dtype, value_head, policy_head)
    g = _Graph(dtype)
    node, const, dense, act = g.node, g.const, g.dense, g.act
    w = net.weights

    def conv(x: str, layer: ConvLayer, name: str, activation: bool = True) -> str:
        k = layer.w.shape[-1]
        y = node("Conv", [x, const(name + "/w/kernel", layer.w), const(name + "/w/bias", layer.b)], name,
                 pads=[k // 2] * 4, kernel_shape=[k, k])
        return act(y, w.activation, name) if activation else y

    flow = conv(INPUT_NAME, w.input, "/inputconv")
    for i, block in enumerate(w.residual):
        name = f"/block{i}"
        skip = flow
        flow = conv(flow, block.conv1, name + "/conv1")
        flow = conv(flow, block.conv2, name + "/conv2", activation=False)
        if block.se is not None:
            se, f = block.se, w.filters
            pooled = node("ReduceMean", [flow], name + "/se/reduce_mean", axes=[2, 3], keepdims=0)
            h = act(dense(pooled, Dense(se.w1, se.b1), name + "/se/dense1"), w.activation, name + "/se")
            gb = node("Reshape", [dense(h, Dense(se.w2, se.b2), name + "/se/dense2"),
                                  g.ints(name + "/se/shape", [-1, 2 * f, 1, 1])], name + "/se/reshape")
            g.nodes.append(g.helper.make_node("Split", [gb, g.ints(name + "/se/split/sizes", [f, f])],
                                              [name + "/se/gamma", name + "/se/beta"], name=name + "/se/split",
                                              axis=1))
            gated = node("Mul", [node("Sigmoid", [name + "/se/gamma"], name + "/se/sigmoid"), flow],
                         name + "/se/mul")
            flow = node("Add", [gated, name + "/se/beta"], name + "/se/add")
        flow = act(node("Add", [flow, skip], name + "/mixin"), w.activation, name)
    tower = flow

    if w.policy == "attention":
        # Each square's features, [N, 64, F] (a1..h8); the head's embedding is SELU on a residual
        # tower, and its own encoder layers have no smolgen and a SELU FFN (network_blas.cc).
        x = g.reshape(node("Transpose", [tower], "/policy/nhwc", perm=[0, 2, 3, 1]), [-1, 64, w.filters],
                      "/policy/squares")
        g.attention_policy(x, w.attention_policy, "selu", "none", "selu")
    elif w.policy == "convolution":
        p = conv(tower, w.policy1, "/policy/conv1")
        p = conv(p, w.policy_conv, "/policy/conv2", activation=False)
        p = g.reshape(p, [-1, CONV_POLICY_PLANES * 64], "/policy/flatten")
        node("Gather", [p, g.ints("/policy/mapping_table", CONV_POLICY_MAP)], POLICY_NAME, axis=1)
    else:
        p = conv(tower, w.policy_conv, "/policy/conv")
        p = g.reshape(p, [-1, w.policy_conv.b.size * 64], "/policy/flatten")
        y = node("MatMul", [p, const("/policy/dense/matmul/w", np.ascontiguousarray(w.ip_pol.w.T))],
                 "/policy/dense/matmul")
        node("Add", [y, const("/policy/dense/add/w", w.ip_pol.b)], POLICY_NAME)

    v = conv(tower, w.value_conv, "/value/conv")
    v = g.reshape(v, [-1, w.value_conv.b.size * 64], "/value/flatten")
    v = dense(v, w.ip1_val, "/value/dense1", w.activation)
    g.wdl(dense(v, w.ip2_val, "/value/dense2"), w.wdl)
    if w.moves_left:
        m = conv(tower, w.mlh_conv, "/mlh/conv")
        m = g.reshape(m, [-1, w.mlh_conv.b.size * 64], "/mlh/flatten")
        m = dense(m, w.ip1_mov, "/mlh/dense1", w.activation)
        node("Relu", [dense(m, w.ip2_mov, "/mlh/dense2")], MLH_NAME)
    return g.model(w.moves_left, {"blocks": w.blocks, "filters": w.filters}, net.description)


def _body_to_onnx(net: Lc0Net, dtype: str, value_head: str | None, policy_head: str | None) -> bytes:
    """The contract's graph of an attention-body network, as lc0 v0.32.1's CPU backend computes it
    (network_blas.cc): the embedding, the encoder layers, and the chosen policy and value heads."""
    g = _Graph(dtype)
    b = net.body
    value_head, policy_head = value_head or b.value_head, policy_head or b.policy_head
    for kind, chosen, heads in (("value", value_head, b.value_heads), ("policy", policy_head, b.policy_heads)):
        if chosen not in heads:
            raise Lc0Error(f"no {kind} head named {chosen!r}; its {kind} heads: {', '.join(heads)}")
    node, const, ints, dense, reshape, norm = g.node, g.const, g.ints, g.dense, g.reshape, g.norm

    if b.smolgen_w is not None and (b.smolgen or any(
            e.smolgen is not None for p in b.policy_heads.values() for e in p.encoders)):
        const("/smolgen_w", np.ascontiguousarray(b.smolgen_w.T))          # [G / heads, 4096]

    # The embedding: [N, 64 squares, channels].
    planes = node("Transpose", [reshape(INPUT_NAME, [-1, INPUT_PLANES, 64], "/planes/flat")], "/planes/squares",
                  perm=[0, 2, 1])
    if b.embedding == "pe_dense":
        first = node("Slice", [planes, ints("/preproc/starts", [0]), ints("/preproc/ends", [12]),
                               ints("/preproc/axes", [2])], "/preproc/pieces")        # [N, 64, 12]
        pre = dense(reshape(first, [-1, 64 * 12], "/preproc/flatten"), b.preproc, "/preproc/dense")
        pre = reshape(pre, [-1, 64, b.preproc.b.size // 64], "/preproc/squares")
        x = dense(node("Concat", [planes, pre], "/embedding/input", axis=2), b.ip_emb, "/embedding", b.activation)
        x = norm(x, b.emb_ln, 1e-3, "/embedding/ln")
    else:   # the PE map's 64 constant channels go into the embedding's bias, square by square
        w112 = b.ip_emb.w[:, :INPUT_PLANES]
        bias = PE_MAP.astype(np.float64) @ b.ip_emb.w[:, INPUT_PLANES:].T.astype(np.float64) + b.ip_emb.b
        x = dense(planes, Dense(np.ascontiguousarray(w112), bias.astype(np.float32)), "/embedding", b.activation)
    if b.mult_gate is not None:
        x = node("Mul", [x, const("/embedding/mult_gate", np.ascontiguousarray(b.mult_gate.T))], "/embedding/gate_mul")
        x = node("Add", [x, const("/embedding/add_gate", np.ascontiguousarray(b.add_gate.T))], "/embedding/gate_add")
    if b.emb_ffn is not None:
        ffn1, ffn2, ln = b.emb_ffn
        y = dense(dense(x, ffn1, "/embedding/ffn/dense1", b.ffn_activation), ffn2, "/embedding/ffn/dense2")
        x = g.skip_norm(y, x, ln, b.alpha, 1e-3, "/embedding/ffn/ln")
    for i, layer in enumerate(b.encoders):
        x = g.encoder(x, layer, b.heads, b.smolgen_activation, b.ffn_activation, b.alpha, b.epsilon, f"/encoder{i}")
    body = x

    # The attention policy head (the default activation on its embedding, on an attention body).
    g.attention_policy(body, b.policy_heads[policy_head], b.activation, b.smolgen_activation, b.ffn_activation)

    h = b.value_heads[value_head]
    v = dense(body, h.embedding, "/value/embedding", b.activation)
    v = dense(reshape(v, [-1, 64 * h.embedding.b.size], "/value/flatten"), h.ip1, "/value/dense1", b.activation)
    g.wdl(dense(v, h.ip2, "/value/dense2"), b.wdl)
    if b.moves_left is not None:
        ip_mov, ip1_mov, ip2_mov = b.moves_left
        m = dense(body, ip_mov, "/mlh/embedding", b.activation)
        m = dense(reshape(m, [-1, 64 * ip_mov.b.size], "/mlh/flatten"), ip1_mov, "/mlh/dense1", b.activation)
        node("Relu", [dense(m, ip2_mov, "/mlh/dense2")], MLH_NAME)
    description = net.description
    if (value_head, policy_head) != (b.value_head, b.policy_head):
        description = description.replace(f"head {b.value_head} of", f"head {value_head} of").replace(
            f"head {b.policy_head} of", f"head {policy_head} of")
    return g.model(b.moves_left is not None,
                   {"encoders": len(b.encoders), "embedding": b.width, "heads": b.heads}, description)
