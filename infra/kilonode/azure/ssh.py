"""Each machine role's SSH keys: the operators' own from the stack file, else one of its own.

Roles: each etcd cluster (etcd-main, etcd-events, etcd-leases where the stack has it), apiservers
and each pool (by name); no two roles share a key, so
a key that leaks from one role's machines opens no other role's. A role the stack gives keys to
(`sshKeys`, kilonode.config.values.SshPublicKey) gets exactly those: their private halves are
the operators' and never pass through kilonode. A role it does not name still needs one: with
`disablePasswordAuthentication: true` (kilonode never sets a password) the compute API's
OSProfile takes the SSH configuration as the only way in, and Azure refuses such a Linux VM
without a key (the API's validation; not exercised against Azure here: no credentials).
That role gets
a generated RSA key (RSA: every Azure Linux image and API version takes it) whose private half is
exported by nothing: no stack output, no file, no custom data. It stays only in the Pulumi state,
encrypted as a secret, where nothing of the program reads it. docs/operations.md says how an
operator gets a shell without it.

A generated key's resource is named after its role only: a stack change that does not concern a
role leaves its key, and so its machines, as they are. Azure sets a VM's keys when it creates it
(effects.toml: ssh.publicKeys is refused on an existing VM): a new key reaches a VM only through
a new VM, and a scale set's instances only as they are created or reimaged.
"""

from __future__ import annotations

import pulumi
import pulumi_tls as tls

from kilonode.plan.model import ClusterPlan

APISERVERS = "apiservers"


def etcd_role(role: str) -> str:
    """The SSH role of one etcd cluster's members (`etcd-main`), as the stack's sshKeys names it."""
    return f"etcd-{role}"


def roles(plan: ClusterPlan) -> list[str]:
    """Every role that takes its own keys, control plane first, pools in the plan's order."""
    return [*(etcd_role(c.role) for c in plan.etcd_clusters), APISERVERS, *(pool.name for pool in plan.node_pools)]


class SshKeys(pulumi.ComponentResource):
    """`keys`: role -> the public keys its machines authorize, the stack's or a generated one."""

    keys: dict[str, list[pulumi.Input[str]]]

    def __init__(self, name: str, plan: ClusterPlan, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("kilonode:azure:SshKeys", name, None, opts)
        self.keys = {}
        for role in roles(plan):
            given = plan.ssh_keys.get(role)
            if given:
                self.keys[role] = list(given)
                continue
            # the public half only leaves this component; nothing reads private_key_openssh
            key = tls.PrivateKey(f"{name}-{role}", algorithm="RSA", rsa_bits=4096,
                                 opts=pulumi.ResourceOptions(parent=self))
            self.keys[role] = [key.public_key_openssh]
        self.register_outputs({"publicKeys": self.keys})
