"""``cyzero match`` (engine.tools.match): statistics, openings, and matches between real and fake engines.

The fake engines are small Python scripts written to a temporary folder: a
random mover, and engines that play an illegal move, send no move, never
answer ``go``, answer too late, or exit on their first ``go``. Each plays a
short match against the random mover; the runner must record the right
failure and never fail itself. Stockfish (Debian's, in /usr/games) plays the
random mover when it is installed.
"""

from __future__ import annotations

import io
import json
import math
import os
import re
import shlex
import shutil
import sys
import textwrap

import chess
import chess.pgn
import pytest

import numpy as np

from uci import cli
from engine.tools import match as m
from engine.tools import sprt

pytestmark = pytest.mark.timeout(120)

STOCKFISH = shutil.which("stockfish") or ("/usr/games/stockfish" if os.access("/usr/games/stockfish", os.X_OK) else None)
needs_stockfish = pytest.mark.skipif(STOCKFISH is None, reason="needs Debian's stockfish: apt install stockfish (it goes to /usr/games)")

# --------------------------------------------------------------------------- statistics


def test_all_draws_is_zero_elo_with_a_zero_width_interval():
    st = m.score_stats(0, 0, 10)
    assert st.score == 0.5
    assert st.elo == 0.0
    assert st.elo_low == 0.0 and st.elo_high == 0.0
    assert st.los == 0.5


def test_a_75_percent_score_is_plus_191_elo():
    # -400 log10(1/0.75 - 1) = 400 log10(3) = 190.85
    assert m.elo_from_score(0.75) == pytest.approx(190.85, abs=0.01)
    assert m.elo_from_score(0.25) == pytest.approx(-190.85, abs=0.01)
    assert m.elo_from_score(0.5) == 0.0
    assert m.elo_from_score(1.0) == math.inf and m.elo_from_score(0.0) == -math.inf


def test_trinomial_interval_by_hand():
    # +2 -0 =2: mu = 0.75, var = (2 * 0.25^2 + 2 * 0.25^2) / 4 = 0.0625, se = sqrt(0.0625 / 4) = 0.125,
    # mu -+ 1.96 se = 0.505 and 0.995 -> -400 log10(1/0.505 - 1) = +3.47, -400 log10(1/0.995 - 1) = +919.54
    st = m.score_stats(2, 0, 2)
    assert st.score == 0.75 and st.stderr == pytest.approx(0.125)
    assert st.elo == pytest.approx(190.85, abs=0.01)
    assert st.elo_low == pytest.approx(3.47, abs=0.01)
    assert st.elo_high == pytest.approx(919.54, abs=0.01)
    # +3 -1 =0: se = sqrt(((3 * 0.25^2 + 0.75^2) / 4) / 4) = 0.2165; the upper bound leaves (0, 1): +inf
    st = m.score_stats(3, 1, 0)
    assert st.elo_low == pytest.approx(-126.46, abs=0.01)
    assert st.elo_high == math.inf
    assert m.score_stats(0, 0, 0).score is None


def _pair_games(*pair_scores):
    """GameRecords for engine 1 scoring ``pair_scores`` pairs, listed in reverse order
    (concurrent games finish out of order); a lone score is a pair left incomplete."""
    games = []
    for k, scores in enumerate(pair_scores):
        for j, score in enumerate(scores):
            white = j == 0
            result = "1/2-1/2" if score == 0.5 else ("1-0" if (score == 1.0) == white else "0-1")
            games.append(m.GameRecord(index=2 * k + j, opening=None, engine1_white=white, white="a",
                                      black="b", result=result, termination="normal", reason=""))
    return games[::-1]


def test_pentanomial_interval_by_hand():
    # Pairs scoring 2, 3/2, 1, 1 (the last 1 as a win and a loss): per-game means 1, .75, .5, .5,
    # mu = 2.75 / 4 = 0.6875; var = (0.3125^2 + 0.0625^2 + 2 * 0.1875^2) / 4 = 0.04296875,
    # se = sqrt(var / 4) = 0.103645; mu -+ 1.96 se = 0.484357, 0.890643
    # -> Elo +136.97 in [-10.87, +364.34].  The fifth pair has one game and is left out.
    games = _pair_games((1.0, 1.0), (1.0, 0.5), (0.5, 0.5), (1.0, 0.0), (0.0,))
    ps = m.pair_stats(games)
    assert ps.counts == (0, 0, 2, 1, 1) and ps.pairs == 4
    assert ps.score == pytest.approx(0.6875) and ps.stderr == pytest.approx(0.103645, abs=1e-6)
    assert ps.elo == pytest.approx(136.97, abs=0.01)
    assert ps.elo_low == pytest.approx(-10.87, abs=0.01)
    assert ps.elo_high == pytest.approx(364.34, abs=0.01)
    assert m.pair_stats([]).pairs == 0 and m.pair_stats([]).elo is None
    assert m.pair_stats(_pair_games((1.0, 1.0))).elo == math.inf


def test_los_by_hand_and_symmetric():
    assert m.likelihood_of_superiority(0, 0) == 0.5
    assert m.likelihood_of_superiority(5, 5) == 0.5
    # 0.5 (1 + erf(4 / sqrt(8))) = 0.97725
    assert m.likelihood_of_superiority(4, 0) == pytest.approx(0.97725, abs=1e-5)
    for w, l in [(4, 0), (7, 3), (10, 12), (1, 0)]:
        assert m.likelihood_of_superiority(w, l) + m.likelihood_of_superiority(l, w) == pytest.approx(1.0)
    # draws do not change LOS
    assert m.score_stats(7, 3, 20).los == m.score_stats(7, 3, 0).los


