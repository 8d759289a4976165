"""A run's setup before any rank trains: the network's shape from the config's ``[model]``
(:func:`net_config`, :func:`model_section`), the network ``train.init_from`` starts a new run
from, the checks and config files of a start (:func:`prepare_run`), and the newest exported
generation. :func:`trainer.learner.initialize_run` writes generation 0 with them."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Sequence
from typing import Any

from trainer.atomic import atomic_write_text, read_jsonl
from trainer.checkpoints import load_newest_checkpoint
from trainer.config import (
    ModelConfig, TrainConfig, load_config, model_differences, named_config_path, to_toml,
)
from trainer.model import Net, NetConfig
from trainer.rundir import CONFIG_FILE, EFFECTIVE_CONFIG_FILE, GENERATIONS_FILE, resolve_config

__all__: Sequence[str] = [
    "Log", "net_config", "model_section", "init_from_path", "read_init_network", "grown_config", "prepare_run",
    "newest_generation",
]

Log = Callable[[str], Any]


def net_config(config: TrainConfig) -> NetConfig:
    """The :class:`NetConfig` the ``[model]`` section describes."""
    m = config.model
    family = {key: value for key, value in (("activation", m.activation), ("mlh_activation", m.mlh_activation))
              if value}  # empty: the family's own (NetConfig.from_name)
    if m.input_format != 1:
        family["input_format"] = m.input_format
    if m.net.strip().lower().startswith("bt-"):  # the attention body's sizes (0: derived from the embedding)
        family.update({key: getattr(m, key) for key in _BODY_KEYS})
    return NetConfig.from_name(
        m.net, se_ratio=m.se_ratio, policy_head=m.policy_head, moves_left=m.moves_left, se=m.se,
        policy_channels=m.policy_channels, value_channels=m.value_channels,
        value_hidden=m.value_hidden, mlh_channels=m.mlh_channels, mlh_hidden=m.mlh_hidden, **family)


#: The [model] keys of an attention body beside the name's embedding, layers and heads.
_BODY_KEYS = ("ffn_hidden", "ffn_activation", "smolgen", "smolgen_channels", "smolgen_hidden", "smolgen_gen",
              "pe_channels", "policy_embedding", "policy_d_model")


def model_section(config: NetConfig) -> dict[str, Any]:
    """The ``[model]`` keys that describe ``config`` (:func:`net_config` reads them back)."""
    section = {"net": config.name, "se_ratio": config.se_ratio, "policy_head": config.policy_head,
               "moves_left": config.moves_left, "se": config.se, "activation": config.activation,
               "policy_channels": config.policy_channels, "value_channels": config.value_channels,
               "value_hidden": config.value_hidden, "mlh_channels": config.mlh_channels,
               "mlh_hidden": config.mlh_hidden, "mlh_activation": config.mlh_activation,
               "input_format": config.input_format}
    if config.body == "attention":
        section.update({key: getattr(config, key) for key in _BODY_KEYS})
    return section


# --------------------------------------------------------------------------- init-from


def init_from_path(config: TrainConfig, run_dir: str | os.PathLike) -> str:
    """``train.init_from`` as a path: ``~`` expanded, a relative one taken from the run directory."""
    path = os.path.expanduser(config.train.init_from)
    return os.path.abspath(path if os.path.isabs(path) else os.path.join(os.fspath(run_dir), path))


_INIT_NETWORKS: dict[tuple, tuple[Net, str]] = {}


def read_init_network(path: str) -> tuple[Net, str]:
    """:func:`trainer.network_files.read_network` of ``path`` (remembered for the file as it is, so
    the start's checks and the learner that loads it read it once)."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise ValueError(f"train.init_from: cannot read {path}: {exc.strerror or exc}") from None
    key = (path, st.st_mtime_ns, st.st_size)
    if key not in _INIT_NETWORKS:
        from trainer.network_files import read_network

        try:
            found = read_network(path)
        except ValueError as exc:
            raise ValueError(f"train.init_from: {exc}") from None
        _INIT_NETWORKS.clear()
        _INIT_NETWORKS[key] = found
    return _INIT_NETWORKS[key]


def grown_config(source: NetConfig, config: TrainConfig) -> NetConfig:
    """The shape a run from ``source`` trains: the file's, with ``train.init_blocks`` blocks when set."""
    blocks = config.train.init_blocks
    if not blocks or blocks == source.blocks:
        return source
    if blocks < source.blocks or source.activation != "relu":
        raise ValueError(f"train.init_blocks = {blocks}: the file's {source.name} network can only grow, and only "
                         f"with ReLU activations (it has {source.blocks} blocks, {source.activation})")
    return dataclasses.replace(source, blocks=blocks)


def _apply_init_from(run_dir: str, config: TrainConfig, log: Log) -> TrainConfig:
    """A new run with ``train.init_from``: ``config`` with the file's network shape as its ``[model]``."""
    path = init_from_path(config, run_dir)
    net, description = read_init_network(path)
    model = model_section(grown_config(net.config, config))
    before = config.model
    changed = [f"{key} {json.dumps(getattr(before, key))} -> {json.dumps(value)}" for key, value in model.items()
               if getattr(before, key) != value]
    log(f"learner: a new run from {description}; the network's shape comes from the file, not from the "
        f"config's [model]" + (f" ({', '.join(changed)})" if changed else " (the same shape)"))
    return config.replace(model=model)


# --------------------------------------------------------------------------- a start


def _write_run_config(run_dir: str, config: TrainConfig, config_path: str | os.PathLike | None, log: Log) -> None:
    """RUN/config.toml, the user's file, is written only when the run has none (every key with its
    meaning) and never rewritten, so the user's edits and comments stay; the config in use goes to
    RUN/config.effective.toml (atomically, every key), which ``status`` and the daemon's learner read."""
    run_file = os.path.join(run_dir, CONFIG_FILE)
    effective_file = os.path.join(run_dir, EFFECTIVE_CONFIG_FILE)
    text = to_toml(config)
    if not os.path.exists(run_file):
        atomic_write_text(run_file, text)
    elif config_path is not None:
        source = os.path.abspath(named_config_path(config_path))
        if source not in (os.path.abspath(run_file), os.path.abspath(effective_file)) \
                and _config_or_none(run_file) != config:
            log(f"learner: {run_file} is left as you wrote it; this start uses {config_path} "
                f"(every key in {EFFECTIVE_CONFIG_FILE})")
    try:
        with open(effective_file, encoding="utf-8") as f:
            old = f.read()
    except FileNotFoundError:
        old = None
    if old != text:
        atomic_write_text(effective_file, text)


def _config_or_none(path: str) -> TrainConfig | None:
    try:
        return load_config(path)
    except ValueError:
        return None


def prepare_run(run_dir: str, config_path, devices_world: int, lead: bool, log: Log,
                config: TrainConfig | None = None, init_from: str | None = None) -> tuple[TrainConfig, str | None]:
    """Config and checkpoint checks made before the training starts (clear one-line errors), then
    (``lead``: this process writes the run's files and logs, not the other torchrun ranks) the
    run's config files. ``config``: this config instead of ``config_path``'s (the daemon's).
    ``init_from`` (``--init-from``): sets ``train.init_from``. With ``train.init_from``, a new run
    takes its ``[model]`` from that network; a run with a checkpoint resumes and ignores it."""
    if not lead:
        log = lambda line: None  # noqa: E731
    if config is None:
        config = resolve_config(run_dir, config_path)
    if init_from:
        config = config.replace(train={"init_from": os.path.abspath(os.path.expanduser(os.fspath(init_from)))})
    if config.train.batch_size % devices_world:
        raise ValueError(f"train.batch_size {config.train.batch_size} is not a multiple of the "
                         f"{devices_world} ranks")
    found = load_newest_checkpoint(run_dir, log)
    path = None
    if found is None and config.train.init_from:
        config = _apply_init_from(run_dir, config, log)
    if found is not None:
        data, path = found
        started_from = data["train_config"].get("train", {}).get("init_from")
        if config.train.init_from or started_from:  # resuming wins; the run's shape is its checkpoint's
            if config.train.init_from:
                log(f"learner: train.init_from {config.train.init_from} is not used: the run resumes from {path}")
            model = {**dataclasses.asdict(ModelConfig()), **data["train_config"].get("model", {})}
            config = config.replace(model=model)
        differs = model_differences(config, data["train_config"])
        if differs:
            raise ValueError(f"the config changes the network's shape ({', '.join(differs)}) from checkpoint "
                             f"{path}: start a new run directory, or restore the run's [model] section")
    if lead:
        _write_run_config(run_dir, config, config_path, log)
    return config, path


def newest_generation(run_dir: str | os.PathLike) -> dict | None:
    """The newest line of RUN/generations.jsonl whose network file is there (None: none yet)."""
    run_dir = os.fspath(run_dir)
    for record in reversed(read_jsonl(os.path.join(run_dir, GENERATIONS_FILE))):
        onnx = record.get("onnx")
        if (isinstance(record.get("generation"), int) and isinstance(onnx, str) and isinstance(record.get("sha256"), str)
                and os.path.isfile(os.path.join(run_dir, onnx))):
            return record
    return None
