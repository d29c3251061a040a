"""Every alert fires when it should and only then: the cases of tests/monitoring/alert_cases.py run
through Debian's promtool (`promtool test rules`) on the rules rendered for each case's plan, and a
test that reads the rendered alerts and demands both a firing and a quiet case for each."""

from __future__ import annotations

from pathlib import Path

import pytest

from kilonode.plan import ClusterPlan
from kilonode.render import monitoring
from tests.conftest import StackWriter
from tests.monitoring.alert_cases import (
    CASES,
    Case,
    Coverage,
    Identity,
    apiserver_series,
    case_plan,
    expected,
    identity,
    promtool_test,
)

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

SHIPPED = ["local", "research-2500", "research-7500"]


@pytest.mark.parametrize("item", CASES, ids=[c.id for c in CASES])
def test_promtool_test_rules_passes_the_case(
    promtool: Path, plans: dict[str, ClusterPlan], write_stack: StackWriter, tmp_path: Path, item: Case
) -> None:
    plan = case_plan(item, plans, write_stack)
    series, checks = item.build(plan)
    result = promtool_test(promtool, plan, tmp_path, series, checks)
    assert result.returncode == 0, result.stdout + result.stderr


def coverage(plans: dict[str, ClusterPlan], write_stack: StackWriter, skip: str = "") -> Coverage:
    found = Coverage()
    for case in CASES:
        if skip and case.id.startswith(skip):
            continue
        plan = case_plan(case, plans, write_stack)
        series, checks = case.build(plan)
        found.add(case.id, plan, series, checks)
    return found


def rendered(plans: dict[str, ClusterPlan]) -> set[Identity]:
    return {identity(alert) for stack in SHIPPED for alert in monitoring.alerts(plans[stack])}


def test_every_rendered_alert_has_a_case_that_fires_it_and_one_that_keeps_it_quiet(
    plans: dict[str, ClusterPlan], write_stack: StackWriter
) -> None:
    alerts = rendered(plans)
    # by hand, not from the renderer: what the shipped stacks must alert on at least
    names = {name for name, _, _ in alerts}
    assert {"KilonodeApiserverThrottling", "KilonodeApiserverErrors", "KilonodeEtcdDatabaseNearQuota",
            "KilonodeEtcdNoSpace", "KilonodeCertificateExpiresSoon", "KilonodeGpuNodesUnhealthy"} <= names
    assert len(alerts) >= 24
    assert coverage(plans, write_stack).missing(alerts) == []


def test_an_alert_whose_cases_are_removed_is_reported(plans: dict[str, ClusterPlan], write_stack: StackWriter) -> None:
    # the check can fail: without the etcd leader cases those alerts have neither kind
    gaps = coverage(plans, write_stack, skip="etcd_leader_every").missing(rendered(plans))
    assert "KilonodeEtcdLeaderChanges [warning]: no case where it fires" in gaps
    assert "KilonodeEtcdLeaderChanges [warning]: no case where it stays quiet with its inputs present" in gaps
    assert len(gaps) == 2


def test_a_quiet_check_counts_only_past_the_alerts_for_and_with_its_inputs_present(
    plans: dict[str, ClusterPlan],
) -> None:
    plan = plans["local"]
    throttling = ("KilonodeApiserverThrottling", "warning", ())
    found = Coverage()
    # 9m: the warning (for 10m) could still be pending: proves nothing
    found.add("pending", plan, apiserver_series(100, "429", 0), [("9m", "KilonodeApiserverThrottling", [])])
    # no apiserver series at all: quiet for want of data
    found.add("no-data", plan, [('up{job="x"}', "1x40")], [("30m", "KilonodeApiserverThrottling", [])])
    assert throttling not in found.quiet
    found.add("real", plan, apiserver_series(100, "429", 0), [("20m", "KilonodeApiserverThrottling", [])])
    assert found.quiet[throttling] == ["real@20m"]


def test_a_wrong_expectation_fails_promtool_test_rules(
    promtool: Path, plans: dict[str, ClusterPlan], tmp_path: Path
) -> None:
    # the harness itself can fail: healthy traffic expected to page is reported as a failure
    plan = plans["local"]
    result = promtool_test(promtool, plan, tmp_path, apiserver_series(1000, "429", 0), [
        ("30m", "KilonodeApiserverThrottling", [expected(plan, "KilonodeApiserverThrottling",
                                                         {"severity": "critical"})]),
    ])
    assert result.returncode != 0
    assert "KilonodeApiserverThrottling" in result.stdout + result.stderr
