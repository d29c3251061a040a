"""A Deployment's replicas cut (`replicas-cut`): the fourteenth independent trace of `kilonode diff` found
calico-typha 39 -> 9 replicas on research-7500 said only in the resource list ("No risk found").

A lower spec.replicas is carried out at once: the Deployment controller scales its ReplicaSet
(kubernetes pkg/controller/deployment/sync.go scale), and the ReplicaSet controller deletes the surplus pods in
one sync, up to its burst of 500 (pkg/controller/replicaset/replica_set.go manageReplicas, BurstReplicas).
`strategy.rollingUpdate` paces a template change, not a scale-down, and a PodDisruptionBudget guards evictions,
not a controller's own deletions (Kubernetes docs, "Disruptions"). Medium for any cut; high where the workload
serves the nodes and the cut leaves each replica more nodes than upstream sizes it for: calico-typha, one per
catalogue calicoTypha.nodesPerReplica (the Tigera operator's rule, kilonode.plan.resolve.components
typha_replicas): each deleted Typha's Felix clients reconnect to the rest and resync their whole state, and
policy for new pods waits meanwhile.

CoreDNS, whose replicas the DNS autoscaler owns, is `dns-replicas-cut`'s (kilonode.review.coredns); the cluster
autoscaler's Deployment, left to the operator after creation (ignoreChanges), is not a cut of this stack's.

Pure: a StackDiff in, findings out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from kilonode.catalog.limits import limits
from kilonode.plan.resolve.components import typha_replicas
from kilonode.review.compare import UPDATE, StackDiff
from kilonode.review.finding import HIGH, MEDIUM, Finding
from kilonode.review.lifecycle import plan_of

DEPLOYMENT = "kubernetes:apps/v1:Deployment"
TYPHA = "calico-typha"


def _replicas(record: Mapping[str, Any] | None) -> int | None:
    value = (((record or {}).get("inputs") or {}).get("spec") or {}).get("replicas")
    return value if isinstance(value, int) else None


def _name(record: Mapping[str, Any] | None) -> tuple[str, str]:
    meta = (((record or {}).get("inputs") or {}).get("metadata") or {})
    return str(meta.get("namespace") or "default"), str(meta.get("name") or "")


def _nodes(entry: Mapping[str, Any] | None) -> int:
    return sum(int(p.get("nodes") or 0) for p in plan_of(entry).get("nodePools") or [] if isinstance(p, Mapping))


def assess(diff: StackDiff) -> list[Finding]:
    found = []
    for c in diff.resources:
        if c.type != DEPLOYMENT or c.action != UPDATE:
            continue
        if any(i.path == "spec.replicas" and i.ignored for i in c.inputs):
            continue
        was, now = _replicas(c.base), _replicas(c.head)
        if was is None or now is None or now >= was:
            continue
        namespace, name = _name(c.head)
        said = (f"Deployment {namespace}/{name} replicas {was} -> {now}: {was - now} pods are deleted together "
                "within seconds of `pulumi up` (the ReplicaSet's scale-down, pkg/controller/replicaset "
                "manageReplicas; rollingUpdate paces template changes only, a PodDisruptionBudget evictions only)")
        level = MEDIUM
        if name == TYPHA:
            nodes = _nodes(diff.head)
            ceiling = limits().calico_typha.nodes_per_replica.value
            per = math.ceil(nodes / now) if now else nodes
            wanted = typha_replicas(nodes)
            said += (f". Each Felix of the deleted Typhas reconnects to another and resyncs its whole state; the "
                     f"{nodes:,} nodes' Felix then share {now} Typhas, {per:,} each, where upstream sizes one per "
                     f"{ceiling:g} nodes ({wanted} replicas here by the Tigera operator's rule: "
                     f"{limits().calico_typha.nodes_per_replica.source})")
            if per > ceiling:
                level = HIGH
                said += "; policy for new pods waits on the resync, and each Typha carries more than it is sized for"
        found.append(Finding(level, "replicas-cut", said + ". Lower it in steps, watching the workload's own "
                             "health between them", (f"Deployment {namespace}/{name}",)))
    return found
