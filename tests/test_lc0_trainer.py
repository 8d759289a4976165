"""lc0 network files on the trainer's side (trainer/lc0_import.py): the PyTorch network rebuilt
from a file computes what lc0's graph computes, ``cyzero-train export --from-lc0`` and
``learn --init-from`` / ``train.init_from``.

The lc0 file is the repository's fixture ``tests/data/lc0/cyzero-3x16.pb.gz`` (3x16 SE, conv policy,
WDL, a ReLU moves-left head: a file lc0 v0.32.1 plays, ``tests/test_lc0.py``) and, where a user has
it, Maia 1100 (6x64, written by lc0's own trainer; an extra, ``lc0_files.MAIA``). The other shapes
(classical policy and value heads, Mish, no SE) are tiny random files written by
``tests/lc0_files.py``. The reference is always :func:`engine.lc0_onnx.lc0_to_onnx`'s graph.
"""

from __future__ import annotations

import copy
import json
import os

import numpy as np
import pytest
import torch

from engine.encoding import encode_position, legal_mask
from engine.board import Board
from lc0_files import CYZERO, MAIA, Lc0Spec, fixture_params, wrap_onnx, write_lc0
from trainer.run_setup import model_section, net_config
from trainer.rundir import checkpoint_path, list_checkpoints
from trainer.config import default_config, model_differences
from trainer.model import NetConfig

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("one_thread")]

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The shape each lc0 fixture is rebuilt as.
CONFIGS = {
    CYZERO.name: NetConfig(blocks=3, filters=16, se_ratio=4, moves_left=True, mlh_activation="relu",
                           value_channels=8, value_hidden=32, mlh_channels=4, mlh_hidden=16),
    MAIA.name: NetConfig(blocks=6, filters=64, se_ratio=8, moves_left=False, policy_head="conv"),
}


# Positions with history, both sides to move, a high rule50 count, castling and promotions.
POSITIONS = [
    (None, []),
    (None, ["e2e4", "c7c5", "g1f3", "d7d6"]),
    ("r3k2r/pppq1ppp/2npbn2/2b1p3/2B1P3/2NPBN2/PPPQ1PPP/R3K2R w KQkq - 4 9", ["e1g1"]),
    ("8/5k2/8/3K4/8/8/6R1/8 w - - 57 120", ["g2g5", "f7e7"]),
    ("4k3/1P6/8/8/8/8/6p1/4K3 w - - 0 50", []),
    ("4k3/1P6/8/8/8/8/6p1/4K3 b - - 0 50", []),
    ("rnbqkbnr/pp1ppppp/8/2p5/4P3/8/PPPP1PPP/RNBQKBNR w KQkq c6 0 2", ["g1f3", "b8c6", "f1b5"]),
    ("2r3k1/5ppp/8/8/8/8/5PPP/2R3K1 b - - 99 80", []),
]


def encoded() -> tuple[np.ndarray, np.ndarray]:
    planes, masks = [], []
    for fen, moves in POSITIONS:
        planes.append(encode_position(fen, moves))
        board = Board(fen) if fen else Board()
        for move in moves:
            board.push_uci(move)
        masks.append(np.asarray(legal_mask(board), dtype=bool))
    return np.stack(planes).astype(np.float32), np.stack(masks)


def lc0_graph_outputs(path: str, planes: np.ndarray):
    """What the engine computes for an lc0 file (engine.network.Network builds lc0_to_onnx's graph)."""
    from engine.network import Network

    net = Network(path, backend="cpu")
    try:
        return net.evaluate(planes)
    finally:
        net.close()


# --------------------------------------------------------------------------- the rebuilt network


@pytest.mark.parametrize("fixture", fixture_params())
def test_an_lc0_file_rebuilt_in_pytorch_computes_what_lc0s_graph_computes(fixture):
    from engine.lc0 import read_lc0_file
    from trainer.lc0_import import check_against_lc0, net_from_lc0

    lc0net = read_lc0_file(fixture.need().pb)
    net = net_from_lc0(lc0net)
    assert net.config == CONFIGS[fixture.name]
    planes, masks = encoded()
    assert planes[3, 109].max() > 50  # the rule50 plane, raw, is part of the check
    numbers = check_against_lc0(net, lc0net, planes, masks)
    assert numbers["positions"] == 8 and numbers["policy_argmax_agreement"] == 1.0
    assert numbers["policy_max_abs_diff"] < 1e-3 and numbers["wdl_max_abs_diff"] < 1e-4

    # and against the engine's own path for the file, computed independently of the module
    policy, wdl, mlh = lc0_graph_outputs(fixture.pb, planes)
    with torch.no_grad():
        out = net.eval()(torch.from_numpy(planes))
    np.testing.assert_allclose(out.policy.numpy(), policy, atol=1e-3, rtol=0)
    np.testing.assert_allclose(torch.softmax(out.wdl, 1).numpy(), wdl, atol=1e-4, rtol=0)
    if fixture.spec.moves_left:  # lc0's ReLU head, tens of plies
        np.testing.assert_allclose(out.mlh.numpy().reshape(-1), mlh, atol=1e-2, rtol=0)
    else:
        assert mlh is None and out.mlh is None


