"""What a ninth independent trace of `kilonode diff` found misjudged on research-7500 (part b), each on the stack's
recorded snapshot changed by hand as the pull request changes it: the cluster autoscaler's
`--max-node-provision-time` and `--scale-down-delay-after-add` cut from 30m to 10m (said only as a flag changed), and
the gang scheduler's Coscheduling `permitWaitingTimeSeconds` cut from 300 to 30 ("No risk found")."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import yaml

from kilonode.plan.defaults.node import NODE_READY_MIN
from kilonode.review import autoscaler, gang_scheduler
from kilonode.review.compare import compare_stack
from kilonode.review.finding import HIGH, MEDIUM, Finding
from kilonode.review.risks import Risk, assess
from tests.review.snapshots import pod_spec, snapshot

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

STACK = "research-7500"
PROVISION, DELAY = autoscaler.PROVISION_RULE, autoscaler.DELAY_RULE
PERMIT, GANG_CHANGED = gang_scheduler.RULE, gang_scheduler.CHANGED_RULE
NEW_RULES = (PROVISION, DELAY, PERMIT, GANG_CHANGED)


def risks(head: dict[str, Any], stack: str = STACK) -> list[Risk]:
    return assess(compare_stack(stack, snapshot(stack), head), {})


def rule(found: list[Risk], name: str) -> list[Risk]:
    return [r for r in found if r.rule == name]


@pytest.mark.parametrize("stack", ["research-7500", "research-2500"])
def test_a_shipped_stack_unchanged_says_none_of_the_new_rules(stack: str) -> None:
    found = risks(snapshot(stack), stack)
    for name in NEW_RULES:
        assert not rule(found, name)


# --- 1. the cluster autoscaler's window for a new node -------------------------------------------------------------


def _args(entry: dict[str, Any], **flags: str | None) -> None:
    """Each flag named set to its value, or removed where the value is None."""
    container = pod_spec(entry, "Deployment", "cluster-autoscaler")["containers"][0]
    args = [a for a in container["args"] if a.split("=", 1)[0][2:] not in flags]
    container["args"] = args + [f"--{k}={v}" for k, v in flags.items() if v is not None]


def _autoscaler(**flags: str | None) -> list[Finding]:
    head = snapshot(STACK)
    _args(head, **flags)
    return autoscaler.assess(compare_stack(STACK, snapshot(STACK), head))


def test_the_shipped_window_is_node_ready_min() -> None:
    container = pod_spec(snapshot(STACK), "Deployment", "cluster-autoscaler")["containers"][0]
    assert f"--max-node-provision-time={NODE_READY_MIN}m" in container["args"]
    assert f"--scale-down-delay-after-add={NODE_READY_MIN}m" in container["args"]


def test_the_traced_change_is_high_and_medium_and_no_longer_a_generic_flag() -> None:
    head = snapshot(STACK)
    _args(head, **{"max-node-provision-time": "10m", "scale-down-delay-after-add": "10m"})
    found = risks(head)
    [provision] = rule(found, PROVISION)
    assert provision.level == HIGH and provision.subjects == ("pool h100-ib",)
    assert "--max-node-provision-time 30m -> 10m" in provision.summary
    assert f"NODE_READY_MIN ({NODE_READY_MIN} min" in provision.summary
    assert "removeOldUnregisteredNodes" in provision.summary and "updateScaleRequests" in provision.summary
    assert "pool h100-ib (25 node group(s), 1,250 to 2,500 nodes)" in provision.summary
    assert "deletes and retries in a loop" in provision.summary
    [delay] = rule(found, DELAY)
    assert delay.level == MEDIUM and delay.subjects == ("pool h100-ib",)
    assert "--scale-down-delay-after-add 30m -> 10m" in delay.summary
    assert "isScaleDownInCooldown" in delay.summary
    assert "removed before the gang lands" in delay.summary
    assert not rule(found, "autoscaler-flag-changed")


def test_the_provision_time_removed_is_judged_at_upstreams_15m() -> None:
    [provision] = [f for f in _autoscaler(**{"max-node-provision-time": None}) if f.rule == PROVISION]
    assert provision.level == HIGH and "30m -> 15m (removed: upstream's default)" in provision.summary


def test_the_provision_time_lowered_but_still_covering_a_node_is_medium() -> None:
    head = snapshot(STACK)
    _args(head, **{"max-node-provision-time": "1h"})
    base = head
    head = snapshot(STACK)
    _args(head, **{"max-node-provision-time": "45m"})
    [provision] = autoscaler.assess(compare_stack(STACK, base, head))
    assert provision.rule == PROVISION and provision.level == MEDIUM
    assert "still at or above kilonode's NODE_READY_MIN" in provision.summary


@pytest.mark.parametrize("flags", [
    {"max-node-provision-time": "45m"},
    {"scale-down-delay-after-add": "1h"},
    {"max-node-provision-time": "1h", "scale-down-delay-after-add": "1h"},
])
def test_raising_the_window_is_not_high(flags: dict[str, str]) -> None:
    found = _autoscaler(**flags)
    assert found and all(f.level == MEDIUM for f in found)
    assert {f.rule for f in found} <= {PROVISION, DELAY}
    assert all("Raised" in f.summary for f in found)


def test_the_delay_alone_lowered_is_medium_with_its_meaning() -> None:
    [delay] = _autoscaler(**{"scale-down-delay-after-add": "5m"})
    assert delay.rule == DELAY and delay.level == MEDIUM
    assert f"before kilonode's NODE_READY_MIN ({NODE_READY_MIN} min" in delay.summary
    assert "Coscheduling holds its pods at Permit" in delay.summary


def test_a_flag_no_rule_judges_still_falls_to_the_generic_line() -> None:
    [changed] = _autoscaler(**{"scan-interval": "30s"})
    assert changed.rule == "autoscaler-flag-changed" and "--scan-interval" in changed.summary


# --- 2. the gang scheduler's Permit wait ---------------------------------------------------------------------------


def _gang(entry: dict[str, Any], change: Callable[[dict[str, Any]], None]) -> None:
    [config_map] = [r["inputs"] for r in entry["resources"] if r["type"] == gang_scheduler.CONFIG_MAP
                    and r["inputs"]["metadata"]["name"] == gang_scheduler.NAME]
    config = yaml.safe_load(config_map["data"][gang_scheduler.CONFIG_FILE])
    change(config)
    config_map["data"][gang_scheduler.CONFIG_FILE] = yaml.safe_dump(config)


def _coscheduling(config: dict[str, Any]) -> dict[str, Any]:
    [args] = [c["args"] for p in config["profiles"] for c in p["pluginConfig"] if c["name"] == "Coscheduling"]
    found: dict[str, Any] = args
    return found


def _permit(seconds: int) -> Callable[[dict[str, Any]], None]:
    return lambda config: _coscheduling(config).update(permitWaitingTimeSeconds=seconds)


def test_the_shipped_wait_is_what_the_largest_gang_needs() -> None:
    entry = snapshot(STACK)
    assert (gang_scheduler.coscheduling_args(gang_scheduler.config(entry)) or {})["permitWaitingTimeSeconds"] == 300
    # 5,000 a100-ib + 2,500 h100-ib GPU nodes (at its autoscaling ceiling), one pod each, at 25 pods/s
    assert gang_scheduler.largest_gang(entry) == 7500
    assert gang_scheduler.needed_seconds(7500) == 300


def test_the_traced_cut_to_30_seconds_is_high() -> None:
    head = snapshot(STACK)
    _gang(head, _permit(30))
    found = risks(head)
    [lowered] = rule(found, PERMIT)
    assert lowered.level == HIGH and lowered.subjects == ("ConfigMap kube-system/kilonode-gang-scheduler",)
    assert "permitWaitingTimeSeconds 300 -> 30 s, below the 300 s" in lowered.summary
    assert "7,500 pods, one per GPU node, at 25 pods/s" in lowered.summary
    assert "coscheduling.go Permit" in lowered.summary and "GetWaitTimeDuration" in lowered.summary
    assert "a gang of more than 750 pods" in lowered.summary
    assert not rule(found, GANG_CHANGED)  # the one change, said once


def test_the_wait_removed_is_judged_at_upstreams_60() -> None:
    head = snapshot(STACK)
    _gang(head, lambda config: _coscheduling(config).pop("permitWaitingTimeSeconds"))
    [lowered] = [r for r in risks(head) if r.rule == PERMIT]
    assert "300 -> 60 s" in lowered.summary


def test_a_smaller_plan_needs_less() -> None:
    # research-2500's largest gang: 2,500 GPU nodes, 100 s at 25 pods/s
    stack = "research-2500"
    assert gang_scheduler.needed_seconds(gang_scheduler.largest_gang(snapshot(stack))) == 100
    head = snapshot(stack)
    _gang(head, _permit(120))
    found = risks(head, stack)
    assert not rule(found, PERMIT)
    [changed] = rule(found, GANG_CHANGED)
    assert changed.level == MEDIUM and "permitWaitingTimeSeconds 300 -> 120" in changed.summary


@pytest.mark.parametrize("seconds", [600, 1200])
def test_raising_the_wait_is_not_high(seconds: int) -> None:
    head = snapshot(STACK)
    _gang(head, _permit(seconds))
    found = risks(head)
    assert not rule(found, PERMIT)
    [changed] = rule(found, GANG_CHANGED)
    assert changed.level == MEDIUM and f"permitWaitingTimeSeconds 300 -> {seconds}" in changed.summary
    assert ("caps any Permit wait at 900 s" in changed.summary) == (seconds > 900)


@pytest.mark.parametrize(("change", "said"), [
    (lambda c: _coscheduling(c).update(podGroupBackoffSeconds=60),
     "pluginConfig[Coscheduling].args.podGroupBackoffSeconds (unset) -> 60 (how long a PodGroup rejected"),
    (lambda c: c["profiles"][0]["plugins"]["queueSort"].pop("disabled"),
     "plugins.queueSort.disabled[PrioritySort].name PrioritySort -> (unset) (the queue order"),
    (lambda c: c["profiles"][0].update(schedulerName="gang"),
     "profiles[gang].schedulerName (unset) -> gang (the name jobs ask for"),
])
def test_any_other_change_of_the_profile_is_medium_naming_it(change: Callable[[dict[str, Any]], None],
                                                            said: str) -> None:
    head = snapshot(STACK)
    _gang(head, change)
    found = risks(head)
    assert not rule(found, PERMIT)
    [changed] = rule(found, GANG_CHANGED)
    assert changed.level == MEDIUM and said in changed.summary


def _broken(change: Callable[[dict[str, Any]], None]) -> list[Finding]:
    head = snapshot(STACK)
    _gang(head, change)
    return [f for f in gang_scheduler.assess(compare_stack(STACK, snapshot(STACK), head))
            if f.rule == gang_scheduler.BROKEN_RULE]


def test_the_profile_jobs_name_renamed_is_high() -> None:
    [gone] = _broken(lambda c: c["profiles"][0].update(schedulerName="gang"))
    assert gone.level == HIGH and "every new training job stays Pending" in gone.summary


def test_two_queue_sort_plugins_stop_the_scheduler() -> None:
    def enable_priority_sort(config: dict[str, Any]) -> None:
        config["profiles"][0]["plugins"]["queueSort"].pop("disabled")

    [crash] = _broken(enable_priority_sort)
    assert crash.level == HIGH and "Coscheduling, PrioritySort" in crash.summary
    assert "only one queue sort plugin required" in crash.summary
    assert _broken(lambda c: c["profiles"][0]["plugins"]["queueSort"].update(disabled=[{"name": "*"}])) == []
