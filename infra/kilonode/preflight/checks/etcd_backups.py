"""etcd-backups: each etcd cluster's snapshots are written by its own members only, and nobody
overwrites or deletes one before its retention.

Read from the recorded graph (kilonode.azure.backup), for each etcd cluster of the plan (main,
events, leases where the stack has it), whose snapshot container is `etcd-snapshots-<role>`:

1. Its members' VMs carry one user-assigned identity, the same on every member, and nothing
   else carries it: no VM of another etcd cluster, no apiserver, no pool scale set. A member
   with no identity cannot upload; a second identity, or one shared with the other clusters, is
   a token for whatever that identity may do.
2. Every role assignment of that identity is scoped to the cluster's own container: not the
   account (every cluster's container), not the resource group or the subscription, not another
   cluster's container. Azure applies a data role to every container its scope contains.
3. Each such assignment's role is a custom role of the graph that grants no control-plane action
   and no data action but SNAPSHOT_WRITER_DATA_ACTIONS (`blobs/write`, which the snapshot
   script's Put Blob, Put Block and Put Block List need), and grants those. A built-in role is
   refused: "Storage Blob Data Contributor", the narrowest built-in role that writes, also
   deletes blobs and, through the management plane, the container.
4. The container has a time-based retention policy (BlobContainerImmutabilityPolicy): without
   it, `blobs/write` replaces an existing snapshot. A policy shorter than the lifecycle rule's
   retention (defaults.ETCD_SNAPSHOT_BLOB_RETENTION_DAYS) is a warning: the snapshots are
   mutable for the days between.
5. The account has blob and container soft delete on (BlobServiceProperties): what is deleted
   after the retention, or by someone with delete rights, stays recoverable.

What no offline check shows: role assignments made outside this program (by hand, by policy,
inherited from a management group), and a policy that someone shortened or removed in Azure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kilonode.azure.backup import SNAPSHOT_WRITER_DATA_ACTIONS, snapshot_container
from kilonode.plan import defaults
from kilonode.plan.model import EtcdClusterPlan
from kilonode.preflight.checks import identities
from kilonode.preflight.model import Finding, Inputs, Resource

NAME = "etcd-backups"
TITLE = "each etcd cluster's members write only their own snapshot container; no snapshot is overwritten or deleted"

CONTAINER = "azure-native:storage:BlobContainer"
RETENTION = "azure-native:storage:BlobContainerImmutabilityPolicy"
BLOB_SERVICE = "azure-native:storage:BlobServiceProperties"
ACCOUNT = "azure-native:storage:StorageAccount"
ROLE_DEFINITION = "azure-native:authorization:RoleDefinition"
FIX = ("give each etcd cluster's VMs only their own identity, with kilonode's write-only role on their own "
       "snapshot container (kilonode.azure.backup, kilonode.azure.cluster _etcd_clusters)")


def check(inputs: Inputs) -> list[Finding]:
    graph = identities._Graph(inputs)
    carriers = _carriers(graph)
    findings: list[Finding] = []
    accounts: list[str] = []
    for etcd in inputs.plan.etcd_clusters:
        own = snapshot_container(etcd.role)
        container = next((c for c in graph.of(CONTAINER) if c.inputs.get("containerName") == own), None)
        if container is None:
            findings.append(Finding(NAME, "break", f"etcd-{etcd.role}",
                                    f"no container {own}: the members' snapshots go nowhere", FIX))
            continue
        findings += _identity_findings(graph, etcd, container, carriers)
        findings += _retention_findings(graph, etcd, container)
        if (account := str(container.inputs.get("accountName"))) not in accounts:
            accounts.append(account)
    return findings + [f for account in accounts for f in _soft_delete_findings(graph, account)]


def _carriers(graph: identities._Graph) -> dict[str, list[str]]:
    """Identity (logical name) -> the VMs and scale sets that carry it (their Azure names)."""
    carriers: dict[str, list[str]] = {}
    for machine in [*graph.of(identities.VM), *graph.of(identities.SCALE_SET)]:
        name = str(machine.inputs.get("vmName") or machine.inputs.get("vmScaleSetName") or machine.name)
        for identity in identities._scale_set_identities(machine):
            carriers.setdefault(identity, []).append(name)
    return carriers


def _identity_findings(graph: identities._Graph, etcd: EtcdClusterPlan, container: Resource,
                       carriers: Mapping[str, list[str]]) -> list[Finding]:
    """1 and 2-3: what the members carry, and what each identity they carry may do."""
    where, members = f"etcd-{etcd.role}", {m.vm_name for m in etcd.members}
    vms = [vm for vm in graph.of(identities.VM) if vm.inputs.get("vmName") in members]
    carried = {vm.inputs.get("vmName"): identities._scale_set_identities(vm) for vm in vms}
    held = sorted({i for names in carried.values() for i in names})
    problems = [f"{vm} carries no identity: its snapshot uploads are refused" for vm, names in carried.items()
                if not names]
    if len(held) > 1:
        problems.append(f"its members carry {len(held)} identities ({', '.join(held)}), not one of their own")
    for identity in held:
        others = sorted(set(carriers.get(identity, ())) - members)
        if others:
            problems.append(f"identity {identity} is carried outside the cluster too ({', '.join(others[:3])}"
                            f"{' and more' if len(others) > 3 else ''}): those machines may write its snapshots")
    findings = [Finding(NAME, "break", where, "; ".join(problems), FIX)] if problems else []
    for identity in held:
        findings += _assignment_findings(graph, etcd, container, identity)
    return findings


def _assignment_findings(graph: identities._Graph, etcd: EtcdClusterPlan, container: Resource,
                         identity: str) -> list[Finding]:
    own = snapshot_container(etcd.role)
    assignments = [a for a in graph.of(identities.ROLE_ASSIGNMENT) if identities._principal_name(a) == identity]
    if not assignments:
        return [Finding(NAME, "break", f"etcd-{etcd.role}",
                        f"identity {identity}, which the members carry, has no role: every upload is refused "
                        "(403 AuthorizationPermissionMismatch)", FIX)]
    findings = []
    for assignment in assignments:
        scope = str(assignment.inputs.get("scope", ""))
        reached = graph.contained(scope)
        beyond = [r for r in reached if not (r.type in (CONTAINER, RETENTION) and r.inputs.get("containerName") == own
                                             and r.inputs.get("accountName") == container.inputs.get("accountName"))]
        problems = _role_problems(graph, assignment)
        if container not in reached:
            problems.insert(0, f"its scope {scope} is not the {etcd.role} cluster's container {own}")
        elif beyond:
            shown = ", ".join(r.describe() for r in beyond[:3]) + (" and more" if len(beyond) > 3 else "")
            problems.insert(0, f"its scope {scope} reaches beyond the {etcd.role} cluster's container ({shown})")
        if problems:
            findings.append(Finding(
                NAME, "break", assignment.describe(),
                f"identity {identity}, carried by the etcd {etcd.role} members: {'; '.join(problems)}", FIX))
    return findings


def _role_problems(graph: identities._Graph, assignment: Resource) -> list[str]:
    """3: the assignment's role writes blobs and does nothing more."""
    guid = str(assignment.inputs.get("roleDefinitionId", "")).rpartition("/")[2].lower()
    definition = next((d for d in graph.of(ROLE_DEFINITION)
                       if str(d.inputs.get("roleDefinitionId", "")).lower() == guid), None)
    if definition is None:
        role = identities.ROLE_NAMES.get(guid, guid)
        return [f"its role {role} is no custom role of this graph: the built-in roles that write blobs also delete "
                "them (Storage Blob Data Contributor deletes blobs, and the container itself)"]
    permissions: Sequence[Mapping[str, object]] = [p for p in definition.inputs.get("permissions") or []
                                                   if isinstance(p, Mapping)]
    actions = sorted({str(a) for p in permissions for a in _strings(p.get("actions"))})
    data = {str(a) for p in permissions for a in _strings(p.get("dataActions"))}
    problems = []
    if actions:
        problems.append(f"its role grants control-plane actions ({', '.join(actions[:3])}): a member could change or "
                        "delete the container or its retention policy")
    if extra := sorted(data - set(SNAPSHOT_WRITER_DATA_ACTIONS)):
        problems.append(f"its role grants data actions beyond writing blobs ({', '.join(extra[:3])}): a member could "
                        "read or delete snapshots")
    if missing := sorted(set(SNAPSHOT_WRITER_DATA_ACTIONS) - data):
        problems.append(f"its role lacks {', '.join(missing)}: Put Block and Put Block List are refused "
                        "(403 AuthorizationPermissionMismatch)")
    return problems


