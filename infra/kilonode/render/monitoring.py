"""What a user's own Prometheus needs to watch the cluster kilonode built: a rule file (alert
and recording rules for the signals the 2,500- and 7,500-node posts learnt to watch, and the
control plane's certificate expiry) and a
scrape-configuration fragment that names this cluster's apiservers and etcd members and
labels each etcd member with its cluster (main or events). Pure: plan in, text out.

    alert_rules(plan) -> str      # a Prometheus rule file (`rule_files:`)
    scrape_config(plan) -> str    # `scrape_configs:`: a file for `scrape_config_files:` (Prometheus >= 2.43)
    describe(plan) -> list[str]   # one line per alert, for `kilonode explain`

kilonode deploys no Prometheus; kilonode.k8s.monitoring delivers both files in a ConfigMap and
docs/monitoring.md says how to load them and which Prometheus flags the posts needed.

Metric and label names, and where they were read:
- kube-apiserver: `apiserver_request_total` (STABLE; labels verb, dry_run, group, version,
  resource, subresource, scope, component, code), kubernetes/apiserver v0.34.10
  pkg/endpoints/metrics/metrics.go l.78-86; verbs WATCH and CONNECT are the long-running ones
  (CleanVerb, l.734-750).
- etcd v3.5.33 (the pinned release, node-image/binaries.toml): `etcd_mvcc_db_total_size_in_bytes`
  (server/mvcc/metrics.go l.163-174, the backend's physical size, kvstore.go l.530: the size
  the quota check compares, server/etcdserver/quota.go l.127-135), `etcd_server_quota_backend_bytes`
  (server/etcdserver/metrics.go l.127-132, set from --quota-backend-bytes in quota.go l.76),
  `etcd_server_has_leader`, `etcd_server_leader_changes_seen_total` (metrics.go l.29-47),
  `etcd_disk_wal_fsync_duration_seconds` (server/wal/metrics.go l.20-28),
  `etcd_disk_backend_commit_duration_seconds` (server/mvcc/backend/metrics.go l.20-28), and
  `grpc_server_handled_total` (go-grpc-prometheus, registered in
  server/etcdserver/api/v3rpc/grpc.go l.86); all on the metrics URL, which serves the default
  registry (server/etcdserver/api/etcdhttp/metrics.go l.29-30). etcd 3.5 exports no alarm
  metric: `etcd_debugging_server_alarms{alarm_type}` arrived in v3.6.0
  (server/etcdserver/apply/metrics.go, apply.go l.230-237).
- kube-scheduler and kube-controller-manager: `leader_election_master_status{name}` (component-base
  metrics/prometheus/clientgo/leaderelection, which both binaries load through
  metrics/prometheus/clientgo in their main packages): 0 on every candidate from the start
  (client-go kubernetes-1.34.2 tools/leaderelection/leaderelection.go l.112, NewLeaderElector),
  1 on the one that acquired the lease (l.270), 0 again when it fails to renew (l.296). The lease
  names: "kube-scheduler" (cmd/kube-scheduler/app/options/options.go makeLeaderElectionConfig) and
  the controller manager's --leader-elect-resource-name, "kube-controller-manager" by default.
- kube-state-metrics v2.20.0: `kube_node_spec_taint{node,key,value,effect}`,
  `kube_node_status_condition{node,condition,status}` (status true|false|unknown, any condition
  type, custom ones included), `kube_node_labels{node,label_<key>}` (internal/store/node.go
  l.289-315 and l.507-535; utils.go l.68-79 and l.142-160: `kilonode.io/pool` becomes
  `label_kilonode_io_pool`). kube_node_labels carries no label unless KSM runs with
  `--metric-labels-allowlist=nodes=[kilonode.io/pool]` (docs/developer/cli-arguments.md l.66).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urlsplit

from kilonode.node.gpu import controller as gpu_controller
from kilonode.node.gpu import protocol
from kilonode.node.gpu.rules import NOT_TAINTING, xid_catalog
from kilonode.node.gpu.rules import thresholds as gpu_thresholds
from kilonode.plan import defaults, wellknown
from kilonode.plan.model import ClusterPlan, EtcdClusterPlan, NodePoolPlan
from kilonode.render.common import GENERATED
from kilonode.render.pool import gpu_health_config
from kilonode.yamlio import block_yaml

# The two files, as the ConfigMap's keys and the names docs/monitoring.md mounts them under.
RULES_FILE = "kilonode-rules.yaml"
SCRAPE_FILE = "kilonode-scrape-configs.yaml"
# The whole configuration of the cluster's own Prometheus, and where the ConfigMap is mounted.
PROMETHEUS_FILE = defaults.PROMETHEUS_CONFIG_FILE
CONFIG_DIR = defaults.PROMETHEUS_CONFIG_DIR
# docs/monitoring.md, relative to the repository: each alert's runbook is a section there.
RUNBOOK_DOC = "docs/monitoring.md"

# Job names: the rules select by them, so the rules see exactly the targets this fragment
# defines (aggregated API servers such as metrics-server also export apiserver_request_total).
JOB_APISERVER = "kilonode-apiserver"
JOB_SCHEDULER = "kilonode-scheduler"
JOB_CONTROLLER_MANAGER = "kilonode-controller-manager"
JOB_KUBELET = "kilonode-kubelet"
JOB_CADVISOR = "kilonode-cadvisor"
JOB_KUBE_STATE_METRICS = "kilonode-kube-state-metrics"
JOB_CERTIFICATES = "kilonode-certificates"
JOB_POD_TRAFFIC = "kilonode-pod-traffic"
JOB_AUTOSCALER = "kilonode-cluster-autoscaler"
# The cluster's Alertmanager (kilonode.k8s.alertmanager), at its Service's name: Prometheus sends it
# alerts and scrapes it.
JOB_ALERTMANAGER = "kilonode-alertmanager"
ALERTMANAGER_ADDRESS = f"{defaults.ALERTMANAGER_NAME}.{defaults.MONITORING_NAMESPACE}.svc:{defaults.ALERTMANAGER_PORT}"
# cluster-autoscaler's namespace and pod label (kilonode.k8s.autoscaler: Deployment kube-system/
# cluster-autoscaler, labels k8s-app=cluster-autoscaler); named here, not imported (layers).
AUTOSCALER_NAMESPACE = "kube-system"
AUTOSCALER_APP = "cluster-autoscaler"
ETCD_JOB_PREFIX = "kilonode-etcd-"
ETCD_JOBS = f'{ETCD_JOB_PREFIX}.+'

# The label the scrape configuration puts on every etcd target: the quota alerts compare each
# cluster with its own --quota-backend-bytes.
CLUSTER_ROLE_LABEL = "cluster_role"
# The node label kilonode registers every node with (kilonode.plan.resolve: labels), as
# kube-state-metrics names it once allowlisted.
POOL_LABEL = "kilonode.io/pool"
KSM_POOL_LABEL = "label_kilonode_io_pool"

# Where a Pod's ServiceAccount credentials are mounted: the Prometheus the user runs in the
# cluster authenticates to the apiservers and kubelets with them and trusts the cluster CA,
# which signs the apiservers', schedulers' and controller managers' serving certificates
# (kilonode.plan.pki, with each instance's IP) and the kubelets' (serverTLSBootstrap, approved by
# kilonode.k8s.approver).
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
SA_TOKEN = f"{SA_DIR}/token"
SA_CA = f"{SA_DIR}/ca.crt"

# --- Thresholds, each with its reason --------------------------------------------------------
# Field notes: apiserver 429 and 5xx rates are the first signal of trouble. A 429 is API
# Priority and Fairness shedding load (a priority level's queues are full); a few during a burst
# of pod creations are normal, 1% sustained for 10 minutes is not, and 5% for 5 minutes means
# controllers and kubelets are being refused widely (node status updates next).
APISERVER_429_WARNING = 0.01
APISERVER_429_CRITICAL = 0.05
# 5xx: the apiserver or etcd behind it failing requests. 1% is a 99% availability objective.
APISERVER_5XX_WARNING = 0.01
APISERVER_5XX_CRITICAL = 0.05
# A ratio on a trickle of requests says nothing: at least this many refused requests a second
# (six a minute) before either ratio alerts.
APISERVER_MIN_ERROR_RATE = 0.1
# 2,500-node post: etcd hit its quota past 1,000 nodes, stopped accepting writes, every node
# failed its health checks and the autoscaler then tried to delete the fleet. Warn at 70%
# (days of growth left to compact, defragment or raise the quota), page at 85% (hours).
ETCD_QUOTA_WARNING = 0.70
ETCD_QUOTA_CRITICAL = 0.85
# etcd FAQ (etcd-io/website content/en/docs/v3.5/faq.md, "failed to send out heartbeat on time"
# and "apply entries took too long"): p99 wal_fsync below 10 ms and p99 backend_commit below
# 25 ms mean the disk is fast enough. Field notes: the local SSD gives ~200 us, a remote premium
# SSD ~2 ms; 10 ms means the disk is slower than the setup the posts moved away from.
ETCD_WAL_FSYNC_P99_WARNING = 0.010
ETCD_BACKEND_COMMIT_P99_WARNING = 0.025
# etcd's own mixin (contrib/mixin/mixin.libsonnet at v3.5.33, etcdHighFsyncDurations l.182-194):
# p99 fsync above 1 s is critical; it is etcd's default election timeout, and "disk latency is
# part of leader liveness" (FAQ): a leader that slow loses its leadership.
ETCD_WAL_FSYNC_P99_CRITICAL = 1.0
# etcd's mixin (etcdHighNumberOfLeaderChanges l.75-87): 4 or more leader changes in 15 minutes.
ETCD_LEADER_CHANGES_15M = 4
# The apiserver compacts etcd every --etcd-compaction-interval, which kilonode leaves at its default 5m
# (catalog limits.yaml kubernetes.compactionIntervalSeconds; no unit sets the flag): each compaction moves
# etcd_debugging_mvcc_compact_revision (etcd v3.5.33 server/mvcc/metrics.go l.255-266) to a revision of the
# previous one. Six intervals (30 minutes) without a move while the revision grows (current_revision,
# l.239-250) is compaction stopped, not a slow tick: history piles up until the quota (etcd's own periodic
# auto-compaction, --auto-compaction-retention, is the backstop, and it has not moved it either).
ETCD_COMPACTION_STALL_INTERVALS = 6
# GPU pools: nodes the GPU health controller tainted kilonode.io/gpu-unhealthy. One such node is
# work for a person (drain, repair or replace). Several percent of a pool at once points to a
# common cause (a driver, firmware or image rollout, or a broken check) that strands jobs across
# the pool; 5% pages well before the field notes' 50% line at which an autoscaler must stop.
GPU_UNHEALTHY_CRITICAL_FRACTION = 0.05

# Certificates (kilonode.render.cert_metrics exports each control-plane host's): leaves last a
# year and are renewed one host per `pulumi up` by the stack's certificateGenerations
# (docs/runbooks/certificate-renewal.md). 45 days leave room to renew the 13 hosts of
# research-7500 one a day with time to spare; 14 days is the last fortnight, when it pages.
CERT_EXPIRY_WARNING_DAYS = defaults.CERT_EXPIRY_WARNING_DAYS
CERT_EXPIRY_CRITICAL_DAYS = defaults.CERT_EXPIRY_CRITICAL_DAYS
CERT_RUNBOOK = "docs/runbooks/certificate-renewal.md"

# "none": the dead man's switch (KilonodeWatchdog), which fires while all is well and never pages
Severity = Literal["warning", "critical", "none"]


@dataclass(frozen=True)
class Alert:
    name: str
    expr: str
    duration: str  # `for:`
    severity: Severity
    condition: str  # the threshold in words (describe, and the description's first line)
    summary: str
    action: str  # what to do, the description's second part
    runbook: str  # a section of RUNBOOK_DOC
    # Static labels besides severity: one alert per etcd cluster under one name needs its
    # cluster's (promtool check rules refuses rules alike in name and labels).
    labels: tuple[tuple[str, str], ...] = ()

    def rule(self) -> dict[str, Any]:
        return {
            "alert": self.name,
            "expr": self.expr,
            "for": self.duration,
            "labels": {"severity": self.severity, **dict(self.labels)},
            "annotations": {
                "summary": self.summary,
                "description": f"{self.condition}. {self.action}",
                "runbook": f"{RUNBOOK_DOC}#{self.runbook}",
            },
        }


@dataclass(frozen=True)
class Record:
    name: str
    expr: str
    labels: tuple[tuple[str, str], ...] = ()

    def rule(self) -> dict[str, Any]:
        rule: dict[str, Any] = {"record": self.name, "expr": self.expr}
        if self.labels:
            rule["labels"] = dict(self.labels)
        return rule


@dataclass(frozen=True)
class Group:
    name: str
    rules: tuple[Alert | Record, ...]

    def data(self) -> dict[str, Any]:
        return {"name": self.name, "rules": [r.rule() for r in self.rules]}


def _percent(fraction: float) -> str:
    return f"{fraction * 100:g}%"


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:g} ms"


# --- kube-apiserver --------------------------------------------------------------------------
APISERVER_RATE = "kilonode:apiserver_requests:rate5m"


def _apiserver_ratio(code: str, threshold: float) -> str:
    refused = f"sum({APISERVER_RATE}{{code{code}}})"
    return (f"{refused} / sum({APISERVER_RATE}) > {threshold:g}\n"
            f"and {refused} > {APISERVER_MIN_ERROR_RATE:g}")


def apiserver_group() -> Group:
    requests = f'apiserver_request_total{{job="{JOB_APISERVER}",verb!~"WATCH|CONNECT"}}'
    throttled = "HTTP 429 (API Priority and Fairness shed the request)"
    failed = "HTTP 5xx"
    throttling_action = (
        "Find who is being throttled: apiserver_flowcontrol_rejected_requests_total by flow_schema and "
        "priority_level, and the audit log for the clients; look for a DaemonSet or agent that LISTs or "
        "polls from every node (field notes: 500 MB/s of etcd reads), a controller in a hot loop, or nodes "
        "being added too fast. Slow the client down or give it its own FlowSchema; do not raise the limits "
        "first.")
    error_action = (
        "Look at the apiserver logs and at etcd (latency, leader, quota alerts): most 5xx at scale are "
        "etcd timeouts or an apiserver out of memory. Check the resources and verbs in "
        "apiserver_request_total{code=~\"5..\"}.")
    return Group("kilonode-apiserver", (
        # WATCH and CONNECT are long-running: their count says nothing about load shed or failed.
        Record(APISERVER_RATE, f"sum by (code) (rate({requests}[5m]))"),
        Alert("KilonodeApiserverThrottling", _apiserver_ratio('="429"', APISERVER_429_WARNING), "10m", "warning",
              f"More than {_percent(APISERVER_429_WARNING)} of apiserver requests answered {throttled} for 10m",
              "The apiservers are shedding load (HTTP 429)", throttling_action, "apiserver-429"),
        Alert("KilonodeApiserverThrottling", _apiserver_ratio('="429"', APISERVER_429_CRITICAL), "5m", "critical",
              f"More than {_percent(APISERVER_429_CRITICAL)} of apiserver requests answered {throttled} for 5m",
              "The apiservers are refusing a large share of requests (HTTP 429)", throttling_action,
              "apiserver-429"),
        Alert("KilonodeApiserverErrors", _apiserver_ratio('=~"5.."', APISERVER_5XX_WARNING), "10m", "warning",
              f"More than {_percent(APISERVER_5XX_WARNING)} of apiserver requests answered {failed} for 10m",
              "The apiservers are failing requests (HTTP 5xx)", error_action, "apiserver-5xx"),
        Alert("KilonodeApiserverErrors", _apiserver_ratio('=~"5.."', APISERVER_5XX_CRITICAL), "5m", "critical",
              f"More than {_percent(APISERVER_5XX_CRITICAL)} of apiserver requests answered {failed} for 5m",
              "The apiservers are failing a large share of requests (HTTP 5xx)", error_action, "apiserver-5xx"),
    ))


# --- etcd --------------------------------------------------------------------------------------
ETCD_QUOTA_RATIO = "kilonode:etcd_db_quota:ratio"
ETCD_QUOTA_HEADROOM = "kilonode:etcd_db_quota_headroom:bytes"
ETCD_WAL_FSYNC_P99 = "kilonode:etcd_disk_wal_fsync_duration_seconds:p99"
ETCD_BACKEND_COMMIT_P99 = "kilonode:etcd_disk_backend_commit_duration_seconds:p99"
BY_MEMBER = f"{CLUSTER_ROLE_LABEL}, instance"


def etcd_job(role: str) -> str:
    return f"{ETCD_JOB_PREFIX}{role}"


def _size_and_quota(cluster: EtcdClusterPlan) -> tuple[str, str]:
    """Each member's database size, and its quota: the one etcd reports
    (etcd_server_quota_backend_bytes), or, where a member does not export it, the plan's."""
    job = f'job="{etcd_job(cluster.role)}"'
    size = f"max by ({BY_MEMBER}) (etcd_mvcc_db_total_size_in_bytes{{{job}}})"
    quota = (f"(\n"
             f"  max by ({BY_MEMBER}) (etcd_server_quota_backend_bytes{{{job}}})\n"
             f"  or on ({BY_MEMBER}) ({size} * 0 + {cluster.quota_backend_bytes})\n"
             f")")
    return size, quota


