# cython: language_level=3
"""lc0-compatible network input and policy map.

Input: lc0's classical 112-plane format (8 history positions x 13 planes from
the side to move's view, castling, side to move, rule50, zeros, ones), filled
straight into a caller's float32 buffer. Policy: lc0's 1858-move index, moves
seen from the side to move (mirrored for black), castling as king-takes-rook,
knight promotions on the plain from-to entry.
"""

import operator

import numpy as np
cimport numpy as cnp

from libc.math cimport exp
from libc.string cimport memset, memcpy
from libc.stdint cimport int16_t, uint64_t

from engine.board cimport (Board, Pos, Undo, Move, MAX_MOVES, WHITE, BLACK, PAWN, KNIGHT,
                           BISHOP, ROOK, QUEEN, KING, gen_legal, unmake_move, cz_lsb)

cnp.import_array()

cdef extern from *:
    """
    static inline unsigned long long cz_bswap64(unsigned long long b) { return __builtin_bswap64(b); }
    """
    uint64_t cz_bswap64(uint64_t b) nogil

ctypedef uint64_t u64

# ---------------------------------------------------------------------------
# The policy map.

cdef int16_t FROM_TO[64 * 64]        # from * 64 + to (side-to-move view) -> index, -1 when none
cdef int16_t PROMO[8][3][3]          # from file, to file - from file + 1, (q, r, b) -> index
cdef Move INDEX_MOVE[POLICY_MOVES]   # index -> from | to << 6 | promo << 12, white's view


cdef list _build_policy_table():
    names = []
    cdef int frm, to, df, dr, n = 0, f, d, k
    for i in range(64 * 64):
        FROM_TO[i] = -1
    for frm in range(64):
        for to in range(64):
            if frm == to:
                continue
            df = (to & 7) - (frm & 7)
            dr = (to >> 3) - (frm >> 3)
            if df == 0 or dr == 0 or df == dr or df == -dr or (abs(df) * abs(dr) == 2):
                FROM_TO[frm * 64 + to] = n
                INDEX_MOVE[n] = <Move>(frm | (to << 6))
                names.append(_square_name(frm) + _square_name(to))
                n += 1
    promo_pieces = (QUEEN, ROOK, BISHOP)
    for f in range(8):
        for d in range(-1, 2):
            if not 0 <= f + d < 8:
                continue
            for k in range(3):
                frm = 48 + f
                to = 56 + f + d
                PROMO[f][d + 1][k] = n
                INDEX_MOVE[n] = <Move>(frm | (to << 6) | (promo_pieces[k] << 12))
                names.append(_square_name(frm) + _square_name(to) + "qrb"[k])
                n += 1
    assert n == POLICY_MOVES, n
    return names


def _square_name(int sq):
    return "abcdefgh"[sq & 7] + "12345678"[sq >> 3]


POLICY_INDEX = _build_policy_table()
# The contract's sizes for Python (engine.network, trainer, tools, tests import these):
# input planes per position and policy entries. Defined once, in engine/encoding.pxd.
PLANES = INPUT_PLANES
POLICY_SIZE = POLICY_MOVES


cdef int move_index(const Pos* p, Move m) noexcept nogil:
    cdef int frm = m & 63
    cdef int to = (m >> 6) & 63
    cdef int promo = m >> 12
    if p.turn == BLACK:
        frm ^= 56
        to ^= 56
    if promo and promo != KNIGHT:
        return PROMO[frm & 7][(to & 7) - (frm & 7) + 1][QUEEN - promo]
    return FROM_TO[frm * 64 + to]


# ---------------------------------------------------------------------------
# Input planes.

cdef inline void _fill(float* plane, float value) noexcept nogil:
    cdef int i
    for i in range(64):
        plane[i] = value


cdef inline void _set_squares(float* plane, u64 b, float value) noexcept nogil:
    if b == ~0ULL:
        _fill(plane, value)
        return
    while b:
        plane[cz_lsb(b)] = value
        b &= b - 1


cdef inline void _piece_bits(const Pos* p, int us, u64* bits) noexcept nogil:
    """The 12 piece planes of one history slot, from the side to move's view, as bitboards."""
    cdef int pt
    cdef u64 ours, theirs
    for pt in range(1, 7):
        ours = p.pieces[pt] & p.colors[us]
        theirs = p.pieces[pt] & p.colors[1 - us]
        if us == BLACK:
            ours = cz_bswap64(ours)
            theirs = cz_bswap64(theirs)
        bits[pt - 1] = ours
        bits[pt + 5] = theirs


cdef inline bint _is_standard_start(const Pos* p) noexcept nogil:
    return (p.turn == WHITE
            and p.castle == 0x8100000000000081ULL
            and p.colors[WHITE] == 0xFFFFULL
            and p.colors[BLACK] == 0xFFFF000000000000ULL
            and p.pieces[PAWN] == 0x00FF00000000FF00ULL
            and p.pieces[KNIGHT] == 0x4200000000000042ULL
            and p.pieces[BISHOP] == 0x2400000000000024ULL
            and p.pieces[ROOK] == 0x8100000000000081ULL
            and p.pieces[QUEEN] == 0x0800000000000008ULL
            and p.pieces[KING] == 0x1000000000000010ULL)


