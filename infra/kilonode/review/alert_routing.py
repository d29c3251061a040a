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
from kilonode.review.finding import HIGH, MEDIUM, Finding
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


# ---- alert-inhibition-widened (trace 19, P02) -------------------------------------------------------------------
# An inhibit rule mutes a target alert while a source alert fires "with equal values on the `equal` labels"
# (prometheus/alertmanager inhibit/inhibit.go Inhibitor.Mutes and InhibitRule.hasEqual at v0.34.0, the pin; a label
# neither has counts as equal: config/config.go InhibitRule, "Labels that must have an equal value in the source and
# target alert"). kilonode's rule (kilonode.render.alertmanager INHIBIT_EQUAL) holds a warning back only while the
# same alert for the same thing pages. Fewer `equal` labels, or a new rule, mutes more: with `equal: [cluster]`, one
# critical alert anywhere mutes every warning in the cluster while it fires; amtool and Alertmanager accept it.
INHIBITION_RULE = "alert-inhibition-widened"
_MATCHER = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*"?(.*?)"?\s*$')


def _matchers(rule: Mapping[str, Any], side: str) -> tuple[str, ...]:
    """A rule's `<side>_matchers`, with the older `<side>_match`/`<side>_match_re` maps as matchers."""
    found = [str(m) for m in rule.get(f"{side}_matchers") or []]
    found += [f'{k}="{v}"' for k, v in (rule.get(f"{side}_match") or {}).items()]
    found += [f'{k}=~"{v}"' for k, v in (rule.get(f"{side}_match_re") or {}).items()]
    return tuple(sorted(found))


def _selects(matchers: tuple[str, ...], labels: Mapping[str, str]) -> bool:
    """Whether an alert with these static labels matches every matcher (a label it lacks reads as "", as
    Alertmanager's labels.Matcher does); a matcher kilonode cannot read is taken to match."""
    for matcher in matchers:
        parsed = _MATCHER.fullmatch(matcher)
        if parsed is None:
            continue
        name, op, value = parsed.groups()
        have = labels.get(name, "")
        ok = {"=": have == value, "!=": have != value}.get(op)
        if ok is None:
            try:
                ok = (re.fullmatch(value, have) is not None) == (op == "=~")
            except re.error:
                ok = True
        if not ok:
            return False
    return True


def _labels_of(rule: Mapping[str, Any]) -> dict[str, str]:
    return {**{str(k): str(v) for k, v in (rule.get("labels") or {}).items()}, "alertname": str(rule["alert"])}


def _static_labels(entry: Mapping[str, Any] | None) -> list[dict[str, str]]:
    return [_labels_of(rule) for rule in alert_rules(entry) if "alert" in rule]


def _named(alerts: list[dict[str, str]], matchers: tuple[str, ...]) -> list[str]:
    return sorted({a["alertname"] for a in alerts if _selects(matchers, a)})


def _inhibit_line(place: str, source: tuple[str, ...], target: tuple[str, ...], was: tuple[str, ...] | None,
                  now: tuple[str, ...], alerts: list[dict[str, str]]) -> str:
    sources, targets = _named(alerts, source), _named(alerts, target)

    def some(names: list[str]) -> str:
        return ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "") if names else "none"
    change = (f"a new inhibit rule ({', '.join(source) or 'any alert'} mutes {', '.join(target) or 'any alert'})"
              if was is None else
              f"the inhibit rule ({', '.join(source)} mutes {', '.join(target)}) equal {list(was)} -> {list(now)}")
    scope = ", ".join(now) or "nothing: any source mutes every target"
    return (f"{place}: {change}: a firing source now mutes each target that shares only {scope}, "
            f"not the same alert for the same thing. Sources ({len(sources)}): {some(sources)}; muted while any "
            f"of them fires ({len(targets)}): {some(targets)}")


