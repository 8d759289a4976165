"""Shared python-chess helpers for the board tests.

python-chess (``chess``) is the trusted rules reference: everything the Cython
core (``engine.board``) computes is compared against what python-chess says
about the same position.
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import chess


def ref_perft(board: chess.Board, depth: int) -> int:
    """Leaf count of the legal move tree, with bulk counting at depth 1."""
    if depth == 0:
        return 1
    if depth == 1:
        return board.legal_moves.count()
    nodes = 0
    for move in board.generate_legal_moves():
        board.push(move)
        nodes += ref_perft(board, depth - 1)
        board.pop()
    return nodes


def ref_perft_divide(board: chess.Board, depth: int) -> Dict[str, int]:
    """Per root move (UCI, chess960-aware like the core) -> perft(depth - 1) below it."""
    assert depth >= 1
    result = {}
    for move in board.generate_legal_moves():
        uci = board.uci(move)
        board.push(move)
        result[uci] = ref_perft(board, depth - 1)
        board.pop()
    return result


def ref_legal_ucis(board: chess.Board) -> set:
    """Legal moves as UCI strings; castling as king-takes-rook iff board.chess960."""
    return {board.uci(m) for m in board.generate_legal_moves()}


def outcome_tuple(outcome: Optional[chess.Outcome]) -> Optional[Tuple[str, Optional[bool]]]:
    """chess.Outcome -> (termination name in lower case, winner), the core's format."""
    if outcome is None:
        return None
    return (outcome.termination.name.lower(), outcome.winner)


def position_key(fen: str) -> str:
    """The first four FEN fields (board, turn, castling, en passant): the position
    without the move counters, as used for repetition and hashing."""
    return " ".join(fen.split()[:4])


def ref_accepts(fen: str, chess960: bool) -> Optional[chess.Board]:
    """python-chess's verdict on a FEN: the board if it parses and is_valid(), else None."""
    try:
        board = chess.Board(fen, chess960=chess960)
    except ValueError:
        return None
    return board if board.is_valid() else None


# Chess960 positions (suite positions and castling corner cases) shared by the differential tests.
CHESS960_FENS = {
    "960_id0": "bqnb1rkr/pp3ppp/3ppn2/2p5/5P2/P2P4/NPP1P1PP/BQ1BNRKR w HFhf - 2 9",
    "960_id17": "bnqnrbkr/1pp2pp1/p7/3pP2p/4P1P1/8/PPPP3P/BNQNRBKR w HEhe d6 0 9",
    "960_id20": "n1bb1rkr/qpnppppp/2p5/p7/P1P5/5P2/1P1PPRPP/NQBBN1KR w Hhf - 1 9",
    "960_id93": "nnrkrbbq/pppp2pp/8/4pp2/4P3/P7/1PPPBPPP/NNKRR1BQ w c - 0 9",
    "960_castle_over_rook": "1r2k1r1/pppppppp/8/8/8/8/PPPPPPPP/1R2K1R1 w GBgb - 0 1",
    "960_king_b": "rk5r/pppppppp/8/8/8/8/PPPPPPPP/RK5R w KQkq - 0 1",
}
