"""Names Azure requires to be unique beyond the resource group, derived here once: the Pulumi
program computes them (inside `apply`, where they depend on Azure's outputs) and preflight's
`azure-names` check recomputes them from the recorded graph. Pure: no Pulumi, no I/O.

Sources (resource-name-rules: MicrosoftDocs/azure-docs
articles/azure-resource-manager/management/resource-name-rules.md, Learn
https://learn.microsoft.com/azure/azure-resource-manager/management/resource-name-rules):
- `Microsoft.Authorization/roleAssignments`: scope *tenant*, "Must be a globally unique
  identifier (GUID)"; role-assignments.md, "Name": "Role assignment resource names must be
  unique within the Microsoft Entra tenant, even if the scope of the role assignment is
  narrower." Bicep's guidance (scenarios-rbac.md, "Name"): "create a GUID that uses the
  scope, principal ID, and role ID together".
- `Microsoft.Storage/storageAccounts`: scope *global*, 3-24 characters, "Lowercase letters
  and numbers."
"""

from __future__ import annotations

import re
import uuid

from kilonode.digest import sha256_text

# Any fixed namespace gives stable names; this one is kilonode's own (uuid5 of its URL
# namespace name), so kilonode's names never coincide with another tool's derivation.
ROLE_ASSIGNMENT_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "kilonode:role-assignment")
ROLE_DEFINITION_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "kilonode:role-definition")

STORAGE_NAME = re.compile(r"^[a-z0-9]{3,24}$")
# A global storage name: <cluster, up to 12 alphanumerics><tag><6 hex of the digest>. The tag
# names what the account is for (the digest's `role`): at most 6 characters, so 24 in all.
STORAGE_TAGS = {"etcdbk": "etcd-backup", "img": "node-image"}
STORAGE_DIGEST_LENGTH = 6
READABLE_LENGTH = 12


def role_assignment_name(scope: str, principal_id: str, role_definition_id: str) -> str:
    """The assignment's GUID from (scope, principal, role), as Microsoft recommends: the same
    triple always gets the same name (a re-run never collides with itself: RoleAssignmentExists
    is a new name for an existing triple), another subscription's scope or a replaced identity's
    principal gets another name (a name reused for another principal or scope is
    RoleAssignmentUpdateNotPermitted). Azure compares IDs case-insensitively: so does this."""
    key = "|".join(part.lower() for part in (scope, principal_id, role_definition_id))
    return str(uuid.uuid5(ROLE_ASSIGNMENT_NAMESPACE, key))


def role_definition_name(assignable_scope: str, role: str) -> str:
    """A custom role definition's GUID from (its assignable scope, kilonode's name for the role):
    stable across runs, another for another group or subscription (a role definition's GUID is
    unique in the tenant). Case-insensitive, as Azure compares IDs."""
    return str(uuid.uuid5(ROLE_DEFINITION_NAMESPACE, f"{assignable_scope.lower()}|{role}"))


def readable(cluster: str) -> str:
    """The cluster's name as a storage name may carry it: lowercase letters and digits, 12 at most."""
    return re.sub(r"[^a-z0-9]", "", cluster.lower())[:READABLE_LENGTH]


def storage_account_name(cluster: str, tag: str, subscription: str) -> str:
    """A storage account name unique across Azure and stable: the cluster's name (readable),
    what the account is for (`tag`, STORAGE_TAGS), and a digest of the subscription, the cluster
    and that purpose. The same cluster in the same subscription always gets the same name (a new
    name would be a new, empty account); a cluster of the same name in any other subscription,
    anyone's, gets another. Nothing else enters it, so it never moves under unrelated changes
    (the resource group is named after the cluster: kilonode.azure.network)."""
    role = STORAGE_TAGS[tag]
    digest = sha256_text(f"kilonode:{subscription}:{cluster}:{role}")[:STORAGE_DIGEST_LENGTH]
    return f"{readable(cluster)}{tag}{digest}"
