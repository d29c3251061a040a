"""port-range: a pool node's ephemeral port range includes no port a listener on that node binds,
nor a NodePort, unless ip_local_reserved_ports reserves it.

The kernel gives every outgoing connection that names no source port one from
net.ipv4.ip_local_port_range, skipping only ip_local_reserved_ports (Linux
Documentation/networking/ip-sysctl.rst: ip_local_port_range, "the local port range that is used
by TCP and UDP traffic to choose the local port"; ip_local_reserved_ports, "Specify the ports
which are reserved for known third-party applications. These ports will not be used by automatic
port assignments"). A listener's port inside that range can be taken by an outgoing connection
while the listener is down (a kubelet restart, an agent's new pod): its bind then fails with
EADDRINUSE until that connection closes, and the node's kubelet (10250) or a metrics agent
(kilonode.plan.wellknown *_PORT) stays deaf. A NodePort inside it (kube-apiserver
--service-node-port-range, 30000-32767 by default: kubernetes pkg/kubeapiserver/options/options.go
DefaultServiceNodePortRange) makes the replies to the node's own outgoing connection from that
port match kube-proxy's NodePort rules.

Read per pool role: the range and the reserved ports from the role's rendered sysctl file
(kilonode.render.pool SYSCTL_FILE; the kernel's default, 32768-60999, where it sets none), the
ports from the listener catalogue's rows for the pool's host kinds (kilonode.plan.listeners
`on_pool`: the kubelet, kube-proxy, the node agents' metrics ports, ...; a pod's own address is
its own network namespace's, not the node's, and a port of 0 is one the kernel picks).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from kilonode.plan.listeners import on_pool
from kilonode.plan.model import ClusterPlan, NodePoolPlan
from kilonode.preflight.model import Finding, Inputs
from kilonode.render.pool import SYSCTL_FILE

NAME = "port-range"
TITLE = "no listener's port or NodePort lies in a node's ephemeral port range unless it is reserved"

RANGE_KEY = "net.ipv4.ip_local_port_range"
RESERVED_KEY = "net.ipv4.ip_local_reserved_ports"
# the kernel's default (ip-sysctl.rst ip_local_port_range: "The default values are 32768 and 60999")
DEFAULT_RANGE = (32768, 60999)
# kube-apiserver's --service-node-port-range default; kilonode sets no other
NODE_PORTS = (30000, 32767)


def check(inputs: Inputs) -> list[Finding]:
    findings = []
    for host in inputs.hosts():
        pool = _pool_of(inputs.plan, host)
        if pool is None:
            continue
        values = sysctls(inputs.host_files(host).get(SYSCTL_FILE, ""))
        low, high = port_range(values.get(RANGE_KEY))
        reserved = reserved_ports(values.get(RESERVED_KEY, ""))
        taken = [f"{program} {port}" for program, port in _bound(inputs.plan, pool)
                 if low <= port <= high and port not in reserved]
        node_ports = [p for p in range(max(low, NODE_PORTS[0]), min(high, NODE_PORTS[1]) + 1) if p not in reserved]
        if node_ports:
            taken.append(f"NodePorts {node_ports[0]}-{node_ports[-1]}" if len(node_ports) > 1
                         else f"NodePort {node_ports[0]}")
        if taken:
            findings.append(Finding(
                NAME, "break", host,
                f"{RANGE_KEY} is {low}-{high} in {SYSCTL_FILE}, which includes {', '.join(taken)}: an outgoing "
                "connection takes such a port as its source, and the listener restarted meanwhile fails to bind "
                "it (EADDRINUSE) until that connection closes (a NodePort: the replies to it hit kube-proxy's "
                "NodePort rules)",
                f"keep {RANGE_KEY} above these ports (the kernel's default is 32768-60999; sysctl.overrides or the "
                f"sysctl/ profile), or reserve them in {RESERVED_KEY}"))
    return findings


def _pool_of(plan: ClusterPlan, host: str) -> NodePoolPlan | None:
    # a pool's role is pool-<name>, a team's scale sets pool-<name>.team-<team>
    return next((p for p in plan.node_pools if host == p.role() or host.startswith(p.role() + ".")), None)


def _bound(plan: ClusterPlan, pool: NodePoolPlan) -> Iterator[tuple[str, int]]:
    for row in on_pool(plan, pool):
        if row.port and row.bind != "pod":
            yield row.id, row.port


def sysctls(text: str) -> dict[str, str]:
    """A sysctl.d file's key -> value (the last setting of a key wins, as systemd-sysctl applies them)."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and not line.lstrip().startswith(("#", ";")):
            found[key.strip()] = value.strip()
    return found


def port_range(text: str | None) -> tuple[int, int]:
    """"1024 65535" (or tab-separated) -> (1024, 65535); unset or unreadable: the kernel's default."""
    parts = (text or "").split()
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        return DEFAULT_RANGE
    return int(parts[0]), int(parts[1])


def reserved_ports(text: str) -> set[int]:
    """ip_local_reserved_ports' comma-separated ports and ranges ("8080,10248-10259") -> the ports."""
    found: set[int] = set()
    for part in filter(None, (p.strip() for p in text.split(","))):
        low, _, high = part.partition("-")
        if low.isdigit() and (not high or high.isdigit()):
            found.update(range(int(low), int(high or low) + 1))
    return found


def values_of(files: Mapping[str, str], host: str) -> dict[str, str]:
    """One host role's rendered sysctls (for callers holding the render as "<host>/<path>" -> text)."""
    return sysctls(files.get(f"{host}/{SYSCTL_FILE}", ""))
