"""An independent writer and NumPy reference for lc0 network weight files (tests only).

Why this exists: ``engine/lc0.py`` reads lc0's ``.pb`` / ``.pb.gz`` weight files
(protobuf ``pblczero.Net``, lc0's ``proto/net.proto``) and turns them into an
ONNX graph.  Its tests need lc0 files of many shapes (SE or not, convolutional
or classical policy, WDL or classical value, moves-left, mish, every layer
encoding, old files without a format or without BN gammas/betas, broken files)
and an answer to compare the converted graph against.  This module provides
both, written from the file format and lc0's network semantics alone: it
imports nothing from ``engine.lc0`` and does not use the ``protobuf`` package
(the few wire-format rules it needs are encoded by hand below), so a
misreading in the converter cannot hide behind the same misreading here.

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
import struct
import subprocess
import tempfile
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import numpy as np
import pytest

from engine.encoding import POLICY_INDEX
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


# --------------------------------------------------------------------------- protobuf wire format (encoder)

def varint(value: int) -> bytes:
    """Base-128 varint; negative values as 64-bit two's complement (proto int32/int64/enum)."""
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


def _key(field: int, wire_type: int) -> bytes:
    return varint((field << 3) | wire_type)


def f_varint(field: int, value: int) -> bytes:
    return _key(field, 0) + varint(int(value))


def f_fixed32(field: int, value: int) -> bytes:
    return _key(field, 5) + struct.pack("<I", value)


def f_float(field: int, value: float) -> bytes:
    return _key(field, 5) + struct.pack("<f", value)


def f_bytes(field: int, payload: bytes) -> bytes:
    """A length-delimited field: bytes, string (give it encoded) or an embedded message."""
    return _key(field, 2) + varint(len(payload)) + bytes(payload)


def f_string(field: int, text: str) -> bytes:
    return f_bytes(field, text.encode("utf-8"))


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

    def network_value(self) -> int:
        if self.network is not None:
            return self.network
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
              bias_mean: float = 0.0) -> bytes:
        return (f_bytes(wfield, self.layer(name_w, self.normal((out_n, in_n), 0.5 / np.sqrt(in_n))))
                + f_bytes(bfield, self.layer(name_b, self.normal(out_n, 0.1) + np.float32(bias_mean))))

    def bn_bias(self) -> bool:
        # old nets keep a conv bias next to BN; newer ones usually have none (betas instead)
        return self.spec.old_bn

    def weights_message(self) -> bytes:
        s = self.spec
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
        elif s.policy == "attention":   # on a residual tower: T60-T78's head (no policy encoder layers)
            E, D = s.policy_embedding, s.policy_d_model
            msg += self.dense(4, 5, "ip_pol_w", "ip_pol_b", E, F)
            msg += self.dense(17, 18, "ip2_pol_w", "ip2_pol_b", D, E)
            msg += self.dense(19, 20, "ip3_pol_w", "ip3_pol_b", D, E)
            msg += f_bytes(22, self.layer("ip4_pol_w", self.normal((4, D), 0.5 / np.sqrt(D))))
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


def reference_forward(weights: Dict[str, np.ndarray], spec: Lc0Spec, planes: np.ndarray
                      ) -> Tuple[np.ndarray, np.ndarray, Optional[np.ndarray]]:
    """(policy logits [N,1858], WDL probabilities [N,3], moves left [N] or None), in float64.

    ``planes`` [N,112,8,8] are used exactly as given.  A classical value head's
    tanh value v is reported as the WDL ((1+v)/2, 0, (1-v)/2).
    """
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
    elif "ip2_pol_w" in weights:      # attention policy head
        policy = _attention_policy(weights, x)
    else:
        p = _act(conv_block(weights, "policy", x), act)
        policy = _dense(weights, "ip_pol_w", "ip_pol_b", p.reshape(n, -1))

    v = _act(conv_block(weights, "value", x), act).reshape(n, -1)
    v = _act(_dense(weights, "ip1_val_w", "ip1_val_b", v), act)
    v = _dense(weights, "ip2_val_w", "ip2_val_b", v)
    if v.shape[1] == 3:
        wdl = _softmax(v)
    else:
        t = np.tanh(v[:, 0])
        wdl = np.stack([(1.0 + t) / 2.0, np.zeros_like(t), (1.0 - t) / 2.0], axis=1)

    mlh = None
    if "moves_left.weights" in weights:
        m = _act(conv_block(weights, "moves_left", x), act).reshape(n, -1)
        m = _act(_dense(weights, "ip1_mov_w", "ip1_mov_b", m), act)
        mlh = np.maximum(_dense(weights, "ip2_mov_w", "ip2_mov_b", m)[:, 0], 0.0)
    return policy, wdl, mlh


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


