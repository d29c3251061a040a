"""Egress alerts (kilonode.azure.egress_alerts, issue 40): Azure Monitor metric alerts on every NAT
gateway, read from the recorded graphs: the catalogue's metric, dimension and threshold on each
gateway's own ID, an action group only with a webhook to call, and a runbook for each alert."""

from __future__ import annotations

import re
from typing import Any

import pytest

from kilonode.azure import egress_alerts
from kilonode.azure.graph import Graph, Recorded
from kilonode.catalog.nat_gateway_alerts import nat_gateway_alerts
from kilonode.paths import REPO_ROOT
from tests import shared
from tests.azure.conftest import mock_id
from tests.graphcache import recorded_program

pytestmark = pytest.mark.medium  # whole-stack graphs

STACKS = list(shared.SHIPPED_STACKS)
NAT = "azure-native:network:NatGateway"
ALERT = "azure-native:monitor:MetricAlert"
GROUP = "azure-native:monitor:ActionGroup"
WEBHOOK = "https://alerts.example.com/azure"


def _with_alerting(alerting: dict[str, Any]) -> Graph:
    raw = shared.cluster_value("local")
    raw["alerting"] = alerting
    return recorded_program("local", raw)


@pytest.fixture(scope="module")
def with_webhook() -> Graph:
    return _with_alerting({"webhookUrl": WEBHOOK})


@pytest.fixture(scope="module")
def with_bearer_webhook() -> Graph:
    return _with_alerting({"webhookUrl": WEBHOOK, "webhookBearerToken": True})


def alerts_of(graph: Graph) -> dict[str, dict[str, Any]]:
    return {r.plain()["ruleName"]: r.plain() for r in graph.of_type(ALERT)}


def gateway_of(nat: Recorded) -> str:
    """The plan's gateway name (control-plane, pool-<name>) of a NAT gateway resource."""
    return re.sub(r"^.*?-network-(.*)-nat$", r"\1", nat.name)


@pytest.mark.parametrize("stack", STACKS)
def test_every_nat_gateway_has_each_catalogue_alert_scoped_to_its_own_id(graphs: dict[str, Graph],
                                                                        stack: str) -> None:
    graph = graphs[stack]
    alerts = alerts_of(graph)
    nats = graph.of_type(NAT)
    rows = nat_gateway_alerts().alerts
    assert nats and len(alerts) == len(nats) * len(rows)
    cluster = shared.plan(stack).cluster
    for nat in nats:
        for row in rows:
            alert = alerts[egress_alerts.alert_name(cluster, gateway_of(nat), row.key)]
            assert alert["scopes"] == [mock_id(nat)]
            assert alert["location"] == "global" and alert["enabled"] and alert["autoMitigate"]
            assert (alert["evaluationFrequency"], alert["windowSize"]) == (row.frequency, row.window)


@pytest.mark.parametrize("stack", STACKS)
def test_the_snat_alert_counts_failed_connections_and_the_datapath_alert_averages_below_90(
        graphs: dict[str, Graph], stack: str) -> None:
    alerts = alerts_of(graphs[stack])
    snat = [a for name, a in alerts.items() if name.endswith("-nat-snat-failed")]
    datapath = [a for name, a in alerts.items() if name.endswith("-nat-datapath")]
    assert snat and len(snat) == len(datapath)
    for alert in snat:
        [criterion] = alert["criteria"]["allOf"]
        assert alert["criteria"]["odataType"] == "Microsoft.Azure.Monitor.SingleResourceMultipleMetricCriteria"
        assert (criterion["metricName"], criterion["metricNamespace"]) == (
            "SNATConnectionCount", "Microsoft.Network/natGateways")
        assert (criterion["timeAggregation"], criterion["operator"], criterion["threshold"]) == (
            "Total", "GreaterThan", 0)
        assert criterion["dimensions"] == [{"name": "ConnectionState", "operator": "Include", "values": ["Failed"]}]
        assert (alert["windowSize"], alert["severity"]) == ("PT5M", 2)
    for alert in datapath:
        [criterion] = alert["criteria"]["allOf"]
        assert criterion["metricName"] == "DatapathAvailability" and "dimensions" not in criterion
        assert (criterion["timeAggregation"], criterion["operator"], criterion["threshold"]) == (
            "Average", "LessThan", 90)
        # Microsoft: under 5 minutes gives false positives; it recommends 15
        assert (alert["windowSize"], alert["severity"]) == ("PT15M", 1)


