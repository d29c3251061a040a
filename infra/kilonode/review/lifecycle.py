"""What really happens to machines, data and nodes under a change, told as `pulumi up` and Azure
would tell it:

- a replaced resource that is protected, or whose Azure name is fixed, stops `pulumi up`: Pulumi
  replaces create-before-delete unless told otherwise, the replacement would carry the same
  Azure name as the resource still there, and pulumi-azure-native does not create over an
  existing resource; a protected one is never deleted by `pulumi up` at all. For a control-plane
  machine the advice carries the restart guard (kilonode.azure.rollout, run by every `pulumi up`,
  targeted or not): `acknowledgeRestart` first where the change moves more of a group than it
  allows, and a full run at the end (docs/azure.md, "Rolling the control plane"). The advice is per
  kind: an etcd member (protected and fixed-named: unprotecting it leaves the second stop),
  a storage account (its blobs go with it: nothing rejoins), a scale set (its instances go), a
  machine;
- the resource group or the VNet replaced: everything inside goes with it;
- an etcd member replaced or resized loses the data on its local SSD (Azure's temporary disk
  does not survive a resize or a redeploy: managed-disks-overview.md, "Temporary disk");
- an etcd cluster shrunk: its removed members leave etcd by `etcdctl member remove` before their
  VMs go, or the rest keep the old cluster's quorum; their protected deletes stop `pulumi up`;
- a pool subnet the stack has not recorded yet (`network.unrecorded`);
- labels and taints a node registered with stay, reimaged or not: the kubelet applies
  --node-labels and --register-with-taints only when it creates its Node, and a reimaged
  instance keeps its name, so its kubelet finds the Node there and keeps what it has
  (kubernetes/kubernetes pkg/kubelet/kubelet_node_status.go: initialNode sets them,
  tryRegisterWithAPIServer reconciles an existing Node's attach-detach annotation, default
  labels and extended and huge-page resources only; read in the search index's copy, not at
  the pinned v1.34.2 tag: kubernetes/kubernetes is too large to mirror here);
- a new image version that deletes the one before it (its gallery version and VHD) in the same
  `pulumi up`: the rollback target goes while nodes still run it.

Pure: a StackDiff (kilonode.review.compare) in, findings out.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from typing import Any

import yaml

from kilonode.azure.rollout import APISERVERS, RESTART_KEYS_OUTPUT, ROLL_STEP, TARGET_LIMIT, changed
from kilonode.plan import wellknown
from kilonode.review.compare import CREATE, DELETE, REPLACE, ResourceChange, StackDiff
from kilonode.review.finding import HIGH, MEDIUM, Finding
from kilonode.review.rules import ETCD_GROUPS, VM, VMSS, tolerated
from kilonode.review.unit_flags import program_flags
from kilonode.yamlio import load_yaml, load_yaml_all

RESOURCE_GROUP = "azure-native:resources:ResourceGroup"
VNET = "azure-native:network:VirtualNetwork"
# The input that is a resource's Azure name, per type, where the program fixes it.
FIXED_NAMES = {VM: "vmName", VMSS: "vmScaleSetName"}
MEMBER_RUNBOOK = "docs/runbooks/etcd-member-lost-its-disk.md"
RESTORE_RUNBOOK = "docs/runbooks/etcd-restore-from-snapshot.md"
ROLLING = 'docs/azure.md, "Rolling the control plane"'
APISERVER_ROLE = "apiserver"


def restart_keys(entry: Mapping[str, Any] | None) -> dict[str, Any]:
    """The side's recorded restart keys (kilonode.azure.rollout): group -> machine -> key."""
    keys = (entry or {}).get("outputs", {}).get(RESTART_KEYS_OUTPUT)
    return keys if isinstance(keys, dict) else {}


def machine_of(vm_name: str) -> str:
    """`research-7500-etcd-main-3` -> `etcd-main-3` (the restart keys' names)."""
    match = re.search(r"(etcd-(?:main|events|leases)-\d+|apiserver-\d+)$", vm_name)
    return match.group(1) if match else vm_name


def group_of(role: str | None) -> str | None:
    """A control-plane VM's restart-guard group (acknowledgeRestart's names), None for others."""
    if role in ETCD_GROUPS:
        return role
    return APISERVERS if role == APISERVER_ROLE else None


def _members(entry: Mapping[str, Any] | None, group: str) -> list[str]:
    role = APISERVER_ROLE if group == APISERVERS else group
    return [str(r.get("name")) for r in (entry or {}).get("resources", []) if r.get("type") == VM
            and ((r.get("inputs") or {}).get("tags") or {}).get("kilonode-role") == role]


def down_together(diff: StackDiff) -> dict[str, tuple[set[str], int]]:
    """Per control-plane group: the machines this change restarts, replaces or deletes, and the
    group's size before it. Two sources: each VM's changed inputs (effects.toml, its
    replaceOnChanges), and the restart keys the restart guard compares (same rule as `pulumi up`)."""
    found: dict[str, tuple[set[str], int]] = {}
    for group in (*ETCD_GROUPS, APISERVERS):
        members = _members(diff.base, group)
        if not members:
            continue
        down = {machine_of(c.name) for c in diff.resources
                if c.type == VM and group_of(c.role) == group and c.action != CREATE and c.restarts}
        previous, current = restart_keys(diff.base).get(group) or {}, restart_keys(diff.head).get(group) or {}
        down |= {machine_of(name) for name in changed(previous, current)}
        if down:
            found[group] = (down, len(members))
    return found


