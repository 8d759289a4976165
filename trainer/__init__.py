"""cyzero's training system: model, ONNX export, self-play, replay, DDP learner, daemon.

Everything that needs torch lives here; ``engine`` and ``uci`` never import it.
"""

#: Set by ``cyzero-train run`` for its children, to the daemon's pid: ``cyzero-train`` then
#: stops itself (as on SIGTERM) when that process is gone, so a SIGKILLed daemon leaves no
#: worker or learner behind (``trainer.cli``, ``trainer.lifeline``).
EXIT_WITH_PARENT_ENV = "CYZERO_EXIT_WITH_PARENT"
