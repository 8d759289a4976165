"""Where the training system runs: one device grammar for the self-play workers, the learner and
the daemon, and the cores this process may use (counted by engine.processor, as the engine counts them).

A device list is comma-separated: ``cpu``, ``cpu:N`` (N processes: the learner's ranks),
``cuda`` and ``cuda:N``, and after a GPU a bare index (``cuda:0,1`` is ``cuda:0,cuda:1``).
Self-play runs one worker process per device (:func:`selfplay_devices`); the learner runs
its ranks on the CPU or on GPUs, not both (:func:`learner_devices`). Importing this module
imports no torch: only :func:`check_cuda`, which asks torch for this machine's GPUs, does.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

from engine.processor import usable_core_ids, usable_cores  # the engine's, for the trainer's callers

__all__ = ["Devices", "NO_LEARNER", "selfplay_devices", "learner_devices", "learner_ranks", "check_cuda",
           "usable_cores", "usable_core_ids"]

NO_LEARNER = "none"  # daemon.learner_devices for a daemon that starts no learner (one runs elsewhere)

_ITEM = re.compile(r"(cpu|cuda)(?::(\d+))?")


def _items(spec: str, flag: str) -> list[tuple[str, int | None]]:
    """``spec`` as ``(kind, number)`` pairs (number None where none is given); ValueError naming
    ``flag`` (the option or config key the spec came from) for anything else."""
    text = spec.strip().lower() if isinstance(spec, str) else ""
    items: list[tuple[str, int | None]] = []
    for part in (p.strip() for p in text.split(",")):
        match = _ITEM.fullmatch(part)
        if match is not None:
            items.append((match.group(1), None if match.group(2) is None else int(match.group(2))))
        elif part.isdigit() and items and items[-1][0] == "cuda":  # cuda:0,1
            items.append(("cuda", int(part)))
        else:
            raise ValueError(f"{flag} {spec!r}: expected cpu, cpu:N (N learner processes) or cuda:0,1,... "
                             "(GPU indices)")
    return items


def selfplay_devices(spec: str, flag: str = "--devices") -> list[str]:
    """The self-play devices, one worker process each: ``cpu`` and ``cuda:N`` (``cuda`` is
    ``cuda:0``); ValueError for a count on the CPU or a device named twice."""
    out = []
    for kind, number in _items(spec, flag):
        if kind == "cpu" and number is not None:
            raise ValueError(f"{flag} {spec!r}: self-play runs one worker a device ({kind}:{number} is a "
                             "learner's ranks; daemon.workers_per_device sets how many)")
        out.append("cpu" if kind == "cpu" else f"cuda:{number or 0}")
    if len(set(out)) != len(out):
        raise ValueError(f"{flag} {spec!r}: a device named twice")
    return out


@dataclasses.dataclass(frozen=True)
class Devices:
    """Where the learner's ranks run: ``kind`` "cpu" or "cuda", and one entry per rank (GPU index on CUDA)."""

    kind: str
    ids: tuple[int, ...]

    @property
    def world(self) -> int:
        return len(self.ids)


def _learner_items(spec: str, flag: str) -> tuple[str, tuple[int, ...] | None]:
    """The learner's ``(kind, ids)`` without asking torch: ``cpu[:N]`` is N ranks (range(N)),
    ``cuda`` every visible GPU (None), ``cuda:0,1`` those."""
    items = _items(spec, flag)
    kinds = {kind for kind, _ in items}
    if kinds == {"cpu"} and len(items) == 1:
        n = 1 if items[0][1] is None else items[0][1]
        if n < 1:
            raise ValueError(f"{flag} {spec}: need at least one CPU process")
        return "cpu", tuple(range(n))
    if kinds != {"cuda"}:
        raise ValueError(f"{flag} {spec!r}: the learner runs on one cpu:N or on GPUs (cuda:0,1,...)")
    if items == [("cuda", None)]:
        return "cuda", None
    if any(number is None for _, number in items):
        raise ValueError(f"{flag} {spec!r}: name every GPU by its index (cuda:0,1,...) or none (cuda: every one)")
    return "cuda", tuple(number for _, number in items if number is not None)


def learner_devices(spec: str, flag: str = "--devices") -> Devices:
    """``cpu``, ``cpu:N`` (N gloo processes), ``cuda`` (every visible GPU) or ``cuda:0,1`` (nccl),
    the GPUs checked against this machine's (:func:`check_cuda`); ValueError naming ``flag``."""
    kind, ids = _learner_items(spec, flag)
    if kind == "cpu":
        assert ids is not None
        return Devices("cpu", ids)
    return Devices("cuda", check_cuda(spec, ids, flag))


def learner_ranks(spec: str) -> dict[str, int]:
    """The learner's ranks per device, as the daemon shares the machine out: ``cpu:N`` is N ranks
    on the CPU, ``cuda:0,1`` one rank a GPU (``cuda``: ``cuda:0``), :data:`NO_LEARNER` none here.
    Lenient (the daemon has checked the spec with :func:`learner_devices` at start)."""
    text = str(spec).strip().lower()
    if text == NO_LEARNER:
        return {}
    if text == "cpu" or text.startswith("cpu:"):
        count = text.partition(":")[2]
        return {"cpu": int(count) if count.isdigit() and int(count) > 0 else 1}
    return {device: 1 for device in selfplay_devices(text)}


def check_cuda(spec: str, ids: Sequence[int] | None, flag: str = "--devices") -> tuple[int, ...]:
    """The GPU indices ``ids`` (None: every visible one), checked against this machine's CUDA
    devices; ValueError, one line naming ``flag`` and ``spec``, when there is no CUDA or no such GPU.
    ``cyzero-train run`` checks its self-play and learner devices with it before it starts anything."""
    import torch  # here: the grammar above is read by processes that never import torch

    if not torch.cuda.is_available():
        raise ValueError(f"{flag} {spec}: no CUDA device here (torch {torch.__version__}, "
                         f"CUDA build {torch.version.cuda or 'none'})")
    count = torch.cuda.device_count()
    ids = tuple(range(count)) if ids is None else tuple(ids)
    if len(set(ids)) != len(ids):
        raise ValueError(f"{flag} {spec}: a GPU is named twice")
    missing = [i for i in ids if i >= count]
    if missing:
        raise ValueError(f"{flag} {spec}: no GPU {missing[0]} (this machine has {count})")
    return ids