def _attention_policy(weights: Dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    """lc0's attention policy on a residual tower (network_blas.cc): each square's features, a
    SELU embedding, queries and keys, their scaled products as from-to logits; promotions add a
    per-piece offset from the 8th rank's keys (the 4th offset is shared by all three)."""
    n, c = x.shape[:2]
    squares = x.reshape(n, c, 64).transpose(0, 2, 1)                     # [N, 64, C], a1..h8
    emb = _selu(squares @ weights["ip_pol_w"].T.astype(np.float64) + weights["ip_pol_b"])
    q = emb @ weights["ip2_pol_w"].T.astype(np.float64) + weights["ip2_pol_b"]
    k = emb @ weights["ip3_pol_w"].T.astype(np.float64) + weights["ip3_pol_b"]
    logits = q @ k.transpose(0, 2, 1) / np.sqrt(q.shape[-1])              # [N, from, to]
    offsets = k[:, 56:64] @ weights["ip4_pol_w"].T.astype(np.float64)    # [N, to file, 4]
    offsets = offsets[:, :, :3] + offsets[:, :, 3:]
    promotions = logits[:, 48:56, 56:64, None] + offsets[:, None, :, :]   # [N, from file, to file, q/r/b]
    flat = np.concatenate([logits.reshape(n, 4096), promotions.reshape(n, 192)], axis=1)
    return flat[:, _attention_square_index()]


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

#: Maia 1100: a real network that lc0's own trainer wrote (6x64, SE, convolutional policy, WDL, no
#: moves-left head). GPL-3.0, so never in the repository: an extra where a user has it.
MAIA = Lc0Fixture("maia-1100", MAIA_DIR, Lc0Spec(blocks=6, filters=64, se=True, se_channels=8),
                  "lc0 network 6x64 SE, classical 112-plane input, convolution policy, WDL value, "
                  "no moves-left head, ReLU; trained 400000 steps",
                  extra="Maia 1100 is a real lc0 network (GPL-3.0, so not in the repository): get "
                        "maia_weights/maia-1100.pb.gz from CSSLab's maia-chess repository, make lc0's outputs "
                        "for it with `docs/recipes/lc0-fixture.py --lc0 LC0 --evaluate maia-1100.pb.gz`, and "
                        "put the three files there or name their folder in CYZERO_MAIA_DIR")


#: Every fixture with lc0's own evaluation: the residual ones with their lc0 export, and the
#: attention-policy one (not exported by lc0 v0.32.1, nor by cyzero's trainer).
EVALUATED_BY_LC0 = (CYZERO, MAIA, ATTENTION_POLICY)


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


def lc0_evaluations(lc0: str, weights: str, fens: List[str]) -> List[dict]:
    """lc0's own evaluation of each position at one node (``go nodes 1`` with VerboseMoveStats):
    {"fen", "v", "d", "m" (0 without a moves-left head), "moves": {uci: {"index", "p"}}}. Each ``go``
    is answered before the next position is sent (lc0 searches in the background)."""
    proc = subprocess.Popen([lc0, f"--weights={weights}", "--backend=eigen", "--threads=1"],
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


__all__: List[str] = [
    "ACTIVATIONS", "ATTENTION_POLICY", "BN_EPSILON", "CYZERO", "EVALUATED_BY_LC0", "ENCODINGS", "LC0_TOLERANCE", "Lc0Fixture", "Lc0Spec", "MAGIC",
    "MAIA", "POLICY_MAP", "assert_plays_as_lc0", "conv2d", "conv_block", "fixture_params",
    "lc0_evaluations", "shares",
    "encode_layer", "f_bytes", "f_fixed32", "f_float", "f_string", "f_varint", "format_message", "make_lc0",
    "random_planes", "reference_forward", "truncated", "varint", "wrap_onnx", "write_bytes", "write_lc0",
    "wrong_magic",
]
