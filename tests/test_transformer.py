"""The trainer's attention-body family (trainer.model's ``bt-EMBxLAYERSxHEADSh``): named and configured like
the residual towers, trained by the same learner, exported to ONNX and to lc0's format, and played by lc0
v0.32.1 as the PyTorch network computes it (tests/data/lc0/cyzero-trainer-bt-32x2x2h.*, made by
docs/recipes/lc0-transformer-fixture.py)."""

from __future__ import annotations

import gzip
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import lc0_files as L
from engine.board import Board
from engine.encoding import encode_board
from engine.lc0 import read_lc0_file
from engine.network import Network
from test_learner import TINY, make_run, run_learn, stockfish_games
from trainer.config import CONFIG_FILE, LossConfig, OptimizerConfig, from_dict, load_config
from trainer.export import export_onnx, sample_positions
from trainer.losses import evaluate, make_optimizer
from trainer.run_setup import net_config
from trainer.lc0_export import check_lc0_file, lc0_file_bytes
from trainer.model import Net, NetConfig, build_net, deepen, load_net, save_checkpoint_dict
from trainer.records import read_chunk

pytestmark = [pytest.mark.timeout(180), pytest.mark.usefixtures("one_thread")]

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: How close lc0's evaluation of an exported file comes to the PyTorch network it was written from.
EXPORT_AGREEMENT = {"v": 3e-3, "d": L.LC0_TOLERANCE["d"], "m": 0.1, "p": 0.15}


def _outputs(net: Net, planes: np.ndarray):
    with torch.no_grad():
        out = net.eval()(torch.from_numpy(planes.astype(np.float32)))
    return out.policy.numpy(), torch.softmax(out.wdl, 1).numpy(), out.mlh.numpy().reshape(-1)


def _lc0_planes(lc0: dict) -> np.ndarray:
    return np.stack([encode_board(Board(p["fen"])) for p in lc0["positions"]]).astype(np.float32)


# --------------------------------------------------------------------------- names and configs


def test_an_attention_body_is_named_and_sized_like_leelas():
    c = NetConfig.from_name("bt-64x6x4h")
    assert (c.body, c.filters, c.blocks, c.heads, c.name) == ("attention", 64, 6, 4, "bt-64x6x4h")
    # BT4's defaults: Mish, the attention policy, a ReLU moves-left output (lc0's), sizes from the embedding
    assert (c.activation, c.policy_head, c.mlh_activation, c.ffn_activation) == ("mish", "attention", "relu", "mish")
    assert (c.ffn_hidden, c.policy_embedding, c.policy_d_model) == (128, 64, 64)
    big = NetConfig.from_name("bt-1024x15x32h")
    assert (big.smolgen_channels, big.smolgen_hidden, big.smolgen_gen, big.pe_channels) == (32, 256, 256, 32)
    assert NetConfig.from_dict(c.to_dict()) == c
    assert load_net(save_checkpoint_dict(build_net(c))).config == c
    # a residual config's dict is what it always was: no attention-body keys in it
    assert set(NetConfig.from_name("6x64").to_dict()) == {
        "blocks", "filters", "se_ratio", "moves_left", "policy_head", "policy_channels", "value_channels",
        "value_hidden", "mlh_channels", "mlh_hidden"}
    # the learner's [model] section reaches it, residual-only keys set or not
    cfg = from_dict({"model": {"net": "bt-32x2x2h", "policy_head": "conv", "se_ratio": 2}})
    assert net_config(cfg) == NetConfig.from_name("bt-32x2x2h")
    assert net_config(from_dict({"model": {"net": "bt-32x2x2h", "activation": "relu"}})).activation == "relu"
    assert net_config(from_dict({"model": {"net": "6x64"}})) == NetConfig.from_name("6x64")


@pytest.mark.parametrize("name, why", [
    ("bt-30x2x4h", "does not split into 4 heads"),
    ("bt-0x2x2h", "at least 1"),
    ("bt-32x2", "bt-EMBEDDINGxLAYERSxHEADSh"),
])
def test_a_bad_attention_body_name_says_what_is_wrong(name, why):
    with pytest.raises(ValueError, match=why):
        NetConfig.from_name(name)
    with pytest.raises(ValueError):
        NetConfig(blocks=2, filters=32, body="attention", heads=2, policy_head="conv")
    with pytest.raises(ValueError, match="only residual towers"):
        deepen(build_net("bt-32x2x2h"), 4)


def test_the_input_gates_and_norms_are_not_weight_decayed():
    net = build_net("bt-32x2x2h")
    decayed = {id(p) for p in make_optimizer(net, OptimizerConfig()).param_groups[0]["params"]}
    names = {n for n, p in net.named_parameters() if id(p) in decayed}
    assert "body.encoders.0.q.weight" in names and "body.generator.weight" in names
    assert not {"body.mult_gate", "body.add_gate", "body.embedding_ln.weight", "body.encoders.0.q.bias"} & names


