# cython: language_level=3
"""The MCTS tree: PUCT selection, batched gathering over many trees, WDL backup.

Nodes (32 bytes) and edges (4 bytes) live in flat C pools per tree, with the
children of a node kept as a sibling list in edge order, as lc0 does. A
:class:`Batch` collects the leaves of any number of trees into one float32
input buffer, so a self-play worker evaluates the leaves of all its games in
one network call; ``Batch.backup`` expands the leaves and backs the values up
through each tree. Gathering and backup run without the GIL.

Values are stored from the view of the player who moved into the node, so a
parent picks the child with the highest ``wl`` directly.
"""

import numpy as np
cimport numpy as cnp

from engine.params import SearchParams

from libc.math cimport sqrtf, logf, powf, fabsf, isfinite
from libc.stdlib cimport malloc, realloc, free, calloc
from libc.string cimport memset, memcpy
from libc.stdint cimport uint64_t, uint32_t, uint16_t, uint8_t, int64_t

from engine.board cimport (Board, Pos, Undo, Move, MAX_MOVES, BLACK, WHITE, gen_legal, make_move,
                           unmake_move, in_check, gives_check, insufficient_material, move_to_uci)
from engine.encoding cimport (encode_planes_over_format, format_supported, policy_priors_format, INPUT_PLANES,
                              POLICY_MOVES, PLANE_FLOATS, HISTORY_PLANES)

cnp.import_array()

cdef enum:
    NODE_EXPANDED = 1     # edges exist
    NODE_TERMINAL = 2     # game over here (mate, stalemate, draw rules)
    NODE_PENDING = 4      # waiting for the network
    NODE_PROVEN = 8       # exact result known (terminal, or proven from the children)
    NODE_TWOFOLD = 16     # draw by a repetition that happened inside the tree (depends on the root)
    MAX_PATH = 1024

cdef float NO_BOUND = 2.0


# ---------------------------------------------------------------------------
# Small helpers.

cdef inline uint64_t _rand(TreeCore* t) noexcept nogil:
    t.rng += 0x9E3779B97F4A7C15ULL
    cdef uint64_t z = t.rng
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL
    return z ^ (z >> 31)


cdef inline double _uniform(TreeCore* t) noexcept nogil:
    return ((_rand(t) >> 11) + 0.5) * (1.0 / 9007199254740992.0)


cdef double _normal(TreeCore* t) noexcept nogil:
    cdef double u, v, s
    while True:
        u = 2.0 * _uniform(t) - 1.0
        v = 2.0 * _uniform(t) - 1.0
        s = u * u + v * v
        if 0.0 < s < 1.0:
            return u * sqrtf(<float>(-2.0 * logf(<float>s) / s))


cdef double _gamma(TreeCore* t, double alpha) noexcept nogil:
    """Marsaglia-Tsang gamma variate (alpha < 1 via the boost u^(1/alpha))."""
    cdef double boost = 1.0, d, c, x, v, u
    if alpha < 1.0:
        boost = powf(<float>_uniform(t), <float>(1.0 / alpha))
        alpha += 1.0
    d = alpha - 1.0 / 3.0
    c = 1.0 / sqrtf(<float>(9.0 * d))
    while True:
        x = _normal(t)
        v = 1.0 + c * x
        if v <= 0:
            continue
        v = v * v * v
        u = _uniform(t)
        if u < 1.0 - 0.0331 * x * x * x * x or logf(<float>u) < 0.5 * x * x + d * (1.0 - v + logf(<float>v)):
            return d * v * boost


cdef inline float _m_value(const Node* n) noexcept nogil:
    return n.m * (1.0 / 16.0)


cdef inline uint16_t _m_fixed(float plies) noexcept nogil:
    if plies < 0:
        plies = 0
    if plies > 4095:
        plies = 4095
    return <uint16_t>(plies * 16.0 + 0.5)


cdef inline uint64_t _cache_key(const Pos* p) noexcept nogil:
    return p.key ^ (<uint64_t>(p.halfmove + 1) * 0x9E3779B97F4A7C15ULL)


# ---------------------------------------------------------------------------
# Pools.

cdef void* _grow(void* pool, uint32_t* cap, uint32_t need, size_t item) noexcept nogil:
    """Double ``cap`` until it holds ``need`` items and realloc ``pool``; NULL if out of memory."""
    cdef uint32_t size = cap[0] * 2
    while size < need:
        size *= 2
    cdef void* p = realloc(pool, size * item)
    if p != NULL:
        cap[0] = size
    return p


cdef int _reserve(TreeCore* t, uint32_t nodes, uint32_t edges) noexcept nogil:
    """Make room for ``nodes`` more nodes and ``edges`` more edges; -1 if over budget or out of memory."""
    cdef void* p
    cdef uint64_t need = (<uint64_t>(t.n_nodes + nodes) * sizeof(Node)
                          + <uint64_t>(t.n_edges + edges) * sizeof(Edge))
    if t.max_bytes and need > t.max_bytes:
        return -1
    if t.n_nodes + nodes > t.cap_nodes:
        p = _grow(t.nodes, &t.cap_nodes, t.n_nodes + nodes, sizeof(Node))
        if p == NULL:
            return -1
        t.nodes = <Node*>p
    if t.n_edges + edges > t.cap_edges:
        p = _grow(t.edges, &t.cap_edges, t.n_edges + edges, sizeof(Edge))
        if p == NULL:
            return -1
        t.edges = <Edge*>p
    return 0


cdef inline uint32_t _new_node(TreeCore* t, uint8_t edge_idx) noexcept nogil:
    cdef uint32_t i = t.n_nodes
    t.n_nodes += 1
    memset(&t.nodes[i], 0, sizeof(Node))
    t.nodes[i].edge_idx = edge_idx
    return i


cdef void _clear_pools(TreeCore* t) noexcept nogil:
    t.n_nodes = 1          # node 0 is the null node
    t.n_edges = 0
    memset(&t.nodes[0], 0, sizeof(Node))
    t.root = _new_node(t, 0)


# ---------------------------------------------------------------------------
# Selection.

cdef inline float _cpuct(const Params* p, uint32_t n, bint root) noexcept nogil:
    if root:
        return p.cpuct_root + p.cpuct_factor_root * logf((n + p.cpuct_base_root) / p.cpuct_base_root)
    return p.cpuct + p.cpuct_factor * logf((n + p.cpuct_base) / p.cpuct_base)


cdef inline float _m_utility(const Params* prm, float parent_m, const Node* c, float q) noexcept nogil:
    """lc0's moves-left utility of a visited child: winning, prefer the child that ends the game
    sooner; losing, the one that lasts longer. ``q`` is the child's value for the player choosing."""
    cdef float m = prm.moves_left_slope * (_m_value(c) - parent_m)
    if m > prm.moves_left_max_effect:
        m = prm.moves_left_max_effect
    elif m < -prm.moves_left_max_effect:
        m = -prm.moves_left_max_effect
    if q > 0:
        m = -m
    elif q == 0:
        return 0.0
    q = (fabsf(q) - prm.moves_left_threshold) / (1.0 - prm.moves_left_threshold)
    if q < 0:
        q = 0
    return m * (prm.moves_left_constant_factor + prm.moves_left_scaled_factor * q
                + prm.moves_left_quadratic_factor * q * q)


# MultiPV N > 1: the N best root moves share at least this part of the root's visits, each an
# equal part (docs/engine.md, "MultiPV").
cdef float MULTIPV_SHARE = 0.5


cdef int _multipv_edge(TreeCore* t, uint32_t ni) noexcept nogil:
    """MultiPV N > 1, at the root: the edge of one of the N best moves (visits, then prior, as the
    lines are ranked) that has fewer than MULTIPV_SHARE / N of the root's visits, the furthest
    below first; -1 when every line has its share. A line's score is then its own subtree's, not
    an unvisited move shown with the root's value."""
    cdef Node* node = &t.nodes[ni]
    cdef int lines = t.params.multipv
    cdef float floor = MULTIPV_SHARE * <float>(node.n - 1 if node.n > 0 else 0) / lines
    cdef uint32_t n_of[256]
    cdef uint32_t busy[256]
    cdef uint16_t prior[256]
    cdef int edge_of[256]
    cdef int count = 0, i, j, ahead, best = -1
    cdef float deficit, most = 0.0
    cdef uint32_t ci = node.child
    cdef Edge* edges = &t.edges[node.edges]
    for i in range(node.num_edges):
        n_of[count] = 0
        busy[count] = 0
        if ci and t.nodes[ci].edge_idx == i:
            n_of[count] = t.nodes[ci].n
            busy[count] = t.nodes[ci].n_in_flight
            ci = t.nodes[ci].sibling
        if t.root_filter != NULL and not _in_filter(t, edges[i].move):
            continue
        prior[count] = edges[i].prior
        edge_of[count] = i
        count += 1
    for i in range(count):
        deficit = floor - <float>(n_of[i] + busy[i])
        if deficit <= most:
            continue
        ahead = 0    # moves ranked before this one: more visits, or as many and a higher prior
        for j in range(count):
            if n_of[j] > n_of[i] or (n_of[j] == n_of[i] and (prior[j] > prior[i] or (prior[j] == prior[i] and j < i))):
                ahead += 1
                if ahead >= lines:
                    break
        if ahead < lines:
            most = deficit
            best = edge_of[i]
    return best


