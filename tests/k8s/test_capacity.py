"""Priorities, balloons and the teams' borrowing rule in the cluster (kilonode.k8s.capacity):
objects valid for each stack's Kubernetes version, balloons that take whole nodes of the
shared scale sets at the autoscaler's cutoff, and the admission rule's CEL evaluated."""

from __future__ import annotations

from typing import Any

import celpy
import pytest
import yaml

from kilonode.azure.graph import Graph, Recorded
from kilonode.k8s.capacity import BORROW_RULE, NAMESPACE, PRIORITIES
from kilonode.plan import ClusterPlan, defaults
from kilonode.render.pool import KUBELET_CONFIG
from tests import shared

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

STACKS = ["local", "research-2500", "research-7500"]
TEAM = "kilonode.io/team"


def capacity_objects(graph: Graph) -> list[Recorded]:
    return [r for r in graph.resources if r.custom and r.parent and r.parent.endswith("-k8s-capacity")]


@pytest.mark.parametrize("stack", STACKS)
def test_every_object_is_valid_for_the_stacks_kubernetes_version(
    graphs: dict[str, Graph], plans: dict[str, ClusterPlan], stack: str
) -> None:
    objects = capacity_objects(graphs[stack])
    kinds = sorted(r.type.rsplit(":", 1)[1] for r in objects)
    expected = ["PriorityClass"] * 4
    if plans[stack].teams:
        expected += ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]  # borrowing, on pods
    expected += ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]  # node identity: every stack
    if any(p.autoscaling and p.autoscaling.warm_nodes for p in plans[stack].node_pools):
        expected += ["Deployment", "Namespace", "NetworkPolicy"]  # the balloons' default deny
    assert kinds == sorted(expected)
    for record in objects:
        shared.validate_object(record.plain(), f"1.{plans[stack].kubernetes_minor}.0")


def test_priorities_are_ordered_and_the_balloons_sit_at_the_autoscalers_cutoff(graphs: dict[str, Graph]) -> None:
    classes = {r.plain()["metadata"]["name"]: r.plain() for r in graphs["research-7500"].of_type(
        "kubernetes:scheduling.k8s.io/v1:PriorityClass")}
    values = {name: c["value"] for name, c in classes.items()}
    assert values["kilonode-infrastructure"] > values["kilonode-team"] > values["kilonode-borrowable"] > (
        values["kilonode-balloon"])
    # system-cluster-critical is 2,000,000,000; user classes must stay at or below 1,000,000,000
    assert max(values.values()) <= 1_000_000_000
    # not expendable (cluster-autoscaler: priority *below* the cutoff is), so it keeps nodes
    assert values["kilonode-balloon"] == defaults.AUTOSCALER_EXPENDABLE_PRIORITY_CUTOFF
    assert classes["kilonode-balloon"]["preemptionPolicy"] == "Never"
    assert [name for name, c in classes.items() if c.get("globalDefault")] == ["kilonode-team"]
    assert {p.name for p in PRIORITIES} == set(classes)


