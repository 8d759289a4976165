"""lc0's network files (``.pb.gz``, ``.pb``): read them as lc0 reads them (``network_legacy.cc``).

Leela's classical networks and the Maia networks are published as lc0 weight files: a gzipped
protobuf message (``pblczero.Net``, defined in lc0's ``proto/net.proto``). This module reads
that message with the project's one protobuf codec (:mod:`engine.lc0_proto`, which also knows
net.proto's field numbers and weight encodings), checks from the file's ``network_format`` that
it is a network cyzero can run (the classical residual family, and the attention-body
transformers of formats 6, 7 and 134: see :class:`AttentionBody`), and gives the weights as
arrays; :mod:`engine.lc0_onnx` builds the contract's graph from them.

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

from engine import lc0_proto as pb
from engine.contract import INPUT_NAME, POLICY_NAME, WDL_NAME
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
    "read_lc0",
    "read_lc0_file",
]

BN_EPSILON = 1e-5
INPUT_PLANES = 112
CONV_POLICY_PLANES = 80
#: Suffixes that end a file name lc0 reads (``.pb.gz`` is what lc0's networks are published as).
SUFFIXES = (".pb.gz", ".pb")

QUEEN_DIRECTIONS = ((0, 1), (1, 1), (1, 0), (1, -1), (0, -1), (-1, -1), (-1, 0), (-1, 1))  # (file, rank)
KNIGHT_JUMPS = ((1, 2), (2, 1), (2, -1), (1, -2), (-1, -2), (-2, -1), (-2, 1), (-1, 2))
_PROMOTION_SUFFIXES = "rbq"


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


def _layer(f: dict | None) -> np.ndarray:
    """A Layer's values as float32 (empty when absent), in any of lc0's encodings."""
    try:
        return pb.decode_layer(f)
    except pb.UnknownEncoding as e:
        raise Lc0Error(str(e)) from None


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
    C = pb.ConvBlock
    w, b = _layer(pb.message(block, C.WEIGHTS)), _layer(pb.message(block, C.BIASES))
    means, variances = _layer(pb.message(block, C.BN_MEANS)), _layer(pb.message(block, C.BN_STDDIVS))
    gammas, betas = _layer(pb.message(block, C.BN_GAMMAS)), _layer(pb.message(block, C.BN_BETAS))
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
    w, b = _layer(pb.message(f, w_field)), _layer(pb.message(f, b_field))
    n = out or b.size
    if not n or w.size != n * inputs or b.size != n:
        raise Lc0Error(f"{what}: {w.size} weights and {b.size} biases do not make a layer "
                       f"from {inputs} inputs" + (f" to {out}" if out else ""))
    return Dense(w.reshape(n, inputs).astype(np.float32), b.astype(np.float32))


def _weights(w: dict, policy: str, wdl: bool, moves_left: bool, activation: str) -> Lc0Weights:
    W = pb.Weights
    stem = _fold(pb.message(w, W.INPUT), "input convolution", INPUT_PLANES, kernels=(3,))
    if stem is None:
        raise Lc0Error("no input convolution: not a residual network")
    f = stem.b.shape[0]
    residual = []
    for i, raw in enumerate(w.get(W.RESIDUAL, [])):
        r = pb.fields(bytes(raw))
        conv1 = _fold(pb.message(r, pb.Residual.CONV1), f"block {i} conv1", f, f, kernels=(3,))
        conv2 = _fold(pb.message(r, pb.Residual.CONV2), f"block {i} conv2", f, f, kernels=(3,))
        if conv1 is None or conv2 is None:
            raise Lc0Error(f"block {i} has no convolutions")
        se = None
        s = pb.message(r, pb.Residual.SE)
        if s is not None:
            b1 = _layer(pb.message(s, pb.SEunit.B1))
            w1, w2, b2 = (_layer(pb.message(s, pb.SEunit.W1)), _layer(pb.message(s, pb.SEunit.W2)),
                          _layer(pb.message(s, pb.SEunit.B2)))
            if b1.size:
                c = b1.size
                if w1.size != c * f or w2.size != 2 * f * c or b2.size != 2 * f:
                    raise Lc0Error(f"block {i}: an SE unit of the wrong size")
                se = SEUnit(w1.reshape(c, f), b1, w2.reshape(2 * f, c), b2)
        residual.append(Residual(conv1, conv2, se))
    attention = None
    if policy == "convolution":
        policy1 = _fold(pb.message(w, W.POLICY1), "policy conv1", f, f, kernels=(3,))
        policy_conv = _fold(pb.message(w, W.POLICY), "policy conv2", f, CONV_POLICY_PLANES, kernels=(3,))
        if policy1 is None or policy_conv is None:
            raise Lc0Error("the file says convolutional policy, but its policy convolutions are missing")
        ip_pol = None
    elif policy == "attention":
        policy1 = policy_conv = ip_pol = None
        embedding = _dense(w, W.IP_POL_W, W.IP_POL_B, "attention policy embedding", f)
        # The head's own encoder layers (pol_encoder, pol_headcount); no smolgen on a residual tower
        # (its smolgen_w is an attention body's field).
        heads = pb.int_(w, W.POL_HEADCOUNT)
        encoders = [_encoder_layer(raw, f"attention policy encoder {i}", embedding.b.size, heads, None)
                    for i, raw in enumerate(w.get(W.POL_ENCODER, []))]
        wq = _dense(w, W.IP2_POL_W, W.IP2_POL_B, "attention policy queries", embedding.b.size)
        wk = _dense(w, W.IP3_POL_W, W.IP3_POL_B, "attention policy keys", embedding.b.size, wq.b.size)
        ppo = _layer(pb.message(w, W.IP4_POL_W))
        if ppo.size != 4 * wq.b.size:
            raise Lc0Error(f"attention policy promotion offsets: {ppo.size} weights, not 4 x {wq.b.size}")
        attention = AttentionPolicy(embedding, wq, wk, ppo.reshape(4, wq.b.size).astype(np.float32),
                                    encoders, heads if encoders else 0)
    else:
        policy1 = None
        policy_conv = _fold(pb.message(w, W.POLICY), "policy convolution", f, kernels=(1,))
        if policy_conv is None:
            raise Lc0Error("no policy head")
        ip_pol = _dense(w, W.IP_POL_W, W.IP_POL_B, "policy dense layer", policy_conv.b.size * 64, POLICY_SIZE)
    value_conv = _fold(pb.message(w, W.VALUE), "value convolution", f, kernels=(1,))
    if value_conv is None:
        raise Lc0Error("no value head")
    ip1_val = _dense(w, W.IP1_VAL_W, W.IP1_VAL_B, "value dense layer 1", value_conv.b.size * 64)
    ip2_val = _dense(w, W.IP2_VAL_W, W.IP2_VAL_B, "value dense layer 2", ip1_val.b.size, 3 if wdl else 1)
    mlh_conv = ip1_mov = ip2_mov = None
    if moves_left:
        mlh_conv = _fold(pb.message(w, W.MOVES_LEFT), "moves-left convolution", f, kernels=(1,))
        if mlh_conv is None:
            raise Lc0Error("the file says it has a moves-left head, but its weights are missing")
        ip1_mov = _dense(w, W.IP1_MOV_W, W.IP1_MOV_B, "moves-left dense layer 1", mlh_conv.b.size * 64)
        ip2_mov = _dense(w, W.IP2_MOV_W, W.IP2_MOV_B, "moves-left dense layer 2", ip1_mov.b.size, 1)
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

_FUNCTION_NAMES = {"mish": "Mish", "relu": "ReLU", "none": "none", "tanh": "tanh", "sigmoid": "sigmoid",
                   "selu": "SELU", "swish": "swish", "relu2": "ReLU^2"}


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
    v = _layer(pb.message(f, number))
    if v.size != size:
        raise Lc0Error(f"{what}: {v.size} values, not {size}")
    return v.astype(np.float32)


def _norm(f: dict, g: int, b: int, what: str, size: int) -> LayerNorm:
    return LayerNorm(_vector(f, g, what + " gammas", size), _vector(f, b, what + " betas", size))


def _encoder_layer(raw: bytes, what: str, width: int, heads: int, smolgen_rows: int | None) -> EncoderLayer:
    M, S, E, F = pb.MHA, pb.Smolgen, pb.EncoderLayer, pb.FFN
    e = pb.fields(bytes(raw))
    mha = pb.message(e, E.MHA) or {}
    if any(k in mha for k in (M.RPE_Q, M.RPE_K, M.RPE_V)):
        raise Lc0Error(f"{what}: relative position encodings (RPE), which lc0 v0.32.1 does not run either")
    q = _dense(mha, M.Q_W, M.Q_B, f"{what} attention queries", width)
    d = q.b.size
    if heads < 1 or d % heads:
        raise Lc0Error(f"{what}: {d}-wide queries do not split into {heads} heads")
    k = _dense(mha, M.K_W, M.K_B, f"{what} attention keys", width, d)
    v = _dense(mha, M.V_W, M.V_B, f"{what} attention values", width, d)
    out = _dense(mha, M.DENSE_W, M.DENSE_B, f"{what} attention output", d, width)
    smolgen = None
    s = pb.message(mha, M.SMOLGEN)
    if s is not None:
        compress = _layer(pb.message(s, S.COMPRESS))
        if not compress.size or compress.size % width:
            raise Lc0Error(f"{what} smolgen compress: {compress.size} weights are not C x {width}")
        c = compress.size // width
        dense1 = _dense(s, S.DENSE1_W, S.DENSE1_B, f"{what} smolgen dense 1", 64 * c)
        ln1 = _norm(s, S.LN1_GAMMAS, S.LN1_BETAS, f"{what} smolgen layer norm 1", dense1.b.size)
        dense2 = _dense(s, S.DENSE2_W, S.DENSE2_B, f"{what} smolgen dense 2", dense1.b.size)
        ln2 = _norm(s, S.LN2_GAMMAS, S.LN2_BETAS, f"{what} smolgen layer norm 2", dense2.b.size)
        g = dense2.b.size
        if g % heads:
            raise Lc0Error(f"{what} smolgen dense 2: {g} outputs do not split into {heads} heads")
        if smolgen_rows is None:
            raise Lc0Error(f"{what} has smolgen, but the file has no global smolgen weights (smolgen_w)")
        if smolgen_rows != g // heads:
            raise Lc0Error(f"{what} smolgen: {g // heads} values per head, but smolgen_w takes {smolgen_rows}")
        smolgen = Smolgen(compress.reshape(c, width).astype(np.float32), dense1, ln1, dense2, ln2)
    ln1 = _norm(e, E.LN1_GAMMAS, E.LN1_BETAS, f"{what} layer norm 1", width)
    ffn = pb.message(e, E.FFN) or {}
    ffn1 = _dense(ffn, F.DENSE1_W, F.DENSE1_B, f"{what} FFN dense 1", width)
    ffn2 = _dense(ffn, F.DENSE2_W, F.DENSE2_B, f"{what} FFN dense 2", ffn1.b.size, width)
    ln2 = _norm(e, E.LN2_GAMMAS, E.LN2_BETAS, f"{what} layer norm 2", width)
    return EncoderLayer(q, k, v, out, smolgen, ln1, ffn1, ffn2, ln2)


def _function(value: int, default: str, what: str) -> str:
    if value == 0:
        return default
    if value == 9:
        raise Lc0Error(f"a softmax {what} activation (9), which lc0's CPU backend does not run either")
    if value not in pb.FUNCTIONS:
        raise Lc0Error(f"an unknown {what} activation ({value})")
    return pb.FUNCTIONS[value]


def _read_body(net: dict, fmt: dict, name: str, training: dict, license: str, min_version: str,
               heads: tuple[str | None, str | None]) -> Lc0Net:
    """An attention-body network (formats 6, 7, 134, or an SE format holding encoder layers), with
    lc0's fix-ups of older files (loader.cc) and its multihead reading (network_legacy.cc)."""
    W, NF = pb.Weights, pb.NetworkFormat
    nf = pb.message(pb.message(net, pb.Net.FORMAT) or {}, pb.Format.NETWORK_FORMAT) or {}
    w = pb.message(net, pb.Net.WEIGHTS)
    if w is None:
        raise Lc0Error(f"{name}: an lc0 network file without weights")
    network, smolgen_act, ffn_act = fmt["network"], pb.int_(nf, NF.SMOLGEN_ACTIVATION), pb.int_(nf, NF.FFN_ACTIVATION)
    embedding_format = pb.int_(nf, NF.INPUT_EMBEDDING)
    if network == 4:        # an attention body written with an older proto
        network = 6
        if W.SMOLGEN_W in w:
            smolgen_act, ffn_act = 7, 8     # swish and relu^2, as lc0 overrides them
    if network == 134:
        network = 7
    if network == 6:
        if W.VALUE_HEADS in w and W.POLICY_HEADS in w:
            network, embedding_format = 7, 2
        elif NF.INPUT_EMBEDDING not in nf:
            embedding_format = 1
    try:
        if fmt["activation"] not in pb.ACTIVATIONS:
            raise Lc0Error(f"an unknown default activation ({fmt['activation']})")
        activation = pb.ACTIVATIONS[fmt["activation"]]
        body = _body(w, fmt, network, activation, _function(smolgen_act, activation, "smolgen"),
                     _function(ffn_act, activation, "FFN"), embedding_format == 2, heads)
    except Lc0Error as e:
        raise Lc0Error(f"{name}: {e}") from None
    return Lc0Net(None, _describe_body(fmt, body, training, license), fmt["input"], license, min_version,
                  training, body=body)


