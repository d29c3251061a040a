"""Loopback addresses for a plan's hosts: the Azure address with its first octet set to 127.

Every address in 127.0.0.0/8 is on the loopback interface (local-substrate.md), so each
member listens on its own address with the standard ports (2379, 2380, 2381) as on
separate hosts. The map is stable (the same Azure address always gives the same loopback
address) and one-to-one inside a VNet: a VNet is at most a /8 (Azure's private ranges:
10/8, 172.16/12, 192.168/16), so its addresses differ only in the last three octets.

    >>> loopback(IPv4Address("10.0.1.10"))
    IPv4Address('127.0.1.10')
"""

from __future__ import annotations

from ipaddress import IPv4Address, IPv4Network

from kilonode.plan.model import ClusterPlan

LOCALHOST = IPv4Address("127.0.0.1")


class AddressError(ValueError):
    pass


def loopback(ip: IPv4Address) -> IPv4Address:
    mapped = IPv4Address((127 << 24) | (int(ip) & 0x00FFFFFF))
    if mapped == LOCALHOST:
        # 10.0.0.1 is a subnet's gateway in Azure (its first usable address is .4); a plan
        # never gives it to a host, and 127.0.0.1 is every host's own localhost here
        raise AddressError(f"{ip} would map to {LOCALHOST}, which every local member shares")
    return mapped


def address_map(plan: ClusterPlan) -> dict[str, str]:
    """Azure address -> loopback address, for every VNet address a host or URL of the plan
    names (etcd members, apiservers, the apiserver load balancer)."""
    vnet: IPv4Network = plan.network.vnet_cidr
    hosts: list[IPv4Address] = [m.ip for c in plan.etcd_clusters for m in c.members]
    hosts += [i.ip for i in plan.control_plane.instances]
    hosts.append(plan.control_plane.load_balancer_ip)
    mapping: dict[str, str] = {}
    for ip in hosts:
        if ip not in vnet:
            raise AddressError(f"{ip} is outside the VNet {vnet}")
        mapping[str(ip)] = str(loopback(ip))
    if len(set(mapping.values())) != len(mapping):
        raise AddressError("two addresses of the plan map to the same loopback address")
    return mapping
