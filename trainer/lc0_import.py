"""lc0 network files as cyzero PyTorch networks: ``export --from-lc0`` and ``--init-from``.

:func:`net_from_lc0` rebuilds a :class:`trainer.model.Net` from an lc0 weights file read by
:func:`engine.lc0.read_lc0_file` (lc0's classical residual family: SE or plain blocks, ReLU or
Mish, convolutional or classical policy, WDL or single value, with or without moves-left),
computing what :func:`engine.lc0_onnx.lc0_to_onnx`'s graph computes (:func:`compare_with_lc0`
measures it). How each part maps:

* Batch norm. lc0's file has it folded into the convolutions (``engine.lc0`` folds it); each
  of cyzero's conv + batch norm pairs gets the folded weight in the convolution and a batch
  norm that is the identity plus the folded bias in eval mode: weight 1, bias ``b``, running
  mean 0, running variance ``1 - eps``. Training then continues from there and the batch
  norm statistics adapt; since in training mode a batch norm normalises by the batch's own
  statistics, the first steps would see a different function than the file's, so a run that
  starts from the file (``--init-from``) first calls :func:`calibrate_batch_norm`, which
  re-expresses every batch norm with the statistics of real activations, its convolution
  rescaled to give it unit-variance inputs, without changing what the network computes in
  eval mode.
* The rule50 plane: cyzero's graph divides it by 100 before the stem, lc0's does not, so the
  stem's weights on that input plane are multiplied by 100.
* The conv policy head: lc0's has 80 output planes, cyzero's 73. The 73 move planes are the
  same moves, but lc0 orders the under/promotion planes r, b, q within each direction and
  cyzero q, r, b; the permutation is derived from the two policy maps
  (:func:`conv_policy_planes`), never assumed. lc0's planes 73..79 are unused and dropped.
* lc0's classical policy head is cyzero's ``"fc"`` head (1x1 conv to C channels, linear).
* The value head: lc0's WDL head is cyzero's. A single-value (tanh) head becomes three WDL
  logits ``(x, -30, -x)`` (zero weights and bias -30 for the draw), whose softmax is
  ``W - L = tanh(x)`` and ``D`` about 1e-13: lc0's graph gives ``((1 + tanh) / 2, 0, (1 - tanh) / 2)``.
* Moves-left: lc0's head ends in ReLU, cyzero's in softplus; the imported network keeps
  lc0's (``NetConfig.mlh_activation = "relu"``), so it computes the file's moves left exactly.
* SE units, their width (``filters // se_ratio``) and the heads' widths come from the file;
  a network cyzero's :class:`~trainer.model.Net` cannot express (an SE width that is no
  ``filters // r``, blocks with and without SE mixed, an lc0 file holding an ONNX model)
  is an :class:`Lc0ImportError` with a one-line reason.

The weight loaders (:func:`load_conv_bn`, :func:`load_linear`, :func:`checked_tensor`) and the
parity check against an ONNX graph (:func:`compare_with_onnx`, :func:`parity_failures`) are
shared with :mod:`trainer.onnx_import`, which reads cyzero's own ONNX exports the same way.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from engine.lc0 import CONV_POLICY_MAP, ConvLayer, Dense, Lc0Error, Lc0Net
from engine.lc0_onnx import lc0_to_onnx
from trainer.model import (
    CONV_POLICY_PLANES, RULE50_PLANE, RULE50_SCALE, ConvBN, Net, NetConfig, policy_index_and_map, rule50_scale,
)

__all__: Sequence[str] = [
    "Lc0ImportError", "Lc0ParityError", "LC0_PARITY", "net_config_from_lc0", "net_from_lc0", "conv_policy_planes",
    "compare_with_lc0", "check_against_lc0", "calibrate_batch_norm", "compare_with_onnx", "parity_failures",
    "checked_tensor", "load_conv_bn", "load_linear",
]

#: How close the rebuilt PyTorch network must be to lc0's graph (float32 both): the max
#: absolute difference of the policy logits and of the WDL probabilities; moves-left relative
#: to its own size, ``mlh * max(1, max |moves left|)``.
LC0_PARITY = {"policy": 1e-3, "wdl": 1e-4, "mlh": 1e-4}

#: The single-value head's draw logit: softmax gives D = e^-30 / (e^x + e^-x + e^-30) < 5e-14.
_NO_DRAW_LOGIT = -30.0


class Lc0ImportError(Lc0Error):
    """An lc0 network that cyzero's PyTorch network cannot represent; the message is one line."""


