"""The placement rules against upstream's semantics (k8s.io/api core/v1 toleration.go
ToleratesTaint and its tests; the DaemonSet controller's added tolerations)."""

from __future__ import annotations

import pytest

from kilonode.preflight.placement import (
    NOT_READY,
    Taint,
    pod_tolerations,
    selector_mismatch,
    tolerates,
    untolerated,
)

GPU = Taint("kilonode.io/gpu-health", "NoSchedule", "pending")


@pytest.mark.parametrize(("toleration", "expected"), [
    ({"operator": "Exists"}, True),  # no key, Exists: every taint
    ({"key": "kilonode.io/gpu-health", "operator": "Exists"}, True),
    ({"key": "kilonode.io/gpu-health", "operator": "Equal", "value": "pending"}, True),
    ({"key": "kilonode.io/gpu-health", "value": "pending"}, True),  # Equal is the default
    ({"key": "kilonode.io/gpu-health", "operator": "Equal", "value": "failed"}, False),
    ({"key": "kilonode.io/gpu-health", "operator": "Exists", "effect": "NoExecute"}, False),
    ({"key": "kilonode.io/gpu-health", "operator": "Exists", "effect": "NoSchedule"}, True),
    ({"key": "kilonode.io/team", "operator": "Exists"}, False),
    ({"operator": "Exists", "effect": "NoExecute"}, False),  # no key, but the effect must match
])
def test_a_toleration_tolerates_a_taint_as_the_api_defines(toleration: dict[str, str], expected: bool) -> None:
    assert tolerates(toleration, GPU) is expected


def test_prefer_no_schedule_never_keeps_a_pod_off() -> None:
    assert untolerated([], [Taint("soft", "PreferNoSchedule")]) == []
    assert untolerated([], [GPU]) == [GPU]


def test_a_daemonset_gets_the_controllers_tolerations_but_not_not_ready_no_schedule() -> None:
    added = pod_tolerations("DaemonSet", {})
    assert untolerated(added, [Taint(NOT_READY, "NoExecute")]) == []
    assert untolerated(added, [Taint(NOT_READY, "NoSchedule")]) == [Taint(NOT_READY, "NoSchedule")]
    network = Taint("node.kubernetes.io/network-unavailable", "NoSchedule")
    assert untolerated(added, [network]) == [network]
    assert untolerated(pod_tolerations("DaemonSet", {"hostNetwork": True}), [network]) == []
    assert untolerated(pod_tolerations("Deployment", {}), [Taint(NOT_READY, "NoExecute")]) != []


def test_node_selector_and_required_affinity_against_labels() -> None:
    labels = {"kilonode.io/pool": "cpu", "kubernetes.io/os": "linux"}
    assert selector_mismatch({"nodeSelector": {"kubernetes.io/os": "linux"}}, labels) is None
    mismatch = selector_mismatch({"nodeSelector": {"kilonode.io/pool": "gpu"}}, labels)
    assert mismatch == "nodeSelector kilonode.io/pool=gpu"
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "kilonode.io/pool", "operator": "In", "values": ["gpu"]}]},
        {"matchExpressions": [{"key": "kubernetes.io/os", "operator": "Exists"},
                              {"key": "kilonode.io/team", "operator": "DoesNotExist"}]},
    ]}}}
    assert selector_mismatch({"affinity": affinity}, labels) is None  # the second term admits it
    assert selector_mismatch({"affinity": affinity}, {**labels, "kilonode.io/team": "vision"}) == \
        "required node affinity"
