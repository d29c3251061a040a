"""The reserved pools are the cluster's own: a ValidatingAdmissionPolicy refuses, outside the
system namespaces, every pod that could run on a system pool or the Prometheus pool.

Why: under Azure CNI a pod's address is one of its node's subnet, so the NSGs and the node
firewall can only name the scraper by the Prometheus pool's subnet (kilonode.plan.listeners), and
a user's pod there would be the scraper too: it would read etcd's metrics, the certificate expiry
and every node's per-pod traffic port, a root process per connection. Beside the system pools'
controllers it would also share a node with their ServiceAccount tokens and, on the host network's
side, their identities. A taint keeps pods off only until a pod tolerates it, and any pod may
(core/v1 Toleration: an empty key with operator Exists tolerates every taint); a pod may also name
its node (spec.nodeName), which no NoSchedule taint stops, since the scheduler never sees it. So
the policy refuses a pod (create and update: tolerations may be added to a running pod) that
- tolerates every taint that keeps pods off a reserved pool (kilonode.plan.listeners
  keeping_taints), matched as the scheduler matches them (Toleration.ToleratesTaint: effect, key,
  then Exists or Equal on the value); or
- names a node of a reserved pool: a node's name is its scale set's computer-name prefix and six
  characters (kilonode.k8s.capacity, the same rule as the node-identity policy);
unless its namespace is one of SYSTEM_NAMESPACES (kilonode.plan.defaults.pod_security).

A user's DaemonSet that tolerates every taint (a log shipper, an exporter) is refused on those
nodes too: its pods fail to create there, and the message says to list the taints it means or
run it in a system namespace. Upstream has no built-in for this; AKS keeps application pods off
its system pools with the same CriticalAddonsOnly taint and leaves tolerating it to the user.

Where the Prometheus pool has no taint of its own (the `local` stack: Prometheus on the one
untainted pool) nothing can reserve it: preflight's `listeners` check warns that users' pods are
the scraper's neighbours there.
"""

from __future__ import annotations

import pulumi

from kilonode.k8s.admission import admission_policy
from kilonode.k8s.capacity import LABELS
from kilonode.plan import defaults
from kilonode.plan.listeners import keeping_taints, reserved_pools
from kilonode.plan.model import ClusterPlan

POLICY_NAME = "kilonode-reserved-pools"


def _tolerates(key: str, value: str, effect: str) -> str:
    """CEL: some toleration of the pod tolerates the taint (k8s.io/api core/v1
    Toleration.ToleratesTaint: an effect, when given, must be the taint's; a key, when given, must
    be the taint's; then Exists tolerates any value, Equal (the default) only the taint's)."""
    return (
        "object.spec.tolerations.exists(t, "
        f"(!has(t.effect) || t.effect == '' || t.effect == '{effect}') && "
        f"(!has(t.key) || t.key == '' || t.key == '{key}') && "
        "((has(t.operator) && t.operator == 'Exists') || "
        "((!has(t.operator) || t.operator == '' || t.operator == 'Equal') && "
        f"(has(t.value) ? t.value : '') == '{value}')))"
    )


def _taint_parts(taint: str) -> tuple[str, str, str]:
    """`key[=value]:effect` (the plan's form) -> (key, value, effect)."""
    key_value, _, effect = taint.rpartition(":")
    key, _, value = key_value.partition("=")
    return key, value, effect


def reserved_pool_rule(plan: ClusterPlan) -> str | None:
    """CEL: the pod is in a system namespace, or it can land on no reserved pool. None where the
    plan has no reserved pool."""
    pools = reserved_pools(plan)
    if not pools:
        return None
    fits = [" && ".join(_tolerates(*_taint_parts(t)) for t in keeping_taints(pool)) for pool in pools]
    prefixes = ", ".join(repr(shard.name.lower()) for pool in pools for shard in pool.shards)
    named = (f"(has(object.spec.nodeName) && [{prefixes}].exists(p, object.spec.nodeName.startsWith(p) && "
             "size(object.spec.nodeName) == size(p) + 6))")
    namespaces = ", ".join(repr(n) for n in defaults.SYSTEM_NAMESPACES)
    tolerating = " || ".join(f"({fit})" for fit in fits)
    return (f"request.namespace in [{namespaces}] || "
            f"!((has(object.spec.tolerations) && ({tolerating})) || {named})")


def reserved_pools_message(plan: ClusterPlan) -> str:
    names = ", ".join(f"{p.name} ({', '.join(keeping_taints(p))})" for p in reserved_pools(plan))
    return (f"pools {names} run the cluster's own workloads only: a pod outside "
            f"{', '.join(defaults.SYSTEM_NAMESPACES)} may not tolerate all of such a pool's taints nor name one of "
            "its nodes. Give it tolerations that name the taints it means (not an empty key with operator Exists), "
            "or run it in a system namespace")


class ReservedPools(pulumi.ComponentResource):
    """The policy and its binding, where the plan has a reserved pool (nothing otherwise)."""

    def __init__(self, name: str, plan: ClusterPlan, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("kilonode:k8s:ReservedPools", name, None, opts)
        rule = reserved_pool_rule(plan)
        if rule is not None:
            admission_policy(name, POLICY_NAME, "pods", [(rule, reserved_pools_message(plan))], LABELS,
                             pulumi.ResourceOptions(parent=self))
        self.register_outputs({})
