"""Three changes an independent trace of `kilonode diff` on research-7500 found under-reported (trace 10b), each on
the stack's recorded snapshot changed by hand: `sample_limit: 100000` on the kube-state-metrics job (every scrape of
it fails: the plan's ~1.8M series per scrape), kube-scheduler's `percentageOfNodesToScore: 100` (375 -> 7,504 nodes
scored per pod) and kube-controller-manager `--node-eviction-rate=5` (50x upstream's 0.1 nodes/s per zone)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from kilonode.review import alerting, control_flags
from kilonode.review.compare import compare_stack
from kilonode.review.finding import HIGH, MEDIUM, Finding
from tests.review.snapshots import snapshot

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

STACK = "research-7500"
KSM = "kilonode-kube-state-metrics"


def _set_limit(entry: dict[str, Any], job: str, **limits: Any) -> None:
    """The loaded prometheus.yml's job `job` given `limits` (its fields), in the recorded ConfigMap."""
    [(label, (_, key))] = alerting.prometheus_configs(entry).items()
    for r in entry["resources"]:
        data = (r.get("inputs") or {}).get("data") or {}
        name = (r.get("inputs") or {}).get("metadata", {}).get("name")
        if r["type"].endswith(":ConfigMap") and key in data and label.endswith(f"/{name} {key}"):
            config = yaml.safe_load(data[key])
            [found] = [j for j in config["scrape_configs"] if j["job_name"] == job]
            found.update(limits)
            data[key] = yaml.safe_dump(config, sort_keys=False)
            return
    raise AssertionError("no prometheus.yml")


def _alerting(head: dict[str, Any]) -> list[Finding]:
    return alerting.scrape_limits_below_load(compare_stack(STACK, snapshot(STACK), head))


def test_a_sample_limit_below_kube_state_metrics_load_is_high_and_names_the_blind_alerts() -> None:
    head = snapshot(STACK)
    _set_limit(head, KSM, sample_limit=100_000)
    [line] = _alerting(head)
    assert line.level == HIGH and line.rule == alerting.SCRAPE_LIMIT_RULE
    assert KSM in line.summary and "100,000" in line.summary and "2,176,960" in line.summary
    assert "KilonodeGpuNodesUnhealthy" in line.summary and "KilonodeGpuPoolDegraded" in line.summary
    assert "KilonodeScrapeTargetDown" in line.summary  # up{job} fires instead
    assert "raise it above 2,176,960" in line.summary


def test_a_sample_limit_above_the_load_and_a_global_one_below_it() -> None:
    head = snapshot(STACK)
    _set_limit(head, KSM, sample_limit=5_000_000)
    assert _alerting(head) == []
    head = snapshot(STACK)
    _set_limit(head, "kilonode-kubelet", sample_limit=1_000)  # 1,200 per kubelet in the plan
    [line] = _alerting(head)
    assert "kilonode-kubelet" in line.summary and "1,200" in line.summary


def test_a_target_limit_below_the_nodes_and_a_job_without_a_figure_noted() -> None:
    head = snapshot(STACK)
    _set_limit(head, "kilonode-cadvisor", target_limit=5_000)
    [line] = _alerting(head)
    assert "target_limit 5,000" in line.summary and "7,504" in line.summary
    head = snapshot(STACK)
    _set_limit(head, "kilonode-kubelet", job_name="kilonode-node-exporter", sample_limit=10)
    diff = compare_stack(STACK, snapshot(STACK), head)
    assert alerting.scrape_limits_below_load(diff) == []
    assert any("kilonode-node-exporter" in n and "not judged" in n for n in diff.notes)


def test_the_shipped_stacks_unchanged_give_nothing() -> None:
    for stack in ("local", "research-2500", "research-7500"):
        same = compare_stack(stack, snapshot(stack), snapshot(stack))
        assert alerting.scrape_limits_below_load(same) == []
        assert control_flags.assess(same) == []


def _edit(head: dict[str, Any], suffix: str, old: str, new: str) -> None:
    for path in list(head["files"]):
        if path.endswith(suffix):
            assert old in head["files"][path]
            head["files"][path] = head["files"][path].replace(old, new)


def _flags(head: dict[str, Any]) -> list[Finding]:
    return control_flags.assess(compare_stack(STACK, snapshot(STACK), head))


def test_percentage_of_nodes_to_score_raised_is_medium_with_the_trade_off() -> None:
    head = snapshot(STACK)
    _edit(head, control_flags.SCHEDULER_CONFIG, "enableProfiling: false",
          "enableProfiling: false\npercentageOfNodesToScore: 100")
    [line] = _flags(head)
    assert line.level == MEDIUM and line.rule == control_flags.SCORE_RULE
    assert "7,504" in line.summary and "was 375" in line.summary and "20x" in line.summary
    assert control_flags.nodes_to_score(0, 7_504) == 375
    assert control_flags.nodes_to_score(0, 5_000) == 500
    assert control_flags.nodes_to_score(0, 99) == 99 and control_flags.nodes_to_score(0, 150) == 100


def test_another_scheduler_field_is_the_generic_medium_with_its_values() -> None:
    head = snapshot(STACK)
    _edit(head, control_flags.SCHEDULER_CONFIG, "enableProfiling: false", "enableProfiling: true\nparallelism: 32")
    [line] = _flags(head)
    assert line.rule == control_flags.SCHEDULER_CHANGED_RULE and line.level == MEDIUM
    assert "enableProfiling false -> true" in line.summary and "parallelism (unset) -> 32" in line.summary


def test_percentage_lowered_is_only_the_generic_line() -> None:
    head = snapshot(STACK)
    _edit(head, control_flags.SCHEDULER_CONFIG, "enableProfiling: false",
          "enableProfiling: false\npercentageOfNodesToScore: 2")
    [line] = _flags(head)
    assert line.rule == control_flags.SCHEDULER_CHANGED_RULE


def _kcm(head: dict[str, Any], flags: str) -> None:
    _edit(head, "kube-controller-manager.service", "--profiling=false", "--profiling=false \\\n    " + flags)


def test_node_eviction_rate_raised_is_high_with_the_figures() -> None:
    head = snapshot(STACK)
    _kcm(head, "--node-eviction-rate=5")
    [line] = _flags(head)
    assert line.level == HIGH and line.rule == control_flags.EVICTION_RULE
    assert "(unset) -> 5" in line.summary and "was 60" in line.summary and "1,376" in line.summary


def test_thresholds_that_let_the_fast_rate_apply_longer_are_judged_too() -> None:
    head = snapshot(STACK)
    _kcm(head, "--unhealthy-zone-threshold=0.95")
    [line] = _flags(head)
    assert line.rule == control_flags.EVICTION_RULE
    head = snapshot(STACK)
    _kcm(head, "--secondary-node-eviction-rate=1")
    [line] = _flags(head)
    assert line.rule == control_flags.EVICTION_RULE and line.level == HIGH


def test_a_slower_eviction_is_only_the_generic_line() -> None:
    head = snapshot(STACK)
    _kcm(head, "--node-eviction-rate=0.05")
    [line] = _flags(head)
    assert line.rule == control_flags.CHANGED_RULE and "--node-eviction-rate (unset) -> 0.05" in line.summary
