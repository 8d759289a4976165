# cython: language_level=3
"""C-level declarations of the chess core, shared with the encoder and the MCTS tree.

Squares run a1=0 .. h8=63. Piece types follow python-chess (PAWN=1 .. KING=6);
colours are WHITE=0, BLACK=1 internally. A move is 16 bits: from | to << 6 |
promotion << 12. Castling is always stored king-takes-own-rook (Chess960
style); only the UCI rendering depends on the Chess960 flag.
"""

from libc.stdint cimport uint64_t, uint16_t, uint8_t, int8_t, int32_t, int64_t

ctypedef uint64_t u64
ctypedef uint16_t Move

cdef extern from *:
    """
    static inline int cz_lsb(unsigned long long b) { return __builtin_ctzll(b); }
    static inline int cz_msb(unsigned long long b) { return 63 - __builtin_clzll(b); }
    static inline int cz_popcount(unsigned long long b) { return __builtin_popcountll(b); }
    """
    int cz_lsb(u64 b) nogil
    int cz_msb(u64 b) nogil
    int cz_popcount(u64 b) nogil

cdef enum:
    MAX_MOVES = 256
    WHITE = 0
    BLACK = 1
    NO_PIECE = 0
    PAWN = 1
    KNIGHT = 2
    BISHOP = 3
    ROOK = 4
    QUEEN = 5
    KING = 6
    UNDO_CASTLE = 1
    UNDO_EP = 2

cdef struct Undo:
    u64 key
    u64 castle
    int64_t halfmove
    int64_t fullmove
    Move move
    uint8_t captured     # piece code (colour << 3 | type) taken by the move, 0 if none (also for ep)
    uint8_t flags        # UNDO_CASTLE or UNDO_EP
    int8_t ep            # en-passant square before the move, -1 if none

cdef struct Pos:
    u64 pieces[7]        # by piece type, index 1..6; [0] holds all occupied squares
    u64 colors[2]
    u64 castle           # squares of the rooks that still carry castling rights
    u64 key              # incremental Zobrist hash
    uint8_t board[64]    # piece code per square: colour << 3 | type, 0 when empty
    int32_t ep           # en-passant target square, only when a legal ep capture exists; else -1
    int32_t turn
    int64_t halfmove
    int64_t fullmove
    int32_t chess960
    int32_t ksq[2]

# Move generation and make/unmake: C-level, no Python objects, callable without the GIL.
cdef int gen_legal(const Pos* p, Move* out) noexcept nogil
cdef void make_move(Pos* p, Move m, Undo* u) noexcept nogil
cdef void unmake_move(Pos* p, const Undo* u) noexcept nogil
cdef bint in_check(const Pos* p) noexcept nogil
cdef bint gives_check(const Pos* p, Move m) noexcept nogil
cdef u64 checkers(const Pos* p) noexcept nogil
cdef u64 perft(Pos* p, int depth) noexcept nogil
cdef u64 compute_key(const Pos* p) noexcept nogil
cdef bint insufficient_material(const Pos* p) noexcept nogil
cdef int move_to_uci(const Pos* p, Move m, char* buf) noexcept nogil


cdef class Board:
    cdef Pos pos
    cdef Undo* stack          # one entry per pushed move; stack[i].key is the key before move i
    cdef int nstack
    cdef int capacity
    cdef int start_ep         # the en-passant square the FEN named (even when no capture is legal), else -1

    cdef int _push(self, Move m) except -1
    cdef bint _has_moves(self) noexcept
    cdef int _repetitions(self, u64 key, int64_t limit) noexcept
    cdef Move _parse_uci(self, str uci) except 0
