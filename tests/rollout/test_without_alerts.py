"""Rolling the pool that runs the cluster's Prometheus (monitoring): the rollout evicts the very
Prometheus its gates read, so `start --without-alerts` gates that pool on the node checks and on
Prometheus Ready again (its node uncordoned for it, then held), never on alerts; nowhere else.
Without it, and without --prometheus, the pool is refused as before."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from kilonode.cli import app
from kilonode.rollout import journal as journals
from kilonode.rollout import observe
from kilonode.rollout.decide import decide
from kilonode.rollout.model import ClusterState, Instance, Journal, Policy, ScaleSet, dark_alerting
from tests.rollout.test_decide import applied, kinds

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

SET = "research-7500-monitoring-000"
NODE = "research-7500-monitoring-000000000"
ENV = {"COLUMNS": "2000", "NO_COLOR": "1"}
DARK = "alerting is dark while pool monitoring rolls: its Prometheus is the one evicted"
NOT_READ = "not read: the rollout was started --without-alerts for pool monitoring"


def monitoring(**state: object) -> ClusterState:
    """The one-node monitoring pool as observe reads it for a --without-alerts rollout: alerts not
    read (and a firing one to be sure it is not read either), Prometheus Ready on its node."""
    pool = ScaleSet(SET, "monitoring", False, (Instance("0", NODE, False, ready=True, boot_id="m-0-boot-1"),))
    fields = {"alerts_unknown": NOT_READ, "firing": {"monitoring": ("KilonodeSomething",)},
              "prometheus_pod": "prometheus-0", "prometheus_node": NODE, "prometheus_ready": True, **state}
    return ClusterState((pool,), **fields)  # type: ignore[arg-type]


def rollout(without_alerts: str = "monitoring", **policy: object) -> Journal:
    fields = {"cordon_ahead": 0, "hold_s": 600, "steer": False, **policy}
    return Journal("research-7500", "monitoring image 1.1.0",
                   Policy(order=(SET,), without_alerts=without_alerts, **fields))  # type: ignore[arg-type]


def evicted(state: ClusterState) -> ClusterState:
    """Prometheus after the drain: its StatefulSet's new pod Pending (its only node cordoned)."""
    return replace(state, prometheus_node="", prometheus_ready=False)


def test_the_monitoring_pools_gate_passes_on_its_node_checks_and_prometheus_ready_not_on_alerts() -> None:
    journal, state = rollout(), monitoring()
    taken = decide(journal, state, 1.0)  # alerts not read do not hold the take back for this pool
    assert kinds(taken) == [("cordon", SET), ("drain", SET)]
    state = evicted(applied(state, taken))
    state = applied(state, decide(journal, state, 2.0))  # the upgrade: booted, Ready, still cordoned
    assert journal.of(SET).phase == "upgrading"
    gate = decide(journal, state, 3.0)
    # the node checks pass: the batch is uncordoned so Prometheus can be scheduled there again
    assert [a.kind for a in gate] == ["uncordon", "wait"] and gate[0].nodes == (NODE,)
    assert "Prometheus prometheus-0 is not bound to a node yet" in gate[1].why and DARK in gate[1].why
    assert journal.of(SET).phase == "gating" and journal.of(SET).taken == ("0",)
    state = applied(state, gate)
    waiting = decide(journal, state, 4.0)  # schedulable now; the hold put back while it is still taken
    assert kinds(waiting) == [("wait", SET), ("hold", SET)] and "not bound" in waiting[0].why
    state = applied(state, waiting)
    state = replace(state, prometheus_node=NODE)  # scheduled, not Ready yet
    assert f"Prometheus prometheus-0 on {NODE} is not Ready yet" in decide(journal, state, 5.0)[0].why
    state = replace(state, prometheus_ready=True)
    assert "held 0 of 600 s" in decide(journal, state, 6.0)[0].why
    assert decide(journal, replace(state, prometheus_ready=False), 7.0)[0].kind == "wait"
    assert "held 0 of 600 s" in decide(journal, state, 8.0)[0].why  # a lapse starts the hold again
    assert decide(journal, state, 8.0 + 599)[0].kind == "wait"
    done = decide(journal, state, 8.0 + 600)
    assert kinds(done) == [("uncordon", SET), ("done", "")] and journal.of(SET).phase == "done"


