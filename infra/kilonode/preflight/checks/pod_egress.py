"""pod-egress: every call a pod-network workload of kilonode's must make leaves its pod: the
NetworkPolicies that select the pod for egress admit each destination.

The checks beside this one judge the destination's side of a flow (contracts, pod-isolation:
`kilonode.preflight.netpol.admitted(..., egress=False)`) and the NSGs (connections, scrape-path);
none asks whether the caller's own namespace lets the call out. A default deny given
`policyTypes: [Ingress, Egress]` and no egress rules refuses every packet its pods send
(kubernetes/website content/en/docs/concepts/services-networking/network-policies.md, "Default deny
all egress traffic"), and Calico's Felix enforces it on every pod-network pod (kilonode.k8s.calico);
for Prometheus that is service discovery, every scrape and DNS: alerting is blind while the
cluster looks healthy.

How policies combine (network-policies.md, "The two sorts of pod isolation": "A pod is isolated
for egress if there is any NetworkPolicy that both selects the pod and has "Egress" in its
policyTypes ... the only allowed connections from the pod are those allowed by the egress list of
some NetworkPolicy that applies to the pod for egress ... The effects of those egress lists combine
additively"; k8s.io/api networking/v1 types.go NetworkPolicySpec.PolicyTypes: unset, Egress is
implied only when the policy has egress rules): a pod selected by no egress policy sends anywhere; a pod
selected by one or more sends only what some egress rule of one of them admits (a rule with no
`to` admits every destination, no `ports` every port). A destination that is no pod (an
apiserver, a node's kubelet) is matched by ipBlock peers only; a pod destination by pod and
namespace selectors too (kilonode.preflight.netpol, the evaluator pod-isolation uses). A call to
a Service is judged at its endpoints (the apiservers' own addresses behind the `kubernetes`
Service, CoreDNS's pods behind the cluster DNS address): Calico's policy sees the packet after
kube-proxy's DNAT, as the NetworkPolicy selectors, which name pods and not Services, presume.

Required egress, per workload (what each calls, read from what the graph runs):
- every pod-network workload whose pods mount a ServiceAccount token: each apiserver, on the
  port of the control-plane endpoint (its client is in-cluster config: the `kubernetes` Service);
- the cluster's Prometheus (monitoring/prometheus), as well: CoreDNS's pods on 53/UDP and 53/TCP
  (its pod resolves with dnsPolicy ClusterFirst), every static target of the prometheus.yml the
  graph's ConfigMap holds (scrape-path reads it), and for every `role: node` job each pool's node
  address on the job's port (a relabelled `__address__` replacement's, else the kubelet's 10250).

What it leaves out: scrape jobs found by pod or EndpointSlice discovery (kube-state-metrics, the
user's; cluster-autoscaler, host-network), whose targets are not in the graph; and host-network
pods, which no policy selects.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from ipaddress import IPv4Address, IPv4Network
from typing import Any
from urllib.parse import urlparse

from kilonode.preflight import netpol
from kilonode.preflight.checks import pod_isolation
from kilonode.preflight.checks.contracts import _account_of
from kilonode.preflight.checks.scrape_path import _prometheus_config, _static_targets
from kilonode.preflight.model import Finding, Inputs, Resource

NAME = "pod-egress"
TITLE = ("every pod-network workload's required calls (the apiservers; Prometheus's DNS and scrape targets) are "
         "let out by the NetworkPolicies that select it for egress")

PROMETHEUS = "StatefulSet monitoring/prometheus"
COREDNS = "Deployment kube-system/coredns"
DNS_PORTS = ((53, "UDP"), (53, "TCP"))
KUBELET_PORT = 10250
_REPLACED_PORT = re.compile(r":(\d{1,5})$")

Destination = netpol.Pod | IPv4Address


def _egress_policies(policies: Sequence[Mapping[str, Any]], pod: netpol.Pod) -> list[Mapping[str, Any]]:
    """The policies that isolate `pod` for egress: of its namespace, selecting it, Egress among their types."""
    return [p for p in policies if (p.get("metadata") or {}).get("namespace") == pod.namespace
            and netpol.selects((p.get("spec") or {}).get("podSelector"), pod.labels)
            and "Egress" in netpol._types(p)]


def _peer_admits(peer: Mapping[str, Any], destination: Destination, namespace: str) -> bool:
    if isinstance(destination, IPv4Address) and "ipBlock" not in peer:
        return False  # pod and namespace selectors select pods, never a host's address
    return netpol._peer_matches(peer, destination, namespace)


def _port_admits(entry: Mapping[str, Any], destination: Destination, port: int, protocol: str) -> bool:
    if isinstance(destination, IPv4Address):
        named = entry.get("port")
        if isinstance(named, str) and not named.isdigit():
            return False  # a named port is a destination pod's container port: no host has one
        destination = netpol.Pod("", address=destination)
    return netpol._port_matches(entry, netpol.Flow(destination, destination, port, protocol))


def egress_admitted(policies: Sequence[Mapping[str, Any]], pod: netpol.Pod, destination: Destination,
                    port: int, protocol: str = "TCP") -> tuple[bool, list[str]]:
    """Whether `pod` may send to `destination` on port/protocol, and the names of the policies
    that isolate it for egress (none: it is not isolated, and sends anywhere)."""
    isolating = _egress_policies(policies, pod)
    names = [str((p.get("metadata") or {}).get("name")) for p in isolating]
    if not isolating:
        return True, names
    for policy in isolating:
        namespace = str((policy.get("metadata") or {}).get("namespace"))
        for rule in (policy.get("spec") or {}).get("egress") or []:
            peers = rule.get("to")
            if peers and not any(_peer_admits(peer, destination, namespace) for peer in peers):
                continue
            ports = rule.get("ports")
            if not ports or any(_port_admits(entry, destination, port, protocol) for entry in ports):
                return True, names
    return False, names


def _apiservers(inputs: Inputs) -> list[tuple[str, Destination, int, str]]:
    """(what, address, port, protocol): each apiserver behind the `kubernetes` Service."""
    port = urlparse(str(inputs.plan.control_plane.endpoint)).port or 6443
    return [(f"the apiserver {i.ip}:{port} (the kubernetes Service)", IPv4Address(str(i.ip)), port, "TCP")
            for i in inputs.plan.control_plane.instances]


def _node_jobs(config: Mapping[str, Any]) -> Iterator[tuple[str, int]]:
    """(job, port) of every scrape job discovering nodes: the kubelet's port unless relabelled."""
    for job in config.get("scrape_configs") or []:
        if not any(sd.get("role") == "node" for sd in job.get("kubernetes_sd_configs") or []):
            continue
        port = KUBELET_PORT
        for relabel in job.get("relabel_configs") or []:
            if relabel.get("target_label") == "__address__":
                found = _REPLACED_PORT.search(str(relabel.get("replacement") or ""))
                port = int(found[1]) if found else port
        yield str(job.get("job_name")), port


