"""Differential tests: the Cython core against python-chess, position by position.

Games are generated with python-chess alone (seeded ``random.Random``, so every
run plays the same games), from the standard start, the perft positions, many
Chess960 starts and hand-picked special positions (en passant, pinned en
passant, promotions, high 50-move clocks).  Some games are biased towards
captures so material comes off (insufficient material, 50/75-move rule), some
shuffle pieces back and forth (threefold / fivefold repetition), some pop moves
in the middle of the game.  Each game is then replayed on both boards and after
every push and every pop everything the two boards can say about the position
must agree.
"""

from __future__ import annotations

import functools
import random
from typing import List, NamedTuple, Optional, Tuple

import chess
import pytest

from engine.board import STARTING_FEN, Board

from chess_reference import CHESS960_FENS, outcome_tuple, position_key, ref_legal_ucis

# ------------------------------------------------------------------ game specs

PERFT_FENS = {
    "kiwipete": "r3k2r/p1ppqpb1/bn2pnp1/3PN3/1p2P3/2N2Q1p/PPPBBPPP/R3K2R w KQkq - 0 1",
    "pos3": "8/2p5/3p4/KP5r/1R3p1k/8/4P1P1/8 w - - 0 1",
    "pos4": "r3k2r/Pppp1ppp/1b3nbN/nP6/BBP1P3/q4N2/Pp1P2PP/R2Q1RK1 w kq - 0 1",
    "pos4_mirrored": "r2q1rk1/pP1p2pp/Q4n2/bbp1p3/Np6/1B3NBn/pPPP1PPP/R3K2R b KQ - 0 1",
    "pos5": "rnbq1k1r/pp1Pbppp/2p5/8/2B5/8/PPP1NnPP/RNBQK2R w KQ - 1 8",
    "pos6": "r4rk1/1pp1qppp/p1np1n2/2b1p1B1/2B1P1b1/P1NP1N2/1PP1QPPP/R4RK1 w - - 0 10",
}


SPECIAL_FENS = {
    # en passant available, the captured pawn just double-pushed
    "ep_available": "rnbqkbnr/ppp1p1pp/8/3pPp2/8/8/PPPP1PPP/RNBQKBNR w KQkq f6 0 3",
    # en passant pinned along the rank (capturing would expose the king)
    "ep_pinned_rank_w": "8/8/8/KPp4r/8/8/8/7k w - c6 0 2",
    "ep_pinned_rank_b": "8/8/8/8/k2Pp2Q/8/8/3K4 b - d3 0 1",
    # en passant capturing pawn pinned on a diagonal
    "ep_pinned_diag": "8/1k6/8/8/3Pp3/8/8/4K2B b - d3 0 1",
    # the double-pushed pawn gives check, en passant removes the checker
    "ep_evades_check": "8/8/8/2k5/3Pp3/8/8/4K3 b - d3 0 1",
    # promotions (CPW "promotion bugs" position) and a lone runner
    "promotions_b": "n1n5/PPPk4/8/8/8/8/4Kppp/5N1N b - - 0 1",
    "promotions_w": "n1n5/PPPk4/8/8/8/8/4Kppp/5N1N w - - 0 1",
    "promotion_race": "8/P1k5/K7/8/8/8/7p/8 w - - 0 1",
    # castling through/into check and with rooks under attack
    "castling": "r3k2r/8/8/8/8/8/8/R3K2R w KQkq - 0 1",
    "castling_attacked": "r3k2r/8/8/8/2b2B2/8/8/R3K2R b KQkq - 0 1",
    # endgames with high 50-move clocks: fifty / seventy-five move rule
    "rook_endgame_hm90": "8/8/4k3/8/8/3RK3/8/8 w - - 90 100",
    "knight_bishop_hm140": "8/5k2/8/8/2N5/8/3K4/6B1 w - - 140 150",
    "queen_vs_rook_hm95": "8/2r5/4k3/8/8/3QK3/8/8 b - - 95 120",
    "bishops_same_colour": "8/8/4kb2/8/8/2B1K3/8/8 w - - 0 1",
    "pawn_endgame": "8/5pk1/8/4P3/8/8/1K6/8 w - - 0 1",
}


