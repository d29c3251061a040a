"""alert-grouping-off: an Alertmanager route that stops grouping by alert name (trace 17, PR 2), on the
shipped stack changed in memory, with harmless variants that stay quiet."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from kilonode.review.compare import compare_stack
from tests.review.snapshots import snapshot

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

STACK = "research-7500"
CONFIG_MAP = "kubernetes:core/v1:ConfigMap"


def _with_config(change: Any) -> dict[str, Any]:
    """The shipped stack's snapshot with its alertmanager.yml changed by `change(config)`."""
    head = snapshot(STACK)
    [(inputs, key)] = [(r["inputs"], k) for r in head["resources"] if r["type"] == CONFIG_MAP
                       for k, v in (r["inputs"].get("data") or {}).items()
                       if isinstance(v, str) and "receivers:" in v and "route:" in v]
    config = yaml.safe_load(inputs["data"][key])
    change(config)
    inputs["data"][key] = yaml.safe_dump(config, sort_keys=False)
    return head


def _with_route(change: Any) -> dict[str, Any]:
    return _with_config(lambda config: change(config["route"]))


def _lines(head: dict[str, Any]) -> list[Any]:
    from kilonode.review import risks
    return [r for r in risks.assess(compare_stack(STACK, snapshot(STACK), head), {}) if r.rule == "alert-grouping-off"]


def test_grouping_by_every_label_names_the_per_instance_alerts_and_that_nothing_is_sent_today() -> None:
    [line] = _lines(_with_route(lambda route: route.update(group_by=["..."])))
    assert line.level == "medium"
    assert "each firing instance is a notification of its own" in line.summary
    assert "KilonodeGpuXidError" in line.summary or "more" in line.summary
    # research-7500 pages through PagerDuty
    assert "the stack's receivers get each of these as it fires" in line.summary


def test_a_child_route_without_alertname_is_named() -> None:
    def change(route: dict[str, Any]) -> None:
        [critical] = [r for r in route["routes"] if r["matchers"] == ['severity="critical"']]
        critical["group_by"] = ["cluster"]
    [line] = _lines(_with_route(change))
    assert "without alertname" in line.summary and "route severity" in line.summary


def test_a_route_for_one_alert_name_may_group_without_it() -> None:
    # the watchdog's route matches one alertname: every alert it takes has that name already
    def change(route: dict[str, Any]) -> None:
        [heartbeat] = [r for r in route["routes"] if r["matchers"] == ['alertname="KilonodeWatchdog"']]
        heartbeat["group_by"] = ["cluster"]
    assert _lines(_with_route(change)) == []


def test_grouping_by_more_labels_with_alertname_or_a_timer_change_says_nothing() -> None:
    assert _lines(_with_route(lambda route: route.update(group_by=["cluster", "alertname", "pool"]))) == []
    assert _lines(_with_route(lambda route: route.update(group_wait="1m"))) == []


# --- alert-inhibition-widened (trace 19, P02) ---------------------------------------------------------------------
def _with_inhibit(change: Any) -> dict[str, Any]:
    return _with_config(lambda config: change(config["inhibit_rules"]))


def _inhibit(head: dict[str, Any]) -> list[Any]:
    from kilonode.review import risks
    return [r for r in risks.assess(compare_stack(STACK, snapshot(STACK), head), {})
            if r.rule == "alert-inhibition-widened"]


def test_an_inhibit_rule_equal_on_cluster_alone_mutes_every_warning_while_any_critical_fires() -> None:
    [line] = _inhibit(_with_inhibit(lambda rules: rules[0].update(equal=["cluster"])))
    assert line.level == "high"
    assert "equal ['cluster', 'alertname'" in line.summary and "-> ['cluster']" in line.summary
    assert "KilonodeGpuXidError" in line.summary or "more" in line.summary
    assert "Inhibitor.Mutes" in line.summary and "the stack's receivers stop getting them" in line.summary


def test_a_new_inhibit_rule_is_said_and_a_narrower_one_is_not() -> None:
    def add(rules: list[Any]) -> None:
        rules.append({"source_matchers": ['alertname="KilonodeEtcdNoSpace"'], "target_matchers": ['severity="warning"'],
                      "equal": ["cluster"]})
    [line] = _inhibit(_with_inhibit(add))
    assert line.level == "medium" and "a new inhibit rule" in line.summary
    # more labels to be equal: mutes less
    assert _inhibit(_with_inhibit(lambda rules: rules[0]["equal"].append("node"))) == []
    # a rule whose targets are none of the head's alerts
    def none(rules: list[Any]) -> None:
        rules.append({"source_matchers": ['severity="critical"'], "target_matchers": ['team="nobody"'],
                      "equal": []})
    assert _inhibit(_with_inhibit(none)) == []


# --- alert-page-rerouted (trace 20, P08) --------------------------------------------------------------------------
def _rerouted(head: dict[str, Any]) -> list[Any]:
    from kilonode.review import risks
    return [r for r in risks.assess(compare_stack(STACK, snapshot(STACK), head), {}) if r.rule == "alert-page-rerouted"]


def _gpu_team_route(first: bool, **extra: Any) -> Any:
    def change(config_route: dict[str, Any]) -> None:
        route = {"receiver": "gpu-infra", "matchers": ['pool=~"a100-ib|h100-ib"'], **extra}
        config_route["routes"].insert(0 if first else len(config_route["routes"]), route)
    return change


def _with_receiver(change: Any) -> dict[str, Any]:
    def both(config: dict[str, Any]) -> None:
        change(config["route"])
        config["receivers"].append({"name": "gpu-infra", "webhook_configs": [{"url": "https://gpu.example.com/hook"}]})
    return _with_config(both)


def test_a_pool_route_before_the_pager_takes_the_pool_pages_away() -> None:
    [line] = _rerouted(_with_receiver(_gpu_team_route(first=True)))
    assert line.level == "high" and "'gpu-infra'" in line.summary and "no pagerduty integration" in line.summary
    assert "KilonodeGpuPoolDegraded" in line.summary
    # an alert whose expression aggregates the pool away (by cluster role, instance) is not said
    assert "KilonodeEtcdNoSpace" not in line.summary
    assert "Route.Match" in line.summary and "continue: true" in line.summary


def test_the_same_route_after_the_pager_or_with_continue_is_quiet() -> None:
    assert _rerouted(_with_receiver(_gpu_team_route(first=False))) == []
    assert _rerouted(_with_receiver(_gpu_team_route(first=True, **{"continue": True}))) == []
