"""How fast nodes may join (kilonode.plan.resolve.joins) and the waves of scale sets that keep
`pulumi up` under it (kilonode.azure.cluster): every scale set in exactly one wave, no wave over
the plan's bound, each wave created after the one before, and no resource name moved."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from kilonode.azure.graph import Graph
from kilonode.cli import app
from kilonode.k8s import autoscaler
from kilonode.plan import ClusterPlan
from kilonode.plan.resolve import joins
from tests.conftest import SHIPPED_STACKS

VMSS = "azure-native:compute:VirtualMachineScaleSet"


def wave_problems(plan: ClusterPlan) -> list[str]:
    """What the waves promise: each shard in exactly one wave; a wave's nodes within the plan's
    bound, unless it is one shard that is over the bound by itself (and named as such)."""
    join = plan.components.joins
    capacity = {s.name: s.capacity for p in plan.node_pools for s in p.shards}
    placed = [name for wave in join.waves for name in wave]
    problems = [f"{name} in {placed.count(name)} waves" for name in capacity if placed.count(name) != 1]
    problems += [f"{name} is no shard" for name in placed if name not in capacity]
    for index, wave in enumerate(join.waves):
        nodes = sum(capacity.get(name, 0) for name in wave)
        alone_over = len(wave) == 1 and wave[0] in join.over_bound
        if nodes > join.wave_nodes and not alone_over:
            problems.append(f"wave {index}: {nodes} nodes > {join.wave_nodes}")
    return problems


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_every_scale_set_is_in_exactly_one_wave_within_the_bound(plans: dict[str, ClusterPlan], stack: str) -> None:
    assert wave_problems(plans[stack]) == []


def test_a_wave_over_the_bound_or_a_shard_in_two_waves_is_caught(plans: dict[str, ClusterPlan]) -> None:
    plan = plans["research-7500"]
    join = plan.components.joins
    merged = join.model_copy(update={"waves": (join.waves[0] + join.waves[1], *join.waves[2:])})
    broken = plan.model_copy(update={"components": plan.components.model_copy(update={"joins": merged})})
    assert wave_problems(broken) == ["wave 0: 603 nodes > 327"]
    twice = join.model_copy(update={"waves": (*join.waves, join.waves[-1])})
    broken = plan.model_copy(update={"components": plan.components.model_copy(update={"joins": twice})})
    assert "research-7500-h100-ib-024 in 2 waves" in wave_problems(broken)


def test_the_7500_node_arithmetic_by_hand(plans: dict[str, ClusterPlan]) -> None:
    join = plans["research-7500"].components.joins
    # per apiserver (2,327 seats): node-high 327 + system 245 + node agents 164 + bootstrap 82 =
    # 818; 4 apiservers (one down) x 818 x 10% = 327 seats, 1 s each, 60 requests per join
    assert join.sized_for_per_min == 327 and join.wave_nodes == 327
    # 3 system nodes + 3 scale sets of 100 first, then 3 scale sets a wave: 1 + 24 waves
    assert len(join.waves) == 25 and join.over_bound == ()
    assert join.bring_up_min == 25 * 10 + 30  # every wave's creation, then the last wave's way to Ready
    assert join.admitted_per_min == 31  # 303 nodes per 10 min, rounded up
    assert join.admitted_per_min <= join.sized_for_per_min


def test_the_first_wave_holds_the_nodes_the_clusters_own_workloads_run_on(plans: dict[str, ClusterPlan]) -> None:
    for plan in plans.values():
        first = set(plan.components.joins.waves[0])
        hosts = [s.name for p in plan.node_pools if p.system or not p.taints for s in p.shards if s.team is None]
        assert hosts and set(hosts) <= first, plan.cluster


def test_a_scale_set_larger_than_the_bound_boots_alone_and_is_named(plans: dict[str, ClusterPlan]) -> None:
    join = plans["research-2500"].components.joins
    # 2 apiservers (one down) x 818 x 10% = 163; nc-a100's three scale sets hold 834 each
    assert join.wave_nodes == 163
    assert join.over_bound == tuple(f"research-2500-nc-a100-00{i}" for i in range(3))
    assert all((name,) in join.waves for name in join.over_bound)
    assert any("over the bound: 3 scale set(s)" in line for line in joins.describe(plans["research-2500"]))


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_each_wave_is_created_after_the_one_before_and_no_name_moved(
    graphs: dict[str, Graph], plans: dict[str, ClusterPlan], stack: str
) -> None:
    plan, graph = plans[stack], graphs[stack]
    scale_sets = {r.name: r for r in graph.of_type(VMSS)}
    # the names and parents every scale set had before the waves: <cluster>-<pool>-NNN under
    # the pool's component, named the shard in Azure
    assert {name: (r.parent, r.plain()["vmScaleSetName"]) for name, r in scale_sets.items()} == {
        f"{plan.cluster}-{p.name}-{s.index:03d}": (f"{plan.cluster}-{p.name}", s.name)
        for p in plan.node_pools for s in p.shards}
    previous: set[str] = set()
    for wave in plan.components.joins.waves:
        for name in wave:
            peers = {d for d in scale_sets[name].depends_on if d in scale_sets}
            assert peers == previous, name
        previous = set(wave)


def test_the_autoscaler_never_adds_more_than_a_wave_in_one_scale_up(plans: dict[str, ClusterPlan]) -> None:
    plan = plans["research-7500"]
    assert autoscaler.max_nodes_per_scaleup(plan) == 100  # a placement group: below the wave's 327
    small = plan.components.joins.model_copy(update={"wave_nodes": 40})
    smaller = plan.model_copy(update={"components": plan.components.model_copy(update={"joins": small})})
    assert autoscaler.max_nodes_per_scaleup(smaller) == 40
    assert "--max-nodes-per-scaleup=40" in autoscaler.autoscaler_args(smaller)


def test_explain_shows_the_node_joins_section() -> None:
    result = CliRunner().invoke(app, ["explain", "research-7500"])
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())  # rich wraps long lines
    assert "node joins (how many boot at once, against what the apiservers are sized for)" in text
    assert "admitted: 31 nodes/min on `pulumi up` -- 25 waves of scale sets" in text
    assert "sized for: 327 nodes/min" in text
    assert "first bring-up: 4 h 40 min until the last of 7,503 nodes is Ready" in text