class GameSpec(NamedTuple):
    id: str
    fen: Optional[str]        # None: Chess960 start position `n960`
    chess960: bool
    n960: Optional[int]
    mode: str                 # random | captures | shuffle | popping | scripted
    seed: int
    max_plies: int
    script: Tuple[str, ...] = ()


def _build_specs() -> List[GameSpec]:
    specs: List[GameSpec] = []
    seed = 1000

    def add(id_, fen, chess960, n960, mode, max_plies, script=()):
        nonlocal seed
        seed += 1
        specs.append(GameSpec(f"{id_}-{mode}-{seed}", fen, chess960, n960, mode, seed,
                              max_plies, tuple(script)))

    modes = ("random", "captures", "shuffle", "popping")
    for mode in modes:
        for _ in range(3):
            add("start", chess.STARTING_FEN, False, None, mode, 200)
    for name, fen in PERFT_FENS.items():
        for mode in ("random", "captures", "shuffle"):
            add(name, fen, False, None, mode, 200)
    for name, fen in CHESS960_FENS.items():
        for mode in ("random", "captures", "popping"):
            add(name, fen, True, None, mode, 200)
    pick = random.Random(960)
    numbers = [0, 518, 959] + pick.sample(range(960), 45)
    for i, n in enumerate(numbers):
        add(f"960pos{n}", None, True, n, modes[i % len(modes)], 200)
    for name, fen in SPECIAL_FENS.items():
        for mode in ("random", "captures"):
            add(name, fen, False, None, mode, 200)
    # the standard array in chess960 mode: castling as king-takes-rook
    add("start960", chess.STARTING_FEN, True, None, "captures", 200)
    # long capture-biased games, so that quiet endgames run up the clocks
    for _ in range(6):
        add("start_long", chess.STARTING_FEN, False, None, "captures", 320)
    # scripted: a position after a double push (no legal en passant) repeats;
    # python-chess counts it as a repetition of the later identical positions
    add("start", chess.STARTING_FEN, False, None, "scripted", 0,
        "e2e4 g8f6 g1f3 f6g8 f3g1 g8f6 g1f3 f6g8 f3g1 g8f6 g1f3 f6g8 f3g1".split())
    # threefold claim available through the next move / by castling-rights loss
    add("start", chess.STARTING_FEN, False, None, "scripted", 0,
        "g1f3 g8f6 f3g1 f6g8 g1f3 g8f6 f3g1 f6g8 g1f3".split())
    add("castling", SPECIAL_FENS["castling"], False, None, "scripted", 0,
        "e1f1 e8f8 f1e1 f8e8 e1f1 e8f8 f1e1 f8e8 e1f1 e8f8 f1e1 f8e8".split())
    # a legal en passant ceded, then the position (without ep) shuffles
    add("ep_available", SPECIAL_FENS["ep_available"], False, None, "scripted", 0,
        "g1f3 g8f6 f3g1 f6g8 g1f3 g8f6 f3g1 f6g8 g1f3".split())
    # repetitions under 50-move clocks beyond 32 bits (python-chess counts them;
    # a clock truncated to a C int would hide the earlier occurrences)
    for clock in (2**31 - 4, 2**32 - 4, 2**33 - 2, 2**40 + 3):
        add(f"clock{clock}", f"4k3/8/8/8/8/8/8/R3K3 w - - {clock} 1", False, None, "scripted", 0,
            "a1a2 e8d8 a2a1 d8e8 a1a2 e8d8 a2a1 d8e8 a1a2 e8d8 a2a1 d8e8 a1a2".split())
    return specs


SPECS = _build_specs()


def _ref_start(spec: GameSpec) -> chess.Board:
    if spec.fen is None:
        return chess.Board.from_chess960_pos(spec.n960)
    return chess.Board(spec.fen, chess960=spec.chess960)


def _our_start(spec: GameSpec) -> Board:
    if spec.fen is None:
        return Board.from_chess960_pos(spec.n960)
    return Board(spec.fen, chess960=spec.chess960)


def _reversible(board: chess.Board, move: chess.Move) -> bool:
    return not (board.is_zeroing(move) or board.is_castling(move))


