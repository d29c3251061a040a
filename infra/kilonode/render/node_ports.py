"""The node firewall: every pool node admits its unauthenticated ports from the cluster's
Prometheus and from itself alone, and the Prometheus pool's nodes admit Prometheus's own port from
the control plane and their own reserved subnet alone. It holds whether or not a NetworkPolicy
engine runs: NetworkPolicy does not cover a host-network listener, and these are the host's.

Which ports: the catalogue's listeners on the pool's nodes that authenticate no one and bind
every address (kilonode.plan.listeners firewalled_ports): the per-pod traffic socket (a root
process per connection), the GPU health agent's metrics, the cluster autoscaler's host-network
/metrics. What can be bound narrower is (kube-proxy's metrics and health, the runtime's streaming
server: loopback); these listen on every address because a scale set's node learns its address at
boot, or because upstream's flag takes no other.

Who reaches them, and how a packet shows it (the input hook: traffic to the host itself):
- the node itself: the kubelet's probes and an operator on the host connect over `lo`, even to the
  node's own address;
- the cluster's Prometheus: an address of its pool's subnet (Azure CNI: the pod's own, not
  SNATed in the virtual network). That subnet is the scraper's only where the pool is reserved
  (kilonode.plan.listeners, kilonode.k8s.reserved_pools); preflight's `listeners` check warns
  where it is not;
- everyone else is dropped: a pod on this node (its packets come in on its own azv* interface:
  on a node of another pool none of them is Prometheus, and a pod there could forge a source
  address, which the virtual network would not carry off the node but the host would see), pods
  and nodes of the other pools, the control plane, anything in the virtual network. Azure's NSGs
  cannot draw this line: the pools' subnets hold nodes and pods alike, and a pod reaching its own
  node never leaves the host.

Prometheus's port (9090, no authentication, the whole store): on a reserved Prometheus pool the
forward hook (a pod's traffic in transparent mode is routed by the host to its azv* interface)
admits it from the control-plane subnet (the apiserver's service proxy: authenticated and
authorised by RBAC) and from the pool's own subnet (the system namespaces' pods beside it), and
drops it from every other pod; the kubelet's probes leave the host itself (output hook) and
`kubectl port-forward` connects inside the pod. Not on an unreserved pool: there users' pods
are its neighbours on 9090 too, and the rule would drop theirs.

As the metadata block (kilonode.render.metadata_block): a table of its own in the inet family,
replaced whole in one transaction when loaded, a drop final whatever other tables accept. Loaded
by a unit with Debian's nftables.service's ordering (early, no default dependencies), which the
kubelet and the listening sockets require: a node whose firewall fails to load opens none of
these ports and runs no pod.

The ports are below the kernel's ephemeral range (32768-60999, not changed by kilonode's sysctls),
so no reply to one of the node's own outgoing connections carries them as its destination port.
"""

from __future__ import annotations

from dataclasses import dataclass
from ipaddress import IPv4Network

from kilonode.plan import defaults
from kilonode.plan.listeners import firewalled_ports, listener, prometheus_pool, reserved_pools, scraper_subnet
from kilonode.plan.model import ClusterPlan, NodePoolPlan
from kilonode.render.common import GENERATED, render_template
from kilonode.render.metadata_block import CHAIN_PRIORITY, COMMENT_MAX, NFT_BINARY

RULESET = "etc/kilonode/node-ports.nft"
UNIT = "etc/systemd/system/kilonode-node-ports.service"
UNIT_NAME = UNIT.rpartition("/")[2]
TABLE = "kilonode_node_ports"
# Azure CNI's host-side interface of each pod (kube-proxy's detectLocal prefix, the same name)
POD_INTERFACES = f"{defaults.KUBE_PROXY_POD_INTERFACE_PREFIX}*"


