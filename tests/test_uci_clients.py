"""cyzero under the programs that drive UCI engines, and under hostile input.

* python-chess (``chess.engine.SimpleEngine.popen_uci``): analysis with MultiPV
  and WDL, play with clocks, pondering with hits and misses, Chess960 games;
  python-chess logs (or raises on) anything it cannot parse, and the tests
  fail on any such log record.
* Scripted replays of what cutechess-cli, fastchess and lichess-bot send
  (``tests/uci_scripts/*.txt``).
* Thousands of random and mutated lines to one process, which must keep
  answering.
* A network hot-swap during analysis; a truncated replacement is refused.
* A short match against Debian's Stockfish at its lowest strength: no
  illegal move, no crash.
* A Polyglot book and Syzygy paths.

No test here asserts how long anything took: the timeouts only catch a hang
(latencies are measured by ``cyzero bench uci``), and the clocks of the games
never flag anyone (see CLOCK_FLOOR).
"""

from __future__ import annotations

import logging
import os
import random
import re
import shutil
import struct
import sys
import time

import chess
import chess.engine
import chess.polyglot
import pytest

from test_uci_harness import (REPO, UciEngine, engine_command, info_strings, legal_bestmove,
                              parse_info, uci_moves)

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "uci_scripts")
STOCKFISH = shutil.which("stockfish") or ("/usr/games/stockfish" if os.path.exists("/usr/games/stockfish") else None)


# --------------------------------------------------------------------------- python-chess


@pytest.fixture
def popen(caplog):
    """Start cyzero under python-chess; fail the test on any warning python-chess logs about it."""
    caplog.set_level(logging.DEBUG, logger="chess.engine")
    engines = []

    def start(**options) -> chess.engine.SimpleEngine:
        engine = chess.engine.SimpleEngine.popen_uci(engine_command(), cwd=REPO, timeout=60)
        engines.append(engine)
        engine.configure({"Backend": "cpu", **options})
        return engine

    yield start
    for engine in engines:
        engine.quit()
    problems = [r.getMessage() for r in caplog.records
                if r.name.startswith("chess.engine") and r.levelno >= logging.WARNING]
    assert not problems, problems
    from_engine = [r.getMessage() for r in caplog.records if ": >> " in r.getMessage()]
    assert not [m for m in from_engine if "info string error" in m], from_engine


def sent_lines(caplog) -> list[str]:
    """What python-chess wrote to the engine (from its debug log)."""
    return [m.split(": << ", 1)[1] for m in (r.getMessage() for r in caplog.records) if ": << " in m]


def check_info_pv(board: chess.Board, info: dict) -> None:
    replay = board.copy()
    for move in info["pv"]:
        assert replay.is_legal(move), (board.fen(), info["pv"])
        replay.push(move)


def test_python_chess_analysis_with_multipv_and_wdl(popen):
    engine = popen(UCI_ShowWDL=True)
    board = chess.Board("r1bqkbnr/pppp1ppp/2n5/4p3/4P3/5N2/PPPP1PPP/RNBQKB1R w KQkq - 2 3")
    result = engine.analyse(board, chess.engine.Limit(nodes=300), multipv=3)
    assert [info["multipv"] for info in result] == [1, 2, 3]
    for info in result:
        assert isinstance(info["score"], chess.engine.PovScore) and info["score"].turn == board.turn
        assert info["wdl"].relative.total() == 1000
        assert info["depth"] >= 1 and info["nodes"] > 0
        check_info_pv(board, info)
    assert len({info["pv"][0] for info in result}) == 3

    # Streaming analysis: infinite until python-chess stops it.
    seen = 0
    started = time.monotonic()
    with engine.analysis(board, multipv=3) as analysis:
        for info in analysis:
            if "pv" in info:
                check_info_pv(board, info)
                assert "wdl" in info and "score" in info
                seen += 1
            if seen >= 6 or time.monotonic() - started > 3:
                break
    assert seen >= 3
    # With a limit the analysis ends by itself with a best move.
    with engine.analysis(board, chess.engine.Limit(nodes=100)) as analysis:
        best = analysis.wait()
    assert best.move in board.legal_moves


def test_python_chess_multipv_beyond_the_legal_moves(popen):
    engine = popen()
    board = chess.Board("7k/8/8/8/8/8/6q1/7K w - - 0 1")   # one legal move
    result = engine.analyse(board, chess.engine.Limit(nodes=50), multipv=5)
    assert [info["pv"][0] for info in result] == [chess.Move.from_uci("h1g2")]
    board = chess.Board(MIDDLEGAME_FEN)
    result = engine.analyse(board, chess.engine.Limit(nodes=200), multipv=4)
    assert [info["multipv"] for info in result] == [1, 2, 3, 4]
    for info in result:
        check_info_pv(board, info)


