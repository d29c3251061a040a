"""An eighth independent trace of `kilonode diff` on research-7500 (8c): the alert rules' selector
`job="kilonode-apiserver"` changed to the kube-prometheus mixin's `job="apiserver"` got "No risk found by the
rules". No scrape config defines that job, so kilonode:apiserver_requests:rate5m records nothing and the four
apiserver alerts (KilonodeApiserverThrottling, KilonodeApiserverErrors: warning and critical) can never fire;
promtool passes it. `alert-selects-no-job` (kilonode.review.alerting.jobs_unselected) says so."""

from __future__ import annotations

from typing import Any

import pytest

from kilonode.review import alerting
from kilonode.review.compare import StackDiff, compare_stack
from kilonode.review.finding import HIGH, Finding
from kilonode.review.risks import assess
from tests.review.snapshots import snapshot
from tests.shared import SHIPPED_STACKS

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

STACK = "research-7500"
RULES = ("monitoring", "kilonode-prometheus", "kilonode-rules.yaml")
CONFIG = ("monitoring", "kilonode-prometheus", "prometheus.yml")


def _data(entry: dict[str, Any], namespace: str, name: str) -> dict[str, Any]:
    [found] = [r["inputs"]["data"] for r in entry["resources"] if r["type"] == alerting.CONFIG_MAP
               and (r["inputs"]["metadata"].get("namespace"), r["inputs"]["metadata"]["name"]) == (namespace, name)]
    return found


def _edit(entry: dict[str, Any], where: tuple[str, str, str], old: str, new: str) -> None:
    namespace, name, key = where
    data = _data(entry, namespace, name)
    assert old in data[key], f"{old} not in {name} {key}"
    data[key] = data[key].replace(old, new)


def _judged(head: dict[str, Any]) -> tuple[list[Finding], StackDiff]:
    diff = compare_stack(STACK, snapshot(STACK), head)
    return alerting.jobs_unselected(diff), diff


def test_the_mixins_apiserver_job_is_high_and_names_the_four_alerts() -> None:
    head = snapshot(STACK)
    _edit(head, RULES, 'job="kilonode-apiserver"', 'job="apiserver"')
    found = assess(compare_stack(STACK, snapshot(STACK), head), {})
    [risk] = [r for r in found if r.rule == "alert-selects-no-job"]
    assert risk.level == HIGH
    assert set(risk.subjects) == {"KilonodeApiserverThrottling", "KilonodeApiserverErrors"}
    assert "recording rule kilonode:apiserver_requests:rate5m" in risk.summary
    assert 'apiserver_request_total{job="apiserver"}' in risk.summary
    assert "KilonodeApiserverErrors (critical, warning)" in risk.summary
    assert "KilonodeApiserverThrottling (critical, warning)" in risk.summary
    assert "(4 alerting rules) can never fire" in risk.summary
    assert 'likely job="kilonode-apiserver"' in risk.summary and "kilonode-etcd-main" in risk.summary
    # the record is still written (under its name): recording-rule-missing has nothing to say, nor any other rule
    # about the selector
    assert not [r for r in found if r.rule == "recording-rule-missing"]


def test_a_selector_moved_to_another_existing_job_is_not_reported() -> None:
    head = snapshot(STACK)
    _edit(head, RULES, 'job="kilonode-scheduler"', 'job="kilonode-controller-manager"')
    _edit(head, RULES, 'job=~"kilonode-etcd-.+"', 'job=~"kilonode-etcd-(main|events)"')
    found, _ = _judged(head)
    assert found == []


def test_a_regex_matching_no_job_names_the_alerts_reading_it_directly_and_through_records() -> None:
    head = snapshot(STACK)
    _edit(head, RULES, 'job=~"kilonode-etcd-.+"', 'job=~"etcd-.+"')
    [finding] = _judged(head)[0]
    assert 'job=~"etcd-.+"' in finding.summary
    # read directly (KilonodeEtcdNoLeader) and through kilonode:etcd_disk_wal_fsync_duration_seconds:p99
    assert {"KilonodeEtcdNoLeader", "KilonodeEtcdSlowWalFsync", "KilonodeEtcdSlowBackendCommit"} <= set(
        finding.subjects)
    assert "likely" not in finding.summary


def test_a_scrape_job_renamed_under_unchanged_rules_is_reported() -> None:
    head = snapshot(STACK)
    _edit(head, CONFIG, "job_name: kilonode-apiserver", "job_name: apiserver")
    [finding] = _judged(head)[0]
    assert 'job="kilonode-apiserver"' in finding.summary and 'likely job="apiserver"' in finding.summary
    assert set(finding.subjects) == {"KilonodeApiserverThrottling", "KilonodeApiserverErrors"}


def test_a_selector_already_blind_at_the_base_is_not_said_again() -> None:
    base, head = snapshot(STACK), snapshot(STACK)
    for side in (base, head):
        _edit(side, RULES, 'job="kilonode-apiserver"', 'job="apiserver"')
    _edit(head, RULES, "0.01", "0.02")
    assert alerting.jobs_unselected(compare_stack(STACK, base, head)) == []


def test_a_job_label_set_at_scrape_time_leaves_the_selectors_unjudged_with_a_note() -> None:
    head = snapshot(STACK)
    _edit(head, RULES, 'job="kilonode-apiserver"', 'job="apiserver"')
    _edit(head, CONFIG, "job_name: kilonode-scheduler", "job_name: kilonode-scheduler\n  honor_labels: true")
    found, diff = _judged(head)
    assert found == []
    assert any("kilonode-scheduler" in note and "not judged" in note for note in diff.notes)


def test_selectors_are_read_as_prometheus_parses_them() -> None:
    # the offset inside absent(): after a call it is a parse error (prometheus/prometheus@v3.5.5
    # promql/parser/parse.go:986 addOffset), which the scanner before promql_parser let through
    expr = ('sum by (job) (rate(x_total{job="a}b", verb!~"W|C"}[5m])) # job="not-a-selector"\n'
            ' / on (job) group_left {"dotted.name", job=~`re.+`} or absent(up{job=\'c\\\'d\'} offset 5m)')
    read = alerting.selectors(expr)
    assert [(s.metric, s.matchers) for s in read] == [
        ("x_total", (("job", "=", "a}b"), ("verb", "!~", "W|C"))),
        ("dotted.name", (("job", "=~", "re.+"),)),
        ("up", (("job", "=", "c'd"),))]
    assert read[0].within == ("sum", "rate") and read[2].within == ("absent",)
    with pytest.raises(alerting.PromQLSyntax):
        alerting.selectors('up{job="open')


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_every_job_selector_of_a_shipped_stacks_rules_names_a_scrape_job(stack: str) -> None:
    """So that the rule stays silent on the shipped stacks, and they stay free of blind rules."""
    entry = snapshot(stack)
    jobs, open_jobs = alerting.scrape_jobs(entry)
    assert jobs and not open_jobs
    matchers = [m for r in alerting.alert_rules(entry) for s in alerting.selectors(str(r["expr"])) for m in s.matchers
                if m[0] == "job"]
    assert len(matchers) > 10  # the parser sees them
    assert alerting.blind_selectors(entry) == ({}, set())
    diff = compare_stack(stack, snapshot(stack), snapshot(stack))
    assert alerting.jobs_unselected(diff) == [] and not diff.notes
