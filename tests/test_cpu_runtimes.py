"""The CPU runtimes and precisions the engine can pick, checked against PyTorch on real positions.

Every runtime and precision this machine can run (``engine.tools.bench_nn.NN_CPU_RUNTIMES``:
ONNX Runtime's CPU path in fp32 and int8; OpenVINO in fp32, bf16 where the processor has it
in hardware, and int8) evaluates 700-odd positions from real games (``tests/real_positions.py``)
and is compared with the bundled network rebuilt in PyTorch. The bounds keep a GUI's
``score cp`` and WDL honest: int8 no worse than the int8 file on ONNX Runtime (the engine's
CPU default before OpenVINO), bf16 several times tighter, fp32 exact to rounding.
"""
from __future__ import annotations

import copy
import os
import threading

import numpy as np
import pytest

from engine import processor
from engine.network import OPENVINO, Network
from engine.sessions import openvino_missing, openvino_precision
from engine.tools.bench_nn import NN_CPU_RUNTIMES, macs_per_position
from engine.weights import bundled_variant_path, default_weights_path
from real_positions import real_positions

NETS = default_weights_path().rsplit("/", 1)[0]
HAVE_OPENVINO = openvino_missing() is None

# (largest |V - V_torch|, mean |V - V_torch|, least share of positions whose best legal move
# by policy is PyTorch's), V = W - L. Measured on this file (AVX-512 VNNI + BF16): ONNX
# Runtime int8 0.253 / 0.0196 / 96.8%, OpenVINO int8 the same, OpenVINO bf16 0.073 / 0.0092 /
# 99.2%, fp32 below 1e-5 / 100%.
BOUNDS = {
    "int8": (0.27, 0.022, 0.96),
    "bf16": (0.11, 0.013, 0.985),
    "fp32": (1e-3, 1e-4, 0.995),
}


def _available():
    for label, name, backend, precision, arithmetic in NN_CPU_RUNTIMES:
        if backend == "openvino" and not HAVE_OPENVINO:
            continue
        if arithmetic == "bf16" and not processor.native_bf16():
            continue
        yield pytest.param(name, backend, precision, arithmetic, id=label.replace(" ", "-"))


@pytest.fixture(scope="module")
def reference():
    """PyTorch's outputs for the bundled network on the real positions."""
    import torch

    from trainer.run_setup import read_init_network
    from trainer.model import InferenceNet

    planes, masks = real_positions()
    net, _ = read_init_network(default_weights_path())
    with torch.no_grad():
        policy, wdl = [t.numpy() for t in InferenceNet(copy.deepcopy(net).eval()).eval()(
            torch.from_numpy(planes))][:2]
    return planes, masks, policy, wdl


def errors(masks, policy, wdl, ref_policy, ref_wdl) -> tuple[float, float, float]:
    v, ref_v = wdl[:, 0] - wdl[:, 2], ref_wdl[:, 0] - ref_wdl[:, 2]
    best = np.where(masks, policy, -np.inf).argmax(axis=1)
    ref_best = np.where(masks, ref_policy, -np.inf).argmax(axis=1)
    return float(np.abs(v - ref_v).max()), float(np.abs(v - ref_v).mean()), float((best == ref_best).mean())


@pytest.mark.parametrize("name, backend, precision, arithmetic", list(_available()))
def test_every_cpu_runtime_and_precision_keeps_to_its_bound_on_real_positions(
        reference, name, backend, precision, arithmetic):
    planes, masks, ref_policy, ref_wdl = reference
    assert len(planes) > 500
    net = Network(f"{NETS}/{name}", backend=backend, precision=precision, intra_threads=2, log=lambda line: None)
    assert net.precision == arithmetic and net.provider == ("OpenVINO" if backend == "openvino" else
                                                             "CPUExecutionProvider")
    policy, wdl, _ = net.evaluate(planes)
    largest, mean, agreement = errors(masks, policy, wdl, ref_policy, ref_wdl)
    bound = BOUNDS[arithmetic]
    assert largest <= bound[0] and mean <= bound[1] and agreement >= bound[2], (largest, mean, agreement)


