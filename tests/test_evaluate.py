"""`cyzero-train evaluate`, the strength ladder: the random mover's UCI, the rating fit against the
outcomes it was drawn from, which anchors a generation plays, real matches written to
evaluation.jsonl and ratings.json (and skipped when there), --follow beside a run, the elo.png chart
and the status line."""

from __future__ import annotations

import fcntl
import io
import json
import math
import os
import sys
import random
import threading
import time

import chess
import chess.engine
import pytest

pytest.importorskip("torch", reason="the trainer needs the train extra (pip install 'cyzero[train]')")

from engine.tools import match as m  # noqa: E402
from engine.tools.random_mover import RandomMover  # noqa: E402
from trainer import evaluate as ev  # noqa: E402
from trainer.config import LadderConfig  # noqa: E402
from trainer.cli import main  # noqa: E402
from trainer.rundir import EVALUATION_LOCK, lock_path, read_evaluations, read_ratings  # noqa: E402

pytestmark = pytest.mark.timeout(240)

RANDOM_MOVER = [sys.executable, "-m", "engine.tools.random_mover"]


# --------------------------------------------------------------------------- the random mover


def test_the_random_mover_plays_a_whole_game_through_python_chess():
    engine = chess.engine.SimpleEngine.popen_uci(RANDOM_MOVER + ["--seed", "7"])
    try:
        assert engine.id["name"] == "cyzero-random" and "Seed" in engine.options
        board = chess.Board("r3k2r/pppq1ppp/2n2n2/3pp3/3PP3/2N2N2/PPPQ1PPP/R3K2R w KQkq - 0 8")
        while not board.is_game_over(claim_draw=True) and len(board.move_stack) < 400:
            move = engine.play(board, chess.engine.Limit(nodes=3)).move
            assert move in board.legal_moves
            board.push(move)
        assert len(board.move_stack) > 10
        # `go infinite` holds the move back until `stop` (python-chess's analysis sends both)
        with engine.analysis(chess.Board()) as analysis:
            analysis.stop()
            assert analysis.wait().move in chess.Board().legal_moves
    finally:
        engine.quit()


def _lines(engine: RandomMover, out: io.StringIO, *commands: str) -> list[str]:
    out.seek(0)
    out.truncate()
    for command in commands:
        assert engine.handle(command)
    return out.getvalue().splitlines()


def test_the_random_mover_protocol_details():
    out = io.StringIO()
    engine = RandomMover(seed=1, out=out)
    assert _lines(engine, out, "isready") == ["readyok"]
    # a position with moves, and a mate: no legal move is `bestmove 0000`
    fools_mate = "position startpos moves f2f3 e7e5 g2g4 d8h4"
    assert _lines(engine, out, fools_mate, "go wtime 1000 btime 1000") == ["bestmove 0000"]
    fen = "7k/8/8/8/8/8/8/K6R b - - 0 1"
    legal = {"bestmove " + move.uci() for move in chess.Board(fen).legal_moves}
    assert _lines(engine, out, f"position fen {fen}", "go depth 3")[0] in legal
    # a bad position is reported and the previous one kept
    assert _lines(engine, out, "position startpos moves e2e5")[0].startswith("info string bad position")
    assert _lines(engine, out, "go ponder") == []  # held back until ponderhit
    assert _lines(engine, out, "ponderhit")[0] in legal
    assert _lines(engine, out, "go infinite", "ponderhit") == []
    assert len(_lines(engine, out, "stop")) == 1 and _lines(engine, out, "stop") == []
    # the same Seed plays the same moves; the stream runs on across games
    moves = []
    for _ in range(2):
        _lines(engine, out, "setoption name Seed value 42", "ucinewgame", "position startpos")
        moves.append([_lines(engine, out, "go nodes 1")[0] for _ in range(5)])
    assert moves[0] == moves[1] and len(set(moves[0])) > 1
    assert _lines(engine, out, "setoption name Seed value x")[0].startswith("info string Seed must be")
    assert not engine.handle("quit")


# --------------------------------------------------------------------------- choosing generations


