"""engine.network: loading, checking and evaluating ONNX networks.

The networks here are tiny graphs built with ``onnx.helper`` in the test
itself (no torch, no bundled file): the planes are summed over the board,
giving 112 features per position; the policy is ``features @ Wp + bp``, the
WDL ``softmax(features @ Ww + bw)`` and the moves-left ``relu(features @ Wm)``.
The same arithmetic in numpy is the reference.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import types

import numpy as np
import pytest

# The test networks are built with onnx, which comes with the train extra (the engine needs only onnxruntime).
onnx = pytest.importorskip("onnx", reason="builds its test networks with onnx: pip install 'cyzero[train]'")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from engine.network import (  # noqa: E402
    INPUT_NAME,
    MLH_NAME,
    POLICY_NAME,
    POLICY_SIZE,
    WDL_NAME,
    Network,
    NetworkError,
)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NETS = os.path.join(REPO, "engine", "nets")
IR_VERSION = 8  # onnx writes a newer IR than onnxruntime may read; 8 is read by every ORT in use
OPSET = 17


# --------------------------------------------------------------------------- tiny networks


def _weights(planes: int, policy: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    return {
        "Wp": rng.normal(0, 0.05, (planes, policy)).astype(np.float32),
        "bp": rng.normal(0, 0.05, (policy,)).astype(np.float32),
        "Ww": rng.normal(0, 0.05, (planes, 3)).astype(np.float32),
        "bw": rng.normal(0, 0.05, (3,)).astype(np.float32),
        "Wm": rng.normal(0, 0.05, (planes, 1)).astype(np.float32),
    }


def make_model(
    path,
    *,
    input_name: str = INPUT_NAME,
    planes: int = 112,
    batch="N",
    policy_name: str = POLICY_NAME,
    policy: int = POLICY_SIZE,
    wdl_name: str | None = WDL_NAME,
    wdl_softmax: bool = True,
    mlh: bool = True,
    fp16_io: bool = False,
    extra_input: bool = False,
    seed: int = 0,
) -> dict:
    """Write a tiny contract-shaped network to ``path``; returns its weights."""
    w = _weights(planes, policy, seed)
    io_type = TensorProto.FLOAT16 if fp16_io else TensorProto.FLOAT
    nodes = []
    x = input_name
    if fp16_io:
        nodes.append(helper.make_node("Cast", [input_name], ["x32"], to=TensorProto.FLOAT))
        x = "x32"
    nodes += [
        helper.make_node("Reshape", [x, "shape"], ["flat"]),
        helper.make_node("ReduceSum", ["flat", "axes"], ["feat"], keepdims=0),
        helper.make_node("MatMul", ["feat", "Wp"], ["pm"]),
        helper.make_node("Add", ["pm", "bp"], ["policy32"]),
    ]
    outputs = [("policy32", policy_name, [batch, policy])]
    if wdl_name is not None:
        nodes += [
            helper.make_node("MatMul", ["feat", "Ww"], ["wm"]),
            helper.make_node("Add", ["wm", "bw"], ["wlogits"]),
        ]
        if wdl_softmax:
            nodes.append(helper.make_node("Softmax", ["wlogits"], ["wdl32"], axis=1))
        else:
            nodes.append(helper.make_node("Identity", ["wlogits"], ["wdl32"]))
        outputs.append(("wdl32", wdl_name, [batch, 3]))
    if mlh:
        nodes += [
            helper.make_node("MatMul", ["feat", "Wm"], ["mm"]),
            helper.make_node("Relu", ["mm"], ["mlh32"]),
        ]
        outputs.append(("mlh32", MLH_NAME, [batch, 1]))
    graph_outputs = []
    for internal, name, shape in outputs:
        if fp16_io:
            nodes.append(helper.make_node("Cast", [internal], [name], to=TensorProto.FLOAT16))
        else:
            nodes.append(helper.make_node("Identity", [internal], [name]))
        graph_outputs.append(helper.make_tensor_value_info(name, io_type, shape))
    inputs = [helper.make_tensor_value_info(input_name, io_type, [batch, planes, 8, 8])]
    if extra_input:
        inputs.append(helper.make_tensor_value_info("/input/extra", TensorProto.FLOAT, [batch, 1]))
    initializers = [numpy_helper.from_array(v, k) for k, v in w.items()]
    initializers += [
        numpy_helper.from_array(np.array([0, planes, 64], np.int64), "shape"),
        numpy_helper.from_array(np.array([2], np.int64), "axes"),
    ]
    graph = helper.make_graph(nodes, "tiny", inputs, graph_outputs, initializers)
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION
    )
    model.metadata_props.add(key="note", value="tiny test network")
    onnx.checker.check_model(model)
    onnx.save(model, os.fspath(path))
    return w


def reference(planes: np.ndarray, w: dict):
    feat = planes.reshape(planes.shape[0], planes.shape[1], 64).astype(np.float64).sum(axis=2)
    policy = feat @ w["Wp"] + w["bp"]
    logits = feat @ w["Ww"] + w["bw"]
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    wdl = e / e.sum(axis=1, keepdims=True)
    mlh = np.maximum(feat @ w["Wm"], 0.0)[:, 0]
    return policy, wdl, mlh


def random_planes(n: int, seed: int = 1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.random((n, 112, 8, 8)) < 0.1).astype(np.float32)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("nets") / "tiny.onnx"
    w = make_model(path)
    return path, w


@pytest.fixture(scope="module")
def tiny_net(tiny):
    path, w = tiny
    return Network(path, backend="cpu", max_batch=128, intra_threads=1), w


# --------------------------------------------------------------------------- evaluation


@pytest.mark.parametrize("n", [1, 5, 300])
def test_evaluate_matches_numpy(tiny_net, n):
    net, w = tiny_net
    planes = random_planes(n, seed=n)
    before = planes.copy()
    policy, wdl, mlh = net.evaluate(planes)
    assert np.array_equal(planes, before), "evaluate must not write to the caller's array"
    assert policy.shape == (n, POLICY_SIZE) and policy.dtype == np.float32
    assert wdl.shape == (n, 3) and wdl.dtype == np.float32
    assert mlh.shape == (n,) and mlh.dtype == np.float32
    ref_policy, ref_wdl, ref_mlh = reference(planes, w)
    np.testing.assert_allclose(policy, ref_policy, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(wdl, ref_wdl, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(mlh, ref_mlh, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(wdl.sum(axis=1), 1.0, atol=1e-5)


def test_chunking_is_exact(tiny_net):
    """300 positions through max_batch=128 (chunks 128+128+44) equal one position at a time."""
    net, _ = tiny_net
    planes = random_planes(300, seed=7)
    policy, wdl, mlh = net.evaluate(planes)
    for i in (0, 127, 128, 255, 256, 299):
        p1, w1, m1 = net.evaluate(planes[i : i + 1])
        np.testing.assert_allclose(policy[i], p1[0], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(wdl[i], w1[0], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(mlh[i], m1[0], rtol=1e-5, atol=1e-5)


def test_empty_batch(tiny_net):
    net, _ = tiny_net
    policy, wdl, mlh = net.evaluate(np.zeros((0, 112, 8, 8), np.float32))
    assert policy.shape == (0, POLICY_SIZE) and wdl.shape == (0, 3) and mlh.shape == (0,)


def test_results_are_not_reused(tiny_net):
    net, _ = tiny_net
    a = net.evaluate(random_planes(4, seed=1))
    kept = [x.copy() for x in a]
    net.evaluate(random_planes(4, seed=2))
    for x, y in zip(a, kept):
        assert np.array_equal(x, y), "a later evaluate must not overwrite earlier results"


def test_input_views_and_dtypes_are_accepted_and_left_alone(tiny_net):
    net, w = tiny_net
    big = random_planes(10, seed=3)
    view = big[::2]  # not contiguous
    before = big.copy()
    policy, _, _ = net.evaluate(view)
    np.testing.assert_allclose(policy, reference(view, w)[0], rtol=1e-4, atol=1e-4)
    policy64, _, _ = net.evaluate(view.astype(np.float64))
    np.testing.assert_allclose(policy64, policy, rtol=1e-6)
    assert np.array_equal(big, before)
    with pytest.raises(ValueError, match=r"\[N,112,8,8\]"):
        net.evaluate(np.zeros((112, 8, 8), np.float32))


def test_evaluate_into_caller_buffers(tiny_net):
    net, w = tiny_net
    planes = random_planes(200, seed=4)
    policy = np.full((256, POLICY_SIZE), 7.0, np.float32)
    wdl = np.full((256, 3), 7.0, np.float32)
    mlh = np.full(256, 7.0, np.float32)
    assert net.evaluate_into(planes, policy, wdl, mlh) == 200
    ref_policy, ref_wdl, ref_mlh = reference(planes, w)
    np.testing.assert_allclose(policy[:200], ref_policy, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(wdl[:200], ref_wdl, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(mlh[:200], ref_mlh, rtol=1e-4, atol=1e-4)
    assert (policy[200:] == 7.0).all() and (wdl[200:] == 7.0).all() and (mlh[200:] == 7.0).all()
    with pytest.raises(ValueError, match="policy_out"):
        net.evaluate_into(planes, policy[:100], wdl, mlh)
    with pytest.raises(ValueError, match="wdl_out"):
        net.evaluate_into(planes, policy, wdl.astype(np.float64), mlh)


def test_concurrent_evaluations(tiny_net):
    """evaluate holds no shared buffers: threads at once get the same answers as one at a time."""
    from concurrent.futures import ThreadPoolExecutor

    net, _ = tiny_net
    inputs = [random_planes(n, seed=100 + n) for n in (1, 3, 50, 130, 7, 64, 2, 200)]
    expected = [net.evaluate(x) for x in inputs]
    with ThreadPoolExecutor(max_workers=4) as pool:
        for _ in range(3):
            got = list(pool.map(net.evaluate, inputs))
            for (p, w, m), (pe, we, me) in zip(got, expected):
                assert np.array_equal(p, pe) and np.array_equal(w, we) and np.array_equal(m, me)


def test_network_without_mlh(tmp_path):
    path = tmp_path / "nomlh.onnx"
    w = make_model(path, mlh=False)
    net = Network(path, backend="cpu", warmup_batch=1)
    assert not net.has_mlh
    planes = random_planes(3)
    policy, wdl, mlh = net.evaluate(planes)
    assert mlh is None
    np.testing.assert_allclose(wdl, reference(planes, w)[1], rtol=1e-4, atol=1e-5)
    mlh_out = np.zeros(3, np.float32)
    net.evaluate_into(
        planes, np.empty((3, POLICY_SIZE), np.float32), np.empty((3, 3), np.float32), mlh_out
    )
    assert np.isnan(mlh_out).all()


def test_float16_io_network_is_cast(tmp_path):
    """An fp16 export without keep_io_types: float16 in and out; callers still see float32."""
    path = tmp_path / "half.fp16.onnx"
    w = make_model(path, fp16_io=True)
    net = Network(path, backend="cpu", warmup_batch=1)
    assert net.input_dtype is np.float16 and net.variant == "fp16"
    planes = random_planes(6)
    policy, wdl, mlh = net.evaluate(planes)
    assert policy.dtype == wdl.dtype == mlh.dtype == np.float32
    ref_policy, ref_wdl, _ = reference(planes, w)
    np.testing.assert_allclose(policy, ref_policy, rtol=1e-2, atol=1e-2)
    np.testing.assert_allclose(wdl, ref_wdl, atol=1e-2)


def test_description_and_provider(tiny_net, tiny):
    net, _ = tiny_net
    path, _ = tiny
    assert net.provider == "CPUExecutionProvider"
    assert net.sha256 == __import__("hashlib").sha256(open(path, "rb").read()).hexdigest()
    assert "tiny.onnx" in net.description and net.sha256[:12] in net.description
    assert "CPU" in net.description and "fp32" in net.description
    assert net.metadata.get("note") == "tiny test network"


def test_expected_sha256(tiny):
    path, _ = tiny
    digest = __import__("hashlib").sha256(open(path, "rb").read()).hexdigest()
    Network(path, backend="cpu", expected_sha256=digest.upper() + "  tiny.onnx", warmup_batch=1)
    with pytest.raises(NetworkError, match="sha256 mismatch"):
        Network(path, backend="cpu", expected_sha256="0" * 64)


# --------------------------------------------------------------------------- bad files


def _raises(path, match, **kw):
    with pytest.raises(NetworkError, match=match) as info:
        Network(path, backend="cpu", **kw)
    assert isinstance(info.value, ValueError)
    text = str(info.value)
    assert "\n" not in text and len(text) < 300, f"message should be one short line: {text!r}"
    assert "onnxruntime_src" not in text and "[ONNXRuntimeError]" not in text
    return text


def test_missing_file(tmp_path):
    _raises(tmp_path / "nope.onnx", "not found")


def test_directory(tmp_path):
    _raises(tmp_path, "directory")


def test_text_file(tmp_path, capfd):
    path = tmp_path / "readme.onnx"
    path.write_text("this is not a network\n" * 20)
    _raises(path, "not an ONNX model")
    out, err = capfd.readouterr()
    assert out == "" and "onnxruntime" not in err.lower()


def test_empty_file(tmp_path):
    path = tmp_path / "empty.onnx"
    path.write_bytes(b"")
    _raises(path, "empty")


def test_truncated_file(tiny, tmp_path):
    data = open(tiny[0], "rb").read()
    for cut in (len(data) // 2, len(data) - 7, 50):
        path = tmp_path / f"cut{cut}.onnx"
        path.write_bytes(data[:cut])
        _raises(path, "truncated|not an ONNX|cannot load|missing output")


def test_wrong_input_name(tmp_path):
    path = tmp_path / "name.onnx"
    make_model(path, input_name="input_planes")
    text = _raises(path, "input")
    assert "'input_planes'" in text and INPUT_NAME in text


def test_two_inputs(tmp_path):
    path = tmp_path / "two.onnx"
    make_model(path, extra_input=True)
    _raises(path, "exactly one input")


def test_wrong_input_shape(tmp_path):
    path = tmp_path / "shape.onnx"
    make_model(path, planes=104)
    text = _raises(path, "shape")
    assert "[N,104,8,8]" in text and "[N,112,8,8]" in text


def test_fixed_batch(tmp_path):
    path = tmp_path / "fixed.onnx"
    make_model(path, batch=1)
    _raises(path, "fixed batch size")


def test_missing_wdl(tmp_path):
    path = tmp_path / "nowdl.onnx"
    make_model(path, wdl_name=None)
    _raises(path, f"missing output '{WDL_NAME}'")


def test_wdl_under_another_name(tmp_path):
    path = tmp_path / "value.onnx"
    make_model(path, wdl_name="/output/value")
    text = _raises(path, f"missing output '{WDL_NAME}'")
    assert "/output/value" in text


def test_wrong_policy_width(tmp_path):
    path = tmp_path / "width.onnx"
    make_model(path, policy=1000)
    text = _raises(path, POLICY_NAME)
    assert "[N,1000]" in text and "1858" in text


def test_wdl_without_softmax(tmp_path):
    path = tmp_path / "logits.onnx"
    make_model(path, wdl_softmax=False)
    _raises(path, "probability")


def test_too_new_ir_version(tiny, tmp_path):
    model = onnx.load(os.fspath(tiny[0]))
    model.ir_version = 99
    path = tmp_path / "future.onnx"
    onnx.save(model, os.fspath(path))
    _raises(path, "IR version 99")


def test_bad_arguments(tiny):
    path, _ = tiny
    with pytest.raises(NetworkError, match="backend"):
        Network(path, backend="opencl")
    with pytest.raises(NetworkError, match="max_batch"):
        Network(path, backend="cpu", max_batch=0)


def test_process_survives_bad_files_in_a_row(tiny, tmp_path):
    """Many bad loads, then a good one: nothing leaks into a state that breaks the next load."""
    for i in range(5):
        bad = tmp_path / f"bad{i}.onnx"
        bad.write_bytes(os.urandom(1000))
        with pytest.raises(NetworkError):
            Network(bad, backend="cpu")
    net = Network(tiny[0], backend="cpu", warmup_batch=1)
    assert net.evaluate(random_planes(2))[0].shape == (2, POLICY_SIZE)


# --------------------------------------------------------------------------- GPU fallback

# Run in a child process whose CUDA runtime sees no device (CUDA_VISIBLE_DEVICES=""), so that the
# GPU providers are unavailable on purpose, on a GPU machine as on one without: with
# onnxruntime-gpu the CUDA and TensorRT providers are listed but cannot start (no device, or no
# driver or TensorRT libraries), with plain onnxruntime they are not built in. A child process,
# because CUDA reads the variable once, when a process first initialises it (an earlier test in
# this worker may have). The child reports through a file, so its stdout and stderr must be empty.
_FALLBACK_CHILD = textwrap.dedent("""
    import json, sys
    if sys.argv[4] == "no-openvino":
        sys.modules["openvino"] = None   # import openvino raises ImportError, as where it is missing
    import onnxruntime as ort
    from engine.network import Network

    path, backend, report = sys.argv[1:4]
    lines = []
    net = Network(path, backend=backend, log=lines.append, warmup_batch=1)
    listed = sorted(set(ort.get_available_providers())
                    & {"CUDAExecutionProvider", "TensorrtExecutionProvider"})
    with open(report, "w") as f:
        json.dump({"provider": net.provider, "lines": lines, "listed": listed}, f)
    """)


def _fallback(tiny, tmp_path, backend: str, openvino: bool) -> dict:
    import json

    report = tmp_path / "report.json"
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    done = subprocess.run(
        [sys.executable, "-c", _FALLBACK_CHILD, os.fspath(tiny[0]), backend, os.fspath(report),
         "openvino" if openvino else "no-openvino"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout == "", f"nothing may reach stdout (the UCI channel): {done.stdout!r}"
    assert done.stderr == "", f"a runtime's own error dump leaked to stderr: {done.stderr[:300]!r}"
    got = json.loads(report.read_text())
    for line in got["lines"]:
        assert "\n" not in line and len(line) < 300
    return got


@pytest.mark.parametrize("backend", ["cuda", "tensorrt"])
def test_gpu_backend_falls_back_to_onnx_runtimes_cpu_path_with_one_line(tiny, tmp_path, backend):
    got = _fallback(tiny, tmp_path, backend, openvino=True)
    lines = got["lines"]
    assert got["provider"] == "CPUExecutionProvider"
    assert len(lines) == 1, lines
    assert "unavailable" in lines[0] and lines[0].endswith("using ONNX Runtime's CPU path")
    if backend == "cuda":
        assert lines[0].startswith("CUDA unavailable")


def test_auto_says_in_one_line_what_it_took_and_why(tiny, tmp_path):
    from engine.sessions import openvino_missing

    got = _fallback(tiny, tmp_path, "auto", openvino=True)
    assert len(got["lines"]) == 1, got["lines"]
    line = got["lines"][0]
    if openvino_missing() is None:
        assert got["provider"] == "OpenVINO"
        assert re.search(r"using OpenVINO (fp32|bf16) on the CPU \(the processor has (no )?bfloat16 in "
                         r"hardware\)$", line), line
    else:
        assert got["provider"] == "CPUExecutionProvider"
        assert line.endswith("using ONNX Runtime's CPU path") and "OpenVINO unavailable" in line, line
    # The child sees no GPU (CUDA_VISIBLE_DEVICES=""): even onnxruntime-gpu, which lists CUDA and
    # TensorRT, gets no word about them (a CPU machine's every start named the CUDA library missing).
    assert "CUDA" not in line and "TensorRT" not in line, (got["listed"], line)


class _FakeFactory:
    """open_session's view of a runtime: what it lists, and a session per provider it can make."""

    def __init__(self, listed, works):
        self._listed, self.works, self.asked = listed, works, []

    def listed(self):
        return self._listed

    def prepare_gpu(self):
        pass

    def why_failed(self, provider, error):
        return "no device"

    def openvino_missing(self):
        return "not installed"

    def make(self, data, provider, batch=None):
        self.asked.append(provider)
        if provider not in self.works:
            raise RuntimeError("cannot")
        return types.SimpleNamespace(providers=[provider])


