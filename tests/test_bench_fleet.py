"""trainer.bench_fleet: a small simulated fleet against the real daemon loses nothing, and the simulated
workers honour each reply as trainer.worker does. No speed assertions: the figures belong in the
benchmark's report, and this machine is shared."""

from __future__ import annotations

import collections
import hashlib
import json
import os
import time

import pytest
import zmq

from trainer import wire
from trainer.atomic import read_jsonl
from trainer.bench_fleet import BENCH_CONFIG, _Fleet, bench_fleet, format_fleet_report, game_frames, template_games

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def torch_installed():
    pytest.importorskip("torch", reason="the daemon makes generation 0 with torch (pip install 'cyzero[train]')")


def test_a_small_fleet_loses_nothing_and_every_follower_verifies_the_new_network(tmp_path, torch_installed):
    run = tmp_path / "run"
    lines: list[str] = []
    result = bench_fleet(run_dir=str(run), workers=8, rate=20.0, seconds=4.0, followers=8, network_mb=2.0,
                         log=lines.append)
    figures = result.figures
    assert result.ok and figures["problems"] == [], figures["problems"]
    ingest = figures["ingest"]
    assert result.acked_ids and ingest["acked"] == len(result.acked_ids) == ingest["made"] == ingest["sent"]
    assert ingest["unacked_at_end"] == 0 and ingest["refused"] == 0 and ingest["unhandled"] == {}
    # acknowledged equals stored, read here from the store's manifest: each acknowledged id exactly once
    stored = collections.Counter(i for r in read_jsonl(run / "replay" / "manifest.jsonl") if r.get("op") == "add"
                                 for i in r.get("game_ids", []))
    assert set(stored) == set(result.acked_ids) and set(stored.values()) == {1}
    assert figures["store"]["games"] == len(result.acked_ids) and figures["store"]["every_acked_stored_once"]
    # the bench's generation, as the learner writes one: its file holds the bytes its line's sha256 names,
    # and every follower fetched and verified exactly those
    made = [r for r in read_jsonl(run / "generations.jsonl") if r.get("synthetic")]
    assert len(made) == 1
    data = (run / made[0]["onnx"]).read_bytes()
    assert len(data) == 2_000_000 and hashlib.sha256(data).hexdigest() == made[0]["sha256"]
    rows = {row["generation"]: row for row in figures["followers"]["generations"]}
    assert rows[made[0]["generation"]]["verified"] == 8 and rows[made[0]["generation"]]["failed"] == 0
    assert rows[made[0]["generation"]]["bytes"] == len(data)
    assert figures["followers"]["every_follower_swapped"]
    assert figures["daemon"]["stopped"] is True
    assert json.loads(json.dumps(figures)) == figures
    assert "every acknowledged game stored once: yes" in format_fleet_report(figures)
    assert any("wrote generation" in line for line in lines)
    # the run is the bench's: it runs on it again, and on no folder it did not make
    assert (run / BENCH_CONFIG).is_file()
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "config.toml").write_text("")
    with pytest.raises(ValueError, match="not a run this bench made"):
        bench_fleet(run_dir=str(tmp_path / "other"), workers=1, rate=1.0, seconds=1.0)


