"""The DNS, conntrack, Prometheus-itself and cAdvisor pieces of kilonode.render.monitoring against what the plan
counts and what the NetworkPolicies admit."""

from __future__ import annotations

import pytest

from kilonode.k8s import monitoring as k8s_monitoring
from kilonode.k8s import network_policy
from kilonode.plan import defaults
from kilonode.render import monitoring
from tests import shared

STACKS = list(shared.SHIPPED_STACKS)


def test_the_dns_policy_admits_metrics_from_prometheus_pods_alone() -> None:
    assert network_policy.PROMETHEUS_POD_LABELS == k8s_monitoring.PROMETHEUS_LABELS
    assert network_policy.PROMETHEUS_NAMESPACE == k8s_monitoring.NAMESPACE
    [(_, _, admits)] = [w for w in network_policy.KUBE_SYSTEM_INGRESS if w[0] == "coredns"]
    assert [(a.ports, a.peers) for a in admits] == [(("53/UDP", "53/TCP"), "everywhere"), (("9153/TCP",), "prometheus")]


@pytest.mark.parametrize("stack", STACKS)
def test_the_plan_counts_what_the_jobs_keep(stack: str) -> None:
    plan = shared.plan(stack)
    jobs = {j.config["job_name"]: j.config for j in monitoring.scrape_jobs(plan)}
    kept = jobs[monitoring.JOB_COREDNS]["metric_relabel_configs"][0]["regex"].split("|")
    assert kept == [name for name, _ in defaults.COREDNS_KEPT]
    own = jobs[monitoring.JOB_PROMETHEUS]["metric_relabel_configs"][0]["regex"].split("|")
    assert own == [name for name, _ in defaults.PROMETHEUS_SELF_KEPT]
    node = jobs[monitoring.JOB_NODE_EXPORTER]["metric_relabel_configs"][0]["regex"].split("|")
    assert {"node_nf_conntrack_entries", "node_nf_conntrack_entries_limit"} <= set(node)
    assert "conntrack" in defaults.NODE_EXPORTER_COLLECTORS
    # the per-rule-group names are counted for at most this many groups
    assert len(monitoring.rule_groups(plan)) <= defaults.PROMETHEUS_SELF_PER["rule_group"]


@pytest.mark.parametrize("stack", STACKS)
def test_cadvisor_keeps_pods_on_docker_pools_and_containers_elsewhere(stack: str) -> None:
    plan = shared.plan(stack)
    [job] = [j.config for j in monitoring.scrape_jobs(plan) if j.config["job_name"] == monitoring.JOB_CADVISOR]
    drops = [r for r in job["metric_relabel_configs"] if r["action"] == "drop"]
    assert {"source_labels": ["container"], "regex": "POD", "action": "drop"} in drops
    assert {"source_labels": ["pod"], "regex": "", "action": "drop"} in drops
    # no rule drops every empty container: that dropped every series of a cri-dockerd pool
    assert not any(r["source_labels"] == ["container"] and r["regex"] in ("", "|POD") for r in drops)
    labelled = sorted(p.name for p in plan.node_pools if p.runtime != "docker")
    by_pool = [r for r in drops if r["source_labels"] == ["pool", "container"]]
    assert [r["regex"] for r in by_pool] == ([f"({'|'.join(labelled)});"] if labelled else [])
