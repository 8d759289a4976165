"""The training config: nested frozen dataclasses read from TOML, every key documented.

A run's config lives in ``RUN/config.toml``: the first ``learn`` or ``run`` copies it there
(from ``--config``, or the defaults), and from then on it is the user's file, never rewritten.
The config a process really uses, every key written out, is ``RUN/config.effective.toml``
(:data:`EFFECTIVE_CONFIG_FILE`, written atomically by the learner and the daemon at start);
what reads the run's settings (``status``, the daemon's learner) reads that one.
A file names only the keys it changes; everything else keeps the default documented
here, in the field's ``doc`` metadata (which :func:`markdown_table` renders for the
docs and :func:`to_toml` writes as comments). An unknown section or key, a value of
the wrong type or outside its range is a :class:`ValueError` naming the key, so a typo
never trains silently with a default.

Sections: ``[model]`` (the network's shape), ``[optimizer]``, ``[loss]``,
``[train]`` (batch, checkpoints, precision, weight averaging), ``[replay]`` (the
sampling window and the loader), ``[log]``, and for ``cyzero-train run``: ``[selfplay]``,
``[daemon]`` and ``[gating]``. No torch here: the CLI and the status
report read configs without it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import tomllib
import typing
from collections.abc import Sequence
from typing import Any

__all__: Sequence[str] = [
    "ModelConfig", "OptimizerConfig", "LossConfig", "TrainingConfig", "ReplayConfig", "LogConfig",
    "SelfPlayConfig", "DaemonConfig", "GatingConfig", "LadderConfig",
    "TrainConfig", "default_config", "load_config", "loads_config", "from_dict", "to_toml", "toml_value",
    "markdown_table", "model_differences", "CONFIG_FILE", "EFFECTIVE_CONFIG_FILE", "load_run_config",
    "load_effective_config", "bundled_config", "bundled_config_names", "named_config_path", "load_named_config",
    "window_size", "is_validation", "TEACHER_DEFAULTS",
]

#: The teacher bootstrap's defaults (``cyzero-train bootstrap --teacher``): :mod:`trainer.bootstrap`
#: uses them, and the CLI shows them in ``--help`` without importing it (chess, numpy, the engine).
TEACHER_DEFAULTS: dict[str, Any] = {
    "depth": 6,                  # search depth per position (trainer/bootstrap.py says why)
    "multipv": 1,                # moves scored per position
    "temperature": 50.0,         # MultiPV softmax temperature, centipawns
    "random_move_share": 0.05,   # share of uniformly random moves after the opening
    "opening_plies": 8,          # random opening plies: between half of this and this many
    "max_plies": 300,            # a game this long is adjudicated a draw
}

#: the run's config, in the run directory: the user's file (the first start copies it there; never rewritten)
CONFIG_FILE = "config.toml"
#: the config in use, every key written out (atomically) beside the user's: what status and the daemon's
#: learner read
EFFECTIVE_CONFIG_FILE = "config.effective.toml"


def _f(default, doc: str, *, choices: tuple | None = None, min: float | None = None,
       max: float | None = None, above: float | None = None):
    """A config field: its default, a one-line meaning, and the values it may take."""
    meta = {"doc": doc, "choices": choices, "min": min, "max": max, "above": above}
    if isinstance(default, list):
        return dataclasses.field(default_factory=lambda: list(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """The network's shape (:class:`trainer.model.NetConfig`); fixed for the life of a run."""

    net: str = _f("6x64", "residual blocks x filters, e.g. 6x64, 10x128, 20x256; or an attention body "
                  "bt-EMBEDDINGxLAYERSxHEADSh, e.g. bt-64x6x4h (lc0's BT structure)")
    se_ratio: int = _f(4, "squeeze-excitation reduction: SE hidden width = filters / se_ratio", min=1)
    policy_head: str = _f("conv", "policy head: conv (lc0's 73-plane conv head) or fc (1x1 conv + linear) on a "
                          "residual tower; an attention body has lc0's attention policy (attention)",
                          choices=("conv", "fc", "attention"))
    moves_left: bool = _f(True, "train and export the moves-left head (/output/mlh)")
    se: bool = _f(True, "a squeeze-excitation unit in every residual block (false: plain residual blocks, "
                  "as some lc0 nets)")
    activation: str = _f("", "the activation of every hidden layer: relu, or mish (as some lc0 nets); empty: "
                         "the family's, relu for a residual tower, mish for an attention body",
                         choices=("", "relu", "mish"))
    policy_channels: int = _f(32, "fc policy head: channels of its 1x1 convolution", min=1)
    value_channels: int = _f(32, "value head: channels of its 1x1 convolution", min=1)
    value_hidden: int = _f(128, "value head: width of its hidden linear layer", min=1)
    mlh_channels: int = _f(8, "moves-left head: channels of its 1x1 convolution", min=1)
    mlh_hidden: int = _f(128, "moves-left head: width of its hidden linear layer", min=1)
    mlh_activation: str = _f("", "moves-left head: its output's activation, softplus or relu (lc0's); empty: "
                             "the family's, softplus for a residual tower, relu for an attention body",
                             choices=("", "softplus", "relu"))
    ffn_hidden: int = _f(0, "attention body: the encoder FFN's width (0: twice the embedding)", min=0)
    ffn_activation: str = _f("mish", "attention body: the FFN's activation (lc0's names)",
                             choices=("mish", "relu", "swish", "relu2", "selu"))
    smolgen: bool = _f(True, "attention body: smolgen in every encoder layer (the attention bias from the board)")
    smolgen_channels: int = _f(0, "attention body: smolgen's per-square compression (0: embedding / 32, at least 4)",
                               min=0)
    smolgen_hidden: int = _f(0, "attention body: smolgen's first layer (0: embedding / 4, at least 16)", min=0)
    smolgen_gen: int = _f(0, "attention body: smolgen's values per head (0: embedding / 4, at least 16)", min=0)
    pe_channels: int = _f(0, "attention body: the PE-dense embedding's positional channels per square "
                          "(0: embedding / 32, at least 4)", min=0)
    policy_embedding: int = _f(0, "attention body: the attention policy's per-square embedding (0: the "
                               "embedding's width)", min=0)
    policy_d_model: int = _f(0, "attention body: the attention policy's queries and keys (0: the embedding's "
                             "width)", min=0)
    input_format: int = _f(1, "lc0's input format of the planes: 1 (classical) for the runs the learner "
                           "trains; a network from an lc0 file (init_from) brings its own",
                           choices=(1, 2, 3, 4, 5, 132, 133))


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    """Optimiser and learning-rate schedule (the rate is per global batch).

    The defaults were chosen by measurement: on 30k stockfish-labelled positions (a 2x32 net,
    batch 64, one pass, two seeds) AdamW reached a held-out loss of 3.85-3.94 at rates
    3e-3..1e-2, SGD with Nesterov momentum 4.02-4.12 at its best rates 0.05..0.2; and a
    constant rate with the EMA weights (3.86-3.88) did as well as a cosine decay, without
    needing the run's length in advance.
    """

    kind: str = _f("adamw", "adamw, or sgd (with momentum, Nesterov by default, as lc0)", choices=("sgd", "adamw"))
    lr: float = _f(0.003, "peak learning rate, reached after the warm-up (adamw: 1e-3..1e-2; "
                   "sgd: 0.02..0.2)", above=0.0)
    momentum: float = _f(0.9, "SGD momentum; AdamW's beta1", min=0.0, max=0.999999)
    nesterov: bool = _f(True, "SGD: Nesterov momentum (as lc0)")
    beta2: float = _f(0.999, "AdamW's beta2", min=0.0, max=0.999999)
    weight_decay: float = _f(0.01, "weight decay on conv and linear weights (not batch norm, not biases): "
                             "adamw decoupled (about 0.01); sgd an L2 term in the gradient (lc0: 1e-4)", min=0.0)
    warmup_steps: int = _f(250, "steps of linear warm-up from 0 to lr", min=0)
    schedule: str = _f("constant", "after the warm-up: constant, cosine (lr -> min_lr over decay_steps) "
                       "or step (x gamma at each milestone)", choices=("cosine", "step", "constant"))
    decay_steps: int = _f(100_000, "cosine: steps (counted from the end of the warm-up) to reach min_lr; "
                          "min_lr after that", min=1)
    min_lr: float = _f(3e-5, "cosine: the rate at and after decay_steps", min=0.0)
    milestones: list[int] = _f([100_000, 300_000, 500_000], "step: the steps at which the rate is "
                               "multiplied by gamma (AlphaZero's drops)")
    gamma: float = _f(0.1, "step: factor at each milestone", above=0.0)


