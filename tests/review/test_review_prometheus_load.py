"""An independent trace (PR 04) of `kilonode diff` on research-7500: the kubelet and cAdvisor jobs' scrape_interval
60s -> 15s in the rendered prometheus.yml was "No risk found", while the plan had sized the one Prometheus for 60 s
(its head then needs more than the pod's memory limit: OOM-killed, all alerting lost). Preflight's prometheus-load
check re-reads the rendered configuration against the plan's model; the review reports its break as a high
`preflight-break`."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from kilonode.plan import defaults
from kilonode.review import alerting
from kilonode.review.compare import compare_stack
from kilonode.review.finding import HIGH
from kilonode.review.risks import assess
from tests.review.snapshots import snapshot

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

STACK = "research-7500"
JOBS = ("kilonode-kubelet", "kilonode-cadvisor")


def _config_map(entry: dict[str, Any], namespace: str, name: str) -> dict[str, Any]:
    [found] = [r["inputs"]["data"] for r in entry["resources"] if r["type"] == alerting.CONFIG_MAP
               and (r["inputs"]["metadata"].get("namespace"), r["inputs"]["metadata"]["name"]) == (namespace, name)]
    return found


def with_interval(entry: dict[str, Any], interval: str) -> dict[str, Any]:
    data = _config_map(entry, "monitoring", "kilonode-prometheus")
    config = yaml.safe_load(data[defaults.PROMETHEUS_CONFIG_FILE])
    edited = [job for job in config["scrape_configs"] if job["job_name"] in JOBS]
    assert len(edited) == 2
    for job in edited:
        job["scrape_interval"] = interval
    data[defaults.PROMETHEUS_CONFIG_FILE] = yaml.safe_dump(config, sort_keys=False)
    return entry


def test_kubelet_and_cadvisor_at_15s_is_a_high_preflight_break_naming_prometheus_load() -> None:
    risks = assess(compare_stack(STACK, snapshot(STACK), with_interval(snapshot(STACK), "15s")), {})
    found = [r for r in risks if r.rule == "preflight-break" and "prometheus-load" in r.summary]
    assert found and {r.level for r in found} == {HIGH}
    said = " ".join(r.summary for r in found)
    assert "kilonode-kubelet every 15 s" in said and "kilonode-cadvisor every 15 s" in said
    assert "OOM" in said and "limit" in said


def test_the_plan_s_interval_is_no_preflight_break() -> None:
    risks = assess(compare_stack(STACK, snapshot(STACK), with_interval(snapshot(STACK), "1m")), {})
    assert not [r for r in risks if r.rule == "preflight-break" and "prometheus-load" in r.summary]
