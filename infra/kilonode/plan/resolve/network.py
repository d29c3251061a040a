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
    placed: dict[str, IPv4Network] = {}
    unrecorded: list[UnrecordedSubnet] = []
    outgrown = [r for r in requests if r.recorded and r.recorded.prefixlen > r.needed]
    for r in requests:
        if r.recorded:
            placed[r.key] = r.recorded
    for r in requests:
        if r.recorded:
            continue
        block = _first_free(vnet, r.prefix, taken)
        if block is None:
            problems.append(Problem(
                r.loc if r.loc[0] == "nodePools" else ("network", "vnetCidr"),
                f"no free /{r.prefix} left in network.vnetCidr {vnet} for {r.key} ({r.why}); ways out: "
                "a wider vnetCidr (Azure still caps the VNet at 65,536 private IPs), fewer "
                "podsPerNode, or split the pool",
            ))
            continue
        taken.append(block)
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
    if prefix < vnet.prefixlen:
        return None
    size = 2 ** (32 - prefix)
    start = int(vnet.network_address)
    end = int(vnet.broadcast_address)
    candidate = start
    while candidate + size - 1 <= end:
        block = IPv4Network((candidate, prefix))
        clash = next((t for t in taken if t.overlaps(block)), None)
        if clash is None:
            return block
        # jump past the clashing block, keeping alignment
        after = int(clash.broadcast_address) + 1
        candidate = max(candidate + size, (after + size - 1) // size * size)
    return None
