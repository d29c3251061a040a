"""The lead's share of the eighth independent trace of `kilonode diff` on research-7500: the system
pool to D8ds_v5 (what only prefers the system pool spills onto GPU nodes), a taint keyed by the GPU
resource's own name (ExtendedResourceToleration's case), and the NAT prefix advice by direction."""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest
import yaml

from kilonode.review import etcd_flags, lifecycle
from kilonode.review.compare import compare_stack
from kilonode.review.finding import MEDIUM
from kilonode.review.nodes import _nat_fix
from tests.review.snapshots import snapshot
from tests.review.test_review_trace2 import STACK, _edit_plan, risks, rule

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not


def test_a_system_pool_too_small_for_what_prefers_it_says_where_the_rest_goes() -> None:
    head = snapshot(STACK)
    _edit_plan(head, "system", vmSize="Standard_D8ds_v5", vcpus=8, memoryGib=32.0)
    spills = [r for r in rule(risks(head), "pool-capacity") if "with what prefers it" in r.summary]
    [spill] = spills
    assert spill.level == MEDIUM and spill.subjects == ("pool-system",)
    assert "Deployment kube-system/metrics-server x2" in spill.summary
    assert "pool-h100-ib (GPU nodes)" in spill.summary


def test_the_shipped_system_pool_holds_what_prefers_it() -> None:
    assert not [r for r in rule(risks(snapshot(STACK)), "pool-capacity") if "with what prefers it" in r.summary]


def test_the_nat_fix_follows_the_direction_of_the_change() -> None:
    grown = _nat_fix(29, 28)
    assert "lower network.minSnatPortsPerNode" in grown and "so /29 still results" in grown
    assert "a second /29 beside this one" in grown and "raise" not in grown
    assert "split the pool" in _nat_fix(28, 27)  # 16 + anything is past a gateway's 16 addresses
    assert "fewer addresses" in _nat_fix(28, 29)


def _gpu_keyed(key: str) -> list[str]:
    head = snapshot(STACK)
    plan = _edit_plan(head, "h100-ib")
    [entry] = [p for p in plan["nodePools"] if p["name"] == "h100-ib"]
    _edit_plan(head, "h100-ib", taints=[*entry["taints"], f"{key}=present:NoSchedule"])
    return [f.summary for f in lifecycle.assess(compare_stack(STACK, snapshot(STACK), head))
            if f.rule == "labels-until-reimaged"]


def test_a_taint_keyed_by_the_gpu_resource_advises_extended_resource_toleration() -> None:
    [said] = _gpu_keyed("nvidia.com/gpu")
    assert "keyed by the GPU resource's own name (nvidia.com/gpu)" in said
    assert "every pod requesting nvidia.com/gpu gets the toleration at admission" in said
    [other] = _gpu_keyed("dedicated")
    assert "ExtendedResourceToleration would not help" in other


def _retention(entry: dict[str, Any], cluster: str, value: str) -> None:
    for path in entry["files"]:
        if path.startswith(f"{cluster}-") and path.endswith(etcd_flags.ETCD_UNIT):
            entry["files"][path] = re.sub(r"--auto-compaction-retention=\S+", f"--auto-compaction-retention={value}",
                                          entry["files"][path])


def test_an_etcd_retention_raised_past_the_apiservers_compaction_keeps_no_more_history() -> None:
    head = snapshot(STACK)
    _retention(head, "etcd-main", "8h")
    [moot] = etcd_flags.assess(compare_stack(STACK, snapshot(STACK), head))
    assert moot.level == MEDIUM and moot.subjects == ("etcd-main",)
    assert "--auto-compaction-retention 1h -> 8h keeps no more history" in moot.summary
    assert "every 5 min" in moot.summary


def test_an_etcd_retention_lowered_or_the_apiservers_compaction_off_is_not_said() -> None:
    head = snapshot(STACK)
    _retention(head, "etcd-main", "1m")
    assert not etcd_flags.assess(compare_stack(STACK, snapshot(STACK), head))
    head = snapshot(STACK)
    _retention(head, "etcd-events", "8h")
    for path in head["files"]:
        if path.endswith(etcd_flags.APISERVER_UNIT):
            head["files"][path] = head["files"][path].replace(
                "--secure-port=", "--etcd-compaction-interval=0 \\\n    --secure-port=")
    assert not etcd_flags.assess(compare_stack(STACK, snapshot(STACK), head))


