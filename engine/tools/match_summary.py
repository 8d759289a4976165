"""The numbers of a match: pentanomial pairs, the SPRT's state, and the summary as JSON and as text.

The statistics themselves are :mod:`engine.tools.elo`'s and :mod:`engine.tools.sprt`'s.
"""

from __future__ import annotations

import math
import os
from typing import Iterable, Optional

from engine.tools.elo import PairStats, ScoreStats, pentanomial_stats, score_stats
from engine.tools.match_openings import OPENINGS_PATH
from engine.tools.match_pgn import engine_limit
from engine.tools.match_types import GameRecord, MatchResult
from engine.tools.sprt import Sprt


def pair_stats(games: Iterable[GameRecord]) -> PairStats:
    """Pentanomial counts, mean score and Elo with its 95% interval; games 2k and 2k+1 are a pair.
    A pair with a game missing (a match stopped early) is left out."""
    scores: dict[int, list] = {}
    for g in games:
        scores.setdefault(g.index // 2, []).append(g.engine1_score())
    counts = [0] * 5
    for pair in scores.values():
        if len(pair) == 2:
            counts[round(2 * sum(pair))] += 1
    return pentanomial_stats(counts)


def sprt_state(games: Iterable[GameRecord], test: Sprt) -> dict:
    """The SPRT over the finished pairs of ``games`` (pentanomial): its settings, ``llr``, the
    ``lower``/``upper`` bounds, and ``decision``: "H1", "H0" or "inconclusive" (no bound reached)."""
    ps = pair_stats(games)
    value = test.llr_pentanomial(ps.counts)
    lower, upper = test.bounds
    return {
        "elo0": test.elo0,
        "elo1": test.elo1,
        "alpha": test.alpha,
        "beta": test.beta,
        "model": "pentanomial",
        "pairs": ps.pairs,
        "llr": value,
        "lower": lower,
        "upper": upper,
        "decision": test.verdict(value) or "inconclusive",
    }


def _finite(x: Optional[float], digits: int = 1) -> Optional[float]:
    return None if x is None or math.isinf(x) or math.isnan(x) else round(x, digits)


def interval_too_small(stats: "ScoreStats | PairStats") -> bool:
    """Whether the sample is too small for the normal approximation's 95% interval to mean anything:
    every game (or pair) scored the same (a zero-width interval: 2-0 gave [+inf, +inf], ten draws
    [0, 0]), or a bound falls outside the possible scores (-inf / +inf Elo)."""
    if stats.score is None:
        return False
    bounds = (stats.elo_low, stats.elo_high)
    return not stats.stderr or any(b is None or math.isinf(b) or math.isnan(b) for b in bounds)


def _ci95(stats: "ScoreStats | PairStats") -> list:
    """The 95% interval's bounds for JSON: both null when the sample is too small for one."""
    if interval_too_small(stats):
        return [None, None]
    return [_finite(stats.elo_low), _finite(stats.elo_high)]


def summary(result: MatchResult) -> dict:
    """All the numbers of a match as one JSON-ready dict (infinite Elo values are null)."""
    games = result.games
    w = sum(1 for g in games if g.engine1_score() == 1.0)
    l = sum(1 for g in games if g.engine1_score() == 0.0)
    d = len(games) - w - l
    st = score_stats(w, l, d)
    ps = pair_stats(games)

    def colour(white: bool) -> dict:
        sub = [g for g in games if g.engine1_white == white]
        return {
            "wins": sum(1 for g in sub if g.engine1_score() == 1.0),
            "losses": sum(1 for g in sub if g.engine1_score() == 0.0),
            "draws": sum(1 for g in sub if g.engine1_score() == 0.5),
        }

    terminations: dict = {}
    for g in games:
        terminations[g.termination] = terminations.get(g.termination, 0) + 1
    engines = []
    for i, spec in enumerate((result.config.engine1, result.config.engine2)):
        engines.append(
            {
                "name": result.names[i],
                "command": spec.command,
                "options": {k: v for k, v in result.options[i].items()},
                "nodes": spec.nodes,
                "limit": engine_limit(result.config.time_control, spec),
                **result.stats[i].as_dict(),
            }
        )
    cfg = result.config
    return {
        "engine1": engines[0],
        "engine2": engines[1],
        "games": len(games),
        "games_scheduled": cfg.games,
        "games_abandoned": result.abandoned,
        "wins": w,
        "losses": l,
        "draws": d,
        "score": None if st.score is None else round(st.score, 4),
        "score_pct": None if st.score is None else round(100 * st.score, 2),
        "elo": _finite(st.elo),
        "elo_ci95": _ci95(st),       # null bounds: the sample is too small for an interval
        "elo_infinite": None if st.elo is None or not math.isinf(st.elo) else ("+inf" if st.elo > 0 else "-inf"),
        "los": round(st.los, 4),
        "pairs": ps.pairs,
        "pentanomial": list(ps.counts),
        "pair_elo": _finite(ps.elo),
        "pair_elo_ci95": _ci95(ps),
        "engine1_white": colour(True),
        "engine1_black": colour(False),
        "terminations": terminations,
        "time_control": str(cfg.time_control),
        "concurrency": cfg.concurrency,
        "openings": cfg.openings_source or str(OPENINGS_PATH),
        "seed": result.seed,
        "pgn": cfg.pgn_path,
        "total_seconds": round(result.seconds, 2),
        "notes": result.notes,
        "sprt": None if cfg.sprt is None else sprt_state(games, cfg.sprt),
    }


def _elo_text(x: Optional[float]) -> str:
    if x is None:
        return "?"
    if math.isinf(x):
        return "+inf" if x > 0 else "-inf"
    return f"{x:+.1f}"


def _interval_text(stats: "ScoreStats | PairStats", unit: str) -> str:
    """``95% interval [low, high]``, or why there is none yet."""
    count = stats.games if isinstance(stats, ScoreStats) else stats.pairs
    if stats.score is None:
        return f"95% interval: none (no {unit}s)"
    if interval_too_small(stats):
        same = " that all scored the same" if not stats.stderr and count > 1 else ""
        return f"95% interval: sample too small ({count} {unit}{'s' if count != 1 else ''}{same})"
    return f"95% interval [{_elo_text(stats.elo_low)}, {_elo_text(stats.elo_high)}]"


def _sprt_text(sprt: dict, name1: str, s: dict) -> str:
    """The SPRT line of the summary: its test, LLR, bounds, decision and where the match stopped."""
    elo0, elo1 = _elo_text(sprt["elo0"]), _elo_text(sprt["elo1"])
    head = (f"SPRT [{elo0}, {elo1}] (alpha {sprt['alpha']:g}, beta {sprt['beta']:g}), pentanomial over "
            f"{sprt['pairs']} pairs: LLR {sprt['llr']:+.2f} in [{sprt['lower']:+.2f}, {sprt['upper']:+.2f}]: ")
    played = f"{s['games']} of {s['games_scheduled']} games played"
    if s["games_abandoned"]:
        played += f", {s['games_abandoned']} under way abandoned"
    decision = sprt["decision"]
    if decision == "inconclusive":
        return head + f"inconclusive ({played})"
    accepted, rejected = (elo1, elo0) if decision == "H1" else (elo0, elo1)
    return head + f"{decision} accepted, {name1} is {accepted} Elo rather than {rejected} ({played})"


def _speed_text(engine: dict) -> str:
    """One engine's median nodes and time a move, for comparing matches across machines."""
    if not engine["moves"]:
        return "no moves"
    nodes = engine["median_move_nodes"]
    said = "nodes not reported" if nodes is None else f"{nodes:,.0f} nodes"
    return f"{said} in {engine['median_move_seconds']:.3f} s"


def format_summary(result: MatchResult) -> str:
    s = summary(result)
    games = result.games
    w, l, d = s["wins"], s["losses"], s["draws"]
    st = score_stats(w, l, d)
    ps = pair_stats(games)
    n1, n2 = result.names
    width = max(len(n1), len(n2), 6)
    lines = [
        f"{n1} vs {n2}: {s['games']} games, {s['time_control']}, concurrency {s['concurrency']}, "
        f"openings {os.path.basename(s['openings'])} (seed {s['seed']})",
    ]
    if s["engine1"]["nodes"] is not None or s["engine2"]["nodes"] is not None:
        lines.append(f"limits: {n1} {s['engine1']['limit']}; {n2} {s['engine2']['limit']}")
    lines += [
        "",
        f"{'engine':<{width}}  {'wins':>5} {'losses':>6} {'draws':>5} {'score':>7}",
    ]
    for name, (ww, ll) in ((n1, (w, l)), (n2, (l, w))):
        pct = "?" if not games else f"{100 * (ww + 0.5 * d) / len(games):.1f}%"
        lines.append(f"{name:<{width}}  {ww:>5} {ll:>6} {d:>5} {pct:>7}")
    lines += [
        "",
        f"Elo difference ({n1} - {n2}): {_elo_text(st.elo)}, {_interval_text(st, 'game')}; "
        f"LOS {100 * st.los:.1f}%",
        f"pairs (same opening, colours reversed): {ps.pairs}, pentanomial 0/0.5/1/1.5/2 "
        f"{' '.join(str(c) for c in ps.counts)}; Elo from pairs {_elo_text(ps.elo)}, "
        f"{_interval_text(ps, 'pair')}",
        f"{n1} as White: +{s['engine1_white']['wins']} -{s['engine1_white']['losses']} ={s['engine1_white']['draws']}; "
        f"as Black: +{s['engine1_black']['wins']} -{s['engine1_black']['losses']} ={s['engine1_black']['draws']}",
        "",
        f"{'failures':<{width}}  {'time forfeits':>13} {'illegal moves':>13} {'crashes':>7} {'disconnects':>11} {'restarts':>8}",
    ]
    for name, e in ((n1, s["engine1"]), (n2, s["engine2"])):
        over = f"   (worst overshoot {e['max_overshoot_ms']:.0f} ms)" if e["max_overshoot_ms"] else ""
        lines.append(
            f"{name:<{width}}  {e['time_forfeits']:>13} {e['illegal_moves']:>13} {e['crashes']:>7} "
            f"{e['disconnects']:>11} {e['restarts']:>8}{over}"
        )
    lines += ["", "speed (median a move): " + "; ".join(
        f"{name} {_speed_text(e)}" for name, e in ((n1, s["engine1"]), (n2, s["engine2"])))]
    sprt = s["sprt"]
    if sprt is not None:
        lines += ["", _sprt_text(sprt, n1, s)]
    terms = ", ".join(f"{k} {v}" for k, v in sorted(s["terminations"].items())) or "none"
    lines += ["", f"terminations: {terms}", f"total time {s['total_seconds']:.1f} s"]
    if s["pgn"]:
        lines.append(f"PGN: {s['pgn']}")
    return "\n".join(lines)
