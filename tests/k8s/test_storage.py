"""Azure Disk CSI and Prometheus's volume (kilonode.k8s.storage, kilonode.k8s.monitoring), under
Pulumi's mock engine, against upstream's manifests at the pinned tag written out by hand below
(kubernetes-sigs/azuredisk-csi-driver v1.34.5, deploy/v1.34.5/*.yaml, the line numbers cited),
not read from kilonode's code; and each object against the OpenAPI schema of the stack's
Kubernetes version (kubernetes-validate, strict)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from kilonode.azure.graph import Graph, Recorded
from kilonode.catalog.components import components
from kilonode.catalog.disks import premium_ssd_tier
from kilonode.k8s.cloud_provider import AzureTarget
from kilonode.k8s.pods import CONFIG_DIGEST_ANNOTATION, config_digest
from kilonode.k8s.storage import controller_azure_json
from kilonode.plan import ClusterPlan
from tests import shared

STACKS = list(shared.SHIPPED_STACKS)
PARENT = "k8s-storage"

# rbac-csi-azuredisk-controller.yaml and rbac-csi-azuredisk-node.yaml at v1.34.5: every
# (ClusterRole, apiGroup, resource) -> verbs upstream grants, as written there.
UPSTREAM_RULES: dict[tuple[str, str, str], set[str]] = {
    ("azuredisk-external-provisioner-role", "", "persistentvolumes"): {"get", "list", "watch", "create", "patch",
                                                                       "delete"},
    ("azuredisk-external-provisioner-role", "", "persistentvolumeclaims"): {"get", "list", "watch", "update"},
    ("azuredisk-external-provisioner-role", "storage.k8s.io", "storageclasses"): {"get", "list", "watch"},
    ("azuredisk-external-provisioner-role", "", "events"): {"get", "list", "watch", "create", "update", "patch"},
    ("azuredisk-external-provisioner-role", "storage.k8s.io", "csinodes"): {"get", "list", "watch"},
    ("azuredisk-external-provisioner-role", "", "nodes"): {"get", "list", "watch"},
    ("azuredisk-external-provisioner-role", "snapshot.storage.k8s.io", "volumesnapshots"): {"get", "list"},
    ("azuredisk-external-provisioner-role", "snapshot.storage.k8s.io", "volumesnapshotcontents"): {"get", "list"},
    ("azuredisk-external-provisioner-role", "coordination.k8s.io", "leases"): {
        "get", "watch", "list", "delete", "update", "create", "patch"},
    ("azuredisk-external-provisioner-role", "storage.k8s.io", "volumeattributesclasses"): {"get"},
    ("azuredisk-external-attacher-role", "", "persistentvolumes"): {"get", "list", "watch", "update"},
    ("azuredisk-external-attacher-role", "", "nodes"): {"get", "list", "watch"},
    ("azuredisk-external-attacher-role", "csi.storage.k8s.io", "csinodeinfos"): {"get", "list", "watch"},
    ("azuredisk-external-attacher-role", "storage.k8s.io", "volumeattachments"): {"get", "list", "watch", "update",
                                                                                  "patch"},
    ("azuredisk-external-attacher-role", "storage.k8s.io", "volumeattachments/status"): {
        "get", "list", "watch", "update", "patch"},
    ("azuredisk-external-attacher-role", "coordination.k8s.io", "leases"): {
        "get", "watch", "list", "delete", "update", "create", "patch"},
    ("azuredisk-external-resizer-role", "", "persistentvolumes"): {"get", "list", "watch", "update", "patch"},
    ("azuredisk-external-resizer-role", "", "persistentvolumeclaims"): {"get", "list", "watch"},
    ("azuredisk-external-resizer-role", "", "persistentvolumeclaims/status"): {"update", "patch"},
    ("azuredisk-external-resizer-role", "", "events"): {"list", "watch", "create", "update", "patch"},
    ("azuredisk-external-resizer-role", "coordination.k8s.io", "leases"): {
        "get", "watch", "list", "delete", "update", "create", "patch"},
    ("azuredisk-external-resizer-role", "", "pods"): {"get", "list", "watch"},
    ("azuredisk-external-resizer-role", "storage.k8s.io", "volumeattributesclasses"): {"get", "list", "watch"},
    ("csi-azuredisk-node-role", "", "secrets"): {"get"},
    ("csi-azuredisk-node-role", "", "nodes"): {"get", "patch"},  # patch not granted here (kilonode.k8s.storage)
    ("csi-azuredisk-node-role", "storage.k8s.io", "csinodes"): {"get"},
    ("csi-azuredisk-node-role", "storage.k8s.io", "volumeattachments"): {"get", "list", "watch"},
}


def objects(graph: Graph, kind: str) -> list[dict[str, Any]]:
    return [r.plain() for r in graph.resources
            if r.custom and r.type.endswith(f":{kind}") and (r.parent or "").endswith(PARENT)]


def one(graph: Graph, kind: str) -> dict[str, Any]:
    [found] = objects(graph, kind)
    return found


def containers(workload: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in workload["spec"]["template"]["spec"]["containers"]}


def records(graph: Graph) -> list[Recorded]:
    return [r for r in graph.resources if r.custom and (r.parent or "").endswith(PARENT)]


@pytest.mark.parametrize("stack", STACKS)
def test_every_storage_object_is_valid_for_the_stacks_kubernetes(
        graphs: dict[str, Graph], plans: dict[str, ClusterPlan], stack: str) -> None:
    found = records(graphs[stack])
    assert len(found) == 15  # with the controller's azure.json ConfigMap
    for record in found:
        shared.validate_object(record.plain(), f"1.{plans[stack].components.kubernetes_minor}.0")


def test_the_csidriver_is_upstreams() -> None:
    """csi-azuredisk-driver.yaml at v1.34.5."""
    driver = one(shared.recorded_graph("local"), "CSIDriver")
    assert driver["metadata"]["name"] == "disk.csi.azure.com"
    assert driver["spec"] == {"attachRequired": True, "podInfoOnMount": False, "fsGroupPolicy": "File"}


def test_the_monitoring_class_is_premium_ssd_kept_and_bound_where_the_pod_lands(graphs: dict[str, Graph]) -> None:
    [klass] = objects(graphs["research-7500"], "StorageClass")
    assert klass["provisioner"] == "disk.csi.azure.com"
    # docs/driver-parameters.md at v1.34.5: skuName Premium_LRS, cachingMode ReadOnly, fsType ext4
    assert klass["parameters"] == {"skuName": "Premium_LRS", "cachingMode": "ReadOnly", "fsType": "ext4"}
    assert klass["reclaimPolicy"] == "Retain"
    assert klass["volumeBindingMode"] == "WaitForFirstConsumer"
    assert klass["allowVolumeExpansion"] is True
    # not the cluster's default class: a claim must name it
    assert "storageclass.kubernetes.io/is-default-class" not in klass["metadata"].get("annotations", {})


@pytest.mark.parametrize("stack", STACKS)
def test_the_node_plugin_is_upstreams_privileged_pod_on_the_pools_without_gpus_and_prometheus_pool(
        graphs: dict[str, Graph], plans: dict[str, ClusterPlan], stack: str) -> None:
    plan = plans[stack]
    node = one(graphs[stack], "DaemonSet")
    spec = node["spec"]["template"]["spec"]
    assert spec["hostNetwork"] is True and spec["dnsPolicy"] == "Default"  # l.20-21
    assert spec["priorityClassName"] == "system-node-critical"  # l.34
    assert spec["tolerations"] == [{"operator": "Exists"}]  # l.38-39
    [term] = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    pools = set(term["matchExpressions"][0]["values"])
    assert pools == {p.name for p in plan.node_pools if not p.gpus_per_node} | (
        {plan.prometheus.pool} if plan.prometheus else set())
    assert not {p.name for p in plan.gpu_pools} & (pools - {plan.prometheus.pool if plan.prometheus else ""})
    plugin = containers(node)["azuredisk"]
    assert plugin["securityContext"] == {"privileged": True}  # l.144-145
    mounts = {m["mountPath"]: m for m in plugin["volumeMounts"]}
    assert mounts["/var/lib/kubelet/"]["mountPropagation"] == "Bidirectional"  # l.153-155
    assert {"/csi", "/dev", "/sys/bus/scsi/devices", "/sys/class/"} <= set(mounts)
    volumes = {v["name"]: v.get("hostPath", {}).get("path") for v in spec["volumes"]}
    assert volumes == {  # l.170-198, less the host's /etc/kubernetes (kilonode.k8s.storage)
        "socket-dir": "/var/lib/kubelet/plugins/disk.csi.azure.com", "mountpoint-dir": "/var/lib/kubelet/",
        "registration-dir": "/var/lib/kubelet/plugins_registry/", "device-dir": "/dev",
        "sys-devices-dir": "/sys/bus/scsi/devices", "sys-class": "/sys/class/"}
    registrar = containers(node)["node-driver-registrar"]
    env = {e["name"]: e.get("value") for e in registrar["env"]}
    assert env["DRIVER_REG_SOCK_PATH"] == "/var/lib/kubelet/plugins/disk.csi.azure.com/csi.sock"  # l.73-74
    assert "--allow-empty-cloud-config=true" in plugin["args"]
    # images: the catalogue's pin, as upstream's node manifest names them (l.45, l.62, l.104)
    row = components().azure_disk_csi
    assert plugin["image"] == "mcr.microsoft.com/oss/v2/kubernetes-csi/azuredisk-csi:v1.34.5" == row.image(
        "azuredisk", row.version or "")
    assert registrar["image"].endswith("/csi-node-driver-registrar:v2.17.0")


@pytest.mark.parametrize("stack", STACKS)
def test_the_controller_is_two_leader_elected_replicas_where_the_cloud_identity_is(
        graphs: dict[str, Graph], plans: dict[str, ClusterPlan], stack: str) -> None:
    controller = one(graphs[stack], "Deployment")
    assert controller["spec"]["replicas"] == 2  # l.8
    spec = controller["spec"]["template"]["spec"]
    assert spec["hostNetwork"] is True  # l.17: and the instance metadata service
    [term] = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert set(term["matchExpressions"][0]["values"]) == {p.name for p in plans[stack].controller_pools}
    by_name = containers(controller)
    assert set(by_name) == {"csi-provisioner", "csi-attacher", "csi-resizer", "liveness-probe", "azuredisk"}
    for sidecar in ("csi-provisioner", "csi-attacher", "csi-resizer"):
        args = by_name[sidecar]["args"]
        assert {"-leader-election", "--leader-election"} & set(args), sidecar
        assert "--leader-election-namespace=kube-system" in args
    plugin = by_name["azuredisk"]
    env = {e["name"]: e.get("value") for e in plugin["env"]}
    # its own azure.json (its own identity), not cloud-controller-manager's nor the host's /etc/kubernetes
    assert env["AZURE_CREDENTIAL_FILE"] == "/etc/kubernetes/azuredisk/azure.json"
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["azure-cred"]["configMap"]["name"] == "csi-azuredisk-controller-azure"
    mounts = {m["name"]: m["mountPath"] for m in plugin["volumeMounts"]}
    assert mounts["azure-cred"] == "/etc/kubernetes/azuredisk"
    assert "--allow-empty-cloud-config=false" in plugin["args"]
    assert all(not a.startswith("--metrics-address=0.0.0.0") for a in plugin["args"])


@pytest.mark.parametrize("stack", STACKS)
def test_the_controllers_azure_json_is_cloud_controller_managers_naming_its_own_identity(
        graphs: dict[str, Graph], plans: dict[str, ClusterPlan], stack: str) -> None:
    """The driver decodes cloud-provider-azure's config struct from AZURE_CREDENTIAL_FILE
    (pkg/azureutils/azure_disk_utils.go GetCloudProviderFromClient l.150-192 at v1.34.5): the same
    fields as cloud-controller-manager's, acting as the disk CSI identity (kilonode.azure.identity)
    through the instance metadata service, and it rolls when that file changes (read once, at start:
    pkg/azuredisk/azuredisk.go l.271-275)."""
    graph, cluster = graphs[stack], plans[stack].cluster
    [config_map] = objects(graph, "ConfigMap")
    assert (config_map["metadata"]["name"], config_map["metadata"]["namespace"]) == (
        "csi-azuredisk-controller-azure", "kube-system")
    mine = json.loads(config_map["data"]["azure.json"])
    [ccm_map] = [r.plain() for r in graph.resources if r.custom and r.type == "kubernetes:core/v1:ConfigMap"
                 and r.plain()["metadata"]["name"] == "azure-cloud-provider"]
    ccm = json.loads(ccm_map["data"]["azure.json"])
    assert mine["useManagedIdentityExtension"] is True and mine["useInstanceMetadata"] is True
    assert mine["userAssignedIdentityID"] == f"mock-client-id:{cluster}-controllers-disk-csi-identity"
    assert ccm["userAssignedIdentityID"] == f"mock-client-id:{cluster}-controllers-cloud-provider-identity"
    # every other field is cloud-controller-manager's: the same cloud, tenant, subscription, the
    # pools' group (where disks are made and the scale sets listed), location, vmType, VNet
    assert {k: v for k, v in mine.items() if k != "userAssignedIdentityID"} == {
        k: v for k, v in ccm.items() if k != "userAssignedIdentityID"}
    for key in ("cloud", "tenantId", "subscriptionId", "resourceGroup", "location", "vmType", "vnetName",
                "vnetResourceGroup"):
        assert mine[key], key
    assert mine["resourceGroup"] == plans[stack].node_resource_group
    template = one(graph, "Deployment")["spec"]["template"]
    assert template["metadata"]["annotations"][CONFIG_DIGEST_ANNOTATION] == config_digest(config_map["data"])


def test_the_controllers_azure_json_needs_the_disk_identity() -> None:
    target = AzureTarget(tenant_id="t", subscription_id="s", resource_group="rg", network_resource_group="net",
                         vnet_name="v", subnet_name="n", security_group_name="g", identity_client_id="ccm")
    with pytest.raises(ValueError, match="no Azure Disk CSI identity"):
        controller_azure_json(shared.plan("local"), target)
    assert controller_azure_json(shared.plan("local"), dataclasses.replace(
        target, disk_csi_identity_client_id="disk"))["userAssignedIdentityID"] == "disk"


def test_rbac_is_upstreams_less_secrets_snapshots_and_the_node_plugins_unused_reads(graphs: dict[str, Graph]) -> None:
    graph = graphs["research-7500"]
    granted: dict[tuple[str, str, str], set[str]] = {}
    for role in objects(graph, "ClusterRole"):
        for rule in role["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    granted[(role["metadata"]["name"], group, resource)] = set(rule["verbs"])
    for key, verbs in granted.items():
        assert verbs <= UPSTREAM_RULES.get(key, set()), f"{key}: {verbs} is more than upstream's"
    assert not any(resource == "secrets" for _, _, resource in granted)
    node = {k: v for k, v in granted.items() if k[0] == "csi-azuredisk-node-role"}
    assert not any({"list", "watch"} & verbs for verbs in node.values())  # no per-node list or watch
    assert not any(name == "azuredisk-external-snapshotter-role" for name, _, _ in granted)
    bindings = {b["metadata"]["name"]: (b["roleRef"]["name"], [(s["namespace"], s["name"]) for s in b["subjects"]])
                for b in objects(graph, "ClusterRoleBinding")}
    assert bindings == {
        "azuredisk-external-provisioner-role-binding": ("azuredisk-external-provisioner-role",
                                                        [("kube-system", "csi-azuredisk-controller-sa")]),
        "azuredisk-external-attacher-role-binding": ("azuredisk-external-attacher-role",
                                                     [("kube-system", "csi-azuredisk-controller-sa")]),
        "azuredisk-external-resizer-role-binding": ("azuredisk-external-resizer-role",
                                                    [("kube-system", "csi-azuredisk-controller-sa")]),
        "csi-azuredisk-node-role-binding": ("csi-azuredisk-node-role", [("kube-system", "csi-azuredisk-node-sa")]),
    }


@pytest.mark.parametrize("stack", STACKS)
def test_prometheus_keeps_its_tsdb_on_a_claim_of_its_disks_premium_ssd_tier(
        graphs: dict[str, Graph], plans: dict[str, ClusterPlan], stack: str) -> None:
    p = plans[stack].prometheus
    assert p is not None
    [sts] = [r.plain() for r in graphs[stack].of_type("kubernetes:apps/v1:StatefulSet")
             if r.plain()["metadata"]["name"] == "prometheus"]
    [claim] = sts["spec"]["volumeClaimTemplates"]
    # the Premium SSD tiers (kilonode.catalog.disks): 614 GiB on a P30 OS disk falls in P30, 1,024 GiB
    tier = premium_ssd_tier(p.disk_gib)
    assert claim["spec"]["resources"]["requests"]["storage"] == f"{tier.size_gib}Gi" == f"{p.volume_gib}Gi"
    assert claim["spec"]["storageClassName"] == "kilonode-premium-ssd-retain"
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert sts["spec"]["persistentVolumeClaimRetentionPolicy"] == {"whenDeleted": "Retain", "whenScaled": "Retain"}
    pod = sts["spec"]["template"]["spec"]
    assert not any("emptyDir" in v for v in pod["volumes"])
    assert pod["securityContext"]["fsGroup"] == 65534
    [container] = pod["containers"]
    assert {m["name"]: m["mountPath"] for m in container["volumeMounts"]}["data"] == "/prometheus"
    assert "ephemeral-storage" not in container["resources"]["requests"]
    # the retention stays inside the plan's disk, a share of the volume
    assert p.retention_size_gib <= p.disk_gib <= p.volume_gib
