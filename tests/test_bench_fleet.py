"""trainer.bench_fleet: a small simulated fleet against the real daemon loses nothing, and the simulated
workers honour each reply as trainer.worker does. No speed assertions: the figures belong in the
benchmark's report, and this machine is shared."""

from __future__ import annotations

import collections
import contextlib
import hashlib
import json
import os
import time

import pytest
import zmq

from engine.announce import fetch_memory_bound
from trainer import wire
from trainer.atomic import read_jsonl
from trainer.bench_fleet import bench_fleet, format_fleet_report
from trainer.fleet_daemon import BENCH_CONFIG
from trainer.fleet_workers import Fleet, game_frames, template_games

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


def test_eight_followers_fetch_a_50_mb_network_and_the_daemon_holds_no_more_than_the_bound(torch_installed):
    """The daemon reads each piece from the file when it is asked: its resident memory grows by less than
    engine.announce.fetch_memory_bound(8) while 8 followers fetch 50 MB (with the old whole-file replies it
    grew by about a copy of the file a follower). Its peak (VmHWM, reset when the generation is first heard)
    less its resident memory then; no timing is asserted."""
    result = bench_fleet(workers=0, followers=8, network_mb=50.0, seconds=2.0, log=lambda line: None)
    figures = result.figures
    assert result.ok and figures["problems"] == [], figures["problems"]
    followers = figures["followers"]
    (row,) = [row for row in followers["generations"] if row["bench_made"]]
    assert row["verified"] == 8 and row["failed"] == 0 and row["bytes"] == 50_000_000
    assert followers["every_follower_swapped"]
    assert followers["memory_bound_mb"] == fetch_memory_bound(8) / 1e6
    growth = row["daemon_growth_mb"]
    assert growth is not None and growth * 1e6 < fetch_memory_bound(8), (row, followers["memory_bound_mb"])
    assert "every follower verified and swapped: yes" in format_fleet_report(figures)


def test_a_daemon_killed_under_load_comes_back_and_every_game_acknowledged_before_is_stored_once(
        tmp_path, torch_installed):
    """SIGKILL in the middle of a small fleet's run: the daemon starts again on its ports, the workers
    (who kept their games) send them again, and every game acknowledged, before the kill or after, is
    in the store exactly once; games buffered but not stored at the kill are stored after. No timing
    is asserted, only that acks came back."""
    run = tmp_path / "run"
    lines: list[str] = []
    result = bench_fleet(run_dir=str(run), workers=8, rate=40.0, seconds=12.0, kill_at=4.0, log=lines.append)
    figures = result.figures
    assert result.ok and figures["problems"] == [], figures["problems"]
    restart = figures["restart"]
    assert restart["acked_before_kill"] > 0
    assert restart["acked_before_kill_stored"] == restart["acked_before_kill"]
    assert restart["restart_s"] is not None and restart["first_ack_after_s"] is not None
    ingest = figures["ingest"]
    assert ingest["acked"] == ingest["made"] == len(result.acked_ids) and ingest["unacked_at_end"] == 0
    stored = collections.Counter(i for r in read_jsonl(run / "replay" / "manifest.jsonl") if r.get("op") == "add"
                                 for i in r.get("game_ids", []))
    assert set(result.acked_ids) <= set(stored) and set(stored.values()) == {1}
    assert any("killed the daemon" in line for line in lines) and any("serves again" in line for line in lines)
    assert "in the store once" in format_fleet_report(figures)