def test_time_control_parsing():
    assert m.TimeControl.parse("10+0.1") == m.TimeControl(base=10.0, increment=0.1)
    assert m.TimeControl.parse("60") == m.TimeControl(base=60.0, increment=0.0)
    assert m.TimeControl.parse("1:30+1") == m.TimeControl(base=90.0, increment=1.0)
    assert m.TimeControl.parse("10+0.1").pgn_tag() == "10+0.1"
    assert m.TimeControl(nodes=100).pgn_tag() == "-"
    for bad in ["", "fast", "10+", "-5", "0+1"]:
        with pytest.raises(m.MatchError):
            m.TimeControl.parse(bad)


# --------------------------------------------------------------------------- the SPRT


def _loglik_max(counts, scores, s):
    """max of sum n_i log q_i over distributions q on ``scores`` with mean ``s``: Newton's method on
    the primal problem (steps inside the plane sum q = 1, sum q a = s), independent of the
    one-dimensional dual equation that engine.tools.sprt solves."""
    n, a = np.array(counts, float), np.array(scores, float)
    z = np.linalg.svd(np.vstack([np.ones_like(a), a]))[2][2:].T   # a basis of the constraints' null space
    high = (s - 0.05) / 0.9
    q = np.full_like(a, 0.1 / len(a))                               # inside the simplex, mean s
    q[np.argmin(a)] += 0.9 * (1.0 - high)
    q[np.argmax(a)] += 0.9 * high
    f = lambda q: float(np.sum(n * np.log(q)))                      # noqa: E731
    for _ in range(100):
        g, h = z.T @ (n / q), z.T @ np.diag(-n / q**2) @ z
        step = z @ np.linalg.solve(h, -g)
        t = 1.0
        while np.any(q + t * step <= 0) or f(q + t * step) < f(q) - 1e-12:
            t /= 2
        q = q + t * step
    assert abs(q.sum() - 1) < 1e-9 and abs(q @ a - s) < 1e-9
    return f(q)


def _reference_llr(counts, elo0, elo1):
    """The LLR from its definition: pseudo-count 1e-3 in empty cells, profile likelihoods at the two scores."""
    scores = [1.0, 0.5, 0.0] if len(counts) == 3 else [0.0, 0.25, 0.5, 0.75, 1.0]
    counts = [c if c > 0 else 1e-3 for c in counts]
    s0, s1 = (1.0 / (1.0 + 10.0 ** (-e / 400.0)) for e in (elo0, elo1))
    return _loglik_max(counts, scores, s1) - _loglik_max(counts, scores, s0)


@pytest.mark.parametrize("wdl,elo", [
    ((10, 20, 5), (0.0, 30.0)),
    ((120, 260, 100), (0.0, 5.0)),
    ((3, 0, 7), (-10.0, 20.0)),
    ((0, 12, 0), (0.0, 30.0)),
    ((4, 0, 0), (0.0, 30.0)),
    ((1000, 1500, 950), (0.0, 10.0)),
])
def test_trinomial_llr_matches_a_direct_maximisation(wdl, elo):
    assert sprt.llr(*wdl, *elo) == pytest.approx(_reference_llr(wdl, *elo), rel=1e-6, abs=1e-6)


@pytest.mark.parametrize("counts,elo", [
    ((1, 3, 8, 5, 2), (0.0, 30.0)),
    ((0, 0, 0, 0, 6), (0.0, 200.0)),
    ((4, 0, 1, 0, 0), (-10.0, 20.0)),
    ((0, 7, 0, 9, 0), (0.0, 10.0)),
    ((120, 900, 2100, 950, 130), (0.0, 5.0)),
])
def test_pentanomial_llr_matches_a_direct_maximisation(counts, elo):
    assert sprt.llr_pentanomial(counts, *elo) == pytest.approx(_reference_llr(counts, *elo), rel=1e-6, abs=1e-6)


def test_llr_reproduces_fastchess_published_values():
    # fastchess's SPRT tests ("logistic" model), to their two decimals. Its Stats(W, L, D) and
    # Stats(LL, LD, WL, DD, WD, WW): WL and DD share the middle pentanomial cell.
    assert sprt.llr(21404, 40708, 21184, 0.5, 2.5) == pytest.approx(-1.57, abs=0.005)
    assert sprt.llr(57433, 106593, 57030, 0.0, 2.0) == pytest.approx(-2.59, abs=0.005)
    assert sprt.llr_pentanomial((223, 9863, 20279 + 1000, 10037, 246), 0.5, 2.5) == pytest.approx(-3.07, abs=0.005)
    assert sprt.llr_pentanomial((871, 26175, 55003 + 980, 26678, 821), 0.0, 2.0) == pytest.approx(-4.98, abs=0.005)


@pytest.mark.parametrize("counts", [(1100, 1500, 950), (871, 26175, 55983, 26678, 821)])
def test_llr_is_close_to_fishtests_normal_approximation(counts):
    # fishtest's classic approximation for many games (or pairs): LLR ~ N/2 (s1 - s0)(2 mean - s0 - s1) / var
    values = [1.0, 0.5, 0.0] if len(counts) == 3 else [0.0, 0.25, 0.5, 0.75, 1.0]
    n = sum(counts)
    mean = sum(c * v for c, v in zip(counts, values)) / n
    var = sum(c * (v - mean) ** 2 for c, v in zip(counts, values)) / n
    s0, s1 = 0.5, 1.0 / (1.0 + 10.0 ** (-10.0 / 400.0))
    approx = 0.5 * n * (s1 - s0) * (2 * mean - s0 - s1) / var
    value = sprt.llr(*counts, 0.0, 10.0) if len(counts) == 3 else sprt.llr_pentanomial(counts, 0.0, 10.0)
    assert value == pytest.approx(approx, rel=0.02)


