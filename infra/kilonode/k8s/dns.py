"""ClusterDns: CoreDNS as the `kube-dns` Service at the plan's cluster DNS address (the
kubelets' clusterDNS), after kubernetes/kubernetes cluster/addons/dns/coredns: its RBAC,
Corefile and probes; with required anti-affinity on the host name (one replica per VM, the
2,500-node lesson).

Its replicas follow the nodes it may run on, as Kubernetes' dns-horizontal-autoscaler addon and
AKS's coredns-autoscaler do: the cluster-proportional-autoscaler (catalogue dnsAutoscaler) in
linear mode, counting only the Ready nodes CoreDNS may be scheduled on (the plan's
components.dns_autoscale: its --nodelabels selector and nodes per replica), so that every
replica it asks for has a node of its own. The Deployment therefore names no `replicas`
(upstream's coredns.yaml.base does the same, "Will be tuned in real time if DNS horizontal
auto-scaling is turned on"): `pulumi up` never sets them back, and its await waits for what the
autoscaler asks of the nodes that exist, not for the plan's full count (the plan's
dns_replicas, the autoscaler's max), which needs nodes of later join waves."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pulumi
from pulumi_kubernetes import apps, core, meta, policy, rbac

from kilonode.k8s.bootstrap import KUBE_SYSTEM, RBAC_GROUP
from kilonode.k8s.pod_security import NONROOT_USER, container_security_context
from kilonode.k8s.pods import awaited, system_pod_spec, tolerate_critical_addons
from kilonode.plan.model import AwaitsPlan, DnsAutoscalePlan

APP = "kube-dns"  # the label every DNS client and NetworkPolicy expects
LABELS = {"k8s-app": APP, "app.kubernetes.io/managed-by": "kilonode"}
DEPLOYMENT = "coredns"
AUTOSCALER = "coredns-autoscaler"
AUTOSCALER_LABELS = {"k8s-app": AUTOSCALER, "app.kubernetes.io/managed-by": "kilonode"}
# The autoscaler image's user (cluster-proportional-autoscaler Dockerfile.in: USER 65535:65535).
AUTOSCALER_USER = 65535
# How often it counts the nodes (its default --poll-period-seconds is 10).
AUTOSCALER_POLL_S = 10
AUTOSCALER_HEALTH_PORT = 8080

# The Corefile of the upstream addon, with the cluster's domain. No config digest on CoreDNS's pod
# template (kilonode.k8s.pods.CONFIG_DIGEST_ANNOTATION), on purpose: its `reload` plugin re-reads
# the mounted file on its own (coredns plugin/reload/reload.go hook: every interval, 30s by default
# with 15s jitter, setup.go, it checksums the Corefile and on a change restarts the server inside
# the process, keeping the old config if the new one fails), so a Corefile change reaches every
# replica within the kubelet's volume sync plus that interval; rolling CoreDNS for it would take
# replicas out of the cluster's DNS for nothing.
COREFILE = """.:53 {
    errors
    health {
       lameduck 5s
    }
    ready
    kubernetes {cluster_domain} in-addr.arpa ip6.arpa {
       pods insecure
       fallthrough in-addr.arpa ip6.arpa
       ttl 30
    }
    prometheus :9153
    forward . /etc/resolv.conf {
       max_concurrent 1000
    }
    cache 30
    loop
    reload
    loadbalance
}
"""


@dataclass(frozen=True)
class ClusterDnsArgs:
    dns_ip: str  # the plan's cluster DNS address (the kubelets' clusterDNS)
    autoscale: DnsAutoscalePlan  # the plan's (components): how the replicas follow the nodes
    image: str  # the plan's (components)
    autoscaler_image: str  # the plan's (components)
    awaits: AwaitsPlan  # the plan's (components): how long `pulumi up` waits for the replicas and the Service
    cluster_domain: str = "cluster.local"


def _pod_spec(args: ClusterDnsArgs, account: core.v1.ServiceAccount, config: core.v1.ConfigMap) -> core.v1.PodSpecArgs:
    """CoreDNS's pod: the Corefile from `config`, one replica per node."""
    return system_pod_spec(
        "cluster",
        service_account=account,
        system_pool=True,
        dns_policy="Default",  # CoreDNS itself resolves through the node
        tolerations=tolerate_critical_addons(),
        # Field notes (2,500 nodes): one replica per VM, never packed.
        affinity=core.v1.AffinityArgs(pod_anti_affinity=core.v1.PodAntiAffinityArgs(
            required_during_scheduling_ignored_during_execution=[core.v1.PodAffinityTermArgs(
                label_selector=meta.v1.LabelSelectorArgs(match_labels={"k8s-app": APP}),
                topology_key="kubernetes.io/hostname",
            )],
        )),
        containers=[core.v1.ContainerArgs(
            name="coredns",
            image=args.image,
            args=["-conf", "/etc/coredns/Corefile"],
            ports=[
                core.v1.ContainerPortArgs(name="dns", container_port=53, protocol="UDP"),
                core.v1.ContainerPortArgs(name="dns-tcp", container_port=53, protocol="TCP"),
                core.v1.ContainerPortArgs(name="metrics", container_port=9153, protocol="TCP"),
            ],
            resources=core.v1.ResourceRequirementsArgs(
                requests={"cpu": "100m", "memory": "70Mi"}, limits={"memory": "170Mi"}),
            liveness_probe=core.v1.ProbeArgs(
                http_get=core.v1.HTTPGetActionArgs(path="/health", port=8080),
                initial_delay_seconds=60, timeout_seconds=5, failure_threshold=5),
            readiness_probe=core.v1.ProbeArgs(
                http_get=core.v1.HTTPGetActionArgs(path="/ready", port=8181)),
            # Upstream's (cluster/addons/dns/coredns): read-only, every capability dropped but
            # NET_BIND_SERVICE for port 53. The image's user is `USER nonroot:nonroot`
            # (coredns/coredns Dockerfile at v1.12.1: FROM gcr.io/distroless/static-debian12:nonroot),
            # a name the kubelet cannot check runAsNonRoot against: its UID, 65532, is named here.
            security_context=container_security_context(NONROOT_USER, add_capabilities=["NET_BIND_SERVICE"]),
            volume_mounts=[core.v1.VolumeMountArgs(name="config", mount_path="/etc/coredns",
                                                   read_only=True)],
        )],
        volumes=[core.v1.VolumeArgs(
            name="config",
            config_map=core.v1.ConfigMapVolumeSourceArgs(
                name=config.metadata.name,
                items=[core.v1.KeyToPathArgs(key="Corefile", path="Corefile")]),
        )],
    )