def _choose(board: chess.Board, rng: random.Random, mode: str) -> chess.Move:
    moves = sorted(board.legal_moves, key=lambda m: m.uci())
    if mode == "captures":
        pieces = chess.popcount(board.occupied)
        if pieces <= 7:
            # few pieces left: mostly quiet moves, so the 50-move clock runs up
            quiet = [m for m in moves if not board.is_zeroing(m)]
            if quiet and rng.random() < 0.9:
                return rng.choice(quiet)
        else:
            captures = [m for m in moves if board.is_capture(m)]
            if captures and rng.random() < 0.75:
                return rng.choice(captures)
    return rng.choice(moves)


@functools.lru_cache(maxsize=None)
def generate_game(index: int) -> Tuple[Tuple[str, ...], frozenset]:
    """The operations of game `index` ("push <uci>" or "pop") and the position
    keys python-chess visited.  Deterministic: seeded by the spec."""
    spec = SPECS[index]
    board = _ref_start(spec)
    assert board.is_valid(), spec
    rng = random.Random(spec.seed)
    ops: List[str] = []
    keys = {position_key(board.fen())}

    def push(move: chess.Move) -> None:
        ops.append("push " + board.uci(move))
        board.push(move)
        keys.add(position_key(board.fen()))

    def pop() -> None:
        ops.append("pop")
        board.pop()

    if spec.mode == "scripted":
        for uci in spec.script:
            push(board.parse_uci(uci))
        return tuple(ops), frozenset(keys)

    shuffle_at = rng.randrange(0, 40) if spec.mode == "shuffle" else -1
    plies = 0
    while plies < spec.max_plies and board.outcome() is None:
        if plies == shuffle_at:
            plies += _shuffle(board, rng, push)
            shuffle_at = plies + rng.randrange(10, 40)
            continue
        push(_choose(board, rng, spec.mode))
        plies += 1
        if spec.mode == "popping" and rng.random() < 0.12:
            for _ in range(rng.randint(1, min(3, len(board.move_stack)))):
                pop()
    return tuple(ops), frozenset(keys)


def _shuffle(board: chess.Board, rng: random.Random, push) -> int:
    """Moves one piece of each side out and back, 2-5 times: threefold and
    fivefold repetitions.  Returns the number of plies pushed."""
    plies = 0
    first = [m for m in board.legal_moves if _reversible(board, m)]
    if not first:
        push(rng.choice(sorted(board.legal_moves, key=lambda m: m.uci())))
        return 1
    a = rng.choice(sorted(first, key=lambda m: m.uci()))
    board.push(a)
    second = [m for m in board.legal_moves if _reversible(board, m)]
    board.pop()
    if not second:
        push(a)
        return 1
    b = rng.choice(sorted(second, key=lambda m: m.uci()))
    cycle = [a, b, chess.Move(a.to_square, a.from_square), chess.Move(b.to_square, b.from_square)]
    for _ in range(rng.randint(2, 5)):
        for move in cycle:
            if board.outcome() is not None or move not in board.legal_moves:
                return plies
            push(move)
            plies += 1
    return plies


# ------------------------------------------------------------------ comparison

def _cheap_state(board, is_ref: bool) -> dict:
    if is_ref:
        return {
            "fen": board.fen(),
            "shredder_fen": board.fen(shredder=True),
            "turn": board.turn,
            "halfmove_clock": board.halfmove_clock,
            "fullmove_number": board.fullmove_number,
            "chess960": board.chess960,
            "move_stack": [m.uci() for m in board.move_stack],
            "is_check": board.is_check(),
            "is_checkmate": board.is_checkmate(),
            "is_stalemate": board.is_stalemate(),
            "is_insufficient_material": board.is_insufficient_material(),
            "is_repetition(3)": board.is_repetition(3),
            "is_repetition(2)": board.is_repetition(2),
            "is_repetition(4)": board.is_repetition(4),
            "is_fivefold_repetition": board.is_fivefold_repetition(),
            "is_fifty_moves": board.is_fifty_moves(),
            "is_seventyfive_moves": board.is_seventyfive_moves(),
            "is_game_over": board.is_game_over(),
            "outcome": outcome_tuple(board.outcome()),
        }
    return {
        "fen": board.fen(),
        "shredder_fen": board.fen(shredder=True),
        "turn": board.turn,
        "halfmove_clock": board.halfmove_clock,
        "fullmove_number": board.fullmove_number,
        "chess960": board.chess960,
        "move_stack": list(board.move_stack),
        "is_check": board.is_check(),
        "is_checkmate": board.is_checkmate(),
        "is_stalemate": board.is_stalemate(),
        "is_insufficient_material": board.is_insufficient_material(),
        "is_repetition(3)": board.is_repetition(3),
        "is_repetition(2)": board.is_repetition(2),
        "is_repetition(4)": board.is_repetition(4),
        "is_fivefold_repetition": board.is_fivefold_repetition(),
        "is_fifty_moves": board.is_fifty_moves(),
        "is_seventyfive_moves": board.is_seventyfive_moves(),
        "is_game_over": board.is_game_over(),
        "outcome": board.outcome(),
    }


