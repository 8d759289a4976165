"""The ``cyzero-train`` command.

``cyzero-train export ...`` exports a network to ONNX (see :func:`export_main`); the
training daemon itself is not built yet.
"""

import argparse
import json
import sys


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cyzero-train", description="cyzero's training system.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    exp = sub.add_parser(
        "export",
        help="export a network to ONNX (fp32, fp16, int8), checked against PyTorch",
        description=(
            "Export a network to ONNX files OUT/NAME.onnx (fp32), NAME.fp16.onnx and NAME.int8.onnx, "
            "each with a .sha256 side file, written atomically. Each variant is compared with "
            "PyTorch on positions from random games first; one outside its bounds is not written "
            "(exit status 1). Without --checkpoint the network is freshly initialised from --seed."
        ),
    )
    exp.add_argument("--config", default=None,
                     help="network size BLOCKSxFILTERS, e.g. 6x64, 10x128, 20x256 (default 6x64, "
                          "or the checkpoint's own)")
    exp.add_argument("--seed", type=int, default=0, help="init seed (without --checkpoint) and position seed (default 0)")
    exp.add_argument("--checkpoint", metavar="PATH",
                     help="torch checkpoint: {'config': NetConfig fields, 'model': state_dict}, "
                          "or a bare state dict together with --config")
    exp.add_argument("--out", required=True, metavar="DIR", help="output directory (created if missing)")
    exp.add_argument("--name", default="model", help="file stem (default 'model': model.onnx, model.fp16.onnx, ...)")
    exp.add_argument("--variants", default="fp32,fp16,int8",
                     help="comma-separated subset of fp32,fp16,int8 (default all three)")
    exp.add_argument("--no-mlh", action="store_true", help="fresh network without the moves-left head")
    exp.add_argument("--se-ratio", type=int, default=None, help="SE reduction ratio of a fresh network (default 4)")
    exp.add_argument("--calibration", metavar="NPY",
                     help="int8 calibration positions: .npy of float32 [N,112,8,8] planes "
                          "(default: 256 positions from random games)")
    exp.add_argument("--positions", type=int, default=256,
                     help="positions to compare each export with PyTorch on (default 256)")
    exp.add_argument("--json", action="store_true", help="print the reports as one JSON list and nothing else")
    return parser


def export_main(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    import numpy as np

    from trainer.export import VARIANTS, ExportParityError, export_variants
    from trainer.model import NetConfig, build_net, load_net

    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    bad = [v for v in variants if v not in VARIANTS]
    if bad or not variants:
        parser.error(f"--variants: unknown {', '.join(bad) or '(none given)'}; choose from {','.join(VARIANTS)}")
    if args.positions < 1:
        parser.error("--positions must be at least 1")
    try:
        overrides = {}
        if args.no_mlh:
            overrides["moves_left"] = False
        if args.se_ratio is not None:
            overrides["se_ratio"] = args.se_ratio
        config = NetConfig.from_name(args.config, **overrides) if args.config else None
        if args.checkpoint:
            import torch

            checkpoint = torch.load(args.checkpoint, map_location="cpu", weights_only=True)
            if isinstance(checkpoint, dict) and "config" in checkpoint:
                net = load_net(checkpoint)
                if config is not None and (config.blocks, config.filters) != (net.config.blocks, net.config.filters):
                    raise ValueError(f"--config {config.name} does not match the checkpoint's {net.config.name}")
            elif config is None:
                raise ValueError("the checkpoint has no 'config': give --config BLOCKSxFILTERS")
            else:
                net = load_net(checkpoint, config=config)
        else:
            net = build_net(config or NetConfig.from_name("6x64", **overrides), seed=args.seed)
        calibration = None
        if args.calibration:
            calibration = np.load(args.calibration, allow_pickle=False)
    except (ValueError, OSError, KeyError, RuntimeError) as exc:
        print(f"cyzero-train export: error: {exc}", file=sys.stderr)
        return 2

    if not args.json:
        source = args.checkpoint or f"random init, seed {args.seed}"
        print(f"exporting {net.config.name} ({net.num_parameters():,} parameters, {source}) to {args.out}",
              flush=True)

    def show(report):
        if not args.json:
            print(report.summary(), flush=True)

    try:
        reports = export_variants(
            net, args.out, stem=args.name, variants=variants, calibration_planes=calibration,
            seed=args.seed, check_positions=args.positions, on_report=show,
        )
    except ExportParityError as exc:
        print(f"cyzero-train export: {exc}", file=sys.stderr)
        return 1
    except (ValueError, OSError) as exc:
        print(f"cyzero-train export: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps([r.to_dict() for r in reports], indent=2))
    return 0


def main(argv=None) -> int:
    """Run ``cyzero-train``; returns the process exit code."""
    parser = _build_parser()
    args = parser.parse_args(argv)
    if args.command == "export":
        return export_main(args, parser)
    print("cyzero-train: the training daemon is not built yet", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
