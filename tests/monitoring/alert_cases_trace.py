"""promtool cases for the alerts research-7500's on-call trace added ("a GPU node is slow, etcd is near its quota, a
team's jobs cannot reach the internet"): the per-node GPU verdict, power throttling, InfiniBand ports below their
size's rate or missing, etcd compaction stalled, a filesystem nearly full and kubelet pressure. Registered into
tests/monitoring/alert_cases.py's CASES (imported at its end), so test_alert_cases.py runs them and counts them for
its firing-and-quiet coverage."""

from __future__ import annotations

from kilonode.plan import ClusterPlan
from kilonode.plan.defaults import APISERVER_COMPACTION_INTERVAL_S
from kilonode.render import monitoring
from tests.monitoring.alert_cases import (
    Check,
    Series,
    case,
    dcgm,
    expected,
    gpu_alert,
    gpu_node_series,
    ib,
    ib_labels,
    member_labels,
    selector,
)

NE = monitoring.JOB_NODE_EXPORTER
KSM = monitoring.JOB_KUBE_STATE_METRICS


# --- GPUs ---------------------------------------------------------------------------------------------------------
@case(stack="research-7500")
def one_gpu_node_tainted_is_named(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    name = "KilonodeGpuNodeUnhealthy"
    return gpu_node_series("a100-ib", 10, 1, "a"), [
        ("10m", name, []),  # waits its 15 minutes
        ("20m", name, [expected(plan, name, {"severity": "warning", "node": "a-0", "pool": "a100-ib"})]),
    ]


@case(stack="research-7500")
def gpu_pool_untainted_names_no_node(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    return gpu_node_series("a100-ib", 10, 0, "a"), [("40m", "KilonodeGpuNodeUnhealthy", [])]


@case(stack="research-7500")
def one_gpu_is_power_capped_half_the_time(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    # GPU 0: 30 s of every minute power-capped from minute 30 (50%); GPU 1: 6 s a minute (10%, a dense kernel)
    name = "KilonodeGpuPowerThrottling"
    series = [dcgm(plan, "DCGM_FI_DEV_POWER_VIOLATION", 0, "0x30 0+30000000000x30"),
              dcgm(plan, "DCGM_FI_DEV_POWER_VIOLATION", 1, "0+6000000000x60")]
    return series, [("25m", name, []), ("55m", name, [gpu_alert(plan, name, 0)])]


# --- InfiniBand ---------------------------------------------------------------------------------------------------
def _rate(plan: ClusterPlan, gbps: int) -> int:
    return gbps * monitoring.IB_BYTES_PER_GBPS


def _ib_pool(plan: ClusterPlan) -> tuple[str, int, int]:
    pool = next(p for p in plan.node_pools if p.infiniband and p.infiniband_links)
    assert pool.infiniband_links
    return pool.name, pool.infiniband_links.count, pool.infiniband_links.gbps


@case(stack="research-7500")
def an_infiniband_port_trains_at_half_its_rate(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    # HCA 0 at the size's rate, then retrained at half from minute 10; HCA 1 at the rate all along
    name = "KilonodeInfinibandPortSlow"
    _, _, gbps = _ib_pool(plan)
    full, half = _rate(plan, gbps), _rate(plan, gbps) // 2
    series = [ib(plan, "node_infiniband_rate_bytes_per_second", 0, f"{full}x10 {half}x30"),
              ib(plan, "node_infiniband_rate_bytes_per_second", 1, f"{full}x40")]
    return series, [("15m", name, []),
                    ("30m", name, [expected(plan, name, {"severity": "warning", **ib_labels(plan, 0)})])]


def _node_ports(plan: ClusterPlan, ports: int) -> list[Series]:
    pool, _, _ = _ib_pool(plan)
    up = (selector("up", {"job": NE, "node": f"{pool}-000000", "pool": pool, "instance": "10.2.0.4:9100"}), "1x40")
    return [up, *(ib(plan, "node_infiniband_state_id", hca, "4x40") for hca in range(ports))]


@case(stack="research-7500")
def a_node_exposes_seven_of_its_eight_ports(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    name = "KilonodeInfinibandPortsMissing"
    pool, count, _ = _ib_pool(plan)
    where = {"severity": "warning", "node": f"{pool}-000000", "pool": pool}
    return _node_ports(plan, count - 1), [("10m", name, []), ("20m", name, [expected(plan, name, where)])]


@case(stack="research-7500")
def the_device_filter_matches_no_hca(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    # node-exporter answers, and exports no InfiniBand port at all: the device-include filter matched none
    name = "KilonodeInfinibandPortsMissing"
    pool, _, _ = _ib_pool(plan)
    where = {"severity": "warning", "node": f"{pool}-000000", "pool": pool}
    return _node_ports(plan, 0), [("20m", name, [expected(plan, name, where)])]


@case(stack="research-7500")
def a_node_exposes_all_its_ports_at_their_rate(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    _, count, gbps = _ib_pool(plan)
    series = _node_ports(plan, count) + [ib(plan, "node_infiniband_rate_bytes_per_second", hca,
                                            f"{_rate(plan, gbps)}x40") for hca in range(count)]
    return series, [("30m", "KilonodeInfinibandPortsMissing", []), ("30m", "KilonodeInfinibandPortSlow", [])]


# --- etcd compaction ----------------------------------------------------------------------------------------------
def _revisions(plan: ClusterPlan, compacting: bool) -> list[Series]:
    """main's first member: its revision grows 100 a minute; its compact revision follows every interval (the
    apiserver's) or stands still from minute 10."""
    labels = member_labels(plan, "main", 0)
    step = APISERVER_COMPACTION_INTERVAL_S // 60
    compact = (" ".join(f"{1000 + 100 * (i - i % step)}" for i in range(80)) if compacting
               else " ".join(f"{1000 + 100 * min(i - i % step, 10)}" for i in range(80)))
    return [(selector("etcd_debugging_mvcc_current_revision", labels), "1000+100x80"),
            (selector("etcd_debugging_mvcc_compact_revision", labels), compact)]


@case()
def etcd_compaction_stops(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    name = "KilonodeEtcdCompactionStalled"
    labels = member_labels(plan, "main", 0)
    where = {"severity": "warning", "cluster_role": "main", "instance": labels["instance"]}
    return _revisions(plan, compacting=False), [("30m", name, []),
                                                ("50m", name, [expected(plan, name, where)])]


@case()
def etcd_compacts_every_interval(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    return _revisions(plan, compacting=True), [("70m", "KilonodeEtcdCompactionStalled", [])]


# --- node basics --------------------------------------------------------------------------------------------------
def _filesystem(free: float, readonly: int) -> list[Series]:
    labels = {"job": NE, "node": "pool-a-000001", "pool": "a", "mountpoint": "/", "device": "/dev/sda1",
              "fstype": "ext4"}
    size = 100 * 2**30
    return [(selector("node_filesystem_avail_bytes", labels), f"{int(size * free)}x40"),
            (selector("node_filesystem_size_bytes", labels), f"{size}x40"),
            (selector("node_filesystem_readonly", labels), f"{readonly}x40")]


@case()
def a_node_root_filesystem_nearly_full(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    name = "KilonodeNodeFilesystemFull"
    where = {"severity": "warning", "node": "pool-a-000001", "pool": "a", "mountpoint": "/"}
    return _filesystem(0.05, 0), [("10m", name, []), ("20m", name, [expected(plan, name, where)])]


@case()
def a_node_filesystem_with_room_or_read_only(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    # 40% free; and a read-only mount (an image's squashfs) full by design
    series = _filesystem(0.4, 0)
    ro = {"job": NE, "node": "pool-a-000002", "pool": "a", "mountpoint": "/snap", "device": "/dev/loop0",
          "fstype": "squashfs"}
    series += [(selector("node_filesystem_avail_bytes", ro), "0x40"), (selector("node_filesystem_size_bytes", ro),
                                                                        "1000x40"),
               (selector("node_filesystem_readonly", ro), "1x40")]
    return series, [("30m", "KilonodeNodeFilesystemFull", [])]


def _conditions(disk: str, memory: str) -> list[Series]:
    node = {"job": KSM, "node": "pool-a-000003"}
    return [(selector("kube_node_status_condition", {**node, "condition": "DiskPressure", "status": "true"}), disk),
            (selector("kube_node_status_condition", {**node, "condition": "MemoryPressure", "status": "true"}),
             memory)]


@case()
def a_node_reports_memory_pressure(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    name = "KilonodeNodePressure"
    where = {"severity": "warning", "node": "pool-a-000003", "condition": "MemoryPressure"}
    return _conditions("0x40", "0x10 1x30"), [("15m", name, []), ("30m", name, [expected(plan, name, where)])]


@case()
def a_node_without_pressure(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    return _conditions("0x40", "0x40"), [("30m", "KilonodeNodePressure", [])]
