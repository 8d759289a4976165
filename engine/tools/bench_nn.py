"""``cyzero bench nn``: the network's positions/s by batch size, the variants or runtimes
alternating in short rounds (lc0's ``backendbench``)."""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from typing import Iterator

from engine import processor
from engine.sessions import BACKENDS
from engine.tools.bench_common import (
    BenchError, batch_list, environment, fmt_int, json_and_seconds, register, report,
)


NN_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
# The bundled network and its export variants, in the order they are reported.
NN_VARIANTS = (
    ("fp32", "default.onnx"),
    ("fp16", "default.fp16.onnx"),
    ("int8", "default.int8.onnx"),
)
# On a CPU: every runtime and precision the engine can run the bundled network in, as
# (label, file, backend, precision, arithmetic); today's ``Backend=cpu`` first, the
# baseline of the ratios. bf16 only where the processor has it in hardware.
NN_CPU_RUNTIMES = (
    ("cpu int8", "default.int8.onnx", "cpu", None, "int8"),
    ("cpu fp32", "default.onnx", "cpu", None, "fp32"),
    ("openvino int8", "default.int8.onnx", "openvino", None, "int8"),
    ("openvino bf16", "default.onnx", "openvino", "bf16", "bf16"),
    ("openvino fp32", "default.onnx", "openvino", "fp32", "fp32"),
)


def _add_nn_arguments(parser: argparse.ArgumentParser) -> None:
    json_and_seconds(parser, 0.5, "measurement (per batch size and variant)")
    parser.add_argument(
        "--batches",
        type=batch_list,
        default=NN_BATCHES,
        metavar="B,B,...",
        help="batch sizes to time (default " + ",".join(map(str, NN_BATCHES)) + ")",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        metavar="T",
        help="ONNX Runtime intra-op threads (default: its own, one per physical core)",
    )
    parser.add_argument(
        "--backend",
        choices=BACKENDS,
        default="auto",
        help="execution provider (default auto: TensorRT, then CUDA, then the CPU; on the CPU every "
             "runtime and precision is timed side by side: cpu int8 is today's Backend=cpu)",
    )
    parser.add_argument(
        "--cuda-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a CUDA provider option to measure, e.g. cudnn_conv_algo_search=EXHAUSTIVE (repeatable; "
             "the default is HEURISTIC, see engine/sessions.py)",
    )
    parser.add_argument(
        "--net",
        action="append",
        default=None,
        metavar="PATH",
        help="time this network file (.onnx, or an lc0 .pb.gz) instead of the bundled variants (repeatable)",
    )


def nn_inputs(n: int) -> tuple[np.ndarray, str]:
    """``n`` encoded positions from seeded random games, or random planes without the encoder."""
    import numpy as np

    try:
        from engine import encoding
        from engine.board import Board
    except ImportError:
        rng = np.random.default_rng(0)
        planes = (rng.random((n, 112, 8, 8)) < 0.05).astype(np.float32)
        planes[:, 111] = 1.0
        return planes, "random planes (engine.encoding is not built)"
    import random

    rng = random.Random(0)
    boards = []
    board = Board()
    while len(boards) < n:
        moves = board.legal_moves()
        if not moves or board.ply() >= 120:
            board = Board()
            continue
        board.push_uci(rng.choice(moves))
        boards.append(board.copy())
    return encoding.encode_boards(boards), "encoded positions (seeded random games)"


NN_ROUNDS = 4  # each batch size's time is split into rounds that alternate the variants


def _time_slice(net, planes, outputs, seconds: float) -> tuple[int, float]:
    """Runs of ``net`` on ``planes`` until ``seconds`` have passed: (runs, seconds taken)."""
    policy, wdl, mlh = outputs
    runs = 0
    start = time.perf_counter()
    while True:
        net.evaluate_into(planes, policy, wdl, mlh)
        runs += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return runs, elapsed


def _time_batch(networks, planes, outputs, seconds: float) -> dict[str, dict]:
    """Every network at one batch size: a warm-up run each, then alternating timed rounds.

    Alternating in short rounds, rather than timing one network after the
    other, spreads any change in machine load over all of them alike.
    """
    for _, net in networks:
        net.evaluate_into(planes, *outputs)
    totals = {label: [0, 0.0] for label, _ in networks}
    for _ in range(NN_ROUNDS):
        for label, net in networks:
            runs, elapsed = _time_slice(net, planes, outputs, seconds / NN_ROUNDS)
            totals[label][0] += runs
            totals[label][1] += elapsed
    n = planes.shape[0]
    return {
        label: {"runs": runs, "seconds": round(secs, 6), "pps": n * runs / secs}
        for label, (runs, secs) in totals.items()
    }


