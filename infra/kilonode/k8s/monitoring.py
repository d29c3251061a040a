"""Monitoring: the cluster's Prometheus, in the `monitoring` Namespace: a ConfigMap holding the rule
file, the scrape-configuration fragment and the whole prometheus.yml that kilonode.render.monitoring
renders for this plan; a StatefulSet of one Prometheus on the plan's pool (PrometheusPlan: its
nodeSelector, tolerations, resources and every flag), its ServiceAccount and the RBAC its service
discovery needs, and a Service (docs/monitoring.md).

The files come rendered from the caller: a kilonode.k8s module takes rendered files, it does
not render them (tests/test_structure.py: layers).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import pulumi
from pulumi_kubernetes import apps, core, meta, rbac

from kilonode.k8s.bootstrap import RBAC_GROUP
from kilonode.k8s.gpu import POOL_LABEL
from kilonode.k8s.network_policy import PROMETHEUS_PORT, default_deny, same_namespace_port
from kilonode.k8s.pod_security import container_security_context, kilonode_namespace, pod_security_context
from kilonode.k8s.pods import awaited
from kilonode.k8s.storage import PREMIUM_RETAIN_CLASS
from kilonode.plan import defaults
from kilonode.plan.model import AwaitsPlan, PrometheusPlan

# The namespace API Priority and Fairness already classifies (kilonode.k8s.flowcontrol): a
# Prometheus run here under its own ServiceAccount mounts this ConfigMap and its requests queue
# in the monitoring priority level, not beside the control plane's.
NAMESPACE = defaults.MONITORING_NAMESPACE
CONFIG_MAP = "kilonode-prometheus"
LABELS = {"app.kubernetes.io/name": "kilonode-monitoring", "app.kubernetes.io/managed-by": "kilonode"}
# A ConfigMap's values may hold at most 1 MiB together (kubernetes pkg/apis/core/validation/
# validation.go ValidateConfigMap: the sum of len(value) over data and binaryData against
# core.MaxSecretSize = 1 MiB); refused here rather than by the apiserver at `pulumi up`.
CONFIG_MAP_MAX_BYTES = 1024 * 1024


PROMETHEUS = "prometheus"  # the StatefulSet, its ServiceAccount and Service
PROMETHEUS_LABELS = {"app.kubernetes.io/name": PROMETHEUS, "app.kubernetes.io/managed-by": "kilonode"}
# The image's user: `USER nobody` (prometheus/prometheus Dockerfile at v3.5.5, on the busybox base
# whose passwd has nobody:x:65534:65534); the kubelet cannot check a user name against runAsNonRoot,
# so its UID is named.
PROMETHEUS_UID = 65534
DATA_DIR = "/prometheus"  # the image's WORKDIR and VOLUME
# The StatefulSet's claim template: each pod's claim is `data-prometheus-0`, a Premium SSD that
# outlives the pod, the StatefulSet and a deleted claim (PREMIUM_RETAIN_CLASS: reclaimPolicy Retain).
DATA_VOLUME = "data"
# Where kilonode.render.monitoring's files are mounted; prometheus.yml names the rule file there.
CONFIG_DIR = defaults.PROMETHEUS_CONFIG_DIR
PROMETHEUS_FILE = defaults.PROMETHEUS_CONFIG_FILE
# Namespaces where Prometheus discovers targets by pod and EndpointSlice: cluster-autoscaler in
# kube-system, and kube-state-metrics (the user's) in either: a Role in each, not a cluster-wide
# watch of every pod (tens of thousands at 7,500 nodes).
DISCOVERY_NAMESPACES = defaults.PROMETHEUS_DISCOVERY_NAMESPACES


@dataclass(frozen=True)
class MonitoringArgs:
    # file name -> text (kilonode.render.monitoring.monitoring_files): the ConfigMap's data
    files: Mapping[str, str] = field(default_factory=dict)
    kubernetes_minor: int = 0  # the cluster's: the PodSecurity version labels (required)
    prometheus: PrometheusPlan | None = None  # the plan's (required)
    image: str = ""  # the plan's (components.prometheus_image)
    awaits: AwaitsPlan | None = None  # the plan's: the pod waits for its pool's node


def prometheus_args(p: PrometheusPlan) -> list[str]:
    """The flags, each a lesson or a size from the plan (flags read in cmd/prometheus/main.go at
    v3.5.5, l.356-557)."""
    return [
        f"--config.file={CONFIG_DIR}/{PROMETHEUS_FILE}",
        f"--storage.tsdb.path={DATA_DIR}",
        # sized to the data volume: time from the plan's disk per day, size 80% of the volume
        f"--storage.tsdb.retention.time={p.retention_days}d",
        f"--storage.tsdb.retention.size={p.retention_size_gib}GB",
        # the default since 2.20, named: a compressed WAL is smaller to write and to replay
        f"--storage.tsdb.wal-compression={'true' if p.wal_compression else 'false'}",
        # field notes: dashboard queries crashed Prometheus until bounded
        f"--query.timeout={p.query_timeout}",
        f"--query.max-concurrency={p.query_max_concurrency}",
        f"--query.max-samples={p.query_max_samples}",
        # a ConfigMap change reaches the mounted file within the kubelet's sync; reloading it keeps
        # the pod, where a restart for a new config would leave the alerts blind while it replays;
        # and at shutdown the head's chunks are written out, so a restart replays only the WAL
        # after them (main.go l.229 at v3.5.5): the field notes' hours-long replay, for planned restarts
        "--enable-feature=auto-reload-config,memory-snapshot-on-shutdown",
        "--config.auto-reload-interval=30s",
    ]


def prometheus_pod(args: MonitoringArgs, account: core.v1.ServiceAccount, config: core.v1.ConfigMap
                   ) -> core.v1.PodSpecArgs:
    p = args.prometheus
    assert p is not None
    # no ephemeral-storage: the TSDB is on its own volume (data_claim), not the node's kubelet root
    resources = {"cpu": str(p.cpus), "memory": f"{p.memory_gib}Gi"}
    return core.v1.PodSpecArgs(
        service_account_name=account.metadata.name,
        node_selector={POOL_LABEL: p.pool},
        tolerations=[_toleration(taint) for taint in p.pool_taints],
        # fsGroup: the kubelet makes the new disk's root group-writable by 65534 (the CSIDriver's
        # fsGroupPolicy File, kilonode.k8s.storage)
        security_context=pod_security_context(run_as_non_root=True, run_as_user=PROMETHEUS_UID,
                                               run_as_group=PROMETHEUS_UID, fs_group=PROMETHEUS_UID),
        # its time to flush the head on SIGTERM before the kubelet kills it
        termination_grace_period_seconds=300,
        containers=[core.v1.ContainerArgs(
            name=PROMETHEUS,
            image=args.image,
            args=prometheus_args(p),
            # the field notes' hours-long WAL replay: Go's scheduler sized to the container's CPUs,
            # not the node's (automaxprocs, on by default, honours an explicit GOMAXPROCS)
            env=[core.v1.EnvVarArgs(name="GOMAXPROCS", value=str(p.cpus))],
            ports=[core.v1.ContainerPortArgs(name="web", container_port=PROMETHEUS_PORT, protocol="TCP")],
            resources=core.v1.ResourceRequirementsArgs(requests=resources, limits=resources),
            # WAL replay after a restart takes minutes at this size: up to an hour before liveness counts
            startup_probe=core.v1.ProbeArgs(http_get=core.v1.HTTPGetActionArgs(path="/-/ready", port="web"),
                                            period_seconds=15, failure_threshold=240),
            readiness_probe=core.v1.ProbeArgs(http_get=core.v1.HTTPGetActionArgs(path="/-/ready", port="web"),
                                              period_seconds=10),
            liveness_probe=core.v1.ProbeArgs(http_get=core.v1.HTTPGetActionArgs(path="/-/healthy", port="web"),
                                             period_seconds=15, timeout_seconds=10, failure_threshold=8),
            security_context=container_security_context(PROMETHEUS_UID),
            volume_mounts=[
                core.v1.VolumeMountArgs(name="config", mount_path=CONFIG_DIR, read_only=True),
                core.v1.VolumeMountArgs(name=DATA_VOLUME, mount_path=DATA_DIR),
            ],
        )],
        volumes=[
            core.v1.VolumeArgs(name="config", config_map=core.v1.ConfigMapVolumeSourceArgs(name=config.metadata.name)),
            # DATA_VOLUME comes from the StatefulSet's claim template (data_claim)
        ],
    )


def data_claim(p: PrometheusPlan) -> core.v1.PersistentVolumeClaimArgs:
    """The TSDB's claim template: the plan's disk rounded up to its Premium SSD tier (volume_gib,
    kilonode.catalog.disks), on PREMIUM_RETAIN_CLASS. ReadWriteOnce: Azure Disk's only mode
    (kubernetes-sigs/azuredisk-csi-driver README.md at v1.34.5)."""
    return core.v1.PersistentVolumeClaimArgs(
        metadata=meta.v1.ObjectMetaArgs(name=DATA_VOLUME, labels=PROMETHEUS_LABELS),
        spec=core.v1.PersistentVolumeClaimSpecArgs(
            access_modes=["ReadWriteOnce"],
            storage_class_name=PREMIUM_RETAIN_CLASS,
            resources=core.v1.VolumeResourceRequirementsArgs(requests={"storage": f"{p.volume_gib}Gi"}),
        ),
    )


def _toleration(taint: str) -> core.v1.TolerationArgs:
    """Tolerates exactly `key[=value]:Effect`."""
    spec, effect = taint.rsplit(":", 1)
    key, _, value = spec.partition("=")
    if value:
        return core.v1.TolerationArgs(key=key, operator="Equal", value=value, effect=effect)
    return core.v1.TolerationArgs(key=key, operator="Exists", effect=effect)


def discovery_rules() -> list[rbac.v1.PolicyRuleArgs]:
    """What its namespaced discovery (pod, endpointslice) watches in each DISCOVERY_NAMESPACES."""
    return [
        rbac.v1.PolicyRuleArgs(api_groups=[""], resources=["pods", "services"], verbs=["list", "watch"]),
        rbac.v1.PolicyRuleArgs(api_groups=["discovery.k8s.io"], resources=["endpointslices"], verbs=["list", "watch"]),
    ]


def cluster_rules() -> list[rbac.v1.PolicyRuleArgs]:
    """Node discovery (one list and watch of every Node: 7,500 objects, a per-cluster watch, not
    per node), the kubelets' /metrics and /metrics/cadvisor (nodes/metrics), the apiservers' /metrics."""
    return [
        rbac.v1.PolicyRuleArgs(api_groups=[""], resources=["nodes"], verbs=["list", "watch"]),
        rbac.v1.PolicyRuleArgs(api_groups=[""], resources=["nodes/metrics"], verbs=["get"]),
        rbac.v1.PolicyRuleArgs(non_resource_urls=["/metrics"], verbs=["get"]),
    ]


def config_map_size(files: Mapping[str, str]) -> int:
    """Bytes the apiserver counts against the limit: the values' (UTF-8)."""
    return sum(len(value.encode()) for value in files.values())


