"""service-path: on the shipped stacks every pool's subnet is in the NSG the cloud provider
writes Service rules to, and Azure's probes pass it; each seeded break is named."""

from __future__ import annotations

from typing import Any

from kilonode.preflight import breaks, run
from tests.preflight.conftest import artefacts, inputs_of

CHECK = ["service-path"]


def found(stack: str, graph: dict[str, Any]) -> list[tuple[str, str]]:
    files, _ = artefacts(stack)
    return [(f.where, f.what) for f in breaks(run(inputs_of(stack, files=files, graph=graph), CHECK))]


def pools_nsg(graph: dict[str, Any]) -> dict[str, Any]:
    [nsg] = [r for r in graph["resources"] if r["type"] == "azure-native:network:NetworkSecurityGroup"
             and r["name"].endswith("-pools-nsg")]
    return nsg


def test_the_shipped_stacks_services_reach_every_pool(shipped: str) -> None:
    assert run(inputs_of(shipped), CHECK) == []


def test_a_pool_subnet_outside_the_cloud_providers_nsg_is_a_break() -> None:
    _, graph = artefacts("research-7500")
    # what kilonode did before: one NSG per pool, azure.json naming the first pool's
    own = {**pools_nsg(graph), "name": "research-7500-network-h100-ib-nsg"}
    own["inputs"] = {**own["inputs"], "networkSecurityGroupName": "research-7500-network-h100-ib-nsg"}
    graph["resources"].append(own)
    [subnet] = [r for r in graph["resources"] if r["type"] == "azure-native:network:Subnet"
                and r["inputs"]["subnetName"] == "pool-h100-ib"]
    subnet["inputs"]["networkSecurityGroup"] = {"id": f"mock:azure-native:network:NetworkSecurityGroup::{own['name']}"}
    [(where, what)] = found("research-7500", graph)
    assert where == "pool-h100-ib"
    assert "research-7500-network-h100-ib-nsg" in what and "Services never reach" in what


def test_a_deny_all_above_azures_probe_rule_is_a_break_on_every_pool() -> None:
    _, graph = artefacts("local")
    nsg = pools_nsg(graph)
    nsg["inputs"]["securityRules"] = [r for r in nsg["inputs"]["securityRules"]
                                      if r["name"] != "allow-load-balancer-probes"]
    [(where, what)] = found("local", graph)
    assert where == "pool-cpu"
    assert "refused by" in what and "rule deny-all-inbound" in what
