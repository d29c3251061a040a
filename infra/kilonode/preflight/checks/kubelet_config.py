"""kubelet-config: each pool's rendered KubeletConfiguration passes the kubelet's own validation.

The kubelet loads the file --config names, defaults it and validates it before it does anything
else (kubernetes cmd/kubelet/app/server.go NewKubeletCommand: "failed to validate kubelet
configuration"; pkg/kubelet/apis/config/validation/validation.go ValidateKubeletConfiguration). A
field out of its range is no warning: the kubelet exits, systemd restarts it into the same error,
and the node never registers. The render is the same for every node of a pool, so a new node, a
scale-out and every reimaged or replaced instance of the pool comes up without a kubelet, while the
pool's running nodes keep the kubelet they started with until their next restart.

Read from each host role's rendered etc/kubernetes/kubelet-config.yaml (kilonode.render), against
the catalogue (kilonode.catalog kubelet_validation.yaml: the rules a stack could break, each with
the kubelet's own message and upstream source, and the defaults a cross-field rule reads). The
rules judge the defaulted configuration, as the kubelet does: a field left out takes its default
(pkg/kubelet/apis/config/v1beta1/defaults.go), and a zero the defaulting replaces is not judged.
Among them: containerLogMaxFiles > 1 (a single file cannot rotate), containerLogMaxSize a
resource quantity, eventRecordQPS, kubeAPIQPS, registryPullQPS and the bursts not negative, the
image GC thresholds within 0-100 and low < high, maxPods and podsPerCore not negative,
maxParallelImagePulls >= 1 and > 1 only with serializeImagePulls false, the ports, the iptables
bits, oomScoreAdj, the topology manager's policy and scope, hairpinMode, cpuCFSQuotaPeriod within
1ms-1s, memoryThrottlingFactor within (0, 1], shutdownGracePeriodCriticalPods <= shutdownGracePeriod.

A violation is a break: the kubelet refuses its configuration and exits, so no node of the pool
starts. A file that is not YAML, or not a KubeletConfiguration, is one too. The catalogue's source is
the search index's copy of validation.go, newer than the pinned 1.34.2: a Kubernetes version other
than the catalogue's is said in the finding.

Seeded breaks (tests/preflight/test_kubelet_config.py): containerLogMaxFiles 1; the image GC low
threshold above the high one; maxParallelImagePulls 10 with serializeImagePulls true.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import yaml

from kilonode.catalog.kubelet_validation import KubeletRule, catalogue
from kilonode.preflight.model import Finding, Inputs

NAME = "kubelet-config"
TITLE = "every pool's rendered KubeletConfiguration passes the kubelet's own validation"

CONFIG = "etc/kubernetes/kubelet-config.yaml"
KIND = ("kubelet.config.k8s.io/v1beta1", "KubeletConfiguration")
REFUSED = "the kubelet refuses its configuration and exits: no node of the pool starts"
# A Go time.Duration string (time.ParseDuration: a sequence of decimal numbers with units)
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
# k8s.io/apimachinery/pkg/api/resource quantity.go: a signed decimal with a binary or decimal
# suffix, or an exponent
_QUANTITY = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE][+-]?\d+)?")


def seconds(text: Any) -> float | None:
    """A Go duration in seconds ("1m30s", "-2s", "0"), None where it does not parse."""
    value = str(text).strip()
    sign = -1.0 if value.startswith("-") else 1.0
    value = value.lstrip("+-")
    if value == "0":
        return 0.0
    parts = _DURATION_PART.findall(value)
    if not parts or "".join(n + u for n, u in parts) != value:
        return None
    return sign * sum(float(n) * _UNITS[u] for n, u in parts)


def _number(rule: KubeletRule, value: Any) -> float | None:
    if rule.duration:
        return seconds(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _defaulted(config: Mapping[str, Any], field: str) -> Any:
    return config[field] if field in config else catalogue().defaults.get(field)


def broken(rule: KubeletRule, config: Mapping[str, Any]) -> str | None:
    """Why the configuration breaks the rule (None: it does not, or the field is left to its default)."""
    if rule.kind in ("lessThanField", "notWith"):
        return _pair(rule, config)
    if rule.field not in config:
        return None
    value = config[rule.field]
    if rule.kind == "oneOf":
        return None if value in rule.values else f"{rule.field} {value!r}"
    if rule.kind == "quantity":
        return None if isinstance(value, str) and _QUANTITY.fullmatch(value) else f"{rule.field} {value!r}"
    if rule.kind == "absolutePath":
        text = str(value)
        clean = text.startswith("/") and "//" not in text and not re.search(r"(^|/)\.\.?(/|$)", text)
        return None if clean and (text == "/" or not text.endswith("/")) else f"{rule.field} {value!r}"
    number = _number(rule, value)
    if number is None:
        return f"{rule.field} {value!r} (not a {'duration' if rule.duration else 'number'})"
    if rule.zero_defaults and number == 0:
        return None
    low = rule.bound if rule.kind in ("atLeast", "greaterThan") else rule.min
    high = rule.max if rule.kind == "range" else None
    if rule.kind == "greaterThan" and low is not None and number <= low:
        return f"{rule.field} {value}"
    if (low is not None and number < low) or (high is not None and number > high):
        return f"{rule.field} {value}"
    return None


def _pair(rule: KubeletRule, config: Mapping[str, Any]) -> str | None:
    other = rule.other or ""
    if rule.field not in config and other not in config:
        return None  # both defaulted: upstream's defaults pass
    mine, theirs = _defaulted(config, rule.field), _defaulted(config, other)
    if rule.kind == "notWith":
        # serializeImagePulls left out is defaulted from maxParallelImagePulls (defaults.go: true only
        # below 2), so only an explicit true beside a larger limit is refused
        limit = config.get(other)
        many = isinstance(limit, int) and not isinstance(limit, bool) and limit > (rule.bound or 0)
        return f"{rule.field} {mine} with {other} {theirs}" if config.get(rule.field) is True and many else None
    a, b = _number(rule, mine), _number(rule, theirs)
    if a is None or b is None:
        return None  # a value that does not parse is the single-field rules' to say
    if a < b or (rule.or_equal and a == b):
        return None
    return f"{rule.field} {mine} with {other} {theirs}"


def _load(text: str) -> tuple[Mapping[str, Any] | None, str | None]:
    try:
        loaded = yaml.safe_load(text)
    except yaml.YAMLError as error:
        return None, f"does not parse as YAML ({str(error).splitlines()[0]})"
    if not isinstance(loaded, Mapping) or (loaded.get("apiVersion"), loaded.get("kind")) != KIND:
        return None, f"is not a {KIND[1]} ({KIND[0]})"
    return loaded, None


def check(inputs: Inputs) -> list[Finding]:
    known = catalogue()
    version = inputs.plan.kubernetes_version
    elsewhere = ("" if not version or version == known.kubernetes_version else
                 f" (rules read for Kubernetes {known.kubernetes_version}; this stack runs {version})")
    findings = []
    for host in inputs.hosts():
        text = inputs.host_files(host).get(CONFIG)
        if text is None:
            continue
        subject = f"{host}/{CONFIG}"
        config, wrong = _load(text)
        if config is None:
            findings.append(Finding(NAME, "break", subject, f"the rendered kubelet configuration {wrong}: {REFUSED}",
                                    "render a kubelet.config.k8s.io/v1beta1 KubeletConfiguration"))
            continue
        said = [f"{what}: \"{rule.message}\"" for rule in known.rules if (what := broken(rule, config))]
        if said:
            findings.append(Finding(NAME, "break", subject, (
                f"the kubelet's validation (ValidateKubeletConfiguration) refuses {host}'s configuration: "
                f"{'; '.join(said)}{elsewhere}: {REFUSED}, and each new, scaled-out, reimaged or replaced "
                "instance never registers (the running nodes keep their kubelet until it restarts)"),
                "set the field back within the kubelet's bounds (kilonode.catalog kubelet_validation.yaml gives "
                "each rule and its source)"))
    return findings