def _cuda_options(pairs: list[str]) -> dict[str, str]:
    options = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise BenchError(f"--cuda-option takes KEY=VALUE, got {pair!r}")
        options[key.strip()] = value.strip()
    return options


def _width(label: str) -> int:
    """Column width for ``label``'s positions/s in bench nn's table."""
    return max(16, len(label) + 8)


def _nn_networks(args: argparse.Namespace, cpu: bool) -> list[tuple[str | None, str, str, str | None]]:
    """[(label, path, backend, precision)] to time: the --net files (label None) on
    ``--backend``; on a CPU every runtime and precision of the bundled network
    (:data:`NN_CPU_RUNTIMES`) that this machine has; else the bundled variants that exist."""
    if args.net:
        return [(None, path, args.backend, None) for path in args.net]
    from engine.sessions import openvino_missing
    from engine.weights import default_weights_path

    nets_dir = os.path.dirname(default_weights_path())
    if cpu:
        found = [(label, os.path.join(nets_dir, name), backend, precision)
                 for label, name, backend, precision, arithmetic in NN_CPU_RUNTIMES
                 if (backend != "openvino" or openvino_missing() is None)
                 and (arithmetic != "bf16" or processor.native_bf16())]
    else:
        found = [(label, os.path.join(nets_dir, name), args.backend, None) for label, name in NN_VARIANTS]
    found = [entry for entry in found if os.path.exists(entry[1])]
    if not found:
        raise BenchError(
            f"no bundled network in {nets_dir} (expected default.onnx); use --net PATH"
        )
    return found


