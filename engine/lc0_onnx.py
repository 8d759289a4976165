"""The contract's ONNX graph of an lc0 network read by :mod:`engine.lc0`, as lc0 builds it.

The residual family's graph is what lc0's own ``leela2onnx`` builds; an attention body's is what
lc0 v0.32.1's CPU backend computes (``network_blas.cc``), which its ``leela2onnx`` does not quite,
for the PE-dense embedding's FFN activation. :class:`engine.network.Network` runs it like any
ONNX file. ``onnx`` is imported when a graph is built, not before, so an engine that plays an
``.onnx`` file never loads it for this.
"""

from __future__ import annotations

import numpy as np

from engine.contract import INPUT_NAME, MLH_NAME, POLICY_NAME, WDL_NAME
from engine.encoding import POLICY_SIZE
from engine.lc0 import (
    ATTENTION_POLICY_MAP, CONV_POLICY_MAP, CONV_POLICY_PLANES, INPUT_PLANES, PE_MAP, AttentionPolicy, ConvLayer, Dense,
    EncoderLayer, LayerNorm, Lc0Error, Lc0Net,
)

__all__ = ["lc0_to_onnx"]


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
