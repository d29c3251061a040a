"""The deployer's prerequisites (kilonode.azure.deployer), checked before `pulumi up` registers
anything. The tools here are small scripts on a PATH of the test's own that answer as the real
CLIs do (the output formats of `kubectl version --client -o json`, `az account show` and
`az feature show --query properties.state -o tsv`); they test how the program reads those
answers, not the CLIs."""

from __future__ import annotations

from pathlib import Path

import pulumi
import pytest

from kilonode.azure.deployer import deployer_problems
from kilonode.azure.program import require_deployer
from tests import shared

KUBECTL_JSON = '{"clientVersion":{"major":"1","minor":"%s","gitVersion":"v1.%s.2"},"kustomizeVersion":"v5.7.1"}'


def tool(directory: Path, name: str, body: str) -> None:
    path = directory / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


@pytest.fixture
def bin_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PATH", str(tmp_path))
    return tmp_path


ACCOUNT = """printf '{"id": "00000000-0000-0000-0000-000000000000"}\\n'"""
NOT_LOGGED_IN = """printf "Please run 'az login' to setup account.\\n" >&2; exit 1"""


# `az vm list-skus ... -o json` as Azure answers: the size's entry, with a Location restriction
# where the subscription may not use it there; [] where the region has no such size
SKU = '[{"name": "%s", "resourceType": "virtualMachines", "locations": ["%s"], "restrictions": %s}]'
RESTRICTED = '[{"type": "Location", "reasonCode": "NotAvailableForSubscription", "values": ["%s"]}]'


# `az vm list-usage -o json` as Azure answers: name.value is the quota family
USAGE = ('[{"currentValue": 96, "limit": 1000, "name": {"value": "cores", "localizedValue": "Total Regional vCPUs"}}, '
         '{"currentValue": 0, "limit": %d, "name": {"value": "standardNDASv4_A100Family"}}]')


def az(directory: Path, logged_in: bool = True, feature: str = "Registered", sold: str = "sold",
       a100_limit: int = 0) -> None:
    """sold: "sold" (every size listed), "none" (no size there) or "restricted"."""
    account = ACCOUNT if logged_in else NOT_LOGGED_IN
    skus = {"sold": SKU % ("$size", "$location", "[]"), "none": "[]",
            "restricted": SKU % ("$size", "$location", RESTRICTED % "$location")}[sold]
    tool(directory, "az", "\n".join([
        'while [ $# -gt 0 ]; do case "$1" in --size) size=$2;; --location) location=$2;; esac; '
        'words="$words $1"; shift; done',
        'case "$words" in',
        f'  " account show"*) {account} ;;',
        f"  \" feature show\"*) printf '{feature}\\n' ;;",
        f"  \" vm list-skus\"*) printf '%s\\n' \"{skus.replace(chr(34), chr(92) + chr(34))}\" ;;",
        f"  \" vm list-usage\"*) printf '%s\\n' '{USAGE % a100_limit}' ;;",
        "  *) exit 2 ;;",
        "esac",
    ]))


def test_nothing_on_path_names_both_tools_and_what_each_is_for(bin_dir: Path) -> None:
    problems = deployer_problems("1.34.2", encryption_at_host=True)
    assert problems == [
        "kubectl is not on PATH: the readiness gate runs it against the new apiserver (install kubectl 1.34, "
        "within one minor of the cluster's Kubernetes 1.34.2)",
        "az (the Azure CLI) is not on PATH: the node-image uploads run `az storage blob upload --auth-mode login`; "
        "install it and `az login` as the identity `pulumi up` runs as",
    ]


@pytest.mark.parametrize(("minor", "ok"), [("33", True), ("34", True), ("35", True), ("32", False), ("36", False)])
def test_kubectl_within_one_minor_of_the_cluster(bin_dir: Path, minor: str, ok: bool) -> None:
    tool(bin_dir, "kubectl", f"printf '{KUBECTL_JSON % (minor, minor)}\\n'")
    az(bin_dir)
    problems = deployer_problems("1.34.2", encryption_at_host=False)
    assert problems == ([] if ok else [
        f"kubectl is 1.{minor}, more than 1 minor from the cluster's Kubernetes 1.34.2 (the version skew policy "
        "supports kubectl within one minor of the apiserver): install kubectl 1.34"])


def test_az_not_logged_in_and_the_feature_unread_until_it_is(bin_dir: Path) -> None:
    tool(bin_dir, "kubectl", f"printf '{KUBECTL_JSON % ('34', '34')}\\n'")
    az(bin_dir, logged_in=False, feature="NotRegistered")
    assert deployer_problems("1.34.2", encryption_at_host=True) == [
        "az is not logged in (`az account show`: Please run 'az login' to setup account.): `az login`, then "
        "`az account set --subscription <id>`"]


@pytest.mark.parametrize("state", ["NotRegistered", "Registering"])
def test_encryption_at_host_not_registered_is_a_problem_where_a_machine_uses_it(bin_dir: Path, state: str) -> None:
    tool(bin_dir, "kubectl", f"printf '{KUBECTL_JSON % ('34', '34')}\\n'")
    az(bin_dir, feature=state)
    [problem] = deployer_problems("1.34.2", encryption_at_host=True)
    assert problem.startswith(f"the subscription's Microsoft.Compute/EncryptionAtHost feature is {state}")
    assert deployer_problems("1.34.2", encryption_at_host=False) == []


