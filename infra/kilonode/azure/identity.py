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
    Network Contributor and Virtual Machine Contributor on that group, Network Contributor on
    the pools' NSG and on each pool subnet.
  (`loadBalancerBackendPoolConfigurationType: nodeIP` would avoid the scale-set writes, but
  its IP-based backend pools need virtualNetworks/joinLoadBalancer/action on the whole VNet.)
- cluster-autoscaler (cluster-autoscaler-1.34.5 cloudprovider/azure/azure_cache.go
  fetchAzureResources: VirtualMachineScaleSetsClient.List and VirtualMachinesClient.List of its
  `resourceGroup`, then capacity and instance deletion on its node groups' scale sets):
    Reader on the node group, Virtual Machine Contributor on each node group's scale set only
    (ControllerIdentities.grant_node_groups, once the scale sets exist).
- cloud-node-manager: none. With --use-instance-metadata it builds an IMDS node provider
  (pkg/node/nodeproviderfactory.go l.26-36), which reads the node's own instance metadata and
  asks for no token.
- the kubelet: none (--cloud-provider=external, no azure.json, no credential provider: every
  image comes from a public registry). Image pulls need no identity.
- etcd snapshot upload: its own identity, on the etcd VMs only, Storage Blob Data Contributor
  on the one container (kilonode.azure.backup).

Both controllers run where their identities are, and nowhere else: on the plan's
controller_pools (the system pools), required by node affinity (kilonode.k8s.cloud_provider),
on the host network, where the instance metadata service still answers; every pool node drops
pod traffic to it (kilonode.render.metadata_block). GPU pools' scale sets carry no identity.

Roles are built-in roles, fixed GUIDs in every tenant ("Azure built-in roles",
learn.microsoft.com/azure/role-based-access-control/built-in-roles: general, Reader
acdd72a7-3385-48ef-bd42-f606fba81ae7, `*/read`; compute, Virtual Machine Contributor
9980e02c-c2be-4d73-94e8-173b1dc7cf3c; networking, Network Contributor
4d97b98b-1d4f-4787-a291-c67834d212e7). A custom role with only the actions above would be
narrower still (no runCommand on pool instances); it needs roleDefinitions/write from the
deployer, and is left as that choice.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import pulumi
from pulumi_azure_native import authorization, managedidentity, resources

from kilonode.azure.common import tags
from kilonode.plan.azure_names import role_assignment_name

# Azure built-in role definition IDs (the module docstring cites them).
NETWORK_CONTRIBUTOR = "4d97b98b-1d4f-4787-a291-c67834d212e7"
VIRTUAL_MACHINE_CONTRIBUTOR = "9980e02c-c2be-4d73-94e8-173b1dc7cf3c"
READER = "acdd72a7-3385-48ef-bd42-f606fba81ae7"


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
        for role, guid, scope in [
            ("network-contributor", NETWORK_CONTRIBUTOR, nodes.id),
            ("vm-contributor", VIRTUAL_MACHINE_CONTRIBUTOR, nodes.id),
            ("pools-nsg", NETWORK_CONTRIBUTOR, args.pools_nsg_id),
            *[(f"subnet-{pool}", NETWORK_CONTRIBUTOR, subnet) for pool, subnet in args.pool_subnet_ids.items()],
        ]:
            self._assign(f"{name}-cloud-provider-{role}", ccm, guid, scope, f"cloud-controller-manager ({role})")
        self.cloud_provider = ccm
        self.autoscaler = None
        if args.autoscaler:
            self.autoscaler = self._identity(f"{name}-autoscaler", "autoscaler")
            # LISTs the group's scale sets and VMs; acts only on its node groups (grant_node_groups)
            self._assign(f"{name}-autoscaler-reader", self.autoscaler, READER, nodes.id,
                         "cluster-autoscaler (reads the pools' group)")
        self.register_outputs({"nodeResourceGroup": self.node_resource_group_name,
                               "cloudProviderClientId": ccm.client_id})

    def grant_node_groups(self, scale_set_ids: Mapping[str, pulumi.Output[str]]) -> None:
        """The autoscaler's Virtual Machine Contributor on each of its node groups' scale sets
        (scale set name -> ID), and on nothing else: capacity and instance deletion."""
        if self.autoscaler is None:
            if scale_set_ids:
                raise ValueError("node groups given, but the plan has no autoscaled pool (no autoscaler identity)")
            return
        for shard, scale_set_id in scale_set_ids.items():
            self._assign(f"{self._name}-autoscaler-{shard}", self.autoscaler, VIRTUAL_MACHINE_CONTRIBUTOR,
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

    def _assign(self, logical: str, identity: Identity, role_guid: str, scope: pulumi.Input[str],
                what: str) -> None:
        definition = self._args.resource_group_id.apply(lambda rg, guid=role_guid: role_definition_id(rg, guid))
        assign_role(logical, scope=scope, principal_id=identity.principal_id, definition=definition,
                    description=f"kilonode {self._args.cluster}: {what}", opts=pulumi.ResourceOptions(parent=self))
