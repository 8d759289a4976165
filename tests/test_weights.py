"""engine.weights: locating networks, hot-swapping them from a watched file or a trainer's ZeroMQ
announcements, and refusing bad ones while the old network stays.

The networks are the bundled ones (``default.onnx`` and its fp16 / int8
variants: three different valid networks that load in a few hundredths of a
second); the manager's threads poll fast (0.1 s) so that the tests are quick.
"""

from __future__ import annotations

import os
import pickle
import shutil
import threading
import time

import msgpack
import numpy as np
import pytest

from engine.network import Network, NetworkError
from engine.weights import (
    DEFAULT_WEIGHTS,
    TOPIC,
    AnnouncementError,
    NetworkAnnouncement,
    NetworkManager,
    WeightsError,
    decode_network_announcement,
    default_weights_path,
    encode_network_announcement,
    resolve_weights,
    validate_endpoint,
    verify_network,
)

zmq = pytest.importorskip("zmq")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NETS = os.path.join(REPO, "engine", "nets")
FAST = 0.1  # poll interval for the tests
FAST_NET = {"warmup_batch": 1, "max_batch": 8}


def bundled(name: str) -> bytes:
    with open(os.path.join(NETS, name), "rb") as f:
        return f.read()


A = bundled("default.fp16.onnx")
B = bundled("default.int8.onnx")
C = bundled("default.onnx")


def replace_atomically(path, data: bytes) -> None:
    tmp = f"{path}.tmp-test"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def sha(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


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

    def wait_for(self, word: str, count: int = 1, timeout: float = 5.0) -> list[str]:
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


def make_manager(path, log, loader=None, **kwargs) -> NetworkManager:
    kwargs.setdefault("poll_interval", FAST)
    return NetworkManager(
        path, backend="cpu", threads=1, log=log, loader=loader or Network,
        network_options=FAST_NET, **kwargs,
    )


@pytest.fixture
def weights(tmp_path):
    path = tmp_path / "weights.onnx"
    path.write_bytes(A)
    return str(path)


# --------------------------------------------------------------------------- locating


def test_files_helpers_are_shared_with_the_trainer(tmp_path):
    from trainer import atomic

    import engine.files as files

    for name in ("SHA256_SUFFIX", "sha256_bytes", "sha256_file", "sha256_path", "read_sha256", "verify_sha256"):
        assert getattr(atomic, name) is getattr(files, name)
    path = tmp_path / "x.bin"
    assert files.file_signature(path) is None
    atomic.atomic_write_with_sha256(path, b"x" * (3 << 20))
    assert files.verify_sha256(path) == files.sha256_file(path) == sha(b"x" * (3 << 20))
    assert files.sha256_file(path, cancelled=lambda: True) is None
    signature = files.file_signature(path)
    assert signature.size == 3 << 20 and signature.inode == os.stat(path).st_ino


def test_resolve_weights(tmp_path, monkeypatch):
    bundled_path = default_weights_path()
    assert os.path.isfile(bundled_path) and bundled_path.endswith(os.path.join("nets", "default.onnx"))
    for value in (DEFAULT_WEIGHTS, "", "  <default> ", None):
        assert resolve_weights(value) == bundled_path
    net = tmp_path / "n.onnx"
    net.write_bytes(A)
    assert resolve_weights(str(net)) == str(net)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert resolve_weights("~/n.onnx") == str(net)
    monkeypatch.chdir(tmp_path)
    assert resolve_weights("n.onnx") == str(net)
    with pytest.raises(WeightsError, match="not found: .*missing.onnx"):
        resolve_weights(str(tmp_path / "missing.onnx"))
    with pytest.raises(WeightsError, match="directory"):
        resolve_weights(str(tmp_path))


def test_validate_endpoint():
    for good in ("tcp://127.0.0.1:5557", "tcp://localhost:1", "tcp://[::1]:5557",
                 "TCP://daemon.example.org:65535", "ipc:///tmp/cyzero.sock", "inproc://weights"):
        assert validate_endpoint(good).lower() == good.lower()
    for bad in ("", "127.0.0.1:5557", "udp://127.0.0.1:5557", "tcp://127.0.0.1", "tcp://*:5557",
                "tcp://127.0.0.1:0", "tcp://127.0.0.1:70000", "tcp://:5557", "ipc://", "inproc://",
                "tcp://eth0;127.0.0.1:5557", "tcp://a b:1", 5557):
        with pytest.raises(WeightsError):
            validate_endpoint(bad)


# --------------------------------------------------------------------------- announcements


def test_announcement_round_trip():
    digest = "AB" * 32
    frames = encode_network_announcement(7, "/runs/r1/net-7.onnx", digest, run="r1")
    assert frames[0] == TOPIC and len(frames) == 2
    header = msgpack.unpackb(frames[1])
    assert header == {"type": "network", "version": 1, "generation": 7,
                      "path": "/runs/r1/net-7.onnx", "sha256": "ab" * 32, "run": "r1"}
    expected = NetworkAnnouncement(7, "/runs/r1/net-7.onnx", "ab" * 32, "r1")
    assert decode_network_announcement(frames) == expected
    # zmq.Frame objects, memoryviews and bytearrays are frames too; the run is optional.
    assert decode_network_announcement([zmq.Frame(frames[0]), memoryview(frames[1])]) == expected
    plain = encode_network_announcement(0, "/n.onnx", "0" * 64)
    assert decode_network_announcement([bytearray(f) for f in plain]).run is None
    # Unknown header keys are room for later fields.
    header["later"] = [1, 2]
    assert decode_network_announcement([TOPIC, msgpack.packb(header)]) == expected


@pytest.mark.parametrize("args", [
    (-1, "/n.onnx", "0" * 64), (True, "/n.onnx", "0" * 64), (1.0, "/n.onnx", "0" * 64),
    (1, "n.onnx", "0" * 64), (1, "", "0" * 64), (1, "/n.onnx", "0" * 63), (1, "/n.onnx", "g" * 64),
    (1, "/n.onnx", None), (1, "/a\x00b", "0" * 64),
])
def test_encode_refuses_bad_fields(args):
    with pytest.raises(AnnouncementError):
        encode_network_announcement(*args)


class Evil:
    """Unpickling this would create a folder: the test checks that it never happens."""

    marker = ""

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


def garbage_messages(tmp_path) -> list[list]:
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
    ]


