"""The ``cyzero-train`` command.

``cyzero-train export ...`` exports a network to ONNX (see :func:`export_main`); the
training daemon itself is not built yet. Results go to stdout, progress and errors
to stderr. The torch-only modules are imported after the arguments are parsed, so
that an engine-only install (no torch) gets a message saying what to install.
"""

import argparse
import json
import os
import pickle
import sys
import warnings
import zipfile

TRAIN_EXTRA_HINT = (
    "install the training extra: pip install 'cyzero[train]'\n"
    "  (on a machine without an NVIDIA GPU, install the CPU-only torch first, it is far smaller:\n"
    "   pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu)"
)


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


def _missing_training_module():
    """The name of the first training dependency that does not import, or None."""
    try:
        import torch  # noqa: F401
        import onnx  # noqa: F401
    except ImportError as exc:
        return exc.name or str(exc)
    return None


def _one_line(exc: BaseException, limit: int = 300) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def read_checkpoint(path: str):
    """``torch.load(path, weights_only=True)``; ValueError that says what is wrong with the file.

    torch.save writes a zip archive (older torch a bare pickle); anything else, an empty or a
    truncated file gets a one-line reason instead of torch's traceback.
    """
    import torch

    if os.path.isdir(path):
        raise ValueError(f"checkpoint {path} is a folder, not a file")
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError as exc:
        raise ValueError(f"cannot read checkpoint {path}: {exc.strerror or exc}") from None
    if not head:
        raise ValueError(f"checkpoint {path} is empty (0 bytes)")
    if head.startswith(b"PK") and not zipfile.is_zipfile(path):
        raise ValueError(f"checkpoint {path} is a truncated or damaged zip archive "
                         f"({os.path.getsize(path):,} bytes): copy it again or pick an earlier one")
    if not head.startswith(b"PK") and head[0] != 0x80:  # 0x80: a pickle, as torch < 1.6 wrote
        raise ValueError(f"checkpoint {path} is not a torch checkpoint: torch.save writes a zip archive, "
                         f"this file starts with {head!r}")
    try:
        with warnings.catch_warnings():  # torch warns about pickle protocols before it fails
            warnings.simplefilter("ignore")
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        raise ValueError(f"checkpoint {path} holds more than tensors and plain containers, or is not "
                         "a torch checkpoint: cyzero loads only weights (torch.load weights_only=True)") from None
    except Exception as exc:  # torch raises RuntimeError, EOFError, KeyError, ... for damaged files
        raise ValueError(f"cannot load checkpoint {path}: {_one_line(exc)}") from None


def _net_from_checkpoint(path: str, config):
    """The network in checkpoint ``path``; ValueError for one that does not hold a fitting network."""
    from trainer.model import load_net

    checkpoint = read_checkpoint(path)
    if not isinstance(checkpoint, dict):
        raise ValueError(f"checkpoint {path} holds a {type(checkpoint).__name__}, not a dict "
                         "({'config': ..., 'model': state_dict} or a bare state dict)")
    has_config = "config" in checkpoint
    if not has_config and config is None:
        raise ValueError(f"checkpoint {path} has no 'config': give --config BLOCKSxFILTERS")
    try:
        net = load_net(checkpoint) if has_config else load_net(checkpoint, config=config)
    except ValueError as exc:
        raise ValueError(f"checkpoint {path}: {exc}") from None
    except (TypeError, KeyError, RuntimeError) as exc:  # a config or state dict that does not fit
        raise ValueError(f"checkpoint {path} does not hold a network cyzero can load: {_one_line(exc)}") from None
    if has_config and config is not None and (config.blocks, config.filters) != (net.config.blocks, net.config.filters):
        raise ValueError(f"--config {config.name} does not match the checkpoint's {net.config.name}")
    return net


def export_main(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    import numpy as np

    from trainer.export import VARIANTS, ExportParityError, export_variants
    from trainer.model import NetConfig, build_net

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
            net = _net_from_checkpoint(args.checkpoint, config)
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
              file=sys.stderr, flush=True)

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
    if args.command is None:
        print("cyzero-train: the training daemon is not built yet; "
              "`cyzero-train export` writes ONNX networks (see --help)", file=sys.stderr)
        return 2
    missing = _missing_training_module()
    if missing:
        print(f"cyzero-train {args.command}: needs {missing}, which an engine-only install leaves out; "
              f"{TRAIN_EXTRA_HINT}", file=sys.stderr)
        return 2
    return export_main(args, parser)


if __name__ == "__main__":
    sys.exit(main())
