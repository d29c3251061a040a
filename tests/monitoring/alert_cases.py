"""Every alert's `promtool test rules` cases, as data: synthetic series and what should fire.

Each case is a function of a plan returning (input series, checks); `@case(...)` registers it.
tests/monitoring/test_alert_cases.py runs each through Debian's promtool on the rules rendered
for its plan, and reads the same list to demand, for every alert the shipped stacks render
(name, severity and static labels), a check where it fires and one where it stays quiet with its
inputs present, each at a time its `for:` allows. A new alert without both fails that test.

Series are sampled every minute (`interval: 1m`) from t=0; promtool's clock starts at 0.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from kilonode.config import load_stack
from kilonode.node.gpu import protocol
from kilonode.plan import ClusterPlan, plan_stack, wellknown
from kilonode.render import monitoring
from tests.conftest import StackWriter, shipped_cluster_value

GIB = 1024**3
DAY = 86400
Series = tuple[str, str]  # (selector, promtool's expanding notation)
Check = tuple[str, str, list[dict[str, Any]]]  # (eval time, alert name, the alerts expected then)
Build = Callable[[ClusterPlan], tuple[list[Series], list[Check]]]


@dataclass(frozen=True)
class Case:
    id: str
    build: Build
    stack: str = "local"
    # stack overrides under kilonode:cluster.etcd, by role (the shipped quotas are equal)
    etcd: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)


CASES: list[Case] = []


def case(stack: str = "local", etcd: Mapping[str, Mapping[str, Any]] | None = None) -> Callable[[Build], Build]:
    def register(build: Build) -> Build:
        CASES.append(Case(build.__name__, build, stack, etcd or {}))
        return build

    return register


def plan_with(write_stack: StackWriter, base: str, etcd: Mapping[str, Mapping[str, Any]]) -> ClusterPlan:
    cluster = shipped_cluster_value(base)
    for role, values in etcd.items():
        cluster.setdefault("etcd", {}).setdefault(role, {}).update(values)
    return plan_stack(load_stack(str(write_stack(cluster))))


def case_plan(item: Case, plans: dict[str, ClusterPlan], write_stack: StackWriter) -> ClusterPlan:
    return plan_with(write_stack, item.stack, item.etcd) if item.etcd else plans[item.stack]


# --- running promtool ----------------------------------------------------------------------------------
def expected(plan: ClusterPlan, name: str, labels: dict[str, str]) -> dict[str, Any]:
    """The alert promtool should report: the rule's annotations with $labels filled in."""
    [rule] = [r.rule() for r in monitoring.alerts(plan)
              if r.name == name and r.severity == labels["severity"]
              and all(labels.get(k) == v for k, v in r.labels)]
    annotations = {key: re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels[m.group(1)], value)
                   for key, value in rule["annotations"].items()}
    return {"exp_labels": labels, "exp_annotations": annotations}


def promtool_test(promtool: Path, plan: ClusterPlan, tmp_path: Path, series: list[Series],
                  checks: list[Check]) -> subprocess.CompletedProcess[str]:
    """Run `promtool test rules` on the plan's rendered rules: series at a 1m interval; checks
    (eval time, alert name, the alerts expected then). The test file stays in tmp_path."""
    (tmp_path / monitoring.RULES_FILE).write_text(monitoring.alert_rules(plan))
    test = {
        "rule_files": [monitoring.RULES_FILE],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": [{"series": s, "values": v} for s, v in series],
            "alert_rule_test": [{"eval_time": t, "alertname": a, "exp_alerts": e} for t, a, e in checks],
        }],
    }
    path = tmp_path / "test.yaml"
    path.write_text(yaml.safe_dump(test, sort_keys=False))
    return subprocess.run([str(promtool), "test", "rules", path.name], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path, check=False)


# --- coverage: which alert fires and stays quiet where --------------------------------------------------
Identity = tuple[str, str, tuple[tuple[str, str], ...]]  # (name, severity, static labels)


def identity(alert: monitoring.Alert) -> Identity:
    return (alert.name, alert.severity, alert.labels)


def minutes(duration: str) -> float:
    """'90s', '10m', '2h' -> minutes (the forms `for:` and eval_time use here)."""
    parts = re.fullmatch(r"(\d+)([smh])", duration)
    if parts is None:
        raise ValueError(f"duration {duration!r}: expected <n>s, <n>m or <n>h")
    return int(parts.group(1)) * {"s": 1 / 60, "m": 1, "h": 60}[parts.group(2)]


# The longest range any rule reads (rate/histogram over [5m]): a quiet check counts only this long
# after the rule's `for:` could have elapsed, so quiet means "the condition did not hold", not
# "still pending" or "no data yet".
RANGE_MINUTES = 5
NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def reads(alert: monitoring.Alert, plan: ClusterPlan) -> set[str]:
    """The metric names an alert's expression reads, through the recording rules it uses."""
    records = {r.name: r.expr for g in monitoring.rule_groups(plan) for r in g.rules
               if isinstance(r, monitoring.Record)}
    seen: set[str] = set()
    todo = [alert.expr]
    while todo:
        for token in NAME.findall(todo.pop()):
            if token in records and token not in seen:
                todo.append(records[token])
            seen.add(token)
    return seen


@dataclass
class Coverage:
    firing: dict[Identity, list[str]] = field(default_factory=dict)
    quiet: dict[Identity, list[str]] = field(default_factory=dict)

    def add(self, case_id: str, plan: ClusterPlan, series: list[Series], checks: list[Check]) -> None:
        present = {selector.split("{", 1)[0] for selector, _ in series}
        for eval_time, name, alerts in checks:
            at = minutes(eval_time)
            for alert in monitoring.alerts(plan):
                if alert.name != name:
                    continue
                fires = any(e["exp_labels"]["severity"] == alert.severity
                            and all(e["exp_labels"].get(k) == v for k, v in alert.labels) for e in alerts)
                wait = minutes(alert.duration)
                if fires and at >= wait:
                    self.firing.setdefault(identity(alert), []).append(f"{case_id}@{eval_time}")
                elif not fires and at >= wait + RANGE_MINUTES and present & reads(alert, plan):
                    self.quiet.setdefault(identity(alert), []).append(f"{case_id}@{eval_time}")

    def missing(self, identities: set[Identity]) -> list[str]:
        gaps = []
        for ident in sorted(identities):
            shown = f"{ident[0]} [{ident[1]}{''.join(f', {k}={v}' for k, v in ident[2])}]"
            if not self.firing.get(ident):
                gaps.append(f"{shown}: no case where it fires")
            if not self.quiet.get(ident):
                gaps.append(f"{shown}: no case where it stays quiet with its inputs present")
        return gaps


# --- kube-apiserver ------------------------------------------------------------------------------------
def apiserver_series(ok_per_s: float, code: str, bad_per_s: float) -> list[Series]:
    job = f'job="{monitoring.JOB_APISERVER}"'
    return [
        (f'apiserver_request_total{{{job},verb="LIST",resource="pods",code="200"}}', f"0+{ok_per_s * 60:g}x40"),
        (f'apiserver_request_total{{{job},verb="POST",resource="pods",code="{code}"}}', f"0+{bad_per_s * 60:g}x40"),
        # WATCH is long-running and left out: if it counted, 20 refused of 10,120 would be 0.2%
        (f'apiserver_request_total{{{job},verb="WATCH",resource="pods",code="200"}}', "0+600000x40"),
        # an aggregated API server's own 429s are not the apiservers'
        ('apiserver_request_total{job="metrics-server",verb="GET",code="429"}', "0+6000x40"),
    ]


