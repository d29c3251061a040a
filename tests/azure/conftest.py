"""The Pulumi program's resource graphs, recorded once per session under the mock engine."""

from __future__ import annotations

from ipaddress import IPv4Network
from pathlib import Path
from typing import Any

import pytest
import yaml

from kilonode.azure.graph import Graph, Recorded
from kilonode.config import load_stack
from tests.conftest import shipped_cluster_value
from tests.graphcache import recorded

SUBNET = "azure-native:network:Subnet"
NSG = "azure-native:network:NetworkSecurityGroup"
NIC = "azure-native:network:NetworkInterface"
VM = "azure-native:compute:VirtualMachine"
VMSS = "azure-native:compute:VirtualMachineScaleSet"
LB = "azure-native:network:LoadBalancer"
PUBLIC_IP = "azure-native:network:PublicIPAddress"

# An operator-facing variant of `local`: public IPs asked for, SSH and 6443 opened to
# documentation ranges (RFC 5737).
EXPOSED = {
    "network": {
        "publicIpsOnControlPlane": True,
        "adminCidr": "203.0.113.0/24",
        # not the shipped stacks' deployer range (198.51.100.0/24): each rule is seen apart
        "apiserverAllowedCidrs": ["192.0.2.0/24"],
    }
}


@pytest.fixture(scope="session")
def graph_7500(graphs: dict[str, Graph]) -> Graph:
    return graphs["research-7500"]


@pytest.fixture(scope="session")
def exposed_graph(tmp_path_factory: pytest.TempPathFactory) -> Graph:
    cluster = shipped_cluster_value("local") | EXPOSED
    path: Path = tmp_path_factory.mktemp("stacks") / "Pulumi.exposed.yaml"
    path.write_text(yaml.safe_dump({"config": {"kilonode:cluster": cluster}}, sort_keys=False))
    return recorded(load_stack(str(path)))


def mock_id(record: Recorded) -> str:
    """The ID RecordingMocks gives a resource; other resources refer to it by this."""
    return f"mock:{record.type}::{record.name}"


def subnets_by_id(graph: Graph) -> dict[str, tuple[str, IPv4Network]]:
    """mock ID -> (subnet name, prefix)."""
    return {
        mock_id(s): (s.inputs["subnetName"], IPv4Network(s.inputs["addressPrefix"])) for s in graph.of_type(SUBNET)
    }


def nsg_rules_for(graph: Graph, subnet_name: str) -> list[dict[str, Any]]:
    """The security rules of the NSG attached to the subnet named `subnet_name`."""
    subnet = next(s for s in graph.of_type(SUBNET) if s.inputs["subnetName"] == subnet_name)
    nsg_id = subnet.inputs["networkSecurityGroup"]["id"]
    nsg = next(n for n in graph.of_type(NSG) if mock_id(n) == nsg_id)
    return list(nsg.inputs["securityRules"])


def covers_port(rule: dict[str, Any], port: int) -> bool:
    ranges = [rule.get("destinationPortRange"), *list(rule.get("destinationPortRanges") or [])]
    for item in filter(None, ranges):
        if item == "*":
            return True
        low, _, high = str(item).partition("-")
        if int(low) <= port <= int(high or low):
            return True
    return False


def sources(rule: dict[str, Any]) -> list[str]:
    return [s for s in [rule.get("sourceAddressPrefix"), *list(rule.get("sourceAddressPrefixes") or [])] if s]
