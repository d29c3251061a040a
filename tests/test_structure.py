"""The package's shape: no import cycles (function-level imports included), and the command
modules share kilonode.cli.common instead of importing each other."""

from __future__ import annotations

import ast
from pathlib import Path

from kilonode.paths import REPO_ROOT
from tests.source import parse

assert REPO_ROOT is not None, "runs from a source checkout"
PACKAGE = REPO_ROOT / "infra" / "kilonode"


def module_name(path: Path) -> str:
    """infra/kilonode/cli/common.py -> kilonode.cli.common."""
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
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
    for node in ast.walk(parse(path)):
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
    shared = {"kilonode.cli.common", "kilonode.cli.__main__"}
    commands = [m for m in edges if m.startswith("kilonode.cli.") and m not in shared]
    assert commands, "no command modules found"
    for module in commands:
        cli_imports = {m for m in edges[module] if m == "kilonode.cli" or m.startswith("kilonode.cli.")}
        assert cli_imports <= {"kilonode.cli.common"}, f"{module} imports {sorted(cli_imports)}"
    outside = {m: {i for i in deps if i == "kilonode.cli" or i.startswith("kilonode.cli.")}
               for m, deps in edges.items() if not m.startswith("kilonode.cli") and m != "kilonode.entry"}
    assert not any(outside.values()), f"non-CLI modules import the CLI: {outside}"


# Layers, left to right: each module imports only its own layer and those to its left.
LAYERS = [
    ("kilonode", "kilonode.problems", "kilonode.paths"),
    ("kilonode.config",),
    ("kilonode.plan",),
    ("kilonode.render",),
    ("kilonode.azure", "kilonode.image", "kilonode.k8s"),  # siblings: none imports another
    # the CLI and the local rehearsal, which composes the renderers and the image pipeline
    ("kilonode.cli", "kilonode.entry", "kilonode.__main__", "kilonode.local",
     "kilonode.review"),
]
# What the Azure components and the image build may take from the renderers: the rendered
# files' contract, handed to them by their caller. Rendering itself is the caller's job (the
# CLI, or the Pulumi program's composition root).
RENDER_CONTRACT = {"kilonode.render.files"}
COMPOSITION_ROOTS = {"kilonode.azure.program"}
SIBLINGS = {"kilonode.azure", "kilonode.image", "kilonode.k8s"}


def layer_of(module: str) -> tuple[int, str]:
    best = (-1, "")
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > len(best[1]):
                best = (index, prefix)
    return best


def test_each_layer_imports_only_the_layers_to_its_left() -> None:
    problems = []
    for module, deps in graph().items():
        index, home = layer_of(module)
        for dep in deps:
            dep_index, dep_home = layer_of(dep)
            if dep_home == home:
                continue
            if dep_index > index:
                problems.append(f"{module} imports {dep}, a layer to its right")
            elif dep_index == index and home in SIBLINGS and module not in COMPOSITION_ROOTS:
                problems.append(f"{module} imports {dep}, a sibling")
            elif dep_home == "kilonode.render" and home in SIBLINGS \
                    and dep not in RENDER_CONTRACT and module not in COMPOSITION_ROOTS:
                problems.append(f"{module} imports {dep}: take rendered files from the caller")
    assert problems == []