def _strings(value: object) -> list[str]:
    return [str(v) for v in value] if isinstance(value, list) else []


def _retention_findings(graph: identities._Graph, etcd: EtcdClusterPlan, container: Resource) -> list[Finding]:
    """4: the container's time-based retention policy."""
    account, own = container.inputs.get("accountName"), snapshot_container(etcd.role)
    policies = [p for p in graph.of(RETENTION)
                if p.inputs.get("containerName") == own and p.inputs.get("accountName") == account]
    days = max((int(p.inputs.get("immutabilityPeriodSinceCreationInDays") or 0) for p in policies), default=0)
    if days < 1:
        return [Finding(
            NAME, "break", container.describe(),
            f"no time-based retention policy: the {etcd.role} members' role writes blobs, so a member can overwrite "
            "any snapshot in it with one of its choosing",
            f"a BlobContainerImmutabilityPolicy of {defaults.ETCD_SNAPSHOT_BLOB_RETENTION_DAYS} days on the container "
            "(kilonode.azure.backup)")]
    if days < defaults.ETCD_SNAPSHOT_BLOB_RETENTION_DAYS:
        return [Finding(
            NAME, "warn", container.describe(),
            f"its retention policy holds snapshots {days} days, the lifecycle rule keeps them "
            f"{defaults.ETCD_SNAPSHOT_BLOB_RETENTION_DAYS}: the older ones can be overwritten or deleted",
            f"immutabilityPeriodSinceCreationInDays: {defaults.ETCD_SNAPSHOT_BLOB_RETENTION_DAYS}")]
    return []


def _soft_delete_findings(graph: identities._Graph, account: str) -> list[Finding]:
    """5: the snapshot account's blob and container soft delete."""
    services = [s for s in graph.of(BLOB_SERVICE) if s.inputs.get("accountName") == account]
    findings = []
    for policy, what in (("deleteRetentionPolicy", "blob"), ("containerDeleteRetentionPolicy", "container")):
        if not any(isinstance(s.inputs.get(policy), Mapping) and s.inputs[policy].get("enabled") is True
                   for s in services):
            findings.append(Finding(
                NAME, "break", f"{ACCOUNT} {account}",
                f"{what} soft delete is off: a snapshot or container deleted after its retention, or by anyone with "
                "delete rights, is gone at once",
                f"BlobServiceProperties {policy}: enabled, {defaults.ETCD_SNAPSHOT_SOFT_DELETE_DAYS} days "
                "(kilonode.azure.backup)"))
    return findings
