"""``cyzero-train bench fleet``: a simulated fleet against the real daemon, to measure what one daemon serves.

The daemon is the real one (:mod:`trainer.fleet_daemon`): ``cyzero-train run RUN --port auto`` with
no local worker and no learner, started here (``--profile``: under cProfile), or one already serving
a run this bench made (``--attach``). The fleet is simulated, light enough that this one process
stands in for 64 workers on 2 cores:

* N workers (:mod:`trainer.fleet_workers`): one DEALER each (a CurveZMQ client when the run has
  keys), all on one thread and one ``zmq.Poller``. Each registers, heartbeats and sends its games
  as :mod:`trainer.worker` does (credit, acks, resends), on a schedule: game k due k / rate seconds
  after the start, dealt round-robin, each a real wire message made from one of a few games made once.
* M followers (:mod:`trainer.fleet_followers`), all on one thread: a SUB each for the announcements
  and, for each newer generation, a DEALER that fetches its bytes in pieces with credit as
  :class:`engine.watchers.TrainerFollower` does (:mod:`engine.announce`'s protocol), checks the
  size and sha256 and counts the swap; the daemon's peak memory is read for each generation's
  fetches (its VmHWM, reset when the generation is first heard). The generations are written here as the
  learner writes them (``networks/gen-NNNNN.onnx`` atomically, then a line in
  ``generations.jsonl``), of ``--network-mb`` random bytes: a transfer costs the same
  whatever the bytes mean, and nothing here loads them.
* psutil samples the daemon's CPU and resident memory and this process's own; the schedule's
  lag and the fleet thread's CPU say when this generator, not the daemon, is the bottleneck.

At the end every acknowledged game id is looked up in the store's manifest (:mod:`trainer.fleet_store`):
each must be there exactly once. This module runs it all and reports: the inputs checked, the progress
line, the figures and the summary. The bench writes synthetic games and networks into its run, so it
only runs on a new folder or one it made (its config file marks it).
"""

from __future__ import annotations

import collections
import dataclasses
import math
import os
import shutil
import sys
import tempfile
import threading
import time
from typing import Any, Callable, Optional

import numpy as np
import psutil

from engine.announce import MAX_NETWORK_BYTES, fetch_memory_bound, load_client_keys
from engine.watchers import FETCH_TIMEOUT_S
from trainer.atomic import append_jsonl, atomic_write_bytes, atomic_write_text, read_jsonl, sha256_bytes
from trainer.fleet_daemon import (
    BENCH_CONFIG, SAMPLE_S, DaemonProcess, Restart, Sampler, peak_rss, profile_by_function, thread_cpu,
)
from trainer.fleet_followers import Followers
from trainer.fleet_store import check_store, manifest_adds, store_state
from trainer.fleet_workers import MAX_POSITIONS_PER_GAME, POSITIONS_PER_GAME, Fleet, template_games

__all__ = ["GAMES_PER_HOUR_PER_WORKER", "FleetResult", "bench_fleet", "format_fleet_report"]

# A worker's games an hour: what two GPU stand-in workers played together on 2 cores, 16,620 (see
# docs/gpu.md, "Figures on the stand-in"), taken for each of the fleet's workers, which have a GPU
# and cores of their own: 64 of them send about 295 games/s.
GAMES_PER_HOUR_PER_WORKER = 16_600
REGISTER_TIMEOUT_S = 60.0
DRAIN_S = 60.0            # after the schedule, the longest wait for the last acks
PROGRESS_S = 5.0
# The run's files as trainer.learner lays them out (importing it would cost this process torch).
GENERATIONS = "generations.jsonl"
NETWORK = os.path.join("networks", "gen-%05d.onnx")


def _stderr(line: str) -> None:
    print(f"bench fleet: {line}", file=sys.stderr, flush=True)


def _stats(values: Any) -> dict:
    """min, p50, p99 and max of ``values`` (None each when empty)."""
    array = np.asarray(values, dtype=np.float64)
    if array.size == 0:
        return {"min": None, "p50": None, "p99": None, "max": None}
    return {"min": float(array.min()), "p50": float(np.percentile(array, 50)),
            "p99": float(np.percentile(array, 99)), "max": float(array.max())}


def write_generation(run_dir: str, size: int, seed: int) -> dict:
    """A synthetic generation of ``size`` random bytes, as the learner exports one: the file atomically
    under networks/, then its line in generations.jsonl (which the daemon polls); returns the line."""
    lines = read_jsonl(os.path.join(run_dir, GENERATIONS))
    generation = 1 + max((r["generation"] for r in lines if isinstance(r.get("generation"), int)), default=-1)
    data = np.random.default_rng(seed).bytes(size)
    path = os.path.join(run_dir, NETWORK % generation)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    atomic_write_bytes(path, data)
    record = {"generation": generation, "step": 0, "onnx": os.path.relpath(path, run_dir), "sha256": sha256_bytes(data),
              "time": time.time(), "weights": "raw", "val": {}, "synthetic": "bench fleet: random bytes"}
    append_jsonl(os.path.join(run_dir, GENERATIONS), record)
    return record


