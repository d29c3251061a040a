"""What a change risks, per stack: each risk with a level (high, medium) and its reason.

High: etcd members restarted or replaced together past what the cluster tolerates (quorum
lost), every apiserver at once, an invariant of the policy pack newly broken (the events
cluster removed, etcd's protection removed, ...: kilonode.review.rules), an etcd quota
lowered (a member already holding more data than the new quota refuses every write), the
Leases moved between etcd clusters on a running cluster (etcd.leases added or removed), a pool
shrunk by more than half, a subnet or a static address moved.
Medium: any etcd member or apiserver restarted or replaced, a change reaching the custom data
or image of every node of a pool (a fleet-wide rollout), a field lesson made weaker (a sysctl
below the field value, image pulls serialized, the runtime root off the local disk).

And high: an in-place update Azure refuses (effects.toml "refused"), which stops `pulumi up`
partway; a DaemonSet added, or one whose cluster-wide list/watch grows, budget stated or not
(kilonode.preflight.apiload: every node's pod is one more watch on the apiservers). Medium: a
join-token rotation, which rolls nothing (only the models' token changes) but strands an
instance whose own model carries a token whose Secret is deleted. Medium too, once per review: the
autoscaled scale sets whose model the change updates, whatever rule judges the cause (a rollout, a
join token, inert custom data): `pulumi up` PUTs each with the size it read at its start, so what the
autoscaler adds meanwhile is removed undrained (autoscaled_put). The in-cluster objects'
(a moved serviceCidr, replaced Services, Prometheus restarted, a tag under an unchanged digest)
are kilonode.review.incluster's.

Pure: a StackDiff (kilonode.review.compare) and the two snapshots' lessons in, risks out.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kilonode.azure.rollout import APISERVERS, ROLL_STEP, TARGET_LIMIT
from kilonode.preflight import apiload
from kilonode.review import (
    admission,
    alert_routing,
    alerting,
    apiserver_flags,
    apiservers,
    autoscaler,
    azure_alerts,
    capacity,
    control_flags,
    coredns,
    default_storageclass,
    disruption,
    encryption,
    etcd_flags,
    exporter_filters,
    exposure,
    flowcontrol,
    gang_scheduler,
    images,
    incluster,
    inert,
    ksm_resources,
    lifecycle,
    network,
    nodes,
    placement,
    pod_security_default,
    preflight_break,
    repairs,
    replicas,
    rules,
    runtime_logs,
    security,
    serving,
    storage,
    sysctl_netns,
    value_effects,
    versions,
)
from kilonode.review.compare import CREATE, DELETE, REPLACE, UPDATE, StackDiff, covers, natural, short
from kilonode.review.finding import HIGH, MEDIUM, Finding

LEVELS = (HIGH, MEDIUM)
APISERVER_ROLE = "apiserver"

VNET = "azure-native:network:VirtualNetwork"
# Inputs whose change moves an address something else already points at.
MOVES = {
    rules.SUBNET: ("addressPrefix", "addressPrefixes"),
    "azure-native:network:VirtualNetwork": ("addressSpace.addressPrefixes",),
    "azure-native:network:NetworkInterface": ("ipConfigurations[].privateIPAddress",),
    "azure-native:network:LoadBalancer": ("frontendIPConfigurations[].privateIPAddress",),
}


@dataclass(frozen=True)
class Risk:
    level: str
    rule: str  # a stable name: etcd-quorum, pool-shrink, ...
    stack: str
    summary: str  # one sentence: what and why
    subjects: tuple[str, ...] = ()  # the resources or files it is about
    # the decision it follows from, where several rules tell one decision's fan-out (the input a
    # location change moves on every resource: "location"): the report gives them one line
    cause: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"level": self.level, "rule": self.rule, "stack": self.stack, "summary": self.summary,
                "subjects": list(self.subjects), **({"cause": self.cause} if self.cause else {})}


def _resources(entry: Mapping[str, Any] | None) -> list[rules.Resource]:
    return [rules.Resource(r["type"], r["name"], r["inputs"], bool(r["protect"]))
            for r in (entry or {}).get("resources", []) if r.get("custom", True)]


def _plan(entry: Mapping[str, Any] | None) -> dict[str, Any]:
    return lifecycle.plan_of(entry)


_machine_of = lifecycle.machine_of
_down_together = lifecycle.down_together


def _why(diff: StackDiff, machines: set[str]) -> str:
    reasons = {c.reason() or c.action for c in diff.resources if _machine_of(c.name) in machines and c.restarts}
    return ", ".join(sorted(r for r in reasons if r)) or "restart key changed"


def _stopped(diff: StackDiff) -> set[str]:
    """Machines whose replacement or deletion stops `pulumi up` before anything goes down
    (kilonode.review.lifecycle tells that story): protected, or a fixed Azure name replaced
    create-before-delete; and the protected members a shrinking etcd cluster deletes (Pulumi never
    deletes a protected resource: lifecycle.etcd_shrink says what to do first)."""
    stops = {name for f in lifecycle.replacements(diff) for name in f.subjects}
    stops |= {name for _, _, removed in lifecycle.shrinking(diff).values() for name in removed
              if any(c.name == name and c.protect[0] for c in diff.resources)}
    return {_machine_of(name) for name in stops}


def _zone_moves(diff: StackDiff) -> dict[str, str]:
    """Control-plane machine -> "old -> new" zone, for each VM whose `zones` input this change moves in place:
    create-only in Azure (effects.toml: PropertyChangeNotAllowed)."""
    found = {}
    for c in diff.resources:
        if c.type == rules.VM and c.action == UPDATE:
            for i in c.inputs:
                if i.path == "zones" and i.before != i.after:
                    found[_machine_of(c.name)] = f"{_zone(i.before)} -> {_zone(i.after)}"
    return found


def _zone(value: Any) -> str:
    return ",".join(str(v) for v in value) if isinstance(value, list) else str(value)


def _apiservers_down(diff: StackDiff, down: set[str], members: int, names: tuple[str, ...], why: str,
                     moved: str) -> Risk:
    """The apiservers a change restarts, replaces or moves (`moved`: the zone moves said, '' for none):
    all of them high, unless the stack acknowledges the roll; some medium, the others serving."""
    level = HIGH if len(down) == members else MEDIUM
    tail = "no apiserver is left to serve" if level == HIGH else "the others serve meanwhile"
    rule = "apiservers-restarted" if level == MEDIUM else "apiservers-all"
    if moved:
        tail = (f"{moved}, one after another, the other {members - 1} carrying its clients meanwhile "
                "(an apiserver keeps no state: it starts from its custom data)" if level == MEDIUM else
                f"{moved}; deleted together, no apiserver is left to serve")
        return Risk(level, rule, diff.stack, f"{len(down)} of {members} apiservers: {tail}", names)
    acknowledged = APISERVERS in (_plan(diff.head).get("acknowledgeRestart") or ())
    if level == HIGH and acknowledged:
        # the stack says it means it (a control-plane image or version change): told as the roll it
        # is, medium, with the one way it stays safe; without the acknowledgement the guard refuses
        level, rule = MEDIUM, "apiservers-rolled"
        tail = (f"acknowledgeRestart lists {APISERVERS}, so the restart guard lets it through: replace them "
                f"one at a time, {ROLL_STEP}; {TARGET_LIMIT}; after the last, one full `pulumi up` (it "
                "records the new restart keys), then remove the acknowledgement (docs/azure.md, \"Rolling "
                "the control plane\")")
    elif level == HIGH:  # the working procedure: one machine per targeted run (kilonode.azure.rollout)
        tail += (f". `pulumi up` refuses it (restart guard) unless acknowledgeRestart lists {APISERVERS}; "
                 f"then replace them one at a time: {ROLL_STEP}; {TARGET_LIMIT}; after the last, one full "
                 "`pulumi up` (it records the new restart keys), then remove the acknowledgement "
                 "(docs/azure.md, \"Rolling the control plane\")")
    replaced = [c.name for c in diff.resources if c.type == rules.VM and _machine_of(c.name) in down
                and (c.action == REPLACE or "replace" in c.kinds)]
    if replaced:  # the audit log is on the local SSD (kilonode.plan.resolve.disks), which goes with the VM
        tail += (f". {len(replaced)} of them replaced: each one's audit log goes with its local disk; copy it "
                 "off first where it may be needed (docs/azure.md, \"Rolling the control plane\")")
    return Risk(level, rule, diff.stack,
                f"{len(down)} of {members} apiservers restart or are replaced ({why}): {tail}", names)


def control_plane(diff: StackDiff) -> list[Risk]:
    found = []
    stopped = _stopped(diff)
    if stopped:
        # Pulumi deletes what left the program only after every other step succeeded: a
        # replacement that stops `pulumi up` leaves the removed machines running too.
        stopped |= {_machine_of(c.name) for c in diff.resources if c.type == rules.VM and c.action == DELETE}
    zones = _zone_moves(diff)
    for group, (down, members) in _down_together(diff).items():
        if down <= stopped:
            continue  # `pulumi up` stops at the first of them: the replace-stops risk says so
        names = tuple(sorted(down, key=lambda n: (len(n), n)))
        why = _why(diff, down)
        # A zone move is no restart: Azure refuses the update (update-refused), and the only way is to
        # delete each machine and create it again in its new zone.
        moving = [n for n in names if n in zones]
        each = ", ".join(f"{n} {zones[n]}" for n in moving)
        moved = (f"{len(moving)} move{'s' if len(moving) == 1 else ''} zone ({each}): a VM's zone is "
                 "create-only, Azure refuses the update (PropertyChangeNotAllowed; update-refused), so `pulumi up` "
                 "stops there and no restart moves them: each must be deleted and created again in its new zone"
                 ) if moving else ""
        if group == APISERVERS:
            found.append(_apiservers_down(diff, down, members, names, why, moved if moving else ""))
            continue
        tolerated = rules.tolerated(members)
        if moving:
            # etcd's data is on the local SSD: a recreated member is a new, empty one
            protected = ("; the etcd VMs are protected, so `pulumi up` would not delete them either: each is "
                         "unprotected, deleted and recreated by hand, then protected again")
            found.append(Risk(
                HIGH if len(down) > tolerated else MEDIUM, "etcd-quorum" if len(down) > tolerated else "etcd-restarted",
                diff.stack,
                f"{len(down)} of {members} {group} members: {moved}, not restarted. Each loses its data (the local "
                "SSD goes with the VM) and rejoins as a new member: `etcdctl member remove` it first, and its new VM's "
                f"etcd-join adds it back ({lifecycle.MEMBER_RUNBOOK}){protected}. etcd with {members} members "
                f"tolerates {tolerated} missing"
                + (f", so deleting {len(down)} together loses quorum and every write stops" if len(down) > tolerated
                   else f"; {members - len(down)} keep quorum while {'it is' if len(down) == 1 else 'they are'} gone"),
                names))
            continue
        if len(down) > tolerated:
            found.append(Risk(
                HIGH, "etcd-quorum", diff.stack,
                f"{len(down)} of {members} {group} members restart or are replaced in one change ({why}); etcd with "
                f"{members} members tolerates {tolerated} down, so quorum is lost and every write stops. `pulumi up` "
                f"refuses it (restart guard) unless acknowledgeRestart lists {group}; roll one member at a time "
                "(docs/azure.md: \"Rolling the control plane\")", names))
        else:
            found.append(Risk(MEDIUM, "etcd-restarted", diff.stack,
                              f"{len(down)} of {members} {group} members restart or are replaced ({why}); "
                              f"{members - len(down)} keep quorum meanwhile", names))
    return found


def invariants(diff: StackDiff) -> list[Risk]:
    """A policy-pack invariant that held at the base and is broken at the head."""
    if diff.head is None:
        return []
    before = rules.violations(_resources(diff.base)) if diff.base else {}
    after = rules.violations(_resources(diff.head))
    found = []
    for name, messages in after.items():
        new = [m for m in messages if m not in before.get(name, [])]
        if new:
            found.append(Risk(HIGH, f"policy:{name}", diff.stack, "; ".join(new)))
    return found


def _clusters(plan: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    return {group: plan[key] for group, key in (("etcd-main", "etcdMain"), ("etcd-events", "etcdEvents"),
                                                ("etcd-leases", "etcdLeases"))
            if isinstance(plan.get(key), Mapping)}


def quota(diff: StackDiff) -> list[Risk]:
    before, after = _clusters(_plan(diff.base)), _clusters(_plan(diff.head))
    found = []
    for group, old in before.items():
        new = after.get(group)
        if not new:
            continue
        was, now = old.get("quotaBackendBytes"), new.get("quotaBackendBytes")
        if isinstance(was, int) and isinstance(now, int) and now < was:
            found.append(Risk(HIGH, "etcd-quota-lowered", diff.stack,
                              f"{group} quota lowered from {was:,} to {now:,} bytes: the cluster may already hold "
                              "more than the new quota (up to the old one), and a member over its quota raises "
                              "NOSPACE and refuses every write; compact and defragment first, and check the DB "
                              "size (docs/runbooks/etcd-nospace.md)", (f"plan.yaml {group}",)))
    return found


def leases_moved(diff: StackDiff) -> list[Risk]:
    """The leases cluster (etcd.leases) added to or removed from a running cluster: kube-apiserver
    reads every Lease from its new place, where none was copied, and while the apiservers roll
    some read the old place and some the new."""
    base, head = _plan(diff.base), _plan(diff.head)
    running = any(r.type == rules.VM and r.role == rules.ETCD_MAIN for r in _resources(diff.base))
    had, has = isinstance(base.get("etcdLeases"), Mapping), isinstance(head.get("etcdLeases"), Mapping)
    if not running or had == has:
        return []
    where = ("from the main etcd to the new leases cluster" if has
             else "from the leases cluster back to the main etcd")
    return [Risk(HIGH, "etcd-leases-moved", diff.stack,
                 f"every Lease moves {where}, which starts empty (nothing copies them): while the apiservers "
                 "roll, those with the old --etcd-servers-overrides and those with the new one see different "
                 "Leases, so two schedulers or controller managers may lead at once and node heartbeats written "
                 "through one side look missing on the other (nodes marked NotReady, then their pods evicted); "
                 "make the move with the controllers stopped and the node lifecycle controller's evictions off, or "
                 "set etcd.leases when the cluster is created (docs/architecture.md, \"The etcd clusters\")",
                 ("plan.yaml etcd-leases",))]


def pools(diff: StackDiff) -> list[Risk]:
    def nodes(plan: Mapping[str, Any]) -> dict[str, int]:
        return {p["name"]: int(p.get("nodes") or 0) for p in plan.get("nodePools") or [] if "name" in p}

    before, after = nodes(_plan(diff.base)), nodes(_plan(diff.head))
    found = []
    for pool, was in before.items():
        now = after.get(pool, 0)
        if was and now * 2 < was:
            what = "removed" if pool not in after else f"shrunk from {was:,} to {now:,} nodes"
            found.append(Risk(HIGH, "pool-shrink", diff.stack,
                              f"pool {pool} {what}: more than half of its nodes go at once (2,500-node lesson: never "
                              "let one action remove more than half of a pool); shrink in steps", (f"pool {pool}",)))
        elif was and now * 2 == was:
            found.append(Risk(MEDIUM, "pool-halved", diff.stack,
                              f"pool {pool} halved, {was:,} to {now:,} nodes: the most one change may remove "
                              "(2,500-node lesson); check that its work fits the rest", (f"pool {pool}",)))
    return found


def _networks(value: Any) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network] | None:
    """A prefix or a list of prefixes as networks; None where any is not one."""
    texts = value if isinstance(value, list) else [value]
    try:
        return [ipaddress.ip_network(str(t), strict=False) for t in texts]
    except ValueError:
        return None


def _kept(before: Any, after: Any) -> bool:
    """Every old prefix inside a new one: widened, no address moves."""
    old, new = _networks(before), _networks(after)
    return bool(old and new) and all(any(o.version == n.version and o.subnet_of(n)  # type: ignore[arg-type]
                                         for n in new) for o in old)


def moves(diff: StackDiff) -> list[Risk]:
    found = []
    for c in diff.resources:
        patterns = MOVES.get(c.type)
        if not patterns or c.action in (CREATE, DELETE):
            continue
        moved = [i for i in c.inputs if covers(i.path, patterns) and i.before is not None]
        widened = [i for i in moved if c.type == VNET and _kept(i.before, i.after)]
        if widened and len(widened) == len(moved):
            detail = "; ".join(f"{i.path}: {short(i.before, 400)} -> {short(i.after, 400)}" for i in widened)
            found.append(Risk(MEDIUM, "vnet-widened", diff.stack,
                              f"{c.name} widens its address space ({detail}): Azure updates a VNet's address "
                              "space in place and every old prefix is inside the new one, so no address moves. "
                              "Peered VNets need their peering synced afterwards, and the new range must not "
                              "overlap a peer's", (c.name,)))
            continue
        if moved:
            detail = "; ".join(f"{i.path}: {short(i.before, 400)} -> {short(i.after, 400)}" for i in moved)
            found.append(Risk(HIGH, "address-moved", diff.stack,
                              f"{c.name} moves an existing address ({detail}): what points at it (nodes, "
                              "certificates, --etcd-servers, kubeconfigs) breaks, and Azure refuses a subnet "
                              "prefix while addresses outside it are in use", (c.name,)))
    return found


def refused(diff: StackDiff) -> list[Risk]:
    """An in-place update Azure rejects (a create-only property nested in the request, which
    the provider does not replace by itself): `pulumi up` previews an update, then stops with
    Azure's error partway through. Moved addresses have their own rule."""
    groups: dict[tuple[str, str], list[str]] = {}
    why: dict[tuple[str, str], str] = {}
    for c in diff.resources:
        if c.action != UPDATE:
            continue  # a replaced resource is created anew; a refused input does not matter there
        for i in c.inputs:
            rows = [e for e in i.effects if e.effect == "refused"]
            if i.ignored or not rows or covers(i.path, MOVES.get(c.type, ())):
                continue
            key = (c.type, rows[0].path)
            # objects, not paths: one selector's matchLabels and its keys are one DaemonSet, not three
            if c.name not in groups.setdefault(key, []):
                groups[key].append(c.name)
            why[key] = rows[0].why
    return [Risk(HIGH, "update-refused", diff.stack,
                 f"{len(names)} {kind.rsplit(':', 1)[-1]} change {path} in place, which "
                 f"{'the apiserver' if kind.startswith('kubernetes:') else 'Azure'} refuses ({why[(kind, path)]}): "
                 "`pulumi up` stops with an error there, after changing what came before it; "
                 + (_priority_class_way(diff, names, path) if kind == PRIORITY_CLASS else
                    "recreate them deliberately instead"), tuple(names), cause=path)
            for (kind, path), names in sorted(groups.items())]