def test_conv_policy_planes_keep_the_moves_and_reorder_only_the_promotions():
    from engine.lc0 import CONV_POLICY_MAP
    from trainer.lc0_import import conv_policy_planes
    from trainer.model import policy_index_and_map

    planes = conv_policy_planes()
    assert list(planes[:64]) == list(range(64))
    # cyzero: q, r, b within each direction; lc0: r, b, q
    assert list(planes[64:]) == [66, 64, 65, 69, 67, 68, 72, 70, 71]
    _, ours = policy_index_and_map()
    ours = np.asarray(ours)
    assert np.array_equal(planes[ours // 64] * 64 + ours % 64, CONV_POLICY_MAP)


SHAPES = [
    Lc0Spec(blocks=2, filters=16, se=True, se_channels=4, policy="convolution", value="wdl", moves_left=True,
            activation="mish", seed=1),
    Lc0Spec(blocks=1, filters=16, se=False, policy="classical", value="classical", moves_left=True, old_bn=True,
            seed=2),
    Lc0Spec(blocks=2, filters=8, se=True, se_channels=2, policy="classical", value="wdl", activation="mish", seed=3),
    Lc0Spec(blocks=1, filters=8, se=False, policy="convolution", value="classical", moves_left=True, seed=4),
]


@pytest.mark.parametrize("spec", SHAPES, ids=lambda s: f"{'se' if s.se else 'plain'}-{s.policy}-{s.value}-"
                                                       f"{'mlh-' if s.moves_left else ''}{s.activation}")
def test_every_classical_shape_is_rebuilt_exactly(tmp_path, spec):
    from engine.lc0 import read_lc0_file
    from trainer.lc0_import import check_against_lc0, net_from_lc0
    from trainer.model import load_net, save_checkpoint_dict

    path = str(tmp_path / "net.pb.gz")
    write_lc0(path, spec)
    lc0net = read_lc0_file(path)
    net = net_from_lc0(lc0net)
    c = net.config
    assert (c.blocks, c.filters, c.se, c.activation, c.moves_left) == (
        spec.blocks, spec.filters, spec.se, spec.activation, spec.moves_left)
    assert c.policy_head == ("conv" if spec.policy == "convolution" else "fc")
    if spec.se:
        assert c.se_channels == spec.se_channels
    if spec.moves_left:
        assert c.mlh_activation == "relu"
    planes, masks = encoded()
    numbers = check_against_lc0(net, lc0net, planes, masks)
    assert numbers["policy_argmax_agreement"] == 1.0
    if spec.value == "classical":  # W - L = tanh, no draws: the WDL head says so exactly
        with torch.no_grad():
            wdl = torch.softmax(net(torch.from_numpy(planes)).wdl, 1)
        assert float(wdl[:, 1].max()) < 1e-12

    # the config and the weights survive a checkpoint and the run's [model] section
    assert NetConfig.from_dict(json.loads(json.dumps(c.to_dict()))) == c
    config = default_config().replace(model=model_section(c))
    assert net_config(config) == c
    again = load_net(save_checkpoint_dict(net)).eval()
    check_against_lc0(again, lc0net, planes, masks)


def test_what_cyzero_cannot_represent_is_a_one_line_error(tmp_path):
    from onnx import TensorProto, helper

    from engine.lc0 import read_lc0, read_lc0_file
    from trainer.lc0_import import Lc0ImportError, net_from_lc0
    from trainer.network_files import read_network

    path = str(tmp_path / "odd-se.pb.gz")
    write_lc0(path, Lc0Spec(blocks=1, filters=16, se=True, se_channels=6))  # no whole r gives 16 // r == 6
    with pytest.raises(Lc0ImportError, match="no r gives 6") as info:
        net_from_lc0(read_lc0_file(path))
    assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match="odd-se.pb.gz: .*SE unit 6 wide"):
        read_network(path)

    graph = helper.make_graph(
        [helper.make_node("Identity", ["/input/planes"], ["/output/policy"]),
         helper.make_node("Identity", ["/input/planes"], ["/output/wdl"])], "g",
        [helper.make_tensor_value_info("/input/planes", TensorProto.FLOAT, ["batch", 112, 8, 8])],
        [helper.make_tensor_value_info("/output/policy", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("/output/wdl", TensorProto.FLOAT, None)])
    inside = read_lc0(wrap_onnx(helper.make_model(graph).SerializeToString()))
    with pytest.raises(Lc0ImportError, match="holds an ONNX model"):
        net_from_lc0(inside)


@pytest.mark.parametrize("fixture", fixture_params())
def test_calibrated_batch_norms_keep_eval_outputs_and_make_training_mode_agree(fixture):
    from engine.lc0 import read_lc0_file
    from trainer.export import sample_positions
    from trainer.lc0_import import calibrate_batch_norm, net_from_lc0

    net = net_from_lc0(read_lc0_file(fixture.need().pb))
    x = torch.from_numpy(sample_positions(256, seed=4)[0])  # a batch as training sees one
    with torch.no_grad():
        before = net.eval()(x)
        identity_train = copy.deepcopy(net).train()(x)  # a forward in training mode moves the statistics
        calibrate_batch_norm(net.eval(), sample_positions(128, seed=3)[0])
        after = net.eval()(x)
        calibrated_train = net.train()(x)
    np.testing.assert_allclose(after.policy.numpy(), before.policy.numpy(), atol=1e-4, rtol=0)
    np.testing.assert_allclose(after.wdl.numpy(), before.wdl.numpy(), atol=1e-4, rtol=0)

    def drift(out):  # how far training mode's policy is from eval mode's (mean KL, nats)
        p = torch.log_softmax(before.policy, 1)
        return float((p.exp() * (p - torch.log_softmax(out.policy, 1))).sum(1).mean())

    # measured 0.002 and 0.66 on the repository's fixture, 0.005 and 2.8 on Maia
    assert drift(calibrated_train) < 0.05 and drift(identity_train) > 0.3


def test_net_config_dicts_and_run_configs_stay_as_they_were():
    old = {"blocks": 6, "filters": 64, "se_ratio": 4, "moves_left": True, "policy_head": "conv",
           "policy_channels": 32, "value_channels": 32, "value_hidden": 128, "mlh_channels": 8, "mlh_hidden": 128}
    assert NetConfig.from_name("6x64").to_dict() == old  # checkpoints and export metadata unchanged
    assert NetConfig.from_dict(old) == NetConfig.from_name("6x64")
    lc0ish = NetConfig.from_name("2x16", se=False, activation="mish", mlh_activation="relu")
    assert NetConfig.from_dict(lc0ish.to_dict()) == lc0ish
    with pytest.raises(ValueError, match="activation"):
        NetConfig.from_name("2x16", activation="gelu")
    # a checkpoint written before the new [model] keys resumes under a config that has them
    before = default_config().to_dict()
    for key in ("se", "activation", "policy_channels", "value_channels", "value_hidden", "mlh_channels",
                "mlh_hidden", "mlh_activation"):
        del before["model"][key]
    assert model_differences(default_config(), before) == []
    assert net_config(default_config()) == NetConfig.from_name("6x64")


# --------------------------------------------------------------------------- export --from-lc0


def test_export_from_lc0_writes_checked_variants_the_engine_loads(tmp_path, capsys):
    from engine.network import Network
    from trainer.cli import main

    source = CYZERO.need().pb
    out = tmp_path / "out"
    assert main(["export", "--from-lc0", source, "--out", str(out), "--name", "net", "--positions", "32"]) == 0
    printed = capsys.readouterr().out
    assert CYZERO.description in printed
    assert "torch vs lc0's graph over 32 positions" in printed
    assert all(f"{v} " in printed for v in ("fp32", "fp16", "int8"))
    names = sorted(os.listdir(out))
    assert names == sorted(f"net{s}{x}" for s in (".onnx", ".fp16.onnx", ".int8.onnx") for x in ("", ".sha256"))

    planes, _ = encoded()
    policy, wdl, mlh = lc0_graph_outputs(source, planes)
    for name, policy_tol, wdl_tol in (("net.onnx", 1e-3, 1e-4), ("net.fp16.onnx", 0.1, 5e-3)):
        net = Network(str(out / name), backend="cpu")
        try:
            got_policy, got_wdl, got_mlh = net.evaluate(planes)
            assert "3x16" in net.description
            np.testing.assert_allclose(got_mlh, mlh, atol=policy_tol * 10, rtol=0)
        finally:
            net.close()
        np.testing.assert_allclose(got_policy, policy, atol=policy_tol, rtol=0)
        np.testing.assert_allclose(got_wdl, wdl, atol=wdl_tol, rtol=0)
    Network(str(out / "net.int8.onnx"), backend="cpu").close()

    with pytest.raises(SystemExit):
        main(["export", "--from-lc0", source, "--config", "3x16", "--out", str(out)])
    assert "leave out --config" in capsys.readouterr().err


def test_export_from_lc0_refuses_what_is_not_an_lc0_network(tmp_path, capsys):
    from trainer.cli import main

    bogus = tmp_path / "bogus.pb.gz"
    bogus.write_bytes(b"not a network")
    assert main(["export", "--from-lc0", str(bogus), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("cyzero-train export: error: bogus.pb.gz") and "\n" not in err
    assert not (tmp_path / "out").exists()


# --------------------------------------------------------------------------- --init-from


def test_learn_init_from_starts_a_new_run_from_the_file_and_resumes_without_it(tmp_path):
    from test_learner import make_run, run_learn

    from engine.network import Network
    from trainer.model import load_net

    source = CYZERO.need().pb
    run = make_run(tmp_path / "run")  # its config.toml says [model] net = "1x8"
    code, lines = run_learn(run, steps=2, init_from=source)
    assert code == 0, lines
    assert any("shape comes from the file" in ln and "net \"1x8\" -> \"3x16\"" in ln for ln in lines), lines
    assert any("a new run: starting at step 0 from generation 0" in ln for ln in lines), lines
    generations = [json.loads(ln) for ln in open(os.path.join(run, "generations.jsonl"))]
    assert [(g["generation"], g["step"]) for g in generations] == [(0, 0), (1, 2)]

    # generation 0 is the file's network
    planes, _ = encoded()
    policy, wdl, _ = lc0_graph_outputs(source, planes)
    gen0 = Network(os.path.join(run, generations[0]["onnx"]), backend="cpu")
    try:
        got_policy, got_wdl, _ = gen0.evaluate(planes)
    finally:
        gen0.close()
    np.testing.assert_allclose(got_policy, policy, atol=1e-3, rtol=0)
    np.testing.assert_allclose(got_wdl, wdl, atol=1e-4, rtol=0)

    step2 = torch.load(list_checkpoints(run)[-1][1], weights_only=True)
    assert step2["step"] == 2 and load_net(step2).config == CONFIGS[CYZERO.name]
    assert step2["train_config"]["train"]["init_from"] == source
    effective = open(os.path.join(run, "config.effective.toml")).read()
    assert 'net = "3x16"' in effective and "se_ratio = 4" in effective

    # resuming wins: with --init-from one line says it is not used; without it, the run's [model] (1x8 in
    # its config.toml) does not stop the resume either
    code, lines = run_learn(run, steps=3, init_from=source)
    assert code == 0 and sum("is not used" in ln for ln in lines) == 1, lines
    code, lines = run_learn(run, steps=4)
    assert code == 0 and any("resuming at step 3" in ln for ln in lines), lines

    # a cyzero checkpoint is a network to start from too (the daemon's way: initialize_run)
    from trainer.learner import initialize_run
    from trainer.config import load_config

    other = make_run(tmp_path / "other")
    config = load_config(os.path.join(other, "config.toml"))
    checkpoint = list_checkpoints(run)[-1][1]
    record = initialize_run(other, config=config.replace(train={"init_from": checkpoint}), log=lambda line: None)
    assert record["generation"] == 0
    started = torch.load(checkpoint_path(other, 0), weights_only=True)
    origin = torch.load(checkpoint, weights_only=True)
    assert started["config"] == origin["config"] and started["train_config"]["model"]["net"] == "3x16"
    assert all(torch.equal(started["model"][k], v) for k, v in origin["model"].items())  # its raw weights


def test_init_from_a_file_that_holds_no_network_is_a_one_line_error_that_creates_no_checkpoint(tmp_path, capsys):
    from test_learner import make_run

    from trainer.cli import _build_parser, main

    run = make_run(tmp_path / "run")
    for name, why in (("nowhere.pb.gz", "cannot read"), ("net.onnx", "ONNX network")):
        if name.endswith(".onnx"):
            (tmp_path / name).write_bytes(b"\x08\x07")
        code = main(["learn", run, "--steps", "2", "--no-progress", "--init-from", str(tmp_path / name)])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and "train.init_from" in err[-1] and name in err[-1] and why in err[-1], err
    assert list_checkpoints(run) == []
    assert _build_parser().parse_args(["run", run, "--init-from", "maia.pb.gz"]).init_from == "maia.pb.gz"
