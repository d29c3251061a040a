"""Per-role SSH keys (none exported), encryption at host, and the image account's Entra-only,
deny-by-default storage: on the shipped graphs and on stacks that give keys of their own."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography.hazmat.primitives.asymmetric import ed25519, rsa
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from pulumi_azure_native import compute

from kilonode.azure.graph import Graph
from kilonode.azure.mockplan import MOCK_DEPLOYER, run_plan
from kilonode.azure.node_image import UPLOAD_COMMAND
from kilonode.config import load_stack
from kilonode.plan import plan_stack
from kilonode.problems import StackError
from tests.azure.conftest import VM, VMSS
from tests.conftest import shipped_cluster_value

PRIVATE_KEY = "tls:index/privateKey:PrivateKey"
ACCOUNT = "azure-native:storage:StorageAccount"
ASSIGNMENT = "azure-native:authorization:RoleAssignment"
COMMAND = "command:local:Command"
GALLERY_IMAGE = "azure-native:compute:GalleryImage"


def openssh(key: Any, comment: str = "alice@example.com") -> str:
    return key.public_key().public_bytes(Encoding.OpenSSH, PublicFormat.OpenSSH).decode() + f" {comment}"


ED25519 = openssh(ed25519.Ed25519PrivateKey.generate())


def profile(resource: Any) -> dict[str, Any]:
    """A VM's inputs, or a scale set's VM profile (the same osProfile and securityProfile)."""
    inputs = resource.plain()
    return inputs["virtualMachineProfile"] if resource.type == VMSS else inputs


def authorized(resource: Any) -> list[str]:
    return [k["keyData"] for k in profile(resource)["osProfile"]["linuxConfiguration"]["ssh"]["publicKeys"]]


def stack_file(tmp_path: Path, **extra: Any) -> Path:
    path = tmp_path / "Pulumi.keyed.yaml"
    cluster = shipped_cluster_value("local") | extra
    path.write_text(yaml.safe_dump({"config": {"kilonode:cluster": cluster}}, sort_keys=False))
    return path


def test_no_stack_output_holds_a_private_key_and_no_role_shares_a_key(graph_7500: Graph) -> None:
    assert not [name for name in graph_7500.outputs if "ssh" in name.lower()]
    by_role: dict[str, set[str]] = {}
    for machine in [*graph_7500.of_type(VM), *graph_7500.of_type(VMSS)]:
        role = machine.plain()["tags"]["kilonode-role"].split(".")[0]  # a team's scale sets are their pool's
        by_role.setdefault(role, set()).update(authorized(machine))
    assert set(by_role) == {"etcd-main", "etcd-events", "apiserver", "pool-a100-ib", "pool-h100-ib", "pool-system",
                            "pool-monitoring"}
    assert all(len(keys) == 1 for keys in by_role.values())
    keys = [next(iter(k)) for k in by_role.values()]
    assert len(set(keys)) == len(keys)
    # one generated key per role, named after the role alone
    assert sorted(r.name for r in graph_7500.of_type(PRIVATE_KEY) if "-ssh-key-" in r.name) == [
        f"research-7500-ssh-key-{role}" for role in
        ("a100-ib", "apiservers", "etcd-events", "etcd-main", "h100-ib", "monitoring", "system")]


def test_a_role_given_operator_keys_gets_exactly_those_and_the_other_roles_keep_their_keys(tmp_path: Path) -> None:
    rsa_key = openssh(rsa.generate_private_key(public_exponent=65537, key_size=3072), "bob@example.com")
    graph = run_plan(load_stack(str(stack_file(tmp_path, sshKeys={"apiservers": [ED25519, rsa_key]}))))
    apiservers = [vm for vm in graph.of_type(VM) if vm.plain()["tags"]["kilonode-role"] == "apiserver"]
    assert apiservers and all(authorized(vm) == [ED25519, rsa_key] for vm in apiservers)
    generated = sorted(r.name for r in graph.of_type(PRIVATE_KEY) if "-ssh-key-" in r.name)
    # the other roles' key resources keep their names: their machines are not replaced
    assert generated == ["local-ssh-key-cpu", "local-ssh-key-etcd-events", "local-ssh-key-etcd-main"]


@pytest.mark.parametrize(("keys", "said"), [
    ({"apiservers": ["ssh-rsa AAAA bad"]}, "sshKeys.apiservers[0]: the key data"),
    ({"apiservers": [ED25519 + "\nssh-ed25519 AAAA"]}, "sshKeys.apiservers[0]: is not an OpenSSH public key line"),
    ({"apiservers": ['command="sh" ' + ED25519]}, "sshKeys.apiservers[0]: is not an OpenSSH public key line"),
    ({"apiservers": [openssh(rsa.generate_private_key(public_exponent=65537, key_size=1024))]},
     "an RSA key of 1024 bits"),
    ({"apiservers": ["ecdsa-sha2-nistp256 AAAAE2VjZHNh"]}, "is not one Azure takes"),
    ({"gpus": [ED25519]}, "sshKeys.gpus: 'gpus' is no role of this stack"),
    ({"cpu": []}, "sshKeys.cpu: an empty list"),
    ({"cpu": [ED25519, ED25519]}, "sshKeys.cpu: the same key is listed twice"),
])
def test_a_malformed_or_misplaced_key_is_refused_with_its_line_and_field(tmp_path: Path, keys: dict[str, Any],
                                                                         said: str) -> None:
    path = stack_file(tmp_path, sshKeys=keys)
    with pytest.raises(StackError) as refused:
        load_stack(str(path))
    message = str(refused.value)
    assert said in message and f"{path}:" in message
    line = int(message.split(f"{path}:", 1)[1].split(":", 1)[0])
    assert 0 < line <= len(path.read_text().splitlines())


def test_every_vm_and_scale_set_encrypts_at_host(graph_7500: Graph) -> None:
    machines = [*graph_7500.of_type(VM), *graph_7500.of_type(VMSS)]
    assert machines and all(profile(m)["securityProfile"] == {"encryptionAtHost": True} for m in machines)


def test_trusted_launch_is_left_off_while_the_pinned_compute_api_has_no_standard(graph_7500: Graph) -> None:
    # the unsigned GRUB and the DKMS-signed NVIDIA modules need Secure Boot off (kilonode.azure.common);
    # Microsoft.Compute 2024-11-01, the pinned package's, takes no "Standard" to say so: when the
    # package moves to an API that does, this fails, and every VM and scale set must set it
    assert {t.value for t in compute.SecurityTypes} == {"TrustedLaunch", "ConfidentialVM"}, \
        "the pinned compute API now has Standard: set securityType Standard on every VM and scale set"
    machines = [*graph_7500.of_type(VM), *graph_7500.of_type(VMSS)]
    assert machines and not [m.name for m in machines if {"securityType", "uefiSettings"} & set(
        profile(m).get("securityProfile") or {})]
    # and no image definition says it supports Trusted Launch (Azure's default then cannot pick it)
    definitions = graph_7500.of_type(GALLERY_IMAGE)
    assert definitions and not [d.name for d in definitions if any(
        f["name"] == "SecurityType" for f in d.plain().get("features") or [])]


def test_the_plan_leaves_it_off_only_where_the_catalogue_says_the_size_lacks_it() -> None:
    plan = plan_stack(load_stack("research-7500"))
    size = plan.control_plane.vm_size
    lacking = plan.model_copy(update={"vm_sizes": plan.vm_sizes | {
        size: plan.vm_sizes[size].model_copy(update={"encryption_at_host": False})}})
    assert plan.encryption_at_host(size) is True and lacking.encryption_at_host(size) is False
    assert plan.encryption_at_host("Standard_Unknown_v9") is True  # not in the catalogue: enabled


def test_the_image_account_takes_entra_id_only_from_the_deployer_and_the_upload_uses_it(graph_7500: Graph) -> None:
    [account] = [a for a in graph_7500.of_type(ACCOUNT) if a.name.endswith("-image-vhds")]
    inputs = account.plain()
    assert inputs["allowSharedKeyAccess"] is False and inputs["defaultToOAuthAuthentication"] is True
    assert inputs["allowBlobPublicAccess"] is False and inputs["enableHttpsTrafficOnly"] is True
    assert inputs["minimumTlsVersion"] == "TLS1_2"
    rules = inputs["networkRuleSet"]
    assert rules["defaultAction"] == "Deny" and rules["bypass"] == "AzureServices"
    assert [r["iPAddressOrRange"] for r in rules["ipRules"]] == ["198.51.100.0/24"]  # deployer.cidrs
    [uploader] = [r for r in graph_7500.of_type(ASSIGNMENT) if r.name.endswith("-vhds-uploader")]
    granted = uploader.plain()
    assert granted["principalId"] == MOCK_DEPLOYER and granted["scope"] == f"mock:{ACCOUNT}::{account.name}"
    assert granted["roleDefinitionId"].endswith("/ba92f5b4-2d11-453d-a403-e96b0029c9fe")
    assert "principalType" not in granted  # Azure looks the deployer up: a user or a service principal
    uploads = [c for c in graph_7500.of_type(COMMAND) if c.name.endswith("-vhd")]
    assert uploads and all(c.plain()["create"] == UPLOAD_COMMAND and uploader.name in c.depends_on for c in uploads)
    assert "--auth-mode login" in UPLOAD_COMMAND and "--auth-mode key" not in UPLOAD_COMMAND
    assert all("--auth-mode login" in c.plain()["delete"] for c in uploads)


def test_the_etcd_subnet_has_the_storage_service_endpoint_its_account_admits(graph_7500: Graph) -> None:
    endpoints = {s.plain()["subnetName"]: s.plain().get("serviceEndpoints") for s in
                 graph_7500.of_type("azure-native:network:Subnet")}
    assert endpoints.pop("etcd") == [{"service": "Microsoft.Storage", "locations": ["southcentralus"]}]
    assert not any(endpoints.values())
