"""identities: on the shipped stacks no identity a pool scale set carries has a role over a
control-plane resource and every pool role drops pods' traffic to the metadata service; each
seeded break (the old resource-group roles, the subscription, the VNet, an etcd VM, the
snapshot container, a GPU pool given the identity, the block's rule, unit or kubelet
requirement removed) is named."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from kilonode.preflight import run
from kilonode.render import metadata_block
from kilonode.render.files import USER_DATA
from tests.preflight.conftest import artefacts, inputs_of

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

CHECK = ["identities"]
RG = "/subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/{}"


def found(stack: str, files: dict[str, str] | None = None,
          graph: dict[str, Any] | None = None) -> list[tuple[str, str, str]]:
    return [(f.level, f.where, f.what) for f in run(inputs_of(stack, files=files, graph=graph), CHECK)]


def assignments(graph: dict[str, Any], who: str) -> list[dict[str, Any]]:
    return [r for r in graph["resources"] if r["type"] == "azure-native:authorization:RoleAssignment"
            and r["inputs"]["principalId"].endswith(f"-{who}-identity")]


def test_the_shipped_stacks_keep_every_pool_identity_off_the_control_plane(shipped: str) -> None:
    assert found(shipped) == []


@pytest.mark.parametrize("stack", ["local", "research-7500"])
def test_the_cloud_providers_old_roles_on_the_clusters_resource_group_are_a_break(stack: str) -> None:
    _, graph = artefacts(stack)
    # what kilonode did before: its role on the pools' group given on the group holding the etcd and
    # apiserver VMs (one assignment: the custom role of kilonode.azure.identity)
    for assignment in assignments(graph, "cloud-provider"):
        if assignment["inputs"]["scope"] == RG.format(f"{stack}-nodes"):
            assignment["inputs"]["scope"] = RG.format(stack)
    breaks = [(where, what) for level, where, what in found(stack, graph=graph) if level == "break"]
    assert len(breaks) == 1
    for where, what in breaks:
        assert where.startswith("azure-native:authorization:RoleAssignment ")
        assert f"at {RG.format(stack)}" in what and "azure-native:compute:VirtualMachine" in what
        assert f"{stack}-system-000" in what or f"{stack}-cpu-000" in what  # who carries it
        assert "run a command on an apiserver VM" in what


@pytest.mark.parametrize("scope", [
    "/subscriptions/00000000-0000-0000-0000-000000000000",  # everything
    "mock:azure-native:network:VirtualNetwork::research-7500-network-vnet",  # the control-plane subnets
    "mock:azure-native:compute:VirtualMachine::research-7500-etcd-main-0",
    "mock:azure-native:network:NetworkInterface::research-7500-apiserver-0-nic",
    "mock:azure-native:network:LoadBalancer::research-7500-apiserver-lb",
    "mock:azure-native:network:Subnet::research-7500-network-etcd",
    "mock:azure-native:storage:StorageAccount::research-7500-etcd-backup-account",  # the snapshots: key material
    "mock:azure-native:compute:Gallery::research-7500-image-gallery",  # the images the control plane boots
    "mock:azure-native:managedidentity:UserAssignedIdentity::research-7500-etcd-backup-main-identity",
    # what an etcd cluster's identity may write: its snapshot container
    "mock:azure-native:storage:BlobContainer::research-7500-etcd-backup-events-container",
    # the same group by its Azure ID, down to a resource in it
    "/subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/research-7500/providers/"
    "Microsoft.Compute/virtualMachines/research-7500-apiserver-0",
])
def test_a_pool_identity_with_any_role_reaching_a_control_plane_resource_is_a_break(scope: str) -> None:
    _, graph = artefacts("research-7500")
    [reader] = [a for a in assignments(graph, "autoscaler") if a["inputs"]["scope"].endswith("research-7500-nodes")]
    reader["inputs"]["scope"] = scope  # even Reader: the check names every role
    [(level, where, what)] = found("research-7500", graph=graph)
    assert level == "break" and where == f"azure-native:authorization:RoleAssignment {reader['name']}"
    assert "identity research-7500-controllers-autoscaler-identity, carried by research-7500-system-000" in what
    assert "contains control-plane resources" in what


def test_roles_on_the_pools_own_resources_are_not_a_break() -> None:
    _, graph = artefacts("research-7500")
    [reader] = [a for a in assignments(graph, "autoscaler") if a["inputs"]["scope"].endswith("research-7500-nodes")]
    for scope in ["mock:azure-native:network:Subnet::research-7500-network-pool-h100-ib",
                  "mock:azure-native:compute:VirtualMachineScaleSet::research-7500-a100-ib-000",
                  "/subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/research-7500-nodes/providers/"
                  "Microsoft.Compute/virtualMachineScaleSets/research-7500-h100-ib-000"]:
        reader["inputs"]["scope"] = scope
        assert found("research-7500", graph=graph) == [], scope


def test_a_gpu_pool_given_the_cloud_providers_identity_is_a_warning_and_its_old_roles_a_break() -> None:
    _, graph = artefacts("research-7500")
    [gpu] = [r for r in graph["resources"] if r["type"] == "azure-native:compute:VirtualMachineScaleSet"
             and r["inputs"]["vmScaleSetName"] == "research-7500-a100-ib-007"]
    ccm = "mock:azure-native:managedidentity:UserAssignedIdentity::research-7500-controllers-cloud-provider-identity"
    gpu["inputs"]["identity"] = {"type": "UserAssigned", "userAssignedIdentities": [ccm]}
    [(level, where, what)] = found("research-7500", graph=graph)
    assert level == "warn" and where.endswith("research-7500-a100-ib-007") and "for nothing" in what
    # (its joinLoadBalancer role stays on the VNet: the test below)
    moved = [a for a in assignments(graph, "cloud-provider") if not a["name"].endswith("-cloud-provider-vnet")]
    for assignment in moved:
        assignment["inputs"]["scope"] = RG.format("research-7500")
    # each moved assignment is its own break: the custom role on the node resource group, the pools'
    # NSG and one per pool subnet (the cloud provider manages every pool's, the monitoring pool's too)
    assert len(moved) == 2 + len(inputs_of("research-7500").plan.node_pools)
    assert [level for level, *_ in found("research-7500", graph=graph)].count("break") == len(moved)


def vnet_role(graph: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """cloud-controller-manager's VNet assignment and its custom role (joinLoadBalancer alone)."""
    [assignment] = [a for a in assignments(graph, "cloud-provider") if a["name"].endswith("-cloud-provider-vnet")]
    guid = assignment["inputs"]["roleDefinitionId"].rpartition("/")[2]
    [role] = [r for r in graph["resources"] if r["type"] == "azure-native:authorization:RoleDefinition"
              and r["inputs"]["roleDefinitionId"] == guid]
    return assignment, role


