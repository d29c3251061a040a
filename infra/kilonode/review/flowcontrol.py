"""A change to API Priority and Fairness's objects (independent trace of kilonode diff on research-7500,
5th, finding 2): a PriorityLevelConfiguration's nominalConcurrencyShares, lendablePercent,
borrowingLimitPercent or limitResponse, or a FlowSchema's matching, precedence or level.

The resource diff reports such a change through the apiserver restarts it comes with (kilonode
sizes --max-requests-inflight from its levels' shares: kilonode.plan.resolve.components
apiserver_inflight); but every apiserver applies these objects live, independently of and before
any apiserver roll: its APF config controller watches both kinds and re-digests them on every
spec change (kubernetes/apiserver kubernetes-1.34.2 pkg/util/flowcontrol/apf_controller.go
l.308-361, the informers' event handlers queueing a reconfiguration; digestConfigObjects l.589),
dividing the server concurrency limit it was started with among the levels: nominal concurrency
limit = ceil(server concurrency limit x nominalConcurrencyShares / sum of every level's shares)
(finishQueueSetReconfigsLocked l.863; kubernetes.io "API Priority and Fairness", "Seats
Occupied by a Request" and "Priority Level"). The server concurrency limit is
--max-requests-inflight + --max-mutating-requests-inflight (server_run_options.go l.350-360,
feature.go l.77-85). So the seats a level has right after `pulumi up` updates the objects are
computed with the base's flags and the head's shares; after the apiservers roll, with the head's
flags. The sum of shares counts the built-in levels too, whose shares the plan carries
(components.apfBuiltinShares, the catalogue's).

Which flows a level carries: the FlowSchemas naming it (a ServiceAccount subject of a DaemonSet:
its pods on every node preflight's placement model puts it on), and for the built-in levels the
built-in schemas (kubernetes/apiserver kubernetes-1.34.2 pkg/apis/flowcontrol/bootstrap/default.go:
system-node-high -> node-high and system-nodes -> system, the kubelets (group system:nodes);
kube-controller-manager, kube-scheduler and kube-system-service-accounts -> workload-high;
system-leader-election -> leader-election).

Pure: a StackDiff in, findings out.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from kilonode.plan.resolve.joins import nominal_seats
from kilonode.preflight.checks.scheduling import placement_of
from kilonode.preflight.nodes import bootstrap_nodes
from kilonode.review import sides
from kilonode.review.compare import StackDiff
from kilonode.review.finding import HIGH, MEDIUM, Finding
from kilonode.review.lifecycle import plan_of

GROUP = "kubernetes:flowcontrol.apiserver.k8s.io/v1"
LEVEL = f"{GROUP}:PriorityLevelConfiguration"
SCHEMA = f"{GROUP}:FlowSchema"
DAEMONSET = "kubernetes:apps/v1:DaemonSet"
LEVEL_FIELDS = ("nominalConcurrencyShares", "lendablePercent", "borrowingLimitPercent", "limitResponse")
SCHEMA_FIELDS = ("matchingPrecedence", "priorityLevelConfiguration", "rules", "distinguisherMethod")
# v1's default nominalConcurrencyShares for a Limited level that names none (k8s.io/api flowcontrol/v1
# types.go, LimitedPriorityLevelConfiguration: "If not specified, this field defaults to a value of 30").
DEFAULT_SHARES = 30
APISERVER_UNIT = re.compile(r"^(apiserver-\d+)/etc/systemd/system/kube-apiserver\.service$")
READS = re.compile(r"--max-requests-inflight=(\d+)")
MUTATING = re.compile(r"--max-mutating-requests-inflight=(\d+)")
# The built-in levels' flows (default.go at kubernetes-1.34.2, the module docstring).
BUILTIN_FLOWS = {
    "node-high": "the kubelets' Node, Lease and node status (system-node-high)",
    "system": "the kubelets' other requests (system-nodes)",
    "leader-election": "kube-controller-manager's and kube-scheduler's leader election",
    "workload-high": "kube-controller-manager, kube-scheduler and the kube-system ServiceAccounts",
    "workload-low": "the other ServiceAccounts",
    "global-default": "every other authenticated user",
}
NODE_LEVELS = frozenset({"node-high", "system"})
CONTROLLER_LEVELS = frozenset({"workload-high", "leader-election"})
CONTROLLER_USERS = frozenset({"system:kube-controller-manager", "system:kube-scheduler"})
# High where a level carrying node agents or the controllers keeps less than half its seats. Its seats
# are its throughput: kilonode sized the node-agents level for the re-LISTs of a 10% DaemonSet rollout,
# cleared in under a second (kilonode.plan.defaults.flowcontrol), and a request waits in its queue at
# most a quarter of its deadline, 15 s, before it is answered 429 (priority-and-fairness.go
# getRequestWaitContext). At half the seats the same burst drains in twice the time, still within the
# sizing's margin; past half, 7,500 kube-proxies' (or the controllers') re-lists queue past that wait
# and are refused, and every node's data plane, or the control loops, fall behind at once on every
# apiserver. A smaller cut is told (medium) as the live change it is.
HIGH_KEEPS_FRACTION = 0.5


def _specs(entry: Mapping[str, Any] | None, kind: str) -> dict[str, Mapping[str, Any]]:
    found = {}
    for r in (entry or {}).get("resources", []):
        if r.get("type") == kind:
            inputs = r.get("inputs") or {}
            found[str((inputs.get("metadata") or {}).get("name") or "")] = inputs.get("spec") or {}
    return found


def _resource_names(entry: Mapping[str, Any] | None, kind: str, names: set[str]) -> list[str]:
    return [str(r.get("name")) for r in (entry or {}).get("resources", [])
            if r.get("type") == kind and ((r.get("inputs") or {}).get("metadata") or {}).get("name") in names]


def _level_fields(spec: Mapping[str, Any] | None) -> tuple[Any, ...]:
    body = (spec or {}).get("limited") or (spec or {}).get("exempt") or {}
    return ((spec or {}).get("type"), *(body.get(f) for f in LEVEL_FIELDS))


def _schema_fields(spec: Mapping[str, Any] | None) -> tuple[Any, ...]:
    return tuple((spec or {}).get(f) for f in SCHEMA_FIELDS)


def server_limit(entry: Mapping[str, Any] | None) -> tuple[int, int, int] | None:
    """(server concurrency limit, --max-requests-inflight, --max-mutating-requests-inflight) of the
    side's first apiserver unit that names both; None where none does."""
    files = (entry or {}).get("files") or {}
    for path in sorted(files):
        if APISERVER_UNIT.match(path):
            text = str(files[path])
            reads, mutating = READS.search(text), MUTATING.search(text)
            if reads and mutating:
                return int(reads.group(1)) + int(mutating.group(1)), int(reads.group(1)), int(mutating.group(1))
    return None


