"""promtool cases for the DNS, conntrack and Prometheus-itself alerts (kilonode.render.monitoring dns_group,
conntrack_alerts, prometheus_group), registered into tests/monitoring/alert_cases.py's CASES (imported at
its end), so test_alert_cases.py runs them and counts them for its firing-and-quiet coverage."""

from __future__ import annotations

from kilonode.plan import ClusterPlan
from kilonode.render import monitoring
from tests.monitoring.alert_cases import Check, Series, case, expected

COREDNS = f'job="{monitoring.JOB_COREDNS}"'
NODE = f'job="{monitoring.JOB_NODE_EXPORTER}",node="pool-a-000001",pool="a"'
SELF = f'job="{monitoring.JOB_PROMETHEUS}"'
UPSTREAM = "168.63.129.16:53"


def dns_series(ok_per_s: float, servfail_per_s: float, slow: bool, upstream_failing: bool) -> list[Series]:
    """Two replicas' answers (NOERROR, SERVFAIL), their request histogram (fast: every answer within 1 ms;
    slow: most above 1.024 s), and the forward plugin's health-check, broken and reject counters."""
    series: list[Series] = []
    for pod in ("coredns-a", "coredns-b"):
        labels = f'{COREDNS},pod="{pod}",server="dns://:53",zone="."'
        series += [
            (f'coredns_dns_responses_total{{{labels},rcode="NOERROR",plugin=""}}', f"0+{ok_per_s * 30:g}x40"),
            (f'coredns_dns_responses_total{{{labels},rcode="SERVFAIL",plugin="forward"}}',
             f"0+{servfail_per_s * 30:g}x40"),
            (f'coredns_dns_request_duration_seconds_bucket{{{labels},le="0.001"}}', "0+1x40" if slow else "0+100x40"),
            (f'coredns_dns_request_duration_seconds_bucket{{{labels},le="1.024"}}', "0+2x40" if slow else "0+100x40"),
            (f'coredns_dns_request_duration_seconds_bucket{{{labels},le="+Inf"}}', "0+100x40"),
            (f'coredns_proxy_healthcheck_failures_total{{{COREDNS},pod="{pod}",proxy_name="forward",to="{UPSTREAM}"}}',
             "0+3x40" if upstream_failing else "0x40"),
            (f'coredns_forward_healthcheck_broken_total{{{COREDNS},pod="{pod}"}}',
             "0+1x40" if upstream_failing else "0x40"),
            (f'coredns_forward_max_concurrent_rejects_total{{{COREDNS},pod="{pod}"}}',
             "0+50x40" if upstream_failing else "0x40"),
        ]
    return series


