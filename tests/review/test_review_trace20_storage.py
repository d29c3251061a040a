"""The twentieth independent trace of `kilonode diff` on research-7500: a PR marking the Prometheus
StorageClass the cluster's default read "No risk found" (an in-place annotation update), though
every class-less claim of a GPU pool's pod then waits Pending (kilonode.review.default_storageclass).
Each boundary on the shipped stack changed in memory (tests.review.snapshots), with harmless
variants beside it that must stay quiet."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from kilonode.review.compare import compare_stack
from tests.review.snapshots import snapshot

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

STACK = "research-7500"
RULE = "default-storageclass-changed"
CLASS = "kilonode-premium-ssd-retain"
DEFAULT = "storageclass.kubernetes.io/is-default-class"


def _risks(head: dict[str, Any], base: dict[str, Any] | None = None) -> list[Any]:
    from kilonode.review import risks
    return risks.assess(compare_stack(STACK, base if base is not None else snapshot(STACK), head), {})


def _rules(head: dict[str, Any], base: dict[str, Any] | None = None) -> list[Any]:
    return [r for r in _risks(head, base) if r.rule == RULE]


def _class(entry: dict[str, Any], name: str = CLASS) -> dict[str, Any]:
    [found] = [r for r in entry["resources"] if r["type"] == "kubernetes:storage.k8s.io/v1:StorageClass"
               and r["inputs"]["metadata"]["name"] == name]
    return found


def _annotate(entry: dict[str, Any], key: str, value: str, name: str = CLASS) -> None:
    _class(entry, name)["inputs"]["metadata"].setdefault("annotations", {})[key] = value


def test_premium_retain_class_made_default_is_high_and_names_the_gpu_pools() -> None:
    head = snapshot(STACK)
    _annotate(head, DEFAULT, "true")
    [risk] = _rules(head)
    assert risk.level == "high"
    said = risk.summary
    assert f"StorageClass {CLASS} becomes the cluster's default" in said
    assert "a100-ib (5000 nodes)" in said and "h100-ib (2500 nodes)" in said
    assert "system (" not in said and "monitoring (" not in said  # the node plugin runs there
    assert "assignDefaultStorageClass" in said and "existing unbound" in said
    assert "no topology key found on CSINode" in said  # the class is WaitForFirstConsumer
    assert "Retain" in said and "Premium_LRS" in said
    assert "storageClassName" in said and "Fix:" in said
    assert any("premium-retain" in s for s in risk.subjects)


def test_beta_annotation_is_a_default_too() -> None:
    head = snapshot(STACK)
    _annotate(head, "storageclass.beta.kubernetes.io/is-default-class", "true")
    [risk] = _rules(head)
    assert risk.level == "high"


def test_plan_rule_used_when_no_node_plugin_daemonset_is_recorded() -> None:
    """Without the recorded DaemonSet, the plan's pools and runs_disk_plugin say the same."""
    base = snapshot(STACK)
    base["resources"] = [r for r in base["resources"] if not (
        r["type"] == "kubernetes:apps/v1:DaemonSet" and r["inputs"]["metadata"]["name"] == "csi-azuredisk-node")]
    head = copy.deepcopy(base)
    _annotate(head, DEFAULT, "true")
    [risk] = _rules(head, base)
    assert risk.level == "high" and "runs_disk_plugin" in risk.summary
    assert "a100-ib (5000 nodes)" in risk.summary


def test_node_plugin_on_every_pool_makes_it_medium() -> None:
    """The same default once the node plugin runs on the GPU pools too: the default still moves."""
    base = snapshot(STACK)
    [ds] = [r for r in base["resources"] if r["type"] == "kubernetes:apps/v1:DaemonSet"
            and r["inputs"]["metadata"]["name"] == "csi-azuredisk-node"]
    ds["inputs"]["spec"]["template"]["spec"].pop("affinity")
    head = copy.deepcopy(base)
    _annotate(head, DEFAULT, "true")
    [risk] = _rules(head, base)
    assert risk.level == "medium" and "runs on every pool" in risk.summary


def test_description_annotation_stays_quiet() -> None:
    head = snapshot(STACK)
    _annotate(head, "kubernetes.io/description", "Prometheus's TSDB")
    assert not _rules(head)


def test_default_false_stays_quiet() -> None:
    """No default at base nor head: an explicit "false" changes nothing."""
    base = snapshot(STACK)
    head = snapshot(STACK)
    _annotate(head, DEFAULT, "false")
    assert not _rules(head, base)


def test_default_removed_is_medium() -> None:
    base = snapshot(STACK)
    _annotate(base, DEFAULT, "true")
    head = snapshot(STACK)
    [risk] = _rules(head, base)
    assert risk.level == "medium" and "No StorageClass is the default any more" in risk.summary


def test_unchanged_default_stays_quiet() -> None:
    base = snapshot(STACK)
    _annotate(base, DEFAULT, "true")
    head = copy.deepcopy(base)
    assert not _rules(head, base)