def test_python_chess_multipv_lines_are_searched_and_analysis_uses_its_time(popen):
    """The issue's analysis: at 4,000 nodes lines 2 and 3 were unvisited moves with the best
    line's score and a one-move pv, and analyse(Limit(time=2), multipv=3) stopped at 0.84 s. Now
    each line is searched (a pv of its own beyond its first move, a score of its own) and an
    analysis with MultiPV or UCI_AnalyseMode (python-chess sets it) searches its whole time."""
    engine = popen()
    for board in (chess.Board(), chess.Board("rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1")):
        result = engine.analyse(board, chess.engine.Limit(nodes=1500), multipv=3)
        assert [info["multipv"] for info in result] == [1, 2, 3]
        assert all(len(info["pv"]) > 1 for info in result), [info["pv"] for info in result]
        assert len({info["score"].relative.score(mate_score=100000) for info in result}) > 1, result
    result = engine.analyse(chess.Board(), chess.engine.Limit(time=1.0), multipv=3)
    assert result[0]["time"] >= 0.9, result[0]       # 1 s less Move Overhead and the safety margin
    result = engine.analyse(chess.Board(), chess.engine.Limit(time=1.0))   # UCI_AnalyseMode alone
    assert result["time"] >= 0.9, result


def test_python_chess_reads_the_weights_file_default_back(popen):
    """WeightsFile's default was `<default>`, which python-chess's option parser reads as '>' (it
    splits on the word default): sent back, a path '>' that does not exist. It is `<empty>` now,
    as Stockfish declares its empty strings, and the value python-chess reads loads the bundled
    network when sent back."""
    engine = popen()
    default = engine.options["WeightsFile"].default
    assert default in ("", "<empty>"), default
    engine.configure({"WeightsFile": "x"})
    engine.configure({"WeightsFile": default})
    assert engine.play(chess.Board(), chess.engine.Limit(nodes=20)).move in chess.Board().legal_moves


MIDDLEGAME_FEN = "r1bq1rk1/pp2bppp/2n1pn2/2pp4/3P4/2PBPN2/PP1N1PPP/R1BQ1RK1 w - - 0 8"


# Clocks run on the wall clock, so a loaded machine can flag anyone: these tests check the moves, never
# the flag (a clock never goes below CLOCK_FLOOR). Time management has its own tests and `cyzero match`.
CLOCK_FLOOR = 0.05


def _play_game(engine, board, plies, clock=2.0, inc=0.05, ponder=False, game=None):
    """Play ``plies`` half-moves with python-chess clocks; returns the seconds each play took."""
    clocks = {chess.WHITE: clock, chess.BLACK: clock}
    used = []
    for _ in range(plies):
        if board.is_game_over():
            break
        limit = chess.engine.Limit(white_clock=clocks[chess.WHITE], black_clock=clocks[chess.BLACK],
                                   white_inc=inc, black_inc=inc)
        started = time.monotonic()
        result = engine.play(board, limit, ponder=ponder, game=game)
        spent = time.monotonic() - started
        assert result.move in board.legal_moves
        clocks[board.turn] = max(CLOCK_FLOOR, clocks[board.turn] - spent) + inc
        used.append(spent)
        board.push(result.move)
    return used


def test_python_chess_play_with_clocks(popen):
    engine = popen()
    board = chess.Board()
    used = _play_game(engine, board, 16, clock=2.0, inc=0.05, game="clock game")
    assert len(used) == 16 or board.is_game_over()
    # A nearly empty clock: still a legal move.
    limit = chess.engine.Limit(white_clock=0.01, black_clock=0.01, white_inc=0, black_inc=0)
    board = chess.Board(MIDDLEGAME_FEN)
    assert engine.play(board, limit, game="flag game").move in board.legal_moves


SLOW_ENGINE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "slow_network_engine.py")
# What a GUI user changes between moves: each of these reloads the network (or, GPU on a CPU
# engine, needs nothing reloaded) while the game goes on.
OPTION_CYCLE = [("Backend", "auto"), ("Threads", 1), ("GPU", 1), ("Backend", "cpu"), ("Threads", 2),
                ("Backend", "openvino"), ("GPU", 0), ("Threads", 1)]


