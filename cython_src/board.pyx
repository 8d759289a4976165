# cython: language_level=3
"""The chess rules of cyzero: bitboards, legal move generation, make/unmake,
Zobrist hashing, repetition and game-end rules, FEN and UCI I/O, Chess960.

The hot paths (``gen_legal``, ``make_move``, ``unmake_move``, ``perft``) are
plain C over a ``Pos`` struct so that the encoder and the MCTS tree can call
them without the GIL. The Python-facing :class:`Board` follows python-chess's
semantics wherever python-chess has the same concept, so python-chess can
serve as the reference in differential tests.
"""

from libc.stdlib cimport malloc, realloc, free
from libc.string cimport memset, memcpy

# ---------------------------------------------------------------------------
# Tables, filled once at import.

cdef u64 KNIGHT_ATT[64]
cdef u64 KING_ATT[64]
cdef u64 PAWN_ATT[2][64]      # squares a pawn of that colour on the square attacks
cdef u64 RAYS[8][64]          # N, NE, E, NW (increasing) then S, SW, W, SE (decreasing)
cdef u64 ROOK_EMPTY[64]       # rook attacks on an empty board
cdef u64 BISHOP_EMPTY[64]
cdef u64 BETWEEN[64][64]      # squares strictly between two aligned squares, else 0
cdef u64 LINE[64][64]         # the whole line through two aligned squares, else 0

cdef u64 Z_PIECE[16][64]      # indexed by piece code
cdef u64 Z_CASTLE[64]         # per rook square carrying a castling right
cdef u64 Z_EP[8]              # per file of the en-passant square
cdef u64 Z_TURN               # xor-ed in when black is to move

cdef enum:
    DIR_N = 0
    DIR_NE = 1
    DIR_E = 2
    DIR_NW = 3
    DIR_S = 4
    DIR_SW = 5
    DIR_W = 6
    DIR_SE = 7

cdef u64 FILE_A = 0x0101010101010101ULL
cdef u64 FILE_H = 0x8080808080808080ULL
cdef u64 RANK_1 = 0xFFULL
cdef u64 RANK_3 = 0xFF0000ULL
cdef u64 RANK_6 = 0xFF0000000000ULL
cdef u64 RANK_8 = 0xFF00000000000000ULL
cdef u64 DARK_SQUARES = 0xAA55AA55AA55AA55ULL


cdef inline u64 bb(int sq) noexcept nogil:
    return (<u64>1) << sq


cdef u64 _splitmix_state = 0x9E3779B97F4A7C15ULL

cdef u64 _splitmix() noexcept nogil:
    global _splitmix_state
    _splitmix_state += 0x9E3779B97F4A7C15ULL
    cdef u64 z = _splitmix_state
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL
    return z ^ (z >> 31)


cdef void _init_tables() noexcept nogil:
    cdef int sq, r, f, d, nr, nf, k, s2, i, j
    cdef int kdr[8]
    cdef int kdf[8]
    cdef int ndr[8]
    cdef int ndf[8]
    cdef int rdr[8]
    cdef int rdf[8]
    kdr[:] = [1, 1, 0, -1, -1, -1, 0, 1]
    kdf[:] = [0, 1, 1, 1, 0, -1, -1, -1]
    ndr[:] = [2, 1, -1, -2, -2, -1, 1, 2]
    ndf[:] = [1, 2, 2, 1, -1, -2, -2, -1]
    # ray directions in DIR_* order
    rdr[:] = [1, 1, 0, 1, -1, -1, 0, -1]
    rdf[:] = [0, 1, 1, -1, 0, -1, -1, 1]
    for sq in range(64):
        r = sq >> 3
        f = sq & 7
        KNIGHT_ATT[sq] = 0
        KING_ATT[sq] = 0
        PAWN_ATT[WHITE][sq] = 0
        PAWN_ATT[BLACK][sq] = 0
        for k in range(8):
            nr = r + kdr[k]
            nf = f + kdf[k]
            if 0 <= nr < 8 and 0 <= nf < 8:
                KING_ATT[sq] |= bb(nr * 8 + nf)
            nr = r + ndr[k]
            nf = f + ndf[k]
            if 0 <= nr < 8 and 0 <= nf < 8:
                KNIGHT_ATT[sq] |= bb(nr * 8 + nf)
        for d in range(-1, 2, 2):
            nf = f + d
            if 0 <= nf < 8:
                if r < 7:
                    PAWN_ATT[WHITE][sq] |= bb((r + 1) * 8 + nf)
                if r > 0:
                    PAWN_ATT[BLACK][sq] |= bb((r - 1) * 8 + nf)
        for d in range(8):
            RAYS[d][sq] = 0
            nr = r + rdr[d]
            nf = f + rdf[d]
            while 0 <= nr < 8 and 0 <= nf < 8:
                RAYS[d][sq] |= bb(nr * 8 + nf)
                nr += rdr[d]
                nf += rdf[d]
        ROOK_EMPTY[sq] = RAYS[DIR_N][sq] | RAYS[DIR_E][sq] | RAYS[DIR_S][sq] | RAYS[DIR_W][sq]
        BISHOP_EMPTY[sq] = RAYS[DIR_NE][sq] | RAYS[DIR_NW][sq] | RAYS[DIR_SE][sq] | RAYS[DIR_SW][sq]
    for i in range(64):
        for j in range(64):
            BETWEEN[i][j] = 0
            LINE[i][j] = 0
        for d in range(8):
            s2 = i
            k = 0
            # walk the ray square by square
            r = i >> 3
            f = i & 7
            nr = r + rdr[d]
            nf = f + rdf[d]
            while 0 <= nr < 8 and 0 <= nf < 8:
                j = nr * 8 + nf
                BETWEEN[i][j] = RAYS[d][i] & ~RAYS[d][j] & ~bb(j)
                LINE[i][j] = RAYS[d][i] | RAYS[(d + 4) & 7][i] | bb(i)
                nr += rdr[d]
                nf += rdf[d]
    for i in range(16):
        for sq in range(64):
            Z_PIECE[i][sq] = _splitmix()
    for sq in range(64):
        Z_CASTLE[sq] = _splitmix()
    for i in range(8):
        Z_EP[i] = _splitmix()
    global Z_TURN
    Z_TURN = _splitmix()

_init_tables()


# ---------------------------------------------------------------------------
# Attacks.

cdef inline u64 _ray_pos(int d, int sq, u64 occ) noexcept nogil:
    cdef u64 a = RAYS[d][sq]
    cdef u64 b = a & occ
    if b:
        a ^= RAYS[d][cz_lsb(b)]
    return a


cdef inline u64 _ray_neg(int d, int sq, u64 occ) noexcept nogil:
    cdef u64 a = RAYS[d][sq]
    cdef u64 b = a & occ
    if b:
        a ^= RAYS[d][cz_msb(b)]
    return a