@dataclasses.dataclass(frozen=True)
class LossConfig:
    """Loss heads as lc0 trains them (the L2 term is the optimiser's weight decay)."""

    policy: float = _f(1.0, "weight of the policy cross-entropy (target over legal moves only)", min=0.0)
    value: float = _f(1.0, "weight of the WDL cross-entropy against the value target (see value_q_ratio)", min=0.0)
    value_q_ratio: float = _f(0.0, "share of the search's value of its best move in the WDL target, the rest "
                              "the game result (lc0's q_ratio; teacher labels carry the same value in both)",
                              min=0.0, max=1.0)
    moves_left: float = _f(1.0, "weight of the moves-left Huber loss (0 to ignore the head)", min=0.0)
    moves_left_scale: float = _f(20.0, "plies per unit in the moves-left loss: prediction and target "
                                 "are divided by it (lc0: 20)", above=0.0)
    huber_delta: float = _f(10.0, "moves-left Huber delta in plies, quadratic within it (lc0: 10)", above=0.0)


@dataclasses.dataclass(frozen=True)
class TrainingConfig:
    """The training loop: batch, checkpoints, precision, weight averaging, the process group."""

    batch_size: int = _f(1024, "positions per step, over all ranks together (a multiple of the rank count)",
                         min=1)
    checkpoint_every: int = _f(1000, "steps between checkpoints; each one also exports an ONNX generation",
                               min=1)
    keep_checkpoints: int = _f(5, "newest checkpoints kept; older ones are deleted", min=1)
    clip_grad_norm: float = _f(10.0, "clip the global gradient norm to this (0: no clipping)", min=0.0)
    seed: int = _f(0, "network init and sampling seed", min=0)
    init_from: str = _f("", "a new run starts from this network: an lc0 weights file (.pb.gz, .pb), a cyzero "
                        "fp32 ONNX export (.onnx) or a cyzero checkpoint (.pt), relative to the run directory; its shape replaces the [model] "
                        "section; ignored once the run has a checkpoint (empty: a freshly initialised network)")
    init_blocks: int = _f(0, "with init_from: the new run's residual blocks (0: the file's); more than the file has "
                          "adds blocks that start as the identity, spread among the file's, so the deeper network "
                          "starts from the file's function (ReLU networks)", min=0)
    amp: str = _f("bf16", "mixed precision on CUDA: bf16, fp16 (with a gradient scaler) or off; "
                  "the CPU always trains in float32", choices=("bf16", "fp16", "off"))
    average: str = _f("ema", "weight averaging: ema, swa (lc0's running average) or none; the export "
                      "uses the averaged weights when they have the lower validation loss",
                      choices=("ema", "swa", "none"))
    ema_decay: float = _f(0.999, "ema: decay per step (warmed up as min(decay, (1+n)/(10+n)))",
                          min=0.0, max=0.999999)
    swa_every: int = _f(100, "swa: steps between the snapshots averaged", min=1)
    swa_max_n: int = _f(10, "swa: a new snapshot weighs at least 1/swa_max_n (lc0's swa_max_n)", min=1)
    dist_timeout_s: float = _f(120.0, "process-group timeout: a rank that waits longer on a dead peer "
                               "fails instead of hanging", above=0.0)
    starved_poll_s: float = _f(5.0, "with --follow: seconds between looks for new data when the "
                               "sampling cap is reached", above=0.0)


