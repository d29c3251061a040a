"""quota: the vCPUs per quota family and region the stack needs, and the rights the deployer
needs to assign roles; with Azure credentials, checked against Azure before anything is created.

Need: every VM of the recorded graph (its `hardwareProfile.vmSize`) and every scale set at the
size the cluster may reach (`sku.capacity`, or its autoscaler node group's ceiling), times the
size's vCPUs, summed per quota family (the VM-size catalogue's `quotaFamily`, carried by the
plan) and as the region's total ("cores"). A scale set that Azure cannot fill for want of
quota stops `pulumi up` part way, with every VM before it created.

Rights: the program creates role assignments (cloud-controller-manager's identity, the etcd
backup writer); the deployer needs `Microsoft.Authorization/roleAssignments/write` at their
scopes (Owner, User Access Administrator or Role Based Access Control Administrator; Contributor
has it in `notActions`).

Without credentials the check lists both (`warn`: it cannot confirm quota offline). With
`AZURE_SUBSCRIPTION_ID` and a token in `AZURE_ACCESS_TOKEN` (e.g. `az account get-access-token
--query accessToken -o tsv`) it asks Azure and refuses (`break`) when a family's or the region's
free quota is below the need, or the deployer's permissions on the resource group lack the
right:
- Compute Usage API, `GET /subscriptions/{id}/providers/Microsoft.Compute/locations/{location}/usages`
  (api-version 2024-07-01)
  (azure-rest-api-specs specification/compute/resource-manager/Microsoft.Compute/ComputeRP/stable/
  2024-07-01/examples/computeRPCommonExamples/Usage_List_MaximumSet_Gen.json): `value[]` of
  `{name: {value}, currentValue, limit}`; free = limit - currentValue.
- Permissions API, `GET /subscriptions/{id}/resourcegroups/{rg}/providers/Microsoft.Authorization/permissions`
  (api-version 2022-04-01)
  (specification/authorization/.../stable/2022-04-01/authorization-RoleDefinitionsCalls.json,
  Permissions_ListForResourceGroup): `value[]` of `{actions, notActions}`; an action is allowed
  when one entry's `actions` match it (wildcards) and the same entry's `notActions` do not.
  Before the first run the resource group does not exist: the check says it cannot confirm.
- Network Usage API, `GET /subscriptions/{id}/providers/Microsoft.Network/locations/{location}/usages`
  (api-version 2024-05-01; specification/network/.../examples/UsageList.json, Usages_List): the
  same shape; `NetworkInterfaces` and `VirtualNetworks`. Azure counts NICs (65,536) and VNets per
  subscription and region: every node has a NIC, so clusters sharing a subscription and region
  share that (`kilonode fleet` gives each cluster its own subscription).
Spot capacity counts against one regional low-priority bucket, not the families: kilonode
creates none.
"""

from __future__ import annotations

import fnmatch
import json
import os
import urllib.error
import urllib.parse
import urllib.request
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from kilonode.paths import shown_vm_sizes
from kilonode.plan.resolve.quota import REGIONAL  # the Usage API's "Total Regional vCPUs"
from kilonode.preflight.model import Finding, Inputs

NAME = "quota"
TITLE = "vCPU quota per family and region, and the deployer's right to assign roles"

ROLE_ASSIGNMENT_WRITE = "Microsoft.Authorization/roleAssignments/write"
USAGE_API = "2024-07-01"
NETWORK_USAGE_API = "2024-05-01"
# The Network Usage API's names for what the stack creates per subscription and region.
NICS = "NetworkInterfaces"
VNETS = "VirtualNetworks"
PERMISSIONS_API = "2022-04-01"
MANAGEMENT = "https://management.azure.com"


class NotFound(LookupError):
    """Azure answered 404: the resource (group) does not exist yet."""


class AzureReader(Protocol):
    """What the check asks Azure: each answer is the response body's `value` list, all pages."""

    subscription: str

    def usages(self, location: str) -> list[Mapping[str, Any]]: ...

    def network_usages(self, location: str) -> list[Mapping[str, Any]]: ...

    def permissions(self, resource_group: str) -> list[Mapping[str, Any]]: ...


