"""What execute decides without a cloud: which pods a drain evicts, how it treats the Eviction
API's answers and for how long it retries, and how a failed step pauses the rollout and is
retried on resume."""

from __future__ import annotations

from typing import Any

import pytest

from kilonode.rollout import journal as journals
from kilonode.rollout.execute import (
    Limits,
    PodRef,
    eviction_candidates,
    eviction_outcome,
    execute,
    fail,
    retry_due,
)
from kilonode.rollout.model import Action, Journal, Policy

k8s = pytest.importorskip("kubernetes.client")


def pod(name: str, phase: str = "Running", owner: str | None = None, annotations: dict[str, str] | None = None) -> Any:
    """A Pod as the API returns it (metadata.ownerReferences with controller: true, as a
    controller sets it; the kubelet's mirror pods carry kubernetes.io/config.mirror)."""
    owners = [{"apiVersion": "apps/v1", "kind": owner, "name": "x", "uid": "o", "controller": True}] if owner else None
    return k8s.V1Pod.from_dict({"metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}",
                                             "ownerReferences": owners, "annotations": annotations},
                                "spec": {"nodeName": "n", "containers": [{"name": "c", "image": "x"}]},
                                "status": {"phase": phase}})


def test_a_drain_evicts_workload_pods_and_leaves_daemonset_mirror_and_finished_ones() -> None:
    evict, left = eviction_candidates([
        pod("worker-0", owner="StatefulSet"), pod("bare"), pod("calico-node-x", owner="DaemonSet"),
        pod("kube-proxy-n", annotations={"kubernetes.io/config.mirror": "abc"}), pod("job-done", phase="Succeeded"),
    ])
    assert evict == [PodRef("ns", "worker-0", "uid-worker-0"), PodRef("ns", "bare", "uid-bare")]
    assert [(str(ref), why.split(" ")[0]) for ref, why in left] == [
        ("ns/calico-node-x", "a"), ("ns/kube-proxy-n", "a"), ("ns/job-done", "finished")]


@pytest.mark.parametrize(("status", "outcome"), [(201, "evicted"), (200, "evicted"), (404, "gone"),
                                                 (429, "blocked"), (500, "error"), (403, "error")])
def test_the_eviction_apis_answers(status: int, outcome: str) -> None:
    assert eviction_outcome(status) == outcome


def test_a_blocked_eviction_is_retried_until_the_drains_deadline() -> None:
    limits = Limits(evict_s=900.0)
    assert retry_due(100.0, 100.0 + 899.0, limits)
    assert not retry_due(100.0, 100.0 + 900.0, limits)


def rollout() -> Journal:
    return Journal("research-7500", "h100-ib image 1.1.0", Policy(order=("a", "b")))


def test_a_failed_drain_pauses_the_rollout_and_resume_takes_the_batch_again() -> None:
    journal = rollout()
    journal.of("a").phase, journal.of("a").taken = "cordoned", ("0", "1")
    text = fail(journal, Action("drain", "a", nodes=("a000000",)), TimeoutError("2 pods still held"), 10.0)
    assert journal.of("a").phase == "failed" and journal.paused == text
    assert "a: drain failed: TimeoutError: 2 pods still held" in text and "kubectl get pdb -A" in text
    assert journals.resume(journal, 20.0)[0] == "a: its batch is taken again (cordon, drain)"
    assert journal.of("a").phase == "pending" and journal.of("a").taken == () and not journal.paused


def test_a_failed_upgrade_is_tried_again_and_a_failed_gate_goes_back_to_its_gate() -> None:
    journal = rollout()
    fail(journal, Action("upgrade", "a", instances=("0",)), RuntimeError("quota"), 10.0)
    journal.of("b").phase, journal.of("b").why = "failed", "3 nodes not Ready"  # decide's gate timeout
    journals.resume(journal, 20.0)
    assert journal.of("a").phase == "cordoned" and journal.of("b").phase == "gating"


