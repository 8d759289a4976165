"""A plain-Python PUCT search on python-chess: the oracle of the Cython tree and the
baseline of ``cyzero bench tree``.

Written plainly, as the slowest self-play pipelines are: a :class:`Node` object per
position with a list of children, one python-chess ``Board`` that is pushed down the
tree and popped back up, legal moves generated for every expansion, one playout at a
time.

Its rules are the Cython tree's (``engine.tree``), with the same parameters
(:class:`engine.params.SearchParams`, ``tree`` rows): lc0's PUCT with the logarithmic
cpuct growth and separate root constants, first-play urgency reduced by the visited
policy, values stored from the view of the player who moved into the node, the policy
softmax at ``policy_temperature``, and terminal positions scored as the tree scores
them (mate, stalemate, insufficient material, the 50-move rule, threefold repetition
with the game history, twofold inside the tree with ``two_fold_draws``), and a node
below the root whose side to move mates in one scored as lost for the player who moved
in, without evaluating it.  Where the
tree's representation decides between equal candidates, the reference copies it:

* priors go through the tree's float32 softmax and are stored as ``P x 65535`` in a
  uint16, read back as the float32 ``q / 65535``;
* children are kept in descending prior order, equal priors in the evaluator's order
  (the tree's edges: its move generator's order, stable insertion sort);
* selection keeps the first best visited child and, among the unvisited children
  (which share one FPU value), the first with the highest prior; an unvisited child
  wins only with a strictly higher score.

What it does not have (so the tree may differ where these matter): proofs (the tree
scores a proven child by its exact result, proves the root's mates in one when it expands
the root, and stops at a proven root), the NN cache,
batches with in-flight visits and collisions, root noise, and float32 arithmetic in
selection and backup (this search uses Python floats).

The engine never imports this module; the benchmark and the tests do.
"""

from __future__ import annotations

import functools
import math
import operator
import time
from array import array
from collections.abc import Callable, Sequence
from typing import Optional

import chess

from engine.params import SearchParams

__all__ = ["Evaluator", "Node", "PythonPuct", "null_evaluator", "tree_priors"]

# evaluate(board, legal moves) -> (the legal moves in the order that breaks ties between
# equal priors, their policy logits, W - L and D for the side to move).
Evaluator = Callable[[chess.Board, list[chess.Move]], tuple[Sequence[chess.Move], Sequence[float], float, float]]


def null_evaluator(board: chess.Board, moves: list[chess.Move]):
    """The null network: equal logits (a uniform policy) and a draw."""
    return moves, [0.0] * len(moves), 0.0, 1.0


_INV_65535 = 1.0 / 65535.0


def _float32(values) -> array:
    """``values`` rounded to float32, as the tree's C floats hold them."""
    return array("f", values)


def tree_priors(logits: Sequence[float], temperature: float) -> list[float]:
    """The priors the tree stores for these logits: its softmax (engine.encoding's
    ``legal_priors``, float32 with a double sum) quantised to ``P x 65535`` and read
    back as the float32 ``q / 65535``."""
    xs = _float32(logits)
    inv_t = 1.0 / _float32([temperature])[0]
    hi = max(xs)
    exps = _float32([math.exp(d * inv_t) for d in _float32([x - hi for x in xs])])
    total = functools.reduce(operator.add, exps, 0.0)  # in order, in a double, as the tree sums
    return list(_float32([(int(p * 65535.0 + 0.5) if p < 1.0 else 65535) * _INV_65535
                          for p in _float32([e / total for e in exps])]))


class Node:
    """One position: visit count, value means (seen by the player who moved in), children."""

    __slots__ = ("prior", "n", "wl", "d", "children", "terminal")

    def __init__(self, prior: float) -> None:
        self.prior = prior
        self.n = 0
        self.wl = 0.0  # running mean of W - L
        self.d = 0.0  # running mean of the draw probability
        self.children: Optional[dict[chess.Move, Node]] = None  # None until expanded; in edge order
        self.terminal: Optional[float] = None  # exact value when the game is over here


