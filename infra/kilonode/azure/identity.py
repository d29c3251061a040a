"""ControllerIdentities: the resource group the pools live in, and the user-assigned managed
identities of the two controllers that act on Azure, each role assignment scoped to the
narrowest resources its controller touches. No identity here has a right over a resource of the
cluster's own resource group beyond the pools' NSG and subnets: the etcd and apiserver VMs,
their NICs and disks, the VNet, the control-plane subnets and the backup account are out of
every scope (preflight's `identities` check proves it on the recorded graph).

Who needs Azure, read at the pinned releases:

- cloud-controller-manager (cloud-provider-azure v1.34.13, vmType vmss, --controllers=*,-cloud-node,
  no routes): Service load balancers and their public IPs, created in its `resourceGroup`
  (azure_loadbalancer.go getLoadBalancerResourceGroup, getPublicIPAddressResourceGroup); every
  node's NIC into their backend pools, a PUT of each scale set and instance
  (nodeIPConfiguration backends); every scale set of `resourceGroup` LISTed into its cache
  (azure_vmss_cache.go l.73-80: VirtualMachineScaleSetClient.List(resourceGroup), which Azure
  authorizes at the group's scope); the node lifecycle controller's instance reads; the one
  NSG of its azure.json (Service rules); the subnet of an internal load balancer's frontend,
  and `subnets/join/action` on every pool subnet, which Azure checks on the scale sets' PUTs.
  Hence the pools and what it creates live in a group of their own, the plan's
  node_resource_group, holding nothing of the control plane:
    the custom role CLOUD_PROVIDER_ACTIONS on that group, Network Contributor on the pools' NSG
    and on each pool subnet (a custom role's assignable scopes are groups, not resources; a
    network role on an NSG or a subnet reaches no VM).
  (`loadBalancerBackendPoolConfigurationType: nodeIP` would avoid the scale-set writes, but
  its IP-based backend pools need virtualNetworks/joinLoadBalancer/action on the whole VNet.)
- cluster-autoscaler (cluster-autoscaler-1.34.5 cloudprovider/azure/azure_cache.go
  fetchAzureResources: VirtualMachineScaleSetsClient.List and VirtualMachinesClient.List of its
  `resourceGroup`, then capacity and instance deletion on its node groups' scale sets):
    Reader on the node group, the custom role AUTOSCALER_ACTIONS on each node group's scale set
    only (ControllerIdentities.grant_node_groups, once the scale sets exist).
- cloud-node-manager: none. With --use-instance-metadata it builds an IMDS node provider
  (pkg/node/nodeproviderfactory.go l.26-36), which reads the node's own instance metadata and
  asks for no token.
- the kubelet: none (--cloud-provider=external, no azure.json, no credential provider: every
  image comes from a public registry). Image pulls need no identity.
- etcd snapshot upload: one identity per etcd cluster (main, events, leases), on that cluster's
  VMs only, with a custom role of `blobs/write` alone (no read, no delete, no control-plane
  action) on that cluster's own snapshot container, under the container's retention policy
  (kilonode.azure.backup; preflight's `etcd-backups` check). Not Storage Blob Data Contributor:
  it deletes blobs and containers.

Both controllers run where their identities are, and nowhere else: on the plan's
controller_pools (the system pools), required by node affinity (kilonode.k8s.cloud_provider),
on the host network, where the instance metadata service still answers; every pool node drops
pod traffic to it (kilonode.render.metadata_block). GPU pools' scale sets carry no identity.

Built-in roles are fixed GUIDs in every tenant ("Azure built-in roles",
learn.microsoft.com/azure/role-based-access-control/built-in-roles: general, Reader
acdd72a7-3385-48ef-bd42-f606fba81ae7, `*/read`; networking, Network Contributor
4d97b98b-1d4f-4787-a291-c67834d212e7). Virtual Machine Contributor is used nowhere: it holds
`Microsoft.Compute/virtualMachineScaleSets/virtualMachines/runCommand/*` and `extensions/write`,
with which a controller's token (an escape on a system node) is root on every GPU instance.
The two controllers get custom roles instead (authorization.RoleDefinition, assignable in the
pools' group only), each listing only the actions its controller calls at the pinned release;
they need `Microsoft.Authorization/roleDefinitions/write` from the deployer, which User Access
Administrator (already needed for the role assignments) holds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pulumi
from pulumi_azure_native import authorization, managedidentity, resources

from kilonode.azure.common import tags
from kilonode.plan.azure_names import role_assignment_name, role_definition_name

# Azure built-in role definition IDs (the module docstring cites them).
NETWORK_CONTRIBUTOR = "4d97b98b-1d4f-4787-a291-c67834d212e7"
READER = "acdd72a7-3385-48ef-bd42-f606fba81ae7"
# "Storage Blob Data Contributor" (the same reference, storage): read, write and delete blobs, and
# delete containers. Whoever runs `pulumi up` gets it on the image account for the VHD upload
# (kilonode.azure.node_image); the etcd members do not (kilonode.azure.backup: it deletes).
STORAGE_BLOB_DATA_CONTRIBUTOR = "ba92f5b4-2d11-453d-a403-e96b0029c9fe"

# cloud-controller-manager's actions on the pools' group: cloud-provider-azure's own list
# (kubernetes-sigs/cloud-provider-azure, branch documentation @5f0b3bd0,
# content/en/topics/azure-permissions.md; docs/azure-permissions.md at v1.34.13 points there),
# less what this cluster never asks for: Azure Disk and snapshots (l.45-49, 97-100: no in-tree
# disks, the CSI drivers are not deployed), storage accounts (l.51-56: no Azure File), route
# tables (l.58-63: no routes controller), standalone VMs' writes (l.69, 77: vmType vmss),
# manualupgrade (l.82-84: Kubernetes 1.11-1.14 only), private link services and the subnet
# writes they need (l.106-111), application security groups (l.42-43: none), public IP
# prefixes (l.32-35: none), inbound NAT rules (l.20: Service load balancers have none), VM sizes
# and location operations (l.102-104: disk volume limits).
CLOUD_PROVIDER_ACTIONS: tuple[str, ...] = (
    # l.13-19: Service load balancers and their backend pools
    "Microsoft.Network/loadBalancers/read",
    "Microsoft.Network/loadBalancers/write",
    "Microsoft.Network/loadBalancers/delete",
    "Microsoft.Network/loadBalancers/backendAddressPools/read",
    "Microsoft.Network/loadBalancers/backendAddressPools/write",
    "Microsoft.Network/loadBalancers/backendAddressPools/delete",
    # not on upstream's list (its users hold Network Contributor, Microsoft.Network/*): the
    # linked access check of a scale set's PUT whose NIC configuration names a backend pool
    "Microsoft.Network/loadBalancers/backendAddressPools/join/action",
    # l.23-30: their public IPs, and the linked access check of a frontend naming one
    "Microsoft.Network/publicIPAddresses/read",
    "Microsoft.Network/publicIPAddresses/write",
    "Microsoft.Network/publicIPAddresses/delete",
    "Microsoft.Network/publicIPAddresses/join/action",
    # l.37-40: Service rules (the pools' NSG itself is outside the group: Network Contributor there)
    "Microsoft.Network/networkSecurityGroups/read",
    "Microsoft.Network/networkSecurityGroups/write",
    "Microsoft.Network/networkSecurityGroups/join/action",
    # l.65-66, 71-74: zones, fault domains, sizes of nodes; the node lifecycle controller
    "Microsoft.Compute/virtualMachines/read",
    "Microsoft.Compute/virtualMachineScaleSets/read",
    "Microsoft.Compute/virtualMachineScaleSets/virtualMachines/read",
    "Microsoft.Compute/virtualMachineScaleSets/virtualMachines/instanceView/read",
    # l.78-81: a scale set and its instances into a backend pool
    "Microsoft.Compute/virtualMachineScaleSets/write",
    "Microsoft.Compute/virtualMachineScaleSets/virtualMachines/write",
    # l.86-91: nodes' internal IPs and backend pools
    "Microsoft.Network/networkInterfaces/read",
    "Microsoft.Compute/virtualMachineScaleSets/virtualMachines/networkInterfaces/read",
    "Microsoft.Compute/virtualMachineScaleSets/virtualMachines/networkInterfaces/ipconfigurations/publicipaddresses/read",
    # l.93-95, 113-114: an internal load balancer's subnet (the pool subnets, Network Contributor there)
    "Microsoft.Network/virtualNetworks/read",
    "Microsoft.Network/virtualNetworks/subnets/read",
    "Microsoft.Network/virtualNetworks/subnets/join/action",
)

# cluster-autoscaler's actions on each of its node groups' scale sets (its README's only word is
# Contributor on the subscription, cloudprovider/azure/README.md:20-26 at cluster-autoscaler-1.34.5;
# these are the calls its vmss node groups make there, cloudprovider/azure/ at that tag):
AUTOSCALER_ACTIONS: tuple[str, ...] = (
    # azure_scale_set.go:240 virtualMachineScaleSetsClient.Get
    "Microsoft.Compute/virtualMachineScaleSets/read",
    # azure_scale_set.go:443 virtualMachineScaleSetVMsClient.List
    "Microsoft.Compute/virtualMachineScaleSets/virtualMachines/read",
    # azure_scale_set.go:548 virtualMachineScaleSetsClient.CreateOrUpdateAsync (capacity)
    "Microsoft.Compute/virtualMachineScaleSets/write",
    # azure_force_delete_scale_set.go:73 virtualMachineScaleSetsClient.DeleteInstancesAsync
    "Microsoft.Compute/virtualMachineScaleSets/delete/action",
)
# (the group's List calls, azure_cache.go:279 and :344, are Reader's on the group)


def subscription_of(resource_id: str) -> str:
    """/subscriptions/<id>/resourceGroups/... -> <id>"""
    parts = resource_id.split("/")
    if len(parts) < 3 or parts[1].lower() != "subscriptions":
        raise ValueError(f"not an Azure resource ID: {resource_id!r}")
    return parts[2]


def role_definition_id(resource_group_id: str, role_guid: str) -> str:
    subscription = subscription_of(resource_group_id)
    return f"/subscriptions/{subscription}/providers/Microsoft.Authorization/roleDefinitions/{role_guid}"


def assign_role(name: str, *, scope: pulumi.Input[str], principal_id: pulumi.Input[str],
                definition: pulumi.Input[str], description: str,
                opts: pulumi.ResourceOptions) -> authorization.RoleAssignment:
    """A role assignment to a managed identity, named from (scope, principal, role)."""
    return authorization.RoleAssignment(
        name,
        role_assignment_name=assignment_name(scope, principal_id, definition),
        scope=scope,
        principal_id=principal_id,
        # A managed identity is a service principal; the SDK's default is "User"
        # (pulumi_azure_native/authorization/role_assignment.py: `if principal_type is None:
        # principal_type = 'User'`). Given, Azure also skips looking the principal up in Entra
        # ID, where a just-created identity may not have replicated yet (PrincipalNotFound).
        principal_type=authorization.PrincipalType.SERVICE_PRINCIPAL,
        role_definition_id=definition,
        description=description,
        opts=opts,
    )


def assignment_name(scope: pulumi.Input[str], principal_id: pulumi.Input[str],
                    role: pulumi.Input[str]) -> pulumi.Output[str]:
    """The role assignment's GUID from (scope, principal, role definition)
    (kilonode.plan.azure_names.role_assignment_name says why). All three are Azure's outputs,
    so the name is computed once they are known: the logical resource names stay as they are."""
    return pulumi.Output.all(scope, principal_id, role).apply(lambda v: role_assignment_name(v[0], v[1], v[2]))


@dataclass(frozen=True)
class ControllerIdentitiesArgs:
    cluster: str
    location: str
    # where the identities themselves live, and the subscription (the cluster's own group)
    resource_group_name: pulumi.Input[str]
    resource_group_id: pulumi.Output[str]
    node_resource_group: str  # the plan's node_resource_group: created here
    pools_nsg_id: pulumi.Output[str]  # the one NSG of every pool subnet (kilonode.azure.network)
    pool_subnet_ids: Mapping[str, pulumi.Output[str]]  # pool -> its subnet
    autoscaler: bool  # the plan has autoscaled pools: the autoscaler gets an identity


@dataclass(frozen=True)
class Identity:
    id: pulumi.Output[str]  # what a scale set's identity lists
    client_id: pulumi.Output[str]  # what azure.json names (userAssignedIdentityID)
    principal_id: pulumi.Output[str]  # what role assignments name
    tenant_id: pulumi.Output[str]


class ControllerIdentities(pulumi.ComponentResource):
    node_resource_group_name: pulumi.Output[str]
    node_resource_group_id: pulumi.Output[str]
    cloud_provider: Identity
    autoscaler: Identity | None

    def __init__(
        self, name: str, args: ControllerIdentitiesArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("kilonode:azure:ControllerIdentities", name, None, opts)
        self._name, self._args = name, args
        # what a scale set of the pools needs to exist first (the group, the identities): the
        # first join wave's gate; not the component itself, whose autoscaler role assignments
        # are scoped to the scale sets and wait for them
        self.ready: list[pulumi.Resource] = []
        child = pulumi.ResourceOptions(parent=self)
        # The pools' own group: the scope of the controllers' rights (the docstring says why)
        nodes = resources.ResourceGroup(
            f"{name}-nodes-rg", resource_group_name=args.node_resource_group, location=args.location,
            tags=tags(args.cluster, "nodes"), opts=child,
        )
        self.ready.append(nodes)
        self.node_resource_group_name = nodes.name
        self.node_resource_group_id = nodes.id
        ccm = self._identity(f"{name}-cloud-provider", "cloud-provider")
        ccm_role = self._custom_role(f"{name}-cloud-provider", "cloud-provider", CLOUD_PROVIDER_ACTIONS,
                                     "cloud-controller-manager: Service load balancers and node reads")
        self._assign(f"{name}-cloud-provider-nodes", ccm, ccm_role, nodes.id,
                     "cloud-controller-manager (the pools' group)")
        for role, scope in [
            ("pools-nsg", args.pools_nsg_id),
            *[(f"subnet-{pool}", subnet) for pool, subnet in args.pool_subnet_ids.items()],
        ]:
            self._assign(f"{name}-cloud-provider-{role}", ccm, self._builtin(NETWORK_CONTRIBUTOR), scope,
                         f"cloud-controller-manager ({role})")
        self.cloud_provider = ccm
        self.autoscaler = None
        self._autoscaler_role: pulumi.Output[str] | None = None
        if args.autoscaler:
            self.autoscaler = self._identity(f"{name}-autoscaler", "autoscaler")
            self._autoscaler_role = self._custom_role(f"{name}-autoscaler", "autoscaler", AUTOSCALER_ACTIONS,
                                                      "cluster-autoscaler: node groups' capacity and instances")
            # LISTs the group's scale sets and VMs; acts only on its node groups (grant_node_groups)
            self._assign(f"{name}-autoscaler-reader", self.autoscaler, self._builtin(READER), nodes.id,
                         "cluster-autoscaler (reads the pools' group)")
        self.register_outputs({"nodeResourceGroup": self.node_resource_group_name,
                               "cloudProviderClientId": ccm.client_id})

    def grant_node_groups(self, scale_set_ids: Mapping[str, pulumi.Output[str]]) -> None:
        """The autoscaler's custom role (AUTOSCALER_ACTIONS) on each of its node groups' scale
        sets (scale set name -> ID), and on nothing else: capacity and instance deletion."""
        if self.autoscaler is None or self._autoscaler_role is None:
            if scale_set_ids:
                raise ValueError("node groups given, but the plan has no autoscaled pool (no autoscaler identity)")
            return
        for shard, scale_set_id in scale_set_ids.items():
            self._assign(f"{self._name}-autoscaler-{shard}", self.autoscaler, self._autoscaler_role,
                         scale_set_id, f"cluster-autoscaler (node group {shard})")

    def _identity(self, logical: str, role: str) -> Identity:
        args = self._args
        identity = managedidentity.UserAssignedIdentity(
            f"{logical}-identity",
            resource_name_=f"{args.cluster}-{role}",
            resource_group_name=args.resource_group_name,
            location=args.location,
            tags=tags(args.cluster, role),
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.ready.append(identity)
        return Identity(id=identity.id, client_id=identity.client_id, principal_id=identity.principal_id,
                        tenant_id=identity.tenant_id)

    def _builtin(self, role_guid: str) -> pulumi.Output[str]:
        return self._args.resource_group_id.apply(lambda rg: role_definition_id(rg, role_guid))

    def _custom_role(self, logical: str, role: str, actions: Sequence[str], what: str) -> pulumi.Output[str]:
        """A custom role of exactly these actions (no data actions), assignable in the pools' group
        only; returns its role definition ID, known before Azure creates it (the GUID is ours),
        for assignments that wait for it."""
        args = self._args
        group = self.node_resource_group_id
        guid = group.apply(lambda g: role_definition_name(g, role))
        definition = authorization.RoleDefinition(
            f"{logical}-role",
            role_definition_id=guid,
            # a role's name is unique in the tenant: the group's subscription and name say whose
            role_name=group.apply(lambda g: f"kilonode {args.cluster} {role} ({subscription_of(g)}/"
                                            f"{args.node_resource_group})"),
            description=f"kilonode {args.cluster}: {what} (kilonode.azure.identity)",
            role_type="CustomRole",
            scope=group,
            assignable_scopes=[group],
            permissions=[authorization.PermissionArgs(actions=list(actions))],
            opts=pulumi.ResourceOptions(parent=self),
        )
        return pulumi.Output.all(group, guid, definition.id).apply(lambda v: role_definition_id(v[0], v[1]))

    def _assign(self, logical: str, identity: Identity, definition: pulumi.Output[str], scope: pulumi.Input[str],
                what: str) -> None:
        assign_role(logical, scope=scope, principal_id=identity.principal_id, definition=definition,
                    description=f"kilonode {self._args.cluster}: {what}", opts=pulumi.ResourceOptions(parent=self))
