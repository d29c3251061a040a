"""Where the cluster's Alertmanager sends alerts: the stack's `alerting`, as the plan carries it
(kilonode.render.alertmanager renders alertmanager.yml from it; the secrets stay out of the plan)."""

from __future__ import annotations

from kilonode.config.model import ClusterConfig
from kilonode.plan.model import AlertingPlan


def alerting_plan(config: ClusterConfig) -> AlertingPlan | None:
    """None: no receiver (Alertmanager runs and sends nothing; preflight warns)."""
    a = config.alerting
    if a is None or not (a.pager_duty or a.webhook_url is not None):
        return None
    return AlertingPlan(pager_duty=a.pager_duty, webhook_url=a.webhook_url, webhook_bearer_token=a.webhook_bearer_token)
