"""The search loop: limits, stop, ponder, callbacks, with a fake network."""

import threading
import time

import chess
import numpy as np
import pytest

from engine.board import Board
from engine.limits import GoParams
from engine.params import SearchParams
from engine.search import Searcher, q_to_cp, wdl_permille
from engine.timeman import TimeManager


class FakeNetwork:
    """Uniform policy, a fixed WDL, and an optional delay per call (a slow GPU/CPU batch)."""

    def __init__(self, delay=0.0, wdl=(0.3, 0.4, 0.3), fail=False):
        self.delay = delay
        self.wdl = np.array(wdl, dtype=np.float32)
        self.fail = fail
        self.calls = 0

    def evaluate(self, planes):
        self.calls += 1
        if self.fail:
            raise RuntimeError("the accelerator caught fire")
        if self.delay:
            time.sleep(self.delay)
        n = len(planes)
        return (np.zeros((n, 1858), np.float32), np.tile(self.wdl, (n, 1)),
                np.full(n, 40.0, np.float32))


class Recorder:
    def __init__(self):
        self.infos = []
        self.results = []
        self.done = threading.Event()

    def info(self, info):
        self.infos.append(info)

    def best(self, result):
        self.results.append(result)
        self.best_at = time.monotonic()
        self.done.set()


def run(searcher, board, go, timeout=10.0):
    rec = Recorder()
    searcher.start(board, go, rec.info, rec.best)
    assert rec.done.wait(timeout), "no bestmove"
    searcher.wait(timeout)
    return rec


@pytest.fixture
def searcher():
    return Searcher(lambda: FakeNetwork(), SearchParams(minibatch_size=32, move_overhead_ms=0))


def test_nodes_limit_is_reached_and_move_is_legal(searcher):
    rec = run(searcher, Board(), GoParams(nodes=300))
    assert len(rec.results) == 1
    result = rec.results[0]
    assert result.best in Board().legal_moves()
    assert searcher.tree.nodes >= 300
    assert result.ponder is None or result.ponder in _after(Board(), result.best).legal_moves()


def _after(board, move):
    b = board.copy()
    b.push_uci(move)
    return b


def test_movetime_is_respected(searcher):
    t0 = time.monotonic()
    run(searcher, Board(), GoParams(movetime=200))
    elapsed = time.monotonic() - t0
    assert 0.15 <= elapsed < 0.6


def test_hard_deadline_does_not_wait_for_a_slow_batch():
    """A batch that takes 300 ms must not hold back the best move of a 100 ms search."""
    s = Searcher(lambda: FakeNetwork(delay=0.3), SearchParams(minibatch_size=32, move_overhead_ms=0))
    t0 = time.monotonic()
    rec = run(s, Board(), GoParams(movetime=100))
    assert rec.best_at - t0 < 0.2
    assert rec.results[0].best in Board().legal_moves()


def test_stop_answers_at_once_with_exactly_one_bestmove():
    s = Searcher(lambda: FakeNetwork(delay=0.05), SearchParams(minibatch_size=32))
    rec = Recorder()
    s.start(Board(), GoParams(infinite=True), rec.info, rec.best)
    time.sleep(0.3)
    assert not rec.done.is_set(), "go infinite ended by itself"
    t0 = time.monotonic()
    s.stop()
    assert rec.done.wait(1.0)
    assert time.monotonic() - t0 < 0.05
    s.stop()
    s.wait(2.0)
    time.sleep(0.1)
    assert len(rec.results) == 1


def test_infinite_never_ends_by_itself_even_when_solved():
    s = Searcher(lambda: FakeNetwork(), SearchParams(minibatch_size=16))
    rec = Recorder()
    s.start(Board("6k1/5ppp/8/8/8/8/8/R6K w - - 0 1"), GoParams(infinite=True), rec.info, rec.best)
    time.sleep(0.5)
    assert s.tree.root_proven == 1
    assert not rec.done.is_set()
    s.stop()
    assert rec.done.wait(1.0)
    assert rec.results[0].best == "a1a8"


def test_ponder_then_ponderhit_becomes_a_timed_search():
    s = Searcher(lambda: FakeNetwork(), SearchParams(minibatch_size=16, move_overhead_ms=0))
    rec = Recorder()
    s.start(Board(), GoParams(ponder=True, movetime=150), rec.info, rec.best)
    time.sleep(0.3)
    assert not rec.done.is_set(), "a ponder search ended by itself"
    t0 = time.monotonic()
    s.ponderhit()
    assert rec.done.wait(2.0)
    assert 0.1 <= time.monotonic() - t0 < 0.5
    assert len(rec.results) == 1


def test_ponder_miss_stop_reports_once():
    s = Searcher(lambda: FakeNetwork(), SearchParams(minibatch_size=16))
    rec = Recorder()
    s.start(Board(), GoParams(ponder=True, wtime=10000, btime=10000), rec.info, rec.best)
    time.sleep(0.1)
    s.stop()
    assert rec.done.wait(1.0)
    s.wait(1.0)
    assert len(rec.results) == 1


def test_mate_is_found_and_reported_as_mate(searcher):
    rec = run(searcher, Board("6k1/5ppp/8/8/8/8/8/R6K w - - 0 1"), GoParams(nodes=2000))
    assert rec.results[0].best == "a1a8"
    final = rec.results[0].info
    assert final.lines[0].mate == 1
    assert final.lines[0].pv == ["a1a8"]


