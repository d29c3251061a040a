"""deployer-path: the shipped stacks' deployer reaches the apiserver; each seeded break in the
chain (no deployer, no public frontend, an apiserver outside the pool, an NSG that refuses, a
kubeconfig naming the wrong endpoint, a missing peering side) is named under the check."""

from __future__ import annotations

import copy
from ipaddress import IPv4Address, IPv4Network
from typing import Any

import pytest

from kilonode.config import load_stack
from kilonode.plan import plan_stack
from kilonode.plan.model import ClusterPlan
from kilonode.preflight import breaks, run
from kilonode.preflight.checks.deployer_path import admits
from kilonode.preflight.load import from_parts
from tests.conftest import StackWriter, shipped_cluster_value
from tests.graphcache import recorded
from tests.preflight.conftest import artefacts, inputs_of

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

CHECK = ["deployer-path"]
RUNNER_VNET = ("/subscriptions/11111111-2222-3333-4444-555555555555/resourceGroups/ci-runners/providers/"
               "Microsoft.Network/virtualNetworks/runners")


def found(stack: str, graph: dict[str, Any], plan: ClusterPlan | None = None) -> list[tuple[str, str]]:
    files, _ = artefacts(stack)
    inputs = inputs_of(stack, files=files, graph=graph)
    if plan is not None:
        inputs = from_parts(plan, files, graph, source=stack)
    return [(f.where, f.what) for f in breaks(run(inputs, CHECK))]


def azure(graph: dict[str, Any], type_: str) -> list[dict[str, Any]]:
    return [r for r in graph["resources"] if r["type"] == f"azure-native:network:{type_}"]


def control_nsg(graph: dict[str, Any]) -> dict[str, Any]:
    [nsg] = [r for r in azure(graph, "NetworkSecurityGroup") if r["name"].endswith("-control-plane-nsg")]
    return nsg


def test_the_shipped_stacks_deployer_reaches_the_apiserver_and_their_placeholder_is_named(shipped: str) -> None:
    findings = run(inputs_of(shipped), CHECK)
    assert not breaks(findings)
    [warn] = findings  # the shipped stacks carry a documentation range until the user puts theirs
    assert warn.where == "stack: deployer.cidrs" and "RFC 5737" in warn.what


def test_a_stack_that_does_not_say_where_pulumi_up_runs_is_a_break() -> None:
    plan = inputs_of("research-7500").plan
    without = plan.model_copy(update={"network": plan.network.model_copy(update={"deployer": None})})
    _, graph = artefacts("research-7500")
    [(where, what)] = found("research-7500", graph, without)
    assert where == "stack: deployer"
    assert "no node joins" in what


def test_no_public_frontend_for_an_internet_deployer_is_a_break() -> None:
    _, graph = artefacts("research-7500")
    graph["resources"] = [r for r in graph["resources"] if not r["name"].endswith("-apiserver-public-lb")]
    [(where, what)] = found("research-7500", graph)
    assert where == "apiserver load balancers" and "public frontend" in what


def test_apiservers_left_out_of_the_public_pool_are_a_break() -> None:
    _, graph = artefacts("local")
    nic = next(r for r in azure(graph, "NetworkInterface") if "apiserver-0" in r["name"])
    for config in nic["inputs"]["ipConfigurations"]:
        config["loadBalancerBackendAddressPools"] = [
            p for p in config["loadBalancerBackendAddressPools"] if "-public-lb/" not in p["id"]
        ]
    [(where, what)] = found("local", graph)
    assert where.endswith("-apiserver-public-lb") and "not in the backend pool" in what


def test_a_public_rule_without_its_probe_is_a_break() -> None:
    _, graph = artefacts("local")
    [lb] = [r for r in azure(graph, "LoadBalancer") if r["name"].endswith("-apiserver-public-lb")]
    del lb["inputs"]["loadBalancingRules"][0]["probe"]
    [(_, what)] = found("local", graph)
    assert "no health probe" in what


def test_an_nsg_without_the_deployer_rule_refuses_it_at_the_deny_all() -> None:
    _, graph = artefacts("research-2500")
    nsg = control_nsg(graph)
    nsg["inputs"]["securityRules"] = [r for r in nsg["inputs"]["securityRules"]
                                      if r["name"] != "allow-apiserver-from-deployer"]
    [(where, what)] = found("research-2500", graph)
    assert where == f"azure-native:network:NetworkSecurityGroup {nsg['name']}"
    assert "198.51.100.0/24 (the deployer) is refused on TCP 6443 by rule deny-all-inbound" in what


def test_a_deny_above_the_deployer_rule_for_part_of_its_range_is_a_break() -> None:
    _, graph = artefacts("research-2500")
    rules = control_nsg(graph)["inputs"]["securityRules"]
    rules.append({"name": "deny-half", "priority": 101, "direction": "Inbound", "access": "Deny", "protocol": "Tcp",
                  "sourceAddressPrefixes": ["198.51.100.128/25"], "sourcePortRange": "*",
                  "destinationAddressPrefix": "*", "destinationPortRange": "6000-7000"})
    [(_, what)] = found("research-2500", graph)
    assert "by rule deny-half" in what


