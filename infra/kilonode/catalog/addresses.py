"""Address ranges a cluster's own address spaces may not cover (addresses.yaml)."""

from __future__ import annotations

from functools import cache
from ipaddress import IPv4Network

from kilonode.catalog import CATALOG_DIR, Row, load


class ReservedRange(Row):
    range: IPv4Network
    what: str
    source: str


class Addresses(Row):
    reserved: tuple[ReservedRange, ...]


@cache
def addresses() -> Addresses:
    return load(Addresses, CATALOG_DIR / "addresses.yaml")


def reserved_in(network: IPv4Network) -> ReservedRange | None:
    """The first reserved range `network` overlaps, if any."""
    return next((row for row in addresses().reserved if row.range.overlaps(network)), None)
