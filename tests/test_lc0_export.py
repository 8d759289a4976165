"""cyzero networks written as lc0 weight files (trainer/lc0_export.py, ``cyzero-train export --lc0``).

Every written file is read back twice: by the engine's reader (``engine.lc0``) and by the
independent protobuf walker and NumPy forward pass of ``tests/test_lc0_files.py`` and
``tests/lc0_files.py``, which are pinned to lc0's own outputs. The real case is a round trip (read,
write, read) of the repository's lc0 fixture (``tests/data/lc0/``, which this writer made and lc0
v0.32.1 evaluated) checked against lc0's own evaluations of the original; the same runs on Maia 1100,
a file lc0's own trainer wrote, where a user has it (an extra: ``lc0_files.MAIA`` says where to get it).
"""

from __future__ import annotations

import copy
import gzip
import json
import os
import shutil
import struct

import numpy as np
import pytest
import torch

import lc0_files as L
from engine.lc0 import read_lc0, read_lc0_file
from lc0_files import CYZERO, Lc0Fixture, assert_plays_as_lc0, fixture_params, lc0_evaluations
from test_lc0_files import decode_net, fields, network_format, one
from test_lc0_trainer import SHAPES, encoded
from trainer.lc0_export import (
    LC0_FILE_PARITY, Lc0ExportError, _layer, check_lc0_file, lc0_file_bytes, write_lc0,
)
from trainer.lc0_import import net_from_lc0
from trainer.model import InferenceNet, Net, NetConfig

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("one_thread")]

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT = os.path.join(REPO, "engine", "nets", "default.onnx")


def with_real_statistics(net: Net) -> Net:
    """``net`` with batch norms that are not the identity (what a trained checkpoint holds): each
    one's running statistics are those of its inputs in training mode, as training leaves them."""
    planes, _ = encoded()
    net = copy.deepcopy(net)
    for m in net.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.reset_running_stats()
            m.momentum = None  # a cumulative average over the forward passes below
    net.train()
    with torch.no_grad():
        net(torch.from_numpy(np.concatenate([planes] * 4)))
    return net.eval()


def one_line(exc: pytest.ExceptionInfo) -> str:
    message = str(exc.value)
    assert message and "\n" not in message, message
    return message


# --------------------------------------------------------------------------- the encoding


def test_a_linear16_layer_is_min_max_and_uint16s_as_the_proto_lays_them_out():
    # Layer { float min_val = 1; float max_val = 2; bytes params = 3; }, LINEAR16 by default:
    # 0.0 -> 0, 1.0 -> 65535, 0.5 -> 32767.5, rounded to even 32768 (0x8000, little-endian)
    golden = (b"\x0d" + struct.pack("<f", 0.0) + b"\x15" + struct.pack("<f", 1.0)
              + b"\x1a\x06" + b"\x00\x00" + b"\xff\xff" + b"\x00\x80")
    assert _layer(np.array([0.0, 1.0, 0.5])) == golden
    # a constant layer: min = max, every value 0
    assert _layer(np.array([2.5, 2.5])) == (b"\x0d" + struct.pack("<f", 2.5) + b"\x15"
                                            + struct.pack("<f", 2.5) + b"\x1a\x04" + bytes(4))
    with pytest.raises(Lc0ExportError, match="NaN"):
        _layer(np.array([0.0, np.nan]))


# --------------------------------------------------------------------------- lc0's files, round trip

# A file read, written and read again is rounded to LINEAR16 twice: what lc0 printed for the original
# still holds, to V within 3e-3, D within 6e-3, moves left within 0.1 ply and every share within 0.15 points.
ROUND_TRIP = {"v": 3e-3, "d": 6e-3, "m": 0.1, "p": 0.15}


def _net(fixture: Lc0Fixture):
    return net_from_lc0(read_lc0_file(fixture.need().pb))


@pytest.mark.parametrize("fixture", fixture_params())
def test_read_written_and_read_again_still_plays_as_lc0_evaluates_it(fixture):
    from engine.encoding import encode_position

    message = lc0_file_bytes(_net(fixture))
    _, weights, other = decode_net(message)  # the independent reader
    assert not other
    expected = fixture.lc0()
    planes = np.stack([encode_position(p["fen"]) for p in expected["positions"]])
    assert_plays_as_lc0(expected, *L.reference_forward(weights, fixture.spec, planes), tolerance=ROUND_TRIP)