@pytest.mark.parametrize("stack", ["local", "research-7500"])
def test_the_joinloadbalancer_role_on_the_vnet_passes_and_is_the_only_role_there(stack: str) -> None:
    _, graph = artefacts(stack)
    assignment, role = vnet_role(graph)
    assert assignment["inputs"]["scope"] == f"mock:azure-native:network:VirtualNetwork::{stack}-network-vnet"
    assert role["inputs"]["permissions"] == [
        {"actions": ["Microsoft.Network/virtualNetworks/joinLoadBalancer/action"]}]
    assert found(stack) == []


@pytest.mark.parametrize("extra", [
    {"actions": ["Microsoft.Network/virtualNetworks/subnets/write"]},  # could unbind the control plane's NSG
    {"actions": ["Microsoft.Network/virtualNetworks/*/read"]},
    {"dataActions": ["Microsoft.Network/virtualNetworks/anything"]},
])
def test_the_vnet_role_with_anything_beside_joinloadbalancer_is_a_break(extra: dict[str, list[str]]) -> None:
    _, graph = artefacts("research-7500")
    assignment, role = vnet_role(graph)
    permissions = role["inputs"]["permissions"][0]
    for key, values in extra.items():
        permissions[key] = [*permissions.get(key, []), *values]
    [(level, where, what)] = found("research-7500", graph=graph)
    assert level == "break" and where == f"azure-native:authorization:RoleAssignment {assignment['name']}"
    assert "contains control-plane resources" in what and "research-7500-network-etcd" in what


