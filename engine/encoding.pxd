# cython: language_level=3
"""C-level API of the lc0-compatible encoder, shared with the MCTS tree."""

from libc.stdint cimport uint64_t

from engine.board cimport Pos, Undo, Move

# The network contract's sizes, defined here once; Python reads them as
# engine.encoding.PLANES and engine.encoding.POLICY_SIZE.
cdef enum:
    INPUT_PLANES = 112
    POLICY_MOVES = 1858
    PLANE_FLOATS = INPUT_PLANES * 64
    HISTORY_PLANES = 104     # 8 history slots x 13 planes, each a bitboard of the squares at 1.0

# Policy index of a legal move of ``p`` (side-to-move view, castling as king-takes-rook).
cdef int move_index(const Pos* p, Move m) noexcept nogil

# Write the 112x8x8 float32 input of the position ``cur`` whose game so far is
# ``stack[0:nstack]`` (undo records, oldest first) into ``out``. ``start_ep`` is the
# en-passant square the game's starting FEN named, or -1.
cdef void encode_planes(const Pos* cur, const Undo* stack, int nstack, int start_ep,
                        float* out) noexcept nogil

# The same into a row that holds an earlier encoding whose planes 0-103 are ``last``
# (HISTORY_PLANES bitboards; all zero for a zeroed row): only the squares that differ are
# written, and ``last`` becomes this position's. A batch row is 28 KB; zeroing it whole
# for every leaf was a sixth of a self-play worker's time.
cdef void encode_planes_over(const Pos* cur, const Undo* stack, int nstack, int start_ep,
                             float* out, uint64_t* last) noexcept nogil

# Legal moves of ``p`` with their softmax priors over ``logits`` at ``temperature``;
# returns the number of moves written to ``moves``/``priors`` (room for MAX_MOVES).
cdef int legal_priors(const Pos* p, const float* logits, float temperature,
                      Move* moves, float* priors) noexcept nogil

# The same priors for ``moves[0:n]``, the legal moves of ``p`` already generated (in gen_legal's order).
cdef void policy_priors(const Pos* p, const Move* moves, int n, const float* logits, float temperature,
                        float* priors) noexcept nogil
