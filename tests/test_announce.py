"""engine.announce: the follower contract's messages, CurveZMQ key files and the daemon's Announcer."""

from __future__ import annotations

import os
import shutil

import msgpack
import pytest
import zmq
import zmq.auth

from engine.announce import (
    FETCH_CREDIT,
    FETCH_PIECE_BYTES,
    FETCH_VERSION,
    TOPIC,
    AnnouncementError,
    Announcer,
    FetchError,
    FetchReply,
    FetchRequest,
    KeyFileError,
    NetworkAnnouncement,
    RangeFetch,
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
                      "sha256": "ab" * 32, "run": "r1", "fetch": "tcp://*:5558", "fetch_version": FETCH_VERSION}
    expected = NetworkAnnouncement(7, "/runs/r1/net-7.onnx", "ab" * 32, "r1", "tcp://*:5558", FETCH_VERSION)
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
    # A daemon from before fetches in pieces says no fetch_version: its fetch endpoint speaks version 1.
    del header["fetch_version"]
    assert decode_network_announcement([TOPIC, msgpack.packb(header)]).fetch_version == 1


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
    request = encode_fetch_request(3, "CD" * 32, 2 * FETCH_PIECE_BYTES, 1000)
    assert msgpack.unpackb(request[0]) == {"type": "fetch_network", "version": 2, "generation": 3,
                                           "sha256": "cd" * 32, "offset": 2 * FETCH_PIECE_BYTES, "length": 1000}
    assert decode_fetch_request(request) == FetchRequest(3, "cd" * 32, 2 * FETCH_PIECE_BYTES, 1000)
    piece = os.urandom(1000)
    reply = encode_fetch_reply(3, "cd" * 32, 5000, 4000, piece)
    assert len(reply) == 2 and bytes(reply[1]) == piece
    assert decode_fetch_reply(reply[0]) == FetchReply(3, "cd" * 32, size=5000, offset=4000, length=1000)
    assert decode_fetch_reply(encode_fetch_reply(3, "cd" * 32, 0, 0, b"")[0]).length == 0
    refusal = encode_fetch_refusal(3, "cd" * 32, "not offered", offset=7)
    assert len(refusal) == 1
    assert decode_fetch_reply(refusal[0]) == FetchReply(3, "cd" * 32, offset=7, refused="not offered")


def test_fetch_messages_refuse_garbage(tmp_path):
    good = {"type": "network_bytes", "version": 2, "generation": 3, "sha256": "c" * 64, "size": 10, "offset": 0,
            "length": 10}
    assert decode_fetch_reply(msgpack.packb(good)).length == 10
    for changes in ({"length": 11}, {"offset": 11}, {"offset": 5}, {"size": -1}, {"size": "10"},
                    {"length": True}, {"type": "fetch_network"}, {"version": 1}, {"sha256": "c" * 63},
                    {"offset": ...}, {"size": 2 * FETCH_PIECE_BYTES, "length": FETCH_PIECE_BYTES + 1}):
        header = {k: v for k, v in {**good, **changes}.items() if v is not ...}
        with pytest.raises(AnnouncementError):
            decode_fetch_reply(msgpack.packb(header))
    request = {"type": "fetch_network", "version": 2, "generation": 3, "sha256": "0" * 64, "offset": 0, "length": 1}
    for frames in ([], [b"\xc1"], encode_fetch_request(1, "0" * 64) * 2,
                   [msgpack.packb({**request, "generation": "3"})], [msgpack.packb({**request, "offset": -1})],
                   [msgpack.packb({k: v for k, v in request.items() if k != "length"})],
                   [msgpack.packb({**request, "version": 1})], encode_network_announcement(1, "/n.onnx", "0" * 64)[1:]):
        with pytest.raises(AnnouncementError):
            decode_fetch_request(frames)


def _serve(data: bytes, generation: int = 1):
    """A stand-in daemon for RangeFetch: the reply to a request's frames, from ``data``."""
    def reply(frames):
        r = decode_fetch_request(frames)
        return encode_fetch_reply(generation, sha(data), len(data), r.offset, data[r.offset:r.offset + r.length])
    return reply


