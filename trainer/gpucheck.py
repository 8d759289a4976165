"""``make gpu-check``: whether a CUDA GPU is usable here, and one table of the GPU benchmarks.

``python -m trainer.gpucheck --preflight`` checks, in a few seconds, that ONNX Runtime's CUDA
provider really runs the bundled network here (not only that it is listed) and that torch sees a
CUDA device (the ``gpu`` tests and ``bench train`` need one); it exits 2 with the reasons when not,
so that ``make gpu-check`` fails at once on a machine without a usable GPU.

``python -m trainer.gpucheck DIR`` reads what ``make gpu-check`` wrote into DIR and prints one
table: each benchmark's headline figures beside the targets of issue 22. Any file or key may be
missing (a bench that failed, or one that does not write that key yet): its row says ``n/a`` and
why, and the other rows are still printed. The files:

``gpu-tests.xml``     pytest's JUnit XML of ``-m gpu``
``nn.json``           ``cyzero bench nn --backend cuda --json``
``search.json``       ``cyzero bench search --backend cuda --json``
``search-20x256.json`` the same with a freshly initialised 20x256 (``--net``)
``selfplay.json``     ``cyzero-train bench selfplay --device cuda:0 --json``
``selfplay-gpu.json`` the same with ``--config gpu``
``train.json``        ``cyzero-train bench train --json``
``train-bt.json``     the same with ``--config gpu-bt`` (the transformer's network, batch and bf16)

No figure is judged here beyond comparing it with its target: the benchmarks measure, side by
side in one run, and this module only reads what they wrote.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

__all__ = ["Row", "main", "preflight", "rows", "summary"]

CUDA = "CUDAExecutionProvider"
TESTS_FILE = "gpu-tests.xml"

# (file, title): the benches in the order make gpu-check runs them.
BENCHES = (
    ("nn.json", "bench nn"),
    ("search.json", "bench search"),
    ("search-20x256.json", "bench search, a fresh 20x256"),
    ("selfplay.json", "bench selfplay"),
    ("selfplay-gpu.json", "bench selfplay --config gpu"),
    ("train.json", "bench train"),
    ("train-bt.json", "bench train --config gpu-bt"),
)


@dataclass(frozen=True)
class Row:
    """One line of the table: ``value`` is formatted, or ``n/a (why)``; ``verdict`` is ``ok``,
    ``BELOW``, ``n/a`` or empty (a figure without a target)."""

    bench: str
    figure: str
    value: str
    target: str = ""
    verdict: str = ""


class _Missing(Exception):
    """A figure that is not there: the message says why."""


# --------------------------------------------------------------------------- reading


def _load(folder: str, name: str) -> dict:
    path = os.path.join(folder, name)
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise _Missing(f"no {name}: the bench did not run or failed, see {name[:-5]}.log") from None
    except OSError as e:
        raise _Missing(f"{name} cannot be read: {e.strerror or e}") from None
    if not text.strip():
        raise _Missing(f"{name} is empty: the bench failed, see {name[:-5]}.log")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise _Missing(f"{name} is not JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(data, dict):
        raise _Missing(f"{name} holds a JSON {type(data).__name__}, not an object")
    return data


def _get(data: Any, path: Sequence[str], name: str) -> Any:
    here = data
    for i, key in enumerate(path):
        if not isinstance(here, dict) or key not in here:
            raise _Missing(f"no key {'.'.join(path[:i + 1])} in {name}")
        here = here[key]
    return here


def _number(data: Any, path: Sequence[str], name: str) -> float:
    value = _get(data, path, name)
    if value is None:
        raise _Missing(f"{'.'.join(path)} is null in {name}")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _Missing(f"{'.'.join(path)} is {value!r} in {name}, not a number")
    return float(value)


# --------------------------------------------------------------------------- formatting


def _rate(value: float) -> str:
    return f"{value:,.0f}"


def _whole(value: float) -> str:
    return f"{value:.0f}"


def _share(value: float) -> str:
    return f"{value:.1%}"


def _times(value: float) -> str:
    return f"{value:.1f}x"


# A second figure shown beside the first: (text before it, its key path, its format, text after it).
_Extra = tuple[str, Sequence[str], Callable[[float], str], str]


class _Table:
    """One bench's rows, read from its JSON (``data``, from file ``name``); a figure that cannot
    be read becomes an ``n/a`` row with its reason."""

    def __init__(self, bench: str, data: Optional[dict] = None, name: str = "") -> None:
        self.bench = bench
        self.data = data
        self.name = name
        self.rows: list[Row] = []

    def add(self, figure: str, path: Sequence[str], fmt: Callable[[float], str],
            at_least: Optional[float] = None, target: str = "", extra: Optional[_Extra] = None) -> None:
        try:
            value = _number(self.data, path, self.name)
        except _Missing as e:
            self.rows.append(Row(self.bench, figure, f"n/a ({e})", target, "n/a" if target else ""))
            return
        text = fmt(value)
        if extra is not None:
            before, extra_path, extra_fmt, after = extra
            try:
                text += before + extra_fmt(_number(self.data, extra_path, self.name)) + after
            except _Missing:
                pass
        verdict = "" if at_least is None else ("ok" if value >= at_least else "BELOW")
        self.rows.append(Row(self.bench, figure, text, target, verdict))

    def text(self, figure: str, value: str, target: str = "", verdict: str = "") -> None:
        self.rows.append(Row(self.bench, figure, value, target, verdict))

    def missing(self, figure: str, why: str, target: str = "") -> None:
        self.rows.append(Row(self.bench, figure, f"n/a ({why})", target, "n/a" if target else ""))


def _provider_row(table: _Table, data: dict, name: str, key: str = "provider") -> None:
    try:
        provider = _get(data, [key], name)
    except _Missing as e:
        table.missing("provider", str(e), "CUDA")
        return
    table.text("provider", str(provider), "CUDA", "ok" if provider == CUDA else "NOT GPU")


# --------------------------------------------------------------------------- one bench each


def _tests(folder: str) -> list[Row]:
    table = _Table("gpu tests")
    path = os.path.join(folder, TESTS_FILE)
    try:
        root = ElementTree.parse(path).getroot()
    except FileNotFoundError:
        table.missing("pytest -m gpu", f"no {TESTS_FILE}: the tests did not run", "all pass")
        return table.rows
    except (ElementTree.ParseError, OSError) as e:
        table.missing("pytest -m gpu", f"{TESTS_FILE} cannot be read: {e}", "all pass")
        return table.rows
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for suite in suites:
        for key in counts:
            try:
                counts[key] += int(suite.get(key, "0"))
            except ValueError:
                pass
    failed = counts["failures"] + counts["errors"]
    passed = counts["tests"] - failed - counts["skipped"]
    value = f"{passed} passed, {failed} failed, {counts['skipped']} skipped"
    verdict = "FAILED" if failed else ("ok" if passed else "NONE RAN")
    table.text("pytest -m gpu", value, "all pass", verdict)
    return table.rows


def _nonempty(data: dict, key: str, name: str) -> dict:
    """``data[key]``, a dict with something in it, or _Missing saying why not."""
    value = _get(data, [key], name)
    if not isinstance(value, dict) or not value:
        raise _Missing(f"{key} in {name} is empty")
    return value


def _nn(data: dict, name: str, table: _Table) -> None:
    _provider_row(table, data, name)
    try:
        variants = _nonempty(data, "variants", name)
    except _Missing as e:
        table.missing("positions/s", str(e))
        return
    for label in variants:
        table.add(f"{label}: best positions/s", ["variants", label, "best_positions_per_second"], _rate,
                  extra=(" at batch ", ["variants", label, "best_batch"], _whole, ""))


def _search(data: dict, name: str, table: _Table) -> None:
    _provider_row(table, data, name)
    table.add("efficiency (search / raw)", ["efficiency"], _share, 0.90, ">= 90%")
    table.add("search nodes/s", ["search_nodes_per_s"], _rate)
    table.add("raw positions/s", ["raw_positions_per_s"], _rate)
    table.add("go movetime 200: nodes / raw capacity", ["short_movetime", "ratio"], _share, 0.5, ">= 50%")
    # Each arrangement measured (one batch, two batches, two search threads): which to default to.
    modes = data.get("modes") if isinstance(data, dict) else None
    for label in modes if isinstance(modes, dict) else ():
        table.add(f"{label}: search / raw", ["modes", label, "efficiency"], _share,
                  extra=(" at ", ["modes", label, "search_nodes_per_s"], _rate, " nodes/s"))


def _selfplay(data: dict, name: str, table: _Table, defaults: bool) -> None:
    try:
        device = str(_get(data, ["device"], name))
        table.text("device", device, "cuda:N", "ok" if device.startswith("cuda") else "NOT GPU")
    except _Missing as e:
        table.missing("device", str(e), "cuda:N")
    table.add("efficiency (self-play / raw)", ["efficiency"], _share, 0.85, ">= 85%")
    try:
        runs = _nonempty(data, "runs", name)
    except _Missing as e:
        table.missing("runs", str(e))
        return
    best: Optional[float] = None
    for k in sorted(runs, key=lambda k: (len(k), k)):
        who = f"{k} worker{'' if k == '1' else 's'}"
        table.add(f"{who}: self-play / raw", ["runs", k, "ratio"], _share, 0.85, ">= 85%")
        table.add(f"{who}: self-play evals/s", ["runs", k, "selfplay_evals_per_s"], _rate,
                  extra=(" (raw ", ["runs", k, "raw_evals_per_s"], _rate, ")"))
        try:
            finished = _number(data, ["runs", k, "games_per_hour_finished"], name)
            best = finished if best is None else max(best, finished)
            finished_text = _rate(finished)
        except _Missing:
            finished_text = "n/a (no game finished)"
        try:
            bound = f"; lower bound {_rate(_number(data, ['runs', k, 'games_per_hour'], name))}"
        except _Missing:
            bound = ""
        table.text(f"{who}: games/hour, finished", finished_text + bound)
    if defaults:  # issue 22: the bundled 6x64 (resignation on) on one H100
        if best is None:
            table.missing("games/hour finished, best run", f"no run in {name} finished a game", ">= 5,000 (H100)")
        else:
            table.text("games/hour finished, best run", _rate(best), ">= 5,000 (H100)",
                       "ok" if best >= 5000 else "BELOW")


def _train(data: dict, name: str, table: _Table) -> None:
    try:
        device = str(_get(data, ["device"], name))
        table.text("device", device, "a GPU", "NOT GPU" if device == "cpu" else "ok")
    except _Missing as e:
        table.missing("device", str(e), "a GPU")
    try:
        table.text("network, batch", f"{_get(data, ['net'], name)}, {_get(data, ['batch_size'], name)}")
    except _Missing as e:
        table.missing("network, batch", str(e))
    table.add("learner / raw step", ["learner_1_rank_over_raw"], _share, 0.90, ">= 90%")
    table.add("learner samples/s", ["learner_1_rank_samples_per_s"], _rate,
              extra=(" (raw ", ["raw_samples_per_s"], _rate, ")"))
    table.add("loader samples/s", ["loader_samples_per_s"], _rate)
    table.add("loader / learner", ["loader_over_learner"], _times, 5.0, ">= 5x")


def rows(folder: str) -> list[Row]:
    """Every row of the summary of ``folder`` (what make gpu-check wrote there)."""
    out = _tests(folder)
    for name, title in BENCHES:
        try:
            data = _load(folder, name)
        except _Missing as e:
            table = _Table(title)
            table.missing("(all figures)", str(e))
            out += table.rows
            continue
        table = _Table(title, data, name)
        if name == "nn.json":
            _nn(data, name, table)
        elif name.startswith("search"):
            _search(data, name, table)
        elif name.startswith("selfplay"):
            _selfplay(data, name, table, defaults=name == "selfplay.json")
        else:
            _train(data, name, table)
        out += table.rows
    return out


def summary(folder: str) -> str:
    """The table as text: bench, figure, value, target, verdict."""
    table = rows(folder)
    header = Row("bench", "figure", "value", "target", "verdict")
    widths = [max(len(getattr(r, f)) for r in [header, *table]) for f in ("bench", "figure", "target")]
    lines = [f"gpu-check summary of {folder}"]
    previous = None
    for r in [header, *table]:
        bench = r.bench if r.bench != previous else ""
        previous = r.bench
        lines.append(f"  {bench:<{widths[0]}}  {r.figure:<{widths[1]}}  {r.target:<{widths[2]}}  "
                     f"{r.verdict:<7}  {r.value}".rstrip())
    return "\n".join(lines)


# --------------------------------------------------------------------------- preflight


def preflight() -> list[str]:
    """Why the GPU check cannot run here: empty when ONNX Runtime runs the bundled network on its
    CUDA provider and torch sees a CUDA device."""
    problems = []
    try:
        from engine.network import Network
        from engine.weights import default_weights_path

        lines: list[str] = []
        net = Network(default_weights_path(), backend="cuda", log=lines.append)
        try:
            if net.provider != CUDA:
                problems.append("no CUDA provider usable: "
                                + (lines[0] if lines else f"ONNX Runtime runs the network on {net.provider}"))
        finally:
            net.close()
    except Exception as e:  # noqa: BLE001 - any failure to load is a reason to stop here
        problems.append(f"no CUDA provider usable: {type(e).__name__}: {e}")
    try:
        import torch
    except ImportError:
        problems.append("torch is not installed: the gpu tests and bench train need a CUDA build of torch")
    else:
        if not torch.cuda.is_available():
            problems.append(f"torch {torch.__version__} sees no CUDA device (CUDA build: "
                            f"{torch.version.cuda or 'none'}): the gpu tests would be skipped and bench train "
                            "would run on the CPU")
    return problems


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer.gpucheck", description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", nargs="?", help="the folder make gpu-check wrote its results to")
    parser.add_argument("--preflight", action="store_true",
                        help="only check that a CUDA GPU is usable here (exit 2 and say why when not)")
    args = parser.parse_args(argv)
    if args.preflight:
        problems = preflight()
        for problem in problems:
            print(f"gpu-check: {problem}", file=sys.stderr)
        if problems:
            print("gpu-check: this machine cannot run the GPU check; docs/gpu.md says what it needs",
                  file=sys.stderr)
            return 2
        return 0
    if not args.folder:
        parser.error("give the results folder, or --preflight")
    if not os.path.isdir(args.folder):
        print(f"gpu-check: {args.folder} is not a folder", file=sys.stderr)
        return 2
    print(summary(args.folder))
    return 0


if __name__ == "__main__":
    sys.exit(main())
