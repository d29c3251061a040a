"""An autoscaled pool's scale sets beyond its nodes start empty, and tell the autoscaler what
their nodes would be (independent trace of issue 38, round 5: raising maxNodes alone created
each new scale set at an even share of the nodes, hundreds of H100 VMs nobody asked for)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kilonode.config.load import stack_from_value
from kilonode.plan import plan_stack
from kilonode.plan.model import ClusterPlan, NodePoolPlan
from kilonode.plan.node_templates import LABEL_TAG, RESOURCES_TAG, TAINT_TAG, node_template_tags
from kilonode.plan.resolve.pools import capacity_of
from tests import shared
from tests.conftest import shipped_cluster_value

STACK = "research-7500"


def _plan(max_nodes: int | None = None) -> ClusterPlan:
    cluster: dict[str, Any] = shipped_cluster_value(STACK)
    if max_nodes is not None:
        [pool] = [p for p in cluster["nodePools"] if p["name"] == "h100-ib"]
        pool["maxNodes"] = max_nodes
    return plan_stack(stack_from_value(STACK, cluster, Path(f"stacks/Pulumi.{STACK}.yaml")))


def _h100(plan: ClusterPlan) -> NodePoolPlan:
    [pool] = [p for p in plan.node_pools if p.name == "h100-ib"]
    return pool


def test_raising_max_nodes_alone_adds_empty_scale_sets_and_moves_no_capacity() -> None:
    before, after = _h100(_plan()), _h100(_plan(3000))
    assert len(before.shards) == 25 and len(after.shards) == 30
    assert {s.name: s.capacity for s in after.shards[:25]} == {s.name: s.capacity for s in before.shards}
    assert [s.capacity for s in after.shards[25:]] == [0] * 5
    assert sum(s.capacity for s in after.shards) == 2500
    # the autoscaler's floor stays on the scale sets that have nodes, and sums to the pool's
    assert after.autoscaling is not None
    floors = {g.shard: g.min_size for g in after.autoscaling.node_groups}
    assert sum(floors.values()) == after.autoscaling.min_nodes == 1250
    assert all(floors[s.name] == 0 for s in after.shards[25:])


def test_capacity_spreads_over_the_shards_the_nodes_need() -> None:
    assert [capacity_of(250, 3, 100, i, system=False) for i in range(3)] == [84, 83, 83]
    assert [capacity_of(250, 5, 100, i, system=False) for i in range(5)] == [84, 83, 83, 0, 0]
    assert [capacity_of(3, 3, 1000, i, system=True) for i in range(3)] == [1, 1, 1]  # one per zone


def test_an_autoscaled_scale_set_tells_the_autoscaler_its_nodes_labels_taints_and_rdma() -> None:
    pool = _h100(_plan(3000))
    empty = pool.shards[-1]
    tags = node_template_tags(pool, empty)
    assert tags[f"{LABEL_TAG}kilonode.io_pool"] == "h100-ib"
    assert tags[f"{LABEL_TAG}kilonode.io_fabric"] == empty.name  # the node's own scale set
    assert tags[f"{RESOURCES_TAG}rdma_ib"] == "100"
    # the GPU health startup taint is the autoscaler's startup taint, never in the template
    assert not any(k.startswith(TAINT_TAG) for k in tags), tags
    # every label the kubelet registers with is in the template, '/' written '_' as upstream reads it
    decoded = {k.removeprefix(LABEL_TAG).replace("_", "/").replace("~2", "_") for k in tags if k.startswith(LABEL_TAG)}
    assert set(pool.labels) <= decoded


def test_a_taint_of_the_pool_is_in_the_template_as_value_and_effect() -> None:
    pool = _h100(_plan()).model_copy(update={"taints": ("dedicated=training:NoSchedule", "spot:NoExecute")})
    tags = node_template_tags(pool, pool.shards[0])
    assert tags[f"{TAINT_TAG}dedicated"] == "training:NoSchedule"
    assert tags[f"{TAINT_TAG}spot"] == ":NoExecute"


def test_scale_sets_the_autoscaler_does_not_manage_carry_no_template() -> None:
    plan = shared.plan(STACK)
    for pool in plan.node_pools:
        groups = {g.shard for g in pool.autoscaling.node_groups} if pool.autoscaling else set()
        for shard in pool.shards:
            assert bool(node_template_tags(pool, shard)) == (shard.name in groups)
