"""cyzero networks as lc0 weight files: ``cyzero-train export --lc0``.

:func:`lc0_file_bytes` writes a :class:`trainer.model.Net` as lc0's ``pblczero.Net`` message
(``proto/net.proto`` of lc0's ``lczero-common``; its field numbers and the encoding are the
engine's codec's, :mod:`engine.lc0_proto`), laid out as lc0's own trainer lays out its
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
from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from engine import lc0_proto as pb
from engine.lc0 import BN_EPSILON, CONV_POLICY_PLANES as LC0_POLICY_PLANES, Lc0Net, read_lc0
from engine.lc0_proto import fixed32, length_delimited, uint
from trainer.atomic import atomic_write_with_sha256
from trainer.model import RULE50_PLANE, ConvBN, Net, rule50_scale

__all__: Sequence[str] = [
    "LC0_FILE_PARITY", "Lc0ExportError", "Lc0FileParityError", "lc0_file_bytes", "write_lc0", "check_lc0_file",
]

#: How close the written file's graph (:func:`engine.lc0_onnx.lc0_to_onnx`) must be to the PyTorch
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


def _layer(values: np.ndarray | torch.Tensor) -> bytes:
    """A LINEAR16 ``Layer`` message of ``values`` (:func:`engine.lc0_proto.linear16_layer`), in float64."""
    flat = np.asarray(values.detach().cpu().numpy() if isinstance(values, torch.Tensor) else values,
                      dtype=np.float64).ravel()
    if not np.isfinite(flat).all():
        raise Lc0ExportError("a layer holds NaN or infinite weights")
    return pb.linear16_layer(flat)


# --------------------------------------------------------------------------- the network


def _conv_bn_block(module: ConvBN, weight: torch.Tensor | None = None) -> bytes:
    """A conv + batch norm pair as lc0's ConvBlock: weights, bn_means, bn_stddivs (lc0 reads
    variances there), bn_gammas, bn_betas.

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
    C = pb.ConvBlock
    return (length_delimited(C.WEIGHTS, _layer(w / magnitude[:, None, None, None]))
            + length_delimited(C.BN_MEANS, _layer(np.zeros(len(gamma))))
            + length_delimited(C.BN_STDDIVS, _layer(np.full(len(gamma), 1.0 - BN_EPSILON)))
            + length_delimited(C.BN_GAMMAS, _layer(gamma))
            + length_delimited(C.BN_BETAS, _layer(beta)))


def _conv_policy_block(net: Net) -> bytes:
    """cyzero's 73-plane policy convolution as lc0's 80-plane one (weights and biases)."""
    from trainer.lc0_import import conv_policy_planes

    conv = net.policy.conv2
    planes = conv_policy_planes()
    w = np.zeros((LC0_POLICY_PLANES, *conv.weight.shape[1:]), np.float64)
    b = np.zeros(LC0_POLICY_PLANES, np.float64)
    w[planes] = conv.weight.detach().double().numpy()
    b[planes] = conv.bias.detach().double().numpy()
    return length_delimited(pb.ConvBlock.WEIGHTS, _layer(w)) + length_delimited(pb.ConvBlock.BIASES, _layer(b))


def _weights(net: Net, moves_left: bool) -> bytes:
    """The ``Weights`` message of a residual tower."""
    c, W, R, SE = net.config, pb.Weights, pb.Residual, pb.SEunit
    stem = net.stem[0].weight.detach().double().clone()
    stem[:, RULE50_PLANE] *= rule50_scale(c)  # lc0 feeds the rule50 plane as the input format says
    out = length_delimited(W.INPUT, _conv_bn_block(net.stem, stem))
    for block in net.blocks:
        residual = (length_delimited(R.CONV1, _conv_bn_block(block.conv1))
                    + length_delimited(R.CONV2, _conv_bn_block(block.conv2)))
        if block.se is not None:
            residual += length_delimited(R.SE, _linear(block.se.fc1, SE.W1, SE.B1)
                                         + _linear(block.se.fc2, SE.W2, SE.B2))
        out += length_delimited(W.RESIDUAL, residual)
    if c.policy_head == "conv":
        out += length_delimited(W.POLICY1, _conv_bn_block(net.policy.conv1))
        out += length_delimited(W.POLICY, _conv_policy_block(net))
    else:
        out += (length_delimited(W.POLICY, _conv_bn_block(net.policy.conv))
                + _linear(net.policy.fc, W.IP_POL_W, W.IP_POL_B))
    out += length_delimited(W.VALUE, _conv_bn_block(net.value_conv))
    out += _linear(net.value_fc1, W.IP1_VAL_W, W.IP1_VAL_B) + _linear(net.value_fc2, W.IP2_VAL_W, W.IP2_VAL_B)
    if moves_left:
        out += length_delimited(W.MOVES_LEFT, _conv_bn_block(net.mlh_conv))
        out += _linear(net.mlh_fc1, W.IP1_MOV_W, W.IP1_MOV_B) + _linear(net.mlh_fc2, W.IP2_MOV_W, W.IP2_MOV_B)
    return out


