"""Node pools: scale-set shards, local storage, images to preload, GPU and NCCL facts of their
VM size (looked up once, here), labels and taints; then teams and autoscaling."""

from __future__ import annotations

import math
from ipaddress import IPv4Network
from typing import Literal

from kilonode.catalog.binaries import pool_roles
from kilonode.catalog.limits import limits
from kilonode.catalog.vm import AZURE_NVME_LOCAL_MODELS, AZURE_TEMP_DISK, gpus_of, infiniband_of, vm_size
from kilonode.config.checks import effective_sysctls
from kilonode.config.model import ClusterConfig, NodePoolConfig
from kilonode.config.sysctl_profile import SysctlProfile
from kilonode.node.gpu.protocol import EFFECT, STARTUP_TAINT, STARTUP_VALUE
from kilonode.plan import capacity, defaults
from kilonode.plan.model import (
    ClusterPlan,
    InfinibandLinksPlan,
    LocalStoragePlan,
    NodePoolPlan,
    PreloadImage,
    ScaleSetShard,
    SysctlSetting,
)
from kilonode.plan.resolve.components import boot_images, runs_disk_plugin
from kilonode.plan.resolve.disks import pool_disks
from kilonode.plan.wellknown import (
    NCCL_TOPOLOGY_LABEL,
    POOL_LABEL,
    PRELOAD_DIR,
    SYSTEM_LABEL,
    SYSTEM_TAINT,
    shard_index,
)
from kilonode.problems import PlanError, Problem

AZURE = limits().azure

# The tool's own DaemonSets (kilonode.k8s.incluster): kube-proxy and the cloud node manager on
# every node, the NVIDIA device plugin on GPU pools, the RDMA device plugin on InfiniBand pools;
# node-exporter on every node and dcgm-exporter on GPU pools (kilonode.k8s.exporters: host network,
# so a pod slot each in maxPods and no pod IP).
# tests/plan/test_limits.py checks this against the DaemonSets in the shipped stacks' graphs, and
# preflight's scheduling check the kubelets' maxPods against the DaemonSets of the graph.
EVERY_NODE_DAEMONSETS = ("kube-proxy", "cloud-node-manager", "calico-node", "node-exporter")
GPU_DAEMONSETS = ("nvidia-device-plugin-daemonset", "dcgm-exporter")
INFINIBAND_DAEMONSETS = ("rdma-shared-dp-ds",)
# Azure Disk CSI's node plugin (kilonode.k8s.storage, host network) where runs_disk_plugin says
STORAGE_DAEMONSETS = ("csi-azuredisk-node",)


def own_daemonsets(pool: NodePoolConfig) -> tuple[str, ...]:
    """The tool's DaemonSets with a pod on each of this pool's nodes."""
    return (*EVERY_NODE_DAEMONSETS, *(GPU_DAEMONSETS if gpus_of(pool.vm_size, pool.gpus_per_node) else ()),
            *(INFINIBAND_DAEMONSETS if infiniband_of(pool.vm_size, pool.infiniband) else ()),
            *(STORAGE_DAEMONSETS if runs_disk_plugin(pool) else ()))


def max_pods(pool: NodePoolConfig) -> int:
    """The kubelet's maxPods: a pod per pod IP, the tool's DaemonSet pods (hostNetwork: no IP) and
    the stack's own hostNetwork pods; never room for a pod-network pod without an address. (A node
    that also holds one of Calico's Typha replicas, host network, one per node at most, has one pod
    slot fewer for pod-network pods: kilonode.k8s.calico.)"""
    return pool.pods_per_node + len(own_daemonsets(pool)) + pool.host_network_pods


def sysctls_of(config: ClusterConfig, profile: SysctlProfile) -> tuple[SysctlSetting, ...]:
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
    return f"{cluster}-{pool}-{shard_index(index)}"


def capacity_of(nodes: int, count: int, per_set: int, index: int, system: bool) -> int:
    """Shard `index`'s capacity: `nodes` spread evenly over the shards `nodes` needs (ceil(nodes /
    per_set), or a system pool's one per zone); a shard beyond them, which exists only for an
    autoscaled pool's maxNodes, starts empty. So raising maxNodes alone adds empty scale sets for
    the autoscaler to grow and moves no capacity: spread over every shard, it would create each
    new scale set at an even share (`pulumi up` sets a scale set's capacity when it creates it)
    beside the old ones, whose capacity the autoscaler owns (ignoreChanges): hundreds of VMs
    nobody asked for (independent trace of issue 38, round 5)."""
    needed = count if system else min(count, max(1, math.ceil(nodes / per_set)))
    if index >= needed:
        return 0
    base, extra = divmod(nodes, needed)
    return base + (1 if index < extra else 0)


