"""The pod spec every kilonode system workload shares (the kube-system DaemonSets and
Deployments): its service account, its priority class, the host network where it needs one,
and the tolerations that say where it must still run. Each component adds its own
containers, volumes, affinity and the like."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pulumi_kubernetes import core

# set by the kubelet of a node that waits for the cloud provider to initialise it
UNINITIALIZED_TAINT = "node.cloudprovider.kubernetes.io/uninitialized"


def tolerate_every_taint() -> list[core.v1.TolerationArgs]:
    """Runs on any node, tainted GPU nodes included (kube-proxy, the serving-cert approver)."""
    return [core.v1.TolerationArgs(operator="Exists")]


def tolerate_critical_addons() -> list[core.v1.TolerationArgs]:
    """Admitted to nodes reserved for critical add-ons (CriticalAddonsOnly)."""
    return [core.v1.TolerationArgs(key="CriticalAddonsOnly", operator="Exists")]


def tolerate_uninitialized_nodes() -> list[core.v1.TolerationArgs]:
    """Runs on a node that is not yet initialised or ready (the first node of a cluster is
    one), and on critical add-on nodes: the cloud controller manager, the autoscaler."""
    return [
        core.v1.TolerationArgs(key=UNINITIALIZED_TAINT, operator="Exists", effect="NoSchedule"),
        core.v1.TolerationArgs(key="node.kubernetes.io/not-ready", operator="Exists", effect="NoSchedule"),
        *tolerate_critical_addons(),
    ]


def system_pod_spec(
    critical: Literal["node", "cluster"],
    *,
    service_account: core.v1.ServiceAccount | None = None,
    # TolerationArgs, or their plain dict form (the device plugin's, shared with its tests)
    tolerations: Sequence[core.v1.TolerationArgs | Mapping[str, str]] | None = None,
    host_network: bool = False,
    **spec: Any,  # the rest of core.v1.PodSpecArgs: containers, volumes, affinity, ...
) -> core.v1.PodSpecArgs:
    """A kube-system pod's spec at priority class system-<critical>-critical (node: it serves
    its own node; cluster: the cluster depends on it). Unset fields stay unset, as the
    apiserver would default them."""
    return core.v1.PodSpecArgs(
        service_account_name=service_account.metadata.name if service_account is not None else None,
        priority_class_name=f"system-{critical}-critical",
        host_network=True if host_network else None,
        tolerations=tolerations,
        **spec,
    )
