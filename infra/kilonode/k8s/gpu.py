"""GPU pools in the cluster: the NVIDIA device plugin, and who may act on GPU health.

DevicePlugin: NVIDIA/k8s-device-plugin as its static deployment at the pinned tag deploys it
(deployments/static/nvidia-device-plugin.yml at v0.17.4, fd56a747), pinned by digest
(kilonode.plan.defaults), on the GPU pools' nodes only. It registers nvidia.com/gpu with the
kubelet; without it a GPU node offers no GPU to any pod.

GpuHealthAccess: the least RBAC the GPU health taint controller (kilonode.gpu.controller, on
every apiserver VM as the user kilonode:gpu-health-controller) needs -- exactly the requests
it makes (kilonode.gpu.kubeapi): GET, LIST and WATCH Nodes and PUT a Node with the
resourceVersion it read; POST core/v1 Events in the namespace Node Events live in.

The agent on each GPU node needs no RBAC of its own: it acts with the kubelet's client
certificate (system:node:<name>, group system:nodes), which the Node authorizer lets
(plugin/pkg/auth/authorizer/node/node_authorizer.go, with AuthorizeNodeWithSelectors, GA
and locked on in 1.34: authorizeNode, authorizePod; other requests against NodeRules() in
plugin/pkg/auth/authorizer/rbac/bootstrappolicy/policy.go): patch the status of a Node
(NodeRestriction admits only its own), create Events, list pods with the field selector
spec.nodeName=<its own name>. It cannot change taints (NodeRestriction refuses a node's
change to its own taints), which is why the controller exists. tests/k8s/test_gpu.py holds
those rules and checks every request the agent makes against them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
from pulumi_kubernetes import apps, core, meta, rbac

from kilonode.k8s.bootstrap import KUBE_SYSTEM, RBAC_GROUP
from kilonode.k8s.pod_security import container_security_context
from kilonode.k8s.pods import SKIP_AWAIT, UNINITIALIZED_TAINT, system_pod_spec
from kilonode.node.gpu import protocol
from kilonode.plan import defaults, wellknown
from kilonode.plan.model import ClusterPlan

DEVICE_PLUGIN = "nvidia-device-plugin"
# upstream's names (deployments/static/nvidia-device-plugin.yml)
DAEMONSET_NAME = "nvidia-device-plugin-daemonset"
CONTAINER_NAME = "nvidia-device-plugin-ctr"
SELECTOR = {"name": "nvidia-device-plugin-ds"}
DEVICE_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
# The capability the toolkit's hook takes as "privileged" (internal/config/image/privileged.go
# at v1.17.8: CAP_SYS_ADMIN in the bounding set), which upstream's chart adds for volume-mounts.
NVML_CAPABILITY = "SYS_ADMIN"
POOL_LABEL = wellknown.POOL_LABEL  # every pool's kubelet registers it (--node-labels)

# The variable the plugin's --device-list-strategy flag reads, and its value when unset
# (cmd/nvidia-device-plugin/main.go at v0.17.4 l.92-97: a comma list, default "envvar").
DEVICE_LIST_STRATEGY_ENV = "DEVICE_LIST_STRATEGY"
DEVICE_LIST_STRATEGY_DEFAULT = wellknown.DEVICE_LIST_ENVVAR
# The plugin's settings, as environment variables its flags read (cmd/nvidia-device-plugin/
# main.go at v0.17.4: each flag's EnvVars).
DEVICE_PLUGIN_ENV = {
    # Upstream's static manifest says "false" because it lands on every node, GPU or not, and
    # a node without GPUs must not crash-loop. Here it lands on GPU nodes only, where a plugin
    # that cannot initialise NVML is a fault to see (CrashLoopBackOff), not a pod that blocks
    # quietly and offers no GPU. "true" is also the flag's own default.
    "FAIL_ON_INIT_ERROR": "true",
    # Data-centre GPUs through NVML; "auto" would also probe for Tegra (values: auto, nvml, tegra).
    "DEVICE_DISCOVERY_STRATEGY": "nvml",
    # The GPUs a pod gets travel as volume mounts under /var/run/nvidia-container-devices, which
    # only the kubelet can give a container, not in NVIDIA_VISIBLE_DEVICES, which any pod can set
    # (and with the NVIDIA runtime as Docker's default a pod that asks for no GPU would see all
    # eight). The image's toolkit config accepts volume mounts and refuses the variable from
    # unprivileged containers (kilonode.image.gpu TOOLKIT_SETTINGS; the keys and which strategy
    # each accepts: kilonode.plan.wellknown DEVICE_LIST_TOOLKIT_KEY).
    DEVICE_LIST_STRATEGY_ENV: wellknown.DEVICE_LIST_VOLUME_MOUNTS,
    # The GPUs' device nodes also in the container's spec (Allocate's DeviceSpecs,
    # internal/plugin/server.go at v0.17.4 l.346-351; off by default, main.go l.86-90), as GPU
    # Operator runs the plugin (assets/state-device-plugin/0500_daemonset.yaml): under the
    # systemd cgroup driver a `systemctl daemon-reload` rebuilds a container's device rules from
    # its spec, so GPUs the toolkit's hook injected without them vanish from running pods
    # ("Failed to initialize NVML: Unknown Error", NVIDIA/nvidia-docker#1730); the image's
    # /dev/char links let runc name those spec devices to systemd (catalog/contracts.yaml
    # containerToolkit dev-char-links needs both).
    "PASS_DEVICE_SPECS": "true",
}


def gpu_taint_keys() -> tuple[str, ...]:
    """kilonode's GPU taints (kilonode.gpu.protocol): startup, fault, idle re-check."""
    return (protocol.STARTUP_TAINT, protocol.FAULT_TAINT, protocol.CHECK_TAINT)


