"""What really happens to machines, data and nodes under a change, told as `pulumi up` and Azure
would tell it:

- a replaced resource that is protected, or whose Azure name is fixed, stops `pulumi up`: Pulumi
  replaces create-before-delete unless told otherwise, the replacement would carry the same
  Azure name as the resource still there, and pulumi-azure-native does not create over an
  existing resource; a protected one is never deleted by `pulumi up` at all;
- the resource group or the VNet replaced: everything inside goes with it;
- an etcd member replaced or resized loses the data on its local SSD (Azure's temporary disk
  does not survive a resize or a redeploy: managed-disks-overview.md, "Temporary disk");
- a pool subnet the stack has not recorded yet (`network.unrecorded`);
- labels and taints a node registered with stay until the node is reimaged: the kubelet
  applies --node-labels and --register-with-taints only when it registers the Node, and the
  scale sets' upgrade policy is Manual.

Pure: a StackDiff (kilonode.review.compare) in, findings out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml

from kilonode.review.compare import CREATE, DELETE, REPLACE, ResourceChange, StackDiff
from kilonode.review.finding import HIGH, MEDIUM, Finding
from kilonode.review.rules import ETCD_GROUPS, VM, VMSS

RESOURCE_GROUP = "azure-native:resources:ResourceGroup"
VNET = "azure-native:network:VirtualNetwork"
# The input that is a resource's Azure name, per type, where the program fixes it.
FIXED_NAMES = {VM: "vmName", VMSS: "vmScaleSetName"}
MEMBER_RUNBOOK = "docs/runbooks/etcd-member-lost-its-disk.md"
RESTORE_RUNBOOK = "docs/runbooks/etcd-restore-from-snapshot.md"


# libyaml's loader where PyYAML was built with it (Debian's and PyPI's wheels are): research-7500's
# plan.yaml parses in a tenth of the pure-Python loader's time, and a review parses it per rule.
_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_yaml(text: str) -> Any:
    """A recorded YAML file (plan.yaml, a rendered config), as safe_load reads it."""
    return yaml.load(text, Loader=_LOADER)  # a safe loader, C or Python


def plan_of(entry: Mapping[str, Any] | None) -> dict[str, Any]:
    text = (entry or {}).get("files", {}).get("plan.yaml")
    return (load_yaml(text) or {}) if text else {}


def _recorded(change: ResourceChange) -> Mapping[str, Any]:
    return change.base or change.head or {}


def _short(name: str, stack: str) -> str:
    return name.removeprefix(f"{stack}-")


def replacements(diff: StackDiff) -> list[Finding]:
    """Replaced resources `pulumi up` cannot replace as planned: one finding per kind of stop."""
    groups: dict[tuple[str, str], list[str]] = {}
    for c in diff.resources:
        if c.action != REPLACE:
            continue
        why = c.reason() or "an input that forces a new resource"
        record = _recorded(c)
        name_input = FIXED_NAMES.get(c.type)
        fixed = name_input is not None and bool((record.get("inputs") or {}).get(name_input))
        if c.protect[0]:
            groups.setdefault(("protected", why), []).append(c.name)
        elif fixed and not record.get("deleteBeforeReplace"):
            groups.setdefault(("fixed-name", why), []).append(c.name)
    found = []
    for (kind, why), names in sorted(groups.items()):
        short = ", ".join(_short(n, diff.stack) for n in names)
        if kind == "protected":
            found.append(Finding(HIGH, "replace-stops", (
                f"`pulumi up` stops at {short}: replacing it ({why}) means deleting it, and it is protected "
                "(etcd's data). Do one member at a time instead: `pulumi state unprotect` that member, "
                f"`pulumi up --target` it, let it rejoin ({MEMBER_RUNBOOK}), protect it again, then the next"),
                tuple(names)))
        else:
            found.append(Finding(HIGH, "replace-stops", (
                f"`pulumi up` stops at {short}: it is replaced ({why}), Pulumi creates the replacement before "
                "deleting the old one, and the replacement has the same fixed Azure name, which "
                "pulumi-azure-native will not create over the machine still there. Do one machine at a time "
                "with `pulumi up --target <urn> --replace` after deleting it, or roll it by its runbook"),
                tuple(names)))
    return found


def containers(diff: StackDiff) -> list[Finding]:
    """The resource group or the VNet replaced or deleted: everything inside goes with it."""
    found = []
    for c in diff.resources:
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
            "work"), (c.name,)))
    return found


def etcd_data(diff: StackDiff) -> list[Finding]:
    """etcd members replaced or resized: their data on the local SSD is gone."""
    groups: dict[str, list[str]] = {}
    members: dict[str, int] = {}
    for r in (diff.base or {}).get("resources", []):
        role = ((r.get("inputs") or {}).get("tags") or {}).get("kilonode-role")
        if r.get("type") == VM and role in ETCD_GROUPS:
            members[role] = members.get(role, 0) + 1
    for c in diff.resources:
        if c.type != VM or c.role not in ETCD_GROUPS or c.action == CREATE:
            continue
        resized = any(i.path == "hardwareProfile.vmSize" and not i.ignored for i in c.inputs)
        if c.action in (REPLACE, DELETE) or resized:
            groups.setdefault(str(c.role), []).append(c.name)
    found = []
    for role, names in sorted(groups.items()):
        total = members.get(role, len(names))
        every = len(names) >= total
        tail = (f"with all {total} members at once nothing keeps the data: the cluster must be restored from "
                f"its latest snapshot ({RESTORE_RUNBOOK}), losing what was written since"
                if every else
                f"each comes back empty and must rejoin as a new member while the other {total - len(names)} "
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


def _shards(plan: Mapping[str, Any]) -> dict[str, tuple[str, Any, Any]]:
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
    before, after = _shards(plan_of(diff.base)), _shards(plan_of(diff.head))
    groups: dict[str, list[str]] = {}
    for name, (pool, marks, team) in after.items():
        if name not in before:
            continue
        _, old_marks, old_team = before[name]
        if old_team != team:
            key = f"pool {pool}: team {old_team or '(shared)'} -> {team or '(shared)'}"
        elif old_marks != marks:
            key = f"pool {pool}: labels or taints"
        else:
            continue
        groups.setdefault(key, []).append(name)
    return [Finding(MEDIUM, "labels-until-reimaged", (
        f"{what} change for {len(names)} scale set(s): the kubelet sets labels and taints only when it registers "
        "the Node, and the scale sets' upgrade policy is Manual, so the nodes there now keep the old ones (and "
        "take the old team's work) until each is reimaged; new nodes get the new ones. Reimage them, or "
        "relabel/taint the Nodes with kubectl meanwhile"), tuple(names))
        for what, names in sorted(groups.items())]


def assess(diff: StackDiff) -> list[Finding]:
    return [*replacements(diff), *containers(diff), *etcd_data(diff), *unrecorded(diff), *registration(diff)]