def _tree(message: bytes) -> dict[str, object]:
    """A Net message as net.proto nests it, flattened: each Layer by its field path with its number
    of values, each scalar with its value (the weights themselves differ between writers)."""
    out: dict[str, object] = {}

    def walk(buf: bytes, prefix: str, kind: str) -> None:
        residual = 0
        for number, wire, value in fields(buf):
            if kind == "net" and number in (3, 4, 10):
                walk(value, f"{prefix}{number}/", {3: "version", 4: "format", 10: "weights"}[number])
            elif kind == "format" and number == 2:
                walk(value, f"{prefix}{number}/", "network_format")
            elif kind == "weights" and number == 2:
                walk(value, f"{prefix}2[{residual}]/", "residual")
                residual += 1
            elif kind == "weights" and number in (1, 3, 6, 11, 12):
                walk(value, f"{prefix}{number}/", "convblock")
            elif kind == "residual" and number in (1, 2):
                walk(value, f"{prefix}{number}/", "convblock")
            elif kind == "residual" and number == 3:
                walk(value, f"{prefix}{number}/", "se")
            elif kind in ("weights", "convblock", "se"):
                assert wire == 2, (prefix, number)
                layer = {f: v for f, _, v in fields(value)}
                assert set(layer) <= {1, 2, 3, 4}, (prefix, number, sorted(layer))
                width = 4 if layer.get(4, 1) == 4 else 2
                out[f"{prefix}{number}"] = len(layer.get(3, b"")) // width
            else:
                out[f"{prefix}{number}"] = value if wire != 2 else bytes(value)
    walk(message, "", "net")
    return out


@pytest.mark.parametrize("fixture", fixture_params())
def test_the_written_file_is_laid_out_as_the_original(fixture):
    """Maia's file is lc0's own trainer's layout; the repository's fixture, read and written again,
    keeps its own (the moves-left head too)."""
    written = lc0_file_bytes(_net(fixture))
    original = gzip.decompress(open(fixture.pb, "rb").read())
    mine, theirs = _tree(written), _tree(original)
    layers = {k: v for k, v in theirs.items() if k.startswith("10/")}
    # every layer of the original file, and nothing else, with as many values
    assert {k: v for k, v in mine.items() if k.startswith("10/")} == layers
    assert mine["1"] == theirs["1"] == 0x1C0  # the magic, fixed32
    # format: LINEAR16, classical input, WDL output, SE with head formats, conv policy, WDL value, moves left
    assert {k: v for k, v in mine.items() if k.startswith("4/")} == {
        "4/1": 1, "4/2/1": 1, "4/2/2": 2, "4/2/3": 4, "4/2/4": 2, "4/2/5": 2, "4/2/6": int(fixture.spec.moves_left)}
    assert {k: v for k, v in theirs.items() if k.startswith("4/")}.items() >= {
        "4/1": 1, "4/2/1": 1, "4/2/2": 2, "4/2/3": 4, "4/2/4": 2, "4/2/5": 2}.items()
    assert (mine["3/1"], mine["3/2"], mine.get("3/3", 0)) == (theirs["3/1"], theirs["3/2"], theirs.get("3/3", 0))


# --------------------------------------------------------------------------- every shape


@pytest.mark.parametrize("spec", SHAPES, ids=lambda s: f"{'se' if s.se else 'plain'}-{s.policy}-{s.value}-"
                                                       f"{'mlh-' if s.moves_left else ''}{s.activation}")
