"""What a person reads about a run: ``cyzero-train status RUN`` and ``cyzero-train plot RUN``.

Both only read what the learner, the replay store, the daemon and the ladder wrote, through
:mod:`trainer.rundir` (the run folder's names and readers), so they work while a run is going
and never disturb it. Every file is optional (a learner-only run has no daemon files), and
another process may be writing them: a torn or garbled line or file is skipped, never an error.

``status`` answers at once: this module imports neither torch nor numpy nor the engine
(:mod:`trainer.rundir` and :mod:`trainer.config` have no dependencies), reads the manifest
without the game ids of its lines, and the logs from their ends. ``plot`` imports
matplotlib when it draws.
"""

from __future__ import annotations

import itertools
import math
import os
import re
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

from engine.announce import is_wildcard, rehost
from trainer.atomic import atomic_open
from trainer.config import TrainConfig, is_validation, load_effective_config, window_size
from trainer.estimate import learner_rate, next_generation, selfplay_speed
from trainer.estimate import duration as _duration
from trainer.rundir import (
    DAEMON_FILE, GATING_FILE, GENERATIONS_FILE, METRICS_FILE, PROGRESS_FILE, PUBLISHED_FILE, WORKERS_FILE, Chunk,
    as_int, as_number, as_text, check_run_dir, list_checkpoints, process_runs, read_evaluations, read_json_object,
    read_log, read_log_tail, read_manifest, read_ratings,
)

# --------------------------------------------------------------------------- small readers


def _ago(seconds: float) -> str:
    return f"{_duration(seconds)} ago"


