"""boot-pulls: what each node pulls from a registry before it can run its workload, counted
over the nodes that start together, and where those pulls go.

A node's first pod needs the pause image, and every DaemonSet that lands on the node starts
its pod at boot: each image not preloaded into the node image is one pull per node, a join
wave's nodes at once (kilonode.plan.resolve.joins). The 7,500-node post: a registry quota hit on the pause image
blocks the whole node; 17 GB images took 30 minutes. A pull that cannot finish is a node
that never runs its pods; a few thousand pulls of the same image through one NAT gateway is
a cost and a rate-limit risk the operator should see before the first run.
"""

from __future__ import annotations

from collections import defaultdict

from kilonode.imageref import registry_of
from kilonode.preflight.model import Finding, Inputs
from kilonode.preflight.nodes import bootstrap_nodes
from kilonode.preflight.placement import (
    NOT_READY,
    UNINITIALIZED,
    pod_spec_of,
    pod_tolerations,
    selector_mismatch,
    untolerated,
)

NAME = "boot-pulls"
TITLE = "registry pulls before each node runs its pods, and how many nodes pull at once (a join wave)"
# Taints that clear by themselves during bring-up (the node turns Ready; cloud-node-manager
# initialises it): a DaemonSet that tolerates everything else lands on the node in the end.
TRANSIENT = frozenset({NOT_READY, UNINITIALIZED})


def _images(spec: dict) -> list[str]:  # type: ignore[type-arg]
    return [c["image"] for key in ("initContainers", "containers") for c in spec.get(key) or [] if c.get("image")]


def at_once(inputs: Inputs) -> int:
    """The most nodes that boot together on a first `pulumi up`: one join wave (the plan's
    components.joins), or a scale set larger than a wave, which boots whole."""
    joins = inputs.plan.components.joins
    capacity = {s.name: s.capacity for pool in inputs.plan.node_pools for s in pool.shards}
    return max([joins.wave_nodes, *(capacity[name] for name in joins.over_bound)])


def check(inputs: Inputs) -> list[Finding]:
    findings = []
    together = at_once(inputs)
    daemonsets = [r for r in inputs.workloads() if r.kind == "DaemonSet"]
    for group in bootstrap_nodes(inputs):
        if group.count == 0:
            continue
        preloaded = {image.image for image in group.pool.preload_images}
        pulls: dict[str, list[str]] = defaultdict(list)  # image -> why the node needs it
        if group.pool.pause_image not in preloaded:
            pulls[group.pool.pause_image].append("the pause image (every pod's sandbox)")
        for ds in daemonsets:
            spec = pod_spec_of(ds.inputs)
            blocking = [t for t in untolerated(pod_tolerations("DaemonSet", spec), group.node.taints)
                        if t.key not in TRANSIENT]
            if blocking or selector_mismatch(spec, group.node.labels):
                continue
            for image in _images(dict(spec)):
                if image not in preloaded:
                    pulls[image].append(ds.describe())
        if not pulls:
            continue
        registries: dict[str, int] = defaultdict(int)
        for image in pulls:
            registries[registry_of(image)] += group.count
        listing = "; ".join(f"{image} ({', '.join(who)})" for image, who in sorted(pulls.items()))
        spread = ", ".join(f"{host}: {count:,}" for host, count in sorted(registries.items()))
        findings.append(Finding(
            NAME, "warn", group.host,
            f"{group.count:,} nodes x {len(pulls)} image(s) = {group.count * len(pulls):,} registry pulls before "
            f"their pods run, through the pool's NAT gateway, {min(group.count, together):,} nodes at a time "
            "(one join wave; more if Azure creates waves slower than the plan assumes), "
            f"per registry: {spread}. Pulled: {listing}",
            "preload them into the node image (the stack's bootImageArchives, each archive with its imageId: "
            "`kilonode image build` checks and loads each into the image), or serve them from a registry inside "
            "the VNet",
        ))
    return findings
