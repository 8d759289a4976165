"""cyzero's playing engine: an AlphaZero-style chess engine on a Cython core.

The hot work (board, move generation, input encoding, MCTS tree) lives in
extension modules built from ``cython_src/`` into this package
(``engine.board``, ...); ONNX Runtime evaluates the network.

Nothing in this package imports torch or ``trainer``, so the engine starts
quickly and installs without torch.
"""

__version__ = "0.1.0"