def apiservers(entry: Mapping[str, Any] | None) -> int:
    return sum(1 for path in (entry or {}).get("files") or {} if APISERVER_UNIT.match(path))


def shares(entry: Mapping[str, Any] | None) -> dict[str, int]:
    """Every level's nominalConcurrencyShares: the built-in ones the plan carries, then the side's own
    PriorityLevelConfigurations (which replace a built-in one of the same name)."""
    found = {str(k): int(v) for k, v in
             ((plan_of(entry).get("components") or {}).get("apfBuiltinShares") or {}).items()}
    for name, spec in _specs(entry, LEVEL).items():
        body = spec.get("limited") if spec.get("type") != "Exempt" else spec.get("exempt")
        value = (body or {}).get("nominalConcurrencyShares")
        found[name] = int(value) if value is not None else (0 if spec.get("type") == "Exempt" else DEFAULT_SHARES)
    return found


def _agents(diff: StackDiff) -> dict[tuple[str, str], tuple[str, int]]:
    """(namespace, ServiceAccount) -> (DaemonSet, nodes it runs on) at the head, by preflight's placement."""
    inputs = sides.inputs(diff, "head")
    if inputs is None:
        return {}
    groups = [g for g in bootstrap_nodes(inputs) if g.count]
    daemonsets = [w for w in inputs.workloads() if w.kind == "DaemonSet"]
    found = {}
    for ds in daemonsets:
        meta = ds.inputs.get("metadata") or {}
        pod = ((ds.inputs.get("spec") or {}).get("template") or {}).get("spec") or {}
        account = str(pod.get("serviceAccountName") or pod.get("serviceAccount") or "default")
        found[(str(meta.get("namespace") or "default"), account)] = (
            str(meta.get("name")), placement_of(ds, groups, daemonsets).nodes_eventually)
    return found


def _carried(diff: StackDiff, level: str, agents: Mapping[tuple[str, str], tuple[str, int]]) -> tuple[str, bool]:
    """What the level carries (its FlowSchemas' subjects, at the head else the base), and whether that
    is node agents or the controllers."""
    parts: list[str] = []
    vital = level in NODE_LEVELS or level in CONTROLLER_LEVELS
    schemas = {**_specs(diff.base, SCHEMA), **_specs(diff.head, SCHEMA)}
    for _, spec in sorted(schemas.items()):
        if ((spec.get("priorityLevelConfiguration") or {}).get("name")) != level:
            continue
        for rule in spec.get("rules") or []:
            for subject in rule.get("subjects") or []:
                kind = subject.get("kind")
                if kind == "ServiceAccount":
                    account = subject.get("serviceAccount") or {}
                    key = (str(account.get("namespace")), str(account.get("name")))
                    if key in agents:
                        ds, nodes = agents[key]
                        parts.append(f"{ds} on {nodes:,} nodes")
                        vital = True
                    else:
                        parts.append(f"ServiceAccount {key[0]}/{key[1]}")
                elif kind == "User":
                    user = str((subject.get("user") or {}).get("name"))
                    parts.append(f"user {user}")
                    vital = vital or user in CONTROLLER_USERS
                elif kind == "Group":
                    group = str((subject.get("group") or {}).get("name"))
                    parts.append(f"group {group}")
                    vital = vital or group == "system:nodes"
    if not parts and level in BUILTIN_FLOWS:
        parts.append(BUILTIN_FLOWS[level])
    return (", ".join(dict.fromkeys(parts)) or "no FlowSchema names it"), vital


