"""The dashboards rendered from the plan (kilonode.render.dashboards): every panel's PromQL parsed by
a real Prometheus parser (promql-parser, the Rust port of Prometheus's, on its own thread as
kilonode.review.alerting runs it), every metric a panel reads produced by a deployed source (a scrape
job or a recording rule of kilonode.render.monitoring), and every threshold drawn equal to the plan's
figure, for the shipped stacks and a stack with the leases etcd cluster."""

from __future__ import annotations

import json
from typing import Any

import promql_parser
import pytest

from kilonode.config import load_stack
from kilonode.k8s.exporters import dcgm_counters_csv
from kilonode.plan import ClusterPlan, plan_stack
from kilonode.render import dashboards as d
from kilonode.render import monitoring as mon
from kilonode.review.alerting import on_parse_thread, scan
from tests import shared
from tests.conftest import StackWriter

STACKS = list(shared.SHIPPED_STACKS)


def files(plan: ClusterPlan) -> dict[str, dict[str, Any]]:
    """The dashboards as Grafana reads them: each file's JSON."""
    return {name: json.loads(text) for name, text in d.dashboard_files(plan).items()}


def queries(plan: ClusterPlan) -> list[tuple[str, str, str]]:
    """(dashboard uid, panel title, expr) of every target of every panel, from the JSON files."""
    return [(board["uid"], panel["title"], target["expr"])
            for board in files(plan).values() for panel in board["panels"] for target in panel["targets"]]


def parse_error(expr: str) -> str | None:
    """promql_parser's verdict on `expr`, on a thread with a large stack (alerting.on_parse_thread)."""
    outcome: list[str | None] = []

    def work() -> None:
        try:
            promql_parser.parse(expr)
            outcome.append(None)
        except BaseException as e:  # a Rust panic is a BaseException
            outcome.append(str(e) or type(e).__name__)

    on_parse_thread(work)
    return outcome[0] if outcome else "the parser stopped without a result"


def unproduced(plan: ClusterPlan) -> list[str]:
    produced = d.produced_metrics(plan)
    return [f"{uid} / {title}: {s.metric}" for uid, title, expr in queries(plan)
            for s in scan(expr)[0] if s.metric not in produced]


@pytest.mark.parametrize("stack", STACKS)
def test_every_panel_query_parses(stack: str) -> None:
    found = queries(shared.plan(stack))
    assert found
    assert [(uid, title, parse_error(expr)) for uid, title, expr in found if parse_error(expr)] == []


@pytest.mark.parametrize("stack", STACKS)
def test_every_metric_a_panel_reads_is_produced_by_a_deployed_source(stack: str) -> None:
    assert unproduced(shared.plan(stack)) == []


def test_a_panel_reading_what_no_source_keeps_fails() -> None:
    """Seeded: kube-state-metrics runs with --resources=nodes (no pod series), and the apiserver job
    drops the per-resource latency histogram: a panel reading either is caught; one reading a node
    series or the SLI histogram is not."""
    plan = shared.plan("research-7500")
    produced = d.produced_metrics(plan)
    assert "kube_pod_status_phase" not in produced
    assert "apiserver_request_duration_seconds_bucket" not in produced
    assert "DCGM_FI_PROF_SM_ACTIVE" not in produced  # not in kilonode's counters file
    assert {"kube_node_status_condition", "apiserver_request_sli_duration_seconds_bucket",
            "DCGM_FI_DEV_GPU_UTIL", mon.ETCD_WAL_FSYNC_P99, "node_infiniband_state_id"} <= set(produced)


@pytest.mark.parametrize("stack", STACKS)
def test_the_gpu_panels_read_only_the_fields_the_counters_file_enables(stack: str) -> None:
    plan = shared.plan(stack)
    enabled = {line.split(",")[0] for line in dcgm_counters_csv().splitlines() if not line.startswith("#")}
    read = {s.metric for _, _, expr in queries(plan) for s in scan(expr)[0] if s.metric.startswith("DCGM_")}
    assert read <= enabled
    assert bool(read) == bool(plan.gpu_pools)


def _steps(thresholds: dict[str, Any]) -> list[float]:
    """The values of a thresholds config's steps (the base step has none)."""
    return [step["value"] for step in thresholds["steps"] if step["value"] is not None]


