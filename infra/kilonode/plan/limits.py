"""Every platform limit the planner checks, in one place, with its source.

Re-check a figure against its source before tightening an error built on it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Limit:
    value: int
    source: str


# Azure networking limits page: private IP addresses per virtual network.
VNET_PRIVATE_IPS = Limit(65_536, "Azure networking limits: private IPs per virtual network")
# Azure networking limits page: private IP configurations per network interface.
IP_CONFIGS_PER_NIC = Limit(256, "Azure networking limits: private IP configurations per NIC")
# Azure networking limits page: subnets per virtual network.
SUBNETS_PER_VNET = Limit(3_000, "Azure networking limits: subnets per virtual network")
# Azure reserves the first four and the last address of every subnet.
AZURE_RESERVED_PER_SUBNET = Limit(5, "Azure VNet FAQ: 5 reserved addresses per subnet")
# VMSS placement-groups doc: singlePlacementGroup=false with a gallery image.
VMS_PER_SCALE_SET = Limit(1_000, "VMSS placement groups: VMs per scale set (gallery image)")
# VMSS placement-groups doc: singlePlacementGroup=true, which InfiniBand needs.
VMS_PER_PLACEMENT_GROUP = Limit(100, "VMSS placement groups: VMs per single placement group")
# Azure VMSS osProfile.computerNamePrefix: 1-58 characters for Linux; the shard name is
# both the scale set's name and its hostname prefix.
SCALE_SET_NAME_PREFIX = Limit(58, "Azure VMSS: computerNamePrefix length on Linux")
# Azure Compute Gallery doc: one replica per 20 VMs created at once, at most 100.
VMS_PER_GALLERY_REPLICA = Limit(20, "Azure Compute Gallery: 1 replica per 20 concurrent VM creates")
GALLERY_REPLICAS_MAX = Limit(100, "Azure Compute Gallery: replicas per image version")
# Azure NAT gateway (NAT gateway resource doc; networking limits): at most 16 public IP
# addresses (single IPs and prefixes together) per gateway, 64,512 SNAT ports per IP, and
# at most one gateway per subnet.
NAT_IPS_PER_GATEWAY = Limit(16, "Azure NAT gateway: public IP addresses per gateway")
SNAT_PORTS_PER_IP = Limit(64_512, "Azure NAT gateway: SNAT ports per public IP address")
# Azure public IP prefixes for a NAT gateway: IPv4 /28 (16 addresses) to /31 (2).
NAT_PREFIX_LENGTHS = (31, 30, 29, 28)
# Kubernetes "Considerations for large clusters": supported, not hard, limits.
K8S_NODES = Limit(5_000, "Kubernetes large-cluster guidance: nodes per cluster")
K8S_PODS = Limit(150_000, "Kubernetes large-cluster guidance: pods per cluster")
K8S_PODS_PER_NODE = Limit(110, "Kubernetes large-cluster guidance: pods per node")

# Static addresses inside the planned subnets (offsets from the network address; Azure's
# reserved .0-.3 come first). Fixed so that a member keeps its IP across plan changes.
LB_FRONTEND_OFFSET = 4
APISERVER_FIRST_OFFSET = 10
ETCD_MAIN_FIRST_OFFSET = 10
ETCD_EVENTS_FIRST_OFFSET = 20
CONTROL_SUBNET_PREFIX = 24