def test_llr_signs_symmetry_and_bad_input():
    assert sprt.llr(0, 0, 0, 0.0, 30.0) == 0.0 and sprt.llr_pentanomial((0,) * 5, 0.0, 30.0) == 0.0
    assert sprt.llr(30, 10, 5, 0.0, 30.0) > 0 > sprt.llr(5, 10, 30, 0.0, 30.0)
    assert sprt.llr_pentanomial((0, 1, 2, 5, 4), 0.0, 30.0) > 0 > sprt.llr_pentanomial((4, 5, 2, 1, 0), 0.0, 30.0)
    # swapping the two sides with the hypotheses mirrored (-elo1, -elo0) gives the same LLR, negated
    assert sprt.llr(7, 9, 3, 0.0, 30.0) == pytest.approx(-sprt.llr(3, 9, 7, -30.0, 0.0), rel=1e-9)
    assert sprt.llr_pentanomial((1, 2, 6, 3, 2), 0.0, 30.0) == pytest.approx(
        -sprt.llr_pentanomial((2, 3, 6, 2, 1), -30.0, 0.0), rel=1e-9)
    with pytest.raises(ValueError, match="elo1 must be above elo0"):
        sprt.llr(1, 1, 1, 30.0, 0.0)
    with pytest.raises(ValueError, match=">= 0"):
        sprt.llr(-1, 1, 1, 0.0, 30.0)
    with pytest.raises(ValueError, match="5 numbers"):
        sprt.llr_pentanomial((1, 2, 3), 0.0, 30.0)


def test_sprt_bounds_are_walds():
    lower, upper = sprt.sprt_bounds(0.05, 0.05)
    assert lower == pytest.approx(-2.944439, abs=1e-6) and upper == pytest.approx(2.944439, abs=1e-6)
    lower, upper = sprt.sprt_bounds(0.05, 0.1)
    assert lower == pytest.approx(math.log(0.1 / 0.95)) and upper == pytest.approx(math.log(0.9 / 0.05))
    for alpha, beta in [(0.0, 0.05), (0.05, 1.0), (0.6, 0.5)]:
        with pytest.raises(ValueError):
            sprt.sprt_bounds(alpha, beta)
    assert sprt.verdict(upper, lower, upper) == "H1" and sprt.verdict(lower, lower, upper) == "H0"
    assert sprt.verdict(0.0, lower, upper) is None


def test_elo_bounds_parse_or_say_what_is_wrong():
    assert sprt.parse_elo_bounds("0,10") == (0.0, 10.0)
    assert sprt.parse_elo_bounds(" -5 , 2.5 ") == (-5.0, 2.5)
    for text, message in [("5", "ELO0,ELO1"), ("0,10,20", "ELO0,ELO1"), ("a,b", "ELO0,ELO1"), (",", "ELO0,ELO1"),
                          ("10,0", "ELO1 must be above ELO0"), ("5,5", "ELO1 must be above ELO0"),
                          ("0,9000", "within"), ("0,inf", "within")]:
        with pytest.raises(ValueError, match=message):
            sprt.parse_elo_bounds(text)


# --------------------------------------------------------------------------- openings


def _bundled_lines():
    for line in m.OPENINGS_PATH.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            yield line


def test_every_bundled_opening_is_legal_distinct_and_undecided():
    # Replay each line with python-chess on its own, independent of the runner's parser.
    seen = {}
    lines = list(_bundled_lines())
    assert len(lines) >= 50
    for line in lines:
        eco, name, moves = [f.strip() for f in line.split("|")]
        assert re.fullmatch(r"[A-E]\d\d", eco), line
        board = chess.Board()
        sans = [t for t in moves.split() if not re.fullmatch(r"\d+\.", t)]
        for san in sans:
            board.push_san(san)  # raises on an illegal move
        assert 4 <= len(sans) <= 10, line
        assert not board.is_game_over(claim_draw=True), line
        key = board.epd()
        assert key not in seen, f"{name} reaches the same position as {seen[key]}"
        seen[key] = name
    # and the runner reads the same positions
    openings = m.load_openings()
    assert len(openings) == len(lines)
    assert {o.board().epd() for o in openings} == set(seen)


def test_bundled_openings_are_varied():
    openings = m.load_openings()
    first_moves = {o.moves[0].uci() for o in openings}
    assert {"e2e4", "d2d4", "c2c4", "g1f3"} <= first_moves
    assert len({o.eco[0] for o in openings}) == 5  # every ECO volume A..E


def test_openings_from_fen_epd_and_pgn(tmp_path):
    fen = "r1bqkbnr/pppp1ppp/2n5/4p3/4P3/5N2/PPPP1PPP/RNBQKB1R w KQkq - 2 3"
    text = f'{fen}\nrnbqkbnr/pppppppp/8/8/3P4/8/PPP1PPPP/RNBQKBNR b KQkq - id "queen pawn";\n'
    ops = m.parse_openings(text)
    assert [o.fen for o in ops] == [fen, "rnbqkbnr/pppppppp/8/8/3P4/8/PPP1PPPP/RNBQKBNR b KQkq - 0 1"]
    assert ops[1].name == "queen pawn"
    pgn = '[Event "x"]\n[Opening "Scandi"]\n\n1. e4 d5 *\n\n[Event "y"]\n[FEN "%s"]\n[SetUp "1"]\n\n3. Bc4 *\n' % fen
    path = tmp_path / "book.pgn"
    path.write_text(pgn)
    ops = m.load_openings(path)
    assert ops[0].name == "Scandi" and ops[0].fen is None and len(ops[0].moves) == 2
    assert ops[1].fen == fen and [mv.uci() for mv in ops[1].moves] == ["f1c4"]
    with pytest.raises(m.MatchError, match="cannot read opening"):
        m.parse_openings("B00 | nonsense | 1. e4 e5 2. Ke3")
    with pytest.raises(m.MatchError, match="already decided"):
        (tmp_path / "mate.txt").write_text("X | mate | 1. f3 e5 2. g4 Qh4#\n")
        m.load_openings(tmp_path / "mate.txt")


# --------------------------------------------------------------------------- fake engines

