"""deployer-path: the machine running `pulumi up` (the stack's `deployer`) reaches the apiserver
on 6443 through the graph's load balancers, NSGs and peerings.

The in-cluster layer (bootstrap token, RBAC, kube-proxy, CoreDNS, the cloud provider: without
them no node joins) is created through the apiserver by the machine running `pulumi up`, after
a readiness check that asks /readyz from there. The same run creates the VNet, so that machine
is outside it on a first run; the chain traced here, hop by hop, from the recorded graph:

1. the stack says where the deployer is (`deployer.network`, `deployer.cidrs`);
2. the endpoint the program's kubeconfig names (the graph's `deployerEndpoint` output) is the
   frontend that deployer can reach: a public frontend for `internet`, the internal load
   balancer for `peered`;
3. that frontend's load balancer has a rule for 6443 with a health probe, into a backend pool
   holding every apiserver's NIC (a public frontend: on a Standard public IP);
4. `peered`: the cluster's VNet and the deployer's are peered both ways with VNet access on
   (a peering is connected only once both sides exist: virtual-network-manage-peering.md);
5. every NSG on the way (the control-plane subnet's, a NIC's own) admits each deployer CIDR on
   TCP 6443 to the apiservers' addresses, evaluated as Azure does: rules by priority, the first
   match decides, then Azure's default rules (network-security-groups-overview.md, "Security
   rules", "Default security rules"; the VirtualNetwork tag covers peered address spaces,
   service-tags-overview.md). Behind a load balancer the NSG sees the backend's private address
   as destination (load-balancer-overview: Standard load balancers are "closed by default").

6. `peered`, the other way: no host of the cluster opens a connection to the deployer. Every NSG
   of the cluster's subnets must refuse outbound flows to each deployer CIDR before Azure's
   default AllowVnetOutBound, which covers the peered space: otherwise every pod (pool-subnet
   addresses under Azure CNI) reaches the machine holding the admin credentials and the Pulumi
   state (issue 37, independent trace round 3, finding 1). And every pool scale set's NICs carry
   an NSG of their own that refuses it too, which no role assignment of the graph is scoped to:
   the pools' subnet NSG is cloud-controller-manager's to write (round 5, finding 3).

What only Azure can show (said in docs/azure.md): the deployer's real egress address, a firewall
or proxy of its own network, an Azure Policy that forbids public IPs or peerings.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from ipaddress import IPv4Address, IPv4Network, ip_address, ip_network
from typing import Any
from urllib.parse import urlsplit

from kilonode.azure.deployer import DOCUMENTATION  # RFC 5737: `pulumi up` refuses them (deployer.py)
from kilonode.plan.model import ClusterPlan, DeployerPlan
from kilonode.plan.wellknown import APISERVER_PORT
from kilonode.preflight.model import Finding, Inputs, Resource

NAME = "deployer-path"
TITLE = "the machine running `pulumi up` reaches the apiserver (load balancers, NSGs, peerings)"

LOAD_BALANCER = "azure-native:network:LoadBalancer"
PUBLIC_IP = "azure-native:network:PublicIPAddress"
NIC = "azure-native:network:NetworkInterface"
SUBNET = "azure-native:network:Subnet"
NSG = "azure-native:network:NetworkSecurityGroup"
VNET = "azure-native:network:VirtualNetwork"
PEERING = "azure-native:network:VirtualNetworkPeering"

FIX_STACK = ("say in the stack where `pulumi up` runs: `deployer: {network: internet, cidrs: [<its egress "
             "addresses>]}` (a laptop, a hosted CI runner) or `deployer: {network: peered, vnetId: <its VNet>, "
             "cidrs: [<its subnet>]}`; docs/azure.md, \"How `pulumi up` reaches the apiserver\"")
# Azure's default inbound rules, after every custom one (network-security-groups-overview.md).
AZURE_DEFAULT_RULES: tuple[dict[str, Any], ...] = (
    {"name": "AllowVnetInBound (Azure's default)", "priority": 65000, "access": "Allow", "protocol": "*",
     "sourceAddressPrefix": "VirtualNetwork", "destinationAddressPrefix": "VirtualNetwork",
     "destinationPortRange": "*", "direction": "Inbound"},
    {"name": "AllowAzureLoadBalancerInBound (Azure's default)", "priority": 65001, "access": "Allow",
     "protocol": "*", "sourceAddressPrefix": "AzureLoadBalancer", "destinationAddressPrefix": "*",
     "destinationPortRange": "*", "direction": "Inbound"},
    {"name": "DenyAllInBound (Azure's default)", "priority": 65500, "access": "Deny", "protocol": "*",
     "sourceAddressPrefix": "*", "destinationAddressPrefix": "*", "destinationPortRange": "*",
     "direction": "Inbound"},
)
ANY = ("*", "any", "internet")
# The AzureLoadBalancer service tag: the host's virtual IP, where Azure's health probes come from
# (service-tags-overview.md, AzureLoadBalancer; what-is-ip-address-168-63-129-16.md).
AZURE_PROBE_SOURCE = IPv4Network("168.63.129.16/32")


def check(inputs: Inputs) -> list[Finding]:
    deployer = inputs.plan.network.deployer
    if deployer is None:
        return [Finding(
            NAME, "break", "stack: deployer",
            "the stack does not say where `pulumi up` runs. The run creates the VNet, and the apiservers' load "
            "balancer is internal: a laptop or hosted runner has no path to 6443, the readiness check fails "
            "after its deadline, and the bootstrap token, RBAC, kube-proxy, CoreDNS and the cloud provider are "
            "never created: no node joins",
            FIX_STACK,
        )]
    findings = _documentation_addresses(deployer)
    graph = NetworkGraph(inputs)
    for hop in (_endpoint, _load_balancer, _peerings, _nsgs):
        found = hop(inputs.plan, deployer, graph)
        findings += found
        if any(f.level == "break" for f in found):
            break  # the first break of the chain: what comes after it is not reached
    return findings + _outbound(inputs.plan, deployer, graph) + _nic_deny(inputs.plan, deployer, graph)


class NetworkGraph:
    """The recorded graph's network resources, and lookups by the IDs the program wired."""

    def __init__(self, inputs: Inputs) -> None:
        self.inputs = inputs
        self.outputs = inputs.outputs

    def of(self, type_: str) -> list[Resource]:
        return self.inputs.of_type(type_)

    def by_reference(self, type_: str, reference: object, name_input: str) -> Resource | None:
        """The resource an `{id: ...}` reference points at: a recorded ID names the logical
        resource (`mock:<type>::<logical name>`), an Azure ID its Azure name (last segment)."""
        ref = str(reference.get("id", "") if isinstance(reference, Mapping) else reference or "")
        logical = ref.rpartition("::")[2] if "::" in ref else None
        azure = ref.rstrip("/").rpartition("/")[2].lower()
        for r in self.of(type_):
            if r.name == logical or (logical is None and str(r.inputs.get(name_input, "")).lower() == azure):
                return r
        return None

    def apiserver_nics(self, plan: ClusterPlan) -> list[Resource]:
        addresses = {str(i.ip) for i in plan.control_plane.instances}
        return [r for r in self.of(NIC) if _nic_addresses(r) & addresses]


