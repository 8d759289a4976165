"""The UCI search (``engine.search.Searcher``): limits, stop, ponder, callbacks, with fake networks.

No assertion here reads a wall clock: a network that blocks until the test
releases it shows that ``stop`` and the hard deadline never wait for a batch,
and everything else is counted (nodes, network calls, bestmoves). Timeouts are
only there so that a broken search fails instead of hanging.
"""

import re
import threading
import time

import chess
import numpy as np
import pytest

from engine.board import Board
from engine.encoding import POLICY_INDEX, POLICY_SIZE
from engine.limits import GoParams
from engine.params import SearchParams
from engine.search import Searcher
from engine.search_report import q_to_cp, wdl_permille
from engine.timeman import TimeManager

TIMEOUT = 30.0   # only for a broken search: nothing here should come close


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
        return (np.zeros((n, POLICY_SIZE), np.float32), np.tile(self.wdl, (n, 1)),
                np.full(n, 40.0, np.float32))


class BlockingNetwork(FakeNetwork):
    """From call ``block_from`` on, each call waits until the test sets ``release``."""

    def __init__(self, block_from=2):
        super().__init__()
        self.block_from = block_from
        self.entered = threading.Event()     # a call is waiting for the release
        self.release = threading.Event()

    def evaluate(self, planes):
        if self.calls + 1 >= self.block_from:
            self.entered.set()
            assert self.release.wait(TIMEOUT), "never released"
        return super().evaluate(planes)


def wait_for(condition, what):
    deadline = time.monotonic() + TIMEOUT
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.002)


class Recorder:
    def __init__(self):
        self.infos = []
        self.results = []
        self.done = threading.Event()

    def info(self, info):
        self.infos.append(info)

    def best(self, result):
        self.results.append(result)
        self.done.set()


def run(searcher, board, go, timeout=TIMEOUT):
    rec = Recorder()
    searcher.start(board, go, rec.info, rec.best)
    assert rec.done.wait(timeout), "no bestmove"
    searcher.wait(timeout)
    return rec


# (pipeline, SearchThreads): one search thread with one or two batches in flight, and two
# search threads gathering into the same tree, with one batch each or two.
SEARCH_MODES = [(False, 1), (True, 1), (False, 2), (True, 2)]
MODE_IDS = ["one-batch", "two-batches", "two-threads", "two-threads-two-batches"]


@pytest.fixture(params=SEARCH_MODES, ids=MODE_IDS)
def searcher(request):
    pipeline, threads = request.param
    return Searcher(lambda: FakeNetwork(), SearchParams(minibatch_size=32, move_overhead_ms=0,
                                                        search_threads=threads), pipeline=pipeline)


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


def test_movetime_search_ends_by_itself_after_many_batches():
    net = FakeNetwork()
    s = Searcher(lambda: net, SearchParams(minibatch_size=32, move_overhead_ms=0, smart_pruning_factor=0))
    rec = run(s, Board(), GoParams(movetime=200))       # no stop: it must end by itself
    assert len(rec.results) == 1 and rec.results[0].best in Board().legal_moves()
    assert net.calls > 5 and s.tree.nodes > 5 * 32


@pytest.mark.parametrize("pipeline,threads", SEARCH_MODES, ids=MODE_IDS)
def test_hard_deadline_does_not_wait_for_the_batch_at_the_network(pipeline, threads):
    """The bestmove of a 100 ms search comes while its network call is still blocked."""
    net = BlockingNetwork(block_from=2)
    s = Searcher(lambda: net, SearchParams(minibatch_size=32, move_overhead_ms=0, search_threads=threads),
                 pipeline=pipeline)
    rec = Recorder()
    s.start(Board(), GoParams(movetime=100), rec.info, rec.best)
    assert rec.done.wait(TIMEOUT), "the deadline waited for the network"
    assert net.entered.is_set() and not net.release.is_set()
    assert rec.results[0].best in Board().legal_moves()
    net.release.set()
    s.wait(TIMEOUT)
    assert len(rec.results) == 1


