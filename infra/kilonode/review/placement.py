"""Placement across a change: every DaemonSet, Deployment and StatefulSet placed on each side
with preflight's own model (kilonode.preflight.checks.scheduling.placement_of over
kilonode.preflight.nodes.bootstrap_nodes: the taints each pool's kubelet registers with against
the pod's tolerations, its nodeSelector and required node affinity against the pool's labels),
and what the change takes away.

A DaemonSet that ran on a pool at the base and cannot at the head is a high risk, naming the
DaemonSet, the pools and their nodes, and which of two stories applies (or both):

- its template no longer fits (tolerations dropped, a nodeSelector or required affinity that
  no longer admits the pool's labels): `pulumi up` updates the DaemonSet, and its controller
  judges every node with the new template only. NodeShouldRunDaemonPod builds the new
  template's pod and checks its node affinity and its tolerations against the node's
  NoSchedule and NoExecute taints; podsShouldBeOnNode deletes the pods of a node whose
  affinity no longer matches or whose NoExecute taint is not tolerated, and the rolling update
  (rollingUpdate, maxSurge 0) deletes every old pod in turn (maxUnavailable at a time) and
  leaves creating its successor to manage(), which creates none on a node where shouldRun is
  false. So the pods there are deleted and not recreated (kubernetes/kubernetes
  pkg/controller/daemon: daemon_controller.go NodeShouldRunDaemonPod, predicates,
  podsShouldBeOnNode; update.go rollingUpdate. Read in the search index's copies of those files,
  whose code matches what is described here, NOT at the pinned v1.34.2 tag: kubernetes/kubernetes
  is too large to mirror here; no line numbers for that reason);
- the pool's nodes register with other taints or labels (a taint added to the pool, a label
  dropped): the kubelet sets --register-with-taints and --node-labels only on the Node it
  creates (pkg/kubelet/kubelet_node_status.go initialNode); a kubelet whose Node exists already
  reconciles its default labels, the attach-detach annotation and extended and huge-page
  resources only (tryRegisterWithAPIServer; the same copy caveat). So the nodes registered now
  keep their old taints and labels, and the DaemonSet keeps running there; every node that
  registers from now on (a scale-out, a replaced instance) never runs it.

A Deployment or StatefulSet that preflight would place at the base and not at the head (no node
admits it, or fewer nodes than its replicas with hostname anti-affinity) is high too: its pods
stay Pending once `pulumi up` rolls it (kilonode.preflight.checks.scheduling.workload_breaks).

Pure: a StackDiff in, findings out; the sides' preflight inputs come from kilonode.review.sides.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kilonode.k8s import gpu as k8s_gpu
from kilonode.k8s import rdma as k8s_rdma
from kilonode.plan.wellknown import GPU_RESOURCE, RDMA_RESOURCE
from kilonode.preflight.checks.scheduling import Placement, placement_of, workload_breaks
from kilonode.preflight.model import Inputs, Resource
from kilonode.preflight.nodes import PoolNodes, bootstrap_nodes
from kilonode.preflight.placement import pod_spec_of, selector_mismatch
from kilonode.review import sides
from kilonode.review.compare import StackDiff
from kilonode.review.finding import HIGH, Finding

# What a node lacks without the DaemonSet's pod ("Without <name>, ..."), by its name (a substring of it).
WITHOUT = {
    k8s_gpu.DAEMONSET_NAME: (
        f"a GPU node offers no {GPU_RESOURCE}: the kubelet advertises GPUs only through the plugin, so "
        "no GPU pod is placed there (pods already running keep the GPUs they hold until they end)"),
    k8s_rdma.NAME: (
        f"a node offers no {RDMA_RESOURCE}: no pod that asks for InfiniBand is placed there, and "
        "multi-node NCCL jobs lose the fabric"),
    "kube-proxy": "a node programs no Service: no Service IP, CoreDNS's included, works there",
    "cloud-node-manager": ("a node keeps the node.cloudprovider.kubernetes.io/uninitialized taint it "
                           "registers with: nothing else is ever placed on it"),
    "gpu-health": "a node has its GPUs checked by nothing, and a failing GPU keeps taking work",
}
TEMPLATE_STORY = (
    "the DaemonSet controller judges each node with the new template only: it deletes the pods "
    "on nodes the template no longer fits and creates none there (kubernetes pkg/controller/daemon "
    "NodeShouldRunDaemonPod, podsShouldBeOnNode, update.go rollingUpdate)")
NODES_STORY = (
    "the kubelet applies --register-with-taints and --node-labels only when it creates its Node "
    "(pkg/kubelet/kubelet_node_status.go initialNode; an existing Node is left as it is), so the nodes there "
    "now keep running it, and every node that registers from now on (a scale-out, a replaced instance) never "
    "does")


@dataclass
class _Side:
    groups: dict[str, PoolNodes]
    workloads: dict[str, Resource]
    daemonsets: list[Resource] = field(default_factory=list)

    def place(self, workload: Resource, nodes: _Side | None = None) -> Placement:
        """`workload` placed on this side's nodes (or `nodes`'s)."""
        on = nodes or self
        return placement_of(workload, list(on.groups.values()), on.daemonsets)


def _running(base: _Side, head: _Side) -> _Side:
    """The head's workloads on the nodes running once `pulumi up` is done: each pool's nodes as the
    base registered them (the kubelet never re-applies taints or labels to a Node that exists), a new
    pool's as the head does."""
    return _Side({role: base.groups.get(role, group) for role, group in head.groups.items()},
                 head.workloads, head.daemonsets)