def _nic_addresses(nic: Resource) -> set[str]:
    return {str(c.get("privateIPAddress")) for c in nic.inputs.get("ipConfigurations") or []}


def _nic_pools(nic: Resource) -> set[str]:
    return {str(p.get("id", "")).lower() for c in nic.inputs.get("ipConfigurations") or []
            for p in c.get("loadBalancerBackendAddressPools") or []}


def _documentation_addresses(deployer: DeployerPlan) -> list[Finding]:
    placeholders = [str(c) for c in deployer.cidrs if any(c.subnet_of(d) for d in DOCUMENTATION)]
    if not placeholders:
        return []
    return [Finding(
        NAME, "warn", "stack: deployer.cidrs",
        f"{', '.join(placeholders)} is a documentation range (RFC 5737) that no real machine sends from: the "
        "path is proven for it, but the NSG will admit nobody",
        "replace it with the egress addresses of the machine that runs `pulumi up` as the internet sees them "
        "(a laptop: its network's NAT address; a hosted CI runner: its provider's published ranges, or a "
        "self-hosted runner behind a fixed NAT address)",
    )]


def _endpoint(plan: ClusterPlan, deployer: DeployerPlan, graph: NetworkGraph) -> list[Finding]:
    """Hop 2: the kubeconfig's server is a frontend this deployer can reach."""
    endpoint = graph.outputs.get("deployerEndpoint")
    if not isinstance(endpoint, str):
        return [Finding(NAME, "warn", "graph: outputs.deployerEndpoint",
                        "the recorded graph has no deployerEndpoint output: which endpoint the program's kubeconfig "
                        "names is not known, the rest of the path is still traced",
                        "record the graph again with this kilonode (`kilonode plan STACK --format json`)")]
    host = urlsplit(endpoint).hostname or ""
    try:
        address: IPv4Address | None = IPv4Address(host)
    except ValueError:
        address = None
    internal = str(plan.control_plane.load_balancer_ip)
    inside = address is not None and address in plan.network.vnet_cidr
    if deployer.public_frontend and (host == internal or inside):
        return [Finding(
            NAME, "break", "graph: outputs.deployerEndpoint",
            f"the program's kubeconfig names {endpoint}, an address inside the VNet, for a deployer on the "
            "internet: every request of the readiness check and of the Kubernetes provider goes nowhere",
            "the in-cluster layer must use the control plane's deployer_endpoint (kilonode.azure.control_plane), "
            "the public frontend's address",
        )]
    if not deployer.public_frontend and host != internal:
        return [Finding(
            NAME, "break", "graph: outputs.deployerEndpoint",
            f"the program's kubeconfig names {endpoint}; a peered deployer reaches only the internal load "
            f"balancer, {plan.control_plane.endpoint}",
            "use the internal endpoint for `deployer.network: peered`",
        )]
    return []