# --------------------------------------------------------------------------- the bench


@dataclasses.dataclass(frozen=True)
class FleetResult:
    """The report's figures (JSON), the ids of every game the daemon acknowledged, and whether nothing
    went wrong (``figures["problems"]`` says what did)."""

    figures: dict
    acked_ids: frozenset
    ok: bool


def _machine() -> dict:
    model = "?"
    flags: list[str] = []
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and model == "?":
                    model = value.strip()
                elif key.strip() == "flags" and not flags:
                    flags = sorted(v for v in value.split() if v.startswith(("avx", "sha_ni")))
    except OSError:
        pass
    return {"cpu": model, "flags": flags, "cores": os.cpu_count(), "load_at_start": list(os.getloadavg()),
            "memory_gb": psutil.virtual_memory().total / 1e9}


def _check_count(name: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be a whole number >= {low}, got {value!r}")
    return value


def _check_inputs(workers: int, followers: int, positions: int, seconds: float, rate: Optional[float],
                  per_worker: float, generations: Optional[int], network_mb: float, attach: bool, curve: bool,
                  profile: Optional[str]) -> tuple[float, int, int]:
    """(the fleet's games/s, generations, network bytes) from the arguments; ValueError for a bad one."""
    _check_count("--workers", workers, 0)
    _check_count("--followers", followers, 0)
    if _check_count("--positions-per-game", positions, 1) > MAX_POSITIONS_PER_GAME:
        raise ValueError(f"--positions-per-game must be at most {MAX_POSITIONS_PER_GAME}, got {positions}")
    if workers == 0 and followers == 0:
        raise ValueError("nothing to simulate: give --workers or --followers")
    if not (isinstance(seconds, (int, float)) and math.isfinite(seconds) and 0 < seconds <= 3600):
        raise ValueError(f"--seconds must be more than 0 and at most 3600, got {seconds!r}")
    if rate is None:
        if not (math.isfinite(per_worker) and per_worker > 0):
            raise ValueError(f"--games-per-hour-per-worker must be more than 0, got {per_worker!r}")
        rate = workers * per_worker / 3600.0
    elif not (math.isfinite(rate) and rate > 0):
        raise ValueError(f"--rate must be more than 0 games/s, got {rate!r}")
    generations = _check_count("--generations", (1 if followers else 0) if generations is None else generations, 0)
    size = 0
    if generations:
        if not (math.isfinite(network_mb) and 0 < network_mb * 1e6 <= MAX_NETWORK_BYTES):
            raise ValueError(f"--network-mb must be more than 0 and at most the {MAX_NETWORK_BYTES / 1e6:,.0f} MB a "
                             f"fetch accepts (engine.announce.MAX_NETWORK_BYTES), got {network_mb!r}")
        size = max(1, round(network_mb * 1e6))
        need = 2 * fetch_memory_bound(followers) + 2 * size
        available = psutil.virtual_memory().available
        if need > 0.8 * available:
            raise ValueError(f"{followers} followers of a {size / 1e6:,.0f} MB network may want {need / 1e9:,.1f} GB "
                             f"(the daemon and the followers each hold up to engine.announce.fetch_memory_bound, "
                             f"{fetch_memory_bound(followers) / 1e9:,.1f} GB, and the network is made in memory), "
                             f"more than 80% of the {available / 1e9:,.1f} GB available: use fewer --followers")
    if attach and (curve or profile):
        raise ValueError("--curve and --profile start a daemon; --attach uses the one serving the run")
    return rate, generations, size


def bench_fleet(*, run_dir: Optional[str] = None, config: Optional[str] = None, workers: int = 64,
                rate: Optional[float] = None, games_per_hour_per_worker: float = GAMES_PER_HOUR_PER_WORKER,
                positions_per_game: int = POSITIONS_PER_GAME, seconds: float = 60.0, followers: int = 0,
                network_mb: float = 10.0, generations: Optional[int] = None, attach: bool = False,
                curve: bool = False, profile: Optional[str] = None, kill_at: Optional[float] = None,
                log: Callable[[str], None] = _stderr) -> FleetResult:
    """Run the simulated fleet against the daemon for ``seconds`` and check the store; see the module.

    ``run_dir``: the run (None: a new temporary folder, removed at the end); ``config``: the started
    daemon's config (a bundled name or a file; default: the run's), without the ladder and gating;
    ``rate``: the fleet's games/s (None: ``workers`` x ``games_per_hour_per_worker``); ``generations``:
    new networks of ``network_mb`` MB published over the run (None: one when there are followers);
    ``curve``: the started daemon gets CurveZMQ keys; ``profile``: the daemon runs under cProfile,
    which writes this file; ``kill_at``: the daemon is SIGKILLed this many seconds into the run and
    started again (:class:`trainer.fleet_daemon.Restart`). ValueError for bad input, RuntimeError when
    the daemon cannot be used."""
    from trainer.config import default_config, load_config, load_effective_config, load_named_config, to_toml

    rate, generations, size = _check_inputs(workers, followers, positions_per_game, seconds, rate,
                                            games_per_hour_per_worker, generations, network_mb, attach, curve, profile)
    if kill_at is not None:
        if not (isinstance(kill_at, (int, float)) and math.isfinite(kill_at) and 0 < kill_at < seconds):
            raise ValueError(f"--kill-at must fall within the run: more than 0 and less than --seconds ({seconds:g}), "
                             f"got {kill_at!r}")
        if attach or profile or followers or not workers:
            raise ValueError("--kill-at kills the daemon the bench starts and measures its workers' return: it takes "
                             "--workers, and not --attach, --profile or --followers")
    temporary = run_dir is None
    run_dir = os.path.abspath(run_dir or tempfile.mkdtemp(prefix="cyzero-fleet-"))
    restart: Optional[Restart] = None
    daemon: Optional[DaemonProcess] = None
    fleet: Optional[Fleet] = None
    follow: Optional[Followers] = None
    sampler: Optional[Sampler] = None
    try:
        marker = os.path.join(run_dir, BENCH_CONFIG)
        if (attach or (os.path.isdir(run_dir) and os.listdir(run_dir))) and not os.path.exists(marker):
            raise ValueError(f"{run_dir} is not a run this bench made (no {BENCH_CONFIG}): it writes synthetic games "
                             "and networks into its run, so it takes a new folder or one it made")
        if attach:
            cfg = load_effective_config(run_dir)
        else:
            cfg = load_named_config(config) if config else load_config(marker) if os.path.exists(marker) else \
                default_config()
            cfg = cfg.replace(ladder={"enabled": False}, gating={"enabled": False},
                              daemon={"keys": "keys"} if curve else {})
            os.makedirs(run_dir, exist_ok=True)
            atomic_write_text(marker, to_toml(cfg))
        machine = _machine()
        templates = template_games(cfg.model.input_format, positions_per_game,
                                   full_search_prob=cfg.selfplay.full_search_prob, visits=cfg.selfplay.visits) \
            if workers else []
        daemon = proc = DaemonProcess(run_dir, attach=attach, profile=profile, log=log)
        live = {"daemon": proc}   # the daemon serving now: another after a --kill-at restart
        restart = Restart(proc, cfg, kill_at, log) if kill_at is not None else None
        keys = None
        if proc.info.get("keys"):
            folder = os.path.expanduser(cfg.daemon.keys)
            keys = load_client_keys(os.path.join(folder if os.path.isabs(folder) else os.path.join(run_dir, folder),
                                                 "clients", "local"))
        before = store_state(run_dir)
        threads_before = thread_cpu(proc.pid)   # after a --kill-at restart: the new daemon's, when it serves
        sampler = Sampler(proc.pid, threading.get_native_id())
        follow = Followers(proc.info["publish"], followers, keys, proc.pid) if followers else None
        state = {"generation": 0}
        fleet = Fleet(proc.info["endpoint"], workers, rate, templates, keys, lambda: state["generation"]) \
            if workers else None
        problems: list[str] = []
        progress = {"next": 0.0, "acked": 0, "at": time.monotonic()}

        def tick(now: float) -> bool:
            """Watch the daemon and the followers, say where the run is; False stops the run."""
            if restart is not None and fleet is not None:
                if fleet.t0 and restart.due(now, fleet.t0):
                    restart.kill(fleet.acked_ids)
                if restart.error is not None:
                    problems.append(f"the daemon did not start again after the kill: {restart.error}")
                    return False
                if not restart.restarting and restart.daemon is not live["daemon"]:
                    live["daemon"] = restart.daemon
                    sampler.follow(restart.daemon.pid)
                    threads_before.clear()
                    threads_before.update(thread_cpu(restart.daemon.pid))
                    log(f"the daemon serves again (pid {restart.daemon.pid}), "
                        f"{restart.serving_at - restart.killed_at:.1f} s after the kill")
            code = None if restart is not None and restart.restarting else live["daemon"].exited()
            if code is not None:
                problems.append(f"the daemon exited (code {code}) during the run: {live['daemon'].tail()}")
                return False
            if follow is not None:
                if follow.error is not None:
                    problems.append(f"the followers' thread failed: {type(follow.error).__name__}: {follow.error}")
                    return False
                state["generation"] = max(state["generation"], follow.newest())
            if now >= progress["next"]:
                log(_progress_line(now, fleet, follow, sampler, progress))
                progress["next"] = now + PROGRESS_S
            return True

        if fleet is not None:
            try:
                fleet.register(REGISTER_TIMEOUT_S, tick)
            except RuntimeError as e:
                raise RuntimeError("; ".join([str(e), *problems])) from None
            state["generation"] = next((w.registered.generation or 0 for w in fleet.workers if w.registered), 0)
        log(f"{workers} workers at {rate:,.1f} games/s in all, {followers} followers, for {seconds:g} s")
        t0, wall0 = time.monotonic(), time.time()
        published: list[tuple[dict, float]] = []
        publisher = threading.Thread(target=_publish, name="bench-fleet-generations", daemon=True,
                                     args=(run_dir, generations, size, t0, seconds, published, problems, log))
        publisher.start()
        if fleet is not None:
            fleet.t0 = t0
            fleet.serve(t0 + seconds, schedule=True, tick=tick)
        else:
            _idle(t0 + seconds, tick)
        schedule_end = time.monotonic()
        drain_start = time.monotonic()
        if fleet is not None and not problems:
            fleet.serve(drain_start + DRAIN_S, schedule=False, tick=tick, until_empty=True)
        drain_s = time.monotonic() - drain_start
        publisher.join()
        proc = live["daemon"]
        if follow is not None:  # the last fetches (heartbeats go on meanwhile)
            deadline = time.monotonic() + FETCH_TIMEOUT_S + 10.0
            while not problems and not all(follow.done(r["generation"]) for r, _ in published) \
                    and time.monotonic() < deadline:
                if fleet is not None:
                    fleet.serve(time.monotonic() + 0.5, schedule=False, tick=tick)
                else:
                    _idle(time.monotonic() + 0.5, tick)
        threads_after = thread_cpu(proc.pid)
        peak = peak_rss(proc.pid)
        if fleet is not None:
            fleet.close()
        if follow is not None:
            follow.close()
        stopped = proc.stop()
        sampler.close()
        profile_top = profile_by_function(profile) if profile and os.path.isfile(profile) else None
        store = check_store(run_dir, fleet.acked_ids if fleet else set(), before, (wall0, wall0 + seconds))
        timeline = _timeline(fleet, sampler, t0, seconds)
        figures: dict[str, Any] = {
            "machine": machine,
            "run_dir": "(a temporary folder, removed)" if temporary else run_dir,
            "config": config or ("the run's" if not temporary else "the defaults"),
            "fleet": {"workers": workers, "rate_games_per_s": rate, "seconds": seconds, "followers": followers,
                      "games_per_hour_per_worker": rate * 3600.0 / workers if workers else None,
                      "positions_per_game": float(np.mean([len(t.records) for t in templates])) if templates else None,
                      "input_format": cfg.model.input_format},
            "timeline": timeline,
            "ingest": _ingest_figures(fleet, seconds, drain_s, timeline) if fleet else None,
            "generator": _generator_figures(fleet, sampler, t0, schedule_end),
            "daemon": _daemon_figures(proc, sampler, t0, seconds, threads_before, threads_after, peak, stopped,
                                      profile, profile_top),
            "store": store,
            "followers": _follower_figures(follow, published, sampler, size) if follow else None,
        }
        if restart is not None:
            figures["restart"] = restart.figures(fleet, rate)
            counts = collections.Counter(i for r in manifest_adds(run_dir) for i in r.get("game_ids") or [])
            figures["restart"]["acked_before_kill_stored"] = sum(counts[i] == 1 for i in restart.acked_before)
        figures["problems"] = problems + _problems(figures)
        return FleetResult(figures, frozenset(fleet.acked_ids if fleet else ()), not figures["problems"])
    finally:
        if fleet is not None:
            fleet.close()
        if follow is not None:
            follow.close()
        for started in {daemon, restart.daemon if restart is not None else None} - {None}:
            if started.exited() is None:
                started.stop()
        if sampler is not None:
            sampler.close()
        if temporary:
            shutil.rmtree(run_dir, ignore_errors=True)


def _idle(until: float, tick: Callable[[float], bool]) -> bool:
    """Tick about once a second until ``until``; False when a tick stopped the run."""
    while time.monotonic() < until:
        if not tick(time.monotonic()):
            return False
        time.sleep(min(1.0, max(0.0, until - time.monotonic())))
    return True


def _publish(run_dir: str, generations: int, size: int, t0: float, seconds: float, published: list,
             problems: list, log: Callable[[str], None]) -> None:
    """Write the run's synthetic generations, spread evenly over the run (the i-th at i/(K+1) of it)."""
    for i in range(generations):
        wait = t0 + seconds * (i + 1) / (generations + 1) - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        try:
            record = write_generation(run_dir, size, seed=i)
        except OSError as e:
            problems.append(f"generation not written: {e}")
            return
        published.append((record, time.monotonic()))
        log(f"wrote generation {record['generation']} ({size / 1e6:,.1f} MB of random bytes)")


def _progress_line(now: float, fleet: Optional[Fleet], follow: Optional[Followers], sampler: Optional[Sampler],
                   progress: dict) -> str:
    parts = []
    if fleet is not None and fleet.t0:
        acked = len(fleet.acks)
        rate = (acked - progress["acked"]) / max(now - progress["at"], 1e-9)
        progress["acked"], progress["at"] = acked, now
        parts.append(f"{now - fleet.t0:5.0f} s: {fleet.made:,} games made, {acked:,} acknowledged ({rate:,.1f}/s "
                     f"lately), {fleet.held_total:,} awaiting acks")
    if sampler is not None and sampler.cpu:
        _, daemon_cpu, bench_cpu, _, machine = sampler.cpu[-1]
        parts.append(f"daemon {daemon_cpu:.0f}% CPU, {sampler.rss[-1][1] / 1e6:,.0f} MB; bench {bench_cpu:.0f}% CPU; "
                     f"machine {machine:.0f}%")
    if follow is not None:
        parts.append(f"followers at generation {follow.newest()}, {len(follow.results)} fetches done")
    return "; ".join(parts) or "starting"


# --------------------------------------------------------------------------- figures


def _window(samples: list, t0: float, t1: float) -> list:
    return [s for s in samples if t0 <= s[0] <= t1]


def _timeline(fleet: Optional[Fleet], sampler: Sampler, t0: float, seconds: float, parts: int = 10) -> list[dict]:
    """The run in ``parts`` equal spans: games acknowledged a second, the daemon's mean CPU and last RSS,
    this process's mean CPU."""
    points = []
    for i in range(1, parts + 1):
        a, b = seconds * (i - 1) / parts, seconds * i / parts
        acks = [x for x in (fleet.acks if fleet else []) if a < x[0] <= b]
        cpu = _window(sampler.cpu, t0 + a, t0 + b)
        rss = _window(sampler.rss, t0 + a, t0 + b)
        points.append({"t_s": b, "acked_games_per_s": len(acks) / (b - a),
                       "acked_positions_per_s": sum(x[1] for x in acks) / (b - a),
                       "daemon_cpu_percent": float(np.mean([s[1] for s in cpu])) if cpu else None,
                       "daemon_rss_mb": rss[-1][1] / 1e6 if rss else None,
                       "bench_cpu_percent": float(np.mean([s[2] for s in cpu])) if cpu else None})
    return points


def _ingest_figures(fleet: Fleet, seconds: float, drain_s: float, timeline: list[dict]) -> dict:
    times = np.array([a[0] for a in fleet.acks])
    positions = np.array([a[1] for a in fleet.acks])
    inside = times <= seconds
    return {
        "dealt": fleet.issued, "made": fleet.made, "sent": fleet.sent, "paused_at_bound": fleet.paused,
        "credit_waits": fleet.credit_waits, "credit_at_end": _stats([w.credit for w in fleet.workers]),
        "unsendable": fleet.unsendable,
        "resends": fleet.resends, "no_room": fleet.no_room, "acked": len(fleet.acked_ids),
        "acked_games_per_s": float(inside.sum()) / seconds,
        "acked_positions_per_s": float(positions[inside].sum()) / seconds,
        "offered_games_per_s": fleet.made / seconds,
        "games_per_s_by_span": _stats([p["acked_games_per_s"] for p in timeline[1:]]),  # the first: flushes to come
        "ack_latency_s": _stats([a[2] for a in fleet.acks]),
        "made_to_ack_s": _stats([a[3] for a in fleet.acks]),
        "unacked_at_end": fleet.held_total, "drain_s": drain_s, "repeated_acks": fleet.repeated_acks,
        "refused": len(fleet.refused), "refused_reasons": sorted(set(fleet.refused))[:3],
        "errors": len(fleet.errors), "error_reasons": sorted(set(fleet.errors))[:3], "stops": fleet.stops,
        "malformed": fleet.malformed, "unhandled": dict(fleet.unhandled),
    }


def _generator_figures(fleet: Optional[Fleet], sampler: Sampler, t0: float, t1: float) -> dict:
    """This process's CPU and the schedule's lag over the run, and whether they make it the bottleneck."""
    cpu = _window(sampler.cpu, t0, t1)
    machine = float(np.mean([s[4] for s in cpu])) if cpu else None
    figures: dict[str, Any] = {"cpu_percent": float(np.mean([s[2] for s in cpu])) if cpu else None,
                               "fleet_thread_cpu_percent": float(np.mean([s[3] for s in cpu])) if cpu else None,
                               "machine_cpu_percent": machine, "lag_s": _stats(fleet.lags if fleet else []),
                               "bottleneck": [], "machine_busy": machine is not None and machine > 90}
    if fleet is None:
        return figures
    why: list[str] = figures["bottleneck"]
    lag = figures["lag_s"]["p99"]
    if lag is not None and lag > 0.1:
        why.append(f"its sends lagged the schedule by {lag:.2f} s at the 99th percentile")
    if figures["fleet_thread_cpu_percent"] is not None and figures["fleet_thread_cpu_percent"] > 85:
        why.append(f"its fleet thread used {figures['fleet_thread_cpu_percent']:.0f}% of a core")
    return figures


def _daemon_figures(daemon: DaemonProcess, sampler: Sampler, t0: float, seconds: float, before: dict, after: dict,
                    peak: Optional[int], stopped: dict, profile: Optional[str], profile_top: Optional[dict]) -> dict:
    cpu = _window(sampler.cpu, t0, t0 + seconds)
    rss = _window(sampler.rss, t0, t0 + seconds)
    threads = {kind: after.get(kind, 0.0) - before.get(kind, 0.0) for kind in sorted(set(before) | set(after))}
    return {"pid": daemon.pid, "start_s": daemon.started_s, "cpu_percent": _stats([s[1] for s in cpu]),
            "rss_mb": _stats([s[1] / 1e6 for s in rss]), "peak_rss_mb": peak / 1e6 if peak else None,
            "thread_cpu_s": threads, **stopped, "profile": profile, "profile_top": profile_top}


def _follower_figures(follow: Followers, published: list, sampler: Sampler, size: int) -> dict:
    """Each generation's fetches: how long until every follower had it, and the daemon's memory meanwhile
    (its peak from VmHWM, reset when the generation was first heard; else the sampler's largest sample)."""
    rows = []
    for generation in sorted({r["generation"] for r in follow.results}):
        results = [r for r in follow.results if r["generation"] == generation]
        good = [r for r in results if r["error"] is None]
        ours = next((p for p in published if p[0]["generation"] == generation), None)
        row: dict[str, Any] = {"generation": generation, "bench_made": ours is not None,
                               "bytes": good[0]["bytes"] if good else None, "verified": len(good),
                               "failed": len(results) - len(good),
                               "errors": sorted({r["error"] for r in results if r["error"]})[:3],
                               "fetch_s": _stats([r["seconds"] for r in good]),
                               "mb_per_s_each": _stats([r["bytes"] / 1e6 / max(r["seconds"], 1e-9) for r in good])}
        if good:
            start = min(r["end"] - r["seconds"] for r in results)
            end = max(r["end"] for r in results)
            row["all_fetches_s"] = end - start
            row["aggregate_mb_per_s"] = sum(r["bytes"] for r in good) / 1e6 / max(end - start, 1e-9)
            before = [s[1] for s in sampler.rss if s[0] <= start]
            during = [s[1] for s in sampler.rss if start <= s[0] <= end + SAMPLE_S]
            row["daemon_rss_before_mb"] = before[-1] / 1e6 if before else None
            row["daemon_rss_peak_mb"] = max(during) / 1e6 if during else None
            if ours is not None:
                row["published_to_all_s"] = end - ours[1]
        memory = follow.memory.get(generation) or {}
        if memory.get("rss_before") is not None and memory.get("peak") is not None:
            row["daemon_rss_before_mb"] = memory["rss_before"] / 1e6
            row["daemon_rss_peak_mb"] = memory["peak"] / 1e6
        row["daemon_peak_from"] = "VmHWM" if memory.get("peak") is not None else "samples"
        row["daemon_growth_mb"] = (row["daemon_rss_peak_mb"] - row["daemon_rss_before_mb"]
                                   if row.get("daemon_rss_peak_mb") is not None
                                   and row.get("daemon_rss_before_mb") is not None else None)
        if ours is not None and generation in follow.heard:
            row["published_to_heard_s"] = follow.heard[generation] - ours[1]
        rows.append(row)
    made = [record["generation"] for record, _ in published]
    return {"count": len(follow.have), "network_bytes": size, "content": "random bytes",
            "memory_bound_mb": fetch_memory_bound(len(follow.have)) / 1e6, "pieces_asked_again": follow.asked_again,
            "generations": rows, "every_follower_swapped": all(have >= max(made, default=-1) for have in follow.have)
            and all(g not in failed for g in made for failed in follow.failed)}


def _problems(figures: dict) -> list[str]:
    """What went wrong: a game acknowledged and not stored once, a refusal, a follower that did not
    swap, a daemon that did not stop. (A busy generator or machine is a caveat, said in the report.)"""
    out = []
    store, ingest, followers, daemon = figures["store"], figures["ingest"], figures["followers"], figures["daemon"]
    if store["acked_missing"] or store["acked_duplicated"] or store["stored_twice"]:
        out.append(f"store: {store['acked_missing']} acknowledged games missing, {store['acked_duplicated']} "
                   f"acknowledged games stored more than once, {store['stored_twice']} games stored twice")
    if ingest is not None:
        if ingest["refused"] or ingest["malformed"] or ingest["unhandled"]:
            out.append(f"ingest: {ingest['refused']} refusals {ingest['refused_reasons']}, {ingest['malformed']} "
                       f"malformed replies, unhandled replies {ingest['unhandled']}")
        if ingest["unacked_at_end"]:
            out.append(f"ingest: {ingest['unacked_at_end']} games sent were not acknowledged {DRAIN_S:g} s after the "
                       "schedule ended")
    if followers is not None and not followers["every_follower_swapped"]:
        failed = [e for row in followers["generations"] for e in row["errors"]]
        out.append(f"followers: not every follower verified and swapped to the new generations {failed[:3]}")
    restart = figures.get("restart")
    if restart is not None and (restart["restart_s"] is None
                                or restart["acked_before_kill_stored"] != restart["acked_before_kill"]):
        out.append(f"restart: {restart['acked_before_kill_stored']} of the {restart['acked_before_kill']} games "
                   f"acknowledged before the kill are in the store once; served again: "
                   f"{restart['restart_s'] is not None}")
    if daemon.get("stopped") is False:
        out.append(f"daemon: {daemon.get('note') or 'exit code ' + str(daemon.get('exit_code'))}")
    return out


def _f(value: Optional[float], spec: str = ",.1f", unit: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{unit}"


def _report_ingest(ing: dict, st: dict) -> list[str]:
    lat, each, b = ing["ack_latency_s"], ing["games_per_s_by_span"], st["bytes_per_position"]
    return [
        f"  ingest: {ing['acked_games_per_s']:,.1f} games/s, {ing['acked_positions_per_s']:,.0f} positions/s "
        f"acknowledged over the run (offered {ing['offered_games_per_s']:,.1f}); each tenth of the run after the "
        f"first: median {_f(each['p50'])}, min {_f(each['min'])} games/s",
        f"  ack latency (first send to ack): p50 {_f(lat['p50'], '.3f')} s, p99 {_f(lat['p99'], '.3f')} s, max "
        f"{_f(lat['max'], '.3f')} s (from the game's end: p99 {_f(ing['made_to_ack_s']['p99'], '.3f')} s); "
        f"{ing['resends']:,} resends, {ing['credit_waits']:,} games waited on their worker for credit (each "
        f"worker's credit at the end: {_f(ing['credit_at_end']['min'], '.0f')}-{_f(ing['credit_at_end']['max'], '.0f')}"
        f"), {ing['paused_at_bound']:,} games skipped by workers at their bound, "
        f"{ing['unacked_at_end']:,} unacknowledged after {ing['drain_s']:.1f} s of drain",
        f"  replies: {ing['errors']} errors {ing['error_reasons']}, {ing['refused']} refused, {ing['stops']} stops, "
        f"unhandled {ing['unhandled'] or 'none'}",
        f"  store: {st['games']:,} games, {st['positions']:,} positions in {st['chunks']:,} chunks "
        f"({_f(st['positions_per_chunk'], ',.0f')} positions a chunk); by the manifest {st['games_per_s']:,.1f} "
        f"games/s, {st['positions_per_s']:,.0f} positions/s over the run",
        f"  on disk a position: chunks {_f(b['chunks'], ',.0f')} B (a record is {b['record']:,} B), manifest "
        f"{_f(b['manifest'], ',.1f')} B, PGN {_f(b['pgn'], ',.1f')} B; cache {st['cache_bytes']:,} B",
        f"  every acknowledged game stored once: {'yes' if st['every_acked_stored_once'] else 'NO'} "
        f"({st['acked_missing']} missing, {st['acked_duplicated']} duplicated, {st['stored_not_acked']} stored "
        "without an ack seen)"]


def _report_daemon(d: dict, timeline: list[dict]) -> list[str]:
    cpu, rss = d["cpu_percent"], d["rss_mb"]
    lines = [f"  daemon: CPU {_f(cpu['min'], '.0f')}/{_f(cpu['p50'], '.0f')}/{_f(cpu['max'], '.0f')}% "
             f"(min/median/max, of one core), RSS {_f(rss['min'], ',.0f')}/{_f(rss['p50'], ',.0f')}/"
             f"{_f(rss['max'], ',.0f')} MB, peak {_f(d['peak_rss_mb'], ',.0f')} MB"
             + ("" if d.get("stopped") is None else f"; started in {d['start_s']:.1f} s"),
             "    by tenths of the run (acked games/s, daemon CPU, RSS): " + ", ".join(
                 f"{p['t_s']:.3g} s {p['acked_games_per_s']:,.0f} g/s {_f(p['daemon_cpu_percent'], '.0f')}% "
                 f"{_f(p['daemon_rss_mb'], ',.0f')} MB" for p in timeline),
             "    CPU seconds by thread: " + ", ".join(f"{k} {v:,.1f}" for k, v in d["thread_cpu_s"].items())]
    if d.get("stopped") is not None:
        lines.append(f"    stopped by SIGINT: {'yes' if d['stopped'] else 'NO'}"
                     + (f" in {d['stop_s']:.1f} s" if d.get("stop_s") is not None else f" ({d.get('note', '')})"))
    if d.get("profile_top"):
        lines.append(f"    cProfile of its main thread ({d['profile']}, {d['profile_top']['total_s']:.1f} s), "
                     "by own time:")
        lines += [f"      {r['tottime_s']:8.2f} s own {r['cumtime_s']:8.2f} s cum {r['calls']:>9,}  {r['function']}"
                  for r in d["profile_top"]["by_own_time"]]
    return lines


def _report_generator(gen: dict, workers: int) -> str:
    busy = "; the machine's cores were all busy (the daemon and the bench share them)" if gen["machine_busy"] else ""
    if not workers:
        return (f"  bench: {_f(gen['cpu_percent'], '.0f')}% CPU (the followers receive and check the sha256 here), "
                f"machine {_f(gen['machine_cpu_percent'], '.0f')}%{busy}")
    verdict = ("THE GENERATOR IS THE BOTTLENECK: " + "; ".join(gen["bottleneck"]) if gen["bottleneck"]
               else "kept to its schedule")
    lag = gen["lag_s"]
    return (f"  generator: {_f(gen['cpu_percent'], '.0f')}% CPU (fleet thread "
            f"{_f(gen['fleet_thread_cpu_percent'], '.0f')}% of a core), machine "
            f"{_f(gen['machine_cpu_percent'], '.0f')}%, schedule lag p50 {_f(lag['p50'], '.4f')} s p99 "
            f"{_f(lag['p99'], '.4f')} s: {verdict}{busy}")


def _report_followers(fol: dict) -> list[str]:
    lines = [f"  followers: {fol['count']}, new networks of {fol['network_bytes'] / 1e6:,.1f} MB of {fol['content']}; "
             f"every follower verified and swapped: {'yes' if fol['every_follower_swapped'] else 'NO'}; "
             f"{fol['pieces_asked_again']} pieces asked again; the daemon's memory bound for them "
             f"{fol['memory_bound_mb']:,.0f} MB"]
    for row in fol["generations"]:
        fs, each = row["fetch_s"], row["mb_per_s_each"]
        origin = "" if row["bench_made"] else " (the run's own network)"
        errors = f" ({'; '.join(row['errors'])})" if row["errors"] else ""
        to_all = (f"; written to all swapped {_f(row['published_to_all_s'], '.2f')} s"
                  if row.get("published_to_all_s") is not None else "")
        lines.append(f"    generation {row['generation']}{origin}: "
                     f"{row['verified']} verified, {row['failed']} failed{errors}; a fetch "
                     f"{_f(fs['min'], '.2f')}-{_f(fs['max'], '.2f')} s (median {_f(fs['p50'], '.2f')}, "
                     f"{_f(each['p50'], ',.0f')} MB/s each), all in {_f(row.get('all_fetches_s'), '.2f')} s "
                     f"({_f(row.get('aggregate_mb_per_s'), ',.0f')} MB/s in all){to_all}; daemon RSS "
                     f"{_f(row.get('daemon_rss_before_mb'), ',.0f')} MB before, "
                     f"{_f(row.get('daemon_rss_peak_mb'), ',.0f')} MB at most during them "
                     f"(+{_f(row.get('daemon_growth_mb'), ',.0f')} MB, by {row['daemon_peak_from']})")
    return lines


def _report_restart(r: dict) -> str:
    if r["restart_s"] is None:
        return f"  restart: killed at {r['kill_s']:g} s; the daemon did not serve again"
    return (f"  restart: SIGKILL at {r['kill_s']:g} s with {r['acked_before_kill']:,} games acknowledged, "
            f"{r['acked_before_kill_stored']:,} of them in the store once; serving again {r['restart_s']:.1f} s "
            f"later; then the first ack in {_f(r['first_ack_after_s'], '.1f')} s, a second at the fleet's rate "
            f"after {_f(r['at_rate_after_s'], '.0f')} s; {r['resends_after']:,} resends, at most "
            f"{r['resends_most_in_a_second']:,} in a second")


def format_fleet_report(figures: dict) -> str:
    """The figures as a few readable lines."""
    m, f = figures["machine"], figures["fleet"]
    fleet = (f"{f['workers']} simulated workers at {f['rate_games_per_s']:,.1f} games/s "
             f"({_f(f['games_per_hour_per_worker'], ',.0f')} games/h a worker, {_f(f['positions_per_game'])} positions "
             f"a game)") if f["workers"] else "no simulated worker"
    followers = f"{f['followers']} follower{'' if f['followers'] == 1 else 's'}"
    lines = [f"cyzero-train bench fleet: {fleet}, {followers}, {f['seconds']:g} s",
             f"  machine: {m['cpu']}, {m['cores']} cores ({' '.join(m['flags']) or 'no AVX'}), load "
             f"{m['load_at_start'][0]:.2f} at the start; run {figures['run_dir']}, config {figures['config']}"]
    if figures["ingest"] is not None:
        lines += _report_ingest(figures["ingest"], figures["store"])
    lines += _report_daemon(figures["daemon"], figures["timeline"])
    lines.append(_report_generator(figures["generator"], f["workers"]))
    if figures["followers"] is not None:
        lines += _report_followers(figures["followers"])
    if figures.get("restart") is not None:
        lines.append(_report_restart(figures["restart"]))
    lines.append("  problems: " + ("; ".join(figures["problems"]) if figures["problems"] else "none"))
    return "\n".join(lines)
