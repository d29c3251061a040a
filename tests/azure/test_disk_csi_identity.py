"""Azure Disk CSI's controller identity (kilonode.azure.identity disk_csi), under Pulumi's mock
engine: its custom roles hold upstream's listed actions and nothing else, the disks' on the pools'
group and the instance write only on the scale sets its node plugin runs on (never a GPU pool's),
it is carried by the controller pools' scale sets alone, and cloud-controller-manager's role is
as it was (no disk action, no scale-set write).

The expected actions are written out by hand from kubernetes-sigs/azuredisk-csi-driver
docs/driver-parameters.md at v1.34.5, "required permissions for CSI driver controller" (l.4-36),
not read from kilonode's code."""

from __future__ import annotations

from typing import Any

import pytest

from kilonode.azure.graph import Graph, Recorded
from kilonode.plan import ClusterPlan
from tests import shared
from tests.azure.conftest import VMSS, mock_id

STACKS = list(shared.SHIPPED_STACKS)
ASSIGNMENT = "azure-native:authorization:RoleAssignment"
ROLE_DEFINITION = "azure-native:authorization:RoleDefinition"
IDENTITY = "azure-native:managedidentity:UserAssignedIdentity"
RESOURCE_GROUP = "azure-native:resources:ResourceGroup"

# docs/driver-parameters.md l.6-21 at v1.34.5: the unconditional list
UPSTREAM = {
    "Microsoft.Compute/disks/read",
    "Microsoft.Compute/disks/write",
    "Microsoft.Compute/disks/delete",
    "Microsoft.Compute/diskEncryptionSets/read",
    "Microsoft.Compute/snapshots/read",
    "Microsoft.Compute/snapshots/write",
    "Microsoft.Compute/snapshots/delete",
    "Microsoft.Compute/virtualMachines/write",
    "Microsoft.Compute/virtualMachines/read",
    "Microsoft.Compute/virtualMachineScaleSets/virtualMachines/write",
    "Microsoft.Compute/virtualMachineScaleSets/virtualMachines/read",
    "Microsoft.Compute/virtualMachineScaleSets/read",
    "Microsoft.Compute/locations/operations/read",
    "Microsoft.Compute/locations/DiskOperations/read",
    "Microsoft.Resources/subscriptions/resourceGroups/read",
    "Microsoft.Resources/subscriptions/resourceGroups/*/read",
}
# on the pools' group: disks, the reads, the operations polled (no encryption sets, snapshots,
# standalone VMs, nor the group-wide */read)
GROUP_ACTIONS = {
    "Microsoft.Compute/disks/read",
    "Microsoft.Compute/disks/write",
    "Microsoft.Compute/disks/delete",
    "Microsoft.Compute/virtualMachineScaleSets/read",
    "Microsoft.Compute/virtualMachineScaleSets/virtualMachines/read",
    "Microsoft.Compute/locations/operations/read",
    "Microsoft.Compute/locations/DiskOperations/read",
    "Microsoft.Resources/subscriptions/resourceGroups/read",
}
# on the node plugin's pools' scale sets: attach and detach
ATTACH_ACTIONS = {"Microsoft.Compute/virtualMachineScaleSets/virtualMachines/write"}

# cloud-controller-manager's role as it was before the disk identity (kilonode.azure.identity
# CLOUD_PROVIDER_ACTIONS at 10fc45b), written out: no disk action, no scale-set or instance write
CLOUD_PROVIDER = [
    "Microsoft.Network/loadBalancers/read",
    "Microsoft.Network/loadBalancers/write",
    "Microsoft.Network/loadBalancers/delete",
    "Microsoft.Network/loadBalancers/backendAddressPools/read",
    "Microsoft.Network/loadBalancers/backendAddressPools/write",
    "Microsoft.Network/loadBalancers/backendAddressPools/delete",
    "Microsoft.Network/publicIPAddresses/read",
    "Microsoft.Network/publicIPAddresses/write",
    "Microsoft.Network/publicIPAddresses/delete",
    "Microsoft.Network/publicIPAddresses/join/action",
    "Microsoft.Network/networkSecurityGroups/read",
    "Microsoft.Network/networkSecurityGroups/write",
    "Microsoft.Network/networkSecurityGroups/join/action",
    "Microsoft.Compute/virtualMachines/read",
    "Microsoft.Compute/virtualMachineScaleSets/read",
    "Microsoft.Compute/virtualMachineScaleSets/virtualMachines/read",
    "Microsoft.Compute/virtualMachineScaleSets/virtualMachines/instanceView/read",
    "Microsoft.Network/networkInterfaces/read",
    "Microsoft.Compute/virtualMachineScaleSets/virtualMachines/networkInterfaces/read",
    "Microsoft.Compute/virtualMachineScaleSets/virtualMachines/networkInterfaces/ipconfigurations/publicipaddresses/read",
    "Microsoft.Network/virtualNetworks/read",
    "Microsoft.Network/virtualNetworks/subnets/read",
    "Microsoft.Network/virtualNetworks/subnets/join/action",
]


def _identity(graph: Graph, cluster: str, role: str) -> Recorded:
    return graph.named(f"{cluster}-controllers-{role}-identity")


def _assignments(graph: Graph, identity: Recorded) -> list[dict[str, Any]]:
    return [a.plain() for a in graph.of_type(ASSIGNMENT)
            if a.plain()["principalId"] == f"mock-principal-id:{identity.name}"]


