"""A pool too small for what must run there (a second independent trace of kilonode diff on
research-7500, finding 4: the system pool's VM size D16ds_v5 -> D8ds_v5 left each system pod fitting
one node, so preflight's one-pod-at-a-time placement passed, while together they did not fit).

On the head, for each pool: the Deployments and StatefulSets that preflight places on that pool and
no other (their required node affinity, node selector and tolerations leave them only there: the
controllers on the system pool), replicas x requests, against the pool's allocatable: its nodes x
one node's allocatable less the DaemonSets that land there. The model is preflight's own
(kilonode.preflight.checks.scheduling: placement_of for where a workload can run, _allocatable for a
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

from dataclasses import dataclass

from kilonode.preflight.checks.scheduling import _allocatable, _daemonsets_on, placement_of, requests_of
from kilonode.preflight.model import Inputs
from kilonode.preflight.nodes import bootstrap_nodes
from kilonode.preflight.placement import pod_spec_of
from kilonode.review import sides
from kilonode.review.compare import StackDiff
from kilonode.review.finding import MEDIUM, Finding

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

    def ratio(self, key: str) -> float:
        return self.demand[key] / self.room[key] if self.room[key] > 0 else float("inf")


def loads(inputs: Inputs) -> dict[str, Load]:
    """pool role -> what must run there (only there) against its room."""
    groups = [g for g in bootstrap_nodes(inputs) if g.count]
    workloads = list(inputs.workloads())
    daemonsets = [w for w in workloads if w.kind == "DaemonSet"]
    demand: dict[str, dict[str, float]] = {g.host: {"cpu": 0.0, "memory": 0.0} for g in groups}
    names: dict[str, list[str]] = {g.host: [] for g in groups}
    for w in workloads:
        if w.kind == "DaemonSet":
            continue
        found = placement_of(w, groups, daemonsets)
        where = set(found.now) | set(found.after_gpu_health)
        if len(where) != 1:
            continue  # nowhere (workload-unplaceable says so) or several pools: not required on one
        [host] = where
        replicas = int((w.inputs.get("spec") or {}).get("replicas") or 1)
        asks = requests_of(pod_spec_of(w.inputs))
        for key in ("cpu", "memory"):
            demand[host][key] += replicas * asks[key]
        names[host].append(f"{w.describe()} x{replicas}")
    found_loads = {}
    for g in groups:
        free = _allocatable(g, _daemonsets_on(g, daemonsets))
        if free is None or not names[g.host]:
            continue
        found_loads[g.host] = Load(g.host, g.pool.vm_size, g.count, demand[g.host],
                                   {k: max(free[k], 0.0) * g.count for k in ("cpu", "memory")},
                                   tuple(names[g.host]))
    return found_loads


def assess(diff: StackDiff) -> list[Finding]:
    head = sides.inputs(diff, "head")
    if head is None:
        return []
    base = sides.inputs(diff, "base")
    before = loads(base) if base is not None else {}
    found = []
    for host, load in sorted(loads(head).items()):
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
