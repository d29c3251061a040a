"""Network rules: least-privilege NSGs, static IPs in their subnets, no public IPs unless asked."""

from __future__ import annotations

from ipaddress import IPv4Address, ip_network
from typing import Any

import pytest

from kilonode.azure import network
from kilonode.azure.graph import Graph
from kilonode.plan import ClusterPlan, wellknown
from tests.azure.conftest import (
    LB,
    NIC,
    NSG,
    PUBLIC_IP,
    SUBNET,
    covers_port,
    mock_id,
    nsg_rules_for,
    sources,
    subnets_by_id,
)

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

STACKS = ["local", "research-2500", "research-7500"]


def subnet_prefix(graph: Graph, name: str) -> str:
    return next(s.inputs["addressPrefix"] for s in graph.of_type(SUBNET) if s.inputs["subnetName"] == name)


@pytest.mark.parametrize("stack", STACKS)
def test_etcd_client_port_is_reachable_only_from_the_apiservers_and_the_members(graphs: dict[str, Graph],
                                                                              stack: str) -> None:
    # the members themselves: a rejoining member's etcd-join asks its peers on their client URLs
    graph = graphs[stack]
    control, etcd = subnet_prefix(graph, "control-plane"), subnet_prefix(graph, "etcd")
    rules = [r for r in nsg_rules_for(graph, "etcd") if r["access"] == "Allow" and covers_port(r, 2379)]
    assert rules, "no rule admits etcd clients at all"
    assert {s for r in rules for s in sources(r)} == {control, etcd}


@pytest.mark.parametrize("stack", STACKS)
def test_etcd_peer_port_is_reachable_only_from_the_etcd_subnet(graphs: dict[str, Graph], stack: str) -> None:
    graph = graphs[stack]
    etcd = subnet_prefix(graph, "etcd")
    rules = [r for r in nsg_rules_for(graph, "etcd") if r["access"] == "Allow" and covers_port(r, 2380)]
    assert rules
    assert {s for r in rules for s in sources(r)} == {etcd}


@pytest.mark.parametrize("stack", STACKS)
def test_every_subnet_nsg_ends_in_an_explicit_deny_all(graphs: dict[str, Graph], stack: str) -> None:
    # Azure's default AllowVnetInBound (65000) would otherwise admit the whole VNet anywhere.
    graph = graphs[stack]
    for subnet in graph.of_type(SUBNET):
        rules = nsg_rules_for(graph, subnet.inputs["subnetName"])
        last = max(rules, key=lambda r: r["priority"])
        assert last["access"] == "Deny" and sources(last) == ["*"] and last["destinationPortRange"] == "*"
        assert all(r["access"] == "Allow" for r in rules if r is not last)


@pytest.mark.parametrize("stack", STACKS)
def test_no_nsg_rule_admits_the_internet_or_any_source(graphs: dict[str, Graph], stack: str) -> None:
    graph = graphs[stack]
    for subnet in graph.of_type(SUBNET):
        for rule in nsg_rules_for(graph, subnet.inputs["subnetName"]):
            if rule["access"] == "Allow":
                assert not {"*", "Internet", "0.0.0.0/0", "VirtualNetwork"} & set(sources(rule)), rule


# Azure's rule (SecurityRuleParameterContainsUnsupportedValue): sourceAddressPrefixes and
# destinationAddressPrefixes "cannot specify existing VIRTUALNETWORK, INTERNET,
# AZURELOADBALANCER, '*' or system tags"; a tag or '*' goes alone in the singular field.
def _is_ip_or_cidr(value: str) -> bool:
    try:
        ip_network(value, strict=False)
    except ValueError:
        return False
    return True


@pytest.mark.parametrize("stack", STACKS)
def test_nsg_service_tags_and_wildcards_appear_only_in_the_singular_prefix_fields(
    graphs: dict[str, Graph], stack: str
) -> None:
    rules = [rule for subnet in graphs[stack].of_type(SUBNET)
             for rule in nsg_rules_for(graphs[stack], subnet.inputs["subnetName"])]
    for rule in rules:
        for field in ("sourceAddressPrefixes", "destinationAddressPrefixes"):
            listed = list(rule.get(field) or [])
            assert all(_is_ip_or_cidr(v) for v in listed), f"{rule['name']}.{field} = {listed}"
            singular = field[:-2] + "x"
            assert not (listed and rule.get(singular)), f"{rule['name']} sets both {singular} and {field}"
    probe = next(r for r in rules if r["name"] == "allow-apiserver-probe")
    assert probe.get("sourceAddressPrefix") == "AzureLoadBalancer" and not probe.get("sourceAddressPrefixes")


