"""ControllerIdentities: the resource group the pools live in, and the user-assigned managed
identities of the two controllers that act on Azure, each role assignment scoped to the
narrowest resources its controller touches. No identity here has a right over a resource of the
cluster's own resource group beyond the pools' NSG and subnets: the etcd and apiserver VMs,
their NICs and disks, the VNet, the control-plane subnets and the backup account are out of
every scope (preflight's `identities` check proves it on the recorded graph).

Who needs Azure, read at the pinned releases:

- cloud-controller-manager (cloud-provider-azure v1.34.13, vmType vmss, --controllers=*,-cloud-node,
  no routes, `loadBalancerBackendPoolConfigurationType: nodeIP`): Service load balancers and
  their public IPs, created in its `resourceGroup` (azure_loadbalancer.go
  getLoadBalancerResourceGroup, getPublicIPAddressResourceGroup); every node's private IP into
  their backend pools by address, a PUT of the backend pool alone
  (azure_loadbalancer_backendpool.go backendPoolTypeNodeIP.EnsureHostsInPool l.325-437:
  CreateOrUpdateLBBackendPool, the pool naming the VNet), which Azure authorizes with
  `virtualNetworks/joinLoadBalancer/action` on that VNet ("AKS service permissions": "Required to
  configure the IP based Load Balancer backend pools"); every scale set of `resourceGroup`
  LISTed into its cache (azure_vmss_cache.go l.73-80: VirtualMachineScaleSetClient.List
  (resourceGroup), which Azure authorizes at the group's scope); the node lifecycle controller's
  instance reads; the one NSG of its azure.json (Service rules); the subnet of an internal load
  balancer's frontend. No scale-set or VM write: in nodeIP mode the only paths that PUT a scale
  set or an instance are ReconcileBackendPools' and safeDeleteLoadBalancer's
  EnsureBackendPoolDeleted (azure_loadbalancer_backendpool.go l.527, azure_loadbalancer.go
  l.752, azure_vmss.go l.1743-1886, 1888-2163, 2240-2326), which write only a scale set whose
  NIC configuration, or an instance whose IP configuration, names one of the Service pools
  (a NIC-based pool left from nodeIPConfiguration mode); kilonode's scale sets name none
  (kilonode.azure.node_pool), and nodeIP mode never adds one. The same at v1.32.20, v1.33.17
  and v1.35.8. (The default, nodeIPConfiguration, PUTs every scale set and instance into the
  pools, azure_vmss.go ensureVMSSInPool/EnsureHostInPool: `virtualMachineScaleSets/write`,
  with which a token rewrites any pool's model, customData and extensions, and its capacity:
  root on every new instance.)
  Hence the pools and what it creates live in a group of their own, the plan's
  node_resource_group, holding nothing of the control plane:
    the custom role CLOUD_PROVIDER_ACTIONS on that group, Network Contributor on the pools' NSG
    and on each pool subnet (a network role on an NSG or a subnet reaches no VM), and the
    custom role CLOUD_PROVIDER_VNET_ACTIONS (joinLoadBalancer alone, assignable in the
    cluster's group, where the VNet is) on the VNet itself. What that last one allows: a load
    balancer of the pools' group may name any address of the VNet in a backend pool, a
    control-plane VM's among them. It changes nothing in the VNet, and opens no path: Azure's
    load balancer passes flows through with the client's source address ("Azure Load Balancer
    components": no flow is terminated or originated; a Standard load balancer is closed to
    inbound flows unless an NSG opens them, "What is Azure Load Balancer?"), so the control-plane
    and etcd subnets' NSGs (kilonode.azure.network: deny-all after the few sources they admit)
    judge each such flow by the same source as a direct one: what reaches a control-plane port
    this way could reach it without the load balancer (the apiserver's admitted ranges, the admin
    range's SSH), and nothing else. Preflight's `identities` check passes a custom role of
    these actions alone (LINKED_ACCESS_ACTIONS) on a scope holding control-plane resources, and
    nothing more.
- cluster-autoscaler (cluster-autoscaler-1.34.5 cloudprovider/azure/azure_cache.go
  fetchAzureResources: VirtualMachineScaleSetsClient.List and VirtualMachinesClient.List of its
  `resourceGroup`, then capacity and instance deletion on its node groups' scale sets):
    Reader on the node group, the custom role AUTOSCALER_ACTIONS on each node group's scale set
    only (ControllerIdentities.grant_node_groups, once the scale sets exist).
  Residual risk, plainly: its capacity change is a PUT of the scale set
  (azure_scale_set.go:548 CreateOrUpdateAsync), which needs `virtualMachineScaleSets/write`,
  and Azure RBAC grants an action, not the properties a write may change: the same token may
  rewrite those scale sets' model (customData, extensions) and every instance created after is
  the attacker's, as root. Only the autoscaled pools' scale sets are exposed (in the shipped
  stacks: research-7500's h100-ib, its 25 node groups; research-2500 and local have none, and
  make no autoscaler identity). Azure Policy does not close it: a policy judges the request's
  content, not who sends it, so it cannot tell the deployer's PUT of a new customData from the
  autoscaler's token doing the same (exemptions are per scope, not per principal).
- Azure Disk CSI's controller (kubernetes-sigs/azuredisk-csi-driver v1.34.5, kilonode.k8s.storage):
  makes, deletes and resizes managed disks in its azure.json's `resourceGroup` (the pools' group)
  and attaches them to, and detaches them from, scale-set instances by a PUT of the instance
  whose body holds its storageProfile.dataDisks and nothing else
  (vendor/sigs.k8s.io/cloud-provider-azure/pkg/provider/azure_controller_vmss.go AttachDisk
  l.37-131, DetachDisk l.134-226 at that tag: VirtualMachineScaleSetVMClient.Update,
  pkg/azclient/virtualmachinescalesetvmclient/custom.go l.31-40, armcompute BeginUpdate).
  An identity of its own, on the controller pools' scale sets where its pods run, named in its
  own azure.json (kilonode.k8s.storage): cloud-controller-manager's role stays without any disk
  action or scale-set write. Its actions are upstream's list
  (docs/driver-parameters.md l.4-36 at v1.34.5, "required permissions for CSI driver
  controller"), less what this cluster never asks for (DISK_CSI_ACTIONS says which), split in two:
    the custom role DISK_CSI_ACTIONS (disks, the reads, the operations it polls) on the pools'
    group, where the disks are; the custom role DISK_CSI_ATTACH_ACTIONS
    (`virtualMachineScaleSets/virtualMachines/write` alone) on each scale set of the pools its
    node plugin runs on (kilonode.k8s.storage node_plugin_pools: pools without GPUs, monitoring and
    system pools, the Prometheus pool), so a GPU pool's instances (kilonode.plan.resolve.components
    runs_disk_plugin keeps the plugin off them) are out of its reach (ControllerIdentities.
    grant_disk_pools, once the scale sets exist).
  Residual risk, plainly: Azure RBAC grants the instance write, not the properties it may change:
  the same token may PUT any property of those pools' instances that an instance-level update
  may change (its data disks, its protection policy), and attach any disk of the pools' group
  to one of them (another pool node's data disk, Prometheus's among them). It cannot change a
  scale set's model (customData, extensions: no `virtualMachineScaleSets/write`), run a command,
  or reach a GPU instance.
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

The controllers run where their identities are, and nowhere else: on the plan's
controller_pools (the system pools), required by node affinity (kilonode.k8s.cloud_provider),
on the host network, where the instance metadata service still answers; every pool node drops
pod traffic to it (kilonode.render.metadata_block). GPU pools' scale sets carry no identity.

Built-in roles are fixed GUIDs in every tenant ("Azure built-in roles",
learn.microsoft.com/azure/role-based-access-control/built-in-roles: general, Reader
acdd72a7-3385-48ef-bd42-f606fba81ae7, `*/read`; networking, Network Contributor
4d97b98b-1d4f-4787-a291-c67834d212e7). Virtual Machine Contributor is used nowhere: it holds
`Microsoft.Compute/virtualMachineScaleSets/virtualMachines/runCommand/*` and `extensions/write`,
with which a controller's token (an escape on a system node) is root on every GPU instance.
The controllers get custom roles instead (authorization.RoleDefinition, assignable in the
pools' group only, but the VNet's joinLoadBalancer role: in the cluster's group), each listing
only the actions its controller calls at the pinned release;
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
    # (no backendAddressPools/join/action: that is the linked access check of a scale set's or a
    # NIC's PUT naming a pool, and in nodeIP mode nothing names one)
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
    # (not l.78-81, virtualMachineScaleSets/write and .../virtualMachines/write: "a scale set and
    # its instances into a backend pool", which nodeIP mode does by address; the module
    # docstring cites the code. With either, a token rewrites every pool's scale-set model.)
    # l.86-91: nodes' internal IPs and backend pools
    "Microsoft.Network/networkInterfaces/read",
    "Microsoft.Compute/virtualMachineScaleSets/virtualMachines/networkInterfaces/read",
    "Microsoft.Compute/virtualMachineScaleSets/virtualMachines/networkInterfaces/ipconfigurations/publicipaddresses/read",
    # l.93-95, 113-114: an internal load balancer's subnet (the pool subnets, Network Contributor there)
    "Microsoft.Network/virtualNetworks/read",
    "Microsoft.Network/virtualNetworks/subnets/read",
    "Microsoft.Network/virtualNetworks/subnets/join/action",
)

# cloud-controller-manager's action on the VNet itself (in the cluster's own group): an IP-based
# backend pool names the VNet, and Azure checks this action there (linked access). Not on
# upstream's list (its users hold Network Contributor); "AKS service permissions"
# (learn.microsoft.com/azure/aks/aks-service-permissions): "Microsoft.Network/virtualNetworks/
# joinLoadBalancer/action: Required to configure the IP based Load Balancer backend pools".
CLOUD_PROVIDER_VNET_ACTIONS: tuple[str, ...] = (
    "Microsoft.Network/virtualNetworks/joinLoadBalancer/action",
)
# Actions that change nothing in the scope they are granted on, only let a resource elsewhere name
# it (Azure's linked access check): a role of these alone on a scope holding control-plane
# resources does not act on them (preflight's `identities` check; the docstring says why).
LINKED_ACCESS_ACTIONS: frozenset[str] = frozenset(CLOUD_PROVIDER_VNET_ACTIONS)

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

# Azure Disk CSI's controller on the pools' group (kubernetes-sigs/azuredisk-csi-driver,
# docs/driver-parameters.md l.4-36 at v1.34.5, "required permissions for CSI driver controller";
# each action below is a line of that list), less: diskEncryptionSets/read (l.9: no StorageClass names
# a disk encryption set), snapshots/* (l.10-12: no snapshotter, kilonode.k8s.storage),
# virtualMachines/read|write (l.13-14: standalone VMs; every node is a scale-set instance, vmType
# vmss), `resourceGroups/*/read` (l.21: a read of every resource of the group, where the reads
# below name theirs), and l.22-34, "needed only when the virtualMachine or virtualMachineScaleSets
# have these additional resources configured": Azure's linked access checks of an instance PUT
# naming them, where the driver's PUT names its data disks alone (the module docstring cites it).
DISK_CSI_ACTIONS: tuple[str, ...] = (
    "Microsoft.Compute/disks/read",  # l.6
    "Microsoft.Compute/disks/write",  # l.7: create, resize
    "Microsoft.Compute/disks/delete",  # l.8
    "Microsoft.Compute/virtualMachineScaleSets/read",  # l.17: the group's scale sets, listed into its cache
    "Microsoft.Compute/virtualMachineScaleSets/virtualMachines/read",  # l.16: an instance's data disks
    "Microsoft.Compute/locations/operations/read",  # l.18: the long-running operations it polls
    "Microsoft.Compute/locations/DiskOperations/read",  # l.19
    "Microsoft.Resources/subscriptions/resourceGroups/read",  # l.20
)
# ... and on each scale set its node plugin runs on, attach and detach (l.15): a PUT of the
# instance's data disks (the module docstring cites the call).
DISK_CSI_ATTACH_ACTIONS: tuple[str, ...] = (
    "Microsoft.Compute/virtualMachineScaleSets/virtualMachines/write",
)


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
    vnet_id: pulumi.Output[str]  # the cluster's VNet: IP-based backend pools name it
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
    disk_csi: Identity  # Azure Disk CSI's controller (kilonode.k8s.storage)

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
        # joinLoadBalancer alone, on the VNet alone (the docstring says what it allows); assignable
        # in the cluster's group, where the VNet is
        vnet_role = self._custom_role(f"{name}-cloud-provider-vnet", "cloud-provider-vnet",
                                      CLOUD_PROVIDER_VNET_ACTIONS,
                                      "cloud-controller-manager: IP-based backend pools naming the VNet",
                                      group=args.resource_group_id)
        self._assign(f"{name}-cloud-provider-vnet", ccm, vnet_role, args.vnet_id,
                     "cloud-controller-manager (the VNet: IP-based backend pools)")
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
        # Azure Disk CSI's controller: the disks of the pools' group; attach and detach only on
        # its node plugin's pools' scale sets (grant_disk_pools)
        self.disk_csi = self._identity(f"{name}-disk-csi", "disk-csi")
        disk_role = self._custom_role(f"{name}-disk-csi", "disk-csi", DISK_CSI_ACTIONS,
                                      "Azure Disk CSI controller: managed disks of the pools' group")
        self._assign(f"{name}-disk-csi-nodes", self.disk_csi, disk_role, nodes.id,
                     "Azure Disk CSI controller (the pools' group: disks)")
        self._disk_attach_role = self._custom_role(f"{name}-disk-csi-attach", "disk-csi-attach",
                                                   DISK_CSI_ATTACH_ACTIONS,
                                                   "Azure Disk CSI controller: attach and detach on its pools")
        self.register_outputs({"nodeResourceGroup": self.node_resource_group_name,
                               "cloudProviderClientId": ccm.client_id,
                               "diskCsiClientId": self.disk_csi.client_id})

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

    def grant_disk_pools(self, scale_set_ids: Mapping[str, pulumi.Output[str]]) -> None:
        """The disk CSI controller's attach role (DISK_CSI_ATTACH_ACTIONS) on each scale set of the
        pools its node plugin runs on (scale set name -> ID), and on no other: the GPU pools'
        instances are never written."""
        for scale_set, scale_set_id in scale_set_ids.items():
            self._assign(f"{self._name}-disk-csi-{scale_set}", self.disk_csi, self._disk_attach_role,
                         scale_set_id, f"Azure Disk CSI controller (attach and detach on {scale_set})")

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

    def _custom_role(self, logical: str, role: str, actions: Sequence[str], what: str,
                     group: pulumi.Output[str] | None = None) -> pulumi.Output[str]:
        """A custom role of exactly these actions (no data actions), assignable in `group` only
        (the pools' group unless given); returns its role definition ID, known before Azure
        creates it (the GUID is ours), for assignments that wait for it."""
        args = self._args
        group = self.node_resource_group_id if group is None else group
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
