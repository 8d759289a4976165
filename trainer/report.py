"""What a person reads about a run: ``cyzero-train status RUN`` and ``cyzero-train plot RUN``.

Both only read what the learner, the replay store and the daemon wrote
(``metrics.jsonl``, ``generations.jsonl``, the replay manifest, the checkpoint
folder; ``daemon.json``, ``workers.json``, ``published.jsonl``, ``gating.jsonl``;
``evaluation.jsonl`` from ``cyzero-train evaluate``),
so they work while a run is going and never disturb it. Every one of them is
optional (a learner-only run has no daemon files), and another process may be
writing them: a torn or garbled line or file is skipped, never an error. The run
directory's layout is described in ``docs/training.md``.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections import Counter
from typing import Any

from trainer.atomic import atomic_open, read_jsonl
from trainer.config import load_run_config
from trainer.daemon import DAEMON_FILE, GATING_FILE, PUBLISHED_FILE, WORKERS_FILE, describe_share
from trainer.evaluate import read_evaluations
from trainer.learner import GENERATIONS_FILE, METRICS_FILE, list_checkpoints
from trainer.replay import ReplayStore, is_validation, window_size


def _ago(seconds: float) -> str:
    seconds = max(0.0, seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f} {unit} ago"
    return f"{seconds:.0f} s ago"


def _number(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if math.isnan(value) or math.isinf(value):
        return str(value)
    return f"{value:,.4g}" if abs(value) < 1000 else f"{value:,.0f}"


def run_status(run_dir: str | os.PathLike) -> dict:
    """The run's state as plain data (what ``status --json`` prints)."""
    run_dir = os.fspath(run_dir)
    if not os.path.isdir(run_dir):
        raise FileNotFoundError(f"no run directory {run_dir}")
    config = load_run_config(run_dir)
    window = config.replay
    entries = ReplayStore(run_dir).entries()
    train = [e for e in entries if not is_validation(e.name, window.val_percent)]
    by_source: Counter[str] = Counter()
    for e in entries:
        by_source[e.source] += e.positions
    train_positions = sum(e.positions for e in train)
    data = {
        "positions": sum(e.positions for e in entries),
        "games": sum(e.games for e in entries),
        "chunks": len(entries),
        "by_source": dict(by_source),
        "training_positions": train_positions,
        "validation_positions": sum(e.positions for e in entries) - train_positions,
        "window": window_size(train_positions, floor=window.floor, alpha=window.alpha, beta=window.beta),
        "window_floor": window.floor,
        "newest_chunk_time": max((e.time for e in entries), default=None),
        "newest_generation_played": max((e.generation for e in entries), default=None),
    }
    generations = _log(os.path.join(run_dir, GENERATIONS_FILE))
    metrics = _log(os.path.join(run_dir, METRICS_FILE))
    checkpoints = list_checkpoints(run_dir)
    return {
        "run": os.path.abspath(run_dir),
        "data": data,
        "checkpoint": {"step": checkpoints[-1][0], "path": checkpoints[-1][1],
                       "time": os.path.getmtime(checkpoints[-1][1])} if checkpoints else None,
        "generation": generations[-1] if generations else None,
        "previous_generation": generations[-2] if len(generations) > 1 else None,
        "metrics": metrics[-1] if metrics else None,
        **_daemon_status(run_dir),
        "evaluation": _newest_evaluation(run_dir),
    }


def _newest_evaluation(run_dir: str) -> list[dict] | None:
    """The last evaluation line of each opponent for the newest generation evaluated (None: none yet)."""
    rows = read_evaluations(run_dir)
    if not rows:
        return None
    newest = max(r["generation"] for r in rows)
    last = {r["opponent"]: r for r in rows if r["generation"] == newest}
    return [last[k] for k in sorted(last)]


def _log(path: str) -> list[dict]:
    """``read_jsonl``, and nothing rather than an error for a log that is not UTF-8 text or not a file."""
    try:
        return read_jsonl(path)
    except (OSError, ValueError):
        return []


