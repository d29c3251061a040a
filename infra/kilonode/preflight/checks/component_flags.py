"""component-flags: the control plane's and metrics-server's flags pass the programs' own start-time validation.

Each program parses its flags and runs its options' Validate before it serves; any error ends the
process (kubernetes-sigs/metrics-server v0.8.0 cmd/metrics-server/app/start.go runCommand returns
Validate's first error; kube-apiserver, kube-controller-manager and kube-scheduler return their
options' aggregated Validate errors from the command's RunE). A flag out of its bounds is no warning:
kube-apiserver with --goaway-chance=0.05 refuses "--goaway-chance can not be less than 0 or greater
than 0.02" (kubernetes/apiserver pkg/server/options/server_run_options.go ServerRunOptions.Validate,
read at kubernetes-1.34.2), systemd restarts it into the same error, and with every apiserver's unit
rendered the same, no apiserver serves. metrics-server with --metric-resolution=5s refuses
"metric-resolution should be a time duration at least 10s", and below kubelet-request-timeout*10/9
"metric-resolution should be larger than kubelet-request-timeout" (cmd/metrics-server/app/options
options.go Options.validate at v0.8.0): its pods crash-loop and metrics.k8s.io is unavailable.

Read from each host's rendered systemd units (kube-apiserver, kube-controller-manager,
kube-scheduler: the flags of ExecStart, parsed as kilonode.preflight.nodes does for the kubelet) and
from the metrics-server Deployment's container command and args in the recorded graph, against the
catalogue (kilonode.catalog flag_validation.yaml: per program, the rules read in upstream's source,
each with its message and source, and the defaults a cross-flag rule reads). A flag left out takes
upstream's default, which passes; a value that does not parse as the flag's type is refused by
the flag parser before validation (pflag: "invalid argument"), a break too. etcd's flags are
`etcd-config`'s; the kubelet's configuration is `kubelet-config`'s.

One finding per program and rule, naming the hosts (or the workload) and their values, upstream's
message, the consequence and the kilonode setting that renders the flag.

Seeded breaks (tests/preflight/test_component_flags.py): --goaway-chance=0.05 in one apiserver's
unit; --metric-resolution=5s; a negative --max-requests-inflight; --metric-resolution below
kubelet-request-timeout*10/9.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kilonode.catalog.flag_validation import FlagRule, Program, catalogue
from kilonode.preflight.checks.kubelet_config import seconds
from kilonode.preflight.model import Finding, Inputs, Resource
from kilonode.preflight.nodes import flags_of, unit_exec_args

NAME = "component-flags"
TITLE = "the control plane's and metrics-server's flags pass the programs' own start-time validation"


def number(rule: FlagRule, text: str) -> float | None:
    """The flag's value as pflag parses its type (duration in seconds), None where pflag refuses it."""
    value = text.strip()
    if rule.type == "duration":
        return seconds(value)  # Go time.ParseDuration
    try:
        if rule.type == "int":
            return float(int(value, 0))  # strconv.ParseInt(s, 0, 64): 0x.. and signs too
        return float(value)  # strconv.ParseFloat
    except ValueError:
        return None


def broken(rule: FlagRule, flags: Mapping[str, str], defaults: Mapping[str, str]) -> str | None:
    """What breaks the rule in these flags (None: nothing, or the flags are left to upstream's defaults)."""
    if rule.when is not None and not flags.get(rule.when):
        return None
    if rule.kind == "ratio":
        other = rule.other or ""
        if rule.flag not in flags and other not in flags:
            return None  # both defaulted: upstream's defaults pass
        mine, theirs = flags.get(rule.flag, defaults.get(rule.flag)), flags.get(other, defaults.get(other))
        if mine is None or theirs is None:
            return None
        a, b = number(rule, mine), number(rule, theirs)
        if a is None or b is None:
            return None  # a value that does not parse is the single-flag rules' (or pflag's) to say
        return None if a * (rule.factor or 1.0) >= b else f"--{rule.flag}={mine} with --{other}={theirs}"
    if rule.flag not in flags:
        return None
    text = flags[rule.flag]
    value = number(rule, text)
    if value is None:
        return f"--{rule.flag}={text} (not a {rule.type}: the flag parser refuses it, invalid argument)"
    low = rule.bound if rule.kind in ("atLeast", "greaterThan") else rule.min
    high = rule.max if rule.kind == "range" else None
    if rule.kind == "greaterThan" and low is not None and value <= low:
        return f"--{rule.flag}={text}"
    if (low is not None and value < low) or (high is not None and value > high):
        return f"--{rule.flag}={text}"
    return None


def _workload(inputs: Inputs, named: str) -> Resource | None:
    """A Kubernetes object of the graph by "Kind namespace/name"."""
    kind, _, ref = named.partition(" ")
    namespace, _, name = ref.rpartition("/")
    for r in inputs.kubernetes():
        meta = r.inputs.get("metadata") or {}
        if r.kind == kind and meta.get("name") == name and (meta.get("namespace") or "") == namespace:
            return r
    return None


def container_flags(workload: Resource, container: str, program: str) -> dict[str, str] | None:
    """The flags of the container's command and args (None: no such container). Without a command,
    the image's entrypoint is the program and every arg is its flag."""
    spec = ((workload.inputs.get("spec") or {}).get("template") or {}).get("spec") or {}
    found: Mapping[str, Any] | None = next(
        (c for c in spec.get("containers") or [] if c.get("name") == container), None)
    if found is None:
        return None
    command = [str(w) for w in found.get("command") or []]
    return flags_of([*(command or [program]), *(str(w) for w in found.get("args") or [])])


def _sources(inputs: Inputs, name: str, program: Program) -> list[tuple[str, dict[str, str]]]:
    """(who: a host or the workload, its flags) for each place the program's flags are rendered."""
    if program.unit is not None:
        return [(host, flags_of(unit_exec_args(files[program.unit]))) for host in inputs.hosts()
                if program.unit in (files := inputs.host_files(host))]
    if program.workload is not None:
        workload = _workload(inputs, program.workload)
        flags = container_flags(workload, program.container or name, name) if workload is not None else None
        return [] if flags is None else [(f"{program.workload} container {program.container or name}", flags)]
    return []


def check(inputs: Inputs) -> list[Finding]:
    findings = []
    for name, program in catalogue().programs.items():
        places = _sources(inputs, name, program)
        for rule in program.rules:
            refused = [(who, what) for who, flags in places if (what := broken(rule, flags, program.defaults))]
            if not refused:
                continue
            whos = [who for who, _ in refused]
            if program.unit is None:
                where = whos[0]
            else:
                where = f"{whos[0]}/{program.unit}" if len(whos) == 1 else f"{program.unit} on {', '.join(whos)}"
            values = sorted({what for _, what in refused})
            said = values[0] if len(values) == 1 else "; ".join(
                f"{what} on {', '.join(w for w, x in refused if x == what)}" for what in values)
            version = inputs.plan.kubernetes_version
            elsewhere = (f" (rules read for {program.version}; this stack runs {version})"
                         if program.unit and version and version != program.version else "")
            findings.append(Finding(NAME, "break", where, (
                f"{name} refuses its flags at start: {said}: \"{rule.message}\" ({rule.source}, read at "
                f"{program.version}){elsewhere}: {program.consequence}"), program.fix))
    return findings
