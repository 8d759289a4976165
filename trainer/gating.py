"""Gating: a new generation plays the current best, and an SPRT decides whether it is published.

The test is the generalised SPRT (GSPRT) of fishtest's classic ``sprt``, on the trinomial model
(each game is a win, draw or loss; pairs are not modelled) with **logistic Elo** (the Elo that
``cyzero match`` reports: expected score ``s = 1 / (1 + 10^(-elo/400))``), not BayesElo:

    LLR = N * sum_i p_i * log(q1_i / q0_i)

where ``p`` are the observed win/draw/loss frequencies and ``q0``/``q1`` the maximum-likelihood
trinomial distributions whose expected score is ``s(elo0)``/``s(elo1)``
(``q_i = p_i / (1 + x (a_i - s))`` with ``x`` the root of ``sum p_i (a_i - s) / (1 + x (a_i - s)) = 0``,
``a = (1, 1/2, 0)``). Empty cells get a pseudo-count of 1e-3 (as fishtest regularises), so
that 4-0-0 still has a finite LLR. Wald's bounds: ``lower = log(beta / (1 - alpha))``,
``upper = log((1 - beta) / alpha)``.

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
from trainer import usable_cores
from trainer.config import GatingConfig

__all__ = ["GateResult", "decide", "gate", "llr", "sprt_bounds"]

_PSEUDO_COUNT = 1e-3  # added to an empty win/draw/loss cell (fishtest's regularisation)
_SCORES = (1.0, 0.5, 0.0)  # win, draw, loss


def _expected_score(elo: float) -> float:
    return 1.0 / (1.0 + 10.0 ** (-elo / 400.0))


def _mle(p: tuple[float, ...], s: float) -> tuple[float, ...]:
    """The trinomial closest (maximum likelihood) to frequencies ``p`` whose expected score is ``s``."""
    d = [a - s for a in _SCORES]
    # 1 + x d_i > 0 for every cell: x in (-1 / max d, -1 / min d); the score equation falls in x.
    lo, hi = -1.0 / max(d), -1.0 / min(d)
    lo, hi = lo + 1e-12 * abs(lo), hi - 1e-12 * abs(hi)
    for _ in range(200):
        x = 0.5 * (lo + hi)
        value = sum(pi * di / (1.0 + x * di) for pi, di in zip(p, d))
        if value > 0:
            lo = x
        else:
            hi = x
    x = 0.5 * (lo + hi)
    return tuple(pi / (1.0 + x * di) for pi, di in zip(p, d))


def llr(wins: int, draws: int, losses: int, elo0: float, elo1: float) -> float:
    """The GSPRT log-likelihood ratio of H1 (logistic Elo ``elo1``) against H0 (``elo0``); 0 with no games."""
    counts = (wins, draws, losses)
    if any(c < 0 for c in counts):
        raise ValueError(f"wins, draws and losses must be >= 0, got {counts}")
    if not elo1 > elo0:
        raise ValueError(f"elo1 must be above elo0, got elo0={elo0} elo1={elo1}")
    n = sum(counts)
    if n == 0:
        return 0.0
    regular = [c if c > 0 else _PSEUDO_COUNT for c in counts]
    total = sum(regular)
    p = tuple(c / total for c in regular)
    q0, q1 = _mle(p, _expected_score(elo0)), _mle(p, _expected_score(elo1))
    return total * sum(pi * math.log(b / a) for pi, a, b in zip(p, q0, q1))


def sprt_bounds(alpha: float, beta: float) -> tuple[float, float]:
    """Wald's LLR bounds (lower, upper) for false-positive rate ``alpha`` and false-negative ``beta``."""
    if not (0.0 < alpha < 1.0 and 0.0 < beta < 1.0 and alpha + beta < 1.0):
        raise ValueError(f"alpha and beta must be in (0, 1) with alpha + beta < 1, got {alpha}, {beta}")
    return math.log(beta / (1.0 - alpha)), math.log((1.0 - beta) / alpha)


def decide(value: float, lower: float, upper: float, games: int, max_games: int) -> Optional[tuple[bool, str]]:
    """``(accepted, reason)`` once the test is over, else None: a bound crossed, or ``max_games``
    played (then a positive LLR accepts)."""
    if value >= upper:
        return True, "H1 accepted"
    if value <= lower:
        return False, "H0 accepted"
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


def engine_spec(onnx_path: str, threads: int, name: str) -> m.EngineSpec:
    """A ``cyzero`` UCI engine on ``onnx_path`` with ``threads`` network threads."""
    return m.EngineSpec(m.default_engine_command(),
                        [("WeightsFile", os.path.abspath(onnx_path)), ("Threads", str(threads))], name)


def gate(candidate_path: str, best_path: str, cfg: GatingConfig, log: Callable[[str], Any] = print, *,
         stop: threading.Event | None = None) -> GateResult:
    """Play ``candidate_path`` against ``best_path`` until the SPRT decides (see the module).

    Games are played ``cfg.concurrency`` at once at ``go nodes cfg.nodes``. ``log`` gets the
    match's per-game lines and one summary line. ``stop`` set: the match ends at once (games
    under way abandoned) and the result, reason "stopped", is not accepted. Raises
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
        engine1=engine_spec(candidate_path, threads, "candidate"),
        engine2=engine_spec(best_path, threads, "best"),
        games=cfg.max_games,
        time_control=m.TimeControl(nodes=cfg.nodes),
        concurrency=cfg.concurrency,
        openings=m.load_openings(),
        openings_source=str(m.OPENINGS_PATH),
        event="cyzero-train gating",
        on_game=on_game,
        should_stop=None if stop is None else stop.is_set,
    )
    quiet = m._QuietInfoLines()
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
