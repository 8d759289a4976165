"""The engine's side of the follower contract (docs/contracts.md, "Following a trainer"), against stand-in daemons.

A stand-in daemon is a PUB socket (raw, or the :class:`engine.announce.Announcer`
the real daemon will use), a ROUTER that serves a network's bytes from memory
(so that the announced path need not exist here: the engine cannot read it and
must fetch), and, for CurveZMQ, ``zmq.auth``'s ThreadAuthenticator on the
stand-in's own context.
"""

from __future__ import annotations

import os
import shutil
import threading
import time

import pytest
import zmq
import zmq.auth

import msgpack

from engine.announce import (
    FETCH_PIECE_BYTES,
    TOPIC,
    Announcer,
    KeyFileError,
    decode_fetch_request,
    encode_fetch_refusal,
    encode_fetch_reply,
    encode_network_announcement,
)
from weights_helpers import (
    FAST,
    NETS,
    WAIT,
    A,
    B,
    C,
    CountingLoader,
    Evil,
    Log,
    curve_daemon,  # noqa: F401 - a fixture
    garbage_messages,
    make_manager,
    restamped,
    sha,
    replace_atomically,
)


@pytest.fixture
def weights(tmp_path):
    path = tmp_path / "weights.onnx"
    path.write_bytes(A)
    return str(path)


@pytest.fixture
def publisher():
    context = zmq.Context.instance()
    socket = context.socket(zmq.PUB)
    socket.setsockopt(zmq.LINGER, 0)
    port = socket.bind_to_random_port("tcp://127.0.0.1")
    yield socket, f"tcp://127.0.0.1:{port}"
    socket.close(0)


def publish_until(socket, frames, done, timeout=WAIT) -> None:
    """PUB/SUB drops messages until the subscription has reached the publisher: repeat (as a daemon does)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        socket.send_multipart(frames)
        if done():
            return
        time.sleep(0.05)
    raise AssertionError("the announcement never arrived")


def pieces(served):
    """A stand-in daemon's answer to a request for a piece: the bytes of ``served[generation]`` asked."""
    def reply(r):
        data = served[r.generation]
        return encode_fetch_reply(r.generation, r.sha256, len(data), r.offset, data[r.offset:r.offset + r.length])
    return reply


class FetchServer:
    """A stand-in daemon's ROUTER: answers every request for a piece with ``reply(request)`` (frames), on its
    own thread."""

    def __init__(self, context, reply, server_keys=None) -> None:
        self.socket = context.socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.LINGER, 0)
        if server_keys is not None:
            self.socket.curve_server = True
            self.socket.curve_publickey, self.socket.curve_secretkey = server_keys
        port = self.socket.bind_to_random_port("tcp://127.0.0.1")
        self.endpoint = f"tcp://127.0.0.1:{port}"
        self.reply = reply
        self.requests = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            if not self.socket.poll(50):
                continue
            identity, *body = self.socket.recv_multipart()
            request = decode_fetch_request(body)
            self.requests.append(request)
            self.socket.send_multipart([identity, *self.reply(request)])

    def close(self) -> None:
        self._stop.set()
        self._thread.join(WAIT)
        self.socket.close(0)


# --------------------------------------------------------------------------- announcements


def test_announcements_swap_refuse_and_survive_garbage(tmp_path, weights, publisher):
    socket, endpoint = publisher
    gen1, gen3 = str(tmp_path / "gen1.onnx"), str(tmp_path / "gen3.onnx")
    with open(gen1, "wb") as f:
        f.write(B)
    shutil.copyfile(os.path.join(NETS, "default.onnx"), gen3)
    log, loader = Log(), CountingLoader()
    with make_manager(weights, log, loader, endpoint=endpoint) as manager:
        manager.get()
        # Generation 1, the right sha256: verified, then swapped in.
        publish_until(socket, encode_network_announcement(1, gen1, sha(B), run="r1"), manager.swap_pending)
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
        manager.follower.message_limit.burst = 1000  # (the rate limit has a test of its own)
        garbage = garbage_messages(tmp_path)
        for frames in garbage:
            socket.send_multipart(frames)
        dropped = log.wait_for("dropped a malformed message", count=len(garbage))
        assert len(dropped) == len(garbage) and all(endpoint in line for line in dropped)
        assert not os.path.exists(Evil.marker)

        # A valid announcement still goes through.
        socket.send_multipart(encode_network_announcement(3, gen3, sha(C)))
        assert manager.wait_pending(WAIT) and manager.apply_pending()
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
        publish_until(socket, encode_network_announcement(4, weights, sha(A)), lambda: manager.generation == 4)
        assert len(loader.calls) == 1 and not manager.swap_pending()
        assert log.wait_for("the network in use is weights.onnx")


