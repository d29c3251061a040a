"""EtcdBackup, recorded on its own under Pulumi's mock engine: every input against the provider
SDK's own types, Azure's naming rules, a container, a retention policy and an identity per etcd
cluster, each identity's write-only role scoped to its own container, soft delete on the account,
a stable account name, and the file the snapshot script reads."""

from __future__ import annotations

import base64
import copy
import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import replace
from typing import Any

import pulumi
import pytest
from pulumi.runtime import rpc

from kilonode.azure.backup import (
    SNAPSHOT_WRITER_DATA_ACTIONS,
    EtcdBackup,
    EtcdBackupArgs,
    age_keys,
    backup_account_name,
    snapshot_container,
)
from kilonode.azure.graph import Graph
from kilonode.azure.mockplan import MOCK_SUBSCRIPTION, run_program
from kilonode.node.ship import ETCD_SNAPSHOT
from kilonode.plan import defaults
from tests.azure.conftest import mock_id
from tests.azure.sdk_inputs import problems
from tests.azure.test_azure_rules import NAME_RULES
from tests.conftest import shipped_cluster_value

ACCOUNT = "azure-native:storage:StorageAccount"
CONTAINER = "azure-native:storage:BlobContainer"
POLICY = "azure-native:storage:ManagementPolicy"
SERVICE = "azure-native:storage:BlobServiceProperties"
RETENTION = "azure-native:storage:BlobContainerImmutabilityPolicy"
IDENTITY = "azure-native:managedidentity:UserAssignedIdentity"
ASSIGNMENT = "azure-native:authorization:RoleAssignment"
ROLE_DEFINITION = "azure-native:authorization:RoleDefinition"
RANDOM_BYTES = "random:index/randomBytes:RandomBytes"  # the age key the snapshots are encrypted to
RESOURCE_GROUP_ID = f"/subscriptions/{MOCK_SUBSCRIPTION}/resourceGroups/local-rg"
ETCD_SUBNET = f"{RESOURCE_GROUP_ID}/providers/Microsoft.Network/virtualNetworks/local-vnet/subnets/etcd"
ROLES = ("main", "events", "leases")


def record(cluster: str = "local", zones: tuple[str, ...] = ("1", "2", "3"), roles: tuple[str, ...] = ROLES) -> Graph:
    def program() -> None:
        backup = EtcdBackup(f"{cluster}-etcd-backup", EtcdBackupArgs(
            cluster=cluster, location="westus2", zones=zones, resource_group_name="local-rg",
            resource_group_id=pulumi.Output.from_input(RESOURCE_GROUP_ID), etcd_subnet_id=ETCD_SUBNET,
            deployer_ip_rules=["198.51.100.0/24", "203.0.113.7"], roles=roles,
        ))
        for role in roles:
            delivered = backup.host_file(role)
            pulumi.export(f"azureConfigPath-{role}", delivered.path)
            pulumi.export(f"azureConfig-{role}", delivered.content)
            pulumi.export(f"identityId-{role}", backup.identity_ids[role])
        pulumi.export("snapshotIdentity", backup.snapshot_identity)

    return run_program("local", shipped_cluster_value("local"), program)


@pytest.fixture(scope="module")
def graph() -> Graph:
    return record()


def one(graph: Graph, type_: str) -> Any:
    [resource] = graph.of_type(type_)
    return resource


def test_every_input_matches_the_provider_sdks_input_types(graph: Graph) -> None:
    per_cluster = [CONTAINER, RETENTION, IDENTITY, ASSIGNMENT]
    assert sorted(r.type for r in graph.resources if r.custom) == sorted(
        [ACCOUNT, SERVICE, POLICY, ROLE_DEFINITION, RANDOM_BYTES, *per_cluster * len(ROLES)])
    assert [p for r in graph.resources for p in problems(r)] == []


