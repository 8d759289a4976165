"""`cyzero-train evaluate`: the random mover's UCI, generations against generation 0 and the random
mover written to evaluation.jsonl (and skipped when there), the elo.png chart and the status line."""

from __future__ import annotations

import fcntl
import io
import json
import math
import os
import sys
import time

import chess
import chess.engine
import pytest

pytest.importorskip("torch", reason="the trainer needs the train extra (pip install 'cyzero[train]')")

from engine.tools import match as m  # noqa: E402
from engine.tools.random_mover import RandomMover  # noqa: E402
from trainer import evaluate as ev  # noqa: E402
from trainer.cli import main  # noqa: E402

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
                                 "sha256": "ab" * 32, "time": 1.0}))
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
    assert main(["evaluate", str(tmp_path / "empty")]) == 2
    assert "has no generation with its network yet" in capsys.readouterr().err
    run = _run_with(tmp_path, [0, 1])
    assert main(["evaluate", run, "--games", "0"]) == 2
    assert "--games must be 1 or more" in capsys.readouterr().err
    with open(os.path.join(run, ev.LOCK_FILE), "w") as f:  # an evaluation under way holds the lock
        fcntl.flock(f, fcntl.LOCK_EX)
        with pytest.raises(ValueError, match="another `cyzero-train evaluate` is running"):
            ev.evaluate_run(run, nodes=2, games=2)


# --------------------------------------------------------------------------- real matches


@pytest.fixture(scope="module")
def tiny_nets(tmp_path_factory):
    from trainer.export import export_onnx
    from trainer.model import build_net

    folder = tmp_path_factory.mktemp("nets")
    paths = {}
    for g in (0, 1, 2):
        path = folder / f"net{g}.onnx"
        export_onnx(build_net("1x8", seed=g + 1), path, check_positions=16)
        paths[g] = str(path)
    return paths


def test_evaluate_writes_a_line_per_generation_and_opponent_and_resumes(tiny_nets, tmp_path, capsys):
    run = _run_with(tmp_path, [0, 1, 2], tiny_nets)
    assert main(["evaluate", run, "--every", "2", "--nodes", "2", "--games", "2"]) == 0
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    lines = ev.read_evaluations(run)
    assert [(r["generation"], r["opponent"]) for r in lines] == [(0, "random"), (2, "gen0"), (2, "random")]
    assert [(r["generation"], r["opponent"]) for r in printed] == [(0, "random"), (2, "gen0"), (2, "random")]
    for r in lines:
        assert r["games"] == 2 == r["wins"] + r["draws"] + r["losses"]
        assert r["nodes"] == 2 and r["time"] > 0
        stats = m.score_stats(r["wins"], r["losses"], r["draws"])
        assert r["score"] == pytest.approx(stats.score)
        assert r["elo"] == (pytest.approx(stats.elo) if math.isfinite(stats.elo) else None)
        if r["elo_error"] is not None:
            assert r["elo_error"] == pytest.approx((stats.elo_high - stats.elo_low) / 2)
    with open(os.path.join(run, ev.EVALUATION_FILE), encoding="utf-8") as f:
        raw = [json.loads(line) for line in f]
    assert set(raw[0]) == {"generation", "opponent", "wins", "draws", "losses", "games", "score", "elo",
                           "elo_error", "nodes", "time"}

    # garbage another writer may leave is skipped; what is there is not played again
    with open(os.path.join(run, ev.EVALUATION_FILE), "a", encoding="utf-8") as f:
        f.write('{"generation": 1, "opponent": "gen0"}\n'  # incomplete
                '{"generation": 1, "opponent": "stockfish", "wins": 1, "draws": 0, "losses": 0, "games": 1, '
                '"nodes": 2}\n[1, 2]\n\xff\xfe garbage\n{"generation": 2, "opp')
    assert len(ev.read_evaluations(run)) == 3
    before = open(os.path.join(run, ev.EVALUATION_FILE), "rb").read()
    assert ev.evaluate_run(run, every=2, nodes=2, games=2, log=lambda line: None) == []
    assert open(os.path.join(run, ev.EVALUATION_FILE), "rb").read() == before


# --------------------------------------------------------------------------- what a person reads


def _write_evaluations(run: str, lines: list[dict]) -> None:
    with open(os.path.join(run, ev.EVALUATION_FILE), "w", encoding="utf-8") as f:
        for line in lines:
            f.write(json.dumps(line) + "\n")
        f.write("garbage\n")


def _line(generation, opponent, w, d, l, nodes=2, when=None):
    stats = m.score_stats(w, l, d)
    elo = stats.elo if math.isfinite(stats.elo) else None
    error = ((stats.elo_high - stats.elo_low) / 2 if math.isfinite(stats.elo_high) and math.isfinite(stats.elo_low)
             else None)
    return {"generation": generation, "opponent": opponent, "wins": w, "draws": d, "losses": l, "games": w + d + l,
            "score": stats.score, "elo": elo, "elo_error": error, "nodes": nodes, "time": when or time.time()}


def test_plot_draws_elo_png_only_with_evaluations(tmp_path, capsys):
    pytest.importorskip("matplotlib", reason="plots need matplotlib (the train extra)")
    run = _run_with(tmp_path, [0, 1, 2, 3])
    (tmp_path / "run" / "evaluation.jsonl").write_text("garbage\n")
    assert main(["plot", run]) == 2  # nothing to plot: no metrics, no gates, no evaluation line
    capsys.readouterr()
    _write_evaluations(run, [_line(0, "random", 2, 4, 2), _line(1, "gen0", 5, 2, 1), _line(1, "random", 6, 2, 0),
                             _line(3, "gen0", 6, 2, 0), _line(3, "random", 8, 0, 0)])  # all won: a bound
    assert main(["plot", run]) == 0
    written = capsys.readouterr().out.split()
    assert [os.path.basename(p) for p in written] == ["elo.png"]
    with open(written[0], "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_status_shows_the_newest_evaluation(tmp_path, capsys):
    from trainer.report import format_status, run_status

    run = _run_with(tmp_path, [0, 1, 2])
    now = time.time()
    _write_evaluations(run, [_line(1, "gen0", 1, 1, 0, when=now - 600), _line(2, "gen0", 5, 2, 3, when=now - 120),
                             _line(2, "random", 4, 0, 0, when=now - 60)])
    status = run_status(run)
    assert [(r["generation"], r["opponent"]) for r in status["evaluation"]] == [(2, "gen0"), (2, "random")]
    text = format_status(status, now=now)
    line = next(line for line in text.splitlines() if line.startswith("  evaluation"))
    elo = m.score_stats(5, 3, 2)
    assert line == (f"  evaluation  generation 2 at 2 nodes: vs gen0 Elo {elo.elo:+.0f} ± "
                    f"{(elo.elo_high - elo.elo_low) / 2:.0f} (W/D/L 5/2/3), vs random all won (W/D/L 4/0/0), "
                    "1.0 min ago")
    assert main(["status", run, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["evaluation"][1]["wins"] == 4
    os.remove(os.path.join(run, ev.EVALUATION_FILE))
    assert run_status(run)["evaluation"] is None
    assert "evaluation" not in format_status(run_status(run))
