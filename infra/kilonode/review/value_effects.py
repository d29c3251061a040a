"""A valid value whose effect upstream documents as dangerous (`value-effect`; the twelfth-and-later
independent traces of kilonode diff on research-7500: kube-apiserver --watch-cache=false was only
the generic control-plane-flag-changed line, the NVIDIA device plugin's FAIL_ON_INIT_ERROR
true -> false only a DaemonSet rollout, kube-proxy's updateStrategy RollingUpdate -> OnDelete
"No risk found").

The values are data (kilonode.catalog.value_effects, value_effects.yaml: where each is read, the
predicate, the consequence, the fix and the upstream source read for it). For each row, each side's
subjects and their values are read:

- an apiserver host program's flag: the rendered unit's ExecStart
  (apiserver-N/etc/systemd/system/<program>.service), parsed as kilonode.review.control_flags
  parses it (the last occurrence wins, as pflag);
- an in-cluster workload: the recorded resources of the kind (kubernetes:apps/v1:<kind>), their
  metadata.namespace/name, and either a dotted field of the object or, per container, its
  `--flag=value` among command and args, else its environment variable (urfave/cli and pflag
  programs read the flag before the variable: urfave/cli v2.27.5 flag_bool.go BoolFlag.Apply,
  vendored at NVIDIA/k8s-device-plugin v0.17.4, sets the flag's value from EnvVars and the command
  line then overrides it; an empty variable there reads false).

A subject absent from a side, or its value absent, reads as the row's `default` (upstream's),
and a subject absent at the base does not match there. A finding is said where a subject moves
INTO the effect: it did not match at the base and does at the head; one line per row, naming
the subjects and their before -> after values. Moving out of an effect, or staying in one, is
not this rule's to say.

kilonode.review.control_flags leaves the flags a row spoke for out of its generic
control-plane-flag-changed line (flags_spoken).

Pure: a StackDiff in, findings out.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from kilonode.catalog.value_effects import FALSE_WORDS, KIND_TYPES, TRUE_WORDS, Condition, ValueEffect, value_effects
from kilonode.review import control_flags, disruption, placement, storage
from kilonode.review.compare import StackDiff
from kilonode.review.finding import HIGH, MEDIUM, Finding

RULE = "value-effect"
NETWORK_POLICY = "kubernetes:networking.k8s.io/v1:NetworkPolicy"


@dataclass(frozen=True)
class Moved:
    """One subject moved into a row's effect."""

    subject: str  # what the finding names: a unit's path, namespace/Kind/name[ container]
    host: str  # the apiserver host, for a program's flag; "" for a workload
    was: str | None  # the base's value as read (None: absent)
    now: str | None
    workload: tuple[str, str, str] | None = None  # (namespace, kind, name)


def _files(entry: Mapping[str, Any] | None) -> Mapping[str, str]:
    return (entry or {}).get("files") or {}


def _resources(entry: Mapping[str, Any] | None) -> list[Mapping[str, Any]]:
    return [r for r in (entry or {}).get("resources") or [] if isinstance(r, Mapping)]


def _bool(value: str) -> bool | None:
    return True if value in TRUE_WORDS else False if value in FALSE_WORDS else None


def _number(value: str) -> float | None:
    try:
        return float(value)
    except ValueError:
        return None


# prometheus/common model.ParseDuration (vendored by Prometheus v3.5.5, go.mod prometheus/common):
# the units in this order, each at most once, "0" alone allowed; anything else Prometheus refuses
_DURATION = re.compile(r"^(?:(\d+)y)?(?:(\d+)w)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?(?:(\d+)ms)?$")
_DURATION_SECONDS = (365 * 86400, 7 * 86400, 86400, 3600, 60, 1, 0.001)


def prometheus_seconds(value: str) -> float | None:
    """A Prometheus duration ("30s", "2m", "1h30m") in seconds; None where Prometheus refuses it."""
    if value == "0":
        return 0.0
    found = _DURATION.match(value)
    if found is None or not any(found.groups()):
        return None
    return sum(int(n) * scale for n, scale in zip(found.groups(), _DURATION_SECONDS, strict=True) if n)


# A field row's value where the object's other fields (`when`) keep it out of the effect.
_UNMET = "\0unmet"


