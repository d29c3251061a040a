"""The gang scheduler's configuration changed (independent trace 9b of kilonode diff on research-7500, finding 2:
the Coscheduling plugin's `permitWaitingTimeSeconds` 300 -> 30 was "No risk found", the Deployment rolling by its
config hash).

Where it lives: kilonode.k8s.scheduling renders the KubeSchedulerConfiguration of the second scheduler into the
ConfigMap kube-system/kilonode-gang-scheduler (data key scheduler-config.yaml), one profile `kilonode-gang` with
Coscheduling and its args; each side's snapshot carries that ConfigMap's inputs among its resources.

What the wait does, read in kubernetes-sigs/scheduler-plugins at v0.34.7 (8283b145; the same at v0.32.7 f83c6ac7
and v0.33.5 c595039e, the releases components.yaml pins):

- pkg/coscheduling/coscheduling.go Permit (l.219-254): a gang pod placed before minMember of its PodGroup have a
  node waits at Permit, holding its node, for util.GetWaitTimeDuration (pkg/util/podgroup.go l.68-76): the
  PodGroup's own spec.scheduleTimeoutSeconds, else the plugin's permitWaitingTimeSeconds
  (apis/config/v1/types.go CoschedulingArgs; default 60, apis/config/v1/defaults.go l.30). Past it the waiting pod
  is rejected and Unreserve (l.260-276) rejects every other waiting pod of the group and marks the group's
  scheduling failed: the gang gives back all the nodes it held and starts over.
- The first pod waits while the scheduler places all the others, so the wait must cover the largest gang at the
  scheduler's pace. kilonode.k8s.scheduling PERMIT_WAITING_TIME_SECONDS says why 300: the field notes' jobs ask for
  100% of a 7,500-node cluster, placed at 25 pods/s (docs/gang-scheduling.md). The rule takes those figures: the
  plan's largest gang is one pod per GPU node of the whole cluster (an NCCL gang is a pod per node, and a gang may
  span fabrics with kilonode.io/cross-fabric: kilonode.k8s.gang), autoscaled pools at their ceiling, and it needs
  that many pods / 25 per second. Lowered below that (`gang-permit-wait-lowered`, high), a gang that large without
  its own scheduleTimeoutSeconds times out before its last pod is placed, releases its reserved nodes and retries,
  for ever.
- The same wait outgrown by the plan (`gang-permit-wait-outgrown`, medium; trace 19, P09): the GPU pools grow
  (nodes, or an autoscaled pool's maxNodes) until the largest gang needs more than the wait the head keeps, where
  at the base it fitted: the same failure for the largest gangs, with no change to the scheduler's own file.
- Any other change of the profile or the plugins' args (`gang-scheduler-config-changed`, medium) is said with its
  path and values, and the meaning of the Coscheduling args: podGroupBackoffSeconds (default 0: a rejected group
  is retried at once; set, PostFilter backs the whole group off, coscheduling.go l.104-111, l.198-206),
  podGroupRejectPercentage (default 10, from v0.34 only: PostFilter rejects the waiting members at once when more
  than this share of minMember is still unplaced, coscheduling.go l.180-196). kube-scheduler's framework caps any
  Permit wait at 15 minutes (kubernetes pkg/scheduler/framework/runtime/framework.go maxTimeout, read at
  kubernetes 002774c3; kilonode.k8s.scheduling relies on it too).

Pure: a StackDiff in, findings out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import yaml

from kilonode.k8s.gang import GANG_SCHEDULER_NAME
from kilonode.review.compare import StackDiff
from kilonode.review.finding import HIGH, MEDIUM, Finding
from kilonode.review.lifecycle import plan_of
from kilonode.yamlio import load_yaml

RULE = "gang-permit-wait-lowered"
OUTGROWN_RULE = "gang-permit-wait-outgrown"
CHANGED_RULE = "gang-scheduler-config-changed"
BROKEN_RULE = "gang-scheduler-broken"
# The in-tree QueueSort plugin, on by default in every profile (kubernetes pkg/scheduler/apis/config/v1
# default_plugins.go getDefaultPlugins: QueueSort PrioritySort)
DEFAULT_QUEUE_SORT = "PrioritySort"
CONFIG_MAP = "kubernetes:core/v1:ConfigMap"
# kilonode.k8s.scheduling SCHEDULER, CONFIG_FILE; kilonode.k8s.gang GANG_SCHEDULER_NAME (the profile)
NAMESPACE, NAME, CONFIG_FILE = "kube-system", "kilonode-gang-scheduler", "scheduler-config.yaml"
PROFILE = GANG_SCHEDULER_NAME  # the profile jobs name
PLUGIN = "Coscheduling"
PERMIT = "permitWaitingTimeSeconds"
# scheduler-plugins apis/config/v1/defaults.go l.30-32 at v0.34.7 (v0.32.7, v0.33.5: the first two the same)
DEFAULT_ARGS: dict[str, int] = {PERMIT: 60, "podGroupBackoffSeconds": 0, "podGroupRejectPercentage": 10}
# The pace kilonode.k8s.scheduling PERMIT_WAITING_TIME_SECONDS is sized at (300 s for 7,500 pods: 25 pods/s)
PODS_PER_SECOND = 25
# kube-scheduler's cap on a Permit wait (pkg/scheduler/framework/runtime/framework.go maxTimeout, 15 minutes)
MAX_PERMIT_SECONDS = 900
SUBJECT = f"ConfigMap {NAMESPACE}/{NAME}"
MEANINGS = {
    PERMIT: ("how long a placed gang pod holds its node waiting for the rest of its PodGroup at Permit, where the "
             "PodGroup sets no spec.scheduleTimeoutSeconds (pkg/coscheduling/coscheduling.go Permit, "
             "pkg/util/podgroup.go GetWaitTimeDuration); past it the whole gang gives its nodes back (Unreserve)"),
    "podGroupBackoffSeconds": ("how long a PodGroup rejected in PostFilter is kept from scheduling again (0: "
                               "retried at once; coscheduling.go New, PostFilter)"),
    "podGroupRejectPercentage": ("the share of minMember still unplaced above which PostFilter rejects the "
                                 "group's waiting pods at once (the pinned release's coscheduling.go "
                                 "PostFilter; not in older ones)"),
    "queueSort": "the queue order: Coscheduling keeps a gang's pods next to each other (coscheduling.go Less)",
    "multiPoint": "the plugins run at every extension point they implement",
    "schedulerName": "the name jobs ask for (schedulerName: kilonode-gang); a pod naming another waits unscheduled",
}


def config(entry: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The gang scheduler's KubeSchedulerConfiguration as the side renders it; None where it renders none
    (or it does not parse: kilonode.preflight's contracts judge that)."""
    for r in (entry or {}).get("resources") or []:
        inputs = r.get("inputs") or {}
        meta = inputs.get("metadata") or {}
        if r.get("type") != CONFIG_MAP or (meta.get("namespace"), meta.get("name")) != (NAMESPACE, NAME):
            continue
        text = (inputs.get("data") or {}).get(CONFIG_FILE)
        try:
            loaded = load_yaml(text) if isinstance(text, str) else None
        except yaml.YAMLError:
            return None
        return loaded if isinstance(loaded, dict) else None
    return None


