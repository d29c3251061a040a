"""Dashboards as code: the Grafana dashboards of a cluster, rendered from its plan (data in, JSON out).

Five dashboards, each a file of Grafana's dashboard JSON model that the Grafana beside the cluster's
Prometheus reads through a file provider (kilonode.k8s.grafana; Grafana's documentation at v13.0,
"Provision Grafana": a provider of type file loads every .json file under its path):

- cluster health: nodes Ready by pool against the pool's size, pods waiting in the scheduler's
  queues, the apiservers' requests by code, and by API Priority and Fairness priority level their
  rate, queue wait, rejections (HTTP 429) and seats;
- etcd: per cluster (main, events, leases) the database size against that cluster's
  --quota-backend-bytes, the WAL fsync and backend commit p99 against the alerts' thresholds, and
  leader changes;
- GPU fleet (only with GPU pools): dcgm-exporter's fields, as kilonode's counters file enables
  them (kilonode.plan.defaults DCGM_FIELDS), by pool and fabric;
- InfiniBand (only with InfiniBand pools): node-exporter's infiniband collector, port state and
  error counters;
- network: the per-namespace pod traffic kilonode counts on every node (kilonode.render.pod_traffic).

Every query reads only series a deployed source produces: `produced_metrics` says which, from the
scrape jobs and rules kilonode.render.monitoring renders and the names each source documents
(SOURCE_METRICS, each cited); tests/render/test_dashboards.py parses every query with promql-parser
and fails on a name no source produces. Thresholds drawn on panels come from the plan (etcd's
quotas, the pools' sizes) or from the alert rules' own constants, never from a literal here.

Each panel queries the data source through the dashboard's `datasource` variable (a Prometheus
data source, by default the one Grafana's provisioning marks default), so the files name no data
source's uid and import unchanged into a Grafana of the user's own.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from kilonode.node.node_client_approver.rules import SUFFIX as NODE_NAME_SUFFIX
from kilonode.node.pod_traffic import METRICS as POD_TRAFFIC_METRICS
from kilonode.plan import defaults
from kilonode.plan.model import ClusterPlan, NodePoolPlan
from kilonode.render import monitoring as mon

# The JSON model's schema version the files are written in (Grafana's documentation at v13.0,
# "JSON model": schemaVersion); Grafana migrates an older model when it loads one.
SCHEMA_VERSION = 41
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
TAGS = ["kilonode"]
# The width of Grafana's grid is 24 columns; two panels a row.
GRID_WIDTH, PANEL_WIDTH, PANEL_HEIGHT = 24, 12, 8
# Colours of the threshold steps: below the first, at and above each.
BASE_COLOUR, WARNING_COLOUR, CRITICAL_COLOUR = "green", "orange", "red"

# Series each source produces that the dashboards (or the rules) read, by scrape job, for the jobs
# whose metric_relabel_configs keep no list of names (a job with a `keep` list produces exactly that
# list). Names read upstream at the pinned releases:
SOURCE_METRICS: dict[str, tuple[str, ...]] = {
    # kubernetes/apiserver v0.34.10 pkg/endpoints/metrics/metrics.go l.81 (request_total), l.128
    # (request_sli_duration_seconds, a histogram: _bucket); pkg/util/flowcontrol/metrics/metrics.go
    # l.93-109 (rejected_requests_total {priority_level, flow_schema, reason}, dispatched_requests_total),
    # l.258-264 (current_executing_seats), l.280-287 (request_wait_duration_seconds, a histogram),
    # l.348 (nominal_limit_seats {priority_level})
    mon.JOB_APISERVER: (
        "apiserver_request_total", "apiserver_request_sli_duration_seconds_bucket",
        "apiserver_flowcontrol_rejected_requests_total", "apiserver_flowcontrol_dispatched_requests_total",
        "apiserver_flowcontrol_current_executing_seats", "apiserver_flowcontrol_request_wait_duration_seconds_bucket",
        "apiserver_flowcontrol_nominal_limit_seats",
        # pkg/storage/etcd3/metrics/metrics.go l.89-96 (apiserver_resource_objects {group, resource}, ALPHA: the
        # successor of apiserver_storage_objects, STABLE but "[DEPRECATED, consider using apiserver_resource_objects
        # instead]", l.73-80) and l.81-88 (apiserver_resource_size_estimate_bytes {group, resource}, set only under
        # the SizeBasedListCostEstimate gate, l.204-220: beta and on by default at 1.34, pkg/features
        # kube_features.go l.402-404). The apiserver job drops neither (APISERVER_DROPPED: histogram buckets only).
        "apiserver_resource_objects", "apiserver_resource_size_estimate_bytes",
    ),
    # kubernetes/kubernetes pkg/scheduler/metrics/metrics.go: pending_pods {queue} (active, backoff,
    # unschedulable, gated), in the scheduler subsystem
    mon.JOB_SCHEDULER: ("scheduler_pending_pods",),
    # kubernetes/kube-state-metrics v2.18.0 internal/store/node.go l.40 (kube_node_labels), l.134
    # (kube_node_info), l.480 (kube_node_status_condition {node, condition, status}), l.262 (kube_node_spec_taint
    # {node, key, value, effect}, with --resources=nodes: the node store)
    # ... and with --resources=daemonsets,deployments (kube-system: kilonode.plan.defaults.exporters) daemonset.go
    # (kube_daemonset_status_number_unavailable, _desired_number_scheduled {namespace, daemonset}) and deployment.go
    # (kube_deployment_status_replicas_unavailable, kube_deployment_spec_replicas {namespace, deployment})
    mon.JOB_KUBE_STATE_METRICS: ("kube_node_labels", "kube_node_info", "kube_node_status_condition",
                                 "kube_node_spec_taint", "kube_daemonset_status_number_unavailable",
                                 "kube_daemonset_status_desired_number_scheduled",
                                 "kube_deployment_status_replicas_unavailable", "kube_deployment_spec_replicas"),
    # kilonode's own (kilonode.node.pod_traffic METRICS)
    mon.JOB_POD_TRAFFIC: tuple(name for name, _, _ in POD_TRAFFIC_METRICS),
    # kilonode's GPU health agent (kilonode.node.gpu.metrics _agent_checks: {rule, tainting}, absent when none)
    mon.JOB_GPU_HEALTH_AGENT: (f"{mon.GPU_AGENT}_findings",),
}
# etcd (v3.5/v3.6 server/storage/mvcc/metrics.go, server/etcdserver/metrics.go, server/storage/wal
# and backend metrics.go): the series the etcd rules of kilonode.render.monitoring read, which
# tests/monitoring/test_live_etcd_quota.py scrapes from a real member.
ETCD_METRICS = (
    "etcd_mvcc_db_total_size_in_bytes", "etcd_server_quota_backend_bytes", "etcd_server_has_leader",
    "etcd_server_leader_changes_seen_total", "etcd_disk_wal_fsync_duration_seconds_bucket",
    "etcd_disk_backend_commit_duration_seconds_bucket",
    # fragmentation and its cures, at v3.5.33: server/mvcc/metrics.go l.163-166 (db_total_size_in_bytes, the
    # file) and l.183-186 (db_total_size_in_use_in_bytes, its pages in use), l.137-139
    # (etcd_debugging_mvcc_db_compaction_total_duration_milliseconds, a histogram: _count is compactions);
    # server/mvcc/backend/metrics.go l.65-67 (etcd_disk_backend_defrag_duration_seconds: _count is defrags)
    "etcd_mvcc_db_total_size_in_use_in_bytes", "etcd_debugging_mvcc_db_compaction_total_duration_milliseconds_count",
    "etcd_disk_backend_defrag_duration_seconds_count",
    # revisions and leases at v3.5.33: server/mvcc/metrics.go l.239-250 (etcd_debugging_mvcc_current_revision),
    # l.255-266 (etcd_debugging_mvcc_compact_revision); server/lease/metrics.go l.22-41
    # (etcd_debugging_lease_granted_total, _revoked_total, _renewed_total)
    "etcd_debugging_mvcc_current_revision", "etcd_debugging_mvcc_compact_revision",
    "etcd_debugging_lease_granted_total", "etcd_debugging_lease_revoked_total", "etcd_debugging_lease_renewed_total",
)
# Prometheus's own per target (docs/concepts/jobs_instances.md: up, scrape_duration_seconds, ...).
SCRAPE_METRICS = ("up", "scrape_duration_seconds", "scrape_samples_scraped")
# Prometheus's series of its alerting rules' state, one per pending or firing alert with its labels
# (prometheus/prometheus rules/alerting.go at v3.5.5: alertMetricName "ALERTS", labels alertname and
# alertstate): produced wherever the rule file has an alert.
ALERTS_METRIC = "ALERTS"
XID_ALERT = "KilonodeGpuXidError"

# A node's name is its scale set's (its fabric: RDMA reaches the VMs of one scale set) followed by
# six base-36 characters (kilonode.node.node_client_approver.rules SUFFIX): the fabric is read
# from the node label, which no series carries otherwise.
FABRIC = f'"fabric", "$1", "node", "(.+){NODE_NAME_SUFFIX}"'


@dataclass(frozen=True)
class Threshold:
    value: float
    colour: str
    source: str  # what in the plan (or which alert) it is


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str


@dataclass(frozen=True)
class Panel:
    title: str
    description: str
    queries: tuple[Query, ...]
    unit: str = "short"
    thresholds: tuple[Threshold, ...] = ()
    # per series (by its legend's value): thresholds of its own, a Grafana field override
    series_thresholds: tuple[tuple[str, tuple[Threshold, ...]], ...] = ()


@dataclass(frozen=True)
class Dashboard:
    uid: str
    title: str
    description: str
    panels: tuple[Panel, ...] = field(default_factory=tuple)
    # template variables after `datasource` (Grafana's JSON model, templating.list): a query variable's
    # label_values() over a series some job keeps
    variables: tuple[dict[str, Any], ...] = ()


def _steps(thresholds: Iterable[Threshold]) -> dict[str, Any]:
    return {"mode": "absolute", "steps": [{"color": BASE_COLOUR, "value": None},
                                          *({"color": t.colour, "value": t.value} for t in thresholds)]}


def panel_json(panel: Panel, index: int) -> dict[str, Any]:
    """One timeseries panel of Grafana's JSON model, its thresholds drawn as lines."""
    overrides = [{"matcher": {"id": "byName", "options": name},
                  "properties": [{"id": "thresholds", "value": _steps(steps)}]}
                 for name, steps in panel.series_thresholds]
    drawn = bool(panel.thresholds or panel.series_thresholds)
    return {
        "id": index + 1,
        "type": "timeseries",
        "title": panel.title,
        "description": panel.description,
        "datasource": DATASOURCE,
        "gridPos": {"h": PANEL_HEIGHT, "w": PANEL_WIDTH, "x": (index * PANEL_WIDTH) % GRID_WIDTH,
                    "y": (index * PANEL_WIDTH) // GRID_WIDTH * PANEL_HEIGHT},
        "targets": [{"refId": chr(ord("A") + i), "datasource": DATASOURCE, "expr": q.expr,
                     "legendFormat": q.legend, "range": True}
                    for i, q in enumerate(panel.queries)],
        "fieldConfig": {
            "defaults": {
                "unit": panel.unit,
                "thresholds": _steps(panel.thresholds),
                "custom": {"thresholdsStyle": {"mode": "line" if drawn else "off"}},
            },
            "overrides": overrides,
        },
        "options": {"legend": {"displayMode": "table", "placement": "bottom", "calcs": ["lastNotNull", "max"]},
                    "tooltip": {"mode": "multi", "sort": "desc"}},
    }


def dashboard_json(dashboard: Dashboard) -> dict[str, Any]:
    """The whole dashboard: its panels, and the `datasource` variable they query through."""
    return {
        "uid": dashboard.uid,
        "title": dashboard.title,
        "description": dashboard.description,
        "tags": TAGS,
        "editable": False,  # provisioned from files: a change in the UI would be lost at the next load
        "schemaVersion": SCHEMA_VERSION,
        "time": {"from": "now-6h", "to": "now"},
        "refresh": "1m",
        "timezone": "utc",
        "templating": {"list": [{"name": "datasource", "label": "Prometheus", "type": "datasource",
                                 "query": "prometheus", "hide": 0, "current": {}}, *dashboard.variables]},
        "panels": [panel_json(p, i) for i, p in enumerate(dashboard.panels)],
    }


# --- cluster health ---------------------------------------------------------------------------------
def pool_ceiling(pool: NodePoolPlan) -> int:
    """The nodes a pool may have: an autoscaled pool's maxNodes, else its node count."""
    return pool.autoscaling.max_nodes if pool.autoscaling else pool.nodes


def _ksm(metric: str, matchers: str = "") -> str:
    inner = f'job="{mon.JOB_KUBE_STATE_METRICS}"' + (f",{matchers}" if matchers else "")
    return f"{metric}{{{inner}}}"


def nodes_ready_panel(plan: ClusterPlan) -> Panel:
    ready = _ksm("kube_node_status_condition", 'condition="Ready",status="true"')
    pools = _ksm("kube_node_labels")
    expr = (f'sum by (pool) (label_replace(max by (node) ({ready}) * on (node) group_left ({mon.KSM_POOL_LABEL}) '
            f'max by (node, {mon.KSM_POOL_LABEL}) ({pools}), "pool", "$1", "{mon.KSM_POOL_LABEL}", "(.+)"))')
    return Panel(
        "Nodes Ready by pool",
        "Nodes whose Ready condition is true (kube-state-metrics), by their kilonode.io/pool label; each pool's "
        "line is its size in the plan (an autoscaled pool's maxNodes).",
        (Query(expr, "{{pool}}"),),
        series_thresholds=tuple((p.name, (Threshold(pool_ceiling(p), WARNING_COLOUR, f"pool {p.name}: nodes"),))
                                for p in plan.node_pools),
    )


def _apiserver(metric: str, matchers: str = "") -> str:
    inner = f'job="{mon.JOB_APISERVER}"' + (f",{matchers}" if matchers else "")
    return f"{metric}{{{inner}}}"


def apiserver_panels() -> tuple[Panel, ...]:
    """The apiservers' load, and by APF priority level what they admit, queue and refuse."""
    wait = _apiserver("apiserver_flowcontrol_request_wait_duration_seconds_bucket", 'execute="true"')
    sli = _apiserver("apiserver_request_sli_duration_seconds_bucket", 'verb!~"WATCH|CONNECT"')
    return (
        Panel("Apiserver requests by code", "Requests per second answered, by HTTP code (WATCH and CONNECT left "
              f"out), from the recording rule {mon.APISERVER_RATE} the 429 and 5xx alerts read.",
              (Query(f"sum by (code) ({mon.APISERVER_RATE})", "{{code}}"),), unit="reqps"),
        Panel("Apiserver request latency p99 by verb", "The apiservers' SLI latency (without the time a request "
              "waits for webhooks or in APF's queues), 99th percentile over 5 minutes.",
              (Query(f"histogram_quantile(0.99, sum by (verb, le) (rate({sli}[5m])))", "{{verb}}"),), unit="s"),
        Panel("Requests dispatched by priority level", "Requests API Priority and Fairness let through, per "
              "second, by priority level.",
              (Query(f"sum by (priority_level) (rate({_apiserver('apiserver_flowcontrol_dispatched_requests_total')}"
                     "[5m]))", "{{priority_level}}"),), unit="reqps"),
        # flow_schema is a label of dispatched_requests_total (kubernetes/apiserver v0.34.10
        # pkg/util/flowcontrol/metrics/metrics.go l.93-109: {priority_level, flow_schema}); the apiserver job keeps
        # the series (APISERVER_DROPPED names histogram buckets only)
        Panel("Requests dispatched by flow schema", "Requests API Priority and Fairness let through, per second, "
              "by the FlowSchema that classified them: which clients (a controller, the kubelets, a team's tool) "
              "fill a priority level.",
              (Query(f"sum by (flow_schema) (rate({_apiserver('apiserver_flowcontrol_dispatched_requests_total')}"
                     "[5m]))", "{{flow_schema}}"),), unit="reqps"),
        Panel("Requests rejected (HTTP 429) by priority level", "Requests API Priority and Fairness refused, per "
              "second, by priority level and reason (queue-full, concurrency-limit, time-out, cancelled): who is "
              "being shed first.",
              (Query(f"sum by (priority_level, reason) (rate("
                     f"{_apiserver('apiserver_flowcontrol_rejected_requests_total')}[5m]))",
                     "{{priority_level}} {{reason}}"),), unit="reqps"),
        Panel("Queue wait p99 by priority level", "How long executed requests waited in their priority level's "
              "queues, 99th percentile over 5 minutes.",
              (Query(f"histogram_quantile(0.99, sum by (priority_level, le) (rate({wait}[5m])))",
                     "{{priority_level}}"),), unit="s"),
        Panel("Seats in use by priority level", "Seats executing now against each level's nominal limit, summed "
              "over the apiservers.",
              (Query(f"sum by (priority_level) ({_apiserver('apiserver_flowcontrol_current_executing_seats')})",
                     "{{priority_level}} in use"),
               Query(f"sum by (priority_level) (max by (instance, priority_level) "
                     f"({_apiserver('apiserver_flowcontrol_nominal_limit_seats')}))", "{{priority_level}} limit")),
              ),
    )


def cluster_health(plan: ClusterPlan) -> Dashboard:
    pending = f'max by (queue) (scheduler_pending_pods{{job="{mon.JOB_SCHEDULER}"}})'
    return Dashboard(
        "kilonode-cluster-health", f"{plan.cluster}: cluster health",
        "Nodes, the scheduler's queues and the apiservers' load (kilonode.render.dashboards).",
        (
            nodes_ready_panel(plan),
            Panel("Pods pending", "Pods waiting in kube-scheduler's queues (active, backoff, unschedulable, "
                  "gated), from the leading scheduler (a standby's queues are empty). The gang scheduler's pods "
                  "wait in its own queues, not scraped.", (Query(pending, "{{queue}}"),)),
            *apiserver_panels(),
        ),
    )


# --- etcd -------------------------------------------------------------------------------------------
def quota_thresholds(quota_bytes: int) -> tuple[Threshold, ...]:
    """The database-size alert's levels (kilonode.render.monitoring) and the quota itself."""
    return (
        Threshold(quota_bytes * mon.ETCD_QUOTA_WARNING, WARNING_COLOUR,
                  f"KilonodeEtcdDatabaseNearQuota warning: {mon.ETCD_QUOTA_WARNING:g} of quotaBackendBytes"),
        Threshold(quota_bytes * mon.ETCD_QUOTA_CRITICAL, CRITICAL_COLOUR,
                  f"KilonodeEtcdDatabaseNearQuota critical: {mon.ETCD_QUOTA_CRITICAL:g} of quotaBackendBytes"),
        Threshold(quota_bytes, CRITICAL_COLOUR, "quotaBackendBytes: etcd refuses writes (NOSPACE)"),
    )


def etcd_panels(plan: ClusterPlan) -> tuple[Panel, ...]:
    panels: list[Panel] = []
    for cluster in plan.etcd_clusters:
        job = f'job="{mon.etcd_job(cluster.role)}"'
        panels.append(Panel(
            f"etcd {cluster.role}: database size", f"Each member's backend database against its quota "
            f"(--quota-backend-bytes {cluster.quota_backend_bytes:,} bytes in the plan) and the quota alert's "
            "levels. At the quota etcd refuses every write until compacted and defragmented.",
            (Query(f"max by (instance) (etcd_mvcc_db_total_size_in_bytes{{{job}}})", "{{instance}}"),),
            unit="bytes", thresholds=quota_thresholds(cluster.quota_backend_bytes)))
        panels.append(Panel(
            f"etcd {cluster.role}: database in use vs allocated", "Each member's database file "
            "(etcd_mvcc_db_total_size_in_bytes, what the quota counts) against the pages in use "
            "(etcd_mvcc_db_total_size_in_use_in_bytes): the gap is fragmentation, which compaction frees inside "
            "the file and only a defragmentation (etcdctl defrag, one member at a time) gives back.",
            (Query(f"max by (instance) (etcd_mvcc_db_total_size_in_bytes{{{job}}})", "{{instance}} allocated"),
             Query(f"max by (instance) (etcd_mvcc_db_total_size_in_use_in_bytes{{{job}}})", "{{instance}} in use")),
            unit="bytes"))
    return tuple(panels)


def etcd_disk_panels() -> tuple[Panel, ...]:
    by_member = f"{mon.CLUSTER_ROLE_LABEL}, instance"
    legend = f"{{{{{mon.CLUSTER_ROLE_LABEL}}}}} {{{{instance}}}}"
    leaders = f'etcd_server_leader_changes_seen_total{{job=~"{mon.ETCD_JOBS}"}}'
    return (
        Panel("etcd WAL fsync p99", "Each member's 99th percentile write-ahead-log fsync (the recording rule "
              f"{mon.ETCD_WAL_FSYNC_P99}); the lines are KilonodeEtcdSlowWalFsync's warning and critical.",
              (Query(f"max by ({by_member}) ({mon.ETCD_WAL_FSYNC_P99})", legend),), unit="s",
              thresholds=(Threshold(mon.ETCD_WAL_FSYNC_P99_WARNING, WARNING_COLOUR, "KilonodeEtcdSlowWalFsync warning"),
                          Threshold(mon.ETCD_WAL_FSYNC_P99_CRITICAL, CRITICAL_COLOUR,
                                    "KilonodeEtcdSlowWalFsync critical"))),
        Panel("etcd backend commit p99", "Each member's 99th percentile backend commit (the recording rule "
              f"{mon.ETCD_BACKEND_COMMIT_P99}); the line is KilonodeEtcdSlowBackendCommit's warning.",
              (Query(f"max by ({by_member}) ({mon.ETCD_BACKEND_COMMIT_P99})", legend),), unit="s",
              thresholds=(Threshold(mon.ETCD_BACKEND_COMMIT_P99_WARNING, WARNING_COLOUR,
                                    "KilonodeEtcdSlowBackendCommit warning"),)),
        Panel("etcd compactions and defragmentations (1 hour)", "Compactions (the apiserver asks every 5 minutes: "
              "etcd_debugging_mvcc_db_compaction_total_duration_milliseconds_count) and defragmentations "
              "(etcd_disk_backend_defrag_duration_seconds_count) each member ran in the last hour: no compaction "
              "means the database only grows.",
              (Query(f"max by ({by_member}) (increase("
                     f"etcd_debugging_mvcc_db_compaction_total_duration_milliseconds_count"
                     f'{{job=~"{mon.ETCD_JOBS}"}}[1h]))', f"{legend} compactions"),
               Query(f"max by ({by_member}) (increase(etcd_disk_backend_defrag_duration_seconds_count"
                     f'{{job=~"{mon.ETCD_JOBS}"}}[1h]))', f"{legend} defrags"))),
        Panel("etcd leader changes (15 minutes)", "Leader changes each member saw in the last 15 minutes; the "
              "line is KilonodeEtcdLeaderChanges's.",
              (Query(f"max by ({by_member}) (increase({leaders}[15m]))", legend),),
              thresholds=(Threshold(mon.ETCD_LEADER_CHANGES_15M, WARNING_COLOUR, "KilonodeEtcdLeaderChanges"),)),
    )


# The apiserver's verbs that write to etcd (apiserver_request_total's verb label, CleanVerb: kubernetes/apiserver
# v0.34.10 pkg/endpoints/metrics/metrics.go l.734-750). APPLY is server-side apply: CleanVerb reports a PATCH whose
# Content-Type is application/apply-patch+yaml as "APPLY" (the same function: `if verb == "PATCH" &&
# request.Header.Get("Content-Type") == string(types.ApplyPatchType) ... reportedVerb = "APPLY"`), so controllers
# and `kubectl apply --server-side` writing through it were missing from the writes panel (research-7500's trace).
WRITE_VERBS = "POST|PUT|PATCH|APPLY|DELETE|DELETECOLLECTION"
TOP_RESOURCES = 15


def etcd_growth_panels() -> tuple[Panel, ...]:
    """What fills etcd: objects and their estimated bytes by resource (the apiservers' view), writes by resource,
    revisions not yet compacted, and leases granted and revoked."""
    objects = _apiserver("apiserver_resource_objects")
    size = _apiserver("apiserver_resource_size_estimate_bytes")
    writes = _apiserver("apiserver_request_total", f'verb=~"{WRITE_VERBS}"')
    etcd = f'job=~"{mon.ETCD_JOBS}"'
    by_member = f"{mon.CLUSTER_ROLE_LABEL}, instance"
    legend = f"{{{{{mon.CLUSTER_ROLE_LABEL}}}}} {{{{instance}}}}"
    return (
        Panel(f"Objects stored, top {TOP_RESOURCES} resources", "Objects of each resource in etcd at the apiservers' "
              "last count (apiserver_resource_objects, the successor of the deprecated apiserver_storage_objects), "
              "the largest: what a database near its quota holds.",
              (Query(f"topk({TOP_RESOURCES}, max by (group, resource) ({objects}))", "{{resource}}.{{group}}"),)),
        Panel(f"Estimated bytes stored, top {TOP_RESOURCES} resources", "Each resource's objects times their last "
              "observed size (apiserver_resource_size_estimate_bytes; -1 where the count failed).",
              (Query(f"topk({TOP_RESOURCES}, max by (group, resource) ({size}))", "{{resource}}.{{group}}"),),
              unit="bytes"),
        Panel(f"Writes by resource, top {TOP_RESOURCES}", f"Write requests per second ({WRITE_VERBS}) by resource "
              "and verb over every apiserver: who is filling the history compaction must clear.",
              (Query(f"topk({TOP_RESOURCES}, sum by (resource, verb) (rate({writes}[5m])))", "{{resource}} {{verb}}"),),
              unit="reqps"),
        Panel("etcd revisions not compacted", "Each member's current revision less its last compacted one "
              "(etcd_debugging_mvcc_current_revision - _compact_revision): the history kept; it should fall every "
              "5 minutes (the apiserver's compaction). KilonodeEtcdCompactionStalled fires when it stops.",
              (Query(f"max by ({by_member}) (etcd_debugging_mvcc_current_revision{{{etcd}}}) - max by ({by_member}) "
                     f"(etcd_debugging_mvcc_compact_revision{{{etcd}}})", legend),)),
        Panel("etcd leases granted, revoked and renewed", "Per second, per member (etcd 3.5 exports no count of "
              "live leases: granted faster than revoked is leases piling up, each holding its keys).",
              tuple(Query(f"max by ({by_member}) (rate(etcd_debugging_lease_{kind}_total{{{etcd}}}[5m]))",
                          f"{legend} {kind}") for kind in ("granted", "revoked", "renewed")), unit="cps"),
    )


def etcd_dashboard(plan: ClusterPlan) -> Dashboard:
    roles = ", ".join(c.role for c in plan.etcd_clusters)
    return Dashboard("kilonode-etcd", f"{plan.cluster}: etcd",
                     f"The etcd clusters ({roles}): size against each quota, disk latency, leader changes.",
                     (*etcd_panels(plan), *etcd_disk_panels(), *etcd_growth_panels()))


# --- GPUs -------------------------------------------------------------------------------------------
def dcgm_fields() -> frozenset[str]:
    """The fields kilonode's counters file enables (kilonode.k8s.exporters, defaults.DCGM_FIELDS)."""
    return frozenset(name for name, _, _ in defaults.DCGM_FIELDS)


def dcgm(field_name: str) -> str:
    """A DCGM field's series as the dcgm-exporter job scrapes them."""
    return f'{field_name}{{job="{mon.JOB_DCGM_EXPORTER}"}}'


TEAM_VARIABLE = "team"
# the worst devices the GPU fleet's topk panels name
TOP_DEVICES = 10
# kube-state-metrics exports kilonode.io/team on kube_node_labels (defaults.KSM_LABELS_ALLOWLIST) as this label
KSM_TEAM_LABEL = "label_kilonode_io_team"


def team_variable() -> dict[str, Any]:
    """The GPU fleet's `team` variable: the teams kube_node_labels names, All (any node, labelled or not) by
    default."""
    return {"name": TEAM_VARIABLE, "label": "Team", "type": "query", "datasource": DATASOURCE,
            "query": {"query": f"label_values({_ksm('kube_node_labels')}, {KSM_TEAM_LABEL})", "refId": "teams"},
            "refresh": 2, "sort": 1, "hide": 0, "includeAll": True, "allValue": ".*", "multi": True, "current": {}}


def _of_team(series: str) -> str:
    """`series` kept to the nodes of the chosen teams: joined to kube_node_labels by node (one series a node),
    not a label on every per-node series."""
    teams = _ksm("kube_node_labels", f'{KSM_TEAM_LABEL}=~"${TEAM_VARIABLE}"')
    return f"({series} and on (node) {teams})"


def _by_fabric(aggregation: str, series: str, parameter: str = "") -> str:
    """An aggregation of DCGM series (a field's name, or an expression of them) by pool and fabric (the
    node's scale set, FABRIC), of the chosen teams' nodes."""
    inner = _of_team(dcgm(series) if series.isidentifier() else series)
    return f"{aggregation} by (pool, fabric) ({parameter}label_replace({inner}, {FABRIC}))"


def gpu_panels() -> tuple[Panel, ...]:
    legend = "{{pool}} {{fabric}}"
    used, free = "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE"
    replays = _of_team(f"rate({dcgm('DCGM_FI_DEV_PCIE_REPLAY_COUNTER')}[15m])")
    wait = _of_team(f'rate(node_infiniband_port_transmit_wait_total{{job="{mon.JOB_NODE_EXPORTER}"}}[15m])')
    return (
        Panel("GPU utilisation by pool and fabric", "Mean DCGM_FI_DEV_GPU_UTIL over the GPUs of each scale set "
              "(a fabric: RDMA reaches one scale set's VMs).",
              (Query(_by_fabric("avg", "DCGM_FI_DEV_GPU_UTIL"), legend),), unit="percent"),
        Panel("GPU memory used by pool and fabric", "Each GPU's framebuffer used over used + free "
              "(DCGM_FI_DEV_FB_USED, _FB_FREE), the mean over the GPUs of each scale set.",
              (Query(_by_fabric("avg", f"{dcgm(used)} / ({dcgm(used)} + {dcgm(free)})"), legend),),
              unit="percentunit"),
        Panel("GPUs whose last Xid needs an action", "GPUs whose last Xid (DCGM_FI_DEV_XID_ERRORS) is one "
              "NVIDIA's catalogue gives an action other than the job's own, counted by pool: KilonodeGpuXidError "
              "firing, one alert per GPU.",
              # the alert's own state (Prometheus's ALERTS series), so the panel and the alert agree without
              # repeating its expression (some thousand characters of Xid classes)
              (Query(f'count by (pool) (ALERTS{{alertname="{XID_ALERT}",alertstate="firing"}})', "{{pool}}"),)),
        Panel("GPU temperature by pool and fabric", "Hottest and median DCGM_FI_DEV_GPU_TEMP of each scale set.",
              (Query(_by_fabric("max", "DCGM_FI_DEV_GPU_TEMP"), "max {{pool}} {{fabric}}"),
               Query(_by_fabric("quantile", "DCGM_FI_DEV_GPU_TEMP", "0.5, "), "median {{pool}} {{fabric}}")),
              unit="celsius"),
        Panel("GPU power by pool and fabric", "Power drawn by each scale set's GPUs (DCGM_FI_DEV_POWER_USAGE).",
              (Query(_by_fabric("sum", "DCGM_FI_DEV_POWER_USAGE"), legend),), unit="watt"),
        Panel("GPU thermal slowdown by pool", "Share of the last 10 minutes the GPUs were slowed for heat "
              "(DCGM_FI_DEV_THERMAL_VIOLATION, ns), the hottest GPU of each pool; the line is "
              "KilonodeGpuThermalThrottling's.",
              (Query(f"max by (pool) (rate({dcgm('DCGM_FI_DEV_THERMAL_VIOLATION')}[10m])) / 1e9", "{{pool}}"),),
              unit="percentunit",
              thresholds=(Threshold(mon.GPU_THERMAL_FRACTION, WARNING_COLOUR, "KilonodeGpuThermalThrottling"),)),
        Panel("GPU power slowdown by pool", "Share of the last 10 minutes the GPUs were slowed to stay within their "
              "power limit (DCGM_FI_DEV_POWER_VIOLATION, ns), the most slowed GPU of each pool; the line is "
              "KilonodeGpuPowerThrottling's.",
              (Query(f"max by (pool) (rate({dcgm('DCGM_FI_DEV_POWER_VIOLATION')}[10m])) / 1e9", "{{pool}}"),),
              unit="percentunit",
              thresholds=(Threshold(mon.GPU_POWER_FRACTION, WARNING_COLOUR, "KilonodeGpuPowerThrottling"),)),
        # the worst GPUs and HCA ports of the fleet, named: a marginal riser or slot (PCIe replays,
        # DCGM_FI_DEV_PCIE_REPLAY_COUNTER, the counters file's l.20) and a congested or slow-receiving port
        # (node_infiniband_port_transmit_wait_total, node_exporter v1.12.1 collector/infiniband_linux.go l.214)
        Panel(f"Most PCIe replays, top {TOP_DEVICES} GPUs", "PCIe link retries per second of the GPUs replaying the "
              "most over 15 minutes (DCGM_FI_DEV_PCIE_REPLAY_COUNTER): a GPU that keeps replaying while its peers do "
              "not is a riser or slot to reseat; the one-node dashboard shows it beside its clocks.",
              (Query(f"topk({TOP_DEVICES}, max by (node, gpu) ({replays}))", "{{node}} GPU {{gpu}}"),),
              unit="cps"),
        Panel(f"Most InfiniBand transmit wait, top {TOP_DEVICES} ports", "Ticks per second each HCA port had data "
              "but could not send (node_infiniband_port_transmit_wait_total), the ports waiting most: congestion "
              "in the fabric or a slow receiver on that rail.",
              (Query(f"topk({TOP_DEVICES}, max by (node, device, port) ({wait}))",
                     "{{node}} {{device}} port {{port}}"),), unit="cps"),
        Panel("Lowest SM clock by pool and fabric", "The slowest GPU's SM clock (DCGM_FI_DEV_SM_CLOCK, MHz) and "
              "the median of each scale set: a GPU held low while its peers run is the slow rank of every "
              "synchronous job on it (the one-node dashboard says why: its clock-event reasons).",
              (Query(_by_fabric("min", "DCGM_FI_DEV_SM_CLOCK"), "min {{pool}} {{fabric}}"),
               Query(_by_fabric("quantile", "DCGM_FI_DEV_SM_CLOCK", "0.5, "), "median {{pool}} {{fabric}}")),
              unit="hertz"),
        # The straggler: the lowest clock above takes idle GPUs too (an idle GPU drops its clock), which hides a
        # throttled one under load (issue 40's fourth on-call trace). Only GPUs busy over half the time count here,
        # each named by node and GPU.
        Panel(f"Slowest busy GPUs, bottom {TOP_DEVICES}", "The busy GPUs (DCGM_FI_DEV_GPU_UTIL over 50%) with the "
              "lowest SM clock (DCGM_FI_DEV_SM_CLOCK, MHz), each by node and GPU: the slow rank that holds back "
              "every synchronous job it is in. Open its node in the one-node dashboard for its clock-event "
              "reasons, temperature and power.",
              (Query(f"bottomk({TOP_DEVICES}, {_of_team(dcgm('DCGM_FI_DEV_SM_CLOCK'))} "
                     f"and on (node, gpu) {_of_team(dcgm('DCGM_FI_DEV_GPU_UTIL'))} > 50)", "{{node}} GPU {{gpu}}"),),
              unit="hertz"),
    )


def gpu_dashboard(plan: ClusterPlan) -> Dashboard | None:
    if not plan.gpu_pools:
        return None
    pools = ", ".join(f"{p.name} ({len(p.shards)} scale sets)" for p in plan.gpu_pools)
    return Dashboard("kilonode-gpu-fleet", f"{plan.cluster}: GPU fleet",
                     f"dcgm-exporter's fields on the GPU pools ({pools}), by pool and fabric; the `team` variable "
                     "keeps the scale-set panels to the nodes labelled kilonode.io/team.", gpu_panels(),
                     variables=(team_variable(),))


# --- InfiniBand -------------------------------------------------------------------------------------
def infiniband_dashboard(plan: ClusterPlan) -> Dashboard | None:
    pools = [p for p in plan.node_pools if p.infiniband]
    if not pools:
        return None
    job = f'job="{mon.JOB_NODE_EXPORTER}"'
    errors = ("node_infiniband_symbol_error_total", "node_infiniband_link_error_recovery_total",
              "node_infiniband_port_errors_received_total")
    ports = sum(p.infiniband_links.count * pool_ceiling(p) if p.infiniband_links else 0 for p in pools)
    return Dashboard("kilonode-infiniband", f"{plan.cluster}: InfiniBand",
                     "The HCA ports of the InfiniBand pools (node-exporter's infiniband collector).", (
        Panel("Ports not ACTIVE by pool", f"HCA ports whose state is not ACTIVE ({mon.IB_PORT_ACTIVE}), by pool: "
              "NCCL loses that rail.",
              (Query(f"count by (pool) (node_infiniband_state_id{{{job}}} != {mon.IB_PORT_ACTIVE})", "{{pool}}"),)),
        Panel("Ports ACTIVE", "HCA ports ACTIVE; the line is the ports of the pools at their ceiling in the plan "
              "(one port a link of the VM size).",
              (Query(f"count(node_infiniband_state_id{{{job}}} == {mon.IB_PORT_ACTIVE})", "active"),),
              thresholds=(Threshold(ports, WARNING_COLOUR, "the plan's InfiniBand ports"),)),
        Panel("Link flaps by pool", "Link-downed events per hour (node_infiniband_link_downed_total), by pool.",
              (Query(f"sum by (pool) (increase(node_infiniband_link_downed_total{{{job}}}[1h]))", "{{pool}}"),)),
        Panel("Port errors by pool", "Symbol errors, link error recoveries and received errors per second.",
              tuple(Query(f"sum by (pool) (rate({m}{{{job}}}[5m]))",
                          f"{{{{pool}}}} {m.removeprefix('node_infiniband_')}") for m in errors), unit="cps"),
        Panel("InfiniBand traffic by pool", "Bytes per second through the HCAs, each direction.",
              (Query(f"sum by (pool) (rate(node_infiniband_port_data_received_bytes_total{{{job}}}[5m]))",
                     "{{pool}} received"),
               Query(f"sum by (pool) (rate(node_infiniband_port_data_transmitted_bytes_total{{{job}}}[5m]))",
                     "{{pool}} transmitted")), unit="Bps"),
    ))


# --- network ----------------------------------------------------------------------------------------
def network_dashboard(plan: ClusterPlan) -> Dashboard:
    traffic = f'kilonode_pod_network_bytes_total{{job="{mon.JOB_POD_TRAFFIC}"}}'
    return Dashboard("kilonode-network", f"{plan.cluster}: network by namespace",
                     "Bytes every node forwarded to and from each namespace's pods (kilonode.render.pod_traffic).", (
        Panel("Traffic by namespace", f"Bytes per second by namespace and direction (the recording rule "
              f"{mon.POD_TRAFFIC_NAMESPACE_RATE}: in to the namespace's pods, out from them).",
              (Query(f"sort_desc(sum by (namespace, direction) ({mon.POD_TRAFFIC_NAMESPACE_RATE}))",
                     "{{namespace}} {{direction}}"),), unit="Bps"),
        Panel("Top pods", "The 20 pods moving the most bytes per second, each direction.",
              (Query(f"topk(20, sum by (namespace, pod, direction) (rate({traffic}[5m])))",
                     "{{namespace}}/{{pod}} {{direction}}"),), unit="Bps"),
    ))


# --- DNS ----------------------------------------------------------------------------------------------------
def dns_dashboard(plan: ClusterPlan) -> Dashboard:
    job = f'job="{mon.JOB_COREDNS}"'
    forward = f'{job},proxy_name="forward"'
    return Dashboard("kilonode-dns", f"{plan.cluster}: cluster DNS",
                     "CoreDNS (kilonode.k8s.dns): its answers, its latency, its upstream (kilonode-coredns).", (
        Panel("Answers by rcode", f"CoreDNS's answers per second by response code (the recording rule "
              f"{mon.DNS_RESPONSES_RATE}): SERVFAIL is a lookup that failed; NXDOMAIN is mostly the search path.",
              (Query(f"sum by (rcode) ({mon.DNS_RESPONSES_RATE})", "{{rcode}}"),), unit="reqps"),
        Panel("SERVFAIL share", "SERVFAIL over every answer; the lines are KilonodeDnsErrors's.",
              (Query(f'sum({mon.DNS_RESPONSES_RATE}{{rcode="SERVFAIL"}}) / sum({mon.DNS_RESPONSES_RATE})',
                     "SERVFAIL"),), unit="percentunit",
              thresholds=(Threshold(mon.DNS_SERVFAIL_WARNING, WARNING_COLOUR, "KilonodeDnsErrors warning"),
                          Threshold(mon.DNS_SERVFAIL_CRITICAL, CRITICAL_COLOUR, "KilonodeDnsErrors critical"))),
        Panel("Answer time p99", f"Over every replica (the recording rule {mon.DNS_REQUEST_P99}), and per replica; "
              "the line is KilonodeDnsSlow's.",
              (Query(mon.DNS_REQUEST_P99, "all replicas"),
               Query(f"histogram_quantile(0.99, sum by (pod, le) "
                     f"(rate(coredns_dns_request_duration_seconds_bucket{{{job}}}[5m])))", "{{pod}}")), unit="s",
              thresholds=(Threshold(mon.DNS_P99_WARNING, WARNING_COLOUR, "KilonodeDnsSlow"),)),
        Panel("Upstream answer time p99 and rcodes", "The forward plugin's queries to the node's resolver: p99 "
              "by upstream, and answers per second by rcode.",
              (Query(f"histogram_quantile(0.99, sum by (to, le) "
                     f"(rate(coredns_proxy_request_duration_seconds_bucket{{{forward}}}[5m])))", "p99 {{to}}"),
               Query(f"sum by (to, rcode) (rate(coredns_proxy_request_duration_seconds_count{{{forward}}}[5m]))",
                     "{{to}} {{rcode}} /s")), unit="s"),
        Panel("Upstream health and rejects", "Failed health checks of each upstream, every upstream broken, and "
              "queries refused at max_concurrent, per second (KilonodeDnsUpstreamFailing, "
              "KilonodeDnsForwardSaturated).",
              (Query(f"sum by (to) (rate(coredns_proxy_healthcheck_failures_total{{{forward}}}[5m]))",
                     "health check failures {{to}}"),
               Query(f"sum(rate(coredns_forward_healthcheck_broken_total{{{job}}}[5m]))", "all upstreams broken"),
               Query(f"sum(rate(coredns_forward_max_concurrent_rejects_total{{{job}}}[5m]))", "rejected")),
              unit="cps"),
    ))


# --- one node ---------------------------------------------------------------------------------------------
NODE_VARIABLE = "node"


def node_dashboard(plan: ClusterPlan) -> Dashboard:
    """One node, chosen by the `node` variable (every node node-exporter answers for): CPU pressure and load,
    memory, disks, network, its conntrack table, and where it has them its GPUs and InfiniBand ports."""
    ne = f'job="{mon.JOB_NODE_EXPORTER}",node="${NODE_VARIABLE}"'
    variable = {"name": NODE_VARIABLE, "label": "Node", "type": "query", "datasource": DATASOURCE,
                "query": {"query": f'label_values(node_load1{{job="{mon.JOB_NODE_EXPORTER}"}}, node)',
                          "refId": "nodes"},
                "refresh": 2, "sort": 1, "hide": 0, "current": {}}
    panels = [
        Panel("CPU pressure and load", "Share of time some task waited for a CPU (node_pressure_cpu_waiting_"
              "seconds_total; no per-CPU series are kept) and the load averages.",
              (Query(f"rate(node_pressure_cpu_waiting_seconds_total{{{ne}}}[5m])", "CPU waiting"),
               Query(f"node_load1{{{ne}}}", "load 1m"), Query(f"node_load15{{{ne}}}", "load 15m"))),
        Panel("Memory used and pressure", "Memory used (1 - MemAvailable / MemTotal) and the share of time tasks "
              "stalled on memory.",
              (Query(f"1 - node_memory_MemAvailable_bytes{{{ne}}} / node_memory_MemTotal_bytes{{{ne}}}", "used"),
               Query(f"rate(node_pressure_memory_stalled_seconds_total{{{ne}}}[5m])", "stalled")),
              unit="percentunit"),
        Panel("Disks", "Bytes read and written per second and the share of time each disk was busy.",
              (Query(f"rate(node_disk_read_bytes_total{{{ne}}}[5m])", "{{device}} read"),
               Query(f"rate(node_disk_written_bytes_total{{{ne}}}[5m])", "{{device}} written"),
               Query(f"rate(node_disk_io_time_seconds_total{{{ne}}}[5m])", "{{device}} busy")), unit="Bps"),
        Panel("Filesystems free", "Free bytes over size per mount point.",
              (Query(f"node_filesystem_avail_bytes{{{ne}}} / node_filesystem_size_bytes{{{ne}}}",
                     "{{mountpoint}}"),), unit="percentunit"),
        Panel("Network", "Bytes per second, and errors and dropped packets per second, on the node's own NICs "
              "(eth*): drops without errors are a full ring or no buffer, traffic the node could not keep up with.",
              (Query(f"rate(node_network_receive_bytes_total{{{ne}}}[5m])", "{{device}} received"),
               Query(f"rate(node_network_transmit_bytes_total{{{ne}}}[5m])", "{{device}} transmitted"),
               Query(f"rate(node_network_receive_errs_total{{{ne}}}[5m])", "{{device}} receive errors"),
               Query(f"rate(node_network_transmit_errs_total{{{ne}}}[5m])", "{{device}} transmit errors"),
               Query(f"rate(node_network_receive_drop_total{{{ne}}}[5m])", "{{device}} receive drops"),
               Query(f"rate(node_network_transmit_drop_total{{{ne}}}[5m])", "{{device}} transmit drops")),
              unit="Bps"),
        Panel("Connection tracking", "The conntrack table's entries against its limit (the line is "
              "KilonodeConntrackTableNearFull's share of it), and new connections dropped or failed per second.",
              (Query(f"node_nf_conntrack_entries{{{ne}}} / node_nf_conntrack_entries_limit{{{ne}}}", "in use"),
               Query(f"rate(node_nf_conntrack_stat_drop{{{ne}}}[5m]) + rate(node_nf_conntrack_stat_early_drop"
                     f"{{{ne}}}[5m])", "dropped /s"),
               Query(f"rate(node_nf_conntrack_stat_insert_failed{{{ne}}}[5m])", "insert failed /s")),
              unit="percentunit",
              thresholds=(Threshold(mon.CONNTRACK_FULL_WARNING, WARNING_COLOUR, "KilonodeConntrackTableNearFull"),)),
    ]
    if plan.gpu_pools:
        gpu = f'job="{mon.JOB_DCGM_EXPORTER}",node="${NODE_VARIABLE}"'
        panels += [
            Panel("GPUs: utilisation", "DCGM_FI_DEV_GPU_UTIL of each GPU of the node (GPU pools only).",
                  (Query(f"max by (gpu) (DCGM_FI_DEV_GPU_UTIL{{{gpu}}})", "GPU {{gpu}}"),), unit="percent"),
            Panel("GPUs: temperature and power", "DCGM_FI_DEV_GPU_TEMP and DCGM_FI_DEV_POWER_USAGE of each GPU.",
                  (Query(f"max by (gpu) (DCGM_FI_DEV_GPU_TEMP{{{gpu}}})", "GPU {{gpu}} C"),
                   Query(f"max by (gpu) (DCGM_FI_DEV_POWER_USAGE{{{gpu}}})", "GPU {{gpu}} W"))),
            Panel("GPUs: last Xid and uncorrectable ECC", "Each GPU's last Xid (DCGM_FI_DEV_XID_ERRORS) and "
                  "double-bit ECC errors since its driver loaded.",
                  (Query(f"max by (gpu) (DCGM_FI_DEV_XID_ERRORS{{{gpu}}})", "GPU {{gpu}} Xid"),
                   Query(f"max by (gpu) (DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{{{gpu}}})", "GPU {{gpu}} DBE"))),
            *_node_gpu_diagnosis(gpu)]
    if any(p.infiniband for p in plan.node_pools):
        panels += [
            Panel("InfiniBand ports", f"Each HCA port's state ({mon.IB_PORT_ACTIVE}: ACTIVE) and link-downed "
                  "events in the last hour (InfiniBand pools only).",
                  (Query(f"node_infiniband_state_id{{{ne}}}", "{{device}}/{{port}} state"),
                   Query(f"increase(node_infiniband_link_downed_total{{{ne}}}[1h])", "{{device}}/{{port}} flaps"))),
            Panel("InfiniBand traffic and errors", "Bytes per second each way and symbol errors per second per port.",
                  (Query(f"rate(node_infiniband_port_data_received_bytes_total{{{ne}}}[5m])",
                         "{{device}} received"),
                   Query(f"rate(node_infiniband_port_data_transmitted_bytes_total{{{ne}}}[5m])",
                         "{{device}} transmitted"),
                   Query(f"rate(node_infiniband_symbol_error_total{{{ne}}}[5m])", "{{device}} symbol errors")),
                  unit="Bps"),
            Panel("InfiniBand port rate and transmit wait", "Each port's signalling rate "
                  "(node_infiniband_rate_bytes_per_second; KilonodeInfinibandPortSlow compares it with the VM "
                  "size's) and the share of ticks it had data but could not send (port_transmit_wait: congestion).",
                  (Query(f"node_infiniband_rate_bytes_per_second{{{ne}}}", "{{device}} rate"),
                   Query(f"rate(node_infiniband_port_transmit_wait_total{{{ne}}}[5m])", "{{device}} wait ticks/s")),
                  unit="Bps"),
        ]
    panels += _node_io_pressure(ne)
    return Dashboard("kilonode-node", f"{plan.cluster}: one node",
                     "One node (the `node` variable): node-exporter's kept series, its GPUs from dcgm-exporter, its "
                     "InfiniBand ports.", tuple(panels), variables=(variable,))


def _node_gpu_diagnosis(gpu: str) -> list[Panel]:
    """The node's GPU-health verdict and why its GPUs may be slow: findings and taints, throttling, clocks, NVLink
    and PCIe errors."""
    node = f'node="${NODE_VARIABLE}"'
    agent = f'{mon.GPU_AGENT}_findings{{job="{mon.JOB_GPU_HEALTH_AGENT}",{node}}}'
    return [
        Panel("GPU health verdict", "The GPU health agent's findings of its last check by rule (tainting or "
              "recorded only; kilonode_gpu_health_findings) and the node's taints (kube_node_spec_taint): "
              "kilonode.io/gpu-unhealthy is the verdict KilonodeGpuNodeUnhealthy reports.",
              (Query(f"max by (rule, tainting) ({agent})", "{{rule}} tainting={{tainting}}"),
               Query(f"max by (key, value, effect) ({_ksm('kube_node_spec_taint', node)})",
                     "taint {{key}}={{value}}:{{effect}}"))),
        Panel("GPUs: thermal and power slowdown", "Share of the last 10 minutes each GPU was slowed for heat "
              "(DCGM_FI_DEV_THERMAL_VIOLATION) or its power limit (DCGM_FI_DEV_POWER_VIOLATION).",
              (Query(f"max by (gpu) (rate(DCGM_FI_DEV_THERMAL_VIOLATION{{{gpu}}}[10m])) / 1e9", "GPU {{gpu}} thermal"),
               Query(f"max by (gpu) (rate(DCGM_FI_DEV_POWER_VIOLATION{{{gpu}}}[10m])) / 1e9", "GPU {{gpu}} power")),
              unit="percentunit",
              thresholds=(Threshold(mon.GPU_THERMAL_FRACTION, WARNING_COLOUR, "KilonodeGpuThermalThrottling"),)),
        Panel("GPUs: SM clock and clock-event reasons", "Each GPU's SM clock (MHz) and DCGM's clock-event reasons "
              "bitmask (DCGM_FI_DEV_CLOCKS_EVENT_REASONS: 0x4 SW power cap, 0x8 HW slowdown, 0x10 sync boost, "
              "0x20 SW thermal, 0x40 HW thermal, 0x80 HW power brake; NVIDIA/DCGM dcgmlib/dcgm_fields.h "
              "DCGM_CLOCKS_EVENT_REASON_*).",
              (Query(f"max by (gpu) (DCGM_FI_DEV_SM_CLOCK{{{gpu}}})", "GPU {{gpu}} MHz"),
               Query(f"max by (gpu) (DCGM_FI_DEV_CLOCKS_EVENT_REASONS{{{gpu}}})", "GPU {{gpu}} reasons"))),
        Panel("GPUs: NVLink, PCIe and Xid errors", "Per GPU over 15 minutes: NVLink CRC, replay and recovery errors "
              "(the KilonodeGpuNvlinkErrors counters), PCIe replays, rows remapped for correctable errors, and the "
              "Xids dcgm-exporter counted in its window (DCGM_EXP_XID_ERRORS_COUNT, by xid).",
              (*(Query(f"max by (gpu) (increase({field}{{{gpu}}}[15m]))",
                       f"GPU {{{{gpu}}}} {field.removeprefix('DCGM_FI_DEV_NVLINK_').removesuffix('_COUNT_TOTAL')}")
                 for field in mon.NVLINK_ERROR_FIELDS),
               Query(f"max by (gpu) (increase(DCGM_FI_DEV_PCIE_REPLAY_COUNTER{{{gpu}}}[15m]))", "GPU {{gpu}} PCIe"),
               Query(f"max by (gpu) (increase(DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS{{{gpu}}}[15m]))",
                     "GPU {{gpu}} remapped"),
               Query(f"max by (gpu, xid) (DCGM_EXP_XID_ERRORS_COUNT{{{gpu}}})", "GPU {{gpu}} Xid {{xid}}"))),
    ]


def _node_io_pressure(ne: str) -> list[Panel]:
    return [Panel("IO pressure", "Share of time some task of the node stalled on IO (node_pressure_io_stalled_"
                  "seconds_total): a slow or saturated disk, a full page cache writing back.",
                  (Query(f"rate(node_pressure_io_stalled_seconds_total{{{ne}}}[5m])", "IO stalled"),),
                  unit="percentunit")]


def dashboards(plan: ClusterPlan) -> list[Dashboard]:
    found = [cluster_health(plan), etcd_dashboard(plan), gpu_dashboard(plan), infiniband_dashboard(plan),
             network_dashboard(plan), dns_dashboard(plan), node_dashboard(plan)]
    return [d for d in found if d is not None]


def dashboard_files(plan: ClusterPlan) -> dict[str, str]:
    """File name -> the dashboard's JSON (the ConfigMap Grafana's file provider reads)."""
    return {f"{d.uid}.json": json.dumps(dashboard_json(d), indent=2, sort_keys=True) + "\n" for d in dashboards(plan)}


# --- what the deployed sources produce ----------------------------------------------------------------
def _kept(config: dict[str, Any]) -> tuple[str, ...] | None:
    """The names a job's metric_relabel_configs keep by __name__ (a `keep` of names joined by |)."""
    for rule in config.get("metric_relabel_configs", []):
        if rule.get("action") == "keep" and rule.get("source_labels") == ["__name__"]:
            return tuple(rule["regex"].split("|"))
    return None


def _dropped(config: dict[str, Any]) -> set[str]:
    return {name for rule in config.get("metric_relabel_configs", [])
            if rule.get("action") == "drop" and rule.get("source_labels") == ["__name__"]
            for name in rule["regex"].split("|")}


def produced_metrics(plan: ClusterPlan) -> dict[str, str]:
    """Metric name -> what produces it in this cluster: a scrape job of kilonode.render.monitoring
    (its `keep` list, else the names its source documents, SOURCE_METRICS and ETCD_METRICS, less its
    drops), a recording rule, or Prometheus itself for every target."""
    produced: dict[str, str] = {}
    for job in mon.scrape_jobs(plan):
        name = job.config["job_name"]
        kept = _kept(job.config)
        documented = ETCD_METRICS if name.startswith(mon.ETCD_JOB_PREFIX) else SOURCE_METRICS.get(name, ())
        for metric in (kept if kept is not None else tuple(m for m in documented if m not in _dropped(job.config))):
            produced.setdefault(metric, f"scrape job {name}")
        for metric in SCRAPE_METRICS:
            produced.setdefault(metric, "Prometheus, per target")
    for group in mon.rule_groups(plan):
        for rule in group.rules:
            if isinstance(rule, mon.Record):
                produced.setdefault(rule.name, f"recording rule ({group.name})")
            else:
                produced.setdefault(ALERTS_METRIC, "Prometheus, the alerting rules' state")
    return produced