@pytest.mark.parametrize("stand_in", [None, "--eval-ms 50 --load-ms 3000"], ids=["real", "slow-stand-in"])
def test_python_chess_option_changes_between_timed_moves_never_forfeit(caplog, stand_in):
    """The issue's session: engine.configure over Backend, Threads and GPU between moves, each move
    engine.play(Limit(time=0.3)). Around the 12th move the engine answered `no network loaded: the
    network manager is closed` and bestmove 0000 (a forfeit), and each change cost the next move
    its reload time (an unsearched move). Now a change starts its reload at once, in the
    background, and the network in use plays on until the new one is built: 30 moves, each one
    searched (no "not searched" warning: at the least the search's own root evaluation, where
    the machine is so busy, a parallel test suite beside the reloads, that nothing more came
    back in time), none 0000. The slow stand-in takes 3 s to load a network (lc0 files, a big
    network, a GPU's first load) and 50 ms a call."""
    caplog.set_level(logging.DEBUG, logger="chess.engine")
    command = engine_command() if stand_in is None else [sys.executable, SLOW_ENGINE, *stand_in.split()]
    engine = chess.engine.SimpleEngine.popen_uci(command, cwd=REPO, timeout=120)
    try:
        board = chess.Board()
        for move_number in range(30):
            name, value = OPTION_CYCLE[move_number % len(OPTION_CYCLE)]
            engine.configure({name: value})
            result = engine.play(board, chess.engine.Limit(time=0.3), info=chess.engine.INFO_ALL,
                                 game="option cycling")
            assert result.move is not None and result.move in board.legal_moves, (move_number, result)
            assert result.info.get("nodes", 0) >= 1, (move_number, name, value, result.info)
            board.push(result.move)
            if board.is_game_over():
                board = chess.Board()
    finally:
        engine.quit()
    said = [m.split(": >> ", 1)[1] for m in (r.getMessage() for r in caplog.records) if ": >> " in m]
    assert not [line for line in said if line.startswith("bestmove 0000") or "not searched" in line
                or "error" in line], [line for line in said if "string" in line or "0000" in line]
    assert any("switched to network" in line for line in said)     # the changes were applied
    assert not [r.getMessage() for r in caplog.records
                if r.name.startswith("chess.engine") and r.levelno >= logging.WARNING]


def test_isready_after_an_option_change_waits_for_the_reload_and_the_next_go_searches_at_once():
    """setoption starts the reload; isready answers once it is built, so that the go after readyok
    searches with the new network from its first batch (UCI's intent for isready). A change that
    builds the same network (GPU on a CPU engine, auto for the provider it already is) reloads
    nothing."""
    with UciEngine(command=[sys.executable, SLOW_ENGINE, "--eval-ms", "0", "--load-ms", "1500"]) as eng:
        eng.send("position startpos")
        for name, value, reloads in [("Threads", 2, True), ("GPU", 1, False), ("Backend", "cpu", False),
                                     ("Threads", 1, True)]:
            eng.setoption(name, value)
            assert eng.isready(timeout=60) == []        # readyok alone: the switch is said at the search
            lines, best = eng.go("movetime 300")
            switched = [line for line in lines if "switched to network" in line]
            assert len(switched) == (1 if reloads else 0), (name, value, lines)
            assert not [line for line in lines if "still loading" in line or "not searched" in line], lines
            assert max(parse_info(line)["nodes"] for line in lines if line.startswith("info depth")) > 1, lines


def test_a_short_search_on_a_slow_network_always_searches():
    """A budget larger than one network evaluation always searches: on a network that takes 50 ms
    a call, go movetime 200 (145 ms after the default Move Overhead and the safety margin) reports
    more than one node, the first go after isready and after position commands that reuse or
    drop the tree alike (the issue's session: 0 nodes after `position startpos moves e2e4 e7e5`
    and after `position startpos`)."""
    with UciEngine(command=[sys.executable, SLOW_ENGINE, "--eval-ms", "50"]) as eng:
        eng.send("debug on")          # where each search's time went, for the failure message
        for position, movetime in [("startpos", 200), ("startpos moves e2e4 e7e5", 200), ("startpos", 500),
                                   ("startpos moves e2e4 e7e5", 200), ("startpos moves d2d4", 200)]:
            eng.send(f"position {position}")
            lines, best = eng.go(f"movetime {movetime}")
            nodes = max([parse_info(line)["nodes"] for line in lines if line.startswith("info depth")] or [0])
            assert nodes > 1 and not [line for line in lines if "not searched" in line], lines
            assert best != "bestmove 0000", lines


