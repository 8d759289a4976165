"""A transformer and a residual tower trained on the same Stockfish labels for the same wall-clock time,
then played against each other at equal time: issue 55's measurement (docs/training.md, "Attention
bodies").

    python docs/recipes/transformer-vs-tower.py WORK [--positions 277000] [--depth 6] [--minutes 30]
        [--games 200] [--tc 10+0.1] [--concurrency 2] [--tower-net 10x64] [--transformer teacher-bt-64x6x4h]

Each stage is skipped when its result is already in WORK, so a stopped run resumes:

1. WORK/labels: ``cyzero-train bootstrap --teacher`` (Debian's stockfish, one process a core) up to
   POSITIONS labelled positions (it resumes itself).
2. WORK/tower and WORK/transformer: each a run folder (the tower's config is teacher-6x64's with its
   net set to TOWER_NET, by default the bundled network's 10x64) whose replay store links the labels' chunks; both
   learners start at once, ``--devices cpu:1`` with one torch thread and a core each (affinity), and
   are stopped with SIGTERM after MINUTES (each writes its final checkpoint). Their metrics.jsonl hold
   the losses, training and held-out, side by side.
3. Each final checkpoint is exported to ONNX (fp32; on a CPU with AVX-512 BF16 or AMX the engine runs it
   in OpenVINO bf16), its nodes/s measured (``cyzero bench search --threads 1``), and the two play
   ``cyzero match`` at TC, one thread each, GAMES games from the bundled openings with colours reversed,
   CONCURRENCY at once (a game has one side thinking at a time, so two games keep two cores busy).

Prints one JSON object: each network's last logged losses, steps and samples/s, its nodes/s, and the
match (W/D/L from the transformer's side, the Elo difference with its 95% interval).
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
TRAIN, CYZERO = str(BIN / "cyzero-train"), str(BIN / "cyzero")


def labels(work: Path, positions: int, depth: int) -> Path:
    folder = work / "labels"
    subprocess.run([TRAIN, "bootstrap", str(folder), "--teacher", "--positions", str(positions), "--depth", str(depth),
                    "--no-progress"], check=True)
    return folder


def linked_run(source: Path, run: Path) -> None:
    """A new run folder whose replay store is the labels' (chunks hard-linked, manifest copied)."""
    chunks = run / "replay" / "chunks"
    chunks.mkdir(parents=True)
    for chunk in (source / "replay" / "chunks").iterdir():
        os.link(chunk, chunks / chunk.name)
    shutil.copy(source / "replay" / "manifest.jsonl", run / "replay" / "manifest.jsonl")


def train(work: Path, source: Path, configs: dict, minutes: float) -> None:
    """Both learners at once, a core each, for ``minutes``; a run already trained is left alone."""
    procs = {}
    cores = sorted(os.sched_getaffinity(0))
    for i, (name, config) in enumerate(configs.items()):
        run = work / name
        if (run / "trained").exists():
            continue
        if run.exists():
            shutil.rmtree(run)   # a cut-short stage starts again: equal time means one stretch each
        linked_run(source, run)
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        procs[name] = subprocess.Popen([TRAIN, "learn", str(run), "--devices", "cpu:1", "--config", config,
                                        "--steps", str(10**9), "--no-progress"], env=env,
                                       stdout=open(run / "learn.log", "w"), stderr=subprocess.STDOUT,
                                       preexec_fn=lambda core=cores[i % len(cores)]: os.sched_setaffinity(0, {core}))
    time.sleep(minutes * 60)
    for proc in procs.values():
        proc.send_signal(signal.SIGTERM)
    for name, proc in procs.items():
        if proc.wait() != 0:
            raise SystemExit(f"the {name} learner exited with {proc.returncode}: see {work / name / 'learn.log'}")
        (work / name / "trained").write_text(time.strftime("%Y-%m-%d %H:%M:%S\n"))


def exported(run: Path) -> Path:
    onnx = run / "final" / "model.onnx"
    if not onnx.exists():
        checkpoint = max((run / "checkpoints").glob("step-*.pt"))
        subprocess.run([TRAIN, "export", "--checkpoint", str(checkpoint), "--out", str(run / "final"),
                        "--variants", "fp32"], check=True, stdout=subprocess.DEVNULL)
    return onnx


def losses(run: Path) -> dict:
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    last = lines[-1]
    held = [line for line in lines if "val_total" in line]
    return {"step": last["step"], "samples_per_s": round(last.get("samples_per_s") or 0),
            "train": {k: round(last[k], 4) for k in ("loss_policy", "loss_value", "loss_total")},
            "held_out": {k: round(held[-1][k], 4) for k in ("val_policy_ce", "val_value_ce", "val_policy_top1")}
            if held else None}


def nodes_per_s(onnx: Path) -> float:
    done = subprocess.run([CYZERO, "bench", "search", "--net", str(onnx), "--threads", "1", "--json",
                           "--baseline", "none"], check=True, capture_output=True, text=True)
    return json.loads(done.stdout)["search_nodes_per_s"]


def tower_config(work: Path, net: str) -> Path:
    """teacher-6x64's config with its net replaced, so that the tower trains as the bundled one did."""
    text = (REPO / "trainer" / "configs" / "teacher-6x64.toml").read_text()
    if 'net = "6x64"' not in text:
        raise SystemExit("trainer/configs/teacher-6x64.toml no longer says net = \"6x64\": update this recipe")
    config = work / f"teacher-{net}.toml"
    config.write_text(text.replace('net = "6x64"', f'net = "{net}"'))
    return config


def match(transformer: Path, tower: Path, games: int, tc: str, concurrency: int, out: Path) -> dict:
    if not out.exists():
        command = [CYZERO, "match", "--tc", tc, "--games", str(games), "--concurrency", str(concurrency),
                   "--pgn", str(out.with_suffix(".pgn")), "--json", "--engine2", CYZERO]
        for side, name, net in (("engine1", "transformer", transformer), ("engine2", "tower", tower)):
            command += [f"--{side}-name", name, f"--{side}-option", f"WeightsFile={net}",
                        f"--{side}-option", "Threads=1"]
        done = subprocess.run(command, check=True, capture_output=True, text=True)
        out.write_text(done.stdout)
    result = json.loads(out.read_text())
    keys = ("games", "wins", "draws", "losses", "score", "elo", "elo_ci95", "pentanomial", "time_control",
            "total_seconds")
    return {key: result[key] for key in keys} | {f"{side}_forfeits": result[side]["time_forfeits"]
                                                  for side in ("engine1", "engine2")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("work", type=Path)
    parser.add_argument("--positions", type=int, default=277000)
    parser.add_argument("--depth", type=int, default=6)
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--games", type=int, default=200)
    parser.add_argument("--tc", default="10+0.1")
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--tower-net", default="10x64")
    parser.add_argument("--transformer", default="teacher-bt-64x6x4h")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    source = labels(args.work, args.positions, args.depth)
    tower = tower_config(args.work, args.tower_net)
    train(args.work, source, {"tower": str(tower), "transformer": args.transformer}, args.minutes)
    report = {name: {**losses(args.work / name), "nodes_per_s": nodes_per_s(exported(args.work / name))}
              for name in ("tower", "transformer")}
    report["match"] = match(exported(args.work / "transformer"), exported(args.work / "tower"), args.games, args.tc,
                            args.concurrency, args.work / "match.json")
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