cdef inline u64 rook_att(int sq, u64 occ) noexcept nogil:
    return (_ray_pos(DIR_N, sq, occ) | _ray_pos(DIR_E, sq, occ)
            | _ray_neg(DIR_S, sq, occ) | _ray_neg(DIR_W, sq, occ))


cdef inline u64 bishop_att(int sq, u64 occ) noexcept nogil:
    return (_ray_pos(DIR_NE, sq, occ) | _ray_pos(DIR_NW, sq, occ)
            | _ray_neg(DIR_SE, sq, occ) | _ray_neg(DIR_SW, sq, occ))


cdef inline u64 attackers_to(const Pos* p, int sq, u64 occ) noexcept nogil:
    """All pieces of both colours attacking ``sq`` given occupancy ``occ``."""
    return ((PAWN_ATT[BLACK][sq] & p.pieces[PAWN] & p.colors[WHITE])
            | (PAWN_ATT[WHITE][sq] & p.pieces[PAWN] & p.colors[BLACK])
            | (KNIGHT_ATT[sq] & p.pieces[KNIGHT])
            | (KING_ATT[sq] & p.pieces[KING])
            | (rook_att(sq, occ) & (p.pieces[ROOK] | p.pieces[QUEEN]))
            | (bishop_att(sq, occ) & (p.pieces[BISHOP] | p.pieces[QUEEN])))


cdef inline bint attacked_by(const Pos* p, int sq, int color, u64 occ) noexcept nogil:
    cdef u64 them = p.colors[color]
    if PAWN_ATT[1 - color][sq] & p.pieces[PAWN] & them:
        return True
    if KNIGHT_ATT[sq] & p.pieces[KNIGHT] & them:
        return True
    if KING_ATT[sq] & p.pieces[KING] & them:
        return True
    cdef u64 rq = (p.pieces[ROOK] | p.pieces[QUEEN]) & them
    if (ROOK_EMPTY[sq] & rq) and (rook_att(sq, occ) & rq):
        return True
    cdef u64 bq = (p.pieces[BISHOP] | p.pieces[QUEEN]) & them
    if (BISHOP_EMPTY[sq] & bq) and (bishop_att(sq, occ) & bq):
        return True
    return False


cdef u64 checkers(const Pos* p) noexcept nogil:
    return attackers_to(p, p.ksq[p.turn], p.pieces[0]) & p.colors[1 - p.turn]


cdef bint in_check(const Pos* p) noexcept nogil:
    return attacked_by(p, p.ksq[p.turn], 1 - p.turn, p.pieces[0])


cdef bint gives_check(const Pos* p, Move m) noexcept nogil:
    """Whether the legal move ``m`` leaves the opponent in check, without making it: the moved
    (or promoted) piece's own attack on their king, or one of our sliders the move uncovers (no
    other piece of ours can start to give check). Castling and en passant, which move or remove a
    second piece, are made and looked at."""
    cdef int frm = m & 63
    cdef int to = (m >> 6) & 63
    cdef int us = p.turn
    cdef int pt = p.board[frm] & 7
    cdef int cap = p.board[to]
    cdef int ksq = p.ksq[1 - us]
    cdef u64 king = bb(ksq), occ, ours, sliders
    cdef Pos q
    cdef Undo u
    if (pt == KING and cap and (cap >> 3) == us) or (pt == PAWN and to == p.ep):
        q = p[0]
        make_move(&q, m, &u)
        return in_check(&q)
    if m >> 12:
        pt = m >> 12
    occ = (p.pieces[0] & ~bb(frm)) | bb(to)
    if pt == PAWN:
        if PAWN_ATT[us][to] & king:
            return True
    elif pt == KNIGHT:
        if KNIGHT_ATT[to] & king:
            return True
    elif pt != KING:
        if (pt == BISHOP or pt == QUEEN) and (BISHOP_EMPTY[to] & king) and (bishop_att(to, occ) & king):
            return True
        if (pt == ROOK or pt == QUEEN) and (ROOK_EMPTY[to] & king) and (rook_att(to, occ) & king):
            return True
    ours = p.colors[us] & ~bb(frm)
    sliders = (p.pieces[ROOK] | p.pieces[QUEEN]) & ours
    if (ROOK_EMPTY[ksq] & sliders) and (rook_att(ksq, occ) & sliders):
        return True
    sliders = (p.pieces[BISHOP] | p.pieces[QUEEN]) & ours
    if (BISHOP_EMPTY[ksq] & sliders) and (bishop_att(ksq, occ) & sliders):
        return True
    return False


cdef inline u64 _pinned(const Pos* p, int us) noexcept nogil:
    """Our pieces pinned to our king."""
    cdef int ksq = p.ksq[us]
    cdef u64 them = p.colors[1 - us]
    cdef u64 occ = p.pieces[0]
    cdef u64 snipers = ((ROOK_EMPTY[ksq] & (p.pieces[ROOK] | p.pieces[QUEEN]))
                        | (BISHOP_EMPTY[ksq] & (p.pieces[BISHOP] | p.pieces[QUEEN]))) & them
    cdef u64 pinned = 0, b
    cdef int s
    while snipers:
        s = cz_lsb(snipers)
        snipers &= snipers - 1
        b = BETWEEN[ksq][s] & occ
        if b and not (b & (b - 1)):
            pinned |= b & p.colors[us]
    return pinned


cdef inline bint _ep_capture_legal(const Pos* p, int frm, int ep) noexcept nogil:
    """Whether the pawn on ``frm`` may capture en passant on ``ep`` (checks, pins, the rank case)."""
    cdef int us = p.turn
    cdef int cap = ep - 8 if us == WHITE else ep + 8
    cdef u64 occ = (p.pieces[0] ^ bb(frm) ^ bb(cap)) | bb(ep)
    cdef int ksq = p.ksq[us]
    cdef u64 them = p.colors[1 - us] & ~bb(cap)
    if KNIGHT_ATT[ksq] & p.pieces[KNIGHT] & them:
        return False
    if PAWN_ATT[us][ksq] & p.pieces[PAWN] & them:
        return False
    if rook_att(ksq, occ) & (p.pieces[ROOK] | p.pieces[QUEEN]) & them:
        return False
    if bishop_att(ksq, occ) & (p.pieces[BISHOP] | p.pieces[QUEEN]) & them:
        return False
    return True


cdef inline bint _has_legal_ep(const Pos* p, int ep) noexcept nogil:
    cdef u64 cand = PAWN_ATT[1 - p.turn][ep] & p.pieces[PAWN] & p.colors[p.turn]
    while cand:
        if _ep_capture_legal(p, cz_lsb(cand), ep):
            return True
        cand &= cand - 1
    return False


# ---------------------------------------------------------------------------
# Move generation.

cdef inline Move mk(int frm, int to, int promo) noexcept nogil:
    return <Move>(frm | (to << 6) | (promo << 12))