def matches(row: ValueEffect, value: str | None) -> bool:
    """Whether a value (None: absent, so the row's default) is in the row's effect."""
    if value == _UNMET:
        return False
    if value is None:
        value = row.default
    if value is None:
        return False
    if row.boolean:
        read = _bool(value)
        if read is None:
            return False  # the program refuses it at start: not this rule's
        if row.equals is not None:
            return read == _bool(row.equals)
        return row.not_equals is not None and read != _bool(row.not_equals)
    if row.equals is not None:
        return value == row.equals
    if row.not_equals is not None:
        return value != row.not_equals
    if row.pattern is not None:
        return re.search(row.pattern, value.lower()) is not None
    number = prometheus_seconds(value) if row.duration else _number(value)
    if number is None:
        return False
    return (row.below is not None and number < row.below) or (row.above is not None and number > row.above)


# ---- reading a side ---------------------------------------------------------------------------


def _program_values(row: ValueEffect, entry: Mapping[str, Any] | None) -> dict[str, tuple[str, str | None]]:
    """subject -> (host, the flag's value or None), for every apiserver host running the program."""
    assert row.program is not None and row.flag is not None
    hosts = control_flags.program_flags(_files(entry)).get(row.program, {})
    unit = control_flags.UNITS[row.program]
    return {f"{host}/{unit}": (host, flags.get(row.flag)) for host, flags in hosts.items()}


def _field(obj: Any, path: str) -> str | None:
    for key in path.split("."):
        if not isinstance(obj, Mapping) or key not in obj:
            return None
        obj = obj[key]
    if obj is None or isinstance(obj, (Mapping, list)):
        return None
    if isinstance(obj, bool):
        return "true" if obj else "false"
    return str(obj)


def _arg(words: list[str], name: str) -> str | None:
    """The last --name=value (or -name=value; a bare --name is "true") among a container's words."""
    found = None
    for word in words:
        for dashes in ("--", "-"):
            if word == f"{dashes}{name}":
                found = "true"
            elif word.startswith(f"{dashes}{name}="):
                found = word.split("=", 1)[1]
    return found


def _env(container: Mapping[str, Any], name: str) -> str | None:
    found = None
    for var in container.get("env") or []:
        if isinstance(var, Mapping) and var.get("name") == name and "value" in var:
            found = str(var.get("value"))  # the last wins, as the kubelet builds the environment
    return found


def _condition(condition: Condition, inputs: Mapping[str, Any]) -> bool:
    """Whether another field of the object (or, `env`, a variable of the container given as `inputs`) matches
    a row's `when` (absent: its default; none: no match)."""
    value = _env(inputs, condition.env) if condition.env else _field(inputs, condition.field or "")
    if value is None:
        value = condition.default
    if value is None:
        return False
    if condition.equals is not None:
        return value == condition.equals
    if condition.not_equals is not None:
        return value != condition.not_equals
    return condition.pattern is not None and re.search(condition.pattern, value.lower()) is not None


def _workloads(row: ValueEffect, entry: Mapping[str, Any] | None) -> Iterator[tuple[str, str, Mapping[str, Any]]]:
    """(namespace, name, the object's inputs) of every recorded object of the row's kind and names."""
    assert row.kind is not None
    kind_type = KIND_TYPES[row.kind]
    for resource in _resources(entry):
        inputs = resource.get("inputs")
        if resource.get("type") != kind_type or not isinstance(inputs, Mapping):
            continue
        meta = inputs.get("metadata") or {}
        name = str(meta.get("name") or "")
        if row.names and name not in row.names:
            continue
        # a cluster-scoped kind (StorageClass) has no namespace
        yield ("" if row.kind == "StorageClass" else str(meta.get("namespace") or "default")), name, inputs


def _workload_values(row: ValueEffect,
                     entry: Mapping[str, Any] | None) -> dict[str, tuple[tuple[str, str, str], str | None]]:
    """subject -> ((namespace, kind, name), the value or None)."""
    assert row.kind is not None
    found: dict[str, tuple[tuple[str, str, str], str | None]] = {}
    for namespace, name, inputs in _workloads(row, entry):
        key = (namespace, row.kind, name)
        subject = f"{namespace}/{row.kind}/{name}" if namespace else f"{row.kind}/{name}"
        if row.field:
            # a `when` unmet: the row's effect needs it, so the value reads as out of the effect (None
            # would read as the row's default)
            met = all(_condition(c, inputs) for c in row.when)
            found[subject] = (key, _field(inputs, row.field) if met else _UNMET)
            continue
        pod = (((inputs.get("spec") or {}).get("template") or {}).get("spec") or {})
        for container in pod.get("containers") or []:
            if not isinstance(container, Mapping):
                continue
            image = str(container.get("image") or "")
            if row.images and not any(part in image for part in row.images):
                continue
            words = [str(w) for w in [*(container.get("command") or []), *(container.get("args") or [])]]
            value = _arg(words, row.arg) if row.arg else None
            if value is None and row.env:
                value = _env(container, row.env)
                if value == "" and row.boolean:
                    value = "false"  # urfave/cli BoolFlag.Apply: a variable set empty is false
            if matches(row, value) and not all(_condition(c, container) for c in row.when):
                value = _UNMET  # the container's other variable keeps it out of the effect
            found[f"{subject} container {container.get('name')}"] = (key, value)
    return found