def _quota_ratio(cluster: EtcdClusterPlan) -> Record:
    """Each member's database size over its quota."""
    size, quota = _size_and_quota(cluster)
    # One rule per cluster under one name: the label keeps them apart (and says which).
    return Record(ETCD_QUOTA_RATIO, f"{size}\n/ on ({BY_MEMBER}) {quota}",
                  labels=((CLUSTER_ROLE_LABEL, cluster.role),))


def _quota_headroom(cluster: EtcdClusterPlan) -> Record:
    """Each member's quota less its database size: what one write may still cost before the
    member refuses it and raises NOSPACE."""
    size, quota = _size_and_quota(cluster)
    return Record(ETCD_QUOTA_HEADROOM, f"{quota}\n- on ({BY_MEMBER}) {size}",
                  labels=((CLUSTER_ROLE_LABEL, cluster.role),))


def largest_write_cost(plan: ClusterPlan) -> int:
    """etcd's cost of the largest write it accepts (the plan's, from the catalogue)."""
    return max(c.largest_write_bytes for c in plan.etcd_clusters)


def _compaction_window() -> str:
    return f"{ETCD_COMPACTION_STALL_INTERVALS * defaults.APISERVER_COMPACTION_INTERVAL_S // 60}m"


def _compaction_stalled() -> str:
    """A member whose compact revision stood still over the window while its current revision moved."""
    jobs = f'job=~"{ETCD_JOBS}"'
    window = _compaction_window()
    return (f"max by ({BY_MEMBER}) (changes(etcd_debugging_mvcc_compact_revision{{{jobs}}}[{window}])) == 0\n"
            f"and on ({BY_MEMBER}) max by ({BY_MEMBER}) "
            f"(delta(etcd_debugging_mvcc_current_revision{{{jobs}}}[{window}])) > 0")


def etcd_group(plan: ClusterPlan) -> Group:
    jobs = f'job=~"{ETCD_JOBS}"'
    member = f"{{{{ $labels.{CLUSTER_ROLE_LABEL} }}}} etcd member {{{{ $labels.instance }}}}"
    quotas = ", ".join(f"{c.role} {c.quota_backend_bytes}" for c in plan.etcd_clusters)
    space_action = (
        "Find what grew (etcdctl get / --prefix --keys-only | cut -d/ -f2-3 | sort | uniq -c | sort -n), make "
        "sure compaction runs (the apiserver compacts every 5m; --auto-compaction-retention is the backstop), "
        "defragment one member at a time (etcdctl defrag), or raise quotaBackendBytes in the stack. At 100% "
        "etcd takes no writes, nodes fail their health checks and an autoscaler may try to remove them "
        "(2,500-node post).")
    nospace_action = (
        "Compact, defragment every member, then `etcdctl alarm disarm` (etcd FAQ: 'mvcc: database space "
        "exceeded'; docs/runbooks/etcd-nospace.md). Until then the cluster is read-only: stop autoscalers and "
        "anything that deletes nodes.")
    rejecting_action = (
        "Either the NOSPACE alarm is armed ('mvcc: database space "
        "exceeded', see the quota alerts: compact, defragment, `etcdctl alarm list` then `alarm disarm`) or "
        "applying lags committing by more than 5000 entries ('too many requests': a slow disk or CPU).")
    disk_action = (
        "etcd's data directory must be on the VM's local SSD (field notes: ~200 us fsync). Check the member's "
        "disk (iostat), other processes on it, and CPU steal; a member whose disk stays slow should be replaced, one "
        "at a time: a new VM's member rejoins by itself (docs/runbooks/etcd-member-lost-its-disk.md).")
    return Group("kilonode-etcd", (
        *(_quota_ratio(c) for c in plan.etcd_clusters),
        *(_quota_headroom(c) for c in plan.etcd_clusters),
        Record(ETCD_WAL_FSYNC_P99,
               f"histogram_quantile(0.99, sum by ({BY_MEMBER}, le) "
               f"(rate(etcd_disk_wal_fsync_duration_seconds_bucket{{{jobs}}}[5m])))"),
        Record(ETCD_BACKEND_COMMIT_P99,
               f"histogram_quantile(0.99, sum by ({BY_MEMBER}, le) "
               f"(rate(etcd_disk_backend_commit_duration_seconds_bucket{{{jobs}}}[5m])))"),
        Alert("KilonodeEtcdDatabaseNearQuota", f"{ETCD_QUOTA_RATIO} > {ETCD_QUOTA_WARNING:g}", "10m", "warning",
              f"The {member} database is above {_percent(ETCD_QUOTA_WARNING)} of its quota "
              f"(planned quotas in bytes: {quotas})",
              "etcd database approaching its quota", space_action, "etcd-database-size"),
        Alert("KilonodeEtcdDatabaseNearQuota", f"{ETCD_QUOTA_RATIO} > {ETCD_QUOTA_CRITICAL:g}", "5m", "critical",
              f"The {member} database is above {_percent(ETCD_QUOTA_CRITICAL)} of its quota "
              f"(planned quotas in bytes: {quotas})",
              "etcd database close to its quota: writes stop at 100%", space_action, "etcd-database-size"),
        # The NOSPACE alarm is the cluster's, not a member's: once any member raises it every
        # member refuses writes. Before etcd 3.6 there is no alarm metric; a member refuses a write
        # (and raises the alarm) when its size plus the write's cost reaches the quota, and sizes
        # differ between members and grow in steps, so the sign is any member within the largest
        # write of its quota (etcd server/etcdserver/quota.go), not a size at 100%.
        Alert("KilonodeEtcdNoSpace",
              f'max by ({CLUSTER_ROLE_LABEL}) (etcd_debugging_server_alarms{{{jobs},alarm_type="NOSPACE"}}) > 0\n'
              f"or min by ({CLUSTER_ROLE_LABEL}) ({ETCD_QUOTA_HEADROOM}) <= {largest_write_cost(plan)}",
              "1m", "critical",
              f"The {{{{ $labels.{CLUSTER_ROLE_LABEL} }}}} etcd cluster reports the NOSPACE alarm, or one of its "
              f"members is within the largest write ({largest_write_cost(plan)} bytes) of its quota: the next such "
              f"write is refused and arms the alarm for every member (the alarm metric exists from etcd 3.6)",
              "etcd is out of space and refuses writes", nospace_action, "etcd-nospace"),
        Alert("KilonodeEtcdRejectingWrites",
              f"sum by ({BY_MEMBER}) "
              f'(rate(grpc_server_handled_total{{{jobs},grpc_code="ResourceExhausted"}}[5m])) > 0',
              "1m", "critical", f"The {member} answers requests with ResourceExhausted",
              "etcd is refusing requests", rejecting_action, "etcd-nospace"),
        *(Alert("KilonodeEtcdQuotaNotAsPlanned",
                f'max by ({BY_MEMBER}) (etcd_server_quota_backend_bytes{{job="{etcd_job(c.role)}"}}) '
                f"!= {c.quota_backend_bytes}",
                "15m", "warning",
                f"The {member} runs with a quota other than the stack's {c.quota_backend_bytes} bytes for "
                f"the {c.role} cluster",
                "etcd runs with a quota the stack did not set",
                "The member did not get the stack's --quota-backend-bytes (an old unit, a member not yet "
                "replaced). Roll the member with the rendered unit; until then its quota alerts use its own "
                "quota.", "etcd-database-size", labels=((CLUSTER_ROLE_LABEL, c.role),))
          for c in plan.etcd_clusters),
        Alert("KilonodeEtcdSlowWalFsync", f"{ETCD_WAL_FSYNC_P99} > {ETCD_WAL_FSYNC_P99_WARNING:g}", "10m", "warning",
              f"The {member} p99 WAL fsync is above {_ms(ETCD_WAL_FSYNC_P99_WARNING)} (etcd FAQ: a healthy disk "
              f"stays below)", "etcd disk too slow for its write-ahead log", disk_action, "etcd-disk"),
        Alert("KilonodeEtcdSlowWalFsync", f"{ETCD_WAL_FSYNC_P99} > {ETCD_WAL_FSYNC_P99_CRITICAL:g}", "10m",
              "critical",
              f"The {member} p99 WAL fsync is above {ETCD_WAL_FSYNC_P99_CRITICAL:g} s, etcd's default election "
              f"timeout", "etcd disk so slow the member loses leadership", disk_action, "etcd-disk"),
        Alert("KilonodeEtcdSlowBackendCommit",
              f"{ETCD_BACKEND_COMMIT_P99} > {ETCD_BACKEND_COMMIT_P99_WARNING:g}", "10m", "warning",
              f"The {member} p99 backend commit is above {_ms(ETCD_BACKEND_COMMIT_P99_WARNING)} (etcd FAQ: a "
              f"healthy disk stays below)", "etcd disk too slow for its database", disk_action, "etcd-disk"),
        Alert("KilonodeEtcdLeaderChanges",
              f"max by ({CLUSTER_ROLE_LABEL}) "
              f"(increase(etcd_server_leader_changes_seen_total{{{jobs}}}[15m])) >= {ETCD_LEADER_CHANGES_15M}",
              "5m", "warning",
              f"The {{{{ $labels.{CLUSTER_ROLE_LABEL} }}}} etcd cluster changed leader "
              f"{ETCD_LEADER_CHANGES_15M} or more times in 15m",
              "etcd elects leaders too often",
              "Frequent elections come from slow disks (see the fsync alerts), CPU starvation or a lossy network "
              "between members; every election stalls writes cluster-wide.", "etcd-leader"),
        Alert("KilonodeEtcdCompactionStalled", _compaction_stalled(), "5m", "warning",
              f"The {member} has not compacted in {_compaction_window()} while its revision grew",
              "etcd compaction has stopped: history piles up toward the quota",
              "The apiserver compacts every 5m (--etcd-compaction-interval) and etcd's periodic auto-compaction is "
              "the backstop; neither moved etcd_debugging_mvcc_compact_revision. Check the apiservers' logs "
              "(compactor errors, an apiserver that cannot reach this cluster) and the member's "
              "(`etcdctl endpoint status`); compact by hand to a recent revision (`etcdctl compact <rev>`), then "
              "defragment one member at a time. The etcd dashboard's revisions not compacted shows the backlog.",
              "etcd-compaction"),
        Alert("KilonodeEtcdNoLeader", f"max by ({BY_MEMBER}) (etcd_server_has_leader{{{jobs}}}) == 0", "1m",
              "critical", f"The {member} has no leader",
              "etcd member without a leader",
              "Without a leader the cluster takes no writes. Check how many members are up (a majority is "
              "needed: 2 of 3, 3 of 5), their logs, and the network between them on port 2380.", "etcd-leader"),
    ))


# --- kube-scheduler and kube-controller-manager ---------------------------------------------------
# The lease each one's candidates elect a leader with (the module docstring says where read).
SCHEDULER_LEASE = "kube-scheduler"
CONTROLLER_MANAGER_LEASE = "kube-controller-manager"


def _no_leader(job: str, lease: str) -> str:
    """Targets of `job` are configured, and none reports holding `lease`: all of them down, or up
    without a leader. Counting the job's `up` first keeps the alert quiet in a Prometheus that does
    not scrape the job at all (a user's own, loading the rule file alone)."""
    return (f'count(up{{job="{job}"}})\n'
            f'unless on () (max(leader_election_master_status{{job="{job}",name="{lease}"}}) == 1)')


