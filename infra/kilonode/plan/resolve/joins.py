"""How fast nodes may join, and the waves of scale sets that keep a `pulumi up` under it.

What bounds the join rate, and what does not:
- The apiservers' seats in the levels a join lands in (kilonode.k8s.flowcontrol): the
  bootstrap token's CSR in kilonode-node-bootstrap, the new kubelet in the built-in node-high
  (its Node, nodes/status, its Lease) and system (everything else it reads and writes),
  kube-proxy and cloud-node-manager in kilonode-node-agents. APF keeps a burst from taking
  other levels' seats; it queues and then refuses (429), it does not pace. The plan turns those
  seats into nodes per minute (sized_for_per_min) with the estimates in
  kilonode.plan.defaults.joins.
- A first `pulumi up`: Pulumi creates independent resources in parallel, so every scale set
  with its full capacity at once (thousands of VMs at research-7500). The program splits them
  into waves of at most wave_nodes nodes and starts the waves one interval apart: a chain of
  timers (kilonode.azure.join_waves), each dependsOn the one before, and each wave's scale sets
  dependsOn their timer ("The dependsOn option ensures that resource creation, update, and
  deletion operations are executed in the correct order": pulumi docs, concepts/options/
  dependson). A wave does not wait for the one before to be created (Azure takes ~10 min per
  scale set, which would admit a tenth of the rate); it waits for the wave in_flight_waves
  before it, so a slow Azure holds the later waves instead of letting them pile up.
- The cluster autoscaler does not: --max-nodes-per-scaleup bounds one scale-up "strictly for
  optimizing CA algorithm latency and not a tool to rate-limit scale-up throughput", and after
  a scale-up the next loop starts at once, not after --scan-interval (kubernetes/autoscaler
  cluster-autoscaler/loop/trigger.go LoopTrigger.Wait l.78-82 at cluster-autoscaler-1.32.7 and
  -1.34.5: "starts new iteration immediately if the previous one was productive"). What bounds
  its bursts is the pools' headroom (node groups' max sizes) and one scale-up of at most a
  wave (kilonode.k8s.autoscaler); APF queues the rest.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from kilonode.plan import defaults
from kilonode.plan.model import ClusterPlan, JoinPlan, NodePoolPlan

# The built-in levels a new node's kubelet lands in (system-node-high -> node-high, system-nodes
# -> system: kubernetes/apiserver pkg/apis/flowcontrol/bootstrap/default.go l.311-348 at
# kubernetes-1.34.2), and kilonode's two that carry the rest of a join.
JOIN_LEVELS = ("node-high", "system", defaults.APF_NODE_AGENTS_LEVEL, defaults.APF_BOOTSTRAP_LEVEL)


def nominal_seats(server_limit: int, shares: Mapping[str, int]) -> dict[str, int]:
    """Each level's nominal concurrency limit: ceil(server limit x shares / sum of all shares)
    (kubernetes/apiserver kubernetes-1.34.2 pkg/util/flowcontrol/apf_controller.go l.863)."""
    total = sum(shares.values())
    return {name: math.ceil(server_limit * share / total) for name, share in shares.items()}


def kilonode_shares() -> dict[str, int]:
    """kilonode's own priority levels and their nominalConcurrencyShares."""
    return {defaults.APF_NODE_AGENTS_LEVEL: defaults.APF_NODE_AGENTS_SHARES,
            defaults.APF_MONITORING_LEVEL: defaults.APF_MONITORING_SHARES,
            defaults.APF_BOOTSTRAP_LEVEL: defaults.APF_BOOTSTRAP_SHARES}


def join_seats(server_limit: int, builtin_shares: Mapping[str, int]) -> int:
    """The seats of one apiserver's join levels together."""
    seats = nominal_seats(server_limit, {**builtin_shares, **kilonode_shares()})
    return sum(seats[name] for name in JOIN_LEVELS)


def sized_for_per_min(server_limit: int, apiservers: int, builtin_shares: Mapping[str, int]) -> int:
    """Nodes per minute the join levels serve on the apiservers left with one down."""
    serving = max(1, apiservers - 1)
    seats = serving * join_seats(server_limit, builtin_shares) * defaults.JOIN_SEAT_SHARE_PERCENT // 100
    return seats * 60 // (defaults.JOIN_SEAT_SECONDS * defaults.JOIN_REQUESTS_PER_NODE)


def _first(pool: NodePoolPlan) -> bool:
    """Pools the cluster's own workloads run on: a system pool, the Prometheus pool (tainted for
    Prometheus alone, yet its StatefulSet and Service await its node), or an untainted one."""
    return pool.system or pool.monitoring or not pool.taints


