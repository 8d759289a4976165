"""The learner beside self-play: its samples/s under the daemon for each way of sharing the cores.

Issue 54's table (docs/training.md, "The daemon", its paragraph on the cores). Each setting is a
fresh run of `cyzero-train run` with a config (default the bundled `cpu`) on a copy of a replay
store big enough that the sampling cap never binds (STORE: a run folder with a replay/ of some
hundred thousand positions, e.g. one made by `cyzero-train bootstrap`), stopped after SECONDS. The
learner's figure is the median samples/s of its metrics.jsonl lines after the first, self-play's
the worker's last positions/s lines. The baseline is `cyzero-train bench train --run` on the same
store (the learner alone, its own threads).

    python docs/recipes/learner-share.py STORE [--seconds 200] [--config cpu] \
        [--out /tmp/learner-share]

Run it on a quiet machine: every setting takes both cores, and anything else running moves them.
"""
import argparse
import json
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TRAIN = [str(Path(sys.executable).with_name("cyzero-train"))]

#: (name, extra `cyzero-train run` options, [daemon] keys added to the config)
SETTINGS = [
    ("learner alone (--workers-per-device 0)", ["--workers-per-device", "0"], {}),
    ("shared, workers at nice 10 (the default)", [], {}),
    ("shared, workers at nice 19", [], {"worker_nice": 19}),
    ("learner_cores = 1", [], {"learner_cores": 1}),
    ("torch's and the runtime's own threads", [], {"worker_nice": 0, "learner_threads": 0}),
    ("self-play alone (--learner-devices none)", ["--learner-devices", "none"], {}),
]


def run_setting(store: Path, out: Path, name: str, options: list, daemon: dict, config: str, seconds: float) -> dict:
    run = out / re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    shutil.rmtree(run, ignore_errors=True)
    (run / "replay").mkdir(parents=True)
    for part in ("chunks", "manifest.jsonl"):
        source = store / "replay" / part
        (shutil.copytree if source.is_dir() else shutil.copy)(source, run / "replay" / part)
    base = (REPO / "trainer" / "configs" / f"{config}.toml").read_text() if "/" not in config else Path(config).read_text()
    extra = "".join(f"{key} = {json.dumps(value)}\n" for key, value in daemon.items())
    config_path = run / "share.toml"
    config_path.write_text(base.replace("[daemon]\n", "[daemon]\n" + extra) + "\n[ladder]\nenabled = false\n")
    proc = subprocess.Popen(TRAIN + ["run", str(run), "--config", str(config_path), *options], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(seconds)
    proc.send_signal(signal.SIGINT)
    proc.wait(120)
    rates = [json.loads(line).get("samples_per_s") for line in open(run / "metrics.jsonl")] \
        if (run / "metrics.jsonl").exists() else []
    rates = [r for r in rates if r]
    worker_log = run / "logs" / "worker-cpu-0.log"
    played = [float(m.group(1)) for m in re.finditer(r"([0-9.]+) positions/s", worker_log.read_text())] \
        if worker_log.exists() else []
    return {"setting": name, "run": str(run), "learner": statistics.median(rates[1:]) if len(rates) > 1 else None,
            "selfplay": played[-3:]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("store", type=Path)
    parser.add_argument("--seconds", type=float, default=200.0)
    parser.add_argument("--config", default="cpu")
    parser.add_argument("--out", type=Path, default=Path("/tmp/learner-share"))
    args = parser.parse_args()
    rows = [run_setting(args.store, args.out, name, options, daemon, args.config, args.seconds)
            for name, options, daemon in SETTINGS]
    bench = subprocess.run(TRAIN + ["bench", "train", "--run", rows[0]["run"], "--json"], cwd=REPO,
                           capture_output=True, text=True)
    baseline = json.loads(bench.stdout)["learner_1_rank_samples_per_s"]
    print(f"bench train --run: {baseline:,.0f} samples/s")
    print("| share | learner samples/s | of bench | self-play positions/s (last lines) |")
    print("|---|---:|---:|---|")
    for row in rows:
        learner = row["learner"]
        print(f"| {row['setting']} | {learner:,.0f} | {learner / baseline:.0%} | {row['selfplay']} |" if learner
              else f"| {row['setting']} | none | | {row['selfplay']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