def controllers_group() -> Group:
    # One leader at a time runs on one of the apiserver VMs; the others wait for its lease. A
    # leader that dies is replaced within the lease's 15 s (leader-elect-lease-duration's default),
    # so five minutes without one is no hand-over: nothing schedules or reconciles.
    check = (
        "On the apiserver VMs: `systemctl status {unit}` and `journalctl -u {unit}` (a unit that "
        "restarts in a loop, a certificate or kubeconfig it cannot read, an apiserver it cannot reach on "
        "127.0.0.1:6443), and `kubectl -n kube-system get lease {lease}` (its holder and renewTime). If "
        "the processes run but Prometheus cannot reach them, KilonodeScrapeTargetDown says which.")
    return Group("kilonode-controllers", (
        Alert("KilonodeSchedulerNoLeader", _no_leader(JOB_SCHEDULER, SCHEDULER_LEASE), "5m", "critical",
              f"No kube-scheduler scraped by {JOB_SCHEDULER} holds the {SCHEDULER_LEASE} lease for 5m",
              "No kube-scheduler is leading: new pods stay Pending",
              check.format(unit="kube-scheduler", lease=SCHEDULER_LEASE), "scheduler-and-controller-manager"),
        Alert("KilonodeControllerManagerNoLeader", _no_leader(JOB_CONTROLLER_MANAGER, CONTROLLER_MANAGER_LEASE),
              "5m", "critical",
              f"No kube-controller-manager scraped by {JOB_CONTROLLER_MANAGER} holds the "
              f"{CONTROLLER_MANAGER_LEASE} lease for 5m",
              "No kube-controller-manager is leading: no controller reconciles",
              "Deployments, Jobs and DaemonSets make no pods, dead nodes are not marked, garbage is not "
              "collected and no kubelet certificate is signed. "
              + check.format(unit="kube-controller-manager", lease=CONTROLLER_MANAGER_LEASE),
              "scheduler-and-controller-manager"),
    ))


# --- scrape targets ------------------------------------------------------------------------------
def targets_group() -> Group:
    # Per-node jobs are left out: one node down is one NotReady node, not a monitoring failure.
    jobs = (f"{JOB_APISERVER}|{JOB_SCHEDULER}|{JOB_CONTROLLER_MANAGER}|{ETCD_JOBS}|{JOB_CERTIFICATES}|"
            f"{JOB_KUBE_STATE_METRICS}|{JOB_COREDNS}")
    exporters = f"{JOB_NODE_EXPORTER}|{JOB_DCGM_EXPORTER}"
    return Group("kilonode-targets", (
        Alert("KilonodeScrapeTargetDown", f'up{{job=~"{jobs}"}} == 0', "10m", "warning",
              "Prometheus cannot scrape {{ $labels.job }} target {{ $labels.instance }}",
              "A kilonode scrape target is down",
              "Every rule above is blind while its target is down. Check the process on the target, and that "
              "Prometheus may reach it: the apiservers on 6443 from the VNet; the schedulers and controller "
              f"managers on {wellknown.SCHEDULER_PORT} and {wellknown.CONTROLLER_MANAGER_PORT}, the etcd members' "
              f"metrics URL (http, port {wellknown.ETCD_METRICS_PORT}) and each host's certificate metrics "
              f"({wellknown.CERT_METRICS_PORT}) from the Prometheus pool's subnet only (a Prometheus moved to "
              "another pool is refused); and the RBAC of Prometheus' ServiceAccount (get on /metrics).",
              "scrape-targets"),
        # The per-node exporters are every GPU, ECC, NVLink and InfiniBand rule's eyes: a DaemonSet that stops
        # answering leaves them quiet with nothing saying so (issue 40's independent trace). One node down is a
        # NotReady node; a share of the job's targets is the exporter, or a pool, failing.
        Alert("KilonodeNodeExportersDown",
              f'(count by (job) (up{{job=~"{exporters}"}} == 0) / count by (job) (up{{job=~"{exporters}"}}))'
              f" > {EXPORTERS_DOWN_SHARE:g}", "15m", "warning",
              f"More than {EXPORTERS_DOWN_SHARE:.0%} of the {{{{ $labels.job }}}} targets have not answered for 15m",
              "A per-node exporter is down on many nodes",
              "The GPU, ECC, NVLink, thermal and InfiniBand alerts read these series and go quiet on every node "
              "whose exporter does not answer. `kubectl -n kube-system get ds node-exporter dcgm-exporter` (desired vs "
              "ready: kilonode.k8s.exporters runs both in kube-system), the failing pods' logs and events; if the "
              "nodes themselves are down, the node alerts and `kubectl get nodes` say so.",
              "scrape-targets"),
        # One node's exporter down on a node that is Ready: under the share above, and no NotReady node says so,
        # yet every GPU, ECC, NVLink and InfiniBand rule is blind on that node (research-7500's on-call trace).
        # Both jobs label their targets `node` from node discovery (_node_labels), as kube-state-metrics labels
        # kube_node_status_condition (kubernetes/kube-state-metrics v2.18.0 internal/store/node.go: {node,
        # condition, status}); a NotReady node is the node alerts' matter, so it is left out here.
        Alert("KilonodeExporterDownOnReadyNode",
              f'max by (job, node, pool) (up{{job=~"{exporters}"}} == 0)\n'
              f'and on (node) max by (node) (kube_node_status_condition{{job="{JOB_KUBE_STATE_METRICS}",'
              f'condition="Ready",status="true"}} == 1)', "15m", "warning",
              "{{ $labels.job }} on node {{ $labels.node }} (pool {{ $labels.pool }}) has not answered for 15m "
              "while the node is Ready",
              "A per-node exporter is down on a Ready node",
              "The GPU, ECC, NVLink, thermal and InfiniBand alerts are blind on this node while the node itself "
              "looks healthy. `kubectl -n kube-system get pods -o wide --field-selector spec.nodeName=<node>` "
              "(node-exporter, dcgm-exporter: CrashLoopBackOff, Pending, not there), the pod's logs and events; "
              "dcgm-exporter waits for the device plugin (its init container) and needs the GPU driver up. If the "
              "pod runs, the node firewall must admit the port from the Prometheus pool.",
              "scrape-targets"),
    ))


EXPORTERS_DOWN_SHARE = 0.05


# --- certificates --------------------------------------------------------------------------------
CERT_EXPIRY = "kilonode:certificate_expiry:seconds"


def certificates_group() -> Group:
    where = "{{ $labels.path }} on {{ $labels.host }}"
    renew = (
        f"Renew that host: raise its certificateGenerations entry by one in the stack, `pulumi up`, wait for "
        f"it to be healthy, then the next host ({CERT_RUNBOOK}). A CA (ca.crt, the etcd CA bundle) is not "
        "renewed that way: its renewal is not automated (same runbook).")
    return Group("kilonode-certificates", (
        Record(CERT_EXPIRY, f'kilonode_certificate_not_after_seconds{{job="{JOB_CERTIFICATES}"}} - time()'),
        Alert("KilonodeCertificateExpiresSoon", f"{CERT_EXPIRY} < {CERT_EXPIRY_WARNING_DAYS} * 86400", "1h",
              "warning", f"The certificate in {where} expires in less than {CERT_EXPIRY_WARNING_DAYS} days",
              "A control-plane certificate expires within weeks", renew, "certificate-expiry"),
        Alert("KilonodeCertificateExpiresSoon", f"{CERT_EXPIRY} < {CERT_EXPIRY_CRITICAL_DAYS} * 86400", "10m",
              "critical", f"The certificate in {where} expires in less than {CERT_EXPIRY_CRITICAL_DAYS} days",
              "A control-plane certificate expires within days: past it, etcd members and apiservers refuse "
              "each other", renew, "certificate-expiry"),
        Alert("KilonodeCertificateUnreadable",
              f'max by (host, path) (kilonode_certificate_unreadable{{job="{JOB_CERTIFICATES}"}}) > 0', "30m",
              "warning", f"The certificate file {where} cannot be read or parsed",
              "A control-plane certificate cannot be read",
              "The file is missing or not a PEM certificate: the expiry alert is blind to it. Compare the host's "
              "files with its custom data (a VM not replaced since its files changed).", "certificate-expiry"),
    ))


# --- GPU pools -------------------------------------------------------------------------------------
GPU_POOL_NODES = "kilonode:gpu_pool_nodes:count"
GPU_POOL_UNHEALTHY = "kilonode:gpu_pool_nodes_unhealthy:count"


def _pool_regex(plan: ClusterPlan) -> str:
    names = sorted(pool.name for pool in plan.gpu_pools)
    for name in names:
        # Pool names are DNS labels (kilonode.config.model NAME_PATTERN): no regex metacharacter.
        if not re.fullmatch(r"[a-z0-9-]+", name):
            raise ValueError(f"pool name {name!r} would need escaping in a PromQL regex")
    return "|".join(names)


def gpu_group(plan: ClusterPlan) -> Group | None:
    if not plan.gpu_pools:
        return None
    # One series per GPU-pool node, {node, pool}; max dedupes a kube-state-metrics scraped twice.
    nodes = (f"max by (node, pool) (label_replace(kube_node_labels{{{KSM_POOL_LABEL}=~\"{_pool_regex(plan)}\"}}, "
             f"\"pool\", \"$1\", \"{KSM_POOL_LABEL}\", \"(.+)\"))")

    def with_taint(key: str) -> str:
        return f'{nodes} and on (node) kube_node_spec_taint{{key="{key}"}}'

    pool = "pool {{ $labels.pool }}"
    repair = (
        f"List them: kubectl get nodes -l {POOL_LABEL}={{{{ $labels.pool }}}} -o custom-columns=NAME:.metadata.name,"
        f"TAINTS:.spec.taints[*].key | grep {protocol.FAULT_TAINT}; the reason is the taint's value and the "
        f"{protocol.CONDITION} condition's message. Drain and repair or replace the VM; the taint lifts after a "
        "reboot whose checks pass.")
    return Group("kilonode-gpu", (
        Record(GPU_POOL_NODES, f"count by (pool) ({nodes})"),
        Record(GPU_POOL_UNHEALTHY, f"count by (pool) ({with_taint(protocol.FAULT_TAINT)})"),
        Alert("KilonodeGpuNodesUnhealthy", f"{GPU_POOL_UNHEALTHY} > 0", "15m", "warning",
              f"Nodes in {pool} carry the {protocol.FAULT_TAINT} taint (the GPU health checks failed)",
              "GPU nodes tainted unhealthy", repair, "gpu-unhealthy"),
        # the pool alert counts; this one names each node (one series per tainted node: kube_node_spec_taint
        # exists only for taints present, so it costs nothing on a healthy pool)
        Alert("KilonodeGpuNodeUnhealthy", f'max by (node, pool) ({with_taint(protocol.FAULT_TAINT)})', "15m",
              "warning",
              f"Node {{{{ $labels.node }}}} in {pool} carries the {protocol.FAULT_TAINT} taint (the GPU health checks "
              "failed)", "A GPU node is tainted unhealthy",
              f"The taint's value and the {protocol.CONDITION} condition's message say which check; the one-node "
              "dashboard shows the node's findings (kilonode_gpu_health_findings) beside its GPUs' readings. Drain "
              "and repair or replace the VM; the taint lifts after a reboot whose checks pass.", "gpu-unhealthy"),
        Alert("KilonodeGpuPoolDegraded",
              f"{GPU_POOL_UNHEALTHY} / {GPU_POOL_NODES} > {GPU_UNHEALTHY_CRITICAL_FRACTION:g}", "10m", "critical",
              f"More than {_percent(GPU_UNHEALTHY_CRITICAL_FRACTION)} of the nodes in {pool} carry the "
              f"{protocol.FAULT_TAINT} taint",
              "A GPU pool is losing nodes to a common cause",
              "Look for what they share: a driver or image rollout, a firmware update, one check failing "
              "everywhere (compare the taints' values). Stop rollouts and autoscaler scale-downs of the pool "
              "until the cause is known.", "gpu-unhealthy"),
        Alert("KilonodeGpuHealthPending",
              f"count by (pool) ({with_taint(protocol.STARTUP_TAINT)}) > 0", "1h", "warning",
              f"Nodes in {pool} still carry {protocol.STARTUP_TAINT}={protocol.STARTUP_VALUE} after an hour",
              "GPU nodes never passed their first health check",
              "The node's GPU health agent has not reported, or the taint controller on the apiserver VMs is not "
              "acting: check the agent's unit on the node and the controller's on the apiservers.", "gpu-pending"),
        Alert("KilonodeGpuHealthNotReported",
              f"count by (pool) ({nodes} unless on (node) "
              f'kube_node_status_condition{{condition="{protocol.CONDITION}"}}) > 0',
              "30m", "warning",
              f"Nodes in {pool} have no {protocol.CONDITION} condition",
              "GPU health agent not reporting",
              "The GPU health agent is not running on these nodes (or cannot patch its Node's status): check its "
              "unit and its log on the node.", "gpu-pending"),
        Alert("KilonodePoolLabelNotExported",
              f'absent(kube_node_labels{{{KSM_POOL_LABEL}!=""}}) and on () count(kube_node_info) > 0', "30m",
              "warning",
              f"kube-state-metrics exports nodes but no {POOL_LABEL} label: the GPU pool rules see nothing",
              "kube-state-metrics lacks the pool label",
              f"Run kube-state-metrics with --metric-labels-allowlist=nodes=[{POOL_LABEL}].", "gpu-unhealthy"),
    ))


# --- per-pod network accounting ----------------------------------------------------------------
# Every pool node counts each pod's forwarded bytes (kilonode.render.pod_traffic; field notes:
# per-namespace/pod network accounting). The per-namespace rate is what "who used the network"
# asks first; the per-pod series stay for the drill-down (docs/monitoring.md, "Who used the network").
POD_TRAFFIC_NAMESPACE_RATE = "namespace:kilonode_pod_network_bytes:rate5m"


def pod_traffic_group() -> Group:
    bytes_total = f'kilonode_pod_network_bytes_total{{job="{JOB_POD_TRAFFIC}"}}'
    return Group("kilonode-pod-traffic", (
        # bytes per second, by namespace and direction (in: to the namespace's pods, out: from them),
        # summed over every node
        Record(POD_TRAFFIC_NAMESPACE_RATE, f"sum by (namespace, direction) (rate({bytes_total}[5m]))"),
    ))


