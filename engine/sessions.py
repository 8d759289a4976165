"""Provider choice and session making: how a network file becomes ONNX Runtime sessions.

:class:`engine.network.Network` asks a *session factory* for its sessions and
never talks to ONNX Runtime's constructors itself, so that a stand-in factory
(``engine.tools.gpu_standin``, a simulated GPU) can take the real one's place
under the real ``Network``. A factory has::

    factory.make(data, provider, batch=None, batch_dim=None) -> session
    factory.listed() -> providers listed; factory.prepare_gpu(); factory.why_failed(provider, error) -> str
    factory.openvino_missing() -> None, or why OpenVINO cannot be used here
    factory.make_many(data, provider, sizes, batch_dim=None) -> sessions (optional: make_sizes)

``provider`` is the one wanted (TensorRT, CUDA, OpenVINO or CPU); ``batch`` asks for a
session that will only ever see that batch size (on TensorRT its optimisation
profile is that one size, with an engine cache keyed by network and size), and
``batch_dim`` names the input's free batch dimension to fix to it. A session
has ``providers``, ``inputs``, ``outputs`` (ONNX Runtime ``NodeArg``-like:
name, type, shape), ``metadata``, ``producer`` and
``run_into(planes, targets)``, which binds the input and each output buffer by
pointer and runs.

:func:`open_session` tries the backends in order (TensorRT, then CUDA, then
the CPU: OpenVINO, then ONNX Runtime's own CPU path) and decides the provider by
what the created session really runs: onnxruntime-gpu lists the GPU providers
whether or not CUDA is installed, and a CUDA session that cannot load its
libraries quietly runs on the CPU. A runtime that was wanted and not had is said
in exactly one line through ``log``; ``Backend=auto`` always says in that line
what it took.

OpenVINO on the CPU
-------------------
ONNX Runtime's CPU path runs the bundled int8 file at a fraction of what a
processor with VNNI or AMX can do; OpenVINO's CPU plugin (oneDNN underneath) runs
it faster, and runs bfloat16 in hardware where the processor has it
(``docs/cpu.md`` has the measurements). An OpenVINO session runs one fixed batch
size (like a GPU session: a dynamic batch ran the int8 file at half the speed),
its float parts in float32 for an int8 file and in bfloat16 for a float file
where the processor has native bfloat16 (:func:`openvino_precision`). Compiled
networks are cached on disk (``$CYZERO_OPENVINO_CACHE`` or
``~/.cache/cyzero/openvino``): the first load of a file compiles for about a
second, later ones read the cache.
"""

from __future__ import annotations

import contextlib
import ctypes
import glob
import locale
import os
import re
import shutil
import sys
import threading
from typing import Callable, Optional

import numpy as np

BACKENDS = ("auto", "cpu", "openvino", "cuda", "tensorrt")

CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"
TENSORRT = "TensorrtExecutionProvider"
OPENVINO = "OpenVINO"  # OpenVINO's CPU plugin: not an ONNX Runtime provider, run by OpenVinoSession
LABEL = {CPU: "CPU", CUDA: "CUDA", TENSORRT: "TensorRT", OPENVINO: "OpenVINO"}
GPU_PROVIDERS = (CUDA, TENSORRT)
_LIBRARY_STEM = {CUDA: "cuda", TENSORRT: "tensorrt"}

# ONNX Runtime logging severities: 0 verbose, 1 info, 2 warning, 3 error, 4 fatal.
_QUIET = (
    3  # our standing level: no warnings (e.g. "some nodes were not assigned to the preferred EP")
)
_SILENT = 4  # while trying a GPU provider: its load failure is an ERROR line we replace by our own

_silence_lock = threading.Lock()
_ort_module = None
_dlls_preloaded = False


class NetworkError(ValueError):
    """A network file cannot be used: missing, not ONNX, truncated, or not the cyzero/lc0 contract."""


# --------------------------------------------------------------------------- onnxruntime, lazily


def _ort():
    """Import onnxruntime on first use and quiet its default logger (process-wide, severity ERROR)."""
    global _ort_module
    if _ort_module is None:
        try:
            import onnxruntime
        except ImportError as e:  # pragma: no cover - onnxruntime is a hard dependency
            raise NetworkError(
                f"onnxruntime is not installed ({e}); pip install onnxruntime-gpu (or onnxruntime)"
            ) from None
        onnxruntime.set_default_logger_severity(_QUIET)
        _ort_module = onnxruntime
    return _ort_module


