"""cyzero's own fp32 ONNX exports as cyzero PyTorch networks: ``--init-from`` and ``export --checkpoint``.

cyzero's own fp32 ONNX exports (:mod:`trainer.export`; the bundled ``engine/nets/default.onnx``)
are networks to start from too: :func:`net_from_onnx` rebuilds the :class:`Net` from the file's
``cyzero.config`` metadata and its initializers. The exporter folds each batch norm into its
convolution, which is loaded as an lc0 file's is (:mod:`trainer.lc0_import`'s loaders; calibrated
the same way before training); the input scaling (a Mul before the stem) and the conv policy
head's Gather are checked, not loaded; the rebuilt network is checked against the file's own
graph (:func:`check_against_onnx`, the same :data:`trainer.lc0_import.LC0_PARITY`). An ONNX file
without cyzero's metadata (lc0's ``leela2onnx``, any other) and cyzero's fp16 and int8 variants
are an :class:`OnnxImportError` with a one-line reason.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from engine.lc0 import ConvLayer, Dense
from trainer.lc0_import import (
    Lc0ImportError, checked_tensor, compare_with_onnx, load_conv_bn, load_linear, parity_failures,
)
from trainer.model import RULE50_SCALE, Net, NetConfig

__all__: Sequence[str] = [
    "OnnxImportError", "OnnxParityError", "net_from_onnx", "onnx_net_config", "check_against_onnx",
]


class OnnxImportError(ValueError):
    """An ONNX file cyzero cannot rebuild a PyTorch network from; the message is one line."""


class OnnxParityError(OnnxImportError):
    """The PyTorch network rebuilt from an ONNX file does not compute what the file computes."""


#: ONNX operators of a reduced-precision (int8 QDQ) graph, which has no float32 weights to train.
_QUANTIZED_OPS = frozenset({"QuantizeLinear", "DequantizeLinear", "QLinearConv", "QLinearMatMul",
                            "ConvInteger", "MatMulInteger", "DynamicQuantizeLinear"})


def _reduced_precision_stem(name: str) -> str:
    """``default.fp16.onnx`` -> ``default.onnx``: the fp32 file next to a variant's."""
    from trainer.export import VARIANT_SUFFIX

    for variant, suffix in VARIANT_SUFFIX.items():
        if variant != "fp32" and name.lower().endswith(suffix):
            return name[:-len(suffix)] + ".onnx"
    return "the .onnx one without .fp16 or .int8"


def onnx_net_config(model, name: str = "the file") -> NetConfig:
    """The :class:`NetConfig` a cyzero fp32 ONNX export was made from (its ``cyzero.config``
    metadata); :class:`OnnxImportError` for a foreign ONNX model or a reduced-precision variant."""
    import json

    import onnx

    meta = {p.key: p.value for p in model.metadata_props}
    if "cyzero.config" not in meta:
        raise OnnxImportError("an ONNX network without cyzero's metadata (cyzero.config), so not one of cyzero's "
                              "exports: its weights cannot be mapped onto cyzero's network (give cyzero's fp32 "
                              "export, an lc0 weights file (.pb.gz, .pb) or a cyzero checkpoint (.pt))")
    variant = meta.get("cyzero.variant", "fp32")
    halves = [t.name for t in model.graph.initializer if t.data_type == onnx.TensorProto.FLOAT16]
    quantized = [n.op_type for n in model.graph.node if n.op_type in _QUANTIZED_OPS]
    if variant != "fp32" or halves or quantized:
        kind = variant if variant != "fp32" else ("int8" if quantized else "fp16")
        raise OnnxImportError(f"cyzero's {kind} ONNX export holds reduced-precision weights, which training "
                              f"cannot start from: use the fp32 file ({_reduced_precision_stem(name)})")
    try:
        return NetConfig.from_dict(json.loads(meta["cyzero.config"]))
    except (ValueError, TypeError) as exc:  # json's JSONDecodeError is a ValueError
        raise OnnxImportError(f"its cyzero.config metadata is no network config: {' '.join(str(exc).split())[:200]}") \
            from None