def _key(item: Any, index: int) -> str:
    if isinstance(item, Mapping):
        for field in ("schedulerName", "name"):
            if isinstance(item.get(field), str):
                return item[field]
    return str(index)


def flatten(value: Any, path: str = "") -> dict[str, Any]:
    """path -> leaf value; a list's items keyed by their schedulerName or name (a profile, a plugin, a
    pluginConfig entry), else by position."""
    if isinstance(value, Mapping):
        found: dict[str, Any] = {}
        for k, v in value.items():
            found.update(flatten(v, f"{path}.{k}" if path else str(k)))
        return found or {path: {}}
    if isinstance(value, list):
        found = {}
        for i, v in enumerate(value):
            found.update(flatten(v, f"{path}[{_key(v, i)}]"))
        return found or {path: []}
    return {path: value}


def coscheduling_args(found: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The kilonode-gang profile's Coscheduling args, upstream's defaults where absent; None where the
    configuration has no such profile (said as a change of the profile instead)."""
    for profile in (found or {}).get("profiles") or []:
        if not isinstance(profile, Mapping) or profile.get("schedulerName") != PROFILE:
            continue
        args: dict[str, Any] = dict(DEFAULT_ARGS)
        for entry in profile.get("pluginConfig") or []:
            if isinstance(entry, Mapping) and entry.get("name") == PLUGIN and isinstance(entry.get("args"), Mapping):
                args.update(entry["args"])
        return args
    return None


def largest_gang(entry: Mapping[str, Any] | None) -> int:
    """The plan's largest gang in pods: one per GPU node of the whole cluster (autoscaled pools at their
    ceiling), as kilonode.k8s.scheduling sizes the wait; every node where the plan has no GPU pool."""
    pools = [p for p in plan_of(entry).get("nodePools") or [] if isinstance(p, Mapping)]
    gpu = [p for p in pools if int(p.get("gpusPerNode") or 0) > 0]

    def nodes(pool: Mapping[str, Any]) -> int:
        ceiling = (pool.get("autoscaling") or {}).get("maxNodes")
        return max(int(pool.get("nodes") or 0), int(ceiling or 0))

    return sum(nodes(p) for p in (gpu or pools))


def needed_seconds(gang: int) -> int:
    return math.ceil(gang / PODS_PER_SECOND)


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _meaning(path: str) -> str:
    """What the path's innermost named setting does (MEANINGS), if the rule knows it."""
    names = [part.split("[", 1)[0] for part in path.split(".")]
    return next((MEANINGS[n] for n in reversed(names) if n in MEANINGS), "")