def _side(inputs: Inputs) -> _Side:
    workloads = {w.describe(): w for w in inputs.workloads()}
    return _Side({g.host: g for g in bootstrap_nodes(inputs) if g.count},
                 workloads, [w for w in workloads.values() if w.kind == "DaemonSet"])


def daemonset_nodes(diff: StackDiff, namespace: str, name: str) -> dict[str, int] | None:
    """The pools (role -> node count) the base's DaemonSet `namespace/name` runs on, with preflight's
    placement model; None where the base has no preflight inputs or no such DaemonSet."""
    key = "placement:base"
    if key not in diff.derived:
        built = sides.inputs(diff, "base")
        diff.derived[key] = _side(built) if built is not None else None
    base = diff.derived[key]
    if base is None:
        return None
    for workload in base.daemonsets:
        meta = workload.inputs.get("metadata") or {}
        if str(meta.get("name") or "") == name and str(meta.get("namespace") or "default") == namespace:
            return {role: base.groups[role].count for role in sorted(_runs(base.place(workload)))
                    if role in base.groups}
    return None


def _runs(found: Placement) -> set[str]:
    return set(found.now) | set(found.after_gpu_health)


def _relevant(diff: StackDiff) -> bool:
    """Placement can differ only where a workload or a pool's registration (its rendered kubelet
    files, its node count) does: anything else keeps every verdict, and is not worth the model."""
    return (any(c.type.startswith("kubernetes:apps/") for c in diff.resources)
            or any(f.host.startswith("pool-") or f.path == "plan.yaml" for f in diff.files))


def assess(diff: StackDiff) -> list[Finding]:
    if not _relevant(diff):
        return []
    base_inputs, head_inputs = sides.inputs(diff, "base"), sides.inputs(diff, "head")
    if base_inputs is None or head_inputs is None:
        if diff.base and diff.head:
            why = sides.why_not(diff, "base") or sides.why_not(diff, "head")
            diff.note(f"where workloads can run (placement): {why}")
        return []
    base, head = _side(base_inputs), _side(head_inputs)
    return [*_daemonsets(base, head), *_replicated(base, head)]


@dataclass(frozen=True)
class _Loss:
    daemonset: str  # its name
    role: str
    nodes: int
    why: str  # why it cannot run there at the head
    template: bool  # its new template no longer fits the pool's nodes as they were
    registration: bool  # the pool's nodes now register with what the old template does not fit
    gated: bool  # preflight's scheduling check calls it a break: `pulumi up` refuses the run
    follows: bool = False  # it fits the pool's new registration: only the nodes registered now refuse it


def _losses(base: _Side, head: _Side) -> list[_Loss]:
    found = []
    for where, workload in head.workloads.items():
        was = base.workloads.get(where)
        if workload.kind != "DaemonSet" or was is None:
            continue
        ran, placed = _runs(base.place(was)), head.place(workload)
        name = str((workload.inputs.get("metadata") or {}).get("name") or workload.name)
        gated = {f.where for f in workload_breaks(placed, list(head.groups.values()))}
        new_roles = {r for r in head.groups if r not in base.groups
                     and not selector_mismatch(pod_spec_of(workload.inputs), head.groups[r].node.labels)}
        for role in sorted((ran & set(head.groups)) | new_roles):
            template = role in base.groups and role not in _runs(head.place(workload, base))
            if role in _runs(placed):
                if template:  # it fits the pool's new registration, not what its running nodes carry
                    found.append(_Loss(name, role, base.groups[role].count,
                                       head.place(workload, base).refused.get(role, "refused"),
                                       True, True, False, follows=True))
                continue
            registration = role in new_roles or role not in _runs(base.place(was, head))
            found.append(_Loss(name, role, head.groups[role].count, placed.refused.get(role, "refused"),
                               template, registration or not template, f"{where} on {role}" in gated))
    return found


