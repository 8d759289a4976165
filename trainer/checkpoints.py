"""Checkpoints on disk: the one reader and writer of ``torch.save``'d checkpoints.

The learner writes ``RUN/checkpoints/step-N.pt`` with :data:`LEARNER_KEYS` (what a resume
needs); :func:`trainer.model.save_checkpoint_dict` writes the two a network needs,
:data:`NETWORK_KEYS`. Every reader (the learner's resume, ``export --checkpoint``,
``train.init_from`` through :func:`trainer.network_files.read_network`, :func:`trainer.model.load_net`)
comes through :func:`read_checkpoint`: onto the CPU, with ``weights_only=True`` so a file can hold
tensors and plain containers but never code, and a one-line ValueError naming the file for what
is not a checkpoint.
"""

from __future__ import annotations

import io
import os
import pickle
import warnings
import zipfile
from collections.abc import Callable, Sequence
from typing import Any

import torch

from trainer.atomic import atomic_write_bytes
from trainer.rundir import list_checkpoints

__all__: Sequence[str] = [
    "CHECKPOINT_FORMAT", "LEARNER_KEYS", "NETWORK_KEYS", "read_checkpoint", "read_learner_checkpoint",
    "load_newest_checkpoint", "write_checkpoint",
]

CHECKPOINT_FORMAT = 1
NETWORK_KEYS = ("config", "model")  # config: NetConfig fields; model: the state dict
LEARNER_KEYS = ("format", "step", "generation", *NETWORK_KEYS, "train_config", "optimizer", "sampler")


def read_checkpoint(path: str | os.PathLike, needs: Sequence[str] = ()) -> dict:
    """The dict in checkpoint ``path``, which must hold the keys ``needs``; ValueError, starting
    "checkpoint PATH", that says what is wrong with any other file.

    torch.save writes a zip archive (older torch a bare pickle); anything else, an empty or a
    truncated file gets a one-line reason instead of torch's traceback.
    """
    path = os.fspath(path)
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
            data = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        raise ValueError(f"checkpoint {path} holds more than tensors and plain containers, or is not "
                         "a torch checkpoint: cyzero loads only weights (torch.load weights_only=True)") from None
    except Exception as exc:  # torch raises RuntimeError, EOFError, KeyError, ... for damaged files
        reason = " ".join(str(exc).split())[:300] or type(exc).__name__
        raise ValueError(f"cannot load checkpoint {path}: {reason}") from None
    if not isinstance(data, dict):
        raise ValueError(f"checkpoint {path} holds a {type(data).__name__}, not a dict "
                         "({'config': ..., 'model': state_dict} or a bare state dict)")
    missing = [key for key in needs if key not in data]
    if missing:
        raise ValueError(f"checkpoint {path} is not a cyzero checkpoint: it has no {', '.join(map(repr, missing))}")
    return data


def read_learner_checkpoint(path: str | os.PathLike, step: int) -> dict:
    """The learner's checkpoint for ``step`` (its file name's): :data:`LEARNER_KEYS`, this format."""
    data = read_checkpoint(path, LEARNER_KEYS)
    if data["format"] != CHECKPOINT_FORMAT or data["step"] != step:
        raise ValueError(f"checkpoint {os.fspath(path)} has format {data['format']} step {data['step']}, "
                         "which does not fit its name")
    return data


def load_newest_checkpoint(run_dir: str | os.PathLike, log: Callable[[str], Any]) -> tuple[dict, str] | None:
    """The newest of the run's learner checkpoints that loads, and its path; a damaged one is skipped
    with a log line."""
    for step, path in reversed(list_checkpoints(run_dir)):
        try:
            return read_learner_checkpoint(path, step), path
        except ValueError as exc:
            log(f"learner: skipping damaged checkpoint: {exc}")
    return None


def write_checkpoint(path: str | os.PathLike, contents: dict) -> None:
    """``torch.save`` of ``contents`` to ``path`` atomically: a reader sees the old file or the whole new one."""
    buf = io.BytesIO()
    torch.save(contents, buf)
    atomic_write_bytes(os.fspath(path), buf.getvalue())
