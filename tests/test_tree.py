"""The Cython MCTS (``engine.tree``) driven the way the search drives it:
rounds of ``tree.gather(batch)`` -> a fake network -> ``batch.backup(...)``.

The fake networks live here and are deterministic functions of the input
planes they are given, so every search below is reproducible:

* :class:`FakeNet` rebuilds the position from the planes (slot 0 and the aux
  planes) with python-chess, gives a mildly informed policy (checks, captures
  and queen promotions get a bonus, optionally a position-seeded jitter and a
  per-position bonus for named moves) and a value from the material balance,
  scaled into win/draw/loss probabilities for the side to move.
* :class:`WhiteWinsNet` says "white wins" everywhere (uniform policy), so any
  draw probability in the tree can only come from a draw the tree scored itself.
* :func:`null_eval` is the null evaluator of the spec (uniform policy, draw).

Expectations are checked against python-chess (mates, stalemates, legality of
principal variations) or against a brute-force mate solver written here.
"""

from __future__ import annotations

import zlib

import chess
import numpy as np
import pytest

from engine import encoding
from engine.board import Board
from engine.encoding import POLICY_SIZE
from engine.params import SearchParams
from engine.tree import Batch, NNCache, Tree

from encoding_reference import PIECE_ORDER, reference_legal_softmax, reference_move_index

PIECE_VALUES = (1, 3, 3, 5, 9, 0)  # P N B R Q K, in PIECE_ORDER
Q_EPS = 1.0 / 65535  # priors are stored as P x 65535


# --------------------------------------------------------------------------- fake networks


def board_from_planes(planes: np.ndarray) -> chess.Board:
    """The current position (history slot 0 and the aux planes) as a python-chess board.

    The en-passant square is not in the planes and is left out; castling rights
    are read from planes 104-107 (standard chess), the rule50 count from 109.
    """
    black = planes[108, 0, 0] > 0.5
    us = chess.BLACK if black else chess.WHITE
    board = chess.Board(None)
    for k, piece_type in enumerate(PIECE_ORDER):
        for color, plane in ((us, planes[k]), (not us, planes[6 + k])):
            for square in np.flatnonzero(plane):
                # planes are seen from the side to move: mirrored vertically for black
                board.set_piece_at(int(square) ^ (56 if black else 0), chess.Piece(piece_type, color))
    board.turn = us
    rights = 0
    for plane, color, file in ((104, us, 0), (105, us, 7), (106, not us, 0), (107, not us, 7)):
        if planes[plane, 0, 0] > 0.5:
            rights |= chess.BB_SQUARES[file + (56 if color == chess.BLACK else 0)]
    board.castling_rights = rights
    board.halfmove_clock = int(planes[109, 0, 0])
    return board


def _material(planes: np.ndarray) -> int:
    """Material balance (pawns) for the side to move."""
    return sum(
        PIECE_VALUES[k] * (int(planes[k].sum()) - int(planes[6 + k].sum())) for k in range(5)
    )


def _wdl(wl: float, draw: float) -> np.ndarray:
    return np.array([(1 - draw + wl) / 2, draw, (1 - draw - wl) / 2], np.float32)


class FakeNet:
    """Deterministic fake network: a function of the planes (current position) only.

    ``bonus`` maps a FEN's first four fields (board, turn, castling, ep) to
    ``{uci: extra logit}``; ``jitter`` adds a position-seeded random term to
    every logit; ``value_jitter`` adds a position-seeded term to the value, so
    every position gets its own WDL; ``mlh`` makes the moves-left output the
    piece count (else zero).
    """

    def __init__(self, *, uniform=False, bonus=None, jitter=0.0, value_jitter=0.0, mlh=False):
        self.uniform = uniform
        self.bonus = {k: dict(v) for k, v in (bonus or {}).items()}
        self.jitter = jitter
        self.value_jitter = value_jitter
        self.mlh = mlh
        self.calls = 0
        self.rows = 0
        self._memo: dict[bytes, tuple[np.ndarray, np.ndarray, float]] = {}

    def _key(self, planes: np.ndarray) -> bytes:
        return planes[[*range(12), 104, 105, 106, 107, 108, 109]].tobytes()

    def position(self, planes: np.ndarray):
        key = self._key(planes)
        out = self._memo.get(key)
        if out is None:
            out = self._compute(planes, key)
            self._memo[key] = out
        return out

    def _compute(self, planes, key):
        seed = zlib.crc32(key)
        logits = np.zeros(POLICY_SIZE, np.float32)
        board = None
        if self.jitter:
            logits += self.jitter * np.random.default_rng(seed).standard_normal(POLICY_SIZE).astype(np.float32)
        if not self.uniform or self.bonus:
            board = board_from_planes(planes)
        if not self.uniform:
            for move in board.legal_moves:
                extra = 0.0
                if board.gives_check(move):
                    extra += 1.5
                if board.is_capture(move):
                    victim = board.piece_type_at(move.to_square)
                    extra += 1.0 + (PIECE_VALUES[victim - 1] / 9 if victim else 1 / 9)
                if move.promotion == chess.QUEEN:
                    extra += 1.0
                logits[reference_move_index(board, move)] += extra
        if self.bonus:
            fen4 = " ".join(board.fen().split()[:3])
            for uci, extra in self.bonus.get(fen4, {}).items():
                logits[reference_move_index(board, chess.Move.from_uci(uci))] += extra
        wl = float(np.tanh(_material(planes) / 4.0))
        if self.value_jitter:
            wl = float(np.clip(wl + self.value_jitter * ((seed % 2001) / 1000.0 - 1.0), -0.95, 0.95))
        draw = 0.4 * (1 - abs(wl))
        mlh = float(np.count_nonzero(planes[:12])) if self.mlh else 0.0
        return logits, _wdl(wl, draw), mlh

    def __call__(self, planes: np.ndarray):
        self.calls += 1
        self.rows += len(planes)
        outs = [self.position(p) for p in planes]
        return (
            np.stack([o[0] for o in outs]),
            np.stack([o[1] for o in outs]),
            np.array([o[2] for o in outs], np.float32),
        )


class WhiteWinsNet:
    """Uniform policy; white wins from every position (WDL for the side to move)."""

    def __call__(self, planes: np.ndarray):
        n = len(planes)
        black = planes[:, 108, 0, 0] > 0.5
        wdl = np.zeros((n, 3), np.float32)
        wdl[~black, 0] = 1.0
        wdl[black, 2] = 1.0
        return np.zeros((n, POLICY_SIZE), np.float32), wdl, np.zeros(n, np.float32)


def null_eval(planes: np.ndarray):
    n = len(planes)
    wdl = np.zeros((n, 3), np.float32)
    wdl[:, 1] = 1.0
    return np.zeros((n, POLICY_SIZE), np.float32), wdl, None


def search(tree: Tree, net, playouts: int, batch_size: int = 8, batch: Batch | None = None) -> Tree:
    """gather -> net -> backup until ``playouts`` visits were backed up (or nothing moves)."""
    batch = batch if batch is not None else Batch(batch_size)
    while tree.playouts < playouts:
        before = tree.playouts
        tree.gather(batch, max_visits=playouts - tree.playouts)
        if len(batch):
            policy, wdl, mlh = net(batch.planes[: len(batch)])
            batch.backup(policy, wdl, mlh)
        if tree.playouts == before:
            break  # root proven (or nothing left to search)
    return tree