def _load_balancer(plan: ClusterPlan, deployer: DeployerPlan, graph: NetworkGraph) -> list[Finding]:
    """Hop 3: a load balancer whose frontend the deployer reaches forwards 6443 to every apiserver."""
    internal = str(plan.control_plane.load_balancer_ip)
    wanted = "public" if deployer.public_frontend else f"internal ({internal})"
    candidates = []
    for lb in graph.of(LOAD_BALANCER):
        for front in lb.inputs.get("frontendIPConfigurations") or []:
            public = front.get("publicIPAddress")
            if (deployer.public_frontend and public) or (not deployer.public_frontend
                                                         and front.get("privateIPAddress") == internal):
                candidates.append((lb, front))
    if not candidates:
        return [Finding(
            NAME, "break", "apiserver load balancers",
            f"no load balancer in the graph has the {wanted} frontend the deployer needs: nothing forwards its "
            f"requests to {APISERVER_PORT}",
            "an internet deployer needs the apiservers' public load balancer (kilonode.azure.control_plane "
            "creates it when the stack says `deployer.network: internet`)",
        )]
    problems: list[Finding] = []
    for lb, front in candidates:
        problems = _forwards(lb, front, graph, plan)
        if not problems:
            return []
    return problems


def _forwards(lb: Resource, front: Mapping[str, Any], graph: NetworkGraph, plan: ClusterPlan) -> list[Finding]:
    where = lb.describe()
    public = front.get("publicIPAddress")
    if public:
        ip = graph.by_reference(PUBLIC_IP, public, "publicIpAddressName")
        sku = ((ip.inputs.get("sku") or {}).get("name") if ip else None)
        if ip is None or sku != "Standard":
            return [Finding(NAME, "break", where,
                            f"frontend {front.get('name')} is not on a Standard public IP of the graph (found "
                            f"{sku or 'none'}): a Standard load balancer takes only Standard public IPs",
                            "give the frontend the apiservers' Standard, static public IP")]
    suffix = f"/frontendipconfigurations/{str(front.get('name', '')).lower()}"
    rules = [r for r in lb.inputs.get("loadBalancingRules") or []
             if str((r.get("frontendIPConfiguration") or {}).get("id", "")).lower().endswith(suffix)
             and r.get("frontendPort") == APISERVER_PORT and r.get("backendPort") == APISERVER_PORT]
    if not rules:
        return [Finding(NAME, "break", where,
                        f"no load-balancing rule forwards {APISERVER_PORT} from frontend {front.get('name')}: the "
                        "deployer's connections are dropped at the frontend",
                        f"add a Tcp rule {APISERVER_PORT} -> {APISERVER_PORT} into the apiservers' backend pool")]
    rule = rules[0]
    if not rule.get("probe"):
        return [Finding(NAME, "break", where,
                        f"rule {rule.get('name')} has no health probe: the load balancer cannot tell a serving "
                        "apiserver from a booting one",
                        "give the rule the /readyz probe")]
    pool = str((rule.get("backendAddressPool") or {}).get("id", "")).lower()
    missing = [str(i.ip) for i in plan.control_plane.instances
               if not any(pool in _nic_pools(n) for n in graph.apiserver_nics(plan) if str(i.ip) in _nic_addresses(n))]
    if missing:
        return [Finding(NAME, "break", where,
                        f"the apiservers at {', '.join(missing)} are not in the backend pool of rule "
                        f"{rule.get('name')}: the frontend has no backend to send to",
                        "put every apiserver NIC's IP configuration in the pool (a NIC may be in one internal "
                        "and one public load balancer's pools)")]
    return []


