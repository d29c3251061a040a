"""The pools' CNI configuration against its consumers: the CNI spec's network configuration
list, azure-container-networking's NetworkConfig/IPAM fields (cni/netconfig.go) and the CNI
plugins' portmap configuration (plugins/meta/portmap/main.go), read with the search tools."""

from __future__ import annotations

import json

import pytest

from kilonode.plan import ClusterPlan
from kilonode.render.cni import CONFLIST
from tests import shared

# azure-container-networking cni/netconfig.go: NetworkConfig's and IPAM's JSON names.
AZURE_VNET_FIELDS = {
    "cniVersion", "name", "type", "mode", "master", "adapterName", "bridge", "logLevel", "logTarget",
    "infraVnetAddressSpace", "ipv6Mode", "serviceCidrs", "vnetCidrs", "podNamespaceForDualNetwork",
    "ipsToRouteViaHost", "multiTenancy", "enableSnatOnHost", "enableExactMatchForPodName",
    "disableHairpinOnHostInterface", "disableIPTableLock", "disableAsyncDelete", "cnsurl", "executionMode", "ipam",
    "dns", "runtimeConfig", "windowsSettings", "AdditionalArgs", "wireServerIP",
}
AZURE_IPAM_FIELDS = {"mode", "type", "environment", "addressSpace", "subnet", "ipAddress", "queryInterval"}
# containernetworking/plugins plugins/meta/portmap: PortMapConf + types.NetConf.
PORTMAP_FIELDS = {
    "cniVersion", "name", "type", "capabilities", "ipam", "dns", "snat", "markMasqBit", "externalSetMarkChain",
    "conditionsV4", "conditionsV6", "masqAll", "backend", "runtimeConfig",
}
# CNI spec (SPEC.md, "Configuration format"): versions a 0.3.x-or-later list may declare.
CNI_SPEC_VERSIONS = {"0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"}


def conflists(plans: dict[str, ClusterPlan]) -> list[tuple[str, dict]]:
    found = []
    for stack, plan in plans.items():
        rendered = shared.rendered(stack)
        for pool in plan.node_pools:
            found.append((f"{stack}/pool-{pool.name}", json.loads(rendered[f"pool-{pool.name}"][CONFLIST].content)))
    return found


def spec_problems(conflist: dict) -> list[str]:
    problems = []
    if conflist.get("cniVersion") not in CNI_SPEC_VERSIONS:
        problems.append(f"cniVersion {conflist.get('cniVersion')!r}")
    if not isinstance(conflist.get("name"), str) or not conflist["name"]:
        problems.append("name")
    plugins = conflist.get("plugins")
    if not isinstance(plugins, list) or not plugins:
        return [*problems, "plugins: a non-empty list"]
    for plugin in plugins:
        if not isinstance(plugin.get("type"), str):
            problems.append(f"plugin without type: {plugin}")
        fields = {"azure-vnet": AZURE_VNET_FIELDS, "portmap": PORTMAP_FIELDS}.get(plugin.get("type"), set())
        problems += [f"{plugin.get('type')}.{key}" for key in plugin if key not in fields]
        if plugin.get("type") == "azure-vnet":
            problems += [f"azure-vnet.ipam.{key}" for key in plugin.get("ipam", {}) if key not in AZURE_IPAM_FIELDS]
    return problems


def test_every_pool_gets_an_azure_cni_conflist_its_plugins_read(plans: dict[str, ClusterPlan]) -> None:
    found = conflists(plans)
    # every pool of the shipped stacks, their system and monitoring pools included
    assert sorted(where for where, _ in found) == [
        "local/pool-cpu", "research-2500/pool-monitoring", "research-2500/pool-nc-a100", "research-2500/pool-system",
        "research-7500/pool-a100-ib", "research-7500/pool-h100-ib", "research-7500/pool-monitoring",
        "research-7500/pool-system"]
    for where, conflist in found:
        assert spec_problems(conflist) == [], where
        vnet, portmap = conflist["plugins"]
        assert (vnet["type"], vnet["mode"], vnet["ipam"]) == ("azure-vnet", "transparent", {"type": "azure-vnet-ipam"})
        assert portmap == {"type": "portmap", "capabilities": {"portMappings": True}, "snat": True}


@pytest.mark.parametrize(("mutate", "problem"), [
    (lambda c: c["plugins"][0].update(ipsToRouteViaHosts=["169.254.20.10"]), "azure-vnet.ipsToRouteViaHosts"),
    (lambda c: c["plugins"][0]["ipam"].update(queryIntervall="10s"), "azure-vnet.ipam.queryIntervall"),
    (lambda c: c.update(cniVersion="0.2.5"), "cniVersion '0.2.5'"),
])
def test_the_check_names_a_misspelt_field_and_a_wrong_version(plans: dict[str, ClusterPlan], mutate, problem) -> None:
    _, conflist = conflists(plans)[0]
    mutate(conflist)
    assert problem in spec_problems(conflist)


def test_the_conflist_names_the_plans_service_and_vnet_ranges(plans: dict[str, ClusterPlan]) -> None:
    plan = plans["research-7500"]
    conflist = json.loads(shared.rendered("research-7500")["pool-a100-ib"][CONFLIST].content)
    assert conflist["plugins"][0]["serviceCidrs"] == str(plan.control_plane.service_cidr)
    assert conflist["plugins"][0]["vnetCidrs"] == str(plan.network.vnet_cidr)
