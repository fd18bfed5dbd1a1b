"""The code's layout: packages by concern, imports that read downwards, small modules, and
no module reaching into another's private names."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_LINES = 450
"""No module is past this: one that grows is split by concern, its explanations kept."""

# Packages (and top-level modules) from the entry point down; each may import only those
# after it in this order. ``bench`` drives the others from outside the training path, the
# emulated cluster (``emulate``, run as ``adaqp.cluster``) among them; ``plot`` reads what
# runs wrote. ``quant.bits`` (the widths, which the config reads), ``process`` (what a
# process has of its machine) and ``cli`` (what every command shares) are standard library
# only, below every stage. A module belongs to the most specific entry that names it.
LAYERS = [
    "adaqp.cluster",
    "adaqp.launcher",
    "adaqp.bench",
    "adaqp.emulate",
    "adaqp.plot",
    "adaqp.memory",
    "adaqp.ogb_fixture",
    "adaqp.train",
    "adaqp.run",
    "adaqp.model",
    "adaqp.exchange",
    "adaqp.assign",
    "adaqp.runtime",
    "adaqp.graph",
    "adaqp.partitioning",
    "adaqp.quant",
    "adaqp.config",
    "adaqp.data",
    "adaqp.quant.bits",
    "adaqp.process",
    "adaqp.cli",
]


def _modules(root: Path = ROOT) -> dict[str, Path]:
    found = {}
    for path in sorted((root / "adaqp").rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def _from_module(node: ast.ImportFrom, name: str, is_package: bool) -> str:
    """The absolute name of the module a ``from ... import`` in module ``name`` reads."""
    if not node.level:
        return node.module or ""
    base = name if is_package else name.rpartition(".")[0]
    anchor = base.rsplit(".", node.level - 1)[0] if node.level > 1 else base
    return f"{anchor}.{node.module}" if node.module else anchor


def _imports(path: Path, name: str, is_package: bool) -> set[str]:
    """Every module ``path`` imports, at any depth of its code: lazy imports and imports
    for type checkers only included (a circle of type hints is still a circle)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = _from_module(node, name, is_package)
            out.add(module)
            out.update(f"{module}.{alias.name}" for alias in node.names)
    return out


def _graph(root: Path = ROOT) -> dict[str, set[str]]:
    modules = _modules(root)
    graph = {}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        targets = set()
        for imported in _imports(path, name, is_package):
            # The longest known module the import names (``from a.b import c``: a.b.c or a.b).
            while imported and imported not in modules:
                imported = imported.rpartition(".")[0]
            if imported and imported != name:
                targets.add(imported)
        graph[name] = targets
    return graph


def _private_uses(path: Path, name: str, modules: dict[str, Path]) -> set[tuple[str, str]]:
    """``(module, name)`` for every underscored name module ``name`` (at ``path``) takes from
    another adaqp module: ``from m import _x``, or ``m._x`` where ``m`` names that module."""
    is_package = path.name == "__init__.py"
    tree = ast.parse(path.read_text())
    bound: dict[str, str] = {}  # local name -> the adaqp module it stands for
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in modules:
                    # ``import a.b`` binds ``a``; ``import a.b as c`` binds ``c`` to a.b.
                    local = alias.asname or alias.name.partition(".")[0]
                    bound[local] = alias.name if alias.asname else local
        elif isinstance(node, ast.ImportFrom):
            module = _from_module(node, name, is_package)
            for alias in node.names:
                if f"{module}.{alias.name}" in modules:
                    bound[alias.asname or alias.name] = f"{module}.{alias.name}"
                elif module in modules and _is_private(alias.name):
                    out.add((module, alias.name))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _is_private(node.attr):
            dotted, value = [], node.value
            while isinstance(value, ast.Attribute):
                dotted.append(value.attr)
                value = value.value
            if isinstance(value, ast.Name) and value.id in bound:
                module = ".".join([bound[value.id], *reversed(dotted)])
                if module in modules:
                    out.add((module, node.attr))
    return {(module, attr) for module, attr in out if module != name}


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _private_imports(root: Path = ROOT) -> dict[str, set[tuple[str, str]]]:
    """Per module of the package under ``root``, the private names it takes from others."""
    modules = _modules(root)
    found = {name: _private_uses(path, name, modules) for name, path in modules.items()}
    return {name: uses for name, uses in found.items() if uses}


