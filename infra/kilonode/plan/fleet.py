"""A fleet of clusters of one shape: the largest single cluster a stack's shape allows, the limit
that sizes it, and the stacks that hold a target node or GPU count between them.

The shape is the stack's pools in their proportions: every pool that is neither a system nor the
monitoring pool (its "work pools") grows or shrinks by the same factor, the system and monitoring
pools and the control plane stay as the stack has them. A cluster is that shape at a number of
work nodes; the planner itself (kilonode.plan.resolve, every budget and refusal it has) says
whether that cluster can exist. The largest one is found by bisection on the work nodes: every
limit the planner checks grows with the nodes, so a size that fails is never followed by a larger
one that passes. What the next node up is refused with is the binding limit.

Each cluster of the fleet gets its own VNet range (the stack's VNet size, the next free block of
the private ranges: no two ever overlap, so any two can be peered) and its own name; its
subnets are then placed by the planner and recorded (`kilonode allocate`). Teams are left out:
a team's allocation is a decision about one cluster, made again per cluster. Pure: values in,
values out; kilonode.cli.fleet writes, validates and checks the stacks.
"""

from __future__ import annotations

import copy
import ipaddress
import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kilonode.catalog.limits import limits
from kilonode.catalog.vm import gpus_of, vm_sizes
from kilonode.config.load import stack_from_value
from kilonode.config.model import ClusterConfig
from kilonode.plan import ClusterPlan, plan_stack
from kilonode.problems import StackError

# Where the fleet's VNets come from, in order: RFC 1918's ranges.
PRIVATE_RANGES = (ipaddress.ip_network("10.0.0.0/8"), ipaddress.ip_network("172.16.0.0/12"),
                  ipaddress.ip_network("192.168.0.0/16"))
PEERED_CAP = limits().azure.peered_group_private_ips
VNET_BUDGET = "VNet private IPs"


class FleetError(ValueError):
    """The input cannot give a fleet: a target of nothing, a shape with no work pool, a stack that
    does not plan at its own size, a peered fleet past Azure's cap."""


@dataclass(frozen=True)
class Shape:
    """A stack's pools in proportion: the work pools' node counts (which grow together), the
    GPUs of a node of each."""

    raw: dict[str, Any]  # the stack's `kilonode:cluster` value
    work: tuple[int, ...]  # indexes of nodePools that scale
    nodes: tuple[int, ...]  # their nodes in the stack
    gpus: tuple[int, ...]  # their GPUs per node

    @property
    def work_nodes(self) -> int:
        return sum(self.nodes)

    def split(self, total: int) -> list[int]:
        """`total` work nodes over the work pools in the stack's proportions (largest remainder:
        the parts sum to `total`, every pool keeps at least one node)."""
        exact = [total * n / self.work_nodes for n in self.nodes]
        parts = [max(1, math.floor(x)) for x in exact]
        order = sorted(range(len(parts)), key=lambda i: exact[i] - math.floor(exact[i]), reverse=True)
        for i in order[: max(0, total - sum(parts))]:
            parts[i] += 1
        return parts

    def gpus_at(self, total: int) -> int:
        return sum(n * g for n, g in zip(self.split(total), self.gpus, strict=True))

    def nodes_for_gpus(self, gpus: int) -> int:
        """The fewest work nodes that carry `gpus` GPUs in this shape."""
        per_node = sum(n * g for n, g in zip(self.nodes, self.gpus, strict=True)) / self.work_nodes
        if per_node == 0:
            raise FleetError("the stack's work pools have no GPUs: give --nodes, not --gpus")
        total = max(1, math.ceil(gpus / per_node))
        while self.gpus_at(total) < gpus:
            total += 1
        return total


def shape_of(config: ClusterConfig, raw: dict[str, Any]) -> Shape:
    work = [i for i, p in enumerate(config.node_pools) if not p.system and not p.monitoring]
    if not work:
        raise FleetError("the stack has only system and monitoring pools: nothing to grow")
    pools = config.node_pools
    return Shape(raw=copy.deepcopy(raw), work=tuple(work), nodes=tuple(pools[i].nodes for i in work),
                 gpus=tuple(gpus_of(pools[i].vm_size, pools[i].gpus_per_node) for i in work))


