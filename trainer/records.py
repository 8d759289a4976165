"""lc0's V6 training record: write one from a searched position, read it back as network targets.

The layout is lc0's ``V6TrainingData`` (8,356 bytes, packed, little-endian), so
lc0's tools read our data and we read theirs.  A record is written in the input
format of the network that played it (:func:`make_record`'s ``input_format``):
lc0's classical 112 planes (1), or one of the formats that store the castling
rooks' files (2) and canonicalise the board (3 and up), as the engine's encoder
(:mod:`engine.encoding`) produces them.  A reader asks for one format and gets
records in it: the same format as they are, lc0's format 2 converted to format 1
(:func:`in_format`); any other mix is refused with a message naming both.

Planes 0..103 (8 history slots x 13) are stored as uint64 bitboards with the
bits of each byte reversed, as lc0 writes them: square a1 is the top bit of
the first byte, so ``np.unpackbits(..., bitorder="big")`` yields the squares
a1, b1, ..., h8 in order.  Planes 104..111 are not stored as planes: four
castling bytes, the side to move (format 1, 2) or the en passant file (3 and
up), the rule-50 count, and ``invariance_info``, whose low three bits hold a
canonical format's transform and whose top bit says black is to move (lc0's
``V6TrainingData`` comment).  For the canonical formats the history planes and
the policy are in the transformed frame, as the network sees them.  The policy
holds the visit share of each legal move and -1 on every illegal index.

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
from engine.encoding import (
    INPUT_FORMATS, POLICY_SIZE, canonical_transform, encode_board, legal_mask, move_to_index,
)
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
    "in_format",
    "readable_as",
    "decode_record",
    "decode_records",
    "compress_records",
    "inflate_records",
    "write_chunk",
    "write_chunk_members",
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
#: The formats that canonicalise the board and store the en passant file (lc0's IsCanonicalFormat).
CANONICAL_FORMATS = frozenset({3, 4, 5, 132, 133})
#: The formats whose rule-50 plane is in hundreds of plies (the others: in plies).
HECTOPLIES_FORMATS = frozenset({4, 5, 132, 133})
#: The formats whose plane 110 is all ones when black is to move.
ARMAGEDDON_FORMATS = frozenset({132, 133})
HISTORY_PLANES = 104
INPUT_PLANES = 112

# invariance_info bits lc0 sets in every format: the game was adjudicated, it reached the length limit.
ADJUDICATED_BIT = 1 << 5
MAX_LENGTH_BIT = 1 << 4
# The canonical formats' own: black to move (the side-to-move byte holds the en passant file there);
# bits 0-2 hold the transform (flip, mirror, transpose).
BLACK_TO_MOVE_BIT = 1 << 7

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
    input_format: int = INPUT_FORMAT_CLASSICAL,
) -> np.void:
    """One V6 record for ``board`` (with its move history) after a search, in ``input_format``
    (lc0's, the format of the network that searched: its planes, fields and policy indices).

    ``visits`` maps legal UCI moves to their visit counts (moves left out count 0),
    or to any non-negative weights (a teacher's softmaxed MultiPV scores); the
    policy target is their share.  ``nodes`` is the record's visit count field
    (default: the sum of ``visits``, rounded).  ``result_q``/``result_d`` are the game's
    outcome from the side to move's view.  ``best`` defaults to the most visited
    move; ``best_eval`` and ``played_eval`` default to ``root``.
    """
    if not visits:
        raise ValueError("a training record needs the search's visits; got none")
    if input_format not in INPUT_FORMATS:
        raise ValueError(f"input format {input_format!r} is not one of lc0's {INPUT_FORMATS}")
    _check_result(result_q, result_d, "game result")
    fmt = input_format
    legal = legal_mask(board, fmt)
    probabilities = np.full(POLICY_SIZE, -1.0, dtype=np.float32)
    probabilities[legal] = 0.0
    counts = {}
    for move, n in visits.items():
        if not board.is_legal(move):
            raise ValueError(f"visits name {move!r}, not a legal move in {board.fen()}")
        if n < 0:
            raise ValueError(f"visits of {move} must be >= 0, got {n}")
        counts[move_to_index(board, move, fmt)] = float(n)
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

    planes = encode_board(board, input_format=fmt)
    rule50 = round(float(planes[109, 0, 0]) * (100 if fmt in HECTOPLIES_FORMATS else 1))
    if rule50 > 255:
        raise ValueError(f"rule-50 count {rule50} does not fit lc0's uint8 field")

    record = np.zeros((), dtype=RECORD_DTYPE)
    record["version"] = RECORD_VERSION
    record["input_format"] = fmt
    record["probabilities"] = probabilities
    record["planes"] = _pack_planes(planes[None, :HISTORY_PLANES])[0]
    if fmt == INPUT_FORMAT_CLASSICAL:   # one flag a byte
        for field, plane in zip(_CASTLING_FIELDS, range(104, 108)):
            record[field] = planes[plane, 0, 0]
    else:   # the castling rooks' files, 1 << file: ours on plane 104/105's first rank, theirs on its last
        record["castling_us_ooo"], record["castling_them_ooo"] = _file_mask(planes[104, 0]), _file_mask(planes[104, 7])
        record["castling_us_oo"], record["castling_them_oo"] = _file_mask(planes[105, 0]), _file_mask(planes[105, 7])
    invariance = (ADJUDICATED_BIT if adjudicated else 0) | (MAX_LENGTH_BIT if max_length_exceeded else 0)
    if fmt in CANONICAL_FORMATS:   # the en passant file (on the last rank), the transform, black to move
        record["side_to_move_or_enpassant"] = _file_mask(planes[108, 7])
        invariance |= canonical_transform(board, fmt) | (0 if board.turn else BLACK_TO_MOVE_BIT)
    else:
        record["side_to_move_or_enpassant"] = planes[108, 0, 0]
    record["rule50_count"] = rule50
    record["invariance_info"] = invariance
    record["root_q"], record["root_d"], record["root_m"] = root
    record["best_q"], record["best_d"], record["best_m"] = best_eval
    record["played_q"], record["played_d"], record["played_m"] = played_eval
    record["orig_q"], record["orig_d"], record["orig_m"] = orig
    record["plies_left"] = plies_left
    record["result_q"] = result_q
    record["result_d"] = result_d
    record["visits"] = int(round(total)) if nodes is None else int(nodes)
    record["played_idx"] = move_to_index(board, played, fmt)
    record["best_idx"] = move_to_index(board, best, fmt)
    record["policy_kld"] = policy_kld
    return cast(np.void, record[()])


_FILE_BITS = (1 << np.arange(8)).astype(np.uint8)


def _file_mask(rank: np.ndarray) -> int:
    """One rank of a plane (8 squares, a..h) as lc0's byte: 1 << file for each square set."""
    return int(np.dot(rank != 0, _FILE_BITS.astype(np.int64)))


def _file_bits(masks: np.ndarray) -> np.ndarray:
    """[N] bytes of ``1 << file`` -> [N, 8] float32 ranks (a..h): :func:`_file_mask` undone."""
    return ((masks.astype(np.uint8)[:, None] & _FILE_BITS) != 0).astype(np.float32)


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


def _format_name(fmt: int) -> str:
    return f"input format {fmt} ({INPUT_FORMAT_NAMES.get(fmt, 'unknown to lc0')})"


def check_records(records: np.ndarray, input_format: int | None = None) -> None:
    """Raise ``ValueError`` naming the format unless every record is version 6 and all share one of
    lc0's input formats (``input_format`` when given)."""
    versions = records["version"]
    formats = records["input_format"]
    bad = np.flatnonzero((versions != RECORD_VERSION) | ~np.isin(formats, INPUT_FORMATS))
    if bad.size:
        i = int(bad[0])
        raise ValueError(
            f"record {i} is training data version {int(versions.flat[i])} with input format "
            f"{int(formats.flat[i])}; only version {RECORD_VERSION} with one of lc0's input formats "
            f"{INPUT_FORMATS} can be read"
        )
    wanted = int(formats.flat[0]) if input_format is None and formats.size else input_format
    bad = np.flatnonzero(formats != wanted)
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"record {i} has {_format_name(int(formats.flat[i]))}, the others {_format_name(wanted)}"
                         if input_format is None else
                         f"record {i} has {_format_name(int(formats.flat[i]))}, not {_format_name(wanted)}")


def readable_as(fmt: int, input_format: int) -> bool:
    """Whether records of lc0's input format ``fmt`` are read as ``input_format``: the same format,
    or format 2 as format 1 (:func:`in_format`)."""
    return fmt == input_format or (fmt == INPUT_FORMAT_CASTLING_PLANE and input_format == INPUT_FORMAT_CLASSICAL)


def in_format(records: np.ndarray, input_format: int = INPUT_FORMAT_CLASSICAL) -> np.ndarray:
    """``records`` in ``input_format``: the array itself when they are, a converted copy of lc0's
    format-2 records when format 1 is asked for; ``ValueError`` names the formats otherwise.

    lc0's input format 2 (``INPUT_112_WITH_CASTLING_PLANE``) differs from format 1
    in the record only in its four castling bytes: lc0 writes ``1 << rook file``
    (1 for the a-file rook, 128 for the h-file one) where format 1 writes 1.  The
    history planes, side to move, rule-50 count and policy are the same, so any
    nonzero castling byte becomes 1 (a Chess960 rook's file is lost: format 1
    cannot express it).  The canonical formats (3 and up) flip, mirror and transpose
    the board and store the en passant file in place of the side to move: a network
    of one of them trains on records written in it.
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
    same = formats == input_format
    if same.all():
        return records
    convertible = (formats == INPUT_FORMAT_CASTLING_PLANE) & (input_format == INPUT_FORMAT_CLASSICAL)
    bad = np.flatnonzero(~same & ~convertible)
    if bad.size:
        i = int(bad[0])
        fmt = int(formats.flat[i])
        raise ValueError(
            f"record {i} has {_format_name(fmt)}, which cannot be converted to {_format_name(input_format)}"
            + (": canonicalised boards with the en passant file in place of the side to move"
               if fmt in CANONICAL_FORMATS else "")
            + f"; a network of {_format_name(input_format)} trains on records written in it"
            + (" (or format 2)" if input_format == INPUT_FORMAT_CLASSICAL else "")
        )
    converted = records.copy()
    for field in _CASTLING_FIELDS:
        converted[field] = converted[field] != 0
    converted["input_format"] = INPUT_FORMAT_CLASSICAL
    return converted


def _aux_planes(records: np.ndarray, fmt: int) -> np.ndarray:
    """Planes 104..111 of N records of input format ``fmt``, as the engine's encoder makes them."""
    n = records.shape[0]
    aux = np.zeros((n, 8, 8, 8), dtype=np.float32)
    if fmt == INPUT_FORMAT_CLASSICAL:
        for plane, field in enumerate((*_CASTLING_FIELDS, "side_to_move_or_enpassant"), start=0):
            aux[:, plane] = records[field].astype(np.float32)[:, None, None]
    else:
        aux[:, 0, 0], aux[:, 0, 7] = _file_bits(records["castling_us_ooo"]), _file_bits(records["castling_them_ooo"])
        aux[:, 1, 0], aux[:, 1, 7] = _file_bits(records["castling_us_oo"]), _file_bits(records["castling_them_oo"])
        if fmt in CANONICAL_FORMATS:
            aux[:, 4, 7] = _file_bits(records["side_to_move_or_enpassant"])
        else:
            aux[:, 4] = records["side_to_move_or_enpassant"].astype(np.float32)[:, None, None]
    rule50 = records["rule50_count"].astype(np.float32)
    aux[:, 5] = (rule50 / 100 if fmt in HECTOPLIES_FORMATS else rule50)[:, None, None]
    if fmt in ARMAGEDDON_FORMATS:
        aux[:, 6] = ((records["invariance_info"] & BLACK_TO_MOVE_BIT) != 0).astype(np.float32)[:, None, None]
    aux[:, 7] = 1.0
    return aux


def decode_records(records: np.ndarray, *, q_ratio: float = 0.0,
                   input_format: int = INPUT_FORMAT_CLASSICAL) -> Sample:
    """Network inputs and targets of N records (a RECORD_DTYPE array), each with a leading N axis,
    in ``input_format`` (records of lc0's format 2 are converted to format 1: :func:`in_format`).

    The planes are what the engine's encoder gives a network of that format.  ``q_ratio`` mixes
    the search's value of its best move (``best_q``, ``best_d``) into the WDL target, the rest
    being the game result, as lc0's trainer does: one result is a noisy label for every position
    of its game.  A record without a best-move value (NaN) keeps its result.
    """
    if not 0.0 <= q_ratio <= 1.0:
        raise ValueError(f"q_ratio must be in [0, 1], got {q_ratio}")
    records = np.atleast_1d(np.asarray(records))
    if records.dtype != RECORD_DTYPE:
        raise TypeError(f"expected records of RECORD_DTYPE, got dtype {records.dtype}")
    records = in_format(records, input_format)
    check_records(records, input_format)   # one of lc0's formats, the one asked for
    n = records.shape[0]
    planes = np.zeros((n, INPUT_PLANES, 8, 8), dtype=np.float32)
    planes[:, :HISTORY_PLANES] = _unpack_planes(records["planes"])
    planes[:, HISTORY_PLANES:] = _aux_planes(records, input_format)
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
    """Network inputs and targets of one record (a RECORD_DTYPE scalar or its 8,356 bytes), in its
    own input format (format 2 as format 1)."""
    if isinstance(record, (bytes, bytearray, memoryview)):
        if len(record) != RECORD_BYTES:
            raise ValueError(f"a V6 record is {RECORD_BYTES} bytes, got {len(record)}")
        records = np.frombuffer(record, dtype=RECORD_DTYPE)
    else:
        records = np.asarray(record)
    fmt = int(records["input_format"].flat[0])
    planes, policy, wdl, plies_left = decode_records(
        records, input_format=INPUT_FORMAT_CLASSICAL if fmt == INPUT_FORMAT_CASTLING_PLANE else fmt)
    return Sample(planes[0], policy[0], wdl[0], plies_left[0])


# The chunks' gzip level: 9, the most compact (self-play records shrink about 60x), at about 22 MB/s
# a core. A worker compresses each of its games once (compress_records), so the daemon, which stores
# every worker's games, only inflates them to check them (about 600 MB/s).
GZIP_LEVEL = 9


def compress_records(records: np.ndarray) -> bytes:
    """``records`` (RECORD_DTYPE) as one gzip member. A chunk whose games each arrived as a member is
    those members one after another, which gzip (and lc0) read as one stream."""
    return gzip.compress(np.ascontiguousarray(records).tobytes(), compresslevel=GZIP_LEVEL, mtime=0)


def inflate_records(member: bytes | memoryview, positions: int, input_format: int | None = None) -> np.ndarray:
    """The ``positions`` records of one gzip member, checked (:func:`check_records`); ValueError when
    the member is not exactly that: not gzip, truncated, more than one member, or longer (inflating
    stops at the size expected, so a gzip bomb costs nothing)."""
    expected = positions * RECORD_BYTES
    inflater = zlib.decompressobj(wbits=31)   # gzip framing
    try:
        data = inflater.decompress(member, expected + 1)
    except zlib.error as e:
        raise ValueError(f"not a gzip member of records: {e}") from None
    if len(data) != expected or not inflater.eof or inflater.unused_data:
        raise ValueError(f"a gzip member of {len(member):,} bytes does not hold exactly {positions} records "
                         f"({expected:,} bytes)")
    records = np.frombuffer(data, dtype=RECORD_DTYPE)
    check_records(records, input_format)
    return records


def write_chunk_members(path: str | os.PathLike, members: Iterable[bytes]) -> None:
    """Write a chunk of games already compressed (:func:`compress_records`, checked by
    :func:`inflate_records`) atomically, as they are."""
    with atomic_open(path, "wb") as f:
        for member in members:
            f.write(member)


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


def read_chunk(path: str | os.PathLike, input_format: int = INPUT_FORMAT_CLASSICAL) -> np.ndarray:
    """The records of a gzip chunk, as a RECORD_DTYPE array in ``input_format``.

    Records of lc0's input format 2 are converted to format 1 (:func:`in_format`).  Raises
    :class:`ChunkError` naming the file when it is not gzip, is truncated, holds a
    partial record, no record, or records of another version or input format.
    """
    name = os.fspath(path)
    try:
        with gzip.open(name, "rb") as gz:
            data = gz.read()
    except (OSError, EOFError, zlib.error) as exc:
        raise ChunkError(f"chunk {name} cannot be read: {exc}") from exc
    return parse_chunk(data, name, input_format)


def parse_chunk(data: bytes, name: str, input_format: int = INPUT_FORMAT_CLASSICAL) -> np.ndarray:
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
        records = in_format(records, input_format)
    except ValueError as exc:
        raise ChunkError(f"chunk {name}: {exc}") from exc
    return records
