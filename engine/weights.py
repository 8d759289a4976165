"""Locating and verifying networks: which file a ``WeightsFile`` names, and building a verified candidate.

    >>> builder = NetworkBuilder(backend="cpu", log=print)
    >>> candidate = builder.load_weights_file(resolve_weights("<default>"))
    >>> candidate.label(long=True)
    'default.onnx sha256:1e24186e84ad CPU fp32 6x64, float32 io'

Every candidate is built by ``loader`` (:class:`engine.network.Network`, which
checks the I/O contract and warms up) with one set of settings (backend,
device, threads), then evaluated once more on the start position
(:func:`verify_network`: finite outputs, a WDL that sums to 1).  Where new
candidates come from is :mod:`engine.watchers`; when they are put in use is
:mod:`engine.swap`; :mod:`engine.network_manager` puts the three together.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any, Callable, Optional

import numpy as np

from engine.files import read_sha256, sha256_file, sha256_path
from engine.network import CPU, CUDA, OPENVINO, POLICY_SIZE, Network, NetworkError

__all__ = [
    "DEFAULT_WEIGHTS",
    "Candidate",
    "NetworkBuilder",
    "NoNetworkError",
    "WeightsError",
    "bundled_variant_path",
    "default_weights_path",
    "read_side_digest",
    "resolve_weights",
    "verify_network",
    "weights_path",
]

DEFAULT_WEIGHTS = "<default>"  # names the bundled network (as does an empty value, the UCI default)

_logger = logging.getLogger(__name__)


class WeightsError(ValueError):
    """A ``WeightsFile``, ``TrainerEndpoint`` or ``TrainerKeys`` value that cannot be used."""


class NoNetworkError(NetworkError):
    """No network could be loaded at all; the message is why (the UCI layer says
    ``info string error: no network loaded: <why>`` and answers ``bestmove 0000``)."""


# --------------------------------------------------------------------------- locating


def default_weights_path() -> str:
    """The bundled network, ``engine/nets/default.onnx`` (next to this package)."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "nets", "default.onnx")


#: The bundled network's file for each provider, next to ``default.onnx``: fp16 on CUDA
#: (as lc0 runs its nets on GPUs) and int8 on ONNX Runtime's CPU path, where it evaluates
#: about twice as many positions a second and beat fp32 38-19-3 at 10+0.1
#: (engine/nets/PROVENANCE.md); TensorRT takes the fp32 file and builds its own fp16 engine
#: from it. OpenVINO's file depends on the processor: :func:`bundled_variant_path`.
BUNDLED_VARIANTS = {CUDA: "default.fp16.onnx", CPU: "default.int8.onnx"}


def bundled_variant_path(provider: str) -> Optional[str]:
    """The bundled network's file for ``provider``, or None where that is ``default.onnx``.

    OpenVINO runs the fp32 file in bfloat16 on a processor with AMX, which ran it 1.8x
    faster than the int8 file there; elsewhere the int8 file, which was the faster one on
    AVX-512 VNNI (with or without AVX-512 BF16) and AVX2 (docs/cpu.md)."""
    from engine import processor

    if provider == OPENVINO:
        name = None if processor.has_amx() else BUNDLED_VARIANTS[CPU]
    else:
        name = BUNDLED_VARIANTS.get(provider)
    return os.path.join(os.path.dirname(default_weights_path()), name) if name else None


def planned_cpu_provider(backend: str) -> Optional[str]:
    """The CPU provider ``backend`` lands on when that is known before a load (``cpu``,
    ``openvino``, or ``auto`` where no GPU provider is listed), else None: a GPU backend, or
    ``auto`` with a GPU provider listed, which only a load can tell."""
    from engine.sessions import available_providers, gpu_attempts, openvino_missing

    if backend == "cpu":
        return CPU
    if backend == "openvino" or (backend == "auto" and not gpu_attempts("auto", available_providers())):
        return OPENVINO if openvino_missing() is None else CPU
    return None


def weights_path(value: str | os.PathLike | None) -> str:
    """The absolute path a ``WeightsFile`` value names, whether or not there is a file there.

    ``"<default>"``, an empty value or ``None`` name the bundled network;
    anything else is a path (``~`` expanded, relative to the working directory).
    """
    text = "" if value is None else os.fspath(value).strip()
    if text == "" or text.lower() == DEFAULT_WEIGHTS:
        return default_weights_path()
    return os.path.abspath(os.path.expanduser(text))


