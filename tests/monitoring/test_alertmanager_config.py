"""The cluster's alertmanager.yml (kilonode.render.alertmanager): Debian's amtool (`amtool check-config`,
tests.monitoring.alertmanager_tool) accepts it for every shipped stack and every receiver combination; critical
alerts route to the paging receiver and warnings to the other; the secrets appear as file paths only; and the
stack's `alerting` is validated at the boundary (kilonode.config.model.AlertingConfig)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from kilonode.config.model import ALERTING_URL_MAX, AlertingConfig, ClusterConfig
from kilonode.plan import ClusterPlan, defaults
from kilonode.plan.model import AlertingPlan
from kilonode.plan.resolve.alertmanager import alerting_plan
from kilonode.preflight.checks.alertmanager import integrations, routed_receiver
from kilonode.render import monitoring
from kilonode.render.alertmanager import alertmanager_config, alertmanager_files, config_data
from tests import shared
from tests.monitoring.alertmanager_tool import amtool_path

HOOK = "https://alerts.example.com/kilonode"
BEAT = "https://heartbeat.example.com/ping/0c1f"
VARIANTS = {
    "none": None,
    "pagerduty": AlertingPlan(pager_duty=True),
    "webhook": AlertingPlan(webhook_url=HOOK),
    "webhook-token": AlertingPlan(webhook_url=HOOK, webhook_bearer_token=True),
    "all": AlertingPlan(pager_duty=True, webhook_url=HOOK, webhook_bearer_token=True),
    "heartbeat": AlertingPlan(pager_duty=True, heartbeat_url=BEAT),
    "pagerduty-warnings": AlertingPlan(pager_duty=True, pager_duty_warnings=True),
}


@pytest.fixture(scope="session")
def amtool() -> Path:
    try:
        return amtool_path()
    except RuntimeError as error:  # `make test-artefacts` unpacks it first: never a skip
        pytest.fail(str(error))


def check_config(amtool: Path, text: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "alertmanager.yml"
    path.write_text(text)
    return subprocess.run([str(amtool), "check-config", str(path)], capture_output=True, text=True, timeout=60,
                          check=False)


def with_alerting(plan: ClusterPlan, alerting: AlertingPlan | None) -> ClusterPlan:
    return plan.model_copy(update={"alerting": alerting})


@pytest.mark.parametrize("stack", shared.SHIPPED_STACKS)
@pytest.mark.parametrize("variant", VARIANTS)
def test_amtool_check_config_accepts_it(amtool: Path, plans: dict[str, ClusterPlan], tmp_path: Path,
                                        stack: str, variant: str) -> None:
    result = check_config(amtool, alertmanager_config(with_alerting(plans[stack], VARIANTS[variant])), tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_amtool_refuses_a_broken_file_so_the_check_can_fail(amtool: Path, plans: dict[str, ClusterPlan],
                                                            tmp_path: Path) -> None:
    data = config_data(with_alerting(plans["local"], VARIANTS["webhook"]))
    data["route"]["receiver"] = "nobody"  # a route to a receiver that does not exist
    result = check_config(amtool, yaml.safe_dump(data), tmp_path)
    assert result.returncode != 0 and "nobody" in result.stdout + result.stderr
    # and the webhook's url_file, which Alertmanager 0.34 reads but Debian's 0.25 does not: why the
    # renderer keeps to `url`
    data = config_data(with_alerting(plans["local"], VARIANTS["webhook"]))
    hook = data["receivers"][1]["webhook_configs"][0]
    hook["url_file"] = hook.pop("url")
    assert check_config(amtool, yaml.safe_dump(data), tmp_path).returncode != 0


def parsed(plan: ClusterPlan, alerting: AlertingPlan | None) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(alertmanager_config(with_alerting(plan, alerting)))
    return loaded


@pytest.mark.parametrize("variant", VARIANTS)
def test_critical_pages_and_warning_goes_to_the_non_paging_receiver(plans: dict[str, ClusterPlan],
                                                                    variant: str) -> None:
    config = parsed(plans["research-7500"], VARIANTS[variant])
    assert routed_receiver(config, {"severity": "critical", "alertname": "KilonodeEtcdNoSpace"}) == "kilonode-page"
    assert routed_receiver(config, {"severity": "warning", "alertname": "KilonodeEtcdLeaderChanges"}) == \
        "kilonode-notify"
    page, notify = integrations(config, "kilonode-page"), integrations(config, "kilonode-notify")
    alerting = VARIANTS[variant]
    assert ("pagerduty_configs" in page) == bool(alerting and alerting.pager_duty)
    # a warning never pages: it reaches PagerDuty only where asked, as a `warning` event (low urgency)
    assert ("pagerduty_configs" in notify) == bool(alerting and alerting.pager_duty_warnings)
    if "pagerduty_configs" in notify:
        [event] = parsed(plans["research-7500"], alerting)["receivers"][1]["pagerduty_configs"]
        assert event["severity"] == "warning"
    assert ("webhook_configs" in notify) == ("webhook_configs" in page) == bool(alerting and alerting.webhook_url)


def test_grouping_and_timers_are_the_defaults_with_their_reasons(plans: dict[str, ClusterPlan]) -> None:
    route = parsed(plans["local"], None)["route"]
    assert route["group_by"] == ["cluster", "alertname"]
    # every series carries `cluster` (prometheus.yml's external label), so the grouping key exists
    prometheus = yaml.safe_load(monitoring.prometheus_config(plans["local"]) or "")
    assert prometheus["global"]["external_labels"] == {"cluster": plans["local"].cluster}
    assert (route["group_wait"], route["group_interval"], route["repeat_interval"]) == ("30s", "5m", "24h")
    heartbeat, critical = route["routes"]
    assert critical["repeat_interval"] == "4h" and "continue" not in critical
    # the watchdog's route comes first and keeps it: a post every 5 minutes, never a page
    assert heartbeat["matchers"] == ['alertname="KilonodeWatchdog"'] and "continue" not in heartbeat
    assert (heartbeat["group_interval"], heartbeat["repeat_interval"]) == ("1m", "5m")


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_watchdog_reaches_the_heartbeat_alone(plans: dict[str, ClusterPlan], variant: str) -> None:
    config = parsed(plans["research-7500"], VARIANTS[variant])
    # the rule's own labels: severity "none", and its alert name
    [watchdog] = [a for a in monitoring.alerts(plans["research-7500"]) if a.name == "KilonodeWatchdog"]
    labels = {"alertname": watchdog.name, "severity": watchdog.severity}
    assert routed_receiver(config, labels) == "kilonode-heartbeat"
    assert routed_receiver(config, {**labels, "severity": "critical"}) == "kilonode-heartbeat"
    [beat] = [r for r in config["receivers"] if r["name"] == "kilonode-heartbeat"]
    alerting = VARIANTS[variant]
    if alerting is not None and alerting.heartbeat_url:
        assert beat["webhook_configs"] == [{"url": BEAT, "send_resolved": False}]
    else:
        assert beat == {"name": "kilonode-heartbeat"}  # sends nothing
    # the heartbeat URL is never a page's or a warning's destination
    text = yaml.safe_dump([r for r in config["receivers"] if r["name"] != "kilonode-heartbeat"])
    assert BEAT not in text


def test_the_secrets_are_file_paths_in_the_mounted_secret_never_values(plans: dict[str, ClusterPlan]) -> None:
    config = parsed(plans["local"], VARIANTS["all"])
    page = next(r for r in config["receivers"] if r["name"] == "kilonode-page")
    assert page["pagerduty_configs"] == [{"routing_key_file": "/etc/alertmanager/secrets/pagerduty-routing-key",
                                          "send_resolved": True, "severity": "critical"}]
    [hook] = page["webhook_configs"]
    assert hook["url"] == HOOK
    assert hook["http_config"] == {"authorization": {"type": "Bearer",
                                                     "credentials_file": "/etc/alertmanager/secrets/webhook-token"}}
    text = alertmanager_config(with_alerting(plans["local"], VARIANTS["all"]))
    assert "routing_key:" not in text and "credentials:" not in text


def test_a_warning_is_held_back_only_while_the_same_alert_pages(plans: dict[str, ClusterPlan]) -> None:
    [rule] = parsed(plans["local"], None)["inhibit_rules"]
    assert rule["source_matchers"] == ['severity="critical"'] and rule["target_matchers"] == ['severity="warning"']
    assert rule["equal"][:2] == ["cluster", "alertname"]
    # every static label that keeps one alert's severities apart is in `equal` (an etcd cluster's quota alerts)
    for stack in shared.SHIPPED_STACKS:
        for alert in monitoring.alerts(plans[stack]):
            assert {k for k, _ in alert.labels} <= set(rule["equal"]), alert.name


def test_prometheus_sends_to_the_alertmanager_service_and_scrapes_it(plans: dict[str, ClusterPlan]) -> None:
    prometheus = yaml.safe_load(monitoring.prometheus_config(plans["research-7500"]) or "")
    address = f"{defaults.ALERTMANAGER_NAME}.{defaults.MONITORING_NAMESPACE}.svc:{defaults.ALERTMANAGER_PORT}"
    assert prometheus["alerting"] == {"alertmanagers": [{"static_configs": [{"targets": [address]}]}]}
    [job] = [j for j in prometheus["scrape_configs"] if j["job_name"] == monitoring.JOB_ALERTMANAGER]
    assert job["static_configs"] == [{"targets": [address]}]
    names = {a.name for a in monitoring.alerts(plans["research-7500"])}
    assert {"KilonodeAlertmanagerDown", "KilonodeAlertmanagerNotificationsFailing"} <= names


def test_no_prometheus_no_alertmanager(plans: dict[str, ClusterPlan]) -> None:
    plan = plans["local"].model_copy(update={"prometheus": None})
    assert alertmanager_files(plan) == {}
    assert not [a for a in monitoring.alerts(plan) if a.name.startswith("KilonodeAlertmanager")]


# --- the stack's `alerting` ----------------------------------------------------------------------------------
@pytest.mark.parametrize(("value", "message"), [
    ({"webhookUrl": "http://alerts.example.com/x"}, "https://"),
    ({"webhookUrl": "alerts.example.com/x"}, "https://"),
    ({"webhookUrl": "https://user:pass@alerts.example.com/x"}, "user or password"),
    ({"webhookUrl": "https://alerts.example.com/{{ .x }}"}, "'{{'"),
    ({"webhookUrl": "https://alerts.example.com/" + "a" * ALERTING_URL_MAX}, "at most"),
    ({"webhookBearerToken": True}, "webhookBearerToken without webhookUrl"),
    ({"pagerDutyWarnings": True}, "pagerDutyWarnings without pagerDuty"),
    ({"heartbeatUrl": "http://heartbeat.example.com/x"}, "https://"),
    ({"heartbeatUrl": "https://u:p@heartbeat.example.com/x"}, "user or password"),
    ({"pagerDuty": "yes"}, "boolean"),
    ({"routingKey": "abc"}, "Extra inputs"),  # no secret in the stack file
])
def test_a_bad_alerting_value_is_refused(value: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        AlertingConfig.model_validate(value)


def test_a_stack_without_alerting_dumps_as_before_and_plans_no_receiver() -> None:
    raw = shared.cluster_value("local")
    config = ClusterConfig.model_validate(raw)
    assert "alerting" not in config.model_dump(by_alias=True)
    assert alerting_plan(config) is None
    raw["alerting"] = {"pagerDuty": True, "webhookUrl": HOOK}
    config = ClusterConfig.model_validate(raw)
    assert config.model_dump(by_alias=True)["alerting"]["webhookUrl"] == HOOK
    assert alerting_plan(config) == AlertingPlan(pager_duty=True, webhook_url=HOOK)
    raw["alerting"] = {}
    assert alerting_plan(ClusterConfig.model_validate(raw)) is None  # named but empty: nothing pages
