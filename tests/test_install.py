"""What `make engine` and `make test` install, on a machine with and without an NVIDIA GPU.

The Makefile's recipes run for real against a stand-in Python (a shell script) that writes each
call to a log and answers ``pip show`` as the test says: the test reads the pip commands a user's
machine would run. The package's own metadata is read from setup.py's egg-info.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys
import sysconfig

import pytest
from make_env import REPO, clean_make_env

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")

# The stand-in for the venv's python: logs every call, answers `-m pip show -q NAME` with success
# only for the names in $FAKE_INSTALLED, and `-c CODE URL` (the Makefile asking whether a package
# index answers) with success unless $FAKE_INDEX_DOWN is set.
FAKE_PYTHON = """#!/bin/sh
if [ "$1" = "-c" ]; then
  echo "-c ${3:-}" >> "$FAKE_LOG"
  [ -z "$FAKE_INDEX_DOWN" ]
  exit
fi
echo "$*" >> "$FAKE_LOG"
if [ "$1 $2 $3" = "-m pip show" ]; then
  for name in $FAKE_INSTALLED; do [ "$name" = "$5" ] && exit 0; done
  exit 1
fi
exit 0
"""
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def _make(tmp_path, target: str, *variables: str, installed: str = "", path_extra: str = "",
          index_down: bool = False, stderr: list | None = None) -> list[str]:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True, exist_ok=True)
    python = venv / "bin" / "python"
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    log = tmp_path / "calls.log"
    log.write_text("")
    env = clean_make_env(FAKE_LOG=str(log), FAKE_INSTALLED=installed, FAKE_INDEX_DOWN="1" if index_down else "")
    if path_extra:
        env["PATH"] = path_extra + os.pathsep + env["PATH"]
    stamp = {"engine": ".cyzero-engine", "test": ".cyzero-installed"}[target]
    done = subprocess.run(["make", "-s", "-C", REPO, f"VENV={venv}", *variables, str(venv / stamp)],
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    if stderr is not None:
        stderr.append(done.stderr)
    return [line for line in log.read_text().splitlines() if line.startswith(("-m pip ", "-c "))]


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
    index = "https://example.org/whl/cu130"
    calls = _make(tmp_path, "test", "GPU=0", f"TORCH_INDEX={index}")
    assert f"-c {index}" in calls                                   # asked whether it answers, then used
    torch = [c for c in _installs(calls) if "torch==" in c]
    assert torch == [f"-m pip install torch==2.13.0 --index-url {index}"]
    assert not [c for c in _installs(calls) if "index-url" in c and "torch==" not in c]
    assert "-m pip install --no-build-isolation -e .[train,dev]" in calls


def test_on_linux_without_a_gpu_torch_comes_from_pytorchs_cpu_index_unasked(tmp_path):
    """The README's CPU test command needed TORCH_INDEX=...; plain `make test` takes the CPU build."""
    calls = _make(tmp_path, "test", "GPU=0", "SYSTEM=Linux")
    assert [c for c in _installs(calls) if "torch==" in c] == [f"-m pip install torch==2.13.0 --index-url {CPU_INDEX}"]


def test_an_index_that_does_not_answer_costs_one_line_and_pip_uses_its_own(tmp_path):
    stderr: list[str] = []
    calls = _make(tmp_path, "test", "GPU=0", "SYSTEM=Linux", index_down=True, stderr=stderr)
    assert [c for c in _installs(calls) if "torch==" in c] == ["-m pip install torch==2.13.0"]
    said = [line for line in stderr[0].splitlines() if CPU_INDEX in line]
    assert len(said) == 1 and "did not answer" in said[0] and "own index" in said[0], stderr[0]


def test_the_probe_answers_for_a_local_folder_and_not_for_a_missing_one(tmp_path):
    """The Makefile's own check, run by a real python: a file: index answers when its folder exists."""
    done = subprocess.run(["make", "-s", "-C", REPO, "-n", f"VENV={tmp_path}/v", f"{tmp_path}/v/.cyzero-installed"],
                          env=clean_make_env(), capture_output=True, text=True, timeout=60)
    code = re.search(r"-c '([^']+)'", done.stdout).group(1)
    run = [sys.executable, "-c", code]
    assert subprocess.run([*run, tmp_path.as_uri()], timeout=30).returncode == 0
    assert subprocess.run([*run, (tmp_path / "missing").as_uri()], capture_output=True, timeout=30).returncode != 0