PRIORITY_CLASS = "kubernetes:scheduling.k8s.io/v1:PriorityClass"


# A PriorityClass's value and preemptionPolicy are immutable (kubernetes
# pkg/apis/scheduling/validation/validation.go, ValidatePriorityClassUpdate). Deleting it to recreate
# it is no way through for a class in use: meanwhile the Priority admission plugin refuses every pod
# naming the deleted class (plugin/pkg/admission/priority/admission.go, admitPod: "no PriorityClass
# with name ... was found"), a DaemonSet's or a Deployment's new pods included, and for a globalDefault
# class it gives a pod naming no class priority 0 (no global default left) and refuses a second
# globalDefault class (validatePriorityClass: "is already marked as default").
def _priority_class_way(diff: StackDiff, names: list[str], path: str = "value") -> str:
    classes = {c.name: c for c in diff.resources}
    said = []
    for name in names:
        inputs = ((classes[name].base or {}).get("inputs") or {}) if name in classes else {}
        meta = inputs.get("metadata") or {}
        label = str(meta.get("name") or name)
        if inputs.get("globalDefault"):
            said.append(f"{label} is globalDefault, so while it is deleted every new pod naming no class gets "
                        f"priority 0 and every pod naming {label} is refused at admission")
        else:
            said.append(f"while {label} is deleted every pod naming it (a controller's replacement pods "
                        "included) is refused at admission")
    why = f"the {path} is immutable, and deleting the class to recreate it is no way through: {'; '.join(said)}. "
    return (why + f"Create a new class under a new name with the new {path}, move globalDefault to it where the old "
            "one had it (unset on the old one first: the Priority admission plugin refuses a second globalDefault "
            "class) and the workloads' priorityClassName, and drop the old class in a later change")


