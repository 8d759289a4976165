"""The ``cyzero`` command: the UCI engine, and the tools it dispatches to.

``cyzero``                          speak UCI on stdin/stdout (the default)
``cyzero perft FEN|startpos DEPTH`` count the leaf nodes of the move tree (``engine.tools.perft``)
``cyzero bench BENCHMARK``          speed benchmarks (``engine.tools.bench``)
``cyzero match --engine2 CMD ...``  play two UCI engines against each other (``engine.tools.match``)
``cyzero eval WEIGHTS --positions F`` a network's raw outputs on positions (``engine.tools.network_eval``)

This module only parses arguments and dispatches. Results go to stdout and
progress to stderr in every subcommand. The UCI front end owns the executable,
so the arrows stay one-way: ``uci -> engine`` (docs/architecture.md).
"""

from __future__ import annotations

import argparse
import sys

from engine import __version__
from engine.tools.closed_stdout import quiet_when_reader_gone


def build_parser() -> argparse.ArgumentParser:
    # Imported here: speaking UCI must not pay for python-chess's engine module or numpy.
    from engine.tools import bench, match, network_eval, perft

    parser = argparse.ArgumentParser(
        prog="cyzero",
        description="cyzero, an AlphaZero-style chess engine. "
        "With no command it speaks UCI on stdin/stdout.",
    )
    parser.add_argument("--version", action="version", version=f"cyzero {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    perft.add_parser(commands)
    bench.add_parser(commands)
    match.add_parser(commands)
    network_eval.add_parser(commands)
    return parser


@quiet_when_reader_gone
def main(argv: list[str] | None = None) -> int:
    if not (argv if argv is not None else sys.argv[1:]):
        from uci.__main__ import main as uci_main  # the common case: no argparse, no tools

        return uci_main()
    args = build_parser().parse_args(argv)
    try:
        if args.command is None:
            from uci.__main__ import main as uci_main

            return uci_main()
        return args.func(args)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