def resolve_weights(value: str | os.PathLike | None) -> str:
    """:func:`weights_path`, checked: raises :class:`WeightsError` if there is no such file."""
    path = weights_path(value)
    if path == default_weights_path() and not os.path.isfile(path):
        raise WeightsError(
            f"the bundled network is missing: {path} (an incomplete install? reinstall cyzero, "
            f"or set WeightsFile to an .onnx or lc0 .pb.gz network)"
        )
    if not os.path.exists(path):
        raise WeightsError(f"WeightsFile not found: {path}")
    if os.path.isdir(path):
        raise WeightsError(f"WeightsFile is a directory, not a network file: {path}")
    return path


def read_side_digest(path: str) -> Optional[str]:
    """The digest in ``path.sha256``, ``None`` without one; :class:`NetworkError` when it is unreadable."""
    try:
        return read_sha256(path)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise NetworkError(f"{os.path.basename(path)}: unusable sha256 side file: {e}") from None


# --------------------------------------------------------------------------- verification


def verify_network(network: Any) -> None:
    """One test evaluation of the start position; raises :class:`NetworkError` if it looks wrong.

    Checks that the policy is [1,1858] and finite, the WDL [1,3], finite,
    non-negative and summing to 1, and the moves-left output (if any) finite.
    """
    from engine.encoding import encode_position  # the Cython encoder, on first use only

    name = getattr(network, "name", "the network")
    planes = np.ascontiguousarray(encode_position(), dtype=np.float32)[None]
    try:
        policy, wdl, mlh = network.evaluate(planes)
    except NetworkError:
        raise
    except Exception as e:  # noqa: BLE001 - whatever the runtime says, the network is unusable
        raise NetworkError(f"{name}: the test evaluation failed: {type(e).__name__}: {e}") from None
    policy = np.asarray(policy, dtype=np.float64)
    wdl = np.asarray(wdl, dtype=np.float64)
    if policy.shape != (1, POLICY_SIZE) or wdl.shape != (1, 3):
        raise NetworkError(
            f"{name}: the test evaluation gave policy {list(policy.shape)} and wdl {list(wdl.shape)}, "
            f"expected [1,{POLICY_SIZE}] and [1,3]"
        )
    if not (np.isfinite(policy).all() and np.isfinite(wdl).all()):
        raise NetworkError(f"{name}: the outputs for the start position are not finite (NaN or inf)")
    if mlh is not None and not np.isfinite(np.asarray(mlh, dtype=np.float64)).all():
        raise NetworkError(f"{name}: the moves-left output for the start position is not finite")
    total = float(wdl.sum())
    if (wdl < -1e-6).any() or abs(total - 1.0) > 1e-2:
        raise NetworkError(
            f"{name}: the WDL for the start position is not a probability distribution "
            f"({', '.join(f'{v:.4g}' for v in wdl[0])}, sum {total:.4g})"
        )


# --------------------------------------------------------------------------- candidates


def short_sha(sha: Optional[str]) -> str:
    return f"{sha[:12]}..." if sha else "?"


def without_file_name(message: str, path: str) -> str:
    """``message`` without a leading ``"<file name>: "`` (the caller names the file already)."""
    name = os.path.basename(path)
    return message[len(name) + 2 :] if message.startswith(name + ": ") else message


@dataclasses.dataclass
class Candidate:
    """A verified network with where it came from; ``path`` is the file the user named or the
    daemon announced (a fetched copy is loaded from the cache, but this is what is reported)."""

    network: Any
    sha256: str
    path: str
    generation: Optional[int] = None
    run: Optional[str] = None
    source: Optional[str] = None    # the local file it was built from (a reload builds it again)

    def label(self, long: bool = False) -> str:
        """``long``: the network's own description (provider, size); otherwise name and sha256."""
        if long:
            text = getattr(self.network, "description", None) or (
                f"{os.path.basename(self.path)} sha256:{self.sha256[:12]}"
            )
        else:
            text = f"{os.path.basename(self.path)} (sha256 {short_sha(self.sha256)})"
        if self.generation is not None:
            text += f", generation {self.generation}"
        if self.run:
            text += f", run {self.run}"
        return text


