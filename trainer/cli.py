"""The ``cyzero-train`` command: one subcommand per job.

``run`` (the daemon: self-play workers, the learner, publishing), ``worker`` (self-play
into a daemon from any machine), ``learn`` (the DDP learner), ``bootstrap`` (supervised
data from a teacher engine, PGN or lc0 chunks), ``status`` and ``plot`` (what a run is
doing), ``evaluate`` (generations against generation 0 and a random mover), ``keys`` (CurveZMQ keys), ``bench train | bootstrap | selfplay | fleet | store`` and ``export``. Results go to stdout, progress and errors to stderr. The torch-only
modules are imported after the arguments are parsed, so that ``--help`` is quick and
an engine-only install (no torch) gets a message saying what to install. The run
directory's layout is in ``docs/training.md``.
"""

import argparse
import json
import os
import sys

from engine.tools.closed_stdout import quiet_when_reader_gone, reader_gone
from trainer import EXIT_WITH_PARENT_ENV
from trainer.config import TEACHER_DEFAULTS, bundled_config_names
from trainer.devices import usable_cores

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
            "(exit status 1). Without --checkpoint the network is freshly initialised from --seed; "
            "with --from-lc0 it is rebuilt from an lc0 weights file and first compared with lc0's own graph. "
            "--lc0 writes the network as an lc0 weights file, OUT/NAME.pb.gz, read back and checked first."
        ),
    )
    exp.add_argument("--config", default=None,
                     help="network size BLOCKSxFILTERS, e.g. 6x64, 10x128, 20x256 (default 6x64, "
                          "or the checkpoint's own)")
    exp.add_argument("--seed", type=int, default=0, help="init seed (without --checkpoint) and position seed (default 0)")
    exp.add_argument("--checkpoint", metavar="PATH",
                     help="torch checkpoint: {'config': NetConfig fields, 'model': state_dict}, "
                          "or a bare state dict together with --config; or one of cyzero's fp32 ONNX exports "
                          "(engine/nets/default.onnx), rebuilt in PyTorch and checked against its own graph")
    exp.add_argument("--from-lc0", metavar="FILE",
                     help="an lc0 weights file (.pb.gz, .pb) of the classical residual family: the network is "
                          "rebuilt in PyTorch from it (its shape from the file) and must match lc0's graph "
                          "on the check positions before anything is written")
    exp.add_argument("--weights", choices=("auto", "raw", "average"), default="auto",
                     help="a learner checkpoint's raw weights or its averaged ones (EMA/SWA); auto "
                          "(default): the ones the learner exported for that step (RUN/generations.jsonl), "
                          "else the averaged ones when there are any")
    exp.add_argument("--out", required=True, metavar="DIR", help="output directory (created if missing)")
    exp.add_argument("--name", default="model", help="file stem (default 'model': model.onnx, model.fp16.onnx, ...)")
    exp.add_argument("--variants", default=None,
                     help="comma-separated subset of fp32,fp16,int8 (default all three; none with --lc0)")
    exp.add_argument("--lc0", action="store_true",
                     help="also write OUT/NAME.pb.gz, an lc0 weights file lc0 itself plays (read back and checked "
                          "against PyTorch first); with --no-mlh the moves-left head is left out, which a "
                          "softplus head must be (lc0's ends in ReLU)")
    exp.add_argument("--no-mlh", action="store_true", help="fresh network without the moves-left head")
    exp.add_argument("--se-ratio", type=int, default=None, help="SE reduction ratio of a fresh network (default 4)")
    exp.add_argument("--calibration", metavar="NPY",
                     help="int8 calibration positions: .npy of float32 [N,112,8,8] planes "
                          "(default: 256 positions from random games)")
    exp.add_argument("--positions", type=int, default=256,
                     help="positions to compare each export with PyTorch on (default 256)")
    exp.add_argument("--json", action="store_true", help="print the reports as one JSON list and nothing else")
    learn = sub.add_parser(
        "learn",
        help="train on the run's replay store (DDP: one process per device), checkpointing and exporting ONNX",
        description=(
            "Train the run's network on RUN/replay with one process per device (gloo on CPU, nccl on "
            "CUDA). Every checkpoint_every steps rank 0 writes a checkpoint and an ONNX generation. "
            "Running the same command again resumes at the last checkpoint. Under torchrun each "
            "process is one rank and --devices is ignored (see docs/training.md)."
        ),
    )
    learn.add_argument("run_dir", metavar="RUN_DIR")
    learn.add_argument("--devices", default="cpu:1",
                       help="cpu:N (N gloo processes) or cuda:0,1,... (one nccl process per GPU); default cpu:1")
    learn.add_argument("--steps", type=int, default=None,
                       help="stop after this many steps in all (default: until the data runs out)")
    learn.add_argument("--config", metavar="TOML",
                       help="training config: a TOML file or a bundled config's name (cpu, gpu, ...); written "
                            "to RUN/config.toml on the first start, which is never rewritten after "
                            "(default: RUN/config.toml, or the documented defaults; the config in use is "
                            "RUN/config.effective.toml)")
    learn.add_argument("--follow", action="store_true",
                       help="wait for new data instead of stopping when the sampling cap is reached")
    learn.add_argument("--no-progress", action="store_true", help="no progress bar")
    learn.add_argument("--init-from", metavar="FILE", default=None,
                       help="a new run starts from this network: an lc0 weights file (.pb.gz, .pb), a cyzero "
                            "fp32 ONNX export or a cyzero checkpoint; its shape replaces the config's [model] "
                            "(train.init_from); ignored when the run already has a checkpoint")

    boot = sub.add_parser(
        "bootstrap",
        help="supervised data for a first network: a teacher engine's labels, PGN games or lc0 chunks",
        description=(
            "Write V6 training records into RUN/replay from one of three sources: --teacher (a UCI "
            "engine plays itself from randomised openings and labels every position with its WDL and "
            "MultiPV), --pgn (game records: the played move and the result) or --lc0 (lc0's training "
            "chunks or .tar archives of them). Resumable: running it again adds only what is missing."
        ),
    )
    boot.add_argument("run_dir", metavar="RUN_DIR")
    source = boot.add_mutually_exclusive_group(required=True)
    source.add_argument("--teacher", metavar="CMD", nargs="?", const="",
                        help="teacher engine command (given bare: stockfish on PATH, or Debian's /usr/games/stockfish)")
    source.add_argument("--pgn", metavar="FILE", nargs="+", help="PGN files")
    source.add_argument("--lc0", metavar="FILE", nargs="+", help="lc0 training chunks (.gz) or .tar archives")
    teacher = TEACHER_DEFAULTS
    boot.add_argument("--positions", type=int,
                      help="(--teacher) positions the run's store should hold in all; required, no default")
    boot.add_argument("--workers", type=int, default=None,
                      help=f"(--teacher) teacher processes (default: one per core, {usable_cores()} here)")
    boot.add_argument("--depth", type=int, default=teacher["depth"],
                      help="(--teacher) search depth per position (default %(default)s)")
    boot.add_argument("--multipv", type=int, default=teacher["multipv"],
                      help="(--teacher) moves scored per position (default %(default)s)")
    boot.add_argument("--temperature", type=float, default=teacher["temperature"],
                      help="(--teacher) MultiPV softmax temperature in centipawns (default %(default)s)")
    boot.add_argument("--random-move-share", type=float, default=teacher["random_move_share"],
                      help="(--teacher) share of uniformly random moves after the opening (default %(default)s)")
    boot.add_argument("--opening-plies", type=int, default=teacher["opening_plies"],
                      help="(--teacher) random opening plies: between half of this and this many "
                           "(default %(default)s)")
    boot.add_argument("--max-plies", type=int, default=teacher["max_plies"],
                      help="(--teacher) game length adjudicated a draw (default %(default)s)")
    boot.add_argument("--syzygy", metavar="DIR", default=None, help="(--teacher) Syzygy tablebases for adjudication")
    boot.add_argument("--seed", type=int, default=0, help="(--teacher) opening randomisation seed (default %(default)s)")
    boot.add_argument("--student", metavar="NET", default=None,
                      help="(--teacher) an ONNX network that plays one side of each game with its policy's "
                           "first choice, so that the teacher labels the positions the student's own moves "
                           "lead to")
    boot.add_argument("--input-format", type=int, default=None, metavar="N",
                      help="lc0's input format the records are written in, the network's (default: the run's "
                           "config's model.input_format, else 1)")
    boot.add_argument("--no-progress", action="store_true", help="no progress bar")

    status = sub.add_parser("status", help="the learner's step and rate, the window, games/h, the next "
                                           "generation, the daemon and its workers",
                            description="Print the state of a run directory (works while it runs; reads files only).")
    status.add_argument("run_dir", metavar="RUN_DIR")
    status.add_argument("--json", action="store_true", help="print it as JSON")

    plot = sub.add_parser("plot", help="PNG charts of the run's losses, learning rate, validation, throughput "
                                       "and self-play data",
                          description="Write PNG charts of RUN/metrics.jsonl (the learner), the replay store "
                                      "(self-play), gating.jsonl and evaluation.jsonl to RUN/plots (or --out).")
    plot.add_argument("run_dir", metavar="RUN_DIR")
    plot.add_argument("--out", metavar="DIR", default=None, help="output folder (default RUN/plots)")

    ev = sub.add_parser(
        "evaluate", help="the strength ladder: the run's generations rated against fixed anchors (Elo per generation)",
        description=("Rate RUN's generations on one Elo scale: each plays its predecessor and the anchors near its "
                     "strength (the random mover at Elo 0, generation 0, Stockfish's skill levels) at a fixed node "
                     "count, each opening with both colours. One line per match goes to RUN/evaluation.jsonl, the "
                     "fit to RUN/ratings.json (status, plot's elo.png, TensorBoard). Resumable. The daemon runs it "
                     "with --follow beside the run ([ladder] in the config)."))
    ev.add_argument("run_dir", metavar="RUN_DIR")
    ev.add_argument("--follow", action="store_true",
                    help="keep rating the newest generation as the run exports them, until stopped")
    ev.add_argument("--every", type=int, default=1, metavar="K", help="every K-th generation, and the newest (default 1)")
    ev.add_argument("--config", metavar="TOML", default=None,
                    help="the [ladder] settings (default RUN/config.toml, else the defaults)")
    ev.add_argument("--nodes", type=int, default=None, metavar="N", help="nodes per move (default ladder.nodes)")
    ev.add_argument("--games", type=int, default=None, metavar="G", help="games a pairing, even (default ladder.games)")
    ev.add_argument("--concurrency", type=int, default=None, metavar="C",
                    help="games at once (default ladder.concurrency)")
    ev.add_argument("--stockfish", default=None, metavar="CMD",
                    help="Stockfish's command; '' for no Stockfish anchors (default ladder.stockfish)")
    ev.add_argument("--nice", type=int, default=0, metavar="N", help="run at this much lower priority (os.nice)")

    keys = sub.add_parser(
        "keys", help="CurveZMQ key pairs for the daemon and the remote workers or engines it admits",
        description=("Write DIR/server (the daemon's key pair), DIR/clients/NAME (give that folder to a "
                     "remote worker's --keys or an engine's TrainerKeys) and DIR/authorized (the public "
                     "keys the daemon admits). Existing keys are kept: run it again to add a client."))
    keys.add_argument("directory", metavar="DIR")
    keys.add_argument("--client", action="append", metavar="NAME",
                      help="a client to make keys for (repeatable; default: one named 'worker')")

    run = sub.add_parser(
        "run", help="the training daemon: self-play workers on every device, the learner, publishing",
        description=("Start (or resume) the training run in RUN_DIR: self-play workers on each device, the "
                     "DDP learner, and a publisher that announces each new network to workers and engines "
                     "(TrainerEndpoint). Ctrl-C or SIGTERM stops everything cleanly (from elsewhere: kill the "
                     "pid in RUN_DIR/daemon.json); running it again resumes."))
    run.add_argument("run_dir", metavar="RUN_DIR")
    run.add_argument("--config", metavar="TOML",
                     help=f"a TOML config, or the name of a bundled one ({', '.join(bundled_config_names())}); "
                          "default RUN/config.toml, "
                          "else the defaults. RUN/config.toml is written on the first start only (your edits "
                          "stay); the config in use is RUN/config.effective.toml")
    run.add_argument("--devices", default=None, help="self-play devices: cpu, or cuda:0,1,... (default: daemon.devices)")
    run.add_argument("--workers-per-device", type=int, default=None, metavar="K",
                     help="self-play worker processes per device (default: daemon.workers_per_device); 0: "
                          "none on this machine, the daemon serves remote workers only")
    run.add_argument("--simulate-gpu", action="store_true",
                     help="self-play workers on cuda:N run their network on the GPU stand-in "
                          "(engine.tools.gpu_standin) instead of a GPU: the GPU path without one")
    run.add_argument("--learner-devices", default=None,
                     help="the learner's devices: cpu:N or cuda:0,1,... (default: daemon.learner_devices); "
                          "none: no learner here (it runs elsewhere, writing into the same run folder)")
    run.add_argument("--port", metavar="PORT", default=None,
                     help="the daemon's ports: PORT for workers, PORT+1 for announcements (an engine's "
                          "TrainerEndpoint), PORT+2 for network fetches (default: daemon.endpoint, publish and "
                          "fetch, 5780-5782); auto: free ones, named in the log and RUN/daemon.json")
    run.add_argument("--init-from", metavar="FILE", default=None,
                     help="a new run starts from this network (generation 0): an lc0 weights file (.pb.gz, .pb), "
                          "a cyzero fp32 ONNX export or a cyzero checkpoint; its shape replaces the config's "
                          "[model] (train.init_from); ignored when the run already has a checkpoint")

    worker = sub.add_parser(
        "worker", help="self-play into a running daemon, from this or another machine",
        description=("Play self-play games with the daemon's current network and send them to it; new "
                     "generations are loaded between moves. Needs the engine only (no torch)."))
    worker.add_argument("--connect", required=True, metavar="tcp://HOST:PORT", help="the daemon's endpoint")
    worker.add_argument("--keys", metavar="DIR", default=None,
                        help="CurveZMQ client keys (a folder `cyzero-train keys` made under clients/)")
    worker.add_argument("--devices", default="cpu", help="cpu, or cuda:0,1,... (one worker process per device)")
    worker.add_argument("--name", default=None, help="this worker's id in the run (default HOST-PID)")
    worker.add_argument("--games", type=int, default=None,
                        help="games played at once (default: the run's selfplay.games_per_worker)")
    worker.add_argument("--threads", type=int, default=None, help="ONNX Runtime threads on a CPU (default: its own)")
    worker.add_argument("--nice", type=int, default=0, metavar="N",
                        help="run at this much lower priority (os.nice): a learner or anything else on the machine "
                             "gets the cores first when it needs them, self-play the rest (the daemon's local "
                             "workers: daemon.worker_nice)")
    worker.add_argument("--simulate-gpu", action="store_true",
                        help="on cuda:N, run the network on the GPU stand-in (engine.tools.gpu_standin)")

    bench = sub.add_parser("bench", help="trainer benchmarks (bench train | bootstrap | selfplay | fleet | store)",
                           description="Benchmarks of the training system, measured side by side in one run.")
    bench.add_argument("what", choices=["train", "bootstrap", "selfplay", "fleet", "store"],
                       help="train: learner, raw step and loader samples/s; "
                            "bootstrap: the teacher's ms a position at each depth and MultiPV; "
                            "selfplay: evaluations/s in self-play against raw batched inference, games/hour; "
                            "fleet: simulated self-play workers and network followers against a real daemon on "
                            "this machine (games and positions stored a second, ack latency, the daemon's CPU "
                            "and memory, every acknowledged game found in the store once); "
                            "store: a synthetic replay store of --positions as the daemon writes it (bytes a "
                            "position, the cache it wants, the manifest's load time, the sampler's memory, the "
                            "loader's samples/s from the cache and from gzip for 1 and 8 ranks)")
    bench.add_argument("--teacher", metavar="CMD", default=None, help="(bootstrap) teacher command (default stockfish)")
    bench.add_argument("--seconds", type=float, default=None,
                       help="seconds of play per setting (bootstrap: 10; selfplay: 20); fleet: of the schedule (60)")
    bench.add_argument("--device", default="cpu", help="(selfplay) cpu, or cuda:N")
    bench.add_argument("--config", metavar="TOML", default=None,
                       help="a training config (a bundled name such as cpu or gpu-bt, or a file). selfplay: play "
                            "its [selfplay] settings with a fresh network of its size instead of the defaults; "
                            "train: its network, batch size, loader workers and amp on synthetic records of its "
                            "input format; fleet: the started daemon's (its input format and [selfplay] make the "
                            "records; the ladder and gating are turned off)")
    bench.add_argument("--games", type=int, default=None,
                       help="(selfplay) games each measuring process plays at once, as `worker --games` sets "
                            "(default: the config's selfplay.games_per_worker, else 32 as a CPU worker plays)")
    # No choices= here: the profiles live with the stand-in, which imports numpy, and `status`
    # (the same parser) must not; bench_selfplay checks the name.
    bench.add_argument("--simulate-gpu", nargs="?", const="h100", default=None, metavar="PROFILE",
                       help="(selfplay) run the network on the GPU stand-in (engine.tools.gpu_standin: h100, an "
                            "H100's costs for a 6x64, or h200: half of them; a stall at each new input shape) as "
                            "a GPU worker would (default profile: h100)")
    bench.add_argument("--run", metavar="RUN_DIR", default=None,
                       help="(train) on this run's replay store and config (network, batch, loader workers, "
                            "learner threads), beside the rate its learner logged under the daemon; (fleet) the "
                            "run the daemon serves: a new folder or one the bench made (default: a temporary "
                            "one, removed at the end); (store) the store's folder, likewise: a new one or one "
                            "the bench made, which it completes to --positions and keeps")
    bench.add_argument("--workers", type=int, default=64,
                       help="(fleet) simulated self-play workers, one DEALER each (default 64)")
    fleet_rate = bench.add_mutually_exclusive_group()
    fleet_rate.add_argument("--rate", type=float, default=None, metavar="GAMES_PER_S",
                            help="(fleet) the fleet's games a second in all (default: --workers x "
                                 "--games-per-hour-per-worker)")
    fleet_rate.add_argument("--games-per-hour-per-worker", type=float, default=16_600, metavar="N",
                            help="(fleet) a worker's games an hour (default 16,600: a GPU stand-in worker's, "
                                 "docs/gpu.md; 64 workers send about 295 games/s)")
    bench.add_argument("--positions-per-game", type=int, default=40,
                       help="(fleet) V6 records a game on average (default 40: about 160 plies at the "
                            "full_search_prob of 0.25)")
    bench.add_argument("--followers", type=int, default=0,
                       help="(fleet) simulated followers fetching each new generation's bytes (default 0)")
    bench.add_argument("--network-mb", type=float, default=10.0,
                       help="(fleet) the size of the generations the bench publishes, random bytes (default 10)")
    bench.add_argument("--generations", type=int, default=None,
                       help="(fleet) generations published over the run (default: 1 with followers, else 0)")
    bench.add_argument("--attach", action="store_true",
                       help="(fleet) use the daemon already serving --run (a run the bench made) instead of "
                            "starting one")
    bench.add_argument("--curve", action="store_true", help="(fleet) the started daemon uses CurveZMQ keys")
    bench.add_argument("--kill-at", type=float, default=None, metavar="SECONDS",
                       help="(fleet) SIGKILL the started daemon this many seconds into the run and start it again "
                            "on its ports; the report says when it served again, when acks reached the fleet's "
                            "rate, and that every game acknowledged before the kill is stored once")
    bench.add_argument("--profile", metavar="FILE", default=None,
                       help="(fleet) run the started daemon under cProfile, which writes FILE; the report lists "
                            "where its main thread's time goes")
    bench.add_argument("--positions", type=int, default=10_000_000,
                       help="(store) positions in the store it makes, or completes in --run (default 10,000,000)")
    bench.add_argument("--window", type=int, default=None, metavar="POSITIONS",
                       help="(store) a fixed window for the loader instead of the config's rule at the store's size")
    bench.add_argument("--batches", type=int, default=10,
                       help="(store) global batches timed for each loader figure (default 10)")
    bench.add_argument("--rank-workers", type=int, default=None, metavar="N",
                       help="(store) loader processes a rank (default: the config's replay.workers, at most two "
                            "a core among the ranks)")
    bench.add_argument("--json", action="store_true", help="print the figures as JSON")
    return parser