@pytest.mark.parametrize("gpu", [False, True], ids=["cpu-machine", "gpu-machine"])
@pytest.mark.parametrize("ort", ["cpu-build", "gpu-build"])
def test_auto_mentions_cuda_only_where_there_is_a_gpu(monkeypatch, gpu, ort):
    from engine import sessions

    monkeypatch.setattr(sessions, "nvidia_gpu_visible", lambda: gpu)
    gpu_build = ort == "gpu-build"
    listed = ([sessions.TENSORRT, sessions.CUDA] if gpu_build else []) + [sessions.CPU]
    factory = _FakeFactory(listed, works={sessions.CPU})
    lines = []
    session = sessions.open_session(factory, b"", "auto", "net.onnx", lines.append)
    assert session.providers == [sessions.CPU]
    if not gpu:
        assert factory.asked == [sessions.CPU] and lines == ["OpenVINO unavailable (not installed); "
                                                             "using ONNX Runtime's CPU path"]
    elif gpu_build:
        assert lines[0].startswith("TensorRT unavailable (no device)")
    else:
        assert lines[0].startswith("CUDA unavailable (this onnxruntime is the CPU build: make engine GPU=1")


@pytest.mark.parametrize("env,files,platform,want", [
    ({}, {"/dev/nvidiactl"}, "linux", True),
    ({}, {"/dev/dxg"}, "linux", True),
    ({}, set(), "linux", False),
    ({"CUDA_VISIBLE_DEVICES": ""}, {"/dev/nvidiactl"}, "linux", False),
    ({"CUDA_VISIBLE_DEVICES": "-1"}, {"/dev/nvidia0"}, "linux", False),
    ({"CUDA_VISIBLE_DEVICES": "1"}, {"/dev/nvidia0"}, "linux", True),
    ({}, set(), "darwin", False),
])
def test_nvidia_gpu_visible_reads_the_drivers_devices(monkeypatch, env, files, platform, want):
    from engine import sessions

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(sessions.os.path, "exists", lambda p: p in files)
    monkeypatch.setattr(sessions.sys, "platform", platform)
    assert sessions.nvidia_gpu_visible() is want