class Failing:
    """Stands in for the Executor's calls: records them, and the drain raises."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.say = self.calls.append

    def cordon(self, nodes: tuple[str, ...], unschedulable: bool = True) -> None:
        self.calls.append(f"cordon {unschedulable}")

    def drain(self, nodes: tuple[str, ...]) -> None:
        raise TimeoutError("pods still held")

    def upgrade(self, scale_set: str, instances: tuple[str, ...], reimage: tuple[str, ...] = ()) -> None:
        self.calls.append("upgrade")

    def hold(self, nodes: tuple[str, ...], present: bool = True) -> None:
        self.calls.append(f"hold {present}")


def test_execute_stops_at_the_first_failure_and_waits_are_not_carried_out() -> None:
    journal = rollout()
    actions = [Action("cordon", "a", nodes=("a000000",)), Action("drain", "a", nodes=("a000000",)),
               Action("upgrade", "a", instances=("0",)), Action("wait", "b", why="the canary a is not done")]
    done = execute(actions, journal, Failing(), 5.0)  # type: ignore[arg-type]
    assert done[0] == "a: cordon 1 nodes" and done[1].startswith("FAILED a: drain failed")
    assert len(done) == 2 and journal.of("a").phase == "failed" and journal.paused


class Recording(Failing):
    """Every call succeeds; records what the journal said (Progress.doing) at each save."""

    def drain(self, nodes: tuple[str, ...]) -> None:
        self.calls.append("drain")


def test_the_journal_is_saved_before_each_action_with_it_in_flight_and_after_it() -> None:
    journal, saved = rollout(), []
    actions = [Action("drain", "a", nodes=("a000000",)), Action("upgrade", "a", instances=("0",), reimage=("0",)),
               Action("uncordon", "a", nodes=("a000000",))]
    execute(actions, journal, Recording(), 5.0,  # type: ignore[arg-type]
            save=lambda j: saved.append((j.of("a").doing, j.of("a").doing_nodes)))
    assert saved == [("drain", ()), ("", ()), ("upgrade", ()), ("", ()), ("uncordon", ("a000000",)), ("", ())]


def test_a_failure_is_saved_with_nothing_left_in_flight() -> None:
    journal, saved = rollout(), []
    execute([Action("drain", "a", nodes=("a000000",))], journal, Failing(), 5.0,  # type: ignore[arg-type]
            save=lambda j: saved.append(j.of("a").doing))
    assert saved == ["drain", ""] and journal.of("a").phase == "failed"


def test_a_failed_gang_eviction_takes_the_batch_again_on_resume() -> None:
    journal = rollout()
    fail(journal, Action("evict", "a", nodes=("b000000",), groups=("ns/g",)), TimeoutError("held"), 10.0)
    assert journals.resume(journal, 20.0)[0] == "a: its batch is taken again (cordon, drain)"


class Core:
    """CoreV1Api's read_node and patch_node over one node's taints, answering 409 to a write whose
    resourceVersion is not the node's (another writer came between the read and the write)."""

    def __init__(self, taints: list[dict[str, str]], conflicts: int = 0) -> None:
        self.taints, self.version, self.conflicts, self.writes = taints, 1, conflicts, 0
        self.api_client = k8s.ApiClient()

    def read_node(self, name: str) -> Any:
        return k8s.V1Node.from_dict({"metadata": {"name": name, "resourceVersion": str(self.version)},
                                     "spec": {"taints": self.taints}})

    def patch_node(self, name: str, body: dict[str, Any]) -> None:
        if self.conflicts:
            self.conflicts -= 1
            self.version += 1  # the GPU health agent wrote meanwhile
            raise k8s.exceptions.ApiException(status=409, reason="Conflict")
        assert body["metadata"]["resourceVersion"] == str(self.version)
        self.taints, self.version, self.writes = body["spec"]["taints"], self.version + 1, self.writes + 1


def test_the_pending_taint_keeps_the_others_and_rereads_on_a_conflict() -> None:
    from kilonode.rollout.execute import Executor
    from kilonode.rollout.model import PENDING_TAINT_KEY

    gpu = {"key": "kilonode.io/gpu-unhealthy", "effect": "NoSchedule"}
    core = Core([gpu], conflicts=2)
    executor = Executor(None, None, "rg", say=lambda _: None)
    executor._core = lambda: core  # type: ignore[method-assign]
    executor.taint(["n1"])
    assert core.taints == [gpu, {"key": PENDING_TAINT_KEY, "effect": "PreferNoSchedule"}] and core.writes == 1
    executor.taint(["n1"])  # already there: no write
    assert core.writes == 1
    executor.taint(["n1"], present=False)
    assert core.taints == [gpu] and core.writes == 2
    with pytest.raises(RuntimeError, match="kept changing"):
        Core.__init__(core, [gpu], conflicts=9)
        executor.taint(["n1"])


def test_a_failed_taint_pauses_without_failing_the_scale_set() -> None:
    journal = rollout()
    fail(journal, Action("taint", "a", nodes=("a000000",)), RuntimeError("forbidden"), 10.0)
    assert journal.paused and journal.of("a").phase == "pending"


