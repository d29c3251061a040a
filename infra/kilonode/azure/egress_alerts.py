"""Egress alerts: Azure Monitor metric alerts on every NAT gateway the stack creates (issue 40).

A NAT gateway is the only way out of its subnets (kilonode.azure.network: default outbound access
off), and nothing in the cluster sees it: its SNAT ports, its connection limits and its datapath
live in Azure, not on a node, so Prometheus has no target for them. When a pool's gateway runs out
of SNAT ports, that pool's jobs cannot open connections to the internet and nothing fires. Azure
Monitor keeps the gateway's metrics on its own (platform metrics, no diagnostic setting needed:
"Supported metrics for Microsoft.Network/natgateways"), so an Azure metric alert per gateway and
metric is what watches them.

What fires, per gateway, is the plan's `egress_alerts` (from catalog/nat_gateway_alerts.yaml):
Microsoft's own recommended alerts of "Metrics and alerts for Azure NAT Gateway"
(learn.microsoft.com/azure/nat-gateway/nat-metrics)
- `<cluster>-<gateway>-nat-snat-failed`: SNATConnectionCount, ConnectionState = Failed, total > 0 over
  5 minutes (SNAT port exhaustion, or the gateway's connection limits);
- `<cluster>-<gateway>-nat-datapath`: DatapathAvailability, average < 90 over 15 minutes.
docs/monitoring.md, "NAT gateway: outbound connections", is the runbook of both.

Where they go: with the stack's `alerting.webhookUrl`, one action group (`<cluster>-egress-alerts`)
with a webhook receiver to that URL, the common alert schema on: Azure posts Azure's JSON
("Common alert schema", alerts-common-schema.md), not Alertmanager's, so the endpoint must read it.
With `alerting.azureAlertEmails`, the same action group e-mails each address (the common alert
schema, so an incident tool's e-mail integration reads it too). Without either, or with only a webhook
that wants a bearer token (`alerting.webhookBearerToken`), no action group: an action group's webhook
sends no header of one's own (its only authentication is Microsoft Entra's, the "Secure Webhook":
action-groups.md), and the token put into the URL would be a secret written into an Azure resource
anyone with Reader on the group reads. The alerts then fire in Azure alone: the portal's Alerts page
and `az monitor metrics alert list` (docs/monitoring.md says so).
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
from pulumi_azure_native import monitor

from kilonode.azure.common import tags
from kilonode.plan.model import ClusterPlan, EgressAlertPlan

# The runbook every alert names (its description; the webhook's custom properties).
RUNBOOK = "docs/monitoring.md#nat-gateway-outbound-connections"
# An action group's short name: at most 12 characters (Microsoft.Insights/actionGroups groupShortName,
# "Constraints: Max length = 12", the ARM template reference); used in SMS and e-mail only.
SHORT_NAME_MAX = 12
WEBHOOK_RECEIVER = "alerting-webhook"
EMAIL_RECEIVER = "alerting-email-{}"  # one per address, by its place in the stack's list
# Metric alerts and action groups are global resources: ARM takes them at `global` whatever region
# the scoped resource is in (alerts-metric-create-templates.md: "location": "global").
GLOBAL = "global"
ROLE = "egress-alerts"


@dataclass(frozen=True)
class EgressAlertsArgs:
    plan: ClusterPlan
    resource_group_name: pulumi.Input[str]
    # gateway name (NatGatewayPlan.name: control-plane, pool-<name>) -> its Azure resource ID
    nat_gateway_ids: dict[str, pulumi.Output[str]]


def alert_name(cluster: str, gateway: str, key: str) -> str:
    """A metric alert's Azure name: stable, from the cluster, the gateway and the catalogue row.
    Azure's rule for Microsoft.Insights/metricAlerts: 1-260 characters, none of *#&+:<>?@%{}\\/,
    not ending in a space or period (resource-name-rules.md); a cluster and a pool name are
    lowercase letters, digits and hyphens (kilonode.config.model)."""
    return f"{cluster}-{gateway}-nat-{key}"


def action_group_name(cluster: str) -> str:
    return f"{cluster}-{ROLE}"


def short_name(cluster: str) -> str:
    """The action group's short name: the cluster's, cut to SHORT_NAME_MAX."""
    return cluster[:SHORT_NAME_MAX].rstrip("-")


def webhook_target(plan: ClusterPlan) -> str | None:
    """The URL Azure's alerts are posted to, or None (the module docstring says when)."""
    alerting = plan.alerting
    if alerting is None or alerting.webhook_url is None or alerting.webhook_bearer_token:
        return None
    return alerting.webhook_url


