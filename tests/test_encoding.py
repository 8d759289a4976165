"""Differential tests: ``engine.encoding`` against the plain-Python reference in
``encoding_reference.py`` (python-chess based, written independently from the
contract in docs/contracts.md, "The network", and lc0's classical 112-plane format).

Games are generated with python-chess alone (seeded ``random.Random``, so every
run plays the same games): from the standard start, from Chess960 starts
(chess960=True), from FENs rich in promotions, castling and en passant with
either colour to move, from FENs that equal the start position, plus scripted
and shuffling games so that repetition planes turn on.  Each game is replayed
on an ``engine.board.Board`` and at every ply the move indices, the legal
mask and the 112 input planes must agree with the reference.
"""

from __future__ import annotations

import functools
import random
from typing import List, NamedTuple, Optional, Tuple

import chess
import numpy as np
import pytest

from engine import encoding
from engine.board import Board

from chess_reference import CHESS960_FENS as SHARED_CHESS960_FENS
from encoding_reference import (
    AUX_BASE,
    PLANES_PER_POSITION,
    reference_legal_mask,
    reference_legal_softmax,
    reference_move_index,
    reference_planes,
    reference_policy_index,
    transposition_key,
)

# ------------------------------------------------------------------ positions

START_EQUAL_FENS = {
    # the start position given as a FEN: no history -> missing slots stay zero
    "start_fen": chess.STARTING_FEN,
    "start_fen_counters": "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 3 7",
    "start_fen_shredder": "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w HAha - 0 1",
}

FENS = {
    # not the start position: missing slots repeat the oldest position
    "start_pieces_black_to_move": "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR b KQkq - 0 1",
    "start_pieces_partial_castling": "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w Kkq - 0 1",
    "kiwipete": "r3k2r/p1ppqpb1/bn2pnp1/3PN3/1p2P3/2N2Q1p/PPPBBPPP/R3K2R w KQkq - 0 1",
    "kiwipete_b": "r3k2r/p1ppqpb1/bn2pnp1/3PN3/1p2P3/2N2Q1p/PPPBBPPP/R3K2R b KQkq - 0 1",
    "pos3": "8/2p5/3p4/KP5r/1R3p1k/8/4P1P1/8 w - - 0 1",
    "pos4": "r3k2r/Pppp1ppp/1b3nbN/nP6/BBP1P3/q4N2/Pp1P2PP/R2Q1RK1 w kq - 0 1",
    "pos4_mirrored": "r2q1rk1/pP1p2pp/Q4n2/bbp1p3/Np6/1B3NBn/pPPP1PPP/R3K2R b KQ - 0 1",
    "pos5": "rnbq1k1r/pp1Pbppp/2p5/8/2B5/8/PPP1NnPP/RNBQK2R w KQ - 1 8",
    # promotions, both colours, with captures onto the back rank
    "promotions_w": "n1n5/PPPk4/8/8/8/8/4Kppp/5N1N w - - 0 1",
    "promotions_b": "n1n5/PPPk4/8/8/8/8/4Kppp/5N1N b - - 0 1",
    "promotion_race": "8/P1k5/K7/8/8/8/7p/8 w - - 0 1",
    "promotion_edges_w": "r5nr/P5PP/8/3k4/8/8/3K4/8 w - - 0 1",
    "promotion_edges_b": "8/3k4/8/8/3K4/8/pp5p/R5NR b - - 0 1",
    # castling
    "castling_w": "r3k2r/8/8/8/8/8/8/R3K2R w KQkq - 0 1",
    "castling_b": "r3k2r/8/8/8/8/8/8/R3K2R b KQkq - 0 1",
    "castling_attacked": "r3k2r/8/8/8/2b2B2/8/8/R3K2R b KQkq - 0 1",
    "castling_partial_w": "r3k2r/pppppppp/8/8/8/8/PPPPPPPP/R3K2R w Kq - 0 1",
    "castling_partial_b": "r3k2r/pppppppp/8/8/8/8/PPPPPPPP/R3K2R b Qk - 0 1",
    # en passant squares in the FEN: with and without a legal capture, both colours
    "ep_w_pushed_capture": "rnbqkbnr/ppp1pppp/8/8/3pP3/8/PPPP1PPP/RNBQKBNR b KQkq e3 0 3",
    "ep_w_pushed_no_capture": "rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq e3 0 1",
    "ep_b_pushed_capture": "rnbqkbnr/ppp1pppp/8/3pP3/8/8/PPPP1PPP/RNBQKBNR w KQkq d6 0 3",
    "ep_b_pushed_no_capture": "rnbqkbnr/ppp1pppp/8/3p4/4P3/8/PPPP1PPP/RNBQKBNR w KQkq d6 0 2",
    "ep_two_captures": "rnbqkbnr/ppp1p1pp/8/3pPp2/8/8/PPPP1PPP/RNBQKBNR w KQkq f6 0 3",
    "ep_pinned_rank_w": "8/8/8/KPp4r/8/8/8/7k w - c6 0 2",
    "ep_pinned_rank_b": "8/8/8/8/k2Pp2Q/8/8/3K4 b - d3 0 1",
    "ep_evades_check": "8/8/8/2k5/3Pp3/8/8/4K3 b - d3 0 1",
    "ep_a_file": "4k3/8/8/8/Pp6/8/8/4K3 b - a3 0 1",
    "ep_h_file": "4k3/8/8/8/6pP/8/8/4K3 b - h3 0 1",
    "ep_g_file_w": "4k3/8/8/6pP/8/8/8/4K3 w - g6 0 1",
    "ep_a_file_b_pushed": "4k3/8/8/pP6/8/8/8/4K3 w - a6 0 1",
    # high rule50 clocks
    "rook_endgame_hm90": "8/8/4k3/8/8/3RK3/8/8 w - - 90 100",
    "queen_vs_rook_hm95": "8/2r5/4k3/8/8/3QK3/8/8 b - - 95 120",
}

