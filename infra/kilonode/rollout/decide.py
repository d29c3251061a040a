"""The next steps of a rollout, from its journal and the cluster as it is now. Pure: the journal
is advanced as if the steps succeed (execute marks a scale set failed, and pauses the rollout,
where one does not), and nothing is read or written outside the arguments.

A scale set goes pending -> cordoned (cordoned and drained) -> upgrading (its model applied by
updateInstances; then reimaged, only where the image did not change: an image change already
re-provisions the OS disk, and a reimage after it would boot the instance a second time) ->
gating (until its nodes are Ready, past their GPU health
checks, and its pool's alerts are quiet) -> done, or failed when the gate does not pass within
the policy's timeout: the rollout then pauses until the operator resumes it (the gate is tried
again) or rolls back (the stack's previous version, then the same rollout; an instance already at
the restored model needs nothing). A scale set with InfiniBand is one fabric and is taken whole;
one without is taken `batch` instances at a time, back to pending between batches.

Gangs: a scale set is not taken while a pod of a PodGroup runs on the nodes it would drain
(scheduler-plugins' label scheduling.x-k8s.io/pod-group: kilonode.k8s.gang), unless the policy
allows cutting gangs; then the journal records the groups its drain evicts. A gang is kept in one
fabric by its pod affinity (kilonode.k8s.gang.fabric_affinity), except one that opts out
(kilonode.k8s.gang.CROSS_FABRIC_ANNOTATION, past the kilonode-gang-size policy): so a cut gang is
evicted whole, its pods on other fabrics too (an `evict` action naming its groups), never cut in
half. The next `cordon_ahead` pending scale sets are cordoned ahead of their turn so no new gang
lands there while the ones running finish; a scale set that waits for its gangs longer than
`gang_wait_s` pauses the rollout, naming which gangs hold which scale set. And every node not yet
rolled carries a PreferNoSchedule taint (Policy.steer, lifted once its batch passes its gate): a gang
that restarts after the rollout cut it, or a new one, prefers a rolled fabric over one the rollout
will take (and cut again).

A step that ends mid-action (a crash during a drain or an Azure call) leaves the action in the
journal (Progress.doing, saved before it is carried out): the next step carries it out again,
each safe to repeat (cordon, evict and drain are idempotent; `_upgrade` re-sends updateInstances
only for instances not at the model and a reimage only for those not booted since they were
taken). A scale set found at its model with instances still taken or cordoned is gated, then
uncordoned: never marked done with its nodes cordoned.

Every node the rollout keeps cordoned (a batch taken, a cordon ahead) carries the cluster
autoscaler's scale-down-disabled annotation, put on by its cordon and lifted by its uncordon
(kilonode.rollout.execute.hold_patch; _holds mends a lost or a stray one), never lifting one
someone else set. On a GPU pool a rebooted node passes its gate only on a GPU health verdict
from its new boot (_fresh_pass).

A gate passes once its checks have kept passing for `hold_s` (an alert's `for:` has had time to
fire); alerts that could not be read (ClusterState.alerts_unknown) block it, never pass it. The
one exception is the pool named by Policy.without_alerts, the one that runs the cluster's
Prometheus (only `start --without-alerts` sets it, and only there): rolling it evicts the
Prometheus the alerts come from, so its gate reads none and waits instead for that Prometheus
Ready again (ClusterState.prometheus_ready), its batch uncordoned once its node checks pass so
Prometheus can be scheduled there (_uncordon_for_prometheus), then held `hold_s` as any gate.

The canary (the policy's first scale set) goes alone; the rest start once it has been done for
`soak_s`, `in_flight` at a time, and none starts while its pool has an alert firing.
"""

from __future__ import annotations

from kilonode.rollout.model import Action, ClusterState, Instance, Journal, Progress, ScaleSet, dark_alerting

BUSY = ("cordoned", "upgrading", "gating")


def _batch(journal: Journal, scale_set: ScaleSet) -> tuple[Instance, ...]:
    """The instances a new batch takes: a fabric whole; else the next `batch` not at the model."""
    if scale_set.infiniband:
        return scale_set.instances
    return tuple(i for i in scale_set.instances if not scale_set.at_model(i))[: journal.policy.batch]


