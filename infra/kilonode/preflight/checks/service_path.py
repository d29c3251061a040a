"""service-path: a Service of type LoadBalancer reaches its pods on every pool.

cloud-provider-azure opens each LoadBalancer Service's ports in exactly one NSG, the
`securityGroupName` of its azure.json (v1.34.13 pkg/provider/azure.go: one NSG repository;
azure_loadbalancer.go reconcileSecurityGroup writes every Service's rules there). Traced from
the recorded graph:

1. the azure.json the cloud provider reads (its ConfigMap) names an NSG;
2. every pool subnet is in that NSG: a pool whose subnet has another one gets no Service rule,
   so Services never reach its nodes (rancher/rancher#17181);
3. that NSG admits Azure's health probes (the AzureLoadBalancer tag, 168.63.129.16) to the
   pool's nodes on a NodePort, evaluated as Azure does (kilonode.preflight.checks.deployer_path
   `admits`): an explicit deny-all above Azure's own AllowAzureLoadBalancerInBound (65001) drops
   them, and the load balancer marks every backend down.
"""

from __future__ import annotations

import json
from ipaddress import IPv4Network

from kilonode.preflight.checks.deployer_path import AZURE_PROBE_SOURCE, NSG, SUBNET, NetworkGraph, admits
from kilonode.preflight.model import Finding, Inputs

NAME = "service-path"
TITLE = "a LoadBalancer Service reaches every pool (the cloud provider's NSG, Azure's probes)"

CONFIG_MAP = "kubernetes:core/v1:ConfigMap"
CLOUD_CONFIG = "azure.json"
# Where a probe lands: a NodePort (the start of Kubernetes' default range, 30000-32767).
NODE_PORT = 30000


def check(inputs: Inputs) -> list[Finding]:
    config = _cloud_config(inputs)
    if config is None or not inputs.plan.node_pools:
        return []  # no cloud provider in this graph: no Service load balancers to trace
    graph = NetworkGraph(inputs)
    wanted = str(config.get("securityGroupName", ""))
    findings: list[Finding] = []
    for pool in inputs.plan.node_pools:
        subnet = next((s for s in graph.of(SUBNET) if s.inputs.get("addressPrefix") == str(pool.subnet)), None)
        reference = subnet.inputs.get("networkSecurityGroup") if subnet else None
        nsg = graph.by_reference(NSG, reference, "networkSecurityGroupName") if reference else None
        where = pool.role()
        name = str(nsg.inputs.get("networkSecurityGroupName", "")) if nsg else "none"
        if name != wanted:
            findings.append(Finding(
                NAME, "break", where,
                f"its subnet's NSG is {name}, but the cloud provider opens every LoadBalancer Service's ports only "
                f"in {wanted or 'no NSG'} (azure.json securityGroupName): Services never reach this pool's nodes",
                "put every pool subnet in the one NSG azure.json names (kilonode.azure.network: POOLS_NSG)",
            ))
            continue
        assert nsg is not None
        node = IPv4Network(pool.subnet).network_address + 4  # Azure keeps .0-.3: the first node's address
        verdict, rule = admits(nsg.inputs.get("securityRules") or [], AZURE_PROBE_SOURCE, [node], NODE_PORT,
                               [inputs.plan.network.vnet_cidr])
        if verdict != "allow":
            findings.append(Finding(
                NAME, "break", where,
                f"Azure's load-balancer health probes (AzureLoadBalancer, {AZURE_PROBE_SOURCE.network_address}) are "
                f"refused by {nsg.describe()} rule {rule}: every Service backend on this pool is marked down",
                "admit the AzureLoadBalancer tag above the deny-all (kilonode.azure.network: "
                "allow-load-balancer-probes)",
            ))
    return findings


def _cloud_config(inputs: Inputs) -> dict[str, object] | None:
    for r in inputs.of_type(CONFIG_MAP):
        text = (r.inputs.get("data") or {}).get(CLOUD_CONFIG)
        if isinstance(text, str):
            try:
                value = json.loads(text)
            except json.JSONDecodeError:
                return None
            return value if isinstance(value, dict) else None
    return None