def test_python_chess_pondering_with_hits_and_misses(popen, caplog):
    engine = popen(**{"Move Overhead": 20})   # python-chess manages Ponder itself
    rng = random.Random(4)
    board = chess.Board()
    game = object()
    hits = misses = 0
    clocks = {chess.WHITE: 10.0, chess.BLACK: 10.0}
    for ply in range(10):
        limit = chess.engine.Limit(white_clock=clocks[chess.WHITE], black_clock=clocks[chess.BLACK],
                                   white_inc=0.05, black_inc=0.05)
        started = time.monotonic()
        result = engine.play(board, limit, ponder=True, game=game)
        clocks[board.turn] = max(CLOCK_FLOOR, clocks[board.turn] - (time.monotonic() - started))
        assert result.move in board.legal_moves
        board.push(result.move)
        if board.is_game_over():
            break
        replies = list(board.legal_moves)
        if result.ponder is not None:
            assert result.ponder in replies
            if ply % 2 == 0:
                reply = result.ponder
                hits += 1
            else:
                reply = rng.choice([m for m in replies if m != result.ponder] or replies)
                misses += reply != result.ponder
        else:
            reply = rng.choice(replies)
        board.push(reply)
        if board.is_game_over():
            break
    sent = sent_lines(caplog)
    assert hits and misses, (hits, misses)
    assert sent.count("ponderhit") >= hits - 1    # the first hit can come before may_ponderhit holds
    assert "stop" in sent
    assert any(line.startswith("go ponder") for line in sent)


CHESS960_CASTLING = "rk4r1/pppppppp/8/8/8/8/PPPPPPPP/RK4R1 w GAga - 0 1"


def test_python_chess_chess960_games(popen, caplog):
    engine = popen()
    rng = random.Random(960)
    for number in (rng.randrange(960), rng.randrange(960)):
        board = chess.Board.from_chess960_pos(number)
        for _ in range(16):
            if board.is_game_over():
                break
            result = engine.play(board, chess.engine.Limit(nodes=20), game=number)
            assert result.move in board.legal_moves
            board.push(result.move)
    # Castling, in king-takes-rook notation both ways, through python-chess.
    board = chess.Board(CHESS960_CASTLING, chess960=True)
    for uci in ("b1g1", "b1a1"):
        move = board.parse_uci(uci)
        assert board.is_castling(move)
        result = engine.play(board, chess.engine.Limit(nodes=20), root_moves=[move], game="castle")
        assert result.move == move
    assert "setoption name UCI_Chess960 value true" in sent_lines(caplog)
    info = engine.analyse(board, chess.engine.Limit(nodes=100))
    check_info_pv(board, info)
    # Back to standard chess: python-chess turns the option off again.
    board = chess.Board()
    assert engine.play(board, chess.engine.Limit(nodes=10), game="std").move in board.legal_moves


# --------------------------------------------------------------------------- scripted client replays


def load_script(name: str) -> dict[str, list[str]]:
    sections: dict[str, list[str]] = {}
    current = None
    with open(os.path.join(SCRIPTS, name), encoding="utf-8") as f:
        for raw in f:
            line = raw.rstrip("\n")
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            match = re.fullmatch(r"\[(\w+)\]", line.strip())
            if match:
                current = sections.setdefault(match.group(1), [])
            else:
                assert current is not None, f"{name}: a line before the first [section]"
                current.append(line)
    return sections


