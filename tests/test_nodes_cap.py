"""The ``NodesPerMove`` option: a standing cap on the nodes of every move, for GUIs and bots that
send only clocks; at 1 the engine plays the network's top policy move, as lc0 plays Maia.

The rule (``engine.limits.GoParams.with_node_cap``) is checked on its own, then through the real
engine process (:class:`test_uci_harness.UciEngine`, the bundled network, Backend cpu): with a
clock the engine stops at the cap, and at one node its move is the top policy move, computed here
independently (``engine.network.Network`` on the file the engine loaded, python-chess legal moves
and the reference policy map of ``encoding_reference``). An lc0 file must play lc0's own top policy
move at ``go nodes 1``: the repository's lc0 fixture (``tests/data/lc0/``, evaluated by lc0 v0.32.1)
everywhere, Maia 1100 where a user has it (an extra, ``lc0_files.MAIA``).

Searches are a handful of nodes; waits only turn a hang into a failure (no timing assertions).
"""

from __future__ import annotations

import os

import chess
import numpy as np
import pytest

from encoding_reference import reference_move_index, reference_planes
from lc0_files import Lc0Fixture, fixture_params
from engine.limits import GoParams
from engine.tools.puct_reference import PythonPuct
from test_uci_harness import REPO, UciEngine, infos, info_strings, legal_bestmove
from uci.options import MAX_NODES_PER_MOVE, engine_options

pytestmark = pytest.mark.timeout(120)

DEADLINE_S = 30.0
CLOCK = "wtime 60000 btime 60000"
NETS = os.path.join(REPO, "engine", "nets")

# Varied positions (both sides to move, castling rights, an endgame); those whose top two policy
# moves are too close to call after int8 rounding are left out by _clear_tops.
POSITIONS = [
    chess.STARTING_FEN,
    "rnbqkbnr/pppp1ppp/8/4p3/4P3/5N2/PPPP1PPP/RNBQKB1R b KQkq - 1 2",
    "r1bqkb1r/pppp1ppp/2n2n2/4p3/2B1P3/5N2/PPPP1PPP/RNBQK2R w KQkq - 4 4",
    "r1bq1rk1/pp2bppp/2n1pn2/2pp4/3P4/2PBPN2/PP1N1PPP/R1BQ1RK1 w - - 0 8",
    "2r2rk1/pp1bqppp/2n1pn2/3p4/3P4/2PBPN2/P1Q2PPP/R4RK1 b - - 3 13",
    "r3k2r/ppp2ppp/2n5/3qp3/8/2N2Q2/PPP2PPP/R3K2R w KQkq - 0 11",
    "8/5pk1/6p1/8/3R4/6P1/5PK1/2r5 w - - 0 40",
    "8/8/3k4/8/2K5/8/4P3/8 b - - 0 60",
]
# The smallest gap in policy share between the top two moves for a position to count.
CLEAR_GAP = 0.01


# --------------------------------------------------------------------------- the rule


@pytest.mark.parametrize("go, cap, nodes", [
    (GoParams(wtime=60000, btime=60000), 0, None),        # 0: no cap
    (GoParams(wtime=60000, btime=60000), 1, 1),           # a clock gets the cap besides
    (GoParams(nodes=400), 50, 50),                        # a cap caps
    (GoParams(nodes=20), 50, 20),                         # a smaller go nodes stands
    (GoParams(nodes=0), 50, 0),
    (GoParams(movetime=1000), 7, 7),
    (GoParams(depth=5), 7, 7),
    (GoParams(), 3, 3),                                   # a bare go
    (GoParams(ponder=True, wtime=1000, btime=1000), 1, 1),  # ponder is capped
    (GoParams(infinite=True), 1, None),                   # go infinite is not
    (GoParams(infinite=True, nodes=400), 1, 400),
])
def test_the_cap_rule(go, cap, nodes):
    capped = go.with_node_cap(cap)
    assert capped.nodes == nodes
    assert (capped.wtime, capped.movetime, capped.depth, capped.ponder, capped.infinite) == \
        (go.wtime, go.movetime, go.depth, go.ponder, go.infinite)


