"""Storage: Azure Disk CSI (kubernetes-sigs/azuredisk-csi-driver, disk.csi.azure.com), so that a
PersistentVolumeClaim binds to an Azure managed disk that follows its pod from node to node; and
the StorageClass the cluster's Prometheus keeps its TSDB on (kilonode.k8s.monitoring).

Everything below is upstream's static manifests at the pinned tag (catalogue components.yaml
azureDiskCsi, v1.34.5: deploy/v1.34.5/csi-azuredisk-controller.yaml, csi-azuredisk-node.yaml,
csi-azuredisk-driver.yaml, rbac-csi-azuredisk-controller.yaml, rbac-csi-azuredisk-node.yaml), with
these differences, each for a reason given where it is made:

- the controller (a Deployment of 2 replicas, leader election in every sidecar) runs on the plan's
  controller pools, as cloud-controller-manager does (kilonode.k8s.cloud_provider): on the host
  network, where the instance metadata service answers for the managed identity's token, and with
  an azure.json of its own (CONFIG_NAME, AZURE_CREDENTIAL_FILE) instead of the host's
  /etc/kubernetes: cloud-controller-manager's, naming the controller's own identity
  (userAssignedIdentityID, kilonode.azure.identity `disk-csi`, carried by the controller pools'
  scale sets). That identity holds the disk actions upstream lists on the pools' group
  (DISK_CSI_ACTIONS) and the instance write that attaches a disk on the scale sets of
  node_plugin_pools only (DISK_CSI_ATTACH_ACTIONS); cloud-controller-manager's role keeps no disk
  action and no scale-set write (docs/in-cluster.md, "Storage: Azure Disk CSI").
- no csi-snapshotter and none of its RBAC: no VolumeSnapshot CRDs nor snapshot controller run here.
- no Secret access: upstream lets both accounts read every Secret of the cluster
  (csi-azuredisk-controller-secret-role; csi-azuredisk-node-role), for a cloud config kept in the
  Secret kube-system/azure-cloud-provider. The driver reads that Secret first and, when it cannot,
  logs it and reads the file (pkg/azureutils/azure_disk_utils.go GetCloudProviderFromClient,
  l.150-192 at v1.34.5); kilonode gives the controller the file, and the node plugin runs with an
  empty cloud config as upstream's node manifest allows (--allow-empty-cloud-config=true), taking
  its zone and instance type from its Node's labels (pkg/azuredisk/nodeserver.go NodeGetInfo).
- the node plugin lifts no taint (--remove-not-ready-taint=false: kilonode registers none), so its
  role has no Node patch: a token on every node that may write any Node is what
  preflight's `node-writers` refuses.
- the node plugin does not list or watch VolumeAttachments: only the controller's attach path lists
  them (pkg/azuredisk/controllerserver.go l.875, azuredisk.go getUsedLunsFromVolumeAttachments); a
  per-node list right on 7,500 nodes is the apiserver load the field notes warn of. Nor does it
  mount the host's /etc/kubernetes (no azure.json is there: kilonode writes none on nodes).
- metrics listen on loopback: nothing scrapes them, and the endpoint has no authentication; no
  host-network port is declared (CONTROLLER_HEALTH_PORT), and the controller's two replicas are kept
  on different nodes by anti-affinity instead.
- the node plugin runs on the pools that are not GPU pools, on monitoring and system pools, and on
  the Prometheus pool whatever it is (node_plugin_pools): 7,500 GPU nodes would each run three more
  containers and register a CSINode, for volumes no training job asks for today; a GPU pool that
  needs disks is a change here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pulumi
from pulumi_kubernetes import apps, core, meta, rbac, storage

from kilonode.k8s.bootstrap import KUBE_SYSTEM, RBAC_GROUP
from kilonode.k8s.cloud_provider import AzureTarget, azure_json
from kilonode.k8s.pod_security import container_security_context
from kilonode.k8s.pods import SKIP_AWAIT, awaited, config_digest_annotation, on_pools, system_pod_spec
from kilonode.plan.model import ClusterPlan

DRIVER = "disk.csi.azure.com"
CONTROLLER = "csi-azuredisk-controller"
NODE = "csi-azuredisk-node"
CONTROLLER_ACCOUNT = "csi-azuredisk-controller-sa"
NODE_ACCOUNT = "csi-azuredisk-node-sa"
REPLICAS = 2  # csi-azuredisk-controller.yaml l.8
# The class Prometheus's claim names (kilonode.k8s.monitoring): Premium SSD, kept when the claim
# goes (Retain), bound where the pod lands.
PREMIUM_RETAIN_CLASS = "kilonode-premium-ssd-retain"
# docs/driver-parameters.md at v1.34.5, "Dynamic Provisioning": skuName (default StandardSSD_LRS),
# cachingMode (default ReadOnly: host read cache, writes go to the disk; ReadWrite is deprecated),
# fsType (default ext4 on Linux).
PREMIUM_RETAIN_PARAMETERS = {"skuName": "Premium_LRS", "cachingMode": "ReadOnly", "fsType": "ext4"}

KUBELET_DIR = "/var/lib/kubelet/"
# where the node plugin serves CSI, and the path it registers with the kubelet (node manifest l.74,
# l.172); the kubelet's plugin watcher reads registration sockets in plugins_registry (l.180)
PLUGIN_DIR = f"/var/lib/kubelet/plugins/{DRIVER}"
REGISTRATION_DIR = "/var/lib/kubelet/plugins_registry/"
SOCKET = "/csi/csi.sock"
# The ports on the host network (the manifests' --http-endpoint and --metrics-address), all on
# loopback here. Upstream declares four of them as containerPorts (controller l.183-186, node
# l.80-83, l.114-120); kilonode declares none: a declared host-network port is a listener on every
# address to preflight's `listeners` check and to the scheduler, and these answer on 127.0.0.1 only
# (the kubelet's probes, which name host localhost, as upstream's).
CONTROLLER_HEALTH_PORT = 29602
CONTROLLER_METRICS_PORT = 29604
NODE_HEALTH_PORT = 29603
NODE_METRICS_PORT = 29605
REGISTRAR_HEALTH_PORT = 29607
# where the controller reads its azure.json (CONFIG_NAME)
CLOUD_CONFIG_DIR = "/etc/kubernetes/azuredisk"
# The controller's own azure.json (a ConfigMap, as cloud-controller-manager's: it holds no
# credential). The Azure actions its identity holds, and where, are kilonode.azure.identity's
# DISK_CSI_ACTIONS and DISK_CSI_ATTACH_ACTIONS (docs/driver-parameters.md l.4-36 at v1.34.5).
CONFIG_NAME = "csi-azuredisk-controller-azure"

Rule = tuple[str, str, list[str]]
# rbac-csi-azuredisk-controller.yaml at v1.34.5: azuredisk-external-provisioner-role (l.9-43),
# -attacher-role (l.61-83) and -resizer-role (l.140-165), as upstream; not -snapshotter-role
# (l.101-123: no snapshotter) nor csi-azuredisk-controller-secret-role (l.181-188: the module
# docstring).
PROVISIONER_RULES: list[Rule] = [
    ("", "persistentvolumes", ["get", "list", "watch", "create", "patch", "delete"]),
    ("", "persistentvolumeclaims", ["get", "list", "watch", "update"]),
    ("storage.k8s.io", "storageclasses", ["get", "list", "watch"]),
    ("", "events", ["get", "list", "watch", "create", "update", "patch"]),
    ("storage.k8s.io", "csinodes", ["get", "list", "watch"]),
    ("", "nodes", ["get", "list", "watch"]),
    ("snapshot.storage.k8s.io", "volumesnapshots", ["get", "list"]),
    ("snapshot.storage.k8s.io", "volumesnapshotcontents", ["get", "list"]),
    ("coordination.k8s.io", "leases", ["get", "watch", "list", "delete", "update", "create", "patch"]),
    ("storage.k8s.io", "volumeattributesclasses", ["get"]),
]
ATTACHER_RULES: list[Rule] = [
    ("", "persistentvolumes", ["get", "list", "watch", "update"]),
    ("", "nodes", ["get", "list", "watch"]),
    ("csi.storage.k8s.io", "csinodeinfos", ["get", "list", "watch"]),
    ("storage.k8s.io", "volumeattachments", ["get", "list", "watch", "update", "patch"]),
    ("storage.k8s.io", "volumeattachments/status", ["get", "list", "watch", "update", "patch"]),
    ("coordination.k8s.io", "leases", ["get", "watch", "list", "delete", "update", "create", "patch"]),
]
RESIZER_RULES: list[Rule] = [
    ("", "persistentvolumes", ["get", "list", "watch", "update", "patch"]),
    ("", "persistentvolumeclaims", ["get", "list", "watch"]),
    ("", "persistentvolumeclaims/status", ["update", "patch"]),
    ("", "events", ["list", "watch", "create", "update", "patch"]),
    ("coordination.k8s.io", "leases", ["get", "watch", "list", "delete", "update", "create", "patch"]),
    ("", "pods", ["get", "list", "watch"]),
    ("storage.k8s.io", "volumeattributesclasses", ["get", "list", "watch"]),
]
# rbac-csi-azuredisk-node.yaml l.9-25, less secrets get and volumeattachments get/list/watch (the
# module docstring), and less nodes patch: its one Node write is removeNotReadyTaint's JSON patch of
# the disk.csi.azure.com/agent-not-ready taint (azuredisk.go l.868-914 at v1.34.5), off here
# (--remove-not-ready-taint=false, node_args). What stays: NodeGetInfo's GET of its Node's labels
# (nodeserver.go, GetNodeInfoFromLabels) and a GET of its CSINode (azuredisk.go l.922-923).
NODE_RULES: list[Rule] = [
    ("", "nodes", ["get"]),
    ("storage.k8s.io", "csinodes", ["get"]),
]
CONTROLLER_ROLES = {
    "azuredisk-external-provisioner-role": PROVISIONER_RULES,
    "azuredisk-external-attacher-role": ATTACHER_RULES,
    "azuredisk-external-resizer-role": RESIZER_RULES,
}


@dataclass(frozen=True)
class StorageArgs:
    plan: ClusterPlan
    # where the cluster is in Azure and the controller's identity (kilonode.azure.program cloud_target)
    target: pulumi.Output[AzureTarget]


def controller_azure_json(plan: ClusterPlan, target: AzureTarget) -> dict[str, Any]:
    """The controller's azure.json: cloud-controller-manager's (kilonode.k8s.cloud_provider
    azure_json: the driver decodes the same struct, cloud-provider-azure's azureconfig.Config,
    pkg/azureutils/azure_disk_utils.go GetCloudProviderFromClient l.150-192 at v1.34.5, and builds
    its clients from it: cloud, tenantId, subscriptionId, resourceGroup (where disks are made and
    scale sets are listed), location, vmType, vnet and the rest), acting as its own identity."""
    if target.disk_csi_identity_client_id is None:
        raise ValueError("the cluster made no Azure Disk CSI identity (kilonode.azure.identity disk_csi)")
    return azure_json(plan, target) | {"userAssignedIdentityID": target.disk_csi_identity_client_id}


def controller_config_data(plan: ClusterPlan, target: pulumi.Output[AzureTarget]) -> dict[str, pulumi.Output[str]]:
    """CONFIG_NAME's data: what the controller mounts (and its pod's digest)."""
    return {"azure.json": target.apply(
        lambda t: json.dumps(controller_azure_json(plan, t), indent=2, sort_keys=True) + "\n")}


def node_plugin_pools(plan: ClusterPlan) -> list[str]:
    """Where a disk can be attached: every pool with no GPUs, a monitoring or system pool, and the
    Prometheus pool (the module docstring says why not the GPU pools). The plan counts its pod in
    those pools' maxPods by the same rule (kilonode.plan.resolve.components runs_disk_plugin;
    tests/plan/test_limits.py compares the two), and its controller's identity may write those
    pools' instances only (ClusterPlan.disk_plugin_pools, which this is)."""
    return list(plan.disk_plugin_pools)


