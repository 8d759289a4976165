"""``cyzero bench mates``: the share of forced mates solved at each node budget
(:mod:`engine.tools.mates`)."""

from __future__ import annotations

import argparse

from engine.tools.bench_common import BenchError, register


def _add_mates_arguments(parser: argparse.ArgumentParser) -> None:
    from engine.tools.mates import add_arguments

    add_arguments(parser)


@register(
    "mates",
    "share of forced mates in 1, 2 and 3 the engine finds at each node budget (engine/tools/mates.epd)",
    _add_mates_arguments,
)
def bench_mates(args: argparse.Namespace) -> int:
    """See :mod:`engine.tools.mates`."""
    from engine.tools.mates import MatesError, run_bench

    try:
        return run_bench(args)
    except MatesError as e:
        raise BenchError(str(e)) from None
