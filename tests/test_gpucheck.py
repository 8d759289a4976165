"""trainer/gpucheck.py: the summary table of `make gpu-check`, fed sample JSON (CPU only)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from trainer import gpucheck

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Shaped as the benches write them (keys as in a CPU run of each), with GPU-like figures.
NN = {"benchmark": "nn", "provider": "CUDAExecutionProvider", "batches": [256, 2048],
      "variants": {"fp32": {"positions_per_second": {"256": 61000.0, "2048": 98000.0}, "best_batch": 2048,
                            "best_positions_per_second": 98000.0},
                   "fp16": {"positions_per_second": {"256": 86442.0, "2048": 157081.0}, "best_batch": 2048,
                            "best_positions_per_second": 157081.0}}}
SEARCH = {"benchmark": "search", "efficiency": 0.93, "search_nodes_per_s": 53000.0, "raw_positions_per_s": 57000.0,
          "short_movetime": {"movetime_ms": 200, "ratio": 0.41}, "provider": "CUDAExecutionProvider",
          "modes": {"two batches": {"efficiency": 0.93, "search_nodes_per_s": 53000.0},
                    "two threads": {"efficiency": 0.95, "search_nodes_per_s": 54000.0}}}
SELFPLAY = {"device": "cuda:0", "config": None, "efficiency": 0.88, "runs": {
    "1": {"ratio": 0.87, "selfplay_evals_per_s": 50000.0, "raw_evals_per_s": 57500.0, "games_per_hour": 900.0,
          "games_finished": 40, "games_per_hour_finished": 4100.0},
    "2": {"ratio": 0.86, "selfplay_evals_per_s": 61000.0, "raw_evals_per_s": 71000.0, "games_per_hour": 1100.0,
          "games_finished": 55, "games_per_hour_finished": 5200.0}}}
TRAIN = {"device": "NVIDIA H100 80GB HBM3", "net": "6x64", "batch_size": 256, "raw_samples_per_s": 10353.0, "learner_1_rank_samples_per_s": 8713.0,
         "learner_1_rank_over_raw": 0.8416, "loader_samples_per_s": 108000.0, "loader_over_learner": 12.4}
JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" errors="0" failures="1"
skipped="2" tests="9" time="12.0"></testsuite></testsuites>"""


def write(folder, name: str, data) -> None:
    (folder / name).write_text(data if isinstance(data, str) else json.dumps(data))


@pytest.fixture
def results(tmp_path):
    write(tmp_path, "nn.json", NN)
    write(tmp_path, "search.json", SEARCH)
    write(tmp_path, "selfplay.json", SELFPLAY)
    write(tmp_path, "selfplay-gpu.json", dict(SELFPLAY, config="gpu"))
    write(tmp_path, "train.json", TRAIN)
    write(tmp_path, "train-bt.json", dict(TRAIN, net="bt-256x10x8h", batch_size=1024, learner_1_rank_over_raw=0.95))
    write(tmp_path, gpucheck.TESTS_FILE, JUNIT)
    return tmp_path


def find(rows, bench: str, figure: str) -> gpucheck.Row:
    matches = [r for r in rows if r.bench == bench and r.figure == figure]
    assert len(matches) == 1, (bench, figure, rows)
    return matches[0]


