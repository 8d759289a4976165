"""docs/engine.md documents every option the engine declares, as the engine declares it.

The engine is started (``python -m uci``, as a GUI would start ``cyzero``) and asked ``uci``; each
``option name ... type ... default ... min ... max ... var ...`` line it answers must have one row
in the page's tables (the options table and the generated search-parameter table) with the same
type, default and range, and the page must document no option the engine lacks (issue 46).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from typing import Optional

import pytest

from uci.options import default_threads

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGE = os.path.join(REPO, "docs", "engine.md")

# The generated search-parameter table names Python types; the engine declares UCI ones.
PYTHON_TO_UCI = {"float": "string", "int": "spin", "bool": "check"}
KEYWORDS = ("name", "type", "default", "min", "max", "var")


def parse_option(line: str) -> dict:
    """``option name Move Overhead type spin default 50 min 0 max 10000`` -> its fields."""
    fields: dict = {"var": []}
    key: Optional[str] = None
    words: list[str] = []

    def flush() -> None:
        if key == "var":
            fields["var"].append(" ".join(words))
        elif key is not None:
            fields[key] = " ".join(words)

    for word in line.split()[1:]:
        if word in KEYWORDS:
            flush()
            key, words = word, []
        else:
            words.append(word)
    flush()
    return fields


def engine_declarations() -> dict[str, dict]:
    done = subprocess.run([sys.executable, "-m", "uci"], input="uci\nquit\n", cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert "uciok" in lines, done.stdout[-2000:]
    options = [parse_option(line) for line in lines if line.startswith("option ")]
    assert options, done.stdout[-2000:]
    return {o["name"]: o for o in options}


def page_rows(text: str) -> dict[str, dict]:
    """The rows of the page's two tables, by option name: type, default and range cells."""
    rows: dict[str, dict] = {}
    for marker in ("options-table", "params-table"):
        start, end = f"<!-- {marker} -->", f"<!-- /{marker} -->"
        assert text.count(start) == 1 and text.count(end) == 1, f"docs/engine.md lacks its {marker} markers"
        block = text[text.index(start) + len(start): text.index(end)]
        for line in block.splitlines():
            line = line.strip()
            if not line.startswith("| `"):
                continue
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line[1:-1])]
            name = cells[0].strip("`")
            assert name not in rows, f"docs/engine.md documents {name} twice"
            rows[name] = {"type": cells[1], "default": cells[2], "range": cells[3], "table": marker}
    return rows


def page_default(cell: str) -> Optional[str]:
    """A default cell as the engine would declare it: `x` -> x, (empty) -> <empty>, — -> None."""
    cell = cell.strip()
    if cell in ("—", "-", ""):
        return None
    if cell == "(empty)":
        return "<empty>"
    return cell.strip("`")


def page_range(cell: str) -> list[str]:
    """``0 .. 15`` -> ['0', '15']; ```auto`, `cpu``` -> ['auto', 'cpu']; ``true, false`` -> those."""
    if " .. " in cell:
        return [part.strip() for part in cell.split(" .. ")]
    return [part.strip().strip("`") for part in cell.split(",")]


def check_page(declared: dict[str, dict], text: str) -> list[str]:
    """Every way the page differs from what the engine declares, one line each."""
    rows = page_rows(text)
    problems = [f"{name}: the engine declares it, docs/engine.md does not document it"
                for name in declared if name not in rows]
    problems += [f"{name}: docs/engine.md documents it, the engine has no such option"
                 for name in rows if name not in declared]
    for name in declared.keys() & rows.keys():
        option, row = declared[name], rows[name]
        kind = PYTHON_TO_UCI.get(row["type"], row["type"])
        if kind != option["type"]:
            problems.append(f"{name}: type {option['type']} in the engine, {row['type']} on the page")
            continue
        if name == "Threads":
            # Machine-dependent: the page states the rule, the engine applies it here.
            if "cores" not in row["default"] or option["default"] != str(default_threads()):
                problems.append(f"{name}: the engine's default {option['default']} is not the page's rule "
                                f"{row['default']!r} (here {default_threads()})")
        elif page_default(row["default"]) != option.get("default"):
            problems.append(f"{name}: default {option.get('default')} in the engine, {row['default']} on the page")
        if option["type"] == "spin" and page_range(row["range"]) != [option["min"], option["max"]]:
            problems.append(f"{name}: range {option['min']} .. {option['max']} in the engine, "
                            f"{row['range']} on the page")
        if option["type"] == "combo" and page_range(row["range"]) != option["var"]:
            problems.append(f"{name}: choices {', '.join(option['var'])} in the engine, {row['range']} on the page")
        if option["type"] == "check" and sorted(page_range(row["range"])) != ["false", "true"]:
            problems.append(f"{name}: a check takes true, false; the page says {row['range']}")
    return problems


@pytest.fixture(scope="module")
def declared() -> dict[str, dict]:
    return engine_declarations()


def test_the_page_documents_every_option_as_the_engine_declares_it(declared):
    with open(PAGE, encoding="utf-8") as f:
        text = f.read()
    problems = check_page(declared, text)
    assert not problems, "docs/engine.md is out of step with the engine's `uci`:\n" + "\n".join(problems)


def test_parse_option_reads_names_with_spaces_and_choices():
    assert parse_option("option name Move Overhead type spin default 50 min 0 max 10000") == {
        "name": "Move Overhead", "type": "spin", "default": "50", "min": "0", "max": "10000", "var": []}
    assert parse_option("option name Backend type combo default auto var auto var cpu") == {
        "name": "Backend", "type": "combo", "default": "auto", "var": ["auto", "cpu"]}
    assert parse_option("option name Clear Hash type button") == {"name": "Clear Hash", "type": "button", "var": []}


def test_a_wrong_page_fails(declared):
    """The check catches each kind of mistake: a wrong default, range, type, choice, a missing
    option and one the engine does not have."""
    with open(PAGE, encoding="utf-8") as f:
        text = f.read()
    assert not check_page(declared, text)
    wrong = {
        "default": text.replace("| `Move Overhead` | int | 50 |", "| `Move Overhead` | int | 40 |"),
        "range": text.replace("| `GPU` | spin | `0` | 0 .. 15 |", "| `GPU` | spin | `0` | 0 .. 7 |"),
        "type": text.replace("| `Ponder` | check |", "| `Ponder` | spin |"),
        "choices": text.replace("`openvino`, `cpu` |", "`cpu` |", 1),
        "missing": re.sub(r"\n\| `TrainerKeys` \|[^\n]*", "", text),
        "extra": text.replace("<!-- /options-table -->",
                              "| `Contempt` | spin | `0` | -100 .. 100 | not an option |\n\n<!-- /options-table -->"),
    }
    for kind, page in wrong.items():
        assert page != text, f"the {kind} edit did not apply: the page's wording changed"
        assert check_page(declared, page), f"a page with a wrong {kind} passed"
