"""Plain-Python reference for the lc0 "classical" (112-plane) input encoding and
the 1858-entry policy map, written on python-chess for clarity, not speed.

It is written from the contract in docs/contracts.md ("The network") and lc0's classical
input format, independently of ``cython_src/encoding.pyx``, so that the
differential tests in ``test_encoding.py`` compare two separate readings of the
same contract.

Conventions
-----------
* Squares: a1=0, b1=1, ..., h1=7, a2=8, ..., h8=63 (python-chess's numbering).
* Planes: ``planes[k, rank, file]``; rank 0 is the first rank of the side to
  move (the board is mirrored vertically, file kept, when black is to move).
* History: 8 slots of 13 planes, slot 0 = current position, slot i = the
  position i plies earlier.  In every slot planes 0-5 are the pieces
  (P N B R Q K) of the side to move *now*, planes 6-11 the opponent's, all
  seen from the current side to move; plane 12 is all ones when that slot's
  position occurred earlier in the game.
* Aux planes: 104 us O-O-O, 105 us O-O, 106 them O-O-O, 107 them O-O,
  108 black to move, 109 rule50 (raw), 110 zeros, 111 ones.
* Missing history (lc0 ``fen_only``): game from the standard start -> zeros;
  game from any other FEN -> the oldest position's planes repeated (repetition
  plane 0), with the double-pushed pawn put back when that FEN has an
  en-passant square.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import chess
import numpy as np

PLANES = 112
POLICY_SIZE = 1858
HISTORY = 8
PLANES_PER_POSITION = 13
AUX_BASE = HISTORY * PLANES_PER_POSITION  # 104

PIECE_ORDER = (chess.PAWN, chess.KNIGHT, chess.BISHOP, chess.ROOK, chess.QUEEN, chess.KING)
PROMOTION_SUFFIXES = ("q", "r", "b")

KNIGHT_DELTAS = ((1, 2), (2, 1), (2, -1), (1, -2), (-1, -2), (-2, -1), (-2, 1), (-1, 2))
QUEEN_DIRECTIONS = ((1, 0), (-1, 0), (0, 1), (0, -1), (1, 1), (1, -1), (-1, 1), (-1, -1))


# --------------------------------------------------------------------------- policy map


def _square(file: int, rank: int) -> int:
    return rank * 8 + file


def _is_queen_line(from_sq: int, to_sq: int) -> bool:
    """1-7 squares along a rank, file or diagonal."""
    df = chess.square_file(to_sq) - chess.square_file(from_sq)
    dr = chess.square_rank(to_sq) - chess.square_rank(from_sq)
    if df == 0 and dr == 0:
        return False
    return df == 0 or dr == 0 or abs(df) == abs(dr)


def _is_knight_jump(from_sq: int, to_sq: int) -> bool:
    df = abs(chess.square_file(to_sq) - chess.square_file(from_sq))
    dr = abs(chess.square_rank(to_sq) - chess.square_rank(from_sq))
    return (df, dr) in ((1, 2), (2, 1))


def reference_policy_index() -> List[str]:
    """The 1858 policy entries as UCI strings, from white's view, in lc0 order."""
    entries: List[str] = []
    for from_sq in range(64):
        for to_sq in range(64):
            if _is_queen_line(from_sq, to_sq) or _is_knight_jump(from_sq, to_sq):
                entries.append(chess.square_name(from_sq) + chess.square_name(to_sq))
    assert len(entries) == 1792, len(entries)
    for from_file in range(8):
        for to_file in range(8):
            if abs(to_file - from_file) > 1:
                continue
            base = chess.square_name(_square(from_file, 6)) + chess.square_name(_square(to_file, 7))
            for suffix in PROMOTION_SUFFIXES:
                entries.append(base + suffix)
    assert len(entries) == POLICY_SIZE, len(entries)
    return entries


_POLICY_LOOKUP: Optional[Dict[str, int]] = None


