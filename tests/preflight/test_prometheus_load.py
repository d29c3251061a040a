"""prometheus-load: the shipped stacks' Prometheus carries the intervals its configuration renders; the kubelet and
cAdvisor jobs edited from the plan's interval to 15s on research-7500 (an independent trace's PR) is a break with the
figures of the plan's own model, and one job at 30s is whatever that model says. The expected figures are computed
here from the plan at run time (the monitoring plan changes), with the plan's functions."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from kilonode.plan import defaults
from kilonode.plan.resolve.monitoring import head_bytes_per_series
from kilonode.preflight import run
from kilonode.preflight.checks import prometheus_load
from kilonode.preflight.prometheus import CONFIG_MAP, deployed_scrape_intervals, graph_of
from kilonode.render.monitoring import JOB_CADVISOR, JOB_KUBELET
from tests.preflight.conftest import artefacts, inputs_of

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

CHECK = ["prometheus-load"]
STACK = "research-7500"
GIB = 1024**3


def with_intervals(graph: dict[str, Any], intervals: dict[str, str]) -> dict[str, Any]:
    """The graph with the named jobs' scrape_interval in the monitoring ConfigMap's prometheus.yml replaced."""
    [data] = [r["inputs"]["data"] for r in graph["resources"] if r["type"] == CONFIG_MAP
              and defaults.PROMETHEUS_CONFIG_FILE in (r["inputs"].get("data") or {})]
    config = yaml.safe_load(data[defaults.PROMETHEUS_CONFIG_FILE])
    for job in config["scrape_configs"]:
        if job["job_name"] in intervals:
            job["scrape_interval"] = intervals.pop(job["job_name"])
    assert intervals == {}, f"no such job: {intervals}"
    data[defaults.PROMETHEUS_CONFIG_FILE] = yaml.safe_dump(config, sort_keys=False)
    return graph


def _edited(intervals: dict[str, str]) -> Any:
    files, graph = artefacts(STACK)
    return inputs_of(STACK, files=files, graph=with_intervals(graph, intervals))


def _series(inputs: Any, *jobs: str) -> int:
    p = inputs.plan.prometheus
    return sum(part.series for part in prometheus_load.parts(inputs, p) if part.job in jobs)


def test_the_shipped_stacks_carry_their_rendered_intervals(shipped: str) -> None:
    inputs = inputs_of(shipped)
    assert run(inputs, CHECK) == []
    p = inputs.plan.prometheus
    assert p is not None
    figures = prometheus_load.load(inputs, deployed_scrape_intervals(graph_of(inputs)))
    assert figures is not None
    # the plan's series are all counted, and where a job renders at the plan's interval, at the plan's figures
    assert sum(part.series for part in prometheus_load.parts(inputs, p)) == p.series
    assert figures.need <= p.memory_gib * GIB
    assert abs(figures.samples_planned - p.samples_per_s) < 1
    # every per-node job of the plan was found in the render (none judged blind)
    rendered = deployed_scrape_intervals(graph_of(inputs))
    assert {part.job for part in prometheus_load.parts(inputs, p) if part.per_node and part.job} <= set(rendered)


def test_kubelet_and_cadvisor_at_15s_on_research_7500_is_the_oom_break() -> None:
    inputs = _edited({JOB_KUBELET: "15s", JOB_CADVISOR: "15s"})
    p = inputs.plan.prometheus
    assert p is not None and p.per_node_interval_s == 60
    moved = _series(inputs, JOB_KUBELET, JOB_CADVISOR)
    assert moved > 0.7 * p.series  # the trace: ~9.2M of ~11.8M series
    # the plan's own model, by its function: the moved series at 15 s, the rest as planned
    head = p.head_bytes + moved * (head_bytes_per_series(15) - head_bytes_per_series(60))
    need = head * (100 + defaults.PROMETHEUS_MEMORY_MARGIN_PERCENT) / 100 + p.query_bytes
    assert need > p.memory_gib * GIB
    findings = run(inputs, CHECK)
    assert [f.level for f in findings] == ["break", "break", "warn"]
    memory, ingest, retention = findings
    assert {f.where for f in findings} == {"StatefulSet monitoring/prometheus"}
    for f in findings:
        assert f"{JOB_KUBELET} every 15 s (the plan's 60 s" in f.what and f"{JOB_CADVISOR} every 15 s" in f.what
        assert "restore the plan's intervals" in f.fix and "re-sized" in f.fix
    assert f"head needs {head / GIB:.1f} GiB" in memory.what and f"{need / GIB:.1f} GiB" in memory.what
    assert f"{p.memory_gib} GiB limit" in memory.what and "OOM-kills" in memory.what and "WAL" in memory.what
    samples = sum(part.series / (15 if part.job in (JOB_KUBELET, JOB_CADVISOR) else
                                 deployed_scrape_intervals(graph_of(inputs)).get(part.job or "", part.planned))
                  for part in prometheus_load.parts(inputs, p))
    assert samples > 3 * defaults.PROMETHEUS_INGEST_BUDGET
    assert f"{samples:,.0f} in all" in ingest.what and f"{defaults.PROMETHEUS_INGEST_BUDGET:,}" in ingest.what
    assert f"not the {p.retention_days} of --storage.tsdb.retention.time" in retention.what
    held = float(retention.what.split(" holds ")[1].split(" days")[0])
    assert held < p.retention_days / 2  # ~4 days of the 14-15


def test_one_job_at_30s_is_what_the_model_says() -> None:
    inputs = _edited({JOB_KUBELET: "30s"})
    p = inputs.plan.prometheus
    assert p is not None
    moved = _series(inputs, JOB_KUBELET)
    head = p.head_bytes + moved * (head_bytes_per_series(30) - head_bytes_per_series(p.per_node_interval_s))
    need = head * (100 + defaults.PROMETHEUS_MEMORY_MARGIN_PERCENT) / 100 + p.query_bytes
    findings = run(inputs, CHECK)
    memory = [f for f in findings if "head needs" in f.what]
    assert bool(memory) == (need > p.memory_gib * GIB)
    if memory:
        assert f"{need / GIB:.1f} GiB" in memory[0].what
    figures = prometheus_load.load(inputs, deployed_scrape_intervals(graph_of(inputs)))
    assert figures is not None and abs(figures.need - need) < 1
    assert figures.changed[JOB_KUBELET] == (30, p.per_node_interval_s, moved)
    ingest = [f for f in findings if "over the plan's budget" in f.what]
    assert bool(ingest) == (figures.node_samples > max(defaults.PROMETHEUS_INGEST_BUDGET,
                                                       figures.node_samples_planned))
    for f in findings:
        assert f"{JOB_KUBELET} every 30 s" in f.what and JOB_CADVISOR not in f.what.split(". ")[0]


def test_a_slower_job_is_no_finding() -> None:
    assert run(_edited({JOB_KUBELET: "2m", JOB_CADVISOR: "2m"}), CHECK) == []


def test_a_job_without_its_own_interval_takes_the_global_one() -> None:
    files, graph = artefacts(STACK)
    [data] = [r["inputs"]["data"] for r in graph["resources"] if r["type"] == CONFIG_MAP
              and defaults.PROMETHEUS_CONFIG_FILE in (r["inputs"].get("data") or {})]
    config = yaml.safe_load(data[defaults.PROMETHEUS_CONFIG_FILE])
    config.setdefault("global", {})["scrape_interval"] = "15s"
    for job in config["scrape_configs"]:
        if job["job_name"] in (JOB_KUBELET, JOB_CADVISOR):
            del job["scrape_interval"]
    data[defaults.PROMETHEUS_CONFIG_FILE] = yaml.safe_dump(config, sort_keys=False)
    findings = run(inputs_of(STACK, files=files, graph=graph), CHECK)
    assert [f.level for f in findings] == ["break", "break", "warn"]
    assert f"{JOB_KUBELET} every 15 s" in findings[0].what