def _labels(app: str) -> dict[str, str]:
    return {"app": app, "app.kubernetes.io/managed-by": "kilonode"}


def _env(name: str, value: str) -> core.v1.EnvVarArgs:
    return core.v1.EnvVarArgs(name=name, value=value)


def _resources(limit_mib: int) -> core.v1.ResourceRequirementsArgs:
    """Upstream's: 10m and 20Mi requested by every container, a memory limit each."""
    return core.v1.ResourceRequirementsArgs(requests={"cpu": "10m", "memory": "20Mi"},
                                            limits={"memory": f"{limit_mib}Mi"})


def _sidecar(name: str, image: str, args: list[str], limit_mib: int = 500,
             mounts: list[core.v1.VolumeMountArgs] | None = None, env: list[core.v1.EnvVarArgs] | None = None,
             **extra: object) -> core.v1.ContainerArgs:
    """A sidecar on the CSI socket, as upstream's (capabilities dropped), read-only, as the
    image's own user (root: the CSI sidecars' images name none, and the socket is root's)."""
    return core.v1.ContainerArgs(
        name=name, image=image, args=args, resources=_resources(limit_mib),
        env=[*([_env("ADDRESS", SOCKET)] if "$(ADDRESS)" in " ".join(args) else []), *(env or [])] or None,
        volume_mounts=[core.v1.VolumeMountArgs(name="socket-dir", mount_path="/csi"), *(mounts or [])],
        security_context=container_security_context(None), **extra)  # type: ignore[arg-type]


