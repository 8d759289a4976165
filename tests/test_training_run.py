"""`cyzero-train run` end to end: the real daemon, a self-play worker, a two-rank gloo learner and
a UCI engine that follows the run, with the faults a long run meets (a worker and the learner
SIGKILLed, the daemon stopped and started again).

The worker plays on ``cuda:0`` through the GPU stand-in (``--simulate-gpu``): the GPU path of a
run (one session per fixed batch size, the device split that ``status`` shows) is checked in
the same run as the faults, rather than in a second run of its own. The
CPU worker's path under the daemon is ``tests/test_commands.py::test_run_and_a_worker``.

Tiny everything (a 1x8 network, 4 visits, 24-ply games) so that generations come every few
seconds on a loaded 2-core machine.
"""

from __future__ import annotations

import collections
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from test_uci_harness import REPO, UciEngine
from tiny_configs import tiny_config
from trainer.atomic import read_jsonl

pytestmark = pytest.mark.timeout(300)

CONFIG = tiny_config(
    optimizer={"warmup_steps": 2},
    train={"checkpoint_every": 8, "keep_checkpoints": 2, "dist_timeout_s": 60.0, "starved_poll_s": 0.5},
    replay={"val_percent": 0.0, "workers": 0, "validation_positions": 0, "max_samples_per_position": 0.5},
    log={"interval": 3},
    selfplay={"visits": 4, "fast_visits": 2, "full_search_prob": 0.5, "max_plies": 24, "games_per_worker": 4},
    daemon={"endpoint": "tcp://127.0.0.1:*", "publish": "tcp://127.0.0.1:*", "fetch": "tcp://127.0.0.1:*",
            "workers_per_device": 1, "learner_devices": "cpu:2", "worker_threads": 1, "flush_s": 0.3,
            "restart_backoff_s": 0.5},
    ladder={"nodes": 2, "games": 2, "stockfish": "", "window": 10000.0},
)