@dataclasses.dataclass(frozen=True)
class ReplayConfig:
    """The sampling window (``trainer.loader.WindowConfig``) and the data loader."""

    floor: int = _f(250_000, "window floor m: all positions while there are at most m (KataGo: 250k)",
                    min=1)
    alpha: float = _f(0.65, "window growth exponent (KataGo's alpha), below 1", above=0.0, max=0.999999)
    beta: float = _f(0.4, "window growth factor (KataGo's beta)", above=0.0)
    max_samples_per_position: float = _f(8.0, "cap on samples drawn in all, per training position in the "
                                         "store: past it the learner waits for new games (or stops)", above=0.0)
    val_percent: float = _f(5.0, "share held out for validation: of self-play's games from the first on, of other "
                               "chunks by name hash", min=0.0, max=100.0)
    workers: int = _f(2, "loader worker processes per rank", min=0)
    prefetch: int = _f(4, "batches each rank's loader keeps ready", min=1)
    validation_positions: int = _f(1024, "held-out positions evaluated at every log interval and checkpoint, "
                                   "drawn from four times as many in the newest held-out chunks (0: none)", min=0)
    keep_positions: int = _f(0, "retention: at each checkpoint delete the oldest chunks wholly outside the "
                             "newest keep_positions positions (never inside the window; 0: keep everything)", min=0)
    keep_networks: int = _f(0, "retention: at each checkpoint delete all but the newest keep_networks exported "
                            "networks (0: keep every generation)", min=0)


