"""The cluster's Prometheus: which pool holds it, how many series it is estimated to hold at the
size the cluster may reach, and every number that follows: the per-node scrape interval, CPUs
(and GOMAXPROCS), memory, the query limits, the data volume and the retention it holds.

    series       = sum over jobs of targets x series per target (kilonode.plan.defaults.monitoring)
    head/series  = gc x (base + label pairs x per pair + 2 x name)            cardinality
                 + gc x chunk overhead x bytes/sample x head hours x 3600 / interval   ingestion
    memory       = head x (1 + margin) + concurrency x max samples x 16 B, in whole GiB
    disk/day     = samples/s x 86,400 x bytes/sample; retention = 80% of the volume / disk/day

Prometheus' own figures: kilonode.catalog limits.yaml `prometheus`, each with its source.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from kilonode.catalog.disks import PREMIUM_SSD_SOURCE, premium_ssd_tier
from kilonode.catalog.limits import limits
from kilonode.config.model import ClusterConfig
from kilonode.plan import defaults
from kilonode.plan.model import ControlPlanePlan, EtcdClusterPlan, NodePoolPlan, PrometheusPlan, SeriesTerm
from kilonode.plan.resolve.budgets import growth
from kilonode.plan.resolve.components import dns_replicas, most_nodes, prometheus_pool
from kilonode.problems import PlanError, Problem

GIB = 1024**3
DAY_S = 86_400


NO_POOL_WARNING = ("no Prometheus: no pool is marked `monitoring: true`, and none is a system pool or untainted; "
                   "kilonode's alerts cannot fire until one is (docs/monitoring.md)")


def _pool(config: ClusterConfig, pools: tuple[NodePoolPlan, ...]) -> tuple[NodePoolPlan, str] | None:
    """The pool the stack's config chose (prometheus_pool: also what names its image among that pool's
    boot images), as planned, and why it was chosen."""
    named = [p for p in pools if p.monitoring]
    if len(named) > 1:
        raise PlanError([Problem(("nodePools",), "more than one pool has `monitoring: true` ("
                                 + ", ".join(p.name for p in named) + "); the cluster runs one Prometheus")])
    chosen = prometheus_pool(config)
    if chosen is None:
        return None
    [pool] = [p for p in pools if p.name == chosen.name]
    if pool.monitoring:
        return pool, "the pool the stack marks `monitoring: true`"
    if pool.system:
        return pool, "no pool is marked `monitoring: true`: the first system pool"
    assert not pool.taints, pool.taints  # prometheus_pool's untainted agrees with the planned taints
    return pool, "no monitoring or system pool: the first untainted pool"


def _nodes(pool: NodePoolPlan, reach: Mapping[str, int]) -> int:
    """The most nodes the pool may have: Prometheus is sized for them up front, so growth within a
    pool's maxNodes (its autoscaler's ceiling, or room declared for later) never outgrows it."""
    return max(pool.autoscaling.max_nodes if pool.autoscaling else pool.nodes, reach.get(pool.name, 0))


def gpu_agent_series(pool: NodePoolPlan) -> int:
    """The GPU health agent's series on one node of `pool`: none where the pool has no GPUs."""
    if not pool.gpus_per_node:
        return 0
    return (defaults.PROMETHEUS_GPU_AGENT_SERIES_PER_NODE + defaults.PROMETHEUS_GPU_AGENT_FINDING_SERIES
            + defaults.PROMETHEUS_GPU_AGENT_SERIES_PER_GPU * pool.gpus_per_node)


def dcgm_exporter_series(pool: NodePoolPlan) -> int:
    """dcgm-exporter's series on one node of `pool`: one per field of its counters CSV per GPU
    (defaults.DCGM_FIELDS); none where the pool has no GPUs (it runs on the GPU pools alone)."""
    return len(defaults.DCGM_FIELDS) * pool.gpus_per_node


def node_exporter_series(pool: NodePoolPlan) -> int:
    """node-exporter's series kept on one node of `pool`: each kept name (defaults.NODE_EXPORTER_KEPT) times
    what it counts on the node (its disks, filesystems, NICs, InfiniBand ports, collectors or vCPUs)."""
    per = {"node": 1, "disk": defaults.NODE_EXPORTER_DISKS, "filesystem": defaults.NODE_EXPORTER_FILESYSTEMS,
           "nic": defaults.NODE_EXPORTER_NICS, "ib_port": pool.gpus_per_node if pool.infiniband else 0,
           "collector": len(defaults.NODE_EXPORTER_COLLECTORS),
           "cpu": (pool.vcpus or 0) * defaults.NODE_EXPORTER_CPU_MODES}
    return sum(per[kind] for _, kind in defaults.NODE_EXPORTER_KEPT)


