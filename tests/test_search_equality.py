"""The search computes what it computed before a change made for speed (issue 47).

``tests/data/search_visits.json`` holds, for a dozen positions searched to a fixed number of nodes
by the UCI ``Searcher`` at MinibatchSize 8 and 256 on a deterministic network, what the search
ended with: the best move, the pv, every root move's visits, Q and D, and, node for node one ply
down, the visits below the three most visited root moves (read by re-rooting the searched tree
there, which keeps the subtree). It was recorded before the search was made faster, with::

    .venv/bin/python tests/test_search_equality.py --record

and a change that is only about speed must leave every number in it as it is. Nothing here reads
a clock.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import threading

import numpy as np
import pytest

from engine.board import Board
from engine.encoding import POLICY_SIZE
from engine.limits import GoParams
from engine.params import SearchParams
from engine.search import Searcher
from engine.tree import _child_rank

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "search_visits.json")
NODES = 300
BATCHES = (8, 256)
TOP_CHILDREN = 3     # root moves whose subtrees are compared node for node one ply down

# (name, FEN or "startpos", moves played from it, searchmoves)
POSITIONS = (
    ("startpos", "startpos", (), ()),
    ("ruy lopez", "startpos", ("e2e4", "e7e5", "g1f3", "b8c6", "f1b5", "a7a6"), ()),
    ("middlegame", "r4rk1/1pp1qppp/p1np1n2/2b1p1B1/2B1P1b1/P1NP1N2/1PP1QPPP/R4RK1 w - - 0 10", (), ()),
    ("qgd", "r1bq1rk1/pp2bppp/2n1pn2/2pp4/3P4/2PBPN2/PP1N1PPP/R1BQ1RK1 w - - 0 8", (), ()),
    ("kiwipete", "r3k2r/p1ppqpb1/bn2pnp1/3PN3/1p2P3/2N2Q1p/PPPBBPPP/R3K2R w KQkq - 0 1", (), ()),
    ("rook endgame", "8/2p5/3p4/KP5r/1R3p1k/8/4P1P1/8 w - - 0 1", (), ()),
    ("promotions", "r3k2r/Pppp1ppp/1b3nbN/nP6/BBP1P3/q4N2/Pp1P2PP/R2Q1RK1 w kq - 0 1", (), ()),
    ("position5", "rnbq1k1r/pp1Pbppp/2p5/8/2B5/8/PPP1NnPP/RNBQK2R w KQ - 1 8", (), ()),
    ("pawn endgame", "8/5pk1/6p1/8/3R4/6P1/5PK1/8 b - - 0 40", (), ()),
    ("back-rank mate", "6k1/5ppp/8/8/8/8/5PPP/3R2K1 w - - 0 1", (), ()),
    ("mate in two", "r1bqkb1r/pppp1ppp/2n2n2/4p2Q/2B1P3/8/PPPP1PPP/RNB1K1NR w KQkq - 4 4", (), ()),
    ("searchmoves", "startpos", (), ("d2d4", "g1f3", "b1c3")),
    ("searchmoves middlegame", "r4rk1/1pp1qppp/p1np1n2/2b1p1B1/2B1P1b1/P1NP1N2/1PP1QPPP/R4RK1 w - - 0 10",
     (), ("a3a4", "h2h3")),
)


class HashNetwork:
    """lc0's random backend in numpy: each position's outputs drawn from a generator seeded by a
    hash of its planes, so they depend on the position only (not on the batch it came in), and
    are the same on every machine (PCG64, float64 draws cast to float32)."""

    def __init__(self) -> None:
        self.calls = 0

    def evaluate(self, planes):
        self.calls += 1
        n = len(planes)
        policy = np.empty((n, POLICY_SIZE), np.float32)
        wdl = np.empty((n, 3), np.float32)
        for i in range(n):
            seed = int.from_bytes(hashlib.blake2b(np.ascontiguousarray(planes[i]).tobytes(),
                                                  digest_size=8).digest(), "little")
            rng = np.random.default_rng(seed)
            policy[i] = rng.uniform(0.0, 3.0, POLICY_SIZE)
            q = rng.uniform(-1.0, 1.0)
            d = (1.0 - abs(q)) * rng.uniform(0.0, 1.0)
            wdl[i] = ((1.0 - d + q) / 2, d, (1.0 - d - q) / 2)
        return policy, wdl, None


def _board(fen: str, moves) -> Board:
    board = Board() if fen == "startpos" else Board(fen)
    for move in moves:
        board.push_uci(move)
    return board


def _search(board: Board, batch: int, searchmoves) -> Searcher:
    net = HashNetwork()
    searcher = Searcher(lambda: net, SearchParams(minibatch_size=batch, seed=1))
    done = threading.Event()
    result = {}

    def best(r):
        result["r"] = r
        done.set()

    searcher.start(board, GoParams(nodes=NODES, searchmoves=list(searchmoves)), lambda info: None, best)
    assert done.wait(120), "the search did not end"
    searcher.wait()
    searcher.result = result["r"]
    return searcher


def _children(tree) -> list:
    return [[c["move"], c["n"], None if c["q"] is None else round(c["q"], 6),
             None if c["d"] is None else round(c["d"], 6), c["proven"]] for c in tree.root_children()]


def record_position(fen: str, moves, searchmoves, batch: int) -> dict:
    """What the search of one position ends with, and one ply down below its top root moves."""
    board = _board(fen, moves)
    searcher = _search(board, batch, searchmoves)
    tree = searcher.tree
    root = _children(tree)
    out = {"best": searcher.result.best, "ponder": searcher.result.ponder, "best_move": tree.best_move(),
           "nodes": tree.nodes, "playouts": tree.playouts, "pv": tree.pv(), "root": root, "below": {}}
    for move, n, *_ in sorted(root, key=lambda c: -c[1])[:TOP_CHILDREN]:
        if not n:
            continue
        again = _search(board, batch, searchmoves)           # the same search, re-rooted one ply down
        child = board.copy()
        child.push_uci(move)
        assert again.tree.set_position(child), "the searched subtree was not kept"
        out["below"][move] = {"best_move": again.tree.best_move(), "root": _children(again.tree)}
    return out


def record() -> dict:
    return {f"{name} @ {batch}": record_position(fen, moves, searchmoves, batch)
            for name, fen, moves, searchmoves in POSITIONS for batch in BATCHES}


@pytest.fixture(scope="module")
def recorded():
    with open(DATA, encoding="utf-8") as f:
        return json.load(f)


def test_the_record_covers_every_position_and_batch(recorded):
    assert set(recorded) == {f"{name} @ {batch}" for name, *_ in POSITIONS for batch in BATCHES}


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("name,fen,moves,searchmoves", POSITIONS, ids=[p[0] for p in POSITIONS])
def test_the_search_computes_what_it_recorded(recorded, name, fen, moves, searchmoves, batch):
    expected = recorded[f"{name} @ {batch}"]
    got = json.loads(json.dumps(record_position(fen, moves, searchmoves, batch)))
    assert got["root"] == expected["root"]                 # every root move's visits, Q, D, proof
    assert got["below"] == expected["below"]               # node for node, one ply down
    assert got == expected                                 # best move, ponder, pv, node counts


def _ranked_as_python(tree, allowed=()) -> None:
    """root_children() is ranked in C; the order must be the one the Python key gives (stable, so
    ties stay in edge order), and best_move() its first move among ``allowed`` (all when none)."""
    children = tree.root_children()
    in_edge_order = sorted(children, key=lambda c: c["edge"])
    assert [c["edge"] for c in in_edge_order] == list(range(len(children)))
    assert children == sorted(in_edge_order, key=_child_rank)
    moves = [c["move"] for c in children]
    ranked = [m for m in moves if m in allowed] or moves
    assert tree.best_move() == (ranked[0] if ranked else None)


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("name,fen,moves,searchmoves", POSITIONS, ids=[p[0] for p in POSITIONS])
def test_root_children_and_best_move_rank_as_the_python_key(name, fen, moves, searchmoves, batch):
    board = _board(fen, moves)
    searcher = _search(board, batch, searchmoves)
    _ranked_as_python(searcher.tree, searchmoves)
    for move in [c["move"] for c in searcher.tree.root_children()[:2]]:
        again = _search(board, batch, searchmoves)
        child = board.copy()
        child.push_uci(move)
        again.tree.set_position(child)       # a node one ply down, with its own proven and open children
        _ranked_as_python(again.tree)


def test_best_move_keeps_to_searchmoves_and_falls_back_to_all():
    searcher = _search(Board(), 8, ())
    tree = searcher.tree
    top = tree.root_children()[0]["move"]
    tree.set_searchmoves(["h2h3", "a2a3"])               # searched little or not at all
    _ranked_as_python(tree, ("h2h3", "a2a3"))
    assert tree.best_move() in ("h2h3", "a2a3")
    tree.set_searchmoves(["e2e5"])                       # not legal: restricts nothing
    assert tree.best_move() == top
    tree.set_searchmoves(None)
    assert tree.best_move() == top
    assert Searcher(lambda: HashNetwork()).tree.best_move() is None   # never expanded


if __name__ == "__main__":
    if sys.argv[1:] != ["--record"]:
        sys.exit(f"usage: {sys.argv[0]} --record   (writes {DATA})")
    data = record()
    with open(DATA + ".tmp", "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(DATA + ".tmp", DATA)
    print(f"wrote {DATA}: {len(data)} searches")