def available_providers() -> list[str]:
    """The execution providers this onnxruntime build lists (listed is not the same as usable)."""
    return list(_ort().get_available_providers())


def _preload_gpu_libraries() -> None:
    """Load CUDA/cuDNN from pip's ``nvidia-*`` wheels, if installed, before a GPU session.

    ``onnxruntime-gpu[cuda,cudnn]`` installs them, but the provider libraries
    find them only once ``onnxruntime.preload_dlls()`` has loaded them.  That
    function prints to stdout (the UCI channel) when something is missing, so
    its ``print`` is shadowed inside the onnxruntime module meanwhile (not
    ``sys.stdout``, which another thread may be writing UCI output to).  What
    is really missing is reported by the session attempt that follows.
    """
    global _dlls_preloaded
    if _dlls_preloaded:
        return
    _dlls_preloaded = True
    ort = _ort()
    if not hasattr(ort, "preload_dlls"):
        return
    import importlib.util
    import warnings

    try:
        if importlib.util.find_spec("nvidia") is None:
            return
    except (ImportError, ValueError):
        return
    namespace = vars(ort)
    had_print = "print" in namespace
    saved = namespace.get("print")
    namespace["print"] = lambda *args, **kwargs: None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ort.preload_dlls()
    except Exception:  # noqa: BLE001 - best effort; the session attempt reports what is missing
        pass
    finally:
        if had_print:
            namespace["print"] = saved
        else:
            namespace.pop("print", None)


@contextlib.contextmanager
def _silenced_ort_logger():
    """Silence ONNX Runtime's process-wide logger while trying a provider that may not load.

    The logger's level is global, so two networks loading at once in
    different threads take turns here (loading only; evaluation never does).
    """
    ort = _ort()
    with _silence_lock:
        ort.set_default_logger_severity(_SILENT)
        try:
            yield
        finally:
            ort.set_default_logger_severity(_QUIET)


def _provider_library(provider: str) -> str | None:
    stem = _LIBRARY_STEM.get(provider)
    if stem is None:
        return None
    capi = os.path.join(os.path.dirname(_ort().__file__), "capi")
    found = sorted(glob.glob(os.path.join(capi, f"*onnxruntime_providers_{stem}.*")))
    return found[0] if found else None


def _why_provider_failed(provider: str, error: BaseException | None) -> str:
    """A short reason why a GPU provider could not be used, for the one fallback line."""
    library = _provider_library(provider)
    if library is None:
        return CPU_BUILD if CUDA not in available_providers() else "not built into this onnxruntime"
    try:
        # The same dlopen ONNX Runtime did; its error names the first missing library.
        ctypes.CDLL(library)
    except OSError as e:
        text = str(e)
        match = re.search(
            r"([\w.+-]+\.(?:so[\w.]*|dll|dylib)): cannot open shared object file", text
        )
        if match:
            missing = match.group(1)
            hint = " (no NVIDIA driver?)" if missing.startswith("libcuda.so") else ""
            return f"{missing} not found{hint}"
        return _short(text)
    if error is not None:
        return short_ort_message(error)
    return "no usable GPU found"


# --------------------------------------------------------------------------- error messages