CHESS960_FENS = {
    **SHARED_CHESS960_FENS,
    "960_king_g_b": "1r4kr/pppppppp/8/8/8/8/PPPPPPPP/1R4KR b BHbh - 0 1",
}


class Game(NamedTuple):
    id: str
    fen: Optional[str]        # the starting FEN as given; None = standard start / Chess960 number
    chess960: bool
    n960: Optional[int]       # Board.from_chess960_pos(n960) when fen is None and chess960
    moves: Tuple[str, ...]    # UCI in the board's notation (e1g1, or e1h1 with chess960)


def ref_start(fen: Optional[str], chess960: bool, n960: Optional[int]) -> chess.Board:
    if fen is None and n960 is not None:
        return chess.Board.from_chess960_pos(n960)
    return chess.Board(fen if fen is not None else chess.STARTING_FEN, chess960=chess960)


def our_start(fen: Optional[str], chess960: bool, n960: Optional[int]) -> Board:
    if fen is None and n960 is not None:
        return Board.from_chess960_pos(n960)
    return Board(fen, chess960=chess960)


def _choose(board: chess.Board, rng: random.Random, mode: str) -> chess.Move:
    moves = sorted(board.legal_moves, key=lambda m: m.uci())
    if mode == "special":
        # favour the moves whose encoding is special, and double pushes (en passant)
        weights = []
        for m in moves:
            if m.promotion or board.is_castling(m) or board.is_en_passant(m):
                weights.append(12.0)
            elif board.piece_type_at(m.from_square) == chess.PAWN and abs(m.to_square - m.from_square) == 16:
                weights.append(4.0)
            elif board.is_capture(m):
                weights.append(2.0)
            else:
                weights.append(1.0)
        return rng.choices(moves, weights)[0]
    if mode == "shuffle" and len(board.move_stack) >= 2:
        # undo our previous move when we can, so positions repeat
        last = board.move_stack[-2]
        back = chess.Move(last.to_square, last.from_square)
        if not last.promotion and back in moves and not board.is_zeroing(back) and rng.random() < 0.8:
            return back
        quiet = [m for m in moves if not board.is_zeroing(m) and not board.is_castling(m)]
        if quiet:
            return rng.choice(quiet)
    return rng.choice(moves)


def _play(fen, chess960, n960, mode, seed, max_plies) -> Tuple[str, ...]:
    board = ref_start(fen, chess960, n960)
    assert board.is_valid(), (fen, n960)
    rng = random.Random(seed)
    moves: List[str] = []
    while len(moves) < max_plies and not board.is_game_over():
        move = _choose(board, rng, mode)
        moves.append(board.uci(move))
        board.push(move)
    return tuple(moves)


