"""trainer.bootstrap: teacher-labelled self-play games from the real stockfish, and PGN imports.

Every record is checked against an independent replay of its game on the engine's
Board (planes from engine.encoding.encode_board, the legal mask, the played move).
"""

import gzip
import json
import multiprocessing
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from engine.board import Board
from engine.encoding import encode_board, index_to_move, legal_mask, move_to_index
from trainer import bootstrap
from trainer.bootstrap import TeacherError, bootstrap_pgn, bootstrap_teacher
from trainer.config import CONFIG_FILE
from trainer.records import ADJUDICATED_BIT, MAX_LENGTH_BIT, decode_records, read_chunk

STOCKFISH = shutil.which("stockfish") or shutil.which("/usr/games/stockfish")
needs_stockfish = pytest.mark.skipif(STOCKFISH is None,
                                     reason="no stockfish on PATH or at /usr/games/stockfish")


def _store(run):
    from trainer.store import ReplayStore

    return ReplayStore(run)


def _chunks(run, source, input_format=1):
    """[(entry, records)] of the run's chunks from ``source``, in manifest order."""
    return [(e, read_chunk(os.path.join(run, "replay", "chunks", e.name), input_format))
            for e in _store(run).entries() if e.source == source]


def _records(run, source, input_format=1):
    chunks = _chunks(run, source, input_format)
    return np.concatenate([r for _, r in chunks]) if chunks else np.zeros(0)


def _split_games(records):
    """Games back to back: plies_left counts down by one within a game and ends at 1."""
    games, start = [], 0
    left = records["plies_left"]
    for i in range(1, len(records) + 1):
        if i == len(records) or left[i] != left[i - 1] - 1:
            games.append(records[start:i])
            start = i
    return games


def _replay_and_check(game, start_fen=None):
    """Replays a game from its played moves, checking planes and policy; returns the final Board."""
    board = Board(start_fen)
    sample = decode_records(game)
    for i, record in enumerate(game):
        np.testing.assert_array_equal(sample.planes[i], encode_board(board))
        mask = legal_mask(board)
        assert np.all(sample.policy[i][~mask] == -1.0)
        assert np.all(sample.policy[i][mask] >= 0.0)
        assert sample.policy[i][mask].sum() == pytest.approx(1.0, abs=1e-5)
        moves = {move_to_index(board, m): m for m in board.legal_moves()}
        assert int(record["best_idx"]) in moves
        assert sample.policy[i][record["best_idx"]] == sample.policy[i][mask].max()
        board.push_uci(moves[int(record["played_idx"])])
    return board


# ------------------------------------------------------------------------------------------
# teacher


@needs_stockfish
def test_teacher_games_are_labelled_and_a_rerun_adds_only_the_difference(tmp_path):
    run = str(tmp_path / "run")
    kw = dict(teacher=[STOCKFISH], workers=2, depth=3, multipv=3, max_plies=24, opening_plies=4,
              positions_per_chunk=16, progress=False)
    first = bootstrap_teacher(run, positions=40, seed=1, **kw)
    assert (first.added, first.positions) == (40, 40)
    assert first.teacher.startswith("Stockfish")
    entries = [e for e, _ in _chunks(run, "teacher")]
    assert sum(e.positions for e in entries) == 40 and all(e.generation == 0 for e in entries)
    assert sum(e.games for e in entries) == first.games

    records = _records(run, "teacher")
    games = _split_games(records)
    assert len(games) == first.games
    wdl = decode_records(records).wdl
    assert np.all(wdl >= -1e-6) and np.allclose(wdl.sum(1), 1.0)
    assert np.all(records["result_q"] == records["root_q"])        # the value target is the teacher's
    for n, game in enumerate(games):
        final = _replay_and_check(game)
        length = int(game["plies_left"][0])
        cut = n == len(games) - 1 and game["plies_left"][-1] != 1   # the last game may be cut at 40
        assert cut or len(game) == length
        np.testing.assert_array_equal(game["played_q"][:-1], -game["result_q"][1:])   # mover's view
        results = game["orig_q"] * np.where(np.arange(len(game)) % 2 == 0, 1, -1)
        assert np.all(results == results[0]) and results[0] in (-1.0, 0.0, 1.0)   # one result per game
        flags = game["invariance_info"]
        if length == 24 and not final.is_game_over(claim_draw=True):
            assert np.all(flags == ADJUDICATED_BIT | MAX_LENGTH_BIT) and results[0] == 0.0
        elif not cut:
            assert np.all(flags == 0) and final.is_game_over(claim_draw=True)
    assert sum(first.terminations.values()) == first.games
    assert first.terminations.get("max_plies", 0) == sum(
        1 for g in games if g["invariance_info"][0] & MAX_LENGTH_BIT)

    second = bootstrap_teacher(run, positions=60, seed=1, **kw)
    assert (second.added, second.positions) == (20, 60)
    np.testing.assert_array_equal(_records(run, "teacher")[:40], records)   # nothing rewritten
    third = bootstrap_teacher(run, positions=50, seed=1, **kw)
    assert (third.added, third.positions) == (0, 60)


