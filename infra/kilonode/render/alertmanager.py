"""The cluster's Alertmanager configuration (alertmanager.yml), built as data from the plan and
serialised: where alerts go (the stack's `alerting`, AlertingPlan), how they are grouped and how
often they repeat (kilonode.plan.defaults.alertmanager, each timer with its reason). Pure: plan in,
text out; kilonode.k8s.alertmanager mounts it.

    alertmanager_config(plan) -> str   # alertmanager.yml (checked by amtool check-config in the tests)

Routing: every alert to RECEIVER_NOTIFY (the webhook, if any, and with pagerDutyWarnings PagerDuty as a
low-urgency `warning` event); `severity="critical"` to RECEIVER_PAGE (PagerDuty, if any, and the webhook);
KilonodeWatchdog, the dead man's switch, to RECEIVER_HEARTBEAT alone (the stack's heartbeatUrl, if any), every
HEARTBEAT_REPEAT. A receiver with no integration is valid and sends nothing
(prometheus/alertmanager config/config.go Receiver.UnmarshalYAML l.1006 at v0.34.0: a receiver needs
only its name), so with no receiver configured Alertmanager still takes, groups and shows every alert
(its UI and API) and preflight warns that nothing pages (kilonode.preflight.checks.alertmanager).

Secrets are files: PagerDuty's `routing_key_file` and the webhook's `http_config.authorization.
credentials_file` name paths in the receivers' Secret's mount, so this file (a ConfigMap, the recorded
graph, the review, the goldens) holds none. Only keys that both Alertmanager v0.34.0 (the pin) and
Debian's amtool 0.25 (the tests' checker) read are written: `routing_key_file` (notify/pagerduty/config.go
at v0.34.0; config/notifiers.go PagerdutyConfig at v0.25.0), `credentials_file` (prometheus/common's
HTTPClientConfig Authorization in both), `matchers`/`source_matchers`/`target_matchers` (v0.22 and
later). Not the webhook's `url_file`: v0.25's WebhookConfig has only `url` and refuses an unknown key.
"""

from __future__ import annotations

from typing import Any

from kilonode.plan import defaults
from kilonode.plan.model import AlertingPlan, ClusterPlan
from kilonode.render.common import GENERATED
from kilonode.yamlio import block_yaml

CONFIG_FILE = defaults.ALERTMANAGER_CONFIG_FILE
PAGERDUTY_KEY_PATH = f"{defaults.ALERTMANAGER_SECRETS_DIR}/{defaults.ALERTMANAGER_PAGERDUTY_KEY_FILE}"
WEBHOOK_TOKEN_PATH = f"{defaults.ALERTMANAGER_SECRETS_DIR}/{defaults.ALERTMANAGER_WEBHOOK_TOKEN_FILE}"
CRITICAL = 'severity="critical"'
WARNING = 'severity="warning"'
WATCHDOG = f'alertname="{defaults.WATCHDOG_ALERT}"'
# A warning is not sent while a critical alert of the same name fires for the same thing: the page
# already says it. "The same thing" is every label kilonode's two-severity alerts are kept apart by
# (an etcd member: instance and cluster_role; a certificate: host; a GPU pool: pool); a label neither
# alert has counts as equal (config/common/inhibitrule.go l.46-48 at v0.34.0: "A set of labels that
# must be equal between the source and target alert").
# Every label a kilonode alert is kept apart by, including those only one severity's rule gives (a
# DaemonSet's, a node's): two alerts without the label count as equal on it, so a label missing from this
# list lets one critical DaemonSet (or node) hold back the warnings of all the others (trace 40/4).
INHIBIT_EQUAL = ("cluster", "alertname", "cluster_role", "instance", "host", "pool", "daemonset", "deployment",
                 "namespace", "node", "gpu", "device", "port", "to", "integration")


def _webhook(alerting: AlertingPlan) -> dict[str, Any]:
    config: dict[str, Any] = {"url": alerting.webhook_url, "send_resolved": True}
    if alerting.webhook_bearer_token:
        config["http_config"] = {"authorization": {"type": "Bearer", "credentials_file": WEBHOOK_TOKEN_PATH}}
    return config


