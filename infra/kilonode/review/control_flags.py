"""Node-health timing and node write load: the control plane's flags and the kubelets' configuration
compared between sides (the ninth independent trace of kilonode diff on research-7500, 9a: both
reported only as a restart or a fleet rollout).

Read from each side's rendered files (kilonode.render.control_plane: the kube-apiserver,
kube-controller-manager and kube-scheduler units of every apiserver host; kilonode.render.pool: each
pool's, and each team's share of a pool's, etc/kubernetes/kubelet-config.yaml), with upstream's
defaults where a flag or field is absent. The pinned Kubernetes is 1.34.2 (plan.yaml kubernetesVersion).

How a node's health is judged (kubernetes/kubernetes):

- the kubelet renews its Lease in kube-node-lease every nodeLeaseDurationSeconds x 0.25
  (pkg/kubelet/kubelet.go nodeLeaseRenewIntervalFraction; nodeLeaseDurationSeconds defaults to 40,
  pkg/kubelet/apis/config/v1beta1/defaults.go), so every 10 s; the controller manager's node
  lifecycle controller takes a renewal as the node's heartbeat and marks the node's Ready condition
  Unknown once it has seen none for --node-monitor-grace-period
  (pkg/controller/nodelifecycle/node_lifecycle_controller.go tryUpdateNodeHealth), checked every
  --node-monitor-period (default 5 s, pkg/controller/apis/config/v1alpha1/defaults.go).
  The grace period's default is 50 s since 1.32 (kubernetes/kubernetes#126287, fixing #121793: at
  the former 40 s, a 40 s stall between the apiservers and etcd, the apiserver's etcd client
  keepalive, flapped nodes NotReady; #127352 asked for more and was closed as "fix the outage").
  The flag's own help: "Must be N times more than kubelet's nodeStatusUpdateFrequency, where N means
  number of retries allowed" (cmd/kube-controller-manager/app/options/nodelifecyclecontroller.go).
- a node NotReady or unreachable: the controller marks its pods NotReady (they leave every Service's
  endpoints) and taints it node.kubernetes.io/not-ready or unreachable:NoExecute, at
  --node-eviction-rate per zone (0.1 nodes/s; 0.01 past --unhealthy-zone-threshold, 55% of a zone);
  with every zone fully NotReady it assumes the control plane is at fault and stops ("Entering
  master disruption mode", handleDisruption). The taint-eviction controller evicts a pod once its
  toleration of the taint runs out: the DefaultTolerationSeconds admission plugin gives every pod
  300 s (kube-apiserver --default-not-ready-toleration-seconds and
  --default-unreachable-toleration-seconds, plugin/pkg/admission/defaulttolerationseconds).
  A training gang loses its whole job when one member is evicted (field notes); the cluster
  autoscaler counts the NotReady nodes against its unready guard and halts
  (kilonode.review.autoscaler).
- --pod-eviction-timeout is gone from kube-controller-manager since 1.27 (the options file above
  registers no such flag): a unit that passes it fails at start, "unknown flag".

How often a kubelet writes its Node (pkg/kubelet/kubelet_node_status.go syncNodeStatus,
tryUpdateNodeStatus): it computes the status every nodeStatusUpdateFrequency (default 10 s) and
posts it when it changed or when nodeStatusReportFrequency (default 5 m) has passed since the last
post. Defaulting (pkg/kubelet/apis/config/v1beta1/defaults.go): with nodeStatusReportFrequency unset
and nodeStatusUpdateFrequency set, the report frequency takes the update frequency ("for backward
compatibility"), so setting the update frequency alone makes every kubelet post every update. Each
post is the whole Node (catalogue limits.yaml etcd.nodeObjectBytes, ~15 KB) into the main etcd and
to every Node watcher; the Lease (KEP-589, ~0.8 KB) exists so that the heartbeat is not that write.
kubeAPIQPS and kubeAPIBurst (defaults 50 and 100, the same defaults file) cap each kubelet's
requests: a ceiling, not a rate.

Any other flag of the three programs, or field of a kubelet configuration, that changes and no rule
judges is said with its values (`control-plane-flag-changed`, `kubelet-config-changed`, medium).
Judged elsewhere, so not said here: the admission plugins (kilonode.review.apiserver_flags), the
apiserver's inflight limits (kilonode.review.apiservers, flowcontrol), --emulated-version
(kilonode.review.versions), the audit log turned off (kilonode.review.risks audit-log-off), the
registration taints (kilonode.review.lifecycle, placement) and image pulls serialised
(kilonode.review.risks image-pulls-serialized). What the plan sets (addresses, etcd endpoints, the
service range, the audit log's sizes, the pools' maxPods, clusterDNS, resolvConf, runtime socket and
parallel pulls) is said only when plan.yaml did not change: with it, the plan's rules judge the change.

Pure: a StackDiff in, findings out.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

from kilonode.catalog.limits import limits
from kilonode.plan import defaults
from kilonode.render.monitoring import ETCD_QUOTA_CRITICAL, ETCD_QUOTA_WARNING, etcd_job
from kilonode.review.autoscaler import seconds
from kilonode.review.compare import StackDiff
from kilonode.review.finding import HIGH, MEDIUM, Finding
from kilonode.review.lifecycle import load_yaml, plan_of
from kilonode.review.unit_flags import UNITS, program_flags

GRACE_RULE = "node-monitor-grace-lowered"
PERIOD_RULE = "node-monitor-period-raised"
TOLERATION_RULE = "eviction-toleration-lowered"
CHANGED_RULE = "control-plane-flag-changed"
WRITES_RULE = "kubelet-node-writes-raised"
LEASE_RULE = "kubelet-lease-duration-changed"
KUBELET_CHANGED_RULE = "kubelet-config-changed"

KUBELET_CONFIG = "etc/kubernetes/kubelet-config.yaml"

# Upstream's defaults (see the docstring for where each is read).
GRACE_DEFAULT_S = 50.0  # 1.32+ (kubernetes/kubernetes#126287); 40 s before
GRACE_DEFAULT_BEFORE_132_S = 40.0
MONITOR_PERIOD_DEFAULT_S = 5.0
TOLERATION_DEFAULT_S = 300.0
LEASE_DURATION_DEFAULT_S = 40
LEASE_RENEW_FRACTION = 0.25  # pkg/kubelet/kubelet.go nodeLeaseRenewIntervalFraction
STATUS_UPDATE_DEFAULT_S = 10.0
STATUS_REPORT_DEFAULT_S = 300.0
KUBE_API_QPS_DEFAULT, KUBE_API_BURST_DEFAULT = 50, 100
# Renewals a grace period must hold: a missed renewal or two (a slow apiserver, a lost connection)
# must not make a node NotReady; upstream's 40 s/50 s over 10 s renewals are 4 and 5.
GRACE_RENEWALS = 4
# A Node write rate this many times the base's is the load Leases removed coming back.
WRITES_HIGH_RATIO = 10.0

TOLERATION_FLAGS = {
    "default-not-ready-toleration-seconds": "node.kubernetes.io/not-ready",
    "default-unreachable-toleration-seconds": "node.kubernetes.io/unreachable",
}
REMOVED_FLAGS = {("kube-controller-manager", "pod-eviction-timeout"): "removed from kube-controller-manager in 1.27"}
# Flags another module's rule judges, never said again by the generic line; this module's own
# (grace period, monitor period, tolerations, removed flags) are left out only where their rule spoke.
JUDGED = {
    "kube-apiserver": frozenset({"enable-admission-plugins", "disable-admission-plugins", "max-requests-inflight",
                                 "max-mutating-requests-inflight", "emulated-version"}),
    "kube-controller-manager": frozenset({"emulated-version"}),
    "kube-scheduler": frozenset({"emulated-version"}),
}
# Set from the plan (kilonode.render.control_plane): said only when plan.yaml did not change.
FROM_PLAN = frozenset({"advertise-address", "bind-address", "etcd-servers", "etcd-servers-overrides",
                       "service-cluster-ip-range", "audit-log-path", "audit-log-maxage", "audit-log-maxbackup",
                       "audit-log-maxsize", "goaway-chance", "shutdown-delay-duration"})
# The flags each rule here speaks for.
_FLAGS_OF = {
    GRACE_RULE: ("node-monitor-grace-period",),
    PERIOD_RULE: ("node-monitor-period",),
    TOLERATION_RULE: (*TOLERATION_FLAGS, *(flag for _, flag in REMOVED_FLAGS)),
}
# registerWithTaints: kilonode.review.lifecycle and placement judge the pools' taints. The fields of
# this module's own rules are left out only where their rule spoke.
KUBELET_JUDGED = frozenset({"registerWithTaints"})
STATUS_FIELDS = ("nodeStatusReportFrequency", "nodeStatusUpdateFrequency")
LEASE_FIELDS = ("nodeLeaseDurationSeconds",)
QPS_FIELDS = ("kubeAPIQPS", "kubeAPIBurst")
KUBELET_FROM_PLAN = frozenset({"maxPods", "clusterDNS", "resolvConf", "containerRuntimeEndpoint",
                               "maxParallelImagePulls"})

def kubelet_configs(files: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    """pool host (pool-<name> or pool-<name>.team-<team>) -> its KubeletConfiguration."""
    found = {}
    for path, text in files.items():
        if path.endswith("/" + KUBELET_CONFIG):
            loaded = load_yaml(text)
            found[path.split("/", 1)[0]] = loaded if isinstance(loaded, dict) else {}
    return found


def host_nodes(entry: Mapping[str, Any] | None) -> dict[str, int]:
    """pool host -> the plan's nodes there: a team's share (teams[].nodes) is pool-<pool>.team-<team>,
    the pool's other nodes pool-<pool> (kilonode.render.cluster render_tree)."""
    plan = plan_of(entry)
    found: dict[str, int] = {}
    for pool in plan.get("nodePools") or []:
        if isinstance(pool, Mapping) and pool.get("name"):
            found[f"pool-{pool['name']}"] = int(pool.get("nodes") or 0)
    for team in plan.get("teams") or []:
        if not isinstance(team, Mapping) or not team.get("pool"):
            continue
        nodes = int(team.get("nodes") or 0)
        found[f"pool-{team['pool']}.team-{team.get('name')}"] = nodes
        found[f"pool-{team['pool']}"] = max(found.get(f"pool-{team['pool']}", 0) - nodes, 0)
    return found