@needs_stockfish
def test_teacher_labels_are_written_in_the_input_format_asked_for(tmp_path):
    """The teacher's workers write the network's format: each record decodes to the engine's planes of
    that format for the position its game reached (replayed from the played moves)."""
    run = str(tmp_path / "run")
    bootstrap_teacher(run, teacher=[STOCKFISH], workers=1, depth=2, max_plies=30, opening_plies=4,
                      positions=30, seed=2, progress=False, input_format=4)
    records = _records(run, "teacher", 4)
    assert len(records) == 30 and np.all(records["input_format"] == 4)
    for game in _split_games(records):
        board, sample = Board(), decode_records(game, input_format=4)
        for i, record in enumerate(game):
            np.testing.assert_array_equal(sample.planes[i], encode_board(board, input_format=4))
            board.push_uci(index_to_move(board, int(record["played_idx"]), 4))


@needs_stockfish
def test_a_student_network_plays_one_side_of_each_game_and_the_teacher_labels_it(tmp_path):
    """With --student the student plays one side with its raw policy's first choice (checked against
    ONNX Runtime run on the file directly) and the teacher the other; every position keeps the
    teacher's label; a student that cannot be loaded is a clear error before anything is written."""
    import onnxruntime as ort

    from engine.weights import default_weights_path

    net = default_weights_path()
    session = ort.InferenceSession(net, providers=["CPUExecutionProvider"])
    run = str(tmp_path / "run")
    summary = bootstrap_teacher(run, teacher=[STOCKFISH], workers=1, depth=3, max_plies=40,
                                opening_plies=4, random_move_share=0.0, positions=120, seed=3,
                                student=net, progress=False)
    assert summary.added == 120
    games = _split_games(_records(run, "teacher"))
    differ = 0
    for game in games:
        _replay_and_check(game)
        board = Board()
        sides = {True: [], False: []}   # per side to move: (played is the student's choice, is the teacher's)
        for i, record in enumerate(game):
            if i >= 4:                   # past the random opening plies
                logits = session.run(["/output/policy"], {"/input/planes": encode_board(board)[None]})[0][0]
                student = int(np.argmax(np.where(legal_mask(board), logits, -np.inf)))
                played = int(record["played_idx"])
                sides[i % 2 == 0].append((played == student, played == int(record["best_idx"])))
                differ += student != int(record["best_idx"])
            board.push_uci({move_to_index(board, m): m for m in board.legal_moves()}[int(record["played_idx"])])
        assert any(all(s for s, _ in sides[side]) and all(t for _, t in sides[not side])
                   for side in (True, False)), "one side must play the student's moves, the other the teacher's"
    assert differ > 0, "the student never disagreed with the teacher: the test proves nothing"

    with pytest.raises(TeacherError, match="student network"):
        bootstrap_teacher(str(tmp_path / "bad"), teacher=[STOCKFISH], workers=1, depth=1, positions=10,
                          student=str(tmp_path / "missing.onnx"), progress=False)
    assert not _store(str(tmp_path / "bad")).entries()


