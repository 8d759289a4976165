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
import sys
import warnings

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

# pip's editable install warns that a folder named like a package may take precedence on import;
# here those folders are the packages themselves (its finder maps engine/, uci/ and trainer/ to
# them), so the note does not apply and the project's own install prints no warning.
warnings.filterwarnings("ignore", message=r"(?s).*folders in your working directory with the same\s+name")

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


# Cython's settings for every module; applied when a build cythonizes (BuildExt.run).
CYTHON_DIRECTIVES = {
    "language_level": 3,
    "boundscheck": False,
    "wraparound": False,
    "cdivision": True,
    "initializedcheck": False,
    "embedsignature": True,
}
# About this many seconds of one core to cythonize and compile one module with -O3 (15 s for
# encoding on an AMD EPYC); the one line a build prints scales it by the modules and jobs.
COMPILE_S_PER_MODULE = 15


def extensions():
    """One Extension per .pyx; BuildExt cythonizes them when a build runs (never for metadata)."""
    sources = sorted(glob.glob(os.path.join(CYTHON_SRC, "*.pyx")))
    compile_args = ["-O3"]
    if env_flag("CYZERO_NATIVE"):
        compile_args.append("-march=native")
    return [
        Extension(
            f"{PACKAGE}.{os.path.splitext(os.path.basename(src))[0]}",
            [src],
            define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
            extra_compile_args=compile_args,
        )
        for src in sources
    ]


def inplace_module_is_current(pyx, module):
    """Whether the compiled module in the source tree is newer than its .pyx, its C file and every
    .pxd (the rule drop_stale_c_files keeps for the C files)."""
    if not os.path.exists(module):
        return False
    inputs = [pyx, os.path.splitext(pyx)[0] + ".c", *glob.glob(os.path.join(PACKAGE, "*.pxd"))]
    return all(os.path.getmtime(p) <= os.path.getmtime(module) for p in inputs if os.path.exists(p))


class BuildExt(build_ext):
    """Compiles the core once: a build that finds a module current in the source tree (`make`
    builds in place) copies it instead of compiling it again, as pip's editable install would,
    and a build that does compile says so in one line first."""

    def _current(self, name):
        """The module's compiled file in the source tree, if it is current (else None)."""
        module = os.path.join(ROOT, self.get_ext_filename(name))
        return module if not self.force and inplace_module_is_current(self._pyx[name], module) else None

    def run(self):
        self._pyx = {ext.name: ext.sources[0] for ext in self.extensions}
        stale = [name for name in self._pyx if not self._current(name)]
        if stale:
            jobs = max(1, min(len(stale), int(self.parallel or 1)))
            seconds = COMPILE_S_PER_MODULE * -(-len(stale) // jobs)
            print(f"cyzero: compiling the Cython core ({', '.join(n.split('.')[-1] for n in stale)}): "
                  f"about {seconds} s on {jobs} core{'s' if jobs > 1 else ''}, more on a busy machine",
                  file=sys.stderr, flush=True)
            import numpy
            from Cython.Build import cythonize

            drop_stale_c_files(list(self._pyx.values()))
            for ext in self.extensions:
                ext.include_dirs = [*ext.include_dirs, numpy.get_include()]
            cythonized = cythonize(self.extensions, include_path=["."], quiet=True,
                                   annotate=env_flag("CYZERO_ANNOTATE"), compiler_directives=CYTHON_DIRECTIVES)
            for ext, done in zip(self.extensions, cythonized):
                ext.sources = done.sources  # the same objects: setuptools keeps its state on them
        super().run()

    def build_extension(self, ext):
        module, target = self._current(ext.name), self.get_ext_fullpath(ext.name)
        if module and os.path.abspath(target) != module:
            self.mkpath(os.path.dirname(target))
            self.copy_file(module, target)
            return
        super().build_extension(ext)


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
    cmdclass={"build_ext": BuildExt},
    install_requires=[
        "numpy",
        "chess",
        "pyzmq",
        "msgpack",
        # engine.lc0_onnx builds an lc0 weights file's graph with it (imported only for such a file).
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
        # psutil names the process that holds a port the daemon cannot bind (trainer.endpoints.port_in_use).
        "train": ["torch", "onnxscript", "tqdm", "matplotlib", "tensorboard", "psutil"],
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
