"""cyzero's own fp32 ONNX exports as networks to start from (trainer/onnx_import.py, ``net_from_onnx``):
``read_network``, ``learn --init-from`` and ``train.init_from`` rebuild the PyTorch network from the
file's ``cyzero.config`` metadata and initializers and check it against the file's own graph.

The bundled ``engine/nets/default.onnx`` is the real case (10x64, conv policy, moves-left, batch
norm folded by the exporter); tiny networks exported by ``trainer.export`` cover the other heads,
and hand-edited graphs the layouts another exporter writes (MatMul + Add, a BatchNormalization
node, dropped zero biases). fp16, int8 and foreign ONNX files are one-line refusals.
"""

from __future__ import annotations

import copy
import json
import os

import numpy as np
import onnx
import pytest
import torch
from onnx import helper, numpy_helper

from lc0_files import CYZERO
from trainer.export import export_onnx, sample_positions
from trainer.lc0_import import LC0_PARITY, compare_with_onnx
from trainer.model import InferenceNet, Net, NetConfig
from trainer.network_files import has_folded_batch_norm, read_network
from trainer.onnx_import import OnnxImportError, OnnxParityError, check_against_onnx, net_from_onnx

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("one_thread")]

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NETS = os.path.join(REPO, "engine", "nets")
DEFAULT = os.path.join(NETS, "default.onnx")


@pytest.fixture(scope="module")
def positions():
    return sample_positions(96, seed=7)


@pytest.fixture(scope="module")
def bundled():
    """The bundled network as the learner reads it (remembered there, so the learn test reads it once)."""
    from trainer.run_setup import read_init_network

    return read_init_network(DEFAULT)


def torch_outputs(net: Net, planes: np.ndarray) -> list[np.ndarray]:
    with torch.no_grad():
        return [t.numpy() for t in InferenceNet(copy.deepcopy(net).eval()).eval()(torch.from_numpy(planes))]


def one_line(exc: pytest.ExceptionInfo) -> str:
    message = str(exc.value)
    assert "\n" not in message and message, message
    return message


# --------------------------------------------------------------------------- the bundled network


def test_the_bundled_network_rebuilt_in_pytorch_computes_what_the_file_computes(bundled):
    from test_lc0_trainer import encoded

    net, description = bundled
    meta = {p.key: p.value for p in onnx.load(DEFAULT, load_external_data=False).metadata_props}
    assert net.config == NetConfig.from_dict(json.loads(meta["cyzero.config"])) and not net.training
    assert description == f"default.onnx: cyzero ONNX export, {net.config.name}, rebuilt from its weights"
    # folded batch norm, loaded as lc0's is: the identity plus the folded bias
    bn = net.stem[1]
    assert torch.all(bn.weight == 1) and torch.all(bn.running_mean == 0)
    assert torch.allclose(bn.running_var, torch.full_like(bn.running_var, 1 - bn.eps))

    planes, masks = sample_positions(200, seed=11)
    fixed, fixed_masks = encoded()  # history, rule50 at 99, promotions, both sides to move
    planes, masks = np.concatenate([planes, fixed]), np.concatenate([masks, fixed_masks])
    numbers = compare_with_onnx(net, open(DEFAULT, "rb").read(), planes, masks)
    assert numbers["positions"] == 208
    assert numbers["policy_max_abs_diff"] <= 1e-3 and numbers["wdl_max_abs_diff"] <= 1e-4, numbers
    assert numbers["mlh_max_abs_diff"] <= LC0_PARITY["mlh"] * max(1.0, numbers["mlh_scale"]), numbers
    assert numbers["policy_argmax_agreement"] == 1.0
    assert has_folded_batch_norm(DEFAULT)


@pytest.mark.parametrize("variant", ["fp16", "int8"])
def test_reduced_precision_variants_are_refused_naming_the_fp32_file(variant):
    path = os.path.join(NETS, f"default.{variant}.onnx")
    with pytest.raises(OnnxImportError) as exc:
        read_network(path)
    message = one_line(exc)
    assert message.startswith(f"default.{variant}.onnx: cyzero's {variant} ONNX export") and "(default.onnx)" in message


# --------------------------------------------------------------------------- tiny exports


