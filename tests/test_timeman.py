"""The time manager: budgets from ``go`` limits, as pure arithmetic (no clocks read)."""

import itertools

import pytest

from engine.limits import GoParams
from engine.limits import Budget
from engine.timeman import TimeManager, estimated_moves_left

TIMES = [-500, 0, 1, 5, 50, 99, 100, 101, 105, 120, 250, 1_000, 3_000, 10_000,
         60_000, 180_000, 900_000, 5_400_000]
INCS = [None, 0, 10, 100, 600, 2_000, 30_000]
MOVESTOGO = [None, -1, 0, 1, 2, 3, 5, 10, 40, 100]
PLIES = [None, 0, 20, 60, 80, 120, 200, 400]
OVERHEADS = [0, 10, 100, 500]


def clock(time_ms, inc=None, movestogo=None, white=True):
    """A ``go`` with our clock (the opponent has a full minute)."""
    if white:
        return GoParams(wtime=time_ms, btime=60_000, winc=inc, binc=inc, movestogo=movestogo)
    return GoParams(btime=time_ms, wtime=60_000, binc=inc, winc=inc, movestogo=movestogo)


# -- movetime ------------------------------------------------------------------


@pytest.mark.parametrize("overhead", OVERHEADS)
@pytest.mark.parametrize("movetime", [0, 1, 50, 100, 1_000, 12_345])
def test_movetime_is_soft_and_hard_limit_less_overhead(overhead, movetime):
    tm = TimeManager(move_overhead_ms=overhead, safety_ms=0)
    b = tm.budget(GoParams(movetime=movetime), white_to_move=True)
    assert b.soft_ms == b.hard_ms == max(0, movetime - overhead)
    assert not b.infinite and not b.until_stop


def test_movetime_keeps_a_small_safety_by_default():
    # The benchmark runs Move Overhead 0 and wants bestmove within N + 20 ms.
    b = TimeManager(move_overhead_ms=0).budget(GoParams(movetime=1_000), True)
    assert 980 <= b.hard_ms < 1_000 and b.soft_ms == b.hard_ms


def test_negative_movetime_plays_at_once():
    b = TimeManager().budget(GoParams(movetime=-20), False)
    assert b.soft_ms == b.hard_ms == 0 and b.immediate


def test_movetime_and_clock_take_the_tighter_limit():
    tm = TimeManager(move_overhead_ms=0, safety_ms=0)
    b = tm.budget(GoParams(wtime=1_000, btime=1_000, movetime=10_000), True)
    assert b.hard_ms <= 1_000 and b.hard_ms == tm.budget(clock(1_000), True).hard_ms
    b = tm.budget(GoParams(wtime=600_000, btime=600_000, movetime=50), True)
    assert b.soft_ms == b.hard_ms == 50


# -- tiny clocks -----------------------------------------------------------------


@pytest.mark.parametrize("time_ms", [-1_000, -1, 0, 1, 50, 100, 105])
@pytest.mark.parametrize("white", [True, False])
def test_zero_negative_and_tiny_clocks_play_at_once(time_ms, white):
    tm = TimeManager(move_overhead_ms=100, safety_ms=5)
    b = tm.budget(clock(time_ms, inc=0, white=white), white)
    assert b.soft_ms == b.hard_ms == 0
    assert b.immediate and not b.infinite


def test_clock_below_overhead_plays_at_once_even_with_increment():
    b = TimeManager(move_overhead_ms=100).budget(clock(80, inc=5_000), True)
    assert b.hard_ms == 0


# -- the clock -------------------------------------------------------------------


def test_hard_cap_never_reaches_the_remaining_time_on_a_grid():
    for overhead, time_ms, inc, mtg, ply, white in itertools.product(
            OVERHEADS, TIMES, INCS, MOVESTOGO, PLIES, (True, False)):
        tm = TimeManager(move_overhead_ms=overhead)
        b = tm.budget(clock(time_ms, inc, mtg, white), white, ply)
        case = (overhead, time_ms, inc, mtg, ply, white)
        assert isinstance(b.soft_ms, int) and isinstance(b.hard_ms, int), case
        assert 0 <= b.soft_ms <= b.hard_ms, case
        assert b.hard_ms <= max(0, time_ms - overhead - tm.safety_ms), case
        if b.hard_ms > 0:  # and something is always left on the clock
            assert b.hard_ms + overhead + tm.safety_ms < time_ms, case


