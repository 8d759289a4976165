"""lc0's V6 training record: write one from a searched position, read it back as network targets.

The layout is lc0's ``V6TrainingData`` (8,356 bytes, packed, little-endian), so
lc0's tools read our data and we read theirs.  We write input format 1 (lc0's
classical 112 planes, the one :mod:`engine.encoding` produces).  The readers
also accept lc0's input format 2, converted to format 1 (:func:`to_classical`);
other versions and input formats are refused with a message naming them.

Planes 0..103 (8 history slots x 13) are stored as uint64 bitboards with the
bits of each byte reversed, as lc0 writes them: square a1 is the top bit of
the first byte, so ``np.unpackbits(..., bitorder="big")`` yields the squares
a1, b1, ..., h8 in order.  Planes 104..111 are not stored as planes: the four
castling bytes, the side to move (1 when black), the rule-50 count, a zero
plane and a ones plane.  The policy holds the visit share of each legal move
and -1 on every illegal index.

Chunks are gzip files of records back to back (see :func:`write_chunk`).
Only numpy and the engine are needed; no torch.
"""

from __future__ import annotations

import gzip
import math
import os
import zlib
from typing import Iterable, Mapping, NamedTuple, cast

import numpy as np

from engine.board import Board
from engine.encoding import POLICY_SIZE, encode_board, legal_mask, move_to_index
from engine.files import atomic_open

__all__ = [
    "RECORD_DTYPE",
    "RECORD_BYTES",
    "RECORD_VERSION",
    "INPUT_FORMAT_CLASSICAL",
    "INPUT_FORMAT_CASTLING_PLANE",
    "INPUT_FORMAT_NAMES",
    "HISTORY_PLANES",
    "ChunkError",
    "Eval",
    "Sample",
    "make_record",
    "check_records",
    "to_classical",
    "decode_record",
    "decode_records",
    "write_chunk",
    "read_chunk",
    "parse_chunk",
]

RECORD_VERSION = 6
INPUT_FORMAT_CLASSICAL = 1
INPUT_FORMAT_CASTLING_PLANE = 2
# lc0's pblczero::NetworkFormat::InputFormat values, for messages that name a format.
INPUT_FORMAT_NAMES = {
    1: "INPUT_CLASSICAL_112_PLANE",
    2: "INPUT_112_WITH_CASTLING_PLANE",
    3: "INPUT_112_WITH_CANONICALIZATION",
    4: "INPUT_112_WITH_CANONICALIZATION_HECTOPLIES",
    5: "INPUT_112_WITH_CANONICALIZATION_V2",
    132: "INPUT_112_WITH_CANONICALIZATION_HECTOPLIES_ARMAGEDDON",
    133: "INPUT_112_WITH_CANONICALIZATION_V2_ARMAGEDDON",
}
_CASTLING_FIELDS = ("castling_us_ooo", "castling_us_oo", "castling_them_ooo", "castling_them_oo")
HISTORY_PLANES = 104
INPUT_PLANES = 112

# invariance_info bits lc0 sets for input format 1 (the others belong to input format 3).
ADJUDICATED_BIT = 1 << 5
MAX_LENGTH_BIT = 1 << 4

_F = "<f4"
RECORD_DTYPE = np.dtype(
    [
        ("version", "<u4"),
        ("input_format", "<u4"),
        ("probabilities", _F, (POLICY_SIZE,)),
        ("planes", "<u8", (HISTORY_PLANES,)),
        ("castling_us_ooo", "u1"),
        ("castling_us_oo", "u1"),
        ("castling_them_ooo", "u1"),
        ("castling_them_oo", "u1"),
        ("side_to_move_or_enpassant", "u1"),
        ("rule50_count", "u1"),
        ("invariance_info", "u1"),
        ("dummy", "u1"),
        ("root_q", _F),
        ("best_q", _F),
        ("root_d", _F),
        ("best_d", _F),
        ("root_m", _F),
        ("best_m", _F),
        ("plies_left", _F),
        ("result_q", _F),
        ("result_d", _F),
        ("played_q", _F),
        ("played_d", _F),
        ("played_m", _F),
        ("orig_q", _F),
        ("orig_d", _F),
        ("orig_m", _F),
        ("visits", "<u4"),
        ("played_idx", "<u2"),
        ("best_idx", "<u2"),
        ("policy_kld", _F),
        ("reserved", "<u4"),
    ],
    align=False,
)
RECORD_BYTES = 8356
assert RECORD_DTYPE.itemsize == RECORD_BYTES, RECORD_DTYPE.itemsize


