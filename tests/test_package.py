"""cyzero from a wheel, not from the checkout: the package data must be in it.

An editable install (``make``, ``pip install -e``) reads the bundled networks, the openings, the
mate positions and the training configs from the checkout, so a file missing from setup.py's
``package_data`` (or MANIFEST.in, for the sdist) goes unnoticed until someone installs the wheel.
Here the checkout's files are copied, a wheel and an sdist are built from the copy (the Cython
modules already built in the checkout are reused, not compiled again), the wheel is installed into
a folder of its own, and the engine and the tools run from there, outside the checkout.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The files that are read at run time from the package, not imported.
PACKAGE_DATA = [
    "engine/nets/default.onnx", "engine/nets/default.onnx.sha256",
    "engine/nets/default.fp16.onnx", "engine/nets/default.fp16.onnx.sha256",
    "engine/nets/default.int8.onnx", "engine/nets/default.int8.onnx.sha256",
    "engine/tools/openings.txt", "engine/tools/mates.epd",
    "trainer/configs/cpu.toml", "trainer/configs/gpu.toml",
    "engine/py.typed", "uci/py.typed", "trainer/py.typed",
]

pytestmark = pytest.mark.timeout(900)    # compiling, should the built modules not be reusable


def _checkout_files() -> list[str]:
    """The checkout's tracked files and its new ones that git does not ignore."""
    if shutil.which("git") is None or not os.path.isdir(os.path.join(REPO, ".git")):
        pytest.skip("needs git and a git checkout, to tell the project's files from build outputs")
    done = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                          capture_output=True, check=True)
    return [name for name in done.stdout.decode().split("\0") if name and os.path.isfile(os.path.join(REPO, name))]


def _copy_with_built_modules(dest: str) -> None:
    for name in _checkout_files():
        os.makedirs(os.path.dirname(os.path.join(dest, name)) or dest, exist_ok=True)
        shutil.copy2(os.path.join(REPO, name), os.path.join(dest, name))
    built = glob.glob(os.path.join(REPO, "engine", "*.so")) + glob.glob(os.path.join(REPO, "engine", "*.pyd"))
    sources = glob.glob(os.path.join(REPO, "cython_src", "*.c"))
    if not built or len(sources) != len(glob.glob(os.path.join(REPO, "cython_src", "*.pyx"))):
        return                                    # nothing to reuse: the wheel build compiles
    for path in sources:                           # Cython's output, newer than its .pyx: not redone
        shutil.copy2(path, os.path.join(dest, "cython_src"))
    # Where setup.py's build_ext puts the modules: there and newer than their C files, they count as
    # built and are packed as they are.
    where = subprocess.run([sys.executable, "-c", "from setuptools.dist import Distribution; "
                            "c = Distribution().get_command_obj('build'); c.finalize_options(); "
                            "print(c.build_platlib)"], cwd=dest, capture_output=True, text=True, check=True)
    lib = os.path.join(dest, where.stdout.strip(), "engine")
    os.makedirs(lib, exist_ok=True)
    later = time.time() + 1
    for path in built:
        target = os.path.join(lib, os.path.basename(path))
        shutil.copy2(path, target)
        os.utime(target, (later, later))


def _build(root) -> tuple[str, str, str]:
    """(wheel path, sdist path, the folder the wheel is installed into)."""
    src, dist, site = str(root / "src"), str(root / "dist"), str(root / "site")
    _copy_with_built_modules(src)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    for command in ([*pip, "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", dist, src],
                    [sys.executable, "setup.py", "-q", "sdist", "-d", dist]):
        done = subprocess.run(command, cwd=src, capture_output=True, text=True, timeout=800)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    wheel, = glob.glob(os.path.join(dist, "*.whl"))
    sdist, = glob.glob(os.path.join(dist, "*.tar.gz"))
    done = subprocess.run([*pip, "install", "--no-deps", "-q", "--target", site, wheel],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return wheel, sdist, site


def test_a_wheel_holds_the_package_data_and_runs_the_engine_from_an_install(tmp_path):
    """One test: building the wheel and the sdist is most of its time."""
    wheel, sdist, site = _build(tmp_path / "build")
    in_wheel = set(zipfile.ZipFile(wheel).namelist())
    assert [name for name in PACKAGE_DATA if name not in in_wheel] == []
    with tarfile.open(sdist) as tar:
        top = tar.getnames()[0].split("/")[0]
        in_sdist = {name[len(top) + 1:] for name in tar.getnames()}
    sources = [os.path.relpath(p, REPO) for p in glob.glob(os.path.join(REPO, "cython_src", "*.pyx"))]
    sources += [os.path.relpath(p, REPO) for p in glob.glob(os.path.join(REPO, "engine", "*.pxd"))]
    assert [name for name in PACKAGE_DATA + sources + ["setup.py", "pyproject.toml"] if name not in in_sdist] == []
    _check_the_install(site, tmp_path)


def _from_the_wheel(site: str, cwd, *argv: str, stdin: str = "") -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "CUDA_VISIBLE_DEVICES")}
    env["PYTHONPATH"] = site          # first on sys.path: before the checkout's editable install
    done = subprocess.run([sys.executable, *argv], input=stdin, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stdout[-2000:] + done.stderr[-3000:]
    return done


def _check_the_install(site: str, tmp_path) -> None:
    where = _from_the_wheel(site, tmp_path, "-c", "import engine, uci, trainer, engine.board; "
                            "print(engine.__file__, uci.__file__, trainer.__file__, engine.board.__file__)")
    assert all(path.startswith(site) for path in where.stdout.split()), (site, where.stdout)
    # The engine, as a GUI starts it: the bundled network in the variant for this machine's CPU
    # runtime (int8, or the fp32 file OpenVINO runs in bf16 on a processor with AMX).
    from engine.weights import bundled_variant_path, default_weights_path, planned_cpu_provider

    variant = os.path.basename(bundled_variant_path(planned_cpu_provider("auto")) or default_weights_path())
    uci = _from_the_wheel(site, tmp_path, "-m", "uci", stdin="uci\nisready\nposition startpos\ngo nodes 5\n")
    lines = uci.stdout.splitlines()
    assert any(line.startswith(f"info string loaded network {variant} ") for line in lines), lines
    assert lines[-1].startswith("bestmove ") and not [line for line in lines if "error" in line], lines
    # Every bundled network, the openings, the mate positions and the training configs.
    files = _from_the_wheel(site, tmp_path, "-c", """if True:
        import os
        from engine.network import Network
        from engine.tools.match import load_openings
        from engine.tools.mates import load_positions
        from engine.weights import default_weights_path
        nets = os.path.dirname(default_weights_path())
        for name in ("default.onnx", "default.fp16.onnx", "default.int8.onnx"):
            with open(os.path.join(nets, name + ".sha256")) as f:
                Network(os.path.join(nets, name), backend="cpu", expected_sha256=f.read()).close()
        print("openings", len(load_openings()))
        print("mates", len(load_positions()))
        from trainer.config import bundled_config_names, load_named_config
        for name in bundled_config_names():
            load_named_config(name)
        print("configs", " ".join(sorted(bundled_config_names())))
        """)
    counts = dict(line.split(" ", 1) for line in files.stdout.splitlines())
    assert int(counts["openings"]) > 0 and int(counts["mates"]) > 0, files.stdout
    assert {"cpu", "gpu"} <= set(counts["configs"].split()), files.stdout