def _policy_lookup() -> Dict[str, int]:
    global _POLICY_LOOKUP
    if _POLICY_LOOKUP is None:
        _POLICY_LOOKUP = {uci: i for i, uci in enumerate(reference_policy_index())}
    return _POLICY_LOOKUP


def mirror_square(square: int) -> int:
    """Vertical mirror: rank r -> 7 - r, same file."""
    return _square(chess.square_file(square), 7 - chess.square_rank(square))


def castling_rook_square(board: chess.Board, move: chess.Move) -> int:
    """The square of the rook a castling move castles with."""
    piece = board.piece_at(move.to_square)
    if piece is not None and piece.piece_type == chess.ROOK and piece.color == board.turn:
        return move.to_square  # king-takes-rook notation (Chess960, or e1h1 given explicitly)
    # Standard notation e1g1 / e1c1: standard chess castles with the a- or h-file rook.
    rank = chess.square_rank(move.from_square)
    if chess.square_file(move.to_square) > chess.square_file(move.from_square):
        return _square(7, rank)
    return _square(0, rank)


def reference_move_key(board: chess.Board, move: chess.Move) -> str:
    """The policy-map entry (UCI string from the side to move's view) of a legal move."""
    from_sq, to_sq = move.from_square, move.to_square
    if board.is_castling(move):
        to_sq = castling_rook_square(board, move)
    if board.turn == chess.BLACK:
        from_sq, to_sq = mirror_square(from_sq), mirror_square(to_sq)
    key = chess.square_name(from_sq) + chess.square_name(to_sq)
    if move.promotion is not None and move.promotion != chess.KNIGHT:
        key += chess.piece_symbol(move.promotion)
    return key


def reference_move_index(board: chess.Board, move: chess.Move) -> int:
    """Policy index of a legal move (mirrored for black; castling = king-to-rook)."""
    return _policy_lookup()[reference_move_key(board, move)]


# --------------------------------------------------------------------------- planes


def transposition_key(board: chess.Board) -> Tuple:
    """What makes two positions 'the same' for repetition: pieces, side to move,
    castling rights and the en-passant square when an ep capture is legal
    (python-chess's threefold-repetition notion)."""
    ep = board.ep_square if board.has_legal_en_passant() else None
    return (
        board.board_fen(),
        board.turn,
        board.clean_castling_rights(),
        ep,
    )


def game_positions(board: chess.Board) -> List[chess.Board]:
    """Every position of the game, root first, current last (stack-less copies)."""
    replay = board.root()
    positions = [replay.copy(stack=False)]
    for move in board.move_stack:
        replay.push(move)
        positions.append(replay.copy(stack=False))
    return positions


def _fen_ep_square(board: chess.Board) -> Optional[int]:
    """The en-passant square exactly as the game's starting FEN gave it (python-chess
    keeps it in the root's ep_square even when no ep capture is possible)."""
    return board.root().ep_square


def is_standard_start(position: chess.Board) -> bool:
    """The standard start position: pieces, white to move, full castling rights, no ep.
    (Move counters are not part of the position.)"""
    return (
        position.board_fen() == chess.STARTING_BOARD_FEN
        and position.turn == chess.WHITE
        and position.clean_castling_rights() == chess.BB_A1 | chess.BB_H1 | chess.BB_A8 | chess.BB_H8
        and position.ep_square is None
    )


def piece_planes(position: chess.Board, us: chess.Color) -> np.ndarray:
    """12 planes: `us`'s P N B R Q K then the opponent's, seen from `us`
    (mirrored vertically when `us` is black)."""
    planes = np.zeros((12, 8, 8), dtype=np.float32)
    for square, piece in position.piece_map().items():
        plane = PIECE_ORDER.index(piece.piece_type) + (0 if piece.color == us else 6)
        rank = chess.square_rank(square)
        if us == chess.BLACK:
            rank = 7 - rank
        planes[plane, rank, chess.square_file(square)] = 1.0
    return planes