@pytest.mark.skipif(not HAVE_OPENVINO, reason="OpenVINO is not installed (pip install openvino)")
def test_openvino_int8_is_no_worse_than_onnx_runtimes_int8(reference):
    """The engine's CPU default before OpenVINO is the bound: the same file on OpenVINO may not
    move the value or the best move further from PyTorch's."""
    planes, masks, ref_policy, ref_wdl = reference
    figures = {}
    for backend in ("cpu", "openvino"):
        net = Network(f"{NETS}/default.int8.onnx", backend=backend, intra_threads=2, log=lambda line: None)
        figures[backend] = errors(masks, *net.evaluate(planes)[:2], ref_policy, ref_wdl)
    (ort_max, ort_mean, ort_agree), (ov_max, ov_mean, ov_agree) = figures["cpu"], figures["openvino"]
    assert ov_max <= ort_max + 0.01 and ov_mean <= ort_mean * 1.05 and ov_agree >= ort_agree - 0.005, figures


@pytest.mark.skipif(not HAVE_OPENVINO, reason="OpenVINO is not installed (pip install openvino)")
def test_an_openvino_network_pads_to_its_fixed_sizes_and_answers_every_row_as_alone():
    """One compiled network per size: 5 positions run padded to 8, 300 in chunks of the largest
    size; every row's answer is the one it gets alone, and the fp32 graph is ONNX Runtime's."""
    planes, _ = real_positions()
    planes = planes[:300]
    net = Network(f"{NETS}/default.onnx", backend="openvino", precision="fp32", intra_threads=1,
                  max_batch=64, log=lambda line: None)
    assert net.batch_sizes == (1, 2, 4, 8, 16, 32, 64) and net.padded(5) == 8 and not net.gpu
    alone = np.concatenate([net.evaluate(planes[i:i + 1])[1] for i in range(0, 300, 37)])
    five = net.evaluate(planes[:5])
    many = net.evaluate(planes)
    ort = Network(f"{NETS}/default.onnx", backend="cpu", intra_threads=1).evaluate(planes)
    assert np.allclose(many[1][::37], alone, atol=1e-5)
    assert np.allclose(five[0], many[0][:5], atol=1e-4) and np.allclose(five[1], many[1][:5], atol=1e-5)
    assert np.abs(many[0] - ort[0]).max() < 1e-3 and np.abs(many[1] - ort[1]).max() < 1e-4
    assert np.abs(many[2] - ort[2]).max() < 1e-2


@pytest.mark.skipif(not HAVE_OPENVINO, reason="OpenVINO is not installed (pip install openvino)")
def test_loading_on_openvino_leaves_the_process_locale_as_it_was(monkeypatch):
    """OpenVINO's compiler sets the C locale while it works and restores the one it found; two
    sizes compiled side by side left a process in the C locale, where every open() and subprocess
    text read ASCII only (the trainer's status output failed to decode in CI)."""
    import locale

    from engine import sessions

    before = locale.setlocale(locale.LC_ALL)
    for _ in range(3):
        Network(f"{NETS}/default.int8.onnx", backend="openvino", log=lambda line: None)
        assert locale.setlocale(locale.LC_ALL) == before
    # The guard itself, where the race did not happen this time: whatever a compile leaves is undone.
    real = sessions._OpenVinoSource.compile

    def compile_leaving_c(self, batch, threads):
        session = real(self, batch, threads)
        locale.setlocale(locale.LC_ALL, "C")
        return session

    monkeypatch.setattr(sessions._OpenVinoSource, "compile", compile_leaving_c)
    Network(f"{NETS}/default.int8.onnx", backend="openvino", max_batch=4, log=lambda line: None)
    assert locale.setlocale(locale.LC_ALL) == before