@pytest.mark.parametrize("pipeline,threads", SEARCH_MODES, ids=MODE_IDS)
def test_stop_answers_from_the_tree_with_exactly_one_bestmove(pipeline, threads):
    net = BlockingNetwork(block_from=6)
    s = Searcher(lambda: net, SearchParams(minibatch_size=32, search_threads=threads), pipeline=pipeline)
    rec = Recorder()
    s.start(Board(), GoParams(infinite=True), rec.info, rec.best)
    assert net.entered.wait(TIMEOUT)
    assert not rec.done.is_set(), "go infinite ended by itself"
    s.stop()
    assert rec.done.is_set(), "stop did not answer before returning"   # no wait for the network
    assert rec.results[0].best in Board().legal_moves()
    s.stop()
    net.release.set()
    s.wait(TIMEOUT)
    assert len(rec.results) == 1
    # The stopped search left nothing pending in the tree: the next one runs normally.
    rec = run(s, Board(), GoParams(nodes=200))
    assert s.tree.nodes >= 200 and len(rec.results) == 1


@pytest.mark.parametrize("threads", [1, 2])
def test_infinite_never_ends_by_itself_even_when_solved(threads):
    s = Searcher(lambda: FakeNetwork(), SearchParams(minibatch_size=16, search_threads=threads))
    rec = Recorder()
    s.start(Board("6k1/5ppp/8/8/8/8/8/R6K w - - 0 1"), GoParams(infinite=True), rec.info, rec.best)
    wait_for(lambda: s.tree.root_proven == 1, "the mate to be proven")
    assert not rec.done.is_set()
    s.stop()
    assert rec.done.is_set()
    assert rec.results[0].best == "a1a8"


@pytest.mark.parametrize("threads", [1, 2])
def test_ponder_then_ponderhit_becomes_a_timed_search(threads):
    s = Searcher(lambda: FakeNetwork(), SearchParams(minibatch_size=16, move_overhead_ms=0, search_threads=threads))
    rec = Recorder()
    s.start(Board(), GoParams(ponder=True, movetime=150), rec.info, rec.best)
    wait_for(lambda: s.tree.nodes >= 500, "the ponder search to grow")
    assert not rec.done.is_set(), "a ponder search ended by itself"
    s.ponderhit()
    assert rec.done.wait(TIMEOUT), "the search did not end by itself after ponderhit"
    s.wait(TIMEOUT)
    assert len(rec.results) == 1


def test_ponder_miss_stop_reports_once():
    s = Searcher(lambda: FakeNetwork(), SearchParams(minibatch_size=16))
    rec = Recorder()
    s.start(Board(), GoParams(ponder=True, wtime=10000, btime=10000), rec.info, rec.best)
    wait_for(lambda: s.tree.nodes >= 50, "the ponder search to grow")
    s.stop()
    assert rec.done.is_set()
    s.wait(TIMEOUT)
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


@pytest.mark.parametrize("depth", [1, 2, 3, 4])
def test_depth_limit_stops_at_that_depth(depth):
    """lc0's depth (the mean depth of the playouts, rounded down) ends at N, not past it,
    even with large batches (the first 256-leaf batch used to end go depth 1 at depth 2)."""
    s = Searcher(lambda: FakeNetwork(), SearchParams(minibatch_size=256))
    rec = run(s, Board(), GoParams(depth=depth))
    assert depth <= s.tree.average_depth < depth + 1
    assert rec.results[0].info.depth == depth
    assert all(info.depth <= depth for info in rec.infos)


def test_terminal_root_gives_no_move(searcher):
    for fen in ("7k/5Q2/6K1/8/8/8/8/8 b - - 0 1", "R5k1/5ppp/8/8/8/8/8/7K b - - 0 1"):
        rec = run(searcher, Board(fen), GoParams(movetime=50))
        assert rec.results[0].best is None


def test_zero_or_negative_clock_plays_a_legal_move_at_once():
    for go in (GoParams(wtime=0, btime=0), GoParams(wtime=-50, btime=1000), GoParams(wtime=3, btime=3)):
        net = FakeNetwork()
        s = Searcher(lambda: net, SearchParams(minibatch_size=32, move_overhead_ms=0))
        rec = run(s, Board(), go)
        assert net.calls <= 1          # at most one minimal evaluation
        assert rec.results[0].best in Board().legal_moves()


