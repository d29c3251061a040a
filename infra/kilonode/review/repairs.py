"""vmss-repairs-refused and vmss-repairs-replace: a scale set's automatic instance repairs turned on.

From the eighteenth independent trace on research-7500 (PR 13): `automaticRepairsPolicy: {enabled: true,
gracePeriod: PT30M}` on every GPU scale set read as 79 plain updates. Microsoft Learn, "Automatic instance repairs
for Azure Virtual Machine Scale Sets" (learn.microsoft.com/azure/virtual-machine-scale-sets/
virtual-machine-scale-sets-automatic-instance-repairs), "Requirements for using automatic instance repairs": the
scale set must have application health monitoring, the Application Health extension or a load balancer health
probe (one of them). Without one ARM refuses the scale set's PUT: "Automatic repairs not supported for this Virtual
Machine Scale Set because a health probe or health extension was not provided" (the error as reported in
hashicorp/terraform-provider-azurerm#5860), so the update fails, and every other change of the same model with it.
With one, a repair's action is Replace unless repairAction says otherwise (the same page, "Repair actions"; the
REST model's automaticRepairsPolicy.repairAction, Replace the default): the unhealthy instance is deleted and a new
one created, with no cordon and no drain, so its pods are killed where they run.

Judged on each side's recorded scale set inputs: the health extension is an extension of type
ApplicationHealthLinux or ApplicationHealthWindows in virtualMachineProfile.extensionProfile; the probe
virtualMachineProfile.networkProfile.healthProbe.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kilonode.review.compare import DELETE, StackDiff
from kilonode.review.finding import HIGH, MEDIUM, Finding

VMSS = "azure-native:compute:VirtualMachineScaleSet"
HEALTH_EXTENSIONS = frozenset({"ApplicationHealthLinux", "ApplicationHealthWindows"})
LEARN = ("Microsoft Learn, \"Automatic instance repairs for Azure Virtual Machine Scale Sets\"")


def _enabled(inputs: Mapping[str, Any] | None) -> bool:
    policy = (inputs or {}).get("automaticRepairsPolicy") or {}
    return str(policy.get("enabled")).lower() == "true"


def health_signal(inputs: Mapping[str, Any] | None) -> str | None:
    """The scale set's health signal, said; None where it has neither."""
    profile = (inputs or {}).get("virtualMachineProfile") or {}
    for extension in ((profile.get("extensionProfile") or {}).get("extensions") or []):
        kind = str(extension.get("type") or (extension.get("properties") or {}).get("type")
                   or extension.get("typePropertiesType") or "")
        if kind in HEALTH_EXTENSIONS:
            return f"the {kind} extension"
    probe = ((profile.get("networkProfile") or {}).get("healthProbe") or {}).get("id")
    return "a load balancer health probe" if probe else None


def _pool(record: Mapping[str, Any]) -> str:
    tags = ((record.get("inputs") or {}).get("tags") or {})
    role = str(tags.get("kilonode-role") or record.get("name") or "")
    return role.split(".", 1)[0].removeprefix("pool-")


def assess(diff: StackDiff) -> list[Finding]:
    refused: dict[str, list[int]] = {}
    replaced: dict[str, list[int]] = {}
    signals: set[str] = set()
    grace: set[str] = set()
    gpu: set[str] = set()
    for c in diff.resources:
        if c.type != VMSS or c.action == DELETE or c.head is None:
            continue
        inputs = c.head.get("inputs") or {}
        if not _enabled(inputs) or _enabled((c.base or {}).get("inputs")):
            continue
        pool = _pool(c.head)
        capacity = ((inputs.get("sku") or {}).get("capacity"))
        size = int(capacity) if isinstance(capacity, int) else 0
        if str((inputs.get("sku") or {}).get("name") or "").startswith("Standard_N"):
            gpu.add(pool)
        signal = health_signal(inputs)
        policy = inputs.get("automaticRepairsPolicy") or {}
        if signal is None:
            refused.setdefault(pool, []).append(size)
        elif str(policy.get("repairAction") or "Replace") == "Replace":
            replaced.setdefault(pool, []).append(size)
            signals.add(signal)
            grace.add(str(policy.get("gracePeriod") or "PT10M (the default)"))
    found = []
    if refused:
        found.append(Finding(HIGH, "vmss-repairs-refused", (
            f"automaticRepairsPolicy.enabled turns on for {_said(refused)} with no health signal (no "
            "ApplicationHealthLinux/Windows extension, no load balancer health probe): ARM refuses the scale set's "
            "update (\"Automatic repairs not supported for this Virtual Machine Scale Set because a health probe or "
            f"health extension was not provided\"; {LEARN}, Requirements: application health monitoring is "
            "required), so every update of these scale sets fails, and `pulumi up` stops at the first, with any "
            "other change of their model (an image, a size, custom data) not applied. Add the Application Health "
            "extension (or a probe) in an earlier change, or leave the policy off"),
            tuple(sorted(refused)), cause="VMSS automatic repairs without a health signal"))
    if replaced:
        on_gpu = sorted(set(replaced) & gpu)
        found.append(Finding(HIGH if on_gpu else MEDIUM, "vmss-repairs-replace", (
            f"automatic instance repairs turn on for {_said(replaced)}, on {', '.join(sorted(signals))}, with the "
            f"repair action Replace (the default; grace period {', '.join(sorted(grace))}): an instance the signal "
            "reports Unhealthy past the grace period is deleted and a new one created by the scale set itself, "
            "with no cordon and no drain, so the pods on it are killed where they run"
            + (f" (GPU VMs of {', '.join(on_gpu)}: a multi-node job on one of them aborts, and the new VM boots "
               "and joins from scratch)" if on_gpu else "") + f" ({LEARN}, \"Repair actions\"). Set repairAction "
            "Restart or Reimage, or leave repairs off and drain (`kubectl drain`) a node found unhealthy before "
            "replacing it"),
            tuple(sorted(replaced)), cause="VMSS automatic repairs replace"))
    return found


def _said(pools: Mapping[str, list[int]]) -> str:
    return ", ".join(f"{pool} ({len(sizes)} scale set(s), {sum(sizes):,} VM(s))"
                     for pool, sizes in sorted(pools.items()))
