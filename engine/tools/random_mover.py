"""A UCI engine that plays uniformly random legal moves: the floor a learning run is measured from.

``python -m engine.tools.random_mover [--seed S]``. It speaks enough UCI for any GUI or match
runner: ``uci``, ``isready``, ``setoption name Seed value S``, ``ucinewgame``,
``position startpos|fen FEN [moves ...]``, ``go`` with any limits (answered at once; under
``infinite`` or ``ponder`` the move is held back until ``stop`` or ``ponderhit``, as the protocol
asks), ``stop`` and ``quit``. The random stream is seeded once (``--seed`` or the ``Seed``
option) and runs on across games, so a fixed seed gives a reproducible but varied sequence.
Moves come from python-chess, so they are legal by construction.
"""

from __future__ import annotations

import argparse
import random
import sys
from typing import Optional, TextIO

import chess

NAME = "cyzero-random"
SEED_MAX = 2**31 - 1


class RandomMover:
    """The UCI state machine; ``handle`` takes one input line and returns False on ``quit``."""

    def __init__(self, seed: int = 0, out: TextIO = sys.stdout):
        self.out = out
        self.rng = random.Random(seed)
        self.board = chess.Board()
        self.pending: Optional[str] = None  # a bestmove held back by `go infinite` / `go ponder`
        self.pending_ponder = False

    def send(self, line: str) -> None:
        self.out.write(line + "\n")
        self.out.flush()

    def handle(self, line: str) -> bool:
        tokens = line.split()
        if not tokens:
            return True
        command, args = tokens[0], tokens[1:]
        if command == "uci":
            self.send(f"id name {NAME}")
            self.send("id author cyzero")
            self.send(f"option name Seed type spin default 0 min 0 max {SEED_MAX}")
            self.send("uciok")
        elif command == "isready":
            self.send("readyok")
        elif command == "setoption":
            self._setoption(args)
        elif command == "ucinewgame":
            self.board = chess.Board()
        elif command == "position":
            self._position(args)
        elif command == "go":
            move = self._choose()
            if "infinite" in args or "ponder" in args:
                self.pending, self.pending_ponder = move, "ponder" in args and "infinite" not in args
            else:
                self.send(f"bestmove {move}")
        elif command == "ponderhit":
            if self.pending is not None and self.pending_ponder:
                self._flush_pending()
        elif command == "stop":
            self._flush_pending()
        elif command == "quit":
            self._flush_pending()
            return False
        return True  # unknown commands are ignored, as UCI asks

    def _flush_pending(self) -> None:
        if self.pending is not None:
            self.send(f"bestmove {self.pending}")
            self.pending = None

    def _choose(self) -> str:
        moves = list(self.board.legal_moves)
        return self.rng.choice(moves).uci() if moves else "0000"

    def _setoption(self, args: list[str]) -> None:
        text = " ".join(args)
        name, _, value = text.partition(" value ")
        if name.removeprefix("name ").strip().lower() != "seed":
            return
        try:
            seed = int(value.strip())
        except ValueError:
            self.send(f"info string Seed must be an integer, got {value.strip()!r}")
            return
        self.rng.seed(seed)

    def _position(self, args: list[str]) -> None:
        if "moves" in args:
            cut = args.index("moves")
            head, moves = args[:cut], args[cut + 1:]
        else:
            head, moves = args, []
        try:
            if head[:1] == ["startpos"]:
                board = chess.Board()
            elif head[:1] == ["fen"]:
                board = chess.Board(" ".join(head[1:]))
            else:
                raise ValueError("expected startpos or fen")
            for move in moves:
                board.push_uci(move)  # ValueError for an illegal or malformed move
        except ValueError as e:
            self.send(f"info string bad position {' '.join(args)!r}: {e}")
            return
        self.board = board


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.tools.random_mover",
                                     description="A UCI engine that plays uniformly random legal moves.")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random moves (default 0)")
    args = parser.parse_args(argv)
    engine = RandomMover(args.seed)
    for line in sys.stdin:
        if not engine.handle(line):
            break
    return 0


if __name__ == "__main__":
    sys.exit(main())
