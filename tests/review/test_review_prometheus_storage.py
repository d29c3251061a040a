"""prometheus-restarted and where the TSDB lives (kilonode.review.incluster._history): with the data on
the StatefulSet's claim a new pod keeps the history and only alerting pauses; a change that moves the
data to an emptyDir, renames the claim template or deletes the claim with the StatefulSet loses it,
and the rule says which, from each side's StatefulSet."""

from __future__ import annotations

from typing import Any

import pytest

from kilonode.review.compare import compare_stack
from kilonode.review.risks import Risk, assess
from tests.review.snapshots import snapshot, workload

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

STACK = "research-7500"


def restarted(base: dict[str, Any], head: dict[str, Any]) -> Risk:
    [found] = [r for r in assess(compare_stack(STACK, base, head), {}) if r.rule == "prometheus-restarted"]
    return found


def _sts(entry: dict[str, Any]) -> dict[str, Any]:
    return workload(entry, "StatefulSet", "prometheus")


def _to_empty_dir(entry: dict[str, Any]) -> None:
    """The StatefulSet as kilonode rendered it before its claim: the data an emptyDir of the pod."""
    spec = _sts(entry)["spec"]
    del spec["volumeClaimTemplates"]
    spec["template"]["spec"]["volumes"].append({"name": "data", "emptyDir": {"sizeLimit": "614Gi"}})


def test_moving_the_tsdb_to_an_emptydir_loses_the_history_left_on_the_claim() -> None:
    head = snapshot(STACK)
    _to_empty_dir(head)
    risk = restarted(snapshot(STACK), head)
    assert "its TSDB moves from the claim data-prometheus-0 to an emptyDir" in risk.summary
    assert "graphs is acceptable" in risk.summary and "only alerting pauses" not in risk.summary


def test_this_change_on_a_running_cluster_loses_the_emptydirs_history_once() -> None:
    """The StatefulSet of an emptyDir replaced by one with a claim template (this change itself)."""
    base = snapshot(STACK)
    _to_empty_dir(base)
    risk = restarted(base, snapshot(STACK))
    assert "its StatefulSet is replaced (spec.volumeClaimTemplates" in risk.summary
    assert "its TSDB is an emptyDir on the node, so all of its history is gone" in risk.summary


def test_a_renamed_claim_template_starts_on_a_new_empty_disk() -> None:
    head = snapshot(STACK)
    spec = _sts(head)["spec"]
    spec["volumeClaimTemplates"][0]["metadata"]["name"] = "tsdb"
    for mount in spec["template"]["spec"]["containers"][0]["volumeMounts"]:
        if mount["name"] == "data":
            mount["name"] = "tsdb"
    risk = restarted(snapshot(STACK), head)
    assert "its claim template is renamed data -> tsdb" in risk.summary
    assert "stays behind on data-prometheus-0" in risk.summary


def test_a_replacement_that_deletes_the_claim_with_the_statefulset_loses_the_history() -> None:
    base, head = snapshot(STACK), snapshot(STACK)
    for entry in (base, head):
        _sts(entry)["spec"]["persistentVolumeClaimRetentionPolicy"]["whenDeleted"] = "Delete"
    _sts(head)["spec"]["serviceName"] = "prometheus-headless"
    risk = restarted(base, head)
    assert "its claim data-prometheus-0 is deleted with the StatefulSet" in risk.summary


def test_a_larger_claim_template_keeps_the_history_but_not_the_new_size() -> None:
    head = snapshot(STACK)
    _sts(head)["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"] = "2048Gi"
    risk = restarted(snapshot(STACK), head)
    assert "its history stays on its claim data-prometheus-0" in risk.summary
    assert "storage 1024Gi -> 2048Gi" in risk.summary and "resize the claim itself" in risk.summary
    assert "only alerting pauses" in risk.summary


def test_a_replaced_monitoring_node_keeps_the_history_on_the_reattached_disk() -> None:
    head = snapshot(STACK)
    [vmss] = [r for r in head["resources"] if r["name"].endswith("monitoring-000")
              and r["type"].endswith("VirtualMachineScaleSet")]
    vmss["inputs"]["sku"]["name"] = "Standard_E32ds_v5"
    risk = restarted(snapshot(STACK), head)
    assert "is resized" in risk.summary and "detached and attached to the new node" in risk.summary