def _nodes(instances: tuple[Instance, ...]) -> tuple[str, ...]:
    return tuple(i.node for i in instances if i.node)


def _gangs(state: ClusterState, instances: tuple[Instance, ...]) -> tuple[str, ...]:
    return tuple(sorted({g for n in _nodes(instances) for g in state.gangs.get(n, ())}))


def _elsewhere(state: ClusterState, groups: tuple[str, ...], nodes: tuple[str, ...]) -> tuple[str, ...]:
    """The nodes outside `nodes` where a pod of one of `groups` runs (a cross-fabric gang's)."""
    wanted, inside = set(groups), set(nodes)
    return tuple(sorted(n for n, gs in state.gangs.items() if n not in inside and wanted & set(gs)))


def _taken(scale_set: ScaleSet, progress: Progress) -> tuple[Instance, ...]:
    return tuple(i for i in scale_set.instances if i.instance_id in progress.taken)


def _gate(journal: Journal, state: ClusterState, scale_set: ScaleSet, progress: Progress) -> str:
    """Why the batch's gate does not pass yet ('' when it does): its nodes' checks, then its pool's
    alerts (or, for the Policy.without_alerts pool, its Prometheus Ready again)."""
    return _node_checks(state, scale_set, progress) or _pool_check(journal, state, scale_set.pool)


def _node_checks(state: ClusterState, scale_set: ScaleSet, progress: Progress) -> str:
    """Why the batch's nodes do not pass yet ('' when they do)."""
    taken = _taken(scale_set, progress)
    behind = [i.instance_id for i in taken if not scale_set.at_model(i)]
    if behind:
        return f"{len(behind)} instances not at the model yet"
    missing = [i.instance_id for i in taken if not i.node]
    if missing:
        return f"instances {', '.join(missing[:5])} have not registered a Node"
    # a node that has not booted since it was taken still shows its old Ready (only those taken
    # behind the model have a boot ID recorded: one already at it is not booted again)
    stale = [i.node for i in taken if i.node and i.node in progress.boot_ids and i.boot_id == progress.boot_ids[i.node]]
    if stale:
        return f"{len(stale)} nodes have not booted into the model yet ({', '.join(sorted(n for n in stale if n)[:5])})"
    unready = [i.node for i in taken if i.node and not i.ready]
    if unready:
        return f"{len(unready)} nodes not Ready ({', '.join(sorted(n for n in unready if n)[:5])})"
    pending = [i.node for i in taken if i.node and i.gpu_pending]
    if pending:
        return f"{len(pending)} nodes still carry a GPU health taint ({', '.join(sorted(n for n in pending if n)[:5])})"
    if scale_set.gpu:
        old = [i.node for i in taken if i.node and i.node in progress.boot_ids and not _fresh_pass(i, progress)]
        if old:
            return (f"{len(old)} nodes have no GPU health pass from their new boot yet "
                    f"({', '.join(sorted(n for n in old if n)[:5])})")
    return ""


def _pool_check(journal: Journal, state: ClusterState, pool: str) -> str:
    """The pool's part of a gate: its alerts; for the Policy.without_alerts pool (the one that
    runs the cluster's Prometheus) that Prometheus Ready again instead, since its alerts are the
    ones this rollout made dark."""
    if pool != journal.policy.without_alerts:
        return _alerts(journal, state, pool)
    if state.prometheus_unknown:
        return f"Prometheus unknown ({state.prometheus_unknown}): the gate waits for it Ready again"
    if not state.prometheus_node:
        return (f"Prometheus {state.prometheus_pod or '(no pod)'} is not bound to a node yet: the gate waits for it "
                f"Ready again ({dark_alerting(pool)})")
    if not state.prometheus_ready:
        return f"Prometheus {state.prometheus_pod} on {state.prometheus_node} is not Ready yet ({dark_alerting(pool)})"
    return ""