@pytest.mark.parametrize("backend", ["openvino", "auto"])
def test_without_openvino_the_cpu_backends_fall_back_to_onnx_runtime_with_one_line(tiny, tmp_path, backend):
    got = _fallback(tiny, tmp_path, backend, openvino=False)
    assert got["provider"] == "CPUExecutionProvider"
    assert len(got["lines"]) == 1, got["lines"]
    assert got["lines"][0].endswith("OpenVINO unavailable (not installed: pip install openvino "
                                    "(import of openvino halted; None in sys.modules)); "
                                    "using ONNX Runtime's CPU path"), got["lines"]


def test_import_is_cheap_and_torch_free():
    code = textwrap.dedent("""
        import sys
        import engine.network
        assert "onnxruntime" not in sys.modules, "onnxruntime should load on first use"
        assert "torch" not in sys.modules and "trainer" not in sys.modules
        """)
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, timeout=60)


def test_evaluate_releases_the_gil(tmp_path):
    """A Python thread keeps running while ONNX Runtime computes a large batch."""
    import threading
    import time

    path = tmp_path / "gil.onnx"
    make_model(path)
    net = Network(path, backend="cpu", intra_threads=1, max_batch=4096, warmup_batch=1)
    planes = random_planes(4096)
    done = threading.Event()
    ticks = 0

    def spin():
        nonlocal ticks
        while not done.is_set():
            ticks += 1
            time.sleep(0)

    t = threading.Thread(target=spin)
    t.start()
    try:
        start = time.perf_counter()
        runs = 0
        while time.perf_counter() - start < 0.3:
            net.evaluate(planes)
            runs += 1
    finally:
        done.set()
        t.join()
    assert ticks > 10 * runs, (ticks, runs)