@dataclass(frozen=True)
class RestReader:
    """Azure Resource Manager over HTTPS (urllib), with a bearer token the caller obtained."""

    subscription: str
    token: str
    timeout_s: float = 30

    def usages(self, location: str) -> list[Mapping[str, Any]]:
        return self._pages(f"/subscriptions/{self.subscription}/providers/Microsoft.Compute/locations/"
                           f"{urllib.parse.quote(location)}/usages?api-version={USAGE_API}")

    def network_usages(self, location: str) -> list[Mapping[str, Any]]:
        return self._pages(f"/subscriptions/{self.subscription}/providers/Microsoft.Network/locations/"
                           f"{urllib.parse.quote(location)}/usages?api-version={NETWORK_USAGE_API}")

    def permissions(self, resource_group: str) -> list[Mapping[str, Any]]:
        return self._pages(f"/subscriptions/{self.subscription}/resourcegroups/{urllib.parse.quote(resource_group)}"
                           f"/providers/Microsoft.Authorization/permissions?api-version={PERMISSIONS_API}")

    def _pages(self, path: str) -> list[Mapping[str, Any]]:
        found: list[Mapping[str, Any]] = []
        url: str | None = MANAGEMENT + path
        while url:
            request = urllib.request.Request(url, headers={"Authorization": f"Bearer {self.token}"})
            try:
                with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                    body = json.load(response)
            except urllib.error.HTTPError as error:
                if error.code == 404:
                    raise NotFound(url) from None
                raise
            found += body.get("value") or []
            url = body.get("nextLink")  # pageable (x-ms-pageable nextLinkName)
        return found


def reader_from_env(env: Mapping[str, str]) -> AzureReader | None:
    """The real reader when credentials are present, else None: without them nothing is asked."""
    subscription, token = env.get("AZURE_SUBSCRIPTION_ID"), env.get("AZURE_ACCESS_TOKEN")
    return RestReader(subscription, token) if subscription and token else None


@dataclass(frozen=True)
class Need:
    vcpus: int
    machines: list[str]  # "research-7500-h100-ib-000: 100 x Standard_ND96isr_H100_v5"


def needs(inputs: Inputs) -> tuple[dict[str, Need], list[str]]:
    """vCPUs per quota family (and REGIONAL), and the sizes whose family or vCPUs are unknown."""
    ceilings = {g.shard: g.max_size for pool in inputs.plan.autoscaled_pools if pool.autoscaling
                for g in pool.autoscaling.node_groups}
    counted: list[tuple[str, str, int]] = []  # (what, size, machines)
    for vm in inputs.of_type("azure-native:compute:VirtualMachine"):
        counted.append((vm.name, str((vm.inputs.get("hardwareProfile") or {}).get("vmSize")), 1))
    for vmss in inputs.of_type("azure-native:compute:VirtualMachineScaleSet"):
        sku = vmss.inputs.get("sku") or {}
        name = str(vmss.inputs.get("vmScaleSetName", vmss.name))
        counted.append((name, str(sku.get("name")), max(int(sku.get("capacity") or 0), ceilings.get(name, 0))))
    totals: dict[str, int] = defaultdict(int)
    machines: dict[str, list[str]] = defaultdict(list)
    unknown: set[str] = set()
    for what, size, count in counted:
        facts = inputs.plan.vm_sizes.get(size)
        if facts is None or facts.vcpus is None or facts.quota_family is None:
            unknown.add(size)
            continue
        for family in (facts.quota_family, REGIONAL):
            totals[family] += count * facts.vcpus
            machines[family].append(f"{what}: {count:,} x {size}")
    return {f: Need(totals[f], machines[f]) for f in totals}, sorted(unknown)


def network_needs(inputs: Inputs) -> dict[str, int]:
    """NICs (one per VM, one per scale-set instance at the size the cluster may reach) and VNets."""
    ceilings = {g.shard: g.max_size for pool in inputs.plan.autoscaled_pools if pool.autoscaling
                for g in pool.autoscaling.node_groups}
    instances = sum(max(int((s.inputs.get("sku") or {}).get("capacity") or 0),
                        ceilings.get(str(s.inputs.get("vmScaleSetName", s.name)), 0))
                    for s in inputs.of_type("azure-native:compute:VirtualMachineScaleSet"))
    return {NICS: len(inputs.of_type("azure-native:network:NetworkInterface")) + instances,
            VNETS: len(inputs.of_type("azure-native:network:VirtualNetwork"))}


def _network_quota(reader: AzureReader, location: str, need: dict[str, int]) -> list[Finding]:
    free = {str((u.get("name") or {}).get("value", "")).lower(): int(u.get("limit", 0)) - int(u.get("currentValue", 0))
            for u in reader.network_usages(location)}
    findings = []
    for name, wanted in sorted(need.items()):
        available = free.get(name.lower())
        if available is not None and available < wanted:
            findings.append(Finding(
                NAME, "break", f"{name} in {location}",
                f"the stack needs {wanted:,} {name} (a NIC per machine and scale-set instance), {available:,} are "
                "left in this subscription and region: Azure refuses the rest and `pulumi up` stops part way",
                "deploy into a subscription of its own (`kilonode fleet` splits a fleet that way), another region, "
                "or make the stack smaller"))
    return findings


def _role_scopes(inputs: Inputs) -> list[str]:
    return sorted({str(r.inputs.get("scope")) for r in inputs.of_type("azure-native:authorization:RoleAssignment")})


def _resource_group(inputs: Inputs) -> str:
    groups = inputs.of_type("azure-native:resources:ResourceGroup")
    return str(groups[0].inputs.get("resourceGroupName")) if groups else inputs.plan.cluster


