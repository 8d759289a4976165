"""Elo statistics, once for ``cyzero match``, the SPRT (:mod:`engine.tools.sprt`) and the trainer's ladder.

Logistic Elo throughout: a side ``elo`` stronger scores ``s = 1 / (1 + 10^(-elo/400))`` a game
(:func:`expected_score`), and a score maps back by :func:`elo_from_score`. From match counts:

- :func:`score_stats`: the trinomial model, each game a win, draw or loss;
- :func:`pentanomial_stats`: the pentanomial model, each pair of games (one opening, colours
  reversed) scoring 0, 1/2, 1, 3/2 or 2, which cancels the variance the openings add;
- :func:`likelihood_of_superiority` (LOS) from the decisive games;
- :func:`logistic_ratings`: many players' ratings at once, by maximum likelihood (the ladder).

Every 95% interval uses :data:`Z95`. It is 1.96, the rounded quantile that the interval
tests of ``cyzero match`` were computed with by hand (tests/test_match.py); 1.959964 would
move their bounds in the second decimal.

Pure Python but for numpy in :func:`logistic_ratings`; no torch, so the engine's tools and the
trainer share it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

import numpy as np

__all__ = ["PENTANOMIAL_SCORES", "Z95", "PairStats", "ScoreStats", "elo_from_score", "expected_score",
           "likelihood_of_superiority", "logistic_ratings", "pentanomial_stats", "score_stats"]

Z95 = 1.96  # the normal quantile of every 95% interval here
PENTANOMIAL_SCORES = (0.0, 0.25, 0.5, 0.75, 1.0)  # a pair scoring 0, 1/2, 1, 3/2, 2 (per game)


def expected_score(elo: float) -> float:
    """The expected score per game of a side ``elo`` logistic Elo stronger."""
    return 1.0 / (1.0 + 10.0 ** (-elo / 400.0))


def elo_from_score(score: float) -> float:
    """Elo difference for an expected score in [0, 1]: -400 log10(1/score - 1); +-inf at the ends."""
    if score <= 0.0:
        return -math.inf
    if score >= 1.0:
        return math.inf
    return -400.0 * math.log10(1.0 / score - 1.0)


def likelihood_of_superiority(wins: int, losses: int) -> float:
    """LOS = 0.5 (1 + erf((W - L) / sqrt(2 (W + L)))); 0.5 when there are no decisive games."""
    if wins + losses == 0:
        return 0.5
    return 0.5 * (1.0 + math.erf((wins - losses) / math.sqrt(2.0 * (wins + losses))))


def _elo_interval(mu: float, se: float) -> tuple[float, float, float]:
    """Elo of mean score ``mu`` and its 95% bounds; bounds outside (0, 1) become -inf / +inf."""
    return elo_from_score(mu), elo_from_score(mu - Z95 * se), elo_from_score(mu + Z95 * se)


@dataclass(frozen=True)
class ScoreStats:
    """Score statistics from one side's view (trinomial model: each game is 1, 1/2 or 0)."""

    wins: int
    losses: int
    draws: int
    games: int
    score: Optional[float]  # mean score per game, None with no games
    stderr: Optional[float]  # standard error of the mean score
    elo: Optional[float]  # may be +-inf
    elo_low: Optional[float]  # 95% interval; bounds outside (0, 1) become -inf / +inf
    elo_high: Optional[float]
    los: float


def score_stats(wins: int, losses: int, draws: int) -> ScoreStats:
    """Mean score, Elo difference with a 95% interval and LOS for W/L/D counts."""
    n = wins + losses + draws
    los = likelihood_of_superiority(wins, losses)
    if n == 0:
        return ScoreStats(wins, losses, draws, 0, None, None, None, None, None, los)
    mu = (wins + 0.5 * draws) / n
    var = (wins * (1.0 - mu) ** 2 + draws * (0.5 - mu) ** 2 + losses * (0.0 - mu) ** 2) / n
    se = math.sqrt(var / n)
    return ScoreStats(wins, losses, draws, n, mu, se, *_elo_interval(mu, se), los)


