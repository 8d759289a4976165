"""``cyzero bench null`` (issue 47): the search's own cost on a network that costs nothing, beside
lc0's random backend. It runs, prints a row per batch and position, and reads lc0's figures from
lc0's own info lines: here a stand-in lc0 (a small script that speaks enough UCI) says what they
are. No timing is asserted: the rates depend on the machine and its load."""

from __future__ import annotations

import json
import os
import stat
import sys
import textwrap

import numpy as np
import pytest

from engine.tools import bench_null
from engine.tools.bench_common import BenchError
from engine.tools.bench_tree import TREE_POSITIONS
from uci import cli

pytestmark = pytest.mark.timeout(300)

STANDIN_NODES = 4321
STANDIN_NPS = 9876


@pytest.fixture
def standin_lc0(tmp_path):
    """An executable that answers as lc0 does (uciok, readyok, info lines, bestmove) and writes
    its command line and the commands it got to ``calls.jsonl``."""
    log = tmp_path / "calls.jsonl"
    script = tmp_path / "lc0"
    script.write_text(textwrap.dedent(f"""\
        #!{sys.executable}
        import json, sys, time
        got = []
        for line in sys.stdin:
            line = line.strip()
            got.append(line)
            if line == "uci":
                print("id name Lc0 stand-in")
                print("uciok", flush=True)
            elif line == "isready":
                print("readyok", flush=True)
            elif line.startswith("go"):
                time.sleep(int(line.split()[-1]) / 1000)
                print("info depth 1 seldepth 1 time 1 nodes 12 score cp 0 nps 12000 tbhits 0 pv e2e4")
                print("info string e2e4 (322) N: 7 (+ 0) (P: 10.0%)")
                print("info depth 3 seldepth 7 time 20 nodes {STANDIN_NODES} score cp 3 nps {STANDIN_NPS} "
                      "tbhits 0 pv e2e4 e7e5")
                print("bestmove e2e4 ponder e7e5", flush=True)
            elif line == "quit":
                break
        with open({str(log)!r}, "a") as f:
            f.write(json.dumps({{"argv": sys.argv[1:], "got": got}}) + "\\n")
        """))
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script, log


def test_null_network_is_fixed_and_shaped_as_lc0s_random_backend():
    net = bench_null.NullNetwork(16, seed=3)
    policy, wdl, mlh = net.evaluate(np.zeros((5, 112, 8, 8), np.float32))
    assert policy.shape == (5, 1858) and wdl.shape == (5, 3) and mlh is None
    assert policy.dtype == np.float32 and policy.min() >= 0.0 and policy.max() < 3.0
    assert np.allclose(wdl.sum(axis=1), 1.0, atol=1e-6) and wdl.min() >= 0.0
    again, _, _ = bench_null.NullNetwork(16, seed=3).evaluate(np.zeros((5, 112, 8, 8), np.float32))
    assert np.array_equal(policy, again)          # seeded
    assert np.shares_memory(policy, net.policy)   # sliced, not copied
    assert (net.calls, net.positions) == (1, 5)
    with pytest.raises(ValueError, match="holds 16 rows"):
        net.evaluate(np.zeros((17, 112, 8, 8), np.float32))


def test_parse_lc0_info_takes_the_last_line_with_nodes():
    lines = ["info depth 1 seldepth 1 time 3 nodes 5 nps 1666 pv e2e4",
             "info depth 2 seldepth 4 time 100 nodes 777 score cp 10 nps 7770 tbhits 0 pv d2d4",
             "info string d2d4 (293) N: 700",
             "bestmove d2d4"]
    assert bench_null.parse_lc0_info(lines) == {"nodes": 777, "nps": 7770, "time": 100}
    with pytest.raises(BenchError, match="no nodes"):
        bench_null.parse_lc0_info(["info string hello", "bestmove e2e4"])
    with pytest.raises(BenchError, match="not a number"):
        bench_null.parse_lc0_info(["info nodes many", "bestmove e2e4"])


