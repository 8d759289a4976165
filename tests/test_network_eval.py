"""``cyzero eval``: a network's raw outputs on positions, checked against the network itself, against
lc0's own evaluation of lc0 files, and with bad lines among good ones."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import chess
import numpy as np
import pytest

from engine.board import Board
from engine.encoding import encode_board, move_to_index
from engine.network import POLICY_SIZE, Network
from engine.weights import default_weights_path
from lc0_files import EVALUATED_BY_LC0, assert_plays_as_lc0, fixture_params
from test_uci_harness import REPO

CASTLES = "4k3/8/8/8/8/8/8/R3K2R w KQ - 0 1"
LINES = [
    {"fen": "startpos"},
    {"fen": "startpos", "moves": ["e2e4", "e7e5", "g1f3", "b8c6", "f1c4", "g8f6"]},   # white may castle
    {"fen": "r3k2r/pppq1ppp/2n1bn2/3pp3/3PP3/2N1BN2/PPPQ1PPP/R3K2R w KQkq - 4 8"},       # both castlings
    {"fen": "8/P6k/8/8/8/8/6K1/8 w - - 0 1"},                                         # promotions
    {"fen": CASTLES},
    {"fen": CASTLES, "chess960": True},
    {"fen": "7k/6Q1/6K1/8/8/8/8/8 b - - 0 1"},                                        # mated: no moves
]


def cyzero_eval(weights: str, lines: list, *args: str) -> subprocess.CompletedProcess:
    """``cyzero eval`` in its own process, the lines given as JSON Lines on stdin."""
    text = "".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines)
    return subprocess.run([sys.executable, "-m", "uci.cli", "eval", weights, "--positions", "-", *args],
                          input=text, capture_output=True, text=True, cwd=REPO, timeout=300)


def board_of(line: dict) -> Board:
    board = Board(None if line["fen"] == "startpos" else line["fen"], chess960=line.get("chess960", False))
    for move in line.get("moves", []):
        board.push_uci(move)
    return board


def test_eval_gives_the_networks_own_outputs_for_every_legal_move():
    """Each line's WDL, moves left and every legal move's logit are the network's outputs for that
    position (its history included), the moves named as python-chess names them under UCI_Chess960
    (king-takes-rook in a Chess960 game, e1g1 otherwise); a batch of 2 gives the same as one call."""
    weights = default_weights_path()
    done = cyzero_eval(weights, LINES, "--batch", "2")
    assert done.returncode == 0, done.stderr
    results = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(results) == len(LINES)
    network = Network(weights, backend="cpu")
    for line, result in zip(LINES, results):
        board = board_of(line)
        policy, wdl, mlh = network.evaluate(encode_board(board)[None])
        np.testing.assert_allclose(result["wdl"], wdl[0], rtol=0, atol=1e-6)
        assert result["mlh"] == pytest.approx(float(mlh[0]), abs=1e-4)
        reference = chess.Board(board.fen(), chess960=board.chess960)
        assert set(result["policy"]) == {m.uci() for m in reference.legal_moves}, line
        for move, logit in result["policy"].items():
            assert logit == pytest.approx(float(policy[0, move_to_index(board, move)]), abs=1e-5)
    assert "e1g1" in results[2]["policy"] and "e1c1" in results[2]["policy"]
    assert {"e1g1", "e1c1"} <= set(results[4]["policy"]) and not {"e1h1", "e1a1"} & set(results[4]["policy"])
    assert {"e1h1", "e1a1"} <= set(results[5]["policy"]) and not {"e1g1", "e1c1"} & set(results[5]["policy"])
    assert results[5]["policy"]["e1h1"] == results[4]["policy"]["e1g1"]    # the same move, named two ways
    assert results[6]["policy"] == {}


@pytest.mark.parametrize("fixture", fixture_params(*EVALUATED_BY_LC0))
def test_eval_of_an_lc0_file_is_what_lc0_evaluates(fixture):
    """On lc0's own files (the repository's fixture, and Maia where it is downloaded) the outputs
    are lc0 v0.32.1's at one node: W - L and D, moves left, and every legal move's policy share
    from the logits cyzero eval writes under each move's name."""
    expected = fixture.need().lc0()
    done = cyzero_eval(fixture.pb, [{"fen": p["fen"]} for p in expected["positions"]])
    assert done.returncode == 0, done.stderr
    results = [json.loads(line) for line in done.stdout.splitlines()]
    policy = np.zeros((len(results), POLICY_SIZE), np.float32)
    for row, (position, result) in enumerate(zip(expected["positions"], results)):
        board = chess.Board(position["fen"])
        for lc0_name, move in position["moves"].items():     # lc0 names castling king-takes-rook
            policy[row, move["index"]] = result["policy"][board.uci(board.parse_uci(lc0_name))]
    wdl = np.array([r["wdl"] for r in results], np.float32)
    mlh = None if results[0]["mlh"] is None else np.array([r["mlh"] for r in results], np.float32)
    assert_plays_as_lc0(expected, policy, wdl, mlh)


def test_bad_lines_are_named_and_the_others_evaluated():
    lines = [{"fen": "startpos"}, "not json", {"fen": "8/8/8 w - - 0 1"}, {"fen": "startpos", "moves": ["e2e5"]},
             "", {"fen": "startpos", "moves": "e2e4"}, [1, 2], {"fen": "startpos", "moves": ["d2d4"]}]
    done = cyzero_eval(default_weights_path(), lines)
    assert done.returncode == 1
    results = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(results) == 7                       # the blank line is skipped, nothing else
    assert "wdl" in results[0] and "wdl" in results[6] and "d7d5" in results[6]["policy"]
    errors = [r["error"] for r in results[1:6]]
    assert errors[0].startswith("line 2: not JSON")
    assert errors[1].startswith("line 3: bad FEN")
    assert errors[2] == "line 4: illegal move 'e2e5' at ply 1"
    assert errors[3].startswith("line 6: fen must be a string, moves a list")
    assert errors[4].startswith("line 7: expected an object")
    assert [line for line in done.stderr.splitlines() if line.startswith("cyzero eval: line")] == \
        [f"cyzero eval: {e}" for e in errors]


def test_a_network_that_cannot_be_loaded_is_one_line(tmp_path):
    broken = tmp_path / "net.onnx"
    broken.write_bytes(b"not a network")
    done = cyzero_eval(str(broken), [{"fen": "startpos"}])
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("cyzero eval: ") and "Traceback" not in done.stderr


def test_run_batches_without_losing_order():
    """In-process: 7 lines in batches of 3 come out in input order, errors in their places."""
    from engine.tools.network_eval import run

    class Counting:
        calls = []

        def evaluate(self, planes):
            self.calls.append(len(planes))
            n = len(planes)
            return np.zeros((n, POLICY_SIZE), np.float32), np.tile([[0.2, 0.5, 0.3]], (n, 1)), None

    lines = [json.dumps({"fen": "startpos", "moves": moves})
             for moves in ([], ["e2e4"], ["e2e4", "e7e5"])] + ["junk"] + [json.dumps({"fen": "startpos"})] * 3
    out, err = io.StringIO(), io.StringIO()
    net = Counting()
    assert run(net, lines, out, err, batch=3) == 1
    results = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [("error" in r) for r in results] == [False, False, False, True, False, False, False]
    assert net.calls == [3, 2, 1] and results[1]["mlh"] is None
    assert "e7e5" in results[1]["policy"] and "g1f3" in results[2]["policy"]
    assert err.getvalue() == "cyzero eval: line 4: not JSON (Expecting value)\n"
