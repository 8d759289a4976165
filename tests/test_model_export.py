"""The PyTorch model, its ONNX export (fp32 / fp16 / int8), atomic writes and the
bundled default network."""

import os

import numpy as np
import onnxruntime as ort
import pytest

from engine import encoding

TRAIN_EXTRA = "needs the train extra: pip install 'cyzero[train]'"
torch = pytest.importorskip("torch", reason=TRAIN_EXTRA)
onnx = pytest.importorskip("onnx", reason=TRAIN_EXTRA)

from trainer import atomic  # noqa: E402
from engine.network import INPUT_NAME, MLH_NAME, POLICY_NAME, WDL_NAME  # noqa: E402
from trainer.export import (  # noqa: E402
    PARITY_BOUNDS, ExportParityError, ParityBounds, export_onnx, export_variants, parity_failures,
    parity_numbers, sample_positions, torch_to_onnx,
)
from trainer.model import (  # noqa: E402
    InferenceNet, Net, NetConfig, build_net, load_net, policy_index_and_map, save_checkpoint_dict,
)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NETS = os.path.join(REPO, "engine", "nets")
OUTPUTS = [POLICY_NAME, WDL_NAME, MLH_NAME]
TINY = "2x16"


def session(path_or_bytes):
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 3
    return ort.InferenceSession(path_or_bytes, options, providers=["CPUExecutionProvider"])


def torch_outputs(net, planes):
    with torch.no_grad():
        return [t.numpy() for t in InferenceNet(net).eval()(torch.from_numpy(planes))]


@pytest.fixture(scope="module")
def positions():
    return sample_positions(40, seed=123)


@pytest.fixture(scope="module")
def tiny_net():
    return build_net(TINY, seed=3).eval()


@pytest.fixture(scope="module")
def exported(tmp_path_factory, tiny_net):
    out = tmp_path_factory.mktemp("nets")
    reports = export_variants(tiny_net, out, stem="tiny", check_positions=64, seed=1)
    return out, {r.variant: r for r in reports}


# --------------------------------------------------------------------------- NetConfig and the model


@pytest.mark.parametrize("name,blocks,filters", [("6x64", 6, 64), ("10x128", 10, 128), ("20X256", 20, 256), (" 2x16 ", 2, 16)])
def test_config_from_name(name, blocks, filters):
    config = NetConfig.from_name(name)
    assert (config.blocks, config.filters) == (blocks, filters)
    assert config.name == f"{blocks}x{filters}"
    assert config.moves_left and config.se_ratio == 4


@pytest.mark.parametrize("name", ["", "6", "6x", "x64", "6x64x2", "6*64", "0x64", "6x0", "-1x64", "six x 64", "6.5x64"])
def test_config_rejects_bad_names(name):
    with pytest.raises(ValueError, match="BLOCKSxFILTERS|at least 1"):
        NetConfig.from_name(name)


def test_config_rejects_bad_fields():
    with pytest.raises(ValueError, match="se_ratio"):
        NetConfig.from_name("6x64", se_ratio=0)
    with pytest.raises(ValueError, match="policy_head"):
        NetConfig.from_name("6x64", policy_head="attention")
    with pytest.raises(ValueError, match="must be a string"):
        NetConfig.from_name(664)
    assert NetConfig.from_dict(NetConfig.from_name("6x64").to_dict()) == NetConfig.from_name("6x64")
    with pytest.raises(ValueError, match="unknown NetConfig fields"):
        NetConfig.from_dict({"blocks": 1, "filters": 8, "colour": "red"})


def test_policy_map_matches_encoder():
    moves, flat = policy_index_and_map()
    assert list(encoding.POLICY_INDEX) == moves
    assert len(set(flat)) == 1858 and max(flat) < 73 * 64


@pytest.mark.parametrize("policy_head", ["conv", "fc"])
@pytest.mark.parametrize("moves_left", [True, False])
def test_forward_shapes(policy_head, moves_left, positions):
    net = Net(NetConfig.from_name("1x8", policy_head=policy_head, moves_left=moves_left), seed=0).eval()
    planes = torch.from_numpy(positions[0][:5])
    out = net(planes)
    assert out.policy.shape == (5, 1858) and out.wdl.shape == (5, 3)
    if moves_left:
        assert out.mlh.shape == (5, 1) and bool((out.mlh >= 0).all())
    else:
        assert out.mlh is None
    inference = InferenceNet(net)(planes)
    assert len(inference) == (3 if moves_left else 2)
    assert torch.allclose(inference[1].sum(1), torch.ones(5))