@case()
def dns_servfail_storm_slow_and_upstream_down(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    # 20 of 120 answers a second SERVFAIL (16.7%), most answers above 1 s, the upstream failing
    return dns_series(100, 20, slow=True, upstream_failing=True), [
        ("20m", "KilonodeDnsErrors", [expected(plan, "KilonodeDnsErrors", {"severity": "warning"}),
                                      expected(plan, "KilonodeDnsErrors", {"severity": "critical"})]),
        ("8m", "KilonodeDnsErrors", [expected(plan, "KilonodeDnsErrors", {"severity": "critical"})]),
        ("20m", "KilonodeDnsSlow", [expected(plan, "KilonodeDnsSlow", {"severity": "warning"})]),
        ("20m", "KilonodeDnsUpstreamFailing", [
            expected(plan, "KilonodeDnsUpstreamFailing", {"severity": "warning", "to": UPSTREAM}),
            expected(plan, "KilonodeDnsUpstreamFailing", {"severity": "critical"})]),
        ("20m", "KilonodeDnsForwardSaturated",
         [expected(plan, "KilonodeDnsForwardSaturated", {"severity": "warning"})]),
    ]


@case()
def dns_servfail_between_the_lines(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    # 2 of 102 a second (1.96%): the warning, not the page
    return dns_series(100, 2, slow=False, upstream_failing=False), [
        ("20m", "KilonodeDnsErrors", [expected(plan, "KilonodeDnsErrors", {"severity": "warning"})]),
    ]


@case()
def dns_healthy(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    # 1,000 answers a second, half a SERVFAIL a second (0.05%), every answer within 1 ms, the upstream healthy
    return dns_series(1000, 0.5, slow=False, upstream_failing=False), [
        ("30m", "KilonodeDnsErrors", []),
        ("30m", "KilonodeDnsSlow", []),
        ("30m", "KilonodeDnsUpstreamFailing", []),
        ("30m", "KilonodeDnsForwardSaturated", []),
    ]


def conntrack_series(used: float, dropping: bool) -> list[Series]:
    return [(f"node_nf_conntrack_entries{{{NODE}}}", f"{int(262144 * used)}x40"),
            (f"node_nf_conntrack_entries_limit{{{NODE}}}", "262144x40"),
            (f"node_nf_conntrack_stat_drop{{{NODE}}}", "0+5x40" if dropping else "7x40"),
            (f"node_nf_conntrack_stat_early_drop{{{NODE}}}", "0+1x40" if dropping else "0x40")]


@case()
def conntrack_table_full_and_dropping(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    where = {"node": "pool-a-000001", "pool": "a"}
    return conntrack_series(0.97, dropping=True), [
        ("20m", "KilonodeConntrackTableNearFull",
         [expected(plan, "KilonodeConntrackTableNearFull", {"severity": "warning", **where})]),
        ("5m", "KilonodeConntrackTableNearFull", []),  # waits its 10 minutes
        ("20m", "KilonodeConntrackDropping",
         [expected(plan, "KilonodeConntrackDropping", {"severity": "warning", **where})]),
    ]


@case()
def conntrack_half_full_drops_long_ago(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    # half full; drops counted before the window (a flat count) are not drops now
    return conntrack_series(0.5, dropping=False), [
        ("30m", "KilonodeConntrackTableNearFull", []),
        ("30m", "KilonodeConntrackDropping", []),
    ]


def prometheus_series(plan: ClusterPlan, head: float, failing: bool) -> list[Series]:
    assert plan.prometheus is not None
    return [
        (f"prometheus_tsdb_head_series{{{SELF}}}", f"{int(plan.prometheus.series * head)}x60"),
        (f'prometheus_rule_evaluation_failures_total{{{SELF},rule_group="/etc/rules.yaml;kilonode-etcd"}}',
         "0+1x60" if failing else "3x60"),
        (f"prometheus_config_last_reload_successful{{{SELF}}}", "0x60" if failing else "1x60"),
        (f"prometheus_tsdb_compactions_failed_total{{{SELF}}}", "0+1x60" if failing else "2x60"),
        (f"prometheus_tsdb_wal_corruptions_total{{{SELF}}}", "0x60"),
    ]


@case()
def prometheus_over_its_plan_and_failing(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    return prometheus_series(plan, 1.3, failing=True), [
        ("40m", "KilonodePrometheusHeadSeriesOverPlan", [
            expected(plan, "KilonodePrometheusHeadSeriesOverPlan", {"severity": "warning"}),
            expected(plan, "KilonodePrometheusHeadSeriesOverPlan", {"severity": "critical"})]),
        ("20m", "KilonodePrometheusHeadSeriesOverPlan", [
            expected(plan, "KilonodePrometheusHeadSeriesOverPlan", {"severity": "critical"})]),
        ("20m", "KilonodePrometheusRuleFailures", [expected(plan, "KilonodePrometheusRuleFailures", {
            "severity": "warning", "rule_group": "/etc/rules.yaml;kilonode-etcd"})]),
        ("20m", "KilonodePrometheusConfigReloadFailed",
         [expected(plan, "KilonodePrometheusConfigReloadFailed", {"severity": "warning"})]),
        ("20m", "KilonodePrometheusTsdbFailures",
         [expected(plan, "KilonodePrometheusTsdbFailures", {"severity": "warning"})]),
    ]


@case()
def prometheus_within_its_plan(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    # 110% of the plan: the warning only; failures counted before the window are not failures now
    return prometheus_series(plan, 1.1, failing=False), [
        ("50m", "KilonodePrometheusHeadSeriesOverPlan",
         [expected(plan, "KilonodePrometheusHeadSeriesOverPlan", {"severity": "warning"})]),
        ("50m", "KilonodePrometheusRuleFailures", []),
        ("50m", "KilonodePrometheusConfigReloadFailed", []),
        ("50m", "KilonodePrometheusTsdbFailures", []),
    ]


@case()
def prometheus_at_half_its_plan(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    return prometheus_series(plan, 0.5, failing=False), [("50m", "KilonodePrometheusHeadSeriesOverPlan", [])]