def test_a_range_fetch_keeps_its_credit_asked_puts_pieces_in_order_and_asks_a_lost_one_again():
    data = os.urandom(10 * 1000 + 7)
    fetch = RangeFetch(1, sha(data), piece=1000, credit=3, piece_timeout=5.0)
    reply = _serve(data)
    first = fetch.requests(now=0.0)
    assert [decode_fetch_request(r).offset for r in first] == [0]  # the size comes with the first reply
    assert fetch.receive(reply(first[0])) == [data[:1000]] and fetch.size == len(data)
    asked = fetch.requests(now=0.0)
    assert [decode_fetch_request(r).offset for r in asked] == [1000, 2000, 3000]
    assert fetch.requests(now=1.0) == []  # the credit is out
    # 1000 is lost on the way; 2000 and 3000 come and wait, and hold their credit, until it does
    assert fetch.receive(reply(asked[1])) == [] and fetch.receive(reply(asked[2])) == []
    assert fetch.requests(now=4.9) == []
    (again,) = fetch.requests(now=5.0)
    assert decode_fetch_request(again).offset == 1000 and fetch.asked_again == 1
    assert fetch.receive(reply(again)) == [data[1000:2000], data[2000:3000], data[3000:4000]]
    assert fetch.receive(reply(again)) == []  # the first ask's reply, late: a duplicate
    pieces = [data[:4000]]
    while not fetch.done:
        for request in fetch.requests(now=6.0):
            pieces += fetch.receive(reply(request))
    assert b"".join(bytes(p) for p in pieces) == data and fetch.received == len(data)
    fetch.verify()


def test_a_range_fetch_of_an_empty_network():
    fetch = RangeFetch(1, sha(b""))
    (request,) = fetch.requests(0.0)
    assert fetch.receive(_serve(b"")(request)) == [b""] and fetch.done and fetch.requests(0.0) == []
    fetch.verify()


@pytest.mark.parametrize("case, says", [
    ("corrupted piece", "the bytes fetched from the daemon have sha256"),
    ("refused", "the daemon refused to send it: generation 1 with that sha256 is not offered"),
    ("another generation", "the daemon answered for generation 9, not 1"),
    ("short piece", "carries 999 bytes at 0 where its header says 1000"),
    ("more than allowed", "the daemon offers 10000 bytes, more than 5000"),
    ("garbled", "malformed reply from the daemon"),
])
def test_a_range_fetch_says_clearly_why_it_cannot_go_on(case, says):
    data = os.urandom(10_000)
    fetch = RangeFetch(1, sha(data), piece=1000, max_bytes=5000 if case == "more than allowed" else 10_000)

    def reply(frames):
        r = decode_fetch_request(frames)
        piece = data[r.offset:r.offset + r.length]
        if case == "corrupted piece" and r.offset == 3000:
            piece = piece[:10] + bytes([piece[10] ^ 1]) + piece[11:]
        if case == "short piece":
            return [encode_fetch_reply(1, sha(data), len(data), r.offset, piece)[0], piece[:-1]]
        if case == "refused":
            return encode_fetch_refusal(1, sha(data), "generation 1 with that sha256 is not offered", r.offset)
        if case == "another generation":
            return encode_fetch_reply(9, sha(data), len(data), r.offset, piece)
        if case == "garbled":
            return [b"\xc1", piece]
        return encode_fetch_reply(1, sha(data), len(data), r.offset, piece)

    with pytest.raises(FetchError, match=says):
        while not fetch.done:
            for request in fetch.requests(0.0):
                fetch.receive(reply(request))
        fetch.verify()


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


def _dealer(context, endpoint):
    dealer = context.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(endpoint)
    return dealer


def _ask(dealer, frames):
    """One request and its reply: (header, the piece's bytes)."""
    dealer.send_multipart(frames)
    assert dealer.poll(WAIT * 1000), "no reply"
    reply = dealer.recv_multipart()
    return decode_fetch_reply(reply[0]), b"".join(reply[1:])


def _fetch_all(dealer, fetch):
    """Drive a RangeFetch over ``dealer`` to its end; its bytes."""
    pieces = []
    while not fetch.done:
        for request in fetch.requests(0.0):
            dealer.send_multipart(request)
        assert dealer.poll(WAIT * 1000), "no reply"
        pieces += fetch.receive(dealer.recv_multipart())
    fetch.verify()
    return b"".join(bytes(p) for p in pieces)