def test_a_late_follower_hears_the_reannouncement_and_then_ignores_it_quietly(tmp_path, weights):
    gen1 = tmp_path / "gen1.onnx"
    gen1.write_bytes(B)
    log, loader = Log(), CountingLoader()
    with Announcer("tcp://127.0.0.1:*", interval=FAST) as daemon:
        daemon.announce(1, gen1, sha(B))  # before anyone follows: PUB/SUB drops it
        with make_manager(weights, log, loader) as manager:
            manager.get()
            manager.set_endpoint(daemon.endpoint)
            assert manager.wait_pending(WAIT) and manager.apply_pending() and manager.generation == 1
            heard = len(log.lines)
            time.sleep(10 * FAST)  # ten more re-announcements of the generation in use
            assert len(loader.calls) == 2 and log.lines[heard:] == []


def test_a_trainer_endpoint_where_nothing_listens_is_reported_once(weights):
    log = Log()
    with make_manager(weights, log, endpoint="tcp://127.0.0.1:9", silence_s=0.3) as manager:
        said = log.wait_for("no network announcement")
        assert said == ["no network announcement from TrainerEndpoint tcp://127.0.0.1:9 within 0.3 s: is a "
                        "training daemon publishing there, and does it require CurveZMQ keys (set TrainerKeys)?"]
        time.sleep(0.7)
        assert len(log.having("no network announcement")) == 1 and not manager.follower.heard.is_set()


def test_malformed_message_lines_are_rate_limited(weights):
    log = Log()
    with make_manager(weights, log, endpoint="inproc://cyzero-test-rate") as manager:
        follower = manager.follower
        follower.message_limit.burst, follower.message_limit.window = 2, 0.3
        for _ in range(5):
            follower.on_message([b"junk"])
        assert len(log.having("dropped")) == 2
        time.sleep(0.35)
        follower.on_message([b"network", b"\xc1"])
        assert log.lines[-1].endswith("header is not valid msgpack (FormatError) (3 similar lines suppressed)")


def test_set_endpoint(weights):
    with make_manager(weights, Log()) as manager:
        with pytest.raises(ValueError, match="bad TrainerEndpoint"):
            manager.set_endpoint("tcp://*:5557")
        manager.set_endpoint("inproc://cyzero-test-weights")
        first = manager.follower
        manager.set_endpoint("INPROC://cyzero-test-weights")  # the same: the follower goes on
        assert manager.endpoint == "inproc://cyzero-test-weights" and manager.follower is first
        manager.set_endpoint("")
        assert manager.endpoint is None and manager.follower is None and not first.thread.is_alive()


# --------------------------------------------------------------------------- fetching from the daemon


def remote_announcement(generation, data_sha, fetch):
    """An announcement of a path that does not exist here (the daemon's disk, on another host)."""
    return encode_network_announcement(generation, f"/daemon-disk/run/gen{generation}.onnx", data_sha, fetch=fetch)


def test_a_network_the_engine_cannot_read_is_fetched_verified_and_cached(tmp_path, weights, publisher):
    socket, endpoint = publisher
    served = {1: B, 2: B, 3: C}  # generation 2 serves the wrong bytes for its announced sha256
    server = FetchServer(zmq.Context.instance(), pieces(served))
    cache = tmp_path / "cache"
    log, loader = Log(), CountingLoader()
    try:
        with make_manager(weights, log, loader, endpoint=endpoint, cache_dir=str(cache)) as manager:
            manager.get()
            publish_until(socket, remote_announcement(1, sha(B), server.endpoint), manager.swap_pending)
            assert manager.apply_pending() and manager.generation == 1 and manager.sha256 == sha(B)
            assert manager.network_path == "/daemon-disk/run/gen1.onnx"
            fetched = cache / f"gen1.{sha(B)[:12]}.onnx"
            assert fetched.read_bytes() == B and sorted(os.listdir(cache)) == [fetched.name]  # no temp left
            assert loader.calls[-1] == (str(fetched), sha(B))
            assert log.having("fetched gen1.onnx (generation 1")

            # Wrong bytes for the announced sha256: refused, nothing cached, generation 1 stays.
            publish_until(socket, remote_announcement(2, sha(C), server.endpoint), lambda: log.having("refused"))
            refused = log.having("refused")[0]
            assert "refused network /daemon-disk/run/gen2.onnx (generation 2): the bytes fetched from the daemon" in refused
            assert f"not the announced {sha(C)[:12]}" in refused and "keeping gen1.onnx" in refused
            assert sorted(os.listdir(cache)) == [fetched.name] and manager.generation == 1

            # The next generation goes through.
            publish_until(socket, remote_announcement(3, sha(C), server.endpoint), manager.swap_pending)
            assert manager.apply_pending() and manager.generation == 3
        requests = len(server.requests)
        # An engine started later on the same cache does not fetch generation 3 again.
        with make_manager(weights, log, endpoint=endpoint, cache_dir=str(cache)) as later:
            later.get()
            publish_until(socket, remote_announcement(3, sha(C), server.endpoint), later.swap_pending)
            assert later.apply_pending() and later.sha256 == sha(C) and len(server.requests) == requests
    finally:
        server.close()


