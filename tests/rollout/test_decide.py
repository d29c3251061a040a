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


def applied(state: ClusterState, actions: list[Action], gpu_checks_pass: bool = True,
            gpu_at: float = 1e12) -> ClusterState:
    """What the next observation reads once the actions are carried out: cordon and drain leave
    nodes unschedulable and held from the autoscaler; an upgrade reimages the instances into the
    model (a new boot ID, Ready, GPU checks passed or not: a GPUHealthy condition True or False
    from after the send, at `gpu_at`); an uncordon makes them schedulable again, the hold lifted."""
    sets = {s.name: s for s in state.scale_sets}
    for action in actions:
        s = sets.get(action.scale_set)
        if s is None:
            continue
        instances = []
        for i in s.instances:
            if action.kind in ("cordon", "hold") and i.node in action.nodes:
                # execute.hold_patch: the rollout's hold (and its mark) only where none is there
                mark = i.held or not i.scale_down_disabled
                i = replace(i, schedulable=i.schedulable and action.kind == "hold", scale_down_disabled=True,
                            held=mark)
            elif action.kind in ("uncordon", "release") and i.node in action.nodes:
                i = replace(i, schedulable=i.schedulable or action.kind == "uncordon",
                            scale_down_disabled=i.scale_down_disabled and not i.held, held=False)
            elif action.kind in ("taint", "untaint") and i.node in action.nodes:
                i = replace(i, steered=action.kind == "taint")
            elif action.kind == "upgrade" and i.instance_id in action.instances:
                i = replace(i, latest_model=True, boot_id=i.boot_id.replace("boot-1", "boot-2"),
                            gpu_pending=not gpu_checks_pass, gpu_condition="True" if gpu_checks_pass else "False",
                            gpu_since=gpu_at)
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
    # a scale-out (the autoscaler) brings instances at the model: in a scale set taken in batches (no
    # InfiniBand) only the instances behind the model are taken, so nothing keeps gangs off the new one
    cpu = ScaleSet("r-cpu-000", "cpu", False, (
        *(Instance(str(i), f"r-cpu-000{i:06d}", False, ready=True) for i in range(3)),
        Instance("9", "new000009", True, ready=True)))
    state = ClusterState((cpu,))
    journal = Journal("s", "1.1.0", Policy(order=("r-cpu-000",), cordon_ahead=0, hold_s=0))
    [taint] = [a for a in decide(journal, state, 0.0) if a.kind == "taint"]
    assert "new000009" not in taint.nodes and len(taint.nodes) == 3
    # resumed with steering off: a node still carrying the taint at the model is lifted, none tainted
    steered = ClusterState((replace(cpu, instances=tuple(replace(i, steered=True, latest_model=True)
                                                          for i in cpu.instances)),))
    off = Journal("s", "1.1.0", Policy(order=("r-cpu-000",), cordon_ahead=0, hold_s=0, steer=False))
    actions = decide(off, steered, 0.0)
    assert [a.kind for a in actions if a.kind in ("taint", "untaint")] == ["untaint"]


# --- the autoscaler's scale-down hold (model.SCALE_DOWN_DISABLED) ----------------------------------

def held(state: ClusterState, name: str) -> dict[str, tuple[bool, bool]]:
    """node -> (scale-down disabled, by the rollout) for scale set `name`."""
    found = state.scale_set(name)
    assert found is not None
    return {i.node or "": (i.scale_down_disabled, i.held) for i in found.instances}


def test_every_node_the_rollout_keeps_cordoned_is_held_from_scale_down_until_its_gate_passes() -> None:
    journal, state = rollout(cordon_ahead=1, hold_s=600), cluster()
    first = decide(journal, state, 0.0)
    assert kinds(first) == [("cordon", FABRICS[0]), ("drain", FABRICS[0]), ("wait", FABRICS[1]),
                            ("wait", FABRICS[2]), ("cordon", FABRICS[1])]  # the batch, and one ahead
    state = applied(state, first)
    assert set(held(state, FABRICS[0]).values()) == set(held(state, FABRICS[1]).values()) == {(True, True)}
    upgrade = decide(journal, state, 1.0)
    assert not [a for a in upgrade if a.kind in ("hold", "release")]  # nothing lost: nothing to mend
    state = applied(state, upgrade)
    for now in (2.0, 300.0):  # through the boot and the hold
        assert not [a for a in decide(journal, state, now) if a.kind in ("hold", "release")]
    passed = decide(journal, state, 700.0)
    assert kinds(passed)[0] == ("uncordon", FABRICS[0])
    state = applied(state, passed)
    assert set(held(state, FABRICS[0]).values()) == {(False, False)}  # lifted with the uncordon
    assert set(held(state, FABRICS[1]).values()) == {(True, True)}  # still cordoned ahead


