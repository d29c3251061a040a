"""Network: resource group, VNet, subnets from the plan, and least-privilege NSGs.

Every subnet's NSG ends in an explicit deny-all at the lowest custom priority: Azure's
default rules allow all traffic from the VirtualNetwork tag (and from peered networks), so
"least privilege" needs the allows below and nothing else.

- etcd subnet: 2379 (client) only from the control-plane subnet and the etcd subnet (a
  rejoining member's etcd-join reads the member list from its peers), 2380 (peer) only from the
  etcd subnet, the metrics listener (2381) and the certificate-expiry metrics (9479) from the
  Prometheus pool's subnet only, SSH only from network.adminCidr.
- control-plane subnet: 6443 from the VNet, from the deployer's addresses (the stack's
  `deployer.cidrs`: the machine running `pulumi up`), from network.apiserverAllowedCidrs, and
  from Azure's load-balancer probe; the certificate-expiry metrics (9479), the GPU health
  controller's metrics (9482) and the scheduler's and controller manager's secure ports (10259,
  10257) from the Prometheus pool's subnet only; SSH only from network.adminCidr.

The monitoring ports: what Prometheus scrapes on these hosts, each unauthenticated but the two
secure ports (catalog/listeners.yaml), is admitted from the subnet of the pool the cluster's
Prometheus runs on (its pods have that subnet's addresses under Azure CNI) and from no other
pool; without a Prometheus of kilonode's, from nowhere. That subnet is the scraper's where the
pool is reserved (kilonode.plan.listeners: tainted, and the reserved-pools admission policy
keeps users' pods off it); preflight's `listeners` check says where it is not.

A `peered` deployer's VNet is peered with the cluster's both ways (a peering is connected only
once both sides exist: virtual-network-manage-peering.md), so its runner reaches the internal
load balancer; the deny-all below still admits nothing of it but 6443. Outbound, every NSG
denies the deployer's addresses (`deny-to-deployer`): the peering would otherwise let every pod
reach the machine that holds the admin credentials and the Pulumi state (Azure's default
AllowVnetOutBound covers peered spaces). The rest of the runner's VNet is the runner's NSGs' to
guard: docs/azure.md says so.
- pool subnets, all under ONE NSG: everything from the pool subnets (pod to pod, native pod
  IPs) and from the control-plane subnet (apiserver to kubelet, webhooks, and to aggregated API
  servers' pods: metrics-server on 10250, catalog/contracts.yaml metricsServer apiserver-reach); Azure's
  load-balancer health probes (Services of type LoadBalancer); SSH only from network.adminCidr.

Why one NSG for every pool subnet: cloud-provider-azure opens each LoadBalancer Service's
ports in exactly one NSG, the `securityGroupName` of its azure.json (v1.34.13
pkg/provider/azure.go l.438-444: one nsgRepo; pkg/provider/azure_loadbalancer.go
reconcileSecurityGroup writes every Service's rules there). With an NSG per pool, Services
would be reachable only on the nodes of the pool whose NSG it was given (rancher/rancher#17181).
AKS does the same: one NSG on all node pools. Restricting Services to one pool instead would
leave every other pool's nodes out of every load balancer. The pools' rules were the same
apart from their destination, so nothing is lost.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

import pulumi
from pulumi_azure_native import network, resources

from kilonode.azure.common import tags
from kilonode.plan.listeners import scraper_subnet
from kilonode.plan.model import ClusterPlan
from kilonode.plan.wellknown import (
    APISERVER_PORT,
    CERT_METRICS_PORT,
    CONTROLLER_MANAGER_PORT,
    ETCD_CLIENT_PORT,
    ETCD_METRICS_PORT,
    ETCD_PEER_PORT,
    GPU_HEALTH_CONTROLLER_METRICS_PORT,
    SCHEDULER_PORT,
    TEARDOWN_ARMED,
    TEARDOWN_TAG,
)

SSH_PORT = 22
# The lowest priority a custom rule may have; Azure's defaults (65000+) come after it.
DENY_ALL_PRIORITY = 4096
DEPLOYER_RULE = "allow-apiserver-from-deployer"
DEPLOYER_RULE_PRIORITY = 115
# A peered deployer: no host of the cluster opens a connection to it (issue 37, independent trace
# round 3, finding 1). The peering gives VNet access both ways, and Azure's default outbound rule
# (AllowVnetOutBound, 65000: the VirtualNetwork tag covers peered address spaces,
# network-security-groups-overview.md "Default security rules"; service-tags-overview.md) would let
# every pod (Azure CNI: pool-subnet addresses) reach the machine that holds the cluster's admin
# credentials, the Azure login that assigns roles and the Pulumi state. The runner's answers to
# its own connections (6443) pass: NSGs are stateful.
NO_DEPLOYER_RULE = "deny-to-deployer"
NO_DEPLOYER_PRIORITY = 100
# ... and the same deny on the pools' NICs, in an NSG of its own (NIC_NSG): the pools' subnet NSG
# is cloud-controller-manager's to write (Network Contributor: it adds Services' rules there), so
# root on a system node could take that identity's token and delete the rule there; no cluster
# identity holds a right on this one (kilonode.azure.identity scopes each to the pools' NSG and
# subnets). Azure applies both: a NIC's NSG after the subnet's for outbound flows
# (network-security-group-how-it-works.md), a flow passes only if both allow it. Inbound, this
# NSG admits everything: what reaches the pools stays the subnet NSG's to decide. (Independent
# trace of issue 37, round 5, finding 3.)
NIC_NSG = "pool-nics"
NIC_ALLOW_INBOUND_RULE = "allow-all-inbound-subnet-decides"
# ... and outbound, past the deployer's own addresses, no peered network at all: the cluster's VNet
# is allowed, then the VirtualNetwork tag (which covers every peered address space,
# service-tags-overview.md) denied. The stack's `deployer.cidrs` cannot be checked offline against
# the runner's VNet, and a narrow or wrong one would leave the runner reachable (independent trace
# of issue 37, round 8, finding 1); the one peering kilonode makes is the runner's. A peering of
# your own that pods must use needs its own allow here, above NIC_NO_PEERED_PRIORITY.
NIC_OWN_VNET_RULE = "allow-out-to-own-vnet"
NIC_OWN_VNET_PRIORITY = 110
NIC_NO_PEERED_RULE = "deny-out-to-peered-networks"
NIC_NO_PEERED_PRIORITY = 120
# Prometheus reads the GPU health taint controller's metrics on each apiserver VM
# (kilonode.render.gpu_metrics: plain HTTP, sync times and counts); only where GPU pools run it.
GPU_HEALTH_CONTROLLER_RULE = "allow-gpu-health-metrics-from-monitoring"
GPU_HEALTH_CONTROLLER_RULE_PRIORITY = 160
# The one NSG of every pool subnet (the module docstring says why one).
POOLS_NSG = "pools"
# kube-scheduler's and kube-controller-manager's secure ports, from the Prometheus pool's subnet
# alone (kilonode.render.control_plane binds them to each apiserver VM's address).
CONTROLLER_METRICS_RULE = "allow-controller-metrics-from-monitoring"
CONTROLLER_METRICS_PRIORITY = 140
# The unauthenticated metrics listeners (plain HTTP) of the etcd members and apiserver VMs, from
# the Prometheus pool's subnet alone.
ETCD_METRICS_RULE = "allow-etcd-metrics-from-monitoring"
CERT_METRICS_RULE = "allow-cert-metrics-from-monitoring"


@dataclass(frozen=True)
class NetworkArgs:
    plan: ClusterPlan


def _is_prefix(source: str) -> bool:
    """An IP address or CIDR, as opposed to a service tag such as `AzureLoadBalancer`."""
    try:
        ipaddress.ip_network(source, strict=False)
    except ValueError:
        return False
    return True


def _allow(name: str, priority: int, sources: list[str], destination: str | list[str], port: str | list[str],
           protocol: str = "Tcp") -> network.SecurityRuleArgs:
    """`port`: one port or range (destinationPortRange), or several (destinationPortRanges)."""
    # Azure takes a service tag only in the singular sourceAddressPrefix: in the plural
    # list it refuses the rule (SecurityRuleParameterContainsUnsupportedValue, "cannot
    # specify existing VIRTUALNETWORK, INTERNET, AZURELOADBALANCER, '*' or system tags").
    tagged = [s for s in sources if not _is_prefix(s)]
    if tagged and len(sources) > 1:
        raise ValueError(f"NSG rule {name}: a service tag ({tagged[0]}) must be the rule's only source")
    single = len(sources) == 1 and bool(tagged)
    return network.SecurityRuleArgs(
        name=name,
        priority=priority,
        direction="Inbound",
        access="Allow",
        protocol=protocol,
        source_address_prefix=sources[0] if single else None,
        source_address_prefixes=None if single else sources,
        source_port_range="*",
        destination_address_prefix=destination if isinstance(destination, str) else None,
        destination_address_prefixes=destination if isinstance(destination, list) else None,
        destination_port_range=port if isinstance(port, str) else None,
        destination_port_ranges=port if isinstance(port, list) else None,
    )


def _deny_all() -> network.SecurityRuleArgs:
    return network.SecurityRuleArgs(
        name="deny-all-inbound",
        priority=DENY_ALL_PRIORITY,
        direction="Inbound",
        access="Deny",
        protocol="*",
        source_address_prefix="*",
        source_port_range="*",
        destination_address_prefix="*",
        destination_port_range="*",
    )


def _no_deployer(plan: ClusterPlan) -> list[network.SecurityRuleArgs]:
    """The outbound deny to a peered deployer (NO_DEPLOYER_RULE), on every NSG; none otherwise
    (an internet deployer is reached, if at all, through the NAT gateway like the internet)."""
    deployer = plan.network.deployer
    if deployer is None or deployer.vnet_id is None:
        return []
    return [network.SecurityRuleArgs(
        name=NO_DEPLOYER_RULE, priority=NO_DEPLOYER_PRIORITY, direction="Outbound", access="Deny", protocol="*",
        source_address_prefix="*", source_port_range="*",
        destination_address_prefixes=[str(c) for c in deployer.cidrs], destination_port_range="*",
    )]


def _monitoring_rules(plan: ClusterPlan, subnet: str) -> list[network.SecurityRuleArgs]:
    """What the cluster's Prometheus scrapes on the hosts of `subnet` (the control plane's or the
    etcd members'), admitted from its pool's subnet alone; nothing without one."""
    monitoring = _monitoring_subnet(plan)
    if monitoring is None:
        return []
    if subnet == str(plan.network.etcd_subnet):
        return [_allow(ETCD_METRICS_RULE, 120, [monitoring], subnet, str(ETCD_METRICS_PORT)),
                _allow(CERT_METRICS_RULE, 130, [monitoring], subnet, str(CERT_METRICS_PORT))]
    rules = [
        _allow(CERT_METRICS_RULE, 130, [monitoring], subnet, str(CERT_METRICS_PORT)),
        # The scheduler's and controller manager's /metrics (TLS, authenticated and authorised by
        # the apiserver): only Prometheus needs them.
        _allow(CONTROLLER_METRICS_RULE, CONTROLLER_METRICS_PRIORITY, [monitoring], subnet,
               [str(CONTROLLER_MANAGER_PORT), str(SCHEDULER_PORT)]),
    ]
    if plan.gpu_pools:
        rules.append(_allow(GPU_HEALTH_CONTROLLER_RULE, GPU_HEALTH_CONTROLLER_RULE_PRIORITY, [monitoring], subnet,
                            str(GPU_HEALTH_CONTROLLER_METRICS_PORT)))
    return rules


def _nsg_rules(plan: ClusterPlan) -> dict[str, list[network.SecurityRuleArgs]]:
    """Each subnet's NSG rules (subnet key -> rules), as the module docstring lists them."""
    net = plan.network
    admin = [str(net.admin_cidr)] if net.admin_cidr else []
    control = str(net.control_plane_subnet)
    etcd = str(net.etcd_subnet)
    pools = [str(p.subnet) for p in plan.node_pools]

    def ssh(priority: int, destination: str | list[str]) -> list[network.SecurityRuleArgs]:
        return [_allow("allow-ssh-from-admin", priority, admin, destination, str(SSH_PORT))] if admin else []

    apiserver_rules = [
        _allow("allow-apiserver-from-vnet", 100, [str(net.vnet_cidr)], control, str(APISERVER_PORT)),
        # Azure's probe source; the deny-all below would otherwise hide it.
        _allow("allow-apiserver-probe", 110, ["AzureLoadBalancer"], control, str(APISERVER_PORT)),
    ]
    if net.deployer is not None:
        # The machine running `pulumi up`: its Kubernetes provider creates the objects without
        # which no node joins (kilonode.config.model.DeployerConfig).
        apiserver_rules.append(_allow(
            DEPLOYER_RULE, DEPLOYER_RULE_PRIORITY, [str(c) for c in net.deployer.cidrs], control,
            str(APISERVER_PORT),
        ))
    if net.apiserver_allowed_cidrs:
        apiserver_rules.append(_allow(
            "allow-apiserver-from-allowed-cidrs", 120, [str(c) for c in net.apiserver_allowed_cidrs],
            control, str(APISERVER_PORT),
        ))
    nsg_rules: dict[str, list[network.SecurityRuleArgs]] = {
        "control-plane": [*apiserver_rules, *_monitoring_rules(plan, control), *ssh(200, control), _deny_all(),
                          *_no_deployer(plan)],
        "etcd": [
            _allow("allow-etcd-client-from-apiservers", 100, [control], etcd, str(ETCD_CLIENT_PORT)),
            # a member that rejoins (etcd-join) asks its peers for the member list on their client
            # URLs: without this rule the documented self-rejoin never succeeds
            _allow("allow-etcd-client-from-etcd", 105, [etcd], etcd, str(ETCD_CLIENT_PORT)),
            _allow("allow-etcd-peer-from-etcd", 110, [etcd], etcd, str(ETCD_PEER_PORT)),
            # etcd's metrics listener (--listen-metrics-urls, plain HTTP, /metrics and /health:
            # no keys, no data) and the certificate expiry
            *_monitoring_rules(plan, etcd),
            *ssh(200, etcd),
            _deny_all(),
            *_no_deployer(plan),
        ],
    }
    nsg_rules[POOLS_NSG] = [
        _allow("allow-all-from-pools", 100, pools, pools, "*", protocol="*"),
        _allow("allow-all-from-control-plane", 110, [control], pools, "*", protocol="*"),
        # Load balancers' health probes come from the AzureLoadBalancer tag (168.63.129.16);
        # Azure's own allow for them (AllowAzureLoadBalancerInBound, 65001) comes after the
        # deny-all below, which would drop them and take every Service backend out of its
        # load balancer (network-security-groups-overview.md, "Default security rules";
        # service-tags-overview.md, AzureLoadBalancer).
        _allow("allow-load-balancer-probes", 120, ["AzureLoadBalancer"], pools, "*", protocol="*"),
        *ssh(200, pools),
        _deny_all(),
        *_no_deployer(plan),
    ]
    return nsg_rules