def device_plugin_tolerations() -> list[dict[str, str]]:
    """Upstream's nvidia.com/gpu toleration, and kilonode's GPU taints, whatever their value.

    The plugin runs on a node still carrying the startup taint (the checks run then; the
    plugin must have registered the GPUs so the node offers them the moment the taint goes)
    and on a node carrying the fault or re-check taint: NoSchedule keeps workloads off, but
    the kubelet keeps counting the GPUs (`kubectl describe node` shows what is there), and
    a DaemonSet update does not leave a tainted node without its plugin -- so a node returned
    to service offers its GPUs at once. The taints keep every other pod off either way.

    And every team's taint (kilonode.io/team=<team>:NoSchedule, kilonode.plan.capacity): a
    DaemonSet pod needs every NoSchedule taint of its node tolerated, so without it the
    team-reserved nodes (4,000 of research-7500's A100s) would register no GPU at all.

    And the cloud provider's uninitialized taint, which the kubelet registers with under
    --cloud-provider=external until cloud-node-manager has initialised the node: the plugin
    needs nothing the cloud provider gives (it is on the host network and talks only to the
    kubelet), so it starts with the node instead of after it, and the GPUs are offered as soon
    as the other taints lift.
    """
    return [
        {"key": UNINITIALIZED_TAINT, "operator": "Exists", "effect": "NoSchedule"},
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        *({"key": key, "operator": "Exists", "effect": protocol.EFFECT} for key in gpu_taint_keys()),
        {"key": wellknown.TEAM_LABEL, "operator": "Exists", "effect": wellknown.TEAM_TAINT_EFFECT},
    ]


def device_plugin_affinity(pools: Sequence[str]) -> dict[str, object]:
    """Required node affinity: the nodes of these pools, by the pool label their kubelet registers."""
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": POOL_LABEL, "operator": "In", "values": sorted(pools)}]},
    ]}}}


# The controller's rules, as (API group, resource, verbs): what kilonode.gpu.kubeapi sends for
# it -- GET /api/v1/nodes/<name>, GET /api/v1/nodes (list), ?watch=1 (watch), PUT
# /api/v1/nodes/<name> (update, with the resourceVersion read: the conditional write). No
# patch: every write is that PUT. No leases: no leader election (conditional writes instead).
CONTROLLER_NODE_RULES: list[tuple[str, str, list[str]]] = [
    ("", "nodes", ["get", "list", "watch", "update"]),
]
# ... and POST /api/v1/namespaces/default/events: Events about Nodes live in "default"
# (protocol.EVENT_NAMESPACE), so this is a Role there, not cluster-wide. Each Event has a
# name of its own (never patched into a series).
CONTROLLER_EVENT_RULES: list[tuple[str, str, list[str]]] = [
    ("", "events", ["create"]),
]


def _rules(rules: list[tuple[str, str, list[str]]]) -> list[rbac.v1.PolicyRuleArgs]:
    return [rbac.v1.PolicyRuleArgs(api_groups=[group], resources=[resource], verbs=verbs)
            for group, resource, verbs in rules]


def _verbs(rules: list[tuple[str, str, list[str]]]) -> str:
    return "; ".join(f"{resource} {','.join(verbs)}" for _group, resource, verbs in rules)