def test_a_hold_the_gpu_health_controller_set_is_kept_and_one_it_lifts_mid_roll_is_put_back() -> None:
    journal, state = rollout(hold_s=600), cluster()
    own = FABRICS[0] + "000001"  # pending GPU checks: the controller's hold (no ROLLOUT_HOLD mark)
    state = replace(state, scale_sets=(replace(state.scale_sets[0], instances=tuple(
        replace(i, scale_down_disabled=True) if i.node == own else i for i in state.scale_sets[0].instances)),
        *state.scale_sets[1:]))
    state = applied(state, decide(journal, state, 0.0))
    assert held(state, FABRICS[0])[own] == (True, False)  # not marked the rollout's
    state = applied(state, decide(journal, state, 1.0))  # upgraded
    # the controller lifts its own hold once the node's GPU taints go: the rollout puts its own on
    lifted = replace(state, scale_sets=(replace(state.scale_sets[0], instances=tuple(
        replace(i, scale_down_disabled=False) if i.node == own else i for i in state.scale_sets[0].instances)),
        *state.scale_sets[1:]))
    rollout_copy = journals.loads(journals.dumps(journal))
    mend = [a for a in decide(rollout_copy, lifted, 2.0) if a.kind == "hold"]
    assert mend == [Action("hold", FABRICS[0], nodes=(own,), why=mend[0].why)]
    assert rollout_copy.of(FABRICS[0]).phase == "gating"
    # had it kept it: the uncordon leaves the controller's hold where it is
    decide(journal, state, 2.0)  # the gate passes: held
    state = applied(state, passed := decide(journal, state, 700.0))
    assert kinds(passed)[0] == ("uncordon", FABRICS[0])
    assert held(state, FABRICS[0])[own] == (True, False)
    assert {n: h for n, h in held(state, FABRICS[0]).items() if n != own} == {
        FABRICS[0] + "000000": (False, False), FABRICS[0] + "000002": (False, False)}


def test_a_node_uncordoned_by_hand_with_the_rollouts_hold_is_released() -> None:
    journal, state = rollout(), cluster()
    stray = FABRICS[2] + "000000"
    state = replace(state, scale_sets=(*state.scale_sets[:2], replace(state.scale_sets[2], instances=tuple(
        replace(i, scale_down_disabled=True, held=True) if i.node == stray else i
        for i in state.scale_sets[2].instances))))
    release = [a for a in decide(journal, state, 0.0) if a.kind == "release"]
    assert [(a.scale_set, a.nodes) for a in release] == [(FABRICS[2], (stray,))]
    # cordoned (by a rollout whose journal was set aside): kept until it is uncordoned
    cordoned = replace(state, scale_sets=(*state.scale_sets[:2], replace(state.scale_sets[2], instances=tuple(
        replace(i, schedulable=False) if i.node == stray else i for i in state.scale_sets[2].instances))))
    assert not [a for a in decide(rollout(), cordoned, 0.0) if a.kind == "release"]


def test_a_hold_or_release_a_step_ended_in_is_carried_out_again() -> None:
    journal, state = rollout(), cluster()
    state = applied(state, decide(journal, state, 0.0))
    # a step that died while putting the hold back on a taken fabric: taken again, never upgraded undrained
    journal.of(FABRICS[0]).doing = "hold"
    again = decide(journal, state, 1.0)
    assert kinds(again)[:2] == [("cordon", FABRICS[0]), ("drain", FABRICS[0])]
    assert "upgrade" not in [a.kind for a in again]
    # one that died lifting it: lifted again
    journal.of(FABRICS[1]).doing, journal.of(FABRICS[1]).doing_nodes = "release", (FABRICS[1] + "000000",)
    again = decide(journal, state, 2.0)
    assert Action("release", FABRICS[1], nodes=(FABRICS[1] + "000000",),
                  why="again: a step ended during its release") in again
    # one that died mid-cordon left some nodes without their hold: the next step puts it on
    partly = replace(state, scale_sets=(replace(state.scale_sets[0], instances=tuple(
        replace(i, scale_down_disabled=False, held=False) if i.instance_id == "2" else i
        for i in state.scale_sets[0].instances)), *state.scale_sets[1:]))
    mend = [a for a in decide(journal, partly, 3.0) if a.kind == "hold"]
    assert [a.nodes for a in mend] == [(FABRICS[0] + "000002",)]


