"""An independent writer and NumPy reference for lc0 network weight files (tests only).

Why this exists: ``engine/lc0.py`` reads lc0's ``.pb`` / ``.pb.gz`` weight files
(protobuf ``pblczero.Net``, lc0's ``proto/net.proto``) and ``engine/lc0_onnx.py``
turns them into an ONNX graph.  Their tests need lc0 files of many shapes (SE or not, convolutional
or classical policy, WDL or classical value, moves-left, mish, every layer
encoding, old files without a format or without BN gammas/betas, broken files)
and an answer to compare the converted graph against.  This module provides
both, written from the file format and lc0's network semantics alone: it
imports nothing from ``engine.lc0`` and keeps net.proto's field numbers and
the layer encodings of its own, so a misreading of lc0's format in the reader
cannot hide behind the same misreading here.  Only protobuf's wire rules
(varints, keys, length-delimited fields) come from the project's one codec,
``engine.lc0_proto``, whose bytes ``tests/test_lc0_files.py`` checks by hand.

    >>> spec = Lc0Spec(blocks=2, filters=16, se=True, moves_left=True)
    >>> data, weights = make_lc0(spec)            # serialized Net, decoded arrays
    >>> write_lc0(path, spec)                     # .pb.gz (atomically)
    >>> policy, wdl, mlh = reference_forward(weights, spec, planes)

``weights`` maps names to the float32 arrays exactly as the file holds them
after quantization (a LINEAR16 layer is given dequantized), so the reference
computes with the very numbers a correct reader finds.  Names follow the
protobuf fields: ``input.weights``, ``residual.0.conv1.bn_means``,
``residual.1.se.w2``, ``policy1.biases``, ``ip_pol_w``, ``value.bn_stddivs``,
``ip2_val_b``, ``moves_left.weights``, ``ip1_mov_w``, ``ip_emb_w`` ...; conv
weights are shaped ``[out, in, k, k]``, dense weights ``[out, in]``.  A key is
present exactly when the file has that layer.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import numpy as np
import pytest

from engine.encoding import POLICY_INDEX
from engine.lc0_proto import fixed32 as f_fixed32, float32 as f_float, length_delimited as f_bytes, string as f_string, \
    uint as f_varint, varint, walk
from engine.network import POLICY_SIZE

MAGIC = 0x1C0
BN_EPSILON = 1e-5

# Layer.encoding values
ENCODINGS = {"linear16": 1, "float16": 2, "bfloat16": 3, "float32": 4}

# NetworkFormat values used here
NETWORK_CLASSICAL = 1
NETWORK_SE = 2
NETWORK_CLASSICAL_WITH_HEADFORMAT = 3
NETWORK_SE_WITH_HEADFORMAT = 4
NETWORK_ONNX = 5
NETWORK_ATTENTIONBODY_WITH_HEADFORMAT = 6
NETWORK_ATTENTIONBODY_WITH_MULTIHEADFORMAT = 7
# net.proto's ActivationFunction (the attention body's smolgen and FFN activations)
FUNCTIONS = {"default": 0, "mish": 1, "relu": 2, "none": 3, "tanh": 4, "sigmoid": 5, "selu": 6, "swish": 7,
             "relu2": 8}
INPUT_EMBEDDINGS = {"pe_map": 1, "pe_dense": 2}
VALUE_HEAD_FIELDS = {"winner": 1, "q": 2, "st": 3}
POLICY_HEAD_FIELDS = {"vanilla": 3, "optimistic": 4, "soft": 5, "opponent": 6}
POLICY_FORMATS = {"classical": 1, "convolution": 2, "attention": 3}
VALUE_FORMATS = {"classical": 1, "wdl": 2}
ACTIVATIONS = {"relu": 0, "mish": 1}

# Weights are drawn N(0, 0.7/sqrt(fan_in)) for convs, N(0, 0.5/sqrt(in)) for dense layers, N(0, 0.1) for
# biases, BN means and betas, U(0.5, 1.5) for BN variances and gammas: outputs stay well away from saturation.
# Head sizes (lc0's usual ones are 32 / 128 for the value head, 8 / 128 for moves-left;
# smaller here so that the nets stay tiny).
CLASSICAL_POLICY_CHANNELS = 8
VALUE_CHANNELS = 8
VALUE_HIDDEN = 32
MLH_CHANNELS = 4
MLH_HIDDEN = 16
CONV_POLICY_PLANES = 80


# --------------------------------------------------------------------------- policy map

_QUEEN_DIRECTIONS = ((0, 1), (1, 1), (1, 0), (1, -1), (0, -1), (-1, -1), (-1, 0), (-1, 1))  # (dfile, drank)
_KNIGHT_JUMPS = ((1, 2), (2, 1), (2, -1), (1, -2), (-1, -2), (-2, -1), (-2, 1), (-1, 2))
_PROMOTIONS = "rbq"


def _policy_map() -> np.ndarray:
    """For each of the 1858 policy entries, its index in the flattened [80, 8, 8] conv policy output."""
    table = np.empty(POLICY_SIZE, dtype=np.int64)
    for i, uci in enumerate(POLICY_INDEX):
        from_file, from_rank = ord(uci[0]) - ord("a"), int(uci[1]) - 1
        to_file, to_rank = ord(uci[2]) - ord("a"), int(uci[3]) - 1
        df, dr = to_file - from_file, to_rank - from_rank
        if len(uci) == 5:
            plane = 64 + 3 * (df + 1) + _PROMOTIONS.index(uci[4])
        elif (df, dr) in _KNIGHT_JUMPS:
            plane = 56 + _KNIGHT_JUMPS.index((df, dr))
        else:
            distance = max(abs(df), abs(dr))
            assert distance > 0 and (df == 0 or dr == 0 or abs(df) == abs(dr)), uci
            plane = 7 * _QUEEN_DIRECTIONS.index((int(np.sign(df)), int(np.sign(dr)))) + distance - 1
        table[i] = plane * 64 + from_rank * 8 + from_file
    assert len(set(table.tolist())) == POLICY_SIZE
    return table


POLICY_MAP = _policy_map()


# --------------------------------------------------------------------------- layers

def encode_layer(values: np.ndarray, encoding: str) -> Tuple[bytes, np.ndarray]:
    """A ``Layer`` message holding ``values`` (flattened, row-major) and the float32 values it decodes to."""
    flat = np.asarray(values, dtype=np.float32).ravel()
    if encoding == "linear16":
        lo, hi = np.float32(flat.min()), np.float32(flat.max())
        span = float(hi) - float(lo)
        if span > 0:
            q = np.clip(np.rint((flat.astype(np.float64) - float(lo)) / span * 65535.0), 0, 65535)
        else:
            q = np.zeros(flat.shape)
        q = q.astype("<u2")
        t = q.astype(np.float64) / 65535.0
        decoded = (float(lo) * (1.0 - t) + float(hi) * t).astype(np.float32)
        # encoding absent: LINEAR16 is the default
        message = f_float(1, float(lo)) + f_float(2, float(hi)) + f_bytes(3, q.tobytes())
    elif encoding == "float16":
        half = flat.astype("<f2")
        decoded = half.astype(np.float32)
        message = f_bytes(3, half.tobytes()) + f_varint(4, ENCODINGS[encoding])
    elif encoding == "bfloat16":
        bits = flat.astype("<f4").view("<u4").astype(np.uint64)
        rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype("<u2")  # round to nearest even
        decoded = (rounded.astype("<u4") << 16).view("<f4").astype(np.float32)
        message = f_bytes(3, rounded.tobytes()) + f_varint(4, ENCODINGS[encoding])
    elif encoding == "float32":
        decoded = flat.astype("<f4")
        message = f_bytes(3, decoded.tobytes()) + f_varint(4, ENCODINGS[encoding])
    else:
        raise ValueError(f"unknown layer encoding {encoding!r}")
    return message, decoded.reshape(np.shape(values)).astype(np.float32)


# --------------------------------------------------------------------------- the spec

@dataclass
class Lc0Spec:
    """What kind of lc0 net to write (and what the reference computes).

    ``network=None`` picks NETWORK_SE_WITH_HEADFORMAT (4) for SE nets and
    NETWORK_CLASSICAL_WITH_HEADFORMAT (3) otherwise, or
    NETWORK_ATTENTIONBODY_WITH_HEADFORMAT (6) when ``attention`` is set.
    ``with_format=False`` writes no ``network_format`` at all, which lc0 reads
    as a classical net (classical policy, classical value, no SE, no
    moves-left, ReLU); the other fields must say so.  ``attention`` adds the
    attention-body fields (25 ip_emb_w, 26 ip_emb_b, 27 encoder, 28
    headcount) next to the residual tower: such a file is meant to be refused.

    ``attention_body`` writes a real attention-body (transformer) network instead, as lc0 v0.32.1
    reads one (no residual tower; ``filters`` is the embedding width E, ``blocks`` the number of
    encoder layers, ``heads`` their head count, ``dff`` their FFN width): the input embedding
    (``embedding`` "pe_dense": ip_emb_preproc of the first 12 planes into ``pe_channels`` per
    square, ip_emb, its layer norm, the input gates and the embedding FFN; "pe_map": lc0's 64
    positional channels per square, ip_emb, the gates), smolgen (``smolgen``), the attention policy
    with ``policy_encoders`` encoder layers of its own, the value and moves-left heads from the
    body.  ``multihead`` writes NETWORK_ATTENTIONBODY_WITH_MULTIHEADFORMAT (7): ``value_heads``
    (winner, q, st) and ``policy_heads`` (vanilla, optimistic) in ValueHeads / PolicyHeads, the
    policy embedding shared.  ``ffn_activation`` and ``smolgen_activation`` are net.proto's
    ActivationFunction names ("default": the default activation).
    """

    blocks: int = 2
    filters: int = 16
    se: bool = False
    se_channels: int = 8
    policy: str = "convolution"     # or "classical"
    value: str = "wdl"              # or "classical"
    moves_left: bool = False
    activation: str = "relu"        # or "mish"
    input_format: int = 1
    network: Optional[int] = None
    encoding: str = "linear16"      # "float16", "bfloat16", "float32"
    with_format: bool = True
    old_bn: bool = False            # omit bn_gammas / bn_betas (as old nets do)
    attention: bool = False
    policy_embedding: int = 16      # attention policy: the per-square embedding's width
    policy_d_model: int = 8         # attention policy: the width of its queries and keys
    seed: int = 0
    attention_body: bool = False
    heads: int = 4
    dff: int = 32
    embedding: str = "pe_dense"     # or "pe_map"
    pe_channels: int = 1            # PE dense: positional channels per square (ip_emb_preproc: 768 x 64P)
    gating: bool = True             # ip_mult_gate, ip_add_gate
    smolgen: bool = True
    smolgen_channels: int = 2       # compress: per-square channels
    smolgen_hidden: int = 16        # dense1
    smolgen_gen: int = 16           # dense2 (heads x per-head values)
    value_channels: int = 2         # the body's value heads: embedding (ip_val_w) per square,
    value_hidden: int = 16          # and ip1_val's width
    ffn_activation: str = "default"
    smolgen_activation: str = "default"
    policy_encoders: int = 0        # the attention policy's own encoder layers (on either kind of net)
    policy_encoder_heads: int = 2
    multihead: bool = False
    value_heads: Tuple[str, ...] = ("winner",)
    policy_heads: Tuple[str, ...] = ("vanilla",)
    write_input_embedding: bool = True   # format 6 without it: lc0 reads PE map

    def network_value(self) -> int:
        if self.network is not None:
            return self.network
        if self.attention_body:
            return NETWORK_ATTENTIONBODY_WITH_MULTIHEADFORMAT if self.multihead \
                else NETWORK_ATTENTIONBODY_WITH_HEADFORMAT
        if self.attention:
            return NETWORK_ATTENTIONBODY_WITH_HEADFORMAT
        return NETWORK_SE_WITH_HEADFORMAT if self.se else NETWORK_CLASSICAL_WITH_HEADFORMAT

    def check(self) -> None:
        if self.policy not in POLICY_FORMATS:
            raise ValueError(f"policy must be one of {sorted(POLICY_FORMATS)}, not {self.policy!r}")
        if self.value not in VALUE_FORMATS:
            raise ValueError(f"value must be one of {sorted(VALUE_FORMATS)}, not {self.value!r}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, not {self.activation!r}")
        if self.encoding not in ENCODINGS:
            raise ValueError(f"encoding must be one of {sorted(ENCODINGS)}, not {self.encoding!r}")
        if self.attention_body:
            if self.policy != "attention":
                raise ValueError("an attention body plays the attention policy only: set policy='attention'")
            if self.embedding not in INPUT_EMBEDDINGS:
                raise ValueError(f"embedding must be one of {sorted(INPUT_EMBEDDINGS)}, not {self.embedding!r}")
            for act in (self.ffn_activation, self.smolgen_activation):
                if act not in FUNCTIONS:
                    raise ValueError(f"activations must be one of {sorted(FUNCTIONS)}, not {act!r}")
            if self.blocks < 1 or self.filters % self.heads or self.smolgen_gen % self.heads:
                raise ValueError("blocks >= 1, and filters and smolgen_gen divisible by heads please")
            if not self.multihead and (self.value_heads != ("winner",) or self.policy_heads != ("vanilla",)):
                raise ValueError("only a multihead net (multihead=True) has other heads than winner and vanilla")
            return
        if self.blocks < 0 or self.filters < 1 or (self.se and self.se_channels < 1):
            raise ValueError("blocks >= 0, filters >= 1 and se_channels >= 1 please")
        classical_only = (not self.with_format) or self.network_value() in (NETWORK_CLASSICAL, NETWORK_SE)
        if classical_only:
            why = "with_format=False" if not self.with_format else f"network={self.network_value()}"
            if (self.policy, self.value, self.moves_left) != ("classical", "classical", False):
                raise ValueError(f"{why} means classical policy and value heads and no moves-left head in lc0; "
                                 "set policy='classical', value='classical', moves_left=False")
            if self.activation != "relu" and not self.with_format:
                raise ValueError("with_format=False means ReLU; set activation='relu'")
            if not self.with_format and self.se:
                raise ValueError("with_format=False means no SE; set se=False")
            if self.with_format and self.se != (self.network_value() == NETWORK_SE):
                raise ValueError(f"network={self.network_value()} disagrees with se={self.se}")


# --------------------------------------------------------------------------- random weights and the file

#: Where the Weights message keeps its (one) attention policy head's fields, in _Writer.policy_head's order.
TOP_POLICY_FIELDS = (4, 5, 17, 18, 19, 20, 22, 21, 24)


class _Writer:
    """Draws the random weights of one net, encodes each layer and keeps its decoded values."""

    def __init__(self, spec: Lc0Spec):
        self.spec = spec
        self.rng = np.random.default_rng(spec.seed)
        self.weights: Dict[str, np.ndarray] = {}

    def layer(self, name: str, values: np.ndarray) -> bytes:
        message, decoded = encode_layer(values, self.spec.encoding)
        self.weights[name] = decoded
        return message

    def normal(self, shape, scale: float) -> np.ndarray:
        return (self.rng.standard_normal(shape) * scale).astype(np.float32)

    def conv_block(self, name: str, out_ch: int, in_ch: int, k: int, *, bn: bool, bias: bool) -> bytes:
        """A ConvBlock: weights, then (bias) and (BN means, variances, gammas, betas)."""
        fan_in = in_ch * k * k
        msg = f_bytes(1, self.layer(f"{name}.weights", self.normal((out_ch, in_ch, k, k), 0.7 / np.sqrt(fan_in))))
        if bias:
            msg += f_bytes(2, self.layer(f"{name}.biases", self.normal(out_ch, 0.1)))
        if bn:
            msg += f_bytes(3, self.layer(f"{name}.bn_means", self.normal(out_ch, 0.1)))
            variances = self.rng.uniform(0.5, 1.5, out_ch).astype(np.float32)
            msg += f_bytes(4, self.layer(f"{name}.bn_stddivs", variances))
            if not self.spec.old_bn:
                gammas = self.rng.uniform(0.5, 1.5, out_ch).astype(np.float32)
                msg += f_bytes(5, self.layer(f"{name}.bn_gammas", gammas))
                msg += f_bytes(6, self.layer(f"{name}.bn_betas", self.normal(out_ch, 0.1)))
        return msg

    def dense(self, wfield: int, bfield: int, name_w: str, name_b: str, out_n: int, in_n: int,
              bias_mean: float = 0.0, gain: float = 0.5) -> bytes:
        return (f_bytes(wfield, self.layer(name_w, self.normal((out_n, in_n), gain / np.sqrt(in_n))))
                + f_bytes(bfield, self.layer(name_b, self.normal(out_n, 0.1) + np.float32(bias_mean))))

    def bn_bias(self) -> bool:
        # old nets keep a conv bias next to BN; newer ones usually have none (betas instead)
        return self.spec.old_bn

    def norm_layers(self, gfield: int, bfield: int, name: str, n: int) -> bytes:
        """A layer norm's gammas (around 1) and betas (around 0)."""
        return (f_bytes(gfield, self.layer(f"{name}_gammas", 1.0 + self.normal(n, 0.1)))
                + f_bytes(bfield, self.layer(f"{name}_betas", self.normal(n, 0.1))))

    def encoder_layer(self, name: str, width: int, heads: int, smolgen: bool) -> bytes:
        """An EncoderLayer: MHA (q, k, v, dense, smolgen), ln1, FFN, ln2; the names are its fields'."""
        s = self.spec
        d = width
        mha = b""
        for i, part in enumerate("qkv"):   # q and k a little sharper, so that attention is not uniform
            scale = (1.2 if part != "v" else 0.5) / np.sqrt(width)
            mha += (f_bytes(1 + 2 * i, self.layer(f"{name}.mha.{part}_w", self.normal((d, width), scale)))
                    + f_bytes(2 + 2 * i, self.layer(f"{name}.mha.{part}_b", self.normal(d, 0.1))))
        mha += self.dense(7, 8, f"{name}.mha.dense_w", f"{name}.mha.dense_b", width, d)
        if smolgen:
            c, hidden, gen = s.smolgen_channels, s.smolgen_hidden, s.smolgen_gen
            sg = f_bytes(1, self.layer(f"{name}.mha.smolgen.compress", self.normal((c, width), 1.0 / np.sqrt(width))))
            sg += self.dense(2, 3, f"{name}.mha.smolgen.dense1_w", f"{name}.mha.smolgen.dense1_b", hidden, 64 * c)
            sg += self.norm_layers(4, 5, f"{name}.mha.smolgen.ln1", hidden)
            sg += self.dense(6, 7, f"{name}.mha.smolgen.dense2_w", f"{name}.mha.smolgen.dense2_b", gen, hidden)
            sg += self.norm_layers(8, 9, f"{name}.mha.smolgen.ln2", gen)
            mha += f_bytes(9, sg)
        msg = f_bytes(1, mha) + self.norm_layers(2, 3, f"{name}.ln1", width)
        ffn = (self.dense(1, 2, f"{name}.ffn.dense1_w", f"{name}.ffn.dense1_b", s.dff, width)
               + self.dense(3, 4, f"{name}.ffn.dense2_w", f"{name}.ffn.dense2_b", width, s.dff))
        return msg + f_bytes(4, ffn) + self.norm_layers(5, 6, f"{name}.ln2", width)

    def policy_head(self, prefix: str, fields: Tuple[int, ...], with_embedding: bool,
                    gains: Tuple[float, float, float] = (1.5, 2.0, 1.0)) -> bytes:
        """An attention policy head: (embedding), wq, wk, ppo, (policy encoder layers, their heads);
        ``fields``: ip_pol_w, ip_pol_b, ip2_pol_w, ip2_pol_b, ip3_pol_w, ip3_pol_b, ip4_pol_w,
        pol_encoder, pol_headcount. ``gains``: the embedding's, the queries' and keys', the
        promotion offsets' (the default: sharper than the dense default, so that the policy is not
        uniform, nor one-hot)."""
        s = self.spec
        E, D = s.policy_embedding, s.policy_d_model
        msg = self.dense(fields[0], fields[1], prefix + "ip_pol_w", prefix + "ip_pol_b", E, s.filters,
                         gain=gains[0]) if with_embedding else b""
        for i in range(s.policy_encoders):
            msg += f_bytes(fields[7], self.encoder_layer(f"{prefix}pol_encoder.{i}", E, s.policy_encoder_heads, False))
        if s.policy_encoders:
            msg += f_varint(fields[8], s.policy_encoder_heads)
        msg += self.dense(fields[2], fields[3], prefix + "ip2_pol_w", prefix + "ip2_pol_b", D, E, gain=gains[1])
        msg += self.dense(fields[4], fields[5], prefix + "ip3_pol_w", prefix + "ip3_pol_b", D, E, gain=gains[1])
        return msg + f_bytes(fields[6], self.layer(prefix + "ip4_pol_w", self.normal((4, D), gains[2] / np.sqrt(D))))

    def value_head(self, prefix: str, fields: Tuple[int, ...]) -> bytes:
        """ip_val_w/b (per square), ip1_val_w/b, ip2_val_w/b at ``fields``."""
        s = self.spec
        return (self.dense(fields[0], fields[1], prefix + "ip_val_w", prefix + "ip_val_b", s.value_channels,
                           s.filters, gain=1.0)
                + self.dense(fields[2], fields[3], prefix + "ip1_val_w", prefix + "ip1_val_b", s.value_hidden,
                             s.value_channels * 64, gain=1.5)
                + self.dense(fields[4], fields[5], prefix + "ip2_val_w", prefix + "ip2_val_b",
                             3 if s.value == "wdl" else 1, s.value_hidden, gain=2.0))

    def body_message(self) -> bytes:
        """An attention-body network's Weights (see Lc0Spec)."""
        s = self.spec
        E = s.filters
        msg = b""
        if s.embedding == "pe_dense":
            P = s.pe_channels
            msg += self.dense(37, 38, "ip_emb_preproc_w", "ip_emb_preproc_b", 64 * P, 64 * 12)
            msg += self.dense(25, 26, "ip_emb_w", "ip_emb_b", E, 112 + P)
            msg += self.norm_layers(39, 40, "ip_emb_ln", E)
        else:
            msg += self.dense(25, 26, "ip_emb_w", "ip_emb_b", E, 112 + 64)
        if s.gating:
            msg += f_bytes(33, self.layer("ip_mult_gate", 1.0 + self.normal((E, 64), 0.1)))
            msg += f_bytes(34, self.layer("ip_add_gate", self.normal((E, 64), 0.1)))
        if s.embedding == "pe_dense":
            ffn = (self.dense(1, 2, "ip_emb_ffn.dense1_w", "ip_emb_ffn.dense1_b", s.dff, E)
                   + self.dense(3, 4, "ip_emb_ffn.dense2_w", "ip_emb_ffn.dense2_b", E, s.dff))
            msg += f_bytes(41, ffn) + self.norm_layers(42, 43, "ip_emb_ffn_ln", E)
        for i in range(s.blocks):
            msg += f_bytes(27, self.encoder_layer(f"encoder.{i}", E, s.heads, s.smolgen))
        msg += f_varint(28, s.heads)
        if s.smolgen:
            per_head = s.smolgen_gen // s.heads
            msg += f_bytes(35, self.layer("smolgen_w", self.normal((4096, per_head), 0.5 / np.sqrt(per_head))))
        if s.multihead:
            heads = self.dense(1, 2, "policy_heads.ip_pol_w", "policy_heads.ip_pol_b", s.policy_embedding, E, gain=1.5)
            for head in s.policy_heads:
                heads += f_bytes(POLICY_HEAD_FIELDS[head],
                                 self.policy_head(f"policy_heads.{head}.", (1, 2, 3, 4, 5, 6, 7, 8, 9), False))
            msg += f_bytes(45, heads)
            heads = b""
            for head in s.value_heads:
                heads += f_bytes(VALUE_HEAD_FIELDS[head], self.value_head(f"value_heads.{head}.", (1, 2, 3, 4, 5, 6)))
            msg += f_bytes(44, heads)
        else:
            msg += self.policy_head("", TOP_POLICY_FIELDS, True)
            msg += self.value_head("", (29, 30, 7, 8, 9, 10))
        if s.moves_left:
            msg += self.dense(31, 32, "ip_mov_w", "ip_mov_b", MLH_CHANNELS, E)
            msg += self.dense(13, 14, "ip1_mov_w", "ip1_mov_b", MLH_HIDDEN, MLH_CHANNELS * 64)
            msg += self.dense(15, 16, "ip2_mov_w", "ip2_mov_b", 1, MLH_HIDDEN, bias_mean=1.0)
        return msg

    def weights_message(self) -> bytes:
        s = self.spec
        if s.attention_body:
            return self.body_message()
        F = s.filters
        msg = f_bytes(1, self.conv_block("input", F, 112, 3, bn=True, bias=True))
        for b in range(s.blocks):
            res = f_bytes(1, self.conv_block(f"residual.{b}.conv1", F, F, 3, bn=True, bias=(b == 0) or self.bn_bias()))
            res += f_bytes(2, self.conv_block(f"residual.{b}.conv2", F, F, 3, bn=True, bias=self.bn_bias()))
            if s.se:
                S = s.se_channels
                se = (f_bytes(1, self.layer(f"residual.{b}.se.w1", self.normal((S, F), 1.0 / np.sqrt(F))))
                      + f_bytes(2, self.layer(f"residual.{b}.se.b1", self.normal(S, 0.1)))
                      + f_bytes(3, self.layer(f"residual.{b}.se.w2", self.normal((2 * F, S), 1.0 / np.sqrt(S))))
                      + f_bytes(4, self.layer(f"residual.{b}.se.b2", self.normal(2 * F, 0.1))))
                res += f_bytes(3, se)
            msg += f_bytes(2, res)
        if s.policy == "convolution":
            msg += f_bytes(11, self.conv_block("policy1", F, F, 3, bn=True, bias=self.bn_bias()))
            msg += f_bytes(3, self.conv_block("policy", CONV_POLICY_PLANES, F, 3, bn=False, bias=True))
        elif s.policy == "attention":   # on a residual tower: T60-T78's head, and its policy encoder layers
            # the dense default's gains without encoder layers (the fixture cyzero-2x16-attnpol); the
            # sharper ones after them, whose layer norm leaves unit-scale features
            msg += self.policy_head("", TOP_POLICY_FIELDS, True,
                                    (1.5, 2.0, 1.0) if s.policy_encoders else (0.5, 0.5, 0.5))
        else:
            C = CLASSICAL_POLICY_CHANNELS
            msg += f_bytes(3, self.conv_block("policy", C, F, 1, bn=True, bias=self.bn_bias()))
            msg += self.dense(4, 5, "ip_pol_w", "ip_pol_b", POLICY_SIZE, C * 64)
        msg += f_bytes(6, self.conv_block("value", VALUE_CHANNELS, F, 1, bn=True, bias=self.bn_bias()))
        msg += self.dense(7, 8, "ip1_val_w", "ip1_val_b", VALUE_HIDDEN, VALUE_CHANNELS * 64)
        msg += self.dense(9, 10, "ip2_val_w", "ip2_val_b", 3 if s.value == "wdl" else 1, VALUE_HIDDEN)
        if s.moves_left:
            msg += f_bytes(12, self.conv_block("moves_left", MLH_CHANNELS, F, 1, bn=True, bias=self.bn_bias()))
            msg += self.dense(13, 14, "ip1_mov_w", "ip1_mov_b", MLH_HIDDEN, MLH_CHANNELS * 64)
            # a positive bias keeps the final ReLU mostly open, so that the output says something
            msg += self.dense(15, 16, "ip2_mov_w", "ip2_mov_b", 1, MLH_HIDDEN, bias_mean=1.0)
        if s.attention:
            msg += self.dense(25, 26, "ip_emb_w", "ip_emb_b", F, 112)
            for _ in range(max(1, s.blocks)):
                msg += f_bytes(27, b"")
            msg += f_varint(28, 2)
        return msg