def per_node_series(pool: NodePoolPlan) -> int:
    """kubelet + cAdvisor + kube-state-metrics' Node share (its kube-system workloads: ksm_workload_series) +
    per-pod traffic + node-exporter (+ the GPU health agent and dcgm-exporter on a GPU pool) for
    one node of `pool`."""
    return (defaults.PROMETHEUS_SERIES_PER_KUBELET
            + defaults.PROMETHEUS_CADVISOR_SERIES_PER_CONTAINER * pool.max_pods
            + defaults.PROMETHEUS_KSM_SERIES_PER_NODE
            + defaults.PROMETHEUS_POD_TRAFFIC_SERIES_PER_NODE
            + defaults.PROMETHEUS_POD_TRAFFIC_SERIES_PER_POD * pool.max_pods
            + node_exporter_series(pool) + dcgm_exporter_series(pool)
            + gpu_agent_series(pool))


def _gpu_agent_words(pool: NodePoolPlan) -> str:
    gpus = pool.gpus_per_node
    ib = f", {gpus} InfiniBand ports" if gpus and pool.infiniband else ""
    return f", GPU health agent of {gpus} GPU{'s' if gpus > 1 else ''}, dcgm-exporter{ib}" if gpus else ""


def prometheus_self_series() -> int:
    """Prometheus's own series kept (defaults.PROMETHEUS_SELF_KEPT), each name times what it counts."""
    return sum(defaults.PROMETHEUS_SELF_PER[kind] for _, kind in defaults.PROMETHEUS_SELF_KEPT)


def coredns_series() -> int:
    """One CoreDNS replica's series kept (defaults.COREDNS_KEPT)."""
    return sum(count for _, count in defaults.COREDNS_KEPT)


def ksm_workload_series() -> int:
    """kube-state-metrics' series of the DaemonSets and Deployments it reads in kube-system (defaults: its
    series per object at v2.18.0 and an estimate of the objects there)."""
    return (defaults.KSM_DAEMONSETS * defaults.KSM_SERIES_PER_DAEMONSET
            + defaults.KSM_DEPLOYMENTS * defaults.KSM_SERIES_PER_DEPLOYMENT)


def recorded_series(pools: tuple[NodePoolPlan, ...], reach: Mapping[str, int]) -> int:
    """The recording rules' results: the fixed estimate and one last Xid per GPU the pools may reach."""
    return defaults.PROMETHEUS_RECORDED_SERIES + sum(_nodes(p, reach) * p.gpus_per_node for p in pools)


def per_node_interval(node_series: int) -> int:
    """The shortest per-node interval whose samples per second stay in the ingest budget."""
    for interval in defaults.PROMETHEUS_PER_NODE_INTERVALS_S:
        if node_series / interval <= defaults.PROMETHEUS_INGEST_BUDGET:
            return interval
    return defaults.PROMETHEUS_PER_NODE_INTERVALS_S[-1]


def series_terms(pools: tuple[NodePoolPlan, ...], etcd: tuple[EtcdClusterPlan, ...], control: ControlPlanePlan,
                 autoscaler_replicas: int, reach: Mapping[str, int] | None = None) -> tuple[SeriesTerm, ...]:
    """`reach`: pool name -> the nodes it may grow to (the config's maxNodes)."""
    reach = reach or {}
    node_series = sum(_nodes(p, reach) * per_node_series(p) for p in pools)
    per_node = per_node_interval(node_series)
    cp = defaults.PROMETHEUS_CONTROL_PLANE_INTERVAL_S
    terms = [SeriesTerm(what=f"nodes of {p.name} (kubelet, cAdvisor x {p.max_pods} containers, kube-state-metrics, "
                             f"pod traffic, node-exporter{_gpu_agent_words(p)})",
                        targets=_nodes(p, reach), per_target=per_node_series(p), interval_s=per_node) for p in pools]
    members = sum(len(c.members) for c in etcd)
    roles = [c.role for c in etcd]
    clusters = ", ".join(roles[:-1]) + " and " + roles[-1]  # main and events, or main, events and leases
    terms += [
        SeriesTerm(what="apiservers", targets=len(control.instances),
                   per_target=defaults.PROMETHEUS_SERIES_PER_APISERVER, interval_s=cp),
        SeriesTerm(what="kube-schedulers (one per apiserver VM)", targets=len(control.instances),
                   per_target=defaults.PROMETHEUS_SERIES_PER_SCHEDULER, interval_s=cp),
        SeriesTerm(what="kube-controller-managers (one per apiserver VM)", targets=len(control.instances),
                   per_target=defaults.PROMETHEUS_SERIES_PER_CONTROLLER_MANAGER, interval_s=cp),
        SeriesTerm(what=f"etcd members ({clusters})", targets=members,
                   per_target=defaults.PROMETHEUS_SERIES_PER_ETCD_MEMBER, interval_s=cp),
        SeriesTerm(what="control-plane hosts' certificate expiry", targets=members + len(control.instances),
                   per_target=defaults.PROMETHEUS_SERIES_PER_CERT_TARGET, interval_s=300),
        SeriesTerm(what="Prometheus itself (its kept names)", targets=1, per_target=prometheus_self_series(),
                   interval_s=cp),
        SeriesTerm(what="kube-state-metrics' kube-system DaemonSets and Deployments", targets=1,
                   per_target=ksm_workload_series(), interval_s=cp),
        SeriesTerm(what="CoreDNS replicas (the plan's, at the pools' ceiling)", targets=dns_replicas(most_nodes(pools)),
                   per_target=coredns_series(), interval_s=cp),
        # one result a rule evaluation, as often as the control plane's scrapes (evaluation_interval)
        SeriesTerm(what="recording rules (and one last Xid per GPU)", targets=1,
                   per_target=recorded_series(pools, reach), interval_s=cp),
    ]
    if any(p.gpus_per_node for p in pools):
        # the taint controller runs on every apiserver VM where there are GPU pools
        terms.append(SeriesTerm(what="GPU health taint controllers (one per apiserver)", targets=len(control.instances),
                                per_target=defaults.PROMETHEUS_SERIES_PER_GPU_HEALTH_CONTROLLER, interval_s=cp))
    if autoscaler_replicas:
        terms.append(SeriesTerm(what="cluster-autoscaler replicas", targets=autoscaler_replicas,
                                per_target=defaults.PROMETHEUS_SERIES_PER_AUTOSCALER, interval_s=cp))
    return tuple(terms)