cdef inline int _add_pawn_moves(Move* out, int n, int frm, int to, bint promo) noexcept nogil:
    if promo:
        out[n] = mk(frm, to, QUEEN)
        out[n + 1] = mk(frm, to, ROOK)
        out[n + 2] = mk(frm, to, BISHOP)
        out[n + 3] = mk(frm, to, KNIGHT)
        return n + 4
    out[n] = mk(frm, to, 0)
    return n + 1


cdef int gen_legal(const Pos* p, Move* out) noexcept nogil:
    """Write every legal move of ``p`` to ``out`` (room for MAX_MOVES); return the count."""
    cdef int us = p.turn
    cdef int them_c = 1 - us
    cdef u64 ours = p.colors[us]
    cdef u64 them = p.colors[them_c]
    cdef u64 occ = p.pieces[0]
    cdef int ksq = p.ksq[us]
    cdef int n = 0
    cdef int frm, to, s
    cdef u64 b, att, occ_wo_king, target, chk, pinned, pawns, single, dbl, caps, promo_rank

    chk = attackers_to(p, ksq, occ) & them

    # King steps.
    occ_wo_king = occ ^ bb(ksq)
    att = KING_ATT[ksq] & ~ours
    while att:
        to = cz_lsb(att)
        att &= att - 1
        if not attacked_by(p, to, them_c, occ_wo_king):
            out[n] = mk(ksq, to, 0)
            n += 1

    if chk and (chk & (chk - 1)):
        return n  # double check: only the king moves

    if chk:
        s = cz_lsb(chk)
        target = BETWEEN[ksq][s] | chk
    else:
        target = ~ours

    pinned = _pinned(p, us)

    # Knights (a pinned knight never moves).
    b = p.pieces[KNIGHT] & ours & ~pinned
    while b:
        frm = cz_lsb(b)
        b &= b - 1
        att = KNIGHT_ATT[frm] & target
        while att:
            to = cz_lsb(att)
            att &= att - 1
            out[n] = mk(frm, to, 0)
            n += 1

    # Sliders.
    b = (p.pieces[BISHOP] | p.pieces[QUEEN]) & ours
    while b:
        frm = cz_lsb(b)
        b &= b - 1
        att = bishop_att(frm, occ) & target
        if pinned & bb(frm):
            att &= LINE[ksq][frm]
        while att:
            to = cz_lsb(att)
            att &= att - 1
            out[n] = mk(frm, to, 0)
            n += 1
    b = (p.pieces[ROOK] | p.pieces[QUEEN]) & ours
    while b:
        frm = cz_lsb(b)
        b &= b - 1
        att = rook_att(frm, occ) & target
        if pinned & bb(frm):
            att &= LINE[ksq][frm]
        while att:
            to = cz_lsb(att)
            att &= att - 1
            out[n] = mk(frm, to, 0)
            n += 1

    # Pawns: the unpinned ones set-wise, the pinned ones one by one.
    pawns = p.pieces[PAWN] & ours
    promo_rank = RANK_8 if us == WHITE else RANK_1
    b = pawns & ~pinned
    if us == WHITE:
        single = (b << 8) & ~occ
        dbl = ((single & RANK_3) << 8) & ~occ & target
        single &= target
        while single:
            to = cz_lsb(single)
            single &= single - 1
            n = _add_pawn_moves(out, n, to - 8, to, (bb(to) & promo_rank) != 0)
        while dbl:
            to = cz_lsb(dbl)
            dbl &= dbl - 1
            out[n] = mk(to - 16, to, 0)
            n += 1
        caps = ((b & ~FILE_A) << 7) & them & target
        while caps:
            to = cz_lsb(caps)
            caps &= caps - 1
            n = _add_pawn_moves(out, n, to - 7, to, (bb(to) & promo_rank) != 0)
        caps = ((b & ~FILE_H) << 9) & them & target
        while caps:
            to = cz_lsb(caps)
            caps &= caps - 1
            n = _add_pawn_moves(out, n, to - 9, to, (bb(to) & promo_rank) != 0)
    else:
        single = (b >> 8) & ~occ
        dbl = ((single & RANK_6) >> 8) & ~occ & target
        single &= target
        while single:
            to = cz_lsb(single)
            single &= single - 1
            n = _add_pawn_moves(out, n, to + 8, to, (bb(to) & promo_rank) != 0)
        while dbl:
            to = cz_lsb(dbl)
            dbl &= dbl - 1
            out[n] = mk(to + 16, to, 0)
            n += 1
        caps = ((b & ~FILE_H) >> 7) & them & target
        while caps:
            to = cz_lsb(caps)
            caps &= caps - 1
            n = _add_pawn_moves(out, n, to + 7, to, (bb(to) & promo_rank) != 0)
        caps = ((b & ~FILE_A) >> 9) & them & target
        while caps:
            to = cz_lsb(caps)
            caps &= caps - 1
            n = _add_pawn_moves(out, n, to + 9, to, (bb(to) & promo_rank) != 0)

    if not chk:
        # A pinned piece can never resolve a check, so pinned pawns move only when not in check.
        b = pawns & pinned
        while b:
            frm = cz_lsb(b)
            b &= b - 1
            att = (PAWN_ATT[us][frm] & them) & LINE[ksq][frm]
            s = frm + 8 if us == WHITE else frm - 8
            if not (occ & bb(s)) and (LINE[ksq][frm] & bb(s)):
                att |= bb(s)
                if (us == WHITE and (frm >> 3) == 1) or (us == BLACK and (frm >> 3) == 6):
                    s = frm + 16 if us == WHITE else frm - 16
                    if not (occ & bb(s)):
                        att |= bb(s)
            while att:
                to = cz_lsb(att)
                att &= att - 1
                n = _add_pawn_moves(out, n, frm, to, (bb(to) & promo_rank) != 0)

    # En passant: rare, so each candidate is checked by playing it out on the occupancy.
    if p.ep >= 0:
        b = PAWN_ATT[them_c][p.ep] & pawns
        while b:
            frm = cz_lsb(b)
            b &= b - 1
            if _ep_capture_legal(p, frm, p.ep):
                out[n] = mk(frm, p.ep, 0)
                n += 1

    # Castling, stored as king-takes-own-rook.
    if not chk:
        n = _gen_castling(p, out, n)
    return n


cdef inline int _gen_castling(const Pos* p, Move* out, int n) noexcept nogil:
    cdef int us = p.turn
    cdef int ksq = p.ksq[us]
    cdef u64 rights = p.castle & p.colors[us] & p.pieces[ROOK] & (RANK_1 if us == WHITE else RANK_8)
    cdef int rsq, kto, rto, s
    cdef u64 occ_wo, path, kpath
    cdef int base = 0 if us == WHITE else 56
    if (ksq >> 3) != (base >> 3):
        return n
    while rights:
        rsq = cz_lsb(rights)
        rights &= rights - 1
        if rsq > ksq:
            kto = base + 6
            rto = base + 5
        else:
            kto = base + 2
            rto = base + 3
        occ_wo = p.pieces[0] ^ bb(ksq) ^ bb(rsq)
        kpath = BETWEEN[ksq][kto] | bb(kto)
        path = kpath | BETWEEN[rsq][rto] | bb(rto)
        if path & occ_wo:
            continue
        # kto itself is tested even when the king stays put: the rook may have shielded it.
        while kpath:
            s = cz_lsb(kpath)
            kpath &= kpath - 1
            if attacked_by(p, s, 1 - us, occ_wo):
                break
        else:
            out[n] = mk(ksq, rsq, 0)
            n += 1
    return n