class ChunkError(ValueError):
    """A chunk file that cannot be read (truncated, corrupt, wrong format); the message names the file."""


class Eval(NamedTuple):
    """A search value from the side to move's view: q in [-1, 1], draw probability d, moves left m (plies)."""

    q: float
    d: float
    m: float


class Sample(NamedTuple):
    """What the learner trains on, decoded from records (a leading N axis from :func:`decode_records`).

    ``policy`` keeps lc0's -1 on illegal moves: the loss masks entries < 0.
    ``wdl`` is the game result (win, draw, loss) from the side to move's view.
    """

    planes: np.ndarray      # float32 [112, 8, 8]
    policy: np.ndarray      # float32 [1858]
    wdl: np.ndarray         # float32 [3]
    plies_left: np.ndarray  # float32 scalar


_NO_EVAL = Eval(math.nan, math.nan, math.nan)


def _check_result(q: float, d: float, what: str) -> None:
    if not (0.0 <= d <= 1.0 and abs(q) <= 1.0 - d + 1e-6):
        raise ValueError(f"{what} (q={q}, d={d}) is not a result: need 0 <= d <= 1 and |q| <= 1 - d")


def make_record(
    board: Board,
    visits: Mapping[str, float],
    *,
    result_q: float,
    result_d: float,
    plies_left: float,
    played: str,
    root: Eval,
    best: str | None = None,
    best_eval: Eval | None = None,
    played_eval: Eval | None = None,
    orig: Eval = _NO_EVAL,
    policy_kld: float = 0.0,
    adjudicated: bool = False,
    max_length_exceeded: bool = False,
    nodes: int | None = None,
) -> np.void:
    """One V6 record for ``board`` (with its move history) after a search.

    ``visits`` maps legal UCI moves to their visit counts (moves left out count 0),
    or to any non-negative weights (a teacher's softmaxed MultiPV scores); the
    policy target is their share.  ``nodes`` is the record's visit count field
    (default: the sum of ``visits``, rounded).  ``result_q``/``result_d`` are the game's
    outcome from the side to move's view.  ``best`` defaults to the most visited
    move; ``best_eval`` and ``played_eval`` default to ``root``.
    """
    if not visits:
        raise ValueError("a training record needs the search's visits; got none")
    _check_result(result_q, result_d, "game result")
    legal = legal_mask(board)
    probabilities = np.full(POLICY_SIZE, -1.0, dtype=np.float32)
    probabilities[legal] = 0.0
    counts = {}
    for move, n in visits.items():
        if not board.is_legal(move):
            raise ValueError(f"visits name {move!r}, not a legal move in {board.fen()}")
        if n < 0:
            raise ValueError(f"visits of {move} must be >= 0, got {n}")
        counts[move_to_index(board, move)] = float(n)
    total = sum(counts.values())
    if total <= 0:
        raise ValueError("a training record needs at least one visit")
    for index, n in counts.items():
        probabilities[index] = np.float32(n / total)
    if best is None:
        best = max(visits, key=lambda m: visits[m])
    for name, move in (("played", played), ("best", best)):
        if not board.is_legal(move):
            raise ValueError(f"{name} move {move!r} is not legal in {board.fen()}")
    best_eval = root if best_eval is None else best_eval
    played_eval = root if played_eval is None else played_eval

    planes = encode_board(board)
    rule50 = int(planes[109, 0, 0])
    if rule50 > 255:
        raise ValueError(f"rule-50 count {rule50} does not fit lc0's uint8 field")

    record = np.zeros((), dtype=RECORD_DTYPE)
    record["version"] = RECORD_VERSION
    record["input_format"] = INPUT_FORMAT_CLASSICAL
    record["probabilities"] = probabilities
    record["planes"] = _pack_planes(planes[None, :HISTORY_PLANES])[0]
    record["castling_us_ooo"] = planes[104, 0, 0]
    record["castling_us_oo"] = planes[105, 0, 0]
    record["castling_them_ooo"] = planes[106, 0, 0]
    record["castling_them_oo"] = planes[107, 0, 0]
    record["side_to_move_or_enpassant"] = planes[108, 0, 0]
    record["rule50_count"] = rule50
    record["invariance_info"] = (ADJUDICATED_BIT if adjudicated else 0) | (
        MAX_LENGTH_BIT if max_length_exceeded else 0
    )
    record["root_q"], record["root_d"], record["root_m"] = root
    record["best_q"], record["best_d"], record["best_m"] = best_eval
    record["played_q"], record["played_d"], record["played_m"] = played_eval
    record["orig_q"], record["orig_d"], record["orig_m"] = orig
    record["plies_left"] = plies_left
    record["result_q"] = result_q
    record["result_d"] = result_d
    record["visits"] = int(round(total)) if nodes is None else int(nodes)
    record["played_idx"] = move_to_index(board, played)
    record["best_idx"] = move_to_index(board, best)
    record["policy_kld"] = policy_kld
    return cast(np.void, record[()])


