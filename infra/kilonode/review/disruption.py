"""A PodDisruptionBudget that can never allow a disruption (`pdb-blocks-eviction`; the seventeenth
independent trace of kilonode diff on research-7500, PR 11: metrics-server's budget minAvailable
1 -> 2 with its Deployment at 2 replicas read "update ... no risk").

Upstream: the disruption controller sets a budget's status.disruptionsAllowed to currentHealthy -
desiredHealthy, where desiredHealthy is minAvailable (a percentage of the expected pods rounded
up) or expected - maxUnavailable (a percentage rounded up too), and expected is the scale of the
pods' controller (kubernetes pkg/controller/disruption/disruption.go getExpectedPodCount and
updatePdbStatus, intstr.GetScaledValueFromIntOrPercent(..., true)). With all pods healthy that is
replicas - desiredHealthy, so minAvailable >= replicas (or its percentage rounding up to it), or
maxUnavailable 0 / 0%, leaves it at 0 for good. The Eviction API then refuses every eviction of
those pods with 429 TooManyRequests ("Cannot evict pod as it would violate the pod's disruption
budget": pkg/registry/core/pod/storage/eviction.go checkAndDecrement). Both read in the search
index's copies, not at the cluster's v1.34.2 tag.

What waits on evictions here: `kubectl drain` (it retries 429 until its timeout), kilonode's own
node-image rollout (kilonode.rollout.execute: its drain is the Eviction API, pod by pod, 429
retried until the drain's deadline, then the scale set fails and the rollout pauses), and the
cluster autoscaler's scale-down (it evicts through the same API and leaves a node whose pods a
budget protects: kubernetes/autoscaler cluster-autoscaler/simulator/drainability/rules/pdb, a pod
whose matching budget has DisruptionsAllowed < 1 blocks the node, "not enough pod disruption budget
to move", read in the search index's copies, not at the pinned autoscaler tag).
So the rule is high where the pods run on a pool's nodes (kilonode's rollout takes
every pool's scale sets; an autoscaled pool is scaled down too), medium where the review cannot
place them.

A budget is matched to workloads (Deployments and StatefulSets; a DaemonSet's pods are left by a
drain) in its namespace by its selector against their pod templates' labels. A line is said where
a budget moves INTO blocking (it did not block at the base, or was absent): a budget lowered, a
replica count lowered to the budget, or a new budget.

Pure: a StackDiff in, findings out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import yaml

from kilonode.review.compare import StackDiff
from kilonode.review.finding import HIGH, MEDIUM, Finding

RULE = "pdb-blocks-eviction"
PDB = "kubernetes:policy/v1:PodDisruptionBudget"
WORKLOADS = ("kubernetes:apps/v1:Deployment", "kubernetes:apps/v1:StatefulSet")


def selects(selector: Mapping[str, Any], labels: Mapping[str, Any]) -> bool:
    """A LabelSelector against a pod template's labels (an empty selector selects every pod in
    policy/v1: k8s.io/apimachinery LabelSelectorAsSelector)."""
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expression in selector.get("matchExpressions") or []:
        key, operator, values = expression.get("key"), expression.get("operator"), expression.get("values") or []
        if operator == "In" and labels.get(key) not in values:
            return False
        if operator == "NotIn" and key in labels and labels.get(key) in values:
            return False
        if operator == "Exists" and key not in labels:
            return False
        if operator == "DoesNotExist" and key in labels:
            return False
    return True


def _scaled(value: Any, total: int) -> int | None:
    """intstr.GetScaledValueFromIntOrPercent(value, total, roundUp=true); None where unreadable."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    text = str(value)
    if text.endswith("%") and text[:-1].isdigit():
        return math.ceil(int(text[:-1]) * total / 100)
    return int(text) if text.isdigit() else None