def close_quietly(network: Any) -> None:
    """Release a network that was never handed out (a refused or superseded candidate)."""
    close = getattr(network, "close", None)
    if close is not None:
        try:
            close()
        except Exception:  # noqa: BLE001
            pass


class NetworkBuilder:
    """Builds verified :class:`Candidate` networks, all with the same settings.

    ``loader(path, backend=, device_id=, intra_threads=, log=, expected_sha256=, **options)``
    returns a network (:class:`engine.network.Network`; tests pass fakes).
    ``threads`` is ONNX Runtime's intra-op thread count (``None`` or 0: its
    default); ``options`` more keyword arguments (``max_batch``, ``trt_fp16``...).
    ``log`` is called from any thread; each distinct loader line is passed on
    once (one GPU-fallback line, not one per load).
    """

    def __init__(
        self,
        loader: Callable[..., Any] = Network,
        *,
        backend: str = "auto",
        device_id: int = 0,
        threads: Optional[int] = None,
        options: Optional[dict] = None,
        log: Optional[Callable[[str], object]] = None,
    ) -> None:
        self.loader = loader
        self.backend = backend
        self.device_id = device_id
        self.threads = threads
        self.options = dict(options or {})
        self._log = log if log is not None else _logger.warning
        self._said: set[str] = set()

    def _loader_log(self, text: str) -> None:
        if text not in self._said:
            self._said.add(text)
            self._log(text)

    def build(
        self,
        path: str,
        expected_sha256: Optional[str] = None,
        *,
        generation: Optional[int] = None,
        run: Optional[str] = None,
        reported_path: Optional[str] = None,
        log: Optional[Callable[[str], object]] = None,
    ) -> Candidate:
        """Load ``path`` (held to ``expected_sha256`` if given) and verify it; raises
        :class:`NetworkError`. The loader's lines go to ``log`` (default: on, once each)."""
        network = self.loader(
            path,
            backend=self.backend,
            device_id=self.device_id,
            intra_threads=self.threads or None,
            log=log or self._loader_log,
            expected_sha256=expected_sha256,
            **self.options,
        )
        try:
            verify_network(network)
        except BaseException:
            close_quietly(network)
            raise
        sha = getattr(network, "sha256", None) or expected_sha256
        if not sha:
            sha = sha256_file(path) or ""  # (not cancellable here: never None)
        return Candidate(network, sha, reported_path or path, generation, run, source=path)

    def load_weights_file(self, path: str) -> Candidate:
        """The first load of a ``WeightsFile``: held to its ``.sha256`` side file when there is one.

        The bundled network is loaded in the variant for the provider it lands on
        (:func:`bundled_variant_path`): straight away where the backend says which provider
        that is (:func:`planned_cpu_provider`), else after a first load of ``default.onnx``
        has told."""
        if path != default_weights_path():
            return self._load_held_to_side_file(path)
        planned = planned_cpu_provider(self.backend)
        first = (planned and bundled_variant_path(planned)) or path
        if not os.path.isfile(first):
            first = path
        held: list[str] = []    # the first load's lines: a reload says the same, for its own file
        try:
            candidate = self._load_held_to_side_file(first, held.append)
        except NetworkError as e:
            if first == path:
                raise
            self._loader_log(f"{os.path.basename(first)} unusable, staying on {os.path.basename(path)}: {e}")
            return self._load_held_to_side_file(path)
        variant = bundled_variant_path(getattr(candidate.network, "provider", "")) or path
        if variant == first or not os.path.isfile(variant):
            for line in held:
                self._loader_log(line)
            return candidate
        try:
            better = self._load_held_to_side_file(variant)
        except NetworkError as e:
            for line in held:
                self._loader_log(line)
            self._loader_log(f"{os.path.basename(variant)} unusable, staying on {os.path.basename(first)}: {e}")
            return candidate
        close_quietly(candidate.network)
        return better

    def _load_held_to_side_file(self, path: str, log: Optional[Callable[[str], object]] = None) -> Candidate:
        side = read_side_digest(path)
        try:
            return self.build(path, side, log=log)
        except NetworkError as e:
            if side is not None and "sha256 mismatch" in str(e):
                raise NetworkError(
                    f"{e} recorded in {os.path.basename(sha256_path(path))} (a truncated or "
                    f"replaced file? if it was replaced on purpose, update or delete the .sha256 file)"
                ) from None
            raise