def _number(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if math.isnan(value) or math.isinf(value):
        return str(value)
    return f"{value:,.4g}" if abs(value) < 1000 else f"{value:,.0f}"


# --------------------------------------------------------------------------- status


def run_status(run_dir: str | os.PathLike, now: float | None = None) -> dict:
    """The run's state as plain data (what ``status --json`` prints); ValueError for a folder that
    is not a run directory."""
    run_dir = check_run_dir(run_dir)
    now = time.time() if now is None else now
    config = _run_config(run_dir)
    chunks = read_manifest(run_dir)
    daemon_part = _daemon_status(run_dir)
    checkpoints = list_checkpoints(run_dir)
    generations = read_log_tail(os.path.join(run_dir, GENERATIONS_FILE), 2)
    metrics = read_log_tail(os.path.join(run_dir, METRICS_FILE), 1)
    checkpoint = None
    if checkpoints:
        try:
            checkpoint = {"step": checkpoints[-1][0], "path": checkpoints[-1][1],
                          "time": os.path.getmtime(checkpoints[-1][1])}
        except OSError:  # deleted meanwhile (keep_checkpoints)
            checkpoint = None
    data = _data_status(chunks, config)
    selfplay = selfplay_speed(chunks, daemon_part["daemon"], daemon_part["workers"],
                              val_percent=config.replay.val_percent, max_plies=config.selfplay.max_plies,
                              full_search_prob=config.selfplay.full_search_prob, now=now)
    learner = _learner_status(run_dir)
    return {
        "run": os.path.abspath(run_dir),
        "time": now,
        "data": data,
        "selfplay": selfplay,
        "learner": learner,
        "next_generation": next_generation(learner, data, selfplay, metrics[-1] if metrics else None,
                                           max_samples_per_position=config.replay.max_samples_per_position),
        "checkpoint": checkpoint,
        "generation": generations[-1] if generations else None,
        "previous_generation": generations[-2] if len(generations) > 1 else None,
        "metrics": metrics[-1] if metrics else None,
        **daemon_part,
        "evaluation": _newest_evaluation(run_dir),
        "ratings": read_ratings(run_dir),
    }


def _run_config(run_dir: str) -> TrainConfig:
    """The run's config in use (a config the user is editing, say, gives the defaults, not an error)."""
    try:
        return load_effective_config(run_dir)
    except ValueError:
        return TrainConfig()


def _data_status(chunks: list[Chunk], config: TrainConfig) -> dict:
    """What the store holds, the window (the newest training positions the learner samples) and how old it is."""
    w = config.replay
    by_source: Counter[str] = Counter()
    for c in chunks:
        by_source[c.source] += c.positions
    train = [c for c in chunks if not is_validation(c.name, w.val_percent)]
    train_positions = sum(c.positions for c in train)
    size = window_size(train_positions, floor=w.floor, alpha=w.alpha, beta=w.beta)
    inside, covered = [], 0
    for c in reversed(train):  # the window: the newest training chunks holding `size` positions
        if covered >= size:
            break
        inside.append(c)
        covered += c.positions
    total = sum(c.positions for c in chunks)
    return {
        "positions": total,
        "games": sum(c.games for c in chunks),
        "chunks": len(chunks),
        "by_source": dict(by_source),
        "training_positions": train_positions,
        "validation_positions": total - train_positions,
        "window": size,
        "window_floor": w.floor,
        "window_oldest_time": min((c.time for c in inside), default=None),
        "window_newest_time": max((c.time for c in inside), default=None),
        "window_generations": ([min(c.generation for c in inside), max(c.generation for c in inside)]
                               if inside else None),
        "newest_chunk_time": max((c.time for c in chunks), default=None),
        "newest_generation_played": max((c.generation for c in chunks), default=None),
    }


def _learner_status(run_dir: str) -> dict | None:
    """RUN/learner.json with every field checked, and ``running``: whether the process that wrote it
    is still the run's learner (None: the file is missing or garbled)."""
    record = read_json_object(os.path.join(run_dir, PROGRESS_FILE))
    if record is None or as_int(record.get("step")) is None:
        return None
    out: dict[str, Any] = {key: as_number(record.get(key)) for key in (
        "pid", "started", "time", "step", "target_step", "generation", "checkpoint_step", "checkpoint_every",
        "next_generation_step", "batch_size", "world", "samples_per_s", "rate_steps", "window_positions",
        "training_positions", "loader_samples_per_s", "loader_wait_share",
        "samples_drawn", "max_samples_per_position", "batches_available", "waiting_since", "waited_s")}
    state = record.get("state")
    out["state"] = state if state in ("training", "waiting", "exporting", "stopped") else None
    out["device"] = as_text(record.get("device"))
    out["follow"] = record.get("follow") is True
    out["running"] = False if out["state"] == "stopped" else process_runs(out["pid"], "learn", run_dir)
    return out


def _newest_evaluation(run_dir: str) -> list[dict] | None:
    """The last evaluation line of each opponent for the newest generation evaluated (None: none yet)."""
    rows = read_evaluations(run_dir)
    if not rows:
        return None
    newest = max(r["generation"] for r in rows)
    last = {r["opponent"]: r for r in rows if r["generation"] == newest}
    return [last[k] for k in sorted(last)]


def _worker(record: dict) -> dict:
    devices = record.get("devices")
    return {
        "id": as_text(record.get("id")) or "?",
        "host": as_text(record.get("host")),
        "pid": as_number(record.get("pid")),
        "devices": devices if isinstance(devices, str) else
        ",".join(d for d in devices if isinstance(d, str)) if isinstance(devices, list) else None,
        "local": record.get("local") is True,
        "alive": record.get("alive") is True,
        **{key: as_number(record.get(key)) for key in ("last_seen", "generation", "playing", "positions_per_s",
                                                  "games", "positions", "games_per_hour", "restarts",
                                                  "started")},
    }


def reachable(endpoint: str, addresses: Sequence[str]) -> list[str]:
    """A bound endpoint as a remote machine dials it: a wildcard host becomes each of ``addresses``
    (``trainer.endpoints.machine_addresses``); any other endpoint is itself."""
    if not is_wildcard(endpoint) or not addresses:
        return [endpoint]
    return [rehost(endpoint, address) for address in addresses]


def _daemon_status(run_dir: str) -> dict:
    """``daemon``, ``workers``, ``published`` and ``gating``: each None when its file is absent or
    unreadable. The daemon counts as running only when its pid is still ``cyzero-train run`` on
    this run (a pid may have been reused since)."""
    daemon_file = read_json_object(os.path.join(run_dir, DAEMON_FILE))
    daemon = None
    if daemon_file is not None:
        daemon = {"pid": as_number(daemon_file.get("pid")), "alive": process_runs(daemon_file.get("pid"), "run", run_dir),
                  "started": as_number(daemon_file.get("started")), "run": as_text(daemon_file.get("run")),
                  "keys": daemon_file.get("keys") is True}
        listed = daemon_file.get("addresses")
        addresses = [a for a in listed if isinstance(a, str) and a] if isinstance(listed, list) else []
        for key in ("endpoint", "publish", "fetch"):  # as a remote machine dials them, never 0.0.0.0 or *
            bound = as_text(daemon_file.get(key))
            daemon[key] = " or ".join(reachable(bound, addresses)[:2]) if bound else bound
    workers = read_json_object(os.path.join(run_dir, WORKERS_FILE))
    if workers is not None:
        rows = workers.get("workers")
        rows = [_worker(r) for r in rows if isinstance(r, dict)] if isinstance(rows, list) else []
        alive = [w for w in rows if w["alive"]]
        learner = workers.get("learner")
        learner = ({"pid": as_number(learner.get("pid")), "alive": learner.get("alive") is True,
                    "devices": as_text(learner.get("devices")), "restarts": as_number(learner.get("restarts")),
                    "started": as_number(learner.get("started"))} if isinstance(learner, dict) else None)
        devices = workers.get("devices")
        workers = {
            "learner": learner,
            "devices": {str(k): v for k, v in devices.items() if isinstance(v, dict)}
            if isinstance(devices, dict) else {},
            "time": as_number(workers.get("time")), "generation": as_number(workers.get("generation")),
            "games": as_number(workers.get("games")), "positions": as_number(workers.get("positions")),
            "workers": rows,
            "total": {"alive": len(alive), "known": len(rows),
                      "games": sum(w["games"] or 0 for w in rows),
                      "restarts": sum(w["restarts"] or 0 for w in rows)},
        }
    published = [r for r in read_log_tail(os.path.join(run_dir, PUBLISHED_FILE), 1)
                 if as_number(r.get("generation")) is not None]
    gating = [_gate(r) for r in read_log(os.path.join(run_dir, GATING_FILE)) if as_number(r.get("generation")) is not None]
    return {"daemon": daemon, "workers": workers,
            "published": published[-1] if published else None,
            "gating": gating[-1] if gating else None}


def _gate(record: dict) -> dict:
    """One gating.jsonl line with every number checked (non-finite or garbled: None)."""
    return {**{key: as_number(record.get(key)) for key in ("generation", "best", "wins", "draws", "losses", "games",
                                                      "llr", "lower", "upper", "elo", "elo_error", "time")},
            "accepted": record.get("accepted") is True, "reason": as_text(record.get("reason"))}


def _numeric_items(record: dict, skip: tuple[str, ...]) -> list[tuple[str, Any]]:
    return [(k, v) for k, v in record.items()
            if k not in skip and isinstance(v, (int, float)) and not isinstance(v, bool)]


def _span(first: float | None, last: float | None, now: float) -> str:
    if first is None or last is None:
        return ""
    if now - first < 1.0 or abs(last - first) < 1.0:
        return f", played {_ago(now - last)}"
    return f", played {_duration(now - first)} to {_ago(now - last)}"


def format_status(status: dict, now: float | None = None) -> str:
    """``status`` as the few lines a person wants to read."""
    now = time.time() if now is None else now
    d = status["data"]
    lines = [f"run {status['run']}"]
    if d["chunks"]:
        sources = ", ".join(f"{name} {n:,}" for name, n in sorted(d["by_source"].items()))
        lines.append(f"  data        {d['positions']:,} positions, {d['games']:,} games in {d['chunks']:,} "
                     f"chunk{'s' if d['chunks'] != 1 else ''}"
                     f" ({sources})")
        generations = d.get("window_generations")
        played_by = ("" if not generations else f" by generation {generations[0]}" if generations[0] == generations[1]
                     else f" by generations {generations[0]}-{generations[1]}")
        lines.append(f"  window      {d['window']:,} of {d['training_positions']:,} training positions"
                     f" (floor {d['window_floor']:,})"
                     f"{_span(d.get('window_oldest_time'), d.get('window_newest_time'), now)}{played_by}; "
                     f"{d['validation_positions']:,} held out for validation")
        lines.append(f"  newest data {_ago(now - d['newest_chunk_time'])}, "
                     f"played by generation {d['newest_generation_played']}")
    else:
        lines.append("  data        none yet: `cyzero-train bootstrap RUN ...` or self-play adds it")
    selfplay = status.get("selfplay")
    if selfplay:
        lines.append(f"  self-play   {describe_selfplay(selfplay)}")
    lines += _format_learner(status, now)
    checkpoint = status["checkpoint"]
    if checkpoint:
        lines.append(f"  checkpoint  step {checkpoint['step']:,} ({os.path.basename(checkpoint['path'])}, "
                     f"{_ago(now - checkpoint['time'])})")
    else:
        lines.append("  checkpoint  none yet: `cyzero-train learn RUN` (or `run RUN`) starts the learner")
    generation = status["generation"]
    if generation:
        sha = str(generation.get("sha256", ""))[:12]
        when = generation.get("time")
        lines.append(f"  network     generation {generation.get('generation')} at step {_number(generation.get('step', '?'))}"
                     f" ({generation.get('onnx')}, sha256 {sha}…"
                     + (f", {_ago(now - when)})" if isinstance(when, (int, float)) else ")"))
        val = generation.get("val") or {}
        previous = (status.get("previous_generation") or {}).get("val") or {}
        if isinstance(val, dict) and val:
            parts = []
            for key, value in _numeric_items(val, ()):
                before = previous.get(key) if isinstance(previous, dict) else None
                trend = f" (was {_number(before)})" if isinstance(before, (int, float)) else ""
                parts.append(f"{key} {_number(value)}{trend}")
            which = generation.get("weights")
            lines.append(f"  validation  generation {generation.get('generation')}'s network"
                         + (f" ({which} weights)" if isinstance(which, str) else "")
                         + " on the held-out positions, at its export: " + ", ".join(parts))
    metrics = status["metrics"]
    if metrics:
        step = metrics.get("step")
        items = _numeric_items(metrics, ("step", "time"))
        lines.append(f"  last log    step {_number(step)}, the weights in training (val_: on the held-out positions): "
                     + ", ".join(f"{k} {_number(v)}" for k, v in items))
    lines += _format_daemon(status, now)
    lines += _format_ladder(status, now)
    return "\n".join(lines)


def _format_ladder(status: dict, now: float) -> list[str]:
    """``ladder``: the newest rated generation's Elo on the ladder's scale and the anchors near it
    (RUN/ratings.json); ``evaluation``: the newest generation's matches so far."""
    lines = []
    ratings = status.get("ratings")
    if ratings and ratings["generations"]:
        newest = ratings["generations"][-1]
        first = ratings["generations"][0]
        when = []
        if newest["hours"] is not None:
            when.append(f"{newest['hours']:.1f} h")
        if newest["selfplay_games"] is not None:
            when.append(f"{newest['selfplay_games']:,} self-play games")
        anchors = ", ".join(f"{_anchor_name(name)} {r['elo']:+,.0f}" for name, r in
                            sorted(ratings["anchors"].items(), key=lambda item: item[1]["elo"]) if name != "random")
        gain = (f", {newest['elo'] - first['elo']:+,.0f} over generation {first['generation']}"
                if newest["generation"] != first["generation"] else "")
        lines.append(f"  ladder      generation {newest['generation']}: Elo {newest['elo']:+,.0f} "
                     f"[{newest['low']:+,.0f}, {newest['high']:+,.0f}] at {_opt(ratings['nodes'])} nodes, the random "
                     f"mover at 0{gain}" + (f" ({' and '.join(when)} into the run)" if when else "")
                     + (f"; anchors {anchors}" if anchors else ""))
    evaluation = status.get("evaluation")
    if evaluation:
        parts = []
        for r in evaluation:
            elo = ({1.0: "all won", 0.0: "all lost"}.get(r["score"], "Elo ?") if r["elo"] is None
                   else f"Elo {r['elo']:+.0f}" + (f" ± {r['elo_error']:.0f}" if r["elo_error"] is not None else ""))
            parts.append(f"vs {r['opponent']} {elo} (W/D/L {r['wins']}/{r['draws']}/{r['losses']})")
        when = max((r["time"] for r in evaluation if r["time"] is not None), default=None)
        lines.append(f"  evaluation  generation {evaluation[0]['generation']} at {evaluation[0]['nodes']:,} nodes: "
                     + ", ".join(parts) + (f", {_ago(now - when)}" if when is not None else ""))
    return lines


def _anchor_name(name: str) -> str:
    """A ladder player as a person reads it: ``sf-skill3`` is Stockfish skill 3, ``gen0`` generation 0."""
    match = re.fullmatch(r"sf-skill(\d+)", name)
    if match:
        return f"Stockfish skill {match.group(1)}"
    match = re.fullmatch(r"gen(\d+)", name)
    return f"generation {match.group(1)}" if match else "the random mover" if name == "random" else name


def _format_learner(status: dict, now: float) -> list[str]:
    """``training``: the learner's step, its rate and whether it waits for games; ``next gen``: when
    the next generation comes (both from RUN/learner.json)."""
    learner = status.get("learner")
    if not learner:
        return []
    step = _number(learner["step"])
    as_of = f"as of {_ago(now - learner['time'])}" if learner["time"] is not None else "time unknown"
    if learner["state"] == "stopped":
        return [f"  training    stopped at step {step}, {as_of}"]
    if learner["running"] is False:
        return [f"  training    not running: last seen at step {step}, {as_of} (it ended without a word: "
                "see logs/learner.log)"]
    metrics = status.get("metrics") or {}
    settled = learner_rate(learner, metrics)
    if settled is not None and learner["samples_per_s"]:
        rate = f"{settled:,.1f} samples/s while training"
    elif settled is not None:
        rate = f"{settled:,.1f} samples/s at the last log (step {_number(metrics.get('step'))})"
    elif learner["samples_per_s"]:
        rate = f"samples/s measuring ({_plural(learner['rate_steps'], 'step')} so far)"
    else:
        rate = "samples/s not measured yet"
    rate += describe_loader(learner)
    if learner["state"] == "exporting":
        return [f"  training    step {step}: writing its checkpoint and exporting generation "
                f"{_opt(learner['generation'])} ({as_of})"]
    if learner["state"] == "waiting":
        since = learner["waiting_since"]
        why = (f"at the sampling cap, replay.max_samples_per_position = {_number(learner['max_samples_per_position'])}"
               if learner["training_positions"] else "no training positions yet")
        doing = (f"waiting for self-play games{f' for {_duration(now - since)}' if since is not None else ''}"
                 f" ({why}); {rate}")
    else:
        doing = rate
    lines = [f"  training    step {step}: {doing} ({as_of})"]
    nxt = status.get("next_generation")
    if nxt:
        lines.append(f"  next gen    generation {nxt['generation']} at step {nxt['step']:,}, "
                     f"{_plural(nxt['steps_left'], 'step')} to go: {describe_next_generation(nxt, status)}")
    return lines


def describe_loader(learner: dict) -> str:
    """The replay loader beside the learner's rate, in words: what it could deliver and how much of
    the training time the learner waited for it, so that a person sees which one limits."""
    capacity, share = learner.get("loader_samples_per_s"), learner.get("loader_wait_share")
    if not capacity:
        return ""
    limit = "; the loader limits" if share is not None and share > 0.2 else ""
    waited = f", the learner waited for it {share:.0%} of its training time" if share is not None else ""
    return f" (the replay loader could deliver {capacity:,.0f}{waited}{limit})"


def describe_selfplay(selfplay: dict, *, short: bool = False) -> str:
    """Self-play's one speed (:func:`trainer.estimate.selfplay_speed`) in words: what ``status`` and
    the live display of ``cyzero-train run`` (``short``) say."""
    if selfplay["source"] == "store":
        if selfplay["positions_per_s"] is None:
            return f"{_plural(selfplay['games_finished'], 'game')} stored (no daemon running now)"
        return (f"{selfplay['positions_per_s']:,.1f} positions/s, {_number(round(selfplay['games_per_hour']))} "
                f"games/h stored in its last {_duration(selfplay['over_s'])} (no daemon running now)")
    finished, in_play = selfplay["games_finished"], selfplay["games_in_flight"]
    games = (f"{_plural(finished, 'game')} finished" + ("" if short else " since the daemon started")
             + (f", {in_play:,} in play" + ("" if short else " at once") if in_play else ""))
    why = "" if short or not selfplay["measuring"] else f": {selfplay['measuring']}"
    if selfplay["positions_per_s"] is None:
        return f"{games}; speed measuring{why}"
    speed = (f"{selfplay['positions_per_s']:,.1f} positions/s"
             + (" played" if short else " played (training positions; the games in play count)"))
    if selfplay["games_per_hour"] is None:
        rate = f"games/h measuring{why}"
    else:
        rate = f"{_number(round(selfplay['games_per_hour']))} games/h"
    return f"{games}; {speed}, {rate}"


def describe_next_generation(nxt: dict, status: dict, *, short: bool = False) -> str:
    """When the next generation comes (:func:`trainer.estimate.next_generation`) in words."""
    if nxt["eta_s"] is None:
        selfplay = status.get("selfplay") or {}
        if short and nxt["limited_by"] == "selfplay" and selfplay.get("games_in_flight") and not \
                selfplay.get("first_games_done"):
            return (f"measuring until the first {selfplay['games_in_flight']:,} games end "
                    f"({min(selfplay['games_finished'], selfplay['games_in_flight']):,} have)")
        return "measuring" + (f": {nxt['measuring']}" if nxt["measuring"] and not short else "")
    eta = f"in about {_duration(nxt['eta_s'])}"
    if short:
        return eta
    if nxt["limited_by"] == "learner":
        return f"{eta} (at the learner's pace)"
    selfplay = status.get("selfplay") or {}
    return (f"{eta} (self-play sets the pace: {selfplay.get('training_positions_per_s') or 0:,.1f} training "
            f"positions/s allow {nxt['data_steps_per_s'] * 60:,.1f} steps a minute)")


def describe_share(share: dict) -> str:
    """One device's share as a person reads it: ``1 self-play worker (256 games, network batches up
    to 1024) and learner rank(s) 1, sharing its time``."""
    parts = []
    workers = share.get("selfplay_workers") or 0
    if workers:
        batch = share.get("network_max_batch")
        parts.append(f"{workers} self-play worker{'s' if workers != 1 else ''} ({share.get('games_per_worker')} games"
                     + (f", network batches up to {batch}" if batch else "") + ")")
    ranks = share.get("learner_ranks") or 0
    if ranks:
        parts.append(f"{ranks} learner rank{'s' if ranks != 1 else ''}")
    text = " and ".join(parts) or "nothing"
    return text + (", sharing its time" if workers and ranks else "")


def _opt(value: Any, unknown: str = "?") -> str:
    return unknown if value is None else _number(value)


def _plural(n: Any, word: str) -> str:
    return f"{_opt(n)} {word}{'' if n == 1 else 's'}"


def _format_daemon(status: dict, now: float) -> list[str]:
    """The daemon, its workers, the generation published last and the last gating result (nothing for a
    run without a daemon)."""
    lines = []
    daemon = status.get("daemon")
    if daemon:
        state = {True: "running", False: "not running", None: "state unknown"}[daemon["alive"]]
        since = f", started {_ago(now - daemon['started'])}" if daemon["started"] is not None else ""
        lines.append(f"  daemon      pid {daemon['pid'] if daemon['pid'] is not None else '?'} {state}{since}; workers connect to "
                     f"{daemon['endpoint'] or '?'}, networks on {daemon['publish'] or '?'}"
                     f" (fetch {daemon['fetch'] or '?'}), keys {'on' if daemon['keys'] else 'off'}")
    workers = status.get("workers")
    stopped = daemon is not None and daemon["alive"] is False
    if workers:
        total = workers["total"]
        when = f", as of {_ago(now - workers['time'])}" if workers["time"] is not None else ""
        if stopped:
            when += ": the daemon is not running, so none is playing now"
        lines.append(f"  workers     {total['alive']} of {total['known']} alive: "
                     f"{_plural(total['games'], 'game')} stored, {_plural(total['restarts'], 'restart')}{when}")
        width = max(len(w["id"]) for w in workers["workers"]) if workers["workers"] else 0
        for w in workers["workers"]:
            where = f"{w['host'] or '?'}" + (f" {w['devices']}" if w["devices"] else "")
            state = "alive" if w["alive"] else "dead" if w["last_seen"] is not None else "silent"  # never heard
            speed = "?" if w["positions_per_s"] is None else f"{w['positions_per_s']:,.1f}"
            lines.append(f"    {w['id']:<{width}}  {state:<6} {where}, "
                         f"generation {_opt(w['generation'])}, {speed} positions/s played, "
                         f"{_opt(w['playing'])} games in play, {_plural(w['games'], 'game')} stored, "
                         f"{_plural(w['restarts'], 'restart')}")
    learner = workers.get("learner") if workers else None
    if learner:
        alive = learner["alive"] and not stopped
        lines.append(f"  learner     {'alive' if alive else 'not running'} on {learner['devices'] or '?'}"
                     + (f", pid {learner['pid']}" if learner["pid"] is not None and alive else "")
                     + f", {_plural(learner['restarts'] or 0, 'restart')}")
    if workers and workers.get("devices"):
        for device, share in workers["devices"].items():
            lines.append(f"  {device:<11} {describe_share(share)}")
    published = status.get("published")
    if published:
        when = published.get("time")
        lines.append(f"  published   generation {published['generation']} ({published.get('onnx', '?')}"
                     + (", gated" if published.get("gated") is True else "")
                     + (f", {_ago(now - when)})" if as_number(when) is not None else ")"))
    gate = status.get("gating")
    if gate:
        verdict = "accepted" if gate["accepted"] else "rejected"
        elo = (f", Elo {gate['elo']:+.0f}" + (f" ± {gate['elo_error']:.0f}" if gate["elo_error"] is not None else "")
               if gate["elo"] is not None else "")
        llr = (f"LLR {gate['llr']:.2f} in [{_opt(gate['lower'])}, {_opt(gate['upper'])}]"
               if gate["llr"] is not None else "LLR ?")
        reason = f" ({gate['reason']})" if gate["reason"] else ""
        when = f", {_ago(now - gate['time'])}" if gate["time"] is not None else ""
        lines.append(f"  gating      generation {_opt(gate['generation'])} vs {_opt(gate['best'])}: "
                     f"W/D/L {_opt(gate['wins'])}/{_opt(gate['draws'])}/{_opt(gate['losses'])}, {llr}: "
                     f"{verdict}{reason}{elo}{when}")
    return lines


# --------------------------------------------------------------------------- plot

#: The learner's metrics, by chart: (file, chart title, panels); a panel is (title, y label, series),
#: a series (metrics.jsonl key, legend label). A key no panel names goes to other.png, one panel each.
_LOSS_PANELS = (
    ("total loss", "loss", (("loss_total", "training"), ("val_total", "validation"))),
    ("policy loss (cross-entropy)", "loss", (("loss_policy", "training"), ("val_policy_ce", "validation"))),
    ("value loss (WDL cross-entropy)", "loss", (("loss_value", "training"), ("val_value_ce", "validation"))),
    ("moves-left loss (Huber, 20 plies a unit)", "loss",
     (("loss_moves_left", "training"), ("val_moves_left", "validation"))),
)
_CHARTS = (
    ("loss", "losses, training and validation", _LOSS_PANELS),
    ("validation", "validation", (("held-out positions where the network's top move is the search's most "
                                   "visited move", "share of positions", (("val_policy_top1", "validation"),)),)),
    ("learning_rate", "learning rate", (("learning rate", "lr", (("lr", "lr"), ("learning_rate", "lr"))),)),
    ("grad_norm", "gradient norm", (("gradient norm (before clipping)", "L2 norm", (("grad_norm", "grad norm"),)),)),
    ("throughput", "throughput, window and generation", (
        ("positions a second: trained, and what the replay loader could deliver",
         "samples/s (waits for games left out)",
         (("samples_per_s", "learner"), ("loader_samples_per_s", "replay loader"))),
        ("time the learner waited for the replay loader", "share of training time",
         (("loader_wait_share", "waiting for batches"),)),
        ("sampling window", "positions", (("window", "window"),)),
        ("generation exported", "generation", (("generation", "generation"),)),
    )),
)
_SPANS_DECADES = 30.0  # a panel's values this far apart (all positive): log scale
_COUNT_SPAN = 4     # an axis of steps, games or generations spans at least this many: a few whole numbers
_ELO_SPAN = 100.0   # an Elo axis spans at least this many
_HOURS_SPAN = 0.5   # elo.png's hours axis spans at least half an hour
_TIME_SPAN = 60.0   # data.png's time axis spans at least a minute (its shortest games/h bin)


def plot_run(run_dir: str | os.PathLike, out_dir: str | os.PathLike | None = None) -> list[str]:
    """PNG charts of a run, written atomically to ``out_dir`` (default RUN/plots); returns the files.

    From ``metrics.jsonl`` over learner steps: ``loss.png`` (one panel per loss head, training and
    validation), ``validation.png`` (policy top-1), ``learning_rate.png``, ``grad_norm.png``,
    ``throughput.png`` (samples/s, the window, the generation: a panel each) and ``other.png`` for
    any other metric. From the replay manifest over time: ``data.png`` (positions stored, games
    per hour), from the first chunk on. From ``gating.jsonl``: ``gating.png``; from the ladder's
    ``ratings.json``: ``elo.png``. Every point is drawn with a marker, so the first log line
    already shows; a panel whose values span decades has a log scale. ValueError: not a run
    directory, or nothing to draw yet."""
    run_dir = check_run_dir(run_dir)
    out_dir = os.fspath(out_dir) if out_dir is not None else os.path.join(run_dir, "plots")
    rows = [r for r in read_log(os.path.join(run_dir, METRICS_FILE)) if as_number(r.get("step")) is not None]
    chunks = read_manifest(run_dir)
    gates = [g for g in (_gate(r) for r in read_log(os.path.join(run_dir, GATING_FILE)))
             if g["generation"] is not None and g["elo"] is not None]
    ratings = read_ratings(run_dir)
    if ratings is not None and not ratings["generations"]:
        ratings = None
    if not rows and not chunks and not gates and not ratings:
        raise ValueError(f"{run_dir} has nothing to plot yet: no line in {METRICS_FILE} (the learner writes one "
                         f"every log.interval steps), no data in the replay store, no gating result, no ladder rating")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series: dict[str, list[tuple[float, float]]] = {}
    for row in rows:
        for key, value in _numeric_items(row, ("step", "time")):
            if math.isfinite(value):
                series.setdefault(key, []).append((row["step"], value))
    if rows:  # the generation exported at each step: generations.jsonl says (a log line at a checkpoint's
        exported = {}  # step is written just before that step's export, so it still names the one before)
        for r in read_log(os.path.join(run_dir, GENERATIONS_FILE)):
            if as_int(r.get("generation")) is not None and as_int(r.get("step")) is not None:
                exported[r["generation"]] = r["step"]
        if exported:
            series["generation"] = sorted((step, generation) for generation, step in exported.items())
    os.makedirs(out_dir, exist_ok=True)
    title = os.path.basename(os.path.abspath(run_dir))
    written: list[str] = []

    def save(fig, name: str) -> None:
        path = os.path.join(out_dir, f"{name}.png")
        with atomic_open(path, "wb") as f:
            fig.savefig(f, format="png", metadata={"Title": f"{title}: {name}", "Description": _describe(fig)})
        plt.close(fig)
        written.append(path)

    used: set[str] = set()
    for name, heading, panels in _CHARTS:
        chosen = []
        for panel_title, ylabel, keys in panels:
            lines = [(key, label, series[key]) for key, label in keys if key in series]
            used.update(key for key, _ in keys)
            if lines:
                chosen.append((panel_title, ylabel, lines))
        if chosen:
            if name == "loss" and not any(key.startswith("val_") for _, _, lines in chosen for key, _, _ in lines):
                heading = "losses, training (no validation yet: nothing held out in the store)"
            save(_panels(plt, f"{title}: {heading}", chosen, "learner step"), name)
    others = [(key.replace("_", " "), key, [(key, key, series[key])]) for key in sorted(series) if key not in used]
    if others:
        save(_panels(plt, f"{title}: other metrics", others, "learner step"), "other")
    if chunks:
        save(_data_chart(plt, chunks, title, _run_config(run_dir).replay.val_percent), "data")
    if gates:
        fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
        for accepted, style in ((True, dict(fmt="o", color="tab:green", label="accepted (published)")),
                                (False, dict(fmt="x", color="tab:red", label="rejected"))):
            chosen_gates = [g for g in gates if g["accepted"] is accepted]
            if chosen_gates:
                ax.errorbar([g["generation"] for g in chosen_gates], [g["elo"] for g in chosen_gates],
                            yerr=[g["elo_error"] or 0.0 for g in chosen_gates], capsize=3, linestyle="none",
                            **style)
        _readable_span(ax, "x", [g["generation"] for g in gates], _COUNT_SPAN, integer=True)
        _readable_span(ax, "y", [0.0] + [g["elo"] + sign * (g["elo_error"] or 0.0) for g in gates for sign in (-1, 1)],
                       _ELO_SPAN)
        ax.axhline(0.0, color="grey", linewidth=0.8)
        ax.set_xlabel("generation")
        ax.set_ylabel("Elo against the best (± error)")
        ax.set_title(f"{title}: gating")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        save(fig, "gating")
    if ratings:
        save(_elo_chart(plt, ratings, title), "elo")
    return written


def _describe(fig) -> str:
    """The chart in words, for the PNG's Description (an image viewer shows it; so do the tests):
    one line per panel, its title, scale and the series drawn (their metrics.jsonl keys)."""
    lines = []
    for ax in fig.axes:
        if not ax.get_visible():
            continue
        series = [str(line.get_gid() or line.get_label()) for line in ax.get_lines()
                  if not str(line.get_label()).startswith("_")]
        lines.append(f"{ax.get_title() or ax.get_ylabel()} ({ax.get_yscale()} scale): {', '.join(series)}")
    return "\n".join(lines)


def _readable_span(ax, axis: str, values: Sequence[float], least: float, *, integer: bool = False) -> None:
    """Give ``ax``'s ``axis`` ("x" or "y") at least ``least`` around ``values``, all its points (those
    of every panel sharing it): on its own matplotlib draws one point, or a few close together, on a
    sliver (-0.04..0.04 hours) that reads as an empty panel. A span that would reach
    below 0 from points that do not starts just below 0: steps, games and hours are never negative.
    ``integer``: whole-number ticks (steps, games, generations)."""
    from matplotlib.ticker import MaxNLocator

    if integer:
        getattr(ax, f"{axis}axis").set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
    low, high = min(values), max(values)
    if (high - low) * 1.1 >= least:
        return  # matplotlib's own limits, the points and a 5% margin, are wide enough
    start = (low + high - least) / 2
    if start < 0 <= low:
        start = -least / 20
    getattr(ax, f"set_{axis}lim")(start, start + least)


def _style_y(ax, values: Sequence[float], *, integer: bool = False, log: bool | None = None) -> None:
    """Log scale when the values (all positive) span decades (``log`` forces either); plain
    numbers everywhere, with thousands separators and as many decimals as the ticks' spacing needs
    (no offset or 1e6 factor a reader must apply)."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    positive = [v for v in values if v > 0]
    if log is None:
        log = bool(values) and len(positive) == len(values) and max(positive) / min(positive) >= _SPANS_DECADES
    if log:
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}" if v >= 1 else f"{v:g}"))
        ax.yaxis.set_minor_formatter(NullFormatter())
        return
    if integer:
        _readable_span(ax, "y", values, _COUNT_SPAN, integer=True)
    elif values and min(values) == max(values) == 0:
        ax.set_ylim(-0.05, 1.0)  # all zero so far (a share, a wait): an axis from 0 up, not -0.05..0.05

    def plain(v, _):
        locs = sorted(set(ax.yaxis.get_majorticklocs()))
        steps = [b - a for a, b in zip(locs, locs[1:]) if b > a]
        step = min(steps) if steps else abs(v)
        digits = next((d for d in range(9) if abs(round(step, d) - step) <= step * 1e-6), 9) if step > 0 else 0
        return f"{v:,.{digits}f}"

    ax.yaxis.set_major_formatter(FuncFormatter(plain))


def _panels(plt, heading: str, panels: list, xlabel: str):
    """One figure, one panel per quantity (stacked, or two columns from four panels), sharing x;
    each series drawn with markers so that a single point shows."""
    n = len(panels)
    cols = 2 if n >= 4 else 1
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(8 if cols == 1 else 11, 1.2 + 2.6 * rows), dpi=100,
                             sharex=True, squeeze=False)
    flat = [ax for row in axes for ax in row]
    for ax, (panel_title, ylabel, lines) in zip(flat, panels):
        lines_by_label = [(label, points) for _, label, points in lines]
        values: list[float] = []
        for key, label, points in lines:
            xs, ys = zip(*points)
            style = "steps-post" if ylabel == "generation" else "default"
            ax.plot(xs, ys, marker="o", markersize=3.5 if len(points) < 200 else 1.5, linewidth=1.2,
                    drawstyle=style, label=label, gid=key)
            values += ys
        found = overfitting(*(dict(lines_by_label).get(k) for k in ("training", "validation"))) \
            if len(lines) == 2 else None
        if found is not None:  # what over-fitting looks like, said where it shows
            ax.axvline(found, color="tab:red", linestyle=":", linewidth=1.2)
            panel_title += f": over-fitting from step {found:,.0f}"
            ax.annotate("validation up, training down", (found, 1.0), xycoords=("data", "axes fraction"),
                        xytext=(4, -12), textcoords="offset points", fontsize=8, color="tab:red")
        ax.set_title(panel_title, fontsize=10, **({"color": "tab:red"} if found is not None else {}))
        ax.set_ylabel(ylabel)
        _style_y(ax, values, integer=ylabel == "generation")
        ax.grid(alpha=0.3)
        if len(lines) > 1:
            ax.legend(fontsize=8)
    # the panels share x: one span from every panel's steps, so that none hides another's points
    _readable_span(flat[0], "x", [x for _, _, lines in panels for _, _, points in lines for x, _ in points],
                   _COUNT_SPAN, integer=True)
    for ax in flat[n:]:
        ax.set_visible(False)
    for ax in flat[max(0, n - cols):n]:
        ax.set_xlabel(xlabel)
        ax.tick_params(labelbottom=True)
    fig.suptitle(heading)
    fig.tight_layout()
    return fig


OVERFIT_RISE = 0.10  # validation this far (a share) above its lowest, while training fell: over-fitting


def overfitting(training: list | None, validation: list | None) -> float | None:
    """The step from which a loss over-fits, or None: the held-out loss at each of the last two log
    lines is at least :data:`OVERFIT_RISE` above its lowest point before them (that point's step is
    returned), while the training loss at the last line is below where it was then. Two lines, not
    one: a young run's held-out sample is drawn again as it grows, and one line jumps with it. Both
    are (step, loss) series."""
    if not training or not validation or len(validation) < 4:
        return None
    best_step, best = min(validation[:-2], key=lambda point: point[1])
    last_step = validation[-1][0]
    if best <= 0 or any(loss < best * (1 + OVERFIT_RISE) for _, loss in validation[-2:]):
        return None
    before = [loss for step, loss in training if step <= best_step]
    after = [loss for step, loss in training if step >= last_step - 1e-9]
    if not before or not after or after[-1] >= before[-1]:
        return None
    return float(best_step)


def _data_chart(plt, chunks: list[Chunk], title: str, val_percent: float):
    """The replay store over time: positions stored (by source, and those held out for validation)
    and self-play games finished per hour."""
    start = min(c.time for c in chunks)
    span = max(c.time for c in chunks) - start
    unit, size = (("hours", 3600.0) if span >= 3 * 3600 else ("minutes", 60.0) if span >= 180
                  else ("seconds", 1.0))
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6.4), dpi=100, sharex=True)
    ordered = sorted(chunks, key=lambda c: c.time)
    times = [(c.time - start) / size for c in ordered]
    values: list[float] = []
    for source in sorted({c.source for c in ordered}):
        xs, ys, total = [], [], 0
        for c in ordered:
            if c.source == source:
                total += c.positions
                xs.append((c.time - start) / size)
                ys.append(total)
        top.plot(xs, ys, marker="o", markersize=3 if len(xs) < 200 else 1, linewidth=1.2, label=source,
                 gid=f"positions:{source}")
        values += ys
    held = list(itertools.accumulate(c.positions if is_validation(c.name, val_percent) else 0 for c in ordered))
    if any(held):
        top.plot(times, held, marker="o", markersize=3 if len(held) < 200 else 1, linewidth=1.2, color="tab:red",
                 label="held out for validation (all sources)", gid="positions:validation")
    top.set_title("positions in the replay store", fontsize=10)
    top.set_ylabel("positions")
    _style_y(top, values, log=False)  # a running total: its growth reads best on a linear scale
    top.grid(alpha=0.3)
    top.legend(fontsize=8)
    games = [c for c in ordered if c.source == "selfplay"]
    # A rate counts the games finished after the first self-play chunk, from its time on: the first
    # chunk's own games took a time before it that no chunk records (counted, one chunk of 8 games
    # read as 28,800 games/h).
    counted = games[1:]
    if counted:
        width = max(span / 40, 60.0)  # ~40 bins, none shorter than a minute
        origin, end = games[0].time - start, counted[-1].time - start
        bins: dict[int, int] = {}
        for c in counted:
            bins[int((c.time - start) // width)] = bins.get(int((c.time - start) // width), 0) + c.games
        first, last = int(origin // width), max(bins)

        def within(k: int) -> tuple[float, float]:
            """Bin k's start and length, from the first chunk up to the newest game at the ends."""
            begin = max(k * width, origin)
            return begin, max(min((k + 1) * width, end) - begin, 1.0)

        spans = {k: within(k) for k in range(first, last + 1)}
        # a first or last bin shorter than half a bin joins its neighbour (a few seconds' count is noise)
        for short, into in ((last, last - 1), (first, first + 1)):
            if len(spans) > 1 and short in spans and spans[short][1] < width / 2:
                bins[into] = bins.get(into, 0) + bins.pop(short, 0)
                begin = min(spans[into][0], spans[short][0])
                spans[into] = (begin, spans[into][1] + spans.pop(short)[1])
        spans = dict(sorted(spans.items()))
        centres = [(begin + seconds / 2) / size for begin, seconds in spans.values()]
        rates = [bins.get(k, 0) * 3600.0 / seconds for k, (_, seconds) in spans.items()]
        bottom.plot(centres, rates, marker="o", markersize=3, linewidth=1.2, color="tab:green",
                    label="selfplay games/h", gid="selfplay_games_per_hour")
        times = times + centres  # a new list: the held-out line drew the one before
        bottom.set_title(f"self-play games finished per hour (in {_duration(width)} bins; games in play not counted)",
                         fontsize=10)
        _style_y(bottom, rates, log=False)
        bottom.set_ylim(bottom=0)
    elif games:
        bottom.text(0.5, 0.5, f"{games[0].games:,} self-play games in the first chunk: a rate needs the next",
                    ha="center", va="center", transform=bottom.transAxes)
        bottom.set_title("self-play games per hour", fontsize=10)
    else:
        bottom.text(0.5, 0.5, "no self-play games yet", ha="center", va="center", transform=bottom.transAxes)
        bottom.set_title("self-play games per hour", fontsize=10)
    _readable_span(top, "x", times, _TIME_SPAN / size)
    bottom.set_ylabel("games/h")
    bottom.set_xlabel(f"{unit} since the first chunk")
    bottom.grid(alpha=0.3)
    fig.suptitle(f"{title}: data")
    fig.tight_layout()
    return fig


def _elo_chart(plt, ratings: dict, title: str):
    """The ladder (RUN/ratings.json): each generation's Elo with its 95% interval, against the hours
    since generation 0 and against the self-play games played before it, the random mover at 0 and
    Stockfish's levels as dashed lines, so that two runs' curves can be laid side by side."""
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), dpi=100, sharey=True)
    curve = ratings["generations"]
    for ax, key, label, least in ((axes[0], "hours", "hours since generation 0", _HOURS_SPAN),
                                  (axes[1], "selfplay_games", "self-play games played before the generation",
                                   _COUNT_SPAN)):
        points = [c for c in curve if c[key] is not None]
        if points:
            ax.errorbar([c[key] for c in points], [c["elo"] for c in points],
                        yerr=[[c["elo"] - c["low"] for c in points], [c["high"] - c["elo"] for c in points]],
                        fmt="o-", capsize=3, color="tab:blue", label="generations")
            _readable_span(ax, "x", [c[key] for c in points], least, integer=key == "selfplay_games")
        for name, anchor in sorted(ratings["anchors"].items()):
            if name.startswith("sf-"):
                ax.axhline(anchor["elo"], color="tab:red", linestyle="--", linewidth=0.8)
                ax.annotate(_anchor_name(name), (0.01, anchor["elo"]), xycoords=("axes fraction", "data"),
                            fontsize=7, color="tab:red", va="bottom")
        ax.axhline(0.0, color="grey", linewidth=0.8)
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
    _readable_span(axes[0], "y", [0.0] + [c[k] for c in curve for k in ("low", "high")]
                   + [a["elo"] for name, a in ratings["anchors"].items() if name.startswith("sf-")], _ELO_SPAN)
    axes[0].set_ylabel("Elo (random mover 0, ± 95%)")
    axes[0].legend(fontsize=8)
    fig.suptitle(f"{title}: the strength ladder at {_opt(ratings['nodes'])} nodes a move")
    fig.tight_layout()
    return fig


__all__ = ["run_status", "format_status", "describe_selfplay", "describe_next_generation", "describe_share",
           "plot_run"]
