"""How fast nodes may join (kilonode.plan.resolve.joins) and the waves of scale sets that keep
`pulumi up` under it (kilonode.azure.cluster, kilonode.azure.join_waves): every scale set in
exactly one wave, no wave over the plan's bound, the waves started by a chain of timers the
plan's gaps apart, at most in_flight_waves being created at once, and no resource name moved."""

from __future__ import annotations

import dataclasses
import random

import pytest
from typer.testing import CliRunner

from kilonode.azure import join_waves
from kilonode.azure.graph import Graph, Recorded
from kilonode.cli import app
from kilonode.k8s import autoscaler
from kilonode.plan import ClusterPlan, defaults
from kilonode.plan.resolve import joins
from tests.conftest import SHIPPED_STACKS

VMSS = "azure-native:compute:VirtualMachineScaleSet"
COMMAND = "command:local:Command"


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
    # the first wave (3 system nodes, the monitoring node, 3 scale sets of 100) and the next 3 sets
    assert wave_problems(broken) == ["wave 0: 604 nodes > 327"]
    twice = join.model_copy(update={"waves": (*join.waves, join.waves[-1])})
    broken = plan.model_copy(update={"components": plan.components.model_copy(update={"joins": twice})})
    assert "research-7500-h100-ib-024 in 2 waves" in wave_problems(broken)


def test_the_7500_node_arithmetic_by_hand(plans: dict[str, ClusterPlan]) -> None:
    join = plans["research-7500"].components.joins
    # per apiserver (2,327 seats): node-high 327 + system 245 + node agents 164 + bootstrap 82 =
    # 818; 4 apiservers (one down) x 818 x 10% = 327 seats, 1 s each, 60 requests per join
    assert join.sized_for_per_min == 327 and join.wave_nodes == 327
    # 3 system nodes, the monitoring node + 3 scale sets of 100 first, then 3 scale sets a wave: 1 + 24 waves, each
    # within the bound, so 24 timers of one interval
    assert len(join.waves) == 25 and join.over_bound == ()
    assert join.wave_gaps_s == (60,) * 24
    # 10 min per creation (assumed) / 1 min per wave: the in-flight bound never holds a wave back
    assert join.in_flight_waves == 10
    # the last wave starts at 24 min, is created at 34, its nodes Ready 30 min later
    assert join.bring_up_min == 24 + 10 + 30
    assert join.admitted_per_min == 3 + 1 + 300  # the first wave's nodes in its minute
    assert join.admitted_per_min <= join.sized_for_per_min


def test_the_2500_node_arithmetic_by_hand(plans: dict[str, ClusterPlan]) -> None:
    join = plans["research-2500"].components.joins
    # the system wave (3 nodes) holds the next one back a minute; each 834-node scale set
    # ceil(834 / 163) = 6 minutes, its joins' time at the sized rate
    assert join.wave_gaps_s == (60, 360, 360)
    # the waves start at 0, 1, 7 and 13 min; the last is created at 23, its nodes Ready at 53
    assert join.bring_up_min == 13 + 10 + 30
    assert join.admitted_per_min == 139  # 834 nodes over 6 min, rounded up: under the 163 sized for


@pytest.mark.parametrize("stack", ["research-2500", "research-7500"])
def test_the_prometheus_pool_joins_in_the_first_wave(plans: dict[str, ClusterPlan], stack: str) -> None:
    """Its pool is tainted for Prometheus alone, yet `pulumi up` awaits the StatefulSet and its
    Service: in a later wave that await would wait on the GPU pools' scale sets."""
    plan = plans[stack]
    assert plan.prometheus is not None
    [pool] = [p for p in plan.node_pools if p.name == plan.prometheus.pool]
    assert pool.taints and not pool.system  # the case the first wave used to leave out
    assert {s.name for s in pool.shards} <= set(plan.components.joins.waves[0])