@pytest.mark.parametrize("stack", STACKS)
def test_without_a_webhook_no_action_group_and_no_action(graphs: dict[str, Graph], stack: str) -> None:
    graph = graphs[stack]
    # no shipped stack names a webhook (research-7500 pages through PagerDuty, which Azure is not given)
    alerting = shared.plan(stack).alerting
    assert alerting is None or alerting.webhook_url is None
    assert graph.of_type(GROUP) == []
    assert all(not a.get("actions") for a in alerts_of(graph).values())


def test_a_webhook_gets_one_action_group_with_the_common_schema_that_every_alert_calls(with_webhook: Graph) -> None:
    [group] = with_webhook.of_type(GROUP)
    inputs = group.plain()
    assert inputs["actionGroupName"] == "local-egress-alerts" and inputs["location"] == "global"
    assert 1 <= len(inputs["groupShortName"]) <= egress_alerts.SHORT_NAME_MAX
    assert inputs["webhookReceivers"] == [{"name": egress_alerts.WEBHOOK_RECEIVER, "serviceUri": WEBHOOK,
                                           "useAadAuth": False, "useCommonAlertSchema": True}]
    # nothing else receives, and no secret is written into Azure
    assert {k for k in inputs if k.endswith("Receivers")} == {"webhookReceivers"}
    alerts = alerts_of(with_webhook)
    assert alerts
    for name, alert in alerts.items():
        [action] = alert["actions"]
        assert action["actionGroupId"] == mock_id(group), name
        assert action["webHookProperties"]["runbook"] == egress_alerts.RUNBOOK


def test_a_webhook_that_wants_a_bearer_token_gets_no_action_group(with_bearer_webhook: Graph) -> None:
    # Azure's webhook sends no header of ours; the token in the URL would be a secret in Azure
    assert with_bearer_webhook.of_type(GROUP) == []
    assert all(not a.get("actions") for a in alerts_of(with_bearer_webhook).values())
    assert "bearer" not in str([r.plain() for r in with_bearer_webhook.of_type(ALERT)]).lower()


def test_the_short_name_fits_12_characters_for_the_longest_cluster_name() -> None:
    longest = "k" * 31 + "1"
    assert egress_alerts.short_name(longest) == longest[:12]
    assert egress_alerts.short_name("abcdefghijk-x") == "abcdefghijk"  # no trailing hyphen


def test_every_alert_names_a_runbook_section_that_exists(graphs: dict[str, Graph]) -> None:
    doc, _, anchor = egress_alerts.RUNBOOK.partition("#")
    text = (REPO_ROOT / doc).read_text(encoding="utf-8")
    anchors = {re.sub(r"[^a-z0-9 -]", "", h.lower()).strip().replace(" ", "-")
               for h in re.findall(r"^#+ (.+)$", text, flags=re.M)}
    assert anchor in anchors
    for graph in graphs.values():
        for alert in alerts_of(graph).values():
            assert alert["description"].endswith(f"Runbook: {egress_alerts.RUNBOOK}")
    # and each catalogue alert is named in that section
    section = text.split("## NAT gateway: outbound connections", 1)[1].split("\n## ", 1)[0]
    for row in nat_gateway_alerts().alerts:
        assert f"-nat-{row.key}" in section, row.key


def test_e_mail_addresses_get_the_action_group_with_one_receiver_each() -> None:
    # the NAT gateways' alerts reach people (or an incident tool's e-mail integration) without a webhook
    graph = _with_alerting({"pagerDuty": True, "azureAlertEmails": ["oncall@example.com", "gpu-infra@example.com"]})
    [group] = graph.of_type(GROUP)
    inputs = group.plain()
    assert inputs["emailReceivers"] == [
        {"name": "alerting-email-0", "emailAddress": "oncall@example.com", "useCommonAlertSchema": True},
        {"name": "alerting-email-1", "emailAddress": "gpu-infra@example.com", "useCommonAlertSchema": True}]
    assert "webhookReceivers" not in inputs
    assert all(a["actions"][0]["actionGroupId"] == mock_id(group) for a in alerts_of(graph).values())


@pytest.mark.parametrize(("emails", "message"), [
    (["not-an-address"], "not an e-mail address"),
    (["a@example.com", "a@example.com"], "listed twice"),
    ([f"p{i}@example.com" for i in range(11)], "at most 10"),
])
def test_a_bad_address_list_is_refused(emails: list[str], message: str) -> None:
    from pydantic import ValidationError

    from kilonode.config.model import AlertingConfig
    with pytest.raises(ValidationError, match=message):
        AlertingConfig.model_validate({"azureAlertEmails": emails})