def _shards(config: ClusterConfig, pool: NodePoolConfig) -> tuple[int, tuple[ScaleSetShard, ...]]:
    infiniband = infiniband_of(pool.vm_size, pool.infiniband)
    per_set = (AZURE.vms_per_placement_group if infiniband else AZURE.vms_per_scale_set).value
    count = capacity.shard_count(pool, per_set)
    if pool.system:
        # A system pool's nodes in every zone (one scale set per zone, a scale set being in
        # one zone): losing a zone leaves CoreDNS and the controllers somewhere to run.
        count = max(count, min(pool.nodes, len(config.zones)))
    return per_set, tuple(
        ScaleSetShard(
            name=shard_name(config.name, pool.name, i),
            index=i,
            capacity=capacity_of(pool.nodes, count, per_set, i, pool.system),
            zone=config.zones[i % len(config.zones)],
            single_placement_group=infiniband,
        )
        for i in range(count)
    )


def _preload(config: ClusterConfig, pool: NodePoolConfig) -> tuple[PreloadImage, ...]:
    def baked(image: str) -> str:
        safe = image.replace("/", "_").replace(":", "_").replace("@", "_")
        return f"{PRELOAD_DIR}/{safe}.tar"

    images = [PreloadImage(image=config.pause_image, source="build:pause", baked_path=baked(config.pause_image))]
    supplied = {entry.image: entry for entry in config.boot_image_archives}
    for image in boot_images(config, pool):
        if image in supplied:
            images.append(PreloadImage(image=image, source="archive", archive=supplied[image].archive,
                                       baked_path=baked(image), image_id=supplied[image].image_id))
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


def local_storage(pool: NodePoolConfig) -> LocalStoragePlan:
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


def _infiniband_links(pool: NodePoolConfig) -> InfinibandLinksPlan | None:
    """The size's InfiniBand links (catalogue infinibandLinks), on pools that use InfiniBand."""
    size = vm_size(pool.vm_size)
    if size is None or size.infiniband_links is None or not infiniband_of(pool.vm_size, pool.infiniband):
        return None
    return InfinibandLinksPlan(count=size.infiniband_links.count, gbps=size.infiniband_links.gbps)


def _nccl_label(pool: NodePoolConfig) -> dict[str, str]:
    """A node label naming the topology, so a training job can select the nodes whose
    /opt/microsoft/<family>/topo.xml it mounts (NCCL in a container reads the container's
    files and environment, not the host's /etc/nccl.conf)."""
    family = _nccl_topology(pool)
    return {NCCL_TOPOLOGY_LABEL: family} if family else {}


def _system_label(pool: NodePoolConfig) -> dict[str, str]:
    """kilonode.io/system=true on a system pool: what the cluster's own workloads prefer."""
    return {SYSTEM_LABEL: "true"} if pool.system else {}


def _pool_taints(pool: NodePoolConfig) -> tuple[str, ...]:
    """The stack's taints, plus on a system pool CriticalAddonsOnly (SYSTEM_TAINT: only the
    cluster's own workloads, which tolerate it, run beside the controllers), and on GPU pools
    the GPU health startup taint: the kubelet registers the node with it (registerWithTaints),
    so no pod lands before the agent's first check passed; the GPU health controller lifts it
    (kilonode.gpu.controller)."""
    taints = pool.taints
    if pool.system and SYSTEM_TAINT not in taints:
        taints = (*taints, SYSTEM_TAINT)
    if not gpus_of(pool.vm_size, pool.gpus_per_node):
        return taints
    startup = f"{STARTUP_TAINT}={STARTUP_VALUE}:{EFFECT}"
    return taints if startup in taints else (*taints, startup)


