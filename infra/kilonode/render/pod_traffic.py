"""Per-namespace and per-pod network accounting on every pool node (the 7,500-node post's
"iptables tagging on the host", done with nftables): the table whose sets count each pod
address's forwarded bytes and packets, and the config and units of the program that keeps the
sets in line with azure-vnet's state file and answers Prometheus (kilonode/node/pod_traffic.py,
which every pool image carries: kilonode.node.ship POD_TRAFFIC). Pure: plan in, files out.

Units, and why each:
- kilonode-pod-traffic-table.service loads the table at boot (a oneshot, like the metadata
  block's), before the kubelet; nothing requires it, so a node whose accounting fails runs pods;
- kilonode-pod-traffic.service adds and removes set elements (once at boot, then on demand);
- kilonode-pod-traffic.path starts it whenever azure-vnet replaces its state file, so a pod's
  addresses are counted from its first seconds, not from the next scrape;
- kilonode-pod-traffic.socket and kilonode-pod-traffic@.service answer each scrape (socket
  activation, as kilonode.render.cert_metrics): sync, then the counters as they are then.

Why no node asks the API server: the node's own CNI state names each address's pod and
namespace, so the accounting costs the control plane nothing at any node count (the field
notes' lesson about per-node agents that LIST and WATCH).
"""

from __future__ import annotations

from kilonode.node import pod_traffic as program
from kilonode.node.ship import POD_TRAFFIC, PYTHON
from kilonode.plan import wellknown
from kilonode.render import node_ports
from kilonode.render.common import GENERATED, render_template, to_json
from kilonode.render.files import HostFiles, RenderedFile

NFT_BINARY = program.NFT
TABLE = "kilonode_pod_traffic"  # nft identifiers: letters, digits, underscores
RULESET = "etc/kilonode/pod-traffic.nft"
CONFIG_PATH = "etc/kilonode/pod-traffic.json"
SCRIPT_PATH = POD_TRAFFIC.machine_path.lstrip("/")  # in every pool image, not rendered
TABLE_UNIT = "etc/systemd/system/kilonode-pod-traffic-table.service"
SYNC_UNIT = "etc/systemd/system/kilonode-pod-traffic.service"
PATH_UNIT = "etc/systemd/system/kilonode-pod-traffic.path"
SOCKET_UNIT = "etc/systemd/system/kilonode-pod-traffic.socket"
SERVE_UNIT = "etc/systemd/system/kilonode-pod-traffic@.service"
UNIT_NAMES = tuple(p.rpartition("/")[2] for p in (TABLE_UNIT, SYNC_UNIT, PATH_UNIT, SOCKET_UNIT))
# azure-vnet's state file (azure-container-networking v1.6.21 platform/os_linux.go l.28:
# /var/run/azure-vnet.json); /var/run is a link to /run, and systemd wants the canonical path.
STATE_FILE = "/run/azure-vnet.json"
RUN_DIR_NAME = "kilonode-pod-traffic"
# Azure CNI gives a node at most 250 pods (one address each, two with dual stack); the sets and
# the program stop at this many addresses, so a broken state file cannot grow them without bound.
MAX_ADDRESSES = 1024
# Before the metadata block (filter - 10): a pod's packet it drops is still counted as sent,
# and no other table's verdict at the forward hook hides a packet from the count.
CHAIN_PRIORITY = "filter - 20"
# Prometheus scrapes each node every 15 to 60 s (the plan's per-node interval); a
# handful at once is already a misbehaving client.
MAX_CONNECTIONS = 8
# An answer is two nft calls and a small file read: a second is plenty; a stuck one is ended.
TIMEOUT_S = 20
# The sync at boot starts Python while everything else on the node starts too: the verify VM's
# after-reboot check saw it pass 20 s on a busy (emulated) boot and fail the unit. It holds no
# scrape behind it, so give it room; a stuck one is still ended.
SYNC_TIMEOUT_S = 120

SANDBOX = "\n".join((
    "# It reads azure-vnet's state (root's, 0600) and changes one nftables table (CAP_NET_ADMIN, over",
    "# netlink); it writes only its runtime directory (the owners record and the lock, shared by the",
    "# sync unit and the scrape units, so kept between runs).",
    f"RuntimeDirectory={RUN_DIR_NAME}",
    "RuntimeDirectoryPreserve=yes",
    "NoNewPrivileges=yes",
    "ProtectSystem=strict",
    "ProtectHome=yes",
    "PrivateTmp=yes",
    "CapabilityBoundingSet=CAP_NET_ADMIN",
    "RestrictAddressFamilies=AF_UNIX AF_NETLINK",
))


def ruleset() -> str:
    """/etc/kilonode/pod-traffic.nft: the table, replaced whole when loaded (empty sets: the
    program fills them). Each lookup only counts: no rule here has a verdict."""
    sets = "".join(
        f"\tset {name} {{\n\t\ttype ipv{version}_addr\n\t\tsize {MAX_ADDRESSES}\n\t\tcounter\n\t}}\n\n"
        for name, version, _ in program.SETS
    )
    lookups = "".join(
        f"\t\t{'ip' if version == 4 else 'ip6'} {'saddr' if direction == 'out' else 'daddr'} @{name}\n"
        for name, version, direction in program.SETS
    )
    return (
        f"#!{NFT_BINARY} -f\n# {GENERATED}\n"
        "# Each pod address's forwarded bytes and packets, out (as source) and in (as destination);\n"
        "# kilonode-pod-traffic.service adds and removes the addresses (kilonode.render.pod_traffic).\n"
        f"table inet {TABLE}\n"
        f"delete table inet {TABLE}\n"
        f"table inet {TABLE} {{\n"
        f"{sets}"
        "\tchain forward {\n"
        f"\t\ttype filter hook forward priority {CHAIN_PRIORITY}; policy accept;\n"
        f"{lookups}"
        "\t}\n"
        "}\n"
    )


def config() -> dict[str, object]:
    """/etc/kilonode/pod-traffic.json, read by kilonode/node/pod_traffic.py (`sync`)."""
    return {
        "stateFile": STATE_FILE,
        "table": TABLE,
        "runDir": f"/run/{RUN_DIR_NAME}",
        "maxAddresses": MAX_ADDRESSES,
    }


def _exec(command: str) -> str:
    return f"{PYTHON} /{SCRIPT_PATH} {command} --config /{CONFIG_PATH}"


def pod_traffic_files() -> HostFiles:
    """Every rendered file of the accounting, the same on every pool node (the program is the image's)."""
    return {
        RULESET: RenderedFile(ruleset()),
        CONFIG_PATH: RenderedFile(to_json(config())),
        TABLE_UNIT: RenderedFile(render_template(TABLE_UNIT, nft=NFT_BINARY, ruleset=f"/{RULESET}")),
        SYNC_UNIT: RenderedFile(render_template(SYNC_UNIT, exec_start=_exec("sync"), timeout_s=SYNC_TIMEOUT_S,
                                                sandbox=SANDBOX)),
        PATH_UNIT: RenderedFile(render_template(PATH_UNIT, state_file=STATE_FILE)),
        SOCKET_UNIT: RenderedFile(render_template(SOCKET_UNIT, port=wellknown.POD_TRAFFIC_METRICS_PORT,
                                                  max_connections=MAX_CONNECTIONS,
                                                  firewall_unit=node_ports.UNIT_NAME)),
        SERVE_UNIT: RenderedFile(render_template(SERVE_UNIT, exec_start=_exec("serve"), timeout_s=TIMEOUT_S,
                                                 sandbox=SANDBOX)),
    }