def format_message(spec: Lc0Spec) -> bytes:
    """The Format message: weights_encoding LINEAR16 and (unless ``with_format`` is off) the NetworkFormat."""
    msg = f_varint(1, 1)
    if spec.with_format:
        nf = (f_varint(1, spec.input_format)
              + f_varint(2, 2 if spec.value == "wdl" else 1)
              + f_varint(3, spec.network_value())
              + f_varint(4, POLICY_FORMATS[spec.policy])
              + f_varint(5, VALUE_FORMATS[spec.value]))
        if spec.moves_left:
            nf += f_varint(6, 1)
        if spec.activation != "relu":
            nf += f_varint(7, ACTIVATIONS[spec.activation])
        if spec.attention_body:
            if spec.smolgen_activation != "default":
                nf += f_varint(8, FUNCTIONS[spec.smolgen_activation])
            if spec.ffn_activation != "default":
                nf += f_varint(9, FUNCTIONS[spec.ffn_activation])
            if spec.write_input_embedding:
                nf += f_varint(10, INPUT_EMBEDDINGS[spec.embedding])
        msg += f_bytes(2, nf)
    return msg


def _net_header(magic: int = MAGIC) -> bytes:
    return (f_fixed32(1, magic)
            + f_string(2, "GPL-3.0 (synthetic test network, random weights)")
            + f_bytes(3, f_varint(1, 0) + f_varint(2, 26) + f_varint(3, 0)))


