"""The cloud provider: cloud-controller-manager and cloud-node-manager (cloud-provider-azure),
their azure.json, and the managed identity they act as, checked against cloud-provider-azure's
own source at the pinned release (the references below name file and line) and Azure's
role definitions. The objects' schema is checked with every other in-cluster object
(test_in_cluster.py: kubernetes-validate)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kilonode.azure.graph import Graph
from kilonode.azure.identity import (
    AUTOSCALER_ACTIONS,
    CLOUD_PROVIDER_ACTIONS,
    CLOUD_PROVIDER_VNET_ACTIONS,
    DISK_CSI_ACTIONS,
    DISK_CSI_ATTACH_ACTIONS,
    NETWORK_CONTRIBUTOR,
    READER,
)
from kilonode.catalog.components import components
from kilonode.k8s.storage import node_plugin_pools
from kilonode.plan import ClusterPlan
from kilonode.plan.azure_names import role_definition_name

# Every json field cloud-provider-azure v1.34.13 unmarshals azure.json into
# (pkg/provider/config/azure.go Config l.33-183, azure_auth.go AzureClientConfig l.33-51,
# pkg/azclient/arm_conf.go ARMClientConfig l.31-55, auth_conf.go AzureAuthConfig l.27-52,
# azure_cache.go CloudProviderCacheConfig; the rate-limit fields are listed apart, below).
AZURE_JSON_FIELDS = {
    "cloudConfigType", "resourceGroup", "location", "extendedLocationName", "extendedLocationType", "vnetName",
    "vnetResourceGroup", "subnetName", "securityGroupName", "securityGroupResourceGroup", "routeTableName",
    "routeTableResourceGroup", "primaryAvailabilitySetName", "vmType", "primaryScaleSetName", "tags", "tagsMap",
    "systemTags", "loadBalancerSku", "loadBalancerName", "loadBalancerResourceGroup",
    "preConfiguredBackendPoolLoadBalancerTypes", "disableAvailabilitySetNodes", "enableVmssFlexNodes",
    "useInstanceMetadata", "cloudProviderBackoffExponent", "cloudProviderBackoffJitter",
    "excludeMasterFromStandardLB", "disableOutboundSNAT", "maximumLoadBalancerRuleCount",
    "loadBalancerBackendPoolConfigurationType", "putVMSSVMBatchSize", "privateLinkServiceResourceGroup",
    "enableMigrateToIPBasedBackendPoolAPI", "enableIPTagMutationForExistingPublicIP",
    "multipleStandardLoadBalancerConfigurations", "routeUpdateIntervalInSeconds",
    "loadBalancerBackendPoolUpdateIntervalInSeconds", "clusterServiceLoadBalancerHealthProbeMode",
    "clusterServiceSharedLoadBalancerHealthProbePort", "clusterServiceSharedLoadBalancerHealthProbePath",
    "nodeInstanceNotFoundGracePeriodInSeconds",
    "cloudProviderBackoffRetries", "cloudProviderBackoffDuration", "subscriptionId", "identitySystem",
    "networkResourceSubscriptionID",
    "cloud", "userAgent", "resourceManagerEndpoint", "tenantId", "networkResourceTenantID", "cloudProviderBackoff",
    "disableAzureStackCloud", "enableMinimumRetryAfter",
    "aadClientId", "aadClientSecret", "aadClientCertPath", "aadClientCertPassword", "useManagedIdentityExtension",
    "userAssignedIdentityID", "aadFederatedTokenFile", "useFederatedWorkloadIdentityExtension",
    "auxiliaryTokenProvider", "aadMSIDataPlaneIdentityPath",
    "disableAPICallCache", "nonVmssUniformNodesCacheTTLInSeconds", "vmssCacheTTLInSeconds",
    "vmssVirtualMachinesCacheTTLInSeconds", "listVmssVirtualMachinesWithoutInstanceView",
    "vmssFlexCacheTTLInSeconds", "vmssFlexVMCacheTTLInSeconds", "vmCacheTTLInSeconds",
    "loadBalancerCacheTTLInSeconds", "nsgCacheTTLInSeconds", "routeTableCacheTTLInSeconds", "plsCacheTTLInSeconds",
    "availabilitySetsCacheTTLInSeconds", "publicIPCacheTTLInSeconds", "routeUpdateWaitingInSeconds",
}
# Parsed (pkg/azclient/policy/ratelimit/ratelimit.go Config l.29-40) but, from v1.32, never handed
# to the Azure clients (pkg/provider/azure.go l.419-433 builds the client factories with the
# subscription ID only): setting one would be a setting the program silently ignores.
IGNORED_RATE_LIMITS = {
    "cloudProviderRateLimit", "cloudProviderRateLimitQPS", "cloudProviderRateLimitBucket",
    "cloudProviderRateLimitQPSWrite", "cloudProviderRateLimitBucketWrite",
}
# The flags the chart passes (helm/cloud-provider-azure/templates/cloud-provider-azure.yaml
# l.209-285 at v1.34.13; cmd/cloud-node-manager/app/options/options.go l.130-138).
CCM_FLAGS = {
    "allocate-node-cidrs", "cloud-config", "cloud-provider", "cluster-cidr", "cluster-name", "configure-cloud-routes",
    "controllers", "leader-elect", "route-reconciliation-period", "v", "bind-address", "cert-dir",
    "cloud-config-secret-name", "secure-port", "kube-api-qps", "kube-api-burst", "use-service-account-credentials",
}
CNM_FLAGS = {"node-name", "node-status-update-frequency", "kube-api-qps", "kube-api-burst", "wait-routes",
             "use-instance-metadata", "cloud-config", "kubeconfig", "v"}

def flags(args: list[str]) -> dict[str, str]:
    return dict(a.removeprefix("--").split("=", 1) for a in args)


def of_kind(graph: Graph, type_: str, name: str) -> dict[str, Any]:
    [record] = [r for r in graph.of_type(type_) if r.plain().get("metadata", {}).get("name") == name]
    return record.plain()


@pytest.mark.parametrize("stack", ["local", "research-7500"])
def test_azure_json_uses_only_fields_the_provider_reads_and_no_ignored_rate_limits(
    graphs: dict[str, Graph], plans: dict[str, ClusterPlan], stack: str
) -> None:
    config = of_kind(graphs[stack], "kubernetes:core/v1:ConfigMap", "azure-cloud-provider")
    data = json.loads(config["data"]["azure.json"])
    assert set(data) <= AZURE_JSON_FIELDS, set(data) - AZURE_JSON_FIELDS
    assert not set(data) & IGNORED_RATE_LIMITS
    assert not any(key.endswith("RateLimit") for key in data)
    # the docs' required fields, and the two a user-assigned identity needs
    assert data["tenantId"] and data["subscriptionId"] and data["userAssignedIdentityID"]
    assert data["useManagedIdentityExtension"] is True and data["useInstanceMetadata"] is True
    # uniform scale sets, no route table (Azure CNI), outbound through the NAT gateways
    assert data["vmType"] == "vmss" and data["disableAvailabilitySetNodes"] is True
    assert "routeTableName" not in data and data["disableOutboundSNAT"] is True
    cluster = plans[stack].cluster
    # the scale sets (and the load balancers it makes) in the pools' group; the VNet and the NSG
    # in the cluster's own
    assert data["resourceGroup"] == plans[stack].node_resource_group == f"{cluster}-nodes"
    assert data["vnetResourceGroup"] == data["securityGroupResourceGroup"] == cluster
    assert data["userAssignedIdentityID"] == f"mock-client-id:{cluster}-controllers-cloud-provider-identity"
    # nodes into the Service pools by address, never a scale-set PUT (kilonode.azure.identity)
    assert data["loadBalancerBackendPoolConfigurationType"] == "nodeIP"


@pytest.mark.parametrize("stack", ["local", "research-7500"])
def test_the_controller_manager_runs_without_routes_node_cidrs_or_node_init(
    graphs: dict[str, Graph], plans: dict[str, ClusterPlan], stack: str
) -> None:
    spec = of_kind(graphs[stack], "kubernetes:apps/v1:Deployment", "cloud-controller-manager")["spec"]
    pod = spec["template"]["spec"]
    [container] = pod["containers"]
    args = flags(container["args"])
    assert set(args) <= CCM_FLAGS, set(args) - CCM_FLAGS
    assert args["configure-cloud-routes"] == "false" and args["allocate-node-cidrs"] == "false"
    assert args["controllers"] == "*,-cloud-node" and args["cloud-provider"] == "azure"
    assert args["cloud-config"] == "/etc/kubernetes/cloud-config/azure.json"
    mount = next(m for m in container["volumeMounts"] if m["name"] == "cloud-config")
    volume = next(v for v in pod["volumes"] if v["name"] == "cloud-config")
    assert mount["mountPath"] == "/etc/kubernetes/cloud-config"
    assert volume["configMap"]["name"] == "azure-cloud-provider"
    # it starts where nothing else can yet: host network, on a node still uninitialized
    assert pod["hostNetwork"] is True
    # only on the controller pools, the scale sets that carry its identity
    [term] = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term == {"matchExpressions": [{"key": "kilonode.io/pool", "operator": "In",
                                          "values": sorted(p.name for p in plans[stack].controller_pools)}]}
    assert {"key": "node.cloudprovider.kubernetes.io/uninitialized", "operator": "Exists",
            "effect": "NoSchedule"} in pod["tolerations"]
    assert spec["replicas"] == 2 and pod["topologySpreadConstraints"][0]["topologyKey"] == "kubernetes.io/hostname"
    version = components().cloud_provider_azure.versions[plans[stack].kubernetes_minor]
    assert container["image"] == f"mcr.microsoft.com/oss/v2/kubernetes/azure-cloud-controller-manager:{version}"
    assert container["livenessProbe"]["httpGet"]["port"] == int(args["secure-port"])


@pytest.mark.parametrize("stack", ["local", "research-7500"])
def test_the_node_manager_initializes_every_node_from_instance_metadata(
    graphs: dict[str, Graph], plans: dict[str, ClusterPlan], stack: str
) -> None:
    pod = of_kind(graphs[stack], "kubernetes:apps/v1:DaemonSet", "cloud-node-manager")["spec"]["template"]["spec"]
    [container] = pod["containers"]
    args = flags(container["args"])
    assert set(args) <= CNM_FLAGS, set(args) - CNM_FLAGS
    assert args["use-instance-metadata"] == "true" and args["wait-routes"] == "false"
    assert args["node-name"] == "$(NODE_NAME)" and "cloud-config" not in args  # no Azure credentials
    assert "volumes" not in pod  # nothing mounted: it reads the instance metadata service only
    assert {"operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    version = components().cloud_provider_azure.versions[plans[stack].kubernetes_minor]
    assert container["image"] == f"mcr.microsoft.com/oss/v2/kubernetes/azure-cloud-node-manager:{version}"
    # both images are boot images: preloaded when the stack supplies their archives
    boot = {image for pool in plans[stack].node_pools for image in pool.boot_images_not_preloaded}
    boot |= {p.image for pool in plans[stack].node_pools for p in pool.preload_images}
    assert container["image"] in boot
    assert container["image"].replace("node-manager", "controller-manager") in boot


def test_the_rbac_is_upstreams_own_less_secrets_service_accounts_and_unused_node_verbs(
    graphs: dict[str, Graph],
) -> None:
    role = of_kind(graphs["local"], "kubernetes:rbac.authorization.k8s.io/v1:ClusterRole",
                   "kilonode:cloud-controller-manager")
    # cloud-provider-azure v1.34.13, helm/cloud-provider-azure/templates/cloud-provider-azure.yaml
    # l.35-134 (ClusterRole system:cloud-controller-manager), rule by rule, without its
    # serviceaccounts rule (--use-service-account-credentials only) and its secrets rule (a cloud
    # config kept in a Secret only), its nodes ["*"] narrowed to what cloud-node-lifecycle, the
    # service controller and the provider's taints call, and no nodes/status (cloud-node, routes
    # and node-ipam are off): kilonode.k8s.cloud_provider CCM_RULES says where each is read
    assert [(r["apiGroups"][0], r["resources"][0], r["verbs"]) for r in role["rules"]] == [
        ("", "events", ["create", "patch", "update"]),
        ("", "nodes", ["delete", "get", "list", "patch", "watch"]),
        ("", "services", ["list", "patch", "update", "watch"]),
        ("", "services/status", ["list", "patch", "update", "watch"]),
        ("", "persistentvolumes", ["get", "list", "update", "watch"]),
        ("", "endpoints", ["create", "get", "list", "watch", "update"]),
        ("coordination.k8s.io", "leases", ["get", "create", "update"]),
        ("discovery.k8s.io", "endpointslices", ["get", "list", "watch"]),
    ]
    container = of_kind(graphs["local"], "kubernetes:apps/v1:Deployment",
                        "cloud-controller-manager")["spec"]["template"]["spec"]["containers"][0]
    # what would make either rule needed is off
    args = flags(container["args"])
    assert "cloud-config-secret-name" not in args and "use-service-account-credentials" not in args
    # ... and what would write nodes/status, or Nodes beyond the lifecycle controller's taints
    assert (args["controllers"], args["configure-cloud-routes"], args["allocate-node-cidrs"]) == (
        "*,-cloud-node", "false", "false")
    assert "*" not in {verb for rule in role["rules"] for verb in rule["verbs"]}
    assert args["cloud-config"]
    node_role = of_kind(graphs["local"], "kubernetes:rbac.authorization.k8s.io/v1:ClusterRole",
                        "kilonode:cloud-node-manager")
    assert node_role["rules"] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["watch", "list", "get", "update", "patch"]},
        {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]},
    ]


def _rg_id(name: str) -> str:
    return f"/subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/{name}"


def _mock_id(type_: str, name: str) -> str:
    return f"mock:azure-native:{type_}::{name}"


@pytest.mark.parametrize("stack", ["local", "research-7500"])
def test_each_controller_identity_has_its_roles_on_the_pools_resources_only(
    graphs: dict[str, Graph], plans: dict[str, ClusterPlan], stack: str
) -> None:
    graph, plan = graphs[stack], plans[stack]
    component = f"{stack}-controllers"
    assignments = [a.plain() for a in graph.of_type("azure-native:authorization:RoleAssignment")
                   if a.parent == component]
    granted: dict[str, set[tuple[str, str]]] = {}
    for a in assignments:
        who = a["principalId"].removeprefix(f"mock-principal-id:{component}-").removesuffix("-identity")
        granted.setdefault(who, set()).add((a["roleDefinitionId"].rsplit("/", 1)[1], a["scope"]))
        assert a["principalType"] == "ServicePrincipal"
    nodes = _rg_id(plan.node_resource_group)
    ccm_role, autoscaler_role = (role_definition_name(nodes, r) for r in ("cloud-provider", "autoscaler"))
    vnet_role = role_definition_name(_rg_id(plan.cluster), "cloud-provider-vnet")
    assert granted.pop("cloud-provider") == {
        (ccm_role, nodes),
        (vnet_role, _mock_id("network:VirtualNetwork", f"{stack}-network-vnet")),
        (NETWORK_CONTRIBUTOR, _mock_id("network:NetworkSecurityGroup", f"{stack}-network-pools-nsg")),
        *[(NETWORK_CONTRIBUTOR, _mock_id("network:Subnet", f"{stack}-network-pool-{p.name}")) for p in plan.node_pools],
    }
    # Azure Disk CSI's controller: the disks on the pools' group, the instance write on its node
    # plugin's pools' scale sets alone (tests/azure/test_disk_csi_identity.py)
    disk_role, attach_role = (role_definition_name(nodes, r) for r in ("disk-csi", "disk-csi-attach"))
    assert granted.pop("disk-csi") == {(disk_role, nodes)} | {
        (attach_role, _mock_id("compute:VirtualMachineScaleSet", s.name))
        for p in plan.node_pools if p.name in node_plugin_pools(plan) for s in p.shards}
    groups = [g.shard for p in plan.autoscaled_pools for g in (p.autoscaling.node_groups if p.autoscaling else ())]
    if groups:  # a scale set's logical name is its shard's name
        assert granted.pop("autoscaler") == {(READER, nodes)} | {
            (autoscaler_role, _mock_id("compute:VirtualMachineScaleSet", shard)) for shard in groups}
    assert granted == {}
    # nothing on the cluster's own group, where the control plane is, nor on the subscription (the
    # VNet holds the joinLoadBalancer role alone: the next test)
    assert all(a["scope"].startswith(("mock:", nodes)) for a in assignments)


# what Virtual Machine Contributor holds and no controller needs: a command or an extension on
# every GPU instance is root there
_NEVER = ("Microsoft.Compute/virtualMachineScaleSets/virtualMachines/runCommand/",
          "Microsoft.Compute/virtualMachineScaleSets/extensions/write",
          "Microsoft.Compute/virtualMachines/runCommand/", "Microsoft.Compute/virtualMachines/extensions/write", "*")


@pytest.mark.parametrize("stack", ["local", "research-7500"])
def test_the_controllers_custom_roles_are_their_listed_actions_assignable_in_one_group_each(
    graphs: dict[str, Graph], plans: dict[str, ClusterPlan], stack: str
) -> None:
    graph, plan = graphs[stack], plans[stack]
    nodes = _rg_id(plan.node_resource_group)
    roles = {r.plain()["roleDefinitionId"]: r.plain()
             for r in graph.of_type("azure-native:authorization:RoleDefinition") if r.parent == f"{stack}-controllers"}
    cluster = _rg_id(plan.cluster)
    vnet_role = role_definition_name(cluster, "cloud-provider-vnet")
    expected = {role_definition_name(nodes, "cloud-provider"): CLOUD_PROVIDER_ACTIONS,
                vnet_role: CLOUD_PROVIDER_VNET_ACTIONS,
                role_definition_name(nodes, "disk-csi"): DISK_CSI_ACTIONS,
                role_definition_name(nodes, "disk-csi-attach"): DISK_CSI_ATTACH_ACTIONS}
    if plan.autoscaled_pools:
        expected[role_definition_name(nodes, "autoscaler")] = AUTOSCALER_ACTIONS
    assert {guid: tuple(role["permissions"][0]["actions"]) for guid, role in roles.items()} == expected
    # the one role assignable where the control plane is: joinLoadBalancer alone
    assert roles[vnet_role]["permissions"][0]["actions"] == [
        "Microsoft.Network/virtualNetworks/joinLoadBalancer/action"]
    for guid, role in roles.items():
        group = cluster if guid == vnet_role else nodes
        assert role["assignableScopes"] == [group] and role["scope"] == group
        assert len(role["permissions"]) == 1 and not role["permissions"][0].get("dataActions")
        for action in role["permissions"][0]["actions"]:
            assert "*" not in action and not action.lower().startswith(tuple(n.lower() for n in _NEVER))


def test_the_cloud_provider_may_write_no_scale_set_or_vm() -> None:
    """With nodeIP backend pools cloud-controller-manager PUTs no scale set or instance
    (kilonode.azure.identity cites the calls); any Compute write would let its token rewrite a
    pool's model (customData, extensions)."""
    writes = [a for a in CLOUD_PROVIDER_ACTIONS + CLOUD_PROVIDER_VNET_ACTIONS
              if a.lower().startswith("microsoft.compute/") and not a.lower().endswith("/read")]
    assert writes == []
    assert "Microsoft.Network/loadBalancers/backendAddressPools/join/action" not in CLOUD_PROVIDER_ACTIONS


