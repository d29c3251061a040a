"""Exporters: the series the GPU and node alerts read, which neither the kubelet nor cAdvisor has.

DcgmExporter: NVIDIA/dcgm-exporter as its Helm chart deploys it (deployment/templates/daemonset.yaml
and values.yaml at 4.5.3-4.8.2), on the GPU pools' nodes only: per-GPU utilisation, memory, the last
Xid, uncorrectable ECC and row remapping, NVLink bandwidth and errors, temperature, thermal
throttling and power, and which pod holds each GPU (the kubelet's pod-resources socket). Its
counters CSV is kilonode's (kilonode.plan.defaults DCGM_FIELDS: the fields the rules and dashboards
read), so the series per node stay bounded (15 per GPU).

NodeExporter: prometheus/node_exporter at v1.12.1 as its README runs it in a container (host
network, host PID namespace, the host's / read-only at /host, --path.rootfs), on every node, with
only the collectors the rules read (NODE_EXPORTER_COLLECTORS: memory, load, pressure, disks,
filesystems, the node's NICs and the InfiniBand ports).

KubeStateMetrics: kubernetes/kube-state-metrics v2.18.0 as examples/standard deploys it (its
RBAC, Service and Deployment; one replica), limited to Nodes and kube-system's DaemonSets and
Deployments (--resources=nodes,daemonsets,deployments --namespaces=kube-system: the objects the rules
read) with the pool label exported (--metric-labels-allowlist=nodes=[kilonode.io/pool]:
kilonode.render.monitoring KSM_POOL_LABEL), sized for the cluster's nodes
(kilonode.plan.resolve.exporters).

None of them calls the apiserver from the nodes: the two DaemonSets get no token
(automountServiceAccountToken: false; dcgm-exporter maps GPUs to pods through the kubelet's
pod-resources socket, upstream's chart mounts a token only for pod labels or DRA, off here), the
lesson of the 2,500-node post (monitoring agents listing the apiserver from every node). Both are on
the host network, as node-exporter upstream is: a GPU node's pod IPs (maxPods) are the jobs', and
the node firewall (kilonode.render.node_ports, catalog/listeners.yaml node-exporter and
dcgm-exporter) admits their ports from the Prometheus pool alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
from pulumi_kubernetes import apps, core, meta, networking, rbac

from kilonode.k8s.bootstrap import KUBE_SYSTEM, RBAC_GROUP
from kilonode.k8s.gpu import device_plugin_affinity, device_plugin_tolerations, device_plugin_wait_container
from kilonode.k8s.monitoring import NAMESPACE as MONITORING_NAMESPACE
from kilonode.k8s.monitoring import PROMETHEUS_LABELS
from kilonode.k8s.pod_security import container_security_context
from kilonode.k8s.pods import (
    SKIP_AWAIT,
    awaited,
    config_digest_annotation,
    system_pod_spec,
    tolerate_critical_addons,
    tolerate_every_taint,
)
from kilonode.plan import defaults, wellknown
from kilonode.plan.model import AwaitsPlan, ClusterPlan
from kilonode.plan.resolve.exporters import KsmSize, kube_state_metrics_size

DCGM_EXPORTER = "dcgm-exporter"
NODE_EXPORTER = "node-exporter"
KUBE_STATE_METRICS = "kube-state-metrics"
# upstream's selector label (the chart's selectorLabels, kube-state-metrics' examples/standard):
# the scrape job finds kube-state-metrics's Service by it (kilonode.render.monitoring)
NAME_LABEL = "app.kubernetes.io/name"
# dcgm-exporter's counters file, where upstream's chart mounts its own (values.yaml extraVolumeMounts)
DCGM_COUNTERS_DIR = "/etc/dcgm-exporter/kilonode"
DCGM_COUNTERS_FILE = "counters.csv"
# the kubelet's pod-resources socket directory (the chart's kubeletPath; the exporter's
# --pod-resources-kubelet-socket default .../kubelet.sock, pkg/cmd/app.go l.283-287)
POD_RESOURCES_DIR = "/var/lib/kubelet/pod-resources"
# The capability upstream's chart adds (values.yaml securityContext) for DCGM's profiling fields,
# which is also what the toolkit takes as "privileged" when it decides whether to honour the
# image's NVIDIA_VISIBLE_DEVICES=all (kilonode.k8s.gpu NVML_CAPABILITY; catalog/contracts.yaml).
DCGM_CAPABILITY = "SYS_ADMIN"
# Upstream's requests and limits (values.yaml resources) and probes (livenessProbe, readinessProbe:
# 45 s initial delay, every 5 s, on /health).
DCGM_REQUESTS = {"cpu": "100m", "memory": "128Mi"}
DCGM_LIMITS = {"cpu": "200m", "memory": "512Mi"}
# node-exporter: what kube-prometheus's DaemonSet asks (an estimate for these few collectors)
NODE_EXPORTER_REQUESTS = {"cpu": "50m", "memory": "64Mi"}
NODE_EXPORTER_LIMITS = {"memory": "180Mi"}


def _labels(app: str) -> dict[str, str]:
    return {NAME_LABEL: app, "app.kubernetes.io/managed-by": "kilonode"}


def dcgm_counters_csv() -> str:
    """The counters file in etc/default-counters.csv's format (its header: "DCGM FIELD,
    Prometheus metric type, help message"), the fields of kilonode.plan.defaults DCGM_FIELDS."""
    lines = ["# kilonode's dcgm-exporter fields (kilonode.plan.defaults.exporters DCGM_FIELDS)",
             "# DCGM FIELD, Prometheus metric type, help message"]
    return "\n".join([*lines, *(f"{field}, {kind}, {text}" for field, kind, text in defaults.DCGM_FIELDS)]) + "\n"


