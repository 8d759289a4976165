"""What the processor can do: its vector instruction sets, read once.

The CPU runtime and precision are chosen from these (:mod:`engine.sessions`), and the
benchmarks print them beside every figure with the share of the core's peak a rate is
(``cyzero bench nn``). On Linux the flags come from ``/proc/cpuinfo``; elsewhere the set
is empty and the choice falls back to what the runtime itself reports.

The peak of one core, in multiply-adds a cycle, is nominal: two vector ports, each
issuing one instruction of the full width every cycle, as Intel's server cores do.

=================  ====================================================  ===========
instruction set    the instruction                                       MACs/cycle
=================  ====================================================  ===========
AMX int8 / bf16    TDPBUSD / TDPBF16PS (Intel's stated 2048 and 1024      1024 / 512
                   operations a cycle)
AVX-512 VNNI int8  VPDPBUSD zmm: 64 u8 x s8 products a port                      128
AVX-512 BF16       VDPBF16PS zmm: 32 products a port                               64
AVX-512 fp32       VFMADD zmm: 16 a port                                           32
AVX-VNNI int8      VPDPBUSD ymm: 32 a port                                         64
AVX2 int8          VPMADDUBSW + VPMADDWD ymm: 32 products in two instructions      32
AVX2 fp32          VFMADD ymm: 8 a port                                            16
=================  ====================================================  ===========

A core that runs AVX-512 on 256-bit units (AMD Zen 4) reaches half its row; the table
says what the instruction set allows, not what one microarchitecture does with it.
"""

from __future__ import annotations

import functools
import os
import platform

__all__ = ["cpuinfo_flags", "isa_cap", "features", "vector_isa", "native_bf16", "has_amx", "clock_ghz", "peak_macs", "describe",
           "usable_core_ids", "usable_cores"]

# MACs a cycle a core, per instruction set and arithmetic (see the module doc).
_PEAK_PER_CYCLE = {
    ("AMX", "int8"): 1024, ("AMX", "bf16"): 512, ("AMX", "fp32"): 32,
    ("AVX-512 VNNI", "int8"): 128, ("AVX-512 VNNI", "fp32"): 32,
    ("AVX-512", "int8"): 64, ("AVX-512", "fp32"): 32,
    ("AVX-VNNI", "int8"): 64, ("AVX-VNNI", "fp32"): 16,
    ("AVX2", "int8"): 32, ("AVX2", "fp32"): 16,
}
_BF16_PER_CYCLE = 64  # AVX-512 BF16 (VDPBF16PS zmm), on a core without AMX


# What oneDNN's ONEDNN_MAX_CPU_ISA cap (which OpenVINO honours) takes away, narrowest first.
_CAPS = (
    ("AVX2", ("avx512", "amx", "avx_vnni")),
    ("AVX2_VNNI", ("avx512", "amx")),
    ("AVX512_CORE", ("avx512_vnni", "avx512_bf16", "amx")),
    ("AVX512_CORE_VNNI", ("avx512_bf16", "amx")),
    ("AVX512_CORE_BF16", ("amx",)),
)