class Lc0ParityError(Lc0ImportError):
    """The PyTorch network rebuilt from an lc0 file does not compute what lc0's graph computes."""


def conv_policy_planes() -> np.ndarray:
    """For each of cyzero's 73 conv policy planes, the lc0 plane (of 80) that holds the same moves.

    Derived from the two policy maps (``trainer.model.policy_index_and_map`` and
    ``engine.lc0.CONV_POLICY_MAP``, both over the 1858 moves in the same order): every move's
    from-square must be the same and every cyzero plane must come from exactly one lc0 plane.
    """
    _, ours = policy_index_and_map()
    ours = np.asarray(ours, dtype=np.int64)
    theirs = np.asarray(CONV_POLICY_MAP, dtype=np.int64)
    if theirs.shape != ours.shape:
        raise Lc0ImportError(f"lc0's conv policy map has {theirs.shape} entries, cyzero's {ours.shape}")
    if not np.array_equal(ours % 64, theirs % 64):
        raise Lc0ImportError("lc0's and cyzero's conv policy maps disagree on a move's from-square")
    planes = np.full(CONV_POLICY_PLANES, -1, dtype=np.int64)
    for mine, lc0 in zip(ours // 64, theirs // 64):
        if planes[mine] not in (-1, lc0):
            raise Lc0ImportError(f"cyzero's policy plane {mine} holds moves of lc0's planes {planes[mine]} and {lc0}")
        planes[mine] = lc0
    if (planes < 0).any() or len(set(planes.tolist())) != CONV_POLICY_PLANES:
        raise Lc0ImportError("lc0's conv policy planes are not a permutation of cyzero's 73")
    return planes


def _se_ratio(filters: int, width: int) -> int:
    for ratio in range(1, filters + 1):
        if max(1, filters // ratio) == width:
            return ratio
    raise Lc0ImportError(f"an SE unit {width} wide on {filters} filters: cyzero's SE width is filters // r "
                         f"for a whole r, and no r gives {width}")


def _body_config(net: Lc0Net) -> NetConfig:
    """The :class:`NetConfig` of an attention-body file (the structure of Leela's BT3/BT4 networks:
    trainer.model's family); :class:`Lc0ImportError` for what that family has not."""
    b = net.body
    if b.embedding != "pe_dense":
        raise Lc0ImportError("an attention body with the PE-map embedding (format 6, as Leela's BT2 and T1 "
                             "networks): cyzero's trainer has the PE-dense embedding of BT3/BT4 only")
    if b.activation not in ("relu", "mish"):
        raise Lc0ImportError(f"the default activation {b.activation!r}: cyzero has relu and mish")
    if b.ffn_activation not in ("mish", "relu", "swish", "relu2", "selu"):
        raise Lc0ImportError(f"the FFN activation {b.ffn_activation!r}, which cyzero's trainer has not")
    kinds = {e.smolgen is not None for e in b.encoders}
    if len(kinds) != 1:
        raise Lc0ImportError("encoder layers with and without smolgen: cyzero's have it in all or none")
    smolgen = kinds.pop()
    if smolgen and b.smolgen_activation != "swish":
        raise Lc0ImportError(f"smolgen with {b.smolgen_activation!r}: cyzero's smolgen is swish, as Leela's")
    policy = b.policy_heads[b.policy_head]
    if policy.encoders:
        raise Lc0ImportError(f"an attention policy with {len(policy.encoders)} encoder layers of its own, "
                             "which cyzero's trainer has not")
    value = b.value_heads[b.value_head]
    first = b.encoders[0]
    sizes = {(e.ffn1.b.size, None if e.smolgen is None else (e.smolgen.compress.shape[0], e.smolgen.dense1.b.size,
                                                             e.smolgen.dense2.b.size)) for e in b.encoders}
    if len(sizes) != 1:
        raise Lc0ImportError("encoder layers of different sizes: cyzero's are all one size")
    if any(e.q.b.size != b.width for e in b.encoders):
        raise Lc0ImportError(f"attention {first.q.b.size} wide on an embedding of {b.width}: cyzero's are one width")
    fields = dict(heads=b.heads, ffn_hidden=int(first.ffn1.b.size), ffn_activation=b.ffn_activation, smolgen=smolgen,
                  pe_channels=int(b.preproc.b.size // 64), policy_embedding=int(policy.embedding.b.size),
                  policy_d_model=int(policy.wq.b.size), value_channels=int(value.embedding.b.size),
                  value_hidden=int(value.ip1.b.size), activation=b.activation, input_format=net.input_format)
    if smolgen:
        fields.update(smolgen_channels=int(first.smolgen.compress.shape[0]), smolgen_hidden=int(first.smolgen.dense1.b.size),
                      smolgen_gen=int(first.smolgen.dense2.b.size // b.heads))
    if b.moves_left is not None:
        ip_mov, ip1_mov, _ = b.moves_left
        fields.update(moves_left=True, mlh_channels=int(ip_mov.b.size), mlh_hidden=int(ip1_mov.b.size),
                      mlh_activation="relu")
    else:
        fields["moves_left"] = False
    try:
        return NetConfig(blocks=len(b.encoders), filters=b.width, body="attention", policy_head="attention", **fields)
    except ValueError as exc:
        raise Lc0ImportError(f"cannot represent the lc0 network: {exc}") from None


def net_config_from_lc0(net: Lc0Net) -> NetConfig:
    """The :class:`NetConfig` of the network in an lc0 file; :class:`Lc0ImportError` when cyzero
    cannot represent it."""
    if net.body is not None:
        return _body_config(net)
    w = net.weights
    if w is None:
        raise Lc0ImportError("the lc0 file holds an ONNX model, not weights: cyzero can play it "
                             "but cannot rebuild a PyTorch network from it")
    filters, blocks = w.filters, w.blocks
    if blocks < 1:
        raise Lc0ImportError("an lc0 network without residual blocks: cyzero's networks have at least one")
    with_se = [r.se is not None for r in w.residual]
    if any(with_se) and not all(with_se):
        raise Lc0ImportError(f"{sum(with_se)} of the {blocks} residual blocks have SE units: cyzero's "
                             "blocks all have one or none")
    se_ratio = 4
    if all(with_se):
        widths = {r.se.b1.shape[0] for r in w.residual}
        if len(widths) != 1:
            raise Lc0ImportError(f"SE units of different widths {sorted(widths)}: cyzero's are all one width")
        se_ratio = _se_ratio(filters, widths.pop())
    if w.policy == "convolution":
        policy = {"policy_head": "conv"}
        if w.policy_conv.w.shape[0] < CONV_POLICY_PLANES:
            raise Lc0ImportError(f"a conv policy head of {w.policy_conv.w.shape[0]} planes; lc0's has 80")
    elif w.policy == "classical":
        policy = {"policy_head": "fc", "policy_channels": int(w.policy_conv.b.shape[0])}
    else:
        raise Lc0ImportError(f"an lc0 {w.policy} policy head: cyzero has convolution and classical ones")
    mlh = {"moves_left": w.mlh_conv is not None}
    if w.mlh_conv is not None:
        mlh.update(mlh_channels=int(w.mlh_conv.b.shape[0]), mlh_hidden=int(w.ip1_mov.b.shape[0]),
                   mlh_activation="relu")
    if w.activation not in ("relu", "mish"):
        raise Lc0ImportError(f"the activation {w.activation!r}: cyzero has relu and mish")
    try:
        return NetConfig(blocks=blocks, filters=filters, se_ratio=se_ratio, se=all(with_se),
                         value_channels=int(w.value_conv.b.shape[0]), value_hidden=int(w.ip1_val.b.shape[0]),
                         activation=w.activation, **policy, **mlh)
    except ValueError as exc:
        raise Lc0ImportError(f"cannot represent the lc0 network: {exc}") from None


# --------------------------------------------------------------------------- weights


def checked_tensor(array: np.ndarray, like: torch.Tensor, what: str) -> torch.Tensor:
    """``array`` as a float32 tensor to copy into ``like``; :class:`Lc0ImportError` naming ``what``
    when the shapes differ."""
    array = np.asarray(array, dtype=np.float32)
    if tuple(array.shape) != tuple(like.shape):
        raise Lc0ImportError(f"{what}: the file's weights are {list(array.shape)}, cyzero's {list(like.shape)}")
    return torch.from_numpy(np.ascontiguousarray(array))


def load_conv_bn(module: ConvBN, layer: ConvLayer, what: str, weight: np.ndarray | None = None) -> None:
    """A folded lc0 convolution into conv + batch norm: the batch norm is the identity plus the
    bias in eval mode (weight 1, bias b, mean 0, variance 1 - eps, so sqrt(var + eps) = 1)."""
    conv, bn = module[0], module[1]
    conv.weight.copy_(checked_tensor(layer.w if weight is None else weight, conv.weight, f"{what} weights"))
    bn.weight.fill_(1.0)
    bn.bias.copy_(checked_tensor(layer.b, bn.bias, f"{what} biases"))
    bn.running_mean.zero_()
    bn.running_var.fill_(1.0 - bn.eps)
    bn.num_batches_tracked.zero_()


def load_linear(module: nn.Linear, layer: Dense, what: str) -> None:
    """A dense layer's weights and biases into ``module``, shapes checked."""
    module.weight.copy_(checked_tensor(layer.w, module.weight, f"{what} weights"))
    module.bias.copy_(checked_tensor(layer.b, module.bias, f"{what} biases"))


def _load_norm(module: nn.LayerNorm, ln, what: str) -> None:
    module.weight.copy_(checked_tensor(ln.gammas, module.weight, f"{what} gammas"))
    module.bias.copy_(checked_tensor(ln.betas, module.bias, f"{what} betas"))


def _wdl_logits(ip2: Dense) -> Dense:
    """A single-value (tanh) output layer as three WDL logits ``(x, -30, -x)`` (module doc)."""
    row = np.asarray(ip2.w, dtype=np.float32).reshape(1, -1)
    bias = float(np.asarray(ip2.b, dtype=np.float32).reshape(-1)[0])
    return Dense(np.concatenate([row, np.zeros_like(row), -row]), np.array([bias, _NO_DRAW_LOGIT, -bias], np.float32))


def _body_from_lc0(lc0net: Lc0Net, config: NetConfig) -> Net:
    """An attention-body file as trainer.model's network: each layer where the writer
    (:mod:`trainer.lc0_export`) takes it from, the rule50 input's embedding weights scaled back."""
    b = lc0net.body
    net = Net(config, seed=0)
    body = net.body
    with torch.no_grad():
        load_linear(body.preproc, b.preproc, "PE-dense preprocessing")
        emb = np.array(b.ip_emb.w, dtype=np.float32, copy=True)
        emb[:, RULE50_PLANE] /= np.float32(rule50_scale(config))
        load_linear(body.embedding, Dense(emb, b.ip_emb.b), "input embedding")
        _load_norm(body.embedding_ln, b.emb_ln, "input embedding layer norm")
        if b.mult_gate is not None:   # without gates: the identity, which the defaults (1, 0) are
            body.mult_gate.copy_(checked_tensor(b.mult_gate.T, body.mult_gate, "input gate (multiplicative)"))
            body.add_gate.copy_(checked_tensor(b.add_gate.T, body.add_gate, "input gate (additive)"))
        ffn1, ffn2, ln = b.emb_ffn
        load_linear(body.ffn1, ffn1, "embedding FFN dense 1")
        load_linear(body.ffn2, ffn2, "embedding FFN dense 2")
        _load_norm(body.ffn_ln, ln, "embedding FFN layer norm")
        for i, (layer, e) in enumerate(zip(body.encoders, b.encoders)):
            what = f"encoder {i}"
            for module, dense, part in ((layer.q, e.q, "queries"), (layer.k, e.k, "keys"), (layer.v, e.v, "values"),
                                        (layer.out, e.out, "output"), (layer.ffn1, e.ffn1, "FFN dense 1"),
                                        (layer.ffn2, e.ffn2, "FFN dense 2")):
                load_linear(module, dense, f"{what} {part}")
            _load_norm(layer.ln1, e.ln1, f"{what} layer norm 1")
            _load_norm(layer.ln2, e.ln2, f"{what} layer norm 2")
            if e.smolgen is not None:
                sg, src = layer.smolgen, e.smolgen
                sg.compress.weight.copy_(checked_tensor(src.compress, sg.compress.weight, f"{what} smolgen compress"))
                load_linear(sg.dense1, src.dense1, f"{what} smolgen dense 1")
                _load_norm(sg.ln1, src.ln1, f"{what} smolgen layer norm 1")
                load_linear(sg.dense2, src.dense2, f"{what} smolgen dense 2")
                _load_norm(sg.ln2, src.ln2, f"{what} smolgen layer norm 2")
        if body.generator is not None:
            body.generator.weight.copy_(checked_tensor(b.smolgen_w, body.generator.weight, "global smolgen weights"))
        p = b.policy_heads[b.policy_head]
        load_linear(net.policy.embedding, p.embedding, "policy embedding")
        load_linear(net.policy.wq, p.wq, "policy queries")
        load_linear(net.policy.wk, p.wk, "policy keys")
        net.policy.promotion.weight.copy_(checked_tensor(p.ppo, net.policy.promotion.weight,
                                                         "policy promotion offsets"))
        v = b.value_heads[b.value_head]
        load_linear(net.value_embedding, v.embedding, "value embedding")
        load_linear(net.value_fc1, v.ip1, "value dense 1")
        load_linear(net.value_fc2, v.ip2 if b.wdl else _wdl_logits(v.ip2), "value dense 2")
        if b.moves_left is not None:
            for module, dense, part in zip((net.mlh_embedding, net.mlh_fc1, net.mlh_fc2), b.moves_left,
                                           ("embedding", "dense 1", "dense 2")):
                load_linear(module, dense, f"moves-left {part}")
    return net.eval()


def net_from_lc0(lc0net: Lc0Net) -> Net:
    """cyzero's PyTorch :class:`Net` computing what the lc0 file's network computes (eval mode;
    see the module doc for how each part maps). :class:`Lc0ImportError`: not representable."""
    config = net_config_from_lc0(lc0net)
    if lc0net.body is not None:
        return _body_from_lc0(lc0net, config)
    w = lc0net.weights
    net = Net(config, seed=0)
    with torch.no_grad():
        stem = np.array(w.input.w, dtype=np.float32, copy=True)
        if stem.ndim != 4 or stem.shape[1] <= RULE50_PLANE:
            raise Lc0ImportError(f"the input convolution's weights are {list(stem.shape)}, not [F, 112, 3, 3]")
        stem[:, RULE50_PLANE] *= np.float32(1.0 / RULE50_SCALE)  # cyzero's graph scales that plane by 1/100
        load_conv_bn(net.stem, w.input, "input convolution", stem)
        for i, (block, res) in enumerate(zip(net.blocks, w.residual)):
            load_conv_bn(block.conv1, res.conv1, f"block {i} conv1")
            load_conv_bn(block.conv2, res.conv2, f"block {i} conv2")
            if block.se is not None:
                load_linear(block.se.fc1, Dense(res.se.w1, res.se.b1), f"block {i} SE layer 1")
                load_linear(block.se.fc2, Dense(res.se.w2, res.se.b2), f"block {i} SE layer 2")
        if config.policy_head == "conv":
            load_conv_bn(net.policy.conv1, w.policy1, "policy conv1")
            planes = conv_policy_planes()
            conv2 = net.policy.conv2
            conv2.weight.copy_(checked_tensor(w.policy_conv.w[planes], conv2.weight, "policy conv2 weights"))
            conv2.bias.copy_(checked_tensor(w.policy_conv.b[planes], conv2.bias, "policy conv2 biases"))
        else:
            load_conv_bn(net.policy.conv, w.policy_conv, "policy convolution")
            load_linear(net.policy.fc, w.ip_pol, "policy dense layer")
        load_conv_bn(net.value_conv, w.value_conv, "value convolution")
        load_linear(net.value_fc1, w.ip1_val, "value dense layer 1")
        if w.wdl:
            load_linear(net.value_fc2, w.ip2_val, "value dense layer 2")
        else:
            load_linear(net.value_fc2, _wdl_logits(w.ip2_val), "value dense layer 2")
        if config.moves_left:
            load_conv_bn(net.mlh_conv, w.mlh_conv, "moves-left convolution")
            load_linear(net.mlh_fc1, w.ip1_mov, "moves-left dense layer 1")
            load_linear(net.mlh_fc2, w.ip2_mov, "moves-left dense layer 2")
    return net.eval()


# --------------------------------------------------------------------------- checks


def compare_with_onnx(net: Net, model: bytes, planes: np.ndarray, masks: np.ndarray | None = None,
                      graph: str = "the ONNX graph") -> dict:
    """The PyTorch network's outputs (eval mode, :class:`trainer.model.InferenceNet`) against the
    ONNX model ``model`` (serialized bytes; ONNX Runtime, CPU, float32) on ``planes``:
    :func:`trainer.export.parity_numbers`' figures. ``graph`` names the model in errors."""
    import onnxruntime as ort

    from engine.network import INPUT_NAME
    from trainer.export import inference_module, parity_numbers

    planes = np.ascontiguousarray(planes, dtype=np.float32)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    theirs = session.run(None, {INPUT_NAME: planes})
    module = inference_module(net)
    with torch.no_grad():
        ours = [t.numpy() for t in module(torch.from_numpy(planes))]
    if len(ours) != len(theirs):
        raise Lc0ImportError(f"the PyTorch network has {len(ours)} outputs, {graph} {len(theirs)}")
    ours = [o.reshape(t.shape) for o, t in zip(ours, theirs)]
    return parity_numbers(ours, theirs, masks)


def compare_with_lc0(net: Net, lc0net: Lc0Net, planes: np.ndarray, masks: np.ndarray | None = None) -> dict:
    """The PyTorch network's outputs against :func:`engine.lc0_onnx.lc0_to_onnx`'s graph
    (:func:`compare_with_onnx`)."""
    return compare_with_onnx(net, lc0_to_onnx(lc0net), planes, masks, graph="lc0's graph")


def parity_failures(numbers: dict, bounds: dict | None = None) -> list[str]:
    """What in :func:`compare_with_onnx`'s figures is outside ``bounds`` (default
    :data:`LC0_PARITY`); an empty list: within them."""
    bounds = {**LC0_PARITY, **(bounds or {})}
    checks = [("policy", numbers["policy_max_abs_diff"], bounds["policy"]),
              ("wdl", numbers["wdl_max_abs_diff"], bounds["wdl"])]
    if numbers["mlh_max_abs_diff"] is not None:
        checks.append(("mlh", numbers["mlh_max_abs_diff"], bounds["mlh"] * max(1.0, numbers["mlh_scale"])))
    return [f"{name} max |diff| {value:.3g} > {allowed:.3g}" for name, value, allowed in checks
            if not value <= allowed]  # NaN fails too


def check_against_lc0(net: Net, lc0net: Lc0Net, planes: np.ndarray, masks: np.ndarray | None = None,
                      bounds: dict | None = None) -> dict:
    """:func:`compare_with_lc0`, then :class:`Lc0ParityError` if a figure is outside ``bounds``
    (default :data:`LC0_PARITY`); returns the figures."""
    numbers = compare_with_lc0(net, lc0net, planes, masks)
    failures = parity_failures(numbers, bounds)
    if failures:
        raise Lc0ParityError(f"the PyTorch network rebuilt from the lc0 file disagrees with lc0's graph over "
                             f"{numbers['positions']} positions: " + "; ".join(failures))
    return numbers


def calibrate_batch_norm(net: Net, planes: np.ndarray, batch: int = 256) -> Net:
    """Give every batch norm the statistics of its real inputs, and the convolution before it the
    scale that makes those inputs unit-variance, leaving eval mode's outputs as they were.

    A batch norm in eval mode is the affine map ``x -> a x + c`` per channel, with
    ``a = weight / sqrt(running_var + eps)`` and ``c = bias - a running_mean``. Any running
    statistics ``(m, v)`` give the same map with ``weight = a sqrt(v + eps)`` and
    ``bias = c + a m``. Training mode, which normalises by each batch's own statistics, then starts
    from nearly the function eval mode computes, instead of rescaling every channel of an
    imported network (whose batch norms are the identity: :func:`net_from_lc0`) at its first
    step.

    Each convolution is divided per output channel by ``s = sqrt(v + eps)`` of its measured
    input variance, with ``a`` multiplied by ``s`` to match: a folded file's convolutions carry
    its old batch norms' scales, and Adam moves every weight by about the learning rate whatever
    its size, so the small ones would be changed by large fractions. Continuing the bundled
    network at a rate of 1e-3 raised its held-out loss by 0.121 in 50 steps with the folded
    scales and by 0.047 with unit-variance inputs (docs/training.md, "Starting from an lc0 network").
    In place; returns ``net``.
    """
    planes = np.ascontiguousarray(planes, dtype=np.float32)
    pairs = [(block[0], block[1]) for block in net.modules() if isinstance(block, ConvBN)]
    sums = {id(bn): [0.0, 0.0, 0] for _, bn in pairs}

    def hook(module, inputs, _output):
        x = inputs[0].detach().double()
        s = sums[id(module)]
        s[0] = s[0] + x.sum(dim=(0, 2, 3))
        s[1] = s[1] + (x * x).sum(dim=(0, 2, 3))
        s[2] += x.shape[0] * x.shape[2] * x.shape[3]

    was_training = net.training
    net.eval()
    handles = [bn.register_forward_hook(hook) for _, bn in pairs]
    try:
        with torch.no_grad():
            device = next(net.parameters()).device
            for i in range(0, len(planes), batch):
                net(torch.from_numpy(planes[i:i + batch]).to(device))
    finally:
        for h in handles:
            h.remove()
    with torch.no_grad():
        for conv, bn in pairs:
            total, squares, n = sums[id(bn)]
            if not n:
                continue
            mean = total / n
            var = (squares / n - mean * mean).clamp_min(0.0)
            scale = torch.sqrt(var + bn.eps)
            a = bn.weight.double() / torch.sqrt(bn.running_var.double() + bn.eps)
            c = bn.bias.double() - a * bn.running_mean.double()
            # the same affine map before and after: the input becomes x / scale, so a grows by scale
            a, mean, var = a * scale, mean / scale, var / (scale * scale)
            conv.weight.div_(scale.to(conv.weight.dtype).view(-1, 1, 1, 1))
            bn.running_mean.copy_(mean)
            bn.running_var.copy_(var)
            bn.weight.copy_(a * torch.sqrt(var + bn.eps))
            bn.bias.copy_(c + a * mean)
    net.train(was_training)
    return net
