"""Gating: a new generation plays the current best, and an SPRT decides whether it is published.

The test is the GSPRT of :mod:`engine.tools.sprt` (fishtest's classic ``sprt``, logistic Elo),
on its trinomial model: each game is a win, draw or loss for the candidate. ``cyzero match
--sprt`` uses the same module on pairs of games (pentanomial).

:func:`gate` plays the games through :mod:`engine.tools.match` (two ``cyzero`` UCI engines on
the two ONNX files, ``go nodes``, the bundled openings with both colours) and ends the match
through its ``on_game`` hook as soon as the LLR leaves ``(lower, upper)``; at ``max_games``
the sign of the LLR decides (LLR > 0: accepted).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import threading
import time
from collections.abc import Callable
from typing import Any, Optional

from engine.tools import match as m
from engine.tools.sprt import llr, sprt_bounds, verdict
from trainer.devices import usable_cores
from trainer.config import GatingConfig

__all__ = ["GateResult", "decide", "gate"]


def decide(value: float, lower: float, upper: float, games: int, max_games: int) -> Optional[tuple[bool, str]]:
    """``(accepted, reason)`` once the test is over, else None: a bound crossed, or ``max_games``
    played (then a positive LLR accepts)."""
    found = verdict(value, lower, upper)
    if found is not None:
        return found == "H1", f"{found} accepted"
    if games >= max_games:
        return value > 0.0, "max games: sign of LLR"
    return None


@dataclasses.dataclass
class GateResult:
    """One gating match, from the candidate's side. ``generation`` and ``best`` are the caller's."""

    accepted: bool
    wins: int
    draws: int
    losses: int
    games: int
    llr: float
    lower: float
    upper: float
    elo: Optional[float]        # logistic Elo of the candidate over the best; None when infinite
    elo_error: Optional[float]  # half the 95% interval (trinomial); None when unbounded
    reason: str                 # "H1 accepted", "H0 accepted", "max games: sign of LLR" or "stopped"
    time: float = dataclasses.field(default_factory=time.time)
    generation: Optional[int] = None
    best: Optional[int] = None

    def to_dict(self) -> dict[str, Any]:
        """The line of ``RUN/gating.jsonl``."""
        return {key: getattr(self, key) for key in (
            "generation", "best", "accepted", "wins", "draws", "losses", "games", "llr", "lower", "upper",
            "elo", "elo_error", "time", "reason")}


def _finite(x: Optional[float]) -> Optional[float]:
    return None if x is None or not math.isfinite(x) else x + 0.0  # no -0.0


def _result(wdl: list[int], value: float, bounds: tuple[float, float], accepted: bool, reason: str) -> GateResult:
    w, d, l = wdl
    stats = m.score_stats(w, l, d)
    low, high = _finite(stats.elo_low), _finite(stats.elo_high)
    error = None if low is None or high is None else (high - low) / 2.0
    return GateResult(accepted=accepted, wins=w, draws=d, losses=l, games=w + d + l, llr=value,
                      lower=bounds[0], upper=bounds[1], elo=_finite(stats.elo), elo_error=error, reason=reason)


def engine_spec(onnx_path: str, threads: int, name: str, backend: Optional[str] = None) -> m.EngineSpec:
    """A ``cyzero`` UCI engine on ``onnx_path`` with ``threads`` network threads; ``backend``
    (``cpu``, ``cuda``, ...) sets its ``Backend`` option, None keeps the engine's default."""
    options = [("WeightsFile", os.path.abspath(onnx_path)), ("Threads", str(threads))]
    if backend is not None:
        options.append(("Backend", backend))
    return m.EngineSpec(m.default_engine_command(), options, name)


def gate(candidate_path: str, best_path: str, cfg: GatingConfig, log: Callable[[str], Any] = print, *,
         stop: threading.Event | None = None, backend: Optional[str] = None) -> GateResult:
    """Play ``candidate_path`` against ``best_path`` until the SPRT decides (see the module).

    Games are played ``cfg.concurrency`` at once at ``go nodes cfg.nodes``. ``log`` gets the
    match's per-game lines and one summary line. ``stop`` set: the match ends at once (games
    under way abandoned) and the result, reason "stopped", is not accepted. ``backend`` sets both
    engines' ``Backend`` option (None: the engine's default, ``auto``). Raises
    :class:`engine.tools.match.MatchError` when the engines cannot play.
    """
    for path in (candidate_path, best_path):
        if not os.path.isfile(path):
            raise m.MatchError(f"gating: no network at {path}")
    bounds = sprt_bounds(cfg.alpha, cfg.beta)
    wdl = [0, 0, 0]  # the candidate's wins, draws, losses
    decided: list[tuple[bool, str]] = []
    state = {"llr": 0.0}

    def on_game(record: m.GameRecord) -> bool:
        if decided:
            return True
        score = record.engine1_score()
        wdl[0 if score == 1.0 else 2 if score == 0.0 else 1] += 1
        state["llr"] = llr(wdl[0], wdl[1], wdl[2], cfg.elo0, cfg.elo1)
        verdict = decide(state["llr"], *bounds, sum(wdl), cfg.max_games)
        if verdict is not None:
            decided.append(verdict)
        return verdict is not None

    threads = max(1, usable_cores() // cfg.concurrency)  # one engine of each pair thinks at a time
    config = m.MatchConfig(
        engine1=engine_spec(candidate_path, threads, "candidate", backend),
        engine2=engine_spec(best_path, threads, "best", backend),
        games=cfg.max_games,
        time_control=m.TimeControl(nodes=cfg.nodes),
        concurrency=cfg.concurrency,
        openings=m.load_openings(),
        openings_source=str(m.OPENINGS_PATH),
        event="cyzero-train gating",
        on_game=on_game,
        should_stop=None if stop is None else stop.is_set,
    )
    quiet = m.QuietInfoLines()
    logger = logging.getLogger("chess.engine")
    logger.addFilter(quiet)
    try:
        m.run_match(config, log)
    finally:
        logger.removeFilter(quiet)
    accepted, reason = decided[0] if decided else (False, "stopped")
    result = _result(wdl, state["llr"], bounds, accepted, reason)
    log(f"gating: {os.path.basename(candidate_path)} vs {os.path.basename(best_path)}: +{result.wins} "
        f"={result.draws} -{result.losses}, LLR {result.llr:.2f} in ({bounds[0]:.2f}, {bounds[1]:.2f}): "
        f"{reason}, {'accepted' if accepted else 'rejected'}")
    return result