@dataclasses.dataclass(frozen=True)
class LogConfig:
    """What is logged and how often."""

    interval: int = _f(100, "steps between lines in metrics.jsonl, TensorBoard scalars and validation",
                       min=1)


@dataclasses.dataclass(frozen=True)
class SelfPlayConfig:
    """How self-play workers play (``trainer.selfplay.SelfPlaySettings``; the daemon sends it to
    every worker when it registers)."""

    visits: int = _f(800, "root visits of a full search (AlphaZero: 800)", min=1)
    fast_visits: int = _f(100, "root visits of a fast search, played but not trained on (KataGo's playout "
                          "cap randomisation)", min=1)
    full_search_prob: float = _f(0.25, "share of moves searched in full and recorded for training", above=0.0,
                                 max=1.0)
    noise_alpha: float = _f(0.3, "Dirichlet noise alpha at the root of full searches (AlphaZero chess: 0.3)",
                            above=0.0)
    noise_epsilon: float = _f(0.25, "weight of the root noise (0: none)", min=0.0, max=1.0)
    temperature: float = _f(1.0, "moves are drawn with probability visits^(1/T) before temp_cutoff_ply",
                            min=0.0)
    temp_cutoff_ply: int = _f(30, "the ply from which the most visited move is played (0: T always)", min=0)
    max_plies: int = _f(450, "a game this long is adjudicated a draw", min=1)
    resign: bool = _f(True, "resign lost games (a share resign_playthrough never resigns, to check)")
    resign_q: float = _f(-0.9, "resign when the mover's root Q (W - L) is at or below this", min=-1.0, max=1.0)
    resign_playthrough: float = _f(0.1, "share of games that never resign; how many of those a resignation "
                                   "would have lost is logged", min=0.0, max=1.0)
    opening_plies: int = _f(0, "uniformly random plies played (not recorded) at the start of each game",
                            min=0)
    openings: str = _f("bundled", "start positions, one drawn per game: bundled (the engine's 67 balanced "
                       "opening lines), a file of FEN/EPD/SAN lines or a PGN (relative to the run directory), "
                       "or empty for the standard start")
    games_per_worker: int = _f(0, "games each worker plays at once, their leaves batched together "
                               "(0: 32 on a CPU, 256 on a GPU)", min=0)
    syzygy: str = _f("", "Syzygy tablebase folders (os.pathsep-separated) for adjudication; empty: none")


