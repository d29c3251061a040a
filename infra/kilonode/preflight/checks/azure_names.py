"""azure-names: every name Azure requires to be unique is unique for its scope, and valid.

Azure refuses a name at create time, after everything before it was created: the run stops
half way. From the recorded graph, this check recomputes each name whose scope is wider than
the cluster and applies Azure's naming rules to the others
(resource-name-rules.md: MicrosoftDocs/azure-docs articles/azure-resource-manager/management/
resource-name-rules.md; https://learn.microsoft.com/azure/azure-resource-manager/management/resource-name-rules):

- Role assignments (scope: the Entra **tenant**, "Must be a globally unique identifier"): the
  name must be the GUID of (scope, principal id, role definition id)
  (kilonode.plan.azure_names.role_assignment_name). A name from the cluster and role alone is
  the same in every subscription of the tenant (RoleAssignmentExists, HTTP 409) and stays when
  an identity is replaced (RoleAssignmentUpdateNotPermitted: "Tenant ID, application ID,
  principal ID, and scope are not allowed to be updated"). `principalType` must be given for
  the managed identities: the SDK defaults it to User. The one other principal, whoever runs
  `pulumi up` (the VHD upload's role), may be either kind: its assignment names no type.
- Storage accounts (scope: **all of Azure**, 3-24 lowercase letters and digits): the name must
  carry the digest of the subscription (kilonode.plan.azure_names.storage_account_name). A name
  that is a function of the stack name alone is taken by whoever deploys that stack first.
- Per resource group (or per gallery): no two resources of a type share a name (names are
  case-insensitive), and each fits its type's length and characters: galleries (1-80,
  alphanumerics, underscores and periods), gallery images (1-80), scale sets and Linux VMs
  (1-64, no leading underscore, no trailing period or hyphen), NSGs, NICs, load balancers,
  public IPs, VNets (1-80).

The subscription is read from the graph (the resource IDs the program derived); `kilonode
plan` records under a placeholder subscription, and the names are checked against it.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable

from kilonode.azure.mockplan import MOCK_DEPLOYER
from kilonode.plan.azure_names import STORAGE_NAME, STORAGE_TAGS, role_assignment_name, storage_account_name
from kilonode.preflight.model import Finding, Inputs, Resource

NAME = "azure-names"
TITLE = "names Azure requires to be unique (tenant, global, resource group) and valid"

ROLE_ASSIGNMENT = "azure-native:authorization:RoleAssignment"
STORAGE_ACCOUNT = "azure-native:storage:StorageAccount"
GUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$", re.IGNORECASE)
SUBSCRIPTION = re.compile(r"/subscriptions/([0-9a-f-]{36})/", re.IGNORECASE)

# Per-scope rules (resource-name-rules.md, the facts' table): type -> (the input that names it,
# the inputs that name its scope, max length, allowed pattern, the rule in words).
_VM_NAME = (r"^[^_].*[^.-]$|^[^_.-]$", "no leading underscore, no trailing period or hyphen")
_NETWORK_NAME = (r"^[A-Za-z0-9][A-Za-z0-9_.-]*[A-Za-z0-9_]$|^[A-Za-z0-9]$",
                 "alphanumerics, underscores, periods and hyphens; start alphanumeric, end alphanumeric or underscore")
RULES: dict[str, tuple[str, tuple[str, ...], int, str, str]] = {
    "azure-native:compute:Gallery": ("galleryName", ("resourceGroupName",), 80,
                                     r"^[A-Za-z0-9]([A-Za-z0-9_.]*[A-Za-z0-9])?$",
                                     "alphanumerics, underscores and periods; start and end alphanumeric"),
    "azure-native:compute:GalleryImage": ("galleryImageName", ("resourceGroupName", "galleryName"), 80,
                                          r"^[A-Za-z0-9_.-]+$", "alphanumerics, underscores, hyphens and periods"),
    "azure-native:compute:VirtualMachineScaleSet": ("vmScaleSetName", ("resourceGroupName",), 64, *_VM_NAME),
    "azure-native:compute:VirtualMachine": ("vmName", ("resourceGroupName",), 64, *_VM_NAME),
    "azure-native:network:NetworkSecurityGroup": ("networkSecurityGroupName", ("resourceGroupName",), 80,
                                                  *_NETWORK_NAME),
    "azure-native:network:NetworkInterface": ("networkInterfaceName", ("resourceGroupName",), 80, *_NETWORK_NAME),
    "azure-native:network:LoadBalancer": ("loadBalancerName", ("resourceGroupName",), 80, *_NETWORK_NAME),
    "azure-native:network:PublicIPAddress": ("publicIpAddressName", ("resourceGroupName",), 80, *_NETWORK_NAME),
    "azure-native:network:VirtualNetwork": ("virtualNetworkName", ("resourceGroupName",), 64, *_NETWORK_NAME),
}


def subscription_of(inputs: Inputs) -> str | None:
    """The subscription the graph's resource IDs name, when they name exactly one."""
    found = {m.lower() for r in inputs.resources if not r.is_kubernetes
             for m in SUBSCRIPTION.findall(str(dict(r.inputs)))}
    return found.pop() if len(found) == 1 else None


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _role_assignments(resources: list[Resource]) -> list[Finding]:
    findings = []
    by_name: dict[str, list[str]] = defaultdict(list)
    by_triple: dict[tuple[str, ...], list[str]] = defaultdict(list)
    for r in resources:
        name, scope = _text(r.inputs.get("roleAssignmentName")), _text(r.inputs.get("scope"))
        principal, role = _text(r.inputs.get("principalId")), _text(r.inputs.get("roleDefinitionId"))
        if name is None or scope is None or principal is None or role is None:
            continue
        by_name[name.lower()].append(r.describe())
        by_triple[(scope.lower(), principal.lower(), role.lower())].append(r.describe())
        expected = role_assignment_name(scope, principal, role)
        if not GUID.match(name):
            findings.append(Finding(NAME, "break", r.describe(), f"role assignment name {name!r} is not a GUID: "
                                    "Azure refuses it (roleAssignments: 'Must be a globally unique identifier')",
                                    "name it kilonode.plan.azure_names.role_assignment_name(scope, principal, role)"))
        elif name.lower() != expected:
            findings.append(Finding(
                NAME, "break", r.describe(),
                f"role assignment name {name} is not derived from its scope, principal and role: names are unique "
                "in the whole Entra tenant, so the same stack in another subscription of the tenant fails with "
                "RoleAssignmentExists, and after its identity is replaced the run fails with "
                "RoleAssignmentUpdateNotPermitted",
                f"derive it from (scope, principal id, role definition id) inside an apply: {expected} here "
                "(kilonode.plan.azure_names.role_assignment_name)"))
        if principal == MOCK_DEPLOYER:
            # whoever runs `pulumi up` (kilonode.azure.node_image): a user or a service principal, so
            # no type is given and Azure looks it up
            if r.inputs.get("principalType") is not None:
                findings.append(Finding(
                    NAME, "break", r.describe(),
                    f"principalType {r.inputs.get('principalType')} for the deployer, who may be a user or a service "
                    "principal: Azure refuses the other kind (UnmatchedPrincipalType)",
                    "give no principalType for the deployer's assignment (kilonode.azure.node_image)"))
        elif r.inputs.get("principalType") in (None, "User"):
            findings.append(Finding(
                NAME, "break", r.describe(),
                "principalType is User (the SDK's default when none is given) for a managed identity: Azure looks "
                "the principal up as a user and the assignment fails or is made for the wrong kind of principal",
                "give principalType ServicePrincipal (authorization.PrincipalType.SERVICE_PRINCIPAL)"))
    findings += _shared("role assignment name", by_name, "tenant")
    findings += [Finding(NAME, "break", ", ".join(who),
                         "two role assignments of the same principal, role and scope: Azure keeps one and refuses "
                         "the other (RoleAssignmentExists, HTTP 409)", "keep one of them")
                 for who in by_triple.values() if len(who) > 1]
    return findings


