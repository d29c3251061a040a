"""A pool too small for what must run there (a second independent trace of kilonode diff on
research-7500, finding 4: the system pool's VM size D16ds_v5 -> D8ds_v5 left each system pod fitting
one node, so preflight's one-pod-at-a-time placement passed, while together they did not fit).

On the head, for each pool: the Deployments and StatefulSets that preflight places on that pool and
no other (their required node affinity, node selector and tolerations leave them only there: the
controllers on the system pool), replicas x requests, against the pool's allocatable: its nodes x
one node's allocatable less the DaemonSets that land there. The model is preflight's own
(kilonode.preflight.checks.scheduling: placement_of for where a workload can run, allocatable_after for a
node's room: the size's vCPUs and memory less the kubelet's hard eviction threshold, less the
DaemonSets' requests; requests_of as the scheduler sums a pod's requests), built from each side's
snapshot (kilonode.review.sides), so the review and preflight never disagree about a node's room.
A simplification as preflight's: requests summed against the sum of the nodes' room, no bin
packing (a pod does not split across nodes, so the real limit comes sooner).

Medium: the sum exceeds the pool's allocatable (pods stay Pending: the scheduler finds no node
with room), or it newly passes MARGIN of it (no room left to replace a node, or for a rollout's
surge pod).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kilonode.preflight.checks.scheduling import allocatable_after, daemonsets_on, placement_of, requests_of
from kilonode.preflight.model import Inputs
from kilonode.preflight.nodes import bootstrap_nodes
from kilonode.preflight.placement import expression_matches, pod_spec_of
from kilonode.review import sides
from kilonode.review.compare import StackDiff
from kilonode.review.finding import MEDIUM, Finding
from kilonode.review.lifecycle import plan_of

# What a pool may hold of its allocatable before a change that passes it is named: a node's loss
# (one of three system nodes is a third) or a Deployment's surge pod needs the rest.
MARGIN = 0.8
RESOURCES = (("cpu", "CPU", 1000.0, "cores"), ("memory", "memory", 2.0**30, "GiB"))


@dataclass(frozen=True)
class Load:
    host: str
    vm_size: str
    nodes: int
    demand: dict[str, float]
    room: dict[str, float]
    workloads: tuple[str, ...]
    # what only prefers this pool (a preferred node affinity naming it, other pools allowed), and where
    # it goes when this pool has no room: its pods land there before anywhere else while room lasts
    preferring: dict[str, float] = field(default_factory=lambda: {"cpu": 0.0, "memory": 0.0})
    preferring_workloads: tuple[str, ...] = ()
    spill_to: tuple[str, ...] = ()

    def ratio(self, key: str) -> float:
        return self.demand[key] / self.room[key] if self.room[key] > 0 else float("inf")

    def ratio_with_preferring(self, key: str) -> float:
        total = self.demand[key] + self.preferring[key]
        return total / self.room[key] if self.room[key] > 0 else float("inf")


def preferred_host(pod_spec: Mapping[str, Any], hosts: Sequence[str], groups: Sequence[Any]) -> str | None:
    """The one pool among `hosts` that the pod's preferred node affinity scores highest, as the
    scheduler's NodeAffinity score plugin sums the weights of the preferred terms a node matches
    (kubernetes pkg/scheduler/framework/plugins/nodeaffinity/node_affinity.go Score); None where no
    term matches or several pools tie."""
    terms = (((pod_spec.get("affinity") or {}).get("nodeAffinity") or {})
             .get("preferredDuringSchedulingIgnoredDuringExecution") or [])
    if not terms:
        return None
    scores: dict[str, int] = {}
    for g in groups:
        if g.host not in hosts:
            continue
        scores[g.host] = sum(int(t.get("weight") or 0) for t in terms
                             if all(expression_matches(e, g.node.labels)
                                    for e in (t.get("preference") or {}).get("matchExpressions") or []))
    best = max(scores.values(), default=0)
    winners = [h for h, score in scores.items() if score == best]
    return winners[0] if best > 0 and len(winners) == 1 else None


def loads(inputs: Inputs) -> dict[str, Load]:
    """pool role -> what must run there (only there), and what prefers it, against its room."""
    groups = [g for g in bootstrap_nodes(inputs) if g.count]
    workloads = list(inputs.workloads())
    daemonsets = [w for w in workloads if w.kind == "DaemonSet"]
    demand: dict[str, dict[str, float]] = {g.host: {"cpu": 0.0, "memory": 0.0} for g in groups}
    preferring: dict[str, dict[str, float]] = {g.host: {"cpu": 0.0, "memory": 0.0} for g in groups}
    names: dict[str, list[str]] = {g.host: [] for g in groups}
    preferring_names: dict[str, list[str]] = {g.host: [] for g in groups}
    spill: dict[str, set[str]] = {g.host: set() for g in groups}
    for w in workloads:
        if w.kind == "DaemonSet":
            continue
        found = placement_of(w, groups, daemonsets)
        where = set(found.now) | set(found.after_gpu_health)
        replicas = int((w.inputs.get("spec") or {}).get("replicas") or 1)
        asks = requests_of(pod_spec_of(w.inputs))
        if len(where) == 1:
            [host] = where
            for key in ("cpu", "memory"):
                demand[host][key] += replicas * asks[key]
            names[host].append(f"{w.describe()} x{replicas}")
            continue
        host = preferred_host(pod_spec_of(w.inputs), sorted(where), groups) if where else None
        if host is None:
            continue  # nowhere (workload-unplaceable says so), or no one pool preferred
        for key in ("cpu", "memory"):
            preferring[host][key] += replicas * asks[key]
        preferring_names[host].append(f"{w.describe()} x{replicas}")
        gpu = {g.host for g in groups if g.pool.gpus_per_node}
        spill[host] |= {f"{h} (GPU nodes)" if h in gpu else h for h in where - {host}}
    found_loads = {}
    for g in groups:
        free = allocatable_after(g, daemonsets_on(g, daemonsets))
        if free is None or not (names[g.host] or preferring_names[g.host]):
            continue
        found_loads[g.host] = Load(g.host, g.pool.vm_size, g.count, demand[g.host],
                                   {k: max(free[k], 0.0) * g.count for k in ("cpu", "memory")},
                                   tuple(names[g.host]), preferring[g.host], tuple(preferring_names[g.host]),
                                   tuple(sorted(spill[g.host])))
    return found_loads


# A second rule (`autoscaler-min-not-enforced`, medium), from a sixth independent trace: h100-ib's
# `autoscaling.minNodes` 1,250 -> 2,000 was "No risk found". cluster-autoscaler does not grow a node group
# to a raised min size: "Cluster Autoscaler will not scale the cluster beyond these limits, but does not
# enforce them. If your cluster is below the minimum number of nodes configured for Cluster Autoscaler,
# it will be scaled up *only* in presence of unschedulable pods" (kubernetes/autoscaler
# cluster-autoscaler/FAQ.md, "My cluster is below minimum / above maximum number of nodes, but CA did not
# fix that! Why?"), unless it runs with --enforce-node-group-min-size (FAQ "What are the parameters to
# CA?": "Should CA scale up the node group to the configured min size if needed", default false), which
# kilonode.k8s.autoscaler does not set (read here from the head's Deployment). And `pulumi up` does not
# set an autoscaled scale set's capacity either: it sends its live size back (kilonode.azure.live),
# the autoscaler owning it. The floors are the node groups' min sizes as the head's
# cluster-autoscaler Deployment passes them (--nodes=min:max:scale set); the review cannot see the
# scale sets' live sizes, which can be as low as the base's floors.
AUTOSCALER_DEPLOYMENT = ("kube-system", "cluster-autoscaler")
ENFORCE_FLAG = "--enforce-node-group-min-size"
_NODES_FLAG = re.compile(r"^--nodes=(\d+):(\d+):(\S+)$")


def _autoscaler_args(entry: Mapping[str, Any] | None) -> list[str] | None:
    for r in (entry or {}).get("resources", []):
        inputs = r.get("inputs") or {}
        meta = inputs.get("metadata") or {}
        if r.get("type") == "kubernetes:apps/v1:Deployment" and \
                (meta.get("namespace"), meta.get("name")) == AUTOSCALER_DEPLOYMENT:
            containers = (((inputs.get("spec") or {}).get("template") or {}).get("spec") or {}).get("containers")
            return [str(w) for c in containers or [] for w in [*(c.get("command") or []), *(c.get("args") or [])]]
    return None


def node_group_floors(entry: Mapping[str, Any] | None) -> dict[str, int]:
    """scale set -> its node group's min size, from the side's cluster-autoscaler --nodes flags."""
    return {m.group(3): int(m.group(1)) for w in _autoscaler_args(entry) or [] if (m := _NODES_FLAG.match(w))}


def _enforced(args: list[str]) -> bool:
    return any(w == ENFORCE_FLAG or w.lower() in (f"{ENFORCE_FLAG}=true", f"{ENFORCE_FLAG}=1") for w in args)


def min_not_enforced(diff: StackDiff) -> list[Finding]:
    """A pool whose autoscaler floor rises above what its node groups may hold now (the base's floors)."""
    args = _autoscaler_args(diff.head)
    if args is None or _enforced(args):
        return []
    before, after = node_group_floors(diff.base), node_group_floors(diff.head)
    owner = {str(s.get("name")): str(p.get("name")) for p in plan_of(diff.head).get("nodePools") or []
             if isinstance(p, Mapping) for s in p.get("shards") or [] if isinstance(s, Mapping)}
    pools: dict[str, list[tuple[str, int, int]]] = {}
    for shard, low in after.items():
        was = before.get(shard)
        if was is not None and low > was:
            pools.setdefault(owner.get(shard, shard), []).append((shard, was, low))
    found = []
    for pool, raised in sorted(pools.items()):
        was, now = sum(w for _, w, _ in raised), sum(n for _, _, n in raised)
        found.append(Finding(MEDIUM, "autoscaler-min-not-enforced", (
            f"pool {pool}: the autoscaler's floor over {len(raised)} node group(s) rises from {was:,} to {now:,} "
            "nodes, but nothing will scale them up to it: cluster-autoscaler keeps a node group from going below its "
            "min size and does not grow one that is below it, except for pending pods (kubernetes/autoscaler "
            "cluster-autoscaler/FAQ.md, \"My cluster is below minimum / above maximum number of nodes, but CA did "
            f"not fix that! Why?\"), unless it runs with {ENFORCE_FLAG}, which kilonode does not pass; and `pulumi "
            "up` gives an autoscaled scale set its live size back (kilonode.azure.live). Scale "
            "sets the autoscaler brought down toward the old floor stay there until pods are pending. To get there: "
            "set each scale set's capacity to at least its new min by hand (`az vmss scale --new-capacity`; the "
            f"autoscaler then never removes below it), or run the autoscaler with {ENFORCE_FLAG}=true, which makes "
            "it add nodes to every node group of every pool below its min at each loop, with no pending pod asking "
            "(up to --max-nodes-per-scaleup at a time: GPU nodes paid for idle, and a node group whose VMs fail to "
            "come up retried with backoff)"),
            tuple(shard for shard, _, _ in raised), cause=f"pool {pool} floor"))
    return found


def assess(diff: StackDiff) -> list[Finding]:
    head = sides.inputs(diff, "head")
    if head is None:
        return min_not_enforced(diff)
    base = sides.inputs(diff, "base")
    # each side's loads once (placement_of over every workload): both rules read them
    before, after = (loads(base) if base is not None else {}), loads(head)
    return [*pool_capacity(before, after), *pool_spill(before, after), *min_not_enforced(diff)]


def pool_capacity(before: Mapping[str, Load], after: Mapping[str, Load]) -> list[Finding]:
    """Pools whose must-run-here load newly passes their room, or MARGIN of it."""
    found = []
    for host, load in sorted(after.items()):
        was = before.get(host)
        over = [k for k, *_ in RESOURCES if load.ratio(k) > 1 and (was is None or was.ratio(k) <= 1)]
        near = [k for k, *_ in RESOURCES if MARGIN < load.ratio(k) <= 1 and (was is None or was.ratio(k) <= MARGIN)]
        if not over and not near:
            continue
        said = "; ".join(f"{label} {load.demand[k] / unit:,.1f} of {load.room[k] / unit:,.1f} {units} "
                         f"({load.ratio(k):.0%}" + (f", was {was.ratio(k):.0%})" if was else ")")
                         for k, label, unit, units in RESOURCES if k in over + near)
        what = ("more than its nodes hold: the pods past it stay Pending (no node has room), and a node's loss "
                "leaves less" if over else
                f"past {MARGIN:.0%} of what its nodes hold: no room to lose a node or to surge a rollout's pod")
        found.append(Finding(MEDIUM, "pool-capacity", (
            f"{host} ({load.nodes} x {load.vm_size}): what must run there and nowhere else asks for {said}, "
            f"{what}. Summed as preflight models a node (its vCPUs and memory less the kubelet's eviction "
            "threshold, less the DaemonSets there; kilonode.preflight.checks.scheduling), no bin packing, so the "
            f"real limit comes sooner. The workloads: {', '.join(load.workloads)}. Keep the larger size, or add "
            "nodes to the pool"), (host,)))
    return found


def pool_spill(before: Mapping[str, Load], after: Mapping[str, Load]) -> list[Finding]:
    """What only prefers a pool no longer fits there with what must run there (the trace's PR01: the
    system pool to D8ds_v5, where metrics-server's two replicas alone nearly fill two of the three
    nodes): the scheduler places the rest where the preference allows, which on research-7500
    includes GPU nodes, taking their CPU and memory from the jobs' pods."""
    found = []
    for host, load in sorted(after.items()):
        was = before.get(host)
        if not load.preferring_workloads or not load.spill_to:
            continue
        over = [k for k, *_ in RESOURCES
                if load.ratio_with_preferring(k) > 1 and (was is None or was.ratio_with_preferring(k) <= 1)]
        if not over:
            continue
        said = "; ".join(f"{label} {(load.demand[k] + load.preferring[k]) / unit:,.1f} of {load.room[k] / unit:,.1f} "
                         f"{units} ({load.ratio_with_preferring(k):.0%}"
                         + (f", was {was.ratio_with_preferring(k):.0%})" if was else ")")
                         for k, label, unit, units in RESOURCES if k in over)
        found.append(Finding(MEDIUM, "pool-capacity", (
            f"{host} ({load.nodes} x {load.vm_size}): what must run there with what prefers it asks for {said}: "
            f"the pods that only prefer it ({', '.join(load.preferring_workloads)}) no longer all fit, and the "
            "scheduler puts the rest where their preference allows (a preferred node affinity only scores nodes: "
            "kubernetes pkg/scheduler/framework/plugins/nodeaffinity), on "
            f"{', '.join(load.spill_to)}, taking room the jobs' pods there were given. Same model and "
            "simplification as preflight's (no bin packing). Keep the larger size, or add nodes to the pool"),
            (host,)))
    return found