def randomised(config: NetConfig, seed: int) -> Net:
    """A fresh net whose batch norms and biases are not the init's ones and zeros, so that the
    export's folding has something to fold."""
    net = Net(config, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                for t, lo, hi in ((m.weight, 0.5, 1.5), (m.bias, -0.2, 0.2), (m.running_mean, -0.3, 0.3),
                                  (m.running_var, 0.5, 2.0)):
                    t.copy_(torch.rand(t.shape, generator=gen) * (hi - lo) + lo)
            elif isinstance(m, (torch.nn.Linear, torch.nn.Conv2d)) and m.bias is not None:
                m.bias.copy_(torch.rand(m.bias.shape, generator=gen) * 0.2 - 0.1)
    return net.eval()


SHAPES = {
    "conv-mlh": NetConfig.from_name("1x8"),
    "conv-no-mlh": NetConfig.from_name("1x8", moves_left=False),
    "fc-mlh": NetConfig.from_name("1x8", policy_head="fc", policy_channels=4, value_channels=4, value_hidden=16),
    "plain-mish-relu-mlh": NetConfig.from_name("2x8", se=False, activation="mish", mlh_activation="relu",
                                               mlh_channels=2, mlh_hidden=8),
}


@pytest.mark.parametrize("shape", list(SHAPES))
def test_an_exported_tiny_network_round_trips(tmp_path, positions, shape):
    net = randomised(SHAPES[shape], seed=3)
    path = tmp_path / "tiny.onnx"
    export_onnx(net, path, check_planes=positions[0], check_masks=positions[1])
    rebuilt, description = read_network(path)
    assert description == f"tiny.onnx: cyzero ONNX export, {net.config.name}, rebuilt from its weights"
    assert rebuilt.config == net.config
    for got, want in zip(torch_outputs(rebuilt, positions[0]), torch_outputs(net, positions[0]), strict=True):
        np.testing.assert_allclose(got, want, atol=2e-5, rtol=0)


def _node(model: onnx.ModelProto, op_type: str, index: int = 0) -> onnx.NodeProto:
    return [n for n in model.graph.node if n.op_type == op_type][index]


def _const(model: onnx.ModelProto, name: str) -> np.ndarray:
    return numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == name)).copy()


def _set_const(model: onnx.ModelProto, name: str, value: np.ndarray) -> None:
    tensor = next(t for t in model.graph.initializer if t.name == name)
    tensor.CopyFrom(numpy_helper.from_array(np.ascontiguousarray(value, dtype=np.float32), name))


def _add_const(model: onnx.ModelProto, name: str, value: np.ndarray) -> None:
    model.graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(value, dtype=np.float32), name))


