"""The planner: addresses, shards, budgets and limit errors that state their arithmetic."""

from __future__ import annotations

from ipaddress import IPv4Address

import pytest

from kilonode.config import load_stack
from kilonode.config.model import ClusterConfig
from kilonode.plan import ClusterPlan, plan_stack, resolve
from kilonode.problems import PlanError, StackError
from tests.conftest import StackWriter, shipped_cluster_value


def plan_of(cluster: dict, write_stack: StackWriter) -> ClusterPlan:
    return plan_stack(load_stack(str(write_stack(cluster))))


def test_infiniband_pools_are_sharded_into_scale_sets_of_at_most_100(plans: dict[str, ClusterPlan]) -> None:
    plan = plans["research-7500"]
    for pool in plan.node_pools:
        if not pool.gpus_per_node:
            continue  # the system pool
        assert pool.infiniband
        assert all(s.capacity <= 100 and s.single_placement_group for s in pool.shards)
        assert sum(s.capacity for s in pool.shards) == pool.nodes
    assert sum(len(p.shards) for p in plan.node_pools) >= 75


def test_non_infiniband_pools_use_scale_sets_of_at_most_1000(plans: dict[str, ClusterPlan]) -> None:
    pool, system, monitoring = plans["research-2500"].node_pools
    assert not pool.infiniband
    assert [s.capacity for s in pool.shards] == [834, 833, 833]
    assert not any(s.single_placement_group for s in pool.shards)
    # a system pool: a scale set per zone, so its nodes spread over the zones
    assert system.system and [(s.capacity, s.zone) for s in system.shards] == [(1, "1"), (1, "2"), (1, "3")]
    # the Prometheus pool: one node, one scale set
    assert monitoring.monitoring and [s.capacity for s in monitoring.shards] == [1]


def test_uneven_pool_spreads_the_remainder_over_the_first_shards(write_stack: StackWriter) -> None:
    cluster = shipped_cluster_value("local")
    del cluster["nodePools"][0]["gpusPerNode"]  # an InfiniBand size's own 8
    cluster["nodePools"][0].update(nodes=205, infiniband=True, subnet=None, vmSize="Standard_ND96asr_v4")
    [pool] = plan_of(cluster, write_stack).node_pools
    assert [s.capacity for s in pool.shards] == [69, 68, 68]
    assert len({s.name for s in pool.shards}) == 3


@pytest.mark.parametrize("name", ["local", "research-2500", "research-7500"])
def test_every_static_ip_is_unique_and_inside_its_subnet(plans: dict[str, ClusterPlan], name: str) -> None:
    plan = plans[name]
    etcd = [(m.ip, plan.network.etcd_subnet) for c in plan.etcd_clusters for m in c.members]
    api = [(i.ip, plan.network.control_plane_subnet) for i in plan.control_plane.instances]
    lb = [(plan.control_plane.load_balancer_ip, plan.network.control_plane_subnet)]
    addresses = etcd + api + lb
    assert len({ip for ip, _ in addresses}) == len(addresses)
    for ip, subnet in addresses:
        assert ip in subnet
        # Azure reserves the first four and the last address of every subnet
        assert int(ip) - int(subnet.network_address) >= 4 and ip != subnet.broadcast_address


@pytest.mark.parametrize("name", ["local", "research-2500", "research-7500"])
def test_subnets_are_inside_the_vnet_and_disjoint(plans: dict[str, ClusterPlan], name: str) -> None:
    plan = plans[name]
    subnets = [plan.network.control_plane_subnet, plan.network.etcd_subnet] + [p.subnet for p in plan.node_pools]
    for i, subnet in enumerate(subnets):
        assert subnet.subnet_of(plan.network.vnet_cidr)
        assert not any(subnet.overlaps(other) for other in subnets[:i])
    for pool in plan.node_pools:
        assert pool.subnet.num_addresses >= pool.nodes * pool.ip_configs_per_nic + 5


