"""The restart guard: one `pulumi up` never restarts or replaces a majority of an etcd
cluster's members, or every apiserver, unless the stack acknowledges it.

Pulumi updates independent resources in parallel, and `protect` stops only deletes: a new
`vmSize` on every etcd member is an in-place update that Azure applies by restarting each
VM, all at once, and a cluster that loses a majority loses quorum (etcd's failure
tolerance for n members is (n-1)/2). So the program records, per control-plane machine,
what Azure would apply by restarting or replacing it (its *restart key*: size, zone, image,
and a digest of its custom data), exports it as a stack output, and on the next run reads
the last deployed value back through a StackReference to its own stack (a pattern Pulumi's
maintainers give in pulumi/pulumi#3722). A change is refused when the machines whose key
changed would be a majority of one etcd cluster, or every apiserver, naming them. A
certificate renewal goes through the same rule: a host's new certificateGenerations entry changes
that host's custom data alone (kilonode.azure.tls), one machine, which passes.

An acknowledged group passes whatever moves in it: the acknowledgement is for rolling it one
machine per `pulumi up --target`, and the program cannot hold a run to that, because it cannot
see whether a run is targeted. The targets are the engine's: the language host's RunRequest
carries the project, stack, config and dry-run flag but no target list (pulumi's
language.proto; the Python SDK 3.272's `RunRequest` fields), and a targeted run computes every
machine's restart key as a full run does. So a plain `pulumi up` while a group is acknowledged
replaces every machine of it whose key changed, at once. What the program can do, it does: it
warns, naming the machines, whenever an acknowledged group has more than one machine to move
(`acknowledged`); `kilonode diff` says the same.

Everything here is pure: previous and current keys in, problems out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kilonode.digest import sha256_text

# The stack output holding the restart keys: {group: {machine: {field: value}}}.
RESTART_KEYS_OUTPUT = "controlPlaneRestartKeys"

# Groups, as the stack's `acknowledgeRestart` names them: one per etcd cluster, and the apiservers.
ETCD_MAIN, ETCD_EVENTS, ETCD_LEASES, APISERVERS = "etcd-main", "etcd-events", "etcd-leases", "apiservers"


def etcd_group(role: str) -> str:
    """The group of one etcd cluster's members (role main -> etcd-main)."""
    return f"etcd-{role}"


@dataclass(frozen=True)
class Disruption:
    group: str
    machines: tuple[str, ...]  # whose restart key changed
    members: int  # how many the group has now
    why: str  # what rule it breaks

    def message(self) -> str:
        return (
            f"this update would restart or replace {len(self.machines)} of {self.members} {self.group} machines "
            f"at once ({', '.join(self.machines)}): {self.why}. Roll them one at a time: add {self.group!r} to "
            f"acknowledgeRestart in the stack file, then {ROLL_STEP}, one plain `pulumi up` to record the new "
            "state, then remove the acknowledgement (docs/azure.md: \"Rolling the control plane\"). Renewing "
            "certificates? Raise one host's certificateGenerations entry per update instead "
            "(docs/runbooks/certificate-renewal.md)"
        )


# The step the roll repeats, as the restart guard, the review (kilonode.review.lifecycle) and
# docs/azure.md ("Rolling the control plane") all say it. The VMs are delete-before-replace
# (kilonode.azure.vm.machine): their Azure names are fixed.
ROLL_STEP = (
    "`pulumi up --target <one machine's VM urn>` per run (`pulumi stack --show-urns` lists them; a "
    "replacement deletes that VM first and creates it anew under its name, at its NIC, which keeps its IP "
    "and load-balancer pool; an etcd member is `pulumi state unprotect`ed first, and its new VM rejoins "
    "etcd by itself: docs/runbooks/etcd-member-lost-its-disk.md), waiting until it is healthy before the next: "
    "an apiserver's /readyz asked as the load balancer asks it, without credentials (`curl -k "
    "https://<its IP>:6443/readyz` answers 200; with credentials it may pass where the probe gets 401) and back "
    "in the load balancer's pool (its health-probe status), an etcd member's `etcdctl endpoint health --cluster`"
)

# What acknowledgeRestart cannot enforce, said wherever it is given (rollout's warning, the review).
TARGET_LIMIT = (
    "the program cannot tell a targeted run from a plain one (targets never reach it), so while the "
    "acknowledgement is there a plain `pulumi up` replaces every one of them at once: run only targeted "
    "updates until the last machine is done"
)


@dataclass(frozen=True)
class Acknowledged:
    """An acknowledged group with more than one machine to move: passed, and warned about."""

    group: str
    machines: tuple[str, ...]
    members: int

    def message(self) -> str:
        return (
            f"acknowledgeRestart lists {self.group}: {len(self.machines)} of its {self.members} machines differ from "
            f"the last full run ({', '.join(self.machines)}). Roll them with {ROLL_STEP}; {TARGET_LIMIT} "
            "(docs/azure.md: \"Rolling the control plane\")"
        )


def digest(text: str) -> str:
    """What the restart key holds of a custom data: its digest, never the value."""
    return "sha256:" + sha256_text(text)


def restart_key(vm_size: str, zone: str, image: str, custom_data_digest: str) -> dict[str, str]:
    return {"vmSize": vm_size, "zone": zone, "image": image, "customDataDigest": custom_data_digest}


def changed(previous: Mapping[str, Any], current: Mapping[str, Mapping[str, str]]) -> list[str]:
    """Machines of one group whose restart key differs from the last deployment's (a machine
    the last deployment did not have is new, not restarted)."""
    return sorted(name for name, key in current.items() if name in previous and dict(previous[name]) != dict(key))


def disruptions(previous: Mapping[str, Any] | None, current: Mapping[str, Mapping[str, Mapping[str, str]]],
                acknowledged: frozenset[str] = frozenset()) -> list[Disruption]:
    """What one update would disrupt beyond the rules (none on a first deployment)."""
    if not previous:
        return []
    found: list[Disruption] = []
    for group, machines in current.items():
        moved = changed(previous.get(group) or {}, machines)
        if group in acknowledged or not moved:
            continue
        n = len(machines)
        if group == APISERVERS:
            if len(moved) == n:
                found.append(Disruption(group, tuple(moved), n, "no apiserver would be left to serve"))
        elif len(moved) > (n - 1) // 2:
            found.append(Disruption(
                group, tuple(moved), n,
                f"etcd with {n} members tolerates {(n - 1) // 2} down; {len(moved)} down at once loses quorum",
            ))
    return found


def acknowledged(previous: Mapping[str, Any] | None, current: Mapping[str, Mapping[str, Mapping[str, str]]],
                 groups: frozenset[str]) -> list[Acknowledged]:
    """The acknowledged groups this run would move more than one machine of, were it not targeted:
    what the restart guard lets through unchecked (see the module's docstring), to be warned of."""
    if not previous:
        return []
    found = []
    for group, machines in current.items():
        moved = changed(previous.get(group) or {}, machines)
        if group in groups and len(moved) > 1:
            found.append(Acknowledged(group, tuple(moved), len(machines)))
    return found
