"""NetworkPolicies of kilonode's own namespaces (kilonode.k8s.network_policy): each denies all
ingress to every pod by default, the balloons' namespace egress too, and the only rule let in
is Prometheus's port from its own namespace. And the plain fact that nothing enforces them:
the pools' CNI has no policy engine, and policy/security-exceptions.yaml must say so."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kilonode.azure.graph import Graph
from kilonode.k8s.network_policy import PROMETHEUS_PORT
from kilonode.paths import REPO_ROOT
from kilonode.render.cni import CONFLIST
from tests import shared

STACKS = list(shared.SHIPPED_STACKS)
# CNI plugins or daemons that implement NetworkPolicy on a node (Azure NPM chains none into the
# conflist, it runs as a DaemonSet; Cilium replaces the conflist): their names, either place.
POLICY_ENGINES = ("cilium", "azure-npm", "calico")


def policies(graph: Graph) -> list[dict[str, Any]]:
    return [r.plain() for r in graph.resources if r.type == "kubernetes:networking.k8s.io/v1:NetworkPolicy"]


def namespaces(graph: Graph) -> set[str]:
    return {r.plain()["metadata"]["name"] for r in graph.resources if r.type == "kubernetes:core/v1:Namespace"}


def default_denies(found: list[dict[str, Any]], namespace: str, direction: str) -> bool:
    """A policy of `namespace` selects every pod for `direction` and lets nothing in (out)."""
    key = "ingress" if direction == "Ingress" else "egress"
    return any(p["metadata"]["namespace"] == namespace and p["spec"]["podSelector"] == {}
               and direction in p["spec"]["policyTypes"] and not p["spec"].get(key) for p in found)


@pytest.mark.parametrize("stack", STACKS)
def test_every_namespace_kilonode_creates_denies_ingress_by_default(graphs: dict[str, Graph], stack: str) -> None:
    found = policies(graphs[stack])
    for namespace in namespaces(graphs[stack]):
        assert default_denies(found, namespace, "Ingress"), namespace
    if "kilonode-capacity" in namespaces(graphs[stack]):  # the balloons call nothing either
        assert default_denies(found, "kilonode-capacity", "Egress")
    # what is let in: Prometheus's port, from its own namespace
    rules = [(p["metadata"]["namespace"], rule) for p in found for rule in p["spec"].get("ingress", [])]
    assert rules == [("monitoring", {"from": [{"podSelector": {}}],
                                     "ports": [{"protocol": "TCP", "port": PROMETHEUS_PORT}]})]
    for policy in found:
        shared.validate_object(policy, "1.34.0")


def test_a_namespace_without_its_default_deny_is_caught(graphs: dict[str, Graph]) -> None:
    """Seeded break: the balloons' policy gone, or made to select only some pods."""
    found = policies(graphs["research-7500"])
    kept = [p for p in found if p["metadata"]["namespace"] != "kilonode-capacity"]
    assert not default_denies(kept, "kilonode-capacity", "Ingress")
    narrowed = json.loads(json.dumps(found))
    for p in narrowed:
        p["spec"]["podSelector"] = {"matchLabels": {"app": "x"}}
    assert not default_denies(narrowed, "monitoring", "Ingress")


@pytest.mark.parametrize("stack", STACKS)
def test_nothing_enforces_them_yet_and_the_exceptions_file_says_so(stack: str) -> None:
    """The pools run Azure CNI's azure-vnet alone, which does not implement NetworkPolicy: the
    day a policy engine joins the conflist or the cluster, this fails until the file says true."""
    exceptions = shared.load_yaml((REPO_ROOT / "policy/security-exceptions.yaml").read_text())
    for host, files in shared.rendered(stack).items():
        if CONFLIST in files:
            plugins = [p["type"] for p in json.loads(files[CONFLIST].content)["plugins"]]
            assert not any(engine in t for t in plugins for engine in POLICY_ENGINES), (host, plugins)
            assert plugins[0] == "azure-vnet", (host, plugins)
    assert exceptions["networkPolicyEnforced"] is False
