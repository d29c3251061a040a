"""alertmanager: a critical alert the cluster's Prometheus fires reaches someone.

Read from the recorded graph, not the stack: the Prometheus the cluster deploys (its `alerting:` block, in
the ConfigMap key its `--config.file` names: kilonode.preflight.prometheus) and the alertmanager.yml of the
Alertmanager it sends to (any ConfigMap key holding a `route:` and `receivers:`; kilonode.render.alertmanager
writes it). Alertmanager sends an alert to the receiver of the first route that matches it, the root's when
no child does (prometheus/alertmanager dispatch/route.go Route.Match at v0.34.0, `continue` aside), and a
receiver with no `*_configs` sends nothing (config/config.go Receiver at v0.34.0: a name alone is valid).

- a Prometheus with rules and no `alerting.alertmanagers`: its alerts fire in its own UI and go nowhere
  (warn);
- the receiver a `severity="critical"` alert is routed to has no integration: Alertmanager takes, groups and
  shows every alert (its UI and API, Grafana's ALERTS) but nothing pages (warn: the stack's `alerting`,
  docs/monitoring.md "Alertmanager");
- a cluster that pages, whose warnings go to a receiver with no integration (warn: the stack's
  `alerting.pagerDutyWarnings` or `webhookUrl`);
- a cluster that pages, whose dead man's switch (KilonodeWatchdog, the rule that fires while Prometheus runs)
  is routed to a receiver with no integration: when Prometheus, Alertmanager or their node die, nothing can
  send that news, and the pager stays quiet as it does when all is well (warn: the stack's
  `alerting.heartbeatUrl`).

- the NAT gateways' Azure metric alerts (azure-native:monitor:MetricAlert, kilonode.azure.egress_alerts) with
  no action: no action group is made without the stack's `alerting.webhookUrl`, nor when it sets
  `webhookBearerToken` (an action group's webhook sends no header of its own: egress_alerts says why), so
  they fire in Azure's portal alone and reach no one (warn: research-7500's on-call trace).

All are warnings: the cluster works, and a stack may mean to watch its alerts by other means; the
finding says so before the first incident does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kilonode.plan import defaults
from kilonode.preflight.model import Finding, Inputs
from kilonode.preflight.prometheus import graph_of, load, prometheus_configs

NAME = "alertmanager"
TITLE = "a critical alert reaches a receiver that sends it somewhere (Prometheus -> Alertmanager -> pager)"
CONFIG_MAP = "kubernetes:core/v1:ConfigMap"
METRIC_ALERT = "azure-native:monitor:MetricAlert"
NAT_FIX = ("set the stack's `alerting.azureAlertEmails` (people, or an incident tool's e-mail integration), or "
           "`alerting.webhookUrl` to an endpoint that reads Azure's common alert schema and takes no bearer token, or "
           "watch Azure's Alerts page: docs/monitoring.md, \"NAT gateway: outbound connections\"")
CRITICAL = {"severity": "critical"}
WATCHDOG = {"alertname": defaults.WATCHDOG_ALERT, "severity": "none"}
WARNING = {"severity": "warning"}
WARNING_FIX = ("set the stack's `alerting.pagerDutyWarnings` (low-urgency PagerDuty events) or `alerting.webhookUrl`: "
               "docs/monitoring.md, \"Alertmanager\"")
HEARTBEAT_FIX = ("set the stack's `alerting.heartbeatUrl` to an outside heartbeat monitor (a period of 5 minutes, "
                 "10 or more of grace): docs/monitoring.md, \"The dead man's switch\"")
FIX = ("set the stack's `alerting` (pagerDuty with the Pulumi secret kilonode:alertingPagerDutyRoutingKey, "
       "and/or webhookUrl): docs/monitoring.md, \"Alertmanager\"")


def _matches(route: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """Whether a route's `matchers` (and the older `match`) take an alert with `labels`; only the
    `name="value"` and `name=value` forms kilonode writes are judged, any other matcher is taken as
    not matching (the finding then errs towards a warning)."""
    for matcher in route.get("matchers") or []:
        name, sep, value = str(matcher).partition("=")
        if not sep or name.endswith(("!", "=~", "!~")) or value.startswith("~"):
            return False
        if labels.get(name.strip()) != value.strip().strip('"'):
            return False
    return all(labels.get(k) == v for k, v in (route.get("match") or {}).items())


def routed_receiver(config: Mapping[str, Any], labels: Mapping[str, str]) -> str | None:
    """The receiver Alertmanager sends an alert with `labels` to: the first matching child's, depth
    first, else the route's own (inherited down the tree)."""
    def walk(route: Mapping[str, Any], inherited: str | None) -> str | None:
        own = route.get("receiver") or inherited
        for child in route.get("routes") or []:
            if isinstance(child, Mapping) and _matches(child, labels):
                return walk(child, own)
        return own

    route = config.get("route")
    return walk(route, None) if isinstance(route, Mapping) else None


