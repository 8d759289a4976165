"""The search driver: move searches (``engine.move_search``), the batched loop (``engine.driver``),
self-play games (``engine.search.MultiSearch``).

Time is injected: :class:`FakeClock` stands for ``time.monotonic`` and the fake
network advances it by what a call would cost, so batch sizes and the time
extension are checked as decisions, never against a wall clock.
"""

import threading
import time
import zlib

import numpy as np
import pytest

from engine.board import Board
from engine.encoding import encode_board, move_to_index
from engine.limits import Budget, GoParams
from engine.params import SearchParams
from engine.driver import BATCHES_PER_BUDGET, FIRST_TIMED_BATCH, Driver, EvalSpeed
from engine.move_search import EXTENSION_MIN_VISIT_SHARE, EXTENSION_RECENT_SHARE, MoveSearch, game_ply, summary_of
from engine.search import MultiSearch
from engine.tree import Tree

POLICY_SIZE = 1858
PIECE_VALUES = (1, 3, 3, 5, 9)       # P N B R Q, the planes' order
FENS = [
    None,
    "r1bqkbnr/pppp1ppp/2n5/4p3/4P3/5N2/PPPP1PPP/RNBQKB1R w KQkq - 2 3",
    "r2q1rk1/pp2bppp/2n1pn2/3p4/3P4/2NBPN2/PP3PPP/R2Q1RK1 w - - 0 10",
    "8/2p5/3p4/KP5r/1R3p1k/8/4P1P1/8 w - - 0 1",
    "r4rk1/1pp1qppp/p1np1n2/2b1p1B1/2B1P1b1/P1NP1N2/1PP1QPPP/R4RK1 w - - 0 10",
    "8/8/4k3/8/2p5/8/1P2K3/8 b - - 0 40",
    None,
    "rnbq1k1r/pp1Pbppp/2p5/8/2B5/8/PPP1NnPP/RNBQK2R w KQ - 1 8",
]
# White wins the black queen with d2d5; the fake network likes e1f1 (which loses the white queen).
HANGING_QUEEN = "4k3/8/8/3q4/8/8/3Q4/4K3 w - - 0 1"


def _key(planes: np.ndarray) -> bytes:
    """The current position in the planes (history slot 0, castling, side to move)."""
    return planes[[*range(12), 104, 105, 106, 107, 108]].tobytes()


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FakeNet:
    """A deterministic function of each row's position, so batching never changes a result.

    Policy: a position-seeded jitter plus ``bonus`` logits for named moves of named
    positions. Value: the material balance for the side to move (plus a seeded jitter).
    With a ``clock``, each call advances it by ``per_call + per_position * rows`` seconds.
    """

    def __init__(self, jitter=1.0, value_jitter=0.1, bonus=None, clock=None, per_call=0.0, per_position=0.0):
        self.jitter = jitter
        self.value_jitter = value_jitter
        self.bonus = {}
        for fen, moves in (bonus or {}).items():
            board = Board(fen)
            self.bonus[_key(encode_board(board))] = {move_to_index(board, m): v for m, v in moves.items()}
        self.clock = clock
        self.per_call = per_call
        self.per_position = per_position
        self.calls = 0
        self.sizes: list[int] = []
        self._memo: dict[bytes, tuple[np.ndarray, np.ndarray]] = {}

    def _row(self, planes):
        key = _key(planes)
        out = self._memo.get(key)
        if out is None:
            rng = np.random.default_rng(zlib.crc32(key))
            logits = (self.jitter * rng.standard_normal(POLICY_SIZE)).astype(np.float32)
            for index, extra in self.bonus.get(key, {}).items():
                logits[index] += extra
            material = sum(v * (planes[k].sum() - planes[6 + k].sum()) for k, v in enumerate(PIECE_VALUES))
            wl = float(np.clip(np.tanh(material / 4.0) + self.value_jitter * (2 * rng.random() - 1), -0.95, 0.95))
            d = 0.4 * (1 - abs(wl))
            out = self._memo[key] = (logits, np.array([(1 - d + wl) / 2, d, (1 - d - wl) / 2], np.float32))
        return out

    def evaluate(self, planes):
        self.calls += 1
        self.sizes.append(len(planes))
        if self.clock is not None:
            self.clock.now += self.per_call + self.per_position * len(planes)
        rows = [self._row(p) for p in planes]
        return (np.stack([r[0] for r in rows]), np.stack([r[1] for r in rows]),
                np.zeros(len(planes), np.float32))