def macs_per_position(path: str) -> int | None:
    """Multiply-adds one position costs in the network at ``path`` (an ONNX file): every Conv
    on the 8x8 board and every Gemm/MatMul, from their weights (a quantized file's weights
    through their DequantizeLinear); None where the file cannot be read so."""
    try:
        import onnx
        from onnx import numpy_helper

        model = onnx.load(path)
    except Exception:  # noqa: BLE001 - an lc0 file, or no onnx: no figure
        return None
    shapes = {t.name: list(t.dims) for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "DequantizeLinear" and node.input[0] in shapes:
            shapes[node.output[0]] = shapes[node.input[0]]
        elif node.op_type == "Constant" and node.attribute:
            shapes[node.output[0]] = list(numpy_helper.to_array(node.attribute[0].t).shape)
    total = 0
    for node in model.graph.node:
        weight = shapes.get(node.input[1]) if len(node.input) > 1 else None
        if weight is None:
            continue
        if node.op_type == "Conv" and len(weight) == 4:
            total += math.prod(weight) * 64   # 'same' padding: the output is 8x8
        elif node.op_type in ("Gemm", "MatMul") and len(weight) == 2:
            total += math.prod(weight)
    return total or None


@register(
    "nn",
    "network speed: positions/s per batch size for the bundled network on every CPU runtime and "
    "precision (or its fp16/int8 variants on a GPU), with the share of the core's peak",
    _add_nn_arguments,
)
def bench_nn(args: argparse.Namespace) -> int:
    import numpy as np

    from engine.network import OPENVINO, POLICY_SIZE, Network, NetworkError
    from engine.sessions import CPU

    if args.threads is not None and args.threads < 0:
        raise BenchError(f"--threads must be 0 or more, got {args.threads}")
    started = time.perf_counter()
    batches = args.batches
    max_batch = max(batches)
    said: set[str] = set()

    def log(line: str) -> None:  # the backend line, once, on stderr (stdout may be JSON)
        if line not in said:
            said.add(line)
            print(line, file=sys.stderr, flush=True)

    def load(path: str, backend: str, precision: str | None):
        digest_file = path + ".sha256"
        expected = None
        if os.path.exists(digest_file):
            with open(digest_file, encoding="utf-8") as f:
                expected = f.read()
        try:
            return Network(path, backend=backend, intra_threads=args.threads, max_batch=max_batch,
                           log=log, expected_sha256=expected, warmup_batch=1, precision=precision,
                           cuda_options=_cuda_options(args.cuda_option))
        except NetworkError as e:
            raise BenchError(str(e)) from None

    # Which side of the machine is timed: one load of the fp32 file on --backend tells.
    cpu = False
    if not args.net:
        from engine.weights import default_weights_path

        probe = load(default_weights_path(), args.backend, None)
        cpu = probe.provider in (CPU, OPENVINO)
        probe.close()
    networks = [(label, load(path, backend, precision))
                for label, path, backend, precision in _nn_networks(args, cpu)]
    if networks[0][0] is None:
        # --net files: by variant (fp32, fp16, int8) where those tell them apart, else by file name
        variants = [net.variant for _, net in networks]
        names = variants if len(set(variants)) == len(variants) else \
            [os.path.basename(net.path) for _, net in networks]
        networks = [(name + "'" * names[:i].count(name), net)
                    for i, (name, (_, net)) in enumerate(zip(names, networks))]

    planes_all, inputs = nn_inputs(max_batch)
    outputs = (
        np.empty((max_batch, POLICY_SIZE), np.float32),
        np.empty((max_batch, 3), np.float32),
        np.empty(max_batch, np.float32),
    )
    labels = [label for label, _ in networks]
    first = networks[0][1]
    # The ratio column: each network over the first (today's Backend=cpu on a CPU), or int8
    # over fp32 (a GPU's variants).
    if cpu and len(labels) > 1:
        base, ratio_of = labels[0], labels[1:]
    elif "fp32" in labels and "int8" in labels:
        base, ratio_of = "fp32", ["int8"]
    elif len(labels) == 2:   # two files side by side (e.g. an lc0 file and lc0's own export)
        base, ratio_of = labels[1], [labels[0]]
    else:
        base, ratio_of = None, []
    machine = processor.describe()
    if not args.json:
        threads = args.threads if args.threads else "default"
        print(f"machine: {machine}; threads: {threads}; inputs: {inputs}")
        if processor.isa_cap():
            print(f"ONEDNN_MAX_CPU_ISA={processor.isa_cap()} holds OpenVINO to it; ONNX Runtime's CPU "
                  f"path knows no such cap and runs on {processor.vector_isa(processor.cpuinfo_flags())}")
        for label, net in networks:
            print(f"  {label:<14} {net.description}")
        print()
        header = f"{'batch':>6}" + "".join(f"{label + ' pos/s':>{_width(label)}}" for label in labels)
        # on a CPU each ratio column is that runtime over the first (today's Backend=cpu)
        header += "".join(f"{r + ' x' if cpu else r + '/' + base:>{_width(r) - 4}}" for r in ratio_of)
        print(header, flush=True)

    results: dict[str, dict] = {label: {} for label in labels}
    # Batch by batch, the networks alternating: drifts in machine load hit all of them alike.
    for batch in batches:
        planes = np.ascontiguousarray(planes_all[:batch])
        for label, measured in _time_batch(networks, planes, outputs, args.seconds).items():
            results[label][batch] = measured
        if not args.json:
            row = f"{batch:>6}" + "".join(
                f"{fmt_int(results[l][batch]['pps']):>{_width(l)}}" for l in labels
            )
            row += "".join(f"{results[r][batch]['pps'] / results[base][batch]['pps']:>{_width(r) - 5}.2f}x"
                           for r in ratio_of)
            print(row, flush=True)

    variants = {}
    for label, net in networks:
        per_batch = results[label]
        best = max(per_batch, key=lambda b: per_batch[b]["pps"])
        macs = macs_per_position(net.path)
        arithmetic = "bf16" if net.precision == "bf16" else ("int8" if net.precision == "int8" else "fp32")
        # ONEDNN_MAX_CPU_ISA holds OpenVINO only: ONNX Runtime's rows run on the whole processor
        flags = processor.features() if net.provider == OPENVINO else processor.cpuinfo_flags()
        peak = processor.peak_macs(arithmetic, flags) if net.provider in (CPU, OPENVINO) else None
        threads_used = args.threads or 1
        variants[label] = {
            "file": os.path.basename(net.path),
            "sha256": net.sha256,
            "variant": net.variant,
            "precision": net.precision,
            "provider": net.provider,
            "description": net.description,
            "positions_per_second": {str(b): round(m["pps"], 1) for b, m in per_batch.items()},
            "runs": {str(b): m["runs"] for b, m in per_batch.items()},
            "best_batch": best,
            "best_positions_per_second": round(per_batch[best]["pps"], 1),
            "macs_per_position": macs,
            # of the cores' nominal peak for this arithmetic (engine/processor.py), at the best batch
            "share_of_peak": round(per_batch[best]["pps"] * macs / (peak * threads_used), 3)
            if macs and peak else None,
        }

    def speedup(a: str, b: str):
        if a not in variants or b not in variants:
            return None, None
        by_batch = {str(n): round(results[a][n]["pps"] / results[b][n]["pps"], 3) for n in batches}
        best = variants[a]["best_positions_per_second"] / variants[b]["best_positions_per_second"]
        return round(best, 3), by_batch

    int8_speedup, int8_by_batch = speedup("int8", "fp32")
    fp16_speedup, fp16_by_batch = speedup("fp16", "fp32")
    over_base = {r: dict(zip(("best", "by_batch"), speedup(r, base))) for r in ratio_of} if cpu else {}
    import onnxruntime

    summary = {
        "benchmark": "nn",
        "provider": first.provider,
        "backend": args.backend,
        "intra_threads": args.threads,
        "inputs": inputs,
        "batches": list(batches),
        "seconds_target": args.seconds,
        "variants": variants,
        "int8_speedup": int8_speedup,
        "int8_speedup_by_batch": int8_by_batch,
        "fp16_speedup": fp16_speedup,
        "fp16_speedup_by_batch": fp16_by_batch,
        "baseline": base if cpu else None,
        "speedup_over_baseline": over_base,
        "wall_seconds": round(time.perf_counter() - started, 3),
        "environment": {
            **environment(),
            "onnxruntime_version": onnxruntime.__version__,
            "openvino_version": _openvino_version(),
            "cpu_count": os.cpu_count(),
            "processor": machine,
            "vector_isa": processor.vector_isa(),
            "onednn_max_cpu_isa": processor.isa_cap() or None,
            "clock_ghz": processor.clock_ghz(),
        },
    }
    return report(args, summary, lambda summary: _nn_text(summary, cpu))


def _nn_text(summary: dict, cpu: bool) -> Iterator[str]:
    """The best of each network, the ratios, and (``cpu``: the CPU's runtimes were timed) what
    the peak is; the table's rows came as they were measured."""
    yield ""
    for label, v in summary["variants"].items():
        share = f", {v['share_of_peak']:.0%} of the nominal {v['precision'] if v['precision'] in ('int8', 'bf16') else 'fp32'} " \
                f"peak ({v['macs_per_position'] / 1e6:.1f}M MACs a position)" if v["share_of_peak"] else ""
        yield f"best {label}: {fmt_int(v['best_positions_per_second'])} pos/s at batch {v['best_batch']}{share}"
    for r, ratio in summary["speedup_over_baseline"].items():
        yield (f"{r} over {summary['baseline']}: {ratio['best']:.2f}x at the best batch sizes, "
               f"{ratio['by_batch'].get('8', float('nan')):.2f}x at batch 8 (the search's)")
    provider = summary["provider"]
    for name in ("int8", "fp16"):
        value = summary[f"{name}_speedup"]
        if value is not None:
            slower = "" if value >= 1 else f" ({name} is slower here)"
            yield (f"{name} over fp32 on {_LABEL_OF.get(provider, provider)}: "
                   f"{value:.2f}x at the best batch sizes{slower}")
    if cpu:
        yield ("peak: the processor's instruction set at its clock, two vector ports a core "
               "(engine/processor.py); AVX-512 on 256-bit units (AMD Zen 4) reaches half of it")
    yield f"{summary['wall_seconds']:.1f} s"


def _openvino_version() -> str | None:
    from engine.sessions import import_openvino

    try:
        openvino = import_openvino()
    except ImportError:
        return None
    return openvino.__version__


_LABEL_OF = {
    "OpenVINO": "OpenVINO",
    "CPUExecutionProvider": "CPU",
    "CUDAExecutionProvider": "CUDA",
    "TensorrtExecutionProvider": "TensorRT",
}
