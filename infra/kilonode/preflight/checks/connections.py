"""connections: every address:port a machine's rendered files call is admitted by the NSG in
front of it, derived from the artefacts rather than from a list of expected paths.

Every `a.b.c.d:port` in a host role's rendered files (units' flags such as `--etcd-servers` and
`--initial-cluster`, scripts' probes such as etcd-join's peers, configs' endpoints) is a
connection that host makes, except:
- its own address (what it listens on, advertises or binds) and loopback;
- addresses outside every subnet of the recorded graph (nothing there for an NSG to decide).

Each connection is judged as Azure decides a TCP flow (kilonode.preflight.checks.deployer_path
`admits`): the inbound rules of the NSG on the destination's subnet by priority, then Azure's
default rules, for every address the source may have. The source is an etcd member's or an
apiserver's static IP, or for a pool every address of its subnet (any node may make the call).
A refusal is a break naming the file and line the call comes from and the rule that refuses it.

What it cannot see: names resolved at run time (a hostname, a Service), and outbound rules (the
program writes none; Azure's default allows traffic within the virtual network).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network, ip_network

from kilonode.preflight.checks.deployer_path import NSG, SUBNET, NetworkGraph, admits
from kilonode.preflight.model import Finding, Inputs, Resource

NAME = "connections"
TITLE = "every address:port a rendered unit, script or config calls is admitted by the NSG in front of it"

ADDRESS_PORT = re.compile(r"(?<![\d.])((?:\d{1,3}\.){3}\d{1,3}):(\d{1,5})(?![\d.])")
LOOPBACK = ip_network("127.0.0.0/8")


@dataclass(frozen=True)
class Call:
    target: IPv4Address
    port: int
    where: str  # file:line of the first mention


def calls(files: dict[str, str], own: IPv4Network) -> list[Call]:
    """The connections a host's files make, the first mention of each (target, port): in the
    files themselves before the cloud-init user-data that carries them."""
    found: dict[tuple[IPv4Address, int], Call] = {}
    for path, text in sorted(files.items(), key=lambda item: (item[0] == "user-data", item[0])):
        for number, line in enumerate(text.splitlines(), 1):
            for match in ADDRESS_PORT.finditer(line):
                try:
                    target, port = IPv4Address(match[1]), int(match[2])
                except ValueError:
                    continue
                if target in LOOPBACK or target in own or not 0 < port < 65536:
                    continue
                found.setdefault((target, port), Call(target, port, f"{path}:{number}"))
    return list(found.values())


def _source(inputs: Inputs, host: str) -> IPv4Network | None:
    """Where a host role's calls come from: its static address, or its pool's whole subnet."""
    plan = inputs.plan
    for member in (m for cluster in plan.etcd_clusters for m in cluster.members):
        if member.name == host:
            return IPv4Network(f"{member.ip}/32")
    for instance in plan.control_plane.instances:
        if instance.name == host:
            return IPv4Network(f"{instance.ip}/32")
    pool = next((p for p in plan.node_pools if host == p.role() or host.startswith(p.role() + ".")), None)
    return IPv4Network(pool.subnet) if pool is not None else None


def _subnet_of(graph: NetworkGraph, target: IPv4Address) -> Resource | None:
    """The graph's subnet holding the address (the longest prefix, as routing picks)."""
    holding = [(IPv4Network(str(s.inputs["addressPrefix"])), s) for s in graph.of(SUBNET)
               if s.inputs.get("addressPrefix") and target in IPv4Network(str(s.inputs["addressPrefix"]))]
    return max(holding, key=lambda pair: pair[0].prefixlen)[1] if holding else None


def check(inputs: Inputs) -> list[Finding]:
    graph = NetworkGraph(inputs)
    vnet = [IPv4Network(inputs.plan.network.vnet_cidr)]
    findings: list[Finding] = []
    for host in inputs.hosts():
        source = _source(inputs, host)
        if source is None:
            continue
        refused: dict[tuple[str, str, int, str], list[Call]] = {}
        for call in calls(inputs.host_files(host), source):
            subnet = _subnet_of(graph, call.target)
            reference = subnet.inputs.get("networkSecurityGroup") if subnet else None
            nsg = graph.by_reference(NSG, reference, "networkSecurityGroupName") if reference else None
            if subnet is None or nsg is None:
                continue  # outside the graph's subnets, or no NSG: Azure's defaults admit the virtual network
            verdict, rule = admits(nsg.inputs.get("securityRules") or [], source, [call.target], call.port, vnet)
            if verdict != "allow":
                key = (nsg.describe(), str(subnet.inputs["addressPrefix"]), call.port, rule)
                refused.setdefault(key, []).append(call)
        for (nsg_name, prefix, port, rule), refused_calls in refused.items():
            targets = ", ".join(f"{c.target}:{c.port} ({c.where})" for c in refused_calls)
            findings.append(Finding(
                NAME, "break", host,
                f"it calls {targets}, but {nsg_name} on subnet {prefix} refuses TCP {port} from {source} "
                f"(rule {rule}): the connection times out",
                f"admit TCP {port} from {source} to {prefix} in that NSG (kilonode.azure.network), above its deny "
                "rules",
            ))
    return findings