def inhibitions_widened(diff: StackDiff) -> list[Finding]:
    """An inhibit rule whose `equal` loses a label, or a new one, in an Alertmanager configuration both sides have."""
    base, head = _configs(diff.base), _configs(diff.head)
    alerts = _static_labels(diff.head)
    said = []
    for place, config in head.items():
        before = base.get(place)
        if before is None:
            continue
        was = {(_matchers(r, "source"), _matchers(r, "target")): tuple(str(e) for e in r.get("equal") or [])
               for r in before.get("inhibit_rules") or [] if isinstance(r, Mapping)}
        for rule in config.get("inhibit_rules") or []:
            if not isinstance(rule, Mapping):
                continue
            key = (_matchers(rule, "source"), _matchers(rule, "target"))
            now = tuple(str(e) for e in rule.get("equal") or [])
            old = was.get(key)
            if old is not None and set(old) <= set(now):
                continue
            if not _named(alerts, key[1]):
                continue  # it mutes none of the head's alerts
            said.append((place, _inhibit_line(place, *key, old, now, alerts), old is not None))
    if not said:
        return []
    today = ("nothing is sent today (the stack has no `alerting` receiver), so it takes effect the day one is set"
             if not plan_of(diff.head).get("alerting") else "the stack's receivers stop getting them")
    # a rule kilonode's had, now muting more, is high; a new rule (or one whose matchers moved) is said as medium
    level = HIGH if any(widened for _, _, widened in said) else MEDIUM
    return [Finding(level, INHIBITION_RULE, (
        f"{'; '.join(line for _, line, _ in said)}. Alertmanager mutes a target while a source fires with equal "
        "values on the `equal` labels (prometheus/alertmanager inhibit/inhibit.go Inhibitor.Mutes at the pinned "
        "release): one long critical alert (an etcd member, a certificate, a pool) then hides every muted warning "
        f"in the cluster, the GPU Xid, ECC, NVLink and InfiniBand ones among them, for as long as it fires; {today}. "
        "Keep `equal` to the labels that name the same alert for the same thing (kilonode's: "
        "kilonode.render.alertmanager INHIBIT_EQUAL), or silence by hand during an incident (amtool silence add)"),
        tuple(sorted({place for place, _, _ in said})))]


# ---- alert-page-rerouted (trace 20, P08) -------------------------------------------------------------------------
# Alertmanager sends an alert down the first child route that matches it and stops there unless that child sets
# `continue` (prometheus/alertmanager dispatch/route.go Route.Match at the pinned release: "if matches != nil &&
# !cr.Continue { break }"); the route itself takes it only where no child does. A route placed before kilonode's
# paging route that can match a critical alert takes it away from the pager: amtool accepts it, nothing fires.
# The review walks both sides' trees for every critical rule of the head, with the rule's static labels (and the
# cluster's external label `cluster`) known and every other label unknown: a matcher on an unknown label may or
# may not match (the alert's expression may give it the label), so such a route may take the alert.
REROUTED_RULE = "alert-page-rerouted"


_AGGREGATION = re.compile(r"\b(?:sum|avg|max|min|count|topk|bottomk|quantile|count_values|stddev|stdvar|group)\b"
                          r"\s*(?:\(|by\b|without\b)")
_WITHOUT = re.compile(r"\bwithout\s*\(")
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _carries(rule: Mapping[str, Any]) -> frozenset[str] | None:
    """The labels a rule's alerts may carry beyond its static ones: None (any) where its expression keeps series
    labels (no aggregation, or `without`); else the words its expression and annotations name (its `by` labels
    among them), a superset of what an aggregation keeps."""
    expr = str(rule.get("expr") or "")
    if not _AGGREGATION.search(expr) or _WITHOUT.search(expr):
        return None
    text = expr + " " + " ".join(str(v) for v in (rule.get("annotations") or {}).values())
    return frozenset(_WORD.findall(text))