cdef inline bint _occurred_before(const Pos* p, const Undo* stack, int ply) noexcept nogil:
    """Whether the position at ``ply`` of the game (key p.key) occurred at an earlier ply."""
    cdef int j = ply - 2
    cdef long long lo = ply - p.halfmove
    if lo < 0:
        lo = 0
    while j >= lo:
        if stack[j].key == p.key:
            return True
        j -= 2
    return False


cdef inline void _castling_sides(const Pos* p, int color, bint* a_side, bint* h_side) noexcept nogil:
    cdef u64 backrank = 0xFFULL if color == WHITE else 0xFF00000000000000ULL
    cdef u64 rights = p.castle & backrank
    cdef int kfile = p.ksq[color] & 7
    a_side[0] = False
    h_side[0] = False
    while rights:
        if (cz_lsb(rights) & 7) < kfile:
            a_side[0] = True
        else:
            h_side[0] = True
        rights &= rights - 1


cdef void _history_bits(const Pos* cur, const Undo* stack, int nstack, int start_ep,
                        u64* bits) noexcept nogil:
    """Planes 0-103 (8 history slots of 12 piece planes and a repetition plane) as bitboards:
    the squares that hold 1.0."""
    cdef int us = cur.turn
    cdef int i, k, slots, ply, pawn_sq, from_sq
    cdef Pos p = cur[0]
    memset(bits, 0, HISTORY_PLANES * sizeof(u64))
    slots = nstack + 1 if nstack < 7 else 8
    for i in range(slots):
        ply = nstack - i
        if i:
            unmake_move(&p, &stack[ply])
        _piece_bits(&p, us, bits + i * 13)
        if _occurred_before(&p, stack, ply):
            bits[i * 13 + 12] = ~0ULL
    if slots == 8 or _is_standard_start(&p):
        return
    # A game from a FEN: repeat the oldest position, with a pawn that just double-pushed
    # shown on its starting square.
    if start_ep >= 0:
        if (start_ep >> 3) == 2:   # white pushed: ep on the 3rd rank
            pawn_sq = start_ep + 8
            from_sq = start_ep - 8
        else:
            pawn_sq = start_ep - 8
            from_sq = start_ep + 8
        p.pieces[PAWN] ^= (1ULL << pawn_sq) | (1ULL << from_sq)
        p.colors[p.board[pawn_sq] >> 3] ^= (1ULL << pawn_sq) | (1ULL << from_sq)
        _piece_bits(&p, us, bits + slots * 13)
    else:
        for k in range(12):
            bits[slots * 13 + k] = bits[(slots - 1) * 13 + k]
    for i in range(slots + 1, 8):
        for k in range(12):
            bits[i * 13 + k] = bits[slots * 13 + k]


cdef inline void _write_state(const Pos* cur, float* out) noexcept nogil:
    """Planes 104-111 (castling, side to move, rule50, zeros, ones), every square written."""
    cdef int us = cur.turn
    cdef bint a_side, h_side
    _castling_sides(cur, us, &a_side, &h_side)
    _fill(out + 104 * 64, 1.0 if a_side else 0.0)
    _fill(out + 105 * 64, 1.0 if h_side else 0.0)
    _castling_sides(cur, 1 - us, &a_side, &h_side)
    _fill(out + 106 * 64, 1.0 if a_side else 0.0)
    _fill(out + 107 * 64, 1.0 if h_side else 0.0)
    _fill(out + 108 * 64, 1.0 if us == BLACK else 0.0)
    _fill(out + 109 * 64, <float>cur.halfmove)
    _fill(out + 110 * 64, 0.0)
    _fill(out + 111 * 64, 1.0)


cdef void encode_planes(const Pos* cur, const Undo* stack, int nstack, int start_ep,
                        float* out) noexcept nogil:
    cdef u64 bits[HISTORY_PLANES]
    cdef int k
    _history_bits(cur, stack, nstack, start_ep, bits)
    memset(out, 0, HISTORY_PLANES * 64 * sizeof(float))
    for k in range(HISTORY_PLANES):
        _set_squares(out + k * 64, bits[k], 1.0)
    _write_state(cur, out)


cdef void encode_planes_over(const Pos* cur, const Undo* stack, int nstack, int start_ep,
                             float* out, u64* last) noexcept nogil:
    cdef u64 bits[HISTORY_PLANES]
    cdef int k
    _history_bits(cur, stack, nstack, start_ep, bits)
    for k in range(HISTORY_PLANES):
        if bits[k] != last[k]:
            _set_squares(out + k * 64, last[k] & ~bits[k], 0.0)
            _set_squares(out + k * 64, bits[k] & ~last[k], 1.0)
            last[k] = bits[k]
    _write_state(cur, out)


cdef int legal_priors(const Pos* p, const float* logits, float temperature,
                      Move* moves, float* priors) noexcept nogil:
    cdef int n = gen_legal(p, moves)
    policy_priors(p, moves, n, logits, temperature, priors)
    return n