def describe(plan: ClusterPlan) -> list[str]:
    """What `kilonode plan` says about GPU access: one line each, or one saying there is none."""
    pools = [pool.name for pool in plan.gpu_pools]
    if not pools:
        return ["no GPU pools: no device plugin, no GPU health agent or controller"]
    user = defaults.GPU_HEALTH_CONTROLLER_USER
    return [
        f"device plugin: DaemonSet {KUBE_SYSTEM}/{DAEMONSET_NAME}, image {plan.components.device_plugin_image}, "
        f"on pools {', '.join(pools)} ({POOL_LABEL} In {','.join(sorted(pools))})",
        "GPU health agent: the node's own identity (the kubelet's client certificate, system:node:<node>, "
        "group system:nodes), no RBAC of its own; the Node authorizer and NodeRestriction let it: patch its own "
        f"Node's status (condition {protocol.CONDITION}), create Events, list pods with spec.nodeName=<node>; "
        "never change taints",
        f"GPU health controller: user {user} (client certificate on each apiserver VM, "
        f"kubeconfig {wellknown.GPU_HEALTH_CONTROLLER_KUBECONFIG}); "
        f"ClusterRole {user}: {_verbs(CONTROLLER_NODE_RULES)}; "
        f"Role {protocol.EVENT_NAMESPACE}/{user}: {_verbs(CONTROLLER_EVENT_RULES)}",
        f"GPU taints it owns: {', '.join(gpu_taint_keys())} ({protocol.EFFECT}); "
        f"the device plugin tolerates them",
    ]


def device_plugin_security_context() -> core.v1.SecurityContextArgs:
    """Upstream Helm chart's, for a volume-mounts device list: no privilege escalation, every
    capability dropped but SYS_ADMIN (deployments/helm/nvidia-device-plugin/templates/_helpers.tpl
    at v0.17.4, requiresCapSysAdmin when the strategy includes volume-mounts). Why SYS_ADMIN: the
    plugin gets NVML only through its image's ENV NVIDIA_VISIBLE_DEVICES=all, and the toolkit's
    hook honours that variable from a container without CAP_SYS_ADMIN in its bounding set only
    when accept-nvidia-visible-devices-envvar-when-unprivileged is true (container_config.go
    getDevices at v1.17.8), which the image sets false so that no other pod can name every GPU
    (kilonode.image.gpu TOOLKIT_SETTINGS). The contract, with its sources, is
    catalog/contracts.yaml devicePlugin nvml-from-image-env. A read-only root filesystem: it
    writes only its socket, into the kubelet's device-plugin directory (a hostPath); the CDI spec
    under /var/run/cdi is written only for a cdi-* strategy. It stays its image's user, root: the
    kubelet's device-plugin directory and its socket are root's."""
    return container_security_context(None, add_capabilities=[NVML_CAPABILITY])


def device_plugin_wait_container(image: str) -> core.v1.ContainerArgs:
    """The init container that holds the plugin until the node's driver, device nodes and
    /dev/char links are ready: the image's kilonode-nvidia-devices unit writes the marker
    (kilonode.plan.wellknown NVIDIA_READY_MARKER), as GPU Operator's toolkit-validation init
    container waits for its toolkit-ready file (assets/state-device-plugin/0500_daemonset.yaml).
    The plugin's own image has the shell; no privilege, the directory mounted read-only."""
    return core.v1.ContainerArgs(
        name="wait-for-nvidia-devices",
        image=image,
        command=["sh", "-c", f"until [ -f {wellknown.NVIDIA_READY_MARKER} ]; do "
                 f"echo waiting for {wellknown.NVIDIA_DEVICES_UNIT} to write {wellknown.NVIDIA_READY_MARKER}; "
                 "sleep 5; done"],
        resources=core.v1.ResourceRequirementsArgs(requests=defaults.DEVICE_PLUGIN_REQUESTS),
        security_context=container_security_context(None),
        volume_mounts=[core.v1.VolumeMountArgs(name="nvidia-ready", mount_path=wellknown.NVIDIA_READY_DIR,
                                               read_only=True)],
    )


