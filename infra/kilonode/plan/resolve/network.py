"""Subnets (recorded ones stay; the rest placed first fit) and the NAT gateways."""

from __future__ import annotations

import math
from dataclasses import dataclass
from ipaddress import IPv4Network

from kilonode.catalog.limits import limits
from kilonode.config.model import ClusterConfig, NodePoolConfig
from kilonode.plan import defaults
from kilonode.plan.model import (
    NatGatewayPlan,
    UnrecordedSubnet,
)
from kilonode.plan.resolve.budgets import pool_ips
from kilonode.problems import Loc, PlanError, Problem, dotted

AZURE = limits().azure


def nat_gateways(config: ClusterConfig) -> tuple[tuple[NatGatewayPlan, ...], list[Problem]]:
    """One NAT gateway per pool subnet (a subnet takes one gateway, a gateway at most 16
    IPs), one shared by the control-plane and etcd subnets; each gateway's public IP prefix
    sized for its machines at the stack's SNAT-ports-per-node floor."""
    floor = config.network.min_snat_ports_per_node
    per_ip, most = AZURE.snat_ports_per_ip.value, AZURE.nat_ips_per_gateway.value
    control = sum(c.members for _, c in config.etcd.clusters()) + config.apiserver.replicas
    wanted: list[tuple[str, tuple[str, ...], int, Loc]] = [
        ("control-plane", ("control-plane", "etcd"), control, ("network", "minSnatPortsPerNode")),
    ] + [
        (f"pool-{pool.name}", (f"pool-{pool.name}",), slot_nodes(pool), ("nodePools", i, "nodes"))
        for i, pool in enumerate(config.node_pools)
    ]
    gateways: list[NatGatewayPlan] = []
    problems: list[Problem] = []
    for name, subnets, nodes, loc in wanted:
        ips = -(-nodes * floor // per_ip)  # ceil
        length = next((n for n in AZURE.nat_prefix_lengths.value if 2 ** (32 - n) >= ips), None)
        if length is None:
            most_nodes = most * per_ip // floor
            problems.append(Problem(
                loc,
                f"{name}: {nodes:,} nodes x {floor} SNAT ports = {nodes * floor:,} ports > {most} public IPs x "
                f"{per_ip:,} = {most * per_ip:,} that one NAT gateway has; split the pool into pools of at most "
                f"{most_nodes:,} nodes (each subnet gets its own gateway), or lower network.minSnatPortsPerNode "
                f"to at most {most * per_ip // nodes}",
            ))
            continue
        gateways.append(NatGatewayPlan(name=name, subnets=subnets, prefix_length=length, nodes=nodes,
                                       min_ports_per_node=floor))
    return tuple(gateways), problems


@dataclass(frozen=True)
class Subnets:
    control_plane: IPv4Network
    etcd: IPv4Network
    pools: dict[str, IPv4Network]
    unrecorded: tuple[UnrecordedSubnet, ...]


def _prefix_for(addresses: int) -> int:
    needed = addresses + AZURE.reserved_per_subnet.value
    return 32 - max(3, math.ceil(math.log2(needed)))


def slot_nodes(pool: NodePoolConfig) -> int:
    """The nodes a pool's subnet is sized for: its declared room, at least its nodes."""
    return max(pool.nodes, pool.max_nodes or 0)


def pool_capacity(pool: NodePoolConfig, subnet: IPv4Network) -> int:
    """How many nodes of this pool `subnet` holds (each NIC: 1 + podsPerNode IPs)."""
    return max(0, subnet.num_addresses - AZURE.reserved_per_subnet.value) // (1 + pool.pods_per_node)


@dataclass(frozen=True)
class _Request:
    loc: Loc
    key: str
    recorded: IPv4Network | None
    prefix: int  # what a fresh allocation gets (sized for the room)
    needed: int  # the longest prefix that still holds what is there now
    why: str


def allocate_subnets(config: ClusterConfig) -> Subnets:
    """Recorded subnets stay where they are; the others are placed first fit, in declaration
    order, around them, and reported as unrecorded.

    Stability comes from recording, not from order: once `kilonode allocate` has written a
    subnet into the stack file it is an input, so no change to another pool or role moves it
    (nor the static etcd/apiserver/LB IPs at fixed offsets inside the control subnets). A pool
    that outgrows its recorded subnet is refused, naming the address that would have to move.
    """
    net = config.network
    vnet = net.vnet_cidr
    requests = [
        _Request(("network", "controlPlaneSubnet"), "control-plane", net.control_plane_subnet,
                 defaults.CONTROL_SUBNET_PREFIX, defaults.CONTROL_SUBNET_PREFIX,
                 "the apiservers and their load balancer"),
        _Request(("network", "etcdSubnet"), "etcd", net.etcd_subnet,
                 defaults.CONTROL_SUBNET_PREFIX, defaults.CONTROL_SUBNET_PREFIX, "the etcd members"),
    ]
    for index, pool in enumerate(config.node_pools):
        slot = slot_nodes(pool)
        requests.append(_Request(
            ("nodePools", index, "subnet"), pool.name, pool.subnet, _prefix_for(slot * (1 + pool.pods_per_node)),
            _prefix_for(pool_ips(pool)),
            f"{pool.nodes} nodes × (1 + {pool.pods_per_node}) IPs + 5 Azure-reserved",
        ))

    problems: list[Problem] = []
    taken: list[IPv4Network] = [r.recorded for r in requests if r.recorded]
    space = _FreeSpace(vnet, taken)
    placed: dict[str, IPv4Network] = {}
    unrecorded: list[UnrecordedSubnet] = []
    outgrown = [r for r in requests if r.recorded and r.recorded.prefixlen > r.needed]
    for r in requests:
        if r.recorded:
            placed[r.key] = r.recorded
    for r in requests:
        if r.recorded:
            continue
        block = space.first_free(r.prefix)
        if block is None:
            problems.append(Problem(
                r.loc if r.loc[0] == "nodePools" else ("network", "vnetCidr"),
                f"no free /{r.prefix} left in network.vnetCidr {vnet} for {r.key} ({r.why}); ways out: "
                "a wider vnetCidr (Azure still caps the VNet at 65,536 private IPs), fewer "
                "podsPerNode, or split the pool",
            ))
            continue
        taken.append(block)
        space.take(block)
        placed[r.key] = block
        unrecorded.append(UnrecordedSubnet(field=dotted(r.loc), subnet=block))
    # where an outgrown subnet could go: around everything else, placed ones included
    problems += [_outgrown(config, r, [t for t in taken if t != r.recorded]) for r in outgrown]
    if problems:
        raise PlanError(problems)
    return Subnets(
        placed.pop("control-plane"), placed.pop("etcd"), {p.name: placed[p.name] for p in config.node_pools},
        tuple(unrecorded),
    )


def _outgrown(config: ClusterConfig, r: _Request, others: list[IPv4Network]) -> Problem:
    """A recorded subnet too small for what the stack now asks: name what would move, and where."""
    assert r.recorded is not None
    free = _first_free(config.network.vnet_cidr, r.needed, others)
    where = f"the first free /{r.needed} is {free}" if free else f"no /{r.needed} is free in the VNet"
    if r.loc[0] != "nodePools":
        return Problem(r.loc, f"{r.recorded} is too small: {r.why} need a /{r.needed} or larger; {where}")
    pool = config.node_pools[int(r.loc[1])]
    room = pool_capacity(pool, r.recorded)
    return Problem(
        r.loc,
        f"{r.recorded} holds at most {room} nodes of this pool ((addresses - 5) ÷ (1 + {pool.pods_per_node})); "
        f"{pool.nodes} nodes need a /{r.needed}. Growing past it moves this pool's subnet {r.recorded}"
        + (f" → {free}" if free else "")
        + f", which recreates every scale set of pool '{pool.name}': stay at ≤ {room} nodes, or set this "
        f"subnet to a free /{r.needed} ({where}) to move it deliberately",
    )


def _first_free(vnet: IPv4Network, prefix: int, taken: list[IPv4Network]) -> IPv4Network | None:
    """The lowest /prefix block of `vnet` that overlaps nothing in `taken` (None: there is none)."""
    return _FreeSpace(vnet, taken).first_free(prefix)


class _FreeSpace:
    """What is taken of a VNet, as a binary tree of its CIDR blocks, each knowing the largest
    free aligned block below it: the lowest free /prefix is then one walk down (at most 32
    steps), and taking a block one walk too.

    Placing P unrecorded subnets by scanning was cubic in P (each of P placements tried up to P
    candidates against up to P taken blocks): 256 pools took seconds. This is O(P x 32) and
    gives the same block, the lowest aligned one that overlaps nothing taken, so no placement
    moves (tests/plan/test_subnet_placement.py checks it against the scan it replaced).
    Only touched blocks have a node; a missing child is wholly free.
    """

    _FULL = 33  # `_best` of a wholly taken block: no free block of any prefix length

    def __init__(self, vnet: IPv4Network, taken: list[IPv4Network] | tuple[IPv4Network, ...] = ()) -> None:
        self.vnet = vnet
        self._base = int(vnet.network_address)
        # (prefix length, address) of a block -> the shortest prefix length of a free aligned
        # block inside it (its own length when wholly free, _FULL when wholly taken)
        self._best: dict[tuple[int, int], int] = {}
        for block in taken:
            self.take(block)

    def _best_of(self, length: int, address: int) -> int:
        return self._best.get((length, address), length)

    def take(self, block: IPv4Network) -> None:
        """Mark `block` taken (the part of it inside the VNet: CIDR blocks nest or are apart)."""
        if not block.overlaps(self.vnet):
            return
        if block.prefixlen <= self.vnet.prefixlen:  # it holds the whole VNet
            self._best = {(self.vnet.prefixlen, self._base): self._FULL}
            return
        address, path = int(block.network_address), []
        length, node = self.vnet.prefixlen, self._base
        while length < block.prefixlen:
            if self._best_of(length, node) == self._FULL:
                return  # already inside a taken block
            path.append((length, node))
            length += 1
            node = address >> (32 - length) << (32 - length)
        self._best[(length, node)] = self._FULL
        for length, node in reversed(path):
            half = 1 << (32 - length - 1)
            left, right = self._best_of(length + 1, node), self._best_of(length + 1, node + half)
            self._best[(length, node)] = min(left, right)

    def first_free(self, prefix: int) -> IPv4Network | None:
        """The lowest free /prefix block (not taken; take() it to keep it)."""
        length, node = self.vnet.prefixlen, self._base
        if prefix < length or prefix > 32 or self._best_of(length, node) > prefix:
            return None
        while length < prefix and (length, node) in self._best:
            # a node in the map is partly taken: go to the lower half when it holds a free block
            # of this size, else the upper (the parent's best says one of them does)
            length += 1
            if self._best_of(length, node) > prefix:
                node += 1 << (32 - length)
        return IPv4Network((node, prefix))