def controller_args() -> dict[str, list[str]]:
    """Each controller container's command line: csi-azuredisk-controller.yaml l.41-53, l.72-80,
    l.128-136, l.155-159, l.176-182 at v1.34.5, with the metrics on loopback."""
    leader = ["--leader-election", f"--leader-election-namespace={KUBE_SYSTEM}"]
    return {
        "csi-provisioner": ["--feature-gates=Topology=true,VolumeAttributesClass=true", "--csi-address=$(ADDRESS)",
                            "--v=2", "--timeout=30s", *leader, "--worker-threads=100", "--extra-create-metadata=true",
                            "--strict-topology=true", "--kube-api-qps=50", "--kube-api-burst=100",
                            "--retry-interval-max=30m"],
        "csi-attacher": ["-v=2", "-csi-address=$(ADDRESS)", "-timeout=1200s", *leader, "-worker-threads=1000",
                         "-kube-api-qps=200", "-kube-api-burst=400"],
        "csi-resizer": ["-csi-address=$(ADDRESS)", "-v=2", *leader, "-handle-volume-inuse-error=false",
                        "-feature-gates=RecoverVolumeExpansionFailure=true,VolumeAttributesClass=true",
                        "-timeout=240s", "--retry-interval-max=30m"],
        "liveness-probe": [f"--csi-address={SOCKET}", "--probe-timeout=3s",
                           f"--http-endpoint=localhost:{CONTROLLER_HEALTH_PORT}", "--v=2"],
        "azuredisk": ["--v=5", "--endpoint=$(CSI_ENDPOINT)", f"--metrics-address=127.0.0.1:{CONTROLLER_METRICS_PORT}",
                      "--user-agent-suffix=OSS-kubectl", "--disable-avset-nodes=false",
                      "--allow-empty-cloud-config=false"],
    }