def _training_params(spec: Lc0Spec) -> bytes:
    return (f_varint(1, 1000 + spec.seed)
            + f_float(2, 0.02)
            + f_float(3, 0.25)
            + f_float(4, 2.5)
            + f_float(5, 0.5)
            + f_string(6, "--synthetic"))


def make_lc0(spec: Lc0Spec, *, magic: int = MAGIC) -> Tuple[bytes, Dict[str, np.ndarray]]:
    """The serialized ``pblczero.Net`` for ``spec`` and the decoded float32 arrays it holds."""
    spec.check()
    writer = _Writer(spec)
    weights = writer.weights_message()
    data = (_net_header(magic)
            + f_bytes(4, format_message(spec))
            + f_bytes(5, _training_params(spec))
            + f_bytes(10, weights))
    return data, writer.weights


def write_bytes(path, data: bytes, gz: bool = True) -> str:
    """Write ``data`` (gzipped when ``gz``) to ``path`` atomically; returns the path."""
    path = os.fspath(path)
    payload = gzip.compress(data, mtime=0) if gz else data
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=".lc0")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(payload)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


def write_lc0(path, spec: Lc0Spec, gz: bool = True) -> Dict[str, np.ndarray]:
    """Write the net for ``spec`` to ``path`` (``.pb.gz`` when ``gz``) atomically; returns its decoded weights."""
    data, weights = make_lc0(spec)
    write_bytes(path, data, gz=gz)
    return weights


