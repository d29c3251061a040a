"""The platform budgets a stack is checked against (IPs, NICs, subnets, nodes, pods), and the
warnings the plan carries."""

from __future__ import annotations

import math
from collections.abc import Callable

from kilonode.catalog import vm as vm_catalog
from kilonode.catalog.limits import limits
from kilonode.catalog.vm import gpus_of
from kilonode.config.model import ClusterConfig, NodePoolConfig
from kilonode.plan.model import (
    Budget,
    UnrecordedSubnet,
)
from kilonode.plan.resolve.pools import max_pods, own_daemonsets, shard_name
from kilonode.problems import Loc, Problem

AZURE = limits().azure
K8S = limits().kubernetes
ETCD = limits().etcd

# Connections each node keeps open to the apiservers (through the load balancer, one HTTP/2
# connection per client): the kubelet, kube-proxy, the cloud node manager; a GPU node's health
# agent too (kilonode.gpu.agent writes its condition with the node's identity).
NODE_CLIENTS = 3
GPU_NODE_CLIENTS = 1
# kube-apiserver's LimitNOFILE (templates/etc/systemd/system/kube-control-plane.service.j2): one
# descriptor per connection, so the most clients one apiserver can hold.
APISERVER_NOFILE = 1048576


def etcd_members(config: ClusterConfig) -> int:
    """The etcd members of every cluster the stack has."""
    return sum(cluster.members for _, cluster in config.etcd.clusters())


def control_plane_ips(config: ClusterConfig) -> int:
    # etcd members + apiservers + the internal load balancer's frontend
    return etcd_members(config) + config.apiserver.replicas + 1


def growth(pool: NodePoolConfig) -> int:
    """The most nodes the pool may have: its maxNodes (the room its subnet is sized for, and the
    autoscaler's ceiling), or its nodes. Every budget counts this: Azure refuses a scale-up at
    run time, never at `pulumi up`."""
    return max(pool.nodes, pool.max_nodes or 0)


def pool_ips(pool: NodePoolConfig) -> int:
    return growth(pool) * (1 + pool.pods_per_node)


def pod_objects(pool: NodePoolConfig) -> int:
    """Pod objects the pool's nodes may hold at once: a pod per pod IP and the tool's DaemonSet pods
    (hostNetwork, no IP; Kubernetes' threshold counts objects, not addresses)."""
    return growth(pool) * (pool.pods_per_node + len(own_daemonsets(pool)))


def apiserver_connections(config: ClusterConfig) -> int:
    """Long-lived client connections on one apiserver with one apiserver down (the load balancer
    spreads them over those left)."""
    clients = sum(growth(p) * (NODE_CLIENTS + (GPU_NODE_CLIENTS if gpus_of(p.vm_size, p.gpus_per_node) else 0))
                  for p in config.node_pools)
    return math.ceil(clients / max(config.apiserver.replicas - 1, 1))


def etcd_main_writes_per_second(nodes: int, leases_apart: bool = False) -> int:
    """Steady writes to the main etcd from the nodes alone: each Lease renewed every 10 s, each
    Node's status posted every 5 min when nothing changed. Pods, Events (their own cluster) and
    controllers come on top, with the workload. `leases_apart`: the stack has the leases cluster
    (etcd.leases), which takes the renewals instead."""
    status = nodes / K8S.node_status_report_seconds.value
    return math.ceil(status if leases_apart else nodes / K8S.lease_renew_seconds.value + status)


def etcd_leases_writes_per_second(nodes: int) -> int:
    """Steady writes of the node Lease renewals: one per node every 10 s (the leader elections'
    renewals, a handful of Leases every 2 s or so, are lost in the rounding)."""
    return math.ceil(nodes / K8S.lease_renew_seconds.value)


def etcd_leases_bytes(nodes: int) -> int:
    """Every node's Lease and each of its revisions since the last compaction: the share of the
    main etcd's database that the leases cluster takes over (kilonode.plan.resolve.budgets
    etcd_main_bytes), and so that cluster's own database."""
    window = K8S.compaction_interval_seconds.value
    lease = ETCD.lease_object_bytes.value
    return nodes * lease + nodes * window // K8S.lease_renew_seconds.value * lease


