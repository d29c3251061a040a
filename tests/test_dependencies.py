"""What a user's `pip install kilonode` brings is what kilonode's commands import at load time.

The packaging test (tests/test_packaging.py) installs the wheel with --no-deps and borrows this
environment's packages, test extras included, so a runtime import of a test-only package passes
there and fails for a user: cel-python, imported by preflight's admission-requests check (and so by
`pulumi up`'s preflight gate), sat in the test extra. Here every module-level import of the
toolkit's modules is mapped to the distribution that provides it (importlib.metadata) and held to
[project].dependencies. Imports inside functions are the lazy ones (the rollout's Azure and
Kubernetes SDKs, behind the `rollout` extra, each failing with a message naming it: kilonode.rollout.observe
sdk_missing), and kilonode.node is left out: those programs run on the nodes from their own images."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib import metadata
from importlib.metadata import packages_distributions

import pytest

from kilonode.paths import REPO_ROOT

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

PACKAGE = REPO_ROOT / "infra" / "kilonode"
ON_NODES = PACKAGE / "node"


def _declared() -> set[str]:
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    return {_name(spec) for spec in project["dependencies"]}


def _closure(names: set[str]) -> set[str]:
    """The declared distributions and what they require, as installed here (pydantic brings
    pydantic-core, pulumi protobuf): a module of those arrives with any install."""
    seen, todo = set(), list(names)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        todo += [_name(r) for r in requires if "extra ==" not in r]
    return seen


def _name(spec: str) -> str:
    return re.split(r"[<>=!~\[; (]", spec.strip(), maxsplit=1)[0].lower().replace("_", "-")


def _module_level_imports() -> dict[str, set[str]]:
    """top-level module name -> the files importing it at load time (module body, not in a def)."""
    found: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        if ON_NODES in path.parents:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in tree.body:
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else [])
            for name in names:
                found.setdefault(name.split(".")[0], set()).add(str(path.relative_to(REPO_ROOT)))
    return found


def test_every_module_level_import_is_a_declared_dependency() -> None:
    providers = packages_distributions()
    declared = _closure(_declared())
    missing = {}
    for module, files in _module_level_imports().items():
        if module in sys.stdlib_module_names or module in ("kilonode", "__future__"):
            continue
        dists = {d.lower().replace("_", "-") for d in providers.get(module, [])}
        assert dists, f"{module} (imported by {sorted(files)[0]}) is provided by no installed distribution"
        if not dists & declared:
            missing[module] = (sorted(dists), sorted(files)[:3])
    assert not missing, f"imported at load time but not in [project].dependencies: {missing}"


def test_the_check_reads_the_imports_it_guards() -> None:
    imports = _module_level_imports()
    assert "celpy" in imports and "paramiko" in imports and "pulumi" in imports
    assert "azure" not in imports  # the rollout's SDKs load lazily, behind the rollout extra