def dcgm_env(interval_s: int) -> dict[str, str]:
    """The chart's environment (daemonset.yaml), the listen address named, and the collect interval
    set to the job's scrape interval (DCGM_EXPORTER_INTERVAL, ms; upstream's default 30000)."""
    return {
        "DCGM_EXPORTER_KUBERNETES": "true",
        "DCGM_EXPORTER_LISTEN": f":{wellknown.DCGM_EXPORTER_PORT}",
        "DCGM_EXPORTER_COLLECTORS": f"{DCGM_COUNTERS_DIR}/{DCGM_COUNTERS_FILE}",
        "DCGM_EXPORTER_INTERVAL": str(interval_s * 1000),
    }


def node_exporter_args() -> list[str]:
    """The README's container flags (--path.rootfs) and only the collectors kilonode reads, with
    their filters (kilonode.plan.defaults NODE_EXPORTER_COLLECTORS, NODE_EXPORTER_FLAGS)."""
    return [
        f"--path.rootfs={defaults.NODE_EXPORTER_ROOTFS}",
        f"--web.listen-address=:{wellknown.NODE_EXPORTER_PORT}",
        "--collector.disable-defaults",
        *(f"--collector.{name}" for name in defaults.NODE_EXPORTER_COLLECTORS),
        *(f"--{flag}={value}" for flag, value in defaults.NODE_EXPORTER_FLAGS),
    ]


def kube_state_metrics_args() -> list[str]:
    """cli-arguments.md at v2.18.0: the ports upstream's Service names, the resources and the label."""
    return [
        f"--port={defaults.KSM_PORT}",
        f"--telemetry-port={defaults.KSM_TELEMETRY_PORT}",
        f"--resources={','.join(defaults.KSM_RESOURCES)}",
        f"--namespaces={defaults.KSM_NAMESPACE}",
        f"--metric-labels-allowlist={defaults.KSM_LABELS_ALLOWLIST}",
    ]


