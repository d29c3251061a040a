"""A thirteenth independent trace of `kilonode diff` on research-7500: the node scale sets'
upgradePolicy Manual -> Automatic (x03) and the InfiniBand pools' singlePlacementGroup true -> false
(x04), both "No risk found"; each on the recorded snapshot changed as the pull request changes it."""

from __future__ import annotations

import pytest

from kilonode.review import nodes
from kilonode.review.compare import compare_stack
from kilonode.review.finding import HIGH
from tests.review.snapshots import snapshot

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

STACK = "research-7500"
VMSS = "azure-native:compute:VirtualMachineScaleSet"


def _findings(change) -> list:  # type: ignore[no-untyped-def]
    head = snapshot(STACK)
    for r in head["resources"]:
        if r["type"] == VMSS:
            change(r["inputs"], r["name"])
    return nodes.scale_set_policy(compare_stack(STACK, snapshot(STACK), head))


def test_an_upgrade_policy_off_manual_is_high_in_one_line() -> None:
    [line] = _findings(lambda inputs, _: inputs["upgradePolicy"].update(mode="Automatic"))
    assert line.level == HIGH and line.rule == "upgrade-policy-not-manual"
    assert "upgradePolicy Manual -> Automatic" in line.summary and "might take down all VMs" in line.summary
    assert len(line.subjects) > 75


def test_an_infiniband_placement_group_opened_is_high() -> None:
    def open_ib(inputs, name):  # type: ignore[no-untyped-def]
        if inputs.get("singlePlacementGroup") is True:
            inputs["singlePlacementGroup"] = False

    [line] = _findings(open_ib)
    assert line.rule == "placement-group-opened" and "never back" in line.summary


def test_the_shipped_stack_says_neither() -> None:
    assert nodes.scale_set_policy(compare_stack(STACK, snapshot(STACK), snapshot(STACK))) == []