def guard_refuses(diff: StackDiff) -> dict[str, tuple[int, int]]:
    """The groups whose change the program's restart guard refuses (kilonode.azure.rollout.disruptions,
    run by every `pulumi up`, targeted or not: the program computes every control-plane machine's
    restart key and compares them all with the last full run's, kilonode.azure.cluster
    _restart_verdict): group -> (machines restarted or replaced, members at the head). Deleted
    machines are not the head's, so the guard does not count them."""
    found = {}
    deleted = {machine_of(c.name) for c in diff.resources if c.type == VM and c.action == DELETE}
    for group, (down, _) in down_together(diff).items():
        members = len(_members(diff.head, group))
        moved = len(down - deleted)
        if members and (moved == members if group == APISERVERS else moved > tolerated(members)):
            found[group] = (moved, members)
    return found


def _guard_advice(refused: Mapping[str, tuple[int, int]], groups: list[str]) -> tuple[str, str]:
    """What the restart guard adds to a one-at-a-time procedure: the acknowledgement first (when
    it refuses the change) and, in every case, the full run that records the new restart keys."""
    named = [g for g in groups if g in refused]
    if not named:
        return "", (f"; after the last, one full `pulumi up`: only a full run records the new restart keys "
                    f"({ROLLING})")
    counts = ", ".join(f"{refused[g][0]} of the {refused[g][1]} {g} machines the head has" for g in named)
    listed = ", ".join(named)
    first = (f"First add `acknowledgeRestart: [{listed}]` to the stack file: the restart guard compares every "
             f"control-plane machine's restart key with the last full run's, targeted runs included, so with "
             f"{counts} changed, it refuses each `pulumi up --target` too; once acknowledged, {TARGET_LIMIT}. "
             "Then ")
    last = (f"; after the last, one full `pulumi up` (it records the new restart keys), then remove "
            f"acknowledgeRestart and commit ({ROLLING})")
    return first, last


# load_yaml (kilonode.yamlio): libyaml's loader, research-7500's plan.yaml in a tenth of the
# pure-Python loader's time, and a review parses it per rule; other review modules import it here.

def plan_of(entry: Mapping[str, Any] | None) -> dict[str, Any]:
    """The side's plan.yaml, parsed once per text (a review's rules ask for it about fifteen
    times, 0.1-0.2 s each for research-7500): shared, so read it, never change it."""
    text = (entry or {}).get("files", {}).get("plan.yaml")
    return _parsed(text) if text else {}


@functools.lru_cache(maxsize=4)
def _parsed(text: str) -> dict[str, Any]:
    return load_yaml(text) or {}


def _recorded(change: ResourceChange) -> Mapping[str, Any]:
    return change.base or change.head or {}


def _short(name: str, stack: str) -> str:
    return name.removeprefix(f"{stack}-")


STORAGE_ACCOUNT = "azure-native:storage:StorageAccount"
GALLERY_IMAGE_VERSION = "azure-native:compute:GalleryImageVersion"
COMMAND = "command:local:Command"


def _kind(c: ResourceChange) -> str:
    """What a stopped replacement is, for its advice: an etcd member, a storage account, a scale
    set, another machine, or anything else."""
    if c.type == VM and c.role in ETCD_GROUPS:
        return "etcd-member"
    return {STORAGE_ACCOUNT: "storage-account", VMSS: "scale-set", VM: "machine"}.get(c.type, "other")


def replacements(diff: StackDiff) -> list[Finding]:
    """Replaced resources `pulumi up` cannot replace as planned: one finding per kind of stop,
    with advice for that kind of resource and why it stops (protected, a fixed Azure name, or
    both: the etcd members are both, so unprotecting one leaves the second stop)."""
    groups: dict[tuple[str, str, str, bool], list[ResourceChange]] = {}
    for c in diff.resources:
        if c.action != REPLACE:
            continue
        why = c.reason() or "an input that forces a new resource"
        record = _recorded(c)
        name_input = FIXED_NAMES.get(c.type)
        # Pulumi replaces with the head program's options: its deleteBeforeReplace decides
        options = c.head or record
        fixed = name_input is not None and bool((record.get("inputs") or {}).get(name_input)) \
            and not options.get("deleteBeforeReplace")
        if c.protect[0]:
            groups.setdefault(("protected", _kind(c), why, fixed), []).append(c)
        elif fixed:
            groups.setdefault(("fixed-name", _kind(c), why, fixed), []).append(c)
    refused = guard_refuses(diff)
    return [Finding(HIGH, "replace-stops", _stop_story(diff.stack, stop, kind, why, fixed, changes, refused),
                    tuple(c.name for c in changes), cause=why)
            for (stop, kind, why, fixed), changes in sorted(groups.items())]


def _capacity(changes: list[ResourceChange]) -> int:
    return sum(int((((c.base or {}).get("inputs") or {}).get("sku") or {}).get("capacity") or 0) for c in changes)


