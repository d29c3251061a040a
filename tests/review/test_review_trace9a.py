"""The two changes an independent trace of `kilonode diff` on research-7500 (9a) found misjudged, each
on the stack's recorded snapshot changed by hand as the pull request changes it: kube-controller-manager's
--node-monitor-grace-period lowered to 20s "for faster failover" (reported only as the apiservers'
restart) and the kubelets' nodeStatusReportFrequency lowered to 10s "for fresher dashboards" (reported
only as the fleet rollout). Both are high with their figures (kilonode.review.control_flags)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest

from kilonode.review import control_flags
from kilonode.review.compare import compare_stack
from kilonode.review.finding import HIGH, MEDIUM
from kilonode.review.risks import Risk, assess
from kilonode.review.unit_flags import unit_flags
from tests.review.snapshots import snapshot

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

STACK = "research-7500"
KCM = control_flags.UNITS["kube-controller-manager"]
APISERVER = control_flags.UNITS["kube-apiserver"]


def reviewed(head: dict[str, Any], rule: str) -> list[Risk]:
    return [r for r in assess(compare_stack(STACK, snapshot(STACK), head), {}) if r.rule == rule]


def add_flag(head: dict[str, Any], unit: str, flag: str) -> None:
    """Append `flag` to the ExecStart of every apiserver host's `unit`."""
    files = head["files"]
    for path in [p for p in files if p.endswith("/" + unit)]:
        lines = files[path].splitlines()
        last = max(i for i, line in enumerate(lines) if line.startswith("    --"))
        lines[last] += " \\"
        lines.insert(last + 1, f"    {flag}")
        files[path] = "\n".join(lines) + "\n"


def kubelet_configs(head: dict[str, Any], edit: Callable[[str], str]) -> int:
    files = head["files"]
    paths = [p for p in files if p.endswith("/" + control_flags.KUBELET_CONFIG)]
    for path in paths:
        files[path] = edit(files[path])
    return len(paths)


def test_the_grace_period_lowered_to_20s_is_high_with_the_renewals_and_the_evictions() -> None:
    head = snapshot(STACK)
    add_flag(head, KCM, "--node-monitor-grace-period=20s")
    assert unit_flags(head["files"][f"apiserver-0/{KCM}"])["node-monitor-grace-period"] == "20s"
    [line] = reviewed(head, control_flags.GRACE_RULE)
    assert line.level == HIGH
    assert "(unset) -> 20s on 5 apiserver host(s)" in line.summary
    assert "renews every 10 s" in line.summary and "so 2 renewals' time" in line.summary
    assert "upstream's default 50 s holds 5" in line.summary  # 1.34.2: 50 s since 1.32
    assert "node.kubernetes.io/unreachable:NoExecute" in line.summary and "whole job" in line.summary
    assert "7,504 nodes" in line.summary
    assert len(line.subjects) == 5 and all(s.endswith(KCM) for s in line.subjects)
    # said once: the generic line leaves it to the rule
    assert not [r for r in reviewed(head, control_flags.CHANGED_RULE) if "grace" in r.summary]


def test_a_grace_period_kept_above_the_default_is_only_the_generic_line() -> None:
    head = snapshot(STACK)
    add_flag(head, KCM, "--node-monitor-grace-period=2m")
    assert not reviewed(head, control_flags.GRACE_RULE)
    [line] = reviewed(head, control_flags.CHANGED_RULE)
    assert line.level == MEDIUM and "--node-monitor-grace-period (unset) -> 2m" in line.summary


def test_the_report_frequency_lowered_to_10s_is_high_with_the_write_rates() -> None:
    head = snapshot(STACK)
    assert kubelet_configs(head, lambda text: text + "nodeStatusReportFrequency: 10s\n") == 6
    [line] = reviewed(head, control_flags.WRITES_RULE)
    assert line.level == HIGH
    # 7,504 nodes: every 5 min -> every 10 s, the Node writes 30x
    assert re.search(r"750 Node writes/s .*, was 25 Node writes/s", line.summary), line.summary
    assert "30x the Node writes" in line.summary
    assert "pool-h100-ib (2,500 nodes): nodeStatusReportFrequency (unset) -> 10s" in line.summary
    assert "50,104 writes/s" in line.summary and "KEP-589" in line.summary
    assert len(line.subjects) == 6
    assert not reviewed(head, control_flags.KUBELET_CHANGED_RULE)