# ---------------------------------------------------------------------------
# Make / unmake.

cdef inline void _put(Pos* p, int sq, int pc) noexcept nogil:
    cdef u64 m = bb(sq)
    p.board[sq] = pc
    p.pieces[pc & 7] |= m
    p.pieces[0] |= m
    p.colors[pc >> 3] |= m
    p.key ^= Z_PIECE[pc][sq]


cdef inline void _remove(Pos* p, int sq) noexcept nogil:
    cdef int pc = p.board[sq]
    cdef u64 m = ~bb(sq)
    p.board[sq] = 0
    p.pieces[pc & 7] &= m
    p.pieces[0] &= m
    p.colors[pc >> 3] &= m
    p.key ^= Z_PIECE[pc][sq]


cdef inline void _set_castle(Pos* p, u64 new_castle) noexcept nogil:
    cdef u64 changed = p.castle ^ new_castle
    while changed:
        p.key ^= Z_CASTLE[cz_lsb(changed)]
        changed &= changed - 1
    p.castle = new_castle


cdef void make_move(Pos* p, Move m, Undo* u) noexcept nogil:
    """Play the legal move ``m``; ``u`` receives what unmake_move needs."""
    cdef int frm = m & 63
    cdef int to = (m >> 6) & 63
    cdef int promo = m >> 12
    cdef int us = p.turn
    cdef int pc = p.board[frm]
    cdef int pt = pc & 7
    cdef int cap = p.board[to]
    cdef int base, kto, rto, new_ep = -1
    u.key = p.key
    u.castle = p.castle
    u.halfmove = p.halfmove
    u.fullmove = p.fullmove
    u.move = m
    u.ep = p.ep
    u.captured = 0
    u.flags = 0
    if p.ep >= 0:
        p.key ^= Z_EP[p.ep & 7]
    p.halfmove += 1
    if pt == KING and cap and (cap >> 3) == us:
        # Castling: the king "captures" its own rook.
        u.flags = UNDO_CASTLE
        base = 0 if us == WHITE else 56
        if to > frm:
            kto = base + 6
            rto = base + 5
        else:
            kto = base + 2
            rto = base + 3
        _remove(p, frm)
        _remove(p, to)
        _put(p, kto, pc)
        _put(p, rto, cap)
        p.ksq[us] = kto
    else:
        if cap:
            u.captured = cap
            _remove(p, to)
            p.halfmove = 0
        _remove(p, frm)
        if pt == PAWN:
            p.halfmove = 0
            if to == p.ep:
                u.flags = UNDO_EP
                u.captured = ((1 - us) << 3) | PAWN
                _remove(p, to - 8 if us == WHITE else to + 8)
            elif to - frm == 16 or frm - to == 16:
                new_ep = (frm + to) >> 1
            if promo:
                pc = (us << 3) | promo
        _put(p, to, pc)
        if pt == KING:
            p.ksq[us] = to
    if p.castle:
        if pt == KING:
            _set_castle(p, p.castle & ~(RANK_1 if us == WHITE else RANK_8) & ~bb(to))
        elif p.castle & (bb(frm) | bb(to)):
            _set_castle(p, p.castle & ~(bb(frm) | bb(to)))
    p.ep = -1
    if us == BLACK:
        p.fullmove += 1
    p.turn = 1 - us
    p.key ^= Z_TURN
    if new_ep >= 0 and _has_legal_ep(p, new_ep):
        p.ep = new_ep
        p.key ^= Z_EP[new_ep & 7]


cdef void unmake_move(Pos* p, const Undo* u) noexcept nogil:
    """Take back the move recorded in ``u``."""
    cdef Move m = u.move
    cdef int frm = m & 63
    cdef int to = (m >> 6) & 63
    cdef int us = 1 - p.turn
    cdef int base = 0 if us == WHITE else 56
    cdef int kto, rto, pc
    p.turn = us
    if u.flags & UNDO_CASTLE:
        if to > frm:
            kto = base + 6
            rto = base + 5
        else:
            kto = base + 2
            rto = base + 3
        pc = p.board[kto]
        _remove(p, kto)
        _remove(p, rto)
        _put(p, frm, pc)
        _put(p, to, (us << 3) | ROOK)
        p.ksq[us] = frm
    else:
        pc = p.board[to]
        _remove(p, to)
        if m >> 12:
            pc = (us << 3) | PAWN
        _put(p, frm, pc)
        if u.flags & UNDO_EP:
            _put(p, to - 8 if us == WHITE else to + 8, u.captured)
        elif u.captured:
            _put(p, to, u.captured)
        if (pc & 7) == KING:
            p.ksq[us] = frm
    p.key = u.key
    p.castle = u.castle
    p.halfmove = u.halfmove
    p.fullmove = u.fullmove
    p.ep = u.ep


cdef u64 perft(Pos* p, int depth) noexcept nogil:
    cdef Move moves[MAX_MOVES]
    cdef int n = gen_legal(p, moves)
    cdef int i
    cdef u64 total = 0
    cdef Undo u
    if depth <= 1:
        return n if depth == 1 else 1
    for i in range(n):
        make_move(p, moves[i], &u)
        total += perft(p, depth - 1)
        unmake_move(p, &u)
    return total


cdef u64 compute_key(const Pos* p) noexcept nogil:
    cdef u64 k = 0, b
    cdef int sq
    for sq in range(64):
        if p.board[sq]:
            k ^= Z_PIECE[p.board[sq]][sq]
    b = p.castle
    while b:
        k ^= Z_CASTLE[cz_lsb(b)]
        b &= b - 1
    if p.ep >= 0:
        k ^= Z_EP[p.ep & 7]
    if p.turn == BLACK:
        k ^= Z_TURN
    return k


cdef bint _side_insufficient(const Pos* p, int color) noexcept nogil:
    """python-chess's has_insufficient_material(color)."""
    cdef u64 ours = p.colors[color]
    cdef u64 theirs = p.colors[1 - color]
    if ours & (p.pieces[PAWN] | p.pieces[ROOK] | p.pieces[QUEEN]):
        return False
    if ours & p.pieces[KNIGHT]:
        return cz_popcount(ours) <= 2 and not (theirs & ~p.pieces[KING] & ~p.pieces[QUEEN])
    if ours & p.pieces[BISHOP]:
        return (((p.pieces[BISHOP] & DARK_SQUARES) == 0 or (p.pieces[BISHOP] & ~DARK_SQUARES) == 0)
                and not p.pieces[PAWN] and not p.pieces[KNIGHT])
    return True


