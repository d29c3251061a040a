"""replicas-cut: the fourteenth trace's PR 12 cut calico-typha from 39 replicas to 9 at research-7500 and the
review said "No risk found" (kilonode.review.replicas)."""

from __future__ import annotations

import pytest

from kilonode.review import replicas
from kilonode.review.compare import compare_stack
from kilonode.review.finding import HIGH, MEDIUM, Finding
from tests.review.snapshots import snapshot, workload

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

STACK = "research-7500"


def _cut(name: str, to: int) -> list[Finding]:
    head = snapshot(STACK)
    spec = workload(head, "Deployment", name)["spec"]
    assert spec["replicas"] > to
    spec["replicas"] = to
    return replicas.assess(compare_stack(STACK, snapshot(STACK), head))


def test_typha_cut_past_upstreams_ratio_is_high() -> None:
    [line] = _cut("calico-typha", 9)
    assert line.level == HIGH and line.rule == "replicas-cut"
    assert "replicas 39 -> 9: 30 pods are deleted together" in line.summary
    assert "9 Typhas, 834 each" in line.summary and "one per 200 nodes" in line.summary


def test_typha_cut_within_the_ratio_is_medium() -> None:
    [line] = _cut("calico-typha", 38)
    assert line.level == MEDIUM


def test_the_shipped_stack_says_nothing() -> None:
    assert replicas.assess(compare_stack(STACK, snapshot(STACK), snapshot(STACK))) == []