def test_a_kubeconfig_naming_the_internal_address_for_an_internet_deployer_is_a_break() -> None:
    _, graph = artefacts("research-7500")
    plan = inputs_of("research-7500").plan
    graph["outputs"]["deployerEndpoint"] = plan.control_plane.endpoint
    [(where, what)] = found("research-7500", graph)
    assert where == "graph: outputs.deployerEndpoint" and "inside the VNet" in what


def test_a_real_address_is_not_warned_about(write_stack: StackWriter) -> None:
    cluster = shipped_cluster_value("local")
    cluster["deployer"] = {"network": "internet", "cidrs": ["20.1.2.3/32"]}
    stack = load_stack(str(write_stack(cluster)))
    plan = plan_stack(stack)
    files, _ = artefacts("local")  # the render is not read by this check
    inputs = from_parts(plan, files, recorded(stack).to_json(), source="local with a real address")
    assert run(inputs, CHECK) == []


@pytest.fixture(scope="module")
def peered(tmp_path_factory: pytest.TempPathFactory) -> tuple[ClusterPlan, dict[str, Any]]:
    """The local stack with a runner in a peered VNet, recorded."""
    import yaml

    cluster = shipped_cluster_value("local")
    cluster["deployer"] = {"network": "peered", "vnetId": RUNNER_VNET, "cidrs": ["10.200.0.0/24"]}
    path = tmp_path_factory.mktemp("peered") / "Pulumi.local.yaml"
    path.write_text(yaml.safe_dump({"config": {"kilonode:cluster": cluster}}))
    stack = load_stack(str(path))
    return plan_stack(stack), recorded(stack).to_json()


def test_a_peered_deployer_gets_both_peerings_its_nsg_rule_and_the_internal_endpoint(
    peered: tuple[ClusterPlan, dict[str, Any]],
) -> None:
    plan, graph = peered
    peerings = azure(graph, "VirtualNetworkPeering")
    assert {p["inputs"]["resourceGroupName"] for p in peerings} == {"local", "ci-runners"}
    assert not [r for r in azure(graph, "LoadBalancer") if r["name"].endswith("-public-lb")]
    assert graph["outputs"]["deployerEndpoint"] == plan.control_plane.endpoint
    files, _ = artefacts("local")
    assert run(from_parts(plan, files, graph, source="peered"), CHECK) == []


def test_a_missing_side_of_the_peering_is_a_break(peered: tuple[ClusterPlan, dict[str, Any]]) -> None:
    plan, graph = peered
    graph = {**graph, "resources": [r for r in graph["resources"]
                                    if not (r["type"].endswith("VirtualNetworkPeering")
                                            and r["inputs"]["resourceGroupName"] == "ci-runners")]}
    files, _ = artefacts("local")
    [finding] = breaks(run(from_parts(plan, files, graph, source="peered"), CHECK))
    assert finding.where == "VNet peering" and "deployer -> cluster" in finding.what


TARGETS = [IPv4Address("10.0.0.10")]
VNET = [IPv4Network("10.0.0.0/16")]


def rule(name: str, priority: int, access: str, sources: list[str], port: str = "6443") -> dict[str, Any]:
    return {"name": name, "priority": priority, "direction": "Inbound", "access": access, "protocol": "Tcp",
            "sourceAddressPrefixes": sources, "destinationAddressPrefix": "10.0.0.0/24", "destinationPortRange": port}


@pytest.mark.parametrize(("rules", "expected"), [
    # nothing custom: Azure's defaults admit the VNet only
    ([], ("deny", "DenyAllInBound (Azure's default)")),
    # two allows that together cover the range
    ([rule("a", 100, "Allow", ["198.51.100.0/25"]), rule("b", 110, "Allow", ["198.51.100.128/25"])], ("allow", "b")),
    # an allow for another port does not count
    ([rule("a", 100, "Allow", ["198.51.100.0/24"], "22")], ("deny", "DenyAllInBound (Azure's default)")),
    # a port range that holds 6443 does
    ([rule("a", 100, "Allow", ["0.0.0.0/0"], "6000-7000")], ("allow", "a")),
    # priority, not list order, decides
    ([rule("allow", 200, "Allow", ["198.51.100.0/24"]), rule("deny", 150, "Deny", ["198.51.100.7/32"])],
     ("deny", "deny")),
])
def test_nsg_evaluation_follows_azure(rules: list[dict[str, Any]], expected: tuple[str, str]) -> None:
    assert admits(rules, IPv4Network("198.51.100.0/24"), TARGETS, 6443, VNET) == expected


def test_the_virtual_network_tag_admits_a_peered_range_by_default() -> None:
    peered_space = [*VNET, IPv4Network("10.200.0.0/24")]
    assert admits([], IPv4Network("10.200.0.0/24"), TARGETS, 6443, peered_space)[0] == "allow"


def _nsg(graph: dict[str, Any], suffix: str) -> dict[str, Any]:
    [found] = [r for r in azure(graph, "NetworkSecurityGroup") if r["name"].endswith(suffix)]
    return found