def _good(r):
    return pieces({1: B})(r)


def _corrupted(r):
    header, piece = _good(r)
    return [header, piece[:100] + bytes([piece[100] ^ 1]) + piece[101:]] if r.offset == FETCH_PIECE_BYTES else [header, piece]


CORRUPTED = B[:FETCH_PIECE_BYTES + 100] + bytes([B[FETCH_PIECE_BYTES + 100] ^ 1]) + B[FETCH_PIECE_BYTES + 101:]
MISBEHAVING_REPLIES = {  # what the daemon answers a request -> what the refusal says
    "a refusal": (lambda r: encode_fetch_refusal(1, sha(B), "busy", r.offset), "refused to send it: busy"),
    "a short piece": (lambda r: [_good(r)[0], _good(r)[1][:-5]],
                      f"carries {FETCH_PIECE_BYTES - 5} bytes at 0 where its header says {FETCH_PIECE_BYTES}"),
    "too many frames": (lambda r: [*_good(r), b"extra"], "has 2 frames of bytes, not 1"),
    "a corrupted piece": (_corrupted, f"have sha256 {sha(CORRUPTED)[:12]}, not the announced {sha(B)[:12]}"),
    "another size later": (lambda r: encode_fetch_reply(1, sha(B), len(B) + r.offset // FETCH_PIECE_BYTES, r.offset,
                                                        B[r.offset:r.offset + r.length]),
                           f"said the file has {len(B)} bytes, then {len(B) + 1}"),
    "garbled header": (lambda r: [b"\xc1", _good(r)[1]], "malformed reply from the daemon"),
    "another generation": (lambda r: encode_fetch_reply(9, sha(B), len(B), r.offset, B[r.offset:r.offset + r.length]),
                           "answered for generation 9, not 1"),
}


@pytest.mark.parametrize("case", sorted(MISBEHAVING_REPLIES))
def test_a_bad_fetch_reply_is_refused_and_the_old_network_kept(tmp_path, weights, publisher, case):
    socket, endpoint = publisher
    reply, says = MISBEHAVING_REPLIES[case]
    server = FetchServer(zmq.Context.instance(), reply)
    log = Log()
    try:
        with make_manager(weights, log, endpoint=endpoint, cache_dir=str(tmp_path / "cache")) as manager:
            manager.get()
            publish_until(socket, remote_announcement(1, sha(B), server.endpoint), lambda: log.having("refused"))
            refused = log.having("refused")[0]
            assert refused.startswith("refused network /daemon-disk/run/gen1.onnx (generation 1): ") and says in refused
            assert manager.sha256 == sha(A) and not manager.swap_pending()
            assert not os.listdir(tmp_path / "cache")
    finally:
        server.close()


def test_a_daemon_of_fetch_version_1_is_refused_clearly_without_asking_it(weights, publisher):
    socket, endpoint = publisher
    old = {"type": "network", "version": 1, "generation": 1, "path": "/daemon-disk/run/gen1.onnx", "sha256": sha(B),
           "fetch": "tcp://127.0.0.1:9"}  # as a daemon from before fetches in pieces announces
    log = Log()
    with make_manager(weights, log, endpoint=endpoint) as manager:
        manager.get()
        publish_until(socket, [TOPIC, msgpack.packb(old)], lambda: log.having("refused"))
        assert ("the daemon at tcp://127.0.0.1:9 serves fetch version 1, this engine version 2: run the same "
                "cyzero version on both") in log.having("refused")[0]
        assert manager.sha256 == sha(A)