def _peerings(plan: ClusterPlan, deployer: DeployerPlan, graph: NetworkGraph) -> list[Finding]:
    """Hop 4 (peered): both sides of the peering exist, with VNet access on."""
    if deployer.vnet_id is None:
        return []
    remote = deployer.vnet_id.lower()
    remote_name = remote.rstrip("/").rpartition("/")[2]
    vnets = graph.of(VNET)
    ours = {str(v.inputs.get("virtualNetworkName", "")).lower() for v in vnets}
    ours_refs = {f"::{v.name}" for v in vnets}
    outward = inward = False
    for p in graph.of(PEERING):
        target = str((p.inputs.get("remoteVirtualNetwork") or {}).get("id", "")).lower()
        local = str(p.inputs.get("virtualNetworkName", "")).lower()
        if not p.inputs.get("allowVirtualNetworkAccess", True):
            continue
        outward |= target == remote and local in ours
        inward |= local == remote_name and any(target.endswith(r.lower()) for r in ours_refs)
    if outward and inward:
        return []
    missing = [side for side, there in (("cluster -> deployer", outward), ("deployer -> cluster", inward)) if not there]
    return [Finding(
        NAME, "break", "VNet peering",
        f"the peering {' and '.join(missing)} is missing (or has VNet access off): a peering connects only once "
        f"both sides exist, so {deployer.vnet_id} has no route to the internal load balancer",
        "create both VirtualNetworkPeering resources (kilonode.azure.network does for `deployer.network: peered`)",
    )]


