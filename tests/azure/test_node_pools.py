"""GPU scale sets: shards that add up, IB placement groups, pod IPs on every NIC."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kilonode.azure.graph import Graph
from kilonode.plan import ClusterPlan
from tests.azure.conftest import VMSS, mock_id
from tests.conftest import shipped_cluster_value

STACKS = ["local", "research-2500", "research-7500"]


def scale_sets(graph: Graph, cluster: str, pool: str) -> list[dict[str, Any]]:
    return [r.plain() for r in graph.children(f"{cluster}-{pool}") if r.type == VMSS]


@pytest.mark.parametrize("stack", STACKS)
def test_scale_set_capacities_add_up_to_each_pools_node_count(graphs: dict[str, Graph], stack: str) -> None:
    # Read the node counts from the stack file, not the plan: an independent check.
    cluster = shipped_cluster_value(stack)
    for pool in cluster["nodePools"]:
        sets = scale_sets(graphs[stack], cluster["name"], pool["name"])
        assert sum(s["sku"]["capacity"] for s in sets) == pool["nodes"]
        assert all(s["sku"]["capacity"] >= 1 for s in sets)


@pytest.mark.parametrize("stack", STACKS)
def test_every_nic_has_one_primary_plus_pods_per_node_ip_configurations(graphs: dict[str, Graph], stack: str) -> None:
    cluster = shipped_cluster_value(stack)
    for pool in cluster["nodePools"]:
        pods = pool.get("podsPerNode", 8)  # ClusterConfig's default
        for vmss in scale_sets(graphs[stack], cluster["name"], pool["name"]):
            (nic,) = vmss["virtualMachineProfile"]["networkProfile"]["networkInterfaceConfigurations"]
            configs = nic["ipConfigurations"]
            assert len(configs) == 1 + pods
            assert [c["primary"] for c in configs].count(True) == 1
            assert len({c["name"] for c in configs}) == len(configs)
            assert len({c["subnet"]["id"] for c in configs}) == 1
            assert nic["enableAcceleratedNetworking"] is True


def test_research_7500_infiniband_pools_use_at_least_75_scale_sets_of_at_most_100(graph_7500: Graph) -> None:
    # the GPU pools' (the system pool's three and the monitoring pool's one are neither InfiniBand
    # nor single placement group)
    sets = [r.plain() for r in graph_7500.of_type(VMSS) if "-system-" not in r.name and "-monitoring-" not in r.name]
    assert len(sets) >= 75
    assert sum(s["sku"]["capacity"] for s in sets) == 7500
    for s in sets:
        assert s["sku"]["capacity"] <= 100
        assert s["singlePlacementGroup"] is True


def test_research_2500_pool_without_infiniband_may_span_placement_groups(graphs: dict[str, Graph]) -> None:
    sets = [r.plain() for r in graphs["research-2500"].of_type(VMSS)]
    assert all(s["singlePlacementGroup"] is False and s["sku"]["capacity"] <= 1000 for s in sets)


@pytest.mark.parametrize("stack", STACKS)
def test_scale_sets_upgrade_manually_never_overprovision_and_boot_the_gallery_version(
    graphs: dict[str, Graph], plans: dict[str, ClusterPlan], stack: str
) -> None:
    graph, plan = graphs[stack], plans[stack]
    for pool in plan.node_pools:
        version = graph.named(f"{plan.cluster}-image-{pool.name}-1.0.0")
        for vmss, shard in zip(scale_sets(graph, plan.cluster, pool.name), pool.shards, strict=True):
            assert vmss["vmScaleSetName"] == shard.name and vmss["zones"] == [shard.zone]
            # hostnames (and so node names) are the prefix + an instance number per scale set
            assert vmss["virtualMachineProfile"]["osProfile"]["computerNamePrefix"] == shard.name
            assert vmss["upgradePolicy"] == {"mode": "Manual"}
            assert vmss["overprovision"] is False
            assert vmss["sku"]["name"] == pool.vm_size
            image = vmss["virtualMachineProfile"]["storageProfile"]["imageReference"]
            assert image == {"id": mock_id(version)}


@pytest.mark.parametrize("stack", STACKS)
def test_gallery_versions_replicate_as_often_as_the_plan_says(
    graphs: dict[str, Graph], plans: dict[str, ClusterPlan], stack: str
) -> None:
    graph, plan = graphs[stack], plans[stack]
    for pool in plan.node_pools:
        version = graph.named(f"{plan.cluster}-image-{pool.name}-1.0.0").plain()
        publishing = version["publishingProfile"]
        assert publishing["replicaCount"] == plan.gallery_replicas
        assert [r["regionalReplicaCount"] for r in publishing["targetRegions"]] == [plan.gallery_replicas]
        definition = graph.named(f"{plan.cluster}-image-{pool.name}").plain()
        assert definition["hyperVGeneration"] == "V2"


def test_the_vhd_upload_comes_before_the_image_version_and_names_the_build_output(graph_7500: Graph) -> None:
    upload = graph_7500.named("research-7500-image-a100-ib-1.0.0-vhd").plain()
    assert upload["environment"]["VHD"] == "build/node-image/research-7500-a100-ib.vhd"
    assert "--type page" in upload["create"]
    assert "research-7500-image-a100-ib-1.0.0-vhd" in graph_7500.named("research-7500-image-a100-ib-1.0.0").depends_on
    version = graph_7500.named("research-7500-image-a100-ib-1.0.0").plain()
    assert version["storageProfile"]["osDiskImage"]["source"]["uri"].endswith(f"/vhds/{upload['environment']['BLOB']}")


def test_the_vhd_upload_records_its_content_and_never_runs_again(graph_7500: Graph, tmp_path: Path) -> None:
    from kilonode.azure.node_image import ABSENT, NOT_READ, vhd_digest

    vhd = tmp_path / "pool.vhd"
    assert vhd_digest(str(vhd)) == ABSENT
    vhd.write_bytes(b"first build")
    first = vhd_digest(str(vhd))
    vhd.write_bytes(b"rebuilt, same path, same version")
    assert vhd_digest(str(vhd)) != first  # recorded in the key, which a published upload ignores
    assert vhd_digest(str(vhd), read=False) == NOT_READ
    # a recorded plan reads no disk: the trigger says so, and the path is not the key
    upload = graph_7500.named("research-7500-image-a100-ib-1.0.0-vhd")
    assert upload.plain()["triggers"] == [NOT_READ, "a100-ib-1.0.0.vhd"]
    assert upload.replace_on_changes == ("triggers[*]",)
    # once it ran, neither a rebuilt VHD nor a moved path runs it again (a published version's blob stays)
    assert set(upload.ignore_changes) == {"triggers", "environment"}