cdef int _select(TreeCore* t, uint32_t ni, bint root) noexcept nogil:
    """Index of the edge to explore from node ``ni`` (PUCT with FPU reduction), -1 if none allowed.

    One pass over the edges and the (edge-ordered) child list: visited children are scored
    as they come; for the unvisited ones, which all share the FPU value, only the best
    prior / (1 + in-flight) is kept, and the FPU is applied once the visited policy is known.
    """
    cdef Node* node = &t.nodes[ni]
    cdef Edge* edges = &t.edges[node.edges]
    cdef Params* prm = &t.params
    cdef uint32_t children_visits = node.n - 1 if node.n > 0 else 0
    cdef float puct = _cpuct(prm, node.n, root) * sqrtf(<float>(children_visits if children_visits > 1 else 1))
    cdef float visited_policy = 0.0, p, u, score, q
    cdef float best_score = -1e30, fresh_u = -1.0
    cdef int best = -1, fresh = -1, i
    cdef uint32_t ci = node.child
    cdef Node* c
    # The moves-left utility applies once the position is decided enough (lc0's threshold on |Q|).
    cdef bint moves_left = prm.moves_left_max_effect > 0 and node.n > 0 \
        and fabsf(node.wl) > prm.moves_left_threshold
    cdef float parent_m = _m_value(node)
    if root and prm.multipv > 1:
        i = _multipv_edge(t, ni)
        if i >= 0:
            return i
    for i in range(node.num_edges):
        p = edges[i].prior * (1.0 / 65535.0)
        if ci and t.nodes[ci].edge_idx == i:
            c = &t.nodes[ci]
            ci = c.sibling
            if root and t.root_filter != NULL and not _in_filter(t, edges[i].move):
                continue
            if c.n > 0:
                visited_policy += p
                q = c.bound if c.flags & NODE_PROVEN else c.wl
                score = q + puct * p / (1.0 + c.n + c.n_in_flight)
                if moves_left:
                    score += _m_utility(prm, parent_m, c, q)
                if score > best_score:
                    best_score = score
                    best = i
            else:
                u = p / (1.0 + c.n_in_flight)
                if u > fresh_u:
                    fresh_u = u
                    fresh = i
        else:
            if root and t.root_filter != NULL and not _in_filter(t, edges[i].move):
                continue
            if p > fresh_u:
                fresh_u = p
                fresh = i
            elif not root and not ci:
                break  # edges are sorted by prior: no later unvisited edge can score higher
    if fresh >= 0:
        # node.wl is seen by whoever moved into this node; its children by the player to move here.
        q = (-node.wl if node.n > 0 else 0.0) - prm.fpu_value_root * sqrtf(visited_policy) if root \
            else (-node.wl if node.n > 0 else 0.0) - prm.fpu_value * sqrtf(visited_policy)
        score = q + puct * fresh_u
        if best < 0 or score > best_score:
            return fresh
    return best


cdef inline uint32_t _child(TreeCore* t, uint32_t ni, int edge) noexcept nogil:
    """The child node behind ``edge``, created (in edge order) if missing; 0 if out of memory."""
    cdef uint32_t prev = 0, ci = t.nodes[ni].child, nc
    while ci and t.nodes[ci].edge_idx < edge:
        prev = ci
        ci = t.nodes[ci].sibling
    if ci and t.nodes[ci].edge_idx == edge:
        return ci
    if _reserve(t, 1, 0) < 0:
        return 0
    nc = _new_node(t, <uint8_t>edge)
    t.nodes[nc].sibling = ci
    if prev:
        t.nodes[prev].sibling = nc
    else:
        t.nodes[ni].child = nc
    return nc


# ---------------------------------------------------------------------------
# Terminal detection and proofs.

cdef inline int _earlier_occurrences(TreeCore* t, const Pos* p, int ply, bint* in_tree) noexcept nogil:
    """How often the position at ``ply`` occurred before (within the fifty-move window);
    ``in_tree`` tells whether one of those is at or after the root."""
    cdef int j = ply - 4, count = 0
    cdef int64_t lo = ply - p.halfmove
    in_tree[0] = False
    if lo < 0:
        lo = 0
    while j >= lo:
        if t.stack[j].key == p.key:
            count += 1
            if j >= t.root_ply:
                in_tree[0] = True
        j -= 2
    return count


cdef inline bint _is_repetition_draw(TreeCore* t, const Pos* p, int ply) noexcept nogil:
    """Threefold with the game history, or twofold where the earlier position is in the tree."""
    cdef bint in_tree
    cdef int count = _earlier_occurrences(t, p, ply, &in_tree)
    return count >= 2 or (count >= 1 and in_tree and t.params.two_fold_draws)


cdef inline bint _twofold_only(TreeCore* t, const Pos* p, int ply) noexcept nogil:
    """Whether the repetition draw at ``ply`` needs the in-tree twofold rule (it depends on the root)."""
    cdef bint in_tree
    return _earlier_occurrences(t, p, ply, &in_tree) < 2


cdef bint _mates_in_one(const Pos* p, const Move* moves, int n) noexcept nogil:
    """Whether one of the ``n`` legal ``moves`` of ``p`` gives mate.  Only a move that gives
    check can mate: ``gives_check`` (attack tables, no move made) picks those out, and only they
    are made and their replies generated."""
    cdef Pos q
    cdef Undo u
    cdef Move replies[MAX_MOVES]
    cdef int i
    for i in range(n):
        if not gives_check(p, moves[i]):
            continue
        q = p[0]
        make_move(&q, moves[i], &u)
        if in_check(&q) and gen_legal(&q, replies) == 0:
            return True
    return False


cdef void _prove_up(TreeCore* t, const uint32_t* path, int depth) noexcept nogil:
    """Propagate exact results upwards while the children prove their parents."""
    cdef int k
    cdef uint32_t ni, ci
    cdef Node* node
    cdef Node* c
    cdef int best_lower, best_upper, cb, i, seen
    cdef int m_win, m_loss, m_c
    for k in range(depth - 1, -1, -1):
        ni = path[k]
        node = &t.nodes[ni]
        if node.flags & NODE_PROVEN or not (node.flags & NODE_EXPANDED):
            return
        # Child results are seen by the player to move here; the parent's by the other.
        best_lower = -1
        best_upper = -1
        m_win = 1 << 30
        m_loss = 0
        seen = 0
        ci = node.child
        for i in range(node.num_edges):
            if ci and t.nodes[ci].edge_idx == i:
                c = &t.nodes[ci]
                ci = c.sibling
                if c.flags & NODE_PROVEN:
                    cb = c.bound
                    m_c = c.m >> 4
                    if cb > best_lower:
                        best_lower = cb
                    if cb > best_upper:
                        best_upper = cb
                    if cb == 1 and m_c < m_win:
                        m_win = m_c
                    if m_c > m_loss:
                        m_loss = m_c
                    seen += 1
                    continue
            best_upper = 1   # an unproven child could still be anything
        if best_lower == 1:
            node.bound = -1
            node.m = _m_fixed(m_win + 1)
        elif best_upper == best_lower:
            node.bound = -best_lower
            if best_lower == -1:
                node.m = _m_fixed(m_loss + 1)
        else:
            return
        node.flags |= NODE_PROVEN


# ---------------------------------------------------------------------------
# Backup.