CUSTOM_DATA = "virtualMachineProfile.osProfile.customData"
IMAGE = "virtualMachineProfile.storageProfile.imageReference"
SIZE = "sku.name"
ROLLOUTS = (("custom data", CUSTOM_DATA), ("image", IMAGE), ("VM size", SIZE))


def fleet(diff: StackDiff) -> list[Risk]:
    """A change reaching every scale set of a pool: every node's custom data, image or VM size,
    one line per pool whatever of them it changes. A pool's teams have scale sets of their own
    (role `pool-X.team-Y`): one decision reaching them all is one line for the pool; one reaching
    only a team's sets, a line for the team."""
    base_sets: dict[str, set[str]] = {}
    capacity: dict[str, int] = {}
    # each scale set counted once, under the role it has at the head: a removed team's sets that
    # move to the shared group (or another) are that group's rollout, not a second line of their own
    head_roles = {r.name: r.role for r in _resources(diff.head) if r.type == rules.VMSS and r.role}
    moved: dict[str, dict[str, int]] = {}  # head role -> base role -> sets moving from it
    for r in _resources(diff.base):
        if r.type == rules.VMSS and r.role:
            role = head_roles.get(r.name, r.role)
            base_sets.setdefault(role, set()).add(r.name)
            capacity[r.name] = int((r.props.get("sku") or {}).get("capacity") or 0)
            if role != r.role:
                moved.setdefault(role, {}).setdefault(r.role, 0)
                moved[role][r.role] += 1
    pools: dict[str, list[str]] = {}
    for role in sorted(base_sets):
        pools.setdefault(role.split(".", 1)[0], []).append(role)
    touched = {what: {c.name: c for c in diff.resources if c.type == rules.VMSS
                      and any(covers(i.path, (path,)) and not i.ignored for i in c.inputs)}
               for what, path in ROLLOUTS}
    image_changes = images.changes(diff)
    tokens_only = _token_only_pools(diff)
    # roles whose new custom data no running instance can see (kilonode.review.inert): their own line
    quiet = inert.inert_custom_data(diff)
    quiet_sets = {r: {n for n in base_sets.get(r, set()) if n in touched["custom data"]} for r in quiet}
    found = _risks(diff, inert.inert_findings(diff, quiet, quiet_sets, capacity))
    for pool, roles in pools.items():
        whole = set().union(*(base_sets[r] for r in roles))
        if pool in tokens_only:  # join_tokens says it: the model's token, nothing to roll
            touched_here = {what: ({} if what == "custom data" else names) for what, names in touched.items()}
        else:
            hidden = set().union(*(quiet_sets.get(r, set()) for r in roles))
            touched_here = {what: ({n: c for n, c in names.items() if n not in hidden} if what == "custom data"
                                   else names) for what, names in touched.items()}
        kinds = [what for what, _ in ROLLOUTS if whole <= touched_here[what].keys()]
        if kinds:
            parts = [f"{r.split('.', 1)[1] if '.' in r else 'shared'} {len(base_sets[r])}" for r in roles]
            where = f"{pool} ({len(whole)})" if len(roles) == 1 else f"{pool} ({len(whole)}: {', '.join(parts)})"
            found.append(_rollout(diff, where, kinds, whole, capacity, touched, image_changes.get(pool)))
            continue
        for r in roles:
            kinds = [what for what, _ in ROLLOUTS if base_sets[r] <= touched_here[what].keys()]
            if kinds:
                group = r.split(".", 1)[1] if "." in r else "the shared group"
                moves = "".join(f"; {n} of them move from {b.split('.', 1)[1] if '.' in b else 'the shared group'} "
                                f"to {group}" for b, n in sorted(moved.get(r, {}).items()))
                found.append(_rollout(diff, f"{r} ({len(base_sets[r])}{moves})", kinds, base_sets[r], capacity,
                                      touched, image_changes.get(pool)))
    # a pool's SSH keys: the model only, like the rollouts above, but nothing flags it otherwise
    return found + _risks(diff, inert.ssh_keys(diff))