# --------------------------------------------------------------------------- rewriting a file's input format
# The weights do not depend on the input format: the same network with format.network_format.input
# rewritten is a network of that format (docs/recipes/lc0-input-formats.py, tests/test_lc0.py).

def _rewrite(buf: bytes, path: tuple, value: int) -> bytes:
    """``buf`` with the varint at the field path ``path`` (message fields, then the varint's) set to
    ``value``; the field is added where the innermost message lacks it."""
    out, found = bytearray(), False
    for field, wire, span, payload in walk(buf):
        if field == path[0] and len(path) == 1 and wire == 0:
            out += varint(field << 3) + varint(value)
            found = True
        elif field == path[0] and len(path) > 1 and wire == 2:
            inner = _rewrite(payload, path[1:], value)
            out += varint(field << 3 | 2) + varint(len(inner)) + inner
            found = True
        else:
            out += buf[span]
    if not found:
        inner = varint(value) if len(path) == 1 else _rewrite(b"", path[1:], value)
        out += varint(path[0] << 3 | (0 if len(path) == 1 else 2))
        out += inner if len(path) == 1 else varint(len(inner)) + inner
    return bytes(out)


def with_input_format(data: bytes, input_format: int) -> bytes:
    """An lc0 file (decompressed Net message) with format.network_format.input = ``input_format``."""
    return _rewrite(data, (4, 2, 1), input_format)


def input_format_of(data: bytes) -> int:
    for field, _, _, fmt in walk(data):
        if field == 4:
            for f2, _, _, nf in walk(fmt):
                if f2 == 2:
                    for f3, _, _, v in walk(nf):
                        if f3 == 1:
                            return v
    return 1


# --------------------------------------------------------------------------- broken and foreign files

def truncated(data: bytes, keep: float = 0.6) -> bytes:
    """``data`` cut short inside its last field (the weights), so that no protobuf reader can finish it."""
    cut = max(1, min(len(data) - 1, int(len(data) * keep)))
    return data[:cut]


def wrong_magic(spec: Optional[Lc0Spec] = None, magic: int = 0x1C1) -> bytes:
    """A complete net whose magic is not 0x1c0."""
    return make_lc0(spec or Lc0Spec(), magic=magic)[0]


def wrap_onnx(onnx_bytes: bytes, *, data_type: int = 1, output_mlh: Optional[str] = None) -> bytes:
    """A Net of network format NETWORK_ONNX (5) carrying ``onnx_bytes`` in ``onnx_model`` (no weights)."""
    nf = f_varint(1, 1) + f_varint(2, 2) + f_varint(3, NETWORK_ONNX) + f_varint(4, 2) + f_varint(5, 2)
    onnx_model = (f_bytes(1, onnx_bytes)
                  + f_varint(2, data_type)
                  + f_string(3, "/input/planes")
                  + f_string(5, "/output/wdl")
                  + f_string(6, "/output/policy"))
    if output_mlh is not None:
        onnx_model += f_string(7, output_mlh)
    return _net_header() + f_bytes(4, f_varint(1, 1) + f_bytes(2, nf)) + f_bytes(11, onnx_model)


# --------------------------------------------------------------------------- the reference forward pass

def _act(x: np.ndarray, activation: str) -> np.ndarray:
    if activation == "relu":
        return np.maximum(x, 0.0)
    if activation == "mish":
        return x * np.tanh(np.logaddexp(0.0, x))
    raise ValueError(f"unknown activation {activation!r}")