@dataclasses.dataclass(frozen=True)
class DaemonConfig:
    """``cyzero-train run``: endpoints, keys, workers and supervision."""

    endpoint: str = _f("tcp://127.0.0.1:5780", "ROUTER for workers (register, heartbeats, games); a port "
                       "of * picks a free one (RUN/daemon.json says which)")
    publish: str = _f("tcp://127.0.0.1:5781", "PUB for network announcements (an engine's TrainerEndpoint)")
    fetch: str = _f("tcp://127.0.0.1:5782", "ROUTER serving the announced network's bytes to followers "
                    "that cannot read the run directory")
    keys: str = _f("", "the folder `cyzero-train keys` made: CurveZMQ on every socket, only its authorized "
                   "clients admitted; required when an endpoint is not loopback")
    devices: str = _f("cpu", "self-play devices: cpu, or cuda:0,1,... (--devices overrides)")
    workers_per_device: int = _f(1, "self-play worker processes per device (--workers-per-device); 0: none "
                                 "here, the daemon serves remote workers only (a cluster's coordinator)", min=0)
    learner_devices: str = _f("cpu:1", "the learner's devices: cpu:N or cuda:0,1,... (--learner-devices); "
                              "none: no learner here (one runs elsewhere, under torchrun, on the shared run "
                              "folder)")
    worker_threads: int = _f(0, "ONNX Runtime threads per CPU worker (0: the cores shared among the "
                             "CPU workers)", min=0)
    worker_nice: int = _f(10, "local self-play workers run this much lower in priority (nice) than the "
                          "learner: while it trains it has its cores, while it waits for games self-play "
                          "has them all (0: the same priority)", min=0, max=19)
    learner_threads: int = _f(1, "torch threads per CPU learner rank under the daemon (0: torch's default, "
                              "every core: it then competes with self-play for all of them)", min=0)
    learner_cores: int = _f(0, "cores given to a CPU learner alone (its affinity; the local workers get the "
                            "others): it trains at its full rate, but self-play loses those cores while the "
                            "learner waits for games. 0: every process may use every core, the workers lower in "
                            "priority (worker_nice)", min=0)
    heartbeat_timeout_s: float = _f(120.0, "a local worker silent this long is killed and restarted",
                                    above=0.0)
    flush_s: float = _f(5.0, "longest wait before received games are written to the store (one chunk per "
                        "generation) and acknowledged: longer means fewer, larger chunks", above=0.0)
    flush_games: int = _f(64, "games written as one store chunk at most", min=1)
    restart_backoff_s: float = _f(2.0, "first wait before restarting a dead worker or learner; doubled "
                                  "after each quick death, up to 60 s", above=0.0)


@dataclasses.dataclass(frozen=True)
class GatingConfig:
    """Optional gating: a new generation plays the current best and is published only if an SPRT
    accepts it."""

    enabled: bool = _f(False, "gate each new generation (otherwise every generation is published)")
    nodes: int = _f(64, "nodes per move in gating games (fixed, so CPU matches are quick)", min=1)
    elo0: float = _f(0.0, "SPRT H0: the new generation is this many Elo better (or worse)")
    elo1: float = _f(30.0, "SPRT H1: ... this many Elo better; elo1 > elo0")
    alpha: float = _f(0.05, "SPRT false-positive rate", above=0.0, max=0.5)
    beta: float = _f(0.05, "SPRT false-negative rate", above=0.0, max=0.5)
    max_games: int = _f(200, "at most this many games; then the sign of the log-likelihood ratio decides",
                        min=2)
    concurrency: int = _f(1, "gating games played at once", min=1)


@dataclasses.dataclass(frozen=True)
class LadderConfig:
    """The strength ladder: the daemon rates each new generation against fixed anchors (the random
    mover at Elo 0, generation 0, earlier generations, Stockfish's skill levels) while the run goes on."""

    enabled: bool = _f(True, "play the ladder beside the run (a `cyzero-train evaluate --follow` child of the "
                       "daemon, as low in priority as the workers)")
    nodes: int = _f(64, "nodes per move of the run's generations (fixed, so ratings compare across machines "
                    "and runs)", min=1)
    games: int = _f(20, "games a pairing: half with each colour, from the same openings (an even number)",
                    min=2)
    window: float = _f(600.0, "a generation plays the anchors rated within this many Elo of it (and its "
                       "predecessor always): far weaker or stronger ones teach the fit nothing", above=0.0)
    stockfish: str = _f("stockfish", "Stockfish's command (bare: on PATH or Debian's /usr/games); empty: "
                        "no Stockfish anchors")
    stockfish_levels: str = _f("0,3,6,10", "Stockfish's Skill Level anchors, comma-separated (0-20)")
    stockfish_nodes: int = _f(20000, "nodes per move of Stockfish (enough to reach the depth its skill "
                              "level picks its move at)", min=1)
    concurrency: int = _f(1, "ladder games at once (one core each)", min=1)


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """The whole training config; sections as in the TOML file."""

    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    optimizer: OptimizerConfig = dataclasses.field(default_factory=OptimizerConfig)
    loss: LossConfig = dataclasses.field(default_factory=LossConfig)
    train: TrainingConfig = dataclasses.field(default_factory=TrainingConfig)
    replay: ReplayConfig = dataclasses.field(default_factory=ReplayConfig)
    log: LogConfig = dataclasses.field(default_factory=LogConfig)
    selfplay: SelfPlayConfig = dataclasses.field(default_factory=SelfPlayConfig)
    daemon: DaemonConfig = dataclasses.field(default_factory=DaemonConfig)
    gating: GatingConfig = dataclasses.field(default_factory=GatingConfig)
    ladder: LadderConfig = dataclasses.field(default_factory=LadderConfig)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return dataclasses.asdict(self)

    def replace(self, **sections: dict[str, Any]) -> "TrainConfig":
        """A copy with some keys changed: ``config.replace(train={"batch_size": 64})`` (checked)."""
        data = self.to_dict()
        for section, values in sections.items():
            if section not in data:
                raise ValueError(f"unknown config section [{section}]")
            data[section].update(values)
        return from_dict(data)


