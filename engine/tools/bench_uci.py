"""``cyzero bench uci``: protocol latencies over pipes as a GUI sees them, and
:class:`UciProcess`, the line-timed pipe client it and ``bench null``'s lc0 driver use
(python-chess's client, which ``cyzero match`` uses, hides the times of single lines)."""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from typing import Iterator

from engine.sessions import BACKENDS
from engine.tools.bench_common import BenchError, batch_list, register, report, run_facts


# ``uci``: the UCI front end's latencies, measured on real engine processes over pipes, as a
# GUI sees them.  Times are taken in this process with time.perf_counter() right after a line
# is written to the engine's stdin and right after the answer is read from its stdout (a
# blocking read, no reader thread in between).

UCI_MOVETIMES = (50, 100, 200, 300)
# stop and isready: Stockfish answers in about 0.3 ms; a GUI that stops a search waits this long.
UCI_TARGETS_MS = {"stop": 1.0, "isready": 1.0, "uciok": 500.0, "movetime_overshoot": 20.0}
# Each measurement's name in the table.
UCI_LABELS = {
    "stop": "stop -> bestmove (go infinite)",
    "isready": "isready -> readyok (searching)",
    "uciok": "process start -> uciok",
    "movetime_overshoot": "go movetime N: bestmove - N",
}
UCI_POSITIONS = (
    "position startpos",
    "position startpos moves e2e4 e7e5 g1f3 b8c6 f1b5 a7a6",
    "position fen r1bq1rk1/pp2bppp/2n1pn2/2pp4/3P4/2PBPN2/PP1N1PPP/R1BQ1RK1 w - - 0 8",
    "position fen 8/5pk1/6p1/8/3R4/6P1/5PK1/8 b - - 0 40",
)