def node_pool_plan(
    config: ClusterConfig, pool: NodePoolConfig, subnet: IPv4Network, sysctls: tuple[SysctlSetting, ...]
) -> NodePoolPlan:
    per_set, shards = _shards(config, pool)
    size = vm_size(pool.vm_size)  # the size's facts the plan carries for the layers downstream
    root_name = "docker" if pool.runtime == "docker" else "containerd"
    storage = local_storage(pool)
    links = _infiniband_links(pool)
    return NodePoolPlan(
        name=pool.name,
        nodes=pool.nodes,
        kubernetes_version=pool.kubernetes_version or config.kubernetes_version,
        runtime=pool.runtime,
        infiniband=infiniband_of(pool.vm_size, pool.infiniband),
        vm_size=pool.vm_size,
        gpus_per_node=gpus_of(pool.vm_size, pool.gpus_per_node),
        gpu_model=_gpu_model(pool),
        nccl_topology=_nccl_topology(pool),
        nvswitch=bool(size and size.nvswitch and gpus_of(pool.vm_size, pool.gpus_per_node)),
        infiniband_links=links,
        infiniband_gbps=links.count * links.gbps if links else None,
        vcpus=size.vcpus if size else None,
        memory_gib=size.memory_gib if size else None,
        subnet=subnet,
        pods_per_node=pool.pods_per_node,
        ip_configs_per_nic=1 + pool.pods_per_node,
        # every pod the scheduler may place beyond the DaemonSets' has a pod IP (preflight's scheduling)
        max_pods=max_pods(pool),
        host_network_pods=pool.host_network_pods,
        max_vms_per_scale_set=per_set,
        shards=shards,
        local_disk=pool.local_disk,
        local_storage=storage,
        disks=pool_disks(pool.vm_size, gpus_of(pool.vm_size, pool.gpus_per_node), storage, pool.monitoring),
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
        labels={POOL_LABEL: pool.name, **_nccl_label(pool), **_system_label(pool), **pool.labels},
        taints=_pool_taints(pool),
        system=pool.system,
        monitoring=pool.monitoring,
        resolv_conf=defaults.KUBELET_RESOLV_CONF,
        resolv_conf_reason=defaults.KUBELET_RESOLV_CONF_REASON,
        image_extras=image_extras(gpus_of(pool.vm_size, pool.gpus_per_node),
                                  infiniband_of(pool.vm_size, pool.infiniband)),
        binary_roles=tuple(pool_roles(pool.runtime, _nccl_topology(pool))),
    )


def image_extras(gpus_per_node: int, infiniband: bool) -> tuple[Literal["gpu", "infiniband"], ...]:
    """The recipe extras a pool's image carries: GPU software only where the VM has GPUs, the RDMA
    user space (and the kernel it needs) only where it has InfiniBand, so no other pool carries either."""
    chosen: list[Literal["gpu", "infiniband"]] = []
    if gpus_per_node > 0:
        chosen.append("gpu")
    if infiniband:
        chosen.append("infiniband")
    return tuple(chosen)


def place_capacity(
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


def system_pool_problems(plan: ClusterPlan) -> list[Problem]:
    """The cluster's own workloads (CoreDNS, cloud-controller-manager, cluster-autoscaler, the
    gang scheduler, the CSR approver) need a node at bootstrap whose registration taints they
    tolerate. They tolerate the bring-up taints (not-ready, uninitialized) at most, and
    CriticalAddonsOnly (SYSTEM_TAINT, a system pool's own): so a pool with shared
    (non-team) nodes at bootstrap and no other taint. A GPU pool's health startup taint clears
    only once the GPU path is healthy: DNS and node initialisation would wait on the driver."""
    for pool in plan.node_pools:
        shared = sum(s.capacity for s in pool.shards if s.team is None)
        if shared and not [t for t in pool.taints if t != SYSTEM_TAINT]:
            return []
    tainted = "; ".join(f"{pool.name}: {', '.join(pool.taints) or 'team nodes only'}" for pool in plan.node_pools)
    return [Problem(("nodePools",), (
        f"no pool has untainted nodes at bootstrap ({tainted}), so CoreDNS, cloud-controller-manager, "
        "cluster-autoscaler, the gang scheduler and the CSR approver cannot schedule until a GPU node passes "
        "its health check (or never); add a small CPU pool with `system: true` (e.g. 3 nodes of "
        "Standard_D4ds_v5), then `kilonode allocate` to record its subnet"
    ))]
