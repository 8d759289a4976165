"""Atomic file writes and sha256 side files.

Every file that another process reads (ONNX nets, checkpoints, manifests) is written
so that a reader sees either the old complete file or the new complete file, never a
half-written one, even if the writer is killed or the machine loses power:

1. write to a temporary name in the *same* directory (so the rename stays on one
   file system), flush and ``fsync`` it;
2. ``os.replace`` it over the final name (atomic on POSIX and Windows);
3. ``fsync`` the directory, so that the rename itself is durable.

On any error before step 2 the temporary file is removed and the old file is left
as it was.

``<file>.sha256`` holds ``"<hex digest>  <file name>\\n"``, the format of
``sha256sum`` (``sha256sum -c model.onnx.sha256`` checks it from the file's folder).

This module needs nothing beyond the standard library (no torch). ``atomic_open``
and the reading and checking half (``sha256_file``, ``read_sha256``,
``verify_sha256``, ...) live in :mod:`engine.files`, since the engine writes
fetched networks too and may not import ``trainer``; they are re-exported here.
"""

from __future__ import annotations

import fcntl
import json
import os
import re

from engine.files import (  # noqa: F401 - re-exported: the engine needs them too and may not import trainer
    SHA256_SUFFIX,
    atomic_open,
    fsync_dir,
    read_sha256,
    sha256_bytes,
    sha256_file,
    sha256_path,
    verify_sha256,
)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (temp file, fsync, rename, fsync directory)."""
    with atomic_open(path, "wb") as f:
        f.write(data)


def atomic_write_text(path: str | os.PathLike, text: str, encoding: str = "utf-8") -> None:
    with atomic_open(path, "w", encoding=encoding) as f:
        f.write(text)


def write_sha256(path: str | os.PathLike, digest: str | None = None) -> str:
    """Write ``<path>.sha256`` (atomically) in sha256sum's format; returns the digest.

    ``digest`` is computed from the file when not given.
    """
    if digest is None:
        digest = sha256_file(path)
    digest = digest.lower()
    if not re.fullmatch(r"[0-9a-f]{64}", digest):
        raise ValueError(f"not a sha256 hex digest: {digest!r}")
    atomic_write_text(sha256_path(path), f"{digest}  {os.path.basename(os.fspath(path))}\n")
    return digest


def atomic_write_with_sha256(path: str | os.PathLike, data: bytes) -> str:
    """Atomically write ``data`` to ``path``, then its ``.sha256`` side file; returns the digest.

    The data file is replaced first: a reader that finds a side file not matching the
    data (the writer died between the two renames) should treat it as not yet
    published, and retry or wait.
    """
    digest = sha256_bytes(data)
    atomic_write_bytes(path, data)
    write_sha256(path, digest)
    return digest


def append_durably(path: str | os.PathLike, data: bytes) -> None:
    """Append ``data`` to an append-only file so that it survives a crash when this returns.

    One ``O_APPEND`` write under an exclusive ``flock`` (so two writers never interleave),
    then ``fsync``; a new file's directory entry is fsynced too. A writer killed mid-line
    leaves a fragment without its newline: the next append starts on a line of its own,
    so the fragment costs only itself (readers skip it).
    """
    path = os.fspath(path)
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            data = b"\n" + data
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)   # releases the lock
    if size == 0:
        fsync_dir(os.path.dirname(path) or ".")


def append_jsonl(path: str | os.PathLike, record: dict) -> None:
    """Append one JSON line to an append-only log (:func:`append_durably`); :func:`read_jsonl`
    skips a torn line, so the log is never rewritten."""
    append_durably(path, (json.dumps(record, separators=(",", ":"), allow_nan=True) + "\n").encode())


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """The JSON objects of an append-only log; a torn or garbled line (a writer mid-line, bytes
    that are not UTF-8) is skipped."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.readlines()
    except FileNotFoundError:
        return []
    return json_objects(lines)


def json_objects(lines) -> list[dict]:
    """The lines (str or bytes) that are whole JSON objects; any other line is skipped."""
    records = []
    for line in lines:
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            records.append(value)
    return records


__all__ = [
    "SHA256_SUFFIX", "fsync_dir", "atomic_open", "atomic_write_bytes", "atomic_write_text",
    "sha256_bytes", "sha256_file", "sha256_path", "write_sha256", "read_sha256", "verify_sha256",
    "atomic_write_with_sha256", "append_durably", "append_jsonl", "read_jsonl", "json_objects",
]
