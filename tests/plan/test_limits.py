"""Issue 27's limits: every budget counts what growth can reach (maxNodes), pod objects include
the tool's own DaemonSet pods, and the etcd and apiserver figures rest on the catalogue's
measured object sizes."""

from __future__ import annotations

from typing import Any

import pytest

from kilonode.catalog.limits import limits
from kilonode.config import load_stack
from kilonode.config.model import ClusterConfig
from kilonode.paths import EXAMPLE_STACKS_DIR, REPO_ROOT
from kilonode.plan import ClusterPlan, plan_stack
from kilonode.plan.resolve import budgets, pools
from kilonode.problems import StackError
from tests.conftest import StackWriter, shipped_cluster_value
from tests.scripts import BENCH_DIR, load_script

assert REPO_ROOT is not None


def measured_sizes() -> dict[str, int]:
    module = load_script(BENCH_DIR / "measure_object_sizes.py", "measure_object_sizes")
    return module.sizes()  # type: ignore[no-any-return]


def test_the_catalogues_object_sizes_are_what_the_measurement_prints() -> None:
    etcd = limits().etcd
    assert measured_sizes() == {"node": etcd.node_object_bytes.value, "lease": etcd.lease_object_bytes.value,
                                "pod": etcd.pod_object_bytes.value}


def budget(plan: ClusterPlan, name: str) -> Any:
    [found] = [b for b in plan.budgets if b.name == name]
    return found


def test_pod_objects_count_the_tools_daemonset_pods(plans: dict[str, ClusterPlan]) -> None:
    # a100-ib 5,000 x (3 pod IPs + kube-proxy, cloud-node-manager, calico-node, node-exporter, device
    # plugin, dcgm-exporter, RDMA plugin), h100-ib 2,500 x 10, system 3 x (16 + 4 + the Azure Disk node
    # plugin), monitoring 1 x (4 + 4 + the Azure Disk node plugin)
    assert budget(plans["research-7500"], "pods per cluster").used == 5000 * 10 + 2500 * 10 + 3 * 21 + 1 * 9


def test_a_host_network_fleet_still_makes_pod_objects() -> None:
    """65,000 hostNetwork nodes used to count 0 pods; the tool's DaemonSets alone make two per node."""
    raw = load_stack("local").config.model_dump(by_alias=True)
    raw["nodePools"][0].update(nodes=8_000, podsPerNode=0, subnet=None)
    found = {b.name: b.used for b in budgets.budgets_of(ClusterConfig.model_validate(raw))}
    assert found["pods per cluster"] >= 8_000 * len(pools.EVERY_NODE_DAEMONSETS)


def test_daemonset_table_matches_the_graphs(graphs: dict[str, Any], plans: dict[str, ClusterPlan]) -> None:
    """pools.own_daemonsets says which pools each of the tool's DaemonSets runs on; the graph's
    DaemonSets (their required node affinity on kilonode.io/pool, or none: every node) agree."""
    for stack, graph in graphs.items():
        names = [p.name for p in plans[stack].node_pools]
        config: ClusterConfig = load_stack(str(EXAMPLE_STACKS_DIR / f"Pulumi.{stack}.yaml")).config
        expected = {p.name: set(pools.own_daemonsets(p)) for p in config.node_pools}
        found: dict[str, set[str]] = {p: set() for p in names}
        for resource in graph.of_type("kubernetes:apps/v1:DaemonSet"):
            spec = resource.inputs["spec"]["template"]["spec"]
            terms = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                     .get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms")
            on = names if not terms else terms[0]["matchExpressions"][0]["values"]
            for pool in on:
                found[pool].add(resource.inputs["metadata"]["name"])
        assert found == expected, stack


def test_growth_to_max_nodes_past_the_vnet_is_refused_with_the_arithmetic(write_stack: StackWriter) -> None:
    cluster = shipped_cluster_value("research-7500")
    h100 = cluster["nodePools"][1]
    h100["maxNodes"] = 11_400  # 5,000 x 4 + 11,400 x 4 + 51 + 5 + 14 = 65,670 > 65,536
    with pytest.raises(StackError) as caught:
        plan_stack(load_stack(str(write_stack(cluster))))
    text = "\n".join(p.message for p in caught.value.problems)
    assert "11400 (maxNodes) × (1 + 3)" in text and "= 65670 > 65536" in text


def test_the_main_etcd_past_its_quota_is_refused(write_stack: StackWriter) -> None:
    cluster = shipped_cluster_value("research-7500")
    # research-7500 needs ~590 MB: 7,504 Nodes and Leases, 52,560 pods and 5 min of history
    cluster["etcd"]["main"]["quotaBackendBytes"] = 512 * 1024**2
    with pytest.raises(StackError) as caught:
        plan_stack(load_stack(str(write_stack(cluster))))
    [problem] = [p for p in caught.value.problems if p.path == "etcd.main.quotaBackendBytes"]
    assert "NOSPACE" in problem.message and "15,016 B" in problem.message


def test_etcd_and_apiserver_figures_grow_with_the_nodes() -> None:
    assert budgets.etcd_main_writes_per_second(100_000) == 10_000 + 334
    lease, node = limits().etcd.lease_object_bytes.value, limits().etcd.node_object_bytes.value
    assert budgets.etcd_main_bytes(1, 0) == node + lease + 30 * lease + node