def describe(plan: ClusterPlan) -> list[str]:
    """`kilonode explain`'s lines."""
    gpu = [p.name for p in plan.gpu_pools]
    lines = [f"node-exporter: DaemonSet {KUBE_SYSTEM}/{NODE_EXPORTER} on every node, host network, port "
             f"{wellknown.NODE_EXPORTER_PORT}; collectors {', '.join(defaults.NODE_EXPORTER_COLLECTORS)}",
             kube_state_metrics_size(plan.most_nodes).describe()]
    if gpu:
        lines.insert(0, f"dcgm-exporter: DaemonSet {KUBE_SYSTEM}/{DCGM_EXPORTER} on pools {', '.join(gpu)}, host "
                        f"network, port {wellknown.DCGM_EXPORTER_PORT}; {len(defaults.DCGM_FIELDS)} fields per GPU")
    return lines


@dataclass(frozen=True)
class ExportersArgs:
    gpu_pools: Sequence[str]  # where dcgm-exporter runs; none: no dcgm-exporter
    dcgm_image: str
    device_plugin_image: str  # its init container's (kilonode.k8s.gpu device_plugin_wait_container)
    node_exporter_image: str
    kube_state_metrics_image: str
    interval_s: int  # the per-node scrape interval (PrometheusPlan.per_node_interval_s)
    ksm: KsmSize
    awaits: AwaitsPlan

    @classmethod
    def of(cls, plan: ClusterPlan) -> ExportersArgs:
        c = plan.components
        interval = (plan.prometheus.per_node_interval_s if plan.prometheus
                    else defaults.PROMETHEUS_PER_NODE_INTERVALS_S[-1])
        return cls(gpu_pools=[p.name for p in plan.gpu_pools], dcgm_image=c.dcgm_exporter_image,
                   device_plugin_image=c.device_plugin_image, node_exporter_image=c.node_exporter_image,
                   kube_state_metrics_image=c.kube_state_metrics_image, interval_s=interval,
                   ksm=kube_state_metrics_size(plan.most_nodes), awaits=c.awaits)


