"""Native pod networking: Azure CNI's conflist in secondary-IP mode.

Each pool NIC carries one primary plus podsPerNode secondary IP configurations (the scale
set gives them, kilonode.azure.node_pool); `azure-vnet-ipam` reads those addresses from the
host's Azure metadata and hands one to each pod, and `azure-vnet` plugs the pod into the VNet
directly (no overlay, no encapsulation: the field notes' Flannel lesson). Transparent mode
routes each pod through its own host-side `azv*` interface (what kube-proxy's detectLocal
names; kilonode.plan.defaults) instead of a bridge.

Field names are those of azure-container-networking's cni/netconfig.go (NetworkConfig, IPAM)
and of the CNI plugins' portmap; the format is the CNI spec's network configuration list.
"""

from __future__ import annotations

import json
from typing import Any

from kilonode.plan.model import ClusterPlan, NodePoolPlan

CONFLIST = "etc/cni/net.d/10-azure.conflist"
def azure_conflist(plan: ClusterPlan, pool: NodePoolPlan) -> dict[str, Any]:
    del pool  # one configuration for every pool: the addresses come from each NIC
    # the catalogue's azureCni: upstream's own conflist declares it; the plugins accept it
    return {
        "cniVersion": plan.components.cni_version,
        "name": "azure",
        "plugins": [
            {
                "type": "azure-vnet",
                "mode": "transparent",
                # Service and VNet ranges: traffic to them never leaves through SNAT.
                "serviceCidrs": str(plan.control_plane.service_cidr),
                "vnetCidrs": str(plan.network.vnet_cidr),
                "ipam": {"type": "azure-vnet-ipam"},
            },
            {
                # hostPort support, as upstream's conflist chains it.
                "type": "portmap",
                "capabilities": {"portMappings": True},
                "snat": True,
            },
        ],
    }


def azure_conflist_text(plan: ClusterPlan, pool: NodePoolPlan) -> str:
    return json.dumps(azure_conflist(plan, pool), indent=2) + "\n"