def _rollout(diff: StackDiff, where: str, kinds: list[str], names: set[str], capacity: Mapping[str, int],
             touched: Mapping[str, Mapping[str, Any]], image: tuple[str, str, list[str]] | None) -> Risk:
    nodes = sum(capacity.get(n, 0) for n in names)
    # one fabric at a time only where the pool has one (plan.yaml nodePools[].infiniband)
    pool = where.split(" ", 1)[0].split(".", 1)[0].removeprefix("pool-")
    infiniband = any(p.get("name") == pool and p.get("infiniband") for p in _plan(diff.head).get("nodePools") or []
                     if isinstance(p, Mapping))
    unit = "one scale set (one InfiniBand fabric)" if infiniband else "one scale set (or a batch of its instances)"
    said = []
    for what in kinds:
        if what == "image" and image:
            said.append(f"image {image[0]} -> {image[1]} ({'; '.join(image[2]) or images.UNCHANGED})")
        elif what == "VM size":
            sizes = {(str(i.before), str(i.after)) for n in names for i in touched[what][n].inputs if i.path == SIZE}
            said.append("VM size " + ", ".join(f"{a} -> {b}" for a, b in sorted(sizes)))
        else:
            said.append(what)
    if "VM size" in kinds:
        return Risk(MEDIUM, "pool-resized", diff.stack, (
            f"every scale set of {where} gets a new {' and '.join(said)}: {nodes:,} nodes. A fleet replacement, not "
            "an update: with the Manual upgrade policy each instance keeps its old size until it is upgraded, and "
            "upgrading one resizes it (Azure stops it and redeploys it on the new size's hardware, deallocating it "
            "where the cluster lacks that size): it reboots, its local NVMe and temporary disk are wiped, and the "
            "node's pods go; new instances get the new size at once, so until every instance is upgraded the pool "
            "runs two sizes. Plan it as a pool replacement (a new pool of the new size beside this one, move the "
            "work, then drain and remove the old), with quota for the new size's family"), tuple(sorted(names)))
    return Risk(MEDIUM, "fleet-rollout", diff.stack,
                f"every scale set of {where} gets a new {' and '.join(said)} in its model: a fleet-wide rollout of "
                f"{nodes:,} nodes. {MANUAL_UPGRADE_CUSTOM_DATA if 'custom data' in kinds else MANUAL_UPGRADE} "
                f"New nodes get it at once; roll the rest {unit} at a time and watch the first: cordon and drain "
                "its nodes first (`kubectl drain`"
                + (", or wait until no gang runs on the fabric)" if infiniband else ")")
                + ", as the upgrade and reimage restart every node of it and kill the pods there, a training gang "
                "with one pod there included", tuple(sorted(names)),
                cause=lifecycle.image_cause(image[0], image[1]) if image and "image" in kinds else "")


