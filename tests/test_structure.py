"""The package's shape: no import cycles (function-level imports included), and the command
modules share infra.cli.common instead of importing each other."""

from __future__ import annotations

import ast
from pathlib import Path

from infra.paths import REPO_ROOT

PACKAGE = REPO_ROOT / "infra"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO_ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts}


def imports_of(path: Path, known: set[str]) -> set[str]:
    """The infra modules `path` imports anywhere in its body (lazy imports count)."""
    found: set[str] = set()
    this = module_name(path)
    package = this if path.name == "__init__.py" else this.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != this:
                found.add(name)
    return found


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {name: imports_of(path, set(mods)) for name, path in mods.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_the_package_has_no_import_cycle() -> None:
    assert cycles(graph()) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_command_modules_import_only_the_shared_cli_module() -> None:
    edges = graph()
    commands = [m for m in edges if m.startswith("infra.cli.") and m not in {"infra.cli.common", "infra.cli.__main__"}]
    assert commands, "no command modules found"
    for module in commands:
        cli_imports = {m for m in edges[module] if m == "infra.cli" or m.startswith("infra.cli.")}
        assert cli_imports <= {"infra.cli.common"}, f"{module} imports {sorted(cli_imports)}"
    outside = {m: {i for i in deps if i == "infra.cli" or i.startswith("infra.cli.")}
               for m, deps in edges.items() if not m.startswith("infra.cli") and m != "infra.entry"}
    assert not any(outside.values()), f"non-CLI modules import the CLI: {outside}"