def test_decode_refuses_garbage(tmp_path):
    for frames in garbage_messages(tmp_path):
        with pytest.raises(AnnouncementError):
            decode_network_announcement(frames)
    for bad in (None, 5, [TOPIC, 5], [TOPIC, "text"], [TOPIC, msgpack.packb({1: 2})],
                [TOPIC, b"\x91" * 5000], [TOPIC, b"\xda" + b"\xff" * 10], [TOPIC, b"x" * 70000]):
        with pytest.raises(AnnouncementError):
            decode_network_announcement(bad)
    assert not os.path.exists(Evil.marker)


# --------------------------------------------------------------------------- verification


class FakeNet:
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


def test_verify_network():
    verify_network(FakeNet())
    nan = np.zeros((1, 1858), np.float32)
    nan[0, 5] = np.nan
    for bad, message in (
        (FakeNet(policy=nan), "not finite"),
        (FakeNet(wdl=np.array([[np.inf, 0, 0]], np.float32)), "not finite"),
        (FakeNet(wdl=np.array([[0.5, 0.5, 0.5]], np.float32)), "not a probability"),
        (FakeNet(wdl=np.array([[1.5, -0.5, 0.0]], np.float32)), "not a probability"),
        (FakeNet(mlh=np.array([np.nan], np.float32)), "moves-left"),
        (FakeNet(policy=np.zeros((1, 1857), np.float32)), "expected"),
        (FakeNet(error=RuntimeError("boom")), "test evaluation failed: RuntimeError: boom"),
    ):
        with pytest.raises(NetworkError, match=message):
            verify_network(bad)


# --------------------------------------------------------------------------- file watching