# --------------------------------------------------------------------------- both ways to lc0


def test_lc0_plays_the_trainers_transformer_as_pytorch_computes_it():
    """lc0 v0.32.1's own evaluation of the file the trainer wrote (the fixture) is the PyTorch network's:
    the written file is the network, and lc0 reads it as cyzero means it."""
    fixture = L.TRAINER_BODY.need()
    lc0 = fixture.lc0()
    net = L.trainer_transformer()
    with gzip.open(fixture.pb, "rb") as f:
        assert lc0_file_bytes(net) == f.read(), f"the writer or the network changed: remake with {fixture.recipe}"
    planes = _lc0_planes(lc0)
    # PyTorch's float32 weights against the file's 16-bit ones: the agreement (W - L within
    # 0.003, each move's share within 0.15 points; D within lc0's own printing error, LC0_TOLERANCE)
    L.assert_plays_as_lc0(lc0, *_outputs(net, planes), tolerance=EXPORT_AGREEMENT)
    # and the engine's graph of the file, which is what cyzero plays
    engine = Network(fixture.pb, backend="cpu")
    L.assert_plays_as_lc0(lc0, *engine.evaluate(planes))
    assert read_lc0_file(fixture.pb).description.startswith(fixture.description)


def test_lc0_file_read_back_is_the_network_for_every_activation_and_without_moves_left(tmp_path):
    planes, masks = sample_positions(48, seed=3)
    for overrides in ({"ffn_activation": "relu2"}, {"ffn_activation": "swish", "activation": "relu"},
                      {"smolgen": False, "moves_left": False}, {"ffn_activation": "selu"}):
        config = NetConfig.from_name("bt-32x2x2h", value_channels=4, mlh_channels=4, **overrides)
        net = build_net(config, seed=5).eval()
        with torch.no_grad():
            for p in net.parameters():
                p.add_(torch.randn_like(p) * 0.05)
        lc0net, numbers = check_lc0_file(net, lc0_file_bytes(net), planes, masks)
        assert numbers["policy_max_abs_diff"] < 5e-3 and numbers["wdl_max_abs_diff"] < 1e-3, overrides
        assert (lc0net.body.moves_left is not None) == config.moves_left
        assert lc0net.body.smolgen == config.smolgen


def test_export_writes_a_transformer_as_onnx_and_as_lc0_and_the_engine_plays_both(tmp_path):
    """``cyzero-train export --config bt-... --lc0`` (an untrained network of any size) and the ONNX
    export of the same network: each checked against PyTorch as it is written, each played by the engine."""
    out = tmp_path / "lc0"
    done = subprocess.run([sys.executable, "-m", "trainer.cli", "export", "--config", "bt-32x2x2h", "--seed", "3",
                           "--lc0", "--out", str(out)], cwd=REPO, capture_output=True, text=True, timeout=170)
    assert done.returncode == 0, done.stderr
    assert "read back vs torch" in done.stdout + done.stderr
    net = build_net("bt-32x2x2h", seed=3).eval()
    planes = np.stack([encode_board(Board(fen)) for fen in L.ATTENTION_POSITIONS]).astype(np.float32)
    want = _outputs(net, planes)
    from_lc0 = Network(str(out / "model.pb.gz"), backend="cpu").evaluate(planes)
    np.testing.assert_allclose(from_lc0[0], want[0], atol=2e-3)
    np.testing.assert_allclose(from_lc0[1], want[1], atol=1e-3)
    onnx_path = tmp_path / "bt.onnx"
    export_onnx(net, str(onnx_path), "fp32", check_positions=32)
    played = Network(str(onnx_path), backend="cpu")
    assert " bt-32x2x2h," in played.description   # what the engine's "loaded network" line says
    got = played.evaluate(planes)
    for ours, theirs in zip(got, want):
        np.testing.assert_allclose(ours, theirs, atol=1e-4)
    # fp16 for the GPU runtimes, checked as it is written; no int8 (there is no convolution to quantize)
    export_onnx(net, str(tmp_path / "bt.fp16.onnx"), "fp16", check_positions=32)
    with pytest.raises(ValueError, match="no int8 variant of an attention body"):
        export_onnx(net, str(tmp_path / "bt.int8.onnx"), "int8", check_positions=32)
    assert not (tmp_path / "bt.int8.onnx").exists()


# --------------------------------------------------------------------------- the learner


