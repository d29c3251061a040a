"""What a stack admits from the world, per resource: every setting through which anyone on the
Internet may reach something, each under a stable key so that a review reports the ones the
head adds (a rule inserted anywhere in a list, a prefix widened to the world, a public address
where there was none).

The world, as Azure writes it in an NSG rule's source: `*` and `Any` (every address),
`Internet` (the service tag for addresses outside the VNet and Azure's own ranges) and
`0.0.0.0/0` / `::/0` (network-security-groups-overview.md, "Security rules"; service-tags-overview.md).
Also: a storage account whose network rules default to Allow or that takes public blob
access; a public IP on a control-plane machine (etcd, apiservers).

Pure: recorded resources (type, name, inputs) in, {key: what} out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from kilonode.review.rules import CONTROL_PLANE_ROLES, NSG, PUBLIC_IP, ROLE_TAG

RULE = "azure-native:network:SecurityRule"
STORAGE = "azure-native:storage:StorageAccount"

WORLD = frozenset({"*", "any", "internet", "0.0.0.0/0", "::/0", "0.0.0.0/0.0.0.0"})


def is_world(prefix: Any) -> bool:
    return isinstance(prefix, str) and prefix.strip().lower() in WORLD


def _list(rule: Mapping[str, Any], single: str, plural: str) -> list[str]:
    found = [str(p) for p in rule.get(plural) or []]
    if rule.get(single) not in (None, ""):
        found.append(str(rule[single]))
    return found


def _ports(rule: Mapping[str, Any]) -> str:
    ports = _list(rule, "destinationPortRange", "destinationPortRanges") or ["*"]
    return "every port" if "*" in ports else "port " + ", ".join(ports)


def _rule(owner: str, rule: Mapping[str, Any]) -> tuple[str, tuple[str, str]] | None:
    if str(rule.get("access", "")).lower() != "allow" or str(rule.get("direction", "Inbound")).lower() != "inbound":
        return None
    world = [p for p in _list(rule, "sourceAddressPrefix", "sourceAddressPrefixes") or ["*"] if is_world(p)]
    if not world:
        return None
    name = rule.get("name") or "(unnamed)"
    return (f"nsg-rule:{owner}:{name}",
            (owner, f"rule {name!r} (priority {rule.get('priority')}) admits {_ports(rule)} "
                    f"({rule.get('protocol', '*')}) from {', '.join(world)}, i.e. the whole Internet"))


Exposure = tuple[str, str]  # (the resource it is on, what it admits)


def exposures(resources: Iterable[Mapping[str, Any]]) -> dict[str, Exposure]:
    """key -> (resource, what), for each way in from the world."""
    found: dict[str, Exposure] = {}
    for r in resources:
        if not r.get("custom", True):
            continue
        inputs = r.get("inputs") or {}
        kind, name = r.get("type"), str(r.get("name"))
        if kind == NSG:
            for rule in inputs.get("securityRules") or []:
                if isinstance(rule, Mapping) and (hit := _rule(name, rule)):
                    found[hit[0]] = hit[1]
        elif kind == RULE:
            if hit := _rule(str(inputs.get("networkSecurityGroupName") or name), {**inputs, "name": name}):
                found[hit[0]] = hit[1]
        elif kind == STORAGE:
            rules = inputs.get("networkRuleSet") or {}
            if str(rules.get("defaultAction", "Allow")).lower() == "allow" \
                    and str(inputs.get("publicNetworkAccess", "Enabled")).lower() != "disabled":
                found[f"storage-network:{name}"] = (name, "storage account accepts every network (networkRuleSet."
                                                          "defaultAction Allow, public network access on)")
            if inputs.get("allowBlobPublicAccess") is True:
                found[f"storage-anonymous:{name}"] = (name, "storage account allows anonymous blob reads")
            for ip in rules.get("ipRules") or []:
                if isinstance(ip, Mapping) and is_world(ip.get("iPAddressOrRange") or ip.get("ipAddressOrRange")):
                    found[f"storage-ip:{name}"] = (name, "storage account admits 0.0.0.0/0 in its IP rules")
        elif kind == PUBLIC_IP:
            tags = inputs.get("tags") or {}
            role = tags.get(ROLE_TAG) if isinstance(tags, Mapping) else None
            if role in CONTROL_PLANE_ROLES:
                found[f"public-ip:{name}"] = (name, f"a public IP on a {role} machine: the control plane reachable "
                                                    "from the Internet, wherever an NSG rule lets it")
    return found


def new_exposures(base: Iterable[Mapping[str, Any]], head: Iterable[Mapping[str, Any]]) -> dict[str, Exposure]:
    """The ways in from the world the head has and the base did not (or that say more now)."""
    before, after = exposures(base), exposures(head)
    return {k: v for k, v in after.items() if before.get(k) != v}
