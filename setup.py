"""Build and packaging for cyzero.

Every ``cython_src/<stem>.pyx`` becomes the extension module ``engine.<stem>``
(``cython_src/board.pyx`` -> ``engine.board``).

Where the ``.pxd`` files go
---------------------------
Cython looks up the declarations of a module by its fully qualified name: for
``engine.board`` it wants ``engine/board.pxd`` on the include path (a flat
``cython_src/board.pxd`` would be silently ignored). So each module's C-level
API lives in ``engine/<stem>.pxd``, is installed with the package, and sibling
modules cimport it by package name::

    from engine.board cimport Board, Pos, gen_legal

Cython's rebuild check only connects a ``.pxd`` that sits beside its ``.pyx``,
so this script drops every generated ``cython_src/*.c`` older than any
``engine/*.pxd``: change a ``.pxd`` and every module is regenerated, which keeps
the modules' shared C structs in step.

Environment switches
--------------------
``CYZERO_NATIVE=1``    add ``-march=native`` (off by default so wheels stay portable)
``CYZERO_ANNOTATE=1``  write Cython's HTML annotation next to each ``.pyx``

Both only take effect for modules that get rebuilt: ``make clean`` (or
``build_ext --force``) after switching them.
"""

import glob
import os
import re

from setuptools import Extension, setup

ROOT = os.path.dirname(os.path.abspath(__file__))
os.chdir(ROOT)  # setuptools and Cython work with paths relative to the project root

CYTHON_SRC = "cython_src"
PACKAGE = "engine"


def read_version():
    with open(os.path.join(PACKAGE, "__init__.py"), encoding="utf-8") as f:
        match = re.search(r'^__version__\s*=\s*["\']([^"\']+)["\']', f.read(), re.M)
    if not match:
        raise RuntimeError("no __version__ in engine/__init__.py")
    return match.group(1)


def env_flag(name):
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def drop_stale_c_files(sources):
    """Regenerate every module whose C file is older than a .pxd in engine/ (see above)."""
    pxds = glob.glob(os.path.join(PACKAGE, "*.pxd"))
    if not pxds:
        return
    newest = max(os.path.getmtime(p) for p in pxds)
    for src in sources:
        c_file = os.path.splitext(src)[0] + ".c"
        if os.path.exists(c_file) and os.path.getmtime(c_file) < newest:
            os.remove(c_file)


def extensions():
    sources = sorted(glob.glob(os.path.join(CYTHON_SRC, "*.pyx")))
    if not sources:
        return []

    import numpy
    from Cython.Build import cythonize

    drop_stale_c_files(sources)
    compile_args = ["-O3"]
    if env_flag("CYZERO_NATIVE"):
        compile_args.append("-march=native")
    modules = [
        Extension(
            f"{PACKAGE}.{os.path.splitext(os.path.basename(src))[0]}",
            [src],
            include_dirs=[numpy.get_include()],
            define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
            extra_compile_args=compile_args,
        )
        for src in sources
    ]
    return cythonize(
        modules,
        include_path=["."],
        annotate=env_flag("CYZERO_ANNOTATE"),
        compiler_directives={
            "language_level": 3,
            "boundscheck": False,
            "wraparound": False,
            "cdivision": True,
            "initializedcheck": False,
            "embedsignature": True,
        },
    )


# Where onnxruntime-gpu publishes wheels (CUDA on Linux x86-64 and Windows).
ORT_GPU = ('(platform_system == "Linux" and platform_machine == "x86_64")'
           ' or (platform_system == "Windows" and platform_machine == "AMD64")')
X86_64 = 'platform_machine == "x86_64" or platform_machine == "AMD64"'

setup(
    name="cyzero",
    version=read_version(),
    description="AlphaZero-style chess engine and training system with a Cython core",
    long_description=open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    if os.path.exists(os.path.join(ROOT, "README.md"))
    else "",
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    license="GPL-3.0-or-later",
    license_files=["LICENSE"],
    classifiers=[
        "Programming Language :: Python :: 3",
        "Programming Language :: Cython",
        "Operating System :: POSIX :: Linux",
        "Topic :: Games/Entertainment :: Board Games",
        "Intended Audience :: End Users/Desktop",
    ],
    packages=["engine", "engine.nets", "engine.tools", "uci", "trainer"],
    package_data={"engine": ["*.pxd", "*.pyi", "py.typed"], "engine.tools": ["openings.txt", "mates.epd"], "uci": ["py.typed"], "trainer": ["py.typed", "configs/*.toml"], "engine.nets": ["*.onnx", "*.onnx.sha256", "*.json", "*.md"]},
    ext_modules=extensions(),
    install_requires=[
        "numpy",
        "chess",
        "pyzmq",
        "msgpack",
        # engine.lc0 builds an lc0 weights file's graph with it (imported only for such a file).
        "onnx",
        # ONNX Runtime's CPU build; the `gpu` extra brings onnxruntime-gpu, which is the same
        # import package: keep one (make engine GPU=1 removes this one; docs/troubleshooting.md).
        "onnxruntime",
        # The CPU runtime where it was measured faster than ONNX Runtime's own CPU path
        # (x86-64: AMX, AVX-512 VNNI; docs/cpu.md); without it the engine runs on ONNX Runtime.
        f"openvino>=2025.1; {X86_64}",
    ],
    extras_require={
        # CUDA and TensorRT (docs/gpu.md): `make engine GPU=1`, or pip install '.[gpu]' and then
        # pip uninstall onnxruntime, as onnxruntime's own install notes say.
        "gpu": [f"onnxruntime-gpu; {ORT_GPU}"],
        # torch itself: install the pin you want first (see the Makefile's TORCH);
        # onnxscript is imported by torch.onnx.export's default (dynamo) exporter.
        "train": ["torch", "onnxscript", "tqdm", "matplotlib", "tensorboard"],
        # mypy >= 1.18 understands @disjoint_base, which the engine/*.pyi stubs use (tests/test_stubs.py).
        "dev": ["pytest", "pytest-timeout", "pytest-xdist", "mypy>=1.18"],
    },
    entry_points={
        "console_scripts": [
            "cyzero = uci.cli:main",
            "cyzero-train = trainer.cli:main",
        ],
    },
    zip_safe=False,
)
