"""The platform budgets a stack is checked against (IPs, NICs, subnets, nodes, pods), and the
warnings the plan carries."""

from __future__ import annotations

import math

from kilonode.catalog.limits import limits
from kilonode.config.model import ClusterConfig, NodePoolConfig
from kilonode.plan.model import (
    Budget,
    UnrecordedSubnet,
)
from kilonode.plan.resolve.pools import shard_name
from kilonode.problems import Loc, Problem

AZURE = limits().azure
K8S = limits().kubernetes


def control_plane_ips(config: ClusterConfig) -> int:
    # etcd members + apiservers + the internal load balancer's frontend
    return config.etcd.main.members + config.etcd.events.members + config.apiserver.replicas + 1


def pool_ips(pool: NodePoolConfig) -> int:
    return pool.nodes * (1 + pool.pods_per_node)


def budgets_of(config: ClusterConfig) -> list[Budget]:
    pools = config.node_pools
    vnet_used = sum(pool_ips(p) for p in pools) + control_plane_ips(config)
    nodes = sum(p.nodes for p in pools)
    pods = sum(p.nodes * p.pods_per_node for p in pools)
    widest_nic = max(1 + p.pods_per_node for p in pools)
    densest = max(p.pods_per_node + p.host_network_pods for p in pools)
    subnets = 2 + len(pools)
    return [
        Budget(name="VNet private IPs", used=vnet_used, limit=AZURE.vnet_private_ips.value,
               source=AZURE.vnet_private_ips.source, hard=True),
        Budget(name="IP configurations per NIC", used=widest_nic, limit=AZURE.ip_configs_per_nic.value,
               source=AZURE.ip_configs_per_nic.source, hard=True),
        Budget(name="subnets per VNet", used=subnets, limit=AZURE.subnets_per_vnet.value,
               source=AZURE.subnets_per_vnet.source, hard=True),
        Budget(name="nodes per cluster", used=nodes, limit=K8S.nodes.value,
               source=K8S.nodes.source, hard=False),
        Budget(name="pods per cluster", used=pods, limit=K8S.pods.value,
               source=K8S.pods.source, hard=False),
        Budget(name="pods per node (maxPods)", used=densest, limit=K8S.pods_per_node.value,
               source=K8S.pods_per_node.source, hard=False),
    ]


def budget_problems(config: ClusterConfig, budgets: list[Budget]) -> list[Problem]:
    problems: list[Problem] = []
    by_name = {b.name: b for b in budgets}
    vnet = by_name["VNet private IPs"]
    if vnet.used > vnet.limit:
        problems.append(_vnet_overflow(config, vnet))
    for index, pool in enumerate(config.node_pools):
        wanted = 1 + pool.pods_per_node
        if wanted > AZURE.ip_configs_per_nic.value:
            problems.append(Problem(
                ("nodePools", index, "podsPerNode"),
                f"each NIC would need 1 + {pool.pods_per_node} = {wanted} IP configurations, "
                f"above Azure's {AZURE.ip_configs_per_nic.value} per NIC; lower podsPerNode to at "
                f"most {AZURE.ip_configs_per_nic.value - 1}",
            ))
    for index, pool in enumerate(config.node_pools):
        longest = len(shard_name(config.name, pool.name, 0))
        if longest > AZURE.scale_set_name_prefix.value:
            problems.append(Problem(
                ("nodePools", index, "name"),
                f"scale-set names '<cluster>-<pool>-000' would be {longest} characters, above the "
                f"{AZURE.scale_set_name_prefix.value} of {AZURE.scale_set_name_prefix.source}; "
                "shorten the pool name (or the cluster name)",
            ))
    subnets = by_name["subnets per VNet"]
    if subnets.used > subnets.limit:
        problems.append(Problem(
            ("nodePools",),
            f"{subnets.used} subnets (2 control-plane + 1 per pool) exceed Azure's {subnets.limit} "
            "per VNet; merge pools",
        ))
    return problems


def _vnet_overflow(config: ClusterConfig, vnet: Budget) -> Problem:
    pools = config.node_pools
    terms = " + ".join(f"{p.nodes} × (1 + {p.pods_per_node})" for p in pools[:4])
    if len(pools) > 4:
        terms += f" + … ({len(pools) - 4} more pools)"
    control = control_plane_ips(config)
    biggest_index, biggest = max(enumerate(pools), key=lambda item: pool_ips(item[1]))
    alone = pool_ips(biggest) + control > vnet.limit
    loc: Loc = ("nodePools", biggest_index, "nodes") if alone else ("nodePools",)
    ways = [
        "lower podsPerNode (0 = hostNetwork pods only)" if any(p.pods_per_node for p in pools) else "",
        "split the nodes over several clusters, one VNet each (peering does not raise the per-VNet cap)",
    ]
    if alone and biggest.pods_per_node == 0:
        lead = f"one VNet cannot hold {biggest.nodes} nodes even with hostNetwork pods only"
    else:
        lead = "the cluster needs more private IPs than one VNet allows"
    return Problem(
        loc,
        f"{lead}: nodes × (1 + podsPerNode) + control plane = {terms} + {control} = "
        f"{vnet.used} > {vnet.limit} ({vnet.source}); ways out: "
        + "; ".join(w for w in ways if w),
    )


def budget_warnings(budgets: list[Budget]) -> list[str]:
    return [
        f"{b.name}: {b.used} is above the {b.limit} of {b.source} (supported, not enforced)"
        for b in budgets
        if not b.hard and b.used > b.limit
    ]


def unrecorded_warnings(unrecorded: tuple[UnrecordedSubnet, ...]) -> list[str]:
    if not unrecorded:
        return []
    placed = ", ".join(f"{u.field}={u.subnet}" for u in unrecorded)
    return [
        f"addresses not recorded in the stack file: {placed}. The plan placed them, but nothing keeps them "
        "there when other pools change; `kilonode allocate STACK` records them (the Pulumi program refuses "
        "to create unrecorded subnets)"
    ]


def acknowledged_warnings(config: ClusterConfig) -> list[str]:
    return [
        f"acknowledgeRestart: {group}: the next `pulumi up` may restart or replace every {group} machine at "
        "once; remove it from the stack file after that update"
        for group in config.acknowledge_restart
    ]


def gallery_replicas(config: ClusterConfig) -> int:
    image = config.node_image
    wanted = math.ceil(image.max_concurrent_vm_creates / AZURE.vms_per_gallery_replica.value)
    return min(max(wanted, image.min_replicas), AZURE.gallery_replicas_max.value)
