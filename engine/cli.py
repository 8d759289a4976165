"""The ``cyzero`` command.

``cyzero``                          speak UCI on stdin/stdout (the default)
``cyzero perft FEN DEPTH``          count the leaf nodes of the move tree
``cyzero bench BENCHMARK``          speed benchmarks (see ``engine.bench``)
``cyzero match --engine2 CMD ...``  play two UCI engines against each other (see ``engine.match``)

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
    add_match_parser(commands)
    return parser


def add_match_parser(commands) -> argparse.ArgumentParser:
    match = commands.add_parser(
        "match",
        help="play one UCI engine against another",
        description="Play two UCI engines against each other (engine1 is cyzero unless given): "
        "openings from a bundled balanced set, each played twice with colours reversed; "
        "prints W/L/D from engine1's view, the Elo difference with a 95% interval, LOS, "
        "and time forfeits, illegal moves and crashes per engine. Progress goes to stderr.",
    )
    for n in (1, 2):
        default = "cyzero (the console script next to this Python, or `python -m uci`)" if n == 1 else None
        match.add_argument(
            f"--engine{n}",
            metavar="CMD",
            help=f"engine {n}'s command line, split like a shell does"
            + (f"; default: {default}" if default else "; or use --stockfish-elo"),
        )
        match.add_argument(
            f"--engine{n}-option",
            action="append",
            metavar="NAME=VALUE",
            help=f"set a UCI option of engine {n} (repeatable)",
        )
        match.add_argument(f"--engine{n}-name", metavar="NAME", help=f"engine {n}'s name (default: its `id name`)")
    match.add_argument(
        "--stockfish-elo",
        type=int,
        metavar="ELO",
        help="engine2 is Debian's stockfish (unless --engine2 is given) with UCI_LimitStrength "
        "and this UCI_Elo, clamped into the range the installed stockfish accepts. At fast time "
        "controls also give it --engine2-option 'Move Overhead=100': Stockfish 15.1 at limited "
        "strength can overrun a clock of a fraction of a second",
    )
    match.add_argument("--games", type=int, default=20, metavar="N", help="games to play (default 20)")
    limit = match.add_mutually_exclusive_group()
    limit.add_argument(
        "--tc", default="10+0.1", metavar="BASE+INC", help="clock: base seconds + increment (default 10+0.1)"
    )
    limit.add_argument("--nodes", type=int, metavar="N", help="fixed nodes per move instead of a clock")
    limit.add_argument("--movetime", type=float, metavar="MS", help="fixed time per move instead of a clock")
    match.add_argument("--concurrency", type=int, default=1, metavar="K", help="games at once (default 1)")
    match.add_argument("--openings", metavar="FILE", help="openings: 'ECO | name | moves' lines, FEN/EPD lines or PGN")
    match.add_argument("--pgn", metavar="OUT.pgn", help="write the games here")
    match.add_argument("--seed", type=int, metavar="S", help="seed for the order of the openings (default: random)")
    match.add_argument(
        "--adjudicate-moves",
        type=int,
        default=300,
        metavar="N",
        help="draw after N full moves (default 300; 0: never)",
    )
    match.add_argument(
        "--resign",
        metavar="CP:MOVES",
        help="adjudicate a loss when, for MOVES moves each, the loser's score is -CP or worse "
        "and the winner's +CP or better (default: off)",
    )
    match.add_argument(
        "--time-margin",
        type=float,
        default=0.0,
        metavar="MS",
        help="how late a move may arrive after the clock ran out (default 0)",
    )
    match.add_argument(
        "--guard",
        type=float,
        default=5.0,
        metavar="S",
        help="a move not made within the rest of the clock (or --movetime) plus S seconds is "
        "stopped and loses on time (default 5)",
    )
    match.add_argument(
        "--nodes-guard",
        type=float,
        default=60.0,
        metavar="S",
        help="with --nodes, a move not made within S seconds is stopped and loses on time (default 60)",
    )
    match.add_argument("--event", default="cyzero match", help="the PGN Event tag")
    match.add_argument("--json", action="store_true", help="print one JSON object on stdout and nothing else")
    match.set_defaults(func=cmd_match)
    return match


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


def cmd_match(args: argparse.Namespace) -> int:
    from engine import match  # imported here: python-chess's engine module is not needed to speak UCI

    return match.main(args)


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
