"""agent-writes: every cluster-wide write a DaemonSet's token holds is matched by a fail-closed,
deny-bound admission policy that names its account; each with a break planted in a copy of a
shipped stack's graph."""

from __future__ import annotations

from typing import Any

import pytest

from kilonode.preflight import breaks, run
from kilonode.preflight.model import Finding
from tests.preflight.conftest import artefacts, inputs_of, resource

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

STACK = "research-7500"
POLICY = "kilonode-calico-node-writes"
CALICO = "system:serviceaccount:kube-system:calico-node"
WHERE = "DaemonSet kube-system/calico-node"


def write_breaks(graph: dict[str, Any] | None = None, stack: str = STACK) -> list[Finding]:
    return breaks(run(inputs_of(stack, graph=graph), ["agent-writes"]))


def policy(graph: dict[str, Any]) -> dict[str, Any]:
    return resource(graph, "ValidatingAdmissionPolicy", POLICY)["inputs"]


def calico_rules(graph: dict[str, Any]) -> list[dict[str, Any]]:
    return resource(graph, "ClusterRole", "calico-node")["inputs"]["rules"]


@pytest.mark.parametrize("stack", ["local", STACK])
def test_the_shipped_stacks_hold_every_agent_write(stack: str) -> None:
    assert write_breaks(stack=stack) == []


@pytest.mark.parametrize(("plant", "expected"), [
    # the policy names someone else
    (lambda g: policy(g)["spec"]["variables"][0].__setitem__("expression", "request.userInfo.username == 'x'"),
     "create crd.projectcalico.org/clusterinformations, update crd.projectcalico.org/clusterinformations"),
    (lambda g: policy(g)["spec"].__setitem__("failurePolicy", "Ignore"),
     "update crd.projectcalico.org/caliconodestatuses"),
    (lambda g: policy(g)["spec"]["matchConstraints"]["resourceRules"][0]["resources"].remove("tiers"),
     "may create crd.projectcalico.org/tiers cluster-wide"),
    (lambda g: policy(g)["spec"]["matchConstraints"]["resourceRules"][0].__setitem__("operations", ["CREATE"]),
     "may update crd.projectcalico.org/caliconodestatuses, update crd.projectcalico.org/clusterinformations"),
    (lambda g: next(r for r in g["resources"] if r["type"].endswith(":ValidatingAdmissionPolicyBinding")
                    and r["inputs"]["spec"]["policyName"] == POLICY)["inputs"]["spec"].__setitem__(
        "validationActions", ["Warn"]), "create crd.projectcalico.org/tiers"),
    # upstream's pods/status patch, for a Calico CNI plugin that does not run here
    (lambda g: calico_rules(g).append({"apiGroups": [""], "resources": ["pods/status"], "verbs": ["patch"]}),
     "may patch pods/status cluster-wide"),
])
def test_a_write_no_biting_policy_holds_is_a_break(plant: Any, expected: str) -> None:
    _, graph = artefacts(STACK)
    plant(graph)
    [finding] = write_breaks(graph)
    assert finding.where == WHERE and CALICO in finding.what and expected in finding.what, finding.what


@pytest.mark.parametrize(("rule", "expected"), [
    ({"apiGroups": ["crd.projectcalico.org"], "resources": ["*"], "verbs": ["update"]}, "a wildcard"),
    ({"apiGroups": ["crd.projectcalico.org"], "resources": ["tiers"], "verbs": ["delete"]}, "a delete"),
])
def test_a_wildcard_or_a_delete_is_a_break_in_itself(rule: dict[str, Any], expected: str) -> None:
    _, graph = artefacts(STACK)
    calico_rules(graph).append(rule)
    [finding] = write_breaks(graph)
    assert finding.where == WHERE and expected in finding.what


def test_a_daemonset_without_a_token_writes_nothing() -> None:
    """Seeded: the device plugin's account bound to calico-node's role, with and without a token."""
    _, graph = artefacts(STACK)
    spec = resource(graph, "DaemonSet", "nvidia-device-plugin-daemonset")["inputs"]["spec"]["template"]["spec"]
    spec["automountServiceAccountToken"] = True
    account = spec.get("serviceAccountName") or "default"
    graph["resources"].append({
        "type": "kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding", "name": "planted", "parent": None,
        "protect": False, "replaceOnChanges": [],
        "inputs": {"metadata": {"name": "planted"},
                   "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "calico-node"},
                   "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": "kube-system"}]}})
    [finding] = write_breaks(graph)
    assert finding.where == "DaemonSet kube-system/nvidia-device-plugin-daemonset"
    spec["automountServiceAccountToken"] = False
    assert write_breaks(graph) == []
