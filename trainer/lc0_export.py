"""cyzero networks as lc0 weight files: ``cyzero-train export --lc0``.

:func:`lc0_file_bytes` writes a :class:`trainer.model.Net` as lc0's ``pblczero.Net`` message
(``proto/net.proto`` of lc0's ``lczero-common``), laid out as lc0's own trainer lays out its
classical networks (Maia's files are the model): every convolution followed by batch norm is a
``ConvBlock`` with ``weights``, ``bn_means``, ``bn_stddivs`` (lc0 reads variances there),
``bn_gammas`` and ``bn_betas``; a convolution with a bias of its own (the conv policy head's
last) has ``weights`` and ``biases``; dense layers are ``Layer`` pairs [out, in] and [out].
:func:`write_lc0` gzips it and writes it atomically.

An attention body (``bt-...``) is written as Leela's BT3/BT4 files are: network format 7 (multihead)
with the PE-dense embedding, one value head (``winner``) and one policy head (``vanilla``) with the
shared policy embedding, smolgen's global weights, Mish, smolgen swish, the FFN's activation.

Where cyzero's network differs from lc0's layout, the writer converts exactly or refuses:

* The rule50 plane: cyzero's graph divides it by 100 before the stem, lc0 feeds the raw
  count, so the stem's weights on that plane are divided by 100 (:mod:`trainer.lc0_import`
  multiplies them back).
* The conv policy head: cyzero's 73 planes go to the lc0 planes that hold the same moves
  (:func:`trainer.lc0_import.conv_policy_planes`: lc0 orders the promotion planes r, b, q,
  cyzero q, r, b); lc0's seven unused planes 73..79 get zero weights and biases.
* Batch norm epsilon: lc0 folds with 1e-5; a batch norm with another epsilon has its
  variance shifted by the difference, which computes the same.
* Moves-left: lc0's head ends in ReLU, cyzero's in softplus. A network whose head ends in
  softplus is refused with one line unless the head is left out (``include_moves_left``);
  one imported from lc0 (ReLU) is written as it is.
* The value head is always WDL (cyzero's is; a single-value lc0 net imported into cyzero
  became WDL logits).

Weights are encoded LINEAR16 (uint16 scaled into each layer's [min, max]): it is what lc0's
trainer writes and the only encoding lc0's releases read (v0.32.1 refuses any other
``weights_encoding`` and reads a layer's bytes as uint16 whatever the layer says). The file is
read back with :func:`engine.lc0.read_lc0` and its graph compared with the PyTorch network
(:func:`check_lc0_file`) before ``export --lc0`` keeps it.
"""

from __future__ import annotations

import gzip
import os
import struct
from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from engine.lc0 import BN_EPSILON, CONV_POLICY_PLANES as LC0_POLICY_PLANES, MAGIC, Lc0Net, read_lc0
from trainer.atomic import atomic_write_with_sha256
from trainer.model import RULE50_PLANE, ConvBN, Net, rule50_scale

__all__: Sequence[str] = [
    "LC0_FILE_PARITY", "Lc0ExportError", "Lc0FileParityError", "lc0_file_bytes", "write_lc0", "check_lc0_file",
]

#: net.proto's ``Format.Encoding`` LINEAR16.
LINEAR16 = 1

#: How close the written file's graph (:func:`engine.lc0.lc0_to_onnx`) must be to the PyTorch
#: network: policy logits and WDL probabilities, max absolute difference (LINEAR16 rounds each
#: weight to 1/65535 of its layer's range, and the rounding adds up block by block: the 6x64
#: bundled until stage 7 stayed within 8e-3 and 2.2e-3, the 10x64 of stage 8 measures 1.1e-2 and
#: 5.5e-3 on 256 random positions, WDL 1.0e-2 on the lc0 tests' 32. A broken layout is off by
#: tenths; a WDL probability off by a percent is nothing a search can feel).
LC0_FILE_PARITY = {"policy": 5e-2, "wdl": 2e-2, "mlh": 5e-2}