def _registration_change(base: _Side, head: _Side, role: str) -> str:
    """What the pool's nodes register with now that they did not (taints, labels)."""
    if role not in base.groups:
        return f"{role} is a new pool"
    old, new = base.groups[role].node, head.groups[role].node
    added = [str(t) for t in new.taints if t not in old.taints]
    removed = [str(t) for t in old.taints if t not in new.taints]
    dropped = [f"{k}={v}" for k, v in old.labels.items() if new.labels.get(k) != v]
    parts = ([f"taint {', '.join(added)} added"] if added else []) + (
        [f"taint {', '.join(removed)} removed"] if removed else []) + (
        [f"label {', '.join(dropped)} changed or dropped"] if dropped else [])
    return f"{role}: " + ("; ".join(parts) or "its registration changed")


FOLLOWS_STORY = (
    "Preflight judges the nodes as the head registers them and passes it; but the kubelet applies "
    "--register-with-taints and --node-labels only when it creates its Node (pkg/kubelet/kubelet_node_status.go "
    "initialNode), and a reimage or an upgrade keeps the Node, so the running nodes keep their old taints and labels "
    "until each Node is deleted and registers again")
FOLLOWS_FIX = (
    "Tolerate (or select) both the old and the new registration until every node has registered again, then drop "
    "the old in a later change; or set the new taints and labels on the running nodes first (kubectl taint nodes / "
    "kubectl label nodes -l the pool's label), before `pulumi up`")

GATE = ("Preflight's scheduling check calls it a break, so `pulumi up` refuses the whole run before it changes "
        "anything (its preflight gate, kilonode.azure.program.preflight_gate); applied past the gate (kubectl, another "
        "tool), ")


def _gate(lost: list[_Loss], otherwise: str) -> str:
    return GATE if all(x.gated for x in lost) else otherwise


def without(names: list[str]) -> str:
    said = [f"Without {n}, {text}" for n in names for key, text in WITHOUT.items() if key in n]
    return (". " + ". ".join(said)) if said else ""


def _daemonsets(base: _Side, head: _Side) -> list[Finding]:
    """One line per decision: the DaemonSets whose new templates lose the same pools for the same
    reason (one shared toleration list edited) together; the DaemonSets a pool's new registration
    keeps off, per pool."""
    losses = _losses(base, head)
    findings = []
    by_template: dict[tuple[tuple[str, int, str], ...], list[str]] = {}
    per_daemonset: dict[str, list[_Loss]] = {}
    for loss in (x for x in losses if x.template and not x.follows):
        per_daemonset.setdefault(loss.daemonset, []).append(loss)
    for name, lost in per_daemonset.items():
        by_template.setdefault(tuple((x.role, x.nodes, x.why) for x in lost), []).append(name)
    for pools, names in by_template.items():
        lost = [x for x in losses if x.template and not x.follows and x.daemonset in names]
        nodes = sum(n for _, n, _ in pools)
        where = "; ".join(f"{role} ({count:,} nodes: {why})" for role, count, why in pools)
        findings.append(Finding(HIGH, "daemonset-stranded", (
            f"DaemonSet {' and '.join(names)} can no longer run on {nodes:,} nodes where {_it(names)} runs now: "
            f"{'its new template does' if len(names) == 1 else 'their new templates do'} not fit {where}. "
            f"{_gate(lost, 'At `pulumi up`, ')}{TEMPLATE_STORY}{without(names)}. Keep the tolerations, nodeSelector "
            "and affinity that admit those pools (preflight's scheduling check says which), or move the pools first"),
            tuple(sorted({*(f"DaemonSet {n}" for n in names), *(role for role, _, _ in pools)}))))
    findings += _registrations(base, head, [x for x in losses if x.follows], following=True)
    findings += _registrations(base, head, [x for x in losses if x.registration and not x.template],
                               following=False)
    return findings