def _minor(version: Any) -> int | None:
    match = re.match(r"v?1\.(\d+)", str(version or ""))
    return int(match.group(1)) if match else None


def grace_default(entry: Mapping[str, Any] | None) -> float:
    minor = _minor(plan_of(entry).get("kubernetesVersion"))
    return GRACE_DEFAULT_BEFORE_132_S if minor is not None and minor < 32 else GRACE_DEFAULT_S


def _duration(value: Any) -> float | None:
    """A KubeletConfiguration or flag duration ("10s", "1m30s") in seconds."""
    if value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    return seconds(str(value).strip())


def _shown_s(value: float) -> str:
    return f"{value:g} s" if value < 120 else f"{value / 60:g} min"


def _files(entry: Mapping[str, Any] | None) -> Mapping[str, str]:
    return (entry or {}).get("files") or {}


def _plan_moved(diff: StackDiff) -> bool:
    return _files(diff.base).get("plan.yaml") != _files(diff.head).get("plan.yaml")


# ---- the kubelet side -------------------------------------------------------------------------


def renew_s(config: Mapping[str, Any]) -> float:
    duration = config.get("nodeLeaseDurationSeconds")
    return float(duration if isinstance(duration, (int, float)) and duration > 0 else LEASE_DURATION_DEFAULT_S) \
        * LEASE_RENEW_FRACTION


def report_s(config: Mapping[str, Any]) -> float:
    """The kubelet's unchanged-status post interval, as upstream defaults it: nodeStatusReportFrequency,
    else nodeStatusUpdateFrequency where that is set, else 5 min."""
    report = _duration(config.get("nodeStatusReportFrequency"))
    if report:
        return report
    update = _duration(config.get("nodeStatusUpdateFrequency"))
    return update if update else STATUS_REPORT_DEFAULT_S


def _qps(config: Mapping[str, Any]) -> tuple[float, float]:
    qps, burst = config.get("kubeAPIQPS"), config.get("kubeAPIBurst")
    return (float(qps) if isinstance(qps, (int, float)) else KUBE_API_QPS_DEFAULT,
            float(burst) if isinstance(burst, (int, float)) and burst else KUBE_API_BURST_DEFAULT)


def _rates(configs: Mapping[str, Mapping[str, Any]], nodes: Mapping[str, int]) -> tuple[float, float]:
    """(Node status writes/s, Lease renewals/s) of every kubelet with its status unchanged."""
    node_writes = sum(nodes.get(h, 0) / report_s(c) for h, c in configs.items())
    lease_writes = sum(nodes.get(h, 0) / renew_s(c) for h, c in configs.items())
    return node_writes, lease_writes


def _write_load(node_writes: float, lease_writes: float) -> str:
    etcd = limits().etcd
    node_bytes, lease_bytes = etcd.node_object_bytes.value, etcd.lease_object_bytes.value
    bytes_s = node_writes * node_bytes + lease_writes * lease_bytes
    bench_bytes = etcd.benchmark_writes_per_second.value * 256
    return (f"{node_writes:,.0f} Node writes/s (x {node_bytes:,} B: {node_writes * node_bytes / 1e6:,.1f} MB/s) and "
            f"{lease_writes:,.0f} Lease renewals/s ({lease_writes * lease_bytes / 1e6:,.1f} MB/s), "
            f"{bytes_s / bench_bytes:.0%} of the bytes of etcd's published benchmark")


def _beyond_benchmark(node_writes: float, lease_writes: float) -> bool:
    etcd = limits().etcd
    bench = etcd.benchmark_writes_per_second.value
    bytes_s = node_writes * etcd.node_object_bytes.value + lease_writes * etcd.lease_object_bytes.value
    return node_writes + lease_writes > bench or bytes_s > bench * 256


def _benchmark_source() -> str:
    etcd = limits().etcd
    return (f"{etcd.benchmark_writes_per_second.value:,} writes/s of 256 B values on 3 members of 8 vCPUs "
            f"({etcd.benchmark_writes_per_second.source}; catalogue limits.yaml etcd.benchmarkWritesPerSecond, "
            "nodeObjectBytes, leaseObjectBytes)")


def _shared(before: Mapping[str, Mapping[str, Any]], after: Mapping[str, Mapping[str, Any]]) -> list[str]:
    return sorted(h for h in after if h in before and before[h] != after[h])


def _grace_s(entry: Mapping[str, Any] | None) -> float:
    """The head's controller manager's grace period (the shortest any host sets; its default where none)."""
    found = [_duration(f.get("node-monitor-grace-period"))
             for f in program_flags(_files(entry)).get("kube-controller-manager", {}).values()]
    known = [s for s in found if s]
    return min(known) if known else grace_default(entry)


def kubelet_writes(diff: StackDiff) -> list[Finding]:
    before, after = kubelet_configs(_files(diff.base)), kubelet_configs(_files(diff.head))
    hosts = _shared(before, after)
    if not hosts:
        return []
    found: list[Finding] = []
    was_nodes, now_nodes = host_nodes(diff.base), host_nodes(diff.head)
    moved = [h for h in hosts if report_s(after[h]) < report_s(before[h])]
    if moved:
        found.append(_writes_raised(diff, before, after, moved, was_nodes, now_nodes))
    lease = [h for h in hosts if renew_s(after[h]) != renew_s(before[h])]
    if lease:
        found.append(_lease_changed(diff, before, after, lease, was_nodes, now_nodes))
    qps = [h for h in hosts if any(n > w for n, w in zip(_qps(after[h]), _qps(before[h]), strict=True))]
    if qps:
        found.append(_qps_raised(before, after, qps, was_nodes, now_nodes))
    pids, pids_hosts = _pids_lowered(diff, before, after, hosts)
    found += pids
    spoken = {(h, k) for group, fields in ((moved, STATUS_FIELDS), (lease, LEASE_FIELDS), (qps, QPS_FIELDS),
                                           (pids_hosts, ("podPidsLimit",)))
              for h in group for k in fields}
    found += _kubelet_changed(diff, before, after, hosts, spoken)
    return found


