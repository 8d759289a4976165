"""What every ``cyzero bench`` benchmark shares: the registry its subcommand joins, its error,
the ``--json``/``--seconds`` arguments, the JSON facts of a run, its report (the JSON object or
the text), and small helpers."""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import platform
import time
from dataclasses import dataclass
from typing import Callable, Iterable

from engine import __version__


class BenchError(Exception):
    """A benchmark could not produce a trustworthy result (e.g. node counts disagree)."""


@dataclass(frozen=True)
class Benchmark:
    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


BENCHMARKS: dict[str, Benchmark] = {}


def register(name: str, help: str, add_arguments: Callable[[argparse.ArgumentParser], None]):
    """Decorator: register ``run(args) -> exit code`` as ``cyzero bench <name>``."""

    def decorator(run: Callable[[argparse.Namespace], int]):
        if name in BENCHMARKS:
            raise ValueError(f"benchmark {name!r} registered twice")
        BENCHMARKS[name] = Benchmark(name, help, add_arguments, run)
        return run

    return decorator


def json_and_seconds(parser: argparse.ArgumentParser, seconds: float, what: str) -> None:
    parser.add_argument(
        "--json", action="store_true", help="print one JSON object on stdout and nothing else"
    )
    parser.add_argument(
        "--seconds",
        type=positive_float,
        default=seconds,
        metavar="S",
        help=f"target time of each {what} in seconds (default {seconds})",
    )


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be a positive number: {text!r}")
    return value


def report(args: argparse.Namespace, summary: dict, text: Callable[[dict], Iterable[str]]) -> int:
    """A bench's last words: with ``--json`` the summary alone, one JSON object on stdout; else
    the lines of ``text(summary)``, its reading for a person. Returns the exit code, 0."""
    if args.json:
        print(json.dumps(summary))
    else:
        for line in text(summary):
            print(line)
    return 0


def run_facts(started: float) -> dict:
    """The JSON keys every timed bench ends with: how long it ran (from ``started``, a
    time.perf_counter() value) and where."""
    return {"wall_seconds": round(time.perf_counter() - started, 3),
            "environment": {**environment(), "cpu_count": os.cpu_count()}}


def environment() -> dict:
    import chess

    return {
        "cyzero_version": __version__,
        "python_chess_version": chess.__version__,
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "machine": platform.machine(),
        "system": platform.system(),
    }


def fmt_int(n: float) -> str:
    return f"{int(round(n)):,}"


def require_core(module: str) -> None:
    """BenchError with the fix when the Cython core is not built."""
    try:
        importlib.import_module(module)
    except ImportError as e:
        raise BenchError(f"the Cython core is not built ({e}); run `make build`") from None


def batch_list(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(sorted({int(word) for word in text.replace(" ", "").split(",") if word}))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected whole numbers separated by commas: {text!r}"
        ) from None
    if not sizes or sizes[0] < 1:
        raise argparse.ArgumentTypeError(f"batch sizes must be 1 or more: {text!r}")
    return sizes
