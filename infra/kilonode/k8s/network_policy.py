"""NetworkPolicies of kilonode's own namespaces: each denies all ingress by default and lets in
only what its pods serve (networking.k8s.io/v1; an empty podSelector selects every pod of the
namespace, and a policy with policyTypes [Ingress] and no rules admits nothing,
kubernetes/website content/en/docs/concepts/services-networking/network-policies.md
"Default deny all ingress traffic").

Not enforced: the pools' CNI is Azure CNI's azure-vnet plugin alone (kilonode.render.cni),
which does not implement NetworkPolicy; that takes a policy engine on every node, and neither
candidate is shipped (Azure Network Policy Manager stops at 250 nodes on Linux; Cilium chained
after azure-vnet is not yet sized or tested at this scale: docs/in-cluster.md, "NetworkPolicy:
what is enforced, and why no engine is shipped"). The objects are what the namespaces need
once one runs, and policy/security-exceptions.yaml says plainly that nothing enforces them.

kube-system has none: most of its pods use the host network, which NetworkPolicy does not
cover, and CoreDNS must answer every pod; a rule there would protect nothing it names.
"""

from __future__ import annotations

from collections.abc import Mapping

import pulumi
from pulumi_kubernetes import meta, networking

# Prometheus's own port (its --web.listen-address default, :9090), open to pods of the same
# namespace only: a dashboard run beside it queries it; anything else needs its own policy.
PROMETHEUS_PORT = 9090


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
