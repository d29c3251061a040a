"""alertmanager (kilonode.preflight.checks.alertmanager): a shipped stack, which names no receiver, warns that
nothing pages; the same stack with receivers set does not; and seeded breaks in the recorded graph (the
critical route sent to a receiver without integrations, Prometheus's `alerting:` block removed) each warn."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from kilonode.config import stack_from_value
from kilonode.paths import EXAMPLE_STACKS_DIR
from kilonode.plan import defaults, plan_stack
from kilonode.preflight import breaks, run
from kilonode.preflight.checks.alertmanager import METRIC_ALERT
from kilonode.preflight.load import from_parts
from kilonode.preflight.model import Inputs
from kilonode.preflight.prometheus import CONFIG_MAP
from tests import shared
from tests.graphcache import recorded_program
from tests.preflight.conftest import artefacts, inputs_of, resource

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

CHECK = ["alertmanager"]


def with_receivers_inputs(heartbeat: bool = True) -> Inputs:
    """The local stack with PagerDuty, a webhook and (by default) a heartbeat set (its graph recorded by the
    program under mocks)."""
    raw = shared.cluster_value("local")
    raw["alerting"] = {"pagerDuty": True, "webhookUrl": "https://alerts.example.com/hook"}
    if heartbeat:
        raw["alerting"]["heartbeatUrl"] = "https://heartbeat.example.com/ping/0c1f"
    graph = recorded_program("local", raw).to_json()
    files, _ = artefacts("local")
    stack = stack_from_value("local", raw, EXAMPLE_STACKS_DIR / "Pulumi.local.yaml")
    return from_parts(plan_stack(stack), files, graph, source="local+alerting")


def test_a_shipped_stack_warns_that_nothing_pages_or_that_nothing_watches_the_watcher(shipped: str) -> None:
    # the NAT gateways' Azure alerts without an action group warn apart (tests/preflight/test_nat_alert_actions.py)
    [finding] = [f for f in run(inputs_of(shipped), CHECK) if not f.where.startswith(METRIC_ALERT)]
    assert finding.level == "warn"
    assert finding.where == "ConfigMap monitoring/alertmanager alertmanager.yml"
    if shipped == "research-7500":  # it pages through PagerDuty, and sets no heartbeat
        assert "no dead man's switch" in finding.what and "'kilonode-heartbeat'" in finding.what
        assert "heartbeatUrl" in finding.fix
    else:
        assert "nothing pages" in finding.what and "'kilonode-page'" in finding.what
        assert "alerting" in finding.fix and "alertingPagerDutyRoutingKey" in finding.fix


def test_receivers_without_a_heartbeat_warn_of_the_dead_mans_switch_alone() -> None:
    [finding] = run(with_receivers_inputs(heartbeat=False), CHECK)
    assert "no dead man's switch" in finding.what and "KilonodeWatchdog" in finding.what


def test_with_receivers_set_it_says_nothing() -> None:
    assert run(with_receivers_inputs(), CHECK) == []


def _alertmanager_yml(graph: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    data = resource(graph, "ConfigMap", defaults.ALERTMANAGER_NAME)["inputs"]["data"]
    return data, yaml.safe_load(data[defaults.ALERTMANAGER_CONFIG_FILE])


def test_a_critical_route_to_a_receiver_without_integrations_warns_though_the_stack_has_receivers() -> None:
    inputs = with_receivers_inputs()
    graph = {"resources": [{"type": r.type, "name": r.name, "inputs": r.inputs} for r in inputs.resources]}
    data, config = _alertmanager_yml(graph)
    config["receivers"].append({"name": "blackhole"})
    [critical] = [r for r in config["route"]["routes"] if r["matchers"] == ['severity="critical"']]
    critical["receiver"] = "blackhole"  # the seeded break
    data[defaults.ALERTMANAGER_CONFIG_FILE] = yaml.safe_dump(config)
    broken = from_parts(inputs.plan, inputs.files, graph, source="seeded")
    [finding] = run(broken, CHECK)
    assert "'blackhole'" in finding.what and finding.level == "warn"


def test_a_prometheus_that_names_no_alertmanager_warns() -> None:
    files, graph = artefacts("local")
    [data] = [r["inputs"]["data"] for r in graph["resources"] if r["type"] == CONFIG_MAP
              and defaults.PROMETHEUS_CONFIG_FILE in (r["inputs"].get("data") or {})]
    config = yaml.safe_load(data[defaults.PROMETHEUS_CONFIG_FILE])
    del config["alerting"]  # the seeded break
    data[defaults.PROMETHEUS_CONFIG_FILE] = yaml.safe_dump(config)
    findings = run(inputs_of("local", files=files, graph=graph), CHECK)
    assert any("names no Alertmanager" in f.what and f.where.endswith("prometheus.yml") for f in findings)
    assert len(findings) == 3  # and the shipped stack's own warnings: no receiver, NAT alerts with no action


# --- its contract (catalog/contracts.yaml alertmanager): each line broken in the recorded graph ---------------------
@pytest.mark.parametrize(("flag", "line"), [("--storage.path=/alertmanager", "alertmanager/writable-storage"),
                                            ("--cluster.listen-address=", "alertmanager/single-replica-no-gossip")])
def test_each_contract_line_finds_its_seeded_break(flag: str, line: str) -> None:
    files, graph = artefacts("local")
    assert not [f for f in breaks(run(inputs_of("local"), ["contracts"])) if "alertmanager/" in f.what]
    [container] = resource(graph, "StatefulSet", defaults.ALERTMANAGER_NAME)["inputs"]["spec"]["template"]["spec"][
        "containers"]
    container["args"] = [a for a in container["args"] if a != flag]  # the seeded break
    found = [f for f in breaks(run(inputs_of("local", files=files, graph=graph), ["contracts"]))
             if f"contract line {line}" in f.what]
    assert len(found) == 1 and found[0].where.startswith("StatefulSet monitoring/alertmanager")


def test_a_cluster_that_pages_but_sends_its_warnings_nowhere_warns() -> None:
    raw = shared.cluster_value("local")
    raw["alerting"] = {"pagerDuty": True, "heartbeatUrl": "https://heartbeat.example.com/ping/0c1f"}
    graph = recorded_program("local", raw).to_json()
    files, _ = artefacts("local")
    stack = stack_from_value("local", raw, EXAMPLE_STACKS_DIR / "Pulumi.local.yaml")
    # the NAT gateways' Azure alerts without an action group warn apart (no webhook)
    [finding] = [f for f in run(from_parts(plan_stack(stack), files, graph, source="local+pagerduty"), CHECK)
                 if not f.where.startswith(METRIC_ALERT)]
    assert "severity=warning" in finding.what and "'kilonode-notify'" in finding.what
    assert "pagerDutyWarnings" in finding.fix
    # with pagerDutyWarnings the warnings reach PagerDuty as low-urgency events: nothing to say
    raw["alerting"]["pagerDutyWarnings"] = True
    graph = recorded_program("local", raw).to_json()
    stack = stack_from_value("local", raw, EXAMPLE_STACKS_DIR / "Pulumi.local.yaml")
    assert [f for f in run(from_parts(plan_stack(stack), files, graph, source="local+warnings"), CHECK)
            if not f.where.startswith(METRIC_ALERT)] == []
