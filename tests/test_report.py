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