class ClientReplay:
    """Plays games against a random opponent, sending exactly the lines of a client script."""

    def __init__(self, eng: UciEngine, script: dict[str, list[str]], rng: random.Random,
                 clock_ms: int = 2000, inc_ms: int = 50, first_movetime: int = 300) -> None:
        self.eng = eng
        self.script = script
        self.rng = rng
        self.clock = {chess.WHITE: clock_ms, chess.BLACK: clock_ms}
        self.inc = inc_ms
        self.first_movetime = first_movetime
        self.gos = 0
        self.bestmoves = 0
        self.readies = 0
        self.board = chess.Board()
        self.pondering: chess.Board | None = None
        self.ponder_move: chess.Move | None = None

    def _fields(self, board: chess.Board) -> dict:
        root = board.root()
        position = "startpos" if root.fen() == chess.STARTING_FEN else f"fen {root.fen()}"
        moves = uci_moves(board)
        return dict(position=position, moves=(" moves " + " ".join(moves)) if moves else "",
                    wtime=self.clock[chess.WHITE], btime=self.clock[chess.BLACK],
                    winc=self.inc, binc=self.inc, movetime=self.first_movetime)

    def _read(self, what: str, timeout: float = 30.0) -> tuple[float, str]:
        """The next ``what`` line (readyok, uciok, bestmove); no other of those may come first."""
        when, line = self.eng.until(lambda text: text.split()[:1] in (["bestmove"], ["readyok"], ["uciok"]),
                                    timeout, timed=True)[-1]
        assert line.split()[0] == what, f"expected {what}, got {line!r}"
        return when, line

    def send_section(self, name: str, board: chess.Board) -> tuple[float, float, str | None]:
        """Send a section; returns (when its last line went, when bestmove came, bestmove or None)."""
        fields = self._fields(board)
        sent = got = 0.0
        best = None
        for template in self.script.get(name, []):
            line = template.format(**fields)
            sent = self.eng.send(line)
            words = line.split()
            if words == ["isready"]:
                self._read("readyok")
                self.readies += 1
            elif words == ["uci"]:
                self._read("uciok")
            elif words[0] == "go":
                self.gos += 1
                if "ponder" not in words:
                    got, best = self._read("bestmove")
                    self.bestmoves += 1
            elif words[0] in ("ponderhit", "stop") and self.pondering is not None:
                got, best = self._read("bestmove")
                self.bestmoves += 1
        return sent, got, best

    def our_move(self, first: bool) -> None:
        board = self.board
        if self.pondering is not None:
            if board.move_stack[-1] == self.ponder_move:
                sent, got, best = self.send_section("ponderhit", board)
            else:
                _, _, best = self.send_section("pondermiss", self.pondering)
                legal_bestmove(self.pondering, best)
                self.pondering = None
                sent, got, best = self.send_section("first" if first and "first" in self.script else "move",
                                                    board)
        else:
            sent, got, best = self.send_section("first" if first and "first" in self.script else "move", board)
        self.pondering = None
        move = legal_bestmove(board, best)
        if not first or "first" not in self.script:
            self.clock[board.turn] -= int((got - sent) * 1000)
            assert self.clock[board.turn] > 0, f"cyzero lost on time at ply {board.ply()}"
            self.clock[board.turn] += self.inc
        board.push(move)
        words = best.split()
        if "ponder" in self.script and len(words) == 4 and not board.is_game_over():
            self.ponder_move = board.parse_uci(words[3])
            self.pondering = board.copy()
            self.pondering.push(self.ponder_move)
            if self.pondering.is_game_over():
                self.pondering = None
            else:
                self.send_section("ponder", self.pondering)

    def their_move(self) -> None:
        board = self.board
        moves = list(board.legal_moves)
        if self.pondering is not None and self.rng.random() < 0.5:
            move = self.ponder_move
        else:
            move = self.rng.choice(moves)
        self.clock[board.turn] -= 20
        board.push(move)

    def play_game(self, our_color: chess.Color, our_moves: int) -> bool:
        """Play until ``our_moves`` of ours or the game's end; True when all ``our_moves`` were played
        (the random side can be mated sooner when the engine searches deeper)."""
        self.board = chess.Board()
        self.clock = {chess.WHITE: self.clock[chess.WHITE], chess.BLACK: self.clock[chess.BLACK]}
        self.send_section("newgame", self.board)
        played = 0
        while played < our_moves and not self.board.is_game_over():
            if self.board.turn == our_color:
                self.our_move(first=played == 0)
                played += 1
            else:
                self.their_move()
        if self.pondering is not None:
            _, _, best = self.send_section("pondermiss", self.pondering)
            legal_bestmove(self.pondering, best)
            self.pondering = None
        self.send_section("endgame", self.board)
        return played == our_moves


@pytest.mark.parametrize("client,colors", [
    ("cutechess.txt", (chess.WHITE, chess.BLACK)),
    ("fastchess.txt", (chess.BLACK,)),
    ("lichess_bot.txt", (chess.WHITE,)),
])
def test_scripted_client_replay(client, colors, tmp_path):
    (tmp_path / "syzygy").mkdir()       # lichess-bot's SyzygyPath ./syzygy/ (an empty folder)
    script = load_script(client)
    eng = UciEngine(ready=False, cwd=str(tmp_path))
    try:
        replay = ClientReplay(eng, script, random.Random(client))
        replay.send_section("start", chess.Board())
        for color in colors:
            replay.clock = {chess.WHITE: 2000, chess.BLACK: 2000}
            assert replay.play_game(color, our_moves=8) or replay.board.is_game_over()
        assert replay.gos == replay.bestmoves and replay.gos >= len(colors)
        # Nothing more: no late or duplicate bestmove, no error line anywhere.
        eng.send("isready")
        late = eng.until("readyok")
        assert not [line for line in late if line.startswith("bestmove")], late
        errors = [text for _, text in eng.lines if text.startswith("info string error")]
        assert not errors, errors
        replay.send_section("quit", replay.board)
        assert eng.wait_exit(10) == 0
    finally:
        eng.close()


def test_lichess_bot_first_move_movetime_10000_is_stopped():
    with UciEngine(options={"Move Overhead": 100, "UCI_ShowWDL": True}) as eng:
        eng.send("ucinewgame")
        eng.send("position startpos")
        eng.send("go movetime 10000")
        first = eng.until(lambda text: text.startswith("info depth"), 30)
        time.sleep(0.3)
        eng.send("stop")
        lines = eng.until("bestmove", 30)
        legal_bestmove(chess.Board(), lines[-1])
        # Stopped, not run out: the engine's own clock says the search took less than its movetime.
        # The last info may be the first one: a final info that says nothing new is not sent again,
        # and on a loaded machine the search may not report between the first info and the stop.
        last_info = parse_info([text for text in first + lines if text.startswith("info depth")][-1])
        assert last_info["time"] < 10000, last_info
        assert not [text for text in eng.isready() if text.startswith("bestmove")]


