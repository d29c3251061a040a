"""Azure Monitor's NAT gateway metrics and the alerts Microsoft recommends on them
(nat_gateway_alerts.yaml), each with its source; read by kilonode.azure.egress_alerts."""

from __future__ import annotations

from functools import cache
from typing import Literal

from kilonode.catalog import CATALOG_DIR, Row, load


class Fact(Row):
    value: str | int
    source: str


class MetricAlertRow(Row):
    key: str  # the rule's name is <NAT gateway's name>-<key>
    metric: str  # the metric's name in the REST API
    aggregation: Literal["Average", "Minimum", "Maximum", "Total", "Count"]
    dimension: str | None = None
    dimension_values: tuple[str, ...] = ()
    operator: Literal["GreaterThan", "GreaterThanOrEqual", "LessThan", "LessThanOrEqual", "Equals"]
    threshold: float
    window: str  # ISO 8601: the lookback the aggregation covers
    frequency: str  # ISO 8601: how often Azure evaluates it
    severity: Literal[0, 1, 2, 3, 4]
    summary: str  # the rule's description
    why: str  # why this severity
    source: str


class NatGatewayAlerts(Row):
    namespace: Fact
    connections_per_destination_per_ip: Fact
    connections_per_gateway: Fact
    alerts: tuple[MetricAlertRow, ...]


@cache
def nat_gateway_alerts() -> NatGatewayAlerts:
    return load(NatGatewayAlerts, CATALOG_DIR / "nat_gateway_alerts.yaml")
