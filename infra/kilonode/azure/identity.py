"""CloudProviderIdentity: the user-assigned managed identity cloud-controller-manager acts as,
and its role assignments, each scoped to the cluster's resource group (nothing wider).

cloud-controller-manager runs on the pool nodes (kilonode.k8s.cloud_provider), so the
identity is attached to every pool scale set and read from the instance metadata service
(azure.json: useManagedIdentityExtension, userAssignedIdentityID). cloud-node-manager
reads the node's own instance metadata and needs no Azure credentials.

Roles, as cloud-provider-azure documents its needs: it writes load balancers, public IPs,
NSG rules and the NICs' backend-pool membership (Network Contributor), and updates scale
sets and their instances to put nodes in backend pools (Virtual Machine Contributor). Both
are built-in roles (fixed GUIDs, the same in every tenant); both are scoped to the one
resource group that holds the cluster, not the subscription.
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
from pulumi_azure_native import authorization, managedidentity

from kilonode.azure.common import tags
from kilonode.plan.azure_names import role_assignment_name

# Azure built-in role definition IDs (Microsoft's "Azure built-in roles" reference).
NETWORK_CONTRIBUTOR = "4d97b98b-1d4f-4787-a291-c67834d212e7"
VIRTUAL_MACHINE_CONTRIBUTOR = "9980e02c-c2be-4d73-94e8-173b1dc7cf3c"
ROLES = {"network-contributor": NETWORK_CONTRIBUTOR, "vm-contributor": VIRTUAL_MACHINE_CONTRIBUTOR}


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
class CloudProviderIdentityArgs:
    cluster: str
    location: str
    resource_group_name: pulumi.Input[str]
    resource_group_id: pulumi.Output[str]


class CloudProviderIdentity(pulumi.ComponentResource):
    id: pulumi.Output[str]
    client_id: pulumi.Output[str]
    tenant_id: pulumi.Output[str]

    def __init__(
        self, name: str, args: CloudProviderIdentityArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("kilonode:azure:CloudProviderIdentity", name, None, opts)
        identity = managedidentity.UserAssignedIdentity(
            f"{name}-identity",
            resource_name_=f"{args.cluster}-cloud-provider",
            resource_group_name=args.resource_group_name,
            location=args.location,
            tags=tags(args.cluster, "cloud-provider"),
            opts=pulumi.ResourceOptions(parent=self),
        )
        for role, guid in ROLES.items():
            definition = args.resource_group_id.apply(lambda rg, guid=guid: role_definition_id(rg, guid))
            assign_role(f"{name}-{role}", scope=args.resource_group_id, principal_id=identity.principal_id,
                        definition=definition,
                        description=f"kilonode {args.cluster}: cloud-controller-manager ({role})",
                        opts=pulumi.ResourceOptions(parent=self))
        self.id = identity.id
        self.client_id = identity.client_id
        self.tenant_id = identity.tenant_id
        self.register_outputs({"id": self.id, "clientId": self.client_id})