# the ignoreChanges path an autoscaled scale set is recorded with (kilonode.azure.node_pool)
AUTOSCALED = "sku.capacity"


def autoscaled_put(diff: StackDiff) -> list[Risk]:
    """One line per review for every autoscaled scale set the change updates, whatever moves its model
    (an image, custom data, a join token, the fabric-label script, a tag): the effect, not the rule that
    judges the cause (independent trace 14, PRs 11 and 14: said under fleet-rollout only).

    Autoscaled scale sets are recorded with ignoreChanges on sku.capacity (the autoscaler's size,
    kilonode.azure.node_pool). pulumi-azure-native updates a scale set with a PUT of its whole model,
    sku.capacity included, and a PUT's capacity is the scale set's new size (kilonode.azure.node_pool
    _capacity: Azure/vm-scale-sets#70, Azure/aks-engine#2183); `pulumi up` sends the size it read when it
    started (kilonode.azure.live; docs/in-cluster.md, docs/azure.md), so a size the autoscaler changes during
    the run is set back, and the instances it added meanwhile are removed with no drain."""
    scaled = sorted((c for c in diff.resources if c.type == rules.VMSS and c.action == UPDATE
                     and AUTOSCALED in ((c.head or {}).get("ignoreChanges") or [])
                     and any(not i.ignored for i in c.inputs)), key=lambda c: natural(c.name))
    if not scaled:
        return []
    roles: dict[str, int] = {}
    for c in scaled:
        roles[c.role or "?"] = roles.get(c.role or "?", 0) + 1
    return [Risk(MEDIUM, "autoscaled-model-put", diff.stack, (
        f"`pulumi up` updates the model of {len(scaled)} autoscaled scale set(s) "
        f"({', '.join(f'{r} {n}' for r, n in sorted(roles.items()))}): it reads their sizes when it starts and "
        "sends each back with its update (a PUT of the whole model, sku.capacity included), so a size the "
        "autoscaler changes during the run is set back, instances it added meanwhile removed with no drain; "
        "pause the autoscaler for that run (`kubectl -n kube-system scale deployment cluster-autoscaler "
        "--replicas=0`, its replicas back after; docs/azure.md)"), tuple(c.name for c in scaled))]


# With the Manual upgrade policy an instance keeps its own model until it is upgraded to the scale
# set's: Update Instances (VirtualMachineScaleSets_UpdateInstances, POST .../manualupgrade, "Upgrades
# one or more virtual machines to the latest SKU set in the VM scale set model"; `az vmss
# update-instances`). A reimage is not an upgrade: VirtualMachineScaleSetVMs_Reimage restores the
# instance's own OS disk ("If exact version is not provided, the OS disk is reimaged to the existing
# version of OS Disk", VirtualMachineReimageParameters.exactVersion, Azure REST API compute
# 2024-11-01, learn.microsoft.com rest/api/compute/virtual-machine-scale-set-vms/reimage).
# A new image in the model rebuilds the OS disk when the instance is upgraded to it.
MANUAL_UPGRADE = ("With the Manual upgrade policy a running node gets it only when its instance is upgraded to the "
                  "scale set's model (`az vmss update-instances`); a reimage does not do it: it keeps the instance's "
                  "own model and image version.")
# Custom data is different: cloud-init processes it only when the instance is provisioned, at its
# first boot (docs/azure.md, "Custom data is read once, at a VM's first boot"), so an in-place
# upgrade to the model gives the instance the new custom data and leaves the running node on
# its old files. The node gets them when it is provisioned again from the upgraded model: a reimage
# after the upgrade (a fresh OS disk, cloud-init runs as on a first boot), or a new instance.
MANUAL_UPGRADE_CUSTOM_DATA = (
    "With the Manual upgrade policy a running node does not get new custom data in place: cloud-init reads "
    "custom data only when the instance is provisioned, at its first boot (docs/azure.md), so an upgrade to the "
    "model (`az vmss update-instances`) alone leaves the node running its old files. Upgrade each instance to the "
    "new model (`az vmss update-instances`), then reimage it (`az vmss reimage --instance-ids`), or delete it and "
    "let a new instance be created; a reimage without the upgrade keeps the instance's own model and custom data.")


