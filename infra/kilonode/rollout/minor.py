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
7. the pins and the `previous` versions removed, once every node runs the new version.

Pure: the stack's config in, steps out; each step is a list of edits (a path under
kilonode:cluster and its value, or DELETE) that `apply` makes on the stack file's YAML tree.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kilonode.config.model import ClusterConfig

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


@dataclass
class Plan:
    stack: str
    start: str
    to: str
    steps: list[Step] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def minor_of(version: str) -> int:
    return int(version.split(".")[1])


def next_minor_version(version: str) -> str:
    """A gallery version's next minor: 1.2.3 -> 1.3.0."""
    major, minor, _ = (int(x) for x in version.split("."))
    return f"{major}.{minor + 1}.0"


def refusal(config: ClusterConfig, to: str) -> str | None:
    """Why an upgrade of this stack to `to` cannot be planned (None: it can)."""
    start = config.kubernetes_version
    if minor_of(to) != minor_of(start) + 1:
        return (f"{start} -> {to}: a minor upgrade moves one minor at a time (the apiservers of an HA control plane "
                f"differ by at most one minor); plan 1.{minor_of(start) + 1}.x first" if minor_of(to) > minor_of(start)
                else f"{start} -> {to} is not an upgrade: Kubernetes does not support going back a minor")
    behind = [p.name for p in config.node_pools if p.kubernetes_version not in (None, start)]
    if behind:
        return (f"pools {', '.join(behind)} do not run {start}: finish the last upgrade first (every pool at the "
                "control plane's version, their pins removed)")
    if config.acknowledge_restart:
        return f"acknowledgeRestart is set ({', '.join(config.acknowledge_restart)}): finish that change first"
    kept = [name for name, image in (("nodeImage", config.node_image), ("etcdImage", config.etcd_image),
                                     ("controlPlaneImage", config.control_plane_image)) if image.previous]
    kept += [f"nodeImage.pools.{pool}" for pool, image in sorted(config.node_image.pools.items()) if image.previous]
    if kept:
        return (f"{', '.join(kept)} still keep a previous version: an image rollout is not finished (its nodes not "
                "rolled yet still boot that version). Finish it and remove `previous` first; the upgrade's pool "
                "steps set their own")
    return None


