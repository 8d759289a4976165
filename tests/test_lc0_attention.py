"""engine.lc0 on lc0's attention-body (transformer) networks, against lc0 v0.32.1 itself.

The fixtures (tests/data/lc0/, docs/recipes/lc0-attention-body-fixture.py) are small networks written
from lc0's proto by tests/lc0_files.py's independent writer, with lc0's own evaluation of them (``go
nodes 1``, eigen backend): a multihead (format 7) PE-dense net with smolgen, the structure of Leela's
BT3/BT4, and a format 6 PE-map net with a policy encoder layer. Synthetic variants (every activation,
the older formats lc0 fixes up, a single value head) run against the writer's NumPy forward pass.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
import shutil
import subprocess
import sys

import chess
import numpy as np
import pytest

from engine.board import Board
from engine.encoding import encode_board, encode_position
from engine.lc0 import PE_MAP, Lc0Error, read_lc0, read_lc0_file
from engine.lc0_onnx import lc0_to_onnx
from engine.network import POLICY_SIZE, Network, NetworkError
import lc0_files
from lc0_files import ATTENTION_BODIES, BODY_MULTIHEAD, BODY_PE_MAP, EVALUATED_BY_LC0, LC0_TOLERANCE, Lc0Spec, \
    assert_plays_as_lc0, fixture_params, make_lc0, pos_encoding, random_planes, reference_forward, truncated, \
    write_bytes, write_lc0
from test_lc0 import _openvino_params
from test_uci_harness import REPO, UciEngine

LC0_SOURCE = "/tmp/lc0-build/lc0/src/neural/tables/attention_policy_map.h"


def _run(data: bytes, planes: np.ndarray, dtype: str = "float32"):
    import onnxruntime as ort

    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    out = dict(zip(names, session.run(None, {"/input/planes": planes.astype(dtype)})))
    mlh = out.get("/output/mlh")
    return (out["/output/policy"].astype(np.float64), out["/output/wdl"].astype(np.float64),
            None if mlh is None else mlh.astype(np.float64).reshape(-1))


def _planes(lc0: dict) -> np.ndarray:
    return np.stack([encode_position(p["fen"]) for p in lc0["positions"]])


def _q_optimistic() -> dict:
    import json

    with open(os.path.join(BODY_MULTIHEAD.folder, BODY_MULTIHEAD.name + ".q-optimistic.lc0.json"),
              encoding="utf-8") as f:
        return json.load(f)


def test_the_pe_map_is_the_queen_and_knight_moves_of_each_square():
    """The PE map's 64 channels per square: -1 on the square, 1 a queen-line or knight move away;
    lc0's own table (kPosEncoding) where lc0's source is unpacked."""
    assert np.array_equal(PE_MAP, pos_encoding())
    assert PE_MAP[0, 0] == -1 and PE_MAP[0, 17] == 1 and PE_MAP[0, 63] == 1 and PE_MAP[0, 12] == 0
    assert (PE_MAP == 1).sum(axis=1).tolist()[:2] == [21 + 2, 21 + 3]   # a1: 21 queen, 2 knight squares
    if not os.path.isfile(LC0_SOURCE):
        pytest.skip(f"lc0's source is not at {LC0_SOURCE}: the table is checked against the rules only")
    import re

    with open(LC0_SOURCE, encoding="utf-8") as f:
        text = f.read()
    body = text[text.index("kPosEncoding[64]"):]
    body = body[body.index("{") + 1:body.index("};")]
    values = np.array([float(x) for x in re.findall(r"-?\d+\.\d+", body)], np.float32)
    assert values.size == 64 * 64
    assert np.array_equal(values.reshape(64, 64), PE_MAP)


@pytest.mark.parametrize("fixture", ATTENTION_BODIES, ids=lambda f: f.name)
@pytest.mark.parametrize("backend", ["cpu", *_openvino_params()])
def test_an_attention_body_plays_as_lc0(fixture, backend):
    """At lc0's positions, encoded by cyzero's encoder, the network plays what lc0 v0.32.1 evaluated:
    V to its 4 printed decimals, D, M, and every legal move's policy share."""
    lc0 = fixture.need().lc0()
    if backend == "cpu":
        net = Network(fixture.pb, backend="cpu")
    else:
        net = Network(fixture.pb, backend="openvino", precision=backend, max_batch=1)
        assert net.provider == "OpenVINO"
    rows = [net.evaluate(encode_board(Board(p["fen"]))[None]) for p in lc0["positions"]]
    policy = np.concatenate([r[0] for r in rows])
    wdl = np.concatenate([r[1] for r in rows])
    mlh = None if rows[0][2] is None else np.concatenate([np.reshape(r[2], -1) for r in rows])
    assert (mlh is not None) == fixture.spec.moves_left == net.has_mlh
    # bf16 (OpenVINO, where the processor has it): V and D within 0.03, shares within 3 points
    tolerance = {"v": 0.03, "d": 0.03, "m": 0.1, "p": 3.0} if backend == "bf16" else None
    assert_plays_as_lc0(lc0, policy, wdl, mlh, tolerance)
    assert net.lc0_description.startswith(fixture.description)


