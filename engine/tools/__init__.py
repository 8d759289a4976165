"""Tooling around the engine: benchmarks, matches, perft and the Python PUCT reference.

The ``cyzero`` command (``uci.cli``) dispatches its subcommands here, and the
trainer uses :mod:`engine.tools.match` for gating. The playing engine
(network, search, timeman, weights, book, files) never imports this package;
see docs/architecture.md.
"""