def _nsgs(plan: ClusterPlan, deployer: DeployerPlan, graph: NetworkGraph) -> list[Finding]:
    """Hop 5: every NSG on the way admits each deployer CIDR on TCP 6443."""
    control = str(plan.network.control_plane_subnet)
    groups: list[Resource] = []
    for subnet in graph.of(SUBNET):
        if subnet.inputs.get("addressPrefix") == control and subnet.inputs.get("networkSecurityGroup"):
            found = graph.by_reference(NSG, subnet.inputs["networkSecurityGroup"], "networkSecurityGroupName")
            groups += [found] if found else []
    for nic in graph.apiserver_nics(plan):
        if nic.inputs.get("networkSecurityGroup"):
            found = graph.by_reference(NSG, nic.inputs["networkSecurityGroup"], "networkSecurityGroupName")
            groups += [found] if found else []
    # The VirtualNetwork tag: the VNet's own space and every peered network's.
    vnet_space = [plan.network.vnet_cidr, *(deployer.cidrs if deployer.vnet_id else ())]
    targets = [i.ip for i in plan.control_plane.instances]
    findings = []
    for group in groups:
        rules = list(group.inputs.get("securityRules") or [])
        for cidr in deployer.cidrs:
            verdict, rule = admits(rules, cidr, targets, APISERVER_PORT, vnet_space)
            if verdict != "allow":
                findings.append(Finding(
                    NAME, "break", group.describe(),
                    f"{cidr} (the deployer) is refused on TCP {APISERVER_PORT} by rule {rule}: the readiness check "
                    "times out and no in-cluster object is created",
                    f"admit deployer.cidrs on {APISERVER_PORT} above every deny (kilonode.azure.network: "
                    "allow-apiserver-from-deployer)",
                ))
    return findings


# Azure's default outbound rules, after every custom one (network-security-groups-overview.md).
AZURE_DEFAULT_OUTBOUND: tuple[dict[str, Any], ...] = (
    {"name": "AllowVnetOutBound (Azure's default)", "priority": 65000, "access": "Allow",
     "destinationAddressPrefix": "VirtualNetwork"},
    {"name": "AllowInternetOutBound (Azure's default)", "priority": 65001, "access": "Allow",
     "destinationAddressPrefix": "Internet"},
    {"name": "DenyAllOutBound (Azure's default)", "priority": 65500, "access": "Deny", "destinationAddressPrefix": "*"},
)


def _outbound(plan: ClusterPlan, deployer: DeployerPlan, graph: NetworkGraph) -> list[Finding]:
    """Hop 6 (peered): every NSG of the cluster's subnets refuses outbound flows to the deployer."""
    if deployer.vnet_id is None:
        return []
    vnet_space = [plan.network.vnet_cidr, *deployer.cidrs]
    findings = []
    for group in graph.of(NSG):
        rules = [r for r in group.inputs.get("securityRules") or [] if r.get("direction") == "Outbound"]
        for cidr in deployer.cidrs:
            rule = _first_outbound(rules, cidr, vnet_space)
            if str(rule.get("access")).lower() != "deny":
                findings.append(Finding(
                    NAME, "break", group.describe(),
                    f"outbound flows to {cidr} (the peered deployer) are allowed by {rule.get('name')}: every pod "
                    "on a subnet of this NSG (Azure CNI: pool-subnet addresses) reaches the machine that holds "
                    "the cluster's admin credentials, the Azure login that assigns roles and the Pulumi state",
                    "deny outbound to deployer.cidrs above every allow (kilonode.azure.network: deny-to-deployer)",
                ))
    return findings


VMSS = "azure-native:compute:VirtualMachineScaleSet"
ROLE_ASSIGNMENT = "azure-native:authorization:RoleAssignment"