def _claim_state(board, is_ref: bool) -> dict:
    threefold = board.can_claim_threefold_repetition()
    if is_ref:
        # python-chess answers this by pushing every legal move, and its can_claim_draw, outcome and
        # is_game_over(claim_draw=True) each ask again: they get the one answer (an instance attribute
        # shadows the method) and still compute everything else their own way.
        board.can_claim_threefold_repetition = lambda: threefold
    try:
        state = {
            "can_claim_threefold_repetition": threefold,
            "can_claim_fifty_moves": board.can_claim_fifty_moves(),
            "can_claim_draw": board.can_claim_draw(),
            "is_game_over(claim_draw)": board.is_game_over(claim_draw=True),
        }
        outcome = board.outcome(claim_draw=True)
    finally:
        if is_ref:
            del board.can_claim_threefold_repetition
    state["outcome(claim_draw)"] = outcome_tuple(outcome) if is_ref else outcome
    return state


def assert_same(ours: Board, ref: chess.Board, where: str, full: bool) -> None:
    def context() -> str:  # only for a failure's message: a fen and the move list cost more than the checks
        return f"{where}; position {ref.fen()} after ...{[m.uci() for m in ref.move_stack][-8:]}"

    legal = ours.legal_moves()
    assert len(legal) == len(set(legal)), f"duplicate legal moves {sorted(legal)}; {context()}"
    expected = ref_legal_ucis(ref)
    if set(legal) != expected:
        pytest.fail(f"legal moves differ: missing {sorted(expected - set(legal))}, "
                    f"extra {sorted(set(legal) - expected)}; {context()}")
    got = _cheap_state(ours, False)
    want = _cheap_state(ref, True)
    if full:
        got.update(_claim_state(ours, False))
        want.update(_claim_state(ref, True))
    diff = {k: (got[k], want[k]) for k in want if got[k] != want[k]}
    assert not diff, f"(ours, python-chess) differ: {diff}; {context()}"
    assert ours.hash() == ours.compute_hash(), f"incremental hash != recomputed; {context()}"
    if full:
        for uci in legal:
            assert ours.is_legal(uci), f"is_legal({uci!r}) is False for a legal move; {context()}"
        for move in ref.generate_pseudo_legal_moves():
            if not ref.is_legal(move):
                uci = ref.uci(move)
                assert not ours.is_legal(uci), f"is_legal({uci!r}) True, illegal; {context()}"


def replay(index: int) -> None:
    spec = SPECS[index]
    ops, _ = generate_game(index)
    ref = _ref_start(spec)
    ours = _our_start(spec)
    start_fen = ref.fen()
    assert_same(ours, ref, f"{spec.id} start", full=True)
    for i, op in enumerate(ops):
        full = spec.mode in ("shuffle", "scripted") or i % 5 == 0
        if op == "pop":
            got = ours.pop()
            want = ref.pop().uci()
            assert got == want, f"{spec.id} op {i}: pop() returned {got!r}, expected {want!r}"
        else:
            uci = op.split()[1]
            ours.push_uci(uci)
            ref.push_uci(uci)
        assert_same(ours, ref, f"{spec.id} op {i} ({op})", full)
    # the final position with every claim, then unwind the whole game
    assert_same(ours, ref, f"{spec.id} end", full=True)
    depth = len(ref.move_stack)
    for j in range(depth):
        got = ours.pop()
        want = ref.pop().uci()
        assert got == want, f"{spec.id} unwind {j}: pop() returned {got!r}, expected {want!r}"
        assert_same(ours, ref, f"{spec.id} unwind {j}", full=(j % 7 == 0))
    assert ours.fen() == start_fen
    assert ours.move_stack == []
    with pytest.raises(IndexError):
        ours.pop()