def test_the_option_is_declared_off_by_default():
    option = {o.name: o for o in engine_options()}["NodesPerMove"]
    assert option.declaration() == f"option name NodesPerMove type spin default 0 min 0 max {MAX_NODES_PER_MOVE}"


# --------------------------------------------------------------------------- the engine


def _loaded_file(eng: UciEngine) -> str:
    """The network file the engine said it loaded (``info string loaded network NAME ...``): it says
    so as the search after the load begins, so one is run when none has yet."""
    loaded = "info string loaded network "
    said = [text for _, text in eng.lines if text.startswith(loaded)] or \
        [text for text in eng.remarks() if text.startswith(loaded)]
    assert said, f"the engine did not say which network it loaded: {info_strings([t for _, t in eng.lines])}"
    return said[-1].split()[4]


def _policy_shares(path: str, fens: list[str]) -> list[dict]:
    """Per FEN, {uci: policy share} over the legal moves: the network's raw logits, softmaxed."""
    from engine.network import Network

    network = Network(path, backend="cpu", warmup_batch=1)
    try:
        out = []
        for fen in fens:
            board = chess.Board(fen)
            logits = network.evaluate(reference_planes(board)[None])[0][0].astype(np.float64)
            moves = list(board.legal_moves)
            values = np.array([logits[reference_move_index(board, m)] for m in moves])
            shares = np.exp(values - values.max())
            shares /= shares.sum()
            out.append({board.uci(m): float(p) for m, p in zip(moves, shares)})
        return out
    finally:
        close = getattr(network, "close", None)
        if close is not None:
            close()


def _clear_tops(shares: list[dict], fens: list[str], gap: float) -> list[tuple[str, str]]:
    """(fen, top move) where the top move leads the second by at least ``gap``."""
    out = []
    for fen, share in zip(fens, shares):
        ranked = sorted(share.items(), key=lambda kv: -kv[1])
        if len(ranked) == 1 or ranked[0][1] - ranked[1][1] >= gap:
            out.append((fen, ranked[0][0]))
    return out


def _go(eng: UciEngine, fen: str, args: str) -> tuple[list[dict], str]:
    """A new game at ``fen`` (no tree to reuse), ``go args``: (the search infos, the bestmove)."""
    eng.send("ucinewgame")
    eng.send(f"position fen {fen}")
    lines, best = eng.go(args, DEADLINE_S)
    errors = [line for line in lines if line.startswith("info string error")]
    assert not errors, errors
    return infos(lines), legal_bestmove(chess.Board(fen), best).uci()


@pytest.fixture(scope="module")
def capped():
    """One engine at NodesPerMove 1 for the tests that set it back as they need."""
    eng = UciEngine(options={"NodesPerMove": 1})
    yield eng
    eng.close()


@pytest.fixture
def eng(capped):
    assert capped.alive(), "the shared engine died in an earlier test"
    capped.pending()
    capped.setoption("NodesPerMove", 1)
    assert capped.isready() == []
    yield capped
    capped.send("stop")
    capped.isready()


def test_at_one_node_a_clock_gets_the_networks_top_policy_move(eng):
    shares = _policy_shares(os.path.join(NETS, _loaded_file(eng)), POSITIONS)
    tops = _clear_tops(shares, POSITIONS, CLEAR_GAP)
    assert len(tops) >= 4, "too few positions with a clear top policy move to test"
    for fen, top in tops:
        found, best = _go(eng, fen, CLOCK)
        assert found and max(i["nodes"] for i in found) <= 1, (fen, found)
        assert best == top, (fen, best, top, sorted(shares[POSITIONS.index(fen)].items(), key=lambda kv: -kv[1])[:3])


def test_go_nodes_1_plays_the_top_policy_move_without_the_cap(eng):
    eng.setoption("NodesPerMove", 0)
    fen = POSITIONS[3]
    shares = _policy_shares(os.path.join(NETS, _loaded_file(eng)), [fen])
    tops = _clear_tops(shares, [fen], CLEAR_GAP)
    assert tops, "the middlegame's top policy move is not clear"
    found, best = _go(eng, fen, "nodes 1")
    assert max(i["nodes"] for i in found) <= 1 and best == tops[0][1]


