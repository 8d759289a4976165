"""lc0 V6 training records: the byte layout by hand, agreement with the engine's encoder, refusals."""

import gzip
import math
import os
import random
import struct

import numpy as np
import pytest

from engine.board import Board
from engine.encoding import (
    INPUT_FORMATS, POLICY_INDEX, POLICY_SIZE, canonical_transform, encode_board, legal_mask, move_to_index,
)
from trainer.records import (
    RECORD_BYTES,
    RECORD_DTYPE,
    ChunkError,
    Eval,
    check_records,
    compress_records,
    decode_record,
    decode_records,
    in_format,
    inflate_records,
    make_record,
    read_chunk,
    write_chunk,
    write_chunk_members,
)

START_LEGAL = [f"{f}2{f}{r}" for f in "abcdefgh" for r in "34"] + ["b1a3", "b1c3", "g1f3", "g1h3"]


def _record(board, visits, played, **kw):
    args = dict(result_q=0.5, result_d=0.25, plies_left=60.0, root=Eval(0.125, 0.5, 30.0))
    args.update(kw)
    return make_record(board, visits, played=played, **args)


def test_dtype_is_lc0s_packed_8356_bytes():
    assert RECORD_DTYPE.itemsize == RECORD_BYTES == 8356
    offsets = {name: RECORD_DTYPE.fields[name][1] for name in RECORD_DTYPE.names}
    # Offsets of lc0's packed struct, summed by hand from the field sizes.
    assert offsets["probabilities"] == 8
    assert offsets["planes"] == 8 + 4 * 1858 == 7440
    assert offsets["castling_us_ooo"] == 7440 + 8 * 104 == 8272
    assert offsets["side_to_move_or_enpassant"] == 8276
    assert offsets["rule50_count"] == 8277
    assert offsets["root_q"] == 8280
    assert offsets["orig_m"] == 8280 + 14 * 4 == 8336
    assert offsets["visits"] == 8340
    assert offsets["played_idx"] == 8344 and offsets["best_idx"] == 8346
    assert offsets["policy_kld"] == 8348 and offsets["reserved"] == 8352


def test_start_position_golden_bytes():
    board = Board()
    record = _record(board, {"e2e4": 3, "d2d4": 1}, "e2e4", best="e2e4",
                     best_eval=Eval(0.25, 0.5, 29.0), played_eval=Eval(0.25, 0.5, 29.0),
                     orig=Eval(0.0, 0.75, 31.0), policy_kld=0.5)

    probabilities = [-1.0] * 1858
    assert len(START_LEGAL) == 20
    for move in START_LEGAL:
        probabilities[POLICY_INDEX.index(move)] = 0.0
    probabilities[POLICY_INDEX.index("e2e4")] = 0.75
    probabilities[POLICY_INDEX.index("d2d4")] = 0.25

    planes = [0] * 104
    # Our pieces (white), bitboards with a1 = bit 0, then each byte's bits reversed.
    planes[0] = 0x000000000000FF00    # pawns on rank 2: 0xFF reversed is 0xFF
    planes[1] = 0x42                  # knights b1 g1: 01000010 is its own reverse
    planes[2] = 0x24                  # bishops c1 f1
    planes[3] = 0x81                  # rooks a1 h1
    planes[4] = 0x10                  # queen d1 = 0x08, reversed 00010000
    planes[5] = 0x08                  # king e1 = 0x10, reversed 00001000
    planes[6] = 0x00FF000000000000    # their pawns on rank 7
    planes[7] = 0x4200000000000000
    planes[8] = 0x2400000000000000
    planes[9] = 0x8100000000000000
    planes[10] = 0x1000000000000000   # their queen d8
    planes[11] = 0x0800000000000000   # their king e8
    # Planes 12 (repetition) and the 7 empty history slots stay 0.

    expected = (
        struct.pack("<II", 6, 1)
        + struct.pack("<1858f", *probabilities)
        + struct.pack("<104Q", *planes)
        + struct.pack("<8B", 1, 1, 1, 1, 0, 0, 0, 0)
        + struct.pack("<15f", 0.125, 0.25, 0.5, 0.5, 30.0, 29.0, 60.0, 0.5, 0.25,
                      0.25, 0.5, 29.0, 0.0, 0.75, 31.0)
        + struct.pack("<IHHfI", 4, POLICY_INDEX.index("e2e4"), POLICY_INDEX.index("e2e4"), 0.5, 0)
    )
    assert len(expected) == 8356
    assert record.tobytes() == expected
    # The king plane on disk: byte 0 is 0x08 (a1 is the top bit of the first byte).
    assert expected[7440 + 5 * 8: 7440 + 6 * 8] == bytes([0x08, 0, 0, 0, 0, 0, 0, 0])