def _registrations(base: _Side, head: _Side, losses: list[_Loss], following: bool) -> list[Finding]:
    """One line per set of DaemonSets a change to pools' registration strands (one taint renamed on
    several pools is one decision): `following`, their new templates follow the new registration and
    the running nodes refuse them; otherwise the new registration refuses their templates."""
    pools: dict[str, list[_Loss]] = {}
    for loss in losses:
        pools.setdefault(loss.role, []).append(loss)
    by_names: dict[tuple[str, ...], list[str]] = {}
    for role, lost in sorted(pools.items()):
        by_names.setdefault(tuple(sorted({x.daemonset for x in lost})), []).append(role)
    findings = []
    for names_t, roles in by_names.items():
        names = list(names_t)
        lost = [x for x in losses if x.role in roles and x.daemonset in names]
        first = {role: next(x for x in lost if x.role == role) for role in roles}
        nodes = sum(first[role].nodes for role in roles)
        changes = "; ".join(_registration_change(base, head, role) for role in roles)
        where = "; ".join(f"{role} ({first[role].nodes:,} nodes: {first[role].why})" for role in roles)
        subjects = tuple(sorted({*roles, *(f"DaemonSet {n}" for n in names)}))
        if following:
            text = (f"{changes}, and DaemonSet {' and '.join(names)} {_it(names, 'follows', 'follow')} it, but the "
                    f"{nodes:,} running nodes keep what they registered with, which the new template does not fit: "
                    f"{where}. {FOLLOWS_STORY}. At `pulumi up`, {TEMPLATE_STORY}: every running node loses "
                    f"{_it(names)}{without(names)}. {FOLLOWS_FIX}")
        else:
            text = (f"{changes}: DaemonSet {' and '.join(names)} {_it(names, 'does', 'do')} not tolerate it, on "
                    f"{nodes:,} nodes: {where}. {_gate(lost, 'Once applied, ')}{NODES_STORY}{without(names)}. Add the "
                    f"toleration to {'the DaemonSet' if len(names) == 1 else 'each DaemonSet'} in the same change, "
                    "or drop the taint")
        findings.append(Finding(HIGH, "daemonset-stranded", text, subjects))
    return findings


def _nodes(count: int) -> str:
    return f"{count:,} node" + ("" if count == 1 else "s")


def _it(names: list[str], one: str = "it", many: str = "they") -> str:
    return one if len(names) == 1 else many


def _replicated(base: _Side, head: _Side) -> list[Finding]:
    """Deployments and StatefulSets that preflight places at the base and not at the head."""
    found = []
    base_groups, head_groups = list(base.groups.values()), list(head.groups.values())
    running = _running(base, head)
    for where, workload in head.workloads.items():
        was = base.workloads.get(where)
        if workload.kind == "DaemonSet" or was is None:
            continue
        before = {(f.where, f.what.split(":")[0]) for f in workload_breaks(base.place(was), base_groups)}
        at_head = workload_breaks(head.place(workload), head_groups)
        if not at_head and was.inputs != workload.inputs:
            found += _refused_by_running(base, head, running, workload, before)
        for f in at_head:
            if (f.where, f.what.split(":")[0]) in before:
                continue
            when = ("once `pulumi up` rolls its new template" if was.inputs != workload.inputs else
                    "as the pools' nodes are replaced or added (its template is unchanged: its pods keep running on "
                    "the nodes registered now, which keep their old taints and labels)")
            found.append(Finding(HIGH, "workload-unplaceable", (
                f"{f.where}, {when}: {f.what} (at the base it is placed). {GATE}the same holds. Fix: {f.fix}"),
                (f.where,)))
    return found


def _refused_by_running(base: _Side, head: _Side, running: _Side, workload: Resource,
                        before: set[tuple[str, str]]) -> list[Finding]:
    """The head's template, placed at the head, refused by the nodes running now: the pools it needs
    changed how they register (a taint renamed, a label added) and it follows them."""
    now = running.place(workload)
    breaks = [f for f in workload_breaks(now, list(running.groups.values()))
              if (f.where, f.what.split(":")[0]) not in before]
    if not breaks:
        return []
    roles = sorted(r for r in _runs(head.place(workload)) if r in base.groups and r in now.refused)
    changed = "; ".join(_registration_change(base, head, r) for r in roles)
    refused = "; ".join(f"{r} ({_nodes(base.groups[r].count)} running now: {now.refused[r]})" for r in roles)
    return [Finding(HIGH, "workload-unplaceable", (
        f"{f.where}, once `pulumi up` rolls its new template: it fits the pools as the head registers them "
        f"({changed or 'their registration changed'}), not the nodes running now ({refused or f.what}), so its new "
        f"pods stay Pending. {FOLLOWS_STORY}. {FOLLOWS_FIX}"), (f.where,)) for f in breaks]