@pytest.mark.parametrize("kwargs, message", [
    ({"workers": 0, "followers": 0}, "nothing to simulate"),
    ({"workers": -1}, "--workers must be a whole number >= 0"),
    ({"rate": 0.0}, "--rate must be more than 0"),
    ({"positions_per_game": 500}, "--positions-per-game must be at most 200"),
    ({"seconds": float("inf")}, "--seconds"),
    ({"followers": 2, "network_mb": 2000.0}, "at most the 1,074 MB a fetch accepts"),
    ({"followers": 100_000, "network_mb": 1000.0}, "use fewer --followers"),
    ({"attach": True, "profile": "daemon.prof"}, "--attach uses the one serving the run"),
    ({"seconds": 10.0, "kill_at": 10.0}, "--kill-at must fall within the run"),
    ({"kill_at": 5.0, "followers": 2}, "--kill-at kills the daemon the bench starts"),
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


@contextlib.contextmanager
def _registered_fleet(workers: int, credit: int):
    """``workers`` simulated workers, registered with ``credit`` by a ROUTER of the test's, whose
    schedule started a second ago: (fleet, router)."""
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    fleet = Fleet(f"tcp://127.0.0.1:{port}", workers, rate=4.0, templates=template_games(positions=3, count=2),
                  keys=None, generation=lambda: 0)
    try:
        for identity, _ in _exchange(fleet, router, wire.Register, workers):
            router.send_multipart([identity, *wire.encode(wire.Registered("run", credit=credit))])
        fleet.register(30.0, _keep_going)
        fleet.t0 = time.monotonic() - 1.0
        yield fleet, router
    finally:
        fleet.close()
        router.close(0)
        ctx.term()


def test_the_simulated_workers_honour_each_reply_and_count_one_they_have_no_handler_for():
    """Ack: forgotten; ErrorReply: kept for its resend; Refused: dropped; Stop: no more games; a reply
    type without a handler (a Heartbeat stands in for a new one) is counted by name."""
    with _registered_fleet(2, credit=8) as (fleet, router):
        fleet._send_due(fleet.t0 + 1.0)  # games due at 0, 0.25, ..., 1 s: five, dealt in turn to the two workers
        assert fleet.issued == fleet.made == 5 and fleet.held_total == 5
        games = _exchange(fleet, router, wire.Game, 5)
        (acked_to, acked), (error_to, error), (refused_to, refused) = games[:3]
        router.send_multipart([acked_to, *wire.encode(wire.Ack((acked.game_id,), 8))])
        router.send_multipart([error_to, *wire.encode(wire.ErrorReply("disk full", error.game_id))])
        router.send_multipart([refused_to, *wire.encode(wire.Refused("bad records", refused.game_id))])
        router.send_multipart([acked_to, *wire.encode(wire.Heartbeat("daemon", 0, 0.0, 0))])
        router.send_multipart([acked_to, b"not msgpack"])
        router.send_multipart([acked_to, *wire.encode(wire.Stop("stopping"))])
        deadline = time.monotonic() + 30.0
        while not (fleet.stops and fleet.errors and fleet.refused) and time.monotonic() < deadline:
            fleet.serve(time.monotonic() + 0.2, schedule=False, tick=_keep_going)
        assert fleet.acked_ids == {acked.game_id}
        assert fleet.errors == ["disk full"] and fleet.refused == ["bad records"]
        held = {game_id for w in fleet.workers for game_id in w.held}
        assert error.game_id in held and refused.game_id not in held and fleet.held_total == 3
        assert fleet.unhandled == {"Heartbeat": 1} and fleet.malformed == 1 and fleet.stops == 1
        (keeping,) = [w for w in fleet.workers if w.held.get(error.game_id)]
        assert keeping.held[error.game_id].next_send > time.monotonic()  # kept for its resend, due later
        stopped = [w for w in fleet.workers if w.stopped]
        assert len(stopped) == 1
        fleet._send_due(fleet.t0 + 2.0)  # four more: the stopped worker's two are not made
        assert fleet.issued == 9 and fleet.unsendable == 2 and fleet.made == 7


def test_the_simulated_workers_send_no_more_than_their_credit():
    """As trainer.worker: a worker with credit 1 has one game in flight and keeps the others; an ack
    that grants 2 lets two go."""
    with _registered_fleet(1, credit=1) as (fleet, router):
        fleet._send_due(fleet.t0 + 1.0)  # five games for the one worker
        (worker,) = fleet.workers
        ((identity, first),) = _exchange(fleet, router, wire.Game, 1)
        fleet.serve(time.monotonic() + 0.5, schedule=False, tick=_keep_going)
        assert not router.poll(0) and worker.in_flight == 1 and len(worker.waiting) == 4
        router.send_multipart([identity, *wire.encode(wire.Ack((first.game_id,), 2))])
        games = _exchange(fleet, router, wire.Game, 2)
        fleet.serve(time.monotonic() + 0.5, schedule=False, tick=_keep_going)
        assert not router.poll(0) and worker.in_flight == 2 and len(worker.waiting) == 2
        assert first.game_id not in {g.game_id for _, g in games} and fleet.credit_waits == 4
