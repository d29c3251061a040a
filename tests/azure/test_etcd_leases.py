"""The Pulumi program with the optional leases cluster (the `local` stack plus etcd.leases, the
golden variant local-leases): its members are etcd VMs like the others, protected, in the etcd
subnet at their own addresses, in the restart guard and the stack outputs, and the policy
pack's rules hold."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from kilonode.azure import rollout
from kilonode.azure.graph import Graph, _unwrap
from kilonode.azure.mockplan import cluster_value, run_program
from kilonode.review import rules
from tests.azure.conftest import NIC, VM, covers_port, nsg_rules_for, sources, subnets_by_id
from tests.golden.update import variant_stack
from tests.graphcache import recorded

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

LEASES_VMS = [f"local-etcd-leases-{i}" for i in range(3)]


@pytest.fixture(scope="module")
def stack_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return variant_stack("local-leases", tmp_path_factory.mktemp("stacks")).file


@pytest.fixture(scope="module")
def graph(stack_file: Path) -> Graph:
    from kilonode.config import load_stack

    return recorded(load_stack(str(stack_file)))


def test_the_leases_members_are_protected_etcd_vms_in_the_etcd_subnet(graph: Graph) -> None:
    vms = {r.name: r for r in graph.of_type(VM) if r.inputs["tags"]["kilonode-role"] == "etcd-leases"}
    assert sorted(vms) == LEASES_VMS
    assert all(vm.protect for vm in vms.values())
    assert {vm.inputs["tags"]["kilonode-etcd-quota-bytes"] for vm in vms.values()} == {"8589934592"}
    assert [vm.inputs["zones"] for vm in vms.values()] == [["1"], ["2"], ["3"]]
    subnets = subnets_by_id(graph)
    nics = {r.name: r for r in graph.of_type(NIC)}
    for name in LEASES_VMS:
        [config] = nics[f"{name}-nic"].inputs["ipConfigurations"]
        assert subnets[config["subnet"]["id"]][0] == "etcd"
        assert config["privateIPAllocationMethod"] == "Static"
    assert [nics[f"{n}-nic"].inputs["ipConfigurations"][0]["privateIPAddress"] for n in LEASES_VMS] == [
        "10.0.1.30", "10.0.1.31", "10.0.1.32"]
    # the leases cluster's own snapshot identity, as each etcd cluster's members have theirs
    identities = {vm.inputs["tags"]["kilonode-role"]: str(vm.inputs["identity"]["userAssignedIdentities"])
                  for vm in graph.of_type(VM) if vm.inputs["tags"]["kilonode-role"].startswith("etcd-")}
    assert identities["etcd-leases"] == str([
        "mock:azure-native:managedidentity:UserAssignedIdentity::local-etcd-backup-leases-identity"])
    assert len(set(identities.values())) == len(identities) == 3


def test_the_policy_packs_rules_hold_and_know_the_leases_group(graph: Graph) -> None:
    resources = [rules.Resource(r.type, r.name, _unwrap(r.inputs), r.protect) for r in graph.resources if r.custom]
    assert rules.violations(resources) == {}
    assert [r.name for r in rules.etcd_members(resources)["etcd-leases"]] == LEASES_VMS
    unprotected = [rules.Resource(r.type, r.name, r.props, r.name != LEASES_VMS[0] and r.protect) for r in resources]
    assert rules.violations(unprotected)["etcd-protected"][0].startswith(f"{LEASES_VMS[0]}: etcd VM without")


def test_the_outputs_name_the_leases_cluster_and_its_restart_keys(graph: Graph) -> None:
    outputs = _unwrap(graph.outputs)
    assert outputs["etcdLeasesEndpoints"] == ["https://10.0.1.30:2379", "https://10.0.1.31:2379",
                                              "https://10.0.1.32:2379"]
    assert outputs["etcdEventsEndpoints"] == ["https://10.0.1.20:2379", "https://10.0.1.21:2379",
                                              "https://10.0.1.22:2379"]
    restart = outputs[rollout.RESTART_KEYS_OUTPUT]
    assert sorted(restart) == ["apiservers", "etcd-events", "etcd-leases", "etcd-main"]
    assert sorted(restart["etcd-leases"]) == LEASES_VMS
    # each member's SSH role is its own
    keys = {vm.plain()["osProfile"]["linuxConfiguration"]["ssh"]["publicKeys"][0]["keyData"]
            for vm in graph.of_type(VM) if vm.name in LEASES_VMS}
    assert len(keys) == 1 and "etcd-leases" in keys.pop()


def test_the_restart_guard_refuses_two_of_three_leases_members_at_once(graph: Graph, stack_file: Path) -> None:
    from kilonode.config import load_stack

    previous: dict[str, Any] = copy.deepcopy(_unwrap(graph.outputs))
    for name in LEASES_VMS[:2]:
        previous[rollout.RESTART_KEYS_OUTPUT]["etcd-leases"][name]["customDataDigest"] = "sha256:" + "0" * 64
    stack = load_stack(str(stack_file))
    with pytest.raises(Exception, match=r"would restart or replace 2 of 3 etcd-leases machines at once"):
        run_program(stack.name, cluster_value(stack), None, previous)


def test_the_apiservers_reach_the_leases_members_through_the_etcd_subnets_rules(graph: Graph) -> None:
    # the leases members sit in the etcd subnet: its rules (client port from the control plane and
    # itself, peer port from itself) are the ones every etcd member has; no rule names a member's address
    subnets = subnets_by_id(graph)
    leases = [graph.named(f"{name}-nic").inputs["ipConfigurations"][0]["subnet"]["id"] for name in LEASES_VMS]
    assert {subnets[s][0] for s in leases} == {"etcd"}
    control_plane = str(next(prefix for name, prefix in subnets.values() if name == "control-plane"))
    client = [r for r in nsg_rules_for(graph, "etcd") if r["access"] == "Allow" and covers_port(r, 2379)]
    etcd = str(next(prefix for name, prefix in subnets.values() if name == "etcd"))
    assert [sources(r) for r in client] == [[control_plane], [etcd]]  # the apiservers; rejoining peers