@pytest.mark.parametrize("index", range(len(SPECS)), ids=[s.id for s in SPECS])
def test_game_matches_python_chess(index):
    replay(index)


# ------------------------------------------------------------------ aggregates

def test_games_cover_enough_distinct_positions():
    keys = set()
    for index, spec in enumerate(SPECS):
        _, game_keys = generate_game(index)
        keys |= {(spec.chess960, key) for key in game_keys}
    assert len(keys) >= 2000, len(keys)


def test_games_reach_the_interesting_states():
    """The game set must actually exercise what it claims to (guards against a
    generator change that silently stops producing endgames or repetitions)."""
    seen = set()
    for index, spec in enumerate(SPECS):
        ops, _ = generate_game(index)
        ref = _ref_start(spec)
        for op in ops:
            if op == "pop":
                ref.pop()
                continue
            move = ref.parse_uci(op.split()[1])
            if ref.is_en_passant(move):
                seen.add("en_passant")
            if move.promotion and move.promotion != chess.QUEEN:
                seen.add("underpromotion")
            if ref.is_castling(move):
                seen.add("chess960_castling" if ref.chess960 else "castling")
            ref.push(move)
            outcome = ref.outcome()
            if outcome is not None:
                seen.add(outcome.termination.name.lower())
            if ref.is_repetition(3):
                seen.add("threefold")
            if ref.is_fifty_moves():
                seen.add("fifty_moves")
    wanted = {"en_passant", "underpromotion", "castling", "chess960_castling", "checkmate",
              "stalemate", "insufficient_material", "seventyfive_moves",
              "fivefold_repetition", "threefold", "fifty_moves"}
    assert wanted <= seen, f"never reached: {sorted(wanted - seen)}"


def test_hash_is_a_function_of_the_position():
    """Equal positions (FEN without the move counters) have equal hashes, and the
    distinct positions of all games have distinct hashes."""
    for chess960 in (False, True):
        hashes = {}
        for index, spec in enumerate(SPECS):
            if spec.chess960 != chess960:
                continue
            ops, _ = generate_game(index)
            ours = _our_start(spec)
            hashes.setdefault(position_key(ours.fen()), set()).add(ours.hash())
            for op in ops:
                if op == "pop":
                    ours.pop()
                else:
                    ours.push_uci(op.split()[1])
                hashes.setdefault(position_key(ours.fen()), set()).add(ours.hash())
        ambiguous = {k: v for k, v in hashes.items() if len(v) != 1}
        assert not ambiguous, f"same position, different hashes: {list(ambiguous.items())[:5]}"
        owners = {}
        for key, (h,) in hashes.items():
            owners.setdefault(h, []).append(key)
        collisions = [v for v in owners.values() if len(v) > 1]
        assert not collisions, f"different positions, same hash: {collisions[:5]}"
        assert len(hashes) > 500


def test_hash_ignores_move_counters_but_not_position():
    a = Board("r3k2r/8/8/8/8/8/8/R3K2R w KQkq - 0 1")
    b = Board("r3k2r/8/8/8/8/8/8/R3K2R w KQkq - 37 90")
    assert a.hash() == b.hash()
    variants = [
        "r3k2r/8/8/8/8/8/8/R3K2R b KQkq - 0 1",   # turn
        "r3k2r/8/8/8/8/8/8/R3K2R w Kkq - 0 1",    # castling
        "r3k2r/8/8/8/8/8/8/R3K2R w KQk - 0 1",
        "r3k2r/8/8/8/8/8/8/R3K2R w - - 0 1",
        "r3k2r/8/8/8/8/8/8/R3K1R1 w Qkq - 0 1",   # a piece moved
    ]
    hashes = {a.hash()} | {Board(f).hash() for f in variants}
    assert len(hashes) == len(variants) + 1
    for f in variants:
        board = Board(f)
        assert board.hash() == board.compute_hash()
    # a legal en passant square is part of the position
    with_ep = Board("rnbqkbnr/ppp1p1pp/8/3pPp2/8/8/PPPP1PPP/RNBQKBNR w KQkq f6 0 3")
    without = Board("rnbqkbnr/ppp1p1pp/8/3pPp2/8/8/PPPP1PPP/RNBQKBNR w KQkq - 0 3")
    assert with_ep.hash() != without.hash()