@pytest.mark.parametrize("time_ms", [1_000, 10_000, 60_000, 600_000])
@pytest.mark.parametrize("inc", [0, 1_000])
def test_movestogo_one_uses_most_but_not_all_of_the_clock(time_ms, inc):
    tm = TimeManager(move_overhead_ms=100)
    b = tm.budget(clock(time_ms, inc, movestogo=1), True)
    room = time_ms - 100 - tm.safety_ms
    assert 0.75 * room <= b.hard_ms < room
    assert b.soft_ms >= 0.75 * room


def test_movestogo_shrinks_the_budget_as_it_grows():
    tm = TimeManager(move_overhead_ms=0)
    budgets = [tm.budget(clock(60_000, 0, mtg), True, ply=0).soft_ms for mtg in (1, 2, 5, 10, 40)]
    assert budgets == sorted(budgets, reverse=True) and budgets[-1] < budgets[0] / 10


def test_nonpositive_movestogo_is_ignored():
    tm = TimeManager()
    plain = tm.budget(clock(60_000, 500), True, 30)
    for mtg in (0, -3):
        assert tm.budget(clock(60_000, 500, mtg), True, 30) == plain


def test_movestogo_beyond_the_expected_game_length_changes_nothing():
    tm = TimeManager()
    assert tm.budget(clock(60_000, 0, 60), True, 10) == tm.budget(clock(60_000), True, 10)


def test_sudden_death_spreads_the_clock_over_the_expected_moves():
    tm = TimeManager(move_overhead_ms=0, safety_ms=0)
    b = tm.budget(clock(60_000, 0), True, ply=0)
    assert b.soft_ms == int(60_000 / 51.5)
    assert b.hard_ms == 3 * b.soft_ms


@pytest.mark.parametrize("mtg", [None, 2, 10, 40])
@pytest.mark.parametrize("ply", [None, 0, 40, 100])
def test_increments_raise_the_budget(mtg, ply):
    tm = TimeManager(move_overhead_ms=50)
    softs = [tm.budget(clock(30_000, inc, mtg), True, ply).soft_ms for inc in (0, 100, 500, 2_000)]
    assert softs == sorted(softs) and softs[0] < softs[-1]


def test_more_time_never_gives_a_smaller_budget():
    grid = sorted(set(TIMES) | set(range(0, 3_000, 7)) | set(range(3_000, 200_000, 997)))
    for overhead, inc, mtg, ply, saved in itertools.product(
            (0, 100), (0, 600), (None, 1, 2, 30), (None, 0, 90), (0, 5_000)):
        tm = TimeManager(move_overhead_ms=overhead)
        tm.saved_ms = saved
        prev = None
        for time_ms in grid:
            b = tm.budget(clock(time_ms, inc, mtg), True, ply)
            if prev is not None:
                case = (overhead, inc, mtg, ply, saved, time_ms)
                assert b.soft_ms >= prev.soft_ms and b.hard_ms >= prev.hard_ms, case
            prev = b


def test_more_increment_never_gives_a_smaller_budget():
    tm = TimeManager(move_overhead_ms=100)
    for time_ms, mtg, ply in itertools.product(TIMES, MOVESTOGO, PLIES):
        prev = None
        for inc in sorted(i for i in INCS if i is not None):
            b = tm.budget(clock(time_ms, inc, mtg), True, ply)
            if prev is not None:
                assert b.soft_ms >= prev.soft_ms and b.hard_ms >= prev.hard_ms
            prev = b


def test_only_our_own_clock_counts():
    tm = TimeManager()
    white = tm.budget(GoParams(wtime=1_000, btime=600_000, winc=0, binc=10_000), True, 20)
    black = tm.budget(GoParams(wtime=1_000, btime=600_000, winc=0, binc=10_000), False, 21)
    assert white.hard_ms < 1_000 < black.soft_ms
    assert white == tm.budget(GoParams(wtime=1_000, winc=0), True, 20)


def test_missing_own_clock_falls_back_to_the_opponents():
    tm = TimeManager()
    b = tm.budget(GoParams(wtime=10_000), white_to_move=False, ply=11)
    assert not b.infinite and 0 < b.hard_ms < 10_000


