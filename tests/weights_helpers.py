"""Shared pieces of the network tests (test_weights, test_swap, test_watchers, test_follower, ...).

The networks are the bundled ones (``default.onnx``, its fp16 variant, and a
copy of ``default.onnx`` with another doc string: three different valid files
that load in a few hundredths of a second); the managers poll fast
(:data:`FAST`) so that the tests are quick.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import shutil
import threading
import time

import msgpack
import numpy as np
import pytest
import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from engine.announce import TOPIC, load_server_keys
from engine.network import Network
from engine.network_manager import NetworkManager
from lc0_files import f_bytes

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NETS = os.path.join(REPO, "engine", "nets")
FAST = 0.1  # poll interval for the tests
FAST_NET = {"warmup_batch": 1, "max_batch": 8}
WAIT = 10.0  # a generous limit for an event that normally takes a fraction of a second


def bundled(name: str) -> bytes:
    with open(os.path.join(NETS, name), "rb") as f:
        return f.read()


def restamped(data: bytes, note: bytes = b"a test copy") -> bytes:
    """The same network in other bytes (another sha256; a long ``note`` makes it larger):
    ``doc_string`` is ONNX field 6, a repeated scalar field whose last value wins."""
    return data + f_bytes(6, note)


def bundled_size(name: str = "default.onnx") -> str:
    """The bundled network's ``BLOCKSxFILTERS`` from its ``cyzero.config`` metadata, as the engine's
    lines name it (read here with ONNX Runtime, apart from the engine's own reader)."""
    import onnxruntime as ort

    session = ort.InferenceSession(os.path.join(NETS, name), providers=["CPUExecutionProvider"])
    config = json.loads(session.get_modelmeta().custom_metadata_map["cyzero.config"])
    return f"{config['blocks']}x{config['filters']}"


A = bundled("default.fp16.onnx")
C = bundled("default.onnx")
B = restamped(C)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def replace_atomically(path, data: bytes) -> None:
    tmp = f"{path}.tmp-test"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def wait_until(condition, timeout: float = WAIT, what: str = "the condition") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout}s")
        time.sleep(0.02)


class Log:
    """A thread-safe list of log lines with a wait helper."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self._lock = threading.Lock()

    def __call__(self, text: str) -> None:
        with self._lock:
            self.lines.append(text)

    def having(self, word: str) -> list[str]:
        with self._lock:
            return [line for line in self.lines if word in line]

    def wait_for(self, word: str, count: int = 1, timeout: float = WAIT) -> list[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = self.having(word)
            if len(found) >= count:
                return found
            time.sleep(0.02)
        raise AssertionError(f"no {count} log lines with {word!r} within {timeout}s: {self.lines}")


class CountingLoader:
    """``Network`` on the CPU, recording every path and sha256 it was asked to load."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str | None]] = []
        self.loaded: list[str] = []

    def __call__(self, path, **kwargs):
        self.calls.append((path, kwargs.get("expected_sha256")))
        net = Network(path, **kwargs)
        self.loaded.append(net.sha256)
        return net


class FakeNet:
    """A network stand-in with fixed outputs; it checks that it is asked about the start position."""

    def __init__(self, policy=None, wdl=None, mlh=None, error=None, sha256="f" * 64):
        self.name, self.sha256, self.description = "fake.onnx", sha256, "fake.onnx (a test double)"
        self._out = (np.zeros((1, 1858), np.float32) if policy is None else policy,
                     np.array([[0.2, 0.5, 0.3]], np.float32) if wdl is None else wdl, mlh)
        self._error = error
        self.closed = False

    def evaluate(self, planes):
        assert planes.shape == (1, 112, 8, 8) and planes.dtype == np.float32
        assert planes[0, :12].sum() == 32  # the start position: 32 pieces in the newest history slot
        if self._error:
            raise self._error
        return self._out

    def close(self):
        self.closed = True


def make_manager(path, log, loader=None, **kwargs) -> NetworkManager:
    kwargs.setdefault("poll_interval", FAST)
    return NetworkManager(
        path, backend="cpu", threads=1, log=log, loader=loader or Network,
        network_options=FAST_NET, **kwargs,
    )


class Evil:
    """Unpickling this would create a folder: the tests check that it never happens."""

    marker = ""

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


def garbage_messages(tmp_path) -> list[list]:
    """Malformed announcements of every kind (each must be dropped)."""
    good = {"type": "network", "version": 1, "generation": 5, "path": "/n.onnx", "sha256": "0" * 64}

    def header(**changes):
        h = {**good, **changes}
        return [TOPIC, msgpack.packb({k: v for k, v in h.items() if v is not ...})]

    Evil.marker = str(tmp_path / "unpickled")
    rng = np.random.default_rng(0)
    return [
        [TOPIC],                                                # one frame
        [TOPIC, msgpack.packb(good), b"extra"],                 # three frames
        [TOPIC, rng.bytes(200)],                                # random bytes
        [TOPIC, b"\xc1"],                                       # never-used msgpack byte
        [TOPIC, msgpack.packb(good)[:-5]],                      # truncated msgpack
        [TOPIC, pickle.dumps(Evil())],                          # a pickle payload
        [TOPIC, pickle.dumps(good)],
        [TOPIC, msgpack.packb([1, 2, 3])],                      # not a map
        [b"networkX", msgpack.packb(good)],                     # another topic (same prefix)
        header(type="games"),
        header(version=2),
        header(version="1"),
        header(generation=-3),
        header(generation="7"),
        header(generation=True),
        header(generation=...),
        header(path=b"/n.onnx"),
        header(path="relative.onnx"),
        header(sha256="xyz"),
        header(sha256=...),
        header(run=12),
        header(fetch=5),
        header(fetch="no-scheme"),
    ]


@pytest.fixture
def curve_daemon(tmp_path):
    """A stand-in daemon's side of CurveZMQ: ``(context, server_keys, engine_keys_dir, stranger_keys_dir)``.

    ``context`` runs zmq.auth's ThreadAuthenticator, which admits only the
    engine's client key; both key folders hold the daemon's ``server.key``.
    """
    daemon_dir, authorised, engine_keys, stranger = (tmp_path / name for name in
                                                     ("daemon", "authorised", "engine", "stranger"))
    for folder in (daemon_dir, authorised, engine_keys, stranger):
        folder.mkdir()
    zmq.auth.create_certificates(str(daemon_dir), "server")
    zmq.auth.create_certificates(str(engine_keys), "client")
    zmq.auth.create_certificates(str(stranger), "client")
    shutil.copy(engine_keys / "client.key", authorised)
    for folder in (engine_keys, stranger):
        shutil.copy(daemon_dir / "server.key", folder)
    context = zmq.Context()
    auth = ThreadAuthenticator(context)
    auth.start()
    auth.allow("127.0.0.1")
    auth.configure_curve(domain="*", location=str(authorised))
    server_keys = load_server_keys(daemon_dir / "server.key_secret")
    yield context, server_keys, str(engine_keys), str(stranger)
    auth.stop()
    context.destroy(0)
