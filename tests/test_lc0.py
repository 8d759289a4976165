"""engine.lc0 against lc0 itself: lc0 network files, lc0's own ONNX export of them (``leela2onnx``)
and lc0's own evaluation of them (``go nodes 1``, ``VerboseMoveStats``).

The repository's own fixture (``tests/data/lc0/``, a small cyzero network written by ``cyzero-train
export --lc0`` with lc0's outputs for it, ``docs/recipes/lc0-fixture.py``) runs everywhere. Maia 1100,
a network lc0's own trainer wrote, is an extra (GPL-3.0, never in the repository): where it is absent
those cases are skipped, saying where a user gets it (``tests/lc0_files.py``, ``MAIA``).
"""

from __future__ import annotations

import gzip
import hashlib
import os
import shutil
import time

import numpy as np
import pytest

from engine.board import Board
from engine.encoding import POLICY_INDEX, POLICY_SIZE, encode_board, encode_position, legal_policy
from engine.lc0 import CONV_POLICY_MAP, Lc0Error, read_lc0, read_lc0_file
from engine.lc0_onnx import lc0_to_onnx
from engine.network import Network, NetworkError
from lc0_files import ATTENTION_POLICY, ATTENTION_POLICY_ENCODERS, BODY_MULTIHEAD, BODY_PE_MAP, CYZERO, EVALUATED_BY_LC0, LC0_TOLERANCE, Lc0Spec, assert_plays_as_lc0, fixture_params, \
    make_lc0, random_planes, reference_forward, truncated, wrap_onnx, write_bytes, write_lc0, wrong_magic
from test_uci_harness import REPO, UciEngine

# lc0 names castling king-takes-rook.
_CASTLING = {"e1h1": "e1g1", "e1a1": "e1c1", "e8h8": "e8g8", "e8a8": "e8c8"}


def _openvino_params():
    """OpenVINO in fp32, and in bf16 where the processor has it in hardware (skipped without OpenVINO)."""
    from engine import processor
    from engine.sessions import openvino_missing

    missing = pytest.mark.skipif(openvino_missing() is not None, reason="OpenVINO is not installed")
    params = [pytest.param("fp32", marks=missing, id="openvino-fp32")]
    if processor.native_bf16():
        params.append(pytest.param("bf16", marks=missing, id="openvino-bf16"))
    return params


def test_the_attention_policy_map_places_every_move():
    """Each of the 1858 moves has its own place among the attention head's 64 x 64 from-to logits
    and 8 x 24 promotion logits: a move's from and to squares, or for a q/r/b promotion the pawn's
    file, the file it promotes on and the piece (lc0 v0.32.1's kAttnPolicyMap, q, r, b)."""
    from engine.lc0 import ATTENTION_POLICY_MAP

    assert len(set(ATTENTION_POLICY_MAP.tolist())) == POLICY_SIZE
    assert ATTENTION_POLICY_MAP.min() >= 0 and ATTENTION_POLICY_MAP.max() < 64 * 64 + 8 * 24
    index = {move: i for i, move in enumerate(POLICY_INDEX)}
    assert ATTENTION_POLICY_MAP[index["e2e4"]] == 12 * 64 + 28
    assert ATTENTION_POLICY_MAP[index["g1f3"]] == 6 * 64 + 21
    assert ATTENTION_POLICY_MAP[index["a7a8"]] == 48 * 64 + 56          # the knight promotion: from-to
    assert [ATTENTION_POLICY_MAP[index[m]] for m in ("a7a8q", "a7a8r", "a7a8b", "a7b8q", "h7g8b")] == \
        [4096, 4097, 4098, 4099, 4096 + 24 * 7 + 3 * 6 + 2]


def test_the_conv_policy_map_is_lc0s():
    import onnx
    from onnx import numpy_helper

    model = onnx.load(CYZERO.need().onnx)
    table = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}["/const/mapping_table"]
    assert np.array_equal(table.astype(np.int64), CONV_POLICY_MAP)