def _read_json(path: str) -> dict | None:
    """A JSON object file, or None when it is missing, unreadable or not an object (a reader never
    fails on what a writer left)."""
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _num(value: Any) -> int | float | None:
    """A finite number, or None (so a garbled field shows as unknown and ``--json`` stays valid JSON)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return value if math.isfinite(value) else None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _pid_alive(pid: Any) -> bool | None:
    """Whether process ``pid`` exists on this machine (None: not a pid)."""
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, under another user
        return True
    except OSError:
        return None
    return True


def _worker(record: dict) -> dict:
    devices = record.get("devices")
    return {
        "id": _text(record.get("id")) or "?",
        "host": _text(record.get("host")),
        "pid": _num(record.get("pid")),
        "devices": devices if isinstance(devices, str) else
        ",".join(d for d in devices if isinstance(d, str)) if isinstance(devices, list) else None,
        "local": record.get("local") is True,
        "alive": record.get("alive") is True,
        **{key: _num(record.get(key)) for key in ("last_seen", "generation", "playing", "positions_per_s",
                                                  "games", "positions", "games_per_hour", "restarts",
                                                  "started")},
    }


def _daemon_status(run_dir: str) -> dict:
    """``daemon``, ``workers``, ``published`` and ``gating``: each None when its file is absent or
    unreadable."""
    daemon = _read_json(os.path.join(run_dir, DAEMON_FILE))
    if daemon is not None:
        daemon = {"pid": _num(daemon.get("pid")), "alive": _pid_alive(daemon.get("pid")),
                  "started": _num(daemon.get("started")), "run": _text(daemon.get("run")),
                  **{key: _text(daemon.get(key)) for key in ("endpoint", "publish", "fetch")},
                  "keys": daemon.get("keys") is True}
    workers = _read_json(os.path.join(run_dir, WORKERS_FILE))
    if workers is not None:
        rows = workers.get("workers")
        rows = [_worker(r) for r in rows if isinstance(r, dict)] if isinstance(rows, list) else []
        alive = [w for w in rows if w["alive"]]
        learner = workers.get("learner")
        learner = ({"pid": _num(learner.get("pid")), "alive": learner.get("alive") is True,
                    "devices": _text(learner.get("devices")), "restarts": _num(learner.get("restarts")),
                    "started": _num(learner.get("started"))} if isinstance(learner, dict) else None)
        devices = workers.get("devices")
        workers = {
            "learner": learner,
            "devices": {str(k): v for k, v in devices.items() if isinstance(v, dict)}
            if isinstance(devices, dict) else {},
            "time": _num(workers.get("time")), "generation": _num(workers.get("generation")),
            "games": _num(workers.get("games")), "positions": _num(workers.get("positions")),
            "workers": rows,
            "total": {"alive": len(alive), "known": len(rows),
                      "games_per_hour": sum(w["games_per_hour"] or 0 for w in alive),
                      "positions_per_s": sum(w["positions_per_s"] or 0 for w in alive),
                      "games": sum(w["games"] or 0 for w in rows),
                      "restarts": sum(w["restarts"] or 0 for w in rows)},
        }
    published = [r for r in _log(os.path.join(run_dir, PUBLISHED_FILE))
                 if _num(r.get("generation")) is not None]
    gating = [_gate(r) for r in _log(os.path.join(run_dir, GATING_FILE))
              if _num(r.get("generation")) is not None]
    return {"daemon": daemon, "workers": workers,
            "published": published[-1] if published else None,
            "gating": gating[-1] if gating else None}


def _gate(record: dict) -> dict:
    """One gating.jsonl line with every number checked (non-finite or garbled: None)."""
    return {**{key: _num(record.get(key)) for key in ("generation", "best", "wins", "draws", "losses", "games",
                                                      "llr", "lower", "upper", "elo", "elo_error", "time")},
            "accepted": record.get("accepted") is True, "reason": _text(record.get("reason"))}


def _numeric_items(record: dict, skip: tuple[str, ...]) -> list[tuple[str, Any]]:
    return [(k, v) for k, v in record.items()
            if k not in skip and isinstance(v, (int, float)) and not isinstance(v, bool)]


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
        lines.append(f"  window      {d['window']:,} of {d['training_positions']:,} training positions"
                     f" (floor {d['window_floor']:,}); {d['validation_positions']:,} held out for validation")
        lines.append(f"  newest data {_ago(now - d['newest_chunk_time'])}, "
                     f"played by generation {d['newest_generation_played']}")
    else:
        lines.append("  data        none yet: `cyzero-train bootstrap RUN ...` or self-play adds it")
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
        lines.append(f"  network     generation {generation.get('generation')} at step {generation.get('step', '?'):,}"
                     f" ({generation.get('onnx')}, sha256 {sha}…"
                     + (f", {_ago(now - when)})" if isinstance(when, (int, float)) else ")"))
        val = generation.get("val") or {}
        previous = (status.get("previous_generation") or {}).get("val") or {}
        if val:
            parts = []
            for key, value in _numeric_items(val, ()):
                before = previous.get(key)
                trend = f" (was {_number(before)})" if isinstance(before, (int, float)) else ""
                parts.append(f"{key} {_number(value)}{trend}")
            lines.append("  validation  " + ", ".join(parts))
    metrics = status["metrics"]
    if metrics:
        step = metrics.get("step")
        items = _numeric_items(metrics, ("step", "time"))
        lines.append(f"  last log    step {_number(step)}: " + ", ".join(f"{k} {_number(v)}" for k, v in items))
    lines += _format_daemon(status, now)
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
    return "\n".join(lines)


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
    if workers:
        total = workers["total"]
        when = f", as of {_ago(now - workers['time'])}" if workers["time"] is not None else ""
        if daemon and daemon["alive"] is False:
            when += ": the daemon is not running, so none is playing now"
        lines.append(f"  workers     {total['alive']} of {total['known']} alive: "
                     f"{_number(round(total['games_per_hour']))} games/h, "
                     f"{_number(round(total['positions_per_s']))} positions/s; "
                     f"{_plural(total['games'], 'game')}, {_plural(total['restarts'], 'restart')}{when}")
        width = max(len(w["id"]) for w in workers["workers"]) if workers["workers"] else 0
        for w in workers["workers"]:
            where = f"{w['host'] or '?'}" + (f" {w['devices']}" if w["devices"] else "")
            state = "alive" if w["alive"] else "dead" if w["last_seen"] is not None else "silent"  # never heard
            lines.append(f"    {w['id']:<{width}}  {state:<6} {where}, "
                         f"generation {_opt(w['generation'])}, "
                         f"{_opt(None if w['games_per_hour'] is None else round(w['games_per_hour']))} games/h, "
                         f"{_opt(None if w['positions_per_s'] is None else round(w['positions_per_s']))} "
                         f"positions/s, {_plural(w['games'], 'game')}, {_plural(w['restarts'], 'restart')}")
    learner = workers.get("learner") if workers else None
    if learner:
        lines.append(f"  learner     {'alive' if learner['alive'] else 'not running'} on {learner['devices'] or '?'}"
                     + (f", pid {learner['pid']}" if learner["pid"] is not None else "")
                     + f", {_plural(learner['restarts'] or 0, 'restart')}")
    if workers and workers.get("devices"):
        for device, share in workers["devices"].items():
            lines.append(f"  {device:<11} {describe_share(share)}")
    published = status.get("published")
    if published:
        when = published.get("time")
        lines.append(f"  published   generation {published['generation']} ({published.get('onnx', '?')}"
                     + (", gated" if published.get("gated") is True else "")
                     + (f", {_ago(now - when)})" if _num(when) is not None else ")"))
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


# Which chart a metric goes on: the first group whose test its name passes.
_CHART_GROUPS = (
    ("validation", lambda k: k.startswith("val")),
    ("learning_rate", lambda k: k in ("lr", "learning_rate")),
    ("throughput", lambda k: k.endswith("per_s") or k.endswith("/s") or k in ("samples_s", "window", "generation")),
    ("loss", lambda k: True),
)


def plot_run(run_dir: str | os.PathLike, out_dir: str | os.PathLike | None = None) -> list[str]:
    """PNG charts of ``metrics.jsonl`` over training steps (losses, learning rate, validation,
    throughput), of ``gating.jsonl`` (``gating.png``: Elo against the best per generation) and of
    ``evaluation.jsonl`` (``elo.png``: Elo against generation 0 and a random mover per generation);
    returns the files written (atomically) to ``out_dir`` (default RUN/plots)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_dir = os.fspath(run_dir)
    out_dir = os.fspath(out_dir) if out_dir is not None else os.path.join(run_dir, "plots")
    rows = [r for r in _log(os.path.join(run_dir, METRICS_FILE)) if isinstance(r.get("step"), (int, float))]
    gates = [g for g in (_gate(r) for r in _log(os.path.join(run_dir, GATING_FILE)))
             if g["generation"] is not None and g["elo"] is not None]
    evaluations = read_evaluations(run_dir)
    if not rows and not gates and not evaluations:
        raise ValueError(f"{os.path.join(run_dir, METRICS_FILE)} has no metrics yet: nothing to plot")
    series: dict[str, list[tuple[float, float]]] = {}
    for row in rows:
        for key, value in _numeric_items(row, ("step", "time")):
            if math.isfinite(value):
                series.setdefault(key, []).append((row["step"], value))
    groups: dict[str, list[str]] = {}
    for key in series:
        group = next(name for name, test in _CHART_GROUPS if test(key))
        groups.setdefault(group, []).append(key)
    os.makedirs(out_dir, exist_ok=True)
    title = os.path.basename(os.path.abspath(run_dir))
    written = []

    def save(fig, name: str) -> None:
        path = os.path.join(out_dir, f"{name}.png")
        with atomic_open(path, "wb") as f:
            fig.savefig(f, format="png")
        plt.close(fig)
        written.append(path)

    for group, keys in groups.items():
        fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
        for key in sorted(keys):
            steps, values = zip(*series[key])
            ax.plot(steps, values, label=key, linewidth=1.2)
        ax.set_xlabel("step")
        ax.set_title(f"{title}: {group.replace('_', ' ')}")
        if group == "learning_rate":
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        save(fig, group)
    if gates:
        fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
        for accepted, style in ((True, dict(fmt="o", color="tab:green", label="accepted (published)")),
                                (False, dict(fmt="x", color="tab:red", label="rejected"))):
            chosen = [g for g in gates if g["accepted"] is accepted]
            if chosen:
                ax.errorbar([g["generation"] for g in chosen], [g["elo"] for g in chosen],
                            yerr=[g["elo_error"] or 0.0 for g in chosen], capsize=3, linestyle="none", **style)
        _elo_axes(fig, ax, "Elo against the best (± error)", f"{title}: gating")
        save(fig, "gating")
    if evaluations:
        save(_elo_chart(plt, evaluations, title), "elo")
    return written


