"""ksm-resources-grown: kube-state-metrics told to list and watch more kinds than the plan sized it for.

kilonode runs kube-state-metrics with `--resources=nodes,daemonsets,deployments` (kube-system's
DaemonSets and Deployments: `--namespaces=kube-system`) and sizes it for that: its memory (request =
limit) is a base plus a share per node (kilonode.plan.resolve.exporters kube_state_metrics_size), and
Prometheus's series budget counts 40 series per node and a few hundred for the kube-system workloads
(kilonode.plan.resolve.monitoring). kube-state-metrics keeps every object of every listed kind in its
informers' caches and answers every scrape with all their series (kubernetes/kube-state-metrics
README.md, "Resource recommendation": resource usage "changes with the size of the cluster", the
number of objects it watches; internal/store/builder.go at v2.18.0: one reflector per resource and
namespace), so adding a kind with an object per pod or per job multiplies both: at research-7500,
pods alone are up to the pools' maxPods on every node (tens of thousands), at about 25 series each
(kube-state-metrics' pod metrics: docs/metrics/workload/pod-metrics.md, the per-pod gauges and their
per-container siblings). The container then grows past its limit (OOMKilled, restarting, every
`kube_node_*` series gone with it: the GPU pool alerts read them) and Prometheus past its planned
series. No schema check, preflight or promtool sees it: the flag is a valid value.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kilonode.review.compare import StackDiff
from kilonode.review.finding import HIGH, MEDIUM, Finding
from kilonode.review.lifecycle import plan_of

DEPLOYMENT = "kubernetes:apps/v1:Deployment"
NAME, NAMESPACE, CONTAINER = "kube-state-metrics", "kube-system", "kube-state-metrics"
# kinds with an object per pod, job run or piece of configuration: tens of thousands at this scale
PER_WORKLOAD = frozenset({"pods", "jobs", "replicasets", "endpoints", "endpointslices", "secrets", "configmaps",
                          "persistentvolumeclaims", "persistentvolumes", "leases", "certificatesigningrequests"})
SERIES_PER_POD = 25  # kube-state-metrics' per-pod series (the module docstring), an estimate


def _flags(entry: Mapping[str, Any] | None) -> tuple[dict[str, str], str | None] | None:
    """kube-state-metrics' `--flag=value` arguments and its container's memory limit, or None."""
    for r in (entry or {}).get("resources", []):
        inputs = r.get("inputs") or {}
        meta = inputs.get("metadata") or {}
        if r.get("type") != DEPLOYMENT or meta.get("name") != NAME or meta.get("namespace") != NAMESPACE:
            continue
        for container in ((inputs.get("spec") or {}).get("template") or {}).get("spec", {}).get("containers") or []:
            if container.get("name") == CONTAINER:
                args = [str(a) for a in [*(container.get("command") or []), *(container.get("args") or [])]]
                flags = dict(a[2:].split("=", 1) for a in args if a.startswith("--") and "=" in a)
                limit = ((container.get("resources") or {}).get("limits") or {}).get("memory")
                return flags, None if limit is None else str(limit)
    return None


def _pods(plan: Mapping[str, Any]) -> int:
    """The pods the pools can hold: each pool's nodes times its maxPods (the plan's)."""
    return sum(int(p.get("nodes") or 0) * int(p.get("maxPods") or 0)
               for p in plan.get("nodePools") or [] if isinstance(p, Mapping))


def assess(diff: StackDiff) -> list[Finding]:
    base, head = _flags(diff.base), _flags(diff.head)
    if base is None or head is None:
        return []
    kinds = {k.strip() for k in base[0].get("resources", "").split(",") if k.strip()}
    now = {k.strip() for k in head[0].get("resources", "").split(",") if k.strip()}
    added = sorted(now - kinds)
    if not added:
        return []
    plan = plan_of(diff.head)
    scoped = head[0].get("namespaces")
    pods = _pods(plan)
    series = ""
    if "pods" in added:
        series = (f" Pods alone: up to {pods:,} (the pools' nodes times their maxPods"
                  + (f"; --namespaces={scoped} narrows it to those namespaces' pods, on every node the DaemonSets'"
                     if scoped else "") + f") at about {SERIES_PER_POD} series each, "
                  f"{pods * SERIES_PER_POD:,} series more than Prometheus's plan counts "
                  f"({int((plan.get('prometheus') or {}).get('series') or 0):,}).")
    heavy = [k for k in added if k in PER_WORKLOAD]
    return [Finding(HIGH if heavy else MEDIUM, "ksm-resources-grown", (
        f"kube-state-metrics now lists and watches {', '.join(added)} as well (--resources {base[0].get('resources')} "
        f"-> {head[0].get('resources')}), keeping every such object in memory and answering every scrape with their "
        f"series (kube-state-metrics README, \"Resource recommendation\"). Its memory limit, {head[1] or 'none'}, is "
        "kilonode's estimate for the kinds it read before (kilonode.plan.resolve.exporters), and Prometheus's series "
        "budget counts only those." + series + (" Kinds with an object per pod, job or configuration ("
        + ", ".join(heavy) + ") are tens of thousands of objects at this size: expect kube-state-metrics OOMKilled "
        "and restarting, every kube_node_* series (the GPU pool alerts' input) gone while it does" if heavy else "")
        + ". Size both for the new kinds in the same change (the plan's kube-state-metrics size and series terms), "
        "or read those objects another way"), (f"Deployment {NAMESPACE}/{NAME}",))]
