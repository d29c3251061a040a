"""NSG rules in evaluation order, across a change: which rule a change leaves shadowed, and which
connections it leaves refused, judged with preflight's own NSG evaluation
(kilonode.preflight.checks.deployer_path.admits, as the connections check uses it: a flow is
decided by the first rule by priority that matches it, then Azure's default rules;
network-security-groups-overview.md).

- Shadowing (`nsg-shadowed`, high): for each inbound TCP rule of an NSG present on both sides,
  one flow it is written for (from its sources to the first address of its destination, or of the
  NSG's subnet, on its first port) is evaluated against the whole rule list. An allow rule whose
  flow a deny of higher priority now refuses, or a deny whose flow an allow of higher priority now
  admits, is shadowed: it no longer decides what it was written to decide. One line per shadowing
  rule (the same rule moved in several NSGs is one decision), naming the rules it shadows and, for
  an allow shadowed by a deny, the connections the rendered files make that are now refused.
- Connections (`connection-refused`, high): every address:port a rendered file calls that the
  head's NSGs refuse and the base's admitted (preflight's connections check on both sides), when
  no shadowing line already names it. NSG rules apply to new flows at once: what a refused call
  feeds (an apiserver's etcd, a member's peers) stops when `pulumi up` updates the NSG.

Preflight calls a refused connection a break, so `pulumi up`'s preflight gate refuses such a run
before it changes anything; applied another way (the portal, az), the story above is what happens.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network, collapse_addresses
from typing import Any

from kilonode.preflight.checks import connections
from kilonode.preflight.checks.deployer_path import NSG, SUBNET, NetworkGraph, admits, rule_networks
from kilonode.preflight.model import Inputs
from kilonode.review import sides
from kilonode.review.compare import StackDiff
from kilonode.review.finding import HIGH, MEDIUM, Finding
from kilonode.review.lifecycle import plan_of

GATE = ("Preflight's connections check calls each refused call a break, so `pulumi up` refuses the run before it "
        "changes anything (its preflight gate); applied another way (the portal, az), ")
_RULE = re.compile(r"\(rule ([^)]+)\)")


@dataclass(frozen=True)
class Shadow:
    nsg: str
    rule: str  # the rule that no longer decides its flow
    access: str  # its access: Allow or Deny
    by: str  # the rule that decides it now


def _ordered(rules: list[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    return {str(r.get("name")): r for r in rules if r.get("direction", "Inbound") == "Inbound"}


def _flow(rule: Mapping[str, Any], targets: list[IPv4Network], vnet: list[IPv4Network],
          ) -> tuple[list[IPv4Network], IPv4Address, int] | None:
    """One flow the rule is written for: its sources, one destination address, its first port."""
    if str(rule.get("protocol", "*")).lower() not in ("*", "tcp", "any"):
        return None
    sources = rule_networks(rule, "source", vnet)
    destinations = [d for d in rule_networks(rule, "destination", vnet) if d.prefixlen > 0] or targets
    ports = [rule.get("destinationPortRange"), *(rule.get("destinationPortRanges") or [])]
    first = next((str(p) for p in ports if p), "*")
    port = 1 if first == "*" else int(first.split("-")[0])
    if not sources or not destinations:
        return None
    target = destinations[0]
    return sources, (target.network_address if target.prefixlen == 32 else next(target.hosts())), port


def shadows(inputs: Inputs) -> dict[tuple[str, str], Shadow]:
    """(NSG, rule) -> how the rule is shadowed, for every shadowed inbound rule of the side."""
    graph = NetworkGraph(inputs)
    vnet = [IPv4Network(inputs.plan.network.vnet_cidr)]
    subnets: dict[str, list[IPv4Network]] = {}
    for subnet in graph.of(SUBNET):
        nsg = graph.by_reference(NSG, subnet.inputs.get("networkSecurityGroup"), "networkSecurityGroupName")
        if nsg is not None and subnet.inputs.get("addressPrefix"):
            subnets.setdefault(nsg.name, []).append(IPv4Network(str(subnet.inputs["addressPrefix"])))
    found = {}
    for nsg in graph.of(NSG):
        rules = list(nsg.inputs.get("securityRules") or [])
        by_name = _ordered(rules)
        for name, rule in by_name.items():
            flow = _flow(rule, subnets.get(nsg.name) or vnet, vnet)
            if flow is None:
                continue
            verdicts = [admits(rules, source, [flow[1]], flow[2], vnet) for source in flow[0]]
            deciding = [by for verdict, by in verdicts if by != name and by in by_name
                        and int(by_name[by].get("priority", 65000)) < int(rule.get("priority", 65000))
                        and (verdict == "deny") == (str(rule.get("access")).lower() == "allow")]
            if deciding:
                found[(nsg.name, name)] = Shadow(nsg.name, name, str(rule.get("access")), deciding[0])
    return found


NETWORK_TYPES = (NSG, SUBNET, "azure-native:network:NetworkInterface", "azure-native:network:LoadBalancer")


def _calls_changed(diff: StackDiff) -> bool:
    """A host's rendered files call an address:port they did not (a line added that names one)."""
    return any(connections.ADDRESS_PORT.search(line) for f in diff.files if f.host
               for line in f.diff.splitlines() if line.startswith("+") and not line.startswith("+++"))