def _scripted(fen, chess960, ucis: str) -> Tuple[str, ...]:
    board = ref_start(fen, chess960, None)
    out = []
    for uci in ucis.split():
        move = board.parse_uci(uci)
        out.append(board.uci(move))
        board.push(move)
    return tuple(out)


KNIGHT_SHUFFLE = "g1f3 g8f6 f3g1 f6g8 g1f3 g8f6 f3g1 f6g8 g1f3 g8f6 f3g1 f6g8"


def _build_games() -> List[Game]:
    games: List[Game] = []
    seed = 7000

    def add(id_, fen, chess960, n960, mode, max_plies):
        nonlocal seed
        seed += 1
        moves = _play(fen, chess960, n960, mode, seed, max_plies)
        games.append(Game(f"{id_}-{mode}-{seed}", fen, chess960, n960, moves))

    def script(id_, fen, chess960, ucis):
        games.append(Game(f"{id_}-scripted", fen, chess960, None, _scripted(fen, chess960, ucis)))

    for mode in ("random", "random", "random", "special", "special", "shuffle"):
        add("start", None, False, None, mode, 120)
    pick = random.Random(960)
    for i, n in enumerate([0, 518, 959] + pick.sample(range(960), 9)):
        add(f"960pos{n}", None, True, n, ("random", "special", "shuffle")[i % 3], 80)
    for name, fen in FENS.items():
        add(name, fen, False, None, "special", 60)
        add(name, fen, False, None, "random", 24)
    for name, fen in CHESS960_FENS.items():
        add(name, fen, True, None, "special", 60)
        add(name, fen, True, None, "shuffle", 24)
    for name, fen in START_EQUAL_FENS.items():
        add(name, fen, False, None, "random", 20)
    add("start_fen_960", chess.STARTING_FEN, True, None, "special", 40)

    # repetitions: knights back and forth, from the start, from FENs, both colours
    script("knights_start", None, False, KNIGHT_SHUFFLE)
    script("knights_start_fen", chess.STARTING_FEN, False, KNIGHT_SHUFFLE)
    script("knights_black_first", FENS["start_pieces_black_to_move"], False,
           "g8f6 g1f3 f6g8 f3g1 g8f6 g1f3 f6g8 f3g1 g8f6 g1f3")
    script("knights_kiwipete", FENS["kiwipete"], False,
           "e5d3 b6c8 d3e5 c8b6 e5d3 b6c8 d3e5 c8b6 e5d3 b6c8 d3e5")
    script("kings_castling", FENS["castling_w"], False,
           "e1f1 e8f8 f1e1 f8e8 e1f1 e8f8 f1e1 f8e8 e1f1 e8f8")
    # the FEN's ep square has no legal capture: the position after the knights
    # return is the root position again (python-chess's key ignores that ep square)
    script("knights_ep_no_capture", FENS["ep_w_pushed_no_capture"], False,
           "g8f6 g1f3 f6g8 f3g1 g8f6 g1f3 f6g8 f3g1 g8f6")
    # the FEN's ep square has a legal capture: the root is not repeated
    script("knights_ep_capture", FENS["ep_b_pushed_capture"], False,
           "g1f3 g8f6 f3g1 f6g8 g1f3 g8f6 f3g1 f6g8 g1f3")
    script("knights_after_e4", None, False,
           "e2e4 g8f6 g1f3 f6g8 f3g1 g8f6 g1f3 f6g8 f3g1 g8f6 g1f3 f6g8 f3g1")
    script("knights_960", CHESS960_FENS["960_id0"], True,
           "a2b4 f6d5 b4a2 d5f6 a2b4 f6d5 b4a2 d5f6 a2b4")
    # castling in standard notation, all four ways
    script("castle_both_queenside", None, False,
           "d2d4 d7d5 c1f4 c8f5 b1c3 b8c6 d1d2 d8d7 e1c1 e8c8 c1b1 c8b8")
    script("castle_both_kingside", None, False,
           "e2e4 e7e5 g1f3 g8f6 f1c4 f8c5 e1g1 e8g8 g1h1 g8h8")
    # Chess960 castling where the king or rook does not move much
    script("castle_960_over_rook", CHESS960_FENS["960_castle_over_rook"], True, "e1g1 e8b8 g1h1")
    script("castle_960_king_b", CHESS960_FENS["960_king_b"], True, "b1a1 b8h8")
    # en passant captured right away, both colours
    script("ep_captured_w", FENS["ep_b_pushed_capture"], False, "e5d6 c7d6 d2d4")
    script("ep_captured_b", FENS["ep_w_pushed_capture"], False, "d4e3 d2e3 f7f5")
    return games