def _elo_chart(plt, evaluations: list[dict], title: str):
    """Elo per generation against each opponent with its 95% error bar. A score of 0 or 1 has no
    finite Elo: it is drawn as a triangle at the bound half a game less (more) would give. Each
    node count is its own series (the newest line of a generation and opponent counts)."""
    from engine.tools.match import elo_from_score

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    latest = {(r["generation"], r["opponent"], r["nodes"]): r for r in evaluations if r["games"] > 0}
    colours = {"gen0": "tab:blue", "random": "tab:orange"}
    for opponent in ("gen0", "random"):
        for nodes in sorted({n for _, o, n in latest if o == opponent}):
            chosen = sorted((r for (g, o, n), r in latest.items() if o == opponent and n == nodes),
                            key=lambda r: r["generation"])
            label = f"vs {'generation 0' if opponent == 'gen0' else 'random mover'}, {nodes:,} nodes"
            finite = [r for r in chosen if r["elo"] is not None]
            if finite:
                ax.errorbar([r["generation"] for r in finite], [r["elo"] for r in finite],
                            yerr=[r["elo_error"] or 0.0 for r in finite], fmt="o-", capsize=3,
                            color=colours[opponent], label=label)
            labelled = bool(finite)  # one legend entry per series
            for r in chosen:
                if r["elo"] is None:
                    points = r["wins"] + 0.5 * r["draws"]
                    up = points * 2 >= r["games"]
                    bound = elo_from_score((points + (-0.5 if up else 0.5)) / r["games"])
                    ax.plot([r["generation"]], [bound], marker="^" if up else "v", color=colours[opponent],
                            linestyle="none", label=None if labelled else label)
                    labelled = True
    _elo_axes(fig, ax, "Elo (± 95%; triangle: all won or lost, a bound)",
              f"{title}: Elo against generation 0 and a random mover")
    return fig


def _elo_axes(fig, ax, ylabel: str, title: str) -> None:
    """The finish both Elo-per-generation charts share: the zero line, labels, grid, legend."""
    ax.axhline(0.0, color="grey", linewidth=0.8)
    ax.set_xlabel("generation")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()


__all__ = ["run_status", "format_status", "plot_run"]
