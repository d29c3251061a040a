"""pod-egress: each pod-network workload's required calls (the apiservers; Prometheus's DNS and
scrape targets) are let out by the NetworkPolicies that select it for egress; each with a break
planted in a copy of a shipped stack's graph."""

from __future__ import annotations

from ipaddress import IPv4Address
from typing import Any

from kilonode.preflight import breaks, run
from kilonode.preflight.checks.pod_egress import egress_admitted
from kilonode.preflight.model import Finding
from kilonode.preflight.netpol import Pod
from tests.preflight.conftest import artefacts, inputs_of

STACK = "research-7500"
PROMETHEUS = "StatefulSet monitoring/prometheus"


def egress_breaks(graph: dict[str, Any] | None = None, stack: str = STACK) -> list[Finding]:
    return breaks(run(inputs_of(stack, graph=graph), ["pod-egress"]))


def default_deny(graph: dict[str, Any], namespace: str = "monitoring") -> dict[str, Any]:
    [found] = [r["inputs"] for r in graph["resources"] if r["type"].endswith(":NetworkPolicy")
               and r["inputs"]["metadata"] == {**r["inputs"]["metadata"], "name": "default-deny",
                                                "namespace": namespace}]
    return found


def test_the_shipped_stacks_let_every_required_call_out(shipped: str) -> None:
    assert egress_breaks(stack=shipped) == []


def test_a_monitoring_default_deny_of_egress_blinds_prometheus() -> None:
    """Seeded: monitoring's default deny given policyTypes [Ingress, Egress] (default_deny egress=True)."""
    _, graph = artefacts(STACK)
    default_deny(graph)["spec"]["policyTypes"] = ["Ingress", "Egress"]
    [finding] = egress_breaks(graph)
    assert finding.where == PROMETHEUS and "monitoring/default-deny" in finding.what
    for call in ("the apiserver 10.0.0.10:6443", "CoreDNS", "scrape target 10.0.0.10:6443 (job kilonode-apiserver)",
                 "node "):
        assert call in finding.what
    assert "every alert is blind" in finding.what


def test_an_egress_rule_for_dns_alone_still_refuses_the_rest() -> None:
    """Policies are a union of allows: a second policy letting DNS out leaves the apiservers and
    the scrapes refused."""
    _, graph = artefacts(STACK)
    deny = default_deny(graph)
    deny["spec"]["policyTypes"] = ["Ingress", "Egress"]
    graph["resources"].append({
        "type": "kubernetes:networking.k8s.io/v1:NetworkPolicy", "name": "dns", "parent": None, "protect": False,
        "replaceOnChanges": [],
        "inputs": {"metadata": {"name": "allow-dns", "namespace": "monitoring"},
                   "spec": {"podSelector": {}, "policyTypes": ["Egress"],
                            "egress": [{"to": [{"namespaceSelector": {}, "podSelector": {
                                "matchLabels": {"k8s-app": "kube-dns"}}}],
                                        "ports": [{"port": 53, "protocol": "UDP"}, {"port": 53}]}]}}})
    [finding] = egress_breaks(graph)
    assert "CoreDNS" not in finding.what and "the apiserver" in finding.what
    # a rule with no `to` and no `ports` lets everything out
    deny["spec"]["egress"] = [{}]
    assert egress_breaks(graph) == []


def test_selectors_match_pods_and_only_ip_blocks_match_hosts() -> None:
    pod = Pod("monitoring", {"app": "p"})
    policy = {"metadata": {"name": "p", "namespace": "monitoring"},
              "spec": {"podSelector": {}, "policyTypes": ["Egress"],
                       "egress": [{"to": [{"namespaceSelector": {}}]}]}}
    host = IPv4Address("10.0.0.10")
    assert egress_admitted([policy], pod, Pod("kube-system"), 53, "UDP")[0]
    assert not egress_admitted([policy], pod, host, 6443)[0]  # a namespace selector selects no host
    policy["spec"]["egress"] = [{"to": [{"ipBlock": {"cidr": "10.0.0.0/24"}}], "ports": [{"port": 6443}]}]
    assert egress_admitted([policy], pod, host, 6443)[0] and not egress_admitted([policy], pod, host, 10259)[0]
    # unset policyTypes with egress rules: Egress implied (types.go); without, the pod is not isolated
    del policy["spec"]["policyTypes"]
    assert not egress_admitted([policy], pod, host, 10259)[0]
    policy["spec"]["egress"] = []
    assert egress_admitted([policy], pod, host, 10259) == (True, [])