def _missing_training_module():
    """The name of the first training dependency that is not installed, or None.

    Found, not imported: importing torch costs a command about 2 s of CPU before it starts,
    which `keys`, `bootstrap` and the daemon's restarts of its children paid for nothing."""
    import importlib.util

    for name in ("torch", "onnx"):
        try:
            if importlib.util.find_spec(name) is None:
                return name
        except (ImportError, ValueError) as exc:
            return getattr(exc, "name", None) or name
    return None


def _one_line(exc: BaseException, limit: int = 300) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _net_from_checkpoint(path: str, config, weights: str = "auto"):
    """The network in checkpoint ``path`` and which weights it holds ("raw", "ema", "swa");
    ValueError for one that does not hold a fitting network."""
    from trainer.checkpoints import read_checkpoint
    from trainer.model import load_net

    checkpoint = read_checkpoint(path)
    has_config = "config" in checkpoint
    if not has_config and config is None:
        raise ValueError(f"checkpoint {path} has no 'config': give --config BLOCKSxFILTERS")
    average = checkpoint.get("average") if has_config else None
    kind = average.get("kind") if isinstance(average, dict) and average.get("weights") else None
    if weights == "average" and kind is None:
        raise ValueError(f"checkpoint {path} has no averaged weights: export its raw weights (--weights raw)")
    chosen = weights if weights != "auto" else _exported_weights(path, checkpoint.get("step"), kind)
    if chosen != "raw":
        checkpoint = {**checkpoint, "model": average["weights"]}
        chosen = kind
    try:
        net = load_net(checkpoint) if has_config else load_net(checkpoint, config=config)
    except ValueError as exc:
        raise ValueError(f"checkpoint {path}: {exc}") from None
    except (TypeError, KeyError, RuntimeError) as exc:  # a config or state dict that does not fit
        raise ValueError(f"checkpoint {path} does not hold a network cyzero can load: {_one_line(exc)}") from None
    if has_config and config is not None and (config.blocks, config.filters) != (net.config.blocks, net.config.filters):
        raise ValueError(f"--config {config.name} does not match the checkpoint's {net.config.name}")
    return net, chosen


