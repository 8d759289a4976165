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
from trainer.records import Eval, make_record  # noqa: E402
from trainer.replay import ReplayStore, is_validation  # noqa: E402
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


def test_status_of_an_empty_run_says_what_to_do(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["status", str(tmp_path / "empty")]) == 0
    out = capsys.readouterr().out
    assert "data        none yet" in out and "checkpoint  none yet" in out


def test_status_json_and_missing_run(run, tmp_path, capsys):
    assert main(["status", str(run), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["data"]["chunks"] == 12
    assert main(["status", str(tmp_path / "nowhere")]) == 2
    assert "error: no run directory" in capsys.readouterr().err


def test_plot_writes_one_png_per_chart(run, tmp_path, capsys):
    out = tmp_path / "plots"
    assert main(["plot", str(run), "--out", str(out)]) == 0
    written = capsys.readouterr().out.split()
    assert sorted(os.path.basename(p) for p in written) == [
        "learning_rate.png", "loss.png", "throughput.png", "validation.png"]
    for path in written:
        with open(path, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert not [n for n in os.listdir(out) if not n.endswith(".png")]  # no temporary files left


def test_plot_without_metrics_is_a_clear_error(tmp_path, capsys):
    (tmp_path / "run").mkdir()
    assert main(["plot", str(tmp_path / "run")]) == 2
    assert "has no metrics yet" in capsys.readouterr().err


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


@pytest.fixture
def daemon_run(run):
    (run / "daemon.json").write_text(json.dumps({
        "pid": os.getpid(), "started": 500.0, "run": "run", "endpoint": "tcp://127.0.0.1:5780",
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
    assert status["daemon"]["pid"] == os.getpid() and status["daemon"]["alive"] is True
    assert status["daemon"]["endpoint"] == "tcp://127.0.0.1:5780" and status["daemon"]["keys"] is False
    workers = status["workers"]
    assert [w["id"] for w in workers["workers"]] == ["local-cpu-0", "local-cpu-1", "remote-a", "?"]
    assert workers["total"] == {"alive": 3, "known": 4, "games_per_hour": 240.0, "positions_per_s": 800.0,
                                "games": 35, "restarts": 2}  # the dead worker's rates are not counted
    assert workers["workers"][1]["generation"] == 2
    assert status["published"]["generation"] == 3  # the torn line is skipped
    gate = status["gating"]
    assert (gate["generation"], gate["best"], gate["accepted"]) == (4, 3, False)
    assert (gate["wins"], gate["draws"], gate["losses"], gate["llr"]) == (10, 20, 14, -2.95)

    text = format_status(status, now=1000.0)
    assert f"daemon      pid {os.getpid()} running, started 8.3 min ago" in text
    assert "workers connect to tcp://127.0.0.1:5780, networks on tcp://127.0.0.1:5781" in text
    assert "workers     3 of 4 alive: 240 games/h, 800 positions/s; 35 games, 2 restarts, as of 0 s ago" in text
    assert "local-cpu-1  alive  box cpu, generation 2, 120 games/h, 400 positions/s, 15 games, 1 restart" in text
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
    assert written == ["gating.png", "learning_rate.png", "loss.png", "throughput.png", "validation.png"]
    assert (out / "gating.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    gating_only = tmp_path / "gating-only"  # a daemon run before the learner logged anything
    gating_only.mkdir()
    (gating_only / "gating.jsonl").write_bytes((daemon_run / "gating.jsonl").read_bytes())
    assert main(["plot", str(gating_only), "--out", str(tmp_path / "g")]) == 0
    assert [os.path.basename(p) for p in capsys.readouterr().out.split()] == ["gating.png"]


def test_status_shows_how_each_device_is_shared(tmp_path):
    """A GPU with self-play workers and a learner rank says so: the run's split of its devices."""
    from trainer.daemon import WORKERS_FILE, learner_ranks

    split = {"cuda:0": {"selfplay_workers": 1, "games_per_worker": 256, "network_max_batch": 1024,
                        "learner_ranks": learner_ranks("cuda:0")["cuda:0"]}}
    (tmp_path / WORKERS_FILE).write_text(json.dumps({"time": 0, "workers": [], "devices": split}))
    text = format_status(run_status(str(tmp_path)))
    assert ("cuda:0      1 self-play worker (256 games, network batches up to 1024) and 1 learner rank, "
            "sharing its time") in text
    assert learner_ranks("cpu:2") == {"cpu": 2} and learner_ranks("cuda:0,1") == {"cuda:0": 1, "cuda:1": 1}