def test_the_announcer_serves_the_current_network_in_pieces_and_refuses_clearly(tmp_path):
    data = os.urandom(2 * FETCH_PIECE_BYTES + 123)
    net = tmp_path / "net-2.onnx"
    net.write_bytes(data)
    lines = []
    context = zmq.Context()
    with Announcer("tcp://127.0.0.1:*", fetch_endpoint="tcp://127.0.0.1:*", interval=0.1, context=context,
                   log=lines.append) as announcer:
        assert announcer.fetch_endpoint.startswith("tcp://127.0.0.1:")
        announcer.announce(2, net, sha(data))
        dealer = _dealer(context, announcer.fetch_endpoint)
        dealer.send_multipart([b"\xc1"])  # garbage: dropped with a line, no reply
        header, piece = _ask(dealer, encode_fetch_request(2, sha(data), 2 * FETCH_PIECE_BYTES, FETCH_PIECE_BYTES))
        assert header == FetchReply(2, sha(data), len(data), 2 * FETCH_PIECE_BYTES, 123) and piece == data[-123:]
        assert lines == ["dropped a malformed fetch request: header is not valid msgpack (FormatError)"]
        assert _fetch_all(dealer, RangeFetch(2, sha(data))) == data
        # a bad range: refused, saying so
        for offset, length in ((len(data) + 1, 10), (0, 0), (0, FETCH_PIECE_BYTES + 1)):
            header, _ = _ask(dealer, encode_fetch_request(2, sha(data), offset, length))
            assert header.refused.startswith(f"bad range: {length} bytes at {offset} of a file of {len(data)} bytes")
        header, _ = _ask(dealer, encode_fetch_request(1, sha(data)))
        assert header.refused == "generation 1 with that sha256 is not offered (offered: generation 2)"
        # a file renamed over or removed after its first piece is still served as announced
        net.unlink()
        header, piece = _ask(dealer, encode_fetch_request(2, sha(data), 0, 10))
        assert header.refused is None and piece == data[:10]
        # superseded half-way: the rest of generation 2 is refused, naming the one offered now
        announcer.announce(3, tmp_path / "gone.onnx", sha(A))
        header, _ = _ask(dealer, encode_fetch_request(2, sha(data), FETCH_PIECE_BYTES, FETCH_PIECE_BYTES))
        assert header.refused == "generation 2 with that sha256 is not offered (offered: generation 3)"
        assert header.offset == FETCH_PIECE_BYTES
        # a file that is gone before its first piece
        header, _ = _ask(dealer, encode_fetch_request(3, sha(A)))
        assert header.refused.startswith(f"cannot serve {tmp_path / 'gone.onnx'}: ")
        dealer.close(0)
    context.term()


def test_a_follower_of_fetch_version_1_is_refused_in_its_own_version_not_left_waiting(tmp_path):
    net = tmp_path / "net-2.onnx"
    net.write_bytes(A)
    context = zmq.Context()
    with Announcer("tcp://127.0.0.1:*", fetch_endpoint="tcp://127.0.0.1:*", context=context) as announcer:
        announcer.announce(2, net, sha(A))
        dealer = _dealer(context, announcer.fetch_endpoint)
        old = msgpack.packb({"type": "fetch_network", "version": 1, "generation": 2, "sha256": sha(A)})
        dealer.send_multipart([old])
        assert dealer.poll(WAIT * 1000), "no reply"
        (reply,) = dealer.recv_multipart()
        header = msgpack.unpackb(reply)
        assert header["type"] == "fetch_refused" and header["version"] == 1  # what a version-1 follower reads
        assert header["reason"].startswith("this daemon serves fetches in pieces (fetch version 2), not version 1")
        dealer.close(0)
    context.term()


def test_a_follower_that_stops_asking_holds_up_no_other(tmp_path):
    data = os.urandom(6 * FETCH_PIECE_BYTES + 5)
    net = tmp_path / "net-1.onnx"
    net.write_bytes(data)
    context = zmq.Context()
    with Announcer("tcp://127.0.0.1:*", fetch_endpoint="tcp://127.0.0.1:*", context=context) as announcer:
        announcer.announce(1, net, sha(data))
        stalled, other = _dealer(context, announcer.fetch_endpoint), _dealer(context, announcer.fetch_endpoint)
        slow = RangeFetch(1, sha(data))
        for request in slow.requests(0.0):
            stalled.send_multipart(request)
        assert stalled.poll(WAIT * 1000)
        got = slow.receive(stalled.recv_multipart())
        for request in slow.requests(0.0):  # its credit asked, then it reads nothing more
            stalled.send_multipart(request)
        assert len(slow._asked) == FETCH_CREDIT
        assert _fetch_all(other, RangeFetch(1, sha(data))) == data  # the other gets all of it meanwhile
        # and the stalled one, when it goes on, finishes where it was
        while not slow.done:
            assert stalled.poll(WAIT * 1000)
            got += slow.receive(stalled.recv_multipart())
            for request in slow.requests(0.0):
                stalled.send_multipart(request)
        slow.verify()
        assert b"".join(bytes(p) for p in got) == data
        stalled.close(0)
        other.close(0)
    context.term()


def test_the_announcer_announces_a_wildcard_fetch_endpoint_with_a_star():
    context = zmq.Context()
    with Announcer("tcp://127.0.0.1:*", fetch_endpoint="tcp://0.0.0.0:*", context=context) as announcer:
        assert announcer.fetch_endpoint.startswith("tcp://*:")
    context.term()
