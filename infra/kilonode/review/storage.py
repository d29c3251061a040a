"""StorageClasses and the claims that name them (the seventeenth independent trace of kilonode diff
on research-7500: the Prometheus class's skuName Premium_LRS -> PremiumV2_LRS and its reclaimPolicy
Retain -> Delete both read "update ... no risk": effects.toml had no StorageClass rows).

What a StorageClass change does is in effects.toml (parameters and provisioner replace it,
pulumi-kubernetes diff.go's forceNew table; reclaimPolicy and volumeBindingMode the apiserver
refuses, ValidateStorageClassUpdate; risks.refused says those). This module says who the class
serves, so that a line about it names the claims:

- `claims(entry, class)`: every claim of the side's recorded StatefulSets whose volumeClaimTemplates
  name the class (storageClassName), with the claim names the StatefulSet controller gives them
  (<template>-<set>-<ordinal>: kubernetes pkg/controller/statefulset/stateful_set_utils.go
  getPersistentVolumeClaimName, read in the search index's copy, not at the cluster's tag);
- `storageclass-replaced` (medium): a class replaced (deleted, then created under the same name:
  pulumi-kubernetes provider.go deleteBeforeReplace for a fixed name). A PersistentVolume keeps
  the parameters it was provisioned with (its own spec.csi.volumeAttributes and reclaim policy), so
  the bound claims are unaffected; a claim created later (a new replica, a claim deleted and
  recreated, a new cluster of this stack) is provisioned by the new class, and one created while
  it is absent waits Pending (WaitForFirstConsumer or not, the PV controller needs the class:
  kubernetes pkg/controller/volume/persistentvolume/pv_controller.go provisionClaimOperation,
  read in the search index's copy).

Pure: a StackDiff in, findings out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kilonode.review.compare import REPLACE, StackDiff
from kilonode.review.finding import MEDIUM, Finding

STORAGE_CLASS = "kubernetes:storage.k8s.io/v1:StorageClass"
STATEFULSET = "kubernetes:apps/v1:StatefulSet"


def claims(entry: Mapping[str, Any] | None, class_name: str) -> list[str]:
    """'namespace/name' of each claim the side's StatefulSets make of the class."""
    found = []
    for record in (entry or {}).get("resources") or []:
        if not isinstance(record, Mapping) or record.get("type") != STATEFULSET:
            continue
        inputs = record.get("inputs") or {}
        meta = inputs.get("metadata") or {}
        spec = inputs.get("spec") or {}
        namespace, name = str(meta.get("namespace") or "default"), str(meta.get("name") or "")
        replicas = spec.get("replicas")
        count = replicas if isinstance(replicas, int) else 1  # apps/v1 defaults replicas to 1
        for template in spec.get("volumeClaimTemplates") or []:
            if (template.get("spec") or {}).get("storageClassName") != class_name:
                continue
            claim = str((template.get("metadata") or {}).get("name") or "")
            found += [f"{namespace}/{claim}-{name}-{ordinal}" for ordinal in range(count)]
    return found


def claims_said(entry: Mapping[str, Any] | None, class_name: str) -> str:
    """The claims of a class, as a line says them ('' for none)."""
    return ", ".join(claims(entry, class_name))


def _name(record: Mapping[str, Any] | None) -> str:
    return str((((record or {}).get("inputs") or {}).get("metadata") or {}).get("name") or "")


def replaced(diff: StackDiff) -> list[Finding]:
    """`storageclass-replaced`: one line per StorageClass the change replaces."""
    found = []
    for c in diff.resources:
        if c.type != STORAGE_CLASS or c.action != REPLACE:
            continue
        name = _name(c.head) or _name(c.base)
        said = claims_said(diff.head, name) or claims_said(diff.base, name)
        found.append(Finding(MEDIUM, "storageclass-replaced", (
            f"StorageClass {name} is replaced ({c.reason() or 'a forceNew input'}: the apiserver forbids changing "
            "parameters or provisioner in place, so Pulumi deletes it and creates it again under the same name). "
            "The claims already bound keep their disks as provisioned (a PersistentVolume carries its own volume "
            "attributes and reclaim policy); every claim created after it is provisioned by the new class, and one "
            "created while it is absent waits Pending. Its claims: "
            + (f"{said}: bound now, so untouched until one is deleted or the stack is built anew, when the new "
               "parameters decide whether it provisions at all" if said else "none of the stack's own")
            + " (pulumi/pulumi-kubernetes@00302beb58ae08591f0c8b0b065871c50ba35250 provider/pkg/provider/diff.go, "
            "forceNew storage.k8s.io v1 StorageClass; kubernetes pkg/apis/storage/validation/validation.go "
            "ValidateStorageClassUpdate)"), (c.name,)))
    return found


def assess(diff: StackDiff) -> list[Finding]:
    if diff.head is None:
        return []
    return replaced(diff)
