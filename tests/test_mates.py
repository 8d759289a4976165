"""The mate position set (engine/tools/mates.epd), its generator and ``cyzero bench mates``.

The set is checked with python-chess alone, independently of the Stockfish that made it:
every ``bm`` mates in exactly ``dm`` and no other move does (all mates in 1 and 2; a sample
of the mates in 3, which cost more in Python).
"""

import argparse
import json
import os
import random
import shutil

import chess
import pytest

from engine.tools import mates
from engine.tools.mates import MatePosition, MatesError, load_positions, score

STOCKFISH = shutil.which("stockfish") or ("/usr/games/stockfish" if os.access("/usr/games/stockfish", os.X_OK) else None)
needs_stockfish = pytest.mark.skipif(STOCKFISH is None, reason="needs Debian's stockfish: apt install stockfish (it goes to /usr/games)")

MATE3_SAMPLE = 16


# --------------------------------------------------------------------------- a python-chess mate solver


def _ordered(board: chess.Board, n: int):
    """Checks first (for a mate in 1 only checks can mate): the forcing moves find mates fastest."""
    moves = list(board.legal_moves)
    checks = [m for m in moves if board.gives_check(m)]
    return checks if n == 1 else checks + [m for m in moves if not board.gives_check(m)]


def forces_mate(board: chess.Board, n: int) -> bool:
    """The side to move can force checkmate within ``n`` of its moves."""
    return any(move_mates_within(board, m, n) for m in _ordered(board, n))


def move_mates_within(board: chess.Board, move: chess.Move, n: int) -> bool:
    board.push(move)
    try:
        if board.is_checkmate():
            return True
        if n == 1 or board.is_game_over():
            return False
        for reply in list(board.legal_moves):
            board.push(reply)
            try:
                if not forces_mate(board, n - 1):
                    return False
            finally:
                board.pop()
        return True
    finally:
        board.pop()


def mates_exactly(board: chess.Board, move: chess.Move, n: int) -> bool:
    return move_mates_within(board, move, n) and (n == 1 or not forces_mate(board, n - 1))


# --------------------------------------------------------------------------- the bundled set


@pytest.fixture(scope="module")
def bundled():
    return load_positions()


def test_the_bundled_set_has_fifty_distinct_positions_of_each_length(bundled):
    assert [sum(p.mate == n for p in bundled) for n in (1, 2, 3)] == [50, 50, 50]
    assert len({p.id for p in bundled}) == len(bundled)
    assert len({p.fen.rsplit(" ", 2)[0] for p in bundled}) == len(bundled)
    for p in bundled:
        board = chess.Board(p.fen)
        assert board.is_valid() and not board.is_game_over()
        assert all(chess.Move.from_uci(m) in board.legal_moves for m in p.moves)


def _check_complete(p: MatePosition) -> None:
    board = chess.Board(p.fen)
    solving = {m.uci() for m in board.legal_moves if mates_exactly(board, m, p.mate)}
    assert solving == set(p.moves), p.id


@pytest.mark.parametrize("length", [1, 2])
def test_every_mate_in_one_and_two_has_exactly_its_bm_moves_mating(bundled, length):
    for p in bundled:
        if p.mate == length:
            _check_complete(p)


