"""pod-isolation: the NetworkPolicies are enforced, and keep every pod of kilonode's own from
everything that need not reach it.

1. An engine enforces them on every node: Calico's Felix (DaemonSet kube-system/calico-node,
   kilonode.k8s.calico) lands on every pool's nodes, by the scheduling check's placement. Without
   it a policy is stored and nothing acts on it: every verdict below would be fiction.
2. Every pod-network workload kilonode runs in kube-system, monitoring and kilonode-capacity is
   isolated for ingress (a policy selects its pods).
3. A pod of an ordinary namespace (`default`, no labels, an address of a pool subnet: any user's
   pod) is refused on every port those workloads' containers declare, unless a contract line
   (catalog/contracts.yaml, kind servedToPods) says every pod must reach it (CoreDNS's 53); the
   flows a component needs are judged by the `contracts` check, on the same policies
   (kilonode.preflight.netpol).

Each is a break: an unenforced or open policy is the gap issue 37 item 4 names (a pod reaching an
unauthenticated port); the fix is in kilonode.k8s.network_policy or kilonode.k8s.calico.
"""

from __future__ import annotations

from collections.abc import Mapping
from ipaddress import IPv4Address, IPv4Network
from typing import Any

from kilonode.catalog.contracts import contracts
from kilonode.preflight.checks import scheduling
from kilonode.preflight.model import Finding, Inputs, Resource
from kilonode.preflight.netpol import Flow, Pod, admitted, isolated
from kilonode.preflight.nodes import bootstrap_nodes

NAME = "pod-isolation"
TITLE = "NetworkPolicies are enforced on every pool, and kilonode's pods refuse every pod that need not reach them"

ENGINE = "DaemonSet kube-system/calico-node"
NETWORK_POLICY = "kubernetes:networking.k8s.io/v1:NetworkPolicy"
NAMESPACE = "kubernetes:core/v1:Namespace"
OWN_NAMESPACES = ("kube-system", "monitoring", "kilonode-capacity")
USER_NAMESPACE = "default"  # an ordinary namespace: no policies of kilonode's, no labels


def policies(inputs: Inputs) -> list[Mapping[str, Any]]:
    return [r.inputs for r in inputs.of_type(NETWORK_POLICY)]


def namespace_labels(inputs: Inputs, namespace: str) -> dict[str, str]:
    for r in inputs.of_type(NAMESPACE):
        meta = r.inputs.get("metadata") or {}
        if meta.get("name") == namespace:
            return dict(meta.get("labels") or {})
    return {}


def pod_of(inputs: Inputs, workload: Resource) -> Pod:
    """The pod a workload runs, as policies see it (its template's labels, its containers' named ports)."""
    template = (workload.inputs.get("spec") or {}).get("template") or {}
    namespace = str((workload.inputs.get("metadata") or {}).get("namespace") or "default")
    named = {str(p["name"]): (int(p["containerPort"]), str(p.get("protocol") or "TCP"))
             for c in (template.get("spec") or {}).get("containers") or [] for p in c.get("ports") or []
             if p.get("name")}
    return Pod(namespace, dict((template.get("metadata") or {}).get("labels") or {}),
               namespace_labels(inputs, namespace), named_ports=named)


def user_pod(inputs: Inputs) -> Pod:
    """Any user's pod: namespace `default`, no labels, an address of the first pool's subnet."""
    pools = inputs.plan.node_pools
    address = next(IPv4Network(pools[0].subnet).hosts()) if pools else None
    return Pod(USER_NAMESPACE, address=address)


def pod_network(workload: Resource) -> bool:
    spec = ((workload.inputs.get("spec") or {}).get("template") or {}).get("spec") or {}
    return not spec.get("hostNetwork")


def served_to_every_pod(inputs: Inputs) -> set[tuple[str, int, str]]:
    """(workload, port, protocol) that contract lines say every pod must reach."""
    served = set()
    for contract in contracts().values():
        for req in contract.requirements:
            if req.kind == "servedToPods" and req.value.get("from") == "everyPod":
                for entry in req.value["ports"]:
                    port, _, protocol = str(entry).partition("/")
                    served.add((req.value["workload"], int(port), protocol or "TCP"))
    return served


def _engine(inputs: Inputs) -> list[Finding]:
    engine = next((w for w in inputs.workloads() if w.describe() == ENGINE), None)
    if engine is None:
        return [Finding(NAME, "break", ENGINE,
                        "no NetworkPolicy engine runs: every NetworkPolicy is stored and none is enforced, so any pod "
                        "reaches every pod's ports", "run Calico on every node (kilonode.k8s.calico)")]
    groups = bootstrap_nodes(inputs)
    daemonsets = [w for w in inputs.workloads() if w.kind == "DaemonSet"]
    placed = scheduling.placement_of(engine, groups, daemonsets)
    missing = [g.host for g in groups if g.count and g.host not in {*placed.now, *placed.after_gpu_health}]
    return [Finding(NAME, "break", f"{ENGINE} on {host}",
                    f"Felix does not land on {host} ({placed.refused.get(host, 'not placed')}): no NetworkPolicy is "
                    "enforced on that pool's nodes", "tolerate every taint and select every node (kilonode.k8s.calico)")
            for host in missing]


def check(inputs: Inputs) -> list[Finding]:
    findings = _engine(inputs)
    found = policies(inputs)
    open_to_all = served_to_every_pod(inputs)
    stranger = user_pod(inputs)
    for workload in inputs.workloads():
        pod = pod_of(inputs, workload)
        if pod.namespace not in OWN_NAMESPACES or not pod_network(workload):
            continue
        where = workload.describe()
        if not isolated(found, pod):
            findings.append(Finding(NAME, "break", where,
                                    "no NetworkPolicy selects its pods: every pod of the cluster reaches every port "
                                    "they serve", "give it a policy (kilonode.k8s.network_policy KUBE_SYSTEM_INGRESS)"))
            continue
        spec = ((workload.inputs.get("spec") or {}).get("template") or {}).get("spec") or {}
        for container in spec.get("containers") or []:
            for port in container.get("ports") or []:
                number, protocol = int(port["containerPort"]), str(port.get("protocol") or "TCP")
                if (where, number, protocol) in open_to_all:
                    continue
                if admitted(found, Flow(stranger, pod, number, protocol)):
                    findings.append(Finding(
                        NAME, "break", f"{where} port {number}/{protocol}",
                        f"a pod of namespace {USER_NAMESPACE} reaches it, and no contract line says every pod must",
                        "admit only the callers a contract names (kilonode.k8s.network_policy)"))
    return findings


def addresses_of_pools(inputs: Inputs) -> list[IPv4Address]:
    """One address of each pool subnet: where a host-network caller of that pool comes from."""
    return [next(IPv4Network(p.subnet).hosts()) for p in inputs.plan.node_pools]