cdef bint insufficient_material(const Pos* p) noexcept nogil:
    return _side_insufficient(p, WHITE) and _side_insufficient(p, BLACK)


cdef int move_to_uci(const Pos* p, Move m, char* buf) noexcept nogil:
    """Write ``m`` in UCI notation (NUL-terminated) to ``buf``; return its length.

    Castling is written king-takes-rook when Chess960 is on, king-two-squares otherwise.
    """
    cdef int frm = m & 63
    cdef int to = (m >> 6) & 63
    cdef int promo = m >> 12
    cdef int n = 4
    cdef int pc = p.board[frm]
    if not p.chess960 and (pc & 7) == KING and p.board[to] and (p.board[to] >> 3) == (pc >> 3):
        to = (frm & 56) + (6 if to > frm else 2)
    buf[0] = c'a' + (frm & 7)
    buf[1] = c'1' + (frm >> 3)
    buf[2] = c'a' + (to & 7)
    buf[3] = c'1' + (to >> 3)
    if promo:
        buf[4] = b" pnbrqk"[promo]
        n = 5
    buf[n] = 0
    return n


# ---------------------------------------------------------------------------
# The Python-facing board.

STARTING_FEN = "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1"
_PIECE_SYMBOLS = "pnbrqk"
_FILES = "abcdefgh"
_SQUARE_NAMES = [f + r for r in "12345678" for f in _FILES]
_SQUARE_INDEX = {name: i for i, name in enumerate(_SQUARE_NAMES)}
_MAX_COUNTER = 1 << 62


def _castling_part_ok(str s):
    """python-chess's FEN_CASTLING_REGEX: '-' or up to two white then up to two black flags."""
    if s == "-":
        return True
    cdef int i = 0, nw = 0, nb = 0
    while i < len(s) and s[i] in "KQABCDEFGH" and nw < 2:
        i += 1
        nw += 1
    while i < len(s) and s[i] in "kqabcdefgh" and nb < 2:
        i += 1
        nb += 1
    return i == len(s)


# FEN reading helpers for Board._set_fen.

cdef _parse_board_part(Pos* p, str part):
    rows = part.split("/")
    if len(rows) != 8:
        raise ValueError(f"invalid fen: board field needs 8 ranks separated by '/', got {len(rows)}")
    cdef int rank, file_, pt, color
    cdef int sq = 0     # the last piece's square ('~' follows a piece, so it is always set first)
    cdef str c, prev
    for i, row in enumerate(rows):
        rank = 7 - i
        file_ = 0
        prev = ""
        for c in row:
            if c in "12345678":
                if prev == "digit":
                    raise ValueError(f"invalid fen: board field has two digits in a row in rank {rank + 1}")
                file_ += ord(c) - 48
                prev = "digit"
            elif c == "~":
                if prev != "piece":
                    raise ValueError(f"invalid fen: board field has '~' not after a piece in rank {rank + 1}")
                if (p.board[sq] & 7) == KING:
                    raise ValueError("invalid fen: board field marks a king as promoted")
                prev = "tilde"
            elif len(c) == 1 and c.lower() in _PIECE_SYMBOLS and c.isascii():
                if file_ >= 8:
                    raise ValueError(f"invalid fen: board field has more than 8 squares in rank {rank + 1}")
                pt = _PIECE_SYMBOLS.index(c.lower()) + 1
                color = WHITE if c.isupper() else BLACK
                sq = rank * 8 + file_
                _put(p, sq, (color << 3) | pt)
                file_ += 1
                prev = "piece"
            else:
                raise ValueError(f"invalid fen: board field has invalid character {c!r}")
        if file_ != 8:
            raise ValueError(f"invalid fen: board field rank {rank + 1} has {file_} squares, not 8")

cdef _parse_castling(Pos* p, str part):
    """Read KQkq / HAha / mixed castling flags as python-chess does, then keep only valid rights."""
    cdef u64 rights = 0, rooks, backrank, kings
    cdef int color, king
    if part == "-":
        return
    for flag in part:
        color = WHITE if flag.isupper() else BLACK
        backrank = RANK_1 if color == WHITE else RANK_8
        rooks = p.colors[color] & p.pieces[ROOK] & backrank
        kings = p.colors[color] & p.pieces[KING]
        king = cz_lsb(kings) if kings else -1
        f = flag.lower()
        if f == "q":
            # python-chess compares lsb(rooks), which is -1 when there is no rook
            if king >= 0 and (not rooks or cz_lsb(rooks) < king):
                rights |= rooks & (~rooks + 1)
            else:
                rights |= FILE_A & backrank
        elif f == "k":
            if king >= 0 and rooks and king < cz_msb(rooks):
                rights |= bb(cz_msb(rooks))
            else:
                rights |= FILE_H & backrank
        else:
            rights |= (FILE_A << _FILES.index(f)) & backrank
    p.castle = rights

cdef _validate(Pos* p, int ep_sq):
    """Reject what python-chess's Board.is_valid() rejects, naming the reason."""
    cdef u64 occ = p.pieces[0]
    cdef u64 kings = p.pieces[KING]
    cdef u64 chk, our_kings, occ_before
    cdef int us = p.turn
    cdef int pushed_to, pushed_from
    if not occ:
        raise ValueError("invalid position: the board is empty")
    if not (kings & p.colors[WHITE]):
        raise ValueError("invalid position: no white king")
    if not (kings & p.colors[BLACK]):
        raise ValueError("invalid position: no black king")
    if cz_popcount(kings) > 2:
        raise ValueError("invalid position: too many kings")
    if cz_popcount(p.colors[WHITE]) > 16 or cz_popcount(p.colors[BLACK]) > 16:
        raise ValueError("invalid position: more than 16 pieces of one colour")
    if cz_popcount(p.colors[WHITE] & p.pieces[PAWN]) > 8 or cz_popcount(p.colors[BLACK] & p.pieces[PAWN]) > 8:
        raise ValueError("invalid position: more than 8 pawns of one colour")
    if p.pieces[PAWN] & (RANK_1 | RANK_8):
        raise ValueError("invalid position: pawns on the first or last rank")
    if p.castle != _clean_castling(p):
        raise ValueError("invalid position: the castling field names rights the position cannot have")
    p.ksq[WHITE] = cz_lsb(kings & p.colors[WHITE])
    p.ksq[BLACK] = cz_lsb(kings & p.colors[BLACK])
    valid_ep = _valid_ep_square(p, ep_sq)
    if ep_sq >= 0 and valid_ep != ep_sq:
        raise ValueError("invalid position: the en passant field names a square no double push could have left")
    if attacked_by(p, p.ksq[1 - us], us, occ):
        raise ValueError("invalid position: the side not to move is in check")
    chk = attackers_to(p, p.ksq[us], occ) & p.colors[1 - us]
    our_kings = kings & p.colors[us]
    if chk:
        if cz_popcount(chk) > 2:
            raise ValueError("invalid position: more than two pieces give check")
        if valid_ep >= 0:
            pushed_to = valid_ep ^ 8
            pushed_from = valid_ep ^ 24
            occ_before = (occ & ~bb(pushed_to)) | bb(pushed_from)
            if cz_popcount(chk) > 1 or (cz_msb(chk) != pushed_to and
                                        _attacked_for_king(p, our_kings, occ_before)):
                raise ValueError("invalid position: impossible check")
        elif cz_popcount(chk) == 2 and (LINE[cz_lsb(chk)][cz_msb(chk)] & our_kings):
            raise ValueError("invalid position: impossible check")