def test_mate_limit_stops_early(searcher):
    rec = run(searcher, Board("6k1/5ppp/8/8/8/8/8/R6K w - - 0 1"), GoParams(mate=1))
    assert rec.results[0].best == "a1a8"


def test_depth_limit(searcher):
    run(searcher, Board(), GoParams(depth=3))
    assert searcher.tree.average_depth >= 3


def test_terminal_root_gives_no_move(searcher):
    for fen in ("7k/5Q2/6K1/8/8/8/8/8 b - - 0 1", "R5k1/5ppp/8/8/8/8/8/7K b - - 0 1"):
        rec = run(searcher, Board(fen), GoParams(movetime=50))
        assert rec.results[0].best is None


def test_zero_or_negative_clock_plays_a_legal_move_at_once(searcher):
    for go in (GoParams(wtime=0, btime=0), GoParams(wtime=-50, btime=1000), GoParams(wtime=3, btime=3)):
        t0 = time.monotonic()
        rec = run(searcher, Board(), go)
        assert time.monotonic() - t0 < 0.5
        assert rec.results[0].best in Board().legal_moves()


def test_searchmoves_restricts_the_choice(searcher):
    rec = run(searcher, Board(), GoParams(nodes=200, searchmoves=["a2a3", "h2h4"]))
    assert rec.results[0].best in ("a2a3", "h2h4")
    for info in rec.infos:
        assert all(line.move in ("a2a3", "h2h4") for line in info.lines)


def test_multipv_reports_distinct_legal_lines():
    s = Searcher(lambda: FakeNetwork(), SearchParams(minibatch_size=32, multipv=3))
    rec = run(s, Board(), GoParams(nodes=500))
    final = rec.results[0].info
    assert [line.multipv for line in final.lines] == [1, 2, 3]
    assert len({line.move for line in final.lines}) == 3
    for line in final.lines:
        board = chess.Board()
        for move in line.pv:
            board.push_uci(move)  # raises if the PV is not legal from the root


def test_info_fields_are_sane(searcher):
    rec = run(searcher, Board(), GoParams(nodes=400))
    assert rec.infos
    for info in rec.infos:
        assert info.depth >= 1 and info.seldepth >= info.depth - 1
        assert info.nodes >= 0 and info.nps >= 0 and info.time_ms >= 0
        for line in info.lines:
            assert sum(line.wdl) == 1000 and min(line.wdl) >= 0
            assert line.pv and line.pv[0] == line.move


def test_network_failure_still_gives_a_bestmove():
    s = Searcher(lambda: FakeNetwork(fail=True), SearchParams(minibatch_size=8, move_overhead_ms=0))
    logs = []
    s.log = logs.append
    rec = run(s, Board(), GoParams(movetime=100))
    assert rec.results[0].best in Board().legal_moves()
    assert any("accelerator caught fire" in line for line in logs)


def test_tree_is_reused_between_moves(searcher):
    run(searcher, Board(), GoParams(nodes=800))
    pv = searcher.tree.pv()
    assert len(pv) >= 2
    before = {c["move"]: c for c in searcher.tree.root_children()}
    board = Board()
    board.push_uci(pv[0])
    board.push_uci(pv[1])
    run(searcher, board, GoParams(nodes=1))
    assert searcher.tree.nodes >= 1
    assert before[pv[0]]["n"] > 1


def test_cp_and_wdl_mappings():
    assert q_to_cp(0.0) == 0
    assert q_to_cp(0.5) > 0 > q_to_cp(-0.5)
    assert q_to_cp(0.5) == -q_to_cp(-0.5)
    assert wdl_permille(0.2, 0.5) == (350, 500, 150)
    assert sum(wdl_permille(-1.0, 0.0)) == 1000


def test_fixed_seed_with_noise_and_temperature_repeats_the_game():
    """Self-play knobs: Dirichlet noise and temperature with a fixed seed give the same moves."""
    def play(seed):
        opts = SearchParams(minibatch_size=16, temperature=1.0, temp_cutoff_ply=5, seed=seed,
                            noise_epsilon=0.25, noise_alpha=0.3)
        s = Searcher(lambda: FakeNetwork(), opts)
        s.apply_options()
        s.new_game()
        board, moves = Board(), []
        for _ in range(6):
            rec = run(s, board, GoParams(nodes=64))
            moves.append(rec.results[0].best)
            board.push_uci(moves[-1])
        return moves

    first = play(7)
    assert play(7) == first
    assert any(play(seed) != first for seed in (8, 9, 10))


def test_temperature_cutoff_plays_the_best_move():
    # Ply 2 of the game (white's second move): at or past the cutoff of 2 plies, no sampling.
    opts = SearchParams(minibatch_size=16, temperature=50.0, temp_cutoff_ply=2, seed=1)
    s = Searcher(lambda: FakeNetwork(), opts)
    rec = run(s, Board("6k1/5ppp/8/8/8/8/8/R6K w - - 0 2"), GoParams(nodes=300))
    assert rec.results[0].best == "a1a8"


def test_nodes_limit_is_not_overshot_by_a_batch():
    s = Searcher(lambda: FakeNetwork(), SearchParams(minibatch_size=256))
    run(s, Board(), GoParams(nodes=50))
    assert 50 <= s.tree.nodes <= 60