TOKEN_SECRET = "bootstrap.kubernetes.io/token"


def _token_generations(plan: Mapping[str, Any]) -> dict[str, set[int]]:
    """pool -> the join-token generations the stack keeps for it (plan.yaml joinTokens)."""
    found: dict[str, set[int]] = {}
    for token in plan.get("joinTokens") or []:
        if isinstance(token, Mapping) and token.get("pool") is not None:
            found.setdefault(f"pool-{token['pool']}", set()).add(int(token.get("generation") or 0))
    return found


def _token_only_pools(diff: StackDiff) -> set[str]:
    """Pools (`pool-X`) whose join tokens move while none of their rendered files does: the custom
    data changes by the token alone (the token is in the custom data's second part, never in a
    rendered file: docs/azure.md, "What each VM receives as custom data")."""
    before, after = _token_generations(_plan(diff.base)), _token_generations(_plan(diff.head))
    touched_hosts = {f.host.split(".", 1)[0] for f in diff.files}
    return {pool for pool in before.keys() & after.keys() if before[pool] != after[pool] and pool not in touched_hosts}


def join_tokens(diff: StackDiff) -> list[Risk]:
    """A join-token rotation (docs/azure.md, "Node join credentials"): only the scale sets' models
    change, and the previous generation's Secrets, when the stack drops it, are deleted. And a
    registration group (a pool's shared group, or a team's) whose every token Secret is deleted while
    its scale sets stay, under another group (a team removed)."""
    return [*_rotated(diff), *_orphaned(diff)]


def _token_group(inputs: Mapping[str, Any]) -> str | None:
    """A bootstrap-token Secret's registration group, as a scale set's role names it (pool-X,
    pool-X.team-Y), from the labels kilonode.k8s.bootstrap gives it."""
    labels = (inputs.get("metadata") or {}).get("labels") or {}
    if inputs.get("type") != TOKEN_SECRET or not labels.get("kilonode.io/pool"):
        return None
    team = labels.get("kilonode.io/team")
    return f"pool-{labels['kilonode.io/pool']}" + (f".team-{team}" if team else "")


# The bootstrap token authenticator finds a token by its Secret (kube-system, type
# bootstrap.kubernetes.io/token: kubernetes plugin/pkg/auth/authenticator/token/bootstrap/
# bootstrap.go, AuthenticateToken: a token whose Secret is not found authenticates no one), so a
# deleted Secret's token joins nothing. An instance of a Manual-upgrade scale set keeps its own
# model's custom data (the token in it) until it is upgraded, and a reimage keeps that model
# (MANUAL_UPGRADE above): a reimaged, not-upgraded node offers the deleted token, cannot
# TLS-bootstrap, and never rejoins.
def _orphaned(diff: StackDiff) -> list[Risk]:
    head_groups = {g for r in (diff.head or {}).get("resources", [])
                   if (g := _token_group(r.get("inputs") or {})) is not None}
    deleted: dict[str, list[str]] = {}
    for c in diff.resources:
        group = _token_group((c.base or {}).get("inputs") or {}) if c.action == DELETE else None
        if group is not None and group not in head_groups:
            deleted.setdefault(group, []).append(c.name)
    if not deleted:
        return []
    head_roles = {r.name: r.role for r in _resources(diff.head) if r.type == rules.VMSS}
    found = []
    for group, secrets in sorted(deleted.items()):
        kept = sorted((r.name, head_roles[r.name]) for r in _resources(diff.base)
                      if r.type == rules.VMSS and r.role == group and r.name in head_roles)
        if not kept:
            continue  # its scale sets go too: no instance is left holding the token
        now = sorted({role or "?" for _, role in kept})
        found.append(Risk(MEDIUM, "join-token-rotated", diff.stack, (
            f"registration group {group}'s join-token Secrets are deleted ({len(secrets)}) while its {len(kept)} "
            f"scale set(s) remain, now {', '.join(now)}: each instance's own model (Manual upgrade policy) still "
            "carries that group's token in its custom data, and a reimage keeps the instance's model, so a "
            "reimaged node not upgraded first offers a token no Secret backs, cannot TLS-bootstrap and never "
            "rejoins. Upgrade the instances to the new model (`az vmss update-instances`) before a reimage, or "
            "keep the old token until then"), tuple(sorted(secrets)), cause="teams"))
    return found


def _rotated(diff: StackDiff) -> list[Risk]:
    pools = _token_only_pools(diff)
    before, after = _token_generations(_plan(diff.base)), _token_generations(_plan(diff.head))
    changed_pools = sorted(p for p in before.keys() & after.keys() if before[p] != after[p])
    if not changed_pools:
        return []
    old = sorted(set().union(*(before[p] for p in changed_pools)))
    new = sorted(set().union(*(after[p] for p in changed_pools)))
    retired = [c for c in diff.resources if c.action == DELETE
               and ((c.base or {}).get("inputs") or {}).get("type") == TOKEN_SECRET]
    gone = sorted(set(old) - set(new))
    said = (f"join tokens of {len(changed_pools)} pool(s) rotate (generations {', '.join(map(str, old))} -> "
            f"{', '.join(map(str, new))}): ")
    if pools:
        said += ("only the scale sets' models change, so new VMs join with the new token; the running nodes hold "
                 "their client certificates and never read a token again, so nothing needs rolling (no `az vmss "
                 "update-instances` for it). ")
    if not retired:
        return [Risk(MEDIUM, "join-token-rotated", diff.stack, said + "Remove `previous` once it has expired "
                     "(docs/azure.md, \"Node join credentials\")", tuple(changed_pools), cause="joinTokens")]
    said += (f"The generation {', '.join(map(str, gone)) or '?'} token Secrets are deleted ({len(retired)}), so that "
             "token joins nothing any more: an instance whose own model still carries it (one created from a model "
             "before the last rotation and never upgraded since) cannot join again after a reimage, which keeps the "
             "instance's own model and so its old custom data. Upgrade such instances to the current model "
             "(`az vmss update-instances`) before reimaging any, or keep that generation as `previous` until they "
             "are")
    return [Risk(MEDIUM, "join-token-rotated", diff.stack, said,
                 tuple(c.name for c in retired) or tuple(changed_pools), cause="joinTokens")]