class SerialNet(FakeNet):
    """A :class:`FakeNet` that serves one call at a time, as a device does. With two batches in
    flight, FakeNet's calls run side by side, each advancing the fake clock by the other's time
    as well: the search's speed model, misled, ran a timed test 0.1-0.6 ms past its deadline (5 of
    150 runs beside a CPU burner)."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._device = threading.Lock()

    def evaluate(self, planes):
        with self._device:
            return super().evaluate(planes)


def move_search(board, go, budget, params, start=1000.0, tree=None):
    tree = tree or Tree(board, **params.tree_settings())
    tree.set_position(board)
    return MoveSearch(tree, board, go, budget, params, start)


# --------------------------------------------------------------------------- measured speed


def test_eval_speed_picks_the_largest_batch_that_fits():
    speed = EvalSpeed()
    assert not speed.measured
    speed.record(1, 0.5)                         # the first call of a size is not counted
    assert not speed.measured
    speed.record(1, 0.001)                       # 1 ms per position at batch 1
    assert speed.largest_within(0.010, 256) == 10
    speed.record(64, 0.5)
    speed.record(64, 0.016)                      # 0.25 ms per position at batch 64
    # A line through the two: a call costs 0.76 ms plus 0.238 ms a position.
    assert speed.largest_within(0.010, 256) == 38
    assert speed.largest_within(1.0, 256) == 256      # never past the cap
    assert speed.largest_within(0.0, 256) == 1        # always at least one


def test_eval_speed_prices_fixed_sizes_by_the_size_they_run_at():
    """A GPU network pads a batch to its next size: 65 positions cost what 128 do, so the search
    fills the size it pays for."""
    speed = EvalSpeed(sizes=(1, 2, 4, 8, 16, 32, 64, 128, 256))
    for size, seconds in ((16, 0.0006), (128, 0.002), (256, 0.0035)):
        speed.record(size, seconds)
        speed.record(size, seconds)
    assert speed.seconds_for(65) == pytest.approx(0.002)
    assert speed.seconds_for(100) == speed.seconds_for(128)
    assert speed.largest_within(0.0025, 256) == 128
    assert speed.largest_within(0.01, 256) == 256
    assert speed.largest_within(0.01, 200) == 200      # never past the cap
    assert speed.largest_within(0.00001, 256) == 1
    assert speed.padded(3) == 4 and speed.padded(256) == 256


def test_one_slow_call_does_not_price_big_batches_out():
    """The GPU search's batches collapsed to one position: a first call at a new shape (half a
    second of planning on an H100) priced every larger batch out of a timed search, and nothing
    measured them again. First calls and lone outliers are not counted; a lasting change is."""
    speed = EvalSpeed(sizes=(1, 16, 256))
    speed.record(16, 0.5)                                  # the first call: a plan
    for _ in range(3):
        speed.record(256, 0.0035)
    speed.record(256, 0.4)                                 # another process held the GPU once
    assert speed.largest_within(0.025, 256) == 256
    for _ in range(2):
        speed.record(256, 0.4)                             # three in a row: really slower now
    assert speed.seconds_for(256) == pytest.approx(0.4)
    assert speed.largest_within(0.025, 256) == 16


# --------------------------------------------------------------------------- short timed searches


@pytest.mark.parametrize("pipeline", [False, True])
def test_short_timed_search_gets_many_batches_and_most_of_the_capacity(pipeline):
    """go movetime 200 with Move Overhead 100: 95 ms. At 0.2 ms a position (plus 0.5 ms a call),
    one 256 batch takes 52 ms; sized from the measured speed, the search runs many small batches."""
    clock = FakeClock()
    net = FakeNet(clock=clock, per_call=0.0005, per_position=0.0002)
    params = SearchParams(minibatch_size=256)
    search = move_search(Board(), GoParams(movetime=200), Budget(95, 95), params, start=clock.now)
    driver = Driver(params.minibatch_size, pipeline=pipeline, clock=clock)
    driver.run(net, [search])
    capacity = 0.095 / 0.0002
    assert net.sizes[0] <= FIRST_TIMED_BATCH
    assert net.calls >= BATCHES_PER_BUDGET
    assert max(net.sizes) <= 0.095 / BATCHES_PER_BUDGET / 0.0002 + 1
    assert search.tree.nodes >= capacity / 2
    # Each batch was sized to end by the deadline (the last one may be a single position).
    assert clock.now - 1000.0 <= 0.095 + 0.0005 + 0.0002 * 2


def test_untimed_search_uses_full_batches():
    net = FakeNet()
    params = SearchParams(minibatch_size=64)
    search = move_search(Board(), GoParams(nodes=2000), Budget(None, None, infinite=True, nodes=2000), params)
    Driver(64).run(net, [search])
    assert search.tree.nodes == 2000
    assert max(net.sizes) == 64


# --------------------------------------------------------------------------- the time extension


class StubTree:
    """Just what the stop rules read, set by the test."""

    def __init__(self, children):
        self.children = children
        self.nodes = 1 + sum(c["n"] for c in children)
        self.playouts = self.nodes
        self.root_proven = None
        self.out_of_memory = False
        self.average_depth = 3.0
        self.seldepth = 6

    def root_children(self):
        return self.children

    def root_summary(self, share):
        return summary_of(self.children, share)


def child(move, n, q):
    return dict(move=move, n=n, q=q, d=0.3, m=40.0, prior=0.1, proven=None, in_flight=0)


SOFT, HARD = 1000, 3000      # ms


def timed_search(children, extension=True, start=0.0):
    params = SearchParams(time_extension=extension, smart_pruning_factor=0)
    board = Board()
    return MoveSearch(StubTree(children), board, GoParams(wtime=60000, btime=60000),
                      Budget(SOFT, HARD, clock=True), params, start)


STABLE = [child("e2e4", 500, 0.10), child("d2d4", 200, 0.05), child("g1f3", 100, 0.02)]
BETTER_BY_Q = [child("e2e4", 500, 0.10), child("d2d4", 200, 0.15), child("g1f3", 100, 0.02)]


def test_extension_goes_past_soft_while_another_move_has_the_better_value():
    search = timed_search(BETTER_BY_Q)
    search.update(0.0)                 # e2e4 is best from the start: no recent change at the soft time
    assert not search.update(SOFT / 1000.0)
    assert search.extending
    assert not search.update((HARD - 1) / 1000.0)
    assert search.update(HARD / 1000.0)


def test_extension_needs_enough_visits_behind_the_better_value():
    few = int(500 * EXTENSION_MIN_VISIT_SHARE) - 1
    search = timed_search([child("e2e4", 500, 0.10), child("d2d4", few, 0.9)])
    search.update(0.0)
    assert search.update(SOFT / 1000.0)


def test_no_extension_when_the_best_move_is_stable():
    search = timed_search(STABLE)
    search.update(0.0)
    assert not search.update((SOFT - 1) / 1000.0)
    assert search.update(SOFT / 1000.0)
    assert not search.extending


def test_extension_while_the_best_move_changed_recently():
    search = timed_search(STABLE)
    search.update(0.0)
    changed_at = (SOFT - 1) / 1000.0
    search.tree.children = [child("d2d4", 600, 0.12), *STABLE[:1], STABLE[2]]   # d2d4 takes the lead
    assert not search.update(changed_at)
    recent = EXTENSION_RECENT_SHARE * SOFT / 1000.0
    assert not search.update(changed_at + recent * 0.9)           # still recent: go on past soft
    assert search.update(changed_at + recent * 1.01)              # stable long enough: stop


def test_extension_can_be_turned_off():
    search = timed_search(BETTER_BY_Q, extension=False)
    search.update(0.0)
    assert search.update(SOFT / 1000.0)


@pytest.mark.parametrize("children", [STABLE, BETTER_BY_Q])
def test_never_past_the_hard_limit(children):
    search = timed_search(children)
    search.update(0.0)
    for i, ms in enumerate((HARD - 1, HARD, HARD + 1, 10 * HARD)):
        leader = child("c2c4" if i % 2 else "b1c3", 1000, 0.5)   # the best move changes every time
        search.tree.children = [leader, *children]
        assert search.update(ms / 1000.0) == (ms >= HARD), ms
        assert search.unstable(ms / 1000.0, search._summary())
    for soft, hard in ((0, 0), (50, 50), (100, 100)):      # movetime: soft == hard, nothing to extend
        search.budget = Budget(soft, hard)
        assert search.update(hard / 1000.0)


def test_extension_finds_the_move_a_soft_stop_would_miss():
    """The network's favourite e1f1 gets the visits first; d2d5 wins a queen. Stopped at the soft
    target the search plays e1f1; extended while unstable it plays d2d5, well before the hard limit."""
    def play(extension):
        clock = FakeClock()
        net = FakeNet(jitter=0.0, value_jitter=0.0, bonus={HANGING_QUEEN: {"e1f1": 5.0}},
                      clock=clock, per_call=0.005)
        params = SearchParams(minibatch_size=8, time_extension=extension, smart_pruning_factor=0)
        board = Board(HANGING_QUEEN)
        search = move_search(board, GoParams(), Budget(200, 2000, clock=True), params, start=clock.now)
        Driver(8, clock=clock).run(net, [search])
        return search.choose(), (clock.now - search.start) * 1000.0, search

    best, used_ms, search = play(extension=False)
    assert best == "e1f1" and 200 <= used_ms < 210
    best, used_ms, search = play(extension=True)
    assert best == "d2d5" and 210 <= used_ms < 2000
    assert not search.unstable(clock_at := search.start + used_ms / 1000.0, search._summary())
    assert search.should_stop(clock_at)


# --------------------------------------------------------------------------- two batches in flight


@pytest.mark.parametrize("pipeline", [False, True])
def test_the_next_batch_is_gathered_while_one_is_at_the_network(pipeline):
    search_box = []

    class Watching(FakeNet):
        overlapped = False

        def evaluate(self, planes):
            if pipeline and not self.overlapped and self.calls >= 3:
                deadline = time.monotonic() + 5.0      # only so that a broken driver fails
                while time.monotonic() < deadline and search_box[0].in_flight <= len(planes):
                    time.sleep(0.001)
            if search_box[0].in_flight > len(planes):
                Watching.overlapped = True             # more leaves out than this call holds
            return super().evaluate(planes)

    net = Watching()
    params = SearchParams(minibatch_size=16)
    search = move_search(Board(), GoParams(nodes=400), Budget(None, None, infinite=True, nodes=400), params)
    search_box.append(search)
    Driver(16, pipeline=pipeline).run(net, [search])
    assert Watching.overlapped == pipeline
    assert search.tree.nodes == 400 and search.in_flight == 0


def test_a_failing_network_leaves_the_trees_clean():
    class Failing(FakeNet):
        def evaluate(self, planes):
            if self.calls >= 3:  # lost for good: two calls at once may both read 2
                raise RuntimeError("device lost")
            return super().evaluate(planes)

    for pipeline in (False, True):
        params = SearchParams(minibatch_size=16)
        search = move_search(Board(), GoParams(), Budget(None, None, infinite=True, nodes=1000), params)
        with pytest.raises(RuntimeError, match="device lost"):
            Driver(16, pipeline=pipeline).run(Failing(), [search])
        search.tree.set_position(Board())       # raises if leaves were left pending in a batch


def test_stopped_run_returns_and_drops_its_leaves():
    stop = threading.Event()
    params = SearchParams(minibatch_size=16)
    search = move_search(Board(), GoParams(infinite=True), Budget(None, None, infinite=True, until_stop=True),
                         params)

    class StopsItself(FakeNet):
        def evaluate(self, planes):
            if self.calls >= 5:  # not == 5: two calls at once may both read 4, and nothing then stops the search
                stop.set()
            return super().evaluate(planes)

    net = StopsItself()
    Driver(16, pipeline=True).run(net, [search], stopped=stop.is_set)
    # The stop came during call 6; with two batches at the network, at most the one queued behind it
    # was sent too, and nothing after: no call once the driver has seen the stop.
    assert 5 <= net.calls <= 7
    search.tree.set_position(Board())


# --------------------------------------------------------------------------- self-play: many games


def play_games(games, params, plies, seeds, pipeline=True):
    """Play ``games`` (fens) together for ``plies`` plies: (moves, visits, values) per game."""
    net = FakeNet()
    multi = MultiSearch(net, params, pipeline=pipeline)
    boards = {}
    for key, fen in enumerate(games):
        multi.new_game(key, seed=seeds[key])
        boards[key] = Board(fen) if fen else Board()
    records = {key: [] for key in boards}
    for _ in range(plies):
        playing = {k: (b, GoParams(nodes=48)) for k, b in boards.items() if not b.is_game_over()}
        if not playing:
            break
        for key, result in multi.search(playing).items():
            records[key].append((result.best, result.visits, round(result.q, 6), result.nodes))
            boards[key].push_uci(result.best)
    return records, net.calls


def test_eight_games_in_one_batch_play_as_if_each_were_alone():
    params = SearchParams(minibatch_size=8, nn_cache_size=0, noise_epsilon=0.25, temperature=1.0,
                          temp_cutoff_ply=6)
    seeds = [100 + i for i in range(len(FENS))]
    together, calls = play_games(FENS, params, plies=10, seeds=seeds)
    alone_calls = 0
    for i, fen in enumerate(FENS):
        alone, n = play_games([fen], params, plies=10, seeds=[seeds[i]])
        alone_calls += n
        assert alone[0] == together[i], fen
    assert calls < alone_calls / 4       # one network call serves every game
    for key, record in together.items():
        assert record, key
        for best, visits, q, nodes in record:
            assert nodes >= 48 and sum(visits.values()) == nodes - 1    # every visit is in a root move
            assert visits[best] > 0


def test_games_with_a_list_get_results_in_order_and_a_finished_game_no_move():
    multi = MultiSearch(FakeNet(), SearchParams(minibatch_size=8))
    mated = Board("R5k1/5ppp/8/8/8/8/8/7K b - - 0 1")
    results = multi.search([(Board(), GoParams(nodes=30)), (mated, GoParams(nodes=30))])
    assert results[0].best in Board().legal_moves() and results[0].nodes >= 30
    assert results[1].best is None and results[1].visits == {}


def test_root_noise_is_honoured_and_seeded():
    def priors(epsilon, seed):
        multi = MultiSearch(FakeNet(), SearchParams(minibatch_size=8, noise_epsilon=epsilon))
        multi.new_game("g", seed=seed)
        multi.search({"g": (Board(), GoParams(nodes=20))})
        return {c["move"]: round(c["prior"], 4) for c in multi.trees["g"].root_children()}

    plain = priors(0.0, 1)
    assert priors(0.0, 2) == plain                     # without noise the seed changes nothing
    noisy = priors(0.25, 1)
    assert noisy != plain and priors(0.25, 1) == noisy
    assert priors(0.25, 2) != noisy


def test_temperature_samples_before_the_cutoff_and_plays_the_best_after():
    params = SearchParams(minibatch_size=8, temperature=5.0, temp_cutoff_ply=2)
    multi = MultiSearch(FakeNet(), params)
    late = Board("r1bqkbnr/pppp1ppp/2n5/4p3/4P3/5N2/PPPP1PPP/RNBQKB1R w KQkq - 2 3")
    assert game_ply(late) >= 2
    games = {}
    for key in range(16):
        multi.new_game(key, seed=key + 1)
        games[key] = (Board() if key < 8 else late, GoParams(nodes=64))
    results = multi.search(games)
    early_choices = set()
    for key, result in results.items():
        most_visited = max(result.visits, key=result.visits.get)
        if key < 8:
            early_choices.add(result.best == most_visited)
        else:
            assert result.best == multi.trees[key].best_move() == most_visited
    assert False in early_choices        # sampled: not always the most visited move


def test_timed_games_share_the_batches_and_all_stop_by_their_deadline():
    clock = FakeClock()
    net = SerialNet(clock=clock, per_call=0.001, per_position=0.0001)
    multi = MultiSearch(net, SearchParams(minibatch_size=32, move_overhead_ms=0), clock=clock)
    start = clock.now
    results = multi.search([(Board(fen) if fen else Board(), GoParams(movetime=105)) for fen in FENS])
    assert all(r.best is not None and r.nodes > 32 for r in results)
    assert (clock.now - start) * 1000 <= 100 + 1 + 0.1 * 2      # movetime 105 less the 5 ms safety
    assert net.calls >= BATCHES_PER_BUDGET and max(net.sizes) <= 8 * 32


def test_a_batch_smaller_than_every_game_together_still_serves_them_all():
    net = FakeNet()
    multi = MultiSearch(net, SearchParams(minibatch_size=16), max_batch=24)
    results = multi.search([(Board(fen) if fen else Board(), GoParams(nodes=100)) for fen in FENS])
    assert [r.nodes for r in results] == [100] * len(FENS)
    assert max(net.sizes) <= 24
