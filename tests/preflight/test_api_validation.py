"""api-validation: the apiserver's validation beyond the schema (kilonode.catalog
api_validation.yaml), with breaks planted in a copy of research-7500's graph: a PriorityClass above
HighestUserDefinablePriority, a system- name, an unknown preemptionPolicy, a second global default."""

from __future__ import annotations

import copy
from typing import Any

from kilonode.catalog.api_validation import catalogue
from kilonode.preflight import breaks, run
from kilonode.preflight.model import Finding
from tests.preflight.conftest import artefacts, inputs_of, resource

STACK = "research-7500"
# Written by hand from kubernetes pkg/apis/scheduling/types.go (HighestUserDefinablePriority) and
# pkg/apis/scheduling/v1/helpers.go (systemPriorityClasses), not read from the catalogue.
HIGHEST_USER = 1_000_000_000
SYSTEM = {"system-node-critical": 2_000_001_000, "system-cluster-critical": 2_000_000_000}


def found(graph: dict[str, Any] | None = None, stack: str = STACK) -> list[Finding]:
    return breaks(run(inputs_of(stack, graph=graph), ["api-validation"]))


def added_class(graph: dict[str, Any], name: str, value: int, **spec: Any) -> dict[str, Any]:
    """A copy of the team class, renamed: a new PriorityClass as the in-cluster code would add it."""
    new = copy.deepcopy(resource(graph, "PriorityClass", "kilonode-team"))
    new["name"] = f"capacity-{name}"
    new["inputs"]["metadata"]["name"] = name
    new["inputs"]["value"] = value
    new["inputs"]["globalDefault"] = False  # the team class is the cluster's one default
    new["inputs"].update(spec)
    graph["resources"].append(new)
    return new


def test_the_catalogue_holds_upstreams_numbers() -> None:
    rules = catalogue().priority_class
    assert rules.highest_user_definable == HIGHEST_USER
    assert {c.name: c.value for c in rules.system_classes} == SYSTEM
    assert rules.system_prefix == "system-"


def test_the_shipped_stacks_pass(shipped: str) -> None:
    assert found(stack=shipped) == []


def test_a_user_class_above_one_billion_is_a_break_and_at_it_passes() -> None:
    _, graph = artefacts(STACK)
    added = added_class(graph, "kilonode-training-critical", 1_500_000_000)
    [f] = found(graph)
    assert f.where == "PriorityClass kilonode-training-critical"
    assert "`pulumi up` stops at this resource: the apiserver refuses it" in f.what
    assert "maximum allowed value of a user defined priority is 1000000000" in f.what
    assert "at most 1,000,000,000" in f.fix
    added["inputs"]["value"] = HIGHEST_USER
    assert found(graph) == []


def test_a_system_prefixed_name_is_a_break_even_with_a_builtin_name() -> None:
    _, graph = artefacts(STACK)
    added = added_class(graph, "system-training-critical", 10)
    [f] = found(graph)
    assert "reserved for system use only" in f.what and "not a known system priority class" in f.what
    added["inputs"]["metadata"]["name"] = "system-cluster-critical"
    added["inputs"]["value"] = SYSTEM["system-cluster-critical"]
    [f] = found(graph)
    assert "AlreadyExists" in f.what
    added["inputs"]["value"] = 5
    [f] = found(graph)
    assert "must be 2000000000" in f.what


def test_an_unknown_preemption_policy_and_a_second_global_default_are_breaks() -> None:
    _, graph = artefacts(STACK)
    resource(graph, "PriorityClass", "kilonode-team")["inputs"]["preemptionPolicy"] = "Always"
    [f] = found(graph)
    assert "preemptionPolicy 'Always'" in f.what
    _, graph = artefacts(STACK)
    assert resource(graph, "PriorityClass", "kilonode-team")["inputs"]["globalDefault"] is True
    added_class(graph, "another-default", 1, globalDefault=True)
    [f] = found(graph)
    assert f.where == "PriorityClass another-default, kilonode-team" and "Only one default can exist" in f.what