def test_the_sdk_check_reaches_into_the_lifecycle_rule(graph: Graph) -> None:
    policy = one(graph, POLICY)
    inputs = copy.deepcopy(policy.plain())
    delete = inputs["policy"]["rules"][0]["definition"]["actions"]["baseBlob"]["delete"]
    delete["daysAfterModificationGreaterThen"] = delete.pop("daysAfterModificationGreaterThan")
    found = problems(replace(policy, inputs=inputs))
    assert len(found) == 1 and "daysAfterModificationGreaterThen: not a property" in found[0]


def test_every_resource_is_named_within_azures_rules_and_parented_to_the_component(graph: Graph) -> None:
    for resource in graph.resources:
        if not resource.custom:
            assert resource.type == "kilonode:azure:EtcdBackup"
            continue
        assert resource.parent == "local-etcd-backup" and resource.name.startswith("local-etcd-backup-")
        if resource.type == RANDOM_BYTES:
            continue  # not an Azure resource: no Azure name
        field, low, high, pattern = NAME_RULES[resource.type]
        name = resource.plain().get(field)
        assert isinstance(name, str) and low <= len(name) <= high and re.fullmatch(pattern, name), (resource.type, name)


def test_the_account_takes_no_anonymous_access_no_shared_keys_and_tls_12_and_is_protected(graph: Graph) -> None:
    account = one(graph, ACCOUNT)
    inputs = account.plain()
    assert inputs["allowBlobPublicAccess"] is False
    assert inputs["allowSharedKeyAccess"] is False
    assert inputs["enableHttpsTrafficOnly"] is True
    assert inputs["minimumTlsVersion"] == "TLS1_2"
    assert inputs["sku"] == {"name": "Standard_ZRS"}  # the region has zones
    assert account.protect
    assert [c.plain()["publicAccess"] for c in graph.of_type(CONTAINER)] == ["None"] * len(ROLES)
    assert one(record(zones=()), ACCOUNT).plain()["sku"] == {"name": "Standard_LRS"}


def test_the_account_denies_every_network_but_the_etcd_subnet_and_the_deployers_addresses(graph: Graph) -> None:
    rules = one(graph, ACCOUNT).plain()["networkRuleSet"]
    assert rules["defaultAction"] == "Deny"
    # nothing of Azure's own reads snapshots: no trusted-services exception
    assert rules["bypass"] == "None"
    assert rules["virtualNetworkRules"] == [{"virtualNetworkResourceId": ETCD_SUBNET, "action": "Allow"}]
    assert [r["iPAddressOrRange"] for r in rules["ipRules"]] == ["198.51.100.0/24", "203.0.113.7"]


def of_role(graph: Graph, type_: str, role: str) -> Any:
    [resource] = [r for r in graph.of_type(type_) if r.name.startswith(f"local-etcd-backup-{role}-")]
    return resource


@pytest.mark.parametrize("role", ROLES)
def test_each_etcd_clusters_identity_may_only_write_blobs_in_its_own_container(graph: Graph, role: str) -> None:
    container = of_role(graph, CONTAINER, role)
    assert container.plain()["containerName"] == snapshot_container(role) == f"etcd-snapshots-{role}"
    identity = of_role(graph, IDENTITY, role)
    assert identity.plain()["resourceName"] == f"local-etcd-backup-{role}"
    # the cluster's one assignment: its identity, its own container's resource ID (not the
    # account, not the resource group, not another cluster's container)
    [assignment] = [a.plain() for a in graph.of_type(ASSIGNMENT)
                    if a.plain()["principalId"] == f"mock-principal-id:{identity.name}"]
    assert assignment["scope"] == mock_id(container)
    assert assignment["principalType"] == "ServicePrincipal"
    # a GUID derived from the scope, principal and role: the same on every run
    assert assignment["roleAssignmentName"] in {a.plain()["roleAssignmentName"] for a in record().of_type(ASSIGNMENT)}
    # the role: the custom one, of blobs/write alone: no read, no delete, no control-plane action
    definition = one(graph, ROLE_DEFINITION).plain()
    assert assignment["roleDefinitionId"] == (f"/subscriptions/{MOCK_SUBSCRIPTION}/providers/Microsoft.Authorization/"
                                              f"roleDefinitions/{definition['roleDefinitionId']}")
    assert definition["permissions"] == [{"actions": [], "dataActions": list(SNAPSHOT_WRITER_DATA_ACTIONS)}]
    assert SNAPSHOT_WRITER_DATA_ACTIONS == ("Microsoft.Storage/storageAccounts/blobServices/containers/blobs/write",)
    assert definition["assignableScopes"] == [RESOURCE_GROUP_ID] == [definition["scope"]]
    # "Storage Blob Data Contributor" (it deletes) is assigned nowhere
    assert not any("ba92f5b4-2d11-453d-a403-e96b0029c9fe" in a.plain()["roleDefinitionId"]
                   for a in graph.of_type(ASSIGNMENT))