def test_quota_short_of_the_plans_need_is_a_problem_and_enough_is_none(bin_dir: Path) -> None:
    tool(bin_dir, "kubectl", f"printf '{KUBECTL_JSON % ('34', '34')}\\n'")
    az(bin_dir, a100_limit=96)
    need = [("standardNDASv4_A100Family", 192), ("cores", 200)]
    assert deployer_problems("1.34.2", False, location="westus2", quota=need) == [
        "vCPU quota in westus2: standardNDASv4_A100Family has 96 free, the stack's machines take 192: request more "
        "(Azure portal, Quotas) before the run, or a scale set fails half-way through it"]
    az(bin_dir, a100_limit=192)
    assert deployer_problems("1.34.2", False, location="westus2", quota=need) == []


def test_a_documentation_range_as_the_deployers_address_is_a_problem(bin_dir: Path) -> None:
    from ipaddress import IPv4Network

    tool(bin_dir, "kubectl", f"printf '{KUBECTL_JSON % ('34', '34')}\\n'")
    az(bin_dir)
    [problem] = deployer_problems("1.34.2", False, cidrs=[IPv4Network("203.0.113.8/29"), IPv4Network("20.1.2.3/32")])
    assert problem.startswith("deployer.cidrs holds 203.0.113.8/29, a documentation range (RFC 5737)")
    assert deployer_problems("1.34.2", False, cidrs=[IPv4Network("20.1.2.3/32")]) == []


@pytest.mark.parametrize(("sold", "said"), [
    ("none", "Standard_ND96isr_H100_v5 is not offered in westus2 (`az vm list-skus --location westus2 --size "
             "Standard_ND96isr_H100_v5 --all` lists none)"),
    ("restricted", "Standard_ND96isr_H100_v5 exists in westus2 but not for this subscription "
                   "(NotAvailableForSubscription)"),
])
def test_a_size_azure_does_not_offer_here_is_a_problem(bin_dir: Path, sold: str, said: str) -> None:
    tool(bin_dir, "kubectl", f"printf '{KUBECTL_JSON % ('34', '34')}\\n'")
    az(bin_dir, sold=sold)
    [problem] = deployer_problems("1.34.2", False, location="westus2", sizes=["Standard_ND96isr_H100_v5"])
    assert problem.startswith(said), problem
    az(bin_dir, sold="sold")
    assert deployer_problems("1.34.2", False, location="westus2", sizes=["Standard_ND96isr_H100_v5"]) == []


def test_pulumi_up_refuses_with_every_problem_before_anything_is_registered(bin_dir: Path) -> None:
    tool(bin_dir, "kubectl", f"printf '{KUBECTL_JSON % ('31', '31')}\\n'")
    az(bin_dir, feature="Registering")
    with pytest.raises(pulumi.RunError) as refused:
        require_deployer(shared.plan("research-7500"))
    text = str(refused.value)
    assert text.startswith("this machine cannot run the program's own steps; nothing was created:\n  - "
                           "deployer.cidrs holds 198.51.100.0/24, a documentation range (RFC 5737)")
    assert "\n  - kubectl is 1.31, more than 1 minor" in text
    # a new subscription's GPU families are at 0: research-7500's 5,000 ND96asr_v4 take 480,000 vCPUs
    assert "vCPU quota in southcentralus: Standard NDASv4_A100 Family has 0 free, the stack's machines take " \
           "480,000" in text
    assert "EncryptionAtHost feature is Registering" in text  # research-7500's machines use encryption at host
    assert text.endswith('(docs/azure.md, "Before the first run", lists what the deployer needs)')


def test_the_catalogues_family_labels_match_the_usage_apis_names(bin_dir: Path) -> None:
    """The catalogue names ND96asr_v4's family "Standard NDASv4_A100 Family"; `az vm list-usage`
    names it standardNDASv4_A100Family. Granted quota must count (the second trace's finding)."""
    tool(bin_dir, "kubectl", f"printf '{KUBECTL_JSON % ('34', '34')}\\n'")
    az(bin_dir, a100_limit=480_000)
    assert deployer_problems("1.34.2", False, location="southcentralus",
                             quota=[("Standard NDASv4_A100 Family", 480_000)]) == []


def test_zones_and_encryption_at_host_the_sku_does_not_offer_are_problems() -> None:
    from kilonode.azure.deployer import _sku_problems

    sku = {"name": "Standard_ND96isr_H100_v5", "locationInfo": [{"location": "southcentralus", "zones": ["1", "2"]}],
           "restrictions": [{"type": "Zone", "reasonCode": "NotAvailableForSubscription",
                             "restrictionInfo": {"zones": ["2"], "locations": ["southcentralus"]}}],
           "capabilities": [{"name": "EncryptionAtHostSupported", "value": "False"}]}
    problems = _sku_problems("Standard_ND96isr_H100_v5", "southcentralus", [sku], ["1", "2", "3"], True)
    assert problems == [
        "Standard_ND96isr_H100_v5 is not offered to this subscription in zone(s) 2, 3 of southcentralus, where the "
        "plan puts scale sets: ask Azure support, or give the stack other zones",
        "Standard_ND96isr_H100_v5 does not support encryption at host (its EncryptionAtHostSupported capability), "
        "which the plan turns on for it: Azure refuses those VMs"]
    sku["restrictions"], sku["capabilities"] = [], [{"name": "EncryptionAtHostSupported", "value": "True"}]
    sku["locationInfo"] = [{"location": "southcentralus", "zones": ["1", "2", "3"]}]
    assert _sku_problems("Standard_ND96isr_H100_v5", "southcentralus", [sku], ["1", "2", "3"], True) == []
