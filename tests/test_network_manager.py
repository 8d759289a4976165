"""engine.network_manager as the UCI session uses it: a WeightsFile that cannot be loaded, no network
at all, and a TrainerEndpoint (with TrainerKeys) that is followed, silent, or refused.

These drive :class:`uci.session.Session` in-process (Backend cpu) and read
the lines it writes.
"""

from __future__ import annotations

import os
import threading
import time

import chess
import pytest

from engine import watchers
from engine.announce import Announcer
from uci.session import Session
from weights_helpers import FAST, WAIT, B, bundled, bundled_size, curve_daemon, sha  # noqa: F401 - a fixture

CPU_DEFAULT_SHA = sha(bundled("default.int8.onnx"))   # the bundled network's CPU variant (engine.weights)


class Engine:
    """A session with its output lines; ``send`` returns the lines up to ``readyok`` or ``bestmove``."""

    def __init__(self, **options) -> None:
        self.lines: list[str] = []
        self._lock = threading.Lock()
        self.session = Session(self._write)
        for name, value in {"Backend": "cpu", "Threads": 1, "MinibatchSize": 16, **options}.items():
            self.session.handle(f"setoption name {name} value {value}")

    def _write(self, line: str) -> None:
        with self._lock:
            self.lines.append(line)

    def send(self, command: str, until: str = "readyok", timeout: float = 60.0) -> list[str]:
        with self._lock:
            start = len(self.lines)
        self.session.handle(command)
        if until == "readyok" and command != "isready":
            self.session.handle("isready")
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                got = self.lines[start:]
            if any(line.startswith(until) for line in got):
                return got
            if time.monotonic() > deadline:
                raise AssertionError(f"no {until!r} within {timeout}s after {command!r}: {got}")
            time.sleep(0.01)

    def info_strings(self, lines: list[str]) -> list[str]:
        return [line[len("info string "):] for line in lines if line.startswith("info string ")]

    def remarks(self) -> list[str]:
        """What the engine had to say since its last search: it says it as a search's output begins
        (uci.session.Floor), so a one-node search reads it."""
        self.session.handle("position startpos")
        return self.info_strings(self.send("go nodes 1", until="bestmove"))

    def close(self) -> None:
        self.session.close()


@pytest.fixture
def eng():
    eng = Engine()
    yield eng
    eng.close()


def searched_legal_move(lines: list[str]) -> str:
    assert any(line.startswith("info depth") for line in lines), lines
    move = lines[-1].split()[1]
    assert chess.Move.from_uci(move) in chess.Board().legal_moves, lines
    return move


