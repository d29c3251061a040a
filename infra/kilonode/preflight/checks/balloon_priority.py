"""balloon-priority: the autoscaler's balloons (kilonode.k8s.capacity: one Pending placeholder pod
per warm node) carry a priority at or above the `--expendable-pods-priority-cutoff` the
cluster-autoscaler Deployment of the recorded graph is started with.

cluster-autoscaler treats a pod whose priority is below the cutoff as expendable: it neither
triggers a scale-up nor keeps a node from being removed (kubernetes/autoscaler
cluster-autoscaler/FAQ.md, "How does Cluster Autoscaler work with Pod Priority and Preemption?":
"pods with priority lower than this cutoff ... don't cause scale-up"; without the flag the
cutoff is -10, the catalogue's kubernetes.autoscalerExpendablePriorityCutoff). Balloons below
it are Pending pods the autoscaler ignores: the warm nodes they stand for are scaled down as
unneeded and never come back, and nothing says so (the balloons stay Pending as they always do).

The balloons: the workloads whose pod template carries app=kilonode-balloon
(kilonode.k8s.capacity.BALLOON_APP). Their priority: the recorded PriorityClass their
priorityClassName names (a class the graph lacks: the Priority admission plugin refuses the pod,
a break too). The cutoff: the flag's value in the cluster-autoscaler container's arguments,
upstream's default where it is absent. No autoscaler Deployment, or no balloons: nothing to judge.

Seeded breaks (tests/preflight/test_balloon_priority.py): the balloon class's value below the
cutoff; the cutoff raised above the balloon class; the class missing. Passes: at the cutoff.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from kilonode.k8s.capacity import BALLOON_APP
from kilonode.plan.defaults.priorities import AUTOSCALER_EXPENDABLE_PRIORITY_CUTOFF
from kilonode.preflight.model import Finding, Inputs, Resource
from kilonode.preflight.placement import pod_spec_of

NAME = "balloon-priority"
TITLE = "the autoscaler's balloons are not expendable to it: priority at or above its cutoff"

FLAG = "--expendable-pods-priority-cutoff"
_FLAG = re.compile(rf"^{FLAG}(?:=(-?\d+))?$")


def _cutoff(workload: Resource) -> int | None:
    """The autoscaler container's cutoff, its default without the flag; None: not the autoscaler."""
    for container in pod_spec_of(workload.inputs).get("containers") or []:
        argv = [str(a) for a in [*(container.get("command") or []), *(container.get("args") or [])]]
        if not any("cluster-autoscaler" in a for a in argv[:1]) and container.get("name") != "cluster-autoscaler":
            continue
        for index, arg in enumerate(argv):
            match = _FLAG.match(arg)
            if match:
                value = match.group(1) if match.group(1) is not None else (argv[index + 1:] or ["x"])[0]
                try:
                    return int(value)
                except ValueError:
                    return None
        return int(AUTOSCALER_EXPENDABLE_PRIORITY_CUTOFF)
    return None


def _classes(inputs: Inputs) -> dict[str, int]:
    return {str((r.inputs.get("metadata") or {}).get("name")): int(r.inputs.get("value") or 0)
            for r in inputs.kubernetes() if r.kind == "PriorityClass"}


def _labels(workload: Resource) -> Mapping[str, Any]:
    template = (workload.inputs.get("spec") or {}).get("template") or {}
    return (template.get("metadata") or {}).get("labels") or {}


def check(inputs: Inputs) -> list[Finding]:
    workloads = inputs.workloads()
    cutoffs = [(w, c) for w in workloads for c in [_cutoff(w)] if c is not None]
    balloons = [w for w in workloads if _labels(w).get("app") == BALLOON_APP]
    if not cutoffs or not balloons:
        return []
    autoscaler, cutoff = cutoffs[0]
    classes = _classes(inputs)
    findings = []
    for balloon in balloons:
        name = str(pod_spec_of(balloon.inputs).get("priorityClassName") or "")
        if name not in classes:
            findings.append(Finding(NAME, "break", balloon.describe(), (
                f"its pods name PriorityClass {name or '(none)'}, which the cluster does not have: the Priority "
                "admission plugin refuses each pod (no PriorityClass with that name), so no balloon exists and no "
                "node is kept warm"), "create the PriorityClass with the balloons (kilonode.k8s.capacity PRIORITIES)"))
            continue
        value = classes[name]
        if value >= cutoff:
            continue
        findings.append(Finding(NAME, "break", balloon.describe(), (
            f"its PriorityClass {name} is {value}, below the {FLAG}={cutoff} {autoscaler.describe()} runs with: the "
            "autoscaler treats its pods as expendable, which neither trigger a scale-up nor keep a node "
            "(cluster-autoscaler FAQ.md, expendable pods), so the warm nodes they stand for are removed as unneeded "
            "and never come back, while the balloons stay Pending as they always do"),
            f"keep the balloon class at or above the cutoff (kilonode.plan.defaults PRIORITY_BALLOON = "
            f"AUTOSCALER_EXPENDABLE_PRIORITY_CUTOFF), or lower {FLAG} with it"))
    return findings
