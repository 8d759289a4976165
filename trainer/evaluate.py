"""``cyzero-train evaluate RUN [--follow]``: the strength ladder. Is the loop learning, and how fast?

Gating (``trainer.gating``) compares a candidate with the current best only, so it cannot show
progress over a whole run. The ladder rates the run's generations on one scale, as KataGo's and
lc0's training runs publish theirs: each generation plays matches (``ladder.games`` games, each
opening with both colours, at ``go nodes ladder.nodes``) against

* its predecessor on the ladder (the newest rated generation before it), always;
* the fixed anchors rated within ``ladder.window`` Elo of it: the random mover
  (:mod:`engine.tools.random_mover`), generation 0, and Debian's Stockfish at each
  ``ladder.stockfish_levels`` Skill Level (``ladder.stockfish_nodes`` nodes a move; the lowest
  unrated level is tried once a generation comes within half a window of the strongest one
  rated, or when none is rated yet).

Every match is one line of ``RUN/evaluation.jsonl`` (appended, fsynced)::

    {"generation", "opponent": "random" | "genK" | "sf-skillL", "wins", "draws", "losses", "games",
     "score", "elo", "elo_error", "nodes", "time"}

from the generation's side (``elo``: that match alone, null at a score of 0 or 1). After each
match every player's rating is fitted again over all matches at the ladder's node count
(:func:`fit_ratings`: Elo's logistic model by maximum likelihood, the random mover fixed at 0,
one virtual draw a pairing so that a clean sweep stays finite; the 95% intervals from the
likelihood's curvature), and ``RUN/ratings.json`` is rewritten atomically: each player's Elo and
interval, and each generation's with the hours since generation 0 and the self-play games
played before it. ``status`` reads it, ``plot`` draws it as ``elo.png``, TensorBoard gets it.

Anchored at the random mover, two runs' curves lie on one scale (at the same node count).
Resumable: a pairing already in the file is not played again; a match cut short writes nothing.
``--follow`` (the daemon's ``ladder`` child) rates the newest unrated generation, again and again,
skipping those it has no time for; by hand, every K-th generation and the newest.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import re
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, Optional

from engine.tools import elo
from engine.tools import match as m
from trainer.atomic import append_jsonl, atomic_write_text, read_jsonl
from trainer.config import LadderConfig, ladder_levels
from trainer.devices import usable_cores
from trainer.gating import engine_spec
# torch-free, as status is: evaluating plays the engine and trains nothing
from trainer.rundir import (
    EVALUATION_FILE, EVALUATION_LOCK, GENERATIONS_FILE, RATINGS_FILE, TENSORBOARD_DIR, read_evaluations, read_manifest,
    run_lock,
)

__all__ = ["ANCHOR", "evaluate_run", "fit_ratings", "generations_to_evaluate", "random_mover_spec",
           "exported_generations"]

ANCHOR = "random"          # the player fixed at Elo 0
PRIOR_DRAWS = 1.0          # virtual draws added to each pairing played: a 20-0 stays a finite rating
FOLLOW_POLL_S = 10.0       # --follow looks for a new generation this often


def random_mover_spec(seed: int) -> m.EngineSpec:
    """The random mover as a match engine (this Python, so it runs in the same environment)."""
    return m.EngineSpec([sys.executable, "-m", "engine.tools.random_mover", "--seed", str(seed)], name="random")


def stockfish_spec(command: str, level: int, nodes: int) -> m.EngineSpec:
    """Stockfish at Skill Level ``level``, one thread, ``nodes`` a move (its own limit)."""
    argv = m.parse_command(command)
    return m.EngineSpec(argv, [("Skill Level", str(level)), ("Threads", "1"), ("Hash", "16")],
                        name=f"sf-skill{level}", nodes=nodes)


def _int(value: Any) -> Optional[int]:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _number(value: Any) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return value + 0.0  # a float, never -0.0


def exported_generations(run_dir: str) -> dict[int, dict]:
    """Every exported generation whose network file is still there (retention may remove old ones):
    generation -> its generations.jsonl record (the last one written for it)."""
    found: dict[int, dict] = {}
    for record in read_jsonl(os.path.join(run_dir, GENERATIONS_FILE)):
        generation, onnx = _int(record.get("generation")), record.get("onnx")
        if generation is not None and generation >= 0 and isinstance(onnx, str):
            if os.path.isfile(os.path.join(run_dir, onnx)):
                found[generation] = record
    return found


def generations_to_evaluate(run_dir: str | os.PathLike, every: int = 1) -> list[tuple[int, str]]:
    """``(generation, onnx path)`` of every ``every``-th generation and the newest, oldest first."""
    if every < 1:
        raise ValueError(f"--every must be 1 or more, got {every}")
    run_dir = os.fspath(run_dir)
    found = exported_generations(run_dir)
    if not found:
        return []
    newest = max(found)
    return [(g, os.path.join(run_dir, found[g]["onnx"])) for g in sorted(found) if g % every == 0 or g == newest]


# --------------------------------------------------------------------------- ratings


def fit_ratings(results: Iterable[dict], anchor: str = ANCHOR, prior_draws: float = PRIOR_DRAWS) -> dict[str, dict]:
    """Elo ratings of every player in ``results`` (lines with ``generation``, ``opponent``, ``wins``,
    ``draws``, ``losses``): name -> ``{"elo", "low", "high", "games"}`` (95% interval).

    Fitted by :func:`engine.tools.elo.logistic_ratings` (logistic Elo, ``anchor`` fixed at 0,
    ``prior_draws`` virtual draws a pairing). A player with no path of games to the anchor is left out."""
    pairs: dict[tuple[str, str], list[float]] = {}
    for r in results:
        a, b = f"gen{r['generation']}", r["opponent"]
        if a == b:
            continue
        key = (a, b) if a < b else (b, a)
        n = r["wins"] + r["draws"] + r["losses"]
        points = r["wins"] + 0.5 * r["draws"]
        entry = pairs.setdefault(key, [0.0, 0.0])
        entry[0] += n
        entry[1] += points if key[0] == a else n - points
    ratings = elo.logistic_ratings(pairs, anchor, prior_draws)
    if not ratings:
        return {anchor: {"elo": 0.0, "low": 0.0, "high": 0.0, "games": 0}} if any(anchor in k for k in pairs) else {}
    games: dict[str, int] = {}
    for (a, b), (n, _) in pairs.items():
        for name in (a, b):
            games[name] = games.get(name, 0) + int(n)
    out = {anchor: {"elo": 0.0, "low": 0.0, "high": 0.0, "games": games.get(anchor, 0)}}
    for name, (rating, error) in ratings.items():
        out[name] = {"elo": rating, "low": rating - error, "high": rating + error, "games": games.get(name, 0)}
    return out


def _selfplay_games_before(run_dir: str) -> Callable[[int], int]:
    """generation -> the self-play games played by the generations before it (the manifest's)."""
    per_generation: dict[int, int] = {}
    for chunk in read_manifest(run_dir):
        if chunk.source == "selfplay":
            per_generation[chunk.generation] = per_generation.get(chunk.generation, 0) + chunk.games
    return lambda g: sum(n for gen, n in per_generation.items() if gen < g)


def write_ratings(run_dir: str, nodes: int, log: Callable[[str], Any] = lambda line: None) -> dict:
    """Fit every match at ``nodes`` and write ``RUN/ratings.json`` (see the module); returns it."""
    rows = [r for r in read_evaluations(run_dir) if r["nodes"] == nodes]
    fitted = fit_ratings(rows)
    generations = exported_generations(run_dir)
    start = _number(generations.get(0, {}).get("time"))
    before = _selfplay_games_before(run_dir)
    curve = []
    for name, rating in fitted.items():
        match = re.fullmatch(r"gen(\d+)", name)
        if match is None:
            continue
        g = int(match.group(1))
        when = _number(generations.get(g, {}).get("time"))
        curve.append({"generation": g, **rating,
                      "hours": None if when is None or start is None else max(0.0, when - start) / 3600.0,
                      "selfplay_games": before(g)})
    report = {"anchor": ANCHOR, "nodes": nodes, "time": time.time(), "players": fitted,
              "generations": sorted(curve, key=lambda c: c["generation"])}
    atomic_write_text(os.path.join(run_dir, RATINGS_FILE), json.dumps(report, indent=1) + "\n")
    _tensorboard(run_dir, report, log)
    return report


def _tensorboard(run_dir: str, report: dict, log: Callable[[str], Any]) -> None:
    """The ladder's newest generation in TensorBoard (RUN/tensorboard/ladder), when torch has it:
    ``ladder/elo`` by generation, ``ladder/elo_by_selfplay_games`` by games played before it."""
    if not report["generations"]:
        return
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        return  # an engine-only install: ratings.json and elo.png still have it
    newest = report["generations"][-1]
    try:
        with contextlib.closing(SummaryWriter(os.path.join(run_dir, TENSORBOARD_DIR, "ladder"))) as writer:
            writer.add_scalar("ladder/elo", newest["elo"], newest["generation"])
            writer.add_scalar("ladder/elo_by_selfplay_games", newest["elo"], newest["selfplay_games"])
    except OSError as e:
        log(f"evaluate: TensorBoard not written: {e}")


# --------------------------------------------------------------------------- matches


def _play(engine: m.EngineSpec, opponent: m.EngineSpec, *, games: int, nodes: int, concurrency: int,
          seed: int, log: Callable[[str], Any], stop: Optional[threading.Event] = None) -> list[int]:
    """One match; ``[wins, draws, losses]`` from ``engine``'s side."""
    config = m.MatchConfig(
        engine1=engine, engine2=opponent, games=games, time_control=m.TimeControl(nodes=nodes),
        concurrency=concurrency, openings=m.load_openings(), openings_source=str(m.OPENINGS_PATH),
        seed=seed, event="cyzero-train evaluate",
        should_stop=None if stop is None else stop.is_set)
    quiet = m.QuietInfoLines()
    logger = logging.getLogger("chess.engine")
    logger.addFilter(quiet)
    try:
        result = m.run_match(config, log)
    except m.MatchInterrupted:
        raise KeyboardInterrupt from None  # a match cut short is not a result: nothing is written
    finally:
        logger.removeFilter(quiet)
    if stop is not None and stop.is_set():
        raise KeyboardInterrupt
    scores = [g.engine1_score() for g in result.games]
    return [scores.count(1.0), scores.count(0.5), scores.count(0.0)]


def _line(generation: int, opponent: str, wdl: list[int], nodes: int) -> dict:
    w, d, l = wdl
    stats = elo.score_stats(w, l, d)
    low, high = _number(stats.elo_low), _number(stats.elo_high)
    return {"generation": generation, "opponent": opponent, "wins": w, "draws": d, "losses": l,
            "games": w + d + l, "score": stats.score, "elo": _number(stats.elo),
            "elo_error": None if low is None or high is None else (high - low) / 2.0,
            "nodes": nodes, "time": time.time()}


def choose_opponents(generation: int, rated: dict[str, dict], played: set[str], available: set[int],
                     cfg: LadderConfig) -> list[str]:
    """The ladder's opponents for ``generation`` (see the module), given the current ``rated`` fit, the
    opponents it has ``played`` already and the generations whose networks are ``available``."""
    earlier = [g for g in sorted(available) if g < generation and f"gen{g}" in rated]
    predecessor = f"gen{earlier[-1]}" if earlier else None
    estimate = rated[predecessor]["elo"] if predecessor else 0.0
    chosen = [predecessor] if predecessor else []
    anchors = [ANCHOR] + (["gen0"] if generation != 0 and 0 in available else [])
    for name in anchors:
        if name not in chosen and (name not in rated or abs(rated[name]["elo"] - estimate) <= cfg.window):
            chosen.append(name)
    if cfg.stockfish.strip():
        levels = [f"sf-skill{level}" for level in ladder_levels(cfg.stockfish_levels)]
        known = [name for name in levels if name in rated]
        chosen += [name for name in known if abs(rated[name]["elo"] - estimate) <= cfg.window]
        unknown = [name for name in levels if name not in rated]
        if unknown and (not known or rated[known[-1]]["elo"] - estimate <= cfg.window / 2):
            chosen.append(unknown[0])
    return [name for name in chosen if name not in played]


def _spec(name: str, run_dir: str, generations: dict[int, dict], threads: int, cfg: LadderConfig,
          seed: int) -> m.EngineSpec:
    if name == ANCHOR:
        return random_mover_spec(seed=seed)
    match = re.fullmatch(r"sf-skill(\d+)", name)
    if match:
        return stockfish_spec(cfg.stockfish, int(match.group(1)), cfg.stockfish_nodes)
    g = int(name[3:])
    return engine_spec(os.path.join(run_dir, generations[g]["onnx"]), threads, name)


def rate_generation(run_dir: str, generation: int, cfg: LadderConfig, *, log: Callable[[str], Any],
                    stop: Optional[threading.Event] = None) -> list[dict]:
    """Play ``generation``'s ladder matches that are missing (:func:`choose_opponents`, chosen again
    after each match as the fit moves), append each line, rewrite ratings.json; the lines written."""
    generations = exported_generations(run_dir)
    threads = max(1, usable_cores() // cfg.concurrency)  # one engine of each pair thinks at a time
    written = []
    while True:
        rows = [r for r in read_evaluations(run_dir) if r["nodes"] == cfg.nodes]
        played = {r["opponent"] for r in rows if r["generation"] == generation}
        rated = fit_ratings(rows)
        todo = choose_opponents(generation, rated, played | {f"gen{generation}"}, set(generations), cfg)
        if not todo:
            return written
        opponent = todo[0]
        log(f"evaluate: generation {generation} vs {opponent}: {cfg.games} games at {cfg.nodes} nodes")
        wdl = _play(_spec(f"gen{generation}", run_dir, generations, threads, cfg, generation),
                    _spec(opponent, run_dir, generations, threads, cfg, generation), games=cfg.games,
                    nodes=cfg.nodes, concurrency=cfg.concurrency, seed=generation, log=log, stop=stop)
        if not sum(wdl):
            raise m.MatchError(f"generation {generation} vs {opponent}: the match ended without a game")
        line = _line(generation, opponent, wdl, cfg.nodes)
        append_jsonl(os.path.join(run_dir, EVALUATION_FILE), line)
        written.append(line)
        report = write_ratings(run_dir, cfg.nodes, log)
        mine = report["players"].get(f"gen{generation}")
        rating = "" if mine is None else f"; generation {generation} now Elo {mine['elo']:+.0f} [{mine['low']:+.0f}, {mine['high']:+.0f}]"
        log(f"evaluate: generation {generation} vs {opponent}: +{wdl[0]} ={wdl[1]} -{wdl[2]}{rating}")


def evaluate_run(run_dir: str | os.PathLike, *, every: int = 1, cfg: Optional[LadderConfig] = None,
                 follow: bool = False, log: Callable[[str], Any] = print,
                 stop: Optional[threading.Event] = None) -> list[dict]:
    """Rate the run's generations on the ladder (see the module) and return the lines written: every
    ``every``-th and the newest, or with ``follow`` the newest unrated one until ``stop`` is set.
    ValueError for bad arguments, a run without generations (not with ``follow``: it waits) or a
    second evaluation of the same run; :class:`engine.tools.match.MatchError` when an engine cannot
    play; KeyboardInterrupt leaves the lines written so far."""
    cfg = cfg or LadderConfig()
    for name in ("nodes", "games", "concurrency", "stockfish_nodes"):
        if getattr(cfg, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be 1 or more, got {getattr(cfg, name)}")
    if cfg.games % 2:
        raise ValueError(f"--games must be even (each opening with both colours), got {cfg.games}")
    ladder_levels(cfg.stockfish_levels)
    if cfg.stockfish.strip():
        argv = m.parse_command(cfg.stockfish)  # MatchError at once, not after the first generations
        if shutil.which(argv[0]) is None:
            why = (f"ladder.stockfish: {argv[0]} not found (apt-get install stockfish, or set "
                   "ladder.stockfish = \"\" for no Stockfish anchors)")
            if not follow:
                raise m.MatchError(why)
            log(f"evaluate: {why}: the ladder goes on without Stockfish")  # beside a run: never a restart loop
            cfg = dataclasses.replace(cfg, stockfish="")
    run_dir = os.path.abspath(os.fspath(run_dir))
    if not os.path.isdir(run_dir):
        raise ValueError(f"no run directory {run_dir}")
    stop = stop or threading.Event()
    written: list[dict] = []
    with run_lock(run_dir, EVALUATION_LOCK):  # two would play the same matches and write both
        if not follow:
            targets = generations_to_evaluate(run_dir, every)
            if not targets:
                raise ValueError(f"{run_dir} has no generation with its network yet ({GENERATIONS_FILE})")
            for generation, _ in targets:
                written += rate_generation(run_dir, generation, cfg, log=log, stop=stop)
            return written
        done: set[int] = set()
        while not stop.is_set():
            generations = exported_generations(run_dir)
            rated = {r["generation"] for r in read_evaluations(run_dir) if r["nodes"] == cfg.nodes}
            pending = sorted(set(generations) - rated - done)
            if not pending:
                stop.wait(FOLLOW_POLL_S)
                continue
            newest = pending[-1]
            skipped = [g for g in pending[:-1] if g != 0]
            if skipped:
                log(f"evaluate: rating generation {newest}; skipping {len(skipped)} older unrated ones "
                    f"({skipped[0]}-{skipped[-1]}): the ladder keeps up with the newest")
                done.update(skipped)
            target = 0 if 0 in pending else newest  # generation 0 first: the anchor's first link
            written += rate_generation(run_dir, target, cfg, log=log, stop=stop)
            done.add(target)
    return written
