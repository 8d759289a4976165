"""engine.lc0 against lc0 itself: a real Maia network file, lc0's own ONNX export of it
(``leela2onnx``) and lc0's own evaluation of it (``go nodes 1``, ``VerboseMoveStats``).

The fixtures live outside the repository (``../shared/fixtures/``, GPL-3.0 Maia weights); each
test that needs one is skipped, with the reason shown, where it is absent.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil

import numpy as np
import pytest

from engine.board import Board
from engine.encoding import encode_board, encode_position, legal_policy
from engine.lc0 import CONV_POLICY_MAP, Lc0Error, lc0_to_onnx, read_lc0, read_lc0_file
from engine.network import Network, NetworkError
from test_uci_harness import REPO, UciEngine

FIXTURES = os.path.join(os.path.dirname(REPO), "shared", "fixtures")
MAIA = os.path.join(FIXTURES, "maia-1100.pb.gz")
MAIA_ONNX = os.path.join(FIXTURES, "maia-1100.leela2onnx.onnx")
MAIA_LC0 = os.path.join(FIXTURES, "maia-1100.lc0.json")

needs_maia = pytest.mark.skipif(
    not all(os.path.exists(p) for p in (MAIA, MAIA_ONNX, MAIA_LC0)),
    reason=f"lc0 fixtures not found in {FIXTURES} (maia-1100.pb.gz and lc0's outputs for it)")

# lc0 names castling king-takes-rook.
_CASTLING = {"e1h1": "e1g1", "e1a1": "e1c1", "e8h8": "e8g8", "e8a8": "e8c8"}


def _lc0_positions() -> list[dict]:
    with open(MAIA_LC0, encoding="utf-8") as f:
        return json.load(f)["positions"]


@pytest.fixture(scope="module")
def maia() -> Network:
    return Network(MAIA, backend="cpu")


def _openvino_params():
    """OpenVINO in fp32, and in bf16 where the processor has it in hardware (skipped without OpenVINO)."""
    from engine import processor
    from engine.sessions import openvino_missing

    missing = pytest.mark.skipif(openvino_missing() is not None, reason="OpenVINO is not installed")
    params = [pytest.param("fp32", marks=missing, id="openvino-fp32")]
    if processor.native_bf16():
        params.append(pytest.param("bf16", marks=missing, id="openvino-bf16"))
    return params


@needs_maia
def test_the_conv_policy_map_is_lc0s():
    import onnx
    from onnx import numpy_helper

    model = onnx.load(MAIA_ONNX)
    table = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}["/const/mapping_table"]
    assert np.array_equal(table.astype(np.int64), CONV_POLICY_MAP)


@needs_maia
@pytest.mark.parametrize("dtype, policy_tol, wdl_tol", [("float32", 5e-3, 2e-4), ("float16", 0.1, 3e-3)])
def test_the_graph_equals_lc0s_own_export(dtype, policy_tol, wdl_tol):
    """Built from the .pb.gz in memory, run on lc0's positions and on random planes (every
    input plane, rule50 counts included), the outputs are those of lc0's leela2onnx export."""
    import onnxruntime as ort

    net = read_lc0_file(MAIA)
    ours = ort.InferenceSession(lc0_to_onnx(net, dtype), providers=["CPUExecutionProvider"])
    theirs = ort.InferenceSession(MAIA_ONNX, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    noise = (rng.random((6, 112, 8, 8)) < 0.1).astype(np.float32)
    noise[:, 109] = rng.integers(0, 100, (6, 1, 1))
    planes = np.concatenate([np.stack([encode_position(p["fen"]) for p in _lc0_positions()]), noise])
    want = theirs.run(None, {"/input/planes": planes})
    got = ours.run(None, {"/input/planes": planes.astype(np.float16 if dtype == "float16" else np.float32)})
    assert np.abs(got[0].astype(np.float32) - want[0]).max() < policy_tol
    assert np.abs(got[1].astype(np.float32) - want[1]).max() < wdl_tol


@needs_maia
def test_value_and_policy_match_lc0s_own_evaluation(maia):
    """lc0 evaluated the file itself: V = W - L to 4 decimals, and every legal move's policy
    share at lc0's temperature 1.359 within 0.07 percentage points (lc0 prints two decimals).
    Three of the positions have a non-zero rule50 count: the plane is fed raw."""
    positions = _lc0_positions()
    assert any(int(p["fen"].split()[4]) > 0 for p in positions)
    with open(MAIA_LC0, encoding="utf-8") as f:
        temperature = json.load(f)["policy_temperature"]
    for p in positions:
        board = Board(p["fen"])
        policy, wdl, mlh = maia.evaluate(encode_board(board)[None])
        assert mlh is None
        assert abs(float(wdl[0, 0] - wdl[0, 2]) - p["v"]) < 1.5e-4, p["fen"]
        moves, shares = legal_policy(board, policy[0], temperature)
        ours = dict(zip(moves, (shares * 100).tolist()))
        theirs = {_CASTLING.get(m, m) if _CASTLING.get(m) in ours else m: v["p"] for m, v in p["moves"].items()}
        assert set(ours) == set(theirs), p["fen"]
        assert max(abs(ours[m] - theirs[m]) for m in ours) < 0.07, p["fen"]


@needs_maia
@pytest.mark.parametrize("precision", _openvino_params())
def test_openvino_matches_lc0s_own_evaluation(precision):
    """The same file on OpenVINO: in fp32 to lc0's printed digits as on ONNX Runtime; in bf16 V
    within 0.02 and every policy share within 1 percentage point."""
    net = Network(MAIA, backend="openvino", precision=precision, max_batch=1)
    assert net.provider == "OpenVINO" and net.precision == precision
    v_tol, p_tol = (1.5e-4, 0.07) if precision == "fp32" else (0.02, 1.0)
    with open(MAIA_LC0, encoding="utf-8") as f:
        temperature = json.load(f)["policy_temperature"]
    for p in _lc0_positions():
        board = Board(p["fen"])
        policy, wdl, _ = net.evaluate(encode_board(board)[None])
        assert abs(float(wdl[0, 0] - wdl[0, 2]) - p["v"]) < v_tol, p["fen"]
        moves, shares = legal_policy(board, policy[0], temperature)
        ours = dict(zip(moves, (shares * 100).tolist()))
        theirs = {_CASTLING.get(m, m) if _CASTLING.get(m) in ours else m: v["p"] for m, v in p["moves"].items()}
        assert max(abs(ours[m] - theirs[m]) for m in ours) < p_tol, p["fen"]


@needs_maia
def test_network_reads_the_file_and_describes_it(maia):
    with open(MAIA, "rb") as f:
        assert maia.sha256 == hashlib.sha256(f.read()).hexdigest()   # the file's own digest
    assert maia.lc0_description.startswith("lc0 network 6x64 SE, classical 112-plane input, convolution "
                                           "policy, WDL value, no moves-left head, ReLU; trained 400000 steps")
    assert maia.lc0_description in maia.description and "6x64" in maia.description
    assert not maia.has_mlh


@needs_maia
def test_a_damaged_file_is_refused_with_what_it_is(tmp_path):
    with open(MAIA, "rb") as f:
        data = f.read()
    cases = {
        "truncated.pb.gz": (data[: len(data) // 2], "corrupt or truncated gzip"),
        "text.pb": (b"hello, this is not a network\n" * 10, "not an lc0 network file"),
        "empty.pb.gz": (b"", "empty"),
    }
    import gzip

    raw = gzip.decompress(data)
    cases["cut.pb"] = (raw[: len(raw) // 3], "corrupt or truncated lc0 network file")
    with open(os.path.join(REPO, "engine", "nets", "default.onnx"), "rb") as f:
        cases["onnx.pb"] = (f.read(), "looks like an ONNX model")
    for name, (content, message) in cases.items():
        path = tmp_path / name
        path.write_bytes(content)
        with pytest.raises(NetworkError, match=message):
            Network(str(path), backend="cpu")
    with pytest.raises(Lc0Error, match="not an lc0 network file"):
        read_lc0(b"\x08\x01\x12\x03abc", "x.pb")


@needs_maia
def test_the_engine_plays_an_lc0_file_and_says_what_it_is(tmp_path):
    weights = tmp_path / "maia.pb.gz"
    shutil.copy(MAIA, weights)
    with UciEngine(options={"WeightsFile": str(weights)}) as eng:
        eng.send("position startpos moves e2e4")
        eng.send("go nodes 50")
        lines = eng.until("bestmove", timeout=60)
        said = " ".join(text for _, text in eng.lines if text.startswith("info string"))
        assert "lc0 network 6x64 SE" in said and "maia.pb.gz" in said
        assert lines[-1].split()[1] not in ("0000", "(none)")
        assert not eng.bad


# --------------------------------------------------------------------------- synthetic networks
# Every member of the classical family, written by an independent writer (tests/lc0_files.py)
# and run through the reader and the graph, against that writer's NumPy forward pass.

from lc0_files import Lc0Spec, make_lc0, random_planes, reference_forward, truncated, wrap_onnx, \
    write_bytes, write_lc0, wrong_magic  # noqa: E402

FAMILY = {
    "conv-policy wdl se": Lc0Spec(se=True),
    "classical policy, single value": Lc0Spec(policy="classical", value="classical"),
    "moves-left head, mish": Lc0Spec(se=True, moves_left=True, activation="mish"),
    "no network_format (oldest files)": Lc0Spec(policy="classical", value="classical", with_format=False),
    "network SE, old batch norm": Lc0Spec(network=2, se=True, policy="classical", value="classical",
                                          old_bn=True),
    "float16 layers": Lc0Spec(encoding="float16", se=True, moves_left=True),
    "bfloat16 layers": Lc0Spec(encoding="bfloat16", policy="classical"),
    "float32 layers, no tower": Lc0Spec(encoding="float32", blocks=0),
}


@pytest.mark.parametrize("variant", list(FAMILY))
@pytest.mark.parametrize("dtype", ["float32", "float16", *_openvino_params()])
def test_every_classical_network_runs_as_its_reference(tmp_path, variant, dtype):
    spec = FAMILY[variant]
    path = tmp_path / "net.pb.gz"
    weights = write_lc0(str(path), spec)
    planes = random_planes(8, seed=3)
    want = reference_forward(weights, spec, planes)
    if dtype == "float32":
        net = Network(str(path), backend="cpu")
        got = net.evaluate(planes)
        assert ("no moves-left head" not in net.lc0_description) == spec.moves_left
        tol = (2e-4, 2e-5)
    elif dtype in ("fp32", "bf16"):   # OpenVINO on the CPU
        lines: list[str] = []
        net = Network(str(path), backend="openvino", precision=dtype, max_batch=8, log=lines.append)
        assert net.provider == "OpenVINO" and net.precision == dtype and not lines
        got = net.evaluate(planes)
        tol = (1e-3, 1e-4) if dtype == "fp32" else (0.1, 0.02)
    else:   # the fp16 graph, as a GPU would run it
        import onnxruntime as ort

        session = ort.InferenceSession(lc0_to_onnx(read_lc0_file(str(path)), "float16"),
                                       providers=["CPUExecutionProvider"])
        got = [None if x is None else x.astype(np.float64).reshape(len(planes), -1)
               for x in session.run(None, {"/input/planes": planes.astype(np.float16)})] + [None]
        tol = (0.05, 5e-3)
    assert np.abs(got[0] - want[0]).max() < tol[0]
    assert np.abs(got[1] - want[1]).max() < tol[1]
    if spec.moves_left:
        assert np.abs(np.reshape(got[2], -1) - want[2]).max() < tol[0] * 10
    elif dtype != "float16":
        assert got[2] is None


REFUSED = {
    "attention body": (Lc0Spec(attention=True), "attention-body"),
    "attention fields behind a classical header": (Lc0Spec(attention=True, network=3), "attention-body"),
    "castling-plane input": (Lc0Spec(input_format=2), "castling plane input \\(format 2\\)"),
    "canonical input": (Lc0Spec(input_format=3), "canonical input \\(format 3\\)"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_what_cannot_run_is_refused_by_name(tmp_path, case):
    spec, message = REFUSED[case]
    path = tmp_path / "net.pb.gz"
    write_lc0(str(path), spec)
    with pytest.raises(NetworkError, match=message):
        Network(str(path), backend="cpu")


def test_broken_files_are_refused_by_name(tmp_path):
    data, _ = make_lc0(Lc0Spec())
    cases = [(truncated(data), "corrupt or truncated lc0 network file"),
             (wrong_magic(), "not an lc0 network file")]
    for i, (content, message) in enumerate(cases):
        path = write_bytes(str(tmp_path / f"broken{i}.pb.gz"), content)
        with pytest.raises(NetworkError, match=message):
            Network(path, backend="cpu")


def test_an_onnx_model_inside_an_lc0_file_is_unwrapped(tmp_path):
    bundled = os.path.join(REPO, "engine", "nets", "default.onnx")
    with open(bundled, "rb") as f:
        model = f.read()
    path = write_bytes(str(tmp_path / "wrapped.pb.gz"), wrap_onnx(model))
    planes = random_planes(4, seed=1)
    got = Network(path, backend="cpu").evaluate(planes)
    want = Network(bundled, backend="cpu").evaluate(planes)
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])


def test_a_replaced_lc0_file_is_swapped_in_between_moves(tmp_path):
    """The WeightsFile watcher treats a .pb.gz like an .onnx: a new file is loaded, checked and
    swapped in before the next search, by its sha256."""
    weights = tmp_path / "net.pb.gz"
    write_lc0(str(weights), Lc0Spec(seed=1))
    with UciEngine(options={"WeightsFile": str(weights)}) as eng:
        eng.send("position startpos")
        eng.send("go nodes 20")
        eng.until("bestmove", timeout=60)
        write_lc0(str(weights), Lc0Spec(seed=2, se=True))
        with open(weights, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
        deadline = 60.0
        eng.until(lambda text: digest[:12] in text and "verified" in text, timeout=deadline)
        eng.send("go nodes 20")
        lines = eng.until("bestmove", timeout=deadline)
        switched = [text for text in lines if text.startswith("info string switched to network")]
        assert switched and digest[:12] in switched[0] and "lc0 network 2x16 SE" in switched[0]
        assert lines[-1].split()[1] != "0000"
        # A damaged file in its place is refused by name, and the network in use is kept.
        with open(weights, "rb") as f:
            write_bytes(str(weights), truncated(f.read()), gz=False)
        eng.until(lambda text: "refused network" in text and "corrupt or truncated" in text
                  and digest[:12] in text, timeout=deadline)
        eng.send("go nodes 20")
        lines = eng.until("bestmove", timeout=deadline)
        assert lines[-1].split()[1] != "0000" and not any("switched" in text for text in lines)
        assert not eng.bad


def test_an_lc0_file_on_a_gpu_gets_one_session_per_fixed_size(tmp_path):
    """On the GPU stand-in (engine.tools.gpu_standin, which simulates the arithmetic), the graph
    built from a .pb.gz takes the GPU path: its batch dimension is fixed by name for each size,
    every size is warmed at load, and a batch is padded to the next size."""
    from engine.tools.gpu_standin import SimulatedGPU, simulated_network

    path = tmp_path / "net.pb.gz"
    write_lc0(str(path), Lc0Spec(se=True, moves_left=True))
    gpu = SimulatedGPU(new_shape_s=0.002)
    net, _ = simulated_network(str(path), gpu=gpu, max_batch=8)
    assert net.batch_sizes == (1, 2, 4, 8)
    warmed = [session for session in gpu.sessions if session.shapes]
    assert sorted(next(iter(s.shapes)) for s in warmed) == [1, 2, 4, 8]
    assert all(len(session.shapes) == 1 for session in warmed)
    calls = len(gpu.calls)
    policy, wdl, mlh = net.evaluate(random_planes(5, seed=2))
    assert [c.size for c in gpu.calls[calls:]] == [8]
    assert policy.shape == (5, 1858) and wdl.shape == (5, 3) and mlh.shape == (5,)


def test_cuda_runs_an_lc0_file_in_float16(tmp_path):
    """As lc0 does on a GPU: the CUDA provider gets the float16 graph (here the stand-in, which
    records the model it was given), the CPU the float32 one."""
    import onnx
    from onnx import TensorProto

    from engine.tools.gpu_standin import SimulatedGPU, simulated_network

    class Recording(SimulatedGPU):
        def make(self, data, provider, batch=None, *args, **kwargs):
            session = super().make(data, provider, batch, *args, **kwargs)
            self.models.append((data, session))
            return session

    path = tmp_path / "net.pb.gz"
    write_lc0(str(path), Lc0Spec(se=True))
    gpu = Recording(new_shape_s=0.002)
    gpu.models = []
    simulated_network(str(path), gpu=gpu, max_batch=4)
    used = {onnx.load_from_string(m).graph.input[0].type.tensor_type.elem_type
            for m, session in gpu.models if session.shapes}
    assert used == {TensorProto.FLOAT16}
    on_cpu = Network(str(path), backend="cpu")
    assert on_cpu.variant == "fp32" and on_cpu.input_dtype == np.float32