def test_other_exporters_layouts_matmul_add_a_batch_norm_node_and_dropped_biases(tmp_path, positions):
    """What another exporter may write (torch's dynamo exporter drops zero biases; others keep a
    BatchNormalization node or write Linear as MatMul + Add) computes the same and is rebuilt too."""
    net = randomised(NetConfig.from_name("1x8"), seed=5)
    with torch.no_grad():
        net.value_fc2.bias.zero_()
    path = tmp_path / "net.onnx"
    export_onnx(net, path, check_planes=positions[0], check_masks=positions[1])
    model = onnx.load(path)
    rng = np.random.default_rng(0)

    # the stem as Conv without bias + BatchNormalization: BN(W' x) = W x + b
    conv = _node(model, "Conv")
    w, b = _const(model, conv.input[1]), _const(model, conv.input[2])
    scale, var, mean = (rng.uniform(0.5, 2.0, b.shape), rng.uniform(0.5, 2.0, b.shape),
                        rng.uniform(-1.0, 1.0, b.shape))
    eps = 1e-3
    a = scale / np.sqrt(var + eps)
    _set_const(model, conv.input[1], w / a[:, None, None, None])
    for name, value in (("bn.scale", scale), ("bn.B", b + a * mean), ("bn.mean", mean), ("bn.var", var)):
        _add_const(model, name, value)
    out = conv.output[0]
    del conv.input[2]
    conv.output[0] = "stem_raw"
    norm = helper.make_node("BatchNormalization", ["stem_raw", "bn.scale", "bn.B", "bn.mean", "bn.var"], [out],
                            name="stem_bn", epsilon=eps)
    nodes = list(model.graph.node)
    nodes.insert(nodes.index(conv) + 1, norm)

    # every Gemm as MatMul (+ Add), the zero bias of value_fc2 dropped
    for gemm in [n for n in nodes if n.op_type == "Gemm"]:
        wname, bname = gemm.input[1], gemm.input[2]
        _add_const(model, wname + ".T", _const(model, wname).T)
        bias = _const(model, bname)
        matmul = helper.make_node("MatMul", [gemm.input[0], wname + ".T"], [gemm.output[0] + ".mm"], name=gemm.name + ".mm")
        extra = [matmul]
        if np.any(bias):
            extra.append(helper.make_node("Add", [matmul.output[0], bname], [gemm.output[0]], name=gemm.name + ".add"))
        else:
            matmul.output[0] = gemm.output[0]
        at = nodes.index(gemm)
        nodes[at:at + 1] = extra
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    onnx.checker.check_model(model)
    data = model.SerializeToString()

    rebuilt = net_from_onnx(data)
    assert rebuilt.stem[1].eps == pytest.approx(eps, rel=1e-6) and not torch.all(rebuilt.stem[1].running_mean == 0)
    numbers = check_against_onnx(rebuilt, data, positions[0], positions[1])
    assert numbers["policy_max_abs_diff"] <= 1e-4 and numbers["wdl_max_abs_diff"] <= 1e-5, numbers
    for got, want in zip(torch_outputs(rebuilt, positions[0]), torch_outputs(net, positions[0]), strict=True):
        np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)


# --------------------------------------------------------------------------- refusals


@pytest.fixture(scope="module")
def tiny_export(tmp_path_factory, positions) -> bytes:
    path = tmp_path_factory.mktemp("tiny") / "tiny.onnx"
    export_onnx(randomised(NetConfig.from_name("1x8"), seed=1), path, check_planes=positions[0])
    return path.read_bytes()


def _with_config(data: bytes, **changes) -> onnx.ModelProto:
    model = onnx.load_from_string(data)
    for entry in model.metadata_props:
        if entry.key == "cyzero.config":
            entry.value = json.dumps({**json.loads(entry.value), **changes})
    return model


def test_foreign_and_mismatched_onnx_files_are_one_line_refusals(tmp_path, tiny_export):
    x = helper.make_tensor_value_info("/input/planes", onnx.TensorProto.FLOAT, ["batch", 112, 8, 8])
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["batch", 112, 8, 8])
    foreign = helper.make_model(helper.make_graph([helper.make_node("Relu", ["/input/planes"], ["y"])], "g", [x], [y]))
    cases = [
        ("foreign.onnx", foreign.SerializeToString(), "without cyzero's metadata"),
        ("garbage.onnx", b"\x12\xff\xff\xff", "is not an ONNX network that loads"),
        ("deeper.onnx", _with_config(tiny_export, blocks=2).SerializeToString(),
         "the graph has 13 convolutions and dense layers; a 2x8 network as its metadata describes has 17"),
        ("wider.onnx", _with_config(tiny_export, filters=16, se_ratio=8).SerializeToString(),
         "input convolution weights: the file's weights are [8, 112, 3, 3], cyzero's [16, 112, 3, 3]"),
        ("nomlh.onnx", _with_config(tiny_export, moves_left=False).SerializeToString(), "graph has 13 convolutions and dense layers; a 1x8 network as its metadata describes has 10"),
        ("badconfig.onnx", _with_config(tiny_export, blocks=0).SerializeToString(), "no network config"),
        # the weights fit, the function does not: lc0's ReLU moves-left output where the file has softplus
        ("relu.onnx", _with_config(tiny_export, mlh_activation="relu").SerializeToString(),
         "disagrees with its own graph over 256 positions: mlh max |diff|"),
    ]
    # lc0's own ONNX export of an lc0 file (leela2onnx): a network, but not one of cyzero's exports
    cases.append((os.path.basename(CYZERO.need().onnx), open(CYZERO.onnx, "rb").read(), "without cyzero's metadata"))
    for name, data, why in cases:
        path = tmp_path / name
        path.write_bytes(data)
        with pytest.raises(OnnxImportError) as exc:
            read_network(path)
        message = one_line(exc)
        assert message.startswith(f"{name}: ") or message.startswith(f"{name} is "), message
        assert why in message, message
        if name == "relu.onnx":
            assert exc.type is OnnxParityError
    # an ONNX file not named .onnx is still read as one (the first byte of ONNX's ModelProto)
    (tmp_path / "net.bin").write_bytes(tiny_export)
    assert read_network(tmp_path / "net.bin")[0].config.name == "1x8"