def node_args() -> dict[str, list[str]]:
    """csi-azuredisk-node.yaml l.46-50, l.63-69, l.106-113 at v1.34.5, metrics on loopback."""
    return {
        "liveness-probe": [f"--csi-address={SOCKET}", "--probe-timeout=10s",
                           f"--http-endpoint=localhost:{NODE_HEALTH_PORT}", "--v=2"],
        "node-driver-registrar": ["--csi-address=$(ADDRESS)", "--kubelet-registration-path=$(DRIVER_REG_SOCK_PATH)",
                                  "--v=2", f"--http-endpoint=localhost:{REGISTRAR_HEALTH_PORT}"],
        "azuredisk": ["--v=5", "--endpoint=$(CSI_ENDPOINT)", "--nodeid=$(KUBE_NODE_NAME)",
                      "--enable-perf-optimization=true", "--allow-empty-cloud-config=true",
                      "--get-node-info-from-labels=false", f"--metrics-address=127.0.0.1:{NODE_METRICS_PORT}",
                      # no kilonode node registers with disk.csi.azure.com/agent-not-ready, so there is no
                      # taint to lift and its role needs no Node patch (azuredisk.go l.424-430, l.868-914)
                      "--remove-not-ready-taint=false"],
    }


def _health(port: int | str, *, initial: int, timeout: int, period: int, failures: int) -> core.v1.ProbeArgs:
    return core.v1.ProbeArgs(http_get=core.v1.HTTPGetActionArgs(host="localhost", path="/healthz", port=port),
                             initial_delay_seconds=initial, timeout_seconds=timeout, period_seconds=period,
                             failure_threshold=failures)