def _matcher_state(matcher: str, labels: Mapping[str, str], carries: frozenset[str] | None) -> str:
    """'yes', 'no' or 'maybe' (a label the alert's static labels do not fix and its expression may give it); a
    label it cannot carry reads as "" (Alertmanager's matchers on an absent label)."""
    parsed = _MATCHER.fullmatch(matcher)
    if parsed is None:
        return "maybe"
    name, _, _ = parsed.groups()
    if name not in labels:
        if carries is None or name in carries:
            return "maybe"
        labels = {**labels, name: ""}
    return "yes" if _selects((matcher,), labels) else "no"


def _route_state(route: Mapping[str, Any], labels: Mapping[str, str], carries: frozenset[str] | None) -> str:
    states = [_matcher_state(m, labels, carries) for m in (*[str(m) for m in route.get("matchers") or []],
                                                  *[f'{k}="{v}"' for k, v in (route.get("match") or {}).items()],
                                                  *[f'{k}=~"{v}"' for k, v in (route.get("match_re") or {}).items()])]
    return "no" if "no" in states else ("maybe" if "maybe" in states else "yes")


Outcome = tuple[frozenset[str], tuple[str, ...]]  # the receivers one alert reaches together, and the routes' places
MAX_OUTCOMES = 256  # routing trees are a handful of routes; a bound against a pathological one


def _reach(route: Mapping[str, Any], labels: Mapping[str, str], carries: frozenset[str] | None, inherited: str,
           where: str) -> list[Outcome]:
    """Every way an alert may be routed under `route` (which took it): the receivers it reaches together (a child
    with `continue` lets the next siblings take it too) and the route places that lead there."""
    own = str(route.get("receiver") or inherited)
    # (receivers so far, places, some child took it, a child took it and stopped the siblings)
    partial: list[tuple[frozenset[str], tuple[str, ...], bool, bool]] = [(frozenset(), (), False, False)]
    for index, child in enumerate(route.get("routes") or []):
        if not isinstance(child, Mapping):
            continue
        state = _route_state(child, labels, carries)
        if state == "no":
            continue
        place = f"{where} > route {', '.join(str(m) for m in child.get('matchers') or []) or f'#{index}'}"
        below = _reach(child, labels, carries, own, place)
        grown = []
        for receivers, places, took, stopped in partial:
            if stopped:
                grown.append((receivers, places, took, stopped))
                continue
            grown += [(receivers | more, places + how, True, not child.get("continue")) for more, how in below]
            if state == "maybe":  # or it does not match, and the next sibling is tried
                grown.append((receivers, places, took, False))
        partial = grown[:MAX_OUTCOMES]
    return [(receivers if took else receivers | {own}, places if took else (*places, where))
            for receivers, places, took, _ in partial]


def _integrations(config: Mapping[str, Any], receiver: str) -> set[str]:
    for r in config.get("receivers") or []:
        if isinstance(r, Mapping) and r.get("name") == receiver:
            return {k.removesuffix("_configs") for k, v in r.items() if k.endswith("_configs") and v}
    return set()


def _reached(config: Mapping[str, Any], receivers: frozenset[str]) -> set[str]:
    """The integrations an alert reaching these receivers together is sent through."""
    return set().union(*[_integrations(config, r) for r in receivers])


