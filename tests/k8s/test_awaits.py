"""How long `pulumi up` waits for the in-cluster objects (kilonode.k8s.pods: SKIP_AWAIT,
awaited; the plan's components.awaits), read from the recorded graphs: every object
pulumi-kubernetes waits for until pods run (Deployments, DaemonSets, StatefulSets: every
replica available; a Service with a selector: a ready endpoint) is either not waited for or
waited for at least as long as the plan decided, which holds a node's whole way to Ready."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from kilonode.azure.graph import Graph, Recorded, format_manifests
from kilonode.cli import app
from kilonode.k8s.capacity import NAMESPACE as BALLOON_NAMESPACE
from kilonode.plan import ClusterPlan, defaults
from kilonode.plan.resolve.components import awaits_plan
from tests import shared

STACKS = list(shared.SHIPPED_STACKS)
SKIP_AWAIT = "pulumi.com/skipAwait"
WORKLOADS = ("kubernetes:apps/v1:Deployment", "kubernetes:apps/v1:DaemonSet", "kubernetes:apps/v1:StatefulSet")
# pulumi-kubernetes's wait where neither customTimeouts nor an annotation says otherwise
# (provider/pkg/await/await.go `timeout := 10 * time.Minute`; deployment.go, service.go)
PROVIDER_DEFAULT_MIN = 10
_UNITS_S = {"h": 3600, "m": 60, "s": 1}


def minutes(duration: str) -> float:
    """A Go duration as the engine parses customTimeouts ("40m", "1h30m", "90s"), in minutes."""
    parts = re.findall(r"(\d+)([hms])", duration)
    if not parts or "".join(n + u for n, u in parts) != duration:
        raise ValueError(f"{duration!r} is not a duration of h, m and s")
    return sum(int(n) * _UNITS_S[u] for n, u in parts) / 60


def awaited_until_pods_run(graph: Graph) -> list[Recorded]:
    """The objects whose await ends only when pods run: workloads, and Services that select pods."""
    return [r for r in graph.resources if r.type in WORKLOADS
            or (r.type == "kubernetes:core/v1:Service" and r.plain().get("spec", {}).get("selector"))]


def skips_await(r: Recorded) -> bool:
    return (r.plain().get("metadata", {}).get("annotations") or {}).get(SKIP_AWAIT) == "true"


@pytest.mark.parametrize("stack", STACKS)
def test_every_object_waiting_for_pods_is_skipped_or_waited_for_as_long_as_planned(
    graphs: dict[str, Graph], plans: dict[str, ClusterPlan], stack: str
) -> None:
    awaits = plans[stack].components.awaits
    objects = awaited_until_pods_run(graphs[stack])
    assert len(objects) >= 7, [r.name for r in objects]  # the recording did see them
    short = []
    for r in objects:
        if skips_await(r):
            assert not r.custom_timeouts, f"{r.name}: not waited for, yet given timeouts"
            continue
        create, update = (r.custom_timeouts.get(op) for op in ("create", "update"))
        if (create is None or minutes(create) < awaits.create_min
                or update is None or minutes(update) < awaits.update_min):
            short.append(f"{r.name}: {r.custom_timeouts or 'the provider default, 10 min'}")
    assert not short, f"waited for less than the plan's {awaits.create_min}/{awaits.update_min} min: {short}"


@pytest.mark.parametrize("stack", STACKS)
def test_daemonsets_and_balloons_are_not_waited_for_and_nothing_else_is_skipped(
    graphs: dict[str, Graph], stack: str
) -> None:
    """Every DaemonSet here runs on the pools' nodes (no control-plane VM runs a kubelet), so
    "every pod available" is never a state the fleet is in; the balloons may stay Pending by
    design; Calico's Typha (Deployment and Service) follows the nodes the cluster may reach, one replica
    per node, like the DaemonSets it serves (kilonode.k8s.calico). Anything else skipping its await
    would hide a system workload that never starts."""
    graph = graphs[stack]
    daemonsets = graph.of_type("kubernetes:apps/v1:DaemonSet")
    assert daemonsets and all(skips_await(r) for r in daemonsets), [r.name for r in daemonsets if not skips_await(r)]
    skipped = {r.name for r in awaited_until_pods_run(graph) if skips_await(r)}
    balloons = {r.name for r in graph.of_type("kubernetes:apps/v1:Deployment")
                if r.plain()["metadata"].get("namespace") == BALLOON_NAMESPACE}
    typha = {f"{stack}-k8s-calico-typha", f"{stack}-k8s-calico-typha-service"}
    assert skipped == {r.name for r in daemonsets} | balloons | typha
    if stack == "research-7500":  # its autoscaled pool keeps nodes warm
        assert balloons


def test_the_planned_wait_holds_a_node_s_way_to_ready_and_a_rollout_that_grows_with_the_cluster(
    plans: dict[str, ClusterPlan],
) -> None:
    awaits = plans["research-7500"].components.awaits
    # longer than the provider's default by the autoscaler's own bound on a new node
    assert minutes(defaults.CLUSTER_AUTOSCALER_MAX_NODE_PROVISION_TIME) == defaults.NODE_READY_MIN
    assert awaits.create_min == defaults.NODE_READY_MIN + PROVIDER_DEFAULT_MIN == 40
    # CoreDNS's 31 replicas replaced one at a time, 90 s each: 46.5 min, rounded up
    dns = plans["research-7500"].components.dns_replicas
    assert dns == 31
    assert awaits.update_min == 47 >= dns * defaults.ROLLOUT_STEP_S / 60
    # a smaller cluster keeps the creation's figure; a larger one waits longer still
    assert plans["research-2500"].components.awaits.update_min == awaits.create_min
    assert awaits_plan(2 * dns).update_min > awaits.update_min
    assert "CoreDNS's 31 replicas" in awaits.reason


def test_the_recorded_graph_shows_timeouts_to_a_reviewer(graphs: dict[str, Graph]) -> None:
    """`kilonode plan --format json` and the in-cluster YAML goldens carry the option, which is
    no part of the object the apiserver gets."""
    graph = graphs["research-7500"]
    dns = graph.named("research-7500-k8s-dns-deployment")
    assert dns.custom_timeouts == {"create": "40m", "update": "47m"}
    as_json = {r["name"]: r for r in json.loads(json.dumps(graph.to_json()))["resources"]}
    assert as_json[dns.name]["customTimeouts"] == {"create": "40m", "update": "47m"}
    assert "customTimeouts" not in as_json["research-7500-k8s-kube-proxy-daemonset"]
    assert f"# {dns.name} [create timeout 40m, update timeout 47m]\n" in format_manifests(graph)["in-cluster/dns.yaml"]


def test_explain_says_how_long_pulumi_up_waits() -> None:
    result = CliRunner().invoke(app, ["explain", "research-7500"])
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())  # rich wraps long lines
    assert "how long `pulumi up` waits" in text
    assert "create 40 min: a node's way to Ready (30 min)" in text
    assert "CoreDNS's 31 replicas replaced one at a time (90 s each, 47 min)" in text


@pytest.mark.parametrize(("duration", "expected"), [("40m", 40), ("1h30m", 90), ("90s", 1.5)])
def test_minutes_reads_go_durations(duration: str, expected: float) -> None:
    assert minutes(duration) == expected


def test_minutes_refuses_what_it_cannot_read() -> None:
    with pytest.raises(ValueError, match="not a duration"):
        minutes("40 minutes")
