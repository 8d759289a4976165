"""Perft (move-path enumeration) of the Cython core against published numbers.

Published node counts come from the Chess Programming Wiki pages "Perft Results"
and "Chess960 Perft Results" (the chess960 suite is the one also shipped with
python-chess in examples/perft/chess960.perft).  Every published number at
depth <= 3 is re-derived with python-chess in this file, so a typo in a
hand-copied number fails a test instead of silently testing the wrong thing.
"""

import random

import chess
import pytest

from engine.board import Board

from chess_reference import ref_perft, ref_perft_divide

# name -> (fen, chess960, {depth: published count}).  Depths are chosen so the
# core needs at most a second or so each.
STANDARD = {
    "start": (chess.STARTING_FEN, False,
              {1: 20, 2: 400, 3: 8902, 4: 197281, 5: 4865609, 6: 119060324}),
    "kiwipete": ("r3k2r/p1ppqpb1/bn2pnp1/3PN3/1p2P3/2N2Q1p/PPPBBPPP/R3K2R w KQkq - 0 1", False,
                 {1: 48, 2: 2039, 3: 97862, 4: 4085603, 5: 193690690}),
    "pos3": ("8/2p5/3p4/KP5r/1R3p1k/8/4P1P1/8 w - - 0 1", False,
             {1: 14, 2: 191, 3: 2812, 4: 43238, 5: 674624, 6: 11030083}),
    "pos4": ("r3k2r/Pppp1ppp/1b3nbN/nP6/BBP1P3/q4N2/Pp1P2PP/R2Q1RK1 w kq - 0 1", False,
             {1: 6, 2: 264, 3: 9467, 4: 422333, 5: 15833292}),
    "pos4_mirrored": ("r2q1rk1/pP1p2pp/Q4n2/bbp1p3/Np6/1B3NBn/pPPP1PPP/R3K2R b KQ - 0 1", False,
                      {1: 6, 2: 264, 3: 9467, 4: 422333, 5: 15833292}),
    "pos5": ("rnbq1k1r/pp1Pbppp/2p5/8/2B5/8/PPP1NnPP/RNBQK2R w KQ - 1 8", False,
             {1: 44, 2: 1486, 3: 62379, 4: 2103487}),
    "pos6": ("r4rk1/1pp1qppp/p1np1n2/2b1p1B1/2B1P1b1/P1NP1N2/1PP1QPPP/R4RK1 w - - 0 10", False,
             {1: 46, 2: 2079, 3: 89890, 4: 3894594}),
}

# Chess960 perft suite (ids as in python-chess examples/perft/chess960.perft).
CHESS960 = {
    "960_id0": ("bqnb1rkr/pp3ppp/3ppn2/2p5/5P2/P2P4/NPP1P1PP/BQ1BNRKR w HFhf - 2 9", True,
                {1: 21, 2: 528, 3: 12189, 4: 326672}),
    "960_id2": ("b1q1rrkb/pppppppp/3nn3/8/P7/1PPP4/4PPPP/BQNNRKRB w GE - 1 9", True,
                {1: 20, 2: 479, 3: 10471, 4: 273318}),
    "960_id17_ep": ("bnqnrbkr/1pp2pp1/p7/3pP2p/4P1P1/8/PPPP3P/BNQNRBKR w HEhe d6 0 9", True,
                    {1: 31, 2: 984, 3: 28677, 4: 962591}),
    "960_id20": ("n1bb1rkr/qpnppppp/2p5/p7/P1P5/5P2/1P1PPRPP/NQBBN1KR w Hhf - 1 9", True,
                 {1: 27, 2: 697, 3: 18724, 4: 505089}),
    "960_id26": ("nqn2krb/p1prpppp/1pbp4/7P/5P2/8/PPPPPKP1/NQNRB1RB w g - 3 9", True,
                 {1: 21, 2: 461, 3: 10608, 4: 248069}),
    "960_id33": ("bnnqrbkr/pp1p2p1/2p1p2p/5p2/1P5P/1R6/P1PPPPP1/BNNQRBK1 w Ehe - 0 9", True,
                 {1: 33, 2: 1022, 3: 32724, 4: 1024721}),
    "960_id46": ("1nqr1rbb/pppkp1pp/1n3p2/3p4/1P6/5P1P/P1PPPKP1/NNQR1RBB w - - 1 9", True,
                 {1: 24, 2: 623, 3: 15921, 4: 429446}),
    "960_id56": ("n1rbbqkr/pp1pppp1/7p/P1p5/1n6/2PP4/1P2PPPP/NNRBBQKR w HChc - 0 9", True,
                 {1: 22, 2: 631, 3: 14978, 4: 431801}),
    "960_id80": ("bnnbrkr1/ppp2p1p/5q2/3pp1p1/4P3/1N4P1/PPPPRP1P/BN1B1KRQ w Gge - 0 9", True,
                 {1: 26, 2: 1036, 3: 27228, 4: 1028084}),
    "960_id93": ("nnrkrbbq/pppp2pp/8/4pp2/4P3/P7/1PPPBPPP/NNKRR1BQ w c - 0 9", True,
                 {1: 25, 2: 792, 3: 19883, 4: 636041}),
}

