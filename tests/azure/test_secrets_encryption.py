"""Secrets encrypted at rest: every apiserver's --encryption-provider-config names a file its
custom data delivers (0600, root), that file is an EncryptionConfiguration kube-apiserver reads
(upstream field names, a 32-byte secretbox key, identity last), and its key reaches nothing but
the apiservers' custom data: no other host, no printed graph, no stack output.

No kube-apiserver runs here (no registry this machine reaches carries one), so the file is
checked against the Go types' json tags at the pinned minors instead (UPSTREAM_FIELDS).
"""

from __future__ import annotations

import base64
import json
from dataclasses import replace
from typing import Any

import pytest

from kilonode.azure import custom_data
from kilonode.azure.graph import Graph, Recorded
from kilonode.plan import ClusterPlan, defaults, encryption, wellknown
from tests import shared
from tests.azure.conftest import VM, VMSS
from tests.azure.test_tls_and_custom_data import files_of, parts
from tests.etcd.snapshot_harness import rendered_flags

UNIT = "etc/systemd/system/kube-apiserver.service"
# kubernetes/apiserver pkg/apis/apiserver/v1/types_encryption.go: the json tags of each type
# the file uses, identical at kubernetes-1.32.0 (615cd377), 1.33.0 (0587439d), 1.34.0
# (3f478c29) and 1.35.7 (462023af); apiVersion and kind are metav1.TypeMeta's.
UPSTREAM_FIELDS = {
    "EncryptionConfiguration": {"apiVersion", "kind", "resources"},
    "ResourceConfiguration": {"resources", "providers"},
    "ProviderConfiguration": {"aesgcm", "aescbc", "secretbox", "identity", "kms"},
    "SecretboxConfiguration": {"keys"},
    "Key": {"name", "secret"},
    "IdentityConfiguration": set(),
}


def config_problems(doc: dict[str, Any]) -> list[str]:
    """What kube-apiserver would refuse or what would leave Secrets in plaintext."""
    problems = [f"{kind}: unknown field {name!r}" for kind, value in _typed(doc)
                for name in set(value) - UPSTREAM_FIELDS[kind]]
    if (doc.get("apiVersion"), doc.get("kind")) != ("apiserver.config.k8s.io/v1", "EncryptionConfiguration"):
        problems.append(f"not an apiserver.config.k8s.io/v1 EncryptionConfiguration: {doc.get('apiVersion')}")
    entries = doc.get("resources", [])
    if not any("secrets" in entry.get("resources", []) for entry in entries):
        problems.append("secrets are not listed")
    for entry in entries:
        providers = [name for provider in entry.get("providers", []) for name in provider]
        if not providers or providers[0] == "identity":
            problems.append(f"{entry.get('resources')}: the first provider (the one that writes) is {providers[:1]}")
        if providers[-1:] != ["identity"]:
            problems.append(f"{entry.get('resources')}: identity is not last; data written before stops reading")
        for provider in entry.get("providers", []):
            for key in provider.get("secretbox", {}).get("keys", []):
                if len(base64.b64decode(key["secret"])) != 32:
                    problems.append(f"secretbox key {key['name']!r} is not 32 bytes")
    return problems