def _run_with(tmp_path, generations, networks=None) -> str:
    run = tmp_path / "run"
    (run / "networks").mkdir(parents=True)
    lines = []
    for g in generations:
        path = run / "networks" / f"gen-{g:05d}.onnx"
        if networks is None:
            path.write_bytes(b"")
        else:
            path.write_bytes(open(networks[g], "rb").read())
        lines.append(json.dumps({"generation": g, "step": 10 * g, "onnx": f"networks/gen-{g:05d}.onnx",
                                 "sha256": "ab" * 32, "time": 1000.0 + 1800.0 * g}))
    (run / "generations.jsonl").write_text("\n".join(lines) + "\nnot json\n")
    return str(run)


def test_every_kth_generation_and_the_newest_whose_network_is_there(tmp_path):
    run = _run_with(tmp_path, range(8))
    os.remove(os.path.join(run, "networks", "gen-00004.onnx"))  # retention removed it
    assert [g for g, _ in ev.generations_to_evaluate(run, 3)] == [0, 3, 6, 7]
    assert [g for g, _ in ev.generations_to_evaluate(run, 2)] == [0, 2, 6, 7]
    assert ev.generations_to_evaluate(run, 1)[1] == (1, os.path.join(run, "networks", "gen-00001.onnx"))
    with pytest.raises(ValueError, match="--every must be 1 or more"):
        ev.generations_to_evaluate(run, 0)


def test_bad_input_is_one_clear_error(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["evaluate", str(tmp_path / "empty"), "--stockfish", ""]) == 2
    assert "has no generation with its network yet" in capsys.readouterr().err
    run = _run_with(tmp_path, [0, 1])
    assert main(["evaluate", run, "--games", "0"]) == 2
    assert "--games must be 1 or more" in capsys.readouterr().err
    assert main(["evaluate", run, "--games", "3"]) == 2
    assert "--games must be even" in capsys.readouterr().err
    assert main(["evaluate", run, "--stockfish", "/no/such/stockfish"]) == 1
    assert "/no/such/stockfish not found" in capsys.readouterr().err
    with open(lock_path(run, EVALUATION_LOCK), "w") as f:  # an evaluation under way holds the lock
        fcntl.flock(f, fcntl.LOCK_EX)
        with pytest.raises(ValueError, match="another `cyzero-train evaluate` is running"):
            ev.evaluate_run(run, cfg=LadderConfig(nodes=2, games=2, stockfish=""))


# --------------------------------------------------------------------------- the fit


def _games(true: dict, pairs, n: int, rng: random.Random) -> list[dict]:
    """Match lines with outcomes drawn from the logistic model at the ``true`` ratings: the expected
    score is the model's, with draws p(1 - p) of the games."""
    lines = []
    for a, b in pairs:
        p = 1.0 / (1.0 + 10 ** ((true[b] - true[a]) / 400.0))
        draws = p * (1 - p)
        w = d = l = 0
        for _ in range(n):
            u = rng.random()
            if u < p - draws / 2:
                w += 1
            elif u < p + draws / 2:
                d += 1
            else:
                l += 1
        lines.append({"generation": int(a[3:]), "opponent": b, "wins": w, "draws": d, "losses": l})
    return lines


def test_the_fit_finds_the_ratings_the_games_were_drawn_from():
    true = {"random": 0.0, "gen0": 20.0, "gen1": 250.0, "gen2": 480.0, "gen3": 700.0, "sf-skill0": 900.0}
    pairs = [("gen0", "random"), ("gen1", "gen0"), ("gen1", "random"), ("gen2", "gen1"), ("gen2", "random"),
             ("gen3", "gen2"), ("gen3", "sf-skill0"), ("gen2", "sf-skill0")]
    fitted = ev.fit_ratings(_games(true, pairs, 400, random.Random(7)), prior_draws=0.0)
    assert fitted["random"] == {"elo": 0.0, "low": 0.0, "high": 0.0, "games": 1200}
    inside = [name for name in true if fitted[name]["low"] <= true[name] <= fitted[name]["high"]]
    assert len(inside) >= 5, fitted           # 95% intervals: one miss in six may happen
    assert all(abs(fitted[name]["elo"] - true[name]) < 80 for name in true), fitted
    # more games, narrower intervals
    fewer = ev.fit_ratings(_games(true, pairs, 40, random.Random(7)), prior_draws=0.0)
    assert fewer["gen3"]["high"] - fewer["gen3"]["low"] > 2.5 * (fitted["gen3"]["high"] - fitted["gen3"]["low"])