GAMES = _build_games()
GAME_IDS = [g.id for g in GAMES]


def _replay(game: Game, upto: Optional[int] = None):
    """(python-chess board, our board) after the first `upto` moves of `game`."""
    ref = ref_start(game.fen, game.chess960, game.n960)
    ours = our_start(game.fen, game.chess960, game.n960)
    for uci in game.moves[:upto]:
        ref.push_uci(uci)
        ours.push_uci(uci)
    return ref, ours


def _walk(game: Game):
    """Yield (ply, python-chess board, our board) for every position of the game."""
    ref = ref_start(game.fen, game.chess960, game.n960)
    ours = our_start(game.fen, game.chess960, game.n960)
    yield 0, ref, ours
    for ply, uci in enumerate(game.moves, 1):
        ref.push_uci(uci)
        ours.push_uci(uci)
        yield ply, ref, ours


def repro(game: Game, ply: int) -> str:
    start = f"Board.from_chess960_pos({game.n960})" if game.fen is None and game.n960 is not None \
        else f"fen={game.fen!r}"
    return f"[{game.id}] {start} chess960={game.chess960} moves={' '.join(game.moves[:ply])!r}"


# ------------------------------------------------------------------ plane diffs

PIECE_NAMES = ("our P", "our N", "our B", "our R", "our Q", "our K",
               "their P", "their N", "their B", "their R", "their Q", "their K", "repetition")
AUX_NAMES = ("us O-O-O", "us O-O", "them O-O-O", "them O-O", "black to move",
             "rule50", "zeros", "ones")


def plane_name(k: int) -> str:
    if k < AUX_BASE:
        slot, p = divmod(k, PLANES_PER_POSITION)
        return f"plane {k} (slot {slot}, {PIECE_NAMES[p]})"
    return f"plane {k} ({AUX_NAMES[k - AUX_BASE]})"


def describe_diff(got: np.ndarray, expected: np.ndarray, limit: int = 12) -> str:
    lines = []
    for k in range(expected.shape[0]):
        if np.array_equal(got[k], expected[k]):
            continue
        cells = []
        for rank, file in zip(*np.nonzero(got[k] != expected[k])):
            cells.append(f"{'abcdefgh'[file]}{rank + 1}: got {got[k, rank, file]:g} expected {expected[k, rank, file]:g}")
        lines.append(f"  {plane_name(k)} (rank from the side to move's view): " + "; ".join(cells[:8])
                     + (" ..." if len(cells) > 8 else ""))
        if len(lines) >= limit:
            lines.append("  ...")
            break
    return "\n".join(lines)


def assert_planes(got: np.ndarray, expected: np.ndarray, where: str) -> None:
    assert isinstance(got, np.ndarray), (type(got), where)
    assert got.dtype == np.float32, (got.dtype, where)
    assert got.shape == expected.shape, (got.shape, where)
    if not np.array_equal(got, expected):
        np.testing.assert_array_equal(got, expected, err_msg=f"{where}\n{describe_diff(got, expected)}")


# ------------------------------------------------------------------ policy index


def test_constants():
    assert encoding.PLANES == 112
    assert encoding.POLICY_SIZE == 1858


def test_policy_index_matches_reference():
    index = list(encoding.POLICY_INDEX)
    ref = reference_policy_index()
    assert len(index) == 1858
    assert len(set(index)) == 1858
    assert all(isinstance(u, str) for u in index)
    if index != ref:
        first = next(i for i, (a, b) in enumerate(zip(index, ref)) if a != b)
        pytest.fail(f"POLICY_INDEX differs from the reference first at {first}: {index[first]!r} != {ref[first]!r}")