def test_a_builtin_role_on_the_vnet_is_a_break_whatever_it_holds() -> None:
    _, graph = artefacts("research-7500")
    assignment, _ = vnet_role(graph)
    # Network Contributor: subnets/write among its actions
    assignment["inputs"]["roleDefinitionId"] = assignment["inputs"]["roleDefinitionId"].rpartition("/")[0] + \
        "/4d97b98b-1d4f-4787-a291-c67834d212e7"
    [(level, _, what)] = found("research-7500", graph=graph)
    assert level == "break" and "holds role Network Contributor" in what


def test_a_system_assigned_identity_on_a_scale_set_is_a_break() -> None:
    _, graph = artefacts("local")
    [vmss] = [r for r in graph["resources"] if r["type"] == "azure-native:compute:VirtualMachineScaleSet"]
    vmss["inputs"]["identity"]["type"] = "SystemAssigned, UserAssigned"
    [(level, _, what)] = found("local", graph=graph)
    assert level == "break" and "system-assigned identity" in what


def edit_user_data(files: dict[str, str], host: str, edit: Any) -> None:
    data = yaml.safe_load(files[f"{host}/{USER_DATA}"])
    edit(data)
    files[f"{host}/{USER_DATA}"] = "#cloud-config\n" + yaml.safe_dump(data)


def written(data: dict[str, Any], path: str) -> dict[str, Any]:
    [entry] = [f for f in data["write_files"] if f["path"] == f"/{path}"]
    return entry


def drop_line(path: str, needle: str) -> Any:
    def edit(data: dict[str, Any]) -> None:
        entry = written(data, path)
        entry["content"] = "".join(line for line in entry["content"].splitlines(keepends=True) if needle not in line)
    return edit


@pytest.mark.parametrize(("host", "edit", "said"), [
    # the seeded break of the issue: the IMDS rule removed
    ("pool-h100-ib", drop_line(metadata_block.RULESET, "169.254.169.254"), "no forward rule drops 169.254.169.254"),
    ("pool-a100-ib.team-vision", drop_line(metadata_block.RULESET, "168.63.129.16"),
     "no forward rule drops 168.63.129.16 TCP 80, 32526"),
    ("pool-system", lambda d: d["write_files"].remove(written(d, metadata_block.RULESET)),
     "no /etc/kilonode/metadata-block.nft in its user-data"),
    ("pool-system", lambda d: d["write_files"].remove(written(d, metadata_block.UNIT)),
     "no kilonode-metadata-block.service loads it"),
    ("pool-a100-ib", drop_line("etc/systemd/system/kubelet.service", "kilonode-metadata-block.service"),
     "the kubelet neither requires nor waits for"),
    ("pool-h100-ib",
     lambda d: [c.remove(metadata_block.UNIT_NAME) for c in d["runcmd"] if metadata_block.UNIT_NAME in c],
     "cloud-init does not start kilonode-metadata-block.service"),
    # on the output hook the rule would cut the host's own access and leave the pods'
    ("pool-h100-ib", lambda d: written(d, metadata_block.RULESET).update(
        content=written(d, metadata_block.RULESET)["content"].replace("hook forward", "hook output")),
     "has no chain on the forward hook"),
    # a WireServer rule for port 80 only leaves the HostGAPlugin open
    ("pool-system", lambda d: written(d, metadata_block.RULESET).update(
        content=written(d, metadata_block.RULESET)["content"].replace("{ 80, 32526 }", "80")),
     "no forward rule drops 168.63.129.16 TCP 80, 32526"),
])
def test_a_pool_role_without_the_metadata_block_is_a_break(host: str, edit: Any, said: str) -> None:
    files, _ = artefacts("research-7500")
    edit_user_data(files, host, edit)
    [(level, where, what)] = found("research-7500", files=files)
    assert (level, where) == ("break", host)
    assert said in what and "any pod gets a token" in what