@pytest.mark.parametrize("fixture", ATTENTION_BODIES, ids=lambda f: f.name)
def test_the_writers_reference_is_what_lc0_evaluates(fixture):
    """The independent NumPy forward pass of tests/lc0_files.py agrees with lc0 too (so the synthetic
    variants below, checked against it, are checked against lc0's semantics)."""
    lc0 = fixture.need().lc0()
    _, weights = make_lc0(fixture.spec)
    assert_plays_as_lc0(lc0, *reference_forward(weights, fixture.spec, _planes(lc0)))
    with open(fixture.pb, "rb") as f:
        assert gzip.decompress(f.read()) == make_lc0(fixture.spec)[0]   # the recipe's file, bit for bit


@pytest.mark.parametrize("fixture", ATTENTION_BODIES, ids=lambda f: f.name)
def test_the_float16_graph_plays_close_to_lc0(fixture):
    lc0 = fixture.need().lc0()
    got = _run(lc0_to_onnx(read_lc0_file(fixture.pb), "float16"), _planes(lc0), "float16")
    assert_plays_as_lc0(lc0, *got, tolerance={"v": 0.01, "d": 0.01, "m": 0.05, "p": 0.5})


def test_a_multihead_network_plays_the_heads_asked_for():
    """lc0's defaults are the winner value head and the vanilla policy head; q and optimistic (lc0's
    --backend-opts=value_head=q,policy_head=optimistic) are chosen by name, when the file is read or
    when the graph is built."""
    theirs = _q_optimistic()
    planes = _planes(theirs)
    net = read_lc0_file(BODY_MULTIHEAD.need().pb, value_head="q", policy_head="optimistic")
    assert "head optimistic of vanilla/optimistic" in net.description and "head q of winner/q/st" in net.description
    assert_plays_as_lc0(theirs, *_run(lc0_to_onnx(net), planes))
    default = read_lc0_file(BODY_MULTIHEAD.pb)
    assert_plays_as_lc0(theirs, *_run(lc0_to_onnx(default, value_head="q", policy_head="optimistic"), planes))
    assert_plays_as_lc0(BODY_MULTIHEAD.lc0(), *_run(lc0_to_onnx(default), planes))
    # the st head is there too (lc0's outputs for it not recorded): as the writer's reference computes it
    _, weights = make_lc0(BODY_MULTIHEAD.spec)
    got = _run(lc0_to_onnx(default, value_head="st"), planes)
    want = reference_forward(weights, BODY_MULTIHEAD.spec, planes, value_head="st")
    assert np.abs(got[1] - want[1]).max() < 1e-5


def test_a_missing_head_is_named_with_the_heads_the_file_has():
    with open(BODY_MULTIHEAD.need().pb, "rb") as f:
        data = f.read()
    with pytest.raises(Lc0Error, match=r"no value head named 'wdl'; its value heads: winner, q, st"):
        read_lc0(data, "bt.pb.gz", value_head="wdl")
    with pytest.raises(Lc0Error, match=r"no policy head named 'soft'; its policy heads: vanilla, optimistic"):
        lc0_to_onnx(read_lc0(data), policy_head="soft")
    with pytest.raises(Lc0Error, match=r"no value head named 'q'; its value heads: winner"):
        read_lc0_file(BODY_PE_MAP.need().pb, value_head="q")


def test_the_description_names_the_structure():
    net = Network(BODY_MULTIHEAD.need().pb, backend="cpu")
    assert net.lc0_description.startswith("lc0 network attention body 32x2x4h, smolgen, PE dense embedding")
    assert net.lc0_description in net.description
    assert "with 1 encoder layers x 2h" in read_lc0_file(BODY_PE_MAP.need().pb).description


# --------------------------------------------------------------------------- synthetic variants

BODY = dict(attention_body=True, filters=16, blocks=2, heads=2, dff=24, policy="attention",
            policy_embedding=16, policy_d_model=8, smolgen_gen=8)

