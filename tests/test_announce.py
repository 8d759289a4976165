"""engine.announce: the follower contract's messages, CurveZMQ key files and the daemon's Announcer."""

from __future__ import annotations

import os
import shutil

import msgpack
import pytest
import zmq
import zmq.auth

from engine.announce import (
    FETCH_CHUNK_BYTES,
    TOPIC,
    AnnouncementError,
    Announcer,
    FetchReply,
    FetchRequest,
    KeyFileError,
    NetworkAnnouncement,
    decode_fetch_reply,
    decode_fetch_request,
    decode_network_announcement,
    encode_fetch_refusal,
    encode_fetch_reply,
    encode_fetch_request,
    encode_network_announcement,
    load_client_keys,
    load_server_keys,
)
from weights_helpers import WAIT, A, Evil, garbage_messages, sha

# --------------------------------------------------------------------------- announcements


def test_announcement_round_trip():
    digest = "AB" * 32
    frames = encode_network_announcement(7, "/runs/r1/net-7.onnx", digest, run="r1", fetch="tcp://*:5558")
    assert frames[0] == TOPIC and len(frames) == 2
    header = msgpack.unpackb(frames[1])
    assert header == {"type": "network", "version": 1, "generation": 7, "path": "/runs/r1/net-7.onnx",
                      "sha256": "ab" * 32, "run": "r1", "fetch": "tcp://*:5558"}
    expected = NetworkAnnouncement(7, "/runs/r1/net-7.onnx", "ab" * 32, "r1", "tcp://*:5558")
    assert decode_network_announcement(frames) == expected
    # zmq.Frame objects, memoryviews and bytearrays are frames too; run and fetch are optional.
    assert decode_network_announcement([zmq.Frame(frames[0]), memoryview(frames[1])]) == expected
    plain = encode_network_announcement(0, "/n.onnx", "0" * 64)
    assert msgpack.unpackb(plain[1]).keys() == {"type", "version", "generation", "path", "sha256"}
    decoded = decode_network_announcement([bytearray(f) for f in plain])
    assert decoded.run is None and decoded.fetch is None
    # Unknown header keys are room for later fields.
    header["later"] = [1, 2]
    assert decode_network_announcement([TOPIC, msgpack.packb(header)]) == expected


@pytest.mark.parametrize("args", [
    (-1, "/n.onnx", "0" * 64), (True, "/n.onnx", "0" * 64), (1.0, "/n.onnx", "0" * 64),
    (1, "n.onnx", "0" * 64), (1, "", "0" * 64), (1, "/n.onnx", "0" * 63), (1, "/n.onnx", "g" * 64),
    (1, "/n.onnx", None), (1, "/a\x00b", "0" * 64), (1, "/n.onnx", "0" * 64, "r" * 300),
    (1, "/n.onnx", "0" * 64, None, "localhost:5558"),
])
def test_encode_refuses_bad_fields(args):
    with pytest.raises(AnnouncementError):
        encode_network_announcement(*args)


def test_decode_refuses_garbage(tmp_path):
    for frames in garbage_messages(tmp_path):
        with pytest.raises(AnnouncementError):
            decode_network_announcement(frames)
    for bad in (None, 5, [TOPIC, 5], [TOPIC, "text"], [TOPIC, msgpack.packb({1: 2})],
                [TOPIC, b"\x91" * 5000], [TOPIC, b"\xda" + b"\xff" * 10], [TOPIC, b"x" * 70000]):
        with pytest.raises(AnnouncementError):
            decode_network_announcement(bad)
    assert not os.path.exists(Evil.marker)


# --------------------------------------------------------------------------- fetch messages


def test_fetch_messages_round_trip():
    request = encode_fetch_request(3, "CD" * 32)
    assert msgpack.unpackb(request[0]) == {"type": "fetch_network", "version": 1, "generation": 3,
                                           "sha256": "cd" * 32}
    assert decode_fetch_request(request) == FetchRequest(3, "cd" * 32)
    data = os.urandom(FETCH_CHUNK_BYTES + 10)
    reply = encode_fetch_reply(3, "cd" * 32, data)
    assert len(reply) == 3 and b"".join(bytes(f) for f in reply[1:]) == data
    assert decode_fetch_reply(reply[0]) == FetchReply(3, "cd" * 32, len(data), 2)
    assert decode_fetch_reply(encode_fetch_reply(3, "cd" * 32, b"")[0]).chunks == 0
    refusal = encode_fetch_refusal(3, "cd" * 32, "not offered")
    assert len(refusal) == 1 and decode_fetch_reply(refusal[0]) == FetchReply(3, "cd" * 32, refused="not offered")


def test_fetch_messages_refuse_garbage(tmp_path):
    good = {"type": "network_bytes", "version": 1, "generation": 3, "sha256": "c" * 64, "size": 10, "chunks": 1}
    for changes in ({"chunks": 2}, {"size": -1}, {"size": "10"}, {"chunks": True}, {"type": "fetch_network"},
                    {"version": 2}, {"sha256": "c" * 63}, {"size": ...}):
        header = {k: v for k, v in {**good, **changes}.items() if v is not ...}
        with pytest.raises(AnnouncementError):
            decode_fetch_reply(msgpack.packb(header))
    for frames in ([], [b"\xc1"], encode_fetch_request(1, "0" * 64) * 2, [msgpack.packb({**good, "type": "fetch_network", "generation": "3"})],
                   encode_network_announcement(1, "/n.onnx", "0" * 64)[1:]):
        with pytest.raises(AnnouncementError):
            decode_fetch_request(frames)