def test_black_to_move_is_mirrored():
    board = Board()
    board.push_uci("e2e4")
    board.push_uci("g8f6")
    board.push_uci("g1f3")
    data = _record(board, {"e7e5": 2, "b8c6": 2}, "e7e5", best="b8c6").tobytes()

    def plane(i):
        return struct.unpack_from("<Q", data, 7440 + 8 * i)[0]

    # Black's view: rank 8 becomes rank 1. Our (black) pawns a7..h7 -> rank 2.
    assert plane(0) == 0x000000000000FF00
    # Our knights b8, f6 -> b1, f3; b1 = bit 1, f3 = bit 21 -> bytes 0x02, 0x20, reversed 0x40, 0x04.
    assert plane(1) == 0x0000000000040040
    # Our king e8 -> e1: byte 0 = 0x10 reversed = 0x08.
    assert plane(5) == 0x08
    # Their pawns: a2-d2, f2-h2 -> rank 7 byte 0xEF reversed 0xF7; e4 -> e5, bit 4 of byte 4, reversed 0x08.
    assert plane(6) == 0x00F7000800000000
    # Their knights b1, f3 -> b8, f6: byte 7 = 0x02 -> 0x40, byte 5 = 0x20 -> 0x04.
    assert plane(7) == 0x4000040000000000
    # History slot 1 is the position before g1f3 (still black's view): their knight back on g1 -> g8.
    assert plane(13 + 7) == 0x4200000000000000
    # Slot 3 is the start position, slot 4.. empty (a game from the start has no earlier history).
    assert plane(3 * 13 + 0) == 0x000000000000FF00 and plane(4 * 13 + 0) == 0
    assert data[8276] == 1                     # side to move: black
    assert data[8277] == 2                     # rule-50 count
    assert data[8272:8276] == bytes([1, 1, 1, 1])
    # Moves are indexed from the side to move's view: black's e7e5 is e2e4's index.
    played_idx, best_idx = struct.unpack_from("<HH", data, 8344)
    assert played_idx == POLICY_INDEX.index("e2e4")
    assert best_idx == POLICY_INDEX.index("b1c3")
    probabilities = np.frombuffer(data, "<f4", 1858, 8)
    assert probabilities[POLICY_INDEX.index("e2e4")] == 0.5
    assert probabilities[POLICY_INDEX.index("e7e5")] == -1.0