def test_init_is_deterministic_and_leaves_global_rng_alone():
    torch.manual_seed(99)
    before = torch.rand(1)
    torch.manual_seed(99)
    a = build_net(TINY, seed=7)
    after = torch.rand(1)
    assert torch.equal(before, after), "building a net must not consume the global RNG"
    b = build_net(TINY, seed=7)
    c = build_net(TINY, seed=8)
    for (name, pa), pb in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(pa, pb), name
    assert not torch.equal(a.stem[0].weight, c.stem[0].weight)


def test_checkpoint_round_trip(tmp_path, tiny_net, positions):
    path = tmp_path / "ckpt.pt"
    torch.save(save_checkpoint_dict(tiny_net), path)
    loaded = load_net(str(path)).eval()
    assert loaded.config == tiny_net.config
    for a, b in zip(torch_outputs(tiny_net, positions[0]), torch_outputs(loaded, positions[0])):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="config"):
        load_net(tiny_net.state_dict())


# --------------------------------------------------------------------------- the exported graphs


@pytest.mark.parametrize("variant", ["fp32", "fp16", "int8"])
def test_exported_names_shapes_and_dtypes(exported, variant):
    out, reports = exported
    report = reports[variant]
    model = onnx.load(report.path)
    onnx.checker.check_model(model)
    io = {v.name: v.type.tensor_type for v in list(model.graph.input) + list(model.graph.output)}
    assert [v.name for v in model.graph.input] == [INPUT_NAME]
    assert [v.name for v in model.graph.output] == OUTPUTS
    expected = {INPUT_NAME: ["batch", 112, 8, 8], OUTPUTS[0]: ["batch", 1858], OUTPUTS[1]: ["batch", 3], OUTPUTS[2]: ["batch", 1]}
    for name, shape in expected.items():
        assert io[name].elem_type == onnx.TensorProto.FLOAT, f"{variant} {name} must be float32"
        assert [d.dim_param or d.dim_value for d in io[name].shape.dim] == shape
    assert report.inputs == {INPUT_NAME: expected[INPUT_NAME]}
    meta = {p.key: p.value for p in model.metadata_props}
    assert meta["cyzero.variant"] == variant
    sess = session(report.path)
    assert [(i.name, i.type) for i in sess.get_inputs()] == [(INPUT_NAME, "tensor(float)")]
    assert [(o.name, o.type) for o in sess.get_outputs()] == [(n, "tensor(float)") for n in OUTPUTS]


@pytest.mark.parametrize("variant", ["fp32", "fp16", "int8"])
def test_dynamic_batch_and_parity(exported, tiny_net, positions, variant):
    _, reports = exported
    sess = session(reports[variant].path)
    bounds = PARITY_BOUNDS[variant]
    planes = positions[0]
    for n in (1, 3, 17):
        got = sess.run(None, {INPUT_NAME: planes[:n]})
        ref = torch_outputs(tiny_net, planes[:n])
        assert [g.shape for g in got] == [(n, 1858), (n, 3), (n, 1)]
        assert all(g.dtype == np.float32 for g in got)
        policy, wdl, mlh = got
        scale = max(1.0, float(np.abs(ref[0]).max()))
        assert np.abs(policy - ref[0]).max() <= bounds.policy * scale
        assert np.abs(wdl - ref[1]).max() <= bounds.wdl
        mlh_scale = max(1.0, float(np.abs(ref[2]).max()))
        assert np.abs(mlh - ref[2]).max() <= bounds.mlh * mlh_scale
        assert np.all(wdl >= 0) and np.all(wdl <= 1)
        np.testing.assert_allclose(wdl.sum(axis=1), 1.0, atol=1e-5)
        assert np.all(mlh >= 0)
    if variant == "fp32":
        assert np.abs(policy - ref[0]).max() <= 1e-4 and np.abs(wdl - ref[1]).max() <= 1e-4


def test_reports_are_within_bounds(exported):
    _, reports = exported
    fp32 = reports["fp32"]
    assert fp32.policy_max_abs_diff <= 1e-4 and fp32.wdl_max_abs_diff <= 1e-4 and fp32.mlh_max_abs_diff <= 1e-4
    assert fp32.policy_argmax_agreement == 1.0
    for variant in ("fp16", "int8"):
        r = reports[variant]
        b = PARITY_BOUNDS[variant]
        assert r.policy_max_abs_diff <= b.policy * max(1.0, r.policy_scale)
        assert r.wdl_max_abs_diff <= b.wdl
        assert r.policy_argmax_agreement >= b.min_argmax_agreement
        assert r.positions == 64
    # int8 really is quantized: its convolutions read int8 weights
    model = onnx.load(reports["int8"].path)
    assert any(n.op_type == "DequantizeLinear" for n in model.graph.node)
    # fp16 really computes in float16
    model = onnx.load(reports["fp16"].path)
    assert any(t.data_type == onnx.TensorProto.FLOAT16 for t in model.graph.initializer)