FAKE_ENGINE = textwrap.dedent(
    r'''
    """A fake UCI engine for tests: fake.py MODE[/first] [SCORE]. A misbehaving MODE plays one legal
    move first (so the match counts its forfeits), or misbehaves from its first go with /first."""
    import os, random, sys, time
    import chess

    mode, _, when = sys.argv[1].partition("/")
    gos = 0
    score = sys.argv[2] if len(sys.argv) > 2 else None
    rng = random.Random(os.getpid())
    board = chess.Board()

    def out(line):
        sys.stdout.write(line + "\n")
        sys.stdout.flush()

    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        cmd = words[0]
        if cmd == "uci":
            out(f"id name fake-{mode}")
            out("id author tests")
            out("option name Noise type spin default 0 min 0 max 10")
            out("option name Polite type check default false")
            out("uciok")
        elif cmd == "isready":
            out("readyok")
        elif cmd == "position":
            if words[1] == "startpos":
                board = chess.Board()
                rest = words[2:]
            else:
                board = chess.Board(" ".join(words[2:8]))
                rest = words[8:]
            if rest and rest[0] == "moves":
                for uci in rest[1:]:
                    board.push_uci(uci)
        elif cmd == "go":
            gos += 1
            if gos == 1 and mode != "random" and when != "first":
                out(f"bestmove {next(iter(board.legal_moves)).uci()}")
                continue
            if mode == "hang":
                continue
            if mode == "crash":
                sys.exit(3)
            if mode == "slow":
                args = dict(zip(words[1::2], words[2::2]))
                left = int(args["wtime" if board.turn else "btime"]) / 1000
                time.sleep(left + 0.25)
            legal = list(board.legal_moves)
            if mode == "nomove":
                out("bestmove (none)")
            elif mode == "nonet":  # what lc0 and cyzero answer without a network
                out("info string error: no network loaded: test")
                out("bestmove 0000")
            elif mode == "illegal":
                bad = next(chess.Move(a, b) for a in chess.SQUARES for b in chess.SQUARES
                           if a != b and chess.Move(a, b) not in legal)
                out(f"bestmove {bad.uci()}")
            else:
                if score is not None:
                    out(f"info depth 1 score cp {score} nodes 1 pv {legal[0].uci()}")
                out(f"bestmove {rng.choice(legal).uci()}")
        elif cmd == "quit":
            break
    '''
)


@pytest.fixture(scope="module")
def fake(tmp_path_factory):
    """fake(mode, score=None) -> an engine command string for the fake engine."""
    path = tmp_path_factory.mktemp("engines") / "fake.py"
    path.write_text(FAKE_ENGINE)

    def command(mode, score=None):
        argv = [sys.executable, str(path), mode] + ([str(score)] if score is not None else [])
        return " ".join(shlex.quote(a) for a in argv)

    return command


def _config(e1, e2, games=2, tc="2+0", **kw):
    spec = lambda c, opts=(): m.EngineSpec(m.parse_command(c), list(opts))  # noqa: E731
    kw.setdefault("seed", 7)
    kw.setdefault("adjudicate_moves", 40)
    return m.MatchConfig(
        engine1=e1 if isinstance(e1, m.EngineSpec) else spec(e1),
        engine2=e2 if isinstance(e2, m.EngineSpec) else spec(e2),
        games=games,
        time_control=tc if isinstance(tc, m.TimeControl) else m.TimeControl.parse(tc),
        **kw,
    )


def _read_pgn(path):
    games = []
    with open(path, encoding="utf-8") as f:
        while (game := chess.pgn.read_game(f)) is not None:
            assert not game.errors, game.errors
            games.append(game)
    return games


def test_random_movers_alternate_colours_and_write_a_pgn_that_parses(fake, tmp_path):
    pgn = tmp_path / "out.pgn"
    lines = []
    result = m.run_match(_config(fake("random"), fake("random"), games=4, concurrency=2, pgn_path=str(pgn)), lines.append)
    assert len(result.games) == 4
    assert [g.engine1_white for g in result.games] == [True, False, True, False]
    assert sum(1 for line in lines if re.match(r"\[\d/4\] game \d", line)) == 4
    games = _read_pgn(pgn)
    assert [g.headers["Round"] for g in games] == ["1", "2", "3", "4"]
    assert [g.headers["Result"] for g in games] == [r.result for r in result.games]
    for a, b in [(games[0], games[1]), (games[2], games[3])]:  # one opening, colours reversed
        assert a.headers["Opening"] == b.headers["Opening"]
        assert (a.headers["White"], a.headers["Black"]) == (b.headers["Black"], b.headers["White"])
    name1 = result.names[0]
    assert games[0].headers["White"] == name1 == "fake-random #1"
    for game, record in zip(games, result.games):
        assert game.headers["Site"] == "cyzero match"
        assert game.headers["TimeControl"] == "2+0"
        assert game.headers["Termination"] in ("normal", "adjudication")
        moves = list(game.mainline_moves())
        assert moves == list(record.opening.moves) + record.moves
        assert int(game.headers["PlyCount"]) == len(moves)
        board = game.end().board()
        if game.headers["Termination"] == "normal":
            assert board.outcome(claim_draw=True).result() == game.headers["Result"]
        else:
            assert game.headers["Result"] == "1/2-1/2" and board.fullmove_number == 41
    assert not [p for p in os.listdir(tmp_path) if p != "out.pgn"]  # no temp file left
    failures = ("time_forfeits", "illegal_moves", "crashes", "disconnects", "restarts", "max_overshoot_ms")
    for i, stats in enumerate(result.stats):
        record = stats.as_dict()
        assert all(record[key] == 0 for key in failures), record
        # every move each engine made is timed; a random mover reports no nodes
        made = 0
        for g in result.games:
            white = g.engine1_white == (i == 0)
            white_first = len(g.opening.moves) % 2 == 0
            made += len(g.moves[0 if white == white_first else 1::2])
        assert record["moves"] == made > 0 and record["median_move_seconds"] >= 0
        assert record["median_move_nodes"] is None
    assert "speed (median a move): fake-random #1 nodes not reported in " in m.format_summary(result)


