"""The review's rules that judge a change with preflight's own models and the real checkers,
on research-7500's recorded snapshot changed by hand: each rule's finding, and its silence on
an unchanged stack (so each test can fail)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kilonode.k8s import gpu as k8s_gpu
from kilonode.k8s import rdma as k8s_rdma
from kilonode.plan.wellknown import TEAM_LABEL
from kilonode.review import alerting, placement
from kilonode.review.compare import compare_stack
from kilonode.review.finding import HIGH, Finding
from tests.monitoring.promtool import promtool_path
from tests.review.snapshots import pod_spec, snapshot

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
