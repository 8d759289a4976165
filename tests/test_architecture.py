"""The house's arrows (docs/architecture.md): who may import whom, and no cycles.

Read from the source with :mod:`ast`, so every import counts: at module
level, inside functions, and under ``TYPE_CHECKING``.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from collections import defaultdict

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOMS = ("engine", "uci", "trainer")
_CYTHON_IMPORT = re.compile(r"^\s*(?:from\s+([\w.]+)\s+c?import\b|c?import\s+([\w.]+))", re.M)


def _module_name(path: str) -> str:
    rel = os.path.relpath(path, REPO)[: -len(".py")].replace(os.sep, ".")
    return rel[: -len(".__init__")] if rel.endswith(".__init__") else rel


def _modules() -> dict[str, str]:
    """{module name: source path} for every Python module of the three rooms, plus the Cython core."""
    found = {}
    for room in ROOMS:
        for folder, _, files in os.walk(os.path.join(REPO, room)):
            for name in files:
                if name.endswith(".py"):
                    path = os.path.join(folder, name)
                    found[_module_name(path)] = path
    for name in os.listdir(os.path.join(REPO, "cython_src")):
        if name.endswith(".pyx"):
            found[f"engine.{name[:-4]}"] = os.path.join(REPO, "cython_src", name)
    return found


def _from_base(node: ast.ImportFrom, package: str) -> str:
    """The absolute module a ``from ... import`` line imports from (``package``: the importer's)."""
    base = node.module or ""
    if node.level:
        parts = package.split(".")
        base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
    return base


def _package(path: str, module: str) -> str:
    return module if path.endswith("__init__.py") else module.rpartition(".")[0]


def _imports(path: str, module: str) -> set[str]:
    """Every absolute module name that ``path`` imports (relative imports resolved)."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if path.endswith(".pyx"):
        # Cython is not Python: read the module names of its import and cimport lines.
        return {m.group(1) or m.group(2) for m in _CYTHON_IMPORT.finditer(text)}
    tree = ast.parse(text)
    names = set()
    package = _package(path, module)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _from_base(node, package)
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


MODULES = _modules()
GRAPH = {module: _imports(path, module) for module, path in MODULES.items()}


def _room(name: str) -> str:
    return name.split(".")[0]


def _is_tool(name: str) -> bool:
    return name == "engine.tools" or name.startswith("engine.tools.")


@pytest.mark.parametrize("module", sorted(m for m in MODULES if _room(m) in ("engine", "uci")))
def test_engine_and_uci_never_import_torch_or_trainer(module):
    bad = sorted(n for n in GRAPH[module] if _room(n) in ("torch", "trainer"))
    assert not bad, f"{module} imports {bad}: the engine must install and start without torch"


@pytest.mark.parametrize("module", sorted(m for m in MODULES if _room(m) == "engine"))
def test_engine_never_imports_uci(module):
    bad = sorted(n for n in GRAPH[module] if _room(n) == "uci")
    assert not bad, f"{module} imports {bad}: arrows go uci -> engine"


@pytest.mark.parametrize("module", sorted(m for m in MODULES if _room(m) == "engine" and not _is_tool(m)))
def test_the_playing_engine_never_imports_its_tools(module):
    bad = sorted(n for n in GRAPH[module] if _is_tool(n))
    assert not bad, f"{module} imports {bad}: bench, match, perft and the reference are tooling"


def test_no_import_cycles_between_project_modules():
    edges = defaultdict(set)
    for module, names in GRAPH.items():
        for name in names:
            target = name
            while target and target not in MODULES:
                target = target.rpartition(".")[0]
            # A package's __init__ is not an edge back into its own modules.
            if target and target != module and not module.startswith(target + "."):
                edges[module].add(target)
    visiting, done, cycles = set(), set(), []

    def visit(node, path):
        visiting.add(node)
        for nxt in sorted(edges[node]):
            if nxt in visiting:
                cycles.append(path[path.index(nxt):] + [nxt])
            elif nxt not in done:
                visit(nxt, path + [nxt])
        visiting.discard(node)
        done.add(node)

    for module in sorted(MODULES):
        if module not in done:
            visit(module, [module])
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_the_graph_sees_known_arrows():
    """The checks above are only as good as the graph: it must see imports we know exist."""
    assert "engine.search" in GRAPH["uci.session"]
    assert "engine.limits" in GRAPH["engine.timeman"]
    assert any(n.startswith("engine.board") for n in GRAPH["engine.tree"])
    assert any(n.startswith("engine.tools") for n in GRAPH["uci.cli"])


# -- the torch boundary -----------------------------------------------------------------------
# The trainer's half without torch (docs/architecture.md): the daemon's side, self-play and status
# must run where torch is not installed. Each is imported in a fresh interpreter in which
# `import torch` fails; one that needs torch to import fails here with the import chain.
TORCH_FREE = (
    "trainer.store",
    "trainer.report",
    "trainer.rundir",
    "trainer.devices",
    "trainer.daemon",
    "trainer.endpoints",
    "trainer.ingest",
    "trainer.publishing",
    "trainer.supervision",
    "trainer.worker",
    "trainer.selfplay",
    "trainer.wire",
    "trainer.config",
    "trainer.records",
)

_WITHOUT_TORCH = """
import importlib, sys

class NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ModuleNotFoundError(f"No module named {name!r} (made unimportable)", name=name)

sys.meta_path.insert(0, NoTorch())
importlib.import_module(sys.argv[1])
"""


def _import_without_torch(module: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", _WITHOUT_TORCH, module], cwd=REPO, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("module", TORCH_FREE)
def test_the_trainers_torch_free_half_imports_without_torch(module):
    proc = _import_without_torch(module)
    assert proc.returncode == 0, f"{module} does not import without torch:\n{proc.stderr[-3000:]}"


def test_the_torch_block_is_real():
    """The check above is only as good as its block: a module that needs torch must fail under it."""
    proc = _import_without_torch("trainer.loader")
    assert proc.returncode != 0 and "No module named 'torch' (made unimportable)" in proc.stderr, proc.stderr


# -- private names --------------------------------------------------------------------------------
# A leading underscore says "this module's own": another module that imports it couples itself to
# what the owner may change at will. Offenders today, being removed: this set must only shrink.
KNOWN_PRIVATE_IMPORTS: set[str] = set()


def _private_imports(text: str, module: str, package: str) -> set[str]:
    """``"A imports B._x"`` for each ``from B import _x`` in ``text`` (module A) where B is another
    project module (dunders such as ``__version__`` are public)."""
    found = set()
    for node in ast.walk(ast.parse(text)):
        if not isinstance(node, ast.ImportFrom):
            continue
        base = _from_base(node, package)
        if _room(base) not in ROOMS or base == module:
            continue
        found.update(f"{module} imports {base}.{alias.name}" for alias in node.names
                     if alias.name.startswith("_") and not alias.name.endswith("__"))
    return found


def test_no_module_imports_another_modules_private_names():
    found = set()
    for module, path in MODULES.items():
        if path.endswith(".py"):
            with open(path, encoding="utf-8") as f:
                found |= _private_imports(f.read(), module, _package(path, module))
    new = sorted(found - KNOWN_PRIVATE_IMPORTS)
    assert not new, "private names imported from another module (make them public, or move the code): " + \
        "; ".join(new)


def test_the_private_import_check_sees_one():
    text = "from engine.tools.bench import _replay, run\nfrom . import _own\nfrom engine import __version__\n"
    assert _private_imports(text, "trainer.bench_x", "trainer") == {
        "trainer.bench_x imports engine.tools.bench._replay", "trainer.bench_x imports trainer._own"}
    assert _private_imports("from trainer.store import _x\n", "trainer.store", "trainer") == set()


def _rooms_map() -> str:
    with open(os.path.join(REPO, "docs", "architecture.md"), encoding="utf-8") as f:
        text = f.read()
    return text[text.index("\n## Rooms\n"):text.index("\n## Arrows\n")]


@pytest.mark.parametrize("path", sorted(os.path.relpath(p, REPO) for p in _modules().values()
                                         if not p.endswith(("__init__.py", "__main__.py"))))
def test_every_module_is_on_the_map(path):
    """docs/architecture.md's map names every module with its one concern: a newcomer finds each room there."""
    name = os.path.basename(path)
    stem = name.rsplit(".", 1)[0]
    assert re.search(rf"(?<![\w.]){re.escape(stem)}(\.pyx?)?(?![\w])", _rooms_map()), \
        f"{path} is not named in docs/architecture.md's map of the rooms"
