"""The component tree: one component per subsystem, children parented and named from it."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pulumi
import pytest

from kilonode.azure.graph import Graph
from kilonode.paths import REPO_ROOT
from kilonode.plan import ClusterPlan
from tests.source import parse

COMPONENTS = {"Cluster", "Network", "Tls", "NodeImage", "EtcdCluster", "ControlPlane", "GpuNodePool",
              "ControllerIdentities", "EtcdBackup", "JoinWaves", "SshKeys", "EgressAlerts"}

# Resources ARM takes at `global` whatever region they watch (kilonode.azure.egress_alerts)
GLOBAL_TYPES = ("azure-native:monitor:MetricAlert", "azure-native:monitor:ActionGroup")


def test_the_tree_is_cluster_then_one_component_per_subsystem(graph_7500: Graph) -> None:
    roots = [(r.type, r.name) for r in graph_7500.resources if r.parent is None]
    # The Azure side, then the in-cluster side on its outputs.
    assert roots == [("kilonode:azure:Cluster", "research-7500"), ("kilonode:k8s:InCluster", "research-7500-k8s")]
    root = graph_7500.named("research-7500")
    children = graph_7500.children(root.name)
    assert all(c.type.startswith("kilonode:azure:") and not c.custom for c in children)
    assert {c.type.rsplit(":", 1)[1] for c in children} == COMPONENTS - {"Cluster"}
    assert sorted(c.name for c in children if c.type.endswith(":EtcdCluster")) == [
        "research-7500-etcd-events", "research-7500-etcd-main"]


def test_every_resource_is_parented_to_a_component_and_named_from_it(graph_7500: Graph) -> None:
    components = {r.name for r in graph_7500.resources if not r.custom}
    for r in graph_7500.resources:
        if r.parent is None:
            continue
        assert r.parent in components, r.name
        assert r.name.startswith(f"{r.parent}-"), f"{r.name} not named from {r.parent}"


def test_resource_names_are_unique(graph_7500: Graph) -> None:
    names = [r.name for r in graph_7500.resources]
    assert len(names) == len(set(names))


@pytest.mark.parametrize("stack", ["local", "research-2500", "research-7500"])
def test_every_azure_resource_is_in_the_plans_location(
    graphs: dict[str, Graph], plans: dict[str, ClusterPlan], stack: str
) -> None:
    graph, location = graphs[stack], plans[stack].location
    for r in graph.resources:
        if r.type in GLOBAL_TYPES:  # Azure Monitor's alert rules and action groups: `global` only
            assert r.inputs["location"] == "global", r.name
        elif "location" in r.inputs:
            assert r.inputs["location"] == location, r.name


def _imported(tree: ast.Module) -> dict[str, object]:
    """Names the module imports, resolved to their objects (what cannot be imported is left out)."""
    found: dict[str, object] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                try:
                    module = importlib.import_module(node.module)
                    found[alias.asname or alias.name] = getattr(module, alias.name)
                except (ImportError, AttributeError):
                    continue
        elif isinstance(node, ast.Import):
            for alias in node.names:
                try:
                    found[alias.asname or alias.name] = importlib.import_module(alias.name)
                except ImportError:
                    continue
    return found


def _creates_a_resource(func: ast.expr, imported: dict[str, object]) -> str | None:
    """The called name when the call may build a Pulumi resource: a class that subclasses
    pulumi.Resource where the import resolves it, else any capitalised name (unknown: suspect)."""
    if isinstance(func, ast.Attribute):
        name, owner = func.attr, imported.get(func.value.id) if isinstance(func.value, ast.Name) else None
        target = getattr(owner, name, None) if owner is not None else None
    else:
        name = getattr(func, "id", "")
        target = imported.get(name)
    if not name[:1].isupper():
        return None
    if isinstance(target, type):
        return name if issubclass(target, pulumi.Resource) else None
    return name


def _apply_bodies_create_resources(path: Path) -> list[str]:
    """Names of lambdas/functions passed to .apply(...) that construct a Pulumi resource."""
    tree = parse(path)
    imported = _imported(tree)
    defs = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "apply":
            for arg in node.args:
                # a lambda, or a function defined in the module and passed by name
                body = defs.get(arg.id, arg) if isinstance(arg, ast.Name) else arg
                # `raise SomeError(...)` builds an exception, not a resource
                raised = {id(n.exc) for n in ast.walk(body) if isinstance(n, ast.Raise)}
                for inner in ast.walk(body):
                    if isinstance(inner, ast.Call) and id(inner) not in raised:
                        name = _creates_a_resource(inner.func, imported)
                        if name:
                            found.append(f"{path.name}:{inner.lineno} {name}")
    return found


def test_no_resource_is_created_inside_an_apply() -> None:
    # Resources made in apply callbacks are invisible to preview, and so to review.
    offenders = [hit for path in sorted((REPO_ROOT / "infra" / "kilonode" / "azure").glob("*.py"))
                 for hit in _apply_bodies_create_resources(path)]
    assert offenders == []


def test_the_apply_check_finds_resources_made_in_a_lambda_or_a_named_function(tmp_path: Path) -> None:
    module = tmp_path / "bad.py"
    module.write_text(
        "def make(ip):\n"
        "    if not ip:\n"
        "        raise ValueError('no ip')\n"
        "    return network.Subnet('s', address_prefix=ip)\n"
        "\n"
        "\n"
        "def build(vnet):\n"
        "    vnet.ip.apply(make)\n"
        "    vnet.name.apply(lambda n: compute.VirtualMachine(n, vm_name=n.upper()))\n"
    )
    assert _apply_bodies_create_resources(module) == ["bad.py:4 Subnet", "bad.py:9 VirtualMachine"]
    # where the import resolves the name, a plain value object is not a resource; a resource is
    resolved = tmp_path / "resolved.py"
    resolved.write_text(
        "from pathlib import Path\n"
        "from pulumi_azure_native import network\n"
        "def build(vnet):\n"
        "    vnet.name.apply(lambda n: Path(n))\n"
        "    vnet.ip.apply(lambda ip: network.Subnet('s', address_prefix=ip))\n"
    )
    assert _apply_bodies_create_resources(resolved) == ["resolved.py:5 Subnet"]
