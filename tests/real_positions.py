"""Positions from real games, encoded with their history, for the precision checks.

``tests/data/stockfish-games.pgn``: 24 games between Stockfish levels (UCI_Elo 1400-2800),
made by ``docs/recipes/real-games.py`` with seed 1. Unlike random games, these hold the
positions the engine meets: developed pieces, pawn structures, endgames, a rule50 count.
"""
from __future__ import annotations

import functools
import os

import chess.pgn
import numpy as np

GAMES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "stockfish-games.pgn")


@functools.lru_cache(maxsize=None)
def real_positions(every: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """Every ``every``-th position of each game from its 4th ply on: planes float32
    [N,112,8,8] and legal masks bool [N,1858], from the engine's own encoder."""
    from engine import encoding
    from engine.board import Board

    boards = []
    with open(GAMES, encoding="utf-8") as f:
        while (game := chess.pgn.read_game(f)) is not None:
            board = Board()
            for ply, move in enumerate(game.mainline_moves(), start=1):
                board.push_uci(move.uci())
                if ply >= 4 and ply % every == 0 and board.legal_moves():
                    boards.append(board.copy())
    planes = np.ascontiguousarray(encoding.encode_boards(boards), dtype=np.float32)
    masks = np.stack([np.asarray(encoding.legal_mask(b), dtype=bool) for b in boards])
    return planes, masks
