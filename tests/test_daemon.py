"""The training daemon (trainer.daemon) against fake workers: DEALER sockets speaking trainer.wire.

The daemon runs in a thread of the test with its child commands replaced by small Python
scripts, so these tests need neither the real worker nor a learner; the run directory is a
copy of one tiny initialised run (a 1x8 network), made once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import types
import uuid

import msgpack
import numpy as np
import pytest

zmq = pytest.importorskip("zmq")

from engine.announce import TOPIC, decode_network_announcement, load_client_keys  # noqa: E402
from trainer import wire  # noqa: E402
from trainer.atomic import append_jsonl, read_jsonl  # noqa: E402
from trainer.config import loads_config  # noqa: E402
from trainer.daemon import Daemon, run_daemon  # noqa: E402
from trainer.records import RECORD_DTYPE  # noqa: E402
from tiny_configs import tiny_config  # noqa: E402

pytestmark = pytest.mark.timeout(120)

CONFIG = tiny_config(daemon={"endpoint": "tcp://127.0.0.1:*", "publish": "tcp://127.0.0.1:*",
                                     "fetch": "tcp://127.0.0.1:*", "flush_s": 0.2, "restart_backoff_s": 0.1})
SLEEP = [sys.executable, "-c", "import time; time.sleep(600)"]
PGN = '[Event "self-play"]\n[Result "1-0"]\n\n1. f3 e5 2. g4 Qh4# 0-1\n'


def config(**sections):
    return loads_config(CONFIG).replace(**sections) if sections else loads_config(CONFIG)


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    """One initialised run (generation 0 of a 1x8 network), copied by each test."""
    from trainer.learner import initialize_run

    folder = tmp_path_factory.mktemp("template")
    path = folder / "config.toml"
    path.write_text(CONFIG)
    initialize_run(folder / "run", config_path=path, log=lambda line: None)
    return folder / "run"


@pytest.fixture
def run_dir(template, tmp_path):
    target = tmp_path / "run"
    shutil.copytree(template, target)
    return str(target)


class Running:
    """A started daemon serving in a thread; ``close()`` is the SIGTERM path (serve ends, stop runs)."""

    def __init__(self, run_dir, cfg=None, worker=None, learner=None, ladder=None, **kwargs):
        self.lines: list[str] = []
        self.daemon = Daemon(run_dir, cfg or config(), log=self.lines.append,
                             worker_command=worker or (lambda *args: SLEEP),
                             learner_command=learner or (lambda *args: SLEEP),
                             ladder_command=ladder or (lambda *args: SLEEP), **kwargs)
        self.daemon.start()
        with open(os.path.join(run_dir, "daemon.json")) as f:
            self.info = json.load(f)
        self.event = threading.Event()
        self.thread = threading.Thread(target=self._serve)
        self.thread.start()

    def _serve(self):
        try:
            self.daemon.serve(self.event)
        finally:
            self.daemon.stop()

    def close(self):
        self.event.set()
        self.thread.join(60)
        assert not self.thread.is_alive()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Client:
    """A fake worker: a DEALER that speaks trainer.wire."""

    def __init__(self, endpoint, keys=None, curve=None):
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        if keys is not None:
            keys.apply(self.sock)
        if curve is not None:  # (server public, public, secret)
            self.sock.curve_serverkey, self.sock.curve_publickey, self.sock.curve_secretkey = curve
        self.sock.connect(endpoint)

    def send(self, message):
        self.sock.send_multipart(wire.encode(message))

    def send_raw(self, frames):
        self.sock.send_multipart(frames)

    def recv(self, timeout=10.0):
        """The next message, or None after ``timeout`` seconds."""
        if not self.sock.poll(int(timeout * 1000)):
            return None
        return wire.decode(self.sock.recv_multipart())

    def expect(self, kind, timeout=10.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            message = self.recv(max(0.01, deadline - time.monotonic()))
            if isinstance(message, kind):
                return message
        raise AssertionError(f"no {kind.__name__} within {timeout} s")

    def register(self, worker="w-test"):
        self.send(wire.Register(worker, "testhost", os.getpid(), ("cpu",), "cyzero test"))
        return self.expect(wire.Registered)

    def close(self):
        self.sock.close(0)
        self.ctx.term()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def records(n: int) -> np.ndarray:
    out = np.zeros(n, dtype=RECORD_DTYPE)
    out["version"] = 6
    out["input_format"] = 1
    out["visits"] = np.arange(n) + 1
    return out


def game(generation=0, n=5, game_id=None, worker="w-test"):
    return wire.Game(worker, game_id or uuid.uuid4().hex, generation, "0-1", "checkmate", records(n), PGN)


def manifest_adds(run_dir):
    return [r for r in read_jsonl(os.path.join(run_dir, "replay", "manifest.jsonl")) if r.get("op") == "add"]


def stored_ids(run_dir):
    return [i for r in manifest_adds(run_dir) for i in r.get("game_ids", [])]


def wait_for(predicate, timeout=10.0, what="the condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


# --------------------------------------------------------------------------- protocol


def test_register_games_acked_after_they_are_durable_and_duplicates_dropped(run_dir):
    generations = read_jsonl(os.path.join(run_dir, "generations.jsonl"))
    cfg = config()
    first = game(0)
    with Running(run_dir, cfg) as running, Client(running.info["endpoint"]) as client:
        registered = client.register()
        assert registered.run == "run" and registered.generation == 0
        assert registered.path == os.path.join(run_dir, "networks", "gen-00000.onnx")
        assert registered.sha256 == generations[0]["sha256"]
        assert registered.publish == running.info["publish"]
        assert registered.selfplay == dataclasses.asdict(cfg.selfplay)
        from engine.tools.match import load_openings
        assert list(registered.openings) == [o.board().fen() for o in load_openings()]

        client.send(first)
        ack = client.expect(wire.Ack)
        assert ack.game_ids == (first.game_id,)
        adds = manifest_adds(run_dir)  # read when the ack arrived: the game is already durable
        assert [(a["generation"], a["source"], a["game_ids"], a["positions"]) for a in adds] == \
            [(0, "selfplay", [first.game_id], 5)]
        with open(os.path.join(run_dir, "pgn", "games-g00000.pgn")) as f:
            assert "Qh4#" in f.read()

        client.send(first)  # resent (the ack was lost): acknowledged again, stored once
        assert client.expect(wire.Ack).game_ids == (first.game_id,)
        older, newer = game(0), game(1)
        client.send(older)
        client.send(newer)
        acked = set()
        while len(acked) < 2:
            acked.update(client.expect(wire.Ack).game_ids)
        assert acked == {older.game_id, newer.game_id}
    by_generation = {}
    for add in manifest_adds(run_dir):
        by_generation.setdefault(add["generation"], []).extend(add["game_ids"])
    assert sorted(by_generation[0]) == sorted([first.game_id, older.game_id])
    assert by_generation[1] == [newer.game_id]
    assert os.path.isfile(os.path.join(run_dir, "pgn", "games-g00001.pgn"))

    with Running(run_dir, cfg) as running, Client(running.info["endpoint"]) as client:
        client.send(first)  # a restarted daemon still knows it by its id
        assert client.expect(wire.Ack).game_ids == (first.game_id,)
    assert sorted(stored_ids(run_dir)) == sorted([first.game_id, older.game_id, newer.game_id])


def test_a_game_in_another_input_format_than_the_runs_network_is_refused_and_the_rest_stored(run_dir):
    """A run's store holds its network's format (the learner reads nothing else): a game written for
    another is refused with the reason (the worker drops it), said in the log, and stores nothing."""
    foreign = game(0)
    foreign.records["input_format"] = 3
    ours = game(0)
    with Running(run_dir, config()) as running, Client(running.info["endpoint"]) as client:
        client.register()
        client.send(foreign)
        refused = client.expect(wire.Refused)
        assert refused.game_id == foreign.game_id
        assert "input format 3" in refused.reason and "reads format 1" in refused.reason
        client.send(ours)
        assert client.expect(wire.Ack).game_ids == (ours.game_id,)
    assert stored_ids(run_dir) == [ours.game_id]
    assert any(f"refused game {foreign.game_id}" in line for line in running.lines), running.lines


def test_the_memory_of_stored_game_ids_is_bounded_and_a_recent_resend_still_dropped(run_dir):
    """The duplicate check remembers only the newest ``recent_game_ids`` stored ids, also after a
    restart (read back from the manifest, newest last); a resend of a recent game is acknowledged
    and not stored again."""
    limit = 20
    sent = [game(0, n=2) for _ in range(3 * limit)]

    def send_all(client, games):
        client.register()
        for g in games:
            client.send(g)
        acked: set[str] = set()
        while len(acked) < len(games):
            acked.update(client.expect(wire.Ack).game_ids)
        assert acked == {g.game_id for g in games}

    with Running(run_dir, recent_game_ids=limit) as running, Client(running.info["endpoint"]) as client:
        for i in range(0, len(sent), 10):  # several chunks, oldest first
            send_all(client, sent[i:i + 10])
        assert len(running.daemon._ingest.stored) == limit  # 3 x limit games stored, limit ids remembered
        for recent in (sent[-1], sent[-limit]):
            client.send(recent)  # its ack was lost: resent, acknowledged again, not stored again
            assert client.expect(wire.Ack).game_ids == (recent.game_id,)
        assert len(running.daemon._ingest.stored) == limit
    ids = stored_ids(run_dir)
    assert sorted(ids) == sorted(g.game_id for g in sent)  # each stored once

    with Running(run_dir, recent_game_ids=limit) as running, Client(running.info["endpoint"]) as client:
        assert len(running.daemon._ingest.stored) == limit  # a restart reads back only the newest
        client.register()
        client.send(sent[-1])  # resent to the restarted daemon
        assert client.expect(wire.Ack).game_ids == (sent[-1].game_id,)
        more = [game(0, n=2) for _ in range(5)]
        send_all(client, more)
        client.send(more[0])
        assert client.expect(wire.Ack).game_ids == (more[0].game_id,)
        assert len(running.daemon._ingest.stored) == limit
    assert sorted(stored_ids(run_dir)) == sorted(g.game_id for g in sent + more)


def test_stop_flushes_buffered_games_acks_them_and_writes_workers_json(run_dir):
    cfg = config(daemon={"flush_s": 60.0})
    running = Running(run_dir, cfg)
    with Client(running.info["endpoint"]) as client:
        sent = game(0, n=3, worker="w-stop")
        client.send(sent)
        client.register("w-stop")  # answered after the game was taken: it is buffered now
        assert stored_ids(run_dir) == []
        running.close()
        assert client.expect(wire.Ack).game_ids == (sent.game_id,)
        assert isinstance(client.expect(wire.Stop), wire.Stop)
    assert stored_ids(run_dir) == [sent.game_id]
    with open(os.path.join(run_dir, "workers.json")) as f:
        report = json.load(f)
    assert report["games"] == 1 and report["positions"] == 3 and report["generation"] == 0
    rows = {w["id"]: w for w in report["workers"]}
    assert rows["w-stop"]["games"] == 1 and rows["w-stop"]["host"] == "testhost" and not rows["w-stop"]["local"]
    assert rows["local-cpu-0"]["local"] and rows["local-cpu-0"]["restarts"] == 0


def test_malformed_frames_are_dropped_and_the_daemon_keeps_serving(run_dir):
    good = wire.encode(game(0, n=4))
    truncated = [good[0], good[1][:-7], good[2]]
    header = msgpack.unpackb(good[0])
    header["frames"][0]["shape"] = [wire.MAX_FRAME_BYTES]  # declares a frame larger than the wire allows
    oversized_frame = [msgpack.packb(header), good[1], good[2]]
    register = {"type": "register", "version": 1, "worker": "w", "host": "h", "pid": 1, "devices": ["cpu"],
                "software": "x"}
    bad = [
        [b"\xc1garbage"],
        [b""],
        truncated,
        oversized_frame,
        [msgpack.packb({"type": "register", "pad": "x" * 100_000})],  # a header over 64 KiB
        [msgpack.packb({"type": "bogus", "version": 1})],
        [msgpack.packb(dict(register, version=99))],
        [msgpack.packb(dict(register, devices="cpu"))],
        wire.encode(wire.Ack(("a" * 32,))),  # a daemon's message sent to the daemon
    ]
    with Running(run_dir) as running, Client(running.info["endpoint"]) as client:
        for frames in bad:
            client.send_raw(frames)
            assert client.register().generation == 0
        client.send(game(0))
        client.expect(wire.Ack)
        assert running.thread.is_alive()
    dropped = [line for line in running.lines if "dropped" in line or "held back" in line]
    assert dropped and any("malformed" in line for line in dropped)
    assert len(stored_ids(run_dir)) == 1


def test_junk_on_every_socket_and_a_message_over_the_size_limit_leave_the_daemon_serving(run_dir):
    from engine.announce import decode_fetch_reply, encode_fetch_request

    generation = read_jsonl(os.path.join(run_dir, "generations.jsonl"))[0]
    with Running(run_dir) as running:
        for endpoint in (running.info["endpoint"], running.info["publish"], running.info["fetch"]):
            host, port = endpoint[len("tcp://"):].rsplit(":", 1)
            with socket.create_connection((host, int(port)), timeout=5) as raw:  # not even ZMTP
                raw.sendall(b"GET / HTTP/1.0\r\n\r\n" + bytes(range(256)) * 64)
        with Client(running.info["fetch"]) as fetcher:
            fetcher.send_raw([b"\xc1garbage"])
            fetcher.send_raw(encode_fetch_request(0, generation["sha256"]))
            assert fetcher.sock.poll(10_000)
            reply = fetcher.sock.recv_multipart()
            assert decode_fetch_reply(reply[0]).size == os.path.getsize(os.path.join(run_dir, generation["onnx"]))
        with Client(running.info["endpoint"]) as big:  # past the ROUTER's MAXMSGSIZE: disconnected, not read
            header = wire.encode(game(0))[0]
            big.send_raw([header, bytes(wire.MAX_FRAME_BYTES), bytes(wire.MAX_FRAME_BYTES + (1 << 20))])
            assert big.recv(1.0) is None
        assert not any("holds" in line for line in running.lines)  # never decoded: the socket refused it
        with Client(running.info["endpoint"]) as client:
            assert client.register().generation == 0
            client.send(game(0))
            client.expect(wire.Ack)
        assert running.thread.is_alive()


# --------------------------------------------------------------------------- keys and binding


def test_keys_admit_only_authorised_clients(run_dir, tmp_path):
    from trainer.keys import create_keys

    keys = tmp_path / "keys"
    create_keys(keys, ["good"])
    cfg = config(daemon={"keys": str(keys)})
    good = load_client_keys(keys / "clients" / "good")
    stranger_public, stranger_secret = zmq.curve_keypair()
    with Running(run_dir, cfg) as running:
        assert running.info["keys"] is True
        endpoint = running.info["endpoint"]
        with Client(endpoint) as plain, Client(endpoint, curve=(good.server_public, stranger_public,
                                                                 stranger_secret)) as stranger, \
                Client(endpoint, keys=good) as member:
            for client in (plain, stranger):
                # Not waited for: once the daemon has refused the handshake, the socket has no peer
                # to queue on, and a blocking send hung until the test's timeout (on a loaded machine).
                with contextlib.suppress(zmq.Again):
                    client.sock.send_multipart(wire.encode(wire.Register("intruder", "h", 1, ("cpu",), "x")),
                                               flags=zmq.DONTWAIT)
            assert member.register("member").generation == 0
            assert plain.recv(1.0) is None and stranger.recv(0.2) is None
            # the stranger's refused handshake is said (with its address), not silently dropped
            wait_for(lambda: any(line.startswith("refused a handshake from 127.0.0.1") for line in running.lines),
                     what="the refusal logged")
            refusal = next(line for line in running.lines if line.startswith("refused a handshake from 127.0.0.1"))
            assert "DENIED (CURVE)" in refusal and str(keys / "authorized") in refusal
        assert "intruder" not in running.daemon._workers
        # the local workers get keys of their own, admitted as the others
        assert os.path.isfile(keys / "clients" / "local" / "client.key_secret")
        assert os.path.isfile(keys / "authorized" / "local.key")


def test_binding_a_wildcard_without_keys_is_refused(run_dir, tmp_path):
    cfg = config(daemon={"endpoint": "tcp://0.0.0.0:*"})
    with pytest.raises(ValueError) as err:
        Daemon(run_dir, cfg, log=lambda line: None).start()
    assert str(err.value) == ("binding tcp://0.0.0.0:* needs CurveZMQ keys: run `cyzero-train keys DIR` "
                              "and set daemon.keys")
    path = tmp_path / "open.toml"
    path.write_text(CONFIG.replace('publish = "tcp://127.0.0.1:*"', 'publish = "tcp://*:5781"'))
    lines: list[str] = []
    assert run_daemon(run_dir, config=str(path), log=lines.append) == 2
    assert lines == ["error: binding tcp://*:5781 needs CurveZMQ keys: run `cyzero-train keys DIR` and set "
                     "daemon.keys"]
    assert not os.path.exists(os.path.join(run_dir, "daemon.json"))


def test_a_second_daemon_on_the_run_is_refused(run_dir):
    with Running(run_dir):
        with pytest.raises(ValueError, match=r"another daemon is running on .* \(pid \d+\)"):
            Daemon(run_dir, config(), log=lambda line: None).start()
        lines: list[str] = []
        assert run_daemon(run_dir, log=lines.append) == 2
        assert len(lines) == 1 and "another daemon is running" in lines[0]
    Running(run_dir).close()  # released at stop


# --------------------------------------------------------------------------- supervision

HEARTBEATER = """
import os, sys, time
import zmq
from trainer import wire
endpoint, name, marker = sys.argv[1:4]
if not os.path.exists(marker):  # the first life: silent until killed
    open(marker, "w").close()
    time.sleep(600)
