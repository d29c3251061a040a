"""etcd-backups: the shipped stacks pass; each seeded break is named: an events member carrying the
main cluster's identity (or a second one, or none), an identity whose scope is the account, another
cluster's container or the resource group, a role that deletes or reads, a built-in role, a
container without its retention policy, an account without soft delete."""

from __future__ import annotations

from typing import Any

import pytest

from kilonode.preflight import run
from tests.preflight.conftest import artefacts, inputs_of

CHECK = "etcd-backups"
MOCK_IDENTITY = "mock:azure-native:managedidentity:UserAssignedIdentity::"
ASSIGNMENT = "azure-native:authorization:RoleAssignment"
SBDC = "ba92f5b4-2d11-453d-a403-e96b0029c9fe"  # Storage Blob Data Contributor


def found(graph: dict[str, Any] | None = None, stack: str = "local") -> list[tuple[str, str, str]]:
    return [(f.level, f.where, f.what) for f in run(inputs_of(stack, graph=graph), [CHECK])]


def named(graph: dict[str, Any], name: str) -> dict[str, Any]:
    [resource] = [r for r in graph["resources"] if r["name"] == name]
    return resource


def one_break(graph: dict[str, Any]) -> tuple[str, str]:
    findings = found(graph)
    assert [level for level, _, _ in findings] == ["break"], findings
    [(_, where, what)] = findings
    return where, what


def test_the_shipped_stacks_backups_are_each_clusters_own_and_immutable(shipped: str) -> None:
    assert found(stack=shipped) == []


def test_the_check_covers_every_etcd_cluster_of_the_plan() -> None:
    _, graph = artefacts("local")
    graph["resources"] = [r for r in graph["resources"] if r["name"] != "local-etcd-backup-events-container"]
    where, what = one_break(graph)
    assert where == "etcd-events" and "no container etcd-snapshots-events" in what


def test_an_events_member_carrying_the_main_clusters_identity_is_a_break() -> None:
    _, graph = artefacts("local")
    named(graph, "local-etcd-events-1")["inputs"]["identity"]["userAssignedIdentities"] = [
        f"{MOCK_IDENTITY}local-etcd-backup-main-identity"]
    findings = found(graph)
    writer = f"{ASSIGNMENT} local-etcd-backup-main-writer"
    assert {(level, where) for level, where, _ in findings} == {
        ("break", "etcd-main"), ("break", "etcd-events"), ("break", writer)}
    whats = dict((where, what) for _, where, what in findings)
    assert "identity local-etcd-backup-main-identity is carried outside the cluster too (local-etcd-events-1)" in (
        whats["etcd-main"])
    assert "carry 2 identities" in whats["etcd-events"]
    # and what that identity may do, seen from the events cluster: the main cluster's container
    main_container = "mock:azure-native:storage:BlobContainer::local-etcd-backup-main-container"
    assert whats[writer].startswith(
        f"identity local-etcd-backup-main-identity, carried by the etcd events members: its scope {main_container} "
        "is not the events cluster's container etcd-snapshots-events")


@pytest.mark.parametrize(("identities", "said"), [
    ([], "local-etcd-main-0 carries no identity: its snapshot uploads are refused"),
    ([f"{MOCK_IDENTITY}local-etcd-backup-main-identity", f"{MOCK_IDENTITY}local-controllers-cloud-provider-identity"],
     "carry 2 identities"),
])
def test_a_member_without_its_identity_or_with_another_one_is_a_break(identities: list[str], said: str) -> None:
    _, graph = artefacts("local")
    named(graph, "local-etcd-main-0")["inputs"]["identity"]["userAssignedIdentities"] = identities
    assert any(level == "break" and where == "etcd-main" and said in what for level, where, what in found(graph))


@pytest.mark.parametrize(("scope", "said"), [
    ("mock:azure-native:storage:StorageAccount::local-etcd-backup-account", "reaches beyond the main cluster's"),
    ("mock:azure-native:storage:BlobContainer::local-etcd-backup-events-container",
     "is not the main cluster's container etcd-snapshots-main"),
    ("/subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/local", "reaches beyond the main cluster's"),
])
def test_a_scope_wider_than_the_clusters_own_container_is_a_break(scope: str, said: str) -> None:
    _, graph = artefacts("local")
    named(graph, "local-etcd-backup-main-writer")["inputs"]["scope"] = scope
    where, what = one_break(graph)
    assert where == f"{ASSIGNMENT} local-etcd-backup-main-writer"
    assert what.startswith("identity local-etcd-backup-main-identity, carried by the etcd main members")
    assert said in what