@pytest.mark.parametrize("kwargs, message", [
    ({"workers": 0, "followers": 0}, "nothing to simulate"),
    ({"workers": -1}, "--workers must be a whole number >= 0"),
    ({"rate": 0.0}, "--rate must be more than 0"),
    ({"positions_per_game": 500}, "--positions-per-game must be at most 200"),
    ({"seconds": float("inf")}, "--seconds"),
    ({"followers": 2, "network_mb": 2000.0}, "at most the 1,074 MB a fetch accepts"),
    ({"followers": 10_000, "network_mb": 1000.0}, "use fewer --followers"),
    ({"attach": True, "profile": "daemon.prof"}, "--attach uses the one serving the run"),
])
def test_bad_arguments_are_refused_in_one_line_before_anything_starts(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        bench_fleet(run_dir=str(tmp_path / "run"), **kwargs)
    assert not (tmp_path / "run").exists()


def test_template_games_are_wire_games_in_the_input_format_asked_for():
    templates = template_games(input_format=3, positions=10, count=4)
    assert [len(t.records) for t in templates] == sorted(len(t.records) for t in templates)
    assert 8 <= sum(len(t.records) for t in templates) / 4 <= 12
    game = wire.decode(game_frames(templates[0], "w-1", "a" * 32, 7))
    assert isinstance(game, wire.Game) and game.game_id == "a" * 32 and game.generation == 7
    assert game.member == templates[0].member and game.records.tobytes() == templates[0].records.tobytes()
    assert set(game.records["input_format"].tolist()) == {3}
    assert '[GameId "' + "a" * 32 + '"]' in game.pgn and '[Generation "7"]' in game.pgn


def _keep_going(now: float) -> bool:
    return True


def _exchange(fleet, router, kind: type, count: int) -> list[tuple[bytes, object]]:
    """Let the fleet run until the fake daemon has the next ``count`` messages of type ``kind``; them and
    their senders (heartbeats and the like in between are passed over)."""
    out: list[tuple[bytes, object]] = []
    deadline = time.monotonic() + 30.0
    while len(out) < count:
        assert time.monotonic() < deadline, f"got {len(out)} of {count} {kind.__name__} messages"
        fleet.serve(time.monotonic() + 0.1, schedule=False, tick=_keep_going)
        while router.poll(0):
            frames = router.recv_multipart()
            message = wire.decode(frames[1:])
            if isinstance(message, kind):
                out.append((frames[0], message))
    return out


def test_the_simulated_workers_honour_each_reply_and_count_one_they_have_no_handler_for():
    """Ack: forgotten; ErrorReply: kept for its resend; Refused: dropped; Hold: kept, and nothing sent
    for the time asked; Stop: no more games; a reply type without a handler (a Heartbeat stands in
    for a new one) is counted by name."""
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    fleet = _Fleet(f"tcp://127.0.0.1:{port}", 2, rate=4.0, templates=template_games(positions=3, count=2),
                   keys=None, generation=lambda: 0)
    try:
        for identity, _ in _exchange(fleet, router, wire.Register, 2):
            router.send_multipart([identity, *wire.encode(wire.Registered("run"))])
        fleet.register(30.0, _keep_going)
        fleet.t0 = time.monotonic() - 1.0
        fleet._send_due(fleet.t0 + 1.0)  # games due at 0, 0.25, ..., 1 s: five, dealt in turn to the two workers
        assert fleet.issued == fleet.made == 5 and fleet.held_total == 5
        games = _exchange(fleet, router, wire.Game, 5)
        (acked_to, acked), (error_to, error), (refused_to, refused) = games[:3]
        router.send_multipart([acked_to, *wire.encode(wire.Ack((acked.game_id,)))])
        router.send_multipart([error_to, *wire.encode(wire.ErrorReply("disk full", error.game_id))])
        router.send_multipart([error_to, *wire.encode(wire.Hold(60.0, "behind", (error.game_id,)))])
        router.send_multipart([refused_to, *wire.encode(wire.Refused("bad records", refused.game_id))])
        router.send_multipart([acked_to, *wire.encode(wire.Heartbeat("daemon", 0, 0.0, 0))])
        router.send_multipart([acked_to, b"not msgpack"])
        router.send_multipart([acked_to, *wire.encode(wire.Stop("stopping"))])
        deadline = time.monotonic() + 30.0
        while not (fleet.stops and fleet.errors and fleet.refused and fleet.holds) and time.monotonic() < deadline:
            fleet.serve(time.monotonic() + 0.2, schedule=False, tick=_keep_going)
        assert fleet.acked_ids == {acked.game_id}
        assert fleet.errors == ["disk full"] and fleet.refused == ["bad records"]
        held = {game_id for w in fleet.workers for game_id in w.held}
        assert error.game_id in held and refused.game_id not in held and fleet.held_total == 3
        assert fleet.unhandled == {"Heartbeat": 1} and fleet.malformed == 1 and fleet.stops == 1
        (holding,) = [w for w in fleet.workers if w.held.get(error.game_id)]
        assert fleet.holds == ["behind"] and holding.hold_until >= time.monotonic() + 50
        assert holding.held[error.game_id].next_send == holding.hold_until
        stopped = [w for w in fleet.workers if w.stopped]
        assert len(stopped) == 1
        fleet._send_due(fleet.t0 + 2.0)  # four more: the stopped worker's two are not made
        assert fleet.issued == 9 and fleet.unsendable == 2 and fleet.made == 7
        if holding is not stopped[0]:  # the holding worker's new games are kept, not sent
            assert sum(h.first_sent is None for h in holding.held.values()) == 2
    finally:
        fleet.close()
        router.close(0)
        ctx.term()
