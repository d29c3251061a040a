"""Every namespace's `default` ServiceAccount mounts no token (CIS 5.1.5,
kilonode.k8s.service_accounts), and nothing kilonode deploys relies on that token."""

from __future__ import annotations

from typing import Any

import pytest

from kilonode.azure.graph import Graph
from kilonode.k8s.service_accounts import BUILT_IN_NAMESPACES
from tests.security.cis_audit import objects, pods
from tests.security.test_cis import _check, outcomes
from tests.shared import SHIPPED_STACKS

PATCH = "kubernetes:core/v1:ServiceAccountPatch"
NAMESPACE = "kubernetes:core/v1:Namespace"


def default_account_patches(graph: Graph) -> dict[str, Any]:
    return {r.plain()["metadata"]["namespace"]: r for r in graph.resources
            if r.type == PATCH and r.plain()["metadata"]["name"] == "default"}


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_every_namespace_default_account_has_automount_off_after_its_namespace(
    graphs: dict[str, Graph], stack: str,
) -> None:
    graph = graphs[stack]
    created = {r.plain()["metadata"]["name"]: r.name for r in graph.resources if r.type == NAMESPACE}
    patches = default_account_patches(graph)
    assert set(patches) == {*BUILT_IN_NAMESPACES, *created}
    for namespace, record in patches.items():
        assert record.plain()["automountServiceAccountToken"] is False, namespace
        if namespace in created:  # applied after kilonode creates the namespace, not before
            assert created[namespace] in record.depends_on, namespace


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_no_kilonode_pod_or_binding_relies_on_a_default_accounts_token(graphs: dict[str, Graph], stack: str) -> None:
    graph = graphs[stack]
    for namespace, name, spec in pods(graph):
        if spec.get("serviceAccountName", "default") == "default":
            # it says so itself as well: no token, whatever its account says
            assert spec.get("automountServiceAccountToken") is False, (namespace, name)
    for binding in objects(graph):
        if binding.get("kind") in ("RoleBinding", "ClusterRoleBinding"):
            named = [s for s in binding.get("subjects") or [] if s["kind"] == "ServiceAccount"]
            assert all(s["name"] != "default" for s in named), binding["metadata"]["name"]


def test_a_namespace_left_unpatched_fails_5_1_5(graphs: dict[str, Graph]) -> None:
    graph = graphs["local"]
    assert outcomes("local", graph, [_check("5.1.5")])[0].state == "pass"
    kept = [r for r in graph.resources if not (r.type == PATCH and r.plain()["metadata"]["namespace"] == "kube-public")]
    assert len(kept) == len(graph.resources) - 1
    failed = outcomes("local", Graph(stack=graph.stack, resources=kept), [_check("5.1.5")])[0]
    assert failed.state == "fail"