def test_events_override_names_every_events_member_over_https(plans: dict[str, ClusterPlan]) -> None:
    plan = plans["research-7500"]
    expected = "/events#" + ";".join(f"https://{m.ip}:2379" for m in plan.etcd_events.members)
    assert plan.control_plane.etcd_servers_overrides == expected
    assert len(plan.etcd_events.members) == 3
    assert plan.control_plane.etcd_servers.count("https://") == 5


def test_main_and_events_members_never_share_an_address_or_token(plans: dict[str, ClusterPlan]) -> None:
    plan = plans["local"]
    assert {m.ip for m in plan.etcd_main.members}.isdisjoint(m.ip for m in plan.etcd_events.members)
    assert plan.etcd_main.token != plan.etcd_events.token


def test_appending_a_pool_moves_no_existing_address(write_stack: StackWriter) -> None:
    cluster = shipped_cluster_value("research-7500")
    before = plan_of(cluster, write_stack)
    cluster["nodePools"].append({"name": "extra", "nodes": 500, "podsPerNode": 3})
    after = plan_of(cluster, write_stack)
    assert after.network.etcd_subnet == before.network.etcd_subnet
    assert after.control_plane.instances == before.control_plane.instances
    assert [p.subnet for p in after.node_pools[:-1]] == [p.subnet for p in before.node_pools]


def test_pool_overflowing_the_vnet_is_refused_with_arithmetic_and_ways_out(write_stack: StackWriter) -> None:
    cluster = shipped_cluster_value("research-7500")
    cluster["nodePools"][0]["podsPerNode"] = 16
    with pytest.raises(StackError) as caught:
        plan_of(cluster, write_stack)
    [problem] = caught.value.problems
    text = problem.format(caught.value.file)
    # the pools in order (a100-ib now at 16 pods, h100-ib, system, monitoring), then the control plane
    assert "5000 × (1 + 16) + 2500 × (1 + 3) + 3 × (1 + 16) + 1 × (1 + 4) + 14 = 95070 > 65536" in text
    assert 5000 * 17 + 2500 * 4 + 3 * 17 + 1 * 5 + 14 == 95070
    assert "lower podsPerNode" in text and "split the nodes over several clusters" in text
    assert problem.line is not None


def test_a_100000_node_pool_cannot_fit_one_vnet_even_with_host_network(write_stack: StackWriter) -> None:
    cluster = shipped_cluster_value("local")
    cluster["nodePools"][0].update(nodes=100_000, podsPerNode=0)
    with pytest.raises(StackError) as caught:
        plan_of(cluster, write_stack)
    vnet, vms, nics, nat = caught.value.problems
    assert vnet.path == nat.path == "nodePools[0].nodes"
    # one VM per node and per control-plane member: 25,000 per subscription and region
    assert vms.path == "nodePools" and vms.message.startswith("100,007 VMs") and "25,000" in vms.message
    assert "one VNet cannot hold 100000 nodes even with hostNetwork pods only" in vnet.message
    assert "100000 × (1 + 0) + 8 = 100008 > 65536" in vnet.message
    # one NIC per node and per control-plane VM
    assert nics.path == "nodePools" and "100,007 NICs" in nics.message and "65,536" in nics.message
    assert nat.message.startswith("pool-cpu: 100,000 nodes x 128 SNAT ports = 12,800,000 ports > 16 public IPs")


def test_nic_ip_configuration_limit(write_stack: StackWriter) -> None:
    cluster = shipped_cluster_value("local")
    cluster["nodePools"][0]["podsPerNode"] = 256
    with pytest.raises(StackError) as caught:
        plan_of(cluster, write_stack)
    assert any(
        p.path == "nodePools[0].podsPerNode" and "1 + 256 = 257" in p.message for p in caught.value.problems
    )