sock = zmq.Context().socket(zmq.DEALER)
sock.connect(endpoint)
while True:
    sock.send_multipart(wire.encode(wire.Heartbeat(name, 3, 12.5, 0)))
    time.sleep(0.2)
"""


def test_dead_and_silent_children_are_restarted(run_dir, tmp_path):
    script = tmp_path / "heartbeater.py"
    script.write_text(HEARTBEATER)
    marker = tmp_path / "first-life"
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def worker(device, k, endpoint, games, threads, keys):
        assert (device, games, keys) == ("cpu", 32, None) and threads >= 1
        return [sys.executable, str(script), endpoint, Daemon.worker_id(device, k), str(marker)]

    def learner(run, devices):
        assert (run, devices) == (run_dir, "cpu:1")
        return [sys.executable, "-c", "import sys; sys.exit(3)"]

    cfg = config(daemon={"heartbeat_timeout_s": 2.5})
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = repo + (os.pathsep + old if old else "")
    try:
        with Running(run_dir, cfg, worker=worker, learner=learner) as running:
            wait_for(lambda: any("learner" in line and "restarted" in line and "restart 2" in line
                                 for line in running.lines), what="the learner's second restart")
            wait_for(lambda: any("local-cpu-0" in line and "silent for 2.5 s: killed" in line for line in running.lines),
                     what="the silent worker killed")
            row = running.daemon._workers["local-cpu-0"]
            wait_for(lambda: row.playing == 3, what="the restarted worker's heartbeats")
            heard = row.last_heard
            wait_for(lambda: row.last_heard > heard, what="another heartbeat")
            assert row.child.restarts == 1 and row.child.alive()
    finally:
        if old is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = old
    assert any("learner" in line and "exited with code 3" in line for line in running.lines)
    with open(os.path.join(run_dir, "workers.json")) as f:
        rows = {w["id"]: w for w in json.load(f)["workers"]}
    assert rows["local-cpu-0"]["restarts"] == 1 and rows["local-cpu-0"]["playing"] == 3
    assert rows["local-cpu-0"]["generation"] == 0
    assert os.path.isfile(os.path.join(run_dir, "logs", "learner.log"))
    assert os.path.isfile(os.path.join(run_dir, "logs", "worker-cpu-0.log"))


# --------------------------------------------------------------------------- publishing


def add_generation(run_dir, generation):
    """A learner's export: a copy of generation 0's network as generation ``generation``."""
    record = read_jsonl(os.path.join(run_dir, "generations.jsonl"))[0]
    onnx = f"networks/gen-{generation:05d}.onnx"
    shutil.copyfile(os.path.join(run_dir, record["onnx"]), os.path.join(run_dir, onnx))
    append_jsonl(os.path.join(run_dir, "generations.jsonl"),
                 dict(record, generation=generation, step=10 * generation, onnx=onnx, time=time.time()))
    return onnx


class Subscriber:
    def __init__(self, endpoint):
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.SUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.SUBSCRIBE, TOPIC)
        self.sock.connect(endpoint)

    def wait(self, generation, timeout=10.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.sock.poll(100):
                announcement = decode_network_announcement(self.sock.recv_multipart())
                if announcement.generation == generation:
                    return announcement
        raise AssertionError(f"generation {generation} not announced within {timeout} s")

    def close(self):
        self.sock.close(0)
        self.ctx.term()


def test_new_generations_are_announced_and_logged(run_dir):
    with Running(run_dir) as running:
        sub = Subscriber(running.info["publish"])
        try:
            assert sub.wait(0).path == os.path.join(run_dir, "networks", "gen-00000.onnx")
            onnx = add_generation(run_dir, 1)
            announcement = sub.wait(1)
            assert announcement.path == os.path.join(run_dir, onnx) and announcement.run == "run"
            assert announcement.fetch == running.info["fetch"]
        finally:
            sub.close()
        with Client(running.info["endpoint"]) as client:
            assert client.register().generation == 1
    published = read_jsonl(os.path.join(run_dir, "published.jsonl"))
    assert [(p["generation"], p["onnx"], p["gated"]) for p in published] == \
        [(0, "networks/gen-00000.onnx", False), (1, onnx, False)]
    with Running(run_dir) as running:  # a restart announces the last one again, without a new line
        with Client(running.info["endpoint"]) as client:
            assert client.register().generation == 1
    assert len(read_jsonl(os.path.join(run_dir, "published.jsonl"))) == 2


def test_gating_publishes_only_accepted_generations(run_dir, monkeypatch):
    calls = []

    def gate(candidate, best, cfg, log, stop=None):
        calls.append((os.path.basename(candidate), os.path.basename(best)))
        accepted = candidate.endswith("gen-00002.onnx")
        result = types.SimpleNamespace(accepted=accepted, wins=3 if accepted else 0, draws=1, losses=0 if accepted else 3,
                                       reason="H1 accepted" if accepted else "H0 accepted", generation=None, best=None)
        result.to_dict = lambda: {"generation": result.generation, "best": result.best, "accepted": result.accepted,
                                  "reason": result.reason}
        return result

    monkeypatch.setitem(sys.modules, "trainer.gating", types.SimpleNamespace(gate=gate))
    with Running(run_dir, config(gating={"enabled": True})) as running:
        add_generation(run_dir, 1)
        wait_for(lambda: read_jsonl(os.path.join(run_dir, "gating.jsonl")), what="the first gating line")
        add_generation(run_dir, 2)
        wait_for(lambda: len(read_jsonl(os.path.join(run_dir, "published.jsonl"))) == 2, what="generation 2")
        with Client(running.info["endpoint"]) as client:
            assert client.register().generation == 2
    assert calls == [("gen-00001.onnx", "gen-00000.onnx"), ("gen-00002.onnx", "gen-00000.onnx")]
    assert [(g["generation"], g["best"], g["accepted"]) for g in read_jsonl(os.path.join(run_dir, "gating.jsonl"))] \
        == [(1, 0, False), (2, 0, True)]
    assert [(p["generation"], p["gated"]) for p in read_jsonl(os.path.join(run_dir, "published.jsonl"))] == \
        [(0, False), (2, True)]


def test_config_names_a_bundled_config_or_a_file(run_dir, tmp_path):
    from trainer.config import bundled_config, load_config, load_run_config
    from trainer.rundir import resolve_config

    assert resolve_config(run_dir, "cpu") == load_config(bundled_config("cpu"))
    path = tmp_path / "mine.toml"
    path.write_text(CONFIG)
    assert resolve_config(run_dir, str(path)) == config()
    assert resolve_config(run_dir, None) == load_run_config(run_dir)
    with pytest.raises(ValueError, match="cannot read config"):
        resolve_config(run_dir, "no-such-config")


def test_the_users_config_is_left_as_written_and_the_learner_gets_the_daemons(run_dir, tmp_path):
    """RUN/config.toml is the user's file: a daemon started with another --config says so and
    leaves it; its own config goes to RUN/config.effective.toml, which its learner is told to read."""
    mine = "# my notes\n" + CONFIG
    with open(os.path.join(run_dir, "config.toml"), "w") as f:
        f.write(mine)
    other = tmp_path / "other.toml"
    other.write_text(CONFIG.replace("flush_s = 0.2", "flush_s = 0.3"))
    lines: list[str] = []
    daemon = Daemon(run_dir, config(daemon={"flush_s": 0.3}), log=lines.append, config_source=str(other),
                    worker_command=lambda *args: SLEEP, learner_command=lambda *args: SLEEP)
    daemon.start()
    daemon.stop()
    learner = Daemon.learner_command(daemon, daemon.run_dir, "cpu:1")  # the real command, not the test's
    assert open(os.path.join(run_dir, "config.toml")).read() == mine
    assert f"config.toml is left as you wrote it; this run uses {other} (every key in config.effective.toml)" in lines
    effective = os.path.join(run_dir, "config.effective.toml")
    assert loads_config(open(effective).read()) == config(daemon={"flush_s": 0.3})
    assert learner[learner.index("--config") + 1] == effective and "learn" in learner and "--follow" in learner


def test_games_are_held_out_for_validation_from_the_first_one_on(run_dir):
    """Issue 46: a run's status said "0 held out for validation" for its first 10 minutes, because
    whole chunks were held out by their names' hash and a young run has few. The daemon now holds
    out games so that their share is replay.val_percent from the first game on, in chunks of
    their own that every reader (learner, status) sees as held out."""
    from trainer.config import is_validation

    cfg = config()
    percent = cfg.replay.val_percent
    assert percent == 5.0
    games = [game(0, n=10) for _ in range(60)]
    with Running(run_dir, cfg) as running, Client(running.info["endpoint"]) as client:
        client.register()
        client.send(games[0])
        assert client.expect(wire.Ack).game_ids == (games[0].game_id,)
        first = manifest_adds(run_dir)
        assert len(first) == 1 and is_validation(first[0]["name"], percent)  # the very first game
        for g in games[1:]:
            client.send(g)
        acked = set()
        while len(acked) < len(games) - 1:
            acked.update(client.expect(wire.Ack).game_ids)
    adds = manifest_adds(run_dir)
    held = sum(a["positions"] for a in adds if is_validation(a["name"], percent))
    total = sum(a["positions"] for a in adds)
    assert total == 600 and sorted(stored_ids(run_dir)) == sorted(g.game_id for g in games)
    assert percent / 100 * total <= held <= percent / 100 * total + 10  # 5%, at most one game over
    assert any(not is_validation(a["name"], percent) for a in adds)


def test_a_coordinator_starts_no_worker_and_no_learner_and_serves_remote_ones(run_dir):
    """``--workers-per-device 0 --learner-devices none``: a cluster's coordinator. Nothing is started
    here; a remote worker's games are stored, and a generation written by a learner elsewhere (into
    the shared run folder) is announced."""
    started = []

    def never(*args):
        started.append(args)
        return SLEEP

    cfg = config(daemon={"endpoint": "tcp://127.0.0.1:*"})
    with Running(run_dir, cfg, worker=never, learner=never, workers_per_device=0, learner_devices="none") as running:
        assert running.daemon._workers == {} and running.daemon._supervisor.learner is None
        assert any("no self-play worker on this machine" in line and "cyzero-train worker --connect tcp://" in line
                   for line in running.lines)
        assert any("no learner on this machine (--learner-devices = none)" in line for line in running.lines)
        sub = Subscriber(running.info["publish"])
        try:
            with Client(running.info["endpoint"]) as client:
                client.register("remote-1")
                client.send(game(game_id="g-remote"))
                assert client.expect(wire.Ack).game_ids == ("g-remote",)
            add_generation(run_dir, 1)
            assert sub.wait(1).generation == 1
        finally:
            sub.close()
    assert started == [] and stored_ids(run_dir) == ["g-remote"]
    with open(os.path.join(run_dir, "workers.json")) as f:
        report = json.load(f)
    assert "learner" not in report and report["devices"]["cpu"]["selfplay_workers"] == 0


def test_workers_per_device_below_zero_is_refused(run_dir):
    with pytest.raises(ValueError, match="0 \\(remote workers only\\) or more"):
        Daemon(run_dir, config(), workers_per_device=-1)


def test_status_names_the_addresses_a_remote_machine_dials_not_the_wildcard(run_dir, tmp_path):
    from trainer.endpoints import machine_addresses
    from trainer.keys import create_keys
    from trainer.report import format_status, run_status

    keys = tmp_path / "keys"
    create_keys(str(keys), ["worker"])
    cfg = config(daemon={"endpoint": "tcp://0.0.0.0:*", "publish": "tcp://0.0.0.0:*", "fetch": "tcp://0.0.0.0:*",
                         "keys": str(keys)})
    with Running(run_dir, cfg) as running:
        assert running.info["endpoint"].startswith("tcp://0.0.0.0:")
        text = format_status(run_status(run_dir), time.time())
    port = running.info["endpoint"].rsplit(":", 1)[1]
    first = machine_addresses()[0]
    assert f"workers connect to tcp://{first}:{port}" in text
    assert "0.0.0.0" not in text and "//*" not in text
    assert any(f"workers at tcp://{first}:{port}" in line for line in running.lines)


def test_the_learner_gets_its_share_of_the_cores_and_the_workers_the_rest(run_dir, tmp_path):
    """The learner beside a self-play worker trained at a fifth of its rate alone: torch took every
    core and so did the worker's runtime. The learner gets daemon.learner_threads torch threads a rank
    (OMP_NUM_THREADS), the workers run at daemon.worker_nice; daemon.learner_cores gives it cores of
    its own (the workers get the others)."""
    usable = sorted(os.sched_getaffinity(0))
    if len(usable) < 2:
        pytest.skip("needs 2 usable cores")
    seen = tmp_path / "learner-env"
    learner = [sys.executable, "-c", f"import os, time; open({str(seen)!r}, 'w').write(os.environ.get('OMP_NUM_THREADS', '-')); "
               "time.sleep(600)"]
    cfg = config(daemon={"learner_cores": 1})
    with Running(run_dir, cfg, learner=lambda *args: learner) as running:
        daemon = running.daemon
        wait_for(lambda: seen.exists() and seen.read_text(), what="the learner's environment")
        assert seen.read_text() == "1"
        learner_pid = daemon._supervisor.learner.proc.pid
        worker_pid = daemon._workers["local-cpu-0"].child.proc.pid
        assert os.sched_getaffinity(learner_pid) == {usable[-1]}
        assert os.sched_getaffinity(worker_pid) == set(usable[:-1])
        assert any(f"the learner has [{usable[-1]}] to itself" in line for line in running.lines)
        command = Daemon.worker_command(daemon, "cpu", 0, "tcp://127.0.0.1:1", 8, 1, None)
        assert command[-2:] == ["--nice", "10"]
        ladder = Daemon.ladder_command(daemon, run_dir)  # the ladder's games take self-play's share too
        assert ladder[3:6] == ["evaluate", run_dir, "--follow"] and ladder[-2:] == ["--nice", "10"]
        assert ladder[ladder.index("--config") + 1] == os.path.join(run_dir, "config.effective.toml")
        wait_for(lambda: daemon._supervisor.ladder.alive(), what="the ladder child")
    with pytest.raises(ValueError, match="leaves the workers none"):
        Daemon(run_dir, config(daemon={"learner_cores": len(usable)})).start()


def test_a_worker_started_with_nice_runs_lower_in_priority():
    before = os.getpriority(os.PRIO_PROCESS, 0)
    worker = subprocess.Popen([sys.executable, "-m", "trainer.cli", "worker", "--connect", "tcp://127.0.0.1:9",
                               "--nice", "7"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: os.getpriority(os.PRIO_PROCESS, worker.pid) == min(19, before + 7), timeout=30,
                 what="the worker's niceness")
    finally:
        worker.kill()
        worker.wait()


def test_the_daemon_says_whether_it_starts_or_resumes_a_run_when_it_published_and_what_a_stop_loses(run_dir):
    with Running(run_dir) as running:
        assert "a new run: no self-play game stored yet" in running.lines
        with Client(running.info["endpoint"]) as client:
            client.register("w-1")
            client.send(wire.Heartbeat("w-1", 3, 5.0, 0))
            wait_for(lambda: running.daemon.games_in_play() == 3, what="the heartbeat's games in play")
            client.send(game(game_id="g-1", worker="w-1"))
            client.expect(wire.Ack)
        add_generation(run_dir, 1)
        wait_for(lambda: any(line.startswith("published generation 1 ") for line in running.lines),
                 what="generation 1 published")
    line = next(line for line in running.lines if line.startswith("published generation 1 "))
    assert re.search(r"published generation 1 \(networks/gen-00001\.onnx\) at \d\d:\d\d:\d\d, [0-9.]+ min after "
                     r"this daemon's start", line), line
    with Running(run_dir) as running:
        assert ("resuming the run: generation 1 published, 1 self-play game stored (the learner resumes at its "
                "last checkpoint)") in running.lines


def test_a_worker_that_falls_silent_and_comes_back_is_said_and_one_off_clients_age_out(run_dir, monkeypatch):
    import trainer.daemon as daemon_module

    monkeypatch.setattr(daemon_module, "SILENT_S", 0.5)
    monkeypatch.setattr(daemon_module, "FORGET_S", 3.0)
    monkeypatch.setattr(daemon_module, "WORKERS_EVERY_S", 0.2)
    with Running(run_dir) as running:
        with Client(running.info["endpoint"]) as client:
            client.register("remote-1")
            wait_for(lambda: any(line.startswith("remote-1 on testhost silent for") for line in running.lines),
                     what="the silence said")
            client.send(wire.Heartbeat("remote-1", 2, 1.0, 0))
            wait_for(lambda: any(line.startswith("remote-1 is back after") for line in running.lines),
                     what="the return said")
        wait_for(lambda: "remote-1" not in running.daemon._workers, what="the one-off client forgotten")
        assert any(line.startswith("remote-1 forgotten: silent for") for line in running.lines)
        assert "local-cpu-0" in running.daemon._workers   # local ones are never forgotten


def test_held_back_lines_are_counted_after_a_quiet_spell_not_only_at_the_next_one():
    from trainer.daemon import _Limited

    lines = []
    limited = _Limited(lines.append, burst=2, period=0.2)
    for k in range(5):
        limited(f"bad {k}")
    assert lines == ["bad 0", "bad 1"]
    limited.flush()
    assert lines == ["bad 0", "bad 1"]       # the period is not over yet
    time.sleep(0.25)
    limited.flush()
    assert lines == ["bad 0", "bad 1", "(3 more such lines held back)"]
    limited.flush()
    assert len(lines) == 3


def test_port_gives_the_daemon_three_ports_and_auto_free_ones():
    """`make train` beside another run stopped on a taken port, with no way but editing RUN/config.toml."""
    from trainer.config import load_named_config
    from trainer.endpoints import on_ports

    config = load_named_config("cpu")
    d = on_ports(config, "5790").daemon
    assert (d.endpoint, d.publish, d.fetch) == ("tcp://127.0.0.1:5790", "tcp://127.0.0.1:5791", "tcp://127.0.0.1:5792")
    d = on_ports(config.replace(daemon={"endpoint": "tcp://0.0.0.0:5780"}), "auto").daemon
    assert (d.endpoint, d.publish, d.fetch) == ("tcp://0.0.0.0:*", "tcp://127.0.0.1:*", "tcp://127.0.0.1:*")
    for bad in ("57x", "0", "65534"):
        with pytest.raises(ValueError, match="--port"):
            on_ports(config, bad)


# --------------------------------------------------------------------------- flow control


def test_the_live_workers_share_the_credit_and_a_worker_that_spent_it_is_answered_at_once(run_dir, monkeypatch):
    """Flow control: IN_FLIGHT_GAMES is shared by the live workers (a new one is counted at once), each
    ack carries the credit, and when a worker has as many games buffered as its credit the daemon
    stores them at the end of that read instead of waiting for flush_s or flush_games (it would idle
    the worker); fewer wait. The daemon's loop is driven by hand here, so nothing depends on speed."""
    from trainer import ingest as ingest_module

    monkeypatch.setattr(ingest_module, "IN_FLIGHT_GAMES", 4)
    daemon = Daemon(run_dir, config(), log=lambda line: None, worker_command=lambda *args: SLEEP,
                    learner_command=lambda *args: SLEEP, ladder_command=lambda *args: SLEEP)
    daemon.start()

    def receive():
        assert daemon._ingest.router.poll(10_000)
        daemon._ingest.receive()

    try:
        with Client(daemon.endpoint) as a, Client(daemon.endpoint) as b:
            a.send(wire.Register("w-a", "testhost", os.getpid(), ("cpu",), "cyzero test"))
            receive()
            assert a.expect(wire.Registered).credit == 4       # alone: the whole budget
            b.send(wire.Register("w-b", "testhost", os.getpid(), ("cpu",), "cyzero test"))
            receive()
            assert b.expect(wire.Registered).credit == 2       # two live workers: half each
            waiting = game(worker="w-b")
            b.send(waiting)
            receive()
            assert b.recv(0.3) is None and stored_ids(run_dir) == []   # 1 of 2: it waits for more
            spent = [game(worker="w-a") for _ in range(2)]
            for g in spent:
                a.send(g)
            acked: set[str] = set()
            while len(acked) < 2:
                receive()
                message = a.recv(0.2)
                if isinstance(message, wire.Ack):
                    assert message.credit == 2
                    acked.update(message.game_ids)
            assert acked == {g.game_id for g in spent}
            assert sorted(stored_ids(run_dir)) == sorted([waiting.game_id, *acked])  # one chunk: b's too
            assert b.expect(wire.Ack).game_ids == (waiting.game_id,)
    finally:
        daemon.stop()


def test_the_daemon_says_when_it_is_at_capacity_and_when_it_keeps_up_again(run_dir):
    """Said once each way, with a band between (busy 70-90% says nothing new), and only per window."""
    lines: list[str] = []
    daemon = Daemon(run_dir, config(), log=lines.append)
    load = daemon._ingest.load

    def window(busy_share: float, games: int) -> None:
        now = time.monotonic()
        load.since, load.busy = now - ingest_module.LOAD_WINDOW_S, busy_share * ingest_module.LOAD_WINDOW_S
        daemon._ingest.games_total += games
        daemon._ingest.note_load(now)

    from trainer import ingest as ingest_module

    window(0.5, 100)
    assert lines == []
    window(0.95, 10_000)
    assert "at capacity" in lines[-1] and "95%" in lines[-1] and "1,000 games/s" in lines[-1]
    assert "nothing is lost" in lines[-1]
    window(0.8, 10_000)
    window(0.95, 10_000)
    assert len(lines) == 1
    daemon._ingest.note_load(time.monotonic())  # within the window: nothing measured yet
    window(0.4, 5_000)
    assert len(lines) == 2 and "keeping up again" in lines[-1] and "500 games/s" in lines[-1]