def pages_rerouted(diff: StackDiff) -> list[Finding]:
    """A critical alert of the head that may reach, at the head, a receiver lacking an integration every receiver it
    reached at the base had (the pager), in an Alertmanager configuration both sides have."""
    base, head = _configs(diff.base), _configs(diff.head)
    cluster = str(plan_of(diff.head).get("cluster") or "")
    critical = [(a, _carries(rule)) for rule in alert_rules(diff.head) if "alert" in rule
                for a in [_labels_of(rule)] if a.get("severity") == "critical"]
    lost: dict[tuple[str, str, str, str], list[str]] = {}
    for place, config in head.items():
        before = base.get(place)
        if before is None:
            continue
        for alert, carries in critical:
            labels = {"cluster": cluster, **alert} if cluster else alert
            was = _reach(before["route"], labels, carries, "", "route")
            had = set.intersection(*[_reached(before, receivers) for receivers, _ in was]) if was else set()
            if not had:
                continue  # it paged nothing before: alert-grouping-off's "nothing is sent" case, not this one
            for receivers, places in _reach(config["route"], labels, carries, "", "route"):
                missing = had - _reached(config, receivers)
                if missing:
                    key = (place, ", ".join(sorted(receivers)), ", ".join(sorted(missing)),
                           "; ".join(dict.fromkeys(places)))
                    lost.setdefault(key, []).append(alert["alertname"])
    if not lost:
        return []
    said = []
    for (place, receiver, missing, places), alerts in sorted(lost.items()):
        names = sorted(set(alerts))
        shown = ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
        said.append(f"{place}: {len(names)} critical alert(s) ({shown}) may now reach only {receiver!r}, with "
                    f"no {missing} integration, through {places}")
    return [Finding(HIGH, REROUTED_RULE, (
        f"{'; '.join(said)}. Alertmanager sends an alert down the first child route that matches it and stops "
        "there unless the route sets `continue: true` (prometheus/alertmanager dispatch/route.go Route.Match at the "
        "pinned release); a matcher on a label the rule does not fix (a pool, a node) takes the alerts that carry "
        "it, so those pages stop and nothing fires about it (amtool accepts the file). Put the new route after "
        "the paging route, give it `continue: true`, or add the pager's integration to its receiver"),
        tuple(sorted({key[0] for key in lost})))]


# ---- alert-grouping-split (trace 22, P07) ------------------------------------------------------------------------
# A route's group_by gaining a label splits its groups: Alertmanager's notification log and PagerDuty's dedup key are
# per group (notify/notify.go DedupStage keys the log by the group key; notify/pagerduty/pagerduty.go sets DedupKey
# to the group key's hash, at the pinned release). When the new configuration loads, the dispatcher's groups are
# rebuilt (dispatch/dispatch.go: a new Dispatcher per configuration), so every alert firing then arrives in a group
# the log has never notified: each pages again under a new key, and the incidents opened under the old keys are
# never sent a resolve (their groups are gone). A per-thing label (a node, a GPU) also makes one fleet-wide fault
# one notification per thing: hundreds to thousands of events on one integration key.
SPLIT_RULE = "alert-grouping-split"


def groups_split(diff: StackDiff) -> list[Finding]:
    base, head = _configs(diff.base), _configs(diff.head)
    said = []
    per_thing = False
    for place, config in head.items():
        before = base.get(place)
        if before is None:
            continue
        was = dict(_routes(before["route"], (), "route"))
        for where, group_by in _routes(config["route"], (), "route"):
            old = was.get(where)
            if old is None or EVERY_LABEL in group_by or EVERY_LABEL in old:
                continue  # '...' is alert-grouping-off's
            added = [label for label in group_by if label not in old]
            if not added:
                continue
            per_thing = per_thing or any(label in PER_INSTANCE for label in added)
            said.append((place, f"{where} groups by {', '.join(group_by)} (added {', '.join(added)})"))
    if not said:
        return []
    today = ("nothing is sent today (the stack has no `alerting` receiver)" if not plan_of(diff.head).get("alerting")
             else "the stack's receivers (PagerDuty's dedup key included) see it")
    return [Finding(HIGH if per_thing else MEDIUM, SPLIT_RULE, (
        f"{'; '.join(line for _, line in said)}: when the new configuration loads, every alert firing then lands in a "
        "new group that Alertmanager's notification log has never notified, so each pages again under a new "
        "PagerDuty dedup key and the incidents opened under the old keys are never resolved (their groups are gone: "
        "prometheus/alertmanager notify/notify.go DedupStage, notify/pagerduty/pagerduty.go DedupKey = the group "
        "key's hash, at the pinned release)"
        + ("; and a per-thing label makes one fleet-wide fault one notification per node or GPU: hundreds to "
           "thousands of events on one integration key, which rate-limits them, critical pages included"
           if per_thing else "")
        + f"; {today}. Resolve the open incidents by hand after it lands, and keep per-thing labels out of "
        "group_by (the notification lists the instances)"), tuple(sorted({place for place, _ in said})))]
