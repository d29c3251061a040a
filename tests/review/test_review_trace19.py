"""The nineteenth independent trace of `kilonode diff` on research-7500: what its PRs misjudged or said only in
part (P04 the default scheduler back to spreading, P09 a pool's ceiling past the gang wait, P10 podPidsLimit cut near
a training pod's threads; P02, inhibit rules, is in test_review_alert_routing.py), each on the shipped stack changed
in memory (tests.review.snapshots), with a harmless variant beside it that must stay quiet."""

from __future__ import annotations

from typing import Any

import pytest

from kilonode.review.compare import compare_stack
from tests.review.snapshots import snapshot

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

STACK = "research-7500"


def _rules(head: dict[str, Any], rule: str) -> list[Any]:
    from kilonode.review import risks
    return [r for r in risks.assess(compare_stack(STACK, snapshot(STACK), head), {}) if r.rule == rule]


def _edit(head: dict[str, Any], suffix: str, old: str, new: str, prefix: str = "") -> None:
    paths = [p for p in head["files"] if p.endswith(suffix) and p.startswith(prefix)]
    assert paths
    for path in paths:
        assert old in head["files"][path], path
        head["files"][path] = head["files"][path].replace(old, new)


# --- P04: upstream's scoring back on the default profile -------------------------------------------------------
def test_least_allocated_with_balanced_allocation_is_packing_off() -> None:
    head = snapshot(STACK)
    _edit(head, "/kube-scheduler-config.yaml", "type: MostAllocated", "type: LeastAllocated")
    _edit(head, "/kube-scheduler-config.yaml", "      disabled:\n      - name: NodeResourcesBalancedAllocation\n", "")
    [line] = _rules(head, "scheduler-packing-off")
    assert line.level == "high" and "MostAllocated -> LeastAllocated" in line.summary
    assert "NodeResourcesBalancedAllocation scoring again" in line.summary and "h100-ib" in line.summary
    assert len(line.subjects) == 5  # every apiserver host
    # not said again by the generic line
    assert not any("scoringStrategy" in r.summary for r in _rules(head, "scheduler-config-changed"))


def test_packing_kept_with_other_weights_is_not_packing_off() -> None:
    head = snapshot(STACK)
    _edit(head, "/kube-scheduler-config.yaml", "weight: 2", "weight: 3")
    assert _rules(head, "scheduler-packing-off") == []


# --- P09: the autoscaled pool's ceiling past what the gang wait covers ------------------------------------------
def _ceiling(head: dict[str, Any], nodes: int) -> None:
    _edit(head, "plan.yaml", "    maxNodes: 2500\n", f"    maxNodes: {nodes}\n")


def test_a_ceiling_that_outgrows_the_permit_wait_is_said() -> None:
    head = snapshot(STACK)
    _ceiling(head, 3000)
    [line] = _rules(head, "gang-permit-wait-outgrown")
    assert line.level == "medium"
    assert "7,500 -> 8,000 pods" in line.summary and "320 s" in line.summary and "300 s" in line.summary
    assert "scheduleTimeoutSeconds" in line.summary


def test_a_ceiling_that_still_fits_is_not() -> None:
    head = snapshot(STACK)
    _ceiling(head, 2400)
    assert _rules(head, "gang-permit-wait-outgrown") == []


# --- P10: podPidsLimit cut to within a job's threads -------------------------------------------------------------
def test_pod_pids_limit_near_a_training_pods_tasks_is_high_and_says_eagain() -> None:
    head = snapshot(STACK)
    for pool in ("pool-a100-ib", "pool-h100-ib"):  # the GPU pools' (and their teams') kubelets
        _edit(head, "/kubelet-config.yaml", "podPidsLimit: 32768", "podPidsLimit: 4096", pool)
    [line] = _rules(head, "pod-pids-limit-lowered")
    assert line.level == "high"
    assert "32,768 -> 4,096" in line.summary and "3,840 tasks" in line.summary and "EAGAIN" in line.summary
    assert "old nodes and fails on new ones" in line.summary
    assert not any("podPidsLimit" in r.summary for r in _rules(head, "kubelet-config-changed"))


def test_pod_pids_limit_lowered_with_headroom_is_left_to_the_generic_line() -> None:
    head = snapshot(STACK)
    _edit(head, "/kubelet-config.yaml", "podPidsLimit: 32768", "podPidsLimit: 16384")
    assert _rules(head, "pod-pids-limit-lowered") == []
    assert any("podPidsLimit" in r.summary for r in _rules(head, "kubelet-config-changed"))