def test_every_identity_and_every_container_belongs_to_one_cluster(graph: Graph) -> None:
    scopes = [a.plain()["scope"] for a in graph.of_type(ASSIGNMENT)]
    principals = [a.plain()["principalId"] for a in graph.of_type(ASSIGNMENT)]
    assert len(set(scopes)) == len(set(principals)) == len(ROLES)
    assert sorted(scopes) == sorted(mock_id(c) for c in graph.of_type(CONTAINER))
    # a stack without a leases cluster gets no leases container or identity
    names = {c.plain()["containerName"] for c in record(roles=("main", "events")).of_type(CONTAINER)}
    assert names == {"etcd-snapshots-main", "etcd-snapshots-events"}


@pytest.mark.parametrize("role", ROLES)
def test_no_snapshot_can_be_overwritten_or_deleted_before_the_retention(graph: Graph, role: str) -> None:
    policy = of_role(graph, RETENTION, role).plain()
    assert policy == {
        "immutabilityPolicyName": "default", "accountName": one(graph, ACCOUNT).plain()["accountName"],
        "containerName": snapshot_container(role), "resourceGroupName": "local-rg",
        "immutabilityPeriodSinceCreationInDays": defaults.ETCD_SNAPSHOT_BLOB_RETENTION_DAYS,
        "allowProtectedAppendWrites": False,
    }


def test_deleted_blobs_and_containers_stay_recoverable(graph: Graph) -> None:
    service = one(graph, SERVICE).plain()
    kept = {"enabled": True, "days": defaults.ETCD_SNAPSHOT_SOFT_DELETE_DAYS}
    assert service["blobServicesName"] == "default"
    assert service["deleteRetentionPolicy"] == kept == service["containerDeleteRetentionPolicy"]
    # Microsoft's recommended minimum for both (data-protection-overview.md, "Restore")
    assert defaults.ETCD_SNAPSHOT_SOFT_DELETE_DAYS >= 7


def test_old_snapshots_are_deleted_after_the_retention(graph: Graph) -> None:
    [rule] = one(graph, POLICY).plain()["policy"]["rules"]
    assert rule["enabled"] and rule["type"] == "Lifecycle"
    # a prefix match starts with the container's name (Azure lifecycle management): every cluster's
    assert rule["definition"]["filters"] == {"blobTypes": ["blockBlob"],
                                             "prefixMatch": [f"etcd-snapshots-{role}/" for role in ROLES]}
    assert rule["definition"]["actions"]["baseBlob"] == {
        "delete": {"daysAfterModificationGreaterThan": defaults.ETCD_SNAPSHOT_BLOB_RETENTION_DAYS}}