def test_the_schedule_starts_the_waves_their_gaps_apart_and_bounds_those_in_flight() -> None:
    gaps, create = [60] * 24, defaults.SCALE_SET_CREATE_MIN * 60
    # as assumed, the bound costs nothing: each wave starts at its timer
    runs = joins.schedule(gaps, [create] * 25, defaults.JOIN_WAVES_IN_FLIGHT)
    assert [start for start, _ in runs] == [60 * k for k in range(25)]
    # two in flight would cap it at 2 waves per creation: the last starts at 120 min, not 24
    # (the 2 h 40 min bring-up plan/defaults/joins.py quotes)
    assert joins.schedule(gaps, [create] * 25, 2)[-1][0] == 120 * 60
    assert 120 + defaults.SCALE_SET_CREATE_MIN + defaults.NODE_READY_MIN == 160
    # whatever Azure takes, no more than the bound are being created at once, no wave starts
    # before its timer, and none before the wave in_flight before it is created
    rng = random.Random(23)
    for in_flight in (1, 2, 10):
        slow = [rng.randint(300, 3600) for _ in range(25)]
        runs = joins.schedule(gaps, slow, in_flight)
        for k, (start, _) in enumerate(runs):
            assert start >= 60 * k and (k < in_flight or start >= runs[k - in_flight][1])
            assert sum(1 for s, e in runs if s <= start < e) <= in_flight


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


def pacing_problems(plan: ClusterPlan, graph: Graph) -> list[str]:
    """What the program promises about the waves: one timer per wave after the first, each
    after the one before (the first after what every scale set's inputs come from), sleeping
    the plan's gap once (no-op update, nothing that replaces it); each wave's scale sets after
    their timer and after exactly the scale sets of the wave in_flight_waves before."""
    join = plan.components.joins
    by_name = {r.name: r for r in graph.resources}
    timers = [join_waves.timer_name(plan.cluster, k) for k in range(1, len(join.waves))]
    problems = [f"{r.name}: a timer no wave waits for" for r in graph.of_type(COMMAND)
                if join_waves.TIMER_MARK in r.name and r.name not in timers]
    for k, name in enumerate(timers, start=1):
        problems += _timer_problems(by_name, name, timers[k - 2] if k > 1 else None, join.wave_gaps_s[k - 1])
    inputs = {d for r in graph.of_type(VMSS) for d in r.depends_on if d in by_name and by_name[d].type != VMSS}
    first = by_name.get(timers[0]) if timers else None
    if first is not None:
        problems += [f"{timers[0]} does not wait for {d}" for d in sorted(inputs - set(timers) - set(first.depends_on))]
    for k, wave in enumerate(join.waves):
        earlier = set(join.waves[k - join.in_flight_waves]) if k >= join.in_flight_waves else set()
        for shard in wave:
            problems += _scale_set_problems(graph, _scale_set(graph, shard), k, timers[k - 1] if k else None, earlier)
    return problems


def _timer_problems(by_name: dict[str, Recorded], name: str, previous: str | None, gap_s: int) -> list[str]:
    timer = by_name.get(name)
    if timer is None:
        return [f"{name} missing"]
    found = []
    if previous is not None and previous not in timer.depends_on:
        found.append(f"{name} does not wait for {previous}")
    inputs = timer.plain()
    if (inputs.get("create"), inputs.get("update")) != (f"sleep {gap_s}", join_waves.NO_OP):
        found.append(f"{name} runs {inputs.get('create')!r} / {inputs.get('update')!r}, not a {gap_s} s sleep once")
    if inputs.get("triggers") or inputs.get("delete") or timer.delete_before_replace:
        found.append(f"{name} can be replaced or runs on delete")
    return found


def _scale_set(graph: Graph, shard: str) -> Recorded:
    return next(r for r in graph.of_type(VMSS) if r.plain()["vmScaleSetName"] == shard)


