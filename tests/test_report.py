"""`cyzero-train status` and `cyzero-train plot`: what a person reads about a run, from the run's own files."""

import json
import os
import time

import numpy as np
import pytest

pytest.importorskip("torch", reason="the trainer needs the train extra (pip install 'cyzero[train]')")
pytest.importorskip("matplotlib", reason="plots need matplotlib (the train extra)")

from engine.board import Board  # noqa: E402
from trainer.cli import main  # noqa: E402
from trainer.config import is_validation  # noqa: E402
from trainer.records import Eval, make_record  # noqa: E402
from trainer.store import ReplayStore  # noqa: E402
from trainer.atomic import read_jsonl  # noqa: E402
from trainer.report import format_status, run_status  # noqa: E402


def _game(moves=("e2e4", "e7e5", "g1f3")):
    board, records = Board(), []
    for move in moves:
        records.append(make_record(board, {move: 1}, result_q=0.0, result_d=1.0, plies_left=3,
                                   played=move, root=Eval(0.0, 1.0, 3.0)))
        board.push_uci(move)
    return np.array(records)


@pytest.fixture
def run(tmp_path):
    run = tmp_path / "run"
    store = ReplayStore(run)
    for i in range(12):
        store.append_games([_game()] * (1 + i % 2), generation=i // 4, source="teacher" if i < 8 else "selfplay")
    lines = [json.dumps({"step": s, "time": 1.0, "loss_policy": 3.0 - s / 1000, "loss_value": 1.0,
                         "lr": 0.02, "samples_per_s": 400.0, "val_policy_top1": 0.1 + s / 10000})
             for s in (100, 200, 300)]
    (run / "metrics.jsonl").write_text("\n".join(lines) + '\n{"step": 400, "loss_pol')  # a writer mid-line
    generations = [{"generation": g, "step": 100 * g, "onnx": f"networks/gen-{g:05d}.onnx", "sha256": "ab" * 32,
                    "time": time.time(), "val": {"policy_top1": 0.1 * g}} for g in (1, 2)]
    (run / "generations.jsonl").write_text("".join(json.dumps(g) + "\n" for g in generations))
    return run


def test_status_counts_what_the_store_and_logs_hold(run):
    status = run_status(run)
    data = status["data"]
    games = sum(1 + i % 2 for i in range(12))
    assert data["positions"] == 3 * games and data["games"] == games and data["chunks"] == 12
    assert data["by_source"] == {"teacher": 3 * sum(1 + i % 2 for i in range(8)),
                                 "selfplay": 3 * sum(1 + i % 2 for i in range(8, 12))}
    held_out = sum(e.positions for e in ReplayStore(run).entries() if is_validation(e.name, 5.0))
    assert data["validation_positions"] == held_out
    assert data["window"] == data["training_positions"] == data["positions"] - held_out  # below the floor
    assert data["newest_generation_played"] == 2
    assert status["metrics"]["step"] == 300  # the torn line is skipped
    assert status["generation"]["generation"] == 2 and status["previous_generation"]["generation"] == 1
    assert status["checkpoint"] is None

    text = format_status(status)
    assert f"{data['positions']:,} positions" in text and "generation 2 at step 200" in text
    assert "policy_top1 0.2 (was 0.1)" in text and "step 300" in text
    assert "none yet: `cyzero-train learn RUN`" in text


def test_status_of_a_new_run_says_what_to_do(tmp_path, capsys):
    (tmp_path / "new").mkdir()
    (tmp_path / "new" / "config.toml").write_text('[model]\nnet = "1x8"\n')  # a run made by hand, no data yet
    assert main(["status", str(tmp_path / "new")]) == 0
    out = capsys.readouterr().out
    assert "data        none yet" in out and "checkpoint  none yet" in out


def test_status_json_and_missing_run(run, tmp_path, capsys):
    assert main(["status", str(run), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["data"]["chunks"] == 12
    assert main(["status", str(tmp_path / "nowhere")]) == 2
    assert "is not a run directory: there is no such folder" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["status", "plot"])
def test_a_folder_that_is_not_a_run_is_said_to_be_one_and_left_alone(tmp_path, capsys, command):
    """`status /tmp` and `plot /nonexistent`: "not a run directory", exit 2, and nothing is
    written into the folder (no replay/, no plots/)."""
    folder = tmp_path / "just-a-folder"
    folder.mkdir()
    (folder / "notes.txt").write_text("not a run")
    assert main([command, str(folder)]) == 2
    err = capsys.readouterr().err
    assert f"cyzero-train {command}: error: {folder} is not a run directory" in err and "Traceback" not in err
    assert sorted(os.listdir(folder)) == ["notes.txt"]
    assert main([command, str(tmp_path / "nonexistent")]) == 2
    assert "is not a run directory: there is no such folder" in capsys.readouterr().err
    assert not (tmp_path / "nonexistent").exists()


def test_plot_writes_one_png_per_chart(run, tmp_path, capsys):
    out = tmp_path / "plots"
    assert main(["plot", str(run), "--out", str(out)]) == 0
    written = capsys.readouterr().out.split()
    assert sorted(os.path.basename(p) for p in written) == [
        "data.png", "learning_rate.png", "loss.png", "throughput.png", "validation.png"]
    for path in written:
        with open(path, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert not [n for n in os.listdir(out) if not n.endswith(".png")]  # no temporary files left


def test_plot_without_anything_to_draw_is_a_clear_error(tmp_path, capsys):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.toml").write_text("")
    assert main(["plot", str(tmp_path / "run")]) == 2
    assert "has nothing to plot yet" in capsys.readouterr().err


def png_text(path) -> dict:
    """The tEXt chunks of a PNG (plot writes each chart's panels, scales and series in Description)."""
    import struct

    data, i, out = open(path, "rb").read(), 8, {}
    while i < len(data):
        (n,) = struct.unpack(">I", data[i:i + 4])
        kind, body = data[i + 4:i + 8], data[i + 8:i + 8 + n]
        if kind == b"tEXt":
            key, _, value = body.partition(b"\0")
            out[key.decode()] = value.decode("latin-1")
        i += 12 + n
    return out


def panels(path) -> dict[str, tuple[str, list[str]]]:
    """{panel title: (scale, [series])} of a chart plot wrote."""
    out = {}
    for line in png_text(path)["Description"].splitlines():
        head, _, series = line.rpartition(": ")
        title, _, scale = head.rpartition(" (")
        out[title] = (scale.split()[0], series.split(", "))
    return out


def metrics_run(tmp_path, rows) -> str:
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(run)


def test_plot_gives_each_quantity_its_panel_and_log_scales_where_values_span_decades(tmp_path, capsys):
    """The window (~1,700 and growing), samples/s (~35) and the generation (~1) each get a panel;
    grad_norm is not among the losses; a quantity spanning decades is drawn on a log scale."""
    rows = [{"step": s, "time": 1.0 * s, "loss_policy": 6.0 - s / 100, "loss_value": 1.0, "loss_moves_left": 2.0 / s,
             "loss_total": 8.0 - s / 100, "grad_norm": 3.0, "lr": 0.003 * min(1.0, s / 250), "samples_per_s": 35.0,
             "window": 1700 * s, "generation": s // 100, "val_policy_top1": 0.1, "val_total": 7.5, "mystery": 1}
            for s in (1, 10, 50, 100, 200, 300)]
    run = metrics_run(tmp_path, rows)
    assert main(["plot", run]) == 0
    files = {os.path.basename(p): p for p in capsys.readouterr().out.split()}
    assert sorted(files) == ["grad_norm.png", "learning_rate.png", "loss.png", "other.png", "throughput.png",
                             "validation.png"]
    loss = panels(files["loss.png"])
    assert loss == {"total loss": ("linear", ["loss_total", "val_total"]),
                    "policy loss (cross-entropy)": ("linear", ["loss_policy"]),
                    "value loss (WDL cross-entropy)": ("linear", ["loss_value"]),
                    "moves-left loss (Huber, 20 plies a unit)": ("log", ["loss_moves_left"])}
    assert not any("grad_norm" in series for _, series in loss.values())
    assert panels(files["grad_norm.png"]) == {"gradient norm (before clipping)": ("linear", ["grad_norm"])}
    assert panels(files["throughput.png"]) == {
        "positions a second: trained, and what the replay loader could deliver": ("linear", ["samples_per_s"]),
        "sampling window": ("log", ["window"]),
        "generation exported": ("linear", ["generation"])}
    assert panels(files["learning_rate.png"]) == {"learning rate": ("log", ["lr"])}  # the warm-up spans decades
    assert panels(files["other.png"]) == {"mystery": ("linear", ["mystery"])}


def test_plot_draws_the_first_point(tmp_path, capsys):
    """One log line (the first minutes of a run) is drawn: a marker, not an empty axis (a single
    point of a line without markers draws nothing)."""
    import matplotlib.image

    run = metrics_run(tmp_path, [{"step": 100, "time": 1.0, "loss_total": 3.0, "samples_per_s": 35.0}])
    assert main(["plot", run]) == 0
    for path in capsys.readouterr().out.split():
        pixels = matplotlib.image.imread(path)[..., :3]
        blue = np.abs(pixels - np.array([0x1F, 0x77, 0xB4]) / 255.0).max(axis=-1) < 0.08  # tab:blue, the series
        block = np.ones_like(blue[2:, 2:])  # a 3x3 patch of it: a marker, not a thin legend or grid line
        for di in range(3):
            for dj in range(3):
                block &= blue[di:di + blue.shape[0] - 2, dj:dj + blue.shape[1] - 2]
        assert block.any(), f"{path}: no point drawn"


def test_plot_draws_the_store_before_the_learner_logs(tmp_path, capsys):
    """Minutes into a run the learner has no metrics line yet, but self-play has stored games:
    plot draws them (data.png) instead of saying there is nothing to plot."""
    run = tmp_path / "run"
    store = ReplayStore(run)
    for i in range(3):  # the daemon holds out the first game (issue 46): the chart shows it from the start
        store.append_games([_game()] * 2, generation=0, source="selfplay", held_out=i == 0, val_percent=5.0)
    assert main(["plot", str(run)]) == 0
    written = capsys.readouterr().out.split()
    assert [os.path.basename(p) for p in written] == ["data.png"]
    assert panels(written[0]) == {
        "positions in the replay store": ("linear", ["positions:selfplay", "positions:validation"]),
        "self-play games finished per hour (in 1.0 min bins; games in play not counted)":
            ("linear", ["selfplay_games_per_hour"])}


def test_games_per_hour_count_from_the_first_chunk_on(tmp_path, drawn):
    """One chunk of 8 games read as 28,800 games/h (its games over a floor of one second), and two
    chunks 15 s apart as 3,840 (16 games in 15 s, the first chunk's games played before it): the
    rate counts the games after the first chunk, over the time since it."""
    from trainer.report import plot_run

    true = 8 * 3600 / 15  # 8 games a chunk, a chunk every 15 s
    for n in (1, 2, 9):
        drawn.clear()
        plot_run(plotted_run(tmp_path / str(n), n), tmp_path / str(n) / "plots")
        bottom = drawn["data"].axes[1]
        rates = [y for line in bottom.get_lines() for y in line.get_ydata()]
        if n == 1:
            assert rates == [] and "a rate needs the next" in bottom.texts[0].get_text()
        elif n == 2:
            assert rates == [true]
        else:  # binned by the minute, chunks on the bins' edges: near the true rate, not a multiple of it
            assert rates and all(0.7 * true < r < 1.3 * true for r in rates), rates


def test_read_jsonl_skips_garbage_lines(tmp_path):
    path = tmp_path / "log.jsonl"
    path.write_text('{"a": 1}\nnot json\n[1, 2]\n{"a": 2}\n{"a":')
    assert [r["a"] for r in read_jsonl(path)] == [1, 2]
    assert list(read_jsonl(tmp_path / "missing.jsonl")) == []


# The daemon's files (docs/training.md, "The daemon"), written by hand, garbage included.

def _worker(wid, alive, **fields):
    return {"id": wid, "host": "box", "pid": 100, "devices": "cpu", "local": True, "alive": alive,
            "last_seen": 1000.0, "generation": 3, "playing": 32, "positions_per_s": 400.0, "games": 10,
            "positions": 900, "games_per_hour": 120.0, "restarts": 1, "started": 900.0, **fields}


def fake_process(*args: str, cwd=None):
    """A process whose command line reads ``args`` (it sleeps): what status finds at a recorded pid.
    Returned once it has exec'd (before that, /proc shows the parent's command line)."""
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", *args], cwd=cwd)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{proc.pid}/cmdline", "rb") as f:
                if b"time.sleep(120)" in f.read():
                    break
        except OSError:
            break  # no /proc: status only asks whether the pid exists
        time.sleep(0.01)
    return proc


@pytest.fixture
def fake_daemon(run):
    """A process that looks like `cyzero-train run RUN` to status (its command line names the run)."""
    proc = fake_process("trainer.cli", "run", str(run))
    yield proc
    proc.kill()
    proc.wait()


@pytest.fixture
def daemon_run(run, fake_daemon):
    (run / "daemon.json").write_text(json.dumps({
        "pid": fake_daemon.pid, "started": 500.0, "run": "run", "endpoint": "tcp://127.0.0.1:5780",
        "publish": "tcp://127.0.0.1:5781", "fetch": "tcp://127.0.0.1:5782", "keys": False}))
    (run / "workers.json").write_text(json.dumps({
        "time": 1000.0, "generation": 3, "games": 30, "positions": 2700,
        "workers": [_worker("local-cpu-0", True), _worker("local-cpu-1", True, generation=2, games=15),
                    _worker("remote-a", False, games_per_hour=999.0, positions_per_s=999.0, restarts=0),
                    "garbage", {"alive": True}],
        "learner": {"pid": 4321, "alive": True, "devices": "cpu:2", "restarts": 1, "started": 600.0}}))
    (run / "published.jsonl").write_text(
        '{"generation": 2, "onnx": "networks/gen-00002.onnx", "sha256": "ab", "time": 900.0, "gated": false}\n'
        '{"generation": 3, "onnx": "networks/gen-00003.onnx", "sha256": "cd", "time": 990.0, "gated": true}\n'
        '{"generation": 4, "onn')  # torn: the daemon mid-line
    gate = {"generation": 4, "best": 3, "accepted": False, "wins": 10, "draws": 20, "losses": 14, "games": 44,
            "llr": -2.95, "lower": -2.94, "upper": 2.94, "elo": -31.6, "elo_error": 60.2, "time": 995.0,
            "reason": "sprt"}
    (run / "gating.jsonl").write_text(
        json.dumps({**gate, "generation": 3, "best": 2, "accepted": True, "llr": 2.95, "elo": 40.0}) + "\n"
        + "garbage\n" + json.dumps(gate) + "\n" + '{"generation": "five", "elo": 1}\n')
    return run


def test_status_shows_the_daemon_its_workers_the_published_generation_and_the_last_gate(daemon_run, capsys):
    status = run_status(daemon_run)
    pid = status["daemon"]["pid"]
    assert status["daemon"]["alive"] is True
    assert status["daemon"]["endpoint"] == "tcp://127.0.0.1:5780" and status["daemon"]["keys"] is False
    workers = status["workers"]
    assert [w["id"] for w in workers["workers"]] == ["local-cpu-0", "local-cpu-1", "remote-a", "?"]
    assert workers["total"] == {"alive": 3, "known": 4, "games": 35, "restarts": 2}
    # one self-play speed, the estimator's: the live workers' positions played (the dead one's not counted)
    assert status["selfplay"]["positions_per_s"] == 800.0 and status["selfplay"]["games_in_flight"] == 64
    assert workers["workers"][1]["generation"] == 2
    assert status["published"]["generation"] == 3  # the torn line is skipped
    gate = status["gating"]
    assert (gate["generation"], gate["best"], gate["accepted"]) == (4, 3, False)
    assert (gate["wins"], gate["draws"], gate["losses"], gate["llr"]) == (10, 20, 14, -2.95)

    text = format_status(status, now=1000.0)
    assert f"daemon      pid {pid} running, started 8.3 min ago" in text
    assert "workers connect to tcp://127.0.0.1:5780, networks on tcp://127.0.0.1:5781" in text
    assert "workers     3 of 4 alive: 35 games stored, 2 restarts, as of 0 s ago" in text
    assert ("local-cpu-1  alive  box cpu, generation 2, 400.0 positions/s played, 32 games in play, 15 games stored, "
            "1 restart") in text
    assert "games/h" not in text.split("workers     ")[1]  # the workers' lines repeat no second speed
    assert "remote-a     dead   box cpu" in text
    assert "learner     alive on cpu:2, pid 4321, 1 restart" in text
    assert "published   generation 3 (networks/gen-00003.onnx, gated, 10 s ago)" in text
    assert ("gating      generation 4 vs 3: W/D/L 10/20/14, LLR -2.95 in [-2.94, 2.94]: rejected (sprt), "
            "Elo -32 ± 60, 5 s ago") in text

    assert main(["status", str(daemon_run), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["workers"]["total"]["alive"] == 3


def test_a_daemon_that_is_gone_is_shown_as_not_running(daemon_run):
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()  # reaped: its pid names no process now
    record = json.loads((daemon_run / "daemon.json").read_text())
    (daemon_run / "daemon.json").write_text(json.dumps({**record, "pid": proc.pid}))
    status = run_status(daemon_run)
    assert status["daemon"]["alive"] is False
    text = format_status(status, now=1000.0)
    assert f"pid {proc.pid} not running" in text and "the daemon is not running, so none is playing now" in text


def test_a_pid_reused_by_another_process_is_not_taken_for_the_daemon(daemon_run, tmp_path):
    """daemon.json's pid, once the daemon is gone, may name any process: status checks that the
    process is `cyzero-train run` on this run (a relative RUN read from its working directory)."""
    record = json.loads((daemon_run / "daemon.json").read_text())
    others = [fake_process(),  # some other program got the pid
              fake_process("trainer.cli", "run", str(tmp_path / "another-run")),  # a daemon of another run
              fake_process("trainer.cli", "learn", str(daemon_run))]  # this run's learner, not its daemon
    same = fake_process("/venv/bin/cyzero-train", "run", "--devices", "cpu", os.path.basename(daemon_run),
                        cwd=os.path.dirname(daemon_run))  # started as `cyzero-train run RUN` from RUN's parent
    try:
        for proc in others:
            (daemon_run / "daemon.json").write_text(json.dumps({**record, "pid": proc.pid}))
            text = format_status(run_status(daemon_run), now=1000.0)
            assert f"pid {proc.pid} not running" in text and "so none is playing now" in text
            assert "learner     not running on cpu:2" in text  # its children went with it
        (daemon_run / "daemon.json").write_text(json.dumps({**record, "pid": same.pid}))
        assert f"pid {same.pid} running" in format_status(run_status(daemon_run), now=1000.0)
    finally:
        for proc in [*others, same]:
            proc.kill()
            proc.wait()


def _chunk_line(name, positions, games, generation, when, source="selfplay"):
    return json.dumps({"op": "add", "name": name, "positions": positions, "games": games, "generation": generation,
                       "source": source, "time": when, "game_ids": [f"{name}-{i}" for i in range(games)]},
                      separators=(",", ":")) + "\n"


def learner_run(tmp_path, fake_daemon_for, **learner):
    """A run in the middle of its life, written by hand: 40 self-play chunks of 100 positions and 8
    games, one every 15 s until `now`; a daemon and a learner at step 68 (generations every 100 steps)."""
    run = tmp_path / "run"
    (run / "replay").mkdir(parents=True)
    now = 10_000.0
    (run / "config.effective.toml").write_text("[replay]\nval_percent = 0.0\nfloor = 10000\n"
                                               "max_samples_per_position = 4.0\n")
    (run / "config.toml").write_text("# the user's own file, which status does not read\n[replay]\nfloor = 5\n")
    (run / "replay" / "manifest.jsonl").write_text("".join(
        _chunk_line(f"selfplay-g{k // 20:05d}-{k:04d}.gz", 100, 8, k // 20, now - 15 * (39 - k)) for k in range(40))
        + '{"op":"prune","names":["selfplay-g00000-0000.gz"]}\n{"op":"add","name":"torn')
    daemon = fake_daemon_for(run)
    (run / "daemon.json").write_text(json.dumps({"pid": daemon.pid, "started": now - 600.0, "run": "run"}))
    (run / "workers.json").write_text(json.dumps({"time": now - 1.0, "workers": [
        _worker("local-cpu-0", True, playing=8, positions_per_s=6.5, started=now - 590.0)]}))
    learner_proc = fake_daemon_for(run, "learn")
    record = {"pid": learner_proc.pid, "started": now - 590.0, "time": now - 1.0, "state": "training", "step": 68,
              "target_step": None, "generation": 0, "checkpoint_step": 0, "checkpoint_every": 100,
              "next_generation_step": 100, "batch_size": 16, "world": 1, "device": "cpu", "samples_per_s": 32.0,
              "rate_steps": 40, "window_positions": 3900, "training_positions": 3900, "samples_drawn": 68 * 16,
              "max_samples_per_position": 4.0, "batches_available": 907, "waiting_since": None, "waited_s": 0.0,
              "follow": True, **learner}
    (run / "learner.json").write_text(json.dumps(record))
    return run, now


@pytest.fixture
def fake_daemon_for():
    procs = []

    def make(run, command="run"):
        procs.append(fake_process("trainer.cli", command, str(run)))
        return procs[-1]

    yield make
    for proc in procs:
        proc.kill()
        proc.wait()


def test_status_shows_the_learners_step_rate_the_window_its_age_games_per_hour_and_the_next_generation(
        tmp_path, fake_daemon_for, capsys):
    """What the learner is doing now (learner.json, rewritten every few seconds), not the last
    checkpoint: step 68 and 32 samples/s; the window (the newest 3,900 positions: the whole store,
    played from 9.5 min ago to now); self-play's speed, the positions the worker plays a second, and
    games/h from it and the positions a stored game holds; and generation 1 due at step 100: 32
    steps at 2 steps/s (16 s), the store allowing them."""
    run, now = learner_run(tmp_path, fake_daemon_for)
    status = run_status(run, now=now)
    text = format_status(status, now=now)
    assert ("  window      3,900 of 3,900 training positions (floor 10,000), played 9.5 min to 0 s ago by "
            "generations 0-1; 0 held out for validation") in text
    # 39 chunks since the daemon's start (the first one is pruned): 8 games of 12.5 positions each;
    # 6.5 positions/s / 12.5 = 1,872 games/h
    assert ("  self-play   312 games finished since the daemon started, 8 in play at once; 6.5 positions/s played "
            "(training positions; the games in play count), 1,872 games/h") in text
    assert "  training    step 68: 32.0 samples/s while training (as of 1 s ago)" in text
    assert "  next gen    generation 1 at step 100, 32 steps to go: in about 16 s (at the learner's pace)" in text
    assert main(["status", str(run), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["learner"]["step"] == 68 and out["next_generation"]["steps_left"] == 32

    # At the sampling cap: the learner waits, and self-play sets the pace of the next generation.
    # 3,900 positions x 4 samples allow 975 steps in all, 907 of them already taken: at step 975 the
    # next 25 steps need 25 x 16 / 4 = 100 more positions, 15.4 s of self-play at 6.5 positions/s.
    run, now = learner_run(tmp_path / "2", fake_daemon_for, state="waiting", step=975, samples_drawn=975 * 16,
                           waiting_since=9_960.0, batches_available=0, next_generation_step=1000, generation=9)
    text = format_status(run_status(run, now=now), now=now)
    assert ("  training    step 975: waiting for self-play games for 40 s (at the sampling cap, "
            "replay.max_samples_per_position = 4); 32.0 samples/s while training (as of 1 s ago)") in text
    assert ("  next gen    generation 10 at step 1,000, 25 steps to go: in about 15 s (self-play sets the pace: "
            "6.5 training positions/s allow 97.5 steps a minute)") in text


def test_a_learner_rate_of_a_few_steps_is_measuring_not_a_figure(tmp_path, fake_daemon_for):
    """Issue 46: at its first steps the learner read '87.2 samples/s' (the loader starting, the
    network warming up); status says it measures until 10 steps, and gives no time from it."""
    run, now = learner_run(tmp_path, fake_daemon_for, rate_steps=3, samples_per_s=87.2)
    text = format_status(run_status(run, now=now), now=now)
    assert "  training    step 68: samples/s measuring (3 steps so far) (as of 1 s ago)" in text
    assert "  next gen    generation 1 at step 100, 32 steps to go: measuring: the learner's samples/s" in text


def test_a_learner_that_stopped_or_vanished_is_said_so(tmp_path, fake_daemon_for):
    run, now = learner_run(tmp_path, fake_daemon_for, state="stopped", time=9_880.0)
    text = format_status(run_status(run, now=now), now=now)
    assert "  training    stopped at step 68, as of 2.0 min ago" in text and "next gen" not in text
    run, now = learner_run(tmp_path / "2", fake_daemon_for, pid=os.getpid())  # a pid that is not its learner
    text = format_status(run_status(run, now=now), now=now)
    assert "  training    not running: last seen at step 68, as of 1 s ago" in text and "next gen" not in text


def test_status_reads_a_run_without_importing_torch_or_numpy(daemon_run):
    """`status` answers at once: it reads files, and imports neither torch (seconds) nor numpy."""
    import subprocess
    import sys

    code = ("import sys; from trainer.cli import main; code = main(['status', sys.argv[1]]); "
            "print(code, 'torch' in sys.modules, 'numpy' in sys.modules, file=sys.stderr)")
    workers = json.loads((daemon_run / "workers.json").read_text())
    share = {"selfplay_workers": 2, "games_per_worker": 32, "network_max_batch": None, "learner_ranks": 2}
    (daemon_run / "workers.json").write_text(json.dumps({**workers, "devices": {"cpu": share}}))
    proc = subprocess.run([sys.executable, "-c", code, str(daemon_run)], capture_output=True, text=True, timeout=120,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert "daemon      pid" in proc.stdout
    assert "cpu         2 self-play workers (32 games) and 2 learner ranks, sharing its time" in proc.stdout
    assert proc.stderr.split()[-3:] == ["0", "False", "False"], proc.stderr


def test_the_reader_agrees_with_the_writers():
    """status reads the run through trainer.rundir, which names every file of it; the store still
    names its manifest itself, and samples by the window rule and validation split status uses."""
    from trainer import loader, rundir, store
    from trainer.config import is_validation as config_is_validation, window_size

    assert all(rundir.OPPONENT.fullmatch(name) for name in ("random", "gen0", "gen12", "sf-skill3"))
    assert rundir.MANIFEST == os.path.join(rundir.REPLAY_DIR, store.MANIFEST)
    # One rule each, shared: the store and the learner use the very functions status uses.
    assert (loader.window_size, loader.is_validation, store.is_validation) == (
        window_size, config_is_validation, config_is_validation)


def test_the_manifest_is_read_as_the_store_replays_it(run):
    store = ReplayStore(run)
    names = [e.name for e in store.entries()]
    store.prune(0)  # retention appends a prune line
    store.append_games([_game()] * 3, generation=5, source="selfplay", game_ids=["a", "b", "c"])
    with open(run / "replay" / "manifest.jsonl", "a") as f:
        f.write('garbage\n{"op":"add","name":"x.gz","positions":3,"games":1,"generation":1,"source":"s",'
                '"time":1.0,"game_ids":["tor')  # a line in progress
    from trainer.rundir import read_manifest

    assert [tuple(c) for c in read_manifest(str(run))] == [
        (e.name, e.positions, e.games, e.generation, e.source, e.time) for e in ReplayStore(run).entries()]
    assert names  # (the fixture's store had chunks before the prune)


def test_status_skips_garbled_daemon_files(run, capsys):
    (run / "daemon.json").write_text('{"pid": 12')  # torn
    (run / "workers.json").write_text(json.dumps({"time": "noon", "workers": [{"id": 7, "alive": "yes",
                                                                              "games": "many"}]}))
    (run / "published.jsonl").write_bytes(b"\xff\xfe garbage\n[1]\n")
    (run / "gating.jsonl").write_text('{"generation": 2, "elo": NaN, "llr": "x", "accepted": 1}\n')
    status = run_status(run)
    assert status["daemon"] is None and status["published"] is None
    assert status["workers"]["workers"] == [{**{k: None for k in status["workers"]["workers"][0]},
                                             "id": "?", "local": False, "alive": False}]
    assert status["gating"]["elo"] is None and status["gating"]["llr"] is None
    assert status["gating"]["accepted"] is False  # only a real true accepts
    json.dumps(status, allow_nan=False)  # --json stays valid JSON
    text = format_status(status)
    assert "workers     0 of 1 alive" in text and "    ?  silent ?, generation ?" in text and "gating      generation 2 vs ?: W/D/L ?/?/?, LLR ?: rejected" in text
    (run / "workers.json").write_text("[1, 2]")  # not an object
    assert run_status(run)["workers"] is None


def test_a_learner_only_run_shows_no_daemon_lines(run):
    status = run_status(run)
    assert (status["daemon"], status["workers"], status["published"], status["gating"]) == (None,) * 4
    text = format_status(status)
    assert not [line for line in text.splitlines()
                if line.split()[0] in ("daemon", "workers", "published", "gating")]


def test_plot_draws_the_gating_chart(daemon_run, tmp_path, capsys):
    out = tmp_path / "plots"
    assert main(["plot", str(daemon_run), "--out", str(out)]) == 0
    written = sorted(os.path.basename(p) for p in capsys.readouterr().out.split())
    assert written == ["data.png", "gating.png", "learning_rate.png", "loss.png", "throughput.png", "validation.png"]
    assert (out / "gating.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    gating_only = tmp_path / "gating-only"  # a daemon run before the learner logged anything
    gating_only.mkdir()
    (gating_only / "gating.jsonl").write_bytes((daemon_run / "gating.jsonl").read_bytes())
    assert main(["plot", str(gating_only), "--out", str(tmp_path / "g")]) == 0
    assert [os.path.basename(p) for p in capsys.readouterr().out.split()] == ["gating.png"]


def test_status_shows_how_each_device_is_shared(tmp_path):
    """A GPU with self-play workers and a learner rank says so: the run's split of its devices."""
    from trainer.devices import learner_ranks
    from trainer.rundir import WORKERS_FILE

    split = {"cuda:0": {"selfplay_workers": 1, "games_per_worker": 256, "network_max_batch": 1024,
                        "learner_ranks": learner_ranks("cuda:0")["cuda:0"]}}
    (tmp_path / WORKERS_FILE).write_text(json.dumps({"time": 0, "workers": [], "devices": split}))
    text = format_status(run_status(str(tmp_path)))
    assert ("cuda:0      1 self-play worker (256 games, network batches up to 1024) and 1 learner rank, "
            "sharing its time") in text
    assert learner_ranks("cpu:2") == {"cpu": 2} and learner_ranks("cuda:0,1") == {"cuda:0": 1, "cuda:1": 1}


@pytest.fixture
def drawn(monkeypatch):
    """The figures plot draws, by file name (each kept as saved, to read what it shows)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    figures = {}
    save = Figure.savefig

    def keep(fig, f, **kwargs):
        figures[kwargs["metadata"]["Title"].rpartition(": ")[2]] = fig  # "RUN: loss" -> "loss"
        return save(fig, f, **kwargs)

    monkeypatch.setattr(Figure, "savefig", keep)
    return figures


def _panel(fig, title):
    return next(ax for ax in fig.axes if ax.get_title() == title)


def test_the_generation_exported_at_a_checkpoint_step_is_that_steps_generation(tmp_path, drawn):
    """Issue 46: the learner logs a checkpoint step's line just before it exports, so the line at
    step 100 still says generation 0; the panel takes generations.jsonl's word: 1 at step 100."""
    from trainer.report import plot_run

    rows = [{"step": s, "time": 1.0 * s, "loss_total": 3.0, "samples_per_s": 400.0, "window": 1000 + s,
             "generation": s // 100 - (s % 100 == 0)} for s in (50, 100, 150, 200)]
    run = metrics_run(tmp_path, rows)
    with open(os.path.join(run, "generations.jsonl"), "w") as f:
        for g in (0, 1, 2):
            f.write(json.dumps({"generation": g, "step": 100 * g, "onnx": f"networks/gen-{g:05d}.onnx"}) + "\n")
    plot_run(run)
    line = _panel(drawn["throughput"], "generation exported").get_lines()[0]
    exported = dict(zip(line.get_xdata(), line.get_ydata()))
    assert exported[100] == 1 and exported[200] == 2 and exported[0] == 0


def test_the_loss_chart_says_validation_only_when_it_draws_it(tmp_path, drawn):
    from trainer.report import plot_run

    run = metrics_run(tmp_path, [{"step": 50, "time": 1.0, "loss_total": 3.0}])
    plot_run(run)
    assert drawn["loss"]._suptitle.get_text() == "run: losses, training (no validation yet: nothing held out in the store)"
    (tmp_path / "2").mkdir()
    run = metrics_run(tmp_path / "2", [{"step": 50, "time": 1.0, "loss_total": 3.0, "val_total": 3.1,
                                        "val_policy_top1": 0.05}])
    plot_run(run)
    assert drawn["loss"]._suptitle.get_text() == "run: losses, training and validation"
    assert "validation" in drawn


def test_elo_png_is_the_ladder_over_hours_and_over_games_with_stockfish_lines(tmp_path, drawn):
    """The ladder's curve twice, so that two runs lie side by side: against the hours since
    generation 0 and against the self-play games before each generation, Stockfish's levels as
    dashed lines at their ratings."""
    from trainer.report import plot_run

    run = tmp_path / "run"
    run.mkdir()
    players = {"random": {"elo": 0.0, "low": 0.0, "high": 0.0, "games": 40},
               "sf-skill0": {"elo": 900.0, "low": 800.0, "high": 1000.0, "games": 20}}
    curve = [{"generation": g, "elo": 150.0 * g, "low": 150.0 * g - 50, "high": 150.0 * g + 50, "games": 20,
              "hours": 0.5 * g, "selfplay_games": 300 * g} for g in (0, 2, 4)]
    (run / "ratings.json").write_text(json.dumps({"anchor": "random", "nodes": 64, "time": 1.0, "players": players,
                                                  "generations": curve}))
    plot_run(str(run))
    hours, games = drawn["elo"].axes
    assert "hours" in hours.get_xlabel() and "self-play games" in games.get_xlabel()
    for ax, key in ((hours, "hours"), (games, "selfplay_games")):
        line = next(l for l in ax.get_lines() if l.get_marker() == "o")
        assert list(line.get_xdata()) == [c[key] for c in curve] and list(line.get_ydata()) == [0.0, 300.0, 600.0]
        dashed = [l for l in ax.get_lines() if l.get_linestyle() == "--"]
        assert [l.get_ydata()[0] for l in dashed] == [900.0]
    assert "64 nodes" in drawn["elo"]._suptitle.get_text()


def test_the_loss_chart_says_where_a_head_over_fits(tmp_path, drawn):
    """A new user's run: the value loss fell from 0.79 to 0.19 in training while validation went
    1.7, 2.4, 2.1, and nothing said so. The panel now names the step it began at and marks it."""
    from trainer.report import overfitting, plot_run

    train = [(50, 0.79), (100, 0.5), (150, 0.3), (200, 0.19)]
    assert overfitting(train, [(50, 1.7), (100, 2.4), (150, 2.2), (200, 2.1)]) == 50.0
    assert overfitting(train, [(50, 1.7), (100, 1.6), (150, 1.5), (200, 1.45)]) is None   # learning
    assert overfitting(train, [(50, 1.7), (100, 1.72), (150, 1.71), (200, 1.73)]) is None  # within the noise
    # one line up (a young run's held-out sample drawn again as it grows): not yet a trend
    assert overfitting(train, [(50, 1.7), (100, 1.5), (150, 1.4), (200, 1.8)]) is None
    assert overfitting([(50, 0.8), (200, 0.9)], [(50, 1.7), (100, 2.4), (150, 2.2), (200, 2.1)]) is None  # both up
    assert overfitting(train, [(50, 1.7), (100, 2.4)]) is None and overfitting([], []) is None
    run = tmp_path / "run"
    run.mkdir()
    rows = [{"step": step, "loss_value": loss, "val_value_ce": val, "loss_policy": 3.0 - step / 100,
             "val_policy_ce": 3.1 - step / 100}
            for (step, loss), val in zip(train, (1.7, 2.4, 2.2, 2.1))]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    plot_run(str(run))
    titles = [ax.get_title() for ax in drawn["loss"].axes if ax.get_visible()]
    assert "value loss (WDL cross-entropy): over-fitting from step 50" in titles
    assert "policy loss (cross-entropy)" in titles   # the policy learns: nothing said


def test_status_says_which_weights_each_validation_figure_is_of(run):
    """Issue 54: `status` showed two top-1 figures (0.087 and 0.063) with nothing saying why: one is
    the exported generation's network at its export, the other the weights in training at the last
    log line."""
    text = format_status(run_status(run))
    assert "  validation  generation 2's network on the held-out positions, at its export: policy_top1 0.2 (was 0.1)" \
        in text
    assert "  last log    step 300, the weights in training (val_: on the held-out positions): " in text


def test_while_the_learner_exports_status_says_so_not_that_the_generation_is_still_to_come(
        tmp_path, fake_daemon_for):
    """For about 10 s after a checkpoint both the live line and status said "generation 3 at step 400"
    when generation 3 was being exported (and then published): the learner now says it exports."""
    from trainer.progress import display_lines

    run, now = learner_run(tmp_path, fake_daemon_for, state="exporting", step=100, generation=1)
    status = run_status(run, now=now)
    text = format_status(status, now=now)
    assert "  training    step 100: writing its checkpoint and exporting generation 1 (as of 1 s ago)" in text
    assert "next gen" not in text and status["next_generation"] is None
    assert display_lines(status)[1].startswith("learner    step 100, 32 samples/s, exporting generation 1")


def plotted_run(tmp_path, n: int) -> str:
    """A run with ``n`` points in every chart plot draws, as ten minutes into `make train`: ``n``
    learner lines from step 14 or 15 and generation 0 exported at step 0 (a point of its own in
    the throughput chart), ``n`` replay chunks 15 s apart, ``n`` gates (the first a draw-only match:
    Elo 0, no interval) and ``n`` rated generations (the first at 0 hours and 0 games)."""
    run = tmp_path / f"run-{n}"
    (run / "replay").mkdir(parents=True)
    steps = [15] if n == 1 else range(14, 14 + 2 * n, 2)
    rows = [{"step": s, "time": 1.0 * s, "loss_total": 8.0 - s / 100, "val_total": 8.1 - s / 100,
             "loss_policy": 6.0 - s / 100, "val_policy_ce": 6.1 - s / 100, "loss_value": 1.0, "val_value_ce": 1.1,
             "loss_moves_left": 0.5, "val_moves_left": 0.6, "val_policy_top1": 0.05 + s / 1000, "lr": 0.002,
             "grad_norm": 3.0 + s / 100, "samples_per_s": 35.0, "loader_samples_per_s": 50.0,
             "loader_wait_share": 0.0, "window": 1700 + 10 * s, "mystery": 1} for s in steps]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "generations.jsonl").write_text("".join(json.dumps({"generation": g, "step": 50 * g}) + "\n"
                                                   for g in range((max(steps) // 50) + 1)))
    (run / "replay" / "manifest.jsonl").write_text("".join(
        _chunk_line(f"selfplay-g00000-{k:04d}.gz", 100, 8, 0, 1000.0 + 15 * k) for k in range(n)))
    (run / "gating.jsonl").write_text("".join(json.dumps(
        {"generation": g, "best": g - 1, "accepted": g % 2 == 1, "elo": 0.0 if g == 1 else 20.0 * g,
         "elo_error": None if g == 1 else 60.0}) + "\n" for g in range(1, n + 1)))
    curve = [{"generation": g, "elo": 60.0 * g - 30, "low": 60.0 * g - 130, "high": 60.0 * g + 70, "games": 20,
              "hours": 0.4 * g, "selfplay_games": 120 * g} for g in range(n)]
    players = {"random": {"elo": 0.0, "low": 0.0, "high": 0.0, "games": 40},
               "sf-skill0": {"elo": 900.0, "low": 800.0, "high": 1000.0, "games": 20}}
    (run / "ratings.json").write_text(json.dumps({"anchor": "random", "nodes": 64, "time": 1.0, "players": players,
                                                  "generations": curve}))
    return str(run)


#: x axes by label: (shortest readable span, whole-number ticks). Every x axis counts something
#: never negative (steps, generations, games, time); one not named here needs no more than to hold
#: its points.
_X_AXES = {"learner step": (2, True), "generation": (2, True),
           "self-play games played before the generation": (2, True),
           "hours since generation 0": (0.25, False), "seconds since the first chunk": (10, False)}


def _marked(ax) -> np.ndarray:
    """The (x, y) of every point a panel draws with a marker: its data, error bars' caps included."""
    return np.array([(x, y) for line in ax.get_lines() if line.get_marker() not in ("None", "")
                     for x, y in zip(line.get_xdata(), line.get_ydata())]).reshape(-1, 2)


def _whole_ticks(ticks, limits) -> bool:
    shown = [t for t in ticks if limits[0] <= t <= limits[1]]
    return len(shown) >= 2 and all(t == round(t) for t in shown)


@pytest.mark.parametrize("n", [1, 2, 40])
def test_every_chart_shows_its_points_on_a_readable_span_from_the_first_one(tmp_path, drawn, n):
    """Ten minutes into a run throughput.png had three empty panels, their shared x axis
    -1..1 from the one point of "generation exported" (step 0) hiding the lines at steps 14-16;
    elo.png with one rated generation spanned -0.04..0.04 hours and games. Every panel, with 1, 2
    and 40 points: each point well inside its limits, the axis a readable span (whole numbers for
    steps, games and generations), counts not far below 0."""
    from trainer.report import plot_run

    plot_run(plotted_run(tmp_path, n), tmp_path / "plots")
    assert sorted(drawn) == ["data", "elo", "gating", "grad_norm", "learning_rate", "loss", "other", "throughput",
                             "validation"]
    unreadable = []
    for name, fig in drawn.items():
        for ax in (a for a in fig.axes if a.get_visible()):
            (x0, x1), (y0, y1) = ax.get_xlim(), ax.get_ylim()
            where = f"{name}.png, {ax.get_title() or ax.get_ylabel()!r} (x {x0:g}..{x1:g}, y {y0:g}..{y1:g})"
            points = _marked(ax)
            inside = (ax.transData + ax.transAxes.inverted()).transform(points)  # 0..1 across the panel
            if not len(points) and not [t for t in ax.texts if t.get_text()]:
                unreadable.append(f"{where}: no point, and no word why")
            if not ((inside > 0.01) & (inside < 0.99)).all():
                unreadable.append(f"{where}: points {points.tolist()} not inside")
            siblings = ax.get_shared_x_axes().get_siblings(ax)  # the panels below it share its x
            least, whole = _X_AXES.get(next((a.get_xlabel() for a in siblings if a.get_xlabel()), ""), (0, False))
            if x1 - x0 < least or x0 < -0.1 * (x1 - x0):
                unreadable.append(f"{where}: x too narrow or below 0")
            if least and len({x for a in siblings for x in _marked(a)[:, 0]}) == 1 and x1 - x0 > 10 * least:
                unreadable.append(f"{where}: one x, and a wide span around it")
            if whole and not _whole_ticks(ax.get_xticks(), (x0, x1)):
                unreadable.append(f"{where}: not two whole-number ticks on x: {ax.get_xticks()}")
            # elo.png's right panel shares the left one's y and label
            if "Elo" in ax.get_ylabel() + fig.axes[0].get_ylabel() and y1 - y0 < 50:
                unreadable.append(f"{where}: Elo too narrow")
            if ax.get_ylabel() == "generation" and not _whole_ticks(ax.get_yticks(), (y0, y1)):
                unreadable.append(f"{where}: not two whole-number ticks on y: {ax.get_yticks()}")
    assert not unreadable, "\n".join(unreadable)
