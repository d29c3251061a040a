"""Address ranges a cluster's own address spaces may not cover (addresses.yaml)."""

from __future__ import annotations

from functools import cache
from ipaddress import IPv4Network

from kilonode.catalog import CATALOG_DIR, Row, load


class ReservedRange(Row):
    range: IPv4Network
    what: str
    source: str


class PrivateRange(Row):
    range: IPv4Network
    what: str
    source: str


class ServiceRange(Row):
    fewest_addresses: int
    fewest_source: str
    widest_prefix: int
    widest_source: str


class Addresses(Row):
    reserved: tuple[ReservedRange, ...]
    private: tuple[PrivateRange, ...]
    service_range: ServiceRange


@cache
def addresses() -> Addresses:
    return load(Addresses, CATALOG_DIR / "addresses.yaml")


def reserved_in(network: IPv4Network) -> ReservedRange | None:
    """The first reserved range `network` overlaps, if any."""
    return next((row for row in addresses().reserved if row.range.overlaps(network)), None)


def private_of(network: IPv4Network) -> PrivateRange | None:
    """The private (or shared) range `network` lies inside, if any."""
    return next((row for row in addresses().private if network.subnet_of(row.range)), None)


def public_addresses(network: IPv4Network) -> int:
    """How many of `network`'s addresses lie outside every private and shared range: the
    internet's (the private ranges do not overlap one another)."""
    inside = sum(min(network, row.range, key=lambda n: n.num_addresses).num_addresses
                 for row in addresses().private if network.overlaps(row.range))
    return network.num_addresses - inside
