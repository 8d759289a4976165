"""How fast a run goes and when its next generation comes: the one estimator that
``cyzero-train status`` and the live display of ``cyzero-train run`` share.

It reads only what :func:`trainer.report.run_status` gathered (the replay manifest's
chunks, ``daemon.json``, ``workers.json``, ``learner.json``, the config), imports
nothing heavy, and gives a figure only from a rate that has settled; until then it
says ``measuring`` and why.

* **Self-play's speed** is the training positions the workers *play* a second, as each
  reports it over its last minute (``positions_per_s`` in ``workers.json``): a
  position counts when it is searched, so the games still in play count, not only
  the finished games in the store. The store's own rate lags far behind it at the
  start of a run: a CPU worker plays 64 games at once, and a generation-0 game of
  up to 300 plies takes many minutes, so for those minutes only the few short games
  have reached the store (a run on 2 cores read 121 games/h there, against about
  3,250 once its first games had ended). The rate is settled once every live worker
  has played for :data:`SETTLE_S`.
* **Games per hour** is that speed over the training positions a finished game
  holds. It is settled once the store holds as many games finished since the
  daemon's start as are in play at once (the first round of games has ended): the
  games that end first are the short ones, so an earlier average would be too short.
* **The next generation** comes when the learner has made its steps. The learner may
  draw ``replay.max_samples_per_position`` samples a training position; past what the
  store allows now, each step waits for self-play to add ``batch /
  max_samples_per_position`` training positions. So the time is the longer of the
  learner's (its steps at its samples/s, settled after :data:`LEARNER_SETTLE_STEPS`
  steps) and self-play's (the training positions still needed at self-play's speed,
  once the first round of games has ended, since until then the positions played
  reach the store only as their games end).

Without a running daemon the store's history stands in for the workers: games and
positions per second over its last :data:`RATE_SPAN_S` of self-play.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, Protocol

#: A worker's positions/s spans its last minute (``trainer.worker``): settled after one.
SETTLE_S = 60.0
#: The learner's samples/s is settled once measured over this many steps (the first ones start
#: the loader and warm the network up).
LEARNER_SETTLE_STEPS = 10
#: The store's rates (without a running daemon) are over its last this-many seconds of self-play.
RATE_SPAN_S = 600.0


class _Chunk(Protocol):
    positions: int
    games: int
    source: str
    time: float


def duration(seconds: float) -> str:
    """``seconds`` as a person reads a span: ``42 s``, ``3.5 min``, ``1.2 h``, ``2.0 d``."""
    seconds = max(0.0, seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds:.0f} s"


def selfplay_speed(chunks: Iterable[_Chunk], daemon: dict | None, workers: dict | None, *,
                   val_percent: float, max_plies: int, full_search_prob: float, now: float) -> dict | None:
    """Self-play's one speed (see the module docstring): ``positions_per_s`` (training positions
    played a second, games in play counted; None while measuring), ``training_positions_per_s``
    (the part not held out for validation), ``games_per_hour``, ``positions_per_game``,
    ``games_in_flight``, ``games_finished`` (since the daemon's start), ``first_games_done``,
    ``longest_game_s`` (a game of ``max_plies`` at the present pace), ``measuring`` (why a figure
    is missing, else None), ``running`` and ``source`` ("workers", or "store" when no daemon runs).
    None: no daemon and no self-play game in the store."""
    games = sorted((c for c in chunks if c.source == "selfplay"), key=lambda c: c.time)
    running = daemon is not None and daemon.get("alive") is not False
    training_share = 1.0 - max(0.0, min(val_percent, 100.0)) / 100.0
    out: dict[str, Any] = {
        "running": running, "source": "workers" if running else "store", "positions_per_s": None,
        "training_positions_per_s": None, "games_per_hour": None, "positions_per_game": None,
        "games_in_flight": None, "games_finished": 0, "first_games_done": False, "longest_game_s": None,
        "measuring": None, "over_s": None,
    }
    if not running:
        return _from_store(games, out, training_share) if games else None
    started = daemon.get("started") if daemon else None
    since = [c for c in games if not isinstance(started, (int, float)) or c.time >= started]
    out["games_finished"] = sum(c.games for c in since)
    recent = [c for c in since if c.time >= now - RATE_SPAN_S] or since
    if recent and sum(c.games for c in recent):
        out["positions_per_game"] = sum(c.positions for c in recent) / sum(c.games for c in recent)
    alive = [w for w in ((workers or {}).get("workers") or []) if w.get("alive")]
    if not alive:
        out["measuring"] = "no self-play worker is alive" if workers else "no word from the workers yet"
        return out
    in_flight = sum(int(w.get("playing") or 0) for w in alive)
    out["games_in_flight"] = in_flight
    out["first_games_done"] = in_flight > 0 and out["games_finished"] >= in_flight
    as_of = (workers or {}).get("time") or now
    young = [w for w in alive if isinstance(w.get("started"), (int, float)) and as_of - w["started"] < SETTLE_S]
    rate = sum(float(w.get("positions_per_s") or 0.0) for w in alive)
    if young or rate <= 0:
        out["measuring"] = (f"the workers' first {duration(SETTLE_S)} of play" if young
                            else "no position played lately")
        return out
    out["positions_per_s"] = rate
    out["training_positions_per_s"] = rate * training_share
    if full_search_prob > 0 and in_flight:
        out["longest_game_s"] = max_plies * full_search_prob * in_flight / rate
    if not out["first_games_done"]:
        out["measuring"] = (f"the first {in_flight:,} games are still in play ({out['games_finished']:,} finished"
                            + (f"; a game of {max_plies} plies takes {duration(out['longest_game_s'])} here"
                               if out["longest_game_s"] else "") + ")")
        return out
    if out["positions_per_game"]:
        out["games_per_hour"] = rate * 3600.0 / out["positions_per_game"]
    return out


def _from_store(games: list, out: dict, training_share: float) -> dict:
    """No daemon running: the store's last :data:`RATE_SPAN_S` of self-play, up to its newest game."""
    end = games[-1].time
    begin = max(end - RATE_SPAN_S, games[0].time)
    span = end - begin
    recent = [c for c in games if begin < c.time <= end]  # the first chunk's games ended before the span
    out["games_finished"] = sum(c.games for c in games)
    if span < 1.0 or not recent:
        out["measuring"] = "too few games stored to tell a rate"
        return out
    positions, count = sum(c.positions for c in recent), sum(c.games for c in recent)
    out.update(positions_per_s=positions / span, training_positions_per_s=positions / span * training_share,
               games_per_hour=count * 3600.0 / span, positions_per_game=positions / count if count else None,
               over_s=span, first_games_done=True)
    return out


def learner_rate(learner: dict, metrics: dict | None = None) -> float | None:
    """The learner's samples/s while training once settled (measured over :data:`LEARNER_SETTLE_STEPS`
    steps or more), else None; without a rate in ``learner.json``, the last log line's (``metrics``)."""
    rate, steps = learner.get("samples_per_s"), learner.get("rate_steps")
    if not rate and metrics:
        rate, steps = metrics.get("samples_per_s"), None
    if not isinstance(rate, (int, float)) or rate <= 0:
        return None
    return float(rate) if steps is None or steps >= LEARNER_SETTLE_STEPS else None


def next_generation(learner: dict | None, data: dict, selfplay: dict | None, metrics: dict | None,
                    *, max_samples_per_position: float) -> dict | None:
    """When the learner exports its next generation (see the module docstring): ``generation``,
    ``step``, ``steps_left``, ``eta_s`` (None while measuring), ``limited_by`` ("learner" or
    "selfplay"), ``measuring`` (why there is no time yet), ``steps_allowed_now``,
    ``data_steps_per_s``, ``learner_samples_per_s``. None: no learner running."""
    if not learner or not learner.get("running") or learner.get("step") is None or learner.get("state") == "exporting":
        return None  # exporting: the training line says which generation is on its way
    step, every, batch = learner["step"], learner.get("checkpoint_every"), learner.get("batch_size")
    if not every or not batch:
        return None
    at = learner.get("next_generation_step") or (step // every + 1) * every
    target = learner.get("target_step")
    if target is not None and target < at:
        at = target  # a --steps run exports at its end
    left = max(0, at - step)
    out: dict[str, Any] = {"generation": (learner.get("generation") or 0) + 1, "step": at, "steps_left": left,
                           "eta_s": None, "limited_by": None, "measuring": None, "steps_allowed_now": None,
                           "data_steps_per_s": None, "learner_samples_per_s": None}
    rate = learner_rate(learner, metrics)
    settled = rate is not None
    out["learner_samples_per_s"] = rate
    cap = learner.get("max_samples_per_position") or max_samples_per_position
    drawn = learner.get("samples_drawn") or 0
    allowed = math.floor((cap * data["training_positions"] - drawn) / batch)  # negative: games owed first
    out["steps_allowed_now"] = allowed
    learning = left * batch / rate if settled else None
    if left <= allowed:
        out["limited_by"] = "learner"
        out["eta_s"] = learning
        if learning is None and left:
            out["measuring"] = "the learner's samples/s"
        return out
    out["limited_by"] = "selfplay"
    speed = (selfplay or {}).get("training_positions_per_s")
    if not selfplay or not selfplay.get("running"):
        out["measuring"] = "no self-play running: the learner waits for games"
        return out
    if speed is None or not selfplay.get("first_games_done"):
        out["measuring"] = selfplay.get("measuring") or "self-play's speed"
        return out
    out["data_steps_per_s"] = speed * cap / batch
    waiting = (left - allowed) / out["data_steps_per_s"]
    out["eta_s"] = max(waiting, learning or 0.0)
    if learning is not None and learning > waiting:
        out["limited_by"] = "learner"
    return out


__all__ = ["selfplay_speed", "next_generation", "learner_rate", "duration", "SETTLE_S", "LEARNER_SETTLE_STEPS", "RATE_SPAN_S"]