def blocks(spec: Mapping[str, Any], replicas: int) -> bool:
    """Whether a budget leaves disruptionsAllowed at 0 with every one of `replicas` pods healthy."""
    if replicas <= 0:
        return False
    if "minAvailable" in spec:
        wanted = _scaled(spec["minAvailable"], replicas)
        return wanted is not None and wanted >= replicas
    if "maxUnavailable" in spec:
        allowed = _scaled(spec["maxUnavailable"], replicas)
        return allowed is not None and allowed <= 0
    return False


def _pdbs(entry: Mapping[str, Any] | None) -> dict[tuple[str, str], Mapping[str, Any]]:
    found = {}
    for record in (entry or {}).get("resources") or []:
        if isinstance(record, Mapping) and record.get("type") == PDB:
            inputs = record.get("inputs") or {}
            meta = inputs.get("metadata") or {}
            found[(str(meta.get("namespace") or "default"), str(meta.get("name") or ""))] = inputs
    return found


def _workloads(entry: Mapping[str, Any] | None, namespace: str,
               selector: Mapping[str, Any]) -> list[tuple[str, str, int, Mapping[str, Any]]]:
    """(kind, name, replicas, pod spec) of each Deployment or StatefulSet in the namespace the selector picks."""
    found = []
    for record in (entry or {}).get("resources") or []:
        if not isinstance(record, Mapping) or record.get("type") not in WORKLOADS:
            continue
        inputs = record.get("inputs") or {}
        meta = inputs.get("metadata") or {}
        spec = inputs.get("spec") or {}
        template = spec.get("template") or {}
        if str(meta.get("namespace") or "default") != namespace:
            continue
        if not selects(selector, (template.get("metadata") or {}).get("labels") or {}):
            continue
        replicas = spec.get("replicas")
        found.append((str(record["type"]).rsplit(":", 1)[-1], str(meta.get("name") or ""),
                      replicas if isinstance(replicas, int) else 1, template.get("spec") or {}))
    return found


def _blocking(entry: Mapping[str, Any] | None) -> dict[tuple[str, str], list[tuple[str, str, int, Mapping[str, Any]]]]:
    """(namespace, budget) -> the workloads it blocks every eviction of."""
    found = {}
    for key, inputs in _pdbs(entry).items():
        spec = inputs.get("spec") or {}
        chosen = [w for w in _workloads(entry, key[0], spec.get("selector") or {}) if blocks(spec, w[2])]
        if chosen:
            found[key] = chosen
    return found


