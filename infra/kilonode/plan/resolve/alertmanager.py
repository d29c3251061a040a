"""Where the cluster's Alertmanager sends alerts: the stack's `alerting`, as the plan carries it
(kilonode.render.alertmanager renders alertmanager.yml from it; the secrets stay out of the plan)."""

from __future__ import annotations

from kilonode.catalog.nat_gateway_alerts import nat_gateway_alerts
from kilonode.config.model import ClusterConfig
from kilonode.plan.model import AlertingPlan, EgressAlertPlan


def alerting_plan(config: ClusterConfig) -> AlertingPlan | None:
    """None: no receiver (Alertmanager runs and sends nothing; preflight warns)."""
    a = config.alerting
    if a is None or not (a.pager_duty or a.webhook_url is not None or a.heartbeat_url is not None
                         or a.azure_alert_emails):
        return None
    return AlertingPlan(pager_duty=a.pager_duty, pager_duty_warnings=a.pager_duty_warnings, webhook_url=a.webhook_url,
                        webhook_bearer_token=a.webhook_bearer_token, heartbeat_url=a.heartbeat_url,
                        azure_alert_emails=a.azure_alert_emails)


def egress_alerts() -> tuple[EgressAlertPlan, ...]:
    """The metric alerts every NAT gateway gets: Microsoft's recommended ones, from the catalogue
    (catalog/nat_gateway_alerts.yaml, each with its source); the same for every stack."""
    catalogue = nat_gateway_alerts()
    return tuple(
        EgressAlertPlan(key=row.key, metric=row.metric, namespace=str(catalogue.namespace.value),
                        aggregation=row.aggregation, dimension=row.dimension, dimension_values=row.dimension_values,
                        operator=row.operator, threshold=row.threshold, window=row.window, frequency=row.frequency,
                        severity=row.severity, summary=row.summary)
        for row in catalogue.alerts
    )
