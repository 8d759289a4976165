"""engine.weights and engine.files: locating a network, verifying it, building a candidate."""

from __future__ import annotations

import os

import numpy as np
import pytest

from engine.network import POLICY_SIZE, NetworkError
from engine.weights import (
    DEFAULT_WEIGHTS,
    NetworkBuilder,
    NoNetworkError,
    WeightsError,
    default_weights_path,
    resolve_weights,
    verify_network,
    weights_path,
)
from weights_helpers import FAST_NET, A, B, FakeNet, Log, sha


def test_files_helpers_are_shared_with_the_trainer(tmp_path):
    from trainer import atomic

    import engine.files as files

    for name in ("SHA256_SUFFIX", "sha256_bytes", "sha256_file", "sha256_path", "read_sha256", "verify_sha256"):
        assert getattr(atomic, name) is getattr(files, name)
    path = tmp_path / "x.bin"
    assert files.file_signature(path) is None
    atomic.atomic_write_with_sha256(path, b"x" * (3 << 20))
    assert files.verify_sha256(path) == files.sha256_file(path) == sha(b"x" * (3 << 20))
    assert files.sha256_file(path, cancelled=lambda: True) is None
    signature = files.file_signature(path)
    assert signature.size == 3 << 20 and signature.inode == os.stat(path).st_ino


def test_atomic_open_leaves_the_old_file_when_the_writer_fails(tmp_path):
    from engine.files import atomic_open

    path = tmp_path / "net.onnx"
    path.write_bytes(b"old")
    with pytest.raises(RuntimeError):
        with atomic_open(path) as f:
            f.write(b"half of the new")
            raise RuntimeError("killed")
    assert path.read_bytes() == b"old" and os.listdir(tmp_path) == ["net.onnx"]
    with atomic_open(path) as f:
        f.write(b"new")
    assert path.read_bytes() == b"new" and os.listdir(tmp_path) == ["net.onnx"]


def test_resolve_weights(tmp_path, monkeypatch):
    bundled_path = default_weights_path()
    assert os.path.isfile(bundled_path) and bundled_path.endswith(os.path.join("nets", "default.onnx"))
    for value in (DEFAULT_WEIGHTS, "", "  <default> ", None):
        assert resolve_weights(value) == weights_path(value) == bundled_path
    net = tmp_path / "n.onnx"
    net.write_bytes(A)
    assert resolve_weights(str(net)) == str(net)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert resolve_weights("~/n.onnx") == str(net)
    monkeypatch.chdir(tmp_path)
    assert resolve_weights("n.onnx") == str(net)
    assert weights_path("missing.onnx") == str(tmp_path / "missing.onnx")  # named, not checked
    with pytest.raises(WeightsError, match="not found: .*missing.onnx"):
        resolve_weights(str(tmp_path / "missing.onnx"))
    with pytest.raises(WeightsError, match="directory"):
        resolve_weights(str(tmp_path))


def test_verify_network():
    verify_network(FakeNet())
    nan = np.zeros((1, POLICY_SIZE), np.float32)
    nan[0, 5] = np.nan
    for bad, message in (
        (FakeNet(policy=nan), "not finite"),
        (FakeNet(wdl=np.array([[np.inf, 0, 0]], np.float32)), "not finite"),
        (FakeNet(wdl=np.array([[0.5, 0.5, 0.5]], np.float32)), "not a probability"),
        (FakeNet(wdl=np.array([[1.5, -0.5, 0.0]], np.float32)), "not a probability"),
        (FakeNet(mlh=np.array([np.nan], np.float32)), "moves-left"),
        (FakeNet(policy=np.zeros((1, 1857), np.float32)), "expected"),
        (FakeNet(error=RuntimeError("boom")), "test evaluation failed: RuntimeError: boom"),
    ):
        with pytest.raises(NetworkError, match=message):
            verify_network(bad)


