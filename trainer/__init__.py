"""cyzero's training system: model, ONNX export, self-play, replay, DDP learner, daemon.

Everything that needs torch lives here; ``engine`` and ``uci`` never import it.
"""

#: Set by ``cyzero-train run`` for its children, to the daemon's pid: ``cyzero-train`` then
#: stops itself (as on SIGTERM) when that process is gone, so a SIGKILLed daemon leaves no
#: worker or learner behind (``trainer.cli``, ``trainer.lifeline``).
EXIT_WITH_PARENT_ENV = "CYZERO_EXIT_WITH_PARENT"


def usable_cores() -> int:
    """The cores this process may run on: its affinity (``taskset``, a container's cpuset),
    not the machine's count, so processes started under ``taskset -c 1`` size themselves to one."""
    import os

    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # no sched_getaffinity (macOS)
        return max(1, os.cpu_count() or 1)