def test_searchmoves_restricts_the_choice(searcher):
    rec = run(searcher, Board(), GoParams(nodes=200, searchmoves=["a2a3", "h2h4"]))
    assert rec.results[0].best in ("a2a3", "h2h4")
    for info in rec.infos:
        assert all(line.move in ("a2a3", "h2h4") for line in info.lines)


class PeakedNetwork(FakeNetwork):
    """All the policy on ``favourite`` wherever it is legal (white's moves at the root)."""

    def __init__(self, favourite, **kwargs):
        super().__init__(**kwargs)
        self.favourite = POLICY_INDEX.index(favourite)

    def evaluate(self, planes):
        policy, wdl, mlh = super().evaluate(planes)
        policy[:, self.favourite] = 12.0
        return policy, wdl, mlh


def _allowed_visits(tree, moves):
    return {c["move"]: c["n"] for c in tree.root_children() if c["move"] in moves}


@pytest.mark.parametrize("multipv", [1, 3])
def test_searchmoves_after_a_search_search_the_allowed_moves(multipv):
    """The issue's case: after go nodes 400 (nearly all on g1f3 here), go nodes 400 searchmoves
    a2a3 h2h4 answered at once with h2h4, unsearched, and the old search's node count. Now the
    node limit and the reported nodes count only the allowed moves' subtrees, which are
    searched before one of them is played."""
    allowed = ("a2a3", "h2h4")
    s = Searcher(lambda: PeakedNetwork("g1f3"), SearchParams(minibatch_size=16, multipv=multipv))
    run(s, Board(), GoParams(nodes=400))
    assert sum(_allowed_visits(s.tree, allowed).values()) < 20    # the old search hardly looked at them
    rec = run(s, Board(), GoParams(nodes=400, searchmoves=list(allowed)))
    visits = _allowed_visits(s.tree, allowed)
    assert 1 + sum(visits.values()) == s.tree.nodes >= 400
    assert min(visits.values()) > 0
    final = rec.results[0].info
    assert final.nodes == s.tree.nodes
    assert rec.results[0].best == max(visits, key=visits.get)
    assert [line.move for line in final.lines] == sorted(allowed, key=visits.get, reverse=True)[:multipv]
    assert all(line.move in allowed for info in rec.infos for line in info.lines)


def test_searchmoves_under_ponder_search_the_allowed_moves_after_ponderhit():
    allowed = ("a2a3", "h2h4")
    s = Searcher(lambda: PeakedNetwork("g1f3"), SearchParams(minibatch_size=16, move_overhead_ms=0))
    run(s, Board(), GoParams(nodes=300))
    rec = Recorder()
    s.start(Board(), GoParams(ponder=True, nodes=300, searchmoves=list(allowed)), rec.info, rec.best)
    wait_for(lambda: s.tree.nodes >= 50, "the ponder search to run")
    assert not rec.done.is_set()
    s.ponderhit()
    assert rec.done.wait(TIMEOUT)
    s.wait(TIMEOUT)
    visits = _allowed_visits(s.tree, allowed)
    assert rec.results[0].best == max(visits, key=visits.get) and min(visits.values()) > 0
    assert rec.results[0].info.nodes == 1 + sum(visits.values()) >= 300


def test_depth_after_a_long_search_searches_to_that_depth_afresh():
    """go depth 3 after a long search returned at once at depth 9 (a reused tree's first
    playouts run as deep as the old search went). A depth-limited search starts from an
    empty tree, and searches as much as a fresh engine does."""
    fresh = Searcher(lambda: FakeNetwork(), SearchParams(minibatch_size=32))
    want = run(fresh, Board(), GoParams(depth=3)).results[0]
    s = Searcher(lambda: FakeNetwork(), SearchParams(minibatch_size=32))
    run(s, Board(), GoParams(nodes=3000))
    assert s.tree.seldepth > 3
    got = run(s, Board(), GoParams(depth=3)).results[0]
    assert got.info.depth == 3 and 3 <= s.tree.average_depth < 4
    # As much work as a fresh engine's (not identical: cache hits change how batches fill).
    assert abs(got.nodes - want.nodes) <= 0.1 * want.nodes and want.nodes > 100


