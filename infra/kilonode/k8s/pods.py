"""The pod spec every kilonode system workload shares (the kube-system DaemonSets and
Deployments): its service account, its priority class, the host network where it needs one,
and the tolerations that say where it must still run. Each component adds its own
containers, volumes, affinity and the like. And how long `pulumi up` waits for each
workload: a sized timeout, or not at all."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import pulumi
from pulumi_kubernetes import core

from kilonode.k8s.pod_security import pod_security_context
from kilonode.plan.model import AwaitsPlan
from kilonode.plan.wellknown import CRITICAL_ADDONS_KEY, POOL_LABEL, SYSTEM_LABEL

# set by the kubelet of a node that waits for the cloud provider to initialise it
UNINITIALIZED_TAINT = "node.cloudprovider.kubernetes.io/uninitialized"


# pulumi-kubernetes (>= 4.12) waits for a DaemonSet until kstatus calls it Current
# (provider/pkg/await/daemonset.go: `done := res.Status == status.CurrentStatus`, 10 minutes
# by default), that is until the pod of every node it selects is updated and available. For
# a DaemonSet over the pools' nodes that is the whole fleet: on a first `pulumi up` thousands
# of nodes are still allocating and joining, and later at 7,500 nodes some are always being
# repaired, so the wait would fail the run whatever its length. The annotation turns the wait
# off for the object (metadata/overrides.go ReadyCondition: "the ready condition will no-op");
# nothing in the program reads such a DaemonSet's outputs (no resource depends on one), so
# nothing downstream starts early. Where their readiness shows instead: each node's Ready
# condition and taints (cloud-node-manager lifts the uninitialized taint), the DaemonSet's
# status (`kubectl -n kube-system get ds`: desired, ready, available), and, before any run,
# `kilonode preflight`'s `scheduling` check, which traces offline that each lands on the nodes
# it must. Also on the balloons (kilonode.k8s.capacity), which may rightly stay Pending.
SKIP_AWAIT_ANNOTATION = "pulumi.com/skipAwait"
SKIP_AWAIT = {SKIP_AWAIT_ANNOTATION: "true"}


# A workload that reads its mounted ConfigMap only when it starts never applies a change to it:
# the kubelet swaps the volume's files in place (an atomic symlink swap), which a process that
# does not look again never sees, and changing only the ConfigMap leaves the pod template as it
# was, so nothing rolls: pods started later get the new config, running ones keep the old, and
# the fleet splits silently. The digest of what the pod mounts, as a pod-template annotation,
# makes a config change a template change: the DaemonSet, Deployment or StatefulSet then rolls
# under its own update strategy (maxUnavailable), and `kilonode diff` shows it as the rollout it
# is (kilonode.review's daemonset-rollout and deployment rules). Only on consumers that read the
# file at start alone; each cites upstream where it reads it. One that reloads on its own
# (CoreDNS's `reload`, Prometheus's auto-reload) or reads through the API each time (the
# cluster-proportional-autoscaler) carries none: a roll would restart it for nothing.
CONFIG_DIGEST_ANNOTATION = "kilonode.io/config-sha256"


def config_digest(data: Mapping[str, str]) -> str:
    """The SHA-256 of a ConfigMap's data (key -> text) in one canonical form: its keys sorted,
    JSON-encoded, so equal data gives an equal digest whatever the order it was built in."""
    canonical = json.dumps(dict(data), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def config_digest_annotation(data: Mapping[str, pulumi.Input[str]]) -> dict[str, pulumi.Input[str]]:
    """{CONFIG_DIGEST_ANNOTATION: digest} for a pod template, from the very data given to the
    ConfigMap the pod mounts (values may be Outputs: azure.json waits for Azure's IDs)."""
    if all(isinstance(value, str) for value in data.values()):
        return {CONFIG_DIGEST_ANNOTATION: config_digest(data)}  # type: ignore[arg-type]
    keys = list(data)
    digest = pulumi.Output.all(*(data[k] for k in keys)).apply(
        lambda values: config_digest(dict(zip(keys, values, strict=True))))
    return {CONFIG_DIGEST_ANNOTATION: digest}


def awaited(opts: pulumi.ResourceOptions, awaits: AwaitsPlan) -> pulumi.ResourceOptions:
    """`opts` plus the plan's timeouts (components.awaits), for a workload whose pods land on
    pool nodes that may still be on their way (a Deployment) or that waits for such a pod
    (the DNS Service's endpoint): pulumi-kubernetes's 10 minutes assume the nodes exist.
    `customTimeouts` comes first in its order (metadata/overrides.go TimeoutDuration)."""
    return pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(custom_timeouts=pulumi.CustomTimeouts(
        create=f"{awaits.create_min}m", update=f"{awaits.update_min}m")))


def tolerate_every_taint() -> list[core.v1.TolerationArgs]:
    """Runs on any node, tainted GPU nodes included (kube-proxy, the serving-cert approver)."""
    return [core.v1.TolerationArgs(operator="Exists")]


def tolerate_critical_addons() -> list[core.v1.TolerationArgs]:
    """Admitted to nodes reserved for critical add-ons: the system pools' CriticalAddonsOnly
    taint (kilonode.plan.wellknown.SYSTEM_TAINT). Every kube-system workload that prefers the
    system pool (system_pod_spec(system_pool=True)) carries it, or tolerates every taint."""
    return [core.v1.TolerationArgs(key=CRITICAL_ADDONS_KEY, operator="Exists")]


