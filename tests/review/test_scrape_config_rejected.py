"""`scrape-config-rejected`: the Prometheus configuration a change leaves invalid, checked at review time by
`promtool check config --syntax-only` on research-7500's recorded snapshot changed by hand (a trace found
`scrape_timeout: 2m` on a job scraped every 30s reported as "No risk found"). Each finding, and its silence
on an unchanged stack and a valid change, so that each test can fail."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kilonode.review import alerting
from kilonode.review.compare import compare_stack
from kilonode.review.finding import HIGH
from kilonode.review.risks import assess
from tests.monitoring.promtool import promtool_path
from tests.review.snapshots import snapshot

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

STACK = "research-7500"
CONFIG_KEY = "ConfigMap monitoring/kilonode-prometheus prometheus.yml"
APISERVER_JOB = "- job_name: kilonode-apiserver\n  scrape_interval: 30s\n"


def _config(entry: dict[str, Any]) -> dict[str, str]:
    [data] = [r["inputs"]["data"] for r in entry["resources"] if r["type"] == alerting.CONFIG_MAP
              and r["inputs"]["metadata"]["name"] == "kilonode-prometheus"]
    return data  # type: ignore[no-any-return]


def _edited(old: str, new: str, entry: dict[str, Any] | None = None) -> dict[str, Any]:
    changed = snapshot(STACK) if entry is None else entry
    data = _config(changed)
    assert old in data["prometheus.yml"]
    data["prometheus.yml"] = data["prometheus.yml"].replace(old, new, 1)
    return changed


def _apiserver(extra: str, entry: dict[str, Any] | None = None) -> dict[str, Any]:
    """The apiserver job (30s) given `extra` lines."""
    return _edited(APISERVER_JOB, APISERVER_JOB + extra, entry)


@pytest.fixture
def with_promtool(monkeypatch: pytest.MonkeyPatch) -> Path:
    try:
        path = promtool_path()
    except RuntimeError as error:  # `make test` and `make test-fast` unpack it first: never a skip
        pytest.fail(str(error))
    monkeypatch.setenv(alerting.PROMTOOL_ENV, str(path))
    return path


def test_the_configuration_is_the_key_prometheus_loads() -> None:
    # the StatefulSet's --config.file under its ConfigMap volume's mount, not every key with scrape_configs
    # (kilonode-scrape-configs.yaml is the fragment for a Prometheus of the user's own)
    [(label, (data, key))] = alerting.prometheus_configs(snapshot(STACK)).items()
    assert label == CONFIG_KEY and key == "prometheus.yml" and "kilonode-rules.yaml" in data


def test_an_unchanged_stack_is_silent(with_promtool: Path) -> None:
    diff = compare_stack(STACK, snapshot(STACK), snapshot(STACK))
    assert alerting.assess(diff) == [] and diff.notes == []


def test_a_scrape_timeout_past_the_interval_is_high_and_names_the_job(with_promtool: Path) -> None:
    diff = compare_stack(STACK, snapshot(STACK), _apiserver("  scrape_timeout: 2m\n"))
    [finding] = alerting.assess(diff)
    assert finding.level == HIGH and finding.rule == "scrape-config-rejected" and finding.subjects == (CONFIG_KEY,)
    assert "job kilonode-apiserver" in finding.summary
    assert 'scrape timeout greater than scrape interval for scrape config with job name "kilonode-apiserver"' \
        in finding.summary
    assert "refuses the reload" in finding.summary and "at its next start" in finding.summary
    assert "alerting is gone" in finding.summary and "promtool 2." in finding.summary
    assert "config/config.go" in finding.summary and "cmd/prometheus/main.go" in finding.summary
    assert "kilonode-config-" not in finding.summary, "the temporary directory is not named"
    assert diff.notes == []


def test_the_report_no_longer_says_no_risk(with_promtool: Path) -> None:
    risks = assess(compare_stack(STACK, snapshot(STACK), _apiserver("  scrape_timeout: 2m\n")), {})
    assert [r.rule for r in risks if r.level == HIGH] == ["scrape-config-rejected"]


def test_a_valid_change_is_silent(with_promtool: Path) -> None:
    diff = compare_stack(STACK, snapshot(STACK), _apiserver("  scrape_timeout: 20s\n"))
    assert alerting.assess(diff) == [] and diff.notes == []


def test_an_unknown_field_beside_the_set_aside_discovery_is_still_rejected(with_promtool: Path) -> None:
    # Debian's promtool knows no kubernetes_sd_configs and those blocks are set aside; a misspelt field is not
    diff = compare_stack(STACK, snapshot(STACK), _apiserver("  scrape_timout: 20s\n"))
    [finding] = alerting.assess(diff)
    assert finding.rule == "scrape-config-rejected" and "scrape_timout" in finding.summary
    assert "job kilonode-apiserver" in finding.summary  # the job the change alters, promtool naming none


def test_a_configuration_the_base_is_rejected_for_too_is_not_judged(with_promtool: Path) -> None:
    # scrape_protocols (Prometheus 2.49+) is valid for the pinned v3.5.5 and unknown to Debian's 2.42
    newer = "  scrape_protocols: [PrometheusText0.0.4]\n"
    base = _apiserver(newer, snapshot(STACK))
    head = _apiserver(newer + "  scrape_timeout: 2m\n", snapshot(STACK))
    diff = compare_stack(STACK, base, head)
    assert alerting.assess(diff) == []
    [note] = diff.notes
    assert CONFIG_KEY in note and "rejects the base's Prometheus configuration too" in note
    assert "scrape_protocols" in note and "not judged" in note


def test_without_promtool_the_change_is_said_not_judged(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(alerting.PROMTOOL_ENV, "/nonexistent/promtool")
    diff = compare_stack(STACK, snapshot(STACK), _apiserver("  scrape_timeout: 2m\n"))
    assert alerting.assess(diff) == []
    [note] = diff.notes
    assert CONFIG_KEY in note and "not checked: no promtool" in note