def test_with_a_gpu_or_off_linux_pip_uses_its_own_index(tmp_path):
    for i, variables in enumerate((("GPU=1", "SYSTEM=Linux"), ("GPU=0", "SYSTEM=Darwin"))):
        calls = _make(tmp_path / str(i), "test", *variables)
        assert "-m pip install torch==2.13.0" in calls, calls
        assert not [c for c in calls if "index-url" in c or c.startswith("-c ")], calls


def test_a_make_around_the_suite_does_not_pass_its_variables_down(tmp_path, monkeypatch):
    """`make test TORCH_INDEX=...` failed this file: the nested make took the outer make's variables."""
    outer = "https://outer.example/whl"
    monkeypatch.setenv("MAKEFLAGS", f" -- TORCH_INDEX={outer}")
    monkeypatch.setenv("TORCH_INDEX", outer)
    monkeypatch.setenv("CYZERO_TORCH_INDEX", outer)
    calls = _make(tmp_path, "test", "GPU=0", "SYSTEM=Darwin")
    assert not [c for c in calls if outer in c], calls


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
    plan = subprocess.run(["make", "-n", "-s", "-C", REPO, "SYSTEM_PYTHON=1", "PYTHON=python3", "gpu-check"],
                          env=clean_make_env(), capture_output=True, text=True, timeout=60)
    assert plan.returncode == 0, plan.stderr
    assert "pip" not in plan.stdout and ".venv" not in plan.stdout and "venv" not in plan.stdout
    assert plan.stdout.startswith("python3 -m trainer.gpucheck --preflight")
    assert "bench nn cyzero bench nn" in plan.stdout and "bench train cyzero-train bench train" in plan.stdout


# --------------------------------------------------------------------------- compiling the core once

def _inplace_modules() -> list[str]:
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    modules = [os.path.join(REPO, "engine", os.path.basename(pyx)[:-4] + suffix)
               for pyx in sorted(glob.glob(os.path.join(REPO, "cython_src", "*.pyx")))]
    if not all(os.path.exists(m) for m in modules):
        pytest.skip("the core is not built in place (make builds it)")
    return modules


def test_a_build_that_finds_the_core_compiled_in_place_compiles_nothing(tmp_path):
    """After `make` built the core in place, pip's editable install compiled it again (52 s), and the
    install of `make test` once more: a build into another folder copies the current modules."""
    modules = _inplace_modules()
    lib = tmp_path / "lib"
    # CC and LDSHARED that fail: any compile or link would fail the build
    done = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "-b", str(lib), "-t", str(tmp_path / "t"),
                           "-j", "2"], cwd=REPO, env=dict(os.environ, CC="false", LDSHARED="false"),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "compiling" not in done.stderr, done.stderr
    for module in modules:
        with open(module, "rb") as a, open(lib / "engine" / os.path.basename(module), "rb") as b:
            assert a.read() == b.read()


def test_a_build_that_compiles_says_so_in_one_line_first(tmp_path):
    """The first build compiled for a minute in silence (or in pages of compiler lines)."""
    _inplace_modules()
    c_file = os.path.join(REPO, "cython_src", "board.c")
    if not os.path.exists(c_file):
        pytest.skip("no generated board.c (make builds it)")
    # One module's sources in a tree of their own, its C file current: the build goes straight to a
    # compiler that fails at once.
    for name in ("setup.py", "README.md", "engine/__init__.py", "engine/board.pxd", "cython_src/board.pyx",
                 "cython_src/board.c"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(os.path.join(REPO, name), tmp_path / name)
    done = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace", "-j", "2"], cwd=tmp_path,
                          env=dict(os.environ, CC="false", LDSHARED="false"), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode != 0                   # the compiler stand-in failed: it did try to compile
    said = [line for line in done.stderr.splitlines() if "compiling" in line]
    assert len(said) == 1 and re.fullmatch(r"cyzero: compiling the Cython core \(board\): about \d+ s on 1 core.*",
                                           said[0]), done.stderr
