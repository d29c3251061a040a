"""The misjudgements an independent trace of `kilonode diff` found on research-7500 (trace 6a), each on
the stack's recorded snapshot changed by hand as the pull request changes it: a change that makes
preflight break at the head (the device plugin's list strategy, kube-system's Pod Security level,
the balloons below the autoscaler's cutoff) is `preflight-break`, and an admission policy that denies
less is `admission-weakened`."""

from __future__ import annotations

import time
from typing import Any

import pytest

from kilonode.review import admission, preflight_break
from kilonode.review.compare import compare_stack
from kilonode.review.finding import HIGH
from kilonode.review.risks import Risk, assess
from tests.review.snapshots import pod_spec, snapshot

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

STACK = "research-7500"
ENFORCE = "pod-security.kubernetes.io/enforce"


def risks(head: dict[str, Any], base: dict[str, Any] | None = None) -> list[Risk]:
    return assess(compare_stack(STACK, base or snapshot(STACK), head), {})


def rule(found: list[Risk], name: str) -> list[Risk]:
    return [r for r in found if r.rule == name]


def _objects(entry: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [r for r in entry["resources"] if r["type"].endswith(f":{kind}")]


def _named(entry: dict[str, Any], kind: str, name: str) -> dict[str, Any]:
    [found] = [r["inputs"] for r in _objects(entry, kind) if r["inputs"]["metadata"]["name"] == name]
    return found


def test_an_unchanged_stack_says_neither() -> None:
    found = risks(snapshot(STACK))
    assert rule(found, "preflight-break") == [] and rule(found, "admission-weakened") == []


# --- 1. a new preflight break -------------------------------------------------------------------------------------


def test_the_device_list_strategy_moved_to_envvar_is_a_new_gpu_runtime_break() -> None:
    head = snapshot(STACK)
    [plugin] = [r["inputs"] for r in _objects(head, "DaemonSet") if "nvidia-device-plugin" in
                r["inputs"]["metadata"]["name"]]
    env = [e for c in plugin["spec"]["template"]["spec"]["containers"] for e in c.get("env") or []
           if e["name"] == "DEVICE_LIST_STRATEGY"]
    assert env and env[0]["value"] == "volume-mounts"
    env[0]["value"] = "envvar"
    [line] = [r for r in rule(risks(head), "preflight-break") if "gpu-runtime" in r.summary]
    assert line.level == HIGH
    assert "preflight's gpu-runtime check finds a break at the head that the base does not have" in line.summary
    assert "`pulumi up` refuses the whole run" in line.summary and "preflight_gate" in line.summary
    assert "Fix: " in line.summary


def test_kube_system_enforce_baseline_is_a_new_pod_security_break_per_agent() -> None:
    head = snapshot(STACK)
    _named(head, "NamespacePatch", "kube-system")["metadata"]["labels"][ENFORCE] = "baseline"
    found = [r for r in rule(risks(head), "preflight-break") if "pod-security" in r.summary]
    subjects = {s for r in found for s in r.subjects}
    for agent in ("DaemonSet kube-system/kube-proxy", "DaemonSet kube-system/calico-node",
                  "DaemonSet kube-system/cloud-node-manager"):
        assert agent in subjects
    assert all(r.level == HIGH and "enforces Pod Security `baseline`" in r.summary for r in found)
    assert len(found) == 1 and "breaks at the head that the base does not have" in found[0].summary


def test_the_balloons_below_the_autoscalers_cutoff_is_a_new_balloon_priority_break() -> None:
    head = snapshot(STACK)
    _named(head, "PriorityClass", "kilonode-balloon")["value"] = -11
    [line] = [r for r in rule(risks(head), "preflight-break") if "balloon-priority" in r.summary]
    assert line.subjects == ("Deployment kilonode-capacity/balloon-h100-ib",)
    assert "below the --expendable-pods-priority-cutoff=-10" in line.summary


def test_a_break_present_on_both_sides_is_not_new() -> None:
    base, head = snapshot(STACK), snapshot(STACK)
    for entry in (base, head):
        _named(entry, "PriorityClass", "kilonode-balloon")["value"] = -11
    _named(head, "PriorityClass", "kilonode-team")["value"] = 1001  # a change elsewhere
    assert rule(risks(head, base), "preflight-break") == []


def test_what_placement_already_reports_is_not_said_again() -> None:
    head = snapshot(STACK)
    # kube-proxy loses its tolerations: daemonset-stranded says so; scheduling's break on it is the same story
    pod_spec(head, "DaemonSet", "kube-proxy")["tolerations"] = []
    found = risks(head)
    assert rule(found, "daemonset-stranded")
    assert [r for r in rule(found, "preflight-break") if "kube-proxy" in r.summary] == []


def test_a_change_preflight_cannot_see_runs_no_check_and_the_base_runs_only_the_heads_broken_checks() -> None:
    diff = compare_stack(STACK, snapshot(STACK), snapshot(STACK))
    assert not preflight_break.relevant(diff) and preflight_break.assess(diff) == []
    assert "preflight:new" not in diff.derived
    head = snapshot(STACK)
    _named(head, "PriorityClass", "kilonode-balloon")["value"] = -11
    diff = compare_stack(STACK, snapshot(STACK), head)
    started = time.process_time()
    preflight_break.assess(diff)
    first = time.process_time() - started
    started = time.process_time()
    preflight_break.assess(diff)  # kept on the diff: computed once
    assert time.process_time() - started < first / 10


# --- 3. admission policies -----------------------------------------------------------------------------------------


def test_every_binding_warn_and_audit_is_admission_weakened_naming_each_policy() -> None:
    head = snapshot(STACK)
    for binding in _objects(head, "ValidatingAdmissionPolicyBinding"):
        binding["inputs"]["spec"]["validationActions"] = ["Warn", "Audit"]
    [line] = rule(risks(head), "admission-weakened")
    assert line.level == HIGH
    assert "6 admission policies deny less at the head" in line.summary
    for policy in admission.POLICIES:
        assert policy in line.subjects
    assert "['Deny'] -> ['Audit', 'Warn']: nothing is denied" in line.summary
    assert "node identity" in line.summary and "reserved pools" in line.summary and "Calico" in line.summary
    assert "gang placement" in line.summary and "priorities" in line.summary
    assert "Deny is the only validationAction that refuses a request" in line.summary


def test_a_deleted_policy_and_a_narrowed_binding_are_admission_weakened() -> None:
    head = snapshot(STACK)
    head["resources"] = [r for r in head["resources"] if not (
        "ValidatingAdmissionPolicy" in r["type"] and r["inputs"]["metadata"]["name"] == "kilonode-gang-fabric")]
    _named(head, "ValidatingAdmissionPolicyBinding", "kilonode-node-identity")["spec"]["matchResources"] = {
        "namespaceSelector": {"matchLabels": {"x": "y"}}}
    [line] = rule(risks(head), "admission-weakened")
    assert set(line.subjects) == {"kilonode-gang-fabric", "kilonode-node-identity"}
    assert "binding kilonode-gang-fabric deleted" in line.summary
    assert "policy kilonode-gang-fabric deleted" in line.summary
    assert "matchResources narrowed (namespaceSelector" in line.summary


def test_a_stricter_binding_is_not_weakened() -> None:
    head = snapshot(STACK)
    _named(head, "ValidatingAdmissionPolicyBinding", "kilonode-gang-size")["spec"]["validationActions"] = [
        "Deny", "Audit"]
    assert rule(risks(head), "admission-weakened") == []