def test_pinned_subnet_too_small_for_the_pool(write_stack: StackWriter) -> None:
    cluster = shipped_cluster_value("local")
    cluster["nodePools"][0]["subnet"] = "10.0.200.0/28"
    with pytest.raises(StackError) as caught:
        plan_of(cluster, write_stack)
    [problem] = caught.value.problems
    assert problem.path == "nodePools[0].subnet"
    assert "10.0.200.0/28 holds at most 1 nodes of this pool" in problem.message
    assert "2 nodes need a /27. Growing past it moves this pool's subnet 10.0.200.0/28 → 10.0.2.0/27" in problem.message


def test_24900_nodes_fit_a_wider_vnet_with_host_network_pods(write_stack: StackWriter) -> None:
    """Past /16 with hostNetwork pods, up to Azure's 25,000 VMs per subscription and region."""
    cluster = shipped_cluster_value("local")
    # one pool, one NAT gateway: 16 x 64,512 ports over 24,900 nodes is 41 each
    cluster["network"] = {"vnetCidr": "10.0.0.0/15", "minSnatPortsPerNode": 41}
    del cluster["nodePools"][0]["gpusPerNode"]
    cluster["nodePools"][0].update(nodes=24_900, podsPerNode=0, infiniband=True, subnet=None,
                                   vmSize="Standard_ND96asr_v4")
    [pool] = plan_of(cluster, write_stack).node_pools
    assert len(pool.shards) == 249
    assert pool.ip_configs_per_nic == 1


def test_gallery_replicas_follow_concurrent_creates_within_bounds(plans: dict[str, ClusterPlan]) -> None:
    assert plans["research-7500"].gallery_replicas == 50  # 1,000 concurrent creates / 20
    assert plans["local"].gallery_replicas == 1


def test_max_pods_counts_pod_ips_and_the_daemonsets_pods(plans: dict[str, ClusterPlan]) -> None:
    """A pod per pod IP plus the tool's DaemonSet pods (hostNetwork): kube-proxy,
    cloud-node-manager, calico-node and node-exporter everywhere, the device plugin and dcgm-exporter on
    GPU pools, the RDMA plugin on InfiniBand pools, Azure Disk CSI's node plugin on the pools without
    GPUs and on monitoring and system pools."""
    for plan in plans.values():
        for pool in plan.node_pools:
            assert pool.ip_configs_per_nic == 1 + pool.pods_per_node
            disks = not pool.gpus_per_node or pool.monitoring or pool.system
            agents = 4 + (2 if pool.gpus_per_node else 0) + (1 if pool.infiniband else 0) + (1 if disks else 0)
            assert pool.max_pods == pool.pods_per_node + agents, pool.name
    assert {p.name: p.max_pods for p in plans["research-7500"].node_pools} == {
        "a100-ib": 3 + 7, "h100-ib": 3 + 7, "system": 16 + 5, "monitoring": 4 + 5}


def test_pause_image_is_always_preloaded_first(plans: dict[str, ClusterPlan]) -> None:
    for plan in plans.values():
        for pool in plan.node_pools:
            assert pool.preload_images[0].image == pool.pause_image
            assert pool.preload_images[0].source == "build:pause"


def test_resolve_is_deterministic() -> None:
    stack = load_stack("research-7500")
    first = resolve(stack.config, stack.sysctl_profile).model_dump_json()
    assert first == resolve(stack.config, stack.sysctl_profile).model_dump_json()


def test_resolve_raises_plan_errors_without_a_file() -> None:
    stack = load_stack("local")
    raw = stack.config.model_dump(by_alias=True)
    raw["nodePools"][0]["nodes"] = 70_000
    with pytest.raises(PlanError) as caught:
        resolve(ClusterConfig.model_validate(raw), stack.sysctl_profile)
    vnet, vms, nics, nat = caught.value.problems
    assert [(p.path, p.line) for p in (vnet, nat)] == [("nodePools[0].nodes", None), ("nodePools[0].nodes", None)]
    assert vms.path == nics.path == "nodePools" and "VMs" in vms.message and "NICs" in nics.message
    assert "70000 × (1 + 8) + 8 = 630008 > 65536" in vnet.message
    assert nat.message.startswith("pool-cpu: 70,000 nodes x 128 SNAT ports = 8,960,000 ports > 16 public IPs")


