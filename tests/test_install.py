"""What `make engine` and `make test` install, on a machine with and without an NVIDIA GPU.

The Makefile's recipes run for real against a stand-in Python (a shell script) that writes each
call to a log and answers ``pip show`` as the test says: the test reads the pip commands a user's
machine would run. The package's own metadata is read from setup.py's egg-info.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")

# The stand-in for the venv's python: logs every call, and answers `-m pip show -q NAME` with
# success only for the names in $FAKE_INSTALLED.
FAKE_PYTHON = """#!/bin/sh
echo "$*" >> "$FAKE_LOG"
if [ "$1 $2 $3" = "-m pip show" ]; then
  for name in $FAKE_INSTALLED; do [ "$name" = "$5" ] && exit 0; done
  exit 1
fi
exit 0
"""


def _make(tmp_path, target: str, *variables: str, installed: str = "", path_extra: str = "") -> list[str]:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True, exist_ok=True)
    python = venv / "bin" / "python"
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    log = tmp_path / "calls.log"
    log.write_text("")
    env = dict(os.environ, FAKE_LOG=str(log), FAKE_INSTALLED=installed)
    if path_extra:
        env["PATH"] = path_extra + os.pathsep + env["PATH"]
    stamp = {"engine": ".cyzero-engine", "test": ".cyzero-installed"}[target]
    done = subprocess.run(["make", "-s", "-C", REPO, f"VENV={venv}", *variables, str(venv / stamp)],
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return [line for line in log.read_text().splitlines() if line.startswith("-m pip ")]


def _installs(calls: list[str]) -> list[str]:
    return [c for c in calls if c.startswith("-m pip install")]


def test_without_a_gpu_make_engine_installs_the_cpu_runtime_only(tmp_path):
    calls = _make(tmp_path, "engine", "GPU=0")
    assert "-m pip install --no-build-isolation -e ." in calls
    assert not [c for c in _installs(calls) if "gpu" in c]


def test_with_gpu_1_make_engine_installs_onnxruntime_gpu_and_drops_the_cpu_build(tmp_path):
    # pip put both in (the project needs onnxruntime): the CPU build goes, the GPU one is rewritten
    calls = _make(tmp_path, "engine", "GPU=1", installed="onnxruntime onnxruntime-gpu")
    assert "-m pip install --no-build-isolation -e .[gpu]" in calls
    assert "-m pip uninstall -y onnxruntime" in calls
    assert calls[-1] == "-m pip install --force-reinstall --no-deps onnxruntime-gpu"


def test_a_venv_switched_back_to_the_cpu_keeps_one_onnxruntime(tmp_path):
    calls = _make(tmp_path, "engine", "GPU=0", installed="onnxruntime onnxruntime-gpu")
    assert "-m pip uninstall -y onnxruntime-gpu" in calls
    assert calls[-1] == "-m pip install --force-reinstall --no-deps onnxruntime"


def test_the_gpu_default_follows_nvidia_smi(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H200'\n")
    smi.chmod(0o755)
    calls = _make(tmp_path, "engine", path_extra=str(bin_dir))
    assert "-m pip install --no-build-isolation -e .[gpu]" in calls


def test_torch_index_takes_torch_alone_from_that_index(tmp_path):
    index = "https://download.pytorch.org/whl/cpu"
    calls = _installs(_make(tmp_path, "test", "GPU=0", f"TORCH_INDEX={index}"))
    torch = [c for c in calls if "torch==" in c]
    assert torch == [f"-m pip install torch==2.13.0 --index-url {index}"]
    assert not [c for c in calls if "index-url" in c and "torch==" not in c]
    assert "-m pip install --no-build-isolation -e .[train,dev]" in calls


def test_without_torch_index_pip_uses_its_own_index(tmp_path):
    calls = _installs(_make(tmp_path, "test", "GPU=0"))
    assert "-m pip install torch==2.13.0" in calls
    assert not [c for c in calls if "index-url" in c]


def test_the_package_metadata_names_the_cpu_runtime_a_gpu_extra_and_the_licence(tmp_path):
    out = tmp_path / "egg"
    out.mkdir()
    done = subprocess.run([sys.executable, "setup.py", "-q", "egg_info", "-e", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    info = next(out.glob("*.egg-info"))
    pkg_info = (info / "PKG-INFO").read_text(encoding="utf-8")
    requires = [line.split(":", 1)[1].strip() for line in pkg_info.splitlines() if line.startswith("Requires-Dist:")]
    assert "onnxruntime" in requires
    gpu = [r for r in requires if r.startswith("onnxruntime-gpu")]
    assert gpu and all('extra == "gpu"' in r for r in gpu)
    assert "GPL-3.0-or-later" in pkg_info
    with open(os.path.join(REPO, "LICENSE"), encoding="utf-8") as f:
        assert "GNU GENERAL PUBLIC LICENSE" in f.read(200)


def test_gpu_check_on_a_machine_set_up_by_hand_uses_no_venv_and_no_pip():
    """SYSTEM_PYTHON=1: a GPU machine without internet, set up by hand (docs/gpu.md), runs the
    check with its own python and the cyzero commands on PATH; the venv's installs would fail."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "VENV")}
    plan = subprocess.run(["make", "-n", "-s", "-C", REPO, "SYSTEM_PYTHON=1", "PYTHON=python3", "gpu-check"],
                          env=env, capture_output=True, text=True, timeout=60)
    assert plan.returncode == 0, plan.stderr
    assert "pip" not in plan.stdout and ".venv" not in plan.stdout and "venv" not in plan.stdout
    assert plan.stdout.startswith("python3 -m trainer.gpucheck --preflight")
    assert "bench nn cyzero bench nn" in plan.stdout and "bench train cyzero-train bench train" in plan.stdout