@pytest.mark.parametrize(
    "mode, counter, termination",
    [
        ("illegal", "illegal_moves", "illegal move"),
        ("nomove", "illegal_moves", "illegal move"),
        ("crash", "crashes", "abandoned"),
        ("hang", "time_forfeits", "time forfeit"),
        ("slow", "time_forfeits", "time forfeit"),
    ],
)
def test_a_misbehaving_engine_loses_and_is_counted(fake, tmp_path, mode, counter, termination):
    pgn = tmp_path / "out.pgn"
    tc = "0.3+0" if mode in ("hang", "slow") else "2+0"
    # The slow engine overruns its clock by 0.25 s: well inside its guard, so its move arrives late
    # (an overshoot) rather than being cut off; the hanging one is cut off by a short guard.
    guard = 2.0 if mode == "slow" else 0.3
    result = m.run_match(_config(fake(mode), fake("random"), games=2, tc=tc, guard=guard, pgn_path=str(pgn)))
    summary = m.summary(result)
    assert (summary["wins"], summary["losses"], summary["draws"]) == (0, 2, 0)
    assert summary["engine1"][counter] == 2
    for other in ("time_forfeits", "illegal_moves", "crashes", "disconnects"):
        if other != counter:
            assert summary["engine1"][other] == 0, other
        assert summary["engine2"][other] == 0, other
    assert [g.termination for g in result.games] == [termination] * 2
    if mode in ("crash", "hang"):
        assert summary["engine1"]["restarts"] == 1  # killed or dead after game 1, started again for game 2
    if mode == "slow":
        assert summary["engine1"]["max_overshoot_ms"] >= 200
    games = _read_pgn(pgn)
    assert [g.headers["Result"] for g in games] == ["0-1", "1-0"]  # engine1 White, then Black
    assert [g.headers["Termination"] for g in games] == [termination] * 2


@pytest.mark.parametrize("mode", ["nonet", "crash", "illegal"])
def test_an_engine_that_cannot_make_a_move_stops_the_match_after_two_games(fake, tmp_path, mode):
    pgn = tmp_path / "out.pgn"
    lines = []
    config = _config(fake("random"), fake(f"{mode}/first"), games=20, pgn_path=str(pgn))
    with pytest.raises(m.MatchError, match=r"^engine2 \(fake-\w+\) lost its first 2 games without making a move") as e:
        m.run_match(config, lines.append)
    assert [g.headers["Result"] for g in _read_pgn(pgn)] == ["1-0", "0-1"]  # the two games, not twenty
    if mode == "nonet":  # the engine's own words reach the user
        assert e.value.args[0].endswith("(engine2) sent the null move (error: no network loaded: test)")
        assert "(error: no network loaded: test)" in lines[0]


def test_an_engine_that_fails_only_after_moving_plays_the_whole_match(fake):
    result = m.run_match(_config(fake("random"), fake("crash"), games=4, concurrency=2))
    assert [g.termination for g in result.games] == ["abandoned"] * 4