def test_every_classical_shape_written_reads_back_as_the_same_network(tmp_path, spec):
    path = str(tmp_path / "source.pb.gz")
    L.write_lc0(path, spec)
    net = with_real_statistics(net_from_lc0(read_lc0_file(path)))
    planes, masks = encoded()
    message = lc0_file_bytes(net)
    lc0net, numbers = check_lc0_file(net, message, planes, masks)
    assert numbers["policy_argmax_agreement"] == 1.0
    w = lc0net.weights
    assert (w.blocks, w.filters, w.se, w.policy, w.moves_left, w.activation) == (
        spec.blocks, spec.filters, spec.se, spec.policy, spec.moves_left, spec.activation)
    assert w.wdl  # cyzero's value head is WDL; a single value became WDL logits
    # the independent reader and forward pass agree with the PyTorch network too
    _, weights, _ = decode_net(message)
    written = L.Lc0Spec(blocks=spec.blocks, filters=spec.filters, se=spec.se, se_channels=spec.se_channels,
                        policy=spec.policy, value="wdl", moves_left=spec.moves_left, activation=spec.activation)
    policy, wdl, _ = L.reference_forward(weights, written, planes)
    with torch.no_grad():
        ours = InferenceNet(net.eval())(torch.from_numpy(planes))
    np.testing.assert_allclose(policy, ours[0].numpy(), rtol=0, atol=LC0_FILE_PARITY["policy"])
    np.testing.assert_allclose(wdl, ours[1].numpy(), rtol=0, atol=LC0_FILE_PARITY["wdl"])
    nf = network_format(message)
    assert nf[7 if spec.activation == "mish" else 1] == 1  # Mish says so; input format 1 always


def test_batch_norms_are_written_as_lc0_folds_them():
    net = with_real_statistics(Net(NetConfig.from_name("2x16", moves_left=False), seed=3))
    bn = net.blocks[0].conv1[1]
    assert not np.allclose(bn.running_var.numpy(), 1.0, atol=0.05)  # real statistics, not the identity
    planes, masks = encoded()
    check_lc0_file(net, lc0_file_bytes(net), planes, masks)
    # lc0 folds gamma / sqrt(var + 1e-5); a batch norm with epsilon 1e-2 on variances near 1e-2
    # scales by about 1/sqrt(2) less, which the file must carry (in its gammas)
    with torch.no_grad():
        bn.running_var.fill_(1e-2)
        bn.eps = 1e-2
    _, weights, _ = decode_net(lc0_file_bytes(net))
    w, gamma = weights["residual.0.conv1.weights"], weights["residual.0.conv1.bn_gammas"]
    np.testing.assert_array_equal(weights["residual.0.conv1.bn_means"], 0.0)
    np.testing.assert_allclose(weights["residual.0.conv1.bn_stddivs"], 1.0 - 1e-5, rtol=1e-7)
    folded = w * (gamma / np.sqrt(1.0))[:, None, None, None]  # lc0: gamma / sqrt(stddiv + 1e-5) = gamma
    expected = (net.blocks[0].conv1[0].weight * (bn.weight / torch.sqrt(bn.running_var + bn.eps))[:, None, None, None])
    expected = expected.detach().numpy()
    np.testing.assert_allclose(folded, expected, rtol=0, atol=1e-4 * float(np.abs(expected).max()))
    check_lc0_file(net, lc0_file_bytes(net), planes, masks)


def test_a_softplus_moves_left_head_is_refused_in_one_line_or_left_out():
    net = Net(NetConfig.from_name("1x8"), seed=1)
    assert net.config.moves_left and net.config.mlh_activation == "softplus"
    with pytest.raises(Lc0ExportError) as exc:
        lc0_file_bytes(net)
    assert "softplus" in one_line(exc) and "--no-mlh" in one_line(exc)
    message = lc0_file_bytes(net, include_moves_left=False)
    assert not read_lc0(message).weights.moves_left and network_format(message)[6] == 0
    planes, masks = encoded()
    check_lc0_file(net, message, planes, masks)  # the rest of the network, unchanged
    with pytest.raises(Lc0ExportError, match="no moves-left head"):
        lc0_file_bytes(Net(NetConfig.from_name("1x8", moves_left=False)), include_moves_left=True)


def test_a_conv_policy_writes_lc0s_80_planes_with_the_unused_seven_zero():
    net = Net(NetConfig.from_name("1x8", moves_left=False), seed=2)
    _, weights, _ = decode_net(lc0_file_bytes(net))
    from trainer.lc0_import import conv_policy_planes

    assert weights["policy.weights"].shape == (80, 8, 3, 3)
    used = conv_policy_planes()
    unused = sorted(set(range(80)) - set(used.tolist()))
    assert unused == list(range(73, 80))
    conv = net.policy.conv2
    for name, ours in (("weights", conv.weight), ("biases", conv.bias)):
        written = weights[f"policy.{name}"]
        step = float(np.ptp(written)) / 65535  # zero within one LINEAR16 step of the layer's range
        assert np.abs(written[unused]).max() <= step
        np.testing.assert_allclose(written[used], ours.detach().numpy(), rtol=0, atol=step)


