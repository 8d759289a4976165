"""The ``cyzero`` command.

``cyzero``                          speak UCI on stdin/stdout (the default)
``cyzero perft FEN DEPTH``          count the leaf nodes of the move tree
``cyzero bench BENCHMARK``          speed benchmarks (see ``engine.bench``)

This module only parses arguments and dispatches; the work lives elsewhere.
It is the program's entry point, so it is the one place in ``engine`` that
reaches up to ``uci`` (lazily, only when asked to speak UCI).
"""

from __future__ import annotations

import argparse
import os
import sys

from engine import __version__, bench

STARTPOS_WORD = "startpos"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cyzero",
        description="cyzero, an AlphaZero-style chess engine. "
        "With no command it speaks UCI on stdin/stdout.",
    )
    parser.add_argument("--version", action="version", version=f"cyzero {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    perft = commands.add_parser(
        "perft",
        help="count the leaf nodes of the legal move tree",
        description="Count the leaf nodes of the legal move tree below a position "
        "(bulk counting, Cython core). FEN may be the word 'startpos'; "
        "quote it or give its fields as separate words, then DEPTH.",
    )
    perft.add_argument("position", nargs="+", metavar="FEN DEPTH", help="position, then depth")
    perft.add_argument("--chess960", action="store_true", help="Chess960 castling rules")
    perft.add_argument(
        "--divide",
        action="store_true",
        help="print the count below each root move, then 'Nodes searched: N'",
    )
    perft.set_defaults(func=cmd_perft)

    bench.add_parser(commands)
    return parser


def _error(command: str, message: str) -> int:
    print(f"cyzero {command}: {message}", file=sys.stderr)
    return 2


def _load_board_class():
    try:
        from engine.board import Board
    except ImportError as e:
        raise RuntimeError(f"the Cython core is not built ({e}); run `make build`") from None
    return Board


def cmd_perft(args: argparse.Namespace) -> int:
    *fen_words, depth_text = args.position
    if not fen_words:
        return _error("perft", "expected a FEN (or 'startpos') and a depth")
    try:
        depth = int(depth_text)
    except ValueError:
        return _error("perft", f"depth must be a whole number, got {depth_text!r}")
    if depth < 0:
        return _error("perft", f"depth must be 0 or more, got {depth}")
    fen = " ".join(fen_words)
    try:
        Board = _load_board_class()
    except RuntimeError as e:
        return _error("perft", str(e))
    try:
        board = Board(None if fen == STARTPOS_WORD else fen, chess960=args.chess960)
    except ValueError as e:
        return _error("perft", f"invalid FEN {fen!r}: {e}")

    if not args.divide:
        print(board.perft(depth))
        return 0
    total = 1
    if depth > 0:
        divide = board.perft_divide(depth)
        for move in sorted(divide):
            print(f"{move}: {divide[move]}")
        total = sum(divide.values())
    print()
    print(f"Nodes searched: {total}")
    return 0


def cmd_uci(args: argparse.Namespace | None = None) -> int:
    from uci.__main__ import main as uci_main

    return uci_main()


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command is None:
            return cmd_uci(args)
        return args.func(args)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # e.g. `cyzero perft ... --divide | head`: stop quietly, like other command-line tools
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