def test_int8_keeps_the_stem_and_the_policy_logits_conv_in_float32(exported):
    """Every block convolution reads int8 weights; the stem (behind the graph's input scaling)
    and the conv that makes the policy logits keep float32 weights (trainer/export.py says why)."""
    _, reports = exported
    model = onnx.load(reports["int8"].path)
    producer = {o: n for n in model.graph.node for o in n.output}
    convs = [n for n in model.graph.node if n.op_type == "Conv"]
    quantized = {n.name: getattr(producer.get(n.input[1]), "op_type", None) == "DequantizeLinear" for n in convs}
    stem = [n.name for n in convs if "stem" in n.name]
    logits = [n.name for n in convs if n.name.startswith("/net/policy/conv2")]
    assert len(stem) == 1 and len(logits) == 1, sorted(quantized)
    assert not quantized[stem[0]] and not quantized[logits[0]]
    rest = [name for name in quantized if name not in stem + logits]
    assert rest and all(quantized[name] for name in rest), quantized


def test_sha256_files_match_and_no_temp_files(exported):
    out, reports = exported
    for report in reports.values():
        with open(report.path, "rb") as f:
            data = f.read()
        assert atomic.sha256_bytes(data) == report.sha256 == atomic.verify_sha256(report.path)
        with open(report.path + ".sha256") as f:
            assert f.read() == f"{report.sha256}  {os.path.basename(report.path)}\n"
    names = sorted(os.listdir(out))
    assert names == sorted(["tiny.onnx", "tiny.fp16.onnx", "tiny.int8.onnx",
                            "tiny.onnx.sha256", "tiny.fp16.onnx.sha256", "tiny.int8.onnx.sha256"])