def _stop_story(stack: str, stop: str, kind: str, why: str, fixed: bool, changes: list[ResourceChange],
                refused: Mapping[str, tuple[int, int]]) -> str:
    short = ", ".join(_short(c.name, stack) for c in changes)
    head = f"`pulumi up` stops at {short}: "
    groups = sorted({g for c in changes if (g := group_of(c.role))})
    first, last = _guard_advice(refused, groups) if groups else ("", "")
    if stop == "protected" and kind == "etcd-member":
        second = (" Unprotecting is not enough: its Azure name is fixed and Pulumi replaces create-before-delete, "
                  "so `pulumi up --target` would stop again at the name (pulumi-azure-native will not create over "
                  "the VM still there)." if fixed else "")
        # delete-before-replace (kilonode.azure.vm): the targeted run deletes the old VM first
        replace = ("delete the old VM (`pulumi destroy --target <urn>`: nothing depends on an etcd VM), "
                   "`pulumi up --target <urn>` to create it anew" if fixed else
                   "`pulumi up --target <urn>` (it is delete-before-replace: the old VM goes first, the new one "
                   "takes its name and NIC)")
        return (head + f"replacing it ({why}) means deleting it, and it is protected (etcd's data).{second} "
                f"{first}{'do' if first else 'Do'} one member per run: `pulumi state unprotect <urn>`, "
                f"{replace}, let etcd-join re-add it as a new member "
                f"({MEMBER_RUNBOOK}) and wait for `etcdctl endpoint health --cluster`, `pulumi state protect <urn>`, "
                f"then the next{last}")
    if stop == "protected" and kind == "storage-account":
        return (head + f"replacing it ({why}) means deleting it, and it is protected: a storage account is deleted "
                "with every blob in it (here the etcd snapshots, the only way back from a lost cluster). Nothing "
                "rejoins: what is in it is gone. Keep the account (undo the change that forces the replacement); "
                "if it must move, create the new account beside it, copy the blobs (`azcopy copy --recursive`), point "
                "the cluster at it, and only then retire the old one")
    if stop == "protected":
        return (head + f"replacing it ({why}) means deleting it, and it is protected: `pulumi up` never deletes it. "
                "Undo the change that forces the replacement, or decide that it may go, `pulumi state unprotect` "
                "it, and run again")
    if kind == "scale-set":
        return (head + f"it is replaced ({why}), Pulumi creates the replacement before deleting the old one, and "
                "the replacement has the same fixed Azure name, which pulumi-azure-native will not create over the "
                f"scale set still there. Replacing a scale set deletes its {_capacity(changes):,} instances "
                "with it: add a new pool (a new name) beside it, move the work, then remove this one")
    # Never `pulumi destroy --target` here: at a ref where the in-cluster objects depend on every
    # apiserver VM (through the readiness check's dependency on the ControlPlane component,
    # pulumi/pulumi#7732) it is refused, and with --target-dependents deletes them all.
    return (head + f"it is replaced ({why}), Pulumi creates the replacement before deleting the old one, and the "
            "replacement has the same fixed Azure name, which pulumi-azure-native will not create over the machine "
            "still there. It must be replaced delete-before-replace, as kilonode's control-plane VMs are "
            f"(kilonode.azure.vm). {first}{'do' if first else 'Do'} one machine per run: {ROLL_STEP}{last}")


def containers(diff: StackDiff) -> list[Finding]:
    """The resource group or the VNet replaced or deleted: everything inside goes with it."""
    found = []
    # the resource groups first: what goes with a group is everything, with a VNet its machines
    for c in sorted(diff.resources, key=lambda c: c.type != RESOURCE_GROUP):
        if c.type not in (RESOURCE_GROUP, VNET) or c.action not in (REPLACE, DELETE):
            continue
        what = "resource group" if c.type == RESOURCE_GROUP else "VNet"
        why = c.reason() or c.action
        inside = ("every resource of the cluster (etcd's VMs and their data, the apiservers, every pool)"
                  if c.type == RESOURCE_GROUP else "every subnet, NIC and machine attached to it")
        found.append(Finding(HIGH, "container-replaced", (
            f"the {what} {c.name} is {'deleted' if c.action == DELETE else 'replaced'} ({why}): Azure deletes "
            f"{inside} with it. `pulumi up` stops first at the protected etcd VMs, after deleting what it "
            "could; a cluster cannot move region or group in place: build a new stack there and move the "
            "work"), (c.name,), cause=why))
    return found


def shrinking(diff: StackDiff) -> dict[str, tuple[int, int, list[str]]]:
    """etcd clusters that keep running with fewer members: group -> (members before, after, the
    removed members' VM names). A cluster removed whole is the policy's (etcd-member-counts)."""
    found = {}
    for group in ETCD_GROUPS:
        before, after = _members(diff.base, group), _members(diff.head, group)
        if after and len(after) < len(before):
            found[group] = (len(before), len(after), sorted(set(before) - set(after)))
    return found