# ------------------------------------------------------------ static positions

STATIC_FENS = [
    chess.STARTING_FEN,
    "7k/6Q1/6K1/8/8/8/8/8 b - - 100 80",      # mate takes precedence over 50 moves
    "7k/5Q2/6K1/8/8/8/8/8 b - - 150 80",      # stalemate over 75 moves
    "7k/5Q2/6K1/8/8/8/8/8 b - - 0 80",
    "8/8/8/8/8/8/8/k1K5 w - - 0 1",            # bare kings
    "8/8/4k3/8/8/2B1K3/8/8 w - - 0 1",         # K+B v K
    "8/8/4k3/8/8/2N1K3/8/8 b - - 0 1",         # K+N v K
    "8/8/4kb2/8/8/2B1K3/8/8 w - - 0 1",        # bishops on the same colour
    "8/8/4k1b1/8/8/2B1K3/8/8 w - - 0 1",       # bishops on different colours
    "8/8/4kn2/8/8/2N1K3/8/8 w - - 0 1",        # K+N v K+N
    "8/8/4k3/8/8/1NN1K3/8/8 w - - 0 1",        # K+N+N v K
    "8/8/4k3/8/8/2B1K3/4P3/8 w - - 0 1",
    "8/8/4k3/8/8/4K3/4R3/8 w - - 99 70",
    "8/8/4k3/8/8/4K3/4R3/8 b - - 100 70",
    "8/8/4k3/8/8/4K3/4R3/8 b - - 149 70",
    "8/8/4k3/8/8/4K3/4R3/8 b - - 150 70",
    "k7/1R6/1K6/8/8/8/8/8 b - - 0 1",          # stalemate with a rook
    "k7/8/1K6/4B3/8/8/8/8 b - - 0 1",         # no moves, but insufficient material wins
    "8/8/8/KPp4r/8/8/8/7k w - c6 0 2",
    "8/1k6/8/8/3Pp3/8/8/4K2B b - d3 0 1",
    "8/8/8/2k5/3Pp3/8/8/4K3 b - d3 0 1",
    "rnbqkbnr/ppp1p1pp/8/3pPp2/8/8/PPPP1PPP/RNBQKBNR w KQkq f6 0 3",
    "rnbqkbnr/pppp1ppp/8/8/3pP3/8/PPP2PPP/RNBQKBNR b KQkq e3 0 3",   # ep square, no capture
]


@pytest.mark.parametrize("fen", STATIC_FENS)
@pytest.mark.parametrize("chess960", [False, True])
def test_static_position_matches_python_chess(fen, chess960):
    ref = chess.Board(fen, chess960=chess960)
    assert ref.is_valid()
    ours = Board(fen, chess960=chess960)
    assert_same(ours, ref, f"static {fen}", full=True)


def test_default_board_is_the_start_position():
    assert STARTING_FEN == chess.STARTING_FEN
    assert Board().fen() == chess.STARTING_FEN
    assert Board(None).fen() == chess.STARTING_FEN
    assert Board().chess960 is False
    assert Board(chess960=True).chess960 is True
    assert Board().hash() == Board(chess.STARTING_FEN).hash() == Board().compute_hash()


@pytest.mark.parametrize("fen", [
    "8/8/8/8/8/8/8/4K2k w - -",
    "8/8/8/8/8/8/8/4K2k w",
    "8/8/8/8/8/8/8/4K2k",
    "r3k2r/8/8/8/8/8/8/R3K2R w KQkq",
])
def test_missing_trailing_fields_like_python_chess(fen):
    ref = chess.Board(fen)
    ours = Board(fen)
    assert ours.fen() == ref.fen()
    assert set(ours.legal_moves()) == ref_legal_ucis(ref)


def test_from_chess960_pos_all_960():
    for n in range(960):
        ref = chess.Board.from_chess960_pos(n)
        ours = Board.from_chess960_pos(n)
        assert ours.chess960 is True, n
        assert ours.fen() == ref.fen(), n
        assert ours.fen(shredder=True) == ref.fen(shredder=True), n
        assert set(ours.legal_moves()) == ref_legal_ucis(ref), n
        assert ours.hash() == ours.compute_hash(), n