def test_go_durations_and_etcds_bare_hours_are_read() -> None:
    assert etcd_flags.seconds("1h30m") == 5400 and etcd_flags.seconds("8") == 8 * 3600
    assert etcd_flags.seconds("5m0s") == 300 and etcd_flags.seconds("soon") is None


def test_components_at_the_emulated_minor_are_in_policy_and_a_kubelet_past_it_is_not() -> None:
    from kilonode.review.versions import Side, violations

    held = {"kube-proxy": 34, "cloud-controller-manager": 34, "cluster-autoscaler": 34}
    assert violations(Side(35, 34, 34, held, emulated=34)) == {}
    assert "autoscaler" in violations(Side(35, 34, 34, held))  # the binaries' minor without it
    ahead = violations(Side(35, 35, 34, held, emulated=34))
    assert "kube-apiserver 1.34 (1.35 emulating 1.34)" in ahead["kubelet-newer:new or upgraded nodes"]


def test_a_model_update_of_autoscaled_scale_sets_says_to_pause_the_autoscaler() -> None:
    head = snapshot(STACK)
    for r in head["resources"]:
        if r["type"].endswith(":VirtualMachineScaleSet") and "-h100-ib-" in r["name"]:
            r["inputs"]["virtualMachineProfile"]["osProfile"]["customData"] = "[secret sha256:0000]"
    found = risks(head)
    assert [r for r in rule(found, "fleet-rollout") if "pool-h100-ib" in r.summary]
    # said once, in its own line (independent trace 14: every PUT of an autoscaled model, whatever the rule)
    [put] = rule(found, "autoscaled-model-put")
    assert "25 autoscaled scale set(s)" in put.summary and "--replicas=0" in put.summary
    assert not [s for s in put.subjects if "-a100-ib-" in s]


def test_a_rollback_to_the_kept_version_is_said_as_one_not_as_unchanged_contents() -> None:
    from kilonode.review import images

    base, head = snapshot(STACK), snapshot(STACK)
    plan = yaml.safe_load(base["files"]["plan.yaml"])
    plan["imagePrevious"] = {"h100-ib": "0.9.0"}
    base["files"]["plan.yaml"] = yaml.safe_dump(plan)
    head["imageContents"]["pool-h100-ib"]["version"] = "0.9.0"
    said = images.changes(compare_stack(STACK, base, head))
    assert said["pool-h100-ib"][:2] == ("1.0.0", "0.9.0")
    assert said["pool-h100-ib"][2][0].startswith("a rollback to 0.9.0, the version kept as previous")


def test_the_previous_version_removed_alone_says_to_check_every_rollout_is_done() -> None:
    base, head = snapshot(STACK), snapshot(STACK)
    [current] = [r for r in base["resources"] if r["type"] == lifecycle.GALLERY_IMAGE_VERSION
                 and r["inputs"]["galleryImageName"] == "h100-ib"]
    kept = copy.deepcopy(current)
    kept["name"] = current["name"].replace("1.0.0", "0.9.0")
    kept["inputs"]["galleryImageVersionName"] = "0.9.0"
    base["resources"].append(kept)
    [said] = lifecycle.image_versions(compare_stack(STACK, base, head))
    assert said.rule == "previous-image-removed" and said.level == MEDIUM
    assert "h100-ib 0.9.0" in said.summary and "kilonode rollout status" in said.summary


def test_an_image_records_the_node_programs_it_bakes_so_a_change_to_them_is_unreleased() -> None:
    """Trace 12 W14: the GPU agent's thresholds changed; the alert rules built from them change at
    `pulumi up`, the agents only with a new image: the image's contents must name the file."""
    files = snapshot(STACK)["imageContents"]["pool-h100-ib"]["recipe"]["files"]
    assert "infra/kilonode/node/gpu/thresholds.toml" in files
    system = snapshot(STACK)["imageContents"]["pool-system"]["recipe"]["files"]
    assert "infra/kilonode/node/gpu/thresholds.toml" not in system