cdef void _backup(TreeCore* t, const uint32_t* path, int depth, float wl, float d, float m) noexcept nogil:
    """Back one visit of value (wl, d, m) at path[depth] (seen by the player who moved in) up to the root."""
    cdef int k
    cdef Node* node
    cdef float inv
    for k in range(depth, -1, -1):
        node = &t.nodes[path[k]]
        if node.n_in_flight:
            node.n_in_flight -= 1
        node.n += 1
        inv = 1.0 / node.n
        node.wl += (wl - node.wl) * inv
        node.d += (d - node.d) * inv
        if not (node.flags & NODE_PROVEN) or node.bound == 0:
            node.m = _m_fixed(_m_value(node) + (m - _m_value(node)) * inv)
        wl = -wl
        m += 1.0
    t.playouts += 1
    t.cum_depth += depth
    if depth > t.seldepth:
        t.seldepth = depth


cdef void _cancel(TreeCore* t, const uint32_t* path, int depth) noexcept nogil:
    """Undo the in-flight marks of a collided path."""
    cdef int k
    for k in range(depth, -1, -1):
        if t.nodes[path[k]].n_in_flight:
            t.nodes[path[k]].n_in_flight -= 1


cdef int _expand(TreeCore* t, uint32_t ni, const Pos* p, const Move* moves, int n,
                 const float* priors) noexcept nogil:
    """Give node ``ni`` one edge per legal move, sorted by prior (highest first)."""
    cdef int i, j
    cdef Edge e
    cdef Edge* edges
    if _reserve(t, 0, n) < 0:
        return -1
    t.nodes[ni].edges = t.n_edges
    t.nodes[ni].num_edges = n
    edges = &t.edges[t.n_edges]
    t.n_edges += n
    for i in range(n):
        e.move = moves[i]
        e.prior = <uint16_t>(priors[i] * 65535.0 + 0.5) if priors[i] < 1.0 else 65535
        j = i
        while j > 0 and edges[j - 1].prior < e.prior:
            edges[j] = edges[j - 1]
            j -= 1
        edges[j] = e
    t.nodes[ni].flags |= NODE_EXPANDED
    t.nodes[ni].flags &= ~NODE_PENDING
    return 0


cdef void _root_expanded(TreeCore* t) noexcept nogil:
    """What the root gets once it has its edges: Dirichlet noise (self-play), then its mates in one proven."""
    _apply_root_noise(t)
    _prove_root_mates(t)


cdef void _prove_root_mates(TreeCore* t) noexcept nogil:
    """Each root move that mates at once (and that searchmoves allows) becomes a proven win with
    one visit of its own, and the root is proven with it.

    Below the root a mate in one is seen on arrival (``_gather_paths``); at the root the mating
    move is only found once the search visits it, and a policy that gives it next to nothing (a
    queen that takes a guarded pawn to mate) kept a 20,000-node search away from it. Checking the
    root's moves costs a few make_move calls once per expansion of a root."""
    cdef uint32_t root = t.root, child
    cdef uint32_t path[1]
    cdef int i, found = 0
    cdef Pos q
    cdef Undo u
    cdef Move m
    cdef Move replies[MAX_MOVES]
    path[0] = root
    for i in range(t.nodes[root].num_edges):
        m = t.edges[t.nodes[root].edges + i].move
        if t.n_root_filter and not _in_filter(t, m):
            continue
        if not gives_check(&t.root_pos, m):
            continue
        q = t.root_pos
        make_move(&q, m, &u)
        if not in_check(&q) or gen_legal(&q, replies):
            continue
        child = _child(t, root, i)
        if child == 0:       # out of memory: the search may still find it
            break
        t.nodes[child].flags |= NODE_TERMINAL | NODE_PROVEN
        t.nodes[child].bound = 1
        t.nodes[child].m = 0
        # The child's one visit (so that the visit counts, a self-play policy target, name it) is
        # not the root's: a search held to N nodes (`go nodes 1`) still reports N.
        t.nodes[child].n = 1
        t.nodes[child].wl = 1.0
        t.nodes[child].d = 0.0
        found += 1
    if found:
        _prove_up(t, path, 1)


cdef void _apply_root_noise(TreeCore* t) noexcept nogil:
    """Mix Dirichlet(alpha) noise into the root priors with weight epsilon (self-play exploration)."""
    cdef Node* root = &t.nodes[t.root]
    cdef int n = root.num_edges, i
    cdef double noise[256]
    cdef double total = 0.0, p
    if t.params.noise_epsilon <= 0 or n == 0:
        return
    for i in range(n):
        noise[i] = _gamma(t, t.params.noise_alpha)
        total += noise[i]
    if total <= 0:
        return
    for i in range(n):
        p = t.edges[root.edges + i].prior / 65535.0
        p = (1.0 - t.params.noise_epsilon) * p + t.params.noise_epsilon * noise[i] / total
        t.edges[root.edges + i].prior = <uint16_t>(p * 65535.0 + 0.5) if p < 1.0 else 65535


# ---------------------------------------------------------------------------
# The batch shared by many trees.

