"""The fourteenth trace's PR 06: CIS hardening `anonymous: {enabled: false}` in the apiservers'
AuthenticationConfiguration. The review rated it high only for the apiservers' replacement and advised a roll
that takes each apiserver out of both load balancers (their HTTPS /readyz probe carries no credentials); now
preflight's probe-anonymous break reaches the review as a high preflight-break."""

from __future__ import annotations

import pytest

from kilonode.review.compare import compare_stack
from kilonode.review.finding import HIGH
from kilonode.review.risks import assess
from tests.review.snapshots import snapshot

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

STACK = "research-7500"
CONFIG = "/etc/kubernetes/authentication-config.yaml"


def test_anonymous_off_is_a_high_preflight_break_naming_the_probe() -> None:
    head = snapshot(STACK)
    for path in [p for p in head["files"] if p.startswith("apiserver-") and p.endswith(CONFIG)]:
        head["files"][path] = head["files"][path].replace("  enabled: true\n", "  enabled: false\n")
    found = [r for r in assess(compare_stack(STACK, snapshot(STACK), head), {}) if r.rule == "preflight-break"]
    assert [r.level for r in found] == [HIGH]
    assert "probe-anonymous" in found[0].summary and "/readyz" in found[0].summary