@pytest.mark.parametrize("factor", [1.33, 0.0])
@pytest.mark.parametrize("verbose", [True, False])
def test_movetime_cut_short_by_smart_pruning_says_so_under_debug(factor, verbose):
    """go movetime stops early (as lc0) once no other move can overtake the best one in the
    time left; under UCI ``debug on`` (``verbose``) it says why in one info string, with how to
    search the whole time, and otherwise says nothing (it came on nearly every move of a game)."""
    logged = []
    s = Searcher(lambda: PeakedNetwork("e2e4", delay=0.002),
                 SearchParams(minibatch_size=8, move_overhead_ms=0, smart_pruning_factor=factor))
    s.log = logged.append
    s.verbose = verbose
    rec = run(s, Board(), GoParams(movetime=800))
    assert rec.results[0].best == "e2e4"
    notes = [line for line in logged if "SmartPruningFactor value 0" in line]
    if factor and verbose:
        assert len(notes) == 1 and notes[0].startswith("stopped after ")
        assert "of 800: no other move can overtake e2e4" in notes[0]
        assert int(notes[0].split()[2]) < 800
    else:
        assert notes == []
    if factor:
        assert rec.results[0].info.time_ms < 790     # pruned, said or not
    steps = [line for line in logged if line.startswith("search: ")]
    assert len(steps) == (1 if verbose else 0), logged
    if verbose:   # where the time went: each step after the go, in order
        assert re.match(r"search: thread started \d+ ms, network ready \d+ ms, first evaluation back "
                        r"\d+ ms; \d+ nodes in \d+ ms$", steps[0]), steps


def test_a_deadline_before_the_first_evaluation_waits_for_it_rather_than_evaluate_again():
    """A machine busy enough that the first evaluation is not back by the hard deadline (145 ms of
    a go movetime 200 after Move Overhead; the issue saw 0 nodes): the watchdog used to stop
    there and evaluate the root a second time, beside the first, to play the policy's move with
    "stopped before the search began". Now it waits for the evaluation under way (for at most
    FIRST_EVALUATION_LIMIT_S once the network is there) and the move comes from the search's own
    backed-up root."""
    logged = []
    net = FakeNetwork(delay=0.3)
    s = Searcher(lambda: net, SearchParams(minibatch_size=8, move_overhead_ms=0))
    s.log = logged.append
    rec = run(s, Board(), GoParams(movetime=100))
    result = rec.results[0]
    assert result.best in Board().legal_moves() and result.nodes >= 1, result
    assert not [line for line in logged if "not searched" in line], logged
    assert net.calls == 1          # the root once, not once more beside it


def test_a_first_evaluation_slower_than_the_grace_is_still_waited_for_once_the_network_is_there():
    """A CI machine with the test suite on both cores beside an OpenVINO build took more than the
    1 s grace for the root's evaluation: with the network in hand the watchdog waits up to
    FIRST_EVALUATION_LIMIT_S, since stopping would only evaluate the root again on the same cores."""
    from engine import search

    assert search.FIRST_EVALUATION_GRACE_S < 1.5 < search.FIRST_EVALUATION_LIMIT_S
    logged = []
    net = FakeNetwork(delay=1.5)
    s = Searcher(lambda: net, SearchParams(minibatch_size=8, move_overhead_ms=0))
    s.log = logged.append
    result = run(s, Board(), GoParams(movetime=100)).results[0]
    assert result.best in Board().legal_moves() and result.nodes >= 1, result
    assert not [line for line in logged if "not searched" in line], logged
    assert net.calls == 1


class OneBlockedCall(FakeNetwork):
    """Call ``blocked`` (counted from 1) waits for ``release``; every other call answers at once."""

    def __init__(self, blocked=2):
        super().__init__()
        self.blocked = blocked
        self.entered = threading.Event()
        self.release = threading.Event()

    def evaluate(self, planes):
        self.calls += 1
        if self.calls == self.blocked:
            self.entered.set()
            assert self.release.wait(TIMEOUT), "never released"
        self.calls -= 1
        return super().evaluate(planes)