@needs_stockfish
def test_sigterm_stops_the_labelling_cleanly_and_keeps_every_finished_game(tmp_path):
    """A SIGTERM to the labelling's process group (`timeout`, a service manager; Ctrl-C sends SIGINT
    the same way) ends the run cleanly: the finished games are committed, the summary says it
    stopped, no teacher is reported dead, nothing is left for the resource tracker to clean up."""
    run = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainer.cli", "bootstrap", str(run), "--teacher", STOCKFISH,
         "--positions", "1000000", "--workers", "2", "--depth", "2", "--max-plies", "40", "--no-progress"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not (run / "bootstrap" / "teacher.lock").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(4.0)   # some games finish, none committed yet (a chunk is 4,096 positions or 60 s)
        os.killpg(proc.pid, signal.SIGTERM)   # the whole group, as `timeout` and systemd do
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert "stopped=True" in out and "Traceback" not in err and "leaked" not in err
    summary = dict(re.findall(r"\b(positions|added)=(\d+)", out))
    kept = sum(e.positions for e in _store(run).entries())
    assert int(summary["added"]) == int(summary["positions"]) == kept
    assert json.loads((run / "bootstrap" / "teacher.json").read_text())["positions"] == kept
    if kept:
        for game in _split_games(_records(str(run), "teacher")):
            _replay_and_check(game)


class _SignalWhileStarting:
    """Unpickled by a spawned worker while it starts: the signal reaches it there, as one sent to
    the process group can."""

    def __init__(self, signum: int) -> None:
        self.signum = signum

    def __reduce__(self):
        # With its default action: a shell starts a background job with SIGINT ignored, and the
        # worker inherits that (a CI run started with `&` saw the signal do nothing, then a
        # TypeError from time.sleep(None), exit code 1).
        return exec, (f"import signal; signal.signal({self.signum}, signal.SIG_DFL); "
                      f"signal.raise_signal({self.signum})",)


@pytest.mark.parametrize("ending", ["SIGTERM", "SIGINT", "exit 3", "exit 3 while stopping"])
def test_a_worker_that_ended_because_of_a_stop_stops_the_labelling_and_any_other_is_an_error(ending):
    """A stop signal to the process group can reach a worker still starting, before it ignores
    it (a clean-clone CI run saw 'exited unexpectedly (exit code -15)' under load): that worker
    was stopped, as is one that ends once the labelling is stopping; any other end is an error."""
    ctx = multiprocessing.get_context("spawn")
    recv, send = ctx.Pipe(duplex=False)
    if ending.startswith("SIG"):
        proc = ctx.Process(target=time.sleep, args=(_SignalWhileStarting(getattr(signal, ending)),))
    else:
        proc = ctx.Process(target=os._exit, args=(3,))
    proc.start()
    send.close()
    stop = threading.Event()
    if ending.endswith("stopping"):
        stop.set()
    try:
        if ending == "exit 3":
            with pytest.raises(TeacherError, match=r"teacher worker for 'my teacher' exited unexpectedly "
                                                   r"\(exit code 3\)"):
                bootstrap._receive_game(recv, proc, ["my teacher"], stop)
        else:
            assert bootstrap._receive_game(recv, proc, ["my teacher"], stop) is None
            assert proc.exitcode == (-getattr(signal, ending) if ending.startswith("SIG") else 3)
    finally:
        proc.kill()
        proc.join()
        recv.close()


def test_a_teacher_that_cannot_start_is_a_clear_error(tmp_path):
    run = str(tmp_path / "run")
    with pytest.raises(TeacherError, match="cannot start teacher /nonexistent/teacher-x"):
        bootstrap_teacher(run, teacher=["/nonexistent/teacher-x"], positions=10, workers=1,
                          progress=False)
    silent = [sys.executable, "-c", "pass"]
    with pytest.raises(TeacherError, match="did not start as a UCI engine") as err:
        bootstrap_teacher(run, teacher=silent, positions=10, workers=1, progress=False)
    assert "-c pass" in str(err.value)
    assert _records(run, "teacher").size == 0


