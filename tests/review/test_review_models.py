"""The review's rules that judge a change with preflight's own models and the real checkers,
on research-7500's recorded snapshot changed by hand: each rule's finding, and its silence on
an unchanged stack (so each test can fail)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from kilonode.k8s import gpu as k8s_gpu
from kilonode.k8s import rdma as k8s_rdma
from kilonode.plan.wellknown import TEAM_LABEL
from kilonode.review import alerting, images, lifecycle, network, placement
from kilonode.review.compare import compare_stack
from kilonode.review.decisions import decisions
from kilonode.review.finding import HIGH, MEDIUM, Finding
from kilonode.review.risks import assess
from tests.monitoring.promtool import promtool_path
from tests.review.snapshots import pod_spec, snapshot

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

STACK = "research-7500"
H100_KUBELET = "pool-h100-ib/etc/kubernetes/kubelet-config.yaml"


def placed(head: dict[str, Any]) -> list[Finding]:
    return placement.assess(compare_stack(STACK, snapshot(STACK), head))


def test_an_unchanged_stack_strands_nothing() -> None:
    assert placed(snapshot(STACK)) == []


def test_the_device_plugin_without_the_team_toleration_strands_the_teams_gpus() -> None:
    head = snapshot(STACK)
    spec = pod_spec(head, "DaemonSet", k8s_gpu.DAEMONSET_NAME)
    spec["tolerations"] = [t for t in spec["tolerations"] if t.get("key") != TEAM_LABEL]
    [finding] = placed(head)
    assert finding.level == HIGH and finding.rule == "daemonset-stranded"
    assert f"DaemonSet {k8s_gpu.DAEMONSET_NAME} can no longer run on 4,000 nodes" in finding.summary
    assert "pool-a100-ib.team-language (3,000 nodes" in finding.summary
    assert "pool-a100-ib.team-vision (1,000 nodes" in finding.summary
    assert "offers no nvidia.com/gpu" in finding.summary
    # preflight calls it a break: `pulumi up`'s gate refuses the run; past it, the controller's story
    assert "refuses the whole run" in finding.summary and "deletes the pods" in finding.summary
    assert "NodeShouldRunDaemonPod" in finding.summary


def test_a_taint_added_to_a_pool_strands_every_daemonset_that_does_not_tolerate_it_in_one_line() -> None:
    head = snapshot(STACK)
    head["files"][H100_KUBELET] = head["files"][H100_KUBELET].replace(
        "registerWithTaints:\n", "registerWithTaints:\n- key: dedicated\n  effect: NoSchedule\n  value: training\n")
    stranded = [f for f in placed(head) if f.rule == "daemonset-stranded"]
    [finding] = stranded
    assert finding.summary.startswith("pool-h100-ib: taint dedicated=training:NoSchedule added")
    assert k8s_gpu.DAEMONSET_NAME in finding.summary and k8s_rdma.NAME in finding.summary
    assert "2,500 nodes" in finding.summary and "only when it creates its Node" in finding.summary
    assert "offers no rdma/ib" in finding.summary


def test_a_narrowed_affinity_preflight_does_not_refuse_is_told_as_the_rollout_does_it() -> None:
    head = snapshot(STACK)
    spec = pod_spec(head, "DaemonSet", k8s_gpu.DAEMONSET_NAME)
    spec["affinity"] = k8s_gpu.device_plugin_affinity(["a100-ib"])
    [finding] = placed(head)
    assert "pool-h100-ib (2,500 nodes" in finding.summary
    assert "refuses the whole run" not in finding.summary, "preflight reads a narrowed selector as intended"
    assert "At `pulumi up`, the DaemonSet controller" in finding.summary


MONITORING_KUBELET = "pool-monitoring/etc/kubernetes/kubelet-config.yaml"


def test_a_taint_changed_with_the_tolerations_that_follow_it_is_judged_on_the_running_nodes() -> None:
    """Both sides place Prometheus (the head's taint is tolerated), but the running monitoring nodes keep
    the taint they registered with, which the new template no longer tolerates."""
    head = snapshot(STACK)
    head["files"][MONITORING_KUBELET] = head["files"][MONITORING_KUBELET].replace(
        "  value: monitoring\n", "  value: observability\n", 1)
    pod_spec(head, "StatefulSet", "prometheus")["tolerations"] = [
        {"effect": "NoSchedule", "key": "dedicated", "operator": "Equal", "value": "observability"}]
    found = [f for f in placed(head) if "prometheus" in f.summary]
    [finding] = found
    assert finding.rule == "workload-unplaceable" and finding.level == HIGH
    assert "not the nodes running now (pool-monitoring (1 node running now" in finding.summary
    assert "taint dedicated=observability:NoSchedule added" in finding.summary
    assert "taint dedicated=monitoring:NoSchedule removed" in finding.summary
    assert "both the old and the new" in finding.summary and "kubectl taint nodes" in finding.summary


def test_a_team_taint_renamed_with_the_device_plugin_following_it_strands_the_running_nodes() -> None:
    head = snapshot(STACK)
    for path in list(head["files"]):
        if path.startswith("pool-a100-ib.team-") and path.endswith("kubelet-config.yaml"):
            head["files"][path] = head["files"][path].replace(f"key: {TEAM_LABEL}\n", "key: kilonode.io/owner\n")
    spec = pod_spec(head, "DaemonSet", k8s_gpu.DAEMONSET_NAME)
    for toleration in spec["tolerations"]:
        if toleration["key"] == TEAM_LABEL:
            toleration["key"] = "kilonode.io/owner"
    [finding] = [f for f in placed(head) if k8s_gpu.DAEMONSET_NAME in f.summary]  # one decision, one line
    assert finding.rule == "daemonset-stranded" and finding.level == HIGH
    assert "follows it" in finding.summary and "4,000 running nodes keep" in finding.summary
    assert "pool-a100-ib.team-language (3,000 nodes: taint kilonode.io/team=language:NoSchedule" in finding.summary
    assert "offers no nvidia.com/gpu" in finding.summary and "refuses the whole run" not in finding.summary


@pytest.mark.parametrize("kind,name", [("Deployment", "coredns"), ("StatefulSet", "prometheus")])
def test_a_workload_no_node_admits_any_more_is_high(kind: str, name: str) -> None:
    head = snapshot(STACK)
    pod_spec(head, kind, name)["nodeSelector"] = {"kilonode.io/pool": "nowhere"}
    [finding] = placed(head)
    assert finding.rule == "workload-unplaceable" and finding.level == HIGH
    assert f"{kind} " in finding.summary and "stay Pending" in finding.summary
    assert "once `pulumi up` rolls its new template" in finding.summary


# --- alert rules: promtool at review time --------------------------------------------------------------------------

RULES_KEY = "ConfigMap monitoring/kilonode-prometheus kilonode-rules.yaml"
RECORDING = 'expr: sum by (code) (rate(apiserver_request_total{job="kilonode-apiserver",verb!~"WATCH|CONNECT"}[5m]))'


def _rules(entry: dict[str, Any]) -> dict[str, Any]:
    [data] = [r["inputs"]["data"] for r in entry["resources"] if r["type"] == alerting.CONFIG_MAP
              and r["inputs"]["metadata"]["name"] == "kilonode-prometheus"]
    return data  # type: ignore[no-any-return]


def _edited(old: str, new: str) -> dict[str, Any]:
    head = snapshot(STACK)
    data = _rules(head)
    assert old in data["kilonode-rules.yaml"]
    data["kilonode-rules.yaml"] = data["kilonode-rules.yaml"].replace(old, new, 1)
    return head


@pytest.fixture
def with_promtool(monkeypatch: pytest.MonkeyPatch) -> Path:
    try:
        path = promtool_path()
    except RuntimeError as error:  # `make test` and `make test-fast` unpack it first: never a skip
        pytest.fail(str(error))
    monkeypatch.setenv(alerting.PROMTOOL_ENV, str(path))
    return path


def test_the_rule_files_are_found_by_what_prometheus_loads() -> None:
    assert list(alerting.rule_files(snapshot(STACK))) == [RULES_KEY]


def test_a_rule_promtool_rejects_is_high_and_says_alerting_is_gone(with_promtool: Path) -> None:
    broken = _edited(RECORDING, "expr: sum by (code) (rate(apiserver_request_total[5m])")  # a parenthesis short
    diff = compare_stack(STACK, snapshot(STACK), broken)
    [finding] = alerting.assess(diff)
    assert finding.level == HIGH and finding.rule == "alert-rules-rejected" and finding.subjects == (RULES_KEY,)
    assert "Prometheus rejects the reload" in finding.summary and "at its next start it exits" in finding.summary
    assert "alerting is gone" in finding.summary and "promtool 2." in finding.summary
    assert "rules/manager.go" in finding.summary and diff.notes == []


def test_a_rule_promtool_accepts_is_no_risk(with_promtool: Path) -> None:
    diff = compare_stack(STACK, snapshot(STACK), _edited("[5m]))", "[10m]))"))
    assert alerting.assess(diff) == [] and diff.notes == []


def test_without_promtool_the_change_is_said_not_judged(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(alerting.PROMTOOL_ENV, "/nonexistent/promtool")
    diff = compare_stack(STACK, snapshot(STACK), _edited("[5m]))", "[10m]))"))
    assert alerting.assess(diff) == []
    [note] = diff.notes
    assert RULES_KEY in note and "not checked: no promtool" in note


# --- the node image's contents ----------------------------------------------------------------------------------

DRIVER = "nvidia-open-kernel-dkms"
FABRIC_MANAGER = "nvidia-fabricmanager-535"


def _pin(entry: dict[str, Any], package: str, version: str, pools: tuple[str, ...] = ("pool-a100-ib", "pool-h100-ib"),
         image_version: str | None = None) -> dict[str, Any]:
    for key in pools:
        image = entry["imageContents"][key]
        image["recipe"]["packages"][package] = version
        if image_version:
            image["version"] = image_version
    return entry


def test_a_driver_pin_under_an_unchanged_image_version_is_shown_and_medium() -> None:
    head = _pin(_pin(_pin(snapshot(STACK), DRIVER, "550.163.01-1"), FABRIC_MANAGER, "550.163.01-1"),
                "libnvidia-nscq-535", "550.163.01-1")
    diff = compare_stack(STACK, snapshot(STACK), head)
    assert diff.changed and not diff.files and not diff.resources, "no file, no resource: only the image"
    [line] = images.describe(diff)
    assert line.startswith("image pool-a100-ib, pool-h100-ib (1.0.0, version unchanged)")
    assert f"{DRIVER} 535.261.03-1 -> 550.163.01-1" in line
    [finding] = images.assess(diff)
    assert finding.rule == "image-recipe-unreleased" and finding.level == MEDIUM
    assert "no machine gets it" in finding.summary and "Bump nodeImageVersion" in finding.summary


def test_a_driver_bump_that_leaves_fabric_manager_behind_is_high_on_the_nvswitch_pools() -> None:
    head = _pin(snapshot(STACK), DRIVER, "550.163.01-1")
    [mismatch] = [f for f in images.assess(compare_stack(STACK, snapshot(STACK), head))
                  if f.rule == "gpu-driver-mismatch"]
    assert mismatch.level == HIGH and mismatch.subjects == ("pool-a100-ib", "pool-h100-ib")
    assert f"fabric_manager {FABRIC_MANAGER} 535.261.03-1 is not the driver's release 550.163.01" in mismatch.summary
    assert "pool-h100-ib (2,500 nodes, Standard_ND96isr_H100_v5)" in mismatch.summary
    assert "cudaErrorSystemNotReady" in mismatch.summary and "refuses such an image" in mismatch.summary


def test_an_image_version_bump_names_what_the_fleet_rolls_out() -> None:
    head = snapshot(STACK)
    _pin(head, "nvidia-smi", "535.261.03-2", pools=("pool-h100-ib",))
    for image in head["imageContents"].values():
        if image["version"] == "1.0.0":
            image["version"] = "1.1.0"
    for r in head["resources"]:
        if r["type"] == "azure-native:compute:VirtualMachineScaleSet":
            r["inputs"]["virtualMachineProfile"]["storageProfile"]["imageReference"]["id"] += "-1.1.0"
    rollouts = [r for r in assess(compare_stack(STACK, snapshot(STACK), head), {}) if r.rule == "fleet-rollout"]
    [h100] = [r for r in rollouts if "of pool-h100-ib" in r.summary]
    assert "image 1.0.0 -> 1.1.0 (nvidia-smi 535.261.03-1 -> 535.261.03-2)" in h100.summary
    assert "2,500 nodes" in h100.summary


def test_a_new_vm_size_across_a_pool_is_one_fleet_replacement_with_its_node_count() -> None:
    head = snapshot(STACK)
    for r in head["resources"]:
        if r["type"] == "azure-native:compute:VirtualMachineScaleSet" and "h100-ib" in r["name"]:
            r["inputs"]["sku"]["name"] = "Standard_ND96isr_H200_v5"
    risks = assess(compare_stack(STACK, snapshot(STACK), head), {})
    [resized] = [r for r in risks if r.rule == "pool-resized"]
    assert resized.level == MEDIUM and len(resized.subjects) == 25
    assert "every scale set of pool-h100-ib (25) gets a new VM size" in resized.summary
    assert "Standard_ND96isr_H100_v5 -> Standard_ND96isr_H200_v5: 2,500 nodes" in resized.summary
    assert "local NVMe" in resized.summary and "pool replacement" in resized.summary
    assert not [r for r in risks if r.rule == "fleet-rollout"], "one line for the pool"


# --- NSG rules in evaluation order ------------------------------------------------------------------------------


def _nsg_rules(entry: dict[str, Any]) -> list[dict[str, Any]]:
    return [rule for r in entry["resources"] if r["type"] == "azure-native:network:NetworkSecurityGroup"
            for rule in r["inputs"]["securityRules"]]


def test_unchanged_rules_shadow_nothing_new() -> None:
    assert network.assess(compare_stack(STACK, snapshot(STACK), snapshot(STACK))) == []


def test_a_deny_moved_above_the_allows_is_one_high_line_with_the_calls_it_refuses() -> None:
    head = snapshot(STACK)
    for rule in _nsg_rules(head):
        if rule["name"] == "deny-all-inbound":
            rule["priority"] = 102
    [shadowed] = network.assess(compare_stack(STACK, snapshot(STACK), head))
    assert shadowed.rule == "nsg-shadowed" and shadowed.level == HIGH and len(shadowed.subjects) == 3
    assert shadowed.summary.startswith("rule deny-all-inbound now comes before")
    assert "allow-etcd-peer-from-etcd" in shadowed.summary and "allow-apiserver-probe" in shadowed.summary
    assert "allow-etcd-client-from-apiservers" not in shadowed.summary  # priority 100: still first
    assert "TCP 2380 from etcd-events-0" in shadowed.summary and "refuses the run" in shadowed.summary


def test_a_removed_allow_is_said_by_the_connections_it_refuses() -> None:
    head = snapshot(STACK)
    for r in head["resources"]:
        if r["type"] == "azure-native:network:NetworkSecurityGroup":
            r["inputs"]["securityRules"] = [x for x in r["inputs"]["securityRules"]
                                            if x["name"] != "allow-etcd-client-from-etcd"]
    [refused] = network.assess(compare_stack(STACK, snapshot(STACK), head))
    assert refused.rule == "connection-refused" and refused.level == HIGH
    assert "TCP 2379 from etcd-events-0" in refused.summary and "(rule deny-all-inbound)" in refused.summary


# --- advice per resource kind and lifecycle ----------------------------------------------------------------------


def _resource(entry: dict[str, Any], name: str) -> dict[str, Any]:
    [found] = [r for r in entry["resources"] if r["name"] == f"{STACK}-{name}"]
    return found


def _stops(head: dict[str, Any]) -> list[Finding]:
    return [f for f in lifecycle.assess(compare_stack(STACK, snapshot(STACK), head)) if f.rule == "replace-stops"]


def test_a_replaced_etcd_member_is_told_both_stops_and_how_to_roll_it() -> None:
    head = snapshot(STACK)
    _resource(head, "etcd-main-0")["inputs"]["osProfile"]["customData"] = "[secret sha256:0000]"
    [stop] = _stops(head)
    assert stop.summary.startswith("`pulumi up` stops at etcd-main-0: replacing it (osProfile.customData)")
    # delete-before-replace (kilonode.azure.vm): unprotected, a targeted `pulumi up` replaces it
    assert "Unprotecting is not enough" not in stop.summary and "pulumi destroy" not in stop.summary
    assert stop.summary.index("pulumi state unprotect") \
        < stop.summary.index("`pulumi up --target <urn>` (it is delete-before-replace")
    assert "etcd-join re-add it" in stop.summary


def test_a_replaced_storage_account_is_told_its_blobs_go_not_to_rejoin() -> None:
    head = snapshot(STACK)
    _resource(head, "etcd-backup-account")["inputs"]["location"] = "eastus"
    [stop] = _stops(head)
    assert "etcd-backup-account" in stop.summary and "deleted with every blob in it" in stop.summary
    assert "Nothing rejoins" in stop.summary and "rejoin (" not in stop.summary and "etcd-join" not in stop.summary


def test_new_registration_labels_are_told_to_go_through_kubectl_not_a_reimage() -> None:
    head = snapshot(STACK)
    plan = yaml.safe_load(head["files"]["plan.yaml"])
    [pool] = [p for p in plan["nodePools"] if p["name"] == "h100-ib"]
    pool["labels"] = {**(pool.get("labels") or {}), "example.com/tier": "training"}
    head["files"]["plan.yaml"] = yaml.safe_dump(plan)
    [labels] = [f for f in lifecycle.assess(compare_stack(STACK, snapshot(STACK), head))
                if f.rule == "labels-until-reimaged"]
    assert "a reimage does not help" in labels.summary and "kubectl label nodes" in labels.summary
    assert "tryRegisterWithAPIServer" in labels.summary and "until each is reimaged" not in labels.summary


def test_an_image_version_bump_that_deletes_the_old_version_removes_the_rollback_target() -> None:
    head = snapshot(STACK)
    for r in head["resources"]:
        if r["type"] == lifecycle.GALLERY_IMAGE_VERSION:
            r["name"] = r["name"].replace("-1.0.0", "-1.1.0")
            r["inputs"]["galleryImageVersionName"] = "1.1.0"
        if r["type"] == lifecycle.COMMAND and r["name"].endswith("-vhd"):  # one upload per version
            r["name"] = r["name"].replace("-1.0.0-", "-1.1.0-")
            r["inputs"]["triggers"] = [t.replace("1.0.0", "1.1.0") for t in r["inputs"]["triggers"]]
    [gone] = [f for f in lifecycle.assess(compare_stack(STACK, snapshot(STACK), head))
              if f.rule == "rollback-target-removed"]
    assert gone.level == HIGH and len(gone.subjects) == 6
    assert "deletes the previous image version(s) (1.0.0 of a100-ib, control-plane, etcd" in gone.summary
    assert "6 upload commands deleted or replaced" in gone.summary and "rollback target is gone" in gone.summary


def test_a_driver_bump_left_behind_and_unreleased_is_one_decision_led_by_the_mismatch() -> None:
    head = _pin(snapshot(STACK), DRIVER, "550.163.01-1")
    risks = [r for r in assess(compare_stack(STACK, snapshot(STACK), head), {})]
    assert {r.rule for r in risks} == {"gpu-driver-mismatch", "image-recipe-unreleased"}
    [decision] = decisions(risks)
    assert decision.lead.rule == "gpu-driver-mismatch" and decision.others[0].rule == "image-recipe-unreleased"
    assert "one change, the node-image recipe, 2 findings" in decision.line()