def _panel(board: dict[str, Any], title: str) -> dict[str, Any]:
    [panel] = [p for p in board["panels"] if p["title"] == title]
    return panel


def _etcd_thresholds_equal_each_clusters_quota(plan: ClusterPlan) -> None:
    board = files(plan)["kilonode-etcd.json"]
    for cluster in plan.etcd_clusters:
        quota = cluster.quota_backend_bytes
        panel = _panel(board, f"etcd {cluster.role}: database size")
        assert _steps(panel["fieldConfig"]["defaults"]["thresholds"]) == [
            quota * mon.ETCD_QUOTA_WARNING, quota * mon.ETCD_QUOTA_CRITICAL, quota]
        assert f'job="{mon.etcd_job(cluster.role)}"' in panel["targets"][0]["expr"]


@pytest.mark.parametrize("stack", STACKS)
def test_thresholds_equal_the_plans(stack: str) -> None:
    plan = shared.plan(stack)
    _etcd_thresholds_equal_each_clusters_quota(plan)
    nodes = _panel(files(plan)["kilonode-cluster-health.json"], "Nodes Ready by pool")
    drawn = {o["matcher"]["options"]: _steps(o["properties"][0]["value"]) for o in nodes["fieldConfig"]["overrides"]}
    assert drawn == {p.name: [p.autoscaling.max_nodes if p.autoscaling else p.nodes] for p in plan.node_pools}
    if any(p.infiniband for p in plan.node_pools):
        ports = _panel(files(plan)["kilonode-infiniband.json"], "Ports ACTIVE")
        assert _steps(ports["fieldConfig"]["defaults"]["thresholds"]) == [sum(
            p.infiniband_links.count * (p.autoscaling.max_nodes if p.autoscaling else p.nodes)
            for p in plan.node_pools if p.infiniband and p.infiniband_links)]


def test_a_leases_cluster_gets_its_own_panel_at_its_own_quota(write_stack: StackWriter) -> None:
    cluster = shared.with_leases("research-2500")
    cluster["etcd"]["leases"]["quotaBackendBytes"] = 2 * 1024**3
    plan = plan_stack(load_stack(write_stack(cluster)))
    assert [c.role for c in plan.etcd_clusters] == ["main", "events", "leases"]
    _etcd_thresholds_equal_each_clusters_quota(plan)
    assert unproduced(plan) == []


@pytest.mark.parametrize("stack", STACKS)
def test_the_files_are_grafana_dashboards_with_unique_uids_and_panel_ids(stack: str) -> None:
    plan = shared.plan(stack)
    boards = files(plan)
    assert [b["uid"] for b in boards.values()] == [name.removesuffix(".json") for name in boards]
    assert {"kilonode-cluster-health", "kilonode-etcd", "kilonode-network"} <= {b["uid"] for b in boards.values()}
    assert ("kilonode-gpu-fleet" in {b["uid"] for b in boards.values()}) == bool(plan.gpu_pools)
    for board in boards.values():
        ids = [p["id"] for p in board["panels"]]
        assert len(ids) == len(set(ids))
        assert all(p["datasource"] == d.DATASOURCE for p in board["panels"])
        assert board["templating"]["list"][0] == {"name": "datasource", "label": "Prometheus", "type": "datasource",
                                                  "query": "prometheus", "hide": 0, "current": {}}


@pytest.mark.parametrize("stack", STACKS)
def test_a_panel_reading_an_alerts_state_names_an_alert_the_rules_have(stack: str) -> None:
    """ALERTS is produced wherever there is an alert rule, so its alertname is checked on its own."""
    plan = shared.plan(stack)
    named = {value for _, _, expr in queries(plan) for s in scan(expr)[0] if s.metric == d.ALERTS_METRIC
             for label, op, value in s.matchers if label == "alertname" and op == "="}
    assert named <= {a.name for a in mon.alerts(plan)}
    assert bool(named) == bool(plan.gpu_pools)


@pytest.mark.parametrize("stack", STACKS)
def test_every_line_of_the_files_stays_readable_in_the_golden_manifests(stack: str) -> None:
    """tests/render/test_golden.py refuses a line of 400 characters or more in the in-cluster files,
    where the ConfigMap's data is written out indented."""
    assert max(len(line) for text in d.dashboard_files(shared.plan(stack)).values()
               for line in text.splitlines()) < 390
