"""What a training run learned: its ladder's Elo an hour, and its last generation's decisive matches.

Issue 54's demonstration (docs/first-hour.md): after `make train` has run for hours, this plays the
newest generation of RUN against generation 0 and against the random mover at fixed nodes from the
bundled openings, each opening with both colours (`cyzero match`, engine.tools.match), and reads the
ladder (RUN/ratings.json) for the Elo at each hour and its slope. It scores every generation on one
fixed set, the run's newest held-out positions (the learner's own validation sample at the end, never
trained on), so that the losses of generations are compared on the same positions, where the learner's
running validation figures each come from the set of their time. It also measures the newest
network's nodes/s on this machine (`cyzero bench search`), which every figure is to be read beside.

    python docs/recipes/run-report.py RUN [--games 200] [--nodes 64] [--concurrency 1] [--heldout 4096]

Prints the two match results (W/D/L, score, Elo with its 95% interval), the Elo an hour (a least-squares
line through the ladder's generations against the hours since generation 0), each generation's value
and policy cross-entropy on the held-out set, and the nodes/s.
"""
import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from engine.tools import match as m  # noqa: E402
from trainer.evaluate import exported_generations, random_mover_spec  # noqa: E402
from trainer.gating import engine_spec  # noqa: E402
from trainer.report import read_ratings  # noqa: E402


def play(engine: m.EngineSpec, opponent: m.EngineSpec, games: int, nodes: int, concurrency: int, seed: int) -> dict:
    config = m.MatchConfig(engine1=engine, engine2=opponent, games=games, time_control=m.TimeControl(nodes=nodes),
                           concurrency=concurrency, openings=m.load_openings(), openings_source=str(m.OPENINGS_PATH),
                           seed=seed, event="run-report")
    result = m.run_match(config, lambda line: print(line, file=sys.stderr, flush=True))
    scores = [g.engine1_score() for g in result.games]
    w, d, l = scores.count(1.0), scores.count(0.5), scores.count(0.0)
    stats = m.score_stats(w, l, d)
    return {"wins": w, "draws": d, "losses": l, "score": stats.score, "elo": stats.elo, "elo_low": stats.elo_low,
            "elo_high": stats.elo_high}


def heldout_losses(run: str, generations: dict, positions: int) -> dict:
    """``rows``: (generation, value cross-entropy against the game result, policy cross-entropy against
    the search's visit shares) of each generation's ONNX file on the run's newest held-out positions;
    ``policy_target_entropy``: the visit shares' own entropy, the least a policy cross-entropy can be
    (what lies above it is the policy's divergence from the search)."""
    from engine.network import Network
    from trainer.config import load_effective_config
    from trainer.loader import validation_batch
    from trainer.store import ReplayStore

    config = load_effective_config(run)
    batch = validation_batch(ReplayStore(run, config.model.input_format), config.replay, positions)
    if batch is None:
        return {}
    planes, target, wdl = batch.planes.numpy(), batch.policy.numpy(), batch.wdl.numpy()
    legal = target >= 0
    shares = np.where(target > 0, target, 1.0)
    entropy = float(-(np.where(target > 0, target * np.log(shares), 0.0)).sum(axis=1).mean())
    rows = []
    for generation in sorted(generations):
        network = Network(os.path.join(run, generations[generation]["onnx"]), backend="cpu")
        logits, predicted, _ = network.evaluate(planes)
        logits = np.where(legal, logits.astype(np.float64), -np.inf)
        logits -= logits.max(axis=1, keepdims=True)
        log_p = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
        policy_ce = -np.where(legal, target * np.where(legal, log_p, 0.0), 0.0).sum(axis=1).mean()
        value_ce = -(wdl * np.log(np.clip(predicted.astype(np.float64), 1e-9, 1.0))).sum(axis=1).mean()
        rows.append((generation, round(float(value_ce), 4), round(float(policy_ce), 4)))
    return {"positions": len(planes), "policy_target_entropy": round(entropy, 4), "rows": rows}


def elo_an_hour(ratings: dict) -> float | None:
    points = [(g["hours"], g["elo"]) for g in ratings["generations"] if g["hours"] is not None]
    if len(points) < 2:
        return None
    n = len(points)
    mx, my = sum(x for x, _ in points) / n, sum(y for _, y in points) / n
    var = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / var if var > 0 else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("--games", type=int, default=200)
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--seed", type=int, default=54)
    parser.add_argument("--heldout", type=int, default=4096, help="held-out positions every generation is scored on")
    args = parser.parse_args()
    run = str(args.run.resolve())
    generations = exported_generations(run)
    newest = max(generations)
    path = lambda g: os.path.join(run, generations[g]["onnx"])  # noqa: E731
    threads = max(1, (os.cpu_count() or 1) // args.concurrency)
    report = {"run": run, "newest": newest, "nodes": args.nodes, "games": args.games}
    report["heldout"] = heldout_losses(run, generations, args.heldout)
    report["vs_gen0"] = play(engine_spec(path(newest), threads, f"gen{newest}"), engine_spec(path(0), threads, "gen0"),
                             args.games, args.nodes, args.concurrency, args.seed)
    report["vs_random"] = play(engine_spec(path(newest), threads, f"gen{newest}"), random_mover_spec(args.seed),
                               args.games, args.nodes, args.concurrency, args.seed + 1)
    ratings = read_ratings(run)
    if ratings:
        report["elo_an_hour"] = elo_an_hour(ratings)
        report["ladder"] = [(g["generation"], round(g["hours"] or 0.0, 2), round(g["elo"])) for g in ratings["generations"]]
    cyzero = str(Path(sys.executable).with_name("cyzero"))
    bench = subprocess.run([cyzero, "bench", "search", "--net", path(newest), "--threads", "1", "--seconds", "3"],
                           cwd=REPO, capture_output=True, text=True)
    report["bench_search"] = bench.stdout.strip().splitlines()[-3:]
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