@dataclass(frozen=True)
class PairStats:
    """Score statistics over game pairs (pentanomial model).

    Each opening is played twice with colours reversed, so a pair scores 0, 1/2, 1, 3/2 or 2
    for engine 1.  Treating the pair as the unit removes the variance the openings add (one
    side's opening advantage cancels within a pair), so the interval is honest, and usually
    narrower than the trinomial one, which assumes independent games.
    """

    counts: tuple  # pairs scoring 0, 1/2, 1, 3/2, 2 for engine 1
    pairs: int
    score: Optional[float]  # mean score per game
    stderr: Optional[float]
    elo: Optional[float]
    elo_low: Optional[float]
    elo_high: Optional[float]


def pentanomial_stats(counts: Sequence[int]) -> PairStats:
    """Mean score and Elo with its 95% interval from the pairs scoring 0, 1/2, 1, 3/2 and 2."""
    counts = tuple(counts)
    n = sum(counts)
    if n == 0:
        return PairStats(counts, 0, None, None, None, None, None)
    mu = sum(c * v for c, v in zip(counts, PENTANOMIAL_SCORES)) / n
    var = sum(c * (v - mu) ** 2 for c, v in zip(counts, PENTANOMIAL_SCORES)) / n
    se = math.sqrt(var / n)
    return PairStats(counts, n, mu, se, *_elo_interval(mu, se))


def logistic_ratings(pairs: Mapping[tuple[str, str], Sequence[float]], anchor: str,
                prior_draws: float) -> dict[str, tuple[float, float]]:
    """Ratings of every player joined to ``anchor`` by games (``anchor`` itself left out):
    name -> (Elo, half width of its 95% interval), names sorted.

    ``pairs`` maps ``(a, b)`` to ``(games, points a scored)``. The logistic model
    P(a beats b) = 1 / (1 + 10^((Rb - Ra) / 400)), draws as half a point each way, fitted by
    Newton's method with ``anchor`` fixed at 0 and ``prior_draws`` virtual draws a pairing
    (BayesElo's prior in its simplest form); the intervals come from the inverse of the
    likelihood's curvature."""
    linked, frontier = {anchor}, [anchor]
    while frontier:
        p = frontier.pop()
        for a, b in pairs:
            for x, y in ((a, b), (b, a)):
                if x == p and y not in linked:
                    linked.add(y)
                    frontier.append(y)
    names = sorted(linked - {anchor})
    if not names:
        return {}
    index = {name: i for i, name in enumerate(names)}
    k = math.log(10.0) / 400.0
    edges = [(index.get(a), index.get(b), n + prior_draws, s + prior_draws / 2)
             for (a, b), (n, s) in pairs.items() if a in linked and b in linked and n > 0]
    ratings = np.zeros(len(names))
    hessian = np.eye(len(names)) * 1e-9
    for _ in range(100):
        grad = np.zeros(len(names))
        hessian = np.eye(len(names)) * 1e-9
        for i, j, n, s in edges:
            ri = 0.0 if i is None else ratings[i]
            rj = 0.0 if j is None else ratings[j]
            p = 1.0 / (1.0 + math.exp(-k * (ri - rj)))
            g, h = k * (s - n * p), k * k * n * p * (1.0 - p)
            if i is not None:
                grad[i] += g
                hessian[i, i] += h
            if j is not None:
                grad[j] -= g
                hessian[j, j] += h
            if i is not None and j is not None:
                hessian[i, j] -= h
                hessian[j, i] -= h
        step = np.linalg.solve(hessian, grad)
        ratings += np.clip(step, -400.0, 400.0)
        if np.max(np.abs(step)) < 1e-6:
            break
    errors = np.sqrt(np.maximum(np.diag(np.linalg.inv(hessian)), 0.0)) * Z95
    return {name: (float(ratings[i]), float(errors[i])) for name, i in index.items()}