cdef object _uci(const Pos* p, Move m):
    cdef char buf[8]
    cdef int n = move_to_uci(p, m, buf)
    return buf[:n].decode("ascii")


cdef class Board:
    """A chess position with its move history.

    ``Board()`` is the standard start; ``Board(fen, chess960=True)`` reads X-FEN
    and Shredder-FEN castling. Moves go in and out as UCI strings.
    """

    def __cinit__(self):
        self.capacity = 64
        self.nstack = 0
        self.start_ep = -1
        self.stack = <Undo*>malloc(self.capacity * sizeof(Undo))
        if self.stack == NULL:
            raise MemoryError()

    def __dealloc__(self):
        free(self.stack)

    def __init__(self, fen=None, *, bint chess960=False):
        if fen is None:
            fen = STARTING_FEN
        elif not isinstance(fen, str):
            raise TypeError(f"fen must be a str, not {type(fen).__name__}")
        self._set_fen(fen, chess960)

    # -- construction ------------------------------------------------------

    def _set_fen(self, str fen, bint chess960):
        cdef Pos p
        memset(&p, 0, sizeof(Pos))
        p.ep = -1
        p.chess960 = chess960
        parts = fen.split()
        if not parts:
            raise ValueError("invalid fen: empty string (board field missing)")
        if len(parts) > 6:
            raise ValueError(f"invalid fen: more than 6 fields: {fen!r}")
        board_part = parts[0]
        turn_part = parts[1] if len(parts) > 1 else "w"
        castling_part = parts[2] if len(parts) > 2 else "-"
        ep_part = parts[3] if len(parts) > 3 else "-"
        half_part = parts[4] if len(parts) > 4 else "0"
        full_part = parts[5] if len(parts) > 5 else "1"

        if turn_part not in ("w", "b"):
            raise ValueError(f"invalid fen: turn field must be 'w' or 'b', got {turn_part!r}")
        p.turn = WHITE if turn_part == "w" else BLACK
        if not _castling_part_ok(castling_part):
            raise ValueError(f"invalid fen: castling field {castling_part!r} is malformed")
        ep_sq = -1
        if ep_part != "-":
            if ep_part not in _SQUARE_INDEX:
                raise ValueError(f"invalid fen: en passant field {ep_part!r} is not a square")
            ep_sq = _SQUARE_INDEX[ep_part]
        try:
            halfmove = int(half_part)
        except ValueError:
            raise ValueError(f"invalid fen: halfmove clock {half_part!r} is not an integer") from None
        if halfmove < 0:
            raise ValueError(f"invalid fen: halfmove clock {halfmove} is negative")
        try:
            fullmove = int(full_part)
        except ValueError:
            raise ValueError(f"invalid fen: fullmove number {full_part!r} is not an integer") from None
        if fullmove < 0:
            raise ValueError(f"invalid fen: fullmove number {fullmove} is negative")
        # Counters are stored in 64 bits; refuse values that could overflow rather than alter them.
        if halfmove >= _MAX_COUNTER:
            raise ValueError(f"invalid fen: halfmove clock {halfmove} is too large")
        if fullmove >= _MAX_COUNTER:
            raise ValueError(f"invalid fen: fullmove number {fullmove} is too large")
        p.halfmove = halfmove
        p.fullmove = max(fullmove, 1)

        _parse_board_part(&p, board_part)
        _parse_castling(&p, castling_part)
        _validate(&p, ep_sq)
        p.ksq[WHITE] = cz_lsb(p.pieces[KING] & p.colors[WHITE])
        p.ksq[BLACK] = cz_lsb(p.pieces[KING] & p.colors[BLACK])
        if ep_sq >= 0 and _has_legal_ep(&p, ep_sq):
            p.ep = ep_sq
        p.key = compute_key(&p)
        self.pos = p
        self.nstack = 0
        self.start_ep = ep_sq

    # -- basic properties ------------------------------------------------------

    @property
    def turn(self):
        """True when white is to move (like chess.WHITE)."""
        return self.pos.turn == WHITE

    @property
    def chess960(self):
        return bool(self.pos.chess960)

    @chess960.setter
    def chess960(self, bint value):
        self.pos.chess960 = value

    @property
    def halfmove_clock(self):
        return self.pos.halfmove

    @property
    def fullmove_number(self):
        return self.pos.fullmove

    @property
    def move_stack(self):
        """The pushed moves as UCI strings, oldest first."""
        cdef Board replay = self.copy()
        cdef list moves = []
        cdef int i
        while replay.nstack:
            moves.append(replay.pop())
        moves.reverse()
        return moves

    def hash(self):
        """The incremental 64-bit Zobrist hash."""
        return self.pos.key

    def compute_hash(self):
        """The Zobrist hash computed from scratch (equals hash() unless there is a bug)."""
        return compute_key(&self.pos)

    def copy(self):
        cdef Board b = Board.__new__(Board)
        b.pos = self.pos
        if self.nstack > b.capacity:
            b.stack = <Undo*>realloc(b.stack, self.nstack * sizeof(Undo))
            if b.stack == NULL:
                raise MemoryError()
            b.capacity = self.nstack
        memcpy(b.stack, self.stack, self.nstack * sizeof(Undo))
        b.nstack = self.nstack
        b.start_ep = self.start_ep
        return b

    def __copy__(self):
        return self.copy()

    def __repr__(self):
        return f"Board({self.fen()!r}{', chess960=True' if self.pos.chess960 else ''})"

    @staticmethod
    def from_chess960_pos(int scharnagl):
        """The Chess960 start position with Scharnagl number 0..959 (518 is the standard start)."""
        if not 0 <= scharnagl <= 959:
            raise ValueError(f"Chess960 position number must be 0..959, got {scharnagl}")
        rank = [None] * 8
        n, light = divmod(scharnagl, 4)
        n, dark = divmod(n, 4)
        n, queen = divmod(n, 6)
        rank[2 * light + 1] = "b"
        rank[2 * dark] = "b"
        free = [i for i in range(8) if rank[i] is None]
        rank[free[queen]] = "q"
        knights = [(0, 1), (0, 2), (0, 3), (0, 4), (1, 2), (1, 3), (1, 4), (2, 3), (2, 4), (3, 4)][n]
        free = [i for i in range(8) if rank[i] is None]
        for k in knights:
            rank[free[k]] = "n"
        free = [i for i in range(8) if rank[i] is None]
        for i, piece in zip(free, "rkr"):
            rank[i] = piece
        back = "".join(rank)
        fen = f"{back}/pppppppp/8/8/8/8/PPPPPPPP/{back.upper()} w KQkq - 0 1"
        return Board(fen, chess960=True)

    # -- output --------------------------------------------------------------

    def board_fen(self):
        cdef list out = []
        cdef int rank, file_, empty, pc
        for rank in range(7, -1, -1):
            empty = 0
            for file_ in range(8):
                pc = self.pos.board[rank * 8 + file_]
                if pc == 0:
                    empty += 1
                    continue
                if empty:
                    out.append(str(empty))
                    empty = 0
                sym = _PIECE_SYMBOLS[(pc & 7) - 1]
                out.append(sym.upper() if (pc >> 3) == WHITE else sym)
            if empty:
                out.append(str(empty))
            if rank:
                out.append("/")
        return "".join(out)

    def _castling_fen(self, bint shredder):
        cdef Pos* p = &self.pos
        cdef u64 rights = p.castle, backrank, others
        cdef int color, rsq, kfile, rfile, o
        cdef list out = []
        if not rights:
            return "-"
        for color in (WHITE, BLACK):
            backrank = RANK_1 if color == WHITE else RANK_8
            kfile = p.ksq[color] & 7
            for rsq in range(63, -1, -1):
                if not (rights & backrank & bb(rsq)):
                    continue
                rfile = rsq & 7
                if shredder:
                    ch = _FILES[rfile]
                else:
                    a_side = rfile < kfile
                    others = p.colors[color] & p.pieces[ROOK] & backrank & ~bb(rsq)
                    ambiguous = False
                    while others:
                        o = cz_lsb(others)
                        others &= others - 1
                        if ((o & 7) < rfile) == a_side:
                            ambiguous = True
                    ch = _FILES[rfile] if ambiguous else ("q" if a_side else "k")
                out.append(ch.upper() if color == WHITE else ch)
        return "".join(out) or "-"

    def fen(self, *, bint shredder=False):
        """The FEN, as python-chess writes it (ep square only when an ep capture is legal)."""
        ep = _SQUARE_NAMES[self.pos.ep] if self.pos.ep >= 0 else "-"
        return (f"{self.board_fen()} {'w' if self.pos.turn == WHITE else 'b'} "
                f"{self._castling_fen(shredder)} {ep} {self.pos.halfmove} {self.pos.fullmove}")

    def __str__(self):
        return self.fen()

    # -- moves ---------------------------------------------------------------

    def legal_moves(self):
        """All legal moves as UCI strings."""
        cdef Move moves[MAX_MOVES]
        cdef int n = gen_legal(&self.pos, moves)
        return [_uci(&self.pos, moves[i]) for i in range(n)]

    cdef Move _parse_uci(self, str uci) except 0:
        """Find the legal move a UCI string names, accepting the same spellings as python-chess."""
        if len(uci) not in (4, 5) or not uci.isascii():
            raise ValueError(f"invalid uci move {uci!r}: expected 4 or 5 characters like e2e4 or e7e8q")
        if uci == "0000":
            raise ValueError("invalid uci move '0000': null moves cannot be played on a board")
        frm = _SQUARE_INDEX.get(uci[0:2])
        to = _SQUARE_INDEX.get(uci[2:4])
        if frm is None or to is None:
            raise ValueError(f"invalid uci move {uci!r}: not a pair of squares")
        promo = 0
        if len(uci) == 5:
            if uci[4] not in _PIECE_SYMBOLS:
                raise ValueError(f"invalid uci move {uci!r}: unknown promotion piece {uci[4]!r}")
            promo = _PIECE_SYMBOLS.index(uci[4]) + 1
        if frm == to:
            raise ValueError(f"invalid uci move {uci!r}: from and to square are the same")
        cdef Pos* p = &self.pos
        # python-chess's _to_chess960 / _from_chess960: e1g1 <-> e1h1 spellings of castling.
        if (frm == 4 or frm == 60) and (p.pieces[KING] & bb(frm)):
            if to == frm + 2 and not (p.pieces[ROOK] & bb(frm + 2)):
                to = frm + 3
                promo = 0
            elif to == frm - 2 and not (p.pieces[ROOK] & bb(frm - 2)):
                to = frm - 4
                promo = 0
        if not p.chess960 and promo == 0 and (frm == 4 or frm == 60) and (p.pieces[KING] & bb(frm)):
            if to == frm + 3:
                to = frm + 2
            elif to == frm - 4:
                to = frm - 2
        cdef Move moves[MAX_MOVES]
        cdef int n = gen_legal(p, moves)
        cdef int i, mto, mfrm
        for i in range(n):
            mfrm = moves[i] & 63
            mto = (moves[i] >> 6) & 63
            if not p.chess960 and (p.board[mfrm] & 7) == KING and p.board[mto] and (p.board[mto] >> 3) == p.turn:
                mto = (mfrm & 56) + (6 if mto > mfrm else 2)  # standard rendering of castling
            if mfrm == frm and mto == to and (moves[i] >> 12) == promo:
                return moves[i]
        raise ValueError(f"illegal uci move {uci!r} in {self.fen()}")

    def is_legal(self, uci):
        if not isinstance(uci, str):
            raise TypeError(f"move must be a str, not {type(uci).__name__}")
        try:
            self._parse_uci(uci)
        except ValueError:
            return False
        return True

    cdef int _push(self, Move m) except -1:
        cdef Undo* grown
        if self.nstack == self.capacity:
            grown = <Undo*>realloc(self.stack, 2 * self.capacity * sizeof(Undo))
            if grown == NULL:
                raise MemoryError()
            self.stack = grown
            self.capacity *= 2
        make_move(&self.pos, m, &self.stack[self.nstack])
        self.nstack += 1
        return 0

    def push_uci(self, uci):
        """Play a move given in UCI notation; ValueError (board unchanged) if malformed or illegal."""
        if not isinstance(uci, str):
            raise TypeError(f"move must be a str, not {type(uci).__name__}")
        self._push(self._parse_uci(uci))

    def pop(self):
        """Take back the last move and return it in UCI notation."""
        if self.nstack == 0:
            raise IndexError("pop from a board with no moves played")
        self.nstack -= 1
        unmake_move(&self.pos, &self.stack[self.nstack])
        return _uci(&self.pos, self.stack[self.nstack].move)

    def ply(self):
        """How many moves were pushed since the board was set up."""
        return self.nstack

    # -- game state ----------------------------------------------------------

    def is_check(self):
        return bool(in_check(&self.pos))

    def gives_check(self, str uci):
        """Whether the legal move ``uci`` would put the opponent in check (as python-chess's
        ``Board.gives_check``); an illegal move is a ValueError."""
        return bool(gives_check(&self.pos, self._parse_uci(uci)))

    cdef bint _has_moves(self) noexcept:
        cdef Move moves[MAX_MOVES]
        return gen_legal(&self.pos, moves) > 0

    def is_checkmate(self):
        return bool(in_check(&self.pos)) and not self._has_moves()

    def is_stalemate(self):
        return not in_check(&self.pos) and not self._has_moves()

    def is_insufficient_material(self):
        return bool(insufficient_material(&self.pos))

    def is_seventyfive_moves(self):
        return self.pos.halfmove >= 150 and self._has_moves()

    def is_fifty_moves(self):
        return self.pos.halfmove >= 100 and self._has_moves()

    def can_claim_fifty_moves(self):
        if self.is_fifty_moves():
            return True
        cdef Move moves[MAX_MOVES]
        cdef int n, i
        cdef Undo u
        cdef bint ok
        if self.pos.halfmove >= 99:
            n = gen_legal(&self.pos, moves)
            for i in range(n):
                make_move(&self.pos, moves[i], &u)
                ok = self.pos.halfmove >= 100 and self._has_moves()
                unmake_move(&self.pos, &u)
                if ok:
                    return True
        return False

    cdef int _repetitions(self, u64 key, int64_t limit) noexcept:
        """How often ``key`` occurred in the history within the last ``limit`` plies (not counting now)."""
        cdef int count = 0, i
        cdef int lo = 0
        if limit < self.nstack:
            lo = self.nstack - <int>limit
        for i in range(self.nstack - 1, lo - 1, -1):
            if self.stack[i].key == key:
                count += 1
        return count

    def is_repetition(self, int count=3):
        """Whether the current position occurred at least ``count`` times (now included)."""
        return 1 + self._repetitions(self.pos.key, self.pos.halfmove) >= count

    def is_fivefold_repetition(self):
        return self.is_repetition(5)

    def can_claim_threefold_repetition(self):
        """python-chess's rule: a threefold now, or one that a legal move would reach."""
        if self.is_repetition(3):
            return True
        cdef Move moves[MAX_MOVES]
        cdef int n = gen_legal(&self.pos, moves), i, c
        cdef Undo u
        cdef u64 key
        cdef int64_t window = self.pos.halfmove + 1
        for i in range(n):
            make_move(&self.pos, moves[i], &u)
            key = self.pos.key
            zeroing = self.pos.halfmove == 0
            unmake_move(&self.pos, &u)
            if zeroing:
                continue
            c = (1 if key == self.pos.key else 0) + self._repetitions(key, window - 1)
            if c >= 2:
                return True
        return False

    def can_claim_draw(self):
        return self.can_claim_fifty_moves() or self.can_claim_threefold_repetition()

    def outcome(self, *, bint claim_draw=False):
        """``(termination, winner)`` like python-chess's Outcome, or None while the game goes on."""
        has_moves = self._has_moves()
        if not has_moves and in_check(&self.pos):
            return ("checkmate", self.pos.turn == BLACK)
        if insufficient_material(&self.pos):
            return ("insufficient_material", None)
        if not has_moves:
            return ("stalemate", None)
        if self.pos.halfmove >= 150:
            return ("seventyfive_moves", None)
        if self.is_repetition(5):
            return ("fivefold_repetition", None)
        if claim_draw:
            if self.can_claim_fifty_moves():
                return ("fifty_moves", None)
            if self.can_claim_threefold_repetition():
                return ("threefold_repetition", None)
        return None

    def is_game_over(self, *, bint claim_draw=False):
        return self.outcome(claim_draw=claim_draw) is not None

    # -- perft ---------------------------------------------------------------

    def perft(self, int depth):
        """Count leaf nodes ``depth`` plies down (bulk-counted at the last ply)."""
        if depth < 0:
            raise ValueError(f"perft depth must be >= 0, got {depth}")
        cdef Pos p = self.pos
        cdef u64 n
        with nogil:
            n = perft(&p, depth)
        return n

    def perft_divide(self, int depth):
        """Perft split by root move: ``{uci: nodes below it}``."""
        if depth < 1:
            raise ValueError(f"perft divide depth must be >= 1, got {depth}")
        cdef Pos p = self.pos
        cdef Move moves[MAX_MOVES]
        cdef int n = gen_legal(&p, moves), i
        cdef Undo u
        cdef u64 c
        result = {}
        for i in range(n):
            name = _uci(&p, moves[i])
            make_move(&p, moves[i], &u)
            with nogil:
                c = perft(&p, depth - 1)
            unmake_move(&p, &u)
            result[name] = c
        return result


