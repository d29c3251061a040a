"""A Kubernetes minor upgrade written as a sequence of stack changes, each within the version
skew policy and each reviewed with `kilonode diff` and applied on its own (`kilonode upgrade`).

The order is the version skew policy's (kubernetes/website content/en/releases/version-skew-
policy.md, "Supported component upgrade order"): kube-apiserver first, one minor at a time (in an
HA control plane the apiservers differ by at most one minor meanwhile); then the controllers and
the in-cluster components, which must not be newer than the apiservers; then the kubelets, which
may stay up to three minors behind the apiservers (from 1.28), so each pool moves on its own,
through its own image and rollout, after the control plane:

1. pin every pool at its current version (nodePools[].kubernetesVersion): nothing changes, and
   from then on the stack's kubernetesVersion moves the control plane only;
2. the control plane's binaries: kubernetesVersion, controlPlaneEmulatedVersion at the old minor
   (--emulated-version on kube-apiserver, kube-controller-manager and kube-scheduler: KEP-4330,
   kubernetes/enhancements keps/sig-architecture/4330-compatibility-versions, Story 1) and a new
   controlPlaneImage version, the old one kept as `previous`, acknowledgeRestart [apiservers]; the
   apiservers are replaced one at a time (docs/azure.md, "Rolling the control plane"). The
   in-cluster components stay at the pools' version (none may be newer than the emulated one);
   while the emulated version is the old minor the binaries can go back (revert this step);
3. acknowledgeRestart removed; soak;
4. the emulated version raised (controlPlaneEmulatedVersion removed), acknowledgeRestart
   [apiservers]: the point of no return (the new minor's APIs, features and storage versions
   start writing etcd); then one full `pulumi up` moves the in-cluster components
   (kube-proxy, cloud-controller-manager, ...) to the new version;
5. acknowledgeRestart removed;
6. each pool, the canary first: its kubernetesVersion and a new image version with the old one
   as `previous`, built, `pulumi up`, then `kilonode rollout` through its scale sets. Only now:
   a kubelet must not be newer than the apiservers' emulated version (KEP-4330, "Skew");
7. the pins and the `previous` versions removed, once every node runs the new version, and the
   pools' image entries folded back into nodeImage.version where they are all one version.

The stack file is the upgrade's record: progress() reads from it which steps are applied and the
values the upgrade started from, so each step is planned and applied on the stack the previous one
left. Pure: the stack's config in, steps out; each step is a list of edits (a path under
kilonode:cluster and its value, or DELETE) that `apply` makes on the stack file's YAML tree.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kilonode.config.model import ClusterConfig
from kilonode.plan.defaults.autoscaler import CLUSTER_AUTOSCALER_REPLICAS

DELETE = object()  # an edit that removes its key


@dataclass(frozen=True)
class Edit:
    path: tuple[str | int, ...]  # under kilonode:cluster
    value: Any  # DELETE removes the key
    why: str = ""


@dataclass(frozen=True)
class Step:
    name: str
    title: str
    edits: tuple[Edit, ...]
    then: tuple[str, ...]  # what to run once the change is committed, in order
    review: str  # what `kilonode diff` should say about it
    pool: str | None = None
    rollback: tuple[Edit, ...] = ()  # the edits that undo it (a pool step: its image and its kubelet together)
    done: bool = False  # the stack already shows it applied
    waits: str | None = None  # why it cannot be applied yet, besides an earlier step (an image rollout to finish)


@dataclass
class Plan:
    stack: str
    start: str
    to: str
    steps: list[Step] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def finished(self) -> bool:
        return all(step.done for step in self.steps)

    @property
    def next(self) -> Step | None:
        """The first step not applied yet, in the printed order."""
        return next((step for step in self.steps if not step.done), None)

    def first_unapplied_before(self, step: Step) -> Step | None:
        """The earliest step before `step` not applied yet: it goes first. The pool steps may go in
        any order among themselves (the canary's place is advice); cleanup comes after every one."""
        earlier = self.steps[:self.steps.index(step)]
        return next((s for s in earlier if not s.done and not (step.pool and s.pool)), None)


def minor_of(version: str) -> int:
    return int(version.split(".")[1])


def next_minor_version(version: str) -> str:
    """A gallery version's next minor: 1.2.3 -> 1.3.0."""
    major, minor, _ = (int(x) for x in version.split("."))
    return f"{major}.{minor + 1}.0"


@dataclass(frozen=True)
class Progress:
    """Where a minor upgrade stands, read from the stack alone (no journal: the stack file, as each
    step left it, is the record): the values the upgrade started from and the steps applied."""

    start: str  # the pools' version before the upgrade ("1.34" when every pool has moved and no pin says it)
    control_plane_was: str  # controlPlaneImage.version before the control-plane step
    pool_was: dict[str, str]  # pool -> its image version before its pool step
    moved: frozenset[str]  # pools whose kubelet already runs `to`
    done: frozenset[str]  # names of the steps the stack shows applied


def progress(config: ClusterConfig, to: str) -> Progress | str:
    """The upgrade to `to` as far as the stack shows it, or why none can be planned from it.

    The steps leave marks only they leave: pin-pools pins every pool at the old version; control-plane
    moves kubernetesVersion to `to` with controlPlaneEmulatedVersion and acknowledgeRestart [apiservers];
    control-plane-done drops the acknowledgement; raise-emulated-version drops the emulated version
    (and acknowledges again); raise-done drops that; each pool step pins its pool at `to`; cleanup
    drops every pin. So `--step` on the stack the previous step left plans the remaining steps from
    there (a running upgrade is not a downgrade from `to` to `to`)."""
    version = config.kubernetes_version
    old = minor_of(to) - 1
    pins = {p.name: p.kubernetes_version for p in config.node_pools}
    images = config.node_image
    if version != to:
        if minor_of(to) == minor_of(version):
            return (f"{version} -> {to}: the same minor; kilonode upgrade plans a minor upgrade (a patch release "
                    "is a new kubernetesVersion and images, a change of its own)" if not any(pins.values()) else
                    f"the stack runs {version} with pools pinned ({_pins(pins)}): an upgrade to {version} is under "
                    f"way; give --to {version}")
        if minor_of(to) != minor_of(version) + 1:
            return (f"{version} -> {to}: a minor upgrade moves one minor at a time (the apiservers of an HA control "
                    f"plane differ by at most one minor); plan 1.{minor_of(version) + 1}.x first"
                    if minor_of(to) > minor_of(version)
                    else f"{version} -> {to} is not an upgrade: Kubernetes does not support going back a minor")
        behind = [name for name, pin in pins.items() if pin not in (None, version)]
        if behind:
            return (f"pools {', '.join(behind)} do not run {version}: finish the last upgrade first (every pool at "
                    "the control plane's version, their pins removed)")
        if config.acknowledge_restart:
            return f"acknowledgeRestart is set ({', '.join(config.acknowledge_restart)}): finish that change first"
        kept = [name for name, image in (("nodeImage", images), ("etcdImage", config.etcd_image),
                                         ("controlPlaneImage", config.control_plane_image)) if image.previous]
        kept += [f"nodeImage.pools.{pool}" for pool, image in sorted(images.pools.items()) if image.previous]
        if kept:
            return (f"{', '.join(kept)} still keep a previous version: an image rollout is not finished (its nodes "
                    "not rolled yet still boot that version). Finish it and remove `previous` first; the upgrade's "
                    "pool steps set their own")
        done = {"pin-pools"} if all(pins.values()) else set()
        return Progress(version, config.control_plane_image.version,
                        {name: images.of_pool(name).version for name in pins}, frozenset(), frozenset(done))
    # kubernetesVersion is `to`: the control-plane step ran, or the upgrade is over
    names = [name for name in pins]
    if not any(pins.values()):
        # cleanup ran (or the stack never went through kilonode upgrade): nothing is left to apply
        return Progress(f"1.{old}", config.control_plane_image.previous or config.control_plane_image.version,
                        {name: images.of_pool(name).version for name in names}, frozenset(names),
                        frozenset(_step_names(names)))
    stray = [f"{name} ({pin})" for name, pin in pins.items()
             if pin is not None and pin != to and minor_of(pin) != old]
    olds = {pin for pin in pins.values() if pin is not None and pin != to}
    if stray or len(olds) > 1:
        return (f"pools pinned at versions no upgrade to {to} leaves ({_pins(pins)}): each pool is either at the "
                f"version the upgrade started from (one 1.{old} version for all) or at {to}")
    moved = frozenset(name for name, pin in pins.items() if pin in (None, to))
    emulated = config.control_plane_emulated_version
    acknowledged = "apiservers" in config.acknowledge_restart
    done = {"pin-pools", "control-plane"}
    if emulated is None or not acknowledged:
        done.add("control-plane-done")
    if emulated is None:
        done.add("raise-emulated-version")
        if not acknowledged or moved:
            done.add("raise-done")
    done |= {f"pool-{name}" for name in moved}
    # a moved pool's entry keeps its old image as `previous` until cleanup; one not moved boots its own
    was = {name: (images.pools[name].previous or images.pools[name].version)
           if name in moved and name in images.pools else images.of_pool(name).version for name in names}
    return Progress(next(iter(olds)) if olds else f"1.{old}",
                    config.control_plane_image.previous or config.control_plane_image.version,
                    was, moved, frozenset(done))


def _pins(pins: Mapping[str, str | None]) -> str:
    return ", ".join(f"{name}: {pin or 'unpinned'}" for name, pin in pins.items())


def _step_names(pools: Sequence[str]) -> list[str]:
    return ["pin-pools", "control-plane", "control-plane-done", "raise-emulated-version", "raise-done",
            *(f"pool-{name}" for name in pools), "cleanup"]


def refusal(config: ClusterConfig, to: str) -> str | None:
    """Why an upgrade of this stack to `to` cannot be planned (None: it can, from the start or from
    the step the stack shows it reached)."""
    found = progress(config, to)
    return found if isinstance(found, str) else None


def plan_upgrade(config: ClusterConfig, stack: str, to: str, canary: str | None = None) -> Plan:
    """The steps from the version the upgrade started at to `to`, each marked done where the stack
    shows it applied (refusal() first)."""
    found = progress(config, to)
    if isinstance(found, str):
        raise ValueError(found)
    start = found.start
    pools = list(config.node_pools)
    index = {p.name: i for i, p in enumerate(pools)}
    order = sorted(pools, key=lambda p: (p.name != canary, p.system, p.monitoring, p.nodes, p.name))
    plan = Plan(stack, start, to)
    plan.steps += _control_plane_steps(stack, start, to, found.control_plane_was, len(pools))
    plan.steps += [_pool_step(config, found, stack, to, pool, index[pool.name], pool.name == canary)
                   for pool in order]
    plan.steps.append(_cleanup_step(config, found, stack, order, index))
    _mark(plan, found)
    plan.notes.append(_going_back(start, to, found.control_plane_was))
    if any(p.autoscaling for p in config.node_pools):
        # every run sends the autoscaled scale sets' sizes as it read them (kilonode.azure.live)
        plan.notes.append(
            "Every `pulumi up` below, not only the pool steps': pause the cluster autoscaler first (`kubectl -n "
            "kube-system scale deployment cluster-autoscaler --replicas=0`) and give it back after (`--replicas="
            f"{CLUSTER_AUTOSCALER_REPLICAS}`): each run sends the autoscaled scale sets' sizes as it read them at "
            "its start, and `pulumi up` never restores the replicas itself (docs/azure.md). Check after each: "
            "`kubectl -n kube-system get deployment cluster-autoscaler` shows them back")
    return plan


def _control_plane_steps(stack: str, start: str, to: str, cp: str, pools: int) -> list[Step]:
    """Steps 1 to 5: the pins, the binaries emulating the old minor, the raise (docs/operations.md)."""
    steps: list[Step] = []
    cp_next = next_minor_version(cp)
    old_minor = f"1.{minor_of(to) - 1}"
    snapshot = ("on every main etcd member (docs/operations.md, \"Getting a shell on a machine\"), as root: "
                "`systemctl start kilonode-etcd-snapshot.service` (the leader saves and uploads one, the others "
                "exit; kilonode.node.etcd_snapshot); then download its newest `.db.age` and `.manifest` from "
                "`etcd-snapshots-main` (docs/runbooks/etcd-restore-from-snapshot.md, step 3's `az storage blob` "
                "commands) and keep both outside the backup account's etcd-snapshots-* containers, whose "
                "lifecycle rule deletes a blob 7 days after it is written (soft delete keeps it 7 more: "
                "kilonode.azure.backup) while each member keeps only its newest 4 (one hour at 15 minutes)")
    steps.append(Step(
        "pin-pools", f"Pin every pool at {start}",
        tuple(Edit(("nodePools", i, "kubernetesVersion"), start,
                   "kubelet version of this pool during the minor upgrade") for i in range(pools)),
        (f"kilonode diff  # no changes to {stack}", "pulumi up"),
        "no change: every pool already runs this version"))
    steps.append(Step(
        "control-plane", f"Move the control plane's binaries to {to}, emulating {old_minor}",
        (Edit(("kubernetesVersion",), to),
         Edit(("controlPlaneEmulatedVersion",), old_minor,
              f"--emulated-version={old_minor}: the binaries can go back to {start} while it is set"),
         Edit(("controlPlaneImage", "version"), cp_next, f"Kubernetes {to}"),
         Edit(("controlPlaneImage", "previous"), cp, "the rollback target while the apiservers move"),
         Edit(("acknowledgeRestart",), ["apiservers"], "one apiserver at a time (docs/azure.md)")),
        (f"kilonode image build {stack} --role control-plane --out build/node-image --fetch",
         "kilonode diff  # the apiservers replaced, one at a time",
         "before each apiserver's run, copy its audit log off if it may be needed (it goes with the VM's local "
         "SSD: docs/azure.md, \"Rolling the control plane\", step 2)",
         "`pulumi up --target <urn of one apiserver VM>` per apiserver (`pulumi stack --show-urns`; the first "
         "run also targets the new control-plane image version), each healthy (`/readyz`) before the next "
         "(docs/azure.md, \"Rolling the control plane\")",
         f"one plain `pulumi up`: the in-cluster components stay at {start} (none newer than the emulated "
         f"{old_minor})"),
        f"replace-stops (the apiservers, one at a time: {to} binaries, --emulated-version={old_minor}); no "
        "version change of the in-cluster components; no version-skew (the pools stay at their pinned version)"))
    steps.append(Step(
        "control-plane-done", "Remove acknowledgeRestart; soak",
        (Edit(("acknowledgeRestart",), DELETE),),
        ("kilonode diff  # no changes", "pulumi up",
         f"soak: until the next step, going back is the control-plane step's rollback (the {start} binaries, "
         "kept as controlPlaneImage.previous, with acknowledgeRestart [apiservers]; docs/operations.md)",
         "the fresh etcd snapshot is taken immediately before the next step (its first line), not now"),
        "no change"))
    steps.append(Step(
        "raise-emulated-version", f"Raise the emulated version to {to}: the point of no return",
        (Edit(("controlPlaneEmulatedVersion",), DELETE,
              f"the {to} APIs, features and storage versions: the binaries can no longer go back to {old_minor}"),
         Edit(("acknowledgeRestart",), ["apiservers"], "one apiserver at a time (docs/azure.md)")),
        (f"first, immediately before this step's `pulumi up`, a fresh etcd snapshot, the only way back after it: "
         f"{snapshot}",
         "kilonode diff  # the apiservers replaced again (--emulated-version removed)",
         "copy each apiserver's audit log off, then `pulumi up --target <urn of one apiserver VM>` per apiserver, "
         "each healthy before the next (docs/azure.md, \"Rolling the control plane\")",
         f"one full `pulumi up`: the in-cluster components move to {to} (kube-proxy rolls on every node, "
         "never newer than the apiservers now)",
         "kubectl -n kube-system rollout status daemonset/kube-proxy; kubectl -n kube-system rollout status "
         "daemonset/cloud-node-manager  # and each Deployment the review names"),
        "replace-stops (the apiservers, one at a time), version changes of the in-cluster components; no "
        "version-skew (the pools stay at their pinned version, within three minors)"))
    steps.append(Step(
        "raise-done", "Remove acknowledgeRestart", (Edit(("acknowledgeRestart",), DELETE),),
        ("kilonode diff  # no changes", "pulumi up"), "no change"))
    return steps


def _pool_step(config: ClusterConfig, found: Progress, stack: str, to: str, pool: Any, index: int,
               canary: bool) -> Step:
    """Step 6, one pool: its kubelet and its own image together, and the rollback of both."""
    images = config.node_image
    start = found.start
    was = found.pool_was[pool.name]
    now = next_minor_version(was)
    if pool.name in found.moved and pool.name in images.pools:
        now = images.pools[pool.name].version  # as the pool step (or a re-roll after it) left it
    journal = _journal(stack, pool.name)
    kept = images.of_pool(pool.name).previous if pool.name not in found.moved else None
    return Step(
        f"pool-{pool.name}", f"Move pool {pool.name} to {to}" + (" (the canary)" if canary else ""),
        (Edit(("nodePools", index, "kubernetesVersion"), to),
         Edit(("nodeImage", "pools", pool.name), {"version": now, "previous": was},
              f"Kubernetes {to}; {was} kept for rollback")),
        (f"kilonode image build {stack} --pool {pool.name} --out build/node-image --fetch",
         "kilonode diff  # a fleet rollout of the pool, its old image kept",
         "kubectl -n kube-system scale deployment cluster-autoscaler --replicas=0  # for the `pulumi up`: it sends "
         "the autoscaled scale sets' sizes as it read them at its start (docs/azure.md)",
         "pulumi up  # new instances (scale-out) get the new model at once; then give the autoscaler its replicas back",
         f"kilonode rollout start {stack} --pool {pool.name} --journal {journal}"
         + (" --without-alerts" if pool.monitoring else "")
         + f" && kilonode rollout run {stack} --journal {journal}"
         + ("  # alerting is dark while the pool rolls (its Prometheus is the one evicted; or --prometheus URL at a "
            "Prometheus outside the cluster); Prometheus' history stays on its disk, a claim that follows the pod to "
            "the new node (docs/monitoring.md, \"Storage\")" if pool.monitoring else "")),
        "fleet-rollout of this pool, no rollback-target-removed, no version-skew", pool=pool.name,
        rollback=(Edit(("nodePools", index, "kubernetesVersion"), start,
                       "the kubelet the old image runs: left at the new version, `kilonode diff` would "
                       "call the rollback's image \"contents unchanged\""),
                  Edit(("nodeImage", "pools", pool.name), {"version": was, "previous": now},
                       "the old image back, the new one kept published while the rollout moves back")),
        waits=(f"nodeImage.pools.{pool.name} keeps a previous version ({kept}): an image rollout of this pool is "
               "not finished; finish it and remove `previous` first" if kept else None))


def _cleanup_step(config: ClusterConfig, found: Progress, stack: str, order: Sequence[Any],
                  index: Mapping[str, int]) -> Step:
    """Step 7: the pins and the previous versions removed; the pools' entries folded back where one."""
    images = config.node_image
    pools = list(config.node_pools)
    final = {p.name: (images.pools[p.name].version if p.name in found.moved and p.name in images.pools
                      else next_minor_version(found.pool_was[p.name])) for p in pools}
    cleanup = [Edit(("nodePools", index[p.name], "kubernetesVersion"), DELETE) for p in pools]
    versions = set(final.values())
    if len(versions) == 1 and images.previous is None:
        # one version for every pool: back to the stack-wide key, so that the next image (the
        # documented nodeImage.version raise) reaches them; of_pool prefers a pool's own entry, and
        # an entry left behind would keep its pool at this version whatever nodeImage.version says
        cleanup += [Edit(("nodeImage", "version"), versions.pop(), "every pool's version, folded back"),
                    Edit(("nodeImage", "pools"), DELETE, "each pool runs nodeImage.version again")]
        folded = "every pool's image folded back into nodeImage.version (nodeImage.pools removed)"
    else:
        cleanup += [Edit(("nodeImage", "pools", p.name, "previous"), DELETE) for p in pools]
        folded = (f"the pools' image versions differ ({', '.join(f'{n}: {v}' for n, v in final.items())}): "
                  "nodeImage.pools is kept, and a stack-wide nodeImage.version raise reaches none of these pools; "
                  "raise each pool's entry, or set them equal and fold them back by hand")
    cleanup.append(Edit(("controlPlaneImage", "previous"), DELETE))
    return Step(
        "cleanup", "Remove the pins and the previous versions, once every node runs the new version",
        tuple(cleanup), (*(f"kilonode rollout status {stack} --journal {_journal(stack, p.name)}  # every scale set "
                           "done" for p in order), "kilonode diff", "pulumi up", folded),
        "previous-image-removed (medium) for the previous gallery versions and their VHDs: right once every "
        "rollout is done, which `--step cleanup` checks in the pools' journals before it applies")


def _going_back(start: str, to: str, cp: str) -> str:
    """The plan's note: the way back before the raise (the binaries) and after it (the fresh snapshot)."""
    old_minor, cp_next = f"1.{minor_of(to) - 1}", next_minor_version(cp)
    return (
        f"Going back: until raise-emulated-version the apiservers, controller manager and scheduler run the {to} "
        f"binaries with --emulated-version={old_minor} (KEP-4330), so the {start} binaries can come back: "
        f"kubernetesVersion {start}, controlPlaneEmulatedVersion removed, controlPlaneImage {{version: {cp}, "
        f"previous: {cp_next}}}, acknowledgeRestart [apiservers], and replace the apiservers one at a time. "
        "raise-emulated-version is the point of no return: from then on the "
        f"{to} APIs, features and storage versions are in use and the only way back is an etcd restore "
        "(docs/runbooks/etcd-restore-from-snapshot.md) from the snapshot taken immediately before "
        "raise-emulated-version and kept outside the backup account's lifecycle rule: it loses every write "
        "since (objects created or changed, node and lease status, Jobs' progress), and it holds only while "
        f"every pool still runs {start} (roll back moved pools first). The pools move only after it: a kubelet "
        "must not be newer than the apiservers' emulated version.")


def _mark(plan: Plan, found: Progress) -> None:
    """Each step's `done` from the stack (a step done needs nothing more, so waits for nothing)."""
    plan.steps[:] = [Step(step.name, step.title, step.edits, step.then, step.review, step.pool, step.rollback,
                          done := step.name in found.done, None if done else step.waits) for step in plan.steps]


def _journal(stack: str, pool: str) -> str:
    """One rollout journal per pool: the pools roll one after another, each with its own."""
    return f".kilonode/rollout/{stack}-{pool}.json"


def apply(cluster: Any, edits: Sequence[Edit]) -> None:
    """Make `edits` on the kilonode:cluster mapping of a round-trip YAML tree (ruamel's
    CommentedMap keeps comments; a plain dict works the same)."""
    for edit in edits:
        node: Any = cluster
        for part in edit.path[:-1]:
            if isinstance(part, str) and part not in node:
                if edit.value is DELETE:
                    break
                node[part] = type(node)()
            node = node[part]
        else:
            key = edit.path[-1]
            if edit.value is DELETE:
                if isinstance(node, Mapping) and key in node:
                    _delete(node, key)
                    _prune(cluster, edit.path[:-1])
            else:
                node[key] = copy.deepcopy(edit.value)  # a step's edits stay as planned, whatever edits it later


def _delete(node: Any, key: str | int) -> None:
    """Delete `key`, keeping the comment lines that follow it. ruamel.yaml hangs a block comment
    after a mapping's last key on that key (the CommentedMap's `ca.items[key][2]`, its post-value
    comment token; ruamel.yaml comments.py), so deleting the last key of a pool (cleanup's pin)
    would take the comment above the next section with it: it moves to the key before."""
    comments = getattr(node, "ca", None)
    token = None
    if comments is not None and key in comments.items:
        slots = comments.items.pop(key)
        token = slots[2] if len(slots) > 2 else None
    keys = list(node)
    del node[key]
    if token is None or keys[-1] != key or len(keys) < 2:
        return
    before = keys[-2]
    slots = comments.items.setdefault(before, [None, None, None, None])
    if slots[2] is None:
        value = node[before]
        flow = getattr(getattr(value, "fa", None), "flow_style", lambda: False)()
        if isinstance(value, Mapping | list) and not flow:
            return  # a block collection's own comments sit on its last item; not worth guessing where
        # a scalar's or a flow collection's (`taints: [...]`) post-value comment prints after its line
        slots[2] = token
    else:  # an end-of-line comment there already ends with its newline: the lines follow it
        slots[2].value = slots[2].value + token.value.lstrip("\n")


def _prune(cluster: Any, path: tuple[str | int, ...]) -> None:
    """Remove maps emptied by a delete (nodeImage.pools.<pool> without previous keeps its version)."""
    while path and isinstance(path[-1], str):
        node: Any = cluster
        for part in path[:-1]:
            node = node[part]
        if node[path[-1]] in ({}, None):
            del node[path[-1]]
            path = path[:-1]
        else:
            return