def plan_upgrade(config: ClusterConfig, stack: str, to: str, canary: str | None = None) -> Plan:
    """The steps from the stack's kubernetesVersion to `to` (refusal() first)."""
    start = config.kubernetes_version
    pools = list(config.node_pools)
    index = {p.name: i for i, p in enumerate(pools)}
    order = sorted(pools, key=lambda p: (p.name != canary, p.system, p.monitoring, p.nodes, p.name))
    plan = Plan(stack, start, to)
    plan.steps.append(Step(
        "pin-pools", f"Pin every pool at {start}",
        tuple(Edit(("nodePools", index[p.name], "kubernetesVersion"), start,
                   "kubelet version of this pool during the minor upgrade") for p in pools),
        ("Take an etcd snapshot of the main cluster first (docs/runbooks/etcd-restore-from-snapshot.md: "
         "the backup job's latest, or one by hand)", f"kilonode diff  # no changes to {stack}", "pulumi up"),
        "no change: every pool already runs this version"))
    cp = config.control_plane_image.version
    cp_next = next_minor_version(cp)
    old_minor = f"1.{minor_of(start)}"
    plan.steps.append(Step(
        "control-plane", f"Move the control plane's binaries to {to}, emulating {old_minor}",
        (Edit(("kubernetesVersion",), to),
         Edit(("controlPlaneEmulatedVersion",), old_minor,
              f"--emulated-version={old_minor}: the binaries can go back to {start} while it is set"),
         Edit(("controlPlaneImage", "version"), cp_next, f"Kubernetes {to}"),
         Edit(("controlPlaneImage", "previous"), cp, "the rollback target while the apiservers move"),
         Edit(("acknowledgeRestart",), ["apiservers"], "one apiserver at a time (docs/azure.md)")),
        (f"kilonode image build {stack} --role control-plane --out build/node-image --fetch",
         "kilonode diff  # the apiservers replaced, one at a time",
         "replace the apiservers one at a time (docs/azure.md, \"Rolling the control plane\")",
         f"`pulumi up`: the in-cluster components stay at {start} (none newer than the emulated {old_minor})"),
        f"replace-stops (the apiservers, one at a time: {to} binaries, --emulated-version={old_minor}); no "
        "version change of the in-cluster components; no version-skew (the pools stay at their pinned version)"))
    plan.steps.append(Step(
        "control-plane-done", "Remove acknowledgeRestart; soak",
        (Edit(("acknowledgeRestart",), DELETE),),
        ("kilonode diff  # no changes", "pulumi up",
         f"soak: until the next step, going back is reverting the control-plane step's commit (the {start} "
         "binaries, kept as controlPlaneImage.previous, with acknowledgeRestart [apiservers]; docs/operations.md)"),
        "no change"))
    plan.steps.append(Step(
        "raise-emulated-version", f"Raise the emulated version to {to}: the point of no return",
        (Edit(("controlPlaneEmulatedVersion",), DELETE,
              f"the {to} APIs, features and storage versions: the binaries can no longer go back to {old_minor}"),
         Edit(("acknowledgeRestart",), ["apiservers"], "one apiserver at a time (docs/azure.md)")),
        ("kilonode diff  # the apiservers replaced again (--emulated-version removed)",
         "replace the apiservers one at a time (docs/azure.md, \"Rolling the control plane\")",
         f"one full `pulumi up`: the in-cluster components move to {to} (kube-proxy rolls on every node, "
         "never newer than the apiservers now)"),
        "replace-stops (the apiservers, one at a time), version changes of the in-cluster components; no "
        "version-skew (the pools stay at their pinned version, within three minors)"))
    plan.steps.append(Step(
        "raise-done", "Remove acknowledgeRestart", (Edit(("acknowledgeRestart",), DELETE),),
        ("kilonode diff  # no changes", "pulumi up"), "no change"))
    images = config.node_image
    for pool in order:
        was = images.of_pool(pool.name).version
        plan.steps.append(Step(
            f"pool-{pool.name}", f"Move pool {pool.name} to {to}" + (" (the canary)" if pool.name == canary else ""),
            (Edit(("nodePools", index[pool.name], "kubernetesVersion"), to),
             Edit(("nodeImage", "pools", pool.name), {"version": next_minor_version(was), "previous": was},
                  f"Kubernetes {to}; {was} kept for rollback")),
            (f"kilonode image build {stack} --pool {pool.name} --out build/node-image --fetch",
             "kilonode diff  # a fleet rollout of the pool, its old image kept",
             "pulumi up  # new instances (scale-out) get the new model at once",
             f"kilonode rollout start {stack} --pool {pool.name} --journal {_journal(stack, pool.name)}"
             + (" --prometheus <a Prometheus outside this pool: it runs the cluster's>" if pool.monitoring else "")
             + f" && kilonode rollout run {stack} --journal {_journal(stack, pool.name)}"),
            "fleet-rollout of this pool, no rollback-target-removed, no version-skew", pool=pool.name))
    cleanup = [Edit(("nodePools", index[p.name], "kubernetesVersion"), DELETE) for p in pools]
    cleanup += [Edit(("nodeImage", "pools", p.name, "previous"), DELETE) for p in pools]
    cleanup.append(Edit(("controlPlaneImage", "previous"), DELETE))
    plan.steps.append(Step(
        "cleanup", "Remove the pins and the previous versions, once every node runs the new version",
        tuple(cleanup), (*(f"kilonode rollout status {stack} --journal {_journal(stack, p.name)}  # every scale set "
                           "done" for p in order), "kilonode diff", "pulumi up"),
        "rollback-target-removed for the previous versions (expected: nothing runs them any more)"))
    plan.notes.append(
        f"Going back: until raise-emulated-version the apiservers, controller manager and scheduler run the {to} "
        f"binaries with --emulated-version={old_minor} (KEP-4330), so the {start} binaries can come back: revert "
        f"the control-plane step's commit with acknowledgeRestart [apiservers] and replace the apiservers one at "
        f"a time. raise-emulated-version is the point of no return: from then on the {to} APIs, features and "
        "storage versions are in use and the only way back is the etcd snapshot taken at pin-pools "
        "(docs/runbooks/etcd-restore-from-snapshot.md). The pools move only after it: a kubelet must not be "
        "newer than the apiservers' emulated version.")
    return plan


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
                    del node[key]
                    _prune(cluster, edit.path[:-1])
            else:
                node[key] = copy.deepcopy(edit.value)  # a step's edits stay as planned, whatever edits it later


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