# ---- podPidsLimit lowered near a training pod's tasks (`pod-pids-limit-lowered`; trace 19, P10) -------------------
# The kubelet sets the pod cgroup's pids.max to podPidsLimit (kubernetes/kubernetes pkg/kubelet/cm
# pod_container_manager_linux.go EnsureExists, at the 1.34 line in the search index); the pids cgroup counts threads, so
# a pod at its limit fails fork() and clone() with EAGAIN (a trainer's "can't start new thread", a data loader's
# worker dying). kilonode.plan.defaults estimates a training rank's tasks (TRAINING_RANK_TASKS) and keeps
# POD_PIDS_LIMIT 8.5 times a whole-node pod's; preflight's kubelet-config breaks below the estimate itself. Between
# the estimate and this many times it, the limit is a job's thread count away from failing: said high.
PIDS_RULE = "pod-pids-limit-lowered"
PIDS_HEADROOM = 2


def _pids(config: Mapping[str, Any]) -> float:
    value = config.get("podPidsLimit")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        return math.inf  # absent or -1: no limit (KubeletConfiguration PodPidsLimit, default -1)
    return float(value)


def _pids_lowered(diff: StackDiff, before: Mapping[str, Mapping[str, Any]], after: Mapping[str, Mapping[str, Any]],
                  hosts: list[str]) -> tuple[list[Finding], list[str]]:
    gpus = {str(p.get("name")): int(p.get("gpusPerNode") or 0) for p in plan_of(diff.head).get("nodePools") or []
            if isinstance(p, Mapping)}
    low: dict[tuple[float, float, int], list[str]] = {}
    for host in hosts:
        was, now = _pids(before[host]), _pids(after[host])
        per_node = gpus.get(host.removeprefix("pool-").split(".team-", 1)[0], 0)
        need = per_node * defaults.TRAINING_RANK_TASKS
        if now < was and need and now < PIDS_HEADROOM * need:
            low.setdefault((was, now, need), []).append(host)
    if not low:
        return [], []
    nodes = host_nodes(diff.head)
    said = []
    for (was, now, need), hs in sorted(low.items()):
        shown = "unlimited" if was == math.inf else f"{was:,.0f}"
        said.append(f"podPidsLimit {shown} -> {now:,.0f} on {', '.join(hs)} ({sum(nodes.get(h, 0) for h in hs):,} "
                    f"nodes), against about {need:,} tasks a whole-node training pod runs ({now / need:.2f}x)")
    hosts_said = sorted({h for hs in low.values() for h in hs})
    return [Finding(HIGH, PIDS_RULE, (
        f"{'; '.join(said)} (kilonode.plan.defaults TRAINING_RANK_TASKS {defaults.TRAINING_RANK_TASKS} per rank: a "
        "trainer's threads, its data-loader workers' and torch.compile's; kilonode keeps POD_PIDS_LIMIT "
        f"{defaults.POD_PIDS_LIMIT:,}). The kubelet makes it the pod cgroup's pids.max, which counts threads "
        "(pkg/kubelet/cm/pod_container_manager_linux.go EnsureExists): a job with a few more loader workers or "
        "threads than the estimate fails fork() and clone() with EAGAIN mid-run (\"can't start new thread\", a dead "
        "data-loader worker). It reaches only nodes created or reimaged after `pulumi up`, so the same job runs on "
        "old nodes and fails on new ones. Keep it at "
        f"{PIDS_HEADROOM}x the estimate or more ({defaults.POD_PIDS_LIMIT:,} is kilonode's)"),
        tuple(f"{h}/{KUBELET_CONFIG}" for h in hosts_said), cause="kubelet configuration")], hosts_said


def _nodes(count: int) -> str:
    return f"{count:,} node" + ("" if count == 1 else "s")


def _field(config: Mapping[str, Any], key: str) -> str:
    return str(config[key]) if key in config else "(unset)"


def _writes_raised(diff: StackDiff, before: Mapping[str, Mapping[str, Any]], after: Mapping[str, Mapping[str, Any]],
                   hosts: list[str], was_nodes: Mapping[str, int], now_nodes: Mapping[str, int]) -> Finding:
    was_w, was_l = _rates(before, was_nodes)
    now_w, now_l = _rates(after, now_nodes)
    ratio = now_w / was_w if was_w else math.inf
    level = HIGH if ratio >= WRITES_HIGH_RATIO or _beyond_benchmark(now_w, now_l) else MEDIUM
    said = []
    for host in hosts:
        was, now = before[host], after[host]
        keys = [k for k in ("nodeStatusReportFrequency", "nodeStatusUpdateFrequency") if was.get(k) != now.get(k)]
        fields = ", ".join(f"{k} {_field(was, k)} -> {_field(now, k)}" for k in keys)
        implied = ("; nodeStatusReportFrequency unset takes nodeStatusUpdateFrequency's value"
                   if "nodeStatusReportFrequency" not in now and "nodeStatusUpdateFrequency" in now else "")
        said.append(f"{host} ({_nodes(now_nodes.get(host, 0))}): {fields}{implied}: an unchanged status posted every "
                    f"{_shown_s(report_s(now))}, was {_shown_s(report_s(was))}")
    return Finding(level, WRITES_RULE, (
        f"the kubelets post their whole Node more often ({'; '.join(said)}). Cluster-wide, with every status "
        f"unchanged: {_write_load(now_w, now_l)}, was {_write_load(was_w, was_l)}"
        + (f": {ratio:,.0f}x the Node writes" if math.isfinite(ratio) else "")
        + ". Each post is the whole Node into the main etcd and to every Node watcher (each node's kube-proxy, the "
        "CNI, the scheduler, the controllers, the autoscaler), the load node Leases (KEP-589) took off the heartbeat; "
        "a status that changes is posted at once whatever the frequency (pkg/kubelet/kubelet_node_status.go "
        "tryUpdateNodeStatus; defaults in pkg/kubelet/apis/config/v1beta1/defaults.go: report 5m, update 10s). "
        f"Against {_benchmark_source()}. Leave nodeStatusReportFrequency at its 5m default (fresher dashboards come "
        "from the metrics pipeline, not the Node object), and never set nodeStatusUpdateFrequency without it"),
        tuple(f"{h}/{KUBELET_CONFIG}" for h in hosts), cause="kubelet configuration")


def _lease_changed(diff: StackDiff, before: Mapping[str, Mapping[str, Any]], after: Mapping[str, Mapping[str, Any]],
                   hosts: list[str], was_nodes: Mapping[str, int], now_nodes: Mapping[str, int]) -> Finding:
    was_w, was_l = _rates(before, was_nodes)
    now_w, now_l = _rates(after, now_nodes)
    grace = _grace_s(diff.head)
    slowest = max(renew_s(after[h]) for h in hosts)
    too_few = slowest * GRACE_RENEWALS > grace
    ratio = now_l / was_l if was_l else math.inf
    level = HIGH if too_few or ratio >= WRITES_HIGH_RATIO or _beyond_benchmark(now_w, now_l) else MEDIUM
    key = "nodeLeaseDurationSeconds"
    said = [f"{h} ({_nodes(now_nodes.get(h, 0))}): {key} {_field(before[h], key)} -> {_field(after[h], key)}"
            f", renewed every {_shown_s(renew_s(after[h]))}, was "
            f"{_shown_s(renew_s(before[h]))}" for h in hosts]
    return Finding(level, LEASE_RULE, (
        f"the kubelets' node Lease changes ({'; '.join(said)}; renewed every quarter of its duration: "
        "pkg/kubelet/kubelet.go nodeLeaseRenewIntervalFraction). Cluster-wide: "
        f"{_write_load(now_w, now_l)}, was {_write_load(was_w, was_l)}. The controller manager marks a node "
        f"NotReady after {_shown_s(grace)} without a renewal (--node-monitor-grace-period): "
        + (f"at {_shown_s(slowest)} a renewal that is only {grace / slowest:.1f} renewals' time, so one or two "
           "missed ones (a slow apiserver, a broken connection) make nodes NotReady: their pods leave the Services' "
           "endpoints and, past 300 s, are evicted by the unreachable taint. Keep the duration at 40 (renewals "
           "every 10 s) or raise the grace period with it" if too_few else
           f"{grace / slowest:.1f} renewals' time, enough. Check the renewal load against {_benchmark_source()}")),
        tuple(f"{h}/{KUBELET_CONFIG}" for h in hosts), cause="kubelet configuration")