FLAKY_ENGINE = """
import sys
for line in sys.stdin:
    cmd = line.split()[0] if line.split() else ""
    if cmd == "uci":
        print("id name Flaky"); print("uciok")
    elif cmd == "isready":
        print("readyok")
    elif cmd == "go":
        sys.exit(3)
    elif cmd == "quit":
        break
    sys.stdout.flush()
"""


def test_a_teacher_that_dies_while_labelling_names_its_command(tmp_path):
    script = tmp_path / "flaky_engine.py"
    script.write_text(FLAKY_ENGINE)
    with pytest.raises(TeacherError, match="flaky_engine.py has no MultiPV option"):
        bootstrap_teacher(str(tmp_path / "run"), teacher=[sys.executable, str(script)],
                          positions=10, multipv=4, progress=False)
    with pytest.raises(TeacherError, match="flaky_engine.py") as err:
        bootstrap_teacher(str(tmp_path / "run"), teacher=[sys.executable, str(script)],
                          positions=10, workers=2, multipv=1, progress=False)
    assert "failed on" in str(err.value)


# ------------------------------------------------------------------------------------------
# PGN

FEN = "4k3/8/8/8/8/8/4P3/4K3 b - - 3 40"
PGN = f"""[Event "a win"]
[Result "1-0"]

1. e4 e5 2. Nf3 Nc6 3. Bb5 a6 {{a comment}} 4. Ba4 (4. Bxc6 dxc6) 1-0

[Event "unfinished"]
[Result "*"]

1. d4 d5 *

[Event "from a FEN"]
[SetUp "1"]
[FEN "{FEN}"]
[Result "0-1"]

40... Kd7 41. e4 Ke6 0-1

[Event "an illegal move"]
[Result "1-0"]

1. e4 e5 2. Ke3 Nc6 1-0

[Event "a variant"]
[Variant "Atomic"]
[Result "1-0"]

1. e4 d5 1-0

[Event "a draw"]
[Result "1/2-1/2"]

1. c4 c5 2. Nc3 1/2-1/2
"""

EXPECTED = [  # (start FEN, moves, white's result)
    (None, ["e2e4", "e7e5", "g1f3", "b8c6", "f1b5", "a7a6", "b5a4"], 1.0),
    (FEN, ["e8d7", "e2e4", "d7e6"], -1.0),
    (None, ["c2c4", "c7c5", "b1c3"], 0.0),
]


def _check_pgn_records(records, input_format=1):
    games = _split_games(records)
    assert len(games) == len(EXPECTED)
    for game, (fen, moves, white_result) in zip(games, EXPECTED):
        assert len(game) == len(moves)
        board = Board(fen)
        sample = decode_records(game, input_format=input_format)
        for i, move in enumerate(moves):
            np.testing.assert_array_equal(sample.planes[i], encode_board(board, input_format=input_format))
            expected_policy = np.where(legal_mask(board, input_format), 0.0, -1.0).astype(np.float32)
            expected_policy[move_to_index(board, move, input_format)] = 1.0
            np.testing.assert_array_equal(sample.policy[i], expected_policy)
            q = white_result if board.turn else -white_result
            draw = 1.0 if white_result == 0.0 else 0.0
            np.testing.assert_allclose(sample.wdl[i], [(1 - draw + q) / 2, draw, (1 - draw - q) / 2])
            assert sample.plies_left[i] == len(moves) - i
            assert game["played_q"][i] == game["best_q"][i] == q        # the mover's view, like result_q
            assert game["played_idx"][i] == game["best_idx"][i] == move_to_index(board, move, input_format)
            board.push_uci(move)


def test_pgn_games_become_exactly_the_expected_samples_once(tmp_path, caplog):
    pgn = tmp_path / "games.pgn"
    pgn.write_text(PGN)
    run = str(tmp_path / "run")
    summary = bootstrap_pgn(run, [pgn], progress=False)
    assert (summary.games, summary.positions) == (3, 13)
    assert summary.skipped == {"no result": 1, "parse error": 1, "variant": 1}
    assert sum("skipped" in r.getMessage() for r in caplog.records) == 3
    _check_pgn_records(_records(run, "pgn"))

    again = bootstrap_pgn(run, [pgn], progress=False)
    assert (again.games, again.positions, again.files_already_done) == (0, 0, 1)
    assert len(_records(run, "pgn")) == 13