class Lc0ExportError(ValueError):
    """A network the lc0 format cannot hold as it is; the message is one line."""


class Lc0FileParityError(Lc0ExportError):
    """The written file, read back, does not compute what the network computes."""


# --------------------------------------------------------------------------- protobuf wire format


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _tag(number: int, wire_type: int) -> bytes:
    return _varint(number << 3 | wire_type)


def _uint(number: int, value: int) -> bytes:
    return _tag(number, 0) + _varint(value)


def _fixed32(number: int, value: int) -> bytes:
    return _tag(number, 5) + struct.pack("<I", value)


def _float32(number: int, value: float) -> bytes:
    return _tag(number, 5) + struct.pack("<f", value)


def _length_delimited(number: int, payload: bytes) -> bytes:
    return _tag(number, 2) + _varint(len(payload)) + payload


def _layer(values: np.ndarray | torch.Tensor) -> bytes:
    """A LINEAR16 ``Layer`` message (min_val 1, max_val 2, params 3) of ``values``, row-major:
    each value as round((v - min) / (max - min) * 65535)."""
    flat = np.asarray(values.detach().cpu().numpy() if isinstance(values, torch.Tensor) else values,
                      dtype=np.float64).ravel()
    if not np.isfinite(flat).all():
        raise Lc0ExportError("a layer holds NaN or infinite weights")
    lo, hi = np.float32(flat.min()), np.float32(flat.max())
    span = float(hi) - float(lo)
    q = np.rint((flat - float(lo)) / span * 65535.0) if span > 0 else np.zeros_like(flat)
    params = np.clip(q, 0, 65535).astype("<u2").tobytes()
    return _float32(1, float(lo)) + _float32(2, float(hi)) + _length_delimited(3, params)


# --------------------------------------------------------------------------- the network


def _conv_bn_block(module: ConvBN, weight: torch.Tensor | None = None) -> bytes:
    """A conv + batch norm pair as lc0's ConvBlock: weights 1, bn_means 3, bn_stddivs 4 (lc0 reads
    variances there), bn_gammas 5, bn_betas 6.

    Written in the form that keeps the most precision in 16 bits, computing the same in eval
    mode: each output channel's weights scaled to a largest magnitude of 1 (a layer's LINEAR16
    range is then no wider than one channel's), the channel's scale and the batch norm's
    statistics moved into gamma and beta, means 0 and variances ``1 - eps`` (constant layers,
    which LINEAR16 holds exactly, so lc0's fold ``gamma / sqrt(var + eps)`` is gamma itself).
    """
    conv, bn = module[0], module[1]
    if conv.bias is not None:
        raise Lc0ExportError("a convolution before batch norm has a bias of its own, which lc0's layout has not")
    w = (conv.weight if weight is None else weight).detach().double()
    variance = bn.running_var.double()
    if not (variance + bn.eps > 0).all():
        raise Lc0ExportError("a batch norm's variance is not positive")
    bn_scale = bn.weight.double() / torch.sqrt(variance + bn.eps)
    magnitude = w.abs().flatten(1).amax(dim=1)
    magnitude = torch.where(magnitude > 0, magnitude, torch.ones_like(magnitude))
    gamma = bn_scale * magnitude
    beta = bn.bias.double() - bn_scale * bn.running_mean.double()
    return (_length_delimited(1, _layer(w / magnitude[:, None, None, None]))
            + _length_delimited(3, _layer(np.zeros(len(gamma))))
            + _length_delimited(4, _layer(np.full(len(gamma), 1.0 - BN_EPSILON)))
            + _length_delimited(5, _layer(gamma))
            + _length_delimited(6, _layer(beta)))




