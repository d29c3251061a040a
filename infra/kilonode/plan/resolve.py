"""resolve(config) -> ClusterPlan: pure and deterministic, no I/O, no Pulumi.

Its cost grows with pools and scale-set shards, never with the node count: nothing here
enumerates nodes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network

from kilonode.config.catalog import AZURE_NVME_LOCAL_MODELS, AZURE_TEMP_DISK, gpus_of, infiniband_of, vm_size
from kilonode.config.checks import effective_sysctls
from kilonode.config.model import ClusterConfig, EtcdClusterConfig, NodePoolConfig
from kilonode.config.sysctl_profile import SysctlProfile
from kilonode.node.gpu.protocol import EFFECT, STARTUP_TAINT, STARTUP_VALUE
from kilonode.plan import capacity, defaults, limits
from kilonode.plan.model import (
    ApiserverInstance,
    Budget,
    ClusterPlan,
    ControlPlanePlan,
    EtcdClusterPlan,
    EtcdMember,
    LocalStoragePlan,
    NatGatewayPlan,
    NetworkPlan,
    NodePoolPlan,
    PreloadImage,
    ScaleSetShard,
    SysctlSetting,
    UnrecordedSubnet,
)
from kilonode.plan.wellknown import (
    APISERVER_PORT,
    ETCD_CLIENT_PORT,
    ETCD_METRICS_PORT,
    ETCD_PEER_PORT,
    NCCL_TOPOLOGY_LABEL,
    PRELOAD_DIR,
)
from kilonode.problems import Loc, PlanError, Problem, dotted


def resolve(config: ClusterConfig, sysctl_profile: SysctlProfile) -> ClusterPlan:
    problems: list[Problem] = []
    budgets = _budgets(config)
    problems += _budget_problems(config, budgets)
    nat_gateways, nat_problems = _nat_gateways(config)
    problems += nat_problems
    if problems:
        raise PlanError(problems)

    subnets = _allocate_subnets(config)  # raises PlanError when the VNet cannot hold them
    etcd_main = _etcd_cluster(config, "main", config.etcd.main, subnets.etcd, limits.ETCD_MAIN_FIRST_OFFSET)
    etcd_events = _etcd_cluster(
        config, "events", config.etcd.events, subnets.etcd, limits.ETCD_EVENTS_FIRST_OFFSET
    )
    control_plane = _control_plane(config, subnets.control_plane, etcd_main, etcd_events)
    sysctls = _sysctls(config, sysctl_profile)
    pools = tuple(
        _node_pool(config, pool, subnets.pools[pool.name], sysctls) for pool in config.node_pools
    )
    pools, teams = _capacity(config, pools)
    net = config.network
    return ClusterPlan(
        cluster=config.name,
        location=config.location,
        zones=config.zones,
        kubernetes_version=config.kubernetes_version,
        network=NetworkPlan(
            vnet_cidr=net.vnet_cidr,
            control_plane_subnet=subnets.control_plane,
            etcd_subnet=subnets.etcd,
            apiserver_allowed_cidrs=net.apiserver_allowed_cidrs,
            admin_cidr=net.admin_cidr,
            public_ips_on_control_plane=net.public_ips_on_control_plane,
            unrecorded=subnets.unrecorded,
            nat_gateways=nat_gateways,
        ),
        etcd_main=etcd_main,
        etcd_events=etcd_events,
        control_plane=control_plane,
        node_pools=pools,
        gallery_replicas=gallery_replicas(config),
        node_image_version=config.node_image.version,
        etcd_image_version=config.etcd_image.version,
        control_plane_image_version=config.control_plane_image.version,
        # A handful of VMs, created one group at a time: the production floor is enough.
        role_image_replicas=config.node_image.min_replicas,
        acknowledge_restart=config.acknowledge_restart,
        teams=teams.teams,
        budgets=tuple(budgets),
        warnings=tuple(
            _warnings(budgets) + _unrecorded_warnings(subnets.unrecorded) + _acknowledged_warnings(config)
            + list(teams.warnings)
        ),
    )


def _capacity(
    config: ClusterConfig, pools: tuple[NodePoolPlan, ...]
) -> tuple[tuple[NodePoolPlan, ...], capacity.TeamPlacement]:
    """Teams' shards, then each autoscaled pool's node groups (kilonode.plan.capacity)."""
    placement, problems = capacity.place_teams(config, pools)
    problems += capacity.catalogue_problems(config)
    placed = []
    for index, (pool_config, pool) in enumerate(zip(config.node_pools, pools, strict=True)):
        shards = tuple(s.model_copy(update={"team": placement.shard_team.get(s.name)}) for s in pool.shards)
        pool = pool.model_copy(update={"shards": shards})
        scaling, pool_problems = capacity.plan_autoscaling(index, pool_config, pool)
        problems += pool_problems
        placed.append(pool.model_copy(update={"autoscaling": scaling}))
    if problems:
        raise PlanError(problems)
    return tuple(placed), placement


# --- budgets -------------------------------------------------------------------------

def _control_plane_ips(config: ClusterConfig) -> int:
    # etcd members + apiservers + the internal load balancer's frontend
    return config.etcd.main.members + config.etcd.events.members + config.apiserver.replicas + 1


def _pool_ips(pool: NodePoolConfig) -> int:
    return pool.nodes * (1 + pool.pods_per_node)


def _budgets(config: ClusterConfig) -> list[Budget]:
    pools = config.node_pools
    vnet_used = sum(_pool_ips(p) for p in pools) + _control_plane_ips(config)
    nodes = sum(p.nodes for p in pools)
    pods = sum(p.nodes * p.pods_per_node for p in pools)
    widest_nic = max(1 + p.pods_per_node for p in pools)
    densest = max(p.pods_per_node + p.host_network_pods for p in pools)
    subnets = 2 + len(pools)
    return [
        Budget(name="VNet private IPs", used=vnet_used, limit=limits.VNET_PRIVATE_IPS.value,
               source=limits.VNET_PRIVATE_IPS.source, hard=True),
        Budget(name="IP configurations per NIC", used=widest_nic, limit=limits.IP_CONFIGS_PER_NIC.value,
               source=limits.IP_CONFIGS_PER_NIC.source, hard=True),
        Budget(name="subnets per VNet", used=subnets, limit=limits.SUBNETS_PER_VNET.value,
               source=limits.SUBNETS_PER_VNET.source, hard=True),
        Budget(name="nodes per cluster", used=nodes, limit=limits.K8S_NODES.value,
               source=limits.K8S_NODES.source, hard=False),
        Budget(name="pods per cluster", used=pods, limit=limits.K8S_PODS.value,
               source=limits.K8S_PODS.source, hard=False),
        Budget(name="pods per node (maxPods)", used=densest, limit=limits.K8S_PODS_PER_NODE.value,
               source=limits.K8S_PODS_PER_NODE.source, hard=False),
    ]


def _budget_problems(config: ClusterConfig, budgets: list[Budget]) -> list[Problem]:
    problems: list[Problem] = []
    by_name = {b.name: b for b in budgets}
    vnet = by_name["VNet private IPs"]
    if vnet.used > vnet.limit:
        problems.append(_vnet_overflow(config, vnet))
    for index, pool in enumerate(config.node_pools):
        wanted = 1 + pool.pods_per_node
        if wanted > limits.IP_CONFIGS_PER_NIC.value:
            problems.append(Problem(
                ("nodePools", index, "podsPerNode"),
                f"each NIC would need 1 + {pool.pods_per_node} = {wanted} IP configurations, "
                f"above Azure's {limits.IP_CONFIGS_PER_NIC.value} per NIC; lower podsPerNode to at "
                f"most {limits.IP_CONFIGS_PER_NIC.value - 1}",
            ))
    for index, pool in enumerate(config.node_pools):
        longest = len(shard_name(config.name, pool.name, 0))
        if longest > limits.SCALE_SET_NAME_PREFIX.value:
            problems.append(Problem(
                ("nodePools", index, "name"),
                f"scale-set names '<cluster>-<pool>-000' would be {longest} characters, above the "
                f"{limits.SCALE_SET_NAME_PREFIX.value} of {limits.SCALE_SET_NAME_PREFIX.source}; "
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


def _nat_gateways(config: ClusterConfig) -> tuple[tuple[NatGatewayPlan, ...], list[Problem]]:
    """One NAT gateway per pool subnet (a subnet takes one gateway, a gateway at most 16
    IPs), one shared by the control-plane and etcd subnets; each gateway's public IP prefix
    sized for its machines at the stack's SNAT-ports-per-node floor."""
    floor = config.network.min_snat_ports_per_node
    per_ip, most = limits.SNAT_PORTS_PER_IP.value, limits.NAT_IPS_PER_GATEWAY.value
    control = config.etcd.main.members + config.etcd.events.members + config.apiserver.replicas
    wanted: list[tuple[str, tuple[str, ...], int, Loc]] = [
        ("control-plane", ("control-plane", "etcd"), control, ("network", "minSnatPortsPerNode")),
    ] + [
        (f"pool-{pool.name}", (f"pool-{pool.name}",), slot_nodes(pool), ("nodePools", i, "nodes"))
        for i, pool in enumerate(config.node_pools)
    ]
    gateways: list[NatGatewayPlan] = []
    problems: list[Problem] = []
    for name, subnets, nodes, loc in wanted:
        ips = -(-nodes * floor // per_ip)  # ceil
        length = next((n for n in limits.NAT_PREFIX_LENGTHS if 2 ** (32 - n) >= ips), None)
        if length is None:
            most_nodes = most * per_ip // floor
            problems.append(Problem(
                loc,
                f"{name}: {nodes:,} nodes x {floor} SNAT ports = {nodes * floor:,} ports > {most} public IPs x "
                f"{per_ip:,} = {most * per_ip:,} that one NAT gateway has; split the pool into pools of at most "
                f"{most_nodes:,} nodes (each subnet gets its own gateway), or lower network.minSnatPortsPerNode "
                f"to at most {most * per_ip // nodes}",
            ))
            continue
        gateways.append(NatGatewayPlan(name=name, subnets=subnets, prefix_length=length, nodes=nodes,
                                       min_ports_per_node=floor))
    return tuple(gateways), problems


def _vnet_overflow(config: ClusterConfig, vnet: Budget) -> Problem:
    pools = config.node_pools
    terms = " + ".join(f"{p.nodes} × (1 + {p.pods_per_node})" for p in pools[:4])
    if len(pools) > 4:
        terms += f" + … ({len(pools) - 4} more pools)"
    control = _control_plane_ips(config)
    biggest_index, biggest = max(enumerate(pools), key=lambda item: _pool_ips(item[1]))
    alone = _pool_ips(biggest) + control > vnet.limit
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


def _warnings(budgets: list[Budget]) -> list[str]:
    return [
        f"{b.name}: {b.used} is above the {b.limit} of {b.source} (supported, not enforced)"
        for b in budgets
        if not b.hard and b.used > b.limit
    ]


def _unrecorded_warnings(unrecorded: tuple[UnrecordedSubnet, ...]) -> list[str]:
    if not unrecorded:
        return []
    placed = ", ".join(f"{u.field}={u.subnet}" for u in unrecorded)
    return [
        f"addresses not recorded in the stack file: {placed}. The plan placed them, but nothing keeps them "
        "there when other pools change; `kilonode allocate STACK` records them (the Pulumi program refuses "
        "to create unrecorded subnets)"
    ]


def _acknowledged_warnings(config: ClusterConfig) -> list[str]:
    return [
        f"acknowledgeRestart: {group}: the next `pulumi up` may restart or replace every {group} machine at "
        "once; remove it from the stack file after that update"
        for group in config.acknowledge_restart
    ]


def gallery_replicas(config: ClusterConfig) -> int:
    image = config.node_image
    wanted = math.ceil(image.max_concurrent_vm_creates / limits.VMS_PER_GALLERY_REPLICA.value)
    return min(max(wanted, image.min_replicas), limits.GALLERY_REPLICAS_MAX.value)


# --- subnets -------------------------------------------------------------------------

@dataclass(frozen=True)
class _Subnets:
    control_plane: IPv4Network
    etcd: IPv4Network
    pools: dict[str, IPv4Network]
    unrecorded: tuple[UnrecordedSubnet, ...]


def _prefix_for(addresses: int) -> int:
    needed = addresses + limits.AZURE_RESERVED_PER_SUBNET.value
    return 32 - max(3, math.ceil(math.log2(needed)))


def slot_nodes(pool: NodePoolConfig) -> int:
    """The nodes a pool's subnet is sized for: its declared room, at least its nodes."""
    return max(pool.nodes, pool.max_nodes or 0)


def pool_capacity(pool: NodePoolConfig, subnet: IPv4Network) -> int:
    """How many nodes of this pool `subnet` holds (each NIC: 1 + podsPerNode IPs)."""
    return max(0, subnet.num_addresses - limits.AZURE_RESERVED_PER_SUBNET.value) // (1 + pool.pods_per_node)


@dataclass(frozen=True)
class _Request:
    loc: Loc
    key: str
    recorded: IPv4Network | None
    prefix: int  # what a fresh allocation gets (sized for the room)
    needed: int  # the longest prefix that still holds what is there now
    why: str


def _allocate_subnets(config: ClusterConfig) -> _Subnets:
    """Recorded subnets stay where they are; the others are placed first fit, in declaration
    order, around them, and reported as unrecorded.

    Stability comes from recording, not from order: once `kilonode allocate` has written a
    subnet into the stack file it is an input, so no change to another pool or role moves it
    (nor the static etcd/apiserver/LB IPs at fixed offsets inside the control subnets). A pool
    that outgrows its recorded subnet is refused, naming the address that would have to move.
    """
    net = config.network
    vnet = net.vnet_cidr
    requests = [
        _Request(("network", "controlPlaneSubnet"), "control-plane", net.control_plane_subnet,
                 limits.CONTROL_SUBNET_PREFIX, limits.CONTROL_SUBNET_PREFIX, "the apiservers and their load balancer"),
        _Request(("network", "etcdSubnet"), "etcd", net.etcd_subnet,
                 limits.CONTROL_SUBNET_PREFIX, limits.CONTROL_SUBNET_PREFIX, "the etcd members"),
    ]
    for index, pool in enumerate(config.node_pools):
        slot = slot_nodes(pool)
        requests.append(_Request(
            ("nodePools", index, "subnet"), pool.name, pool.subnet, _prefix_for(slot * (1 + pool.pods_per_node)),
            _prefix_for(_pool_ips(pool)),
            f"{pool.nodes} nodes × (1 + {pool.pods_per_node}) IPs + 5 Azure-reserved",
        ))

    problems: list[Problem] = []
    taken: list[IPv4Network] = [r.recorded for r in requests if r.recorded]
    placed: dict[str, IPv4Network] = {}
    unrecorded: list[UnrecordedSubnet] = []
    outgrown = [r for r in requests if r.recorded and r.recorded.prefixlen > r.needed]
    for r in requests:
        if r.recorded:
            placed[r.key] = r.recorded
    for r in requests:
        if r.recorded:
            continue
        block = _first_free(vnet, r.prefix, taken)
        if block is None:
            problems.append(Problem(
                r.loc if r.loc[0] == "nodePools" else ("network", "vnetCidr"),
                f"no free /{r.prefix} left in network.vnetCidr {vnet} for {r.key} ({r.why}); ways out: "
                "a wider vnetCidr (Azure still caps the VNet at 65,536 private IPs), fewer "
                "podsPerNode, or split the pool",
            ))
            continue
        taken.append(block)
        placed[r.key] = block
        unrecorded.append(UnrecordedSubnet(field=dotted(r.loc), subnet=block))
    # where an outgrown subnet could go: around everything else, placed ones included
    problems += [_outgrown(config, r, [t for t in taken if t != r.recorded]) for r in outgrown]
    if problems:
        raise PlanError(problems)
    return _Subnets(
        placed.pop("control-plane"), placed.pop("etcd"), {p.name: placed[p.name] for p in config.node_pools},
        tuple(unrecorded),
    )


def _outgrown(config: ClusterConfig, r: _Request, others: list[IPv4Network]) -> Problem:
    """A recorded subnet too small for what the stack now asks: name what would move, and where."""
    assert r.recorded is not None
    free = _first_free(config.network.vnet_cidr, r.needed, others)
    where = f"the first free /{r.needed} is {free}" if free else f"no /{r.needed} is free in the VNet"
    if r.loc[0] != "nodePools":
        return Problem(r.loc, f"{r.recorded} is too small: {r.why} need a /{r.needed} or larger; {where}")
    pool = config.node_pools[int(r.loc[1])]
    room = pool_capacity(pool, r.recorded)
    return Problem(
        r.loc,
        f"{r.recorded} holds at most {room} nodes of this pool ((addresses - 5) ÷ (1 + {pool.pods_per_node})); "
        f"{pool.nodes} nodes need a /{r.needed}. Growing past it moves this pool's subnet {r.recorded}"
        + (f" → {free}" if free else "")
        + f", which recreates every scale set of pool '{pool.name}': stay at ≤ {room} nodes, or set this "
        f"subnet to a free /{r.needed} ({where}) to move it deliberately",
    )


def _first_free(vnet: IPv4Network, prefix: int, taken: list[IPv4Network]) -> IPv4Network | None:
    if prefix < vnet.prefixlen:
        return None
    size = 2 ** (32 - prefix)
    start = int(vnet.network_address)
    end = int(vnet.broadcast_address)
    candidate = start
    while candidate + size - 1 <= end:
        block = IPv4Network((candidate, prefix))
        clash = next((t for t in taken if t.overlaps(block)), None)
        if clash is None:
            return block
        # jump past the clashing block, keeping alignment
        after = int(clash.broadcast_address) + 1
        candidate = max(candidate + size, (after + size - 1) // size * size)
    return None


# --- control plane -------------------------------------------------------------------

def _etcd_cluster(
    config: ClusterConfig, role: str, spec: EtcdClusterConfig, subnet: IPv4Network, first_offset: int
) -> EtcdClusterPlan:
    members = []
    for i in range(spec.members):
        ip = subnet.network_address + first_offset + i
        members.append(EtcdMember(
            name=f"etcd-{role}-{i}",
            vm_name=f"{config.name}-etcd-{role}-{i}",
            index=i,
            ip=ip,
            zone=config.zones[i % len(config.zones)],
            vm_size=spec.vm_size_overrides.get(i, spec.vm_size),
            client_url=f"https://{ip}:{ETCD_CLIENT_PORT}",
            peer_url=f"https://{ip}:{ETCD_PEER_PORT}",
            metrics_url=f"http://{ip}:{ETCD_METRICS_PORT}",
        ))
    return EtcdClusterPlan(
        role=role,  # type: ignore[arg-type]
        token=f"{config.name}-etcd-{role}",
        members=tuple(members),
        initial_cluster=",".join(f"{m.name}={m.peer_url}" for m in members),
        client_endpoints=tuple(m.client_url for m in members),
        quota_backend_bytes=spec.quota_backend_bytes,
        auto_compaction_retention=spec.auto_compaction_retention,
        snapshot_count=spec.snapshot_count,
        vm_size=spec.vm_size,
        local_disk=spec.local_disk,
        # 2,500-node post: etcd's data dir on the local SSD (~200 us fsync vs ~2 ms).
        data_dir=f"{spec.local_disk.mount_point}/etcd",
    )


def _control_plane(
    config: ClusterConfig, subnet: IPv4Network, main: EtcdClusterPlan, events: EtcdClusterPlan
) -> ControlPlanePlan:
    api = config.apiserver
    instances = tuple(
        ApiserverInstance(
            name=f"apiserver-{i}",
            vm_name=f"{config.name}-apiserver-{i}",
            index=i,
            ip=subnet.network_address + limits.APISERVER_FIRST_OFFSET + i,
            zone=config.zones[i % len(config.zones)],
        )
        for i in range(api.replicas)
    )
    lb_ip = subnet.network_address + limits.LB_FRONTEND_OFFSET
    service_cidr = config.network.service_cidr
    return ControlPlanePlan(
        instances=instances,
        load_balancer_ip=lb_ip,
        endpoint=f"https://{lb_ip}:{APISERVER_PORT}",
        etcd_servers=",".join(main.client_endpoints),
        # 7,500-node post: Events in their own etcd; group/resource#server;server syntax.
        etcd_servers_overrides="/events#" + ";".join(events.client_endpoints),
        service_cidr=service_cidr,
        kubernetes_service_ip=IPv4Address(int(service_cidr.network_address) + 1),
        cluster_dns_ip=IPv4Address(int(service_cidr.network_address) + 10),
        audit_log=api.audit_log,
        vm_size=api.vm_size,
        local_disk=api.local_disk,
    )


# --- node pools ----------------------------------------------------------------------

def _sysctls(config: ClusterConfig, profile: SysctlProfile) -> tuple[SysctlSetting, ...]:
    def reason(name: str) -> str:
        entry = profile.root.get(name)
        if name not in config.sysctl.overrides:
            assert entry is not None  # effective_sysctls holds profile keys and overrides only
            return entry.reason
        default = f"; profile default was {entry.value}" if entry else ""
        return f"stack override (sysctl.overrides){default}"

    return tuple(
        SysctlSetting(name=name, value=value, reason=reason(name))
        for name, value in effective_sysctls(config, profile).items()
    )


def shard_name(cluster: str, pool: str, index: int) -> str:
    return f"{cluster}-{pool}-{index:03d}"


def _shards(config: ClusterConfig, pool: NodePoolConfig) -> tuple[int, tuple[ScaleSetShard, ...]]:
    infiniband = infiniband_of(pool.vm_size, pool.infiniband)
    per_set = (limits.VMS_PER_PLACEMENT_GROUP if infiniband else limits.VMS_PER_SCALE_SET).value
    count = capacity.shard_count(pool, per_set)
    base, extra = divmod(pool.nodes, count)
    return per_set, tuple(
        ScaleSetShard(
            name=shard_name(config.name, pool.name, i),
            index=i,
            capacity=base + (1 if i < extra else 0),
            zone=config.zones[i % len(config.zones)],
            single_placement_group=infiniband,
        )
        for i in range(count)
    )


def boot_images(config: ClusterConfig, pool: NodePoolConfig | None = None) -> tuple[str, ...]:
    """What the in-cluster program runs that every node (or any node) must start at boot;
    with `pool`, also what only that pool's nodes run (the device plugin on GPU pools)."""
    cloud_provider = defaults.cloud_provider_azure_version(config.kubernetes_version)
    gang = defaults.scheduler_plugins_version(config.kubernetes_version)
    common = (
        defaults.KUBE_PROXY_IMAGE.format(kubernetes_version=config.kubernetes_version),
        defaults.COREDNS_IMAGE,
        defaults.SERVING_CERT_APPROVER_IMAGE,
        # every node runs cloud-node-manager before it can take work (it lifts the
        # uninitialized taint); cloud-controller-manager must start on an uninitialized node
        defaults.CLOUD_NODE_MANAGER_IMAGE.format(version=cloud_provider),
        defaults.CLOUD_CONTROLLER_MANAGER_IMAGE.format(version=cloud_provider),
        # the gang scheduler and its controller (kilonode.k8s.scheduling): gang jobs wait for them
        *(image.format(version=gang) for image in (defaults.SCHEDULER_PLUGINS_SCHEDULER_IMAGE,
                                                   defaults.SCHEDULER_PLUGINS_CONTROLLER_IMAGE)),
    )
    if any(p.autoscaling for p in config.node_pools):  # kilonode.k8s.autoscaler
        common += (defaults.CLUSTER_AUTOSCALER_IMAGE.format(
            version=defaults.cluster_autoscaler_version(config.kubernetes_version)),)
    # A GPU node offers nvidia.com/gpu only once the device plugin runs (kilonode.k8s.gpu).
    if pool is not None and gpus_of(pool.vm_size, pool.gpus_per_node):
        return (*common, defaults.DEVICE_PLUGIN_IMAGE)
    return common


def _preload(config: ClusterConfig, pool: NodePoolConfig) -> tuple[PreloadImage, ...]:
    def baked(image: str) -> str:
        safe = image.replace("/", "_").replace(":", "_").replace("@", "_")
        return f"{PRELOAD_DIR}/{safe}.tar"

    images = [PreloadImage(image=config.pause_image, source="build:pause", baked_path=baked(config.pause_image))]
    supplied = {entry.image: entry.archive for entry in config.boot_image_archives}
    for image in boot_images(config, pool):
        if supplied.get(image):
            images.append(PreloadImage(image=image, source="archive", archive=supplied[image], baked_path=baked(image)))
    for entry in pool.preload_images:
        if entry.image == config.pause_image or any(entry.image == i.image for i in images):
            continue
        images.append(PreloadImage(
            image=entry.image,
            source="archive" if entry.archive else "pull",
            archive=entry.archive,
            baked_path=baked(entry.image),
        ))
    return tuple(images)


def _local_storage(pool: NodePoolConfig) -> LocalStoragePlan:
    """The pool's local disk, from its size: every NVMe disk the size has (the 2,500-node
    post's local SSD, at its fastest), else the device localDisk names (Azure's temp disk by
    default). A device the stack names itself is kept: that is a deliberate choice."""
    disk = pool.local_disk
    size = vm_size(pool.vm_size)
    nvme = size.nvme_disks if size else None
    if nvme is None or disk.device != AZURE_TEMP_DISK:
        if disk.device != AZURE_TEMP_DISK:
            why = "localDisk.device names it" + (f"; the size's {nvme.count} NVMe disk(s) stay unused" if nvme else "")
        else:
            why = f"{pool.vm_size} has no local NVMe disks: its temp disk" + (
                f" ({size.temp_disk_gib} GiB)" if size and size.temp_disk_gib else "")
        return LocalStoragePlan(kind="device", mount_point=disk.mount_point, filesystem=disk.filesystem,
                                device=disk.device, reason=why)
    total = nvme.count * nvme.size_gib
    return LocalStoragePlan(
        kind="nvme-raid0" if nvme.count > 1 else "nvme",
        mount_point=disk.mount_point,
        filesystem=disk.filesystem,
        device=None,
        nvme_models=AZURE_NVME_LOCAL_MODELS,
        nvme_count=nvme.count,
        reason=(f"{pool.vm_size} has {nvme.count} local NVMe disk(s) of {nvme.size_gib} GiB ({total} GiB"
                + (", striped as RAID 0)" if nvme.count > 1 else ")")
                + (f"; its {size.temp_disk_gib} GiB temp disk is left alone" if size and size.temp_disk_gib else "")),
    )


def _gpu_model(pool: NodePoolConfig) -> str | None:
    size = vm_size(pool.vm_size)
    return size.gpu_model if size and gpus_of(pool.vm_size, pool.gpus_per_node) else None


def _nccl_topology(pool: NodePoolConfig) -> str | None:
    """The size's published NCCL topology, on pools that use InfiniBand and GPUs."""
    size = vm_size(pool.vm_size)
    if size is None or not gpus_of(pool.vm_size, pool.gpus_per_node):
        return None
    if not infiniband_of(pool.vm_size, pool.infiniband):
        return None
    return size.nccl_topology


def _nccl_label(pool: NodePoolConfig) -> dict[str, str]:
    """A node label naming the topology, so a training job can select the nodes whose
    /opt/microsoft/<family>/topo.xml it mounts (NCCL in a container reads the container's
    files and environment, not the host's /etc/nccl.conf)."""
    family = _nccl_topology(pool)
    return {NCCL_TOPOLOGY_LABEL: family} if family else {}


def _pool_taints(pool: NodePoolConfig) -> tuple[str, ...]:
    """The stack's taints, plus on GPU pools the GPU health startup taint: the kubelet
    registers the node with it (registerWithTaints), so no pod lands before the agent's
    first check passed; the GPU health controller lifts it (kilonode.gpu.controller)."""
    if not gpus_of(pool.vm_size, pool.gpus_per_node):
        return pool.taints
    startup = f"{STARTUP_TAINT}={STARTUP_VALUE}:{EFFECT}"
    return pool.taints if startup in pool.taints else (*pool.taints, startup)


def _node_pool(
    config: ClusterConfig, pool: NodePoolConfig, subnet: IPv4Network, sysctls: tuple[SysctlSetting, ...]
) -> NodePoolPlan:
    per_set, shards = _shards(config, pool)
    root_name = "docker" if pool.runtime == "docker" else "containerd"
    return NodePoolPlan(
        name=pool.name,
        nodes=pool.nodes,
        runtime=pool.runtime,
        infiniband=infiniband_of(pool.vm_size, pool.infiniband),
        vm_size=pool.vm_size,
        gpus_per_node=gpus_of(pool.vm_size, pool.gpus_per_node),
        gpu_model=_gpu_model(pool),
        nccl_topology=_nccl_topology(pool),
        subnet=subnet,
        pods_per_node=pool.pods_per_node,
        ip_configs_per_nic=1 + pool.pods_per_node,
        max_pods=pool.pods_per_node + pool.host_network_pods,
        max_vms_per_scale_set=per_set,
        shards=shards,
        local_disk=pool.local_disk,
        local_storage=_local_storage(pool),
        # 2,500-node post: the container runtime's root on the instance's local SSD.
        runtime_root=f"{pool.local_disk.mount_point}/{root_name}",
        max_concurrent_downloads=pool.max_concurrent_downloads,
        max_parallel_image_pulls=pool.max_parallel_image_pulls,
        image_pull_progress_deadline=pool.image_pull_progress_deadline,
        pause_image=config.pause_image,
        preload_images=_preload(config, pool),
        boot_images_not_preloaded=tuple(
            image for image in boot_images(config, pool)
            if image not in {entry.image for entry in config.boot_image_archives if entry.archive}
        ),
        sysctls=sysctls,
        labels={"kilonode.io/pool": pool.name, **_nccl_label(pool), **pool.labels},
        taints=_pool_taints(pool),
    )
