"""kilonode.review.alerting reads PromQL through promql_parser (the module docstring says why, and what it does not
read): every shipped rule is read, what the library does not read is a note in the review and never a crash, and the
expressions it could only take down the process with (too deep for its native stack) are not handed to it."""

from __future__ import annotations

from typing import Any

import pytest

from kilonode.review import alerting
from kilonode.review.compare import compare_stack
from tests.review.snapshots import snapshot
from tests.shared import SHIPPED_STACKS

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

STACK = "research-7500"
RULES = ("monitoring", "kilonode-prometheus", "kilonode-rules.yaml")


def _rules_data(entry: dict[str, Any]) -> dict[str, Any]:
    namespace, name, _ = RULES
    [found] = [r["inputs"]["data"] for r in entry["resources"] if r["type"] == alerting.CONFIG_MAP
               and (r["inputs"]["metadata"].get("namespace"), r["inputs"]["metadata"]["name"]) == (namespace, name)]
    return found


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_every_shipped_rule_is_read(stack: str) -> None:
    entry = snapshot(stack)
    assert alerting.alert_rules(entry)
    assert alerting.unreadable(entry) == {}


def test_a_rule_the_library_does_not_read_is_a_note_not_a_crash(monkeypatch: pytest.MonkeyPatch) -> None:
    # Prometheus takes a backquoted string verbatim (lex.go lexRawString); promql_parser rejects its backslash
    monkeypatch.setenv(alerting.PROMTOOL_ENV, "/nonexistent/promtool")
    head = snapshot(STACK)
    data = _rules_data(head)
    key = RULES[2]
    assert 'job=~"kilonode-etcd-.+"' in data[key]
    data[key] = data[key].replace('job=~"kilonode-etcd-.+"', "job=~`kilonode-etcd-\\w+`")
    diff = compare_stack(STACK, snapshot(STACK), head)
    alerting.assess(diff)
    said = [n for n in diff.notes if "not read by promql_parser" in n]
    assert said and any("KilonodeEtcdNoLeader" in n for n in said)
    assert "unknown escape sequence" in said[0]
    assert alerting.metric_names("up{job=`a\\w`}") == {}


def test_an_expression_past_the_bound_is_not_parsed() -> None:
    with pytest.raises(alerting.PromQLSyntax, match="characters"):
        alerting.selectors("x + " * (alerting.MAX_EXPR_CHARS // 4) + "y")


def test_a_deep_expression_under_the_bound_does_not_overflow_the_stack() -> None:
    # unary minus nests a level per character: the deepest tree the bound lets through, on the parse thread's stack
    [selector] = alerting.selectors("-" * (alerting.MAX_EXPR_CHARS - 10) + "up")
    assert selector.metric == "up"


def test_selectors_under_ranges_subqueries_and_name_matchers() -> None:
    read = alerting.selectors('max_over_time(rate(a{job="j"}[2m])[30m:1m]) > on () group_left '
                              'count({__name__="ALERTS", alertstate="firing"}) or topk(3, b offset 5m)')
    assert [(s.metric, s.matchers, s.within) for s in read] == [
        ("a", (("job", "=", "j"),), ("max_over_time", "rate")),
        ("ALERTS", (("alertstate", "=", "firing"),), ("count",)),
        ("b", (), ("topk",))]
    assert alerting.scan('label_replace(up, "a", "$1", "job", "(.*)")')[1] == {"label_replace"}
    assert alerting.metric_names('sum by (job) (rate(x{job="j"}[5m])) / y') == {"x": {"j"}, "y": {""}}
