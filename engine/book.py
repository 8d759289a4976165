"""Opening book (Polyglot) and Syzygy tablebases at the root, both through python-chess.

python-chess is imported only when a book or tablebase path is set, so the
engine starts without paying for it.
"""

from __future__ import annotations

import os
import random
from typing import Optional

from engine.board import Board


def to_python_chess(board: Board):
    """The same position as a ``chess.Board`` (history is not needed for book or tablebase probes)."""
    import chess

    return chess.Board(board.fen(), chess960=board.chess960)


def _uci(board: Board, move) -> str:
    """A python-chess move in the board's own UCI notation (Chess960 castling when on)."""
    import chess

    cb = chess.Board(board.fen(), chess960=board.chess960)
    return cb.uci(move, chess960=board.chess960)


class OpeningBook:
    """A Polyglot book; ``move(board)`` picks a weighted random book move or None."""

    def __init__(self, path: str, seed: Optional[int] = None) -> None:
        import chess.polyglot

        if not os.path.isfile(path):
            raise ValueError(f"book file {path!r} does not exist")
        self.path = path
        self._reader = chess.polyglot.open_reader(path)
        self._random = random.Random(seed)

    def move(self, board: Board) -> Optional[str]:
        try:
            entry = self._reader.weighted_choice(to_python_chess(board), random=self._random)
        except IndexError:
            return None
        except (OSError, ValueError):  # a corrupt book: no book move rather than a crash
            return None
        uci = _uci(board, entry.move)
        return uci if board.is_legal(uci) else None

    def close(self) -> None:
        self._reader.close()


class Tablebases:
    """Syzygy WDL/DTZ tables; ``root_moves(board)`` keeps only the moves that preserve the best result."""

    def __init__(self, paths: str) -> None:
        import chess.syzygy

        dirs = [p for p in paths.split(os.pathsep) if p.strip()]
        missing = [p for p in dirs if not os.path.isdir(p)]
        if missing:
            raise ValueError(f"SyzygyPath folder(s) not found: {', '.join(missing)}")
        self._tb = chess.syzygy.Tablebase()
        for d in dirs:
            self._tb.add_directory(d)
        self.max_pieces = self._max_pieces(dirs)

    @staticmethod
    def _max_pieces(dirs: list[str]) -> int:
        best = 0
        for d in dirs:
            for name in os.listdir(d):
                stem, ext = os.path.splitext(name)
                if ext.lower() == ".rtbw":
                    best = max(best, sum(ch.isalpha() for ch in stem))
        return best

    def root_moves(self, board: Board) -> Optional[tuple[list[str], int]]:
        """(moves to search, WDL for the side to move) when the root is in the tables, else None."""
        cb = to_python_chess(board)
        if cb.castling_rights or len(cb.piece_map()) > self.max_pieces:
            return None
        try:
            scored = []
            for move in cb.legal_moves:
                cb.push(move)
                try:
                    wdl = -self._tb.probe_wdl(cb)
                    dtz = self._tb.probe_dtz(cb)
                finally:
                    cb.pop()
                zeroing = cb.is_zeroing(move)
                scored.append((move, wdl, dtz, zeroing))
        except (KeyError, IndexError, OSError, ValueError):  # a table is missing or unreadable
            return None
        if not scored:
            return None
        best = max(s[1] for s in scored)
        keep = [s for s in scored if s[1] == best]
        if best > 0:
            # Winning: make progress towards a zeroing move within the fifty-move rule.
            fastest = min(0 if s[3] else abs(s[2]) for s in keep)
            keep = [s for s in keep if (0 if s[3] else abs(s[2])) == fastest]
        return [cb.uci(s[0], chess960=board.chess960) for s in keep], best

    def close(self) -> None:
        self._tb.close()
