"""``cyzero perft``: count the leaf nodes of the legal move tree with the Cython core."""

from __future__ import annotations

import argparse
import sys

STARTPOS_WORD = "startpos"


def add_parser(commands) -> argparse.ArgumentParser:
    perft = commands.add_parser(
        "perft",
        help="count the leaf nodes of the legal move tree",
        usage="cyzero perft [-h] [--chess960] [--divide] FEN|startpos DEPTH",
        description="Count the leaf nodes of the legal move tree below a position "
        "(bulk counting, Cython core). FEN may be the word 'startpos'; "
        "quote it or give its fields as separate words, then DEPTH.",
    )
    perft.add_argument("position", nargs="+", metavar="FEN|startpos DEPTH", help="position, then depth")
    perft.add_argument("--chess960", action="store_true", help="Chess960 castling rules")
    perft.add_argument(
        "--divide",
        action="store_true",
        help="print the count below each root move, then 'Nodes searched: N'",
    )
    perft.set_defaults(func=main)
    return perft


def _error(message: str) -> int:
    print(f"cyzero perft: {message}", file=sys.stderr)
    return 2


def main(args: argparse.Namespace) -> int:
    *fen_words, depth_text = args.position
    if not fen_words:
        return _error("expected a FEN (or 'startpos') and a depth")
    try:
        depth = int(depth_text)
    except ValueError:
        return _error(f"depth must be a whole number, got {depth_text!r}")
    if depth < 0:
        return _error(f"depth must be 0 or more, got {depth}")
    fen = " ".join(fen_words)
    try:
        from engine.board import Board
    except ImportError as e:
        return _error(f"the Cython core is not built ({e}); run `make build`")
    try:
        board = Board(None if fen == STARTPOS_WORD else fen, chess960=args.chess960)
    except ValueError as e:
        return _error(f"invalid FEN {fen!r}: {e}")

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