@pytest.mark.parametrize("cluster", ["local", "research-7500", "A-very-long_cluster.name-with-symbols-2026", "-"])
def test_the_account_name_is_stable_fits_azures_rules_and_differs_by_subscription(cluster: str) -> None:
    name = backup_account_name(cluster, MOCK_SUBSCRIPTION)
    assert name == backup_account_name(cluster, MOCK_SUBSCRIPTION)
    assert 3 <= len(name) <= 24 and re.fullmatch(r"[a-z0-9]+", name)
    assert name != backup_account_name(cluster, "11111111-1111-1111-1111-111111111111")


def test_the_recorded_account_name_is_the_derived_one_on_every_run(graph: Graph) -> None:
    recorded = one(graph, ACCOUNT).plain()["accountName"]
    assert recorded == backup_account_name("local", MOCK_SUBSCRIPTION) == one(record(), ACCOUNT).plain()["accountName"]
    assert recorded.startswith("localetcdbk")


def is_secret(value: Any) -> bool:
    return isinstance(value, dict) and value.get(rpc._special_sig_key) == rpc._special_secret_sig


def test_the_age_keys_are_what_age_itself_derives() -> None:
    """age-keygen -y prints an identity's recipient: ours must be the same string."""
    if not shutil.which("age-keygen"):
        pytest.fail("age-keygen missing: run `make setup` (installs .ci/debian-packages.txt)")
    for raw in (bytes(31) + b"\x01", hashlib.sha256(b"kilonode").digest(), os.urandom(32)):
        identity, recipient = age_keys(base64.b64encode(raw).decode())
        derived = subprocess.run(["age-keygen", "-y"], input=identity + "\n", capture_output=True, text=True,
                                 timeout=30, check=True)
        assert derived.stdout.strip() == recipient
    # seeded: one flipped bit in the identity's checksum and age refuses it
    broken = identity[:-1] + ("Q" if identity[-1] != "Q" else "P")
    refused = subprocess.run(["age-keygen", "-y"], input=broken + "\n", capture_output=True, text=True, timeout=30)
    assert refused.returncode != 0
    with pytest.raises(ValueError, match="32 bytes, not 16"):
        age_keys(base64.b64encode(bytes(16)).decode())


@pytest.mark.parametrize("role", ROLES)
def test_the_delivered_file_is_what_the_snapshot_script_reads(graph: Graph, role: str) -> None:
    assert graph.outputs[f"azureConfigPath-{role}"] == defaults.ETCD_SNAPSHOT_AZURE_CONFIG
    azure = json.loads(graph.outputs[f"azureConfig-{role}"])
    account = backup_account_name("local", MOCK_SUBSCRIPTION)
    recipient = azure.pop("ageRecipient")
    # this cluster's own container and identity
    assert azure == {"blobEndpoint": f"https://{account}.blob.core.windows.net/",
                     "container": f"etcd-snapshots-{role}",
                     "clientId": f"mock-client-id:local-etcd-backup-{role}-identity"}
    # the members get the public recipient of the identity the stack keeps as a secret
    identity = graph.outputs["snapshotIdentity"]
    assert is_secret(identity) and not is_secret(graph.outputs[f"azureConfig-{role}"])
    assert identity["value"].startswith("AGE-SECRET-KEY-1") and recipient.startswith("age1")
    assert identity["value"] not in json.dumps(graph.outputs[f"azureConfig-{role}"])
    assert graph.outputs[f"identityId-{role}"] == mock_id(of_role(graph, IDENTITY, role))
    # the script (kilonode/node/etcd_snapshot.py) builds its blob URLs from it
    spec = importlib.util.spec_from_file_location("etcd_snapshot_for_backup", ETCD_SNAPSHOT.path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        url = module.blob_url(azure, f"20261123T174500Z-rev1-etcd-{role}-0.db.age")
    finally:
        del sys.modules[spec.name]
    assert url == (f"https://{account}.blob.core.windows.net/etcd-snapshots-{role}/"
                   f"20261123T174500Z-rev1-etcd-{role}-0.db.age")
