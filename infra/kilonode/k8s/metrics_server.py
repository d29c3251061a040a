"""MetricsServer: the resource metrics API (metrics.k8s.io), which `kubectl top`, every
HorizontalPodAutoscaler and the VerticalPodAutoscaler read: kubernetes-sigs/metrics-server's own
manifests at the pinned tag (manifests/base: its RBAC, Service, APIService and Deployment, with
their args, probes and security context; manifests/components/high-availability: two replicas, one
per node, a PodDisruptionBudget), on the system pool.

The path of one request, and what kilonode provides for each step:
- the apiserver authorises the user, then proxies to a metrics-server pod's IP (the apiservers run
  no kube-proxy: --enable-aggregator-routing) with its front-proxy client certificate and the user
  in X-Remote-* headers (kilonode.render.control_plane, kilonode.plan.pki: the front-proxy CA);
  the pools' NSG admits the control-plane subnet to the pod's port (kilonode.azure.network);
- metrics-server checks that certificate against the front-proxy CA it reads from
  kube-system/extension-apiserver-authentication (the auth-reader RoleBinding) and asks the
  apiserver whether the user may (the auth-delegator binding: SubjectAccessReviews);
- it answers from what it scraped every 15 s from each kubelet's /metrics/resource at the node's
  InternalIP, authorised by nodes/metrics (system:metrics-server), verifying the kubelet's serving
  certificate with the cluster CA (--kubelet-certificate-authority: the CA its ServiceAccount
  mounts; the kubelets' serving certificates are signed by that CA and carry their node's IP,
  kilonode.k8s.approver), never --kubelet-insecure-tls.

Kept from upstream: the APIService's insecureSkipTLSVerify. metrics-server serves with a
certificate it signs for itself at start (--cert-dir, an emptyDir): no caBundle can name it.
Verifying it would take a serving certificate issued by the program (a Secret per cluster, its
renewal) and a caBundle; until then the apiserver authenticates itself to metrics-server (the
front-proxy certificate) but does not authenticate metrics-server.
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
from pulumi_kubernetes import apiregistration, apps, core, meta, policy, rbac

from kilonode.k8s.bootstrap import KUBE_SYSTEM, RBAC_GROUP
from kilonode.k8s.pod_security import container_security_context
from kilonode.k8s.pods import awaited, system_pod_spec, tolerate_critical_addons
from kilonode.plan.model import AwaitsPlan, ClusterPlan, MetricsServerPlan

APP = "metrics-server"
LABELS = {"k8s-app": APP, "app.kubernetes.io/managed-by": "kilonode"}
SELECTOR = {"k8s-app": APP}
# The API it serves, as its APIService names it (manifests/base/apiservice.yaml).
GROUP = "metrics.k8s.io"
VERSION = "v1beta1"
# Where it listens: upstream's --secure-port, a pod port (the pod has its own IP: Azure CNI), the
# container port the apiservers dial through the Service's endpoints.
PORT = 10250
PORT_NAME = "https"
# The image's user (metrics-server Dockerfile at v0.8.0: USER 65534). Upstream's manifest sets
# runAsUser 1000; the image's own user is kept, a high UID like the others kilonode runs.
USER = 65534
# Where the pod's ServiceAccount volume puts the cluster CA (kube-controller-manager publishes
# --root-ca-file, the Kubernetes CA, as kube-root-ca.crt in every namespace): the CA that signs the
# kubelets' serving certificates (kube-controller-manager's kubelet-serving signer).
SERVICE_ACCOUNT_CA = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
CERT_DIR = "/tmp"
# The built-in roles it is bound to (the apiserver creates them: bootstrap policy), and the
# user-facing roles that read metrics.k8s.io through its aggregated role.
AUTH_READER = "extension-apiserver-authentication-reader"  # a Role in kube-system
AUTH_DELEGATOR = "system:auth-delegator"
AGGREGATE_TO = ("view", "edit", "admin")


@dataclass(frozen=True)
class MetricsServerArgs:
    plan: MetricsServerPlan  # the plan's (components): replicas, requests, resolution
    image: str  # the plan's (components)
    awaits: AwaitsPlan  # the plan's (components): how long `pulumi up` waits for the replicas

    @classmethod
    def of(cls, plan: ClusterPlan) -> MetricsServerArgs:
        return cls(plan=plan.components.metrics_server, image=plan.components.metrics_server_image,
                   awaits=plan.components.awaits)


def args_of(plan: MetricsServerPlan) -> list[str]:
    """Its command line: upstream's manifest's, with the kubelets reached by their InternalIP only
    (the address their serving certificate names: the approver admits IP SANs in the pool subnets;
    a node's Hostname would need Azure DNS to resolve every scale-set name) and verified with the
    cluster CA."""
    return [
        f"--cert-dir={CERT_DIR}",
        f"--secure-port={PORT}",
        "--kubelet-preferred-address-types=InternalIP",
        "--kubelet-use-node-status-port",
        f"--kubelet-certificate-authority={SERVICE_ACCOUNT_CA}",
        f"--metric-resolution={plan.resolution_s}s",
    ]


def describe(plan: ClusterPlan) -> list[str]:
    """`kilonode explain`'s lines: what it is sized for, and where upstream stops vouching."""
    ms = plan.components.metrics_server
    lines = [f"{ms.replicas} replicas (one per node), each requesting {ms.cpu_millis:,}m CPU and {ms.memory_mib:,} MiB "
             f"for the {ms.nodes:,} nodes it scrapes every {ms.resolution_s} s (upstream's per-node figures)"]
    return lines + ([f"past upstream's envelope: {ms.past_supported}"] if ms.past_supported else [])


class MetricsServer(pulumi.ComponentResource):
    def __init__(self, name: str, args: MetricsServerArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("kilonode:k8s:MetricsServer", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        account = core.v1.ServiceAccount(
            f"{name}-sa", metadata=meta.v1.ObjectMetaArgs(name=APP, namespace=KUBE_SYSTEM, labels=LABELS), opts=child)
        _rbac(name, account, child)
        on_nodes = awaited(child, args.awaits)
        deployment = apps.v1.Deployment(
            f"{name}-deployment",
            metadata=meta.v1.ObjectMetaArgs(name=APP, namespace=KUBE_SYSTEM, labels=LABELS),
            spec=apps.v1.DeploymentSpecArgs(
                replicas=args.plan.replicas,
                selector=meta.v1.LabelSelectorArgs(match_labels=SELECTOR),
                # the high-availability manifest's: one replica at a time (the other serves)
                strategy=apps.v1.DeploymentStrategyArgs(
                    type="RollingUpdate", rolling_update=apps.v1.RollingUpdateDeploymentArgs(max_unavailable=1)),
                template=core.v1.PodTemplateSpecArgs(
                    metadata=meta.v1.ObjectMetaArgs(labels=LABELS), spec=_pod_spec(args, account)),
            ),
            opts=on_nodes,
        )
        policy.v1.PodDisruptionBudget(
            f"{name}-pdb",
            metadata=meta.v1.ObjectMetaArgs(name=APP, namespace=KUBE_SYSTEM, labels=LABELS),
            spec=policy.v1.PodDisruptionBudgetSpecArgs(
                min_available=1, selector=meta.v1.LabelSelectorArgs(match_labels=SELECTOR)),
            opts=child,
        )
        service = core.v1.Service(
            f"{name}-service",
            metadata=meta.v1.ObjectMetaArgs(name=APP, namespace=KUBE_SYSTEM, labels=LABELS),
            spec=core.v1.ServiceSpecArgs(
                selector=SELECTOR,
                ports=[core.v1.ServicePortArgs(name=PORT_NAME, port=443, protocol="TCP", target_port=PORT_NAME,
                                               app_protocol="https")],
            ),
            opts=on_nodes,  # it waits for a ready endpoint, a replica on a pool node
        )
        # Registered once a replica answers: an APIService whose Service has no endpoint makes
        # every discovery list metrics.k8s.io as unavailable (kilonode.plan.defaults.metrics_server).
        apiregistration.v1.APIService(
            f"{name}-apiservice",
            metadata=meta.v1.ObjectMetaArgs(name=f"{VERSION}.{GROUP}", labels=LABELS),
            spec=apiregistration.v1.APIServiceSpecArgs(
                service=apiregistration.v1.ServiceReferenceArgs(name=service.metadata.name, namespace=KUBE_SYSTEM),
                group=GROUP,
                version=VERSION,
                insecure_skip_tls_verify=True,  # its self-signed serving certificate (the module docstring)
                group_priority_minimum=100,
                version_priority=100,
            ),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[deployment, service]),
        )
        self.register_outputs({})


def _rbac(name: str, account: core.v1.ServiceAccount, child: pulumi.ResourceOptions) -> None:
    """manifests/base/rbac.yaml: the metrics readers' aggregated role (view, edit and admin read
    metrics.k8s.io), and its own: the kubelets' metrics, the pods and nodes it lists; the
    apiserver's extension-apiserver-authentication-reader Role and system:auth-delegator ClusterRole
    (built in) for the front-proxy CA and the SubjectAccessReviews."""
    subject = rbac.v1.SubjectArgs(kind="ServiceAccount", name=account.metadata.name, namespace=KUBE_SYSTEM)
    rbac.v1.ClusterRole(
        f"{name}-aggregated-reader",
        metadata=meta.v1.ObjectMetaArgs(name="system:aggregated-metrics-reader", labels={
            **LABELS, **{f"rbac.authorization.k8s.io/aggregate-to-{role}": "true" for role in AGGREGATE_TO}}),
        rules=[rbac.v1.PolicyRuleArgs(api_groups=[GROUP], resources=["pods", "nodes"], verbs=["get", "list", "watch"])],
        opts=child,
    )
    rbac.v1.RoleBinding(
        f"{name}-auth-reader",
        metadata=meta.v1.ObjectMetaArgs(name=f"{APP}-auth-reader", namespace=KUBE_SYSTEM, labels=LABELS),
        role_ref=rbac.v1.RoleRefArgs(api_group=RBAC_GROUP, kind="Role", name=AUTH_READER),
        subjects=[subject],
        opts=child,
    )
    rbac.v1.ClusterRoleBinding(
        f"{name}-auth-delegator",
        metadata=meta.v1.ObjectMetaArgs(name=f"{APP}:system:auth-delegator", labels=LABELS),
        role_ref=rbac.v1.RoleRefArgs(api_group=RBAC_GROUP, kind="ClusterRole", name=AUTH_DELEGATOR),
        subjects=[subject],
        opts=child,
    )
    role = rbac.v1.ClusterRole(
        f"{name}-role",
        metadata=meta.v1.ObjectMetaArgs(name=f"system:{APP}", labels=LABELS),
        rules=[
            rbac.v1.PolicyRuleArgs(api_groups=[""], resources=["nodes/metrics"], verbs=["get"]),
            rbac.v1.PolicyRuleArgs(api_groups=[""], resources=["pods", "nodes"], verbs=["get", "list", "watch"]),
        ],
        opts=child,
    )
    rbac.v1.ClusterRoleBinding(
        f"{name}-binding",
        metadata=meta.v1.ObjectMetaArgs(name=f"system:{APP}", labels=LABELS),
        role_ref=rbac.v1.RoleRefArgs(api_group=RBAC_GROUP, kind="ClusterRole", name=role.metadata.name),
        subjects=[subject],
        opts=child,
    )


def _pod_spec(args: MetricsServerArgs, account: core.v1.ServiceAccount) -> core.v1.PodSpecArgs:
    """Upstream's pod (manifests/base/deployment.yaml at the pinned tag): its probes on the HTTPS
    port, a read-only root with an emptyDir for its self-signed certificate; one replica per node
    (the high-availability manifest's required anti-affinity)."""
    probe = core.v1.HTTPGetActionArgs
    return system_pod_spec(
        "cluster",
        service_account=account,
        system_pool=True,
        tolerations=tolerate_critical_addons(),
        node_selector={"kubernetes.io/os": "linux"},
        affinity=core.v1.AffinityArgs(pod_anti_affinity=core.v1.PodAntiAffinityArgs(
            required_during_scheduling_ignored_during_execution=[core.v1.PodAffinityTermArgs(
                label_selector=meta.v1.LabelSelectorArgs(match_labels=SELECTOR),
                namespaces=[KUBE_SYSTEM],
                topology_key="kubernetes.io/hostname",
            )],
        )),
        containers=[core.v1.ContainerArgs(
            name=APP,
            image=args.image,
            args=args_of(args.plan),
            ports=[core.v1.ContainerPortArgs(name=PORT_NAME, container_port=PORT, protocol="TCP")],
            # sized by the plan from upstream's per-node figures; no limits, as upstream's manifest
            resources=core.v1.ResourceRequirementsArgs(requests={
                "cpu": f"{args.plan.cpu_millis}m", "memory": f"{args.plan.memory_mib}Mi"}),
            readiness_probe=core.v1.ProbeArgs(
                http_get=probe(path="/readyz", port=PORT_NAME, scheme="HTTPS"),
                period_seconds=10, failure_threshold=3, initial_delay_seconds=20),
            liveness_probe=core.v1.ProbeArgs(
                http_get=probe(path="/livez", port=PORT_NAME, scheme="HTTPS"),
                period_seconds=10, failure_threshold=3),
            security_context=container_security_context(USER),
            volume_mounts=[core.v1.VolumeMountArgs(name="tmp-dir", mount_path=CERT_DIR)],
        )],
        volumes=[core.v1.VolumeArgs(name="tmp-dir", empty_dir=core.v1.EmptyDirVolumeSourceArgs())],
    )