def _linear(module: nn.Linear, w_field: int, b_field: int | None = None, weight: torch.Tensor | None = None) -> bytes:
    """A dense layer's weights [out, in] (and biases) at its two fields."""
    out = length_delimited(w_field, _layer(module.weight if weight is None else weight))
    return out + (length_delimited(b_field, _layer(module.bias)) if b_field is not None else b"")


def _norm_fields(ln: nn.LayerNorm, g_field: int, b_field: int) -> bytes:
    return length_delimited(g_field, _layer(ln.weight)) + length_delimited(b_field, _layer(ln.bias))


def _ffn(dense1: nn.Linear, dense2: nn.Linear) -> bytes:
    """An FFN message."""
    F = pb.FFN
    return _linear(dense1, F.DENSE1_W, F.DENSE1_B) + _linear(dense2, F.DENSE2_W, F.DENSE2_B)


def _encoder_layer(layer) -> bytes:
    """An EncoderLayer: its MHA (q, k, v, dense, smolgen), ln1, FFN, ln2."""
    M, S, E = pb.MHA, pb.Smolgen, pb.EncoderLayer
    mha = (_linear(layer.q, M.Q_W, M.Q_B) + _linear(layer.k, M.K_W, M.K_B) + _linear(layer.v, M.V_W, M.V_B)
           + _linear(layer.out, M.DENSE_W, M.DENSE_B))
    sg = layer.smolgen
    if sg is not None:
        mha += length_delimited(M.SMOLGEN, _linear(sg.compress, S.COMPRESS) + _linear(sg.dense1, S.DENSE1_W, S.DENSE1_B)
                                + _norm_fields(sg.ln1, S.LN1_GAMMAS, S.LN1_BETAS)
                                + _linear(sg.dense2, S.DENSE2_W, S.DENSE2_B)
                                + _norm_fields(sg.ln2, S.LN2_GAMMAS, S.LN2_BETAS))
    return (length_delimited(E.MHA, mha) + _norm_fields(layer.ln1, E.LN1_GAMMAS, E.LN1_BETAS)
            + length_delimited(E.FFN, _ffn(layer.ffn1, layer.ffn2))
            + _norm_fields(layer.ln2, E.LN2_GAMMAS, E.LN2_BETAS))


