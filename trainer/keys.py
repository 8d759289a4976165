"""``cyzero-train keys DIR``: CurveZMQ key pairs for a daemon and the clients it admits.

Layout (what :mod:`engine.announce`'s loaders read; see "Following a trainer" in
``docs/contracts.md``)::

    DIR/server/server.key_secret     the daemon's key pair (keep it on the daemon's host)
    DIR/server/server.key            its public half
    DIR/authorized/NAME.key          the public key of each client the daemon admits
    DIR/clients/NAME/server.key      give this folder to a remote worker or an engine
    DIR/clients/NAME/client.key_secret                (`--keys` / UCI option TrainerKeys)
    DIR/clients/NAME/client.key

Running it again keeps the existing keys and only adds clients that are missing,
so ``cyzero-train keys DIR --client laptop`` admits one more machine. Each file is
written atomically (:func:`engine.files.atomic_open`); all but a pair's public key
are readable by the owner only.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile

import zmq
import zmq.auth

from engine.announce import CLIENT_SECRET_FILE, SERVER_PUBLIC_FILE
from engine.files import atomic_open

_CLIENT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def _certificate_pair(folder: str, name: str) -> tuple[str, str]:
    """A new key pair as ``name.key`` and ``name.key_secret`` in ``folder``, each written atomically
    (the secret readable by the owner only)."""
    os.makedirs(folder, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix=".keys-", dir=folder)  # 0o700: the library writes the secret here
    try:
        public, secret = zmq.auth.create_certificates(scratch, name)
        targets = os.path.join(folder, os.path.basename(public)), os.path.join(folder, os.path.basename(secret))
        _copy_atomic(public, targets[0], permissions=None)
        _copy_atomic(secret, targets[1])
        return targets
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _copy_atomic(source: str, target: str, permissions: int | None = 0o600) -> None:
    """Copy ``source`` to ``target`` with :func:`engine.files.atomic_open`; owner-only unless
    ``permissions`` is None (then the umask decides)."""
    with open(source, "rb") as f, atomic_open(target, "wb", permissions=permissions) as out:
        out.write(f.read())


def create_keys(directory: str | os.PathLike, clients: list[str] | tuple[str, ...] = ("worker",)) -> list[str]:
    """The daemon's key pair (made once) and one key pair per client name (made if missing);
    returns the files written."""
    if not zmq.has("curve"):
        raise RuntimeError("this libzmq was built without CURVE support: no CurveZMQ keys can be made")
    for name in clients:
        if not _CLIENT_NAME.fullmatch(name):
            raise ValueError(f"client name {name!r}: use letters, digits, '.', '_' or '-' (at most 64)")
    root = os.fspath(directory)
    server_dir = os.path.join(root, "server")
    server_public = os.path.join(server_dir, SERVER_PUBLIC_FILE)
    written: list[str] = []
    if not os.path.exists(server_public + "_secret"):
        written += _certificate_pair(server_dir, "server")
    for name in clients:
        client_dir = os.path.join(root, "clients", name)
        secret = os.path.join(client_dir, CLIENT_SECRET_FILE)
        if os.path.exists(secret):
            continue
        public, secret = _certificate_pair(client_dir, "client")
        written += [public, secret]
        for source, target in ((server_public, os.path.join(client_dir, SERVER_PUBLIC_FILE)),
                               (public, os.path.join(root, "authorized", f"{name}.key"))):
            os.makedirs(os.path.dirname(target), exist_ok=True)
            _copy_atomic(source, target)
            written.append(target)
    return written


__all__ = ["create_keys"]
