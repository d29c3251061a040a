"""What the GPU health agent (on the node) and the taint controller (on the apiserver VMs)
agree on: the Node condition, the taints, the annotations, and the Events both write. Pure.

Why two programs: the NodeRestriction admission plugin forbids a kubelet's credentials to
change its own Node's taints after registration, but lets them patch the Node's status
conditions, create Events and list the pods bound to the node. So the agent reports a
condition with the node's own identity and the controller, with its own identity, owns
the taints.
"""

from __future__ import annotations

import re
import secrets
from datetime import UTC, datetime
from typing import Any

CONDITION = "GPUHealthy"
REASON_PASSED = "Passed"
REASON_CHECK_REQUESTED = "ActiveCheckRequested"
# Unknown while the agent waits for the GPUs' NVSwitch fabric registration before its first
# active check (kilonode.gpu.agent): the controller leaves the taints as they are.
REASON_FABRIC_PENDING = "FabricRegistrationPending"
# Unknown while the agent waits, before its first check, for the size's InfiniBand ports to be
# ACTIVE at their rate (kilonode.gpu.agent, InfiniBand pools): the taints stay as they are.
REASON_INFINIBAND_PENDING = "InfinibandLinksPending"

STARTUP_TAINT = "kilonode.io/gpu-health"  # =pending:NoSchedule, registered by the kubelet
STARTUP_VALUE = "pending"
FAULT_TAINT = "kilonode.io/gpu-unhealthy"  # =<reason>:NoSchedule, a failure
CHECK_TAINT = "kilonode.io/gpu-check"  # =running:NoSchedule, during an idle re-check
CHECK_VALUE = "running"
EFFECT = "NoSchedule"

ANNOTATION_SINCE = "kilonode.io/gpu-unhealthy-since"  # the failure's lastTransitionTime
ANNOTATION_BOOT = "kilonode.io/gpu-unhealthy-boot"  # the bootID the failure was seen in
# A failed node is kept, with its evidence, until a reboot or a person returns it, and a node
# whose checks are pending (the startup taint: waiting for its NVSwitch fabric, or its first
# check running) until they end: the cluster autoscaler must not remove either as an unready,
# empty node after --scale-down-unready-time (both taints are --startup-taints to it, so the
# node is unready). Its documented per-node opt-out (cluster-autoscaler FAQ, "How can I prevent
# Cluster Autoscaler from scaling down a particular node?"; core/scaledown/eligibility checks it
# for every candidate, unready ones included). HELD says the controller set it, so it removes
# only its own. (The key's name predates the pending hold; it marks either.)
SCALE_DOWN_DISABLED = "cluster-autoscaler.kubernetes.io/scale-down-disabled"
ANNOTATION_HELD = "kilonode.io/gpu-unhealthy-held"

# Kubernetes pkg/apis/core/validation/events.go (legacyValidateEvent, read at commit
# 04791b4906602ffda5ccf9bc4c84d3329f1d7080; these limits have not moved for many releases):
# an Event with eventTime set must have a message of at most NoteLengthLimit = 1024
# characters, reason and action at most 128 (ReasonLengthLimit, ActionLengthLimit),
# reportingInstance at most 128, reportingController (JSON reportingComponent) a qualified
# name. No length rule for a NodeCondition's message was found in ValidateNode /
# ValidateNodeUpdate (read in older copies, not at v1.34): the agent writes the same text to
# both, so both are cut to the Event's limit. Taint values are checked as label values
# (validateNodeTaints).
MESSAGE_LIMIT = 1024
REASON_LIMIT = 128
INSTANCE_LIMIT = 128
# A label value (and so a taint value): at most 63 characters, alphanumerics, '-', '_',
# '.', beginning and ending alphanumeric (apimachinery validation.IsValidLabelValue).
LABEL_VALUE_LIMIT = 63
# Events about Nodes (cluster-scoped) go to the "default" namespace: events.go requires an
# Event whose involvedObject has no namespace to live in "default" (or kube-system with
# eventTime set); "default" is what the kubelet uses for its Node events.
EVENT_NAMESPACE = "default"


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def now_micro() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def camel(check: str) -> str:
    """'ecc-volatile' -> 'EccVolatile': a condition reason in the API's CamelCase."""
    return "".join(part[:1].upper() + part[1:] for part in re.split(r"[^A-Za-z0-9]+", check) if part)


def label_value(text: str) -> str:
    """A taint value: the allowed characters only, at most 63, alphanumeric at both ends."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "-", text)[:LABEL_VALUE_LIMIT].strip("-_.")
    return safe or "Unknown"


def cut(text: str, limit: int, pointer: str) -> str:
    """`text` if it fits `limit`, else its head and `pointer` (where the whole is)."""
    if len(text) <= limit:
        return text
    tail = f"\n... cut; {pointer}"
    return text[: limit - len(tail)] + tail


def taint(key: str, value: str) -> dict[str, str]:
    return {"key": key, "value": value, "effect": EFFECT}


def node_event(node: dict[str, Any], *, kind: str, reason: str, message: str, action: str,
               controller: str, instance: str) -> dict[str, Any]:
    """A core/v1 Event about a Node, with eventTime (so the apiserver applies the length
    rules above) and the legacy timestamps `kubectl describe node` shows."""
    meta = node.get("metadata", {})
    name = meta.get("name", "")
    stamp, micro = now(), now_micro()
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            # unique per event; a Node name is a DNS subdomain (<= 253), so cut it to leave room
            "name": f"{name[:200]}.gpu-health.{secrets.token_hex(8)}",
            "namespace": EVENT_NAMESPACE,
        },
        "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": name, "uid": meta.get("uid", name)},
        "type": kind,
        "reason": reason[:REASON_LIMIT],
        "message": cut(message, MESSAGE_LIMIT, f"see the Node's {CONDITION} condition"),
        "action": action[:REASON_LIMIT],
        "reportingComponent": controller,
        "reportingInstance": instance[:INSTANCE_LIMIT],
        "source": {"component": controller, "host": instance[:INSTANCE_LIMIT]},
        "eventTime": micro,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


def gpu_condition(node: dict[str, Any]) -> dict[str, Any] | None:
    for condition in node.get("status", {}).get("conditions", []) or []:
        if condition.get("type") == CONDITION:
            return condition
    return None


def boot_id(node: dict[str, Any]) -> str:
    return str(node.get("status", {}).get("nodeInfo", {}).get("bootID", ""))