def _monitoring_subnet(plan: ClusterPlan) -> str | None:
    """The subnet of the pool the cluster's Prometheus runs on; None without one (the plan's
    prometheus: no pool can hold it), when no rule admits anything to the monitoring ports."""
    subnet = scraper_subnet(plan)
    return str(subnet) if subnet is not None else None


@dataclass(frozen=True)
class VnetRef:
    subscription: str
    resource_group: str
    name: str


def parse_vnet_id(vnet_id: str) -> VnetRef:
    """`/subscriptions/<s>/resourceGroups/<g>/providers/Microsoft.Network/virtualNetworks/<n>`
    (the shape kilonode.config.model.VNET_ID admits) -> its parts."""
    parts = vnet_id.strip("/").split("/")
    return VnetRef(subscription=parts[1], resource_group=parts[3], name=parts[7])


def _peering(logical: str, peering_name: str, resource_group: pulumi.Input[str], vnet_name: pulumi.Input[str],
             remote_vnet_id: pulumi.Input[str], opts: pulumi.ResourceOptions) -> network.VirtualNetworkPeering:
    """One side of a peering: VNet access on; forwarded traffic and gateway transit off (the
    deployer's VNet is a neighbour, not a route)."""
    return network.VirtualNetworkPeering(
        logical,
        virtual_network_peering_name=peering_name,
        resource_group_name=resource_group,
        virtual_network_name=vnet_name,
        remote_virtual_network=network.SubResourceArgs(id=remote_vnet_id),
        allow_virtual_network_access=True,
        allow_forwarded_traffic=False,
        allow_gateway_transit=False,
        use_remote_gateways=False,
        opts=opts,
    )


