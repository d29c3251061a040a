"""The NetworkPolicy engine and the policies, judged by preflight: `pod-isolation` (enforced on every
pool, kilonode's pods isolated, a stranger's pod refused) and the contract lines that need a flow
(CoreDNS from every pod, metrics-server from the apiservers, Typha from every pool) or a setting of
Calico's; each with a break planted in a copy of research-7500's graph. And the policy semantics
(kilonode.preflight.netpol) on hand-written cases from the API's documentation."""

from __future__ import annotations

from ipaddress import IPv4Address
from typing import Any

import pytest

from kilonode.preflight import breaks, run
from kilonode.preflight.model import Finding
from kilonode.preflight.netpol import Flow, Pod, admitted, selects
from tests.preflight.conftest import artefacts, inputs_of, resource
from tests.preflight.test_contracts import lines

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

STACK = "research-7500"


def isolation(graph: dict[str, Any] | None = None, stack: str = STACK) -> list[Finding]:
    return breaks(run(inputs_of(stack, graph=graph), ["pod-isolation"]))


def contract_breaks(graph: dict[str, Any]) -> list[Finding]:
    return breaks(run(inputs_of(STACK, graph=graph), ["contracts"]))


def policy(graph: dict[str, Any], name: str, namespace: str = "kube-system") -> dict[str, Any]:
    found = [r for r in graph["resources"] if r["type"].endswith(":NetworkPolicy")
             and r["inputs"]["metadata"]["name"] == name and r["inputs"]["metadata"]["namespace"] == namespace]
    assert len(found) == 1
    return found[0]["inputs"]


def drop(graph: dict[str, Any], kind: str, name: str, namespace: str | None = None) -> None:
    graph["resources"] = [r for r in graph["resources"] if not (
        r["type"].endswith(f":{kind}") and r["inputs"].get("metadata", {}).get("name") == name
        and (namespace is None or r["inputs"]["metadata"].get("namespace") == namespace))]


@pytest.mark.parametrize("stack", ["local", "research-2500", STACK])
def test_the_shipped_stacks_enforce_and_isolate(stack: str) -> None:
    assert isolation(stack=stack) == []


def test_no_engine_is_a_break() -> None:
    _, graph = artefacts(STACK)
    drop(graph, "DaemonSet", "calico-node")
    [finding] = isolation(graph)
    assert "no NetworkPolicy engine runs" in finding.what


def test_an_engine_kept_off_the_gpu_pools_is_a_break_per_pool() -> None:
    _, graph = artefacts(STACK)
    spec = resource(graph, "DaemonSet", "calico-node")["inputs"]["spec"]["template"]["spec"]
    spec["tolerations"] = [{"key": "CriticalAddonsOnly", "operator": "Exists"}]
    hosts = {f.where.rpartition(" on ")[2] for f in isolation(graph)}
    # the teams' and the monitoring pool's taints are no longer tolerated (the GPU health startup taint
    # clears by itself: there it lands once the node's GPUs pass, before any pod that does not tolerate it)
    assert hosts == {"pool-a100-ib.team-language", "pool-a100-ib.team-vision", "pool-monitoring"}


def test_a_workload_no_policy_selects_is_a_break() -> None:
    _, graph = artefacts(STACK)
    drop(graph, "NetworkPolicy", "metrics-server", "kube-system")
    [finding] = isolation(graph)
    assert finding.where == "Deployment kube-system/metrics-server" and "no NetworkPolicy selects" in finding.what


def test_coredns_open_on_every_port_lets_a_stranger_reach_its_metrics() -> None:
    _, graph = artefacts(STACK)
    del policy(graph, "coredns")["spec"]["ingress"][0]["ports"]
    [finding] = isolation(graph)
    assert finding.where == "Deployment kube-system/coredns port 9153/TCP"


def test_prometheus_opened_to_every_namespace_is_a_break() -> None:
    _, graph = artefacts(STACK)
    rule = policy(graph, "allow-same-namespace-9090", "monitoring")["spec"]["ingress"][0]
    rule["from"] = [{"namespaceSelector": {}}]
    [finding] = isolation(graph)
    assert finding.where == "StatefulSet monitoring/prometheus port 9090/TCP"