def _fresh_pass(instance: Instance, progress: Progress) -> bool:
    """The node's GPUHealthy condition is True and came after its upgrade was sent. The taints
    cannot say it: a reimaged VM keeps its Node (the kubelet finds it by name and registers
    nothing, so the startup taint is not put back: kubelet_node_status.go tryRegisterWithAPIServer;
    kilonode.node.gpu.agent.Agent.startup says the same), and a Ready node with a new boot ID
    would pass on the old boot's verdict. The agent writes no boot ID into the condition, but it
    keeps its state per boot, so its first report of a boot carries that report's time as
    lastTransitionTime (agent._report). Not lastHeartbeatTime: the old boot refreshes it unchanged
    (every heartbeat_s). Not the time the batch was taken either: the drain leaves the node idle,
    and a due idle re-check (Agent.loop, every active_interval_s; overdue on a busy node) turns
    the old boot's condition Unknown and True again meanwhile, a lastTransitionTime after the take.
    What is left is an old-boot change between the send and Azure stopping the VM, and then the
    new boot's first report (always written: a fresh state) moves the condition again before the
    hold ends. An instance with no send recorded (a journal from before upgrade_sent) needs True only."""
    sent = progress.upgrade_sent.get(instance.node or "", 0.0)
    return instance.gpu_condition == "True" and instance.gpu_since > sent


def _alerts(journal: Journal, state: ClusterState, pool: str) -> str:
    """Why the pool's alerts stop a gate or a take: unknown (never a pass), or firing. Not read
    for the Policy.without_alerts pool only: its alerts come from the Prometheus this rollout
    evicts (its gate waits on that Prometheus instead, _pool_check); every other pool's block."""
    if pool and pool == journal.policy.without_alerts:
        return ""
    if state.alerts_unknown:
        return f"alerts unknown ({state.alerts_unknown}): nothing passes until they can be read"
    firing = state.firing.get(pool, ())
    if firing:
        return f"alerts firing for pool {pool}: {', '.join(firing)}"
    return ""


def _may_start(journal: Journal, state: ClusterState, name: str, now: float) -> str:
    """Why scale set `name` may not be taken now ('' when it may)."""
    order = journal.policy.order
    canary = order[0]
    busy = [n for n in order if journal.of(n).phase in BUSY]
    if name != canary:
        if journal.of(canary).phase != "done":
            return f"the canary {canary} is not done"
        if now - journal.canary_passed_at < journal.policy.soak_s:
            return f"the canary soaks until {journal.policy.soak_s - (now - journal.canary_passed_at):.0f} s from now"
    if len(busy) >= (1 if name == canary else journal.policy.in_flight):
        return f"{len(busy)} scale sets in progress ({', '.join(busy)})"
    return ""


def decide(journal: Journal, state: ClusterState, now: float) -> list[Action]:
    """The steps to take now, advancing `journal` as if they succeed."""
    if journal.paused:
        return [Action("pause", why=journal.paused)]
    actions: list[Action] = []
    for name in journal.policy.order:
        progress, scale_set = journal.of(name), state.scale_set(name)
        if scale_set is None:
            progress.phase, progress.why = "failed", "the scale set is not there"
            journal.paused = f"{name}: the scale set is not there (was it removed from the stack?)"
            return [Action("pause", name, why=journal.paused)]
        actions += _advance(journal, state, scale_set, progress, now)
        if journal.paused:
            return [*actions, Action("pause", name, why=journal.paused)]
    actions += _cordon_ahead(journal, state)
    actions += _holds(journal, state, actions)
    actions += _steer(journal, state)
    if all(journal.of(n).phase == "done" for n in journal.policy.order):
        return [*actions, Action("done", why=f"every scale set runs {journal.target}")]
    return actions


def _advance(journal: Journal, state: ClusterState, scale_set: ScaleSet, progress: Progress,
             now: float) -> list[Action]:
    name = scale_set.name
    if progress.doing:
        again = _again(journal, state, scale_set, progress, now)
        if again:
            return again
    if progress.phase in ("done", "failed"):
        return []
    if progress.phase == "pending":
        return _take(journal, state, scale_set, progress, now)
    taken = _taken(scale_set, progress)
    if progress.phase == "cordoned":
        _enter(journal, name, progress, "upgrading", now, "")
        return [_sent(scale_set, progress, _upgrade(scale_set, taken, progress), now)]
    if progress.phase == "upgrading":
        behind = sum(not scale_set.at_model(i) for i in taken)
        if behind:
            return _timed(journal, progress, name, now, f"{behind} instances being upgraded")
        _enter(journal, name, progress, "gating", now, "")
    return _gate_or_pass(journal, state, scale_set, progress, now)


