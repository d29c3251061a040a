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
  with its full capacity at once (thousands of VMs at research-7500). The program chains them
  in waves of at most wave_nodes nodes, each wave dependsOn the one before ("The dependsOn
  option ensures that resource creation, update, and deletion operations are executed in the
  correct order": pulumi docs, concepts/options/dependson): a wave starts once Azure has
  created the previous wave's scale sets.
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
from collections.abc import Mapping

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
    """Pools the cluster's own workloads run on: a system pool, or an untainted one."""
    return pool.system or not pool.taints


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


def join_plan(pools: tuple[NodePoolPlan, ...], server_limit: int, apiservers: int,
              builtin_shares: Mapping[str, int]) -> JoinPlan:
    sized = sized_for_per_min(server_limit, apiservers, builtin_shares)
    bound = max(1, sized * defaults.JOIN_WAVE_SPREAD_MIN)
    chained, over = waves(pools, bound)
    capacity = {s.name: s.capacity for p in pools for s in p.shards}
    largest = max((sum(capacity[name] for name in wave) for wave in chained), default=0)
    admitted = -(-largest // defaults.SCALE_SET_CREATE_MIN)
    bring_up = len(chained) * defaults.SCALE_SET_CREATE_MIN + defaults.NODE_READY_MIN
    serving = f"{apiservers - 1} apiservers (one down)" if apiservers > 1 else "1 apiserver"
    reason = (
        f"{serving} x {join_seats(server_limit, builtin_shares)} seats in the join levels "
        f"({', '.join(JOIN_LEVELS)}) x {defaults.JOIN_SEAT_SHARE_PERCENT}% for joins, "
        f"{defaults.JOIN_SEAT_SECONDS} s per request, {defaults.JOIN_REQUESTS_PER_NODE} requests per join: "
        f"{sized} nodes/min; a wave boots at most {defaults.JOIN_WAVE_SPREAD_MIN} min of that ({bound} nodes); "
        f"{len(chained)} waves x {defaults.SCALE_SET_CREATE_MIN} min per scale-set creation (assumed) + "
        f"{defaults.NODE_READY_MIN} min for the last wave's nodes to be Ready")
    return JoinPlan(sized_for_per_min=sized, wave_nodes=bound, waves=chained, over_bound=over,
                    admitted_per_min=admitted, bring_up_min=bring_up, reason=reason)


def _duration(minutes: int) -> str:
    hours, rest = divmod(minutes, 60)
    return f"{hours} h {rest} min" if hours else f"{rest} min"


def describe(plan: ClusterPlan) -> list[str]:
    """What `kilonode explain` says under "node joins": one line each."""
    joins = plan.components.joins
    capacity = {s.name: s.capacity for p in plan.node_pools for s in p.shards}
    sizes = [sum(capacity[name] for name in wave) for wave in joins.waves]
    lines = [
        f"admitted: {joins.admitted_per_min} nodes/min on `pulumi up` -- {len(joins.waves)} waves of scale sets, each "
        f"created once Azure has created the one before (dependsOn), at most {joins.wave_nodes} nodes booting per "
        f"wave (largest {max(sizes, default=0)}), one wave per ~{defaults.SCALE_SET_CREATE_MIN} min (assumed)",
        f"sized for: {joins.sized_for_per_min} nodes/min ({joins.reason})",
        f"first bring-up: {_duration(joins.bring_up_min)} until the last of {sum(sizes):,} nodes is Ready; the first "
        f"wave ({', '.join(joins.waves[0]) if joins.waves else '-'}) holds the nodes the cluster's own workloads "
        "run on, so `pulumi up`'s awaits never wait on a later wave",
    ]
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
