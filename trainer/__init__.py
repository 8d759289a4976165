"""cyzero's training system: model, ONNX export, self-play, replay, DDP learner, daemon.

Everything that needs torch lives here; ``engine`` and ``uci`` never import it.
"""
