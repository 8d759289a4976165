"""Files that another process reads or wrote: sha256 digests, side files, atomic writes.

:mod:`trainer.atomic` (writing checkpoints, networks and their side files)
imports these helpers from here; the engine never imports ``trainer``, so the
part both sides need lives in ``engine`` (the engine writes networks it
fetched from a training daemon with :func:`atomic_open`).

``<file>.sha256`` holds ``"<hex digest>  <file name>\\n"``, the format of
``sha256sum`` (``sha256sum -c model.onnx.sha256`` checks it from the file's
folder).  Only the standard library is used.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import secrets
from typing import IO, Callable, Iterator, NamedTuple, Optional

__all__ = [
    "SHA256_SUFFIX",
    "FileSignature",
    "atomic_open",
    "fsync_dir",
    "file_signature",
    "is_sha256_hex",
    "read_sha256",
    "sha256_bytes",
    "sha256_file",
    "sha256_path",
    "verify_sha256",
]

SHA256_SUFFIX = ".sha256"
_CHUNK = 1 << 20
_SHA256_LINE = re.compile(r"^([0-9a-fA-F]{64}) [ *](.+)$")
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


def is_sha256_hex(text: object) -> bool:
    """True for a lower-case 64-digit hex string (what :func:`sha256_file` returns)."""
    return isinstance(text, str) and _SHA256_HEX.fullmatch(text) is not None


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(
    path: str | os.PathLike, *, cancelled: Optional[Callable[[], bool]] = None
) -> Optional[str]:
    """Hex sha256 of a file's bytes, read in 1 MiB chunks.

    ``cancelled``, if given, is asked between chunks; when it returns true the
    hashing stops and ``None`` is returned (a watcher thread that is being
    closed does not finish hashing a large file first).
    """
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            if cancelled is not None and cancelled():
                return None
            h.update(chunk)
    return h.hexdigest()


def sha256_path(path: str | os.PathLike) -> str:
    """Where the sha256 side file of ``path`` lives: ``path + ".sha256"``."""
    return os.fspath(path) + SHA256_SUFFIX


def read_sha256(path: str | os.PathLike) -> str:
    """The digest recorded in ``<path>.sha256``.

    Raises ``FileNotFoundError`` if there is no side file and ``ValueError`` if it is
    malformed or names another file.
    """
    side = sha256_path(path)
    with open(side, encoding="utf-8", errors="replace") as f:
        line = f.readline(4096).strip()
    match = _SHA256_LINE.match(line)
    if not match:
        raise ValueError(f"{side}: expected '<64 hex digits>  <file name>', got {line[:100]!r}")
    digest, name = match.group(1).lower(), match.group(2)
    expected_name = os.path.basename(os.fspath(path))
    if os.path.basename(name) != expected_name:
        raise ValueError(f"{side}: names {name!r}, not {expected_name!r}")
    return digest


def verify_sha256(path: str | os.PathLike) -> str:
    """Check ``path`` against ``<path>.sha256``; returns the digest or raises ``ValueError``."""
    expected = read_sha256(path)
    actual = sha256_file(path)
    if actual != expected:
        raise ValueError(
            f"{os.fspath(path)}: sha256 {actual} does not match {expected} recorded in {sha256_path(path)}"
            " (truncated or corrupted file?)"
        )
    return actual


class FileSignature(NamedTuple):
    """What a cheap ``stat`` says about a file: enough to notice that it was replaced or rewritten."""

    mtime_ns: int
    size: int
    inode: int


def file_signature(path: str | os.PathLike) -> Optional[FileSignature]:
    """The :class:`FileSignature` of ``path``, or ``None`` if it does not exist (or cannot be stat'ed)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return FileSignature(st.st_mtime_ns, st.st_size, st.st_ino)


def fsync_dir(directory: str | os.PathLike) -> None:
    """``fsync`` a directory so that renames inside it are durable (no-op where unsupported)."""
    if os.name == "nt":  # directories cannot be opened for fsync on Windows
        return
    fd = os.open(os.fspath(directory) or ".", os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "wb", encoding: str | None = None, *,
                permissions: int | None = None) -> Iterator[IO]:
    """Open a temporary file beside ``path`` for writing; on a clean exit make it ``path``.

    Written to a temp name in the same directory, flushed and fsynced, renamed
    over ``path``, and the directory fsynced: a reader sees the old complete
    file or the new complete file, never half of one.  ``mode`` is ``"wb"`` or
    ``"w"`` (text, ``encoding`` defaults to UTF-8).  ``permissions`` (e.g. 0o600
    for a secret key) are the file's from its creation, whatever the umask;
    without them the umask decides, as for ``open``.  If the ``with`` body
    raises, the temporary file is removed and ``path`` is untouched.
    """
    if mode not in ("wb", "w"):
        raise ValueError(f"atomic_open supports modes 'wb' and 'w', not {mode!r}")
    path = os.path.abspath(os.fspath(path))
    directory, name = os.path.split(path)
    tmp = os.path.join(directory, f".{name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
    if mode == "w" and encoding is None:
        encoding = "utf-8"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666 if permissions is None else permissions)
    try:
        if permissions is not None:
            os.fchmod(fd, permissions)  # exactly these: the umask may have taken bits away
        f = open(fd, mode, encoding=encoding)
    except BaseException:
        os.close(fd)
        os.remove(tmp)
        raise
    try:
        try:
            yield f
            f.flush()
            os.fsync(f.fileno())
        finally:
            f.close()
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
        raise
    fsync_dir(directory)