def teardown(diff: StackDiff) -> list[Finding]:
    """The stack armed for `pulumi destroy` (ClusterConfig.teardown): after this `pulumi up`, nothing
    stops a destroy from deleting every etcd member and its data."""
    if not diff.base or not diff.head or plan_of(diff.base).get("teardown") or not plan_of(diff.head).get("teardown"):
        return []
    members = sorted(n for g in ETCD_GROUPS for n in _members(diff.head, g))
    return [Finding(HIGH, "teardown-armed", (
        f"teardown: true: the {len(members)} etcd VMs lose `protect` and the cluster's resource group is tagged "
        "kilonode-teardown=armed (the policy pack's etcd-protected invariant then lets them go): once this "
        "`pulumi up` is done, `pulumi destroy` deletes every etcd member and the cluster's state with it. Only "
        "for a cluster being retired: first delete its LoadBalancer Services (cloud-controller-manager removes "
        "the load balancers and public IPs it made, else the subnets cannot be deleted), then `pulumi destroy "
        "--exclude-protected` keeps the etcd backup account and its snapshots (docs/operations.md, \"Tearing a "
        "cluster down\")"), tuple(members))]


def etcd_growth(diff: StackDiff) -> list[Finding]:
    """More etcd members in a running cluster: each new VM's etcd-join adds its member with
    `etcdctl member add` before it starts (templates/usr/local/lib/kilonode/etcd-join.j2), and an
    added member counts toward quorum at once. etcd's runtime reconfiguration guide (etcd-io/website
    content/en/docs/v3.5/op-guide/runtime-configuration.md, "Add a new member", and "Strict
    reconfiguration check mode") adds one member at a time; the strict check refuses an add only
    where the started members would fall below the new quorum, so two adds in one run pass and
    leave the cluster with no failure tolerated until both have started and caught up."""
    found = []
    for group in ETCD_GROUPS:
        before, after = _members(diff.base, group), _members(diff.head, group)
        if not before or len(after) <= len(before):
            continue
        added = sorted(set(after) - set(before), key=lambda n: (len(n), n))
        quorum = len(after) // 2 + 1
        spare = len(before) - quorum
        found.append(Finding(HIGH if spare < 0 else MEDIUM, "etcd-grown", (
            f"{group} grows from {len(before)} to {len(after)} members ({', '.join(added)} created): each new "
            "member's etcd-join adds it with `etcdctl member add` before it starts, and it counts toward quorum at "
            f"once, so until every new member has started and caught up the cluster has {len(after)} members, quorum "
            f"{quorum}, and {len(before)} started: "
            + ("it tolerates no failure meanwhile" if spare == 0 else
               f"{spare} may fail meanwhile" if spare > 0 else "quorum is lost until they start")
            + " (etcd runtime reconfiguration guide: add one member at a time). Grow one member per change, each "
            "after `etcdctl endpoint health --cluster` shows the last one healthy"),
            tuple(added)))
    return found


def etcd_shrink(diff: StackDiff) -> list[Finding]:
    """Fewer etcd members: deleting a VM does not change etcd's membership. Each removed member
    must leave it first (`etcdctl member remove`, one at a time: etcd's runtime reconfiguration
    guide, "Remove a member"; etcd counts quorum over the members it knows, and a dead one still
    counts, etcd-io/website content/en/docs/v3.5/op-guide/runtime-configuration.md)."""
    found = []
    for group, (was, now, removed) in sorted(shrinking(diff).items()):
        quorum = was // 2 + 1
        left = now - quorum
        fate = (f"the remaining {now} run a {was}-member cluster whose quorum is {quorum}: it can lose "
                f"{'none' if left == 0 else left} of them" if left >= 0 else
                f"the remaining {now} are fewer than the {was}-member cluster's quorum of {quorum}: every write stops")
        names = ", ".join(_short(n, diff.stack) for n in removed)
        found.append(Finding(HIGH, "etcd-members-removed", (
            f"{group} shrinks from {was} to {now} members ({names} deleted): deleting a VM does not remove its member "
            f"from etcd, so unless each is removed first {fate}. Before each VM goes, on a healthy member "
            f"(etcdctl as in {MEMBER_RUNBOOK}, step 0, and its \"By hand\" section): `etcdctl member remove <ID>` for "
            "it, one member at a time, `etcdctl endpoint health --cluster` between. `pulumi up` stops at their "
            "deletion meanwhile: they are protected, and Pulumi never deletes a protected resource; once a member "
            "is out of etcd, `pulumi state unprotect <urn>` its VM and run `pulumi up` again"),
            tuple(removed)))
    return found