def _body(w: dict, fmt: dict, network: int, activation: str, smolgen_activation: str, ffn_activation: str,
          pe_dense: bool, heads: tuple[str | None, str | None]) -> AttentionBody:
    W = pb.Weights
    if w.get(W.RESIDUAL):
        raise Lc0Error(f"an attention body on a residual tower of {len(w[W.RESIDUAL])} blocks (a hybrid network), "
                       "which cyzero does not run")
    if fmt["policy"] != 3:
        raise Lc0Error(f"an attention body with a {pb.POLICIES.get(fmt['policy'], 'unknown')} policy head "
                       f"(format {fmt['policy']}); lc0 runs attention bodies with attention policy only")
    if fmt["value"] not in (1, 2):
        raise Lc0Error(f"a {pb.VALUES.get(fmt['value'], 'unknown')} value head (format {fmt['value']}); "
                       "cyzero runs classical and WDL heads")
    if fmt["moves_left"] not in (0, 1):
        raise Lc0Error(f"an unknown moves-left head ({fmt['moves_left']})")
    e_b = _layer(pb.message(w, W.IP_EMB_B))
    width = e_b.size
    if not width:
        raise Lc0Error("an attention body without an input embedding (ip_emb)")
    preproc = emb_ln = emb_ffn = None
    if pe_dense:
        pre_b = _layer(pb.message(w, W.IP_EMB_PREPROC_B))
        if not pre_b.size or pre_b.size % 64:
            raise Lc0Error(f"PE-dense embedding preprocessing (ip_emb_preproc): {pre_b.size} biases are not 64 x P")
        preproc = _dense(w, W.IP_EMB_PREPROC_W, W.IP_EMB_PREPROC_B,
                         "PE-dense embedding preprocessing (ip_emb_preproc)", 64 * 12)
        channels = pre_b.size // 64
    else:
        channels = 64
    ip_emb = _dense(w, W.IP_EMB_W, W.IP_EMB_B, "input embedding (ip_emb)", INPUT_PLANES + channels)
    if pe_dense:
        emb_ln = _norm(w, W.IP_EMB_LN_GAMMAS, W.IP_EMB_LN_BETAS, "input embedding layer norm", width)
    mult = _layer(pb.message(w, W.IP_MULT_GATE))
    add = _layer(pb.message(w, W.IP_ADD_GATE))
    if mult.size and add.size:
        if mult.size != 64 * width or add.size != 64 * width:
            raise Lc0Error(f"input gates (ip_mult_gate, ip_add_gate): {mult.size} and {add.size} values, "
                           f"not {width} x 64")
        mult, add = mult.reshape(width, 64), add.reshape(width, 64)
    else:
        mult = add = None
    if pe_dense:
        ffn = pb.message(w, W.IP_EMB_FFN) or {}
        F = pb.FFN
        ffn1 = _dense(ffn, F.DENSE1_W, F.DENSE1_B, "input embedding FFN dense 1 (ip_emb_ffn)", width)
        ffn2 = _dense(ffn, F.DENSE2_W, F.DENSE2_B, "input embedding FFN dense 2 (ip_emb_ffn)", ffn1.b.size, width)
        emb_ffn = (ffn1, ffn2, _norm(w, W.IP_EMB_FFN_LN_GAMMAS, W.IP_EMB_FFN_LN_BETAS, "input embedding FFN layer norm",
                                     width))
    smolgen_w = None
    rows = None
    if W.SMOLGEN_W in w:
        sw = _layer(pb.message(w, W.SMOLGEN_W))
        if not sw.size or sw.size % 4096:
            raise Lc0Error(f"global smolgen weights (smolgen_w): {sw.size} values are not 4096 x G")
        rows = sw.size // 4096
        smolgen_w = sw.reshape(4096, rows).astype(np.float32)
    head_count = pb.int_(w, W.HEADCOUNT)
    encoders = [_encoder_layer(raw, f"encoder {i}", width, head_count, rows)
                for i, raw in enumerate(w.get(W.ENCODER, []))]
    if not encoders:
        raise Lc0Error("an attention body without encoder layers")

    def policy_head(f: dict, numbers: tuple, shared: tuple[np.ndarray, np.ndarray], what: str) -> AttentionPolicy:
        e_w, e_bias = _layer(pb.message(f, numbers[0])), _layer(pb.message(f, numbers[1]))
        if not e_w.size:
            e_w, e_bias = shared
        if not e_bias.size or e_w.size != e_bias.size * width:
            raise Lc0Error(f"{what} embedding: {e_w.size} weights and {e_bias.size} biases do not make a "
                           f"layer from {width} inputs")
        embedding = Dense(e_w.reshape(e_bias.size, width).astype(np.float32), e_bias.astype(np.float32))
        pe = embedding.b.size
        pol_heads = pb.int_(f, numbers[8])
        pol_encoders = [_encoder_layer(raw, f"{what} encoder {i}", pe, pol_heads, rows)
                        for i, raw in enumerate(f.get(numbers[7], []))]
        wq = _dense(f, numbers[2], numbers[3], f"{what} queries", pe)
        wk = _dense(f, numbers[4], numbers[5], f"{what} keys", pe, wq.b.size)
        ppo = _layer(pb.message(f, numbers[6]))
        if ppo.size != 4 * wq.b.size:
            raise Lc0Error(f"{what} promotion offsets: {ppo.size} weights, not 4 x {wq.b.size}")
        return AttentionPolicy(embedding, wq, wk, ppo.reshape(4, wq.b.size).astype(np.float32),
                               pol_encoders, pol_heads)

    def value_head(f: dict, numbers: tuple, what: str) -> ValueHead:
        embedding = _dense(f, numbers[0], numbers[1], f"{what} embedding", width)
        ip1 = _dense(f, numbers[2], numbers[3], f"{what} dense 1", embedding.b.size * 64)
        ip2 = _dense(f, numbers[4], numbers[5], f"{what} dense 2", ip1.b.size, 3 if fmt["value"] == 2 else 1)
        return ValueHead(embedding, ip1, ip2)

    P, V = pb.PolicyHead, pb.ValueHead
    # An attention policy head's fields, in the order policy_head reads them: as the Weights message
    # keeps its one head, and as a PolicyHead message does.
    top_policy = (W.IP_POL_W, W.IP_POL_B, W.IP2_POL_W, W.IP2_POL_B, W.IP3_POL_W, W.IP3_POL_B, W.IP4_POL_W,
                  W.POL_ENCODER, W.POL_HEADCOUNT)
    head_policy = (P.IP_POL_W, P.IP_POL_B, P.IP2_POL_W, P.IP2_POL_B, P.IP3_POL_W, P.IP3_POL_B, P.IP4_POL_W,
                   P.POL_ENCODER, P.POL_HEADCOUNT)
    ph = pb.message(w, W.POLICY_HEADS)
    PH = pb.PolicyHeads
    shared = (_layer(pb.message(ph, PH.IP_POL_W)) if ph and PH.IP_POL_W in ph else _layer(pb.message(w, W.IP_POL_W)),
              _layer(pb.message(ph, PH.IP_POL_B)) if ph and PH.IP_POL_B in ph else _layer(pb.message(w, W.IP_POL_B)))
    policy_fields: dict[str, tuple] = {}
    if ph is not None:
        for number, head in pb.PolicyHeads.HEADS.items():
            if number in ph or head == "vanilla":
                policy_fields[head] = (pb.message(ph, number) or {}, head_policy)
    elif any(k in w for k in (W.POLICY, W.POLICY1, W.IP_POL_W)):
        policy_fields["vanilla"] = (w, top_policy)
    else:
        raise Lc0Error("no policy head weights")
    vh = pb.message(w, W.VALUE_HEADS)
    value_fields: dict[str, tuple] = {}
    if vh is not None:
        for number, head in pb.ValueHeads.HEADS.items():
            if number in vh or head == "winner":
                value_fields[head] = (pb.message(vh, number) or {}, (V.IP_VAL_W, V.IP_VAL_B, V.IP1_VAL_W,
                                                                    V.IP1_VAL_B, V.IP2_VAL_W, V.IP2_VAL_B))
    elif W.VALUE in w or W.IP_VAL_W in w:
        value_fields["winner"] = (w, (W.IP_VAL_W, W.IP_VAL_B, W.IP1_VAL_W, W.IP1_VAL_B, W.IP2_VAL_W, W.IP2_VAL_B))
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
        ip_mov = _dense(w, W.IP_MOV_W, W.IP_MOV_B, "moves-left embedding (ip_mov)", width)
        ip1_mov = _dense(w, W.IP1_MOV_W, W.IP1_MOV_B, "moves-left dense 1", ip_mov.b.size * 64)
        moves_left = (ip_mov, ip1_mov, _dense(w, W.IP2_MOV_W, W.IP2_MOV_B, "moves-left dense 2", ip1_mov.b.size, 1))
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
            f"{pb.INPUT_FORMATS.get(fmt['input'], fmt['input'])} input, {pol}, {value}, "
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
                f"{pb.INPUT_FORMATS.get(fmt['input'], fmt['input'])} input, {weights.policy} policy"
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
    if data[:1] != b"\x0d" or data[1:5] != struct.pack("<I", pb.MAGIC):
        looks_onnx = b"onnx" in data[:64].lower() or b"/input/planes" in data[:4096]
        raise Lc0Error(f"{name}: not an lc0 network file (no lc0 weights header)"
                       + ("; it looks like an ONNX model: name it .onnx" if looks_onnx else ""))
    try:
        return _read(pb.fields(data), name, (value_head, policy_head))
    except pb.ProtoError:
        raise Lc0Error(f"{name}: a corrupt or truncated lc0 network file") from None