def test_prometheus_that_never_comes_back_fails_the_gate_with_its_nodes_left_as_they_are() -> None:
    journal, state = rollout(gate_timeout_s=3600), monitoring()
    state = evicted(applied(state, decide(journal, state, 1.0)))
    state = applied(state, decide(journal, state, 2.0))
    state = applied(state, decide(journal, state, 3.0))  # uncordoned for Prometheus
    failed = decide(journal, state, 3.0 + 3601)
    assert kinds(failed) == [("pause", SET)] and "not bound to a node yet" in journal.paused
    unknown = monitoring(prometheus_unknown="monitoring/prometheus-*: ApiException: 403")
    journal = rollout()
    unknown = evicted(applied(unknown, decide(journal, unknown, 1.0)))
    unknown = applied(unknown, decide(journal, unknown, 2.0))
    assert "Prometheus unknown (monitoring/prometheus-*: ApiException: 403)" in decide(journal, unknown, 3.0)[-1].why


def test_without_the_option_the_pools_alerts_still_gate_it_and_block_when_unread() -> None:
    journal, state = rollout(without_alerts=""), monitoring(alerts_unknown="Prometheus at monitoring/prometheus:web: "
                                                                          "ApiException: 503")
    [wait] = decide(journal, state, 1.0)
    assert wait.kind == "wait" and "alerts unknown" in wait.why


def test_the_option_never_passes_another_pools_alerts() -> None:
    """A journal whose Policy names pool monitoring cannot let the alerts of any other pool go unread."""
    gpu = ScaleSet("research-7500-h100-ib-000", "h100-ib", True, (Instance("0", "n0", False, ready=True),))
    journal = Journal("research-7500", "x", Policy(order=(gpu.name,), without_alerts="monitoring", cordon_ahead=0,
                                                   hold_s=0, steer=False))
    [wait] = decide(journal, ClusterState((gpu,), alerts_unknown=NOT_READ), 1.0)
    assert wait.kind == "wait" and f"alerts unknown ({NOT_READ})" in wait.why
    [firing] = decide(journal, ClusterState((gpu,), firing={"h100-ib": ("KilonodeGpuNodesUnhealthy",)}), 2.0)
    assert "alerts firing for pool h100-ib" in firing.why


# --- observe ---------------------------------------------------------------------------------------

def pod(name: str, node: str | None, ready: bool, deleting: bool = False) -> SimpleNamespace:
    return SimpleNamespace(
        metadata=SimpleNamespace(name=name, deletion_timestamp="2026-12-07T10:00:00Z" if deleting else None),
        spec=SimpleNamespace(node_name=node),
        status=SimpleNamespace(conditions=[SimpleNamespace(type="Ready", status="True" if ready else "False")]))


def test_observe_reads_the_prometheus_pod_never_a_terminating_one_as_ready() -> None:
    assert observe.prometheus_from_pods([]) == observe.PrometheusPod()
    assert observe.prometheus_from_pods([pod("prometheus-0", None, False)]) == observe.PrometheusPod("prometheus-0")
    assert observe.prometheus_from_pods([pod("prometheus-0", "n1", True, deleting=True)]) == observe.PrometheusPod()
    assert observe.prometheus_from_pods([pod("other-0", "n1", True), pod("prometheus-0", "n2", True)]) == \
        observe.PrometheusPod("prometheus-0", "n2", True)


