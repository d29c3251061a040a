"""The stacks bench/bench_plan.py and bench/bench_render.py time (bench/variants.py) still are what
they say: research-7500 scaled to 15,000 and 24,900 nodes validates, with one scale set per 100
InfiniBand nodes; 25,000, 60,000 and 100,000 are refused, for the reasons variants.py gives; the pools
stack plans with every subnet unrecorded. A change to the limits or the model shows here, not
as a benchmark that no longer runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from kilonode.config import load_stack
from kilonode.config.model import ClusterConfig
from kilonode.plan import plan_stack, resolve
from kilonode.problems import StackError
from tests.scripts import BENCH_DIR, load_script

variants = load_script(BENCH_DIR / "variants.py", "bench_variants")


@pytest.mark.parametrize("nodes", [variants.MIDDLE, variants.LARGEST_VALID])
def test_the_scaled_variants_validate_with_a_scale_set_per_100_infiniband_nodes(nodes: int, tmp_path: Path) -> None:
    plan = plan_stack(load_stack(str(variants.scaled(nodes, tmp_path))))
    infiniband = [pool for pool in plan.node_pools if pool.infiniband]
    assert sum(pool.nodes for pool in infiniband) == nodes
    assert sum(len(pool.shards) for pool in infiniband) == nodes // 100
    assert max(pool.nodes for pool in infiniband) <= variants.POOL_MAX_NODES


@pytest.mark.parametrize(("nodes", "why"), [
    (variants.LARGEST_VALID + 100, "25,017 VMs (every node at each pool's maxNodes or nodes, every etcd member "
                                   "and apiserver) exceed the 25,000 of Azure subscription and service limits"),
    (60_000, "60,017 VMs"),
    (100_000, "the cluster needs more private IPs than one VNet allows"),
])
def test_past_the_largest_variant_validation_refuses_and_says_why(nodes: int, why: str, tmp_path: Path) -> None:
    with pytest.raises(StackError) as refused:
        plan_stack(load_stack(str(variants.scaled(nodes, tmp_path))))
    assert why in str(refused.value)


def test_the_pools_stack_plans_with_every_subnet_unrecorded() -> None:
    config = ClusterConfig.model_validate(variants.many_pools(256))
    plan = resolve(config, load_stack("local").sysctl_profile)
    assert len(plan.network.unrecorded) == 256 + 2  # the pools', the control plane's and etcd's
