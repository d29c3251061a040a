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
            "acknowledgeRestart in the stack file, `pulumi up --target` one machine's VM at a time (waiting for "
            "it to be healthy), one plain `pulumi up` to record the new state, then remove the acknowledgement "
            "(docs/azure.md: \"Rolling the control plane\"). Renewing certificates? Raise one host's "
            "certificateGenerations entry per update instead (docs/runbooks/certificate-renewal.md)"
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