# --------------------------------------------------------------------------- keys


@pytest.fixture(scope="module")
def certificates(tmp_path_factory):
    """``server.key``/``server.key_secret`` and ``client.key``/``client.key_secret`` in one folder."""
    folder = tmp_path_factory.mktemp("certificates")
    zmq.auth.create_certificates(str(folder), "server")
    zmq.auth.create_certificates(str(folder), "client")
    return folder


def test_client_keys_from_a_directory(certificates, tmp_path):
    keys = load_client_keys(str(certificates))
    server_public, _ = zmq.auth.load_certificate(str(certificates / "server.key"))
    public, secret = zmq.auth.load_certificate(str(certificates / "client.key_secret"))
    assert (keys.server_public, keys.public, keys.secret) == (server_public, public, secret)
    assert load_server_keys(certificates / "server.key_secret") == zmq.auth.load_certificate(
        str(certificates / "server.key_secret"))
    # A key pair under another name is found when it is the only one.
    other = tmp_path / "keys"
    other.mkdir()
    shutil.copy(certificates / "server.key", other)
    shutil.copy(certificates / "client.key_secret", other / "engine-7.key_secret")
    assert load_client_keys(other) == keys


def test_bad_or_missing_key_files_are_named(certificates, tmp_path):
    keys = tmp_path / "keys"
    keys.mkdir()
    with pytest.raises(KeyFileError, match=f"not found: {keys / 'server.key'}"):
        load_client_keys(keys)
    shutil.copy(certificates / "server.key", keys)
    with pytest.raises(KeyFileError, match=f"not found: {keys / 'client.key_secret'}"):
        load_client_keys(keys)
    (keys / "client.key_secret").write_bytes(os.urandom(300))
    with pytest.raises(KeyFileError, match=f"unreadable CurveZMQ key file {keys / 'client.key_secret'}"):
        load_client_keys(keys)
    (keys / "client.key_secret").write_text('curve\n    public-key = "abc"\n    secret-key = "def"\n')
    with pytest.raises(KeyFileError, match="client.key_secret: the public key is not 40 z85"):
        load_client_keys(keys)
    shutil.copy(certificates / "client.key", keys / "client.key_secret")  # a public key in its place
    with pytest.raises(KeyFileError, match="client.key_secret holds no secret key"):
        load_client_keys(keys)
    with pytest.raises(KeyFileError, match="must name a directory"):
        load_client_keys(certificates / "server.key")


# --------------------------------------------------------------------------- the Announcer


def test_a_late_subscriber_hears_the_reannouncement():
    context = zmq.Context()
    with Announcer("tcp://127.0.0.1:*", interval=0.1, context=context) as announcer:
        announcer.announce(4, "/nets/net-4.onnx", sha(A), run="r1")  # nobody listens yet: dropped
        sub = context.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, TOPIC)
        sub.connect(announcer.endpoint)
        assert sub.poll(WAIT * 1000), "no re-announcement"
        assert decode_network_announcement(sub.recv_multipart()) == NetworkAnnouncement(
            4, "/nets/net-4.onnx", sha(A), "r1", None)
        announcer.announce(5, "/nets/net-5.onnx", sha(A))
        while decode_network_announcement(sub.recv_multipart()).generation != 5:
            pass
        sub.close(0)
    context.term()


def test_the_announcer_serves_only_the_current_network(tmp_path):
    net = tmp_path / "net-2.onnx"
    net.write_bytes(A)
    lines = []
    context = zmq.Context()
    with Announcer("tcp://127.0.0.1:*", fetch_endpoint="tcp://127.0.0.1:*", interval=0.1, context=context,
                   log=lines.append) as announcer:
        assert announcer.fetch_endpoint.startswith("tcp://127.0.0.1:")
        announcer.announce(2, net, sha(A))
        dealer = context.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(announcer.fetch_endpoint)

        def ask(frames):
            dealer.send_multipart(frames)
            assert dealer.poll(WAIT * 1000), "no reply"
            reply = dealer.recv_multipart()
            return decode_fetch_reply(reply[0]), b"".join(reply[1:])

        dealer.send_multipart([b"\xc1"])  # garbage: dropped with a line, no reply
        header, data = ask(encode_fetch_request(2, sha(A)))
        assert header == FetchReply(2, sha(A), len(A), 1) and data == A
        assert lines == ["dropped a malformed fetch request: header is not valid msgpack (FormatError)"]
        header, _ = ask(encode_fetch_request(1, sha(A)))
        assert header.refused == "generation 1 with that sha256 is not offered (offered: generation 2)"
        net.unlink()
        header, _ = ask(encode_fetch_request(2, sha(A)))
        assert header.refused.startswith(f"cannot serve {net}")
        dealer.close(0)
    context.term()


def test_the_announcer_announces_a_wildcard_fetch_endpoint_with_a_star():
    context = zmq.Context()
    with Announcer("tcp://127.0.0.1:*", fetch_endpoint="tcp://0.0.0.0:*", context=context) as announcer:
        assert announcer.fetch_endpoint.startswith("tcp://*:")
    context.term()