def test_slowmover_scales_the_target():
    slow = TimeManager(slowmover=1.5).budget(clock(60_000), True, 20)
    normal = TimeManager(slowmover=1.0).budget(clock(60_000), True, 20)
    fast = TimeManager(slowmover=0.5).budget(clock(60_000), True, 20)
    assert fast.soft_ms < normal.soft_ms < slow.soft_ms


def test_moves_to_go_is_lc0s_estimate_with_a_floor_or_the_nearer_control():
    tm = TimeManager()
    assert tm.moves_to_go(None, None) == tm.moves_to_go(None, 0) == pytest.approx(51.5)
    assert tm.moves_to_go(None, 40) == pytest.approx(31.5, abs=0.1)
    assert tm.moves_to_go(None, 120) == tm.moves_to_go(None, 300) == 20
    assert tm.moves_to_go(7, 120) == 7 and tm.moves_to_go(40, 120) == 20
    assert tm.moves_to_go(0, 0) == tm.moves_to_go(-5, 0) == pytest.approx(51.5)


def test_moves_left_estimate_follows_lc0s_curve():
    assert estimated_moves_left(0) == pytest.approx(51.5)
    assert estimated_moves_left(40) == pytest.approx(31.5, abs=0.1)
    assert estimated_moves_left(80) == pytest.approx(13.9, abs=0.3)
    assert min(estimated_moves_left(p) for p in range(0, 1_000)) > 7


# -- no time limit -------------------------------------------------------------


@pytest.mark.parametrize("go", [
    GoParams(infinite=True),
    GoParams(ponder=True, wtime=1_000, btime=1_000, winc=10, binc=10),
    GoParams(ponder=True, movetime=100),
    GoParams(infinite=True, wtime=5, btime=5, movetime=1),
])
def test_infinite_and_ponder_have_no_time_limit_and_wait_for_stop(go):
    b = TimeManager().budget(go, True, 10)
    assert b.infinite and b.until_stop
    assert b.soft_ms is None and b.hard_ms is None and not b.immediate
    assert b.soft_deadline(100.0) is None and b.hard_deadline(100.0) is None


def test_ponderhit_continues_as_the_timed_search_of_the_same_go():
    tm = TimeManager()
    go = GoParams(ponder=True, wtime=30_000, btime=30_000, winc=300, binc=300, nodes=10**6)
    hit = tm.ponderhit_budget(go, False, 33)
    assert go.ponder  # the caller's GoParams is untouched
    assert not hit.infinite and not hit.until_stop and hit.nodes == 10**6
    plain = GoParams(wtime=30_000, btime=30_000, winc=300, binc=300, nodes=10**6)
    assert hit == tm.budget(plain, False, 33)
    assert tm.ponderhit_budget(GoParams(ponder=True, movetime=700), True).hard_ms == 700 - tm.move_overhead_ms - tm.safety_ms
    assert tm.ponderhit_budget(GoParams(ponder=True, infinite=True), True).until_stop


@pytest.mark.parametrize("go, nodes, depth, mate", [
    (GoParams(nodes=800), 800, None, None),
    (GoParams(depth=12), None, 12, None),
    (GoParams(mate=3), None, None, 3),
    (GoParams(nodes=5, depth=2, mate=1), 5, 2, 1),
    (GoParams(nodes=-4, depth=-1, mate=-2), 0, 0, None),
    (GoParams(), None, None, None),
])
def test_nodes_depth_mate_only_have_no_time_limit(go, nodes, depth, mate):
    b = TimeManager().budget(go, True)
    assert b.infinite and not b.until_stop
    assert (b.nodes, b.depth, b.mate) == (nodes, depth, mate)


def test_node_limit_rides_along_with_a_clock():
    b = TimeManager().budget(GoParams(wtime=10_000, btime=10_000, nodes=400), True)
    assert not b.infinite and b.nodes == 400 and b.hard_ms > 0


def test_budget_deadlines_and_validation():
    b = Budget(250, 1_000)
    assert b.soft_deadline(10.0) == pytest.approx(10.25)
    assert b.hard_deadline(10.0) == pytest.approx(11.0)
    assert Budget(0, 0).immediate and not b.immediate
    with pytest.raises(ValueError):
        Budget(5, 4)
    with pytest.raises(ValueError):
        Budget(None, 10)
    with pytest.raises(ValueError):
        Budget(10, 10, infinite=True)
    with pytest.raises(ValueError):
        TimeManager(move_overhead_ms=-1)
    with pytest.raises(ValueError):
        TimeManager(slowmover=0)


