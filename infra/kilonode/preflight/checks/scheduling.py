"""scheduling: every Deployment, DaemonSet and StatefulSet the program creates can be placed
on the nodes that exist at bootstrap.

The nodes: each pool role of the render with nodes at its first `pulumi up` (an autoscaled
pool at its plan's node count; a role with none does not count), registered as its kubelet
registers them (preflight/nodes.py): its labels, its registerWithTaints, and the taints
Kubernetes adds during bring-up (node.kubernetes.io/not-ready until Ready,
node.cloudprovider.kubernetes.io/uninitialized until cloud-node-manager initialises the node).

A pod is placed on a pool when:
- its tolerations (a DaemonSet's with the controller's additions, preflight/placement.py)
  tolerate every NoSchedule/NoExecute taint that stays. The bring-up taints clear by
  themselves, except for the pod that clears them: cloud-node-manager must tolerate both to
  run at all. The GPU health startup taint (kilonode.io/gpu-health) clears only when the
  node's GPU path is healthy (driver, fabric, the agent's first check): a kube-system
  Deployment that needs it cleared is a break ("DNS/node initialisation depend on the GPU
  driver path"); anything else waits for it, as its workload does;
- its nodeSelector and required node affinity admit the pool's labels;
- its requests (CPU, memory, nvidia.com/gpu) fit one node: the size's vCPUs, its memory less
  the kubelet's default hard eviction threshold (100Mi; kilonode's kubelet configuration
  reserves nothing else), less the requests of the DaemonSets that run on every node of the
  pool. A simplification: one pod at a time against an empty node, not a bin-packing of
  every workload together;
- it gets a pod IP: a non-hostNetwork pod needs one of the pool's podsPerNode secondary
  addresses, less those the pool's non-hostNetwork DaemonSet pods take.

Pod IPs against maxPods: the kubelet admits up to its maxPods pods, and the scheduler places
pods up to it whatever the NIC has. The DaemonSets of the graph that run on the pool and the
stack's own hostNetwork pods (hostNetworkPods) take their share; what is left for other pods
must not exceed the pod IPs left (podsPerNode less the non-hostNetwork DaemonSet pods), or the
pod after the last address sits in ContainerCreating ("no available addresses") on a node the
scheduler thinks has room.

A Deployment or StatefulSet with required pod anti-affinity on kubernetes.io/hostname needs
as many distinct nodes as it has replicas. A DaemonSet must reach every pool it is meant for
(its node selector and required affinity name them; none: every pool); a taint that keeps
it off one is a finding.

The first run's timeline: `pulumi up` creates the in-cluster objects no earlier than the first
join wave starts (both wait for the network, identities and images; the objects also for the
control plane), and a wave's nodes run a pod NODE_READY_MIN + WORKLOAD_START_MIN after their
wave starts (kilonode.plan.defaults; the waves' starts as kilonode.plan.resolve.joins schedules
them). So an awaited Deployment or StatefulSet can only count on the nodes of waves that start
within its await less that: a workload whose replicas need more nodes than those (one per node
with required hostname anti-affinity, or any node at all) is a break, naming the waves and the
minutes, even when later waves would bring enough. A workload without `replicas` gets the
apiserver's default, 1, unless an autoscaler owns them (CoreDNS's, kilonode.k8s.dns), which
asks only for nodes that exist.

How long `pulumi up` waits for it: pulumi-kubernetes awaits a Deployment, DaemonSet or
StatefulSet for 10 minutes unless told otherwise (provider/pkg/await, v4.32.0). A DaemonSet is
ready only when every node's pod is, never true of a fleet still joining: one not annotated
`pulumi.com/skipAwait: "true"` is a break; any other workload awaited for less than the plan's
`components.awaits.create_min` (nodes allocating, joining, pulling) is a break: the first run
would report failure even when the cluster converges.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kilonode.k8s.pods import SKIP_AWAIT_ANNOTATION
from kilonode.node.gpu.protocol import STARTUP_TAINT
from kilonode.plan.defaults import awaits as awaits_defaults
from kilonode.plan.defaults import joins as joins_defaults
from kilonode.plan.defaults import node as node_defaults
from kilonode.plan.resolve.joins import schedule
from kilonode.plan.wellknown import GPU_RESOURCE, TEAM_LABEL
from kilonode.preflight.model import Finding, Inputs, Resource
from kilonode.preflight.nodes import PoolNodes, bootstrap_nodes
from kilonode.preflight.placement import (
    NOT_READY,
    UNINITIALIZED,
    Taint,
    pod_spec_of,
    pod_tolerations,
    selector_mismatch,
    untolerated,
)

NAME = "scheduling"
TITLE = "every Deployment, DaemonSet and StatefulSet placed on the nodes that exist at bootstrap"
SYSTEM_NAMESPACE = "kube-system"
HOSTNAME_KEY = "kubernetes.io/hostname"
# The kubelet's default evictionHard memory.available (pkg/kubelet/apis/config/v1beta1
# defaults); kilonode's KubeletConfiguration sets no kube/systemReserved.
EVICTION_MEMORY_MIB = 100
# The taints bring-up clears, and the program whose pod clears each: that pod must tolerate
# them (and not-ready, as the node may not be Ready before it runs).
BRING_UP = frozenset({NOT_READY, UNINITIALIZED})
CLEARED_BY = {UNINITIALIZED: "cloud-node-manager"}


@dataclass
class Placement:
    """Where a workload's pods can go: the pools (render roles) and their node counts."""

    workload: Resource
    now: dict[str, int] = field(default_factory=dict)  # placed at bootstrap
    # placed once GPU nodes pass their health check (the startup taint cleared)
    after_gpu_health: dict[str, int] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)  # role -> why not

    @property
    def nodes_now(self) -> int:
        return sum(self.now.values())

    @property
    def nodes_eventually(self) -> int:
        return self.nodes_now + sum(self.after_gpu_health.values())