# --------------------------------------------------------------------------- hostile input


VOCAB = ["uci", "isready", "ucinewgame", "position", "startpos", "fen", "moves", "go", "stop", "ponderhit",
         "setoption", "name", "value", "wtime", "btime", "winc", "binc", "movestogo", "movetime", "nodes",
         "depth", "mate", "infinite", "ponder", "searchmoves", "debug", "on", "off", "register", "later", "d",
         "e2e4", "e7e5", "g1f3", "0000", "e1g1", "e1h1", "a7a8q", "h2h1n", "e2e4q", "KQkq", "HAha", "-", "w",
         "b", "8/8/8/8/8/8/8/8", "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR", "4k3/8/8/8/8/8/8/4K3",
         "MultiPV", "Hash", "Move", "Overhead", "UCI_ShowWDL", "UCI_Chess960", "OwnBook", "BookFile",
         "SyzygyPath", "Ponder", "Clear", "CPuct", "Temperature", "NNCacheSize", "MinibatchSize", "WeightsFile",
         "Backend", "cpu", "true", "false", "-1", "0", "1", "7", "100", "2.5", "nan", "inf", "1e9",
         "99999999999999999999999", "-0", "<empty>", "<default>", "name", "value", "\t", "\x00", "é", "♔"]

VALID = [
    "uci", "isready", "ucinewgame", "position startpos", "position startpos moves e2e4 e7e5 g1f3",
    "position fen rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq e3 0 1 moves c7c5",
    "position fen r3k2r/pppppppp/8/8/8/8/PPPPPPPP/R3K2R w KQkq - 0 1 moves e1g1",
    "go nodes 5", "go wtime 100 btime 100 winc 10 binc 10", "go movetime 5", "go infinite", "stop",
    "go ponder wtime 50 btime 50", "ponderhit", "go depth 1", "go searchmoves e2e4 d2d4 nodes 5",
    "setoption name MultiPV value 2", "setoption name UCI_ShowWDL value true", "setoption name Hash value 64",
    "setoption name Move Overhead value 50", "setoption name Clear Hash", "setoption name CPuct value 2.5",
    "setoption name UCI_Chess960 value false", "debug off", "d",
]

RESET = ["stop", "setoption name WeightsFile value <default>", "setoption name Backend value cpu",
         "setoption name MultiPV value 1", "setoption name UCI_Chess960 value false",
         "setoption name MinibatchSize value 256", "setoption name NNCacheSize value 200000",
         "setoption name OwnBook value false", "setoption name SyzygyPath value <empty>",
         "setoption name Temperature value 0", "setoption name CPuct value 1.745", "ucinewgame"]


def _mutate(rng: random.Random, line: str) -> str:
    kind = rng.randrange(6)
    if kind == 0:                                   # truncate
        return line[:rng.randrange(len(line) + 1)]
    if kind == 1:                                   # flip characters
        chars = list(line)
        for _ in range(rng.randrange(1, 4)):
            if chars:
                chars[rng.randrange(len(chars))] = chr(rng.randrange(32, 127))
        return "".join(chars)
    if kind == 2:                                   # drop a word
        words = line.split()
        if words:
            del words[rng.randrange(len(words))]
        return " ".join(words)
    if kind == 3:                                   # duplicate or swap words
        words = line.split()
        rng.shuffle(words)
        return " ".join(words + words[: rng.randrange(3)])
    if kind == 4:                                   # insert a random token
        words = line.split()
        words.insert(rng.randrange(len(words) + 1), rng.choice(VOCAB))
        return " ".join(words)
    return line.upper() if rng.random() < 0.5 else line + "\r"


def _junk_line(rng: random.Random) -> str:
    kind = rng.randrange(10)
    if kind < 3:
        return " ".join(rng.choice(VOCAB) for _ in range(rng.randrange(1, 12)))
    if kind < 7:
        return _mutate(rng, rng.choice(VALID))
    if kind == 7:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200))).decode("latin-1")
    if kind == 8:
        return rng.choice(VALID) + "\r"
    return rng.choice(VALID)


def _is_quit(text: str) -> bool:
    """Whether the engine would read a quit from ``text`` (it splits lines at \\n, \\r and \\r\\n)."""
    for piece in re.split(r"\r\n|\r|\n", text):
        words = piece.split()
        if words and words[0].lower() == "quit":
            return True
    return False