class PythonPuct:
    """PUCT search of one position, one playout at a time."""

    def __init__(
        self,
        board: chess.Board,
        params: Optional[SearchParams] = None,
        evaluate: Evaluator = null_evaluator,
    ) -> None:
        params = params if params is not None else SearchParams()
        self.board = board.copy()
        self.root_ply = len(self.board.move_stack)
        self.root = Node(1.0)
        self.evaluate = evaluate
        self.two_fold_draws = params.two_fold_draws
        self.policy_temperature = params.policy_temperature
        # (cpuct, cpuct_base, cpuct_factor, fpu_value) below the root and at the root
        self.constants = (
            (params.cpuct, params.cpuct_base, params.cpuct_factor, params.fpu_value),
            (params.cpuct_root, params.cpuct_base_root, params.cpuct_factor_root, params.fpu_value_root),
        )
        self.playouts = 0

    # -- one playout -----------------------------------------------------------

    def select(self, node: Node, at_root: bool) -> tuple[chess.Move, Node]:
        cpuct, base, factor, fpu_value = self.constants[at_root]
        puct = (cpuct + factor * math.log((node.n + base) / base)) * math.sqrt(max(node.n - 1, 1))
        visited_policy = 0.0
        best_score = -math.inf
        best = fresh = None
        fresh_prior = -1.0
        for edge in node.children.items():
            child = edge[1]
            if child.n:
                visited_policy += child.prior
                score = child.wl + puct * child.prior / (1 + child.n)
                if score > best_score:
                    best_score = score
                    best = edge
            elif child.prior > fresh_prior:
                fresh_prior = child.prior
                fresh = edge
        if fresh is not None:
            fpu = (-node.wl if node.n else 0.0) - fpu_value * math.sqrt(visited_policy)
            if best is None or fpu + puct * fresh_prior > best_score:
                return fresh
        return best

    def _is_repetition_draw(self, board: chess.Board) -> bool:
        """Threefold with the game history, or twofold where the earlier position is in the tree."""
        if not board.is_repetition(2):
            return False
        if board.is_repetition(3):
            return True
        if not self.two_fold_draws:
            return False
        here = board.epd()
        popped = []
        try:
            while len(board.move_stack) > self.root_ply:
                popped.append(board.pop())
                if board.epd() == here:
                    return True
        finally:
            while popped:
                board.push(popped.pop())
        return False

    @staticmethod
    def _mates_in_one(board: chess.Board, moves: list[chess.Move]) -> bool:
        for move in moves:
            board.push(move)
            mate = board.is_checkmate()
            board.pop()
            if mate:
                return True
        return False

    def expand(self, node: Node, board: chess.Board, at_root: bool = False) -> tuple[float, float]:
        """Expand ``node`` (or find that the game is over, or that the side to move mates at
        once, below the root); return (W-L, D) for the player who moved in."""
        moves = list(board.legal_moves)
        if not moves:
            node.terminal = 1.0 if board.is_check() else 0.0  # mate: the mover won
        elif board.is_insufficient_material() or board.halfmove_clock >= 100 or self._is_repetition_draw(board):
            node.terminal = 0.0
        elif not at_root and self._mates_in_one(board, moves):
            node.terminal = -1.0  # the reply mates: the mover lost
        if node.terminal is not None:
            return node.terminal, 1.0 if node.terminal == 0.0 else 0.0
        moves, logits, wl, d = self.evaluate(board, moves)
        priors = tree_priors(logits, self.policy_temperature)
        order = sorted(range(len(priors)), key=priors.__getitem__, reverse=True)  # stable: ties keep their order
        node.children = {moves[i]: Node(priors[i]) for i in order}
        return -wl, d

    def playout(self) -> None:
        board = self.board
        node = self.root
        path = [node]
        depth = 0
        while node.children is not None and node.terminal is None:
            move, node = self.select(node, depth == 0)
            board.push(move)
            path.append(node)
            depth += 1
        if node.terminal is not None:
            wl, d = node.terminal, 1.0 if node.terminal == 0.0 else 0.0
        else:
            wl, d = self.expand(node, board, depth == 0)
        for visited in reversed(path):
            visited.n += 1
            visited.wl += (wl - visited.wl) / visited.n
            visited.d += (d - visited.d) / visited.n
            wl = -wl
        for _ in range(depth):
            board.pop()
        self.playouts += 1

    def run(self, seconds: float) -> tuple[int, float]:
        """Playouts until ``seconds`` have passed; returns (playouts, elapsed seconds)."""
        start = time.perf_counter()
        done = 0
        while True:
            self.playout()
            done += 1
            elapsed = time.perf_counter() - start
            if elapsed >= seconds:
                return done, elapsed

    # -- results ------------------------------------------------------------------

    def visit_distribution(self) -> dict[str, int]:
        """{uci: visits} over the root moves, as ``engine.tree.Tree.visit_distribution``."""
        return {move.uci(): child.n for move, child in (self.root.children or {}).items()}

    def best_move(self) -> Optional[str]:
        if not self.root.children:
            return None
        return max(self.root.children.items(), key=lambda edge: edge[1].n)[0].uci()