def test_a_service_tag_shared_with_other_sources_is_refused() -> None:
    from kilonode.azure.network import _allow

    with pytest.raises(ValueError, match="a service tag \\(AzureLoadBalancer\\) must be the rule's only source"):
        _allow("r", 100, ["10.0.0.0/16", "AzureLoadBalancer"], "10.0.1.0/24", "6443")


def test_apiserver_port_is_open_to_the_vnet_the_probe_and_configured_cidrs_only(
    graphs: dict[str, Graph], exposed_graph: Graph
) -> None:
    local = {s for r in nsg_rules_for(graphs["local"], "control-plane")
             if r["access"] == "Allow" and covers_port(r, 6443) for s in sources(r)}
    # the VNet, Azure's probe, and the stack's deployer (the machine running `pulumi up`)
    assert local == {"10.0.0.0/16", "AzureLoadBalancer", "198.51.100.0/24"}
    exposed = {s for r in nsg_rules_for(exposed_graph, "control-plane")
               if r["access"] == "Allow" and covers_port(r, 6443) for s in sources(r)}
    assert exposed == {"10.0.0.0/16", "AzureLoadBalancer", "198.51.100.0/24", "192.0.2.0/24"}


@pytest.mark.parametrize("stack", STACKS)
def test_the_schedulers_and_controller_managers_ports_admit_the_prometheus_pool_alone(
    graphs: dict[str, Graph], plans: dict[str, ClusterPlan], stack: str
) -> None:
    plan = plans[stack]
    assert plan.prometheus is not None
    [monitoring] = [str(p.subnet) for p in plan.node_pools if p.name == plan.prometheus.pool]
    rules = nsg_rules_for(graphs[stack], "control-plane")
    for port in (wellknown.SCHEDULER_PORT, wellknown.CONTROLLER_MANAGER_PORT):
        admitting = [r for r in rules if r["access"] == "Allow" and covers_port(r, port)]
        # the one rule, from the Prometheus pool's subnet: no other pool, not the VNet
        assert [r["name"] for r in admitting] == [network.CONTROLLER_METRICS_RULE], (stack, port)
        assert {s for r in admitting for s in sources(r)} == {monitoring}, (stack, port)
    [rule] = [r for r in rules if r["name"] == network.CONTROLLER_METRICS_RULE]
    # exactly the two ports (not the range between them), TCP, to the control-plane subnet, before the deny-all
    assert rule["destinationPortRanges"] == ["10257", "10259"] and "destinationPortRange" not in rule
    assert rule["protocol"] == "Tcp" and rule["destinationAddressPrefix"] == str(plan.network.control_plane_subnet)
    assert not covers_port(rule, 10258)
    # the rules keep their priorities; the metrics rules are named for the one subnet they admit
    # (a renamed rule is replaced within the NSG's one update)
    assert [(r["name"], r["priority"]) for r in rules] == [
        ("allow-apiserver-from-vnet", 100), ("allow-apiserver-probe", 110), ("allow-apiserver-from-deployer", 115),
        (network.CERT_METRICS_RULE, 130), (network.CONTROLLER_METRICS_RULE, 140),
        *([(network.GPU_HEALTH_CONTROLLER_RULE, network.GPU_HEALTH_CONTROLLER_RULE_PRIORITY)]
          if plan.gpu_pools else []),
        ("deny-all-inbound", 4096)]


# What Prometheus scrapes on the etcd members and apiserver VMs without authenticating anyone
# (catalog/listeners.yaml): etcd's metrics listener (plain HTTP), the certificate expiry and the
# GPU health controller's metrics (kilonode's socket units). Written here by hand, not read from
# the catalogue, so that a row moved there does not move this test with it.
UNAUTHENTICATED = {"etcd": (2381, 9479), "control-plane": (9479, 9482)}