# --------------------------------------------------------------------------- deepening


@pytest.mark.parametrize("se", [True, False])
def test_a_deepened_network_computes_what_its_source_computes_until_it_learns(positions, se):
    from trainer.model import deepen

    source = randomised(NetConfig.from_name("3x8", se=se), seed=4)
    grown = deepen(source, 7, seed=1)
    assert grown.config == NetConfig.from_name("7x8", se=se)
    # the source's blocks, in order, spread among the new ones (positions 0, 2 and 5 of 7)
    for position, i in ((0, 0), (2, 1), (5, 2)):
        for name, value in source.blocks[i].state_dict().items():
            assert torch.equal(grown.blocks[position].state_dict()[name], value), (position, name)
    assert torch.equal(grown.stem[0].weight, source.stem[0].weight)
    for got, want in zip(torch_outputs(grown, positions[0]), torch_outputs(source, positions[0]), strict=True):
        np.testing.assert_allclose(got, want, atol=1e-6, rtol=0)
    # in training mode too (batch statistics), which is where the learner starts from
    planes = torch.from_numpy(positions[0])
    grown.train()
    source.train()
    with torch.no_grad():
        for got, want in zip(grown(planes), source(planes), strict=True):
            torch.testing.assert_close(got, want, atol=1e-6, rtol=0)

    # the new blocks learn: one step moves their last batch norm off zero, and the function with it
    optimizer = torch.optim.SGD(grown.parameters(), lr=0.1)
    out = grown(planes)
    (out.policy.logsumexp(dim=1).mean() + out.wdl.square().mean()).backward()
    optimizer.step()
    assert float(grown.blocks[1].conv2[1].weight.detach().abs().sum()) > 0
    with torch.no_grad():
        assert not torch.allclose(grown.eval()(planes).wdl, source.eval()(planes).wdl, atol=1e-6)


def test_deepening_refuses_fewer_blocks_and_non_relu_networks():
    from trainer.model import deepen

    with pytest.raises(ValueError, match="cannot deepen a 3x8 network to 2 blocks: it has 3"):
        deepen(Net(NetConfig.from_name("3x8")), 2)
    with pytest.raises(ValueError, match="cannot deepen a mish network"):
        deepen(Net(NetConfig.from_name("1x8", activation="mish")), 2)
    assert deepen(Net(NetConfig.from_name("2x8")), 2).config.blocks == 2


# --------------------------------------------------------------------------- learn --init-from