def _conv_policy_block(net: Net) -> bytes:
    """cyzero's 73-plane policy convolution as lc0's 80-plane one (weights 1, biases 2)."""
    from trainer.lc0_import import conv_policy_planes

    conv = net.policy.conv2
    planes = conv_policy_planes()
    w = np.zeros((LC0_POLICY_PLANES, *conv.weight.shape[1:]), np.float64)
    b = np.zeros(LC0_POLICY_PLANES, np.float64)
    w[planes] = conv.weight.detach().double().numpy()
    b[planes] = conv.bias.detach().double().numpy()
    return _length_delimited(1, _layer(w)) + _length_delimited(2, _layer(b))


def _weights(net: Net, moves_left: bool) -> bytes:
    """The ``Weights`` message (net.proto's field numbers)."""
    c = net.config
    stem = net.stem[0].weight.detach().double().clone()
    stem[:, RULE50_PLANE] *= rule50_scale(c)  # lc0 feeds the rule50 plane as the input format says
    out = _length_delimited(1, _conv_bn_block(net.stem, stem))
    for block in net.blocks:
        residual = _length_delimited(1, _conv_bn_block(block.conv1)) + _length_delimited(2, _conv_bn_block(block.conv2))
        if block.se is not None:
            residual += _length_delimited(3, _linear(block.se.fc1, 1, 2) + _linear(block.se.fc2, 3, 4))
        out += _length_delimited(2, residual)
    if c.policy_head == "conv":
        out += _length_delimited(11, _conv_bn_block(net.policy.conv1))
        out += _length_delimited(3, _conv_policy_block(net))
    else:
        out += _length_delimited(3, _conv_bn_block(net.policy.conv)) + _linear(net.policy.fc, 4, 5)
    out += _length_delimited(6, _conv_bn_block(net.value_conv))
    out += _linear(net.value_fc1, 7, 8) + _linear(net.value_fc2, 9, 10)
    if moves_left:
        out += _length_delimited(12, _conv_bn_block(net.mlh_conv))
        out += _linear(net.mlh_fc1, 13, 14) + _linear(net.mlh_fc2, 15, 16)
    return out


#: net.proto's ActivationFunction numbers of the attention body's activations.
_FUNCTION_NUMBERS = {"mish": 1, "relu": 2, "selu": 6, "swish": 7, "relu2": 8}


def _linear(module: nn.Linear, w_field: int, b_field: int | None = None, weight: torch.Tensor | None = None) -> bytes:
    """A dense layer's weights [out, in] (and biases) at its two fields."""
    out = _length_delimited(w_field, _layer(module.weight if weight is None else weight))
    return out + (_length_delimited(b_field, _layer(module.bias)) if b_field is not None else b"")


def _norm_fields(ln: nn.LayerNorm, g_field: int, b_field: int) -> bytes:
    return _length_delimited(g_field, _layer(ln.weight)) + _length_delimited(b_field, _layer(ln.bias))


def _ffn(dense1: nn.Linear, dense2: nn.Linear) -> bytes:
    """An FFN message: dense1_w 1, dense1_b 2, dense2_w 3, dense2_b 4."""
    return _linear(dense1, 1, 2) + _linear(dense2, 3, 4)


def _encoder_layer(layer) -> bytes:
    """An EncoderLayer: mha 1 (q, k, v, dense at 1-8, smolgen 9), ln1 2-3, ffn 4, ln2 5-6."""
    mha = _linear(layer.q, 1, 2) + _linear(layer.k, 3, 4) + _linear(layer.v, 5, 6) + _linear(layer.out, 7, 8)
    sg = layer.smolgen
    if sg is not None:
        mha += _length_delimited(9, _linear(sg.compress, 1) + _linear(sg.dense1, 2, 3) + _norm_fields(sg.ln1, 4, 5)
                                 + _linear(sg.dense2, 6, 7) + _norm_fields(sg.ln2, 8, 9))
    return (_length_delimited(1, mha) + _norm_fields(layer.ln1, 2, 3) + _length_delimited(4, _ffn(layer.ffn1, layer.ffn2))
            + _norm_fields(layer.ln2, 5, 6))