def _outgrown(base: Mapping[str, Any], head: Mapping[str, Any], diff: StackDiff) -> list[Finding]:
    """The head's wait, enough for the base's largest gang, short of the head's (the pools grew past it)."""
    was_args, now_args = coscheduling_args(base), coscheduling_args(head)
    now = _number(now_args.get(PERMIT)) if now_args is not None else None
    was = _number(was_args.get(PERMIT)) if was_args is not None else None
    if now is None or was is None or now < was:  # lowered: RULE says it
        return []
    before, after = largest_gang(diff.base), largest_gang(diff.head)
    need_before, need = needed_seconds(before), needed_seconds(after)
    if not (need_before <= now < need):
        return []
    return [Finding(MEDIUM, OUTGROWN_RULE, (
        f"the plan's largest gang grows {before:,} -> {after:,} pods (one per GPU node, autoscaled pools at their "
        f"ceiling): at {PODS_PER_SECOND} pods/s it needs {need:,} s at Permit, over the gang scheduler's "
        f"Coscheduling {PERMIT} of {now:g} s, which covered it before (kilonode.k8s.scheduling "
        "PERMIT_WAITING_TIME_SECONDS). A gang of more than "
        f"{int(now) * PODS_PER_SECOND:,} pods without its own spec.scheduleTimeoutSeconds times out before its last "
        "pod is placed, gives its nodes back (Unreserve) and starts over (kubernetes-sigs/scheduler-plugins "
        "pkg/coscheduling/coscheduling.go Permit at the pinned release). Jobs that size: set "
        f"spec.scheduleTimeoutSeconds to {need:,} or more on their PodGroups, or raise {PERMIT} to {need:,} s "
        f"(kube-scheduler caps any Permit wait at {MAX_PERMIT_SECONDS} s)"), (SUBJECT,), cause="gang scheduler config")]


def assess(diff: StackDiff) -> list[Finding]:
    """The Permit wait lowered below the plan's largest gang (high), outgrown by the plan (medium), and any other
    change of the gang scheduler's configuration (medium)."""
    base, head = config(diff.base), config(diff.head)
    if base is None or head is None:
        return []
    if base == head:
        return _outgrown(base, head, diff)
    found: list[Finding] = []
    was_args, now_args = coscheduling_args(base), coscheduling_args(head)
    was = _number(was_args.get(PERMIT)) if was_args is not None else None
    now = _number(now_args.get(PERMIT)) if now_args is not None else None
    gang = largest_gang(diff.head)
    need = needed_seconds(gang)
    lowered = was is not None and now is not None and now < was and now < need
    if lowered:
        found.append(Finding(HIGH, RULE, (
            f"the gang scheduler's Coscheduling {PERMIT} {was:g} -> {now:g} s, below the {need:,} s the plan's "
            f"largest gang needs ({gang:,} pods, one per GPU node, at {PODS_PER_SECOND} pods/s: the figures "
            "kilonode.k8s.scheduling PERMIT_WAITING_TIME_SECONDS and docs/gang-scheduling.md size 300 s by). A "
            "gang's first placed pod waits at Permit, holding its node, for the PodGroup's spec.scheduleTimeoutSeconds "
            f"or else {PERMIT} while the scheduler places the rest (kubernetes-sigs/scheduler-plugins "
            "pkg/coscheduling/coscheduling.go Permit, pkg/util/podgroup.go GetWaitTimeDuration at the pinned "
            "release); past it Unreserve rejects every waiting pod of the group and marks it failed. At "
            f"{now:g} s a gang of more than {int(now) * PODS_PER_SECOND:,} pods without its own timeout times out "
            "before its last pod is placed, gives back the nodes it reserved and starts over, for ever. Keep it at "
            f"{need:,} s or more (kilonode's 300), or set spec.scheduleTimeoutSeconds on every large PodGroup"),
            (SUBJECT,), cause="gang scheduler config"))
    else:
        found += _outgrown(base, head, diff)
    found += _broken(base, head)
    before, after = flatten(base), flatten(head)
    changed = []
    for path in sorted(before.keys() | after.keys()):
        old, new = before.get(path, "(unset)"), after.get(path, "(unset)")
        if old == new or (lowered and path.endswith(f"[{PLUGIN}].args.{PERMIT}")):
            continue
        capped = (path.endswith(f".{PERMIT}") and (_number(new) or 0) > MAX_PERMIT_SECONDS)
        changed.append(f"{path} {old} -> {new}" + (f" ({_meaning(path)})" if _meaning(path) else "")
                       + (f"; kube-scheduler caps any Permit wait at {MAX_PERMIT_SECONDS} s (kubernetes "
                          "pkg/scheduler/framework/runtime/framework.go maxTimeout)" if capped else ""))
    if changed:
        found.append(Finding(MEDIUM, CHANGED_RULE, (
            f"the gang scheduler's configuration changed (kube-system/{NAME}, {CONFIG_FILE}): {'; '.join(changed)}. "
            f"Read it against kubernetes-sigs/scheduler-plugins at the pinned release (apis/config/v1/types.go "
            f"CoschedulingArgs, defaults {', '.join(f'{k} {v}' for k, v in DEFAULT_ARGS.items())} in "
            "apis/config/v1/defaults.go; pkg/coscheduling/coscheduling.go) and kilonode's reasons "
            "(kilonode.k8s.scheduling scheduler_config, docs/gang-scheduling.md); the Deployment rolls to it by its "
            "config hash"), (SUBJECT,), cause="gang scheduler config"))
    return found


