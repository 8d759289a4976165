"""What a person reads about a run: ``cyzero-train status RUN`` and ``cyzero-train plot RUN``.

Both only read what the learner and the replay store wrote (``metrics.jsonl``,
``generations.jsonl``, the replay manifest, the checkpoint folder), so they work
while a run is going and never disturb it. The files are append-only logs that
another process may be writing: a torn last line is skipped, not an error. The
run directory's layout is described in ``docs/training.md``.
"""

from __future__ import annotations

import math
import os
import time
from collections import Counter
from typing import Any

from trainer.atomic import atomic_open, read_jsonl
from trainer.config import load_run_config
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
    generations = list(read_jsonl(os.path.join(run_dir, GENERATIONS_FILE)))
    metrics = list(read_jsonl(os.path.join(run_dir, METRICS_FILE)))
    checkpoints = list_checkpoints(run_dir)
    return {
        "run": os.path.abspath(run_dir),
        "data": data,
        "checkpoint": {"step": checkpoints[-1][0], "path": checkpoints[-1][1],
                       "time": os.path.getmtime(checkpoints[-1][1])} if checkpoints else None,
        "generation": generations[-1] if generations else None,
        "previous_generation": generations[-2] if len(generations) > 1 else None,
        "metrics": metrics[-1] if metrics else None,
    }


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
        lines.append("  checkpoint  none yet: `cyzero-train learn RUN` starts the learner")
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
    return "\n".join(lines)


# Which chart a metric goes on: the first group whose test its name passes.
_CHART_GROUPS = (
    ("validation", lambda k: k.startswith("val")),
    ("learning_rate", lambda k: k in ("lr", "learning_rate")),
    ("throughput", lambda k: k.endswith("per_s") or k.endswith("/s") or k in ("samples_s", "window", "generation")),
    ("loss", lambda k: True),
)


def plot_run(run_dir: str | os.PathLike, out_dir: str | os.PathLike | None = None) -> list[str]:
    """PNG charts of ``metrics.jsonl`` over training steps (losses, learning rate, validation,
    throughput); returns the files written (atomically) to ``out_dir`` (default RUN/plots)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_dir = os.fspath(run_dir)
    out_dir = os.fspath(out_dir) if out_dir is not None else os.path.join(run_dir, "plots")
    rows = [r for r in read_jsonl(os.path.join(run_dir, METRICS_FILE)) if isinstance(r.get("step"), (int, float))]
    if not rows:
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
    written = []
    for group, keys in groups.items():
        fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
        for key in sorted(keys):
            steps, values = zip(*series[key])
            ax.plot(steps, values, label=key, linewidth=1.2)
        ax.set_xlabel("step")
        ax.set_title(f"{os.path.basename(os.path.abspath(run_dir))}: {group.replace('_', ' ')}")
        if group == "learning_rate":
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = os.path.join(out_dir, f"{group}.png")
        with atomic_open(path, "wb") as f:
            fig.savefig(f, format="png")
        plt.close(fig)
        written.append(path)
    return written


__all__ = ["run_status", "format_status", "plot_run"]