def _short(text: str, limit: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _strip_source_location(text: str) -> str:
    """Drop ``/onnxruntime_src/x.cc:123 ns::Function(args...)`` prefixes from an ORT message."""
    while True:
        match = re.search(r"/onnxruntime_src/\S+:\d+\s*", text)
        if not match:
            return text
        rest = text[match.end() :]
        cut = 0
        paren = rest.find("(")
        if paren != -1 and "::" in rest[:paren]:  # a C++ signature: skip to its matching ')'
            depth = 0
            for i in range(paren, len(rest)):
                if rest[i] == "(":
                    depth += 1
                elif rest[i] == ")":
                    depth -= 1
                    if depth == 0:
                        cut = i + 1
                        break
        text = text[: match.start()] + rest[cut:].lstrip()


def short_ort_message(error: BaseException) -> str:
    text = str(error)
    text = re.sub(r"\[ONNXRuntimeError\]\s*:\s*\d+\s*:\s*\w+\s*:\s*", "", text)
    text = re.sub(r"^Load model from .*? failed:\s*", "", text)
    text = _strip_source_location(text)
    return _short(text) or type(error).__name__


def _explain_load_error(error: BaseException) -> str:
    """ONNX Runtime's load exception as one short sentence about the file."""
    text = short_ort_message(error)
    low = text.lower()
    ir = re.search(r"ir version:?\s*(\d+).*?max supported ir version:?\s*(\d+)", low)
    if ir:
        return (
            f"the model's ONNX IR version {ir.group(1)} is newer than this onnxruntime "
            f"supports ({ir.group(2)}); export with an older IR version or upgrade onnxruntime"
        )
    if "protobuf parsing failed" in low:
        return "not an ONNX model, or a truncated or corrupt one (protobuf parsing failed)"
    if "no graph was found" in low:
        return "not an ONNX model (no graph in the file; is it empty?)"
    return f"ONNX Runtime cannot load it: {text}"



# --------------------------------------------------------------------------- sessions


class OrtSession:
    """One ONNX Runtime ``InferenceSession`` behind the small interface ``Network`` uses."""

    def __init__(self, session) -> None:
        self._session = session
        self.providers: list[str] = list(session.get_providers())
        self.inputs = session.get_inputs()
        self.outputs = session.get_outputs()
        meta = session.get_modelmeta()
        self.metadata: dict[str, str] = dict(meta.custom_metadata_map or {})
        self.producer: str = meta.producer_name or ""
        self._input = self.inputs[0].name

    def run_into(self, planes: np.ndarray, targets: list[tuple[str, np.ndarray]]) -> None:
        """Run ``planes`` (C-contiguous, the input's dtype) with each output written into its
        buffer (C-contiguous, the output's dtype and shape). A fresh ``IOBinding`` per call, so
        that concurrent calls share no Python state; ``Run`` releases the GIL. The buffers are
        host memory: on a GPU provider ONNX Runtime copies them to and from the device itself."""
        binding = self._session.io_binding()
        binding.bind_input(self._input, "cpu", 0, planes.dtype, planes.shape, planes.ctypes.data)
        for name, buffer in targets:
            binding.bind_output(name, "cpu", 0, buffer.dtype, buffer.shape, buffer.ctypes.data)
        self._session.run_with_iobinding(binding)


class SessionFactory:
    """Makes ONNX Runtime and OpenVINO sessions with cyzero's settings.

    ``cuda_options`` are added to the CUDA provider's options. Its default
    ``cudnn_conv_algo_search`` is ``HEURISTIC``: the default (``EXHAUSTIVE``)
    benchmarks cuDNN's algorithms at every new shape, which took up to 1.4 s a
    shape on an H100 and 3-5x longer overall whenever shapes changed.
    ``arena_extend_strategy`` ``kSameAsRequested`` keeps each session's arena
    at what it uses rather than the next power of two.
    """

    def __init__(self, *, device_id: int = 0, intra_threads: int = 0, inter_threads: int = 1,
                 allow_spinning: bool = True, folder: str = ".", trt_fp16: bool = True,
                 trt_cache_dir: Optional[str] = None, cache_key: str = "",
                 cuda_options: Optional[dict] = None, precision: Optional[str] = None) -> None:
        self.device_id = int(device_id)
        self.intra_threads = intra_threads
        self.inter_threads = inter_threads
        self.allow_spinning = allow_spinning
        self.folder = folder
        self.trt_fp16 = trt_fp16
        self.trt_cache_dir = trt_cache_dir
        self.cache_key = cache_key
        self.precision = precision  # OpenVINO's arithmetic (None: openvino_precision's choice)
        self.cuda_options = {"cudnn_conv_algo_search": "HEURISTIC",
                             "arena_extend_strategy": "kSameAsRequested", **(cuda_options or {})}

    @staticmethod
    def listed() -> list[str]:
        return available_providers()

    @staticmethod
    def prepare_gpu() -> None:
        _preload_gpu_libraries()

    @staticmethod
    def why_failed(provider: str, error: BaseException | None) -> str:
        return _why_provider_failed(provider, error)

    @staticmethod
    def openvino_missing() -> Optional[str]:
        return openvino_missing()

    def make(self, data: bytes, provider: str, batch: Optional[int] = None,
             batch_dim: Optional[str] = None):
        if provider == OPENVINO:
            with _locale_kept():
                return _OpenVinoSource(data, self.precision).compile(batch or 1, self.intra_threads)
        ort = _ort()
        options = self._session_options()
        if batch is not None and batch_dim:
            options.add_free_dimension_override_by_name(batch_dim, int(batch))
        cuda = (CUDA, {"device_id": self.device_id, **self.cuda_options})
        if provider == TENSORRT:
            providers = [(TENSORRT, self._trt_options(batch)), cuda, CPU]
        elif provider == CUDA:
            providers = [cuda, CPU]
        else:
            providers = [CPU]
        # Only those this build has: ONNX Runtime warns on stderr about any other (the CPU build
        # about CUDA); the session then shows that it did not get the one asked for.
        listed = set(ort.get_available_providers())
        providers = [p for p in providers if (p[0] if isinstance(p, tuple) else p) in listed]
        # enable_fallback=0: ONNX Runtime's own fallback prints a banner to stdout (the UCI channel).
        return OrtSession(ort.InferenceSession(data, options, providers=providers, enable_fallback=0))

    def make_many(self, data: bytes, provider: str, sizes, batch_dim: Optional[str] = None) -> list:
        """:func:`make_sizes`: OpenVINO reads the file once and compiles the sizes side by side
        (each takes a core for up to a second); a GPU's sessions are made one by one."""
        if provider != OPENVINO:
            return _each_size(sizes, lambda n: self.make(data, provider, n, batch_dim))
        from concurrent.futures import ThreadPoolExecutor

        with _locale_kept(), ThreadPoolExecutor(max(1, min(len(sizes), os.cpu_count() or 1))) as pool:
            source = _OpenVinoSource(data, self.precision)
            return list(pool.map(lambda n: _each_size([n], lambda m: source.compile(m, self.intra_threads))[0],
                                 sizes))

    def _session_options(self):
        ort = _ort()
        so = ort.SessionOptions()
        so.log_severity_level = _QUIET
        so.logid = "cyzero.network"
        so.intra_op_num_threads = self.intra_threads
        so.inter_op_num_threads = self.inter_threads
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.add_session_config_entry(
            "session.intra_op.allow_spinning", "1" if self.allow_spinning else "0"
        )
        # The model is loaded from the bytes that were hashed; external weights (a model
        # over 2 GB, or one saved with save_as_external_data) are found beside the file.
        so.add_session_config_entry("session.model_external_initializers_file_folder_path", self.folder)
        return so

    def _trt_options(self, batch: Optional[int]) -> dict:
        """One optimisation profile of exactly ``batch`` (the session only ever sees it), with
        the built engines cached by network and size: building one takes minutes."""
        from engine.encoding import PLANES

        shape = f"{PLANES}x8x8"
        size = int(batch or 1)
        options = {
            "device_id": self.device_id,
            "trt_fp16_enable": self.trt_fp16,
            "trt_profile_min_shapes": f"/input/planes:{size}x{shape}",
            "trt_profile_opt_shapes": f"/input/planes:{size}x{shape}",
            "trt_profile_max_shapes": f"/input/planes:{size}x{shape}",
        }
        base = os.fspath(
            self.trt_cache_dir
            or os.environ.get("CYZERO_TRT_CACHE")
            or os.path.join(
                os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
                "cyzero",
                "tensorrt",
            )
        )
        cache = os.path.join(base, self.cache_key or "any", f"batch-{size}")
        try:
            # TensorRT creates the last level itself, only when it really starts, so a machine
            # without TensorRT gets at most the (empty) parent folders.
            os.makedirs(os.path.dirname(os.path.abspath(cache)), exist_ok=True)
        except OSError:
            return options  # no cache: TensorRT rebuilds its engine each time
        options.update(
            trt_engine_cache_enable=True,
            trt_engine_cache_path=cache,
            trt_timing_cache_enable=True,
            trt_timing_cache_path=cache,
        )
        return options


# --------------------------------------------------------------------------- OpenVINO


_openvino_core = None
_openvino_lock = threading.Lock()


def openvino_missing() -> Optional[str]:
    """None when OpenVINO can be used here, else why not (for the one fallback line)."""
    try:
        _openvino()
    except ImportError as e:
        return f"not installed: pip install openvino ({_short(str(e), 80)})"
    except Exception as e:  # noqa: BLE001 - a broken install: say what it said
        return _short(f"{type(e).__name__}: {e}")
    return None


def import_openvino():
    """``import openvino`` without its telemetry. On import, OpenVINO's Python package sends a usage
    event to Google Analytics from a forked child process (openvino_telemetry): an engine must not
    phone home, and that child, forked from a thread while the search runs, outlived ``quit``
    (the os._exit in uci/__main__.py skips multiprocessing's clean-up). Without the
    openvino_telemetry module OpenVINO uses its own no-op stub."""
    if "openvino" not in sys.modules:
        sys.modules.setdefault("openvino_telemetry", None)   # import openvino_telemetry: ImportError
    import openvino

    return openvino


def _openvino():
    """OpenVINO's ``Core``, made once, its compiled networks cached on disk when a folder can be had."""
    global _openvino_core
    with _openvino_lock:
        if _openvino_core is None:
            openvino = import_openvino()
            core = openvino.Core()
            cache = os.environ.get("CYZERO_OPENVINO_CACHE") or os.path.join(
                os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
                "cyzero", "openvino")
            try:
                os.makedirs(cache, exist_ok=True)
                _prune_cache(cache, OPENVINO_CACHE_BYTES)
                core.set_property({"CACHE_DIR": cache})
            except (OSError, RuntimeError):
                pass  # no cache: every load compiles
            _openvino_core = core
        return _openvino_core


#: The most OpenVINO's cache keeps (about 3 MB a batch size of a 10x64): a training run's
#: workers load a new network every generation, and each would stay cached for good.
OPENVINO_CACHE_BYTES = 256 << 20


def _prune_cache(folder: str, limit: int) -> None:
    """Delete the least recently written files of ``folder`` until it holds at most ``limit`` bytes."""
    entries = []
    for entry in os.scandir(folder):
        try:
            if entry.is_file(follow_symlinks=False):
                stat = entry.stat()
                entries.append((stat.st_mtime, stat.st_size, entry.path))
        except OSError:
            continue
    total = sum(size for _, size, _ in entries)
    for _, size, path in sorted(entries):
        if total <= limit:
            break
        try:
            os.remove(path)
            total -= size
        except OSError:
            pass


def openvino_precision(quantized: bool, flags: Optional[frozenset] = None) -> tuple[str, str]:
    """The arithmetic OpenVINO runs a network in, and why: ``int8`` for a quantized file (its
    float parts in float32), ``bf16`` for a float file where the processor has bfloat16 in
    hardware (AMX or AVX-512 BF16: within 0.05 of float32 in W-L on real positions), else
    ``fp32``."""
    from engine import processor

    if quantized:
        return "int8", "a quantized file"
    if processor.native_bf16(flags):
        return "bf16", "the processor has bfloat16 in hardware"
    return "fp32", "the processor has no bfloat16 in hardware"


class _Port:
    """A network input or output as ``Network`` reads them (ONNX Runtime's ``NodeArg`` shape)."""

    _TYPES = {"f32": "tensor(float)", "f16": "tensor(float16)"}

    def __init__(self, port) -> None:
        self.name = port.get_any_name()
        self.type = self._TYPES.get(port.get_element_type().to_string(), str(port.get_element_type()))
        self.shape = [d.get_length() if d.is_static else None for d in port.get_partial_shape()]


class OpenVinoSession:
    """One network compiled by OpenVINO for the CPU at one batch size, behind ``Network``'s
    session interface. Each calling thread has its own infer request; ``infer`` releases the GIL."""

    def __init__(self, compiled, metadata: dict, producer: str, precision: str, reason: str,
                 dynamic_inputs) -> None:
        openvino = import_openvino()
        self._compiled = compiled
        self._tensor = openvino.Tensor
        self.providers = [OPENVINO]
        self.precision = precision
        self.reason = reason
        self.inputs = dynamic_inputs
        self.outputs = [_Port(p) for p in compiled.outputs]
        self.metadata = metadata
        self.producer = producer
        self._requests = threading.local()

    def run_into(self, planes: np.ndarray, targets: list[tuple[str, np.ndarray]]) -> None:
        request = getattr(self._requests, "request", None)
        if request is None:
            request = self._requests.request = self._compiled.create_infer_request()
        request.set_input_tensor(self._tensor(planes, shared_memory=True))
        for name, buffer in targets:
            request.set_tensor(name, self._tensor(buffer, shared_memory=True))
        request.infer()


@contextlib.contextmanager
def _locale_kept():
    """Put the process's locale back as it was after OpenVINO compiles. Its compiler sets the C
    locale and restores the one it found, so two compiles side by side (make_many) could leave
    the process in the C locale: every open() and subprocess text after it read ASCII only."""
    saved = locale.setlocale(locale.LC_ALL)
    try:
        yield
    finally:
        locale.setlocale(locale.LC_ALL, saved)


class _OpenVinoSource:
    """A network file read once for OpenVINO: its metadata, the arithmetic it will run in, and
    OpenVINO's model, which each batch size clones, fixes and compiles (:meth:`compile`)."""

    def __init__(self, data: bytes, precision: Optional[str] = None) -> None:
        import onnx

        proto = onnx.load_model_from_string(data)
        self.metadata = {p.key: p.value for p in proto.metadata_props}
        self.producer = proto.producer_name or ""
        quantized = any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in proto.graph.node)
        self.precision, self.reason = openvino_precision(quantized)
        self.asked = precision
        if precision is not None and precision != self.precision:
            if precision not in ("fp32", "bf16") or quantized:
                raise ValueError(f"OpenVINO runs a float file in fp32 or bf16 and a quantized one as it is, "
                                 f"not {precision!r}")
            self.precision, self.reason = precision, "asked for"
        self.model = _openvino().read_model(data)
        self.ports = [_Port(p) for p in self.model.inputs]

    def compile(self, batch: int, threads: int) -> OpenVinoSession:
        """The network compiled at batch ``batch`` with ``threads`` threads (0: OpenVINO's default)."""
        model = self.model.clone()
        if len(model.inputs) == 1:
            shape = model.inputs[0].get_partial_shape()
            if shape.rank.is_static and shape.rank.get_length() >= 1:
                shape[0] = batch
                model.reshape({model.inputs[0]: shape})
        chosen, reason = self.precision, self.reason
        config = {
            "INFERENCE_NUM_THREADS": int(threads or 0),
            "NUM_STREAMS": 1,
            "PERFORMANCE_HINT": "LATENCY",
            "ENABLE_CPU_PINNING": False,   # the search thread shares these cores
            # An int8 file's float parts run in float32: OpenVINO's default there (bfloat16 where
            # the processor has it) was 14% faster but moved the largest W-L error on real positions
            # from 0.253 to 0.279, past the int8 file on ONNX Runtime (docs/cpu.md, "Precision").
            "INFERENCE_PRECISION_HINT": "bf16" if chosen == "bf16" else "f32",
        }
        # OpenVINO 2026.4's fused-subgraph JIT ("snippets") compiles no Mish (lc0's newer networks):
        # "Supported precisions set is not available for Mish operation". Without it, it does.
        attempts = [config, {**config, "SNIPPETS_MODE": "DISABLE"}]
        if chosen == "bf16" and self.asked is None:
            attempts += [{**c, "INFERENCE_PRECISION_HINT": "f32"} for c in attempts]
        for i, attempt in enumerate(attempts):
            try:
                compiled = _openvino().compile_model(model, "CPU", attempt)
                break
            except Exception as e:  # noqa: BLE001 - the next attempt, or the caller's fallback
                if i == len(attempts) - 1:
                    raise
                if attempts[i + 1]["INFERENCE_PRECISION_HINT"] != attempt["INFERENCE_PRECISION_HINT"]:
                    chosen, reason = "fp32", f"bfloat16 did not compile: {short_ort_message(e)[:80]}"
        return OpenVinoSession(compiled, self.metadata, self.producer, chosen, reason, self.ports)