def test_the_update_frequency_set_alone_drags_the_report_frequency_with_it() -> None:
    """Upstream's defaulting: with nodeStatusReportFrequency unset, a set nodeStatusUpdateFrequency is
    also the report frequency (pkg/kubelet/apis/config/v1beta1/defaults.go), even at its own default."""
    head = snapshot(STACK)
    kubelet_configs(head, lambda text: text + "nodeStatusUpdateFrequency: 10s\n")
    [line] = reviewed(head, control_flags.WRITES_RULE)
    assert line.level == HIGH and "takes nodeStatusUpdateFrequency's value" in line.summary


def test_raising_the_report_frequency_is_not_high() -> None:
    base, head = snapshot(STACK), snapshot(STACK)
    kubelet_configs(base, lambda text: text + "nodeStatusReportFrequency: 1m\n")
    kubelet_configs(head, lambda text: text + "nodeStatusReportFrequency: 10m\n")
    found = assess(compare_stack(STACK, base, head), {})
    assert not [r for r in found if r.rule == control_flags.WRITES_RULE]
    mine = [r for r in found if r.rule.startswith(("kubelet-", "node-monitor", "control-plane-flag"))]
    assert mine and all(r.level == MEDIUM for r in mine)
    [line] = [r for r in mine if r.rule == control_flags.KUBELET_CHANGED_RULE]
    assert "nodeStatusReportFrequency 1m -> 10m" in line.summary


def test_a_small_lowering_is_medium_with_its_rates() -> None:
    base, head = snapshot(STACK), snapshot(STACK)
    kubelet_configs(head, lambda text: text + "nodeStatusReportFrequency: 2m\n")
    [line] = [r for r in assess(compare_stack(STACK, base, head), {}) if r.rule == control_flags.WRITES_RULE]
    assert line.level == MEDIUM and "63 Node writes/s" in line.summary


def test_an_unmodelled_controller_manager_flag_is_the_generic_medium() -> None:
    head = snapshot(STACK)
    add_flag(head, KCM, "--concurrent-deployment-syncs=50")
    [line] = reviewed(head, control_flags.CHANGED_RULE)
    assert line.level == MEDIUM
    assert "kube-controller-manager flag the review does not model" in line.summary
    assert "--concurrent-deployment-syncs (unset) -> 50" in line.summary
    assert "check it against the component's flag reference" in line.summary
    assert len(line.subjects) == 5


@pytest.mark.parametrize("flag", ["--default-unreachable-toleration-seconds=30",
                                  "--default-not-ready-toleration-seconds=30"])
def test_the_default_tolerations_lowered_are_high(flag: str) -> None:
    head = snapshot(STACK)
    add_flag(head, APISERVER, flag)
    [line] = reviewed(head, control_flags.TOLERATION_RULE)
    assert line.level == HIGH and "(unset) -> 30" in line.summary
    assert not reviewed(head, control_flags.CHANGED_RULE)


def test_the_removed_pod_eviction_timeout_stops_the_controller_manager() -> None:
    head = snapshot(STACK)
    add_flag(head, KCM, "--pod-eviction-timeout=1m")
    [line] = reviewed(head, control_flags.TOLERATION_RULE)
    assert line.level == HIGH and "unknown flag" in line.summary


def test_the_monitor_period_raised_is_high() -> None:
    head = snapshot(STACK)
    add_flag(head, KCM, "--node-monitor-period=30s")
    [line] = reviewed(head, control_flags.PERIOD_RULE)
    assert line.level == HIGH and "(unset) -> 30s" in line.summary


def test_the_lease_duration_raised_past_the_grace_period_is_high() -> None:
    head = snapshot(STACK)
    kubelet_configs(head, lambda text: text + "nodeLeaseDurationSeconds: 120\n")
    [line] = reviewed(head, control_flags.LEASE_RULE)
    assert line.level == HIGH and "renewed every 30 s" in line.summary


def test_unchanged_shipped_stacks_give_nothing() -> None:
    for stack in ("research-7500", "research-2500", "local"):
        diff = compare_stack(stack, snapshot(stack), snapshot(stack))
        assert control_flags.assess(diff) == []