def _body_weights(net: Net, moves_left: bool) -> bytes:
    """An attention body's ``Weights`` as BT3/BT4 files hold them (network format 7: the PE-dense
    embedding, ``ValueHeads`` with ``winner``, ``PolicyHeads`` with ``vanilla`` and the shared
    policy embedding). The rule50 input's embedding weights are divided by 100, as the stem's are."""
    b, W, P, V = net.body, pb.Weights, pb.PolicyHead, pb.ValueHead
    emb = b.embedding.weight.detach().double().clone()
    emb[:, RULE50_PLANE] *= rule50_scale(net.config)
    out = (_linear(b.preproc, W.IP_EMB_PREPROC_W, W.IP_EMB_PREPROC_B) + _linear(b.embedding, W.IP_EMB_W, weight=emb)
           + length_delimited(W.IP_EMB_B, _layer(b.embedding.bias))
           + _norm_fields(b.embedding_ln, W.IP_EMB_LN_GAMMAS, W.IP_EMB_LN_BETAS)
           + length_delimited(W.IP_MULT_GATE, _layer(b.mult_gate.T))
           + length_delimited(W.IP_ADD_GATE, _layer(b.add_gate.T))
           + length_delimited(W.IP_EMB_FFN, _ffn(b.ffn1, b.ffn2))
           + _norm_fields(b.ffn_ln, W.IP_EMB_FFN_LN_GAMMAS, W.IP_EMB_FFN_LN_BETAS))
    for layer in b.encoders:
        out += length_delimited(W.ENCODER, _encoder_layer(layer))
    out += uint(W.HEADCOUNT, net.config.heads)
    if b.generator is not None:
        out += length_delimited(W.SMOLGEN_W, _layer(b.generator.weight))
    p = net.policy
    vanilla = (_linear(p.wq, P.IP2_POL_W, P.IP2_POL_B) + _linear(p.wk, P.IP3_POL_W, P.IP3_POL_B)
               + length_delimited(P.IP4_POL_W, _layer(p.promotion.weight)))
    out += length_delimited(W.POLICY_HEADS, _linear(p.embedding, pb.PolicyHeads.IP_POL_W, pb.PolicyHeads.IP_POL_B)
                            + length_delimited(pb.PolicyHeads.VANILLA, vanilla))
    winner = (_linear(net.value_embedding, V.IP_VAL_W, V.IP_VAL_B) + _linear(net.value_fc1, V.IP1_VAL_W, V.IP1_VAL_B)
              + _linear(net.value_fc2, V.IP2_VAL_W, V.IP2_VAL_B))
    out += length_delimited(W.VALUE_HEADS, length_delimited(pb.ValueHeads.WINNER, winner))
    if moves_left:
        out += (_linear(net.mlh_embedding, W.IP_MOV_W, W.IP_MOV_B) + _linear(net.mlh_fc1, W.IP1_MOV_W, W.IP1_MOV_B)
                + _linear(net.mlh_fc2, W.IP2_MOV_W, W.IP2_MOV_B))
    return out


def _body_network_format(net: Net, moves_left: bool) -> bytes:
    c, NF = net.config, pb.NetworkFormat
    return (uint(NF.INPUT, c.input_format)
            + uint(NF.OUTPUT, 2)                  # OUTPUT_WDL
            + uint(NF.NETWORK, 7)                 # NETWORK_ATTENTIONBODY_WITH_MULTIHEADFORMAT
            + uint(NF.POLICY, 3)                  # POLICY_ATTENTION
            + uint(NF.VALUE, 2)                   # VALUE_WDL
            + uint(NF.MOVES_LEFT, 1 if moves_left else 0)
            + (uint(NF.DEFAULT_ACTIVATION, 1) if c.activation == "mish" else b"")   # DEFAULT_ACTIVATION_MISH
            + uint(NF.SMOLGEN_ACTIVATION, pb.FUNCTION_NUMBERS["swish"])
            + uint(NF.FFN_ACTIVATION, pb.FUNCTION_NUMBERS[c.ffn_activation])
            + uint(NF.INPUT_EMBEDDING, 2))        # INPUT_EMBEDDING_PE_DENSE


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
    NF, N, V = pb.NetworkFormat, pb.Net, pb.EngineVersion
    if c.body == "attention":
        network_format = _body_network_format(net, moves_left)
    else:
        network_format = (
            uint(NF.INPUT, c.input_format)
            + uint(NF.OUTPUT, 2)                                    # OUTPUT_WDL
            + uint(NF.NETWORK, 4 if c.se else 3)                    # NETWORK_SE / CLASSICAL_WITH_HEADFORMAT
            + uint(NF.POLICY, 2 if c.policy_head == "conv" else 1)  # POLICY_CONVOLUTION / CLASSICAL
            + uint(NF.VALUE, 2)                                     # VALUE_WDL
            + uint(NF.MOVES_LEFT, 1 if moves_left else 0)
            + (uint(NF.DEFAULT_ACTIVATION, 1) if c.activation == "mish" else b""))  # DEFAULT_ACTIVATION_MISH
    fmt = uint(pb.Format.WEIGHTS_ENCODING, pb.LINEAR16) + length_delimited(pb.Format.NETWORK_FORMAT, network_format)
    major, minor, patch = _min_version(net, moves_left)
    message = (fixed32(N.MAGIC, pb.MAGIC)
               + (length_delimited(N.LICENSE, license.encode("utf-8")) if license else b"")
               + length_delimited(N.MIN_VERSION, uint(V.MAJOR, major) + uint(V.MINOR, minor) + uint(V.PATCH, patch))
               + length_delimited(N.FORMAT, fmt))
    with torch.no_grad():
        weights = _body_weights(net, moves_left) if c.body == "attention" else _weights(net, moves_left)
        return message + length_delimited(N.WEIGHTS, weights)


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