def _upgrade(scale_set: ScaleSet, taken: tuple[Instance, ...], progress: Progress, why: str = "") -> Action:
    """updateInstances for the batch's instances not at the model; then a reimage for those not
    booted since they were taken whose image does not change (an image change re-provisions the
    OS disk in updateInstances already). Sent again after a step ended mid-upgrade, it repeats only
    what is left: an instance updated and booted is in neither list."""
    update = [i for i in taken if not scale_set.at_model(i)]
    unbooted = [i for i in taken if i.node in progress.boot_ids and i.boot_id == progress.boot_ids[i.node]]
    reimage = [i for i in taken if (i in update or i in unbooted) and not scale_set.image_changes(i)]
    return Action("upgrade", scale_set.name, instances=tuple(i.instance_id for i in update),
                  reimage=tuple(i.instance_id for i in reimage), why=why)


def _sent(scale_set: ScaleSet, progress: Progress, action: Action, now: float) -> Action:
    """Record when the upgrade that boots each node was sent (Progress.upgrade_sent, for _fresh_pass)."""
    ids = {*action.instances, *action.reimage}
    for i in scale_set.instances:
        if i.node and i.instance_id in ids:
            progress.upgrade_sent[i.node] = now
    return action


def _again(journal: Journal, state: ClusterState, scale_set: ScaleSet, progress: Progress,
           now: float) -> list[Action]:
    """The action a step ended in (Progress.doing), carried out again; [] when nothing is left of it."""
    doing, name = progress.doing, scale_set.name
    progress.doing = ""
    journal.log.append(f"{now:.0f} {name} {doing} was interrupted: carried out again")
    why = f"again: a step ended during its {doing}"
    if doing == "cordon" and progress.phase == "pending":  # a cordon ahead
        return [Action("cordon", name, nodes=progress.cordoned_ahead, why=why)] if progress.cordoned_ahead else []
    if doing in ("cordon", "evict", "drain", "hold") and progress.phase == "cordoned":
        taken = _taken(scale_set, progress)
        running = {g for gs in state.gangs.values() for g in gs}
        groups = tuple(sorted({*_gangs(state, taken), *(g for g in progress.gangs_cut if g in running)}))
        return _take_actions(state, scale_set, taken, groups, why)
    if doing == "upgrade" and progress.phase == "upgrading":
        action = _upgrade(scale_set, _taken(scale_set, progress), progress, why)
        return [_sent(scale_set, progress, action, now)] if action.instances or action.reimage else []
    if doing in ("uncordon", "release") and progress.doing_nodes:
        nodes, progress.doing_nodes = progress.doing_nodes, ()
        return [Action(doing, name, nodes=nodes, why=why)]
    return []


def _gate_or_pass(journal: Journal, state: ClusterState, scale_set: ScaleSet, progress: Progress,
                  now: float) -> list[Action]:
    """The gate: wait (or fail past the timeout) while it does not pass; hold it `hold_s` once it
    does; then uncordon the batch, and the scale set is done or its next batch pending."""
    name = scale_set.name
    why = _gate(journal, state, scale_set, progress)
    if why:
        progress.passing_since = 0.0
        waits = _timed(journal, progress, name, now, why)
        return [*_uncordon_for_prometheus(journal, state, scale_set, progress), *waits] if waits else waits
    progress.passing_since = progress.passing_since or now
    held = now - progress.passing_since
    if held < journal.policy.hold_s:  # passing, so no timeout: the hold only lets an alert fire
        progress.why = f"gate passing, held {held:.0f} of {journal.policy.hold_s} s so an alert can fire"
        return [Action("wait", name, why=progress.why)]
    actions = [Action("uncordon", name, nodes=_nodes(_taken(scale_set, progress)))]
    progress.taken, progress.boot_ids, progress.passing_since, progress.upgrade_sent = (), {}, 0.0, {}
    if scale_set.current:
        _enter(journal, name, progress, "done", now, "")
        if name == journal.policy.order[0]:
            journal.canary_passed_at = now
    else:
        _enter(journal, name, progress, "pending", now, "next batch")
    return actions