def _sysctls(files: Mapping[str, str]) -> dict[str, dict[str, str]]:
    """host -> sysctl key -> value, from the rendered /etc/sysctl.d files."""
    found: dict[str, dict[str, str]] = {}
    for path, text in files.items():
        if "/etc/sysctl.d/" not in path or not path.endswith(".conf"):
            continue
        host = path.split("/", 1)[0]
        for line in text.splitlines():
            key, sep, value = line.partition("=")
            if sep and not line.lstrip().startswith(("#", ";")):
                found.setdefault(host, {})[key.strip()] = value.strip()
    return found


def _number(text: str | None) -> float | None:
    try:
        return float(text) if text is not None else None
    except ValueError:
        return None


def lessons(diff: StackDiff, base_lessons: Mapping[str, Any]) -> list[Risk]:
    base_files, head_files = (diff.base or {}).get("files", {}), (diff.head or {}).get("files", {})
    field_values = base_lessons.get("sysctl", {})
    found = []
    before, after = _sysctls(base_files), _sysctls(head_files)
    weaker: dict[tuple[str, str, str], list[str]] = {}
    for host, values in sorted(after.items()):
        for key, value in sorted(values.items()):
            lesson, now = _number(str(field_values.get(key))), _number(value)
            was = _number(before.get(host, {}).get(key))
            if lesson is None or now is None or now >= lesson or (was is not None and was < lesson):
                continue
            weaker.setdefault((key, value, str(before.get(host, {}).get(key, "unset"))), []).append(host)
    # one line per decision: the keys lowered together on the same hosts
    by_hosts: dict[tuple[str, ...], list[str]] = {}
    for (key, value, was_text), hosts in sorted(weaker.items()):
        by_hosts.setdefault(tuple(hosts), []).append(
            f"{key} = {value} (field value {field_values[key]}, was {was_text})")
    for hosts, keys in sorted(by_hosts.items()):
        found.append(Risk(MEDIUM, "sysctl-weaker", diff.stack,
                          f"below the field values on {len(hosts)} host(s) ({', '.join(hosts)}): {'; '.join(keys)} "
                          "(sysctl/ says why each value)", tuple(f"{h}/etc/sysctl.d" for h in hosts)))
    serialized: dict[str, list[str]] = {}
    for path, text in sorted(head_files.items()):
        if path.endswith("etc/kubernetes/kubelet-config.yaml") and path in base_files:
            was, now = lifecycle.load_yaml(base_files[path]) or {}, lifecycle.load_yaml(text) or {}
            if _pulls_serialized(now) and not _pulls_serialized(was):
                serialized.setdefault(_pull_setting(now), []).append(path)
    for setting, paths in sorted(serialized.items()):
        found.append(Risk(MEDIUM, "image-pulls-serialized", diff.stack,
                          f"image pulls serialised ({setting}) on {len(paths)} host(s) "
                          f"({', '.join(p.split('/', 1)[0] for p in paths)}): one slow pull blocks every other "
                          "pod's images on the node, the 2,500-node clusters' default (field notes: parallel pulls)",
                          tuple(paths)))
    found += _audit_log(diff, base_files, head_files)
    head_pools = {p["name"]: p for p in _plan(diff.head).get("nodePools") or [] if "name" in p}
    for pool in _plan(diff.base).get("nodePools") or []:
        now = head_pools.get(pool.get("name"))
        if not now:
            continue
        mount = ((now.get("localStorage") or {}).get("mountPoint")) or ""
        was_mount = ((pool.get("localStorage") or {}).get("mountPoint")) or ""
        root, was_root = str(now.get("runtimeRoot") or ""), str(pool.get("runtimeRoot") or "")
        on = bool(mount) and (root + "/").startswith(mount.rstrip("/") + "/")
        was_on = bool(was_mount) and (was_root + "/").startswith(was_mount.rstrip("/") + "/")
        if was_on and not on:
            found.append(Risk(MEDIUM, "runtime-root-off-local-disk", diff.stack,
                              f"pool {pool['name']}: the container runtime's root moves from {was_root} to "
                              f"{root or '(default)'}, off the local SSD: image pulls and writable layers land on "
                              "the OS disk (field notes: the runtime root on the local disk)",
                              (f"pool {pool['name']}",)))
    return found


def _pulls_serialized(config: Mapping[str, Any]) -> bool:
    """The kubelet pulls one image at a time: serializeImagePulls (default true), or parallel pulls
    capped at one (maxParallelImagePulls, read only when serializeImagePulls is false; kubelet
    config v1beta1)."""
    if config.get("serializeImagePulls", True):
        return True
    limit = config.get("maxParallelImagePulls")
    return isinstance(limit, int) and limit <= 1


def _pull_setting(config: Mapping[str, Any]) -> str:
    if config.get("serializeImagePulls", True):
        return "serializeImagePulls: true"
    return f"maxParallelImagePulls: {config.get('maxParallelImagePulls')}"


AUDIT_FLAG = "--audit-log-path"


def _audit_paths(files: Mapping[str, str]) -> dict[str, str]:
    """apiserver host -> its --audit-log-path ('' where the flag is absent or empty)."""
    found = {}
    for path, text in files.items():
        if path.endswith("etc/systemd/system/kube-apiserver.service"):
            match = re.search(rf"{AUDIT_FLAG}=(\S*)", text)
            found[path.split("/", 1)[0]] = match.group(1).rstrip("\\") if match else ""
    return found


def _audit_log(diff: StackDiff, base_files: Mapping[str, str], head_files: Mapping[str, str]) -> list[Risk]:
    before, after = _audit_paths(base_files), _audit_paths(head_files)
    off = sorted(h for h, p in after.items() if p in ("", "-") and before.get(h, "") not in ("", "-"))
    if not off:
        return []
    return [Risk(HIGH, "audit-log-off", diff.stack,
                 f"the apiservers' audit log is turned off ({AUDIT_FLAG} empty or '-', i.e. none or stdout) on "
                 f"{', '.join(off)}: no record of who changed or read what in the cluster (the CIS benchmark's "
                 "audit-log checks); "
                 "controlPlane.auditLog.path set it back", tuple(off))]