@pytest.mark.parametrize("n", [-1, 960, 10**6])
def test_from_chess960_pos_out_of_range(n):
    with pytest.raises(ValueError):
        chess.Board.from_chess960_pos(n)
    with pytest.raises(ValueError):
        Board.from_chess960_pos(n)


# ------------------------------------------------------- castling notations

CASTLING_FENS = [
    "r3k2r/8/8/8/8/8/8/R3K2R w KQkq - 0 1",
    "r3k2r/8/8/8/8/8/8/R3K2R b KQkq - 0 1",
    "r3k2r/8/8/8/8/8/8/R3K2R w Qk - 0 1",
    "r3k2r/8/8/8/2b5/8/8/R3K2R w KQkq - 0 1",        # f1 attacked: no O-O
    "r3k2r/8/8/8/8/8/8/RN2K1NR w KQkq - 0 1",        # both paths blocked
    "r3k2r/8/8/8/8/8/8/R3K2R w - - 0 1",             # no rights: e1h1 is nonsense
    "r3k2r/8/8/8/8/8/8/R3K1R1 w Qkq - 0 1",          # rook on g1
    "1r2k1r1/8/8/8/8/8/8/1R2K1R1 w GBgb - 0 1",      # chess960: rook on g1 and b1
    "rk5r/8/8/8/8/8/8/RK5R w KQkq - 0 1",            # chess960: king on b1
    "r5kr/8/8/8/8/8/8/R5KR b KQkq - 0 1",            # chess960: king on g8, next to h8
    "1r4kr/8/8/8/8/8/8/1R4KR w KQkq - 0 1",
    "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQK2R w KQkq - 0 1",
    "4k3/8/8/8/8/8/8/qRK4R w BH - 0 1",              # chess960: b1 rook shields the c1 king
    "Qrk4r/8/8/8/8/8/8/4K3 b bh - 0 1",
]


def _castling_candidates(board: chess.Board) -> List[str]:
    out = set()
    for color in (chess.WHITE, chess.BLACK):
        king = board.king(color)
        rank = chess.square_rank(king)
        for f in range(8):
            sq = chess.square(f, rank)
            if sq != king:
                out.add(chess.square_name(king) + chess.square_name(sq))
    out |= {"e1g1", "e1c1", "e1h1", "e1a1", "e8g8", "e8c8", "e8h8", "e8a8"}
    return sorted(out)


@pytest.mark.parametrize("chess960", [False, True])
@pytest.mark.parametrize("fen", CASTLING_FENS)
def test_push_uci_castling_notations_like_python_chess(fen, chess960):
    ref0 = chess.Board(fen, chess960=chess960)
    if not ref0.is_valid():
        # e.g. chess960-only castling rights in standard mode; covered by the fuzz tests
        with pytest.raises(ValueError):
            Board(fen, chess960=chess960)
        return
    for uci in _castling_candidates(ref0):
        ref = ref0.copy()
        ours = Board(fen, chess960=chess960)
        before = (ours.fen(), ours.hash())
        try:
            move = ref.push_uci(uci)
        except ValueError:
            with pytest.raises(ValueError):
                ours.push_uci(uci)
            assert (ours.fen(), ours.hash()) == before, uci
            continue
        ours.push_uci(uci)
        assert ours.fen() == ref.fen(), uci
        assert ours.move_stack == [move.uci()], uci
        assert ours.hash() == ours.compute_hash(), uci
        assert ours.pop() == move.uci()
        assert (ours.fen(), ours.hash()) == before


def test_chess960_flag_is_writable_and_changes_castling_notation():
    fen = "r3k2r/8/8/8/8/8/8/R3K2R w KQkq - 0 1"
    ours = Board(fen)
    ref = chess.Board(fen)
    assert "e1g1" in ours.legal_moves() and "e1h1" not in ours.legal_moves()
    ours.chess960 = True
    ref.chess960 = True
    assert ours.chess960 is True
    assert set(ours.legal_moves()) == ref_legal_ucis(ref)
    assert "e1h1" in ours.legal_moves() and "e1g1" not in ours.legal_moves()
    ours.chess960 = False
    ref.chess960 = False
    assert set(ours.legal_moves()) == ref_legal_ucis(ref)


# ------------------------------------------------- random castling positions

