"""Kubernetes' placement rules, as the scheduler and the DaemonSet controller apply them, over
the nodes a pool registers: the taints a kubelet registers with against a pod's tolerations,
its node selector and required node affinity against the node's labels.

Semantics, from upstream:
- a toleration tolerates a taint (k8s.io/api core/v1 toleration.go, ToleratesTaint): its
  effect, when set, equals the taint's; its key, when set, equals the taint's; operator
  Exists matches any value, Equal (the default) the same value. So `{operator: Exists}` with
  no key tolerates every taint;
- only NoSchedule and NoExecute taints keep a pod off a node (the scheduler's TaintToleration
  filter); PreferNoSchedule only scores;
- a DaemonSet's pods get these tolerations added by the controller
  (pkg/controller/daemon/util AddOrUpdateDaemonPodTolerations): not-ready and unreachable
  NoExecute; disk-, memory- and pid-pressure and unschedulable NoSchedule; network-unavailable
  NoSchedule for hostNetwork pods. Not `not-ready:NoSchedule`, nor the external cloud
  provider's uninitialized taint;
- a kubelet with --cloud-provider=external registers with
  node.cloudprovider.kubernetes.io/uninitialized:NoSchedule (k8s.io/cloud-provider
  TaintExternalCloudProvider) until cloud-node-manager initialises the node; the node
  lifecycle controller keeps node.kubernetes.io/not-ready:NoSchedule on it until it is Ready.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

NOT_READY = "node.kubernetes.io/not-ready"
UNINITIALIZED = "node.cloudprovider.kubernetes.io/uninitialized"
BLOCKING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})


@dataclass(frozen=True)
class Taint:
    key: str
    effect: str
    value: str = ""

    def __str__(self) -> str:
        return f"{self.key}={self.value}:{self.effect}" if self.value else f"{self.key}:{self.effect}"


@dataclass(frozen=True)
class Node:
    """A node as it registers: its pool (or role), labels and taints."""

    pool: str
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()


def tolerates(toleration: Mapping[str, Any], taint: Taint) -> bool:
    """k8s.io/api core/v1 Toleration.ToleratesTaint."""
    effect = toleration.get("effect") or ""
    if effect and effect != taint.effect:
        return False
    key = toleration.get("key") or ""
    if key and key != taint.key:
        return False
    operator = toleration.get("operator") or "Equal"
    if operator == "Exists":
        return True
    return operator == "Equal" and (toleration.get("value") or "") == taint.value


# pkg/controller/daemon/util/daemonset_util.go: AddOrUpdateDaemonPodTolerations
DAEMONSET_TOLERATIONS: tuple[dict[str, str], ...] = (
    {"key": NOT_READY, "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/disk-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/memory-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/pid-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"},
)
HOST_NETWORK_TOLERATION = {"key": "node.kubernetes.io/network-unavailable", "operator": "Exists",
                           "effect": "NoSchedule"}


def pod_tolerations(kind: str, pod_spec: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """A workload's pods' tolerations as they reach the scheduler (a DaemonSet's with the
    controller's additions)."""
    tolerations = list(pod_spec.get("tolerations") or [])
    if kind == "DaemonSet":
        tolerations += DAEMONSET_TOLERATIONS
        if pod_spec.get("hostNetwork"):
            tolerations.append(HOST_NETWORK_TOLERATION)
    return tolerations


def untolerated(tolerations: Sequence[Mapping[str, Any]], taints: Iterable[Taint]) -> list[Taint]:
    """The taints that keep the pod off the node."""
    return [t for t in taints if t.effect in BLOCKING_EFFECTS and not any(tolerates(o, t) for o in tolerations)]


def expression_matches(expression: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    key, operator = expression.get("key", ""), expression.get("operator", "")
    values = list(expression.get("values") or [])
    if operator == "In":
        return key in labels and labels[key] in values
    if operator == "NotIn":
        return key not in labels or labels[key] not in values
    if operator == "Exists":
        return key in labels
    if operator == "DoesNotExist":
        return key not in labels
    if operator in ("Gt", "Lt") and key in labels and len(values) == 1:
        try:
            have, want = int(labels[key]), int(values[0])
        except ValueError:
            return False
        return have > want if operator == "Gt" else have < want
    return False


def selector_mismatch(pod_spec: Mapping[str, Any], labels: Mapping[str, str]) -> str | None:
    """Why the pod's nodeSelector or required node affinity rejects these labels; None if
    they admit it (terms are ORed, a term's expressions ANDed)."""
    for key, value in (pod_spec.get("nodeSelector") or {}).items():
        if labels.get(key) != value:
            return f"nodeSelector {key}={value}"
    required = (((pod_spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = required.get("nodeSelectorTerms") or []
    if terms and not any(all(expression_matches(e, labels) for e in term.get("matchExpressions") or [])
                         for term in terms):
        return "required node affinity"
    return None


def pod_spec_of(workload: Mapping[str, Any]) -> Mapping[str, Any]:
    """The pod template's spec of a Deployment, DaemonSet or StatefulSet's inputs."""
    return ((workload.get("spec") or {}).get("template") or {}).get("spec") or {}