def _prometheus_calls(inputs: Inputs) -> list[tuple[str, Destination, int, str]]:
    calls: list[tuple[str, Destination, int, str]] = []
    coredns = next((w for w in inputs.workloads() if w.describe() == COREDNS), None)
    if coredns is not None:
        dns = pod_isolation.pod_of(inputs, coredns)
        calls += [(f"CoreDNS ({COREDNS}) on {port}/{proto}", dns, port, proto) for port, proto in DNS_PORTS]
    config = _prometheus_config(inputs)
    if config is None:
        return calls  # scrape-path warns that the targets are unknown
    seen: set[tuple[IPv4Address, int]] = set()
    for job, address, port in _static_targets(config):
        if (address, port) not in seen:
            seen.add((address, port))
            calls.append((f"scrape target {address}:{port} (job {job})", address, port, "TCP"))
    pools = inputs.plan.node_pools
    for job, port in _node_jobs(config):
        for pool in pools:
            address = next(IPv4Network(pool.subnet).hosts())
            calls.append((f"node {address}:{port} of pool {pool.name} (job {job})", address, port, "TCP"))
    return calls


def _required(inputs: Inputs, workload: Resource) -> list[tuple[str, Destination, int, str]]:
    if workload.describe() == PROMETHEUS:
        return _apiservers(inputs) + _prometheus_calls(inputs)  # its discovery calls the apiservers
    _, _, token = _account_of(inputs, workload)
    return _apiservers(inputs) if token else []


def check(inputs: Inputs) -> list[Finding]:
    policies = pod_isolation.policies(inputs)
    findings: list[Finding] = []
    for workload in inputs.workloads():
        if not pod_isolation.pod_network(workload):
            continue  # a host-network pod: no policy selects it
        pod = pod_isolation.pod_of(inputs, workload)
        if not _egress_policies(policies, pod):
            continue  # not isolated for egress: it sends anywhere
        refused: list[str] = []
        names: list[str] = []
        for what, destination, port, protocol in _required(inputs, workload):
            ok, names = egress_admitted(policies, pod, destination, port, protocol)
            if not ok:
                refused.append(what)
        if not refused:
            continue
        # the first refused call of each kind (apiserver, CoreDNS, static target, node), and how many in all
        firsts: dict[str, str] = {}
        for what in refused:
            firsts.setdefault(what.split(" ")[0], what)
        shown = "; ".join(firsts.values()) + (f" ({len(refused)} calls refused)" if len(refused) > len(firsts) else "")
        blind = (": service discovery, every scrape and DNS fail, and every alert is blind"
                 if workload.describe() == PROMETHEUS else ": it cannot reach what it must")
        findings.append(Finding(
            NAME, "break", workload.describe(),
            f"NetworkPolicies {', '.join(f'{pod.namespace}/{n}' for n in names)} select its pods for egress and no "
            f"egress rule of them admits {shown}{blind}",
            "drop Egress from the namespace's default deny (kilonode.k8s.network_policy default_deny egress=False), "
            "or add egress rules admitting each call"))
    return findings
