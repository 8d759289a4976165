"""``cyzero-train evaluate RUN``: is the loop learning? Each generation against the first one and
against a random mover.

Gating (``trainer.gating``) compares a candidate with the current best only, so it cannot show
progress over a whole run. This plays the run's generations (every K-th and the newest, from
``generations.jsonl``) against two fixed yardsticks through :mod:`engine.tools.match`: generation
0 (the run's initial network) and :mod:`engine.tools.random_mover`. Both sides search a fixed
``go nodes N`` (the random mover ignores it), from the bundled openings with both colours.

Every result is one line of ``RUN/evaluation.jsonl`` (appended, fsynced)::

    {"generation", "opponent": "gen0" | "random", "wins", "draws", "losses", "games", "score",
     "elo", "elo_error", "nodes", "time"}

from the generation's side; ``elo`` is null when the score is 0 or 1 and ``elo_error`` (half
the 95% interval, trinomial) when the interval is unbounded. A generation, opponent and node
count already in the file is skipped, so the command resumes where it stopped (a match cut
short writes nothing). Generation 0 is not played against itself.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import math
import os
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any, Optional

from engine.tools import match as m
from trainer import usable_cores
from trainer.atomic import append_jsonl, read_jsonl
from trainer.gating import engine_spec
# torch-free, as status is: evaluating plays the engine and trains nothing
from trainer.report import GENERATIONS_FILE, read_evaluations  # noqa: F401 - read_evaluations: one reader

__all__ = ["EVALUATION_FILE", "OPPONENTS", "evaluate_run", "generations_to_evaluate", "random_mover_spec",
           "read_evaluations"]

EVALUATION_FILE = "evaluation.jsonl"
LOCK_FILE = "evaluation.lock"
OPPONENTS = ("gen0", "random")


def random_mover_spec(seed: int) -> m.EngineSpec:
    """The random mover as a match engine (this Python, so it runs in the same environment)."""
    return m.EngineSpec([sys.executable, "-m", "engine.tools.random_mover", "--seed", str(seed)], name="random")


def _int(value: Any) -> Optional[int]:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _number(value: Any) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return value + 0.0  # a float, never -0.0


def generations_to_evaluate(run_dir: str | os.PathLike, every: int = 1) -> list[tuple[int, str]]:
    """``(generation, onnx path)`` of every ``every``-th generation and the newest, oldest first,
    whose network file is still there (retention may have removed old ones)."""
    if every < 1:
        raise ValueError(f"--every must be 1 or more, got {every}")
    run_dir = os.fspath(run_dir)
    found: dict[int, str] = {}
    for record in read_jsonl(os.path.join(run_dir, GENERATIONS_FILE)):
        generation, onnx = _int(record.get("generation")), record.get("onnx")
        if generation is not None and generation >= 0 and isinstance(onnx, str):
            path = os.path.join(run_dir, onnx)
            if os.path.isfile(path):
                found[generation] = path
    if not found:
        return []
    newest = max(found)
    return [(g, found[g]) for g in sorted(found) if g % every == 0 or g == newest]


@contextlib.contextmanager
def _locked(run_dir: str) -> Iterator[None]:
    """One evaluation per run at a time (two would play the same matches and write both)."""
    fd = os.open(os.path.join(run_dir, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ValueError(f"another `cyzero-train evaluate` is running on {run_dir}") from None
        yield
    finally:
        os.close(fd)


def _play(engine: m.EngineSpec, opponent: m.EngineSpec, *, games: int, nodes: int, concurrency: int,
          seed: int, log: Callable[[str], Any]) -> list[int]:
    """One match; ``[wins, draws, losses]`` from ``engine``'s side."""
    config = m.MatchConfig(
        engine1=engine, engine2=opponent, games=games, time_control=m.TimeControl(nodes=nodes),
        concurrency=concurrency, openings=m.load_openings(), openings_source=str(m.OPENINGS_PATH),
        seed=seed, event="cyzero-train evaluate")
    quiet = m._QuietInfoLines()
    logger = logging.getLogger("chess.engine")
    logger.addFilter(quiet)
    try:
        result = m.run_match(config, log)
    except m.MatchInterrupted:
        raise KeyboardInterrupt from None  # a match cut short is not a result: nothing is written
    finally:
        logger.removeFilter(quiet)
    scores = [g.engine1_score() for g in result.games]
    return [scores.count(1.0), scores.count(0.5), scores.count(0.0)]


def _line(generation: int, opponent: str, wdl: list[int], nodes: int) -> dict:
    w, d, l = wdl
    stats = m.score_stats(w, l, d)
    low, high = _number(stats.elo_low), _number(stats.elo_high)
    return {"generation": generation, "opponent": opponent, "wins": w, "draws": d, "losses": l,
            "games": w + d + l, "score": stats.score, "elo": _number(stats.elo),
            "elo_error": None if low is None or high is None else (high - low) / 2.0,
            "nodes": nodes, "time": time.time()}


def evaluate_run(run_dir: str | os.PathLike, *, every: int = 1, nodes: int = 64, games: int = 20,
                 concurrency: int = 1, log: Callable[[str], Any] = print) -> list[dict]:
    """Play what is missing from ``RUN/evaluation.jsonl`` (see the module) and return the lines
    written. ValueError for bad arguments, a run without generations or a second evaluation of
    the same run; :class:`engine.tools.match.MatchError` when an engine cannot play;
    KeyboardInterrupt leaves the lines written so far."""
    for name, value in (("nodes", nodes), ("games", games), ("concurrency", concurrency)):
        if value < 1:
            raise ValueError(f"--{name} must be 1 or more, got {value}")
    run_dir = os.path.abspath(os.fspath(run_dir))
    if not os.path.isdir(run_dir):
        raise ValueError(f"no run directory {run_dir}")
    targets = generations_to_evaluate(run_dir, every)
    if not targets:
        raise ValueError(f"{run_dir} has no generation with its network yet ({GENERATIONS_FILE})")
    first = dict(targets).get(0)  # 0 is a multiple of every K
    if first is None:
        log("evaluate: generation 0's network is gone (replay.keep_networks?): playing the random mover only")
    threads = max(1, usable_cores() // concurrency)  # one engine of each pair thinks at a time
    written = []
    with _locked(run_dir):
        done = {(r["generation"], r["opponent"], r["nodes"]) for r in read_evaluations(run_dir)}
        for generation, path in targets:
            opponents = {"random": random_mover_spec(seed=generation)}
            if first is not None and generation != 0:
                opponents["gen0"] = engine_spec(first, threads, "gen0")
            for opponent in OPPONENTS:
                other = opponents.get(opponent)
                if other is None or (generation, opponent, nodes) in done:
                    continue
                log(f"evaluate: generation {generation} vs {opponent}: {games} games at {nodes} nodes")
                wdl = _play(engine_spec(path, threads, f"gen{generation}"), other, games=games, nodes=nodes,
                            concurrency=concurrency, seed=generation, log=log)
                if not sum(wdl):
                    raise m.MatchError(f"generation {generation} vs {opponent}: the match ended without a game")
                line = _line(generation, opponent, wdl, nodes)
                append_jsonl(os.path.join(run_dir, EVALUATION_FILE), line)
                written.append(line)
                elo = "?" if line["elo"] is None else f"{line['elo']:+.0f}"
                error = "" if line["elo_error"] is None else f" ± {line['elo_error']:.0f}"
                log(f"evaluate: generation {generation} vs {opponent}: +{wdl[0]} ={wdl[1]} -{wdl[2]}, "
                    f"score {line['score']:.3f}, Elo {elo}{error}")
    return written