def _exported_weights(path: str, step, kind) -> str:
    """``--weights auto``: "raw" or "average", as the learner chose when it exported the
    generation of checkpoint ``path`` (RUN/checkpoints/step-N.pt -> RUN/generations.jsonl)."""
    from trainer.atomic import read_jsonl
    from trainer.rundir import GENERATIONS_FILE

    if kind is None:
        return "raw"
    run_dir = os.path.dirname(os.path.dirname(os.path.abspath(path)))
    try:
        records = read_jsonl(os.path.join(run_dir, GENERATIONS_FILE))
    except OSError:
        records = []
    for record in records:
        if record.get("step") == step and record.get("weights") in ("raw", kind):
            return "raw" if record["weights"] == "raw" else "average"
    return "average"


def export_main(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    import numpy as np

    from trainer.export import VARIANTS
    from trainer.model import NetConfig, build_net
    from trainer.network_files import is_onnx_path, read_network

    spec = args.variants if args.variants is not None else ("" if args.lc0 else ",".join(VARIANTS))
    variants = [v.strip() for v in spec.split(",") if v.strip()]
    bad = [v for v in variants if v not in VARIANTS]
    if bad or not (variants or args.lc0):
        parser.error(f"--variants: unknown {', '.join(bad) or '(none given)'}; choose from {','.join(VARIANTS)}")
    if args.positions < 1:
        parser.error("--positions must be at least 1")
    if args.from_lc0:
        clash = [flag for flag, given in (("--checkpoint", args.checkpoint), ("--config", args.config),
                                          ("--no-mlh", args.no_mlh and not args.lc0),
                                          ("--se-ratio", args.se_ratio is not None)) if given]
        if clash:
            parser.error(f"--from-lc0 takes the network from the file: leave out {', '.join(clash)}")
    out = sys.stderr if args.json else sys.stdout
    try:
        if args.from_lc0:
            net = _net_from_lc0_checked(args, out)
            source = args.from_lc0
        elif args.checkpoint and is_onnx_path(args.checkpoint):
            net, source = read_network(args.checkpoint)
        else:
            overrides = {}
            if args.no_mlh and not args.lc0:
                overrides["moves_left"] = False
            if args.se_ratio is not None:
                overrides["se_ratio"] = args.se_ratio
            config = NetConfig.from_name(args.config, **overrides) if args.config else None
            if args.checkpoint:
                net, weights = _net_from_checkpoint(args.checkpoint, config, args.weights)
                source = f"{args.checkpoint}, {weights} weights"
            else:
                net = build_net(config or NetConfig.from_name("6x64", **overrides), seed=args.seed)
                source = f"random init, seed {args.seed}"
        calibration = np.load(args.calibration, allow_pickle=False) if args.calibration else None
    except _ParityFailure as exc:
        print(f"cyzero-train export: {exc}", file=sys.stderr)
        return 1
    except (ValueError, OSError, KeyError, RuntimeError) as exc:
        print(f"cyzero-train export: error: {exc}", file=sys.stderr)
        return 2
    if args.variants is None:  # the network's own variants (an attention body has no int8)
        from trainer.export import variants_for

        variants = [v for v in variants if v in variants_for(net)]
    if not args.json:
        print(f"exporting {net.config.name} ({net.num_parameters():,} parameters, {source}) to {args.out}",
              file=sys.stderr, flush=True)
    return _write_exports(args, net, variants, calibration)


class _ParityFailure(Exception):
    """A rebuilt network that does not compute what its file computes: exit status 1."""


def _net_from_lc0_checked(args: argparse.Namespace, out):
    """``export --from-lc0 FILE``: the PyTorch network rebuilt from an lc0 file, checked against
    lc0's own graph (:func:`trainer.lc0_import.check_against_lc0`) on the export's check positions."""
    from engine.lc0 import read_lc0_file
    from trainer.export import sample_positions
    from trainer.lc0_import import Lc0ParityError, check_against_lc0, net_from_lc0

    lc0net = read_lc0_file(args.from_lc0)
    net = net_from_lc0(lc0net)
    print(f"lc0 file {args.from_lc0}: {lc0net.description}", file=out, flush=True)
    planes, masks = sample_positions(args.positions, seed=args.seed + 1)  # export's own check positions
    try:
        numbers = check_against_lc0(net, lc0net, planes, masks)
    except Lc0ParityError as exc:
        raise _ParityFailure(str(exc)) from None
    mlh = "" if numbers["mlh_max_abs_diff"] is None else f", mlh {numbers['mlh_max_abs_diff']:.2e}"
    print(f"torch vs lc0's graph over {numbers['positions']} positions: policy {numbers['policy_max_abs_diff']:.2e} "
          f"(logit scale {numbers['policy_scale']:.2f}), wdl {numbers['wdl_max_abs_diff']:.2e}{mlh}; "
          f"best legal move agrees {100 * numbers['policy_argmax_agreement']:.1f}%", file=out, flush=True)
    return net


def _write_exports(args: argparse.Namespace, net, variants: list[str], calibration) -> int:
    """The ONNX ``variants`` of ``net`` (each checked against PyTorch), then with ``--lc0`` its lc0
    weights file, read back and checked; the reports on stdout (or one JSON list)."""
    from trainer.export import ExportParityError, export_variants
    from trainer.lc0_export import Lc0FileParityError

    reports: list[dict] = []

    def show(report):
        if not args.json:
            print(report.summary(), flush=True)

    try:
        if variants:
            reports += [r.to_dict() for r in export_variants(
                net, args.out, stem=args.name, variants=variants, calibration_planes=calibration,
                seed=args.seed, check_positions=args.positions, on_report=show,
            )]
        if args.lc0:
            reports.append(_export_lc0_file(args, net))
    except (ExportParityError, Lc0FileParityError) as exc:
        print(f"cyzero-train export: {exc}", file=sys.stderr)
        return 1
    except (ValueError, OSError) as exc:
        print(f"cyzero-train export: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(reports, indent=2))
    return 0


def _export_lc0_file(args: argparse.Namespace, net) -> dict:
    """``export --lc0``: OUT/NAME.pb.gz (and its .sha256), written only after the message, read
    back as lc0's reader reads it, computes what the PyTorch network computes
    (:func:`trainer.lc0_export.check_lc0_file`)."""
    from trainer.export import sample_positions
    from trainer.lc0_export import check_lc0_file, lc0_file_bytes, write_lc0

    path = os.path.join(args.out, f"{args.name}.pb.gz")
    message = lc0_file_bytes(net, include_moves_left=False if args.no_mlh else None)
    planes, masks = sample_positions(args.positions, seed=args.seed + 1)
    lc0net, numbers = check_lc0_file(net, message, planes, masks, name=os.path.basename(path))
    os.makedirs(args.out, exist_ok=True)
    digest = write_lc0(net, path, message)
    report = {"variant": "lc0", "path": path, "bytes": os.path.getsize(path),
              "sha256": digest, "description": lc0net.description, **numbers}
    if not args.json:
        print(f"lc0   {path}: {lc0net.description}; {report['bytes']:,} bytes; read back vs torch "
              f"over {numbers['positions']} positions: policy {numbers['policy_max_abs_diff']:.2e}, "
              f"wdl {numbers['wdl_max_abs_diff']:.2e}, best legal move agrees "
              f"{100 * numbers['policy_argmax_agreement']:.1f}%", flush=True)
    return report


def learn_main(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from trainer.learner import learn

    if args.steps is not None and args.steps < 1:
        parser.error("--steps must be at least 1")
    return learn(args.run_dir, devices=args.devices, steps=args.steps, config_path=args.config,
                 follow=args.follow, progress=not args.no_progress, init_from=args.init_from)


def bootstrap_main(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    import shlex
    import threading

    from trainer import bootstrap
    from trainer.rundir import RunBusy
    from trainer.stop_signals import stop_on_signals

    if args.input_format is not None:
        from engine.encoding import INPUT_FORMATS   # here: `status` and the other commands import no numpy

        if args.input_format not in INPUT_FORMATS:
            parser.error(f"--input-format must be one of lc0's {INPUT_FORMATS}, got {args.input_format}")
    if args.teacher is not None:
        if args.positions is None or args.positions < 1:
            parser.error("--teacher needs --positions N (N >= 1): how many positions the run should hold")
        options = {k: getattr(args, k) for k in ("workers", "depth", "multipv", "temperature", "random_move_share",
                                                 "opening_plies", "max_plies", "student", "input_format")
                   if getattr(args, k) is not None}
        try:
            teacher = shlex.split(args.teacher) if args.teacher else bootstrap.default_teacher()
            stop = threading.Event()
            with stop_on_signals(stop):
                summary = bootstrap.bootstrap_teacher(
                    args.run_dir, teacher=teacher, positions=args.positions, syzygy=args.syzygy,
                    seed=args.seed, progress=not args.no_progress, stop=stop, **options)
        except (RuntimeError, RunBusy) as exc:  # TeacherError, or another bootstrap holding the run
            print(f"cyzero-train bootstrap: error: {exc}", file=sys.stderr)
            return 1
    elif args.pgn:
        summary = bootstrap.bootstrap_pgn(args.run_dir, args.pgn, progress=not args.no_progress,
                                          input_format=args.input_format)
    else:
        from trainer.store import ReplayStore, import_lc0_chunks

        fmt = bootstrap.run_input_format(args.run_dir) if args.input_format is None else args.input_format
        summary = import_lc0_chunks(ReplayStore(args.run_dir, fmt), args.lc0)
    print(summary)
    return 0


def status_main(args: argparse.Namespace) -> int:
    from trainer.report import format_status, run_status

    status = run_status(args.run_dir)
    print(json.dumps(status, indent=2) if args.json else format_status(status))
    return 0


def plot_main(args: argparse.Namespace) -> int:
    from trainer.report import plot_run

    for path in plot_run(args.run_dir, args.out):
        print(path)
    return 0


def evaluate_main(args: argparse.Namespace) -> int:
    from engine.tools.match import MatchError
    from trainer.evaluate import evaluate_run

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    import contextlib
    import dataclasses
    import threading

    from trainer.rundir import resolve_config
    from trainer.stop_signals import stop_on_signals

    try:
        config = resolve_config(args.run_dir, args.config or None)
    except (ValueError, OSError) as exc:
        print(f"cyzero-train evaluate: error: {_one_line(exc, 500)}", file=sys.stderr)
        return 2
    changes = {key: value for key, value in (("nodes", args.nodes), ("games", args.games),
                                             ("concurrency", args.concurrency), ("stockfish", args.stockfish))
               if value is not None}
    cfg = dataclasses.replace(config.ladder, **changes)
    if args.nice:
        os.nice(args.nice)
    stop = threading.Event()
    # with --follow, SIGTERM (the daemon's stop) and Ctrl-C end it between games, writing nothing half-done
    signals = stop_on_signals(stop, interrupt_again=False) if args.follow else contextlib.nullcontext()
    try:
        with signals:
            lines = evaluate_run(args.run_dir, every=args.every, cfg=cfg, follow=args.follow, log=progress,
                                 stop=stop)
    except KeyboardInterrupt:
        return 0 if stop.is_set() else 130
    except MatchError as exc:
        print(f"cyzero-train evaluate: error: {_one_line(exc, 500)}", file=sys.stderr)
        return 1
    for line in lines:
        print(json.dumps(line))
    return 0


def bench_main(args: argparse.Namespace) -> int:
    if args.what == "fleet":
        from trainer.bench_fleet import bench_fleet, format_fleet_report

        try:
            result = bench_fleet(run_dir=args.run, config=args.config, workers=args.workers, rate=args.rate,
                                 games_per_hour_per_worker=args.games_per_hour_per_worker,
                                 positions_per_game=args.positions_per_game,
                                 seconds=60.0 if args.seconds is None else args.seconds, followers=args.followers,
                                 network_mb=args.network_mb, generations=args.generations, attach=args.attach,
                                 curve=args.curve, profile=args.profile, kill_at=args.kill_at)
        except RuntimeError as e:
            print(f"cyzero-train bench fleet: {e}", file=sys.stderr)
            return 1
        print(json.dumps(result.figures, indent=2) if args.json else format_fleet_report(result.figures))
        return 0 if result.ok else 1
    if args.what == "store":
        from trainer.bench_store import bench_store, format_store_report

        try:
            figures = bench_store(run_dir=args.run, positions=args.positions, config=args.config or "gpu",
                                  window_positions=args.window, batches=args.batches,
                                  rank_workers=args.rank_workers)
        except ValueError as e:
            print(f"cyzero-train bench store: {e}", file=sys.stderr)
            return 2
        print(json.dumps(figures, indent=2) if args.json else format_store_report(figures))
        return 0
    if args.what == "bootstrap":
        import shlex

        from trainer.bootstrap import labelling_cost

        figures = labelling_cost(shlex.split(args.teacher) if args.teacher else None,
                                 seconds=10.0 if args.seconds is None else args.seconds)
        if not args.json:
            print("cyzero-train bench bootstrap: one teacher process, one thread, in play (labels included)")
            for row in figures:
                print(f"  depth {row['depth']:>2}  MultiPV {row['multipv']}  {row['ms_per_position']:6.1f} ms a position"
                      f"  ({row['positions']:,} positions)")
            return 0
        print(json.dumps(figures, indent=2))
        return 0
    if args.what == "selfplay":
        from trainer.bench_selfplay import bench_selfplay

        figures = bench_selfplay(print_report=not args.json, seconds=20.0 if args.seconds is None else args.seconds,
                                 config=args.config, device=args.device, simulate_gpu=args.simulate_gpu,
                                 games=args.games)
        if args.json:
            print(json.dumps(figures, indent=2))
        return 0
    from trainer.bench import bench_train

    try:
        figures = bench_train(print_report=not args.json, run_dir=args.run, config_name=args.config)
    except ValueError as e:
        print(f"cyzero-train bench train: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(figures, indent=2))
    return 0


def keys_main(args: argparse.Namespace) -> int:
    from trainer.keys import create_keys

    written = create_keys(args.directory, args.client or ["worker"])
    for path in written:
        print(path)
    if not written:
        print(f"cyzero-train keys: {args.directory} already holds every key asked for", file=sys.stderr)
    return 0


def run_main(args: argparse.Namespace) -> int:
    from trainer.daemon import run_daemon

    return run_daemon(args.run_dir, config=args.config, devices=args.devices,
                      workers_per_device=args.workers_per_device, learner_devices=args.learner_devices,
                      simulate_gpu=args.simulate_gpu, init_from=args.init_from, port=args.port)


def worker_main(args: argparse.Namespace) -> int:
    from trainer.worker import run_workers

    if args.nice:  # before any thread starts: they inherit it
        try:
            os.nice(args.nice)
        except OSError as e:
            print(f"cyzero-train worker: --nice {args.nice} not applied: {e}", file=sys.stderr)

    return run_workers(args.connect, keys=args.keys, devices=args.devices, name=args.name, games=args.games,
                       threads=args.threads, simulate_gpu=args.simulate_gpu)


_COMMANDS = {
    "learn": learn_main,
    "run": lambda args, parser: run_main(args),
    "worker": lambda args, parser: worker_main(args),
    "bootstrap": bootstrap_main,
    "export": export_main,
    "status": lambda args, parser: status_main(args),
    "plot": lambda args, parser: plot_main(args),
    "evaluate": lambda args, parser: evaluate_main(args),
    "bench": lambda args, parser: bench_main(args),
    "keys": lambda args, parser: keys_main(args),
}


def _stop_with_parent() -> None:
    """With CYZERO_EXIT_WITH_PARENT set to the daemon's pid (the daemon sets it for its
    children): once that process is gone, SIGTERM this one (a clean stop: the learner's final
    checkpoint, the worker's last resends), and end it outright a minute later if that did not."""
    try:
        parent = int(os.environ.get(EXIT_WITH_PARENT_ENV, ""))
    except ValueError:
        return
    import signal
    import time

    from trainer.lifeline import end_with

    def stop() -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(60.0)
        os._exit(1)

    end_with(parent, stop)


@quiet_when_reader_gone
def main(argv=None) -> int:
    """Run ``cyzero-train``; returns the process exit code."""
    parser = _build_parser()
    args = parser.parse_args(argv)
    _stop_with_parent()
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    # workers need the engine only; status and plot only read the run's files (status answers at once)
    missing = None if args.command in ("worker", "status", "plot") else _missing_training_module()
    if missing:
        print(f"cyzero-train {args.command}: needs {missing}, which an engine-only install leaves out; "
              f"{TRAIN_EXTRA_HINT}", file=sys.stderr)
        return 2
    try:
        return _COMMANDS[args.command](args, parser)
    except KeyboardInterrupt:
        print(f"cyzero-train {args.command}: interrupted", file=sys.stderr)
        return 130
    except (ValueError, OSError) as exc:  # bad input or a file problem: one line, no traceback
        if reader_gone(exc):
            raise  # stdout's reader left: quiet_when_reader_gone ends the command as Unix tools end
        print(f"cyzero-train {args.command}: error: {_one_line(exc, 500)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
