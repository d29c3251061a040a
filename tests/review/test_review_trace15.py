"""The fifteenth independent trace of `kilonode diff` on research-7500, PR 05: Prometheus kept 30 days by doubling
the monitoring OS disk, so the claim template and retention.size doubled; the running claim keeps its size (a
template change does not reach it) and the disk fills as history grows (prometheus-disk-short, high)."""

from __future__ import annotations

from typing import Any

import pytest

from kilonode.review import incluster
from kilonode.review.compare import compare_stack
from kilonode.review.finding import HIGH
from tests.review.snapshots import pod_spec, snapshot, workload

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

STACK = "research-7500"


def _grow(entry: dict[str, Any], size: str, retention: str) -> None:
    [template] = workload(entry, "StatefulSet", "prometheus")["spec"]["volumeClaimTemplates"]
    template["spec"]["resources"]["requests"]["storage"] = size
    [container] = [c for c in pod_spec(entry, "StatefulSet", "prometheus")["containers"] if c["name"] == "prometheus"]
    container["args"] = [f"--storage.tsdb.retention.size={retention}" if a.startswith("--storage.tsdb.retention.size=")
                         else a for a in container["args"]]


def test_retention_past_the_running_claim_is_high() -> None:
    head = snapshot(STACK)
    _grow(head, "2048Gi", "982GB")
    [line] = incluster.prometheus_disk(compare_stack(STACK, snapshot(STACK), head))
    assert line.level == HIGH and line.rule == "prometheus-disk-short"
    assert "becomes 982 GiB" in line.summary and "keeps 1,024 GiB" in line.summary


def test_retention_within_the_running_claim_says_nothing() -> None:
    head = snapshot(STACK)
    _grow(head, "2048Gi", "800GB")
    assert incluster.prometheus_disk(compare_stack(STACK, snapshot(STACK), head)) == []
    assert incluster.prometheus_disk(compare_stack(STACK, snapshot(STACK), snapshot(STACK))) == []


def test_scale_sets_created_on_a_running_cluster_are_said_with_their_vms_and_quota() -> None:
    import copy

    from kilonode.review import nodes
    from kilonode.review.finding import MEDIUM

    head = snapshot(STACK)
    [last] = [r for r in head["resources"] if r["type"] == "azure-native:compute:VirtualMachineScaleSet"
              and r["name"] == "research-7500-h100-ib-024"]
    for n in (25, 26):
        new = copy.deepcopy(last)
        new["name"] = f"research-7500-h100-ib-0{n}"
        new["inputs"]["vmScaleSetName"] = new["name"]
        new["inputs"]["sku"]["capacity"] = 100
        head["resources"].append(new)
    [line] = [f for f in nodes.assess(compare_stack(STACK, snapshot(STACK), head)) if f.rule == "nodes-added"]
    assert line.level == MEDIUM and line.subjects == ("research-7500-h100-ib-025", "research-7500-h100-ib-026")
    assert "2 scale set(s) created with 200 VM(s) at once" in line.summary
    assert "19,200 vCPUs, 1,600 GPUs" in line.summary and "az vm list-usage" in line.summary