def test_lazy_load_and_description(weights):
    log, loader = Log(), CountingLoader()
    with make_manager(weights, log, loader) as manager:
        assert not manager.loaded and loader.calls == []
        assert "not loaded" in manager.description and manager.sha256 is None
        net = manager.get()
        assert manager.get() is net and len(loader.calls) == 1
        assert manager.sha256 == sha(A) == net.sha256 and manager.generation is None
        assert manager.description == net.description and manager.network_path == weights
        assert log.lines == [f"loaded network {net.description}"]
        assert not manager.swap_pending() and not manager.apply_pending()


def test_replaced_file_is_swapped_between_searches(weights):
    log, loader = Log(), CountingLoader()
    cleared = []
    with make_manager(weights, log, loader) as manager:
        old = manager.get()
        replace_atomically(weights, B)
        assert manager.wait_pending(5.0)
        assert manager.get() is old, "nothing changes before apply_pending"
        assert log.wait_for("verified; switching before the next search")
        assert manager.apply_pending(lambda: cleared.append(True))
        assert cleared == [True]
        new = manager.get()
        assert new is not old and new.sha256 == manager.sha256 == sha(B)
        assert manager.description == new.description != old.description
        assert log.lines[-1] == f"switched to network {new.description}; search cache cleared"
        assert not manager.swap_pending() and not manager.apply_pending()
        assert loader.calls[-1] == (weights, sha(B))  # the candidate was held to the sha256 it was hashed at
        old.evaluate(np.zeros((1, 112, 8, 8), np.float32))  # a search still holding the old one is fine


