"""trainer.gating: the decision rules on the shared SPRT (engine.tools.sprt, whose log-likelihood
ratio tests/test_match.py checks against a direct maximisation and published values), and real
gates between two tiny exported networks, on the CPU backend so they are quick on any machine."""

from __future__ import annotations

import json
import threading

import pytest

from engine.tools import sprt
from trainer import gating
from trainer.config import GatingConfig

pytestmark = pytest.mark.timeout(240)


def test_gating_uses_the_engines_sprt():
    # one place per concern: the LLR and the bounds live in engine.tools.sprt
    assert gating.llr is sprt.llr and gating.sprt_bounds is sprt.sprt_bounds


def test_decision_rules():
    lower, upper = sprt.sprt_bounds(0.05, 0.05)
    assert gating.decide(3.0, lower, upper, 10, 200) == (True, "H1 accepted")
    assert gating.decide(-3.0, lower, upper, 10, 200) == (False, "H0 accepted")
    assert gating.decide(1.0, lower, upper, 10, 200) is None
    assert gating.decide(1.0, lower, upper, 200, 200) == (True, "max games: sign of LLR")
    assert gating.decide(-0.5, lower, upper, 200, 200) == (False, "max games: sign of LLR")
    assert gating.decide(0.0, lower, upper, 200, 200) == (False, "max games: sign of LLR")
    # a crossed bound wins over the cap
    assert gating.decide(-3.0, lower, upper, 200, 200) == (False, "H0 accepted")


def test_a_clean_sweep_crosses_the_upper_bound_and_the_opposite_the_lower():
    lower, upper = sprt.sprt_bounds(0.05, 0.05)
    n = next(n for n in range(1, 100) if sprt.llr(n, 0, 0, 0.0, 30.0) >= upper)
    assert gating.decide(sprt.llr(n, 0, 0, 0.0, 30.0), lower, upper, n, 200) == (True, "H1 accepted")
    assert gating.decide(sprt.llr(n - 1, 0, 0, 0.0, 30.0), lower, upper, n - 1, 200) is None
    k = next(k for k in range(1, 100) if sprt.llr(0, 0, k, 0.0, 30.0) <= lower)
    assert gating.decide(sprt.llr(0, 0, k, 0.0, 30.0), lower, upper, k, 200) == (False, "H0 accepted")


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
def test_a_real_gate_is_consistent(tiny_nets, cfg, monkeypatch):
    # Backend cpu: on a CUDA machine the default (auto) took the GPU, where these fixed-node
    # matches crawled (over 200 s); the CPU runs a 1x8 network at once on any machine.
    matches = []
    run_match = gating.m.run_match

    def spy(config, progress=None):
        matches.append(run_match(config, progress))
        return matches[-1]

    monkeypatch.setattr(gating.m, "run_match", spy)
    lines: list[str] = []
    result = gating.gate(tiny_nets[0], tiny_nets[1], cfg, log=lines.append, backend="cpu")
    assert [options.get("Backend") for options in matches[0].options] == ["cpu", "cpu"]
    assert 1 <= result.games <= cfg.max_games
    assert result.wins + result.draws + result.losses == result.games
    lower, upper = sprt.sprt_bounds(cfg.alpha, cfg.beta)
    assert (result.lower, result.upper) == (lower, upper)
    assert result.llr == pytest.approx(sprt.llr(result.wins, result.draws, result.losses, cfg.elo0, cfg.elo1))
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

    result = gating.gate(tiny_nets[0], tiny_nets[1], cfg, log=log, stop=stop, backend="cpu")
    assert stop.is_set()
    assert result.reason == "stopped" and not result.accepted
    assert 1 <= result.games < 10   # far from the 200 the match would otherwise play


def test_a_missing_network_is_one_clear_error(tiny_nets, tmp_path):
    from engine.tools.match import MatchError

    with pytest.raises(MatchError, match="no network at"):
        gating.gate(str(tmp_path / "nope.onnx"), tiny_nets[1], GatingConfig())
