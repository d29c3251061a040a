"""Seeded breaks of Azure Disk CSI's controller-azure-rights line (catalog/contracts.yaml azureDiskCsi,
kind azureRoleForDisks): the controller acting as an identity that may not make disks in its
azure.json's group, may not attach them where the node plugin runs, or is not on the nodes it
runs on, is a break in a copy of research-7500's recorded graph; the shipped stacks meet it."""

from __future__ import annotations

from typing import Any

import pytest

from kilonode.preflight import run
from kilonode.preflight.model import Finding
from tests import shared
from tests.preflight.conftest import artefacts, inputs_of, resource
from tests.preflight.test_contracts import findings, lines

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

LINE = "azureDiskCsi/controller-azure-rights"
CLUSTER = "research-7500"
IDENTITY = f"mock:azure-native:managedidentity:UserAssignedIdentity::{CLUSTER}-controllers-disk-csi-identity"


def _mine(found: list[Finding]) -> list[Finding]:
    return [f for f in found if f"contract line {LINE}:" in f.what]


def _azure(graph: dict[str, Any], type_: str, name: str) -> dict[str, Any]:
    [found] = [r for r in graph["resources"] if r["type"] == type_ and r["name"] == name]
    return found


def _drop(graph: dict[str, Any], type_: str, name: str) -> None:
    graph["resources"] = [r for r in graph["resources"] if not (r["type"] == type_ and r["name"] == name)]


ASSIGNMENT = "azure-native:authorization:RoleAssignment"


@pytest.mark.parametrize("stack", shared.SHIPPED_STACKS)
def test_the_shipped_stacks_meet_it(stack: str) -> None:
    assert not _mine(run(inputs_of(stack), ["contracts"]))


def test_the_controller_on_cloud_controller_managers_azure_json_is_a_break() -> None:
    """What the driver did before it had an identity of its own: cloud-controller-manager's
    role holds no disk action and no instance write."""
    _, graph = artefacts(CLUSTER)
    spec = resource(graph, "Deployment", "csi-azuredisk-controller")["inputs"]["spec"]["template"]["spec"]
    [volume] = [v for v in spec["volumes"] if v["name"] == "azure-cred"]
    volume["configMap"]["name"] = "azure-cloud-provider"
    found = _mine(findings(graph=graph))
    assert lines(found) == {LINE}
    assert f"identity {CLUSTER}-controllers-cloud-provider-identity holds no role with Microsoft.Compute/disks/read" \
        in found[0].what
    assert f"scale set {CLUSTER}-monitoring-000" in found[0].what


def test_an_identity_without_the_disk_role_on_the_pools_group_is_a_break() -> None:
    _, graph = artefacts(CLUSTER)
    _drop(graph, ASSIGNMENT, f"{CLUSTER}-controllers-disk-csi-nodes")
    found = _mine(findings(graph=graph))
    assert lines(found) == {LINE}
    assert f"on a scope containing resource group {CLUSTER}-nodes" in found[0].what
    assert "containing scale set" not in found[0].what


def test_an_identity_that_may_not_attach_on_the_prometheus_pool_is_a_break() -> None:
    _, graph = artefacts(CLUSTER)
    _drop(graph, ASSIGNMENT, f"{CLUSTER}-controllers-disk-csi-{CLUSTER}-monitoring-000")
    found = _mine(findings(graph=graph))
    assert lines(found) == {LINE}
    write = "holds no role with Microsoft.Compute/virtualMachineScaleSets/virtualMachines/write"
    assert found[0].what.count(write) == 1
    assert f"scale set {CLUSTER}-monitoring-000, where DaemonSet kube-system/csi-azuredisk-node runs" in found[0].what


def test_an_identity_not_on_the_controllers_nodes_is_a_break() -> None:
    _, graph = artefacts(CLUSTER)
    for shard in range(3):
        vmss = _azure(graph, "azure-native:compute:VirtualMachineScaleSet", f"{CLUSTER}-system-{shard:03d}")
        assigned = vmss["inputs"]["identity"]["userAssignedIdentities"]
        vmss["inputs"]["identity"]["userAssignedIdentities"] = [i for i in assigned if i != IDENTITY]
    found = _mine(findings(graph=graph))
    assert lines(found) == {LINE}
    assert f"may run on pool system, whose scale set(s) {CLUSTER}-system-000" in found[0].what
    assert "no token there" in found[0].what


def test_the_instance_write_on_a_gpu_pools_scale_set_is_a_warning() -> None:
    _, graph = artefacts(CLUSTER)
    granted = _azure(graph, ASSIGNMENT, f"{CLUSTER}-controllers-disk-csi-{CLUSTER}-monitoring-000")
    extra = {**granted, "name": f"{CLUSTER}-controllers-disk-csi-{CLUSTER}-h100-ib-000",
             "inputs": {**granted["inputs"],
                        "scope": f"mock:azure-native:compute:VirtualMachineScaleSet::{CLUSTER}-h100-ib-000"}}
    graph["resources"].append(extra)
    found = _mine(run(inputs_of(CLUSTER, graph=graph), ["contracts"]))
    assert [f.level for f in found] == ["warn"]
    assert f"may write the instances of scale set(s) {CLUSTER}-h100-ib-000" in found[0].what