def _containers(spec: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return list(spec.get("containers") or [])


def _commands(spec: Mapping[str, Any]) -> set[str]:
    return {str((c.get("command") or [""])[0]).rsplit("/", 1)[-1]
            for key in ("initContainers", "containers") for c in spec.get(key) or []}


def _cpu_milli(value: object) -> int:
    text = str(value)
    return int(float(text[:-1])) if text.endswith("m") else int(float(text) * 1000)


_MEMORY_UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}


def _memory_bytes(value: object) -> int:
    text = str(value)
    for unit, factor in _MEMORY_UNITS.items():
        if text.endswith(unit):
            return int(float(text.removesuffix(unit)) * factor)
    return int(float(text))


def requests_of(spec: Mapping[str, Any]) -> dict[str, float]:
    """The pod's requests as the scheduler sums them: its containers' (init containers run
    one at a time, so the largest of each counts if larger). CPU in millicores, memory in bytes."""
    def one(container: Mapping[str, Any]) -> dict[str, float]:
        requests = (container.get("resources") or {}).get("requests") or {}
        return {"cpu": _cpu_milli(requests.get("cpu", 0)), "memory": _memory_bytes(requests.get("memory", 0)),
                GPU_RESOURCE: float(requests.get(GPU_RESOURCE, 0))}

    total: dict[str, float] = {"cpu": 0, "memory": 0, GPU_RESOURCE: 0}
    for container in _containers(spec):
        for key, value in one(container).items():
            total[key] += value
    for container in spec.get("initContainers") or []:
        for key, value in one(container).items():
            total[key] = max(total[key], value)
    return total


def _blocking(kind: str, spec: Mapping[str, Any], group: PoolNodes) -> list[Taint]:
    """Taints of the pool that keep this pod off for good, or until the GPU path is healthy."""
    cleared_here = {taint for taint, program in CLEARED_BY.items() if program in _commands(spec)}
    stays = BRING_UP if cleared_here else frozenset()
    return [t for t in untolerated(pod_tolerations(kind, spec), group.node.taints)
            if t.key not in BRING_UP or t.key in stays]


