"""The sequential probability ratio test that ``cyzero match --sprt`` and the trainer's gating stop on.

The test is the generalised SPRT (GSPRT) of fishtest's classic ``sprt`` with **logistic Elo**
(the Elo that ``cyzero match`` reports: expected score ``s = 1 / (1 + 10^(-elo/400))``,
:func:`engine.tools.elo.expected_score`), not BayesElo. Results are counted in cells with scores ``a_i``:

- trinomial: each game is a win, draw or loss, ``a = (1, 1/2, 0)``;
- pentanomial: each pair of games (one opening, colours reversed) scores 0, 1/2, 1, 3/2 or 2,
  ``a = (0, 1/4, 1/2, 3/4, 1)`` as a score per game. The pair is the unit, so the variance the
  openings add cancels within a pair (fishtest's and fastchess's default).

With ``N`` the count and ``p`` the observed frequencies,

    LLR = N * sum_i p_i * log(q1_i / q0_i)

where ``q0``/``q1`` are the maximum-likelihood distributions over the same cells whose expected
score is ``s(elo0)``/``s(elo1)``: ``q_i = p_i / (1 + x (a_i - s))`` with ``x`` the root of
``sum p_i (a_i - s) / (1 + x (a_i - s)) = 0`` (Van den Bergh, "Comments on Normalized Elo",
proposition 1.1). Empty cells get a pseudo-count of 1e-3 (as fishtest regularises), so that a
clean sweep still has a finite LLR. Wald's bounds: ``lower = log(beta / (1 - alpha))``,
``upper = log((1 - beta) / alpha)``; H1 (engine 1 is ``elo1`` stronger) is accepted at or above
the upper bound, H0 (``elo0``) at or below the lower one.

No torch: the engine's tools and the trainer share it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

from engine.tools.elo import PENTANOMIAL_SCORES, expected_score

__all__ = ["Sprt", "llr", "llr_pentanomial", "parse_elo_bounds", "sprt_bounds", "verdict"]

PSEUDO_COUNT = 1e-3  # added to an empty cell (fishtest's regularisation)
MAX_ELO = 2000.0  # |elo0|, |elo1| at most this: the expected score stays strictly inside (0, 1)
_TRINOMIAL = (1.0, 0.5, 0.0)  # win, draw, loss


def _mle(p: Sequence[float], scores: Sequence[float], s: float) -> list[float]:
    """The distribution over ``scores`` closest (maximum likelihood) to frequencies ``p`` whose
    expected score is ``s``."""
    d = [a - s for a in scores]
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
    return [pi / (1.0 + x * di) for pi, di in zip(p, d)]


def _check_elos(elo0: float, elo1: float) -> None:
    if not (math.isfinite(elo0) and math.isfinite(elo1)):
        raise ValueError(f"elo0 and elo1 must be finite, got elo0={elo0} elo1={elo1}")
    if not elo1 > elo0:
        raise ValueError(f"elo1 must be above elo0, got elo0={elo0} elo1={elo1}")
    if max(abs(elo0), abs(elo1)) > MAX_ELO:
        raise ValueError(f"elo0 and elo1 must be within -{MAX_ELO:g}..{MAX_ELO:g}, got elo0={elo0} elo1={elo1}")


def _llr(counts: Sequence[int], scores: Sequence[float], elo0: float, elo1: float) -> float:
    if any(c < 0 for c in counts):
        raise ValueError(f"counts must be >= 0, got {tuple(counts)}")
    _check_elos(elo0, elo1)
    if sum(counts) == 0:
        return 0.0
    regular = [c if c > 0 else PSEUDO_COUNT for c in counts]
    total = sum(regular)
    p = [c / total for c in regular]
    q0, q1 = (_mle(p, scores, expected_score(elo)) for elo in (elo0, elo1))
    return total * sum(pi * math.log(b / a) for pi, a, b in zip(p, q0, q1))


def llr(wins: int, draws: int, losses: int, elo0: float, elo1: float) -> float:
    """The trinomial GSPRT log-likelihood ratio of H1 (logistic Elo ``elo1``) against H0
    (``elo0``) for engine 1's wins, draws and losses; 0 with no games."""
    if any(c < 0 for c in (wins, draws, losses)):
        raise ValueError(f"wins, draws and losses must be >= 0, got {(wins, draws, losses)}")
    return _llr((wins, draws, losses), _TRINOMIAL, elo0, elo1)