def test_one_pairing_is_the_match_elo_and_a_clean_sweep_stays_finite():
    line = {"generation": 0, "opponent": "random", "wins": 12, "draws": 5, "losses": 3}
    fitted = ev.fit_ratings([line], prior_draws=0.0)
    assert fitted["gen0"]["elo"] == pytest.approx(m.elo_from_score((12 + 2.5) / 20), abs=0.01)
    sweep = ev.fit_ratings([{"generation": 0, "opponent": "random", "wins": 20, "draws": 0, "losses": 0}])
    assert sweep["gen0"]["elo"] == pytest.approx(m.elo_from_score(20.5 / 21), abs=0.01)   # one virtual draw
    assert math.isfinite(sweep["gen0"]["high"]) and sweep["gen0"]["low"] > 0
    # a player with no games leading to the anchor is left out, not given a made-up rating
    lone = ev.fit_ratings([line, {"generation": 5, "opponent": "sf-skill3", "wins": 1, "draws": 0, "losses": 1}])
    assert set(lone) == {"random", "gen0"}
    assert ev.fit_ratings([]) == {}


def test_a_generation_plays_its_predecessor_and_the_anchors_near_it():
    cfg = LadderConfig(window=600.0, stockfish_levels="0,3,6")
    assert ev.choose_opponents(0, {}, set(), {0}, cfg) == ["random", "sf-skill0"]
    rated = {"random": {"elo": 0.0}, "gen0": {"elo": 10.0}}
    assert ev.choose_opponents(1, rated, set(), {0, 1}, cfg) == ["gen0", "random", "sf-skill0"]
    # far above the random mover and generation 0, near Stockfish skill 0; skill 3 is still out of reach
    rated = {"random": {"elo": 0.0}, "gen0": {"elo": 10.0}, "gen4": {"elo": 900.0}, "sf-skill0": {"elo": 1300.0}}
    assert ev.choose_opponents(7, rated, set(), {0, 4, 7}, cfg) == ["gen4", "sf-skill0"]
    # within half a window of the strongest level rated: the next one is tried
    rated["gen4"]["elo"] = 1000.0
    assert ev.choose_opponents(7, rated, {"gen4"}, {0, 4, 7}, cfg) == ["sf-skill0", "sf-skill3"]
    assert ev.choose_opponents(7, rated, set(), {0, 4, 7}, LadderConfig(stockfish="")) == ["gen4"]


# --------------------------------------------------------------------------- real matches


@pytest.fixture(scope="module")
def tiny_nets(tmp_path_factory):
    from trainer.export import export_onnx
    from trainer.model import build_net

    folder = tmp_path_factory.mktemp("nets")
    paths = {}
    for g in (0, 1, 2, 3):
        path = folder / f"net{g}.onnx"
        export_onnx(build_net("1x8", seed=g + 1), path, check_positions=16)
        paths[g] = str(path)
    return paths


TINY = LadderConfig(nodes=2, games=2, stockfish="", window=10_000.0)


