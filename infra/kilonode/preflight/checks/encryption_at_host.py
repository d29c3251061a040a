"""encryption-at-host: every VM and scale set the program creates encrypts at host where it can.

Encryption at host encrypts a VM's temp disk (the etcd data, the runtime root, the audit log
live there) and the host's cache of its managed disks, with platform-managed keys. The plan turns
it on for every size the catalogue does not say lacks it (ClusterPlan.encryption_at_host): an
unsupported size then fails at creation, loudly, where leaving it off would leave disks
unencrypted silently. Read from the recorded graph:

- break: a VM or scale set without `securityProfile.encryptionAtHost: true` on a size the
  catalogue does not say lacks it (one the program should have encrypted);
- warn, once per role: its size's support is unknown (no first-party page states it; the
  Resource SKUs capability EncryptionAtHostSupported does), with how to confirm it, and that
  the subscription needs the feature Microsoft.Compute/EncryptionAtHost registered, once
  ("Use the Azure CLI to enable end-to-end encryption using encryption at host", Prerequisites).
"""

from __future__ import annotations

from typing import Any

from kilonode.paths import shown_vm_sizes
from kilonode.preflight.model import Finding, Inputs, Resource

NAME = "encryption-at-host"
TITLE = "every VM and scale set encrypts its disks at host where its size supports it"

VM = "azure-native:compute:VirtualMachine"
VMSS = "azure-native:compute:VirtualMachineScaleSet"
ROLE_TAG = "kilonode-role"
REGISTER = "az feature register --namespace Microsoft.Compute --name EncryptionAtHost"


def _size_and_profile(resource: Resource) -> tuple[str, dict[str, Any]]:
    """The machine's VM size and its securityProfile (a scale set's: its VM profile's)."""
    if resource.type == VMSS:
        profile = resource.inputs.get("virtualMachineProfile") or {}
        return str((resource.inputs.get("sku") or {}).get("name", "")), profile.get("securityProfile") or {}
    size = str((resource.inputs.get("hardwareProfile") or {}).get("vmSize", ""))
    return size, resource.inputs.get("securityProfile") or {}


def check(inputs: Inputs) -> list[Finding]:
    findings: list[Finding] = []
    unknown: dict[str, str] = {}  # role -> its size, first seen
    for resource in [*inputs.of_type(VM), *inputs.of_type(VMSS)]:
        size, security = _size_and_profile(resource)
        facts = inputs.plan.vm_sizes.get(size)
        supported = facts.encryption_at_host if facts is not None else None
        role = str((resource.inputs.get("tags") or {}).get(ROLE_TAG, resource.name))
        if supported is None:
            unknown.setdefault(role, size)
        if security.get("encryptionAtHost") is not True and supported is not False:
            said = "the catalogue says it supports it" if supported else "the catalogue does not say it lacks it"
            findings.append(Finding(
                NAME, "break", resource.describe(),
                f"{size} gets no securityProfile.encryptionAtHost although {said}: its temp disk (etcd data, the "
                "runtime root, the audit log) and its disks' host cache would be stored unencrypted",
                "set securityProfile.encryptionAtHost: true (kilonode.azure.common.security_profile, from "
                "ClusterPlan.encryption_at_host); only a catalogue entry encryptionAtHost: false, with its "
                "source, may leave it off",
            ))
    for role, size in unknown.items():
        findings.append(Finding(
            NAME, "warn", role,
            f"{size}: no first-party page says whether it supports encryption at host, so the plan enables it; "
            "Azure refuses to create the machines if the size lacks it, and refuses every size until the "
            "subscription has the feature Microsoft.Compute/EncryptionAtHost registered",
            f"once per subscription: `{REGISTER}` (then `az feature show` until Registered); confirm the size with "
            f"`az vm list-skus --location {inputs.plan.location} --size {size} --all --query "
            "\"[].capabilities[?name=='EncryptionAtHostSupported']\"` and record the answer, with its source, as "
            f"encryptionAtHost in {shown_vm_sizes()}",
        ))
    return findings