def _deployer(entry: Mapping[str, Any] | None) -> tuple[str, tuple[str, ...]]:
    deployer = (plan_of(entry).get("network") or {}).get("deployer") or {}
    return str(deployer.get("network") or ""), tuple(str(c) for c in deployer.get("cidrs") or ())


def deployer_moved(diff: StackDiff) -> list[Finding]:
    """deployer.cidrs changed: the ranges `pulumi up` may run from move, in the run that moves them.
    The NSG rule admitting the deployer to the apiservers' port and the storage accounts' firewall
    IP rules are updated in place (kilonode.azure.network, kilonode.azure.common.storage_ip_rules),
    and the same `pulumi up` then talks to the apiserver for the in-cluster half; a runner the head
    no longer admits loses both from the moment Azure applies the update, this run's remaining
    steps included (its in-cluster updates time out), and every later run."""
    if not diff.base or not diff.head:
        return []
    (net_was, was), (net_now, now) = _deployer(diff.base), _deployer(diff.head)
    if (net_was, set(was)) == (net_now, set(now)) or not was:
        return []
    dropped = [c for c in was if c not in now]
    if not dropped and net_was == net_now:
        return []  # only widened: every runner that could run it still can
    return [Finding(MEDIUM, "deployer-moved", (
        f"deployer.cidrs {', '.join(was)} -> {', '.join(now) or 'none'}"
        + (f" (network {net_was} -> {net_now})" if net_was != net_now else "")
        + ": once Azure applies the updated NSG rule and storage firewalls, a runner in "
        + (', '.join(dropped) or 'the old range')
        + " no longer reaches the apiservers' port or the image and backup storage accounts: if this `pulumi up` "
        "runs from there, its own in-cluster half times out after the update, and every later run must come from "
        "the new range. Move in two changes: first add the new range beside the old and apply it from the old "
        "runner, then remove the old range in a change applied from the new runner"),
        ("deployer.cidrs",))]


