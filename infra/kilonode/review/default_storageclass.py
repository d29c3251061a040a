"""The cluster's default StorageClass (the twentieth independent trace of kilonode diff on
research-7500: a PR annotating kilonode-premium-ssd-retain with
storageclass.kubernetes.io/is-default-class: "true" read "No risk found", an in-place annotation
update).

What the default does (kubernetes, read in the search index's copies, not at the cluster's tag):

- a new PersistentVolumeClaim with no storageClassName is given the default class by the
  DefaultStorageClass admission plugin, on by default
  (plugin/pkg/admission/storage/storageclass/setdefault/admission.go Admit);
- an existing unbound claim with no storageClassName is given it too, by the PV controller's sync
  (pkg/controller/volume/persistentvolume/pv_controller.go syncUnboundClaim ->
  assignDefaultStorageClass; the RetroactiveDefaultStorageClass feature, GA in 1.28, its gate since
  removed: the copy read calls it unconditionally);
- with several classes marked default, the newest created wins (pkg/volume/util/storageclass.go
  GetDefaultClass: sorted by creationTimestamp, newest first, then by name), what both paths use
  since 1.26 (KEP-3333; the index's older admission.go copies still refused every claim then).
  A class the change creates is the newest.

Where the claim can then go: kilonode's Azure Disk CSI node plugin runs only on
node_plugin_pools (kilonode.k8s.storage; kilonode.plan.resolve.components runs_disk_plugin: not the
GPU pools). With volumeBindingMode WaitForFirstConsumer (kilonode's class) the external-provisioner
provisions for the node the scheduler chose and needs that node's CSINode topology keys; a node
with no node plugin has none, so provisioning fails "no topology key found on CSINode <node>"
(kubernetes-csi/external-provisioner v6.3.0, the catalogue's csi-provisioner tag,
pkg/controller/topology.go GenerateAccessibilityRequirements l.388) and the pod waits Pending. With
Immediate binding the disk is made, but no node plugin there mounts it and the controller's identity
may attach only on the plugin pools' scale sets (kilonode.azure.identity DISK_CSI_ATTACH_ACTIONS).

`default-storageclass-changed`: high where a class the head marks default is served by a node
plugin that does not run on every pool that runs users' pods (the pools neither system nor
monitoring); medium otherwise (a default moved between classes that work everywhere, or the only
default removed).

Pure: a StackDiff in, findings out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kilonode.review import lifecycle
from kilonode.review.compare import CREATE, StackDiff
from kilonode.review.finding import HIGH, MEDIUM, Finding
from kilonode.review.storage import STORAGE_CLASS

RULE = "default-storageclass-changed"
DAEMONSET = "kubernetes:apps/v1:DaemonSet"
# pkg/apis/storage/util/helpers.go IsDefaultAnnotation: either annotation, the value "true"
DEFAULT_ANNOTATIONS = ("storageclass.kubernetes.io/is-default-class",
                       "storageclass.beta.kubernetes.io/is-default-class")
POOL_LABEL = "kilonode.io/pool"  # kilonode.k8s.pods on_pools
DISK_DRIVER = "disk.csi.azure.com"  # kilonode.k8s.storage DRIVER
CITE = ("kubernetes plugin/pkg/admission/storage/storageclass/setdefault/admission.go Admit; "
        "pkg/controller/volume/persistentvolume/pv_controller.go assignDefaultStorageClass, GA in 1.28; "
        "pkg/volume/util/storageclass.go GetDefaultClass")


def _classes(entry: Mapping[str, Any] | None) -> dict[str, Mapping[str, Any]]:
    """metadata.name -> inputs of each StorageClass the side records."""
    found: dict[str, Mapping[str, Any]] = {}
    for record in (entry or {}).get("resources") or []:
        if isinstance(record, Mapping) and record.get("type") == STORAGE_CLASS:
            inputs = record.get("inputs") or {}
            name = str((inputs.get("metadata") or {}).get("name") or "")
            if name:
                found[name] = inputs
    return found


def _is_default(inputs: Mapping[str, Any]) -> bool:
    annotations = (inputs.get("metadata") or {}).get("annotations") or {}
    return any(str(annotations.get(key, "")) == "true" for key in DEFAULT_ANNOTATIONS)


def defaults(entry: Mapping[str, Any] | None) -> list[str]:
    """The side's classes marked default, by name."""
    return sorted(name for name, inputs in _classes(entry).items() if _is_default(inputs))