VARIANTS = {
    "multihead pe-dense mish": (Lc0Spec(**BODY, multihead=True, moves_left=True, activation="mish",
                                        value_heads=("winner", "q"), policy_heads=("vanilla", "optimistic")), None),
    "pe-map relu, SELU FFN, no smolgen, no gates": (Lc0Spec(**{**BODY, "smolgen": False}, embedding="pe_map",
                                                            gating=False, ffn_activation="selu"), None),
    "swish FFN, relu^2 smolgen, single value": (Lc0Spec(**BODY, embedding="pe_map", value="classical",
                                                        ffn_activation="swish", smolgen_activation="relu2",
                                                        moves_left=True), None),
    "tanh and sigmoid, policy encoders": (Lc0Spec(**BODY, ffn_activation="tanh", smolgen_activation="sigmoid",
                                                  policy_encoders=2, policy_encoder_heads=4), None),
    "format 134 (legacy multihead)": (Lc0Spec(**BODY, multihead=True, network=134), None),
    # lc0 reads format 6 with both multihead messages as format 7 with the PE-dense embedding
    "format 6 holding multihead messages": (Lc0Spec(**BODY, multihead=True, network=6, write_input_embedding=False),
                                            None),
    # an attention body behind the SE format (an older proto): lc0 runs it as format 6, PE map,
    # with FFN ReLU^2 and smolgen swish whatever the file says
    "encoders behind the SE format": (Lc0Spec(**BODY, network=4, embedding="pe_map", write_input_embedding=False,
                                              activation="mish"),
                                      dict(ffn_activation="relu2", smolgen_activation="swish")),
    "float16 layers": (Lc0Spec(**BODY, encoding="float16", moves_left=True), None),
    "bfloat16 layers": (Lc0Spec(**BODY, encoding="bfloat16", embedding="pe_map"), None),
}


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_every_attention_body_runs_as_its_reference(tmp_path, variant, dtype):
    spec, lc0_reads = VARIANTS[variant]
    path = tmp_path / "net.pb.gz"
    weights = write_lc0(str(path), spec)
    planes = random_planes(6, seed=5)
    want = reference_forward(weights, dataclasses.replace(spec, **(lc0_reads or {})), planes)
    if dtype == "float32":
        net = Network(str(path), backend="cpu")
        got = net.evaluate(planes)
        tol = (5e-4, 5e-5)
        assert "attention body 16x2x2h" in net.lc0_description
    else:
        got = _run(lc0_to_onnx(read_lc0_file(str(path)), "float16"), planes, "float16")
        tol = (0.08, 0.01)
    assert np.abs(got[0] - want[0]).max() < tol[0]
    assert np.abs(got[1] - want[1]).max() < tol[1]
    if spec.moves_left:
        assert np.abs(np.reshape(got[2], -1) - want[2]).max() < tol[0] * 10
    else:
        assert got[2] is None


# --------------------------------------------------------------------------- what is refused, by name


def test_a_truncated_attention_body_is_refused(tmp_path):
    data, _ = make_lc0(BODY_PE_MAP.spec)
    path = write_bytes(str(tmp_path / "cut.pb.gz"), truncated(data))
    with pytest.raises(NetworkError, match="corrupt or truncated lc0 network file"):
        Network(path, backend="cpu")


def test_a_layer_of_the_wrong_size_is_named(tmp_path, monkeypatch):
    plain = lc0_files._Writer.norm_layers
    monkeypatch.setattr(lc0_files._Writer, "norm_layers", lambda self, g, b, name, n: plain(
        self, g, b, name, n - 1 if name == "encoder.1.ln2" else n))
    path = str(tmp_path / "net.pb.gz")
    write_lc0(path, Lc0Spec(**BODY))
    with pytest.raises(NetworkError, match="encoder 1 layer norm 2 gammas: 15 values, not 16"):
        Network(path, backend="cpu")


def test_an_unknown_activation_is_named(tmp_path, monkeypatch):
    monkeypatch.setitem(lc0_files.FUNCTIONS, "bogus", 42)
    path = str(tmp_path / "net.pb.gz")
    write_lc0(path, Lc0Spec(**BODY, ffn_activation="bogus"))
    with pytest.raises(NetworkError, match=r"unknown FFN activation \(42\)"):
        Network(path, backend="cpu")


def test_smolgen_without_its_global_weights_is_named(tmp_path, monkeypatch):
    plain = lc0_files._Writer.body_message

    def without(self):   # drop field 35 (smolgen_w): it is written after the encoders' head count
        msg = plain(self)
        count = lc0_files.f_varint(28, self.spec.heads)
        i = msg.index(count) + len(count)
        assert msg[i:i + 2] == lc0_files.f_bytes(35, b"")[:2]   # field 35's key is two bytes
        length, j = 0, i + 2
        shift = 0
        while True:
            byte = msg[j]
            length |= (byte & 0x7F) << shift
            j += 1
            shift += 7
            if byte < 0x80:
                break
        return msg[:i] + msg[j + length:]

    monkeypatch.setattr(lc0_files._Writer, "body_message", without)
    path = str(tmp_path / "net.pb.gz")
    write_lc0(path, Lc0Spec(**BODY))
    with pytest.raises(NetworkError, match="encoder 0 has smolgen, but the file has no global smolgen weights"):
        Network(path, backend="cpu")


