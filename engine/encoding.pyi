"""Types of the compiled lc0-compatible encoder (cython_src/encoding.pyx); keep in step with it (tests/test_stubs.py)."""

from collections.abc import Iterable
from typing import SupportsIndex

import numpy as np
import numpy.typing as npt

from engine.board import Board

POLICY_INDEX: list[str]
PLANES: int
POLICY_SIZE: int
INPUT_FORMATS: tuple[int, ...]
FLIP: int
MIRROR: int
TRANSPOSE: int

def encode_board(
    board: Board, out: npt.NDArray[np.float32] | None = None, input_format: SupportsIndex = 1
) -> npt.NDArray[np.float32]: ...
def encode_boards(
    boards: Iterable[Board], out: npt.NDArray[np.float32] | None = None, input_format: SupportsIndex = 1
) -> npt.NDArray[np.float32]: ...
def encode_position(
    fen: str | None = None, moves: Iterable[str] = (), *, chess960: bool = False, input_format: SupportsIndex = 1
) -> npt.NDArray[np.float32]: ...
def move_to_index(board: Board, uci: str, input_format: SupportsIndex = 1) -> int: ...
def index_to_move(board: Board, index: SupportsIndex, input_format: SupportsIndex = 1) -> str: ...
def legal_mask(board: Board, input_format: SupportsIndex = 1) -> npt.NDArray[np.bool_]: ...
def legal_policy(
    board: Board, logits: npt.ArrayLike, temperature: float = 1.0, input_format: SupportsIndex = 1
) -> tuple[list[str], npt.NDArray[np.float32]]: ...
def canonical_transform(board: Board, input_format: SupportsIndex = 3) -> int: ...
def _encode_over(
    board: Board, out: npt.NDArray[np.float32], last: npt.NDArray[np.uint64], input_format: SupportsIndex = 1
) -> npt.NDArray[np.float32]: ...