def _nsg_of(subnet_key: str) -> str:
    """The NSG a subnet is in: its own, or the pools' shared one."""
    return POOLS_NSG if subnet_key.startswith("pool-") else subnet_key


# The subnets whose machines write to a storage account that admits no other network: the etcd
# members' snapshots (kilonode.azure.backup). A `Microsoft.Storage` service endpoint makes their
# traffic to Storage in the region leave from the subnet's private addresses, which the account's
# virtual network rule admits (Azure Storage network security: virtual network rules). Turning it
# on closes the subnet's open connections to Storage once (they switch source address).
STORAGE_ENDPOINT_SUBNETS = ("etcd",)


def _service_endpoints(key: str, location: str) -> list[network.ServiceEndpointPropertiesFormatArgs] | None:
    if key not in STORAGE_ENDPOINT_SUBNETS:
        return None
    return [network.ServiceEndpointPropertiesFormatArgs(service="Microsoft.Storage", locations=[location])]


def _subnet_prefixes(plan: ClusterPlan) -> dict[str, str]:
    """Subnet key -> address prefix, in the order the subnets are created."""
    net = plan.network
    return {"control-plane": str(net.control_plane_subnet), "etcd": str(net.etcd_subnet)} | {
        f"pool-{p.name}": str(p.subnet) for p in plan.node_pools
    }