def live_change(diff: StackDiff) -> list[Finding]:
    base_levels, head_levels = _specs(diff.base, LEVEL), _specs(diff.head, LEVEL)
    base_schemas, head_schemas = _specs(diff.base, SCHEMA), _specs(diff.head, SCHEMA)
    if not base_levels and not base_schemas:
        return []  # nothing of APF's is running yet: the first `pulumi up` creates them
    levels = {n for n in base_levels.keys() | head_levels.keys()
              if _level_fields(base_levels.get(n)) != _level_fields(head_levels.get(n))}
    schemas = {n for n in base_schemas.keys() | head_schemas.keys()
               if _schema_fields(base_schemas.get(n)) != _schema_fields(head_schemas.get(n))}
    if not levels and not schemas:
        return []
    changed = set(levels)  # the levels whose own objects changed; `levels` adds those a changed schema names
    for name in schemas:
        for spec in (base_schemas.get(name), head_schemas.get(name)):
            level = ((spec or {}).get("priorityLevelConfiguration") or {}).get("name")
            if level:
                levels.add(str(level))
    old_limit, new_limit = server_limit(diff.base), server_limit(diff.head)
    if old_limit is None or new_limit is None:
        diff.note("apf-live-change: an apiserver's --max-requests-inflight was not found in the rendered units, "
                  "so the levels' seats were not computed")
        return []
    old_shares, new_shares = shares(diff.base), shares(diff.head)
    before = nominal_seats(old_limit[0], old_shares)
    at_once = nominal_seats(old_limit[0], new_shares)
    after = nominal_seats(new_limit[0], new_shares)
    agents = _agents(diff)
    lines, high = [], False
    # the changed levels, then any other level the new sum of shares takes seats from
    others = sorted(n for n in before.keys() & at_once.keys() if n not in levels and at_once[n] < before[n])
    for name in [*sorted(levels), *others]:
        was, now, then = before.get(name, 0), at_once.get(name, 0), after.get(name, 0)
        carried, vital = _carried(diff, name, agents)
        if name not in levels and not vital:
            continue
        low = min(now, then)
        cut = low < was
        if cut and vital and low < was * HIGH_KEEPS_FRACTION:
            high = True
        roll = f", {then} once the apiservers roll onto the head's flags" if then != now else ""
        share = (f"shares {old_shares.get(name, '-')} -> {new_shares.get(name, '-')}"
                 if old_shares.get(name) != new_shares.get(name) else "its shares unchanged")
        lines.append(f"{name}: {was} -> {now} seats per apiserver at once ({share}){roll}; carries {carried}")
    if not lines:
        return []
    count = apiservers(diff.head) or apiservers(diff.base)
    flags = (f"server concurrency limit {old_limit[0]:,} (--max-requests-inflight={old_limit[1]} + "
             f"--max-mutating-requests-inflight={old_limit[2]})")
    if new_limit != old_limit:
        flags += f", {new_limit[0]:,} at the head ({new_limit[1]} + {new_limit[2]})"
    what = [*(f"PriorityLevelConfiguration {n}" for n in sorted(changed)),
            *(f"FlowSchema {n}" for n in sorted(schemas))]
    summary = (
        f"{', '.join(what)} changed: every running apiserver ({count}) applies it as soon as `pulumi up` writes "
        "it, independently of and before any apiserver roll (its APF controller re-digests the objects on every "
        "change: kubernetes/apiserver apf_controller.go), dividing the limit it was started with, "
        f"ceil(limit x shares / sum of all levels' shares); {flags}. "
        + "; ".join(lines) + ". "
        + ("A level carrying node agents or the controllers keeps less than half its seats: their re-lists "
           "after a rollout or a restart queue past the 15 s wait and are answered 429 on every apiserver at "
           "once. Keep those levels' seats: move the shares in steps, each after the apiservers run flags sized for "
           "it, watching apiserver_flowcontrol_rejected_requests_total"
           if high else
           "Watch apiserver_flowcontrol_rejected_requests_total and the queue waits after `pulumi up`"))
    subjects = tuple(sorted({*_resource_names(diff.head, LEVEL, changed), *_resource_names(diff.base, LEVEL, changed),
                             *_resource_names(diff.head, SCHEMA, schemas),
                             *_resource_names(diff.base, SCHEMA, schemas)}))
    return [Finding(HIGH if high else MEDIUM, "apf-live-change", summary, subjects,
                    cause="API Priority and Fairness")]


def assess(diff: StackDiff) -> list[Finding]:
    return live_change(diff)
