"""The next steps of a rollout, from its journal and the cluster as it is now. Pure: the journal
is advanced as if the steps succeed (execute marks a scale set failed, and pauses the rollout,
where one does not), and nothing is read or written outside the arguments.

A scale set goes pending -> cordoned (cordoned and drained) -> upgrading (its model applied,
each instance reimaged into it) -> gating (until its nodes are Ready, past their GPU health
checks, and its pool's alerts are quiet) -> done, or failed when the gate does not pass within
the policy's timeout: the rollout then pauses until the operator resumes it (the gate is tried
again) or rolls back (the stack's previous version, then the same rollout; an instance already at
the restored model needs nothing). A scale set with InfiniBand is one fabric and is taken whole;
one without is taken `batch` instances at a time, back to pending between batches.

Gangs: a scale set is not taken while a pod of a PodGroup runs on the nodes it would drain
(scheduler-plugins' label scheduling.x-k8s.io/pod-group: kilonode.k8s.gang), unless the policy
allows cutting gangs; then the journal records the groups its drain evicts. A gang is kept in one
fabric by its pod affinity (kilonode.k8s.gang.fabric_affinity), so taking a fabric takes a gang
whole or not at all.

The canary (the policy's first scale set) goes alone; the rest start once it has been done for
`soak_s`, `in_flight` at a time, and none starts while its pool has an alert firing.
"""

from __future__ import annotations

from kilonode.rollout.model import Action, ClusterState, Instance, Journal, Progress, ScaleSet

BUSY = ("cordoned", "upgrading", "gating")


def _batch(journal: Journal, scale_set: ScaleSet) -> tuple[Instance, ...]:
    """The instances a new batch takes: a fabric whole; else the next `batch` not at the model."""
    if scale_set.infiniband:
        return scale_set.instances
    return tuple(i for i in scale_set.instances if not i.latest_model)[: journal.policy.batch]


def _nodes(instances: tuple[Instance, ...]) -> tuple[str, ...]:
    return tuple(i.node for i in instances if i.node)


def _gangs(state: ClusterState, instances: tuple[Instance, ...]) -> tuple[str, ...]:
    return tuple(sorted({g for n in _nodes(instances) for g in state.gangs.get(n, ())}))


def _gate(state: ClusterState, scale_set: ScaleSet, progress: Progress) -> str:
    """Why the batch's gate does not pass yet ('' when it does)."""
    taken = [i for i in scale_set.instances if i.instance_id in progress.taken]
    behind = [i.instance_id for i in taken if not i.latest_model]
    if behind:
        return f"{len(behind)} instances not at the model yet"
    missing = [i.instance_id for i in taken if not i.node]
    if missing:
        return f"instances {', '.join(missing[:5])} have not registered a Node"
    # a node that has not booted since it was taken still shows its old Ready
    stale = [i.node for i in taken if i.node and i.boot_id == progress.boot_ids.get(i.node, "")]
    if stale:
        return f"{len(stale)} nodes have not booted into the model yet ({', '.join(sorted(n for n in stale if n)[:5])})"
    unready = [i.node for i in taken if i.node and not i.ready]
    if unready:
        return f"{len(unready)} nodes not Ready ({', '.join(sorted(n for n in unready if n)[:5])})"
    pending = [i.node for i in taken if i.node and i.gpu_pending]
    if pending:
        return f"{len(pending)} nodes still carry a GPU health taint ({', '.join(sorted(n for n in pending if n)[:5])})"
    firing = state.firing.get(scale_set.pool, ())
    if firing:
        return f"alerts firing for pool {scale_set.pool}: {', '.join(firing)}"
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
    if all(journal.of(n).phase == "done" for n in journal.policy.order):
        return [*actions, Action("done", why=f"every scale set runs {journal.target}")]
    return actions


def _advance(journal: Journal, state: ClusterState, scale_set: ScaleSet, progress: Progress,
             now: float) -> list[Action]:
    name = scale_set.name
    if progress.phase in ("done", "failed"):
        return []
    if progress.phase == "pending":
        return _take(journal, state, scale_set, progress, now)
    taken = tuple(i for i in scale_set.instances if i.instance_id in progress.taken)
    if progress.phase == "cordoned":
        _enter(journal, name, progress, "upgrading", now, "")
        return [Action("upgrade", name, instances=tuple(i.instance_id for i in taken if not i.latest_model))]
    if progress.phase == "upgrading":
        if not all(i.latest_model for i in taken):
            return _timed(journal, progress, name, now, f"{sum(not i.latest_model for i in taken)} instances "
                          "being upgraded")
        _enter(journal, name, progress, "gating", now, "")
    why = _gate(state, scale_set, progress)
    if why:
        return _timed(journal, progress, name, now, why)
    actions = [Action("uncordon", name, nodes=_nodes(taken))]
    progress.taken, progress.boot_ids = (), {}
    if scale_set.current:
        _enter(journal, name, progress, "done", now, "")
        if name == journal.policy.order[0]:
            journal.canary_passed_at = now
    else:
        _enter(journal, name, progress, "pending", now, "next batch")
    return actions


def _take(journal: Journal, state: ClusterState, scale_set: ScaleSet, progress: Progress,
          now: float) -> list[Action]:
    """A pending scale set: done if already at its model, else its next batch taken when allowed."""
    name = scale_set.name
    if scale_set.current:
        _enter(journal, name, progress, "done", now, "already at its model")
        if name == journal.policy.order[0]:
            journal.canary_passed_at = journal.canary_passed_at or now
        return []
    why = _may_start(journal, state, name, now)
    firing = state.firing.get(scale_set.pool, ())
    if not why and firing:
        why = f"alerts firing for pool {scale_set.pool}: {', '.join(firing)}"
    taken = _batch(journal, scale_set)
    gangs = _gangs(state, taken)
    if not why and gangs and not journal.policy.cut_gangs:
        why = f"gangs run there: {', '.join(gangs)} (the policy does not cut gangs)"
    if why:
        progress.why = why
        return [Action("wait", name, why=why)]
    progress.gangs_cut = tuple(sorted({*progress.gangs_cut, *gangs}))
    progress.taken = tuple(i.instance_id for i in taken)
    progress.boot_ids = {i.node: i.boot_id for i in taken if i.node}
    _enter(journal, name, progress, "cordoned", now, "")
    nodes = _nodes(taken)
    return [Action("cordon", name, nodes=nodes),
            Action("drain", name, nodes=nodes, why=f"evicts gangs {', '.join(gangs)}" if gangs else "")]


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