# --------------------------------------------------------------------------- the bundled network


def _positions(n: int) -> np.ndarray:
    import random

    from engine import encoding
    from engine.board import Board

    rng = random.Random(0)
    boards = []
    board = Board()
    while len(boards) < n:
        moves = board.legal_moves()
        if not moves or board.ply() > 80:
            board = Board()
            continue
        board.push_uci(rng.choice(moves))
        boards.append(board.copy())
    return encoding.encode_boards(boards)


@pytest.mark.parametrize("name", ["default.onnx", "default.fp16.onnx"])
def test_bundled_network(name):
    path = os.path.join(NETS, name)
    with open(path + ".sha256", encoding="utf-8") as f:
        expected = f.read()
    net = Network(path, backend="cpu", expected_sha256=expected, max_batch=32, warmup_batch=1)
    planes = _positions(40)
    policy, wdl, mlh = net.evaluate(planes)
    assert policy.shape == (40, POLICY_SIZE) and wdl.shape == (40, 3)
    assert np.isfinite(policy).all() and np.isfinite(wdl).all()
    assert (wdl >= 0).all()
    np.testing.assert_allclose(wdl.sum(axis=1), 1.0, atol=1e-3)
    if mlh is not None:
        assert mlh.shape == (40,) and np.isfinite(mlh).all()