def test_every_headline_figure_beside_its_target(results):
    rows = gpucheck.rows(str(results))
    assert find(rows, "gpu tests", "pytest -m gpu") == gpucheck.Row(
        "gpu tests", "pytest -m gpu", "6 passed, 1 failed, 2 skipped", "all pass", "FAILED")
    assert find(rows, "bench nn", "provider").verdict == "ok"
    assert find(rows, "bench nn", "fp16: best positions/s").value == "157,081 at batch 2048"
    efficiency = find(rows, "bench search", "efficiency (search / raw)")
    assert (efficiency.value, efficiency.target, efficiency.verdict) == ("93.0%", ">= 90%", "ok")
    assert find(rows, "bench search", "search nodes/s").value == "53,000"
    assert find(rows, "bench search", "raw positions/s").value == "57,000"
    movetime = find(rows, "bench search", "go movetime 200: nodes / raw capacity")
    assert (movetime.value, movetime.verdict) == ("41.0%", "BELOW")
    assert find(rows, "bench search", "two threads: search / raw").value == "95.0% at 54,000 nodes/s"
    for bench in ("bench selfplay", "bench selfplay --config gpu"):
        assert find(rows, bench, "efficiency (self-play / raw)").verdict == "ok"
        assert find(rows, bench, "2 workers: self-play / raw").value == "86.0%"
        assert find(rows, bench, "1 worker: self-play evals/s").value == "50,000 (raw 57,500)"
        assert find(rows, bench, "2 workers: games/hour, finished").value == "5,200; lower bound 1,100"
    best = find(rows, "bench selfplay", "games/hour finished, best run")
    assert (best.value, best.verdict) == ("5,200", "ok")
    # The 5,000 games/hour target is the bundled 6x64's; --config gpu is judged by its ratio.
    assert not [r for r in rows if r.bench == "bench selfplay --config gpu" and r.figure.startswith("games/hour f")]
    learner = find(rows, "bench train", "learner / raw step")
    assert (learner.value, learner.verdict) == ("84.2%", "BELOW")
    assert find(rows, "bench train", "learner samples/s").value == "8,713 (raw 10,353)"
    assert find(rows, "bench train", "loader / learner").value == "12.4x"
    assert find(rows, "bench train", "network, batch").value == "6x64, 256"
    assert find(rows, "bench train --config gpu-bt", "network, batch").value == "bt-256x10x8h, 1024"
    assert find(rows, "bench train --config gpu-bt", "learner / raw step").verdict == "ok"
    text = gpucheck.summary(str(results))
    assert text.splitlines()[0] == f"gpu-check summary of {results}"
    assert "157,081 at batch 2048" in text and "BELOW" in text


def test_missing_files_and_keys_read_n_a_with_the_reason(results):
    (results / "train.json").unlink()
    write(results, "search.json", "{not json")
    write(results, "nn.json", "")
    selfplay = json.loads(json.dumps(SELFPLAY))
    del selfplay["efficiency"], selfplay["runs"]["1"]["ratio"]
    selfplay["runs"]["2"]["games_per_hour_finished"] = None
    selfplay["runs"]["1"]["games_per_hour_finished"] = None
    write(results, "selfplay.json", selfplay)
    write(results, "selfplay-gpu.json", {"device": "cpu"})
    (results / gpucheck.TESTS_FILE).unlink()
    rows = gpucheck.rows(str(results))
    assert find(rows, "bench train", "(all figures)").value.startswith("n/a (no train.json")
    assert "not JSON" in find(rows, "bench search", "(all figures)").value
    assert "nn.json is empty" in find(rows, "bench nn", "(all figures)").value
    efficiency = find(rows, "bench selfplay", "efficiency (self-play / raw)")
    assert efficiency == gpucheck.Row("bench selfplay", "efficiency (self-play / raw)",
                                      "n/a (no key efficiency in selfplay.json)", ">= 85%", "n/a")
    assert find(rows, "bench selfplay", "1 worker: self-play / raw").value == (
        "n/a (no key runs.1.ratio in selfplay.json)")
    assert find(rows, "bench selfplay", "2 workers: self-play / raw").verdict == "ok"
    assert find(rows, "bench selfplay", "2 workers: games/hour, finished").value == (
        "n/a (no game finished); lower bound 1,100")
    assert find(rows, "bench selfplay", "games/hour finished, best run").verdict == "n/a"
    assert find(rows, "bench selfplay --config gpu", "device").verdict == "NOT GPU"
    assert "no key runs" in find(rows, "bench selfplay --config gpu", "runs").value
    assert find(rows, "gpu tests", "pytest -m gpu").verdict == "n/a"
    gpucheck.summary(str(results))  # every row prints


def test_an_empty_folder_still_prints_a_table(tmp_path, capsys):
    assert gpucheck.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.count("n/a (no ") == len(gpucheck.BENCHES) + 1
    assert gpucheck.main([str(tmp_path / "absent")]) == 2


def test_preflight_fails_fast_and_says_why_without_a_usable_gpu():
    """CUDA_VISIBLE_DEVICES="" hides any GPU, so this holds on a GPU machine too."""
    done = subprocess.run([sys.executable, "-m", "trainer.gpucheck", "--preflight"], cwd=REPO,
                          env=dict(os.environ, CUDA_VISIBLE_DEVICES=""), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    lines = done.stderr.splitlines()
    assert lines[0].startswith("gpu-check: no CUDA provider usable: ")
    assert lines[-1] == "gpu-check: this machine cannot run the GPU check; docs/gpu.md says what it needs"