# --- the GPU health agent and taint controller ----------------------------------------------------
# Their own metrics (kilonode.gpu.metrics, served per scrape: kilonode.render.gpu_metrics): the
# agent's on every GPU node, the controller's on every apiserver VM. The Node taints and condition
# above say what they decided; these say whether they are still deciding.
JOB_GPU_HEALTH_AGENT = "kilonode-gpu-health-agent"
JOB_GPU_HEALTH_CONTROLLER = "kilonode-gpu-health-controller"
GPU_AGENT = "kilonode_gpu_health"
GPU_CONTROLLER = "kilonode_gpu_health_controller"
# Passive checks missed before the agent is stale: it checks every passive interval, and an idle
# re-check between two of them adds its wait for the controller's taint and the active check's
# minutes (thresholds.toml [agent]: 300 s, 120 s, ~2 min for 8 GPUs), so two intervals can pass
# in health; three cannot.
GPU_AGENT_STALE_INTERVALS = 3
# Heartbeats without a condition written to the API: the agent writes at a change and otherwise
# once per heartbeat, at its next check after the heartbeat falls due; two heartbeats without a
# write is an agent that cannot reach the API or is refused by it.
GPU_AGENT_REPORT_HEARTBEATS = 2
# Watch lengths without a sync before a controller is stale: the apiserver ends each watch after
# WATCH_TIMEOUT_S (300 s) and the controller lists every RESYNC_S (600 s), each a sync; twice the
# watch's length without one is a controller stuck or failing.
GPU_CONTROLLER_STALE_S = 2 * gpu_controller.WATCH_TIMEOUT_S


@dataclass(frozen=True)
class AgentIntervals:
    passive_s: int
    heartbeat_s: int


def gpu_agent_intervals(plan: ClusterPlan) -> AgentIntervals:
    """The agent's passive interval and heartbeat as its config on each GPU pool sets them (the
    rendered gpu-health.json), else as it defaults them (thresholds.toml [agent]): the longest."""
    defaults_ = gpu_thresholds()["agent"]
    configs = [gpu_health_config(pool) for pool in plan.gpu_pools]
    return AgentIntervals(
        passive_s=max(int(c.get("passiveIntervalSeconds", defaults_["passive_interval_s"])) for c in configs),
        heartbeat_s=max(int(c.get("heartbeatSeconds", defaults_["heartbeat_s"])) for c in configs),
    )


def _gpu_agent_alerts(plan: ClusterPlan) -> tuple[Alert, ...]:
    intervals = gpu_agent_intervals(plan)
    stale = GPU_AGENT_STALE_INTERVALS * intervals.passive_s
    report = GPU_AGENT_REPORT_HEARTBEATS * intervals.heartbeat_s
    job = f'job="{JOB_GPU_HEALTH_AGENT}"'
    passive = f'{GPU_AGENT}_last_check_timestamp_seconds{{{job},check="passive"}}'
    first_start = f"max by (node, pool) ({GPU_AGENT}_first_start_timestamp_seconds{{{job}}})"
    last_report = f"{GPU_AGENT}_last_report_timestamp_seconds{{{job}}}"
    where = "The GPU health agent on {{ $labels.node }} (pool {{ $labels.pool }})"
    return (
        Alert("KilonodeGpuHealthAgentStale",
              f"time() - max by (node, pool) ({passive}) > {stale}\n"
              f"or max by (node, pool) ({GPU_AGENT}_state_readable{{{job}}}) == 0\n"
              f"or (time() - {first_start} > {stale} unless on (node, pool) {passive})\n"
              f"or (max by (node, pool) (up{{{job}}}) == 0\n"
              f'    and on (node) max by (node) (kube_node_status_condition{{condition="Ready",status="true"}}) == 1)',
              "5m", "warning",
              f"{where} has not finished a passive check in {stale // 60} minutes ({GPU_AGENT_STALE_INTERVALS} "
              "of its intervals), or cannot say: its record unreadable, or its metrics endpoint down on a Ready node",
              "A GPU node's health agent has stopped checking",
              "Until it checks again, a GPU fault on the node goes unseen and the node keeps taking work. On the "
              "node: systemctl status kilonode-gpu-health (and kilonode-gpu-health-metrics.socket), journalctl -u "
              "kilonode-gpu-health; a hung nvidia-smi points to the driver (drain the node).", "gpu-health-agent"),
        Alert("KilonodeGpuHealthAgentCannotReport",
              f"time() - max by (node, pool) ({last_report}) > {report}\n"
              f"or (time() - {first_start} > {report} unless on (node, pool) {last_report})",
              "10m", "warning",
              f"{where} has not written its {protocol.CONDITION} condition in {report // 3600} hours "
              f"({GPU_AGENT_REPORT_HEARTBEATS} heartbeats)",
              "A GPU node's health agent cannot report",
              "It checks but cannot tell the API: a fault it finds taints nothing. Look at its log for the API's "
              "answer (kilonode_gpu_health_errors_total counts the failures): the kubelet's credentials, "
              "NodeRestriction, the apiservers' reachability from the node.", "gpu-health-agent"),
    )


def _gpu_controller_alerts() -> tuple[Alert, ...]:
    job = f'job="{JOB_GPU_HEALTH_CONTROLLER}"'
    sync = f"{GPU_CONTROLLER}_last_sync_timestamp_seconds{{{job}}}"
    minutes = GPU_CONTROLLER_STALE_S // 60
    return (
        Alert("KilonodeGpuHealthControllerStale",
              f"time() - max by (host) ({sync}) > {GPU_CONTROLLER_STALE_S}\n"
              f"or max by (host) ({GPU_CONTROLLER}_state_readable{{{job}}}) == 0\n"
              f"or (time() - max by (host) ({GPU_CONTROLLER}_start_timestamp_seconds{{{job}}}) > "
              f"{GPU_CONTROLLER_STALE_S} unless on (host) {sync})\n"
              f"or max by (host) (up{{{job}}}) == 0",
              "10m", "warning",
              f"The GPU health taint controller on {{{{ $labels.host }}}} has not had a current view of the Nodes "
              f"in {minutes} minutes, or cannot say (its record unreadable, its metrics endpoint down)",
              "A GPU health taint controller has stopped syncing",
              "The other apiservers' controllers still act; this one is stuck, failing or stopped. On the host: "
              "systemctl status kilonode-gpu-health-controller, journalctl -u kilonode-gpu-health-controller "
              "(its credentials, the local apiserver).", "gpu-health-controller"),
        Alert("KilonodeGpuHealthControllerNotSyncing",
              f"time() - max({sync}) > {GPU_CONTROLLER_STALE_S}\nor absent({sync})", "5m", "critical",
              f"No apiserver's GPU health taint controller has had a current view of the Nodes in {minutes} minutes",
              "No GPU health taint controller is working",
              "Nothing turns GPU health into taints: new GPU nodes keep their startup taint (no capacity comes up) "
              "and a GPU that fails keeps taking work. Check the controller on every apiserver VM (systemctl status "
              "kilonode-gpu-health-controller), its kubeconfig's certificate (KilonodeCertificateExpiresSoon), and "
              "that Prometheus reaches their metrics port.", "gpu-health-controller"),
    )


def gpu_health_groups(plan: ClusterPlan) -> list[Group]:
    """The agent's and controller's alerts, where GPU pools run them."""
    if not plan.gpu_pools:
        return []
    return [Group("kilonode-gpu-health", (*_gpu_agent_alerts(plan), *_gpu_controller_alerts()))]


# --- cluster-autoscaler --------------------------------------------------------------------------
# docs/operations.md and docs/azure.md pause the autoscaler for each `pulumi up` that changes an autoscaled pool
# (`kubectl scale ... --replicas=0`, 2 after). A pause left in place is silent: pending GPU pods wait for nodes
# that never come and idle nodes are never removed. A run takes well under an hour; 2 h is a pause forgotten.
AUTOSCALER_PAUSE_FOR = "2h"


def autoscaler_group(plan: ClusterPlan) -> Group | None:
    if not plan.autoscaled_pools:
        return None
    pools = ", ".join(p.name for p in plan.autoscaled_pools)
    return Group("kilonode-autoscaler", (
        Alert("KilonodeAutoscalerNotRunning", f'absent(up{{job="{JOB_AUTOSCALER}"}} == 1)', AUTOSCALER_PAUSE_FOR,
              "warning",
              f"No cluster-autoscaler replica scraped by {JOB_AUTOSCALER} answers for {AUTOSCALER_PAUSE_FOR}",
              "cluster-autoscaler is not running: autoscaled pools neither grow nor shrink",
              f"The pools it scales ({pools}) keep their size: pods waiting for nodes stay Pending and idle nodes "
              "are not removed. Most often the pause for a `pulumi up` was not undone: `kubectl -n kube-system get "
              "deployment cluster-autoscaler` shows 0 replicas; give them back with `kubectl -n kube-system scale "
              "deployment cluster-autoscaler --replicas=2` once no `pulumi up` runs. Otherwise its pods fail "
              "(`kubectl -n kube-system get pods -l k8s-app=cluster-autoscaler`, their logs).",
              "cluster-autoscaler"),
    ))


# --- exporters: GPUs (dcgm-exporter) and nodes (node-exporter) ------------------------------------
# The series kilonode.k8s.exporters makes, named as the exporters emit them: dcgm-exporter emits each
# counters-CSV field under its own name (NVIDIA/dcgm-exporter etc/default-counters.csv at
# 4.5.3-4.8.2; kilonode.plan.defaults DCGM_FIELDS), one per GPU with labels gpu and UUID (and pod,
# namespace, container while a pod holds the GPU, so every rule aggregates them away);
# node-exporter's InfiniBand collector node_infiniband_<name>{device, port} (prometheus/node_exporter
# collector/infiniband_linux.go at v1.12.1 l.187-219).
JOB_DCGM_EXPORTER = "kilonode-dcgm-exporter"
JOB_NODE_EXPORTER = "kilonode-node-exporter"
BY_GPU = "node, pool, gpu, UUID"
BY_IB_PORT = "node, pool, device, port"
# The InfiniBand port state as the kernel reports it (/sys/class/infiniband/<hca>/ports/<n>/state,
# "4: ACTIVE"; procfs sysfs/class_infiniband.go parses the number into StateID): 4 is ACTIVE, the
# only state that carries traffic (IBA 1.3 PortInfo PortState: 1 DOWN, 2 INIT, 3 ARMED, 4 ACTIVE).
IB_PORT_ACTIVE = 4
# Thermal slowdown: the share of time the GPU was slowed for heat (DCGM_FI_DEV_THERMAL_VIOLATION
# counts nanoseconds) above which a node is not delivering its GPUs. The GPU health agent treats any
# HW or SW thermal slowdown at a check as a fault (thresholds.toml [clock_event_reasons] fault); this
# alert sees the time between its checks. 10% over 10 minutes: an estimate, not a vendor figure.
GPU_THERMAL_FRACTION = 0.10
# Power throttling: the share of time the GPU was slowed to stay within its power limit
# (DCGM_FI_DEV_POWER_VIOLATION, ns). A GPU running at its limit under a dense kernel is briefly capped in normal
# work, so the line is higher than the thermal one: 25% over 10 minutes, for 15 minutes (an estimate, not a vendor
# figure; the one-node dashboard shows the clocks it costs).
GPU_POWER_FRACTION = 0.25
# procfs v0.21.1 sysfs/class_infiniband.go parseRate: node_infiniband_rate_bytes_per_second is the port's Gb/s
# times 125,000,000.
IB_BYTES_PER_GBPS = 125_000_000
NVLINK_ERROR_FIELDS = ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
                       "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL")


def _ranges(codes: list[int]) -> list[tuple[int, int]]:
    """Sorted codes as (first, last) runs of consecutive numbers."""
    runs: list[tuple[int, int]] = []
    for code in sorted(codes):
        if runs and code == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], code)
        else:
            runs.append((code, code))
    return runs


def application_xids() -> list[int]:
    """The Xids NVIDIA's catalogue (kilonode.node.gpu xid_catalog.toml) says leave the node in
    service: the application's own fault, nothing to do, Xid 45's workflow (rules.NOT_TAINTING). The
    GPU health agent takes a node out for every other Xid; so does the alert."""
    return sorted(code for code, row in xid_catalog().items() if row.get("immediate") in NOT_TAINTING)


# Each GPU's last Xid, its pod labels aggregated away: short enough to name ~25 times in the alert
# (the review parses rules of up to 2,048 characters, kilonode.review.alerting).
GPU_XID_LAST = "kilonode:gpu_xid_errors:last"


def _xid_expr() -> str:
    last = GPU_XID_LAST
    app = " or ".join(f"{last} == {a}" if a == b else f"({last} >= {a} and {last} <= {b})"
                      for a, b in _ranges(application_xids()))
    return f"({last} > 0) unless ({app})"


