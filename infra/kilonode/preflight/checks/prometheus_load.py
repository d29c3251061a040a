"""prometheus-load: the Prometheus the cluster deploys can carry the scrapes its rendered configuration makes.

The plan sizes the one Prometheus (kilonode.plan.resolve.monitoring): its series, each job at the interval the plan
chose (PrometheusPlan.terms: targets x series per target, every interval_s), give the samples per second, the head's
bytes per series (head_bytes_per_series, which falls as the interval grows: fewer samples in the head's chunks),
the memory request and limit, and the days the data volume's retention.size holds. Nothing after the plan re-reads
the rendered result: a job's `scrape_interval` edited in the render (the kubelet and cAdvisor jobs from 60s to 15s on
research-7500, an independent trace) changes every one of those figures while the pod keeps the plan's limit.

Traced here from the recorded graph:

1. the configuration the Prometheus container loads (its `--config.file` in the monitoring ConfigMap, and the files
   its `scrape_config_files` pull in: kilonode.preflight.prometheus, the reader the review shares) and each job's
   interval, its own else the file's global one (prometheus/prometheus@v3.5.5 config/config.go
   ScrapeConfig.Validate: an unset scrape_interval takes the global one, whose default is 1m);
2. the plan's terms, each mapped to its job: a pool's "nodes of <pool>" term split into the per-node jobs by the
   plan's own per-node figures (kubelet, cAdvisor per container, kube-state-metrics' node share, pod traffic,
   node-exporter, dcgm-exporter, the GPU health agent), the rest of the term (a figure no job here is mapped to)
   kept at the plan's interval; each control-plane term to its job; a term no job is mapped to stays as planned;
3. recomputed with the plan's functions (head_bytes_per_series) and its own figures (head bytes per series at
   its interval, query bytes, margin, daily bytes per sample per second): a job scraped at the plan's interval
   counts as the plan counts it, one at another interval at its rendered interval.

Judged against the rendered StatefulSet's Prometheus container (its memory limit, its --storage.tsdb.retention.size
and .time):

- memory: the head at the rendered intervals, with the plan's margin and query memory, over the container's limit
  is a break: the kernel's OOM killer ends Prometheus once its resident set passes the cgroup's limit
  (kubernetes/website content/en/docs/concepts/configuration/manage-resources-containers.md, "If a container
  exceeds its memory limit ... it may be terminated"), and at its restart it rebuilds the head from the WAL holding
  the same series before it scrapes or evaluates anything (prometheus/prometheus@v3.5.5 tsdb/db.go open calls
  Head.Init, which replays the WAL: tsdb/head_wal.go loadWAL), so it is killed again: the cluster's only Prometheus
  is lost, and every alert with it;
- samples per second: the plan's rule (per_node_interval) keeps the per-node jobs' samples per second within
  PROMETHEUS_INGEST_BUDGET; rendered intervals that take them past the budget, and past what the plan itself
  accepted (at its longest interval it may exceed the budget), are a break;
- retention: --storage.tsdb.retention.size is a byte budget for blocks, in powers of two (cmd/prometheus/main.go at
  v3.5.5: "Based on powers-of-2, so 1KB is 1024B"), and the oldest block goes when it is reached
  (tsdb/db.go BeyondSizeRetention), so at the rendered ingest it holds fewer days than --storage.tsdb.retention.time
  says: a warning (the cluster works; history is shorter than the plan says).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kilonode.plan import defaults
from kilonode.plan.model import NodePoolPlan, PrometheusPlan
from kilonode.plan.resolve import monitoring as model
from kilonode.preflight.checks.disks import size_bytes
from kilonode.preflight.model import Finding, Inputs, Resource
from kilonode.preflight.prometheus import (
    config_flag,
    deployed_scrape_intervals,
    graph_of,
    prometheus_workloads,
    seconds,
)
from kilonode.render import monitoring as render

NAME = "prometheus-load"
TITLE = "the deployed Prometheus carries its rendered scrape intervals (memory, samples/s, retention)"

GIB = 1024**3
_RETENTION_SIZE = "--storage.tsdb.retention.size="
_RETENTION_TIME = "--storage.tsdb.retention.time="

# A pool's per-node term, split by job: the plan's own per-node figures (kilonode.plan.resolve.monitoring
# per_node_series sums them); a job the render scrapes every node for.
_PER_NODE: tuple[tuple[str, Callable[[NodePoolPlan], int]], ...] = (
    (render.JOB_KUBELET, lambda p: defaults.PROMETHEUS_SERIES_PER_KUBELET),
    (render.JOB_CADVISOR, lambda p: defaults.PROMETHEUS_CADVISOR_SERIES_PER_CONTAINER * p.max_pods),
    (render.JOB_KUBE_STATE_METRICS, lambda p: defaults.PROMETHEUS_KSM_SERIES_PER_NODE),
    (render.JOB_POD_TRAFFIC, lambda p: defaults.PROMETHEUS_POD_TRAFFIC_SERIES_PER_NODE
     + defaults.PROMETHEUS_POD_TRAFFIC_SERIES_PER_POD * p.max_pods),
    (render.JOB_NODE_EXPORTER, model.node_exporter_series),
    (render.JOB_DCGM_EXPORTER, model.dcgm_exporter_series),
    (render.JOB_GPU_HEALTH_AGENT, model.gpu_agent_series),
)
# The control plane's terms (series_terms' `what`, by its first words), each one job's.
_CONTROL = (("apiservers", render.JOB_APISERVER), ("kube-schedulers", render.JOB_SCHEDULER),
            ("kube-controller-managers", render.JOB_CONTROLLER_MANAGER),
            ("control-plane hosts' certificate", render.JOB_CERTIFICATES),
            ("GPU health taint controllers", render.JOB_GPU_HEALTH_CONTROLLER),
            ("cluster-autoscaler", render.JOB_AUTOSCALER))


@dataclass(frozen=True)
class Part:
    """Series of one job (None: of no job mapped here) the plan counts at `planned` seconds."""

    job: str | None
    series: int
    planned: int
    per_node: bool  # the plan's ingest rule counts it (a pool's per-node term)


@dataclass(frozen=True)
class Load:
    """The plan's figures and the same at the rendered intervals."""

    plan: PrometheusPlan
    changed: dict[str, tuple[float, int, int]]  # job -> (rendered interval, the plan's, its series)
    samples: float  # per second, at the rendered intervals
    samples_planned: float
    node_samples: float  # the per-node jobs' (the plan's ingest rule)
    node_samples_planned: float
    head: float  # head bytes at the rendered intervals
    need: float  # memory bytes: head + the plan's margin + its query memory

    def days_held(self, size: int) -> float:
        """Days `size` bytes of blocks hold at the rendered ingest: the plan's bytes a day, scaled by samples/s."""
        return size / (self.plan.daily_bytes * self.samples / self.samples_planned)