# --- the contract lines that need a flow or a setting -----------------------------------------------


def test_coredns_closed_to_another_namespace_is_a_break() -> None:
    _, graph = artefacts(STACK)
    policy(graph, "coredns")["spec"]["ingress"][0]["from"] = [{"namespaceSelector": {"matchLabels": {
        "kubernetes.io/metadata.name": "kube-system"}}}]
    found = contract_breaks(graph)
    assert lines(found) == {"coredns/served-to-every-pod"}
    # the two other namespaces kilonode creates, an ordinary one, and each pool's host addresses, both protocols
    assert "refuse a pod of namespace kilonode-capacity on 53/UDP" in found[0].what
    assert f"and {2 * (3 + len(inputs_of(STACK).plan.node_pools)) - 4} more" in found[0].what


def test_coredns_over_udp_only_is_a_break() -> None:
    _, graph = artefacts(STACK)
    policy(graph, "coredns")["spec"]["ingress"][0]["ports"] = [{"port": 53, "protocol": "UDP"}]
    [finding] = contract_breaks(graph)
    assert lines([finding]) == {"coredns/served-to-every-pod"} and "53/TCP" in finding.what


def test_metrics_server_closed_to_an_apiserver_is_a_break() -> None:
    _, graph = artefacts(STACK)
    peers = policy(graph, "metrics-server")["spec"]["ingress"][0]["from"]
    peers[:] = [p for p in peers if p["ipBlock"]["cidr"] != "10.0.0.12/32"]
    [finding] = contract_breaks(graph)
    assert lines([finding]) == {"metricsServer/apiserver-reach"}
    assert "refuse the apiservers 10.0.0.12 on 10250/TCP" in finding.what


@pytest.mark.parametrize(("kind", "name", "container", "key", "line"), [
    ("DaemonSet", "calico-node", "calico-node", "FELIX_INTERFACEPREFIX", "calico/pod-interfaces-named-azv"),
    ("Deployment", "calico-typha", "calico-typha", "FELIX_INTERFACEPREFIX", "calico/typha-converts-pods-as-azv"),
    ("DaemonSet", "calico-node", "calico-node", "CALICO_NETWORKING_BACKEND", "calico/policy-only"),
    ("DaemonSet", "calico-node", "calico-node", "FELIX_NFTABLESMODE", "calico/nftables-beside-kube-proxy"),
])
def test_calico_with_another_setting_is_a_break(kind: str, name: str, container: str, key: str, line: str) -> None:
    _, graph = artefacts(STACK)
    spec = resource(graph, kind, name)["inputs"]["spec"]["template"]["spec"]
    [env] = [e for c in spec["containers"] if c["name"] == container for e in c["env"] if e["name"] == key]
    env["value"] = "cali" if key == "FELIX_INTERFACEPREFIX" else "bird" if "BACKEND" in key else "Disabled"
    assert lines(contract_breaks(graph)) == {line}


def test_calico_node_off_the_host_network_is_a_break() -> None:
    _, graph = artefacts(STACK)
    del resource(graph, "DaemonSet", "calico-node")["inputs"]["spec"]["template"]["spec"]["hostNetwork"]
    assert lines(contract_breaks(graph)) == {"calico/upstream-pod"}


def test_typha_without_pod_reads_is_a_break() -> None:
    _, graph = artefacts(STACK)
    role = resource(graph, "ClusterRole", "calico-typha")["inputs"]
    role["rules"][0]["resources"].remove("pods")
    assert lines(contract_breaks(graph)) == {"calico/typha-rbac"}


def test_a_missing_calico_crd_is_a_break() -> None:
    _, graph = artefacts(STACK)
    drop(graph, "CustomResourceDefinition", "tiers.crd.projectcalico.org")
    assert lines(contract_breaks(graph)) == {"calico/crds-installed"}
    drop(graph, "CustomResourceDefinition", "adminnetworkpolicies.policy.networking.k8s.io")
    assert lines(contract_breaks(graph)) == {"calico/crds-installed", "calico/admin-policy-crds-installed"}


