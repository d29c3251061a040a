"""node-writers: every DaemonSet whose token may write Nodes is held to its own Node by the
node-identity policy, and that policy fails closed on updates; each with a break planted in a
copy of a shipped stack's graph."""

from __future__ import annotations

from typing import Any

import pytest

from kilonode.preflight import breaks, run
from kilonode.preflight.model import Finding
from tests.preflight.conftest import artefacts, inputs_of, resource

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

STACK = "research-7500"
POLICY = "kilonode-node-identity"
CALICO = "system:serviceaccount:kube-system:calico-node"


def writer_breaks(graph: dict[str, Any] | None = None, stack: str = STACK) -> list[Finding]:
    return breaks(run(inputs_of(stack, graph=graph), ["node-writers"]))


def policy(graph: dict[str, Any]) -> dict[str, Any]:
    [found] = [r["inputs"] for r in graph["resources"] if r["type"].endswith(":ValidatingAdmissionPolicy")
               and r["inputs"]["metadata"]["name"] == POLICY]
    return found


@pytest.mark.parametrize("stack", ["local", STACK])
def test_the_shipped_stacks_hold_every_node_writer(stack: str) -> None:
    assert writer_breaks(stack=stack) == []


def test_an_agent_the_policy_does_not_name_is_a_break() -> None:
    _, graph = artefacts(STACK)
    for validation in policy(graph)["spec"]["validations"]:
        validation["expression"] = validation["expression"].replace(f"'{CALICO}'", "'someone-else'")
    [finding] = writer_breaks(graph)
    assert finding.where == "DaemonSet kube-system/calico-node" and CALICO in finding.what


def test_a_new_daemonset_account_that_may_patch_nodes_is_a_break() -> None:
    """Seeded: the device plugin's ServiceAccount bound to cloud-node-manager's ClusterRole."""
    _, graph = artefacts(STACK)
    spec = resource(graph, "DaemonSet", "nvidia-device-plugin-daemonset")["inputs"]["spec"]["template"]["spec"]
    spec["automountServiceAccountToken"] = True
    account = spec.get("serviceAccountName") or "default"
    graph["resources"].append({
        "type": "kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding", "name": "planted", "parent": None,
        "protect": False, "replaceOnChanges": [],
        "inputs": {"metadata": {"name": "planted"},
                   "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                               "name": "kilonode:cloud-node-manager"},
                   "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": "kube-system"}]}})
    [finding] = writer_breaks(graph)
    assert finding.where == "DaemonSet kube-system/nvidia-device-plugin-daemonset"
    # without a token in its pods it writes nothing: no break
    spec["automountServiceAccountToken"] = False
    assert writer_breaks(graph) == []


@pytest.mark.parametrize(("plant", "expected"), [
    (lambda p: p["spec"].__setitem__("failurePolicy", "Ignore"), "failurePolicy is Ignore"),
    (lambda p: p["spec"]["matchConstraints"]["resourceRules"][0].__setitem__("operations", ["CREATE"]),
     "of nodes, nodes/status is not matched"),
    (lambda p: p["spec"]["matchConstraints"]["resourceRules"][0].__setitem__("resources", ["nodes"]),
     "of nodes/status is not matched"),
])
def test_a_policy_that_does_not_bite_is_a_break(plant: Any, expected: str) -> None:
    _, graph = artefacts(STACK)
    plant(policy(graph))
    [finding] = writer_breaks(graph)
    assert expected in finding.what


def test_a_policy_bound_only_to_warn_or_missing_is_a_break() -> None:
    _, graph = artefacts(STACK)
    [binding] = [r["inputs"] for r in graph["resources"] if r["type"].endswith(":ValidatingAdmissionPolicyBinding")
                 and r["inputs"]["spec"]["policyName"] == POLICY]
    binding["spec"]["validationActions"] = ["Warn"]
    [finding] = writer_breaks(graph)
    assert "no binding denies" in finding.what
    graph["resources"] = [r for r in graph["resources"] if not r["type"].endswith(":ValidatingAdmissionPolicy")
                          or r["inputs"]["metadata"]["name"] != POLICY]
    found = writer_breaks(graph)
    assert any(f"no ValidatingAdmissionPolicy {POLICY}" in f.what for f in found)
    assert {f.where for f in found} >= {"DaemonSet kube-system/cloud-node-manager", "DaemonSet kube-system/calico-node"}