def test_random_and_mutated_lines_never_kill_the_engine():
    rng = random.Random(2024)
    with UciEngine(options={"Threads": 1}) as eng:
        sent = 0
        while sent < 3000:
            text = _junk_line(rng)
            if _is_quit(text):
                continue
            eng.send_bytes(text.encode("utf-8", errors="surrogateescape") + b"\n")
            sent += 1
            if sent % 500 == 0:
                # Very long lines, raw bytes that are not UTF-8, a bare \r, NULs.
                eng.send_bytes(b"position startpos moves " + b"e2e4 e7e5 " * 20000 + b"\n")
                eng.send_bytes(b"go " + b"nodes 1 " * 30000 + b"\n")
                eng.send_bytes(b"x" * 300000 + b"\n")
                eng.send_bytes(bytes(rng.randrange(128, 256) for _ in range(500)) + b"\n")
                eng.send_bytes(b"isready\risready\r\n\x00\x00\x00\n")
                assert eng.alive()
        for line in RESET:
            eng.send(line)
        eng.sync(timeout=120)       # everything sent so far has been answered
        assert eng.alive()
        board = chess.Board()
        eng.send("position startpos")
        _, best = eng.go("nodes 10")
        legal_bestmove(board, best)
        assert eng.isready() == []


# --------------------------------------------------------------------------- hot-swap


def _tiny_network(path: str) -> None:
    torch = pytest.importorskip("torch", reason="the replacement network is exported with the train extra (pip install 'cyzero[train]')")
    from trainer.export import export_onnx
    from trainer.model import build_net

    torch.set_num_threads(1)
    export_onnx(build_net("1x8", seed=1).eval(), path, "fp32", check_positions=8)