def _layer(module: str) -> str | None:
    if module == "adaqp":  # the package's own __init__: a docstring and a version
        return LAYERS[0]
    matches = [layer for layer in LAYERS if module == layer or module.startswith(layer + ".")]
    return max(matches, key=len, default=None)


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_every_module_belongs_to_a_layer_and_says_what_it_owns():
    for name, path in _modules().items():
        assert _layer(name), name
        tree = ast.parse(path.read_text())
        assert ast.get_docstring(tree), f"{path.relative_to(ROOT)} has no docstring"


def test_no_module_is_over_the_size_limit():
    long = {
        str(path.relative_to(ROOT)): n
        for path in _modules().values()
        if (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert not long, long


def test_module_import_graph_has_no_cycle():
    assert _cycle(_graph()) is None


def test_packages_import_only_downwards():
    order = {layer: i for i, layer in enumerate(LAYERS)}
    upward = []
    for module, targets in _graph().items():
        for target in targets:
            src, dst = _layer(module), _layer(target)
            if src != dst and order[dst] < order[src]:
                upward.append(f"{module} -> {target}")
    assert not upward, upward


def test_no_module_imports_another_modules_private_names():
    found = sorted(
        f"{module} takes {source}.{attr}"
        for module, uses in _private_imports().items()
        for source, attr in uses
    )
    assert not found, found


def test_layers_do_not_pull_in_the_solver_and_nothing_imports_the_partition_tool():
    graph = _graph()

    def reach(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for nxt in graph.get(todo.pop(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    below_layers = reach("adaqp.model.layers")
    assert not {m for m in below_layers if m.startswith(("adaqp.assign", "adaqp.exchange.plan"))}
    for path in (ROOT / "adaqp").rglob("*.py"):
        imported = _imports(path, "adaqp.x", False)
        assert not {m for m in imported if m == "partition" or m.startswith("partition.")}, path


CITED_TEST = re.compile(r"\btests/[\w/]+\.py\b")
"""A test file named in a docstring or a doc (``tests/run/test_trainer.py``)."""


def _cited_tests(text: str) -> set[str]:
    return set(CITED_TEST.findall(text))


def test_every_test_file_the_code_and_docs_cite_exists():
    """A module or a doc that says which test holds it to its word names a file that is
    there (``adaqp/graph/loss_rows.py`` once cited one that was never written)."""
    sources = [*(ROOT / "adaqp").rglob("*.py"), *(ROOT / "partition").rglob("*.py")]
    sources += [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]
    missing = sorted(
        f"{path.relative_to(ROOT)}: {cited}"
        for path in sources
        for cited in _cited_tests(path.read_text())
        if not (ROOT / cited).exists()
    )
    assert not missing, missing
    assert _cited_tests("held by tests/run/test_nowhere.py.") == {"tests/run/test_nowhere.py"}


def test_the_checker_finds_a_cycle_an_upward_import_and_a_private_import(tmp_path):
    source = tmp_path / "m.py"
    source.write_text(
        "from typing import TYPE_CHECKING\nimport a.b\n"
        "if TYPE_CHECKING:\n    import c\nelse:\n    import d\n"
        "def f():\n    from . import e\n"
    )
    assert _imports(source, "pkg.m", False) == {
        "typing",
        "typing.TYPE_CHECKING",
        "a.b",
        "c",
        "d",
        "pkg",
        "pkg.e",
    }
    # A circle made only of type hints is found, like the one cost models and the problem
    # once had through ``Channel``.
    package = tmp_path / "adaqp"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "one.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from adaqp.two import T\n"
    )
    (package / "two.py").write_text("from adaqp.one import _hidden, shown\nimport adaqp.one as o\n")
    (package / "three.py").write_text("from adaqp import one\nx = one._hidden + one.shown\n")
    assert _cycle(_graph(tmp_path)) == ["adaqp.one", "adaqp.two", "adaqp.one"]
    assert _private_imports(tmp_path) == {
        "adaqp.two": {("adaqp.one", "_hidden")},
        "adaqp.three": {("adaqp.one", "_hidden")},
    }
    (package / "two.py").write_text("import adaqp.one as o\nfrom adaqp.one import _x as y\no._z\n")
    assert _private_imports(tmp_path)["adaqp.two"] == {("adaqp.one", "_x"), ("adaqp.one", "_z")}
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
    assert _layer("adaqp.quant.rows") == "adaqp.quant"
    assert LAYERS.index(_layer("adaqp.exchange.adaptive")) < LAYERS.index("adaqp.assign")
