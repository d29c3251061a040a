"""storage-access and encryption-at-host: the shipped stacks pass (encryption at host: a
warning per role whose size's support no first-party page states); each seeded break (a
storage account with shared keys or open to every network, a VM or scale set without
encryption at host) is named, and a peered deployer is warned of."""

from __future__ import annotations

from typing import Any

import pytest

from kilonode.plan.model import ClusterPlan
from kilonode.preflight import run
from kilonode.preflight.load import from_parts
from tests import shared
from tests.preflight.conftest import artefacts, inputs_of

ACCOUNT = "azure-native:storage:StorageAccount"


def found(stack: str, check: str, graph: dict[str, Any] | None = None,
          plan: ClusterPlan | None = None) -> list[tuple[str, str, str]]:
    if plan is None:
        inputs = inputs_of(stack, graph=graph)
    else:
        files, own = artefacts(stack)
        inputs = from_parts(plan, files, graph if graph is not None else own, source=stack)
    return [(f.level, f.where, f.what) for f in run(inputs, [check])]


def test_the_shipped_stacks_storage_accounts_take_entra_id_only_from_named_networks(shipped: str) -> None:
    assert found(shipped, "storage-access") == []


@pytest.mark.parametrize(("field", "value", "said"), [
    ("allowSharedKeyAccess", True, "allows shared keys"),
    ("allowSharedKeyAccess", None, "allows shared keys"),  # Azure's default is to allow them
    ("networkRuleSet", {"defaultAction": "Allow"}, "accepts every network"),
    ("networkRuleSet", None, "accepts every network"),
    ("allowBlobPublicAccess", True, "allows anonymous blob access"),
    ("minimumTlsVersion", "TLS1_0", "accepts TLS older than 1.2"),
])
@pytest.mark.parametrize("account", ["image-vhds", "etcd-backup-account"])
def test_an_account_with_shared_keys_or_open_networks_is_a_break(account: str, field: str, value: Any,
                                                                 said: str) -> None:
    _, graph = artefacts("local")
    [seeded] = [r for r in graph["resources"] if r["type"] == ACCOUNT and r["name"] == f"local-{account}"]
    if value is None:
        seeded["inputs"].pop(field)
    else:
        seeded["inputs"][field] = value
    [(level, where, what)] = found("local", "storage-access", graph)
    assert (level, where) == ("break", f"{ACCOUNT} local-{account}") and what.startswith(f"the account {said}")


def test_a_peered_deployer_is_warned_that_the_upload_cannot_reach_the_image_account() -> None:
    plan = shared.plan("local")
    assert plan.network.deployer is not None
    peered = plan.network.deployer.model_copy(update={
        "network": "peered", "vnet_id": "/subscriptions/0/resourceGroups/ci/providers/Microsoft.Network/"
                                       "virtualNetworks/ci", "cidrs": (plan.network.deployer.cidrs[0],)})
    moved = plan.model_copy(update={"network": plan.network.model_copy(update={"deployer": peered})})
    [(level, where, what)] = found("local", "storage-access", plan=moved)
    assert (level, where) == ("warn", "deployer") and "peered runner" in what


def test_the_shipped_stacks_encrypt_at_host_and_warn_once_per_role_of_unknown_size(shipped: str) -> None:
    findings = found(shipped, "encryption-at-host")
    assert findings and all(level == "warn" for level, _, _ in findings)
    roles = [where for _, where, _ in findings]
    assert len(roles) == len(set(roles)) and {"etcd-main", "etcd-events", "apiserver"} <= set(roles)
    fixes = [f.fix for f in run(inputs_of(shipped), ["encryption-at-host"])]
    assert all("az feature register --namespace Microsoft.Compute --name EncryptionAtHost" in fix
               and "EncryptionAtHostSupported" in fix for fix in fixes)


@pytest.mark.parametrize("machine", ["local-etcd-main-0", "local-apiserver-0", "local-cpu-000"])
def test_a_machine_without_encryption_at_host_is_a_break(machine: str) -> None:
    _, graph = artefacts("local")
    [seeded] = [r for r in graph["resources"] if r["name"] == machine]
    holder = seeded["inputs"].get("virtualMachineProfile") or seeded["inputs"]
    holder.pop("securityProfile")
    breaks = [(where, what) for level, where, what in found("local", "encryption-at-host", graph) if level == "break"]
    assert len(breaks) == 1 and breaks[0][0].endswith(f" {machine}")
    assert "gets no securityProfile.encryptionAtHost" in breaks[0][1]


def test_a_size_the_catalogue_says_supports_it_breaks_without_it_and_warns_no_more() -> None:
    plan = shared.plan("local")
    size = plan.control_plane.vm_size
    known = plan.model_copy(update={"vm_sizes": {
        name: facts.model_copy(update={"encryption_at_host": True}) for name, facts in plan.vm_sizes.items()}})
    assert found("local", "encryption-at-host", plan=known) == []
    _, graph = artefacts("local")
    [seeded] = [r for r in graph["resources"] if r["name"] == "local-apiserver-0"]
    seeded["inputs"]["securityProfile"] = {"encryptionAtHost": False}
    [(level, where, what)] = found("local", "encryption-at-host", graph, plan=known)
    assert level == "break" and where.endswith(" local-apiserver-0")
    assert f"{size} gets no securityProfile.encryptionAtHost although the catalogue says it supports it" in what


def test_a_principal_type_on_the_deployers_role_assignment_is_a_break() -> None:
    _, graph = artefacts("local")
    [uploader] = [r for r in graph["resources"] if r["name"] == "local-image-vhds-uploader"]
    assert "principalType" not in uploader["inputs"]
    uploader["inputs"]["principalType"] = "User"  # the SDK's default: fails a CI service principal
    [(level, where, what)] = found("local", "azure-names", graph)
    assert (level, where) == ("break", "azure-native:authorization:RoleAssignment local-image-vhds-uploader")
    assert "UnmatchedPrincipalType" in what