def _qps_raised(before: Mapping[str, Mapping[str, Any]], after: Mapping[str, Mapping[str, Any]], hosts: list[str],
                was_nodes: Mapping[str, int], now_nodes: Mapping[str, int]) -> Finding:
    was_cap = sum(_qps(c)[0] * was_nodes.get(h, 0) for h, c in before.items())
    now_cap = sum(_qps(c)[0] * now_nodes.get(h, 0) for h, c in after.items())
    said = [f"{h} ({_nodes(now_nodes.get(h, 0))}): kubeAPIQPS {_field(before[h], 'kubeAPIQPS')} -> "
            f"{_field(after[h], 'kubeAPIQPS')}, kubeAPIBurst {_field(before[h], 'kubeAPIBurst')} -> "
            f"{_field(after[h], 'kubeAPIBurst')}" for h in hosts]
    return Finding(MEDIUM, WRITES_RULE, (
        f"the kubelets' client rate limits rise ({'; '.join(said)}; upstream's defaults 50 and 100: "
        "pkg/kubelet/apis/config/v1beta1/defaults.go). A ceiling, not a rate: the steady Node and Lease writes do "
        f"not change, but what every kubelet together may send the apiservers at once (a mass restart, every node "
        f"re-listing after an apiserver outage) goes to {now_cap:,.0f} requests/s, was {was_cap:,.0f}; API Priority "
        "and Fairness (node-high) is then the only brake (kilonode.k8s.flowcontrol)"),
        tuple(f"{h}/{KUBELET_CONFIG}" for h in hosts), cause="kubelet configuration")


def _shown(value: Any) -> str:
    if value is None:
        return "(unset)"
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, separators=(",", ":"))
    return text if len(text) <= 120 else text[:117] + "..."


def _serialized(config: Mapping[str, Any]) -> bool:
    """As kilonode.review.risks _pulls_serialized (image-pulls-serialized judges the move)."""
    if config.get("serializeImagePulls", True):
        return True
    limit = config.get("maxParallelImagePulls")
    return isinstance(limit, int) and limit <= 1


def _kubelet_changed(diff: StackDiff, before: Mapping[str, Mapping[str, Any]], after: Mapping[str, Mapping[str, Any]],
                     hosts: list[str], spoken: set[tuple[str, str]]) -> list[Finding]:
    plan_moved = _plan_moved(diff)
    changes: dict[tuple[str, str, str], list[str]] = {}
    for host in hosts:
        was, now = before[host], after[host]
        pulls_judged = _serialized(now) and not _serialized(was)
        for key in sorted({*was, *now} - KUBELET_JUDGED):
            if was.get(key) == now.get(key) or (plan_moved and key in KUBELET_FROM_PLAN) or (host, key) in spoken:
                continue
            if pulls_judged and key in ("serializeImagePulls", "maxParallelImagePulls"):
                continue
            changes.setdefault((key, _shown(was.get(key)), _shown(now.get(key))), []).append(host)
    if not changes:
        return []
    said = [f"{key} {was} -> {now} ({', '.join(hs)})" for (key, was, now), hs in sorted(changes.items())]
    hosts_said = sorted({h for hs in changes.values() for h in hs})
    return [Finding(MEDIUM, KUBELET_CHANGED_RULE, (
        f"a kubelet configuration field the review does not model changed: {'; '.join(said)}; check it against the "
        "KubeletConfiguration reference (kubernetes/kubelet config/v1beta1/types.go at the pinned version) and "
        "kilonode's reasons for its value (kilonode.render.pool kubelet_config)"),
        tuple(f"{h}/{KUBELET_CONFIG}" for h in hosts_said), cause="kubelet configuration")]


# ---- the control plane's flags ----------------------------------------------------------------


def _changed_hosts(before: Mapping[str, Mapping[str, str]], after: Mapping[str, Mapping[str, str]],
                   flag: str) -> list[str]:
    return sorted(h for h in after if h in before and before[h].get(flag) != after[h].get(flag))


def _values(found: Mapping[str, Mapping[str, str]], hosts: Iterable[str], flag: str) -> str:
    values = sorted({found[h].get(flag, "(unset)") for h in hosts})
    return "/".join(values)


def _subjects(program: str, hosts: Iterable[str]) -> tuple[str, ...]:
    return tuple(f"{h}/{UNITS[program]}" for h in hosts)


def _renew_head(diff: StackDiff) -> float:
    """The longest lease renewal interval of any head kubelet (10 s where none sets a duration)."""
    configs = kubelet_configs(_files(diff.head))
    return max((renew_s(c) for c in configs.values()), default=LEASE_DURATION_DEFAULT_S * LEASE_RENEW_FRACTION)


def _grace(diff: StackDiff, before: Mapping[str, Mapping[str, str]],
           after: Mapping[str, Mapping[str, str]]) -> list[Finding]:
    flag = "node-monitor-grace-period"
    default = grace_default(diff.head)
    renew = _renew_head(diff)
    floor = max(default, GRACE_RENEWALS * renew)
    lowered = []
    for host in _changed_hosts(before, after, flag):
        was = _duration(before[host].get(flag)) or grace_default(diff.base)
        now = _duration(after[host].get(flag)) or default
        if now < was and now < floor:
            lowered.append(host)
    if not lowered:
        return []
    now = min(_duration(after[h].get(flag)) or default for h in lowered)
    nodes = sum(host_nodes(diff.head).values())
    return [Finding(HIGH, GRACE_RULE, (
        f"kube-controller-manager --node-monitor-grace-period {_values(before, lowered, flag)} -> "
        f"{_values(after, lowered, flag)} on {len(lowered)} apiserver host(s): a node is marked NotReady (Ready "
        f"Unknown) after {_shown_s(now)} without a Lease renewal, and its kubelet renews every {_shown_s(renew)} "
        f"(nodeLeaseDurationSeconds x 0.25: pkg/kubelet/kubelet.go), so {now / renew:g} renewals' time where "
        f"upstream's default {_shown_s(default)} holds {default / renew:g} (pkg/controller/nodelifecycle/config/"
        "v1alpha1/defaults.go; raised from 40 s in 1.32 because a 40 s stall between the apiservers and etcd flapped "
        "nodes NotReady: kubernetes/kubernetes#121793, #126287). Any control-plane blip longer than that (an apiserver "
        "restart dropping its nodes' connections, an etcd leader election, a slow etcd) marks nodes NotReady: their "
        "pods are marked NotReady and leave every Service's endpoints, the nodes are tainted "
        "node.kubernetes.io/unreachable:NoExecute (pkg/controller/nodelifecycle/node_lifecycle_controller.go; only "
        "a blip that takes every zone whole stops the tainting, \"master disruption mode\") and, the taint held past "
        "the pods' 300 s toleration, evicted: a training gang loses its whole job with one member. The cluster "
        f"autoscaler counts them unready and, past its guard, halts all scaling (the plan has {nodes:,} nodes). Keep "
        "it at or "
        f"above the default ({_shown_s(default)}) and at least {GRACE_RENEWALS} renewals ({_shown_s(floor)}); a "
        "faster failover comes from the workload (its own health checks), not from NotReady flaps and NoExecute "
        "evictions on every control-plane blip"), _subjects("kube-controller-manager", lowered),
        cause="kube-controller-manager flags")]


def _period(diff: StackDiff, before: Mapping[str, Mapping[str, str]],
            after: Mapping[str, Mapping[str, str]]) -> list[Finding]:
    flag = "node-monitor-period"
    raised = [h for h in _changed_hosts(before, after, flag)
              if (_duration(after[h].get(flag)) or MONITOR_PERIOD_DEFAULT_S)
              > (_duration(before[h].get(flag)) or MONITOR_PERIOD_DEFAULT_S)]
    if not raised:
        return []
    now = max(_duration(after[h].get(flag)) or MONITOR_PERIOD_DEFAULT_S for h in raised)
    grace = _grace_s(diff.head)
    return [Finding(HIGH, PERIOD_RULE, (
        f"kube-controller-manager --node-monitor-period {_values(before, raised, flag)} -> "
        f"{_values(after, raised, flag)} on {len(raised)} apiserver host(s): the node lifecycle controller looks at "
        f"every node's health every {_shown_s(now)} (default {_shown_s(MONITOR_PERIOD_DEFAULT_S)}: pkg/controller/apis/"
        "config/v1alpha1/defaults.go; monitorNodeHealth in pkg/controller/nodelifecycle/node_lifecycle_controller.go), "
        f"so a dead node is marked NotReady up to {_shown_s(grace + now)} after its last renewal (grace "
        f"{_shown_s(grace)} plus the period): its pods stay in the Services' endpoints and the scheduler keeps "
        "binding to it that much longer, and the zones' disruption state (which slows or stops the evictions) is "
        "re-judged as seldom"
        + (": a period at or past the grace period lets a node go NotReady without any check in between"
           if now >= grace else "")
        + f". Keep it at {_shown_s(MONITOR_PERIOD_DEFAULT_S)}"), _subjects("kube-controller-manager", raised),
        cause="kube-controller-manager flags")]