def _onnx_constants(graph) -> dict[str, np.ndarray]:
    """Every constant of the graph by name: its initializers, its Constant nodes' values and the
    Identity nodes of either."""
    from onnx import helper, numpy_helper

    consts = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.attribute:
            attr = node.attribute[0]
            value = helper.get_attribute_value(attr)
            consts[node.output[0]] = numpy_helper.to_array(value) if attr.name == "value" else np.asarray(value)
        elif node.op_type == "Identity" and node.input and node.input[0] in consts:
            consts[node.output[0]] = consts[node.input[0]]
    return consts


class _OnnxLayer:
    """A Conv, Gemm or MatMul(+Add) node's weights: ``w`` in PyTorch's layout ([out, in, k, k] or
    [out, in]), ``b`` (or None), ``bn`` the (scale, bias, mean, var, epsilon) of a
    BatchNormalization that follows a Conv (None: folded into it, or none)."""

    def __init__(self, node, w: np.ndarray, b: np.ndarray | None, bn: tuple | None = None,
                 attrs: dict | None = None):
        self.node, self.w, self.b, self.bn, self.attrs = node, w, b, bn, attrs or {}

    @property
    def kind(self) -> str:
        return "convolution" if self.node.op_type == "Conv" else "dense layer"

    @property
    def where(self) -> str:
        return f"{self.node.op_type} node {self.node.name or self.node.output[0]!r}"


def _onnx_layers(graph, consts: dict[str, np.ndarray]) -> list[_OnnxLayer]:
    """The graph's convolutions and dense layers in graph order, their weights as PyTorch holds them."""
    from onnx import helper

    consumers: dict[str, list] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)

    def attrs(node) -> dict:
        return {a.name: helper.get_attribute_value(a) for a in node.attribute}

    def weight(node, index: int) -> np.ndarray:
        if len(node.input) <= index or node.input[index] not in consts:
            raise OnnxImportError(f"{node.op_type} node {node.name!r} has no constant weights in input {index}: "
                                  "not a graph cyzero's export writes")
        return np.array(consts[node.input[index]], dtype=np.float32)  # a copy: numpy_helper's are read-only

    def optional(node, index: int) -> np.ndarray | None:
        if len(node.input) <= index or not node.input[index]:
            return None
        return weight(node, index).reshape(-1)

    def sole_consumer(node, op_type: str):
        users = consumers.get(node.output[0], [])
        return users[0] if len(users) == 1 and users[0].op_type == op_type else None

    layers = []
    for node in graph.node:
        if node.op_type == "Conv":
            if node.input[0] in consts:
                raise OnnxImportError(f"Conv node {node.name!r} convolves a constant: not a graph cyzero's export writes")
            bn = None
            norm = sole_consumer(node, "BatchNormalization")
            if norm is not None:
                bn = tuple(weight(norm, i).reshape(-1) for i in range(1, 5)) + (
                    float(attrs(norm).get("epsilon", 1e-5)),)
            layers.append(_OnnxLayer(node, weight(node, 1), optional(node, 2), bn, attrs(node)))
        elif node.op_type == "Gemm":
            a = attrs(node)
            if a.get("transA", 0) or node.input[0] in consts:
                raise OnnxImportError(f"Gemm node {node.name!r} multiplies a constant from the left: "
                                      "not a dense layer of cyzero's")
            w = weight(node, 1)
            w = (w if a.get("transB", 0) else w.T) * np.float32(a.get("alpha", 1.0))
            b = optional(node, 2)
            layers.append(_OnnxLayer(node, w, None if b is None else b * np.float32(a.get("beta", 1.0))))
        elif node.op_type == "MatMul":
            if node.input[0] in consts or node.input[1] not in consts or weight(node, 1).ndim != 2:
                raise OnnxImportError(f"MatMul node {node.name!r} is no activations x [in, out] weights: "
                                      "not a dense layer of cyzero's")
            add, b = sole_consumer(node, "Add"), None
            if add is not None:
                other = [name for name in add.input if name != node.output[0]]
                if len(other) == 1 and other[0] in consts:
                    b = np.array(consts[other[0]], dtype=np.float32).reshape(-1)
            layers.append(_OnnxLayer(node, weight(node, 1).T, b))
    return layers