def test_truncated_file_fails_verification(exported, tmp_path):
    _, reports = exported
    path = tmp_path / "cut.onnx"
    with open(reports["fp32"].path, "rb") as f:
        data = f.read()
    atomic.atomic_write_with_sha256(path, data)
    with open(path, "r+b") as f:
        f.truncate(len(data) // 2)
    with pytest.raises(ValueError, match="does not match"):
        atomic.verify_sha256(path)
    with pytest.raises(Exception):
        session(str(path))


def test_model_without_mlh_exports_two_outputs(tmp_path, positions):
    net = build_net(NetConfig.from_name("1x8", moves_left=False), seed=0)
    report = export_onnx(net, tmp_path / "nomlh.onnx", check_planes=positions[0], check_masks=positions[1])
    assert list(report.outputs) == OUTPUTS[:2] and report.mlh_max_abs_diff is None
    assert [o.name for o in session(report.path).get_outputs()] == OUTPUTS[:2]


@pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::DeprecationWarning")
def test_dynamo_exporter_gives_the_same_contract(positions):
    net = build_net(NetConfig.from_name("1x8"), seed=0)
    model = torch_to_onnx(net, exporter="dynamo")
    assert [v.name for v in model.graph.input] == [INPUT_NAME]
    assert [v.name for v in model.graph.output] == OUTPUTS
    got = session(model.SerializeToString()).run(None, {INPUT_NAME: positions[0][:3]})
    for g, r in zip(got, torch_outputs(net, positions[0][:3])):
        assert np.abs(g - r).max() <= 1e-4


def test_fp32_parity_scales_with_a_moves_left_head_that_predicts_hundreds_of_plies(tmp_path, positions):
    """A trained moves-left head outputs plies by the hundred, where float32 rounding alone
    passes an absolute 1e-4 (a CPU training run's learner died at every export): fp32's bound
    is relative to the output's size, like fp16's and int8's."""
    net = build_net(TINY, seed=3).eval()
    with torch.no_grad():
        net.mlh_fc2.weight.mul_(400.0)
        net.mlh_fc2.bias.fill_(3000.0)
    report = export_onnx(net, tmp_path / "net.onnx", "fp32", check_planes=positions[0])
    assert report.mlh_scale > 2000
    assert report.mlh_max_abs_diff <= PARITY_BOUNDS["fp32"].mlh * report.mlh_scale
    got = session(report.path).run(None, {INPUT_NAME: positions[0]})[2]
    np.testing.assert_allclose(got, torch_outputs(net, positions[0])[2], rtol=1e-5)


def test_parity_failure_writes_nothing(tmp_path, tiny_net, positions):
    path = tmp_path / "net.onnx"
    path.write_bytes(b"the old network")
    impossible = ParityBounds(policy=0.0, wdl=0.0, mlh=0.0, min_argmax_agreement=1.0)
    with pytest.raises(ExportParityError, match="disagrees with PyTorch") as info:
        export_onnx(tiny_net, path, "fp16", check_planes=positions[0], bounds=impossible)
    assert info.value.report.variant == "fp16" and info.value.report.policy_max_abs_diff > 0
    assert path.read_bytes() == b"the old network"
    assert sorted(os.listdir(tmp_path)) == ["net.onnx"]


def test_policy_parity_reads_only_the_legal_moves_logits():
    """The search never reads an illegal move's logit, so an error there does not count
    (int8 rounds those the most); an error on a legal move does."""
    planes, masks = sample_positions(4, seed=3)
    rng = np.random.default_rng(0)
    ref = [rng.normal(0, 3, (4, 1858)).astype(np.float32), np.full((4, 3), 1 / 3, np.float32)]
    got = [ref[0].copy(), ref[1].copy()]
    illegal, legal = np.argwhere(~masks[0])[0][0], np.argwhere(masks[0])[0][0]
    got[0][0, illegal] += 50.0
    ref[0][0, illegal] = -100.0                # the largest logit of all, and an illegal one
    numbers = parity_numbers(got, ref, masks)
    assert numbers["policy_max_abs_diff"] == 0.0
    assert numbers["policy_scale"] == np.abs(np.where(masks, ref[0], 0)).max() < 100.0
    assert parity_failures(numbers, PARITY_BOUNDS["fp32"]) == []
    got[0][0, legal] += 1.0
    numbers = parity_numbers(got, ref, masks)
    assert numbers["policy_max_abs_diff"] == pytest.approx(1.0)
    assert parity_failures(numbers, PARITY_BOUNDS["fp32"]) == [f"policy max |diff| 1 > {1e-4 * numbers['policy_scale']:.3g}"]


def test_bad_arguments(tmp_path, tiny_net):
    with pytest.raises(ValueError, match="unknown variant"):
        export_onnx(tiny_net, tmp_path / "x.onnx", "int4")
    with pytest.raises(ValueError, match="planes must be"):
        export_onnx(tiny_net, tmp_path / "x.onnx", check_planes=np.zeros((2, 111, 8, 8), np.float32))
    with pytest.raises(TypeError):
        export_onnx(torch.nn.Linear(2, 2), tmp_path / "x.onnx")
    assert not os.listdir(tmp_path)


# --------------------------------------------------------------------------- atomic writes


def test_atomic_write_replaces_and_leaves_no_temp(tmp_path):
    path = tmp_path / "f.bin"
    atomic.atomic_write_bytes(path, b"one")
    atomic.atomic_write_bytes(path, b"two")
    assert path.read_bytes() == b"two"
    digest = atomic.write_sha256(path)
    assert atomic.read_sha256(path) == digest == atomic.sha256_file(path)
    assert sorted(os.listdir(tmp_path)) == ["f.bin", "f.bin.sha256"]


def test_failure_mid_write_keeps_the_old_file(tmp_path):
    path = tmp_path / "net.onnx"
    atomic.atomic_write_with_sha256(path, b"old complete file")
    with pytest.raises(RuntimeError, match="disk on fire"):
        with atomic.atomic_open(path) as f:
            f.write(b"new half")
            raise RuntimeError("disk on fire")
    assert path.read_bytes() == b"old complete file"
    atomic.verify_sha256(path)
    assert sorted(os.listdir(tmp_path)) == ["net.onnx", "net.onnx.sha256"]


def test_failed_rename_keeps_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "net.onnx"
    atomic.atomic_write_with_sha256(path, b"old complete file")

    def broken_replace(src, dst):
        raise OSError("rename failed")

    monkeypatch.setattr(atomic.os, "replace", broken_replace)
    with pytest.raises(OSError, match="rename failed"):
        atomic.atomic_write_with_sha256(path, b"new file " * 1000)
    monkeypatch.undo()
    assert path.read_bytes() == b"old complete file"
    atomic.verify_sha256(path)
    assert sorted(os.listdir(tmp_path)) == ["net.onnx", "net.onnx.sha256"]


def test_failed_fsync_keeps_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "net.onnx"
    atomic.atomic_write_bytes(path, b"old")

    def broken_fsync(fd):
        raise OSError("fsync failed")

    monkeypatch.setattr(atomic.os, "fsync", broken_fsync)
    with pytest.raises(OSError, match="fsync failed"):
        atomic.atomic_write_bytes(path, b"new")
    monkeypatch.undo()
    assert path.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["net.onnx"]


def test_bad_sha256_side_files(tmp_path):
    path = tmp_path / "a.onnx"
    path.write_bytes(b"x")
    with pytest.raises(FileNotFoundError):
        atomic.read_sha256(path)
    (tmp_path / "a.onnx.sha256").write_text("not a digest\n")
    with pytest.raises(ValueError, match="expected"):
        atomic.read_sha256(path)
    (tmp_path / "a.onnx.sha256").write_text(f"{atomic.sha256_bytes(b'x')}  b.onnx\n")
    with pytest.raises(ValueError, match="names 'b.onnx'"):
        atomic.read_sha256(path)
    with pytest.raises(ValueError, match="not a sha256"):
        atomic.write_sha256(path, "abc")


# --------------------------------------------------------------------------- CLI


def test_cli_export(tmp_path, capsys):
    from trainer.cli import main

    ckpt = tmp_path / "ckpt.pt"
    net = build_net("1x8", seed=5)
    torch.save(save_checkpoint_dict(net), ckpt)
    out = tmp_path / "out"
    assert main(["export", "--checkpoint", str(ckpt), "--out", str(out), "--variants", "fp32",
                 "--name", "n", "--positions", "16"]) == 0
    assert "fp32" in capsys.readouterr().out
    assert sorted(os.listdir(out)) == ["n.onnx", "n.onnx.sha256"]
    atomic.verify_sha256(out / "n.onnx")
    # the same weights, exported directly, give the same bytes
    direct = export_onnx(net, tmp_path / "direct.onnx", check_positions=8)
    assert direct.sha256 == atomic.read_sha256(out / "n.onnx")

    assert main(["export", "--config", "6y64", "--out", str(out)]) == 2
    assert "bad network size" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        main(["export", "--config", "1x8", "--out", str(out), "--variants", "fp32,int4"])
    assert info.value.code == 2
    assert main(["export", "--config", "2x8", "--checkpoint", str(ckpt), "--out", str(out)]) == 2
    assert "does not match" in capsys.readouterr().err
    assert main([]) == 2


# --------------------------------------------------------------------------- the bundled default network

BUNDLED = {"fp32": "default.onnx", "fp16": "default.fp16.onnx", "int8": "default.int8.onnx"}   # what the engine loads (engine.weights)


@pytest.mark.parametrize("variant,name", sorted(BUNDLED.items()))
def test_bundled_default_networks(variant, name):
    path = os.path.join(NETS, name)
    assert os.path.getsize(path) < 8_000_000, "keep the bundled networks small"
    atomic.verify_sha256(path)
    model = onnx.load(path)
    meta = {p.key: p.value for p in model.metadata_props}
    assert meta["cyzero.variant"] == variant
    sess = session(path)
    assert [(i.name, i.type, i.shape[1:]) for i in sess.get_inputs()] == [(INPUT_NAME, "tensor(float)", [112, 8, 8])]
    assert [(o.name, o.type) for o in sess.get_outputs()] == [(n, "tensor(float)") for n in OUTPUTS]
    planes = np.stack([encoding.encode_position(), encoding.encode_position(None, ["e2e4"])])
    policy, wdl, mlh = sess.run(None, {INPUT_NAME: planes})
    assert policy.shape == (2, 1858) and np.all(np.isfinite(policy))
    np.testing.assert_allclose(wdl.sum(1), 1.0, atol=1e-5)
    assert np.all(mlh >= 0)


@pytest.mark.parametrize("variant", ["fp16", "int8"])
def test_bundled_variants_play_the_same_network_as_fp32(variant):
    """The GPU's and the CPU's files are the fp32 network within the export's bounds for
    their variant, so every provider plays the network PROVENANCE.md measured."""
    planes, masks = sample_positions(128, seed=5)
    ref = session(os.path.join(NETS, BUNDLED["fp32"])).run(None, {INPUT_NAME: planes})
    got = session(os.path.join(NETS, BUNDLED[variant])).run(None, {INPUT_NAME: planes})
    assert parity_failures(parity_numbers(got, ref, masks), PARITY_BOUNDS[variant]) == []


def test_bundled_provenance_lists_the_digests():
    with open(os.path.join(NETS, "PROVENANCE.md"), encoding="utf-8") as f:
        text = f.read()
    for name in BUNDLED.values():
        assert atomic.read_sha256(os.path.join(NETS, name)) in text, name
