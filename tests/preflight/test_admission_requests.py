"""admission-requests: every ValidatingAdmissionPolicy of the graph, run with cel-python on the Node
writes each pool's kubelet, cloud-node-manager and calico-node make; a rule that errors (a label
indexed without a guard, under failurePolicy Fail) or refuses one of them is a break."""

from __future__ import annotations

import functools
import re
from typing import Any

import pytest

from kilonode.preflight import breaks, run
from kilonode.preflight.checks.admission_requests import CALICO_USER, CNM_USER, check_hosts, node_requests
from kilonode.preflight.model import Finding
from tests.preflight.conftest import artefacts, inputs_of, resource

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

STACK = "research-7500"
POLICY = "kilonode-node-identity"
# kilonode.k8s.capacity _label: the guarded lookup the seeded change "simplifies"
GUARDED = re.compile(r"\(has\(object\.metadata\.labels\) && '([^']+)' in object\.metadata\.labels \? "
                     r"object\.metadata\.labels\['\1'\] : ''\)")


def admission_breaks(graph: dict[str, Any] | None = None, stack: str = STACK) -> list[Finding]:
    return breaks(run(inputs_of(stack, graph=graph), ["admission-requests"]))


def direct_index(graph: dict[str, Any]) -> int:
    """The seeded change: every guarded label lookup of the node-identity policy indexed directly."""
    replaced = 0
    for validation in resource(graph, "ValidatingAdmissionPolicy", POLICY)["inputs"]["spec"]["validations"]:
        validation["expression"], n = GUARDED.subn(r"object.metadata.labels['\1']", validation["expression"])
        replaced += n
    return replaced


def test_the_shipped_stacks_admit_every_node_write(shipped: str) -> None:
    assert admission_breaks(stack=shipped) == []


def test_every_role_registers_and_each_agent_writes() -> None:
    requests = node_requests(inputs_of(STACK))
    users = {r.user for r in requests}
    assert CNM_USER in users and CALICO_USER in users
    assert any(r.operation == "CREATE" and r.user.startswith("system:node:") for r in requests)
    # one of each of the six writes per pool role, the team roles included
    assert len(requests) % 6 == 0 and any(".team-" in r.describe for r in requests)


def test_a_label_indexed_without_a_guard_is_an_evaluation_error_and_a_break() -> None:
    """Seeded: `object.metadata.labels['k']` in place of the guarded lookup; every node lacks at
    least one of the labels (the system label off the system pool), so the lookup errors and
    failurePolicy Fail denies every node's registration."""
    _, graph = artefacts(STACK)
    assert direct_index(graph) > 0
    found = admission_breaks(graph)
    assert found and all(f.where == f"ValidatingAdmissionPolicy {POLICY}" for f in found)
    registration = [f for f in found if "registers its Node" in f.what]
    assert registration and "no such key" in registration[0].what
    assert "under failurePolicy Fail an error is a denial" in registration[0].what
    assert "object.metadata.labels['" in registration[0].what


@pytest.mark.parametrize("stack", ["local", "research-2500"])
def test_the_seeded_lookup_breaks_every_shipped_shape(stack: str) -> None:
    _, graph = artefacts(stack)
    assert direct_index(graph) > 0
    assert admission_breaks(graph, stack)


def test_a_rule_that_refuses_an_agents_honest_write_is_a_break() -> None:
    """Seeded: cloud-node-manager no longer allowed to lift the uninitialized taint."""
    _, graph = artefacts(STACK)
    for validation in resource(graph, "ValidatingAdmissionPolicy", POLICY)["inputs"]["spec"]["validations"]:
        validation["expression"] = validation["expression"].replace(
            "'node.cloudprovider.kubernetes.io/uninitialized'", "'nothing'")
    found = admission_breaks(graph)
    assert found and all("cloud-node-manager initialises" in f.what and "is false" in f.what for f in found)


def test_a_policy_that_errors_under_ignore_is_no_break() -> None:
    _, graph = artefacts(STACK)
    direct_index(graph)
    resource(graph, "ValidatingAdmissionPolicy", POLICY)["inputs"]["spec"]["failurePolicy"] = "Ignore"
    assert not [f for f in admission_breaks(graph) if "errors (" in f.what]


def test_a_match_condition_that_errors_is_a_break() -> None:
    _, graph = artefacts(STACK)
    spec = resource(graph, "ValidatingAdmissionPolicy", POLICY)["inputs"]["spec"]
    spec["matchConditions"] = [{"name": "pool", "expression": "object.metadata.labels['kilonode.io/system'] == 'x'"}]
    [finding] = admission_breaks(graph)
    assert "no such key" in finding.what


def test_a_check_of_some_roles_evaluates_their_writes_alone() -> None:
    """check_hosts, as a review of a change to one pool's kubelet runs it: the seeded break is
    found on that role's writes and no other's; no role, no request."""
    _, graph = artefacts(STACK)
    assert direct_index(graph) > 0
    inputs = inputs_of(STACK, graph=graph)
    host = next(r.describe.split(":")[0].removeprefix("pool role ") for r in node_requests(inputs))
    found = [f for f in check_hosts(inputs, {host}) if f.level == "break"]
    assert found and all(f"pool role {host}:" in f.what for f in found)
    assert all(f"of the {len(node_requests(inputs, {host}))} requests" in f.what for f in found if "more of" in f.what)
    assert check_hosts(inputs, set()) == []


# --- the short-circuiting evaluator gives cel-python's own answers --------------------------------------


@pytest.mark.parametrize("expression", [
    "true || 1 / 0 == 0", "1 / 0 == 0 || true", "false || 1 / 0 == 0", "1 / 0 == 0 || false",
    "false && 1 / 0 == 0", "1 / 0 == 0 && false", "true && 1 / 0 == 0", "1 / 0 == 0 && true",
    "'a' || true", "false || 'a'", "true && 'a'", "(false || false) && (true || 1 / 0 == 0)",
    "[1, 2].exists(x, x == 2 || x / 0 == 1)", "has(object.a) && object.a == 1", "!has(object.a) || object.a == 1",
])
def test_short_circuiting_answers_as_cel_python(expression: str) -> None:
    import celpy

    from kilonode.preflight.checks import admission_requests as ar

    def answer(short_circuit: bool) -> str:
        try:
            return repr(ar._compiled(expression, short_circuit).evaluate({"object": celpy.json_to_cel({"b": 1})}))
        except celpy.CELEvalError as error:
            return f"error {error.args[0] if error.args else ''}"

    assert answer(True) == answer(False)


@pytest.mark.parametrize("shipped", ["research-7500", "research-2500"])
def test_every_policy_on_every_request_answers_as_cel_python(shipped: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from kilonode.preflight.checks import admission_requests as ar

    inputs = inputs_of(shipped)
    policies = [r.inputs.get("spec") or {} for r in inputs.of_type(ar.POLICY_TYPE)]
    requests = list(node_requests(inputs))
    assert policies and requests
    ours = [ar.evaluate(spec, request) for spec in policies for request in requests if ar.matches(spec, request)]
    library = functools.partial(ar._compiled, short_circuit=False)
    monkeypatch.setattr(ar, "_compiled", library)
    assert [ar.evaluate(spec, request) for spec in policies for request in requests
            if ar.matches(spec, request)] == ours
