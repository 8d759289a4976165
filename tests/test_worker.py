"""The self-play worker (trainer/worker.py) against a fake daemon in this process: a ROUTER for the
protocol and an engine.announce.Announcer for the networks; tiny 1x8 networks, tiny games."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Callable, Optional

import chess
import chess.pgn
import numpy as np
import pytest
import zmq

from engine.announce import Announcer, load_server_keys
from engine.files import sha256_file
from trainer import wire, worker as worker_module
from trainer.config import SelfPlayConfig
from trainer.records import check_records
from trainer.selfplay import SelfPlay, SelfPlaySettings, settings_from_config
from trainer.worker import Worker

pytestmark = pytest.mark.timeout(120)

# Tiny games: the resign keys left out (wire.Registered carries only non-negative numbers).
TINY = {"visits": 8, "fast_visits": 2, "max_plies": 20, "full_search_prob": 0.5, "resign": False,
        "temp_cutoff_ply": 4, "opening_plies": 2}
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def nets(tmp_path_factory):
    """Two tiny generations (gen 0, gen 1) and a truncated copy of gen 1, with their sha256."""
    from trainer.export import export_onnx
    from trainer.model import build_net

    folder = tmp_path_factory.mktemp("nets")
    out = {}
    for generation in (0, 1):
        path = str(folder / f"gen-{generation:05d}.onnx")
        export_onnx(build_net("1x8", seed=generation + 1), path, check_positions=8)
        out[generation] = (path, sha256_file(path))
    bad = str(folder / "bad" / "gen-00001.onnx")
    os.makedirs(os.path.dirname(bad))
    with open(out[1][0], "rb") as f:
        data = f.read()
    with open(bad, "wb") as f:
        f.write(data[: len(data) // 2])
    out["truncated"] = (bad, out[1][1])  # the announced sha256 is the whole file's
    return out


@pytest.fixture(autouse=True)
def quick(monkeypatch):
    """Resend and say-waiting sooner than in a real run, so the tests see them quickly."""
    monkeypatch.setattr(worker_module, "RESEND_S", 1.0)
    monkeypatch.setattr(worker_module, "HEARTBEAT_S", 0.5)
    monkeypatch.setattr(worker_module, "WAITING_SAY_S", 1.0)
    monkeypatch.setattr(worker_module, "STOP_WAIT_S", 3.0)


class FakeDaemon:
    """A ROUTER (the protocol) and an Announcer (the networks), driven from the test's thread."""

    def __init__(self, registered: dict, keys_dir: Optional[str] = None) -> None:
        self.context = zmq.Context()
        self.auth = None
        server_keys = None
        if keys_dir:
            from zmq.auth.thread import ThreadAuthenticator

            self.auth = ThreadAuthenticator(self.context)
            self.auth.start()
            self.auth.configure_curve(domain="*", location=os.path.join(keys_dir, "authorized"))
            server_keys = load_server_keys(os.path.join(keys_dir, "server", "server.key_secret"))
        self.router = self.context.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        if server_keys:
            self.router.curve_server = True
            self.router.curve_publickey, self.router.curve_secretkey = server_keys
        self.router.bind("tcp://127.0.0.1:*")
        self.endpoint = self.router.getsockopt_string(zmq.LAST_ENDPOINT)
        self.announcer = Announcer("tcp://127.0.0.1:*", fetch_endpoint="tcp://127.0.0.1:*", interval=0.3,
                                   server_keys=server_keys, context=self.context)
        port = self.announcer.endpoint.rpartition(":")[2]
        self.credit = 64       # each game may be sent at once, unless a test grants less
        self.registered = dict(run="test-run", publish=f"tcp://*:{port}", selfplay=TINY, **registered)
        self.messages: list[tuple[bytes, wire.Message]] = []
        self.identity: Optional[bytes] = None
        self.ack = True        # ack each game at once
        self.refuse: set[str] = set()

    def restart(self) -> None:
        """A new ROUTER on the same endpoint (a daemon restarted): it knows nobody."""
        self.router.close(0)
        self.router = self.context.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        deadline = time.monotonic() + 10.0
        while True:  # ZeroMQ closes the old listener in the background: the port is free a moment later
            try:
                self.router.bind(self.endpoint)
                break
            except zmq.ZMQError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        self.identity = None

    def send(self, message: wire.Message) -> None:
        assert self.identity is not None
        self.router.send_multipart([self.identity, *wire.encode(message)])

    def games(self) -> list[wire.Game]:
        return [m for _, m in self.messages if isinstance(m, wire.Game)]

    def serve(self, until: Callable[[], bool], timeout: float = 30.0) -> None:
        """Answer messages (Registered, acks) until ``until()`` holds; fails after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while not until():
            assert time.monotonic() < deadline, f"timed out; got {[type(m).__name__ for _, m in self.messages]}"
            if not self.router.poll(50):
                continue
            identity, *frames = self.router.recv_multipart()
            message = wire.decode(frames)  # the worker sends only valid messages
            self.identity = identity
            self.messages.append((identity, message))
            if isinstance(message, wire.Register):
                self.send(wire.Registered(**{"credit": self.credit, **self.registered}))
            elif isinstance(message, wire.Game):
                if message.game_id in self.refuse:
                    self.send(wire.Refused("bad game", message.game_id))
                elif self.ack:
                    self.send(wire.Ack((message.game_id,), self.credit))

    def close(self) -> None:
        self.announcer.close()
        self.router.close(0)
        if self.auth is not None:
            self.auth.stop()
        self.context.term()


class Running:
    """A Worker on a thread of this process, its log lines kept."""

    def __init__(self, daemon: FakeDaemon, **options) -> None:
        self.lines: list[str] = []
        self.stop = threading.Event()
        options = {"name": "w1", "games": 4, "threads": 1, **options}
        self.worker = Worker(daemon.endpoint, log=self.lines.append, stop=self.stop, **options)
        self.result: list = []
        self.thread = threading.Thread(target=lambda: self.result.append(self.worker.run()), daemon=True)
        self.thread.start()

    def said(self, text: str) -> bool:
        return any(text in line for line in list(self.lines))

    def join(self, timeout: float = 30.0) -> int:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the worker did not stop"
        return self.result[0]


@pytest.fixture
def daemon_factory():
    made: list[FakeDaemon] = []
    running: list[Running] = []

    def make(registered: dict, keys_dir: Optional[str] = None) -> FakeDaemon:
        made.append(FakeDaemon(registered, keys_dir))
        return made[-1]

    def start(daemon: FakeDaemon, **options) -> Running:
        running.append(Running(daemon, **options))
        return running[-1]

    yield make, start
    for r in running:
        r.stop.set()
    for d in made:
        d.ack, d.refuse = True, set()
        try:
            d.serve(lambda: not any(r.thread.is_alive() for r in running), timeout=20)
        except AssertionError:
            pass  # the test itself has failed already
    for d in made:
        d.close()


def current(nets, generation=0) -> dict:
    path, sha = nets[generation]
    return {"generation": generation, "path": path, "sha256": sha}


def pgn_generations(game: wire.Game) -> str:
    parsed = chess.pgn.read_game(io.StringIO(game.pgn))
    assert parsed is not None and not parsed.errors
    return parsed.headers["Generation"]


# --------------------------------------------------------------------------- the protocol


def test_registers_plays_sends_valid_games_and_heartbeats(daemon_factory, nets):
    make, start = daemon_factory
    daemon = make(current(nets))
    running = start(daemon)
    daemon.serve(lambda: len(daemon.games()) >= 3
                 and any(isinstance(m, wire.Heartbeat) and m.playing == 4 for _, m in daemon.messages))
    register = daemon.messages[0][1]
    assert isinstance(register, wire.Register)
    assert register.worker == "w1" and register.devices == ("cpu",) and register.pid == os.getpid()
    assert register.software.startswith("cyzero ")
    for game in daemon.games():
        assert game.worker == "w1" and game.generation == 0 and game.result in wire.RESULTS
        check_records(game.records)
        assert len(game.records) >= 1
        parsed = chess.pgn.read_game(io.StringIO(game.pgn))
        assert parsed.headers["GameId"] == game.game_id and parsed.headers["Result"] == game.result
        assert len(list(parsed.mainline_moves())) <= TINY["max_plies"]
        results = game.records["result_q"]
        assert np.all(results == 0.0) if game.result == "1/2-1/2" else np.all(np.abs(results) == 1.0)
    beats = [m for _, m in daemon.messages if isinstance(m, wire.Heartbeat)]
    assert beats[-1].worker == "w1" and beats[-1].playing == 4 and beats[-1].generation == 0
    assert beats[-1].positions_per_s > 0
    assert len({g.game_id for g in daemon.games()}) == len(daemon.games())  # all acked: none resent
    assert running.said("registered with run test-run")
    assert all(line.startswith("worker w1: ") for line in running.lines)


def test_unacked_games_are_resent_with_the_same_id_refused_ones_dropped(daemon_factory, nets):
    make, start = daemon_factory
    daemon = make(current(nets))
    daemon.ack = False
    running = start(daemon)
    daemon.serve(lambda: len(daemon.games()) >= 2)
    first, second = daemon.games()[:2]
    daemon.refuse.add(second.game_id)
    # Resent (RESEND_S is 1 s here) with the same id and the same content; the refusal answers the resend.
    daemon.serve(lambda: sum(g.game_id == first.game_id for g in daemon.games()) >= 2
                 and running.said(f"refused game {second.game_id}"))
    again = [g for g in daemon.games() if g.game_id == first.game_id]
    assert again[1].pgn == again[0].pgn and again[1].records.tobytes() == again[0].records.tobytes()
    daemon.ack = True
    daemon.send(wire.Ack((first.game_id,), daemon.credit))
    mark = len(daemon.messages)
    daemon.serve(lambda: len([1 for _, m in daemon.messages[mark:] if isinstance(m, wire.Heartbeat)]) >= 6)
    later = [m.game_id for _, m in daemon.messages[mark:] if isinstance(m, wire.Game)]
    assert first.game_id not in later and second.game_id not in later
    assert running.worker.link.refused == 1


def test_keeps_working_through_a_daemon_restart(daemon_factory, nets):
    make, start = daemon_factory
    daemon = make(current(nets))
    daemon.ack = False
    start(daemon)
    daemon.serve(lambda: len(daemon.games()) >= 1)
    lost = daemon.games()[0].game_id
    daemon.restart()
    daemon.ack = True
    mark = len(daemon.messages)
    # The unacknowledged game reaches the new daemon (resent), and new games and heartbeats follow.
    daemon.serve(lambda: any(isinstance(m, wire.Game) and m.game_id == lost for _, m in daemon.messages[mark:])
                 and any(isinstance(m, wire.Game) and m.game_id != lost for _, m in daemon.messages[mark:])
                 and any(isinstance(m, wire.Heartbeat) for _, m in daemon.messages[mark:]))
    assert not any(isinstance(m, wire.Register) for _, m in daemon.messages[mark:])


def test_stop_resends_unacked_games_then_exits_zero(daemon_factory, nets):
    make, start = daemon_factory
    daemon = make(current(nets))
    daemon.ack = False
    running = start(daemon)
    daemon.serve(lambda: len(daemon.games()) >= 2)
    daemon.send(wire.Stop("test over"))
    daemon.ack = True
    mark = len(daemon.messages)
    unacked_before = {g.game_id for g in daemon.games()}
    daemon.serve(lambda: not running.thread.is_alive(), timeout=30)
    resent = {m.game_id for _, m in daemon.messages[mark:] if isinstance(m, wire.Game)}
    assert unacked_before <= resent
    assert running.join() == 0
    assert running.said("asks to stop: test over") and running.said("stopped")
    assert not running.said("not acknowledged")


def test_a_daemon_that_never_acks_pauses_self_play_at_the_bound_and_no_game_is_lost(daemon_factory, nets):
    """The memory bound: with no acks, the worker keeps at most max_unacked_games (plus one step's
    finished games), stops playing, says so once, keeps resending every game it holds, and goes on
    when acks come back."""
    make, start = daemon_factory
    daemon = make(current(nets))
    daemon.ack = False
    running = start(daemon, games=4, max_unacked_games=3)
    link = lambda: running.worker.link  # noqa: E731
    daemon.serve(lambda: running.said("self-play paused"), timeout=60)
    assert running.said("max_unacked_games 3") and running.said("no game is dropped")
    held = link().held_games
    assert 3 <= held <= 3 + 4 - 1  # checked before each step: one step may finish up to 4 games
    positions = running.worker.selfplay.positions
    mark = len(daemon.messages)
    # Several resend rounds (RESEND_S is 1 s here) later: no new game, no move played, memory unchanged.
    daemon.serve(lambda: len([1 for _, m in daemon.messages[mark:] if isinstance(m, wire.Heartbeat)]) >= 8)
    sent = {g.game_id for g in daemon.games()}
    resent = {m.game_id for _, m in daemon.messages[mark:] if isinstance(m, wire.Game)}
    assert len(sent) == held and resent == sent          # every held game still offered, none new
    assert link().held_games == held and len(link().unacked) == held
    assert running.worker.selfplay.positions == positions
    assert sum("self-play paused until" in line for line in running.lines) == 1
    # Acks come back: playing resumes, new games arrive.
    daemon.ack = True
    for game_id in sent:
        daemon.send(wire.Ack((game_id,), daemon.credit))
    daemon.serve(lambda: running.said("self-play resumed") and len({g.game_id for g in daemon.games()}) > held)


def test_the_worker_has_no_more_games_in_flight_than_its_credit(daemon_factory, nets):
    """Flow control: with credit 2 and no acks, two games are sent (and resent) and the others wait on
    the worker; an ack that grants 3 lets exactly as many more go as the credit then allows."""
    make, start = daemon_factory
    daemon = make(current(nets))
    daemon.ack, daemon.credit = False, 2
    running = start(daemon, games=4)
    link = lambda: running.worker.link  # noqa: E731
    daemon.serve(lambda: link() is not None and len(link().unacked) >= 4)
    mark = len(daemon.messages)
    daemon.serve(lambda: len([1 for _, m in daemon.messages[mark:] if isinstance(m, wire.Heartbeat)]) >= 4)
    sent = list(dict.fromkeys(g.game_id for g in daemon.games()))
    assert len(sent) == 2 and link().in_flight == 2 and link().credit == 2
    assert {m.game_id for _, m in daemon.messages[mark:] if isinstance(m, wire.Game)} <= set(sent)  # resends only
    daemon.send(wire.Ack((sent[0],), 3))
    daemon.serve(lambda: len(set(g.game_id for g in daemon.games())) >= 4)
    mark = len(daemon.messages)
    daemon.serve(lambda: len([1 for _, m in daemon.messages[mark:] if isinstance(m, wire.Heartbeat)]) >= 4)
    assert len(set(g.game_id for g in daemon.games())) == 4   # the acked one, and three in flight
    assert link().in_flight == 3 and link().credit == 3


def test_a_byte_bound_pauses_too_and_a_stop_says_what_was_not_acknowledged(daemon_factory, nets):
    make, start = daemon_factory
    daemon = make(current(nets))
    daemon.ack = False
    running = start(daemon, games=2, max_unacked_bytes=1)  # any one game fills it
    daemon.serve(lambda: running.said("self-play paused"), timeout=60)
    held = running.worker.link.held_games
    assert 1 <= held <= 2
    running.stop.set()
    daemon.serve(lambda: not running.thread.is_alive(), timeout=30)
    assert running.join() == 0
    assert running.said(f"stopped; {held} games were not acknowledged")  # said, never silent


def test_bad_bounds_are_refused():
    for bad in ({"max_unacked_games": 0}, {"max_unacked_bytes": -1}, {"max_unacked_games": 2.5}):
        with pytest.raises(ValueError, match="max_unacked_"):
            Worker("tcp://127.0.0.1:5780", **bad)


def test_new_generation_is_played_after_it_loads_and_games_go_on(daemon_factory, nets):
    make, start = daemon_factory
    daemon = make(current(nets))
    running = start(daemon)
    daemon.serve(lambda: len(daemon.games()) >= 1)
    path, sha = nets[1]
    daemon.announcer.announce(1, path, sha, run="test-run")
    daemon.serve(lambda: any(g.generation == 1 for g in daemon.games()))
    # Games under way at the switch finished with the new network: both generations in their PGN.
    daemon.serve(lambda: any(pgn_generations(g) == "0,1" for g in daemon.games()))
    beats = [m for _, m in daemon.messages if isinstance(m, wire.Heartbeat)]
    daemon.serve(lambda: len([m for _, m in daemon.messages if isinstance(m, wire.Heartbeat)]) > len(beats))
    assert [m for _, m in daemon.messages if isinstance(m, wire.Heartbeat)][-1].generation == 1
    assert running.said("switched to network")
    generations = [g.generation for g in daemon.games()]
    assert generations == sorted(generations)  # once switched, never back


def test_truncated_network_is_refused_and_the_old_one_kept(daemon_factory, nets):
    make, start = daemon_factory
    daemon = make(current(nets))
    running = start(daemon)
    daemon.serve(lambda: len(daemon.games()) >= 1)
    path, sha = nets["truncated"]
    daemon.announcer.announce(1, path, sha, run="test-run")
    daemon.serve(lambda: running.said("refused network"))
    mark = len(daemon.games())
    daemon.serve(lambda: len(daemon.games()) >= mark + 4)
    assert all(g.generation == 0 and pgn_generations(g) == "0" for g in daemon.games())
    assert running.worker.selfplay.generation == 0


def test_waits_for_the_announcement_when_the_path_is_not_readable_here(daemon_factory, nets):
    make, start = daemon_factory
    path, sha = nets[1]
    daemon = make({"generation": 1, "path": "/nonexistent/run/networks/gen-00001.onnx", "sha256": sha})
    start(daemon)
    daemon.announcer.announce(1, path, sha, run="test-run")
    daemon.serve(lambda: len(daemon.games()) >= 1)
    assert daemon.games()[0].generation == 1


def test_curve_keys(daemon_factory, nets, tmp_path):
    from trainer.keys import create_keys

    create_keys(tmp_path / "keys", ["w1"])
    create_keys(tmp_path / "other", ["w2"])  # a key pair this daemon does not admit
    make, start = daemon_factory
    daemon = make(current(nets), keys_dir=str(tmp_path / "keys"))
    outsider = start(daemon, name="w2", keys=str(tmp_path / "other" / "clients" / "w2"))
    running = start(daemon, keys=str(tmp_path / "keys" / "clients" / "w1"))
    daemon.serve(lambda: len(daemon.games()) >= 1 and outsider.said("waiting for the daemon at"))
    assert {m.worker for _, m in daemon.messages if isinstance(m, (wire.Register, wire.Game))} == {"w1"}
    assert running.said("registered with run test-run") and not outsider.said("registered")


def test_the_command_stops_cleanly_on_sigterm(daemon_factory, nets):
    """`cyzero-train worker` in a process of its own: plays, and SIGTERM makes it resend and exit 0."""
    make, _ = daemon_factory
    daemon = make(current(nets))
    daemon.ack = False
    env = dict(os.environ, PYTHONPATH=ROOT)
    process = subprocess.Popen([sys.executable, "-m", "trainer.cli", "worker", "--connect", daemon.endpoint,
                                "--name", "proc", "--games", "2", "--threads", "1"],
                               cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)
    try:
        daemon.serve(lambda: len(daemon.games()) >= 1, timeout=60)
        first = daemon.games()[0].game_id
        process.send_signal(signal.SIGTERM)
        daemon.ack = True
        daemon.serve(lambda: process.poll() is not None, timeout=30)
        assert sum(g.game_id == first for g in daemon.games()) >= 2  # resent on the way out
        assert process.wait() == 0
        err = process.stderr.read()
        assert "worker proc: stopped" in err and "Traceback" not in err
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


# --------------------------------------------------------------------------- settings and adjudication


def test_settings_from_config():
    settings = settings_from_config({"visits": 16, "resign": False, "games_per_worker": 8, "openings": "x.pgn",
                                     "syzygy": "/tables"}, openings=[chess.STARTING_FEN], seed=3)
    assert settings.visits == 16 and settings.resign_q is None and settings.seed == 3
    assert settings.opening_fens == (chess.STARTING_FEN,) and settings.fast_visits == 100
    assert settings_from_config({}).resign_q == pytest.approx(-0.9)
    assert settings_from_config(SelfPlayConfig(resign_q=-0.5)).resign_q == pytest.approx(-0.5)
    with pytest.raises(ValueError, match="selfplay.visits"):
        settings_from_config({"visits": 0})
    with pytest.raises(ValueError, match="selfplay.noise_alpah"):
        settings_from_config({"noise_alpah": 0.3})
    with pytest.raises(ValueError, match="not valid"):
        settings_from_config({}, openings=["not a fen"])


class FakeTables:
    """Tablebases that know every position of at most 3 pieces: the side to move loses."""

    max_pieces = 3

    def __init__(self, wdl: Optional[int] = -2) -> None:
        self.wdl = wdl
        self.probed: list[str] = []

    def root_moves(self, board):
        self.probed.append(board.fen())
        return None if self.wdl is None else (board.legal_moves(), self.wdl)


@pytest.mark.parametrize("wdl, result", [(-2, "1-0"), (0, "1/2-1/2"), (1, "1/2-1/2")])
def test_syzygy_adjudicates_a_position_in_the_tables(nets, wdl, result):
    from engine.network import Network

    tables = FakeTables(wdl)
    settings = SelfPlaySettings(visits=4, fast_visits=2, full_search_prob=1.0, resign_q=None, seed=1,
                                opening_fens=("8/8/8/4k3/8/8/3QK3/8 w - - 0 1",))
    selfplay = SelfPlay(Network(nets[0][0], backend="cpu"), settings, games=1, tablebases=tables)
    try:
        (game,) = selfplay.step()  # white's first move reaches the tables: black to move
    finally:
        selfplay.close()
    assert game.termination == "syzygy" and game.result == result and game.plies == 1
    assert len(tables.probed) == 1 and " b " in tables.probed[0]
    expected = 1.0 if result == "1-0" else 0.0
    assert game.records["result_q"].tolist() == [expected]  # white's record
    assert game.records["invariance_info"][0] & (1 << 5)  # adjudicated


def test_syzygy_leaves_positions_outside_the_tables_alone(nets):
    from engine.network import Network

    unknown = FakeTables(None)
    settings = SelfPlaySettings(visits=4, fast_visits=2, max_plies=6, resign_q=None, seed=2,
                                opening_fens=("8/8/8/4k3/8/8/3QK3/8 w - - 0 1",))
    selfplay = SelfPlay(Network(nets[0][0], backend="cpu"), settings, games=1, tablebases=unknown)
    try:
        games = []
        while not games:
            games = selfplay.step()
    finally:
        selfplay.close()
    assert games[0].termination != "syzygy" and unknown.probed
    big = FakeTables(-2)  # the start position has 32 pieces: never probed
    selfplay = SelfPlay(Network(nets[0][0], backend="cpu"), SelfPlaySettings(visits=2, fast_visits=2, seed=3),
                        games=1, tablebases=big)
    try:
        assert selfplay.step() == [] and big.probed == []
    finally:
        selfplay.close()


def test_real_syzygy_tables():
    folder = os.environ.get("CYZERO_SYZYGY")
    if not folder or not os.path.isdir(folder):
        pytest.skip("no Syzygy tables here (python-chess ships none); set CYZERO_SYZYGY to a folder with KQvK")
    from engine.board import Board
    from engine.book import Tablebases

    tables = Tablebases(folder)
    try:
        selfplay_end = SelfPlay.__dict__["_syzygy"]
        fake_self = type("S", (), {"tablebases": tables})()
        assert selfplay_end(fake_self, Board("8/8/8/4k3/8/8/3QK3/8 b - - 0 1")) == (True, "syzygy", True)  # black to move is lost
    finally:
        tables.close()


def test_several_devices_run_one_process_each(daemon_factory, nets):
    """`--devices cpu,cuda:0`: a subprocess per device, named NAME-cpu and NAME-cuda0 (without a GPU the
    cuda one falls back to the CPU with a line); SIGTERM to the parent stops both, exit 0."""
    make, _ = daemon_factory
    daemon = make(current(nets))
    env = dict(os.environ, PYTHONPATH=ROOT)
    process = subprocess.Popen([sys.executable, "-m", "trainer.cli", "worker", "--connect", daemon.endpoint,
                                "--devices", "cpu,cuda:0", "--name", "multi", "--games", "2", "--threads", "1"],
                               cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)
    try:
        daemon.serve(lambda: {g.worker for g in daemon.games()} == {"multi-cpu", "multi-cuda0"}, timeout=60)
        registers = {m.worker: m for _, m in daemon.messages if isinstance(m, wire.Register)}
        assert registers["multi-cuda0"].devices == ("cuda:0",) and registers["multi-cpu"].devices == ("cpu",)
        assert len({m.pid for m in registers.values()} | {process.pid}) == 3
        process.send_signal(signal.SIGTERM)
        daemon.serve(lambda: process.poll() is not None, timeout=30)
        assert process.wait() == 0
        err = process.stderr.read()
        assert "worker multi-cpu: stopped" in err and "worker multi-cuda0: stopped" in err, err
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_the_worker_says_when_the_daemon_is_gone_and_when_it_is_back(daemon_factory, nets):
    """Issue 54: an outage showed on neither side. The worker says when its heartbeat finds no
    connection, plays on, and says when the daemon answers again."""
    make, start = daemon_factory
    daemon = make(current(nets))
    worker = start(daemon)
    daemon.serve(lambda: any(isinstance(m, wire.Heartbeat) for _, m in daemon.messages))
    daemon.router.close(0)          # the daemon is gone
    deadline = time.monotonic() + 30
    while not worker.said("is unreachable since") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert worker.said(f"the daemon at {daemon.endpoint} is unreachable since"), worker.lines
    daemon.restart()
    mark = len(daemon.messages)
    daemon.serve(lambda: any(isinstance(m, wire.Heartbeat) for _, m in daemon.messages[mark:]))
    deadline = time.monotonic() + 30
    while not worker.said("is reachable again after") and time.monotonic() < deadline:
        daemon.serve(lambda: True)
        time.sleep(0.1)
    assert worker.said(f"the daemon at {daemon.endpoint} is reachable again after"), worker.lines


def test_a_workers_socket_calls_a_lost_daemon_again_at_its_own_pace_and_backs_off():
    """No thundering herd after a daemon's restart: each worker's first redial comes after its own
    random interval in RECONNECT_S, doubling up to RECONNECT_MAX_S (ZeroMQ's backoff)."""
    import random

    import zmq

    from trainer.worker import RECONNECT_MAX_S, RECONNECT_S, configure_dealer

    ctx = zmq.Context()
    try:
        intervals = set()
        for seed in range(8):
            sock = ctx.socket(zmq.DEALER)
            configure_dealer(sock, None, random.Random(seed))
            ivl = sock.getsockopt(zmq.RECONNECT_IVL)
            assert RECONNECT_S[0] * 1000 <= ivl <= RECONNECT_S[1] * 1000
            assert sock.getsockopt(zmq.RECONNECT_IVL_MAX) == RECONNECT_MAX_S * 1000
            assert sock.getsockopt(zmq.IMMEDIATE) == 1 and sock.getsockopt(zmq.LINGER) == 0
            intervals.add(ivl)
            sock.close(0)
        assert len(intervals) > 1   # spread, not one interval for the fleet
    finally:
        ctx.term()
