"""What Azure itself would refuse, checked on the recorded graph: the mock engine accepts any
input, so the SDK's own input types and Azure's documented rules are checked here instead.

Rules and their sources:
- resource inputs: the pulumi-azure-native / pulumi-tls / pulumi-command SDK input types
  (property names at every depth, enums, required fields), see tests/azure/sdk_inputs.py;
- NSG rule priority: 100-4096, unique per direction within a group (Azure NSG overview,
  "Security rules": Priority);
- names: Azure's resource naming rules (learn.microsoft.com, "Naming rules and restrictions
  for Azure resources"); Linux computerName at most 64 and a scale set's computerNamePrefix
  at most 58 characters (the 6 it appends make the 64; terraform-provider-azurerm's
  ValidateLinuxComputerNamePrefix enforces the same);
- IP configurations per NIC: at most 256 (Azure networking limits);
- a scale set in a single placement group: at most 100 VMs (VMSS placement groups).
"""

from __future__ import annotations

import copy
import re
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from kilonode.azure.graph import Graph
from kilonode.config import load_stack
from tests.azure.conftest import NIC, NSG, VM, VMSS
from tests.azure.sdk_inputs import problems
from tests.conftest import shipped_cluster_value
from tests.graphcache import recorded

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

STACKS = ["local", "research-2500", "research-7500"]

# The longest names validation lets through: a 32-character cluster and a pool whose
# scale-set names reach the 58-character computerNamePrefix limit exactly.
LONG_CLUSTER = "k" * 31 + "1"
LONG_POOL = "p" * 20 + "2"  # 32 + 1 + 21 + 4 ("-000") = 58


@pytest.fixture(scope="module")
def long_names_graph(tmp_path_factory: pytest.TempPathFactory) -> Graph:
    cluster = copy.deepcopy(shipped_cluster_value("local"))
    cluster["name"] = LONG_CLUSTER
    cluster["nodePools"][0]["name"] = LONG_POOL
    path: Path = tmp_path_factory.mktemp("stacks") / "Pulumi.long.yaml"
    path.write_text(yaml.safe_dump({"config": {"kilonode:cluster": cluster}}, sort_keys=False))
    return recorded(load_stack(str(path)))


def every_graph(graphs: dict[str, Graph], exposed: Graph, long_names: Graph) -> list[Graph]:
    return [*graphs.values(), exposed, long_names]


@pytest.mark.parametrize("stack", STACKS)
def test_every_resource_input_matches_its_provider_sdks_input_type(graphs: dict[str, Graph], stack: str) -> None:
    found = [p for r in graphs[stack].resources for p in problems(r)]
    assert found == []


def test_exposed_and_longest_name_variants_match_the_sdk_input_types(
    exposed_graph: Graph, long_names_graph: Graph
) -> None:
    found = [p for g in (exposed_graph, long_names_graph) for r in g.resources for p in problems(r)]
    assert found == []


def test_the_sdk_check_names_a_misspelt_nested_property_a_bad_enum_a_missing_field_and_a_wrong_type(
    graphs: dict[str, Graph],
) -> None:
    vmss = graphs["local"].of_type(VMSS)[0]
    inputs = copy.deepcopy(vmss.plain())
    nic = inputs["virtualMachineProfile"]["networkProfile"]["networkInterfaceConfigurations"][0]
    nic["ipConfigurations"][1]["privateIpAddressVersion"] = nic["ipConfigurations"][1].pop("privateIPAddressVersion")
    del nic["name"]
    inputs["upgradePolicy"]["mode"] = "manual"
    inputs["sku"]["capacity"] = "2"
    found = [p.split(": ", 1)[1] for p in problems(replace(vmss, inputs=inputs))]
    ip = "virtualMachineProfile.networkProfile.networkInterfaceConfigurations[0].ipConfigurations[1]"
    assert found == [
        "sku.capacity: expected float, got str '2'",
        "upgradePolicy.mode: 'manual' is not one of Automatic, Manual, Rolling",
        f"{ip}.privateIpAddressVersion: not a property of VirtualMachineScaleSetIPConfigurationArgs "
        "(did you mean privateIPAddressVersion?)",
        "virtualMachineProfile.networkProfile.networkInterfaceConfigurations[0].name: "
        "required by VirtualMachineScaleSetNetworkConfigurationArgs, missing",
    ]