def _tolerations(before: Mapping[str, Mapping[str, str]], after: Mapping[str, Mapping[str, str]]) -> list[Finding]:
    said, hosts = [], set()
    for flag, taint in TOLERATION_FLAGS.items():
        lowered = []
        for host in _changed_hosts(before, after, flag):
            was, now = (float(x) if re.fullmatch(r"\d+", str(x or "")) else TOLERATION_DEFAULT_S
                        for x in (before[host].get(flag), after[host].get(flag)))
            if now < was:
                lowered.append(host)
        if lowered:
            hosts.update(lowered)
            said.append(f"--{flag} {_values(before, lowered, flag)} -> {_values(after, lowered, flag)} "
                        f"(every pod's toleration of {taint}:NoExecute)")
    if not said:
        return []
    return [Finding(HIGH, TOLERATION_RULE, (
        f"kube-apiserver's default eviction tolerations are lowered on {len(hosts)} apiserver host(s) "
        f"({'; '.join(said)}): the DefaultTolerationSeconds admission plugin gives every new pod that does not "
        "set its own these tolerationSeconds (plugin/pkg/admission/defaulttolerationseconds/admission.go, default "
        "300), and the taint-eviction controller evicts a pod once its node has carried the taint that long. A node "
        "NotReady or unreachable for longer (a kubelet restart, an apiserver or etcd blip past the grace period, a "
        "network partition) then loses its pods sooner: a training gang loses its whole job with one member. Keep "
        "300, or set shorter tolerations on the workloads that want them"),
        _subjects("kube-apiserver", sorted(hosts)), cause="kube-apiserver flags")]


def _removed(before: Mapping[str, Mapping[str, Mapping[str, str]]],
             after: Mapping[str, Mapping[str, Mapping[str, str]]]) -> list[Finding]:
    found = []
    for (program, flag), why in sorted(REMOVED_FLAGS.items()):
        was, now = before.get(program, {}), after.get(program, {})
        hosts = sorted(h for h in now if h in was and flag in now[h] and now[h].get(flag) != was[h].get(flag))
        if hosts:
            found.append(Finding(HIGH, TOLERATION_RULE, (
                f"{program} --{flag}={_values(now, hosts, flag)} on {len(hosts)} apiserver host(s): the flag was "
                f"{why} (cmd/kube-controller-manager/app/options/nodelifecyclecontroller.go registers no such flag), "
                f"so {program} exits at start on an unknown flag and, restarted by systemd, never runs: no node "
                "lifecycle, no ReplicaSets, Jobs, garbage collection or certificate signing anywhere in the cluster. "
                "Pod eviction after a node failure is the pods' toleration of the NoExecute taints now "
                "(kube-apiserver --default-unreachable-toleration-seconds)"), _subjects(program, hosts),
                cause=f"{program} flags"))
    return found


def _audit_off(was: str | None, now: str | None) -> bool:
    return now in (None, "", "-") and was not in (None, "", "-")


def _flags_changed(diff: StackDiff, before: Mapping[str, Mapping[str, Mapping[str, str]]],
                   after: Mapping[str, Mapping[str, Mapping[str, str]]],
                   spoken: set[tuple[str, str, str]]) -> list[Finding]:
    plan_moved = _plan_moved(diff)
    found = []
    for program in UNITS:
        was_hosts, now_hosts = before.get(program, {}), after.get(program, {})
        changes: dict[tuple[str, str, str], list[str]] = {}
        for host in sorted(h for h in now_hosts if h in was_hosts):
            was, now = was_hosts[host], now_hosts[host]
            for flag in sorted({*was, *now} - JUDGED[program]):
                if was.get(flag) == now.get(flag) or (plan_moved and flag in FROM_PLAN):
                    continue
                if (program, flag, host) in spoken:
                    continue
                if program == "kube-apiserver" and flag == "audit-log-path" and _audit_off(was.get(flag),
                                                                                          now.get(flag)):
                    continue  # audit-log-off says it
                changes.setdefault((flag, was.get(flag, "(unset)"), now.get(flag, "(unset)")), []).append(host)
        if not changes:
            continue
        said = [f"--{flag} {w} -> {n}" + (f" ({', '.join(hs)})" if len(hs) < len(now_hosts) else "")
                for (flag, w, n), hs in sorted(changes.items())]
        hosts = sorted({h for hs in changes.values() for h in hs})
        found.append(Finding(MEDIUM, CHANGED_RULE, (
            f"a {program} flag the review does not model changed on {len(hosts)} apiserver host(s): {'; '.join(said)}; "
            f"check it against the component's flag reference (kubernetes/website content/en/docs/reference/"
            f"command-line-tools-reference/{program}.md, cmd/{program}/app/options at the pinned version) and "
            "kilonode's reasons for its value (kilonode.render.control_plane)"), _subjects(program, hosts),
            cause=f"{program} flags"))
    return found


def control_plane_flags(diff: StackDiff, spoken_elsewhere: frozenset[tuple[str, str, str]] = frozenset()
                        ) -> list[Finding]:
    """The named flag rules, then the generic line for every other changed flag; `spoken_elsewhere`:
    (program, flag, host) another module's rule judged (kilonode.review.value_effects.flags_spoken)."""
    before, after = program_flags(_files(diff.base)), program_flags(_files(diff.head))
    if before == after:
        return []
    kcm_was, kcm_now = before.get("kube-controller-manager", {}), after.get("kube-controller-manager", {})
    found = [*_grace(diff, kcm_was, kcm_now), *_period(diff, kcm_was, kcm_now), *_evictions(diff, kcm_was, kcm_now),
             *_tolerations(before.get("kube-apiserver", {}), after.get("kube-apiserver", {})),
             *_event_ttls(diff, before.get("kube-apiserver", {}), after.get("kube-apiserver", {})),
             *_removed(before, after)]
    # (program, flag, host) a rule above spoke for: the generic line leaves them out
    spoken = {(p, flag, s.split("/", 1)[0]) for f in found for s in f.subjects for p, unit in UNITS.items()
              if s.endswith(unit) for flag in _FLAGS_OF[f.rule]}
    return found + _flags_changed(diff, before, after, spoken | spoken_elsewhere)


def assess(diff: StackDiff, spoken_elsewhere: frozenset[tuple[str, str, str]] = frozenset()) -> list[Finding]:
    """Every finding of the control plane's flags and the kubelets' configuration; `spoken_elsewhere` as in
    control_plane_flags (the caller passes it: value_effects reads this module's unit parser, so this module
    does not import it)."""
    return [*control_plane_flags(diff, spoken_elsewhere), *scheduler_config(diff), *kubelet_writes(diff)]


# ---- node eviction rates (node-eviction-rate-raised) --------------------------------------------------------------
#
# Independent trace 10b: --node-eviction-rate=5 was only the generic line. kubernetes/kubernetes
# pkg/controller/nodelifecycle/node_lifecycle_controller.go: each zone's NoExecute tainter is a token bucket at
# --node-eviction-rate (default 0.1 nodes/s, pkg/controller/nodelifecycle/config/v1alpha1/defaults.go) while the zone
# is Normal; ComputeZoneState makes it PartialDisruption once more than 2 of its nodes and at least
# --unhealthy-zone-threshold (default 0.55) of them are NotReady, and then ReducedQPSFunc gives
# --secondary-node-eviction-rate (default 0.01) to a zone of more than --large-cluster-size-threshold (default 50)
# nodes, 0 to a smaller one; a zone with no Ready node (FullDisruption) is not tainted.
EVICTION_RULE = "node-eviction-rate-raised"
EVICTION_FLAGS = {"node-eviction-rate": 0.1, "secondary-node-eviction-rate": 0.01,
                  "unhealthy-zone-threshold": 0.55, "large-cluster-size-threshold": 50.0}