def _criterion(row: EgressAlertPlan) -> monitor.MetricCriteriaArgs:
    dimensions = [monitor.MetricDimensionArgs(name=row.dimension, operator="Include",
                                              values=list(row.dimension_values))] if row.dimension else None
    return monitor.MetricCriteriaArgs(
        criterion_type="StaticThresholdCriterion", name=row.key, metric_name=row.metric,
        metric_namespace=row.namespace, time_aggregation=row.aggregation, operator=row.operator,
        threshold=row.threshold, dimensions=dimensions,
    )


class EgressAlerts(pulumi.ComponentResource):
    # alert name -> the metric alert (tests and the docs read the names)
    alerts: dict[str, monitor.MetricAlert]
    action_group: monitor.ActionGroup | None

    def __init__(self, name: str, args: EgressAlertsArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("kilonode:azure:EgressAlerts", name, None, opts)
        plan = args.plan
        child = pulumi.ResourceOptions(parent=self)
        resource_tags = tags(plan.cluster, ROLE)
        self.action_group = self._action_group(name, plan, args.resource_group_name)
        self.alerts = {}
        for gateway in plan.network.nat_gateways:
            for row in plan.egress_alerts:
                rule = alert_name(plan.cluster, gateway.name, row.key)
                actions = None
                if self.action_group is not None:
                    # custom properties appended to the payload: what to open first (no secret)
                    actions = [monitor.MetricAlertActionArgs(
                        action_group_id=self.action_group.id,
                        web_hook_properties={"cluster": plan.cluster, "natGateway": gateway.name,
                                             "runbook": RUNBOOK})]
                self.alerts[rule] = monitor.MetricAlert(
                    # the gateway's name last: no word of ours follows a pool's name (config.checks)
                    f"{name}-{row.key}-{gateway.name}",
                    rule_name=rule,
                    resource_group_name=args.resource_group_name,
                    location=GLOBAL,
                    description=f"{plan.cluster}, NAT gateway {gateway.name}: {row.summary}. Runbook: {RUNBOOK}",
                    severity=row.severity,
                    enabled=True,
                    scopes=[args.nat_gateway_ids[gateway.name]],
                    evaluation_frequency=row.frequency,
                    window_size=row.window,
                    criteria=monitor.MetricAlertSingleResourceMultipleMetricCriteriaArgs(
                        odata_type="Microsoft.Azure.Monitor.SingleResourceMultipleMetricCriteria",
                        all_of=[_criterion(row)],
                    ),
                    # resolved by Azure once the condition clears (and posted again, resolved)
                    auto_mitigate=True,
                    actions=actions,
                    tags=resource_tags,
                    opts=child,
                )
        self.register_outputs({"alerts": list(self.alerts)})

    def _action_group(self, name: str, plan: ClusterPlan,
                      resource_group_name: pulumi.Input[str]) -> monitor.ActionGroup | None:
        """The one action group, with the webhook receiver and the e-mail receivers; None with neither."""
        url = webhook_target(plan)
        emails = plan.alerting.azure_alert_emails if plan.alerting is not None else ()
        if url is None and not emails:
            return None
        group = action_group_name(plan.cluster)
        return monitor.ActionGroup(
            f"{name}-group",
            action_group_name=group,
            resource_group_name=resource_group_name,
            location=GLOBAL,
            group_short_name=short_name(plan.cluster),
            enabled=True,
            webhook_receivers=[monitor.WebhookReceiverArgs(
                name=WEBHOOK_RECEIVER, service_uri=url, use_common_alert_schema=True, use_aad_auth=False)]
            if url is not None else None,
            email_receivers=[monitor.MicrosoftCommonEmailReceiverArgs(
                name=EMAIL_RECEIVER.format(index), email_address=address, use_common_alert_schema=True)
                for index, address in enumerate(emails)] or None,
            tags=tags(plan.cluster, ROLE),
            opts=pulumi.ResourceOptions(parent=self),
        )