@pytest.mark.parametrize("stack", ["local", "research-7500"])
def test_no_pool_scale_set_names_a_load_balancer_pool(graphs: dict[str, Graph], stack: str) -> None:
    """A scale set whose NIC configuration named a Service pool would be PUT by the controller's
    EnsureBackendPoolDeleted even in nodeIP mode (kilonode.azure.identity), which its role refuses."""
    for vmss in graphs[stack].of_type("azure-native:compute:VirtualMachineScaleSet"):
        text = json.dumps(vmss.plain())
        assert "loadBalancerBackendAddressPools" not in text and "loadBalancerInboundNatPools" not in text, \
            vmss.plain()["vmScaleSetName"]


@pytest.mark.parametrize("stack", ["local", "research-7500"])
def test_only_the_controller_pools_scale_sets_carry_identities(
    graphs: dict[str, Graph], plans: dict[str, ClusterPlan], stack: str
) -> None:
    graph, plan = graphs[stack], plans[stack]
    controllers = {p.name for p in plan.controller_pools}
    assert controllers == ({"system"} if stack == "research-7500" else {"cpu"})
    identities = {_mock_id("managedidentity:UserAssignedIdentity", f"{stack}-controllers-{who}-identity")
                  for who in ("cloud-provider", "disk-csi", *(["autoscaler"] if plan.autoscaled_pools else []))}
    for pool in plan.node_pools:
        names = {s.name for s in pool.shards}
        for vmss in graph.of_type("azure-native:compute:VirtualMachineScaleSet"):
            inputs = vmss.plain()
            if inputs["vmScaleSetName"] not in names:
                continue
            assert inputs["resourceGroupName"] == plan.node_resource_group
            if pool.name in controllers:
                assert inputs["identity"]["type"] == "UserAssigned"
                assert set(inputs["identity"]["userAssignedIdentities"]) == identities
            else:  # a GPU pool's nodes: no identity at all
                assert "identity" not in inputs, inputs["vmScaleSetName"]


def test_role_assignment_names_are_guids_of_scope_principal_and_role() -> None:
    from kilonode.plan.azure_names import role_assignment_name

    scope, principal, role = "/subscriptions/a/resourceGroups/c", "p-1", "/providers/x/roleDefinitions/r"
    first = role_assignment_name(scope, principal, role)
    assert first == role_assignment_name(scope.upper(), principal, role)  # Azure's IDs are case-insensitive
    assert len(first) == 36 and first.count("-") == 4
    # another subscription, a replaced identity, another role: each another name
    others = {role_assignment_name("/subscriptions/b/resourceGroups/c", principal, role),
              role_assignment_name(scope, "p-2", role), role_assignment_name(scope, principal, role + "2")}
    assert first not in others and len(others) == 3