_FLAGS_OF[EVICTION_RULE] = tuple(EVICTION_FLAGS)
# The outage the figures are told for: the first 10 minutes of a zone's partial outage (a rack's switch, a bad node
# agent rollout), twice the pods' default 300 s toleration, so the evictions of the nodes tainted early have begun.
OUTAGE_S = 600.0
# A difference in nodes tainted NoExecute over OUTAGE_S, over every zone, past which a raise is high: every such
# node's gang loses its whole job (a NCCL gang is a pod per node).
EVICTION_HIGH_NODES = 100


def _eviction(flags: Mapping[str, str]) -> dict[str, float]:
    found = {}
    for flag, default in EVICTION_FLAGS.items():
        try:
            found[flag] = float(flags[flag]) if flag in flags else default
        except ValueError:
            found[flag] = default
    return found


def _zone_nodes(entry: Mapping[str, Any] | None) -> tuple[int, int, int]:
    """(zones, nodes per zone, nodes): the plan's pools at their ceiling (autoscaling maxNodes), spread evenly over its
    zones (kilonode spreads a pool's scale sets over the zones)."""
    plan = plan_of(entry)
    nodes = 0
    for pool in plan.get("nodePools") or []:
        if isinstance(pool, Mapping):
            scaling = pool.get("autoscaling") if isinstance(pool.get("autoscaling"), Mapping) else {}
            nodes += max(int(pool.get("nodes") or 0), int(scaling.get("maxNodes") or 0))
    zones = max(1, len(plan.get("zones") or []))
    return zones, math.ceil(nodes / zones), nodes


def _tainted(v: Mapping[str, float], zone: int, down: int) -> float:
    """Nodes of one zone tainted NoExecute in OUTAGE_S with `down` of its `zone` nodes NotReady."""
    if down <= 0 or down >= zone:
        return 0.0
    partial = down > 2 and down / zone >= v["unhealthy-zone-threshold"]
    rate = (v["secondary-node-eviction-rate"] if zone > v["large-cluster-size-threshold"] else 0.0) if partial \
        else v["node-eviction-rate"]
    return min(float(down), max(rate, 0.0) * OUTAGE_S)


def _evictions(diff: StackDiff, before: Mapping[str, Mapping[str, str]],
               after: Mapping[str, Mapping[str, str]]) -> list[Finding]:
    hosts = [h for h in after if h in before and any(before[h].get(f) != after[h].get(f) for f in EVICTION_FLAGS)]
    if not hosts:
        return []
    zones, zone, _ = _zone_nodes(diff.head)
    worst: tuple[float, int, float, float] | None = None
    for host in hosts:
        was, now = _eviction(before[host]), _eviction(after[host])
        # the largest outage one side still judges healthy, and one past both thresholds (all but one node)
        outages = {max(0, math.ceil(t * zone) - 1) for t in (was["unhealthy-zone-threshold"],
                                                             now["unhealthy-zone-threshold"])} | {zone - 1}
        for down in sorted(outages):
            b, a = _tainted(was, zone, down), _tainted(now, zone, down)
            if a > b and (worst is None or (a - b) > worst[0]):
                worst = (a - b, down, b, a)
    if worst is None:
        return []  # less eviction: the generic line says the values
    _, down, b, a = worst
    said = "; ".join(f"--{f} {_values(before, hosts, f)} -> {_values(after, hosts, f)}" for f in EVICTION_FLAGS
                     if any(before[h].get(f) != after[h].get(f) for h in hosts))
    now = _eviction(after[hosts[0]])
    level = HIGH if (a - b) * zones >= EVICTION_HIGH_NODES else MEDIUM
    share = down / zone
    return [Finding(level, EVICTION_RULE, (
        f"kube-controller-manager {said} on {len(hosts)} apiserver host(s): with {down:,} of a zone's {zone:,} nodes "
        f"NotReady ({share:.0%}; the plan's nodes at their ceiling over its {zones} zone(s)), the node lifecycle "
        f"controller taints {a:,.0f} of them NoExecute in the first {_shown_s(OUTAGE_S)}, was {b:,.0f} "
        f"({(a - b) * zones:,.0f} more nodes if every zone has such an outage). Upstream's defaults: 0.1 nodes/s per "
        "zone while under --unhealthy-zone-threshold 0.55 of the zone is NotReady, 0.01/s past it in a zone larger "
        "than --large-cluster-size-threshold 50, none in a smaller one (pkg/controller/nodelifecycle/"
        "node_lifecycle_controller.go ComputeZoneState, ReducedQPSFunc; config/v1alpha1/defaults.go): the slow rate "
        "is what keeps a partial outage (a rack, a network blip, a bad agent rollout) from evicting the zone. Every "
        "tainted node's pods are evicted once their 300 s toleration runs out, and a training gang loses its whole "
        f"job with one member; at {now['node-eviction-rate']:g}/s the taints outpace any operator's response. Keep "
        "upstream's rates and thresholds, or tolerate the taints longer on the workloads that can wait"),
        _subjects("kube-controller-manager", hosts), cause="kube-controller-manager flags")]


# ---- the kube-scheduler's configuration file (scheduler-nodes-to-score-raised, scheduler-config-changed) ----------
#
# kilonode.render.control_plane writes each apiserver host's etc/kubernetes/kube-scheduler-config.yaml
# (KubeSchedulerConfiguration); the unit's --config names it, so the flags alone do not show it. kubernetes/kubernetes
# pkg/scheduler/schedule_one.go numFeasibleNodesToFind: under 100 nodes every node; else the profile's
# percentageOfNodesToScore, else the configuration's, else (0, the v1 default) the adaptive 50 - nodes/125 percent
# with a floor of 5 (minFeasibleNodesPercentageToFind), and never under 100 nodes (minFeasibleNodesToFind). The
# scheduler stops filtering once that many feasible nodes are found and scores only those (kubernetes/website
# content/en/docs/concepts/scheduling-eviction/scheduler-perf-tuning.md, "Scheduler Performance Tuning").
SCHEDULER_CONFIG = "etc/kubernetes/kube-scheduler-config.yaml"
SCORE_RULE = "scheduler-nodes-to-score-raised"
SCHEDULER_CHANGED_RULE = "scheduler-config-changed"
SCORE_FIELD = "percentageOfNodesToScore"
MIN_FEASIBLE_NODES, MIN_FEASIBLE_PERCENT = 100, 5


