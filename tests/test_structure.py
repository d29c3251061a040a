"""The package's shape: no import cycles (function-level imports included), and the command
modules share kilonode.cli.common instead of importing each other."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

from kilonode.paths import REPO_ROOT
from tests.source import parse

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

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


@functools.cache
def graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports (shared by the tests: read, never changed)."""
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
    ("kilonode.catalog",),
    ("kilonode.config",),
    ("kilonode.plan",),
    ("kilonode.render",),
    ("kilonode.azure", "kilonode.image", "kilonode.k8s"),  # siblings: none imports another
    # the bring-up proof over the plan, the rendered files, the recorded graph (as JSON) and
    # image manifests; the Pulumi program runs it as a command, never imports it
    ("kilonode.preflight",),
    # the CLI and the local rehearsal, which composes the renderers and the image pipeline
    ("kilonode.cli", "kilonode.entry", "kilonode.__main__", "kilonode.local",
     "kilonode.review", "kilonode.rollout"),
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


# --- the catalogue and the plan decide every number and version ------------------------------

# Who reads the catalogue: the config (the boundary checks a stack against it) and the plan
# (which decides from it); the drivers may read a row directly.
CATALOGUE_READERS = ("kilonode.config", "kilonode.plan", "kilonode.cli", "kilonode.entry", "kilonode.__main__",
                     "kilonode.local", "kilonode.review",
                     # preflight's contracts check: the component contracts and the kernels' options are
                     # what it judges the plan, render and images against, not inputs of the plan
                     "kilonode.preflight.checks.contracts",
                     # and pod-isolation, which reads the contracts' servedToPods lines (the flows every pod needs)
                     "kilonode.preflight.checks.pod_isolation",
                     # and admission-config: kube-apiserver's admission plugin names and what each needs to start
                     "kilonode.preflight.checks.admission_config",
                     # and kubelet-config: the kubelet's own validation rules of its configuration
                     "kilonode.preflight.checks.kubelet_config",
                     # and api-validation: the apiserver's validation rules beyond the schema (PriorityClass bounds)
                     "kilonode.preflight.checks.api_validation",
                     # and component-flags: the programs' own start-time validation of their flags
                     "kilonode.preflight.checks.component_flags",
                     # the RBAC authorizer's model (review and preflight's contracts): the apiserver's
                     # built-in roles are the cluster's, not the plan's
                     "kilonode.preflight.apiload")
# The one catalogue part read below the plan: the node images' pinned binaries, which the image
# build takes from the binaries file its recipe names (an input of the build, not of the plan),
# and which the Pulumi program's composition root shows per role.
BINARY_PINS = "kilonode.catalog.binaries"
BINARY_PIN_READERS = {"kilonode.image.binaries", "kilonode.image.build", "kilonode.image.gpu", "kilonode.image.needs",
                      "kilonode.image.topology",
                      "kilonode.azure.program"}
DOWNSTREAM = ("kilonode.render", "kilonode.azure", "kilonode.k8s", "kilonode.image")


def within(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def test_only_the_config_and_the_plan_read_the_catalogue() -> None:
    problems = []
    for module, deps in graph().items():
        if within(module, ("kilonode.catalog", *CATALOGUE_READERS)):
            continue
        for dep in sorted(deps):
            if dep == BINARY_PINS and module in BINARY_PIN_READERS:
                continue
            if within(dep, ("kilonode.catalog",)):
                problems.append(f"{module} imports {dep}: take it from the plan")
    assert problems == []


def defaults_functions() -> set[str]:
    """Functions the plan's defaults define (none today: the derivations are resolve steps)."""
    return {node.name for path in (PACKAGE / "plan" / "defaults").glob("*.py")
            for node in parse(path).body if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)}


def defaults_calls(tree: ast.Module, functions: set[str]) -> list[str]:
    """Uses of a function of kilonode.plan.defaults: `defaults.f`, `<defaults module>.f`, or
    `from kilonode.plan.defaults[.x] import f`."""
    modules: set[str] = set()  # local names bound to kilonode.plan.defaults or one of its modules
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                if full == "kilonode.plan.defaults" or (node.module == "kilonode.plan.defaults" \
                        and alias.name not in functions):
                    modules.add(alias.asname or alias.name)
                if node.module.startswith("kilonode.plan.defaults") and alias.name in functions:
                    found.append(f"imports {alias.name}")
        elif isinstance(node, ast.Import):
            modules |= {alias.asname for alias in node.names
                        if alias.asname and alias.name.startswith("kilonode.plan.defaults")}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules \
                and node.attr in functions:
            found.append(f"uses {node.value.id}.{node.attr}")
    return found


