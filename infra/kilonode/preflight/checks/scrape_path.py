"""scrape-path: the cluster's Prometheus reaches every control-plane target its configuration names.

The Prometheus pod runs on the pool the plan chose for it (kilonode.plan.resolve.monitoring) and,
with Azure CNI, has an address of that pool's subnet. Its configuration names fixed targets
outside the pools: the apiservers, the schedulers and controller managers beside them, the etcd
members' metrics listeners and every control-plane host's certificate-expiry socket. Traced
from the recorded graph:

1. the program's ConfigMap holds the prometheus.yml the pod runs, and its jobs' static targets;
2. each target's address lies in a subnet of the graph, and that subnet's NSG, and the NSG of a
   NIC holding the address, admit the whole Prometheus pool's subnet on the target's TCP port,
   evaluated as Azure does (kilonode.preflight.checks.deployer_path `admits`): every port it
   scrapes there but the apiservers' is admitted from that one subnet alone (kilonode.azure.network,
   the `-from-monitoring` rules), so a Prometheus moved to another pool, or a rule dropped, leaves
   them unreachable.

A refused target is a warning, not a break: the cluster comes up, but KilonodeScrapeTargetDown
fires for the target and every alert that reads it is blind. Targets found by Kubernetes
discovery (kubelets, kube-state-metrics, pod traffic) are inside the pools, whose one NSG admits
the pools (kilonode.azure.network allow-all-from-pools); they are not traced here.
"""

from __future__ import annotations

from collections.abc import Iterator
from ipaddress import IPv4Address, IPv4Network
from typing import Any

import yaml

from kilonode.plan import defaults
from kilonode.preflight.checks.deployer_path import NIC, NSG, SUBNET, NetworkGraph, admits
from kilonode.preflight.model import Finding, Inputs, Resource
from kilonode.yamlio import load_yaml

NAME = "scrape-path"
TITLE = "the cluster's Prometheus reaches every control-plane target it scrapes (NSGs)"

CONFIG_MAP = "kubernetes:core/v1:ConfigMap"


def check(inputs: Inputs) -> list[Finding]:
    prometheus = inputs.plan.prometheus
    if prometheus is None:
        return []  # no Prometheus of kilonode's: nothing scrapes (the plan warns)
    config = _prometheus_config(inputs)
    if config is None:
        return [Finding(
            NAME, "warn", "graph: Prometheus ConfigMap",
            f"the plan runs a Prometheus on pool {prometheus.pool}, but no ConfigMap in the recorded graph holds "
            f"its {defaults.PROMETHEUS_CONFIG_FILE}: which targets it scrapes is not known, nothing was traced",
            "record the graph again with this kilonode (`kilonode plan STACK --format json`)",
        )]
    [pool] = [p for p in inputs.plan.node_pools if p.name == prometheus.pool]
    source = IPv4Network(pool.subnet)
    graph = NetworkGraph(inputs)
    vnet = [inputs.plan.network.vnet_cidr]
    refused: dict[tuple[str, str, str], list[str]] = {}  # (job, NSG, rule) -> targets
    for job, address, port in _static_targets(config):
        for nsg in nsgs_of(graph, address):
            verdict, rule = admits(nsg.inputs.get("securityRules") or [], source, [address], port, vnet)
            if verdict != "allow":
                refused.setdefault((job, nsg.describe(), rule), []).append(f"{address}:{port}")
    return [Finding(
        NAME, "warn", f"{nsg} (job {job})",
        f"the Prometheus on pool {pool.name} ({source}) is refused by rule {rule} when it scrapes "
        f"{', '.join(targets)}: KilonodeScrapeTargetDown fires for each, and every alert reading job {job} is blind",
        f"admit {source} on {', '.join(sorted({t.rsplit(':', 1)[1] for t in targets}))}/TCP above every deny "
        "(kilonode.azure.network: the monitoring rules of the control-plane and etcd NSGs)",
    ) for (job, nsg, rule), targets in refused.items()]


def _prometheus_config(inputs: Inputs) -> dict[str, Any] | None:
    for r in inputs.of_type(CONFIG_MAP):
        text = (r.inputs.get("data") or {}).get(defaults.PROMETHEUS_CONFIG_FILE)
        if isinstance(text, str):
            try:
                value = load_yaml(text)
            except yaml.YAMLError:
                return None
            return value if isinstance(value, dict) else None
    return None


def _static_targets(config: dict[str, Any]) -> Iterator[tuple[str, IPv4Address, int]]:
    """(job, address, port) of every static target written as an IPv4 address and a port."""
    for job in config.get("scrape_configs") or []:
        for group in job.get("static_configs") or []:
            for target in group.get("targets") or []:
                host, _, port = str(target).rpartition(":")
                try:
                    yield str(job.get("job_name")), IPv4Address(host), int(port)
                except ValueError:
                    continue  # a name, not an address: nothing in the graph says where it is


def nsgs_of(graph: NetworkGraph, address: IPv4Address) -> list[Resource]:
    """The NSGs a flow to `address` passes: its subnet's, then its NIC's own (Azure applies both)."""
    found: list[Resource] = []
    for subnet in graph.of(SUBNET):
        prefix = subnet.inputs.get("addressPrefix")
        if prefix and address in IPv4Network(str(prefix)) and subnet.inputs.get("networkSecurityGroup"):
            nsg = graph.by_reference(NSG, subnet.inputs["networkSecurityGroup"], "networkSecurityGroupName")
            found += [nsg] if nsg else []
    for nic in graph.of(NIC):
        addresses = {str(c.get("privateIPAddress")) for c in nic.inputs.get("ipConfigurations") or []}
        if str(address) in addresses and nic.inputs.get("networkSecurityGroup"):
            nsg = graph.by_reference(NSG, nic.inputs["networkSecurityGroup"], "networkSecurityGroupName")
            found += [nsg] if nsg else []
    return found
