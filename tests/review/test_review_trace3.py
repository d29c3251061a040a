"""The misjudgements a third independent trace of `kilonode diff` found on research-7500, each on the
stack's recorded snapshot changed by hand as the pull request changes it: a DaemonSet's selector
changed (a replacement since pulumi-kubernetes #1951, not a refused update), the StatefulSet inputs
that force a replacement, an alert whose rate range is too short for its job's scrape interval, and
a DaemonSet's pod-template rollout that is not an image move."""

from __future__ import annotations

import tomllib
from typing import Any

import pytest

from kilonode.catalog.effects import Effect
from kilonode.paths import REPO_ROOT
from kilonode.review import alerting
from kilonode.review.compare import UPDATE, InputChange, ResourceChange, StackDiff, compare_stack
from kilonode.review.finding import HIGH, MEDIUM
from kilonode.review.risks import Risk, assess, refused
from tests.review.snapshots import pod_spec, snapshot

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

STACK = "research-7500"
DAEMONSET = "kubernetes:apps/v1:DaemonSet"
STATEFULSET = "kubernetes:apps/v1:StatefulSet"
CONFIG_MAP = "kubernetes:core/v1:ConfigMap"


def risks(head: dict[str, Any]) -> list[Risk]:
    return assess(compare_stack(STACK, snapshot(STACK), head), {})


def rule(found: list[Risk], name: str) -> list[Risk]:
    return [r for r in found if r.rule == name]


def _object(entry: dict[str, Any], type_: str, name: str) -> dict[str, Any]:
    [found] = [r for r in entry["resources"] if r["type"] == type_ and r["inputs"]["metadata"]["name"] == name]
    inputs: dict[str, Any] = found["inputs"]
    return inputs


def _rows() -> list[dict[str, Any]]:
    assert REPO_ROOT is not None
    text = (REPO_ROOT / "infra/kilonode/catalog/effects.toml").read_text()
    rows: list[dict[str, Any]] = tomllib.loads(text)["effect"]
    return rows


# --- 1. a DaemonSet's selector changed is a replacement --------------------------------------------------------------


def test_the_daemonset_selector_row_is_a_replacement_at_the_installed_provider() -> None:
    [row] = [r for r in _rows() if r["type"] == DAEMONSET and r["path"] == "spec.selector"]
    assert row["effect"] == "replace"
    assert "v4.32.0" in row["source"] and "#1951" in row["source"] and "deleteBeforeReplace" in row["source"]


def test_a_device_plugin_selector_change_is_a_high_replacement_naming_its_nodes() -> None:
    head = snapshot(STACK)
    plugin = _object(head, DAEMONSET, "nvidia-device-plugin-daemonset")
    plugin["spec"]["selector"]["matchLabels"]["app"] = "nvidia-device-plugin"
    plugin["spec"]["template"]["metadata"]["labels"]["app"] = "nvidia-device-plugin"
    diff = compare_stack(STACK, snapshot(STACK), head)
    [change] = [c for c in diff.resources if c.type == DAEMONSET]
    assert change.action == "replace"
    found = assess(diff, {})
    assert not rule(found, "update-refused")
    [replaced] = rule(found, "daemonset-replaced")
    assert replaced.level == HIGH and replaced.subjects == (f"{STACK}-k8s-device-plugin-daemonset",)
    assert "DaemonSet kube-system/nvidia-device-plugin-daemonset is replaced" in replaced.summary
    assert "7,500 nodes: a100-ib 5,000, h100-ib 2,500" in replaced.summary
    assert "deleted before the new DaemonSet exists" in replaced.summary
    assert "no nvidia.com/gpu" in replaced.summary
    assert "Keep the selector" in replaced.summary and "new name first" in replaced.summary


def test_a_refused_input_counts_objects_not_the_paths_under_it() -> None:
    row = Effect(type=DAEMONSET, path="spec.selector", effect="refused", why="w", source="s")
    paths = ("spec.selector.matchLabels.a", "spec.selector.matchLabels.b", "spec.selector.matchLabels.c")
    change = ResourceChange(DAEMONSET, "ds", UPDATE, None, tuple(InputChange(p, "x", "y", (row,)) for p in paths))
    [risk] = refused(StackDiff("s", {}, {}, resources=[change]))
    assert risk.summary.startswith("1 DaemonSet change spec.selector") and risk.subjects == ("ds",)


# --- 2. StatefulSet inputs that force a replacement -----------------------------------------------------------------


def test_the_statefulset_force_new_inputs_of_the_installed_provider_are_rows() -> None:
    paths = {r["path"] for r in _rows() if r["type"] == STATEFULSET and r["effect"] == "replace"}
    assert paths >= {"spec.podManagementPolicy", "spec.revisionHistoryLimit", "spec.selector", "spec.serviceName",
                     "spec.volumeClaimTemplates"}


def test_a_replaced_prometheus_statefulset_is_prometheus_restarted() -> None:
    head = snapshot(STACK)
    _object(head, STATEFULSET, "prometheus")["spec"]["serviceName"] = "prometheus-headless"
    found = risks(head)
    [restarted] = rule(found, "prometheus-restarted")
    assert "its StatefulSet is replaced (spec.serviceName)" in restarted.summary
    # the claim outlives the StatefulSet (Retain) and the new one's pod mounts it again by name
    assert "its history stays on its claim data-prometheus-0" in restarted.summary
    assert "history is gone" not in restarted.summary and "no alert fires" in restarted.summary