def _typed(doc: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(Go type, value) of every object in the document."""
    found = [("EncryptionConfiguration", doc)]
    for entry in doc.get("resources", []):
        found.append(("ResourceConfiguration", entry))
        for provider in entry.get("providers", []):
            found.append(("ProviderConfiguration", provider))
            for name, value in provider.items():
                if name == "secretbox":
                    found += [("SecretboxConfiguration", value), *(("Key", k) for k in value.get("keys", []))]
                elif name == "identity":
                    found.append(("IdentityConfiguration", value))
    return found


def delivered(vm: Recorded) -> dict[str, dict[str, object]]:
    return files_of(parts(vm.plain()["osProfile"]["customData"])[1])


def apiserver_vms(graph: Graph, plan: ClusterPlan) -> list[Recorded]:
    return [graph.named(f"{plan.cluster}-apiserver-{i.index}") for i in plan.control_plane.instances]


@pytest.mark.parametrize("stack", shared.SHIPPED_STACKS)
def test_every_apiservers_flag_names_a_delivered_0600_file_kube_apiserver_reads(
    graphs: dict[str, Graph], plans: dict[str, ClusterPlan], stack: str
) -> None:
    plan, graph, rendered = plans[stack], graphs[stack], shared.rendered(stack)
    for instance, vm in zip(plan.control_plane.instances, apiserver_vms(graph, plan), strict=True):
        flags = dict(rendered_flags(rendered[instance.name][UNIT].content))
        path = flags["encryption-provider-config"]
        assert path == wellknown.ENCRYPTION_CONFIG
        entry = delivered(vm)[path]
        assert (entry["permissions"], entry["owner"]) == ("0600", "root:root")
        doc = shared.load_yaml(str(entry["content"]))
        assert config_problems(doc) == []
        [resources] = doc["resources"]
        assert [next(iter(p)) for p in resources["providers"]] == ["secretbox", "identity"]


def test_a_broken_configuration_is_caught() -> None:
    good = encryption.encryption_configuration_data(base64.b64encode(bytes(32)).decode())
    assert config_problems(good) == []
    misspelt = json.loads(json.dumps(good).replace('"secretbox"', '"secretBox"'))
    assert "ProviderConfiguration: unknown field 'secretBox'" in config_problems(misspelt)
    identity_first = json.loads(json.dumps(good))
    identity_first["resources"][0]["providers"].reverse()
    assert len(config_problems(identity_first)) == 2
    short = json.loads(json.dumps(good))
    short["resources"][0]["providers"][0]["secretbox"]["keys"][0]["secret"] = base64.b64encode(bytes(16)).decode()
    assert config_problems(short) == ["secretbox key 'kilonode-1' is not 32 bytes"]
    no_secrets = json.loads(json.dumps(good))
    no_secrets["resources"][0]["resources"] = ["configmaps"]
    assert config_problems(no_secrets) == ["secrets are not listed"]
    # and the renderer itself refuses a key of the wrong length or not base64
    with pytest.raises(ValueError, match="is 16 bytes"):
        encryption.encryption_configuration(base64.b64encode(bytes(16)).decode())
    with pytest.raises(ValueError, match="not valid base64"):
        encryption.encryption_configuration("not base64!")


def the_key(graph: Graph, plan: ClusterPlan) -> str:
    [key] = {str(shared.load_yaml(str(delivered(vm)[wellknown.ENCRYPTION_CONFIG]["content"]))
                 ["resources"][0]["providers"][0]["secretbox"]["keys"][0]["secret"])
             for vm in apiserver_vms(graph, plan)}
    return key


def carriers(graph: Graph, key: str) -> set[str]:
    """Resources that hold the key anywhere in their inputs, custom data decoded; a printed
    (masked) graph or a stack output that shows it fails at once."""
    assert key not in json.dumps([r.masked() for r in graph.resources]), "the key shows in the printed graph"
    assert key not in json.dumps(graph.outputs, default=str), "the key is in a stack output"
    found = set()
    for r in graph.resources:
        text = json.dumps(r.plain(), default=str)
        if r.type in (VM, VMSS):
            profile = r.plain()["osProfile"] if r.type == VM else r.plain()["virtualMachineProfile"]["osProfile"]
            text += custom_data.decode(profile["customData"])
        if key in text:
            found.add(r.name)
    return found


@pytest.mark.parametrize("stack", shared.SHIPPED_STACKS)
def test_the_key_reaches_the_apiservers_custom_data_and_nothing_else(
    graphs: dict[str, Graph], plans: dict[str, ClusterPlan], stack: str
) -> None:
    plan, graph = plans[stack], graphs[stack]
    key = the_key(graph, plan)
    assert carriers(graph, key) == {vm.name for vm in apiserver_vms(graph, plan)}
    for host, files in shared.rendered(stack).items():
        assert not any(key in f.content for f in files.values()), host
    # seeded: an etcd member that got the file too is found
    etcd = graph.named(f"{plan.cluster}-etcd-main-0")
    osprofile = dict(etcd.plain()["osProfile"])
    osprofile["customData"] = base64.b64encode(
        (custom_data.decode(osprofile["customData"]) + key).encode()).decode()
    leaky = replace(graph, resources=[*graph.resources, replace(etcd, name="leaky", inputs={"osProfile": osprofile})])
    assert "leaky" in carriers(leaky, key)
    # seeded: an output that exports it
    with pytest.raises(AssertionError, match="stack output"):
        carriers(replace(graph, outputs={"oops": key}), key)


@pytest.mark.parametrize("stack", shared.SHIPPED_STACKS)
def test_the_snapshot_identity_is_a_secret_output_no_vm_carries_but_its_recipient_reaches_every_etcd_member(
    graphs: dict[str, Graph], plans: dict[str, ClusterPlan], stack: str
) -> None:
    plan, graph = plans[stack], graphs[stack]
    output = graph.outputs["etcdSnapshotIdentity"]
    assert isinstance(output, dict) and "value" in output and output["value"].startswith("AGE-SECRET-KEY-1")
    assert output["value"] not in json.dumps([r.masked() for r in graph.resources])
    texts = [custom_data.decode(vm.plain()["osProfile"]["customData"]) for vm in graph.of_type(VM)]
    assert not any(output["value"] in text for text in texts)
    recipients = {json.loads(str(delivered(graph.named(f"{plan.cluster}-{m.name}"))[defaults.ETCD_SNAPSHOT_AZURE_CONFIG]
                                 ["content"]))["ageRecipient"] for e in plan.etcd_clusters for m in e.members}
    assert len(recipients) == 1 and recipients.pop().startswith("age1")
