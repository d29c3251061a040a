"""Placing unrecorded subnets: the free-space tree (kilonode.plan.resolve.network._FreeSpace)
picks exactly the block the first-fit scan it replaced picked, so no address moves; and many
unrecorded pools are placed without the scan's cubic cost."""

from __future__ import annotations

from ipaddress import IPv4Network

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kilonode.config.model import ClusterConfig
from kilonode.plan.resolve.network import _first_free, _FreeSpace, allocate_subnets

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

# required (kilonode.config.tokens): within a year of the tests' pinned now
JOIN_TOKENS = {"current": {"generation": 1, "expires": "2027-11-30T00:00:00Z"}}


def scan_first_free(vnet: IPv4Network, prefix: int, taken: list[IPv4Network]) -> IPv4Network | None:
    """The first-fit scan kilonode placed subnets with before the tree (kept here as the reference)."""
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
        after = int(clash.broadcast_address) + 1
        candidate = max(candidate + size, (after + size - 1) // size * size)
    return None


VNET = IPv4Network("10.0.0.0/16")
# blocks in and around the VNet: nested, overlapping, outside it, and holding it whole
block = st.builds(
    lambda length, address: IPv4Network((address >> (32 - length) << (32 - length), length)),
    st.integers(14, 30), st.integers(int(IPv4Network("9.255.0.0/16").network_address),
                                     int(IPv4Network("10.1.255.255/32").network_address)),
)


@settings(max_examples=300, deadline=None)
@given(taken=st.lists(block, max_size=40), prefixes=st.lists(st.integers(12, 32), min_size=1, max_size=40))
def test_the_tree_places_each_subnet_where_the_scan_did(taken: list[IPv4Network], prefixes: list[int]) -> None:
    # recorded subnets first, then placements one after another, each then taken, as allocate_subnets does
    space, reference = _FreeSpace(VNET, taken), list(taken)
    for prefix in prefixes:
        expected = scan_first_free(VNET, prefix, reference)
        assert space.first_free(prefix) == expected == _first_free(VNET, prefix, reference)
        if expected is not None:
            reference.append(expected)
            space.take(expected)


def test_a_full_vnet_has_no_room_and_a_wider_block_never_fits() -> None:
    assert _FreeSpace(VNET, [IPv4Network("10.0.0.0/15")]).first_free(24) is None
    assert _FreeSpace(VNET).first_free(15) is None
    assert _FreeSpace(VNET).first_free(16) == VNET
    half = _FreeSpace(VNET, [IPv4Network("10.0.0.0/17")])
    assert half.first_free(16) is None and half.first_free(17) == IPv4Network("10.0.128.0/17")


def test_256_unrecorded_pools_are_placed_first_fit_in_declaration_order() -> None:
    pools = [{"name": f"p{i}", "nodes": 4 + (i * 37) % 60, "podsPerNode": [0, 1, 3][i % 3],
              "vmSize": "Standard_D4ds_v5", "gpusPerNode": 0} for i in range(256)]
    config = ClusterConfig.model_validate({
        "name": "many", "etcd": {"main": {"members": 5}, "events": {"members": 3}},
        "apiserver": {"replicas": 3}, "joinTokens": JOIN_TOKENS, "nodePools": pools,
    })
    subnets = allocate_subnets(config)
    # the same blocks, in the same order, as the scan gives
    reference: list[IPv4Network] = []
    for key, placed in [("control-plane", subnets.control_plane), ("etcd", subnets.etcd),
                        *subnets.pools.items()]:
        assert placed == scan_first_free(config.network.vnet_cidr, placed.prefixlen, reference), key
        reference.append(placed)
    assert len(subnets.unrecorded) == 258