def wait_for(predicate, what: str, timeout: float = 120.0, daemon=None, run: str | None = None):
    """Polls `predicate` until it is truthy; a failure carries the tails of the run's logs (`run`),
    so that a CI failure says what the daemon, learner and workers were doing."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if daemon is not None and daemon.poll() is not None:
            raise AssertionError(f"the daemon exited with {daemon.returncode} while waiting for {what}"
                                 + log_tails(run))
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}" + log_tails(run))
        time.sleep(0.2)


def log_tails(run: str | None, chars: int = 2500) -> str:
    if run is None:
        return ""
    logs = os.path.join(run, "logs")
    text = ""
    for name in sorted(os.listdir(logs)) if os.path.isdir(logs) else []:
        with open(os.path.join(logs, name), errors="replace") as f:
            text += f"\n--- {name} (last {chars} chars) ---\n" + f.read()[-chars:]
    return text


def read_json(path: str):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def start_daemon(run: str, log_path: str, config: str | None = None, *args: str) -> subprocess.Popen:
    command = [sys.executable, "-m", "trainer.cli", "run", run, *args] + (["--config", config] if config else [])
    with open(log_path, "ab") as log:
        return subprocess.Popen(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)


def stop_daemon(daemon: subprocess.Popen, log_path: str) -> None:
    daemon.send_signal(signal.SIGTERM)
    try:
        code = daemon.wait(90)
    except subprocess.TimeoutExpired:
        daemon.kill()
        raise AssertionError("the daemon did not stop within 90 s of SIGTERM:\n" + open(log_path).read()[-3000:])
    assert code == 0, open(log_path).read()[-3000:]


#: The self-play worker on cuda:0, run on the GPU stand-in (no GPU needed).
SIMULATED_GPU = ("--devices", "cuda:0", "--workers-per-device", "1", "--simulate-gpu")


def published(run: str) -> list[int]:
    return [r["generation"] for r in read_jsonl(os.path.join(run, "published.jsonl"))]


def played_generations(run: str) -> set[int]:
    """The generations the self-play chunks in the store were played with."""
    return {line["generation"] for line in read_jsonl(os.path.join(run, "replay", "manifest.jsonl"))
            if line.get("op") == "add" and line.get("source") == "selfplay"}


def stored_game_ids(run: str) -> list[str]:
    ids: list[str] = []
    for line in read_jsonl(os.path.join(run, "replay", "manifest.jsonl")):
        if line.get("op") == "add" and line.get("source") == "selfplay":
            ids += line.get("game_ids", [])
    return ids


def test_a_run_plays_learns_publishes_and_survives_its_faults(tmp_path):
    run = str(tmp_path / "run")
    os.makedirs(run)
    config = str(tmp_path / "tiny.toml")
    with open(config, "w") as f:
        f.write(CONFIG)
    log_path = str(tmp_path / "daemon.log")
    daemon = start_daemon(run, log_path, config, *SIMULATED_GPU)
    engine = None
    try:
        info = wait_for(lambda: read_json(os.path.join(run, "daemon.json")), "daemon.json", daemon=daemon, run=run)
        engine = UciEngine()
        engine.setoption("TrainerEndpoint", info["publish"])

        # The engine keeps answering `go` while it swaps to each new generation.
        swaps: list[int] = []
        deadline = time.monotonic() + 150
        while len(set(swaps)) < 3:
            assert time.monotonic() < deadline, f"swapped to {swaps} only; daemon log:\n{open(log_path).read()[-3000:]}"
            assert daemon.poll() is None, open(log_path).read()[-3000:]
            lines, best = engine.go("nodes 16")
            assert best.startswith("bestmove ") and best.split()[1] != "0000"
            for line in lines:
                found = re.search(r"switched to network .*generation (\d+)", line)
                if found:
                    swaps.append(int(found.group(1)))
            time.sleep(0.2)  # leave the cores to the run between searches
        assert swaps == sorted(swaps) and len(set(swaps)) >= 3  # generation 0 and at least two trained ones
        assert set(swaps) <= set(published(run))

        # The ladder rates generations beside the run: generation 0 and a trained one on the scale.
        def rated():
            ratings = read_json(os.path.join(run, "ratings.json")) or {"generations": []}
            return len([g for g in ratings["generations"] if g["generation"] >= 1]) >= 1 and \
                ratings["generations"][0]["generation"] == 0

        wait_for(rated, "ratings.json with generation 0 and a trained generation", daemon=daemon, run=run)
        assert "ladder" in read_json(os.path.join(run, "workers.json"))

        # The worker plays on the simulated cuda:0 at fixed sizes; status shows how cuda:0 is used.
        wait_for(lambda: max(played_generations(run), default=0) >= 1,
                 "games of a trained generation from the cuda:0 worker in the store", daemon=daemon, run=run)
        split = read_json(os.path.join(run, "workers.json"))["devices"]
        assert split["cuda:0"] == {"selfplay_workers": 1, "games_per_worker": 4, "network_max_batch": 256,
                                   "learner_ranks": 0}, split
        assert split["cpu"]["learner_ranks"] == 2, split
        status = subprocess.run([sys.executable, "-m", "trainer.cli", "status", run], cwd=REPO,
                                capture_output=True, text=True, timeout=60)
        assert "cuda:0      1 self-play worker (4 games, network batches up to 256)" in status.stdout, status.stdout
        worker_log = open(os.path.join(run, "logs", "worker-cuda0-0.log")).read()
        assert "CUDA" in worker_log and "batch 1/2/4/8/16/32/64/128/256" in worker_log, worker_log[-2000:]

        # SIGKILL a worker mid-game: the daemon restarts it, and no game is stored twice.
        workers = read_json(os.path.join(run, "workers.json"))
        victim = next(w for w in workers["workers"] if w["local"] and w["alive"])
        os.kill(victim["pid"], signal.SIGKILL)

        def restarted():
            now = read_json(os.path.join(run, "workers.json")) or {"workers": []}
            row = next((w for w in now["workers"] if w["id"] == victim["id"]), None)
            return row is not None and row["restarts"] >= 1 and row["alive"] and row["pid"] != victim["pid"]

        wait_for(restarted, f"worker {victim['id']} restarted", daemon=daemon, run=run)

        # SIGKILL the learner: it is restarted and resumes at its last checkpoint.
        learner = wait_for(lambda: (read_json(os.path.join(run, "workers.json")) or {}).get("learner"),
                           "the learner in workers.json", daemon=daemon, run=run)
        assert learner["alive"] and learner["restarts"] == 0
        os.kill(learner["pid"], signal.SIGKILL)
        learner_log = os.path.join(run, "logs", "learner.log")
        def starts():  # at step 0 (no checkpoint after generation 0 yet) the learner says it starts anew
            text = open(learner_log).read()
            return text.count("resuming at step") + text.count("starting at step 0")

        before_kill = starts()
        wait_for(lambda: starts() > before_kill, "the learner resuming",
                 daemon=daemon, run=run)
        before = max(published(run))
        wait_for(lambda: max(published(run)) > before, "a generation after the learner's restart",
                 daemon=daemon, run=run)
        stop_daemon(daemon, log_path)

        ids = stored_game_ids(run)
        assert ids and len(ids) == len(set(ids)), collections.Counter(ids).most_common(3)
        generations = {g["generation"]: g for g in read_jsonl(os.path.join(run, "generations.jsonl"))}
        # Every self-play chunk names a generation the run had published when it was played.
        played = played_generations(run)
        assert played <= set(generations) and len(played) >= 2

        # Started again on the same directory, the run goes on where it stopped.
        last = max(generations)  # the final checkpoint's generation may not have been published yet
        # (a temp file the SIGKILLed learner left mid-write is not a checkpoint)
        checkpoint_steps = sorted(int(n[5:-3]) for n in os.listdir(os.path.join(run, "checkpoints"))
                                  if re.fullmatch(r"step-\d+\.pt", n))
        daemon = start_daemon(run, log_path, None, *SIMULATED_GPU)
        wait_for(lambda: max(published(run)) > last, "a new generation after the restart", daemon=daemon, run=run)
        text = open(learner_log).read()
        assert f"resuming at step {checkpoint_steps[-1]:,}" in text
        stop_daemon(daemon, log_path)
        ids = stored_game_ids(run)
        assert len(ids) == len(set(ids))
        daemon_log = open(os.path.join(run, "logs", "daemon.log")).read()
        assert daemon_log.count("serving run:") == 2 and "published generation 1 " in daemon_log
        assert sorted(published(run)) == published(run) and len(set(published(run))) == len(published(run))
    finally:
        if engine is not None:
            engine.close(check=True)
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()


@pytest.mark.gpu
def test_a_run_on_the_gpu_plays_on_cuda_and_learns_with_nccl(tmp_path):
    """Self-play workers on cuda:0 (ONNX Runtime's GPU providers) and the learner on cuda:0 (nccl
    is used with more than one device; one device trains without a process group)."""
    run = str(tmp_path / "run")
    os.makedirs(run)
    config = str(tmp_path / "tiny.toml")
    with open(config, "w") as f:
        f.write(CONFIG.replace("games_per_worker = 4", "games_per_worker = 64"))
    log_path = str(tmp_path / "daemon.log")
    daemon = start_daemon(run, log_path, config, "--devices", "cuda:0", "--workers-per-device", "1",
                          "--learner-devices", "cuda:0")
    try:
        wait_for(lambda: published(run) and max(published(run)) >= 2, "two trained generations", daemon=daemon, run=run)
        workers = read_json(os.path.join(run, "workers.json"))
        assert any(w["devices"] == ["cuda:0"] and w["games"] > 0 for w in workers["workers"]), workers
        stop_daemon(daemon, log_path)
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()