def cluster_value(shape: Shape, total: int, name: str, vnet: str | None = None) -> dict[str, Any]:
    """The shape at `total` work nodes: each work pool's nodes (and maxNodes, autoscaler floor and
    warm nodes, in the same proportion), no recorded subnet and no team."""
    raw = copy.deepcopy(shape.raw)
    raw["name"] = name
    raw.pop("teams", None)
    network = raw.setdefault("network", {})
    for key in ("controlPlaneSubnet", "etcdSubnet"):
        network.pop(key, None)
    if vnet is not None:
        network["vnetCidr"] = vnet
    for pool in raw["nodePools"]:
        pool.pop("subnet", None)
    for index, was, nodes in zip(shape.work, shape.nodes, shape.split(total), strict=True):
        pool = raw["nodePools"][index]
        pool["nodes"] = nodes
        if pool.get("maxNodes"):
            pool["maxNodes"] = max(nodes, math.ceil(pool["maxNodes"] * nodes / was))
        scaling = pool.get("autoscaling")
        if isinstance(scaling, dict):
            if scaling.get("minNodes") is not None:
                scaling["minNodes"] = max(math.ceil(nodes / 2), math.floor(scaling["minNodes"] * nodes / was))
            if scaling.get("warmNodes"):
                scaling["warmNodes"] = min(nodes, scaling["warmNodes"])
    return raw


def try_plan(name: str, raw: dict[str, Any], file: Path) -> tuple[ClusterPlan | None, list[str]]:
    """The cluster's plan, or the problems that refuse it (each as `field: message`)."""
    try:
        return plan_stack(stack_from_value(name, raw, file)), []
    except StackError as error:
        return None, [f"{p.path}: {p.message}" if p.path else p.message for p in error.problems]


@dataclass(frozen=True)
class Largest:
    work_nodes: int
    plan: ClusterPlan
    binding: list[str]  # what the next size up is refused with; empty when it was not reached
    tried: int  # how many sizes were planned
    # limits of the stack's own settings that were lifted on the way: (what, at how many work nodes,
    # the change), e.g. the monitoring pool's VM size when its Prometheus no longer fits
    lifted: tuple[tuple[str, int, str], ...] = ()


# The monitoring pool's sizes, smallest first: the same family (Edsv5: memory-optimised, with a
# local disk for the TSDB's emptyDir) the shipped stacks use. When the cluster's Prometheus
# outgrows the pool's size, the fleet moves it up this list rather than call that the limit.
MONITORING_SIZES = tuple(sorted((n for n in vm_sizes() if re.fullmatch(r"Standard_E\d+ds_v5", n)),
                                key=lambda n: (vm_sizes()[n].memory_gib, vm_sizes()[n].vcpus)))


def lift(shape: Shape, config: ClusterConfig, problems: list[str]) -> tuple[Shape, str] | None:
    """A shape with the limit behind `problems` lifted by the stack's own settings, if it is one the
    fleet knows how to lift: the monitoring pool's VM size, one step up MONITORING_SIZES."""
    for index, pool in enumerate(shape.raw["nodePools"]):
        if not pool.get("monitoring") or not any(p.startswith(f"nodePools[{index}].vmSize:") for p in problems):
            continue
        size = pool.get("vmSize", config.node_pools[index].vm_size)
        bigger = [s for s in MONITORING_SIZES if vm_sizes()[s].memory_gib > vm_sizes()[size].memory_gib] \
            if size in vm_sizes() else []
        if not bigger:
            return None
        raw = copy.deepcopy(shape.raw)
        raw["nodePools"][index]["vmSize"] = bigger[0]
        return (Shape(raw=raw, work=shape.work, nodes=shape.nodes, gpus=shape.gpus),
                f"pool {pool['name']} on {bigger[0]} (was {size}): its Prometheus outgrew the smaller size")
    return None


def largest(shape: Shape, name: str, file: Path, ceiling: int,
            progress: Callable[[str], None] = lambda _: None) -> Largest:
    """The most work nodes a cluster of this shape may have, up to `ceiling` (bisection: every
    limit the planner checks grows with the nodes)."""
    tried = 0

    def attempt(total: int) -> tuple[ClusterPlan | None, list[str]]:
        nonlocal tried
        tried += 1
        return try_plan(name, cluster_value(shape, total, name), file)

    top_plan, top_problems = attempt(ceiling)
    if top_plan is not None:  # one cluster holds the target
        return Largest(ceiling, top_plan, [], tried)
    own_plan, own_problems = attempt(shape.work_nodes) if ceiling > shape.work_nodes else (None, top_problems)
    if own_plan is None:
        raise FleetError(f"the stack does not plan at {min(ceiling, shape.work_nodes):,} work nodes: "
                         + "; ".join(own_problems))
    low, low_plan, high, high_problems = shape.work_nodes, own_plan, ceiling, top_problems
    while high - low > 1:
        middle = (low + high) // 2
        progress(f"  {middle:,} work nodes ...")
        middle_plan, middle_problems = attempt(middle)
        if middle_plan is not None:
            low, low_plan = middle, middle_plan
        else:
            high, high_problems = middle, middle_problems
    return Largest(low, low_plan, high_problems, tried)