def test_an_unreadable_path_without_a_fetch_endpoint_is_refused_clearly(weights, publisher):
    socket, endpoint = publisher
    log = Log()
    with make_manager(weights, log, endpoint=endpoint) as manager:
        manager.get()
        publish_until(socket, remote_announcement(1, sha(B), None), lambda: log.having("refused"))
        assert log.having("refused")[0].startswith(
            "refused network /daemon-disk/run/gen1.onnx (generation 1): cannot read /daemon-disk/run/gen1.onnx "
            "here, and the daemon announced no fetch endpoint")


# --------------------------------------------------------------------------- CurveZMQ


def test_an_engine_with_keys_follows_a_curve_daemon_and_fetches_from_it(tmp_path, weights, curve_daemon):
    """A network of several full pieces: CURVE's framing adds to each piece on the wire, which
    the engine's size limit must allow (it once dropped the daemon at the first full piece)."""
    context, server_keys, engine_keys, _ = curve_daemon
    large = restamped(C, b" " * FETCH_PIECE_BYTES)
    server = FetchServer(context, pieces({1: large}), server_keys=server_keys)
    try:
        with Announcer("tcp://127.0.0.1:*", interval=FAST, server_keys=server_keys, context=context) as daemon:
            # The daemon's disk is not ours: its announcements name the stand-in ROUTER to fetch from.
            daemon.fetch_endpoint = server.endpoint
            daemon.announce(1, "/daemon-disk/gen1.onnx", sha(large))
            log = Log()
            with make_manager(weights, log, endpoint=daemon.endpoint, keys=engine_keys,
                              cache_dir=str(tmp_path / "cache")) as manager:
                manager.get()
                assert manager.wait_pending(WAIT) and manager.apply_pending(), log.lines
                assert manager.generation == 1 and manager.sha256 == sha(large)
                assert sorted(r.offset for r in server.requests) == list(range(0, len(large), FETCH_PIECE_BYTES))
                assert log.having("switched to network") and not log.having("refused")
    finally:
        server.close()


@pytest.mark.parametrize("who", ["no keys", "a stranger's keys"])
def test_an_engine_without_the_right_keys_hears_nothing_and_says_so(tmp_path, weights, curve_daemon, who):
    context, server_keys, _, stranger = curve_daemon
    with Announcer("tcp://127.0.0.1:*", interval=FAST, server_keys=server_keys, context=context) as daemon:
        gen1 = tmp_path / "gen1.onnx"
        gen1.write_bytes(B)
        daemon.announce(1, gen1, sha(B))
        log = Log()
        keys = stranger if who == "a stranger's keys" else None
        with make_manager(weights, log, endpoint=daemon.endpoint, keys=keys, silence_s=1.0) as manager:
            manager.get()
            said = log.wait_for("no network announcement")[0]
            assert ("does it accept these TrainerKeys?" if keys else "set TrainerKeys") in said
            assert not manager.follower.heard.is_set() and not manager.swap_pending()


def test_missing_key_files_are_refused_naming_the_file(tmp_path, weights, curve_daemon):
    _, _, engine_keys, _ = curve_daemon
    os.remove(os.path.join(engine_keys, "server.key"))
    with make_manager(weights, Log()) as manager:
        with pytest.raises(KeyFileError, match=f"CurveZMQ key file not found: {engine_keys}/server.key"):
            manager.set_trainer_keys(engine_keys)
        with pytest.raises(KeyFileError, match="must name a directory"):
            manager.set_trainer_keys(str(tmp_path / "nowhere"))


def test_close_is_prompt_and_ends_threads(weights, publisher):
    _, endpoint = publisher
    started, slow = threading.Event(), threading.Event()

    def slow_loader(path, **kwargs):
        from engine.network import Network

        if started.is_set():
            slow.set()
            time.sleep(1.5)  # a long load (say, a TensorRT build) in progress at close()
        started.set()
        return Network(path, **kwargs)

    manager = make_manager(weights, Log(), slow_loader, endpoint=endpoint)
    manager.get()
    replace_atomically(weights, B)
    assert slow.wait(WAIT)  # the watcher has seen it; the load has begun
    threads = [manager.watcher.thread, manager.follower.thread, manager.swap.loader_thread]
    assert all(t.is_alive() for t in threads)
    manager.close()
    assert not threads[0].is_alive() and not threads[1].is_alive()
    with pytest.raises(RuntimeError, match="closed"):
        manager.get()
    manager.close()  # idempotent
    threads[2].join(WAIT)
    assert not threads[2].is_alive() and not manager.swap_pending()
