"""ksm-resources-grown: kube-state-metrics told to watch more kinds than it was sized for (trace 18, P08), on the
shipped stack changed in memory, with a harmless variant that stays quiet."""

from __future__ import annotations

from typing import Any

import pytest

from kilonode.review.compare import compare_stack
from tests.review.snapshots import snapshot

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

STACK = "research-7500"


def _with_resources(value: str) -> dict[str, Any]:
    head = snapshot(STACK)
    [container] = [c for r in head["resources"] if r["type"] == "kubernetes:apps/v1:Deployment"
                   and r["inputs"]["metadata"]["name"] == "kube-state-metrics"
                   for c in r["inputs"]["spec"]["template"]["spec"]["containers"] if c["name"] == "kube-state-metrics"]
    container["args"] = [f"--resources={value}" if a.startswith("--resources=") else a for a in container["args"]]
    return head


def _lines(head: dict[str, Any]) -> list[Any]:
    from kilonode.review import risks
    return [r for r in risks.assess(compare_stack(STACK, snapshot(STACK), head), {}) if r.rule == "ksm-resources-grown"]


def test_pods_added_is_high_with_the_pods_and_series_the_plan_does_not_count() -> None:
    [line] = _lines(_with_resources("nodes,daemonsets,deployments,pods"))
    assert line.level == "high"
    # research-7500: 5,000 x 10 + 2,500 x 10 + 3 x 21 + 1 x 9 pods at most
    assert "up to 75,072" in line.summary and "1,876,800 series" in line.summary
    assert "OOMKilled" in line.summary and "661Mi" in line.summary


def test_a_small_kind_is_medium_and_the_same_kinds_reordered_say_nothing() -> None:
    [line] = _lines(_with_resources("nodes,daemonsets,deployments,statefulsets"))
    assert line.level == "medium" and "statefulsets" in line.summary
    assert _lines(_with_resources("deployments,nodes,daemonsets")) == []