@pytest.mark.parametrize("threads", [1, 2])
def test_a_new_search_does_not_wait_for_the_last_ones_batch_at_the_network(threads):
    """A search stopped with a batch at the network: the next search searches at once with the
    other set of batches, while that call is still under way (it used to wait for it: on a network
    of 50 ms a call, a third of a go movetime 200 went by before its first batch)."""
    net = OneBlockedCall()
    s = Searcher(lambda: net, SearchParams(minibatch_size=8, search_threads=threads))
    first = Recorder()
    s.start(Board(), GoParams(infinite=True), first.info, first.best)
    assert net.entered.wait(TIMEOUT)
    s.stop()
    assert first.results and first.results[0].best in Board().legal_moves()
    board = Board()
    board.push_uci("e2e4")
    second = Recorder()
    s.start(board, GoParams(nodes=60), second.info, second.best)
    try:
        assert second.done.wait(TIMEOUT), "the new search waited for the old one's batch"
        assert not net.release.is_set() and second.results[0].nodes >= 60
        assert second.results[0].best in board.legal_moves()
    finally:
        net.release.set()
    s.wait(TIMEOUT)
    # And a third search after both: the sets are reused, nothing is left at the network.
    rec = run(s, Board(), GoParams(nodes=40))
    assert rec.results[0].nodes >= 40


@pytest.mark.parametrize("how", ["multipv", "analysis"])
def test_analysis_searches_the_whole_movetime(how):
    """With MultiPV above 1 or UCI_AnalyseMode smart pruning is off: analyse(Limit(time=2),
    multipv=3) stopped at 0.84 s. The search that would have been pruned runs its time out."""
    s = Searcher(lambda: PeakedNetwork("e2e4", delay=0.002),
                 SearchParams(minibatch_size=8, move_overhead_ms=0, multipv=3 if how == "multipv" else 1))
    s.analysis = how == "analysis"
    rec = run(s, Board(), GoParams(movetime=800))
    assert rec.results[0].best == "e2e4"
    assert rec.results[0].info.time_ms >= 790, rec.results[0].info


class MoveValueNetwork(PeakedNetwork):
    """All the policy on ``favourite`` and a value that differs from move to move: each position's
    W - L (for the side to move) is a hash of its planes, so that every line has its own score."""

    def evaluate(self, planes):
        policy, _, mlh = super().evaluate(planes)
        flat = planes.reshape(len(planes), -1)
        q = np.sin(flat @ np.arange(flat.shape[1], dtype=np.float32) * 0.001) * 0.6
        wdl = np.stack([(1 - 0.3 + q) / 2, np.full_like(q, 0.3), (1 - 0.3 - q) / 2], axis=1).astype(np.float32)
        return policy, wdl, mlh


@pytest.mark.parametrize("multipv", [2, 3, 5])
def test_each_multipv_line_is_searched_and_scored_by_its_own_move(multipv):
    """The issue's case: at 4,000 nodes lines 2 and 3 were unvisited moves shown with the best
    line's score. Now each of the MultiPV lines has at least its share of the visits, its score
    is its own subtree's (the tree's Q for that move), the lines are ranked by visits, then Q, as
    lc0 ranks them, and no two lines show a score that belongs to the other."""
    s = Searcher(lambda: MoveValueNetwork("e2e4"), SearchParams(minibatch_size=8, multipv=multipv))
    rec = run(s, Board(), GoParams(nodes=4000))
    lines = rec.results[0].info.lines
    assert [line.multipv for line in lines] == list(range(1, multipv + 1))
    assert lines[0].move == "e2e4"
    own = {c["move"]: c for c in s.tree.root_children()}
    for line in lines:
        assert line.visits >= 0.9 * 0.5 * 4000 / multipv, (line.move, line.visits)
        assert line.q == pytest.approx(own[line.move]["q"]) and line.visits == own[line.move]["n"]
        assert len(line.pv) > 1
    assert [(line.visits, line.q) for line in lines] == sorted(((line.visits, line.q) for line in lines),
                                                               reverse=True)
    assert len({line.cp for line in lines}) > 1        # scores of their own, not one score copied


def test_without_multipv_the_search_is_not_spread():
    """MultiPV 1 plays as before: the peaked policy's move takes nearly every visit."""
    s = Searcher(lambda: MoveValueNetwork("e2e4"), SearchParams(minibatch_size=8))
    run(s, Board(), GoParams(nodes=2000))
    visits = {c["move"]: c["n"] for c in s.tree.root_children()}
    assert visits["e2e4"] > 0.95 * sum(visits.values())


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


