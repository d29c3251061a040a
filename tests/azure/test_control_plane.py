"""etcd and apiserver machines: separate clusters, protected etcd, an internal LB probing /readyz."""

from __future__ import annotations

import pytest

from kilonode.azure.graph import Graph
from kilonode.plan import ClusterPlan
from tests.azure.conftest import LB, NIC, VM, mock_id

STACKS = ["local", "research-2500", "research-7500"]


def vms_under(graph: Graph, parent: str) -> list[str]:
    return [r.inputs["vmName"] for r in graph.children(parent) if r.type == VM]


def test_research_7500_has_5_main_3_events_etcd_and_5_apiserver_vms(graph_7500: Graph) -> None:
    assert len(vms_under(graph_7500, "research-7500-etcd-main")) == 5
    assert len(vms_under(graph_7500, "research-7500-etcd-events")) == 3
    assert len(vms_under(graph_7500, "research-7500-apiserver")) == 5
    # the internal load balancer, and the public one of its internet deployer
    assert sorted(lb.name for lb in graph_7500.of_type(LB)) == ["research-7500-apiserver-lb",
                                                                 "research-7500-apiserver-public-lb"]


@pytest.mark.parametrize("stack", STACKS)
def test_main_and_events_members_are_different_vms(
    graphs: dict[str, Graph], plans: dict[str, ClusterPlan], stack: str
) -> None:
    graph, plan = graphs[stack], plans[stack]
    main = vms_under(graph, f"{plan.cluster}-etcd-main")
    events = vms_under(graph, f"{plan.cluster}-etcd-events")
    assert main == [m.vm_name for m in plan.etcd_main.members]
    assert events == [m.vm_name for m in plan.etcd_events.members]
    assert not set(main) & set(events)
    nic_ips = {
        r.parent: {c["privateIPAddress"] for c in r.inputs["ipConfigurations"]} for r in graph.of_type(NIC)
    }
    main_ips = set().union(*(ips for p, ips in nic_ips.items() if p == f"{plan.cluster}-etcd-main"))
    events_ips = set().union(*(ips for p, ips in nic_ips.items() if p == f"{plan.cluster}-etcd-events"))
    assert main_ips and events_ips and not main_ips & events_ips


@pytest.mark.parametrize("stack", STACKS)
def test_etcd_vms_are_protected(graphs: dict[str, Graph], plans: dict[str, ClusterPlan], stack: str) -> None:
    graph, plan = graphs[stack], plans[stack]
    for role in ("main", "events"):
        vms = [r for r in graph.children(f"{plan.cluster}-etcd-{role}") if r.type == VM]
        assert vms and all(vm.protect for vm in vms)


@pytest.mark.parametrize("stack", STACKS)
def test_etcd_members_sit_in_the_plans_zones_on_the_plans_size(
    graphs: dict[str, Graph], plans: dict[str, ClusterPlan], stack: str
) -> None:
    graph, plan = graphs[stack], plans[stack]
    for etcd in plan.etcd_clusters:
        for member in etcd.members:
            vm = graph.named(f"{plan.cluster}-etcd-{etcd.role}-{member.index}")
            assert vm.inputs["zones"] == [member.zone]
            assert vm.inputs["hardwareProfile"]["vmSize"] == etcd.vm_size


def test_apiserver_lb_is_internal_standard_and_probes_readyz_over_https_6443(
    graph_7500: Graph, plans: dict[str, ClusterPlan]
) -> None:
    plan = plans["research-7500"]
    lb = graph_7500.of_type(LB)[0].inputs
    assert lb["sku"]["name"] == "Standard"
    (front,) = lb["frontendIPConfigurations"]
    assert "publicIPAddress" not in front and front["privateIPAddress"] == str(plan.control_plane.load_balancer_ip)
    (probe,) = lb["probes"]
    assert (probe["protocol"], probe["port"], probe["requestPath"]) == ("Https", 6443, "/readyz")
    (rule,) = lb["loadBalancingRules"]
    assert (rule["frontendPort"], rule["backendPort"]) == (6443, 6443)
    assert rule["probe"]["id"].endswith("/probes/readyz")


def test_every_apiserver_nic_is_in_the_lb_backend_pool_and_no_etcd_nic_is(graph_7500: Graph) -> None:
    balancers = sorted(lb.name for lb in graph_7500.of_type(LB))
    for nic in graph_7500.of_type(NIC):
        pools = [p["id"] for c in nic.inputs["ipConfigurations"] for p in c.get("loadBalancerBackendAddressPools", [])]
        if nic.parent == "research-7500-apiserver":
            # one internal and one public pool: the most Azure allows a NIC's IP configuration
            assert sorted(pools) == [f"/subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/"
                                     f"research-7500/providers/Microsoft.Network/loadBalancers/{name}/"
                                     "backendAddressPools/apiservers" for name in balancers]
        else:
            assert pools == []


def test_vms_attach_the_nic_built_for_them(graph_7500: Graph) -> None:
    for vm in graph_7500.of_type(VM):
        (ref,) = vm.inputs["networkProfile"]["networkInterfaces"]
        assert ref["id"] == mock_id(graph_7500.named(f"{vm.name}-nic"))