def _values(row: ValueEffect, entry: Mapping[str, Any] | None) -> dict[str, tuple[str, Any, str | None]]:
    """subject -> (host or "", workload key or None, value)."""
    if row.program:
        return {s: (host, None, v) for s, (host, v) in _program_values(row, entry).items()}
    return {s: ("", key, v) for s, (key, v) in _workload_values(row, entry).items()}


def moved(row: ValueEffect, diff: StackDiff) -> list[Moved]:
    """The subjects that move into the row's effect between the base and the head."""
    before, after = _values(row, diff.base), _values(row, diff.head)
    found = []
    for subject, (host, key, now) in sorted(after.items()):
        was_known = subject in before
        was = before[subject][2] if was_known else None
        if matches(row, now) and not (was_known and matches(row, was)):
            found.append(Moved(subject, host, was if was_known else None, now, key))
    return found


def _moves(diff: StackDiff) -> list[tuple[ValueEffect, list[Moved]]]:
    key = "value-effects"
    if key not in diff.derived:
        found = []
        for row in value_effects().effects:
            into = moved(row, diff)
            if into:
                found.append((row, into))
        diff.derived[key] = found
    result: list[tuple[ValueEffect, list[Moved]]] = diff.derived[key]
    return result


# ---- saying it --------------------------------------------------------------------------------


def _shown(row: ValueEffect, value: str | None, known: bool = True) -> str:
    if value == _UNMET:
        return "(" + ", ".join(f"{c.said} not as the effect needs" for c in row.when) + ")"
    if value is not None:
        return value
    if not known:
        return "(absent)"
    return f"(unset, default {row.default})" if row.default is not None else "(unset)"


def _nodes(diff: StackDiff, workload: tuple[str, str, str] | None) -> str:
    """', on N nodes (pools ...)' for a DaemonSet the base runs (preflight's placement model)."""
    if workload is None or workload[1] != "DaemonSet":
        return ""
    pools = placement.daemonset_nodes(diff, workload[0], workload[2])
    if not pools:
        return ""
    # roles are pool-<pool> and a team's share pool-<pool>.team-<team> (control_flags.host_nodes)
    names = sorted({role.removeprefix("pool-").split(".team-", 1)[0] for role in pools})
    return f", on {sum(pools.values()):,} nodes (pools {', '.join(names)})"


def _with(row: ValueEffect, diff: StackDiff, subject: tuple[str, str, str] | None) -> str:
    """' with <field> <value>' for each of a row's `when` fields, as the head has them."""
    if not row.when or subject is None:
        return ""
    for namespace, name, inputs in _workloads(row, diff.head):
        if (namespace, name) == (subject[0], subject[2]):
            containers = [c for c in (((inputs.get("spec") or {}).get("template") or {}).get("spec") or {}).get(
                "containers") or [] if isinstance(c, Mapping)]
            return "".join(f" with {c.said} {_when_value(c, inputs, containers) or f'(unset, default {c.default})'}"
                           for c in row.when)
    return ""


def _when_value(condition: Condition, inputs: Mapping[str, Any], containers: list[Mapping[str, Any]]) -> str | None:
    if condition.env:
        return next((v for v in (_env(c, condition.env) for c in containers) if v is not None), None)
    return _field(inputs, condition.field or "")


