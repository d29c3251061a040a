"""The twentieth independent trace of `kilonode diff` on research-7500: a ClusterRoleBinding of a
group to the built-in ClusterRole `edit` reviewed as "No risk found", since the catalogue of the
apiserver's own roles (kilonode/catalog/rbac.yaml) kept edit with its aggregationRule only and so
with no rules. It now carries the rules kube-controller-manager's clusterrole-aggregation
controller writes into admin, edit and view (kubernetes/kubernetes plugin/pkg/auth/authorizer/rbac/
bootstrappolicy/testdata/cluster-roles.yaml, and pkg/controller/clusterroleaggregation). Each
boundary is the shipped stack changed in memory (tests.review.snapshots), with a quiet control."""

from __future__ import annotations

from typing import Any

import pytest

from kilonode.catalog.rbac import builtin_rbac
from kilonode.review.compare import compare_stack
from tests.review.snapshots import snapshot

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

STACK = "research-7500"
RBAC = "kubernetes:rbac.authorization.k8s.io/v1:"
GROUP = "ml-platform"
TEAM = "ml-team"  # a team namespace: the rule reads the binding's namespace, not whether it exists


def _risks(head: dict[str, Any]) -> list[Any]:
    from kilonode.review import risks
    return risks.assess(compare_stack(STACK, snapshot(STACK), head), {})


def _escalations(head: dict[str, Any]) -> list[Any]:
    return [r for r in _risks(head) if r.rule == "rbac-escalation"]


def _bind(head: dict[str, Any], role: str, namespace: str = "") -> None:
    """A binding of Group ml-platform to the built-in ClusterRole `role`, in the recorded graph's
    shape (the snapshot's own ClusterRoleBindings): cluster-wide, or a RoleBinding in `namespace`."""
    kind = "RoleBinding" if namespace else "ClusterRoleBinding"
    meta: dict[str, Any] = {"labels": {"app.kubernetes.io/managed-by": "kilonode"}, "name": f"{GROUP}-{role}"}
    if namespace:
        meta["namespace"] = namespace
    head["resources"].append({
        "type": f"{RBAC}{kind}", "name": f"{STACK}-{GROUP}-{role}", "parent": STACK, "protect": False,
        "custom": True, "deleteBeforeReplace": False, "replaceOnChanges": [], "ignoreChanges": [],
        "inputs": {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind, "metadata": meta,
                   "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
                   "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": GROUP}]}})


def test_edit_bound_to_a_group_cluster_wide_is_high() -> None:
    head = snapshot(STACK)
    _bind(head, "edit")
    [found] = _escalations(head)
    assert found.level == "high"
    said = found.summary
    assert f"Group {GROUP}" in said and "cluster-wide" in said and "ClusterRole edit" in said
    # the catalogue's escalations (catalog/escalations.yaml) edit gives everywhere it is bound
    for title in ("Secrets get/list/watch", "pods/exec, pods/attach or pods/ephemeralcontainers",
                  "workload creation", "impersonate", "serviceaccounts/token create",
                  "ConfigMap writes in kube-system"):
        assert f"{title} cluster-wide" in said, title
    assert "a wildcard verb or resource" not in said and "escalate or bind" not in said
    assert f"{STACK}-{GROUP}-edit" in found.subjects


def test_cluster_admin_bound_cluster_wide_is_high() -> None:
    head = snapshot(STACK)
    _bind(head, "cluster-admin")
    [found] = _escalations(head)
    assert found.level == "high" and "ClusterRole cluster-admin" in found.summary
    for title in ("a wildcard verb or resource", "Secrets get/list/watch", "nodes/proxy", "escalate or bind"):
        assert f"{title} cluster-wide" in found.summary, title


def test_admin_bound_cluster_wide_adds_roles_and_bindings_write() -> None:
    """admin is edit plus roles and rolebindings: no escalate or bind verb, so that escalation is not
    named (a binding created is still checked against the creator's own rights), edit's are."""
    head = snapshot(STACK)
    _bind(head, "admin")
    [found] = _escalations(head)
    assert found.level == "high" and "Secrets get/list/watch cluster-wide" in found.summary
    assert "escalate or bind" not in found.summary


def test_view_bound_cluster_wide_stays_quiet() -> None:
    """Control: view reads no Secret, no pods/exec, writes nothing (rbac.md "User-facing roles")."""
    head = snapshot(STACK)
    _bind(head, "view")
    assert not _escalations(head)


def test_edit_bound_in_one_team_namespace_is_judged_at_that_scope() -> None:
    """A RoleBinding of edit counts in its namespace only. escalations.yaml scopes secrets-read,
    workload-create and system-configmaps-write to cluster and kube-system (Secrets and pods of a
    team's own namespace are that team's), so those stay unnamed; pods/exec, impersonate and
    serviceaccounts/token create count in any scope ("*"): the group can take over any
    ServiceAccount of ml-team, which is still high (each such ServiceAccount's rights, cluster-wide
    ones included, become the group's)."""
    head = snapshot(STACK)
    _bind(head, "edit", TEAM)
    [found] = _escalations(head)
    assert found.level == "high"
    said = found.summary
    for title in ("pods/exec, pods/attach or pods/ephemeralcontainers", "impersonate", "serviceaccounts/token create"):
        assert f"{title} in namespace {TEAM}" in said, title
    assert "Secrets get/list/watch" not in said and "workload creation" not in said
    assert "cluster-wide" not in said


def test_edit_bound_in_kube_system_names_secrets_and_workloads() -> None:
    head = snapshot(STACK)
    _bind(head, "edit", "kube-system")
    [found] = _escalations(head)
    for title in ("Secrets get/list/watch", "workload creation", "ConfigMap writes in kube-system"):
        assert f"{title} in namespace kube-system" in found.summary, title


def _rule_set(role: dict[str, Any]) -> set[str]:
    return {repr(sorted((k, tuple(v)) for k, v in r.items())) for r in role.get("rules") or []}


def test_the_user_facing_roles_carry_their_aggregation() -> None:
    """admin, edit and view hold the union of the rules of every catalogue ClusterRole their
    aggregationRule selects, as the clusterrole-aggregation controller writes it."""
    roles = {r["metadata"]["name"]: r for r in builtin_rbac().cluster_roles}
    for name in ("admin", "edit", "view"):
        [selector] = roles[name]["aggregationRule"]["clusterRoleSelectors"]
        labels = selector["matchLabels"]
        union: set[str] = set()
        for other, role in roles.items():
            have = (role.get("metadata") or {}).get("labels") or {}
            if other != name and all(have.get(k) == v for k, v in labels.items()):
                union |= _rule_set(role)
        assert _rule_set(roles[name]) == union, name
    assert not any("secrets" in r["resources"] for r in roles["view"]["rules"])
