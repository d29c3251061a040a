"""alertmanager (kilonode.preflight.checks.alertmanager), the NAT gateways' Azure metric alerts: a stack whose
recorded graph gives them no action group (no webhook, or a webhook with a bearer token: kilonode.azure.egress_alerts
makes none then) is warned that they fire in the portal only; with a plain webhook they have an action and nothing
is said of them."""

from __future__ import annotations

from typing import Any

import pytest

from kilonode.config import stack_from_value
from kilonode.paths import EXAMPLE_STACKS_DIR
from kilonode.plan import plan_stack
from kilonode.preflight import run
from kilonode.preflight.checks.alertmanager import METRIC_ALERT
from kilonode.preflight.load import from_parts
from kilonode.preflight.model import Finding, Inputs
from tests import shared
from tests.graphcache import recorded_program
from tests.preflight.conftest import artefacts, inputs_of

pytestmark = pytest.mark.medium  # records a stack's graph

CHECK = ["alertmanager"]
WEBHOOK = "https://alerts.example.com/hook"


def nat_findings(inputs: Inputs) -> list[Finding]:
    return [f for f in run(inputs, CHECK) if f.where.startswith(METRIC_ALERT)]


def local_with(alerting: dict[str, Any]) -> Inputs:
    raw = shared.cluster_value("local")
    raw["alerting"] = alerting
    graph = recorded_program("local", raw).to_json()
    files, _ = artefacts("local")
    stack = stack_from_value("local", raw, EXAMPLE_STACKS_DIR / "Pulumi.local.yaml")
    return from_parts(plan_stack(stack), files, graph, source="local+alerting")


def test_a_shipped_stack_without_a_webhook_warns_its_nat_alerts_fire_in_the_portal_only(shipped: str) -> None:
    [finding] = nat_findings(inputs_of(shipped))
    assert finding.level == "warn"
    assert "Azure's NAT alerts fire in the portal only" in finding.what
    assert "webhookUrl" in finding.fix and "NAT gateway: outbound connections" in finding.fix


def test_a_webhook_with_a_bearer_token_gives_no_action_group_and_warns() -> None:
    [finding] = nat_findings(local_with({"webhookUrl": WEBHOOK, "webhookBearerToken": True}))
    assert "no action group" in finding.what


def test_a_plain_webhook_gives_every_nat_alert_an_action_and_says_nothing() -> None:
    assert nat_findings(local_with({"webhookUrl": WEBHOOK})) == []


def test_one_alert_stripped_of_its_action_is_named() -> None:
    inputs = local_with({"webhookUrl": WEBHOOK})
    graph = {"resources": [{"type": r.type, "name": r.name, "inputs": dict(r.inputs)} for r in inputs.resources]}
    [first, *_] = [r for r in graph["resources"] if r["type"] == METRIC_ALERT]
    first["inputs"].pop("actions")  # the seeded break
    [finding] = nat_findings(from_parts(inputs.plan, inputs.files, graph, source="seeded"))
    assert f"{METRIC_ALERT} (1)" == finding.where and str(first["inputs"]["ruleName"]) in finding.what
