"""cyzero's training system: model, ONNX export, self-play, replay, DDP learner, daemon.

Everything that needs torch lives here; ``engine`` and ``uci`` never import it.
"""

#: Set by ``cyzero-train run`` for its children: ``cyzero-train`` then stops itself (as on
#: SIGTERM) when the process that started it is gone, so a SIGKILLed daemon leaves no
#: worker or learner behind (``trainer.cli``).
EXIT_WITH_PARENT_ENV = "CYZERO_EXIT_WITH_PARENT"
