"""The engine says nothing between commands, and ``isready`` answers ``readyok`` alone.

UCI lets an engine write only in answer to a command, and a search's output (up
to its ``bestmove``) is the one answer with room for remarks. What a load at
``isready``, a background reload, its refusal or a watcher has to say waits for
the next search's output (``uci.session.Floor``), in order, once. python-chess
read a line said between its commands, or before ``readyok`` (``ping()``), as
"Unexpected engine output".

No test here asserts how long anything took: a test that waits for silence waits
:data:`QUIET_S`, ample for the background work it starts (the refusal of a
missing file: milliseconds), and then reads on.
"""

from __future__ import annotations

import logging
import threading
import time

import chess
import chess.engine
import pytest

from test_uci_harness import PROMPT_S, REPO, SessionOutput, UciEngine, engine_command, info_strings

# How long to listen for a line the engine should not write: the harness's "at once".
QUIET_S = PROMPT_S
# Seconds to wait for an answer before calling it a hang (not a latency bound).
DEADLINE_S = 60.0


# --------------------------------------------------------------------------- the floor


def test_lines_said_between_answers_open_the_next_answer_in_order_once():
    from uci.session import Floor

    out: list[str] = []
    floor = Floor(out.append)
    floor.say("a")
    floor.say("b")
    assert out == []
    search = floor.open()
    assert out == ["a", "b"]
    floor.say("c")                      # during an answer: at once
    ponder = floor.open()               # a second answer that overlaps the first
    floor.close(ponder, "bestmove d2d4")
    floor.say("d")                      # the first still answers
    floor.close(search, "bestmove e2e4")
    floor.close(search, "bestmove e2e4 again")   # a second close ends nothing more
    floor.say("e")
    assert out == ["a", "b", "c", "bestmove d2d4", "d", "bestmove e2e4", "bestmove e2e4 again"]
    floor.close(floor.open(), "bestmove g1f3")
    assert out[-2:] == ["e", "bestmove g1f3"]


def test_a_line_said_while_an_answer_closes_waits_for_the_next_one():
    """A line said from another thread as the bestmove is written is never written after it: it is
    held for the next answer."""
    from uci.session import Floor

    out: list[str] = []
    sayers: list[threading.Thread] = []

    def write(line: str) -> None:
        out.append(line)
        if line.startswith("bestmove"):
            sayer = threading.Thread(target=floor.say, args=("news",))
            sayers.append(sayer)
            sayer.start()
            sayer.join(0.2)          # time for it to write, if the floor let it

    floor = Floor(write)
    floor.close(floor.open(), "bestmove e2e4")
    sayers[0].join()
    assert out == ["bestmove e2e4"]
    floor.close(floor.open(), "readyok")
    assert out == ["bestmove e2e4", "news", "readyok"]


def test_a_long_silence_keeps_the_newest_lines_and_counts_the_rest():
    from uci import session

    out: list[str] = []
    floor = session.Floor(out.append)
    for n in range(session._HELD_LINES + 3):
        floor.say(f"info string {n}")
    floor.open()
    assert out[0] == "info string 3 older lines said between commands were dropped"
    assert out[1:] == [f"info string {n}" for n in range(3, session._HELD_LINES + 3)]


# --------------------------------------------------------------------------- the session


def _refusal(line: str, missing) -> bool:
    return line.startswith("info string ") and str(missing) in line and "keeping network" in line


def test_a_reload_refused_while_idle_waits_for_the_next_search(tmp_path):
    """A WeightsFile that cannot be loaded is refused on the loader thread; the session waits for
    that (NetworkManager.wait_reloaded), so the silence asserted here is no matter of speed."""
    from uci.session import Session

    out = SessionOutput(DEADLINE_S)
    session = Session(out)
    try:
        session.handle("setoption name Backend value cpu")
        session.handle("isready")
        assert out.lines == ["readyok"], out.lines             # the load's line waits for the search
        session.handle("position startpos")
        session.handle("go nodes 5")
        out.wait_bestmove()
        assert "loaded network" in out.lines[1], out.lines
        out.lines.clear()

        missing = tmp_path / "missing.onnx"
        session.handle(f"setoption name WeightsFile value {missing}")
        assert session.manager.wait_reloaded(DEADLINE_S)
        assert out.lines == [], "said between commands"
        session.handle("isready")
        assert out.lines == ["readyok"], out.lines
        session.handle("go nodes 5")
        out.wait_bestmove()
        assert _refusal(out.lines[1], missing), out.lines      # before the search's first info line
        assert len([line for line in out.lines if "keeping network" in line]) == 1, out.lines
        out.lines.clear()
        session.handle("isready")
        session.handle("go nodes 5")
        out.wait_bestmove()
        assert out.lines[0] == "readyok" and not [line for line in out.lines if "keeping" in line]  # said once
        out.lines.clear()

        # During a search the engine may speak: a refusal goes out at once.
        session.handle("go infinite")
        third = tmp_path / "third.onnx"
        session.handle(f"setoption name WeightsFile value {third}")
        assert session.manager.wait_reloaded(DEADLINE_S)
        assert [line for line in out.lines if _refusal(line, third)], out.lines
        assert not [line for line in out.lines if line.startswith("bestmove")], out.lines
        session.handle("stop")
        out.wait_bestmove()
    finally:
        session.quit()


