"""KubeProxy: kube-proxy on every node, as kubeadm deploys it (a DaemonSet, the kube-proxy
ServiceAccount bound to system:node-proxier, config and kubeconfig in a ConfigMap), in the
mode kilonode.plan.defaults argues for.

Its credentials: the ServiceAccount's projected token, not a certificate of its own (the
issue's "documented alternative": what kubeadm does, rotated by the kubelet). Its
kubeconfig points at the load balancer, not the `kubernetes` Service IP, which only works
once kube-proxy runs.
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
from pulumi_kubernetes import apps, core, meta, rbac

from kilonode.k8s.bootstrap import KUBE_SYSTEM, RBAC_GROUP
from kilonode.k8s.pods import SKIP_AWAIT, config_digest_annotation, system_pod_spec, tolerate_every_taint
from kilonode.plan import defaults
from kilonode.plan.wellknown import API_LOAD_BUDGET_ANNOTATION
from kilonode.yamlio import plain_yaml

LABELS = {"k8s-app": "kube-proxy", "app.kubernetes.io/managed-by": "kilonode"}
CONFIG_DIR = "/var/lib/kube-proxy"
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
# Its per-node API load, as the policy pack asks a DaemonSet with cluster-wide list/watch to state
# it (kilonode.preflight.apiload). What kube-proxy lists and watches: cmd/kube-proxy/app/server.go
# (one informer factory for Services and EndpointSlices, label-selected with
# service.kubernetes.io/service-proxy-name and service.kubernetes.io/headless DoesNotExist, plus
# ServiceCIDRs under MultiCIDRServiceAllocator; a second factory for Nodes with the field selector
# metadata.name=<hostname>), read in the search index's copies, not at the cluster's tag. Upstream
# accepts this watch: every node must program every Service.
API_LOAD_BUDGET = (
    "Services, EndpointSlices and ServiceCIDRs of the whole cluster: every node programs every Service, "
    "so each kube-proxy lists them once at start, then watches (label-selected: Services with a "
    "service-proxy-name label and the EndpointSlices of headless Services left out); Nodes: its own only "
    "(fieldSelector metadata.name). EndpointSlices, not Endpoints: the N^2 Endpoints watch of the 2,500-node "
    "clusters cut about 1000x (system:node-proxier still grants Endpoints; kube-proxy does not read them). "
    "Bounded: the configSyncPeriod resync (15m default) replays its local cache, not the apiserver; it "
    "re-lists only after a broken watch; its requests fall in the kilonode-node-agents priority level."
)


@dataclass(frozen=True)
class KubeProxyArgs:
    endpoint: str  # https://<load balancer>:6443
    image: str  # the plan's kube-proxy image: the cluster's own version


def proxy_config() -> dict[str, object]:
    """KubeProxyConfiguration (kubeproxy.config.k8s.io/v1alpha1; field names from
    staging/src/k8s.io/kube-proxy/config/v1alpha1/types.go)."""
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": f"{CONFIG_DIR}/kubeconfig.conf"},
        "mode": defaults.KUBE_PROXY_MODE,
        "detectLocalMode": "InterfaceNamePrefix",
        "detectLocal": {"interfaceNamePrefix": defaults.KUBE_PROXY_POD_INTERFACE_PREFIX},
        # Both unauthenticated, and no one off the node reads either (catalog/listeners.yaml
        # kube-proxy-metrics, kube-proxy-healthz): no scrape job reads the metrics, and Azure's
        # load balancers probe the health port only in cloud-provider-azure's `shared` probe mode,
        # which kilonode does not set. On loopback, no pod reaches them (0.0.0.0, every pod did).
        "metricsBindAddress": "127.0.0.1:10249",
        "healthzBindAddress": "127.0.0.1:10256",
        # NodePorts only on the node's primary address, never on pod-facing interfaces.
        "nodePortAddresses": ["primary"],
    }


def proxy_kubeconfig(endpoint: str) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "default", "cluster": {"server": endpoint,
                                                     "certificate-authority": f"{SA_DIR}/ca.crt"}}],
        "users": [{"name": "kube-proxy", "user": {"tokenFile": f"{SA_DIR}/token"}}],
        "contexts": [{"name": "default", "context": {"cluster": "default", "user": "kube-proxy",
                                                     "namespace": "default"}}],
        "current-context": "default",
    }


def _container(image: str) -> core.v1.ContainerArgs:
    """kube-proxy's one container: privileged on the host network, ready while it syncs its node's rules."""
    return core.v1.ContainerArgs(
        name="kube-proxy",
        image=image,
        command=["/usr/local/bin/kube-proxy", f"--config={CONFIG_DIR}/config.conf",
                 "--hostname-override=$(NODE_NAME)"],
        env=[core.v1.EnvVarArgs(name="NODE_NAME", value_from=core.v1.EnvVarSourceArgs(
            field_ref=core.v1.ObjectFieldSelectorArgs(field_path="spec.nodeName")))],
        security_context=core.v1.SecurityContextArgs(privileged=True),
        # not ready while it no longer syncs the node's rules (defaults.KUBE_PROXY_READY_PATH)
        readiness_probe=core.v1.ProbeArgs(
            http_get=core.v1.HTTPGetActionArgs(
                host=defaults.KUBE_PROXY_HEALTH_HOST, port=defaults.KUBE_PROXY_HEALTH_PORT,
                path=defaults.KUBE_PROXY_READY_PATH, scheme="HTTP"),
            period_seconds=defaults.KUBE_PROXY_READY_PERIOD_S,
            failure_threshold=defaults.KUBE_PROXY_READY_FAILURES, timeout_seconds=5),
        resources=core.v1.ResourceRequirementsArgs(requests={"cpu": "100m", "memory": "64Mi"}),
        volume_mounts=[
            core.v1.VolumeMountArgs(name="kube-proxy", mount_path=CONFIG_DIR, read_only=True),
            core.v1.VolumeMountArgs(name="xtables-lock", mount_path="/run/xtables.lock"),
            core.v1.VolumeMountArgs(name="lib-modules", mount_path="/lib/modules", read_only=True),
        ],
    )


class KubeProxy(pulumi.ComponentResource):
    def __init__(self, name: str, args: KubeProxyArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("kilonode:k8s:KubeProxy", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        account = core.v1.ServiceAccount(
            f"{name}-sa", metadata=meta.v1.ObjectMetaArgs(name="kube-proxy", namespace=KUBE_SYSTEM, labels=LABELS),
            opts=child,
        )
        rbac.v1.ClusterRoleBinding(
            f"{name}-binding",
            metadata=meta.v1.ObjectMetaArgs(name="kilonode:node-proxier", labels=LABELS),
            role_ref=rbac.v1.RoleRefArgs(api_group=RBAC_GROUP, kind="ClusterRole", name="system:node-proxier"),
            subjects=[rbac.v1.SubjectArgs(kind="ServiceAccount", name=account.metadata.name, namespace=KUBE_SYSTEM)],
            opts=child,
        )
        data = {
            "config.conf": plain_yaml(proxy_config()),
            "kubeconfig.conf": plain_yaml(proxy_kubeconfig(args.endpoint)),
        }
        config = core.v1.ConfigMap(
            f"{name}-config",
            metadata=meta.v1.ObjectMetaArgs(name="kube-proxy", namespace=KUBE_SYSTEM, labels=LABELS),
            data=data,
            opts=child,
        )
        apps.v1.DaemonSet(
            f"{name}-daemonset",
            # on every node: not waited for (kilonode.k8s.pods.SKIP_AWAIT says why)
            metadata=meta.v1.ObjectMetaArgs(name="kube-proxy", namespace=KUBE_SYSTEM, labels=LABELS,
                                            annotations={**SKIP_AWAIT, API_LOAD_BUDGET_ANNOTATION: API_LOAD_BUDGET}),
            spec=apps.v1.DaemonSetSpecArgs(
                selector=meta.v1.LabelSelectorArgs(match_labels={"k8s-app": "kube-proxy"}),
                update_strategy=apps.v1.DaemonSetUpdateStrategyArgs(
                    type="RollingUpdate",
                    rolling_update=apps.v1.RollingUpdateDaemonSetArgs(
                        max_unavailable=defaults.KUBE_PROXY_MAX_UNAVAILABLE)),
                template=core.v1.PodTemplateSpecArgs(
                    # Rolls on a config change (kilonode.k8s.pods.CONFIG_DIGEST_ANNOTATION): kube-proxy
                    # reads --config once, in Options.Complete (cmd/kube-proxy/app/options.go,
                    # loadConfigFromFile), and its watcher acts only on an fsnotify Write or Rename of
                    # the file (Options.eventHandler, then exits for a restart), while a ConfigMap
                    # volume's update is a symlink swap that gives Chmod/Remove instead
                    # (kubernetes/kubernetes#86869, #94022): a running kube-proxy never applies it.
                    metadata=meta.v1.ObjectMetaArgs(labels=LABELS, annotations=config_digest_annotation(data)),
                    spec=system_pod_spec(
                        "node",
                        service_account=account,
                        host_network=True,
                        tolerations=tolerate_every_taint(),
                        containers=[_container(args.image)],
                        volumes=[
                            core.v1.VolumeArgs(name="kube-proxy", config_map=core.v1.ConfigMapVolumeSourceArgs(
                                name=config.metadata.name)),
                            core.v1.VolumeArgs(name="xtables-lock", host_path=core.v1.HostPathVolumeSourceArgs(
                                path="/run/xtables.lock", type="FileOrCreate")),
                            core.v1.VolumeArgs(name="lib-modules", host_path=core.v1.HostPathVolumeSourceArgs(
                                path="/lib/modules")),
                        ],
                    ),
                ),
            ),
            opts=child,
        )
        self.register_outputs({})
