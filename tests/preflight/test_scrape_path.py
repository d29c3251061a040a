"""scrape-path: on the shipped stacks the cluster's Prometheus reaches every control-plane target its
configuration names; each seeded break (a rule dropped, Prometheus on another pool, no ConfigMap)
is named, with the jobs and targets it blinds."""

from __future__ import annotations

from typing import Any

from kilonode.azure.network import CONTROLLER_METRICS_RULE
from kilonode.config import load_stack
from kilonode.plan import plan_stack
from kilonode.preflight import run
from kilonode.preflight.checks import scrape_path
from kilonode.preflight.load import from_parts
from tests import shared
from tests.preflight.conftest import artefacts, inputs_of

CHECK = ["scrape-path"]
NSG = "azure-native:network:NetworkSecurityGroup"


def nsg(graph: dict[str, Any], suffix: str) -> dict[str, Any]:
    [found] = [r for r in graph["resources"] if r["type"] == NSG and r["name"].endswith(suffix)]
    return found


def without_rule(graph: dict[str, Any], suffix: str, rule: str) -> dict[str, Any]:
    group = nsg(graph, suffix)
    before = len(group["inputs"]["securityRules"])
    group["inputs"]["securityRules"] = [r for r in group["inputs"]["securityRules"] if r["name"] != rule]
    assert len(group["inputs"]["securityRules"]) == before - 1, rule
    return graph


def test_the_shipped_stacks_prometheus_reaches_every_static_target(shipped: str) -> None:
    inputs = inputs_of(shipped)
    assert run(inputs, CHECK) == []
    # and it traced them: every control-plane job, every target (the check saw something to pass)
    config = scrape_path._prometheus_config(inputs)
    assert config is not None
    traced = {(job, port) for job, _, port in scrape_path._static_targets(config)}
    assert {("kilonode-scheduler", 10259), ("kilonode-controller-manager", 10257), ("kilonode-apiserver", 6443),
            ("kilonode-etcd-main", 2381), ("kilonode-etcd-events", 2381), ("kilonode-certificates", 9479)} | (
        {("kilonode-gpu-health-controller", 9482)} if plan_stack(load_stack(shipped)).gpu_pools else set()) == traced


def test_without_the_controllers_rule_the_schedulers_and_controller_managers_are_unreachable() -> None:
    files, graph = artefacts("research-7500")
    graph = without_rule(graph, "-control-plane-nsg", CONTROLLER_METRICS_RULE)
    findings = run(inputs_of("research-7500", files=files, graph=graph), CHECK)
    assert {f.level for f in findings} == {"warn"}
    assert sorted(f.where.rsplit("(", 1)[1] for f in findings) == ["job kilonode-controller-manager)",
                                                                    "job kilonode-scheduler)"]
    scheduler = next(f for f in findings if "kilonode-scheduler" in f.where)
    # all five apiserver VMs, refused by the deny-all, from the monitoring pool's subnet
    assert scheduler.what.count(":10259") == 5 and "rule deny-all-inbound" in scheduler.what
    assert "10.0.2.64/28" in scheduler.what and "10.0.2.64/28 on 10259/TCP" in scheduler.fix


def test_prometheus_on_another_pool_is_refused_every_monitoring_port_but_the_apiservers() -> None:
    """The rules admit the monitoring pool's subnet alone: a Prometheus placed on the system pool
    (the graph unchanged) still reaches the apiservers (6443 admits the VNet), but not the
    schedulers and controller managers, etcd's metrics, the certificate expiry or the GPU health
    controller."""
    files, graph = artefacts("research-7500")
    plan = shared.plan("research-7500")
    assert plan.prometheus is not None
    moved = plan.model_copy(update={"prometheus": plan.prometheus.model_copy(update={"pool": "system"})})
    findings = run(from_parts(moved, files, graph, source="research-7500"), CHECK)
    assert sorted({f.where.rsplit("(", 1)[1] for f in findings}) == [
        "job kilonode-certificates)", "job kilonode-controller-manager)", "job kilonode-etcd-events)",
        "job kilonode-etcd-main)", "job kilonode-gpu-health-controller)", "job kilonode-scheduler)"]
    assert all("pool system (10.0.2.0/26)" in f.what for f in findings)


def test_an_etcd_metrics_rule_dropped_is_named_for_both_etcd_jobs() -> None:
    files, graph = artefacts("local")
    graph = without_rule(graph, "-etcd-nsg", "allow-etcd-metrics-from-monitoring")
    findings = run(inputs_of("local", files=files, graph=graph), CHECK)
    assert sorted(f.where.rsplit("(", 1)[1] for f in findings) == ["job kilonode-etcd-events)",
                                                                    "job kilonode-etcd-main)"]


def test_a_graph_without_the_prometheus_configmap_says_nothing_was_traced() -> None:
    files, graph = artefacts("local")
    graph["resources"] = [r for r in graph["resources"] if not (
        r["type"] == scrape_path.CONFIG_MAP and "prometheus.yml" in (r["inputs"].get("data") or {}))]
    [finding] = run(inputs_of("local", files=files, graph=graph), CHECK)
    assert finding.level == "warn" and "nothing was traced" in finding.what
