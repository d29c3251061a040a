"""What research-7500's on-call trace added to the exporters, held: the fields and kept names it needs, the
profiling fields left out, the team and fabric labels exported, and the compaction interval the etcd alert waits on
equal to the catalogue's."""

from __future__ import annotations

from pathlib import Path

from kilonode.catalog.limits import limits
from kilonode.k8s.exporters import dcgm_counters_csv, kube_state_metrics_args
from kilonode.plan import defaults
from kilonode.plan.resolve.monitoring import dcgm_exporter_series, node_exporter_series
from kilonode.render import monitoring
from tests import shared

TRACE_FIELDS = {"DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_POWER_VIOLATION", "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
                "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "DCGM_EXP_XID_ERRORS_COUNT"}


def test_the_counters_file_has_the_trace_fields_and_no_profiling_field() -> None:
    fields = {line.split(",")[0] for line in dcgm_counters_csv().splitlines() if not line.startswith("#")}
    assert fields >= TRACE_FIELDS
    assert not any(f.startswith("DCGM_FI_PROF_") for f in fields)
    assert len(fields) == 21


def test_the_series_estimate_follows_the_lists() -> None:
    plan = shared.plan("research-7500")
    ib = next(p for p in plan.gpu_pools if p.infiniband)
    assert dcgm_exporter_series(ib) == 21 * ib.gpus_per_node
    kept = dict(defaults.NODE_EXPORTER_KEPT)
    rate, wait = kept["node_infiniband_rate_bytes_per_second"], kept["node_infiniband_port_transmit_wait_total"]
    assert rate == wait == "ib_port"
    ib_names = sum(1 for _, kind in defaults.NODE_EXPORTER_KEPT if kind == "ib_port")
    assert ib_names == 10
    without_ib = node_exporter_series(ib) - ib_names * ib.gpus_per_node
    assert without_ib > 0


def test_kube_state_metrics_exports_team_and_fabric() -> None:
    [arg] = [a for a in kube_state_metrics_args() if a.startswith("--metric-labels-allowlist=")]
    assert arg == "--metric-labels-allowlist=nodes=[kilonode.io/pool,kilonode.io/team,kilonode.io/fabric]"


def test_the_compaction_interval_is_the_catalogues() -> None:
    assert limits().kubernetes.compaction_interval_seconds.value == defaults.APISERVER_COMPACTION_INTERVAL_S
    [alert] = [a for a in monitoring.alerts(shared.plan("local")) if a.name == "KilonodeEtcdCompactionStalled"]
    assert "[30m]" in alert.expr


def test_the_new_alerts_have_runbook_sections() -> None:
    doc = (Path(__file__).parents[2] / monitoring.RUNBOOK_DOC).read_text()
    names = {"KilonodeGpuNodeUnhealthy", "KilonodeGpuPowerThrottling", "KilonodeInfinibandPortSlow",
             "KilonodeInfinibandPortsMissing", "KilonodeEtcdCompactionStalled", "KilonodeNodeFilesystemFull",
             "KilonodeNodePressure"}
    rendered = {a.name: a.runbook for a in monitoring.alerts(shared.plan("research-7500")) if a.name in names}
    assert set(rendered) == names
    for name in names:
        assert name in doc, name
