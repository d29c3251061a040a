"""The per-node agents' tokens are held to their own Node (kilonode.k8s.node_agents): the CEL of
the node-identity policy evaluated with cel-python on the writes issue 37 names (another node
tainted, cordoned, re-addressed; a token bound to no pod) and on each agent's honest writes, read
from upstream at the pinned tags."""

from __future__ import annotations

from typing import Any

import celpy
import pytest

from kilonode.azure.graph import Graph
from kilonode.k8s.admission import NODE_NAME_EXTRA
from kilonode.k8s.capacity import node_identity_rules
from kilonode.k8s.node_agents import AGENT_USERS, NODE_SPEC_RULE, OWN_NODE_RULE
from kilonode.plan import ClusterPlan

CNM = "system:serviceaccount:kube-system:cloud-node-manager"
CALICO = "system:serviceaccount:kube-system:calico-node"
UNINITIALIZED = {"key": "node.cloudprovider.kubernetes.io/uninitialized", "value": "true", "effect": "NoSchedule"}
GPU_HEALTH = {"key": "kilonode.io/gpu-health", "effect": "NoSchedule"}
TEAM = {"key": "kilonode.io/team", "value": "vision", "effect": "NoSchedule"}
ADDRESSES = [{"type": "InternalIP", "address": "10.1.0.4"}, {"type": "Hostname", "address": "gpu-a"}]


def node(name: str = "gpu-a", taints: list[dict[str, str]] | None = None, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {}},
            "spec": {**({"taints": taints} if taints is not None else {}), **spec},
            "status": {"addresses": ADDRESSES}}


@pytest.fixture(scope="module")
def rules() -> dict[str, Any]:
    env = celpy.Environment()
    return {text: env.program(env.compile(text)) for text in (OWN_NODE_RULE, NODE_SPEC_RULE)}


def admitted(rules: dict[str, Any], old: dict[str, Any], new: dict[str, Any], user: str = CNM,
             on: str | None = "gpu-a", operation: str = "UPDATE") -> bool:
    """Both agent rules admit the write (`on`: the node its token's pod runs on, None: no pod)."""
    extra = {NODE_NAME_EXTRA: [on]} if on else {}
    # the pod-bound token's other extras, as the authenticator sets them beside the node's
    pod = {"authentication.kubernetes.io/pod-name": ["p"], "authentication.kubernetes.io/pod-uid": ["u"]}
    extra |= pod if on else {}
    activation = {"object": celpy.json_to_cel(new), "oldObject": celpy.json_to_cel(old),
                  "request": celpy.json_to_cel({"operation": operation,
                                                "userInfo": {"username": user, "extra": extra}})}
    return all(bool(rule.evaluate(activation)) for rule in rules.values())


@pytest.mark.parametrize("user", AGENT_USERS)
def test_an_agent_writes_only_the_node_its_pod_runs_on(rules: dict[str, Any], user: str) -> None:
    other = node("gpu-b", [GPU_HEALTH])
    assert admitted(rules, node(), node(), user)
    assert not admitted(rules, other, other, user)  # its token, another node
    assert not admitted(rules, node(), node(), user, on=None)  # a token bound to no pod (a Secret's)
    assert not admitted(rules, node(), node(), user, on="gpu-a-")  # a node whose name begins like it
    assert not admitted(rules, {}, node(), user, operation="CREATE")  # no agent registers a Node


def test_cloud_node_manager_initializes_and_addresses_its_node(rules: dict[str, Any]) -> None:
    """nodemanager.go initializeNode: providerID where empty, cloud labels, the uninitialized taint
    lifted; updateNodeAddress: status.addresses."""
    old = node(taints=[GPU_HEALTH, UNINITIALIZED, TEAM])
    new = node(taints=[GPU_HEALTH, TEAM], providerID="azure:///subscriptions/s/x")
    new["metadata"]["labels"] = {"topology.kubernetes.io/zone": "eastus-1"}
    assert admitted(rules, old, new)
    moved = node(taints=[GPU_HEALTH, TEAM])
    moved["status"]["addresses"] = [{"type": "InternalIP", "address": "10.9.9.9"}]
    assert admitted(rules, node(taints=[GPU_HEALTH, TEAM]), moved)  # its own node's addresses are its to set


@pytest.mark.parametrize("user", AGENT_USERS)
def test_an_agent_cannot_taint_cordon_or_untaint_even_its_own_node(rules: dict[str, Any], user: str) -> None:
    old = node(taints=[GPU_HEALTH, TEAM])
    no_execute = {"key": "evict", "effect": "NoExecute"}
    assert not admitted(rules, old, node(taints=[GPU_HEALTH, TEAM, no_execute]), user)  # a taint added
    assert not admitted(rules, old, node(taints=[TEAM]), user)  # the GPU health taint stripped
    assert not admitted(rules, old, node(taints=[GPU_HEALTH]), user)  # the team's taint stripped
    assert not admitted(rules, old, node(taints=[GPU_HEALTH, {**TEAM, "value": "language"}]), user)  # changed
    assert not admitted(rules, old, node(taints=[GPU_HEALTH, TEAM], unschedulable=True), user)  # cordoned
    cordoned = node(taints=[GPU_HEALTH, TEAM], unschedulable=True)
    assert not admitted(rules, cordoned, node(taints=[GPU_HEALTH, TEAM]), user)  # uncordoned
    assert not admitted(rules, old, node(taints=[GPU_HEALTH, TEAM, UNINITIALIZED]), user)  # the cloud's taint added
    set_id = node(taints=[GPU_HEALTH, TEAM], providerID="azure:///a")
    assert not admitted(rules, set_id, node(taints=[GPU_HEALTH, TEAM], providerID="azure:///b"), user)


def test_only_cloud_node_manager_lifts_the_uninitialized_taint(rules: dict[str, Any]) -> None:
    old = node(taints=[UNINITIALIZED, GPU_HEALTH])
    assert admitted(rules, old, node(taints=[GPU_HEALTH]), CNM)
    assert not admitted(rules, old, node(taints=[GPU_HEALTH]), CALICO)
    assert not admitted(rules, old, node(taints=[GPU_HEALTH], providerID="azure:///a"), CALICO)
    assert admitted(rules, old, node(taints=[UNINITIALIZED, GPU_HEALTH]), CALICO)  # status, annotations


def test_administrators_and_controllers_are_not_held_by_the_agent_rules(rules: dict[str, Any]) -> None:
    old, new = node("gpu-b", [GPU_HEALTH]), node("gpu-b", [], unschedulable=True)
    for user in ("kilonode-admin", "system:serviceaccount:kube-system:kilonode-gpu-health",
                 "system:serviceaccount:kube-system:cluster-autoscaler"):
        assert admitted(rules, old, new, user, on=None)


def test_the_policy_carries_the_agent_rules_and_fails_closed_on_updates(
    graphs: dict[str, Graph], plans: dict[str, ClusterPlan]
) -> None:
    [policy] = [r.plain() for r in graphs["research-7500"].resources if r.type.endswith(":ValidatingAdmissionPolicy")
                and r.plain()["metadata"]["name"] == "kilonode-node-identity"]
    expressions = [v["expression"] for v in policy["spec"]["validations"]]
    assert expressions == [rule for rule, _ in node_identity_rules(plans["research-7500"])]
    assert OWN_NODE_RULE in expressions and NODE_SPEC_RULE in expressions
    assert policy["spec"]["failurePolicy"] == "Fail"
    [match] = policy["spec"]["matchConstraints"]["resourceRules"]
    assert "UPDATE" in match["operations"] and match["resources"] == ["nodes", "nodes/status"]