def etcd_data(diff: StackDiff) -> list[Finding]:
    """etcd members replaced or resized: their data on the local SSD is gone. A shrinking cluster's
    removed members are etcd_shrink's; the rest are counted against the cluster as it will be."""
    groups: dict[str, list[ResourceChange]] = {}
    members: dict[str, int] = {g: len(_members(diff.base, g)) for g in ETCD_GROUPS}
    shrunk = shrinking(diff)
    for group, (_, now, _) in shrunk.items():
        members[group] = now
    for c in diff.resources:
        if c.type != VM or c.role not in ETCD_GROUPS or c.action == CREATE:
            continue
        if c.action == DELETE and c.role in shrunk:
            continue
        resized = any(i.path == "hardwareProfile.vmSize" and not i.ignored for i in c.inputs)
        if c.action in (REPLACE, DELETE) or resized:
            groups.setdefault(str(c.role), []).append(c)
    refused = guard_refuses(diff)
    found = []
    for role, changes in sorted(groups.items()):
        names = [c.name for c in changes]
        total = members.get(role) or len(names)
        every = len(names) >= total
        if every:
            tail = (f"with all {total} members at once nothing keeps the data, and the cluster would have to be "
                    f"restored from its latest snapshot ({RESTORE_RUNBOOK}), losing what was written since"
                    if role != "etcd-events" else
                    f"with all {total} members at once nothing keeps the data: the Events cluster would have to be "
                    f"bootstrapped again from any recent snapshot ({RESTORE_RUNBOOK}); what it holds is Events, kept "
                    "an hour (--event-ttl), so losing them costs little, but until it is back every apiserver's "
                    "Event writes fail")
            stops = [s for s, held in (
                (f"the restart guard (unless acknowledgeRestart lists {role})", role in refused),
                ("the members' protect (unless unprotected)",
                 any(c.protect[0] and c.action in (REPLACE, DELETE) for c in changes))) if held]
            if stops:
                # the outcome past both stops, not what `pulumi up` does: the replace-stops line says that
                tail = (f"`pulumi up` stops before that, at {' and at '.join(stops)}; only if forced past "
                        f"{'both' if len(stops) > 1 else 'it'}: {tail}")
        else:
            tail = (f"each comes back empty and must rejoin as a new member while the other {total - len(names)} "
                    f"keep the data ({MEMBER_RUNBOOK})")
        found.append(Finding(HIGH if every else MEDIUM, "etcd-data-lost", (
            f"{len(names)} of {total} {role} members are resized or replaced: their data lives on the local SSD "
            f"(Azure's temporary disk, wiped when a VM is resized onto other hardware or recreated); {tail}"),
            tuple(names)))
    return found


def unrecorded(diff: StackDiff) -> list[Finding]:
    """Subnets the head plans that the stack file does not record."""
    before = {str(u) for u in (plan_of(diff.base).get("network") or {}).get("unrecorded") or []}
    after = [u for u in (plan_of(diff.head).get("network") or {}).get("unrecorded") or [] if str(u) not in before]
    if not after:
        return []
    shown = "; ".join(str(u) for u in after)
    return [Finding(MEDIUM, "subnet-unrecorded", (
        f"new subnet(s) not recorded in the stack file ({shown}): their addresses are computed, and a later "
        f"change to the pools can move them under running nodes. Run `kilonode allocate {diff.stack}` and "
        "commit the stack file with this change"), ())]


def shards(plan: Mapping[str, Any]) -> dict[str, tuple[str, Any, Any]]:
    """scale set -> (pool, labels and taints it registers its nodes with, team)."""
    found = {}
    for pool in plan.get("nodePools") or []:
        if not isinstance(pool, Mapping):
            continue
        for shard in pool.get("shards") or []:
            if isinstance(shard, Mapping) and shard.get("name"):
                found[str(shard["name"])] = (str(pool.get("name")), (pool.get("labels"), pool.get("taints")),
                                             shard.get("team"))
    return found


def registration(diff: StackDiff) -> list[Finding]:
    """Scale sets whose nodes would register with other labels, taints or team: existing nodes keep theirs."""
    before, after = shards(plan_of(diff.base)), shards(plan_of(diff.head))
    groups: dict[str, list[str]] = {}
    gpu_taints: dict[str, str] = {}
    # a team move under the head's node-identity policy is worse than labels that stay: the nodes'
    # own writes are denied (kilonode.review.nodes.node_identity says it, high)
    denied = identity_policy_denies(diff.head)
    for name, (pool, marks, team) in after.items():
        if name not in before:
            continue
        _, old_marks, old_team = before[name]
        if old_team != team and denied:
            continue
        if old_team != team:
            key = f"pool {pool}: team {old_team or '(shared)'} -> {team or '(shared)'}"
        elif old_marks != marks:
            key = f"pool {pool}: labels or taints"
            gpu_taints[key] = _gpu_taints_added(diff, pool, old_marks[1], marks[1])
        else:
            continue
        groups.setdefault(key, []).append(name)
    # Only kubectl label / kubectl taint reach the Nodes that exist: a deleted Node comes back only at
    # the kubelet's next start (kubelet.go syncNodeStatus calls registerWithAPIServer, which returns at
    # once once registrationCompleted is set), with the flags it started with, and an instance upgraded
    # to the new model keeps its old files (custom data is read at first boot only: docs/azure.md).
    loops = [f for f in (_autoscaler_template_untainted(diff, pool, old, new)
                         for pool, (old, new) in sorted(_taints_added(diff).items())) if f is not None]
    return loops + [Finding(MEDIUM, "labels-until-reimaged", (
        f"{what} change for {len(names)} scale set(s): the kubelet applies --node-labels and --register-with-taints "
        "only when it creates its Node, and a kubelet whose Node exists already reconciles only its default labels "
        "(kubernetes pkg/kubelet/kubelet_node_status.go tryRegisterWithAPIServer, initialNode). So the nodes there "
        "keep the old ones (and take the old team's work), and a reimage does not help: it keeps the instance's "
        "name, so its kubelet finds the Node and keeps them too; only new instances register with the new ones. "
        "Apply them to the Nodes that exist (`kubectl label nodes -l kilonode.io/pool=<pool> <key>=<value> "
        "--overwrite`; `kubectl taint nodes -l ... <key>=<value>:<effect>`, `<key>-` to remove one): that is the "
        "way that works. Deleting the Node does not make it register anew: nothing re-runs cloud-init on an "
        "upgraded instance, and a running kubelet recreates a deleted Node only when it restarts, with the "
        f"--node-labels and --register-with-taints it started with, the old ones{gpu_taints.get(what, '')}"),
        tuple(names))
        for what, names in sorted(groups.items())]