# --- the GPU gate: a pass from the new boot ---------------------------------------------------------

def gpu_cluster() -> ClusterState:
    return replace(cluster(), scale_sets=tuple(replace(s, gpu=True) for s in cluster().scale_sets))


def test_a_reimaged_node_passes_only_on_a_gpu_verdict_from_after_its_upgrade_was_sent() -> None:
    journal, state = rollout(), gpu_cluster()
    state = applied(state, decide(journal, state, 100.0))  # taken at 100
    upgrade = decide(journal, state, 200.0)  # sent at 200
    assert journal.of(FABRICS[0]).upgrade_sent == {f"{FABRICS[0]}{i:06d}": 200.0 for i in range(3)}
    # rebooted and Ready, no GPU taint (the Node kept its own: no startup taint comes back) and the
    # condition still the old boot's: True since an idle re-check after the drain (150, after the take)
    state = applied(state, upgrade, gpu_at=150.0)
    why = decide(journal, state, 300.0)[0].why
    assert "3 nodes have no GPU health pass from their new boot yet" in why
    assert journal.of(FABRICS[0]).phase == "gating"
    # the new boot's agent reports: its first report's lastTransitionTime is its own time
    state = replace(state, scale_sets=(replace(state.scale_sets[0], instances=tuple(
        replace(i, gpu_since=400.0) for i in state.scale_sets[0].instances)), *state.scale_sets[1:]))
    passed = decide(journal, state, 500.0)
    assert kinds(passed)[0] == ("uncordon", FABRICS[0]) and journal.of(FABRICS[0]).upgrade_sent == {}


def test_a_gpu_verdict_not_true_or_absent_blocks_the_gate_and_a_pool_without_gpus_needs_none() -> None:
    journal, state = rollout(), gpu_cluster()
    state = applied(state, decide(journal, state, 100.0))
    state = applied(state, decide(journal, state, 200.0), gpu_at=400.0)
    for status in ("Unknown", ""):
        unsure = replace(state, scale_sets=(replace(state.scale_sets[0], instances=tuple(
            replace(i, gpu_condition=status) for i in state.scale_sets[0].instances)), *state.scale_sets[1:]))
        assert "no GPU health pass from their new boot" in decide(journals.loads(journals.dumps(journal)),
                                                                  unsure, 500.0)[0].why
    cpu_journal, cpu = rollout(), cluster()  # gpu=False: no GPU condition asked for
    cpu = applied(cpu, decide(cpu_journal, cpu, 100.0))
    cpu = applied(cpu, decide(cpu_journal, cpu, 200.0), gpu_at=0.0)
    assert kinds(decide(cpu_journal, cpu, 500.0))[0] == ("uncordon", FABRICS[0])


def test_a_resent_upgrade_moves_the_gpu_verdicts_bound_for_the_nodes_it_boots() -> None:
    journal, state = rollout(), gpu_cluster()
    state = applied(state, decide(journal, state, 100.0))
    decide(journal, state, 200.0)  # the upgrade sent; the step ends during it
    journal.of(FABRICS[0]).doing = "upgrade"
    again = decide(journal, state, 250.0)
    assert again[0].kind == "upgrade" and set(journal.of(FABRICS[0]).upgrade_sent.values()) == {250.0}


def test_a_scale_outs_new_instance_in_a_fabric_not_rolled_is_steered_away_too() -> None:
    """A fabric is taken whole: a new instance the autoscaler added there (at the model already) would
    draw a restarted gang that the fabric's turn then cuts again."""
    grown = ScaleSet(FABRICS[1], "h100-ib", True, (*fabric(FABRICS[1]).instances,
                                                     Instance("9", "new000009", True, ready=True)))
    state = ClusterState((fabric(FABRICS[0]), grown))
    journal = Journal("s", "1.1.0", Policy(order=(FABRICS[0], FABRICS[1]), cordon_ahead=0, hold_s=0))
    taints = {a.scale_set: a.nodes for a in decide(journal, state, 0.0) if a.kind == "taint"}
    assert "new000009" in taints[FABRICS[1]] and len(taints[FABRICS[1]]) == 4
