"""The network: an ONNX Runtime session behind one small, checked interface.

    >>> net = Network("engine/nets/default.onnx")          # backend="auto"
    >>> policy, wdl, mlh = net.evaluate(planes)             # planes: float32 [N,112,8,8]
    >>> net.provider, net.description
    ('CPUExecutionProvider', 'default.onnx sha256:1e24186e84ad CPU fp32 6x64, float32 io')

The contract (``docs/contracts.md``, "The network"): one input ``/input/planes``
[N,112,8,8]; outputs ``/output/policy`` [N,1858] raw logits, ``/output/wdl``
[N,3] win/draw/loss probabilities (softmax inside the graph), and optionally
``/output/mlh`` [N,1] moves left.  The batch dimension is dynamic.  Every
file is checked against it on load, and anything wrong raises
:class:`NetworkError` (a ``ValueError``) with a message that says what is
wrong; ONNX Runtime's own exception texts and log dumps never reach the user.

Backends
--------
``"cpu"`` (ONNX Runtime's CPU path), ``"openvino"`` (OpenVINO's CPU plugin:
see :mod:`engine.sessions`), ``"cuda"``, ``"tensorrt"`` or ``"auto"``
(TensorRT, then CUDA, then OpenVINO, then ONNX Runtime's CPU path; ``auto``
says in one line what it took and why).  onnxruntime-gpu lists the TensorRT and CUDA providers whether or
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

Fixed shapes on a GPU
---------------------
ONNX Runtime's CUDA provider re-plans whenever a session's input shape
changes (on an H100: 336 positions/s fed random batch sizes, 57,774 with one
session per fixed size).  So on CUDA and TensorRT the network keeps one
session per size in :attr:`Network.batch_sizes`, each fed only its own shape,
pads every batch to the smallest size that holds it (:meth:`Network.padded`),
and runs every size once when it is loaded: a swap builds and warms the new
network before it replaces the old one, so no search ever waits for a plan.
OpenVINO on the CPU does the same (a dynamic batch ran the int8 file at half
the speed), compiling its sizes side by side. ONNX Runtime's CPU provider keeps
one session and variable shapes, which cost nothing there.  Sessions come from a factory (``engine.sessions``), which a stand-in
for a GPU replaces in tests and benchmarks.

Threads and the GIL
-------------------
:meth:`Network.evaluate` holds no Python lock: each call binds its own
buffers (a fresh ONNX Runtime ``IOBinding``) and ONNX Runtime's ``Run`` is
thread-safe and releases the GIL while it computes, so the search thread,
a UCI reader and any number of evaluator threads never wait on each other in
Python.  The sessions are created once and never changed; to swap networks,
make a new :class:`Network` and drop the old one.

Importing this module is cheap: ``onnxruntime`` is imported on first use,
and its process-wide default logger is then set to ERROR (warnings such as
"some nodes were not assigned to the preferred execution provider" are noise
to a chess GUI).  The sha256 covers the ``.onnx`` file itself; weights kept
as external data beside it are loaded from its folder but not hashed.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from typing import Callable, Sequence

import numpy as np

from engine.contract import INPUT_NAME, MLH_NAME, POLICY_NAME, WDL_NAME
from engine.encoding import PLANES, POLICY_SIZE
from engine.lc0 import Lc0Error, is_lc0_file, read_lc0
from engine.lc0_onnx import lc0_to_onnx

#: The ONNX metadata key that names the lc0 input format a network reads (absent: format 1).
INPUT_FORMAT_KEY = "cyzero.input_format"
from engine.sessions import (
    BACKENDS,
    CPU,
    CUDA,
    GPU_PROVIDERS,
    LABEL,
    OPENVINO,
    TENSORRT,
    FixedSizeError,
    NetworkError,
    SessionFactory,
    available_providers,
    make_sizes,
    open_session,
    short_ort_message,
)

__all__ = [
    "BACKENDS",
    "CPU",
    "CUDA",
    "OPENVINO",
    "TENSORRT",
    "fixed_batch_sizes",
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

INPUT_SHAPE = (PLANES, 8, 8)  # after the batch dimension

# The largest batch a network runs at once unless told otherwise.
DEFAULT_MAX_BATCH = 256

_ELEMENT_TYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16}

_logger = logging.getLogger(__name__)


def fixed_batch_sizes(max_batch: int, sizes: Sequence[int] | None = None) -> tuple[int, ...]:
    """The batch sizes a GPU network runs, smallest first: ``sizes`` if given, else the powers
    of two below ``max_batch`` and ``max_batch`` itself."""
    if sizes is None:
        sizes = [1 << k for k in range(max_batch.bit_length()) if 1 << k < max_batch] + [max_batch]
    chosen = sorted({int(n) for n in sizes})
    if not chosen or chosen[0] < 1 or any(isinstance(n, bool) for n in sizes):
        raise NetworkError(f"batch sizes must be whole numbers >= 1, got {list(sizes)!r}")
    return tuple(chosen)


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
        The ``.onnx`` file, or an lc0 weights file (``.pb.gz``, ``.pb``: see
        :mod:`engine.lc0`).  It is read once; its sha256 is computed from the
        same bytes the session is built from (an lc0 file's own bytes).
    backend
        ``"auto"`` (TensorRT, then CUDA, then OpenVINO, then ONNX Runtime's CPU
        path: the first that works), ``"cpu"``, ``"openvino"``, ``"cuda"`` or
        ``"tensorrt"``.  A backend that cannot be used falls back (TensorRT to
        CUDA to ONNX Runtime's CPU path, OpenVINO to ONNX Runtime's CPU path)
        with one line through ``log``.
    device_id
        The GPU to use (CUDA and TensorRT).
    intra_threads
        ONNX Runtime's intra-op threads; ``None`` or 0 for its default (one
        per physical core).
    inter_threads
        Inter-op threads; ``None`` for 1.  The graph runs in sequential mode.
    max_batch
        The largest batch given to ONNX Runtime at once; larger inputs to
        :meth:`evaluate` are split into chunks of this size.
    batch_sizes
        On a GPU provider and on OpenVINO, the fixed batch sizes, one session
        each (default: the powers of two below ``max_batch``, and
        ``max_batch``); a batch is padded to the smallest that holds it.
        Ignored on ONNX Runtime's CPU path, where shapes may vary at no cost.
    precision
        On OpenVINO, ``"fp32"`` or ``"bf16"`` for a float file (default: bf16 where the
        processor has it in hardware; see :func:`engine.sessions.openvino_precision`).
    cuda_options
        Extra CUDA provider options (see :class:`engine.sessions.SessionFactory`).
    value_head, policy_head
        Which heads of an lc0 multihead file play (None: lc0's ``winner`` and ``vanilla``; see
        :func:`engine.lc0.read_lc0`); other files have one of each and ignore them.
    session_factory
        What makes the sessions (default: ONNX Runtime's); the GPU stand-in
        ``engine.tools.gpu_standin.SimulatedGPU`` takes its place in tests
        and benchmarks.
    log
        Called with one human-readable line for things a user should know
        (a GPU fallback).  Default: this module's ``logging`` logger, at
        WARNING.
    expected_sha256
        If given, the file's sha256 (hex) must match or :class:`NetworkError`
        is raised before anything is built from it.
    warmup_batch
        On the CPU, after the checks, the network is run at batch 1 (always:
        this also checks the outputs) and then at this batch size, so that
        the first real evaluation is not slow (``None``: ``min(max_batch,
        32)``; 0 or 1: batch 1 only).  On a GPU every fixed size is run once.
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
    batch_sizes : tuple of int
        The fixed sizes the network runs (a GPU provider, OpenVINO), or ``()``: any size.
    gpu : bool
        Whether it runs on a GPU (the search batches and pipelines by it).
    precision : str
        The arithmetic it runs in: the file's variant, or ``bf16`` where OpenVINO chose it.
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
        max_batch: int = DEFAULT_MAX_BATCH,
        log: Callable[[str], object] | None = None,
        *,
        expected_sha256: str | None = None,
        warmup_batch: int | None = None,
        allow_spinning: bool = True,
        trt_fp16: bool = True,
        trt_cache_dir: str | os.PathLike | None = None,
        batch_sizes: Sequence[int] | None = None,
        cuda_options: dict | None = None,
        precision: str | None = None,
        value_head: str | None = None,
        policy_head: str | None = None,
        session_factory=None,
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
        data = self._read(expected_sha256, value_head, policy_head)
        self._factory = session_factory or SessionFactory(
            device_id=self.device_id, intra_threads=self.intra_threads,
            inter_threads=self.inter_threads, allow_spinning=allow_spinning,
            folder=os.path.dirname(os.path.abspath(self.path)), trt_fp16=trt_fp16,
            trt_cache_dir=None if trt_cache_dir is None else os.fspath(trt_cache_dir),
            cache_key=self.sha256[:16], cuda_options=cuda_options, precision=precision)
        wanted_sizes = fixed_batch_sizes(max_batch, batch_sizes)
        # A GPU session is made for the largest size and fed only that; the contract is checked
        # on it before any other size is made with the batch dimension fixed by name.
        self._session = open_session(self._factory, data, backend, self.name, self._log,
                                     batch=wanted_sizes[-1])
        self.providers: list[str] = list(self._session.providers)
        self.provider: str = self.providers[0]
        self.gpu: bool = self.provider in GPU_PROVIDERS
        if self._lc0 is not None and self.provider == CUDA:
            # The CUDA provider runs an lc0 file in float16, as lc0 does on a GPU (and as the
            # bundled network's fp16 variant runs); TensorRT makes its own fp16 engine.
            data = lc0_to_onnx(self._lc0, "float16")
            self._session = self._factory.make(data, CUDA, wanted_sizes[-1])
        self._check_contract()
        self.variant = self._guess_variant()
        #: the arithmetic it runs in: the file's variant, or what OpenVINO chose for it (bf16)
        self.precision: str = getattr(self._session, "precision", self.variant)
        size = self._size()
        # On a GPU provider, one session per batch size, each fed only its own shape: ONNX
        # Runtime's CUDA provider re-plans whenever a session's input shape changes (on an H100,
        # 336 positions/s with shapes changing, 57,774 with one session per fixed size).
        self.batch_sizes: tuple[int, ...] = ()
        self._sessions: dict[int, object] = {}
        if self.provider in (CUDA, TENSORRT, OPENVINO):
            self.batch_sizes = wanted_sizes
            self.max_batch = wanted_sizes[-1]
            self._sessions = self._make_sessions(data)
        del data
        self._lc0 = None     # the file's weights: the sessions hold what they need
        self._buffers = threading.local()    # per thread: padded input and output rows by size
        sizes = f", batch {'/'.join(map(str, self.batch_sizes))}" if self.batch_sizes else ""
        precision = f" {self.precision}" if self.precision != self.variant else ""
        self.description = (
            f"{self.name} sha256:{self.sha256[:12]} {LABEL.get(self.provider, self.provider)}"
            f"{precision} {self.variant}{' ' + size if size else ''}, {np.dtype(self.input_dtype).name} io{sizes}"
            + (f"; {self.lc0_description}" if self.lc0_description else "")
        )
        self._warm_up(warmup_batch)

    # ------------------------------------------------------------------ loading

    def _read(self, expected_sha256: str | None, value_head: str | None = None,
              policy_head: str | None = None) -> bytes:
        if not os.path.exists(self.path):
            raise NetworkError(f"network file not found: {self.path}")
        if os.path.isdir(self.path):
            raise NetworkError(f"network path is a directory, not a network file: {self.path}")
        try:
            with open(self.path, "rb") as f:
                data = f.read()
        except OSError as e:
            raise NetworkError(f"cannot read network file {self.path}: {e.strerror or e}") from None
        if not data:
            raise NetworkError(f"{self.name}: the file is empty, not a network")
        self.sha256 = hashlib.sha256(data).hexdigest()
        if expected_sha256 is not None:
            words = str(expected_sha256).split()
            expected = words[0].lower() if words else ""
            if expected != self.sha256:
                raise NetworkError(
                    f"{self.name}: sha256 mismatch: expected {expected or '(empty)'}, "
                    f"the file has {self.sha256}"
                )
        self.lc0_description = ""
        self._lc0 = None
        if is_lc0_file(self.path) or data[:2] == b"\x1f\x8b":   # ONNX files are never gzipped
            # An lc0 weights file: the graph is built from it in memory (the sha256 stays the
            # file's, so hot-swap and the trainer's contract treat it like any network file).
            try:
                self._lc0 = read_lc0(data, self.name, value_head=value_head, policy_head=policy_head)
            except Lc0Error as e:
                raise NetworkError(str(e)) from None
            self.lc0_description = self._lc0.description
            data = lc0_to_onnx(self._lc0, "float32")
        return data

    def _make_sessions(self, data: bytes) -> dict[int, object]:
        """One session per fixed batch size, on the provider the first one got."""
        rest = self.batch_sizes[:-1]
        try:
            made = make_sizes(self._factory, data, self.provider, rest, self._batch_dim)
        except FixedSizeError as e:
            raise NetworkError(
                f"{self.name}: cannot make the batch-{e.size} session on "
                f"{LABEL[self.provider]}: {short_ort_message(e.error)}"
            ) from None
        sessions = {self.batch_sizes[-1]: self._session}
        for size, session in zip(rest, made):
            if session.providers[0] != self.provider:
                raise NetworkError(
                    f"{self.name}: the batch-{size} session runs on {session.providers[0]}, "
                    f"not {self.provider} like the others"
                )
            sessions[size] = session
        return sessions

    def padded(self, n: int) -> int:
        """The batch size a call of ``n`` positions (at most ``max_batch``) really runs at: the
        smallest fixed size that holds it on a GPU, ``n`` itself on the CPU."""
        for size in self.batch_sizes:
            if size >= n:
                return size
        return n

    def _check_contract(self) -> None:
        s = self._session
        where = self.name
        inputs = s.inputs
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
        self._batch_dim = shape[0] if isinstance(shape[0], str) and shape[0] else None

        outputs = {o.name: o for o in s.outputs}
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
        self.metadata: dict[str, str] = dict(s.metadata)
        self.producer = s.producer
        self.input_format = self._input_format()

    def _input_format(self) -> int:
        """lc0's input format the network reads (engine.encoding.INPUT_FORMATS), which the search
        and ``cyzero eval`` encode with: an lc0 file says it; an ONNX file in its metadata
        (INPUT_FORMAT_KEY), else it is the classical format 1."""
        from engine.encoding import INPUT_FORMATS

        if self._lc0 is not None:
            value = self._lc0.input_format
            said = f"its lc0 input format {value}"
        else:
            text = self.metadata.get(INPUT_FORMAT_KEY)
            if text is None:
                return 1
            try:
                value = int(text)
            except ValueError:
                value = None
            said = f"metadata {INPUT_FORMAT_KEY} {text!r}"
        if value not in INPUT_FORMATS:
            raise NetworkError(f"{self.name}: {said} is none of lc0's input formats "
                               f"{', '.join(map(str, INPUT_FORMATS))}")
        return value

    def _size(self) -> str:
        """``"10x128"`` (blocks x filters) or ``"bt-64x6x4h"`` (an attention body: embedding, layers,
        heads) from a cyzero export's metadata, else ``""``."""
        import json

        try:
            config = json.loads(self.metadata.get("cyzero.config", ""))
            if config.get("body") == "attention":
                return f"bt-{int(config['filters'])}x{int(config['blocks'])}x{int(config['heads'])}h"
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
        """Run every fixed size once (a GPU), or batch 1 and ``warmup_batch`` (the CPU), so that
        no search ever pays for a first call; batch 1's outputs are checked."""
        if self.batch_sizes:
            sizes = list(self.batch_sizes)
        else:
            if warmup_batch is None:
                warmup_batch = min(self.max_batch, 32)
            sizes = sorted({1, max(1, min(int(warmup_batch), self.max_batch))})
        planes = np.zeros((sizes[-1], *INPUT_SHAPE), np.float32)
        planes[:, PLANES - 1] = 1.0  # the all-ones plane every real position has
        policy = wdl = None
        for size in sizes:
            try:
                out_policy, out_wdl, _ = self.evaluate(planes[:size])
            except Exception as e:  # noqa: BLE001 - an output of the wrong size, or no GPU memory
                where = f" at batch {size}" if size > 1 else ""
                raise NetworkError(
                    f"{self.name}: the network fails on a test batch{where}: {short_ort_message(e)}"
                    + (" (lower the largest batch size)" if self.batch_sizes and size > 1 else "")
                ) from None
            if policy is None:
                policy, wdl = out_policy[:1], out_wdl[:1]
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
        """One batch through its session, all buffers bound by pointer (no Python lock held).

        On a GPU the batch is padded to its fixed size: the rows go into this thread's buffers
        of that size (the rows past them are ignored), and the outputs come back into buffers
        of that size, their first rows copied out. The caller's arrays are bound directly when
        no padding and no float16 cast is needed. Every slice here is a C-contiguous run of
        rows, so its data pointer is a valid buffer.
        """
        session = self._sessions.get(self.padded(x.shape[0])) if self._sessions else self._session
        if session is None:
            raise RuntimeError("the network is closed")
        n = x.shape[0]
        size = self.padded(n)
        if size != n:
            pad = self._buffer(("in", size), (size, *INPUT_SHAPE), self.input_dtype)
            pad[:n] = x
            x = pad
        elif self.input_dtype is not np.float32:
            x = x.astype(self.input_dtype)
        targets, copies = [], []
        wanted = [(POLICY_NAME, policy, (POLICY_SIZE,)), (WDL_NAME, wdl, (3,))]
        if mlh is not None:
            wanted.append((MLH_NAME, mlh, (1,) if self._mlh_rank == 2 else ()))
        for name, out, tail in wanted:
            dtype = self._output_dtypes[name]
            if dtype is np.float32 and size == n:
                buffer = out.reshape((n, *tail))
            else:
                buffer = self._buffer((name, size), (size, *tail), dtype)
                copies.append((out, buffer))
            targets.append((name, buffer))
        session.run_into(x, targets)
        for out, buffer in copies:
            out[...] = buffer[:n].reshape(out.shape)

    def _buffer(self, key, shape: tuple, dtype) -> np.ndarray:
        """This thread's buffer for ``key``, made once: concurrent calls never share one."""
        buffers = self._buffers.__dict__.setdefault("arrays", {})
        array = buffers.get(key)
        if array is None or array.dtype != dtype:
            array = buffers[key] = np.zeros(shape, dtype)
        return array

    # ------------------------------------------------------------------ misc

    def close(self) -> None:
        """Release the sessions (and their GPU memory).  Further evaluations raise ``RuntimeError``."""
        self._session = None
        self._sessions = {}

    def __enter__(self) -> "Network":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Network {self.description}>"