def daemonsets_on(group: PoolNodes, daemonsets: list[Resource]) -> list[Mapping[str, Any]]:
    """The pod specs of the DaemonSets that run on every node of this pool once it is up."""
    found = []
    for ds in daemonsets:
        spec = pod_spec_of(ds.inputs)
        if selector_mismatch(spec, group.node.labels):
            continue
        if all(t.key == STARTUP_TAINT for t in _blocking("DaemonSet", spec, group)):
            found.append(spec)
    return found


def allocatable_after(group: PoolNodes, daemonsets: list[Mapping[str, Any]]) -> dict[str, float] | None:
    """One node's room once the DaemonSets on it run: the size's vCPUs and memory less the kubelet's hard
    eviction threshold, less their requests (None where the catalogue lacks the size). The review's
    capacity rules read the same figure (kilonode.review.capacity)."""
    pool = group.pool
    if pool.vcpus is None or pool.memory_gib is None:
        return None  # a size the catalogue lacks: nothing to compare with
    free = {"cpu": pool.vcpus * 1000.0, "memory": pool.memory_gib * 2**30 - EVICTION_MEMORY_MIB * 2**20,
            GPU_RESOURCE: float(pool.gpus_per_node)}
    for spec in daemonsets:
        for key, value in requests_of(spec).items():
            free[key] -= value
    return free


def _pod_ips(group: PoolNodes, daemonsets: list[Mapping[str, Any]]) -> int:
    """Pod IPs a node of this pool has left for other pods."""
    return group.pool.pods_per_node - sum(1 for spec in daemonsets if not spec.get("hostNetwork"))


def _refusal(kind: str, spec: Mapping[str, Any], group: PoolNodes,
             daemonsets: list[Mapping[str, Any]]) -> tuple[str | None, bool]:
    """(why the pod cannot go to this pool, whether the GPU health taint is the only reason)."""
    mismatch = selector_mismatch(spec, group.node.labels)
    if mismatch:
        return f"its {mismatch} matches no label of the pool's nodes", False
    blocking = _blocking(kind, spec, group)
    if blocking and any(t.key != STARTUP_TAINT for t in blocking):
        return f"taint {', '.join(str(t) for t in blocking)} not tolerated", False
    if kind != "DaemonSet":
        if not spec.get("hostNetwork") and _pod_ips(group, daemonsets) < 1:
            return (f"no pod IP left: podsPerNode {group.pool.pods_per_node}, taken by the pool's "
                    "non-hostNetwork DaemonSets"), False
        free = allocatable_after(group, daemonsets)
        if free is not None:
            short = [key for key, want in requests_of(spec).items() if want > free[key]]
            if short:
                return (f"requests {', '.join(short)} exceed a {group.pool.vm_size} node's allocatable left by its "
                        "DaemonSets"), False
    if blocking:
        return f"taint {', '.join(str(t) for t in blocking)} (cleared only once the node's GPU path is healthy)", True
    return None, False


def placement_of(workload: Resource, groups: list[PoolNodes], daemonsets: list[Resource]) -> Placement:
    spec = pod_spec_of(workload.inputs)
    found = Placement(workload)
    for group in groups:
        if group.count == 0:
            continue
        why, gpu_only = _refusal(workload.kind, spec, group, daemonsets_on(group, daemonsets))
        if why is None:
            found.now[group.host] = group.count
        elif gpu_only:
            found.after_gpu_health[group.host] = group.count
            found.refused[group.host] = why
        else:
            found.refused[group.host] = why
    return found


def placements(inputs: Inputs) -> dict[str, Placement]:
    """Every workload's placement at bootstrap, by its description ("Deployment ns/name")."""
    groups = bootstrap_nodes(inputs)
    daemonsets = [w for w in inputs.workloads() if w.kind == "DaemonSet"]
    return {w.describe(): placement_of(w, groups, daemonsets) for w in inputs.workloads()}