def _body_weights(net: Net, moves_left: bool) -> bytes:
    """An attention body's ``Weights`` as BT3/BT4 files hold them (network format 7: the PE-dense
    embedding, ``ValueHeads`` with ``winner``, ``PolicyHeads`` with ``vanilla`` and the shared
    policy embedding). The rule50 input's embedding weights are divided by 100, as the stem's are."""
    b = net.body
    emb = b.embedding.weight.detach().double().clone()
    emb[:, RULE50_PLANE] *= rule50_scale(net.config)
    out = (_linear(b.preproc, 37, 38) + _linear(b.embedding, 25, weight=emb)
           + _length_delimited(26, _layer(b.embedding.bias)) + _norm_fields(b.embedding_ln, 39, 40)
           + _length_delimited(33, _layer(b.mult_gate.T)) + _length_delimited(34, _layer(b.add_gate.T))
           + _length_delimited(41, _ffn(b.ffn1, b.ffn2)) + _norm_fields(b.ffn_ln, 42, 43))
    for layer in b.encoders:
        out += _length_delimited(27, _encoder_layer(layer))
    out += _uint(28, net.config.heads)
    if b.generator is not None:
        out += _length_delimited(35, _layer(b.generator.weight))
    p = net.policy
    vanilla = _linear(p.wq, 3, 4) + _linear(p.wk, 5, 6) + _length_delimited(7, _layer(p.promotion.weight))
    out += _length_delimited(45, _linear(p.embedding, 1, 2) + _length_delimited(3, vanilla))
    winner = _linear(net.value_embedding, 1, 2) + _linear(net.value_fc1, 3, 4) + _linear(net.value_fc2, 5, 6)
    out += _length_delimited(44, _length_delimited(1, winner))
    if moves_left:
        out += _linear(net.mlh_embedding, 31, 32) + _linear(net.mlh_fc1, 13, 14) + _linear(net.mlh_fc2, 15, 16)
    return out


def _body_network_format(net: Net, moves_left: bool) -> bytes:
    c = net.config
    return (_uint(1, c.input_format)         # the planes' InputFormat
            + _uint(2, 2)                    # OUTPUT_WDL
            + _uint(3, 7)                    # NETWORK_ATTENTIONBODY_WITH_MULTIHEADFORMAT
            + _uint(4, 3)                    # POLICY_ATTENTION
            + _uint(5, 2)                    # VALUE_WDL
            + _uint(6, 1 if moves_left else 0)
            + (_uint(7, 1) if c.activation == "mish" else b"")   # DEFAULT_ACTIVATION_MISH
            + _uint(8, _FUNCTION_NUMBERS["swish"])               # smolgen
            + _uint(9, _FUNCTION_NUMBERS[c.ffn_activation])
            + _uint(10, 2))                  # INPUT_EMBEDDING_PE_DENSE


def _min_version(net: Net, moves_left: bool) -> tuple[int, int, int]:
    """The oldest lc0 that runs the file: conv policy and WDL need 0.21 (Maia's files say so),
    a moves-left head 0.26, Mish 0.28."""
    if net.config.body == "attention":
        return (0, 30, 0)    # BT3/BT4's format: multihead, PE dense, smolgen
    version = (0, 21, 0)
    for needed, minimum in ((moves_left, (0, 26, 0)), (net.config.activation == "mish", (0, 28, 0))):
        if needed:
            version = max(version, minimum)
    return version