NODE_IDENTITY_POLICY = "kilonode-node-identity"
CAPACITY_FILE = "in-cluster/capacity.yaml"


def identity_policy_denies(entry: Mapping[str, Any] | None) -> bool:
    """The side's rendered `kilonode-node-identity` policy checks the team label, fails closed and is
    bound to deny (what kilonode.k8s.capacity renders; read from the side's own files, so a head that
    drops or loosens it is judged as it is)."""
    text = ((entry or {}).get("files") or {}).get(CAPACITY_FILE)
    if not isinstance(text, str):
        return False
    policy = binding = False
    for doc in _documents(text):
        spec = doc.get("spec") or {}
        if doc.get("kind") == "ValidatingAdmissionPolicy" and (doc.get("metadata") or {}).get("name") == \
                NODE_IDENTITY_POLICY:
            policy = spec.get("failurePolicy", "Fail") == "Fail" and any(
                wellknown.TEAM_LABEL in str(v.get("expression")) for v in spec.get("validations") or [])
        if doc.get("kind") == "ValidatingAdmissionPolicyBinding" and spec.get("policyName") == NODE_IDENTITY_POLICY:
            binding = "Deny" in (spec.get("validationActions") or [])
    return policy and binding


def _documents(text: str) -> list[Mapping[str, Any]]:
    try:
        return [d for d in load_yaml_all(text) if isinstance(d, Mapping)]
    except yaml.YAMLError:
        return []


def _taints_added(diff: StackDiff) -> dict[str, tuple[list[str], list[str]]]:
    """pool -> (its taints at the base, at the head) for each pool the base has whose taints changed."""
    def pools(entry: Mapping[str, Any] | None) -> dict[str, Mapping[str, Any]]:
        return {str(p.get("name")): p for p in plan_of(entry).get("nodePools") or [] if isinstance(p, Mapping)}

    before, after = pools(diff.base), pools(diff.head)
    return {name: ([str(t) for t in before[name].get("taints") or []], [str(t) for t in pool.get("taints") or []])
            for name, pool in after.items() if name in before
            and (before[name].get("taints") or []) != (pool.get("taints") or [])}


def _taint_parts(taint: str) -> tuple[str, str, str]:
    """(key, value, effect) of a plan taint written key[=value]:Effect."""
    head, _, effect = taint.rpartition(":")
    key, _, value = head.partition("=")
    return key, value, effect


def _tolerates(tolerations: Any, taint: str) -> bool:
    """Whether a pod's tolerations tolerate the taint, as the scheduler matches them (kubernetes
    staging/src/k8s.io/api/core/v1/toleration.go ToleratesTaint: an empty effect matches every effect,
    an empty key with Exists every key, Exists any value, Equal (the default) the same value)."""
    key, value, effect = _taint_parts(taint)
    for t in tolerations or []:
        if not isinstance(t, Mapping):
            continue
        if t.get("effect") and t.get("effect") != effect:
            continue
        operator = t.get("operator") or "Equal"
        if not t.get("key") and operator == "Exists":
            return True
        if t.get("key") == key and (operator == "Exists" or str(t.get("value") or "") == value):
            return True
    return False


def _targets_pool(spec: Mapping[str, Any], pool: str) -> bool:
    """A pod spec that selects the pool's nodes by kilonode's pool label (nodeSelector, or a required
    node affinity term `In` the pool)."""
    if (spec.get("nodeSelector") or {}).get(wellknown.POOL_LABEL) == pool:
        return True
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    return any(e.get("key") == wellknown.POOL_LABEL and e.get("operator") == "In" and pool in (e.get("values") or [])
               for term in required.get("nodeSelectorTerms") or [] if isinstance(term, Mapping)
               for e in term.get("matchExpressions") or [] if isinstance(e, Mapping))


def _extended_resource_toleration(entry: Mapping[str, Any] | None) -> bool:
    """Every apiserver of the side runs with the ExtendedResourceToleration admission plugin (its
    rendered unit's --enable-admission-plugins)."""
    hosts = program_flags((entry or {}).get("files") or {}).get("kube-apiserver") or {}
    return bool(hosts) and all("ExtendedResourceToleration" in str(flags.get("enable-admission-plugins") or "")
                               .split(",") for flags in hosts.values())