def _namespace(workload: Resource) -> str:
    return str((workload.inputs.get("metadata") or {}).get("namespace") or "default")


def _hostname_anti_affinity(spec: Mapping[str, Any]) -> bool:
    terms = (((spec.get("affinity") or {}).get("podAntiAffinity") or {})
             .get("requiredDuringSchedulingIgnoredDuringExecution") or [])
    return any(term.get("topologyKey") == HOSTNAME_KEY for term in terms)


def _reasons(found: Placement) -> str:
    return "; ".join(f"{host}: {why}" for host, why in sorted(found.refused.items())) or "no pool has nodes"


FIX_SYSTEM = ("give the stack a system pool (a nodePools entry with `system: true`, a few CPU nodes; "
              "docs/stack-files.md) and record its subnet with `kilonode allocate`; `kilonode validate` refuses a "
              "stack without one")


def _replicated(found: Placement) -> list[Finding]:
    """A Deployment's or StatefulSet's findings."""
    workload = found.workload
    spec = pod_spec_of(workload.inputs)
    replicas = _replicas(workload)
    where = workload.describe()
    system = _namespace(workload) == SYSTEM_NAMESPACE
    if replicas == 0:
        return []
    if found.nodes_eventually == 0:
        return [Finding(NAME, "break", where, f"its pods stay Pending: no node admits them ({_reasons(found)})",
                        "change the workload's nodeSelector/affinity/tolerations or a pool's labels, taints or size "
                        "so that a pool admits it")]
    if system and found.nodes_now == 0:
        return [Finding(NAME, "break", where,
                        f"DNS/node initialisation depend on the GPU driver path: its pods stay Pending until a GPU "
                        f"node passes its health check, and forever if the driver fails ({_reasons(found)})",
                        FIX_SYSTEM)]
    if _hostname_anti_affinity(spec):
        if found.nodes_eventually < replicas:
            return [Finding(NAME, "break", where,
                            f"{replicas} replicas with required pod anti-affinity on {HOSTNAME_KEY} need {replicas} "
                            f"nodes; only {found.nodes_eventually} admit it: {replicas - found.nodes_eventually} "
                            f"stay Pending ({_reasons(found)})",
                            "lower its replicas or let more nodes admit it (a larger pool it tolerates)")]
        if system and found.nodes_now < replicas:
            return [Finding(NAME, "warn", where,
                            f"{replicas} replicas, one per node: {found.nodes_now} run at bootstrap, the other "
                            f"{replicas - found.nodes_now} once GPU nodes pass their health check "
                            f"({', '.join(sorted(found.after_gpu_health))})",
                            "nothing, if that is intended; or more system-pool nodes")]
    return []


def _daemonset(found: Placement, groups: list[PoolNodes]) -> list[Finding]:
    """A DaemonSet that cannot reach a pool its selector means it for."""
    workload = found.workload
    spec = pod_spec_of(workload.inputs)
    findings = []
    for group in groups:
        if group.count == 0 or group.host not in found.refused or group.host in found.after_gpu_health:
            continue
        if selector_mismatch(spec, group.node.labels):
            continue  # not meant for this pool
        why = found.refused[group.host]
        team_only = all(t.key == TEAM_LABEL for t in _blocking("DaemonSet", spec, group))
        if team_only:
            findings.append(Finding(
                NAME, "break", f"{workload.describe()} on {group.host}",
                f"its pods never run on the team's {group.count:,} nodes ({why}): what it serves there is missing "
                "(the device plugin's: the team's GPUs are never registered, the nodes offer 0 nvidia.com/gpu)",
                f"tolerate {TEAM_LABEL} with operator Exists (any team), effect NoSchedule"))
        else:
            findings.append(Finding(
                NAME, "break", f"{workload.describe()} on {group.host}",
                f"its pods never run on the pool's {group.count:,} nodes ({why})",
                "add the toleration to the DaemonSet, or drop the taint from the pool"))
    return findings


