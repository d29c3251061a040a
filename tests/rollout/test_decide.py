"""The rollout's decisions against recorded cluster states: which scale set next, what waits,
what stops. The cluster's answers to each step (an instance reimaged into the model, a node
Ready again) are scripted here as the state the next observation would read: no Azure and no
Kubernetes run in these tests, only kilonode.rollout.decide."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from kilonode.rollout import journal as journals
from kilonode.rollout.decide import decide
from kilonode.rollout.model import Action, ClusterState, Instance, Journal, Policy, ScaleSet

FABRICS = ("r-h100-ib-000", "r-h100-ib-001", "r-h100-ib-002")


def fabric(name: str, nodes: int = 3, latest: bool = False) -> ScaleSet:
    return ScaleSet(name, "h100-ib", True, tuple(
        Instance(str(i), f"{name}{i:06d}", latest, ready=True, boot_id=f"{name}-{i}-boot-1") for i in range(nodes)))


def cluster(**gangs: tuple[str, ...]) -> ClusterState:
    return ClusterState(tuple(fabric(n) for n in FABRICS), gangs=dict(gangs))


def rollout(**policy: object) -> Journal:
    """A journal for FABRICS; no cordon ahead, no hold and no steering unless a test asks (each has
    its own test)."""
    policy = {"cordon_ahead": 0, "hold_s": 0, "steer": False, **policy}
    return Journal("research-7500", "image 1.1.0", Policy(order=FABRICS, **policy))  # type: ignore[arg-type]


def applied(state: ClusterState, actions: list[Action], gpu_checks_pass: bool = True) -> ClusterState:
    """What the next observation reads once the actions are carried out: cordon and drain leave
    nodes unschedulable; an upgrade reimages the instances into the model (a new boot ID, Ready,
    GPU checks passed or not); an uncordon makes them schedulable again."""
    sets = {s.name: s for s in state.scale_sets}
    for action in actions:
        s = sets.get(action.scale_set)
        if s is None:
            continue
        instances = []
        for i in s.instances:
            if action.kind == "cordon" and i.node in action.nodes:
                i = replace(i, schedulable=False)
            elif action.kind == "uncordon" and i.node in action.nodes:
                i = replace(i, schedulable=True)
            elif action.kind in ("taint", "untaint") and i.node in action.nodes:
                i = replace(i, steered=action.kind == "taint")
            elif action.kind == "upgrade" and i.instance_id in action.instances:
                i = replace(i, latest_model=True, boot_id=i.boot_id.replace("boot-1", "boot-2"),
                            gpu_pending=not gpu_checks_pass)
            instances.append(i)
        sets[s.name] = replace(s, instances=tuple(instances))
    return replace(state, scale_sets=tuple(sets[n] for n in (s.name for s in state.scale_sets)))


def kinds(actions: list[Action]) -> list[tuple[str, str]]:
    return [(a.kind, a.scale_set) for a in actions]


def test_the_canary_goes_alone_then_soaks_then_the_rest_one_fabric_at_a_time() -> None:
    journal, state, now = rollout(soak_s=600), cluster(), 1000.0
    first = decide(journal, state, now)
    assert kinds(first)[:2] == [("cordon", FABRICS[0]), ("drain", FABRICS[0])]
    assert ("wait", FABRICS[1]) in kinds(first) and "canary" in first[-1].why
    state = applied(state, first)
    assert kinds(decide(journal, state, now + 1))[0] == ("upgrade", FABRICS[0])
    state = applied(state, [Action("upgrade", FABRICS[0], instances=("0", "1", "2"))])
    gated = decide(journal, state, now + 2)
    assert kinds(gated)[0] == ("uncordon", FABRICS[0]) and journal.of(FABRICS[0]).phase == "done"
    state = applied(state, gated)
    waiting = decide(journal, state, now + 300)
    assert all(a.kind == "wait" for a in waiting) and "soaks" in waiting[0].why
    after = decide(journal, state, now + 2 + 600)
    assert kinds(after)[:2] == [("cordon", FABRICS[1]), ("drain", FABRICS[1])]
    assert ("wait", FABRICS[2]) in kinds(after) and "in progress" in after[-1].why  # in_flight 1


def test_a_fabric_where_a_gang_runs_waits_and_is_taken_whole_once_allowed() -> None:
    state = cluster(**{f"{FABRICS[0]}000001": ("team-language/gpt-7b",)})
    journal = rollout()
    [wait, *_] = decide(journal, state, 0.0)
    assert wait.kind == "wait" and "gangs run there: team-language/gpt-7b" in wait.why
    assert journal.of(FABRICS[0]).phase == "pending"
    allowed = rollout(cut_gangs=True)
    cordon, drain, *_ = decide(allowed, state, 0.0)
    assert cordon.nodes == drain.nodes == tuple(f"{FABRICS[0]}{i:06d}" for i in range(3))  # the fabric, whole
    assert "evicts gangs team-language/gpt-7b" in drain.why
    assert allowed.of(FABRICS[0]).gangs_cut == ("team-language/gpt-7b",)


def test_a_gate_that_fails_stops_the_rollout_with_its_nodes_cordoned_and_resume_retries_it() -> None:
    journal, state = rollout(gate_timeout_s=900), cluster()
    state = applied(state, decide(journal, state, 0.0))
    state = applied(state, decide(journal, state, 1.0), gpu_checks_pass=False)  # the upgrade
    waiting = decide(journal, state, 2.0)
    assert waiting[0].kind == "wait" and "GPU health taint" in waiting[0].why
    stopped = decide(journal, state, 2.0 + 901)
    assert stopped[-1].kind == "pause" and journal.of(FABRICS[0]).phase == "failed"
    assert "failed its gate" in journal.paused and "Its nodes stay cordoned" in journal.paused
    assert not any(a.kind in ("cordon", "upgrade", "uncordon") for a in decide(journal, state, 5000.0))
    # nothing else was taken while the canary failed
    assert journal.of(FABRICS[1]).phase == journal.of(FABRICS[2]).phase == "pending"
    said = journals.resume(journal, 6000.0)
    assert said[0] == f"{FABRICS[0]}: its gate is tried again" and not journal.paused
    healthy = replace(state, scale_sets=tuple(
        replace(s, instances=tuple(replace(i, gpu_pending=False) for i in s.instances)) for s in state.scale_sets))
    assert kinds(decide(journal, healthy, 6001.0))[0] == ("uncordon", FABRICS[0])


def test_a_node_that_has_not_rebooted_does_not_pass_its_gate_on_its_old_ready() -> None:
    journal, state = rollout(), cluster()
    state = applied(state, decide(journal, state, 0.0))
    decide(journal, state, 1.0)  # the upgrade, not carried out yet: the instances say they are at the model
    stale = replace(state, scale_sets=tuple(
        replace(s, instances=tuple(replace(i, latest_model=True) for i in s.instances)) if s.name == FABRICS[0]
        else s for s in state.scale_sets))
    [wait, *_] = decide(journal, stale, 2.0)
    assert wait.kind == "wait" and "have not booted into the model" in wait.why


def test_alerts_firing_for_the_pool_keep_a_new_fabric_from_being_taken_and_fail_a_gate() -> None:
    journal = rollout()
    state = replace(cluster(), firing={"h100-ib": ("KilonodeGpuPoolUnhealthy",)})
    [wait, *_] = decide(journal, state, 0.0)
    assert wait.kind == "wait" and "alerts firing for pool h100-ib: KilonodeGpuPoolUnhealthy" in wait.why


def test_scale_sets_already_at_their_model_are_done_and_a_rollback_takes_only_the_moved_ones() -> None:
    # a rollback: the stack's version set back; the fabric never upgraded is at the restored model already
    state = ClusterState((fabric(FABRICS[0]), fabric(FABRICS[1], latest=True), fabric(FABRICS[2], latest=True)))
    journal = rollout(soak_s=0)
    actions = decide(journal, state, 0.0)
    assert kinds(actions)[:2] == [("cordon", FABRICS[0]), ("drain", FABRICS[0])]
    assert journal.of(FABRICS[1]).phase == journal.of(FABRICS[2]).phase == "done"


def test_a_scale_set_without_infiniband_is_taken_in_batches() -> None:
    cpu = ScaleSet("r-cpu-000", "cpu", False, tuple(
        Instance(str(i), f"r-cpu-000{i:06d}", False, ready=True, boot_id=f"cpu-{i}-boot-1") for i in range(5)))
    journal = Journal("s", "1.1.0", Policy(order=("r-cpu-000",), batch=2, cordon_ahead=0, hold_s=0, steer=False))
    state = ClusterState((cpu,))
    cordon, _ = decide(journal, state, 0.0)
    assert cordon.nodes == ("r-cpu-000000000", "r-cpu-000000001")
    state = applied(state, [cordon])
    [upgrade] = decide(journal, state, 1.0)
    assert upgrade.instances == ("0", "1")
    state = applied(state, [upgrade])
    uncordon = decide(journal, state, 2.0)
    assert kinds(uncordon)[0] == ("uncordon", "r-cpu-000") and journal.of("r-cpu-000").phase == "pending"
    state = applied(state, uncordon)
    assert decide(journal, state, 3.0)[0].nodes == ("r-cpu-000000002", "r-cpu-000000003")


def test_a_scale_set_gone_from_the_cluster_pauses_the_rollout() -> None:
    journal = rollout()
    state = ClusterState((fabric(FABRICS[0]), fabric(FABRICS[1])))
    actions = decide(journal, state, 0.0)
    assert actions[-1].kind == "pause" and "r-h100-ib-002: the scale set is not there" in journal.paused


def test_the_journal_survives_a_round_trip_and_refuses_a_broken_file(tmp_path: Path) -> None:
    journal, state = rollout(), cluster()
    decide(journal, state, 0.0)
    path = tmp_path / "rollout.json"
    journals.save(journal, path)
    again = journals.load(path)
    assert again == journal and list(tmp_path.iterdir()) == [path]
    path.write_text('{"version": 1, "stack": "x"}')
    with pytest.raises(ValueError, match="cannot be read: it has no 'progress'; it was not changed"):
        journals.load(path)


# --- a step that ended mid-action (trace 1) ----------------------------------------------------------

def test_a_step_that_ended_during_its_upgrade_resends_only_what_is_left() -> None:
    journal, state = rollout(), cluster()
    state = applied(state, decide(journal, state, 0.0))  # cordon, drain
    upgrade, *_ = decide(journal, state, 1.0)
    assert upgrade.instances == upgrade.reimage == ("0", "1", "2")  # image unknown: reimage (custom data)
    journal.of(FABRICS[0]).doing = "upgrade"  # execute saved it before the Azure call; the step then died
    # Azure went on: 0 and 1 updated and reimaged (booted again); 2 updated, its reimage never sent
    done = applied(state, [Action("upgrade", FABRICS[0], instances=("0", "1"))])
    done = replace(done, scale_sets=tuple(replace(s, instances=tuple(
        replace(i, latest_model=True) for i in s.instances)) if s.name == FABRICS[0] else s for s in done.scale_sets))
    again, *_ = decide(journal, done, 2.0)
    assert again.kind == "upgrade" and again.instances == () and again.reimage == ("2",)
    assert "a step ended during its upgrade" in again.why and journal.of(FABRICS[0]).doing == ""


def test_a_step_that_ended_during_its_drain_drains_again_and_never_upgrades_undrained_nodes() -> None:
    journal, state = rollout(), cluster()
    state = applied(state, decide(journal, state, 0.0))
    journal.of(FABRICS[0]).doing = "drain"
    actions = decide(journal, state, 1.0)
    assert kinds(actions)[:2] == [("cordon", FABRICS[0]), ("drain", FABRICS[0])]
    assert journal.of(FABRICS[0]).phase == "cordoned"


def test_a_scale_set_at_its_model_with_cordoned_nodes_is_gated_and_uncordoned_not_just_done() -> None:
    # the journal of an older kilonode, saved only after execute: still pending, Azure done, nodes cordoned
    journal = rollout(hold_s=600)
    state = replace(cluster(), scale_sets=tuple(
        replace(s, instances=tuple(replace(i, latest_model=True, schedulable=False) for i in s.instances))
        if s.name == FABRICS[0] else s for s in cluster().scale_sets))
    [wait, *_] = decide(journal, state, 1.0)
    assert wait.kind == "wait" and "held 0 of 600 s" in wait.why and journal.of(FABRICS[0]).phase == "gating"
    [uncordon, *_] = decide(journal, state, 601.0)
    assert uncordon.kind == "uncordon" and len(uncordon.nodes) == 3 and journal.of(FABRICS[0]).phase == "done"


def test_an_uncordon_that_a_step_ended_in_is_sent_again() -> None:
    journal, state = rollout(), cluster()
    progress = journal.of(FABRICS[0])
    progress.phase, progress.doing, progress.doing_nodes = "done", "uncordon", ("n1", "n2")
    assert kinds(decide(journal, state, 0.0))[0] == ("uncordon", FABRICS[0])
    assert decide(journal, state, 0.0)[0].nodes != ("n1", "n2")  # once only


# --- gangs (traces 2 and 3) ------------------------------------------------------------------------------

def test_a_cut_gang_that_spans_fabrics_is_evicted_whole() -> None:
    gang = ("team-language/xl",)
    state = cluster(**{f"{FABRICS[0]}000001": gang, f"{FABRICS[2]}000000": gang})
    journal = rollout(cut_gangs=True)
    cordon, evict, drain, *_ = decide(journal, state, 1.0)
    assert (cordon.kind, evict.kind, drain.kind) == ("cordon", "evict", "drain")
    assert evict.groups == gang and evict.nodes == (f"{FABRICS[2]}000000",)
    assert journal.of(FABRICS[0]).gangs_cut == gang
    assert any("evicted whole: also on r-h100-ib-002000000" in line for line in journal.log)


def test_the_next_scale_sets_are_cordoned_ahead_and_a_gang_wait_past_its_bound_pauses() -> None:
    state = cluster(**{f"{FABRICS[0]}000001": ("team-language/gpt-7b",)})
    journal = rollout(cordon_ahead=1, gang_wait_s=3600)
    wait, *_, ahead = decide(journal, state, 10.0)
    assert wait.kind == "wait" and ahead.kind == "cordon" and ahead.scale_set == FABRICS[0]
    assert "cordoned ahead" in ahead.why and len(ahead.nodes) == 3
    state = applied(state, [ahead])
    assert not any(a.kind == "cordon" for a in decide(journal, state, 20.0))  # once
    stopped = decide(journal, state, 10.0 + 3601)
    assert stopped[-1].kind == "pause" and "Gangs hold: r-h100-ib-000: team-language/gpt-7b" in journal.paused
    journals.resume(journal, 4000.0)
    assert journal.of(FABRICS[0]).gangs_since == 0.0 and decide(journal, state, 4001.0)[0].kind == "wait"
    # the gang ends: the fabric is taken, its nodes (cordoned ahead) in the batch
    free = replace(state, gangs={})
    assert kinds(decide(journal, free, 4002.0))[:2] == [("cordon", FABRICS[0]), ("drain", FABRICS[0])]


def test_while_the_canary_rolls_the_next_fabric_is_cordoned_ahead() -> None:
    journal = rollout(cordon_ahead=1)
    actions = decide(journal, cluster(), 1.0)
    assert kinds(actions)[:2] == [("cordon", FABRICS[0]), ("drain", FABRICS[0])]
    assert actions[-1].kind == "cordon" and actions[-1].scale_set == FABRICS[1]


# --- alerts and the hold (trace 4) -----------------------------------------------------------------------

def test_alerts_unknown_block_a_take_and_a_gate_and_a_passing_gate_is_held() -> None:
    journal, state = rollout(hold_s=900), cluster()
    unknown = replace(state, alerts_unknown="Prometheus at monitoring/prometheus:web: ConnectionError")
    [wait, *_] = decide(journal, unknown, 1.0)
    assert wait.kind == "wait" and "alerts unknown" in wait.why
    state = applied(state, decide(journal, state, 2.0))
    state = applied(state, decide(journal, state, 3.0))  # the upgrade
    assert "alerts unknown" in decide(journal, replace(state, alerts_unknown="down"), 4.0)[0].why
    assert "held 0 of 900 s" in decide(journal, state, 5.0)[0].why  # passing from 5
    assert decide(journal, state, 5.0 + 899)[0].kind == "wait"
    assert kinds(decide(journal, state, 5.0 + 900))[0] == ("uncordon", FABRICS[0])


# --- the image (traces 5 and 7) ---------------------------------------------------------------------------

def test_a_new_image_is_not_reimaged_after_update_instances_and_custom_data_alone_is() -> None:
    old, new = "/galleries/g/images/h100/versions/1.0.0", "/galleries/g/images/h100/versions/1.1.0"
    sets = (replace(fabric(FABRICS[0]), model_image=new, instances=tuple(
        replace(i, image=old) for i in fabric(FABRICS[0]).instances)),
            replace(fabric(FABRICS[1]), model_image=new, instances=tuple(
                replace(i, image=new) for i in fabric(FABRICS[1]).instances)))
    journal = Journal("s", "1.1.0", Policy(order=(FABRICS[0], FABRICS[1]), soak_s=0, hold_s=0, cordon_ahead=0))
    state = applied(ClusterState(sets), decide(journal, ClusterState(sets), 0.0))
    [upgrade] = [a for a in decide(journal, state, 1.0) if a.kind == "upgrade"]
    assert upgrade.instances == ("0", "1", "2") and upgrade.reimage == ()  # the image changes: one boot
    custom = ClusterState((sets[1],))
    journal = Journal("s", "1.1.0", Policy(order=(FABRICS[1],), hold_s=0, cordon_ahead=0))
    custom = applied(custom, decide(journal, custom, 0.0))
    [upgrade] = decide(journal, custom, 1.0)
    assert upgrade.reimage == ("0", "1", "2")  # the same image, new custom data: reimaged


def test_an_instance_azure_calls_current_whose_image_is_not_the_models_is_rolled() -> None:
    s = replace(fabric(FABRICS[0], latest=True), model_image="img-1.0.0", instances=tuple(
        replace(i, image="img-1.1.0") for i in fabric(FABRICS[0], latest=True).instances))
    assert not s.current
    assert replace(s, instances=tuple(replace(i, image="img-1.0.0") for i in s.instances)).current


# --- steering: gangs prefer the fabrics already rolled ----------------------------------------------


def test_every_node_not_rolled_is_steered_away_and_lifted_once_its_fabric_passes() -> None:
    journal, state = rollout(soak_s=0, steer=True), cluster()
    first = decide(journal, state, 0.0)
    taints = [a for a in first if a.kind == "taint"]
    assert [a.scale_set for a in taints] == list(FABRICS)  # every fabric, the canary's too
    assert all(len(a.nodes) == 3 for a in taints)
    state = applied(state, first)
    assert not [a for a in decide(journal, state, 1.0) if a.kind in ("taint", "untaint")]  # nothing twice
    state = applied(state, [Action("upgrade", FABRICS[0], instances=("0", "1", "2"))])
    # at the model but still gating: the taint stays until the gate passes
    gated = decide(journal, state, 2.0)
    [lift] = [a for a in gated if a.kind == "untaint"]
    assert lift.scale_set == FABRICS[0] and journal.of(FABRICS[0]).phase == "done"
    state = applied(state, gated)
    assert all(i.steered for s in state.scale_sets[1:] for i in s.instances)
    assert not any(i.steered for i in state.scale_sets[0].instances)


def test_a_new_instance_at_the_model_is_never_steered_and_steer_off_only_lifts() -> None:
    # a scale-out (the autoscaler) brings instances at the model: nothing keeps gangs off them
    grown = ScaleSet(FABRICS[0], "h100-ib", True, (*fabric(FABRICS[0]).instances,
                                                     Instance("9", "new000009", True, ready=True)))
    state = ClusterState((grown,))
    journal = Journal("s", "1.1.0", Policy(order=(FABRICS[0],), cordon_ahead=0, hold_s=0))
    [taint] = [a for a in decide(journal, state, 0.0) if a.kind == "taint"]
    assert "new000009" not in taint.nodes and len(taint.nodes) == 3
    # resumed with steering off: a node still carrying the taint at the model is lifted, none tainted
    steered = ClusterState((replace(grown, instances=tuple(replace(i, steered=True, latest_model=True)
                                                            for i in grown.instances)),))
    off = Journal("s", "1.1.0", Policy(order=(FABRICS[0],), cordon_ahead=0, hold_s=0, steer=False))
    actions = decide(off, steered, 0.0)
    assert [a.kind for a in actions if a.kind in ("taint", "untaint")] == ["untaint"]
