"""The one estimator of a run's speed and its next generation (trainer.estimate), which `status`
and the live display of `cyzero-train run` share (issue 46: "status's estimates are wrong early").

The histories here are the ones the issue's user saw on a 2-core CPU run of the `cpu` config: one
worker playing 64 games at once, about 7 training positions/s, generation 0's games ending over
many minutes, and generation 1 due at step 100 of 256 positions at 8 samples a position.
"""

from __future__ import annotations

from trainer.estimate import LEARNER_SETTLE_STEPS, SETTLE_S, next_generation, selfplay_speed
from trainer.report import Chunk, describe_next_generation, describe_selfplay

START = 100_000.0  # the daemon's start


def chunks(*spec):
    """(seconds after START, games, positions) -> self-play chunks."""
    return [Chunk(f"c{k}", positions, games, 0, "selfplay", START + at) for k, (at, games, positions) in enumerate(spec)]


def workers(now, rate=7.0, playing=64, started=START + 5.0):
    return {"time": now - 2.0, "workers": [{"id": "local-cpu-0", "alive": True, "positions_per_s": rate,
                                            "playing": playing, "started": started}]}


DAEMON = {"alive": True, "started": START}


def speed(stored, now, **kwargs):
    return selfplay_speed(stored, DAEMON, workers(now, **kwargs), val_percent=5.0, max_plies=300,
                          full_search_prob=0.25, now=now)


def learner(step=0, training_positions=0, **fields):
    return {"running": True, "step": step, "checkpoint_every": 100, "next_generation_step": 100, "batch_size": 256,
            "generation": 0, "target_step": None, "samples_per_s": 800.0, "rate_steps": 40,
            "max_samples_per_position": 8.0, "samples_drawn": step * 256, **fields}


def eta(stored, now, learner_record, **kwargs):
    selfplay = speed(stored, now, **kwargs)
    data = {"training_positions": learner_record.pop("training", 0)}
    return selfplay, next_generation(learner_record, data, selfplay, None, max_samples_per_position=8.0)


def test_the_first_minute_of_play_is_measured_not_extrapolated():
    now = START + 40.0  # the worker has played 35 s: its rate spans less than its minute
    selfplay = speed([], now)
    assert selfplay["positions_per_s"] is None and selfplay["games_per_hour"] is None
    assert describe_selfplay(selfplay) == ("0 games finished since the daemon started, 64 in play at once; "
                                           f"speed measuring: the workers' first {SETTLE_S / 60:.1f} min of play")


def test_the_early_rate_counts_the_games_in_play_and_gives_no_time_before_the_first_round_ends():
    """At 2.5 min the user's status said 121 games/h and 'generation 1 in about 1.9 h': 5 short games had
    reached the store. The worker played 7 positions/s all along; the 59 games still in play hold most
    of them. So self-play's speed is the worker's, and games/h and the time of a generation that
    waits for games are 'measuring' until the first round of 64 games has ended."""
    now = START + 150.0
    stored = chunks((60, 2, 18), (95, 1, 9), (140, 2, 20))
    selfplay, nxt = eta(stored, now, learner(step=2, training=44, state="waiting", samples_drawn=2 * 256))
    assert selfplay["positions_per_s"] == 7.0  # not 47 positions / 150 s, a seventh of it
    assert selfplay["training_positions_per_s"] == 7.0 * 0.95
    assert selfplay["games_finished"] == 5 and selfplay["games_in_flight"] == 64
    assert not selfplay["first_games_done"] and selfplay["games_per_hour"] is None
    # a game of 300 plies, a quarter of them recorded, among 64 at 7 positions/s: 686 s
    assert round(selfplay["longest_game_s"]) == 686
    text = describe_selfplay(selfplay)
    assert text.startswith("5 games finished since the daemon started, 64 in play at once; 7.0 positions/s played")
    assert "games/h measuring: the first 64 games are still in play (5 finished; a game of 300 plies takes 11.4 min" \
        in text
    assert nxt["eta_s"] is None and nxt["limited_by"] == "selfplay"
    assert describe_next_generation(nxt, {"selfplay": selfplay}).startswith(
        "measuring: the first 64 games are still in play (5 finished")
    assert describe_next_generation(nxt, {"selfplay": selfplay}, short=True) == (
        "measuring until the first 64 games end (5 have)")
    assert describe_selfplay(selfplay, short=True) == (
        "5 games finished, 64 in play; 7.0 positions/s played, games/h measuring")


