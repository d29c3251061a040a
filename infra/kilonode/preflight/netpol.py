"""NetworkPolicy (networking.k8s.io/v1) as the API defines it: whether a flow from a source to a
pod on a port is admitted by the policies of the recorded graph. Pure: plain dicts in (objects as
recorded), verdicts out. Read by preflight's `contracts` (flows a component needs) and
`pod-isolation` (flows that must be refused) checks.

The semantics, from k8s.io/api networking/v1 types.go (NetworkPolicySpec, NetworkPolicyPeer,
NetworkPolicyPort) and kubernetes/website content/en/docs/concepts/services-networking/
network-policies.md:
- a pod is isolated for ingress (egress) when a policy of its namespace selects it (podSelector)
  with Ingress (Egress) among its policyTypes (policyTypes unset: Ingress, and Egress when the
  policy has egress rules); a flow needs the destination's ingress and the source's egress side
  each admitted, by any policy that isolates it, or that side not isolated;
- a rule admits when one of its peers matches (no `from`/`to`: every source) and one of its ports
  matches (no `ports`: every port); a port's protocol defaults to TCP, a named port is the
  destination container's port of that name, endPort makes a range;
- a peer: ipBlock (the address in cidr and in no `except`), podSelector alone (pods of the
  policy's namespace), namespaceSelector alone (every pod of the matching namespaces, by their
  labels, kubernetes.io/metadata.name among them), or both (pods matching in those namespaces). A
  source that is no pod (an apiserver, a node) matches ipBlock peers only.
What it leaves out: host-network pods (no policy selects what runs in the host's namespace) and
traffic from a pod's own node, which Calico never filters (kilonode.k8s.network_policy).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from ipaddress import IPv4Address, IPv4Network
from typing import Any

from kilonode.preflight.apiload import selector_matches

NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"


@dataclass(frozen=True)
class Pod:
    """A pod as policies see it: its namespace (with that namespace's labels), its labels, an address."""

    namespace: str
    labels: Mapping[str, str] = field(default_factory=dict)
    namespace_labels: Mapping[str, str] = field(default_factory=dict)
    address: IPv4Address | None = None
    # its containers' named ports, name -> (port, protocol)
    named_ports: Mapping[str, tuple[int, str]] = field(default_factory=dict)


@dataclass(frozen=True)
class Flow:
    """`source` (a pod, or an address that is no pod) to `destination` on port/protocol."""

    source: Pod | IPv4Address
    destination: Pod
    port: int
    protocol: str = "TCP"

    def describe(self) -> str:
        src = self.source if isinstance(self.source, IPv4Address) else f"a pod of namespace {self.source.namespace}"
        return f"{src} -> {self.port}/{self.protocol}"


def selects(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """A LabelSelector over `labels` (an empty or absent selector selects everything): the one
    evaluator preflight has (kilonode.preflight.apiload.selector_matches)."""
    return selector_matches(selector or {}, labels)


def _types(policy: Mapping[str, Any]) -> list[str]:
    spec = policy.get("spec") or {}
    if spec.get("policyTypes"):
        return list(spec["policyTypes"])
    return ["Ingress", *(["Egress"] if spec.get("egress") else [])]


def _peer_matches(peer: Mapping[str, Any], source: Pod | IPv4Address, policy_namespace: str) -> bool:
    if "ipBlock" in peer:
        block = peer["ipBlock"]
        address = source if isinstance(source, IPv4Address) else source.address
        return (address is not None and address in IPv4Network(block["cidr"], strict=False)
                and not any(address in IPv4Network(e, strict=False) for e in block.get("except") or []))
    if isinstance(source, IPv4Address):
        return False
    pods, namespaces = peer.get("podSelector"), peer.get("namespaceSelector")
    if namespaces is None and source.namespace != policy_namespace:
        return False
    if namespaces is not None and not selects(namespaces, {**source.namespace_labels,
                                                          NAMESPACE_NAME_LABEL: source.namespace}):
        return False
    return pods is None or selects(pods, source.labels)


def _port_matches(entry: Mapping[str, Any], flow: Flow) -> bool:
    if str(entry.get("protocol") or "TCP") != flow.protocol:
        return False
    port = entry.get("port")
    if port is None:
        return True
    if isinstance(port, str) and not port.isdigit():
        named = flow.destination.named_ports.get(port)
        return named is not None and named == (flow.port, flow.protocol)
    low = int(port)
    return low <= flow.port <= int(entry.get("endPort") or low)


def _side(policies: Sequence[Mapping[str, Any]], pod: Pod, direction: str, flow: Flow) -> bool:
    """Whether `pod`'s side of the flow is admitted: not isolated in `direction`, or admitted by a rule."""
    key, peers_key = ("ingress", "from") if direction == "Ingress" else ("egress", "to")
    other: Pod | IPv4Address = flow.source if direction == "Ingress" else flow.destination
    isolating = [p for p in policies
                 if (p.get("metadata") or {}).get("namespace") == pod.namespace
                 and selects((p.get("spec") or {}).get("podSelector"), pod.labels) and direction in _types(p)]
    if not isolating:
        return True
    for policy in isolating:
        namespace = (policy.get("metadata") or {}).get("namespace")
        for rule in (policy.get("spec") or {}).get(key) or []:
            peers = rule.get(peers_key)
            if peers and not any(_peer_matches(peer, other, namespace) for peer in peers):
                continue
            ports = rule.get("ports")
            if not ports or any(_port_matches(entry, flow) for entry in ports):
                return True
    return False


def admitted(policies: Sequence[Mapping[str, Any]], flow: Flow, *, egress: bool = True) -> bool:
    """Whether the flow passes: the destination's ingress, and (with `egress`) the source's egress when
    it is a pod. Without `egress`: whether the destination takes it (a source's own egress policy is
    its namespace's choice: the balloons call nothing)."""
    if not _side(policies, flow.destination, "Ingress", flow):
        return False
    return not egress or isinstance(flow.source, IPv4Address) or _side(policies, flow.source, "Egress", flow)


def isolated(policies: Sequence[Mapping[str, Any]], pod: Pod) -> bool:
    """Whether some policy isolates the pod for ingress."""
    return any((p.get("metadata") or {}).get("namespace") == pod.namespace
               and selects((p.get("spec") or {}).get("podSelector"), pod.labels) and "Ingress" in _types(p)
               for p in policies)