def allowed(action: str, permissions: list[Mapping[str, Any]]) -> bool:
    """Azure RBAC: some entry's actions match and the same entry's notActions do not (case-insensitive)."""
    def matches(patterns: Any) -> bool:
        return any(fnmatch.fnmatchcase(action.lower(), str(p).lower()) for p in patterns or [])
    return any(matches(p.get("actions")) and not matches(p.get("notActions")) for p in permissions)


def _offline(inputs: Inputs, need: dict[str, Need], scopes: list[str]) -> list[Finding]:
    location = inputs.plan.location
    listing = "; ".join(f"{family}: {n.vcpus:,} vCPUs" for family, n in sorted(need.items()))
    network = network_needs(inputs)
    listing += f"; {network[NICS]:,} network interfaces and {network[VNETS]} VNet(s) (per subscription and region)"
    findings = [Finding(NAME, "warn", f"subscription, region {location}",
                        f"cannot confirm quota offline: the stack needs {listing}",
                        "compare with `az vm list-usage --location " + location + "` (limit - currentValue per "
                        "family), or run preflight with AZURE_SUBSCRIPTION_ID and AZURE_ACCESS_TOKEN set")]
    if scopes:
        findings.append(Finding(NAME, "warn", "the deployer",
                                "cannot confirm rights offline: the run assigns roles, which needs "
                                f"{ROLE_ASSIGNMENT_WRITE} at {', '.join(scopes)}",
                                "deploy as Owner, User Access Administrator or Role Based Access Control "
                                "Administrator of the subscription (Contributor cannot assign roles)"))
    return findings


def _quota(reader: AzureReader, location: str, need: dict[str, Need]) -> list[Finding]:
    free = {str((u.get("name") or {}).get("value", "")).lower(): int(u.get("limit", 0)) - int(u.get("currentValue", 0))
            for u in reader.usages(location)}  # limit - currentValue: what is left
    findings = []
    for family, n in sorted(need.items()):
        available = free.get(family.lower())  # Azure's casing is irregular
        if available is None:
            findings.append(Finding(NAME, "break", f"quota {family} in {location}",
                                    f"Azure lists no quota named {family!r} in {location}: the {n.vcpus:,} vCPUs of "
                                    f"{', '.join(n.machines)} cannot be created there",
                                    "choose a region that offers the size, or correct the catalogue's quotaFamily"))
        elif available < n.vcpus:
            findings.append(Finding(
                NAME, "break", f"quota {family} in {location}",
                f"the stack needs {n.vcpus:,} vCPUs of {family}, {available:,} are free: Azure refuses the machines "
                f"past the quota (OperationNotAllowed) and `pulumi up` stops part way ({', '.join(n.machines)})",
                f"request a quota increase of {n.vcpus - available:,} vCPUs for {family} in {location} (Azure portal, "
                "Quotas), or make the stack smaller"))
    return findings


def _rights(reader: AzureReader, resource_group: str, scopes: list[str]) -> list[Finding]:
    if not scopes:
        return []
    try:
        permissions = reader.permissions(resource_group)
    except NotFound:
        return [Finding(NAME, "warn", f"resource group {resource_group}",
                        f"cannot confirm {ROLE_ASSIGNMENT_WRITE}: the resource group does not exist yet",
                        "make sure the deployer is Owner or User Access Administrator of the subscription")]
    if allowed(ROLE_ASSIGNMENT_WRITE, permissions):
        return []
    return [Finding(NAME, "break", "the deployer",
                    f"the deployer's permissions on resource group {resource_group} lack {ROLE_ASSIGNMENT_WRITE}: "
                    f"the role assignments at {', '.join(scopes)} fail (AuthorizationFailed) after the identities "
                    "were created, and cloud-controller-manager and the etcd backups get no rights",
                    "grant the deployer User Access Administrator (or Owner, or Role Based Access Control "
                    "Administrator) on the subscription or the resource group")]


def evaluate(inputs: Inputs, reader: AzureReader | None) -> list[Finding]:
    need, unknown = needs(inputs)
    scopes = _role_scopes(inputs)
    findings = [Finding(NAME, "warn", f"VM size {size}", "its quota family or vCPUs are not in the VM-size "
                        "catalogue: its quota is not counted", f"add the size to {shown_vm_sizes()} with its "
                        "quotaFamily (Resource SKUs `family`)") for size in unknown]
    if reader is None:
        return findings + _offline(inputs, need, scopes)
    return (findings + _quota(reader, inputs.plan.location, need)
            + _network_quota(reader, inputs.plan.location, network_needs(inputs))
            + _rights(reader, _resource_group(inputs), scopes))


def check(inputs: Inputs) -> list[Finding]:
    # The network is touched only when the user gave credentials; tests never set them.
    return evaluate(inputs, reader_from_env(os.environ))