ALL = {**STANDARD, **CHESS960}


def _cases(max_depth=None, min_depth=1):
    for name, (fen, chess960, counts) in ALL.items():
        for depth, count in sorted(counts.items()):
            if depth < min_depth or (max_depth is not None and depth > max_depth):
                continue
            yield pytest.param(fen, chess960, depth, count, id=f"{name}-d{depth}")


@pytest.mark.parametrize("fen,chess960,depth,count", list(_cases(max_depth=3)))
def test_published_number_matches_python_chess(fen, chess960, depth, count):
    """Guards the hand-copied table: python-chess must reproduce it."""
    assert ref_perft(chess.Board(fen, chess960=chess960), depth) == count


@pytest.mark.parametrize("name", list(ALL))
def test_position_loads_like_python_chess(name):
    fen, chess960, _ = ALL[name]
    ref = chess.Board(fen, chess960=chess960)
    assert ref.is_valid()
    ours = Board(fen, chess960=chess960)
    assert ours.chess960 is chess960
    assert ours.fen() == ref.fen()
    assert ours.fen(shredder=True) == ref.fen(shredder=True)


@pytest.mark.parametrize("fen,chess960,depth,count", list(_cases()))
def test_perft_published(fen, chess960, depth, count):
    board = Board(fen, chess960=chess960)
    before = (board.fen(), board.hash(), list(board.move_stack))
    assert board.perft(depth) == count
    # perft must leave the board exactly as it found it
    assert (board.fen(), board.hash(), list(board.move_stack)) == before


def test_perft_depth_zero_is_one():
    assert Board().perft(0) == 1
    assert Board("7k/5Q2/6K1/8/8/8/8/8 b - - 0 1").perft(0) == 1  # stalemate


@pytest.mark.parametrize("fen", [
    "rnb1kbnr/pppp1ppp/8/4p3/6Pq/5P2/PPPPP2P/RNBQKBNR w KQkq - 1 3",   # fool's mate
    "7k/5Q2/6K1/8/8/8/8/8 b - - 0 1",                                  # stalemate
])
def test_perft_no_legal_moves(fen):
    ref = chess.Board(fen)
    assert ref.legal_moves.count() == 0
    board = Board(fen)
    for depth in (1, 2, 3):
        assert board.perft(depth) == 0
    assert board.perft_divide(2) == {}


def test_standard_start_in_chess960_mode_has_standard_counts():
    # Scharnagl 518 is the standard array; castling as king-takes-rook does not
    # change the counts (published start values).
    board = Board.from_chess960_pos(518)
    assert board.chess960
    assert board.fen() == chess.STARTING_FEN
    assert [board.perft(d) for d in (1, 2, 3, 4)] == [20, 400, 8902, 197281]


# ---------------------------------------------------------------- perft_divide

