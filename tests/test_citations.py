"""Code points only into the repository: every document a source file cites is one of ours.

Comments and docstrings cite ``docs/*.md`` (often with a section in quotes); a citation of a
file outside the repository (the design notes the project started from) leaves a reader with
nothing to open.
"""

from __future__ import annotations

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FOLDERS = ("engine", "uci", "trainer", "tests", "cython_src", "docs")
SUFFIXES = (".py", ".pyx", ".pxd", ".pyi", ".md", ".toml")
CITATION = re.compile(r"docs/([\w.-]+\.md)(?:``)?(?:[,:]?\s*\(?)\"([^\"\n]+)\"")
ANY_DOC = re.compile(r"docs/([\w.-]+\.md)")


def sources():
    for folder in FOLDERS:
        for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, folder)):
            dirnames[:] = [d for d in dirnames if not d.startswith(".") and d != "__pycache__"]
            for name in filenames:
                if name.endswith(SUFFIXES):
                    path = os.path.join(dirpath, name)
                    with open(path, encoding="utf-8", errors="replace") as f:
                        yield os.path.relpath(path, ROOT), f.read()


def headings(doc: str) -> list[str]:
    with open(os.path.join(ROOT, "docs", doc), encoding="utf-8") as f:
        return [line.lstrip("#").strip() for line in f if line.startswith("#")]


def test_nothing_cites_the_design_notes_outside_the_repository():
    citing = sorted(path for path, text in sources() if "DESIGN.md" in text and path != "tests/test_citations.py")
    assert citing == [], f"these cite DESIGN.md, which is not in the repository: {citing}"


def test_every_cited_page_and_section_exists():
    missing = []
    for path, text in sources():
        for doc in set(ANY_DOC.findall(text)):
            if not os.path.isfile(os.path.join(ROOT, "docs", doc)):
                missing.append(f"{path}: docs/{doc}")
        for doc, section in CITATION.findall(text):
            if os.path.isfile(os.path.join(ROOT, "docs", doc)) and \
                    not any(h.startswith(section) for h in headings(doc)):
                missing.append(f'{path}: docs/{doc}, "{section}"')
    assert missing == []


def test_the_network_contract_the_code_cites_is_on_the_contracts_page():
    with open(os.path.join(ROOT, "docs", "contracts.md"), encoding="utf-8") as f:
        text = f.read()
    contracts = text[text.index("\n## The network\n"):]
    for fact in ("/input/planes", "[N,112,8,8]", "/output/policy", "[N,1858]", "/output/wdl", "/output/mlh",
                 "fen_only", "en-passant", "1792", "66 promotions", "q, r, b", "rule-50 count, raw"):
        assert fact in contracts, fact