def workload_breaks(found: Placement, groups: list[PoolNodes]) -> list[Finding]:
    """One workload's placement breaks as `check` reports them, without the first run's
    timeline and awaits: kilonode.review.placement compares them between the two sides of a
    change, so the review judges placement with this model and no other."""
    return _daemonset(found, groups) if found.workload.kind == "DaemonSet" else _replicated(found)


def check(inputs: Inputs) -> list[Finding]:
    groups = bootstrap_nodes(inputs)
    starts = wave_starts_min(inputs)
    daemonsets = [w for w in inputs.workloads() if w.kind == "DaemonSet"]
    findings = [f for group in groups for f in _pod_addresses(group, daemonsets)]
    for found in placements(inputs).values():
        if found.workload.kind == "DaemonSet":
            findings += _daemonset(found, groups)
        else:
            replicated = _replicated(found)
            late = [] if any(f.level == "break" for f in replicated) else _in_time(found, groups, starts)
            findings += late or replicated  # a late break says more than the bootstrap warning
        findings += _awaited(found.workload, inputs.plan.components.awaits.create_min)
    return findings


def _pod_addresses(group: PoolNodes, daemonsets: list[Resource]) -> list[Finding]:
    """More room under maxPods than pod IPs for the pods that need one."""
    if group.count == 0:
        return []
    on = daemonsets_on(group, daemonsets)
    max_pods = int(group.kubelet_config.get("maxPods", KUBELET_DEFAULT_MAX_PODS))
    networked = sum(1 for spec in on if not spec.get("hostNetwork"))
    room = max_pods - len(on) - group.pool.host_network_pods
    addresses = group.pool.pods_per_node - networked
    if room <= addresses:
        return []
    return [Finding(
        NAME, "break", group.host,
        f"the kubelet admits {max_pods} pods (maxPods): {len(on)} DaemonSet pods and {group.pool.host_network_pods} "
        f"of the stack's own hostNetwork pods leave room for {room} more, but a node has {addresses} pod IP(s) for "
        f"them (podsPerNode {group.pool.pods_per_node} less {networked} for non-hostNetwork DaemonSet pods): the "
        "scheduler places pods beyond the last address, which sit in ContainerCreating (\"no available addresses\")",
        "derive maxPods from the pod IPs and the DaemonSets that run there (kilonode.plan.resolve.pools.max_pods); "
        "lower hostNetworkPods to the hostNetwork pods you really run, or put a DaemonSet on the host network",
    )]


# the kubelet's default --max-pods (KubeletConfiguration maxPods)
KUBELET_DEFAULT_MAX_PODS = 110
# a wave's nodes run a pod this long after their wave starts (the plan's awaits.create_min)
NODES_RUN_PODS_MIN = node_defaults.NODE_READY_MIN + awaits_defaults.WORKLOAD_START_MIN


def wave_starts_min(inputs: Inputs) -> dict[str, float]:
    """Each scale set's wave start, in minutes after the first wave's, as `pulumi up` runs them."""
    joins = inputs.plan.components.joins
    runs = schedule(joins.wave_gaps_s, [joins_defaults.SCALE_SET_CREATE_MIN * 60] * len(joins.waves),
                    joins.in_flight_waves)
    return {shard: start / 60 for (start, _), wave in zip(runs, joins.waves, strict=True) for shard in wave}


def _group_team(group: PoolNodes) -> str | None:
    return next((team for team in group.pool.teams if group.pool.role(team) == group.host), None)


def _replicas(workload: Resource) -> int:
    return int((workload.inputs.get("spec") or {}).get("replicas", 1) or 0)


