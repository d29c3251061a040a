"""The fifth independent trace of `kilonode diff` on research-7500: the findings fixed outside
the rules its helpers built (the deployer moved, a fleet rollout's advice)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from kilonode.review import network
from kilonode.review.compare import compare_stack
from kilonode.review.finding import MEDIUM
from tests.review.snapshots import snapshot

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

STACK = "research-7500"


def _deployer(cidrs: list[str]) -> dict[str, Any]:
    head = snapshot(STACK)
    plan = yaml.safe_load(head["files"]["plan.yaml"])
    plan["network"]["deployer"]["cidrs"] = cidrs
    head["files"]["plan.yaml"] = yaml.safe_dump(plan)
    return head


def test_moving_the_deployer_says_who_can_apply_it_and_how_to_move_in_two_steps() -> None:
    [moved] = network.deployer_moved(compare_stack(STACK, snapshot(STACK), _deployer(["203.0.113.7/32"])))
    assert moved.level == MEDIUM and moved.rule == "deployer-moved"
    assert moved.summary.startswith("deployer.cidrs 198.51.100.0/24 -> 203.0.113.7/32")
    assert "a runner in 198.51.100.0/24 no longer reaches the apiservers' port" in moved.summary
    assert "its own in-cluster half times out" in moved.summary and "two changes" in moved.summary


def test_widening_the_deployer_or_leaving_it_is_silent() -> None:
    assert network.deployer_moved(compare_stack(STACK, snapshot(STACK), snapshot(STACK))) == []
    widened = _deployer(["198.51.100.0/24", "203.0.113.7/32"])
    assert network.deployer_moved(compare_stack(STACK, snapshot(STACK), widened)) == []


def test_growing_an_etcd_cluster_by_two_says_the_window_without_tolerance() -> None:
    from kilonode.review import lifecycle

    head = snapshot(STACK)
    [member] = [r for r in head["resources"] if r["type"] == lifecycle.VM
                and (r["inputs"].get("tags") or {}).get("kilonode-role") == "etcd-events"][:1]
    for index in (3, 4):
        vm_name = str(member["inputs"].get("vmName")).replace("-0", f"-{index}")
        added = {**member, "name": member["name"].replace("-0", f"-{index}"),
                 "inputs": {**member["inputs"], "vmName": vm_name}}
        head["resources"].append(added)
    [grown] = lifecycle.etcd_growth(compare_stack(STACK, snapshot(STACK), head))
    assert grown.level == MEDIUM and grown.rule == "etcd-grown"
    assert grown.summary.startswith("etcd-events grows from 3 to 5 members")
    assert "quorum 3, and 3 started: it tolerates no failure meanwhile" in grown.summary
    assert "one member per change" in grown.summary
    assert lifecycle.etcd_growth(compare_stack(STACK, snapshot(STACK), snapshot(STACK))) == []


def test_arming_teardown_is_high_and_says_what_destroy_keeps() -> None:
    from kilonode.review import lifecycle

    head = snapshot(STACK)
    plan = yaml.safe_load(head["files"]["plan.yaml"])
    plan["teardown"] = True
    head["files"]["plan.yaml"] = yaml.safe_dump(plan)
    [armed] = lifecycle.teardown(compare_stack(STACK, snapshot(STACK), head))
    assert armed.level == "high" and armed.rule == "teardown-armed"
    assert "--exclude-protected" in armed.summary and "LoadBalancer Services" in armed.summary
    assert len(armed.subjects) == 8  # research-7500's etcd members: 5 main, 3 events
    assert lifecycle.teardown(compare_stack(STACK, head, snapshot(STACK))) == []  # disarming is not this


def test_every_apiserver_replaced_with_the_acknowledgement_is_the_medium_roll_it_means() -> None:
    from kilonode.review.risks import assess
    from tests.review.test_review_trace import _new_custom_data

    head = _new_custom_data(snapshot(STACK), *(f"apiserver-{i}" for i in range(5)))
    plan = yaml.safe_load(head["files"]["plan.yaml"])
    plan["acknowledgeRestart"] = ["apiservers"]
    head["files"]["plan.yaml"] = yaml.safe_dump(plan)
    found = {r.rule: r for r in assess(compare_stack(STACK, snapshot(STACK), head), {})}
    assert "apiservers-all" not in found
    rolled = found["apiservers-rolled"]
    assert rolled.level == MEDIUM and "one at a time" in rolled.summary
    assert "cannot tell a targeted run from a plain one" in rolled.summary


def test_a_replaced_apiserver_says_its_audit_log_goes_with_its_disk() -> None:
    from kilonode.review.risks import assess
    from tests.review.test_review_trace import _new_custom_data

    head = _new_custom_data(snapshot(STACK), "apiserver-0")
    [api] = [r for r in assess(compare_stack(STACK, snapshot(STACK), head), {}) if r.rule == "apiservers-restarted"]
    assert "1 of them replaced: each one's audit log goes with its local disk" in api.summary