def _roles(graph: Graph) -> dict[str, dict[str, Any]]:
    """role definition GUID -> its inputs"""
    return {r.plain()["roleDefinitionId"]: r.plain() for r in graph.of_type(ROLE_DEFINITION)}


def _actions(role: dict[str, Any]) -> list[str]:
    [permission] = role["permissions"]
    assert not permission.get("dataActions") and not permission.get("notActions")
    return list(permission["actions"])


def _plugin_pools(plan: ClusterPlan) -> set[str]:
    """Where the node plugin runs, by the rule kilonode.k8s.storage states (pools without GPUs,
    monitoring and system pools, the Prometheus pool), written out here."""
    pools = {p.name for p in plan.node_pools if not p.gpus_per_node or p.monitoring or p.system}
    return pools | ({plan.prometheus.pool} if plan.prometheus else set())


@pytest.mark.parametrize("stack", STACKS)
def test_the_disk_roles_are_upstreams_listed_actions_and_nothing_else(graphs: dict[str, Graph],
                                                                      stack: str) -> None:
    roles = _roles(graphs[stack])
    group = [r for r in roles.values() if r["roleName"].startswith(f"kilonode {stack} disk-csi (")]
    attach = [r for r in roles.values() if r["roleName"].startswith(f"kilonode {stack} disk-csi-attach (")]
    assert len(group) == len(attach) == 1
    assert set(_actions(group[0])) == GROUP_ACTIONS and len(_actions(group[0])) == len(GROUP_ACTIONS)
    assert _actions(attach[0]) == sorted(ATTACH_ACTIONS)
    assert GROUP_ACTIONS | ATTACH_ACTIONS <= UPSTREAM
    # no scale-set model write anywhere: only the instance write, and only in the attach role
    assert "Microsoft.Compute/virtualMachineScaleSets/write" not in GROUP_ACTIONS | ATTACH_ACTIONS


@pytest.mark.parametrize("stack", STACKS)
def test_disks_on_the_pools_group_and_attach_only_on_the_node_plugins_scale_sets(
        graphs: dict[str, Graph], plans: dict[str, ClusterPlan], stack: str) -> None:
    graph, plan = graphs[stack], plans[stack]
    identity = _identity(graph, plan.cluster, "disk-csi")
    roles = _roles(graph)
    by_scope: dict[str, list[str]] = {}
    for assignment in _assignments(graph, identity):
        guid = assignment["roleDefinitionId"].rpartition("/")[2]
        by_scope.setdefault(assignment["scope"], []).append(roles[guid]["roleName"].split(" (")[0])
    nodes_group = f"/subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/{plan.node_resource_group}"
    assert by_scope.pop(nodes_group) == [f"kilonode {stack} disk-csi"]
    scale_sets = {r.plain()["vmScaleSetName"]: r for r in graph.of_type(VMSS)}
    expected = {mock_id(scale_sets[s.name]) for p in plan.node_pools if p.name in _plugin_pools(plan)
                for s in p.shards}
    assert set(by_scope) == expected and expected
    assert all(names == [f"kilonode {stack} disk-csi-attach"] for names in by_scope.values())
    # a GPU pool's instances are never written (in the shipped stacks no GPU pool runs the plugin)
    gpu = {mock_id(scale_sets[s.name]) for p in plan.gpu_pools for s in p.shards}
    assert not gpu & set(by_scope)
    assert gpu or not plan.gpu_pools


@pytest.mark.parametrize("stack", STACKS)
def test_the_identity_is_on_the_controller_pools_scale_sets_only(
        graphs: dict[str, Graph], plans: dict[str, ClusterPlan], stack: str) -> None:
    graph, plan = graphs[stack], plans[stack]
    identity = mock_id(_identity(graph, plan.cluster, "disk-csi"))
    controllers = {s.name for p in plan.controller_pools for s in p.shards}
    carrying = {r.plain()["vmScaleSetName"] for r in graph.of_type(VMSS)
                if identity in ((r.plain().get("identity") or {}).get("userAssignedIdentities") or [])}
    assert carrying == controllers and controllers
    # and on no VM (the etcd members and apiservers carry their own identities or none)
    vms = graph.of_type("azure-native:compute:VirtualMachine")
    assert vms and all(identity not in str(vm.plain().get("identity")) for vm in vms)


@pytest.mark.parametrize("stack", STACKS)
def test_cloud_controller_managers_role_is_unchanged(graphs: dict[str, Graph], plans: dict[str, ClusterPlan],
                                                     stack: str) -> None:
    graph, plan = graphs[stack], plans[stack]
    roles = _roles(graph)
    [ccm] = [r for r in roles.values() if r["roleName"].startswith(f"kilonode {stack} cloud-provider (")]
    assert _actions(ccm) == CLOUD_PROVIDER
    assert not [a for a in _actions(ccm) if a.startswith("Microsoft.Compute/disks/") or
                (a.startswith("Microsoft.Compute/") and a.endswith("/write"))]
    identity = _identity(graph, plan.cluster, "cloud-provider")
    # its assignments: the custom role on the pools' group and the VNet's joinLoadBalancer, Network
    # Contributor on the NSG and each pool subnet; none names a scale set
    scopes = [a["scope"] for a in _assignments(graph, identity)]
    assert len(scopes) == 3 + len(plan.node_pools)
    assert not [s for s in scopes if "VirtualMachineScaleSet" in s or "virtualMachineScaleSets" in s]