def _pools(plan: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [p for p in plan.get("nodePools") or [] if isinstance(p, Mapping) and p.get("name")]


def _user_pools(plan: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The pools that run users' pods: neither system (CriticalAddonsOnly) nor monitoring (dedicated)."""
    return [p for p in _pools(plan) if not p.get("system") and not p.get("monitoring")]


def _registers(spec: Mapping[str, Any], driver: str) -> bool:
    """Whether a pod registers `driver` with the kubelet: its registration socket lies under
    /var/lib/kubelet/plugins/<driver>/ (node-driver-registrar's DRIVER_REG_SOCK_PATH, kilonode.k8s.storage)."""
    marker = f"/plugins/{driver}/"
    for container in spec.get("containers") or []:
        said = [str(e.get("value") or "") for e in container.get("env") or []]
        said += [str(a) for a in container.get("args") or []]
        if any(marker in s for s in said):
            return True
    return False


def _tolerates(tolerations: list[Mapping[str, Any]], taint: str) -> bool:
    """A taint "key=value:Effect" against the pod's tolerations (core/v1 Toleration.ToleratesTaint)."""
    head, _, effect = taint.partition(":")
    key, _, value = head.partition("=")
    for t in tolerations:
        if t.get("effect") and t.get("effect") != effect:
            continue
        if t.get("operator") == "Exists" and (not t.get("key") or t.get("key") == key):
            return True
        if t.get("key") == key and str(t.get("value") or "") == value:
            return True
    return False


def plugin_pools(entry: Mapping[str, Any] | None, driver: str) -> tuple[set[str], str] | None:
    """The pools whose nodes run `driver`'s node plugin, and where that was read: the side's recorded
    DaemonSet (its required kilonode.io/pool affinity and its tolerations), else for Azure Disk the
    plan's rule (runs_disk_plugin: no GPUs, or a monitoring or system pool; and the Prometheus pool).
    None when the side records no node plugin for the driver."""
    plan = lifecycle.plan_of(entry)
    pools = _pools(plan)
    for record in (entry or {}).get("resources") or []:
        if not isinstance(record, Mapping) or record.get("type") != DAEMONSET:
            continue
        spec = ((((record.get("inputs") or {}).get("spec") or {}).get("template") or {}).get("spec") or {})
        if not _registers(spec, driver):
            continue
        named = [p["name"] for p in pools]
        required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution") or {}
        for term in required.get("nodeSelectorTerms") or []:
            for e in term.get("matchExpressions") or []:
                if e.get("key") == POOL_LABEL and e.get("operator") == "In":
                    named = [n for n in named if n in (e.get("values") or [])]
        tolerations = spec.get("tolerations") or []
        on = {p["name"] for p in pools if p["name"] in named
              and all(_tolerates(tolerations, str(t)) for t in p.get("taints") or []
                      if not str(t).endswith(":PreferNoSchedule"))}  # a preference does not keep it off
        ds = str(((record.get("inputs") or {}).get("metadata") or {}).get("name") or record.get("name"))
        return on, f"DaemonSet {ds}'s placement"
    if driver == DISK_DRIVER and pools:
        on = {p["name"] for p in pools if not p.get("gpusPerNode") or p.get("monitoring") or p.get("system")}
        prometheus = (plan.get("prometheus") or {}).get("pool")
        if prometheus:
            on.add(str(prometheus))
        return on, "the plan's pools (kilonode.plan.resolve.components runs_disk_plugin)"
    return None


def _nodes(pool: Mapping[str, Any]) -> str:
    return f"{pool['name']} ({pool.get('nodes', '?')} nodes)"


def _where(entry: Mapping[str, Any] | None, inputs: Mapping[str, Any]) -> tuple[bool, str]:
    """(whether claims of the class fail on some pool that runs users' pods, what the line says)."""
    driver = str(inputs.get("provisioner") or "")
    users = _user_pools(lifecycle.plan_of(entry))
    placed = plugin_pools(entry, driver)
    if placed is None:
        missing = users
        read = f"no recorded DaemonSet registers {driver}'s node plugin"
    else:
        on, read = placed
        missing = [p for p in users if p["name"] not in on]
    if not missing:
        return False, f"its node plugin ({driver}) runs on every pool that runs users' pods ({read})"
    binding = str(inputs.get("volumeBindingMode") or "Immediate")
    if binding == "WaitForFirstConsumer":
        how = ("with WaitForFirstConsumer the external-provisioner provisions for the node the scheduler chose and "
               "needs its CSINode topology keys, which such a node has none of: provisioning fails \"no topology key "
               "found on CSINode <node>\" and the pod waits Pending (kubernetes-csi/external-provisioner at the "
               "catalogue's csi-provisioner release, pkg/controller/topology.go GenerateAccessibilityRequirements)")
    else:
        how = (f"with {binding} binding the disk is made, but no node plugin there mounts it"
               + (" and the controller's identity may attach only on the plugin pools' scale sets "
                  "(kilonode.azure.identity)" if driver == DISK_DRIVER else ""))
    said = ", ".join(_nodes(p) for p in missing)
    return True, (f"its node plugin ({driver}) does not run on {said} ({read}), so a claim of a pod there is never "
                  f"provisioned or attached: {how}")


def _cost(inputs: Mapping[str, Any]) -> str:
    if str(inputs.get("reclaimPolicy") or "Delete") != "Retain":
        return ""
    sku = (inputs.get("parameters") or {}).get("skuName")
    disk = f"its {sku} managed disk" if sku else "its disk"
    return (f" reclaimPolicy Retain: a claim deleted leaves its PersistentVolume Released and {disk} billed until "
            "someone deletes both, so every throwaway claim that now lands here is a disk kept.")


def assess(diff: StackDiff) -> list[Finding]:
    if diff.head is None:
        return []
    before, after = defaults(diff.base), defaults(diff.head)
    if before == after:
        return []
    classes = _classes(diff.head)
    subjects = tuple(sorted(c.name for c in diff.resources if c.type == STORAGE_CLASS))
    fix = ("Fix: leave the cluster without a default (kilonode marks none) and name the class in the claims that "
           "want it (spec.storageClassName), or mark default only a class whose node plugin runs on every pool.")
    if not after:
        return [Finding(MEDIUM, RULE, (
            f"No StorageClass is the default any more ({', '.join(before)} was): a claim created without "
            "storageClassName from now on gets no class and waits for a PersistentVolume with none, which nothing "
            f"provisions; claims already given a class keep it ({CITE})."), subjects)]
    created = {str(((c.head or {}).get("inputs") or {}).get("metadata", {}).get("name") or "")
               for c in diff.resources if c.type == STORAGE_CLASS and c.action == CREATE}
    if len(after) == 1:
        which = f"StorageClass {after[0]} becomes the cluster's default"
    else:
        newest = sorted(n for n in after if n in created)
        which = (f"{len(after)} StorageClasses are marked default ({', '.join(after)}): the newest created wins"
                 + (f" ({', '.join(newest)}, created by this change)" if len(newest) == 1 else "")
                 + " and which that is can change as classes are recreated")
    high = False
    parts = []
    for name in after:
        inputs = classes.get(name) or {}
        fails, where = _where(diff.head, inputs)
        high = high or fails
        parts.append(f"{name}: {where}.{_cost(inputs)}")
    text = (f"{which} (before: {', '.join(before) or 'none'}). Every new PersistentVolumeClaim without "
            "storageClassName is given it at admission, and every existing unbound one without a class by the PV "
            f"controller's next sync ({CITE}). " + " ".join(parts) + " " + fix)
    return [Finding(HIGH if high else MEDIUM, RULE, text, subjects)]