@pytest.mark.parametrize("stack", STACKS)
def test_the_unauthenticated_metrics_ports_admit_the_prometheus_pool_alone(
    graphs: dict[str, Graph], plans: dict[str, ClusterPlan], stack: str
) -> None:
    plan = plans[stack]
    assert plan.prometheus is not None
    [monitoring] = [str(p.subnet) for p in plan.node_pools if p.name == plan.prometheus.pool]
    for subnet, ports in UNAUTHENTICATED.items():
        rules = nsg_rules_for(graphs[stack], subnet)
        for port in ports:
            if port == 9482 and not plan.gpu_pools:
                assert not [r for r in rules if r["access"] == "Allow" and covers_port(r, port)]
                continue
            admitting = [r for r in rules if r["access"] == "Allow" and covers_port(r, port)]
            # one rule, from the one subnet: no other pool, not the VNet (the metrics are plain HTTP)
            assert len(admitting) == 1 and sources(admitting[0]) == [monitoring], (stack, subnet, port, admitting)
            [deny] = [r for r in rules if r["access"] == "Deny"]
            assert admitting[0]["priority"] < deny["priority"] and deny["sourceAddressPrefix"] == "*"


def test_without_a_prometheus_nothing_is_admitted_to_the_monitoring_ports(plans: dict[str, ClusterPlan]) -> None:
    plan = plans["research-7500"].model_copy(update={"prometheus": None})
    rules = network._nsg_rules(plan)
    assert network.CONTROLLER_METRICS_RULE not in [r.name for r in rules["control-plane"]]
    assert not [r for r in rules["control-plane"] if r.access == "Allow" and r.destination_port_ranges]
    for subnet, ports in UNAUTHENTICATED.items():
        admitted = {r.destination_port_range for r in rules[subnet] if r.access == "Allow"}
        assert not admitted & {str(p) for p in ports}, subnet


def ssh_rules(graph: Graph) -> dict[str, list[dict[str, Any]]]:
    """Subnet name -> the allow rules that admit port 22 there."""
    return {
        s.inputs["subnetName"]: [
            r for r in nsg_rules_for(graph, s.inputs["subnetName"]) if r["access"] == "Allow" and covers_port(r, 22)
        ]
        for s in graph.of_type(SUBNET)
    }


def inside_the_cluster(graph: Graph) -> set[str]:
    """The cluster's subnets, and Azure's load-balancer probe source: the AzureLoadBalancer tag
    is the host's 168.63.129.16 and "only includes probe traffic" (service-tags-overview.md)."""
    return {str(prefix) for _, prefix in subnets_by_id(graph).values()} | {"AzureLoadBalancer"}


@pytest.mark.parametrize("stack", STACKS)
def test_without_an_admin_cidr_no_rule_admits_ssh_from_outside_the_cluster(
    graphs: dict[str, Graph], stack: str
) -> None:
    graph = graphs[stack]
    for subnet, rules in ssh_rules(graph).items():
        # Pool subnets admit every port from pools and the control plane (pod traffic);
        # etcd and control-plane subnets admit no SSH at all.
        assert all(r["destinationPortRange"] == "*" for r in rules), subnet
        assert {src for r in rules for src in sources(r)} <= inside_the_cluster(graph), subnet
        if not subnet.startswith("pool-"):
            assert rules == []


def test_ssh_is_allowed_only_from_the_admin_cidr(exposed_graph: Graph) -> None:
    for subnet, rules in ssh_rules(exposed_graph).items():
        ssh_only = [r for r in rules if r["destinationPortRange"] == "22"]
        assert [sources(r) for r in ssh_only] == [["203.0.113.0/24"]], subnet
        others = {src for r in rules if r not in ssh_only for src in sources(r)}
        assert others <= inside_the_cluster(exposed_graph), subnet


@pytest.mark.parametrize("stack", STACKS)
def test_every_static_ip_is_unique_and_inside_its_subnet(graphs: dict[str, Graph], stack: str) -> None:
    graph = graphs[stack]
    subnets = subnets_by_id(graph)
    seen: list[IPv4Address] = []
    configs = [c for nic in graph.of_type(NIC) for c in nic.inputs["ipConfigurations"]]
    # private frontends (the deployer's public frontend has an Azure-chosen public address)
    configs += [f for lb in graph.of_type(LB) for f in lb.inputs["frontendIPConfigurations"]
                if "publicIPAddress" not in f]
    for config in configs:
        assert config["privateIPAllocationMethod"] == "Static"
        ip = IPv4Address(config["privateIPAddress"])
        name, prefix = subnets[config["subnet"]["id"]]
        assert ip in prefix, f"{ip} outside {name} {prefix}"
        # Azure keeps the first four addresses and the last of every subnet.
        assert int(ip) - int(prefix.network_address) >= 4 and ip != prefix.broadcast_address
        seen.append(ip)
    assert len(seen) == len(set(seen))