def ladder_levels(text: str) -> tuple[int, ...]:
    """``ladder.stockfish_levels`` as Skill Levels, lowest first; ValueError for anything but 0-20s."""
    levels = []
    for part in (p.strip() for p in str(text).split(",")):
        if not part:
            continue
        if not part.isdigit() or not 0 <= int(part) <= 20:
            raise ValueError(f"{part!r} is not a Skill Level (0-20)")
        levels.append(int(part))
    return tuple(sorted(set(levels)))


_SECTION_TYPES = typing.get_type_hints(TrainConfig)


def _check_value(key: str, field: dataclasses.Field, kind, value):
    """``value`` converted to the field's type, or ValueError naming ``key``."""
    meta = field.metadata
    if kind is bool:
        if not isinstance(value, bool):
            raise ValueError(f"config key {key} must be true or false, got {value!r}")
        return value
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"config key {key} must be an integer, got {value!r}")
    elif kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"config key {key} must be a number, got {value!r}")
        value = float(value)
        if not math.isfinite(value):
            raise ValueError(f"config key {key} must be finite, got {value!r}")
    elif kind is str:
        if not isinstance(value, str):
            raise ValueError(f"config key {key} must be a string, got {value!r}")
    elif typing.get_origin(kind) is list:
        if not isinstance(value, list) or any(isinstance(v, bool) or not isinstance(v, int) for v in value):
            raise ValueError(f"config key {key} must be a list of integers, got {value!r}")
        if any(v < 1 for v in value) or value != sorted(set(value)):
            raise ValueError(f"config key {key} must list increasing steps >= 1, got {value!r}")
        return list(value)
    else:  # pragma: no cover - a field type this module does not handle
        raise TypeError(f"config key {key} has unsupported type {kind!r}")
    if meta.get("choices") and value not in meta["choices"]:
        raise ValueError(f"config key {key} must be one of {', '.join(map(str, meta['choices']))}, got {value!r}")
    if meta.get("min") is not None and value < meta["min"]:
        raise ValueError(f"config key {key} must be >= {meta['min']}, got {value!r}")
    if meta.get("max") is not None and value > meta["max"]:
        raise ValueError(f"config key {key} must be <= {meta['max']}, got {value!r}")
    if meta.get("above") is not None and value <= meta["above"]:
        raise ValueError(f"config key {key} must be > {meta['above']}, got {value!r}")
    return value


def _model_name_ok(name: str) -> bool:
    """``BxF`` (a residual tower) or ``bt-ExLxHh`` (an attention body), every number at least 1
    (trainer.model.NetConfig.from_name parses them; this module does not import torch)."""
    match = (re.fullmatch(r"\s*(\d+)\s*x\s*(\d+)\s*", name, re.IGNORECASE)
             or re.fullmatch(r"\s*bt-(\d+)x(\d+)x(\d+)h\s*", name, re.IGNORECASE))
    return match is not None and all(int(g) >= 1 for g in match.groups())


