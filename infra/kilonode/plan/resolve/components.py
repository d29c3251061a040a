"""What the cluster's components run and the numbers derived for them: releases and images
for the stack's Kubernetes minor (from the catalogue), apiserver concurrency, DNS replicas,
metrics-server's requests."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache
from typing import Any

from kilonode.catalog.components import components
from kilonode.catalog.limits import limits
from kilonode.catalog.vm import gpus_of
from kilonode.config.model import ClusterConfig, NodePoolConfig
from kilonode.node.gpu.protocol import EFFECT, STARTUP_TAINT, STARTUP_VALUE
from kilonode.plan import defaults
from kilonode.plan.model import (
    AwaitsPlan,
    ComponentsPlan,
    DnsAutoscalePlan,
    MetricsServerPlan,
    NetworkPolicyPlan,
    NodePoolPlan,
)
from kilonode.plan.resolve.joins import join_plan, kilonode_shares
from kilonode.plan.wellknown import POOL_LABEL, SYSTEM_TAINT, TEAM_LABEL
from kilonode.problems import Problem


@cache
def _releases(kubernetes_version: str) -> dict[str, Any]:
    """The releases and image references for this Kubernetes version, from the catalogue."""
    c = components()
    cloud = c.cloud_provider_azure.release("cloud-provider-azure", kubernetes_version)
    gang = c.scheduler_plugins.release("scheduler-plugins", kubernetes_version)
    autoscaler = c.cluster_autoscaler.release("cluster-autoscaler", kubernetes_version)
    minor = int(kubernetes_version.split(".")[1])

    def single(component: Any, role: str) -> str:
        return str(component.image(role, component.release(role, kubernetes_version)))

    return {
        "kubernetes_minor": minor,
        "kube_proxy_image": single(c.kube_proxy, "kubeProxy"),
        "coredns_image": single(c.coredns, "coredns"),
        "dns_autoscaler_image": single(c.dns_autoscaler, "dnsAutoscaler"),
        "metrics_server_image": single(c.metrics_server, "metricsServer"),
        "prometheus_image": single(c.prometheus, "prometheus"),
        "grafana_image": single(c.grafana, "grafana"),  # kilonode.k8s.grafana
        "alertmanager_image": single(c.alertmanager, "alertmanager"),  # kilonode.k8s.alertmanager
        # the exporters (kilonode.k8s.exporters)
        "dcgm_exporter_image": single(c.dcgm_exporter, "dcgmExporter"),
        "node_exporter_image": single(c.node_exporter, "nodeExporter"),
        "kube_state_metrics_image": single(c.kube_state_metrics, "kubeStateMetrics"),
        "serving_cert_approver_image": single(c.kubelet_csr_approver, "approver"),
        "cloud_provider_azure_version": cloud,
        "cloud_controller_manager_image": c.cloud_provider_azure.image("cloudControllerManager", cloud),
        "cloud_node_manager_image": c.cloud_provider_azure.image("cloudNodeManager", cloud),
        "scheduler_plugins_version": gang,
        "scheduler_plugins_skew": c.scheduler_plugins.skew.get(minor),
        "scheduler_plugins_scheduler_image": c.scheduler_plugins.image("scheduler", gang),
        "scheduler_plugins_controller_image": c.scheduler_plugins.image("controller", gang),
        "cluster_autoscaler_version": autoscaler,
        "cluster_autoscaler_image": c.cluster_autoscaler.image("clusterAutoscaler", autoscaler),
        "device_plugin_image": single(c.device_plugin, "devicePlugin"),
        "rdma_device_plugin_image": single(c.rdma_shared_device_plugin, "rdmaSharedDevicePlugin"),
        # Azure Disk CSI (kilonode.k8s.storage): the driver and its sidecars, role -> reference
        "azure_disk_csi_version": c.azure_disk_csi.release("azure-disk-csi", kubernetes_version),
        "azure_disk_csi_images": {role: single(c.azure_disk_csi, role) for role in c.azure_disk_csi.images},
        "nccl_benchmark_image": single(c.nccl_benchmark, "pytorch"),
        "cni_version": c.azure_cni.release("azure-cni", kubernetes_version),
        "calico_node_image": single(c.calico, "node"),
        "calico_typha_image": single(c.calico, "typha"),
    }


def apiserver_inflight(total_nodes: int, apiservers: int) -> tuple[int, int]:
    """(--max-requests-inflight, --max-mutating-requests-inflight) for one apiserver.

    The bracket's seats are what upstream gives its built-in levels; kilonode's levels
    bring their own on top (added to the read limit, their traffic being mostly reads), so each
    built-in level keeps at least the seats the bracket alone would give it.
    """
    per_apiserver = -(-total_nodes // max(1, apiservers - 1))  # rounded up
    reads, mutating = next(((r, m) for above, r, m in defaults.APISERVER_INFLIGHT_BRACKETS if per_apiserver > above),
                           defaults.APISERVER_INFLIGHT_DEFAULT)
    builtin = sum(limits().kubernetes.apf_builtin_shares.value.values())
    extra = -(-(reads + mutating) * sum(kilonode_shares().values()) // builtin)  # rounded up
    return reads + extra, mutating


def dns_replicas(total_nodes: int) -> int:
    return max(defaults.DNS_MIN_REPLICAS, -(-total_nodes // defaults.DNS_NODES_PER_REPLICA))


def dns_autoscale(pools: tuple[NodePoolPlan, ...], replicas: int) -> DnsAutoscalePlan:
    """CoreDNS's autoscaling over the nodes it may run on: pools with no taint but the GPU
    health startup taint (which clears) and the system pools' CriticalAddonsOnly (which CoreDNS
    tolerates), and of those the nodes without a team (a team's nodes carry its NoSchedule
    taint, which CoreDNS does not tolerate). `nodes_per_replica` is chosen
    so that at the pools' ceiling the autoscaler asks for `replicas`, the plan's one replica per
    DNS_NODES_PER_REPLICA nodes of the whole cluster; never below one node per replica."""
    startup = f"{STARTUP_TAINT}={STARTUP_VALUE}:{EFFECT}"
    eligible_pools = [p for p in pools if set(p.taints) <= {startup, SYSTEM_TAINT}]
    eligible = sum((p.autoscaling.max_nodes if p.autoscaling else p.nodes)
                   - sum(s.capacity for s in p.shards if s.team is not None) for p in eligible_pools)
    names = ",".join(sorted(p.name for p in eligible_pools))
    return DnsAutoscalePlan(
        node_selector=f"{POOL_LABEL} in ({names}),!{TEAM_LABEL}" if names else f"!{TEAM_LABEL}",
        eligible_nodes=eligible,
        # rounded down to 2 decimals: ceil(eligible / it) is then at least `replicas`
        nodes_per_replica=max(1.0, math.floor(eligible / max(1, replicas) * 100) / 100),
        min_replicas=max(1, min(defaults.DNS_MIN_REPLICAS, eligible)),
        max_replicas=replicas,
    )


def metrics_server_plan(total_nodes: int) -> MetricsServerPlan:
    """metrics-server's requests as upstream sizes them (README "Scaling"): its base requests up
    to its base node count, then so much CPU and memory per node, for the nodes the cluster may
    reach, since one replica scrapes every kubelet. Past the nodes upstream supports it still
    runs, and the plan says so."""
    f = limits().metrics_server
    beyond = max(0, total_nodes - f.base_nodes.value)
    supported = f.supported_nodes.value
    past = (f"{total_nodes:,} nodes at the pools' ceiling, past the {supported:,} metrics-server supports "
            f"({f.supported_nodes.source}): sized by its per-node figures all the same, unmeasured there"
            if total_nodes > supported else None)
    return MetricsServerPlan(
        replicas=defaults.METRICS_SERVER_REPLICAS,
        nodes=total_nodes,
        cpu_millis=f.base_cpu_millis.value + beyond * f.cpu_millis_per_node.value,
        memory_mib=f.base_memory_mib.value + beyond * f.memory_mib_per_node.value,
        resolution_s=defaults.METRICS_SERVER_RESOLUTION_S,
        past_supported=past,
    )


def typha_replicas(total_nodes: int) -> int:
    """Typha's replicas for `total_nodes`, as the Tigera operator scales it (catalogue limits,
    calicoTypha): one per nodesPerReplica nodes and one more, plus a spare for a rolling update or
    a lost node; one for one or two nodes, two up to four (one fewer than the nodes, so a replica
    can always move), else never under minReplicas. Each replica is on the host network (its port
    on the node), so no two share a node."""
    f = limits().calico_typha
    if total_nodes <= 2:
        return 1
    if total_nodes <= 4:
        return 2
    return max(f.min_replicas.value, total_nodes // f.nodes_per_replica.value + 1 + f.spare_replicas.value)


def network_policy_plan(total_nodes: int) -> NetworkPolicyPlan:
    f = limits().calico_typha
    return NetworkPolicyPlan(
        nodes=total_nodes,
        typha_replicas=typha_replicas(total_nodes),
        rule=(f"{total_nodes:,} nodes // {f.nodes_per_replica.value} + 1, + {f.spare_replicas.value} spare, at least "
              f"{f.min_replicas.value} past 4 nodes ({f.nodes_per_replica.source})"),
    )


def awaits_plan(dns_replicas: int) -> AwaitsPlan:
    """How long `pulumi up` waits for a Deployment or the DNS Service (kilonode.plan.defaults.awaits).

    Created: a node's whole way to Ready (the in-cluster objects are created while the scale
    sets still allocate), then the workload's start on it. Updated: the nodes exist, but
    CoreDNS, the one Deployment whose replicas grow with the cluster, replaces them one at a
    time; never less than a creation, since a run may add the pool a workload lands on."""
    create = defaults.NODE_READY_MIN + defaults.WORKLOAD_START_MIN
    rollout = -(-dns_replicas * defaults.ROLLOUT_STEP_S // 60)  # rounded up to whole minutes
    update = max(create, rollout)
    return AwaitsPlan(
        create_min=create,
        update_min=update,
        reason=(f"create {create} min: a node's way to Ready ({defaults.NODE_READY_MIN} min) and a workload's "
                f"start on it ({defaults.WORKLOAD_START_MIN} min); update {update} min: the larger of that and "
                f"CoreDNS's {dns_replicas} replicas replaced one at a time ({defaults.ROLLOUT_STEP_S} s each, "
                f"{rollout} min)"),
    )


def most_nodes(pools: tuple[NodePoolPlan, ...]) -> int:
    """The nodes the cluster may reach: autoscaled pools at their ceiling."""
    return sum(pool.autoscaling.max_nodes if pool.autoscaling else pool.nodes for pool in pools)


def components_plan(config: ClusterConfig, pools: tuple[NodePoolPlan, ...]) -> ComponentsPlan:
    """Releases and images for the stack's Kubernetes version; the apiservers' concurrency, the
    DNS replicas, metrics-server's requests and `pulumi up`'s awaits sized for the nodes the
    cluster may reach; how fast
    nodes may join, and the waves of scale sets that keep `pulumi up` under it."""
    nodes = most_nodes(pools)
    reads, mutating = apiserver_inflight(nodes, config.apiserver.replicas)
    dns = dns_replicas(nodes)
    builtin = limits().kubernetes.apf_builtin_shares.value
    return ComponentsPlan(
        # the in-cluster components' version: kubernetesVersion, or the pools' while the control plane
        # emulates the minor below (ClusterConfig.in_cluster_version: none may be newer than it)
        **_releases(config.in_cluster_version),
        apf_builtin_shares=limits().kubernetes.apf_builtin_shares.value,
        apiserver_max_requests_inflight=reads,
        apiserver_max_mutating_requests_inflight=mutating,
        dns_replicas=dns,
        dns_autoscale=dns_autoscale(pools, dns),
        metrics_server=metrics_server_plan(nodes),
        network_policy=network_policy_plan(nodes),
        awaits=awaits_plan(dns),
        joins=join_plan(pools, reads + mutating, config.apiserver.replicas, builtin),
    )


def runs_disk_plugin(pool: NodePoolConfig) -> bool:
    """Whether Azure Disk CSI's node plugin runs on the pool's nodes (kilonode.k8s.storage
    node_plugin_pools, which adds the Prometheus pool wherever it is): every pool without GPUs, and
    a monitoring or system pool whatever its size; not the GPU pools, whose thousands of nodes would
    each run three containers for disks no training job asks for."""
    return not gpus_of(pool.vm_size, pool.gpus_per_node) or pool.monitoring or pool.system


@dataclass(frozen=True)
class _ClusterBoot:
    """What boot_images reads of the whole cluster, worked out once per config (not once per pool:
    every pool's resolution asks, so scanning the pools each time made planning O(pools^2))."""

    common: tuple[str, ...]
    images: dict[str, Any]
    prometheus_pool: str | None


_last_boot: list[tuple[ClusterConfig, _ClusterBoot]] = []  # the last config asked about (it is frozen)


def _cluster_boot(config: ClusterConfig) -> _ClusterBoot:
    if _last_boot and _last_boot[0][0] is config:
        return _last_boot[0][1]
    images = _releases(config.in_cluster_version)
    common: tuple[str, ...] = (
        images["kube_proxy_image"],
        images["coredns_image"],
        images["dns_autoscaler_image"],  # CoreDNS's replicas follow the nodes (kilonode.k8s.dns)
        # the resource metrics API (kilonode.k8s.metrics_server): `kubectl top` and every HPA
        images["metrics_server_image"],
        # the exporters (kilonode.k8s.exporters): node-exporter on every node, kube-state-metrics once
        images["node_exporter_image"],
        images["kube_state_metrics_image"],
        images["serving_cert_approver_image"],
        # the NetworkPolicy engine (kilonode.k8s.calico): Felix on every node, Typha on some
        images["calico_node_image"],
        images["calico_typha_image"],
        # every node runs cloud-node-manager before it can take work (it lifts the
        # uninitialized taint); cloud-controller-manager must start on an uninitialized node
        images["cloud_node_manager_image"],
        images["cloud_controller_manager_image"],
        # Azure Disk CSI's controller, where cloud-controller-manager runs (kilonode.k8s.storage)
        *(images["azure_disk_csi_images"][r] for r in ("provisioner", "attacher", "resizer")),
        # the gang scheduler and its controller (kilonode.k8s.scheduling): gang jobs wait for them
        images["scheduler_plugins_scheduler_image"],
        images["scheduler_plugins_controller_image"],
    )
    if any(p.autoscaling for p in config.node_pools):  # kilonode.k8s.autoscaler
        common += (images["cluster_autoscaler_image"],)
    placed = prometheus_pool(config)
    found = _ClusterBoot(common, images, placed.name if placed is not None else None)
    _last_boot[:] = [(config, found)]
    return found


def boot_images(config: ClusterConfig, pool: NodePoolConfig | None = None) -> tuple[str, ...]:
    """What the in-cluster program runs that every node (or any node) must start at boot;
    with `pool`, also what only that pool's nodes run (the device plugin on GPU pools)."""
    cluster = _cluster_boot(config)
    images, common = cluster.images, cluster.common
    if pool is None:
        return common
    # A GPU node offers nvidia.com/gpu only once the device plugin runs (kilonode.k8s.gpu), and an
    # InfiniBand node rdma/ib only once the RDMA device plugin does (kilonode.k8s.rdma).
    if gpus_of(pool.vm_size, pool.gpus_per_node):
        common = (*common, images["device_plugin_image"], images["dcgm_exporter_image"])
    if pool.infiniband:
        common = (*common, images["rdma_device_plugin_image"])
    # Azure Disk CSI's node plugin (kilonode.k8s.storage): where pools.own_daemonsets puts it, and on
    # the Prometheus pool whatever it is (its claim is attached there)
    on_prometheus_pool = cluster.prometheus_pool == pool.name
    if runs_disk_plugin(pool) or on_prometheus_pool:
        csi = images["azure_disk_csi_images"]
        common = (*common, *(csi[r] for r in ("azuredisk", "nodeDriverRegistrar", "livenessProbe")))
    if on_prometheus_pool:
        # The cluster's Prometheus (kilonode.k8s.monitoring) runs on one node of one pool, but a registry
        # hiccup when that node first starts leaves every alert silent, like the autoscaler's. Grafana runs
        # beside it (kilonode.k8s.grafana): its dashboards are how a person sees the cluster when the alerts
        # fire. Alertmanager too (kilonode.k8s.alertmanager): without it no alert reaches a person.
        common = (*common, images["prometheus_image"], images["grafana_image"], images["alertmanager_image"])
    return common


def prometheus_pool(config: ClusterConfig) -> NodePoolConfig | None:
    """The pool the cluster's Prometheus runs on (kilonode.plan.resolve.monitoring): the first marked
    `monitoring: true` (the plan refuses a second), else the first system pool, else the first
    untainted one; a GPU pool is never untainted (it registers with the GPU health startup taint,
    kilonode.plan.resolve.pools). None: no pool can take it."""
    marked = [p for p in config.node_pools if p.monitoring]
    system = [p for p in config.node_pools if p.system]
    untainted = [p for p in config.node_pools if not p.taints and not gpus_of(p.vm_size, p.gpus_per_node)]
    return next(iter(marked or system or untainted), None)


def unused_archive_problems(config: ClusterConfig) -> list[Problem]:
    """A bootImageArchives entry reaches a pool's image only for an image the pool starts at
    boot (boot_images): one no node starts would be dropped silently, so it is refused."""
    used = {image for pool in config.node_pools for image in boot_images(config, pool)}
    return [
        Problem(("bootImageArchives", index, "image"),
                f"no node starts {entry.image} at boot, so its archive would reach no image; `kilonode explain` "
                "lists the boot images (a pool's preloadImages takes any other image)")
        for index, entry in enumerate(config.boot_image_archives) if entry.image not in used
    ]