def _nic_deny(plan: ClusterPlan, deployer: DeployerPlan, graph: NetworkGraph) -> list[Finding]:
    """Hop 6, where no cluster identity writes: every pool scale set's NICs carry an NSG of their
    own that refuses the deployer, scoped by no role assignment of the graph. The subnet NSG's deny
    alone is cloud-controller-manager's to delete (Network Contributor on it, for Services' rules):
    root on a system node takes that identity's token from the instance metadata service (the
    independent trace of issue 37, round 5, finding 3)."""
    if deployer.vnet_id is None:
        return []
    scopes = {str(a.inputs.get("scope", "")) for a in graph.of(ROLE_ASSIGNMENT)}
    vnet_space = [plan.network.vnet_cidr, *deployer.cidrs]
    findings = []
    for vmss in graph.of(VMSS):
        configs = ((((vmss.inputs.get("virtualMachineProfile") or {}).get("networkProfile") or {})
                    .get("networkInterfaceConfigurations")) or [])
        for config in configs:
            reference = config.get("networkSecurityGroup")
            nsg = graph.by_reference(NSG, reference, "networkSecurityGroupName") if reference else None
            if nsg is None:
                problem = "carry no NSG of their own: only the subnet NSG's deny stands, which the cloud provider's " \
                          "identity may delete"
            elif str((reference or {}).get("id", "")) in scopes:
                problem = f"carry NSG {nsg.describe()}, which a role assignment of the graph is scoped to"
            else:
                rules = [r for r in nsg.inputs.get("securityRules") or [] if r.get("direction") == "Outbound"]
                allowed = [str(c) for c in deployer.cidrs
                           if str(_first_outbound(rules, c, vnet_space).get("access")).lower() != "deny"]
                if not allowed:
                    continue
                problem = f"carry NSG {nsg.describe()}, which lets outbound flows reach {', '.join(allowed)}"
            findings.append(Finding(
                NAME, "break", vmss.describe(),
                f"its NICs {problem}: root on a system node could open every pod's way to the peered deployer "
                "(admin credentials, Pulumi state)",
                "give the pools' NICs the NSG kilonode.azure.network makes for a peered deployer (NIC_NSG)"))
    return findings


def _first_outbound(rules: list[Mapping[str, Any]], target: IPv4Network,
                    vnet_space: list[IPv4Network]) -> Mapping[str, Any]:
    """The rule that decides the first outbound flow to `target` (any protocol, port and source):
    custom rules by priority, then Azure's defaults; a rule that covers only part of `target`
    decides that part, so an allow of any part is what is returned."""
    remaining = [target]
    for rule in (*sorted(rules, key=lambda r: int(r.get("priority", 65000))), *AZURE_DEFAULT_OUTBOUND):
        matched = [part for net in remaining for part in _overlap(net, rule_networks(rule, "destination", vnet_space))]
        if not matched:
            continue
        if str(rule.get("access")).lower() != "deny":
            return rule
        remaining = _minus(remaining, matched)
        if not remaining:
            return rule
    return AZURE_DEFAULT_OUTBOUND[-1]


def admits(rules: Iterable[Mapping[str, Any]], source: IPv4Network, targets: list[IPv4Address], port: int,
           vnet_space: list[IPv4Network]) -> tuple[str, str]:
    """How Azure decides a TCP flow from every address of `source` to `targets`:`port`: custom
    rules by priority, then the defaults, each address decided by the first rule it matches.
    ("allow", the last rule needed) or ("deny", the rule that refuses some of it)."""
    remaining = [source]
    ordered = sorted((r for r in rules if r.get("direction", "Inbound") == "Inbound"),
                     key=lambda r: int(r.get("priority", 65000)))
    for rule in (*ordered, *AZURE_DEFAULT_RULES):
        if not (_protocol(rule) and _port(rule, port) and _destination(rule, targets, vnet_space)):
            continue
        matched = [part for net in remaining for part in _overlap(net, _sources(rule, vnet_space))]
        if not matched:
            continue
        name = str(rule.get("name"))
        if str(rule.get("access")).lower() == "deny":
            return "deny", name
        remaining = _minus(remaining, matched)
        if not remaining:
            return "allow", name
    return "deny", "none"