def _percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100), interpolated linearly between the closest ranks."""
    data = sorted(values)
    if not data:
        return float("nan")
    pos = (len(data) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


#: Fewer samples than this and a 99th percentile is only the largest one: no p99 is reported.
P99_SAMPLES = 100


def _summary_ms(values_s: list[float]) -> dict:
    """n, p50, p99 (None below :data:`P99_SAMPLES` samples) and max, in milliseconds."""
    ms = [v * 1000.0 for v in values_s]
    return {
        "n": len(ms),
        "p50_ms": round(_percentile(ms, 50), 3),
        "p99_ms": round(_percentile(ms, 99), 3) if len(ms) >= P99_SAMPLES else None,
        "max_ms": round(max(ms), 3) if ms else float("nan"),
    }


class UciProcess:
    """One engine process on pipes, read line by line on the calling thread."""

    def __init__(self, command: list[str], stderr) -> None:
        import subprocess

        self.started = time.perf_counter()
        self.proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=stderr, bufsize=0)
        self._out = self.proc.stdout

    def send(self, line: str) -> float:
        self.proc.stdin.write(line.encode() + b"\n")
        self.proc.stdin.flush()
        return time.perf_counter()

    def read_until(self, word: str, timeout: float = 60.0) -> tuple[float, str]:
        """(time read, line) of the next line starting with ``word``."""
        line = self.lines_until(word, timeout)[-1]
        return time.perf_counter(), line

    def lines_until(self, word: str, timeout: float = 60.0) -> list[str]:
        """Every line up to and including the next one starting with ``word``."""
        import select

        deadline = time.perf_counter() + timeout
        lines: list[str] = []
        buffered = getattr(self, "_pending", b"")
        while True:
            while b"\n" in buffered:
                raw, buffered = buffered.split(b"\n", 1)
                line = raw.decode("utf-8", "replace").strip()
                lines.append(line)
                if line == word or line.startswith(word + " "):
                    self._pending = buffered
                    return lines
            left = deadline - time.perf_counter()
            if left <= 0:
                raise BenchError(f"no {word!r} from the engine within {timeout:g} s")
            ready, _, _ = select.select([self._out], [], [], left)
            if ready:
                chunk = os.read(self._out.fileno(), 1 << 16)
                if not chunk:
                    raise BenchError(f"the engine exited (status {self.proc.poll()}) while we waited for {word!r}")
                buffered += chunk

    def close(self) -> None:
        import subprocess

        try:
            self.send("quit")
            self.proc.wait(10)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()


def _uci_command(args: argparse.Namespace) -> list[str]:
    import shlex

    if args.engine_command:
        return shlex.split(args.engine_command)
    # What the `cyzero` console script runs (uci.cli), with this interpreter.
    return [sys.executable, "-m", "uci.cli"]


def _add_uci_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout and nothing else")
    parser.add_argument("--trials", type=int, default=200, metavar="N",
                        help="stop/isready trials and go movetime trials, each (default 200)")
    parser.add_argument("--starts", type=int, default=20, metavar="K",
                        help="fresh processes timed from start to uciok (default 20)")
    parser.add_argument("--movetimes", type=batch_list, default=UCI_MOVETIMES, metavar="MS,MS,...",
                        help="go movetime values, used in turn (default "
                        + ",".join(map(str, UCI_MOVETIMES)) + ")")
    parser.add_argument("--backend", choices=BACKENDS, default="cpu",
                        help="the engine's Backend option (default cpu)")
    parser.add_argument("--threads", type=int, default=None, metavar="T",
                        help="the engine's Threads option (default: its own default)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random delays and positions")
    parser.add_argument("--engine", dest="engine_command", default=None, metavar="COMMAND",
                        help="engine command line (default: this Python running uci.cli, i.e. cyzero)")


def _uci_configure(engine: UciProcess, args: argparse.Namespace) -> None:
    engine.send("uci")
    engine.read_until("uciok")
    engine.send(f"setoption name Backend value {args.backend}")
    engine.send("setoption name Move Overhead value 0")
    if args.threads is not None:
        engine.send(f"setoption name Threads value {args.threads}")
    engine.send("isready")
    engine.read_until("readyok", timeout=600)      # loads the network (TensorRT may build an engine)
    engine.send("ucinewgame")
    engine.send(UCI_POSITIONS[0])
    engine.send("go nodes 50")                      # warm up: the first search pays one-time costs
    engine.read_until("bestmove")


@register(
    "uci",
    "UCI latencies over pipes: stop -> bestmove, isready during a search, start -> uciok, movetime overshoot",
    _add_uci_arguments,
)
def bench_uci(args: argparse.Namespace) -> int:
    import random
    import tempfile

    if args.trials < 1 or args.starts < 1:
        raise BenchError("--trials and --starts must be at least 1")
    command = _uci_command(args)
    rng = random.Random(args.seed)
    started = time.perf_counter()
    say = (lambda text: None) if args.json else (lambda text: print(text, file=sys.stderr, flush=True))

    with tempfile.TemporaryFile() as stderr:
        def failed(engine: UciProcess, error: BenchError) -> BenchError:
            stderr.seek(0)
            tail = stderr.read().decode("utf-8", "replace").strip().splitlines()[-5:]
            return BenchError(f"{error}" + (f"; engine stderr: {' | '.join(tail)}" if tail else ""))

        # 1. Start-up: process start -> uciok, fresh processes.
        say(f"timing {args.starts} fresh starts to uciok ...")
        uciok = []
        for _ in range(args.starts):
            engine = UciProcess(command, stderr)
            try:
                engine.send("uci")
                when, _ = engine.read_until("uciok", timeout=60)
                uciok.append(when - engine.started)
            except BenchError as e:
                raise failed(engine, e) from None
            finally:
                engine.close()

        engine = UciProcess(command, stderr)
        try:
            _uci_configure(engine, args)
            # 2. During go infinite: isready -> readyok, then stop -> bestmove.
            say(f"{args.trials} go infinite searches: isready, then stop, after random delays ...")
            stop, isready = [], []
            for _ in range(args.trials):
                engine.send(rng.choice(UCI_POSITIONS))
                engine.send("go infinite")
                time.sleep(rng.uniform(0.02, 0.12))
                sent = engine.send("isready")
                got, _ = engine.read_until("readyok")
                isready.append(got - sent)
                time.sleep(rng.uniform(0.005, 0.05))
                sent = engine.send("stop")
                got, _ = engine.read_until("bestmove")
                stop.append(got - sent)
            # 3. go movetime N: time to bestmove minus N.
            say(f"{args.trials} go movetime searches ({', '.join(map(str, args.movetimes))} ms) ...")
            overshoot: dict[int, list[float]] = {n: [] for n in args.movetimes}
            for i in range(args.trials):
                n = args.movetimes[i % len(args.movetimes)]
                engine.send(rng.choice(UCI_POSITIONS))
                sent = engine.send(f"go movetime {n}")
                got, _ = engine.read_until("bestmove")
                overshoot[n].append(got - sent - n / 1000.0)
        except BenchError as e:
            raise failed(engine, e) from None
        finally:
            engine.close()

    all_overshoot = [v for values in overshoot.values() for v in values]
    results = {
        "stop": _summary_ms(stop),
        "isready": _summary_ms(isready),
        "uciok": _summary_ms(uciok),
        "movetime_overshoot": _summary_ms(all_overshoot),
    }
    results["movetime_overshoot"]["min_ms"] = round(min(all_overshoot) * 1000.0, 3)
    results["movetime_overshoot"]["by_movetime"] = {str(n): _summary_ms(v) for n, v in overshoot.items()}
    # A target is judged only where there are samples enough for a p99 (None: not judged).
    met = {key: None if results[key]["p99_ms"] is None else results[key]["p99_ms"] < target
           for key, target in UCI_TARGETS_MS.items()}
    summary = {
        "benchmark": "uci",
        "command": command,
        "backend": args.backend,
        "threads": args.threads,
        "move_overhead_ms": 0,
        "trials": args.trials,
        "starts": args.starts,
        "movetimes": list(args.movetimes),
        "results": results,
        "targets_p99_ms": UCI_TARGETS_MS,
        "targets_met": met,
        "all_targets_met": None if None in met.values() else all(met.values()),
        **run_facts(started),
    }
    return report(args, summary, _uci_text)


def _uci_text(summary: dict) -> Iterator[str]:
    """The table: each measurement's percentiles against its target, the overshoot by movetime."""
    threads, results, met = summary["threads"], summary["results"], summary["targets_met"]
    yield (f"engine: {' '.join(summary['command'])}; Backend {summary['backend']}, Move Overhead 0, "
           + (f"Threads {threads}" if threads is not None else "Threads: the engine's default")
           + f"; {summary['environment']['cpu_count']} CPUs")
    yield f"{'measurement':<34}{'n':>6}{'p50 ms':>10}{'p99 ms':>10}{'max ms':>10}  {'target':<14}{'met':>4}"

    def p99(r: dict) -> str:
        return f"{r['p99_ms']:>10.2f}" if r["p99_ms"] is not None else f"{'-':>10}"

    for key, label in UCI_LABELS.items():
        r = results[key]
        target = f"p99 < {UCI_TARGETS_MS[key]:g} ms"
        verdict = {True: "yes", False: "NO", None: "-"}[met[key]]
        yield (f"{label:<34}{r['n']:>6}{r['p50_ms']:>10.2f}{p99(r)}{r['max_ms']:>10.2f}  "
               f"{target:<14}{verdict:>4}")
    for n, r in results["movetime_overshoot"]["by_movetime"].items():
        yield f"  {'movetime ' + n + ' ms':<32}{r['n']:>6}{r['p50_ms']:>10.2f}{p99(r)}{r['max_ms']:>10.2f}"
    missed = [UCI_LABELS[k] for k, ok in met.items() if ok is False]
    unjudged = [UCI_LABELS[k] for k, ok in met.items() if ok is None]
    yield (f"targets met: {sum(ok is True for ok in met.values())} of {len(met)}"
           + (f" (missed: {'; '.join(missed)})" if missed else "")
           + (f"; not judged, fewer than {P99_SAMPLES} samples for a p99 (--trials, --starts): "
              f"{'; '.join(unjudged)}" if unjudged else "")
           + f"; {summary['wall_seconds']:.1f} s")
