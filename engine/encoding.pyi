"""Types of the compiled lc0-compatible encoder (cython_src/encoding.pyx); keep in step with it (tests/test_stubs.py)."""

from collections.abc import Iterable
from typing import SupportsIndex

import numpy as np
import numpy.typing as npt

from engine.board import Board

POLICY_INDEX: list[str]
PLANES: int
POLICY_SIZE: int

def encode_board(board: Board, out: npt.NDArray[np.float32] | None = None) -> npt.NDArray[np.float32]: ...
def encode_boards(
    boards: Iterable[Board], out: npt.NDArray[np.float32] | None = None
) -> npt.NDArray[np.float32]: ...
def encode_position(
    fen: str | None = None, moves: Iterable[str] = (), *, chess960: bool = False
) -> npt.NDArray[np.float32]: ...
def move_to_index(board: Board, uci: str) -> int: ...
def index_to_move(board: Board, index: SupportsIndex) -> str: ...
def legal_mask(board: Board) -> npt.NDArray[np.bool_]: ...
def legal_policy(
    board: Board, logits: npt.ArrayLike, temperature: float = 1.0
) -> tuple[list[str], npt.NDArray[np.float32]]: ...
