"""Source ranges that together admit more than a /8 of the internet to 6443 are refused as 0.0.0.0/0
is, and the cluster's own address spaces cover no reserved range (catalog/addresses.yaml). The
refusals are hostile files (tests/config/hostile/sem-world-*, sem-reserved-*); here, the edges that
must still pass."""

from __future__ import annotations

from ipaddress import IPv4Address, IPv4Network
from typing import Any

import pytest

from kilonode.catalog.addresses import addresses
from kilonode.config import load_stack
from kilonode.config.checks import APISERVER_PUBLIC_ADDRESSES, CLUSTER_DNS_OFFSET, KUBERNETES_SERVICE_OFFSET, admitted
from kilonode.plan.resolve import resolve
from kilonode.plan.wellknown import AZURE_IMDS_ADDRESS, AZURE_WIRESERVER_ADDRESS
from kilonode.problems import StackError
from tests.conftest import StackWriter, shipped_cluster_value

RUNNER_VNET = ("/subscriptions/11111111-2222-3333-4444-555555555555/resourceGroups/ci/providers/"
               "Microsoft.Network/virtualNetworks/runners")


def _load(write_stack: StackWriter, network: dict[str, Any] | None = None,
          deployer: dict[str, Any] | None = None, pool_subnet: str | None = None) -> Any:
    cluster = shipped_cluster_value("local")
    cluster["network"] = {**cluster["network"], **(network or {})}
    if pool_subnet is not None:
        cluster["nodePools"][0]["subnet"] = pool_subnet
    if deployer is not None:
        cluster["deployer"] = deployer
    return load_stack(str(write_stack(cluster))).config


@pytest.mark.parametrize(("network", "cidrs"), [
    ({}, ["20.0.0.0/8"]),  # the largest single range the apiserver takes
    ({}, ["20.0.0.0/9", "20.128.0.0/10", "20.1.2.0/24"]),  # pieces inside it count once
    ({"apiserverAllowedCidrs": ["20.0.0.0/9"]}, ["40.0.0.0/9"]),  # exactly a /8, across both fields
    ({"apiserverAllowedCidrs": ["203.0.113.0/24"]}, ["198.51.100.0/24", "20.0.0.0/10"]),
    ({}, ["10.0.0.0/8", "20.0.0.0/8"]),  # private space is not counted (it comes through your own peering)
])
def test_ranges_that_admit_at_most_a_slash_8_of_the_internet_together_pass(
        write_stack: StackWriter, network: dict[str, Any], cidrs: list[str]) -> None:
    config = _load(write_stack, network, {"network": "internet", "cidrs": cidrs})
    assert admitted([*config.network.apiserver_allowed_cidrs, *config.deployer.cidrs]) <= APISERVER_PUBLIC_ADDRESSES


@pytest.mark.parametrize("cidrs", [["0.0.0.0/1"], ["20.0.0.0/7"], ["20.0.0.0/8", "40.0.0.1/32"]])
def test_more_than_a_slash_8_of_the_internet_is_refused(write_stack: StackWriter, cidrs: list[str]) -> None:
    """The edge, and the /1 the rule passed until the independent trace (issue 37, round 2, finding 4)."""
    with pytest.raises(StackError) as refused:
        _load(write_stack, {}, {"network": "internet", "cidrs": cidrs})
    [problem] = refused.value.problems
    assert problem.loc == ("deployer", "cidrs") and "more than a /8" in problem.message


def test_the_world_in_pieces_passes_when_the_stack_acknowledges_it(write_stack: StackWriter) -> None:
    config = _load(write_stack, {"acknowledgeWorldOpenAccess": True},
                   {"network": "internet", "cidrs": ["0.0.0.0/1", "128.0.0.0/1"]})
    assert admitted(list(config.deployer.cidrs)) > 2**31  # every internet address: private space is not counted