def test_builder_verifies_and_releases_a_bad_candidate(tmp_path):
    made = []

    def loader(path, **kwargs):
        made.append(FakeNet(wdl=np.array([[0.5, 0.5, 0.5]], np.float32)))
        return made[-1]

    with pytest.raises(NetworkError, match="not a probability"):
        NetworkBuilder(loader).build(str(tmp_path / "x.onnx"))
    assert made[0].closed


def test_builder_holds_a_weights_file_to_its_side_file(tmp_path):
    path = tmp_path / "weights.onnx"
    path.write_bytes(A)
    builder = NetworkBuilder(backend="cpu", threads=1, options=FAST_NET, log=Log())
    (tmp_path / "weights.onnx.sha256").write_text(f"{sha(B)}  weights.onnx\n")
    with pytest.raises(NetworkError, match="sha256 mismatch.*weights.onnx.sha256.*update or delete"):
        builder.load_weights_file(str(path))
    (tmp_path / "weights.onnx.sha256").write_text(f"{sha(A)}  weights.onnx\n")
    candidate = builder.load_weights_file(str(path))
    assert candidate.sha256 == sha(A) and candidate.path == str(path) and candidate.generation is None
    assert candidate.label().startswith("weights.onnx (sha256 ")
    assert candidate.label(long=True) == candidate.network.description


def test_no_network_error_says_why():
    error = NoNetworkError("WeightsFile not found: /x.onnx")
    assert str(error) == "WeightsFile not found: /x.onnx"
    assert isinstance(error, NetworkError) and isinstance(error, ValueError)


def test_the_bundled_network_loads_in_the_variant_for_its_provider(tmp_path, monkeypatch):
    """The CPU plays the bundled int8 variant; a provider without a variant plays
    default.onnx itself, and fp16 (CUDA's) is tried on the CPU by mapping it there. A file
    the user names is loaded as it is, even a copy of the bundled one."""
    import engine.weights as weights
    from engine.network import CPU
    from engine.weights import bundled_variant_path, read_side_digest

    builder = NetworkBuilder(backend="cpu", threads=1, options=FAST_NET, log=Log())
    candidate = builder.load_weights_file(default_weights_path())
    assert candidate.path == bundled_variant_path(CPU) and candidate.path.endswith("default.int8.onnx")
    assert candidate.sha256 == read_side_digest(candidate.path) and "int8" in candidate.label(long=True)
    monkeypatch.setattr(weights, "BUNDLED_VARIANTS", {})
    assert bundled_variant_path(CPU) is None
    assert builder.load_weights_file(default_weights_path()).path == default_weights_path()
    monkeypatch.setattr(weights, "BUNDLED_VARIANTS", {CPU: "default.fp16.onnx"})
    candidate = builder.load_weights_file(default_weights_path())
    assert candidate.path == bundled_variant_path(CPU) and candidate.path.endswith("default.fp16.onnx")
    assert candidate.sha256 == read_side_digest(candidate.path) and "fp16" in candidate.label(long=True)
    copy = tmp_path / "default.onnx"
    copy.write_bytes(open(default_weights_path(), "rb").read())
    assert builder.load_weights_file(str(copy)).path == str(copy)


def test_an_unusable_variant_leaves_the_engine_on_the_bundled_fp32_with_a_line(tmp_path, monkeypatch):
    import engine.weights as weights
    from engine.network import CPU

    nets = tmp_path / "nets"
    nets.mkdir()
    (nets / "default.onnx").write_bytes(open(default_weights_path(), "rb").read())
    (nets / "default.fp16.onnx").write_bytes(b"not a network")
    monkeypatch.setattr(weights, "default_weights_path", lambda: str(nets / "default.onnx"))
    monkeypatch.setattr(weights, "BUNDLED_VARIANTS", {CPU: "default.fp16.onnx"})
    log = Log()
    candidate = NetworkBuilder(backend="cpu", threads=1, options=FAST_NET, log=log).load_weights_file(
        str(nets / "default.onnx"))
    assert candidate.path == str(nets / "default.onnx")
    assert any("default.fp16.onnx unusable, staying on default.onnx" in line for line in log.lines), log.lines
