"""The node data plane's watch (research-7500's independent on-call trace, its remaining gaps): kube-state-metrics
reads kube-system's DaemonSets and Deployments under a Role there alone, its series are in the plan's estimate, the
alerts name the DaemonSets and the Deployment kilonode deploys under their own names and read only series a deployed
source produces; the per-node exporter alert joins on the label both scrape jobs set; and the etcd writes panel counts
server-side apply."""

from __future__ import annotations

from typing import Any

import pytest

from kilonode.k8s import calico, dns, gpu, proxy
from kilonode.k8s.bootstrap import KUBE_SYSTEM
from kilonode.k8s.exporters import DCGM_EXPORTER, NODE_EXPORTER, kube_state_metrics_args
from kilonode.paths import REPO_ROOT
from kilonode.plan import defaults
from kilonode.plan.resolve.monitoring import ksm_workload_series, series_terms
from kilonode.preflight import run
from kilonode.render import dashboards as d
from kilonode.render import monitoring as mon
from kilonode.review.alerting import scan
from tests import shared
from tests.preflight.conftest import artefacts, inputs_of
from tests.preflight.test_contracts import lines

pytestmark = pytest.mark.medium  # records research-7500's graph

NEW_ALERTS = ("KilonodeExporterDownOnReadyNode", "KilonodeDaemonSetPodsUnavailable",
              "KilonodeCoreDnsReplicasUnavailable", "KilonodeNodePressure")


def test_kube_state_metrics_reads_the_apps_resources_in_kube_system_alone() -> None:
    args = kube_state_metrics_args()
    assert "--resources=nodes,daemonsets,deployments" in args
    assert f"--namespaces={KUBE_SYSTEM}" in args
    assert defaults.KSM_NAMESPACE == KUBE_SYSTEM == mon.NODE_DATA_PLANE_NAMESPACE
    assert set(defaults.KSM_NAMESPACED_RESOURCES) <= set(defaults.KSM_RESOURCES)
    # the allowlist is as it was: Node labels alone
    assert defaults.KSM_LABELS_ALLOWLIST == "nodes=[kilonode.io/pool,kilonode.io/team,kilonode.io/fabric]"


def test_the_alerts_name_the_daemonsets_and_the_deployment_kilonode_deploys() -> None:
    assert set(mon.NODE_DATA_PLANE_DAEMONSETS) == {"kube-proxy", calico.NODE, NODE_EXPORTER, DCGM_EXPORTER,
                                                   gpu.DAEMONSET_NAME}
    assert mon.COREDNS_DEPLOYMENT == dns.DEPLOYMENT
    assert proxy.LABELS["k8s-app"] == "kube-proxy"
    # each is a DaemonSet of research-7500's graph in kube-system under that name
    _, graph = artefacts("research-7500")
    daemonsets = {(r["inputs"]["metadata"].get("namespace"), r["inputs"]["metadata"]["name"])
                  for r in graph["resources"] if r["type"].endswith(":DaemonSet")}
    assert {(KUBE_SYSTEM, name) for name in mon.NODE_DATA_PLANE_DAEMONSETS} <= daemonsets


def test_their_series_are_counted_once_in_the_plans_estimate() -> None:
    assert ksm_workload_series() == 16 * 10 + 24 * 21 == 664
    plan = shared.plan("research-7500")
    assert plan.prometheus is not None
    terms = [t for t in plan.prometheus.terms if "DaemonSets and Deployments" in t.what]
    assert [(t.targets, t.per_target) for t in terms] == [(1, 664)]
    assert plan.prometheus.series == sum(t.series for t in plan.prometheus.terms)
    recomputed = series_terms(plan.node_pools, plan.etcd_clusters, plan.control_plane, 0)
    assert [t.per_target for t in recomputed if "DaemonSets and Deployments" in t.what] == [664]


@pytest.mark.parametrize("stack", shared.SHIPPED_STACKS)
def test_the_new_alerts_read_only_produced_series(stack: str) -> None:
    plan = shared.plan(stack)
    produced = d.produced_metrics(plan)
    read = {s.metric for a in mon.alerts(plan) if a.name in NEW_ALERTS for s in scan(a.expr)[0]}
    assert {"kube_daemonset_status_number_unavailable", "kube_deployment_status_replicas_unavailable",
            "kube_node_status_condition", "up"} <= read
    assert read - set(produced) == set()


def test_the_per_node_exporter_alert_joins_on_the_label_both_jobs_set() -> None:
    plan = shared.plan("research-7500")
    jobs = {j.config["job_name"]: j.config for j in mon.scrape_jobs(plan)}
    for job in (mon.JOB_NODE_EXPORTER, mon.JOB_DCGM_EXPORTER):
        targets = {r.get("target_label") for r in jobs[job]["relabel_configs"]}
        assert {"node", "pool"} <= targets
    [alert] = [a for a in mon.alerts(plan) if a.name == "KilonodeExporterDownOnReadyNode"]
    assert "on (node)" in alert.expr and 'condition="Ready",status="true"' in alert.expr


def test_the_runbooks_name_the_namespace_the_exporters_run_in() -> None:
    plan = shared.plan("research-7500")
    texts = [a.rule()["annotations"]["description"] for a in mon.alerts(plan)]
    assert not [t for t in texts if "-n monitoring get ds" in t]
    assert "-n monitoring get ds" not in (REPO_ROOT / "docs" / "monitoring.md").read_text()


def test_the_etcd_writes_panel_counts_server_side_apply_and_flow_schemas_are_drawn() -> None:
    assert "APPLY" in d.WRITE_VERBS.split("|")
    exprs = [q.expr for p in d.apiserver_panels() for q in p.queries]
    assert any("sum by (flow_schema)" in e and "apiserver_flowcontrol_dispatched_requests_total" in e for e in exprs)
    # the apiserver job keeps it (its drops are histogram buckets)
    assert "apiserver_flowcontrol_dispatched_requests_total" not in mon.APISERVER_DROPPED


def _without_role(graph: dict[str, Any]) -> dict[str, Any]:
    graph["resources"] = [r for r in graph["resources"] if not (
        r["type"].endswith(":Role") and (r["inputs"].get("metadata") or {}).get("name") == "kube-state-metrics")]
    return graph


def test_the_contract_holds_and_names_the_role_when_it_is_removed() -> None:
    """Every finding, warnings included: an RBAC line's finding is a warning (kilonode.preflight.checks.contracts
    _rbac_findings)."""
    assert not {line for line in lines(run(inputs_of("research-7500"), ["contracts"]))
                if line.startswith("kubeStateMetrics/")}
    files, graph = artefacts("research-7500")
    broken = run(inputs_of("research-7500", files=files, graph=_without_role(graph)), ["contracts"])
    assert {line for line in lines(broken) if line.startswith("kubeStateMetrics/")} == {
        "kubeStateMetrics/data-plane-reads"}