# RFC 1918 and the shared address space (RFC 6598): addresses only a private network (the VNet, a
# peering, a VPN) brings, never a runner on the Internet
_PRIVATE = tuple(IPv4Network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10"))
# Past a /16 (65,536 addresses) a range is no runner's egress: a CI provider's or an office's NAT
# addresses are a handful of /24s or smaller, while a /16 or wider is a whole provider's or
# region's space (20.0.0.0/8 is Azure's own: every tenant's VMs there).
EXPOSURE_HIGH_ADDRESSES = 65_536
_APISERVER_PORT = 6443
_STORAGE = "azure-native:storage:StorageAccount"
# what each exposed target holds, as the review says it (kilonode.azure: the storage accounts'
# firewalls take deployer.cidrs, kilonode.azure.common.storage_ip_rules)
_HOLDS = {
    "apiserver": "the apiservers' port 6443 (every request still needs a client certificate)",
    "etcd-backup": "the etcd backup storage account, whose snapshots hold every Secret of the cluster",
    "image-vhds": "the image storage account, the VHDs every node boots from",
}


def _public(prefixes: list[str]) -> list[IPv4Network]:
    """The prefixes outside the private ranges, merged (a world prefix is 0.0.0.0/0)."""
    nets = []
    for prefix in prefixes:
        text = "0.0.0.0/0" if str(prefix).lower() in ("*", "any", "internet") else str(prefix)
        try:
            net = IPv4Network(text, strict=False)
        except ValueError:
            continue
        for private in _PRIVATE:
            if net.subnet_of(private):
                break
        else:
            nets.append(net)
    return list(collapse_addresses(nets))


def _covers_port(rule: Mapping[str, Any], port: int) -> bool:
    ranges = [rule.get("destinationPortRange"), *(rule.get("destinationPortRanges") or [])]
    for r in (str(x) for x in ranges if x is not None):
        low, _, high = r.partition("-")
        if r == "*" or (low.isdigit() and int(low) <= port <= int(high or low)):
            return True
    return False


def _public_exposure(entry: Mapping[str, Any] | None) -> dict[str, list[IPv4Network]]:
    """target -> the public prefixes the side's recorded resources admit to it: the apiservers' port
    (NSG rules that Allow inbound to 6443) and each storage account's firewall (ipRules Allow)."""
    found: dict[str, list[str]] = {}
    for r in (entry or {}).get("resources") or []:
        inputs = r.get("inputs") or {}
        if r.get("type") == NSG:
            for rule in inputs.get("securityRules") or []:
                if (str(rule.get("access")).lower() == "allow" and str(rule.get("direction", "Inbound")) == "Inbound"
                        and _covers_port(rule, _APISERVER_PORT)):
                    found.setdefault("apiserver", []).extend(
                        str(x) for x in [rule.get("sourceAddressPrefix"), *(rule.get("sourceAddressPrefixes") or [])]
                        if x is not None)
        elif r.get("type") == _STORAGE:
            rules = (inputs.get("networkRuleSet") or {}).get("ipRules") or []
            name = str(r.get("name") or "")
            target = next((k for k in _HOLDS if k != "apiserver" and k in name), name)
            found.setdefault(target, []).extend(str(i.get("iPAddressOrRange")) for i in rules
                                                if str(i.get("action", "Allow")).lower() == "allow")
    return {target: _public(prefixes) for target, prefixes in found.items()}


def _count(nets: list[IPv4Network]) -> int:
    return sum(n.num_addresses for n in nets)


def exposure_grown(diff: StackDiff) -> list[Finding]:
    """More public addresses admitted to the apiservers' port or a storage account's firewall at the
    head than at the base (deployer.cidrs, or any rule that admits 6443 from outside the private
    ranges), read from each side's recorded NSGs and storage accounts: medium, high past a /16
    (EXPOSURE_HIGH_ADDRESSES) or with the world. deployer-moved says who can still run `pulumi up`;
    this says who else can now knock."""
    if not diff.base or not diff.head:
        return []
    before, after = _public_exposure(diff.base), _public_exposure(diff.head)
    grown = {t: (_count(before.get(t, [])), _count(nets), nets) for t, nets in after.items()
             if _count(nets) > _count(before.get(t, []))}
    if not grown:
        return []
    widest = max(now for _, now, _ in grown.values())
    level = HIGH if widest > EXPOSURE_HIGH_ADDRESSES else MEDIUM
    said = "; ".join(f"{_HOLDS.get(t, f'storage account {t}')}: {was:,} -> {now:,} public addresses "
                     f"({', '.join(str(n) for n in nets[:3])}{' and more' if len(nets) > 3 else ''})"
                     for t, (was, now, nets) in sorted(grown.items()))
    return [Finding(level, "exposure-grown", (
        f"more of the Internet is admitted to what only the deployer should reach: {said}. Each admitted address "
        "can open TLS to the apiservers and try the storage accounts' endpoints; the firewall is the layer this "
        "change removes, leaving only the credentials"
        + (f" (past a /16, {EXPOSURE_HIGH_ADDRESSES:,} addresses, a range is no runner's egress but a whole "
           "provider's or region's space: 20.0.0.0/8 is Azure's own, every tenant's VMs)"
           if level == HIGH else "")
        + ". Admit only the runners' own egress addresses (deployer.cidrs, a /32 per NAT address), or run "
        "`pulumi up` from a VNet of yours (`deployer.network: peered` with its vnetId: no public rule at all; "
        "docs/azure.md, \"How `pulumi up` reaches the apiserver\")"), tuple(sorted(grown)))]


def assess(diff: StackDiff) -> list[Finding]:
    # a verdict moves only with the rules, the subnets and addresses, or what a host calls
    network_changed = any(c.type in NETWORK_TYPES for c in diff.resources)
    if not network_changed and not _calls_changed(diff):
        return []
    base, head = sides.inputs(diff, "base"), sides.inputs(diff, "head")
    if base is None or head is None:
        return []
    nsgs_changed = any(c.type == NSG for c in diff.resources)
    before, after = (shadows(base), shadows(head)) if nsgs_changed else ({}, {})
    new = [s for key, s in after.items() if key not in before and _present(base, *key)]
    refused = _refused(base, head)
    found = []
    grouped: dict[str, list[Shadow]] = {}
    for shadow in new:
        grouped.setdefault(shadow.by, []).append(shadow)
    for by, shadowed in sorted(grouped.items()):
        calls = _calls([r for r in refused if r[2] == by])
        refused = [r for r in refused if r[2] != by]
        found.append(_shadow_finding(diff.stack, by, shadowed, calls))
    if refused:
        found.append(Finding(HIGH, "connection-refused", (
            f"connections the rendered files make are refused at the head and admitted at the base: "
            f"{_calls(refused)} (rule {', '.join(sorted({r[2] for r in refused}))}). {GATE}those calls time out "
            "from the moment the NSG is updated"), tuple(sorted({where for where, _, _ in refused}))))
    return found


_TARGET = re.compile(r"(\d+\.\d+\.\d+\.\d+):(\d+) \(")


def _calls(refused: list[tuple[str, str, str]]) -> str:
    """The refused calls by port: "TCP 2379 from etcd-main-0, etcd-main-1 (to 10.0.1.10, ...)"."""
    by_port: dict[str, tuple[set[str], set[str]]] = {}
    for where, what, _ in refused:
        for address, port in _TARGET.findall(what):
            hosts, targets = by_port.setdefault(port, (set(), set()))
            hosts.add(where)
            targets.add(address)
    return "; ".join(f"TCP {port} from {', '.join(sorted(hosts))} (to {', '.join(sorted(targets))})"
                     for port, (hosts, targets) in sorted(by_port.items(), key=lambda item: int(item[0])))


def _present(inputs: Inputs, nsg: str, rule: str) -> bool:
    return any(r.name == nsg and any(x.get("name") == rule for x in r.inputs.get("securityRules") or [])
               for r in inputs.of_type(NSG))


def _refused(base: Inputs, head: Inputs) -> list[tuple[str, str, str]]:
    """(host, what, the refusing rule) for each connection break the head has and the base does not."""
    def breaks(inputs: Inputs) -> dict[tuple[str, str], str]:
        return {(f.where, _RULE.sub("", f.what)): f.what for f in connections.check(inputs) if f.level == "break"}

    was, now = breaks(base), breaks(head)
    return [(where, what, (_RULE.search(what) or _RULE.search("(rule ?)")).group(1))  # type: ignore[union-attr]
            for (where, key), what in sorted(now.items()) if (where, key) not in was]


def _shadow_finding(stack: str, by: str, shadowed: list[Shadow], calls: str) -> Finding:
    nsgs = sorted({s.nsg.removeprefix(f"{stack}-") for s in shadowed})
    rules = sorted({s.rule for s in shadowed})
    allows = [s for s in shadowed if s.access.lower() == "allow"]
    effect = ("the flows those allow rules were written for are refused before they are reached" if allows else
              "the flows those deny rules were written to refuse are admitted before they are reached")
    said = f" Connections the rendered files make, now refused: {calls}. {GATE}they time out at once." if calls else ""
    return Finding(HIGH, "nsg-shadowed", (
        f"rule {by} now comes before {', '.join(rules)} in {', '.join(nsgs)} and decides their flows: {effect} "
        f"(Azure evaluates an NSG's rules by priority and the first match decides).{said} Give {by} a priority "
        "after the rules it must not override"), tuple(sorted({s.nsg for s in shadowed})))
