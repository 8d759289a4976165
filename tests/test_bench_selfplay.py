"""trainer.bench_selfplay.bench_selfplay: a short real run on a tiny network returns sane figures (no
wall-clock assertions: the rates depend on the machine and its load)."""

from __future__ import annotations

import json
import math

import pytest

from trainer.bench_selfplay import bench_selfplay, format_selfplay_report

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def tiny_net(tmp_path_factory):
    from trainer.export import export_onnx
    from trainer.model import build_net

    path = tmp_path_factory.mktemp("net") / "tiny.onnx"
    export_onnx(build_net("1x8", seed=3), path, check_positions=16)
    return str(path)


def test_a_short_run_returns_positive_rates_and_a_sane_ratio(tiny_net, capsys):
    lines: list[str] = []
    figures = bench_selfplay(print_report=True, seconds=2.0, network=tiny_net, workers=(1,), games=4,
                             log=lines.append)
    assert figures["network"] == tiny_net and figures["games_per_worker"] == 4
    assert list(figures["runs"]) == ["1"]
    run = figures["runs"]["1"]
    assert run["workers"] == 1 and run["threads_per_worker"] >= 1
    for key in ("selfplay_evals_per_s", "raw_evals_per_s", "plies_per_s", "games_per_hour", "batch"):
        assert run[key] > 0 and math.isfinite(run[key]), key
    assert 0 < run["ratio"] <= 1.5
    assert run["ratio"] == pytest.approx(run["selfplay_evals_per_s"] / run["raw_evals_per_s"])
    # the stated basis: plies/s x 3600 / max_plies
    assert run["games_per_hour"] == pytest.approx(run["plies_per_s"] * 3600 / figures["max_plies"])
    # 4 games, a batch per round of at most their leaves: the mean batch cannot exceed 4 x MinibatchSize
    assert run["batch"] <= 4 * 256
    if run["games_finished"]:
        assert run["games_per_hour_finished"] == pytest.approx(run["plies_per_s"] * 3600 / run["mean_finished_plies"])
    else:
        assert run["mean_finished_plies"] is None and run["games_per_hour_finished"] is None
    json.dumps(figures, allow_nan=False)
    printed = capsys.readouterr().out
    assert printed.strip() == format_selfplay_report(figures) and "evals/s" in printed
    assert lines and "1 worker(s)" in lines[-1]


def test_bad_arguments_are_one_clear_error(tmp_path):
    with pytest.raises(ValueError, match="no network at"):
        bench_selfplay(print_report=False, seconds=1.0, network=str(tmp_path / "missing.onnx"))
    with pytest.raises(ValueError, match="workers"):
        bench_selfplay(print_report=False, seconds=1.0, workers=(0,))
    with pytest.raises(ValueError, match="seconds"):
        bench_selfplay(print_report=False, seconds=0.0)
    with pytest.raises(ValueError, match="device must be cpu or cuda:N"):
        bench_selfplay(print_report=False, seconds=1.0, device="gpu")


def test_a_config_plays_its_own_selfplay_settings_with_a_fresh_network_of_its_size(tmp_path):
    config = tmp_path / "small.toml"
    config.write_text('[model]\nnet = "1x8"\n[selfplay]\nvisits = 6\nfast_visits = 2\nmax_plies = 40\n'
                      'games_per_worker = 3\n')
    figures = bench_selfplay(print_report=False, seconds=1.0, workers=(1,), config=str(config), log=lambda line: None)
    assert figures["config"] == str(config) and figures["network"].endswith("fresh-1x8.onnx")
    assert (figures["visits"], figures["fast_visits"], figures["max_plies"], figures["games_per_worker"]) == (6, 2, 40, 3)
    run = figures["runs"]["1"]
    assert run["selfplay_evals_per_s"] > 0 and run["games_per_hour"] == pytest.approx(run["plies_per_s"] * 3600 / 40)


@pytest.mark.gpu
def test_the_bench_on_a_gpu_keeps_two_batches_in_flight(tiny_net):
    figures = bench_selfplay(print_report=False, seconds=2.0, network=tiny_net, workers=(1,), games=64,
                             device="cuda:0", log=lambda line: None)
    assert figures["device"] == "cuda:0" and figures["pipeline"] is True
    run = figures["runs"]["1"]
    assert run["selfplay_evals_per_s"] > 0 and 0 < run["ratio"] <= 1.5


def test_a_fresh_network_is_removed_when_the_process_that_made_it_exits(tmp_path):
    """`bench selfplay --config` exports a fresh network to a temporary folder; it must not outlive
    the command (each run used to leave 1.4 MB in the temporary folder)."""
    import os
    import subprocess
    import sys

    code = ("import os, sys; from trainer.bench_selfplay import fresh_network; "
            "from trainer.config import load_named_config; "
            "path = fresh_network(load_named_config('cpu').replace(model={'net': '1x8'})); "
            "assert os.path.isfile(path); print(path)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TMPDIR": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-2000:]
    path = done.stdout.strip().splitlines()[-1]
    assert path.startswith(str(tmp_path)) and not os.path.exists(os.path.dirname(path))