def test_hot_swap_during_analysis_and_a_truncated_file_refused(tmp_path):
    default = os.path.join(REPO, "engine", "nets", "default.onnx")
    watched = tmp_path / "net.onnx"
    shutil.copyfile(default, watched)
    replacement = tmp_path / "staging" / "tiny.onnx"
    _tiny_network(str(replacement))
    with UciEngine(options={"WeightsFile": str(watched)}) as eng:
        eng.send("go infinite")
        eng.until(lambda text: text.startswith("info depth"), 30)
        said = info_strings([text for _, text in eng.lines])       # the load is said as the search begins
        assert any("net.onnx" in line and "loaded" in line for line in said), said
        swapped_at = time.monotonic()
        os.replace(replacement, watched)                    # atomic, as trainer.atomic writes
        # The search goes on undisturbed while the new network is loaded in the background.
        time.sleep(2.5)
        during = [text for when, text in eng.lines if when > swapped_at]
        assert sum(1 for text in during if text.startswith("info depth")) >= 2, during
        assert not [text for text in during if text.startswith("bestmove")]
        eng.send("stop")
        legal_bestmove(chess.Board(), eng.until("bestmove")[-1])
        # Between searches, the next search swaps it in and says so.
        switched = []
        deadline = time.monotonic() + 20
        while not switched and time.monotonic() < deadline:
            switched = [line for line in info_strings(eng.go("nodes 1")[0]) if "switched" in line]
            time.sleep(0.2)
        assert switched and "net.onnx" in switched[0], switched
        lines, best = eng.go("nodes 20")
        legal_bestmove(chess.Board(), best)

        # A truncated file: refused with an info string, the engine keeps its network.
        with open(default, "rb") as f:
            data = f.read()
        staged = tmp_path / "staging" / "truncated.onnx"
        staged.write_bytes(data[: len(data) // 3])
        refused_at = time.monotonic()
        os.replace(staged, watched)
        refusal = []
        deadline = time.monotonic() + 20
        while not refusal and time.monotonic() < deadline:
            eng.go("nodes 1")
            refusal = [text for when, text in eng.lines
                       if when > refused_at and text.startswith("info string") and "refused" in text]
            time.sleep(0.2)
        assert refusal, [text for when, text in eng.lines if when > refused_at]
        after = [text for when, text in eng.lines if when > refused_at]
        assert not [text for text in after if "switched" in text]
        board = chess.Board()
        board.push_uci("d2d4")
        eng.position(board)
        legal_bestmove(board, eng.go("nodes 20")[1])


# --------------------------------------------------------------------------- a real match


@pytest.mark.skipif(STOCKFISH is None, reason="needs Debian's stockfish: apt install stockfish (it goes to /usr/games)")
def test_short_match_against_stockfish_has_no_illegal_move(popen):
    ours = popen()
    theirs = chess.engine.SimpleEngine.popen_uci(STOCKFISH, timeout=30)
    try:
        elo = theirs.options["UCI_Elo"].min
        theirs.configure({"UCI_LimitStrength": True, "UCI_Elo": elo, "Threads": 1, "Hash": 16})
        results = []
        for game, our_color in enumerate((chess.WHITE, chess.BLACK)):
            board = chess.Board()
            clocks = {chess.WHITE: 1.0, chess.BLACK: 1.0}   # a bullet game: short, and the clock matters
            inc = 0.05
            while not board.is_game_over(claim_draw=True) and board.ply() < 160:
                engine = ours if board.turn == our_color else theirs
                limit = chess.engine.Limit(white_clock=clocks[chess.WHITE], black_clock=clocks[chess.BLACK],
                                           white_inc=inc, black_inc=inc)
                started = time.monotonic()
                result = engine.play(board, limit, game=game)
                clocks[board.turn] = max(CLOCK_FLOOR, clocks[board.turn] - (time.monotonic() - started)) + inc
                if board.turn == our_color:
                    assert result.move in board.legal_moves, f"illegal move {result.move} in {board.fen()}"
                board.push(result.move)
            results.append(board.result(claim_draw=True))
        assert len(results) == 2
    finally:
        theirs.quit()


# --------------------------------------------------------------------------- book and tablebases


def _polyglot_entry(board: chess.Board, uci: str, weight: int) -> bytes:
    move = board.parse_uci(uci)
    to, frm = move.to_square, move.from_square
    raw = (chess.square_file(to) | chess.square_rank(to) << 3
           | chess.square_file(frm) << 6 | chess.square_rank(frm) << 9)
    return struct.pack(">QHHI", chess.polyglot.zobrist_hash(board), raw, weight, 0)


def test_own_book_answers_with_the_book_move(tmp_path):
    start = chess.Board()
    after = chess.Board()
    after.push_uci("g2g4")
    entries = [_polyglot_entry(start, "g2g4", 10), _polyglot_entry(start, "b2b4", 10),
               _polyglot_entry(after, "e7e5", 1)]
    entries.sort(key=lambda e: struct.unpack(">Q", e[:8])[0])
    book = tmp_path / "tiny.bin"
    book.write_bytes(b"".join(entries))
    with chess.polyglot.open_reader(book) as reader:     # python-chess reads it: the format is right
        assert {entry.move.uci() for entry in reader.find_all(start)} == {"g2g4", "b2b4"}
    with UciEngine(options={"OwnBook": True, "BookFile": str(book)}) as eng:
        for _ in range(4):
            eng.send("position startpos")
            lines, best = eng.go("wtime 10000 btime 10000")
            assert best.split()[1] in ("g2g4", "b2b4"), (lines, best)
        eng.send("position startpos moves g2g4")
        assert eng.go("nodes 10")[1] == "bestmove e7e5"
        board = chess.Board()
        for move in ("e2e4", "c7c5"):
            board.push_uci(move)
        eng.bestmove(board, "nodes 10")                      # out of book: a search
        # Analysis is never answered from the book.
        eng.send("position startpos")
        eng.send("go infinite")
        eng.until(lambda text: text.startswith("info depth"), 30)
        eng.send("stop")
        legal_bestmove(chess.Board(), eng.until("bestmove")[-1])
        # A missing book: an error line, and the engine searches as usual.
        eng.setoption("BookFile", str(tmp_path / "missing.bin"))
        lines = eng.isready()
        assert len(lines) == 1 and lines[0].startswith("info string error") and "book" in lines[0], lines
        eng.send("position startpos")
        legal_bestmove(chess.Board(), eng.go("nodes 10")[1])
        # A corrupt book (a size that is not a multiple of 16 bytes): never a crash.
        corrupt = tmp_path / "corrupt.bin"
        corrupt.write_bytes(os.urandom(100))
        eng.setoption("BookFile", str(corrupt))
        eng.isready()
        eng.send("position startpos")
        legal_bestmove(chess.Board(), eng.go("nodes 10")[1])


def test_syzygy_path_empty_or_missing(tmp_path):
    empty = tmp_path / "tb"
    empty.mkdir()
    endgame = "8/8/8/4k3/8/8/4P3/4K3 w - - 0 1"
    with UciEngine() as eng:
        eng.setoption("SyzygyPath", str(empty))
        assert eng.isready() == []
        eng.send(f"position fen {endgame}")
        lines, best = eng.go("nodes 20")
        said = info_strings(lines)
        assert any("Syzygy" in line for line in said) and not [line for line in said if "error" in line], lines
        legal_bestmove(chess.Board(endgame), best)
        eng.setoption("SyzygyPath", str(tmp_path / "missing"))
        lines = eng.isready()
        assert len(lines) == 1 and lines[0].startswith("info string error") and "Syzygy" in lines[0], lines
        eng.send(f"position fen {endgame}")
        legal_bestmove(chess.Board(endgame), eng.go("nodes 20")[1])
        eng.setoption("SyzygyPath", f"{empty}{os.pathsep}{tmp_path / 'missing'}")
        assert eng.isready()[0].startswith("info string error")
        eng.send("position startpos")
        legal_bestmove(chess.Board(), eng.go("nodes 10")[1])