def from_dict(data: dict[str, Any]) -> TrainConfig:
    """A :class:`TrainConfig` from nested dicts (missing keys take their defaults); ValueError naming
    the first unknown or bad key."""
    if not isinstance(data, dict):
        raise ValueError(f"a config is a table of sections, got {type(data).__name__}")
    sections = {}
    for name, values in data.items():
        if name not in _SECTION_TYPES:
            raise ValueError(f"unknown config section [{name}]; known: {', '.join(_SECTION_TYPES)}")
        if not isinstance(values, dict):
            raise ValueError(f"config [{name}] must be a table of keys, got {values!r}")
        cls = _SECTION_TYPES[name]
        fields = {f.name: f for f in dataclasses.fields(cls)}
        hints = typing.get_type_hints(cls)
        checked = {}
        for key, value in values.items():
            if key not in fields:
                raise ValueError(f"unknown config key {name}.{key}; [{name}] has: {', '.join(fields)}")
            checked[key] = _check_value(f"{name}.{key}", fields[key], hints[key], value)
        sections[name] = cls(**checked)
    config = TrainConfig(**sections)
    if not _model_name_ok(config.model.net):
        raise ValueError("config key model.net must be BLOCKSxFILTERS such as 6x64, or an attention body "
                         f"bt-EMBEDDINGxLAYERSxHEADSh such as bt-64x4x4h, got {config.model.net!r}")
    if config.ladder.games % 2:
        raise ValueError(f"config key ladder.games must be even (each opening with both colours), "
                         f"got {config.ladder.games}")
    try:
        levels = ladder_levels(config.ladder.stockfish_levels)
    except ValueError as e:
        raise ValueError(f"config key ladder.stockfish_levels: {e}") from None
    del levels
    if config.gating.elo1 <= config.gating.elo0:
        raise ValueError(f"config key gating.elo1 must be > gating.elo0 ({config.gating.elo0}), "
                         f"got {config.gating.elo1}")
    return config


def default_config() -> TrainConfig:
    """Every key at its documented default."""
    return TrainConfig()


def loads_config(text: str, source: str = "<string>") -> TrainConfig:
    """A config from TOML text; ValueError naming ``source`` and the bad line or key."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{source}: not valid TOML: {exc}") from None
    try:
        return from_dict(data)
    except ValueError as exc:
        raise ValueError(f"{source}: {exc}") from None


def load_config(path: str | os.PathLike) -> TrainConfig:
    """Read a TOML config file (see the module doc); ValueError for a bad file, naming it."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as exc:
        raise ValueError(f"cannot read config {path}: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"config {path} is not UTF-8 text") from None
    return loads_config(text, path)


_BUNDLED_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs")


def bundled_config(name: str) -> str | None:
    """The path of the config that ships with the package under ``name`` (``cpu``, ``gpu``:
    ``trainer/configs/NAME.toml``), or None when there is none, so ``--config cpu`` works installed."""
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_-]+", name):
        return None
    path = os.path.join(_BUNDLED_DIR, f"{name}.toml")
    return path if os.path.isfile(path) else None


def bundled_config_names() -> list[str]:
    """The names ``--config`` takes besides a path: the bundled configs, sorted."""
    try:
        names = os.listdir(_BUNDLED_DIR)
    except OSError:
        return []
    return sorted(n[:-5] for n in names if n.endswith(".toml") and bundled_config(n[:-5]))


def named_config_path(name: str | os.PathLike) -> str:
    """The file a ``--config`` argument names: a bundled config's, or the path itself; ValueError
    listing the bundled names when it is neither (checked before anything is created)."""
    text = os.fspath(name)
    bundled = bundled_config(text)
    if bundled is not None:
        return bundled
    if not os.path.exists(text):
        raise ValueError(f"cannot read config {text}: no such file, and no bundled config is called that "
                         f"(bundled: {', '.join(bundled_config_names()) or 'none'})")
    return text


def load_named_config(name: str | os.PathLike) -> TrainConfig:
    """A config given on a command line: a bundled config's name (``cpu``, ``teacher-6x64``) or a path."""
    return load_config(named_config_path(name))