class Network(pulumi.ComponentResource):
    resource_group_name: pulumi.Output[str]
    resource_group_id: pulumi.Output[str]
    vnet_id: pulumi.Output[str]
    control_plane_subnet_id: pulumi.Output[str]
    etcd_subnet_id: pulumi.Output[str]
    pool_subnet_ids: dict[str, pulumi.Output[str]]
    nat_gateway_ids: dict[str, pulumi.Output[str]]
    vnet_name: pulumi.Output[str]
    # Azure names the cloud provider's config needs (azure.json): pool -> subnet, pool -> NSG (one, shared)
    pool_subnet_names: dict[str, pulumi.Output[str]]
    pool_nsg_names: dict[str, pulumi.Output[str]]
    pools_nsg_id: pulumi.Output[str]  # that one NSG: a scope of cloud-controller-manager's rights
    # a `peered` deployer's two peerings (none otherwise): the in-cluster layer waits for them
    deployer_peerings: list[network.VirtualNetworkPeering]
    # a `peered` deployer: the NSG on every pool NIC that denies it (NIC_NSG); None otherwise
    pool_nic_nsg_id: pulumi.Output[str] | None

    def __init__(self, name: str, args: NetworkArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("kilonode:azure:Network", name, None, opts)
        plan = args.plan
        net = plan.network
        child = pulumi.ResourceOptions(parent=self)
        location, resource_tags = plan.location, tags(plan.cluster, "network")

        # The resource group carries the cluster's name: one cluster, one group.
        # Protected: deleting a resource group deletes all it holds in Azure, whatever Pulumi knows of
        # (pulumi/pulumi-azure-native#2522), the etcd backup account and its snapshots included; and
        # `pulumi destroy --exclude-protected` then keeps it, with the backups (docs/operations.md).
        rg = resources.ResourceGroup(
            f"{name}-rg", resource_group_name=plan.cluster, location=location,
            opts=pulumi.ResourceOptions(parent=self, protect=True),
            # armed for `pulumi destroy`: the policy pack lets the etcd VMs go unprotected (wellknown)
            tags={**resource_tags, **({TEARDOWN_TAG: TEARDOWN_ARMED} if plan.teardown else {})},
        )
        vnet = network.VirtualNetwork(
            f"{name}-vnet",
            virtual_network_name=f"{name}-vnet",
            resource_group_name=rg.name,
            address_space=network.AddressSpaceArgs(address_prefixes=[str(net.vnet_cidr)]),
            opts=child,
            location=location,
            tags=resource_tags,
        )
        # before any gateway: a rule Azure would refuse fails the run here (_allow)
        nsg_rules = _nsg_rules(plan)
        nat_of = self._nat_gateways(name, plan, rg)
        subnets = self._subnets(name, plan, rg, vnet, nsg_rules, nat_of)
        subnet_ids = {key: subnet.id for key, (subnet, _) in subnets.items()}
        self.deployer_peerings = self._peer_deployer(name, plan, rg, vnet, [s for s, _ in subnets.values()])
        self.pool_nic_nsg_id = self._nic_nsg(name, plan, rg)

        self.resource_group_name = rg.name
        self.resource_group_id = rg.id
        self.vnet_id = vnet.id
        self.control_plane_subnet_id = subnet_ids["control-plane"]
        self.etcd_subnet_id = subnet_ids["etcd"]
        self.pool_subnet_ids = {p.name: subnet_ids[f"pool-{p.name}"] for p in plan.node_pools}
        self.vnet_name = vnet.name
        self.pool_subnet_names = {p.name: subnets[f"pool-{p.name}"][0].name for p in plan.node_pools}
        self.pool_nsg_names = {p.name: subnets[f"pool-{p.name}"][1].name for p in plan.node_pools}
        self.pools_nsg_id = subnets[f"pool-{plan.node_pools[0].name}"][1].id
        self.register_outputs({
            "resourceGroupName": self.resource_group_name,
            "vnetId": self.vnet_id,
            "subnetIds": subnet_ids,
        })

    def _nic_nsg(self, name: str, plan: ClusterPlan, rg: resources.ResourceGroup) -> pulumi.Output[str] | None:
        """NIC_NSG, for a `peered` deployer: every inbound flow left to the subnet NSG, every outbound
        flow to the deployer refused, and to any peered network (NIC_NO_PEERED_RULE)."""
        deny = _no_deployer(plan)
        if not deny:
            return None
        allow = network.SecurityRuleArgs(
            name=NIC_ALLOW_INBOUND_RULE, priority=100, direction="Inbound", access="Allow", protocol="*",
            source_address_prefix="*", source_port_range="*", destination_address_prefix="*",
            destination_port_range="*")
        own, peered = (network.SecurityRuleArgs(
            name=rule, priority=priority, direction="Outbound", access=access, protocol="*",
            source_address_prefix="*", source_port_range="*", destination_address_prefix=destination,
            destination_port_range="*") for rule, priority, access, destination in (
                (NIC_OWN_VNET_RULE, NIC_OWN_VNET_PRIORITY, "Allow", str(plan.network.vnet_cidr)),
                (NIC_NO_PEERED_RULE, NIC_NO_PEERED_PRIORITY, "Deny", "VirtualNetwork")))
        nsg = network.NetworkSecurityGroup(
            f"{name}-{NIC_NSG}-nsg", network_security_group_name=f"{name}-{NIC_NSG}-nsg", resource_group_name=rg.name,
            location=plan.location, security_rules=[allow, *deny, own, peered], tags=tags(plan.cluster, "network"),
            opts=pulumi.ResourceOptions(parent=self))
        return nsg.id

    def _peer_deployer(self, name: str, plan: ClusterPlan, rg: resources.ResourceGroup,
                       vnet: network.VirtualNetwork, after: list[network.Subnet],
                       ) -> list[network.VirtualNetworkPeering]:
        """A `peered` deployer's VNet and the cluster's, peered both ways: the runner then reaches
        the internal load balancer (Standard load balancers answer across peerings). Forwarded
        traffic and gateway transit stay off: the runner's VNet is a neighbour, not a route."""
        deployer = plan.network.deployer
        if deployer is None or deployer.vnet_id is None:
            return []
        remote = parse_vnet_id(deployer.vnet_id)
        # Azure runs one operation per VNet at a time: after the subnets (AnotherOperationInProgress).
        opts = pulumi.ResourceOptions(parent=self, depends_on=list(after))
        to_runner = _peering(f"{name}-to-deployer", f"{plan.cluster}-to-deployer", rg.name, vnet.name,
                             deployer.vnet_id, opts)
        from_runner = _peering(f"{name}-from-deployer", f"to-{plan.cluster}", remote.resource_group, remote.name,
                               vnet.id, pulumi.ResourceOptions(parent=self, depends_on=[to_runner]))
        return [to_runner, from_runner]

    def _nat_gateways(self, name: str, plan: ClusterPlan,
                      rg: resources.ResourceGroup) -> dict[str, network.NatGateway]:
        """Outbound: each gateway's public IP prefix (Standard, IPv4) sized by the plan; a
        subnet leaves through its gateway only (default outbound access is off, _subnets).
        Returns subnet key -> its gateway; sets self.nat_gateway_ids."""
        child = pulumi.ResourceOptions(parent=self)
        location, resource_tags = plan.location, tags(plan.cluster, "network")
        nat_of: dict[str, network.NatGateway] = {}
        self.nat_gateway_ids = {}
        for gateway in plan.network.nat_gateways:
            ips = network.PublicIPPrefix(
                f"{name}-{gateway.name}-nat-ips",
                public_ip_prefix_name=f"{name}-{gateway.name}-nat-ips",
                resource_group_name=rg.name,
                prefix_length=gateway.prefix_length,
                public_ip_address_version="IPv4",
                sku=network.PublicIPPrefixSkuArgs(name="Standard", tier="Regional"),
                opts=child,
                location=location,
                tags=resource_tags,
            )
            nat = network.NatGateway(
                f"{name}-{gateway.name}-nat",
                nat_gateway_name=f"{name}-{gateway.name}-nat",
                resource_group_name=rg.name,
                sku=network.NatGatewaySkuArgs(name="Standard"),
                public_ip_prefixes=[network.SubResourceArgs(id=ips.id)],
                # Azure's default and minimum: idle flows give their SNAT port back soonest.
                idle_timeout_in_minutes=4,
                opts=child,
                location=location,
                tags=resource_tags,
            )
            self.nat_gateway_ids[gateway.name] = nat.id
            for subnet_key in gateway.subnets:
                nat_of[subnet_key] = nat
        return nat_of

    def _subnets(self, name: str, plan: ClusterPlan, rg: resources.ResourceGroup, vnet: network.VirtualNetwork,
                 nsg_rules: dict[str, list[network.SecurityRuleArgs]], nat_of: dict[str, network.NatGateway],
                 ) -> dict[str, tuple[network.Subnet, network.NetworkSecurityGroup]]:
        """Each subnet with its NSG: subnet key -> (subnet, NSG)."""
        child = pulumi.ResourceOptions(parent=self)
        location, resource_tags = plan.location, tags(plan.cluster, "network")
        subnets: dict[str, tuple[network.Subnet, network.NetworkSecurityGroup]] = {}
        previous: network.Subnet | None = None
        nsgs = {
            key: network.NetworkSecurityGroup(
                f"{name}-{key}-nsg",
                network_security_group_name=f"{name}-{key}-nsg",
                resource_group_name=rg.name,
                security_rules=rules,
                opts=child,
                location=location,
                tags=resource_tags,
            )
            for key, rules in nsg_rules.items()
        }
        for key, prefix in _subnet_prefixes(plan).items():
            nsg = nsgs[_nsg_of(key)]
            # Azure runs one subnet operation per VNet at a time; chaining the subnets
            # avoids "AnotherOperationInProgress" failures on the first `pulumi up`.
            subnet = network.Subnet(
                f"{name}-{key}",
                subnet_name=key,
                resource_group_name=rg.name,
                virtual_network_name=vnet.name,
                address_prefix=prefix,
                network_security_group=network.NetworkSecurityGroupArgs(id=nsg.id),
                nat_gateway=network.SubResourceArgs(id=nat_of[key].id),
                # Azure retires implicit outbound access for new subnets: only the NAT leads out.
                default_outbound_access=False,
                service_endpoints=_service_endpoints(key, location),
                opts=pulumi.ResourceOptions(parent=self, depends_on=[previous] if previous else None),
            )
            subnets[key] = (subnet, nsg)
            previous = subnet
        return subnets
