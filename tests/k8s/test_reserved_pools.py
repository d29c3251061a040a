"""The reserved pools (kilonode.k8s.reserved_pools): the system pools and the Prometheus pool
hold the system namespaces' pods alone. The policy's CEL is evaluated with cel-python against the
scheduler's own toleration rule (kilonode.preflight.placement.tolerates, core/v1
Toleration.ToleratesTaint), over every toleration shape that could reach such a pool."""

from __future__ import annotations

import itertools
from typing import Any

import celpy
import pytest

from kilonode.azure.graph import Graph
from kilonode.k8s.reserved_pools import POLICY_NAME, reserved_pool_rule
from kilonode.plan import ClusterPlan
from kilonode.plan.listeners import keeping_taints, reserved_pools
from kilonode.preflight.placement import Taint, tolerates
from tests import shared

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

SYSTEM_TAINT = ("CriticalAddonsOnly", "true", "NoSchedule")
MONITORING_TAINT = ("dedicated", "monitoring", "NoSchedule")


def policy_objects(graph: Graph) -> dict[str, dict[str, Any]]:
    """kind -> the object, for the reserved-pools policy and its binding."""
    return {r.type.rsplit(":", 1)[1]: r.plain() for r in graph.resources
            if r.type.endswith((":ValidatingAdmissionPolicy", ":ValidatingAdmissionPolicyBinding"))
            and r.plain()["metadata"]["name"] == POLICY_NAME}


@pytest.fixture(scope="module")
def rule() -> Any:
    text = reserved_pool_rule(shared.plan("research-7500"))
    assert text is not None
    env = celpy.Environment()
    return env.program(env.compile(text))


def admitted(rule: Any, spec: dict[str, Any], namespace: str = "research") -> bool:
    return bool(rule.evaluate({
        "object": celpy.json_to_cel({"apiVersion": "v1", "kind": "Pod", "spec": spec}),
        "request": celpy.json_to_cel({"namespace": namespace, "operation": "CREATE"}),
    }))


def test_the_large_stacks_reserve_their_system_and_prometheus_pools_and_local_none(
        graphs: dict[str, Graph], plans: dict[str, ClusterPlan]) -> None:
    for stack in ("research-2500", "research-7500"):
        plan = plans[stack]
        assert [p.name for p in reserved_pools(plan)] == ["system", "monitoring"]
        objects = policy_objects(graphs[stack])
        policy, binding = objects["ValidatingAdmissionPolicy"], objects["ValidatingAdmissionPolicyBinding"]
        [validation] = policy["spec"]["validations"]
        assert validation["expression"] == reserved_pool_rule(plan)
        assert "CriticalAddonsOnly=true:NoSchedule" in validation["message"]
        assert policy["spec"]["failurePolicy"] == "Fail"
        [resources] = policy["spec"]["matchConstraints"]["resourceRules"]
        # updates too: tolerations may be added to a running pod
        assert resources["resources"] == ["pods"] and resources["operations"] == ["CREATE", "UPDATE"]
        assert binding["spec"]["policyName"] == POLICY_NAME and binding["spec"]["validationActions"] == ["Deny"]
        for record in objects.values():
            shared.validate_object(record, f"1.{plan.kubernetes_minor}.0")
    # Prometheus on the local stack's one untainted pool: nothing to reserve, no policy
    assert reserved_pools(plans["local"]) == () and reserved_pool_rule(plans["local"]) is None
    assert policy_objects(graphs["local"]) == {}


# Every toleration field a pod may write, with values that match, miss, or leave it out.
KEYS = (None, "", "CriticalAddonsOnly", "dedicated", "other")
OPERATORS = (None, "Exists", "Equal")
VALUES = (None, "true", "monitoring", "x")
EFFECTS = (None, "", "NoSchedule", "NoExecute")


def shapes() -> list[dict[str, str]]:
    found = []
    for key, operator, value, effect in itertools.product(KEYS, OPERATORS, VALUES, EFFECTS):
        if operator == "Exists" and value not in (None, ""):
            continue  # the API refuses a value with Exists
        if not key and operator != "Exists":
            continue  # the API refuses an empty key unless the operator is Exists
        toleration = {k: v for k, v in (("key", key), ("operator", operator), ("value", value),
                                        ("effect", effect)) if v is not None}
        found.append(toleration)
    return found


def lands_on_a_reserved_pool(tolerations: list[dict[str, str]]) -> bool:
    """The scheduler's answer: some reserved pool has every one of its keeping taints tolerated."""
    pools = reserved_pools(shared.plan("research-7500"))
    for pool in pools:
        taints = [Taint(key=k, value=v, effect=e) for k, v, e in map(_parts, keeping_taints(pool))]
        if all(any(tolerates(t, taint) for t in tolerations) for taint in taints):
            return True
    return False


def _parts(taint: str) -> tuple[str, str, str]:
    key_value, _, effect = taint.rpartition(":")
    key, _, value = key_value.partition("=")
    return key, value, effect


def test_the_rule_refuses_exactly_the_tolerations_the_scheduler_would_place_on_a_reserved_pool(rule: Any) -> None:
    single = shapes()
    # each alone (every shape once: celpy takes ~50 ms an evaluation), and a few pairs
    cases = [[t] for t in single] + [[a, b] for a, b in itertools.combinations(single[::23], 2)]
    assert len(cases) > 120
    refused = [tolerations for tolerations in cases if lands_on_a_reserved_pool(tolerations)]
    for tolerations in cases:
        assert admitted(rule, {"tolerations": tolerations}) == (tolerations not in refused), tolerations
    assert 0 < len(refused) < len(cases)
    # the system namespaces' pods are never refused
    for tolerations in refused[:3]:
        assert admitted(rule, {"tolerations": tolerations}, namespace="kube-system")
        assert admitted(rule, {"tolerations": tolerations}, namespace="monitoring")


def test_the_common_shapes(rule: Any) -> None:
    everything = [{"operator": "Exists"}]
    assert not admitted(rule, {"tolerations": everything})  # a DaemonSet's usual "tolerate all"
    assert not admitted(rule, {"tolerations": [{"key": "CriticalAddonsOnly", "operator": "Exists"}]})
    assert not admitted(rule, {"tolerations": [{"key": "dedicated", "value": "monitoring", "effect": "NoSchedule"}]})
    assert admitted(rule, {"tolerations": [{"key": "dedicated", "value": "other"}]})
    assert admitted(rule, {"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}]})
    assert admitted(rule, {"tolerations": [{"operator": "Exists", "effect": "NoExecute"}]})  # NoSchedule still keeps
    assert admitted(rule, {"containers": []})


def test_a_pod_that_names_a_reserved_node_is_refused_and_any_other_node_admitted(
        rule: Any, plans: dict[str, ClusterPlan]) -> None:
    plan = plans["research-7500"]
    pools = {p.name: p for p in plan.node_pools}
    system = f"{pools['system'].shards[0].name}00000a"
    monitoring = f"{pools['monitoring'].shards[0].name}00000a"
    gpu = f"{pools['a100-ib'].shards[0].name}00000a"
    assert not admitted(rule, {"nodeName": system}) and not admitted(rule, {"nodeName": monitoring})
    assert admitted(rule, {"nodeName": gpu})
    assert admitted(rule, {"nodeName": system}, namespace="kube-system")
    # a longer name that merely starts with a reserved shard's prefix is another scale set's
    assert admitted(rule, {"nodeName": f"{pools['system'].shards[0].name}00000a1"})