@dataclass(frozen=True)
class NodePorts:
    """A pool's node firewall, as data."""

    ports: tuple[int, ...]  # the unauthenticated host ports, admitted from `scraper` and loopback
    scraper: IPv4Network | None  # the Prometheus pool's subnet; None: no Prometheus, loopback alone
    scraper_here: bool  # this is the Prometheus pool: a pod on the node may be the scraper
    prometheus_port: int | None  # Prometheus's own port, on a reserved Prometheus pool's nodes only
    prometheus_from: tuple[IPv4Network, ...]  # who may reach it there

    def __post_init__(self) -> None:
        if any(not 0 < port < 65536 for port in (*self.ports, self.prometheus_port or 1)):
            raise ValueError(f"node ports: not TCP ports: {self.ports}, {self.prometheus_port}")
        if self.prometheus_port is not None and not self.prometheus_from:
            raise ValueError("node ports: Prometheus's port with no source would shut its people out too")


def node_ports(plan: ClusterPlan, pool: NodePoolPlan) -> NodePorts:
    """The plan's node firewall for a pool's nodes."""
    prometheus = prometheus_pool(plan)
    here = prometheus is not None and prometheus.name == pool.name
    reserved = here and pool.name in {p.name for p in reserved_pools(plan)}
    return NodePorts(
        ports=firewalled_ports(plan, pool),
        scraper=scraper_subnet(plan),
        scraper_here=here,
        prometheus_port=listener("prometheus").port if reserved else None,
        prometheus_from=(IPv4Network(plan.network.control_plane_subnet), IPv4Network(pool.subnet)) if reserved else (),
    )


def _rule(match: str, verdict: str, comment: str) -> str:
    assert len(comment.encode()) <= COMMENT_MAX and '"' not in comment, comment
    return f'\t\t{match} {verdict} comment "{comment}"\n'


def _set(items: tuple[object, ...]) -> str:
    return "{ " + ", ".join(str(i) for i in items) + " }"


def _input_rules(spec: NodePorts) -> str:
    ports = f"tcp dport {_set(spec.ports)}"
    rules = _rule(f'iifname "lo" {ports}', "accept", "the node itself: the kubelet's probes, a process on the host")
    if not spec.scraper_here:
        rules += _rule(f'iifname "{POD_INTERFACES}" {ports}', "counter drop",
                       "a pod on this node: none is the scraper on this pool")
    if spec.scraper is not None:
        rules += _rule(f"ip saddr {spec.scraper} {ports}", "accept",
                       "the cluster's Prometheus: its pool's subnet")
    return rules + _rule(ports, "counter drop", "everyone else: unauthenticated, for the scraper alone")


def _forward_rules(spec: NodePorts) -> str:
    port = f'oifname "{POD_INTERFACES}" tcp dport {spec.prometheus_port}'
    return (_rule(f"{port} ip saddr {_set(spec.prometheus_from)}", "accept",
                  "Prometheus: the apiserver's service proxy and its own reserved pool")
            + _rule(port, "counter drop", "Prometheus: unauthenticated, no other pod queries it"))


def ruleset(spec: NodePorts) -> str:
    """/etc/kilonode/node-ports.nft: the table, replaced whole each time it is loaded."""
    chains = ""
    if spec.ports:
        chains += ("\tchain input {\n"
                   f"\t\ttype filter hook input priority {CHAIN_PRIORITY}; policy accept;\n"
                   f"{_input_rules(spec)}\t}}\n")
    if spec.prometheus_port is not None:
        chains += ("\tchain forward {\n"
                   f"\t\ttype filter hook forward priority {CHAIN_PRIORITY}; policy accept;\n"
                   f"{_forward_rules(spec)}\t}}\n")
    return (
        f"#!{NFT_BINARY} -f\n# {GENERATED}\n"
        "# The node's unauthenticated ports from the cluster's Prometheus and the node itself alone\n"
        "# (kilonode.render.node_ports).\n"
        f"table inet {TABLE}\n"
        f"delete table inet {TABLE}\n"
        f"table inet {TABLE} {{\n"
        f"{chains}"
        "}\n"
    )


def unit() -> str:
    return render_template(UNIT, nft=NFT_BINARY, ruleset=f"/{RULESET}")
