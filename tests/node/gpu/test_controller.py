"""The GPU health taint controller's decisions: from a Node as it is (its GPUHealthy condition,
taints, annotations, bootID) to the Node it writes and the Events it records; each result
checked against Kubernetes' OpenAPI schema, and deciding again on the result changes nothing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kilonode.node.gpu import protocol as p
from kilonode.node.gpu.controller import decide
from tests.node.gpu.nodes import node, run_debian, validate

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

PENDING = p.taint(p.STARTUP_TAINT, p.STARTUP_VALUE)
CHECKING = p.taint(p.CHECK_TAINT, p.CHECK_VALUE)
HOLD = "cluster-autoscaler.kubernetes.io/scale-down-disabled"  # the autoscaler's name for it
UNINITIALIZED = {"key": "node.cloudprovider.kubernetes.io/uninitialized", "value": "true", "effect": "NoSchedule"}


def condition(status: str, reason: str, since: str = "2026-11-23T10:00:00Z", message: str = "m") -> dict[str, Any]:
    return {"type": "GPUHealthy", "status": status, "reason": reason, "message": message,
            "lastHeartbeatTime": since, "lastTransitionTime": since}


def step(before: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One decision; checks the written Node and the Events, and that it is idempotent."""
    decision = decide(before, "apiserver-0")
    assert decision.node is not None, "expected a change"
    validate(decision.node)
    for event in decision.events:
        validate(event)
        assert event["involvedObject"]["uid"] == before["metadata"]["uid"]
    assert decision.node["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"], \
        "the write carries the version read (optimistic concurrency)"
    assert decide(decision.node).node is None, "deciding again changes nothing"
    return decision.node, decision.events


def keys(n: dict[str, Any]) -> list[str]:
    return [f"{t['key']}={t.get('value', '')}" for t in n["spec"].get("taints", [])]


def test_a_passing_first_check_lifts_the_startup_taint_only() -> None:
    after, events = step(node(taints=[UNINITIALIZED, PENDING], conditions=[condition("True", "Passed")]))
    assert keys(after) == ["node.cloudprovider.kubernetes.io/uninitialized=true"]
    assert [(e["type"], e["reason"]) for e in events] == [("Normal", "GPUHealthTaintRemoved")]
    assert "kilonode.io/gpu-health=pending:NoSchedule" in events[0]["message"]


def test_a_failure_taints_once_records_it_and_a_person_returning_the_node_is_respected() -> None:
    failed = node(taints=[PENDING], conditions=[condition("False", "EccVolatile", message="ecc-volatile: GPU 0 ...")])
    after, events = step(failed)
    assert keys(after) == ["kilonode.io/gpu-unhealthy=EccVolatile"]
    # kept with its evidence: the autoscaler may not remove it while it is faulty
    assert after["metadata"]["annotations"] == {p.ANNOTATION_SINCE: "2026-11-23T10:00:00Z", p.ANNOTATION_BOOT: "boot-1",
                                                HOLD: "true", p.ANNOTATION_HELD: "true"}
    assert [(e["type"], e["reason"]) for e in events] == [("Normal", "GPUHealthTaintRemoved"),
                                                          ("Warning", "GPUHealthTaintAdded"),
                                                          ("Normal", "GPUHealthScaleDownDisabled")]
    assert "ecc-volatile: GPU 0" in events[1]["message"]
    # a person removes the taint: the same failure is not tainted again, and the hold goes
    returned = json.loads(json.dumps(after))
    returned["spec"]["taints"] = []
    released, events = step(returned)
    assert keys(released) == [] and HOLD not in released["metadata"]["annotations"]
    assert [e["reason"] for e in events] == ["GPUHealthScaleDownEnabled"]
    returned = released
    # a new failure (a new transition, e.g. after a reboot that failed again) is
    later = json.loads(json.dumps(returned))
    later["status"]["conditions"][1] = condition("False", "Xid79", since="2026-11-24T08:00:00Z")
    again, _ = step(later)
    assert keys(again) == ["kilonode.io/gpu-unhealthy=Xid79"]
    assert again["metadata"]["annotations"][p.ANNOTATION_SINCE] == "2026-11-24T08:00:00Z"


