"""lc0's input formats where they are used: a network of format 2, 3, 4, 132, 5 or 133 is searched and
evaluated in its own format, end to end (the encoder's own checks against lc0 are in
tests/test_input_formats.py).

* ``cyzero eval`` of the repository's lc0 fixture with its input format rewritten gives lc0 v0.32.1's
  own evaluation of that file (tests/data/lc0/input-formats.json) at its 95 positions.
* The search writes its leaves' planes in the network's format and reads the network's policy
  through the position's canonical transform.
* The engine plays such a file over UCI and says which input it reads.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys

import chess
import numpy as np
import pytest

from engine import encoding as E
from engine.board import Board
from engine.limits import GoParams
from engine.params import SearchParams
from engine.search import Searcher
from lc0_files import CYZERO, Lc0Spec, with_input_format, write_lc0
from test_uci_harness import REPO, UciEngine

DATA = os.path.join(REPO, "tests", "data", "lc0", "input-formats.json")
TOLERANCE = {"v": 0.003, "d": 0.0045, "p": 0.15}   # as tests/test_input_formats.py, which says why


def _rewritten(tmp_path, input_format: int) -> str:
    with open(CYZERO.need().pb, "rb") as f:
        data = gzip.decompress(f.read())
    path = tmp_path / f"cyzero-3x16.format{input_format}.pb.gz"
    path.write_bytes(gzip.compress(with_input_format(data, input_format)))
    return str(path)


def _board(position: dict) -> Board:
    board = Board(position["fen"], chess960=position["chess960"])
    for move in position["moves"]:
        board.push_uci(move)
    return board


@pytest.mark.parametrize("input_format", [2, 3, 4, 132, 5, 133])
def test_cyzero_eval_of_a_network_of_each_format_is_lc0s(tmp_path, input_format):
    """lc0 encoded these positions in the file's format and evaluated them: cyzero eval, which encodes
    in the network's own format, gives the same W - L, D and policy shares (in positions lc0 v0.32
    transposes, its move indices disagree with its own planes: their policy is left out here and
    checked in tests/test_input_formats.py)."""
    with open(DATA, encoding="utf-8") as f:
        record = json.load(f)
    positions, expected = record["positions"], record["formats"][str(input_format)]
    lines = "".join(json.dumps({"fen": p["fen"] or "startpos", "moves": p["moves"], "chess960": p["chess960"]}) + "\n"
                    for p in positions)
    done = subprocess.run([sys.executable, "-m", "uci.cli", "eval", _rewritten(tmp_path, input_format),
                           "--positions", "-"], input=lines, capture_output=True, text=True, cwd=REPO, timeout=300)
    assert done.returncode == 0, done.stderr
    results = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(results) == len(positions)
    compared = 0
    for position, theirs, ours in zip(positions, expected, results):
        name = position["name"]
        assert ours["wdl"][0] - ours["wdl"][2] == pytest.approx(theirs["v"], abs=TOLERANCE["v"]), name
        assert ours["wdl"][1] == pytest.approx(theirs["d"], abs=TOLERANCE["d"]), name
        board = _board(position)
        if E.canonical_transform(board, input_format) & E.TRANSPOSE:
            continue
        reference = chess.Board(board.fen(), chess960=position["chess960"])
        names = {lc0: reference.uci(reference.parse_uci(lc0)) for lc0 in theirs["moves"]}
        logits = np.array([ours["policy"][names[m]] for m in theirs["moves"]], np.float64) / record["policy_temperature"]
        shares = 100.0 * np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
        np.testing.assert_allclose(shares, [p for _, p in theirs["moves"].values()], rtol=0, atol=TOLERANCE["p"],
                                   err_msg=name)
        compared += 1
    assert compared >= 70


class _PeakedOn:
    """A network of ``input_format`` that puts its policy on one index and records the planes it gets."""

    batch_sizes = ()
    gpu = False

    def __init__(self, input_format: int, index: int) -> None:
        self.input_format = input_format
        self.index = index
        self.planes: list = []

    def evaluate(self, planes):
        self.planes.append(np.array(planes))
        n = len(planes)
        policy = np.zeros((n, E.POLICY_SIZE), np.float32)
        policy[:, self.index] = 12.0
        return policy, np.tile(np.array([0.3, 0.4, 0.3], np.float32), (n, 1)), np.full(n, 30.0, np.float32)


@pytest.mark.parametrize("input_format", [3, 4, 132, 5, 133])
def test_the_search_reads_the_policy_through_the_canonical_transform(input_format):
    """Our king on the c-file, no castling rights: the canonical formats flip the files, so the
    network's index for e2e4 is format 1's d2d4. A network that wants e2e4 in its own format gets
    e2e4 played (read without the transform, the search would play d2d4), and the root it was
    given is encoded in its format."""
    board = Board("3k4/8/8/8/8/8/3PP3/2K5 w - - 0 1")
    assert E.canonical_transform(board, input_format) & E.FLIP
    wanted = E.move_to_index(board, "e2e4", input_format=input_format)
    assert wanted == E.move_to_index(board, "d2d4")
    network = _PeakedOn(input_format, wanted)
    searcher = Searcher(lambda: network, SearchParams(minibatch_size=4))
    results = []
    searcher.start(board, GoParams(nodes=40), lambda info: None, results.append)
    searcher.wait(30)
    assert results and results[0].best == "e2e4", results
    np.testing.assert_array_equal(network.planes[0][0], E.encode_board(board, input_format=input_format))
    # The same tree searched with a format-1 network next: nothing of the other format is kept.
    plain = _PeakedOn(1, E.move_to_index(board, "d2d4"))
    searcher._network = lambda: plain
    results.clear()
    searcher.start(board, GoParams(nodes=40), lambda info: None, results.append)
    searcher.wait(30)
    assert results[0].best == "d2d4" and searcher.tree.input_format == 1


def test_the_engine_plays_a_network_of_another_format_and_says_which(tmp_path):
    path = tmp_path / "net.pb.gz"
    write_lc0(str(path), Lc0Spec(se=True, input_format=4, moves_left=True))
    with UciEngine(options={"WeightsFile": str(path)}) as eng:
        said = " ".join(eng.remarks())
        assert "canonical with hectoplies input" in said, said
        board = chess.Board("8/8/3k4/8/8/8/3P4/2K5 w - - 30 60")    # a flipped, pawned position
        eng.position(board)
        lines, best = eng.go("nodes 60")
        assert chess.Move.from_uci(best.split()[1]) in board.legal_moves, lines
        assert not eng.bad


@pytest.mark.parametrize("input_format", [1, 3, 133, 99])
def test_an_onnx_model_inside_an_lc0_file_reads_the_files_input_format(tmp_path, input_format):
    """lc0 files that hold an ONNX model (network format 5) play in the input format the file says;
    one lc0 does not have is refused at load, naming it, not at the first search."""
    from engine.network import Network, NetworkError
    from lc0_files import wrap_onnx, write_bytes

    with open(os.path.join(REPO, "engine", "nets", "default.onnx"), "rb") as f:
        model = f.read()
    path = write_bytes(str(tmp_path / "wrapped.pb.gz"), with_input_format(wrap_onnx(model), input_format))
    if input_format == 99:
        with pytest.raises(NetworkError, match="99"):
            Network(path, backend="cpu")
    else:
        assert Network(path, backend="cpu").input_format == input_format