def test_balloons_take_whole_nodes_of_the_shared_scale_sets(
    graphs: dict[str, Graph], plans: dict[str, ClusterPlan]
) -> None:
    plan = plans["research-7500"]
    [deployment] = [r.plain() for r in capacity_objects(graphs["research-7500"])
                    if r.type == "kubernetes:apps/v1:Deployment"]
    [pool] = plan.autoscaled_pools
    assert deployment["metadata"]["namespace"] == NAMESPACE
    assert deployment["spec"]["replicas"] == 20
    pod = deployment["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert container["resources"]["requests"] == {"nvidia.com/gpu": "8"} == container["resources"]["limits"]
    assert pod["priorityClassName"] == "kilonode-balloon" and pod["terminationGracePeriodSeconds"] == 0
    assert pod["nodeSelector"] == {"kilonode.io/pool": "h100-ib"}
    [anti] = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert anti["topologyKey"] == "kubernetes.io/hostname"
    assert anti["labelSelector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    # the pause image every node has preloaded: a balloon never pulls
    assert container["image"] == pool.pause_image
    assert pool.pause_image in {image.image for image in pool.preload_images}
    # a balloon does not tolerate the GPU health agent's startup taint: it waits for a checked node
    assert not any(t.get("key", "").startswith("kilonode.io/gpu") for t in pod.get("tolerations", []))


def tolerates(tolerations: list[dict[str, str]], taint: dict[str, str]) -> bool:
    """Kubernetes' rule (k8s.io/api core/v1 toleration.go ToleratesTaint)."""
    for t in tolerations:
        if t.get("effect") and t["effect"] != taint["effect"]:
            continue
        if t.get("key") and t["key"] != taint["key"]:
            continue
        if t.get("operator", "Equal") == "Exists" or t.get("value", "") == taint.get("value", ""):
            return True
    return False


def test_borrowers_fit_every_teams_nodes_and_others_none() -> None:
    rendered = shared.rendered("research-7500")
    team_taints = {}
    for team in ("language", "vision"):
        config = yaml.safe_load(rendered[f"pool-a100-ib.team-{team}"][KUBELET_CONFIG].content)
        [taint] = [t for t in config["registerWithTaints"] if t["key"] == TEAM]
        team_taints[team] = taint
    borrower = [{"key": TEAM, "operator": "Exists", "effect": "NoSchedule"}]
    own = [{"key": TEAM, "operator": "Equal", "value": "vision", "effect": "NoSchedule"}]
    assert all(tolerates(borrower, taint) for taint in team_taints.values())
    assert tolerates(own, team_taints["vision"]) and not tolerates(own, team_taints["language"])
    assert not any(tolerates([], taint) for taint in team_taints.values())


@pytest.fixture(scope="module")
def borrow_rule() -> Any:
    env = celpy.Environment()
    return env.program(env.compile(BORROW_RULE))


def admitted(rule: Any, spec: dict[str, Any], namespace: str = "research",
             labels: dict[str, str] | None = None) -> bool:
    """The rule as the apiserver evaluates it: the pod, the request's namespace and that
    Namespace object (its labels name the team it belongs to, if any)."""
    namespace_object: dict[str, Any] = {"metadata": {"name": namespace, **({"labels": labels} if labels else {})}}
    return bool(rule.evaluate({
        "object": celpy.json_to_cel({"apiVersion": "v1", "kind": "Pod", "spec": spec}),
        "request": celpy.json_to_cel({"namespace": namespace}),
        "namespaceObject": celpy.json_to_cel(namespace_object),
    }))


def test_the_borrowing_policy_admits_only_low_priority_borrowers(graphs: dict[str, Graph], borrow_rule: Any) -> None:
    [policy] = [r.plain() for r in capacity_objects(graphs["research-7500"])
                if r.type.endswith(":ValidatingAdmissionPolicy")
                and r.plain()["metadata"]["name"] == "kilonode-team-borrowing"]
    [validation] = policy["spec"]["validations"]
    assert validation["expression"] == BORROW_RULE
    any_team = [{"key": TEAM, "operator": "Exists", "effect": "NoSchedule"}]
    assert admitted(borrow_rule, {"priorityClassName": "kilonode-borrowable", "tolerations": any_team})
    assert not admitted(borrow_rule, {"tolerations": any_team})  # team priority, by default
    assert not admitted(borrow_rule, {"priorityClassName": "kilonode-team", "tolerations": any_team})
    # pods without tolerations, and kube-system's per-node agents that tolerate everything: untouched
    assert admitted(borrow_rule, {"containers": []})
    everything = [{"operator": "Exists"}]
    assert admitted(borrow_rule, {"tolerations": everything}, namespace="kube-system")
    # a key-less Exists tolerates every team's taint too: borrowing, anywhere else
    assert not admitted(borrow_rule, {"tolerations": everything})
    assert not admitted(borrow_rule, {"tolerations": [{"operator": "Exists", "effect": "NoSchedule"}]})
    assert admitted(borrow_rule, {"priorityClassName": "kilonode-borrowable", "tolerations": everything})
    # a team's own value: admitted in a namespace labelled with that team, and only there
    vision = [{"key": TEAM, "operator": "Equal", "value": "vision", "effect": "NoSchedule"}]
    assert admitted(borrow_rule, {"tolerations": vision}, labels={TEAM: "vision"})
    assert not admitted(borrow_rule, {"tolerations": vision}, labels={TEAM: "language"})
    assert not admitted(borrow_rule, {"tolerations": vision})  # an unlabelled namespace has no team
    # operator defaults to Equal; a value-less Equal matches only an empty value: still not its own
    assert not admitted(borrow_rule, {"tolerations": [{"key": TEAM, "value": "vision"}]}, labels={TEAM: "language"})
    assert admitted(borrow_rule, {"tolerations": [{"key": TEAM, "value": "vision"}]}, labels={TEAM: "vision"})
    assert not admitted(borrow_rule, {"tolerations": [{"key": TEAM}]}, labels={TEAM: "vision"})
    # unrelated tolerations stay free
    assert admitted(borrow_rule, {"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}]})
    [binding] = [r.plain() for r in capacity_objects(graphs["research-7500"])
                 if r.type.endswith(":ValidatingAdmissionPolicyBinding")
                 and r.plain()["metadata"]["name"] == "kilonode-team-borrowing"]
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]


def node_admitted(rule: Any, name: str, labels: dict[str, str], taints: list[dict[str, str]],
                  user: str | None = None, operation: str = "CREATE") -> bool:
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels},
            "spec": {"taints": taints}}
    return bool(rule.evaluate({
        "object": celpy.json_to_cel(node),
        "request": celpy.json_to_cel({"operation": operation, "userInfo": {"username": user or f"system:node:{name}"}}),
    }))


def node_identity_policy(graph: Graph) -> dict[str, Any]:
    [policy] = [r.plain() for r in capacity_objects(graph)
                if r.type.endswith(":ValidatingAdmissionPolicy")
                and r.plain()["metadata"]["name"] == "kilonode-node-identity"]
    return policy


def test_a_node_cannot_choose_its_team(graphs: dict[str, Graph], plans: dict[str, ClusterPlan]) -> None:
    from kilonode.k8s.capacity import FABRIC_NODE_RULE, placement_node_rule, team_node_rule
    from kilonode.k8s.node_agents import NODE_SPEC_RULE, OWN_NODE_RULE

    plan = plans["research-7500"]
    rule_text = team_node_rule(plan)
    policy = node_identity_policy(graphs["research-7500"])
    assert [v["expression"] for v in policy["spec"]["validations"]] == [
        placement_node_rule(plan), rule_text, FABRIC_NODE_RULE, OWN_NODE_RULE, NODE_SPEC_RULE]
    # a status update can change labels too
    assert policy["spec"]["matchConstraints"]["resourceRules"][0]["resources"] == ["nodes", "nodes/status"]
    env = celpy.Environment()
    rule = env.program(env.compile(rule_text))
    language, vision = (next(t for t in plan.teams if t.name == n) for n in ("language", "vision"))
    pool = next(p for p in plan.node_pools if p.name == "a100-ib")
    shared = next(s.name for s in pool.shards if s.team is None)

    def taint(team: str) -> list[dict[str, str]]:
        return [{"key": TEAM, "value": team, "effect": "NoSchedule"}]

    own = f"{vision.shards[0]}00000a"
    assert node_admitted(rule, own, {TEAM: "vision"}, taint("vision"))
    assert not node_admitted(rule, own, {TEAM: "language"}, taint("language"))  # another team's label
    assert not node_admitted(rule, own, {}, [])  # leaving its team: untainted capacity
    assert not node_admitted(rule, own, {TEAM: "vision"}, [])  # registering without the taint
    assert node_admitted(rule, own, {TEAM: "vision"}, [], operation="UPDATE")  # taints are NodeRestriction's
    assert node_admitted(rule, f"{language.shards[-1]}00000b", {TEAM: "language"}, taint("language"))
    assert not node_admitted(rule, f"{shared}00000c", {TEAM: "vision"}, taint("vision"))  # a shared node
    assert node_admitted(rule, f"{shared}00000c", {}, [])
    # an administrator (or a controller) labelling a node is not the node itself
    assert node_admitted(rule, f"{shared}00000c", {TEAM: "vision"}, [], user="kilonode-admin")
    # cloud-node-manager's token (on every node) cannot move a node into a team either
    assert not node_admitted(rule, f"{shared}00000c", {TEAM: "vision"}, [], user=CNM_USER, operation="UPDATE")
    assert node_admitted(rule, own, {TEAM: "vision"}, [], user=CNM_USER, operation="UPDATE")


def test_a_node_cannot_name_another_fabric() -> None:
    from kilonode.k8s.capacity import FABRIC_NODE_RULE

    env = celpy.Environment()
    rule = env.program(env.compile(FABRIC_NODE_RULE))
    fabric = "kilonode.io/fabric"
    name = "research-7500-h100-ib-017000004"
    assert node_admitted(rule, name, {fabric: "research-7500-h100-ib-017"}, [])
    assert not node_admitted(rule, name, {fabric: "research-7500-h100-ib-018"}, [])
    assert not node_admitted(rule, name, {fabric: "research-7500-h100-ib-01"}, [])  # a prefix, not its scale set
    assert node_admitted(rule, name, {}, [])  # no label: in no gang's fabric at all
    assert node_admitted(rule, name, {fabric: "anything"}, [], user="kilonode-admin")
    assert not node_admitted(rule, name, {fabric: "research-7500-h100-ib-018"}, [], user=CNM_USER,
                             operation="UPDATE")


POOL, SYSTEM, TOPOLOGY = "kilonode.io/pool", "kilonode.io/system", "kilonode.io/nccl-topology"
CNM_USER = "system:serviceaccount:kube-system:cloud-node-manager"


def test_the_policy_holds_cloud_node_managers_real_account(graphs: dict[str, Graph]) -> None:
    """The user the rules name is the ServiceAccount cloud-node-manager's DaemonSet runs as."""
    [daemonset] = [r.plain() for r in graphs["research-7500"].resources
                   if r.type.endswith(":DaemonSet") and r.plain()["metadata"]["name"] == "cloud-node-manager"]
    account = daemonset["spec"]["template"]["spec"]["serviceAccountName"]
    assert f"system:serviceaccount:{daemonset['metadata']['namespace']}:{account}" == CNM_USER
    validations = node_identity_policy(graphs["research-7500"])["spec"]["validations"]
    assert all(CNM_USER in v["expression"] for v in validations)


@pytest.fixture(scope="module")
def placement_rule(plans: dict[str, ClusterPlan]) -> Any:
    from kilonode.k8s.capacity import placement_node_rule

    env = celpy.Environment()
    return env.program(env.compile(placement_node_rule(plans["research-7500"])))


def first_node(plan: ClusterPlan, pool: str, shard: int = 0) -> str:
    return f"{next(p for p in plan.node_pools if p.name == pool).shards[shard].name}00000a"


# a kubelet registers (CREATE) and updates its Node; cloud-node-manager only updates (no create in its role)
@pytest.mark.parametrize(("user", "operation"), [(None, "CREATE"), (None, "UPDATE"), (CNM_USER, "UPDATE")])
def test_a_node_cannot_make_itself_a_system_node_another_pools_or_another_topologys(
    plans: dict[str, ClusterPlan], placement_rule: Any, user: str | None, operation: str
) -> None:
    """Seeded breaks: a GPU node (its kubelet, or cloud-node-manager's token on it) that labels
    itself a system node, another pool's or another topology's is refused; the labels its
    pool registers with are admitted, on every pool."""
    plan = plans["research-7500"]

    def admitted(name: str, labels: dict[str, str]) -> bool:
        return node_admitted(placement_rule, name, labels, [], user=user, operation=operation)

    for pool in plan.node_pools:
        for shard in (pool.shards[0], pool.shards[-1]):
            assert admitted(f"{shard.name}00000a", {**pool.labels, "kubernetes.io/os": "linux"}), pool.name
    gpu = first_node(plan, "h100-ib", -1)
    own = {POOL: "h100-ib", TOPOLOGY: "ndv5"}
    assert not admitted(gpu, {**own, SYSTEM: "true"})  # a system node
    assert not admitted(gpu, {**own, SYSTEM: "false"})  # any value: only a system pool carries the key
    assert not admitted(gpu, {**own, POOL: "system"})  # another pool
    assert not admitted(gpu, {POOL: "system", SYSTEM: "true"})  # all of a system node's labels
    assert not admitted(gpu, {**own, TOPOLOGY: "ndv4"})  # another topology
    assert not admitted(gpu, {POOL: "h100-ib"})  # dropping its topology: out of the gangs' selectors
    assert not admitted(gpu, {})  # dropping its pool
    system = first_node(plan, "system")
    assert not admitted(system, {POOL: "system"})  # a system node dropping its system label
    assert not admitted(system, {POOL: "system", SYSTEM: "true", TOPOLOGY: "ndv5"})
    # a name that is no scale set's (another shard's prefix, a wrong length) implies no pool
    assert not admitted(gpu[:-1], own)
    assert not admitted("intruder00000a", {POOL: "system", SYSTEM: "true"})
    assert admitted("intruder00000a", {})


def test_an_administrator_may_still_label_nodes(placement_rule: Any, plans: dict[str, ClusterPlan]) -> None:
    gpu = first_node(plans["research-7500"], "h100-ib")
    assert node_admitted(placement_rule, gpu, {POOL: "system", SYSTEM: "true"}, [], user="kilonode-admin")


def test_the_placement_rule_tries_each_scale_set_once_per_label(plans: dict[str, ClusterPlan]) -> None:
    """CEL cost: at 7,500 nodes each of the three labels tries each shard's prefix at most once
    (shards grouped by value), so the rule grows with the shards (~80), not pools x labels x shards."""
    from kilonode.k8s.capacity import PLACEMENT_LABELS, implied_label

    plan = plans["research-7500"]
    shards = sum(len(p.shards) for p in plan.node_pools)
    assert 70 <= shards <= 100
    for key in PLACEMENT_LABELS:
        tried = implied_label(plan, key).count("', '") + implied_label(plan, key).count("['")
        assert tried <= shards, key