def test_the_fault_taint_is_lifted_only_by_a_passing_check_in_another_boot() -> None:
    tainted = node(boot="boot-1", taints=[p.taint(p.FAULT_TAINT, "EccVolatile")],
                   conditions=[condition("True", "Passed")],
                   annotations={p.ANNOTATION_SINCE: "2026-11-23T10:00:00Z", p.ANNOTATION_BOOT: "boot-1",
                                HOLD: "true", p.ANNOTATION_HELD: "true"})
    assert decide(tainted).node is None  # the same boot: stays out
    rebooted = json.loads(json.dumps(tainted))
    rebooted["status"]["nodeInfo"]["bootID"] = "boot-2"
    after, events = step(rebooted)
    assert keys(after) == [] and HOLD not in after["metadata"]["annotations"]
    assert "after a reboot (boot boot-2, the failure was in boot boot-1)" in events[0]["message"]


def test_a_hold_someone_else_set_is_left_alone() -> None:
    # an operator keeps a healthy node from scale-down: not the controller's to remove
    kept = node(taints=[], conditions=[condition("True", "Passed")], annotations={HOLD: "true"})
    assert decide(kept).node is None
    # a node tainted by an older controller (no hold yet) gets one
    old = node(taints=[p.taint(p.FAULT_TAINT, "Xid79")], conditions=[condition("False", "Xid79")],
               annotations={p.ANNOTATION_SINCE: "2026-11-23T10:00:00Z", p.ANNOTATION_BOOT: "boot-1"})
    held, _ = step(old)
    assert held["metadata"]["annotations"][HOLD] == "true"


def test_the_idle_recheck_gets_its_taint_and_loses_it_when_it_passes() -> None:
    asked = node(conditions=[condition("Unknown", "ActiveCheckRequested")])
    after, events = step(asked)
    assert keys(after) == ["kilonode.io/gpu-check=running"]
    assert events[0]["reason"] == "GPUHealthTaintAdded" and events[0]["type"] == "Normal"
    after["status"]["conditions"][1] = condition("True", "Passed", since="2026-11-23T10:01:00Z")
    done, _ = step(after)
    assert keys(done) == []
    # ... and a failing re-check swaps it for the fault taint
    after["status"]["conditions"][1] = condition("False", "ActiveGemm", since="2026-11-23T10:01:00Z")
    failed, _ = step(after)
    assert keys(failed) == ["kilonode.io/gpu-unhealthy=ActiveGemm"]


def test_the_taints_of_nodes_without_the_condition_or_with_another_unknown_are_left_alone() -> None:
    held = {HOLD: "true", p.ANNOTATION_HELD: "true"}  # a pending node's scale-down hold (below)
    assert decide(node(taints=[PENDING], annotations=held)).node is None
    assert decide(node(taints=[PENDING], annotations=held,
                       conditions=[condition("Unknown", "ActiveCheckUnusable")])).node is None
    assert decide(node(taints=[PENDING], annotations=held,
                       conditions=[condition("Unknown", p.REASON_FABRIC_PENDING)])).node is None
    assert decide(node(taints=[PENDING], annotations=held,
                       conditions=[condition("Unknown", p.REASON_INFINIBAND_PENDING)])).node is None
    assert decide(node(taints=[CHECKING], conditions=[condition("Unknown", "ActiveCheckRequested")])).node is None
    assert decide(node(taints=[])).node is None  # not a GPU node: nothing of the controller's


def test_a_pending_node_is_kept_from_scale_down_until_its_checks_pass() -> None:
    # registered with the startup taint, before the agent's first report (it may be waiting for
    # the NVSwitch fabric): unready to the autoscaler, so it must not be deleted as unready
    registered = node(taints=[UNINITIALIZED, PENDING])
    held, events = step(registered)
    assert keys(held) == keys(registered), "the taints stay as they are"
    assert held["metadata"]["annotations"] == {HOLD: "true", p.ANNOTATION_HELD: "true"}
    assert [(e["type"], e["reason"]) for e in events] == [("Normal", "GPUHealthScaleDownDisabled")]
    assert "kilonode.io/gpu-health=pending" in events[0]["message"]
    # the agent reports it waits for the fabric: nothing changes
    waiting = json.loads(json.dumps(held))
    waiting["status"]["conditions"].append(condition("Unknown", p.REASON_FABRIC_PENDING))
    assert decide(waiting).node is None
    # the checks pass: the startup taint and the hold go together, in one write
    waiting["status"]["conditions"][1] = condition("True", "Passed", since="2026-11-23T10:06:00Z")
    passed, events = step(waiting)
    assert keys(passed) == ["node.cloudprovider.kubernetes.io/uninitialized=true"]
    assert HOLD not in passed["metadata"]["annotations"] and p.ANNOTATION_HELD not in passed["metadata"]["annotations"]
    assert [e["reason"] for e in events] == ["GPUHealthTaintRemoved", "GPUHealthScaleDownEnabled"]
    # they fail (the fabric never registered): the hold stays, now for the fault
    waiting["status"]["conditions"][1] = condition("False", "FabricNotCompleted", since="2026-11-23T10:06:00Z")
    failed, events = step(waiting)
    assert keys(failed) == ["node.cloudprovider.kubernetes.io/uninitialized=true",
                            "kilonode.io/gpu-unhealthy=FabricNotCompleted"]
    assert failed["metadata"]["annotations"][HOLD] == "true" == failed["metadata"]["annotations"][p.ANNOTATION_HELD]
    assert "GPUHealthScaleDown" not in " ".join(e["reason"] for e in events), "the same hold, kept"