def integrations(config: Mapping[str, Any], receiver: str | None) -> list[str]:
    """The integration kinds (pagerduty_configs, webhook_configs, ...) the named receiver has."""
    for r in config.get("receivers") or []:
        if isinstance(r, Mapping) and r.get("name") == receiver:
            return sorted(k for k, v in r.items() if k.endswith("_configs") and v)
    return []


def alertmanager_configs(inputs: Inputs) -> list[tuple[str, Mapping[str, Any]]]:
    """(where, parsed alertmanager.yml) of every ConfigMap key that is one."""
    found = []
    for r in inputs.of_type(CONFIG_MAP):
        for key, text in ((r.inputs.get("data") or {}).items()):
            config = load(text)
            if isinstance(config, Mapping) and "route" in config and "receivers" in config:
                found.append((f"{r.describe()} {key}", config))
    return found


def check(inputs: Inputs) -> list[Finding]:
    findings = []
    prometheus = prometheus_configs(graph_of(inputs))
    for where, (files, key) in sorted(prometheus.items()):
        config = load(files.get(key))
        if isinstance(config, Mapping) and config.get("rule_files") and \
                not (config.get("alerting") or {}).get("alertmanagers"):
            findings.append(Finding(NAME, "warn", where, "its rules fire but its configuration names no "
                                    "Alertmanager (no `alerting.alertmanagers`): alerts show in Prometheus's UI "
                                    "and go nowhere", FIX))
    findings += _silent_metric_alerts(inputs)
    for where, config in alertmanager_configs(inputs):
        receiver = routed_receiver(config, CRITICAL)
        if not integrations(config, receiver):
            findings.append(Finding(
                NAME, "warn", where,
                f"a severity=critical alert goes to receiver {receiver!r}, which has no integration: Alertmanager "
                "shows every alert (its UI and API, Grafana) but nothing pages anyone", FIX))
        else:
            findings += _warnings_unsent(where, config)
        if integrations(config, receiver) and not integrations(config, routed_receiver(config, WATCHDOG)):
            findings.append(Finding(
                NAME, "warn", where,
                f"no dead man's switch: {defaults.WATCHDOG_ALERT} goes to receiver "
                f"{routed_receiver(config, WATCHDOG)!r}, which has no integration: if Prometheus, Alertmanager or "
                "their node die, no alert can say so and the pager stays as quiet as when all is well",
                HEARTBEAT_FIX))
    return findings


def _warnings_unsent(where: str, config: Mapping[str, Any]) -> list[Finding]:
    """A cluster that pages, whose warnings go to a receiver with no integration."""
    receiver = routed_receiver(config, WARNING)
    if integrations(config, receiver):
        return []
    return [Finding(NAME, "warn", where, (
        f"a severity=warning alert goes to receiver {receiver!r}, which has no integration: critical alerts page, but "
        "the warnings (every GPU, Xid, ECC, NVLink, InfiniBand, thermal and conntrack alert, etcd at 70%) reach no "
        "one; a single slow node holding back a synchronous job is never said"), WARNING_FIX)]


def _silent_metric_alerts(inputs: Inputs) -> list[Finding]:
    """One finding for every Azure metric alert of the recorded graph that names no action group
    (its `actions` empty or absent): Azure evaluates it and shows it on the Alerts page, and sends it
    nowhere (Microsoft.Insights/metricAlerts `actions`: "the array of actions that are performed when
    the alert rule becomes active")."""
    silent = sorted(str(r.inputs.get("ruleName") or r.name) for r in inputs.of_type(METRIC_ALERT)
                    if not r.inputs.get("actions"))
    if not silent:
        return []
    shown = ", ".join(silent[:4]) + (f" and {len(silent) - 4} more" if len(silent) > 4 else "")
    return [Finding(NAME, "warn", f"{METRIC_ALERT} ({len(silent)})",
                    f"the NAT gateways' Azure metric alerts have no action group ({shown}): Azure's NAT alerts fire "
                    "in the portal only; SNAT exhaustion or a datapath outage reaches no one", NAT_FIX)]