def test_a_cap_of_50_caps_go_nodes_400_and_a_clock(eng):
    eng.setoption("NodesPerMove", 50)
    for args in ("nodes 400", CLOCK):
        found, _ = _go(eng, POSITIONS[3], args)
        assert 1 < found[-1]["nodes"] <= 50 and max(i["nodes"] for i in found) <= 50, (args, found)
    found, _ = _go(eng, POSITIONS[3], "nodes 20")      # a smaller go nodes stands
    assert max(i["nodes"] for i in found) <= 20


def test_the_default_caps_nothing(eng):
    eng.setoption("NodesPerMove", 0)
    found, _ = _go(eng, POSITIONS[3], "nodes 120")
    assert found[-1]["nodes"] > 50, found


def test_ponder_is_capped_and_go_infinite_is_not(eng):
    # go ponder: the search stops growing at the cap, waits for ponderhit, then answers.
    eng.send("ucinewgame")
    eng.send(f"position fen {POSITIONS[3]}")
    eng.send(f"go ponder {CLOCK}")
    lines = eng.sync()          # the ponder search's reports, if it made any yet
    eng.send("ponderhit")
    lines += eng.until("bestmove", DEADLINE_S)
    legal_bestmove(chess.Board(POSITIONS[3]), lines[-1])
    assert max(i["nodes"] for i in infos(lines)) <= 1, lines
    # go infinite: searches past the cap until stop.
    eng.send("ucinewgame")
    eng.send(f"position fen {POSITIONS[3]}")
    eng.send("go infinite")
    eng.until(lambda text: text.startswith("info depth") and infos([text])[0]["nodes"] > 1, DEADLINE_S)
    eng.send("stop")
    legal_bestmove(chess.Board(POSITIONS[3]), eng.until("bestmove", DEADLINE_S)[-1])


@pytest.mark.parametrize("value", ["-1", "abc", "1.5", str(MAX_NODES_PER_MOVE + 1), ""])
def test_bad_values_are_refused_and_the_cap_stays(eng, value):
    eng.send(f"setoption name NodesPerMove value {value}")
    said = eng.sync()
    assert [line for line in said if line.startswith("info string error: option NodesPerMove ")], said
    found, _ = _go(eng, POSITIONS[0], CLOCK)
    assert max(i["nodes"] for i in found) <= 1, found


# --------------------------------------------------------------------------- lc0's files


def _lc0_tops(fixture: Lc0Fixture, gap: float) -> list[tuple[str, str]]:
    """(fen, lc0's top policy move in cyzero's UCI) for the fixture's positions with a clear top and
    no mate in one: cyzero proves a mate in one at the root before its first node (the tree's
    ``_prove_root_mates``) and plays it, where lc0 at one node plays its top policy move."""
    out = []
    for position in fixture.lc0()["positions"]:
        board = chess.Board(position["fen"])
        if PythonPuct._mates_in_one(board, list(board.legal_moves)):
            continue
        ranked = sorted(position["moves"].items(), key=lambda kv: -kv[1]["p"])
        if len(ranked) > 1 and ranked[0][1]["p"] - ranked[1][1]["p"] < gap:
            continue
        # lc0 writes castling king-takes-rook (e1h1); python-chess reads that and writes e1g1.
        out.append((position["fen"], board.uci(board.parse_uci(ranked[0][0]))))
    return out


@pytest.mark.parametrize("fixture", fixture_params())
def test_an_lc0_file_at_one_node_plays_lc0s_top_policy_move(fixture):
    path = os.path.abspath(fixture.need().pb)
    tops = _lc0_tops(fixture, gap=1.0)      # lc0's shares are in percent
    assert len(tops) >= 8
    with UciEngine(options={"WeightsFile": path}) as eng:
        assert _loaded_file(eng) == os.path.basename(path)
        for fen, top in tops:
            found, best = _go(eng, fen, "nodes 1")
            assert max(i["nodes"] for i in found) <= 1, (fen, found)
            assert best == top, (fen, best, top)
        # The same at NodesPerMove 1 under a clock, as lichess-bot would send it.
        eng.setoption("NodesPerMove", 1)
        fen, top = tops[-1]
        found, best = _go(eng, fen, CLOCK)
        assert max(i["nodes"] for i in found) <= 1 and best == top, (fen, best, top)