class FixedSizeError(Exception):
    """The session of one fixed batch size could not be made: ``size`` and the ``error``."""

    def __init__(self, size: int, error: BaseException) -> None:
        super().__init__(f"batch {size}: {error}")
        self.size, self.error = size, error


def _each_size(sizes, make: Callable[[int], object]) -> list:
    """``make(size)`` for each size, a failure raised as :class:`FixedSizeError`."""
    made = []
    for size in sizes:
        try:
            made.append(make(size))
        except Exception as e:  # noqa: BLE001 - e.g. out of GPU memory
            raise FixedSizeError(size, e) from None
    return made


def make_sizes(factory, data: bytes, provider: str, sizes, batch_dim: Optional[str] = None) -> list:
    """``factory``'s session on ``provider`` for each of ``sizes`` (its ``make_many`` where it has
    one); raises :class:`FixedSizeError` naming the size that failed."""
    many = getattr(factory, "make_many", None)
    if many is not None:
        return list(many(data, provider, sizes, batch_dim))
    return _each_size(sizes, lambda n: factory.make(data, provider, n, batch_dim))


# --------------------------------------------------------------------------- provider choice


CPU_BUILD = "this onnxruntime is the CPU build: make engine GPU=1, or pip install onnxruntime-gpu"


def nvidia_gpu_visible() -> bool:
    """Whether this process may see an NVIDIA GPU: a driver's device files on Linux (or WSL's
    GPU device), the driver's nvidia-smi on Windows, and a CUDA_VISIBLE_DEVICES that hides
    none. ``Backend=auto`` tries no GPU runtime where there is none (onnxruntime-gpu on a CPU
    machine would otherwise explain at every start which CUDA library it lacks), and says
    when there is one that this onnxruntime cannot use."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return False
    if sys.platform == "win32":
        return shutil.which("nvidia-smi") is not None
    if not sys.platform.startswith("linux"):
        return False
    return any(os.path.exists(p) for p in ("/dev/nvidiactl", "/dev/nvidia0", "/proc/driver/nvidia/gpus", "/dev/dxg"))


def gpu_attempts(backend: str, listed: list[str]) -> list[str]:
    """The GPU providers to try for ``backend``, best first (``auto``: those ``listed``)."""
    if backend in ("cpu", "openvino"):
        return []
    wanted = [TENSORRT, CUDA] if backend in ("auto", "tensorrt") else [CUDA]
    if backend == "auto":
        wanted = [p for p in wanted if p in listed]
    return wanted


def open_session(factory, data: bytes, backend: str, name: str, log: Callable[[str], object],
                 batch: Optional[int] = None, cpu_batch: Optional[int] = None):
    """The session on the best usable provider, and one ``log`` line where that needs saying.

    ``batch``: the one batch size a GPU session will see; ``cpu_batch`` the one an OpenVINO
    session will. A failed GPU attempt may be the provider's fault or the file's; the CPU
    attempt that follows tells them apart: if ONNX Runtime's CPU path cannot load the file
    either, its error is the one reported (as a NetworkError) and no fallback line is
    written. A GPU attempt that ONNX Runtime quietly turned into a CPU session is kept as
    the CPU session. The line says each runtime that was wanted and not had, and what was
    used; ``Backend=auto`` always gets it (what it took, and why), the other backends only
    when they did not get what they asked for.
    """
    failures: list[str] = []  # "CUDA unavailable (reason)", joined into the one line
    cpu_session = None
    attempts = gpu_attempts(backend, factory.listed())
    if backend == "auto" and attempts and not nvidia_gpu_visible():
        attempts = []               # a CPU machine: nothing to say about CUDA
    elif backend == "auto" and not attempts and nvidia_gpu_visible():
        failures.append(f"CUDA unavailable ({CPU_BUILD})")   # a GPU that this runtime cannot use
    if attempts:
        factory.prepare_gpu()
    for wanted in attempts:
        error: BaseException | None = None
        session = None
        try:
            with _silenced_ort_logger():
                session = factory.make(data, wanted, batch)
        except Exception as e:  # noqa: BLE001 - the provider's fault or the file's; see above
            error = e
        got = session.providers[0] if session is not None else None
        if got != wanted:
            failure = f"{LABEL[wanted]} unavailable ({factory.why_failed(wanted, error)})"
            if failure not in failures:
                failures.append(failure)
        if got in GPU_PROVIDERS:
            if failures:
                log("; ".join(failures) + f"; using {LABEL[got]}")
            return session
        if got == CPU and session.providers == [CPU]:
            cpu_session = session
            break  # the next GPU attempt would fail the same way (TensorRT needs CUDA too)
    if backend in ("auto", "openvino"):
        missing = factory.openvino_missing()
        if missing is None:
            try:
                session = factory.make(data, OPENVINO, cpu_batch or batch)
            except Exception as e:  # noqa: BLE001 - the runtime's fault or the file's: see below
                missing = short_ort_message(e)
            else:
                if backend == "auto" or failures:
                    log("; ".join(failures + [f"using OpenVINO {session.precision} on the CPU "
                                              f"({session.reason})"]))
                return session
        failures.append(f"OpenVINO unavailable ({missing})")
    if cpu_session is None:
        try:
            cpu_session = factory.make(data, CPU)
        except Exception as e:  # noqa: BLE001 - any load failure is a NetworkError
            raise NetworkError(f"{name}: {_explain_load_error(e)}") from None
    if failures:
        log("; ".join(failures) + "; using ONNX Runtime's CPU path")
    return cpu_session
