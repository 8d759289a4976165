"""The live display of `cyzero-train run` (trainer.progress; issue 46: "`make train` is silent"):
what it says, a plain line a minute off a terminal, lines updated in place on one."""

from __future__ import annotations

import io

from trainer.progress import PLAIN_EVERY_S, REFRESH_S, RunDisplay, display_lines

SELFPLAY = {"running": True, "source": "workers", "positions_per_s": 5.5, "training_positions_per_s": 5.2,
            "games_per_hour": None, "positions_per_game": 25.0, "games_in_flight": 64, "games_finished": 38,
            "first_games_done": False, "longest_game_s": 876.0, "measuring": "the first 64 games are still in play",
            "over_s": None}
LEARNER = {"running": True, "state": "waiting", "step": 27, "samples_per_s": 82.6}
NEXT = {"generation": 1, "step": 100, "steps_left": 73, "eta_s": None, "limited_by": "selfplay",
        "measuring": "the first 64 games are still in play", "steps_allowed_now": 0, "data_steps_per_s": None,
        "learner_samples_per_s": 82.6}


def status(**changes):
    return {"selfplay": SELFPLAY, "learner": LEARNER, "data": {"window": 903}, "next_generation": NEXT, **changes}


def test_the_lines_say_games_speed_step_rate_window_and_the_next_generation():
    play, learn, nxt = display_lines(status())
    assert play == "self-play  38 games finished, 64 in play; 5.5 positions/s played, games/h measuring"
    assert learn == "learner    step 27, 83 samples/s, waiting for games; window 903 positions"
    assert nxt == "next gen   generation 1 at step 100: measuring until the first 64 games end (38 have)"
    settled = {**SELFPLAY, "games_per_hour": 3250.0, "first_games_done": True, "measuring": None}
    soon = {**NEXT, "eta_s": 150.0, "measuring": None, "data_steps_per_s": 0.2}
    play, learn, nxt = display_lines(status(selfplay=settled, next_generation=soon))
    assert play.endswith("5.5 positions/s played, 3,250 games/h")
    assert nxt == "next gen   generation 1 at step 100: in about 2.5 min"
    assert display_lines({"selfplay": None, "learner": None, "data": {}, "next_generation": None}) == (
        "self-play  no game yet", "learner    not started yet")
    # a coordinator (--learner-devices none): the daemon's workers.json has no learner of its own
    coordinator = {"selfplay": None, "learner": None, "data": {}, "next_generation": None,
                   "workers": {"learner": None, "workers": []}}
    assert display_lines(coordinator)[1] == ("learner    none on this machine: a learner elsewhere writes into the "
                                             "run folder (none has yet)")


class Clock:
    def __init__(self, t=1_000.0):
        self.t = t

    def __call__(self):
        return self.t


def test_off_a_terminal_it_prints_one_plain_line_a_minute():
    clock, out, reads = Clock(), io.StringIO(), []

    def read(run_dir, now):
        reads.append(now)
        return status()

    display = RunDisplay("RUN", stream=out, tty=False, clock=clock, read=read)
    for t in (0.0, 1.0, 30.0, PLAIN_EVERY_S - 1):
        clock.t = 1_000.0 + t
        display.update()
    assert out.getvalue() == "" and reads == []  # nothing read before the first minute
    clock.t = 1_000.0 + PLAIN_EVERY_S
    display.update()
    display.update()  # the same moment: once
    clock.t += 30.0
    display.update()
    clock.t += 30.0
    display.update()
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 and reads == [1_060.0, 1_120.0]
    assert "(+1.0 min) self-play  38 games finished, 64 in play" in lines[0]
    assert "(+2.0 min) self-play" in lines[1] and " | learner    step 27" in lines[1]
    assert lines[1].endswith(" | next gen   generation 1 at step 100: measuring until the first 64 games end "
                             "(38 have)")
    assert "\r" not in out.getvalue() and "\x1b" not in out.getvalue()  # plain lines for a log file
    display.write("cyzero-train run: published generation 1 (networks/gen-00001.onnx)")
    assert out.getvalue().splitlines()[-1] == "cyzero-train run: published generation 1 (networks/gen-00001.onnx)"


def test_on_a_terminal_the_lines_are_redrawn_in_place_and_log_lines_go_above():
    clock, out = Clock(), io.StringIO()
    steps = iter(range(10, 100))
    display = RunDisplay("RUN", stream=out, tty=True, clock=clock,
                         read=lambda run_dir, now: status(learner={**LEARNER, "step": next(steps)}))
    display.update()
    assert [bar.desc for bar in display._bars][1].startswith("learner    step 10,")
    clock.t += REFRESH_S / 2
    display.update()  # too soon: not read again
    clock.t += REFRESH_S
    display.update()
    assert display._bars[1].desc.startswith("learner    step 11,")
    display.write("cyzero-train run: published generation 1")
    display.close()
    text = out.getvalue()
    assert "step 10," in text and "step 11," in text
    assert "\r" in text and "\x1b[A" in text  # redrawn in place: back to the line's start, and up to the first line
    assert "cyzero-train run: published generation 1\n" in text


def test_a_display_that_fails_says_so_once_and_the_run_goes_on():
    out = io.StringIO()

    def broken(run_dir, now):
        raise OSError("disk gone")

    display = RunDisplay("RUN", stream=out, tty=True, read=broken)
    display.update()
    display.update()
    assert out.getvalue().count("the live display stopped (OSError: disk gone)") == 1
