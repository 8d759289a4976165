"""UCI text in and out (uci.protocol), without an engine process.

The lines that end a search are checked here against the harness's strict
client-side parser as well, so that what the writer produces is what GUIs read.
"""

from __future__ import annotations

import pytest

from engine.search_report import Info, Line, SearchResult
from test_uci_harness import check_line, parse_info
from uci.protocol import format_info, format_result, parse_go, parse_position, parse_setoption


def test_a_search_that_could_not_run_says_why_and_plays_the_null_move():
    lines = format_result(SearchResult(None, None, None, error="WeightsFile not found: /x.onnx"), False)
    assert lines == ["info string error: WeightsFile not found: /x.onnx", "bestmove 0000"]


def test_a_multi_line_error_becomes_one_info_string_per_line():
    lines = format_result(SearchResult(None, None, None, error="cannot load\nthe network"), False)
    assert lines == ["info string error: cannot load", "info string error: the network", "bestmove 0000"]
    assert all(check_line(line) is None for line in lines)


@pytest.mark.parametrize("checkmated,score", [(True, ("mate", 0)), (False, ("cp", 0))])
def test_a_root_without_moves_gets_stockfishs_depth_0_score_then_bestmove_none(checkmated, score):
    info, best = format_result(SearchResult(None, None, None), checkmated)
    assert info == f"info depth 0 score {score[0]} {score[1]}"
    assert parse_info(info) == {"depth": 0, "score": score}
    assert best == "bestmove (none)"


def test_bestmove_with_and_without_a_ponder_move():
    assert format_result(SearchResult("e2e4", "e7e5", None), False) == ["bestmove e2e4 ponder e7e5"]
    assert format_result(SearchResult("e2e4", None, None), False) == ["bestmove e2e4"]


@pytest.mark.parametrize("show_wdl", [False, True])
def test_info_lines_have_integers_only_and_pv_last(show_wdl):
    lines = [Line(1, "e2e4", ["e2e4", "e7e5"], 30, 0.1, 0.3, None, (400, 300, 300)),
             Line(2, "d2d4", ["d2d4"], 10, 0.0, 0.5, None, (250, 500, 250)),
             Line(3, "f2f3", ["f2f3", "e7e5", "g2g4", "d8h4"], 5, -1.0, 0.0, -2, (0, 0, 1000))]
    out = format_info(Info(depth=3, seldepth=7, nodes=45, nps=900, time_ms=50, lines=lines), show_wdl)
    parsed = [parse_info(text) for text in out]
    assert [p["multipv"] for p in parsed] == [1, 2, 3]
    assert [p["pv"] for p in parsed] == [line.pv for line in lines]
    assert parsed[2]["score"] == ("mate", -2)
    assert all(("wdl" in p) == show_wdl for p in parsed)
    assert format_info(Info(1, 1, 0, 0, 0, []), False) == ["info depth 1 seldepth 1 nodes 0 nps 0 time 0"]


def test_parse_go_reads_every_field_in_any_order():
    go = parse_go("searchmoves e2e4 d2d4 wtime 1000 btime 900 winc 10 binc 5 movestogo 7 ponder".split())
    assert go.searchmoves == ["e2e4", "d2d4"]
    assert (go.wtime, go.btime, go.winc, go.binc, go.movestogo, go.ponder) == (1000, 900, 10, 5, 7, True)
    assert parse_go(["movetime", "12.7"]).movetime == 12
    assert parse_go(["infinite"]).infinite


@pytest.mark.parametrize("args,message", [
    ("nodes", "needs a number"), ("nodes -1", "must not be negative"), ("wtime abc", "whole number"),
    ("fast", "unknown go argument"),
])
def test_parse_go_names_what_is_wrong(args, message):
    with pytest.raises(ValueError, match=message):
        parse_go(args.split())


def test_parse_position():
    assert parse_position("startpos moves e2e4 e7e5".split()) == (None, ["e2e4", "e7e5"])
    assert parse_position("fen 4k3/8/8/8/8/8/8/4K3 w - -".split()) == ("4k3/8/8/8/8/8/8/4K3 w - - 0 1", [])
    for bad in ("", "startpos junk", "fen", "fen a b c d e f g", "sideways"):
        with pytest.raises(ValueError):
            parse_position(bad.split())


def test_parse_setoption_keeps_spaces_in_names_and_values():
    assert parse_setoption("name Move Overhead value 30") == ("Move Overhead", "30")
    assert parse_setoption("name WeightsFile value /a dir/net.onnx") == ("WeightsFile", "/a dir/net.onnx")
    assert parse_setoption("name Clear Hash") == ("Clear Hash", None)
    for bad in ("", "value 3", "name", "name value 3"):
        with pytest.raises(ValueError):
            parse_setoption(bad)