@pytest.mark.skipif(not HAVE_OPENVINO, reason="OpenVINO is not installed (pip install openvino)")
def test_an_openvino_network_answers_two_threads_at_once_as_one():
    """Two batches in flight: each thread has its own infer request, and neither sees the other's rows."""
    planes, _ = real_positions()
    net = Network(f"{NETS}/default.int8.onnx", backend="openvino", intra_threads=1, max_batch=8,
                  log=lambda line: None)
    parts = [np.ascontiguousarray(planes[:8]), np.ascontiguousarray(planes[8:16])]
    want = [net.evaluate(p) for p in parts]
    got: dict[int, list] = {0: [], 1: []}

    def run(i: int) -> None:
        for _ in range(30):
            got[i].append(net.evaluate(parts[i]))

    threads = [threading.Thread(target=run, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in (0, 1):
        for policy, wdl, mlh in got[i]:
            assert np.array_equal(policy, want[i][0]) and np.array_equal(wdl, want[i][1])


# --------------------------------------------------------------------------- the choice

AMX = frozenset({"avx2", "avx512bw", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_tile", "amx_int8"})
ZEN4 = frozenset({"avx2", "avx512bw", "avx512_vnni", "avx512_bf16"})
CASCADE_LAKE = frozenset({"avx2", "avx512bw", "avx512_vnni"})
LAPTOP = frozenset({"avx2", "fma"})


@pytest.mark.parametrize("flags, isa, bf16, bundled", [
    (AMX, "AMX", True, "default.onnx"),
    (ZEN4, "AVX-512 VNNI", True, "default.int8.onnx"),
    (CASCADE_LAKE, "AVX-512 VNNI", False, "default.int8.onnx"),
    (LAPTOP, "AVX2", False, "default.int8.onnx"),
    (frozenset(), "unknown", False, "default.int8.onnx"),
])
def test_the_file_and_arithmetic_follow_the_processor(monkeypatch, flags, isa, bf16, bundled):
    monkeypatch.setattr(processor, "features", lambda: flags)
    assert processor.vector_isa() == isa and processor.native_bf16() == bf16
    assert (bundled_variant_path(OPENVINO) or default_weights_path()).endswith("/" + bundled)
    assert openvino_precision(quantized=True) == ("int8", "a quantized file")
    assert openvino_precision(quantized=False)[0] == ("bf16" if bf16 else "fp32")


def test_the_nominal_peak_is_the_table_times_the_clock():
    assert processor.peak_macs("int8", AMX, ghz=2.0) == 1024 * 2e9
    assert processor.peak_macs("bf16", AMX, ghz=2.0) == 512 * 2e9
    assert processor.peak_macs("int8", ZEN4, ghz=2.0) == 128 * 2e9
    assert processor.peak_macs("bf16", ZEN4, ghz=2.0) == 64 * 2e9
    assert processor.peak_macs("bf16", CASCADE_LAKE, ghz=2.0) is None   # emulated: no peak to quote
    assert processor.peak_macs("fp32", LAPTOP, ghz=3.0) == 16 * 3e9
    assert processor.peak_macs("int8", frozenset(), ghz=3.0) is None


def test_macs_per_position_counts_what_pytorch_multiplies():
    """From the ONNX graph (the int8 file's weights read through their DequantizeLinear), the
    count is the PyTorch model's: each convolution's weights times the 64 squares, each
    linear layer's weights once."""
    import torch

    from trainer.run_setup import read_init_network

    net, _ = read_init_network(default_weights_path())
    want = sum(m.weight.numel() * (64 if isinstance(m, torch.nn.Conv2d) else 1)
               for m in net.modules() if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear)))
    assert macs_per_position(f"{NETS}/default.onnx") == want
    assert macs_per_position(f"{NETS}/default.int8.onnx") == want


@pytest.mark.parametrize("cap, isa, bf16", [("AVX2", "AVX2", False), ("AVX512_CORE_VNNI", "AVX-512 VNNI", False),
                                            ("AVX512_CORE_BF16", "AVX-512 VNNI", True)])
def test_a_onednn_cap_narrows_the_flags_the_choice_reads(monkeypatch, cap, isa, bf16):
    """ONEDNN_MAX_CPU_ISA holds OpenVINO to a narrower instruction set: the choice follows it, so
    a narrower machine is measured as it would run (docs/cpu.md)."""
    monkeypatch.setattr("builtins.open", _cpuinfo_with(AMX | {"avx_vnni"}))
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", cap)
    processor.cpuinfo_flags.cache_clear()
    try:
        assert processor.vector_isa() == isa and processor.native_bf16() == bf16
        assert processor.vector_isa(processor.cpuinfo_flags()) == "AMX"   # ONNX Runtime's: all of them
    finally:
        monkeypatch.undo()
        processor.cpuinfo_flags.cache_clear()


def _cpuinfo_with(flags):
    import builtins
    import io

    real_open = builtins.open

    def fake(path, *args, **kwargs):
        if path == "/proc/cpuinfo":
            return io.StringIO("processor\t: 0\nflags\t\t: " + " ".join(sorted(flags)) + "\n")
        return real_open(path, *args, **kwargs)

    return fake


def test_openvinos_cache_is_kept_to_its_size_oldest_first(tmp_path):
    from engine.sessions import _prune_cache

    for i, size in enumerate((400, 300, 200, 100)):
        path = tmp_path / f"{i}.blob"
        path.write_bytes(b"x" * size)
        os.utime(path, (1000 + i, 1000 + i))
    _prune_cache(str(tmp_path), 350)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["2.blob", "3.blob"]


@pytest.mark.skipif(not (HAVE_OPENVINO and processor.native_bf16()),
                    reason="OpenVINO bf16 needs OpenVINO and a processor with bfloat16 in hardware (AMX, AVX-512 BF16)")
def test_an_attention_bodys_cpu_file_keeps_to_the_bf16_bound_on_real_positions(tmp_path):
    """An attention body has no int8 variant: its CPU file is the fp32 export, which OpenVINO runs in
    bf16 here; it keeps to the bound the bundled tower's bf16 keeps to (the trainer's transformer
    fixture, a random network whose policy is far from uniform)."""
    import torch

    import lc0_files as L
    from trainer.export import export_onnx
    from trainer.model import InferenceNet

    planes, masks = real_positions()
    net = L.trainer_transformer()
    with torch.no_grad():
        ref_policy, ref_wdl = [t.numpy() for t in InferenceNet(net).eval()(torch.from_numpy(planes))][:2]
    path = tmp_path / "bt.onnx"
    export_onnx(net, str(path), "fp32", check_positions=16)
    played = Network(str(path), backend="openvino", intra_threads=2, log=lambda line: None)
    assert played.precision == "bf16"
    policy, wdl, _ = played.evaluate(planes)
    largest, mean, _ = errors(masks, policy, wdl, ref_policy, ref_wdl)
    bound = BOUNDS["bf16"]
    assert largest <= bound[0] and mean <= bound[1], (largest, mean)
    # A random network's best moves are near ties, so its policy is checked as shares: each legal
    # move's within a point of PyTorch's (measured 0.6), and the move bf16 ranks first never more
    # than half a point below PyTorch's first (measured 0.2)
    ours, theirs = _shares(policy, masks), _shares(ref_policy, masks)
    assert np.abs(ours - theirs).max() < 0.01
    chosen = theirs[np.arange(len(theirs)), ours.argmax(axis=1)]
    assert (theirs.max(axis=1) - chosen).max() < 0.005


def _shares(policy: np.ndarray, masks: np.ndarray) -> np.ndarray:
    logits = np.where(masks, policy, -np.inf)
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)