def test_downstream_modules_call_no_function_of_the_plan_defaults() -> None:
    functions = defaults_functions()
    problems = [f"{module}: {use}" for module, path in modules().items() if within(module, DOWNSTREAM)
                for use in defaults_calls(parse(path), functions)]
    assert problems == []


def test_the_defaults_call_finder_finds_a_call() -> None:
    planted = ast.parse("from kilonode.plan import defaults\nx = defaults.apiserver_inflight(1, 2)\n"
                        "from kilonode.plan.defaults.dns import dns_replicas\ny = defaults.DNS_MIN_REPLICAS\n")
    assert defaults_calls(planted, {"apiserver_inflight", "dns_replicas"}) == [
        "imports dns_replicas", "uses defaults.apiserver_inflight"]
    assert defaults_calls(ast.parse("from kilonode.plan import defaults\ny = defaults.DNS_MIN_REPLICAS\n"),
                          {"apiserver_inflight"}) == []


# A version (1.2.3, v1.2.3, v1.2), a digest, or an image reference with a tag.
VERSION_LIKE = re.compile(
    r"(?<![\w.])v?\d+\.\d+\.\d+(?![\w.])"
    r"|(?<![\w.])v\d+\.\d+(?![\w.])"
    r"|sha256:[0-9a-f]{64}"
    r"|[a-z0-9.-]+(?:/[\w.-]+)+:\w[\w.-]*\d[\w.-]*"
)
# Where versions, tags and digests live: the catalogue (outside facts), the config (the stack's
# own, with its defaults) and the plan (which decides). kilonode.node (the node programs) holds
# none today and is not excluded.
VERSION_HOMES = ("kilonode.catalog", "kilonode.config", "kilonode.plan")
VERSION_ALLOWED = {
    # kilonode's own package version when run from a checkout that was never installed
    ("kilonode.cli.project", "0.1.0"),
}


def version_literals(tree: ast.Module) -> list[tuple[int, str]]:
    """Version-like text in the string literals of a module, docstrings left out (they cite the
    release a fact was read at; nothing the program produces comes from them)."""
    docstrings = {id(body[0].value) for node in ast.walk(tree)
                  if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
                  and (body := node.body) and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)}
    return [(node.lineno, match.group(0)) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
            for match in VERSION_LIKE.finditer(node.value)]


def test_no_module_outside_the_catalogue_config_and_plan_holds_a_version() -> None:
    problems = [f"{module}:{line}: {text!r}" for module, path in modules().items()
                if not within(module, VERSION_HOMES)
                for line, text in version_literals(parse(path)) if (module, text) not in VERSION_ALLOWED]
    assert problems == []


def test_the_version_finder_finds_versions_tags_and_digests() -> None:
    planted = ast.parse('''"""Read at v1.34.5 (a docstring: left out)."""
IMAGE = "registry.k8s.io/coredns/coredns:v1.12.1"
DIGEST = "sha256:3c54348fe5a57e5700e7d8068e7531d2ef2d5f3ccb70c8f6bac0953432527abd"
RELEASE = "v0.34.7"
BARE = "1.35.2"
PLAIN = ("10.0.0.0/16", "0.001", "100Mi", "apps/v1", "https://10.0.0.4:6443", "v1beta1", "/etc/nccl.conf")
''')
    assert [text for _, text in version_literals(planted)] == [
        "registry.k8s.io/coredns/coredns:v1.12.1",
        "sha256:3c54348fe5a57e5700e7d8068e7531d2ef2d5f3ccb70c8f6bac0953432527abd",
        "v0.34.7", "1.35.2"]


def test_every_package_is_in_the_wheel() -> None:
    """pyproject lists the packages the wheel holds by name: a new package left off it imports
    in the checkout and fails only where users install kilonode (the slow packaging test)."""
    import tomllib

    assert REPO_ROOT is not None
    listed = set(tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    root = REPO_ROOT / "infra"
    packages = {".".join(init.parent.relative_to(root).parts) for init in (root / "kilonode").rglob("__init__.py")
                if "__pycache__" not in init.parts}
    assert packages - listed == set(), "add these to [tool.setuptools] packages in pyproject.toml"