def child(tree: Tree, move: str) -> dict:
    for c in tree.root_children():
        if c["move"] == move:
            return c
    raise AssertionError(f"{move} is not a root move")


def pushed(board: Board, *moves: str) -> Board:
    board = board.copy()
    for move in moves:
        board.push_uci(move)
    return board


# --------------------------------------------------------------------------- a mate solver


def mates_within(board: chess.Board, moves: int) -> bool:
    """Whether the side to move mates in at most ``moves`` moves (brute force)."""
    for move in list(board.legal_moves):
        board.push(move)
        try:
            if board.is_checkmate():
                return True
            if moves > 1 and not board.is_game_over() and every_reply_mated_within(board, moves - 1):
                return True
        finally:
            board.pop()
    return False


def every_reply_mated_within(board: chess.Board, moves: int) -> bool:
    """Whether every move of the side to move lets the opponent mate in at most ``moves``."""
    for reply in list(board.legal_moves):
        board.push(reply)
        try:
            if not mates_within(board, moves):
                return False
        finally:
            board.pop()
    return bool(board.legal_moves)


def mirrored(fen: str) -> str:
    """The same position with the colours swapped (python-chess's Board.mirror)."""
    return chess.Board(fen).mirror().fen()


# --------------------------------------------------------------------------- mates

MATE_IN_ONE = [
    "6k1/5ppp/8/8/8/8/5PPP/R5K1 w - - 0 1",  # back rank Ra8#
    "r5k1/5ppp/8/8/8/8/5PPP/6K1 b - - 0 1",  # back rank Ra1#
    "r1bqkbnr/pppp1ppp/2n5/4p3/2B1P3/5Q2/PPPP1PPP/RNB1K1NR w KQkq - 4 4",  # scholar's mate Qxf7#
    "rnbqkbnr/pppp1ppp/8/4p3/6P1/5P2/PPPPP2P/RNBQKBNR b KQkq - 0 2",  # fool's mate Qh4#
    "6rk/6pp/8/6N1/8/8/8/6K1 w - - 0 1",  # smothered Nf7#
    "k7/2P5/1K6/8/8/8/8/8 w - - 0 1",  # c8=Q# and c8=R#
    mirrored("k7/2P5/1K6/8/8/8/8/8 w - - 0 1"),  # ... c1=Q# for black
]


@pytest.mark.parametrize("fen", MATE_IN_ONE)
def test_mate_in_one_is_found_and_proven(fen):
    tree = search(Tree(Board(fen), seed=1), FakeNet(), 300)
    best = tree.best_move()
    ref = chess.Board(fen)
    ref.push_uci(best)
    assert ref.is_checkmate(), f"{best} does not mate in {fen}"
    assert tree.root_proven == 1
    top = tree.root_children()[0]
    assert top["move"] == best
    assert top["proven"] == 1 and top["q"] == 1.0
    assert top["m"] == 0  # no plies after the mating move
    assert tree.pv() == [best]
    # A proven root is finished: gathering adds nothing and visits nothing.
    batch, playouts = Batch(8), tree.playouts
    assert tree.gather(batch) == 0 and len(batch) == 0 and tree.playouts == playouts


# From the bundled mates (engine/tools/mates.epd): 1.Qxh7# takes a pawn the king guards, with the
# rook behind the queen. The bundled network gives it so little prior that a 20,000-node search
# played 1.Nxg6+ instead, until the root's own mates were proven on its expansion.
QUEEN_TAKES_TO_MATE = "7k/R4Q1p/4p1nb/4N1p1/1P6/6P1/1PP2PBP/5RK1 w - - 2 28"


def _mate_without_prior() -> FakeNet:
    """A net that all but forbids 1.Qxh7# (a prior that rounds to 0) in a position White wins anyway."""
    fen4 = " ".join(chess.Board(QUEEN_TAKES_TO_MATE).fen().split()[:3])
    return FakeNet(bonus={fen4: {"f7h7": -40.0}})


def test_a_root_mate_in_one_without_prior_is_proven_on_the_roots_expansion():
    tree = search(Tree(Board(QUEEN_TAKES_TO_MATE), seed=1), _mate_without_prior(), 3000)
    assert child(tree, "f7h7")["prior"] == 0.0
    assert tree.root_proven == 1 and tree.best_move() == "f7h7" and tree.pv() == ["f7h7"]
    top = tree.root_children()[0]
    assert (top["move"], top["proven"], top["q"], top["n"], top["m"]) == ("f7h7", 1, 1.0, 1, 0)
    assert tree.playouts == 1 and tree.nodes == 1   # the root's evaluation: the search ends there
    visits = {move: n for move, n in tree.visit_distribution().items() if n}
    assert visits == {"f7h7": 1}   # what a self-play record learns from


def test_searchmoves_that_leave_out_the_mate_leave_it_unproven():
    tree = Tree(Board(QUEEN_TAKES_TO_MATE), seed=1)
    tree.set_searchmoves(["b4b5", "g1h1"])
    search(tree, _mate_without_prior(), 200)
    assert tree.root_proven != 1 and child(tree, "f7h7")["proven"] is None
    assert tree.best_move() in ("b4b5", "g1h1")


MATE_IN_TWO = [
    "r2qkb1r/pp2nppp/3p4/2pNN1B1/2BnP3/3P4/PPP2PPP/R2bK2R w KQkq - 1 1",  # Legal: Nf6+ gxf6 Bxf7#
    "7k/8/5K2/8/8/8/8/Q7 w - - 0 1",  # Kg6 Kg8 Qg7#
    "k7/8/2K5/8/8/8/8/7R w - - 0 1",  # Kb6 (or Kc7) then the rook mates
]
MATE_IN_TWO += [mirrored(fen) for fen in MATE_IN_TWO]


