"""Any network file as a cyzero PyTorch network: ``--init-from`` / ``train.init_from`` and
``export --checkpoint`` of an ``.onnx`` take an lc0 weights file, one of cyzero's fp32 ONNX exports
or a cyzero checkpoint alike, so one reader tells the kinds apart by name and first bytes and hands
each to its converter (:mod:`trainer.lc0_import`, :mod:`trainer.onnx_import`,
:mod:`trainer.checkpoints`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from engine.lc0 import Lc0Error, is_lc0_file, read_lc0_file
from trainer.checkpoints import NETWORK_KEYS, read_checkpoint
from trainer.lc0_import import Lc0ImportError, net_from_lc0
from trainer.model import Net, load_net
from trainer.onnx_import import OnnxImportError, check_against_onnx, net_from_onnx, onnx_net_config

__all__: Sequence[str] = ["read_network", "is_lc0_path", "is_onnx_path", "has_folded_batch_norm"]

#: How many positions (from random games) the rebuilt network is checked on against the file.
ONNX_CHECK_POSITIONS = 256


def is_lc0_path(path: str | os.PathLike) -> bool:
    """Whether ``path`` is an lc0 weights file: named ``.pb.gz``/``.pb``, or gzipped (a torch
    checkpoint is a zip archive or a pickle, never gzip)."""
    return is_lc0_file(path) or _starts_with(path, b"\x1f\x8b")


def _starts_with(path: str | os.PathLike, magic: bytes) -> bool:
    """Whether the file ``path`` starts with ``magic`` (False when it cannot be read)."""
    try:
        with open(path, "rb") as f:
            return f.read(len(magic)) == magic
    except OSError:
        return False


def is_onnx_path(path: str | os.PathLike) -> bool:
    """Whether ``path`` looks like an ONNX model: named ``.onnx``, or a protobuf whose first field
    is the ``ir_version`` ONNX's ModelProto starts with (a torch checkpoint starts with ``PK`` or a
    pickle's ``0x80``, an lc0 file with gzip's ``1f 8b`` or its magic's tag ``0x0d``)."""
    return os.fspath(path).lower().endswith(".onnx") or _starts_with(path, b"\x08")


def has_folded_batch_norm(path: str | os.PathLike) -> bool:
    """Whether :func:`read_network` rebuilds ``path``'s network with identity batch norms (the
    convolutions hold them folded: an lc0 file, an ONNX export), which
    :func:`trainer.lc0_import.calibrate_batch_norm` should give real statistics before training;
    not a checkpoint."""
    return is_onnx_path(path) or is_lc0_path(path)


# --------------------------------------------------------------------------- files


def read_network(path: str | os.PathLike) -> tuple[Net, str]:
    """The network in ``path`` and a one-line description of it: an lc0 weights file
    (``.pb.gz``, ``.pb``) through :func:`trainer.lc0_import.net_from_lc0`, one of cyzero's fp32
    ONNX exports (the bundled ``engine/nets/default.onnx`` too) through
    :func:`trainer.onnx_import.net_from_onnx`, checked against the file's own graph, or a cyzero
    checkpoint (its raw weights, where its training stood).
    ValueError naming the file and what is wrong, in one line."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise ValueError(f"network file {path} not found" if not os.path.exists(path)
                         else f"{path} is not a file")
    if path.lower().endswith(".onnx"):
        return _onnx_network(path)
    if is_lc0_path(path):
        lc0net = read_lc0_file(path)
        try:
            net = net_from_lc0(lc0net)
        except Lc0Error as exc:
            raise Lc0ImportError(f"{os.path.basename(path)}: {exc}") from None
        return net, f"{os.path.basename(path)}: {lc0net.description}"
    if is_onnx_path(path):
        return _onnx_network(path)
    return _checkpoint_network(path)


def _onnx_network(path: str) -> tuple[Net, str]:
    """One of cyzero's fp32 ONNX exports rebuilt in PyTorch (:func:`trainer.onnx_import.net_from_onnx`),
    checked against the file on :data:`ONNX_CHECK_POSITIONS` positions from random games."""
    import onnx

    name = os.path.basename(path)
    with open(path, "rb") as f:
        data = f.read()
    try:
        model = onnx.load_from_string(data)
    except Exception as exc:  # protobuf's DecodeError and friends
        reason = " ".join(str(exc).split())[:200] or type(exc).__name__
        raise OnnxImportError(f"{name} is not an ONNX network that loads ({reason})") from None
    try:
        onnx_net_config(model, name)
        net = net_from_onnx(model)
        from trainer.export import sample_positions

        planes, masks = sample_positions(ONNX_CHECK_POSITIONS, seed=0)
        check_against_onnx(net, data, planes, masks)
    except OnnxImportError as exc:
        raise type(exc)(f"{name}: {exc}") from None
    return net, f"{name}: cyzero ONNX export, {net.config.name}, rebuilt from its weights"


def _checkpoint_network(path: str) -> tuple[Net, str]:
    """A cyzero checkpoint's network, its raw weights (where its training stood)."""
    name = os.path.basename(path)
    try:
        data = read_checkpoint(path, NETWORK_KEYS)
    except ValueError as exc:
        raise ValueError(f"{name} is neither an lc0 weights file (.pb.gz, .pb) nor a cyzero checkpoint "
                         f"that loads ({exc})") from None
    try:
        net = load_net(data)
    except (ValueError, TypeError, KeyError, RuntimeError) as exc:
        reason = " ".join(str(exc).split())[:200] or type(exc).__name__
        raise ValueError(f"{name} does not hold a network cyzero can load: {reason}") from None
    step = f", step {data['step']:,}" if isinstance(data.get("step"), int) else ""
    return net.eval(), f"{name}: cyzero checkpoint, {net.config.name}{step}, raw weights"
