"""Pod priorities (kilonode.k8s.capacity)."""

from __future__ import annotations

from kilonode.catalog.limits import limits

# Priorities (kilonode.k8s.capacity). The built-in system-cluster-critical and
# system-node-critical stay the control plane's; below them, with meaning:
# - infrastructure: cluster services users add (monitoring, log shippers), above all work;
# - team work: the default for every pod that names no class (globalDefault);
# - borrowable: low-priority work that may run on any team's idle nodes (it tolerates every
#   team's taint, field notes: team capacity) and is the first preempted when a team wants
#   its nodes back;
# - balloon: the autoscaler buffer's placeholder pods (field notes), preempted by anything.
PRIORITY_INFRASTRUCTURE = 100_000
PRIORITY_TEAM = 1_000
PRIORITY_BORROWABLE = 0
# cluster-autoscaler treats pods with priority *below* its --expendable-pods-priority-cutoff
# (default -10: the catalogue's kubernetes.autoscalerExpendablePriorityCutoff) as expendable:
# they neither cause a scale-up nor keep a node. The balloons sit exactly at the cutoff: the
# lowest priority that still makes the autoscaler keep their nodes warm, while every other
# class preempts them (the overprovisioning recipe of the autoscaler's FAQ, which uses -1 under the same cutoff).
AUTOSCALER_EXPENDABLE_PRIORITY_CUTOFF = limits().kubernetes.autoscaler_expendable_priority_cutoff.value
PRIORITY_BALLOON = AUTOSCALER_EXPENDABLE_PRIORITY_CUTOFF