# (A range next to a reserved one, 169.255.0.0/16 or 126.0.0.0/8, is public space now refused as
# such: tests/config/hostile/trace-service-cidr-*.)
@pytest.mark.parametrize("service", [
    "100.64.0.0/16",  # shared address space (RFC 6598) is a range of one's own
    "100.64.0.0/12",  # the widest kube-apiserver takes
    "172.16.0.0/12",
    "10.1.0.0/16",  # next to the VNet (10.0.0.0/16)
    "192.168.255.240/28",  # the narrowest that holds cluster DNS's .10
])
def test_a_private_service_range_the_apiserver_takes_passes(write_stack: StackWriter, service: str) -> None:
    assert str(_load(write_stack, {"serviceCidr": service}).network.service_cidr) == service


def test_the_plan_takes_its_service_addresses_at_the_offsets_the_check_holds(write_stack: StackWriter) -> None:
    cluster = shipped_cluster_value("local")
    cluster["network"]["serviceCidr"] = "192.168.255.240/28"
    stack = load_stack(str(write_stack(cluster)))
    plan = resolve(stack.config, stack.sysctl_profile).control_plane
    assert plan.kubernetes_service_ip == IPv4Address("192.168.255.241") == (
        plan.service_cidr.network_address + KUBERNETES_SERVICE_OFFSET)
    assert plan.cluster_dns_ip == IPv4Address("192.168.255.250") == (
        plan.service_cidr.network_address + CLUSTER_DNS_OFFSET)
    assert plan.cluster_dns_ip in plan.service_cidr


def test_a_vnet_and_a_peered_runner_in_ranges_of_their_own_pass(write_stack: StackWriter) -> None:
    config = _load(write_stack, {"vnetCidr": "100.64.0.0/16", "controlPlaneSubnet": "100.64.0.0/24",
                                 "etcdSubnet": "100.64.1.0/24"},
                   {"network": "peered", "vnetId": RUNNER_VNET, "cidrs": ["192.168.0.0/24"]}, "100.64.2.0/27")
    assert config.network.vnet_cidr == IPv4Network("100.64.0.0/16")


def test_the_addresses_the_nodes_protect_lie_in_reserved_ranges() -> None:
    """The plan's metadata block drops pods' traffic to these (kilonode.plan.wellknown): no range the
    stack owns may cover them, so the catalogue's ranges must."""
    ranges = [row.range for row in addresses().reserved]
    for address in (AZURE_IMDS_ADDRESS, AZURE_WIRESERVER_ADDRESS):
        assert any(IPv4Address(address) in r for r in ranges), address


@pytest.mark.parametrize(("network", "admin"), [
    ({"publicIpsOnControlPlane": True}, "203.0.113.0/24"),
    ({"publicIpsOnControlPlane": True}, "20.1.0.0/24"),  # the widest public range SSH takes
    ({}, "192.168.0.0/16"),  # an operator's VPN, outside the VNet
    ({}, "172.16.0.0/12"),
    ({}, "10.1.0.0/16"),  # next to the VNet (10.0.0.0/16)
    ({}, "100.64.0.0/10"),
    ({"acknowledgeWorldOpenAccess": True}, "128.0.0.0/1"),  # wide, acknowledged, and no VNet address in it
])
def test_an_admin_range_of_the_operators_own_passes(write_stack: StackWriter, network: dict[str, Any],
                                                    admin: str) -> None:
    """network.adminCidr: at most a /24 of the internet's addresses and none of the VNet's (the
    refusals are hostile files, tests/config/hostile/trace-admin-cidr-*)."""
    config = _load(write_stack, {**network, "adminCidr": admin})
    assert str(config.network.admin_cidr) == admin


@pytest.mark.parametrize("admin", ["20.1.0.0/23", "20.1.0.0/16"])
def test_an_admin_range_wider_than_a_slash_24_of_the_internet_is_refused(write_stack: StackWriter, admin: str) -> None:
    """A /16 passed until the independent trace (issue 37, round 2, finding 4)."""
    with pytest.raises(StackError) as refused:
        _load(write_stack, {"publicIpsOnControlPlane": True, "adminCidr": admin})
    [problem] = refused.value.problems
    assert problem.loc == ("network", "adminCidr") and "more than a /24" in problem.message
