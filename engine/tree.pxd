# cython: language_level=3
"""C-level layout of the MCTS tree: 32-byte nodes and 4-byte edges in flat pools."""

from libc.stdint cimport uint64_t, uint32_t, uint16_t, uint8_t, int8_t, int64_t
from engine.board cimport Pos, Undo, Move, Board

cdef struct Node:            # 32 bytes
    float wl                 # mean W - L, seen by the player who moved into this node
    float d                  # mean draw probability
    uint32_t n               # completed visits
    uint32_t edges           # index of the first edge in the edge pool
    uint32_t child           # first created child (children kept in edge order); 0 = none
    uint32_t sibling         # next created sibling; 0 = none
    uint16_t m               # mean plies left x 16 (exact plies to the end once proven)
    uint16_t n_in_flight     # visits gathered but not yet backed up
    uint8_t num_edges
    uint8_t edge_idx         # which edge of the parent leads here
    uint8_t flags            # NODE_* bits
    int8_t bound             # proven result for the player who moved in: -1, 0, +1 (valid with NODE_PROVEN)

cdef struct Edge:            # 4 bytes
    Move move
    uint16_t prior           # P x 65535

cdef struct Params:
    float cpuct
    float cpuct_base
    float cpuct_factor
    float cpuct_root
    float cpuct_base_root
    float cpuct_factor_root
    float fpu_value
    float fpu_value_root
    float policy_temperature
    float noise_epsilon
    float noise_alpha
    int two_fold_draws
    float moves_left_max_effect   # 0: no moves-left utility
    float moves_left_threshold
    float moves_left_slope
    float moves_left_constant_factor
    float moves_left_scaled_factor
    float moves_left_quadratic_factor
    int multipv                   # > 1: each of the best multipv root moves gets its share of visits

cdef struct CacheEntry:
    uint64_t key
    float wl                 # W - L for the side to move
    float d
    float m
    uint16_t nmoves
    uint16_t cap             # room in priors (kept across stores: no malloc/free per store)
    uint16_t* priors         # one per legal move, in gen_legal order, P x 65535

cdef struct Leaf:            # one network request in a batch
    void* tree               # TreeCore*
    uint32_t node
    uint32_t path            # offset of the path (node indices, root first) in the batch's path pool
    uint16_t depth           # number of moves from the root
    uint8_t turn             # side to move at the leaf
    uint64_t cache_key
    uint32_t moves           # offset of the leaf's legal moves (gen_legal's order) in the batch's move pool
    uint16_t nmoves

cdef struct TreeCore:
    Node* nodes
    uint32_t n_nodes
    uint32_t cap_nodes
    Edge* edges
    uint32_t n_edges
    uint32_t cap_edges
    uint64_t max_bytes       # memory budget for nodes + edges
    uint32_t root
    Pos root_pos
    Undo* stack              # game history, then the moves of the current path
    int root_ply             # length of the game history
    int cap_stack
    int start_ep
    Params params
    uint64_t rng
    uint64_t playouts        # visits backed up since the search began
    uint64_t cum_depth       # sum of their depths, for lc0's average depth
    int seldepth
    uint64_t collisions
    uint32_t pending         # leaves of this tree waiting in a batch
    Move* root_filter        # searchmoves: the root may only play these (NULL = all moves)
    int n_root_filter
    CacheEntry* cache        # shared NN cache (may be NULL)
    uint32_t cache_size
    int input_format         # lc0's input format of the network: the leaves' planes and priors