def etcd_main_bytes(nodes: int, pods: int, leases_apart: bool = False) -> int:
    """The main etcd's database between two compactions: every Node, Lease and pod, plus every
    revision of them written since the last compaction (the apiserver compacts every 5 min; the
    freed pages are reused, not returned, so the file stays at this peak). `leases_apart`: the
    Leases and their revisions are in the leases cluster (etcd_leases_bytes) instead."""
    window = K8S.compaction_interval_seconds.value
    node = ETCD.node_object_bytes.value
    statuses = nodes * window // K8S.node_status_report_seconds.value * node
    others = nodes * node + pods * ETCD.pod_object_bytes.value + statuses
    return others if leases_apart else others + etcd_leases_bytes(nodes)


def budgets_of(config: ClusterConfig) -> list[Budget]:
    pools = config.node_pools
    vnet_used = sum(pool_ips(p) for p in pools) + control_plane_ips(config)
    nodes = sum(growth(p) for p in pools)
    pods = sum(pod_objects(p) for p in pools)
    widest_nic = max(1 + p.pods_per_node for p in pools)
    densest = max(max_pods(p) for p in pools)
    subnets = 2 + len(pools)
    # one NIC per node and per control-plane VM (the load balancers' frontends are not NICs)
    nics = nodes + etcd_members(config) + config.apiserver.replicas
    vms = nics  # one NIC per VM: every node, etcd member and apiserver
    leases = config.etcd.leases
    return [
        Budget(name="VNet private IPs", used=vnet_used, limit=AZURE.vnet_private_ips.value,
               source=AZURE.vnet_private_ips.source, hard=True),
        Budget(name="NICs per subscription and region", used=nics, limit=AZURE.nics_per_subscription_region.value,
               source=AZURE.nics_per_subscription_region.source, hard=True),
        Budget(name="VMs per subscription and region", used=vms, limit=AZURE.vms_per_subscription_region.value,
               source=AZURE.vms_per_subscription_region.source, hard=True),
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
        Budget(name="main etcd database (bytes)", used=etcd_main_bytes(nodes, pods, leases is not None),
               limit=config.etcd.main.quota_backend_bytes,
               source="the stack's etcd.main quota; objects as measured in bench/measure_object_sizes.py, "
                      "history of one 5 min compaction interval"
                      + ("; the Leases in etcd.leases" if leases is not None else ""), hard=True),
        Budget(name="main etcd writes/s from nodes", used=etcd_main_writes_per_second(nodes, leases is not None),
               limit=ETCD.benchmark_writes_per_second.value, source=ETCD.benchmark_writes_per_second.source,
               hard=False),
        *([] if leases is None else [
            Budget(name="leases etcd database (bytes)", used=etcd_leases_bytes(nodes),
                   limit=leases.quota_backend_bytes,
                   source="the stack's etcd.leases quota; a node Lease as measured in bench/measure_object_sizes.py, "
                          "its renewals of one 5 min compaction interval", hard=True),
            Budget(name="leases etcd writes/s from nodes", used=etcd_leases_writes_per_second(nodes),
                   limit=ETCD.benchmark_writes_per_second.value, source=ETCD.benchmark_writes_per_second.source,
                   hard=False),
        ]),
        Budget(name="connections per apiserver (one down)", used=apiserver_connections(config),
               limit=APISERVER_NOFILE, source="kube-apiserver's LimitNOFILE in its unit (one descriptor per "
                                              "connection)", hard=True),
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
    for name, (loc, say) in _OVER.items():
        budget = by_name.get(name)
        if budget is not None and budget.used > budget.limit:
            problems.append(Problem(loc, say(budget, config)))
    problems += _etcd_problems(config, by_name)
    subnets = by_name["subnets per VNet"]
    if subnets.used > subnets.limit:
        problems.append(Problem(
            ("nodePools",),
            f"{subnets.used} subnets (2 control-plane + 1 per pool) exceed Azure's {subnets.limit} "
            "per VNet; merge pools",
        ))
    return problems


# Hard budgets past their limit, with where the problem points and what it says.
_OVER: dict[str, tuple[Loc, Callable[[Budget, ClusterConfig], str]]] = {
    "VMs per subscription and region": (("nodePools",), lambda b, _: (
        f"{b.used:,} VMs (every node at each pool's maxNodes or nodes, every etcd member and apiserver) exceed the "
        f"{b.limit:,} of {b.source}: Azure refuses the scale sets past it, and the limit cannot be raised; split "
        "the nodes over clusters in different subscriptions or regions (`kilonode fleet STACK --nodes N` writes "
        "them)")),
    "NICs per subscription and region": (("nodePools",), lambda b, _: (
        f"{b.used:,} NICs (one per node at each pool's maxNodes or nodes, one per control-plane VM) exceed the "
        f"{b.limit:,} of {b.source}: Azure refuses the scale sets past it; split the nodes over clusters in "
        "different subscriptions or regions (`kilonode fleet STACK --nodes N` writes them)")),
    "connections per apiserver (one down)": (("apiserver", "replicas"), lambda b, _: (
        f"{b.used:,} long-lived client connections per apiserver with one down, above its {b.limit:,} file "
        f"descriptors ({b.source}); add apiservers")),
}


def _etcd_problems(config: ClusterConfig, by_name: dict[str, Budget]) -> list[Problem]:
    problems = []
    etcd = by_name["main etcd database (bytes)"]
    apart = config.etcd.leases is not None
    if etcd.used > etcd.limit:
        way_out = ("fewer nodes or pods per cluster" if apart else
                   "split leases to their own etcd cluster (etcd.leases), or fewer nodes per cluster")
        problems.append(Problem(
            ("etcd", "main", "quotaBackendBytes"),
            f"the main etcd would hold about {etcd.used:,} bytes ({_etcd_terms(config)}), above its quota "
            f"{etcd.limit:,}: it raises NOSPACE and every write stops; {way_out}"))
    leases = by_name.get("leases etcd database (bytes)")
    if leases is not None and leases.used > leases.limit:
        nodes = sum(growth(p) for p in config.node_pools)
        problems.append(Problem(
            ("etcd", "leases", "quotaBackendBytes"),
            f"the leases etcd would hold about {leases.used:,} bytes ({nodes:,} node Leases x "
            f"{ETCD.lease_object_bytes.value} B and {_renewals()} renewals each in 5 min of history), above its "
            f"quota {leases.limit:,}: it raises NOSPACE, no node can renew its Lease and no leader election "
            "holds; raise etcd.leases.quotaBackendBytes, or fewer nodes per cluster"))
    return problems


def _renewals() -> int:
    """Lease renewals per node kept between two compactions."""
    return K8S.compaction_interval_seconds.value // K8S.lease_renew_seconds.value


def _etcd_terms(config: ClusterConfig) -> str:
    nodes = sum(growth(p) for p in config.node_pools)
    pods = sum(pod_objects(p) for p in config.node_pools)
    if config.etcd.leases is not None:
        return (f"{nodes:,} Nodes x {ETCD.node_object_bytes.value:,} B, {pods:,} pods x "
                f"{ETCD.pod_object_bytes.value:,} B, and 5 min of history: one status per Node; the Leases are in "
                "etcd.leases")
    return (f"{nodes:,} Nodes x {ETCD.node_object_bytes.value:,} B and Leases x {ETCD.lease_object_bytes.value} B, "
            f"{pods:,} pods x {ETCD.pod_object_bytes.value:,} B, and 5 min of history: "
            f"{_renewals()} Lease renewals and one status per Node")


def _vnet_overflow(config: ClusterConfig, vnet: Budget) -> Problem:
    pools = config.node_pools
    terms = " + ".join(f"{growth(p)}{' (maxNodes)' if growth(p) > p.nodes else ''} × (1 + {p.pods_per_node})"
                       for p in pools[:4])
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
        lead = f"one VNet cannot hold {growth(biggest)} nodes even with hostNetwork pods only"
    else:
        lead = "the cluster needs more private IPs than one VNet allows"
    return Problem(
        loc,
        f"{lead}: nodes (or maxNodes, where the pool may grow) × (1 + podsPerNode) + control plane = "
        f"{terms} + {control} = "
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


def location_warnings(config: ClusterConfig) -> list[str]:
    """A location written other than as its programmatic name was taken as that name
    (ClusterConfig._programmatic_location says why); say so, and how to write it."""
    written = config.location_as_written
    if written is None:
        return []
    display = vm_catalog.region_display_names().get(config.location, config.location)
    what = "the display name of" if written == display else f"taken as the region {display},"
    return [
        f"location: {written!r} is {what} {config.location}, the programmatic name ARM returns; ARM ignores "
        f"case and spaces in a location, and kilonode writes this one spelling everywhere; write "
        f"`location: {config.location}` to drop this note"
    ]


def gallery_replicas(config: ClusterConfig) -> int:
    image = config.node_image
    wanted = math.ceil(image.max_concurrent_vm_creates / AZURE.vms_per_gallery_replica.value)
    return min(max(wanted, image.min_replicas), AZURE.gallery_replicas_max.value)