def _labels(app: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": app, "app.kubernetes.io/managed-by": "kilonode"}


@dataclass(frozen=True)
class DevicePluginArgs:
    pools: Sequence[str]  # the GPU pools' names
    image: str  # the plan's (components)


class DevicePlugin(pulumi.ComponentResource):
    def __init__(self, name: str, args: DevicePluginArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("kilonode:k8s:DevicePlugin", name, None, opts)
        if not args.pools:
            raise ValueError("DevicePlugin needs at least one GPU pool; a cluster without one gets none")
        labels = {**SELECTOR, **_labels(DEVICE_PLUGIN)}
        apps.v1.DaemonSet(
            f"{name}-daemonset",
            # on every GPU node: not waited for (kilonode.k8s.pods.SKIP_AWAIT says why)
            metadata=meta.v1.ObjectMetaArgs(name=DAEMONSET_NAME, namespace=KUBE_SYSTEM, labels=labels,
                                            annotations=SKIP_AWAIT),
            spec=apps.v1.DaemonSetSpecArgs(
                selector=meta.v1.LabelSelectorArgs(match_labels=SELECTOR),
                update_strategy=apps.v1.DaemonSetUpdateStrategyArgs(
                    type="RollingUpdate",
                    rolling_update=apps.v1.RollingUpdateDaemonSetArgs(
                        max_unavailable=defaults.DEVICE_PLUGIN_MAX_UNAVAILABLE)),
                template=core.v1.PodTemplateSpecArgs(
                    metadata=meta.v1.ObjectMetaArgs(labels=labels),
                    spec=system_pod_spec(
                        "node",  # upstream: a critical add-on, rescheduled first after a failure
                        # The plugin never calls the apiserver: cmd/nvidia-device-plugin at v0.17.4
                        # builds no Kubernetes client (only config-manager and gpu-feature-discovery,
                        # which kilonode does not run, import internal/flags/kubeclient.go); it
                        # speaks only the kubelet's device-plugin gRPC API. So no token in the pod.
                        automount_service_account_token=False,
                        # it serves only the kubelet's unix socket: on the host network it takes none
                        # of the node's few pod IPs (catalog/contracts.yaml devicePlugin no-pod-ip)
                        host_network=True,
                        affinity=device_plugin_affinity(args.pools),
                        tolerations=device_plugin_tolerations(),
                        init_containers=[device_plugin_wait_container(args.image)],
                        containers=[core.v1.ContainerArgs(
                            name=CONTAINER_NAME,
                            image=args.image,
                            env=[core.v1.EnvVarArgs(name=k, value=v) for k, v in DEVICE_PLUGIN_ENV.items()],
                            resources=core.v1.ResourceRequirementsArgs(requests=defaults.DEVICE_PLUGIN_REQUESTS),
                            security_context=device_plugin_security_context(),
                            volume_mounts=[core.v1.VolumeMountArgs(
                                name="kubelet-device-plugins-dir", mount_path=DEVICE_PLUGIN_DIR)],
                        )],
                        volumes=[
                            core.v1.VolumeArgs(
                                name="kubelet-device-plugins-dir",
                                host_path=core.v1.HostPathVolumeSourceArgs(path=DEVICE_PLUGIN_DIR, type="Directory")),
                            core.v1.VolumeArgs(
                                name="nvidia-ready",
                                host_path=core.v1.HostPathVolumeSourceArgs(path=wellknown.NVIDIA_READY_DIR,
                                                                           type="DirectoryOrCreate")),
                        ],
                    ),
                ),
            ),
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.register_outputs({})


class GpuHealthAccess(pulumi.ComponentResource):
    """The taint controller's ClusterRole (Nodes) and Role (Events), bound to its user."""

    def __init__(self, name: str, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("kilonode:k8s:GpuHealthAccess", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        user = defaults.GPU_HEALTH_CONTROLLER_USER
        labels = _labels("gpu-health-controller")
        subject = rbac.v1.SubjectArgs(kind="User", name=user, api_group=RBAC_GROUP)
        role = rbac.v1.ClusterRole(
            f"{name}-role",
            metadata=meta.v1.ObjectMetaArgs(name=user, labels=labels),
            rules=_rules(CONTROLLER_NODE_RULES),
            opts=child,
        )
        rbac.v1.ClusterRoleBinding(
            f"{name}-binding",
            metadata=meta.v1.ObjectMetaArgs(name=user, labels=labels),
            role_ref=rbac.v1.RoleRefArgs(api_group=RBAC_GROUP, kind="ClusterRole", name=role.metadata.name),
            subjects=[subject],
            opts=child,
        )
        events = rbac.v1.Role(
            f"{name}-events-role",
            metadata=meta.v1.ObjectMetaArgs(name=user, namespace=protocol.EVENT_NAMESPACE, labels=labels),
            rules=_rules(CONTROLLER_EVENT_RULES),
            opts=child,
        )
        rbac.v1.RoleBinding(
            f"{name}-events-binding",
            metadata=meta.v1.ObjectMetaArgs(name=user, namespace=protocol.EVENT_NAMESPACE, labels=labels),
            role_ref=rbac.v1.RoleRefArgs(api_group=RBAC_GROUP, kind="Role", name=events.metadata.name),
            subjects=[subject],
            opts=child,
        )
        self.register_outputs({})