def _pack_planes(planes: np.ndarray) -> np.ndarray:
    """[N, P, 8, 8] 0/1 floats -> [N, P] uint64 bitboards, bits of each byte reversed (lc0's order)."""
    n, p = planes.shape[:2]
    bits = planes.reshape(n, p, 64) != 0
    return np.packbits(bits, axis=2, bitorder="big").view("<u8").reshape(n, p)


def _unpack_planes(bitboards: np.ndarray) -> np.ndarray:
    """[N, P] uint64 bitboards in lc0's byte-reversed order -> [N, P, 8, 8] float32."""
    n, p = bitboards.shape
    data = np.ascontiguousarray(bitboards, dtype="<u8").view(np.uint8).reshape(n, p, 8)
    return np.unpackbits(data, axis=2, bitorder="big").reshape(n, p, 8, 8).astype(np.float32)


def check_records(records: np.ndarray) -> None:
    """Raise ``ValueError`` naming the format unless every record is version 6, input format 1."""
    versions = records["version"]
    formats = records["input_format"]
    bad = np.flatnonzero((versions != RECORD_VERSION) | (formats != INPUT_FORMAT_CLASSICAL))
    if bad.size:
        i = int(bad[0])
        raise ValueError(
            f"record {i} is training data version {int(versions.flat[i])} with input format "
            f"{int(formats.flat[i])}; only version {RECORD_VERSION} with input format "
            f"{INPUT_FORMAT_CLASSICAL} (lc0's classical 112 planes) can be read"
        )


def to_classical(records: np.ndarray) -> np.ndarray:
    """``records`` in input format 1: the array itself when it is, a converted copy of format-2 records.

    lc0's input format 2 (``INPUT_112_WITH_CASTLING_PLANE``) differs from format 1
    in the record only in its four castling bytes: lc0 writes ``1 << rook file``
    (1 for the a-file rook, 128 for the h-file one) where format 1 writes 1.  The
    history planes, side to move, rule-50 count and policy are the same, so any
    nonzero castling byte becomes 1 (a Chess960 rook's file is lost: format 1
    cannot express it).  Formats 3 and up canonicalise the board (flip, mirror,
    transpose) and store the en passant file in place of the side to move: they
    cannot be converted, and ``ValueError`` names the format.
    """
    versions = records["version"]
    formats = records["input_format"]
    bad = np.flatnonzero(versions != RECORD_VERSION)
    if bad.size:
        i = int(bad[0])
        raise ValueError(
            f"record {i} is training data version {int(versions.flat[i])} with input format "
            f"{int(formats.flat[i])}; only version {RECORD_VERSION} can be read"
        )
    classical = formats == INPUT_FORMAT_CLASSICAL
    if classical.all():
        return records
    bad = np.flatnonzero(~classical & (formats != INPUT_FORMAT_CASTLING_PLANE))
    if bad.size:
        i = int(bad[0])
        fmt = int(formats.flat[i])
        raise ValueError(
            f"record {i} has input format {fmt} ({INPUT_FORMAT_NAMES.get(fmt, 'unknown to lc0')}), "
            "which cannot be converted to input format 1: canonicalised boards with the en passant "
            "file in place of the side to move; only input formats 1 and 2 can be read"
        )
    converted = records.copy()
    for field in _CASTLING_FIELDS:
        converted[field] = converted[field] != 0
    converted["input_format"] = INPUT_FORMAT_CLASSICAL
    return converted


