"""azure-names: the shipped stacks' names pass; each seeded break is named under the check."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from kilonode.plan.azure_names import role_assignment_name
from kilonode.preflight import breaks, run
from tests.preflight.conftest import artefacts, inputs_of

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not


def findings(stack: str, graph: dict[str, Any]) -> list[tuple[str, str]]:
    files, _ = artefacts(stack)
    return [(f.where, f.what) for f in breaks(run(inputs_of(stack, files=files, graph=graph), ["azure-names"]))]


def azure(graph: dict[str, Any], type_: str) -> list[dict[str, Any]]:
    return [r for r in graph["resources"] if r["type"] == type_]


def test_the_shipped_role_assignments_are_named_from_scope_principal_and_role(shipped: str) -> None:
    _, graph = artefacts(shipped)
    assignments = azure(graph, "azure-native:authorization:RoleAssignment")
    assert assignments
    for a in assignments:
        i = a["inputs"]
        assert i["roleAssignmentName"] == role_assignment_name(i["scope"], i["principalId"], i["roleDefinitionId"])


def test_a_role_assignment_named_from_cluster_and_role_only_is_a_break() -> None:
    _, graph = artefacts("research-7500")
    first = azure(graph, "azure-native:authorization:RoleAssignment")[0]
    # kilonode's old derivation: the same in every subscription of the tenant
    first["inputs"]["roleAssignmentName"] = str(uuid.uuid5(uuid.NAMESPACE_URL,
                                                           "kilonode:research-7500:cloud-provider:network-contributor"))
    found = findings("research-7500", graph)
    assert len(found) == 1
    where, what = found[0]
    assert where == f"azure-native:authorization:RoleAssignment {first['name']}"
    assert "RoleAssignmentExists" in what and "RoleAssignmentUpdateNotPermitted" in what


def test_a_role_assignment_without_principal_type_or_a_duplicate_triple_is_a_break() -> None:
    _, graph = artefacts("local")
    # two of the managed identities' assignments (the deployer's names no type: Azure looks it up)
    first, second = [r for r in azure(graph, "azure-native:authorization:RoleAssignment")
                     if "principalType" in r["inputs"]][:2]
    del first["inputs"]["principalType"]
    second["inputs"]["scope"] = first["inputs"]["scope"]
    second["inputs"]["principalId"] = first["inputs"]["principalId"]
    second["inputs"]["roleDefinitionId"] = first["inputs"]["roleDefinitionId"]
    second["inputs"]["roleAssignmentName"] = first["inputs"]["roleAssignmentName"]
    whats = " | ".join(what for _, what in findings("local", graph))
    assert "principalType is User" in whats
    assert "RoleAssignmentExists, HTTP 409" in whats
    assert "the same role assignment name for 2 resources" in whats


def test_a_storage_name_from_the_stack_name_alone_is_a_break() -> None:
    _, graph = artefacts("research-7500")
    account = next(r for r in azure(graph, "azure-native:storage:StorageAccount") if r["name"].endswith("-vhds"))
    account["inputs"]["accountName"] = "research7500imagevhds"  # what kilonode used to name it
    found = findings("research-7500", graph)
    assert [where for where, _ in found] == ["azure-native:storage:StorageAccount research-7500-image-vhds"]
    assert "not derived from the subscription" in found[0][1] and "StorageAccountAlreadyTaken" in found[0][1]


def test_names_azure_refuses_or_that_collide_in_their_resource_group_are_breaks() -> None:
    _, graph = artefacts("research-2500")
    gallery = azure(graph, "azure-native:compute:Gallery")[0]
    gallery["inputs"]["galleryName"] = "research-2500-gallery"  # hyphens: refused
    first, second = azure(graph, "azure-native:compute:VirtualMachineScaleSet")[:2]
    second["inputs"]["vmScaleSetName"] = first["inputs"]["vmScaleSetName"].upper()  # case-insensitive
    whats = [what for _, what in findings("research-2500", graph)]
    assert any("'research-2500-gallery' breaks Azure's rule for Gallery" in w for w in whats)
    assert any("the same VirtualMachineScaleSet name for 2 resources" in w for w in whats)
