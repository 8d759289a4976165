"""lc0's input formats 2, 3, 4, 132, 5 and 133 in cyzero's encoder (engine.encoding, ``input_format=``),
checked against lc0 v0.32.1 itself and against the rules of lc0's src/neural/encoder.cc.

lc0's evaluations (tests/data/lc0/input-formats.json, made by docs/recipes/lc0-input-formats.py) are
of the repository's lc0 fixture with its input-format field rewritten: the weights do not depend on
the format, so evaluating the fixture's graph (engine.lc0) on cyzero's planes of a format must give
what lc0 gave for that format: V (W - L) within 0.003, D within 0.0045 (lc0's printed D is that far
off in format 1 as well) and every legal move's policy share (at lc0's policy temperature 1.359)
within 0.15 percentage points.

Policy indices: cyzero maps a move through the position's canonical transform as the planes go
(flip: files reversed, mirror: ranks reversed, transpose: the reflection in the a8-h1 diagonal), as
lc0 v0.31 and earlier did and as networks of these formats were trained. lc0 v0.32 (PR #2126)
rotates the squares by 180 degrees for the transpose bit instead, inconsistent with its own
planes; so in transposed positions the comparison with lc0 reads the logits at v0.32's index of
each move (``v032_index``). (lc0's VerboseMoveStats print each move's untransformed index, that
of format 1: the moves are matched by it.)
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from engine import encoding as E
from engine.board import Board

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "data", "lc0", "input-formats.json")
FIXTURE = os.path.join(HERE, "data", "lc0", "cyzero-3x16.pb.gz")
# D: lc0's printed D strays up to 0.004 from the draw probability of the very network whose V it
# prints to 5e-5, in format 1 too (tests/lc0_files.py's LC0_TOLERANCE); seen here: V 5e-5, D 0.0040,
# P 0.074 points off at most
TOLERANCE = {"v": 0.003, "d": 0.0045, "p": 0.15}
NAME_INDEX = {name: i for i, name in enumerate(E.POLICY_INDEX)}


# --------------------------------------------------------------------------- helpers

def board_of(position: dict) -> Board:
    board = Board(position["fen"], chess960=position["chess960"])
    for move in position["moves"]:
        board.push_uci(move)
    return board


def _square(name: str):
    return "abcdefgh".index(name[0]), int(name[1]) - 1


def _name(f: int, r: int) -> str:
    return "abcdefgh"[f] + "12345678"[r]


def _index_through(board: Board, move: str, square) -> int:
    """The policy index of ``move`` with its squares (side to move's view) mapped by ``square``."""
    plain = E.POLICY_INDEX[E.move_to_index(board, move)]   # format 1: the side to move's view
    frm, to = square(*_square(plain[:2])), square(*_square(plain[2:4]))
    return NAME_INDEX[_name(*frm) + _name(*to) + plain[4:]]


def v031_index(board: Board, move: str, transform: int) -> int:
    """The index as lc0 v0.31's Move::as_nn_index read it: flip, then mirror, then the transpose the
    planes go through ((file, rank) -> (7 - rank, 7 - file))."""
    return _index_through(board, move, lambda f, r: _v031(f, r, transform))


def v032_index(board: Board, move: str, transform: int) -> int:
    """The index as lc0 v0.32's MoveToNNIndex reads it: ranks reversed for mirror or transpose,
    files for flip or transpose."""
    def square(f, r):
        if transform & (E.MIRROR | E.TRANSPOSE):
            r = 7 - r
        if transform & (E.FLIP | E.TRANSPOSE):
            f = 7 - f
        return f, r
    return _index_through(board, move, square)


def shares(logits: np.ndarray, indices, temperature: float) -> np.ndarray:
    x = np.array([logits[i] for i in indices], dtype=np.float64) / temperature
    e = np.exp(x - x.max())
    return 100.0 * e / e.sum()


@pytest.fixture(scope="module")
def lc0_record() -> dict:
    with open(DATA, encoding="utf-8") as f:
        return json.load(f)


@pytest.fixture(scope="module")
def session():
    ort = pytest.importorskip("onnxruntime")
    from engine.lc0 import read_lc0_file
    from engine.lc0_onnx import lc0_to_onnx

    return ort.InferenceSession(lc0_to_onnx(read_lc0_file(FIXTURE)), providers=["CPUExecutionProvider"])


def evaluate(session, planes: np.ndarray):
    policy, wdl = session.run(["/output/policy", "/output/wdl"], {"/input/planes": planes})
    return policy, wdl


# --------------------------------------------------------------------------- against lc0

@pytest.mark.parametrize("input_format", [1, 2, 3, 4, 132, 5, 133])
def test_plays_as_lc0_evaluates_the_format(lc0_record, session, input_format):
    positions = lc0_record["positions"]
    expected = lc0_record["formats"][str(input_format)]
    assert len(expected) == len(positions) >= 90
    temperature = lc0_record["policy_temperature"]
    boards = [board_of(p) for p in positions]
    policy, wdl = evaluate(session, E.encode_boards(boards, input_format=input_format))
    failures, transposed = [], 0
    for row, (position, board, lc0) in enumerate(zip(positions, boards, expected)):
        where = f"format {input_format}, {position['name']}"
        v, d = float(wdl[row, 0] - wdl[row, 2]), float(wdl[row, 1])
        if abs(v - lc0["v"]) > TOLERANCE["v"] or abs(d - lc0["d"]) > TOLERANCE["d"]:
            failures.append(f"{where}: V {v:.4f} D {d:.3f}, lc0 V {lc0['v']:.4f} D {lc0['d']:.3f}")
            continue
        moves = board.legal_moves()
        transform = E.canonical_transform(board, input_format)
        ours = [E.move_to_index(board, m, input_format) for m in moves]
        assert ours == [v031_index(board, m, transform) for m in moves], where
        # lc0 prints each move's untransformed index (the side to move's view, format 1's): the
        # moves are matched by it, then read at the index lc0's network read them at
        lc0_by_index = {index: p for index, p in lc0["moves"].values()}
        plain = [E.move_to_index(board, m) for m in moves]
        if sorted(plain) != sorted(lc0_by_index):
            failures.append(f"{where}: lc0's moves {sorted(lc0['moves'])}, cyzero's {sorted(moves)}")
            continue
        if transform & E.TRANSPOSE:
            transposed += 1
            theirs = [v032_index(board, m, transform) for m in moves]
        else:
            theirs = ours
        got = shares(policy[row], theirs, temperature)
        want = np.array([lc0_by_index[i] for i in plain])
        if transform & E.TRANSPOSE == 0:
            # cyzero's own priors (legal_policy) are the shares at its own indices
            names, priors = E.legal_policy(board, policy[row], temperature, input_format=input_format)
            assert names == moves and np.allclose(priors * 100.0, got, atol=1e-3), where
        worst = float(np.max(np.abs(got - want)))
        if worst > TOLERANCE["p"]:
            failures.append(f"{where}: a policy share {worst:.3f} points off lc0's")
    print(f"format {input_format}: {len(positions) - len(failures)}/{len(positions)} positions as lc0 "
          f"({transposed} transposed, compared at lc0 v0.32's indices)")
    assert not failures, "\n".join(failures)


def test_the_reference_is_varied(lc0_record):
    """The positions cover every transform, both sides to move, castling, en passant, rule50 spread,
    Chess960, promotions and histories with repetitions; and the formats differ where they should."""
    boards = [board_of(p) for p in lc0_record["positions"]]
    assert {E.canonical_transform(b) for b in boards} == set(range(8))
    assert {b.turn for b in boards} == {True, False}
    assert any(p["chess960"] for p in lc0_record["positions"])
    assert {b.halfmove_clock for b in boards} >= {0, 1, 50, 99}
    assert max(len(p["moves"]) for p in lc0_record["positions"]) >= 40
    assert any(b.is_repetition(2) for b in boards)
    v = {f: [r["v"] for r in rows] for f, rows in lc0_record["formats"].items()}
    for a in v:
        for b in v:
            if a < b:
                assert v[a] != v[b], (a, b)


# --------------------------------------------------------------------------- the rules

def planes(fen, moves=(), input_format=1, chess960=False):
    return E.encode_position(fen, list(moves), chess960=chess960, input_format=input_format)


def squares(plane: np.ndarray) -> set:
    return {_name(int(f), int(r)) for r, f in np.argwhere(plane > 0)}


def test_unknown_formats_are_refused():
    board = Board()
    for call in (lambda: E.encode_board(board, input_format=6), lambda: E.encode_boards([board], input_format=0),
                 lambda: E.move_to_index(board, "e2e4", input_format=134),
                 lambda: E.index_to_move(board, 322, input_format=7), lambda: E.legal_mask(board, input_format=-1),
                 lambda: E.legal_policy(board, np.zeros(1858), input_format=99),
                 lambda: E.encode_position(input_format=8)):
        with pytest.raises(ValueError, match=r"input format .*1, 2, 3, 4, 5, 132, 133"):
            call()
    assert E.INPUT_FORMATS == (1, 2, 3, 4, 5, 132, 133)


def test_format_1_is_the_default_and_unchanged():
    board = Board()
    for move in ("e2e4", "c7c5", "g1f3", "d7d6"):
        board.push_uci(move)
    assert np.array_equal(E.encode_board(board), E.encode_board(board, input_format=1))
    assert E.move_to_index(board, "f1b5") == E.move_to_index(board, "f1b5", input_format=5)  # castling rights: no transform


def test_castling_plane_holds_the_rooks_squares():
    fen = "r3k2r/8/8/8/8/8/8/R3K2R {} Kq - 0 1"
    white, black = planes(fen.format("w"), input_format=2), planes(fen.format("b"), input_format=2)
    assert squares(white[104]) == {"a8"} and squares(white[105]) == {"h1"}      # a-side: theirs; h-side: ours
    assert squares(black[104]) == {"a1"} and squares(black[105]) == {"h8"}      # black's view: ranks mirrored
    assert not white[106:108].any() and not black[106:108].any()
    assert not white[108].any() and black[108].all()                            # side to move, as in format 1
    chess960 = planes("1r1k2r1/8/8/8/8/8/8/1R1K2R1 w GBb - 0 1", input_format=2, chess960=True)
    assert squares(chess960[104]) == {"b1", "b8"} and squares(chess960[105]) == {"g1"}
    classical = planes(fen.format("w"))
    assert classical[105].all() and classical[106].all() and not classical[104].any()


def test_our_king_on_files_a_to_d_flips_the_files():
    fen = "2kr4/ppp2ppp/8/4n3/8/2N5/PPP2PPP/2KR4 w - - 0 30"
    flipped, classical = planes(fen, input_format=3), planes(fen)
    assert E.canonical_transform(Board(fen)) == E.FLIP
    assert np.array_equal(flipped[:13], classical[:13, :, ::-1])
    assert not flipped[13:104].any()                       # rule50 0: nothing before it is history
    kept = planes(fen.replace("2kr4/", "3r2k1/").replace("2KR4 w", "3R2K1 w"), input_format=3)
    assert squares(kept[5]) == {"g1"}                      # king on g1: no transform


@pytest.mark.parametrize("king, transform", [("g1", 0), ("b1", E.FLIP), ("g8", E.MIRROR), ("b8", E.FLIP | E.MIRROR),
                                             ("h3", E.TRANSPOSE), ("a4", E.FLIP | E.TRANSPOSE),
                                             ("h6", E.MIRROR | E.TRANSPOSE),
                                             ("a5", E.FLIP | E.MIRROR | E.TRANSPOSE)])
def test_pawnless_positions_are_canonicalized(king, transform):
    """The king lands in the e1-h4 quadrant under the a8-h1 diagonal: flip for files a-d, mirror for
    ranks 5-8, transpose above the diagonal; every plane goes through the transform."""
    rows = [["."] * 8 for _ in range(8)]
    f, r = _square(king)
    rows[r][f] = "K"
    rows[(r + 4) % 8][(f + 2) % 8] = "k"
    rows[(r + 2) % 8][(f + 5) % 8] = "R"
    fen = "/".join("".join(row) for row in reversed(rows))
    for n in range(8, 0, -1):
        fen = fen.replace("." * n, str(n))
    fen += " w - - 3 60"
    board = Board(fen)
    assert E.canonical_transform(board, 3) == transform
    ours = planes(fen, input_format=3)
    (kf, kr), = [(int(c), int(rr)) for rr, c in np.argwhere(ours[5])]
    assert kf >= 4 and kr <= 3 and kf + kr <= 7          # e1-h4, on or under the a8-h1 diagonal
    classical = planes(fen)
    for plane in (0, 3, 5, 9, 11):
        want = {v031_square(s, transform) for s in squares(classical[plane])}
        assert squares(ours[plane]) == want, plane
    for move in board.legal_moves():
        assert E.move_to_index(board, move, input_format=3) == v031_index(board, move, transform)
        assert E.index_to_move(board, E.move_to_index(board, move, input_format=3), input_format=3) == move
    assert E.legal_mask(board, input_format=3).sum() == len(board.legal_moves())


def _v031(f: int, r: int, transform: int) -> tuple:
    """Square (file, rank) as lc0 v0.31 transforms it: flip, then mirror, then the transpose the
    planes go through ((file, rank) -> (7 - rank, 7 - file))."""
    if transform & E.FLIP:
        f = 7 - f
    if transform & E.MIRROR:
        r = 7 - r
    if transform & E.TRANSPOSE:
        f, r = 7 - r, 7 - f
    return f, r


def v031_square(name: str, transform: int) -> str:
    return _name(*_v031(*_square(name), transform))


def _image(f: int, r: int, k: int) -> tuple:
    """Square (file, rank) under the k-th of the board's 8 symmetries: files reversed (k & 1),
    ranks reversed (k & 2), then reflected in the a1-h8 diagonal (k & 4)."""
    if k & 1:
        f = 7 - f
    if k & 2:
        r = 7 - r
    if k & 4:
        f, r = r, f
    return f, r


def _dihedral(fen: str, k: int) -> str:
    """``fen`` (pawnless, no castling, white to move) under the k-th of the board's 8 symmetries."""
    rows = []
    for row in fen.split()[0].split("/"):
        expanded = ""
        for c in row:
            expanded += "." * int(c) if c.isdigit() else c
        rows.append(expanded)
    grid = {(f, 7 - r): rows[r][f] for r in range(8) for f in range(8)}
    out = {_image(f, r, k): c for (f, r), c in grid.items()}
    text = "/".join("".join(out[(f, r)] for f in range(8)) for r in range(7, -1, -1))
    for n in range(8, 0, -1):
        text = text.replace("." * n, str(n))
    return text + " " + " ".join(fen.split()[1:])


def test_symmetric_pawnless_positions_encode_alike_and_index_alike():
    """The point of canonicalization: the 8 images of a pawnless position have the same planes, and
    with the plane-consistent (v0.31) policy mapping the same move has the same index in each."""
    fen = "8/8/2k5/8/5n2/8/1K4R1/8 w - - 5 70"
    base = planes(fen, input_format=4)
    board = Board(fen)
    for k in range(8):
        image = _dihedral(fen, k)
        assert np.array_equal(planes(image, input_format=4), base), image
        other = Board(image)
        for move in board.legal_moves():
            mapped = _name(*_image(*_square(move[:2]), k)) + _name(*_image(*_square(move[2:4]), k))
            assert E.move_to_index(other, mapped, input_format=4) == E.move_to_index(board, move, input_format=4)


def test_en_passant_plane_and_the_rule50_plane():
    fen = "8/8/8/KPp4r/8/8/8/4k3 w - c6 0 1"                  # the capturer is pinned: no legal capture
    assert "b5c6" not in Board(fen).legal_moves()
    p3 = planes(fen, input_format=3)
    assert squares(p3[108]) == {"f8"}                          # lc0 marks c6 anyway; king a5: files flipped
    assert not planes(fen.replace(" c6 ", " - "), input_format=3)[108].any()
    by_move = planes("4k3/2p5/8/KP5r/8/8/8/8 b - - 0 1", ["c7c5"], input_format=3)
    assert np.array_equal(by_move[108], p3[108])
    fen = "6k1/5ppp/8/8/8/8/5PPP/3R2K1 b - - 37 40"
    for f, value in ((2, 37.0), (3, 37.0), (4, 0.37), (132, 0.37), (5, 0.37), (133, 0.37)):
        got = planes(fen, input_format=f)
        assert np.allclose(got[109], value) and got[111].all()
        assert got[110].all() == (f in (132, 133)) and (got[110].any() == (f in (132, 133)))
    assert not planes(fen.replace(" b ", " w "), input_format=132)[110].any()


def test_canonical_history_stops_at_castling_changes_en_passant_and_zeroing_moves():
    def filled(p):
        return [bool(p[13 * i:13 * i + 12].any()) for i in range(8)]
    castled = ["e2e4", "e7e5", "g1f3", "b8c6", "f1c4", "f8c5", "e1g1", "g8f6", "d2d3"]
    # rights changed at e1g1: the history after it only (g8f6, d2d3 ... the position after e1g1 has
    # white's rights gone, as now); d2d3 is a pawn move: rule50 0 -> only the current position
    assert filled(planes(None, castled, 3)) == [True] + [False] * 7
    assert filled(planes(None, castled[:-1], 3)) == [True, True] + [False] * 6     # g8f6, e1g1: then rights differ
    assert all(filled(planes(None, castled[:-1], 2)))                              # format 2: the classical history
    ep = ["e2e4", "d7d5", "e4e5", "f7f5", "g1f3", "g8f6"]
    assert filled(planes(None, ep, 3)) == [True, True] + [False] * 6               # not the position after f7f5
    fen_only = planes("8/8/3k4/8/8/8/1R6/1K6 w - - 10 50", input_format=3)
    assert all(filled(fen_only))                                                   # a FEN: its position repeated
    assert filled(planes("8/8/3k4/8/8/8/1R6/1K6 w - - 10 50", input_format=5)) == [True] + [False] * 7


def test_v2_history_keeps_only_repeated_positions():
    knights = ["g1f3", "g8f6", "f3g1", "f6g8"] * 2
    v2, v1 = planes(None, knights, 5), planes(None, knights, 3)
    # plies 8 (now, a repeat of 4 and 0), 7, 6, 5, 4 repeat earlier positions; 3..0 do not
    assert [bool(v2[13 * i:13 * i + 12].any()) for i in range(8)] == [True] * 5 + [False] * 3
    assert all(v2[13 * i + 12].all() for i in range(1, 5))
    assert np.array_equal(v2[:13 * 5], v1[:13 * 5])
    once = planes(None, knights[:5], 133)                   # ply 5 repeats ply 1, ply 4 ply 0; 3-1 not
    assert [bool(once[13 * i:13 * i + 12].any()) for i in range(8)] == [True, True] + [False] * 6
    assert np.array_equal(once[13:26], planes(None, knights[:4], 1)[:13])


@pytest.mark.parametrize("input_format", E.INPUT_FORMATS)
def test_the_diff_writer_writes_what_the_full_encoder_writes(input_format):
    board = Board("8/8/3k4/8/8/8/1R6/1K6 w - - 10 50")
    out = np.zeros((112, 8, 8), dtype=np.float32)
    last = np.zeros(104, dtype=np.uint64)
    for move in ["b2b3", "d6d5", "b3b2", "d5d6", "b2b3", "d6d5", "b1c1", "d5e4", "c1d1", "e4f4"]:
        board.push_uci(move)
        E._encode_over(board, out, last, input_format)
        assert np.array_equal(out, E.encode_board(board, input_format=input_format)), move