def test_policy_index_spot_checks():
    index = list(encoding.POLICY_INDEX)
    assert index[0] == "a1b1"
    assert index[:8] == ["a1b1", "a1c1", "a1d1", "a1e1", "a1f1", "a1g1", "a1h1", "a1a2"]
    assert sum(1 for u in index if len(u) == 4) == 1792
    assert all(len(u) == 4 for u in index[:1792])
    promos = index[1792:]
    assert len(promos) == 66
    assert promos[:9] == ["a7a8q", "a7a8r", "a7a8b", "a7b8q", "a7b8r", "a7b8b", "b7a8q", "b7a8r", "b7a8b"]
    assert promos[-3:] == ["h7h8q", "h7h8r", "h7h8b"]
    # from-square then to-square order
    squares = [(chess.parse_square(u[:2]), chess.parse_square(u[2:4])) for u in index[:1792]]
    assert squares == sorted(squares)
    # a knight move, a long diagonal, castling entries (king to rook)
    for uci in ("b1c3", "a1h8", "h8a1", "e1h1", "e1a1", "g1f3"):
        assert uci in index
    assert "a7a8n" not in index and "e1e1" not in index and "a1b4" not in index


# ------------------------------------------------------------------ moves and masks


def test_games_cover_the_special_moves():
    """The generated games really contain what they are meant to exercise."""
    seen = {"ep": 0, "castle": 0, "castle960": 0, "promo_n": 0, "promo_qrb": 0, "black_promo": 0, "repetition": 0}
    for game in GAMES:
        board = ref_start(game.fen, game.chess960, game.n960)
        keys = {transposition_key(board)}
        for uci in game.moves:
            move = board.parse_uci(uci)
            seen["ep"] += board.is_en_passant(move)
            if board.is_castling(move):
                seen["castle960" if game.chess960 else "castle"] += 1
            if move.promotion == chess.KNIGHT:
                seen["promo_n"] += 1
            elif move.promotion:
                seen["promo_qrb"] += 1
                seen["black_promo"] += board.turn == chess.BLACK
            board.push(move)
            key = transposition_key(board)
            seen["repetition"] += key in keys
            keys.add(key)
    assert all(v >= 5 for v in seen.values()), seen


@pytest.mark.parametrize("game", GAMES, ids=GAME_IDS)
def test_move_indices(game: Game):
    policy = list(encoding.POLICY_INDEX)
    for ply, ref, ours in _walk(game):
        where = repro(game, ply)
        moves = list(ref.legal_moves)
        ucis = [ref.uci(m) for m in moves]
        assert sorted(ours.legal_moves()) == sorted(ucis), where
        expected = [reference_move_index(ref, m) for m in moves]
        assert len(set(expected)) == len(expected), where  # the reference itself
        got = [encoding.move_to_index(ours, u) for u in ucis]
        for uci, g, e in zip(ucis, got, expected):
            assert g == e, f"{where}\nmove_to_index({uci!r}) = {g} ({policy[g] if 0 <= g < 1858 else '?'}), " \
                           f"expected {e} ({policy[e]})"
        assert len(set(got)) == len(got), where
        for uci, e in zip(ucis, expected):
            back = encoding.index_to_move(ours, e)
            assert back == uci, f"{where}\nindex_to_move({e} = {policy[e]}) = {back!r}, expected {uci!r}"
        mask = encoding.legal_mask(ours)
        assert isinstance(mask, np.ndarray) and mask.dtype == np.bool_ and mask.shape == (1858,), where
        ref_mask = reference_legal_mask(ref)
        if not np.array_equal(mask, ref_mask):
            extra = [policy[i] for i in np.nonzero(mask & ~ref_mask)[0]]
            missing = [policy[i] for i in np.nonzero(ref_mask & ~mask)[0]]
            pytest.fail(f"{where}\nlegal_mask: extra {extra}, missing {missing}")


# ------------------------------------------------------------------ planes


@pytest.mark.parametrize("game", GAMES, ids=GAME_IDS)
def test_encode_board(game: Game):
    for ply, ref, ours in _walk(game):
        assert_planes(encoding.encode_board(ours), reference_planes(ref), repro(game, ply))


@pytest.mark.parametrize("game", GAMES, ids=GAME_IDS)
def test_encode_position(game: Game):
    fen = game.fen
    if fen is None and game.n960 is not None:
        fen = chess.Board.from_chess960_pos(game.n960).fen()
    ref = ref_start(game.fen, game.chess960, game.n960)
    plies = sorted({0, 1, 2, 7, 8, 9, len(game.moves)} | set(range(0, len(game.moves), 11)))
    done = 0
    for uci_ply, uci in enumerate(game.moves + ("",)):
        if uci_ply in plies:
            moves = list(game.moves[:uci_ply])
            if fen is None:
                got = encoding.encode_position(None, moves, chess960=game.chess960)
            else:
                got = encoding.encode_position(fen, moves, chess960=game.chess960)
            assert_planes(got, reference_planes(ref), repro(game, uci_ply))
            done += 1
        if uci:
            ref.push_uci(uci)
    assert done >= 1