def _template(graph: dict[str, Any], name: str) -> dict[str, Any]:
    return resource(graph, "Deployment", name)["inputs"]["spec"]["template"]["spec"]


@pytest.mark.parametrize("name", ["kilonode-gang-scheduler", "kilonode-gang-controller", "cluster-autoscaler",
                                  "cloud-controller-manager"])
def test_a_controller_that_only_prefers_the_system_pool_is_a_break(name: str) -> None:
    """Independent trace of issue 37, round 4: the gang scheduler only preferred the system pool,
    so its token (bind, delete, update every pod; patch Nodes) could land on a GPU node."""
    _, graph = artefacts(STACK)
    _template(graph, name)["affinity"]["nodeAffinity"].pop("requiredDuringSchedulingIgnoredDuringExecution")
    [finding] = writer_breaks(graph)
    assert finding.where == f"Deployment kube-system/{name}" and "controller pools" in finding.what


@pytest.mark.parametrize("values", [["system", "h100-ib"], ["h100-ib"]])
def test_a_required_term_that_admits_a_user_pool_is_a_break(values: list[str]) -> None:
    _, graph = artefacts(STACK)
    required = _template(graph, "kilonode-gang-scheduler")["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]
    required["nodeSelectorTerms"][0]["matchExpressions"][0]["values"] = values
    [finding] = writer_breaks(graph)
    assert finding.where == "Deployment kube-system/kilonode-gang-scheduler"
    # a second, unrestricted alternative term is as bad
    required["nodeSelectorTerms"] = [{"matchExpressions": [{"key": "kilonode.io/pool", "operator": "In",
                                                            "values": ["system"]}]},
                                     {"matchExpressions": [{"key": "kubernetes.io/os", "operator": "In",
                                                            "values": ["linux"]}]}]
    assert [f.where for f in writer_breaks(graph)] == ["Deployment kube-system/kilonode-gang-scheduler"]


def test_a_stack_whose_controllers_share_nodes_with_users_is_a_break(write_stack: Any) -> None:
    """Independent trace of issue 37, round 6, finding 1: research-7500 without `system: true` was
    accepted and passed preflight, with the autoscaler's identity (scale-set write) and the gang
    scheduler's token on the shared pool beside users' pods."""
    from kilonode.config import load_stack
    from kilonode.plan import plan_stack
    from kilonode.preflight.load import from_parts
    from tests.azure.conftest import recorded
    from tests.conftest import shipped_cluster_value

    cluster = shipped_cluster_value(STACK)
    next(p for p in cluster["nodePools"] if p.get("system")).pop("system")
    stack = load_stack(str(write_stack(cluster, STACK)))
    files, _ = artefacts(STACK)  # the render is not read by this check
    inputs = from_parts(plan_stack(stack), files, recorded(stack).to_json(), source="no system pool")
    found = [f for f in breaks(run(inputs, ["node-writers"])) if f.where == "stack: nodePools"]
    assert len(found) == 1 and "autoscaled pools" in found[0].what and "system: true" in found[0].fix
    # the shipped local stack (one shared pool, no autoscaling, no teams) is accepted, as designed
    assert writer_breaks(stack="local") == []


def test_a_large_stack_whose_system_pool_is_a_plain_shared_pool_is_a_break(write_stack: Any) -> None:
    """Independent trace of issue 37, round 9: research-2500 with its system pool made a plain CPU
    pool passed (no autoscaling, no teams), with the controllers' tokens and the cloud identity on
    the pool users share, beside 2,500 GPU nodes."""
    from kilonode.config import load_stack
    from kilonode.plan import plan_stack
    from kilonode.preflight.load import from_parts
    from tests.azure.conftest import recorded
    from tests.conftest import shipped_cluster_value

    cluster = shipped_cluster_value("research-2500")
    pool = next(p for p in cluster["nodePools"] if p.get("system"))
    pool.pop("system")
    pool["name"] = "cpu"
    stack = load_stack(str(write_stack(cluster, "research-2500")))
    files, _ = artefacts("research-2500")
    inputs = from_parts(plan_stack(stack), files, recorded(stack).to_json(), source="plain shared pool")
    found = [f for f in breaks(run(inputs, ["node-writers"])) if f.where == "stack: nodePools"]
    assert len(found) == 1 and "3 pools with GPUs" in found[0].what