def test_learn_init_from_the_bundled_network_starts_from_its_weights(tmp_path, bundled):
    from test_learner import make_run, run_learn
    from test_lc0_trainer import encoded

    from engine.network import Network
    from trainer.rundir import checkpoint_path, list_checkpoints
    from trainer.model import load_net

    run = make_run(tmp_path / "run")  # [model] net = "1x8"
    code, lines = run_learn(run, steps=2, init_from=DEFAULT)
    assert code == 0, lines
    size = bundled[0].config.name
    assert any(f"default.onnx: cyzero ONNX export, {size}" in ln and f'net "1x8" -> "{size}"' in ln
               for ln in lines), lines
    assert any("(batch norms calibrated on" in ln and "default.onnx" in ln for ln in lines), lines
    generations = [json.loads(ln) for ln in open(os.path.join(run, "generations.jsonl"))]
    assert [(g["generation"], g["step"]) for g in generations] == [(0, 0), (1, 2)]

    # generation 0 computes what the bundled file computes; its batch norms hold real statistics
    planes, _ = encoded()
    outputs = []
    for path in (DEFAULT, os.path.join(run, generations[0]["onnx"])):
        network = Network(path, backend="cpu")
        try:
            outputs.append(network.evaluate(planes))
        finally:
            network.close()
    (policy, wdl, mlh), (got_policy, got_wdl, got_mlh) = outputs
    np.testing.assert_allclose(got_policy, policy, atol=1e-3, rtol=0)
    np.testing.assert_allclose(got_wdl, wdl, atol=1e-4, rtol=0)
    np.testing.assert_allclose(got_mlh, mlh, atol=1e-2, rtol=1e-4)
    step0 = torch.load(checkpoint_path(run, 0), weights_only=True)
    assert not torch.all(step0["model"]["stem.1.running_mean"] == 0)
    # every convolution rescaled per output channel so that its batch norm sees unit-variance inputs
    variances = torch.cat([v for k, v in step0["model"].items() if k.endswith("running_var")])
    assert len(variances) > 500 and float(variances.max()) <= 1.0 + 1e-5
    assert float(variances.median()) > 0.999, variances
    source, _ = bundled
    ratio = step0["model"]["stem.0.weight"] / source.stem[0].weight.detach()
    per_channel = ratio.flatten(1)[:, :1]
    assert float(ratio.min()) > 0 and not torch.allclose(ratio, torch.ones_like(ratio))
    torch.testing.assert_close(ratio.flatten(1), per_channel.expand_as(ratio.flatten(1)), rtol=1e-4, atol=0)

    step2 = torch.load(list_checkpoints(run)[-1][1], weights_only=True)
    assert step2["step"] == 2 and load_net(step2).config == source.config
    assert step2["train_config"]["train"]["init_from"] == DEFAULT


def test_learn_init_from_with_init_blocks_deepens_the_file_and_starts_from_its_function(tmp_path, tiny_export,
                                                                                        positions, capsys):
    from test_learner import TINY, make_run, run_learn

    from engine.network import Network
    from trainer.cli import main
    from trainer.rundir import list_checkpoints
    from trainer.model import load_net

    source = tmp_path / "tiny.onnx"
    source.write_bytes(tiny_export)  # a 1x8
    run = make_run(tmp_path / "run", config=TINY.replace("[train]\n", "[train]\ninit_blocks = 3\n"))
    code, lines = run_learn(run, steps=2, init_from=str(source))
    assert code == 0, lines
    assert any("deepened to 3x8 by blocks that start as the identity" in ln for ln in lines), lines
    generations = [json.loads(ln) for ln in open(os.path.join(run, "generations.jsonl"))]
    outputs = []
    for path in (source, os.path.join(run, generations[0]["onnx"])):
        network = Network(str(path), backend="cpu")
        try:
            outputs.append(network.evaluate(positions[0]))
        finally:
            network.close()
    for got, want in zip(outputs[1], outputs[0], strict=True):
        np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)
    step2 = torch.load(list_checkpoints(run)[-1][1], weights_only=True)
    assert step2["step"] == 2 and load_net(step2).config.name == "3x8"

    # a network only grows: fewer blocks than the file's is a one-line error before any checkpoint
    other = make_run(tmp_path / "other", config=TINY.replace('net = "1x8"', 'net = "2x8"').replace(
        "[train]\n", "[train]\ninit_blocks = 1\n"))
    deeper = tmp_path / "deeper.onnx"
    export_onnx(randomised(NetConfig.from_name("2x8"), seed=2), deeper, check_planes=positions[0])
    code = main(["learn", other, "--steps", "2", "--no-progress", "--init-from", str(deeper)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and "train.init_blocks = 1" in err[-1] and "can only grow" in err[-1], err
    assert list_checkpoints(other) == []


def test_learn_init_from_a_reduced_precision_file_is_a_one_line_error(tmp_path, capsys):
    from test_learner import make_run

    from trainer.cli import main
    from trainer.rundir import list_checkpoints

    run = make_run(tmp_path / "run")
    code = main(["learn", run, "--steps", "2", "--no-progress", "--init-from", os.path.join(NETS, "default.int8.onnx")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, err
    assert "train.init_from" in err[-1] and "int8" in err[-1] and "use the fp32 file (default.onnx)" in err[-1], err
    assert list_checkpoints(run) == []
