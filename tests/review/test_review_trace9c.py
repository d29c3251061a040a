"""A ninth independent trace of `kilonode diff` on research-7500 (9c): three changes misjudged.

1. A new PriorityClass kilonode-training-critical with value 1,500,000,000 ("No risk found"): the
   apiserver refuses the create (kubernetes pkg/apis/scheduling/validation/validation.go
   ValidatePriorityClass: "maximum allowed value of a user defined priority is 1000000000" for a name
   without the system- prefix), so `pulumi up` stops at that resource. Preflight's api-validation
   check breaks, so the review's preflight-break reports it high.
2. sysctl.overrides {kernel.pid_max: 32768} as hardening (only fleet-rollout): the kubelet's
   podPidsLimit is 32,768 too, so one pod can take every PID of its node and the kubelet and the
   container runtime cannot fork. The stack is now refused (kilonode.config.checks pid_max_problems,
   applied in kilonode.plan.checked_plan), at the override's line, with what to do.
3. The GPU-health controller's ClusterRole given patch on validatingadmissionpolicybindings ("No
   risk found"): with it the controller can set any binding's validationActions to Audit or narrow its
   matchResources, switching off every kilonode admission policy. rbac-escalation's catalogue
   (escalations.yaml admission-policies) names it, high."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from kilonode.config import load_stack
from kilonode.plan import checked_plan, defaults
from kilonode.problems import StackError
from kilonode.review.compare import compare_stack
from kilonode.review.finding import HIGH
from kilonode.review.risks import Risk, assess
from tests import shared
from tests.review.snapshots import snapshot
from tests.shared import SHIPPED_STACKS

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

STACK = "research-7500"
REPO_ROOT = Path(__file__).resolve().parents[2]


def risks(head: dict[str, Any]) -> list[Risk]:
    return assess(compare_stack(STACK, snapshot(STACK), head), {})


def _priority_class(entry: dict[str, Any], name: str) -> dict[str, Any]:
    [found] = [r for r in entry["resources"] if r["type"].endswith(":PriorityClass")
               and r["inputs"]["metadata"]["name"] == name]
    return found


def test_a_user_priority_class_above_one_billion_is_a_high_preflight_break() -> None:
    head = snapshot(STACK)
    new = copy.deepcopy(_priority_class(head, "kilonode-infrastructure"))
    new["name"] = new["name"].replace("kilonode-infrastructure", "kilonode-training-critical")
    new["inputs"]["metadata"]["name"] = "kilonode-training-critical"
    new["inputs"]["value"] = 1_500_000_000
    head["resources"].append(new)
    [line] = [r for r in risks(head) if r.rule == "preflight-break" and "api-validation" in r.summary]
    assert line.level == HIGH
    assert "PriorityClass kilonode-training-critical" in line.summary
    assert "`pulumi up` stops at this resource: the apiserver refuses it" in line.summary
    assert "maximum allowed value of a user defined priority is 1000000000" in line.summary


def _stack_with(tmp_path: Path, overrides: str) -> Path:
    text = (REPO_ROOT / "stacks" / f"Pulumi.{STACK}.yaml").read_text()
    marker = f"    name: {STACK}\n"
    assert marker in text and "sysctl:" not in text
    (tmp_path / f"Pulumi.{STACK}.yaml").write_text(
        text.replace(marker, f"{marker}    sysctl:\n      overrides: {{{overrides}}}\n", 1))
    return tmp_path


def test_pid_max_at_the_pods_pids_limit_is_refused_at_its_line(tmp_path: Path) -> None:
    stack = load_stack(STACK, _stack_with(tmp_path, "kernel.pid_max: 32768"))
    with pytest.raises(StackError) as refused:
        checked_plan(stack)
    text = str(refused.value)
    assert f"Pulumi.{STACK}.yaml:7" in text and "sysctl.overrides.kernel.pid_max" in text
    assert "one pod alone can take every PID" in text and "Process ID Limits And Reservations" in text
    assert f"Raise it above {_floor():,}" in text and "or leave it out" in text


def _floor() -> int:
    """research-7500's densest pool's maxPods and one more budgets of podPidsLimit (the pools' DaemonSets move
    maxPods: the exporters, the disk plugin)."""
    return defaults.POD_PIDS_LIMIT * (max(p.max_pods for p in shared.plan(STACK).node_pools) + 1)


def test_pid_max_above_the_pools_pods_and_one_more_is_accepted(tmp_path: Path) -> None:
    floor = _floor()
    with pytest.raises(StackError, match=f"Raise it above {floor:,}"):
        checked_plan(load_stack(STACK, _stack_with(tmp_path, f"kernel.pid_max: {floor}")))
    checked_plan(load_stack(STACK, _stack_with(tmp_path, f"kernel.pid_max: {floor + 1}")))


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_the_shipped_stacks_keep_their_pid_max(stack: str) -> None:
    checked_plan(load_stack(stack))


def test_patch_on_admission_policy_bindings_is_a_high_rbac_escalation() -> None:
    head = snapshot(STACK)
    [role] = [r["inputs"] for r in head["resources"] if r["type"].endswith(":ClusterRole")
              and r["inputs"]["metadata"]["name"] == "kilonode:gpu-health-controller"]
    role["rules"].append({"apiGroups": ["admissionregistration.k8s.io"],
                          "resources": ["validatingadmissionpolicybindings"], "verbs": ["patch"]})
    [line] = [r for r in risks(head) if r.rule == "rbac-escalation"]
    assert line.level == HIGH
    assert "kilonode:gpu-health-controller" in line.summary
    assert "admission policies and their bindings write" in line.summary and "validationActions" in line.summary