cdef class Batch:
    """Network requests gathered from one or more trees, with their input planes.

    ``planes[:size]`` is the input to evaluate; ``backup(policy, wdl, mlh)``
    hands the results to the trees and empties the batch.
    """

    cdef Leaf* leaves
    cdef Pos* positions      # each leaf's position, kept from the gather for its expansion
    cdef uint32_t* paths
    cdef uint32_t n_paths, cap_paths
    cdef Move* moves         # each leaf's legal moves, from the gather's terminal check
    cdef uint32_t n_moves, cap_moves
    cdef readonly int size
    cdef readonly int capacity
    cdef readonly bint encode
    cdef readonly object planes
    cdef float* planes_ptr
    cdef uint64_t* written   # each row's planes 0-103 as last encoded (encode_planes_over)
    cdef list _owners

    def __cinit__(self, int capacity=256, *, bint encode=True):
        """``encode=False`` skips writing input planes (for evaluators that ignore them)."""
        self.encode = encode
        if capacity < 1:
            raise ValueError(f"batch capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.size = 0
        self.leaves = <Leaf*>malloc(capacity * sizeof(Leaf))
        self.positions = <Pos*>malloc(capacity * sizeof(Pos))
        self.cap_paths = capacity * 64
        self.paths = <uint32_t*>malloc(self.cap_paths * sizeof(uint32_t))
        self.n_paths = 0
        self.cap_moves = capacity * 64
        self.moves = <Move*>malloc(self.cap_moves * sizeof(Move))
        self.n_moves = 0
        # Zeroed, as the planes are: every row starts as an encoding of nothing.
        self.written = <uint64_t*>calloc((capacity if encode else 1) * HISTORY_PLANES, sizeof(uint64_t))
        if (self.leaves == NULL or self.positions == NULL or self.paths == NULL or self.moves == NULL
                or self.written == NULL):
            raise MemoryError()
        self.planes = np.zeros((capacity if encode else 1, INPUT_PLANES, 8, 8), dtype=np.float32)
        cdef float[:, :, :, ::1] view = self.planes
        self.planes_ptr = &view[0, 0, 0, 0]
        self._owners = []

    def __dealloc__(self):
        free(self.leaves)
        free(self.positions)
        free(self.paths)
        free(self.moves)
        free(self.written)

    def __len__(self):
        return self.size

    @property
    def full(self):
        return self.size >= self.capacity

    cdef int _reserve_path(self, int depth) noexcept nogil:
        cdef void* p
        if self.n_paths + depth + 1 > self.cap_paths:
            p = _grow(self.paths, &self.cap_paths, self.n_paths + depth + 1, sizeof(uint32_t))
            if p == NULL:
                return -1
            self.paths = <uint32_t*>p
        return 0

    cdef int _reserve_moves(self, int n) noexcept nogil:
        cdef void* p
        if self.n_moves + n > self.cap_moves:
            p = _grow(self.moves, &self.cap_moves, self.n_moves + n, sizeof(Move))
            if p == NULL:
                return -1
            self.moves = <Move*>p
        return 0

    def backup(self, policy, wdl, mlh=None):
        """Expand every gathered leaf with the network's ``policy`` logits [N,1858], ``wdl`` [N,3]
        (probabilities for the side to move at the leaf) and optional ``mlh`` [N], then back
        the values up through their trees and empty the batch."""
        cdef int n = self.size
        if n == 0:
            return
        cdef float[:, ::1] pol = np.ascontiguousarray(policy, dtype=np.float32)
        cdef float[:, ::1] w = np.ascontiguousarray(wdl, dtype=np.float32)
        if pol.shape[0] < n or pol.shape[1] != POLICY_MOVES or w.shape[0] < n or w.shape[1] != 3:
            raise ValueError(f"backup needs policy [{n},{POLICY_MOVES}] and wdl [{n},3], "
                             f"got {tuple(np.shape(policy))} and {tuple(np.shape(wdl))}")
        cdef const float* wp = &w[0, 0]
        cdef int k
        for k in range(3 * n):      # rows 0 to n-1 of the contiguous [N,3] (no array made per batch)
            if not isfinite(wp[k]):
                raise ValueError("backup needs finite wdl values")
        cdef float[::1] ml
        cdef float* ml_ptr = NULL
        if mlh is not None:
            ml = np.ascontiguousarray(mlh, dtype=np.float32).reshape(-1)
            if ml.shape[0] < n:
                raise ValueError(f"backup needs mlh [{n}], got {tuple(np.shape(mlh))}")
            ml_ptr = &ml[0]
        cdef int i
        with nogil:
            for i in range(n):
                _backup_leaf(&self.leaves[i], &self.positions[i], self.paths, self.moves, &pol[i, 0],
                             &w[i, 0], ml_ptr[i] if ml_ptr != NULL else 0.0)
        self.size = 0
        self.n_paths = 0
        self.n_moves = 0
        self._owners.clear()

    def clear(self):
        """Drop the gathered leaves without evaluating them (their in-flight marks are undone)."""
        cdef int i
        cdef Leaf* lf
        for i in range(self.size):
            lf = &self.leaves[i]
            (<TreeCore*>lf.tree).pending -= 1
            (<TreeCore*>lf.tree).nodes[lf.node].flags &= ~NODE_PENDING
            _cancel(<TreeCore*>lf.tree, &self.paths[lf.path], lf.depth)
        self.size = 0
        self.n_paths = 0
        self.n_moves = 0
        self._owners.clear()


cdef void _backup_leaf(Leaf* lf, const Pos* p, const uint32_t* paths, const Move* batch_moves,
                       const float* logits, const float* wdl, float mlh) noexcept nogil:
    """Expand one network leaf (its position ``p`` and legal moves kept from the gather) from its
    logits and back its value up."""
    cdef TreeCore* t = <TreeCore*>lf.tree
    cdef uint32_t ni = lf.node
    t.pending -= 1
    cdef const Move* moves = &batch_moves[lf.moves]
    cdef float priors[MAX_MOVES]
    cdef int n = lf.nmoves, i
    cdef float wl = wdl[0] - wdl[2]
    cdef CacheEntry* ce
    # Format 1 (and a position no transform applies to) goes straight to the classical path.
    policy_priors_format(p, moves, n, logits, t.params.policy_temperature, t.input_format, priors)
    if t.cache != NULL and t.cache_size:
        ce = &t.cache[lf.cache_key % t.cache_size]
        if ce.priors == NULL or ce.cap < n:
            free(ce.priors)
            ce.cap = (n + 15) & ~15 if n else 16   # whole rows of 16: a slot seldom has to grow again
            ce.priors = <uint16_t*>malloc(ce.cap * sizeof(uint16_t))
            if ce.priors == NULL:
                ce.cap = 0
        if ce.priors != NULL:
            ce.key = lf.cache_key
            ce.wl = wl
            ce.d = wdl[1]
            ce.m = mlh
            ce.nmoves = n
            for i in range(n):
                ce.priors[i] = <uint16_t>(priors[i] * 65535.0 + 0.5) if priors[i] < 1.0 else 65535
    if _expand(t, ni, p, moves, n, priors) < 0:
        t.nodes[ni].flags &= ~NODE_PENDING
        _cancel(t, &paths[lf.path], lf.depth)
        return
    if ni == t.root:
        _root_expanded(t)
    _backup(t, &paths[lf.path], lf.depth, -wl, wdl[1], mlh)


# ---------------------------------------------------------------------------
# The NN cache.

cdef class NNCache:
    """Network results keyed by position hash (and rule50 count), bounded to ``capacity`` entries.

    Direct-mapped: a new result replaces whatever shared its slot. Holds the legal
    moves' priors (after the policy softmax) and the WDL and moves-left values.
    """

    cdef CacheEntry* entries
    cdef readonly uint32_t capacity

    def __cinit__(self, capacity=200000):
        if capacity < 0:
            raise ValueError(f"NN cache size must be >= 0, got {capacity}")
        self.capacity = capacity
        self.entries = <CacheEntry*>calloc(capacity if capacity else 1, sizeof(CacheEntry))
        if self.entries == NULL:
            raise MemoryError()

    def __dealloc__(self):
        self._free_priors()
        free(self.entries)

    cdef void _free_priors(self) noexcept:
        cdef uint32_t i
        for i in range(self.capacity):
            free(self.entries[i].priors)
            self.entries[i].priors = NULL
            self.entries[i].cap = 0
            self.entries[i].key = 0

    def clear(self):
        """Forget everything (new game, new network, new policy temperature)."""
        self._free_priors()

    def __len__(self):
        cdef uint32_t i, n = 0
        for i in range(self.capacity):
            if self.entries[i].priors != NULL:
                n += 1
        return n

    def lookup(self, Board board not None):
        """``(wl, d, m, {uci: prior})`` cached for ``board``'s position, or None."""
        if self.capacity == 0:
            return None
        cdef uint64_t key = _cache_key(&board.pos)
        cdef CacheEntry* e = &self.entries[key % self.capacity]
        if e.priors == NULL or e.key != key:
            return None
        moves = board.legal_moves()
        if len(moves) != e.nmoves:
            return None
        return (e.wl, e.d, e.m, {mv: e.priors[i] / 65535.0 for i, mv in enumerate(moves)})


# ---------------------------------------------------------------------------
# The tree.

# The tree's settings and their checks come from the one table of search parameters.
_SETTINGS = {row.name: row for row in SearchParams.table() if row.tree}


cdef class Tree:
    """One game's search tree. ``set_position`` (re)roots it, reusing the subtree
    when the new position extends the old one; ``gather`` adds leaves to a Batch."""

    cdef TreeCore core
    cdef Board game
    cdef NNCache cache
    cdef object _searchmoves
    cdef object _allowed

    def __cinit__(self):
        memset(&self.core, 0, sizeof(TreeCore))
        self.core.cap_nodes = 1024
        self.core.cap_edges = 8192
        self.core.nodes = <Node*>malloc(self.core.cap_nodes * sizeof(Node))
        self.core.edges = <Edge*>malloc(self.core.cap_edges * sizeof(Edge))
        self.core.cap_stack = 256 + MAX_PATH
        self.core.stack = <Undo*>malloc(self.core.cap_stack * sizeof(Undo))
        if self.core.nodes == NULL or self.core.edges == NULL or self.core.stack == NULL:
            raise MemoryError()
        self.core.input_format = 1
        _clear_pools(&self.core)

    def __dealloc__(self):
        free(self.core.nodes)
        free(self.core.edges)
        free(self.core.stack)
        free(self.core.root_filter)

    def __init__(self, Board board=None, *, NNCache cache=None, seed=None, max_bytes=0, **params):
        self.cache = cache
        self.configure(**{**SearchParams().tree_settings(), **params})
        self.seed(seed)
        self.core.max_bytes = max_bytes
        self._searchmoves = None
        self.set_position(board if board is not None else Board())

    def configure(self, **params):
        """Set search parameters by name (the rows of ``engine.params.SearchParams`` marked
        ``tree``), each checked by its row; all are checked before any is set."""
        checked = {}
        for name, value in params.items():
            row = _SETTINGS.get(name)
            if row is None:
                raise ValueError(f"unknown search parameter {name!r}; the tree takes "
                                 f"{', '.join(sorted(_SETTINGS))}")
            checked[name] = row.check(value)
        for name, value in checked.items():
            _set_param(&self.core.params, name, value)

    @property
    def input_format(self):
        """lc0's input format (engine.encoding.INPUT_FORMATS) of the network the tree is searched
        with: the leaves' planes are written in it and the network's policy read through its
        canonical transform. Its evaluations are of that format, so a change empties the tree (the
        caller clears an NN cache shared with it)."""
        return self.core.input_format

    @input_format.setter
    def input_format(self, int value):
        if not format_supported(value):
            raise ValueError(f"unknown lc0 input format {value}; the encoder writes 1, 2, 3, 4, 5, 132 and 133")
        if value != self.core.input_format:
            self._check_no_pending()
            self.core.input_format = value
            game = self.game
            _clear_pools(&self.core)
            self.game = None
            self.set_position(game if game is not None else Board())

    def settings(self):
        """The settings in force, by name, as the tree holds them (float32)."""
        return _params_dict(&self.core.params)

    def seed(self, seed=None):
        """Seed the tree's random numbers (Dirichlet noise, temperature); None picks one."""
        if seed is None:
            seed = int.from_bytes(__import__("os").urandom(8), "little")
        self.core.rng = <uint64_t>(seed & 0xFFFFFFFFFFFFFFFF)

    @property
    def max_bytes(self):
        return self.core.max_bytes

    @max_bytes.setter
    def max_bytes(self, value):
        self.core.max_bytes = value

    # -- rooting -----------------------------------------------------------

    def set_position(self, Board board not None):
        """Root the tree at ``board`` (with its history). Returns True when the old
        tree was reused because ``board`` extends the previous position."""
        self._check_no_pending()
        reused = self._try_reuse(board)
        if not reused:
            _clear_pools(&self.core)
        self.game = board.copy()
        self.core.root_pos = board.pos
        self.core.start_ep = board.start_ep
        self.core.root_ply = board.nstack
        if board.nstack + MAX_PATH > self.core.cap_stack:
            new = <Undo*>realloc(self.core.stack, (board.nstack + MAX_PATH) * sizeof(Undo))
            if new == NULL:
                raise MemoryError()
            self.core.stack = new
            self.core.cap_stack = board.nstack + MAX_PATH
        memcpy(self.core.stack, board.stack, board.nstack * sizeof(Undo))
        self._set_root_filter(self._searchmoves)
        self.core.playouts = 0
        self.core.cum_depth = 0
        self.core.seldepth = 0
        self.core.collisions = 0
        if reused and self.core.params.noise_epsilon > 0:
            _apply_root_noise(&self.core)
        if reused and self.core.n_nodes > 2 * self.core.nodes[self.core.root].n + 65536:
            self._compact()
        return reused

    cdef bint _try_reuse(self, Board board):
        if self.game is None or board.nstack < self.game.nstack:
            return False
        cdef Board old = self.game
        cdef int i
        cdef uint64_t first_old = old.stack[0].key if old.nstack else old.pos.key
        cdef uint64_t first_new = board.stack[0].key if board.nstack else board.pos.key
        if first_old != first_new or old.pos.chess960 != board.pos.chess960:
            return False
        for i in range(old.nstack):
            if old.stack[i].move != board.stack[i].move:
                return False
        cdef uint32_t node = self.core.root
        cdef Node* nd
        cdef int e
        cdef uint32_t ci
        for i in range(old.nstack, board.nstack):
            nd = &self.core.nodes[node]
            if not (nd.flags & NODE_EXPANDED):
                return False
            ci = nd.child
            found = False
            while ci:
                if self.core.edges[nd.edges + self.core.nodes[ci].edge_idx].move == board.stack[i].move:
                    found = True
                    break
                ci = self.core.nodes[ci].sibling
            if not found:
                return False
            node = ci
        self.core.root = node
        # In-tree twofold draws are judged against the old root; let them be looked at again.
        self._clear_twofold(node)
        return True

    cdef void _clear_twofold(self, uint32_t root):
        """Drop terminal marks that depend on where the root is (revisits re-check them)."""
        cdef uint32_t i
        for i in range(1, self.core.n_nodes):
            if self.core.nodes[i].flags & NODE_TWOFOLD:
                self.core.nodes[i].flags &= ~(NODE_TWOFOLD | NODE_TERMINAL | NODE_PROVEN)
        # Proofs above such nodes may no longer hold; clear all derived proofs (terminals stay).
        for i in range(1, self.core.n_nodes):
            if (self.core.nodes[i].flags & NODE_PROVEN) and not (self.core.nodes[i].flags & NODE_TERMINAL):
                self.core.nodes[i].flags &= ~NODE_PROVEN

    cdef void _compact(self):
        """Copy the live subtree into fresh pools so memory from discarded branches is returned."""
        cdef TreeCore* t = &self.core
        cdef TreeCore fresh
        memcpy(&fresh, t, sizeof(TreeCore))
        fresh.cap_nodes = 1024
        while fresh.cap_nodes < 2 * (t.nodes[t.root].n + 16):
            fresh.cap_nodes *= 2
        fresh.cap_edges = 8192
        fresh.nodes = <Node*>malloc(fresh.cap_nodes * sizeof(Node))
        fresh.edges = <Edge*>malloc(fresh.cap_edges * sizeof(Edge))
        if fresh.nodes == NULL or fresh.edges == NULL:
            free(fresh.nodes)
            free(fresh.edges)
            return
        fresh.max_bytes = 0
        _clear_pools(&fresh)
        if _copy_subtree(t, t.root, &fresh, fresh.root) < 0:
            free(fresh.nodes)
            free(fresh.edges)
            return
        free(t.nodes)
        free(t.edges)
        t.nodes = fresh.nodes
        t.edges = fresh.edges
        t.n_nodes = fresh.n_nodes
        t.cap_nodes = fresh.cap_nodes
        t.n_edges = fresh.n_edges
        t.cap_edges = fresh.cap_edges
        t.root = fresh.root

    cdef _check_no_pending(self):
        if self.core.pending:
            raise RuntimeError(f"{self.core.pending} leaves of this tree wait in a batch: "
                               "back them up or clear the batch before re-rooting the tree")

    def reset(self):
        """Forget the whole tree (new game)."""
        self._check_no_pending()
        _clear_pools(&self.core)
        self.game = None
        self.set_position(Board())

    def set_searchmoves(self, moves):
        """Restrict the root to these UCI moves (None or empty: all moves)."""
        self._searchmoves = list(moves) if moves else None
        self._set_root_filter(self._searchmoves)

    cdef _set_root_filter(self, moves):
        free(self.core.root_filter)
        self.core.root_filter = NULL
        self.core.n_root_filter = 0
        self._allowed = None
        legal = []
        for mv in moves or ():
            try:
                legal.append(self.game._parse_uci(mv))
            except ValueError:
                pass  # a move that is not legal here (or 0000) restricts nothing
        if not legal:
            return  # nothing legal named: search every move, as lc0 does
        self.core.root_filter = <Move*>malloc(len(legal) * sizeof(Move))
        if self.core.root_filter == NULL:
            raise MemoryError()
        for i, m in enumerate(legal):
            self.core.root_filter[i] = m
        self.core.n_root_filter = len(legal)
        self._allowed = {_uci_of(&self.core.root_pos, m) for m in legal}

    # -- gathering -----------------------------------------------------------

    def gather(self, Batch batch not None, int max_leaves=0, int max_visits=0):
        """Select leaves into ``batch`` until it holds ``max_leaves`` more network requests
        (default: until full), resolving terminal positions and cache hits on the spot.
        Stops early after ``max_visits`` visits (0: no limit) or too many collisions.
        Returns the number of network requests added."""
        if max_leaves <= 0 or batch.size + max_leaves > batch.capacity:
            max_leaves = batch.capacity - batch.size
        if self.cache is not None:
            self.core.cache = self.cache.entries
            self.core.cache_size = self.cache.capacity
        else:
            self.core.cache = NULL
            self.core.cache_size = 0
        cdef int added
        with nogil:
            added = _gather(&self.core, batch, max_leaves, max_visits)
        if added:
            batch._owners.append(self)
        return added

    # -- results -------------------------------------------------------------

    @property
    def nodes(self):
        """Visits of the root (lc0's node count). Under searchmoves only the root's own visit and
        the allowed moves' subtrees count: a node limit and the reported nodes are about the
        moves being searched, not about what an earlier search left under the others."""
        return _root_nodes(&self.core)

    @property
    def playouts(self):
        """Visits backed up since the last set_position."""
        return self.core.playouts

    @property
    def average_depth(self):
        return <double>self.core.cum_depth / self.core.playouts if self.core.playouts else 0.0

    @property
    def seldepth(self):
        return self.core.seldepth

    @property
    def collisions(self):
        return self.core.collisions

    @property
    def allocated_nodes(self):
        return self.core.n_nodes - 1

    @property
    def memory_bytes(self):
        """Bytes held by nodes and edges in use (not counting spare capacity)."""
        return (self.core.n_nodes - 1) * sizeof(Node) + self.core.n_edges * sizeof(Edge)

    @property
    def bytes_per_node(self):
        """Node and edge bytes per visited (created) node."""
        visited = self.core.n_nodes - 1
        return self.memory_bytes / visited if visited else 0.0

    @property
    def out_of_memory(self):
        return bool(self.core.max_bytes) and self.memory_bytes >= self.core.max_bytes * 0.98

    @property
    def root_proven(self):
        """The root's proven result for the side to move (+1 win, 0 draw, -1 loss), or None."""
        cdef Node* r = &self.core.nodes[self.core.root]
        if r.flags & NODE_PROVEN:
            return -r.bound
        return None

    @property
    def root_q(self):
        """Root value (W - L) for the side to move, and the draw probability."""
        cdef Node* r = &self.core.nodes[self.core.root]
        return (-r.wl, r.d)

    def root_children(self):
        """Per root move: dict(move, n, in_flight, q, d, m, prior, proven), best first.

        ``q`` and ``proven`` are seen by the side to move at the root; ``proven``
        is +1/0/-1 for an exact result, None otherwise; ``m`` is plies left (exact
        plies to the end once proven). Order: proven wins (shortest first), then
        visits, then q; proven losses last.
        """
        return self._children(self.core.root, self.core.root_pos)

    cdef list _children(self, uint32_t ni, Pos pos):
        """The children of ``ni`` in ``_child_rank``'s order (ranked in C with ``_ranks_before``,
        ties in edge order as a stable sort keeps them), one dict each."""
        cdef Node* node = &self.core.nodes[ni]
        cdef list out = []
        cdef int i, j, k, n = node.num_edges
        cdef uint32_t ci = node.child
        cdef Node* c
        cdef char buf[8]
        cdef int ln
        cdef uint32_t child_of[256]
        cdef RankKey keys[256]
        cdef int order[256]
        if not (node.flags & NODE_EXPANDED):
            return out
        for i in range(n):
            child_of[i] = 0
            if ci and self.core.nodes[ci].edge_idx == i:
                child_of[i] = ci
                ci = self.core.nodes[ci].sibling
            keys[i] = _rank_key(&self.core, child_of[i])
            # Insertion sort, stable: i goes after every earlier edge it does not rank before.
            j = i
            while j > 0 and _ranks_before(&keys[i], &keys[order[j - 1]]):
                order[j] = order[j - 1]
                j -= 1
            order[j] = i
        for k in range(n):
            i = order[k]
            e = self.core.edges[node.edges + i]
            ln = move_to_uci(&pos, e.move, buf)
            visits = in_flight = 0
            q = d = m = proven = None
            if child_of[i]:
                c = &self.core.nodes[child_of[i]]
                visits = c.n
                in_flight = c.n_in_flight
                if c.flags & NODE_PROVEN:
                    q, d, m, proven = float(c.bound), 1.0 if c.bound == 0 else 0.0, float(c.m >> 4), int(c.bound)
                elif c.n:
                    q, d, m = c.wl, c.d, _m_value(c)
            out.append({"move": buf[:ln].decode("ascii"), "n": visits, "in_flight": in_flight, "q": q, "d": d,
                        "m": m, "prior": e.prior / 65535.0, "proven": proven, "edge": i})
        return out

    def best_move(self):
        """The move to play (UCI), or None when the root has no legal move or was never expanded:
        the first of ``root_children()`` among the searchmoves (all moves when none of them is
        there), found in C without building that list (the search asks after every batch)."""
        cdef Node* r = &self.core.nodes[self.core.root]
        cdef int edge
        if not (r.flags & NODE_EXPANDED) or r.num_edges == 0:
            return None
        edge = _best_edge(&self.core, self.core.root, self.core.root_filter != NULL)
        if edge < 0:
            edge = _best_edge(&self.core, self.core.root, False)
        return _uci_of(&self.core.root_pos, self.core.edges[r.edges + edge].move)

    def root_summary(self, double share):
        """What the stop rules read of ``root_children()``, found in C without building it (the
        search asks after every batch): ``(move, n, q, proven, m, second_n, better_q)`` for the
        first of that order among the searchmoves, or ``(None, 0, None, None, None, None, False)``
        when there is none (``nodes`` 0, no expanded root, no allowed move). ``move``, ``n``,
        ``q``, ``proven`` and ``m`` are the first's as ``root_children()`` gives them;
        ``second_n`` is the second allowed move's visits (None when there is one); ``better_q``:
        the first has visits and is not proven, and another allowed move with at least
        ``max(1, share x its visits)`` visits has the higher q. ``engine.move_search.summary_of`` is
        the same in Python, from a ``root_children()`` list."""
        cdef TreeCore* t = &self.core
        cdef Node* r = &t.nodes[t.root]
        cdef uint32_t ci, here, top_child = 0
        cdef int i, top, second = -1
        cdef RankKey key, top_key, second_key
        cdef double enough
        cdef bint better = False
        cdef Node* c
        if not (r.flags & NODE_EXPANDED) or r.num_edges == 0 or _root_nodes(t) == 0:
            return _NO_SUMMARY
        top = _best_edge(t, t.root, True)
        if top < 0:
            return _NO_SUMMARY
        top_child = _child_of(t, t.root, top)
        top_key = _rank_key(t, top_child)
        second_key = top_key     # read only once a second is found (set with it)
        enough = share * top_key.n
        if enough < 1.0:
            enough = 1.0
        ci = r.child
        for i in range(r.num_edges):
            here = 0
            if ci and t.nodes[ci].edge_idx == i:
                here = ci
                ci = t.nodes[ci].sibling
            if i == top or (t.root_filter != NULL and not _in_filter(t, t.edges[r.edges + i].move)):
                continue
            key = _rank_key(t, here)
            if second < 0 or _ranks_before(&key, &second_key):
                second = i
                second_key = key
            # q is there for every child with visits (enough >= 1): the wl of an open one, the
            # bound of a proven one, as root_children() gives them.
            if key.n >= enough and key.q > top_key.q:
                better = True
        move = _uci_of(&t.root_pos, t.edges[r.edges + top].move)
        if top_child == 0:
            return (move, 0, None, None, None, second_key.n if second >= 0 else None, False)
        c = &t.nodes[top_child]
        if c.flags & NODE_PROVEN:
            return (move, c.n, float(c.bound), int(c.bound), float(c.m >> 4),
                    second_key.n if second >= 0 else None, False)
        if not c.n:
            return (move, 0, None, None, None, second_key.n if second >= 0 else None, False)
        return (move, c.n, c.wl, None, _m_value(c), second_key.n if second >= 0 else None, better)

    def pv(self, first=None, int max_length=64):
        """Principal variation from the root (optionally starting with ``first``), as UCI strings."""
        cdef Pos pos = self.core.root_pos
        cdef uint32_t ni = self.core.root
        cdef Undo u
        cdef list line = []
        cdef Move moves[MAX_MOVES]
        cdef Node* node
        cdef int n, i, edge
        cdef uint32_t child
        while len(line) < max_length:
            node = &self.core.nodes[ni]
            if ni != self.core.root and node.flags & NODE_PROVEN and not node.flags & (NODE_EXPANDED | NODE_TERMINAL) \
                    and node.bound == -1 and node.m >> 4 == 1:
                # Proven by the mate in one found on arrival (never expanded): name the mating move.
                n = gen_legal(&pos, moves)
                for i in range(n):
                    if _mates_in_one(&pos, &moves[i], 1):
                        line.append(_uci_of(&pos, moves[i]))
                        break
                break
            if not (node.flags & NODE_EXPANDED) or node.num_edges == 0:
                break
            edge = -1
            if first is not None and not line:
                for i in range(node.num_edges):
                    if _uci_of(&pos, self.core.edges[node.edges + i].move) == first:
                        edge = i
                        break
            else:
                # The first of root_children()'s order, found without building it (a pv is
                # asked for on every info line and on stop).
                edge = _best_edge(&self.core, ni)
                child = _child_of(&self.core, ni, edge)
                if child == 0 or not (self.core.nodes[child].n > 0
                                      or self.core.nodes[child].flags & NODE_PROVEN):
                    edge = -1
            if edge < 0:
                break
            line.append(_uci_of(&pos, self.core.edges[node.edges + edge].move))
            child = _child_of(&self.core, ni, edge)
            if child == 0:
                break
            make_move(&pos, self.core.edges[node.edges + edge].move, &u)
            ni = child
        return line

    def choose_move(self, double temperature):
        """Pick a root move with probability proportional to N^(1/temperature) (self-play).

        Weights are taken relative to the most visited move, so that no power overflows at a
        low temperature; the move is the first whose cumulative weight exceeds the draw.
        """
        children = [c for c in self.root_children() if c["n"] > 0]
        if not children:
            return self.best_move()
        if temperature <= 0:
            return children[0]["move"]
        cdef double top = max(c["n"] for c in children)
        cdef double total = 0.0
        cdef list bounds = []
        for c in children:
            total += (c["n"] / top) ** (1.0 / temperature)
            bounds.append(total)
        cdef double r = _uniform(&self.core) * total
        cdef Py_ssize_t i
        for i in range(len(children)):
            if r < <double>bounds[i]:
                return children[i]["move"]
        # Only a draw of exactly 1.0 gets here (r == total): the last move with visits.
        return children[len(children) - 1]["move"]

    def visit_distribution(self):
        """{uci: visits} over the root moves (the self-play policy target)."""
        return {c["move"]: c["n"] for c in self.root_children()}


cdef str _uci_of(const Pos* p, Move m):
    cdef char buf[8]
    cdef int n = move_to_uci(p, m, buf)
    return buf[:n].decode("ascii")


cdef int _rank_group(const Node* c) noexcept nogil:
    """_child_rank's first key for a created child: 0 proven win, 1 open or drawn, 3 proven loss."""
    if c.flags & NODE_PROVEN:
        if c.bound == 1:
            return 0
        if c.bound == -1:
            return 3
    return 1


cdef struct RankKey:
    int group                # _rank_group: 0 proven win, 1 open or drawn, 3 proven loss
    double m                 # plies to the end, for the proven
    uint32_t n
    double q                 # -2 for a child without visits


cdef inline RankKey _rank_key(const TreeCore* t, uint32_t ci) noexcept nogil:
    """The ranking key of the child node ``ci`` (0: an edge without a node), as ``_child_rank``."""
    cdef RankKey k
    cdef const Node* c
    k.group = 1
    k.m = 0.0
    k.n = 0
    k.q = -2.0
    if ci:
        c = &t.nodes[ci]
        k.group = _rank_group(c)
        k.n = c.n
        if c.flags & NODE_PROVEN:
            k.q = c.bound
            k.m = c.m >> 4
        elif c.n:
            k.q = c.wl
    return k


cdef inline bint _ranks_before(const RankKey* a, const RankKey* b) noexcept nogil:
    """Whether ``a`` comes strictly before ``b`` in ``root_children()``'s order (``_child_rank``:
    proven wins, shortest first; then visits, then q; proven losses last, longest first)."""
    if a.group != b.group:
        return a.group < b.group
    if a.group == 0:
        return a.m < b.m
    if a.group == 3:
        return a.m > b.m
    return a.n > b.n or (a.n == b.n and a.q > b.q)


cdef int _best_edge(TreeCore* t, uint32_t ni, bint filtered=False) noexcept nogil:
    """The edge that heads root_children()'s order at node ``ni`` (``_child_rank``, ties to the
    earlier edge, as the stable sort keeps them), or -1 for a node without edges. ``filtered``:
    only edges the root's searchmoves allow (-1 when none is there)."""
    cdef Node* node = &t.nodes[ni]
    cdef uint32_t ci = node.child, here
    cdef int i, best = -1
    cdef RankKey key, best_key = _rank_key(t, 0)
    for i in range(node.num_edges):
        here = 0
        if ci and t.nodes[ci].edge_idx == i:
            here = ci
            ci = t.nodes[ci].sibling
        if filtered and t.root_filter != NULL and not _in_filter(t, t.edges[node.edges + i].move):
            continue
        key = _rank_key(t, here)
        if best < 0 or _ranks_before(&key, &best_key):
            best = i
            best_key = key
    return best


def _child_rank(c):
    proven = c["proven"]
    if proven == 1:
        return (0, c["m"], 0, 0)
    if proven == -1:
        return (3, -c["m"], 0, 0)
    q = c["q"] if c["q"] is not None else -2.0
    return (1, 0, -c["n"], -q)


cdef uint64_t _root_nodes(const TreeCore* t) noexcept nogil:
    """``Tree.nodes``: the root's visits, or under searchmoves its own visit and the allowed
    moves' subtrees."""
    cdef const Node* r = &t.nodes[t.root]
    cdef const Node* c
    cdef uint32_t ci
    cdef uint64_t total
    if t.root_filter == NULL or not (r.flags & NODE_EXPANDED):
        return r.n
    total = 1 if r.n else 0
    ci = r.child
    while ci:
        c = &t.nodes[ci]
        if _in_filter(t, t.edges[r.edges + c.edge_idx].move):
            total += c.n
        ci = c.sibling
    return total


_NO_SUMMARY = (None, 0, None, None, None, None, False)


cdef uint32_t _child_of(TreeCore* t, uint32_t ni, int edge) noexcept nogil:
    cdef uint32_t ci = t.nodes[ni].child
    while ci:
        if t.nodes[ci].edge_idx == edge:
            return ci
        ci = t.nodes[ci].sibling
    return 0


cdef inline bint _in_filter(const TreeCore* t, Move m) noexcept nogil:
    cdef int j
    for j in range(t.n_root_filter):
        if t.root_filter[j] == m:
            return True
    return False


cdef int _set_param(Params* p, str name, object value) except -1:
    """Store one checked setting in the C struct (a table row the struct lacks is a bug here)."""
    if name == "cpuct": p.cpuct = value
    elif name == "cpuct_base": p.cpuct_base = value
    elif name == "cpuct_factor": p.cpuct_factor = value
    elif name == "cpuct_root": p.cpuct_root = value
    elif name == "cpuct_base_root": p.cpuct_base_root = value
    elif name == "cpuct_factor_root": p.cpuct_factor_root = value
    elif name == "fpu_value": p.fpu_value = value
    elif name == "fpu_value_root": p.fpu_value_root = value
    elif name == "policy_temperature": p.policy_temperature = value
    elif name == "noise_epsilon": p.noise_epsilon = value
    elif name == "noise_alpha": p.noise_alpha = value
    elif name == "two_fold_draws": p.two_fold_draws = value
    elif name == "moves_left_max_effect": p.moves_left_max_effect = value
    elif name == "moves_left_threshold": p.moves_left_threshold = value
    elif name == "moves_left_slope": p.moves_left_slope = value
    elif name == "moves_left_constant_factor": p.moves_left_constant_factor = value
    elif name == "moves_left_scaled_factor": p.moves_left_scaled_factor = value
    elif name == "moves_left_quadratic_factor": p.moves_left_quadratic_factor = value
    elif name == "multipv": p.multipv = value
    else:
        raise AssertionError(f"the tree has no field for the search parameter {name!r}")
    return 0


cdef dict _params_dict(const Params* p):
    return dict(cpuct=p.cpuct, cpuct_base=p.cpuct_base, cpuct_factor=p.cpuct_factor,
                cpuct_root=p.cpuct_root, cpuct_base_root=p.cpuct_base_root,
                cpuct_factor_root=p.cpuct_factor_root, fpu_value=p.fpu_value,
                fpu_value_root=p.fpu_value_root, policy_temperature=p.policy_temperature,
                noise_epsilon=p.noise_epsilon, noise_alpha=p.noise_alpha,
                two_fold_draws=bool(p.two_fold_draws), moves_left_max_effect=p.moves_left_max_effect,
                moves_left_threshold=p.moves_left_threshold, moves_left_slope=p.moves_left_slope,
                moves_left_constant_factor=p.moves_left_constant_factor,
                moves_left_scaled_factor=p.moves_left_scaled_factor,
                moves_left_quadratic_factor=p.moves_left_quadratic_factor, multipv=p.multipv)


cdef int _copy_subtree(TreeCore* src, uint32_t s, TreeCore* dst, uint32_t d) noexcept nogil:
    """Copy the subtree under ``s`` into ``dst`` at node ``d`` (iteratively, children in order)."""
    cdef uint32_t* stack_s
    cdef uint32_t* stack_d
    cdef uint32_t top = 0, cap = 1024, sn, dn, sc, prev, nc, sib
    cdef Node* node
    stack_s = <uint32_t*>malloc(cap * sizeof(uint32_t))
    stack_d = <uint32_t*>malloc(cap * sizeof(uint32_t))
    if stack_s == NULL or stack_d == NULL:
        free(stack_s)
        free(stack_d)
        return -1
    stack_s[0] = s
    stack_d[0] = d
    top = 1
    while top:
        top -= 1
        sn = stack_s[top]
        dn = stack_d[top]
        node = &src.nodes[sn]
        sib = dst.nodes[dn].sibling      # linked by the parent already: keep it
        dst.nodes[dn] = node[0]
        dst.nodes[dn].child = 0
        dst.nodes[dn].sibling = sib if sn != s else 0
        if node.flags & NODE_EXPANDED:
            if _reserve(dst, 0, node.num_edges) < 0:
                free(stack_s)
                free(stack_d)
                return -1
            memcpy(&dst.edges[dst.n_edges], &src.edges[node.edges], node.num_edges * sizeof(Edge))
            dst.nodes[dn].edges = dst.n_edges
            dst.n_edges += node.num_edges
        sc = node.child
        prev = 0
        while sc:
            if _reserve(dst, 1, 0) < 0:
                free(stack_s)
                free(stack_d)
                return -1
            nc = _new_node(dst, src.nodes[sc].edge_idx)
            if prev:
                dst.nodes[prev].sibling = nc
            else:
                dst.nodes[dn].child = nc
            prev = nc
            if top + 1 >= cap:
                cap *= 2
                stack_s = <uint32_t*>realloc(stack_s, cap * sizeof(uint32_t))
                stack_d = <uint32_t*>realloc(stack_d, cap * sizeof(uint32_t))
                if stack_s == NULL or stack_d == NULL:
                    return -1
            stack_s[top] = sc
            stack_d[top] = nc
            top += 1
            sc = src.nodes[sc].sibling
    free(stack_s)
    free(stack_d)
    return 0


cdef struct Held:
    uint32_t* data           # collided paths, each stored as [depth, node 0 .. node depth]
    uint32_t size
    uint32_t cap


cdef void _hold(TreeCore* t, Held* held, const uint32_t* path, int depth) noexcept nogil:
    """Keep a collided path's in-flight marks until the gather ends (as lc0 does), so that the
    next selections see it as busy and spread out; cancel at once if there is no memory."""
    cdef void* grown
    if held.size + depth + 2 > held.cap:
        grown = realloc(held.data, 2 * (held.cap + depth + 2) * sizeof(uint32_t))
        if grown == NULL:
            _cancel(t, path, depth)
            return
        held.data = <uint32_t*>grown
        held.cap = 2 * (held.cap + depth + 2)
    held.data[held.size] = depth
    memcpy(&held.data[held.size + 1], path, (depth + 1) * sizeof(uint32_t))
    held.size += depth + 2


cdef int _gather(TreeCore* t, Batch batch, int max_leaves, int max_visits) noexcept nogil:
    """Gather up to ``max_leaves`` network requests; collided paths are released at the end."""
    cdef Held held
    held.data = NULL
    held.size = 0
    held.cap = 0
    cdef int added = _gather_paths(t, batch, max_leaves, max_visits, &held)
    cdef uint32_t i = 0, depth
    while i < held.size:
        depth = held.data[i]
        _cancel(t, &held.data[i + 1], depth)
        i += depth + 2
    free(held.data)
    return added


cdef int _gather_paths(TreeCore* t, Batch batch, int max_leaves, int max_visits, Held* held) noexcept nogil:
    cdef int added = 0, visits = 0, collisions = 0, depth, n, edge, i
    cdef uint32_t path[MAX_PATH + 1]
    cdef uint32_t ni, child
    cdef Pos pos
    cdef Node* node
    cdef Move moves[MAX_MOVES]
    cdef float priors[MAX_MOVES]
    cdef CacheEntry* ce
    cdef uint64_t key
    cdef int max_collisions = 4 * max_leaves if max_leaves > 16 else 64
    cdef int ooo = 0
    cdef int max_ooo = (max_leaves * 12) // 5 if max_leaves > 1 else 2
    cdef Leaf* lf
    cdef float wl
    if t.nodes[t.root].flags & NODE_PROVEN:
        return 0
    while added < max_leaves and (max_visits <= 0 or visits < max_visits):
        pos = t.root_pos
        ni = t.root
        depth = 0
        path[0] = ni
        while True:
            node = &t.nodes[ni]
            node.n_in_flight += 1
            if node.flags & NODE_TWOFOLD and not _is_repetition_draw(t, &pos, t.root_ply + depth):
                node.flags &= ~(NODE_TWOFOLD | NODE_TERMINAL | NODE_PROVEN)
            if node.flags & NODE_PROVEN and (node.flags & NODE_TERMINAL or depth > 0):
                # Exact result: back it up without asking the network.
                _backup(t, path, depth, node.bound, 1.0 if node.bound == 0 else 0.0, node.m >> 4)
                if not (node.flags & NODE_TWOFOLD):
                    _prove_up(t, path, depth)   # e.g. a reused tree whose root proof was cleared
                visits += 1
                ooo += 1
                break
            if node.flags & NODE_EXPANDED and node.num_edges:
                edge = _select(t, ni, depth == 0)
                if edge < 0 or depth >= MAX_PATH:
                    _cancel(t, path, depth)
                    collisions = max_collisions
                    break
                child = _child(t, ni, edge)
                if child == 0:       # out of memory: stop gathering
                    _cancel(t, path, depth)
                    collisions = max_collisions
                    break
                make_move(&pos, t.edges[t.nodes[ni].edges + edge].move, &t.stack[t.root_ply + depth])
                depth += 1
                path[depth] = child
                ni = child
                continue
            if node.flags & NODE_PENDING:
                _hold(t, held, path, depth)
                collisions += 1
                t.collisions += 1
                break
            # A new leaf: game over here?
            n = gen_legal(&pos, moves)
            if n == 0 or insufficient_material(&pos) or pos.halfmove >= 100 \
                    or _is_repetition_draw(t, &pos, t.root_ply + depth):
                node.flags |= NODE_TERMINAL | NODE_PROVEN
                if n == 0 and in_check(&pos):
                    node.bound = 1       # the player who moved in gave mate
                else:
                    node.bound = 0
                    if n and pos.halfmove < 100 and not insufficient_material(&pos) \
                            and _twofold_only(t, &pos, t.root_ply + depth):
                        node.flags |= NODE_TWOFOLD
                node.m = 0
                if depth == 0:
                    _cancel(t, path, depth)
                    return added
                _backup(t, path, depth, node.bound, 1.0 if node.bound == 0 else 0.0, 0.0)
                if not (node.flags & NODE_TWOFOLD):
                    _prove_up(t, path, depth)
                visits += 1
                ooo += 1
                break
            if depth > 0 and _mates_in_one(&pos, moves, n):
                # The side to move mates at once: a proven loss for the player who moved
                # in, without asking the network, so that a weak policy cannot walk the
                # search into a mate in one (docs/architecture.md, "Search: what the tree
                # knows without the network").  Not at the root, which must be expanded
                # for the mating move itself to be found and played.
                node.flags |= NODE_PROVEN
                node.bound = -1
                node.m = _m_fixed(1.0)
                _backup(t, path, depth, -1.0, 0.0, 1.0)
                _prove_up(t, path, depth)
                visits += 1
                ooo += 1
                break
            key = _cache_key(&pos)
            if t.cache != NULL and t.cache_size:
                ce = &t.cache[key % t.cache_size]
                if ce.priors != NULL and ce.key == key and ce.nmoves == n:
                    for i in range(n):
                        priors[i] = ce.priors[i] * (1.0 / 65535.0)
                    if _expand(t, ni, &pos, moves, n, priors) < 0:
                        _cancel(t, path, depth)
                        collisions = max_collisions
                        break
                    if ni == t.root:
                        _root_expanded(t)
                    _backup(t, path, depth, -ce.wl, ce.d, ce.m)
                    visits += 1
                    ooo += 1
                    break
            # Queue for the network.
            if batch._reserve_path(depth) < 0 or batch._reserve_moves(n) < 0:
                _cancel(t, path, depth)
                collisions = max_collisions
                break
            lf = &batch.leaves[batch.size]
            lf.tree = t
            lf.node = ni
            lf.depth = depth
            lf.turn = pos.turn
            lf.cache_key = key
            lf.path = batch.n_paths
            memcpy(&batch.paths[batch.n_paths], path, (depth + 1) * sizeof(uint32_t))
            batch.n_paths += depth + 1
            lf.moves = batch.n_moves
            lf.nmoves = n
            memcpy(&batch.moves[batch.n_moves], moves, n * sizeof(Move))
            batch.n_moves += n
            batch.positions[batch.size] = pos
            if batch.encode:
                encode_planes_over_format(&pos, t.stack, t.root_ply + depth, t.start_ep, t.input_format,
                                          batch.planes_ptr + batch.size * PLANE_FLOATS,
                                          batch.written + batch.size * HISTORY_PLANES)
            batch.size += 1
            t.pending += 1
            node.flags |= NODE_PENDING
            added += 1
            visits += 1
            break
        if collisions >= max_collisions or ooo >= max_ooo:
            break
        if t.nodes[t.root].flags & NODE_PROVEN:
            break
    return added