def test_before_any_visit_only_the_move_to_play_has_a_line_with_the_roots_value():
    """Before a root move is visited, only the move to play has a line (go nodes 1, as Maia is
    played): the root's own value, from the side to move: a lost position reads as lost (a forced
    move played at once once read +125 pawns). The other MultiPV lines are not there: a move
    without a value of its own never shows another's score."""
    s = Searcher(lambda: FakeNetwork(wdl=(0.1, 0.1, 0.8)), SearchParams(minibatch_size=1, multipv=3))
    for board in (Board(), Board("5q1K/1k6/8/p7/6r1/8/8/8 w - - 2 66")):  # the second: one legal move
        rec = run(s, board, GoParams(nodes=1))
        final = rec.results[0].info
        assert len(final.lines) == 1 and final.lines[0].visits == 0
        assert final.lines[0].move == rec.results[0].best
        assert final.lines[0].q == pytest.approx(0.1 - 0.8)
        assert final.lines[0].cp < 0 and final.lines[0].wdl[2] > final.lines[0].wdl[0]


def test_info_fields_are_sane(searcher):
    rec = run(searcher, Board(), GoParams(nodes=400))
    assert rec.infos
    for info in rec.infos:
        assert info.depth >= 1 and info.seldepth >= info.depth - 1
        assert info.nodes >= 0 and info.nps >= 0 and info.time_ms >= 0
        for line in info.lines:
            assert sum(line.wdl) == 1000 and min(line.wdl) >= 0
            assert line.pv and line.pv[0] == line.move


def test_a_network_that_cannot_be_loaded_gives_an_error_and_no_move():
    def no_network():
        raise RuntimeError("weights missing")

    s = Searcher(no_network, SearchParams(minibatch_size=32, move_overhead_ms=0))
    for go in (GoParams(nodes=100), GoParams(wtime=0, btime=0), GoParams(movetime=50)):
        rec = run(s, Board(), go)
        result = rec.results[0]
        assert (result.best, result.ponder, result.info) == (None, None, None)
        assert result.error == "no network loaded: weights missing"
    # Without a legal move there is nothing to search: no error.
    rec = run(s, Board("7k/5Q2/6K1/8/8/8/8/8 b - - 0 1"), GoParams(nodes=10))
    assert rec.results[0].best is None and rec.results[0].error is None


def test_network_failure_before_any_search_is_an_error():
    s = Searcher(lambda: FakeNetwork(fail=True), SearchParams(minibatch_size=8, move_overhead_ms=0))
    rec = run(s, Board(), GoParams(movetime=100))
    assert rec.results[0].best is None
    assert rec.results[0].error == "network evaluation failed: the accelerator caught fire"


def test_network_failure_with_a_searched_tree_plays_its_move_and_says_why():
    net = FakeNetwork()
    s = Searcher(lambda: net, SearchParams(minibatch_size=8, move_overhead_ms=0))
    logs = []
    s.log = logs.append
    run(s, Board(), GoParams(nodes=200))
    net.fail = True
    board = Board()
    board.push_uci(s.tree.best_move())
    rec = run(s, board, GoParams(movetime=100))      # the reused subtree has visits
    assert rec.results[0].best in board.legal_moves() and rec.results[0].error is None
    assert any("accelerator caught fire" in line for line in logs)


def test_final_info_is_not_a_repeat_of_the_last_one():
    s = Searcher(lambda: FakeNetwork(), SearchParams(minibatch_size=32))
    s.info_interval_s = 0.0     # an info after every batch: the last one is the final state
    rec = run(s, Board(), GoParams(nodes=300))
    assert len(rec.infos) > 2
    for before, after in zip(rec.infos, rec.infos[1:]):
        assert not after.same_search_state(before)
    assert rec.infos[-1].nodes == s.tree.nodes


def test_result_carries_the_visit_distribution_and_root_value(searcher):
    rec = run(searcher, Board(), GoParams(nodes=300))
    result = rec.results[0]
    assert result.visits == searcher.tree.visit_distribution()
    assert sum(result.visits.values()) == result.nodes - 1 and result.nodes >= 300
    assert (result.q, result.d) == pytest.approx(searcher.tree.root_q)


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