@pytest.mark.parametrize("with_bias", [True, False])
def test_the_fused_attention_cuda_trains_with_is_the_plain_product_the_cpu_and_exports_use(with_bias):
    """CUDA takes F.scaled_dot_product_attention; its scale and additive smolgen bias must be the plain
    path's, or a network trained on a GPU plays differently once exported. Both run here on the CPU."""
    from trainer.model import attention

    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(5, 4, 64, 8, generator=g) for _ in range(3))
    bias = torch.randn(5, 4, 64, 64, generator=g) * 3 if with_bias else None
    fused, plain = attention(q, k, v, bias, fused=True), attention(q, k, v, bias, fused=False)
    assert torch.allclose(fused, plain, atol=1e-5), (fused - plain).abs().max()
    if with_bias:   # the bias really counts (a test that cannot fail would pass without it)
        assert not torch.allclose(fused, attention(q, k, v, None, fused=False), atol=1e-2)


def test_bench_train_measures_a_transformer_config_in_its_input_format(tmp_path):
    """`cyzero-train bench train --config gpu-bt` (make gpu-check) measures the config's learner: its
    network, batch and canonical format on synthetic records the learner's format check accepts."""
    from trainer.bench import bench_train

    config = tmp_path / "bt.toml"
    config.write_text('[model]\nnet = "bt-16x1x2h"\ninput_format = 4\n[train]\nbatch_size = 16\n'
                      '[replay]\nworkers = 0\n')
    figures = bench_train(print_report=False, device="cpu", config_name=str(config), steps=4, log_interval=2,
                          chunks=2, chunk_positions=64, loader_workers=1, log=lambda line: None)
    assert (figures["net"], figures["batch_size"]) == ("bt-16x1x2h", 16)
    assert figures["learner_1_rank_samples_per_s"] > 0 and figures["loader_samples_per_s"] > 0
    with pytest.raises(ValueError, match="not both"):
        bench_train(print_report=False, device="cpu", config_name=str(config), run_dir=str(tmp_path))


@pytest.mark.parametrize("input_format", [1, 4])
def test_the_learner_trains_a_transformer_on_stockfish_labels(tmp_path, input_format):
    """The same learner, losses and checkpoints: 50 steps lower the held-out loss, and the checkpoint
    exports to lc0's format. In lc0's classical planes, and in the canonical hectoplies format Leela's
    transformers read (records written in it: flipped, mirrored, transposed, en passant files)."""
    stream = iter(stockfish_games(2000, input_format=input_format))
    config = TINY.replace('net = "1x8"', f'net = "bt-32x2x2h"\ninput_format = {input_format}').replace(
        "batch_size = 16", "batch_size = 32").replace(
        "checkpoint_every = 4", "checkpoint_every = 50").replace("interval = 2", "interval = 25").replace(
        "validation_positions = 48", "validation_positions = 256").replace("warmup_steps = 2",
                                                                         "warmup_steps = 5\nlr = 0.002")
    run = make_run(tmp_path / "run", config, game=lambda rng: next(stream), games_per_chunk=1, positions=1800,
                   input_format=input_format)
    code, lines = run_learn(run, steps=50)
    assert code == 0, lines
    cfg = load_config(os.path.join(run, CONFIG_FILE))
    from trainer.loader import WindowConfig, validation_batch
    from trainer.store import ReplayStore

    held_out = validation_batch(ReplayStore(run, input_format),
                                WindowConfig(floor=cfg.replay.floor, val_percent=cfg.replay.val_percent), 256)
    before = evaluate(build_net(net_config(cfg), seed=cfg.train.seed), held_out, LossConfig())
    checkpoint = torch.load(os.path.join(run, "checkpoints", "step-00000050.pt"), weights_only=True)
    trained = load_net(checkpoint)
    assert trained.config.name == "bt-32x2x2h" and trained.config.input_format == input_format
    after = evaluate(trained, held_out, LossConfig())
    assert after["policy_ce"] < before["policy_ce"] - 0.05, (before, after)
    assert after["total"] < before["total"] - 0.2, (before, after)
    planes, masks = sample_positions(32, seed=1)
    check_lc0_file(trained, lc0_file_bytes(trained), planes, masks)


@pytest.mark.gpu
def test_a_transformer_learns_on_one_gpu_in_bf16_and_resumes(tmp_path):
    """The gpu-bt path at a test's size: nccl's one rank on cuda:0, bf16 autocast, the fused attention,
    canonical records; it checkpoints, resumes and publishes a generation the engine reads as format 4."""
    if not torch.cuda.is_available():
        pytest.skip("gpu test: no CUDA device")
    config = TINY.replace('net = "1x8"', 'net = "bt-32x2x2h"\ninput_format = 4').replace(
        "[train]\n", '[train]\namp = "bf16"\n')
    run = make_run(tmp_path / "run", config, input_format=4)
    code, lines = run_learn(run, devices="cuda:0", steps=4)
    assert code == 0, lines
    code, lines = run_learn(run, devices="cuda:0", steps=6)
    assert code == 0 and any("resuming at step 4" in line for line in lines), lines
    onnx = os.path.join(run, "networks", "gen-00002.onnx")
    assert Network(onnx, backend="cpu").input_format == 4