def receivers(alerting: AlertingPlan | None) -> list[dict[str, Any]]:
    """RECEIVER_PAGE, RECEIVER_NOTIFY and RECEIVER_HEARTBEAT with the integrations the stack names
    (none: name only)."""
    page: dict[str, Any] = {"name": defaults.RECEIVER_PAGE}
    notify: dict[str, Any] = {"name": defaults.RECEIVER_NOTIFY}
    heartbeat: dict[str, Any] = {"name": defaults.RECEIVER_HEARTBEAT}
    if alerting is not None and alerting.heartbeat_url is not None:
        # its end is the outside monitor's silence, never a "resolved" post
        heartbeat["webhook_configs"] = [{"url": alerting.heartbeat_url, "send_resolved": False}]
    if alerting is not None and alerting.pager_duty:
        # Events API v2 (the routing key); a resolved alert resolves the incident. The event's severity sets the
        # incident's urgency where the service uses dynamic notifications (critical: high; warning: low, never
        # escalated: PagerDuty's Dynamic Notifications); Alertmanager sends "error" (high) when none is given
        # (notify/pagerduty/pagerduty.go notifyV2 at v0.34.0), so both are named.
        page["pagerduty_configs"] = [{"routing_key_file": PAGERDUTY_KEY_PATH, "send_resolved": True,
                                      "severity": "critical"}]
        if alerting.pager_duty_warnings:
            notify["pagerduty_configs"] = [{"routing_key_file": PAGERDUTY_KEY_PATH, "send_resolved": True,
                                            "severity": "warning"}]
    if alerting is not None and alerting.webhook_url is not None:
        page["webhook_configs"] = [_webhook(alerting)]
        notify["webhook_configs"] = [_webhook(alerting)]
    return [page, notify, heartbeat]


def config_data(plan: ClusterPlan) -> dict[str, Any]:
    return {
        "route": {
            "receiver": defaults.RECEIVER_NOTIFY,
            "group_by": list(defaults.ALERTMANAGER_GROUP_BY),
            "group_wait": defaults.ALERTMANAGER_GROUP_WAIT,
            "group_interval": defaults.ALERTMANAGER_GROUP_INTERVAL,
            "repeat_interval": defaults.ALERTMANAGER_REPEAT_WARNING,
            # a child route takes the parent's grouping and timers unless it sets its own
            # the first child that matches takes the alert (no `continue`): the watchdog reaches the
            # heartbeat alone
            "routes": [{"receiver": defaults.RECEIVER_HEARTBEAT, "matchers": [WATCHDOG],
                        "group_interval": defaults.HEARTBEAT_GROUP_INTERVAL,
                        "repeat_interval": defaults.HEARTBEAT_REPEAT},
                       {"receiver": defaults.RECEIVER_PAGE, "matchers": [CRITICAL],
                        "repeat_interval": defaults.ALERTMANAGER_REPEAT_CRITICAL}],
        },
        "inhibit_rules": [{"source_matchers": [CRITICAL], "target_matchers": [WARNING],
                           "equal": list(INHIBIT_EQUAL)}],
        "receivers": receivers(plan.alerting),
    }


def alertmanager_config(plan: ClusterPlan) -> str:
    """alertmanager.yml (kilonode.k8s.alertmanager mounts it at ALERTMANAGER_CONFIG_DIR)."""
    header = (f"# {GENERATED}\n"
              f"# The cluster's Alertmanager ({plan.cluster}; kilonode.render.alertmanager): critical alerts\n"
              "# page (receiver kilonode-page), every other alert goes to kilonode-notify;\n"
              "# docs/monitoring.md, \"Alertmanager\".\n")
    return header + block_yaml(config_data(plan))


def alertmanager_files(plan: ClusterPlan) -> dict[str, str]:
    """The configuration ConfigMap's data (kilonode.k8s.alertmanager); empty without a Prometheus
    of kilonode's (no pool can hold one): no Alertmanager then either."""
    return {CONFIG_FILE: alertmanager_config(plan)} if plan.prometheus is not None else {}