cdef void policy_priors(const Pos* p, const Move* moves, int n, const float* logits, float temperature,
                        float* priors) noexcept nogil:
    cdef int i
    cdef float hi = -3.0e38, x
    cdef double total = 0.0, inv_t
    if n == 0:
        return
    inv_t = 1.0 / temperature if temperature > 0 else 1.0
    for i in range(n):
        x = logits[move_index(p, moves[i])]
        priors[i] = x
        if x > hi and x == x and x < 3.0e38:
            hi = x
    for i in range(n):
        x = priors[i]
        # Subtract the largest logit before scaling: exact for huge logits, no overflow.
        priors[i] = <float>exp((x - hi) * inv_t) if (x == x and x <= hi) else 0.0
        total += priors[i]
    if not total > 0:   # NaN or no finite logit: fall back to uniform rather than poison the tree
        for i in range(n):
            priors[i] = 1.0 / n
        return
    for i in range(n):
        priors[i] = <float>(priors[i] / total)


# ---------------------------------------------------------------------------
# Python access, for tests, tools and the trainer.

def encode_board(Board board not None, out=None):
    """The [112, 8, 8] float32 input for ``board`` and its move history."""
    if out is None:
        out = np.empty((INPUT_PLANES, 8, 8), dtype=np.float32)
    cdef float[:, :, ::1] view = _checked_buffer(out, (INPUT_PLANES, 8, 8))
    with nogil:
        encode_planes(&board.pos, board.stack, board.nstack, board.start_ep, &view[0, 0, 0])
    return out


def encode_boards(boards, out=None):
    """Stack the inputs of several boards into one [N, 112, 8, 8] float32 array."""
    boards = list(boards)
    cdef Py_ssize_t n = len(boards), i
    if out is None:
        out = np.empty((n, INPUT_PLANES, 8, 8), dtype=np.float32)
    cdef float[:, :, :, ::1] view = _checked_buffer(out, (n, INPUT_PLANES, 8, 8))
    cdef Board b
    for i in range(n):
        b = boards[i]
        with nogil:
            encode_planes(&b.pos, b.stack, b.nstack, b.start_ep, &view[i, 0, 0, 0])
    return out


def _checked_buffer(out, shape):
    if not isinstance(out, np.ndarray) or out.dtype != np.float32 or out.shape != tuple(shape) \
            or not out.flags.c_contiguous or not out.flags.writeable:
        raise ValueError(f"out must be a writable C-contiguous float32 array of shape {tuple(shape)}")
    return out


def encode_position(fen=None, moves=(), *, bint chess960=False):
    """The input planes of the position reached by playing ``moves`` (UCI) from ``fen``."""
    board = Board(fen, chess960=chess960)
    for move in moves:
        board.push_uci(move)
    return encode_board(board)


cdef Move _legal_move(Board board, str uci) except 0:
    return board._parse_uci(uci)


def move_to_index(Board board not None, uci):
    """Policy index of the legal move ``uci`` in ``board``'s position."""
    if not isinstance(uci, str):
        raise TypeError(f"move must be a str, not {type(uci).__name__}")
    return move_index(&board.pos, _legal_move(board, uci))


def index_to_move(Board board not None, index):
    """The legal move of ``board`` with policy index ``index``, in the board's UCI notation."""
    index = operator.index(index)
    if not 0 <= index < POLICY_MOVES:
        raise ValueError(f"policy index must be 0..{POLICY_MOVES - 1}, got {index}")
    cdef Move moves[MAX_MOVES]
    cdef int n = gen_legal(&board.pos, moves), i
    for i in range(n):
        if move_index(&board.pos, moves[i]) == index:
            return board.legal_moves()[i]
    raise ValueError(f"policy index {index} ({POLICY_INDEX[index]} from the side to move's view) "
                     f"is not a legal move in {board.fen()}")


def legal_mask(Board board not None):
    """Boolean [1858] mask of the legal moves' policy indices."""
    mask = np.zeros(POLICY_MOVES, dtype=bool)
    cdef Move moves[MAX_MOVES]
    cdef int n = gen_legal(&board.pos, moves), i
    for i in range(n):
        mask[move_index(&board.pos, moves[i])] = True
    return mask


def legal_policy(Board board not None, logits, float temperature=1.0):
    """Legal moves (UCI) and their softmax probabilities over ``logits`` [1858] at ``temperature``."""
    if temperature <= 0:
        raise ValueError(f"policy temperature must be > 0, got {temperature}")
    array = np.ascontiguousarray(logits, dtype=np.float32).reshape(-1)
    if array.shape[0] != POLICY_MOVES:
        raise ValueError(f"logits must have {POLICY_MOVES} entries, got {array.shape[0]}")
    if not np.isfinite(array).all():
        raise ValueError("logits must be finite numbers (got NaN or infinity)")
    cdef float[::1] lg = array
    cdef Move moves[MAX_MOVES]
    cdef float priors[MAX_MOVES]
    cdef int n = legal_priors(&board.pos, &lg[0], temperature, moves, priors)
    # legal_moves() lists the moves in gen_legal's order, so names and priors line up.
    names = board.legal_moves()
    return names, np.array([priors[i] for i in range(n)], dtype=np.float32)
