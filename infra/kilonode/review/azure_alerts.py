"""metric-alert-blind-gaps: an Azure Monitor metric alert evaluated less often than the window it looks back over.

From the eighteenth independent trace on research-7500 (PR 12): the SNAT-failure alerts' evaluationFrequency PT1M ->
PT15M with windowSize PT5M read only as a catalogue fact changed. A metric alert rule runs every evaluationFrequency
and, each time, checks the metric's values over the last windowSize (Microsoft Learn, "Understand how metric alerts
work in Azure Monitor" (azure-monitor/alerts/alerts-metric-overview): "Period (the look back window over which metric
values are checked)", "Frequency (the frequency with which the metric alert checks if the conditions are met)"; its
example runs every 1 min over the last 5 minutes). With the frequency longer than the window, the minutes between one
window's start and the previous evaluation are checked by no evaluation: (frequency - window) of each cycle is blind,
and a condition that holds only then (a burst of failed SNAT connections, an availability dip) never fires. Judged on
each side's recorded MetricAlert inputs, for a rule whose gap is new or grew; medium, high where the rule's severity
is 0 to 2 (Critical, Error, Warning: what the stack routes to people).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from kilonode.review.compare import DELETE, StackDiff
from kilonode.review.finding import HIGH, MEDIUM, Finding

METRIC_ALERT = "azure-native:monitor:MetricAlert"
_ISO = re.compile(r"^P(?:(\d+)D)?(?:T(?:(\d+)H)?(?:(\d+)M)?(?:(\d+)S)?)?$")


def iso_seconds(text: Any) -> int | None:
    """An ISO 8601 duration as the alert API takes it (PT1M, PT15M, PT1H, P1D) in seconds; None otherwise."""
    found = _ISO.match(str(text or ""))
    if not found or not any(found.groups()):
        return None
    days, hours, minutes, seconds = (int(g) if g else 0 for g in found.groups())
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds


def gap(inputs: Mapping[str, Any] | None) -> int:
    """Seconds of each evaluation cycle no evaluation's window covers (0 where the window covers the cycle)."""
    frequency = iso_seconds((inputs or {}).get("evaluationFrequency"))
    window = iso_seconds((inputs or {}).get("windowSize"))
    if frequency is None or window is None:
        return 0
    return max(0, frequency - window)


def assess(diff: StackDiff) -> list[Finding]:
    groups: dict[tuple[str, str, int], list[tuple[str, int]]] = {}
    for c in diff.resources:
        if c.type != METRIC_ALERT or c.action == DELETE or c.head is None:
            continue
        inputs = c.head.get("inputs") or {}
        if inputs.get("enabled") is False:
            continue
        now = gap(inputs)
        if now <= gap((c.base or {}).get("inputs")):
            continue
        severity = inputs.get("severity")
        key = (str(inputs.get("evaluationFrequency")), str(inputs.get("windowSize")), now)
        groups.setdefault(key, []).append((str(inputs.get("ruleName") or c.name),
                                           severity if isinstance(severity, int) else 3))
    found = []
    for (frequency, window, blind), rules in sorted(groups.items()):
        paging = sorted(name for name, severity in rules if severity <= 2)
        cycle = blind + (iso_seconds(window) or 0)
        found.append(Finding(HIGH if paging else MEDIUM, "metric-alert-blind-gaps", (
            f"Azure Monitor metric alert(s) {', '.join(sorted(n for n, _ in rules))} evaluate every {frequency} over "
            f"the last {window} only: {blind // 60} min of every {cycle // 60} min is looked at by no evaluation, so "
            "a condition that holds only in those minutes (a burst, a dip shorter than the cycle) never fires "
            "(Microsoft Learn, \"Understand how metric alerts work in Azure Monitor\": the rule runs every Frequency "
            "and checks the values over the last Period)"
            + (("; every one of them is severity 0-2 (Critical, Error, Warning)" if len(paging) == len(rules)
                else f"; severity 0-2 (Critical, Error, Warning): {', '.join(paging)}") if paging else "")
            + ". Keep the evaluation frequency at or below the window (or widen the window to the frequency)"),
            tuple(sorted(n for n, _ in rules)), cause=f"metric alerts every {frequency} over {window}"))
    return found
