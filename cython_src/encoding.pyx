# cython: language_level=3
"""lc0-compatible network input and policy map.

Input: lc0's classical 112-plane format (8 history positions x 13 planes from
the side to move's view, castling, side to move, rule50, zeros, ones), filled
straight into a caller's float32 buffer. Policy: lc0's 1858-move index, moves
seen from the side to move (mirrored for black), castling as king-takes-rook,
knight promotions on the plain from-to entry.

Every other input format lc0 v0.32.1 plays is written too, behind ``input_format``
(lc0's NetworkFormat.InputFormat numbers, INPUT_FORMATS): 2 (castling rights as the
castling rooks' squares), 3 (canonicalized: the position flipped, mirrored and/or
transposed as lc0 chooses, plane 108 the en-passant square, history cut at irreversible
changes), 4 (3 with the rule50 plane in hundreds of plies), 132 (4 with an armageddon
side-to-move plane), 5 and 133 (canonical v2: the history keeps only repeated positions;
133 with the armageddon plane). The policy index of a move follows the position's
transform, the way lc0 v0.31 and earlier (and networks trained for these formats) read
it: the transpose is the reflection in the a8-h1 diagonal the planes go through. lc0
v0.32 rotates squares by 180 degrees instead (PR #2126), inconsistent with its own planes.
Format 1 keeps its own code path (encode_planes, encode_planes_over, move_index).
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


cdef inline int _policy_entry(int frm, int to, int promo) noexcept nogil:
    """The policy index of a move by its squares as the side to move sees them (black's flipped)."""
    if promo and promo != KNIGHT:
        return PROMO[frm & 7][(to & 7) - (frm & 7) + 1][QUEEN - promo]
    return FROM_TO[frm * 64 + to]


cdef int move_index(const Pos* p, Move m) noexcept nogil:
    cdef int flip = 56 if p.turn == BLACK else 0
    return _policy_entry((m & 63) ^ flip, ((m >> 6) & 63) ^ flip, m >> 12)


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


cdef inline void _write_history(const u64* bits, float* out) noexcept nogil:
    """The 104 history planes from their bitboards, into a cleared buffer."""
    cdef int k
    memset(out, 0, HISTORY_PLANES * 64 * sizeof(float))
    for k in range(HISTORY_PLANES):
        _set_squares(out + k * 64, bits[k], 1.0)


cdef inline void _rewrite_history(const u64* bits, float* out, u64* last) noexcept nogil:
    """The 104 history planes over the ones ``last`` says ``out`` holds: only changed squares are written."""
    cdef int k
    for k in range(HISTORY_PLANES):
        if bits[k] != last[k]:
            _set_squares(out + k * 64, last[k] & ~bits[k], 0.0)
            _set_squares(out + k * 64, bits[k] & ~last[k], 1.0)
            last[k] = bits[k]


cdef void encode_planes(const Pos* cur, const Undo* stack, int nstack, int start_ep,
                        float* out) noexcept nogil:
    cdef u64 bits[HISTORY_PLANES]
    _history_bits(cur, stack, nstack, start_ep, bits)
    _write_history(bits, out)
    _write_state(cur, out)


cdef void encode_planes_over(const Pos* cur, const Undo* stack, int nstack, int start_ep,
                             float* out, u64* last) noexcept nogil:
    cdef u64 bits[HISTORY_PLANES]
    _history_bits(cur, stack, nstack, start_ep, bits)
    _rewrite_history(bits, out, last)
    _write_state(cur, out)


cdef int legal_priors(const Pos* p, const float* logits, float temperature,
                      Move* moves, float* priors) noexcept nogil:
    cdef int n = gen_legal(p, moves)
    policy_priors(p, moves, n, logits, temperature, priors)
    return n


cdef inline void _softmax_priors(float* priors, int n, float hi, float temperature) noexcept nogil:
    """``priors[:n]`` hold the moves' logits and ``hi`` the largest finite one (n > 0): make them
    the softmax at ``temperature``."""
    cdef int i
    cdef float x
    cdef double total = 0.0, inv_t
    inv_t = 1.0 / temperature if temperature > 0 else 1.0
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


cdef void policy_priors(const Pos* p, const Move* moves, int n, const float* logits, float temperature,
                        float* priors) noexcept nogil:
    cdef int i
    cdef float hi = -3.0e38, x
    if n == 0:
        return
    for i in range(n):
        x = logits[move_index(p, moves[i])]
        priors[i] = x
        if x > hi and x == x and x < 3.0e38:
            hi = x
    _softmax_priors(priors, n, hi, temperature)


# ---------------------------------------------------------------------------
# lc0's other input formats (2, 3, 4, 132, 5, 133) and their canonical transforms.

INPUT_FORMATS = (1, 2, 3, 4, 5, 132, 133)


cdef bint format_supported(int input_format) noexcept nogil:
    return (input_format == 1 or input_format == 2 or input_format == 3 or input_format == 4
            or input_format == 5 or input_format == 132 or input_format == 133)


cdef inline bint _canonical(int f) noexcept nogil:
    return f >= 3


cdef inline bint _hectoplies(int f) noexcept nogil:
    return f >= 4


cdef inline bint _armageddon(int f) noexcept nogil:
    return f == 132 or f == 133


cdef inline bint _repeats_only(int f) noexcept nogil:
    return f == 5 or f == 133


cdef inline u64 _flip_files(u64 v) noexcept nogil:
    """Each rank's files reversed (a <-> h)."""
    v = ((v >> 1) & 0x5555555555555555ULL) | ((v & 0x5555555555555555ULL) << 1)
    v = ((v >> 2) & 0x3333333333333333ULL) | ((v & 0x3333333333333333ULL) << 2)
    v = ((v >> 4) & 0x0F0F0F0F0F0F0F0FULL) | ((v & 0x0F0F0F0F0F0F0F0FULL) << 4)
    return v


cdef inline u64 _anti_transpose(u64 v) noexcept nogil:
    """Reflection in the a8-h1 diagonal: the square (rank r, file f) goes to (7 - f, 7 - r)."""
    cdef u64 t
    t = (v ^ (v << 9)) & 0xAA00AA00AA00AA00ULL
    v = v ^ t ^ (t >> 9)
    t = (v ^ (v << 18)) & 0xCCCC0000CCCC0000ULL
    v = v ^ t ^ (t >> 18)
    t = (v ^ (v << 36)) & 0xF0F0F0F000000000ULL
    v = v ^ t ^ (t >> 36)
    return v


cdef inline u64 _transform_bits(u64 v, int transform) noexcept nogil:
    if transform & FLIP_TRANSFORM:
        v = _flip_files(v)
    if transform & MIRROR_TRANSFORM:
        v = cz_bswap64(v)
    if transform & TRANSPOSE_TRANSFORM:
        v = _anti_transpose(v)
    return v


cdef inline int _transform_square(int sq, int transform) noexcept nogil:
    if transform & FLIP_TRANSFORM:
        sq ^= 7
    if transform & MIRROR_TRANSFORM:
        sq ^= 56
    if transform & TRANSPOSE_TRANSFORM:
        sq = (7 - (sq & 7)) * 8 + (7 - (sq >> 3))
    return sq


cdef inline u64 _view(const Pos* p, u64 b) noexcept nogil:
    """A bitboard from the side to move's view (ranks mirrored for black)."""
    return cz_bswap64(b) if p.turn == BLACK else b


cdef inline int _transpose_order(u64 b, int transform) noexcept nogil:
    """-1 when ``b`` (after the transform so far) is below its transpose, 1 when above, 0 when equal."""
    cdef u64 value = _transform_bits(b, transform & (FLIP_TRANSFORM | MIRROR_TRANSFORM))
    cdef u64 other = _anti_transpose(value)
    if value < other:
        return -1
    if value > other:
        return 1
    return 0


cdef int position_transform(const Pos* p, int input_format) noexcept nogil:
    """lc0's canonical transform of ``p`` for ``input_format`` (FLIP/MIRROR/TRANSPOSE_TRANSFORM bits),
    0 for the non-canonical formats. None while any castling right remains; files flipped when our
    king is on files a-d; in a pawnless position also ranks mirrored when our king is on ranks 5-8
    (our view), then transposed when the king is above the a8-h1 diagonal of that quadrant, or on it
    and the pieces are (in lc0's order of tie-breaks) larger below it than above."""
    if not _canonical(input_format) or p.castle != 0:
        return 0
    cdef int us = p.turn
    cdef u64 king = _view(p, p.pieces[KING] & p.colors[us])
    cdef int transform = 0, order, k
    cdef u64 tiebreaks[7]
    if king & 0x0F0F0F0F0F0F0F0FULL:
        transform |= FLIP_TRANSFORM
        king = _flip_files(king)
    if p.pieces[PAWN]:
        return transform
    if king & 0xFFFFFFFF00000000ULL:
        transform |= MIRROR_TRANSFORM
        king = cz_bswap64(king)
    if king & 0xE0C08000ULL:    # h2, g3, h3, f4, g4, h4
        return transform | TRANSPOSE_TRANSFORM
    if king & 0x10204080ULL:    # on the diagonal h1-e4: the arrangement decides
        tiebreaks[0] = _view(p, p.colors[WHITE] | p.colors[BLACK])
        tiebreaks[1] = _view(p, p.colors[us])
        tiebreaks[2] = _view(p, p.pieces[KING])
        tiebreaks[3] = _view(p, p.pieces[QUEEN])
        tiebreaks[4] = _view(p, p.pieces[ROOK])
        tiebreaks[5] = _view(p, p.pieces[KNIGHT])
        tiebreaks[6] = _view(p, p.pieces[BISHOP])
        for k in range(7):
            order = _transpose_order(tiebreaks[k], transform)
            if order < 0:
                return transform
            if order > 0:
                return transform | TRANSPOSE_TRANSFORM
    return transform


cdef int move_index_t(const Pos* p, Move m, int transform) noexcept nogil:
    """``move_index`` of ``m`` in a position encoded with ``transform`` (position_transform)."""
    if transform == 0:
        return move_index(p, m)
    cdef int flip = 56 if p.turn == BLACK else 0
    return _policy_entry(_transform_square((m & 63) ^ flip, transform),
                         _transform_square(((m >> 6) & 63) ^ flip, transform), m >> 12)


cdef inline int _lc0_ep_file(const Pos* p, const Undo* stack, int ply, int start_ep) noexcept nogil:
    """The file lc0 marks en passant on at ``p`` (the position at ``ply`` of the game), or -1. lc0
    marks a double pawn push whenever a pawn of the side to move stands beside it (pinned or not),
    and the square a FEN names."""
    cdef int frm, to
    cdef u64 beside
    if ply == 0:
        return start_ep & 7 if start_ep >= 0 else -1
    frm = stack[ply - 1].move & 63
    to = (stack[ply - 1].move >> 6) & 63
    if (p.board[to] & 7) != PAWN or (frm - to != 16 and to - frm != 16):
        return -1
    beside = 0
    if (to & 7) > 0:
        beside |= 1ULL << (to - 1)
    if (to & 7) < 7:
        beside |= 1ULL << (to + 1)
    if beside & p.pieces[PAWN] & p.colors[p.turn]:
        return to & 7
    return -1


cdef void _canonical_history_bits(const Pos* cur, const Undo* stack, int nstack, int start_ep,
                                  int input_format, u64* bits) noexcept nogil:
    """Planes 0-103 of the canonical formats (before the transform): the history goes back from the
    current position until a castling right changes, an earlier position has an en-passant mark, or
    past the last capture or pawn move (rule50 0). Formats 3, 4, 132 repeat the starting position
    of a game from a FEN in the empty slots (lc0's HistoryFill fen_only); the v2 formats (5, 133)
    keep only the positions that repeat an earlier one (and the current one) and fill nothing."""
    cdef int us = cur.turn
    cdef int i = 0, ply = nstack
    cdef bint v2 = _repeats_only(input_format)
    cdef bint rep
    cdef Pos p = cur[0]
    memset(bits, 0, HISTORY_PLANES * sizeof(u64))
    while i < 8:
        if ply >= 0:
            if ply < nstack:
                unmake_move(&p, &stack[ply])
            if p.castle != cur.castle:
                break
            if ply != nstack and _lc0_ep_file(&p, stack, ply, start_ep) >= 0:
                break
            rep = _occurred_before(&p, stack, ply)
        else:
            # before the game's first position: p is that position (it passed the tests above)
            if v2 or start_ep >= 0 or _is_standard_start(&p):
                break
            rep = False
        if v2 and i > 0 and not rep:
            if p.halfmove == 0:
                break
            ply -= 1
            continue
        _piece_bits(&p, us, bits + i * 13)
        if rep:
            bits[i * 13 + 12] = ~0ULL
        if p.halfmove == 0:
            break
        i += 1
        ply -= 1


cdef int _format_bits(const Pos* cur, const Undo* stack, int nstack, int start_ep, int input_format,
                      u64* bits) noexcept nogil:
    """Planes 0-108 of formats 2 and up as bitboards (the squares at 1.0, transform applied);
    returns the transform."""
    cdef int us = cur.turn, k, color, ep_file
    cdef int transform = position_transform(cur, input_format)
    cdef u64 rights, rook, a_side = 0, h_side = 0
    if _canonical(input_format):
        _canonical_history_bits(cur, stack, nstack, start_ep, input_format, bits)
    else:
        _history_bits(cur, stack, nstack, start_ep, bits)
    # 104/105: the rooks (both colours) that carry an a-side / h-side castling right
    rights = cur.castle
    while rights:
        rook = rights & (~rights + 1)
        color = WHITE if rook & 0xFFULL else BLACK
        if (cz_lsb(rook) & 7) < (cur.ksq[color] & 7):
            a_side |= rook
        else:
            h_side |= rook
        rights &= rights - 1
    bits[104] = _view(cur, a_side)
    bits[105] = _view(cur, h_side)
    bits[106] = 0
    bits[107] = 0
    if _canonical(input_format):
        ep_file = _lc0_ep_file(cur, stack, nstack, start_ep)
        bits[108] = (1ULL << (56 + ep_file)) if ep_file >= 0 else 0
    else:
        bits[108] = ~0ULL if us == BLACK else 0
    if transform:
        for k in range(109):
            if bits[k] != 0 and bits[k] != ~0ULL:
                bits[k] = _transform_bits(bits[k], transform)
    return transform


cdef inline void _write_format_state(const Pos* cur, int input_format, const u64* bits, float* out) noexcept nogil:
    """Planes 104-111 of formats 2 and up, every square written."""
    cdef int k
    for k in range(104, 109):
        _fill(out + k * 64, 0.0)
        _set_squares(out + k * 64, bits[k], 1.0)
    _fill(out + 109 * 64, <float>(cur.halfmove / 100.0) if _hectoplies(input_format) else <float>cur.halfmove)
    _fill(out + 110 * 64, 1.0 if (_armageddon(input_format) and cur.turn == BLACK) else 0.0)
    _fill(out + 111 * 64, 1.0)


cdef void encode_planes_format(const Pos* cur, const Undo* stack, int nstack, int start_ep,
                               int input_format, float* out) noexcept nogil:
    cdef u64 bits[109]
    if input_format == 1:
        encode_planes(cur, stack, nstack, start_ep, out)
        return
    _format_bits(cur, stack, nstack, start_ep, input_format, bits)
    _write_history(bits, out)
    _write_format_state(cur, input_format, bits, out)


cdef void encode_planes_over_format(const Pos* cur, const Undo* stack, int nstack, int start_ep,
                                    int input_format, float* out, u64* last) noexcept nogil:
    cdef u64 bits[109]
    if input_format == 1:
        encode_planes_over(cur, stack, nstack, start_ep, out, last)
        return
    _format_bits(cur, stack, nstack, start_ep, input_format, bits)
    _rewrite_history(bits, out, last)
    _write_format_state(cur, input_format, bits, out)


cdef void policy_priors_format(const Pos* p, const Move* moves, int n, const float* logits, float temperature,
                               int input_format, float* priors) noexcept nogil:
    cdef int i, transform
    cdef float hi = -3.0e38, x
    if n == 0:
        return
    transform = position_transform(p, input_format)
    if transform == 0:
        policy_priors(p, moves, n, logits, temperature, priors)
        return
    for i in range(n):
        x = logits[move_index_t(p, moves[i], transform)]
        priors[i] = x
        if x > hi and x == x and x < 3.0e38:
            hi = x
    _softmax_priors(priors, n, hi, temperature)


cdef int legal_priors_format(const Pos* p, const float* logits, float temperature, int input_format,
                             Move* moves, float* priors) noexcept nogil:
    cdef int n = gen_legal(p, moves)
    policy_priors_format(p, moves, n, logits, temperature, input_format, priors)
    return n


def canonical_transform(Board board not None, input_format=3):
    """The transform lc0 encodes ``board``'s position with in ``input_format``: FLIP (1: files
    reversed) | MIRROR (2: ranks reversed) | TRANSPOSE (4: reflected in the a8-h1 diagonal), as seen
    from the side to move; 0 for formats 1 and 2 and while castling rights remain."""
    return position_transform(&board.pos, _checked_format(input_format))


FLIP, MIRROR, TRANSPOSE = FLIP_TRANSFORM, MIRROR_TRANSFORM, TRANSPOSE_TRANSFORM


def _encode_over(Board board not None, out, last, input_format=1):
    """For tests: encode_planes_over_format into ``out`` [112, 8, 8] (a row holding an earlier encoding
    whose planes 0-103 are ``last``, uint64 [104], updated in place)."""
    cdef int f = _checked_format(input_format)
    cdef float[:, :, ::1] view = _checked_buffer(out, (INPUT_PLANES, 8, 8))
    if not isinstance(last, np.ndarray) or last.dtype != np.uint64 or last.shape != (HISTORY_PLANES,) \
            or not last.flags.c_contiguous or not last.flags.writeable:
        raise ValueError(f"last must be a writable C-contiguous uint64 array of shape ({HISTORY_PLANES},)")
    cdef uint64_t[::1] lv = last
    with nogil:
        encode_planes_over_format(&board.pos, board.stack, board.nstack, board.start_ep, f, &view[0, 0, 0],
                                  &lv[0])
    return out


def _checked_format(input_format):
    f = operator.index(input_format)
    if f not in INPUT_FORMATS:
        raise ValueError(f"unsupported lc0 input format {input_format!r}: cyzero's encoder writes the "
                         f"formats {', '.join(map(str, INPUT_FORMATS))}")
    return f


# ---------------------------------------------------------------------------
# Python access, for tests, tools and the trainer.

def encode_board(Board board not None, out=None, input_format=1):
    """The [112, 8, 8] float32 input for ``board`` and its move history in lc0's ``input_format``."""
    cdef int f = _checked_format(input_format)
    if out is None:
        out = np.empty((INPUT_PLANES, 8, 8), dtype=np.float32)
    cdef float[:, :, ::1] view = _checked_buffer(out, (INPUT_PLANES, 8, 8))
    with nogil:
        encode_planes_format(&board.pos, board.stack, board.nstack, board.start_ep, f, &view[0, 0, 0])
    return out


def encode_boards(boards, out=None, input_format=1):
    """Stack the inputs of several boards into one [N, 112, 8, 8] float32 array."""
    cdef int f = _checked_format(input_format)
    boards = list(boards)
    cdef Py_ssize_t n = len(boards), i
    if out is None:
        out = np.empty((n, INPUT_PLANES, 8, 8), dtype=np.float32)
    cdef float[:, :, :, ::1] view = _checked_buffer(out, (n, INPUT_PLANES, 8, 8))
    cdef Board b
    for i in range(n):
        b = boards[i]
        with nogil:
            encode_planes_format(&b.pos, b.stack, b.nstack, b.start_ep, f, &view[i, 0, 0, 0])
    return out


def _checked_buffer(out, shape):
    if not isinstance(out, np.ndarray) or out.dtype != np.float32 or out.shape != tuple(shape) \
            or not out.flags.c_contiguous or not out.flags.writeable:
        raise ValueError(f"out must be a writable C-contiguous float32 array of shape {tuple(shape)}")
    return out


def encode_position(fen=None, moves=(), *, bint chess960=False, input_format=1):
    """The input planes of the position reached by playing ``moves`` (UCI) from ``fen``."""
    f = _checked_format(input_format)
    board = Board(fen, chess960=chess960)
    for move in moves:
        board.push_uci(move)
    return encode_board(board, input_format=f)


cdef Move _legal_move(Board board, str uci) except 0:
    return board._parse_uci(uci)


def move_to_index(Board board not None, uci, input_format=1):
    """Policy index of the legal move ``uci`` in ``board``'s position (encoded in ``input_format``)."""
    cdef int f = _checked_format(input_format)
    if not isinstance(uci, str):
        raise TypeError(f"move must be a str, not {type(uci).__name__}")
    return move_index_t(&board.pos, _legal_move(board, uci), position_transform(&board.pos, f))


def index_to_move(Board board not None, index, input_format=1):
    """The legal move of ``board`` with policy index ``index`` (in ``input_format``), in the board's UCI
    notation."""
    cdef int transform = position_transform(&board.pos, _checked_format(input_format))
    index = operator.index(index)
    if not 0 <= index < POLICY_MOVES:
        raise ValueError(f"policy index must be 0..{POLICY_MOVES - 1}, got {index}")
    cdef Move moves[MAX_MOVES]
    cdef int n = gen_legal(&board.pos, moves), i
    for i in range(n):
        if move_index_t(&board.pos, moves[i], transform) == index:
            return board.legal_moves()[i]
    view = "the side to move's view" if transform == 0 else f"the side to move's view, transform {transform}"
    raise ValueError(f"policy index {index} ({POLICY_INDEX[index]} from {view}) "
                     f"is not a legal move in {board.fen()}")


def legal_mask(Board board not None, input_format=1):
    """Boolean [1858] mask of the legal moves' policy indices (in ``input_format``)."""
    cdef int transform = position_transform(&board.pos, _checked_format(input_format))
    mask = np.zeros(POLICY_MOVES, dtype=bool)
    cdef Move moves[MAX_MOVES]
    cdef int n = gen_legal(&board.pos, moves), i
    for i in range(n):
        mask[move_index_t(&board.pos, moves[i], transform)] = True
    return mask


def legal_policy(Board board not None, logits, float temperature=1.0, input_format=1):
    """Legal moves (UCI) and their softmax probabilities over ``logits`` [1858] at ``temperature``
    (the logits of a network of ``input_format``)."""
    cdef int f = _checked_format(input_format)
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
    cdef int n = legal_priors_format(&board.pos, &lg[0], temperature, f, moves, priors)
    # legal_moves() lists the moves in gen_legal's order, so names and priors line up.
    names = board.legal_moves()
    return names, np.array([priors[i] for i in range(n)], dtype=np.float32)