def test_sysctl_override_replaces_the_value_and_says_so(write_stack: StackWriter) -> None:
    cluster = shipped_cluster_value("local")
    cluster["sysctl"] = {"overrides": {"net.ipv4.neigh.default.gc_thresh3": 120000, "vm.max_map_count": 262144}}
    [pool] = plan_of(cluster, write_stack).node_pools
    settings = {s.name: s for s in pool.sysctls}
    assert settings["net.ipv4.neigh.default.gc_thresh3"].value == 120000
    assert "profile default was 100000" in settings["net.ipv4.neigh.default.gc_thresh3"].reason
    assert settings["vm.max_map_count"].value == 262144
    assert settings["net.ipv4.neigh.default.gc_thresh1"].value == 80000


def test_kubernetes_service_addresses(plans: dict[str, ClusterPlan]) -> None:
    cp = plans["local"].control_plane
    assert cp.kubernetes_service_ip == IPv4Address("172.16.0.1")
    assert cp.cluster_dns_ip == IPv4Address("172.16.0.10")


def test_scale_set_names_must_fit_azure_hostname_prefixes(write_stack: StackWriter) -> None:
    cluster = shipped_cluster_value("local")
    cluster["name"] = "a" * 30
    cluster["nodePools"][0]["name"] = "b" * 30
    with pytest.raises(StackError) as caught:
        plan_of(cluster, write_stack)
    [problem] = caught.value.problems
    assert problem.path == "nodePools[0].name" and "65 characters, above the 58" in problem.message


def test_each_nat_gateway_is_sized_for_its_pools_room_at_the_snat_floor(plans: dict[str, ClusterPlan]) -> None:
    gateways = {g.name: g for g in plans["research-7500"].network.nat_gateways}
    assert sorted(gateways) == ["control-plane", "pool-a100-ib", "pool-h100-ib", "pool-monitoring", "pool-system"]
    # 5,000 x 128 = 640,000 ports: 10 IPs needed, a /28 (16) given; 16 x 64,512 / 5,000 = 206 each
    a100 = gateways["pool-a100-ib"]
    assert (a100.prefix_length, a100.public_ips, a100.ports_per_node) == (28, 16, 206)
    # 2,500 x 128 = 320,000: 5 IPs, a /29 (8): 206 each
    assert (gateways["pool-h100-ib"].prefix_length, gateways["pool-h100-ib"].ports_per_node) == (29, 206)
    assert gateways["control-plane"].subnets == ("control-plane", "etcd")
    assert gateways["control-plane"].prefix_length == 31
    # the monitoring pool's one node: the smallest prefix Azure allows, /31 (2 IPs)
    assert (gateways["pool-monitoring"].nodes, gateways["pool-monitoring"].prefix_length) == (1, 31)


def test_a_pool_one_gateway_cannot_serve_is_refused_with_the_arithmetic(write_stack: StackWriter) -> None:
    cluster = shipped_cluster_value("local")
    cluster["network"] = {"minSnatPortsPerNode": 1024}
    cluster["nodePools"][0].update(nodes=2_000, subnet=None)
    with pytest.raises(StackError) as caught:
        plan_of(cluster, write_stack)
    [problem] = caught.value.problems
    assert problem.path == "nodePools[0].nodes"
    assert problem.message == (
        "pool-cpu: 2,000 nodes x 1024 SNAT ports = 2,048,000 ports > 16 public IPs x 64,512 = 1,032,192 that one "
        "NAT gateway has; split the pool into pools of at most 1,008 nodes (each subnet gets its own gateway), "
        "or lower network.minSnatPortsPerNode to at most 516"
    )