def _in_time(found: Placement, groups: list[PoolNodes], starts: dict[str, float]) -> list[Finding]:
    """The first run's timeline: the nodes that admit the workload and run pods before its await
    ends, against what its replicas need."""
    workload = found.workload
    annotations = (workload.inputs.get("metadata") or {}).get("annotations") or {}
    if str(annotations.get(SKIP_AWAIT, "")).lower() == "true":
        return []  # not awaited: no deadline
    replicas = _replicas(workload)
    create = workload.custom_timeouts.get("create")
    waits = (_minutes(create) if create else PROVIDER_DEFAULT_AWAIT_MIN) or 0.0
    if replicas == 0 or found.nodes_eventually == 0:
        return []
    latest = waits - NODES_RUN_PODS_MIN  # the last wave start whose nodes run pods in time
    admitted = {**found.now, **found.after_gpu_health}
    in_time, later = 0, 0
    for group in groups:
        if group.host not in admitted:
            continue
        team = _group_team(group)
        for shard in (s for s in group.pool.shards if s.team == team):
            if starts.get(shard.name, 0.0) <= latest:
                in_time += shard.capacity
            else:
                later += shard.capacity
    needed = replicas if _hostname_anti_affinity(pod_spec_of(workload.inputs)) else 1
    if in_time >= needed:
        return []
    return [Finding(
        NAME, "break", workload.describe(),
        f"`pulumi up` waits {waits:g} min for {replicas} replica(s)"
        + (f", one per node ({HOSTNAME_KEY} anti-affinity)" if needed > 1 else "")
        + f"; a wave's nodes run pods {NODES_RUN_PODS_MIN} min after it starts, so only waves starting by minute "
        f"{max(latest, 0):g} count: {in_time:,} node(s) that admit it, {later:,} more in later waves. The first run "
        "reports failure even though the cluster would converge",
        "let the replicas follow the nodes that exist (an autoscaler owning `replicas`, as CoreDNS's), put the pools "
        "it runs on in the first wave, or lengthen its await (kilonode.plan.defaults.awaits)",
    )]


# pulumi-kubernetes's wait without customTimeouts, and its opt-out annotation: one home each
PROVIDER_DEFAULT_AWAIT_MIN = awaits_defaults.PROVIDER_DEFAULT_AWAIT_MIN
SKIP_AWAIT = SKIP_AWAIT_ANNOTATION


def _minutes(duration: str) -> float | None:
    """A Pulumi duration ("40m", "1h30m", "90s") in minutes; None when unreadable."""
    total, number = 0.0, ""
    units = {"h": 60.0, "m": 1.0, "s": 1 / 60}
    for char in duration.strip():
        if char.isdigit() or char == ".":
            number += char
        elif char in units and number:
            total, number = total + float(number) * units[char], ""
        else:
            return None
    return total if not number else None


def _awaited(workload: Resource, needed_min: int) -> list[Finding]:
    """How long the first `pulumi up` waits for this workload, against the time its pods need
    (the plan's components.awaits: nodes allocating, joining, pulling). A DaemonSet is ready
    only when every node's pod is: on a fleet still joining it is never awaited."""
    annotations = (workload.inputs.get("metadata") or {}).get("annotations") or {}
    if str(annotations.get(SKIP_AWAIT, "")).lower() == "true":
        return []
    where = workload.describe()
    if workload.kind == "DaemonSet":
        return [Finding(NAME, "break", where,
                        "`pulumi up` waits until every node's pod is available: on a first run thousands of nodes "
                        "are still allocating and joining, so the run reports failure after the await's deadline "
                        "even when the cluster would converge",
                        f"annotate it {SKIP_AWAIT}: \"true\" (kilonode.k8s.pods.SKIP_AWAIT); watch DaemonSet status "
                        "and node conditions instead")]
    create = workload.custom_timeouts.get("create")
    waits = _minutes(create) if create else PROVIDER_DEFAULT_AWAIT_MIN
    if waits is not None and waits >= needed_min:
        return []
    said = f"customTimeouts create {create}" if create else \
        f"pulumi-kubernetes's default {PROVIDER_DEFAULT_AWAIT_MIN} min"
    return [Finding(NAME, "break", where,
                    f"`pulumi up` waits {said} for its pods, which need up to {needed_min} min on a first run (the "
                    "plan's components.awaits: nodes allocating, joining, pulling): the run reports failure even "
                    "when it would converge",
                    "give it customTimeouts from the plan (kilonode.k8s.pods.awaited)")]