# --------------------------------------------------------------------------- cyzero bench nn


def test_bench_nn_json(tmp_path, capsys):
    """`cyzero bench nn --json` prints one JSON object with per-variant speeds and the int8 ratio."""
    import json

    from uci.cli import main

    fp32 = tmp_path / "tiny.onnx"
    int8 = tmp_path / "tiny.int8.onnx"  # named like the bundled variant; the graph is the same
    make_model(fp32)
    make_model(int8, seed=1)
    argv = ["bench", "nn", "--json", "--seconds", "0.02", "--batches", "1,4,16"]
    argv += ["--backend", "cpu", "--threads", "1", "--net", str(fp32), "--net", str(int8)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1
    result = json.loads(out)
    assert result["benchmark"] == "nn" and result["provider"] == "CPUExecutionProvider"
    assert set(result["variants"]) == {"fp32", "int8"}
    for variant in result["variants"].values():
        assert set(variant["positions_per_second"]) == {"1", "4", "16"}
        assert all(v > 0 for v in variant["positions_per_second"].values())
    assert result["int8_speedup"] > 0
    assert set(result["int8_speedup_by_batch"]) == {"1", "4", "16"}


def test_bench_nn_reports_a_bad_network(tmp_path, capsys):
    from uci.cli import main

    bad = tmp_path / "bad.onnx"
    bad.write_text("not a network")
    assert main(["bench", "nn", "--json", "--net", str(bad)]) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and "not an ONNX model" in captured.err