def test_encode_position_defaults():
    """No FEN -> the standard start (zeros beyond slot 0); moves as any sequence."""
    start = reference_planes(chess.Board())
    assert_planes(encoding.encode_position(), start, "encode_position()")
    assert_planes(encoding.encode_position(None, []), start, "encode_position(None, [])")
    ref = chess.Board()
    for uci in ("e2e4", "c7c5", "g1f3"):
        ref.push_uci(uci)
    assert_planes(encoding.encode_position(None, ("e2e4", "c7c5", "g1f3")), reference_planes(ref), "tuple moves")


def test_start_position_is_zero_beyond_slot_0():
    for board in (Board(), Board(chess.STARTING_FEN), Board.from_chess960_pos(518),
                  Board(START_EQUAL_FENS["start_fen_shredder"])):
        planes = encoding.encode_board(board)
        assert not planes[PLANES_PER_POSITION:AUX_BASE].any(), board.fen()
        assert planes[0, 1].all() and planes[0].sum() == 8           # our pawns on our second rank
        assert planes[6, 6].all() and planes[6].sum() == 8           # their pawns
        assert planes[5, 0, 4] == 1 and planes[11, 7, 4] == 1        # kings on e1 / e8
        assert not planes[12].any()                                   # no repetition
        assert planes[104:108].all() and not planes[108].any()
        assert not planes[109].any() and not planes[110].any() and planes[111].all()


def test_black_to_move_is_mirrored():
    board = Board()
    board.push_uci("e2e4")
    planes = encoding.encode_board(board)
    assert planes[108].all()
    # black's own pawns on "our" second rank, white's e-pawn on e5 from black's view
    assert planes[0, 1].all()
    assert planes[6, 4, 4] == 1 and planes[6, 6].sum() == 7
    assert planes[11, 7, 4] == 1 and planes[5, 0, 4] == 1
    # slot 1 (the start, white to move) seen from black: white pawns all on rank 7
    assert planes[13 + 6, 6].all() and planes[13 + 6].sum() == 8
    assert not planes[2 * 13:AUX_BASE].any()


def test_fen_fill_undoes_the_double_push():
    """FEN after 1.e4 (ep square e3, no capture possible): every missing slot shows
    the e-pawn back on e2 -- i.e. the start position, seen from black."""
    fen = FENS["ep_w_pushed_no_capture"]
    planes = encoding.encode_position(fen)
    assert_planes(planes, reference_planes(chess.Board(fen)), fen)
    for slot in range(1, 8):
        b = slot * 13
        assert planes[b + 6, 6].all() and planes[b + 6].sum() == 8, slot
        assert not planes[b + 12].any()
    # the same FEN without the ep field: slots repeat the position as it is
    fen_no_ep = fen.replace(" e3 ", " - ")
    planes = encoding.encode_position(fen_no_ep)
    assert_planes(planes, reference_planes(chess.Board(fen_no_ep)), fen_no_ep)
    for slot in range(1, 8):
        assert planes[slot * 13 + 6, 4, 4] == 1


def test_repetition_planes_turn_on():
    board = Board()
    ref = chess.Board()
    for uci in KNIGHT_SHUFFLE.split()[:8]:
        board.push_uci(uci)
        ref.push_uci(uci)
    planes = encoding.encode_board(board)
    assert_planes(planes, reference_planes(ref), "knight shuffle")
    # plies 8 and 4 are the start position again (white to move): slot 0 and slot 4
    assert planes[12].all() and planes[4 * 13 + 12].all()
    assert not planes[8 * 13 - 1].any()  # slot 7 = ply 1 is new


def test_popped_history():
    """After pop() the encoding is that of the shorter game."""
    for game in GAMES[:6] + [g for g in GAMES if g.id.startswith(("knights", "ep_"))]:
        ref, ours = _replay(game)
        for k in range(min(12, len(game.moves))):
            ref.pop()
            ours.pop()
            if k % 3 == 0:
                assert_planes(encoding.encode_board(ours), reference_planes(ref),
                              repro(game, len(game.moves) - k - 1) + " (after pop)")