def admitted_parts(rules: Iterable[Mapping[str, Any]], source: IPv4Network, targets: list[IPv4Address], port: int,
                   vnet_space: list[IPv4Network]) -> list[tuple[IPv4Network, str]]:
    """The parts of `source` Azure admits to `targets`:`port` (the order `admits` decides in), each
    with the rule that admits it; empty where no address of `source` gets through."""
    remaining, admitted = [source], []
    ordered = sorted((r for r in rules if r.get("direction", "Inbound") == "Inbound"),
                     key=lambda r: int(r.get("priority", 65000)))
    for rule in (*ordered, *AZURE_DEFAULT_RULES):
        if not remaining:
            break
        if not (_protocol(rule) and _port(rule, port) and _destination(rule, targets, vnet_space)):
            continue
        matched = [part for net in remaining for part in _overlap(net, _sources(rule, vnet_space))]
        if str(rule.get("access")).lower() != "deny":
            admitted += [(part, str(rule.get("name"))) for part in matched]
        remaining = _minus(remaining, matched)
    return admitted


def _protocol(rule: Mapping[str, Any]) -> bool:
    return str(rule.get("protocol", "*")).lower() in ("*", "tcp", "any")


def _port(rule: Mapping[str, Any], port: int) -> bool:
    ranges = [rule.get("destinationPortRange"), *(rule.get("destinationPortRanges") or [])]
    for text in (str(r) for r in ranges if r):
        if text == "*":
            return True
        low, _, high = text.partition("-")
        if int(low) <= port <= int(high or low):
            return True
    return False


def _prefixes(rule: Mapping[str, Any], key: str) -> list[str]:
    single = rule.get(f"{key}AddressPrefix")
    return [str(single)] if single else [str(p) for p in rule.get(f"{key}AddressPrefixes") or []]


def _networks(prefixes: list[str], vnet_space: list[IPv4Network]) -> list[IPv4Network]:
    found: list[IPv4Network] = []
    for prefix in prefixes:
        if prefix.lower() in ANY:
            found.append(IPv4Network("0.0.0.0/0"))
        elif prefix.lower() == "virtualnetwork":
            found += vnet_space
        elif prefix.lower() == "azureloadbalancer":
            found.append(AZURE_PROBE_SOURCE)
        else:
            try:
                found.append(IPv4Network(str(ip_network(prefix, strict=False))))
            except ValueError:
                continue  # another service tag: never the deployer's own addresses
    return found


def rule_networks(rule: Mapping[str, Any], side: str, vnet_space: list[IPv4Network]) -> list[IPv4Network]:
    """A rule's source or destination (`side`) as the networks `admits` matches it by (service
    tags VirtualNetwork and AzureLoadBalancer resolved, `*` and Internet as 0.0.0.0/0): the same
    reading for kilonode.review's NSG rules (which rule now shadows which)."""
    return _networks(_prefixes(rule, side), vnet_space)


def _sources(rule: Mapping[str, Any], vnet_space: list[IPv4Network]) -> list[IPv4Network]:
    return _networks(_prefixes(rule, "source"), vnet_space)


def _destination(rule: Mapping[str, Any], targets: list[IPv4Address], vnet_space: list[IPv4Network]) -> bool:
    nets = _networks(_prefixes(rule, "destination"), vnet_space)
    return all(any(ip_address(t) in n for n in nets) for t in targets)


def _overlap(net: IPv4Network, others: list[IPv4Network]) -> list[IPv4Network]:
    return [net if net.subnet_of(o) else o for o in others if net.subnet_of(o) or o.subnet_of(net)]


def _minus(nets: list[IPv4Network], taken: list[IPv4Network]) -> list[IPv4Network]:
    left = list(nets)
    for t in taken:
        next_left: list[IPv4Network] = []
        for n in left:
            if n.subnet_of(t):
                continue
            next_left += list(n.address_exclude(t)) if t.subnet_of(n) else [n]
        left = next_left
    return left