@pytest.mark.parametrize("fen", MATE_IN_TWO)
def test_mate_in_two_pv_is_a_legal_line_ending_in_mate(fen):
    ref = chess.Board(fen)
    assert not mates_within(ref, 1) and mates_within(ref, 2), "not a mate in two"
    tree = search(Tree(Board(fen), seed=3), FakeNet(), 3000)
    assert tree.root_proven == 1
    top = tree.root_children()[0]
    assert top["proven"] == 1
    pv = tree.pv()
    assert pv[0] == top["move"] == tree.best_move()
    for move in pv:
        assert chess.Move.from_uci(move) in ref.legal_moves, f"illegal {move} in pv {pv}"
        ref.push_uci(move)
    assert ref.is_checkmate(), f"pv {pv} does not end in mate"
    # m counts the plies after the first move, exactly, and the pv has that length.
    assert len(pv) == top["m"] + 1
    # The claimed mate is real: after the best move every reply is mated in time.
    after = chess.Board(fen)
    after.push_uci(top["move"])
    assert every_reply_mated_within(after, int(top["m"]) // 2)


@pytest.mark.parametrize("fen, net, playouts", [
    (chess.STARTING_FEN, "fake", 2000),
    (chess.STARTING_FEN, "null", 300),      # every value equal: ties go to the earlier edge
    (MATE_IN_TWO[0], "fake", 3000),         # proven wins and losses on the way
    (MATE_IN_TWO[1], "null", 3000),
    ("r1bqkbnr/pppp1ppp/2n5/4p3/4P3/5N2/PPPP1PPP/RNBQKB1R w KQkq - 2 3", "fake", 600),
])
def test_pv_follows_the_best_child_at_every_ply(fen, net, playouts):
    """tree.pv() walks with a C comparison; at every ply it must name what root_children() ranks
    first once that node is the root (the order a GUI sees), and stop where that move is unvisited."""
    evaluate = FakeNet() if net == "fake" else null_eval
    tree = search(Tree(Board(fen), seed=7), evaluate, playouts)
    pv = tree.pv()
    assert pv and pv[0] == tree.best_move()
    board = Board(fen)
    for ply, move in enumerate(pv):
        children = tree.root_children()
        if not children:       # a node proven by the mate in one found on arrival: pv names the mate
            ref = chess.Board(board.fen())
            ref.push_uci(move)
            assert ply == len(pv) - 1 and ref.is_checkmate()
            return
        top = children[0]
        assert top["move"] == move, f"ply {ply} of {pv}"
        assert top["n"] > 0 or top["proven"] is not None
        board = pushed(board, move)
        if not tree.set_position(board):   # the move has no node: the pv ends with it
            assert ply == len(pv) - 1
            return
    children = tree.root_children()
    assert len(pv) == 64 or not children or (children[0]["n"] == 0 and children[0]["proven"] is None)


# After 36...Ke6 of a game the bundled network lost to Stockfish at 10+0.1: 27 of White's
# 41 moves let Black mate at once, and a search of about 200 nodes played 37.Rb8?? Qh1#.
ALLOWS_MATE = "8/1R2rp2/2p1k1p1/P1P1p3/3Pq2r/6Q1/5P2/1R4K1 w - - 2 37"


def test_a_move_that_allows_mate_in_one_is_proven_lost_on_its_first_visit():
    ref = chess.Board(ALLOWS_MATE)
    losing = set()
    for move in list(ref.legal_moves):
        ref.push(move)
        if mates_within(ref, 1):
            losing.add(move.uci())
        ref.pop()
    assert len(losing) == 27
    tree = search(Tree(Board(ALLOWS_MATE), seed=3), FakeNet(), 120, batch_size=1)
    visited = [c for c in tree.root_children() if c["n"] > 0]
    assert {c["move"] for c in visited} & losing   # the uniform policy tried some of them
    for c in visited:
        assert (c["proven"] == -1) == (c["move"] in losing), c
        if c["move"] in losing:
            assert c["q"] == -1.0 and c["m"] == 1   # mated one ply after the reply
            assert tree.pv(c["move"])[:2] and ref.is_legal(chess.Move.from_uci(c["move"]))
    assert tree.best_move() not in losing
    # The line names the mate although the mated position was never expanded.
    pv = tree.pv(sorted(losing & {c["move"] for c in visited})[0])
    board = chess.Board(ALLOWS_MATE)
    for move in pv:
        board.push_uci(move)
    assert len(pv) == 2 and board.is_checkmate()


def test_mate_in_two_with_a_large_batch():
    fen = MATE_IN_TWO[0]
    tree = search(Tree(Board(fen), seed=3), FakeNet(), 3000, batch_size=128)
    assert tree.root_proven == 1
    ref = chess.Board(fen)
    for move in tree.pv():
        ref.push_uci(move)
    assert ref.is_checkmate()


# every move of the side to move allows a mate in one
BEING_MATED = ["k7/2K4p/8/8/8/8/8/7R b - - 0 1", mirrored("k7/2K4p/8/8/8/8/8/7R b - - 0 1")]


@pytest.mark.parametrize("fen", BEING_MATED)
def test_being_mated_is_proven_lost(fen):
    ref = chess.Board(fen)
    assert every_reply_mated_within(ref, 1)
    tree = search(Tree(Board(fen), seed=0), FakeNet(), 2000)
    assert tree.root_proven == -1
    children = tree.root_children()
    assert {c["move"] for c in children} == {m.uci() for m in ref.legal_moves}
    for c in children:
        assert c["proven"] == -1 and c["q"] == -1.0 and c["m"] == 1
    # The pv is the loser's move and the mate that follows.
    pv = tree.pv()
    for move in pv:
        ref.push_uci(move)
    assert len(pv) == 2 and ref.is_checkmate()


# --------------------------------------------------------------------------- stalemate trap

# White is a queen up; Qc7 looks natural (it takes every square but a8) and stalemates.
STALEMATE_TRAP = "k7/8/8/1K6/8/8/8/2Q5 w - - 0 1"


def _stalemating_moves(fen: str) -> set[str]:
    ref = chess.Board(fen)
    out = set()
    for move in ref.legal_moves:
        ref.push(move)
        if ref.is_stalemate():
            out.add(move.uci())
        ref.pop()
    return out


@pytest.mark.parametrize("fen", [STALEMATE_TRAP, mirrored(STALEMATE_TRAP)])
@pytest.mark.parametrize("batch_size", [1, 8, 64])
def test_stalemate_trap_is_avoided(fen, batch_size):
    traps = _stalemating_moves(fen)
    assert len(traps) == 1
    trap = next(iter(traps))
    # The network likes the trap best (as a real one might): the search must see through it.
    net = FakeNet(bonus={" ".join(fen.split()[:3]): {trap: 5.0}})  # prior ~0.5
    tree = search(Tree(Board(fen), seed=0), net, 600, batch_size)
    trap_child = child(tree, trap)
    assert trap_child["n"] > 0, "the trap was never looked at"
    assert trap_child["proven"] == 0 and trap_child["q"] == 0.0 and trap_child["d"] == 1.0
    assert tree.best_move() != trap
    best = tree.root_children()[0]
    assert best["q"] > 0.5
    # A stalemate is a draw, not a lost position: the visits it took were scored 0. (Or the
    # search proved the mate first and stopped: the proof, not the visits, picks the move.)
    assert trap_child["n"] < best["n"] or (tree.root_proven == 1 and best["proven"] == 1), (
        f"the stalemate took {trap_child['n']} of {tree.playouts} visits "
        f"(best {best['move']} {best['n']})"
    )


# --------------------------------------------------------------------------- draws


def _forced_shuffle():
    """From the start: Nf3 Nf6 Ng1 Ng8 comes back to the start position."""
    return ["g1f3", "g8f6", "f3g1", "f6g8"]


def _shuffle_net():
    """White wins everywhere, and the knight shuffle is what the policy likes best."""
    start = chess.Board()
    bonus = {}
    for move in _forced_shuffle() * 2:
        bonus.setdefault(" ".join(start.fen().split()[:3]), {})[move] = 6.0
        start.push_uci(move)
    fake = FakeNet(uniform=True, bonus=bonus)

    def net(planes):
        policy, _, mlh = fake(planes)
        _, wdl, _ = WhiteWinsNet()(planes)
        return policy, wdl, mlh

    return net


def _repeating_move(root: Board, two_fold_draws: bool) -> tuple[dict, list]:
    """Search ``root``; re-root three plies down the shuffle and read the child that
    completes it (its W-L and D are what the search backed up there); then re-root at
    that child and return its children too (none if it was never expanded)."""
    tree = search(Tree(root, seed=0, two_fold_draws=two_fold_draws), _shuffle_net(), 400)
    line = _forced_shuffle()
    assert tree.set_position(pushed(root, *line[:3])) is True
    repeat = child(tree, line[3])
    assert tree.set_position(pushed(root, *line)) is True
    assert tree.nodes == repeat["n"]
    return repeat, tree.root_children()


def test_two_fold_repetition_inside_the_tree_scores_a_draw():
    # With two_fold_draws the position after Nf3 Nf6 Ng1 Ng8 (the root again) is a draw:
    # every visit of it backed up exactly 0 with draw probability 1, although the network
    # says white wins there (so black, who moved into it, would score -1), and it was
    # never expanded.
    repeat, below = _repeating_move(Board(), two_fold_draws=True)
    assert repeat["n"] > 0
    assert repeat["q"] == 0.0 and repeat["d"] == 1.0
    assert below == []
    # Without two_fold_draws it is an ordinary position: the network evaluated and
    # expanded it.
    repeat, below = _repeating_move(Board(), two_fold_draws=False)
    assert repeat["n"] > 1
    assert repeat["d"] < 1.0
    assert below and sum(c["n"] for c in below) == repeat["n"] - 1


def test_threefold_repetition_with_the_game_history_scores_a_draw():
    # The start position occurred twice in the game (plies 0 and 4): coming back to it
    # inside the tree is a threefold repetition, a draw even without two_fold_draws.
    root = pushed(Board(), *_forced_shuffle())
    repeat, below = _repeating_move(root, two_fold_draws=False)
    assert repeat["n"] > 0
    assert repeat["q"] == 0.0 and repeat["d"] == 1.0
    assert below == []


def test_repetition_of_a_position_from_before_the_root():
    shuffle = _forced_shuffle()
    # Nf3 Nf6 Ng1 played in the game: Ng8 brings back the start position, which occurred
    # once, before the root. One repetition of a position from before the root is no draw.
    root = pushed(Board(), *shuffle[:3])
    once = search(Tree(root, seed=0), _shuffle_net(), 200)
    back = child(once, shuffle[3])
    assert back["n"] > 1 and back["proven"] is None
    assert once.set_position(pushed(root, shuffle[3])) is True
    assert once.root_children(), "the position was treated as terminal (never expanded)"
    # After one more shuffle in the game, the same move repeats the start position a third
    # time: a threefold repetition with the game history, a draw with or without two_fold_draws.
    for two_fold_draws in (True, False):
        root = pushed(Board(), *shuffle, *shuffle[:3])
        twice = search(Tree(root, seed=0, two_fold_draws=two_fold_draws), _shuffle_net(), 200)
        back = child(twice, shuffle[3])
        assert back["n"] > 0 and back["proven"] == 0 and back["q"] == 0.0 and back["d"] == 1.0
        assert twice.best_move() == shuffle[3]  # black, lost everywhere, takes the draw


HALFMOVE_99 = "k7/8/8/8/8/8/P7/K6R w - - 99 80"


@pytest.mark.parametrize("fen", [HALFMOVE_99, mirrored(HALFMOVE_99)])
@pytest.mark.parametrize("batch_size", [1, 8])
def test_halfmove_clock_reaching_100_is_a_draw(fen, batch_size):
    tree = search(Tree(Board(fen), seed=0), FakeNet(uniform=True), 400, batch_size)
    ref = chess.Board(fen)
    visited = [c for c in tree.root_children() if c["n"] > 0]
    quiet = [c for c in visited if not ref.is_zeroing(chess.Move.from_uci(c["move"]))]
    zeroing = [c for c in visited if ref.is_zeroing(chess.Move.from_uci(c["move"]))]
    assert len(quiet) >= 3 and zeroing
    for c in quiet:
        assert c["proven"] == 0 and c["q"] == 0.0, c
    for c in zeroing:  # a pawn move resets the clock: the game goes on
        assert c["proven"] is None and c["q"] > 0.5, c
    best = tree.root_children()[0]
    assert ref.is_zeroing(chess.Move.from_uci(best["move"])), (
        f"a 50-move draw {best['move']} ({best['n']} visits) is played over a winning pawn move "
        f"({[(c['move'], c['n'], round(c['q'], 2)) for c in zeroing]})"
    )


def test_mate_on_the_hundredth_halfmove_is_a_mate():
    fen = "k7/8/1K6/8/8/8/8/7R w - - 99 80"
    tree = search(Tree(Board(fen), seed=0), FakeNet(uniform=True), 400)
    assert tree.root_proven == 1 and tree.best_move() == "h1h8"
    for c in tree.root_children()[1:]:
        if c["n"]:
            assert c["proven"] == 0 and c["q"] == 0.0  # every other move hits the 50-move rule


INSUFFICIENT = "8/8/4k3/8/8/8/3r4/4K2B w - - 0 1"  # Kxd2 leaves king and bishop against king


@pytest.mark.parametrize("fen", [INSUFFICIENT, mirrored(INSUFFICIENT)])
def test_insufficient_material_is_a_draw(fen):
    ref = chess.Board(fen)
    capture = next(
        m.uci()
        for m in ref.legal_moves
        if ref.is_capture(m) and ref.piece_type_at(m.from_square) == chess.KING
    )
    ref.push_uci(capture)
    assert ref.is_insufficient_material()
    tree = search(Tree(Board(fen), seed=0), FakeNet(), 300)
    c = child(tree, capture)
    assert c["n"] > 0 and c["proven"] == 0 and c["q"] == 0.0 and c["d"] == 1.0
    # a rook down, the draw is the best there is
    assert tree.best_move() == capture
    for other in tree.root_children()[1:]:
        if other["n"]:
            assert other["proven"] is None and other["q"] < 0


# --------------------------------------------------------------------------- tree reuse


def test_reused_tree_keeps_its_visits():
    net = FakeNet()
    start = Board()
    tree = search(Tree(start, seed=5), net, 1500, batch_size=16)
    twin = search(Tree(start, seed=5), net, 1500, batch_size=16)
    assert tree.visit_distribution() == twin.visit_distribution()

    move, visits = tree.root_children()[0]["move"], tree.root_children()[0]["n"]
    assert visits > 1
    after_one = pushed(start, move)
    assert tree.set_position(after_one) is True
    assert tree.nodes == visits
    assert tree.playouts == 0  # counted again from the new root
    reply = tree.root_children()[0]
    assert reply["n"] > 0 and sum(c["n"] for c in tree.root_children()) == visits - 1

    # Best move and a reply pushed at once onto a copy: the grandchild becomes the root.
    after_two = pushed(start, move, reply["move"])
    assert twin.set_position(after_two) is True
    assert twin.nodes == reply["n"]
    assert tree.set_position(after_two) is True
    assert tree.nodes == reply["n"]
    assert tree.visit_distribution() == twin.visit_distribution()

    # The reused tree searches on from there.
    search(tree, net, 200)
    assert tree.nodes >= reply["n"] + 200

    # A position that does not extend the previous one starts an empty tree.
    other = Board("r1bqkbnr/pppp1ppp/2n5/4p3/4P3/5N2/PPPP1PPP/RNBQKB1R w KQkq - 2 3")
    assert tree.set_position(other) is False
    assert tree.nodes == 0 and tree.root_children() == [] and tree.playouts == 0
    # Going back to an earlier position is no extension either.
    assert twin.set_position(after_one) is False
    assert twin.nodes == 0
    search(twin, net, 50)
    assert twin.nodes >= 50


def test_reuse_needs_the_moves_to_be_in_the_tree():
    tree = search(Tree(Board(), seed=0), FakeNet(), 8)
    unvisited = [c["move"] for c in tree.root_children() if c["n"] == 0]
    assert unvisited
    assert tree.set_position(pushed(Board(), unvisited[0])) is False
    assert tree.nodes == 0


def test_reuse_compacts_a_large_tree_and_keeps_the_subtree():
    # Re-rooting a tree much larger than the kept subtree copies that subtree into fresh
    # pools; the copy must keep every child (visits of a node = 1 + its children's visits
    # under the null evaluator, where no leaf is terminal this early).
    start = Board()
    tree = search(Tree(start, seed=0), null_eval, 120_000, batch_size=256)
    move = tree.root_children()[0]["move"]
    kept = child(tree, move)["n"]
    before, memory = tree.allocated_nodes, tree.memory_bytes
    assert before > 2 * kept + 65536  # large enough to be compacted
    assert tree.set_position(pushed(start, move)) is True
    assert tree.nodes == kept
    assert tree.allocated_nodes < before and tree.memory_bytes < memory
    children = tree.root_children()
    assert sum(c["n"] for c in children) == kept - 1
    assert sum(1 for c in children if c["n"] > 0) == len(children)  # all 20 replies were searched
    assert 0 < tree.allocated_nodes <= kept  # the kept subtree, and nothing else
    search(tree, null_eval, kept + 5000, batch_size=256)
    assert tree.nodes >= kept + 5000


# --------------------------------------------------------------------------- seeds and noise


def _noisy_search(seed: int) -> dict:
    tree = Tree(Board(), seed=seed, noise_epsilon=0.25)
    return search(tree, FakeNet(), 500, batch_size=8).visit_distribution()


def test_same_seed_same_search_with_noise():
    assert _noisy_search(7) == _noisy_search(7)


def test_different_seeds_differ_with_noise():
    assert _noisy_search(7) != _noisy_search(8)


def test_noise_changes_the_root_priors():
    quiet = search(Tree(Board(), seed=1), FakeNet(), 50)
    noisy = search(Tree(Board(), seed=1, noise_epsilon=0.25), FakeNet(), 50)
    priors = {c["move"]: c["prior"] for c in quiet.root_children()}
    noisy_priors = {c["move"]: c["prior"] for c in noisy.root_children()}
    assert priors.keys() == noisy_priors.keys()
    assert priors != noisy_priors
    assert sum(noisy_priors.values()) == pytest.approx(1.0, abs=len(priors) * Q_EPS)


# --------------------------------------------------------------------------- move choice with temperature

MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15  # the tree's random numbers: splitmix64 (cython_src/tree.pyx, _rand)


def _unxorshift(y: int, shift: int) -> int:
    x = y
    for _ in range(64 // shift + 1):
        x = y ^ (x >> shift)
    return x


def seed_whose_first_draw_is(output: int) -> int:
    """The seed after which the tree's generator returns ``output`` first (splitmix64 inverted)."""
    z = _unxorshift(output, 31)
    z = _unxorshift(z * pow(0x94D049BB133111EB, -1, 1 << 64) & MASK64, 27)
    z = _unxorshift(z * pow(0xBF58476D1CE4E5B9, -1, 1 << 64) & MASK64, 30)
    return (z - GOLDEN) & MASK64


def first_draw(seed: int) -> int:
    z = (seed + GOLDEN) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def test_seed_whose_first_draw_is_inverts_the_generator():
    for output in (0, 1, MASK64, MASK64 ^ 0x7FF, 0x0123456789ABCDEF):
        assert first_draw(seed_whose_first_draw_is(output)) == output


def _chi_square_limit(df: int, z: float = 4.75) -> float:
    """The chi-square quantile at P(exceed) ~ 1e-6 (z = 4.75), by Wilson and Hilferty."""
    return df * (1 - 2 / (9 * df) + z * (2 / (9 * df)) ** 0.5) ** 3


def _searched_start() -> Tree:
    tree = search(Tree(Board(), seed=0), FakeNet(jitter=0.3), 400)
    assert sum(1 for c in tree.root_children() if c["n"] > 0) > 10
    return tree


def test_choose_move_with_a_draw_of_one_takes_the_last_visited_move():
    # The top draw (1.0, from 53 one bits) leaves no cumulative weight above it: the move is
    # the last one with visits, by a valid index (this once read children[-1] with
    # wraparound off: out of bounds).
    tree = _searched_start()
    visited = [c["move"] for c in tree.root_children() if c["n"] > 0]
    for temperature in (1.0, 0.5, 3.0):
        tree.seed(seed_whose_first_draw_is(MASK64 ^ 0x7FF))
        assert tree.choose_move(temperature) == visited[-1]
    # ... and the lowest draw takes the first.
    tree.seed(seed_whose_first_draw_is(0))
    assert tree.choose_move(1.0) == visited[0]


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_choose_move_follows_the_visit_distribution(temperature):
    tree = _searched_start()
    visits = {c["move"]: c["n"] for c in tree.root_children() if c["n"] > 0}
    draws = 6000
    counts = dict.fromkeys(visits, 0)
    for seed in range(draws):  # fixed seeds: the test is deterministic
        tree.seed(seed)
        counts[tree.choose_move(temperature)] += 1
    weights = {m: n ** (1 / temperature) for m, n in visits.items()}
    total = sum(weights.values())
    expected = {m: draws * w / total for m, w in weights.items()}
    # Moves expected fewer than 5 times are pooled into one cell.
    rare = [m for m in visits if expected[m] < 5]
    cells = [(counts[m], expected[m]) for m in visits if m not in rare]
    if rare:
        cells.append((sum(counts[m] for m in rare), sum(expected[m] for m in rare)))
    chi2 = sum((seen - e) ** 2 / e for seen, e in cells)
    assert chi2 < _chi_square_limit(len(cells) - 1), (chi2, counts, expected)
    # Every move that should come up does.
    assert all(counts[m] > 0 for m in visits if expected[m] >= 20)


def test_choose_move_at_a_tiny_temperature_takes_the_most_visited_move():
    # n ** (1 / 0.001) overflows a float for n > 2; the weights are relative to the top.
    tree = _searched_start()
    children = tree.root_children()
    assert children[0]["n"] > children[1]["n"] > 2
    for seed in range(20):
        tree.seed(seed)
        assert tree.choose_move(0.001) == children[0]["move"]
    assert tree.choose_move(0.0) == children[0]["move"]


# --------------------------------------------------------------------------- cache


def test_cache_returns_what_the_network_gave():
    net = FakeNet(jitter=0.7, mlh=True)
    cache = NNCache(capacity=200_003)  # direct-mapped: roomy, so that no entry is replaced here
    start = Board("r1bqkb1r/pppp1ppp/2n2n2/4p3/2B1P3/5N2/PPPP1PPP/RNBQK2R w KQkq - 4 4")
    tree = search(Tree(start, cache=cache, seed=0), net, 300)
    temperature = SearchParams().policy_temperature
    checked = 0
    for c in tree.root_children():
        if c["n"] < 2:  # expanded children only
            continue
        board = pushed(start, c["move"])
        hit = cache.lookup(board)
        assert hit is not None, f"no cache entry after {c['move']}"
        wl, d, m, priors = hit
        logits, wdl, mlh = net.position(encoding.encode_board(board))
        assert wl == pytest.approx(float(wdl[0] - wdl[2]), abs=1e-6)
        assert d == pytest.approx(float(wdl[1]), abs=1e-6)
        assert m == pytest.approx(mlh)
        expected = reference_legal_softmax(chess.Board(board.fen()), logits, temperature)
        assert priors.keys() == expected.keys()
        for move, p in priors.items():
            assert abs(p - expected[move]) <= Q_EPS + 1e-6, (move, p, expected[move])
        checked += 1
    assert checked >= 3
    assert cache.lookup(Board("8/8/4k3/8/8/8/8/4K2R w - - 0 1")) is None


def test_a_second_tree_is_served_from_the_cache():
    # One leaf per batch: the second search makes the same selections as the first, but
    # every one of them is answered by the cache at once, so it needs no network at all.
    net = FakeNet()
    cache = NNCache(capacity=200_003)
    first = search(Tree(Board(), cache=cache, seed=0), net, 300, batch_size=1)
    rows = net.rows
    assert 0 < len(cache) <= rows  # one entry per evaluated position
    again = search(Tree(Board(), cache=cache, seed=0), net, 300, batch_size=1)
    assert net.rows == rows
    assert again.visit_distribution() == first.visit_distribution()
    assert again.root_q == first.root_q
    cache.clear()
    assert len(cache) == 0


# --------------------------------------------------------------------------- many trees, one batch

SHARED_FENS = [
    chess.STARTING_FEN,
    "r3k2r/p1ppqpb1/bn2pnp1/3PN3/1p2P3/2N2Q1p/PPPBBPPP/R3K2R w KQkq - 0 1",
    "r4rk1/1pp1qppp/p1np1n2/2b1p1B1/2B1P1b1/P1NP1N2/1PP1QPPP/R4RK1 w - - 0 10",
    "rnbq1k1r/pp1Pbppp/2p5/8/2B5/8/PPP1NnPP/RNBQK2R w KQ - 1 8",
    "8/2p5/3p4/KP5r/1R3p1k/8/4P1P1/8 w - - 0 1",
    "r1bqkbnr/pppp1ppp/2n5/4p3/4P3/5N2/PPPP1PPP/RNBQKB1R w KQkq - 2 3",
    "8/8/4k3/8/2p5/8/1P2K3/8 b - - 0 40",
    "r2q1rk1/ppp2ppp/2n1bn2/3pp3/3PP3/2N1BN2/PPP2PPP/R2Q1RK1 b - - 4 8",
]
LEAVES_PER_TREE = 12
ROUNDS = 25


def _tree_result(tree: Tree):
    return tree.visit_distribution(), tree.root_q, tree.nodes, tree.pv()


def _shared_search(net, permute=False):
    trees = [Tree(Board(fen), seed=i) for i, fen in enumerate(SHARED_FENS)]
    batch = Batch(len(trees) * LEAVES_PER_TREE)
    for _ in range(ROUNDS):
        for tree in trees:
            tree.gather(batch, max_leaves=LEAVES_PER_TREE)
        n = len(batch)
        assert n >= len(trees)  # every tree put leaves in (one each while roots are unexpanded)
        policy, wdl, mlh = net(batch.planes[:n])
        if permute:  # what a misrouting backup would do: rows reach the wrong leaves
            order = np.roll(np.arange(n), LEAVES_PER_TREE)
            policy, wdl = policy[order], wdl[order]
        batch.backup(policy, wdl, mlh)
        assert len(batch) == 0
    return trees


def _alone_search(net, index):
    tree = Tree(Board(SHARED_FENS[index]), seed=index)
    batch = Batch(LEAVES_PER_TREE)
    for _ in range(ROUNDS):
        tree.gather(batch, max_leaves=LEAVES_PER_TREE)
        if len(batch):
            policy, wdl, mlh = net(batch.planes[: len(batch)])
            batch.backup(policy, wdl, mlh)
    return tree


def test_trees_sharing_a_batch_search_as_if_alone():
    # Every position gets its own value (value_jitter), so a row backed up into the
    # wrong tree or the wrong leaf changes that tree's numbers.
    net = FakeNet(jitter=0.5, value_jitter=0.3)
    calls = net.calls
    shared = _shared_search(net)
    assert net.calls - calls == ROUNDS  # one network call per round for all eight trees
    for i, tree in enumerate(shared):
        alone = _alone_search(net, i)
        assert tree.nodes > ROUNDS
        assert _tree_result(tree) == _tree_result(alone), SHARED_FENS[i]


def test_shared_batch_check_would_catch_misrouted_rows():
    net = FakeNet(jitter=0.5, value_jitter=0.3)
    scrambled = _shared_search(net, permute=True)
    differs = [
        _tree_result(tree) != _tree_result(_alone_search(net, i)) for i, tree in enumerate(scrambled)
    ]
    assert all(differs)


def test_one_tree_gathering_twice_into_a_batch():
    # Two gathers from the same tree before one backup: the in-flight leaves of the
    # first gather are not handed out again.
    tree = Tree(Board(), seed=0)
    batch = Batch(64)
    search(tree, FakeNet(), 20)
    first = tree.gather(batch, max_leaves=16)
    second = tree.gather(batch, max_leaves=16)
    assert first == 16 and second > 0 and len(batch) == first + second
    rows = {batch.planes[i].tobytes() for i in range(len(batch))}
    assert len(rows) == len(batch)  # no leaf twice
    policy, wdl, mlh = FakeNet()(batch.planes[: len(batch)])
    before = tree.nodes
    batch.backup(policy, wdl, mlh)
    assert tree.nodes == before + first + second
    assert all(c["in_flight"] == 0 for c in tree.root_children())


# --------------------------------------------------------------------------- root restrictions and terminal roots


def test_searchmoves_restricts_the_root():
    tree = Tree(Board(), seed=0)
    allowed = {"a2a3", "h2h4", "b1c3"}
    tree.set_searchmoves(sorted(allowed) + ["e2e5"])  # an illegal name restricts nothing it names
    search(tree, FakeNet(), 300)
    visited = {c["move"] for c in tree.root_children() if c["n"] > 0}
    assert visited == allowed
    assert tree.best_move() in allowed
    assert tree.pv()[0] in allowed
    tree.set_searchmoves(None)
    search(tree, FakeNet(), 1000)
    assert len({c["move"] for c in tree.root_children() if c["n"] > 0}) > len(allowed)


def test_searchmoves_survive_set_position():
    tree = Tree(Board(), seed=0)
    tree.set_searchmoves(["g2g4"])
    tree.set_position(Board())
    search(tree, FakeNet(), 100)
    assert {c["move"] for c in tree.root_children() if c["n"] > 0} == {"g2g4"}


def test_searchmoves_are_respected_by_the_best_move_when_they_lose():
    # The only allowed move walks into a mate in one; the best move must still be it.
    fen = "6k1/5ppp/8/8/8/8/5PPP/R5K1 b - - 0 1"  # black to move; Kh8?? allows Ra8#
    tree = Tree(Board(fen), seed=0)
    ref = chess.Board(fen)
    blunder = "g8h8"
    ref.push_uci(blunder)
    assert mates_within(ref, 1)
    tree.set_searchmoves([blunder])
    search(tree, FakeNet(), 200)
    assert child(tree, blunder)["proven"] == -1
    assert tree.best_move() == blunder


def test_searchmoves_naming_no_legal_move_do_not_stall_the_search():
    # UCI: illegal names restrict nothing; with none legal left, the search must still run
    # (lc0 treats an empty filter as no filter) rather than make no progress at all.
    tree = Tree(Board(), seed=0)
    tree.set_searchmoves(["e2e5", "a1a1"])
    search(tree, FakeNet(), 100)
    assert tree.nodes >= 100
    best = tree.best_move()
    assert child(tree, best)["n"] > 0


TERMINAL_ROOTS = [
    ("rnb1kbnr/pppp1ppp/8/4p3/6Pq/5P2/PPPPP2P/RNBQKBNR w KQkq - 1 3", -1),  # checkmated
    ("k7/8/1Q6/8/8/8/8/7K b - - 0 1", 0),  # stalemated
    ("8/8/4k3/8/8/8/8/4K3 w - - 0 1", 0),  # bare kings
]


@pytest.mark.parametrize("fen,result", TERMINAL_ROOTS)
def test_terminal_roots_gather_nothing(fen, result):
    tree = Tree(Board(fen), seed=0)
    batch = Batch(16)
    assert tree.gather(batch) == 0
    assert len(batch) == 0
    assert tree.root_proven == result
    assert tree.best_move() is None and tree.pv() == [] and tree.root_children() == []
    assert tree.gather(batch) == 0 and len(batch) == 0 and tree.nodes == 0


def test_average_depth_is_the_mean_depth_of_the_playouts():
    tree = Tree(Board(), seed=0)
    search(tree, FakeNet(), 2, batch_size=1)  # the root (depth 0), then one child (depth 1)
    assert tree.playouts == 2
    assert tree.average_depth == pytest.approx(0.5)
    assert tree.seldepth == 1


def test_memory_per_node():
    tree = search(Tree(Board(), seed=0), null_eval, 20_000, batch_size=256)
    assert tree.nodes >= 20_000
    assert 0 < tree.bytes_per_node < 184
    assert tree.memory_bytes == pytest.approx(tree.bytes_per_node * tree.allocated_nodes)


def test_memory_budget_stops_the_search():
    tree = Tree(Board(), seed=0, max_bytes=200_000)
    search(tree, null_eval, 100_000, batch_size=64)
    assert tree.memory_bytes <= 200_000
    assert 0 < tree.nodes < 100_000
    assert tree.out_of_memory
    assert tree.best_move() is not None


# --------------------------------------------------------------------------- bad input


def test_batch_capacity_must_be_positive():
    with pytest.raises(ValueError):
        Batch(0)
    with pytest.raises(ValueError):
        Batch(-5)


def _gathered():
    tree = Tree(Board(), seed=0)
    search(tree, FakeNet(), 30)
    batch = Batch(16)
    n = tree.gather(batch)
    assert n == len(batch) > 1
    return tree, batch, n


BAD_SHAPES = [
    ((1, POLICY_SIZE), (1, 3), None),  # fewer rows than leaves
    (("n", POLICY_SIZE - 1), ("n", 3), None),
    (("n", POLICY_SIZE), ("n", 2), None),
    (("n", POLICY_SIZE), (3,), None),
    ((POLICY_SIZE,), ("n", 3), None),
    (("n", POLICY_SIZE), ("n", 3), (1,)),
]


@pytest.mark.parametrize("shapes", BAD_SHAPES)
def test_backup_with_wrong_shapes_raises_and_loses_nothing(shapes):
    tree, batch, n = _gathered()
    nodes, children = tree.nodes, tree.root_children()

    def make(shape):
        if shape is None:
            return None
        return np.zeros(tuple(n if d == "n" else d for d in shape), np.float32)

    policy, wdl, mlh = (make(s) for s in shapes)
    with pytest.raises(ValueError):
        batch.backup(policy, wdl, mlh)
    assert len(batch) == n and tree.nodes == nodes and tree.root_children() == children
    # the correct backup still works
    policy, wdl, mlh = FakeNet()(batch.planes[:n])
    batch.backup(policy, wdl, mlh)
    assert tree.nodes == nodes + n and len(batch) == 0
    assert all(c["in_flight"] == 0 for c in tree.root_children())


def test_cleared_batch_leaves_the_tree_as_it_was():
    tree, batch, n = _gathered()
    nodes = tree.nodes
    batch.clear()
    assert len(batch) == 0
    assert all(c["in_flight"] == 0 for c in tree.root_children())
    search(tree, FakeNet(), nodes + 50)
    assert tree.nodes >= nodes + 50


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_backup_with_a_non_finite_value_raises_and_loses_nothing(bad):
    # (Non-finite policy logits are the encoder's business: it falls back to uniform.)
    tree, batch, n = _gathered()
    nodes, children = tree.nodes, tree.root_children()
    policy, wdl, mlh = FakeNet()(batch.planes[:n])
    poisoned = wdl.copy()
    poisoned[n // 2, 0] = bad
    with pytest.raises(ValueError):
        batch.backup(policy, poisoned, mlh)
    assert len(batch) == n and tree.nodes == nodes and tree.root_children() == children
    batch.backup(policy, wdl, mlh)
    assert tree.nodes == nodes + n
    assert all(np.isfinite(v) for v in tree.root_q)


@pytest.mark.parametrize(
    "params",
    ids=str,
    argvalues=[
        {"cpuct_typo": 1.0},
        {"policy_temperature": float("nan")},
        {"noise_alpha": float("nan")},
        {"cpuct": float("nan")},
        {"cpuct": -1.0},
        {"fpu_value": float("inf")},
        {"policy_temperature": 0.0},
        {"policy_temperature": -1.0},
        {"noise_epsilon": 1.5},
        {"noise_epsilon": -0.1},
        {"noise_alpha": 0.0},
        {"cpuct_base": 0.0},
        {"cpuct_base_root": -3.0},
        {"cpuct": "1.5"},
        {"two_fold_draws": 2},
        {"temperature": 1.0},  # a search parameter, but not one of the tree's
    ],
)
def test_configure_rejects_bad_parameters(params):
    tree = Tree(Board())
    with pytest.raises(ValueError):
        tree.configure(**params)
    with pytest.raises(ValueError):
        Tree(Board(), **params)


def test_rejected_configure_changes_nothing():
    rejected, untouched = Tree(Board(), seed=0), Tree(Board(), seed=0)
    with pytest.raises(ValueError):
        rejected.configure(cpuct=9.0, no_such_parameter=1)
    search(rejected, FakeNet(), 300)
    search(untouched, FakeNet(), 300)
    assert rejected.visit_distribution() == untouched.visit_distribution()


def test_configure_sets_every_tree_setting():
    # The tree starts from the table's defaults, and every setting the table marks `tree`
    # reaches the tree's C struct (read back as the float32 it holds).
    tree = Tree(Board())
    defaults = SearchParams().tree_settings()
    assert tree.settings() == {k: np.float32(v) if not isinstance(v, bool) else v for k, v in defaults.items()}
    changed = {}
    for name, value in defaults.items():
        row = SearchParams.row(name)
        changed[name] = (not value) if row.type is bool else row.check(row.type((value + row.max) / 2))
    assert all(changed[k] != defaults[k] for k in defaults)
    tree.configure(**changed)
    assert tree.settings() == {k: np.float32(v) if not isinstance(v, bool) else v for k, v in changed.items()}


def test_configured_cpuct_changes_the_search():
    # A smaller exploration constant piles the root visits onto fewer moves.
    def most_visits(cpuct):
        tree = search(Tree(Board(), seed=0, cpuct=cpuct, cpuct_root=cpuct), FakeNet(), 400)
        return max(c["n"] for c in tree.root_children())

    assert most_visits(0.3) > most_visits(SearchParams().cpuct) > most_visits(6.0)


def test_missing_arguments_are_type_errors_not_crashes():
    tree = Tree(Board())
    with pytest.raises(TypeError):
        tree.set_position(None)
    with pytest.raises(TypeError):
        tree.gather(None)
    with pytest.raises(TypeError):
        NNCache(16).lookup(None)


class _WinningNetWithMovesLeft(WhiteWinsNet):
    """White wins everywhere, with a moves-left estimate that differs from position to position."""

    def __call__(self, planes: np.ndarray):
        policy, wdl, _ = super().__call__(planes)
        mlh = np.array([10 + zlib.crc32(p.tobytes()) % 40 for p in planes], np.float32)
        return policy, wdl, mlh


@pytest.mark.parametrize("side", ["winning", "losing"])
def test_moves_left_utility_prefers_short_wins_and_long_losses(side):
    """lc0's MovesLeft* utility: with every line equally won, the search leans toward the child
    the moves-left head says ends the game soonest (the loser toward the longest); off (the
    default), moves left change nothing."""
    fen = chess.STARTING_FEN if side == "winning" else "rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1"
    net = _WinningNetWithMovesLeft()
    plain = search(Tree(Board(fen), seed=1), net, 1200)
    params = SearchParams().replace(moves_left_max_effect=0.0345, moves_left_threshold=0.5)
    steered = search(Tree(Board(fen), seed=1, **params.tree_settings()), net, 1200)
    assert SearchParams().moves_left_max_effect == 0.0
    m = {c["move"]: c["m"] for c in steered.root_children()}
    preferred = min(m, key=m.get) if side == "winning" else max(m, key=m.get)
    before = {c["move"]: c["n"] for c in plain.root_children()}
    after = {c["move"]: c["n"] for c in steered.root_children()}
    assert max(before.values()) - min(before.values()) <= 2      # off: every move alike
    assert after[preferred] == max(after.values())
    assert after[preferred] > before[preferred] + 5


# --------------------------------------------------------------------------- the root summary


SUMMARY_CASES = [
    (chess.STARTING_FEN, None, 200),
    (chess.STARTING_FEN, ["d2d4", "g1f3", "b1c3"], 300),
    (chess.STARTING_FEN, ["h2h3"], 50),               # one allowed move: no second
    (chess.STARTING_FEN, ["e2e5"], 100),              # not legal: restricts nothing
    (QUEEN_TAKES_TO_MATE, None, 3000),                # a proven win on top
    (QUEEN_TAKES_TO_MATE, ["b4b5", "g1h1"], 200),
    (MATE_IN_TWO[0], None, 400),
    ("r4rk1/1pp1qppp/p1np1n2/2b1p1B1/2B1P1b1/P1NP1N2/1PP1QPPP/R4RK1 w - - 0 10", None, 500),
]


def test_root_summary_is_what_the_stop_rules_read_of_root_children():
    """Tree.root_summary (C) gives engine.move_search.summary_of of root_children() limited to the
    searchmoves, at every size of the search and for several visit shares."""
    from engine.move_search import summary_of

    seen_better = seen_proven = 0
    for fen, searchmoves, playouts in SUMMARY_CASES:
        tree = Tree(Board(fen), seed=1)
        assert tree.root_summary(0.1) == (None, 0, None, None, None, None, False)   # never expanded
        tree.set_searchmoves(searchmoves)
        net = _mate_without_prior() if fen == QUEEN_TAKES_TO_MATE else FakeNet(jitter=1.0, value_jitter=0.3)
        batch = Batch(8)
        while True:
            children = tree.root_children() if tree.nodes else []
            legal = {c["move"] for c in children}
            allowed = [m for m in (searchmoves or ()) if m in legal]
            if allowed:
                children = [c for c in children if c["move"] in allowed]
            for share in (0.0, 0.1, 0.5, 1.0):
                want = summary_of(children, share)
                assert tree.root_summary(share) == want, (fen, searchmoves, tree.playouts, share)
                seen_better += want[6]
                seen_proven += want[3] is not None
            if tree.playouts >= playouts:
                break
            before = tree.playouts
            search(tree, net, min(playouts, tree.playouts + 8), batch=batch)
            if tree.playouts == before:
                break
    assert seen_better and seen_proven     # both branches were compared


@pytest.mark.parametrize("fen,moves", [
    (chess.STARTING_FEN, ["e2e4", "c7c5", "g1f3"]),
    ("rnbqkbnr/ppp1p1pp/8/3pPp2/8/8/PPPP1PPP/RNBQKBNR w KQkq f6 0 3", []),   # from a FEN, ep square named
    ("r3k2r/8/8/8/8/8/8/R3K2R b KQkq - 7 30", ["e8g8"]),                   # castling rights, rule50 count
])
def test_a_reused_batch_writes_the_planes_a_fresh_one_does(fen, moves):
    """A batch row keeps its last encoding and the next leaf there writes only the squares that
    differ (encode_planes_over): every row must still be the leaf's planes in full. Two identical
    trees, one gathering into a fresh batch each round and one into the same batch throughout,
    must send the same planes, and the first round's root the planes encode_board gives."""
    board = Board(fen)
    for move in moves:
        board.push_uci(move)
    trees = [Tree(board), Tree(board)]
    reused = Batch(16)
    net = WhiteWinsNet()
    for round_ in range(40):
        fresh = Batch(16)
        trees[0].gather(fresh)
        trees[1].gather(reused)
        assert len(fresh) == len(reused)
        if not len(fresh):
            break
        np.testing.assert_array_equal(reused.planes[: len(reused)], fresh.planes[: len(fresh)])
        if round_ == 0:
            np.testing.assert_array_equal(fresh.planes[0], encoding.encode_board(board))
        outputs = net(fresh.planes[: len(fresh)])
        fresh.backup(*outputs)
        reused.backup(*outputs)
    assert trees[0].playouts == trees[1].playouts > 100
