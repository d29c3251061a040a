"""InCluster: the in-cluster component tree, on a Kubernetes provider built from the
cluster's own outputs, behind the apiserver readiness gate."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pulumi
import pulumi_kubernetes as k8s

from kilonode.k8s.alertmanager import Alertmanager, AlertmanagerArgs
from kilonode.k8s.approver import ServingCertApprover, ServingCertApproverArgs
from kilonode.k8s.autoscaler import ClusterAutoscaler, ClusterAutoscalerArgs
from kilonode.k8s.bootstrap import NodeBootstrap, NodeBootstrapArgs
from kilonode.k8s.calico import Calico, CalicoArgs
from kilonode.k8s.capacity import NAMESPACE as CAPACITY_NAMESPACE
from kilonode.k8s.capacity import Capacity, CapacityArgs
from kilonode.k8s.cloud_provider import AzureTarget, CloudProvider, CloudProviderArgs
from kilonode.k8s.dns import ClusterDns, ClusterDnsArgs
from kilonode.k8s.exporters import Exporters, ExportersArgs
from kilonode.k8s.flowcontrol import ApiProtection, ApiProtectionArgs
from kilonode.k8s.gpu import DevicePlugin, DevicePluginArgs, GpuHealthAccess
from kilonode.k8s.grafana import Grafana, GrafanaArgs
from kilonode.k8s.metrics_server import MetricsServer, MetricsServerArgs
from kilonode.k8s.monitoring import NAMESPACE as MONITORING_NAMESPACE
from kilonode.k8s.monitoring import Monitoring, MonitoringArgs
from kilonode.k8s.network_policy import KUBE_SYSTEM_INGRESS, KubeSystemPolicies
from kilonode.k8s.pod_security import KubeSystemPodSecurity
from kilonode.k8s.proxy import KubeProxy, KubeProxyArgs
from kilonode.k8s.rdma import RdmaDevicePlugin, RdmaDevicePluginArgs
from kilonode.k8s.readiness import ApiserverReady, ApiserverReadyArgs
from kilonode.k8s.reserved_pools import ReservedPools
from kilonode.k8s.scheduling import GangScheduler, GangSchedulerArgs
from kilonode.k8s.service_accounts import DefaultServiceAccounts, DefaultServiceAccountsArgs
from kilonode.k8s.storage import Storage, StorageArgs
from kilonode.plan.model import ClusterPlan


@dataclass(frozen=True)
class InClusterArgs:
    plan: ClusterPlan
    kubeconfig: pulumi.Output[str]  # secret: the program's own (super-admin) credentials
    # the apiserver as the machine running `pulumi up` reaches it (kilonode.azure.control_plane)
    endpoint: pulumi.Input[str]
    # (pool, generation) -> each join token's id and secret (secret): kilonode.azure.tls
    join_tokens: Mapping[tuple[str, str | None, int], tuple[pulumi.Output[str], pulumi.Output[str]]]
    cloud_target: pulumi.Output[AzureTarget]  # where the cloud provider acts (azure.json)
    # the rule file and scrape fragment for the user's Prometheus, rendered by the caller
    # (kilonode.render.monitoring.monitoring_files)
    monitoring_files: Mapping[str, str]
    # What the apiserver's answer needs, as outputs (the load balancers' and the apiservers' image's
    # IDs, kilonode.azure.control_plane.ControlPlane.ready_after; the deployer's peerings' IDs): the
    # readiness check, and with it the provider and every object below, depends on those
    # resources and on no apiserver VM or NIC, so one apiserver is replaced at a time without
    # touching anything here (kilonode.k8s.readiness).
    after: Sequence[pulumi.Input[str]] = ()
    # the dashboards' JSON for Grafana (kilonode.render.dashboards.dashboard_files), rendered by the caller
    dashboard_files: Mapping[str, str] = field(default_factory=dict)
    # alertmanager.yml (kilonode.render.alertmanager.alertmanager_files), rendered by the caller, and the
    # receivers' secrets it names as files (kilonode.k8s.alertmanager.read_secrets)
    alertmanager_files: Mapping[str, str] = field(default_factory=dict)
    alerting_secrets: Mapping[str, pulumi.Input[str]] = field(default_factory=dict)


class InCluster(pulumi.ComponentResource):
    provider: k8s.Provider

    def __init__(self, name: str, args: InClusterArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("kilonode:k8s:InCluster", name, None, opts)
        plan = args.plan
        ready = ApiserverReady(
            f"{name}-apiserver-ready",
            ApiserverReadyArgs(endpoint=args.endpoint, kubeconfig=args.kubeconfig, after=args.after),
            pulumi.ResourceOptions(parent=self),
        )
        self.provider = k8s.Provider(
            f"{name}-provider",
            kubeconfig=args.kubeconfig,
            # A stable identity: a renewed certificate in the kubeconfig must not replace the
            # provider, and with it every object it manages.
            cluster_identifier=plan.cluster,
            opts=pulumi.ResourceOptions(parent=self, depends_on=[ready]),
        )
        # kube-system's PodSecurity labels first; every pod creator below waits for them
        kube_system = KubeSystemPodSecurity(f"{name}-kube-system-pod-security", plan.kubernetes_minor,
                                            pulumi.ResourceOptions(parent=self, provider=self.provider))
        on_cluster = pulumi.ResourceOptions(parent=self, provider=self.provider,
                                            transformations=[kube_system.after_labels])
        NodeBootstrap(
            f"{name}-node-bootstrap",
            NodeBootstrapArgs(tokens=plan.join_tokens, values=args.join_tokens, admin_generation=plan.admin_generation),
            on_cluster,
        )
        ServingCertApprover(
            f"{name}-serving-cert-approver",
            ServingCertApproverArgs(
                cluster=plan.cluster,
                pools=[p.name for p in plan.node_pools],
                pool_subnets=[str(p.subnet) for p in plan.node_pools],
                image=plan.components.serving_cert_approver_image,
                awaits=plan.components.awaits,
                replica_pools=[p.name for p in plan.controller_pools],
                system_pools=bool(plan.system_pools),
            ),
            on_cluster,
        )
        KubeProxy(f"{name}-kube-proxy", KubeProxyArgs(endpoint=plan.control_plane.endpoint,
                                                      image=plan.components.kube_proxy_image), on_cluster)
        _network_policy(name, plan, on_cluster)
        ClusterDns(
            f"{name}-dns",
            ClusterDnsArgs(dns_ip=str(plan.control_plane.cluster_dns_ip), autoscale=plan.components.dns_autoscale,
                           image=plan.components.coredns_image, autoscaler_image=plan.components.dns_autoscaler_image,
                           awaits=plan.components.awaits),
            on_cluster,
        )
        CloudProvider(f"{name}-cloud-provider", CloudProviderArgs(plan=plan, target=args.cloud_target), on_cluster)
        _metrics(name, plan, on_cluster)  # metrics-server (kubectl top, HPAs), the exporters Prometheus scrapes
        Storage(f"{name}-storage", StorageArgs(plan, args.cloud_target), on_cluster)  # Azure Disk CSI, its class
        # GPU pools: the device plugin on their nodes, and the taint controller's access
        # (the controller itself runs on the apiserver VMs). None without GPU pools.
        if plan.gpu_pools:
            DevicePlugin(f"{name}-device-plugin", DevicePluginArgs(pools=[p.name for p in plan.gpu_pools],
                                                                  image=plan.components.device_plugin_image),
                         on_cluster)
            GpuHealthAccess(f"{name}-gpu-health", on_cluster)
        # InfiniBand pools: their HCAs into pods as rdma/ib (kilonode.k8s.rdma). None without them.
        infiniband = [p.name for p in plan.node_pools if p.infiniband]
        if infiniband:
            RdmaDevicePlugin(f"{name}-rdma", RdmaDevicePluginArgs(pools=infiniband,
                                                                image=plan.components.rdma_device_plugin_image),
                             on_cluster)
        # The 7,500-node lessons inside the cluster (one component each):
        # [scheduling] gang scheduling: a second scheduler with Coscheduling (kilonode.k8s.scheduling)
        GangScheduler(f"{name}-gang", GangSchedulerArgs.of(plan), on_cluster)
        # [flow-control] API Priority and Fairness: per-node agents and monitoring agents in their
        # own limited priority levels (kilonode.k8s.flowcontrol)
        ApiProtection(f"{name}-api-protection", ApiProtectionArgs(), on_cluster)
        # [monitoring] the cluster's Prometheus with the rules and scrape jobs (kilonode.k8s.monitoring),
        # [capacity] priorities, borrowing, balloons (kilonode.k8s.capacity); every namespace's default
        # account tokenless
        _namespaced(name, plan, args, on_cluster)
        # [autoscaler] cluster-autoscaler on the pools with `autoscaling`, node groups and guards from
        # the plan (kilonode.k8s.autoscaler). None without autoscaled pools.
        if plan.autoscaled_pools:
            ClusterAutoscaler(f"{name}-autoscaler", ClusterAutoscalerArgs(plan, args.cloud_target), on_cluster)
        self.register_outputs({})


def _metrics(name: str, plan: ClusterPlan, on_cluster: pulumi.ResourceOptions) -> None:
    """The resource metrics API (kilonode.k8s.metrics_server: kubectl top, HPAs), and node-exporter,
    dcgm-exporter on the GPU pools and kube-state-metrics (kilonode.k8s.exporters)."""
    MetricsServer(f"{name}-metrics-server", MetricsServerArgs.of(plan), on_cluster)
    Exporters(f"{name}-exporters", ExportersArgs.of(plan), on_cluster)


def _network_policy(name: str, plan: ClusterPlan, on_cluster: pulumi.ResourceOptions) -> None:
    """[network-policy] the NetworkPolicy engine on every node (kilonode.k8s.calico), and what each
    kube-system pod-network workload admits (kilonode.k8s.network_policy)."""
    Calico(f"{name}-calico", CalicoArgs.of(plan), on_cluster)
    KubeSystemPolicies(f"{name}-kube-system-policies", [w for w, _, _ in KUBE_SYSTEM_INGRESS],
                       [str(i.ip) for i in plan.control_plane.instances], on_cluster)


def _namespaced(name: str, plan: ClusterPlan, args: InClusterArgs, on_cluster: pulumi.ResourceOptions) -> None:
    """Monitoring and Capacity, which create kilonode's namespaces, then the default
    ServiceAccount of those and the built-in namespaces without a token (CIS 5.1.5,
    kilonode.k8s.service_accounts): a patch per namespace, after the Namespace kilonode creates;
    and the reserved pools, which hold the pods of kube-system and Prometheus's namespace alone, so
    that their subnets name the cluster's own workloads (kilonode.k8s.reserved_pools)."""
    ReservedPools(f"{name}-reserved-pools", plan, on_cluster)
    monitoring = Monitoring(f"{name}-monitoring", MonitoringArgs(
        files=args.monitoring_files, kubernetes_minor=plan.kubernetes_minor, prometheus=plan.prometheus,
        image=plan.components.prometheus_image, awaits=plan.components.awaits), on_cluster)
    if plan.prometheus is not None and args.dashboard_files:  # Grafana beside it (kilonode.k8s.grafana)
        Grafana(f"{name}-grafana", GrafanaArgs(dashboards=args.dashboard_files, prometheus=plan.prometheus,
                                               image=plan.components.grafana_image, awaits=plan.components.awaits),
                monitoring.namespace, on_cluster)
    if plan.prometheus is not None and args.alertmanager_files:  # where its alerts go (kilonode.k8s.alertmanager)
        Alertmanager(f"{name}-alertmanager", AlertmanagerArgs(
            files=args.alertmanager_files, prometheus=plan.prometheus, alerting=plan.alerting,
            image=plan.components.alertmanager_image, awaits=plan.components.awaits, secrets=args.alerting_secrets),
            monitoring.namespace, on_cluster)
    capacity = Capacity(f"{name}-capacity", CapacityArgs(plan=plan), on_cluster)
    own: dict[str, pulumi.Resource] = {MONITORING_NAMESPACE: monitoring.namespace}
    if capacity.namespace is not None:
        own[CAPACITY_NAMESPACE] = capacity.namespace
    DefaultServiceAccounts(f"{name}-default-service-accounts", DefaultServiceAccountsArgs(own=own), on_cluster)