cdef u64 _clean_castling(const Pos* p) noexcept nogil:
    """python-chess's clean_castling_rights() for a freshly set-up position."""
    cdef u64 castling = p.castle & p.pieces[ROOK]
    cdef u64 wc = castling & RANK_1 & p.colors[WHITE]
    cdef u64 bc = castling & RANK_8 & p.colors[BLACK]
    cdef u64 wk, bk, wa, wh, ba, bh
    if not p.chess960:
        wc &= bb(0) | bb(7)
        bc &= bb(56) | bb(63)
        if not (p.colors[WHITE] & p.pieces[KING] & bb(4)):
            wc = 0
        if not (p.colors[BLACK] & p.pieces[KING] & bb(60)):
            bc = 0
        return wc | bc
    wk = p.colors[WHITE] & p.pieces[KING] & RANK_1
    bk = p.colors[BLACK] & p.pieces[KING] & RANK_8
    if not wk:
        wc = 0
    if not bk:
        bc = 0
    wa = wc & (~wc + 1)
    wh = bb(cz_msb(wc)) if wc else 0
    if wa and cz_msb(wa) > cz_msb(wk):
        wa = 0
    if wh and cz_msb(wh) < cz_msb(wk):
        wh = 0
    ba = bc & (~bc + 1)
    bh = bb(cz_msb(bc)) if bc else 0
    if ba and cz_msb(ba) > cz_msb(bk):
        ba = 0
    if bh and cz_msb(bh) < cz_msb(bk):
        bh = 0
    return wa | wh | ba | bh


cdef int _valid_ep_square(const Pos* p, int ep) noexcept nogil:
    """python-chess's _valid_ep_square(): the square if a double push could have left it, else -1."""
    cdef u64 pawn_mask, seventh
    if ep < 0:
        return -1
    if p.turn == WHITE:
        if (ep >> 3) != 5:
            return -1
        pawn_mask = bb(ep - 8)
        seventh = bb(ep + 8)
    else:
        if (ep >> 3) != 2:
            return -1
        pawn_mask = bb(ep + 8)
        seventh = bb(ep - 8)
    if not (p.pieces[PAWN] & p.colors[1 - p.turn] & pawn_mask):
        return -1
    if p.pieces[0] & bb(ep):
        return -1
    if p.pieces[0] & seventh:
        return -1
    return ep


cdef bint _attacked_for_king(const Pos* p, u64 path, u64 occ) noexcept nogil:
    """Whether any square of ``path`` is attacked by the side not to move, given occupancy ``occ``."""
    cdef int s
    while path:
        s = cz_lsb(path)
        path &= path - 1
        if attackers_to(p, s, occ) & p.colors[1 - p.turn]:
            return True
    return False