# --------------------------------------------------------------------------- the engine


def _silent(eng: UciEngine) -> None:
    stray = eng.pending(wait=QUIET_S)
    assert stray == [], f"the idle engine wrote {stray}"


def test_an_idle_engine_says_a_network_change_in_the_next_search(tmp_path):
    """The issue's session, on pipes: a network option changed while idle (a Threads change is built
    again on the loader thread; a WeightsFile that is not there is refused there) writes nothing;
    isready answers readyok alone; the next search's output opens with both, the refusal first."""
    missing = tmp_path / "missing.onnx"
    with UciEngine(options={"Threads": 1}) as eng:
        eng.send("position startpos")
        eng.go("nodes 10", DEADLINE_S)
        eng.setoption("Threads", 2)
        _silent(eng)
        eng.setoption("WeightsFile", str(missing))
        _silent(eng)
        assert eng.isready(DEADLINE_S) == []
        lines, best = eng.go("nodes 10", DEADLINE_S)
        said = info_strings(lines)
        assert len(said) == 2 and lines[:2] == said and _refusal(said[0], missing), lines
        assert said[1].startswith("info string switched to network "), said
        assert best.split()[1] != "0000"
        lines, best = eng.go("nodes 10", DEADLINE_S)
        assert not info_strings(lines), lines


def test_an_idle_engine_says_a_refusal_first_in_the_next_search(tmp_path):
    missing = tmp_path / "missing.onnx"
    with UciEngine() as eng:
        eng.send("position startpos")
        eng.go("nodes 10", DEADLINE_S)
        eng.setoption("WeightsFile", str(missing))
        _silent(eng)
        lines, best = eng.go("nodes 10", DEADLINE_S)
        assert _refusal(lines[0], missing) and info_strings(lines) == lines[:1], lines
        assert best.split()[1] != "0000"
        assert eng.isready(DEADLINE_S) == []


# --------------------------------------------------------------------------- python-chess


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def heard_since(self, count: int) -> bool:
        return any(": >> " in record.getMessage() for record in self.records[count:])


@pytest.fixture
def chess_engine_log():
    """Every record of the 'chess.engine' logger (its debug records are each line sent, ``<<``,
    and received, ``>>``)."""
    handler = _Records()
    logger = logging.getLogger("chess.engine")
    level = logger.level
    logger.setLevel(logging.DEBUG)
    logger.addHandler(handler)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(level)


def _idle_wait(log: _Records) -> None:
    """Give the engine QUIET_S to say what it should not, and stop listening at its first line."""
    count = len(log.records)
    deadline = time.monotonic() + QUIET_S
    while time.monotonic() < deadline and not log.heard_since(count):
        time.sleep(0.05)


def _between_commands(messages: list[str]) -> list[str]:
    """Lines received after an answer ended (uciok, readyok, bestmove) and before the command that
    allows the next one (uci, isready, go) was sent."""
    stray, idle = [], False
    for message in messages:
        if ": << " in message:
            idle = idle and message.split(": << ", 1)[1].split()[0] not in ("uci", "isready", "go")
        elif ": >> " in message:
            line = message.split(": >> ", 1)[1]
            if idle:
                stray.append(line)
            idle = line.split()[0] in ("uciok", "readyok", "bestmove")
    return stray


def test_python_chess_configure_then_play_and_analyse_hears_nothing_between_commands(tmp_path, chess_engine_log):
    """configure while the engine is idle, ping, then play and analyse: the network rebuilt for the
    new Threads and the refusal of a missing WeightsFile are said within the searches' output."""
    missing = tmp_path / "missing.onnx"
    engine = chess.engine.SimpleEngine.popen_uci(engine_command(), cwd=REPO, timeout=DEADLINE_S)
    try:
        engine.configure({"Backend": "cpu", "Threads": 1})
        board = chess.Board()
        engine.play(board, chess.engine.Limit(nodes=10), game="quiet")   # loads the network
        engine.configure({"Threads": 2})
        engine.ping()                     # waits for the rebuilt network: readyok alone
        _idle_wait(chess_engine_log)
        engine.play(board, chess.engine.Limit(nodes=10), game="quiet")
        engine.configure({"WeightsFile": str(missing)})
        _idle_wait(chess_engine_log)
        engine.ping()
        engine.analyse(board, chess.engine.Limit(nodes=10), game="quiet")
    finally:
        engine.quit()
    messages = [record.getMessage() for record in chess_engine_log.records]
    warnings = [record.getMessage() for record in chess_engine_log.records if record.levelno >= logging.WARNING]
    assert not warnings
    assert _between_commands(messages) == []
    said = [message.split(": >> ", 1)[1] for message in messages if ": >> info string" in message]
    assert len([line for line in said if line.startswith("info string switched to network")]) == 1, said
    assert len([line for line in said if _refusal(line, missing)]) == 1, said
