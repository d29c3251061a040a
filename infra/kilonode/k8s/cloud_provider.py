"""CloudProvider: Azure's out-of-tree cloud provider (kubernetes-sigs/cloud-provider-azure)
in the cluster, as its helm chart and examples deploy it, set for Azure CNI.

- cloud-node-manager, a DaemonSet on every node: initializes its node from the instance
  metadata service (provider ID, zone, instance type, addresses) and lifts the
  `node.cloudprovider.kubernetes.io/uninitialized` taint the kubelet registers with
  (`--cloud-provider=external`). With --use-instance-metadata it reads no azure.json and
  needs no Azure credentials (cmd/cloud-node-manager, pkg/node/node.go: a hard-coded
  IMDS config).
- cloud-controller-manager, a Deployment: Services of type LoadBalancer. The control-plane
  VMs run no kubelet, so it runs on the plan's controller pools (the system pools), required
  by node affinity: theirs are the only scale sets carrying its identity
  (kilonode.azure.identity), and it reads the token on the host network, where the instance
  metadata service still answers (pods' traffic to it is dropped on every pool node:
  kilonode.render.metadata_block). It tolerates the uninitialized taint (the first node is
  one). Its cloud-node controller is off (`--controllers=*,-cloud-node`: the node
  manager does that), and so are the two that Azure CNI makes wrong: routes
  (`--configure-cloud-routes=false`: pods take VNet addresses, there is no route table) and
  node CIDRs (`--allocate-node-cidrs=false`).

azure.json is built here from the plan and the cluster's Azure outputs (the identity's
client ID is only known once Azure made it), kept in a ConfigMap (it holds no credential),
and mounted into cloud-controller-manager only; the cluster autoscaler gets its own
(AUTOSCALER_CONFIG_NAME), the same but naming its own identity. Field names are those of cloud-provider-azure's config
structs at the pinned release (pkg/provider/config/azure.go, azure_auth.go,
pkg/azclient/arm_conf.go, auth_conf.go); tests/k8s/test_cloud_provider.py checks them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pulumi
from pulumi_kubernetes import apps, core, meta, policy, rbac

from kilonode.k8s.bootstrap import KUBE_SYSTEM, RBAC_GROUP
from kilonode.k8s.pod_security import NONROOT_USER, container_security_context
from kilonode.k8s.pods import (
    SKIP_AWAIT,
    awaited,
    config_digest_annotation,
    on_pools,
    system_pod_spec,
    tolerate_critical_addons,
    tolerate_uninitialized_nodes,
)
from kilonode.plan import defaults
from kilonode.plan.model import ClusterPlan
from kilonode.plan.wellknown import API_LOAD_BUDGET_ANNOTATION

CCM = "cloud-controller-manager"
CNM = "cloud-node-manager"
CONFIG_NAME = "azure-cloud-provider"
# the cluster autoscaler's azure.json (kilonode.k8s.autoscaler): its own identity
AUTOSCALER_CONFIG_NAME = "cluster-autoscaler-azure"
CONFIG_DIR = "/etc/kubernetes/cloud-config"


@dataclass(frozen=True)
class AzureTarget:
    """Where the cluster lives in Azure: names the Azure components chose, and IDs Azure gave."""

    tenant_id: str
    subscription_id: str
    # the pools' own group: their scale sets, and the load balancers and public IPs Services get
    # (the plan's node_resource_group)
    resource_group: str
    network_resource_group: str  # the cluster's own group: the VNet, its subnets, the pools' NSG
    vnet_name: str
    subnet_name: str  # where internal load balancers get their frontend address
    security_group_name: str  # the NSG cloud-controller-manager opens Service ports in
    identity_client_id: str  # cloud-controller-manager's, on the controller pools' scale sets
    # the autoscaler's (kilonode.azure.identity), on the same scale sets; None without one
    autoscaler_identity_client_id: str | None = None
    # Azure Disk CSI's controller's (kilonode.azure.identity), on the same scale sets; its own
    # azure.json names it (kilonode.k8s.storage)
    disk_csi_identity_client_id: str | None = None


def azure_json(plan: ClusterPlan, target: AzureTarget) -> dict[str, Any]:
    """cloud-provider-azure's cloud config for this cluster.

    Only fields the pinned release reads and acts on. Deliberately absent: the client-side
    rate limits (`cloudProviderRateLimit*` and the per-client `*RateLimit` blocks): from
    v1.32 the provider parses them but never hands them to its Azure clients
    (pkg/provider/azure.go builds its client factories with the subscription ID only), so
    setting them would be a setting the program silently ignores. `routeTableName` is left
    out: with --configure-cloud-routes=false the route controller never runs.
    """
    return {
        "cloud": "AzurePublicCloud",
        "tenantId": target.tenant_id,
        "subscriptionId": target.subscription_id,
        "resourceGroup": target.resource_group,
        "location": plan.location,
        # Every node is a uniform scale-set instance; the control-plane VMs are not nodes.
        "vmType": "vmss",
        # ... so no node is in an availability set: skip those lookups (ARM calls at scale).
        "disableAvailabilitySetNodes": True,
        "vnetName": target.vnet_name,
        "vnetResourceGroup": target.network_resource_group,
        "subnetName": target.subnet_name,
        "securityGroupName": target.security_group_name,
        "securityGroupResourceGroup": target.network_resource_group,
        "loadBalancerSku": "standard",
        # Nodes join the Service load balancers' backend pools by private IP, a PUT of the pool
        # alone; the default (nodeIPConfiguration) PUTs every scale set and instance into them,
        # which needs virtualMachineScaleSets/write: a token that can rewrite any pool's model
        # (kilonode.azure.identity, where the calls are cited).
        "loadBalancerBackendPoolConfigurationType": "nodeIP",
        # Outbound goes through each subnet's NAT gateway (kilonode.azure.network): load
        # balancer rules must not add SNAT of their own.
        "disableOutboundSNAT": True,
        "useManagedIdentityExtension": True,
        "userAssignedIdentityID": target.identity_client_id,
        "useInstanceMetadata": True,
    }


def autoscaler_azure_json(plan: ClusterPlan, target: AzureTarget) -> dict[str, Any]:
    """The cluster autoscaler's azure.json: the cloud provider's (it reads the same struct,
    kilonode.k8s.autoscaler), acting as its own identity, whose rights are its node groups'
    scale sets (kilonode.azure.identity)."""
    if target.autoscaler_identity_client_id is None:
        raise ValueError("the plan has autoscaled pools but the cluster made no autoscaler identity")
    return azure_json(plan, target) | {"userAssignedIdentityID": target.autoscaler_identity_client_id}


def ccm_config_data(plan: ClusterPlan, target: pulumi.Output[AzureTarget]) -> dict[str, pulumi.Output[str]]:
    """The CONFIG_NAME ConfigMap's data: what cloud-controller-manager mounts (and its pod's digest)."""
    return {"azure.json": target.apply(lambda t: _json(azure_json(plan, t)))}


def autoscaler_config_data(plan: ClusterPlan, target: pulumi.Output[AzureTarget]) -> dict[str, pulumi.Output[str]]:
    """The AUTOSCALER_CONFIG_NAME ConfigMap's data: what cluster-autoscaler mounts (and its pod's
    digest, kilonode.k8s.autoscaler)."""
    return {"azure.json": target.apply(lambda t: _json(autoscaler_azure_json(plan, t)))}


def controller_affinity(plan: ClusterPlan,
                        preferred: list[core.v1.PreferredSchedulingTermArgs] | None = None) -> core.v1.AffinityArgs:
    """Required: a node of the plan's controller pools (kilonode.io/pool), the only ones whose
    scale sets carry the controllers' identities; `preferred` terms kept. Elsewhere the
    controller would find no token, and it must not land where the identity is not meant to be."""
    return on_pools([p.name for p in plan.controller_pools], preferred=preferred)


def ccm_args(plan: ClusterPlan) -> list[str]:
    return [
        "--cloud-provider=azure",
        f"--cloud-config={CONFIG_DIR}/azure.json",
        f"--cluster-name={plan.cluster}",
        # the node manager initializes nodes
        "--controllers=*,-cloud-node",
        # Azure CNI: pod addresses are the NICs' own, no routes and no node CIDRs
        "--configure-cloud-routes=false",
        "--allocate-node-cidrs=false",
        "--leader-elect=true",
        f"--secure-port={defaults.CLOUD_CONTROLLER_MANAGER_PORT}",
        "--v=2",
    ]


def cnm_args() -> list[str]:
    return [
        "--node-name=$(NODE_NAME)",
        # from the node's own instance metadata: no azure.json, no Azure credentials
        "--use-instance-metadata=true",
        # true only where the CCM programs routes (kubenet); Azure CNI has none to wait for
        "--wait-routes=false",
        "--v=2",
    ]


# cloud-provider-azure v1.34.13 helm/cloud-provider-azure/templates/cloud-provider-azure.yaml
# (ClusterRole system:cloud-controller-manager, identical in examples/out-of-tree), less what
# upstream grants for modes and controllers kilonode does not run, read at the same tag:
# - secrets get/list/watch: the CCM reads a Secret only for a cloud config kept in one, with
#   --enable-dynamic-reloading and --cloud-config-secret-name
#   (cmd/cloud-controller-manager/app/controllermanager.go l.229-234, l.361-367:
#   dynamic.RunSecretWatcherOrDie, provider.NewCloudFromSecret; pkg/azclient/configloader/
#   loader_secret.go is the one Secrets().Get). kilonode passes --cloud-config (a file), so none:
#   with the chart's rule it could read every Secret of the cluster.
# - serviceaccounts create/get/list/watch/update: for --use-service-account-credentials only
#   (cmd/cloud-controller-manager/app/options/options.go l.224-235: NewDynamicClientBuilder
#   creates a ServiceAccount per controller); ccm_args does not set it, so its own account acts.
# - nodes ["*"] narrowed to the verbs its running controllers call (CIS 5.1.3; issue 24), read at
#   every pinned release (v1.32.20, v1.33.17, v1.34.13, v1.35.8, alike): ccm_args runs
#   cloud-node-lifecycle, service and (doing nothing) route and node-ipam
#   (cmd/cloud-controller-manager/app/core.go: startRouteController returns at once without
#   --configure-cloud-routes, startNodeIpamController without --allocate-node-cidrs). The shared
#   informer lists and watches Nodes (core.go; pkg/provider/azure.go SetInformers); the lifecycle
#   controller DELETEs a Node whose VM is gone (vendor/k8s.io/cloud-provider/controllers/
#   nodelifecycle/node_lifecycle_controller.go MonitorNodes) and, like the provider's out-of-service
#   taint (pkg/provider/azure.go updateNodeTaint), GETs and PATCHes a Node's taints
#   (vendor/k8s.io/cloud-provider/node/helpers/taints.go AddOrUpdateTaintOnNode,
#   RemoveTaintOffNode: Get, then a strategic-merge Patch); the service controller reads Nodes from
#   the informer only. No code path it runs creates or updates a Node, nor calls deletecollection.
# - nodes/status patch dropped: what writes it is off here: the cloud-node controller
#   (--controllers=*,-cloud-node), and the NetworkUnavailable condition of the route controller
#   (vendor/k8s.io/cloud-provider/controllers/route/route_controller.go) and of node-ipam
#   (pkg/nodeipam/ipam/cloud_cidr_allocator.go, pkg/util/node/node.go SetNodeCondition).
CCM_RULES: list[tuple[str, str, list[str]]] = [
    ("", "events", ["create", "patch", "update"]),
    ("", "nodes", ["delete", "get", "list", "patch", "watch"]),
    ("", "services", ["list", "patch", "update", "watch"]),
    ("", "services/status", ["list", "patch", "update", "watch"]),
    ("", "persistentvolumes", ["get", "list", "update", "watch"]),
    ("", "endpoints", ["create", "get", "list", "watch", "update"]),
    ("coordination.k8s.io", "leases", ["get", "create", "update"]),
    ("discovery.k8s.io", "endpointslices", ["get", "list", "watch"]),
]
# ... and ClusterRole cloud-node-manager. Its list/watch of Nodes cannot be narrowed to the pod's
# own Node (one ClusterRole for every node cannot name each node), so the DaemonSet states its
# budget instead (CNM_API_LOAD_BUDGET).
CNM_RULES: list[tuple[str, str, list[str]]] = [
    ("", "nodes", ["watch", "list", "get", "update", "patch"]),
    ("", "nodes/status", ["patch"]),
]


# What each program writes and needs, read at every pinned release (v1.32.20 dbfb0288, v1.33.17
# 0479db5b, v1.34.13 44b37e17, v1.35.8 b93010ae: Dockerfile, cloud-node-manager.Dockerfile and the
# code, alike in this at all four). Neither writes a file: the serving certificate of
# --secure-port is made in memory (cmd/*/app/options/options.go: "leave certificate directory
# blank to generate in-memory by default"), logs go to stderr, and no code under cmd/ or pkg/
# writes to disk (pkg/azclient/client-gen is a code generator, not in the images); the Azure
# token comes from the instance metadata service over the host network, which the metadata
# block leaves to the host (an nftables forward-hook rule: no match on the user,
# kilonode.render.metadata_block). So both run read-only, with no capability, as a non-root user.
def ccm_security_context() -> core.v1.SecurityContextArgs:
    """cloud-controller-manager's container. Its image runs as root (Dockerfile: FROM
    gcr.io/distroless/base, no USER), which it does not need: its port (10268) is unprivileged,
    and what it reads is readable by any user (azure.json from a ConfigMap, mode 0644; the
    host's CA bundle under /etc/ssl; its ServiceAccount token). So it runs as distroless's
    nonroot user, named here, as the kubelet needs to verify runAsNonRoot."""
    return container_security_context(NONROOT_USER)


def cnm_security_context() -> core.v1.SecurityContextArgs:
    """cloud-node-manager's container, as its image's own user (cloud-node-manager.Dockerfile:
    USER 65532:65532)."""
    return container_security_context(NONROOT_USER)


# What cloud-node-manager reads, at cloud-provider-azure v1.34.13: its shared informers list and
# watch Nodes with the field selector metadata.name=<node> ("Only need to watch the node itself",
# cmd/cloud-node-manager/app/options/options.go l.192-195), with no resync unless
# --min-resync-period is set (l.132, l.208-213; cnm_args sets none); pkg/nodemanager/nodemanager.go
# GETs and UPDATEs its Node when it initializes it (l.416-425) and PATCHes nodes/status every
# --node-status-update-frequency, 5 minutes by default (options.go l.58, l.103).
CNM_API_LOAD_BUDGET = (
    "Nodes: its own only, one list and watch with fieldSelector metadata.name=<node> (RBAC cannot name each "
    "node in one ClusterRole, so the role grants list/watch of all Nodes; the program never lists without "
    "the selector); a GET and UPDATE of its Node when it initializes it and a PATCH of nodes/status every "
    "5 minutes; no informer resync; its requests fall in the kilonode-node-agents priority level."
)


def _rules(rules: list[tuple[str, str, list[str]]]) -> list[rbac.v1.PolicyRuleArgs]:
    return [rbac.v1.PolicyRuleArgs(api_groups=[group], resources=[resource], verbs=verbs)
            for group, resource, verbs in rules]


def _json(config: dict[str, Any]) -> str:
    return json.dumps(config, indent=2, sort_keys=True) + "\n"


def _labels(app: str) -> dict[str, str]:
    return {"k8s-app": app, "app.kubernetes.io/managed-by": "kilonode"}


def _node_name_env() -> list[core.v1.EnvVarArgs]:
    return [core.v1.EnvVarArgs(name="NODE_NAME", value_from=core.v1.EnvVarSourceArgs(
        field_ref=core.v1.ObjectFieldSelectorArgs(field_path="spec.nodeName")))]


@dataclass(frozen=True)
class CloudProviderArgs:
    plan: ClusterPlan
    target: pulumi.Output[AzureTarget]  # from the Azure components' outputs


def _ccm_pod_spec(plan: ClusterPlan, account: core.v1.ServiceAccount, config: core.v1.ConfigMap) -> core.v1.PodSpecArgs:
    """cloud-controller-manager's pod: azure.json from `config`, the host's /etc/ssl."""
    return system_pod_spec(
        "node",
        service_account=account,
        system_pool=True,
        # only where its identity is (kilonode.azure.identity)
        affinity=controller_affinity(plan),
        # before any CNI or Service works, and to reach the instance metadata
        # service for the identity's token (pods' traffic to it is dropped)
        host_network=True,
        # it must run on a node not yet initialized: the first node is one
        tolerations=tolerate_uninitialized_nodes(),
        # the two replicas on different nodes (the chart's spread constraint)
        topology_spread_constraints=[core.v1.TopologySpreadConstraintArgs(
            max_skew=1, topology_key="kubernetes.io/hostname", when_unsatisfiable="DoNotSchedule",
            label_selector=meta.v1.LabelSelectorArgs(match_labels={"k8s-app": CCM}),
        )],
        containers=[core.v1.ContainerArgs(
            name=CCM,
            image=plan.components.cloud_controller_manager_image,
            command=["cloud-controller-manager"],
            args=ccm_args(plan),
            # the chart's requests and limits
            resources=core.v1.ResourceRequirementsArgs(
                requests={"cpu": "100m", "memory": "128Mi"}, limits={"cpu": "4", "memory": "2Gi"}),
            liveness_probe=core.v1.ProbeArgs(
                http_get=core.v1.HTTPGetActionArgs(
                    path="/healthz", port=defaults.CLOUD_CONTROLLER_MANAGER_PORT, scheme="HTTPS"),
                initial_delay_seconds=20, period_seconds=10, timeout_seconds=5,
            ),
            security_context=ccm_security_context(),
            volume_mounts=[
                core.v1.VolumeMountArgs(name="cloud-config", mount_path=CONFIG_DIR, read_only=True),
                core.v1.VolumeMountArgs(name="ssl", mount_path="/etc/ssl", read_only=True),
            ],
        )],
        volumes=[
            core.v1.VolumeArgs(name="cloud-config", config_map=core.v1.ConfigMapVolumeSourceArgs(
                name=config.metadata.name)),
            core.v1.VolumeArgs(name="ssl", host_path=core.v1.HostPathVolumeSourceArgs(
                path="/etc/ssl")),
        ],
    )


def _cnm_pod_spec(plan: ClusterPlan, account: core.v1.ServiceAccount) -> core.v1.PodSpecArgs:
    """cloud-node-manager's pod, on every Linux node whatever its taints."""
    return system_pod_spec(
        "node",
        service_account=account,
        host_network=True,  # the node's own hostname and instance metadata
        node_selector={"kubernetes.io/os": "linux"},
        tolerations=[
            *tolerate_critical_addons(),
            core.v1.TolerationArgs(operator="Exists", effect="NoExecute"),
            core.v1.TolerationArgs(operator="Exists", effect="NoSchedule"),
        ],
        containers=[core.v1.ContainerArgs(
            name=CNM,
            image=plan.components.cloud_node_manager_image,
            command=["cloud-node-manager"],
            args=cnm_args(),
            env=_node_name_env(),
            resources=core.v1.ResourceRequirementsArgs(
                requests={"cpu": "50m", "memory": "50Mi"}, limits={"cpu": "2", "memory": "512Mi"}),
            security_context=cnm_security_context(),
        )],
    )


class CloudProvider(pulumi.ComponentResource):
    def __init__(self, name: str, args: CloudProviderArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("kilonode:k8s:CloudProvider", name, None, opts)
        plan = args.plan
        child = pulumi.ResourceOptions(parent=self)

        accounts = self._service_accounts(name)
        # A ConfigMap, not the Secret upstream's example uses: azure.json holds no credential
        # (the identity's token comes from the instance metadata service), and as plain data
        # a reviewer sees it in `kilonode plan` and in a diff.
        ccm_data = ccm_config_data(plan, args.target)
        config = core.v1.ConfigMap(
            f"{name}-config",
            metadata=meta.v1.ObjectMetaArgs(name=CONFIG_NAME, namespace=KUBE_SYSTEM, labels=_labels(CCM)),
            data=ccm_data,
            opts=child,
        )
        if plan.autoscaled_pools:
            # the autoscaler's, as its own identity (kilonode.k8s.autoscaler mounts it)
            core.v1.ConfigMap(
                f"{name}-autoscaler-config",
                metadata=meta.v1.ObjectMetaArgs(name=AUTOSCALER_CONFIG_NAME, namespace=KUBE_SYSTEM,
                                                labels=_labels("cluster-autoscaler")),
                data=autoscaler_config_data(plan, args.target),
                opts=child,
            )

        ccm_labels = _labels(CCM)
        apps.v1.Deployment(
            f"{name}-{CCM}",
            metadata=meta.v1.ObjectMetaArgs(name=CCM, namespace=KUBE_SYSTEM, labels=ccm_labels),
            spec=apps.v1.DeploymentSpecArgs(
                replicas=defaults.CLOUD_CONTROLLER_MANAGER_REPLICAS,
                selector=meta.v1.LabelSelectorArgs(match_labels={"k8s-app": CCM}),
                template=core.v1.PodTemplateSpecArgs(
                    # Rolls on an azure.json change (kilonode.k8s.pods.CONFIG_DIGEST_ANNOTATION): without
                    # --enable-dynamic-reloading (ccm_args sets none) cloud-controller-manager reads
                    # --cloud-config once at start ("using static initialization from config file",
                    # cmd/cloud-controller-manager/app/controllermanager.go RunWrapper) and never again.
                    metadata=meta.v1.ObjectMetaArgs(
                        labels=ccm_labels, annotations=config_digest_annotation(ccm_data)),
                    spec=_ccm_pod_spec(plan, accounts[CCM], config),
                ),
            ),
            # its pods wait for the first pool node, still allocating on a first run
            opts=awaited(child, plan.components.awaits),
        )
        policy.v1.PodDisruptionBudget(
            f"{name}-{CCM}-pdb",
            metadata=meta.v1.ObjectMetaArgs(name=CCM, namespace=KUBE_SYSTEM, labels=ccm_labels),
            spec=policy.v1.PodDisruptionBudgetSpecArgs(
                max_unavailable=1, selector=meta.v1.LabelSelectorArgs(match_labels={"k8s-app": CCM})),
            opts=child,
        )

        cnm_labels = _labels(CNM)
        apps.v1.DaemonSet(
            f"{name}-{CNM}",
            # on every node: not waited for (kilonode.k8s.pods.SKIP_AWAIT says why)
            metadata=meta.v1.ObjectMetaArgs(
                name=CNM, namespace=KUBE_SYSTEM, labels=cnm_labels,
                annotations={**SKIP_AWAIT, API_LOAD_BUDGET_ANNOTATION: CNM_API_LOAD_BUDGET}),
            spec=apps.v1.DaemonSetSpecArgs(
                selector=meta.v1.LabelSelectorArgs(match_labels={"k8s-app": CNM}),
                update_strategy=apps.v1.DaemonSetUpdateStrategyArgs(
                    type="RollingUpdate",
                    rolling_update=apps.v1.RollingUpdateDaemonSetArgs(
                        max_unavailable=defaults.CLOUD_NODE_MANAGER_MAX_UNAVAILABLE)),
                template=core.v1.PodTemplateSpecArgs(
                    # No config digest: cloud-node-manager mounts no ConfigMap (--use-instance-metadata,
                    # cnm_args: its config comes from the node's instance metadata, not azure.json).
                    metadata=meta.v1.ObjectMetaArgs(
                        labels=cnm_labels,
                        annotations={"cluster-autoscaler.kubernetes.io/daemonset-pod": "true"},
                    ),
                    spec=_cnm_pod_spec(plan, accounts[CNM]),
                ),
            ),
            opts=child,
        )
        self.register_outputs({})

    def _service_accounts(self, name: str) -> dict[str, core.v1.ServiceAccount]:
        """Each app's ServiceAccount (app -> account) with its ClusterRole and binding, and the
        extension-apiserver reader cloud-controller-manager's secure port needs."""
        child = pulumi.ResourceOptions(parent=self)
        accounts: dict[str, core.v1.ServiceAccount] = {}
        for app, rules in ((CCM, CCM_RULES), (CNM, CNM_RULES)):
            accounts[app] = core.v1.ServiceAccount(
                f"{name}-{app}-sa",
                metadata=meta.v1.ObjectMetaArgs(name=app, namespace=KUBE_SYSTEM, labels=_labels(app)),
                opts=child,
            )
            role = rbac.v1.ClusterRole(
                f"{name}-{app}-role",
                metadata=meta.v1.ObjectMetaArgs(name=f"kilonode:{app}", labels=_labels(app)),
                rules=_rules(rules),
                opts=child,
            )
            rbac.v1.ClusterRoleBinding(
                f"{name}-{app}-binding",
                metadata=meta.v1.ObjectMetaArgs(name=f"kilonode:{app}", labels=_labels(app)),
                role_ref=rbac.v1.RoleRefArgs(api_group=RBAC_GROUP, kind="ClusterRole", name=role.metadata.name),
                subjects=[rbac.v1.SubjectArgs(kind="ServiceAccount", name=app, namespace=KUBE_SYSTEM)],
                opts=child,
            )
        # the delegated authentication of its secure port reads the extension-apiserver config
        rbac.v1.RoleBinding(
            f"{name}-{CCM}-auth-reader",
            metadata=meta.v1.ObjectMetaArgs(name=f"kilonode:{CCM}:extension-apiserver-authentication-reader",
                                            namespace=KUBE_SYSTEM, labels=_labels(CCM)),
            role_ref=rbac.v1.RoleRefArgs(api_group=RBAC_GROUP, kind="Role",
                                         name="extension-apiserver-authentication-reader"),
            subjects=[rbac.v1.SubjectArgs(kind="ServiceAccount", name=CCM, namespace=KUBE_SYSTEM)],
            opts=child,
        )
        return accounts