def test_pools_closed_to_each_other_on_typhas_port_are_a_break() -> None:
    _, graph = artefacts(STACK)
    [nsg] = [r for r in graph["resources"] if r["name"] == f"{STACK}-network-pools-nsg"]
    nsg["inputs"]["securityRules"] = [r for r in nsg["inputs"]["securityRules"] if r["name"] != "allow-all-from-pools"]
    found = [f for f in contract_breaks(graph) if "contract line calico/" in f.what]
    assert lines(found) == {"calico/typha-reach"}
    assert "on 5473/TCP" in found[0].what


# --- the semantics --------------------------------------------------------------------------------


def _policy(namespace: str, selector: dict[str, Any], ingress: list[dict[str, Any]] | None = None,
            types: list[str] | None = None, egress: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"podSelector": selector, "policyTypes": types or ["Ingress"]}
    if ingress is not None:
        spec["ingress"] = ingress
    if egress is not None:
        spec["egress"] = egress
    return {"metadata": {"name": "p", "namespace": namespace}, "spec": spec}


WEB = Pod("shop", {"app": "web"}, named_ports={"http": (8080, "TCP")})
CLIENT = Pod("shop", {"app": "client"}, address=IPv4Address("10.1.0.5"))
OTHER = Pod("other", {"app": "client"}, {"team": "a"}, address=IPv4Address("10.2.0.5"))


def test_a_pod_no_policy_selects_takes_everything_and_an_empty_policy_nothing() -> None:
    assert admitted([], Flow(OTHER, WEB, 80))
    deny = _policy("shop", {})
    assert not admitted([deny], Flow(CLIENT, WEB, 80))
    assert admitted([deny], Flow(CLIENT, Pod("elsewhere"), 80))  # another namespace's pod is not selected


def test_peers_ports_and_their_defaults() -> None:
    same_namespace = _policy("shop", {"matchLabels": {"app": "web"}}, [{"from": [{"podSelector": {}}],
                                                                        "ports": [{"port": "http"}]}])
    assert admitted([same_namespace], Flow(CLIENT, WEB, 8080))
    assert not admitted([same_namespace], Flow(CLIENT, WEB, 8080, "UDP"))  # protocol defaults to TCP
    assert not admitted([same_namespace], Flow(OTHER, WEB, 8080))  # podSelector alone: the policy's namespace
    by_namespace = _policy("shop", {}, [{"from": [{"namespaceSelector": {"matchLabels": {"team": "a"}},
                                                   "podSelector": {"matchLabels": {"app": "client"}}}],
                                         "ports": [{"port": 9000, "endPort": 9010}]}])
    assert admitted([by_namespace], Flow(OTHER, WEB, 9005)) and not admitted([by_namespace], Flow(OTHER, WEB, 9011))
    blocks = _policy("shop", {}, [{"from": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.2.0.0/16"]}}]}])
    assert admitted([blocks], Flow(IPv4Address("10.9.9.9"), WEB, 1)) and not admitted([blocks], Flow(OTHER, WEB, 1))
    assert not admitted([same_namespace], Flow(IPv4Address("10.1.0.5"), WEB, 8080))  # an address is no pod


def test_egress_isolation_and_expressions() -> None:
    no_egress = _policy("shop", {"matchExpressions": [{"key": "app", "operator": "In", "values": ["client"]}]},
                        types=["Egress"])
    assert not admitted([no_egress], Flow(CLIENT, OTHER, 53, "UDP"))
    assert admitted([no_egress], Flow(CLIENT, OTHER, 53, "UDP"), egress=False)
    assert selects({"matchExpressions": [{"key": "x", "operator": "DoesNotExist"}]}, {"app": "web"})
    assert not selects({"matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["web"]}]}, {"app": "web"})