def _node_count(plan: Mapping[str, Any]) -> int:
    """Every pool's nodes: the most pods one DaemonSet can run."""
    return sum(int(p.get("nodes") or 0) for p in plan.get("nodePools") or [] if isinstance(p, Mapping))


def api_load(diff: StackDiff) -> list[Risk]:
    """A DaemonSet that may list or watch more cluster-wide at the head than at the base (a new
    one, or wider rights): N nodes, N watches."""
    if diff.head is None:
        return []
    before = {load.resource_name: load.resources() for load in apiload.api_loads(_resources(diff.base))}
    nodes = _node_count(_plan(diff.head))
    found = []
    for load in apiload.api_loads(_resources(diff.head)):
        wider = load.resources() - before.get(load.resource_name, set())
        if not wider:
            continue
        what = "new DaemonSet" if load.resource_name not in before else "DaemonSet"
        budget = (f"its stated budget: {load.budget!r}" if load.budget else
                  f"no {apiload.API_LOAD_BUDGET_ANNOTATION} annotation, so `pulumi preview` refuses it "
                  "(policy daemonset-api-load)")
        found.append(Risk(HIGH, "daemonset-api-load", diff.stack,
                          f"{nodes:,} nodes x a watch of {load.what(wider)} on the apiservers: the 2,500-node "
                          f"lesson ({what} {load.daemonset} as {load.account}, {load.sources()}; {budget})",
                          (load.resource_name,)))
    return found


def assess(diff: StackDiff, base_lessons: Mapping[str, Any]) -> list[Risk]:
    """Every risk of one stack's change, high first."""
    if diff.errors:
        side = "head" if diff.head and "error" in diff.head else "base"
        return [Risk(HIGH if side == "head" else MEDIUM, "stack-invalid", diff.stack,
                     f"the stack does not load at the {side}: `pulumi up` would stop there ({'; '.join(diff.errors)})",
                     ())]
    found = [*control_plane(diff), *invariants(diff), *quota(diff), *leases_moved(diff), *pools(diff), *moves(diff),
             *refused(diff), *autoscaled_put(diff),
             *fleet(diff), *join_tokens(diff), *lessons(diff, base_lessons), *api_load(diff), *world(diff),
             *_risks(diff, lifecycle.assess(diff)), *_risks(diff, _versions(diff)),
             *_risks(diff, placement.assess(diff)), *_risks(diff, alerting.assess(diff)),
             *_risks(diff, exporter_filters.narrowed(diff)), *_risks(diff, repairs.assess(diff)),
             *_risks(diff, azure_alerts.assess(diff)),
             *_risks(diff, images.assess(diff)), *_risks(diff, network.assess(diff)),
             *_risks(diff, network.deployer_moved(diff)), *_risks(diff, network.exposure_grown(diff)),
             *_risks(diff, incluster.assess(diff)), *_risks(diff, nodes.assess(diff)),
             *_risks(diff, capacity.assess(diff)), *_risks(diff, coredns.assess(diff)),
             *_risks(diff, flowcontrol.assess(diff)), *_risks(diff, apiservers.assess(diff)),
             *_risks(diff, admission.assess(diff)), *_risks(diff, autoscaler.assess(diff)),
             *_risks(diff, apiserver_flags.assess(diff)), *_risks(diff, etcd_flags.assess(diff)),
             *_risks(diff, control_flags.assess(diff, frozenset(value_effects.flags_spoken(diff)))),
             *_risks(diff, value_effects.assess(diff)), *_risks(diff, replicas.assess(diff))]
    found += _risks(diff, gang_scheduler.assess(diff))
    found += _risks(diff, security.assess(diff))
    found += _risks(diff, pod_security_default.assess(diff))
    found += _risks(diff, encryption.assess(diff))
    found += _risks(diff, serving.assess(diff))
    found += _risks(diff, sysctl_netns.assess(diff))
    found += _risks(diff, storage.assess(diff))
    found += _risks(diff, default_storageclass.assess(diff))
    found += _risks(diff, disruption.assess(diff)) + _risks(diff, disruption.selects_nothing(diff))
    found += _risks(diff, alert_routing.assess(diff))
    found += _risks(diff, alert_routing.inhibitions_widened(diff))
    found += _risks(diff, alert_routing.pages_rerouted(diff))
    found += _risks(diff, alert_routing.groups_split(diff))
    found += _risks(diff, ksm_resources.assess(diff))
    found += _risks(diff, runtime_logs.assess(diff))
    found += _risks(diff, runtime_logs.live_restore_off(diff))
    # last: a new preflight break the rules above have not told already (kilonode.review.preflight_break)
    found += _risks(diff, preflight_break.assess(diff, [(r.rule, r.subjects, r.summary) for r in found]))
    return sorted(found, key=lambda r: LEVELS.index(r.level))


def _risks(diff: StackDiff, findings: list[Finding]) -> list[Risk]:
    return [Risk(f.level, f.rule, diff.stack, f.summary, f.subjects, f.cause) for f in findings]


def _versions(diff: StackDiff) -> list[Finding]:
    base, head = _plan(diff.base), _plan(diff.head)
    base_contents = (diff.base or {}).get("imageContents") or {}
    head_contents = (diff.head or {}).get("imageContents") or {}
    return [*versions.skew(base, head, base_contents, head_contents),
            *versions.image_contents(base_contents, head_contents)]


def world(diff: StackDiff) -> list[Risk]:
    """New ways in from the Internet, one line per decision (the same rule on several NSGs)."""
    new = exposure.new_exposures((diff.base or {}).get("resources", []), (diff.head or {}).get("resources", []))
    groups: dict[str, list[str]] = {}
    for owner, what in new.values():
        groups.setdefault(what, []).append(owner)
    return [Risk(HIGH, "world-open", diff.stack,
                 f"{what}, on {len(owners)} resource(s): {', '.join(sorted(owners))}. Admit named prefixes "
                 "(network.adminCidr, apiserverAllowedCidrs, deployer.cidrs), never the world", tuple(sorted(owners)))
            for what, owners in sorted(groups.items())]