def _onnx_targets(net: Net) -> list[tuple[str, nn.Module, str]]:
    """cyzero's convolutions and dense layers in the order the forward pass runs them (the
    exported graph's order): ``("convbn" | "conv" | "linear", module, what)``."""
    targets: list[tuple[str, nn.Module, str]] = [("convbn", net.stem, "input convolution")]
    for i, block in enumerate(net.blocks):
        targets += [("convbn", block.conv1, f"block {i} conv1"), ("convbn", block.conv2, f"block {i} conv2")]
        if block.se is not None:
            targets += [("linear", block.se.fc1, f"block {i} SE layer 1"), ("linear", block.se.fc2, f"block {i} SE layer 2")]
    if net.config.policy_head == "conv":
        targets += [("convbn", net.policy.conv1, "policy conv1"), ("conv", net.policy.conv2, "policy conv2")]
    else:
        targets += [("convbn", net.policy.conv, "policy convolution"), ("linear", net.policy.fc, "policy dense layer")]
    targets += [("convbn", net.value_conv, "value convolution"), ("linear", net.value_fc1, "value dense layer 1"),
                ("linear", net.value_fc2, "value dense layer 2")]
    if net.config.moves_left:
        targets += [("convbn", net.mlh_conv, "moves-left convolution"),
                    ("linear", net.mlh_fc1, "moves-left dense layer 1"),
                    ("linear", net.mlh_fc2, "moves-left dense layer 2")]
    return targets