def lc0_file_bytes(net: Net, include_moves_left: bool | None = None, license: str = "") -> bytes:
    """``net`` as an uncompressed lc0 ``Net`` message; see the module doc for the layout.

    ``include_moves_left``: None writes the moves-left head when lc0 can run it as it is (a
    ReLU output) and refuses a softplus one; False leaves it out; True insists on it.
    :class:`Lc0ExportError` (one line) for what the lc0 format cannot hold.
    """
    c = net.config
    if c.activation not in ("relu", "mish"):
        raise Lc0ExportError(f"the activation {c.activation!r}: lc0's files hold ReLU or Mish networks")
    moves_left = c.moves_left if include_moves_left is None else bool(include_moves_left)
    if moves_left and not c.moves_left:
        raise Lc0ExportError("the network has no moves-left head to write")
    if moves_left and c.mlh_activation != "relu":
        raise Lc0ExportError(f"its moves-left head ends in {c.mlh_activation}, lc0's in ReLU, so lc0 would read "
                             "other moves-left values: leave the head out (--no-mlh)")
    if c.body == "attention":
        network_format = _body_network_format(net, moves_left)
    else:
        network_format = (_uint(1, c.input_format)         # the planes' InputFormat
                          + _uint(2, 2)                    # OUTPUT_WDL
                          + _uint(3, 4 if c.se else 3)     # NETWORK_SE_WITH_HEADFORMAT / CLASSICAL_WITH_HEADFORMAT
                          + _uint(4, 2 if c.policy_head == "conv" else 1)  # POLICY_CONVOLUTION / CLASSICAL
                          + _uint(5, 2)                    # VALUE_WDL
                          + _uint(6, 1 if moves_left else 0)
                          + (_uint(7, 1) if c.activation == "mish" else b""))  # DEFAULT_ACTIVATION_MISH
    fmt = _uint(1, LINEAR16) + _length_delimited(2, network_format)
    major, minor, patch = _min_version(net, moves_left)
    message = (_fixed32(1, MAGIC)
               + (_length_delimited(2, license.encode("utf-8")) if license else b"")
               + _length_delimited(3, _uint(1, major) + _uint(2, minor) + _uint(3, patch))
               + _length_delimited(4, fmt))
    with torch.no_grad():
        weights = _body_weights(net, moves_left) if c.body == "attention" else _weights(net, moves_left)
        return message + _length_delimited(10, weights)


def write_lc0(net: Net, path: str | os.PathLike, message: bytes | None = None, **options) -> str:
    """``message`` (default :func:`lc0_file_bytes` of ``net`` with ``options``), gzipped as lc0's
    networks are published, written atomically to ``path`` with its ``.sha256`` side file (the
    engine's hot-swap contract); returns the digest."""
    if message is None:
        message = lc0_file_bytes(net, **options)
    return atomic_write_with_sha256(path, gzip.compress(message, compresslevel=9, mtime=0))


def _without_moves_left(net: Net) -> Net:
    """A copy of ``net`` without its moves-left head (what a file written without it computes)."""
    import dataclasses

    copy = Net(dataclasses.replace(net.config, moves_left=False), seed=0)
    copy.load_state_dict({k: v for k, v in net.state_dict().items() if not k.startswith("mlh_")})
    return copy.eval()


def check_lc0_file(net: Net, message: bytes, planes: np.ndarray, masks: np.ndarray | None = None,
                   name: str = "the written file") -> tuple[Lc0Net, dict]:
    """Read ``message`` back as lc0's reader does (:func:`engine.lc0.read_lc0`) and compare its
    graph with ``net`` on ``planes`` (:func:`trainer.lc0_import.compare_with_lc0`); Lc0ExportError
    when a figure is outside :data:`LC0_FILE_PARITY`. Returns what was read and
    the figures."""
    from trainer.lc0_import import compare_with_lc0, parity_failures

    lc0net = read_lc0(message, name)
    has_head = lc0net.body.moves_left is not None if lc0net.body is not None else lc0net.weights.moves_left
    if net.config.moves_left and not has_head:  # the head was left out
        net = _without_moves_left(net)
    numbers = compare_with_lc0(net, lc0net, planes, masks)
    failures = parity_failures(numbers, LC0_FILE_PARITY)
    if failures:
        raise Lc0FileParityError(f"{name} read back disagrees with the network over {numbers['positions']} positions: "
                             + "; ".join(failures))
    return lc0net, numbers