def controller_pod(plan: ClusterPlan, account: core.v1.ServiceAccount, config_name: str) -> core.v1.PodSpecArgs:
    """csi-azuredisk-controller.yaml's pod at v1.34.5, where cloud-controller-manager runs (the
    module docstring)."""
    images, args = plan.components.azure_disk_csi_images, controller_args()
    return system_pod_spec(
        "cluster",
        service_account=account,
        system_pool=True,
        # where its identity is (the controller pools' scale sets, kilonode.k8s.cloud_provider controller_affinity),
        # one replica per node: the two share the host's loopback ports (CONTROLLER_*_PORT), which
        # kilonode declares as no containerPort (listen_ports), so the scheduler cannot see the clash
        affinity=on_pools([p.name for p in plan.controller_pools], affinity=core.v1.AffinityArgs(
            pod_anti_affinity=core.v1.PodAntiAffinityArgs(
                required_during_scheduling_ignored_during_execution=[core.v1.PodAffinityTermArgs(
                    label_selector=meta.v1.LabelSelectorArgs(match_labels={"app": CONTROLLER}),
                    topology_key="kubernetes.io/hostname")]))),
        host_network=True,  # l.17; and the instance metadata service, for the identity's token
        node_selector={"kubernetes.io/os": "linux"},
        containers=[
            _sidecar("csi-provisioner", images["provisioner"], args["csi-provisioner"]),
            _sidecar("csi-attacher", images["attacher"], args["csi-attacher"]),
            _sidecar("csi-resizer", images["resizer"], args["csi-resizer"]),
            _sidecar("liveness-probe", images["livenessProbe"], args["liveness-probe"], limit_mib=100),
            core.v1.ContainerArgs(
                name="azuredisk", image=images["azuredisk"], image_pull_policy="IfNotPresent",
                args=args["azuredisk"],
                liveness_probe=_health(CONTROLLER_HEALTH_PORT, initial=30, timeout=10, period=30, failures=5),
                env=[_env("AZURE_CREDENTIAL_FILE", f"{CLOUD_CONFIG_DIR}/azure.json"),
                     _env("CSI_ENDPOINT", f"unix://{SOCKET}")],
                volume_mounts=[core.v1.VolumeMountArgs(name="socket-dir", mount_path="/csi"),
                               core.v1.VolumeMountArgs(name="azure-cred", mount_path=CLOUD_CONFIG_DIR,
                                                       read_only=True)],
                resources=_resources(500),
                security_context=container_security_context(None),
            ),
        ],
        volumes=[
            core.v1.VolumeArgs(name="socket-dir", empty_dir=core.v1.EmptyDirVolumeSourceArgs()),
            core.v1.VolumeArgs(name="azure-cred", config_map=core.v1.ConfigMapVolumeSourceArgs(name=config_name)),
        ],
    )


def _host(name: str, path: str, kind: str) -> core.v1.VolumeArgs:
    return core.v1.VolumeArgs(name=name, host_path=core.v1.HostPathVolumeSourceArgs(path=path, type=kind))