def test_encode_boards_and_out_buffers():
    boards, refs = [], []
    for game in GAMES[::7]:
        for ply, ref, ours in _walk(game):
            if ply % 9 == 4 or ply == 0:
                boards.append(ours.copy())
                refs.append(reference_planes(ref))
    n = len(boards)
    assert n >= 20
    stacked = np.stack([encoding.encode_board(b) for b in boards])
    expected = np.stack(refs)
    batch = encoding.encode_boards(boards)
    assert batch.dtype == np.float32 and batch.shape == (n, 112, 8, 8)
    np.testing.assert_array_equal(batch, stacked)
    np.testing.assert_array_equal(batch, expected)

    out = np.full((n, 112, 8, 8), 7.0, dtype=np.float32)
    result = encoding.encode_boards(boards, out=out)
    np.testing.assert_array_equal(out, expected)  # filled in place, stale values overwritten
    assert result is out or np.shares_memory(result, out)

    single = np.full((112, 8, 8), -3.0, dtype=np.float32)
    result = encoding.encode_board(boards[-1], out=single)
    np.testing.assert_array_equal(single, expected[-1])
    assert result is single or np.shares_memory(result, single)

    # a tuple of boards works too, and a batch of one
    np.testing.assert_array_equal(encoding.encode_boards(tuple(boards[:3])), expected[:3])
    np.testing.assert_array_equal(encoding.encode_boards(boards[:1]), expected[:1])


# ------------------------------------------------------------------ legal policy


def _policy_positions():
    positions = []
    for game in GAMES[::3]:
        for ply, ref, ours in _walk(game):
            if ply % 5 == 0 and ref.legal_moves.count() > 0:
                positions.append((repro(game, ply), ref.copy(), ours.copy()))
    return positions


@functools.lru_cache(maxsize=None)
def policy_positions():
    return _policy_positions()


def _check_policy(ref: chess.Board, ours: Board, logits: np.ndarray, temperature: float, where: str):
    moves, probs = encoding.legal_policy(ours, logits, temperature)
    expected = reference_legal_softmax(ref, logits, temperature)
    where = f"{where} T={temperature}"
    assert isinstance(probs, np.ndarray) and probs.dtype == np.float32, where
    assert len(moves) == len(probs) == len(set(moves)), where
    assert set(moves) == set(expected), f"{where}\nmoves {sorted(moves)} != {sorted(expected)}"
    assert np.all(np.isfinite(probs)), where
    assert abs(float(probs.astype(np.float64).sum()) - 1.0) < 1e-5, where
    for uci, p in zip(moves, probs):
        assert abs(float(p) - expected[uci]) <= 1e-6, f"{where}\n{uci}: got {p}, expected {expected[uci]}"


@pytest.mark.parametrize("temperature", [1.0, 0.5, 2.2])
def test_legal_policy_matches_reference(temperature):
    rng = np.random.default_rng(int(temperature * 100))
    positions = policy_positions()
    assert len(positions) >= 50
    for i, (where, ref, ours) in enumerate(positions):
        logits = rng.normal(0.0, 3.0, size=1858).astype(np.float32)
        if i % 4 == 1:
            # very large logits must not overflow, nor lose precision
            big = rng.random(1858) < 0.3
            logits[big] = np.float32(1e4) + rng.normal(0.0, 2.0, size=int(big.sum())).astype(np.float32)
        elif i % 4 == 2:
            logits = (rng.normal(0.0, 1.0, size=1858) * 1e4).astype(np.float32)
        elif i % 4 == 3:
            logits[~reference_legal_mask(ref)] = 1e4  # illegal moves' logits play no part
        _check_policy(ref, ours, logits, temperature, where)


