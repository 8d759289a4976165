"""The network: an ONNX Runtime session behind one small, checked interface.

    >>> net = Network("engine/nets/default.onnx")          # backend="auto"
    >>> policy, wdl, mlh = net.evaluate(planes)             # planes: float32 [N,112,8,8]
    >>> net.provider, net.description
    ('CPUExecutionProvider', 'default.onnx sha256:1e24186e84ad CPU fp32 6x64, float32 io')

The contract (``DESIGN.md``, "Contracts"): one input ``/input/planes``
[N,112,8,8]; outputs ``/output/policy`` [N,1858] raw logits, ``/output/wdl``
[N,3] win/draw/loss probabilities (softmax inside the graph), and optionally
``/output/mlh`` [N,1] moves left.  The batch dimension is dynamic.  Every
file is checked against it on load, and anything wrong raises
:class:`NetworkError` (a ``ValueError``) with a message that says what is
wrong; ONNX Runtime's own exception texts and log dumps never reach the user.

Backends
--------
``"cpu"``, ``"cuda"``, ``"tensorrt"`` or ``"auto"`` (TensorRT, then CUDA,
then CPU).  onnxruntime-gpu lists the TensorRT and CUDA providers whether or
not CUDA is installed, and a CUDA session that cannot load its libraries
quietly runs on the CPU; so the provider is decided by what the created
session actually runs (``session.get_providers()``), not by what is listed.
When a GPU backend was asked for (or ``auto`` found one listed) and could not
be used, the network runs on the CPU and says so in exactly one line through
``log`` (the UCI layer prints it as ``info string``), e.g.::

    CUDA unavailable (libcublasLt.so.13 not found); using CPU

float16 networks
----------------
An fp16 export made without ``keep_io_types`` has a float16 input and float16
outputs.  Such networks are accepted: the planes are cast to float16 on the
way in and the outputs to float32 on the way out, so callers always see
float32.  Any other input or output element type is refused.

Buffers
-------
:meth:`Network.evaluate` returns new arrays that belong to the caller;
nothing the network does later writes to them.  :meth:`Network.evaluate_into`
writes into arrays the caller owns (ONNX Runtime's outputs are bound to them
by pointer, on every provider: the zero-copy path for the search).  Neither
ever writes to the input planes; float32 C-contiguous planes are read in
place, anything else is converted into a private copy first.  Batches larger
than ``max_batch`` run in chunks, each written straight into its rows.

On CUDA and TensorRT the planes are bound from host memory (ONNX Runtime
copies them to the GPU inside ``Run``) and the outputs to host memory (it
copies them back before ``Run`` returns), through the same code path the CPU
uses, so the binding code is exercised by the CPU tests too.

Threads and the GIL
-------------------
:meth:`Network.evaluate` holds no Python lock: each call binds its own
buffers (a fresh ONNX Runtime ``IOBinding``) and ONNX Runtime's ``Run`` is
thread-safe and releases the GIL while it computes, so the search thread,
a UCI reader and any number of evaluator threads never wait on each other in
Python.  The session is created once and never changed; to swap networks,
make a new :class:`Network` and drop the old one.

Importing this module is cheap: ``onnxruntime`` is imported on first use,
and its process-wide default logger is then set to ERROR (warnings such as
"some nodes were not assigned to the preferred execution provider" are noise
to a chess GUI).  The sha256 covers the ``.onnx`` file itself; weights kept
as external data beside it are loaded from its folder but not hashed.
"""

from __future__ import annotations

import contextlib
import ctypes
import glob
import hashlib
import logging
import os
import re
import threading
from typing import Callable, Sequence

import numpy as np

from engine.encoding import PLANES, POLICY_SIZE

__all__ = [
    "BACKENDS",
    "available_providers",
    "INPUT_NAME",
    "MLH_NAME",
    "PLANES",
    "POLICY_NAME",
    "POLICY_SIZE",
    "WDL_NAME",
    "Network",
    "NetworkError",
]

# The contract's tensor names, defined here once (trainer.export writes them); its sizes
# come from the encoder that fills the input and reads the policy.
INPUT_NAME = "/input/planes"
POLICY_NAME = "/output/policy"
WDL_NAME = "/output/wdl"
MLH_NAME = "/output/mlh"
INPUT_SHAPE = (PLANES, 8, 8)  # after the batch dimension

BACKENDS = ("auto", "cpu", "cuda", "tensorrt")

CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"
TENSORRT = "TensorrtExecutionProvider"
_LABEL = {CPU: "CPU", CUDA: "CUDA", TENSORRT: "TensorRT"}
_LIBRARY_STEM = {CUDA: "cuda", TENSORRT: "tensorrt"}

# ONNX Runtime logging severities: 0 verbose, 1 info, 2 warning, 3 error, 4 fatal.
_QUIET = (
    3  # our standing level: no warnings (e.g. "some nodes were not assigned to the preferred EP")
)
_SILENT = 4  # while trying a GPU provider: its load failure is an ERROR line we replace by our own

_ELEMENT_TYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16}

_logger = logging.getLogger(__name__)
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
        return "not built into this onnxruntime"
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
        return _short_ort_message(error)
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


def _short_ort_message(error: BaseException) -> str:
    text = str(error)
    text = re.sub(r"\[ONNXRuntimeError\]\s*:\s*\d+\s*:\s*\w+\s*:\s*", "", text)
    text = re.sub(r"^Load model from .*? failed:\s*", "", text)
    text = _strip_source_location(text)
    return _short(text) or type(error).__name__


def _explain_load_error(error: BaseException) -> str:
    """ONNX Runtime's load exception as one short sentence about the file."""
    text = _short_ort_message(error)
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


def _fmt_shape(shape: Sequence) -> str:
    dims = []
    for i, d in enumerate(shape or ()):
        if isinstance(d, int) and d >= 0:
            dims.append(str(d))
        elif isinstance(d, str) and d:
            dims.append("N" if i == 0 else d)
        else:
            dims.append("N" if i == 0 else "?")
    return "[" + ",".join(dims) + "]"


def _static(d) -> int | None:
    return d if isinstance(d, int) and d >= 0 else None


# --------------------------------------------------------------------------- the network