def tolerate_uninitialized_nodes() -> list[core.v1.TolerationArgs]:
    """Runs on a node that is not yet initialised or ready (the first node of a cluster is
    one), and on critical add-on nodes: the cloud controller manager, the autoscaler."""
    return [
        core.v1.TolerationArgs(key=UNINITIALIZED_TAINT, operator="Exists", effect="NoSchedule"),
        core.v1.TolerationArgs(key="node.kubernetes.io/not-ready", operator="Exists", effect="NoSchedule"),
        *tolerate_critical_addons(),
    ]


# The weight of the system-pool preference: the highest the scheduler takes (1-100), so it
# outweighs spreading scores; a preference, not a requirement, because a stack may have no
# system pool (its workloads then run on any node they tolerate) and a workload with more
# replicas than the system pool has nodes (CoreDNS: one per node) places the rest elsewhere.
SYSTEM_POOL_WEIGHT = 100


def on_pools(pools: Sequence[str], affinity: core.v1.AffinityArgs | None = None,
             preferred: list[core.v1.PreferredSchedulingTermArgs] | None = None) -> core.v1.AffinityArgs:
    """`affinity` (its pod affinities kept) with a required node affinity to the pools named
    (kilonode.io/pool In ...) and the `preferred` node terms: for a controller whose token must
    not land beside user work (ClusterPlan.controller_pools; preflight's `node-writers`)."""
    if not pools:
        raise ValueError("on_pools: no pool to run on (the plan's controller_pools is empty)")
    return core.v1.AffinityArgs(
        node_affinity=core.v1.NodeAffinityArgs(
            required_during_scheduling_ignored_during_execution=core.v1.NodeSelectorArgs(node_selector_terms=[
                core.v1.NodeSelectorTermArgs(match_expressions=[core.v1.NodeSelectorRequirementArgs(
                    key=POOL_LABEL, operator="In", values=sorted(pools))]),
            ]),
            preferred_during_scheduling_ignored_during_execution=preferred,
        ),
        pod_affinity=affinity.pod_affinity if affinity is not None else None,
        pod_anti_affinity=affinity.pod_anti_affinity if affinity is not None else None,
    )


def prefer_system_pool(affinity: core.v1.AffinityArgs | None) -> core.v1.AffinityArgs:
    """`affinity` plus a preferred node affinity for the system pool's nodes
    (kilonode.io/system=true, NodePoolConfig.system)."""
    term = core.v1.PreferredSchedulingTermArgs(
        weight=SYSTEM_POOL_WEIGHT,
        preference=core.v1.NodeSelectorTermArgs(match_expressions=[
            core.v1.NodeSelectorRequirementArgs(key=SYSTEM_LABEL, operator="In", values=["true"]),
        ]),
    )
    node = affinity.node_affinity if affinity is not None else None
    return core.v1.AffinityArgs(
        node_affinity=core.v1.NodeAffinityArgs(
            required_during_scheduling_ignored_during_execution=(
                node.required_during_scheduling_ignored_during_execution if node is not None else None),
            preferred_during_scheduling_ignored_during_execution=[
                term, *((node.preferred_during_scheduling_ignored_during_execution or []) if node is not None else [])],
        ),
        pod_affinity=affinity.pod_affinity if affinity is not None else None,
        pod_anti_affinity=affinity.pod_anti_affinity if affinity is not None else None,
    )


def _key(toleration: core.v1.TolerationArgs | Mapping[str, str]) -> str | None:
    return toleration.get("key") if isinstance(toleration, Mapping) else toleration.key  # type: ignore[return-value]


def _operator(toleration: core.v1.TolerationArgs | Mapping[str, str]) -> str | None:
    return toleration.get("operator") if isinstance(toleration, Mapping) else toleration.operator  # type: ignore[return-value]


def system_pod_spec(
    critical: Literal["node", "cluster"],
    *,
    service_account: core.v1.ServiceAccount | None = None,
    # TolerationArgs, or their plain dict form (the device plugin's, shared with its tests)
    tolerations: Sequence[core.v1.TolerationArgs | Mapping[str, str]] | None = None,
    host_network: bool = False,
    # a cluster-wide workload (a Deployment): prefer the system pool's nodes
    system_pool: bool = False,
    affinity: core.v1.AffinityArgs | Mapping[str, Any] | None = None,
    **spec: Any,  # the rest of core.v1.PodSpecArgs: containers, volumes, ...
) -> core.v1.PodSpecArgs:
    """A kube-system pod's spec at priority class system-<critical>-critical (node: it serves
    its own node; cluster: the cluster depends on it). Unset fields stay unset, as the
    apiserver would default them, except the pod security context: RuntimeDefault seccomp on
    every pod (kilonode.k8s.pod_security; pass `security_context` built by its
    pod_security_context to add to it)."""
    security = spec.pop("security_context", None) or pod_security_context()
    if not isinstance(security, core.v1.PodSecurityContextArgs) or security.seccomp_profile is None:
        raise ValueError("system_pod_spec: security_context needs kilonode.k8s.pod_security.pod_security_context")
    if system_pool:
        if affinity is not None and not isinstance(affinity, core.v1.AffinityArgs):
            raise TypeError("system_pool=True needs affinity as core.v1.AffinityArgs")
        affinity = prefer_system_pool(affinity)
        # the system pool is tainted (SYSTEM_TAINT): a workload that prefers it must tolerate that
        if not any(_key(t) in (CRITICAL_ADDONS_KEY, None) and _operator(t) == "Exists" for t in tolerations or ()):
            tolerations = [*(tolerations or ()), *tolerate_critical_addons()]
    return core.v1.PodSpecArgs(
        service_account_name=service_account.metadata.name if service_account is not None else None,
        priority_class_name=f"system-{critical}-critical",
        host_network=True if host_network else None,
        tolerations=tolerations,
        affinity=affinity,
        security_context=security,
        **spec,
    )