def parts(inputs: Inputs, p: PrometheusPlan) -> list[Part]:
    """The plan's series, by the job that scrapes them (kilonode.review.alerting job_loads maps them alike)."""
    pools = {pool.name: pool for pool in inputs.plan.node_pools}
    etcd = [c for c in (inputs.plan.etcd_main, inputs.plan.etcd_events, inputs.plan.etcd_leases) if c is not None]
    found: list[Part] = []
    for term in p.terms:
        pool = pools.get(term.what.split(" (", 1)[0].removeprefix("nodes of ")) \
            if term.what.startswith("nodes of ") else None
        if pool is not None:
            split = [(job, figure(pool)) for job, figure in _PER_NODE]
            rest = term.per_target - sum(n for _, n in split)
            if rest < 0:  # the plan's per-node figure is no longer this sum: keep the term whole, as planned
                split, rest = [], term.per_target
            found += [Part(job, term.targets * n, term.interval_s, True) for job, n in split if n]
            found += [Part(None, term.targets * rest, term.interval_s, True)] if rest else []
        elif term.what.startswith("etcd members") and sum(len(c.members) for c in etcd) == term.targets:
            found += [Part(render.etcd_job(c.role), len(c.members) * term.per_target, term.interval_s, False)
                      for c in etcd if c.members]
        else:
            job = next((j for start, j in _CONTROL if term.what.startswith(start)), None)
            found.append(Part(job, term.series, term.interval_s, False))
    return found


def load(inputs: Inputs, intervals: Mapping[str, float]) -> Load | None:
    """The plan's Prometheus at the rendered intervals; None without a Prometheus planned."""
    p = inputs.plan.prometheus
    if p is None:
        return None
    changed: dict[str, tuple[float, int, int]] = {}
    samples = samples_planned = node = node_planned = head = 0.0
    for part in parts(inputs, p):
        rendered = intervals.get(part.job, part.planned) if part.job else part.planned
        if rendered != part.planned and part.job:
            was = changed.get(part.job, (rendered, part.planned, 0))
            changed[part.job] = (rendered, part.planned, was[2] + part.series)
            # the plan's head model at the interval actually scraped (whole seconds, as the plan's)
            head += part.series * model.head_bytes_per_series(max(1, round(rendered)))
        else:
            head += part.series * p.head_bytes_per_series  # as the plan counts it: at its per-node interval
        samples += part.series / rendered
        samples_planned += part.series / part.planned
        if part.per_node:
            node += part.series / rendered
            node_planned += part.series / part.planned
    need = head * (100 + defaults.PROMETHEUS_MEMORY_MARGIN_PERCENT) / 100 + p.query_bytes
    return Load(p, changed, samples, samples_planned, node, node_planned, head, need)