# --------------------------------------------------------------------------- the command


def test_export_lc0_writes_a_file_the_engine_plays_and_its_sha256(tmp_path, capsys):
    from weights_helpers import bundled_size

    from engine.files import verify_sha256
    from engine.network import Network
    from trainer.cli import main

    out = tmp_path / "out"
    assert main(["export", "--checkpoint", DEFAULT, "--lc0", "--no-mlh", "--out", str(out), "--name", "cy",
                 "--positions", "32"]) == 0
    printed = capsys.readouterr().out
    assert "lc0   " in printed and "cy.pb.gz" in printed and "best legal move agrees 100.0%" in printed
    assert sorted(os.listdir(out)) == ["cy.pb.gz", "cy.pb.gz.sha256"]  # --lc0 alone: no ONNX variants
    path = str(out / "cy.pb.gz")
    verify_sha256(path)
    planes, _ = encoded()
    theirs = Network(DEFAULT, backend="cpu")
    mine = Network(path, backend="cpu")
    try:
        assert f"lc0 network {bundled_size()} SE" in mine.description
        a, b = theirs.evaluate(planes), mine.evaluate(planes)
        np.testing.assert_allclose(a[1], b[1], rtol=0, atol=LC0_FILE_PARITY["wdl"])
        assert (a[0].argmax(1) == b[0].argmax(1)).all()
    finally:
        theirs.close()
        mine.close()

    # the bundled network's softplus moves-left head: one line, nothing written
    assert main(["export", "--checkpoint", DEFAULT, "--lc0", "--out", str(tmp_path / "no"), "--positions", "8"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "softplus" in err[-1] and "--no-mlh" in err[-1]
    assert not (tmp_path / "no").exists()


def test_export_from_lc0_to_lc0_round_trips_with_the_onnx_variants(tmp_path, capsys):
    from trainer.cli import main

    out = tmp_path / "out"
    assert main(["export", "--from-lc0", CYZERO.need().pb, "--lc0", "--variants", "fp32", "--out", str(out),
                 "--name", "again", "--positions", "16", "--json"]) == 0
    reports = json.loads(capsys.readouterr().out)
    assert [r["variant"] for r in reports] == ["fp32", "lc0"]
    assert reports[1]["policy_argmax_agreement"] == 1.0
    again = read_lc0_file(out / "again.pb.gz")
    assert again.description.startswith(CYZERO.description)
    assert one(gzip.decompress((out / "again.pb.gz").read_bytes()), 1) is not None


# --------------------------------------------------------------------------- lc0 itself


LC0 = os.environ.get("CYZERO_LC0") or shutil.which("lc0")


@pytest.mark.skipif(not LC0, reason="lc0 not found (put it on PATH or name it in CYZERO_LC0)")
@pytest.mark.parametrize("fixture", fixture_params())
def test_lc0_itself_plays_the_round_tripped_file_as_it_plays_the_original(tmp_path, fixture):
    path = str(tmp_path / "again.pb.gz")
    write_lc0(_net(fixture), path)
    positions = fixture.lc0()["positions"]
    for expected, got in zip(positions, lc0_evaluations(LC0, path, [p["fen"] for p in positions])):
        assert got["v"] == pytest.approx(expected["v"], abs=ROUND_TRIP["v"])
        assert got["d"] == pytest.approx(expected["d"], abs=ROUND_TRIP["d"])
        assert got["m"] == pytest.approx(expected.get("m", 0.0), abs=ROUND_TRIP["m"])
        assert set(got["moves"]) == set(expected["moves"])
        for move, share in got["moves"].items():
            want = expected["moves"][move]["p"]
            assert share["p"] == pytest.approx(want, abs=ROUND_TRIP["p"]), (expected["fen"], move)