def conv2d(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """'Same' convolution (cross-correlation, as lc0 and ONNX do) of [N,C,8,8] with [O,C,k,k], odd k."""
    k = w.shape[-1]
    p = k // 2
    n, c, h, wd = x.shape
    padded = np.zeros((n, c, h + 2 * p, wd + 2 * p), dtype=np.float64)
    padded[:, :, p:p + h, p:p + wd] = x
    out = np.zeros((n, w.shape[0], h, wd), dtype=np.float64)
    for dy in range(k):
        for dx in range(k):
            out += np.einsum("nchw,oc->nohw", padded[:, :, dy:dy + h, dx:dx + wd], w[:, :, dy, dx], optimize=True)
    return out


def conv_block(weights: Dict[str, np.ndarray], name: str, x: np.ndarray) -> np.ndarray:
    """lc0's ConvBlock: conv, conv bias, and BN (variances in bn_stddivs; the bias folds into the mean)."""
    w = weights[f"{name}.weights"].astype(np.float64)
    y = conv2d(x, w)
    out_ch = w.shape[0]
    bias = weights.get(f"{name}.biases", np.zeros(out_ch)).astype(np.float64)
    y = y + bias[None, :, None, None]
    if f"{name}.bn_means" in weights:
        mean = weights[f"{name}.bn_means"].astype(np.float64)
        var = weights[f"{name}.bn_stddivs"].astype(np.float64)
        gamma = weights.get(f"{name}.bn_gammas", np.ones(out_ch)).astype(np.float64)
        beta = weights.get(f"{name}.bn_betas", np.zeros(out_ch)).astype(np.float64)
        scale = gamma / np.sqrt(var + BN_EPSILON)
        y = (y - mean[None, :, None, None]) * scale[None, :, None, None] + beta[None, :, None, None]
    return y


def _dense(weights: Dict[str, np.ndarray], wname: str, bname: str, x: np.ndarray) -> np.ndarray:
    return x @ weights[wname].astype(np.float64).T + weights[bname].astype(np.float64)


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def reference_forward(weights: Dict[str, np.ndarray], spec: Lc0Spec, planes: np.ndarray, *,
                      value_head: str = "winner", policy_head: str = "vanilla"
                      ) -> Tuple[np.ndarray, np.ndarray, Optional[np.ndarray]]:
    """(policy logits [N,1858], WDL probabilities [N,3], moves left [N] or None), in float64.

    ``planes`` [N,112,8,8] are used exactly as given.  A classical value head's
    tanh value v is reported as the WDL ((1+v)/2, 0, (1-v)/2).  ``value_head`` /
    ``policy_head``: a multihead attention-body net's heads.
    """
    if spec.attention_body:
        return _body_forward(weights, spec, np.asarray(planes, np.float64), value_head, policy_head)
    if spec.attention:
        raise ValueError("no reference for attention-body nets (they are meant to be refused)")
    act = spec.activation
    x = np.asarray(planes, dtype=np.float64)
    if x.ndim != 4 or x.shape[1:] != (112, 8, 8):
        raise ValueError(f"planes must be [N,112,8,8], not {list(x.shape)}")
    n = x.shape[0]

    x = _act(conv_block(weights, "input", x), act)
    block = 0
    while f"residual.{block}.conv1.weights" in weights:
        name = f"residual.{block}"
        y = _act(conv_block(weights, f"{name}.conv1", x), act)
        y = conv_block(weights, f"{name}.conv2", y)
        if f"{name}.se.w1" in weights:
            filters = y.shape[1]
            pooled = y.mean(axis=(2, 3))
            h = _act(_dense(weights, f"{name}.se.w1", f"{name}.se.b1", pooled), act)
            g = _dense(weights, f"{name}.se.w2", f"{name}.se.b2", h)
            gamma, beta = g[:, :filters], g[:, filters:]
            y = _sigmoid(gamma)[:, :, None, None] * y + beta[:, :, None, None]
        x = _act(y + x, act)
        block += 1

    if "policy1.weights" in weights:  # convolutional policy head
        p = _act(conv_block(weights, "policy1", x), act)
        p = conv_block(weights, "policy", p)
        policy = p.reshape(n, -1)[:, POLICY_MAP]
    elif "ip2_pol_w" in weights:      # attention policy head: a SELU embedding, SELU FFNs, no smolgen
        squares = x.reshape(n, x.shape[1], 64).transpose(0, 2, 1)            # [N, 64, C], a1..h8
        emb = _selu(_dense(weights, "ip_pol_w", "ip_pol_b", squares))
        policy = _attention_policy(weights, "", emb, spec.policy_encoders, spec.policy_encoder_heads, "none", "selu")
    else:
        p = _act(conv_block(weights, "policy", x), act)
        policy = _dense(weights, "ip_pol_w", "ip_pol_b", p.reshape(n, -1))

    v = _act(conv_block(weights, "value", x), act).reshape(n, -1)
    wdl = _value(weights, "", v, act)
    mlh = None
    if "moves_left.weights" in weights:
        mlh = _moves_left(weights, _act(conv_block(weights, "moves_left", x), act).reshape(n, -1), act)
    return policy, wdl, mlh


def _value(weights: Dict[str, np.ndarray], prefix: str, v: np.ndarray, act: str) -> np.ndarray:
    """The WDL from a value head's flattened input: ip1_val (``act``), ip2_val, then softmax, or
    for a single value v the WDL ((1+v)/2, 0, (1-v)/2) of v = tanh."""
    v = _act(_dense(weights, prefix + "ip1_val_w", prefix + "ip1_val_b", v), act)
    v = _dense(weights, prefix + "ip2_val_w", prefix + "ip2_val_b", v)
    if v.shape[1] == 3:
        return _softmax(v)
    t = np.tanh(v[:, 0])
    return np.stack([(1.0 + t) / 2.0, np.zeros_like(t), (1.0 - t) / 2.0], axis=1)


def _moves_left(weights: Dict[str, np.ndarray], m: np.ndarray, act: str) -> np.ndarray:
    """Moves left from the head's flattened input: ip1_mov (``act``), ip2_mov, ReLU."""
    m = _act(_dense(weights, "ip1_mov_w", "ip1_mov_b", m), act)
    return np.maximum(_dense(weights, "ip2_mov_w", "ip2_mov_b", m)[:, 0], 0.0)


def _selu(x: np.ndarray) -> np.ndarray:
    return 1.0507009873554805 * np.where(x > 0, x, 1.6732632423543772 * (np.exp(np.minimum(x, 0.0)) - 1.0))


def _attention_square_index() -> np.ndarray:
    """For each of the 1858 policy entries, its place among the attention head's 64 x 64 from-to
    logits and 8 x 24 promotion logits: ``from * 64 + to``, or for a q/r/b promotion
    ``4096 + 24 * from_file + 3 * to_file + (0, 1, 2)`` (lc0's order: q, r, b)."""
    out = np.empty(len(POLICY_INDEX), np.int64)
    for i, move in enumerate(POLICY_INDEX):
        frm = (ord(move[0]) - 97) + 8 * (int(move[1]) - 1)
        to = (ord(move[2]) - 97) + 8 * (int(move[3]) - 1)
        out[i] = 4096 + 24 * (frm % 8) + 3 * (to % 8) + "qrb".index(move[4]) if len(move) == 5 else frm * 64 + to
    return out


def _attention_policy(weights: Dict[str, np.ndarray], prefix: str, e: np.ndarray, encoders: int, heads: int,
                      smolgen_act: str, ffn_act: str) -> np.ndarray:
    """lc0's attention policy (network_blas.cc) from the policy embedding ``e`` [N, 64, E]: the head's
    ``encoders`` encoder layers (alpha 1, epsilon 1e-6), queries and keys, their scaled products as
    from-to logits; promotions add a per-piece offset from the 8th rank's keys (the 4th offset is
    shared by all three). ``prefix``: a multihead net's head."""
    n = e.shape[0]
    for i in range(encoders):
        e = _encoder(weights, f"{prefix}pol_encoder.{i}", e, heads, smolgen_act, ffn_act, 1.0, 1e-6)
    q = _dense(weights, prefix + "ip2_pol_w", prefix + "ip2_pol_b", e)
    k = _dense(weights, prefix + "ip3_pol_w", prefix + "ip3_pol_b", e)
    logits = q @ k.transpose(0, 2, 1) / np.sqrt(q.shape[-1])              # [N, from, to]
    offsets = k[:, 56:64] @ weights[prefix + "ip4_pol_w"].T.astype(np.float64)    # [N, to file, 4]
    offsets = offsets[:, :, :3] + offsets[:, :, 3:]
    promotions = logits[:, 48:56, 56:64, None] + offsets[:, None, :, :]   # [N, from file, to file, q/r/b]
    flat = np.concatenate([logits.reshape(n, 4096), promotions.reshape(n, 192)], axis=1)
    return flat[:, _attention_square_index()]


def pos_encoding() -> np.ndarray:
    """lc0's PE map (kPosEncoding) from the rules: row i is -1 at square i, 1 at every square a rook,
    bishop or knight move away (a1 = 0, b1 = 1, ..., h8 = 63), 0 elsewhere."""
    table = np.zeros((64, 64))
    for i in range(64):
        for j in range(64):
            df, dr = abs(j % 8 - i % 8), abs(j // 8 - i // 8)
            if i == j:
                table[i, j] = -1.0
            elif df == 0 or dr == 0 or df == dr or {df, dr} == {1, 2}:
                table[i, j] = 1.0
    return table


def _activation(x: np.ndarray, name: str) -> np.ndarray:
    """net.proto's ActivationFunction by name, as lc0's CPU backend computes it."""
    if name in ("relu", "mish"):
        return _act(x, name)
    if name == "relu2":
        return np.maximum(x, 0.0) ** 2
    if name == "swish":
        return x * _sigmoid(x)
    if name == "selu":
        return _selu(x)
    if name == "tanh":
        return np.tanh(x)
    if name == "sigmoid":
        return _sigmoid(x)
    if name == "none":
        return x
    raise ValueError(f"unknown activation {name!r}")


def _layer_norm(x: np.ndarray, weights: Dict[str, np.ndarray], name: str, eps: float) -> np.ndarray:
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * weights[name + "_gammas"] + weights[name + "_betas"]


def _encoder(weights: Dict[str, np.ndarray], name: str, x: np.ndarray, heads: int, smolgen_act: str,
             ffn_act: str, alpha: float, eps: float) -> np.ndarray:
    """One lc0 encoder layer on [N, 64, E] (network_blas.cc's ForwardEncoderLayer)."""
    n = x.shape[0]
    m = f"{name}.mha"
    q, k, v = (_dense(weights, f"{m}.{p}_w", f"{m}.{p}_b", x) for p in "qkv")
    d = q.shape[-1]
    depth = d // heads
    q, k, v = (t.reshape(n, 64, heads, depth).transpose(0, 2, 1, 3) for t in (q, k, v))
    logits = np.einsum("nhqd,nhkd->nhqk", q, k) / np.sqrt(depth)
    if f"{m}.smolgen.compress" in weights:
        sg = f"{m}.smolgen"
        g = (x @ weights[f"{sg}.compress"].astype(np.float64).T).reshape(n, -1)
        g = _layer_norm(_activation(_dense(weights, f"{sg}.dense1_w", f"{sg}.dense1_b", g), smolgen_act),
                        weights, f"{sg}.ln1", 1e-3)
        g = _layer_norm(_activation(_dense(weights, f"{sg}.dense2_w", f"{sg}.dense2_b", g), smolgen_act),
                        weights, f"{sg}.ln2", 1e-3)
        g = g.reshape(n, heads, -1) @ weights["smolgen_w"].astype(np.float64).T      # [N, heads, 4096]
        logits = logits + g.reshape(n, heads, 64, 64)
    attended = np.einsum("nhqk,nhkd->nhqd", _softmax(logits), v).transpose(0, 2, 1, 3).reshape(n, 64, d)
    x = _layer_norm(alpha * _dense(weights, f"{m}.dense_w", f"{m}.dense_b", attended) + x, weights,
                    f"{name}.ln1", eps)
    f = f"{name}.ffn"
    y = _dense(weights, f"{f}.dense2_w", f"{f}.dense2_b",
               _activation(_dense(weights, f"{f}.dense1_w", f"{f}.dense1_b", x), ffn_act))
    return _layer_norm(alpha * y + x, weights, f"{name}.ln2", eps)


def _body_forward(weights: Dict[str, np.ndarray], spec: Lc0Spec, planes: np.ndarray, value_head: str,
                  policy_head: str) -> Tuple[np.ndarray, np.ndarray, Optional[np.ndarray]]:
    """An attention-body net as lc0 v0.32.1's CPU backend computes it (network_blas.cc)."""
    if planes.ndim != 4 or planes.shape[1:] != (112, 8, 8):
        raise ValueError(f"planes must be [N,112,8,8], not {list(planes.shape)}")
    n = planes.shape[0]
    act = spec.activation
    smolgen_act = act if spec.smolgen_activation == "default" else spec.smolgen_activation
    ffn_act = act if spec.ffn_activation == "default" else spec.ffn_activation
    dense = spec.embedding == "pe_dense"
    eps = 1e-3 if dense else 1e-6
    alpha = (2.0 * spec.blocks) ** -0.25
    squares = planes.reshape(n, 112, 64).transpose(0, 2, 1)                     # [N, 64, 112]
    if dense:
        pre = _dense(weights, "ip_emb_preproc_w", "ip_emb_preproc_b", squares[:, :, :12].reshape(n, 64 * 12))
        extra = pre.reshape(n, 64, -1)
    else:
        extra = np.broadcast_to(pos_encoding(), (n, 64, 64))
    x = _act(_dense(weights, "ip_emb_w", "ip_emb_b", np.concatenate([squares, extra], axis=2)), act)
    if dense:
        x = _layer_norm(x, weights, "ip_emb_ln", 1e-3)
    if "ip_mult_gate" in weights:
        x = x * weights["ip_mult_gate"].T + weights["ip_add_gate"].T
    if dense:
        y = _activation(_dense(weights, "ip_emb_ffn.dense1_w", "ip_emb_ffn.dense1_b", x), ffn_act)
        x = _layer_norm(alpha * _dense(weights, "ip_emb_ffn.dense2_w", "ip_emb_ffn.dense2_b", y) + x, weights,
                        "ip_emb_ffn_ln", 1e-3)
    for i in range(spec.blocks):
        x = _encoder(weights, f"encoder.{i}", x, spec.heads, smolgen_act, ffn_act, alpha, eps)

    p = f"policy_heads.{policy_head}." if spec.multihead else ""
    shared = "policy_heads." if spec.multihead else ""
    e = _act(_dense(weights, shared + "ip_pol_w", shared + "ip_pol_b", x), act)
    policy = _attention_policy(weights, p, e, spec.policy_encoders, spec.policy_encoder_heads, smolgen_act, ffn_act)

    h = f"value_heads.{value_head}." if spec.multihead else ""
    wdl = _value(weights, h, _act(_dense(weights, h + "ip_val_w", h + "ip_val_b", x), act).reshape(n, -1), act)
    mlh = None
    if spec.moves_left:
        mlh = _moves_left(weights, _act(_dense(weights, "ip_mov_w", "ip_mov_b", x), act).reshape(n, -1), act)
    return policy, wdl, mlh


def random_planes(n: int, seed: int = 0) -> np.ndarray:
    """[n,112,8,8] float32 planes that look like lc0 input: sparse 0/1 pieces, a raw rule50 count, a ones plane."""
    rng = np.random.default_rng(seed)
    planes = (rng.random((n, 112, 8, 8)) < 0.08).astype(np.float32)
    planes[:, 104:109] = rng.integers(0, 2, (n, 5, 1, 1)).astype(np.float32)
    planes[:, 109] = rng.integers(0, 100, (n, 1, 1)).astype(np.float32)
    planes[:, 110] = 0.0
    planes[:, 111] = 1.0
    return planes


# --------------------------------------------------------------------------- lc0's own outputs


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAIA_DIR = os.environ.get("CYZERO_MAIA_DIR") or os.path.join(os.path.dirname(REPO), "shared", "fixtures")


@dataclass(frozen=True)
class Lc0Fixture:
    """An lc0 network file with lc0 v0.32.1's own outputs for it, side by side in ``folder``:
    ``NAME.pb.gz``, ``NAME.lc0.json`` (lc0's evaluation at one node: ``v`` = W - L, ``d``, ``m``
    (moves left; 0 or absent without the head), and each legal move's policy share ``p`` in percent at
    ``policy_temperature`` with its lc0 policy ``index``; castling named king-takes-rook) and
    ``NAME.leela2onnx.onnx`` (lc0's own ONNX export). ``docs/recipes/lc0-fixture.py`` makes them.

    ``extra`` fixtures are not in the repository; a test that needs one skips, saying what it is
    and where a user gets it. The in-repository one is always there: a missing file is a failure.
    """

    name: str
    folder: str
    spec: Lc0Spec          # its shape, as reference_forward reads it
    description: str       # how engine.lc0 describes it (a prefix)
    extra: str = ""        # why it is not in the repository and where to get it
    files: Tuple[str, ...] = ("pb", "json", "onnx")   # "onnx": lc0's own export is there too
    recipe: str = "docs/recipes/lc0-fixture.py"

    def path(self, kind: str) -> str:
        suffix = {"pb": ".pb.gz", "json": ".lc0.json", "onnx": ".leela2onnx.onnx"}[kind]
        return os.path.join(self.folder, self.name + suffix)

    @property
    def pb(self) -> str:
        return self.path("pb")

    @property
    def onnx(self) -> str:
        return self.path("onnx")

    def missing(self) -> List[str]:
        return [os.path.basename(self.path(k)) for k in self.files if not os.path.isfile(self.path(k))]

    def need(self) -> "Lc0Fixture":
        """The fixture, or a skip (an extra one) or failure (the repository's own) when a file is absent."""
        missing = self.missing()
        if missing and self.extra:
            pytest.skip(f"{', '.join(missing)} not found in {os.path.normpath(self.folder)}: {self.extra}")
        assert not missing, f"{missing} missing from {self.folder}: remake them with {self.recipe}"
        return self

    def lc0(self) -> dict:
        """lc0's evaluation (the JSON): {"policy_temperature": ..., "positions": [...]}."""
        with open(self.path("json"), encoding="utf-8") as f:
            return json.load(f)


#: The repository's own: a 3x16 cyzero network (SE, convolutional policy, WDL, a ReLU moves-left
#: head) written by ``cyzero-train export --lc0``, and lc0's outputs for it.
CYZERO = Lc0Fixture("cyzero-3x16", os.path.join(REPO, "tests", "data", "lc0"),
                    Lc0Spec(blocks=3, filters=16, se=True, se_channels=4, moves_left=True),
                    "lc0 network 3x16 SE, classical 112-plane input, convolution policy, WDL value, "
                    "moves-left head, ReLU")

#: The repository's own attention-policy network: a 2x16 SE tower with lc0's attention policy head
#: (T60-T78's structure), written from the proto by this module's writer, and lc0's outputs for it
#: (docs/recipes/lc0-attention-policy-fixture.py; lc0 v0.32.1 has no ONNX export to compare with).
ATTENTION_POLICY = Lc0Fixture("cyzero-2x16-attnpol", os.path.join(REPO, "tests", "data", "lc0"),
                              Lc0Spec(blocks=2, filters=16, se=True, se_channels=8, policy="attention",
                                      moves_left=True, activation="mish", seed=53),
                              "lc0 network 2x16 SE, classical 112-plane input, attention policy, WDL value, "
                              "moves-left head, Mish", files=("pb", "json"),
                              recipe="docs/recipes/lc0-attention-policy-fixture.py")

#: The same with the attention policy's own encoder layers (pol_encoder, pol_headcount) on the residual
#: tower: 2 layers of width 16 with 2 heads, which lc0 runs with a SELU FFN and no smolgen
#: (docs/recipes/lc0-attention-policy-fixture.py).
ATTENTION_POLICY_ENCODERS = Lc0Fixture("cyzero-2x16-attnpol-enc", os.path.join(REPO, "tests", "data", "lc0"),
                                       Lc0Spec(blocks=2, filters=16, se=True, se_channels=8, policy="attention",
                                               moves_left=True, activation="mish", policy_encoders=2,
                                               policy_encoder_heads=2, seed=54),
                                       "lc0 network 2x16 SE, classical 112-plane input, attention policy with 2 "
                                       "encoder layers x 2h, WDL value, moves-left head, Mish", files=("pb", "json"),
                                       recipe="docs/recipes/lc0-attention-policy-fixture.py")

#: Maia 1100: a real network that lc0's own trainer wrote (6x64, SE, convolutional policy, WDL, no
#: moves-left head). GPL-3.0, so never in the repository: an extra where a user has it.
MAIA = Lc0Fixture("maia-1100", MAIA_DIR, Lc0Spec(blocks=6, filters=64, se=True, se_channels=8),
                  "lc0 network 6x64 SE, classical 112-plane input, convolution policy, WDL value, "
                  "no moves-left head, ReLU; trained 400000 steps",
                  extra="Maia 1100 is a real lc0 network (GPL-3.0, so not in the repository): get "
                        "maia_weights/maia-1100.pb.gz from CSSLab's maia-chess repository, make lc0's outputs "
                        "for it with `docs/recipes/lc0-fixture.py --lc0 LC0 --evaluate maia-1100.pb.gz`, and "
                        "put the three files there or name their folder in CYZERO_MAIA_DIR")


#: The repository's own attention-body (transformer) networks, written from the proto by this module's
#: writer, with lc0 v0.32.1's outputs for them (docs/recipes/lc0-attention-body-fixture.py): the multihead
#: format (7) with the PE-dense embedding and smolgen, as Leela's BT3/BT4 are; and format 6 with the PE map
#: and a policy encoder layer. Not in EVALUATED_BY_LC0 (whose tests read residual towers):
#: tests/test_lc0_attention.py runs them.
BODY_MULTIHEAD = Lc0Fixture(
    "cyzero-bt-32x2-multihead", os.path.join(REPO, "tests", "data", "lc0"),
    Lc0Spec(attention_body=True, filters=32, blocks=2, heads=4, policy="attention", moves_left=True,
            activation="mish", smolgen_activation="swish", embedding="pe_dense", multihead=True,
            value_heads=("winner", "q", "st"), policy_heads=("vanilla", "optimistic"), seed=61),
    "lc0 network attention body 32x2x4h, smolgen, PE dense embedding, input gating, classical 112-plane "
    "input, attention policy (head vanilla of vanilla/optimistic), WDL value (head winner of winner/q/st), "
    "moves-left head, Mish, FFN Mish, smolgen swish", files=("pb", "json"),
    recipe="docs/recipes/lc0-attention-body-fixture.py")
BODY_PE_MAP = Lc0Fixture(
    "cyzero-bt-32x2-pemap", os.path.join(REPO, "tests", "data", "lc0"),
    Lc0Spec(attention_body=True, filters=32, blocks=2, heads=4, policy="attention", moves_left=False,
            activation="relu", ffn_activation="relu2", smolgen_activation="swish", embedding="pe_map",
            write_input_embedding=False, policy_encoders=1, policy_encoder_heads=2, seed=62),
    "lc0 network attention body 32x2x4h, smolgen, PE map embedding, input gating, classical 112-plane "
    "input, attention policy with 1 encoder layers x 2h, WDL value, no moves-left head, ReLU, FFN ReLU^2, "
    "smolgen swish", files=("pb", "json"), recipe="docs/recipes/lc0-attention-body-fixture.py")
ATTENTION_BODIES = (BODY_MULTIHEAD, BODY_PE_MAP)


#: An attention body that cyzero's trainer wrote (trainer.model's ``bt-32x2x2h``, ``export --lc0``), with
#: lc0 v0.32.1's outputs for it (docs/recipes/lc0-transformer-fixture.py): :func:`trainer_transformer`
#: rebuilds the PyTorch network the file was written from.
TRAINER_BODY = Lc0Fixture(
    "cyzero-trainer-bt-32x2x2h", os.path.join(REPO, "tests", "data", "lc0"),
    Lc0Spec(attention_body=True, filters=32, blocks=2, heads=2, policy="attention", moves_left=True,
            activation="mish", smolgen_activation="swish", embedding="pe_dense", multihead=True),
    "lc0 network attention body 32x2x2h, smolgen, PE dense embedding, input gating, classical 112-plane "
    "input, attention policy (head vanilla of vanilla), WDL value (head winner of winner), moves-left head, "
    "Mish, FFN Mish, smolgen swish", files=("pb", "json"), recipe="docs/recipes/lc0-transformer-fixture.py")
TRAINER_BODY_SEED = 71


def trainer_transformer():
    """:data:`TRAINER_BODY`'s network: ``bt-32x2x2h`` with small heads and one positional channel (a
    small file), initialised from seed 71, then every parameter moved by N(0, 0.05) drawn from a
    generator of the same seed, so that its policy and value are far from a fresh network's
    near-uniform ones (and the layer norms and gates from 1 and 0)."""
    import torch

    from trainer.model import NetConfig, build_net

    config = NetConfig.from_name("bt-32x2x2h", value_channels=4, value_hidden=32, mlh_channels=4, mlh_hidden=16,
                                 pe_channels=1)
    net = build_net(config, seed=TRAINER_BODY_SEED).eval()
    generator = torch.Generator().manual_seed(TRAINER_BODY_SEED)
    with torch.no_grad():
        for p in net.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * 0.05)
    return net


#: Every fixture with lc0's own evaluation: the residual ones with their lc0 export, and the
#: attention-policy ones (not exported by lc0 v0.32.1, nor by cyzero's trainer).
EVALUATED_BY_LC0 = (CYZERO, MAIA, ATTENTION_POLICY, ATTENTION_POLICY_ENCODERS)


def fixture_params(*fixtures: Lc0Fixture) -> list:
    """pytest params of ``fixtures`` (default: the repository's own and Maia), each id'd by name;
    the test calls ``.need()``."""
    return [pytest.param(f, id=f.name) for f in (fixtures or (CYZERO, MAIA))]


def shares(policy_row: np.ndarray, moves: dict, temperature: float) -> np.ndarray:
    """lc0's policy shares in percent of ``moves`` (the JSON's {uci: {"index": i, ...}}) from one row
    of policy logits, at ``temperature``, in the JSON's order."""
    logits = np.array([policy_row[m["index"]] for m in moves.values()], dtype=np.float64) / temperature
    e = np.exp(logits - logits.max())
    return 100.0 * e / e.sum()


# How close a correct reading comes to what lc0 printed. V is printed to 4 decimals (seen 5e-5 off);
# D to 3, yet seen 2.3e-3 (the repository's fixture) and 2.9e-3 (Maia) off the draw probability of
# the same network that gives V to 5e-5, and of lc0's own ONNX export; M (moves left) to 1 decimal
# (seen 0.047 off); P to 2 decimals of a percent, computed with lc0's own fast approximate exp (seen
# 0.034 and 0.044 off).
LC0_TOLERANCE = {"v": 1.5e-4, "d": 4e-3, "m": 0.08, "p": 0.07}


def assert_plays_as_lc0(lc0: dict, policy: np.ndarray, wdl: np.ndarray, mlh: Optional[np.ndarray],
                        tolerance: Optional[Dict[str, float]] = None) -> None:
    """``policy`` logits [N,1858], ``wdl`` [N,3] and ``mlh`` [N] (or None) at lc0's positions are what
    lc0 evaluated, within LC0_TOLERANCE or ``tolerance`` (v, d, m, p)."""
    tol = tolerance or LC0_TOLERANCE
    for row, position in enumerate(lc0["positions"]):
        fen = position["fen"]
        assert wdl[row, 0] - wdl[row, 2] == pytest.approx(position["v"], abs=tol["v"]), fen
        assert wdl[row, 1] == pytest.approx(position["d"], abs=tol["d"]), fen
        ours = 0.0 if mlh is None else float(np.reshape(mlh, -1)[row])  # lc0 says 0 without the head
        assert ours == pytest.approx(position.get("m", 0.0), abs=tol["m"]), fen
        got = shares(policy[row], position["moves"], lc0["policy_temperature"])
        np.testing.assert_allclose(got, [m["p"] for m in position["moves"].values()], rtol=0, atol=tol["p"],
                                   err_msg=fen)


_LC0_MOVE = re.compile(r"info string (\S+)\s+\(\s*(\d+)\s*\).*?\(P:\s*([\d.]+)%\)")
_LC0_NODE = re.compile(r"info string node\s.*\(D:\s*([-\d.]+)\).*\(M:\s*([-\d.]+)\).*\(V:\s*([-\d.]+)\)")


def lc0_evaluations(lc0: str, weights: str, fens: List[str], extra_args: Tuple[str, ...] = ()) -> List[dict]:
    """lc0's own evaluation of each position at one node (``go nodes 1`` with VerboseMoveStats):
    {"fen", "v", "d", "m" (0 without a moves-left head), "moves": {uci: {"index", "p"}}}. Each ``go``
    is answered before the next position is sent (lc0 searches in the background). ``extra_args``: more of
    lc0's arguments (``--backend-opts=value_head=q,policy_head=optimistic`` picks a multihead net's heads)."""
    proc = subprocess.Popen([lc0, f"--weights={weights}", "--backend=eigen", "--threads=1", *extra_args],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)

    def send(text: str) -> None:
        proc.stdin.write(text + "\n")
        proc.stdin.flush()

    def lines_until(prefix: str):
        for line in proc.stdout:
            yield line
            if line.startswith(prefix):
                return
        raise RuntimeError(f"lc0 ended before {prefix!r}")

    found = []
    try:
        send("uci\nsetoption name VerboseMoveStats value true\nisready")
        for _ in lines_until("readyok"):
            pass
        for fen in fens:
            send(f"position fen {fen}\ngo nodes 1")
            position: dict = {"fen": fen}
            moves: dict = {}
            for line in lines_until("bestmove"):
                node, move = _LC0_NODE.search(line), _LC0_MOVE.match(line)
                if node:
                    position.update(v=float(node.group(3)), d=float(node.group(1)), m=float(node.group(2)))
                elif move:
                    moves[move.group(1)] = {"index": int(move.group(2)), "p": float(move.group(3))}
            if "v" not in position or not moves:
                raise RuntimeError(f"lc0 said no node or move statistics for {fen}")
            found.append({**position, "moves": moves})
        send("quit")
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return found


#: lc0's default PolicyTemperature, at which the fixtures' JSON records lc0's policy shares.
POLICY_TEMPERATURE = 1.359

#: The positions the attention fixtures' recipes have lc0 evaluate: both sides to move, castling and en
#: passant, and promotions among the moves (straight and capturing, by either side: the attention
#: head's promotion offsets).
ATTENTION_POSITIONS = [
    "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1",
    "rnbqkbnr/pppp1ppp/8/4p3/4P3/5N2/PPPP1PPP/RNBQKB1R b KQkq - 1 2",
    "r3k2r/ppp2ppp/2n5/3qp3/8/2N2Q2/PPP2PPP/R3K2R w KQkq - 0 11",
    "rnbqkb1r/ppp1pppp/5n2/3pP3/8/8/PPPP1PPP/RNBQKBNR w KQkq d6 0 3",
    "8/P6k/8/8/8/8/6K1/8 w - - 0 1",                    # a promotion, straight
    "1n5k/P7/8/8/8/8/6K1/8 w - - 0 1",                  # promotions: straight and capturing
    "8/6K1/8/8/8/8/p6k/1N6 b - - 0 1",                  # black promotes (the board seen from black)
    "r3k3/1P6/8/8/8/8/6p1/4K2R w Kq - 0 30",            # promotions on both sides, castling rights
    "2r2rk1/pp1bqppp/2n1pn2/3p4/3P4/2PBPN2/P1Q2PPP/R4RK1 b - - 3 13",
    "8/5pk1/6p1/8/3R4/6P1/5PK1/2r5 w - - 40 60",
]


def write_fixture(folder: str, name: str, spec: Lc0Spec, lc0: str, positions: List[str],
                  runs: Optional[Dict[str, Tuple[str, ...]]] = None,
                  temperature: float = POLICY_TEMPERATURE) -> Tuple[str, List[str]]:
    """Write ``NAME.pb.gz`` for ``spec`` into ``folder`` and, for each ``suffix -> lc0's extra arguments``
    of ``runs`` (default: one run, no extra arguments), ``NAME{suffix}.lc0.json``: lc0's evaluation of
    the file at ``positions`` (:func:`lc0_evaluations`), each file written atomically. Returns the
    weights' path and the JSON files' paths."""
    os.makedirs(folder, exist_ok=True)
    weights = os.path.join(folder, f"{name}.pb.gz")
    write_lc0(weights, spec)
    written = []
    for suffix, extra in (runs or {"": ()}).items():
        record = {"weights": os.path.basename(weights),
                  "lc0": "v0.32.1, eigen backend, go nodes 1, VerboseMoveStats" + "".join(f", {a}" for a in extra),
                  "policy_temperature": temperature,
                  "positions": lc0_evaluations(lc0, weights, positions, extra)}
        target = os.path.join(folder, f"{name}{suffix}.lc0.json")
        with open(target + ".tmp", "w", encoding="utf-8") as f:
            json.dump(record, f, indent=1)
            f.write("\n")
        os.replace(target + ".tmp", target)
        written.append(target)
    return weights, written


def remake_fixtures(description: str, fixtures: Dict[str, Tuple[Lc0Spec, Optional[Dict[str, Tuple[str, ...]]]]],
                    positions: List[str] = ATTENTION_POSITIONS, temperature: float = POLICY_TEMPERATURE):
    """A fixture recipe's command line (``--lc0 LC0 [--out FOLDER]``, by default tests/data/lc0) and
    its work: :func:`write_fixture` for each ``name -> (spec, runs)`` of ``fixtures``, yielding the
    weights' path and the JSON files' paths as each is written."""
    import argparse

    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lc0", required=True, help="lc0 v0.32.1 with the eigen backend")
    parser.add_argument("--out", default=os.path.join(REPO, "tests", "data", "lc0"))
    args = parser.parse_args()
    for name, (spec, runs) in fixtures.items():
        yield write_fixture(args.out, name, spec, args.lc0, positions, runs, temperature)


__all__: List[str] = [
    "ACTIVATIONS", "ATTENTION_BODIES", "ATTENTION_POLICY", "ATTENTION_POLICY_ENCODERS", "BN_EPSILON", "BODY_MULTIHEAD", "BODY_PE_MAP", "CYZERO", "EVALUATED_BY_LC0", "ENCODINGS", "LC0_TOLERANCE", "Lc0Fixture", "Lc0Spec", "MAGIC",
    "MAIA", "POLICY_MAP", "TRAINER_BODY", "trainer_transformer", "assert_plays_as_lc0", "conv2d", "conv_block", "fixture_params",
    "lc0_evaluations", "shares", "ATTENTION_POSITIONS", "POLICY_TEMPERATURE", "remake_fixtures", "write_fixture",
    "encode_layer", "f_bytes", "f_fixed32", "f_float", "f_string", "f_varint", "format_message", "input_format_of",
    "make_lc0", "with_input_format",
    "pos_encoding", "random_planes", "reference_forward", "truncated", "varint", "wrap_onnx", "write_bytes", "write_lc0",
    "wrong_magic",
]
