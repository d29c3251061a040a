"""The cluster autoscaler's scale-down flags moved so that more nodes are removable
(`autoscaler-scale-down-raised`; independent trace of kilonode diff on research-7500, 7th, finding 1:
`--scale-down-gpu-utilization-threshold` 0 -> 0.5 was "No risk found").

What each flag does, read in kubernetes/autoscaler cluster-autoscaler:

- core/scaledown/eligibility/eligibility.go (unremovableReasonAndNodeUtilization,
  isNodeAtOrBelowUtilizationThreshold, l.173-192 at cluster-autoscaler-1.34.5 cb2123ed; the same at
  1.32.7 f645beb1, 1.33.6 be4b5a18, 1.35.2 2d425888, each with the backport "Fix scale-down
  eligibility when utilization and threshold are zero"): a node whose cloud provider reports a GPU
  config is judged against --scale-down-gpu-utilization-threshold, any other against
  --scale-down-utilization-threshold, and it is kept ("NotUnderutilized") while
  `utilInfo.Utilization > threshold`; at or below it, it is a scale-down candidate (older
  releases kept it at `>=`, so that a threshold of 0 kept even an empty node; not the pinned ones).
  simulator/utilization/info.go (Calculate, l.50-60 at 1.34.5): a GPU node's utilization is its
  requested GPUs over its allocatable GPUs, CPU and memory not counted (DaemonSet pods left out
  with --ignore-daemonsets-utilization). So raising the GPU threshold to 0.5 makes every 8-GPU
  node with 4 or fewer GPUs requested removable: its
  pods are simulated elsewhere and, after --scale-down-unneeded-time, the node is drained (its
  pods evicted) and deleted, down to the node group's min size (`--nodes=min:max:set`).
- --scale-down-unneeded-time: how long a node stays a candidate before it goes; shorter removes
  sooner. --scale-down-enabled=false stops all scale-down.
- --skip-nodes-with-local-storage / -with-system-pods / -with-custom-controller-pods (default
  true; utils/drain): a node with such a pod is not removed; false lets it go.
- --expendable-pods-priority-cutoff: pods below it neither keep a node nor are rescheduled
  (FAQ "How does Cluster Autoscaler treat nodes with expendable pods?"); raising it lets more
  pods' nodes go.

A GPU job's gang (kilonode.k8s.scheduling: one PodGroup per job, all members on one fabric) stops
whole when one member is evicted (MPI/NCCL ranks do not survive a lost peer: field notes), so a
drained GPU node costs every node of its job. The flags are read from the rendered Deployment
kube-system/cluster-autoscaler in each side's snapshot; the pools from each side's plan.

Whether a running gang pod can be evicted at all depends on the head's GPU threshold (independent
trace 14, PR 05: `--scale-down-unneeded-time` 30m -> 5m was said as gang eviction). A GPU node's
utilization is its requested GPUs alone (simulator/utilization/info.go Calculate at 1.34.5), and
a node is a candidate while Utilization <= threshold (eligibility.go, above), so at kilonode's
one millionth (or at 0) only a node with no GPU requested is a candidate and no pod holding a GPU
is evicted. Running GPU pods are at risk only where a node with one GPU requested is at or below
the threshold, or where --expendable-pods-priority-cutoff rises: pods below it are left out of
the autoscaler's cluster snapshot (core/static_autoscaler.go RunOnce l.341-343 at 1.34.5:
FilterOutExpendablePods before ClusterSnapshot.SetClusterState), so their node looks empty.
Otherwise (high becomes medium) the line says the real cost: churn (a freed GPU node goes after
the unneeded time and takes NODE_READY_MIN or more to come back), and a node held for a gang at
the Coscheduling Permit stage, whose pods are bound only after WaitOnPermit (kubernetes
pkg/scheduler/schedule_one.go bindingCycle), so the node looks empty and can be removed within
the gang scheduler's permitWaitingTimeSeconds (kilonode.review.gang_scheduler).

The unready guard weakened (`autoscaler-unready-guard-weakened`; independent trace 8a:
`--max-total-unready-percentage` 10 -> 45 on research-7500 was "No risk found"), read in
kubernetes/autoscaler cluster-autoscaler at cluster-autoscaler-1.34.5 (cb2123ed; the same at
1.32.7, 1.33.6 and 1.35.2):

- clusterstate/clusterstate.go IsClusterHealthy (l.418-430): the cluster is unhealthy when its
  unready nodes number more than --ok-total-unready-count AND more than
  --max-total-unready-percentage/100 of all registered nodes; core/static_autoscaler.go RunOnce
  (l.417-422) then returns before scale-up and scale-down (FAQ.md "How does CA deal with unready
  nodes?": "CA stops all operations until the situation improves"). Raised, the autoscaler goes on
  acting through a larger outage (kilonode's 10% is the 2,500-node guard:
  kilonode.plan.defaults.autoscaler; upstream's 45% lets a zone or a third of the fleet go unready
  and scaling go on).
- core/scaledown/unneeded/nodes.go (l.231-250): an unready candidate is removed once it has been
  unneeded for --scale-down-unready-time (config/const.go DefaultScaleDownUnreadyTime, 20m; kilonode
  does not set it), a ready one after --scale-down-unneeded-time; shorter removes unready nodes
  sooner. core/scaledown/eligibility/eligibility.go (l.149-155): with --scale-down-unready-enabled
  false (default true, flags.go l.74) no unready node is a candidate at all.
- Defaults where a flag is absent: flags.go l.74, l.85, l.122-123 (main.go l.128, l.139, l.177-178
  at 1.32.7): 45, 3, 20m, true; so a flag removed is judged at upstream's value.

A new node's window (`autoscaler-provision-time-changed`, `autoscaler-scale-down-delay-after-add-changed`;
independent trace 9b: `--max-node-provision-time` and `--scale-down-delay-after-add` 30m -> 10m on research-7500 were
said only as a flag changed), read in kubernetes/autoscaler cluster-autoscaler at cluster-autoscaler-1.34.5
(cb2123ed; the same functions at 1.32.7 f645beb1, 1.33.6 be4b5a18, 1.35.2 2d425888):

- core/static_autoscaler.go removeOldUnregisteredNodes / oldUnregisteredNodes (l.755-850): a VM its node group
  has that is not registered as a Node within --max-node-provision-time is deleted (down to the group's min
  size). clusterstate/clusterstate.go updateScaleRequests (l.274-310): a scale-up whose nodes are not all
  provisioned by then (registered and Ready: a node registered but not Ready, younger than MaxNodeStartupTime
  15m, is NotStarted and not provisioned, l.512 and l.620-640; a node under a --startup-taint counts as not
  Ready, utils/taints/taints.go FilterOutNodesWithStartupTaints) times out ("ScaleUpTimedOut"), is counted
  failed (metrics.Timeout) and its node group is backed off (backoffNodeGroup:
  --initial-node-group-backoff-duration 5m doubling to --max-node-group-backoff-duration 30m, flags.go
  l.185-187). The Azure provider overrides only the scale-down options per scale set
  (cloudprovider/azure/azure_manager.go GetScaleSetOptions), so the flag decides for every scale set.
  kilonode's NODE_READY_MIN (kilonode.plan.defaults.node, 30) is an InfiniBand GPU VM's way to a working
  node: placement-group allocation, boot, TLS bootstrap, the GPU health checks under the startup taint.
  Below it, such VMs are deleted and retried in a loop and every GPU scale-up times out.
- core/static_autoscaler.go isScaleDownInCooldown (l.710-719): no scale-down runs for
  --scale-down-delay-after-add after any scale-up (across all node groups unless
  --scale-down-delay-type-local); the unneeded clock runs meanwhile (UpdateClusterState before the cooldown
  check, l.588-620). kilonode holds it at the provision time, so nothing is removed while a scale-up's nodes
  may still be on their way; shorter, a node just added for a gang, empty while its gang assembles, is a
  candidate sooner.

Any other cluster-autoscaler flag that changes (`autoscaler-flag-changed`, medium) is said with its
values, so that a flag no rule here judges is never silent. The flags the plan sets from the
pools (--cores-total, --memory-total, --max-nodes-per-scaleup, --balance-similar-node-groups, the GPU
health taints' --startup-taint and --status-taint) are said only when the plan did not change: with it,
they follow the pools the other rules judge.

Pure: a StackDiff in, findings out.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from kilonode.plan.defaults.autoscaler import (
    CLUSTER_AUTOSCALER_SCALE_DOWN_GPU_UTILIZATION_THRESHOLD,
)
from kilonode.plan.defaults.node import NODE_READY_MIN
from kilonode.review import gang_scheduler
from kilonode.review.compare import StackDiff
from kilonode.review.finding import HIGH, MEDIUM, Finding
from kilonode.review.lifecycle import plan_of

RULE = "autoscaler-scale-down-raised"
GUARD_RULE = "autoscaler-unready-guard-weakened"
PROVISION_RULE = "autoscaler-provision-time-changed"
DELAY_RULE = "autoscaler-scale-down-delay-after-add-changed"
CHANGED_RULE = "autoscaler-flag-changed"
DEPLOYMENT = "kubernetes:apps/v1:Deployment"
NAMESPACE, NAME = "kube-system", "cluster-autoscaler"  # kilonode.k8s.autoscaler APP
# Upstream's defaults where a flag is absent (config/flags/flags.go at the pinned tags).
DEFAULTS = {
    "scale-down-enabled": "true",
    "scale-down-utilization-threshold": "0.5",
    "scale-down-gpu-utilization-threshold": "0.5",
    "scale-down-unneeded-time": "10m",
    "skip-nodes-with-local-storage": "true",
    "skip-nodes-with-system-pods": "true",
    "skip-nodes-with-custom-controller-pods": "true",
    "expendable-pods-priority-cutoff": "-10",
    "max-drain-parallelism": "1",
    # the unready guard (flags.go l.74, l.85, l.122-123 at 1.34.5; config/const.go DefaultScaleDownUnreadyTime)
    "max-total-unready-percentage": "45",
    "ok-total-unready-count": "3",
    "scale-down-unready-time": "20m",
    "scale-down-unready-enabled": "true",
    # a new node's window (flags.go l.75, l.126 at 1.34.5; main.go l.129, l.181 at 1.32.7)
    "max-node-provision-time": "15m",
    "scale-down-delay-after-add": "10m",
}
# The flags a rule here (or kilonode.review.capacity: --nodes) judges; a change to any other is said as it is.
JUDGED = frozenset({
    "scale-down-enabled", "scale-down-utilization-threshold", "scale-down-gpu-utilization-threshold",
    "scale-down-unneeded-time", "skip-nodes-with-local-storage", "skip-nodes-with-system-pods",
    "skip-nodes-with-custom-controller-pods", "expendable-pods-priority-cutoff", "max-total-unready-percentage",
    "ok-total-unready-count", "scale-down-unready-time", "scale-down-unready-enabled", "nodes",
    "max-node-provision-time", "scale-down-delay-after-add",
})
# Set from the plan's pools (kilonode.k8s.autoscaler autoscaler_args): they move with a pool's size, an
# InfiniBand pool autoscaled or not, a GPU pool autoscaled or not (the GPU health taints).
FROM_PLAN = frozenset({"cores-total", "memory-total", "max-nodes-per-scaleup", "balance-similar-node-groups",
                       "startup-taint", "status-taint"})
SKIPS = {
    "skip-nodes-with-local-storage": "a pod with an emptyDir or hostPath volume",
    "skip-nodes-with-system-pods": "a kube-system pod without a PodDisruptionBudget",
    "skip-nodes-with-custom-controller-pods": "a pod owned by a controller other than the built-in ones",
}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(h|ms|m|s)")
_SECONDS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}


def flag_values(entry: Mapping[str, Any] | None) -> dict[str, tuple[str, ...]] | None:
    """Every value each of the autoscaler container's flags is given, in order (--startup-taint is
    given twice), --nodes aside (the node groups, kilonode.review.capacity's); None where the side
    renders no cluster-autoscaler Deployment."""
    for r in (entry or {}).get("resources") or []:
        inputs = r.get("inputs") or {}
        meta = inputs.get("metadata") or {}
        if r.get("type") != DEPLOYMENT or (meta.get("namespace"), meta.get("name")) != (NAMESPACE, NAME):
            continue
        found: dict[str, tuple[str, ...]] = {}
        for container in (((inputs.get("spec") or {}).get("template") or {}).get("spec") or {}).get(
                "containers") or []:
            for word in [*(container.get("command") or []), *(container.get("args") or [])]:
                text = str(word)
                if text.startswith("--") and not text.startswith("--nodes="):
                    key, sep, value = text[2:].partition("=")
                    found[key] = (*found.get(key, ()), value if sep else "true")
        return found
    return None


def flags(entry: Mapping[str, Any] | None) -> dict[str, str] | None:
    """The autoscaler container's flags (name without dashes -> value; the last one wins), or None
    where the side renders no cluster-autoscaler Deployment."""
    found = flag_values(entry)
    return None if found is None else {key: values[-1] for key, values in found.items()}


def _value(found: Mapping[str, str], key: str) -> str:
    return found.get(key, DEFAULTS[key])


def _float(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def seconds(text: str) -> float | None:
    """A Go duration ("30m", "1h30m", "90s") in seconds; None where it does not read as one."""
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        return None
    return sum(float(n) * _SECONDS[u] for n, u in parts)


def _true(text: str) -> bool:
    return text.strip().lower() in ("true", "1", "t")


def _pools(entry: Mapping[str, Any] | None) -> list[Mapping[str, Any]]:
    return [p for p in plan_of(entry).get("nodePools") or [] if isinstance(p, Mapping) and p.get("autoscaling")]


def _raised(base: Mapping[str, str], head: Mapping[str, str], key: str) -> tuple[float, float] | None:
    """(was, now) of a number flag the head raises, upstream's default where absent; else None."""
    was, now = _float(_value(base, key)), _float(_value(head, key))
    return (was, now) if was is not None and now is not None and now > was else None


def _shortened(base: Mapping[str, str], head: Mapping[str, str], key: str) -> bool:
    """A duration flag the head shortens (upstream's default where absent)."""
    was, now = seconds(_value(base, key)), seconds(_value(head, key))
    return was is not None and now is not None and now < was


def _turned_on(base: Mapping[str, str], head: Mapping[str, str], key: str) -> bool:
    return not _true(_value(base, key)) and _true(_value(head, key))


def _drainable(pool: Mapping[str, Any]) -> tuple[int, int, int]:
    """(nodes at the ceiling, the floor, how many may go) from the node groups' --nodes bounds."""
    groups = (pool.get("autoscaling") or {}).get("nodeGroups") or []
    high = sum(int(g.get("maxSize") or 0) for g in groups)
    low = sum(int(g.get("minSize") or 0) for g in groups)
    return high, low, high - low


def _moves(base: Mapping[str, str], head: Mapping[str, str]) -> tuple[list[str], list[str]]:
    """(what makes more GPU nodes removable, what makes more non-GPU nodes removable), each said once."""
    gpu: list[str] = []
    other: list[str] = []
    for key, target in (("scale-down-gpu-utilization-threshold", gpu), ("scale-down-utilization-threshold", other)):
        if raised := _raised(base, head, key):
            was, now = raised
            kind = "GPU node" if target is gpu else "node without GPUs"
            target.append(f"--{key} {was:g} -> {now:g}: a {kind} is kept only while its requested "
                          f"{'GPUs' if target is gpu else 'CPU or memory'} are more than {now:.0%} of its allocatable "
                          f"(eligibility.go: kept while Utilization > threshold), "
                          + ("only empty nodes at the base's 0" if was == 0 else f"was {was:.0%}"))
    both: list[str] = []
    if _shortened(base, head, "scale-down-unneeded-time"):
        both.append(f"--scale-down-unneeded-time {_value(base, 'scale-down-unneeded-time')} -> "
                    f"{_value(head, 'scale-down-unneeded-time')}: a candidate goes sooner")
    if _turned_on(base, head, "scale-down-enabled"):
        both.append("--scale-down-enabled false -> true: scale-down starts")
    for key, what in SKIPS.items():
        if _true(_value(base, key)) and not _true(_value(head, key)):
            both.append(f"--{key} true -> false: a node running {what} is removable")
    if cutoff := _raised(base, head, "expendable-pods-priority-cutoff"):
        was_c, now_c = cutoff
        both.append(f"--expendable-pods-priority-cutoff {was_c:g} -> {now_c:g}: pods with a priority below "
                    f"{now_c:g} no longer keep their node")
    return gpu + both, other + both


def assess(diff: StackDiff) -> list[Finding]:
    """Every autoscaler finding of the change: scale-down reaching more nodes, the unready guard
    weakened, and any other flag changed."""
    return [*scale_down_raised(diff), *unready_guard_weakened(diff), *provision_time_changed(diff),
            *delay_after_add_changed(diff), *flags_changed(diff)]


def scale_down_raised(diff: StackDiff) -> list[Finding]:
    base, head = flags(diff.base), flags(diff.head)
    if base is None or head is None or base == head:
        return []
    gpu_moves, other_moves = _moves(base, head)
    pools = _pools(diff.head)
    gpu_pools = [p for p in pools if int(p.get("gpusPerNode") or 0) > 0]
    other_pools = [p for p in pools if int(p.get("gpusPerNode") or 0) == 0]
    reached = [(p, gpu_moves) for p in gpu_pools if gpu_moves] + [(p, other_moves) for p in other_pools if other_moves]
    if not reached:
        return []
    said = []
    for pool, _ in reached:
        high, low, may = _drainable(pool)
        gpus = int(pool.get("gpusPerNode") or 0)
        line = f"pool {pool['name']}: up to {may:,} of its {high:,} nodes (down to its floor of {low:,})"
        if gpus:
            keep = _threshold_gpus(head, gpus)
            line += ("; any node with no GPU requested" if keep <= 1 else
                     f"; any node with {keep - 1} or fewer of its {gpus} GPUs requested")
        said.append(line)
    moves = sorted({m for _, ms in reached for m in ms}, key=lambda m: (not m.startswith("--scale-down-gpu"), m))
    gpu_reached = [p for p, _ in reached if int(p.get("gpusPerNode") or 0)]
    evicts = any(_evicts_running(base, head, int(p.get("gpusPerNode") or 0)) for p in gpu_reached)
    level = HIGH if evicts else MEDIUM
    drain = _value(head, "max-drain-parallelism")
    unneeded = _value(head, "scale-down-unneeded-time")
    return [Finding(level, RULE, (
        f"the cluster autoscaler's scale-down reaches more nodes ({'; '.join(moves)}). Drainable: "
        f"{'; '.join(said)}. After --scale-down-unneeded-time ({unneeded}) such a "
        f"node is drained, {drain} at a time (--max-drain-parallelism), its pods evicted and rescheduled, and "
        "deleted (kubernetes/autoscaler cluster-autoscaler core/scaledown/eligibility/eligibility.go, "
        "simulator/utilization)"
        + (": a gang pod evicted stops its whole job (every rank of an MPI/NCCL job fails with its peer), so "
           "each drained GPU node running part of a job costs all of that job's nodes, and the job's pods pend "
           "until a scale-up brings nodes back. Keep the GPU threshold at kilonode's "
           f"{CLUSTER_AUTOSCALER_SCALE_DOWN_GPU_UTILIZATION_THRESHOLD} (kilonode.plan.defaults.autoscaler), or mark "
           "running GPU pods cluster-autoscaler.kubernetes.io/safe-to-evict: \"false\" before this lands"
           if evicts else "")
        + (_empty_gpu_nodes_only(diff, base, head, unneeded) if gpu_reached and not evicts else "")),
        tuple(f"pool {p['name']}" for p, _ in reached), cause="cluster-autoscaler flags")]


def _evicts_running(base: Mapping[str, str], head: Mapping[str, str], gpus: int) -> bool:
    """Can the head's scale-down take a GPU node that runs a pod holding a GPU (a gang member)? Only where a
    node with one GPU requested is at or below the GPU threshold (a GPU node's utilization is its requested
    GPUs over its allocatable GPUs alone: simulator/utilization/info.go Calculate; a candidate while
    Utilization <= threshold: eligibility.go isNodeAtOrBelowUtilizationThreshold), or where the expendable-pod
    cutoff rises: pods below it are left out of the autoscaler's cluster snapshot (core/static_autoscaler.go
    RunOnce l.341-343 at 1.34.5, FilterOutExpendablePods before ClusterSnapshot.SetClusterState), so a node
    running only such pods counts as empty and they go with it (FAQ "How does Cluster Autoscaler treat nodes
    with expendable pods?")."""
    return _threshold_gpus(head, gpus) > 1 or _raised(base, head, "expendable-pods-priority-cutoff") is not None


def _empty_gpu_nodes_only(diff: StackDiff, base: Mapping[str, str], head: Mapping[str, str], unneeded: str) -> str:
    """What a scale-down move costs on GPU pools whose threshold lets only a GPU node with no GPU requested
    go (kilonode's one millionth: kilonode.plan.defaults.autoscaler): no running GPU pod is evicted; the cost
    is churn and the nodes held for a gang at Permit (the wording of delay_after_add_changed)."""
    threshold = _value(head, "scale-down-gpu-utilization-threshold")
    args = gang_scheduler.coscheduling_args(gang_scheduler.config(diff.head))
    permit = args.get(gang_scheduler.PERMIT) if args else None
    return (f". With --scale-down-gpu-utilization-threshold {threshold} only a GPU node with no GPU requested is a "
            "candidate (a GPU node's utilization is its requested GPUs over its allocatable, nothing else: "
            "simulator/utilization/info.go Calculate; kept while Utilization > threshold), so no pod holding a "
            "GPU, no gang member, is evicted. What it costs is churn and the gang's nodes: a GPU node freed between "
            f"jobs is deleted after {unneeded} idle, and one asked for again takes kilonode's NODE_READY_MIN "
            f"({NODE_READY_MIN} min, kilonode.plan.defaults.node: placement-group allocation, boot, TLS bootstrap, "
            "the GPU health checks) or more to come back; and a node held for a gang runs no GPU pod until the "
            "whole gang has nodes (Coscheduling holds its pods at Permit, unbound"
            + (f", for up to {permit:g} s: the gang scheduler's {gang_scheduler.PERMIT}"
               if isinstance(permit, (int, float)) and not isinstance(permit, bool) else "")
            + "; kubernetes pkg/scheduler/schedule_one.go binds after WaitOnPermit), so it looks empty, below the "
            "GPU utilization threshold, and is removable once unneeded for --scale-down-unneeded-time: a node "
            "held for a gang may be removed before the gang lands, and the gang pends for another scale-up. "
            f"The base held --scale-down-unneeded-time at {_value(base, 'scale-down-unneeded-time')} (kilonode's "
            "reason, kilonode.plan.defaults.autoscaler: a GPU node idle for less than it takes to get one back, "
            f"NODE_READY_MIN {NODE_READY_MIN} min, is churn)")


def _threshold_gpus(head: Mapping[str, str], gpus: int) -> int:
    """The fewest requested GPUs that keep a node: Utilization > threshold (eligibility.go
    isNodeAtOrBelowUtilizationThreshold at the pinned releases); 1 where only an empty node goes."""
    threshold = _float(_value(head, "scale-down-gpu-utilization-threshold")) or 0.0
    return max(1, math.floor(threshold * gpus + 1e-9) + 1)


def _tolerated(found: Mapping[str, str], nodes: int) -> int | None:
    """The most unready nodes of `nodes` under which the autoscaler still acts: IsClusterHealthy is
    false only past both the count and the percentage (clusterstate.go l.424-425)."""
    percent = _float(_value(found, "max-total-unready-percentage"))
    count = _float(_value(found, "ok-total-unready-count"))
    if percent is None or count is None:
        return None
    return max(int(count), math.floor(percent / 100.0 * nodes + 1e-9))


def _cluster_nodes(entry: Mapping[str, Any] | None) -> int:
    """The plan's pools at their planned size: the registered nodes the percentage is taken of."""
    return sum(int(p.get("nodes") or 0) for p in plan_of(entry).get("nodePools") or [] if isinstance(p, Mapping))


def _removed(head: Mapping[str, str], key: str) -> str:
    return "" if key in head else " (removed: upstream's default)"


def _guard_moves(base: Mapping[str, str], head: Mapping[str, str], nodes: int) -> tuple[list[str], bool]:
    """(each weakening of the unready guard, said once; whether one reaches nodes at this cluster's size:
    more unready nodes tolerated, or unready nodes removed sooner or at all)."""
    moves: list[str] = []
    reaches = False
    for key in ("max-total-unready-percentage", "ok-total-unready-count"):
        if raised := _raised(base, head, key):
            was, now = raised
            unit = "%" if key.startswith("max") else " nodes"
            moves.append(f"--{key} {was:g}{unit} -> {now:g}{unit}" + _removed(head, key))
    was_n, now_n = _tolerated(base, nodes), _tolerated(head, nodes)
    if moves and was_n is not None and now_n is not None:
        if now_n > was_n:
            reaches = True
            moves.append(f"of the plan's {nodes:,} nodes, up to {now_n:,} may be unready and it still scales up and "
                         f"down, was {was_n:,}")
        else:
            moves.append(f"at the plan's {nodes:,} nodes it still halts past {now_n:,} unready "
                         "(the other bound decides)")
    if _shortened(base, head, "scale-down-unready-time"):
        reaches = True
        moves.append(f"--scale-down-unready-time {_value(base, 'scale-down-unready-time')} -> "
                     f"{_value(head, 'scale-down-unready-time')}"
                     + _removed(head, "scale-down-unready-time")
                     + ": an unready candidate is deleted sooner")
    if _turned_on(base, head, "scale-down-unready-enabled"):
        reaches = True
        moves.append("--scale-down-unready-enabled false -> true"
                     + _removed(head, "scale-down-unready-enabled")
                     + ": unready nodes become scale-down candidates (eligibility.go l.149-155)")
    return moves, reaches


def unready_guard_weakened(diff: StackDiff) -> list[Finding]:
    """The autoscaler's halt on unready nodes weakened, or unready nodes removed sooner."""
    base, head = flags(diff.base), flags(diff.head)
    if base is None or head is None or base == head:
        return []
    nodes = _cluster_nodes(diff.head)
    moves, reaches = _guard_moves(base, head, nodes)
    pools = _pools(diff.head)
    if not moves or not pools:
        return []
    said = []
    for pool in pools:
        high, low, may = _drainable(pool)
        said.append(f"pool {pool['name']}: up to {may:,} of its {high:,} nodes (down to its floor of {low:,})")
    gpu = any(int(p.get("gpusPerNode") or 0) for p in pools)
    level = HIGH if gpu and reaches else MEDIUM
    return [Finding(level, GUARD_RULE, (
        f"the cluster autoscaler's unready guard is weakened ({'; '.join(moves)}). The guard is kilonode's "
        "2,500-node lesson (field notes: an etcd outage made every node unready and the autoscaler set about "
        "removing the fleet): past --ok-total-unready-count and --max-total-unready-percentage of all registered nodes "
        "unready it halts all scale-up and scale-down (kubernetes/autoscaler cluster-autoscaler "
        "clusterstate/clusterstate.go IsClusterHealthy, core/static_autoscaler.go RunOnce; FAQ \"How does CA deal "
        "with unready nodes?\"). Below it, through a partial outage (a zone, a third of the fleet), it goes on: "
        "an unready node below its utilization threshold is deleted "
        f"after --scale-down-unready-time ({_value(head, 'scale-down-unready-time')}; "
        "core/scaledown/unneeded/nodes.go), down to each node group's min size. Removable while an outage is "
        f"under the guard: {'; '.join(said)}"
        + (", GPU nodes whose jobs stop with them and that come back only by a scale-up" if gpu else "")
        + ". Keep --max-total-unready-percentage at kilonode's 10 and --ok-total-unready-count at 3 "
        "(kilonode.plan.defaults.autoscaler), and --scale-down-unready-time at upstream's 20m or longer; "
        "--scale-down-unready-enabled=false keeps unready nodes altogether"),
        tuple(f"pool {p['name']}" for p in pools), cause="cluster-autoscaler flags")]


def _autoscaled(entry: Mapping[str, Any] | None) -> tuple[list[Mapping[str, Any]], list[Mapping[str, Any]]]:
    """(the autoscaled GPU pools, the other autoscaled pools) of a side's plan."""
    pools = _pools(entry)
    return ([p for p in pools if int(p.get("gpusPerNode") or 0) > 0],
            [p for p in pools if int(p.get("gpusPerNode") or 0) == 0])


def _moved(base: Mapping[str, str], head: Mapping[str, str], key: str) -> tuple[str, str, float, float] | None:
    """(was, now, was seconds, now seconds) of a duration flag that changed its value, upstream's default where
    absent; None where it did not move or does not read as a duration."""
    was, now = _value(base, key), _value(head, key)
    was_s, now_s = seconds(was), seconds(now)
    if was_s is None or now_s is None or was_s == now_s:
        return None
    return was, now + _removed(head, key), was_s, now_s


def _groups(pool: Mapping[str, Any]) -> str:
    groups = (pool.get("autoscaling") or {}).get("nodeGroups") or []
    high, low, _ = _drainable(pool)
    return f"pool {pool['name']} ({len(groups)} node group(s), {low:,} to {high:,} nodes)"


def provision_time_changed(diff: StackDiff) -> list[Finding]:
    """--max-node-provision-time moved: high where it falls below NODE_READY_MIN and an autoscaled GPU pool
    scales by it (its VMs deleted before they can join, its scale-ups failed and backed off)."""
    base, head = flags(diff.base), flags(diff.head)
    if base is None or head is None:
        return []
    moved = _moved(base, head, "max-node-provision-time")
    if moved is None:
        return []
    was, now, was_s, now_s = moved
    gpu_pools, other_pools = _autoscaled(diff.head)
    pools = gpu_pools + other_pools
    ready_s = NODE_READY_MIN * 60.0
    subjects = tuple(f"pool {p['name']}" for p in pools) or (f"Deployment {NAMESPACE}/{NAME}",)
    what = (f"--max-node-provision-time {was} -> {now}: the autoscaler deletes a VM of a node group that has not "
            "registered as a Node within it (kubernetes/autoscaler cluster-autoscaler core/static_autoscaler.go "
            "removeOldUnregisteredNodes, down to the group's min size), and a scale-up whose nodes are not "
            "registered and Ready by then times out (ScaleUpTimedOut), counts as failed and backs its node group "
            "off, 5m doubling to 30m (clusterstate/clusterstate.go updateScaleRequests, backoffNodeGroup); a node "
            "under a --startup-taint counts as not Ready (utils/taints/taints.go FilterOutNodesWithStartupTaints)")
    if now_s > was_s:
        return [Finding(MEDIUM, PROVISION_RULE, (
            f"{what}. Raised: a VM that never joins is replaced, and a failed scale-up noticed, later, so pods "
            "wait longer before the autoscaler tries another node group"), subjects, cause="cluster-autoscaler flags")]
    reached = ", ".join(_groups(p) for p in pools) or "no pool is autoscaled at the head"
    if now_s >= ready_s:
        return [Finding(MEDIUM, PROVISION_RULE, (
            f"{what}. Lowered, still at or above kilonode's NODE_READY_MIN ({NODE_READY_MIN} min, "
            f"kilonode.plan.defaults.node: a new VM's way to a node that takes work). Autoscaled: {reached}"),
            subjects, cause="cluster-autoscaler flags")]
    level = HIGH if gpu_pools else MEDIUM
    return [Finding(level, PROVISION_RULE, (
        f"{what}. It is now below kilonode's NODE_READY_MIN ({NODE_READY_MIN} min, kilonode.plan.defaults.node): "
        "the time a new VM takes to become a working node, placement-group allocation (InfiniBand sizes), boot, "
        "the kubelet's TLS bootstrap and registration, and on GPU nodes the health checks under the startup "
        f"taint. Autoscaled: {reached}"
        + (". On these GPU pools VMs still on their way are deleted at "
           f"{_value(head, 'max-node-provision-time')} and asked for again, each scale-up counts as failed and "
           "its node group is backed off, so the autoscaler deletes and retries in a loop and the pending "
           "gangs waiting for those nodes never get them" if gpu_pools else "")
        + f". Keep it at {NODE_READY_MIN}m (kilonode.plan.defaults.autoscaler "
        "CLUSTER_AUTOSCALER_MAX_NODE_PROVISION_TIME) or longer"), subjects, cause="cluster-autoscaler flags")]


def delay_after_add_changed(diff: StackDiff) -> list[Finding]:
    """--scale-down-delay-after-add moved (medium): shorter, nodes just added are removable sooner."""
    base, head = flags(diff.base), flags(diff.head)
    if base is None or head is None:
        return []
    moved = _moved(base, head, "scale-down-delay-after-add")
    if moved is None:
        return []
    was, now, was_s, now_s = moved
    gpu_pools, other_pools = _autoscaled(diff.head)
    pools = gpu_pools + other_pools
    subjects = tuple(f"pool {p['name']}" for p in pools) or (f"Deployment {NAMESPACE}/{NAME}",)
    what = (f"--scale-down-delay-after-add {was} -> {now}: after any scale-up no scale-down runs for this long "
            "(kubernetes/autoscaler cluster-autoscaler core/static_autoscaler.go isScaleDownInCooldown; across "
            "all node groups unless --scale-down-delay-type-local), while the nodes' unneeded time keeps counting")
    if now_s > was_s:
        return [Finding(MEDIUM, DELAY_RULE, (
            f"{what}. Raised: idle nodes stay longer after each scale-up, and while scale-ups come more often than "
            "the delay nothing is ever scaled down"), subjects, cause="cluster-autoscaler flags")]
    return [Finding(MEDIUM, DELAY_RULE, (
        f"{what}. Lowered: scale-down resumes sooner after a scale-up"
        + (f", before kilonode's NODE_READY_MIN ({NODE_READY_MIN} min, kilonode.plan.defaults.node: a new VM's way "
           "to a node that takes work) has passed, while that scale-up's nodes may still be on their way"
           if now_s < NODE_READY_MIN * 60.0 else "")
        + (". A GPU node added for a gang runs no GPU pod until the whole gang has nodes (Coscheduling holds its "
           "pods at Permit), so it is below the GPU utilization threshold and removable once unneeded for "
           "--scale-down-unneeded-time (or --scale-down-unready-time while still starting): a node added for a "
           "gang may be removed before the gang lands, and the gang pends for another scale-up. GPU pools "
           f"reached: {', '.join(_groups(p) for p in gpu_pools)}" if gpu_pools else "")
        + ". kilonode holds it at --max-node-provision-time (kilonode.plan.defaults.autoscaler "
        "CLUSTER_AUTOSCALER_SCALE_DOWN_DELAY_AFTER_ADD)"), subjects, cause="cluster-autoscaler flags")]


def _shown(values: tuple[str, ...] | None) -> str:
    if values is None:
        return "(unset)"
    return ",".join(values)


def flags_changed(diff: StackDiff) -> list[Finding]:
    """A change to a flag no rule here judges, said as it is (medium): never silence."""
    base, head = flag_values(diff.base), flag_values(diff.head)
    if base is None or head is None or base == head:
        return []
    plan_moved = (diff.base or {}).get("files", {}).get("plan.yaml") != (diff.head or {}).get("files", {}).get(
        "plan.yaml")
    changed = [f"--{key} {_shown(base.get(key))} -> {_shown(head.get(key))}"
               for key in sorted({*base, *head} - JUDGED)
               if base.get(key) != head.get(key) and not (plan_moved and key in FROM_PLAN)]
    if not changed:
        return []
    return [Finding(MEDIUM, CHANGED_RULE, (
        f"a cluster-autoscaler flag the review does not model changed: {'; '.join(changed)}; check it against "
        "the FAQ (kubernetes/autoscaler cluster-autoscaler/FAQ.md, \"What are the parameters to CA?\") and "
        "kilonode's reasons for its value (kilonode.k8s.autoscaler autoscaler_args, kilonode.plan.defaults."
        "autoscaler)"), (f"Deployment {NAMESPACE}/{NAME}",), cause="cluster-autoscaler flags")]
