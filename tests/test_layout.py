"""The code's layout: packages by concern, imports that read downwards, small modules."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_LINES = 450
# Modules allowed past the limit (none today).
LONG_BY_DESIGN: set[str] = set()

# Packages (and top-level modules) from the entry point down; each may import only those
# after it in this order. ``bench`` drives the others from outside the training path;
# ``plot`` reads what runs wrote.
LAYERS = [
    "adaqp.cluster",
    "adaqp.launcher",
    "adaqp.bench",
    "adaqp.plot",
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
    "adaqp.atomic",
    "adaqp.stop",
    "adaqp.typed_toml",
    "adaqp.bits",
    "adaqp.deps",
]


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted((ROOT / "adaqp").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def _runtime_nodes(tree: ast.AST):
    """Every node of ``tree`` except those under ``if TYPE_CHECKING:`` (type hints only)."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            test = child.test if isinstance(child, ast.If) else None
            if isinstance(test, ast.Name) and test.id == "TYPE_CHECKING":
                todo.extend(child.orelse)
                continue
            todo.append(child)


def _imports(path: Path, name: str, is_package: bool) -> set[str]:
    """Every module ``path`` imports when it runs, at any depth of its code (lazy imports
    included, imports for type checkers only not)."""
    base = name if is_package else name.rpartition(".")[0]
    out = set()
    for node in _runtime_nodes(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = base.rsplit(".", node.level - 1)[0] if node.level > 1 else base
                module = f"{anchor}.{node.module}" if node.module else anchor
            else:
                module = node.module or ""
            out.add(module)
            out.update(f"{module}.{alias.name}" for alias in node.names)
    return out


def _graph() -> dict[str, set[str]]:
    modules = _modules()
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


def _layer(module: str) -> str | None:
    if module == "adaqp":  # the package's own __init__: a docstring and a version
        return LAYERS[0]
    matches = (layer for layer in LAYERS if module == layer or module.startswith(layer + "."))
    return next(matches, None)


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
    assert set(long) <= LONG_BY_DESIGN, long


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


def test_the_checker_finds_a_cycle_and_an_upward_import(tmp_path):
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
        "d",
        "pkg",
        "pkg.e",
    }
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
    assert _layer("adaqp.quant.rows") == "adaqp.quant"
    assert LAYERS.index(_layer("adaqp.exchange.adaptive")) < LAYERS.index("adaqp.assign")