def _load_onnx_conv(kind: str, module: nn.Module, layer: _OnnxLayer, what: str) -> None:
    conv = module[0] if kind == "convbn" else module
    a = layer.attrs
    pad = conv.padding[0]
    if (a.get("group", 1) != 1 or any(s != 1 for s in a.get("strides", [1, 1]))
            or any(d != 1 for d in a.get("dilations", [1, 1])) or list(a.get("pads", [0] * 4)) != [pad] * 4
            or a.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET")):
        raise OnnxImportError(f"{what} ({layer.where}): groups, strides, dilations or pads "
                              f"{ {k: a.get(k) for k in ('group', 'strides', 'dilations', 'pads')} } "
                              f"are not cyzero's (1, 1, 1, {pad})")
    bias = layer.b if layer.b is not None else np.zeros(layer.w.shape[0], np.float32)
    if kind == "conv":
        if layer.bn is not None:
            raise OnnxImportError(f"{what} ({layer.where}) is followed by a batch norm; cyzero's has none")
        conv.weight.copy_(checked_tensor(layer.w, conv.weight, f"{what} weights"))
        conv.bias.copy_(checked_tensor(bias, conv.bias, f"{what} biases"))
    elif layer.bn is None:  # batch norm folded into the convolution (the TorchScript exporter's way)
        load_conv_bn(module, ConvLayer(layer.w, bias), what)
    else:  # conv (+ bias) then BatchNormalization: BN(x + b) has running mean ``mean - b``
        bn = module[1]
        scale, shift, mean, var, eps = layer.bn
        conv.weight.copy_(checked_tensor(layer.w, conv.weight, f"{what} weights"))
        bn.weight.copy_(checked_tensor(scale, bn.weight, f"{what} batch norm scale"))
        bn.bias.copy_(checked_tensor(shift, bn.bias, f"{what} batch norm bias"))
        checked_tensor(bias, bn.running_mean, f"{what} biases")
        bn.running_mean.copy_(checked_tensor(mean - bias, bn.running_mean, f"{what} batch norm mean"))
        bn.running_var.copy_(checked_tensor(var, bn.running_var, f"{what} batch norm variance"))
        bn.eps = eps
        bn.num_batches_tracked.zero_()


def _check_onnx_io(model, net: Net, consts: dict[str, np.ndarray], stem_node) -> None:
    """The graph's outputs, its input scaling and (conv policy head) its policy gather are cyzero's."""
    from engine.network import INPUT_NAME, POLICY_NAME
    from trainer.model import InferenceNet

    graph = model.graph
    outputs = [o.name for o in graph.output]
    expected = InferenceNet(net).output_names
    if outputs != expected or [i.name for i in graph.input if i.name not in consts] != [INPUT_NAME]:
        raise OnnxImportError(f"the graph's inputs and outputs are {[i.name for i in graph.input]} -> {outputs}; "
                              f"a {net.config.name} network as its metadata describes has [{INPUT_NAME!r}] -> {expected}")
    producer = {o: n for n in graph.node for o in n.output}
    scaling = producer.get(stem_node.input[0])
    factor = None
    if scaling is not None and scaling.op_type == "Mul" and INPUT_NAME in scaling.input:
        other = [name for name in scaling.input if name != INPUT_NAME]
        factor = consts.get(other[0]) if len(other) == 1 else None
    scale = net.input_scale.numpy()
    if (factor is None or np.asarray(factor).size != scale.size
            or not np.allclose(np.asarray(factor, np.float32).reshape(scale.shape), scale, rtol=1e-6, atol=0)):
        raise OnnxImportError("the input convolution does not read the input planes times cyzero's input scale "
                              f"(the rule50 plane / {1 / RULE50_SCALE:g}): not a graph cyzero's export writes")
    if net.config.policy_head == "conv":
        node = producer.get(POLICY_NAME)
        while node is not None and node.op_type == "Identity":
            node = producer.get(node.input[0])
        index = consts.get(node.input[1]) if node is not None and node.op_type == "Gather" else None
        if index is None or not np.array_equal(np.asarray(index).reshape(-1), net.policy.policy_map.numpy()):
            raise OnnxImportError("the policy output is not cyzero's gather of the conv policy head's 1858 moves")


def net_from_onnx(model) -> Net:
    """cyzero's PyTorch :class:`Net` rebuilt from one of cyzero's fp32 ONNX exports (an
    ``onnx.ModelProto`` or its bytes; :func:`trainer.export.export_onnx`). Its ``cyzero.config``
    metadata gives the shape; each Conv, Gemm and MatMul(+Add), in graph order, is the next of
    the forward pass's convolutions and dense layers (stem, each block's conv1, conv2 and SE
    layers, policy, value and moves-left heads), shapes checked at each. A batch norm folded into
    its convolution is loaded as lc0's are (:func:`trainer.lc0_import.load_conv_bn`); a BatchNormalization node
    keeps its own statistics. :class:`OnnxImportError` (one line): anything else."""
    import onnx

    if isinstance(model, (bytes, bytearray)):
        model = onnx.load_from_string(bytes(model))
    config = onnx_net_config(model)
    consts = _onnx_constants(model.graph)
    layers = _onnx_layers(model.graph, consts)
    net = Net(config, seed=0)
    targets = _onnx_targets(net)
    if len(layers) != len(targets):
        raise OnnxImportError(f"the graph has {len(layers)} convolutions and dense layers; a {config.name} network "
                              f"as its metadata describes has {len(targets)}")
    norms = [n for n in model.graph.node if n.op_type == "BatchNormalization"]
    if len(norms) != sum(layer.bn is not None for layer in layers):
        raise OnnxImportError("a BatchNormalization that follows no convolution of its own: not a graph cyzero's "
                              "export writes")
    try:
        with torch.no_grad():
            for layer, (kind, module, what) in zip(layers, targets):
                wanted = "dense layer" if kind == "linear" else "convolution"
                if layer.kind != wanted:
                    raise OnnxImportError(f"the graph's {layer.where} is a {layer.kind} where cyzero's network has "
                                          f"its {what}, a {wanted}")
                if kind == "linear":
                    if layer.w.ndim != 2:
                        raise OnnxImportError(f"{what} ({layer.where}): weights {list(layer.w.shape)} are not 2-d")
                    bias = layer.b if layer.b is not None else np.zeros(layer.w.shape[0], np.float32)
                    load_linear(module, Dense(layer.w, bias), what)
                else:
                    _load_onnx_conv(kind, module, layer, what)
    except Lc0ImportError as exc:  # the shared loaders' shape checks
        raise OnnxImportError(str(exc)) from None
    _check_onnx_io(model, net, consts, layers[0].node)
    return net.eval()


def check_against_onnx(net: Net, model: bytes, planes: np.ndarray, masks: np.ndarray | None = None,
                       bounds: dict | None = None) -> dict:
    """:func:`trainer.lc0_import.compare_with_onnx` of the ONNX ``model`` (bytes), then
    :class:`OnnxParityError` if a figure is outside ``bounds`` (default
    :data:`trainer.lc0_import.LC0_PARITY`); returns the figures."""
    try:
        numbers = compare_with_onnx(net, model, planes, masks, graph="the file's graph")
    except Lc0ImportError as exc:
        raise OnnxImportError(str(exc)) from None
    failures = parity_failures(numbers, bounds)
    if failures:
        raise OnnxParityError(f"the PyTorch network rebuilt from it disagrees with its own graph over "
                              f"{numbers['positions']} positions: " + "; ".join(failures))
    return numbers