# --------------------------------------------------------------------------- from lc0's files


def test_an_lc0_transformer_file_is_rebuilt_as_the_network_lc0_plays_and_written_back_as_it(tmp_path):
    """``--init-from`` reads Leela's BT3/BT4 structure (format 7, PE dense, smolgen): the rebuilt PyTorch
    network is what lc0 evaluates, and its lc0 export plays as the original does in lc0."""
    from trainer.lc0_import import net_from_lc0

    for fixture in (L.BODY_MULTIHEAD, L.TRAINER_BODY):
        lc0 = fixture.need().lc0()
        net = net_from_lc0(read_lc0_file(fixture.pb))
        planes = _lc0_planes(lc0)
        L.assert_plays_as_lc0(lc0, *_outputs(net, planes))
        again = tmp_path / f"{fixture.name}.pb.gz"
        again.write_bytes(gzip.compress(lc0_file_bytes(net)))
        L.assert_plays_as_lc0(lc0, *Network(str(again), backend="cpu").evaluate(planes), tolerance=EXPORT_AGREEMENT)
    assert net_from_lc0(read_lc0_file(L.BODY_MULTIHEAD.pb)).config.name == "bt-32x2x4h"


def test_what_the_trainers_family_has_not_is_refused_in_one_line():
    from trainer.lc0_import import Lc0ImportError, net_from_lc0

    with pytest.raises(Lc0ImportError, match="PE-map embedding") as exc:
        net_from_lc0(read_lc0_file(L.BODY_PE_MAP.need().pb))
    assert "\n" not in str(exc.value)


def test_a_run_starts_from_an_lc0_transformer_and_refuses_one_of_another_input_format(tmp_path):
    source = tmp_path / "bt.pb.gz"
    source.write_bytes(gzip.compress(gzip.decompress(open(L.BODY_MULTIHEAD.need().pb, "rb").read())))
    run = make_run(tmp_path / "run")
    code, lines = run_learn(run, steps=2, init_from=str(source))
    assert code == 0, lines
    checkpoint = torch.load(os.path.join(run, "checkpoints", "step-00000002.pt"), weights_only=True)
    assert load_net(checkpoint).config == NetConfig.from_name(
        "bt-32x2x4h", ffn_hidden=32, smolgen_channels=2, smolgen_hidden=16, smolgen_gen=4, pe_channels=1,
        policy_embedding=16, policy_d_model=8, value_channels=2, value_hidden=16, mlh_channels=4, mlh_hidden=16)
    canonical = tmp_path / "canonical.pb.gz"
    canonical.write_bytes(gzip.compress(L.with_input_format(gzip.decompress(source.read_bytes()), 3)))
    code, lines = run_learn(make_run(tmp_path / "other"), steps=2, init_from=str(canonical))
    assert code != 0 and any("input format 3" in line for line in lines), lines


# --------------------------------------------------------------------------- under the daemon


@pytest.mark.timeout(300)
def test_a_transformer_plays_learns_and_is_published_under_the_daemon(tmp_path):
    """``cyzero-train run`` with an attention body in the canonical format Leela's transformers read: the
    worker plays its generations (ONNX exports of the transformer) and writes its records in that format,
    the learner trains on them, and each new generation is published and played."""
    from test_training_run import CONFIG, played_generations, published, start_daemon, stop_daemon, wait_for

    run = str(tmp_path / "run")
    os.makedirs(run)
    config = tmp_path / "bt.toml"
    config.write_text(CONFIG.replace('net = "1x8"', 'net = "bt-16x1x2h"\ninput_format = 4').replace(
        'learner_devices = "cpu:2"', 'learner_devices = "cpu:1"'))
    log_path = str(tmp_path / "daemon.log")
    daemon = start_daemon(run, log_path, str(config))
    try:
        wait_for(lambda: len(published(run)) >= 3, "two trained generations published", timeout=200,
                 daemon=daemon, run=run)
        wait_for(lambda: max(played_generations(run), default=0) >= 1, "games of a trained transformer",
                 timeout=120, daemon=daemon, run=run)
        stop_daemon(daemon, log_path)
        newest = max(published(run))
        onnx = os.path.join(run, "networks", f"gen-{newest:05d}.onnx")
        network = Network(onnx, backend="cpu")
        assert " bt-16x1x2h," in network.description and network.input_format == 4
        from trainer.store import ReplayStore

        store = ReplayStore(run, 4)
        chunks = [e for e in store.entries() if e.source == "selfplay"]
        assert chunks and all(int(read_chunk(store.chunks_dir / e.name, 4)["input_format"][0]) == 4 for e in chunks)
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()