def _profile(found: Mapping[str, Any], name: str) -> Mapping[str, Any] | None:
    return next((p for p in found.get("profiles") or [] if isinstance(p, Mapping) and p.get("schedulerName") == name),
                None)


def _queue_sorts(profile: Mapping[str, Any]) -> set[str]:
    """The QueueSort plugins a profile ends with: the default's unless disabled ("*" or by name), plus those
    enabled at queueSort or through multiPoint that implement it (Coscheduling does: coscheduling.go Less)."""
    plugins = profile.get("plugins") or {}
    queue = plugins.get("queueSort") or {}
    disabled = {str((d or {}).get("name")) for d in queue.get("disabled") or []}
    enabled = {str((e or {}).get("name")) for e in queue.get("enabled") or []}
    enabled |= {str((e or {}).get("name")) for e in (plugins.get("multiPoint") or {}).get("enabled") or []
                if (e or {}).get("name") == PLUGIN}
    if not ({"*", DEFAULT_QUEUE_SORT} & disabled):
        enabled.add(DEFAULT_QUEUE_SORT)
    return enabled


def _broken(base: Mapping[str, Any], head: Mapping[str, Any]) -> list[Finding]:
    """What stops the gang scheduler from scheduling any gang (high): the profile jobs name gone or renamed
    (kube-scheduler schedules a pod only with the profile its spec.schedulerName names, pkg/scheduler
    scheduler.go frameworkForPod: "profile not found", and skips pods naming none of its profiles), or a
    profile left with two QueueSort plugins (kube-scheduler refuses to start: "only one queue sort plugin
    required for profile", pkg/scheduler/framework/runtime/framework.go NewFramework)."""
    found = []
    if _profile(base, PROFILE) is not None and _profile(head, PROFILE) is None:
        found.append(Finding(HIGH, BROKEN_RULE, (
            f"the gang scheduler's configuration no longer has the profile {PROFILE}: every job names it "
            f"(schedulerName: {PROFILE}, kilonode.k8s.gang), and kube-scheduler takes a pod only for a profile its "
            "schedulerName names (pkg/scheduler/scheduler.go frameworkForPod), so no gang pod is scheduled by "
            "anyone: every new training job stays Pending. Keep the profile's name (jobs, admission policies and "
            "docs/gang-scheduling.md name it)"), (SUBJECT,), cause="gang scheduler config"))
    for profile in head.get("profiles") or []:
        if not isinstance(profile, Mapping):
            continue
        sorts = _queue_sorts(profile)
        was = _profile(base, str(profile.get("schedulerName")))
        if len(sorts) > 1 and (was is None or len(_queue_sorts(was)) <= 1):
            found.append(Finding(HIGH, BROKEN_RULE, (
                f"the gang scheduler's profile {profile.get('schedulerName')} ends with two QueueSort plugins "
                f"({', '.join(sorted(sorts))}): kube-scheduler refuses to start (\"only one queue sort plugin "
                "required for profile\", pkg/scheduler/framework/runtime/framework.go NewFramework), its Deployment "
                "rolls into a crash loop and no gang is scheduled. Keep PrioritySort disabled at queueSort where "
                "Coscheduling sorts the queue"), (SUBJECT,), cause="gang scheduler config"))
    return found