def _autoscaler_template_untainted(diff: StackDiff, pool: str, old: list[str], new: list[str]) -> Finding | None:
    """A NoSchedule or NoExecute taint added to an autoscaled pool whose nodes run: the existing Nodes
    keep the taints they registered with (labels-until-reimaged), and cluster-autoscaler builds each
    node group's template from a running node of the group: MixedTemplateNodeInfoProvider.Process
    takes, per node group, the first Ready, schedulable, stable node it lists
    (isNodeGoodTemplateCandidate) and sanitises that node's own taints (only the autoscaler's and
    the startup taints are dropped); the scale set's template tags
    (k8s.io_cluster-autoscaler_node-template_taint_*) are read only when the group has no such node
    (SanitizedTemplateNodeInfoFromNodeGroup, "called only if there are no working nodes")
    (kubernetes/autoscaler cluster-autoscaler-1.34.5,
    cluster-autoscaler/processors/nodeinfosprovider/mixed_nodeinfos_processor.go:75-147, 182-194;
    simulator/node_info_utils.go:62,124). So the template stays untainted: a pending pod that does not
    tolerate the taint fits it, the autoscaler adds a node, the node registers with the taint, the pod
    still cannot land, and the next loop scales up again, up to the pool's max. Said where the pool
    has GPUs or not alike; not said where the head's own workloads that target the pool all tolerate
    it and either the apiservers add the toleration to every GPU pod (ExtendedResourceToleration, a
    taint keyed nvidia.com/gpu on a GPU pool) or the pool has no GPUs for user pods to ask for."""
    head_pool = next((p for p in plan_of(diff.head).get("nodePools") or []
                      if isinstance(p, Mapping) and p.get("name") == pool), None)
    scaling = (head_pool or {}).get("autoscaling") or {}
    if not head_pool or not scaling:
        return None
    added = [t for t in new if t not in old and _taint_parts(t)[2] in ("NoSchedule", "NoExecute")]
    if not added:
        return None
    gpus = int(head_pool.get("gpusPerNode") or 0) > 0
    covered = gpus and _extended_resource_toleration(diff.head) and all(
        _taint_parts(t)[0] == wellknown.GPU_RESOURCE for t in added)
    own = []
    for r in (diff.head or {}).get("resources") or []:
        kind = str(r.get("type") or "").rsplit(":", 1)[-1]
        if kind not in ("Deployment", "StatefulSet", "Job"):
            continue  # a DaemonSet's pod never asks for a node
        inputs = r.get("inputs") or {}
        spec = (((inputs.get("spec") or {}).get("template") or {}).get("spec")) or {}
        if _targets_pool(spec, pool) and not all(_tolerates(spec.get("tolerations"), t) for t in added):
            meta = inputs.get("metadata") or {}
            own.append(f"{kind} {meta.get('namespace', 'default')}/{meta.get('name')}")
    if covered and not own:
        return None
    most = int(scaling.get("maxNodes") or 0)
    who = [f"the stack's own {', '.join(sorted(own))} target{'s' if len(own) == 1 else ''} the pool without "
           "tolerating it, so the loop starts as soon as one of its pods is pending"] if own else []
    if not covered:
        who.append("any user pod that targets the pool without the toleration (the apiservers "
                   + ("add it to GPU pods only for a taint keyed nvidia.com/gpu"
                      if _extended_resource_toleration(diff.head)
                      else "run without ExtendedResourceToleration, so no GPU pod gets it unless its owner writes it")
                   + ") does the same")
    return Finding(HIGH, "autoscaler-template-untainted", (
        f"pool {pool} is autoscaled and gains {', '.join(added)}: the Nodes that run keep the taints they registered "
        "with, untainted, and cluster-autoscaler builds each node group's template from one of its running Ready "
        "nodes (the scale set's node-template taint tags are read only for a group with no such node: kubernetes/"
        "autoscaler cluster-autoscaler processors/nodeinfosprovider/mixed_nodeinfos_processor.go Process, at the "
        "stack's pinned release). "
        "So a pending pod that does not tolerate the taint fits the untainted template, the autoscaler adds a "
        "node, the node registers with the taint, the pod still cannot land there, and the next loop scales up "
        f"again: up to the pool's max, {most:,} nodes, of machines nothing uses. {'; '.join(who)}. Taint the running "
        f"Nodes in the same change window (`kubectl taint nodes -l {wellknown.POOL_LABEL}={pool} <key>=<value>:"
        "<effect>`), so every template the autoscaler builds carries it, and add the toleration to the workloads "
        "that target the pool first"), (pool,))