@pytest.mark.parametrize("stack", STACKS)
def test_no_etcd_or_apiserver_vm_has_a_public_ip(graphs: dict[str, Graph], stack: str) -> None:
    graph = graphs[stack]
    # the one public address: the apiservers' public frontend, for the internet deployer
    [public] = graph.of_type(PUBLIC_IP)
    assert public.name == f"{graph.stack}-apiserver-public-ip"
    for nic in graph.of_type(NIC):
        assert all("publicIPAddress" not in c for c in nic.inputs["ipConfigurations"])


def test_public_ips_appear_on_the_control_plane_only_when_the_stack_asks(exposed_graph: Graph) -> None:
    vms = exposed_graph.count("azure-native:compute:VirtualMachine")
    assert exposed_graph.count(PUBLIC_IP) == vms + 1  # and the deployer's frontend
    for nic in exposed_graph.of_type(NIC):
        assert all("publicIPAddress" in c for c in nic.inputs["ipConfigurations"])


def test_subnets_are_the_plans_subnets(graphs: dict[str, Graph], plans: dict[str, ClusterPlan]) -> None:
    for stack in STACKS:
        plan = plans[stack]
        got = {name: str(prefix) for name, prefix in subnets_by_id(graphs[stack]).values()}
        want = {"control-plane": str(plan.network.control_plane_subnet), "etcd": str(plan.network.etcd_subnet)}
        want |= {f"pool-{p.name}": str(p.subnet) for p in plan.node_pools}
        assert got == want


NAT = "azure-native:network:NatGateway"
PREFIX = "azure-native:network:PublicIPPrefix"


@pytest.mark.parametrize("stack", STACKS)
def test_every_subnet_leaves_only_through_its_nat_gateway_sized_by_the_plan(
    graphs: dict[str, Graph], plans: dict[str, ClusterPlan], stack: str
) -> None:
    graph, plan = graphs[stack], plans[stack]
    nat_by_id = {f"mock:{NAT}::{r.name}": r.plain() for r in graph.of_type(NAT)}
    prefix_by_id = {f"mock:{PREFIX}::{r.name}": r.plain() for r in graph.of_type(PREFIX)}
    expected = {key: g for g in plan.network.nat_gateways for key in g.subnets}
    for subnet in graph.of_type(SUBNET):
        inputs = subnet.plain()
        assert inputs["defaultOutboundAccess"] is False, inputs["subnetName"]
        nat = nat_by_id[inputs["natGateway"]["id"]]
        gateway = expected[inputs["subnetName"]]
        assert nat["natGatewayName"] == f"{plan.cluster}-network-{gateway.name}-nat"
        (prefix_ref,) = nat["publicIpPrefixes"]
        prefix = prefix_by_id[prefix_ref["id"]]
        assert prefix["prefixLength"] == gateway.prefix_length and prefix["sku"]["name"] == "Standard"
    assert graph.count(NAT) == graph.count(PREFIX) == len(plan.network.nat_gateways)


@pytest.mark.parametrize("stack", STACKS)
def test_every_pool_subnet_is_in_the_one_nsg_the_cloud_provider_opens_service_ports_in(
    graphs: dict[str, Graph], stack: str
) -> None:
    graph = graphs[stack]
    pool_nsgs = {s.inputs["networkSecurityGroup"]["id"] for s in graph.of_type(SUBNET)
                 if s.inputs["subnetName"].startswith("pool-")}
    assert len(pool_nsgs) == 1
    (nsg_id,) = pool_nsgs
    nsg = next(n for n in graph.of_type(NSG) if mock_id(n) == nsg_id)
    # the cloud provider's azure.json (a ConfigMap) names that NSG
    named = f'"securityGroupName": "{nsg.inputs["networkSecurityGroupName"]}"'
    assert any(named in str(r.plain()) for r in graph.of_type("kubernetes:core/v1:ConfigMap"))


@pytest.mark.parametrize("stack", STACKS)
def test_load_balancer_probes_reach_the_pools_before_the_deny_all(graphs: dict[str, Graph], stack: str) -> None:
    names = [s.inputs["subnetName"] for s in graphs[stack].of_type(SUBNET)]
    pools = [name for name in names if name.startswith("pool-")]
    for subnet in pools:
        rules = sorted(nsg_rules_for(graphs[stack], subnet), key=lambda r: r["priority"])
        first = next(r for r in rules if {"AzureLoadBalancer", "*"} & set(sources(r)))
        assert first["access"] == "Allow" and first["destinationPortRange"] == "*", subnet