def test_the_names_observe_reads_are_the_ones_kilonode_deploys() -> None:
    monitoring_module = pytest.importorskip("kilonode.k8s.monitoring")
    assert observe.PROMETHEUS_NAMESPACE == monitoring_module.NAMESPACE
    prefix = observe.PROMETHEUS_POD_PREFIX
    assert prefix == f"{monitoring_module.PROMETHEUS}-"  # StatefulSet `prometheus`, its replica 0
    key, _, value = observe.PROMETHEUS_SELECTOR.partition("=")
    assert monitoring_module.PROMETHEUS_LABELS[key] == value


# --- the CLI ---------------------------------------------------------------------------------------

def test_start_refuses_the_monitoring_pool_without_an_option_and_the_option_elsewhere(tmp_path: Path) -> None:
    path = tmp_path / "j.json"
    args = ["rollout", "start", "research-7500", "--journal", str(path)]
    refused = CliRunner().invoke(app, [*args, "--pool", "monitoring"], env=ENV)
    assert refused.exit_code == 2 and "runs the cluster's Prometheus" in refused.output
    assert "--without-alerts" in refused.output and not path.exists()
    elsewhere = CliRunner().invoke(app, [*args, "--pool", "h100-ib", "--without-alerts"], env=ENV)
    assert elsewhere.exit_code == 2 and "only for the pool that runs the cluster's Prometheus (monitoring)" in \
        elsewhere.output and not path.exists()
    both = CliRunner().invoke(app, [*args, "--pool", "monitoring", "--without-alerts", "--prometheus", "http://p:9090"],
                              env=ENV)
    assert both.exit_code == 2 and "not both" in both.output and not path.exists()


def test_start_without_alerts_records_it_and_status_and_step_say_alerting_is_dark(tmp_path: Path) -> None:
    path, state = tmp_path / "j.json", tmp_path / "state.json"
    started = CliRunner().invoke(app, ["rollout", "start", "research-7500", "--pool", "monitoring", "--journal",
                                       str(path), "--without-alerts"], env=ENV)
    assert started.exit_code == 0, started.output
    assert DARK in started.output and "history stays on its disk" in started.output
    journal = journals.load(path)
    assert journal.policy.without_alerts == "monitoring" and journal.policy.order == (SET,) and not journal.prometheus
    assert any(DARK in line for line in journal.log)
    shown = CliRunner().invoke(app, ["rollout", "status", "research-7500", "--journal", str(path)], env=ENV)
    assert f"NOTE: {DARK}" in shown.output and "gates read no alerts for pool monitoring" in shown.output
    state.write_text(observe.state_to_json(monitoring()), encoding="utf-8")
    stepped = CliRunner().invoke(app, ["rollout", "step", "research-7500", "--journal", str(path), "--state",
                                       str(state), "--dry-run"], env=ENV)
    assert stepped.exit_code == 0, stepped.output
    assert f"NOTE: {DARK}" in stepped.output and f"step: {SET}: drain 1 nodes" in stepped.output
    other = CliRunner().invoke(app, ["rollout", "step", "research-7500", "--journal", str(path), "--state",
                                     str(state), "--dry-run", "--prometheus", "http://p:9090"], env=ENV)
    assert other.exit_code == 2 and "started --without-alerts" in other.output
    assert dark_alerting("monitoring") == DARK


def test_without_alerts_waits_for_the_stacks_other_rollouts() -> None:
    """Its Prometheus is the one every other rollout's gates read: refused while one is not done."""
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        other = folder / "research-7500-h100-ib.json"
        journals.save(Journal("research-7500", "h100-ib image 1.1.0", Policy(order=("research-7500-h100-ib-000",))),
                      other)
        path = folder / "research-7500-monitoring.json"
        args = ["rollout", "start", "research-7500", "--pool", "monitoring", "--journal", str(path),
                "--without-alerts"]
        refused = CliRunner().invoke(app, args, env=ENV)
        assert refused.exit_code == 2 and "research-7500-h100-ib.json (h100-ib image 1.1.0) is not done" in \
            " ".join(refused.output.split())
        done = journals.load(other)
        done.of("research-7500-h100-ib-000").phase = "done"
        journals.save(done, other)
        assert CliRunner().invoke(app, args, env=ENV).exit_code == 0
