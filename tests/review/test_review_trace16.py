"""The sixteenth independent trace of `kilonode diff` on research-7500: what each finding of five
PRs said only in part, each boundary on the shipped stack changed in memory (tests.review.snapshots),
with a harmless variant beside it that must stay quiet."""

from __future__ import annotations

from typing import Any

from kilonode.review import preflight_break
from kilonode.review.compare import compare_stack
from tests.review.snapshots import snapshot

STACK = "research-7500"


def _resource(entry: dict[str, Any], type_: str, name: str) -> dict[str, Any]:
    [found] = [r["inputs"] for r in entry["resources"] if r["type"] == type_ and r["name"] == name]
    return found


def _coredns_policy(entry: dict[str, Any]) -> dict[str, Any]:
    return _resource(entry, "kubernetes:networking.k8s.io/v1:NetworkPolicy",
                     f"{STACK}-k8s-kube-system-policies-coredns")


def _dns_breaks(head: dict[str, Any]) -> list[str]:
    return [b.summary for b in preflight_break.assess(compare_stack(STACK, snapshot(STACK), head))
            if "served-to-every-pod" in b.summary]


# --- PR 4: CoreDNS's policy narrowed to every namespace's pods -----------------------------------


def test_dns_refusing_node_addresses_alone_says_host_network_pods_lose_dns() -> None:
    head = snapshot(STACK)
    rule = _coredns_policy(head)["spec"]["ingress"][0]  # 53 over UDP and TCP
    rule["from"] = [{"namespaceSelector": {}}]
    [summary] = _dns_breaks(head)
    assert "hostNetwork pods (dnsPolicy ClusterFirstWithHostNet) and processes on the nodes lose DNS" in summary
    assert "pod-network pods keep resolving" in summary
    assert "no Service name resolves anywhere" not in summary


def test_dns_refusing_pods_keeps_the_cluster_wide_sentence() -> None:
    head = snapshot(STACK)
    rule = _coredns_policy(head)["spec"]["ingress"][0]  # 53 over UDP and TCP
    rule["from"] = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}}}]
    [summary] = _dns_breaks(head)
    assert "no Service name resolves anywhere in the cluster" in summary
    assert "pod-network pods keep resolving" not in summary


def test_dns_host_only_sentence_needs_kube_proxy_keeping_pod_addresses() -> None:
    import yaml
    head = snapshot(STACK)
    rule = _coredns_policy(head)["spec"]["ingress"][0]  # 53 over UDP and TCP
    rule["from"] = [{"namespaceSelector": {}}]
    [proxy] = [r["inputs"] for r in head["resources"] if r["type"] == "kubernetes:core/v1:ConfigMap"
               and r["inputs"]["metadata"]["name"] == "kube-proxy"]
    config = yaml.safe_load(proxy["data"]["config.conf"])
    config["masqueradeAll"] = True  # every packet to a ClusterIP leaves with the node's address
    proxy["data"]["config.conf"] = yaml.safe_dump(config)
    assert any("no Service name resolves anywhere in the cluster" in s for s in _dns_breaks(head))


def test_dns_policy_admitting_every_source_says_nothing() -> None:
    head = snapshot(STACK)
    rule = _coredns_policy(head)["spec"]["ingress"][0]  # 53 over UDP and TCP
    rule["from"] = [{"namespaceSelector": {}}, {"ipBlock": {"cidr": "10.0.0.0/8"}}]
    assert _dns_breaks(head) == []


# --- PR 5: metrics-server off the port the apiservers call --------------------------------------


def _metrics_server_port(head: dict[str, Any], port: int) -> None:
    from tests.review.snapshots import pod_spec
    [container] = [c for c in pod_spec(head, "Deployment", "metrics-server")["containers"]
                   if c["name"] == "metrics-server"]
    container["args"] = [f"--secure-port={port}" if a.startswith("--secure-port=") else a for a in container["args"]]
    for declared in container["ports"]:
        declared["containerPort"] = port


def test_metrics_server_unreachable_says_namespace_deletion_stalls() -> None:
    head = snapshot(STACK)
    _metrics_server_port(head, 4443)
    [summary] = [b.summary for b in preflight_break.assess(compare_stack(STACK, snapshot(STACK), head))
                 if "metricsServer/apiserver-reach" in b.summary]
    assert "namespace deletion stalls cluster-wide" in summary
    assert "NamespaceDeletionDiscoveryFailure" in summary


def test_metrics_server_on_its_own_port_says_nothing() -> None:
    head = snapshot(STACK)
    _metrics_server_port(head, 10250)
    assert [b for b in preflight_break.assess(compare_stack(STACK, snapshot(STACK), head))
            if "apiserver-reach" in b.summary] == []