def test_pgn_games_are_written_in_the_input_format_of_the_runs_network(tmp_path):
    """A run whose config names a canonical-format network gets its records in that format (the
    learner reads nothing else); ``input_format`` overrides it."""
    pgn = tmp_path / "games.pgn"
    pgn.write_text(PGN)
    run = tmp_path / "run"
    run.mkdir()
    (run / CONFIG_FILE).write_text('[model]\nnet = "bt-16x1x2h"\ninput_format = 132\n')
    assert bootstrap_pgn(str(run), [pgn], progress=False).positions == 13
    _check_pgn_records(_records(str(run), "pgn", 132), 132)
    other = str(tmp_path / "other")
    assert bootstrap_pgn(other, [pgn], progress=False, input_format=3).positions == 13
    _check_pgn_records(_records(other, "pgn", 3), 3)


def test_pgn_import_resumes_without_duplicates_after_a_kill_between_commit_and_state(
        tmp_path, monkeypatch):
    pgn = tmp_path / "games.pgn.gz"
    pgn.write_bytes(gzip.compress(PGN.encode()))
    run = str(tmp_path / "run")
    real_write = bootstrap._write_pgn_state
    calls = []

    def killed_after_first_commit(path, state):
        calls.append(state)
        if len(calls) == 2:      # 1: the pending mark, then the chunk is committed, 2: the settled state
            raise KeyboardInterrupt
        real_write(path, state)

    monkeypatch.setattr(bootstrap, "_write_pgn_state", killed_after_first_commit)
    with pytest.raises(KeyboardInterrupt):
        bootstrap_pgn(run, [pgn], positions_per_chunk=5, progress=False)
    assert len(_records(run, "pgn")) == 7          # the first game is in the store, its state is not
    monkeypatch.setattr(bootstrap, "_write_pgn_state", real_write)

    rest = bootstrap_pgn(run, [pgn], positions_per_chunk=5, progress=False)
    assert (rest.games, rest.positions) == (2, 6)
    _check_pgn_records(_records(run, "pgn"))


class _Tables:
    """Answers probe_wdl like python-chess's Tablebase: a value for known positions, KeyError otherwise."""

    def __init__(self, known):
        self.known = known

    def probe_wdl(self, board):
        return self.known[board.epd()]


def test_syzygy_adjudication_reads_wdl_from_the_side_to_move():
    import chess

    from trainer.bootstrap import _syzygy_result

    white_to_move = chess.Board("8/8/8/8/8/8/4K3/k6Q w - - 0 1")
    black_to_move = chess.Board("8/8/8/8/8/8/4K3/k6Q b - - 0 1")
    tables = _Tables({white_to_move.epd(): 2, black_to_move.epd(): -2})
    assert _syzygy_result(tables, white_to_move) == (True, True)          # white wins
    assert _syzygy_result(tables, black_to_move) == (True, True)          # black to move loses
    for cursed in (1, -1, 0):                                             # decided past 50 moves: a draw
        assert _syzygy_result(_Tables({white_to_move.epd(): cursed}), white_to_move) == (True, None)
    assert _syzygy_result(_Tables({}), white_to_move) == (False, None)    # no table
    assert _syzygy_result(tables, chess.Board()) == (False, None)         # too many pieces
    assert _syzygy_result(None, white_to_move) == (False, None)


@needs_stockfish
def test_labelling_cost_reports_each_setting():
    from trainer.bootstrap import labelling_cost

    rows = labelling_cost([STOCKFISH], [(1, 1), (2, 3)], seconds=0.05)
    assert [(r["depth"], r["multipv"]) for r in rows] == [(1, 1), (2, 3)]
    assert all(r["positions"] > 0 and r["ms_per_position"] > 0 for r in rows)