class Network:
    """An ONNX network that fulfils the cyzero / lc0 contract, on the best usable provider.

    Parameters
    ----------
    path
        The ``.onnx`` file.  It is read once; its sha256 is computed from the
        same bytes the session is built from.
    backend
        ``"auto"`` (TensorRT, then CUDA, then CPU: the first that works),
        ``"cpu"``, ``"cuda"`` or ``"tensorrt"``.  A GPU backend that cannot be
        used falls back (TensorRT to CUDA to CPU) with one line through ``log``.
    device_id
        The GPU to use (CUDA and TensorRT).
    intra_threads
        ONNX Runtime's intra-op threads; ``None`` or 0 for its default (one
        per physical core).
    inter_threads
        Inter-op threads; ``None`` for 1.  The graph runs in sequential mode.
    max_batch
        The largest batch given to ONNX Runtime at once; larger inputs to
        :meth:`evaluate` are split into chunks of this size.  On TensorRT it
        is also the top of the optimisation profile.
    log
        Called with one human-readable line for things a user should know
        (a GPU fallback).  Default: this module's ``logging`` logger, at
        WARNING.
    expected_sha256
        If given, the file's sha256 (hex) must match or :class:`NetworkError`
        is raised before anything is built from it.
    warmup_batch
        After the checks, the network is run at batch 1 (always: this also
        checks the outputs) and then at this batch size, so that the first
        real evaluation is not slow.  ``None``: ``max_batch`` on a GPU,
        ``min(max_batch, 32)`` on the CPU; 0 or 1: batch 1 only.
    allow_spinning
        Let ONNX Runtime's intra-op threads spin briefly after a run (its
        default).  Turn off when the CPU is shared with a busy search thread.
    trt_fp16
        Let TensorRT run in float16 (as lc0 does on GPUs).
    trt_cache_dir
        Where TensorRT keeps its built engines (building one takes minutes);
        default ``$CYZERO_TRT_CACHE`` or ``~/.cache/cyzero/tensorrt``.

    Attributes
    ----------
    provider : str
        The execution provider that runs the network, e.g. ``"CPUExecutionProvider"``.
    description : str
        A one-line summary: file name, sha256 prefix, provider, variant and input type.
    sha256, path, variant, input_dtype, has_mlh, max_batch, metadata

    Buffers and aliasing
    --------------------
    :meth:`evaluate` returns new arrays that belong to the caller; nothing the
    network does later writes to them.  :meth:`evaluate_into` writes straight
    into the caller's arrays (ONNX Runtime's output buffers are bound to
    them), the zero-copy path for the search.  Neither ever writes to the
    input array.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        backend: str = "auto",
        device_id: int = 0,
        intra_threads: int | None = None,
        inter_threads: int | None = None,
        max_batch: int = 256,
        log: Callable[[str], object] | None = None,
        *,
        expected_sha256: str | None = None,
        warmup_batch: int | None = None,
        allow_spinning: bool = True,
        trt_fp16: bool = True,
        trt_cache_dir: str | os.PathLike | None = None,
    ) -> None:
        self.path = os.fspath(path)
        self.name = os.path.basename(self.path)
        self._log = log if log is not None else _logger.warning
        if backend not in BACKENDS:
            raise NetworkError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
        if not isinstance(max_batch, int) or isinstance(max_batch, bool) or max_batch < 1:
            raise NetworkError(f"max_batch must be a whole number >= 1, got {max_batch!r}")
        for label, value in (("intra_threads", intra_threads), ("inter_threads", inter_threads)):
            if value is not None and (not isinstance(value, int) or value < 0):
                raise NetworkError(f"{label} must be a whole number >= 0 or None, got {value!r}")
        self.backend = backend
        self.device_id = int(device_id)
        self.intra_threads = intra_threads or 0
        self.inter_threads = inter_threads or 1
        self.max_batch = max_batch
        self._allow_spinning = allow_spinning
        self._trt_fp16 = trt_fp16
        self._trt_cache_dir = trt_cache_dir

        data = self._read(expected_sha256)
        self._session = self._create_session(data)
        del data
        self.providers: list[str] = list(self._session.get_providers())
        self.provider: str = self.providers[0]
        self._check_contract()
        self.variant = self._guess_variant()
        size = self._size()
        self.description = (
            f"{self.name} sha256:{self.sha256[:12]} {_LABEL.get(self.provider, self.provider)} "
            f"{self.variant}{' ' + size if size else ''}, {np.dtype(self.input_dtype).name} io"
        )
        self._warm_up(warmup_batch)

    # ------------------------------------------------------------------ loading

    def _read(self, expected_sha256: str | None) -> bytes:
        if not os.path.exists(self.path):
            raise NetworkError(f"network file not found: {self.path}")
        if os.path.isdir(self.path):
            raise NetworkError(f"network path is a directory, not an .onnx file: {self.path}")
        try:
            with open(self.path, "rb") as f:
                data = f.read()
        except OSError as e:
            raise NetworkError(f"cannot read network file {self.path}: {e.strerror or e}") from None
        if not data:
            raise NetworkError(f"{self.name}: the file is empty, not an ONNX model")
        self.sha256 = hashlib.sha256(data).hexdigest()
        if expected_sha256 is not None:
            words = str(expected_sha256).split()
            expected = words[0].lower() if words else ""
            if expected != self.sha256:
                raise NetworkError(
                    f"{self.name}: sha256 mismatch: expected {expected or '(empty)'}, "
                    f"the file has {self.sha256}"
                )
        return data

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
            "session.intra_op.allow_spinning", "1" if self._allow_spinning else "0"
        )
        # The model is loaded from the bytes that were hashed; external weights (a model
        # over 2 GB, or one saved with save_as_external_data) are found beside the file.
        folder = os.path.dirname(os.path.abspath(self.path))
        so.add_session_config_entry("session.model_external_initializers_file_folder_path", folder)
        return so

    def _gpu_attempts(self) -> list[tuple[str, list]]:
        """(provider wanted, provider list) for each GPU attempt, best first."""
        if self.backend == "cpu":
            return []
        wanted = [TENSORRT, CUDA] if self.backend in ("auto", "tensorrt") else [CUDA]
        if self.backend == "auto":
            listed = set(available_providers())
            wanted = [p for p in wanted if p in listed]
        cuda = (CUDA, {"device_id": self.device_id})
        return [
            (p, [(TENSORRT, self._trt_options()), cuda, CPU] if p == TENSORRT else [cuda, CPU])
            for p in wanted
        ]

    def _trt_options(self) -> dict:
        shape = "x".join(str(d) for d in INPUT_SHAPE)
        options = {
            "device_id": self.device_id,
            "trt_fp16_enable": self._trt_fp16,
            "trt_profile_min_shapes": f"{INPUT_NAME}:1x{shape}",
            "trt_profile_opt_shapes": f"{INPUT_NAME}:{self.max_batch}x{shape}",
            "trt_profile_max_shapes": f"{INPUT_NAME}:{self.max_batch}x{shape}",
        }
        cache = os.fspath(
            self._trt_cache_dir
            or os.environ.get("CYZERO_TRT_CACHE")
            or os.path.join(
                os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
                "cyzero",
                "tensorrt",
            )
        )
        try:
            # TensorRT creates the last level itself, only when it really starts, so a machine
            # without TensorRT gets at most the (empty) parent folder.
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

    def _new_session(self, data: bytes, providers: list):
        ort = _ort()
        # enable_fallback=0: ONNX Runtime's own fallback prints a banner to stdout (the UCI channel).
        return ort.InferenceSession(
            data, self._session_options(), providers=providers, enable_fallback=0
        )

    def _create_session(self, data: bytes):
        """The session on the best usable provider; one ``log`` line if a GPU was wanted but not had.

        A failed GPU attempt may be the provider's fault or the file's; the
        CPU attempt that follows tells them apart: if the CPU cannot load the
        file either, its error is the one reported (as a NetworkError) and no
        fallback line is written.  A GPU attempt that ONNX Runtime quietly
        turned into a CPU session is kept as the CPU session.
        """
        failures: list[str] = []  # "CUDA unavailable (reason)", joined into the one fallback line
        cpu_session = None
        attempts = self._gpu_attempts()
        if attempts:
            _preload_gpu_libraries()
        for wanted, providers in attempts:
            error: BaseException | None = None
            session = None
            try:
                with _silenced_ort_logger():
                    session = self._new_session(data, providers)
            except Exception as e:  # noqa: BLE001 - the provider's fault or the file's; see above
                error = e
            got = session.get_providers()[0] if session is not None else None
            if got != wanted:
                failure = f"{_LABEL[wanted]} unavailable ({_why_provider_failed(wanted, error)})"
                if failure not in failures:
                    failures.append(failure)
            if got in (TENSORRT, CUDA):
                if failures:
                    self._log("; ".join(failures) + f"; using {_LABEL[got]}")
                return session
            if got == CPU and session.get_providers() == [CPU]:
                cpu_session = session
                break  # the next GPU attempt would fail the same way (TensorRT needs CUDA too)
        if cpu_session is None:
            try:
                cpu_session = self._new_session(data, [CPU])
            except Exception as e:  # noqa: BLE001 - any load failure is a NetworkError
                raise NetworkError(f"{self.name}: {_explain_load_error(e)}") from None
        if failures:
            self._log("; ".join(failures) + "; using CPU")
        return cpu_session

    def _check_contract(self) -> None:
        s = self._session
        where = self.name
        inputs = s.get_inputs()
        if len(inputs) != 1:
            names = ", ".join(repr(i.name) for i in inputs) or "none"
            raise NetworkError(
                f"{where}: expected exactly one input {INPUT_NAME!r} [N,{PLANES},8,8], "
                f"the network has {len(inputs)}: {names}"
            )
        inp = inputs[0]
        if inp.name != INPUT_NAME:
            raise NetworkError(
                f"{where}: the input is named {inp.name!r}, expected {INPUT_NAME!r} "
                f"(an lc0 / leela2onnx style network)"
            )
        if inp.type not in _ELEMENT_TYPES:
            raise NetworkError(
                f"{where}: input {INPUT_NAME!r} has element type {inp.type}, "
                f"expected tensor(float) (or tensor(float16))"
            )
        shape = list(inp.shape or [])
        ok = len(shape) == 4 and all(
            _static(d) in (None, want) for d, want in zip(shape[1:], INPUT_SHAPE)
        )
        if not ok:
            raise NetworkError(
                f"{where}: input {INPUT_NAME!r} has shape {_fmt_shape(shape)}, expected [N,{PLANES},8,8]"
            )
        if _static(shape[0]) is not None:
            raise NetworkError(
                f"{where}: input {INPUT_NAME!r} has a fixed batch size of {shape[0]}; "
                f"export it with a dynamic batch dimension"
            )
        self.input_dtype = _ELEMENT_TYPES[inp.type]

        outputs = {o.name: o for o in s.get_outputs()}
        self._output_dtypes: dict[str, type] = {}
        self._mlh_rank = 0
        for name, width, required in (
            (POLICY_NAME, POLICY_SIZE, True),
            (WDL_NAME, 3, True),
            (MLH_NAME, 1, False),
        ):
            out = outputs.get(name)
            if out is None:
                if required:
                    have = ", ".join(repr(n) for n in outputs) or "none"
                    raise NetworkError(f"{where}: missing output {name!r} (the network has {have})")
                continue
            if out.type not in _ELEMENT_TYPES:
                raise NetworkError(
                    f"{where}: output {name!r} has element type {out.type}, expected tensor(float)"
                )
            oshape = list(out.shape or [])
            if name == MLH_NAME and len(oshape) == 1:
                ok = True  # [N] is accepted for [N,1]
            else:
                ok = len(oshape) == 2 and _static(oshape[1]) in (None, width)
            if not ok:
                raise NetworkError(
                    f"{where}: output {name!r} has shape {_fmt_shape(oshape)}, expected [N,{width}]"
                )
            if name == MLH_NAME:
                self._mlh_rank = len(oshape)
            self._output_dtypes[name] = _ELEMENT_TYPES[out.type]
        self.has_mlh = MLH_NAME in self._output_dtypes
        meta = s.get_modelmeta()
        self.metadata: dict[str, str] = dict(meta.custom_metadata_map or {})
        self.producer = meta.producer_name or ""

    def _size(self) -> str:
        """``"10x128"`` (blocks x filters) from a cyzero export's metadata, else ``""``."""
        import json

        try:
            config = json.loads(self.metadata.get("cyzero.config", ""))
            return f"{int(config['blocks'])}x{int(config['filters'])}"
        except (ValueError, TypeError, KeyError):
            return ""

    def _guess_variant(self) -> str:
        for key in ("cyzero.variant", "variant", "precision", "dtype"):
            value = self.metadata.get(key)
            if value:
                return str(value)
        lower = self.name.lower()
        for tag in ("int8", "fp16", "fp32", "bf16"):
            if (
                f".{tag}." in lower
                or lower.endswith(f"_{tag}.onnx")
                or lower.endswith(f"-{tag}.onnx")
            ):
                return tag
        return "fp16" if self.input_dtype is np.float16 else "fp32"

    def _warm_up(self, warmup_batch: int | None) -> None:
        if warmup_batch is None:
            warmup_batch = (
                self.max_batch if self.provider in (CUDA, TENSORRT) else min(self.max_batch, 32)
            )
        warmup_batch = max(1, min(int(warmup_batch), self.max_batch))
        planes = np.zeros((warmup_batch, *INPUT_SHAPE), np.float32)
        planes[:, PLANES - 1] = 1.0  # the all-ones plane every real position has
        try:
            policy, wdl, mlh = self.evaluate(planes[:1])
            if warmup_batch > 1:
                self.evaluate(planes)
        except Exception as e:  # noqa: BLE001 - e.g. an output of the wrong size at run time
            raise NetworkError(
                f"{self.name}: the network fails on a test batch: {_short_ort_message(e)}"
            ) from None
        if not (np.isfinite(policy).all() and np.isfinite(wdl).all()):
            raise NetworkError(
                f"{self.name}: the network's outputs are not finite (NaN or inf) on a test batch"
            )
        sums = wdl.sum(axis=1)
        tolerance = 1e-2 if self._output_dtypes[WDL_NAME] is np.float16 else 1e-4
        if (wdl < 0).any() or not np.allclose(sums, 1.0, atol=tolerance):
            worst = float(sums[np.argmax(np.abs(sums - 1.0))])
            raise NetworkError(
                f"{self.name}: {WDL_NAME!r} is not a probability distribution (a row sums to "
                f"{worst:.4g}, or has a negative entry); the contract wants the softmax in the graph"
            )

    # ------------------------------------------------------------------ evaluation

    def evaluate(self, planes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """Evaluate a batch of positions.

        ``planes``: [N,112,8,8] (float32 preferred; other real dtypes are
        converted), any N >= 0.  Returns ``(policy, wdl, mlh)``: raw policy
        logits float32 [N,1858], win/draw/loss probabilities float32 [N,3],
        and moves left float32 [N] (``None`` when the network has no moves-left
        head).  The arrays are new and belong to the caller; ``planes`` is
        never written to.  Inputs larger than ``max_batch`` run in chunks.
        """
        x = self._as_planes(planes)
        n = x.shape[0]
        policy = np.empty((n, POLICY_SIZE), np.float32)
        wdl = np.empty((n, 3), np.float32)
        mlh = np.empty(n, np.float32) if self.has_mlh else None
        self._run_chunks(x, policy, wdl, mlh)
        return policy, wdl, mlh

    def evaluate_into(
        self,
        planes: np.ndarray,
        policy_out: np.ndarray,
        wdl_out: np.ndarray,
        mlh_out: np.ndarray | None = None,
    ) -> int:
        """Evaluate into the caller's arrays (zero copy); returns N.

        ``policy_out`` float32 [>=N,1858], ``wdl_out`` float32 [>=N,3] and
        ``mlh_out`` float32 [>=N] or ``None``, all C-contiguous and writable;
        rows ``[:N]`` are written, the rest are left alone, so preallocated
        ``max_batch``-sized buffers can be reused for every batch.  When the
        network has no moves-left head, ``mlh_out[:N]`` is filled with NaN.
        ONNX Runtime writes the results straight into these arrays.
        """
        x = self._as_planes(planes)
        n = x.shape[0]
        policy = self._check_out("policy_out", policy_out, n, (POLICY_SIZE,))
        wdl = self._check_out("wdl_out", wdl_out, n, (3,))
        mlh = None if mlh_out is None else self._check_out("mlh_out", mlh_out, n, ())
        if mlh is not None and not self.has_mlh:
            mlh.fill(np.nan)
            mlh = None
        self._run_chunks(x, policy, wdl, mlh)
        return n

    __call__ = evaluate

    @staticmethod
    def _as_planes(planes) -> np.ndarray:
        x = np.asarray(planes)
        if x.ndim != 4 or x.shape[1:] != INPUT_SHAPE:
            raise ValueError(f"planes must have shape [N,{PLANES},8,8], got {list(x.shape)}")
        if x.dtype != np.float32 or not x.flags.c_contiguous or not x.flags.aligned:
            if not (np.issubdtype(x.dtype, np.number) or x.dtype == np.bool_) or np.iscomplexobj(x):
                raise ValueError(f"planes must be float32 (or another real dtype), got {x.dtype}")
            x = np.ascontiguousarray(x, dtype=np.float32)  # a copy: the caller's array is untouched
        return x

    @staticmethod
    def _check_out(label: str, out, n: int, tail: tuple) -> np.ndarray:
        if not isinstance(out, np.ndarray):
            raise TypeError(f"{label} must be a numpy array, got {type(out).__name__}")
        if out.dtype != np.float32 or out.shape[1:] != tail or out.shape[0] < n:
            want = "[>=%d%s]" % (n, "".join(f",{d}" for d in tail))
            raise ValueError(f"{label} must be float32 {want}, got {out.dtype} {list(out.shape)}")
        if not (out.flags.c_contiguous and out.flags.writeable and out.flags.aligned):
            raise ValueError(f"{label} must be C-contiguous, aligned and writable")
        return out[:n]

    def _run_chunks(
        self, x: np.ndarray, policy: np.ndarray, wdl: np.ndarray, mlh: np.ndarray | None
    ) -> None:
        n = x.shape[0]
        step = self.max_batch
        for start in range(0, n, step):
            stop = min(n, start + step)
            self._run(
                x[start:stop],
                policy[start:stop],
                wdl[start:stop],
                None if mlh is None else mlh[start:stop],
            )

    def _run(
        self, x: np.ndarray, policy: np.ndarray, wdl: np.ndarray, mlh: np.ndarray | None
    ) -> None:
        """One batch through the session, all buffers bound by pointer (no Python lock held).

        The input is bound from host memory; ONNX Runtime copies it to the
        device itself on CUDA/TensorRT.  Outputs are bound to host buffers:
        the caller's arrays when the network's outputs are float32, else
        fresh float16 arrays that are cast afterwards.  Every slice here is a
        C-contiguous run of rows, so its data pointer is a valid buffer.
        """
        session = self._session
        if session is None:
            raise RuntimeError("the network is closed")
        if self.input_dtype is not np.float32:
            x = x.astype(self.input_dtype)
        binding = session.io_binding()
        binding.bind_input(INPUT_NAME, "cpu", 0, self.input_dtype, x.shape, x.ctypes.data)
        casts = []
        n = x.shape[0]
        targets = [(POLICY_NAME, policy, (n, POLICY_SIZE)), (WDL_NAME, wdl, (n, 3))]
        if mlh is not None:
            targets.append((MLH_NAME, mlh, (n, 1) if self._mlh_rank == 2 else (n,)))
        for name, out, shape in targets:
            dtype = self._output_dtypes[name]
            if dtype is np.float32:
                buffer = out
            else:
                buffer = np.empty(shape, dtype)
                casts.append((out, buffer))
            binding.bind_output(name, "cpu", 0, dtype, shape, buffer.ctypes.data)
        session.run_with_iobinding(binding)
        for out, buffer in casts:
            out[...] = buffer.reshape(out.shape)

    # ------------------------------------------------------------------ misc

    def close(self) -> None:
        """Release the session (and its GPU memory).  Further evaluations raise ``RuntimeError``."""
        self._session = None

    def __enter__(self) -> "Network":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Network {self.description}>"