def llr_pentanomial(counts: Sequence[int], elo0: float, elo1: float) -> float:
    """The pentanomial GSPRT log-likelihood ratio: ``counts`` are the pairs in which engine 1
    scored 0, 1/2, 1, 3/2 and 2 points (``engine.tools.elo.PairStats.counts``); 0 with none."""
    if len(counts) != 5:
        raise ValueError(f"pentanomial counts are 5 numbers (pairs scoring 0, 1/2, 1, 3/2, 2), got {tuple(counts)}")
    return _llr(counts, PENTANOMIAL_SCORES, elo0, elo1)


def sprt_bounds(alpha: float, beta: float) -> tuple[float, float]:
    """Wald's LLR bounds (lower, upper) for false-positive rate ``alpha`` and false-negative ``beta``."""
    if not (0.0 < alpha < 1.0 and 0.0 < beta < 1.0 and alpha + beta < 1.0):
        raise ValueError(f"alpha and beta must be in (0, 1) with alpha + beta < 1, got {alpha}, {beta}")
    return math.log(beta / (1.0 - alpha)), math.log((1.0 - beta) / alpha)


def verdict(value: float, lower: float, upper: float) -> Optional[str]:
    """``"H1"`` at or above ``upper``, ``"H0"`` at or below ``lower``, else None (go on)."""
    if value >= upper:
        return "H1"
    if value <= lower:
        return "H0"
    return None


def parse_elo_bounds(text: str) -> tuple[float, float]:
    """``"ELO0,ELO1"`` -> (elo0, elo1); ValueError that says what is wrong."""
    parts = [part.strip() for part in text.split(",")]
    try:
        if len(parts) != 2:
            raise ValueError
        elo0, elo1 = (float(part) for part in parts)
    except ValueError:
        raise ValueError(f"expected ELO0,ELO1, two Elo numbers such as 0,10, got {text!r}") from None
    if not (math.isfinite(elo0) and math.isfinite(elo1)) or max(abs(elo0), abs(elo1)) > MAX_ELO:
        raise ValueError(f"ELO0 and ELO1 must be within -{MAX_ELO:g}..{MAX_ELO:g}, got {text!r}")
    if not elo1 > elo0:
        raise ValueError(f"ELO1 must be above ELO0 (H1 is engine 1 being ELO1 stronger), got {text!r}")
    return elo0, elo1


@dataclass(frozen=True)
class Sprt:
    """One test: H0 ``elo0`` against H1 ``elo1`` (engine 1's logistic Elo over engine 2), with
    error rates ``alpha`` (accepting H1 when H0 holds) and ``beta`` (accepting H0 when H1 holds)."""

    elo0: float
    elo1: float
    alpha: float = 0.05
    beta: float = 0.05

    def __post_init__(self) -> None:
        _check_elos(self.elo0, self.elo1)
        sprt_bounds(self.alpha, self.beta)

    @property
    def bounds(self) -> tuple[float, float]:
        return sprt_bounds(self.alpha, self.beta)

    def llr_pentanomial(self, counts: Sequence[int]) -> float:
        return llr_pentanomial(counts, self.elo0, self.elo1)

    def llr(self, wins: int, draws: int, losses: int) -> float:
        return llr(wins, draws, losses, self.elo0, self.elo1)

    def verdict(self, value: float) -> Optional[str]:
        return verdict(value, *self.bounds)
