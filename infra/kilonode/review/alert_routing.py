"""alert-grouping-off: Alertmanager's routing tree stops grouping alerts by name.

kilonode's alertmanager.yml (kilonode.render.alertmanager) groups every route by `cluster` and
`alertname` (plan defaults ALERTMANAGER_GROUP_BY): the alerts of one rule firing for many things
(each GPU, each certificate file, each etcd member) reach a person as one notification per group,
with the firing instances listed in it. A route whose `group_by` is `['...']` groups by every label,
which "effectively disables aggregation entirely, passing through all alerts as-is"
(prometheus/alertmanager docs/configuration.md, `group_by`, at v0.34.0, the pin; the same text in
api/v2/models and the operator's AlertmanagerConfig): each instance is its own notification, its own
PagerDuty incident. A `group_by` without `alertname` merges different alerts into one notification
(and, with PagerDuty, one incident whose title is the first alert's). Neither is refused by
Alertmanager or amtool; promtool never sees it.

The review reads the routing tree of every Alertmanager configuration among each side's ConfigMaps
(a YAML document with `route` and `receivers`), each route's effective `group_by` (a child route
takes its parent's unless it sets its own: config/config.go Route, "inherit"), and says, where a
route groups by name at the base and not at the head, which of the head's alerts fire per instance
(their summary or description names a per-instance label) and whether anything is sent today (the
plan's `alerting`: without a receiver Alertmanager sends nothing, the change matters from the day
one is set).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

import yaml

from kilonode.review.alerting import CONFIG_MAP, alert_rules
from kilonode.review.compare import StackDiff
from kilonode.review.finding import MEDIUM, Finding
from kilonode.review.lifecycle import load_yaml, plan_of

EVERY_LABEL = "..."
# labels an alert's text names when it fires once per such thing (kilonode's rules: a GPU, a node,
# a certificate host or file, an etcd member, an InfiniBand device, a scrape target)
PER_INSTANCE = ("gpu", "node", "host", "instance", "device", "file", "path", "UUID", "port", "job")


def _configs(entry: Mapping[str, Any] | None) -> dict[str, dict[str, Any]]:
    """"ConfigMap <ns>/<name> <key>" -> the Alertmanager configuration there."""
    found = {}
    for r in (entry or {}).get("resources", []):
        if r.get("type") != CONFIG_MAP:
            continue
        inputs = r.get("inputs") or {}
        meta = inputs.get("metadata") or {}
        for key, text in (inputs.get("data") or {}).items():
            if not isinstance(text, str) or "route" not in text or "receivers" not in text:
                continue
            try:
                doc = load_yaml(text)
            except yaml.YAMLError:  # a file Alertmanager cannot read: amtool's to say
                continue
            if isinstance(doc, Mapping) and isinstance(doc.get("route"), Mapping) and "receivers" in doc:
                name = meta.get("name", r.get("name"))
                found[f"ConfigMap {meta.get('namespace', 'default')}/{name} {key}"] = dict(doc)
    return found


def _one_name(route: Mapping[str, Any]) -> bool:
    """Whether the route takes alerts of one name only (a matcher `alertname="X"`): grouping without
    alertname there merges nothing."""
    return any(re.fullmatch(r'\s*alertname\s*=\s*"?[^"~=!]+"?\s*', str(m)) for m in route.get("matchers") or [])


def _routes(route: Mapping[str, Any], inherited: tuple[str, ...], where: str) -> Iterator[tuple[str, tuple[str, ...]]]:
    """(route's place, its effective group_by) for `route` and every route under it; a route for one
    alert name counts as grouped by it."""
    own = route.get("group_by")
    group_by = tuple(str(g) for g in own) if isinstance(own, list) else inherited
    yield where, (*group_by, "alertname") if _one_name(route) and EVERY_LABEL not in group_by else group_by
    for index, child in enumerate(route.get("routes") or []):
        if isinstance(child, Mapping):
            matchers = ", ".join(str(m) for m in child.get("matchers") or []) or f"#{index}"
            yield from _routes(child, group_by, f"{where} > route {matchers}")


def _grouped_by_name(group_by: tuple[str, ...]) -> bool:
    return EVERY_LABEL not in group_by and "alertname" in group_by


def _per_instance_alerts(entry: Mapping[str, Any] | None) -> list[str]:
    """The side's alerts whose summary or description names a per-instance label."""
    return sorted({str(rule["alert"]) for rule in alert_rules(entry) if "alert" in rule
                   and any(f"$labels.{label}" in " ".join(str(v) for v in (rule.get("annotations") or {}).values())
                           for label in PER_INSTANCE)})


def assess(diff: StackDiff) -> list[Finding]:
    base, head = _configs(diff.base), _configs(diff.head)
    findings = []
    for place, config in head.items():
        before = base.get(place)
        if before is None:
            continue
        was = dict(_routes(before["route"], (), "route"))
        lost = [(where, group_by) for where, group_by in _routes(config["route"], (), "route")
                if _grouped_by_name(was.get(where, ("alertname",))) and not _grouped_by_name(group_by)]
        if not lost:
            continue
        alerts = _per_instance_alerts(diff.head)
        shown = ", ".join(alerts[:8]) + (f" and {len(alerts) - 8} more" if len(alerts) > 8 else "")
        how = "; ".join(
            f"{where} groups by every label ('...'): each firing instance is a notification of its own"
            if EVERY_LABEL in group_by else
            f"{where} groups by {', '.join(group_by) or 'nothing'}, without alertname: different alerts share one "
            "notification" for where, group_by in lost)
        today = ("nothing is sent today (the stack has no `alerting` receiver), so this takes effect the day "
                 "one is set" if not plan_of(diff.head).get("alerting") else
                 "the stack's receivers get each of these as it fires")
        findings.append(Finding(MEDIUM, "alert-grouping-off", (
            f"{place}: {how} (prometheus/alertmanager docs/configuration.md, group_by: '...' "
            "\"effectively disables aggregation entirely, passing through all alerts as-is\"). The alerts that "
            f"fire once per GPU, node, host, member or file ({shown}) then page or notify once per instance: "
            "a fabric's GPUs or a control plane's certificate files are tens to thousands of notifications, "
            f"and PagerDuty incidents, for one cause; {today}. Keep `alertname` and `cluster` in group_by "
            "(kilonode's default) and let the notification list the instances"), (place,)))
    return findings