def test_once_the_first_games_have_ended_the_time_comes_from_the_settled_speed():
    """80 games stored since the start, 64 in play: games/h is the worker's 8 positions/s over the
    positions a stored game holds; generation 1 at step 100 needs 60 more steps of 256 samples at 8
    samples a position, 1,920 training positions, which 8 x 0.95 training positions/s add in 253 s."""
    now = START + 700.0
    stored = chunks(*[(300 + 5 * k, 1, 40) for k in range(80)])
    selfplay, nxt = eta(stored, now, learner(step=40, training=40 * 256 // 8, state="waiting"), rate=8.0)
    assert selfplay["first_games_done"] and selfplay["positions_per_game"] == 40.0
    assert selfplay["games_per_hour"] == 8.0 * 3600 / 40.0  # 720
    assert describe_selfplay(selfplay, short=True) == "80 games finished, 64 in play; 8.0 positions/s played, 720 games/h"
    assert nxt["steps_allowed_now"] == 0 and nxt["limited_by"] == "selfplay"
    assert round(nxt["eta_s"]) == round(1920 / (8.0 * 0.95)) == 253
    assert describe_next_generation(nxt, {"selfplay": selfplay}) == (
        "in about 4.2 min (self-play sets the pace: 7.6 training positions/s allow 14.2 steps a minute)")
    assert describe_next_generation(nxt, {"selfplay": selfplay}, short=True) == "in about 4.2 min"


def test_after_a_resume_the_learners_own_data_gives_the_time_and_new_play_is_measured_again():
    """After a resume the user's status said 'in about 1.4 h': the store's rate since the new start.
    Steps the stored positions allow come at the learner's settled rate; steps that wait for games
    are 'measuring' while the restarted worker's games are young, whatever the store held before."""
    now = START + 90.0
    old = [Chunk(f"old{k}", 40, 1, 0, "selfplay", START - 4000.0 + k) for k in range(200)]
    selfplay, nxt = eta(old, now, learner(step=150, training=8000, samples_drawn=150 * 256, next_generation_step=200))
    assert selfplay["games_finished"] == 0 and not selfplay["first_games_done"]
    assert nxt["limited_by"] == "learner" and nxt["eta_s"] == 50 * 256 / 800.0  # 16 s
    assert describe_next_generation(nxt, {"selfplay": selfplay}) == "in about 16 s (at the learner's pace)"
    _, nxt = eta(old, now, learner(step=150, training=5000, samples_drawn=150 * 256, next_generation_step=200))
    assert nxt["eta_s"] is None and "the first 64 games are still in play" in nxt["measuring"]


def test_a_learner_rate_of_a_few_steps_is_measuring():
    now = START + 700.0
    stored = chunks(*[(300 + 5 * k, 1, 40) for k in range(80)])
    _, nxt = eta(stored, now, learner(step=3, training=4000, rate_steps=LEARNER_SETTLE_STEPS - 1, samples_per_s=87.0))
    assert nxt["eta_s"] is None and nxt["learner_samples_per_s"] is None
    assert describe_next_generation(nxt, {}) == "measuring: the learner's samples/s"
    _, nxt = eta(stored, now, learner(step=3, training=4000, rate_steps=LEARNER_SETTLE_STEPS))
    assert nxt["eta_s"] == 97 * 256 / 800.0


def test_without_a_daemon_the_store_history_is_the_one_speed():
    stored = chunks(*[(10 * k, 2, 30) for k in range(31)])  # 300 s of play, a chunk every 10 s
    selfplay = selfplay_speed(stored, {"alive": False, "started": START}, None, val_percent=0.0, max_plies=300,
                              full_search_prob=0.25, now=START + 5000.0)
    assert selfplay["source"] == "store" and selfplay["over_s"] == 300.0
    assert selfplay["positions_per_s"] == 30 * 30 / 300.0 and selfplay["games_per_hour"] == 60 * 3600 / 300.0
    assert describe_selfplay(selfplay) == "3.0 positions/s, 720 games/h stored in its last 5.0 min (no daemon running now)"
    assert selfplay_speed([], None, None, val_percent=0.0, max_plies=300, full_search_prob=0.25, now=0.0) is None
