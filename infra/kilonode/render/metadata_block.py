"""The metadata block: every pool node drops its pods' traffic to Azure's instance metadata
service (IMDS) and to the WireServer, so no pod can ask for a token of an identity its node's
scale set carries, nor read the VM agent's settings. The node's own processes and its
host-network pods (cloud-node-manager, cloud-controller-manager and the autoscaler on the
controller pools, kube-proxy) keep both.

Why the forward hook: with Azure CNI in transparent mode (kilonode.render.cni) each pod has a
host-side interface of its own (azv*) and the host routes its traffic, so a pod's packet to
169.254.169.254 is forwarded, while the host and host-network pods send their own (output
hook). AKS draws the line at the same place (Azure/AgentBaker at 06836ee2,
parts/linux/cloud-init/artifacts/block_wireserver.sh: FORWARD drops 168.63.129.16 tcp 80 and
32526, "The host can still reach 168.63.129.16 because it goes through the OUTPUT chain, not
FORWARD"; ensure_imds_restriction.sh, its IMDS restriction: FORWARD drops 169.254.169.254
tcp 80), and azure-container-networking's own test expects a pod's WireServer request to fail
(test/network/wireserver_metadata_test.sh). The host still needs the WireServer: azure-vnet
asks it for the NIC's addresses (cni/network/plugin: ipamQueryURL), run by the runtime in the
host's namespace. DNS to 168.63.129.16:53 stays open: CoreDNS runs in pods and forwards there.

Why nftables, in a table of its own: kube-proxy runs in nftables mode
(kilonode.plan.defaults.proxy) and Docker and azure-vnet write iptables rules (iptables-nft on
Debian bookworm). A drop in any base chain on a hook ends the packet whatever another table's
chains accept (nft(8), VERDICT STATEMENT: "drop: Drop the packet ... stops evaluation", and
accept only ends the current base chain), so a table of its own neither depends on their rules
nor disturbs them, and loading the file replaces it in one transaction (`table`, `delete
table`, `table { ... }`: idempotent at every boot).

The rules are data (METADATA_RULES), checked and written by `ruleset`; a oneshot unit loads
them before the kubelet starts, and the kubelet requires it: a node whose block failed to load
runs no pod (kilonode.render.pool). preflight's `identities` check reads the rendered file back.
"""

from __future__ import annotations

from dataclasses import dataclass
from ipaddress import IPv4Address

from kilonode.plan.wellknown import AZURE_IMDS_ADDRESS, AZURE_WIRESERVER_ADDRESS, AZURE_WIRESERVER_TCP_PORTS
from kilonode.render.common import GENERATED, render_template

NFT_BINARY = "/usr/sbin/nft"
RULESET = "etc/kilonode/metadata-block.nft"
UNIT = "etc/systemd/system/kilonode-metadata-block.service"
UNIT_NAME = UNIT.rpartition("/")[2]
TABLE = "kilonode_metadata_block"  # nft identifiers: letters, digits, underscores
# Before the filter chains of other tables at the same hook; a drop is final at any priority.
CHAIN_PRIORITY = "filter - 10"
# nft keeps a rule's comment in its user data, 128 bytes at most (libnftnl NFTNL_UDATA_COMMENT_MAXLEN)
COMMENT_MAX = 128


@dataclass(frozen=True)
class MetadataRule:
    """Pods' packets to `address` are dropped: every protocol, or TCP to `tcp_ports` only."""

    address: str
    tcp_ports: tuple[int, ...]  # () : every packet to the address
    reason: str  # the rule's comment on the node

    def __post_init__(self) -> None:
        IPv4Address(self.address)  # raises on anything but a dotted IPv4 address
        if any(not 0 < port < 65536 for port in self.tcp_ports) or len(set(self.tcp_ports)) != len(self.tcp_ports):
            raise ValueError(f"{self.address}: ports must be distinct TCP ports, got {self.tcp_ports}")
        if not self.reason or '"' in self.reason or "\\" in self.reason or not self.reason.isprintable() \
                or len(self.reason.encode()) > COMMENT_MAX:
            raise ValueError(f"{self.address}: a rule's comment is one printable line without quotes or "
                             f"backslashes, {COMMENT_MAX} bytes at most")

    def statement(self) -> str:
        """The rule in nft's syntax."""
        match = f"ip daddr {self.address}"
        if self.tcp_ports:
            match += " tcp dport { " + ", ".join(str(p) for p in self.tcp_ports) + " }"
        return f'{match} counter drop comment "{self.reason}"'


METADATA_RULES = (
    MetadataRule(AZURE_IMDS_ADDRESS, (), "pods get no managed-identity token from the instance metadata service"),
    MetadataRule(AZURE_WIRESERVER_ADDRESS, AZURE_WIRESERVER_TCP_PORTS,
                 "pods do not reach the WireServer or the HostGAPlugin (DNS on 53 stays open)"),
)


def ruleset(rules: tuple[MetadataRule, ...] = METADATA_RULES) -> str:
    """/etc/kilonode/metadata-block.nft: the table, replaced whole each time it is loaded."""
    body = "".join(f"\t\t{rule.statement()}\n" for rule in rules)
    return (
        f"#!{NFT_BINARY} -f\n# {GENERATED}\n"
        "# Pods' traffic is forwarded by the host (Azure CNI, transparent mode); the host's own and\n"
        "# host-network pods' traffic is not, and keeps reaching both (kilonode.render.metadata_block).\n"
        f"table inet {TABLE}\n"
        f"delete table inet {TABLE}\n"
        f"table inet {TABLE} {{\n"
        "\tchain forward {\n"
        f"\t\ttype filter hook forward priority {CHAIN_PRIORITY}; policy accept;\n"
        f"{body}"
        "\t}\n"
        "}\n"
    )


def unit() -> str:
    return render_template(UNIT, nft=NFT_BINARY, ruleset=f"/{RULESET}")