def prometheus_container(inputs: Inputs) -> tuple[Resource, Mapping[str, Any]] | None:
    """The workload and container that load a Prometheus configuration (its --config.file; not Alertmanager's)."""
    loaders = prometheus_workloads(graph_of(inputs))
    for workload in inputs.workloads():
        meta = workload.inputs.get("metadata") or {}
        if (meta.get("namespace", "default"), str(meta.get("name", workload.name))) not in loaders:
            continue
        pod = ((workload.inputs.get("spec") or {}).get("template") or {}).get("spec") or {}
        for container in pod.get("containers") or []:
            if isinstance(container, Mapping) and config_flag(container):
                return workload, container
    return None


def _flag(container: Mapping[str, Any], prefix: str) -> str | None:
    words = [str(w) for w in [*(container.get("command") or []), *(container.get("args") or [])]]
    return next((w.removeprefix(prefix) for w in words if w.startswith(prefix)), None)


def _size(text: str | None) -> int | None:
    try:
        return size_bytes(text) if text else None
    except ValueError:
        return None


def check(inputs: Inputs) -> list[Finding]:
    if inputs.plan.prometheus is None:
        return []  # no Prometheus of kilonode's (the plan warns)
    intervals = deployed_scrape_intervals(graph_of(inputs))
    found = prometheus_container(inputs)
    figures = load(inputs, intervals) if intervals else None
    if found is None or figures is None:
        return []  # no configuration loaded: scrape-path says so
    workload, container = found
    where = workload.describe()
    p = figures.plan
    faster = sorted(((job, r, planned, series) for job, (r, planned, series) in figures.changed.items()),
                    key=lambda c: -c[3] * (1 / c[1] - 1 / c[2]))
    jobs = "; ".join(f"{job} every {_s(r)} (the plan's {planned} s; {series:,} series)"
                     for job, r, planned, series in faster) or "none"
    said = f"jobs scraped at another interval than the plan's: {jobs}"
    fix = ("restore the plan's intervals in the rendered configuration (kilonode.render.monitoring takes them from "
           "the plan), or change the interval through the plan (kilonode.plan.resolve.monitoring, "
           "kilonode.plan.defaults.monitoring) so that Prometheus is re-sized for it")
    findings: list[Finding] = []
    limit = _size(str(((container.get("resources") or {}).get("limits") or {}).get("memory") or ""))
    if limit is not None and figures.need > limit:
        findings.append(Finding(
            NAME, "break", where,
            f"{said}. At those intervals the head needs {figures.head / GIB:.1f} GiB (the plan's "
            f"{p.head_bytes / GIB:.1f} GiB at {p.per_node_interval_s} s, kilonode.plan.resolve.monitoring "
            f"head_bytes_per_series), {figures.need / GIB:.1f} GiB with the plan's "
            f"{defaults.PROMETHEUS_MEMORY_MARGIN_PERCENT}% margin and {p.query_bytes / GIB:.1f} GiB of queries, over "
            f"the container's {limit / GIB:.0f} GiB limit: the kernel OOM-kills Prometheus, and each restart replays "
            "the WAL holding the same series and is killed again, so the cluster's only Prometheus is lost and no "
            "alert fires",
            fix))
    budget = defaults.PROMETHEUS_INGEST_BUDGET
    if figures.node_samples > max(budget, figures.node_samples_planned):
        findings.append(Finding(
            NAME, "break", where,
            f"{said}. The per-node jobs ingest {figures.node_samples:,.0f} samples/s ({figures.samples:,.0f} in all; "
            f"the plan's {figures.node_samples_planned:,.0f} and {figures.samples_planned:,.0f}), over the plan's "
            f"budget of {budget:,} samples/s (kilonode.plan.resolve.monitoring per_node_interval: the per-node "
            "interval is the shortest that stays within it): the WAL grows with the rate, and with it the replay "
            "after every restart (kilonode.plan.defaults.monitoring: the field notes' hours-long WAL replay), during "
            "which Prometheus scrapes nothing and evaluates no alert",
            fix))
    size = _size(_flag(container, _RETENTION_SIZE))
    days = seconds(_flag(container, _RETENTION_TIME))
    if size is not None and days and figures.samples_planned:
        held = figures.days_held(size)
        if held < days / 86_400:
            findings.append(Finding(
                NAME, "warn", where,
                f"{said}. At {figures.samples:,.0f} samples/s (the plan's {figures.samples_planned:,.0f}), "
                f"--storage.tsdb.retention.size={_flag(container, _RETENTION_SIZE)} holds {held:.1f} days, not the "
                f"{days / 86_400:.0f} of --storage.tsdb.retention.time: the oldest blocks are deleted by size first, "
                "so the history is shorter than the plan says",
                fix))
    return findings


def _s(interval: float) -> str:
    return f"{interval:g} s"