@pytest.mark.parametrize("junk", ["missing", "truncated"])
def test_a_broken_weights_file_keeps_the_network_that_was_loaded(tmp_path, eng, junk):
    assert eng.send("isready") == ["readyok"]      # loads the network, and says so at the search
    assert eng.remarks() == [f"loaded network default.int8.onnx sha256:{CPU_DEFAULT_SHA[:12]} CPU int8 "
                             f"{bundled_size()}, float32 io"]
    path = tmp_path / "net.onnx"
    if junk == "truncated":
        path.write_bytes(B[: len(B) // 3])
        reason = f"WeightsFile {path}: not an ONNX model, or a truncated or corrupt one (protobuf parsing failed)"
    else:
        reason = f"WeightsFile not found: {path}"
    assert eng.send(f"setoption name WeightsFile value {path}") == ["readyok"]
    eng.send("position startpos")
    lines = eng.send("go nodes 30", until="bestmove")
    assert lines[0] == f"info string {reason}; keeping network default.int8.onnx (sha256 {CPU_DEFAULT_SHA[:12]}...)"
    assert not [line for line in lines if "error" in line] and searched_legal_move(lines)
    assert eng.send("isready") == ["readyok"] and eng.remarks() == []  # said once


def test_without_any_network_isready_says_so(tmp_path):
    missing = tmp_path / "missing.onnx"
    eng = Engine(WeightsFile=missing)
    try:
        error = f"info string error: no network loaded: WeightsFile not found: {missing}"
        assert eng.send("isready") == [error, "readyok"]
        assert eng.send("isready") == [error, "readyok"]
        missing.write_bytes(B)  # once the file is there, it is used
        assert eng.send("isready") == ["readyok"]
        assert eng.remarks()[0].startswith("loaded network missing.onnx")
    finally:
        eng.close()


def test_without_any_network_every_go_says_so_and_plays_no_move(tmp_path):
    missing = tmp_path / "missing.onnx"
    eng = Engine(WeightsFile=missing)
    try:
        error = f"info string error: no network loaded: WeightsFile not found: {missing}"
        for _ in range(2):
            assert eng.send("go nodes 10", until="bestmove") == [error, "bestmove 0000"]
        missing.write_bytes(B)  # once the file is there, the next go uses it
        lines = eng.send("go nodes 10", until="bestmove")
        assert eng.info_strings(lines)[0].startswith("loaded network missing.onnx") and searched_legal_move(lines)
    finally:
        eng.close()


def test_a_trainer_endpoint_where_nothing_listens_is_reported(eng, monkeypatch):
    """Said as the first search after the silence begins, never between commands."""
    monkeypatch.setattr(watchers, "SILENCE_S", 0.3)
    assert eng.send("setoption name TrainerEndpoint value tcp://127.0.0.1:9") == ["readyok"]
    deadline = time.monotonic() + WAIT
    while not [line for line in eng.remarks() if "no network announcement" in line]:
        assert time.monotonic() < deadline, eng.lines
        time.sleep(0.05)
        assert eng.lines[-1].startswith("bestmove"), eng.lines[-3:]   # nothing said after the search
    said = [line for line in eng.lines if "no network announcement" in line]
    assert said == ["info string no network announcement from TrainerEndpoint tcp://127.0.0.1:9 within 0.3 s: "
                    "is a training daemon publishing there, and does it require CurveZMQ keys (set TrainerKeys)?"]


def test_each_swap_from_the_daemon_is_reported(tmp_path, eng):
    gen1 = tmp_path / "gen1.onnx"
    gen1.write_bytes(B)
    with Announcer("tcp://127.0.0.1:*", interval=FAST) as daemon:
        daemon.announce(1, gen1, sha(B), run="r7")
        eng.send(f"setoption name TrainerEndpoint value {daemon.endpoint}")
        switched: list[str] = []
        deadline = time.monotonic() + WAIT
        while not switched:
            assert time.monotonic() < deadline, eng.lines
            switched = [line for line in eng.remarks() if "switched to network" in line]
            time.sleep(0.05)
        assert switched == [f"switched to network gen1.onnx sha256:{sha(B)[:12]} CPU fp32 "
                            f"{bundled_size()}, "
                            f"float32 io, generation 1, run r7; search cache cleared"]


def test_trainer_keys_over_uci(tmp_path, curve_daemon):
    context, server_keys, engine_keys, _ = curve_daemon
    gen1 = tmp_path / "gen1.onnx"
    gen1.write_bytes(B)
    with Announcer("tcp://127.0.0.1:*", interval=FAST, server_keys=server_keys, context=context) as daemon:
        daemon.announce(1, gen1, sha(B))
        # Keys that cannot be read: said as the next search begins, naming the file; the engine still plays.
        bad = Engine(TrainerKeys=tmp_path, TrainerEndpoint=daemon.endpoint)
        try:
            assert bad.send("isready") == ["readyok"]
            assert f"error: CurveZMQ key file not found: {tmp_path / 'server.key'}; " \
                   f"not following TrainerEndpoint" in bad.remarks()
            assert bad.session.manager.endpoint is None
        finally:
            bad.close()
        good = Engine(TrainerKeys=engine_keys, TrainerEndpoint=daemon.endpoint)
        try:
            said = good.remarks()
            deadline = time.monotonic() + WAIT
            while not any("generation 1" in line for line in said):
                assert time.monotonic() < deadline, said
                said += good.remarks()
                time.sleep(0.05)
        finally:
            good.close()


def test_new_settings_rebuild_a_trainers_generation_as_that_generation(tmp_path):
    """Threads changed while a trainer's network is in use: the reload builds that network again
    (its local file, its generation and run kept), not the WeightsFile; settings that build the
    same network (GPU on the CPU) reload nothing."""
    from weights_helpers import CountingLoader, make_manager

    gen = tmp_path / "gen4.onnx"
    gen.write_bytes(B)
    loader = CountingLoader()
    from engine.weights import default_weights_path

    int8 = os.path.join(os.path.dirname(default_weights_path()), "default.int8.onnx")
    manager = make_manager(int8, lambda line: None, loader=loader, watch=False)
    try:
        manager.get()
        candidate = manager.swap._build(str(gen), sha(B), generation=4, run="r9", reported_path="/far/gen4.onnx")
        manager.swap._offer(candidate)
        assert manager.apply_pending() and manager.generation == 4
        assert not manager.reconfigure(manager.path, backend="cpu", device_id=3, threads=1,
                                       network_options=manager._builder.options)     # GPU on the CPU
        assert manager.reconfigure(manager.path, backend="cpu", device_id=0, threads=2,
                                   network_options=manager._builder.options)
        assert manager.wait_reloaded(WAIT) and manager.apply_pending()
        assert (manager.generation, manager.in_use.run, manager.network_path) == (4, "r9", "/far/gen4.onnx")
        assert loader.calls[-1][0] == str(gen) and manager.get().intra_threads == 2
    finally:
        manager.close()