def decode_records(records: np.ndarray, *, q_ratio: float = 0.0) -> Sample:
    """Network inputs and targets of N records (a RECORD_DTYPE array), each with a leading N axis.

    Records of lc0's input format 2 are converted (:func:`to_classical`).  ``q_ratio`` mixes the
    search's value of its best move (``best_q``, ``best_d``) into the WDL target, the rest being
    the game result, as lc0's trainer does: one result is a noisy label for every position of its
    game.  A record without a best-move value (NaN) keeps its result.
    """
    if not 0.0 <= q_ratio <= 1.0:
        raise ValueError(f"q_ratio must be in [0, 1], got {q_ratio}")
    records = np.atleast_1d(np.asarray(records))
    if records.dtype != RECORD_DTYPE:
        raise TypeError(f"expected records of RECORD_DTYPE, got dtype {records.dtype}")
    records = to_classical(records)
    n = records.shape[0]
    planes = np.zeros((n, INPUT_PLANES, 8, 8), dtype=np.float32)
    planes[:, :HISTORY_PLANES] = _unpack_planes(records["planes"])
    for plane, field in enumerate(
        ("castling_us_ooo", "castling_us_oo", "castling_them_ooo", "castling_them_oo",
         "side_to_move_or_enpassant", "rule50_count"),
        start=104,
    ):
        planes[:, plane] = records[field].astype(np.float32)[:, None, None]
    planes[:, 111] = 1.0
    q = records["result_q"].astype(np.float32)
    d = records["result_d"].astype(np.float32)
    if q_ratio > 0.0:
        best_q = records["best_q"].astype(np.float32)
        best_d = records["best_d"].astype(np.float32)
        known = np.isfinite(best_q) & np.isfinite(best_d)
        q = np.where(known, (1 - q_ratio) * q + q_ratio * best_q, q)
        d = np.where(known, (1 - q_ratio) * d + q_ratio * best_d, d)
    wdl = np.stack([(1 - d + q) / 2, d, (1 - d - q) / 2], axis=1)
    return Sample(planes, records["probabilities"].astype(np.float32), wdl,
                  records["plies_left"].astype(np.float32))


def decode_record(record: np.void | bytes) -> Sample:
    """Network inputs and targets of one record (a RECORD_DTYPE scalar or its 8,356 bytes)."""
    if isinstance(record, (bytes, bytearray, memoryview)):
        if len(record) != RECORD_BYTES:
            raise ValueError(f"a V6 record is {RECORD_BYTES} bytes, got {len(record)}")
        records = np.frombuffer(record, dtype=RECORD_DTYPE)
    else:
        records = np.asarray(record)
    planes, policy, wdl, plies_left = decode_records(records)
    return Sample(planes[0], policy[0], wdl[0], plies_left[0])


def write_chunk(path: str | os.PathLike, records: Iterable[np.void] | np.ndarray) -> int:
    """Write records to a gzip chunk at ``path`` atomically; returns how many were written."""
    if isinstance(records, np.ndarray):
        array = np.atleast_1d(records)
    else:
        records = list(records)
        odd = [r for r in records if getattr(r, "dtype", None) != RECORD_DTYPE]
        if odd:
            raise TypeError(f"expected records of RECORD_DTYPE, got {type(odd[0]).__name__}")
        array = np.asarray(records, dtype=RECORD_DTYPE)
    if array.dtype != RECORD_DTYPE:
        raise TypeError(f"expected records of RECORD_DTYPE, got dtype {array.dtype}")
    if array.size == 0:
        raise ValueError(f"refusing to write {os.fspath(path)}: a chunk needs at least one record")
    check_records(array)
    with atomic_open(path, "wb") as f:
        with gzip.GzipFile(fileobj=f, mode="wb", mtime=0) as gz:
            gz.write(np.ascontiguousarray(array).tobytes())
    return int(array.size)


def read_chunk(path: str | os.PathLike) -> np.ndarray:
    """The records of a gzip chunk, as a RECORD_DTYPE array in input format 1.

    Records of lc0's input format 2 are converted (:func:`to_classical`).  Raises
    :class:`ChunkError` naming the file when it is not gzip, is truncated, holds a
    partial record, no record, or records of another version or input format.
    """
    name = os.fspath(path)
    try:
        with gzip.open(name, "rb") as gz:
            data = gz.read()
    except (OSError, EOFError, zlib.error) as exc:
        raise ChunkError(f"chunk {name} cannot be read: {exc}") from exc
    return parse_chunk(data, name)


def parse_chunk(data: bytes, name: str) -> np.ndarray:
    """The records in a chunk's decompressed bytes (see :func:`read_chunk`); ``name`` is for messages."""
    if len(data) >= 8:
        version, fmt = (int(v) for v in np.frombuffer(data[:8], dtype="<u4"))
        if version != RECORD_VERSION:   # another version has another record size: say so first
            raise ChunkError(
                f"chunk {name} holds training data version {version} with input format {fmt}; "
                f"only version {RECORD_VERSION} can be read"
            )
    if not data or len(data) % RECORD_BYTES:
        raise ChunkError(
            f"chunk {name} holds {len(data)} bytes, not a whole number of {RECORD_BYTES}-byte records"
            + (" (empty)" if not data else "")
        )
    records = np.frombuffer(data, dtype=RECORD_DTYPE)
    try:
        records = to_classical(records)
    except ValueError as exc:
        raise ChunkError(f"chunk {name}: {exc}") from exc
    return records