def _unpack_reference(bitboard):
    """Square s (a1 = 0) of an lc0 plane: bit 7 - s % 8 of byte s // 8, written out slowly."""
    out = np.zeros(64, dtype=np.float32)
    for s in range(64):
        out[s] = (bitboard >> (8 * (s // 8) + 7 - s % 8)) & 1
    return out.reshape(8, 8)


def _random_positions(count, seed=7, fens=(None,
                                            "r3k2r/p1ppqpb1/bn2pnp1/3PN3/1p2P3/2N2Q1p/PPPBBPPP/R3K2R w KQkq - 0 1",
                                            "rnbqkbnr/ppp1pppp/8/3pP3/8/8/PPPP1PPP/RNBQKBNR w KQkq d6 0 3",
                                            "8/8/4k3/8/2R5/8/4K3/8 b - - 37 80")):
    rng = random.Random(seed)
    positions = []
    while len(positions) < count:
        board = Board(rng.choice(fens))
        for _ in range(rng.randrange(0, 70)):
            moves = board.legal_moves()
            if not moves or board.halfmove_clock >= 200:
                break
            board.push_uci(rng.choice(moves))
        if board.legal_moves():
            positions.append(board)
    return positions


def test_encoder_and_record_agree_on_random_games():
    rng = random.Random(11)
    boards = _random_positions(200)
    records = []
    for board in boards:
        moves = board.legal_moves()
        visits = {m: rng.randrange(0, 5) for m in rng.sample(moves, min(len(moves), 6))}
        visits[moves[0]] = visits.get(moves[0], 0) + 1
        records.append(_record(board, visits, rng.choice(moves)))
    array = np.asarray(records, dtype=RECORD_DTYPE)
    decoded = decode_records(array)
    for i, board in enumerate(boards):
        expected = encode_board(board)
        for p in range(112):
            np.testing.assert_array_equal(decoded.planes[i, p], expected[p], err_msg=f"{board.fen()} plane {p}")
        for p in range(104):
            np.testing.assert_array_equal(_unpack_reference(int(array[i]["planes"][p])), expected[p])
        policy = decoded.policy[i]
        np.testing.assert_array_equal(policy >= 0, legal_mask(board))
        assert math.isclose(float(policy[policy > 0].sum()), 1.0, rel_tol=1e-5)


def test_invariance_info_flags():
    board = Board()
    assert _record(board, {"e2e4": 1}, "e2e4").tobytes()[8278] == 0
    assert _record(board, {"e2e4": 1}, "e2e4", adjudicated=True).tobytes()[8278] == 0x20
    assert _record(board, {"e2e4": 1}, "e2e4", max_length_exceeded=True).tobytes()[8278] == 0x10


def test_wdl_and_plies_left_targets():
    board = Board()
    win = decode_record(_record(board, {"e2e4": 1}, "e2e4", result_q=1.0, result_d=0.0, plies_left=7.0))
    np.testing.assert_allclose(win.wdl, [1.0, 0.0, 0.0])
    assert win.plies_left == 7.0
    mixed = decode_record(_record(board, {"e2e4": 1}, "e2e4", result_q=-0.5, result_d=0.25).tobytes())
    np.testing.assert_allclose(mixed.wdl, [0.125, 0.25, 0.625])
    assert mixed.policy.shape == (POLICY_SIZE,) and mixed.planes.shape == (112, 8, 8)


def test_q_ratio_mixes_the_searchs_best_move_value_into_the_wdl_target():
    board = Board()
    won = _record(board, {"e2e4": 3, "d2d4": 1}, "e2e4", result_q=1.0, result_d=0.0,
                  best_eval=Eval(0.2, 0.6, 30.0))
    records = np.array([won, _record(board, {"e2e4": 1}, "e2e4", result_q=-1.0, result_d=0.0,
                                     best_eval=Eval(math.nan, math.nan, math.nan))])
    np.testing.assert_allclose(decode_records(records).wdl, [[1, 0, 0], [0, 0, 1]])
    half = decode_records(records, q_ratio=0.5).wdl
    # q = 0.5 + 0.1 = 0.6, d = 0.3: W = (1 - d + q) / 2 = 0.65; the record without a search value keeps its loss
    np.testing.assert_allclose(half, [[0.65, 0.3, 0.05], [0, 0, 1]], atol=1e-6)
    np.testing.assert_allclose(decode_records(records, q_ratio=1.0).wdl[0], [0.3, 0.6, 0.1], atol=1e-6)
    np.testing.assert_allclose(half.sum(axis=1), 1.0, atol=1e-6)
    for bad in (-0.1, 1.5):
        with pytest.raises(ValueError, match="q_ratio"):
            decode_records(records, q_ratio=bad)


def test_writer_refuses_bad_input():
    board = Board()
    with pytest.raises(ValueError, match="e2e5"):
        _record(board, {"e2e5": 1}, "e2e4")
    with pytest.raises(ValueError, match="visits"):
        _record(board, {}, "e2e4")
    with pytest.raises(ValueError, match="played move"):
        _record(board, {"e2e4": 1}, "e7e5")
    with pytest.raises(ValueError, match="result"):
        _record(board, {"e2e4": 1}, "e2e4", result_q=0.9, result_d=0.5)


def _with(record, **fields):
    array = np.array([record], dtype=RECORD_DTYPE)
    for name, value in fields.items():
        array[name][0] = value
    return array


def test_reader_refuses_other_versions_and_formats():
    record = _record(Board(), {"e2e4": 1}, "e2e4")
    with pytest.raises(ValueError, match="version 5"):
        decode_records(_with(record, version=5))
    with pytest.raises(ValueError, match="input format 7"):
        decode_record(_with(record, input_format=7)[0].tobytes())
    with pytest.raises(ValueError, match="8356 bytes"):
        decode_record(record.tobytes()[:-4])


def test_chunk_round_trip_is_atomic(tmp_path):
    board = Board()
    records = []
    for move in ("e2e4", "e7e5", "g1f3"):
        records.append(_record(board, {board.legal_moves()[0]: 1}, board.legal_moves()[0]))
        board.push_uci(move)
    path = tmp_path / "chunk.gz"
    assert write_chunk(path, records) == 3
    assert os.listdir(tmp_path) == ["chunk.gz"]
    back = read_chunk(path)
    assert back.dtype == RECORD_DTYPE and back.shape == (3,)
    assert back.tobytes() == b"".join(r.tobytes() for r in records)
    with gzip.open(path, "rb") as f:   # a plain gzip of records back to back, as lc0 reads them
        assert len(f.read()) == 3 * 8356


def test_chunk_errors_name_the_file(tmp_path):
    record = _record(Board(), {"e2e4": 1}, "e2e4")
    good = tmp_path / "good.gz"
    write_chunk(good, [record, record])
    data = good.read_bytes()

    truncated = tmp_path / "truncated.gz"
    truncated.write_bytes(data[: len(data) // 2])
    with pytest.raises(ChunkError, match="truncated.gz"):
        read_chunk(truncated)

    partial = tmp_path / "partial.gz"
    partial.write_bytes(gzip.compress(record.tobytes() + record.tobytes()[:100]))
    with pytest.raises(ChunkError, match="partial.gz.*whole number"):
        read_chunk(partial)

    garbage = tmp_path / "garbage.gz"
    garbage.write_bytes(b"not a gzip file at all")
    with pytest.raises(ChunkError, match="garbage.gz"):
        read_chunk(garbage)

    v5 = tmp_path / "v5.gz"
    v5.write_bytes(gzip.compress(struct.pack("<II", 5, 1) + bytes(8300)))
    with pytest.raises(ChunkError, match="v5.gz.*version 5"):
        read_chunk(v5)

    mixed = tmp_path / "mixed.gz"
    mixed.write_bytes(gzip.compress(record.tobytes() + _with(record, input_format=3).tobytes()))
    with pytest.raises(ChunkError, match="mixed.gz.*record 1.*input format 3"):
        read_chunk(mixed)


def test_write_chunk_refuses_and_leaves_no_file(tmp_path):
    record = _record(Board(), {"e2e4": 1}, "e2e4")
    with pytest.raises(ValueError, match="version 5"):
        write_chunk(tmp_path / "bad.gz", _with(record, version=5))
    with pytest.raises(ValueError, match="at least one record"):
        write_chunk(tmp_path / "empty.gz", [])
    assert os.listdir(tmp_path) == []


def test_policy_weights_need_not_be_counts():
    """A teacher's softmaxed MultiPV scores are weights, not visits: the target is their share."""
    board = Board()
    record = _record(board, {"e2e4": 0.6, "d2d4": 0.3, "g1f3": 0.1}, "e2e4", nodes=12345)
    sample = decode_record(record)
    policy = sample.policy
    assert policy[move_to_index(board, "e2e4")] == pytest.approx(0.6)
    assert policy[move_to_index(board, "g1f3")] == pytest.approx(0.1)
    assert (policy >= 0).sum() == 20 and policy[policy >= 0].sum() == pytest.approx(1.0)
    assert int(record["visits"]) == 12345


def test_lc0_input_format_2_converts_to_format_1(tmp_path):
    """Format 2 (INPUT_112_WITH_CASTLING_PLANE) writes 1 << rook file in the castling bytes; the rest is format 1."""
    board = Board()
    for move in ("e2e4", "e7e5", "g1f3", "b8c6", "f1c4", "g8f6", "e1g1"):   # white has castled
        board.push_uci(move)
    classical = _record(board, {"d7d6": 1}, "d7d6")
    # Black to move: "us" is black (a8 rook: file 0, h8 rook: file 7), "them" is white, which castled.
    lc0 = _with(classical, input_format=2, castling_us_ooo=1 << 0, castling_us_oo=1 << 7,
                castling_them_ooo=0, castling_them_oo=0)
    assert [int(classical[f]) for f in ("castling_us_ooo", "castling_us_oo", "castling_them_ooo",
                                         "castling_them_oo", "side_to_move_or_enpassant")] == [1, 1, 0, 0, 1]
    assert _record(board, {"d7d6": 1}, "d7d6", input_format=2).tobytes() == lc0.tobytes()   # as lc0 writes it
    converted = in_format(lc0)
    assert converted.tobytes() == np.array([classical], dtype=RECORD_DTYPE).tobytes()
    assert lc0["input_format"][0] == 2   # the input is left alone
    ours, theirs = decode_record(classical), decode_records(lc0)
    assert np.array_equal(theirs.planes[0], ours.planes) and np.array_equal(theirs.policy[0], ours.policy)
    assert np.array_equal(ours.planes, encode_board(board))

    path = tmp_path / "lc0.gz"
    path.write_bytes(gzip.compress(lc0.tobytes() + np.array([classical]).tobytes()))
    back = read_chunk(path)
    assert back.tobytes() == np.array([classical, classical], dtype=RECORD_DTYPE).tobytes()


def test_canonical_records_are_read_in_their_format_and_refused_in_another_by_name(tmp_path):
    board = Board()
    for fmt, name in ((3, "INPUT_112_WITH_CANONICALIZATION"), (5, "INPUT_112_WITH_CANONICALIZATION_V2"),
                      (132, "INPUT_112_WITH_CANONICALIZATION_HECTOPLIES_ARMAGEDDON")):
        record = _with(_record(board, {"e2e4": 1}, "e2e4", input_format=fmt))
        assert in_format(record, fmt) is record
        with pytest.raises(ValueError, match=f"input format {fmt} \\({name}\\).*cannot be converted"):
            in_format(record)
        with pytest.raises(ValueError, match=f"input format 1 .*cannot be converted to input format {fmt}"):
            in_format(_record(board, {"e2e4": 1}, "e2e4")[None], fmt)
    record = _record(board, {"e2e4": 1}, "e2e4", input_format=4)
    path = tmp_path / "canonical.gz"
    path.write_bytes(gzip.compress(record.tobytes()))
    with pytest.raises(ChunkError, match="canonical.gz.*input format 4 .*HECTOPLIES"):
        read_chunk(path)
    assert read_chunk(path, 4).tobytes() == record.tobytes()
    with pytest.raises(ValueError, match="version 7"):
        in_format(_with(record, version=7))
    mixed = np.array([record, _record(board, {"e2e4": 1}, "e2e4")], dtype=RECORD_DTYPE)
    with pytest.raises(ValueError, match="record 1 has input format 1 .*the others input format 4"):
        check_records(mixed)
    with pytest.raises(ValueError, match="record 0 has input format 4 .*not input format 1"):
        check_records(mixed, 1)


def test_records_of_every_input_format_decode_to_what_the_engine_feeds_that_network():
    """The differential test of the canonical records: for each of lc0's input formats, a record's
    planes are the engine's encoder's for that format (flip, mirror, transpose, castling rooks, en
    passant, hectoplies, armageddon) and its policy and move indices are in the transformed frame."""
    pawnless = ("8/8/8/8/8/2k5/8/K6R w - - 30 60", "8/3k4/8/8/8/8/5K2/7Q b - - 99 120")   # transposed ones
    boards, rng = _random_positions(80, seed=5) + _random_positions(40, 5, pawnless), random.Random(5)
    transforms = set()
    for board in boards:
        moves = sorted(board.legal_moves())
        for fmt in INPUT_FORMATS:
            visits = {m: rng.random() + 0.01 for m in moves}
            best = max(visits, key=visits.get)
            record = _record(board, visits, moves[0], input_format=fmt)
            sample = decode_records(record[None], input_format=fmt)
            np.testing.assert_array_equal(sample.planes[0], encode_board(board, input_format=fmt),
                                          err_msg=f"format {fmt}, {board.fen()}")
            total = sum(visits.values())
            for move, n in visits.items():
                assert sample.policy[0, move_to_index(board, move, fmt)] == pytest.approx(n / total)
            assert (sample.policy[0] >= 0).sum() == len(moves)
            assert int(record["played_idx"]) == move_to_index(board, moves[0], fmt)
            assert int(record["best_idx"]) == move_to_index(board, best, fmt)
            if fmt >= 3:
                transforms.add(canonical_transform(board, fmt))
    assert transforms == set(range(8))   # every flip, mirror and transpose was exercised


def test_canonical_record_fields_are_the_ones_lc0_writes():
    """The fields by hand, as lc0's training-data writer fills them: castling bytes 1 << rook file,
    the en passant file (after the flip) in place of the side to move, the transform and black to
    move in invariance_info, the rule-50 count in plies whatever the format."""
    board = Board("r3k2r/8/8/8/3pP3/8/8/R3K2R b KQkq e3 5 10")   # black to move, e3 en passant
    for fmt in (3, 4, 132):
        record = _record(board, {"d4e3": 1}, "d4e3", input_format=fmt)
        assert [int(record[f]) for f in ("castling_us_ooo", "castling_us_oo", "castling_them_ooo",
                                          "castling_them_oo")] == [1, 128, 1, 128]
        assert int(record["side_to_move_or_enpassant"]) == 1 << 4    # the e-file; no transform with castling
        assert int(record["invariance_info"]) == 1 << 7              # transform 0, black to move
        assert int(record["rule50_count"]) == 5
    white = Board("8/8/8/8/8/2k5/8/K6R w - - 30 60")   # our king on the a-file: flipped, and pawnless
    transform = canonical_transform(white, 3)
    assert transform & 1
    record = _record(white, {"h1h8": 1}, "h1h8", input_format=4, adjudicated=True)
    assert int(record["invariance_info"]) == transform | (1 << 5)   # white to move; the adjudicated bit kept
    assert int(record["side_to_move_or_enpassant"]) == 0 and int(record["rule50_count"]) == 30
    assert int(record["played_idx"]) == move_to_index(white, "h1h8", 4) != move_to_index(white, "h1h8")


LC0_DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "lc0")


@pytest.mark.parametrize("fmt", [4, 133])
def test_lc0s_own_canonical_training_records_are_the_ones_make_record_writes(fmt):
    """lc0 v0.32.1's selfplay records in a canonical format (docs/recipes/lc0-canonical-chunks.py):
    replaying each game, the record make_record writes for the position has lc0's bytes (history
    planes, castling rooks' files, en passant file, rule 50, transform and black-to-move bits) and
    lc0's policy, and decode_records gives the engine's planes of that format. lc0 v0.32 indexes a
    transposed position's moves rotated (tests/test_input_formats.py says why); its policy is read
    through that index there, and ours keeps the transpose the planes go through."""
    import json

    from test_input_formats import v032_index

    with open(os.path.join(LC0_DATA, "training-games.json"), encoding="utf-8") as f:
        info = json.load(f)
    records = read_chunk(os.path.join(LC0_DATA, f"training-format{fmt}.gz"), fmt)
    decoded = decode_records(records, input_format=fmt)
    at, seen = 0, set()
    for opening, count in zip(info["openings"], info["records"][str(fmt)]):
        board = Board(opening["fen"]) if opening["fen"] else Board()
        for move in opening["moves"]:
            board.push_uci(move)
        for i in range(at, at + count):
            lc0 = records[i]
            transform = canonical_transform(board, fmt)
            seen.add(transform)
            index = {m: v032_index(board, m, transform) if transform & 4 else move_to_index(board, m, fmt)
                     for m in board.legal_moves()}
            played = next(m for m, k in index.items() if k == int(lc0["played_idx"]))
            visits = {m: float(lc0["probabilities"][k]) for m, k in index.items()}
            ours = _record(board, visits if sum(visits.values()) > 0 else {played: 1.0}, played, input_format=fmt)
            for field in ("planes", "castling_us_ooo", "castling_us_oo", "castling_them_ooo", "castling_them_oo",
                          "side_to_move_or_enpassant", "rule50_count", "input_format", "version"):
                np.testing.assert_array_equal(ours[field], lc0[field], err_msg=f"{field} at {board.fen()}")
            assert int(ours["invariance_info"]) & 0b10000111 == int(lc0["invariance_info"]) & 0b10000111
            for move, k in index.items():
                assert ours["probabilities"][move_to_index(board, move, fmt)] == pytest.approx(
                    float(lc0["probabilities"][k]), abs=1e-6)
            assert (ours["probabilities"] >= 0).sum() == (lc0["probabilities"] >= 0).sum() == len(index)
            np.testing.assert_array_equal(decoded.planes[i], encode_board(board, input_format=fmt))
            board.push_uci(played)
        at += count
    assert at == len(records) and len(seen) > 2   # flips, mirrors and transposes were among them
    assert (records["side_to_move_or_enpassant"] > 0).any()   # and an en passant file


# --------------------------------------------------------------------------- games compressed by their sender


def _game_records(n: int, seed: int) -> np.ndarray:
    board, out = Board(), []
    rng = random.Random(seed)
    for _ in range(n):
        moves = board.legal_moves()
        played = rng.choice(moves)
        out.append(_record(board, {m: rng.randint(1, 50) for m in moves}, played))
        board.push_uci(played)
    return np.array(out, dtype=RECORD_DTYPE)


def test_a_games_gzip_member_inflates_to_its_records_and_nothing_else():
    """Workers send each game's records as one gzip member, which the daemon inflates to check."""
    records = _game_records(6, 1)
    member = compress_records(records)
    assert len(member) < records.nbytes / 10
    assert inflate_records(member, 6).tobytes() == records.tobytes()
    for positions, words in ((5, "exactly 5"), (7, "exactly 7")):       # more, or fewer, than the header says
        with pytest.raises(ValueError, match=words):
            inflate_records(member, positions)
    with pytest.raises(ValueError, match="exactly 6"):                    # a second member after the first
        inflate_records(member + member, 6)
    with pytest.raises(ValueError, match="not a gzip member"):
        inflate_records(records.tobytes(), 6)
    with pytest.raises(ValueError, match="exactly 6"):                    # cut short
        inflate_records(member[:-9], 6)
    bomb = gzip.compress(bytes(64 << 20), compresslevel=1)              # 64 MiB of zeros in 300 KB
    with pytest.raises(ValueError, match="exactly 1 records"):
        inflate_records(bomb, 1)                                          # stops at one record's bytes
    bad = records.copy()
    bad[3]["version"] = 5
    with pytest.raises(ValueError, match="record 3"):
        inflate_records(compress_records(bad), 6)


def test_a_chunk_of_members_is_one_gzip_stream_of_their_records(tmp_path):
    games = [_game_records(n, seed) for seed, n in enumerate((3, 1, 5))]
    path = tmp_path / "chunk.gz"
    write_chunk_members(path, [compress_records(g) for g in games])
    assert read_chunk(path).tobytes() == np.concatenate(games).tobytes()
    with gzip.open(path, "rb") as f:                                      # as lc0's reader takes it
        assert f.read() == np.concatenate(games).tobytes()