def _uncordon_for_prometheus(journal: Journal, state: ClusterState, scale_set: ScaleSet,
                             progress: Progress) -> list[Action]:
    """The Policy.without_alerts pool's batch, its node checks passed: uncordoned before its gate
    passes, since that gate waits for the cluster's Prometheus Ready again and Prometheus can only
    be scheduled on a schedulable node of this pool (its nodeSelector, kilonode.k8s.monitoring;
    a cordon is the node.kubernetes.io/unschedulable:NoSchedule taint, which it does not
    tolerate). Kept cordoned, a one-node pool would deadlock: Prometheus Pending, the gate waiting
    on it, failed at the gate timeout. The batch stays taken (and held from scale-down, _holds)
    until the gate passes; the final uncordon repeats nothing that is done."""
    if scale_set.pool != journal.policy.without_alerts or _node_checks(state, scale_set, progress):
        return []
    cordoned = tuple(i.node for i in _taken(scale_set, progress) if i.node and not i.schedulable)
    if not cordoned:
        return []
    return [Action("uncordon", scale_set.name, nodes=cordoned,
                   why="its nodes passed their checks: uncordoned so the cluster's Prometheus can be scheduled "
                   "again; the gate waits for it Ready")]


def _take(journal: Journal, state: ClusterState, scale_set: ScaleSet, progress: Progress,
          now: float) -> list[Action]:
    """A pending scale set: done if already at its model, else its next batch taken when allowed."""
    name = scale_set.name
    if scale_set.current:
        return _current(journal, state, scale_set, progress, now)
    why = _may_start(journal, state, name, now) or _alerts(journal, state, scale_set.pool)
    taken = _batch(journal, scale_set)
    gangs = _gangs(state, taken)
    if not gangs:
        progress.gangs_since = 0.0
    elif not why and not journal.policy.cut_gangs:
        progress.gangs_since = progress.gangs_since or now
        waited = now - progress.gangs_since
        if waited > journal.policy.gang_wait_s:
            journal.paused = _gangs_hold(journal, state, name, waited)
            return []
        why = (f"gangs run there: {', '.join(gangs)} (the policy does not cut gangs; waited {waited:.0f} of "
               f"{journal.policy.gang_wait_s} s)")
    if why:
        progress.why = why
        return [Action("wait", name, why=why)]
    nodes = _nodes(taken)
    released = tuple(n for n in progress.cordoned_ahead if n not in nodes)  # cordoned ahead, not in this batch
    progress.gangs_cut = tuple(sorted({*progress.gangs_cut, *gangs}))
    progress.taken, progress.cordoned_ahead, progress.gangs_since = tuple(i.instance_id for i in taken), (), 0.0
    # boot IDs of the instances to be upgraded (one already at the model is not booted again)
    progress.boot_ids = {i.node: i.boot_id for i in taken if i.node and not scale_set.at_model(i)}
    _enter(journal, name, progress, "cordoned", now, "")
    elsewhere = _elsewhere(state, gangs, nodes)
    if elsewhere:
        journal.log.append(f"{now:.0f} {name} gangs {', '.join(gangs)} evicted whole: also on {', '.join(elsewhere)}")
    actions = [Action("uncordon", name, nodes=released, why="cordoned ahead, not in this batch")] if released else []
    return [*actions, *_take_actions(state, scale_set, taken, gangs)]


