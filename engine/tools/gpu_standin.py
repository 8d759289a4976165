"""A stand-in for ONNX Runtime's CUDA sessions, for machines without a GPU.

It takes the place of the session factory under the real
:class:`engine.network.Network` (``Network(path, backend="cuda",
session_factory=SimulatedGPU())``), so the per-size sessions, the padding and
the warm-up at load are what a test or a benchmark exercises. Its sessions
cost what was measured on an H100 for the 6x64 network bundled then (stages 1-7), or with
the ``h200`` profile half of it (:data:`PROFILES`):

* a fixed cost per call (0.4 ms) and a cost per position (12 us): 74,000
  positions/s at batch 256;
* a long stall (0.5 s) the first time a session sees an input shape, as the
  CUDA provider's re-planning took;
* the time is spent waiting with the GIL released, as a GPU call does, and
  one device serves one call at a time, so two batches in flight overlap the
  gather with the network and not two network calls with each other.

Its outputs cost next to nothing and still make a search play sensible moves:
a uniform policy (all logits 0) and a value from the material on the board
(a queen up is about +0.8). Everything it does is recorded (``calls``,
``stalls``, each session's ``shapes``), so that tests can assert structure
(each session sees one shape, which sizes are used, nothing is planned during
a search) rather than time.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from engine.network import INPUT_NAME, MLH_NAME, POLICY_NAME, PLANES, POLICY_SIZE, WDL_NAME, Network
from engine.sessions import CPU, CUDA

# The 6x64 then bundled, fp16 on an H100 (issue figures): 0.4 ms a call + 12 us a position.
H100_CALL_S = 0.0004
H100_POSITION_S = 12e-6
H100_NEW_SHAPE_S = 0.5
# A faster device, as an H200 (or the next one) runs a small network: half the H100's call
# overhead and per-position cost, about 148,000 positions/s at batch 256. Not measured on an
# H200 (none has run cyzero yet): a profile for asking whether the search keeps up with it.
PROFILES = {
    "h100": (H100_CALL_S, H100_POSITION_S),
    "h200": (H100_CALL_S / 2, H100_POSITION_S / 2),
}
_PIECE_VALUES = np.array([1.0, 3.0, 3.0, 5.0, 9.0, 0.0], np.float32)


@dataclass(frozen=True)
class _Arg:
    """What ONNX Runtime's ``NodeArg`` tells about an input or output."""

    name: str
    type: str
    shape: list


@dataclass(frozen=True)
class Call:
    session: int          # index into SimulatedGPU.sessions
    size: int             # rows in the batch
    start: float          # time.monotonic() when the device took it
    seconds: float        # device time, the stall included


@dataclass
class SimulatedSession:
    """One simulated CUDA session: fixed to ``batch`` rows when made with a batch dimension."""

    gpu: "SimulatedGPU"
    index: int
    batch: Optional[int]
    providers: list
    shapes: set = field(default_factory=set)   # input batch sizes this session has seen
    created: float = field(default_factory=time.monotonic)

    @property
    def inputs(self) -> list:
        return [_Arg(INPUT_NAME, self.gpu.element_type, [self._dim, PLANES, 8, 8])]

    @property
    def outputs(self) -> list:
        kind = self.gpu.element_type
        outs = [_Arg(POLICY_NAME, kind, [self._dim, POLICY_SIZE]), _Arg(WDL_NAME, kind, [self._dim, 3])]
        if self.gpu.mlh:
            outs.append(_Arg(MLH_NAME, kind, [self._dim, 1]))
        return outs

    @property
    def _dim(self):
        return self.batch if self.batch is not None else "batch"

    metadata: dict = field(default_factory=dict)
    producer: str = "cyzero gpu stand-in"

    def run_into(self, planes: np.ndarray, targets: list) -> None:
        n = planes.shape[0]
        if self.batch is not None and n != self.batch:
            raise RuntimeError(f"Got invalid dimensions for input: {INPUT_NAME} index: 0 "
                               f"Got: {n} Expected: {self.batch}")
        self.gpu._run(self, planes, dict(targets))