def test_a_hold_someone_else_set_on_a_pending_node_is_never_removed() -> None:
    # an operator's hold, set before the controller saw the node: left as it is, not taken over
    theirs = node(taints=[PENDING], annotations={HOLD: "true"})
    assert decide(theirs).node is None
    theirs["status"]["conditions"].append(condition("True", "Passed"))
    passed, _ = step(theirs)
    assert keys(passed) == [] and passed["metadata"]["annotations"] == {HOLD: "true"}
    # ... while a pending node without one gets the controller's own (the control)
    ours, _ = step(node(taints=[PENDING]))
    assert ours["metadata"]["annotations"] == {HOLD: "true", p.ANNOTATION_HELD: "true"}
    # the controller's hold taken over by a person (they remove the marker): theirs from then on
    kept = json.loads(json.dumps(ours))
    del kept["metadata"]["annotations"][p.ANNOTATION_HELD]
    kept["status"]["conditions"].append(condition("True", "Passed"))
    passed, _ = step(kept)
    assert passed["metadata"]["annotations"] == {HOLD: "true"}


def test_a_taint_value_is_label_safe() -> None:
    weird = node(conditions=[condition("False", "Xid 79/fallen off the bus " + "x" * 80)])
    after, _ = step(weird)
    [taint] = after["spec"]["taints"]
    assert len(taint["value"]) <= 63 and taint["value"].startswith("Xid-79-fallen")


def test_the_decision_runs_under_debian_python(tmp_path: Path) -> None:
    path = tmp_path / "node.json"
    path.write_text(json.dumps(node(taints=[PENDING], conditions=[condition("True", "Passed")])))
    result = run_debian(tmp_path, "kilonode.gpu.controller", "--decide", str(path))
    assert result.returncode == 0, result.stderr
    printed = json.loads(result.stdout)
    assert keys(printed["node"]) == [] and printed["events"][0]["reason"] == "GPUHealthTaintRemoved"
    result = run_debian(tmp_path, "kilonode.gpu.controller", "--kubeconfig", str(tmp_path / "missing.kubeconfig"))
    assert result.returncode == 2 and "missing.kubeconfig: No such file or directory" in result.stderr


def test_a_conflicting_write_is_decided_again_on_the_node_as_it_now_is() -> None:
    from kilonode.node.gpu.controller import reconcile
    from kilonode.node.gpu.kubeapi import ApiError

    passed = node(taints=[PENDING], conditions=[condition("True", "Passed")])
    newer = json.loads(json.dumps(passed))
    newer["metadata"]["resourceVersion"] = "4712"
    newer["spec"]["taints"].append(UNINITIALIZED)  # someone else's change in between

    class Client:
        def __init__(self) -> None:
            self.puts: list[dict[str, Any]] = []
            self.events: list[dict[str, Any]] = []

        def replace_node(self, body: dict[str, Any]) -> dict[str, Any]:
            self.puts.append(body)
            if body["metadata"]["resourceVersion"] == "4711":
                raise ApiError(409, "Conflict", "the object has been modified")
            return body

        def get_node(self, name: str) -> dict[str, Any]:
            return newer

        def create_event(self, event: dict[str, Any]) -> dict[str, Any]:
            self.events.append(event)
            return event

    client = Client()
    reconcile(client, passed, "apiserver-0", log=lambda line: None)
    assert [b["metadata"]["resourceVersion"] for b in client.puts] == ["4711", "4712"]
    assert keys(client.puts[-1]) == ["node.cloudprovider.kubernetes.io/uninitialized=true"]
    assert len(client.events) == 1, "one Event, for the write that took"