def test_nsg_rule_priorities_are_between_100_and_4096_and_unique_per_direction(
    graphs: dict[str, Graph], exposed_graph: Graph, long_names_graph: Graph
) -> None:
    for graph in every_graph(graphs, exposed_graph, long_names_graph):
        for nsg in graph.of_type(NSG):
            rules = nsg.plain()["securityRules"]
            for direction in {r["direction"] for r in rules}:
                priorities = [r["priority"] for r in rules if r["direction"] == direction]
                assert len(priorities) == len(set(priorities)), (nsg.name, priorities)
                assert all(100 <= p <= 4096 for p in priorities), (nsg.name, priorities)


# (input holding the Azure name, length range, allowed characters) per resource type, from
# Azure's naming rules page.
VM_NAME = r"[a-zA-Z0-9]([-a-zA-Z0-9._]*[a-zA-Z0-9_])?"
NAME_RULES: dict[str, tuple[str, int, int, str]] = {
    # a storage account's lifecycle policy: the one name Azure takes
    "azure-native:storage:ManagementPolicy": ("managementPolicyName", 7, 7, r"default"),
    # so are its blob service's properties and a container's immutability policy
    "azure-native:storage:BlobServiceProperties": ("blobServicesName", 7, 7, r"default"),
    "azure-native:storage:BlobContainerImmutabilityPolicy": ("immutabilityPolicyName", 7, 7, r"default"),
    "azure-native:resources:ResourceGroup": ("resourceGroupName", 1, 90, r"[-\w._()]*[-\w_()]"),
    "azure-native:network:VirtualNetwork": ("virtualNetworkName", 2, 64, r"\w[-\w.]*\w"),
    "azure-native:network:Subnet": ("subnetName", 1, 80, r"\w([-\w.]*\w)?"),
    "azure-native:network:NetworkSecurityGroup": ("networkSecurityGroupName", 1, 80, r"\w([-\w.]*\w)?"),
    "azure-native:network:NetworkInterface": ("networkInterfaceName", 1, 80, r"\w([-\w.]*\w)?"),
    "azure-native:network:LoadBalancer": ("loadBalancerName", 1, 80, r"\w([-\w.]*\w)?"),
    "azure-native:network:PublicIPAddress": ("publicIpAddressName", 1, 80, r"\w([-\w.]*\w)?"),
    "azure-native:network:PublicIPPrefix": ("publicIpPrefixName", 1, 80, r"\w([-\w.]*\w)?"),
    "azure-native:network:NatGateway": ("natGatewayName", 1, 80, r"\w([-\w.]*\w)?"),
    "azure-native:compute:VirtualMachine": ("vmName", 1, 64, VM_NAME),
    "azure-native:compute:VirtualMachineScaleSet": ("vmScaleSetName", 1, 64, VM_NAME),
    "azure-native:compute:Gallery": ("galleryName", 1, 80, r"[a-zA-Z0-9]([a-zA-Z0-9._]*[a-zA-Z0-9])?"),
    "azure-native:compute:GalleryImage": ("galleryImageName", 1, 80, r"[a-zA-Z0-9]([-a-zA-Z0-9._]*[a-zA-Z0-9])?"),
    "azure-native:compute:GalleryImageVersion": ("galleryImageVersionName", 5, 64, r"\d+\.\d+\.\d+"),
    "azure-native:storage:StorageAccount": ("accountName", 3, 24, r"[a-z0-9]+"),
    "azure-native:storage:BlobContainer": ("containerName", 3, 63, r"[a-z0-9](-?[a-z0-9])*"),
    "azure-native:managedidentity:UserAssignedIdentity": ("resourceName", 3, 128, r"[a-zA-Z0-9][-\w]*"),
    # Microsoft.Insights: 1-260, none of *#&+:<>?@%{}\/ (metric alerts) or :<>+/&%\? (action groups) nor
    # a control character, not ending in a space or period; kilonode's are letters, digits and hyphens
    "azure-native:monitor:MetricAlert": ("ruleName", 1, 260, r"[a-zA-Z0-9]([-a-zA-Z0-9]*[a-zA-Z0-9])?"),
    "azure-native:monitor:ActionGroup": ("actionGroupName", 1, 260, r"[a-zA-Z0-9]([-a-zA-Z0-9]*[a-zA-Z0-9])?"),
    # a role assignment's name is a GUID
    "azure-native:authorization:RoleAssignment": (
        "roleAssignmentName", 36, 36, r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"),
    # so is a custom role definition's (its roleName, unique in the tenant, is a display name)
    "azure-native:authorization:RoleDefinition": (
        "roleDefinitionId", 36, 36, r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"),
}


def test_every_azure_resource_is_named_explicitly_within_azures_naming_rules(
    graphs: dict[str, Graph], exposed_graph: Graph, long_names_graph: Graph
) -> None:
    for graph in every_graph(graphs, exposed_graph, long_names_graph):
        for resource in graph.resources:
            if not resource.type.startswith("azure-native:"):
                continue
            field, low, high, pattern = NAME_RULES[resource.type]  # a new type needs its rule here
            name = resource.plain().get(field)
            # No auto-name: Pulumi would append a random suffix, and the name would move.
            assert isinstance(name, str), f"{resource.type} {resource.name}: no {field}"
            assert low <= len(name) <= high, f"{resource.type} {name!r}: {len(name)} characters, not {low}-{high}"
            assert re.fullmatch(pattern, name), f"{resource.type} {name!r} breaks {pattern}"


def test_linux_host_names_fit_64_and_scale_set_prefixes_58_characters(
    graphs: dict[str, Graph], long_names_graph: Graph
) -> None:
    longest_prefix = 0
    for graph in [*graphs.values(), long_names_graph]:
        for vm in graph.of_type(VM):
            assert len(vm.plain()["osProfile"]["computerName"]) <= 64
        for vmss in graph.of_type(VMSS):
            prefix = vmss.plain()["virtualMachineProfile"]["osProfile"]["computerNamePrefix"]
            longest_prefix = max(longest_prefix, len(prefix))
            assert len(prefix) <= 58, prefix
    assert longest_prefix == 58  # the long-names variant reaches the limit exactly


def test_a_pool_name_one_character_longer_is_refused_before_any_resource(tmp_path: Path) -> None:
    cluster = copy.deepcopy(shipped_cluster_value("local"))
    cluster["name"] = LONG_CLUSTER
    cluster["nodePools"][0]["name"] = LONG_POOL + "3"
    path = tmp_path / "Pulumi.long.yaml"
    path.write_text(yaml.safe_dump({"config": {"kilonode:cluster": cluster}}, sort_keys=False))
    with pytest.raises(Exception, match=r"scale-set names '<cluster>-<pool>-000' would be 59 characters, above the 58"):
        recorded(load_stack(str(path)))


def test_no_nic_holds_more_than_256_ip_configurations(graphs: dict[str, Graph]) -> None:
    for graph in graphs.values():
        for nic in graph.of_type(NIC):
            assert 1 <= len(nic.plain()["ipConfigurations"]) <= 256
        for vmss in graph.of_type(VMSS):
            for config in vmss.plain()["virtualMachineProfile"]["networkProfile"]["networkInterfaceConfigurations"]:
                assert 1 <= len(config["ipConfigurations"]) <= 256


def test_scale_sets_in_a_single_placement_group_hold_at_most_100_vms(graphs: dict[str, Graph]) -> None:
    single = [v.plain() for g in graphs.values() for v in g.of_type(VMSS) if v.plain()["singlePlacementGroup"]]
    assert single  # research-7500's InfiniBand pools are such scale sets
    assert max(v["sku"]["capacity"] for v in single) == 100