def test_cyzero_alone_prints_a_row_per_batch_and_position(capsys, monkeypatch):
    monkeypatch.delenv(bench_null.LC0_ENV, raising=False)
    assert cli.main(["bench", "null", "--seconds", "0.05", "--batches", "8,32", "--positions", "2"]) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.split()[:1] in (["8"], ["32"])]
    assert [(r[0], r[1]) for r in rows] == [("8", "startpos"), ("8", "middlegame"),
                                            ("32", "startpos"), ("32", "middlegame")]
    assert all(len(r) == 6 for r in rows)    # no lc0 columns
    assert "total, MinibatchSize 8: cyzero" in out and "total, MinibatchSize 32: cyzero" in out
    assert "load average" in out and f"set {bench_null.LC0_ENV}" in out


def test_lc0_figures_come_from_its_info_lines(standin_lc0, capsys, monkeypatch):
    script, log = standin_lc0
    monkeypatch.setenv(bench_null.LC0_ENV, str(script))
    assert cli.main(["bench", "null", "--seconds", "0.05", "--batches", "8,16", "--positions", "1",
                     "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)   # --json: one object and nothing else
    assert summary["benchmark"] == "null" and summary["batches"] == [8, 16]
    assert summary["lc0"]["binary"] == str(script)
    assert [(r["batch"], r["name"]) for r in summary["rows"]] == [(8, "startpos"), (16, "startpos")]
    for row in summary["rows"]:
        lc0 = row["lc0"]
        assert lc0["nodes"] == STANDIN_NODES and lc0["lc0_nps"] == STANDIN_NPS and lc0["lc0_time_ms"] == 20
        assert lc0["seconds"] > 0 and row["lc0_nodes_per_s"] == pytest.approx(STANDIN_NODES / lc0["seconds"], rel=1e-3)
        assert row["cyzero"]["nodes"] > 0 and row["cyzero"]["cpu_seconds"] > 0
        assert lc0["cpu_seconds"] >= 0     # the stand-in's own CPU time, start-up included
        assert row["cyzero_nodes_per_cpu_s"] == pytest.approx(row["cyzero"]["nodes"] / row["cyzero"]["cpu_seconds"],
                                                              rel=1e-3)
        assert row["ratio"] == pytest.approx(row["cyzero_nodes_per_s"] / row["lc0_nodes_per_s"], rel=1e-2, abs=1e-3)
    for batch in ("8", "16"):
        total = summary["totals"][batch]
        assert total["ratio"] == pytest.approx(total["cyzero_nodes_per_s"] / total["lc0_nodes_per_s"], rel=1e-2,
                                               abs=1e-3)
    # One fresh lc0 per search, with the flags of the comparison and the batch of its row.
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(calls) == 2
    for call, batch in zip(calls, (8, 16)):
        assert {"--backend=random", "--threads=1", "--task-workers=0",
                f"--minibatch-size={batch}"} <= set(call["argv"])
        assert call["got"][0] == "uci" and "go movetime 50" in call["got"]
        assert f"position fen {TREE_POSITIONS[0][1]}" in call["got"]


def test_lc0_rows_are_printed_with_the_ratio(standin_lc0, capsys):
    script, _ = standin_lc0
    assert cli.main(["bench", "null", "--seconds", "0.05", "--batches", "8", "--positions", "1",
                     "--lc0", str(script)]) == 0
    out = capsys.readouterr().out
    assert "--- lc0 ---" in out and "cpu ratio" in out
    row = next(line.split() for line in out.splitlines() if line.split()[:2] == ["8", "startpos"])
    # batch, position; cyzero: nodes/s, nodes/cpu-s, mean batch, depth; lc0: nodes/s, nodes/cpu-s; ratio, cpu ratio
    assert len(row) == 10
    assert "cyzero / lc0 =" in out and "per CPU second" in out


def test_a_missing_lc0_is_one_clear_error(tmp_path, capsys):
    assert cli.main(["bench", "null", "--seconds", "0.05", "--lc0", str(tmp_path / "nope")]) == 1
    assert "no lc0 binary at" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["bench", "null", "--batches", "0"])
    assert "batch sizes must be 1 or more" in capsys.readouterr().err