@pytest.mark.parametrize("fixture", fixture_params())
@pytest.mark.parametrize("dtype, policy_tol, wdl_tol", [("float32", 5e-3, 2e-4), ("float16", 0.1, 3e-3)])
def test_the_graph_equals_lc0s_own_export(fixture, dtype, policy_tol, wdl_tol):
    """Built from the .pb.gz in memory, run on lc0's positions and on random planes (every
    input plane, rule50 counts included), the outputs are those of lc0's leela2onnx export."""
    import onnxruntime as ort

    net = read_lc0_file(fixture.need().pb)
    ours = ort.InferenceSession(lc0_to_onnx(net, dtype), providers=["CPUExecutionProvider"])
    theirs = ort.InferenceSession(fixture.onnx, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    noise = (rng.random((6, 112, 8, 8)) < 0.1).astype(np.float32)
    noise[:, 109] = rng.integers(0, 100, (6, 1, 1))
    planes = np.concatenate([np.stack([encode_position(p["fen"]) for p in fixture.lc0()["positions"]]), noise])
    names = [o.name for o in theirs.get_outputs()]
    assert sorted(names) == sorted(o.name for o in ours.get_outputs())
    want = dict(zip(names, theirs.run(names, {"/input/planes": planes})))
    got = dict(zip(names, ours.run(names, {"/input/planes": planes.astype(np.float16 if dtype == "float16"
                                                                          else np.float32)})))
    assert np.abs(got["/output/policy"].astype(np.float32) - want["/output/policy"]).max() < policy_tol
    assert np.abs(got["/output/wdl"].astype(np.float32) - want["/output/wdl"]).max() < wdl_tol
    assert ("/output/mlh" in names) == fixture.spec.moves_left
    if fixture.spec.moves_left:  # tens of plies
        assert np.abs(got["/output/mlh"].astype(np.float32) - want["/output/mlh"]).max() < policy_tol * 10


def _lc0_shares(board: Board, policy_row: np.ndarray, position: dict, temperature: float):
    """(cyzero's legal moves -> share in percent, lc0's in cyzero's names)."""
    moves, shares = legal_policy(board, policy_row, temperature)
    ours = dict(zip(moves, (shares * 100).tolist()))
    theirs = {_CASTLING.get(m, m) if _CASTLING.get(m) in ours else m: v["p"] for m, v in position["moves"].items()}
    return ours, theirs


@pytest.mark.parametrize("fixture", fixture_params(*EVALUATED_BY_LC0))
def test_value_and_policy_match_lc0s_own_evaluation(fixture):
    """lc0 evaluated the file itself: V = W - L to its 4 printed decimals, D to its 3, moves left
    where the net has the head, and every legal move's policy share at lc0's temperature 1.359
    within 0.07 percentage points (lc0 prints two decimals), the legal moves named by cyzero's own
    move generator and policy map. Three of the positions have a non-zero rule50 count: the plane is
    fed raw."""
    network = Network(fixture.need().pb, backend="cpu")
    lc0 = fixture.lc0()
    assert any(int(p["fen"].split()[4]) > 0 for p in lc0["positions"])
    for p in lc0["positions"]:
        board = Board(p["fen"])
        policy, wdl, mlh = network.evaluate(encode_board(board)[None])
        assert abs(float(wdl[0, 0] - wdl[0, 2]) - p["v"]) < LC0_TOLERANCE["v"], p["fen"]
        assert abs(float(wdl[0, 1]) - p["d"]) < LC0_TOLERANCE["d"], p["fen"]
        assert (mlh is not None) == fixture.spec.moves_left, p["fen"]
        assert abs((0.0 if mlh is None else float(mlh[0])) - p.get("m", 0.0)) < LC0_TOLERANCE["m"], p["fen"]
        ours, theirs = _lc0_shares(board, policy[0], p, lc0["policy_temperature"])
        assert set(ours) == set(theirs), p["fen"]
        assert max(abs(ours[m] - theirs[m]) for m in ours) < LC0_TOLERANCE["p"], p["fen"]


def _bump(array: np.ndarray, share: float) -> None:
    """``array``'s largest element (in magnitude), ``share`` of it larger, in place."""
    flat = array.reshape(-1)
    flat[np.argmax(np.abs(flat))] *= 1.0 + share


def _swap_se_halves(w) -> None:
    se = w.residual[1].se
    filters = se.b2.shape[0] // 2
    se.w2[:] = np.concatenate([se.w2[filters:], se.w2[:filters]])
    se.b2[:] = np.concatenate([se.b2[filters:], se.b2[:filters]])


MISREADINGS = {
    "one stem weight 10% off": lambda w: _bump(w.input.w, 0.1),
    "one weight of the last block 10% off": lambda w: _bump(w.residual[-1].conv2.w, 0.1),
    "SE scale and shift swapped": _swap_se_halves,
    "value head's hidden biases 0.05 off": lambda w: np.add(w.ip1_val.b, 0.05, out=w.ip1_val.b),
    "moves-left output 0.2 plies off": lambda w: np.add(w.ip2_mov.b, 0.2, out=w.ip2_mov.b),
}


@pytest.mark.parametrize("misreading", list(MISREADINGS))
def test_a_misread_network_does_not_play_as_lc0_evaluates_it(misreading):
    """The comparison with lc0's evaluation has teeth: the repository's fixture as read passes it,
    and each small misreading of one layer fails it."""
    import onnxruntime as ort

    lc0 = CYZERO.need().lc0()
    planes = np.stack([encode_position(p["fen"]) for p in lc0["positions"]])

    def outputs(net):
        session = ort.InferenceSession(lc0_to_onnx(net), providers=["CPUExecutionProvider"])
        out = dict(zip(["policy", "wdl", "mlh"], session.run(["/output/policy", "/output/wdl", "/output/mlh"],
                                                              {"/input/planes": planes})))
        return out["policy"], out["wdl"], out["mlh"].reshape(-1)

    net = read_lc0_file(CYZERO.pb)
    assert_plays_as_lc0(lc0, *outputs(net))
    MISREADINGS[misreading](net.weights)
    with pytest.raises(AssertionError):
        assert_plays_as_lc0(lc0, *outputs(net))


@pytest.mark.parametrize("fixture", fixture_params(*EVALUATED_BY_LC0))
@pytest.mark.parametrize("precision", _openvino_params())
def test_openvino_matches_lc0s_own_evaluation(fixture, precision):
    """The same files on OpenVINO: in fp32 to lc0's printed digits as on ONNX Runtime; in bf16 V
    within 0.02 and every policy share within 1 percentage point (3 after the policy's own encoder
    layers, as for attention bodies: tests/test_lc0_attention.py)."""
    net = Network(fixture.need().pb, backend="openvino", precision=precision, max_batch=1)
    assert net.provider == "OpenVINO" and net.precision == precision
    v_tol, p_tol = (LC0_TOLERANCE["v"], LC0_TOLERANCE["p"]) if precision == "fp32" else (
        0.02, 3.0 if fixture.spec.policy_encoders else 1.0)
    lc0 = fixture.lc0()
    for p in lc0["positions"]:
        board = Board(p["fen"])
        policy, wdl, _ = net.evaluate(encode_board(board)[None])
        assert abs(float(wdl[0, 0] - wdl[0, 2]) - p["v"]) < v_tol, p["fen"]
        ours, theirs = _lc0_shares(board, policy[0], p, lc0["policy_temperature"])
        assert max(abs(ours[m] - theirs[m]) for m in ours) < p_tol, p["fen"]


@pytest.mark.parametrize("fixture", fixture_params(*EVALUATED_BY_LC0))
def test_network_reads_the_file_and_describes_it(fixture):
    network = Network(fixture.need().pb, backend="cpu")
    with open(fixture.pb, "rb") as f:
        assert network.sha256 == hashlib.sha256(f.read()).hexdigest()   # the file's own digest
    assert network.lc0_description.startswith(fixture.description)
    size = f"{fixture.spec.blocks}x{fixture.spec.filters}"
    assert network.lc0_description in network.description and size in network.description
    assert network.has_mlh == fixture.spec.moves_left


def test_a_damaged_file_is_refused_with_what_it_is(tmp_path):
    with open(CYZERO.need().pb, "rb") as f:
        data = f.read()
    cases = {
        "truncated.pb.gz": (data[: len(data) // 2], "corrupt or truncated gzip"),
        "text.pb": (b"hello, this is not a network\n" * 10, "not an lc0 network file"),
        "empty.pb.gz": (b"", "empty"),
    }
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


@pytest.mark.parametrize("fixture", [CYZERO, ATTENTION_POLICY, ATTENTION_POLICY_ENCODERS, BODY_MULTIHEAD,
                                     BODY_PE_MAP], ids=lambda f: f.name)
def test_the_engine_plays_an_lc0_file_and_says_what_it_is(tmp_path, fixture):
    weights = tmp_path / "net.pb.gz"
    shutil.copy(fixture.need().pb, weights)
    with UciEngine(options={"WeightsFile": str(weights)}) as eng:
        eng.send("position startpos moves e2e4")
        eng.send("go nodes 50")
        lines = eng.until("bestmove", timeout=60)
        said = " ".join(text for _, text in eng.lines if text.startswith("info string"))
        assert fixture.description in said and "net.pb.gz" in said
        assert lines[-1].split()[1] not in ("0000", "(none)")
        assert not eng.bad


# --------------------------------------------------------------------------- synthetic networks
# Every member of the classical family, written by an independent writer (tests/lc0_files.py)
# and run through the reader and the graph, against that writer's NumPy forward pass.

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
    "attention policy (T60-T78's head)": Lc0Spec(se=True, policy="attention", moves_left=True),
    "attention policy, mish, wider": Lc0Spec(policy="attention", activation="mish", policy_embedding=32,
                                             policy_d_model=24, encoding="float16"),
    "attention policy, a policy encoder layer x 4h": Lc0Spec(policy="attention", policy_encoders=1,
                                                             policy_encoder_heads=4),
    "attention policy, 2 policy encoder layers, mish, single value": Lc0Spec(
        se=True, policy="attention", activation="mish", value="classical", policy_encoders=2,
        policy_encoder_heads=2, dff=24, encoding="float16"),
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
        # bf16: logits within 0.1, 0.3 after the policy's own encoder layers (their softmax and layer norms)
        tol = (1e-3, 1e-4) if dtype == "fp32" else (0.3 if spec.policy_encoders else 0.1, 0.02)
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


def test_an_attention_policy_with_policy_encoder_layers_reads_them_on_a_residual_tower():
    """A policy head with encoder layers of its own (fields 21, 24) on a residual tower is read as
    such, not taken for a transformer body nor played without them (lc0's evaluation of such a file:
    ATTENTION_POLICY_ENCODERS); layers that do not split into the file's head count are named."""
    net = read_lc0(make_lc0(Lc0Spec(se=True, policy="attention", policy_encoders=2, policy_encoder_heads=4))[0])
    assert net.body is None and net.weights.policy == "attention"
    head = net.weights.attention_policy
    assert (len(head.encoders), head.heads) == (2, 4) and head.encoders[0].smolgen is None
    assert "attention policy with 2 encoder layers x 4h" in net.description
    with pytest.raises(Lc0Error, match="attention policy encoder 0: 16-wide queries do not split into 3 heads"):
        read_lc0(make_lc0(Lc0Spec(policy="attention", policy_encoders=1, policy_encoder_heads=3))[0])


REFUSED = {
    # attention bodies play (tests/test_lc0_attention.py); one on a residual tower does not
    "attention body on a residual tower": (Lc0Spec(attention=True), "attention body on a residual tower"),
    "attention fields behind a classical header": (Lc0Spec(attention=True, network=3),
                                                   "holds attention-body \\(transformer\\) weights"),
    "an input format lc0 does not have": (Lc0Spec(input_format=99), "unknown input format \\(99\\)"),
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
        # The watcher's news is said as a search begins (uci.session.Floor): search until it is.
        said = _searched_until(eng, lambda text: text.startswith("info string switched to network"))
        switched = [text for text in said if text.startswith("info string switched to network")]
        assert any(digest[:12] in text and "verified" in text for text in said), said
        assert digest[:12] in switched[0] and "lc0 network 2x16 SE" in switched[0]
        # A damaged file in its place is refused by name, and the network in use is kept.
        with open(weights, "rb") as f:
            write_bytes(str(weights), truncated(f.read()), gz=False)
        said = _searched_until(eng, lambda text: "refused network" in text and "corrupt or truncated" in text
                               and digest[:12] in text)
        assert not any("switched" in text for text in said)
        assert not eng.bad


def _searched_until(eng: UciEngine, wanted, timeout: float = 60.0) -> list[str]:
    """The lines of one-node searches, one after another, until one of them is ``wanted``; every
    search plays a move."""
    deadline = time.monotonic() + timeout
    said: list[str] = []
    while not any(wanted(text) for text in said):
        assert time.monotonic() < deadline, said
        lines, best = eng.go("nodes 1", timeout)
        assert best.split()[1] != "0000", lines
        said += lines
    return said


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