class Monitoring(pulumi.ComponentResource):
    def __init__(self, name: str, args: MonitoringArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        # It was MonitoringRules (the ConfigMap alone): the alias keeps its children's URNs.
        opts = pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(
            aliases=[pulumi.Alias(type_="kilonode:k8s:MonitoringRules")]))
        super().__init__("kilonode:k8s:Monitoring", name, None, opts)
        if not args.files or (args.prometheus is not None and PROMETHEUS_FILE not in args.files):
            raise ValueError(f"Monitoring: no files to deliver, or no {PROMETHEUS_FILE}")
        size = config_map_size(args.files)
        if size > CONFIG_MAP_MAX_BYTES:
            raise ValueError(f"Monitoring: {size} bytes exceed a ConfigMap's {CONFIG_MAP_MAX_BYTES}")
        if not args.kubernetes_minor or not args.image or args.awaits is None:
            raise ValueError("Monitoring: kubernetes_minor, image and awaits are required")
        child = pulumi.ResourceOptions(parent=self)
        namespace = self.namespace = kilonode_namespace(f"{name}-namespace", NAMESPACE, LABELS,
                                                        args.kubernetes_minor, child)
        # Prometheus scrapes out (egress stays open: apiservers, etcd, kubelets) and is queried
        # in: from its own namespace only, unless the user adds a policy.
        default_deny(f"{name}-default-deny", namespace.metadata.name, LABELS, egress=False, opts=child)
        same_namespace_port(f"{name}-allow-prometheus", namespace.metadata.name, LABELS, PROMETHEUS_PORT, child)
        config = core.v1.ConfigMap(
            f"{name}-config",
            metadata=meta.v1.ObjectMetaArgs(name=CONFIG_MAP, namespace=namespace.metadata.name, labels=LABELS),
            data=dict(args.files),
            opts=child,
        )
        if args.prometheus is not None:  # None: no pool can take it (the plan warns)
            self._prometheus(name, args, namespace, config, child)
        self.register_outputs({})

    def _prometheus(self, name: str, args: MonitoringArgs, namespace: core.v1.Namespace, config: core.v1.ConfigMap,
                    child: pulumi.ResourceOptions) -> None:
        labels = {**LABELS, **PROMETHEUS_LABELS}
        account = core.v1.ServiceAccount(f"{name}-prometheus-sa", metadata=meta.v1.ObjectMetaArgs(
            name=PROMETHEUS, namespace=namespace.metadata.name, labels=labels), opts=child)
        subject = rbac.v1.SubjectArgs(kind="ServiceAccount", name=PROMETHEUS, namespace=NAMESPACE)
        role_name = f"kilonode:{PROMETHEUS}"
        cluster_role = rbac.v1.ClusterRole(f"{name}-prometheus-role", metadata=meta.v1.ObjectMetaArgs(
            name=role_name, labels=labels), rules=cluster_rules(), opts=child)
        rbac.v1.ClusterRoleBinding(
            f"{name}-prometheus-binding", metadata=meta.v1.ObjectMetaArgs(name=role_name, labels=labels),
            role_ref=rbac.v1.RoleRefArgs(api_group=RBAC_GROUP, kind="ClusterRole", name=cluster_role.metadata.name),
            subjects=[subject], opts=child)
        for ns in DISCOVERY_NAMESPACES:
            role = rbac.v1.Role(f"{name}-prometheus-discovery-{ns}", metadata=meta.v1.ObjectMetaArgs(
                name=role_name, namespace=ns, labels=labels), rules=discovery_rules(),
                opts=pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(depends_on=[namespace])))
            rbac.v1.RoleBinding(
                f"{name}-prometheus-discovery-{ns}-binding",
                metadata=meta.v1.ObjectMetaArgs(name=role_name, namespace=ns, labels=labels),
                role_ref=rbac.v1.RoleRefArgs(api_group=RBAC_GROUP, kind="Role", name=role.metadata.name),
                subjects=[subject], opts=child)
        service = core.v1.Service(f"{name}-prometheus-service", metadata=meta.v1.ObjectMetaArgs(
            name=PROMETHEUS, namespace=namespace.metadata.name, labels=labels),
            spec=core.v1.ServiceSpecArgs(
                selector=PROMETHEUS_LABELS,
                ports=[core.v1.ServicePortArgs(name="web", port=PROMETHEUS_PORT, target_port="web")]),
            # waits for the pod's endpoint, whose node may still be joining
            opts=awaited(child, args.awaits))
        assert args.awaits is not None and args.prometheus is not None
        apps.v1.StatefulSet(
            f"{name}-prometheus",
            metadata=meta.v1.ObjectMetaArgs(name=PROMETHEUS, namespace=namespace.metadata.name, labels=labels),
            spec=apps.v1.StatefulSetSpecArgs(
                # one: sharding is not built (docs/monitoring.md); the plan refuses a pool too small
                replicas=1,
                service_name=service.metadata.name,
                selector=meta.v1.LabelSelectorArgs(match_labels=PROMETHEUS_LABELS),
                template=core.v1.PodTemplateSpecArgs(
                    # No config digest (kilonode.k8s.pods.CONFIG_DIGEST_ANNOTATION) on purpose: Prometheus
                    # reloads itself (prometheus_args: --enable-feature=auto-reload-config, every 30s it
                    # compares config/reload.go GenerateChecksum, which hashes prometheus.yml and every
                    # file its rule_files and scrape_config_files name, and reloads on a change, keeping
                    # the old config if the new one fails; cmd/prometheus/main.go at v3.5.5). Every file
                    # it reads is in this ConfigMap (the rule file by rule_files, the jobs inline; the
                    # scrape fragment is for a Prometheus of the user's), so a change applies without a
                    # restart. A roll would replace the only replica: its claim keeps the history, but the
                    # alerts are blind while the new pod replays the WAL, for a config it applies anyway.
                    metadata=meta.v1.ObjectMetaArgs(labels=labels),
                    spec=prometheus_pod(args, account, config)),
                # Changing the claim template replaces the StatefulSet (pulumi-kubernetes marks
                # spec.volumeClaimTemplates replace-on-change; the apiserver refuses an update of it);
                # the claim itself is kept (below) and the new pod binds it again by name.
                volume_claim_templates=[data_claim(args.prometheus)],
                # Kubernetes' defaults, named: neither deleting the StatefulSet nor scaling it down
                # deletes the claim (apps/v1 StatefulSetPersistentVolumeClaimRetentionPolicy)
                persistent_volume_claim_retention_policy=apps.v1.StatefulSetPersistentVolumeClaimRetentionPolicyArgs(
                    when_deleted="Retain", when_scaled="Retain"),
            ),
            # its pool's node may still be joining on a first `pulumi up`
            opts=awaited(child, args.awaits),
        )
