"""What an eighth independent trace of `kilonode diff` found reported as "No risk found" on research-7500 (part a):
the cluster autoscaler's `--max-total-unready-percentage` raised from kilonode's 10 to upstream's 45, the guard
docs/in-cluster.md credits to the 2,500-node lessons; and, so that no autoscaler flag goes unsaid, a change to a
flag the review does not judge. Each on the stack's recorded snapshot changed by hand as the pull request changes
the rendered Deployment kube-system/cluster-autoscaler."""

from __future__ import annotations

from typing import Any

import pytest

from kilonode.review import autoscaler
from kilonode.review.compare import compare_stack
from kilonode.review.finding import HIGH, MEDIUM, Finding
from kilonode.review.risks import Risk, assess
from tests.review.snapshots import pod_spec, snapshot

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

STACK = "research-7500"
GUARD, CHANGED = "autoscaler-unready-guard-weakened", "autoscaler-flag-changed"


def risks(head: dict[str, Any]) -> list[Risk]:
    return assess(compare_stack(STACK, snapshot(STACK), head), {})


def rule(found: list[Risk], name: str) -> list[Risk]:
    return [r for r in found if r.rule == name]


def _args(entry: dict[str, Any], **flags: str | None) -> None:
    """Each flag named set to its value, or removed where the value is None."""
    container = pod_spec(entry, "Deployment", "cluster-autoscaler")["containers"][0]
    args = [a for a in container["args"] if a.split("=", 1)[0][2:] not in flags]
    container["args"] = args + [f"--{k}={v}" for k, v in flags.items() if v is not None]


def findings(base: dict[str, Any] | None = None, **flags: str | None) -> list[Finding]:
    head = snapshot(STACK)
    _args(head, **flags)
    return autoscaler.assess(compare_stack(STACK, base or snapshot(STACK), head))


def test_an_unchanged_stack_says_none_of_the_new_rules() -> None:
    found = risks(snapshot(STACK))
    assert not rule(found, GUARD) and not rule(found, CHANGED)


def test_the_unready_percentage_raised_to_upstreams_45_is_high_on_h100_ib() -> None:
    head = snapshot(STACK)
    _args(head, **{"max-total-unready-percentage": "45"})
    found = risks(head)
    [weakened] = rule(found, GUARD)
    assert weakened.level == HIGH and weakened.subjects == ("pool h100-ib",)
    assert "--max-total-unready-percentage 10% -> 45%" in weakened.summary
    # IsClusterHealthy: halted only past both bounds, over the plan's 5,000 + 2,500 + 3 + 1 nodes
    assert "of the plan's 7,504 nodes, up to 3,376 may be unready and it still scales up and down, was 750" \
        in weakened.summary
    assert "pool h100-ib: up to 1,250 of its 2,500 nodes (down to its floor of 1,250)" in weakened.summary
    assert "clusterstate.go IsClusterHealthy" in weakened.summary and "nodes.go" in weakened.summary
    assert "--scale-down-unready-time (20m;" in weakened.summary
    assert "Keep --max-total-unready-percentage at kilonode's 10" in weakened.summary
    assert not rule(found, CHANGED) and not rule(found, "autoscaler-scale-down-raised")


def test_the_percentage_removed_is_judged_at_upstreams_default() -> None:
    [weakened] = findings(**{"max-total-unready-percentage": None})
    assert weakened.rule == GUARD and weakened.level == HIGH
    assert "10% -> 45% (removed: upstream's default)" in weakened.summary


@pytest.mark.parametrize("flags", [
    {"max-total-unready-percentage": "5"},  # lowered: halts sooner
    {"ok-total-unready-count": "1"},
    {"scale-down-unready-time": "1h"},  # longer: unready nodes kept longer
    {"scale-down-unready-enabled": "false"},  # no unready node removed at all
])
def test_a_stronger_guard_says_nothing(flags: dict[str, str]) -> None:
    assert findings(**flags) == []


@pytest.mark.parametrize(("flags", "said"), [
    ({"ok-total-unready-count": "1000"}, "up to 1,000 may be unready and it still scales up and down, was 750"),
    ({"scale-down-unready-time": "5m"}, "--scale-down-unready-time 20m -> 5m: an unready candidate is deleted sooner"),
])
def test_other_weakenings_that_reach_gpu_nodes_are_high(flags: dict[str, str], said: str) -> None:
    [weakened] = findings(**flags)
    assert weakened.rule == GUARD and weakened.level == HIGH and weakened.subjects == ("pool h100-ib",)
    assert said in weakened.summary


def test_a_raised_count_the_percentage_still_outweighs_is_medium() -> None:
    [weakened] = findings(**{"ok-total-unready-count": "100"})
    assert weakened.rule == GUARD and weakened.level == MEDIUM
    assert "at the plan's 7,504 nodes it still halts past 750 unready" in weakened.summary


def test_unready_nodes_let_back_into_scale_down_is_high() -> None:
    base = snapshot(STACK)
    _args(base, **{"scale-down-unready-enabled": "false"})
    for flags in ({"scale-down-unready-enabled": "true"}, {"scale-down-unready-enabled": None}):
        [weakened] = findings(base, **flags)
        assert weakened.rule == GUARD and weakened.level == HIGH
        assert "--scale-down-unready-enabled false -> true" in weakened.summary


def test_a_flag_no_rule_judges_is_said_with_its_values() -> None:
    [changed] = findings(**{"max-drain-parallelism": "10"})
    assert changed.rule == CHANGED and changed.level == MEDIUM
    assert changed.subjects == ("Deployment kube-system/cluster-autoscaler",)
    assert changed.summary.startswith(
        "a cluster-autoscaler flag the review does not model changed: --max-drain-parallelism 1 -> 10; check it "
        "against the FAQ")


def test_a_repeated_flag_is_compared_whole() -> None:
    values = autoscaler.flag_values(snapshot(STACK))
    assert values is not None and values["startup-taint"] == ("kilonode.io/gpu-health", "kilonode.io/gpu-unhealthy")
    [changed] = findings(**{"startup-taint": None})
    assert "--startup-taint kilonode.io/gpu-health,kilonode.io/gpu-unhealthy -> (unset)" in changed.summary


def test_flags_set_from_the_plan_are_said_only_where_the_plan_did_not_move() -> None:
    [changed] = findings(**{"cores-total": "0:1000"})
    assert "--cores-total 0:720064 -> 0:1000" in changed.summary
    head = snapshot(STACK)
    _args(head, **{"cores-total": "0:1000"})
    head["files"]["plan.yaml"] += "\n# the pools moved\n"
    assert autoscaler.assess(compare_stack(STACK, snapshot(STACK), head)) == []
