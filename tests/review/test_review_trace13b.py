"""The thirteenth independent trace of `kilonode diff` on research-7500, x08 and x05: KilonodeEtcdNoLeader's
severity critical -> warning was "No risk found" (alert-page-lost, kilonode.review.serving), and Prometheus's
retention 15d -> 3d was told as "its sizing only ... what moved them here is a change to a pool's nodes", a cause
that did not move (kilonode.review.incluster: the plan's own figures named, the shorter history said)."""

from __future__ import annotations

from typing import Any

import pytest

from kilonode.review.compare import compare_stack
from kilonode.review.finding import HIGH, MEDIUM
from kilonode.review.risks import Risk, assess
from tests.review.snapshots import pod_spec, snapshot
from tests.review.test_review_trace12b import _rules

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

STACK = "research-7500"
NO_LEADER = ("  - alert: KilonodeEtcdNoLeader\n"
             "    expr: max by (cluster_role, instance) (etcd_server_has_leader{job=~\"kilonode-etcd-.+\"}) == 0\n"
             "    for: 1m\n    labels:\n      severity: critical\n")


def _risks(head: dict[str, Any], rule: str) -> list[Risk]:
    return [r for r in assess(compare_stack(STACK, snapshot(STACK), head), {}) if r.rule == rule]


def test_a_paging_alert_demoted_to_warning_is_high() -> None:
    head = snapshot(STACK)
    _rules(head, NO_LEADER, NO_LEADER.replace("severity: critical", "severity: warning"))
    [risk] = _risks(head, "alert-page-lost")
    assert risk.level == HIGH
    assert "KilonodeEtcdNoLeader: severity critical -> warning" in risk.summary and "nobody is woken" in risk.summary


def test_a_paging_alert_deleted_is_high_and_a_rename_is_not() -> None:
    head = snapshot(STACK)
    _rules(head, NO_LEADER, "")
    [risk] = _risks(head, "alert-page-lost")
    assert "KilonodeEtcdNoLeader: deleted" in risk.summary
    renamed = snapshot(STACK)
    _rules(renamed, NO_LEADER, NO_LEADER.replace("KilonodeEtcdNoLeader", "KilonodeEtcdLeaderless"))
    assert _risks(renamed, "alert-page-lost") == [] and _risks(renamed, "alert-deleted") == []


def test_a_warning_raised_to_critical_is_not_a_loss() -> None:
    head = snapshot(STACK)
    _rules(head, NO_LEADER, NO_LEADER + NO_LEADER.replace("critical", "warning").replace("for: 1m", "for: 30s"))
    assert _risks(head, "alert-page-lost") == []


def _retention(entry: dict[str, Any], value: str) -> None:
    [container] = [c for c in pod_spec(entry, "StatefulSet", "prometheus")["containers"] if c["name"] == "prometheus"]
    args = container["args"]
    [at] = [i for i, a in enumerate(args) if a.startswith("--storage.tsdb.retention.time=")]
    args[at] = f"--storage.tsdb.retention.time={value}"


def test_a_shorter_retention_is_said_with_its_cause() -> None:
    head = snapshot(STACK)
    [container] = [c for c in pod_spec(head, "StatefulSet", "prometheus")["containers"] if c["name"] == "prometheus"]
    [planned] = [a.split("=", 1)[1] for a in container["args"] if a.startswith("--storage.tsdb.retention.time=")]
    _retention(head, "3d")
    [risk] = _risks(head, "prometheus-restarted")
    assert risk.level == MEDIUM
    assert f"its retention shortens {planned.removesuffix('d')} d -> 3 d" in risk.summary
    assert "a change to a pool's nodes" not in risk.summary


def test_a_longer_retention_says_no_shortening() -> None:
    head = snapshot(STACK)
    _retention(head, "30d")
    [risk] = _risks(head, "prometheus-restarted")
    assert "shortens" not in risk.summary
