"""The restart guard and replace-on-custom-data: what stops one `pulumi up` from taking an
etcd cluster below quorum, or every apiserver down, and what makes a custom-data change a
replacement that preview shows (Azure cannot change custom data in place)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from kilonode.azure import rollout
from kilonode.azure.graph import Graph, _unwrap, format_json
from kilonode.azure.mockplan import cluster_value, run_program
from kilonode.config import load_stack
from tests.azure.conftest import VM, VMSS
from tests.graphcache import recorded_program

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not


def keys(n: int, prefix: str, **changed: str) -> dict[str, dict[str, str]]:
    return {f"{prefix}-{i}": rollout.restart_key("Standard_D16ds_v5", str(i % 3 + 1), "img", f"d{i}")
            for i in range(n)} | {name: rollout.restart_key("Standard_D16ds_v5", "1", "img", value)
                                  for name, value in changed.items()}


# --- the rule, pure ----------------------------------------------------------------------

def test_a_first_deployment_is_never_refused() -> None:
    assert rollout.disruptions(None, {rollout.ETCD_MAIN: keys(5, "m")}) == []
    assert rollout.disruptions({}, {rollout.ETCD_MAIN: keys(5, "m")}) == []


@pytest.mark.parametrize(("members", "restarted", "refused"), [
    (5, 1, False), (5, 2, False), (5, 3, True), (5, 5, True), (3, 1, False), (3, 2, True), (1, 1, True),
])
def test_etcd_members_restarted_at_once_are_refused_from_a_majority_on(
    members: int, restarted: int, refused: bool
) -> None:
    previous = {rollout.ETCD_MAIN: keys(members, "m")}
    current = {rollout.ETCD_MAIN: keys(members, "m") | {f"m-{i}": rollout.restart_key("Standard_D32ds_v5", "1",
                                                                                       "img", "x")
                                                        for i in range(restarted)}}
    found = rollout.disruptions(previous, current)
    assert [(d.group, len(d.machines)) for d in found] == ([(rollout.ETCD_MAIN, restarted)] if refused else [])


def test_apiservers_are_refused_only_when_every_one_restarts() -> None:
    previous = {rollout.APISERVERS: keys(5, "a")}
    four = keys(5, "a") | {f"a-{i}": rollout.restart_key("big", "1", "img", "x") for i in range(4)}
    five = {f"a-{i}": rollout.restart_key("big", "1", "img", "x") for i in range(5)}
    assert rollout.disruptions(previous, {rollout.APISERVERS: four}) == []
    (found,) = rollout.disruptions(previous, {rollout.APISERVERS: five})
    assert found.machines == ("a-0", "a-1", "a-2", "a-3", "a-4") and found.members == 5


def test_new_members_are_not_restarts_and_acknowledged_groups_pass() -> None:
    previous = {rollout.ETCD_MAIN: keys(3, "m")}
    grown = keys(3, "m") | keys(5, "m")  # m-3 and m-4 are new
    assert rollout.disruptions(previous, {rollout.ETCD_MAIN: grown}) == []
    resized = {name: {**key, "vmSize": "Standard_D32ds_v5"} for name, key in keys(3, "m").items()}
    assert len(rollout.disruptions(previous, {rollout.ETCD_MAIN: resized})) == 1
    assert rollout.disruptions(previous, {rollout.ETCD_MAIN: resized}, frozenset({rollout.ETCD_MAIN})) == []


# --- the program, under mocks with a previous deployment's outputs -----------------------

@pytest.fixture(scope="module")
def deployed(graphs: dict[str, Graph]) -> dict[str, Any]:
    """The `local` stack's outputs as the last `pulumi up` would have left them."""
    return _unwrap(graphs["local"].outputs)


def local_with(**changes: Any) -> dict[str, Any]:
    raw = copy.deepcopy(cluster_value(load_stack("local")))
    for path, value in changes.items():
        *parents, leaf = path.split("__")
        node = raw
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return raw


def test_the_restart_keys_are_exported_without_secrets(deployed: dict[str, Any], graphs: dict[str, Graph]) -> None:
    restart = deployed[rollout.RESTART_KEYS_OUTPUT]
    assert sorted(restart) == ["apiservers", "etcd-events", "etcd-main"]
    assert sorted(restart["etcd-main"]) == ["local-etcd-main-0", "local-etcd-main-1", "local-etcd-main-2"]
    key = restart["etcd-main"]["local-etcd-main-0"]
    assert key["vmSize"] == "Standard_D4ds_v5" and key["image"] == "etcd@1.0.0"
    assert {k["image"] for k in restart["apiservers"].values()} == {"control-plane@1.0.0"}
    assert key["customDataDigest"].startswith("sha256:") and len(key["customDataDigest"]) == 7 + 64
    # Shown in `kilonode plan` (a reviewer sees which host's custom data changes), not masked.
    shown = json.loads(format_json(graphs["local"]))["outputs"][rollout.RESTART_KEYS_OUTPUT]
    assert shown == restart