@pytest.mark.parametrize("pipeline,threads", SEARCH_MODES, ids=MODE_IDS)
def test_nodes_limit_is_not_overshot_by_a_batch(pipeline, threads):
    s = Searcher(lambda: FakeNetwork(), SearchParams(minibatch_size=256, search_threads=threads),
                 pipeline=pipeline)
    for nodes in (50, 333):
        s.new_game()
        run(s, Board(), GoParams(nodes=nodes))
        assert s.tree.nodes == nodes


def test_no_info_after_the_best_move_when_stop_meets_an_info_report():
    """stop() reports from the last snapshot when the search thread holds the tree lock; an
    info that thread was about to send must then not follow the best move (a GUI reads a
    bestmove as the end of the search's output)."""
    s = Searcher(lambda: FakeNetwork(), SearchParams(minibatch_size=16))
    order = []
    in_report = threading.Event()
    slow_info = s.info

    def info(*args, **kwargs):     # the search thread inside an info report, tree lock held
        if threading.current_thread().name == "cyzero-search" and s.tree.nodes > 200:
            in_report.set()
            time.sleep(0.2)
        return slow_info(*args, **kwargs)

    s.info = info
    s.start(Board(), GoParams(infinite=True), lambda i: order.append("info"), lambda r: order.append("best"))
    assert in_report.wait(TIMEOUT), "no info report came"
    s.stop()
    s.wait(TIMEOUT)
    assert order.count("best") == 1 and order[-1] == "best", order[-5:]


def test_a_stop_while_the_first_info_line_is_written_plays_its_move_searched():
    """A stop that finds the search thread writing its first info line (stdout slow on a busy
    machine, the tree lock held) plays that line's move, from the snapshot: not the root
    evaluated again and its policy's move called "not searched", as a loaded CI run of a GUI
    changing options between 0.3 s moves found (the line had searched it)."""
    s = Searcher(lambda: FakeNetwork(), SearchParams(minibatch_size=16))
    logged, infos, results = [], [], []
    s.log = logged.append
    writing, release = threading.Event(), threading.Event()

    def on_info(info):
        infos.append(info)
        if threading.current_thread().name == "cyzero-search" and len(infos) == 1:
            writing.set()
            assert release.wait(TIMEOUT), "never released"

    s.start(Board(), GoParams(infinite=True), on_info, results.append)
    assert writing.wait(TIMEOUT), "no info report came"
    stopper = threading.Thread(target=s.stop)
    stopper.start()
    time.sleep(0.1)       # the stop finds the tree lock held and reports once the line is out
    release.set()
    stopper.join(TIMEOUT)
    s.wait(TIMEOUT)
    assert [r.best for r in results] == [infos[0].lines[0].move]
    assert not [line for line in logged if "not searched" in line], logged


def test_a_new_go_during_an_info_report_neither_deadlocks_nor_reports_late():
    """start() holds the go lock while it waits for the tree lock, which the old search thread
    holds while it reports: the report must not wait for the go lock (a deadlock a loaded CI run
    found), and the old search's info must not follow its best move."""
    s = Searcher(lambda: FakeNetwork(), SearchParams(minibatch_size=16))
    order = []
    in_report = threading.Event()
    report = s._on_round

    def slow_report(now, stop):    # the search thread, tree lock held, about to report
        if s.tree.nodes > 200 and not in_report.is_set():
            in_report.set()
            time.sleep(0.3)
        return report(now, stop)

    s._on_round = slow_report
    s.start(Board(), GoParams(infinite=True), lambda i: order.append("info 1"), lambda r: order.append("best 1"))
    assert in_report.wait(TIMEOUT), "no info report came"
    second = Recorder()
    starter = threading.Thread(target=s.start, args=(Board(), GoParams(nodes=100), second.info, second.best),
                               daemon=True)
    starter.start()
    starter.join(TIMEOUT)
    assert not starter.is_alive(), "start() deadlocked against the old search's info report"
    assert second.done.wait(TIMEOUT) and len(second.results) == 1
    assert order.count("best 1") == 1 and order[-1] == "best 1", order[-5:]