def _scale_set_problems(graph: Graph, vmss: Recorded, wave: int, timer: str | None, earlier: set[str]) -> list[str]:
    found = []
    if timer is not None and timer not in vmss.depends_on:
        found.append(f"{vmss.name} (wave {wave}) does not wait for {timer}")
    peers = {graph.named(d).plain()["vmScaleSetName"] for d in vmss.depends_on
             if any(r.name == d for r in graph.of_type(VMSS))}
    if peers != earlier:
        found.append(f"{vmss.name} (wave {wave}) waits for {sorted(peers)}, not the wave in flight-bound before")
    if vmss.replace_on_changes or vmss.delete_before_replace:
        found.append(f"{vmss.name} is replaced on {vmss.replace_on_changes} / deleteBeforeReplace")
    return found


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_the_waves_are_paced_by_a_chain_of_timers_and_no_name_moved(
    graphs: dict[str, Graph], plans: dict[str, ClusterPlan], stack: str
) -> None:
    plan, graph = plans[stack], graphs[stack]
    scale_sets = {r.name: r for r in graph.of_type(VMSS)}
    # the names and parents every scale set had before the waves: <cluster>-<pool>-NNN under
    # the pool's component, named the shard in Azure
    assert {name: (r.parent, r.plain()["vmScaleSetName"]) for name, r in scale_sets.items()} == {
        f"{plan.cluster}-{p.name}-{s.index:03d}": (f"{plan.cluster}-{p.name}", s.name)
        for p in plan.node_pools for s in p.shards}
    assert pacing_problems(plan, graph) == []


def _with(graph: Graph, name: str, **changes: object) -> Graph:
    resources = [dataclasses.replace(r, **changes) if r.name == name else r for r in graph.resources]
    return Graph(graph.stack, resources, graph.outputs, graph.notes)


def test_a_wave_without_its_timer_a_broken_chain_or_no_in_flight_bound_is_caught(
    graphs: dict[str, Graph], plans: dict[str, ClusterPlan]
) -> None:
    plan, graph = plans["research-7500"], graphs["research-7500"]
    join, cluster = plan.components.joins, plan.cluster
    vmss = _scale_set(graph, join.waves[3][0])
    timer3 = join_waves.timer_name(cluster, 3)
    untimed = _with(graph, vmss.name, depends_on=tuple(d for d in vmss.depends_on if d != timer3))
    assert pacing_problems(plan, untimed) == [f"{vmss.name} (wave 3) does not wait for {timer3}"]
    timer5, timer4 = join_waves.timer_name(cluster, 5), join_waves.timer_name(cluster, 4)
    broken = _with(graph, timer5, depends_on=())
    assert pacing_problems(plan, broken) == [f"{timer5} does not wait for {timer4}"]
    resleeps = _with(graph, timer5, inputs={"create": "sleep 60"})  # no no-op update: sleeps on every change
    assert pacing_problems(plan, resleeps) == [f"{timer5} runs 'sleep 60' / None, not a 60 s sleep once"]
    late = _scale_set(graph, join.waves[12][0])
    unbounded = _with(graph, late.name, depends_on=tuple(d for d in late.depends_on if d not in {
        r.name for r in graph.of_type(VMSS)}))
    assert pacing_problems(plan, unbounded) == [
        f"{late.name} (wave 12) waits for [], not the wave in flight-bound before"]
    first = join_waves.timer_name(cluster, 1)
    early = _with(graph, first, depends_on=())
    assert any(p.startswith(f"{first} does not wait for {cluster}-image-") for p in pacing_problems(plan, early))


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
    assert "admitted: 304 nodes/min on `pulumi up` -- 25 waves of scale sets, started by a chain of 24 timers" in text
    assert "sized for: 327 nodes/min" in text
    assert "in flight: at most 10 waves being created at once" in text
    assert "first bring-up: 1 h 4 min until the last of 7,504 nodes is Ready (the last wave starts at 24 min" in text
    assert "growth: a later `pulumi up` runs no timer that exists" in text


def test_explain_tells_the_first_runs_timeline_against_the_awaits() -> None:
    from kilonode.plan.resolve.joins import first_run_timeline
    from tests import shared

    line = first_run_timeline(shared.plan("research-7500"))
    assert line.startswith("first run: a wave's nodes run pods ~40 min after it starts (30 min to Ready, 10 to start a "
                           "workload); the awaits end 40 min after the in-cluster objects are created, by when ")
    assert "(a100-ib, monitoring, system)" in line and line.endswith("(its autoscaler, up to 31)")
