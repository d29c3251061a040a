"""The review reports a kube-apiserver flag its own rules do not model but the apiserver refuses at
start: --goaway-chance=0.05 (above ServerRunOptions.Validate's 0.02) on research-7500's apiservers
is a high `preflight-break` from preflight's component-flags check, where the flag rules alone said
"a flag the review does not model changed" (medium)."""

from __future__ import annotations

from typing import Any

import pytest

from kilonode.review.compare import compare_stack
from kilonode.review.finding import HIGH
from kilonode.review.risks import assess
from tests.review.snapshots import snapshot

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

STACK = "research-7500"
UNIT = "etc/systemd/system/kube-apiserver.service"


def with_goaway(entry: dict[str, Any], value: str) -> dict[str, Any]:
    """Every apiserver's rendered unit with --goaway-chance replaced, as the pull request renders it."""
    paths = [p for p in entry["files"] if p.endswith("/" + UNIT)]
    assert len(paths) == 5
    for path in paths:
        text = entry["files"][path]
        assert "--goaway-chance=0.001" in text
        entry["files"][path] = text.replace("--goaway-chance=0.001", f"--goaway-chance={value}")
    return entry


def test_a_goaway_chance_of_five_percent_is_a_high_preflight_break() -> None:
    risks = assess(compare_stack(STACK, snapshot(STACK), with_goaway(snapshot(STACK), "0.05")), {})
    [line] = [r for r in risks if r.rule == "preflight-break" and "component-flags" in r.summary]
    assert line.level == HIGH
    assert "goaway-chance" in line.summary and "0.02" in line.summary
    assert "no apiserver serves" in line.summary


def test_a_goaway_chance_within_bounds_is_no_preflight_break() -> None:
    risks = assess(compare_stack(STACK, snapshot(STACK), with_goaway(snapshot(STACK), "0.02")), {})
    assert not [r for r in risks if r.rule == "preflight-break" and "component-flags" in r.summary]