def load_run_config(run_dir: str | os.PathLike) -> TrainConfig:
    """``RUN/config.toml`` (the user's file) if the run has one, else the defaults."""
    path = os.path.join(os.fspath(run_dir), CONFIG_FILE)
    return load_config(path) if os.path.exists(path) else default_config()


def load_effective_config(run_dir: str | os.PathLike) -> TrainConfig:
    """The config the run's processes use: ``RUN/config.effective.toml`` (written at each start),
    else ``RUN/config.toml``, else the defaults."""
    path = os.path.join(os.fspath(run_dir), EFFECTIVE_CONFIG_FILE)
    return load_config(path) if os.path.exists(path) else load_run_config(run_dir)


# --------------------------------------------------------------------------- the sampling window
# The rule the [replay] keys describe, here without numpy or torch so that `cyzero-train status`
# reads a run quickly; trainer.loader samples by the same rule (tests/test_report.py checks they agree).


def window_size(total: int, *, floor: int, alpha: float = 0.65, beta: float = 0.4) -> int:
    """KataGo's window of the newest positions out of ``total``.

    ``W = total`` up to ``floor``, then
    ``W = floor + beta * (total^alpha - floor^alpha) / (alpha * floor^(alpha - 1))``.
    The window's slope at ``floor`` is ``beta``, and it grows as ``total^alpha``
    after: the net trains on recent data without forgetting too fast.
    """
    if floor < 1:
        raise ValueError(f"the window's floor must be >= 1 position, got {floor}")
    if not (0 < alpha < 1) or beta <= 0:
        raise ValueError(f"need 0 < alpha < 1 and beta > 0, got alpha={alpha}, beta={beta}")
    if total <= floor:
        return max(0, int(total))
    w = floor + beta * (total**alpha - floor**alpha) / (alpha * floor ** (alpha - 1))
    return min(int(total), int(w))


def is_validation(name: str, percent: float) -> bool:
    """Whether chunk ``name`` is held out: its sha256 falls in the first ``percent`` of the range.

    A hash of the name (as KataGo splits by file name), so every process and
    every run agrees without storing the split.
    """
    if percent <= 0:
        return False
    import hashlib

    value = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big")
    return value < percent / 100.0 * 2.0**64


def toml_value(value) -> str:
    """One value as TOML writes it (what `to_toml` and the tests' small configs write)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)  # finite (checked); repr round-trips and is valid TOML (1e-05, 0.1)
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string: the same escapes for these characters
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {value!r} as TOML")


def to_toml(config: TrainConfig) -> str:
    """The whole config as TOML, each key with its meaning as a comment; ``loads_config`` reads it back."""
    lines = ["# cyzero training config (trainer/config.py documents every key)."]
    for section in dataclasses.fields(TrainConfig):
        part = getattr(config, section.name)
        lines += ["", f"[{section.name}]"]
        for field in dataclasses.fields(part):
            lines.append(f"# {field.metadata['doc']}")
            lines.append(f"{field.name} = {toml_value(getattr(part, field.name))}")
    return "\n".join(lines) + "\n"


def markdown_table() -> str:
    """Every key with its default and meaning, as a markdown table (for the docs)."""
    rows = ["| key | default | meaning |", "|---|---|---|"]
    defaults = default_config()
    for section in dataclasses.fields(TrainConfig):
        part = getattr(defaults, section.name)
        for field in dataclasses.fields(part):
            value = toml_value(getattr(part, field.name))
            rows.append(f"| `{section.name}.{field.name}` | `{value}` | {field.metadata['doc']} |")
    return "\n".join(rows) + "\n"


def model_differences(a: TrainConfig | dict, b: TrainConfig | dict) -> list[str]:
    """The ``[model]`` keys whose values differ (a run's network shape cannot change)."""
    defaults = dataclasses.asdict(ModelConfig())  # a key an older config lacks has its default
    ma = {**defaults, **(a.to_dict()["model"] if isinstance(a, TrainConfig) else a["model"])}
    mb = {**defaults, **(b.to_dict()["model"] if isinstance(b, TrainConfig) else b["model"])}
    keys = list(dict.fromkeys([*ma, *mb]))
    return [f"model.{k}" for k in keys if ma.get(k) != mb.get(k)]
