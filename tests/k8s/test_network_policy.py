"""NetworkPolicies (kilonode.k8s.network_policy): kilonode's own namespaces deny all ingress to
every pod by default, the balloons' namespace egress too, and let in only Prometheus's port from
its own namespace; kube-system's pod-network workloads each admit only what they serve. And who
enforces them: Calico's Felix on every pool (kilonode.k8s.calico), with the pools' conflist still
azure-vnet alone (policy-only Calico chains no plugin); policy/security-exceptions.yaml says
`networkPolicyEnforced: true` only while that holds."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kilonode.azure.graph import Graph
from kilonode.k8s.grafana import GRAFANA_PORT
from kilonode.k8s.network_policy import KUBE_SYSTEM_INGRESS, PROMETHEUS_PORT
from kilonode.paths import REPO_ROOT
from kilonode.preflight.checks import pod_isolation
from kilonode.render.cni import CONFLIST
from tests import shared
from tests.preflight.conftest import artefacts, inputs_of

STACKS = list(shared.SHIPPED_STACKS)
# CNI plugins that implement NetworkPolicy in a conflist: none belongs there (Calico in policy-only
# mode on Azure CNI chains no plugin; the operator installs its CNI only for Calico's own networking).
POLICY_ENGINES = ("cilium", "azure-npm", "calico")


def policies(graph: Graph) -> list[dict[str, Any]]:
    return [r.plain() for r in graph.resources if r.type == "kubernetes:networking.k8s.io/v1:NetworkPolicy"]


def namespaces(graph: Graph) -> set[str]:
    return {r.plain()["metadata"]["name"] for r in graph.resources if r.type == "kubernetes:core/v1:Namespace"}


def default_denies(found: list[dict[str, Any]], namespace: str, direction: str) -> bool:
    """A policy of `namespace` selects every pod for `direction` and lets nothing in (out)."""
    key = "ingress" if direction == "Ingress" else "egress"
    return any(p["metadata"]["namespace"] == namespace and p["spec"]["podSelector"] == {}
               and direction in p["spec"]["policyTypes"] and not p["spec"].get(key) for p in found)


@pytest.mark.parametrize("stack", STACKS)
def test_every_namespace_kilonode_creates_denies_ingress_by_default(graphs: dict[str, Graph], stack: str) -> None:
    found = policies(graphs[stack])
    for namespace in namespaces(graphs[stack]):
        assert default_denies(found, namespace, "Ingress"), namespace
    if "kilonode-capacity" in namespaces(graphs[stack]):  # the balloons call nothing either
        assert default_denies(found, "kilonode-capacity", "Egress")
    # what is let in outside kube-system: Prometheus's port and Grafana's (kilonode.k8s.grafana), each
    # from its own namespace
    # (Alertmanager's own policy, 9093 from Prometheus's and Grafana's pods: tests/k8s/test_alertmanager.py)
    rules = sorted(((p["metadata"]["namespace"], rule) for p in found for rule in p["spec"].get("ingress", [])
                    if p["metadata"]["namespace"] != "kube-system" and p["metadata"]["name"] != "alertmanager"),
                   key=lambda r: r[1]["ports"][0]["port"])
    assert rules == [("monitoring", {"from": [{"podSelector": {}}], "ports": [{"protocol": "TCP", "port": port}]})
                     for port in sorted((GRAFANA_PORT, PROMETHEUS_PORT))]
    # kube-system: one policy per workload, CoreDNS's 53 from anywhere (9153 from Prometheus),
    # metrics-server's 10250 from each apiserver's address, nothing else
    kube_system = {p["metadata"]["name"]: p["spec"] for p in found if p["metadata"]["namespace"] == "kube-system"}
    # ... and kube-state-metrics's own (kilonode.k8s.exporters): its metrics port from Prometheus's pods alone
    assert set(kube_system) == {name for name, _, _ in KUBE_SYSTEM_INGRESS} | {"kube-state-metrics"}
    prometheus = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
                   "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus",
                                                   "app.kubernetes.io/managed-by": "kilonode"}}}]
    assert kube_system["kube-state-metrics"]["ingress"] == [{"from": prometheus,
                                                             "ports": [{"port": 8080, "protocol": "TCP"}]}]
    # CoreDNS: its 53 from anywhere, its metrics (9153) from Prometheus's pods alone
    assert kube_system["coredns"]["ingress"] == [
        {"ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]},
        {"from": prometheus, "ports": [{"port": 9153, "protocol": "TCP"}]}]
    apiservers = [f"{i.ip}/32" for i in shared.plan(stack).control_plane.instances]
    assert kube_system["metrics-server"]["ingress"] == [{
        "from": [{"ipBlock": {"cidr": cidr}} for cidr in apiservers], "ports": [{"port": 10250, "protocol": "TCP"}]}]
    assert all("ingress" not in spec for name, spec in kube_system.items() if name not in {"coredns", "metrics-server",
                                                                                      "kube-state-metrics"})
    for policy in found:
        shared.validate_object(policy, "1.34.0")


def test_a_namespace_without_its_default_deny_is_caught(graphs: dict[str, Graph]) -> None:
    """Seeded break: the balloons' policy gone, or made to select only some pods."""
    found = policies(graphs["research-7500"])
    kept = [p for p in found if p["metadata"]["namespace"] != "kilonode-capacity"]
    assert not default_denies(kept, "kilonode-capacity", "Ingress")
    narrowed = json.loads(json.dumps(found))
    for p in narrowed:
        p["spec"]["podSelector"] = {"matchLabels": {"app": "x"}}
    assert not default_denies(narrowed, "monitoring", "Ingress")


@pytest.mark.parametrize("stack", STACKS)
def test_felix_enforces_them_on_every_pool_and_the_exceptions_file_says_so(stack: str) -> None:
    """The flag is true only while the engine is deployed and lands on every pool's nodes (preflight's
    pod-isolation placement), and the conflist stays azure-vnet's: no policy plugin is chained."""
    exceptions = shared.load_yaml((REPO_ROOT / "policy/security-exceptions.yaml").read_text())
    for host, files in shared.rendered(stack).items():
        if CONFLIST in files:
            plugins = [p["type"] for p in json.loads(files[CONFLIST].content)["plugins"]]
            assert not any(engine in t for t in plugins for engine in POLICY_ENGINES), (host, plugins)
            assert plugins[0] == "azure-vnet", (host, plugins)
    engine = pod_isolation._engine(inputs_of(stack))
    assert exceptions["networkPolicyEnforced"] is (engine == []), engine


def test_the_flag_follows_the_engine() -> None:
    """Seeded break: with calico-node gone, the engine check finds nothing enforcing, so the test
    above would require the flag false."""
    _, graph = artefacts("research-7500")
    graph["resources"] = [r for r in graph["resources"] if not (
        r["type"].endswith(":DaemonSet") and r["inputs"]["metadata"]["name"] == "calico-node")]
    assert pod_isolation._engine(inputs_of("research-7500", graph=graph)) != []