# -- saved time ------------------------------------------------------------------


def test_time_saved_by_an_early_stop_goes_to_the_next_move_and_reset_clears_it():
    tm = TimeManager(move_overhead_ms=0, safety_ms=0)
    go = clock(100_000)
    first = tm.budget(go, True, 40)
    assert first.banked_ms == 0
    tm.record(first.soft_ms - 600)  # smart pruning stopped 600 ms early
    assert tm.saved_ms == 600
    second = tm.budget(go, True, 40)
    assert second.banked_ms == 600
    assert second.soft_ms > first.soft_ms + 550  # spent now, less the share planned for later
    assert second.hard_ms > first.hard_ms
    tm.reset()
    assert tm.saved_ms == 0 and tm.budget(go, True, 40) == first


def test_savings_are_spent_once_and_overruns_pay_them_back():
    tm = TimeManager(move_overhead_ms=0, safety_ms=0)
    go = clock(100_000)
    tm.record(tm.budget(go, True, 40).soft_ms - 600)
    second = tm.budget(go, True, 40)
    tm.record(second.soft_ms)  # used all of it, savings included
    assert tm.saved_ms == 0
    tm.record(tm.budget(go, True, 40).soft_ms - 600)
    third = tm.budget(go, True, 40)
    tm.record(third.soft_ms - third.banked_ms + 200)  # spent 200 of the 600 saved
    assert tm.saved_ms == 400
    tm.record(tm.budget(go, True, 40).soft_ms + 10_000)
    assert tm.saved_ms == 0  # never in debt: the clock shows overruns anyway


def test_savings_are_capped_per_move():
    tm = TimeManager(move_overhead_ms=0, safety_ms=0)
    tm.saved_ms = 50_000
    b = tm.budget(clock(20_000), True, 40)
    assert b.banked_ms == 2_000  # 10 % of the clock
    tm.record(b.soft_ms)
    assert tm.saved_ms == 48_000


def test_only_clock_moves_take_part_in_savings():
    tm = TimeManager(move_overhead_ms=0, safety_ms=0)
    for go in (GoParams(movetime=1_000), GoParams(infinite=True), GoParams(nodes=100),
               GoParams(ponder=True, wtime=9_000, btime=9_000),
               GoParams(wtime=9_000, btime=9_000, movetime=500)):
        tm.budget(go, True)
        tm.record(0)
        assert tm.saved_ms == 0
    tm.saved_ms = 300
    assert tm.budget(GoParams(movetime=1_000), True).soft_ms == 1_000
    tm.record(0)
    assert tm.saved_ms == 300


def test_recording_twice_counts_once():
    tm = TimeManager(move_overhead_ms=0, safety_ms=0)
    b = tm.budget(clock(100_000), True, 20)
    tm.record(b.soft_ms - 100)
    tm.record(0)
    assert tm.saved_ms == 100


# -- whole games -------------------------------------------------------------------


def play(tm, base_ms, inc_ms, moves=40, lag_ms=None, used=lambda b, i: b.hard_ms,
         movestogo=None, start_ply=0):
    """Simulate our clock: each move costs ``used`` + the lag (default: the overhead).

    Returns the lowest clock seen just after a move, before the increment.
    """
    lag = tm.move_overhead_ms + tm.safety_ms if lag_ms is None else lag_ms
    time_ms, lowest = base_ms, base_ms
    tm.reset()
    for i in range(moves):
        mtg = None if movestogo is None else movestogo - i % movestogo
        b = tm.budget(GoParams(wtime=time_ms, btime=base_ms, winc=inc_ms, binc=inc_ms,
                               movestogo=mtg), True, start_ply + 2 * i)
        spent = used(b, i)
        assert 0 <= spent <= b.hard_ms
        time_ms -= spent + lag
        tm.record(spent)
        lowest = min(lowest, time_ms)
        assert time_ms > 0, f"flagged on move {i + 1}"
        time_ms += inc_ms
        if mtg == 1:
            time_ms += base_ms  # the next time control
    return lowest


