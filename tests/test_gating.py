"""trainer.gating: the SPRT's log-likelihood ratio against a direct numeric maximisation, Wald's
bounds, the decision rules, and real gates between two tiny exported networks."""

from __future__ import annotations

import json
import math
import threading

import pytest

from trainer import gating
from trainer.config import GatingConfig

pytestmark = pytest.mark.timeout(240)


# --------------------------------------------------------------------------- the LLR, independently


def _loglik_max(counts: tuple[float, float, float], s: float) -> float:
    """max over trinomials (pW, pD, pL) with pW + pD/2 = s of sum n_i log p_i, by golden-section
    search over pD (the likelihood is concave in it): no Lagrange multiplier, no shared code."""
    w, d, l = counts

    def f(t: float) -> float:
        pw, pl = s - t / 2.0, 1.0 - s - t / 2.0
        terms = [(w, pw), (d, t), (l, pl)]
        if any(n > 0 and p <= 0 for n, p in terms):
            return -math.inf
        return sum(n * math.log(p) for n, p in terms if n > 0)

    a, b = 0.0, min(2.0 * s, 2.0 - 2.0 * s)
    g = (math.sqrt(5.0) - 1.0) / 2.0
    for _ in range(300):
        c, e = b - g * (b - a), a + g * (b - a)
        if f(c) < f(e):
            a = c
        else:
            b = e
    return f((a + b) / 2.0)


def _reference_llr(w: int, d: int, l: int, elo0: float, elo1: float) -> float:
    counts = tuple(c if c > 0 else 1e-3 for c in (w, d, l))   # the documented pseudo-count
    s0, s1 = (1.0 / (1.0 + 10.0 ** (-e / 400.0)) for e in (elo0, elo1))
    return _loglik_max(counts, s1) - _loglik_max(counts, s0)


@pytest.mark.parametrize("wdl,elo", [
    ((10, 20, 5), (0.0, 30.0)),
    ((120, 260, 100), (0.0, 5.0)),
    ((3, 0, 7), (-10.0, 20.0)),
    ((0, 12, 0), (0.0, 30.0)),
    ((4, 0, 0), (0.0, 30.0)),
    ((1000, 1500, 950), (0.0, 10.0)),
])
def test_llr_matches_a_direct_maximisation(wdl, elo):
    assert gating.llr(*wdl, *elo) == pytest.approx(_reference_llr(*wdl, *elo), rel=1e-6, abs=1e-6)


def test_llr_is_close_to_fishtests_normal_approximation():
    # fishtest's classic approximation: LLR ~ N/2 (s1 - s0)(2 mean - s0 - s1) / var, good for many games
    w, d, l = 1100, 1500, 950
    n = w + d + l
    mean = (w + 0.5 * d) / n
    var = (w * (1 - mean) ** 2 + d * (0.5 - mean) ** 2 + l * mean ** 2) / n
    s0, s1 = 0.5, 1.0 / (1.0 + 10.0 ** (-10.0 / 400.0))
    approx = 0.5 * n * (s1 - s0) * (2 * mean - s0 - s1) / var
    assert gating.llr(w, d, l, 0.0, 10.0) == pytest.approx(approx, rel=0.02)


def test_llr_signs_and_symmetry():
    assert gating.llr(0, 0, 0, 0.0, 30.0) == 0.0
    assert gating.llr(30, 10, 5, 0.0, 30.0) > 0 > gating.llr(5, 10, 30, 0.0, 30.0)
    # swapping wins and losses with the hypotheses mirrored (-elo1, -elo0) gives the same LLR, negated
    assert gating.llr(7, 9, 3, 0.0, 30.0) == pytest.approx(-gating.llr(3, 9, 7, -30.0, 0.0), rel=1e-9)
    with pytest.raises(ValueError, match="elo1 must be above elo0"):
        gating.llr(1, 1, 1, 30.0, 0.0)
    with pytest.raises(ValueError, match=">= 0"):
        gating.llr(-1, 1, 1, 0.0, 30.0)


def test_sprt_bounds_are_walds():
    lower, upper = gating.sprt_bounds(0.05, 0.05)
    assert lower == pytest.approx(-2.944439, abs=1e-6) and upper == pytest.approx(2.944439, abs=1e-6)
    lower, upper = gating.sprt_bounds(0.05, 0.1)
    assert lower == pytest.approx(math.log(0.1 / 0.95)) and upper == pytest.approx(math.log(0.9 / 0.05))
    with pytest.raises(ValueError):
        gating.sprt_bounds(0.0, 0.05)