@pytest.mark.parametrize("temperature", [1.0, 0.5, 2.2])
@pytest.mark.parametrize("offset", [1e4, -1e4, 1e3, 0.0])
def test_legal_policy_large_logits_keep_precision(offset, temperature):
    """Two moves at offset and offset + 1 (the rest far below): the answer is
    1 / (1 + exp(1 / T)) whatever the offset -- subtract the max before dividing
    by the temperature, or work in float64, so float32 rounding of logit / T
    (about 5e-4 at 1e4 / 2.2) does not leak into the probabilities."""
    ref, ours = chess.Board(), Board()
    logits = np.full(1858, offset - 3e4, dtype=np.float32)
    e4 = reference_move_index(ref, chess.Move.from_uci("e2e4"))
    d4 = reference_move_index(ref, chess.Move.from_uci("d2d4"))
    logits[e4] = offset
    logits[d4] = offset + 1.0
    moves, probs = encoding.legal_policy(ours, logits, temperature)
    got = dict(zip(moves, probs.tolist()))
    exact = 1.0 / (1.0 + np.exp(1.0 / temperature))
    assert abs(got["e2e4"] - exact) <= 1e-6, (offset, temperature, got["e2e4"], exact)
    assert abs(got["d2d4"] - (1.0 - exact)) <= 1e-6, (offset, temperature, got["d2d4"], 1.0 - exact)
    _check_policy(ref, ours, logits, temperature, f"start, e2e4={offset}, d2d4={offset + 1}")


def test_legal_policy_extremes():
    ref, ours = chess.Board(), Board()
    for value in (1e4, -1e4, 80.0, 1e30, 0.0):
        logits = np.full(1858, value, dtype=np.float32)
        for t in (1.0, 0.5, 2.2):
            moves, probs = encoding.legal_policy(ours, logits, t)
            assert len(moves) == 20
            np.testing.assert_allclose(probs, 1 / 20, atol=1e-6)
    logits = np.zeros(1858, dtype=np.float32)
    logits[reference_move_index(ref, chess.Move.from_uci("e2e4"))] = 1e4
    moves, probs = encoding.legal_policy(ours, logits)
    assert dict(zip(moves, probs.tolist()))["e2e4"] == pytest.approx(1.0, abs=1e-6)
    _check_policy(ref, ours, logits, 1.0, "start, one huge logit")


# ------------------------------------------------------------------ errors


def test_index_to_move_errors():
    board = Board()
    policy = list(encoding.POLICY_INDEX)
    for uci in ("a1a2", "e2e5", "e1g1", "a7a8q", "e7e5", "h1h8"):
        with pytest.raises(ValueError):
            encoding.index_to_move(board, policy.index(uci))
    for index in (-1, 1858, 1859, 10**6, -1859):
        with pytest.raises(ValueError):
            encoding.index_to_move(board, index)
    # from black's view e7e5 is the entry e2e4
    board.push_uci("e2e4")
    assert encoding.index_to_move(board, policy.index("e2e4")) == "e7e5"
    with pytest.raises(ValueError):
        encoding.index_to_move(board, policy.index("e7e5"))
    # no legal moves at all (checkmate)
    mate = Board("rnb1kbnr/pppp1ppp/8/4p3/6Pq/5P2/PPPPP2P/RNBQKBNR w KQkq - 1 3")
    assert not encoding.legal_mask(mate).any()
    for index in range(0, 1858, 97):
        with pytest.raises(ValueError):
            encoding.index_to_move(mate, index)


def test_move_to_index_errors():
    board = Board()
    for uci in ("e2e5", "e7e5", "e1g1", "a1a2", "g1g3", "e2e4q", "zz", "", "e2", "e2e4e5", "i2i4"):
        with pytest.raises(ValueError):
            encoding.move_to_index(board, uci)
    promo = Board(FENS["promotion_race"])
    with pytest.raises(ValueError):
        encoding.move_to_index(promo, "a7a8")  # a promotion needs its piece
    with pytest.raises(ValueError):
        encoding.move_to_index(promo, "a7a8k")
    with pytest.raises(ValueError):
        encoding.move_to_index(promo, "h2h1q")  # black's move, white to move
    # the four promotions of one pawn: three promotion entries and the plain entry
    policy = list(encoding.POLICY_INDEX)
    got = {s: policy[encoding.move_to_index(promo, "a7a8" + s)] for s in "qrbn"}
    assert got == {"q": "a7a8q", "r": "a7a8r", "b": "a7a8b", "n": "a7a8"}


@pytest.mark.parametrize("call", [
    lambda: encoding.encode_board(None),
    lambda: encoding.move_to_index(None, "e2e4"),
    lambda: encoding.index_to_move(None, 0),
    lambda: encoding.legal_mask(None),
    lambda: encoding.legal_policy(None, np.zeros(encoding.POLICY_SIZE, np.float32)),
])
def test_no_board_is_a_type_error_not_a_crash(call):
    """Cython lets a typed argument be None unless told otherwise; reading None.pos segfaulted."""
    with pytest.raises(TypeError):
        call()
