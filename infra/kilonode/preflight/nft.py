"""The nftables rules kilonode writes on its nodes, read back and evaluated for a new TCP
connection, as the kernel runs a base chain: rule by rule, the first rule whose matches all hold
decides (accept ends this chain, drop the packet), the chain's policy when none does (nft(8),
"VERDICT STATEMENT", "CHAINS"). Only the statements kilonode's rulesets use are understood:
`iifname`/`oifname` (a trailing * matches a prefix), `ip saddr` (an address, prefix or set of
them), `tcp dport` (a port or set), `counter` and `comment`; any other rule is reported as not
understood rather than guessed at.

A source is a network, not one address: each rule takes the part of it its `ip saddr` covers, as
an NSG rule does (kilonode.preflight.checks.deployer_path), so a rule widened to part of a subnet
is seen.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fnmatch import fnmatchcase
from ipaddress import IPv4Network

_COMMENT = re.compile(r'\s*comment "[^"]*"\s*$')
_CHAIN = re.compile(r"^chain (\S+) \{$")
_HOOK = re.compile(r"^type filter hook (\w+) priority [^;]+; policy (accept|drop);$")
_MATCHES = {
    "iif": re.compile(r'\biifname "([^"]+)"'),
    "oif": re.compile(r'\boifname "([^"]+)"'),
    "saddr": re.compile(r"\bip saddr (\{[^}]*\}|\S+)"),
    "dport": re.compile(r"\btcp dport (\{[^}]*\}|\d+)"),
}
_VERDICT = re.compile(r"\b(accept|drop)$")


@dataclass(frozen=True)
class Rule:
    text: str
    iif: str | None
    oif: str | None
    saddr: tuple[IPv4Network, ...] | None
    dports: tuple[int, ...] | None
    verdict: str | None  # accept, drop, continue (no verdict: counts and goes on); None: not understood


@dataclass(frozen=True)
class Chain:
    name: str
    hook: str
    policy: str
    rules: tuple[Rule, ...]


@dataclass(frozen=True)
class Packet:
    """A new TCP connection: the interfaces it comes in and goes out on, its destination port."""

    iif: str
    dport: int
    oif: str = ""


def _items(text: str) -> list[str]:
    return [item.strip() for item in text.strip("{} ").split(",") if item.strip()]


def parse_rule(line: str) -> Rule:
    text = _COMMENT.sub("", line).strip()
    found = {key: pattern.search(text) for key, pattern in _MATCHES.items()}
    verdict = _VERDICT.search(text)
    rest = text
    for match in (*found.values(), verdict):
        rest = rest.replace(match.group(0), " ") if match else rest
    understood = not rest.replace("counter", " ").split()
    try:
        saddr = tuple(IPv4Network(a, strict=False) for a in _items(found["saddr"][1])) if found["saddr"] else None
        dports = tuple(int(p) for p in _items(found["dport"][1])) if found["dport"] else None
    except ValueError:
        understood, saddr, dports = False, None, None
    return Rule(text=text, iif=found["iif"][1] if found["iif"] else None,
                oif=found["oif"][1] if found["oif"] else None, saddr=saddr, dports=dports,
                verdict=(verdict[1] if verdict else "continue") if understood else None)


def chains(ruleset: str) -> list[Chain]:
    """Every base chain of the ruleset's table blocks."""
    lines = [line.split("#", 1)[0].strip() if not line.strip().startswith("#!") else "" for line in
             ruleset.splitlines()]
    found: list[Chain] = []
    for start, line in enumerate(lines):
        name = _CHAIN.match(line)
        hook = _HOOK.match(lines[start + 1]) if name and start + 1 < len(lines) else None
        if not name or not hook:
            continue
        rules = []
        for rule in lines[start + 2:]:
            if rule == "}":
                break
            if rule:
                rules.append(parse_rule(rule))
        found.append(Chain(name[1], hook[1], hook[2], tuple(rules)))
    return found


def _minus(nets: list[IPv4Network], taken: list[IPv4Network]) -> list[IPv4Network]:
    left = list(nets)
    for t in taken:
        left = [part for n in left if not n.subnet_of(t)
                for part in (n.address_exclude(t) if t.subnet_of(n) else [n])]
    return left


def _overlap(nets: list[IPv4Network], others: tuple[IPv4Network, ...]) -> list[IPv4Network]:
    return [n if n.subnet_of(o) else o for n in nets for o in others if n.subnet_of(o) or o.subnet_of(n)]


def verdicts(chain: Chain, packet: Packet, source: IPv4Network) -> list[tuple[IPv4Network, str, str]]:
    """(part of `source`, "accept"/"drop"/"unknown", the deciding rule or "policy") for the packet
    from every address of `source`."""
    remaining, decided = [source], []
    for rule in chain.rules:
        if not remaining:
            break
        if rule.iif is not None and not fnmatchcase(packet.iif, rule.iif):
            continue
        if rule.oif is not None and not fnmatchcase(packet.oif, rule.oif):
            continue
        if (rule.dports is not None and packet.dport not in rule.dports) or rule.verdict == "continue":
            continue
        matched = remaining if rule.saddr is None else _overlap(remaining, rule.saddr)
        decided += [(part, rule.verdict or "unknown", rule.text) for part in matched]
        remaining = _minus(remaining, matched)
    return decided + [(part, chain.policy, "policy") for part in remaining]