def _gpu_taints_added(diff: StackDiff, pool: str, old: Any, new: Any) -> str:
    """What a taint added to a GPU pool does to the users' GPU pods. The apiservers run without the
    ExtendedResourceToleration admission plugin (render/control_plane.py, --enable-admission-plugins),
    which adds, to every pod requesting an extended resource, a toleration of the taints keyed by that
    resource's name (kubernetes.io "Admission Control in Kubernetes", ExtendedResourceToleration:
    operators "are expected to taint the node with the extended resource name as the key"): a user's
    GPU pod tolerates a new taint only where its owner wrote the toleration, and a taint keyed
    nvidia.com/gpu is the one that plugin would make every GPU pod tolerate."""
    added = [t for t in new or [] if t not in (old or [])]
    gpus = [p for p in plan_of(diff.head).get("nodePools") or []
            if isinstance(p, Mapping) and p.get("name") == pool and int(p.get("gpusPerNode") or 0) > 0]
    if not added or not gpus:
        return ""
    keyed = [str(t) for t in added if str(t).split("=", 1)[0].split(":", 1)[0] == wellknown.GPU_RESOURCE]
    said = (f". On this GPU pool the new taint {', '.join(str(t) for t in added)} keeps every user GPU pod off its "
            "new nodes (and off the old ones once tainted by hand): the apiservers run without the "
            "ExtendedResourceToleration admission plugin, so no GPU pod tolerates it unless its owner adds the "
            "toleration by hand")
    if keyed:
        return (f"{said}. {', '.join(keyed)} is keyed by the GPU resource's own name ({wellknown.GPU_RESOURCE}), "
                "the taint ExtendedResourceToleration exists for: enabled on the apiservers (their "
                "--enable-admission-plugins, kilonode.render.control_plane; every apiserver rolls), every pod "
                f"requesting {wellknown.GPU_RESOURCE} gets the toleration at admission and CPU-only pods stay off, "
                "with no job edited; land that first, or tell the pool's users before this lands")
    return (f"{said} (ExtendedResourceToleration would not help: it tolerates only taints keyed by the resource's "
            f"name, {wellknown.GPU_RESOURCE}); say so to the pool's users before it lands")


def image_versions(diff: StackDiff) -> list[Finding]:
    """A new image version whose `pulumi up` deletes the one before it: the version resource and its
    VHD (each version has its own upload, whose delete removes the blob; a stack deployed before
    uploads were named by version replaces its one upload, whose delete runs first)."""
    created = {((c.head or {}).get("inputs") or {}).get("galleryImageName") for c in diff.resources
               if c.type == GALLERY_IMAGE_VERSION and c.action == CREATE}
    gone = [c for c in diff.resources if c.type == GALLERY_IMAGE_VERSION and c.action == DELETE
            and ((c.base or {}).get("inputs") or {}).get("galleryImageName") in created]
    if not gone:
        return _previous_removed(diff)
    vhds = [c for c in diff.resources
            if c.type == COMMAND and c.action in (REPLACE, DELETE) and c.name.endswith("-vhd")]
    versions: dict[str, list[str]] = {}
    for c in gone:
        inputs = (c.base or {}).get("inputs") or {}
        versions.setdefault(str(inputs.get("galleryImageVersionName")), []).append(str(inputs.get("galleryImageName")))
    said = "; ".join(f"{version} of {', '.join(sorted(images))}" for version, images in sorted(versions.items()))
    new = sorted({str(((c.head or {}).get("inputs") or {}).get("galleryImageVersionName")) for c in diff.resources
                  if c.type == GALLERY_IMAGE_VERSION and c.action == CREATE})
    cause = image_cause(next(iter(versions)), new[0]) if len(versions) == 1 and len(new) == 1 else ""
    return [Finding(HIGH, "rollback-target-removed", (
        f"this `pulumi up` deletes the previous image version(s) ({said}) together with their VHDs ({len(vhds)} "
        "upload commands deleted or replaced: their delete removes the blob): every node not yet upgraded to the "
        "new model still runs that version (a reimage keeps an instance's own image version), and the rollback "
        "target is gone: "
        "reverting this change would need the old image rebuilt and uploaded before any node could boot it again. "
        "Keep the previous version published until the new one has rolled out: set `previous` to the old version "
        "in the same change (nodeImage.previous, or the pool's entry in nodeImage.pools; etcdImage.previous, "
        "controlPlaneImage.previous), and remove it in a later change once every machine runs the new one"),
        tuple(sorted(c.name for c in gone)), cause=cause)]


def _previous_removed(diff: StackDiff) -> list[Finding]:
    """A kept previous version deleted with no new one published: the end of a rollout, when every
    machine runs the current version; before that, the nodes not yet rolled run the deleted one."""
    gone = [c for c in diff.resources if c.type == GALLERY_IMAGE_VERSION and c.action == DELETE]
    if not gone:
        return []
    said = ", ".join(sorted(f"{(c.base or {}).get('inputs', {}).get('galleryImageName')} "
                            f"{(c.base or {}).get('inputs', {}).get('galleryImageVersionName')}" for c in gone))
    return [Finding(MEDIUM, "previous-image-removed", (
        f"this `pulumi up` deletes the image version(s) kept as previous ({said}) and their VHDs: right once every "
        "machine runs the current version; a scale set whose rollout is not done still has instances on the "
        "deleted one (a reimage restores an instance's own image version, and a rollback has nothing to go back "
        "to). Check first: `kilonode rollout status` for each pool, or every instance at the model in `az vmss "
        "list-instances` (`kilonode upgrade --step cleanup` refuses while a pool's rollout journal is not done)"),
        tuple(sorted(c.name for c in gone)))]


def image_cause(was: str, now: str) -> str:
    """The decision a new image version is: its fleet rollout and the old version's deletion share it."""
    return f"image version {was} -> {now}"


def assess(diff: StackDiff) -> list[Finding]:
    return [*replacements(diff), *containers(diff), *etcd_shrink(diff), *etcd_growth(diff), *etcd_data(diff),
            *unrecorded(diff), *registration(diff), *teardown(diff),
            *image_versions(diff)]