def exporter_group(plan: ClusterPlan) -> Group | None:
    """The GPU and InfiniBand alerts the field notes' GPU lessons need; dcgm-exporter's on GPU pools
    only, InfiniBand's on InfiniBand pools only."""
    gpu = "GPU {{ $labels.gpu }} ({{ $labels.UUID }}) of node {{ $labels.node }}"
    alerts: list[Alert | Record] = []
    if plan.gpu_pools:
        dcgm = f'job="{JOB_DCGM_EXPORTER}"'
        # one selector for the four counters: a GPU that exports only some of them still counts
        nvlink = f'increase({{__name__=~"{"|".join(NVLINK_ERROR_FIELDS)}", {dcgm}}}[15m])'
        alerts += [
            Record(GPU_XID_LAST, f'max by ({BY_GPU}) (DCGM_FI_DEV_XID_ERRORS{{{dcgm}}})'),
            Alert("KilonodeGpuXidError", _xid_expr(), "1m", "warning",
                  f"The last Xid of {gpu} is one NVIDIA's catalogue says needs a GPU reset, a reboot or support",
                  "A GPU reported a node-level Xid",
                  "The GPU health agent takes the node out at its next check (the taint's value names the Xid). "
                  "Read the Xid: kubectl debug node/<node> or the node's journal (NVRM: Xid); drain the node and "
                  "follow the catalogue's action. Application Xids (13, 31, 43, 45, ...) are the job's: no alert.",
                  "gpu-xid"),
            Alert("KilonodeGpuUncorrectableEcc",
                  f"max by ({BY_GPU}) (DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{{{dcgm}}} > 0 "
                  f"or DCGM_FI_DEV_ROW_REMAP_FAILURE{{{dcgm}}} > 0)", "1m", "warning",
                  f"{gpu} has had uncorrectable ECC errors since its driver loaded, or failed to remap a row",
                  "A GPU has uncorrectable memory errors",
                  "Drain the node; a reboot resets the volatile count and applies pending row remaps. A GPU whose "
                  "row remapping failed goes back to the vendor.", "gpu-ecc"),
            Alert("KilonodeGpuNvlinkErrors", f"sum by ({BY_GPU}) ({nvlink}) > 0", "15m", "warning",
                  f"The NVLink error counters (CRC, replay, recovery) of {gpu} keep rising",
                  "NVLink errors keep rising",
                  "Collective operations on the node slow down or fail. Check the links (nvidia-smi nvlink -e), "
                  "drain the node and reset the GPU or reboot; errors that return after a reboot are hardware.",
                  "nvlink-errors"),
            Alert("KilonodeGpuThermalThrottling",
                  f"max by ({BY_GPU}) (rate(DCGM_FI_DEV_THERMAL_VIOLATION{{{dcgm}}}[10m])) / 1e9 "
                  f"> {GPU_THERMAL_FRACTION:g}", "15m", "warning",
                  f"{gpu} was slowed for heat more than {_percent(GPU_THERMAL_FRACTION)} of the time",
                  "A GPU is thermally throttled",
                  "Compare DCGM_FI_DEV_GPU_TEMP with the node's other GPUs: one hot GPU is its cooling or seating, a "
                  "hot node its airflow (an Azure host issue: redeploy the VM).", "gpu-thermal"),
        ]
        alerts.append(Alert(
            "KilonodeGpuPowerThrottling",
            f"max by ({BY_GPU}) (rate(DCGM_FI_DEV_POWER_VIOLATION{{{dcgm}}}[10m])) / 1e9 > {GPU_POWER_FRACTION:g}",
            "15m", "warning",
            f"{gpu} was slowed to stay within its power limit more than {_percent(GPU_POWER_FRACTION)} of the time",
            "A GPU is power throttled",
            "Compare its DCGM_FI_DEV_POWER_USAGE and DCGM_FI_DEV_SM_CLOCK with the node's other GPUs (the one-node "
            "dashboard): one GPU capped below the rest is its power limit (nvidia-smi -q -d POWER: an enforced limit "
            "under the default) or its board; a whole node the host's power delivery (redeploy the VM).",
            "gpu-power"))
    ib_pools = [p for p in plan.node_pools if p.infiniband and p.infiniband_links]
    if any(p.infiniband for p in plan.node_pools):
        ib = f'job="{JOB_NODE_EXPORTER}"'
        port = "InfiniBand port {{ $labels.device }}/{{ $labels.port }} of node {{ $labels.node }}"
        alerts += _infiniband_size_alerts(ib_pools, ib, port)
        alerts += [
            Alert("KilonodeInfinibandPortDown",
                  f"max by ({BY_IB_PORT}) (node_infiniband_state_id{{{ib}}}) != {IB_PORT_ACTIVE}", "5m", "warning",
                  f"{port} is not ACTIVE", "An InfiniBand port is down",
                  "Jobs that span nodes lose this rail (NCCL falls back or fails). ibstat on the node; a port "
                  "that stays down is a cable, switch or HCA fault: drain the node and redeploy the VM.",
                  "infiniband"),
            Alert("KilonodeInfinibandLinkFlapping",
                  f"sum by ({BY_IB_PORT}) (increase(node_infiniband_link_downed_total{{{ib}}}[30m])) > 0", "1m",
                  "warning",
                  f"{port} went down and came back in the last 30 minutes",
                  "An InfiniBand link flapped",
                  "Every flap can abort the multi-node jobs using it. One flap is noise; repeated ones on a port "
                  "are its cable or switch port: drain the node and report it for repair.", "infiniband"),
        ]
    return Group("kilonode-exporters", tuple(alerts)) if alerts else None


def _infiniband_size_alerts(pools: list[NodePoolPlan], ib: str, port: str) -> list[Alert]:
    """Each InfiniBand pool's ports against its VM size (the catalogue's infinibandLinks: count and Gb/s): a port
    trained below the size's rate, and a node exposing fewer ports than the size has (a node with node-exporter up
    and no port at all is the device-include filter matching none of its HCAs: issue 40's trace)."""
    if not pools:
        return []
    slow = "\nor ".join(
        f'max by ({BY_IB_PORT}) (node_infiniband_rate_bytes_per_second{{{ib},pool="{p.name}"}}) '
        f"< {p.infiniband_links.gbps * IB_BYTES_PER_GBPS}" for p in pools if p.infiniband_links)
    missing = "\nor ".join(
        f'count by (node, pool) (node_infiniband_state_id{{{ib},pool="{p.name}"}}) < {p.infiniband_links.count}\n'
        f'or (max by (node, pool) (up{{{ib},pool="{p.name}"}}) == 1 unless on (node) node_infiniband_state_id{{{ib}}})'
        for p in pools if p.infiniband_links)
    sizes = ", ".join(f"{p.name} {p.infiniband_links.count} x {p.infiniband_links.gbps} Gb/s"
                      for p in pools if p.infiniband_links)
    return [
        Alert("KilonodeInfinibandPortSlow", slow, "10m", "warning",
              f"{port} runs below its VM size's link rate (the plan's pools: {sizes})",
              "An InfiniBand port trained below its rate",
              "A port that trained at a lower speed or width (a bad cable, a dirty connector, a switch port) slows "
              "every collective that crosses it. ibstat on the node (Rate, and the width in ibstatus); a port that "
              "stays slow: drain the node and report it for repair.", "infiniband"),
        Alert("KilonodeInfinibandPortsMissing", missing, "15m", "warning",
              "Node {{ $labels.node }} of pool {{ $labels.pool }} exposes fewer InfiniBand ports than its VM size "
              f"has (the plan's pools: {sizes})",
              "A node's InfiniBand ports are missing from its metrics",
              "Either an HCA is gone (ibstat lists fewer; the driver or the VM: redeploy it), or node-exporter's "
              "--collector.infiniband.device-include matches none or only some of the node's HCA names "
              "(ls /sys/class/infiniband on the node; kilonode.plan.defaults.exporters NODE_EXPORTER_FLAGS): then "
              "every InfiniBand alert is blind on it.", "infiniband"),
    ]


def exporter_scrape_jobs(plan: ClusterPlan, node_interval: str) -> list[Job]:
    """node-exporter on every node, dcgm-exporter on the GPU pools' nodes (kilonode.k8s.exporters):
    host-network pods, found by node discovery at the node's InternalIP, kept to what the rules read."""
    def at(port: int) -> dict[str, Any]:
        return {"source_labels": ["__meta_kubernetes_node_address_InternalIP"], "regex": "(.+)",
                "target_label": "__address__", "replacement": f"$1:{port}"}

    jobs = [Job(
        ("node-exporter on every node (host network, port "
         f"{wellknown.NODE_EXPORTER_PORT}, plain http), only the collectors kilonode reads (no per-CPU `cpu`:",
         "768 series on a 96-vCPU node). Kept: the series the rules and capacity views read",
         f"(defaults.NODE_EXPORTER_KEPT); every {node_interval} like the other per-node jobs."),
        {
            "job_name": JOB_NODE_EXPORTER,
            "scrape_interval": node_interval,
            "scheme": "http",
            "kubernetes_sd_configs": [{"role": "node"}],
            "relabel_configs": [at(wellknown.NODE_EXPORTER_PORT), *_node_labels()],
            "metric_relabel_configs": [
                {"source_labels": ["__name__"], "regex": "|".join(name for name, _ in defaults.NODE_EXPORTER_KEPT),
                 "action": "keep"}],
        },
    )]
    if plan.gpu_pools:
        jobs.append(Job(
            (f"dcgm-exporter on the GPU pools' nodes (host network, port {wellknown.DCGM_EXPORTER_PORT}, plain http):",
             f"{len(defaults.DCGM_FIELDS)} fields per GPU (its counters CSV, defaults.DCGM_FIELDS), collected as often",
             "as scraped. Hostname dropped: the job's node label says it."),
            {
                "job_name": JOB_DCGM_EXPORTER,
                "scrape_interval": node_interval,
                "scheme": "http",
                "kubernetes_sd_configs": [{"role": "node"}],
                "relabel_configs": [
                    _keep_gpu_pools(plan),
                    at(wellknown.DCGM_EXPORTER_PORT), *_node_labels()],
                "metric_relabel_configs": [
                    {"source_labels": ["__name__"], "regex": "|".join(f for f, _, _ in defaults.DCGM_FIELDS),
                     "action": "keep"},
                    {"regex": "Hostname", "action": "labeldrop"}],
            },
        ))
    return jobs


# --- cluster DNS (CoreDNS), connection tracking, Prometheus itself ---------------------------------
# The on-call question "a team's jobs cannot reach the internet": the names they resolve (CoreDNS: its
# answers, its upstream), and the node's connection-tracking table, where a full table drops new
# connections while every pod still looks healthy.
JOB_COREDNS = "kilonode-coredns"
JOB_PROMETHEUS = "kilonode-prometheus"
# kilonode.k8s.dns: the kube-dns Service's port `metrics` (9153, the Corefile's `prometheus :9153`) and its
# label; named here, not imported (layers).
COREDNS_NAMESPACE = "kube-system"
COREDNS_SERVICE_APP = "kube-dns"
COREDNS_METRICS_PORT_NAME = "metrics"
DNS_RESPONSES_RATE = "kilonode:coredns_responses:rate5m"
DNS_REQUEST_P99 = "kilonode:coredns_request_duration_seconds:p99"
# SERVFAIL: CoreDNS could not answer (its upstream failed or timed out, a plugin erred). A pod's resolver
# retries and then fails the lookup: at 1% a job's many lookups fail somewhere every minute, at 5% widely.
DNS_SERVFAIL_WARNING = 0.01
DNS_SERVFAIL_CRITICAL = 0.05
# ... and at least this many SERVFAILs a second before a ratio means anything (as the apiserver's).
DNS_MIN_ERROR_RATE = 0.1
# p99 of CoreDNS's answers over every replica: a cluster name is answered from memory in well under a
# millisecond and an external one from the cache or the node's resolver in milliseconds; one in a hundred
# above 1 s is an upstream (or a replica) in trouble, well before glibc's 5 s resolver timeout fails lookups.
DNS_P99_WARNING = 1.0
# Connection tracking: the share of nf_conntrack_max in use above which the table is near full (the kernel
# then drops new connections and logs "nf_conntrack: table full, dropping packet"); kube-proxy sizes the table
# per CPU (its conntrack.maxPerCore); a node at 85% has little headroom left for a burst of new connections.
CONNTRACK_FULL_WARNING = 0.85
# Prometheus's head against the plan's series (PrometheusPlan.series): the memory request is the head at that
# figure plus 25% (defaults.PROMETHEUS_MEMORY_MARGIN_PERCENT) plus the queries; above the plan the margin is
# being eaten, at 120% the pod is near its limit and the OOM killer.
PROMETHEUS_HEAD_WARNING = 1.0
PROMETHEUS_HEAD_CRITICAL = 1.2