def test_decision_rules():
    lower, upper = gating.sprt_bounds(0.05, 0.05)
    assert gating.decide(3.0, lower, upper, 10, 200) == (True, "H1 accepted")
    assert gating.decide(-3.0, lower, upper, 10, 200) == (False, "H0 accepted")
    assert gating.decide(1.0, lower, upper, 10, 200) is None
    assert gating.decide(1.0, lower, upper, 200, 200) == (True, "max games: sign of LLR")
    assert gating.decide(-0.5, lower, upper, 200, 200) == (False, "max games: sign of LLR")
    assert gating.decide(0.0, lower, upper, 200, 200) == (False, "max games: sign of LLR")
    # a crossed bound wins over the cap
    assert gating.decide(-3.0, lower, upper, 200, 200) == (False, "H0 accepted")


def test_a_clean_sweep_crosses_the_upper_bound_and_the_opposite_the_lower():
    lower, upper = gating.sprt_bounds(0.05, 0.05)
    n = next(n for n in range(1, 100) if gating.llr(n, 0, 0, 0.0, 30.0) >= upper)
    assert gating.decide(gating.llr(n, 0, 0, 0.0, 30.0), lower, upper, n, 200) == (True, "H1 accepted")
    assert gating.decide(gating.llr(n - 1, 0, 0, 0.0, 30.0), lower, upper, n - 1, 200) is None
    k = next(k for k in range(1, 100) if gating.llr(0, 0, k, 0.0, 30.0) <= lower)
    assert gating.decide(gating.llr(0, 0, k, 0.0, 30.0), lower, upper, k, 200) == (False, "H0 accepted")


def test_to_dict_has_exactly_the_gating_jsonl_fields():
    result = gating.GateResult(accepted=True, wins=3, draws=1, losses=0, games=4, llr=0.5, lower=-2.9,
                               upper=2.9, elo=190.0, elo_error=300.0, reason="max games: sign of LLR",
                               generation=5, best=3)
    line = result.to_dict()
    assert list(line) == ["generation", "best", "accepted", "wins", "draws", "losses", "games", "llr", "lower",
                          "upper", "elo", "elo_error", "time", "reason"]
    assert line["generation"] == 5 and line["best"] == 3 and line["time"] > 0
    json.dumps(line, allow_nan=False)


# --------------------------------------------------------------------------- real gates


@pytest.fixture(scope="module")
def tiny_nets(tmp_path_factory):
    from trainer.export import export_onnx
    from trainer.model import build_net

    folder = tmp_path_factory.mktemp("nets")
    paths = []
    for seed in (1, 2):
        path = folder / f"net{seed}.onnx"
        export_onnx(build_net("1x8", seed=seed), path, check_positions=16)
        paths.append(str(path))
    return paths


@pytest.mark.parametrize("cfg", [
    GatingConfig(enabled=True, nodes=4, max_games=4, concurrency=1),
    # wide bounds (+-0.2: three draws cross the lower one), two games at once: the one under way
    # when a bound is crossed is abandoned and not counted
    GatingConfig(enabled=True, nodes=2, max_games=6, concurrency=2, alpha=0.45, beta=0.45),
], ids=["alpha0.05", "alpha0.45-concurrency2"])
def test_a_real_gate_is_consistent(tiny_nets, cfg):
    lines: list[str] = []
    result = gating.gate(tiny_nets[0], tiny_nets[1], cfg, log=lines.append)
    assert 1 <= result.games <= 4
    assert result.wins + result.draws + result.losses == result.games
    lower, upper = gating.sprt_bounds(cfg.alpha, cfg.beta)
    assert (result.lower, result.upper) == (lower, upper)
    assert result.llr == pytest.approx(gating.llr(result.wins, result.draws, result.losses, cfg.elo0, cfg.elo1))
    assert (result.accepted, result.reason) == gating.decide(result.llr, lower, upper, result.games, cfg.max_games)
    if result.games < cfg.max_games:      # it stopped early only because a bound was crossed
        assert not lower < result.llr < upper
    assert sum("game " in line and "+" in line for line in lines) >= result.games
    assert "gating:" in lines[-1]
    json.dumps(result.to_dict(), allow_nan=False)


def test_the_stop_event_ends_a_gate_early(tiny_nets):
    # two games at once: when the first ends, the other is under way and is abandoned
    cfg = GatingConfig(enabled=True, nodes=8, max_games=200, concurrency=2)
    stop = threading.Event()
    lines: list[str] = []

    def log(line: str) -> None:
        lines.append(line)
        if "game " in line:     # after the first finished game
            stop.set()

    result = gating.gate(tiny_nets[0], tiny_nets[1], cfg, log=log, stop=stop)
    assert stop.is_set()
    assert result.reason == "stopped" and not result.accepted
    assert 1 <= result.games < 10   # far from the 200 the match would otherwise play


def test_a_missing_network_is_one_clear_error(tiny_nets, tmp_path):
    from engine.tools.match import MatchError

    with pytest.raises(MatchError, match="no network at"):
        gating.gate(str(tmp_path / "nope.onnx"), tiny_nets[1], GatingConfig())
