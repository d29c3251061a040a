"""balloon-priority: the balloons' PriorityClass at or above the autoscaler's
--expendable-pods-priority-cutoff, with breaks planted in a copy of research-7500's graph."""

from __future__ import annotations

from typing import Any

from kilonode.preflight import breaks, run
from kilonode.preflight.model import Finding
from tests.preflight.conftest import artefacts, inputs_of, resource

STACK = "research-7500"


def found(graph: dict[str, Any] | None = None, stack: str = STACK) -> list[Finding]:
    return breaks(run(inputs_of(stack, graph=graph), ["balloon-priority"]))


def _args(graph: dict[str, Any]) -> list[str]:
    spec = resource(graph, "Deployment", "cluster-autoscaler")["inputs"]["spec"]["template"]["spec"]
    [container] = spec["containers"]
    args: list[str] = container["args"]
    return args


def test_the_shipped_stacks_pass(shipped: str) -> None:
    assert found(stack=shipped) == []


def test_the_balloon_class_below_the_cutoff_is_a_break() -> None:
    _, graph = artefacts(STACK)
    resource(graph, "PriorityClass", "kilonode-balloon")["inputs"]["value"] = -11
    [f] = found(graph)
    assert f.where == "Deployment kilonode-capacity/balloon-h100-ib"
    assert "kilonode-balloon is -11, below the --expendable-pods-priority-cutoff=-10" in f.what
    assert "neither trigger a scale-up nor keep a node" in f.what and "PRIORITY_BALLOON" in f.fix


def test_the_cutoff_raised_above_the_balloons_is_a_break_and_at_it_passes() -> None:
    _, graph = artefacts(STACK)
    args = _args(graph)
    [index] = [i for i, a in enumerate(args) if a.startswith("--expendable-pods-priority-cutoff")]
    args[index] = "--expendable-pods-priority-cutoff=0"
    [f] = found(graph)
    assert "below the --expendable-pods-priority-cutoff=0" in f.what
    args[index] = "--expendable-pods-priority-cutoff=-10"
    assert found(graph) == []
    del args[index]  # upstream's default, -10: the balloons sit at it
    assert found(graph) == []


def test_a_missing_class_is_a_break() -> None:
    _, graph = artefacts(STACK)
    graph["resources"].remove(resource(graph, "PriorityClass", "kilonode-balloon"))
    [f] = found(graph)
    assert "which the cluster does not have" in f.what