@functools.lru_cache(maxsize=1)
def cpuinfo_flags() -> frozenset[str]:
    """The processor's flags as Linux names them (``avx2``, ``avx512_vnni``, ``amx_bf16``...);
    empty where ``/proc/cpuinfo`` does not say. ONNX Runtime's CPU path uses all of them."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def isa_cap() -> str:
    """``ONEDNN_MAX_CPU_ISA`` where it is set to a cap this module knows, else ``""``."""
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper()
    return cap if any(cap == name for name, _ in _CAPS) else ""


def features() -> frozenset[str]:
    """:func:`cpuinfo_flags` less what ``ONEDNN_MAX_CPU_ISA`` caps away: the instruction sets
    OpenVINO may use, so that a narrower machine can be measured on a wider one, the choices
    following the cap (ONNX Runtime's CPU path knows no such cap)."""
    flags, cap = cpuinfo_flags(), isa_cap()
    for name, removed in _CAPS:
        if cap == name:
            flags = frozenset(f for f in flags if not f.startswith(removed))
    return flags


def has_amx(flags: frozenset[str] | None = None) -> bool:
    flags = features() if flags is None else flags
    return "amx_bf16" in flags and "amx_tile" in flags


def native_bf16(flags: frozenset[str] | None = None) -> bool:
    """Whether bfloat16 arithmetic runs in hardware (AMX or AVX-512 BF16), not emulated: an
    emulated bf16 ran the bundled network at 302 positions/s against 1,783 native."""
    flags = features() if flags is None else flags
    return has_amx(flags) or "avx512_bf16" in flags


def vector_isa(flags: frozenset[str] | None = None) -> str:
    """The widest instruction set the network's arithmetic can use: ``AMX``, ``AVX-512 VNNI``,
    ``AVX-512``, ``AVX-VNNI``, ``AVX2``, or ``unknown``."""
    flags = features() if flags is None else flags
    if has_amx(flags):
        return "AMX"
    if "avx512_vnni" in flags:
        return "AVX-512 VNNI"
    if "avx512bw" in flags:
        return "AVX-512"
    if "avx_vnni" in flags:
        return "AVX-VNNI"
    if "avx2" in flags:
        return "AVX2"
    return "unknown"


def clock_ghz() -> float | None:
    """The first core's clock as Linux reports it (``cpu MHz``), or None."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("cpu MHz"):
                    return float(line.split(":", 1)[1]) / 1000.0
    except (OSError, ValueError):
        pass
    return None


def peak_macs(arithmetic: str, flags: frozenset[str] | None = None,
              ghz: float | None = None) -> float | None:
    """One core's nominal peak in multiply-adds a second for ``arithmetic`` (``int8``,
    ``bf16`` or ``fp32``) on this processor, or None where it is not known."""
    flags = features() if flags is None else flags
    ghz = clock_ghz() if ghz is None else ghz
    isa = vector_isa(flags)
    if ghz is None or isa == "unknown":
        return None
    if arithmetic == "bf16":
        if isa == "AMX":
            per_cycle = _PEAK_PER_CYCLE[("AMX", "bf16")]
        elif native_bf16(flags):
            per_cycle = _BF16_PER_CYCLE
        else:
            return None
    else:
        per_cycle = _PEAK_PER_CYCLE.get((isa, arithmetic))
        if per_cycle is None:
            return None
    return per_cycle * ghz * 1e9


def usable_core_ids() -> list[int]:
    """The cores this process may run on, in order: its affinity (``taskset``, a container's
    cpuset, a tournament manager's pinning), not the machine's count; every core where there is
    no affinity (macOS)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def usable_cores() -> int:
    """How many cores this process may run on (:func:`usable_core_ids`), so that processes started
    under ``taskset -c 1`` size themselves to one."""
    return max(1, len(usable_core_ids()))


def describe(flags: frozenset[str] | None = None) -> str:
    """One line for a figure's machine: ``x86_64 AVX-512 VNNI, AVX-512 BF16, 2 cores at 2.6 GHz``
    (and, under a cap, ``; OpenVINO held to AVX2``)."""
    capped = flags is None and isa_cap()
    flags = cpuinfo_flags() if flags is None else flags
    parts = [vector_isa(flags)]
    if native_bf16(flags) and not has_amx(flags):
        parts.append("AVX-512 BF16")
    if "amx_int8" in flags:
        parts.append("AMX int8")
    ghz = clock_ghz()
    cores = usable_cores()
    clock = f" at {ghz:.1f} GHz" if ghz else ""
    held = f"; OpenVINO held to {vector_isa()} (ONEDNN_MAX_CPU_ISA)" if capped else ""
    return f"{platform.machine()} {', '.join(parts)}, {cores} cores{clock}{held}"