def test_evaluate_writes_a_line_per_match_and_the_ratings_and_resumes(tiny_nets, tmp_path, capsys):
    run = _run_with(tmp_path, [0, 1, 2], tiny_nets)
    (tmp_path / "run" / "config.toml").write_text('[ladder]\nnodes = 2\ngames = 2\nstockfish = ""\nwindow = 10000.0\n')
    assert main(["evaluate", run, "--every", "2"]) == 0
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    lines = read_evaluations(run)
    expected = [(0, "random"), (2, "gen0"), (2, "random")]
    assert [(r["generation"], r["opponent"]) for r in lines] == expected == [(r["generation"], r["opponent"])
                                                                             for r in printed]
    for r in lines:
        assert r["games"] == 2 == r["wins"] + r["draws"] + r["losses"]
        assert r["nodes"] == 2 and r["time"] > 0
        stats = m.score_stats(r["wins"], r["losses"], r["draws"])
        assert r["score"] == pytest.approx(stats.score)
        assert r["elo"] == (pytest.approx(stats.elo) if math.isfinite(stats.elo) else None)
    with open(os.path.join(run, ev.EVALUATION_FILE), encoding="utf-8") as f:
        raw = [json.loads(line) for line in f]
    assert set(raw[0]) == {"generation", "opponent", "wins", "draws", "losses", "games", "score", "elo",
                           "elo_error", "nodes", "time"}
    ratings = json.loads(open(os.path.join(run, ev.RATINGS_FILE), encoding="utf-8").read())
    assert ratings["nodes"] == 2 and ratings["anchor"] == "random"
    assert ratings["players"] == ev.fit_ratings(lines)
    assert [(c["generation"], c["hours"]) for c in ratings["generations"]] == [(0, 0.0), (2, 1.0)]

    # garbage another writer may leave is skipped; what is there is not played again
    with open(os.path.join(run, ev.EVALUATION_FILE), "a", encoding="utf-8") as f:
        f.write('{"generation": 1, "opponent": "gen0"}\n'  # incomplete
                '{"generation": 1, "opponent": "stockfish", "wins": 1, "draws": 0, "losses": 0, "games": 1, '
                '"nodes": 2}\n[1, 2]\n\xff\xfe garbage\n{"generation": 2, "opp')
    assert len(read_evaluations(run)) == 3
    before = open(os.path.join(run, ev.EVALUATION_FILE), "rb").read()
    assert ev.evaluate_run(run, every=2, cfg=TINY, log=lambda line: None) == []
    assert open(os.path.join(run, ev.EVALUATION_FILE), "rb").read() == before


def test_stockfish_at_a_skill_level_is_an_anchor(tiny_nets, tmp_path):
    try:
        m.stockfish_command()
    except m.MatchError:
        pytest.skip("needs Debian's stockfish (apt-get install stockfish; .ci/run installs it)")
    run = _run_with(tmp_path, [0], tiny_nets)
    cfg = LadderConfig(nodes=2, games=2, stockfish="stockfish", stockfish_levels="0", stockfish_nodes=50)
    lines = ev.evaluate_run(run, cfg=cfg, log=lambda line: None)
    assert [(r["generation"], r["opponent"]) for r in lines] == [(0, "random"), (0, "sf-skill0")]
    ratings = read_ratings(run)
    assert set(ratings["anchors"]) == {"random", "sf-skill0"}
    # a random 1x8 at 2 nodes does not beat Stockfish: skill 0 rates above it
    assert ratings["anchors"]["sf-skill0"]["elo"] > ratings["generations"][0]["elo"]


def test_follow_rates_each_new_generation_as_the_run_exports_it(tiny_nets, tmp_path, monkeypatch):
    monkeypatch.setattr(ev, "FOLLOW_POLL_S", 0.1)
    run = _run_with(tmp_path, [0, 1, 2], tiny_nets)
    stop, lines, errors = threading.Event(), [], []

    def follow():
        try:
            ev.evaluate_run(run, cfg=TINY, follow=True, stop=stop, log=lines.append)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    thread = threading.Thread(target=follow)
    thread.start()
    try:
        deadline = time.monotonic() + 120
        rated = lambda: {r["generation"] for r in read_evaluations(run)}  # noqa: E731
        while rated() != {0, 2} and time.monotonic() < deadline and not errors:
            time.sleep(0.2)
        assert rated() == {0, 2}, (lines, errors)        # generation 0 first, then the newest: 1 skipped
        assert any("skipping 1 older unrated ones (1-1)" in line for line in lines)
        with open(os.path.join(run, "networks", "gen-00003.onnx"), "wb") as f:
            f.write(open(tiny_nets[3], "rb").read())
        with open(os.path.join(run, "generations.jsonl"), "a", encoding="utf-8") as f:
            f.write(json.dumps({"generation": 3, "step": 30, "onnx": "networks/gen-00003.onnx", "time": 2.0}) + "\n")
        opponents = lambda: {r["opponent"] for r in read_evaluations(run) if r["generation"] == 3}  # noqa: E731
        while len(opponents()) < 3 and time.monotonic() < deadline and not errors:
            time.sleep(0.2)
        assert opponents() == {"gen2", "gen0", "random"}, (lines, errors)   # its predecessor, then the anchors
    finally:
        stop.set()
        thread.join(60)
    assert not thread.is_alive() and not errors