def _random_castling_position(rng: random.Random) -> Optional[str]:
    """A random position with kings and rooks on their back ranks, random
    (X-FEN / Shredder) castling rights and a few random pieces, often sliders
    on the back ranks: the corner cases of (Chess960) castling."""
    board = chess.Board(None)
    rights = []
    for color, rank in ((chess.WHITE, 0), (chess.BLACK, 7)):
        king_file = rng.randrange(1, 7)
        board.set_piece_at(chess.square(king_file, rank), chess.Piece(chess.KING, color))
        for side_files in (range(0, king_file), range(king_file + 1, 8)):
            if rng.random() < 0.85:
                f = rng.choice(list(side_files))
                board.set_piece_at(chess.square(f, rank), chess.Piece(chess.ROOK, color))
                if rng.random() < 0.8:
                    letter = chess.FILE_NAMES[f]
                    rights.append(letter.upper() if color == chess.WHITE else letter)
    for _ in range(rng.randint(0, 5)):
        square = rng.randrange(64)
        if rng.random() < 0.5:          # mostly on a back rank, where castling happens
            square = chess.square(rng.randrange(8), rng.choice((0, 1, 6, 7)))
        if board.piece_at(square) is None:
            piece_type = rng.choice((chess.QUEEN, chess.ROOK, chess.ROOK, chess.BISHOP,
                                     chess.KNIGHT, chess.PAWN))
            if piece_type == chess.PAWN and chess.square_rank(square) in (0, 7):
                continue
            board.set_piece_at(square, chess.Piece(piece_type, rng.random() < 0.5))
    board.turn = rng.random() < 0.5
    castling = "".join(sorted(r for r in rights if r.isupper()) + sorted(r for r in rights
                                                                        if r.islower())) or "-"
    return f"{board.board_fen()} {'w' if board.turn else 'b'} {castling} - 0 1"


def test_random_castling_positions_match_python_chess():
    rng = random.Random(960960)
    checked = castles = 0
    for _ in range(6000):
        fen = _random_castling_position(rng)
        for chess960 in (True, False):
            ref = chess.Board(fen, chess960=chess960)
            if not ref.is_valid():
                continue
            checked += 1
            castles += any(ref.is_castling(m) for m in ref.legal_moves)
            ours = Board(fen, chess960=chess960)
            assert ours.fen() == ref.fen(), fen
            assert ours.fen(shredder=True) == ref.fen(shredder=True), fen
            legal, expected = set(ours.legal_moves()), ref_legal_ucis(ref)
            assert legal == expected, (f"{fen} (chess960={chess960}): missing "
                                       f"{sorted(expected - legal)}, extra {sorted(legal - expected)}")
    assert checked >= 3000 and castles >= 1000, (checked, castles)


# -------------------------------------------------------------------- copy()

def test_copy_is_independent_and_keeps_history():
    ours = Board()
    ref = chess.Board()
    for uci in "e2e4 e7e5 g1f3 b8c6 f1c4 g8f6".split():
        ours.push_uci(uci)
        ref.push_uci(uci)
    snapshot = (ours.fen(), ours.hash(), list(ours.move_stack))
    clone = ours.copy()
    assert (clone.fen(), clone.hash(), list(clone.move_stack)) == snapshot
    assert clone.chess960 == ours.chess960
    # moving the copy leaves the original alone ...
    clone.push_uci("e1g1")
    clone.push_uci("f6e4")
    assert (ours.fen(), ours.hash(), list(ours.move_stack)) == snapshot
    # ... and the other way round
    ours.push_uci("d2d3")
    assert clone.move_stack[-2:] == ["e1g1", "f6e4"]
    assert clone.hash() == clone.compute_hash()
    # the copy can pop through the history it inherited
    for _ in range(8):
        clone.pop()
    assert clone.fen() == chess.STARTING_FEN
    assert ours.move_stack[-1] == "d2d3"
    ours.pop()
    assert (ours.fen(), ours.hash(), list(ours.move_stack)) == snapshot
    # repetition detection of a copy sees the inherited history
    rep = Board()
    for uci in "g1f3 g8f6 f3g1 f6g8 g1f3 g8f6 f3g1 f6g8".split():
        rep.push_uci(uci)
    assert rep.copy().is_repetition(3) is True


def test_copy_of_chess960_board():
    ours = Board.from_chess960_pos(0)
    clone = ours.copy()
    assert clone.chess960 is True
    clone.chess960 = False
    assert ours.chess960 is True