def test_an_attention_body_on_a_residual_tower_is_refused(tmp_path):
    path = str(tmp_path / "net.pb.gz")
    write_lc0(path, Lc0Spec(attention=True))   # encoder fields next to a 2-block tower, format 6
    with pytest.raises(NetworkError, match="attention body on a residual tower of 2 blocks"):
        Network(path, backend="cpu")


# --------------------------------------------------------------------------- choosing heads where they are used


def _eval(weights: str, positions: list, *args: str) -> list:
    lines = "".join(json.dumps({"fen": p["fen"]}) + "\n" for p in positions)
    done = subprocess.run([sys.executable, "-m", "uci.cli", "eval", weights, "--positions", "-", *args],
                          input=lines, capture_output=True, text=True, cwd=REPO, timeout=300)
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


@pytest.mark.parametrize("heads", [(), ("--value-head", "q", "--policy-head", "optimistic")],
                         ids=["default heads", "q and optimistic"])
def test_cyzero_eval_of_a_transformer_is_lc0s_with_the_heads_lc0_was_asked_for(heads):
    """cyzero eval plays the heads it is asked for as lc0's backend options choose them
    (--backend-opts=value_head=q,policy_head=optimistic for the second record)."""
    fixture = BODY_MULTIHEAD.need()
    record_path = fixture.path("json") if not heads else fixture.path("json").replace(
        ".lc0.json", ".q-optimistic.lc0.json")
    with open(record_path, encoding="utf-8") as f:
        expected = json.load(f)
    results = _eval(fixture.pb, expected["positions"], *heads)
    policy = np.zeros((len(results), POLICY_SIZE), np.float32)
    for row, (position, result) in enumerate(zip(expected["positions"], results)):
        board = chess.Board(position["fen"])
        for lc0_name, move in position["moves"].items():
            policy[row, move["index"]] = result["policy"][board.uci(board.parse_uci(lc0_name))]
    wdl = np.array([r["wdl"] for r in results], np.float32)
    mlh = np.array([r["mlh"] for r in results], np.float32)
    assert_plays_as_lc0(expected, policy, wdl, mlh)


def test_the_uci_options_choose_the_heads_and_a_missing_one_is_named(tmp_path):
    """ValueHead / PolicyHead (lc0's value_head / policy_head backend options) rebuild the network
    with those heads; a head the file does not have is refused by name and the network in use
    plays on."""
    weights = tmp_path / "bt.pb.gz"
    shutil.copy(BODY_MULTIHEAD.need().pb, weights)
    with UciEngine(options={"WeightsFile": str(weights)}) as eng:
        said = " ".join(eng.remarks())
        assert "head vanilla of vanilla/optimistic" in said and "head winner of winner/q/st" in said, said
        eng.setoption("ValueHead", "q")
        eng.setoption("PolicyHead", "optimistic")
        assert eng.isready(timeout=60) == []          # built: said as the next search begins
        switched = [line for line in eng.remarks(timeout=60) if "switched to network" in line]
        assert len(switched) == 1 and "head q of winner/q/st" in switched[0], switched
        assert "head optimistic of vanilla/optimistic" in switched[0]
        eng.setoption("ValueHead", "nope")
        eng.isready(timeout=60)
        refused = eng.remarks(timeout=60)
        assert any("no value head named 'nope'" in line and "winner, q, st" in line for line in refused), refused
        eng.send("position startpos")
        lines, best = eng.go("nodes 30")
        assert best.split()[1] not in ("0000", "(none)") and not [line for line in lines if "error" in line]


@pytest.mark.gpu
@pytest.mark.parametrize("fixture", fixture_params(*EVALUATED_BY_LC0, *ATTENTION_BODIES))
def test_cuda_plays_each_lc0_structure_as_lc0_evaluates_it(fixture):
    """On a GPU (CUDA, in float16 as lc0 runs there) every structure and input format of the fixtures
    still plays as lc0 evaluated it, within float16's error (make gpu-check runs it)."""
    ort = pytest.importorskip("onnxruntime")
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip("onnxruntime-gpu's CUDA provider is not installed here (make engine GPU=1)")
    network = Network(fixture.need().pb, backend="cuda")
    assert network.provider == "CUDAExecutionProvider"
    expected = fixture.lc0()
    planes = np.stack([encode_position(p["fen"]) for p in expected["positions"]])
    assert_plays_as_lc0(expected, *network.evaluate(planes), tolerance={"v": 0.01, "d": 0.01, "m": 0.5, "p": 0.5})
