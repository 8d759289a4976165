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
    # lc0's canonical transforms (position_transform's bits), applied in this order
    FLIP_TRANSFORM = 1       # files reversed (our king was on files a-d)
    MIRROR_TRANSFORM = 2     # ranks reversed (pawnless, our king was on ranks 5-8)
    TRANSPOSE_TRANSFORM = 4  # reflected in the a8-h1 diagonal (pawnless)

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

# lc0's other input formats (``input_format``: lc0's NetworkFormat.InputFormat, one of
# engine.encoding.INPUT_FORMATS: 1, 2, 3, 4, 5, 132, 133; the callers check it with
# format_supported). Format 1 goes to the functions above, unchanged.
cdef bint format_supported(int input_format) noexcept nogil

# The canonical transform lc0 encodes ``p`` with (0 for formats 1 and 2, and while castling rights remain).
cdef int position_transform(const Pos* p, int input_format) noexcept nogil

# Policy index of ``m`` in a position encoded with ``transform`` (position_transform's): the squares
# go through the planes' transform (lc0 v0.31's mapping, the one networks were trained with).
cdef int move_index_t(const Pos* p, Move m, int transform) noexcept nogil

cdef void encode_planes_format(const Pos* cur, const Undo* stack, int nstack, int start_ep,
                               int input_format, float* out) noexcept nogil

# As encode_planes_over, for ``input_format`` (``last``: planes 0-103 as the row holds them, in any format).
cdef void encode_planes_over_format(const Pos* cur, const Undo* stack, int nstack, int start_ep,
                                    int input_format, float* out, uint64_t* last) noexcept nogil

cdef void policy_priors_format(const Pos* p, const Move* moves, int n, const float* logits, float temperature,
                               int input_format, float* priors) noexcept nogil

cdef int legal_priors_format(const Pos* p, const float* logits, float temperature, int input_format,
                             Move* moves, float* priors) noexcept nogil