@pytest.mark.parametrize("overhead", [0, 20, 100, 500])
@pytest.mark.parametrize("moves", [40, 150])
def test_rapid_60s_plus_0_6_survives_every_move_at_its_hard_cap(overhead, moves):
    assert play(TimeManager(move_overhead_ms=overhead), 60_000, 600, moves) > 0


@pytest.mark.parametrize("overhead", [0, 10, 100, 500])
def test_bullet_1_plus_0_survives_every_move_at_its_hard_cap(overhead):
    assert play(TimeManager(move_overhead_ms=overhead), 60_000, 0, 40) > 0


@pytest.mark.parametrize("base", [60_000, 180_000])
@pytest.mark.parametrize("overhead", [0, 10])
def test_long_sudden_death_games_survive_at_the_soft_pace(base, overhead):
    # Without increment a fixed lag per move ends every clock some day; at the
    # soft pace (the usual stop) 120 moves of 1+0 still fit.
    tm = TimeManager(move_overhead_ms=overhead)
    assert play(tm, base, 0, 120, used=lambda b, i: b.soft_ms) > 0


@pytest.mark.parametrize("overhead, safety", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_a_tenth_of_a_second_survives_every_move_at_its_hard_cap(overhead, safety):
    # 40 moves can only be played in 100 ms when the per-move lag is under 2.5 ms.
    assert play(TimeManager(move_overhead_ms=overhead, safety_ms=safety), 100, 0) > 0


@pytest.mark.parametrize("overhead", [0, 100, 1_000])
def test_forty_moves_in_sixty_seconds_repeating_survives_at_the_hard_cap(overhead):
    # With movestogo known, the clock keeps the lag of every move to the control.
    assert play(TimeManager(move_overhead_ms=overhead), 60_000, 0, 120, movestogo=40) > 0


def test_a_control_that_cannot_cover_the_lag_plays_at_once():
    tm = TimeManager(move_overhead_ms=100, safety_ms=0)
    b = tm.budget(clock(2_000, 0, movestogo=30), True)  # 30 moves x 100 ms > 2 s
    assert b.hard_ms == 0


def test_games_with_savings_survive_too():
    # Alternate instant moves (forced, pruned early) with moves run to the hard cap.
    tm = TimeManager(move_overhead_ms=50)
    pattern = lambda b, i: 0 if i % 3 else b.hard_ms  # noqa: E731
    for base, inc, moves in ((60_000, 600, 150), (180_000, 2_000, 150), (3_000, 100, 150),
                             (60_000, 0, 40), (3_000, 0, 40)):
        assert play(tm, base, inc, moves, used=pattern) > 0


def test_a_hard_capped_game_keeps_a_sane_share_of_the_clock():
    # Running every move to its hard cap must not burn the clock early on.
    tm = TimeManager(move_overhead_ms=100)
    time_ms = 60_000
    for i in range(20):
        b = tm.budget(clock(time_ms, 0), True, 2 * i)
        time_ms -= b.hard_ms + 105
    assert time_ms > 60_000 / 4


def test_a_known_control_is_reached_at_the_hard_cap_whenever_the_lag_allows():
    for overhead, safety, inc, mtg in itertools.product((0, 7, 100), (0, 5), (0, 3, 50), (1, 2, 3, 7, 40)):
        lag = overhead + safety
        need = max(lag + 1, mtg * (lag + 1) - (mtg - 1) * inc)
        for time_ms in sorted(t for t in {need, need + 1, need + 17, 2 * need + 5, 1_000, 60_000}
                              if t >= need):
            tm = TimeManager(move_overhead_ms=overhead, safety_ms=safety)
            left = time_ms
            for k in range(mtg, 0, -1):
                b = tm.budget(GoParams(wtime=left, btime=left, winc=inc, binc=inc, movestogo=k),
                              True, 60 + 2 * (mtg - k))
                left -= b.hard_ms + lag
                assert left > 0, (overhead, safety, inc, mtg, time_ms, k)
                left += inc


def test_record_takes_an_explicit_budget():
    tm = TimeManager(move_overhead_ms=0, safety_ms=0)
    b = tm.budget(clock(100_000), True, 20)
    tm.budget(GoParams(movetime=100), True)  # issued later, e.g. an analysis go
    tm.record(b.soft_ms - 250, b)
    assert tm.saved_ms == 250