def _pools(entry: Mapping[str, Any] | None, pod: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """(the plan's pools the pod may run on, those autoscaled): a pool whose labels meet the pod's
    nodeSelector and required node affinity's In terms; with neither, every pool."""
    plan = yaml.safe_load(((entry or {}).get("files") or {}).get("plan.yaml") or "{}") or {}
    wanted = dict(pod.get("nodeSelector") or {})
    terms = ((((pod.get("affinity") or {}).get("nodeAffinity") or {})
              .get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms") or [])
    pools, autoscaled = [], []
    for pool in plan.get("nodePools") or []:
        labels = {**(pool.get("labels") or {}), "kubernetes.io/os": "linux"}
        if any(labels.get(k) != v for k, v in wanted.items()):
            continue
        if terms and not any(all(labels.get(e.get("key")) in (e.get("values") or [])
                                 for e in term.get("matchExpressions") or [] if e.get("operator") == "In")
                             for term in terms):
            continue
        pools.append(str(pool.get("name")))
        if pool.get("autoscaling"):
            autoscaled.append(str(pool.get("name")))
    return pools, autoscaled


def _budget(inputs: Mapping[str, Any] | None) -> str:
    spec = (inputs or {}).get("spec") or {}
    said = [f"{k} {spec[k]}" for k in ("minAvailable", "maxUnavailable") if k in spec]
    return ", ".join(said) or "(no budget)"


def assess(diff: StackDiff) -> list[Finding]:
    """One line per budget that moves into blocking every eviction."""
    if diff.head is None:
        return []
    before, after = _blocking(diff.base), _blocking(diff.head)
    base_pdbs, head_pdbs = _pdbs(diff.base), _pdbs(diff.head)
    found = []
    for key, chosen in sorted(after.items()):
        if key in before:
            continue
        namespace, name = key
        was = _budget(base_pdbs.get(key)) if key in base_pdbs else "absent"
        pools: list[str] = []
        autoscaled: list[str] = []
        for _, _, _, pod in chosen:
            p, a = _pools(diff.head, pod)
            pools += [x for x in p if x not in pools]
            autoscaled += [x for x in a if x not in autoscaled]
        what = "; ".join(f"{kind} {workload} at {replicas} replica(s)" for kind, workload, replicas, _ in chosen)
        where = (f"Its pods run on pool(s) {', '.join(pools)}: kilonode's node-image rollout drains every node of "
                 "them through the Eviction API (kilonode.rollout.execute) and stops at the drain's deadline, the "
                 "scale set failed and the rollout paused"
                 + (f"; the cluster autoscaler cannot scale down a node of {', '.join(autoscaled)} that holds one"
                    if autoscaled else "")
                 if pools else "The review cannot place its pods on a pool")
        found.append(Finding(HIGH if pools else MEDIUM, RULE, (
            f"PodDisruptionBudget {namespace}/{name} ({was} -> {_budget(head_pdbs.get(key))}) can never allow a "
            f"disruption of {what}: with every pod healthy its disruptionsAllowed stays 0 (minAvailable at or over "
            "the replicas, or maxUnavailable 0), so every eviction of those pods is refused with 429 and "
            f"`kubectl drain` of their nodes never finishes. {where}. Keep minAvailable below the replicas (or "
            "maxUnavailable at 1 or more) (kubernetes pkg/controller/disruption/disruption.go updatePdbStatus, "
            "pkg/registry/core/pod/storage/eviction.go checkAndDecrement)"), (f"{namespace}/{name}",)))
    return found


# --- pdb-selects-nothing ---------------------------------------------------------------------------------------
# The eighteenth independent trace (PR 10): calico-typha's budget re-keyed from `k8s-app: calico-typha` to
# `app.kubernetes.io/name: calico-typha`, a label its pod template does not carry, read "update ... no risk". A
# budget that selects no pod guards none: the Eviction API looks up the pod's budgets and, with none, deletes
# the pod without any check (kubernetes pkg/registry/core/pod/storage/eviction.go Create: `if len(pdbs) == 0
# { return nil }` before checkAndDecrement; read in the search index's copy, not at the cluster's v1.34.2 tag),
# so a drain (kubectl's, kilonode's node-image rollout, the autoscaler's) may take every replica at once. And a
# kube-system pod with no budget blocks the cluster autoscaler's scale-down of its node while
# --skip-nodes-with-system-pods is true, its default (kubernetes/autoscaler cluster-autoscaler/simulator/
# drainability/rules/system/rule.go: a kube-system pod with len(MatchingPdbs) == 0 is BlockedStatus
# UnmovableKubeSystemPod, "non-daemonset, non-mirrored, non-pdb-assigned kube-system pod present"; read in the
# search index's copy, not at the pinned autoscaler tags; kilonode.review.autoscaler reads the flag).
SELECTS_NOTHING = "pdb-selects-nothing"
# the cluster's own data path and control: every node's Calico agents read Typha, every pod's DNS is CoreDNS, and
# the autoscaler is the one that scales the pools (one replica each fewer than kilonode runs takes them down)
CRITICAL = frozenset({"calico-typha", "coredns", "cluster-autoscaler"})


def _templates(entry: Mapping[str, Any] | None, namespace: str) -> dict[tuple[str, str], tuple[Mapping[str, Any],
                                                                                              Mapping[str, Any]]]:
    """(kind, name) -> (pod template labels, pod spec) of each Deployment or StatefulSet in the namespace."""
    found = {}
    for record in (entry or {}).get("resources") or []:
        if not isinstance(record, Mapping) or record.get("type") not in WORKLOADS:
            continue
        inputs = record.get("inputs") or {}
        meta = inputs.get("metadata") or {}
        if str(meta.get("namespace") or "default") != namespace:
            continue
        template = (inputs.get("spec") or {}).get("template") or {}
        found[(str(record["type"]).rsplit(":", 1)[-1], str(meta.get("name") or ""))] = (
            (template.get("metadata") or {}).get("labels") or {}, template.get("spec") or {})
    return found


def selects_nothing(diff: StackDiff) -> list[Finding]:
    """A budget that selected a workload's pods at the base and selects none at the head, the workload still there
    and guarded by no other budget of the head's."""
    from kilonode.review import autoscaler  # its flag reader; imported here as autoscaler's module is large
    if diff.head is None:
        return []
    base_pdbs, head_pdbs = _pdbs(diff.base), _pdbs(diff.head)
    flags = autoscaler.flags(diff.head)
    skips = flags is not None and autoscaler._true(flags.get("skip-nodes-with-system-pods",
                                                             autoscaler.DEFAULTS["skip-nodes-with-system-pods"]))
    found = []
    for key, inputs in sorted(head_pdbs.items()):
        namespace, name = key
        if key not in base_pdbs:
            continue
        selector = (inputs.get("spec") or {}).get("selector") or {}
        was = _workloads(diff.base, namespace, (base_pdbs[key].get("spec") or {}).get("selector") or {})
        if not was or _workloads(diff.head, namespace, selector):
            continue
        templates = _templates(diff.head, namespace)
        others = [(p.get("spec") or {}).get("selector") or {} for k, p in head_pdbs.items() if k[0] == namespace]
        left = [(kind, workload) for kind, workload, _, _ in was if (kind, workload) in templates
                and not any(selects(s, templates[(kind, workload)][0]) for s in others)]
        if not left:
            continue
        pools: list[str] = []
        autoscaled: list[str] = []
        for kind, workload in left:
            p, a = _pools(diff.head, templates[(kind, workload)][1])
            pools += [x for x in p if x not in pools]
            autoscaled += [x for x in a if x not in autoscaled]
        critical = sorted({w for _, w in left} & CRITICAL)
        said = "; ".join(f"{kind} {workload}" for kind, workload in left)
        system = (" And they are kube-system pods with no budget: with the cluster autoscaler's "
                  "--skip-nodes-with-system-pods at true (its default; kilonode.review.autoscaler reads the flag) "
                  "a node holding one is never scaled down (cluster-autoscaler simulator/drainability/rules/system/"
                  "rule.go, \"non-pdb-assigned kube-system pod present\")"
                  + (f": the autoscaled pool(s) {', '.join(autoscaled)} keep those nodes" if autoscaled else "") + "."
                  if namespace == "kube-system" and skips else "")
        found.append(Finding(HIGH if critical else MEDIUM, SELECTS_NOTHING, (
            f"PodDisruptionBudget {namespace}/{name}'s selector {_selector(selector)} matches no pod template at "
            f"the head (at the base it matched {said}): the budget guards nothing, and the Eviction API evicts a pod "
            "no budget selects without any check (kubernetes pkg/registry/core/pod/storage/eviction.go: no PDB, the "
            "eviction allowed), so a drain (kubectl drain, kilonode's node-image rollout"
            + (f" over {', '.join(pools)}" if pools else "") + ", the autoscaler's scale-down) may take every replica "
            "at once" + (f" ({', '.join(critical)}: the cluster's own networking, DNS or scaling)" if critical else "")
            + f".{system} Keep the selector on the labels the pod template carries (or change both together)"),
            (f"{namespace}/{name}",), cause=f"PDB {namespace}/{name} selects nothing"))
    return found


def _selector(selector: Mapping[str, Any]) -> str:
    labels = ", ".join(f"{k}={v}" for k, v in sorted((selector.get("matchLabels") or {}).items()))
    return f"({labels})" if labels else "(matchExpressions)"
