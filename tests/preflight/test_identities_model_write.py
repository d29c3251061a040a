"""identities, 1b: a role that may write scale-set models (virtualMachineScaleSets/write) only on the scale sets
the autoscaler scales. The fifteenth independent trace of `kilonode diff` moved the autoscaler's 25 per-scale-set
assignments to one on the pools' resource group: every pool's model writable, "No risk found"."""

from __future__ import annotations

import pytest

from kilonode.preflight.checks import identities
from tests.preflight.conftest import artefacts, inputs_of
from tests.shared import SHIPPED_STACKS

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

STACK = "research-7500"
GROUP = "/subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/research-7500-nodes"


def _model_write(stack: str, files: dict | None = None, graph: dict | None = None) -> list:  # type: ignore[type-arg]
    return [f for f in identities.check(inputs_of(stack, files, graph)) if "virtualMachineScaleSets/write" in f.what]


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_the_shipped_stacks_scope_model_writes_to_the_node_groups(stack: str) -> None:
    assert _model_write(stack) == []


def test_the_autoscaler_role_on_the_pools_group_breaks() -> None:
    files, graph = artefacts(STACK)
    name = "research-7500-controllers-autoscaler-research-7500-h100-ib-000"
    [first] = [r for r in graph["resources"] if r["name"] == name]
    first["inputs"]["scope"] = GROUP
    [found] = _model_write(STACK, files, graph)
    assert found.level == "break" and "kilonode research-7500 autoscaler" in found.what
    # the fixed GPU pool, the system and the monitoring pool; not h100-ib, whose scale sets are its node groups
    assert "by pool: a100-ib 50, monitoring 1, system 3;" in found.what


def test_contributor_on_the_group_breaks_and_reader_does_not() -> None:
    files, graph = artefacts(STACK)
    [reader] = [r for r in graph["resources"] if r["name"] == "research-7500-controllers-autoscaler-reader"]
    assert _model_write(STACK, files, graph) == []
    reader["inputs"]["roleDefinitionId"] = reader["inputs"]["roleDefinitionId"].replace(
        "acdd72a7-3385-48ef-bd42-f606fba81ae7", "b24988ac-6180-42a0-ab88-20f7382dd24c")
    [found] = _model_write(STACK, files, graph)
    assert "Contributor" in found.what


def test_wildcards_grant_it() -> None:
    assert identities._grants_model_write(["Microsoft.Compute/virtualMachineScaleSets/*"])
    assert identities._grants_model_write(["*"])
    assert not identities._grants_model_write(["Microsoft.Compute/virtualMachineScaleSets/read",
                                               "Microsoft.Compute/virtualMachineScaleSets/virtualMachines/write"])
