"""Azure, Kubernetes and etcd limits and upstream defaults (limits.yaml), each with its source."""

from __future__ import annotations

from functools import cache

from kilonode.catalog import CATALOG_DIR, Row, load


class Limit(Row):
    value: int
    source: str


class Lengths(Row):
    value: tuple[int, ...]
    source: str


class Shares(Row):
    value: dict[str, int]
    source: str


class AzureLimits(Row):
    vnet_private_ips: Limit
    ip_configs_per_nic: Limit
    subnets_per_vnet: Limit
    reserved_per_subnet: Limit
    vms_per_scale_set: Limit
    vms_per_placement_group: Limit
    scale_set_name_prefix: Limit
    vms_per_gallery_replica: Limit
    gallery_replicas_max: Limit
    nat_ips_per_gateway: Limit
    snat_ports_per_ip: Limit
    nat_prefix_lengths: Lengths
    nics_per_subscription_region: Limit
    vms_per_subscription_region: Limit
    vnets_per_subscription_region: Limit
    peered_group_private_ips: Limit


class KubernetesLimits(Row):
    nodes: Limit
    pods: Limit
    pods_per_node: Limit
    apf_builtin_shares: Shares
    autoscaler_expendable_priority_cutoff: Limit
    lease_renew_seconds: Limit
    node_status_report_seconds: Limit
    compaction_interval_seconds: Limit
    controller_manager_qps: Limit
    controller_manager_burst: Limit
    scheduler_qps: Limit
    scheduler_burst: Limit


class EtcdLimits(Row):
    default_quota_bytes: Limit
    max_request_bytes: Limit
    kv_overhead_bytes: Limit
    benchmark_writes_per_second: Limit
    node_object_bytes: Limit
    lease_object_bytes: Limit
    pod_object_bytes: Limit


class PulumiFigures(Row):
    stack_resources_soft: Limit


class PrometheusFigures(Row):
    disk_bytes_per_sample: Limit
    retention_size_percent: Limit
    head_bytes_per_series: Limit
    head_bytes_per_label_pair: Limit
    head_gc_factor: Limit
    head_hours: Limit
    head_chunk_overhead_percent: Limit
    query_sample_bytes: Limit


class MetricsServerFigures(Row):
    base_nodes: Limit
    base_cpu_millis: Limit
    base_memory_mib: Limit
    cpu_millis_per_node: Limit
    memory_mib_per_node: Limit
    supported_nodes: Limit


class CalicoTyphaFigures(Row):
    nodes_per_replica: Limit
    spare_replicas: Limit
    min_replicas: Limit


class Limits(Row):
    azure: AzureLimits
    kubernetes: KubernetesLimits
    etcd: EtcdLimits
    pulumi: PulumiFigures
    prometheus: PrometheusFigures
    metrics_server: MetricsServerFigures
    calico_typha: CalicoTyphaFigures


@cache
def limits() -> Limits:
    return load(Limits, CATALOG_DIR / "limits.yaml")