class ClusterDns(pulumi.ComponentResource):
    def __init__(self, name: str, args: ClusterDnsArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("kilonode:k8s:ClusterDns", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        account = core.v1.ServiceAccount(
            f"{name}-sa", metadata=meta.v1.ObjectMetaArgs(name=DEPLOYMENT, namespace=KUBE_SYSTEM, labels=LABELS),
            opts=child,
        )
        role = rbac.v1.ClusterRole(
            f"{name}-role",
            metadata=meta.v1.ObjectMetaArgs(name="system:coredns", labels=LABELS),
            rules=[
                rbac.v1.PolicyRuleArgs(api_groups=[""], resources=["endpoints", "services", "pods", "namespaces"],
                                       verbs=["list", "watch"]),
                rbac.v1.PolicyRuleArgs(api_groups=["discovery.k8s.io"], resources=["endpointslices"],
                                       verbs=["list", "watch"]),
            ],
            opts=child,
        )
        rbac.v1.ClusterRoleBinding(
            f"{name}-binding",
            metadata=meta.v1.ObjectMetaArgs(name="system:coredns", labels=LABELS),
            role_ref=rbac.v1.RoleRefArgs(api_group=RBAC_GROUP, kind="ClusterRole", name=role.metadata.name),
            subjects=[rbac.v1.SubjectArgs(kind="ServiceAccount", name=account.metadata.name, namespace=KUBE_SYSTEM)],
            opts=child,
        )
        config = core.v1.ConfigMap(
            f"{name}-corefile",
            metadata=meta.v1.ObjectMetaArgs(name=DEPLOYMENT, namespace=KUBE_SYSTEM, labels=LABELS),
            data={"Corefile": COREFILE.replace("{cluster_domain}", args.cluster_domain)},
            opts=child,
        )
        selector = {"k8s-app": APP}
        # Both wait for replicas on pool nodes (every replica: the Deployment; one ready
        # endpoint: the Service), which a first run is still creating.
        on_nodes = awaited(child, args.awaits)
        apps.v1.Deployment(
            f"{name}-deployment",
            metadata=meta.v1.ObjectMetaArgs(name=DEPLOYMENT, namespace=KUBE_SYSTEM, labels=LABELS),
            spec=apps.v1.DeploymentSpecArgs(
                # no replicas: the autoscaler's (the module docstring)
                selector=meta.v1.LabelSelectorArgs(match_labels=selector),
                strategy=apps.v1.DeploymentStrategyArgs(
                    type="RollingUpdate",
                    rolling_update=apps.v1.RollingUpdateDeploymentArgs(max_unavailable=1, max_surge=0)),
                template=core.v1.PodTemplateSpecArgs(
                    # no config digest on purpose: the Corefile's `reload` applies a change (COREFILE)
                    metadata=meta.v1.ObjectMetaArgs(labels=LABELS),
                    spec=_pod_spec(args, account, config),
                ),
            ),
            opts=on_nodes,
        )
        policy.v1.PodDisruptionBudget(
            f"{name}-pdb",
            metadata=meta.v1.ObjectMetaArgs(name=DEPLOYMENT, namespace=KUBE_SYSTEM, labels=LABELS),
            spec=policy.v1.PodDisruptionBudgetSpecArgs(
                max_unavailable=1, selector=meta.v1.LabelSelectorArgs(match_labels=selector)),
            opts=child,
        )
        core.v1.Service(
            f"{name}-service",
            metadata=meta.v1.ObjectMetaArgs(name=APP, namespace=KUBE_SYSTEM, labels=LABELS),
            spec=core.v1.ServiceSpecArgs(
                selector=selector,
                cluster_ip=args.dns_ip,
                ports=[
                    core.v1.ServicePortArgs(name="dns", port=53, protocol="UDP", target_port=53),
                    core.v1.ServicePortArgs(name="dns-tcp", port=53, protocol="TCP", target_port=53),
                    core.v1.ServicePortArgs(name="metrics", port=9153, protocol="TCP", target_port=9153),
                ],
            ),
            opts=on_nodes,
        )
        _autoscaler(name, args, child, on_nodes)
        self.register_outputs({})


def _autoscaler(name: str, args: ClusterDnsArgs, child: pulumi.ResourceOptions,
                on_nodes: pulumi.ResourceOptions) -> None:
    """The cluster-proportional-autoscaler that sets CoreDNS's replicas: its RBAC, its parameters
    and itself on the system pool."""
    account = _autoscaler_access(name, child)
    plan = args.autoscale
    params = core.v1.ConfigMap(
        f"{name}-autoscaler-params",
        metadata=meta.v1.ObjectMetaArgs(name=AUTOSCALER, namespace=KUBE_SYSTEM, labels=AUTOSCALER_LABELS),
        # linear mode (linear_controller.go): replicas = ceil(nodes / nodesPerReplica) within
        # [min, max], over the Ready, schedulable nodes --nodelabels selects
        data={"linear": json.dumps({
            "nodesPerReplica": plan.nodes_per_replica,
            "min": plan.min_replicas,
            "max": plan.max_replicas,
            "preventSinglePointFailure": True,
            "includeUnschedulableNodes": False,
        }, sort_keys=True)},
        opts=child,
    )
    selector = {"k8s-app": AUTOSCALER}
    apps.v1.Deployment(
        f"{name}-autoscaler",
        metadata=meta.v1.ObjectMetaArgs(name=AUTOSCALER, namespace=KUBE_SYSTEM, labels=AUTOSCALER_LABELS),
        spec=apps.v1.DeploymentSpecArgs(
            replicas=1,  # it acts on each poll: a restart loses nothing
            selector=meta.v1.LabelSelectorArgs(match_labels=selector),
            template=core.v1.PodTemplateSpecArgs(
                # No config digest: it mounts no ConfigMap; it GETs its parameters from the API on
                # every poll (pkg/autoscaler/autoscaler_server.go pollAPIServer -> syncConfigWithServer
                # -> FetchConfigMap), so a change applies within AUTOSCALER_POLL_S without a restart.
                metadata=meta.v1.ObjectMetaArgs(labels=AUTOSCALER_LABELS),
                spec=system_pod_spec(
                    "cluster",
                    service_account=account,
                    system_pool=True,
                    tolerations=tolerate_critical_addons(),
                    containers=[core.v1.ContainerArgs(
                        name="autoscaler",
                        image=args.autoscaler_image,
                        args=[
                            f"--namespace={KUBE_SYSTEM}",
                            f"--configmap={AUTOSCALER}",
                            f"--target=deployment/{DEPLOYMENT}",
                            f"--nodelabels={plan.node_selector}",
                            f"--poll-period-seconds={AUTOSCALER_POLL_S}",
                            "--logtostderr=true",
                            "--v=2",
                        ],
                        resources=core.v1.ResourceRequirementsArgs(
                            requests={"cpu": "20m", "memory": "10Mi"}, limits={"memory": "64Mi"}),
                        # its health server: /healthz on :8080 (pkg/autoscaler/health.go l.63-66 at
                        # v1.10.1), as upstream's chart probes it
                        liveness_probe=core.v1.ProbeArgs(http_get=core.v1.HTTPGetActionArgs(
                            path="/healthz", port=AUTOSCALER_HEALTH_PORT)),
                        readiness_probe=core.v1.ProbeArgs(http_get=core.v1.HTTPGetActionArgs(
                            path="/healthz", port=AUTOSCALER_HEALTH_PORT)),
                        security_context=container_security_context(AUTOSCALER_USER),
                    )],
                ),
            ),
        ),
        opts=pulumi.ResourceOptions.merge(on_nodes, pulumi.ResourceOptions(depends_on=[params])),
    )


def _autoscaler_access(name: str, child: pulumi.ResourceOptions) -> core.v1.ServiceAccount:
    """The autoscaler's ServiceAccount and RBAC: upstream's examples/RBAC/RBAC-configs.yaml,
    narrowed to the one ConfigMap and Deployment it reads and scales (the ConfigMap exists, so
    it never creates one)."""
    account = core.v1.ServiceAccount(
        f"{name}-autoscaler-sa",
        metadata=meta.v1.ObjectMetaArgs(name=AUTOSCALER, namespace=KUBE_SYSTEM, labels=AUTOSCALER_LABELS),
        opts=child,
    )
    nodes = rbac.v1.ClusterRole(
        f"{name}-autoscaler-nodes",
        metadata=meta.v1.ObjectMetaArgs(name=f"kilonode:{AUTOSCALER}", labels=AUTOSCALER_LABELS),
        rules=[rbac.v1.PolicyRuleArgs(api_groups=[""], resources=["nodes"], verbs=["list", "watch"])],
        opts=child,
    )
    subject = rbac.v1.SubjectArgs(kind="ServiceAccount", name=account.metadata.name, namespace=KUBE_SYSTEM)
    rbac.v1.ClusterRoleBinding(
        f"{name}-autoscaler-nodes-binding",
        metadata=meta.v1.ObjectMetaArgs(name=f"kilonode:{AUTOSCALER}", labels=AUTOSCALER_LABELS),
        role_ref=rbac.v1.RoleRefArgs(api_group=RBAC_GROUP, kind="ClusterRole", name=nodes.metadata.name),
        subjects=[subject],
        opts=child,
    )
    scale = rbac.v1.Role(
        f"{name}-autoscaler-scale",
        metadata=meta.v1.ObjectMetaArgs(name=AUTOSCALER, namespace=KUBE_SYSTEM, labels=AUTOSCALER_LABELS),
        rules=[
            rbac.v1.PolicyRuleArgs(api_groups=["apps"], resources=["deployments/scale"],
                                   resource_names=[DEPLOYMENT], verbs=["get", "update"]),
            rbac.v1.PolicyRuleArgs(api_groups=[""], resources=["configmaps"],
                                   resource_names=[AUTOSCALER], verbs=["get"]),
        ],
        opts=child,
    )
    rbac.v1.RoleBinding(
        f"{name}-autoscaler-scale-binding",
        metadata=meta.v1.ObjectMetaArgs(name=AUTOSCALER, namespace=KUBE_SYSTEM, labels=AUTOSCALER_LABELS),
        role_ref=rbac.v1.RoleRefArgs(api_group=RBAC_GROUP, kind="Role", name=scale.metadata.name),
        subjects=[subject],
        opts=child,
    )
    return account
