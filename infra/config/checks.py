"""Rules that span several fields; each problem names the field a user must change."""

from __future__ import annotations

from ipaddress import IPv4Network

from infra.config.model import GIB, ClusterConfig
from infra.config.sysctl_profile import SysctlProfile
from infra.problems import Loc, Problem

GC_THRESH = tuple(f"net.ipv4.neigh.default.gc_thresh{i}" for i in (1, 2, 3))


def effective_sysctls(config: ClusterConfig, profile: SysctlProfile) -> dict[str, int | str]:
    """Profile values overlaid with the stack's overrides, profile keys first."""
    values: dict[str, int | str] = {name: entry.value for name, entry in profile.root.items()}
    values.update(config.sysctl.overrides)
    return values


def cross_field_problems(config: ClusterConfig, profile: SysctlProfile) -> list[Problem]:
    return [
        *_etcd_quota(config),
        *_pool_names(config),
        *_max_nodes(config),
        *_cidrs(config),
        *_gc_thresh(config, profile),
    ]


def _etcd_quota(config: ClusterConfig) -> list[Problem]:
    problems = []
    for which in ("main", "events"):
        cluster = getattr(config.etcd, which)
        if cluster.quota_backend_bytes > 8 * GIB and not cluster.acknowledge_quota_above_suggested_maximum:
            problems.append(Problem(
                ("etcd", which, "quotaBackendBytes"),
                f"{cluster.quota_backend_bytes} is above etcd's suggested maximum of 8 GiB "
                f"({8 * GIB}); lower it, or also set etcd.{which}."
                "acknowledgeQuotaAboveSuggestedMaximum: true if you have load-tested it",
            ))
    return problems


def _pool_names(config: ClusterConfig) -> list[Problem]:
    seen: dict[str, int] = {}
    problems = []
    for index, pool in enumerate(config.node_pools):
        if pool.name in seen:
            problems.append(Problem(
                ("nodePools", index, "name"),
                f"{pool.name!r} is already the name of nodePools[{seen[pool.name]}]; "
                "pool names must be unique (they name scale sets and directories)",
            ))
        seen.setdefault(pool.name, index)
    return problems


def _max_nodes(config: ClusterConfig) -> list[Problem]:
    return [
        Problem(
            ("nodePools", index, "nodes"),
            f"{pool.nodes} is above this pool's maxNodes {pool.max_nodes}; raise maxNodes (its recorded subnet "
            "must still hold the nodes) or lower nodes",
        )
        for index, pool in enumerate(config.node_pools)
        if pool.max_nodes is not None and pool.nodes > pool.max_nodes
    ]


def _cidrs(config: ClusterConfig) -> list[Problem]:
    net = config.network
    problems = []
    pinned: list[tuple[Loc, IPv4Network]] = []
    if net.control_plane_subnet:
        pinned.append((("network", "controlPlaneSubnet"), net.control_plane_subnet))
    if net.etcd_subnet:
        pinned.append((("network", "etcdSubnet"), net.etcd_subnet))
    pinned += [(("nodePools", i, "subnet"), p.subnet) for i, p in enumerate(config.node_pools) if p.subnet]

    for loc, subnet in pinned:
        if not subnet.subnet_of(net.vnet_cidr):
            problems.append(Problem(
                loc, f"{subnet} is not inside network.vnetCidr {net.vnet_cidr}; "
                "pick a range inside it, or remove it to let the plan allocate one",
            ))
    for i, (loc, subnet) in enumerate(pinned):
        for other_loc, other in pinned[:i]:
            if subnet.overlaps(other):
                problems.append(Problem(
                    loc, f"{subnet} overlaps {other} ({'.'.join(map(str, other_loc))}); "
                    "subnets must not overlap",
                ))
    if net.service_cidr.overlaps(net.vnet_cidr):
        problems.append(Problem(
            ("network", "serviceCidr"),
            f"{net.service_cidr} overlaps network.vnetCidr {net.vnet_cidr}; Service IPs are "
            "virtual and must not collide with VNet addresses: pick a range outside it",
        ))
    for i, cidr in enumerate(net.apiserver_allowed_cidrs):
        if cidr.prefixlen == 0:
            problems.append(Problem(
                ("network", "apiserverAllowedCidrs", i),
                "0.0.0.0/0 opens the apiserver to the whole internet; name the ranges that need it",
            ))
    return problems


def _gc_thresh(config: ClusterConfig, profile: SysctlProfile) -> list[Problem]:
    values = effective_sysctls(config, profile)
    overrides = config.sysctl.overrides
    problems = []

    def loc(name: str) -> Loc:
        return ("sysctl", "overrides", name) if name in overrides else ("sysctl", "profile")

    numbers: list[int] = []
    for name in GC_THRESH:
        raw = values.get(name)
        if raw is None:
            problems.append(Problem(("sysctl", "profile"), f"profile lacks {name}; add it to the profile or overrides"))
            return problems
        try:
            number = int(raw)
        except ValueError:
            problems.append(Problem(loc(name), f"{name} must be an integer (got {raw!r})"))
            return problems
        if number <= 0:
            problems.append(Problem(loc(name), f"{name} must be positive (got {number})"))
        numbers.append(number)
    one, two, three = numbers
    if not one < two < three:
        culprit = next((n for n in reversed(GC_THRESH) if n in overrides), GC_THRESH[2])
        problems.append(Problem(
            loc(culprit),
            f"neighbour-table thresholds must rise: gc_thresh1 < gc_thresh2 < gc_thresh3, "
            f"got {one} / {two} / {three}; the field notes' values are 80000 / 90000 / 100000",
        ))
    return problems