def _reach(diff: StackDiff, row: ValueEffect, subject: tuple[str, str, str] | None) -> str:
    """' (port N: who reaches it)' for a row with `reach`: the head's NetworkPolicies selecting the workload's
    pods. A pod no policy with Ingress selects is not isolated for ingress, so every pod and node reaches it;
    once one selects it, only what an ingress rule admits does, and the rules add up (Kubernetes docs,
    concepts/services-networking/network-policies.md, "The two sorts of pod isolation")."""
    if row.reach is None or subject is None:
        return ""
    labels: Mapping[str, Any] = {}
    for namespace, name, inputs in _workloads(row, diff.head):
        if (namespace, name) == (subject[0], subject[2]):
            labels = (((inputs.get("spec") or {}).get("template") or {}).get("metadata") or {}).get("labels") or {}
    froms: list[str] = []
    policies = []
    for resource in _resources(diff.head):
        inputs = resource.get("inputs")
        if resource.get("type") != NETWORK_POLICY or not isinstance(inputs, Mapping):
            continue
        meta, spec = inputs.get("metadata") or {}, inputs.get("spec") or {}
        if str(meta.get("namespace") or "default") != subject[0]:
            continue
        if not disruption.selects(spec.get("podSelector") or {}, labels):
            continue
        if "Ingress" not in (spec.get("policyTypes") or ["Ingress"]):
            continue
        policies.append(str(meta.get("name")))
        for rule in spec.get("ingress") or []:
            ports = rule.get("ports") or []
            # a port left out is every port; a named port may be this one (its name is the container's)
            if ports and not any(p.get("port") is None or str(p.get("port")) == str(row.reach)
                                 or not str(p.get("port")).isdigit() for p in ports):
                continue
            peers = rule.get("from") or []
            froms += ([_peer(p, subject[0]) for p in peers] if peers
                      else ["every source (an ingress rule with no `from`)"])
    if not policies:
        return (f" (port {row.reach}: no NetworkPolicy of the head's selects its pods, so every pod and node of the "
                "cluster reaches it)")
    said = "; ".join(sorted(set(froms))) or "nothing (the policies admit no source to it)"
    return f" (port {row.reach}, by NetworkPolicy {', '.join(sorted(policies))}: reached from {said})"


def _peer(peer: Mapping[str, Any], namespace: str) -> str:
    """One `from` peer, said: a podSelector alone selects pods of the policy's own namespace."""
    if peer.get("ipBlock"):
        return f"addresses {(peer['ipBlock'] or {}).get('cidr')}"
    def labels(selector: Any) -> str:
        found = (selector or {}).get("matchLabels") or {}
        return ", ".join(f"{k}={v}" for k, v in sorted(found.items()))
    pods = f"pods {labels(peer.get('podSelector'))}" if labels(peer.get("podSelector")) else "every pod"
    if "namespaceSelector" in peer:
        spaces = labels(peer.get("namespaceSelector"))
        return f"{pods} of " + (f"namespaces {spaces}" if spaces else "every namespace")
    return f"{pods} of namespace {namespace}"


def _claims(diff: StackDiff, subject: tuple[str, str, str] | None) -> str:
    """' (its claims: ...)' for a StorageClass: what the head's StatefulSets claim of it."""
    if subject is None or subject[1] != "StorageClass":
        return ""
    said = storage.claims_said(diff.head, subject[2])
    return f" (its claims: {said})" if said else " (no claim of the stack's own names it)"


def _line(diff: StackDiff, row: ValueEffect, into: list[Moved]) -> Finding:
    base_subjects = set(_values(row, diff.base))
    groups: dict[tuple[str, str], list[Moved]] = {}
    for m in into:
        groups.setdefault((_shown(row, m.was, m.subject in base_subjects), _shown(row, m.now)), []).append(m)
    said = []
    for (was, now), ms in sorted(groups.items()):
        if row.program:
            who = f"{len(ms)} apiserver host(s) ({', '.join(m.host for m in ms)})"
        else:
            who = "; ".join(m.subject + _nodes(diff, m.workload) + _with(row, diff, m.workload)
                            + _claims(diff, m.workload) + _reach(diff, row, m.workload) for m in ms)
        said.append(f"{who}: {row.where()} {was} -> {now}")
    level = HIGH if row.level == "high" else MEDIUM
    return Finding(level, RULE, (
        f"{row.title} [{row.id}]: {'; '.join(said)}. What it does: {row.consequence}. What to do: {row.fix} "
        f"(source: {row.source}; catalogue value_effects.yaml)"),
        # a program's flags are one decision with control_flags' lines for them (its cause); a workload's its own
        tuple(m.subject for m in into), cause=f"{row.program} flags" if row.program else "")


def assess(diff: StackDiff) -> list[Finding]:
    """One line per row of value_effects.yaml some subject moves into."""
    if diff.head is None:
        return []
    return [_line(diff, row, into) for row, into in _moves(diff)]


def flags_spoken(diff: StackDiff) -> set[tuple[str, str, str]]:
    """(program, flag, apiserver host) this rule spoke for: control_flags' generic line leaves them out."""
    if diff.head is None:
        return set()
    return {(row.program, row.flag, m.host) for row, into in _moves(diff) if row.program and row.flag
            for m in into}
