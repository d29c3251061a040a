"""NetworkPolicies: kilonode's own namespaces deny all ingress by default and let in only what
their pods serve; in kube-system, each pod-network workload kilonode runs admits exactly what it
serves (KUBE_SYSTEM_INGRESS). networking.k8s.io/v1: an empty podSelector selects every pod of the
namespace, and a policy with policyTypes [Ingress] and no rules admits nothing
(kubernetes/website content/en/docs/concepts/services-networking/network-policies.md "Default deny
all ingress traffic"); a pod selected by any ingress policy takes only what one of them admits.

Enforced by Calico's Felix on every pool node (kilonode.k8s.calico). What no policy here governs:
host-network pods (kube-proxy, cloud-node-manager, the device plugins, Typha and Felix themselves:
the host's ports are the host firewall's and the NSGs' business), and traffic from a pod's own node
to it (Felix never filters host -> local pod, so the kubelet's probes pass:
projectcalico/calico@v3.31.7:felix/rules/static.go:727-744).

kube-system gets no namespace-wide default deny: a workload an operator adds there (a
kube-state-metrics that Prometheus scrapes) would be cut off without a policy of its own. Each of
kilonode's pod-network workloads there is selected instead, so it is isolated; preflight's
`pod-isolation` check fails if one is not, and judges every required flow
(catalog/contracts.yaml) against these objects.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pulumi
from pulumi_kubernetes import meta, networking

from kilonode.k8s.bootstrap import KUBE_SYSTEM
from kilonode.plan import defaults

# Prometheus's own port (its --web.listen-address default, :9090), open to pods of the same
# namespace only: a dashboard run beside it queries it; anything else needs its own policy.
PROMETHEUS_PORT = 9090
# The cluster's Prometheus pods, as a NetworkPolicy peer: their namespace (by the label the API server sets on
# every namespace, kubernetes.io/metadata.name) and their labels: kilonode.k8s.monitoring's PROMETHEUS_LABELS,
# repeated here because that module imports this one (tests/monitoring/test_observability.py holds them equal).
PROMETHEUS_NAMESPACE = defaults.MONITORING_NAMESPACE
PROMETHEUS_POD_LABELS = {"app.kubernetes.io/name": "prometheus", "app.kubernetes.io/managed-by": "kilonode"}


def default_deny(name: str, namespace: pulumi.Input[str], labels: Mapping[str, str], *, egress: bool,
                 opts: pulumi.ResourceOptions) -> networking.v1.NetworkPolicy:
    """No ingress to any pod of the namespace (and no egress with `egress`)."""
    return networking.v1.NetworkPolicy(
        name,
        metadata=meta.v1.ObjectMetaArgs(name="default-deny", namespace=namespace, labels=dict(labels)),
        spec=networking.v1.NetworkPolicySpecArgs(
            pod_selector=meta.v1.LabelSelectorArgs(),
            policy_types=["Ingress", "Egress"] if egress else ["Ingress"],
        ),
        opts=opts,
    )


def same_namespace_port(name: str, namespace: pulumi.Input[str], labels: Mapping[str, str], port: int,
                        opts: pulumi.ResourceOptions) -> networking.v1.NetworkPolicy:
    """TCP `port` of every pod in the namespace, from pods of the same namespace."""
    return networking.v1.NetworkPolicy(
        name,
        metadata=meta.v1.ObjectMetaArgs(name=f"allow-same-namespace-{port}", namespace=namespace,
                                        labels=dict(labels)),
        spec=networking.v1.NetworkPolicySpecArgs(
            pod_selector=meta.v1.LabelSelectorArgs(),
            policy_types=["Ingress"],
            ingress=[networking.v1.NetworkPolicyIngressRuleArgs(
                # an empty podSelector in `from`: every pod of the policy's own namespace
                from_=[networking.v1.NetworkPolicyPeerArgs(pod_selector=meta.v1.LabelSelectorArgs())],
                ports=[networking.v1.NetworkPolicyPortArgs(protocol="TCP", port=port)],
            )],
        ),
        opts=opts,
    )


@dataclass(frozen=True)
class Admit:
    """What one kube-system workload serves to whom: `ports` ("53/UDP"), from `peers` -- "everywhere"
    (every pod and every address: no `from`), "apiservers" (each apiserver's address), or "prometheus"
    (the cluster's Prometheus pods alone: PROMETHEUS_NAMESPACE and PROMETHEUS_POD_LABELS)."""

    ports: tuple[str, ...]
    peers: str


# kube-system's pod-network workloads kilonode runs, by the labels their pods carry (the policy's
# podSelector), and what each admits. Everything else reaches them only from their own node (the
# kubelet's probes). Who calls each, read at the pinned releases: catalog/contracts.yaml.
KUBE_SYSTEM_INGRESS: tuple[tuple[str, Mapping[str, str], tuple[Admit, ...]], ...] = (
    # cluster DNS: every pod's resolv.conf names its Service (kilonode.k8s.dns), and host-network pods
    # with ClusterFirstWithHostNet ask from their node's address (contracts.yaml coredns served-to-every-pod)
    # and its metrics (the Corefile's `prometheus :9153`) to the cluster's Prometheus alone (the scrape job
    # kilonode-coredns, kilonode.render.monitoring)
    ("coredns", {"k8s-app": "kube-dns"},
     (Admit(("53/UDP", "53/TCP"), "everywhere"), Admit(("9153/TCP",), "prometheus"))),
    # the aggregation layer: the apiservers dial its pod IP (contracts.yaml metricsServer apiserver-reach)
    ("metrics-server", {"k8s-app": "metrics-server"}, (Admit(("10250/TCP",), "apiservers"),)),
    # clients of the apiserver only; nothing calls them
    ("coredns-autoscaler", {"k8s-app": "coredns-autoscaler"}, ()),
    ("kubelet-csr-approver", {"app.kubernetes.io/name": "kubelet-csr-approver"}, ()),
    ("kilonode-gang-scheduler", {"app.kubernetes.io/name": "kilonode-gang-scheduler"}, ()),
    ("kilonode-gang-controller", {"app.kubernetes.io/name": "kilonode-gang-controller"}, ()),
)


def _ports(ports: Sequence[str]) -> list[networking.v1.NetworkPolicyPortArgs]:
    parsed = [p.split("/") for p in ports]
    return [networking.v1.NetworkPolicyPortArgs(protocol=proto, port=int(port)) for port, proto in parsed]


def workload_policy(name: str, workload: str, selector: Mapping[str, str], admits: Sequence[Admit],
                    apiservers: Sequence[str], labels: Mapping[str, str],
                    opts: pulumi.ResourceOptions) -> networking.v1.NetworkPolicy:
    """kube-system/<workload>: its pods (`selector`) isolated for ingress, `admits` let in."""
    rules = []
    for admit in admits:
        if admit.peers == "everywhere":
            peers = None
        elif admit.peers == "prometheus":
            peers = [networking.v1.NetworkPolicyPeerArgs(
                namespace_selector=meta.v1.LabelSelectorArgs(
                    match_labels={"kubernetes.io/metadata.name": PROMETHEUS_NAMESPACE}),
                pod_selector=meta.v1.LabelSelectorArgs(match_labels=dict(PROMETHEUS_POD_LABELS)))]
        elif admit.peers == "apiservers":
            peers = [networking.v1.NetworkPolicyPeerArgs(ip_block=networking.v1.IPBlockArgs(cidr=f"{ip}/32"))
                     for ip in apiservers]
        else:
            raise ValueError(f"{workload}: unknown peers {admit.peers!r}")
        rules.append(networking.v1.NetworkPolicyIngressRuleArgs(from_=peers, ports=_ports(admit.ports)))
    return networking.v1.NetworkPolicy(
        name,
        metadata=meta.v1.ObjectMetaArgs(name=workload, namespace=KUBE_SYSTEM, labels=dict(labels)),
        spec=networking.v1.NetworkPolicySpecArgs(
            pod_selector=meta.v1.LabelSelectorArgs(match_labels=dict(selector)),
            policy_types=["Ingress"],
            ingress=rules or None,
        ),
        opts=opts,
    )


class KubeSystemPolicies(pulumi.ComponentResource):
    """One NetworkPolicy per kube-system workload of KUBE_SYSTEM_INGRESS that the cluster runs."""

    def __init__(self, name: str, workloads: Sequence[str], apiservers: Sequence[str],
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("kilonode:k8s:KubeSystemPolicies", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        labels = {"app.kubernetes.io/managed-by": "kilonode"}
        for workload, selector, admits in KUBE_SYSTEM_INGRESS:
            if workload in workloads:
                workload_policy(f"{name}-{workload}", workload, selector, admits, apiservers, labels, child)
        self.register_outputs({})