def node_pod(plan: ClusterPlan, account: core.v1.ServiceAccount) -> core.v1.PodSpecArgs:
    """csi-azuredisk-node.yaml's pod at v1.34.5 (l.19-198) on node_plugin_pools: privileged, the
    kubelet's directory with Bidirectional propagation (the mounts it makes must reach the
    kubelet and the pods), /dev and the SCSI sysfs to find an attached disk by its LUN."""
    images, args = plan.components.azure_disk_csi_images, node_args()
    node_name = core.v1.EnvVarArgs(name="KUBE_NODE_NAME", value_from=core.v1.EnvVarSourceArgs(
        field_ref=core.v1.ObjectFieldSelectorArgs(api_version="v1", field_path="spec.nodeName")))
    return system_pod_spec(
        "node",
        service_account=account,
        host_network=True,  # l.20
        dns_policy="Default",  # l.21
        node_selector={"kubernetes.io/os": "linux"},
        affinity=on_pools(node_plugin_pools(plan)),
        tolerations=[core.v1.TolerationArgs(operator="Exists")],  # l.38-39: every taint
        containers=[
            _sidecar("liveness-probe", images["livenessProbe"], args["liveness-probe"], limit_mib=100),
            _sidecar("node-driver-registrar", images["nodeDriverRegistrar"], args["node-driver-registrar"],
                     limit_mib=100,
                     # the socket path it registers with the kubelet (l.73-74)
                     env=[_env("DRIVER_REG_SOCK_PATH", f"{PLUGIN_DIR}/csi.sock")],
                     mounts=[core.v1.VolumeMountArgs(name="registration-dir", mount_path="/registration")],
                     liveness_probe=_health(REGISTRAR_HEALTH_PORT, initial=20, timeout=10, period=20, failures=2)),
            core.v1.ContainerArgs(
                name="azuredisk", image=images["azuredisk"], image_pull_policy="IfNotPresent",
                args=args["azuredisk"],
                liveness_probe=_health(NODE_HEALTH_PORT, initial=30, timeout=30, period=30, failures=5),
                env=[_env("CSI_ENDPOINT", f"unix://{SOCKET}"), node_name],
                security_context=core.v1.SecurityContextArgs(privileged=True),
                lifecycle=core.v1.LifecycleArgs(pre_stop=core.v1.LifecycleHandlerArgs(
                    exec_=core.v1.ExecActionArgs(command=["/azurediskplugin", "--pre-stop-hook=true"]))),
                volume_mounts=[
                    core.v1.VolumeMountArgs(name="socket-dir", mount_path="/csi"),
                    core.v1.VolumeMountArgs(name="mountpoint-dir", mount_path=KUBELET_DIR,
                                            mount_propagation="Bidirectional"),
                    core.v1.VolumeMountArgs(name="device-dir", mount_path="/dev"),
                    core.v1.VolumeMountArgs(name="sys-devices-dir", mount_path="/sys/bus/scsi/devices"),
                    core.v1.VolumeMountArgs(name="sys-class", mount_path="/sys/class/"),
                ],
                resources=_resources(1000),
            ),
        ],
        volumes=[
            _host("socket-dir", PLUGIN_DIR, "DirectoryOrCreate"),
            _host("mountpoint-dir", KUBELET_DIR, "DirectoryOrCreate"),
            _host("registration-dir", REGISTRATION_DIR, "DirectoryOrCreate"),
            _host("device-dir", "/dev", "Directory"),
            _host("sys-devices-dir", "/sys/bus/scsi/devices", "Directory"),
            _host("sys-class", "/sys/class/", "Directory"),
        ],
    )


