"""The compiled modules' type stubs (engine/*.pyi) match the built modules and reach mypy.

Cython modules carry no annotations an editor or mypy can read, so engine/board.pyi,
engine/encoding.pyi and engine/tree.pyi describe their public API by hand. stubtest
imports the built modules and compares every public name and signature with the stubs,
so a stub that falls behind a .pyx change fails here. mypy runs in a temporary
directory so its cache never lands in the working tree.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("mypy", reason="mypy is not installed (pip install -e .[dev])")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ALLOWLIST = os.path.join(REPO, "tests", "stubtest_allowlist.txt")
STUBBED_MODULES = ("engine.board", "engine.encoding", "engine.tree")


def _run(args: list[str], cwd: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=REPO, MYPYPATH=REPO)
    return subprocess.run([sys.executable, "-m", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def _mypy(tmp_path, source: str) -> subprocess.CompletedProcess[str]:
    snippet = tmp_path / "snippet.py"
    snippet.write_text(textwrap.dedent(source))
    return _run(["mypy", "--strict", "--follow-imports=silent", "--no-error-summary",
                 "--cache-dir", str(tmp_path / "cache"), str(snippet)], cwd=str(tmp_path))


def test_stubtest_finds_no_mismatch(tmp_path):
    result = _run(["mypy.stubtest", "--allowlist", ALLOWLIST, *STUBBED_MODULES], cwd=str(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_sees_the_stubbed_types(tmp_path):
    result = _mypy(tmp_path, """
        import numpy as np
        import numpy.typing as npt

        from engine.board import Board
        from engine.encoding import POLICY_SIZE, encode_board, legal_policy
        from engine.tree import Batch, NNCache, Tree

        board = Board()
        moves: list[str] = board.legal_moves()
        board.push_uci(moves[0])
        planes: npt.NDArray[np.float32] = encode_board(board)
        names, priors = legal_policy(board, np.zeros(POLICY_SIZE, dtype=np.float32))
        tree = Tree(board, cache=NNCache(1000))
        added: int = tree.gather(Batch(8))
        best: str | None = tree.best_move()
        visits = [child["n"] for child in tree.root_children()]
        reveal_type(moves)
        reveal_type(board.outcome())
        reveal_type(names)
        reveal_type(visits)
    """)
    assert result.returncode == 0, result.stdout + result.stderr
    # Older mypy versions spell builtins out ("builtins.list[builtins.str]").
    revealed = [line.split("Revealed type is ", 1)[1].strip('"').replace("builtins.", "")
                for line in result.stdout.splitlines() if "Revealed type is " in line]
    assert len(revealed) == 4, result.stdout
    assert revealed[0] == "list[str]"
    assert revealed[1].startswith("tuple[") and "'checkmate'" in revealed[1], revealed[1]
    assert revealed[1].endswith("bool | None] | None"), revealed[1]
    assert revealed[2] == "list[str]"
    assert revealed[3] == "list[int]"


def test_mypy_rejects_misuse_of_the_engine_api(tmp_path):
    result = _mypy(tmp_path, """
        from engine.board import Board
        from engine.encoding import legal_mask

        fen: int = Board().fen()
        Board().push_uci(12)
        legal_mask(None)
    """)
    assert result.returncode == 1, result.stdout + result.stderr
    errors = [line for line in result.stdout.splitlines() if ": error: " in line]
    assert len(errors) == 3, result.stdout
    assert 'expression has type "str", variable has type "int"' in errors[0]
    assert 'Argument 1 to "push_uci" of "Board" has incompatible type "int"' in errors[1]
    assert 'Argument 1 to "legal_mask" has incompatible type "None"' in errors[2]
