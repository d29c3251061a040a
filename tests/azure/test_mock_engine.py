"""What kilonode.azure.mockplan swaps in the SDK for a plan's speed keeps the SDK's answers:
the dependency-cycle check refuses the same edges, and a cyclic program still fails with the
SDK's own error."""

from __future__ import annotations

import pulumi
import pulumi_random as random
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pulumi.runtime import resource_cycle_breaker as sdk_cycles

from kilonode.azure.mockplan import _CycleBreaker, run_program


class Node:
    """Stands in for a resource: the SDK's check only keeps attributes on it."""


@settings(max_examples=300, deadline=None)
@given(edges=st.lists(st.tuples(st.integers(0, 11), st.integers(0, 11)), max_size=80))
def test_the_cycle_check_refuses_exactly_the_edges_the_sdks_refuses(edges: list[tuple[int, int]]) -> None:
    sdk_nodes, our_nodes = [Node() for _ in range(12)], [Node() for _ in range(12)]
    ours = _CycleBreaker()
    for a, b in edges:
        assert ours.declare_dependency(our_nodes[a], our_nodes[b]) == sdk_cycles.declare_dependency(
            sdk_nodes[a], sdk_nodes[b]), (a, b)


def test_a_program_with_a_dependency_cycle_still_fails_with_the_sdks_error() -> None:
    def program() -> None:
        component = pulumi.ComponentResource("test:index:Group", "group")
        random.RandomString("a", length=4, opts=pulumi.ResourceOptions(parent=component))
        # a child waiting on its own parent waits on itself
        random.RandomString("b", length=4, opts=pulumi.ResourceOptions(parent=component, depends_on=[component]))

    with pytest.raises(RuntimeError, match="circular dependency involving a resource of type "
                                           "random:index/randomString:RandomString named b"):
        run_program("local", {}, program)
    # and the next run in this process is not disturbed by it
    assert [r.name for r in run_program("local", {}, lambda: random.RandomString("c", length=4)).resources] == ["c"]