@pytest.mark.parametrize("failing", ["timeman", "info"])
def test_a_failure_while_reporting_still_gives_exactly_one_legal_bestmove(failing):
    """Once a search is marked done nothing else reports it: an exception while reporting (seen
    once in an info string's formatting) left the GUI waiting for a bestmove that never came."""
    logged = []
    s = Searcher(lambda: FakeNetwork(), SearchParams(minibatch_size=8, move_overhead_ms=0))
    s.log = logged.append
    rec = Recorder()
    if failing == "timeman":
        def broken_record(*args):
            raise RuntimeError("the clock fell off")
        s.timeman.record = broken_record
        on_info = rec.info
    else:
        def on_info(info):
            raise RuntimeError("the clock fell off")
    s.start(Board(), GoParams(movetime=100), on_info, rec.best)
    assert rec.done.wait(TIMEOUT), "no bestmove"
    s.wait(TIMEOUT)
    time.sleep(0.05)
    assert len(rec.results) == 1 and rec.results[0].best in Board().legal_moves()
    assert [line for line in logged if line.startswith("error: ") and "the clock fell off" in line], logged


# --------------------------------------------------------------------------- search threads


class MeetingNetwork(FakeNetwork):
    """Calls 2 and 3 wait for each other at a barrier (so they are at the network at once); every
    call's rows and calling thread are kept."""

    def __init__(self, fail_from=None):
        super().__init__()
        self.barrier = threading.Barrier(2, timeout=TIMEOUT)
        self.lock = threading.Lock()
        self.batches = []         # (thread, rows as bytes)
        self.fail_from = fail_from

    def evaluate(self, planes):
        with self.lock:
            self.batches.append((threading.current_thread(), [row.tobytes() for row in planes]))
            call = len(self.batches)
        if call in (2, 3):
            self.barrier.wait()
        if self.fail_from is not None and call >= self.fail_from:
            raise RuntimeError("the accelerator caught fire")
        return super().evaluate(planes)


def test_two_search_threads_have_distinct_leaves_at_the_network_at_once():
    """Virtual loss across threads: the second thread's gather steers away from the first's leaves
    in flight. Each thread has one batch (no pipeline), so two calls at the network at once (the
    barrier) can only be the two threads'."""
    net = MeetingNetwork()
    s = Searcher(lambda: net, SearchParams(minibatch_size=16, search_threads=2), pipeline=False)
    rec = run(s, Board(), GoParams(nodes=400))
    (first_thread, first), (second_thread, second) = net.batches[1], net.batches[2]
    assert first_thread is not second_thread
    assert len(set(first) | set(second)) == len(first) + len(second), "a leaf went to the network twice"
    assert len({thread for thread, _ in net.batches}) == 2
    assert rec.results[0].best in Board().legal_moves()
    assert s.tree.nodes == 400
    # Nothing was left in flight: every visit reached the tree, and a new search reuses it.
    assert sum(s.tree.visit_distribution().values()) == s.tree.nodes - 1
    run(s, Board(), GoParams(nodes=800))
    assert s.tree.nodes == 800
    # Every search thread has ended (no thread is left behind by a search).
    assert not any(thread.is_alive() for thread, _ in net.batches)


def test_collisions_between_search_threads_neither_lose_nor_add_visits():
    """A root with three moves and two threads asking 64 leaves each: most of the second gather
    collides with the first's leaves in flight; the visits still add up exactly."""
    board = Board("8/8/8/8/8/5k2/8/6QK w - - 0 1")
    for nodes in (7, 150, 1000):
        s = Searcher(lambda: FakeNetwork(delay=0.002), SearchParams(minibatch_size=64, search_threads=2),
                     pipeline=False)
        rec = run(s, board, GoParams(nodes=nodes))
        assert s.tree.nodes == nodes
        assert sum(s.tree.visit_distribution().values()) == nodes - 1
        assert rec.results[0].best in board.legal_moves()


def test_a_failing_search_thread_stops_the_others_and_one_bestmove_comes():
    net = MeetingNetwork(fail_from=5)
    s = Searcher(lambda: net, SearchParams(minibatch_size=16, search_threads=2), pipeline=False)
    logged = []
    s.log = logged.append
    rec = run(s, Board(), GoParams(infinite=True))     # only the failure can end it
    assert len(rec.results) == 1 and rec.results[0].best in Board().legal_moves()
    assert any("accelerator caught fire" in line for line in logged), logged
    assert not any(thread.is_alive() for thread, _ in net.batches)