def waves(pools: tuple[NodePoolPlan, ...], bound: int) -> tuple[tuple[tuple[str, ...], ...], tuple[str, ...]]:
    """Shards packed in order into waves of at most `bound` nodes: the pools the cluster's own
    workloads run on first, then every pool in plan order. A shard larger than the bound is a
    wave of its own (returned as over the bound too)."""
    ordered = [s for p in pools if _first(p) for s in p.shards] + [s for p in pools if not _first(p) for s in p.shards]
    result: list[list[str]] = []
    over: list[str] = []
    nodes = 0
    for shard in ordered:
        if shard.capacity > bound:
            over.append(shard.name)
            result.append([shard.name])
            nodes = bound  # nothing joins this wave
            continue
        if not result or nodes + shard.capacity > bound:
            result.append([])
            nodes = 0
        result[-1].append(shard.name)
        nodes += shard.capacity
    return tuple(tuple(w) for w in result), tuple(over)


def gap(nodes: int, bound: int) -> int:
    """How long a wave of `nodes` holds the next one back: one interval per `bound` nodes
    (rounded up), so a wave over the bound holds it as long as its joins take at the sized rate."""
    return -(-max(1, nodes) // bound) * defaults.JOIN_WAVE_INTERVAL_S


def schedule(gaps_s: Sequence[int], create_s: Sequence[int], in_flight: int) -> list[tuple[int, int]]:
    """(start, created) of each wave in seconds, as `pulumi up` runs them: a wave starts once its
    timer has run (the previous timer, then its gap) and the wave `in_flight` before it is
    created; it is created create_s[k] after its start. The waves k, k + in_flight, ... are
    thus created one after the other: at most `in_flight` at once, however long each takes."""
    result: list[tuple[int, int]] = []
    timer = 0
    for k, create in enumerate(create_s):
        timer += gaps_s[k - 1] if k else 0
        start = max(timer, result[k - in_flight][1] if k >= in_flight else 0)
        result.append((start, start + create))
    return result


def join_plan(pools: tuple[NodePoolPlan, ...], server_limit: int, apiservers: int,
              builtin_shares: Mapping[str, int]) -> JoinPlan:
    sized = sized_for_per_min(server_limit, apiservers, builtin_shares)
    interval = defaults.JOIN_WAVE_INTERVAL_S
    bound = max(1, sized * interval // 60)
    chained, over = waves(pools, bound)
    capacity = {s.name: s.capacity for p in pools for s in p.shards}
    sizes = [sum(capacity[name] for name in wave) for wave in chained]
    gaps = tuple(gap(nodes, bound) for nodes in sizes[:-1])
    create = defaults.SCALE_SET_CREATE_MIN * 60
    runs = schedule(gaps, [create] * len(chained), defaults.JOIN_WAVES_IN_FLIGHT)
    # a wave's nodes over the time until the next may start: its gap (JOIN_WAVES_IN_FLIGHT never
    # holds a wave back longer at the assumed creation time; tests/plan/test_joins.py)
    admitted = max((-(-nodes * 60 // gap(nodes, bound)) for nodes in sizes), default=0)
    bring_up = -(-max((end for _, end in runs), default=0) // 60) + defaults.NODE_READY_MIN
    return JoinPlan(sized_for_per_min=sized, wave_nodes=bound, waves=chained, over_bound=over, wave_gaps_s=gaps,
                    in_flight_waves=defaults.JOIN_WAVES_IN_FLIGHT, admitted_per_min=admitted,
                    bring_up_min=bring_up, reason=_reason(server_limit, apiservers, builtin_shares, sized, bound))


def _reason(server_limit: int, apiservers: int, builtin_shares: Mapping[str, int], sized: int, bound: int) -> str:
    serving = f"{apiservers - 1} apiservers (one down)" if apiservers > 1 else "1 apiserver"
    return (
        f"{serving} x {join_seats(server_limit, builtin_shares)} seats in the join levels "
        f"({', '.join(JOIN_LEVELS)}) x {defaults.JOIN_SEAT_SHARE_PERCENT}% for joins, "
        f"{defaults.JOIN_SEAT_SECONDS} s per request, {defaults.JOIN_REQUESTS_PER_NODE} requests per join: "
        f"{sized} nodes/min; a wave boots at most {defaults.JOIN_WAVE_INTERVAL_S} s of that ({bound} nodes), "
        f"and the waves start {defaults.JOIN_WAVE_INTERVAL_S} s apart per {bound} nodes of the wave before")


def first_run_timeline(plan: ClusterPlan) -> str:
    """When each wave's nodes run pods on a first `pulumi up`, against the awaits' deadline (the
    timeline preflight's `scheduling` check judges every awaited workload by)."""
    joins, awaits = plan.components.joins, plan.components.awaits
    runs = schedule(joins.wave_gaps_s, [defaults.SCALE_SET_CREATE_MIN * 60] * len(joins.waves), joins.in_flight_waves)
    run_pods = defaults.NODE_READY_MIN + defaults.WORKLOAD_START_MIN
    capacity = {s.name: s.capacity for p in plan.node_pools for s in p.shards}
    pool_of = {s.name: p.name for p in plan.node_pools for s in p.shards}
    in_time = [name for (start, _), wave in zip(runs, joins.waves, strict=True) for name in wave
               if start / 60 + run_pods <= awaits.create_min]
    pools = sorted({pool_of[name] for name in in_time})
    last = runs[-1][0] / 60 + run_pods if runs else 0
    return (f"first run: a wave's nodes run pods ~{run_pods} min after it starts ({defaults.NODE_READY_MIN} min to "
            f"Ready, {defaults.WORKLOAD_START_MIN} to start a workload); the awaits end {awaits.create_min} min after "
            f"the in-cluster objects are created, by when {sum(capacity[n] for n in in_time):,} nodes of "
            f"{len(in_time)} scale set(s) run pods ({', '.join(pools) or 'none'}); the last wave's from ~{last:.0f} "
            f"min. Awaited workloads need no later node (preflight's scheduling); CoreDNS's replicas grow as the "
            f"waves join (its autoscaler, up to {plan.components.dns_autoscale.max_replicas})")


def _duration(minutes: int) -> str:
    hours, rest = divmod(minutes, 60)
    return f"{hours} h {rest} min" if hours else f"{rest} min"


def describe(plan: ClusterPlan) -> list[str]:
    """What `kilonode explain` says under "node joins": one line each."""
    joins = plan.components.joins
    capacity = {s.name: s.capacity for p in plan.node_pools for s in p.shards}
    sizes = [sum(capacity[name] for name in wave) for wave in joins.waves]
    create, interval, flight = defaults.SCALE_SET_CREATE_MIN, defaults.JOIN_WAVE_INTERVAL_S, joins.in_flight_waves
    # the waves k, k + flight, k + 2 x flight ... are created one after the other: at most one
    # of each such chain at a time, so at most the `flight` largest waves together
    together = sum(sorted(sizes, reverse=True)[:flight])
    last = schedule(joins.wave_gaps_s, [create * 60] * len(sizes), flight)[-1][0] // 60 if sizes else 0
    lines = [
        f"admitted: {joins.admitted_per_min} nodes/min on `pulumi up` -- {len(joins.waves)} waves of scale sets, "
        f"started by a chain of {len(joins.wave_gaps_s)} timers (each dependsOn the one before; a wave's scale sets "
        f"dependsOn its timer), {interval} s apart per {joins.wave_nodes} nodes of the wave before; at most "
        f"{joins.wave_nodes} nodes booting per wave (largest {max(sizes, default=0)})",
        f"sized for: {joins.sized_for_per_min} nodes/min ({joins.reason})",
        f"in flight: at most {flight} waves being created at once (a wave also waits until the wave {flight} before "
        f"it is created): as many as the timers start in the ~{create} min a creation takes (assumed), so it costs "
        f"nothing then; when Azure is slower the later waves wait, so at most {flight} waves ({together:,} nodes at "
        "most) boot together, and a wave s min late joins together with the waves started in those s min",
        f"first bring-up: {_duration(joins.bring_up_min)} until the last of {sum(sizes):,} nodes is Ready (the last "
        f"wave starts at {last} min, ~{create} min to create, {defaults.NODE_READY_MIN} min to Ready); the first "
        f"wave ({', '.join(joins.waves[0]) if joins.waves else '-'}) holds the nodes the cluster's own workloads "
        "run on, so `pulumi up`'s awaits need no later wave (preflight's `scheduling` check walks that timeline; "
        "CoreDNS's replicas follow the nodes that exist)",
        "growth: a later `pulumi up` runs no timer that exists (each runs its sleep once, on creation; a changed "
        "timer's update is a no-op), so scale sets added in new waves are paced by the new timers after the last "
        "one, but those packed into a wave whose timer has run start at once, together",
    ]
    lines.append(first_run_timeline(plan))
    if joins.over_bound:
        lines.append(
            f"over the bound: {len(joins.over_bound)} scale set(s) of more than {joins.wave_nodes} nodes "
            f"({', '.join(joins.over_bound)}) boot whole, each as its own wave: a scale set cannot be split without "
            "moving its name; a new cluster gets smaller ones from more apiservers or smaller pools")
    if plan.autoscaled_pools:
        lines.append(
            f"cluster autoscaler: at most {min(defaults.CLUSTER_AUTOSCALER_MAX_NODES_PER_SCALEUP, joins.wave_nodes)} "
            "nodes per scale-up, but no rate limit (its next loop starts at once after a scale-up); a burst is "
            "bounded by the pools' headroom and queued by the apiservers' APF levels")
    return lines
