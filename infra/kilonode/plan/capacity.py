"""Capacity inside the pools: teams' shards and the autoscaler's node groups.

Teams (field notes: the 7,500-node post's team-resource-manager labelled and tainted nodes
per team from a ConfigMap of (node selector, team, allocation)). Here the allocation is made
in the plan, in whole scale-set shards, so a team's label and taint are in the kubelet's own
registration (`--node-labels`, `registerWithTaints`) of every node its scale sets create: no
controller races the kubelet, and a node is never briefly untainted. A team's shards are a
contiguous run of one pool, starting at a first shard that `kilonode allocate` records in the
stack file, so that no change to another team moves them (a moved shard is a fleet of nodes
re-registering under another team).

The autoscaler (field notes: the 2,500-node post's etcd outage failed every node's health
check and the autoscaler then tried to remove the whole fleet): a pool's shards not given to
a team are its node groups, and every bound is set here, where the toolkit controls it: the
pool never goes below half of its nodes, whatever the autoscaler sees. Teams' shards keep
their capacity and are not node groups at all: a team's allocation never shrinks by itself.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Sequence
from dataclasses import dataclass

from kilonode.catalog import vm as catalog
from kilonode.config.model import ClusterConfig, NodePoolConfig, TeamConfig
from kilonode.plan.model import AutoscalingPlan, NodeGroup, NodePoolPlan, ScaleSetShard, TeamPlan
from kilonode.plan.wellknown import GPU_RESOURCE
from kilonode.problems import Problem


def min_nodes_floor(nodes: int) -> int:
    """The 2,500-node guard: the autoscaler may remove at most half of a pool."""
    return math.ceil(nodes / 2)


def shard_count(pool: NodePoolConfig, per_set: int) -> int:
    """Scale sets a pool needs: for its nodes, or for its maxNodes when the autoscaler may grow
    it (the autoscaler changes scale sets' capacity; it cannot create a scale set)."""
    room = max(pool.nodes, pool.max_nodes or 0) if pool.autoscaling is not None else pool.nodes
    return math.ceil(room / per_set)


# --- teams ---------------------------------------------------------------------------


@dataclass(frozen=True)
class TeamPlacement:
    teams: tuple[TeamPlan, ...]
    shard_team: dict[str, str]  # shard name -> team
    warnings: tuple[str, ...]


def _pool_of(index: int, team: TeamConfig, pools: Sequence[NodePoolPlan]) -> tuple[NodePoolPlan | None, Problem | None]:
    pool, problem = _named_pool(index, team, pools)
    if pool is not None and (pool.system or pool.monitoring):
        # A team's shards register with the team's taint, which the system workloads (or the
        # cluster's Prometheus) do not tolerate: the pool would lose those nodes to them, and the
        # team's pods would run beside the controllers' tokens (independent trace of issue 37, round 3).
        kind = "a system pool" if pool.system else "the monitoring pool"
        loc = ("teams", index, "pool" if team.pool is not None else "nodeSelector")
        return None, Problem(loc, f"pool {pool.name} is {kind}: it serves the cluster's own controllers, and no "
                                  "team's shards may come from it; give the team a pool of its own")
    return pool, problem


def _named_pool(index: int, team: TeamConfig,
                pools: Sequence[NodePoolPlan]) -> tuple[NodePoolPlan | None, Problem | None]:
    if team.pool is not None:
        for pool in pools:
            if pool.name == team.pool:
                return pool, None
        names = [p.name for p in pools]
        close = difflib.get_close_matches(team.pool, names, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        return None, Problem(("teams", index, "pool"),
                             f"no pool is named {team.pool!r}; {hint}the pools are {', '.join(names)}")
    selector = team.node_selector or {}
    matches = [p for p in pools if all(p.labels.get(k) == v for k, v in selector.items())]
    if len(matches) == 1:
        return matches[0], None
    wanted = ", ".join(f"{k}={v}" for k, v in selector.items())
    if not matches:
        return None, Problem(("teams", index, "nodeSelector"),
                             f"no pool carries {wanted}; pools' labels: "
                             + "; ".join(f"{p.name}: {', '.join(f'{k}={v}' for k, v in p.labels.items())}"
                                         for p in pools))
    return None, Problem(("teams", index, "nodeSelector"),
                         f"{wanted} matches {len(matches)} pools ({', '.join(p.name for p in matches)}); a team's "
                         "shards come from one pool: add a label that picks one, or name it with `pool`")


def _run_length(shards: Sequence[ScaleSetShard], first: int, nodes: int) -> int | None:
    """How many shards from `first` hold `nodes`; None when the pool ends first."""
    total = 0
    for count, shard in enumerate(shards[first:], start=1):
        total += shard.capacity
        if total >= nodes:
            return count
    return None


def _free_runs(taken: list[str | None]) -> list[tuple[int, int]]:
    runs, start = [], None
    for i, owner in enumerate([*taken, "end"]):
        if owner is None and start is None:
            start = i
        elif owner is not None and start is not None:
            runs.append((start, i - start))
            start = None
    return runs


def place_teams(config: ClusterConfig, pools: Sequence[NodePoolPlan]) -> tuple[TeamPlacement, list[Problem]]:
    """Each team's run of shards: recorded runs where the stack file puts them, the others
    first fit in stack order. Problems carry the arithmetic."""
    problems: list[Problem] = []
    seen: dict[str, int] = {}
    resolved: list[tuple[int, TeamConfig, NodePoolPlan]] = []
    for index, team in enumerate(config.teams):
        if team.name in seen:
            problems.append(Problem(("teams", index, "name"),
                                    f"{team.name!r} is already teams[{seen[team.name]}]; give each team one entry"))
            continue
        seen[team.name] = index
        pool, problem = _pool_of(index, team, pools)
        if problem is not None:
            problems.append(problem)
        elif pool is not None:
            resolved.append((index, team, pool))
    taken: dict[str, list[str | None]] = {p.name: [None] * len(p.shards) for p in pools}
    placed: dict[int, tuple[int, int]] = {}  # team index -> (first, count)

    resolved_pool = {index: pool.name for index, _team, pool in resolved}

    def owners(pool: NodePoolPlan) -> str:
        given = [(config.teams[i].name, n) for i, (_first, n) in sorted(placed.items())
                 if resolved_pool[i] == pool.name]
        return ", ".join(f"{name} {n}" for name, n in given) or "none"

    # recorded runs first: they never move
    for index, team, pool in [r for r in resolved if r[1].first_shard is not None]:
        first = team.first_shard
        assert first is not None
        count = _run_length(pool.shards, first, team.nodes) if first < len(pool.shards) else None
        if count is None:
            held = sum(s.capacity for s in pool.shards[first:]) if first < len(pool.shards) else 0
            problems.append(Problem(
                ("teams", index, "nodes"),
                f"team {team.name}: {team.nodes:,} nodes from shard {first} of pool {pool.name} run past its end: "
                f"shards {first}-{len(pool.shards) - 1} hold {held:,} ({len(pool.shards)} scale sets of "
                f"≤ {pool.max_vms_per_scale_set}); lower nodes, grow the pool, or move firstShard",
            ))
            continue
        clash = [i for i, (f, n) in sorted(placed.items()) if resolved_pool[i] == pool.name
                 and f < first + count and first < f + n]
        if clash:
            others = "; ".join(f"team {config.teams[i].name} (teams[{i}]) holds shards {placed[i][0]}-"
                               f"{placed[i][0] + placed[i][1] - 1}" for i in clash)
            problems.append(Problem(
                ("teams", index, "firstShard"),
                f"team {team.name}: shards {first}-{first + count - 1} of pool {pool.name} for {team.nodes:,} nodes "
                f"overlap: {others}; recorded runs never move, so move one (firstShard) or shrink the other",
            ))
            continue
        for i in range(first, first + count):
            taken[pool.name][i] = team.name
        placed[index] = (first, count)
    # then the others, first fit in stack order
    for index, team, pool in [r for r in resolved if r[1].first_shard is None]:
        chosen = None
        for start, length in _free_runs(taken[pool.name]):
            count = _run_length(pool.shards, start, team.nodes)
            if count is not None and count <= length:
                chosen = (start, count)
                break
        if chosen is None:
            per = max(s.capacity for s in pool.shards)
            needed = math.ceil(team.nodes / per)
            free = sum(1 for owner in taken[pool.name] if owner is None)
            largest = max((length for _start, length in _free_runs(taken[pool.name])), default=0)
            problems.append(Problem(
                ("teams", index, "nodes"),
                f"team {team.name}: {team.nodes:,} nodes need {needed} whole scale sets of pool {pool.name} "
                f"({per} nodes each); it has {len(pool.shards)} ({pool.nodes:,} nodes), of which teams hold "
                f"{len(pool.shards) - free} ({owners(pool)}), leaving {free} free (longest free run {largest}); "
                "lower nodes, grow the pool, or shrink another team",
            ))
            continue
        first, count = chosen
        for i in range(first, first + count):
            taken[pool.name][i] = team.name
        placed[index] = (first, count)

    plans: list[TeamPlan] = []
    warnings: list[str] = []
    shard_team: dict[str, str] = {}
    for index, team, pool in resolved:
        if index not in placed:
            continue
        first, count = placed[index]
        shards = pool.shards[first:first + count]
        given = sum(s.capacity for s in shards)
        plans.append(TeamPlan(
            name=team.name, pool=pool.name, requested=team.nodes, first_shard=first,
            shards=tuple(s.name for s in shards), nodes=given, recorded=team.first_shard is not None,
            field=f"teams[{index}].firstShard",
        ))
        shard_team.update({s.name: team.name for s in shards})
        if given != team.nodes:
            warnings.append(f"team {team.name}: asked for {team.nodes:,} nodes, gets {given:,} ({count} whole scale "
                            f"set(s) of pool {pool.name}: labels and taints are set per scale set)")
        if team.first_shard is None:
            warnings.append(f"teams[{index}].firstShard: team {team.name} placed at shard {first} of pool {pool.name} "
                            "by the plan; run `kilonode allocate` to record it, so no change to another team moves it")
    return TeamPlacement(tuple(plans), shard_team, tuple(warnings)), problems


# --- the autoscaler --------------------------------------------------------------------


def _split(total: int, parts: int) -> list[int]:
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def plan_autoscaling(index: int, config: NodePoolConfig, pool: NodePoolPlan) -> tuple[AutoscalingPlan | None,
                                                                                       list[Problem]]:
    """Node groups of one pool with its bounds; `pool.shards` already carry their teams."""
    scaling = config.autoscaling
    if scaling is None:
        return None, []
    where = ("nodePools", index, "autoscaling")
    floor = min_nodes_floor(pool.nodes)
    min_nodes = floor if scaling.min_nodes is None else scaling.min_nodes
    max_nodes = max(pool.nodes, config.max_nodes or 0)
    problems: list[Problem] = []
    if min_nodes < floor:
        problems.append(Problem(
            (*where, "minNodes"),
            f"{min_nodes:,} would let the autoscaler remove more than half of pool {pool.name} ({pool.nodes:,} nodes; "
            f"the floor is {floor:,}): the 2,500-node post's guard (an etcd outage failed every health check and the "
            "autoscaler tried to remove the fleet). Raise minNodes, or lower nodes in a reviewed change first",
        ))
    if min_nodes > pool.nodes:
        problems.append(Problem((*where, "minNodes"),
                                f"{min_nodes:,} is above the pool's nodes {pool.nodes:,}; lower it or raise nodes"))
    fixed = sum(s.capacity for s in pool.shards if s.team is not None)
    shared = [s for s in pool.shards if s.team is None]
    if not shared:
        problems.append(Problem(where, f"teams hold every scale set of pool {pool.name}: nothing is left for the "
                                       "autoscaler; remove autoscaling or give the teams fewer nodes"))
    shared_max = max_nodes - fixed
    if scaling.warm_nodes > shared_max:
        problems.append(Problem(
            (*where, "warmNodes"),
            f"{scaling.warm_nodes:,} balloon nodes do not fit in the {shared_max:,} shared nodes the pool may grow to "
            f"(maxNodes {max_nodes:,} − {fixed:,} in teams' scale sets)",
        ))
    size = catalog.vm_size(pool.vm_size)
    if pool.gpus_per_node:
        requests = {GPU_RESOURCE: str(pool.gpus_per_node)}
    elif size is not None and size.vcpus > 1:
        requests = {"cpu": str(size.vcpus - 1)}
    else:
        requests = {}
        if scaling.warm_nodes:
            problems.append(Problem(
                (*where, "warmNodes"),
                f"{pool.vm_size} is not in kilonode's VM-size catalogue with its vCPUs, so a balloon pod cannot be "
                "sized to take a whole node; set warmNodes: 0 or use a catalogued size",
            ))
    if problems:
        return None, problems
    shared_min = max(0, min_nodes - fixed)
    # The floor over the scale sets that start with nodes: one kept only for maxNodes starts empty
    # (kilonode.plan.resolve.pools.capacity_of), and a floor there would make the autoscaler fill it.
    started = [s for s in shared if s.capacity] or shared
    floors = dict(zip((s.name for s in started), _split(shared_min, len(started)), strict=True))
    mins, maxes = [floors.get(s.name, 0) for s in shared], _split(shared_max, len(shared))
    groups = tuple(
        NodeGroup(shard=s.name, min_size=min(lo, s.capacity), max_size=min(hi, pool.max_vms_per_scale_set))
        for s, lo, hi in zip(shared, mins, maxes, strict=True)
    )
    reason = (f"{len(groups)} shared scale set(s) between {sum(g.min_size for g in groups):,} and "
              f"{sum(g.max_size for g in groups):,} nodes")
    reason += f", plus {fixed:,} in teams' scale sets (fixed)" if fixed else ""
    reason += (f"; the pool never below {max(min_nodes, fixed):,} (half of {pool.nodes:,}: the 2,500-node guard)"
               if scaling.min_nodes is None else f"; the pool never below {max(min_nodes, fixed):,} (minNodes)")
    return AutoscalingPlan(min_nodes=max(min_nodes, fixed), max_nodes=max_nodes, warm_nodes=scaling.warm_nodes,
                           balloon_requests=requests, node_groups=groups, reason=reason), []


def catalogue_problems(config: ClusterConfig) -> list[Problem]:
    """With any autoscaled pool, every pool's size must be in the catalogue: the autoscaler's
    --cores-total/--memory-total count every node of the cluster (kilonode.k8s.autoscaler), and
    upstream's defaults (320,000 vCPUs) would stop scale-up in a cluster this size."""
    if not any(pool.autoscaling for pool in config.node_pools):
        return []
    return [
        Problem(("nodePools", index, "vmSize"),
                f"{pool.vm_size} is not in kilonode's VM-size catalogue (infra/kilonode/catalog/vm_sizes.yaml), "
                "and the "
                "cluster autoscaler's resource ceilings count every node's vCPUs and memory; add the size there, or "
                "remove autoscaling from every pool")
        for index, pool in enumerate(config.node_pools) if catalog.vm_size(pool.vm_size) is None
    ]