def _take_actions(state: ClusterState, scale_set: ScaleSet, taken: tuple[Instance, ...], gangs: tuple[str, ...],
                  why: str = "") -> list[Action]:
    """Cordon the batch; evict every pod of the gangs it cuts that runs elsewhere (a gang that
    spans fabrics is evicted whole, never cut in half); drain the batch."""
    name, nodes = scale_set.name, _nodes(taken)
    actions = [Action("cordon", name, nodes=nodes, why=why)]
    elsewhere = _elsewhere(state, gangs, nodes)
    if elsewhere:
        cross = tuple(g for g in gangs if any(g in state.gangs.get(n, ()) for n in elsewhere))
        actions.append(Action("evict", name, nodes=elsewhere, groups=cross,
                              why=f"gangs {', '.join(cross)} whole: their pods on {len(elsewhere)} nodes elsewhere"))
    cut = f"evicts gangs {', '.join(gangs)}" if gangs else ""
    actions.append(Action("drain", name, nodes=nodes, why="; ".join(w for w in (cut, why) if w)))
    return actions


def _current(journal: Journal, state: ClusterState, scale_set: ScaleSet, progress: Progress,
             now: float) -> list[Action]:
    """A pending scale set already at its model: done, unless its journal says it was taken or
    some of its nodes are cordoned (a step ended after Azure finished, a cordon ahead): then it is
    gated and uncordoned first, never left cordoned as done."""
    name = scale_set.name
    held = _taken(scale_set, progress) or tuple(
        i for i in scale_set.instances if (i.node and not i.schedulable) or (i.node in progress.cordoned_ahead))
    if held:
        progress.taken, progress.cordoned_ahead = tuple(i.instance_id for i in held), ()
        _enter(journal, name, progress, "gating", now, f"at its model with {len(held)} instances taken or cordoned")
        return _gate_or_pass(journal, state, scale_set, progress, now)
    _enter(journal, name, progress, "done", now, "already at its model")
    if name == journal.policy.order[0]:
        journal.canary_passed_at = journal.canary_passed_at or now
    return []


def _cordon_ahead(journal: Journal, state: ClusterState) -> list[Action]:
    """Cordon the next `cordon_ahead` pending scale sets' next batches (not yet cordoned), so no
    new pod lands where the rollout goes next and the gangs there can finish."""
    actions, ahead = [], 0
    for name in journal.policy.order:
        progress, scale_set = journal.of(name), state.scale_set(name)
        if ahead >= journal.policy.cordon_ahead:
            break
        if progress.phase != "pending" or scale_set is None or scale_set.current:
            continue
        ahead += 1
        batch = _batch(journal, scale_set)
        nodes = tuple(i.node for i in batch if i.node and (i.schedulable or i.node not in progress.cordoned_ahead))
        if nodes:
            progress.cordoned_ahead = tuple(sorted({*progress.cordoned_ahead, *nodes}))
            actions.append(Action("cordon", name, nodes=nodes, why="cordoned ahead: no new pod lands there"))
    return actions


def _holds(journal: Journal, state: ClusterState, actions: list[Action]) -> list[Action]:
    """Keep the autoscaler's scale-down off every node the rollout keeps cordoned, and only those
    (model.SCALE_DOWN_DISABLED: nothing upstream skips a cordoned node). A cordon puts the hold on
    and an uncordon takes it off in the same write (kilonode.rollout.execute.Executor.cordon), so
    this only mends: `hold` where a node the journal keeps cordoned (a batch taken, a scale set
    failed, a cordon ahead) has lost it (the GPU health controller lifts a hold of its own once the
    node's GPU taints go, kilonode.node.gpu.controller; a cordon sent before this hold existed),
    and `release` where a schedulable node the journal does not keep still carries the rollout's
    (an uncordon by hand; a step that ended between the two). A node kept cordoned by no journal
    (one set aside) keeps its hold until it is uncordoned. Nodes this step cordons or uncordons
    are left to that action."""
    done = {n for a in actions if a.kind in ("cordon", "uncordon", "hold", "release") for n in a.nodes}
    out = []
    for name in journal.policy.order:
        scale_set, progress = state.scale_set(name), journal.of(name)
        if scale_set is None:
            continue
        taken = set(progress.taken) if progress.phase in (*BUSY, "failed") else set()
        kept = {i.node for i in scale_set.instances if i.instance_id in taken} | set(progress.cordoned_ahead)
        hold = tuple(i.node for i in scale_set.instances
                     if i.node and i.node in kept and i.node not in done and not i.scale_down_disabled)
        release = tuple(i.node for i in scale_set.instances
                        if i.node and i.held and i.schedulable and i.node not in kept and i.node not in done)
        if hold:
            out.append(Action("hold", name, nodes=hold, why="kept cordoned: the autoscaler may not remove it"))
        if release:
            out.append(Action("release", name, nodes=release, why="schedulable again: the rollout's hold lifted"))
    return out


