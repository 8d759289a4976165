"""A plain-Python PUCT search on python-chess: the baseline of ``cyzero bench tree``.

This is the design the slowest self-play pipelines use, written plainly so that
the benchmark compares the Cython tree (``engine.tree``) with something a person
would recognise: a :class:`Node` object per position with a dict of children,
one python-chess ``Board`` that is pushed down the tree and popped back up,
legal moves generated for every expansion, one playout at a time.

The selection rule is the Cython tree's (lc0's): PUCT with the logarithmic
cpuct growth, first-play urgency reduced by the visited policy, values stored
from the view of the player who moved into the node.  Terminal positions are
scored as the tree scores them (checkmate, stalemate, insufficient material,
the 50-move rule, and a repetition below the root, found with python-chess's
``is_repetition(2)``).  The
evaluator is the null one: uniform priors over the legal moves and a draw.

Only the benchmark imports this module; the engine never does.
"""

from __future__ import annotations

import math
import time

import chess

__all__ = ["Node", "PythonPuct"]


class Node:
    """One position: visit count, value sums (seen by the player who moved in), children."""

    __slots__ = ("prior", "n", "wl", "d", "children", "terminal")

    def __init__(self, prior: float) -> None:
        self.prior = prior
        self.n = 0
        self.wl = 0.0  # running mean of W - L
        self.d = 0.0  # running mean of the draw probability
        self.children: dict[chess.Move, Node] | None = None  # None until expanded
        self.terminal: float | None = None  # exact value when the game is over here


class PythonPuct:
    """PUCT search of one position, one playout at a time, with the null evaluator."""

    def __init__(
        self,
        board: chess.Board,
        *,
        cpuct: float = 1.745,
        cpuct_base: float = 38739.0,
        cpuct_factor: float = 3.894,
        fpu_value: float = 0.330,
        fpu_value_root: float = 1.0,
    ) -> None:
        self.board = board.copy()
        self.root_stack = len(self.board.move_stack)
        self.root = Node(1.0)
        self.cpuct = cpuct
        self.cpuct_base = cpuct_base
        self.cpuct_factor = cpuct_factor
        self.fpu_value = fpu_value
        self.fpu_value_root = fpu_value_root
        self.playouts = 0

    # -- one playout -----------------------------------------------------------

    def select(self, node: Node, at_root: bool) -> tuple[chess.Move, Node]:
        cpuct = self.cpuct + self.cpuct_factor * math.log((node.n + self.cpuct_base) / self.cpuct_base)
        puct = cpuct * math.sqrt(max(node.n - 1, 1))
        visited_policy = sum(child.prior for child in node.children.values() if child.n > 0)
        parent_q = -node.wl if node.n > 0 else 0.0
        fpu = parent_q - (self.fpu_value_root if at_root else self.fpu_value) * math.sqrt(visited_policy)
        best_score = -math.inf
        best = None
        for move, child in node.children.items():
            q = child.wl if child.n > 0 else fpu
            score = q + puct * child.prior / (1 + child.n)
            if score > best_score:
                best_score = score
                best = (move, child)
        return best

    def evaluate(self, node: Node, board: chess.Board) -> tuple[float, float]:
        """Expand ``node`` (or find that the game is over); return (W-L, D) for the player who moved in."""
        moves = list(board.legal_moves)
        if not moves:
            node.terminal = 1.0 if board.is_check() else 0.0  # mate: the mover won
        elif (
            board.is_insufficient_material()
            or board.halfmove_clock >= 100
            or board.is_repetition(2)
            and len(board.move_stack) > self.root_stack
        ):
            node.terminal = 0.0
        if node.terminal is not None:
            return node.terminal, 1.0 if node.terminal == 0.0 else 0.0
        prior = 1.0 / len(moves)
        node.children = {move: Node(prior) for move in moves}
        # The null network: a draw for the side to move, so 0 for the mover as well.
        return 0.0, 1.0

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
            wl, d = self.evaluate(node, board)
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

    def best_move(self) -> str | None:
        if not self.root.children:
            return None
        move = max(self.root.children.items(), key=lambda item: item[1].n)[0]
        return move.uci()