def test_a_sample_of_the_mates_in_three_mate_in_exactly_three(bundled):
    threes = [p for p in bundled if p.mate == 3]
    for p in threes[:: len(threes) // MATE3_SAMPLE][:MATE3_SAMPLE]:
        board = chess.Board(p.fen)
        assert not forces_mate(board, 2), p.id
        for m in p.moves:
            assert move_mates_within(board, chess.Move.from_uci(m), 3), (p.id, m)


def test_the_solver_tells_a_mate_from_a_non_mate():
    # Scholar's mate: Qxf7# mates in one, Qxe5+ does not; in two, 1.Qh5 forces nothing.
    board = chess.Board("r1bqkbnr/pppp1ppp/2n5/4p2Q/2B1P3/8/PPPP1PPP/RNB1K1NR w KQkq - 2 3")
    assert mates_exactly(board, chess.Move.from_uci("h5f7"), 1)
    assert not move_mates_within(board, chess.Move.from_uci("h5e5"), 1)
    assert not forces_mate(chess.Board(), 2)


# --------------------------------------------------------------------------- the position file


def test_load_positions_reads_bm_dm_and_id_and_refuses_bad_lines(tmp_path):
    path = tmp_path / "m.epd"
    path.write_text('# a comment\n6k1/5ppp/8/8/8/8/8/R5K1 w - - bm Ra8#; dm 1; id "back rank";\n')
    [p] = load_positions(path)
    assert (p.id, p.mate, p.moves, p.fen) == ("back rank", 1, ("a1a8",), "6k1/5ppp/8/8/8/8/8/R5K1 w - - 0 1")
    assert mates.epd_line(p).startswith("6k1/5ppp/8/8/8/8/8/R5K1 w - - bm Ra8#; dm 1;")
    path.write_text("6k1/5ppp/8/8/8/8/8/R5K1 w - - bm Ra8#; dm 4;\n")
    with pytest.raises(MatesError, match="dm"):
        load_positions(path)
    with pytest.raises(MatesError, match="cannot read"):
        load_positions(tmp_path / "missing.epd")


# --------------------------------------------------------------------------- scoring


POSITIONS = [
    MatePosition("a", "6k1/5ppp/8/8/8/8/8/R5K1 w - - 0 1", 1, ("a1a8",)),
    MatePosition("b", "6k1/5ppp/8/8/8/8/8/R5K1 w - - 0 1", 1, ("a1a8",)),
    MatePosition("c", "r1bqkbnr/pppp1ppp/2n5/4p2Q/2B1P3/8/PPPP1PPP/RNB1K1NR w KQkq - 2 3", 2, ("h5f7",)),
]


def test_score_counts_a_bm_move_as_solved_and_any_other_move_not():
    answers = iter(["a1a8", "a1a7", None, "a1a8", "a1a8", "h5f7"])   # 2 budgets x 3 positions
    calls = []

    def search(fen, nodes):
        calls.append(nodes)
        return next(answers), 0.5

    result = score(POSITIONS, [10, 20], search)
    assert calls == [10, 10, 10, 20, 20, 20]
    low, high = result["budgets"]
    assert (low["nodes"], low["solved"], low["positions"], low["share"]) == (10, 1, 3, round(1 / 3, 4))
    assert low["by_mate"]["1"] == {"positions": 2, "solved": 1, "share": 0.5}
    assert low["by_mate"]["2"] == {"positions": 1, "solved": 0, "share": 0.0}
    assert low["by_mate"]["3"] == {"positions": 0, "solved": 0, "share": None}
    assert (high["solved"], high["share"], high["mean_search_s"]) == (3, 1.0, 0.5)


def _args(path, nodes, as_json=True):
    return argparse.Namespace(positions=str(path), nodes=nodes, weights=None, json=as_json)


def test_the_engine_searches_in_process_and_the_shares_have_the_table_shape(tmp_path, capsys, bundled):
    """The real search and network on a handful of positions at small node counts: structure
    only (the bundled network may be untrained)."""
    path = tmp_path / "few.epd"
    few = [p for n in (1, 2, 3) for p in bundled if p.mate == n][::50] + [bundled[1]]
    path.write_text("".join(mates.epd_line(p) + "\n" for p in few))
    assert mates.run_bench(_args(path, (8, 32))) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["benchmark"] == "mates"
    assert [b["nodes"] for b in summary["budgets"]] == [8, 32]
    for b in summary["budgets"]:
        assert b["positions"] == 4 and 0.0 <= b["share"] <= 1.0 and b["mean_search_s"] > 0
        assert [b["by_mate"][k]["positions"] for k in ("1", "2", "3")] == [2, 1, 1]
        assert all(0.0 <= v["share"] <= 1.0 for v in b["by_mate"].values())
        assert b["solved"] == sum(v["solved"] for v in b["by_mate"].values())


def test_the_cli_prints_a_table_and_refuses_a_bad_node_list(tmp_path, capsys):
    from uci.cli import build_parser

    path = tmp_path / "one.epd"
    path.write_text(mates.epd_line(POSITIONS[0]) + "\n")
    args = build_parser().parse_args(["bench", "mates", "--positions", str(path), "--nodes", "4"])
    assert mates.run_bench(args, search=lambda fen, nodes: ("a1a8", 0.01)) == 0
    out = capsys.readouterr().out
    assert "mate in 1" in out and "100%  1/1" in out
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "mates", "--nodes", "400,x"])
    args = build_parser().parse_args(["bench", "mates", "--positions", str(tmp_path / "none.epd")])
    assert args.func(args) == 1
    assert "cannot read positions" in capsys.readouterr().err


# --------------------------------------------------------------------------- the generator


@needs_stockfish
def test_the_generator_writes_verified_mates_deterministically(tmp_path):
    first, second = tmp_path / "a.epd", tmp_path / "b.epd"
    positions = mates.generate(first, per_length=1, seed=7, teacher=[STOCKFISH], max_games=20)
    assert sorted(p.mate for p in positions) == [1, 2, 3]
    assert load_positions(first) == positions
    for p in positions:
        board = chess.Board(p.fen)
        for m in p.moves:
            assert move_mates_within(board, chess.Move.from_uci(m), p.mate), (p.id, m)
        if p.mate < 3:
            _check_complete(p)
    mates.generate(second, per_length=1, seed=7, teacher=[STOCKFISH], max_games=20)
    assert second.read_text() == first.read_text()


# --------------------------------------------------------------------------- gives check


def test_gives_check_is_python_chess_s():
    """Board.gives_check (the core's test that spares the mate-in-one check at each new leaf a
    make_move per quiet move) says what python-chess says, for every legal move along random
    games from the perft, special and mate positions (discovered checks, promotions, castling,
    en passant among them)."""
    from test_board_differential import PERFT_FENS, SPECIAL_FENS

    from engine.board import Board

    rng = random.Random(47)
    starts = [chess.STARTING_FEN, *PERFT_FENS.values(), *SPECIAL_FENS.values(),
              *(p.fen for p in load_positions()[::4])]
    moves = checks = 0
    for fen in starts:
        ref = chess.Board(fen)
        for _ in range(30):
            legal = list(ref.legal_moves)
            if not legal:
                break
            ours = Board(ref.fen())
            for move in legal:
                want = ref.gives_check(move)
                assert ours.gives_check(move.uci()) == want, (ref.fen(), move.uci())
                moves += 1
                checks += want
            ref.push(rng.choice(legal))
    assert moves > 10000 and checks > 500
    with pytest.raises(ValueError):
        Board().gives_check("e2e5")