# --- 3. an alert's rate range under two scrape intervals ------------------------------------------------------------


def _edit_rules(entry: dict[str, Any], old: str, new: str) -> None:
    [config] = [r for r in entry["resources"] if r["type"] == CONFIG_MAP
                and "kilonode-rules.yaml" in (r["inputs"].get("data") or {})]
    text = config["inputs"]["data"]["kilonode-rules.yaml"]
    assert text.count(old) == 1
    config["inputs"]["data"]["kilonode-rules.yaml"] = text.replace(old, new)


def test_the_shipped_rules_read_no_range_under_two_scrape_intervals() -> None:
    assert alerting.scrape_intervals(snapshot(STACK))["kilonode-apiserver"] == 30
    assert alerting.short_range_reads(snapshot(STACK)) == {}


def test_a_rate_over_one_scrape_interval_through_a_recording_rule_is_high_naming_the_alerts() -> None:
    head = snapshot(STACK)
    _edit_rules(head, 'verb!~"WATCH|CONNECT"}[5m]', 'verb!~"WATCH|CONNECT"}[30s]')
    [short] = rule(risks(head), "range-too-short")
    assert short.level == HIGH
    assert short.subjects == ("KilonodeApiserverErrors", "KilonodeApiserverThrottling")
    assert short.summary.startswith("rate(apiserver_request_total[30s]) over job kilonode-apiserver, scraped every 30s")
    assert "can never fire" in short.summary and "at least 60s" in short.summary


def test_an_increase_under_two_intervals_of_a_regex_named_job_is_caught() -> None:
    head = snapshot(STACK)
    _edit_rules(head, 'job=~"kilonode-etcd-.+"}[15m]', 'job=~"kilonode-etcd-.+"}[45s]')
    found = rule(risks(head), "range-too-short")
    assert [r.subjects for r in found] == [("KilonodeEtcdLeaderChanges",)]
    assert found[0].summary.startswith("increase(etcd_server_leader_changes_seen_total[45s]) over job "
                                       "kilonode-etcd-events, kilonode-etcd-main, scraped every 30s")
    assert all("intermittently" in r.summary for r in found)


def test_a_range_already_too_short_at_the_base_is_not_said_again() -> None:
    base, head = snapshot(STACK), snapshot(STACK)
    for side in (base, head):
        _edit_rules(side, 'verb!~"WATCH|CONNECT"}[5m]', 'verb!~"WATCH|CONNECT"}[30s]')
    # some other rule edit, so that the ConfigMap changes
    _edit_rules(head, "summary: etcd member without a leader", "summary: etcd member leaderless")
    assert not rule(assess(compare_stack(STACK, base, head), {}), "range-too-short")


def test_two_intervals_or_more_and_subqueries_are_not_flagged() -> None:
    intervals = {"j": 30.0}
    assert alerting._short_ranges('rate(x{job="j"}[1m])', intervals) == set()
    assert alerting._short_ranges('max_over_time(rate(x{job="j"}[2m])[30s:15s])', intervals) == set()
    assert alerting._short_ranges('rate(x{job="other"}[10s])', intervals) == set()
    assert alerting.seconds("1m30s") == 90 and alerting.seconds("5x") is None


# --- 4. any DaemonSet pod-template change is a rollout --------------------------------------------------------------


def test_a_calico_node_env_change_is_a_rollout_one_node_at_a_time_not_awaited() -> None:
    head = snapshot(STACK)
    [container] = [c for c in pod_spec(head, "DaemonSet", "calico-node")["containers"] if c["name"] == "calico-node"]
    container.setdefault("env", []).append({"name": "FELIX_LOGSEVERITYSCREEN", "value": "Debug"})
    [rollout] = rule(risks(head), "daemonset-rollout")
    assert rollout.level == MEDIUM and rollout.subjects == (f"{STACK}-k8s-calico-node",)
    assert "DaemonSet calico-node: its pod template changes" in rollout.summary
    assert "7,504 nodes" in rollout.summary and "maxUnavailable 1: one node at a time" in rollout.summary
    assert "`pulumi up` returns as soon as the object is updated" in rollout.summary
    assert "SKIP_AWAIT" in rollout.summary


def test_a_percentage_max_unavailable_is_said_in_nodes() -> None:
    head = snapshot(STACK)
    pod_spec(head, "DaemonSet", "kube-proxy")["priorityClassName"] = "system-node-critical"
    pod_spec(head, "DaemonSet", "kube-proxy")["terminationGracePeriodSeconds"] = 7
    [rollout] = rule(risks(head), "daemonset-rollout")
    assert "maxUnavailable 10%: 751 node(s) at a time" in rollout.summary  # 10% of 7,504, rounded up


def test_an_unchanged_stack_has_no_daemonset_lines() -> None:
    found = risks(snapshot(STACK))
    assert not rule(found, "daemonset-rollout") and not rule(found, "daemonset-replaced")


