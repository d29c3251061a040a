"""The two changes an independent trace of `kilonode diff` on research-7500 found reported as "No
risk found" (trace 7a), each on the stack's recorded snapshot changed by hand as the pull request
changes it: the node-identity policy's label lookups "simplified" to a direct index (a CEL runtime
error on every node that lacks a label, a denial under failurePolicy Fail: no node registers), and
monitoring's default deny given Egress (Prometheus's discovery, scrapes and DNS refused). Both are
preflight breaks new at the head (admission-requests, pod-egress), so `preflight-break` reports them high."""

from __future__ import annotations

from typing import Any

import pytest

from kilonode.review import preflight_break
from kilonode.review.compare import FileChange, ResourceChange, StackDiff, compare_stack
from kilonode.review.finding import HIGH
from kilonode.review.risks import Risk, assess
from tests.preflight.test_admission_requests import direct_index
from tests.review.snapshots import snapshot

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

STACK = "research-7500"


def breaks(head: dict[str, Any]) -> list[Risk]:
    return [r for r in assess(compare_stack(STACK, snapshot(STACK), head), {}) if r.rule == "preflight-break"]


def test_the_node_identity_lookup_indexed_directly_is_a_new_admission_requests_break() -> None:
    head = snapshot(STACK)
    assert direct_index(head) > 0
    [line] = [r for r in breaks(head) if "admission-requests" in r.summary]
    assert line.level == HIGH
    assert "kilonode-node-identity" in line.summary and "failurePolicy Fail" in line.summary


def test_monitoring_denying_its_own_egress_is_a_new_pod_egress_break() -> None:
    head = snapshot(STACK)
    [deny] = [r["inputs"] for r in head["resources"] if r["type"].endswith(":NetworkPolicy")
              and r["inputs"]["metadata"].get("namespace") == "monitoring"
              and r["inputs"]["metadata"]["name"] == "default-deny"]
    deny["spec"]["policyTypes"] = ["Ingress", "Egress"]
    [line] = [r for r in breaks(head) if "pod-egress" in r.summary]
    assert line.level == HIGH
    assert "monitoring/prometheus" in line.summary and "every alert is blind" in line.summary


def test_a_change_judges_the_touched_roles_and_the_changed_policies_alone() -> None:
    """The review's cost bound: a change touching some pools' kubelet files evaluates every policy on
    those roles' writes, and a changed policy on every role's (cel-python, ~0.3 s a role and policy);
    a binding alone moves nothing the check reads."""
    kubelet = FileChange("pool-h100-ib/etc/default/kubelet", "modified", "")
    other = FileChange("pool-a100/etc/sysctl.d/90-kilonode.conf", "modified", "")
    diff = StackDiff(STACK, {}, {}, files=[kubelet, other])
    assert preflight_break._moved("admission-requests", diff)
    assert preflight_break._scope("admission-requests", diff) == ({"pool-h100-ib"}, set())
    policy = ResourceChange(preflight_break.POLICY, "p", "update", None,
                            base={"inputs": {"metadata": {"name": "kilonode-reserved-pools"}}},
                            head={"inputs": {"metadata": {"name": "kilonode-reserved-pools"}}})
    diff.resources.append(policy)
    assert preflight_break._scope("admission-requests", diff) == ({"pool-h100-ib"}, {"kilonode-reserved-pools"})
    binding = ResourceChange("kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicyBinding", "b",
                             "update", None)
    assert not preflight_break._moved("admission-requests", StackDiff(STACK, {}, {}, files=[other],
                                                                      resources=[binding]))
    assert preflight_break._scope("pod-dns", StackDiff(STACK, {}, {}, files=[kubelet])) is None


def test_a_scoped_run_finds_a_changed_policys_break_on_every_role() -> None:
    from kilonode.preflight.checks.admission_requests import check_scoped
    from tests.preflight.conftest import artefacts, inputs_of

    _, graph = artefacts(STACK)
    assert direct_index(graph) > 0
    inputs = inputs_of(STACK, graph=graph)
    found = [f for f in check_scoped(inputs, set(), {"kilonode-node-identity"}) if f.level == "break"]
    assert found and all("kilonode-node-identity" in f.where for f in found)
    assert check_scoped(inputs, set(), {"kilonode-reserved-pools"}) == []  # the broken one not re-judged