class Storage(pulumi.ComponentResource):
    def __init__(self, name: str, args: StorageArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("kilonode:k8s:Storage", name, None, opts)
        plan = args.plan
        child = pulumi.ResourceOptions(parent=self)
        storage.v1.CSIDriver(
            f"{name}-csidriver",
            metadata=meta.v1.ObjectMetaArgs(name=DRIVER, labels=_labels(DRIVER)),
            # csi-azuredisk-driver.yaml at v1.34.5: attach through VolumeAttachments, no pod info
            # on mount, and the kubelet applies fsGroup to the volume's files
            spec=storage.v1.CSIDriverSpecArgs(attach_required=True, pod_info_on_mount=False, fs_group_policy="File"),
            opts=child,
        )
        controller_account = self._account(name, CONTROLLER_ACCOUNT, CONTROLLER, CONTROLLER_ROLES)
        node_account = self._account(name, NODE_ACCOUNT, NODE, {"csi-azuredisk-node-role": NODE_RULES})
        labels = _labels(CONTROLLER)
        config_data = controller_config_data(plan, args.target)
        core.v1.ConfigMap(
            f"{name}-controller-config",
            metadata=meta.v1.ObjectMetaArgs(name=CONFIG_NAME, namespace=KUBE_SYSTEM, labels=labels),
            data=config_data,
            opts=child,
        )
        apps.v1.Deployment(
            f"{name}-controller",
            metadata=meta.v1.ObjectMetaArgs(name=CONTROLLER, namespace=KUBE_SYSTEM, labels=labels),
            spec=apps.v1.DeploymentSpecArgs(
                replicas=REPLICAS,
                selector=meta.v1.LabelSelectorArgs(match_labels={"app": CONTROLLER}),
                template=core.v1.PodTemplateSpecArgs(
                    # rolls on an azure.json change: the driver reads it once, at start
                    # (pkg/azuredisk/azuredisk.go l.271-275 at v1.34.5, GetCloudProviderFromClient in Run)
                    metadata=meta.v1.ObjectMetaArgs(labels=labels, annotations=config_digest_annotation(config_data)),
                    spec=controller_pod(plan, controller_account, CONFIG_NAME)),
            ),
            opts=awaited(child, plan.components.awaits),  # its pool's nodes may still be joining
        )
        pod = node_pod(plan, node_account)
        labels = _labels(NODE)
        apps.v1.DaemonSet(
            f"{name}-node",
            # on every node of its pools: not waited for (kilonode.k8s.pods.SKIP_AWAIT says why)
            metadata=meta.v1.ObjectMetaArgs(name=NODE, namespace=KUBE_SYSTEM, labels=labels, annotations=SKIP_AWAIT),
            spec=apps.v1.DaemonSetSpecArgs(
                selector=meta.v1.LabelSelectorArgs(match_labels={"app": NODE}),
                update_strategy=apps.v1.DaemonSetUpdateStrategyArgs(
                    type="RollingUpdate", rolling_update=apps.v1.RollingUpdateDaemonSetArgs(max_unavailable=1)),
                template=core.v1.PodTemplateSpecArgs(metadata=meta.v1.ObjectMetaArgs(labels=labels), spec=pod),
            ),
            opts=child,
        )
        storage.v1.StorageClass(
            f"{name}-premium-retain",
            metadata=meta.v1.ObjectMetaArgs(name=PREMIUM_RETAIN_CLASS, labels=_labels(DRIVER)),
            provisioner=DRIVER,
            parameters=PREMIUM_RETAIN_PARAMETERS,
            # a deleted claim leaves its disk (and Prometheus's history) for someone to reattach
            reclaim_policy="Retain",
            # the disk is made in the zone of the node the pod is scheduled to (--strict-topology)
            volume_binding_mode="WaitForFirstConsumer",
            allow_volume_expansion=True,
            opts=child,
        )
        self.register_outputs({})

    def _account(self, name: str, account: str, app: str, roles: dict[str, list[Rule]]) -> core.v1.ServiceAccount:
        """A ServiceAccount and each of `roles` (ClusterRole name -> rules) bound to it."""
        child = pulumi.ResourceOptions(parent=self)
        created = core.v1.ServiceAccount(
            f"{name}-{app}-sa", metadata=meta.v1.ObjectMetaArgs(name=account, namespace=KUBE_SYSTEM,
                                                                labels=_labels(app)), opts=child)
        for role_name, rules in roles.items():
            role = rbac.v1.ClusterRole(
                f"{name}-{role_name}", metadata=meta.v1.ObjectMetaArgs(name=role_name, labels=_labels(app)),
                rules=[rbac.v1.PolicyRuleArgs(api_groups=[g], resources=[r], verbs=v) for g, r, v in rules],
                opts=child)
            rbac.v1.ClusterRoleBinding(
                f"{name}-{role_name}-binding",
                metadata=meta.v1.ObjectMetaArgs(name=f"{role_name}-binding", labels=_labels(app)),
                role_ref=rbac.v1.RoleRefArgs(api_group=RBAC_GROUP, kind="ClusterRole", name=role.metadata.name),
                subjects=[rbac.v1.SubjectArgs(kind="ServiceAccount", name=account, namespace=KUBE_SYSTEM)],
                opts=child)
        return created