DIVIDE_CASES = [
    pytest.param(chess.STARTING_FEN, False, 3, id="start-d3"),
    pytest.param(STANDARD["kiwipete"][0], False, 3, id="kiwipete-castling-d3"),
    pytest.param("r3k2r/8/8/8/8/8/8/R3K2R w KQkq - 0 1", False, 3, id="castling-only-d3"),
    pytest.param("rnbqkbnr/ppp1p1pp/8/3pPp2/8/8/PPPP1PPP/RNBQKBNR w KQkq f6 0 3", False, 3,
                 id="ep-at-root-d3"),
    pytest.param(STANDARD["pos3"][0], False, 3, id="pos3-ep-d3"),
    pytest.param("n1n5/PPPk4/8/8/8/8/4Kppp/5N1N b - - 0 1", False, 3, id="promotions-d3"),
    pytest.param(STANDARD["pos4"][0], False, 3, id="pos4-promotions-d3"),
    pytest.param(CHESS960["960_id0"][0], True, 3, id="960-id0-d3"),
    pytest.param(CHESS960["960_id17_ep"][0], True, 2, id="960-id17-ep-d2"),
    pytest.param(CHESS960["960_id93"][0], True, 3, id="960-id93-d3"),
    # Chess960 castling corner cases: king already on its castling square, king
    # and rook swapping squares, the castling rook shielding the king from an
    # attack along the back rank, the king's destination attacked.
    pytest.param("4k3/8/8/8/8/8/8/qRK4R w BH - 0 1", True, 3, id="960-rook-shields-king-w"),
    pytest.param("Qrk4r/8/8/8/8/8/8/4K3 b bh - 0 1", True, 3, id="960-rook-shields-king-b"),
    pytest.param("4k3/8/8/8/8/8/8/rRK4R w BH - 0 1", True, 3, id="960-rook-shields-king-rook"),
    pytest.param("4k3/8/8/8/8/8/8/1RK3Rq w BG - 0 1", True, 3, id="960-king-on-c1"),
    pytest.param("1k6/8/8/8/8/8/8/R4KRq w AG - 0 1", True, 3, id="960-king-to-attacked-g1"),
    pytest.param("1k6/8/8/8/8/8/8/2RK3R w CH - 0 1", True, 3, id="960-king-rook-swap"),
    pytest.param("1k6/8/8/8/8/8/8/R4KR1 w AG - 0 1", True, 3, id="960-rook-on-g1"),
    pytest.param("rk5r/8/8/8/8/8/8/RK5R w AHah - 0 1", True, 3, id="960-king-on-b1"),
    pytest.param("1r4kr/8/8/8/8/8/8/1R4KR b BHbh - 0 1", True, 3, id="960-king-on-g8"),
    pytest.param("r3k2r/8/8/8/8/8/8/1R2K1Rr w BG - 0 1", True, 3, id="960-attacked-behind-rook"),
    pytest.param("4k3/8/8/8/8/8/8/rR2K2R w B - 0 1", True, 3, id="960-a-side-pinned-path"),
]


@pytest.mark.parametrize("fen,chess960,depth", DIVIDE_CASES)
def test_perft_divide_matches_python_chess(fen, chess960, depth):
    ref = chess.Board(fen, chess960=chess960)
    expected = ref_perft_divide(ref, depth)
    board = Board(fen, chess960=chess960)
    got = board.perft_divide(depth)
    assert isinstance(got, dict)
    missing = sorted(set(expected) - set(got))
    extra = sorted(set(got) - set(expected))
    assert not missing and not extra, f"{fen}: missing {missing}, extra {extra}"
    wrong = {m: (got[m], expected[m]) for m in expected if got[m] != expected[m]}
    assert not wrong, f"{fen}: (got, expected) per move: {wrong}"
    assert set(got) == set(board.legal_moves())
    assert board.fen() == ref.fen()


@pytest.mark.parametrize("name,depth", [
    ("start", 4), ("kiwipete", 3), ("pos3", 5), ("pos4", 4), ("pos4_mirrored", 4),
    ("pos5", 3), ("pos6", 3), ("960_id0", 4), ("960_id17_ep", 3), ("960_id26", 4),
])
def test_perft_divide_sums_to_perft(name, depth):
    fen, chess960, counts = ALL[name]
    board = Board(fen, chess960=chess960)
    divide = board.perft_divide(depth)
    assert sum(divide.values()) == board.perft(depth) == counts[depth]
    # and each entry is the perft of the position after that move
    for uci in sorted(divide)[:5]:
        child = board.copy()
        child.push_uci(uci)
        assert child.perft(depth - 1) == divide[uci], uci


def test_perft_divide_depth_one_is_all_ones():
    board = Board(STANDARD["kiwipete"][0])
    divide = board.perft_divide(1)
    assert divide == {m: 1 for m in board.legal_moves()}
    assert len(divide) == 48


def _random_positions(count, seed):
    """(fen, chess960) of positions reached by seeded random play, with python-chess."""
    rng = random.Random(seed)
    out = []
    while len(out) < count:
        if rng.random() < 0.5:
            board = chess.Board.from_chess960_pos(rng.randrange(960))
        else:
            board = chess.Board(rng.choice([fen for fen, _, _ in STANDARD.values()]))
        for _ in range(rng.randrange(4, 60)):
            moves = sorted(board.legal_moves, key=lambda m: m.uci())
            if not moves:
                break
            captures = [m for m in moves if board.is_capture(m)]
            board.push(rng.choice(captures if captures and rng.random() < 0.4 else moves))
        if not board.is_game_over():
            out.append((board.fen(), board.chess960))
    return out


@pytest.mark.parametrize("fen,chess960", _random_positions(40, seed=31337))
def test_perft_of_random_positions_matches_python_chess(fen, chess960):
    ref = chess.Board(fen, chess960=chess960)
    board = Board(fen, chess960=chess960)
    assert board.perft(3) == ref_perft(ref, 3)