# --------------------------------------------------------------------------- what a person reads


def _line(generation, opponent, w, d, l, nodes=2, when=None):
    stats = m.score_stats(w, l, d)
    elo = stats.elo if math.isfinite(stats.elo) else None
    error = ((stats.elo_high - stats.elo_low) / 2 if math.isfinite(stats.elo_high) and math.isfinite(stats.elo_low)
             else None)
    return {"generation": generation, "opponent": opponent, "wins": w, "draws": d, "losses": l, "games": w + d + l,
            "score": stats.score, "elo": elo, "elo_error": error, "nodes": nodes, "time": when or time.time()}


def _write_evaluations(run: str, lines: list[dict]) -> None:
    with open(os.path.join(run, ev.EVALUATION_FILE), "w", encoding="utf-8") as f:
        for line in lines:
            f.write(json.dumps(line) + "\n")
        f.write("garbage\n")
    ev.write_ratings(run, nodes=2)


LADDER = [_line(0, "random", 2, 4, 2), _line(1, "gen0", 5, 2, 1), _line(1, "random", 6, 2, 0),
          _line(3, "gen1", 6, 2, 0), _line(3, "random", 8, 0, 0), _line(3, "sf-skill0", 1, 1, 6)]


def test_plot_draws_elo_png_from_the_ladder(tmp_path, capsys):
    pytest.importorskip("matplotlib", reason="plots need matplotlib (the train extra)")
    run = _run_with(tmp_path, [0, 1, 2, 3])
    (tmp_path / "run" / "evaluation.jsonl").write_text("garbage\n")
    assert main(["plot", run]) == 2  # nothing to plot: no metrics, no gates, no rating
    capsys.readouterr()
    _write_evaluations(run, LADDER)
    assert main(["plot", run]) == 0
    written = capsys.readouterr().out.split()
    assert [os.path.basename(p) for p in written] == ["elo.png"]
    with open(written[0], "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_status_shows_the_ladder_and_the_newest_matches(tmp_path, capsys):
    from trainer.report import format_status, run_status

    run = _run_with(tmp_path, [0, 1, 2, 3])
    now = time.time()
    _write_evaluations(run, LADDER[:5] + [_line(3, "sf-skill0", 1, 1, 6, when=now - 60)])
    status = run_status(run)
    assert [(r["generation"], r["opponent"]) for r in status["evaluation"]] == [
        (3, "gen1"), (3, "random"), (3, "sf-skill0")]
    fitted = ev.fit_ratings(read_evaluations(run))
    text = format_status(status, now=now)
    ladder = next(line for line in text.splitlines() if line.startswith("  ladder"))
    g3, g0, sf = fitted["gen3"], fitted["gen0"], fitted["sf-skill0"]
    assert ladder == (f"  ladder      generation 3: Elo {g3['elo']:+,.0f} [{g3['low']:+,.0f}, {g3['high']:+,.0f}] at 2 "
                      f"nodes, the random mover at 0, {g3['elo'] - g0['elo']:+,.0f} over generation 0 (1.5 h and 0 "
                      f"self-play games into the run); anchors Stockfish skill 0 {sf['elo']:+,.0f}")
    line = next(line for line in text.splitlines() if line.startswith("  evaluation"))
    assert line.startswith("  evaluation  generation 3 at 2 nodes: vs gen1 Elo ") and line.endswith(" ago")
    assert main(["status", run, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ratings"]["generations"][-1]["generation"] == 3
    os.remove(os.path.join(run, ev.EVALUATION_FILE))
    os.remove(os.path.join(run, ev.RATINGS_FILE))
    assert run_status(run)["evaluation"] is None and run_status(run)["ratings"] is None
    assert "  ladder " not in format_status(run_status(run))