@pytest.mark.parametrize(("permissions", "said"), [
    ({"actions": [], "dataActions": ["Microsoft.Storage/storageAccounts/blobServices/containers/blobs/write",
                                     "Microsoft.Storage/storageAccounts/blobServices/containers/blobs/delete"]},
     "beyond writing blobs (Microsoft.Storage/storageAccounts/blobServices/containers/blobs/delete)"),
    ({"actions": [], "dataActions": ["Microsoft.Storage/storageAccounts/blobServices/containers/blobs/*"]},
     "beyond writing blobs"),
    ({"actions": ["Microsoft.Storage/storageAccounts/blobServices/containers/delete"],
      "dataActions": ["Microsoft.Storage/storageAccounts/blobServices/containers/blobs/write"]},
     "control-plane actions"),
    ({"actions": [], "dataActions": ["Microsoft.Storage/storageAccounts/blobServices/containers/blobs/add/action"]},
     "lacks Microsoft.Storage/storageAccounts/blobServices/containers/blobs/write"),
])
def test_a_role_that_deletes_reads_or_cannot_write_blocks_is_a_break(permissions: dict[str, Any], said: str) -> None:
    _, graph = artefacts("local")
    named(graph, "local-etcd-backup-writer-role")["inputs"]["permissions"] = [permissions]
    findings = found(graph)
    # the one role is every cluster's: each cluster's assignment is named
    assert {where for _, where, _ in findings} == {f"{ASSIGNMENT} local-etcd-backup-main-writer",
                                                  f"{ASSIGNMENT} local-etcd-backup-events-writer"}
    assert all(level == "break" and said in what for level, _, what in findings)


def test_a_built_in_role_is_a_break_it_deletes() -> None:
    _, graph = artefacts("local")
    named(graph, "local-etcd-backup-events-writer")["inputs"]["roleDefinitionId"] = (
        f"/subscriptions/00000000-0000-0000-0000-000000000000/providers/Microsoft.Authorization/roleDefinitions/{SBDC}")
    where, what = one_break(graph)
    assert where == f"{ASSIGNMENT} local-etcd-backup-events-writer"
    assert "its role Storage Blob Data Contributor is no custom role of this graph" in what


def test_an_identity_without_a_role_is_a_break() -> None:
    _, graph = artefacts("local")
    graph["resources"] = [r for r in graph["resources"] if r["name"] != "local-etcd-backup-main-writer"]
    where, what = one_break(graph)
    assert where == "etcd-main" and "has no role: every upload is refused" in what


def test_a_container_without_its_retention_policy_is_a_break_and_a_short_one_a_warning() -> None:
    _, graph = artefacts("local")
    graph["resources"] = [r for r in graph["resources"] if r["name"] != "local-etcd-backup-main-retention"]
    where, what = one_break(graph)
    assert where == "azure-native:storage:BlobContainer local-etcd-backup-main-container"
    assert "no time-based retention policy" in what and "can overwrite any snapshot" in what
    _, graph = artefacts("local")
    named(graph, "local-etcd-backup-events-retention")["inputs"]["immutabilityPeriodSinceCreationInDays"] = 2
    [(level, where, what)] = found(graph)
    assert (level, where) == ("warn", "azure-native:storage:BlobContainer local-etcd-backup-events-container")
    assert "holds snapshots 2 days" in what


@pytest.mark.parametrize(("policy", "said"), [
    ("deleteRetentionPolicy", "blob soft delete is off"),
    ("containerDeleteRetentionPolicy", "container soft delete is off"),
])
def test_an_account_without_soft_delete_is_a_break_named_once(policy: str, said: str) -> None:
    _, graph = artefacts("local")
    named(graph, "local-etcd-backup-blob-service")["inputs"][policy] = {"enabled": False, "days": 7}
    where, what = one_break(graph)
    assert where.startswith("azure-native:storage:StorageAccount ") and said in what