def vnet_ranges(first: str, count: int) -> list[str]:
    """`count` VNet ranges the size of `first`, starting with `first` and then the next free blocks
    of the private ranges: pairwise disjoint."""
    base = ipaddress.ip_network(first)
    found = [base]
    for block in _blocks(base.prefixlen):
        if len(found) == count:
            break
        if not any(block.overlaps(taken) for taken in found):
            found.append(block)
    if len(found) < count:
        raise FleetError(f"the private ranges hold {len(found)} VNets of /{base.prefixlen}, not {count}: give the "
                         "stack a smaller network.vnetCidr")
    return [str(n) for n in found]


def _blocks(prefix: int) -> Iterator[ipaddress.IPv4Network]:
    for space in PRIVATE_RANGES:
        if prefix >= space.prefixlen:
            yield from space.subnets(new_prefix=prefix)  # type: ignore[misc]


@dataclass(frozen=True)
class Member:
    name: str
    work_nodes: int
    raw: dict[str, Any]
    plan: ClusterPlan

    @property
    def vnet_used(self) -> int:
        return next(b.used for b in self.plan.budgets if b.name == VNET_BUDGET)


@dataclass(frozen=True)
class Fleet:
    stack: str
    target_nodes: int  # work nodes asked for (from --nodes, or --gpus through the shape)
    target_gpus: int | None
    shape: Shape
    largest: Largest
    members: tuple[Member, ...]
    peered: bool
    notes: tuple[str, ...] = field(default=())

    @property
    def gpus(self) -> int:
        return sum(self.shape.gpus_at(m.work_nodes) for m in self.members)


def plan_fleet(stack: str, config: ClusterConfig, raw: dict[str, Any], file: Path, *, nodes: int | None = None,
               gpus: int | None = None, peered: bool = False,
               progress: Callable[[str], None] = lambda _: None) -> Fleet:
    """The fleet of clusters of `config`'s shape that holds `nodes` work nodes (or `gpus` GPUs)."""
    if (nodes is None) == (gpus is None):
        raise FleetError("give one target: --nodes N or --gpus G")
    if (nodes or gpus or 0) < 1:
        raise FleetError("the target must be at least 1")
    shape = shape_of(config, raw)
    target = nodes if nodes is not None else shape.nodes_for_gpus(gpus or 0)
    progress(f"largest cluster of {stack}'s shape (up to {target:,} work nodes):")
    big = largest(shape, f"{config.name}-00", file, target, progress)
    lifted: list[tuple[str, int, str]] = []
    while big.binding and (step := lift(shape, config, big.binding)) is not None:
        shape, change = step
        lifted.append((big.binding[0], big.work_nodes, change))
        progress(f"lifted at {big.work_nodes:,} work nodes: {change}")
        big = largest(shape, f"{config.name}-00", file, target, progress)
    big = Largest(big.work_nodes, big.plan, big.binding, big.tried, tuple(lifted))
    count = math.ceil(target / big.work_nodes)
    sizes = [target // count + (1 if i < target % count else 0) for i in range(count)]
    vnets = vnet_ranges(config.network.vnet_cidr, count)
    members = []
    for index, (size, vnet) in enumerate(zip(sizes, vnets, strict=True)):
        name = f"{config.name}-{index:02d}"
        progress(f"planning {name}: {size:,} work nodes, VNet {vnet}")
        value = cluster_value(shape, size, name, vnet)
        plan, problems = try_plan(name, value, file)
        if plan is None:  # a size at or below the largest planned; only its VNet differs
            raise FleetError(f"{name} does not plan: " + "; ".join(problems))
        members.append(Member(name, size, value, plan))
    fleet = Fleet(stack, target, gpus, shape, big, tuple(members), peered,
                  notes=tuple(_notes(config)))
    if peered:
        check_peering(fleet)
    return fleet


def _notes(config: ClusterConfig) -> Iterator[str]:
    if config.teams:
        yield (f"teams left out ({', '.join(t.name for t in config.teams)}): a team's shards are one cluster's "
               "decision; add them per cluster and run `kilonode allocate`")
    yield ("one subscription per cluster: Azure counts NICs (65,536), VNets and vCPU quota per subscription and "
           "region, so clusters sharing one share those; set each stack's subscription in its Pulumi config")


def check_peering(fleet: Fleet) -> None:
    """Azure caps the private addresses of a group of peered VNets, whatever each holds."""
    used = [m.vnet_used for m in fleet.members]
    if sum(used) > PEERED_CAP.value:
        terms = " + ".join(f"{u:,}" for u in used[:6]) + (f" + … ({len(used) - 6} more)" if len(used) > 6 else "")
        fits = max(1, PEERED_CAP.value // max(used))
        raise FleetError(
            f"peered, the fleet's VNets would hold {terms} = {sum(used):,} private addresses, above the "
            f"{PEERED_CAP.value:,} of {PEERED_CAP.source}; peer at most {fits} of these clusters together (groups "
            "of peered VNets, not one), or leave them unpeered (their ranges never overlap either way)")
