"""The package's shape, kept by a test: no import circles among thinkrl's
modules, and the run is built (`thinkrl.build`) only by the driver and the
command line.

Every import statement counts, also one inside a function or under
TYPE_CHECKING: a function-local import closes a circle as surely as a
top-level one, it only hides it.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "thinkrl"
BUILDERS = ("thinkrl.trainer", "thinkrl.commands.", "thinkrl.rehearse.")
"""Who may import thinkrl.build: the driver, the commands and the rehearsal
(which runs a command's work: a restart, checked to resume before it trains)."""


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _exists(name: str) -> bool:
    base = PACKAGE.parent.joinpath(*name.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def imports_of(path: Path) -> set[str]:
    """The thinkrl modules `path` imports, wherever the statement stands.
    `from thinkrl.a import b` names thinkrl.a (whose __init__ runs first) and,
    when it is a module, thinkrl.a.b."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("thinkrl"))
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("thinkrl"):
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(node.module)
                if _exists(sub):
                    found.add(sub)
    return found


def import_graph() -> dict[str, set[str]]:
    graph = {module_name(p): imports_of(p) for p in PACKAGE.rglob("*.py")}
    return {m: {t for t in targets if t in graph and t != m} for m, targets in graph.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_circle_finder_finds_a_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_the_import_reader_sees_local_and_type_checking_imports(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                      "    from thinkrl.run import Run\n"
                      "def f():\n    from thinkrl.config import choices\n    import thinkrl.errors\n")
    assert imports_of(source) == {"thinkrl.run", "thinkrl.config", "thinkrl.config.choices",
                                  "thinkrl.errors"}


def test_no_import_circles():
    found = circles(import_graph())
    assert not found, "modules that import each other (move the shared names down a layer):\n" + \
        "\n".join(" <-> ".join(c) for c in found)


def test_only_the_driver_and_the_commands_build_a_run():
    importers = sorted(m for m, targets in import_graph().items()
                       if "thinkrl.build" in targets and not m.startswith(BUILDERS))
    assert not importers, f"{importers} import thinkrl.build; take the types from thinkrl.run"
