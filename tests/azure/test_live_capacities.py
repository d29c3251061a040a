"""An update of an autoscaled scale set keeps the autoscaler's size: deployed, the program reads each
scale set's size from Azure at its start (kilonode.azure.live) and gives it back; the plan's size is
only for a scale set being created. A read that does not answer stops `pulumi up` before it writes."""

from __future__ import annotations

import functools
from collections.abc import Sequence

import pytest

from kilonode.azure.deployer import Answer
from kilonode.azure.graph import Graph
from kilonode.azure.live import LiveReadError, live_capacities
from kilonode.azure.mockplan import run_program
from kilonode.azure.program import main
from kilonode.config import load_stack
from kilonode.plan import checked_plan
from tests.azure.conftest import VMSS
from tests.conftest import shipped_cluster_value

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

STACK = "research-7500"


def _answer(code: int, out: str = "", err: str = "") -> object:
    def run(argv: Sequence[str]) -> Answer:
        assert argv[:3] == ["az", "vmss", "list"] and f"{STACK}-nodes" in argv
        return Answer(code, out, err)
    return run


def test_the_sizes_are_read_per_scale_set_and_a_group_not_there_is_nothing_yet() -> None:
    plan = checked_plan(load_stack(STACK))
    out = '[{"name": "research-7500-h100-ib-003", "capacity": 57}, {"name": "x", "capacity": null}]'
    assert live_capacities(plan, _answer(0, out)) == {"research-7500-h100-ib-003": 57}  # type: ignore[arg-type]
    assert live_capacities(plan, _answer(3, err="(ResourceGroupNotFound) ...")) == {}  # type: ignore[arg-type]


@pytest.mark.parametrize("answer", [(1, "", "Please run 'az login'"), (0, "not json", "")])
def test_a_read_that_does_not_answer_stops_before_anything_is_written(answer: tuple[int, str, str]) -> None:
    plan = checked_plan(load_stack(STACK))
    with pytest.raises(LiveReadError, match="nothing was created or changed"):
        live_capacities(plan, _answer(*answer))  # type: ignore[arg-type]


def _sets(graph: Graph) -> dict[str, tuple[int, tuple[str, ...]]]:
    return {r.plain()["vmScaleSetName"]: (r.plain()["sku"]["capacity"], r.ignore_changes) for r in graph.of_type(VMSS)}


def test_deployed_an_autoscaled_scale_set_is_given_its_live_size_and_a_fixed_one_the_plans(
        graphs: dict[str, Graph]) -> None:
    grown, emptied = f"{STACK}-h100-ib-003", f"{STACK}-h100-ib-010"
    fixed = next(name for name, (_, ignored) in _sets(graphs[STACK]).items() if not ignored)
    live = {grown: 97, emptied: 0, fixed: 3}
    program = functools.partial(main, require_recorded_addresses=False, live_capacities_recorded=live)
    sets = _sets(run_program(STACK, shipped_cluster_value(STACK), program))
    assert sets[grown] == (97, ()) and sets[emptied] == (0, ())  # sent as they are: no ignoreChanges
    planned = _sets(graphs[STACK])
    assert sets[fixed][0] == planned[fixed][0]  # the plan's, whatever Azure says
    not_there = f"{STACK}-h100-ib-024"
    assert sets[not_there] == (planned[not_there][0], ())  # created at the plan's size


def test_recorded_an_autoscaled_scale_sets_size_is_marked_the_autoscalers(graphs: dict[str, Graph]) -> None:
    """Offline there is no live size: ignoreChanges tells the review and preflight it is not the plan's."""
    ignored = {name for name, (_, paths) in _sets(graphs[STACK]).items() if paths}
    assert ignored == {f"{STACK}-h100-ib-{i:03d}" for i in range(25)}