def head_bytes_per_series(interval_s: int) -> int:
    f = limits().prometheus
    gc = f.head_gc_factor.value
    cardinality = gc * (f.head_bytes_per_series.value
                        + defaults.PROMETHEUS_LABEL_PAIRS_PER_SERIES * f.head_bytes_per_label_pair.value
                        + 2 * defaults.PROMETHEUS_NAME_BYTES)
    samples_in_head = f.head_hours.value * 3600 // interval_s
    ingestion = (gc * f.head_chunk_overhead_percent.value * f.disk_bytes_per_sample.value * samples_in_head) // 100
    return cardinality + ingestion


def prometheus_plan(config: ClusterConfig, pools: tuple[NodePoolPlan, ...], etcd: tuple[EtcdClusterPlan, ...],
                    control: ControlPlanePlan) -> PrometheusPlan | None:
    """None where no pool can take it (a stack of GPU pools alone): the plan warns (NO_POOL_WARNING)."""
    placed = _pool(config, pools)
    if placed is None:
        return None
    pool, why = placed
    autoscaler = defaults.CLUSTER_AUTOSCALER_REPLICAS if any(p.autoscaling for p in pools) else 0
    terms = series_terms(pools, etcd, control, autoscaler, {p.name: growth(p) for p in config.node_pools})
    per_node = terms[0].interval_s
    series = sum(t.series for t in terms)
    samples = sum(t.series / t.interval_s for t in terms)
    per_series = head_bytes_per_series(per_node)
    head = series * per_series
    f = limits().prometheus
    cpus = max(1, math.ceil(series / defaults.PROMETHEUS_SERIES_PER_CPU))
    concurrency = cpus
    query = concurrency * defaults.PROMETHEUS_QUERY_MAX_SAMPLES * f.query_sample_bytes.value
    memory = math.ceil((head * (100 + defaults.PROMETHEUS_MEMORY_MARGIN_PERCENT) // 100 + query) / GIB)
    _fits(config, pool, cpus, memory)
    disk = pool.disks.os_disk_gib * defaults.PROMETHEUS_OS_DISK_PERCENT // 100
    retention_size = disk * f.retention_size_percent.value // 100
    daily = math.ceil(samples * DAY_S * f.disk_bytes_per_sample.value)
    days = min(defaults.PROMETHEUS_RETENTION_DAYS_MAX, retention_size * GIB // daily)
    if days < defaults.PROMETHEUS_RETENTION_DAYS_MIN:
        raise PlanError([Problem(("nodePools",), (
            f"the Prometheus on pool {pool.name} would hold {days} days: {samples:,.0f} samples/s x 2 B x 86,400 = "
            f"{daily / GIB:.1f} GiB a day against {retention_size} GiB; fewer series or a larger OS disk"))])
    return PrometheusPlan(
        pool=pool.name, pool_taints=pool.taints, vm_size=pool.vm_size, why_pool=why, terms=terms, series=series,
        samples_per_s=round(samples), head_bytes_per_series=per_series, head_bytes=head,
        per_node_interval_s=per_node, control_plane_interval_s=defaults.PROMETHEUS_CONTROL_PLANE_INTERVAL_S,
        cpus=cpus, memory_gib=memory, query_timeout=defaults.PROMETHEUS_QUERY_TIMEOUT,
        query_max_concurrency=concurrency, query_max_samples=defaults.PROMETHEUS_QUERY_MAX_SAMPLES, query_bytes=query,
        disk_gib=disk, retention_size_gib=retention_size, retention_days=days, daily_bytes=daily,
        # the PersistentVolumeClaim asks for the whole Premium SSD tier the disk falls in: Azure
        # provisions and bills a disk by its tier (kilonode.catalog.disks), so the rest is free room
        volume_gib=premium_ssd_tier(disk).size_gib, volume_tier=premium_ssd_tier(disk).name,
    )


def _fits(config: ClusterConfig, pool: NodePoolPlan, cpus: int, memory_gib: int) -> None:
    """The pod fits the pool's VM with room for the node's own: or the plan says what to choose."""
    if pool.memory_gib is None or pool.vcpus is None:
        return  # a size not in the catalogue: preflight's placement check has the allocatable
    room_gib = pool.memory_gib * defaults.PROMETHEUS_VM_MEMORY_PERCENT / 100
    room_cpus = pool.vcpus - defaults.PROMETHEUS_VM_RESERVED_CPUS
    if memory_gib <= room_gib and cpus <= max(1, room_cpus):
        return
    index = next(i for i, p in enumerate(config.node_pools) if p.name == pool.name)
    raise PlanError([Problem(("nodePools", index, "vmSize"), (
        f"the cluster's Prometheus needs {cpus} CPUs and {memory_gib} GiB (docs/monitoring.md; `kilonode explain`), "
        f"more than {pool.vm_size} leaves it ({max(1, room_cpus)} CPUs, {room_gib:.0f} GiB); add a pool of one "
        "memory-optimised VM (an Edsv5 size) with `monitoring: true`"))])


def describe(p: PrometheusPlan | None) -> list[str]:
    """The arithmetic, one line per step, for `kilonode explain`."""
    if p is None:
        return [NO_POOL_WARNING]
    f = limits().prometheus
    gib = 1024**3
    lines = [f"on pool {p.pool} ({p.vm_size}): {p.why_pool}"]
    lines += [f"{t.what}: {t.targets:,} x {t.per_target:,} = {t.series:,} series, every {t.interval_s} s"
              for t in p.terms]
    lines += [
        f"active series (estimate): {p.series:,}; {p.samples_per_s:,} samples/s (per-node jobs every "
        f"{p.per_node_interval_s} s: the shortest of {defaults.PROMETHEUS_PER_NODE_INTERVALS_S} within "
        f"{defaults.PROMETHEUS_INGEST_BUDGET:,} samples/s)",
        f"head: {f.head_gc_factor.value} x ({f.head_bytes_per_series.value} + "
        f"{defaults.PROMETHEUS_LABEL_PAIRS_PER_SERIES} x {f.head_bytes_per_label_pair.value} + 2 x "
        f"{defaults.PROMETHEUS_NAME_BYTES}) B cardinality + ingestion of "
        f"{f.head_hours.value} h at {f.disk_bytes_per_sample.value} B/sample x {f.head_chunk_overhead_percent.value}% "
        f"x {f.head_gc_factor.value} = {p.head_bytes_per_series:,} B/series -> {p.head_bytes / gib:.1f} GiB "
        f"({f.head_bytes_per_series.source})",
        f"memory: {p.head_bytes / gib:.1f} GiB + {defaults.PROMETHEUS_MEMORY_MARGIN_PERCENT}% + queries "
        f"{p.query_max_concurrency} x {p.query_max_samples:,} samples x {f.query_sample_bytes.value} B = "
        f"{p.memory_gib} GiB (request = limit)",
        f"CPUs: {p.cpus} (one per {defaults.PROMETHEUS_SERIES_PER_CPU:,} series; GOMAXPROCS={p.cpus}); "
        f"--query.timeout={p.query_timeout} --query.max-concurrency={p.query_max_concurrency} "
        f"--query.max-samples={p.query_max_samples}",
        f"disk: {p.disk_gib} GiB ({defaults.PROMETHEUS_OS_DISK_PERCENT}% of the pool's OS disk), on a Premium SSD "
        f"PersistentVolume of its tier, {p.volume_tier} ({p.volume_gib:,} GiB; {PREMIUM_SSD_SOURCE}); "
        f"{p.samples_per_s:,} samples/s x {f.disk_bytes_per_sample.value} B x 86,400 = {p.daily_bytes / gib:.1f} GiB "
        f"a day; --storage.tsdb.retention.size={p.retention_size_gib}GB ({f.retention_size_percent.value}%), "
        f"--storage.tsdb.retention.time={p.retention_days}d; the history follows the pod to another node",
    ]
    return lines