class SimulatedGPU:
    """A session factory whose sessions behave like ONNX Runtime's CUDA provider on an H100.

    ``call_s``, ``position_s`` and ``new_shape_s`` are the costs described in
    the module docstring; ``mlh`` gives the sessions a moves-left output, ``fp16``
    float16 input and outputs (an fp16 export without ``keep_io_types``);
    a run of more than ``memory_rows`` positions fails as out of memory.
    """

    def __init__(self, call_s: float = H100_CALL_S, position_s: float = H100_POSITION_S,
                 new_shape_s: float = H100_NEW_SHAPE_S, *, mlh: bool = True,
                 memory_rows: Optional[int] = None, fp16: bool = False) -> None:
        self.call_s = call_s
        self.position_s = position_s
        self.new_shape_s = new_shape_s
        self.mlh = mlh
        self.element_type = "tensor(float16)" if fp16 else "tensor(float)"   # an fp16 export's io
        self.memory_rows = memory_rows   # the largest batch whose session fits in memory (None: any)
        self._hiccup: Optional[tuple[float, Optional[int]]] = None
        self.sessions: list[SimulatedSession] = []
        self.calls: list[Call] = []
        self.stalls: list[tuple[float, int, int]] = []   # (when, session, size) of each re-plan
        self._device = threading.Lock()                  # one call on the device at a time

    # -- the factory interface (engine.sessions) ------------------------------------------

    @staticmethod
    def listed() -> list[str]:
        return [CUDA, CPU]

    @staticmethod
    def prepare_gpu() -> None:
        return None

    @staticmethod
    def why_failed(provider: str, error: BaseException | None) -> str:
        return str(error) if error is not None else "not simulated"

    def make(self, data: bytes, provider: str, batch: Optional[int] = None,
             batch_dim: Optional[str] = None) -> SimulatedSession:
        if provider not in (CUDA, CPU):
            raise RuntimeError(f"{provider} is not simulated")
        session = SimulatedSession(self, len(self.sessions), batch if batch_dim else None,
                                   [provider] if provider == CPU else [CUDA, CPU])
        self.sessions.append(session)
        return session

    # -- what happened --------------------------------------------------------------------

    def sizes_used(self, since: float = 0.0) -> dict[int, int]:
        """Calls per batch size since ``since`` (a time.monotonic() value)."""
        used: dict[int, int] = {}
        for call in self.calls:
            if call.start >= since:
                used[call.size] = used.get(call.size, 0) + 1
        return used

    def hiccup(self, seconds: float, size: Optional[int] = None) -> None:
        """Make the next call (of ``size`` rows, if given) take ``seconds`` longer, as when
        another process holds the GPU for a moment."""
        self._hiccup = (seconds, size)

    def seconds_for(self, size: int) -> float:
        """The device time of one call of ``size`` rows at a shape already seen."""
        return self.call_s + size * self.position_s

    # -- running ----------------------------------------------------------------------------

    def _run(self, session: SimulatedSession, planes: np.ndarray, outputs: dict) -> None:
        n = planes.shape[0]
        if self.memory_rows is not None and n > self.memory_rows:   # the arena grows at the first run
            raise RuntimeError("CUDA failure 2: out of memory ; GPU=0 ; expr=cudaMalloc")
        with self._device:
            start = time.monotonic()
            cost = self.seconds_for(n)
            if self._hiccup is not None and self._hiccup[1] in (None, n):
                cost += self._hiccup[0]
                self._hiccup = None
            if n not in session.shapes:
                session.shapes.add(n)
                self.stalls.append((start, session.index, n))
                cost += self.new_shape_s
            _material_outputs(planes, outputs)
            left = cost - (time.monotonic() - start)
            if left > 0:
                time.sleep(left)    # the GIL is free meanwhile, as during a real GPU call
            self.calls.append(Call(session.index, n, start, time.monotonic() - start))


def _material_outputs(planes: np.ndarray, outputs: dict) -> None:
    """A uniform policy and a value from the material of the current position (planes 0-11)."""
    n = planes.shape[0]
    counts = planes[:, :12].reshape(n, 2, 6, 64).sum(axis=3, dtype=np.float32)
    balance = (counts[:, 0] - counts[:, 1]) @ _PIECE_VALUES
    q = np.tanh(balance / 8.0)
    draw = 0.3 * (1.0 - np.abs(q))
    wdl = outputs[WDL_NAME]
    wdl[:, 0] = (1.0 + q) / 2.0 * (1.0 - draw)
    wdl[:, 1] = draw
    wdl[:, 2] = (1.0 - q) / 2.0 * (1.0 - draw)
    outputs[POLICY_NAME].fill(0)
    if MLH_NAME in outputs:
        outputs[MLH_NAME].fill(40.0)


def profile_costs(profile: str) -> tuple[float, float]:
    """(seconds a call, seconds a position) of a profile in :data:`PROFILES`, or a ValueError
    that names them."""
    if profile not in PROFILES:
        raise ValueError(f"no GPU stand-in profile {profile!r}: choose one of {', '.join(PROFILES)}")
    return PROFILES[profile]


def simulated_gpu(profile: str = "h100", **costs) -> SimulatedGPU:
    """The stand-in with a device's costs from :data:`PROFILES` (``costs`` override them)."""
    call_s, position_s = profile_costs(profile)
    return SimulatedGPU(**{"call_s": call_s, "position_s": position_s, **costs})


def simulated_network(path: str | None = None, gpu: Optional[SimulatedGPU] = None, profile: str = "h100",
                      **options) -> tuple[Network, SimulatedGPU]:
    """A real :class:`Network` (the bundled file unless ``path``) on a simulated GPU (``profile``'s
    costs unless ``gpu`` is given)."""
    from engine.weights import default_weights_path

    gpu = gpu or simulated_gpu(profile)
    net = Network(path or default_weights_path(), backend="cuda", session_factory=gpu, **options)
    return net, gpu