def _read(net: dict, name: str, heads: tuple[str | None, str | None] = (None, None)) -> Lc0Net:
    N, T, NF = pb.Net, pb.TrainingParams, pb.NetworkFormat
    V = pb.EngineVersion
    version = pb.message(net, N.MIN_VERSION) or {}
    min_version = ".".join(str(pb.int_(version, k)) for k in (V.MAJOR, V.MINOR, V.PATCH)) if version else ""
    license = pb.text(net, N.LICENSE)
    t = pb.message(net, N.TRAINING_PARAMS) or {}
    training: dict = {}
    if T.TRAINING_STEPS in t:
        training["training_steps"] = pb.int_(t, T.TRAINING_STEPS)
    for key, number in (("learning_rate", T.LEARNING_RATE), ("mse_loss", T.MSE_LOSS), ("policy_loss", T.POLICY_LOSS),
                        ("accuracy", T.ACCURACY)):
        if number in t:
            training[key] = pb.float_(t, number)
    if T.LC0_PARAMS in t:
        training["lc0_params"] = pb.text(t, T.LC0_PARAMS)
    format_ = pb.message(net, N.FORMAT) or {}
    nf = pb.message(format_, pb.Format.NETWORK_FORMAT)
    if nf is None:   # older files: lc0 reads them as classical
        fmt = {"input": 1, "network": 1, "policy": 1, "value": 1, "moves_left": 0, "activation": 0}
    else:
        fmt = {"input": pb.int_(nf, NF.INPUT), "network": pb.int_(nf, NF.NETWORK), "policy": pb.int_(nf, NF.POLICY),
               "value": pb.int_(nf, NF.VALUE), "moves_left": pb.int_(nf, NF.MOVES_LEFT),
               "activation": pb.int_(nf, NF.DEFAULT_ACTIVATION)}
        if fmt["network"] in (1, 2):   # before head formats: classical heads
            fmt["policy"], fmt["value"] = 1, 1
    weights_fields = pb.message(net, N.WEIGHTS)
    network = fmt["network"]
    if network == 5:
        return _onnx_inside(net, fmt, name, training, license, min_version)
    # An attention body: formats 6, 7, 134, or encoder layers behind the SE format (lc0 reads such
    # a file, written with an older proto, as format 6).
    body = network in (6, 7, 134) or (network == 4 and bool(weights_fields and weights_fields.get(pb.Weights.ENCODER)))
    if not body and weights_fields and pb.Weights.BODY_ONLY & set(weights_fields):
        raise Lc0Error(f"{name}: an lc0 network that says it is a {pb.NETWORKS.get(network, 'residual')} "
                       f"tower (format {network}) but holds attention-body (transformer) weights")
    if network not in (1, 2, 3, 4) and not body:
        raise Lc0Error(f"{name}: an lc0 network of unknown structure ({network}); cyzero runs the "
                       "classical residual family and attention bodies only")
    if fmt["input"] not in pb.INPUT_FORMATS:
        raise Lc0Error(f"{name}: an lc0 network for an unknown input format ({fmt['input']}); cyzero's "
                       f"encoder writes lc0's formats {', '.join(map(str, pb.INPUT_FORMATS))}")
    if body:
        return _read_body(net, fmt, name, training, license, min_version, heads)
    if fmt["policy"] not in (1, 2, 3):
        raise Lc0Error(f"{name}: an lc0 network with an unknown policy head (format {fmt['policy']}); "
                       "cyzero runs classical, convolutional and attention heads")
    if fmt["value"] not in (1, 2):
        raise Lc0Error(f"{name}: an lc0 network with a {pb.VALUES.get(fmt['value'], 'unknown')} value head "
                       f"(format {fmt['value']}); cyzero runs classical and WDL heads")
    if fmt["moves_left"] not in (0, 1):
        raise Lc0Error(f"{name}: an lc0 network with an unknown moves-left head ({fmt['moves_left']})")
    if fmt["activation"] not in pb.ACTIVATIONS:
        raise Lc0Error(f"{name}: an lc0 network with an unknown activation ({fmt['activation']})")
    if weights_fields is None:
        raise Lc0Error(f"{name}: an lc0 network file without weights")
    try:
        weights = _weights(weights_fields, pb.POLICIES[fmt["policy"]], fmt["value"] == 2,
                           fmt["moves_left"] == 1, pb.ACTIVATIONS[fmt["activation"]])
    except Lc0Error as e:
        raise Lc0Error(f"{name}: {e}") from None
    return Lc0Net(weights, _describe(fmt, weights, training, license), fmt["input"], license,
                  min_version, training)