def _steer(journal: Journal, state: ClusterState) -> list[Action]:
    """Policy.steer: taint PreferNoSchedule (PENDING_TAINT_KEY) each node whose instance is not at
    its scale set's model, and every node of a fabric not done yet (taken whole, a scale-out's new
    instances at the model included), and lift it from each node at the model whose batch has passed its gate
    (not among the instances taken): a reimaged instance keeps its Node, taints included (the
    kubelet finds its Node by name and registers nothing anew: kubelet_node_status.go
    tryRegisterWithAPIServer), so the rollout lifts what it put there. With steer off, only lifts
    (a rollout started with it on and resumed with it off leaves nothing behind)."""
    actions = []
    for name in journal.policy.order:
        scale_set, progress = state.scale_set(name), journal.of(name)
        if scale_set is None:
            continue
        taken = set(progress.taken)
        # a fabric is taken whole (_batch), its instances already at the model too (a scale-out's, which
        # get the model at once): until it is done, every node of it is one a gang would be cut on again
        whole = scale_set.infiniband and progress.phase != "done"
        away = {i.instance_id for i in scale_set.instances if whole or not scale_set.at_model(i)}
        behind = tuple(i.node for i in scale_set.instances
                       if i.node and not i.steered and i.instance_id in away) if journal.policy.steer else ()
        rolled = tuple(i.node for i in scale_set.instances
                       if i.node and i.steered and i.instance_id not in away and i.instance_id not in taken)
        if behind:
            actions.append(Action("taint", name, nodes=behind,
                                  why="not rolled yet: new and restarted gangs prefer the rolled fabrics"))
        if rolled:
            actions.append(Action("untaint", name, nodes=rolled, why="rolled and past its gate"))
    return actions


def _gangs_hold(journal: Journal, state: ClusterState, name: str, waited: float) -> str:
    """The pause once a scale set has waited past gang_wait_s: which gangs hold which scale set."""
    held = []
    for other in journal.policy.order:
        scale_set = state.scale_set(other)
        if journal.of(other).phase == "pending" and scale_set is not None:
            gangs = _gangs(state, _batch(journal, scale_set))
            if gangs:
                held.append(f"{other}: {', '.join(gangs)}")
    return (f"{name} waited {waited:.0f} s for its gangs (more than the policy's {journal.policy.gang_wait_s} s). "
            f"Gangs hold: {'; '.join(held)}. Ask their owners to end them, or start again with --cut-gangs in a "
            "maintenance window; `kilonode rollout resume` waits another --gang-wait (cordoned-ahead nodes "
            "stay cordoned)")


def _timed(journal: Journal, progress: Progress, name: str, now: float, why: str) -> list[Action]:
    """Wait for the phase's work, or fail the scale set (and pause) past the gate's timeout."""
    if now - progress.since > journal.policy.gate_timeout_s:
        _enter(journal, name, progress, "failed", now, why)
        journal.paused = (f"{name} failed its gate after {journal.policy.gate_timeout_s} s: {why}. Its nodes stay "
                          "cordoned. `kilonode rollout resume` tries the gate again; to roll back, set the pool's "
                          "image version back to its previous one, `pulumi up`, and run the rollout again")
        return []
    progress.why = why
    return [Action("wait", name, why=why)]


def _enter(journal: Journal, name: str, progress: Progress, phase: str, now: float, why: str) -> None:
    progress.phase, progress.since, progress.why = phase, now, why  # type: ignore[assignment]
    journal.log.append(f"{now:.0f} {name} {phase} {why}".rstrip())