@case()
def apiserver_429_storm(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    # 20 of 120 requests a second refused: 16.7%, above both lines
    return apiserver_series(100, "429", 20), [
        ("20m", "KilonodeApiserverThrottling", [
            expected(plan, "KilonodeApiserverThrottling", {"severity": "warning"}),
            expected(plan, "KilonodeApiserverThrottling", {"severity": "critical"}),
        ]),
        ("20m", "KilonodeApiserverErrors", []),
        # the warning waits its 10 minutes: at 8m only the critical (5m) fires
        ("8m", "KilonodeApiserverThrottling", [
            expected(plan, "KilonodeApiserverThrottling", {"severity": "critical"})]),
    ]


@case()
def apiserver_429_between_the_lines(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    # 2 of 102 a second: 1.96%, above the 1% warning, below the 5% page
    return apiserver_series(100, "429", 2), [
        ("20m", "KilonodeApiserverThrottling", [
            expected(plan, "KilonodeApiserverThrottling", {"severity": "warning"})]),
    ]


@case()
def apiserver_healthy_traffic(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    # 6 of 60,000 a minute refused (0.01%), and the metrics-server's own 429s besides
    series = [*apiserver_series(1000, "429", 0),
              (f'apiserver_request_total{{job="{monitoring.JOB_APISERVER}",verb="GET",code="429"}}', "0+6x40")]
    return series, [
        ("30m", "KilonodeApiserverThrottling", []),
        ("30m", "KilonodeApiserverErrors", []),
    ]


@case()
def apiserver_a_trickle_of_requests(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    # a cluster at rest: 0.5 requests a second, 0.05 of them 429 and 0.05 503 (10% each) but
    # three a minute, under the six a minute (APISERVER_MIN_ERROR_RATE) a ratio needs to mean anything
    job = f'job="{monitoring.JOB_APISERVER}"'
    series = [(f'apiserver_request_total{{{job},verb="GET",code="200"}}', "0+24x40"),
              (f'apiserver_request_total{{{job},verb="POST",code="429"}}', "0+3x40"),
              (f'apiserver_request_total{{{job},verb="PUT",code="503"}}', "0+3x40")]
    return series, [
        ("30m", "KilonodeApiserverThrottling", []),
        ("30m", "KilonodeApiserverErrors", []),
    ]


@case()
def apiserver_5xx_warning(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    # 2 of 102 a second: 2%, a warning, not a page
    return apiserver_series(100, "503", 2), [
        ("20m", "KilonodeApiserverErrors", [expected(plan, "KilonodeApiserverErrors", {"severity": "warning"})]),
        ("20m", "KilonodeApiserverThrottling", []),
    ]


@case()
def apiserver_5xx_storm(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    # 12 of 112 a second: 10.7%, a page after 5 minutes, the warning after 10
    return apiserver_series(100, "500", 12), [
        ("20m", "KilonodeApiserverErrors", [
            expected(plan, "KilonodeApiserverErrors", {"severity": "warning"}),
            expected(plan, "KilonodeApiserverErrors", {"severity": "critical"}),
        ]),
        ("8m", "KilonodeApiserverErrors", [expected(plan, "KilonodeApiserverErrors", {"severity": "critical"})]),
        ("3m", "KilonodeApiserverErrors", []),
    ]


# --- etcd ----------------------------------------------------------------------------------------------
EVENTS_4GIB = {"events": {"quotaBackendBytes": 4 * GIB}}  # half main's 8 GiB


def member_labels(plan: ClusterPlan, role: str, index: int) -> dict[str, str]:
    cluster = plan.etcd_events if role == "events" else plan.etcd_main
    m = cluster.members[index]
    return {"job": monitoring.etcd_job(role), "cluster_role": role, "member": m.name,
            "instance": f"{m.ip}:{wellknown.ETCD_METRICS_PORT}"}


def selector(name: str, labels: Mapping[str, str]) -> str:
    return name + "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


def members(plan: ClusterPlan) -> list[dict[str, str]]:
    return [member_labels(plan, c.role, i) for c in plan.etcd_clusters for i in range(len(c.members))]


def etcd_series(plan: ClusterPlan, size: dict[str, int], quota: dict[str, int]) -> list[Series]:
    """Every member of each cluster at `size[role]` bytes; exporting `quota[role]` where given."""
    series = []
    for labels in members(plan):
        role = labels["cluster_role"]
        series.append((selector("etcd_mvcc_db_total_size_in_bytes", labels), f"{size[role]}x40"))
        if role in quota:
            series.append((selector("etcd_server_quota_backend_bytes", labels), f"{quota[role]}x40"))
    return series


def member_alerts(plan: ClusterPlan, role: str, name: str, severities: list[str]) -> list[dict[str, Any]]:
    return [expected(plan, name, {"severity": s, "cluster_role": labels["cluster_role"],
                                  "instance": labels["instance"]})
            for labels in members(plan) if labels["cluster_role"] == role for s in severities]


def _quota_at_90_percent(plan: ClusterPlan, exported: bool) -> tuple[list[Series], list[Check]]:
    size = int(0.9 * 4 * GIB)  # 90% of events' 4 GiB, 45% of main's 8 GiB
    quota = {"main": 8 * GIB, "events": 4 * GIB} if exported else {}
    return etcd_series(plan, {"main": size, "events": size}, quota), [
        ("20m", "KilonodeEtcdDatabaseNearQuota",
         member_alerts(plan, "events", "KilonodeEtcdDatabaseNearQuota", ["warning", "critical"])),
        # the page waits its 5 minutes, the warning its 10
        ("3m", "KilonodeEtcdDatabaseNearQuota", []),
        ("7m", "KilonodeEtcdDatabaseNearQuota",
         member_alerts(plan, "events", "KilonodeEtcdDatabaseNearQuota", ["critical"])),
        ("20m", "KilonodeEtcdNoSpace", []),
        ("20m", "KilonodeEtcdQuotaNotAsPlanned", []),
    ]


@case(etcd=EVENTS_4GIB)
def etcd_events_at_90_percent_of_its_quota_exported(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    return _quota_at_90_percent(plan, exported=True)


@case(etcd=EVENTS_4GIB)
def etcd_events_at_90_percent_of_the_planned_quota(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    # members that do not export etcd_server_quota_backend_bytes: the plan's quota serves
    return _quota_at_90_percent(plan, exported=False)


@case(etcd=EVENTS_4GIB)
def etcd_events_at_75_percent(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    # above the 70% warning, below the 85% page
    size = {"main": GIB, "events": int(0.75 * 4 * GIB)}
    return etcd_series(plan, size, {"main": 8 * GIB, "events": 4 * GIB}), [
        ("20m", "KilonodeEtcdDatabaseNearQuota",
         member_alerts(plan, "events", "KilonodeEtcdDatabaseNearQuota", ["warning"])),
    ]


@case(etcd=EVENTS_4GIB)
def etcd_half_the_quota(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    size = {"main": 4 * GIB, "events": 2 * GIB}
    return etcd_series(plan, size, {"main": 8 * GIB, "events": 4 * GIB}), [
        ("30m", "KilonodeEtcdDatabaseNearQuota", []),
        ("30m", "KilonodeEtcdNoSpace", []),
        ("30m", "KilonodeEtcdQuotaNotAsPlanned", []),
    ]


@case(etcd=EVENTS_4GIB)
def etcd_events_members_run_etcds_default_quota(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    # the events members run etcd's 2 GiB default (the flag never reached them) and hold 1.9 GB:
    # 45% of the stack's 4 GiB, 89% of what etcd enforces
    size = {"main": GIB, "events": int(0.89 * 2 * GIB)}
    return etcd_series(plan, size, {"main": 8 * GIB, "events": 2 * GIB}), [
        ("20m", "KilonodeEtcdQuotaNotAsPlanned",
         member_alerts(plan, "events", "KilonodeEtcdQuotaNotAsPlanned", ["warning"])),
        ("10m", "KilonodeEtcdQuotaNotAsPlanned", []),  # waits its 15 minutes
        ("20m", "KilonodeEtcdDatabaseNearQuota",
         member_alerts(plan, "events", "KilonodeEtcdDatabaseNearQuota", ["warning", "critical"])),
    ]


@case()
def etcd_main_members_run_another_quota(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    # main's members report 4 GiB where the stack sets 8: the alert names main (its own rule)
    size = {"main": GIB, "events": GIB}
    return etcd_series(plan, size, {"main": 4 * GIB, "events": 8 * GIB}), [
        ("20m", "KilonodeEtcdQuotaNotAsPlanned",
         member_alerts(plan, "main", "KilonodeEtcdQuotaNotAsPlanned", ["warning"])),
        ("20m", "KilonodeEtcdDatabaseNearQuota", []),
    ]


def nospace(plan: ClusterPlan, role: str) -> list[dict[str, Any]]:
    """KilonodeEtcdNoSpace for the cluster `role`: one alert, the cluster's (the alarm is cluster-wide)."""
    return [expected(plan, "KilonodeEtcdNoSpace", {"severity": "critical", "cluster_role": role})]


@case(etcd=EVENTS_4GIB)
def etcd_events_at_its_quota(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    return etcd_series(plan, {"main": GIB, "events": 4 * GIB}, {}), [
        ("5m", "KilonodeEtcdNoSpace", nospace(plan, "events")),
    ]


@case(etcd=EVENTS_4GIB)
def etcd_one_events_member_within_the_largest_write(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    # etcd 3.5 (no alarm metric): one member 1 MiB short of its 4 GiB quota, the others 16 MiB
    # short. A 1.5 MiB write would be refused and arm NOSPACE for the whole cluster: one alert,
    # the cluster's, though no member is at 100%.
    series = etcd_series(plan, {"main": GIB, "events": 4 * GIB - 16 * 2**20}, {"main": 8 * GIB, "events": 4 * GIB})
    close = member_labels(plan, "events", 1)
    series = [(name, f"{4 * GIB - 2**20}x40") if name == selector("etcd_mvcc_db_total_size_in_bytes", close)
              else (name, values) for name, values in series]
    return series, [("5m", "KilonodeEtcdNoSpace", nospace(plan, "events"))]


@case(etcd=EVENTS_4GIB)
def etcd_events_two_writes_short_of_the_quota(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    # every events member 4 MiB short of its quota: two largest writes still fit, no NOSPACE yet
    # (the 85% page is already firing)
    series = etcd_series(plan, {"main": GIB, "events": 4 * GIB - 4 * 2**20}, {"main": 8 * GIB, "events": 4 * GIB})
    return series, [("20m", "KilonodeEtcdNoSpace", [])]


@case()
def etcd_nospace_alarm_metric(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    # etcd 3.6 reports the alarm itself: a member far below its quota (after a quota change, or
    # an alarm a restart kept) still takes no writes until `alarm disarm`; a CORRUPT alarm is
    # another alert's business
    member = member_labels(plan, "main", 1)
    other = member_labels(plan, "main", 2)
    series = [*etcd_series(plan, {"main": GIB, "events": GIB}, {"main": 8 * GIB, "events": 8 * GIB}),
              (selector("etcd_debugging_server_alarms", member | {"alarm_type": "NOSPACE"}), "0 0 1x20"),
              (selector("etcd_debugging_server_alarms", other | {"alarm_type": "CORRUPT"}), "1x22")]
    return series, [
        ("10m", "KilonodeEtcdNoSpace", nospace(plan, "main")),
        ("2m", "KilonodeEtcdNoSpace", []),
    ]


@case()
def etcd_no_alarm_far_from_the_quota(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    series = [*etcd_series(plan, {"main": 6 * GIB, "events": GIB}, {"main": 8 * GIB, "events": 8 * GIB}),
              *((selector("etcd_debugging_server_alarms", m | {"alarm_type": "NOSPACE"}), "0x30")
                for m in members(plan))]
    return series, [("20m", "KilonodeEtcdNoSpace", [])]


def grpc_series(labels: Mapping[str, str], code: str, per_minute: int) -> Series:
    call = {"grpc_service": "etcdserverpb.KV", "grpc_method": "Put", "grpc_type": "unary", "grpc_code": code}
    return selector("grpc_server_handled_total", {**labels, **call}), f"0+{per_minute}x30"


@case()
def etcd_rejecting_writes(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    # events-0 answers 30 puts a minute with ResourceExhausted (NOSPACE, or too many requests)
    events0, main0 = member_labels(plan, "events", 0), member_labels(plan, "main", 0)
    series = [grpc_series(events0, "ResourceExhausted", 30), grpc_series(events0, "OK", 600),
              grpc_series(main0, "OK", 600), grpc_series(main0, "ResourceExhausted", 0)]
    at = {"severity": "critical", "cluster_role": "events", "instance": events0["instance"]}
    return series, [("10m", "KilonodeEtcdRejectingWrites", [expected(plan, "KilonodeEtcdRejectingWrites", at)])]


@case()
def etcd_answering_every_request(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    # the counter exists (one refusal long ago, before the range) but does not move
    series = [grpc_series(m, "OK", 600) for m in members(plan)]
    series += [(grpc_series(m, "ResourceExhausted", 0)[0], "0 1x30") for m in members(plan)]
    return series, [("20m", "KilonodeEtcdRejectingWrites", [])]


# etcd's fsync and commit histograms: prometheus.ExponentialBuckets(0.001, 2, 14) (server/wal/metrics.go,
# server/mvcc/backend/metrics.go at v3.5.33): 1 ms .. 8.192 s, then +Inf.
BUCKETS = [0.001 * 2**i for i in range(14)]


def histogram(metric: str, labels: Mapping[str, str], upper: float, per_minute: int = 6000) -> list[Series]:
    """Every observation in the bucket that ends at `upper`: p99 = lower + 0.99 x (upper - lower)."""
    assert upper in BUCKETS
    return [(selector(f"{metric}_bucket", {**labels, "le": f"{le:g}"}), f"0+{per_minute if le >= upper else 0}x30")
            for le in BUCKETS] + [(selector(f"{metric}_bucket", {**labels, "le": "+Inf"}), f"0+{per_minute}x30")]


WAL = "etcd_disk_wal_fsync_duration_seconds"
COMMIT = "etcd_disk_backend_commit_duration_seconds"


def disk_case(plan: ClusterPlan, metric: str, slow_upper: float, healthy_upper: float,
              name: str, severities: list[str]) -> tuple[list[Series], list[Check]]:
    """main-1 in the bucket ending at slow_upper, every other member in healthy_upper's."""
    slow = member_labels(plan, "main", 1)
    series = [s for m in members(plan) for s in histogram(metric, m, slow_upper if m == slow else healthy_upper)]
    fired = [expected(plan, name, {"severity": s, "cluster_role": "main", "instance": slow["instance"]})
             for s in severities]
    return series, [("20m", name, fired), ("8m", name, [])]


@case()
def etcd_wal_fsync_above_10ms(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    # p99 15.9 ms on main-1 (bucket 8-16 ms), 7.96 ms on the others (4-8 ms): a warning for main-1
    return disk_case(plan, WAL, 0.016, 0.008, "KilonodeEtcdSlowWalFsync", ["warning"])


@case()
def etcd_wal_fsync_above_a_second(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    # p99 1.019 s (bucket 0.512-1.024 s): past the election timeout, both severities
    return disk_case(plan, WAL, 1.024, 0.008, "KilonodeEtcdSlowWalFsync", ["warning", "critical"])


@case()
def etcd_healthy_disks(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    # p99 fsync 7.96 ms (below 10) and commit 15.9 ms (below 25) everywhere
    series = [s for m in members(plan) for s in histogram(WAL, m, 0.008) + histogram(COMMIT, m, 0.016)]
    return series, [("20m", "KilonodeEtcdSlowWalFsync", []), ("20m", "KilonodeEtcdSlowBackendCommit", [])]


@case()
def etcd_backend_commit_above_25ms(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    # p99 31.8 ms on main-1 (bucket 16-32 ms), 15.9 ms on the others
    return disk_case(plan, COMMIT, 0.032, 0.016, "KilonodeEtcdSlowBackendCommit", ["warning"])


def leader_changes(plan: ClusterPlan, every_minutes: int) -> list[Series]:
    """Every main member sees a new leader every `every_minutes` (the counter as each member keeps it)."""
    values = " ".join(str(minute // every_minutes) for minute in range(41))
    return [(selector("etcd_server_leader_changes_seen_total", m), values)
            for m in members(plan) if m["cluster_role"] == "main"]


@case()
def etcd_leader_every_three_minutes(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    # five elections in 15 minutes, four needed
    at = {"severity": "warning", "cluster_role": "main"}
    return leader_changes(plan, 3), [("30m", "KilonodeEtcdLeaderChanges", [expected(plan,
                                                                               "KilonodeEtcdLeaderChanges", at)])]


@case()
def etcd_leader_every_five_minutes(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    # three elections in 15 minutes (increase() extrapolates them to 3.2): below four
    return leader_changes(plan, 5), [("30m", "KilonodeEtcdLeaderChanges", [])]


@case()
def etcd_member_without_a_leader(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    lost = member_labels(plan, "events", 2)
    series = [(selector("etcd_server_has_leader", m), "0x20" if m == lost else "1x20") for m in members(plan)]
    at = {"severity": "critical", "cluster_role": "events", "instance": lost["instance"]}
    return series, [("5m", "KilonodeEtcdNoLeader", [expected(plan, "KilonodeEtcdNoLeader", at)]),
                    ("0m", "KilonodeEtcdNoLeader", [])]


@case()
def etcd_an_election_shorter_than_a_minute(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    # one scrape without a leader (a 2 s election, field notes) is no alert: `for: 1m`
    series = [(selector("etcd_server_has_leader", m), "1 1 1 0 1x20") for m in members(plan)]
    return series, [("4m", "KilonodeEtcdNoLeader", []), ("10m", "KilonodeEtcdNoLeader", [])]


# --- scrape targets ------------------------------------------------------------------------------------
@case()
def a_control_plane_target_down(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    down = member_labels(plan, "events", 0)
    apiserver = {"job": monitoring.JOB_APISERVER,
                 "instance": f"{plan.control_plane.instances[0].ip}:{wellknown.APISERVER_PORT}"}
    series = [(selector("up", down), "0x30"), (selector("up", apiserver), "1x30"),
              # a kubelet down is a NotReady node, not a monitoring failure: not this alert's
              (selector("up", {"job": monitoring.JOB_KUBELET, "instance": "10.1.0.4:10250"}), "0x30")]
    return series, [("15m", "KilonodeScrapeTargetDown", [expected(plan, "KilonodeScrapeTargetDown",
                                                                  {"severity": "warning", **down})]),
                    ("5m", "KilonodeScrapeTargetDown", [])]


@case()
def every_target_up(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    series = [(selector("up", m), "1x30") for m in members(plan)]
    # a target that missed a few scrapes (a restart) and came back
    series.append((selector("up", {"job": monitoring.JOB_CERTIFICATES, "instance": "10.0.1.10:9101"}),
                   "1 0 0 0 0 1x25"))
    return series, [("20m", "KilonodeScrapeTargetDown", [])]


# --- kube-scheduler and kube-controller-manager ----------------------------------------------------------
CONTROLLERS = {
    "scheduler": (monitoring.JOB_SCHEDULER, monitoring.SCHEDULER_LEASE, wellknown.SCHEDULER_PORT,
                  "KilonodeSchedulerNoLeader"),
    "controller-manager": (monitoring.JOB_CONTROLLER_MANAGER, monitoring.CONTROLLER_MANAGER_LEASE,
                           wellknown.CONTROLLER_MANAGER_PORT, "KilonodeControllerManagerNoLeader"),
}


def controller_targets(plan: ClusterPlan, which: str) -> list[dict[str, str]]:
    job, _, port, _ = CONTROLLERS[which]
    return [{"job": job, "instance": f"{i.ip}:{port}"} for i in plan.control_plane.instances]


def controller_series(plan: ClusterPlan, which: str, up: str, leading: dict[int, str]) -> list[Series]:
    """Every apiserver VM's `which` at `up`; leader_election_master_status for its lease 0 on every
    target, except the values `leading` gives by target index (an empty string: no such series)."""
    _, lease, _, _ = CONTROLLERS[which]
    series = []
    for index, target in enumerate(controller_targets(plan, which)):
        series.append((selector("up", target), up))
        status = leading.get(index, "0x30")
        if status:
            series.append((selector("leader_election_master_status", {**target, "name": lease}), status))
    return series


@case(stack="research-7500")
def the_leases_change_hands(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    # apiserver-0's scheduler and controller manager lead for 10 minutes, then stop (a `pulumi up`
    # replaces the VM); apiserver-1's take over one scrape later: a hand-over, no alert
    series = [*controller_series(plan, "scheduler", "1x30", {0: "1x9 0x20", 1: "0x10 1x19"}),
              *controller_series(plan, "controller-manager", "1x30", {0: "1x9 0x20", 1: "0x10 1x19"})]
    return series, [("20m", "KilonodeSchedulerNoLeader", []), ("20m", "KilonodeControllerManagerNoLeader", []),
                    ("20m", "KilonodeScrapeTargetDown", [])]


@case(stack="research-7500")
def every_scheduler_up_and_none_leading(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    # all five answer, none holds the lease (they cannot renew it): nothing schedules
    series = [*controller_series(plan, "scheduler", "1x30", {}),
              *controller_series(plan, "controller-manager", "1x30", {2: "1x30"})]
    fires = [expected(plan, "KilonodeSchedulerNoLeader", {"severity": "critical"})]
    return series, [("10m", "KilonodeSchedulerNoLeader", fires), ("3m", "KilonodeSchedulerNoLeader", []),
                    ("10m", "KilonodeControllerManagerNoLeader", [])]


@case(stack="research-7500")
def every_controller_manager_unreachable(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    # Prometheus reaches none of them (the processes down, or the security group closed): no
    # leader series at all; each target is down as well
    none = dict.fromkeys(range(len(plan.control_plane.instances)), "")
    series = [*controller_series(plan, "controller-manager", "0x30", none),
              *controller_series(plan, "scheduler", "1x30", {4: "1x30"})]
    down = [expected(plan, "KilonodeScrapeTargetDown", {"severity": "warning", **target})
            for target in controller_targets(plan, "controller-manager")]
    return series, [
        ("10m", "KilonodeControllerManagerNoLeader",
         [expected(plan, "KilonodeControllerManagerNoLeader", {"severity": "critical"})]),
        ("10m", "KilonodeSchedulerNoLeader", []),
        ("15m", "KilonodeScrapeTargetDown", down),
    ]


@case()
def a_prometheus_that_does_not_scrape_the_controllers(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    # the rule file loaded by a Prometheus without these jobs (a user's own): no target, no alert
    apiserver = {"job": monitoring.JOB_APISERVER,
                 "instance": f"{plan.control_plane.instances[0].ip}:{wellknown.APISERVER_PORT}"}
    return [(selector("up", apiserver), "1x30")], [("20m", "KilonodeSchedulerNoLeader", []),
                                                   ("20m", "KilonodeControllerManagerNoLeader", [])]


# --- certificates --------------------------------------------------------------------------------------
def cert_series(host: str, path: str, days_left_at_2h: float) -> Series:
    # promtool's clock starts at 0: time() at eval time 2h is 7200
    not_after = int(7200 + days_left_at_2h * DAY)
    return (f'kilonode_certificate_not_after_seconds{{job="{monitoring.JOB_CERTIFICATES}",host="{host}",'
            f'path="{path}",index="0"}}', f"{not_after}x180")


def cert_alert(plan: ClusterPlan, host: str, path: str, severity: str) -> dict[str, Any]:
    labels = {"severity": severity, "job": monitoring.JOB_CERTIFICATES, "host": host, "path": path, "index": "0"}
    return expected(plan, "KilonodeCertificateExpiresSoon", labels)


SERVER = "/etc/etcd/pki/server.crt"
APISERVER = "/etc/kubernetes/pki/apiserver.crt"


@case()
def certificate_in_its_last_fortnight(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    series = [cert_series("etcd-main-0", SERVER, 100), cert_series("apiserver-0", APISERVER, 10)]
    return series, [
        ("2h", "KilonodeCertificateExpiresSoon", [cert_alert(plan, "apiserver-0", APISERVER, "warning"),
                                                  cert_alert(plan, "apiserver-0", APISERVER, "critical")]),
        # the warning waits its hour, the critical its 10 minutes
        ("30m", "KilonodeCertificateExpiresSoon", [cert_alert(plan, "apiserver-0", APISERVER, "critical")]),
        ("5m", "KilonodeCertificateExpiresSoon", []),
        ("2h", "KilonodeCertificateUnreadable", []),
    ]


@case()
def certificate_with_40_days_left(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    # inside the 45-day warning, outside the 14-day page
    series = [cert_series("etcd-main-0", SERVER, 100), cert_series("etcd-main-1", SERVER, 40)]
    return series, [("2h", "KilonodeCertificateExpiresSoon", [cert_alert(plan, "etcd-main-1", SERVER, "warning")])]


@case()
def certificates_with_50_days_left_or_more(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    series = [cert_series("etcd-main-0", SERVER, 50), cert_series("apiserver-0", APISERVER, 300)]
    return series, [("2h", "KilonodeCertificateExpiresSoon", [])]


@case()
def certificate_unreadable(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    job = f'job="{monitoring.JOB_CERTIFICATES}"'
    series = [(f'kilonode_certificate_unreadable{{{job},host="etcd-events-2",path="/etc/etcd/pki/peer.crt",'
               'error="FileNotFoundError"}', "1x60"),
              cert_series("etcd-events-1", "/etc/etcd/pki/peer.crt", 300)]
    labels = {"severity": "warning", "host": "etcd-events-2", "path": "/etc/etcd/pki/peer.crt"}
    return series, [
        ("40m", "KilonodeCertificateUnreadable", [expected(plan, "KilonodeCertificateUnreadable", labels)]),
        ("20m", "KilonodeCertificateUnreadable", []),
        ("40m", "KilonodeCertificateExpiresSoon", []),
    ]


@case()
def certificate_unreadable_for_ten_minutes_then_fixed(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    # the exporter writes the series only while the file is broken: it goes stale when fixed
    job = f'job="{monitoring.JOB_CERTIFICATES}"'
    series = [(f'kilonode_certificate_unreadable{{{job},host="apiserver-1",path="{APISERVER}",'
               'error="ValueError"}', "1x10 stale"),
              cert_series("apiserver-1", APISERVER, 300)]
    return series, [("50m", "KilonodeCertificateUnreadable", [])]


# --- GPU pools -----------------------------------------------------------------------------------------
def gpu_node_series(pool: str, nodes: int, tainted: int, prefix: str, samples: int = 50) -> list[Series]:
    series = []
    for i in range(nodes):
        node = f'node="{prefix}-{i}"'
        series += [
            (f'kube_node_labels{{job="{monitoring.JOB_KUBE_STATE_METRICS}",{node},label_kilonode_io_pool="{pool}"}}',
             f"1x{samples}"),
            (f'kube_node_info{{{node}}}', f"1x{samples}"),
            (f'kube_node_status_condition{{{node},condition="{protocol.CONDITION}",status="true"}}',
             f"0x{samples}" if i < tainted else f"1x{samples}"),
        ]
        if i < tainted:
            series.append((f'kube_node_spec_taint{{{node},key="{protocol.FAULT_TAINT}",value="EccVolatile",'
                           f'effect="{protocol.EFFECT}"}}', f"1x{samples}"))
    return series


@case(stack="research-7500")
def gpu_nodes_tainted_in_two_pools(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    series = (
        gpu_node_series("a100-ib", 40, 1, "a")  # 2.5%: a warning
        + gpu_node_series("h100-ib", 4, 1, "h")  # 25%: a page as well
        # other taints, and nodes outside the GPU pools, count for nothing
        + [('kube_node_spec_taint{node="a-5",key="kilonode.io/gpu-check",value="running",effect="NoSchedule"}',
            "1x50"),
           ('kube_node_labels{node="c-0",label_kilonode_io_pool="cpu"}', "1x50"),
           (f'kube_node_spec_taint{{node="c-0",key="{protocol.FAULT_TAINT}",value="x",effect="NoSchedule"}}',
            "1x50")]
    )
    return series, [
        ("20m", "KilonodeGpuNodesUnhealthy", [
            expected(plan, "KilonodeGpuNodesUnhealthy", {"severity": "warning", "pool": "a100-ib"}),
            expected(plan, "KilonodeGpuNodesUnhealthy", {"severity": "warning", "pool": "h100-ib"}),
        ]),
        ("20m", "KilonodeGpuPoolDegraded", [
            expected(plan, "KilonodeGpuPoolDegraded", {"severity": "critical", "pool": "h100-ib"})]),
        # before its 15 minutes the warning waits
        ("10m", "KilonodeGpuNodesUnhealthy", []),
        ("40m", "KilonodeGpuHealthNotReported", []),
        ("40m", "KilonodeGpuHealthPending", []),
        ("40m", "KilonodePoolLabelNotExported", []),
    ]


@case(stack="research-7500")
def gpu_one_node_in_forty_tainted(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    # 2.5% of the pool: work for a person, below the 5% that points to a common cause
    return gpu_node_series("a100-ib", 40, 1, "a"), [
        ("20m", "KilonodeGpuNodesUnhealthy", [expected(plan, "KilonodeGpuNodesUnhealthy",
                                                       {"severity": "warning", "pool": "a100-ib"})]),
        ("20m", "KilonodeGpuPoolDegraded", []),
    ]


@case(stack="research-7500")
def gpu_healthy_pool(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    return gpu_node_series("a100-ib", 10, 0, "a"), [
        ("40m", "KilonodeGpuNodesUnhealthy", []),
        ("40m", "KilonodeGpuPoolDegraded", []),
        ("40m", "KilonodeGpuHealthNotReported", []),
        ("40m", "KilonodePoolLabelNotExported", []),
    ]


@case(stack="research-7500")
def gpu_pool_label_not_exported(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    series = [('kube_node_labels{node="n-0"}', "1x50"), ('kube_node_info{node="n-0"}', "1x50")]
    return series, [
        ("40m", "KilonodePoolLabelNotExported", [expected(plan, "KilonodePoolLabelNotExported",
                                                          {"severity": "warning"})]),
        ("20m", "KilonodePoolLabelNotExported", []),
    ]


@case(stack="research-7500")
def gpu_agent_not_reporting(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    # a GPU-pool node with no GPUHealthy condition at all
    series = [('kube_node_labels{node="a-0",label_kilonode_io_pool="a100-ib"}', "1x50")]
    return series, [
        ("40m", "KilonodeGpuHealthNotReported", [expected(plan, "KilonodeGpuHealthNotReported",
                                                          {"severity": "warning", "pool": "a100-ib"})]),
    ]


def startup_taint(node: str, values: str) -> Series:
    return (f'kube_node_spec_taint{{node="{node}",key="{protocol.STARTUP_TAINT}",value="{protocol.STARTUP_VALUE}",'
            f'effect="{protocol.EFFECT}"}}', values)


@case(stack="research-7500")
def gpu_node_never_passing_its_first_check(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    # h-0 still pending after 90 minutes; h-1 passed its checks after 20 (the taint went away)
    series = [*gpu_node_series("h100-ib", 2, 0, "h", samples=100),
              startup_taint("h-0", "1x100"), startup_taint("h-1", "1x20 stale")]
    return series, [
        ("90m", "KilonodeGpuHealthPending", [expected(plan, "KilonodeGpuHealthPending",
                                                      {"severity": "warning", "pool": "h100-ib"})]),
        ("50m", "KilonodeGpuHealthPending", []),  # under its hour
    ]


@case(stack="research-7500")
def gpu_nodes_passing_their_first_check_within_the_hour(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    # a slow first check (50 minutes of active GPU tests) is not an alert
    series = [*gpu_node_series("h100-ib", 2, 0, "h", samples=100),
              startup_taint("h-0", "1x50 stale"), startup_taint("h-1", "1x10 stale")]
    return series, [("90m", "KilonodeGpuHealthPending", [])]


# --- the GPU health agent and taint controller (their own metrics) -------------------------------------
def agent_labels(node: str, pool: str = "h100-ib") -> dict[str, str]:
    return {"job": monitoring.JOB_GPU_HEALTH_AGENT, "instance": f"{node}:{wellknown.GPU_HEALTH_AGENT_METRICS_PORT}",
            "node": node, "pool": pool}


def agent_series(node: str, passive: str | None = "0+60x200", readable: str = "1x200", report: str | None = "0+60x200",
                 up: str = "1x200", ready: str = "1x200") -> list[Series]:
    """One GPU node's agent series. Timestamps in promtool's notation: "0+60x200" is a check (or a
    report) every minute, the value the time it was sampled at; a constant is one that stopped."""
    labels = agent_labels(node)
    series = [(selector("kilonode_gpu_health_state_readable", labels), readable),
              (selector("kilonode_gpu_health_first_start_timestamp_seconds", labels), "0x200"),
              (selector("up", labels), up),
              (f'kube_node_status_condition{{node="{node}",condition="Ready",status="true"}}', ready)]
    if passive is not None:
        series.append((selector("kilonode_gpu_health_last_check_timestamp_seconds", {**labels, "check": "passive"}),
                       passive))
    if report is not None:
        series.append((selector("kilonode_gpu_health_last_report_timestamp_seconds", labels), report))
    return series


def agent_alert(plan: ClusterPlan, name: str, node: str) -> dict[str, Any]:
    return expected(plan, name, {"severity": "warning", "node": node, "pool": "h100-ib"})


@case(stack="research-7500")
def gpu_health_agents_checking_and_reporting(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    # passive checks every minute here (every 5 in life), reports every hour; a node down is NotReady,
    # not the agent's alert
    series = [*agent_series("h-0"), *agent_series("h-1", report="0x60 3600x60 7200x80"),
              *agent_series("h-2", up="0x200", ready="0x200")]
    return series, [("40m", "KilonodeGpuHealthAgentStale", []), ("150m", "KilonodeGpuHealthAgentStale", []),
                    ("150m", "KilonodeGpuHealthAgentCannotReport", [])]


@case(stack="research-7500")
def gpu_health_agents_stopped_checking_or_unseen(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    stale = "KilonodeGpuHealthAgentStale"
    series = [
        *agent_series("h-0", passive="0+60x5 300x60"),  # the last passive check at 5m: 900 s stale at 20m
        *agent_series("h-1", passive=None, readable="0x60", report=None),  # its record unreadable
        *agent_series("h-2", passive=None),  # started at 0, never a passive check
        # a Ready node whose endpoint does not answer: a failed scrape leaves `up` alone
        *[s for s in agent_series("h-3", up="0x60") if s[0].startswith(("up", "kube_node"))],
        *agent_series("h-4"),  # checking every minute
    ]
    return series, [
        ("30m", stale, [agent_alert(plan, stale, n) for n in ("h-0", "h-1", "h-2", "h-3")]),
        # 20m: h-0 has just reached 15 minutes and h-2 too: pending; h-1 and h-3 fire after their 5m
        ("20m", stale, [agent_alert(plan, stale, n) for n in ("h-1", "h-3")]),
        ("4m", stale, []),
    ]


@case(stack="research-7500")
def gpu_health_agents_that_cannot_report(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    name = "KilonodeGpuHealthAgentCannotReport"
    series = [*agent_series("h-0", report="0x200"),  # its one report at 0: two hours ago at 120m
              *agent_series("h-1", report=None),  # checking, never reported in this boot
              *agent_series("h-2")]
    return series, [
        ("140m", name, [agent_alert(plan, name, "h-0"), agent_alert(plan, name, "h-1")]),
        ("125m", name, []),  # past the two hours, within the 10m
        ("140m", "KilonodeGpuHealthAgentStale", []),
    ]


def gpu_controller_series(host: str, sync: str | None = "0+60x60", readable: str = "1x60",
                      up: str = "1x60") -> list[Series]:
    labels = {"job": monitoring.JOB_GPU_HEALTH_CONTROLLER,
              "instance": f"{host}:{wellknown.GPU_HEALTH_CONTROLLER_METRICS_PORT}", "host": host}
    series = [(selector("kilonode_gpu_health_controller_state_readable", labels), readable),
              (selector("kilonode_gpu_health_controller_start_timestamp_seconds", labels), "0x60"),
              (selector("up", labels), up)]
    if sync is not None:
        series.append((selector("kilonode_gpu_health_controller_last_sync_timestamp_seconds", labels), sync))
    return series


def apiservers(plan: ClusterPlan) -> list[str]:
    return [i.name for i in plan.control_plane.instances]


@case(stack="research-7500")
def gpu_health_controllers_syncing(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    series = [s for host in apiservers(plan) for s in gpu_controller_series(host)]
    # one that missed a few scrapes (a restart) and came back
    series += gpu_controller_series("apiserver-9", sync="0+60x5 300x4 540+60x50", up="1x5 0x4 1x50")
    return series, [("40m", "KilonodeGpuHealthControllerStale", []),
                    ("40m", "KilonodeGpuHealthControllerNotSyncing", [])]


@case(stack="research-7500")
def gpu_health_controllers_failing_one_by_one(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    name = "KilonodeGpuHealthControllerStale"
    hosts = apiservers(plan)
    series = [*gpu_controller_series(hosts[0], sync="60x60"),  # stuck since 1m: 600 s stale at 11m
              *gpu_controller_series(hosts[1], sync=None, readable="0x60"),  # stopped: its record gone
              *gpu_controller_series(hosts[2], sync="0+60x20", up="1x20 0x40"),  # unreachable from 20m
              *gpu_controller_series(hosts[3], sync=None),  # started, never synced
              *gpu_controller_series(hosts[4])]
    alert = lambda host: expected(plan, name, {"severity": "warning", "host": host})  # noqa: E731
    return series, [
        ("45m", name, [alert(h) for h in hosts[:4]]),
        ("15m", name, [alert(hosts[1])]),  # the others still pending
        # one controller still syncing: the cluster's taints are still kept
        ("45m", "KilonodeGpuHealthControllerNotSyncing", []),
    ]


@case(stack="research-7500")
def gpu_health_no_controller_syncing(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    name = "KilonodeGpuHealthControllerNotSyncing"
    series = [s for host in apiservers(plan) for s in gpu_controller_series(host, sync="60x60")]
    return series, [
        ("30m", name, [expected(plan, name, {"severity": "critical"})]),
        ("10m", name, []),  # 540 s since the last sync: not yet
    ]


@case(stack="research-7500")
def gpu_health_no_controller_seen(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    # no sync series at all: every controller stopped, or Prometheus cannot reach any
    name = "KilonodeGpuHealthControllerNotSyncing"
    series = [s for host in apiservers(plan) for s in gpu_controller_series(host, sync=None, readable="0x60")]
    return series, [("20m", name, [expected(plan, name, {"severity": "critical",
                                                         "job": monitoring.JOB_GPU_HEALTH_CONTROLLER})])]


# --- cluster-autoscaler ------------------------------------------------------------------------------------------
def autoscaler_series(up: str | None) -> list[Series]:
    """Two replicas' `up` (the leader and a standby answer alike), or none at all (scaled to 0: no target)."""
    if up is None:
        return [(selector("up", {"job": monitoring.JOB_APISERVER, "instance": "10.0.1.4:6443"}), "1x200")]
    return [(selector("up", {"job": monitoring.JOB_AUTOSCALER, "instance": f"10.1.0.{n}:8085",
                             "pod": f"cluster-autoscaler-{n}"}), up) for n in (7, 8)]


@case(stack="research-7500")
def autoscaler_left_paused(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    name = "KilonodeAutoscalerNotRunning"
    return autoscaler_series(None), [("150m", name, [expected(plan, name, {"severity": "warning"})]),
                                     ("60m", name, [])]  # a `pulumi up`'s pause: not yet


@case(stack="research-7500")
def autoscaler_paused_for_a_run_and_back(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    # both replicas answer, stop for a 50-minute run (scaled to 0: the series end), and come back
    up = "1x20 _x50 1x130"
    return autoscaler_series(up), [("60m", "KilonodeAutoscalerNotRunning", []),
                                   ("180m", "KilonodeAutoscalerNotRunning", [])]


# --- exporters: dcgm-exporter's GPUs and node-exporter's InfiniBand ports -------------------------------
def gpu_labels(plan: ClusterPlan, gpu: int) -> dict[str, str]:
    """One GPU of a node of the first GPU pool, as the dcgm-exporter job labels it."""
    return {"node": "a100-ib-000000", "pool": plan.gpu_pools[0].name, "gpu": str(gpu), "UUID": f"GPU-000{gpu}"}


def dcgm(plan: ClusterPlan, field: str, gpu: int, values: str) -> Series:
    # a pod holds the GPU: dcgm-exporter adds its labels (the rules aggregate them away)
    return (selector(field, {"job": monitoring.JOB_DCGM_EXPORTER, **gpu_labels(plan, gpu), "pod": "train-0",
                             "namespace": "team-a", "container": "main"}), values)


def ib_labels(plan: ClusterPlan, hca: int) -> dict[str, str]:
    pool = next(p.name for p in plan.node_pools if p.infiniband)
    return {"node": f"{pool}-000000", "pool": pool, "device": f"mlx5_ib{hca}", "port": "1"}


def ib(plan: ClusterPlan, field: str, hca: int, values: str) -> Series:
    return (selector(field, {"job": monitoring.JOB_NODE_EXPORTER, **ib_labels(plan, hca)}), values)


def gpu_alert(plan: ClusterPlan, name: str, gpu: int) -> dict[str, Any]:
    return expected(plan, name, {"severity": "warning", **gpu_labels(plan, gpu)})


@case(stack="research-7500")
def a_gpu_reports_a_node_level_xid_and_another_an_application_xid(plan: ClusterPlan) -> tuple[list[Series],
                                                                                                 list[Check]]:
    # GPU 1's last Xid is 13 (a graphics exception: the application's) all along; GPU 0 falls off
    # the bus (Xid 79, RESTART_BM in NVIDIA's catalogue) at minute 10
    name = "KilonodeGpuXidError"
    series = [dcgm(plan, "DCGM_FI_DEV_XID_ERRORS", 0, "0x10 79x20"), dcgm(plan, "DCGM_FI_DEV_XID_ERRORS", 1, "13x30")]
    return series, [("8m", name, []), ("15m", name, [gpu_alert(plan, name, 0)])]


@case(stack="research-7500")
def a_gpu_counts_an_uncorrectable_ecc_error(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    name = "KilonodeGpuUncorrectableEcc"
    series = [dcgm(plan, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", 0, "0x10 2x20"),
              dcgm(plan, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", 1, "0x30"),
              dcgm(plan, "DCGM_FI_DEV_ROW_REMAP_FAILURE", 0, "0x30"),
              dcgm(plan, "DCGM_FI_DEV_ROW_REMAP_FAILURE", 1, "0x30")]
    return series, [("8m", name, []), ("15m", name, [gpu_alert(plan, name, 0)])]


@case(stack="research-7500")
def nvlink_replays_keep_rising_on_one_gpu(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    # GPU 0's replay counter climbs from minute 30 (5 a minute); GPU 1's CRC count stays at 3
    name = "KilonodeGpuNvlinkErrors"
    series = [dcgm(plan, "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", 0, "3x30 3+5x30"),
              dcgm(plan, "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", 1, "3x60")]
    return series, [("25m", name, []), ("40m", name, []),  # rising, not yet for 15 minutes
                    ("55m", name, [gpu_alert(plan, name, 0)])]


@case(stack="research-7500")
def one_gpu_is_slowed_for_heat_a_third_of_the_time(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    # GPU 0: 20 s of every minute thermally slowed from minute 30 (33%); GPU 1: 1 s a minute (1.7%)
    name = "KilonodeGpuThermalThrottling"
    series = [dcgm(plan, "DCGM_FI_DEV_THERMAL_VIOLATION", 0, "0x30 0+20000000000x30"),
              dcgm(plan, "DCGM_FI_DEV_THERMAL_VIOLATION", 1, "0+1000000000x60")]
    return series, [("25m", name, []), ("55m", name, [gpu_alert(plan, name, 0)])]


@case(stack="research-7500")
def an_infiniband_port_goes_down(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    name = "KilonodeInfinibandPortDown"
    series = [ib(plan, "node_infiniband_state_id", 0, "4x20 1x20"), ib(plan, "node_infiniband_state_id", 1, "4x40")]
    return series, [("15m", name, []),
                    ("30m", name, [expected(plan, name, {"severity": "warning", **ib_labels(plan, 0)})])]


@case(stack="research-7500")
def an_infiniband_link_goes_down_and_back(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    # port 0 counts one link-down at minute 10 and is ACTIVE again (a flap); port 1 never
    name = "KilonodeInfinibandLinkFlapping"
    series = [ib(plan, "node_infiniband_link_downed_total", 0, "0x10 1x30"),
              ib(plan, "node_infiniband_link_downed_total", 1, "0x40")]
    return series, [("8m", name, []),
                    ("15m", name, [expected(plan, name, {"severity": "warning", **ib_labels(plan, 0)})]),
                    ("45m", name, [])]  # 30 minutes on: no flap since


# --- per-node exporters ------------------------------------------------------------------------------------------
def exporter_targets(job: str, down: int, total: int = 20) -> list[Series]:
    """`total` targets of `job`, the first `down` of them down from minute 5."""
    return [(selector("up", {"job": job, "instance": f"10.1.{i // 250}.{i % 250 + 4}:9100"}),
             "1x5 0x40" if i < down else "1x45") for i in range(total)]


@case()
def node_exporters_down_on_many_nodes(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    name = "KilonodeNodeExportersDown"
    job = monitoring.JOB_NODE_EXPORTER
    return exporter_targets(job, 3), [
        ("30m", name, [expected(plan, name, {"severity": "warning", "job": job})]),
        ("15m", name, []),  # down 10 minutes: not yet
    ]


@case()
def one_node_exporter_down_is_a_node_not_an_exporter(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    # 1 of 20 (5%) is not more than the share: a NotReady node's story
    return exporter_targets(monitoring.JOB_NODE_EXPORTER, 1), [("30m", "KilonodeNodeExportersDown", [])]


# --- Alertmanager (kilonode.k8s.alertmanager) -------------------------------------------------------------------
def alertmanager_up(values: str) -> list[Series]:
    return [(selector("up", {"job": monitoring.JOB_ALERTMANAGER, "instance": monitoring.ALERTMANAGER_ADDRESS}), values)]


@case()
def alertmanager_stops_answering(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    name = "KilonodeAlertmanagerDown"
    labels = {"severity": "critical", "job": monitoring.JOB_ALERTMANAGER, "instance": monitoring.ALERTMANAGER_ADDRESS}
    return alertmanager_up("1x5 0x40"), [("30m", name, [expected(plan, name, labels)]),
                                          ("12m", name, [])]  # down 7 minutes: a restart, not yet


@case()
def alertmanager_never_scraped(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    # no target at all (its Service gone, or the job dropped): absent(up) fires with the job's label alone
    name = "KilonodeAlertmanagerDown"
    other = [(selector("up", {"job": monitoring.JOB_APISERVER, "instance": "10.0.1.4:6443"}), "1x40")]
    return other, [("30m", name, [expected(plan, name, {"severity": "critical", "job": monitoring.JOB_ALERTMANAGER})])]


@case()
def alertmanager_answering(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    return alertmanager_up("1x60"), [("60m", "KilonodeAlertmanagerDown", [])]


def notifications_failed(values: str) -> list[Series]:
    failed = selector("alertmanager_notifications_failed_total", {
        "job": monitoring.JOB_ALERTMANAGER, "instance": monitoring.ALERTMANAGER_ADDRESS, "integration": "pagerduty",
        "reason": "authError"})
    return [*alertmanager_up("1x60"), (failed, values)]


@case()
def alertmanager_pagerduty_keeps_refusing(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    # a revoked routing key: every notification fails, one a minute from minute 5
    name = "KilonodeAlertmanagerNotificationsFailing"
    return notifications_failed("0x5 1+1x55"), [
        ("40m", name, [expected(plan, name, {"severity": "critical", "integration": "pagerduty"})]),
        ("15m", name, []),  # failing 10 minutes: not yet
    ]


@case()
def alertmanager_one_failed_notification(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    # one send failed once (PagerDuty's 5xx for a minute): true for 10 minutes, under the 15 of `for:`
    name = "KilonodeAlertmanagerNotificationsFailing"
    return notifications_failed("0x5 1x55"), [("14m", name, []), ("20m", name, []), ("40m", name, [])]


# --- the dead man's switch -------------------------------------------------------------------------------------
def prometheus_self_up(values: str) -> list[Series]:
    return [(selector("up", {"job": monitoring.JOB_PROMETHEUS, "instance": "localhost:9090"}), values)]


@case()
def watchdog_fires_while_prometheus_scrapes_itself(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    name = "KilonodeWatchdog"
    labels = {"severity": "none", "job": monitoring.JOB_PROMETHEUS, "instance": "localhost:9090"}
    return prometheus_self_up("1x30"), [("1m", name, [expected(plan, name, labels)]),
                                        ("25m", name, [expected(plan, name, labels)])]


@case()
def watchdog_stops_when_prometheus_cannot_scrape_itself(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    # its own scrape failing: the heartbeat stops and the outside monitor alarms
    return prometheus_self_up("0x30"), [("20m", "KilonodeWatchdog", [])]

# The DNS, conntrack and Prometheus-itself cases, and the on-call trace's (GPU verdict and power, InfiniBand sizes,
# etcd compaction, node basics), register themselves into CASES.
from tests.monitoring import alert_cases_data_plane, alert_cases_observability, alert_cases_trace  # noqa: E402,F401