# --- the scale-down hold, written with the cordon ---------------------------------------------------

class Annotated:
    """CoreV1Api's read_node and patch_node over one node's annotations and spec.unschedulable
    (a merge patch: a null value removes the key), answering 409 as Core does."""

    def __init__(self, annotations: dict[str, str], unschedulable: bool = False, conflicts: int = 0) -> None:
        self.annotations, self.unschedulable, self.version = dict(annotations), unschedulable, 1
        self.conflicts, self.writes = conflicts, 0

    def read_node(self, name: str) -> Any:
        return k8s.V1Node.from_dict({"metadata": {"name": name, "resourceVersion": str(self.version),
                                                  "annotations": dict(self.annotations)},
                                     "spec": {"unschedulable": self.unschedulable}})

    def patch_node(self, name: str, body: dict[str, Any]) -> None:
        if self.conflicts:
            self.conflicts -= 1
            self.version += 1
            raise k8s.exceptions.ApiException(status=409, reason="Conflict")
        assert body["metadata"]["resourceVersion"] == str(self.version)
        for key, value in body["metadata"].get("annotations", {}).items():
            if value is None:
                self.annotations.pop(key, None)
            else:
                self.annotations[key] = value
        self.unschedulable = body.get("spec", {}).get("unschedulable", self.unschedulable)
        self.version, self.writes = self.version + 1, self.writes + 1


def executor_on(core: Annotated) -> Any:
    from kilonode.rollout.execute import Executor

    executor = Executor(None, None, "rg", say=lambda _: None)
    executor._core = lambda: core  # type: ignore[method-assign]
    return executor


SDD, MARK = "cluster-autoscaler.kubernetes.io/scale-down-disabled", "kilonode.io/rollout-held"
CONTROLLER_HELD = "kilonode.io/gpu-unhealthy-held"


def test_a_cordon_puts_the_hold_on_with_its_mark_and_an_uncordon_lifts_both_each_once() -> None:
    core = Annotated({"other": "x"}, conflicts=1)
    executor = executor_on(core)
    executor.cordon(["n1"])
    assert core.unschedulable and core.annotations == {"other": "x", SDD: "true", MARK: "true"} and core.writes == 1
    executor.cordon(["n1"])  # carried out again (a step ended in it): nothing left to write
    assert core.writes == 1
    executor.cordon(["n1"], unschedulable=False)
    assert not core.unschedulable and core.annotations == {"other": "x"} and core.writes == 2
    executor.cordon(["n1"], unschedulable=False)  # again: nothing
    assert core.writes == 2


def test_a_hold_the_gpu_health_controller_or_a_person_set_is_never_lifted() -> None:
    for theirs in ({SDD: "true", CONTROLLER_HELD: "true"}, {SDD: "true"}):
        core = Annotated(theirs)
        executor = executor_on(core)
        executor.cordon(["n1"])
        assert core.unschedulable and core.annotations == theirs  # not marked the rollout's
        executor.cordon(["n1"], unschedulable=False)
        assert not core.unschedulable and core.annotations == theirs
    # the controller marked it its own between observe and the cordon's write: the mark goes, its hold stays
    core = Annotated({SDD: "true", MARK: "true", CONTROLLER_HELD: "true"}, unschedulable=True)
    executor_on(core).cordon(["n1"], unschedulable=False)
    assert core.annotations == {SDD: "true", CONTROLLER_HELD: "true"}


def test_hold_and_release_alone_and_a_failed_one_pauses_without_failing_the_scale_set() -> None:
    core = Annotated({})
    executor = executor_on(core)
    executor.hold(["n1"])
    assert core.annotations == {SDD: "true", MARK: "true"} and not core.unschedulable
    executor.hold(["n1"], present=False)
    assert core.annotations == {}
    journal = rollout()
    fail(journal, Action("hold", "a", nodes=("a000000",)), RuntimeError("forbidden"), 10.0)
    assert journal.paused and journal.of("a").phase == "pending"


def test_a_release_is_saved_in_flight_with_its_nodes() -> None:
    journal, saved = rollout(), []
    execute([Action("release", "a", nodes=("a000000",))], journal, Recording(), 5.0,  # type: ignore[arg-type]
            save=lambda j: saved.append((j.of("a").doing, j.of("a").doing_nodes)))
    assert saved == [("release", ("a000000",)), ("", ())]
