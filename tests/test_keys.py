"""`cyzero-train keys`: the key files the engine's loaders read, and a CURVE handshake with them."""

import dataclasses
import os
import stat

import pytest
import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from engine.announce import load_client_keys, load_server_keys
from trainer.keys import create_keys

pytestmark = pytest.mark.skipif(not zmq.has("curve"), reason="libzmq without CURVE")


def _exchange(server_keys, client, authorized_dir, timeout_ms=1500):
    """One request from a CURVE client to a CURVE server whose authenticator admits
    ``authorized_dir``; the reply, or None when the server never answers."""
    ctx = zmq.Context()
    auth = ThreadAuthenticator(ctx)
    auth.start()
    auth.configure_curve(domain="*", location=str(authorized_dir))
    try:
        server = ctx.socket(zmq.REP)
        server.curve_server = True
        server.curve_publickey, server.curve_secretkey = server_keys
        port = server.bind_to_random_port("tcp://127.0.0.1")
        req = ctx.socket(zmq.REQ)
        req.curve_serverkey = client.server_public
        req.curve_publickey, req.curve_secretkey = client.public, client.secret
        req.connect(f"tcp://127.0.0.1:{port}")
        req.send(b"ping")
        if server.poll(timeout_ms):
            server.send(server.recv() + b" pong")
            return req.recv() if req.poll(timeout_ms) else None
        return None
    finally:
        auth.stop()
        ctx.destroy(linger=0)


def test_keys_admit_their_clients_and_no_one_else(tmp_path):
    root = tmp_path / "keys"
    written = create_keys(root, ["worker", "laptop"])
    assert os.path.join(root, "server", "server.key_secret") in written
    for name in ("worker", "laptop"):
        client_dir = root / "clients" / name
        assert sorted(os.listdir(client_dir)) == ["client.key", "client.key_secret", "server.key"]
        assert stat.S_IMODE(os.stat(client_dir / "client.key_secret").st_mode) == 0o600
        assert (root / "authorized" / f"{name}.key").read_bytes() == (client_dir / "client.key").read_bytes()
    assert not [n for n in os.listdir(root / "server") if n.startswith(".")]  # no scratch left

    server = load_server_keys(root / "server" / "server.key_secret")
    worker = load_client_keys(root / "clients" / "worker")
    assert _exchange(server, worker, root / "authorized") == b"ping pong"

    # A client whose public key is not in authorized/ hears nothing.
    stranger_root = tmp_path / "stranger"
    create_keys(stranger_root, ["worker"])
    stranger = load_client_keys(stranger_root / "clients" / "worker")
    stranger = dataclasses.replace(stranger, server_public=worker.server_public)  # knows the right server
    assert _exchange(server, stranger, root / "authorized", timeout_ms=500) is None


def test_running_again_keeps_keys_and_adds_clients(tmp_path, capsys):
    from trainer.cli import main

    root = tmp_path / "keys"
    assert main(["keys", str(root)]) == 0
    first = (root / "server" / "server.key_secret").read_bytes()
    worker = (root / "clients" / "worker" / "client.key_secret").read_bytes()
    capsys.readouterr()
    assert main(["keys", str(root), "--client", "worker", "--client", "gpu-box"]) == 0
    out = capsys.readouterr().out.split()
    assert all("gpu-box" in path for path in out) and out
    assert (root / "server" / "server.key_secret").read_bytes() == first
    assert (root / "clients" / "worker" / "client.key_secret").read_bytes() == worker
    assert main(["keys", str(root), "--client", "../escape"]) == 2
    assert "client name" in capsys.readouterr().err
