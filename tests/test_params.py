"""The table of search parameters (``engine.params.SearchParams``) and everything that
derives from it: its own checks, the UCI options, the tree's settings, docs/engine.md."""

from __future__ import annotations

import os

import pytest

from engine.board import Board
from engine.params import SearchParams, markdown_table
from engine.tree import Tree
from uci.options import engine_options

ENGINE_PAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "engine.md")
ROWS = SearchParams.table()


def test_the_engine_pages_table_is_the_rendered_one():
    with open(ENGINE_PAGE, encoding="utf-8") as f:
        text = f.read()
    start, end = "<!-- params-table -->", "<!-- /params-table -->"
    assert text.count(start) == 1 and text.count(end) == 1
    block = text[text.index(start) + len(start): text.index(end)]
    assert block.strip() == markdown_table(), (
        "docs/engine.md's search parameter table is stale: paste engine.params.markdown_table() "
        "between its params-table markers"
    )


def test_the_rendered_table_has_one_row_per_parameter():
    lines = markdown_table().splitlines()
    assert len(lines) == 2 + len(ROWS)
    for row, line in zip(ROWS, lines[2:]):
        cells = [c.strip() for c in line.strip("|").split(" | ")]
        assert len(cells) == 6, line
        assert cells[0] == f"`{row.uci}`" and cells[1] == row.type.__name__ and cells[5] == row.meaning


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.name)
def test_every_default_passes_its_own_check(row):
    assert row.check(row.default) == row.default
    assert type(row.check(row.default)) is row.type
    assert row.meaning and row.meaning == row.meaning.strip()
    if row.type is bool:
        assert row.min is None and row.max is None
        with pytest.raises(ValueError):
            row.check(2)
        return
    assert row.min <= row.default <= row.max
    assert row.check(row.min) == row.min and row.check(row.max) == row.max
    step = 1 if row.type is int else 1e-9 * max(1.0, abs(row.max))
    for outside in (row.min - step, row.max + step):
        with pytest.raises(ValueError, match=row.uci or row.name):
            row.check(outside)


def test_names_are_unique():
    assert len({r.name for r in ROWS}) == len(ROWS)
    ucis = [r.uci.lower() for r in ROWS if r.uci is not None]
    assert len(set(ucis)) == len(ucis)


def test_every_uci_option_declares_the_tables_default():
    options = {o.name: o for o in engine_options()}
    for row in ROWS:
        if row.uci is None:
            continue
        option = options[row.uci]
        assert option.default == row.default and type(option.default) is row.type, row.uci
        kind = {bool: "check", int: "spin", float: "string"}[row.type]
        assert option.kind == kind, row.uci
        if row.type is not bool:
            assert (option.min, option.max) == (row.min, row.max), row.uci
        # What the engine declares parses back to the same value.
        declared = option.declaration().split(" default ", 1)[1].split(" min ", 1)[0]
        assert option.parse(declared) == row.default, (row.uci, declared)
    assert SearchParams.from_uci(lambda name: options[name].default) == SearchParams()


def test_tree_settings_are_exactly_what_the_tree_takes():
    tree = Tree(Board())
    settings = SearchParams().tree_settings()
    assert settings.keys() == {r.name for r in ROWS if r.tree}
    assert tree.settings().keys() == settings.keys()
    tree.configure(**settings)
    for row in ROWS:
        if not row.tree:
            with pytest.raises(ValueError, match="unknown search parameter"):
                tree.configure(**{row.name: row.default})


def test_replace_checks_and_rejects_unknown_names():
    params = SearchParams()
    assert params.replace(cpuct=2.5).cpuct == 2.5
    with pytest.raises(ValueError, match="PolicyTemperature"):
        params.replace(policy_temperature=0.0)
    with pytest.raises(ValueError, match="unknown"):
        params.replace(cpuct_typo=1.0)
    assert params.cpuct == SearchParams.row("cpuct").default  # frozen: nothing changed