def coredns_scrape_job(control_interval: str) -> Job:
    """CoreDNS's replicas through the kube-dns Service's EndpointSlices (port `metrics`), kept to
    defaults.COREDNS_KEPT."""
    return Job(
        ("CoreDNS (kilonode.k8s.dns): every replica, found through the kube-dns Service's EndpointSlices in",
         f"kube-system, port `{COREDNS_METRICS_PORT_NAME}` (9153, the Corefile's `prometheus :9153`; its",
         "NetworkPolicy admits it from Prometheus's pods alone). One replica per 250 nodes (31 at 7,500), so",
         f"every {control_interval} like the control plane; kept: answers by rcode, request and upstream latency,",
         "upstream health and rejects (defaults.COREDNS_KEPT, ~180 series a replica): not the Go runtime, the",
         "per-qtype request counts nor the request and response size histograms."),
        {
            "job_name": JOB_COREDNS,
            "scrape_interval": control_interval,
            "kubernetes_sd_configs": [{"role": "endpointslice", "namespaces": {"names": [COREDNS_NAMESPACE]}}],
            "relabel_configs": [
                {"source_labels": ["__meta_kubernetes_service_label_k8s_app"], "regex": COREDNS_SERVICE_APP,
                 "action": "keep"},
                {"source_labels": ["__meta_kubernetes_endpointslice_port_name"], "regex": COREDNS_METRICS_PORT_NAME,
                 "action": "keep"},
                {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
                {"source_labels": ["__meta_kubernetes_pod_node_name"], "target_label": "node"},
            ],
            "metric_relabel_configs": [
                {"source_labels": ["__name__"], "regex": "|".join(name for name, _ in defaults.COREDNS_KEPT),
                 "action": "keep"}],
        },
    )


def prometheus_self_job(control_interval: str) -> Job:
    """Prometheus's own /metrics on localhost, kept to defaults.PROMETHEUS_SELF_KEPT."""
    return Job(
        ("Prometheus itself, on localhost:9090 (its --web.listen-address default; inside the pod, no NetworkPolicy",
         "applies): its head series against the plan's, WAL, compaction and config-reload failures, rule",
         "evaluation failures and the notification queue (defaults.PROMETHEUS_SELF_KEPT, ~90 series)."),
        {
            "job_name": JOB_PROMETHEUS,
            "scrape_interval": control_interval,
            "scheme": "http",
            "static_configs": [{"targets": ["localhost:9090"]}],
            "metric_relabel_configs": [
                {"source_labels": ["__name__"],
                 "regex": "|".join(name for name, _ in defaults.PROMETHEUS_SELF_KEPT), "action": "keep"}],
        },
    )


def _dns_ratio(threshold: float) -> str:
    servfail = f'sum({DNS_RESPONSES_RATE}{{rcode="SERVFAIL"}})'
    return (f"{servfail} / sum({DNS_RESPONSES_RATE}) > {threshold:g}\n"
            f"and {servfail} > {DNS_MIN_ERROR_RATE:g}")


def dns_group() -> Group:
    job = f'job="{JOB_COREDNS}"'
    errors_action = (
        "Pods' lookups fail (SERVFAIL). Which names: the replicas' logs (the Corefile's `errors`); if external "
        "names, the upstream (KilonodeDnsUpstreamFailing, the node's resolver: Azure DNS limits each VM's "
        "queries, ~200 a second in the 2,500-node post, kilonode.plan.defaults.dns); if cluster names, the "
        "apiserver watch (CoreDNS's `kubernetes` plugin). "
        "kubectl -n kube-system logs -l k8s-app=kube-dns.")
    upstream = ("CoreDNS's forward plugin is failing against the node's resolver (/etc/resolv.conf: Azure DNS, "
                "168.63.129.16): external names fail for every pod on those replicas. Check the VMs' reachability of "
                "Azure DNS, its per-VM query limit (the 2,500-node post: packed replicas exceeded it), and the "
                "replicas' nodes' conntrack (KilonodeConntrackTableNearFull).")
    return Group("kilonode-dns", (
        Record(DNS_RESPONSES_RATE, f"sum by (rcode) (rate(coredns_dns_responses_total{{{job}}}[5m]))"),
        Record(DNS_REQUEST_P99, f"histogram_quantile(0.99, sum by (le) "
                                f"(rate(coredns_dns_request_duration_seconds_bucket{{{job}}}[5m])))"),
        Alert("KilonodeDnsErrors", _dns_ratio(DNS_SERVFAIL_WARNING), "10m", "warning",
              f"More than {_percent(DNS_SERVFAIL_WARNING)} of CoreDNS's answers are SERVFAIL for 10m",
              "Cluster DNS is failing lookups (SERVFAIL)", errors_action, "dns"),
        Alert("KilonodeDnsErrors", _dns_ratio(DNS_SERVFAIL_CRITICAL), "5m", "critical",
              f"More than {_percent(DNS_SERVFAIL_CRITICAL)} of CoreDNS's answers are SERVFAIL for 5m",
              "Cluster DNS is failing a large share of lookups (SERVFAIL)", errors_action, "dns"),
        Alert("KilonodeDnsSlow", f"{DNS_REQUEST_P99} > {DNS_P99_WARNING:g}", "10m", "warning",
              f"CoreDNS's p99 answer time is above {DNS_P99_WARNING:g} s for 10m",
              "Cluster DNS is slow", "Compare the upstream's latency (coredns_proxy_request_duration_seconds, the DNS "
              "dashboard) with the replicas' CPU: a slow upstream slows every external name; saturated replicas "
              "slow every name (their autoscaler's nodes per replica).", "dns"),
        Alert("KilonodeDnsUpstreamFailing",
              f'sum by (to) (rate(coredns_proxy_healthcheck_failures_total{{{job},proxy_name="forward"}}[5m])) > 0',
              "10m", "warning", "CoreDNS's health checks of its upstream {{ $labels.to }} keep failing",
              "Cluster DNS's upstream is failing", upstream, "dns"),
        Alert("KilonodeDnsUpstreamFailing",
              f"sum(increase(coredns_forward_healthcheck_broken_total{{{job}}}[5m])) > 0", "2m", "critical",
              "Every upstream of a CoreDNS replica failed its health checks (the forward plugin's healthcheck_broken)",
              "Cluster DNS has no working upstream: external names fail", upstream, "dns"),
        Alert("KilonodeDnsForwardSaturated",
              f"sum(rate(coredns_forward_max_concurrent_rejects_total{{{job}}}[5m])) > 0", "5m", "warning",
              "CoreDNS refuses queries because a replica has max_concurrent (1000) queries in flight to its upstream",
              "Cluster DNS is refusing external lookups",
              "The upstream is slow or the replicas too few for the external lookups: check the upstream's latency; "
              "more replicas (the autoscaler's nodes per replica) spread the load over more VMs.", "dns"),
    ))


def conntrack_alerts() -> tuple[Alert, ...]:
    job = f'job="{JOB_NODE_EXPORTER}"'
    node = "node {{ $labels.node }} (pool {{ $labels.pool }})"
    action = ("New connections from and to the node's pods are dropped once the table is full: `conntrack -S` "
              "and `conntrack -L | awk '{print $3}' | sort | uniq -c` on the node (what fills it: a job opening "
              "connections in a loop, UDP floods, long timeouts); raise net.netfilter.nf_conntrack_max (kube-proxy's "
              "conntrack.maxPerCore) only once the cause is known.")
    return (
        Alert("KilonodeConntrackTableNearFull",
              f"max by (node, pool) (node_nf_conntrack_entries{{{job}}} / node_nf_conntrack_entries_limit{{{job}}})"
              f" > {CONNTRACK_FULL_WARNING:g}", "10m", "warning",
              f"The connection-tracking table of {node} is more than {_percent(CONNTRACK_FULL_WARNING)} full",
              "A node's connection-tracking table is nearly full", action, "conntrack"),
        Alert("KilonodeConntrackDropping",
              f"sum by (node, pool) (increase(node_nf_conntrack_stat_drop{{{job}}}[10m])"
              f" + increase(node_nf_conntrack_stat_early_drop{{{job}}}[10m])) > 0", "5m", "warning",
              f"The kernel of {node} dropped new connections for want of a connection-tracking slot",
              "A node is dropping connections (conntrack)", action, "conntrack"),
    )


# A filesystem with less than this share free: the kubelet's own eviction threshold for the node's filesystem is
# nodefs.available<10% (kubernetes/kubernetes pkg/kubelet/eviction/defaults_linux.go), so at 10% pods are about to
# be evicted from the root filesystem; on another mount (the resource disk, NVMe scratch) jobs fail writing.
FILESYSTEM_FREE_WARNING = 0.10
# The kubelet's pressure conditions (kubernetes/api core/v1 types.go NodeMemoryPressure, NodeDiskPressure,
# NodePIDPressure; set by pkg/kubelet/nodestatus setters.go), each a Node condition kube-state-metrics exports
PRESSURE_CONDITIONS = "DiskPressure|MemoryPressure|PIDPressure"


def node_basics_alerts() -> tuple[Alert, ...]:
    """A node's filesystem nearly full (node-exporter, read-write mounts only), and the kubelet's DiskPressure,
    MemoryPressure or PIDPressure condition (kube-state-metrics' kube_node_status_condition, every condition type)."""
    job = f'job="{JOB_NODE_EXPORTER}"'
    by = "node, pool, mountpoint"
    ksm = f'job="{JOB_KUBE_STATE_METRICS}"'
    return (
        Alert("KilonodeNodeFilesystemFull",
              f"min by ({by}) (node_filesystem_avail_bytes{{{job}}} / node_filesystem_size_bytes{{{job}}})"
              f" < {FILESYSTEM_FREE_WARNING:g}\nand on ({by}) max by ({by}) (node_filesystem_readonly{{{job}}}) == 0",
              "15m", "warning",
              f"The filesystem {{{{ $labels.mountpoint }}}} of node {{{{ $labels.node }}}} (pool "
              f"{{{{ $labels.pool }}}}) has less than {_percent(FILESYSTEM_FREE_WARNING)} free",
              "A node's filesystem is nearly full",
              "The kubelet evicts pods at 10% free on its filesystem (nodefs) and refuses new ones (DiskPressure); "
              "jobs writing checkpoints or logs to the mount fail. On the node: du -xh --max-depth=2 <mountpoint> "
              "(container logs, images: crictl rmi --prune, a job's scratch files).", "node-basics"),
        Alert("KilonodeNodePressure",
              f'max by (node, condition) (kube_node_status_condition{{{ksm},condition=~"{PRESSURE_CONDITIONS}"'
              f',status="true"}}) == 1', "10m", "warning",
              "Node {{ $labels.node }} reports {{ $labels.condition }}",
              "A node's kubelet reports resource pressure",
              "The kubelet is evicting pods and the node takes no new ones (its node.kubernetes.io/*-pressure taint). "
              "DiskPressure: KilonodeNodeFilesystemFull names the mount; MemoryPressure: the one-node dashboard's "
              "memory and pressure panels, then the largest containers (container_memory_working_set_bytes); "
              "PIDPressure: the node is near its process limit (on the node: ps -eLf | wc -l against "
              "/proc/sys/kernel/pid_max; a job forking without bound, a leak of threads).",
              "node-basics"),
    )


def prometheus_group(plan: ClusterPlan) -> Group | None:
    """Prometheus's own health, where kilonode runs it (its head against the plan's series)."""
    p = plan.prometheus
    if p is None:
        return None
    job = f'job="{JOB_PROMETHEUS}"'
    head = f"max(prometheus_tsdb_head_series{{{job}}})"
    head_action = (f"The plan sized the pod for {p.series:,} series (`kilonode explain`; {p.memory_gib} GiB, request = "
                   "limit). Find what grew: topk(20, count by (__name__) ({__name__=~\".+\"})) and count by (job) "
                   "(up); drop it in the job's metric_relabel_configs, or correct the plan's estimate "
                   "(kilonode.plan.defaults.monitoring) so the pod is sized for it.")
    failures = ("prometheus_tsdb_compactions_failed_total", "prometheus_tsdb_head_truncations_failed_total",
                "prometheus_tsdb_wal_corruptions_total", "prometheus_tsdb_wal_writes_failed_total",
                "prometheus_tsdb_wal_truncations_failed_total")
    # each sum `or vector(0)`: a counter not (yet) exported must not empty the whole sum, and one selector of
    # the five names would not do (increase drops the name: five series of one labelset)
    tsdb = "\n+ ".join(f"(sum(increase({m}{{{job}}}[30m])) or vector(0))" for m in failures)
    return Group("kilonode-prometheus", (
        Alert("KilonodePrometheusRuleFailures",
              f"sum by (rule_group) (increase(prometheus_rule_evaluation_failures_total{{{job}}}[10m])) > 0", "10m",
              "warning", "Rules of {{ $labels.rule_group }} fail to evaluate",
              "Prometheus rules are failing: their alerts cannot fire",
              "Prometheus's log names the rule and the error (a query over --query.max-samples, a timeout, "
              "many-to-many matching after a label change); every alert of that group is blind meanwhile.",
              "prometheus-itself"),
        Alert("KilonodePrometheusHeadSeriesOverPlan", f"{head} > {p.series} * {PROMETHEUS_HEAD_WARNING:g}", "30m",
              "warning", f"Prometheus holds more series than the plan's {p.series:,}",
              "Prometheus holds more series than it was sized for", head_action, "prometheus-itself"),
        Alert("KilonodePrometheusHeadSeriesOverPlan", f"{head} > {p.series} * {PROMETHEUS_HEAD_CRITICAL:g}", "10m",
              "critical",
              f"Prometheus holds more than {PROMETHEUS_HEAD_CRITICAL:g} x the plan's {p.series:,} series: its memory "
              "margin is spent", "Prometheus is near its memory limit", head_action, "prometheus-itself"),
        Alert("KilonodePrometheusConfigReloadFailed", f"max(prometheus_config_last_reload_successful{{{job}}}) == 0",
              "10m", "warning", "Prometheus's last configuration reload failed: it runs the previous one",
              "Prometheus rejected its configuration",
              "The rendered prometheus.yml or rule file was refused (Prometheus's log says why); until fixed, "
              "changes to jobs and rules do not apply. `promtool check config` on the ConfigMap's files.",
              "prometheus-itself"),
        Alert("KilonodePrometheusTsdbFailures", f"{tsdb} > 0", "5m", "warning",
              "Prometheus's storage reported a failed compaction, head truncation or WAL write, or a WAL corruption "
              "in the last 30 minutes", "Prometheus's storage is failing",
              "Check the data disk (its free space against --storage.tsdb.retention.size, the Azure disk's state) "
              "and Prometheus's log; a WAL that cannot be written loses samples, and a head that cannot be truncated "
              "grows until the pod runs out of memory.", "prometheus-itself"),
    ))


# --- the node data plane: kube-system's DaemonSets and CoreDNS -------------------------------------------
# The DaemonSets every node needs, by the names kilonode gives them in kube-system (kilonode.k8s.proxy, calico
# NODE, exporters, gpu DAEMONSET_NAME; named here, not imported: layers). A node without its kube-proxy or
# calico-node reaches no Service or no pod; without node-exporter, dcgm-exporter or the device plugin its GPUs are
# unwatched or unschedulable. Read from kube-state-metrics (kilonode.plan.defaults.exporters KSM_RESOURCES).
NODE_DATA_PLANE_NAMESPACE = "kube-system"
NODE_DATA_PLANE_DAEMONSETS = ("kube-proxy", "calico-node", "node-exporter", "dcgm-exporter",
                              "nvidia-device-plugin-daemonset")
COREDNS_DEPLOYMENT = "coredns"  # kilonode.k8s.dns DEPLOYMENT
# Critical above this share of a DaemonSet's nodes: more than a rollout takes down at once (kube-proxy's and the
# GPU DaemonSets' maxUnavailable, 10%: kilonode.plan.defaults KUBE_PROXY_MAX_UNAVAILABLE,
# DEVICE_PLUGIN_MAX_UNAVAILABLE), so a rollout in progress stays a warning.
DAEMONSET_UNAVAILABLE_CRITICAL = 0.15


def data_plane_group() -> Group:
    ksm = f'job="{JOB_KUBE_STATE_METRICS}",namespace="{NODE_DATA_PLANE_NAMESPACE}"'
    daemonsets = f'{ksm},daemonset=~"{"|".join(NODE_DATA_PLANE_DAEMONSETS)}"'
    # kube_daemonset_status_number_unavailable: nodes that should run the pod and have none available
    # (kubernetes/kube-state-metrics v2.18.0 internal/store/daemonset.go l.157, {namespace, daemonset});
    # max by: a kube-state-metrics scraped twice counts once
    unavailable = f"max by (daemonset) (kube_daemonset_status_number_unavailable{{{daemonsets}}})"
    desired = f"max by (daemonset) (kube_daemonset_status_desired_number_scheduled{{{daemonsets}}})"
    action = ("`kubectl -n kube-system get ds {{ $labels.daemonset }}` (desired, ready, available, up to date), then "
              "its pods not Running or not Ready: `kubectl -n kube-system get pods -o wide -l <its selector> | grep -v "
              "Running`, their events and logs (an image that cannot be pulled, a crash, a node without room). On the "
              "nodes concerned: kube-proxy missing leaves Services unreachable, calico-node missing the pod network, "
              "node-exporter or dcgm-exporter the GPU and node alerts blind, the device plugin no GPU to schedule. A "
              "rollout (10% of the nodes at a time) shows here while it lasts: `kubectl -n kube-system rollout status "
              "ds/{{ $labels.daemonset }}`.")
    return Group("kilonode-data-plane", (
        Alert("KilonodeDaemonSetPodsUnavailable", f"{unavailable} > 0", "15m", "warning",
              "DaemonSet kube-system/{{ $labels.daemonset }} has had nodes without an available pod for 15m",
              "A node agent is missing on some nodes", action, "node-data-plane"),
        Alert("KilonodeDaemonSetPodsUnavailable", f"{unavailable} / {desired} > {DAEMONSET_UNAVAILABLE_CRITICAL:g}",
              "15m", "critical",
              f"DaemonSet kube-system/{{{{ $labels.daemonset }}}} has had more than "
              f"{_percent(DAEMONSET_UNAVAILABLE_CRITICAL)} of its nodes without an available pod for 15m",
              "A node agent is missing on many nodes", action, "node-data-plane"),
        # kube_deployment_status_replicas_unavailable (deployment.go l.169, {namespace, deployment})
        Alert("KilonodeCoreDnsReplicasUnavailable",
              f'max by (deployment) (kube_deployment_status_replicas_unavailable{{{ksm},'
              f'deployment="{COREDNS_DEPLOYMENT}"}}) > 0', "15m", "warning",
              f"Deployment kube-system/{COREDNS_DEPLOYMENT} has had unavailable replicas for 15m",
              "CoreDNS is short of replicas",
              "The remaining replicas answer every pod's lookups (KilonodeDnsErrors, KilonodeDnsSlow and the DNS "
              "dashboard say whether they keep up). `kubectl -n kube-system get deploy coredns` and "
              "`get pods -l k8s-app=kube-dns -o wide`: "
              "Pending (no room on the system pool, its anti-affinity), CrashLoopBackOff (the Corefile, an upstream "
              "it cannot reach), their events.", "node-data-plane"),
    ))


def rule_groups(plan: ClusterPlan) -> list[Group]:
    groups = [apiserver_group(), controllers_group(), etcd_group(plan), certificates_group(), targets_group(),
              data_plane_group(), pod_traffic_group(), dns_group(),
              Group("kilonode-nodes", (*conntrack_alerts(), *node_basics_alerts()))]
    own = prometheus_group(plan)
    groups += [own] if own else []
    gpu = gpu_group(plan)
    autoscaler = autoscaler_group(plan)
    exporters = exporter_group(plan)
    return (groups + ([gpu] if gpu else []) + gpu_health_groups(plan) + ([exporters] if exporters else [])
            + ([autoscaler] if autoscaler else []) + alertmanager_groups(plan))


def _keep_gpu_pools(plan: ClusterPlan) -> dict[str, Any]:
    """The relabelling that keeps node discovery to the GPU pools' nodes (their kilonode.io/pool label)."""
    return {"source_labels": ["__meta_kubernetes_node_label_kilonode_io_pool"], "regex": _pool_regex(plan),
            "action": "keep"}


def alerts(plan: ClusterPlan) -> list[Alert]:
    return [rule for group in rule_groups(plan) for rule in group.rules if isinstance(rule, Alert)]


def alert_rules(plan: ClusterPlan) -> str:
    """The rule file (Prometheus `rule_files:` format, checked by `promtool check rules`)."""
    header = (f"# {GENERATED}\n"
              f"# Alert and recording rules for cluster {plan.cluster} (kilonode.render.monitoring); how to load\n"
              f"# them and what each alert asks of you: {RUNBOOK_DOC}.\n")
    return header + block_yaml({"groups": [group.data() for group in rule_groups(plan)]})


# --- scrape configuration -------------------------------------------------------------------
@dataclass(frozen=True)
class Job:
    comment: tuple[str, ...]  # why the job looks as it does: written above it in the file
    config: dict[str, Any]


def _in_cluster_auth() -> dict[str, Any]:
    return {
        "scheme": "https",
        "authorization": {"type": "Bearer", "credentials_file": SA_TOKEN},
        "tls_config": {"ca_file": SA_CA},
    }


def _drop(names: list[str]) -> dict[str, Any]:
    return {"source_labels": ["__name__"], "regex": "|".join(names), "action": "drop"}


# Whole series families the apiservers must not hand over at this size: the per-resource latency
# and size histograms (verb x group x version x resource x subresource x scope x component x 20+
# buckets, on every apiserver). Their _sum and _count stay. Kept: apiserver_request_sli_duration_
# seconds_bucket, the SLI for the API-call latency objective (mutating p99 <= 1 s), and
# apiserver_request_total, which the rules read. Names: kubernetes/apiserver v0.34.10
# pkg/endpoints/metrics/metrics.go l.96-137 and l.153-192, pkg/storage/etcd3/metrics/metrics.go l.43-53;
# request_slo_duration_seconds is deprecated since 1.27 and duplicates the SLI.
APISERVER_DROPPED = [
    "apiserver_request_duration_seconds_bucket",
    "apiserver_request_slo_duration_seconds_bucket",
    "apiserver_response_sizes_bucket",
    "apiserver_watch_events_sizes_bucket",
    "etcd_request_duration_seconds_bucket",
]
# On every node, multiplied by the node count: per-operation histograms of the kubelet's runtime,
# volume and API-client calls, and one series per feature gate (hundreds per node). Names:
# kubernetes/kubernetes pkg/kubelet/metrics/metrics.go (commit 0028b26b: runtime_operations_
# duration_seconds), component-base's rest_client_* and kubernetes_feature_enabled.
KUBELET_DROPPED = [
    "kubelet_runtime_operations_duration_seconds_bucket",
    "storage_operation_duration_seconds_bucket",
    "rest_client_request_duration_seconds_bucket",
    "rest_client_rate_limiter_duration_seconds_bucket",
    "rest_client_request_size_bytes_bucket",
    "rest_client_response_size_bytes_bucket",
    "kubernetes_feature_enabled",
]
# cAdvisor: kept to the few per-container series a scheduler or capacity view needs.
CADVISOR_KEPT = [
    "container_cpu_usage_seconds_total",
    "container_memory_working_set_bytes",
    "container_oom_events_total",
]
# The per-node jobs' interval and the control plane's come from the plan (PrometheusPlan:
# per_node_interval_s, sized so the nodes' samples per second stay in an ingest budget).
# kube-state-metrics answers for every object in the cluster in one response (a 7,500-node
# cluster: tens of thousands of pods): more than the default 10 s timeout.
KSM_INTERVAL = "60s"
KSM_TIMEOUT = "30s"


def _node_labels() -> list[dict[str, Any]]:
    """Per-node targets carry the node's name and pool."""
    return [
        {"source_labels": ["__meta_kubernetes_node_name"], "target_label": "node"},
        {"source_labels": ["__meta_kubernetes_node_label_kilonode_io_pool"], "target_label": "pool"},
    ]


def _seconds(value: int) -> str:
    return f"{value}s"


def scrape_jobs(plan: ClusterPlan) -> list[Job]:
    cp = plan.control_plane
    p = plan.prometheus
    # no Prometheus of kilonode's (no pool for it): the fragment alone, at the largest interval
    control_interval = _seconds(p.control_plane_interval_s if p else defaults.PROMETHEUS_CONTROL_PLANE_INTERVAL_S)
    node_interval = _seconds(p.per_node_interval_s if p else defaults.PROMETHEUS_PER_NODE_INTERVALS_S[-1])
    jobs = [Job(
        ("The apiservers, each at its own address (the load balancer would hide which one is in trouble).",
         "Dropped: per-resource latency/size histograms (APISERVER_DROPPED); the alert rules read",
         "apiserver_request_total only."),
        {
            "job_name": JOB_APISERVER,
            "scrape_interval": control_interval,
            **_in_cluster_auth(),
            "static_configs": [{"targets": [f"{i.ip}:{wellknown.APISERVER_PORT}" for i in cp.instances]}],
            "metric_relabel_configs": [_drop(APISERVER_DROPPED)],
        },
    )]
    jobs += [
        _controller_job(plan, JOB_SCHEDULER, "kube-scheduler", wellknown.SCHEDULER_PORT, control_interval),
        _controller_job(plan, JOB_CONTROLLER_MANAGER, "kube-controller-manager", wellknown.CONTROLLER_MANAGER_PORT,
                        control_interval),
    ]
    for cluster in plan.etcd_clusters:
        jobs.append(Job(
            (f"etcd {cluster.role}: each member's --listen-metrics-urls (plain http, no client certificate),",
             f"labelled {CLUSTER_ROLE_LABEL}={cluster.role} so the quota rules compare it with its own quota",
             f"({cluster.quota_backend_bytes} bytes). A handful of targets: nothing dropped."),
            {
                "job_name": etcd_job(cluster.role),
                "scrape_interval": control_interval,
                "scheme": "http",
                "static_configs": [
                    {"targets": [urlsplit(m.metrics_url).netloc],
                     "labels": {CLUSTER_ROLE_LABEL: cluster.role, "member": m.name}}
                    for m in cluster.members
                ],
            },
        ))
    hosts = [(m.name, m.ip) for c in plan.etcd_clusters for m in c.members] + [(i.name, i.ip) for i in cp.instances]
    jobs.append(Job(
        ("Each control-plane host's certificate expiry (kilonode.render.cert_metrics: a socket unit on its",
         f"address, port {wellknown.CERT_METRICS_PORT}, plain http: expiry dates only, no key, no data),",
         "labelled with the host's name. An answer reads a dozen files: cheap every minute, and well under",
         "Prometheus's 5m lookback, which the expiry alerts read as an instant vector (every 5m, a late",
         "scrape dropped them from the result and reset their `for:`)."),
        {
            "job_name": JOB_CERTIFICATES,
            "scrape_interval": "1m",
            "scheme": "http",
            "static_configs": [{"targets": [f"{ip}:{wellknown.CERT_METRICS_PORT}"], "labels": {"member": name}}
                               for name, ip in hosts],
        },
    ))
    node_sd = [{"role": "node"}]
    jobs += [
        Job(
            ("Every kubelet (:10250, its serving certificate signed by the cluster CA). Per node, so",
             f"{node_interval} and dropped: the runtime/volume/API-client histograms and the feature-gate",
             "series (KUBELET_DROPPED): at 7,500 nodes each costs millions of series. Needs RBAC: get nodes/metrics."),
            {
                "job_name": JOB_KUBELET,
                "scrape_interval": node_interval,
                **_in_cluster_auth(),
                "kubernetes_sd_configs": node_sd,
                "relabel_configs": _node_labels(),
                "metric_relabel_configs": [_drop(KUBELET_DROPPED)],
            },
        ),
        Job(
            ("cAdvisor through each kubelet: dozens of series per container, per node. Do NOT scrape it whole at",
             "this size; kept: CPU, working set and OOM events (CADVISOR_KEPT) per container on containerd pools",
             "and per pod on Docker (cri-dockerd) pools, whose containers the kubelet's cAdvisor cannot name;",
             "never the system slices nor the pause containers."),
            {
                "job_name": JOB_CADVISOR,
                "scrape_interval": node_interval,
                "metrics_path": "/metrics/cadvisor",
                **_in_cluster_auth(),
                "kubernetes_sd_configs": node_sd,
                "relabel_configs": _node_labels(),
                "metric_relabel_configs": [
                    {"source_labels": ["__name__"], "regex": "|".join(CADVISOR_KEPT), "action": "keep"},
                    *_cadvisor_cgroup_drops(plan),
                ],
            },
        ),
        Job(
            ("kube-state-metrics (kilonode.k8s.exporters runs it in kube-system: nodes, and kube-system's",
             "DaemonSets and Deployments; a Prometheus of your own",
             "finds the same), found through its Service's EndpointSlices (label app.kubernetes.io/name,",
             "port http-metrics, as its own manifests name them) in kube-system or monitoring, the namespaces",
             "Prometheus may watch (a Role in each, no cluster-wide pod watch). Run it with",
             f"--metric-labels-allowlist=nodes=[{POOL_LABEL}]: without it kube_node_labels has no pool label",
             "and the GPU pool rules see nothing (KilonodePoolLabelNotExported says so)."),
            {
                "job_name": JOB_KUBE_STATE_METRICS,
                "scrape_interval": KSM_INTERVAL,
                "scrape_timeout": KSM_TIMEOUT,
                "kubernetes_sd_configs": [{"role": "endpointslice", "namespaces": {
                    "names": list(defaults.PROMETHEUS_DISCOVERY_NAMESPACES)}}],
                "relabel_configs": [
                    {"source_labels": ["__meta_kubernetes_service_label_app_kubernetes_io_name"],
                     "regex": "kube-state-metrics", "action": "keep"},
                    {"source_labels": ["__meta_kubernetes_endpointslice_port_name"],
                     "regex": "http-metrics", "action": "keep"},
                ],
            },
        ),
    ]
    jobs.append(pod_traffic_scrape_job(node_interval))
    jobs.append(coredns_scrape_job(control_interval))
    if p is not None:
        jobs.append(prometheus_self_job(control_interval))
    jobs += gpu_health_scrape_jobs(plan, node_interval, control_interval)
    jobs += exporter_scrape_jobs(plan, node_interval)
    jobs += alertmanager_scrape_jobs(plan, control_interval)
    if plan.autoscaled_pools:
        jobs.append(Job(
            ("cluster-autoscaler: its pods in kube-system (label k8s-app, port `metrics`: --address, plain http).",
             "Found through pod discovery in that one namespace (a namespaced Role, not a cluster-wide watch);",
             "standby replicas answer too, the leader's autoscaler metrics are the ones that move."),
            {
                "job_name": JOB_AUTOSCALER,
                "scrape_interval": control_interval,
                "kubernetes_sd_configs": [{"role": "pod", "namespaces": {"names": [AUTOSCALER_NAMESPACE]}}],
                "relabel_configs": [
                    {"source_labels": ["__meta_kubernetes_pod_label_k8s_app"], "regex": AUTOSCALER_APP,
                     "action": "keep"},
                    {"source_labels": ["__meta_kubernetes_pod_container_port_name"], "regex": "metrics",
                     "action": "keep"},
                    {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
                ],
            },
        ))
    return jobs


def _cadvisor_cgroup_drops(plan: ClusterPlan) -> list[dict[str, Any]]:
    """Which cgroups' series the cAdvisor job drops, by the pool's runtime.

    The kubelet labels a cgroup's series from its cAdvisor container handler (kubernetes/kubernetes
    pkg/kubelet/server/server.go containerPrometheusLabelsFunc: pod, namespace and container from the
    handler's Spec.Labels) and names a pod-level cgroup's pod itself (GetPodByCgroupfs), container "".
    Since dockershim's removal (1.24) the kubelet registers cAdvisor's containerd, CRI-O and systemd
    handlers only (pkg/kubelet/cadvisor/cadvisor_linux.go; the Docker handler's cadvisor_linux_docker.go
    went with dockershim): under cri-dockerd a container's cgroup falls to the raw handler and its series
    carry no pod, namespace nor container (kubernetes/kubernetes#111077, open for 1.24+ with cri-dockerd;
    google/cadvisor#3572). Dropping every series of an empty container, as for containerd, would keep
    nothing of a Docker pool; there the pod-level cgroup is the finest named one, and is kept."""
    # Docker's pause container is named "POD"; a cgroup of no pod is a system slice (or, under cri-dockerd,
    # an unnamed container)
    drops: list[dict[str, Any]] = [{"source_labels": ["container"], "regex": "POD", "action": "drop"},
                                   {"source_labels": ["pod"], "regex": "", "action": "drop"}]
    labelled = sorted(p.name for p in plan.node_pools if p.runtime != "docker")
    if labelled:
        # where containers are named (containerd), a pod-level cgroup would count its containers twice
        drops.append({"source_labels": ["pool", "container"], "separator": ";", "regex": f"({'|'.join(labelled)});",
                      "action": "drop"})
    return drops


def _controller_job(plan: ClusterPlan, name: str, program: str, port: int, interval: str) -> Job:
    """kube-scheduler or kube-controller-manager on every apiserver VM, at the VM's address
    (kilonode.render.control_plane binds the secure port there)."""
    return Job(
        (f"{program} on every apiserver VM, at the VM's address (--bind-address), port {port}: TLS with the",
         "certificate the cluster CA issued for that address, the ServiceAccount's token authenticated and",
         "authorised (get /metrics) by the apiserver on the program's behalf. The security group admits the port",
         "from the Prometheus pool's subnet alone. Standbys answer too: leader_election_master_status says",
         "which one leads. A handful of targets: nothing dropped."),
        {
            "job_name": name,
            "scrape_interval": interval,
            **_in_cluster_auth(),
            "static_configs": [{"targets": [f"{i.ip}:{port}" for i in plan.control_plane.instances]}],
        },
    )


def pod_traffic_scrape_job(node_interval: str) -> Job:
    """Every pool node's per-pod traffic metrics (kilonode.render.pod_traffic), at the node's
    InternalIP: Kubernetes' node discovery finds them, so no per-node list is kept here."""
    return Job(
        ("Every node's per-pod traffic counters (kilonode.render.pod_traffic: a socket unit on port",
         f"{wellknown.POD_TRAFFIC_METRICS_PORT}, plain http: pod names and byte counts, no payload). Four series",
         f"per pod, every {node_interval} like the other per-node jobs. A node without the socket (a control-plane",
         "host registered as a node, if any) is simply down for this job."),
        {
            "job_name": JOB_POD_TRAFFIC,
            "scrape_interval": node_interval,
            "scheme": "http",
            "kubernetes_sd_configs": [{"role": "node"}],
            "relabel_configs": [
                {"source_labels": ["__meta_kubernetes_node_address_InternalIP"], "regex": "(.+)",
                 "target_label": "__address__", "replacement": f"$1:{wellknown.POD_TRAFFIC_METRICS_PORT}"},
                *_node_labels(),
            ],
        },
    )


def gpu_health_scrape_jobs(plan: ClusterPlan, node_interval: str, control_interval: str) -> list[Job]:
    """The GPU health agents (every GPU pool's nodes, by node discovery kept to those pools) and
    the taint controllers (each apiserver VM's address): only where there are GPU pools."""
    if not plan.gpu_pools:
        return []
    agent_port, controller_port = wellknown.GPU_HEALTH_AGENT_METRICS_PORT, wellknown.GPU_HEALTH_CONTROLLER_METRICS_PORT
    return [
        Job(
            ("The GPU health agent on every node of the GPU pools (kilonode.render.gpu_metrics: a socket unit on",
             f"port {agent_port}, plain http: check times, results, findings counts and active-check figures).",
             f"Node discovery kept to those pools by their label; every {node_interval} like the other per-node jobs."),
            {
                "job_name": JOB_GPU_HEALTH_AGENT,
                "scrape_interval": node_interval,
                "scheme": "http",
                "kubernetes_sd_configs": [{"role": "node"}],
                "relabel_configs": [
                    _keep_gpu_pools(plan),
                    {"source_labels": ["__meta_kubernetes_node_address_InternalIP"], "regex": "(.+)",
                     "target_label": "__address__", "replacement": f"$1:{agent_port}"},
                    *_node_labels(),
                ],
            },
        ),
        Job(
            ("The GPU health taint controller on every apiserver VM (kilonode.render.gpu_metrics: a socket unit on",
             f"the host's address, port {controller_port}, plain http: sync times and counts), labelled host."),
            {
                "job_name": JOB_GPU_HEALTH_CONTROLLER,
                "scrape_interval": control_interval,
                "scheme": "http",
                "static_configs": [{"targets": [f"{i.ip}:{controller_port}"], "labels": {"host": i.name}}
                                   for i in plan.control_plane.instances],
            },
        ),
    ]


def scrape_config(plan: ClusterPlan) -> str:
    """`scrape_configs:` for this cluster: a file for Prometheus' `scrape_config_files:` (2.43+),
    or a list to paste into prometheus.yml. Each job is preceded by its reasons."""
    lines = [
        f"# {GENERATED}",
        f"# Scrape configuration for cluster {plan.cluster} (kilonode.render.monitoring); {RUNBOOK_DOC} says",
        "# how to load it. Credentials: the ServiceAccount of a Prometheus running in the cluster.",
        "# At this size do NOT scrape from every node what one target can answer, nor whole histograms per",
        "# node: kubelet, cAdvisor and the exporters are trimmed below.",
        "scrape_configs:",
    ]
    for job in scrape_jobs(plan):
        lines += [f"# {line}" for line in job.comment]
        lines.append(block_yaml([job.config]).rstrip("\n"))
    return "\n".join(lines) + "\n"


def prometheus_config(plan: ClusterPlan) -> str | None:
    """The whole prometheus.yml the cluster's Prometheus runs (kilonode.k8s.monitoring mounts it at
    CONFIG_DIR): the rule file beside it and every scrape job inline (`scrape_config_files:` needs
    2.43+, and the same jobs stay in SCRAPE_FILE for a Prometheus of the user's own)."""
    p = plan.prometheus
    if p is None:
        return None
    config = {
        "global": {
            # the control plane's interval for any job without its own; the rules evaluate as often
            "scrape_interval": _seconds(p.control_plane_interval_s),
            "evaluation_interval": _seconds(p.control_plane_interval_s),
            # every series carries its cluster: several clusters' alerts in one Alertmanager stay apart
            "external_labels": {"cluster": plan.cluster},
        },
        "rule_files": [f"{CONFIG_DIR}/{RULES_FILE}"],
        "alerting": alerting_config(),
        "scrape_configs": [job.config for job in scrape_jobs(plan)],
    }
    header = (f"# {GENERATED}\n"
              f"# The cluster's Prometheus ({p.pool} pool; kilonode.render.monitoring). Each job's\n"
              f"# reasons are in {SCRAPE_FILE} beside it; sizes and flags: `kilonode explain {plan.cluster}`.\n")
    return header + block_yaml(config)


def monitoring_files(plan: ClusterPlan) -> dict[str, str]:
    """The ConfigMap's data (kilonode.k8s.monitoring)."""
    files = {RULES_FILE: alert_rules(plan), SCRAPE_FILE: scrape_config(plan)}
    whole = prometheus_config(plan)
    return files | ({PROMETHEUS_FILE: whole} if whole is not None else {})


def routing(plan: ClusterPlan) -> str:
    """Where each severity goes, as kilonode.render.alertmanager routes it (the first line of explain's alerts)."""
    a = plan.alerting
    hook = a is not None and a.webhook_url is not None
    page = [*(["PagerDuty as `critical` events"] if a and a.pager_duty else []), *(["the webhook"] if hook else [])]
    # low urgency only where the PagerDuty service uses dynamic notifications (docs/monitoring.md, "Routing")
    warn = [*(["PagerDuty as `warning` events (low urgency on a service with dynamic notifications)"]
              if a and a.pager_duty_warnings else []), *(["the webhook"] if hook else [])]
    beat = "the heartbeat URL every 5 min" if a and a.heartbeat_url else "nowhere (no heartbeatUrl)"
    return (f"where they go: critical -> {' and '.join(page) or 'NOWHERE (no alerting receiver)'}; warning -> "
            f"{' and '.join(warn) or 'NOWHERE (Alertmanager UI and Grafana only)'}; "
            f"{defaults.WATCHDOG_ALERT} -> {beat}")


def describe(plan: ClusterPlan) -> list[str]:
    """Where the alerts go, then one line per alert: name, severity, `for`, condition (for `kilonode explain`)."""
    lines = [routing(plan)] if plan.prometheus is not None else []
    for alert in alerts(plan):
        condition = re.sub(r"\{\{ \$labels\.(\w+) \}\}", r"<\1>", alert.condition)
        lines.append(f"{alert.name} [{alert.severity}, for {alert.duration}]: {condition}")
    if not plan.gpu_pools:
        lines.append("no GPU pools: no GPU health alerts")
    return lines


# --- Alertmanager (kilonode.k8s.alertmanager, kilonode.render.alertmanager) ---------------------------
def alerting_config() -> dict[str, Any]:
    """prometheus.yml's `alerting:`: the one Alertmanager at its Service's name. Static, not Kubernetes
    discovery: one replica, so the Service's one endpoint is the pod; no RBAC is needed beyond what
    Prometheus has, and promtool (Debian's, without Kubernetes discovery) checks the block whole. Prometheus
    sends every firing alert again each --rules.alert.resend-delay (1m; prometheus/prometheus
    cmd/prometheus/main.go l.527 at v3.5.5), so an Alertmanager back from a restart has every alert that
    still fires within a minute."""
    return {"alertmanagers": [{"static_configs": [{"targets": [ALERTMANAGER_ADDRESS]}]}]}


def alertmanager_scrape_jobs(plan: ClusterPlan, interval: str) -> list[Job]:
    """Alertmanager's own /metrics, where kilonode runs one (beside its Prometheus)."""
    if plan.prometheus is None:
        return []
    return [Job(
        ("The cluster's Alertmanager (kilonode.k8s.alertmanager) at its Service, plain http: whether it runs and",
         "whether its notifications fail (alertmanager_notifications_failed_total; prometheus/alertmanager",
         "notify/metrics.go at the catalogue's release). A few hundred series."),
        {
            "job_name": JOB_ALERTMANAGER,
            "scrape_interval": interval,
            "scheme": "http",
            "static_configs": [{"targets": [ALERTMANAGER_ADDRESS]}],
        },
    )]


def alertmanager_groups(plan: ClusterPlan) -> list[Group]:
    """Alertmanager down, or failing to deliver: without these the pager's own silence goes unseen. Both
    critical: a critical alert goes to every receiver (PagerDuty and the webhook), so one integration that
    fails is reported through the other. An Alertmanager that is down cannot send its own alert: this one is
    seen in Prometheus's and Grafana's ALERTS, and outside by the heartbeat's silence: KilonodeWatchdog, the
    dead man's switch (docs/monitoring.md, "Alertmanager")."""
    if plan.prometheus is None:
        return []
    job = f'job="{JOB_ALERTMANAGER}"'
    return [Group("kilonode-alertmanager", (
        Alert(
            name="KilonodeAlertmanagerDown",
            expr=f"up{{{job}}} == 0 or absent(up{{{job}}})",
            duration="10m",
            severity="critical",
            condition="Alertmanager has not answered Prometheus's scrape for 10 minutes",
            summary="Alertmanager is down: no alert reaches anyone",
            action=("kubectl -n monitoring get pod alertmanager-0; its events and log (its claim, its node); "
                    "Prometheus keeps each firing alert and sends it again once Alertmanager is back"),
            runbook="alertmanager",
        ),
        Alert(
            name="KilonodeAlertmanagerNotificationsFailing",
            # failures in every 10-minute window for 15 minutes: a lasting fault, not one failed send
            expr=(f"sum by (integration) (increase(alertmanager_notifications_failed_total{{{job}}}[10m])) > 0"),
            duration="15m",
            severity="critical",
            condition="Alertmanager's {{ $labels.integration }} notifications have kept failing for 15 minutes",
            summary="Alertmanager cannot deliver to {{ $labels.integration }}",
            action=("kubectl -n monitoring logs alertmanager-0 names the receiver and the error "
                    "(a wrong or revoked routing key or token, the endpoint refusing, no route out)"),
            runbook="alertmanager",
        ),
        Alert(
            name=defaults.WATCHDOG_ALERT,
            # fires while Prometheus evaluates its rules and scrapes itself; its own Alertmanager route
            # (kilonode.render.alertmanager) sends it to the stack's heartbeatUrl alone
            expr=f'up{{job="{JOB_PROMETHEUS}"}} == 1',
            duration="0m",
            severity="none",
            condition="Always firing while Prometheus evaluates its rules and scrapes itself: the dead man's switch",
            summary="The alerting pipeline is alive (Prometheus -> Alertmanager -> the heartbeat)",
            action=("never silence it; it goes only to the stack's alerting.heartbeatUrl, whose outside monitor "
                    "alarms when it stops (Prometheus, Alertmanager, their node or the way out gone)"),
            runbook="alertmanager",
        ),
    ))]
