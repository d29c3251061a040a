"""The invariants a cluster's resource graph must hold, defined once for two readers: the
policy pack (`policy/`, run by `pulumi preview --policy-pack policy`) checks them against the
inputs Pulumi is about to send, and `kilonode diff` reports a change that breaks one as a high
risk. Each takes the resources of one stack as the policy engine sees them (type, name,
input properties in the provider's camelCase, the protect option) and returns violations,
one sentence each, naming the resource and what to do.

Pure: no Pulumi, no I/O. Resources are told apart by the tags the program puts on every
Azure resource (`kilonode-role`), the subnets by their Azure names, the in-cluster objects by
their Kubernetes type (kilonode.preflight.apiload).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kilonode.azure.rollout import ETCD_EVENTS, ETCD_LEASES, ETCD_MAIN
from kilonode.azure.tags import (
    ETCD_QUOTA_ACKNOWLEDGED_TAG,
    ETCD_QUOTA_TAG,
    PUBLIC_IP_ACKNOWLEDGED_TAG,
    SUGGESTED_MAX_QUOTA_BYTES,
)
from kilonode.catalog.limits import limits
from kilonode.catalog.vm import infiniband_of
from kilonode.plan.wellknown import TEARDOWN_ARMED, TEARDOWN_TAG
from kilonode.preflight.apiload import unbudgeted

VM = "azure-native:compute:VirtualMachine"
VMSS = "azure-native:compute:VirtualMachineScaleSet"
NSG = "azure-native:network:NetworkSecurityGroup"
SUBNET = "azure-native:network:Subnet"
PUBLIC_IP = "azure-native:network:PublicIPAddress"
ROLE_TAG = "kilonode-role"

# every etcd cluster a stack may have; the leases one is optional (etcd.leases), so an absent
# group is no violation, and a present one is held to the same rules as the others
ETCD_GROUPS = (ETCD_MAIN, ETCD_EVENTS, ETCD_LEASES)
CONTROL_PLANE_ROLES = frozenset({*ETCD_GROUPS, "apiserver"})
# The subnets whose machines may reach etcd's client and peer ports: the apiservers and etcd
# itself (their Azure subnet names, kilonode.plan's network layout).
CONTROL_PLANE_SUBNETS = ("control-plane", "etcd")
ETCD_PORTS = {2379: "client", 2380: "peer"}
# 2,500-node post: etcd's default quota (2 GiB) was hit past 1,000 nodes and stopped writes.
ETCD_DEFAULT_QUOTA_BYTES = limits().etcd.default_quota_bytes.value
# etcd's failure tolerance is (n - 1) / 2; fewer than 3 tolerates none, an even count adds a
# member without adding tolerance, and past 7 every write waits on more replicas for nothing
# (etcd FAQ, "What is maximum cluster size?"). 7,500-node post: 5 for the main store.
ETCD_MEMBER_COUNTS = (3, 5, 7)
# Azure: one InfiniBand fabric per placement group; kilonode keeps an InfiniBand scale set
# within one (singlePlacementGroup, at most 100 VMs) so every node of a shard shares a fabric.
INFINIBAND_SCALE_SET_MAX = limits().azure.vms_per_placement_group.value


@dataclass(frozen=True)
class Resource:
    """One resource as a policy sees it."""

    type: str
    name: str
    props: Mapping[str, Any]
    protect: bool = False

    @property
    def role(self) -> str | None:
        tags = self.props.get("tags") or {}
        return tags.get(ROLE_TAG) if isinstance(tags, Mapping) else None

    @property
    def tags(self) -> Mapping[str, Any]:
        tags = self.props.get("tags")
        return tags if isinstance(tags, Mapping) else {}


def etcd_members(resources: Iterable[Resource]) -> dict[str, list[Resource]]:
    """etcd VMs by cluster (etcd-main, etcd-events, etcd-leases), in name order."""
    groups: dict[str, list[Resource]] = {group: [] for group in ETCD_GROUPS}
    for r in resources:
        if r.type == VM and r.role in groups:
            groups[r.role].append(r)
    return {group: sorted(members, key=lambda r: r.name) for group, members in groups.items()}


def tolerated(members: int) -> int:
    """How many members an etcd cluster of `members` can lose and keep quorum."""
    return (members - 1) // 2


def etcd_member_counts(resources: Sequence[Resource]) -> list[str]:
    found = []
    groups = etcd_members(resources)
    for group, members in groups.items():
        if members and len(members) not in ETCD_MEMBER_COUNTS:
            found.append(f"{group} has {len(members)} members: use 3, 5 or 7 (an odd count of at least 3 "
                         f"tolerates (n-1)/2 down; the 7,500-node clusters ran 5 for the main store)")
    if not groups[ETCD_MAIN] and any(r.type == VM for r in resources):
        found.append(f"no {ETCD_MAIN} VMs: the cluster has no dedicated etcd")
    return found


def events_cluster_present(resources: Sequence[Resource]) -> list[str]:
    groups = etcd_members(resources)
    if groups[ETCD_MAIN] and not groups[ETCD_EVENTS]:
        return [f"no {ETCD_EVENTS} VMs: Kubernetes Events would share the main etcd (2,500-node post: a "
                "separate cluster for Events keeps an event storm from slowing every write)"]
    return []


def etcd_quota(resources: Sequence[Resource]) -> list[str]:
    found = []
    for group, members in etcd_members(resources).items():
        quotas: dict[str, int] = {}
        for vm in members:
            raw = vm.tags.get(ETCD_QUOTA_TAG)
            try:
                quota = int(raw)
            except (TypeError, ValueError):
                found.append(f"{vm.name}: no {ETCD_QUOTA_TAG} tag, so its quota cannot be checked (the program "
                             "tags every etcd VM with the --quota-backend-bytes it renders)")
                continue
            quotas[vm.name] = quota
            if quota <= ETCD_DEFAULT_QUOTA_BYTES:
                found.append(f"{vm.name}: quota {quota:,} bytes is not above etcd's 2 GiB default, which the "
                             "2,500-node clusters hit past 1,000 nodes (every write refused); raise "
                             "quotaBackendBytes")
            elif quota > SUGGESTED_MAX_QUOTA_BYTES and vm.tags.get(ETCD_QUOTA_ACKNOWLEDGED_TAG) != "true":
                found.append(f"{vm.name}: quota {quota:,} bytes is above etcd's suggested maximum of 8 GiB "
                             "without the stack's acknowledgeQuotaAboveSuggestedMaximum")
        if len(set(quotas.values())) > 1:
            found.append(f"{group} members disagree on the quota ({', '.join(f'{n}={q:,}' for n, q in quotas.items())})"
                         ": the smallest one decides when the cluster raises NOSPACE")
    return found


RESOURCE_GROUP = "azure-native:resources:ResourceGroup"


def teardown_armed(resources: Sequence[Resource]) -> bool:
    """The stack is armed for `pulumi destroy` (ClusterConfig.teardown): a resource group of it
    carries the teardown tag, which only that stack value sets (kilonode.azure.network)."""
    return any(r.type == RESOURCE_GROUP and isinstance(tags := r.props.get("tags"), Mapping)
               and tags.get(TEARDOWN_TAG) == TEARDOWN_ARMED for r in resources)


def etcd_vms_protected(resources: Sequence[Resource]) -> list[str]:
    if teardown_armed(resources):
        return []  # the stack says so, on purpose; `kilonode diff` calls arming it high (teardown-armed)
    return [f"{vm.name}: etcd VM without `protect`: a change that replaces it would delete a member's data "
            "(replace a member by the runbook, docs/runbooks/etcd-member-lost-its-disk.md)"
            for members in etcd_members(resources).values() for vm in members if not vm.protect]


def _prefixes(rule: Mapping[str, Any], key: str) -> list[str]:
    found = list(rule.get(f"{key}AddressPrefixes") or [])
    if rule.get(f"{key}AddressPrefix"):
        found.append(rule[f"{key}AddressPrefix"])
    return found


def _ports(rule: Mapping[str, Any]) -> list[str]:
    found = list(rule.get("destinationPortRanges") or [])
    if rule.get("destinationPortRange"):
        found.append(str(rule["destinationPortRange"]))
    return found


def _covers(ranges: Iterable[str], port: int) -> bool:
    for text in ranges:
        if text == "*":
            return True
        low, _, high = text.partition("-")
        if low.isdigit() and int(low) <= port <= int(high or low):
            return True
    return False


def _network(text: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network | None:
    try:
        return ipaddress.ip_network(text, strict=False)
    except ValueError:
        return None  # a service tag (VirtualNetwork, Internet, AzureLoadBalancer) or "*"


def _inside(prefix: str, allowed: Sequence[ipaddress.IPv4Network | ipaddress.IPv6Network]) -> bool:
    network = _network(prefix)
    return network is not None and any(
        network.version == a.version and network.subnet_of(a) for a in allowed  # type: ignore[arg-type]
    )


def _overlaps(prefix: str, target: ipaddress.IPv4Network | ipaddress.IPv6Network) -> bool:
    if prefix == "*":
        return True
    network = _network(prefix)
    return network is None or (network.version == target.version and network.overlaps(target))  # type: ignore[arg-type]


def _subnet_name(r: Resource) -> str:
    """A subnet's Azure name: the `subnetName` input (`kilonode diff` reads inputs), `name` (a
    stack policy at `pulumi preview` reads outputs), or, where neither is known yet (a new
    subnet's first preview), the logical name's tail: `<cluster>-network-<subnet>`."""
    for key in ("subnetName", "name"):
        value = r.props.get(key)
        if isinstance(value, str) and value:
            return value
    return r.name.split("-network-", 1)[1] if "-network-" in r.name else r.name


def subnets(resources: Iterable[Resource]) -> dict[str, str]:
    """Azure subnet name -> address prefix."""
    return {_subnet_name(r): str(r.props.get("addressPrefix"))
            for r in resources if r.type == SUBNET and r.props.get("addressPrefix")}


def etcd_ports_from_control_plane(resources: Sequence[Resource]) -> list[str]:
    known = subnets(resources)
    allowed = [n for n in (_network(known[s]) for s in CONTROL_PLANE_SUBNETS if s in known) if n is not None]
    etcd = _network(known.get("etcd", ""))
    if etcd is None:
        return []  # no etcd subnet in this graph: nothing to guard
    found = []
    for nsg in (r for r in resources if r.type == NSG):
        for rule in nsg.props.get("securityRules") or []:
            if rule.get("access") != "Allow" or rule.get("direction", "Inbound") != "Inbound":
                continue
            if not any(_overlaps(p, etcd) for p in _prefixes(rule, "destination") or ["*"]):
                continue
            for port, what in ETCD_PORTS.items():
                if not _covers(_ports(rule) or ["*"], port):  # an unknown port range counts as any
                    continue
                outside = [p for p in _prefixes(rule, "source") or ["*"] if not _inside(p, allowed)]
                if outside:
                    found.append(f"{nsg.name} rule {rule.get('name')!r} admits etcd's {what} port {port} from "
                                 f"{', '.join(outside)}: only the control-plane and etcd subnets "
                                 f"({', '.join(str(a) for a in allowed)}) may reach it")
    return found


def no_public_ip_on_control_plane(resources: Sequence[Resource]) -> list[str]:
    return [f"{r.name}: a public IP on a {r.role} machine, which the stack did not ask for "
            "(network.publicIpsOnControlPlane)"
            for r in resources
            if r.type == PUBLIC_IP and r.role in CONTROL_PLANE_ROLES and PUBLIC_IP_ACKNOWLEDGED_TAG not in r.tags]


def infiniband_scale_set_size(resources: Sequence[Resource]) -> list[str]:
    found = []
    for r in resources:
        if r.type != VMSS:
            continue
        sku = r.props.get("sku") or {}
        size, capacity = sku.get("name"), sku.get("capacity")
        if isinstance(size, str) and isinstance(capacity, int | float) and infiniband_of(size, None) \
                and capacity > INFINIBAND_SCALE_SET_MAX:
            found.append(f"{r.name}: {int(capacity)} {size} VMs in one InfiniBand scale set; at most "
                         f"{INFINIBAND_SCALE_SET_MAX} share a placement group's fabric (add shards instead)")
    return found


@dataclass(frozen=True)
class Invariant:
    name: str  # the policy's name in the pack
    description: str
    check: Callable[[Sequence[Resource]], list[str]]


INVARIANTS: tuple[Invariant, ...] = (
    Invariant("etcd-member-counts", "Each etcd cluster has 3, 5 or 7 members.", etcd_member_counts),
    Invariant("etcd-events-cluster", "Kubernetes Events have their own etcd cluster.", events_cluster_present),
    Invariant("etcd-quota", "Each etcd member's quota is above etcd's 2 GiB default and within 8 GiB unless "
                            "acknowledged.", etcd_quota),
    Invariant("etcd-ports", "etcd's client and peer ports admit only the control-plane and etcd subnets.",
              etcd_ports_from_control_plane),
    Invariant("no-public-ip-on-control-plane", "No public IP on an etcd member or apiserver unless the stack "
                                               "asks for one.", no_public_ip_on_control_plane),
    Invariant("etcd-protected", "Every etcd VM is protected from deletion.", etcd_vms_protected),
    Invariant("infiniband-scale-set-size", "An InfiniBand scale set holds at most 100 VMs.",
              infiniband_scale_set_size),
    # the 2,500-node lesson: per-node agents listing the cluster (kilonode.preflight.apiload)
    Invariant("daemonset-api-load", "A DaemonSet whose ServiceAccount may list or watch cluster-wide states its "
                                    "per-node API budget (kilonode.io/api-load-budget).", unbudgeted),
)


def violations(resources: Sequence[Resource]) -> dict[str, list[str]]:
    """Every invariant's violations (only those with any)."""
    found = {inv.name: inv.check(resources) for inv in INVARIANTS}
    return {name: messages for name, messages in found.items() if messages}