def test_the_cli_says_why_an_engine_cannot_play_in_one_line(fake, capsys):
    argv = ["match", "--engine1", fake("nonet/first"), "--engine2", fake("random"), "--games", "30", "--tc", "2+0"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[-1].startswith("cyzero match: engine1 (fake-nonet) lost its first 2 games") and "no network loaded" in err[-1]
    assert len(err) == 3  # the two games' progress lines and the error


def test_resign_adjudication(fake):
    config = _config(fake("random", score=-900), fake("random", score=900), games=2, resign=(500, 3))
    result = m.run_match(config)
    assert [g.termination for g in result.games] == ["adjudication"] * 2
    assert [g.engine1_score() for g in result.games] == [0.0, 0.0]
    assert all(len(g.moves) == 6 for g in result.games)  # 3 moves each


def test_draw_adjudication_after_n_moves(fake):
    result = m.run_match(_config(fake("random"), fake("random"), games=2, adjudicate_moves=8))
    for g in result.games:
        board = g.opening.board()
        for move in g.moves:
            board.push(move)
        assert (g.termination, g.result, g.reason) == ("adjudication", "1/2-1/2", "draw by adjudication after 8 moves")
        assert board.fullmove_number == 9


def test_engine_options_are_checked(fake):
    spec = m.EngineSpec(m.parse_command(fake("random")), [("noise", "3"), ("Polite", "TRUE")])
    result = m.run_match(_config(spec, fake("random"), games=1))
    assert result.options[0] == {"Noise": 3, "Polite": True}
    for options, message in [
        ([("Hash", "16")], "has no option 'Hash'"),
        ([("Noise", "11")], r"outside the engine's range 0\.\.10"),
        ([("Polite", "maybe")], "true or false"),
    ]:
        spec = m.EngineSpec(m.parse_command(fake("random")), options)
        with pytest.raises(m.MatchError, match=message):
            m.run_match(_config(spec, fake("random"), games=1))


# --------------------------------------------------------------------------- command line


def test_cli_json_is_the_only_thing_on_stdout(fake, tmp_path, capsys):
    pgn = tmp_path / "cli.pgn"
    argv = ["match", "--engine1", fake("random"), "--engine2", fake("illegal"), "--games", "2"]
    argv += ["--tc", "2+0.01", "--pgn", str(pgn), "--seed", "3", "--adjudicate-moves", "30", "--json"]
    assert cli.main(argv) == 0
    captured = capsys.readouterr()
    data = json.loads(captured.out)  # one object and nothing else
    assert captured.out.strip().count("\n") == 0
    assert (data["games"], data["wins"], data["losses"], data["draws"]) == (2, 2, 0, 0)
    assert data["engine2"]["illegal_moves"] == 2 and data["engine1"]["illegal_moves"] == 0
    assert data["elo"] is None and data["elo_infinite"] == "+inf"
    assert data["los"] == pytest.approx(0.9214, abs=1e-4)
    assert data["pairs"] == 1 and data["pentanomial"] == [0, 0, 0, 0, 1]   # one opening, both games won
    assert data["seed"] == 3 and data["time_control"] == "2+0.01"
    for key in ["score", "score_pct", "elo_ci95", "total_seconds", "terminations", "engine1_white"]:
        assert key in data
    assert len(_read_pgn(pgn)) == 2
    assert "[2/2]" in captured.err


def test_cli_prints_a_readable_table(fake, capsys):
    argv = ["match", "--engine1", fake("random"), "--engine2", fake("random"), "--games", "2", "--nodes", "1"]
    assert cli.main(argv + ["--adjudicate-moves", "20"]) == 0
    out = capsys.readouterr().out
    assert "Elo difference" in out and "LOS" in out and "time forfeits" in out


def test_a_2_0_match_says_its_sample_is_too_small_instead_of_printing_infinite_bounds(fake, capsys):
    """A 2-0 match printed ``95% interval [+inf, +inf]``: a zero-width interval at infinity."""
    argv = ["match", "--engine1", fake("random"), "--engine2", fake("illegal"), "--games", "2",
            "--tc", "2+0.01", "--adjudicate-moves", "30"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "Elo difference (fake-random - fake-illegal): +inf, 95% interval: sample too small " \
           "(2 games that all scored the same); LOS 92.1%" in out, out
    assert "Elo from pairs +inf, 95% interval: sample too small (1 pair)" in out, out
    assert "inf]" not in out and "[+inf" not in out and "[-inf" not in out, out
    assert cli.main(argv + ["--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["elo_ci95"] == [None, None] and data["pair_elo_ci95"] == [None, None]


@pytest.mark.parametrize("wins,losses,draws,text", [
    (2, 0, 0, "95% interval: sample too small (2 games that all scored the same)"),
    (0, 0, 10, "95% interval: sample too small (10 games that all scored the same)"),   # not [+0.0, +0.0]
    (3, 1, 0, "95% interval: sample too small (4 games)"),                  # the upper bound was +inf
    (1, 0, 0, "95% interval: sample too small (1 game)"),
    (2, 0, 2, "95% interval [+3.5, +919.5]"),
    (7, 3, 20, "95% interval [-23.6, +120.8]"),
])
def test_the_summary_prints_an_interval_only_where_it_means_something(wins, losses, draws, text):
    def game(index, score):
        result = {1.0: "1-0", 0.5: "1/2-1/2", 0.0: "0-1"}[score]
        return m.GameRecord(index=index, opening=None, engine1_white=True, white="a", black="b",
                            result=result, termination="normal", reason="")

    scores = [1.0] * wins + [0.0] * losses + [0.5] * draws
    result = m.MatchResult(config=_config("a", "b", games=len(scores)), names=("a", "b"),
                           games=[game(i, x) for i, x in enumerate(scores)], stats=(m.EngineStats(), m.EngineStats()),
                           options=({}, {}), seconds=1.0, seed=7, abandoned=0, notes=[])
    line = next(line for line in m.format_summary(result).splitlines() if line.startswith("Elo difference"))
    assert text in line, line
    assert "inf]" not in line


# Answers the handshake at once, without a Python start-up that a loaded machine can stretch past the
# timeout (the fake engine did, once, in a clean-clone make test: engine1 was named instead of engine2).
INSTANT_HANDSHAKE = ("sh -c 'while read -r line; do case \"$line\" in uci) echo uciok;; "
                     "isready) echo readyok;; quit) exit 0;; esac; done'")


def test_an_engine_that_never_answers_uci_stops_the_match_with_a_clear_error(capsys):
    # `cat` echoes `uci` back and never says `uciok`.
    argv = ["match", "--engine1", INSTANT_HANDSHAKE, "--engine2", "cat", "--games", "2", "--handshake-timeout", "3"]
    assert cli.main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("cyzero match: engine2: 'cat' did not answer `uci` with `uciok` within 3 s")
    assert captured.err.count("\n") == 1, captured.err
    assert cli.main(["match", "--engine2", "cat", "--handshake-timeout", "0"]) == 2
    assert "--handshake-timeout must be above 0" in capsys.readouterr().err


def test_cli_errors_are_one_line_and_status_2(fake, capsys):
    cases = [
        (["--engine1", "/nonexistent/engine", "--engine2", fake("random")], "cannot start"),
        (["--engine1", fake("random"), "--engine2", fake("random"), "--engine2-option", "Hash"], "NAME=VALUE"),
        (["--engine1", fake("random"), "--engine2", fake("random"), "--tc", "soon"], "time control"),
        (["--engine1", fake("random")], "--engine2"),
        (["--engine1", fake("random"), "--engine2", fake("random"), "--games", "0"], "--games"),
        (["--engine1", fake("crash"), "--engine2", "'unclosed"], "cannot parse"),
    ]
    for argv, message in cases:
        assert cli.main(["match", *argv]) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("cyzero match: ") and message in err, err


# --------------------------------------------------------------------------- matches under an SPRT


def _pairs_to_decide(counts_of, elo0, elo1, bound):
    """The fewest finished pairs for which the LLR of ``counts_of(n)`` reaches ``bound`` (its sign says which way)."""
    return next(n for n in range(1, 1000)
                if (sprt.llr_pentanomial(counts_of(n), elo0, elo1) - bound) * math.copysign(1, bound) >= 0)


@pytest.mark.parametrize("concurrency", [1, 2])
@pytest.mark.parametrize("engine1_wins", [True, False], ids=["H1", "H0"])
def test_an_sprt_stops_the_match_as_soon_as_it_decides(fake, tmp_path, engine1_wins, concurrency):
    # The random mover beats the illegal mover in every game (every pair scores 2 or 0), so with
    # [0, 200] the test must decide at the first pair count whose LLR leaves the bounds.
    strong, weak = fake("random"), fake("illegal")
    test = sprt.Sprt(0.0, 200.0)
    lower, upper = test.bounds
    if engine1_wins:
        n = _pairs_to_decide(lambda k: (0, 0, 0, 0, k), 0.0, 200.0, upper)
        e1, e2, decision = strong, weak, "H1"
    else:
        n = _pairs_to_decide(lambda k: (k, 0, 0, 0, 0), 0.0, 200.0, lower)
        e1, e2, decision = weak, strong, "H0"
    assert 3 <= n <= 10   # so that the match below stops long before its 60 games
    pgn = tmp_path / "out.pgn"
    lines = []
    result = m.run_match(_config(e1, e2, games=60, concurrency=concurrency, sprt=test, pgn_path=str(pgn)), lines.append)
    s = m.summary(result)
    state = s["sprt"]
    assert state["decision"] == decision and state["pairs"] == n
    assert state["llr"] == sprt.llr_pentanomial(s["pentanomial"], 0.0, 200.0)
    assert (state["lower"], state["upper"]) == (lower, upper) and (state["elo0"], state["elo1"]) == (0.0, 200.0)
    assert s["pentanomial"] == ([0, 0, 0, 0, n] if engine1_wins else [n, 0, 0, 0, 0])
    if concurrency == 1:
        assert (s["games"], s["games_abandoned"]) == (2 * n, 0)
    else:
        # the other worker's game is under way (abandoned) or has just finished without its pair
        assert 2 * n <= s["games"] <= 2 * n + 1 and s["games_abandoned"] <= 1
    assert len(result.games) == s["games"] and len(_read_pgn(pgn)) == s["games"]
    assert sum(1 for line in lines if re.match(r"\[ ?\d+/60\] game", line)) == s["games"]
    assert any(line.startswith(f"SPRT: {decision} accepted after {s['games']} of 60 games") for line in lines)
    text = m.format_summary(result)
    assert f"{decision} accepted" in text and f"{s['games']} of 60 games played" in text


def test_games_still_bound_an_sprt_match_and_it_says_inconclusive(fake, capsys):
    # One side wins every game, but [0, 10] needs far more than two pairs and a half to decide.
    argv = ["match", "--engine1", fake("random"), "--engine2", fake("illegal"), "--games", "5", "--tc", "2+0",
            "--sprt", "0,10", "--sprt-alpha", "0.1", "--sprt-beta", "0.2", "--seed", "1", "--json"]
    assert cli.main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["games"], data["games_abandoned"], data["wins"]) == (5, 0, 5)
    state = data["sprt"]
    assert state["decision"] == "inconclusive" and state["pairs"] == 2   # the fifth game has no pair
    assert state["llr"] == pytest.approx(sprt.llr_pentanomial((0, 0, 0, 0, 2), 0.0, 10.0))
    assert (state["lower"], state["upper"]) == pytest.approx((math.log(0.2 / 0.9), math.log(0.8 / 0.1)))
    assert (state["elo0"], state["elo1"], state["alpha"], state["beta"]) == (0.0, 10.0, 0.1, 0.2)
    assert state["lower"] < state["llr"] < state["upper"]
    # and the table says so
    assert cli.main(argv[:-1]) == 0
    out = capsys.readouterr().out
    assert re.search(r"SPRT \[\+0\.0, \+10\.0\] \(alpha 0\.1, beta 0\.2\), pentanomial over 2 pairs: LLR \+\d\.\d\d "
                     r"in \[-1\.50, \+2\.08\]: inconclusive \(5 of 5 games played\)", out), out


def test_without_sprt_the_json_says_so(fake, capsys):
    argv = ["match", "--engine1", fake("random"), "--engine2", fake("illegal"), "--games", "2", "--tc", "2+0", "--json"]
    assert cli.main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["sprt"] is None and data["games_abandoned"] == 0


@pytest.mark.parametrize("args, message", [
    (["--sprt", "5"], "argument --sprt: expected ELO0,ELO1"),
    (["--sprt", "10,0"], "argument --sprt: ELO1 must be above ELO0"),
    (["--sprt", "0,10,20"], "argument --sprt: expected ELO0,ELO1"),
    (["--sprt", "0,10", "--sprt-alpha", "0"], "argument --sprt-alpha: must be a probability above 0 and below 0.5"),
    (["--sprt", "0,10", "--sprt-beta", "x"], "argument --sprt-beta: must be a probability"),
])
def test_bad_sprt_arguments_are_argparse_errors(fake, capsys, args, message):
    with pytest.raises(SystemExit) as info:
        cli.main(["match", "--engine1", fake("random"), "--engine2", fake("random"), *args])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "usage:" in err and message in err, err


def test_sprt_rates_need_sprt(fake, capsys):
    argv = ["match", "--engine1", fake("random"), "--engine2", fake("random"), "--sprt-alpha", "0.1"]
    assert cli.main(argv) == 2
    assert capsys.readouterr().err == "cyzero match: --sprt-alpha and --sprt-beta need --sprt ELO0,ELO1\n"


# --------------------------------------------------------------------------- stockfish


@needs_stockfish
def test_stockfish_at_its_lowest_elo_beats_the_random_mover_cleanly(fake, capsys):
    argv = ["match", "--engine1", fake("random"), "--stockfish-elo", "0", "--games", "2", "--tc", "1+0.05"]
    argv += ["--engine2-option", "Move Overhead=50", "--concurrency", "2", "--adjudicate-moves", "150", "--json"]
    assert cli.main(argv) == 0
    captured = capsys.readouterr()
    data = json.loads(captured.out)
    sf = data["engine2"]
    assert sf["name"].startswith("Stockfish")
    assert sf["options"]["UCI_LimitStrength"] is True
    assert "UCI_Elo" in sf["options"] and sf["options"]["UCI_Elo"] >= 1320  # clamped up from 0
    assert "using" in captured.err and "UCI_Elo" in captured.err
    assert data["games"] == 2 and data["wins"] == 0  # the random mover never beats it
    for key in ("time_forfeits", "illegal_moves", "crashes", "disconnects"):
        assert sf[key] == 0, key


# --------------------------------------------------------------------------- per-engine nodes

GO_LOGGER = textwrap.dedent(
    r'''
    """A random mover that appends every `go` line it gets to the file argv[1]."""
    import random, sys
    import chess

    log = open(sys.argv[1], "a", encoding="utf-8")
    board = chess.Board()
    rng = random.Random(1)
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        if words[0] == "uci":
            print("id name go-logger\nuciok", flush=True)
        elif words[0] == "isready":
            print("readyok", flush=True)
        elif words[0] == "position":
            fen = " ".join(words[2:words.index("moves") if "moves" in words else None])
            board = chess.Board() if words[1] == "startpos" else chess.Board(fen)
            for uci in words[words.index("moves") + 1:] if "moves" in words else []:
                board.push_uci(uci)
        elif words[0] == "go":
            log.write(line.strip() + "\n")
            log.flush()
            print(f"bestmove {rng.choice(list(board.legal_moves)).uci()}", flush=True)
        elif words[0] == "quit":
            break
    '''
)


@pytest.fixture
def go_logger(tmp_path):
    """go_logger(name) -> (engine command, path of the file its `go` lines go to)."""
    script = tmp_path / "go_logger.py"
    script.write_text(GO_LOGGER)

    def command(name):
        log = tmp_path / f"{name}.log"
        return " ".join(shlex.quote(a) for a in (sys.executable, str(script), str(log))), log

    return command


@pytest.fixture
def start_only(tmp_path):
    """An openings file of the start position alone: a game with --adjudicate-moves N is N moves each."""
    path = tmp_path / "start.epd"
    path.write_text(chess.STARTING_FEN + "\n")
    return str(path)


def _go_lines(log):
    lines = log.read_text().splitlines()
    assert lines, "the engine got no go"
    return lines


def test_an_engine_with_its_own_nodes_gets_them_with_the_clock(go_logger, start_only, tmp_path, capsys):
    (e1, log1), (e2, log2) = go_logger("one"), go_logger("two")
    pgn = tmp_path / "out.pgn"
    argv = ["match", "--engine1", e1, "--engine2", e2, "--engine1-nodes", "1", "--games", "2", "--tc", "30+0.5",
            "--adjudicate-moves", "5", "--openings", start_only, "--pgn", str(pgn), "--json"]
    assert cli.main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    # cutechess-cli's form: the clock as for any engine, and `nodes N` after it.
    for line in _go_lines(log1):
        assert re.fullmatch(r"go wtime \d+ btime \d+ winc 500 binc 500 nodes 1", line), line
    for line in _go_lines(log2):
        assert re.fullmatch(r"go wtime \d+ btime \d+ winc 500 binc 500", line), line
    assert (data["engine1"]["nodes"], data["engine1"]["limit"]) == (1, "30+0.5, nodes=1")
    assert (data["engine2"]["nodes"], data["engine2"]["limit"]) == (None, "30+0.5")
    assert data["time_control"] == "30+0.5" and data["games"] == 2
    for game, engine1_white in zip(_read_pgn(pgn), (True, False)):
        h = game.headers
        assert h["TimeControl"] == "30+0.5"
        own, other = ("White", "Black") if engine1_white else ("Black", "White")
        assert (h[f"{own}SearchLimit"], h[f"{other}SearchLimit"]) == ("30+0.5, nodes=1", "30+0.5"), h
    assert cli.main(argv[:-1]) == 0
    assert "\nlimits: go-logger (nodes=1) 30+0.5, nodes=1; go-logger 30+0.5\n" in capsys.readouterr().out


@pytest.mark.parametrize("limit, go1, go2", [
    (["--nodes", "5"], "go nodes 5", "go nodes 1"),            # its own nodes replace --nodes
    (["--movetime", "200"], "go movetime 200", "go nodes 1 movetime 200"),
])
def test_own_nodes_with_nodes_or_movetime(go_logger, start_only, capsys, limit, go1, go2):
    (e1, log1), (e2, log2) = go_logger("one"), go_logger("two")
    argv = ["match", "--engine1", e1, "--engine2", e2, "--engine2-nodes", "1", "--games", "1",
            "--adjudicate-moves", "3", "--openings", start_only, "--json", *limit]
    assert cli.main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    assert set(_go_lines(log1)) == {go1} and set(_go_lines(log2)) == {go2}
    assert data["engine2"]["nodes"] == 1 and data["engine1"]["nodes"] is None


@pytest.mark.parametrize("value", ["0", "-3", "1.5", "many"])
@pytest.mark.parametrize("n", [1, 2])
def test_bad_engine_nodes_are_argparse_errors(fake, capsys, n, value):
    with pytest.raises(SystemExit) as info:
        cli.main(["match", "--engine1", fake("random"), "--engine2", fake("random"), f"--engine{n}-nodes", value])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "usage:" in err and f"argument --engine{n}-nodes: must be a whole number of nodes, 1 or more" in err, err


def test_cyzero_at_one_node_plays_a_real_game_on_a_clock(capsys):
    """As a Maia would play on lichess: cyzero at one node per move against another engine's clock."""
    random_mover = f"{shlex.quote(sys.executable)} -m engine.tools.random_mover --seed 3"
    argv = ["match", "--engine1-option", "Backend=cpu", "--engine1-nodes", "1", "--engine2", random_mover,
            "--games", "1", "--tc", "60+1", "--adjudicate-moves", "40", "--seed", "2", "--json"]
    assert cli.main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["games"] == 1 and data["engine1"]["limit"] == "60+1, nodes=1"
    # the summary's speed: cyzero's nodes a move as it reported them, none from the random mover
    assert 1 <= data["engine1"]["median_move_nodes"] <= 2 and data["engine2"]["median_move_nodes"] is None
    assert abs(data["engine1"]["moves"] - data["engine2"]["moves"]) <= 1 and data["engine1"]["moves"] > 0
    for engine in ("engine1", "engine2"):
        for key in ("time_forfeits", "illegal_moves", "crashes", "disconnects"):
            assert data[engine][key] == 0, (engine, key)
