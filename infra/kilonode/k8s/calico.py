"""Calico: the NetworkPolicy engine on Azure CNI, in policy-only mode, as AKS's "Azure CNI +
Calico network policy" runs it (the Tigera operator with cni.type AzureVNET; docs/in-cluster.md,
"NetworkPolicy: the engine, and why Calico" says why this engine and not the others).

What runs, at the release the catalogue pins (components.yaml calico):
- Felix (calico/node) on every node, on the host network, tolerating every taint: it learns the
  node's pods, the NetworkPolicies and the namespaces from Typha, and writes the filter rules for
  each pod's host-side interface in an nftables table of its own (FELIX_NFTABLESMODE=Enabled: the
  pools' kube-proxy runs in nftables mode). azure-vnet in transparent mode names that interface
  `azv` + the first 11 hex digits of SHA-1("<namespace>.<pod>")
  (Azure/azure-container-networking@v1.6.21:network/endpoint_linux.go:31-35,88-93 and
  cni/network/network.go:746), which is the name Calico computes for the pod with the prefix `azv`
  (projectcalico/calico@v3.31.7:libcalico-go/lib/backend/k8s/conversion/workload_endpoint_default.go:
  74-91): FELIX_INTERFACEPREFIX=azv, on Felix and on Typha, which converts the pods
  (tigera/operator@v1.40.15:pkg/render/node.go:1673-1674, pkg/render/typha.go: FELIX_INTERFACEPREFIX
  azv for AzureVNET). No Calico CNI plugin: azure-vnet keeps the pods' addresses and routes, the
  conflist is unchanged (the operator adds its install-cni container only for Calico's own CNI,
  node.go:1024-1025), and Calico networks nothing (CALICO_NETWORKING_BACKEND=none, no BGP, no
  default IP pool, no node address: node.go:1458,1552-1579).
- Typha, sized by the plan (kilonode.plan.resolve.components.typha_replicas, the operator's rule):
  the only Calico process that LISTs and WATCHes the apiserver; each Felix holds one connection to
  one Typha. At 7,500 nodes that is 39 watchers of Pods and policies, not 7,500 (the field notes'
  per-node watchers). Typha and Felix authenticate each other with certificates of a CA of their
  own (as the operator does; upstream's plain manifest leaves the port open to anyone who can
  reach it): without them any pod could connect to a Typha's host port and read every pod's
  labels and address, or answer for a Typha.
- The CustomResourceDefinitions Felix and Typha read (CRDS).

Not run: calico-kube-controllers. Its node controller garbage-collects Calico IPAM (unused: Azure
CNI allocates) and deletes Calico nodes only with the etcd datastore
(projectcalico/calico@v3.31.7:kube-controllers/pkg/controllers/node/controller.go:87-96); its
load-balancer controller allocates Calico's own Service IPs (unused).

Until Felix has programmed a pod's interface the pod's traffic passes unfiltered: Felix writes
no rule for an interface it does not know, and azure-vnet forwards it. A node's Felix starts
with the node (system-node-critical, every taint tolerated), before its pods; a pod created
while its node's Felix is down is unprotected until Felix comes back.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_tls as tls
from pulumi_kubernetes import apiextensions, apps, core, meta, policy, rbac

from kilonode.k8s.admission import NODE_NAME_EXTRA, admission_policy
from kilonode.k8s.bootstrap import KUBE_SYSTEM, RBAC_GROUP
from kilonode.k8s.pod_security import container_security_context, pod_security_context
from kilonode.k8s.pods import SKIP_AWAIT, system_pod_spec, tolerate_every_taint
from kilonode.plan import defaults, pki
from kilonode.plan.model import ClusterPlan, NetworkPolicyPlan
from kilonode.plan.wellknown import API_LOAD_BUDGET_ANNOTATION

NODE = "calico-node"
TYPHA = "calico-typha"
CALICO_GROUP = "crd.projectcalico.org"
# What azure-vnet in transparent mode names each pod's host-side interface with (kilonode.render.cni).
INTERFACE_PREFIX = "azv"
# Typha's port for Felix's connections (upstream's Service and containerPort), on the host.
TYPHA_PORT = 5473
TYPHA_PORT_NAME = "calico-typha"
# Typha's health endpoint: on localhost only (config_params.go HealthHost default localhost, l.106-107).
TYPHA_HEALTH_PORT = 9098
# The image's user (typha/docker-image/Dockerfile:48 USER 999); Typha's graceful shutdown, which
# upstream keeps equal to its TYPHA_SHUTDOWNTIMEOUTSECS (calico-policy-only.yaml, Typha's Deployment).
TYPHA_USER = 999
TYPHA_SHUTDOWN_S = 300
# The certificates' common names, which each side checks (TYPHA_CLIENTCN, FELIX_TYPHACN).
TYPHA_CN = TYPHA
NODE_CN = NODE
TLS_DIR = "/etc/calico/typha-tls"
LABELS = {"app.kubernetes.io/managed-by": "kilonode"}
# The per-node agent's budget (kilonode.preflight.apiload): its role may list and watch, but Felix
# reads through Typha.
API_LOAD_BUDGET = (
    "Felix reads the cluster through Typha (FELIX_TYPHAK8SSERVICENAME): one connection per node to one of the "
    "plan's Typha replicas, which alone LIST and WATCH the apiserver. Its own calls: at start, its Node and the "
    "default ClusterInformation, FelixConfiguration and Tier (get, create, update); afterwards the node-status "
    "reporter's watch of CalicoNodeStatus objects (none unless an operator creates one). Requests queue in "
    "API Priority and Fairness level kilonode-node-agents (kilonode.k8s.flowcontrol)."
)


@dataclass(frozen=True)
class Crd:
    """One CustomResourceDefinition Calico needs: its names, scope and version as upstream defines it."""

    group: str
    kind: str
    plural: str
    namespaced: bool = False
    version: str = "v1"
    status: bool = False  # a status subresource
    # the api-approved.kubernetes.io annotation a *.k8s.io group needs (the apiserver refuses it otherwise)
    approved: str | None = None


# projectcalico/calico@v3.31.7:manifests/crds.yaml (24 CRDs, l.9-5470): the crd.projectcalico.org kinds
# (v1, cluster-scoped but for the four namespaced ones) and the two policy.networking.k8s.io kinds of
# sig-network's network-policy-api (v1alpha1, bundle v0.1.1, with a status subresource). Felix's syncer
# lists and watches most of them unconditionally, the admin network policies included
# (libcalico-go/lib/backend/syncersv1/felixsyncer/felixsyncerv1.go:30-125); a kind without its CRD never
# syncs, and Felix never turns ready. Served here with an open schema (x-kubernetes-preserve-unknown-fields):
# the schemas are upstream's generated files, which this repository does not copy; Calico validates what
# its own clients write, and nothing of kilonode writes these kinds (docs/in-cluster.md says what that gives up).
NETWORK_POLICY_API = "https://github.com/kubernetes-sigs/network-policy-api/pull/30"
CRDS: tuple[Crd, ...] = (
    *(Crd(CALICO_GROUP, kind, plural) for kind, plural in (
        ("BGPConfiguration", "bgpconfigurations"), ("BGPFilter", "bgpfilters"), ("BGPPeer", "bgppeers"),
        ("BlockAffinity", "blockaffinities"), ("CalicoNodeStatus", "caliconodestatuses"),
        ("ClusterInformation", "clusterinformations"), ("FelixConfiguration", "felixconfigurations"),
        ("GlobalNetworkPolicy", "globalnetworkpolicies"), ("GlobalNetworkSet", "globalnetworksets"),
        ("HostEndpoint", "hostendpoints"), ("IPAMBlock", "ipamblocks"), ("IPAMConfig", "ipamconfigs"),
        ("IPAMHandle", "ipamhandles"), ("IPPool", "ippools"), ("IPReservation", "ipreservations"),
        ("KubeControllersConfiguration", "kubecontrollersconfigurations"),
        ("StagedGlobalNetworkPolicy", "stagedglobalnetworkpolicies"), ("Tier", "tiers"))),
    *(Crd(CALICO_GROUP, kind, plural, namespaced=True) for kind, plural in (
        ("NetworkPolicy", "networkpolicies"), ("NetworkSet", "networksets"),
        ("StagedKubernetesNetworkPolicy", "stagedkubernetesnetworkpolicies"),
        ("StagedNetworkPolicy", "stagednetworkpolicies"))),
    Crd("policy.networking.k8s.io", "AdminNetworkPolicy", "adminnetworkpolicies", version="v1alpha1",
        status=True, approved=NETWORK_POLICY_API),
    Crd("policy.networking.k8s.io", "BaselineAdminNetworkPolicy", "baselineadminnetworkpolicies",
        version="v1alpha1", status=True, approved=NETWORK_POLICY_API),
)

_READ = ["get", "list", "watch"]
# calico-node's ClusterRole: upstream's (projectcalico/calico@v3.31.7:manifests/calico-policy-only.yaml:
# 6755-6904) less what serves only what does not run here, or only a write no startup here makes:
# - serviceaccounts/token for calico-cni-plugin and pods/status patch (l.6760-6766, 6830-6835: the
#   Calico CNI plugin's credentials and its pod IP annotations; no Calico CNI plugin runs,
#   CALICO_MANAGE_CNI=false). A token that may patch any pod's status could rewrite the addresses
#   every Service's endpoints follow;
# - configmaps get (l.6790-6795: kubeadm's and Rancher's ConfigMaps, read for pod CIDR detection; a
#   Forbidden read is taken as "not kubeadm", node/pkg/lifecycle/startup/startup.go:170-195);
# - ippools create and update (l.6880-6887): with NO_DEFAULT_POOLS the startup writes no pool
#   (startup.go:907-914, configureIPPools returns first);
# - bgpconfigurations/bgppeers create and update ("only required for upgrade from v2.6", l.6895-6904).
# What remains written cluster-wide, ClusterInformation, FelixConfiguration, Tiers and CalicoNodeStatus,
# is held to what the startup writes by NODE_WRITES_POLICY (node_write_rules): the ClusterRole cannot
# name objects on create, and the token is on every node.
NODE_RULES: tuple[dict[str, Any], ...] = (
    {"api_groups": [""], "resources": ["pods", "nodes", "namespaces"], "verbs": ["get"]},
    {"api_groups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["watch", "list"]},
    {"api_groups": [""], "resources": ["endpoints", "services"], "verbs": ["watch", "list", "get"]},
    {"api_groups": [""], "resources": ["nodes/status"], "verbs": ["patch", "update"]},
    {"api_groups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": ["watch", "list"]},
    {"api_groups": ["policy.networking.k8s.io"], "resources": ["adminnetworkpolicies",
                                                                "baselineadminnetworkpolicies"],
     "verbs": ["watch", "list"]},
    {"api_groups": [""], "resources": ["pods", "namespaces", "serviceaccounts"], "verbs": ["list", "watch"]},
    {"api_groups": [CALICO_GROUP], "resources": [
        "globalfelixconfigs", "felixconfigurations", "bgppeers", "bgpfilters", "globalbgpconfigs",
        "bgpconfigurations", "ippools", "ipreservations", "ipamblocks", "globalnetworkpolicies",
        "stagedglobalnetworkpolicies", "networkpolicies", "stagednetworkpolicies",
        "stagedkubernetesnetworkpolicies", "globalnetworksets", "networksets", "clusterinformations",
        "hostendpoints", "blockaffinities", "caliconodestatuses", "tiers"], "verbs": _READ},
    {"api_groups": [CALICO_GROUP], "resources": ["tiers"], "verbs": ["create"]},
    {"api_groups": [CALICO_GROUP], "resources": ["felixconfigurations", "clusterinformations"], "verbs": ["create"]},
    # the startup updates only the objects named "default" (startup.go:1262-1310; clientv3/client.go:328-421)
    {"api_groups": [CALICO_GROUP], "resources": ["felixconfigurations", "clusterinformations"],
     "resource_names": ["default"], "verbs": ["update"]},
    {"api_groups": [CALICO_GROUP], "resources": ["caliconodestatuses"], "verbs": ["update"]},
    {"api_groups": [""], "resources": ["nodes"], "verbs": _READ},
)
NODE_USER = f"system:serviceaccount:{KUBE_SYSTEM}:{NODE}"
NODE_WRITES_POLICY = "kilonode-calico-node-writes"
# ... and CalicoNodeStatus, whose spec.node names the node it reports on (api/pkg/apis/projectcalico/v3/
# nodestatus.go:52), which each node's status reporter updates (node/pkg/status/reporter.go:226).
NODE_WRITES = ("clusterinformations", "felixconfigurations", "tiers", "caliconodestatuses")
# The Tiers calico-node's startup creates, each with its order and default action
# (libcalico-go/lib/clientv3/client.go:273-289, ensureTierExists :435-456; the names
# libcalico-go/lib/names/policy.go:26-28, the orders api/pkg/apis/projectcalico/v3/tier.go:40-42).
# Kubernetes NetworkPolicies live in the default tier: created with "Pass" instead of "Deny", a pod
# that its policies select but do not allow would pass on, and be let through.
TIERS = {"default": (1_000_000, "Deny"), "adminnetworkpolicy": (1_000, "Pass"),
         "baselineadminnetworkpolicy": (10_000_000, "Pass")}
# What the startup sets in the default FelixConfiguration, where unset (startup.go:1262-1310:
# ReportingInterval 0, a metav1.Duration, written "0s"; LogSeverityScreen "Info").
FELIX_DEFAULTS = {"reportingInterval": "0s", "logSeverityScreen": "Info"}
# ClusterInformation fields the startup may change on an existing object (clientv3/client.go:357-410:
# the running version, and cluster types it adds); the GUID and datastoreReady it sets only where unset.
CLUSTER_INFO_CHANGES = ("calicoVersion", "clusterType")
# ... and what it writes in one it creates (client.go:332-340)
CLUSTER_INFO_FIELDS = ("calicoVersion", "clusterGUID", "clusterType", "datastoreReady")


# NODE_WRITES_POLICY's variables (kilonode.k8s.admission): who writes, the spec before (none on a create)
# and after.
NODE_WRITE_VARIABLES = {
    "calicoNode": f"request.userInfo.username == {NODE_USER!r}",
    "old": "request.operation == 'UPDATE' && has(oldObject.spec) ? oldObject.spec : {}",
    "new": "has(object.spec) ? object.spec : {}",
}


def node_write_rules() -> list[tuple[str, str]]:
    """NODE_WRITES_POLICY's validations: calico-node's token, on every node, writes Calico's cluster-wide
    objects only as its startup does (read at v3.31.7). Without them root on any node could set
    datastoreReady false (every Felix waits for it), rewrite the default FelixConfiguration (every Felix's
    settings its environment does not fix), or create the default Tier with action Pass (NetworkPolicy
    isolation off), before or after the startup does."""
    other = "!variables.calicoNode"
    kind = "request.resource.resource"
    tier = " || ".join(
        f"object.metadata.name == {name!r} && double(variables.new.order) == {order:.1f} && "
        f"variables.new.defaultAction == {action!r}" for name, (order, action) in TIERS.items())
    felix = " && ".join(f"(k != {key!r} || variables.new[k] == {value!r})" for key, value in FELIX_DEFAULTS.items())
    node = f"request.userInfo.extra[{NODE_NAME_EXTRA!r}]"
    return [
        (f"{other} || ({kind} == 'tiers' ? object.metadata.name in {sorted(TIERS)!r} : "
         f"{kind} == 'caliconodestatuses' || object.metadata.name == 'default')",
         "calico-node writes only the default ClusterInformation and FelixConfiguration and Calico's three Tiers"),
        (f"{other} || {kind} != 'tiers' || request.operation == 'CREATE' && "
         f"'order' in variables.new && 'defaultAction' in variables.new && ({tier})",
         "calico-node creates a Tier only as its startup does: its upstream order and default action"),
        (f"{other} || {kind} != 'clusterinformations' || variables.old.all(k, k in {list(CLUSTER_INFO_CHANGES)!r} "
         "|| k in variables.new && variables.new[k] == variables.old[k]) && variables.new.all(k, k in variables.old "
         f"|| k in {list(CLUSTER_INFO_FIELDS)!r}) && 'datastoreReady' in variables.new "
         "&& variables.new.datastoreReady == true",
         "calico-node keeps the ClusterInformation's GUID and datastoreReady true (it may set its version)"),
        (f"{other} || {kind} != 'felixconfigurations' || variables.old.all(k, k in variables.new && "
         "variables.new[k] == variables.old[k]) && variables.new.all(k, k in variables.old || "
         f"k in {sorted(FELIX_DEFAULTS)!r} && {felix})",
         "calico-node only fills the default FelixConfiguration's reportingInterval (0s) and logSeverityScreen "
         "(Info) where unset"),
        (f"{other} || {kind} != 'caliconodestatuses' || {NODE_NAME_EXTRA!r} in request.userInfo.extra && "
         f"'node' in variables.new && variables.new.node == {node}[0] && "
         f"(request.operation == 'CREATE' || 'node' in variables.old && variables.old.node == {node}[0])",
         "calico-node updates only the CalicoNodeStatus of the node its pod runs on"),
    ]


# Typha's: what its syncer reads (felixsyncerv1.go:30-125; Profiles are Namespaces and ServiceAccounts,
# WorkloadEndpoints are Pods in the Kubernetes datastore) and the Endpoints of its own Service, which its
# connection rebalancing reads (TYPHA_CONNECTIONREBALANCINGMODE=kubernetes). Read only: upstream runs Typha
# under calico-node's account, which may also write; Typha writes nothing.
TYPHA_RULES: tuple[dict[str, Any], ...] = (
    {"api_groups": [""], "resources": ["pods", "namespaces", "serviceaccounts", "nodes", "services", "endpoints"],
     "verbs": _READ},
    {"api_groups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]},
    {"api_groups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": ["list", "watch"]},
    {"api_groups": ["policy.networking.k8s.io"], "resources": ["adminnetworkpolicies",
                                                                "baselineadminnetworkpolicies"],
     "verbs": ["list", "watch"]},
    {"api_groups": [CALICO_GROUP], "resources": [
        "clusterinformations", "felixconfigurations", "globalnetworkpolicies", "stagedglobalnetworkpolicies",
        "globalnetworksets", "ippools", "networkpolicies", "stagednetworkpolicies",
        "stagedkubernetesnetworkpolicies", "networksets", "tiers", "hostendpoints", "bgpconfigurations",
        "bgppeers", "ipamblocks"], "verbs": _READ},
)


def felix_env() -> dict[str, str]:
    """Felix's settings (calico/node's environment), after the Tigera operator's for AzureVNET
    (tigera/operator@v1.40.15:pkg/render/node.go:1433-1458, 1484-1488, 1552, 1579, 1673-1678)."""
    return {
        "DATASTORE_TYPE": "kubernetes",
        "WAIT_FOR_DATASTORE": "true",
        "CLUSTER_TYPE": "k8s",
        "CALICO_NETWORKING_BACKEND": "none",  # policy only: azure-vnet routes the pods
        "CALICO_MANAGE_CNI": "false",  # no Calico CNI plugin to keep credentials for
        "CALICO_DISABLE_FILE_LOGGING": "true",  # `kubectl logs` shows it
        "NO_DEFAULT_POOLS": "true",  # Azure CNI allocates; a Calico pool would mean nothing
        "IP": "none",  # no BGP, no tunnels: no node address to detect
        "FELIX_INTERFACEPREFIX": INTERFACE_PREFIX,
        "FELIX_ROUTESOURCE": "WorkloadIPs",
        # pods may reach their own node's host-network services (kubelet's health checks run the other way)
        "FELIX_DEFAULTENDPOINTTOHOSTACTION": "ACCEPT",
        "FELIX_NFTABLESMODE": "Enabled",  # beside kube-proxy's nftables mode
        "FELIX_IPV6SUPPORT": "false",
        "FELIX_HEALTHENABLED": "true",  # on localhost:9099 (HealthHost default), for the exec probes
        "FELIX_TYPHAK8SSERVICENAME": TYPHA,
        "FELIX_TYPHAK8SNAMESPACE": KUBE_SYSTEM,
        "FELIX_TYPHACAFILE": f"{TLS_DIR}/ca.crt",
        "FELIX_TYPHACERTFILE": f"{TLS_DIR}/tls.crt",
        "FELIX_TYPHAKEYFILE": f"{TLS_DIR}/tls.key",
        "FELIX_TYPHACN": TYPHA_CN,
    }


def typha_env() -> dict[str, str]:
    """Typha's settings: upstream's Deployment (calico-policy-only.yaml, Typha's env) and the TLS the
    operator adds, with the interface prefix Typha's pod conversion uses (the module docstring)."""
    return {
        "TYPHA_LOGSEVERITYSCREEN": "info",
        "TYPHA_LOGFILEPATH": "none",
        "TYPHA_LOGSEVERITYSYS": "none",
        "TYPHA_CONNECTIONREBALANCINGMODE": "kubernetes",
        "TYPHA_DATASTORETYPE": "kubernetes",
        "TYPHA_HEALTHENABLED": "true",
        "TYPHA_SHUTDOWNTIMEOUTSECS": str(TYPHA_SHUTDOWN_S),
        "FELIX_INTERFACEPREFIX": INTERFACE_PREFIX,
        "TYPHA_CAFILE": f"{TLS_DIR}/ca.crt",
        "TYPHA_SERVERCERTFILE": f"{TLS_DIR}/tls.crt",
        "TYPHA_SERVERKEYFILE": f"{TLS_DIR}/tls.key",
        "TYPHA_CLIENTCN": NODE_CN,
    }


def describe(plan: ClusterPlan) -> list[str]:
    """`kilonode explain`'s lines."""
    np = plan.components.network_policy
    return [f"Calico (policy only, on Azure CNI): Felix on every node, {np.typha_replicas} Typha replicas for "
            f"{np.nodes:,} nodes ({np.rule})"]


@dataclass(frozen=True)
class CalicoArgs:
    plan: NetworkPolicyPlan
    node_image: str
    typha_image: str

    @classmethod
    def of(cls, plan: ClusterPlan) -> CalicoArgs:
        c = plan.components
        return cls(plan=c.network_policy, node_image=c.calico_node_image, typha_image=c.calico_typha_image)


def _env(values: Mapping[str, str]) -> list[core.v1.EnvVarArgs]:
    return [core.v1.EnvVarArgs(name=k, value=v) for k, v in values.items()]


class Calico(pulumi.ComponentResource):
    def __init__(self, name: str, args: CalicoArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("kilonode:k8s:Calico", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        crds = [self._crd(name, crd, child) for crd in CRDS]
        accounts = {app: self._account(name, app, rules, child)
                    for app, rules in ((NODE, NODE_RULES), (TYPHA, TYPHA_RULES))}
        secrets = self._tls(name, child)
        admission_policy(f"{name}-node-writes", NODE_WRITES_POLICY, list(NODE_WRITES), node_write_rules(), LABELS,
                         child, group_version=(CALICO_GROUP, "v1"), variables=NODE_WRITE_VARIABLES)
        after_crds = pulumi.ResourceOptions(parent=self, depends_on=crds)
        typha_labels = {**LABELS, "k8s-app": TYPHA}
        core.v1.Service(
            f"{name}-typha-service",
            metadata=meta.v1.ObjectMetaArgs(name=TYPHA, namespace=KUBE_SYSTEM, labels=typha_labels,
                                            annotations=SKIP_AWAIT),
            spec=core.v1.ServiceSpecArgs(
                selector={"k8s-app": TYPHA},
                ports=[core.v1.ServicePortArgs(name=TYPHA_PORT_NAME, port=TYPHA_PORT, protocol="TCP",
                                               target_port=TYPHA_PORT_NAME)]),
            opts=child,  # not waited for (an endpoint means a Typha up), as the Deployment below
        )
        apps.v1.Deployment(
            f"{name}-typha",
            # Not waited for, like the DaemonSets it serves (kilonode.k8s.pods.SKIP_AWAIT): its replicas, one
            # per node, are sized for the nodes the cluster may reach, so most land on nodes of later join
            # waves (39 at 7,500 nodes; preflight's timeline counts 4 nodes up by the wait's end on
            # research-2500). Felix needs one Typha; `kubectl -n kube-system get deploy calico-typha` shows
            # the rest arrive.
            metadata=meta.v1.ObjectMetaArgs(name=TYPHA, namespace=KUBE_SYSTEM, labels=typha_labels,
                                            annotations=SKIP_AWAIT),
            spec=apps.v1.DeploymentSpecArgs(
                replicas=args.plan.typha_replicas,
                revision_history_limit=2,
                selector=meta.v1.LabelSelectorArgs(match_labels={"k8s-app": TYPHA}),
                # upstream's: a whole new set starts before the old one drains
                strategy=apps.v1.DeploymentStrategyArgs(type="RollingUpdate", rolling_update=(
                    apps.v1.RollingUpdateDeploymentArgs(max_surge="100%", max_unavailable=1))),
                template=core.v1.PodTemplateSpecArgs(
                    metadata=meta.v1.ObjectMetaArgs(labels=typha_labels),
                    spec=_typha_pod(args.typha_image, accounts[TYPHA], secrets[TYPHA])),
            ),
            opts=after_crds,
        )
        policy.v1.PodDisruptionBudget(
            f"{name}-typha-pdb",
            metadata=meta.v1.ObjectMetaArgs(name=TYPHA, namespace=KUBE_SYSTEM, labels=typha_labels),
            spec=policy.v1.PodDisruptionBudgetSpecArgs(
                max_unavailable=1, selector=meta.v1.LabelSelectorArgs(match_labels={"k8s-app": TYPHA})),
            opts=child,
        )
        node_labels = {**LABELS, "k8s-app": NODE}
        apps.v1.DaemonSet(
            f"{name}-node",
            # on every node: not waited for (kilonode.k8s.pods.SKIP_AWAIT says why)
            metadata=meta.v1.ObjectMetaArgs(name=NODE, namespace=KUBE_SYSTEM, labels=node_labels,
                                            annotations={**SKIP_AWAIT, API_LOAD_BUDGET_ANNOTATION: API_LOAD_BUDGET}),
            spec=apps.v1.DaemonSetSpecArgs(
                selector=meta.v1.LabelSelectorArgs(match_labels={"k8s-app": NODE}),
                update_strategy=apps.v1.DaemonSetUpdateStrategyArgs(
                    type="RollingUpdate", rolling_update=apps.v1.RollingUpdateDaemonSetArgs(max_unavailable=1)),
                template=core.v1.PodTemplateSpecArgs(
                    metadata=meta.v1.ObjectMetaArgs(labels=node_labels),
                    spec=_node_pod(args.node_image, accounts[NODE], secrets[NODE])),
            ),
            opts=after_crds,
        )
        self.register_outputs({})

    def _crd(self, name: str, crd: Crd, child: pulumi.ResourceOptions) -> apiextensions.v1.CustomResourceDefinition:
        return apiextensions.v1.CustomResourceDefinition(
            f"{name}-crd-{crd.plural}",
            metadata=meta.v1.ObjectMetaArgs(
                name=f"{crd.plural}.{crd.group}", labels=LABELS,
                annotations={"api-approved.kubernetes.io": crd.approved} if crd.approved else None),
            spec=crd_spec(crd),
            opts=child,
        )

    def _account(self, name: str, app: str, rules: tuple[dict[str, Any], ...],
                 child: pulumi.ResourceOptions) -> core.v1.ServiceAccount:
        labels = {**LABELS, "k8s-app": app}
        account = core.v1.ServiceAccount(
            f"{name}-{app}-sa", metadata=meta.v1.ObjectMetaArgs(name=app, namespace=KUBE_SYSTEM, labels=labels),
            opts=child)
        role = rbac.v1.ClusterRole(
            f"{name}-{app}-role", metadata=meta.v1.ObjectMetaArgs(name=app, labels=labels),
            rules=[rbac.v1.PolicyRuleArgs(**rule) for rule in rules], opts=child)
        rbac.v1.ClusterRoleBinding(
            f"{name}-{app}-binding", metadata=meta.v1.ObjectMetaArgs(name=app, labels=labels),
            role_ref=rbac.v1.RoleRefArgs(api_group=RBAC_GROUP, kind="ClusterRole", name=role.metadata.name),
            subjects=[rbac.v1.SubjectArgs(kind="ServiceAccount", name=account.metadata.name, namespace=KUBE_SYSTEM)],
            opts=child)
        return account

    def _tls(self, name: str, child: pulumi.ResourceOptions) -> dict[str, core.v1.Secret]:
        """A CA of Typha's own, a server certificate for Typha and a client certificate for Felix, as
        Secrets in kube-system (ca.crt, tls.crt, tls.key). The keys are secret outputs of pulumi-tls;
        the leaves are renewed by `pulumi up` when defaults.IN_CLUSTER_LEAF_RENEW_BEFORE_HOURS
        remain, the CA lasts pki.CA_HOURS."""
        def key(part: str) -> tls.PrivateKey:
            return tls.PrivateKey(f"{name}-{part}-key", algorithm=pki.KEY_ALGORITHM, ecdsa_curve=pki.KEY_CURVE,
                                  opts=child)
        ca_key = key("typha-ca")
        ca = tls.SelfSignedCert(
            f"{name}-typha-ca", private_key_pem=ca_key.private_key_pem, is_ca_certificate=True,
            subject=tls.SelfSignedCertSubjectArgs(common_name="kilonode-calico-typha-ca"),
            validity_period_hours=pki.CA_HOURS, allowed_uses=["cert_signing", "crl_signing", "digital_signature"],
            opts=child)
        secrets: dict[str, core.v1.Secret] = {}
        for app, cn, use in ((TYPHA, TYPHA_CN, "server_auth"), (NODE, NODE_CN, "client_auth")):
            leaf_key = key(app)
            request = tls.CertRequest(f"{name}-{app}-csr", private_key_pem=leaf_key.private_key_pem,
                                      subject=tls.CertRequestSubjectArgs(common_name=cn), opts=child)
            cert = tls.LocallySignedCert(
                f"{name}-{app}-cert", cert_request_pem=request.cert_request_pem, ca_cert_pem=ca.cert_pem,
                ca_private_key_pem=ca_key.private_key_pem, validity_period_hours=pki.LEAF_HOURS,
                early_renewal_hours=defaults.IN_CLUSTER_LEAF_RENEW_BEFORE_HOURS,
                allowed_uses=["digital_signature", "key_encipherment", use],
                opts=child)
            secrets[app] = core.v1.Secret(
                f"{name}-{app}-tls",
                metadata=meta.v1.ObjectMetaArgs(name=f"{app}-typha-tls", namespace=KUBE_SYSTEM,
                                                labels={**LABELS, "k8s-app": app}),
                type="Opaque",
                string_data={"ca.crt": ca.cert_pem, "tls.crt": cert.cert_pem,
                             "tls.key": pulumi.Output.secret(leaf_key.private_key_pem)},
                opts=child)
        return secrets


def crd_spec(crd: Crd) -> dict[str, Any]:
    """A CRD's spec: upstream's names, scope and version, an open schema."""
    singular = crd.kind.lower()
    version: dict[str, Any] = {
        "name": crd.version, "served": True, "storage": True,
        "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
    }
    if crd.status:
        version["subresources"] = {"status": {}}
    return {
        "group": crd.group,
        "names": {"kind": crd.kind, "listKind": f"{crd.kind}List", "plural": crd.plural, "singular": singular},
        "scope": "Namespaced" if crd.namespaced else "Cluster",
        "versions": [version],
    }


def _tls_volume(secret: core.v1.Secret, mode: int) -> core.v1.VolumeArgs:
    return core.v1.VolumeArgs(name="typha-tls", secret=core.v1.SecretVolumeSourceArgs(
        secret_name=secret.metadata.name, default_mode=mode))


def _host_path(name: str, path: str, kind: str | None = None) -> core.v1.VolumeArgs:
    return core.v1.VolumeArgs(name=name, host_path=core.v1.HostPathVolumeSourceArgs(path=path, type=kind))


def _node_pod(image: str, account: core.v1.ServiceAccount, secret: core.v1.Secret) -> core.v1.PodSpecArgs:
    """calico/node as upstream's policy-only DaemonSet runs it (calico-policy-only.yaml:7040-7300:
    privileged on the host network, every taint tolerated, exec probes, its shutdown hook), less what
    only Calico's CNI plugin or the eBPF data plane use (the install-cni and ebpf-bootstrap init
    containers, the CNI directories, /sys/fs, /proc, the policy-sync socket)."""
    mount = core.v1.VolumeMountArgs
    probe = core.v1.ProbeArgs
    return system_pod_spec(
        "node",
        service_account=account,
        host_network=True,
        tolerations=tolerate_every_taint(),
        node_selector={"kubernetes.io/os": "linux"},
        termination_grace_period_seconds=0,  # upstream's: a rolling update's gap is as short as it can be
        containers=[core.v1.ContainerArgs(
            name=NODE,
            image=image,
            env=[*_env(felix_env()), core.v1.EnvVarArgs(name="NODENAME", value_from=core.v1.EnvVarSourceArgs(
                field_ref=core.v1.ObjectFieldSelectorArgs(field_path="spec.nodeName")))],
            security_context=core.v1.SecurityContextArgs(privileged=True),
            resources=core.v1.ResourceRequirementsArgs(requests={"cpu": "250m", "memory": "128Mi"}),
            lifecycle=core.v1.LifecycleArgs(pre_stop=core.v1.LifecycleHandlerArgs(
                exec_=core.v1.ExecActionArgs(command=["/bin/calico-node", "-shutdown"]))),
            liveness_probe=probe(exec_=core.v1.ExecActionArgs(command=["/bin/calico-node", "-felix-live"]),
                                 period_seconds=10, initial_delay_seconds=10, failure_threshold=6, timeout_seconds=10),
            readiness_probe=probe(exec_=core.v1.ExecActionArgs(command=["/bin/calico-node", "-felix-ready"]),
                                  period_seconds=10, timeout_seconds=10),
            volume_mounts=[
                mount(name="lib-modules", mount_path="/lib/modules", read_only=True),
                mount(name="xtables-lock", mount_path="/run/xtables.lock"),
                mount(name="var-run-calico", mount_path="/var/run/calico"),
                mount(name="var-lib-calico", mount_path="/var/lib/calico"),
                mount(name="typha-tls", mount_path=TLS_DIR, read_only=True),
            ],
        )],
        volumes=[
            _host_path("lib-modules", "/lib/modules"),
            _host_path("xtables-lock", "/run/xtables.lock", "FileOrCreate"),
            _host_path("var-run-calico", "/var/run/calico", "DirectoryOrCreate"),
            _host_path("var-lib-calico", "/var/lib/calico", "DirectoryOrCreate"),
            _tls_volume(secret, 0o400),
        ],
    )


def _typha_pod(image: str, account: core.v1.ServiceAccount, secret: core.v1.Secret) -> core.v1.PodSpecArgs:
    """Typha as upstream's Deployment runs it (calico-policy-only.yaml, Typha's: host network, every
    taint tolerated, its 300 s graceful shutdown, HTTP probes on localhost), one replica per node (its
    port is the host's), preferring the system pool."""
    probe = core.v1.HTTPGetActionArgs
    return system_pod_spec(
        "cluster",
        service_account=account,
        host_network=True,
        system_pool=True,
        tolerations=tolerate_every_taint(),
        node_selector={"kubernetes.io/os": "linux"},
        affinity=core.v1.AffinityArgs(pod_anti_affinity=core.v1.PodAntiAffinityArgs(
            required_during_scheduling_ignored_during_execution=[core.v1.PodAffinityTermArgs(
                label_selector=meta.v1.LabelSelectorArgs(match_labels={"k8s-app": TYPHA}),
                topology_key="kubernetes.io/hostname")])),
        termination_grace_period_seconds=TYPHA_SHUTDOWN_S,
        # the secret's files readable by the image's user through the pod's group (upstream: fsGroup 65534)
        security_context=pod_security_context(fs_group=65534),
        containers=[core.v1.ContainerArgs(
            name=TYPHA,
            image=image,
            ports=[core.v1.ContainerPortArgs(name=TYPHA_PORT_NAME, container_port=TYPHA_PORT, protocol="TCP")],
            env=_env(typha_env()),
            resources=core.v1.ResourceRequirementsArgs(requests={"cpu": "250m", "memory": "256Mi"}),
            liveness_probe=core.v1.ProbeArgs(
                http_get=probe(path="/liveness", port=TYPHA_HEALTH_PORT, host="localhost"),
                period_seconds=30, initial_delay_seconds=30, timeout_seconds=10),
            readiness_probe=core.v1.ProbeArgs(
                http_get=probe(path="/readiness", port=TYPHA_HEALTH_PORT, host="localhost"),
                period_seconds=10, timeout_seconds=10),
            security_context=container_security_context(TYPHA_USER),
            volume_mounts=[core.v1.VolumeMountArgs(name="typha-tls", mount_path=TLS_DIR, read_only=True)],
        )],
        volumes=[_tls_volume(secret, 0o440)],
    )