def undo_double_push(position: chess.Board, ep_square: int) -> chess.Board:
    """The position before the double push that created `ep_square`: the pawn that
    stands in front of the ep square goes back to its starting square."""
    before = position.copy(stack=False)
    mover = not position.turn  # the side that just double-pushed
    step = 8 if mover == chess.WHITE else -8
    landed = ep_square + step  # e3 -> e4 (white), e6 -> e5 (black)
    start = ep_square - step  # e3 -> e2 (white), e6 -> e7 (black)
    pawn = before.remove_piece_at(landed)
    assert pawn == chess.Piece(chess.PAWN, mover), (position.fen(), ep_square)
    before.set_piece_at(start, pawn)
    before.ep_square = None
    return before


def _has_castling_right(position: chess.Board, color: chess.Color, kingside: bool) -> bool:
    """A castling right with a rook on the king's h-side (kingside) or a-side."""
    king = position.king(color)
    if king is None:
        return False
    rights = position.clean_castling_rights() & (chess.BB_RANK_1 if color == chess.WHITE else chess.BB_RANK_8)
    for rook in chess.scan_forward(rights):
        if (rook > king) == kingside:
            return True
    return False


def reference_planes(board: chess.Board) -> np.ndarray:
    """float32 [112, 8, 8] lc0 classical input planes of `board` and its move history."""
    planes = np.zeros((PLANES, 8, 8), dtype=np.float32)
    us = board.turn
    them = not us
    positions = game_positions(board)

    # Repetition: has the position at ply p occurred at any earlier ply?
    keys = [transposition_key(p) for p in positions]
    repeated = [keys[p] in set(keys[:p]) for p in range(len(keys))]

    for slot in range(HISTORY):
        ply = len(positions) - 1 - slot
        base = slot * PLANES_PER_POSITION
        if ply >= 0:
            planes[base:base + 12] = piece_planes(positions[ply], us)
            if repeated[ply]:
                planes[base + 12] = 1.0
            continue
        # Missing history.
        root = positions[0]
        if is_standard_start(root):
            break  # stays zero
        ep = _fen_ep_square(board)
        filler = undo_double_push(root, ep) if ep is not None else root
        planes[base:base + 12] = piece_planes(filler, us)
        # repetition plane stays 0

    if _has_castling_right(board, us, kingside=False):
        planes[AUX_BASE + 0] = 1.0
    if _has_castling_right(board, us, kingside=True):
        planes[AUX_BASE + 1] = 1.0
    if _has_castling_right(board, them, kingside=False):
        planes[AUX_BASE + 2] = 1.0
    if _has_castling_right(board, them, kingside=True):
        planes[AUX_BASE + 3] = 1.0
    if us == chess.BLACK:
        planes[AUX_BASE + 4] = 1.0
    planes[AUX_BASE + 5] = float(board.halfmove_clock)
    # AUX_BASE + 6 stays zero
    planes[AUX_BASE + 7] = 1.0
    return planes


# --------------------------------------------------------------------------- policy


def reference_legal_mask(board: chess.Board) -> np.ndarray:
    mask = np.zeros(POLICY_SIZE, dtype=bool)
    for move in board.legal_moves:
        mask[reference_move_index(board, move)] = True
    return mask


def reference_legal_softmax(board: chess.Board, logits, temperature: float = 1.0) -> Dict[str, float]:
    """Softmax of logits[index] / temperature over the legal moves only (float64,
    max-subtracted so huge logits do not overflow); keys are the board's UCI."""
    logits = np.asarray(logits, dtype=np.float64)
    moves = list(board.legal_moves)
    values = np.array([logits[reference_move_index(board, m)] / temperature for m in moves], dtype=np.float64)
    values -= values.max()
    weights = np.exp(values)
    probs = weights / weights.sum()
    return {board.uci(m): float(p) for m, p in zip(moves, probs)}