class Exporters(pulumi.ComponentResource):
    def __init__(self, name: str, args: ExportersArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("kilonode:k8s:Exporters", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        _node_exporter(name, args, child)
        if args.gpu_pools:
            _dcgm_exporter(name, args, child)
        _kube_state_metrics(name, args, child)
        self.register_outputs({})


def _daemonset(resource: str, app: str, spec: core.v1.PodSpecArgs, child: pulumi.ResourceOptions,
               annotations: dict[str, pulumi.Input[str]] | None = None) -> apps.v1.DaemonSet:
    """A kube-system DaemonSet over many nodes: not waited for (kilonode.k8s.pods SKIP_AWAIT), rolled
    a share of the nodes at a time (the device plugin's pace, kilonode.plan.defaults)."""
    labels = _labels(app)
    return apps.v1.DaemonSet(
        resource,
        metadata=meta.v1.ObjectMetaArgs(name=app, namespace=KUBE_SYSTEM, labels=labels, annotations=SKIP_AWAIT),
        spec=apps.v1.DaemonSetSpecArgs(
            selector=meta.v1.LabelSelectorArgs(match_labels={NAME_LABEL: app}),
            update_strategy=apps.v1.DaemonSetUpdateStrategyArgs(
                type="RollingUpdate",
                rolling_update=apps.v1.RollingUpdateDaemonSetArgs(max_unavailable=defaults.DEVICE_PLUGIN_MAX_UNAVAILABLE)),
            template=core.v1.PodTemplateSpecArgs(
                metadata=meta.v1.ObjectMetaArgs(labels=labels, annotations=annotations), spec=spec),
        ),
        opts=child,
    )


def _node_exporter(name: str, args: ExportersArgs, child: pulumi.ResourceOptions) -> None:
    port = wellknown.NODE_EXPORTER_PORT
    probe = core.v1.ProbeArgs(http_get=core.v1.HTTPGetActionArgs(path="/", port=port),
                              period_seconds=30, timeout_seconds=5)
    spec = system_pod_spec(
        "node",
        automount_service_account_token=False,
        host_network=True,
        host_pid=True,
        tolerations=tolerate_every_taint(),  # every node, tainted GPU and reserved nodes included
        node_selector={"kubernetes.io/os": "linux"},
        containers=[core.v1.ContainerArgs(
            name=NODE_EXPORTER,
            image=args.node_exporter_image,
            args=node_exporter_args(),
            ports=[core.v1.ContainerPortArgs(name="metrics", container_port=port, protocol="TCP")],
            resources=core.v1.ResourceRequirementsArgs(requests=NODE_EXPORTER_REQUESTS, limits=NODE_EXPORTER_LIMITS),
            liveness_probe=probe,
            readiness_probe=probe,
            security_context=container_security_context(defaults.NODE_EXPORTER_USER),
            volume_mounts=[core.v1.VolumeMountArgs(name="root", mount_path=defaults.NODE_EXPORTER_ROOTFS,
                                                   read_only=True, mount_propagation="HostToContainer")],
        )],
        volumes=[core.v1.VolumeArgs(name="root", host_path=core.v1.HostPathVolumeSourceArgs(path="/"))],
    )
    _daemonset(f"{name}-node-exporter", NODE_EXPORTER, spec, child)


def _dcgm_exporter(name: str, args: ExportersArgs, child: pulumi.ResourceOptions) -> None:
    data = {DCGM_COUNTERS_FILE: dcgm_counters_csv()}
    counters = core.v1.ConfigMap(
        f"{name}-dcgm-counters",
        metadata=meta.v1.ObjectMetaArgs(name=f"{DCGM_EXPORTER}-counters", namespace=KUBE_SYSTEM,
                                        labels=_labels(DCGM_EXPORTER)),
        data=data,
        opts=child,
    )
    port = wellknown.DCGM_EXPORTER_PORT
    probe = core.v1.ProbeArgs(http_get=core.v1.HTTPGetActionArgs(path="/health", port=port),
                              initial_delay_seconds=45, period_seconds=5)
    spec = system_pod_spec(
        "node",  # the chart's priorityClassName
        automount_service_account_token=False,
        host_network=True,
        affinity=device_plugin_affinity(args.gpu_pools),
        # the device plugin's: the startup, fault and re-check taints included, since a GPU that
        # failed is the one whose readings a person needs
        tolerations=device_plugin_tolerations(),
        init_containers=[device_plugin_wait_container(args.device_plugin_image)],
        containers=[core.v1.ContainerArgs(
            name="exporter",
            image=args.dcgm_image,
            env=[*(core.v1.EnvVarArgs(name=k, value=v) for k, v in dcgm_env(args.interval_s).items()),
                 core.v1.EnvVarArgs(name="NODE_NAME", value_from=core.v1.EnvVarSourceArgs(
                     field_ref=core.v1.ObjectFieldSelectorArgs(field_path="spec.nodeName")))],
            ports=[core.v1.ContainerPortArgs(name="metrics", container_port=port, protocol="TCP")],
            resources=core.v1.ResourceRequirementsArgs(requests=DCGM_REQUESTS, limits=DCGM_LIMITS),
            liveness_probe=probe,
            readiness_probe=probe,
            # values.yaml securityContext: root (runAsNonRoot false, runAsUser 0), SYS_ADMIN, drop
            # ALL, no privilege escalation; its root filesystem is writable as upstream leaves it
            # (DCGM's embedded host engine writes its log and state there)
            security_context=core.v1.SecurityContextArgs(
                run_as_non_root=False, run_as_user=0, allow_privilege_escalation=False,
                capabilities=core.v1.CapabilitiesArgs(add=[DCGM_CAPABILITY], drop=["ALL"])),
            volume_mounts=[
                core.v1.VolumeMountArgs(name="pod-gpu-resources", mount_path=POD_RESOURCES_DIR, read_only=True),
                core.v1.VolumeMountArgs(name="counters", mount_path=DCGM_COUNTERS_DIR, read_only=True),
            ],
        )],
        volumes=[
            core.v1.VolumeArgs(name="pod-gpu-resources",
                               host_path=core.v1.HostPathVolumeSourceArgs(path=POD_RESOURCES_DIR, type="Directory")),
            core.v1.VolumeArgs(name="counters", config_map=core.v1.ConfigMapVolumeSourceArgs(
                name=counters.metadata.name)),
            core.v1.VolumeArgs(name="nvidia-ready", host_path=core.v1.HostPathVolumeSourceArgs(
                path=wellknown.NVIDIA_READY_DIR, type="DirectoryOrCreate")),
        ],
    )
    # it reads the CSV at start only (pkg/cmd/app.go: the -f file), so a change rolls the pods
    _daemonset(f"{name}-dcgm-exporter", DCGM_EXPORTER, spec, child, config_digest_annotation(data))


def _kube_state_metrics(name: str, args: ExportersArgs, child: pulumi.ResourceOptions) -> None:
    labels = _labels(KUBE_STATE_METRICS)
    selector = {NAME_LABEL: KUBE_STATE_METRICS}
    account = _kube_state_metrics_rbac(name, labels, child)
    metrics, telemetry = defaults.KSM_PORT, defaults.KSM_TELEMETRY_PORT
    http = core.v1.HTTPGetActionArgs
    spec = system_pod_spec(
        "cluster",
        service_account=account,
        system_pool=True,
        tolerations=tolerate_critical_addons(),
        node_selector={"kubernetes.io/os": "linux"},
        containers=[core.v1.ContainerArgs(
            name=KUBE_STATE_METRICS,
            image=args.kube_state_metrics_image,
            args=kube_state_metrics_args(),
            ports=[core.v1.ContainerPortArgs(name="http-metrics", container_port=metrics, protocol="TCP"),
                   core.v1.ContainerPortArgs(name="telemetry", container_port=telemetry, protocol="TCP")],
            resources=core.v1.ResourceRequirementsArgs(
                requests={"cpu": f"{args.ksm.cpu_millis}m", "memory": f"{args.ksm.memory_mib}Mi"},
                limits={"memory": f"{args.ksm.memory_mib}Mi"}),
            liveness_probe=core.v1.ProbeArgs(http_get=http(path="/livez", port="http-metrics"),
                                             initial_delay_seconds=5, timeout_seconds=5),
            readiness_probe=core.v1.ProbeArgs(http_get=http(path="/readyz", port="telemetry"),
                                              initial_delay_seconds=5, timeout_seconds=5),
            security_context=container_security_context(defaults.KSM_USER),
        )],
    )
    apps.v1.Deployment(
        f"{name}-ksm",
        metadata=meta.v1.ObjectMetaArgs(name=KUBE_STATE_METRICS, namespace=KUBE_SYSTEM, labels=labels),
        spec=apps.v1.DeploymentSpecArgs(
            replicas=1,
            selector=meta.v1.LabelSelectorArgs(match_labels=selector),
            template=core.v1.PodTemplateSpecArgs(metadata=meta.v1.ObjectMetaArgs(labels=labels), spec=spec),
        ),
        opts=awaited(child, args.awaits),
    )
    # examples/standard/service.yaml: the name and the port name the scrape job looks for
    core.v1.Service(
        f"{name}-ksm-service",
        metadata=meta.v1.ObjectMetaArgs(name=KUBE_STATE_METRICS, namespace=KUBE_SYSTEM, labels=labels),
        spec=core.v1.ServiceSpecArgs(
            cluster_ip="None", selector=selector,
            ports=[core.v1.ServicePortArgs(name="http-metrics", port=metrics, target_port="http-metrics"),
                   core.v1.ServicePortArgs(name="telemetry", port=telemetry, target_port="telemetry")]),
        opts=awaited(child, args.awaits),  # it waits for a ready endpoint, the replica on a pool node
    )
    _kube_state_metrics_policy(name, labels, selector, child)


def _kube_state_metrics_rbac(name: str, labels: dict[str, str],
                             child: pulumi.ResourceOptions) -> core.v1.ServiceAccount:
    """Its ServiceAccount, and examples/standard/cluster-role.yaml cut to what it reads: Nodes cluster-wide
    (cluster-scoped), and the apps resources in kube-system alone (--namespaces: a Role there, no cluster-wide
    read of workloads)."""
    account = core.v1.ServiceAccount(
        f"{name}-ksm-sa",
        metadata=meta.v1.ObjectMetaArgs(name=KUBE_STATE_METRICS, namespace=KUBE_SYSTEM, labels=labels), opts=child)
    cluster_scoped = [r for r in defaults.KSM_RESOURCES if r not in defaults.KSM_NAMESPACED_RESOURCES]
    role = rbac.v1.ClusterRole(
        f"{name}-ksm-role",
        metadata=meta.v1.ObjectMetaArgs(name=KUBE_STATE_METRICS, labels=labels),
        rules=[rbac.v1.PolicyRuleArgs(api_groups=[""], resources=cluster_scoped, verbs=["list", "watch"])],
        opts=child,
    )
    apps_role = rbac.v1.Role(
        f"{name}-ksm-apps-role",
        metadata=meta.v1.ObjectMetaArgs(name=KUBE_STATE_METRICS, namespace=defaults.KSM_NAMESPACE, labels=labels),
        rules=[rbac.v1.PolicyRuleArgs(api_groups=[defaults.KSM_NAMESPACED_GROUP],
                                      resources=list(defaults.KSM_NAMESPACED_RESOURCES), verbs=["list", "watch"])],
        opts=child,
    )
    rbac.v1.RoleBinding(
        f"{name}-ksm-apps-binding",
        metadata=meta.v1.ObjectMetaArgs(name=KUBE_STATE_METRICS, namespace=defaults.KSM_NAMESPACE, labels=labels),
        role_ref=rbac.v1.RoleRefArgs(api_group=RBAC_GROUP, kind="Role", name=apps_role.metadata.name),
        subjects=[rbac.v1.SubjectArgs(kind="ServiceAccount", name=account.metadata.name, namespace=KUBE_SYSTEM)],
        opts=child,
    )
    rbac.v1.ClusterRoleBinding(
        f"{name}-ksm-binding",
        metadata=meta.v1.ObjectMetaArgs(name=KUBE_STATE_METRICS, labels=labels),
        role_ref=rbac.v1.RoleRefArgs(api_group=RBAC_GROUP, kind="ClusterRole", name=role.metadata.name),
        subjects=[rbac.v1.SubjectArgs(kind="ServiceAccount", name=account.metadata.name, namespace=KUBE_SYSTEM)],
        opts=child,
    )
    return account


def _kube_state_metrics_policy(name: str, labels: dict[str, str], selector: dict[str, str],
                               child: pulumi.ResourceOptions) -> None:
    """kube-system has no default deny (kilonode.k8s.network_policy): its own policy, the metrics
    port from the cluster's Prometheus alone."""
    metrics = defaults.KSM_PORT
    networking.v1.NetworkPolicy(
        f"{name}-ksm-policy",
        metadata=meta.v1.ObjectMetaArgs(name=KUBE_STATE_METRICS, namespace=KUBE_SYSTEM, labels=labels),
        spec=networking.v1.NetworkPolicySpecArgs(
            pod_selector=meta.v1.LabelSelectorArgs(match_labels=selector),
            policy_types=["Ingress"],
            ingress=[networking.v1.NetworkPolicyIngressRuleArgs(
                from_=[networking.v1.NetworkPolicyPeerArgs(
                    namespace_selector=meta.v1.LabelSelectorArgs(
                        match_labels={"kubernetes.io/metadata.name": MONITORING_NAMESPACE}),
                    pod_selector=meta.v1.LabelSelectorArgs(match_labels=PROMETHEUS_LABELS))],
                ports=[networking.v1.NetworkPolicyPortArgs(protocol="TCP", port=metrics)])],
        ),
        opts=child,
    )