def _storage_accounts(inputs: Inputs, resources: list[Resource], subscription: str | None) -> list[Finding]:
    findings = []
    by_name: dict[str, list[str]] = defaultdict(list)
    cluster = inputs.plan.cluster
    derived = {storage_account_name(cluster, tag, subscription) for tag in STORAGE_TAGS} if subscription else set()
    for r in resources:
        name = _text(r.inputs.get("accountName"))
        if name is None:
            continue
        by_name[name].append(r.describe())
        if not STORAGE_NAME.match(name):
            findings.append(Finding(NAME, "break", r.describe(),
                                    f"storage account name {name!r} is not 3-24 lowercase letters and digits: "
                                    "Azure refuses it", "use kilonode.plan.azure_names.storage_account_name"))
        elif subscription is None:
            findings.append(Finding(NAME, "warn", r.describe(),
                                    f"storage account name {name}: the graph names no single subscription, so "
                                    "whether the name is unique across Azure cannot be shown",
                                    "check the graph: every resource ID should name the stack's subscription"))
        elif name not in derived:
            findings.append(Finding(
                NAME, "break", r.describe(),
                f"storage account name {name} is not derived from the subscription: storage names are global "
                "across Azure, so a name that follows from the stack's name alone is taken by whoever deploys "
                "that stack first, and every other deployment fails with StorageAccountAlreadyTaken",
                "name it kilonode.plan.azure_names.storage_account_name(cluster, tag, subscription), computed "
                "inside an apply over the resource group's ID"))
    return findings + _shared("storage account name", by_name, "all of Azure")


def _per_scope(inputs: Inputs) -> list[Finding]:
    findings = []
    for type_, (name_input, scope_inputs, length, pattern, rule) in RULES.items():
        seen: dict[tuple[str, ...], list[str]] = defaultdict(list)
        for r in inputs.of_type(type_):
            name = _text(r.inputs.get(name_input))
            if name is None:
                continue
            scope = tuple(str(r.inputs.get(key, "")).lower() for key in scope_inputs)
            seen[(*scope, name.lower())].append(r.describe())
            if not 1 <= len(name) <= length or not re.match(pattern, name):
                findings.append(Finding(NAME, "break", r.describe(),
                                        f"name {name!r} breaks Azure's rule for {type_.rpartition(':')[2]}: 1-{length} "
                                        f"characters, {rule}; Azure refuses it", "rename it in the program"))
        findings += _shared(f"{type_.rpartition(':')[2]} name", seen, "its resource group")
    return findings


def _shared(what: str, groups: dict[str, list[str]] | dict[tuple[str, ...], list[str]], scope: str) -> list[Finding]:
    return [Finding(NAME, "break", ", ".join(who), f"the same {what} for {len(who)} resources, unique in "
                    f"{scope}: Azure creates the first and refuses or overwrites the others",
                    "give each its own name") for who in _many(groups.values())]


def _many(groups: Iterable[list[str]]) -> list[list[str]]:
    return [who for who in groups if len(who) > 1]


def check(inputs: Inputs) -> list[Finding]:
    subscription = subscription_of(inputs)
    return (_role_assignments(inputs.of_type(ROLE_ASSIGNMENT))
            + _storage_accounts(inputs, inputs.of_type(STORAGE_ACCOUNT), subscription)
            + _per_scope(inputs))