def test_truncated_file_is_refused_once_and_old_network_stays(weights):
    log, loader = Log(), CountingLoader()
    with make_manager(weights, log, loader) as manager:
        old = manager.get()
        replace_atomically(weights, B[: len(B) // 2])
        refused = log.wait_for("refused network")
        assert refused[0].startswith(f"refused network {weights}: ")
        assert "truncated" in refused[0] and "keeping weights.onnx" in refused[0]
        calls = len(loader.calls)
        time.sleep(8 * FAST)  # many polls: the same bad file is not tried again
        os.utime(weights)  # new mtime, same bad bytes: still not tried again
        time.sleep(8 * FAST)
        assert len(log.having("refused")) == 1 and len(loader.calls) == calls
        assert not manager.swap_pending() and manager.get() is old and manager.sha256 == sha(A)
        # Once the file changes again (a good network), it is taken.
        replace_atomically(weights, C)
        assert manager.wait_pending(5.0) and manager.apply_pending()
        assert manager.sha256 == sha(C)


def test_identical_file_is_not_swapped(weights):
    log, loader = Log(), CountingLoader()
    with make_manager(weights, log, loader) as manager:
        manager.get()
        replace_atomically(weights, A)  # new inode and mtime, same sha256
        time.sleep(10 * FAST)
        assert not manager.swap_pending() and len(loader.calls) == 1 and len(log.lines) == 1


def test_file_being_written_is_not_read_half_way(tmp_path):
    path = str(tmp_path / "weights.onnx")
    with open(path, "wb") as f:
        f.write(A)
    log, loader = Log(), CountingLoader()
    # A writer that pauses for less than one poll interval is never caught half-way: the
    # watcher waits for the same stat on two polls in a row.
    with make_manager(path, log, loader, poll_interval=0.5) as manager:
        manager.get()
        with open(path, "r+b") as f:  # rewritten in place, not atomically
            f.truncate(0)
            f.write(B[: len(B) // 2])
            f.flush()
            time.sleep(0.1)
            f.write(B[len(B) // 2 :])
        assert manager.wait_pending(5.0) and manager.apply_pending()
        assert manager.sha256 == sha(B)
        assert loader.calls == [(path, None), (path, sha(B))]  # never asked for the half file
        assert loader.loaded == [sha(A), sha(B)] and not log.having("refused")


def test_sha256_side_file_is_checked(weights):
    log, loader = Log(), CountingLoader()
    with open(weights + ".sha256", "w") as f:
        f.write(f"{sha(A)}  weights.onnx\n")
    with make_manager(weights, log, loader) as manager:
        manager.get()
        assert loader.calls == [(weights, sha(A))]
        replace_atomically(weights, B)  # the side file still says A
        refused = log.wait_for("refused network")
        assert "does not match" in refused[0] and "weights.onnx.sha256" in refused[0]
        assert not manager.swap_pending()
        # The publisher finishes: the side file now matches, and the network is taken.
        replace_atomically(weights + ".sha256", f"{sha(B)}  weights.onnx\n".encode())
        assert manager.wait_pending(5.0) and manager.apply_pending()
        assert manager.sha256 == sha(B) and len(log.having("refused")) == 1


def test_first_load_against_a_stale_side_file_says_so(weights):
    with open(weights + ".sha256", "w") as f:
        f.write(f"{sha(B)}  weights.onnx\n")
    with make_manager(weights, Log()) as manager:
        with pytest.raises(NetworkError, match="sha256 mismatch.*weights.onnx.sha256"):
            manager.get()
        os.remove(weights + ".sha256")
        assert manager.get().sha256 == sha(A)  # the next call tries again


def test_wrong_io_network_is_refused(weights, tmp_path):
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])], "wrong",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 112, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 112, 8, 8])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    log = Log()
    with make_manager(weights, log) as manager:
        old = manager.get()
        replace_atomically(weights, model.SerializeToString())
        refused = log.wait_for("refused network")
        assert "the input is named 'x'" in refused[0]
        assert manager.get() is old and not manager.swap_pending()


def test_nan_network_is_refused(weights):
    nan = np.full((1, 1858), np.nan, np.float32)
    made = []

    def loader(path, **kwargs):
        with open(path, "rb") as f:
            data = f.read()
        made.append(FakeNet(policy=nan if data == B else None, sha256=sha(data)))
        return made[-1]

    log = Log()
    with make_manager(weights, log, loader) as manager:
        manager.get()
        replace_atomically(weights, B)
        refused = log.wait_for("refused network")
        assert "not finite" in refused[0] and manager.sha256 == sha(A)
        assert made[-1].closed  # the refused candidate was released
        assert not manager.swap_pending()


# --------------------------------------------------------------------------- the trainer's announcements


@pytest.fixture
def publisher():
    context = zmq.Context.instance()
    socket = context.socket(zmq.PUB)
    socket.setsockopt(zmq.LINGER, 0)
    port = socket.bind_to_random_port("tcp://127.0.0.1")
    yield socket, f"tcp://127.0.0.1:{port}"
    socket.close(0)


def publish_until(socket, frames, done, timeout=5.0) -> None:
    """PUB/SUB drops messages until the subscription has reached the publisher: repeat."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        socket.send_multipart(frames)
        if done():
            return
        time.sleep(0.05)
    raise AssertionError("the announcement never arrived")


def test_announcements_swap_refuse_and_survive_garbage(tmp_path, weights, publisher):
    socket, endpoint = publisher
    gen1, gen3 = str(tmp_path / "gen1.onnx"), str(tmp_path / "gen3.onnx")
    shutil.copyfile(os.path.join(NETS, "default.int8.onnx"), gen1)
    shutil.copyfile(os.path.join(NETS, "default.onnx"), gen3)
    log, loader = Log(), CountingLoader()
    with make_manager(weights, log, loader, endpoint=endpoint) as manager:
        manager.get()
        # Generation 1, the right sha256: verified, then swapped in.
        publish_until(socket, encode_network_announcement(1, gen1, sha(B), run="r1"),
                      manager.swap_pending)
        assert log.wait_for("verified")[0].startswith("new network gen1.onnx")
        assert manager.apply_pending()
        assert manager.generation == 1 and manager.sha256 == sha(B) and manager.network_path == gen1
        assert log.lines[-1].startswith("switched to network gen1.onnx") and "generation 1, run r1" in log.lines[-1]
        assert loader.calls[-1] == (gen1, sha(B))
        loads = len(loader.calls)
        socket.send_multipart(encode_network_announcement(1, gen1, sha(B)))  # a repeat: quietly ignored

        # Generation 2 with a wrong sha256: refused, generation 1 stays.
        socket.send_multipart(encode_network_announcement(2, gen3, sha(A)))
        refused = log.wait_for("refused network")
        assert f"refused network {gen3} (generation 2): sha256 mismatch" in refused[0]
        assert "keeping gen1.onnx" in refused[0] and manager.generation == 1
        socket.send_multipart(encode_network_announcement(2, gen3, sha(A)))  # the same again: quiet

        # Garbage of every kind: each dropped with one line; the subscriber lives on.
        manager.message_limit.burst = 1000  # (the rate limit has a test of its own)
        garbage = garbage_messages(tmp_path)
        for frames in garbage:
            socket.send_multipart(frames)
        dropped = log.wait_for("dropped a malformed message", count=len(garbage))
        assert len(dropped) == len(garbage) and all(endpoint in line for line in dropped)
        assert not os.path.exists(Evil.marker)

        # A valid announcement still goes through.
        socket.send_multipart(encode_network_announcement(3, gen3, sha(C)))
        assert manager.wait_pending(5.0) and manager.apply_pending()
        assert manager.generation == 3 and manager.sha256 == sha(C)
        assert len(loader.calls) == loads + 2  # generation 2 (refused) and 3, nothing else

        # Older generations are ignored with a line.
        socket.send_multipart(encode_network_announcement(2, gen1, sha(B)))
        ignored = log.wait_for("ignored network announcement")
        assert "generation 2" in ignored[0] and "generation 3 is newer" in ignored[0]
        assert len(log.having("refused")) == 1 and not manager.swap_pending()
        assert len(loader.calls) == loads + 2


def test_announcement_of_the_network_in_use_only_tags_its_generation(weights, publisher):
    socket, endpoint = publisher
    log, loader = Log(), CountingLoader()
    with make_manager(weights, log, loader, endpoint=endpoint) as manager:
        manager.get()
        publish_until(socket, encode_network_announcement(4, weights, sha(A)),
                      lambda: manager.generation == 4)
        assert len(loader.calls) == 1 and not manager.swap_pending()
        assert log.wait_for("the network in use is weights.onnx")


def test_malformed_message_lines_are_rate_limited(weights):
    log = Log()
    with make_manager(weights, log) as manager:
        manager.message_limit.burst, manager.message_limit.window = 2, 0.3
        for _ in range(5):
            manager._on_message([b"junk"], "inproc://x")
        assert len(log.having("dropped")) == 2
        time.sleep(0.35)
        manager._on_message([TOPIC, b"\xc1"], "inproc://x")
        assert log.lines[-1].endswith("header is not valid msgpack (FormatError) (3 similar lines suppressed)")


def test_set_endpoint(weights):
    with make_manager(weights, Log()) as manager:
        with pytest.raises(WeightsError):
            manager.set_endpoint("tcp://*:5557")
        manager.set_endpoint("inproc://cyzero-test-weights")
        assert manager.endpoint == "inproc://cyzero-test-weights"
        manager.set_endpoint("")
        assert manager.endpoint is None


def test_close_is_prompt_and_ends_threads(weights, publisher):
    _, endpoint = publisher
    started, slow = threading.Event(), threading.Event()

    def slow_loader(path, **kwargs):
        if started.is_set():
            slow.set()
            time.sleep(1.5)  # a long load (say, a TensorRT build) in progress at close()
        started.set()
        return Network(path, **kwargs)

    manager = make_manager(weights, Log(), slow_loader, endpoint=endpoint)
    manager.get()
    replace_atomically(weights, B)
    assert slow.wait(5.0)  # the watcher has seen it; the load has begun
    threads = [manager._watcher, manager._subscriber, manager._loader_thread]
    assert all(t is not None and t.is_alive() for t in threads)
    t0 = time.monotonic()
    manager.close()
    assert time.monotonic() - t0 < 1.0
    assert not manager._watcher.is_alive() and not manager._subscriber.is_alive()
    with pytest.raises(RuntimeError, match="closed"):
        manager.get()
    manager.close()  # idempotent
    manager._loader_thread.join(5.0)
    assert not manager._loader_thread.is_alive() and not manager.swap_pending()
