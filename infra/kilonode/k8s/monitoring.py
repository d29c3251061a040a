"""MonitoringRules: what a user's own Prometheus needs, delivered in the cluster: a `monitoring`
Namespace and a ConfigMap holding the rule file and the scrape-configuration fragment that
kilonode.render.monitoring renders for this plan. kilonode runs no Prometheus itself; one
running in this Namespace mounts the ConfigMap (docs/monitoring.md).

The files come rendered from the caller: a kilonode.k8s module takes rendered files, it does
not render them (tests/test_structure.py: layers).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import pulumi
from pulumi_kubernetes import core, meta

from kilonode.k8s.network_policy import PROMETHEUS_PORT, default_deny, same_namespace_port
from kilonode.k8s.pod_security import kilonode_namespace
from kilonode.plan import defaults

# The namespace API Priority and Fairness already classifies (kilonode.k8s.flowcontrol): a
# Prometheus run here under its own ServiceAccount mounts this ConfigMap and its requests queue
# in the monitoring priority level, not beside the control plane's.
NAMESPACE = defaults.MONITORING_NAMESPACE
CONFIG_MAP = "kilonode-prometheus"
LABELS = {"app.kubernetes.io/name": "kilonode-monitoring", "app.kubernetes.io/managed-by": "kilonode"}
# A ConfigMap's values may hold at most 1 MiB together (kubernetes pkg/apis/core/validation/
# validation.go ValidateConfigMap: the sum of len(value) over data and binaryData against
# core.MaxSecretSize = 1 MiB); refused here rather than by the apiserver at `pulumi up`.
CONFIG_MAP_MAX_BYTES = 1024 * 1024


@dataclass(frozen=True)
class MonitoringRulesArgs:
    # file name -> text (kilonode.render.monitoring.monitoring_files): the ConfigMap's data
    files: Mapping[str, str] = field(default_factory=dict)
    kubernetes_minor: int = 0  # the cluster's: the PodSecurity version labels (required)


def config_map_size(files: Mapping[str, str]) -> int:
    """Bytes the apiserver counts against the limit: the values' (UTF-8)."""
    return sum(len(value.encode()) for value in files.values())


class MonitoringRules(pulumi.ComponentResource):
    def __init__(self, name: str, args: MonitoringRulesArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("kilonode:k8s:MonitoringRules", name, None, opts)
        if not args.files:
            raise ValueError("MonitoringRules: no files to deliver")
        size = config_map_size(args.files)
        if size > CONFIG_MAP_MAX_BYTES:
            raise ValueError(f"MonitoringRules: {size} bytes exceed a ConfigMap's {CONFIG_MAP_MAX_BYTES}")
        if not args.kubernetes_minor:
            raise ValueError("MonitoringRules: no kubernetes_minor")
        child = pulumi.ResourceOptions(parent=self)
        namespace = self.namespace = kilonode_namespace(f"{name}-namespace", NAMESPACE, LABELS,
                                                        args.kubernetes_minor, child)
        # The user's Prometheus scrapes out (egress stays open: apiservers, etcd, kubelets) and
        # is queried in: from its own namespace only, unless the user adds a policy.
        default_deny(f"{name}-default-deny", namespace.metadata.name, LABELS, egress=False, opts=child)
        same_namespace_port(f"{name}-allow-prometheus", namespace.metadata.name, LABELS, PROMETHEUS_PORT, child)
        core.v1.ConfigMap(
            f"{name}-config",
            metadata=meta.v1.ObjectMetaArgs(name=CONFIG_MAP, namespace=namespace.metadata.name, labels=LABELS),
            data=dict(args.files),
            opts=child,
        )
        self.register_outputs({})