def scheduler_configs(files: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    """apiserver host -> its KubeSchedulerConfiguration."""
    found = {}
    for path, text in files.items():
        if path.endswith("/" + SCHEDULER_CONFIG):
            loaded = load_yaml(text)
            found[path.split("/", 1)[0]] = loaded if isinstance(loaded, dict) else {}
    return found


def nodes_to_score(percentage: int, nodes: int) -> int:
    """numFeasibleNodesToFind (schedule_one.go), for `nodes` nodes."""
    if nodes < MIN_FEASIBLE_NODES:
        return nodes
    if percentage <= 0:
        percentage = max(50 - nodes // 125, MIN_FEASIBLE_PERCENT)
    return max(min(nodes, nodes * percentage // 100), MIN_FEASIBLE_NODES)


def _percentages(config: Mapping[str, Any]) -> dict[str, int]:
    """profile name -> the percentage in force for it (its own, else the configuration's; 0 adaptive)."""
    def number(value: Any) -> int:
        return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0
    top = number(config.get(SCORE_FIELD))
    found = {}
    for profile in config.get("profiles") or [{"schedulerName": "default-scheduler"}]:
        if isinstance(profile, Mapping):
            own = profile.get(SCORE_FIELD)
            found[str(profile.get("schedulerName") or "default-scheduler")] = number(own) if own is not None else top
    return found


def _flat(value: Any, path: str = "") -> dict[str, Any]:
    """Dotted paths -> leaves; profiles keyed by schedulerName, pluginConfig by name; other lists whole."""
    if isinstance(value, Mapping):
        found: dict[str, Any] = {}
        for key, inner in value.items():
            found.update(_flat(inner, f"{path}.{key}" if path else str(key)))
        return found
    keyed = path.split(".")[-1] in ("profiles", "pluginConfig")
    if keyed and isinstance(value, list) and value and all(
            isinstance(v, Mapping) and (v.get("schedulerName") or v.get("name")) for v in value):
        found = {}
        for item in value:
            key = item.get("schedulerName") or item.get("name")
            found.update(_flat({k: v for k, v in item.items() if k not in ("schedulerName", "name")},
                               f"{path}[{key}]"))
        return found
    return {path: value}


# The default profile's packing (`scheduler-packing-off`, high; trace 19, P04): kilonode scores nodes MostAllocated with
# NodeResourcesBalancedAllocation off (kilonode.render.control_plane scheduler_config: the 2,500-node post's lesson,
# pack nodes so whole-node pods fit and empty nodes scale down). Upstream's default is LeastAllocated with
# BalancedAllocation on (kubernetes/kubernetes pkg/scheduler/apis/config/v1/defaults.go SetDefaults_NodeResourcesFitArgs
# and default_plugins.go getDefaultPlugins, read in the search index's copy of the 1.34 line): the emptiest node wins.
PACKING_RULE = "scheduler-packing-off"
PACKING_PROFILE = "default-scheduler"
_FIT = f"profiles[{PACKING_PROFILE}].pluginConfig[NodeResourcesFit].args.scoringStrategy.type"
_SCORE_DISABLED = f"profiles[{PACKING_PROFILE}].plugins.score.disabled"
_BALANCED = "NodeResourcesBalancedAllocation"


def _packing(config: Mapping[str, Any]) -> tuple[str, bool]:
    """(the default profile's NodeResourcesFit scoring type, whether BalancedAllocation still scores)."""
    flat = _flat(config)
    disabled = flat.get(_SCORE_DISABLED) or []
    names = {str(d.get("name")) for d in disabled if isinstance(d, Mapping)} if isinstance(disabled, list) else set()
    return str(flat.get(_FIT) or "LeastAllocated"), _BALANCED not in names and "*" not in names


def _packing_off(diff: StackDiff, before: Mapping[str, Any], after: Mapping[str, Any],
                 hosts: list[str]) -> tuple[list[Finding], set[str]]:
    off = [h for h in hosts if _packing(before[h]) == ("MostAllocated", False) and _packing(after[h]) != (
        "MostAllocated", False)]
    if not off:
        return [], set()
    strategy, balanced = _packing(after[off[0]])
    gpu = [p for p in plan_of(diff.head).get("nodePools") or [] if isinstance(p, Mapping) and p.get("gpusPerNode")]
    autoscaled = [str(p.get("name")) for p in gpu if p.get("autoscaling")]
    return [Finding(HIGH, PACKING_RULE, (
        f"the default scheduler stops packing nodes on {len(off)} apiserver host(s): NodeResourcesFit scoring "
        f"MostAllocated -> {strategy}" + (f", {_BALANCED} scoring again" if balanced else "") + ". "
        f"{strategy} puts each pod on the emptiest node that fits (upstream's default: pkg/scheduler/apis/config/v1 "
        "defaults.go SetDefaults_NodeResourcesFitArgs): the small default-scheduler pods (a notebook, an evaluation "
        "job, a one-GPU test) spread one per GPU node, so the 8-GPU pods of training gangs find fewer whole nodes "
        "free and wait" + (f", and the autoscaled pools ({', '.join(autoscaled)}) can no longer empty a node to "
                             "remove it: the scattered pods keep every node above the scale-down threshold"
                             if autoscaled else "") +
        ". kilonode packs on purpose (kilonode.render.control_plane scheduler_config: the 2,500-node post's "
        "MostRequestedPriority). Keep MostAllocated with BalancedAllocation disabled for the default profile"),
        tuple(f"{h}/{SCHEDULER_CONFIG}" for h in off), cause="kube-scheduler configuration")], set(off)


def scheduler_config(diff: StackDiff) -> list[Finding]:
    before, after = scheduler_configs(_files(diff.base)), scheduler_configs(_files(diff.head))
    hosts = _shared(before, after)
    if not hosts:
        return []
    _, _, nodes = _zone_nodes(diff.head)
    found, packing = _packing_off(diff, before, after, hosts)
    raised: dict[tuple[str, int, int], list[str]] = {}
    for host in hosts:
        was, now = _percentages(before[host]), _percentages(after[host])
        for profile, pct in now.items():
            b, a = nodes_to_score(was.get(profile, 0), nodes), nodes_to_score(pct, nodes)
            if a > b:
                raised.setdefault((profile, was.get(profile, 0), pct), []).append(host)
    spoken = set()
    for (profile, was_pct, now_pct), hs in sorted(raised.items()):
        b, a = nodes_to_score(was_pct, nodes), nodes_to_score(now_pct, nodes)
        spoken |= set(hs)

        def shown(p: int) -> str:
            return f"{p}%" if p > 0 else "unset (adaptive)"
        found.append(Finding(MEDIUM, SCORE_RULE, (
            f"kube-scheduler {SCORE_FIELD} of profile {profile} {shown(was_pct)} -> {shown(now_pct)} on {len(hs)} "
            f"apiserver host(s): at the plan's {nodes:,} nodes each pod's scheduling cycle filters and scores up to "
            f"{a:,} feasible nodes, was {b:,} ({a / max(b, 1):.0f}x the per-pod work; upstream's adaptive default is "
            "50% at 100 nodes falling by 1% per 125 nodes to a 5% floor, 10% at 5,000: pkg/scheduler/schedule_one.go "
            "numFeasibleNodesToFind, docs \"Scheduler Performance Tuning\"). The trade-off: a slightly better "
            "placement per pod against scheduling latency and throughput: a gang of thousands of pods is placed up to "
            "that many times slower, and a pod waiting at Permit holds its node the while. Keep it "
            "unset (adaptive) or low at this size"), tuple(f"{h}/{SCHEDULER_CONFIG}" for h in hs),
            cause="kube-scheduler configuration"))
    changes: dict[tuple[str, str, str], list[str]] = {}
    for host in hosts:
        was, now = _flat(before[host]), _flat(after[host])
        for key in sorted({*was, *now}):
            if was.get(key) == now.get(key) or (host in spoken and key.split(".")[-1] == SCORE_FIELD):
                continue
            if host in packing and key in (_FIT, _SCORE_DISABLED):
                continue
            changes.setdefault((key, _shown(was.get(key)), _shown(now.get(key))), []).append(host)
    if changes:
        said = [f"{key} {w} -> {n}" + (f" ({', '.join(hs)})" if len(hs) < len(after) else "")
                for (key, w, n), hs in sorted(changes.items())]
        changed_hosts = sorted({h for hs in changes.values() for h in hs})
        found.append(Finding(MEDIUM, SCHEDULER_CHANGED_RULE, (
            f"a kube-scheduler configuration field the review does not model changed on {len(changed_hosts)} "
            f"apiserver host(s): {'; '.join(said)}; check it against the KubeSchedulerConfiguration reference "
            "(kubernetes/kube-scheduler config/v1/types.go at the pinned version) and kilonode's reasons for its value "
            "(kilonode.render.control_plane)"), tuple(f"{h}/{SCHEDULER_CONFIG}" for h in changed_hosts),
            cause="kube-scheduler configuration"))
    return found


# ---- the Events' retention (event-ttl-raised, event-ttl-lowered) --------------------------------------------------
#
# Independent trace 11b: kube-apiserver --event-ttl=24h was only the generic line. The flag: "Amount of time to retain
# events.", default 1h0m0s (kubernetes/kubernetes cmd/kube-apiserver/app/options/options.go, since 1.31
# pkg/controlplane/apiserver/options/options.go AddFlags, the "misc" flag set, EventTTL: 1 * time.Hour; the search
# index's copies, not read at v1.34.2; kubernetes/website content/en/docs/reference/command-line-tools-reference/
# kube-apiserver.md). The Event registry gives every Event that TTL (pkg/registry/core/event/storage/storage.go NewREST:
# TTLFunc returns it), and the etcd3 storage attaches each Event to an etcd lease of that length
# (k8s.io/apiserver pkg/storage/etcd3/store.go Create with ttl, lease_manager.go: leases reused for
# --lease-reuse-duration-seconds, 60 s), so an Event lives in etcd until its lease runs out: the Events store holds
# every Event of the last TTL. kilonode sends /events to their own etcd cluster (plan.yaml etcdEvents:
# kilonode.plan.resolve.control_plane, the 7,500-node post's lesson that Event volume belonged apart), sized by its
# quotaBackendBytes; a member that reaches its quota raises NOSPACE and refuses every write (etcd
# server/etcdserver/quota.go), so every Event write fails. Neither the plan nor the catalogue has an Event rate, so the
# rule computes the break-even: the steady Event rate at which the head's TTL fills the quota.
EVENT_TTL_RAISED_RULE = "event-ttl-raised"
EVENT_TTL_LOWERED_RULE = "event-ttl-lowered"
_FLAGS_OF[EVENT_TTL_RAISED_RULE] = ("event-ttl",)
_FLAGS_OF[EVENT_TTL_LOWERED_RULE] = ("event-ttl",)
EVENT_TTL_DEFAULT_S = 3600.0
# One Event as stored, measured like the catalogue's objects (limits.yaml etcd.*ObjectBytes): the compact JSON of a
# kubelet "Pulled" Event on a training pod with its managedFields (tests/review/test_review_trace11b.py builds it and
# checks this figure). The apiserver stores protobuf, smaller; an Event's updates (count bumps) add revisions until the
# next compaction on top: a per-Event figure, not a bound.
EVENT_OBJECT_BYTES = 1312
# kilonode's judgement, not an upstream figure: a fleet that records fewer than one Event per node per minute is a
# quiet one (a pod's start alone records five on its node: Scheduled, Pulling, Pulled, Created, Started,
# pkg/kubelet/events/event.go). A TTL at which the quota holds less than that is high.
QUIET_EVENTS_PER_NODE_MINUTE = 1.0


def _event_ttl(flags: Mapping[str, str]) -> float:
    return _duration(flags.get("event-ttl")) or EVENT_TTL_DEFAULT_S


def _ttl_shown(value: float) -> str:
    return f"{value / 3600:g} h" if value >= 3600 else _shown_s(value)


def _events_quota(entry: Mapping[str, Any] | None) -> int | None:
    events = plan_of(entry).get("etcdEvents")
    quota = events.get("quotaBackendBytes") if isinstance(events, Mapping) else None
    return int(quota) if isinstance(quota, int) and quota > 0 else None


def _event_ttls(diff: StackDiff, before: Mapping[str, Mapping[str, str]],
                after: Mapping[str, Mapping[str, str]]) -> list[Finding]:
    hosts = _changed_hosts(before, after, "event-ttl")
    raised = [h for h in hosts if _event_ttl(after[h]) > _event_ttl(before[h])]
    lowered = [h for h in hosts if _event_ttl(after[h]) < _event_ttl(before[h])]
    found = []
    if raised:
        found.append(_ttl_raised(diff, before, after, raised))
    if lowered:
        was = max(_event_ttl(before[h]) for h in lowered)
        now = min(_event_ttl(after[h]) for h in lowered)
        found.append(Finding(MEDIUM, EVENT_TTL_LOWERED_RULE, (
            f"kube-apiserver --event-ttl {_values(before, lowered, 'event-ttl')} -> "
            f"{_values(after, lowered, 'event-ttl')} on {len(lowered)} apiserver host(s): every Event written through "
            f"them is deleted {_ttl_shown(now)} after its last write, was {_ttl_shown(was)} (upstream's default "
            "1h0m0s, \"Amount of time to retain events\"; the Event registry's TTLFunc and the etcd lease each Event "
            "is attached to: pkg/registry/core/event/storage/storage.go, k8s.io/apiserver pkg/storage/etcd3). Less "
            "for the Events etcd to hold, but the why of a failure (FailedScheduling, FailedMount, BackOff, a node's "
            "NotReady, an eviction) is gone sooner: `kubectl describe` and `kubectl get events` show nothing for an "
            "incident found later than that. Keep 1h unless the Events are shipped elsewhere (an event exporter)"),
            _subjects("kube-apiserver", lowered), cause="kube-apiserver flags"))
    return found


def _ttl_raised(diff: StackDiff, before: Mapping[str, Mapping[str, str]], after: Mapping[str, Mapping[str, str]],
                hosts: list[str]) -> Finding:
    was = min(_event_ttl(before[h]) for h in hosts)
    now = max(_event_ttl(after[h]) for h in hosts)
    ratio = now / was
    said = (f"kube-apiserver --event-ttl {_values(before, hosts, 'event-ttl')} -> {_values(after, hosts, 'event-ttl')} "
            f"on {len(hosts)} apiserver host(s): every Event stays {_ttl_shown(now)} after its last write, was "
            f"{_ttl_shown(was)}, so the Events store holds {ratio:g}x the Events it holds today (upstream's default "
            "1h0m0s, \"Amount of time to retain events\"; the Event registry gives each Event that TTL and the etcd3 "
            "storage attaches it to an etcd lease of that length: pkg/registry/core/event/storage/storage.go NewREST "
            "TTLFunc, k8s.io/apiserver pkg/storage/etcd3/store.go and lease_manager.go)")
    quota = _events_quota(diff.head)
    job = etcd_job("events")
    watch = (f"Watch etcd_mvcc_db_total_size_in_bytes{{job=\"{job}\"}} against its quota "
             f"(KilonodeEtcdDatabaseNearQuota at {ETCD_QUOTA_WARNING:.0%} and {ETCD_QUOTA_CRITICAL:.0%}, "
             "KilonodeEtcdNoSpace) for at least "
             f"{_ttl_shown(now)} after the change")
    if quota is None:
        diff.note(f"{EVENT_TTL_RAISED_RULE}: the head's plan names no etcdEvents.quotaBackendBytes, so the Event rate "
                  "that fills the Events store at the new TTL was not computed")
        return Finding(MEDIUM, EVENT_TTL_RAISED_RULE, (
            f"{said}. {watch}. Raise the Events cluster's quota with it, or keep 1h"),
            _subjects("kube-apiserver", hosts), cause="kube-apiserver flags")
    _, _, nodes = _zone_nodes(diff.head)
    rate_now = quota / (now * EVENT_OBJECT_BYTES)
    rate_was = quota / (was * EVENT_OBJECT_BYTES)
    per_node_min = rate_now / max(nodes, 1) * 60
    level = HIGH if per_node_min < QUIET_EVENTS_PER_NODE_MINUTE else MEDIUM
    return Finding(level, EVENT_TTL_RAISED_RULE, (
        f"{said}. The Events have their own etcd cluster (plan.yaml etcdEvents, the 7,500-node post's lesson: Event "
        f"volume kept apart from the main store) with a quota of {quota:,} bytes ({quota / 2**30:g} GiB); at "
        f"~{EVENT_OBJECT_BYTES:,} B an Event (a kubelet Event with its managedFields, measured) that quota holds "
        f"{_ttl_shown(now)} of Events only while they come at under {rate_now:,.0f}/s cluster-wide "
        f"({per_node_min:.2g} per node per minute over the plan's {nodes:,} nodes at their ceiling), where "
        f"{_ttl_shown(was)} held {rate_was:,.0f}/s; put the other way, the store fills if it holds more than "
        f"{quota / ratio / 2**20:,.0f} MiB today (1/{ratio:g} of the quota). Past the quota the Events cluster raises "
        "NOSPACE and refuses every write (etcd server/etcdserver/quota.go): every Event of the cluster is lost until "
        "it is compacted, defragmented and disarmed, and etcd frees no file space as Events expire (pages are "
        "reused, the file does not shrink), so the peak stays. kilonode's own review says Events are \"kept an hour "
        f"(--event-ttl), so losing them costs little\" (kilonode.review.lifecycle): no longer. {watch}. Raise "
        f"etcd.events.quotaBackendBytes first, to at least {ratio:g}x the store's size today (its "
        "etcd_mvcc_db_total_size_in_bytes now), in a change that rolls out before this one"
        + (": the quota is already at the 8 GiB etcd suggests at most (kilonode's configuration refuses more "
           "without acknowledgeQuotaAboveSuggestedMaximum), so at this size " if quota >= 8 * 2**30 else "; or ")
        + "keep 1h and ship Events elsewhere (an event exporter) "
        "for the longer history"), _subjects("kube-apiserver", hosts), cause="kube-apiserver flags")