def test_resizing_every_etcd_member_in_one_update_is_refused_naming_them(deployed: dict[str, Any]) -> None:
    raw = local_with(etcd__main__vmSize="Standard_D8ds_v5")
    with pytest.raises(Exception, match=r"would restart or replace 3 of 3 etcd-main machines at once "
                                        r"\(local-etcd-main-0, local-etcd-main-1, local-etcd-main-2\): etcd with "
                                        r"3 members tolerates 1 down"):
        run_program("local", raw, None, deployed)


def test_the_acknowledgement_lets_the_same_change_through(deployed: dict[str, Any]) -> None:
    raw = local_with(etcd__main__vmSize="Standard_D8ds_v5", acknowledgeRestart=["etcd-main"])
    graph = recorded_program("local", raw, deployed)
    sizes = {vm.plain()["vmName"]: vm.plain()["hardwareProfile"]["vmSize"] for vm in graph.of_type(VM)}
    assert sizes["local-etcd-main-0"] == "Standard_D8ds_v5" and sizes["local-etcd-events-0"] == "Standard_D4ds_v5"


def test_a_change_to_one_members_custom_data_passes(deployed: dict[str, Any]) -> None:
    # As if the last deployment had held a different custom data for member 1 only (a
    # re-issued certificate, say): this update restarts one of three.
    previous = copy.deepcopy(deployed)
    previous[rollout.RESTART_KEYS_OUTPUT]["etcd-main"]["local-etcd-main-1"]["customDataDigest"] = "sha256:" + "0" * 64
    graph = recorded_program("local", local_with(), previous)
    assert graph.count(VM) == 7


def test_renewing_every_apiservers_certificates_at_once_is_refused(deployed: dict[str, Any]) -> None:
    previous = copy.deepcopy(deployed)
    for key in previous[rollout.RESTART_KEYS_OUTPUT]["apiservers"].values():
        key["customDataDigest"] = "sha256:" + "0" * 64
    with pytest.raises(Exception, match=r"restart or replace 1 of 1 apiservers machines at once"):
        run_program("local", local_with(), None, previous)


def test_changes_outside_the_control_plane_pass(deployed: dict[str, Any]) -> None:
    raw = local_with()
    raw["nodePools"][0]["nodes"] = raw["nodePools"][0]["nodes"] + 1
    graph = recorded_program("local", raw, deployed)
    assert sum(v.plain()["sku"]["capacity"] for v in graph.of_type(VMSS)) == raw["nodePools"][0]["nodes"]


def test_a_new_etcd_image_version_is_refused_as_a_restart_of_every_member(deployed: dict[str, Any]) -> None:
    # A new image is a new OS disk: every member of both clusters would be replaced at once.
    with pytest.raises(Exception, match=r"restart or replace 3 of 3 etcd-(main|events) machines at once"):
        run_program("local", local_with(etcdImage__version="1.0.1"), None, deployed)


def test_a_new_pool_image_or_apiserver_image_leaves_the_etcd_members_alone(deployed: dict[str, Any]) -> None:
    # The pools' image has its own version: rolling it restarts no control-plane machine.
    graph = recorded_program("local", local_with(nodeImage__version="1.1.0"), deployed)
    restart = _unwrap(graph.outputs)[rollout.RESTART_KEYS_OUTPUT]
    assert restart == deployed[rollout.RESTART_KEYS_OUTPUT]
    # The apiservers' image is theirs alone: with one apiserver, a new version is refused as
    # taking every apiserver down, and names no etcd member.
    with pytest.raises(Exception, match=r"1 of 1 apiservers machines") as refused:
        run_program("local", local_with(controlPlaneImage__version="1.0.1"), None, deployed)
    assert "etcd-main" not in str(refused.value) and "etcd-events" not in str(refused.value)


# --- custom data: a replacement, never an in-place update --------------------------------

@pytest.mark.parametrize("stack", ["local", "research-7500"])
def test_a_custom_data_change_replaces_a_control_plane_vm_and_protect_stops_it_on_etcd(
    graphs: dict[str, Graph], stack: str
) -> None:
    vms = graphs[stack].of_type(VM)
    assert vms and all(
        vm.replace_on_changes == ("osProfile.customData", "storageProfile.imageReference") for vm in vms
    )
    assert {vm.protect for vm in vms if "-etcd-" in vm.name} == {True}


def test_no_control_plane_vm_is_touched_before_the_guard_has_read_the_last_deployment(
    graphs: dict[str, Graph],
) -> None:
    # Their custom data waits on the verdict, which waits on the StackReference read: a
    # refused update fails before any etcd or apiserver VM is registered.
    for stack, graph in graphs.items():
        cluster = load_stack(stack).config.name
        assert all(f"{cluster}-last-deployment" in vm.depends_on for vm in graph.of_type(VM)), stack