def _onnx_inside(net: dict, fmt: dict, name: str, training: dict, license: str,
                 min_version: str) -> Lc0Net:
    """A NETWORK_ONNX file: lc0's own graph, used as it is when it speaks the contract."""
    OM = pb.OnnxModel
    model = pb.message(net, pb.Net.ONNX_MODEL)
    if model is None or not pb.last(model, OM.MODEL):
        raise Lc0Error(f"{name}: an lc0 file that says it holds an ONNX model but has none")
    names = {"input": pb.text(model, OM.INPUT_PLANES), "wdl": pb.text(model, OM.OUTPUT_WDL),
             "policy": pb.text(model, OM.OUTPUT_POLICY)}
    if names != {"input": INPUT_NAME, "wdl": WDL_NAME, "policy": POLICY_NAME}:
        raise Lc0Error(f"{name}: an lc0 file holding an ONNX model with input {names['input']!r}, "
                       f"policy {names['policy']!r} and WDL {names['wdl'] or '(none)'!r}; cyzero needs "
                       f"{INPUT_NAME!r}, {POLICY_NAME!r} and {WDL_NAME!r}")
    return Lc0Net(None, _describe(fmt, None, training, license), fmt["input"], license, min_version,
                  training, onnx_model=bytes(pb.last(model, OM.MODEL)))


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