def test_no_host_of_the_cluster_reaches_a_peered_deployer(peered: tuple[ClusterPlan, dict[str, Any]]) -> None:
    """Issue 37, independent trace round 3, finding 1: the peering gives VNet access both ways, so
    without an outbound deny every pod reached the runner (admin credentials, the Pulumi state)."""
    _, graph = peered
    nsgs = azure(graph, "NetworkSecurityGroup")
    assert len(nsgs) == 4  # control plane, etcd, pools, and the pools' NICs' own (round 5, finding 3)
    for nsg in nsgs:
        [rule, *_] = sorted((r for r in nsg["inputs"]["securityRules"] if r["direction"] == "Outbound"),
                            key=lambda r: r["priority"])
        assert (rule["access"], rule["destinationAddressPrefixes"]) == ("Deny", ["10.200.0.0/24"])
    nic = _nsg(graph, "-pool-nics-nsg")
    # round 8, finding 1: deployer.cidrs cannot be checked offline against the runner's VNet, so the
    # NICs refuse every peered address, not only the declared ones; their own VNet stays open
    from kilonode.preflight.checks.deployer_path import _first_outbound
    outbound = [r for r in nic["inputs"]["securityRules"] if r["direction"] == "Outbound"]
    runner_vnet = IPv4Network("10.200.0.0/16")  # wider than the cidrs the stack declared
    space = [IPv4Network("10.0.0.0/16"), runner_vnet]
    assert _first_outbound(outbound, IPv4Network("10.200.9.0/24"), space)["name"] == "deny-out-to-peered-networks"
    assert _first_outbound(outbound, IPv4Network("10.0.2.0/27"), space)["name"] == "allow-out-to-own-vnet"
    configs = _scale_sets(graph)
    assert configs and all(c["networkSecurityGroup"]["id"].endswith(nic["name"]) for c in configs)


def _of(graph: dict[str, Any], type_: str) -> list[dict[str, Any]]:
    return [r for r in graph["resources"] if r["type"] == type_]


def _scale_sets(graph: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for vmss in _of(graph, "azure-native:compute:VirtualMachineScaleSet")
            for c in vmss["inputs"]["virtualMachineProfile"]["networkProfile"]["networkInterfaceConfigurations"]]


@pytest.mark.parametrize(("plant", "expected"), [
    (lambda g: [c.pop("networkSecurityGroup") for c in _scale_sets(g)], "carry no NSG of their own"),
    # the NICs on the pools' subnet NSG: cloud-controller-manager's identity is scoped to it
    (lambda g: [c.__setitem__("networkSecurityGroup", {"id": next(
        a["inputs"]["scope"] for a in _of(g, "azure-native:authorization:RoleAssignment")
        if str(a["inputs"]["scope"]).endswith("pools-nsg"))}) for c in _scale_sets(g)],
     "a role assignment of the graph is scoped to"),
    (lambda g: _nsg(g, "-pool-nics-nsg")["inputs"].__setitem__("securityRules", [
        r for r in _nsg(g, "-pool-nics-nsg")["inputs"]["securityRules"] if r["direction"] != "Outbound"]),
     "lets outbound flows reach 10.200.0.0/24"),
])
def test_a_deny_the_cloud_providers_identity_could_delete_is_a_break(
        peered: tuple[ClusterPlan, dict[str, Any]], plant: Any, expected: str) -> None:
    """Independent trace of issue 37, round 5, finding 3: the pools' subnet NSG is
    cloud-controller-manager's to write, so the deny must also sit on the NICs, in an NSG of its own."""
    plan, graph = peered
    graph = copy.deepcopy(graph)
    plant(graph)
    files, _ = artefacts("local")
    found = [f for f in breaks(run(from_parts(plan, files, graph, source="peered"), CHECK))
             if "VirtualMachineScaleSet" in f.where]
    assert found and all(expected in f.what for f in found), found


@pytest.mark.parametrize(("plant", "allowed_by"), [
    # the deny taken out: Azure's AllowVnetOutBound covers the peered space
    (lambda rules: [r for r in rules if r["direction"] != "Outbound"], "AllowVnetOutBound"),
    # an allow above it for part of the range
    (lambda rules: [*rules, {"name": "allow-out", "priority": 90, "direction": "Outbound", "access": "Allow",
                             "protocol": "*", "destinationAddressPrefix": "10.200.0.128/25",
                             "destinationPortRange": "*"}], "allow-out"),
])
def test_a_pool_nsg_that_lets_pods_reach_the_deployer_is_a_break(
        peered: tuple[ClusterPlan, dict[str, Any]], plant: Any, allowed_by: str) -> None:
    plan, graph = peered
    graph = copy.deepcopy(graph)
    nsg = _nsg(graph, "-pools-nsg")
    nsg["inputs"]["securityRules"] = plant(nsg["inputs"]["securityRules"])
    files, _ = artefacts("local")
    [finding] = breaks(run(from_parts(plan, files, graph, source="peered"), CHECK))
    assert "pools-nsg" in finding.where and allowed_by in finding.what and "10.200.0.0/24" in finding.what
