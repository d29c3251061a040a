"""Scale-set model changes that the fleet-rollout line would misjudge (a tenth independent trace of
`kilonode diff` on research-7500):

- custom data that changes while nothing a running instance does can (`custom-data-inert`). Growing
  an InfiniBand pool (a100-ib 5,000 -> 5,200 nodes) adds scale sets, and the shared group's rendered
  fabric-label script (kilonode.render.pool.fabric_script, templates/usr/local/lib/kilonode/
  fabric-label.j2) gains a case arm naming them (`research-7500-a100-ib-05[0-1]) ;;`). That script is
  embedded in the group's user-data, so every existing scale set of the group gets new custom data,
  and fleet-rollout used to ask for a 1,000-node cordon-drain-upgrade-reimage. But the script's only
  output is the host name less its last 6 characters (the scale set's computer-name prefix, which
  kilonode.azure.node_pool sets to the scale set's name), and every arm does the same (`;;`): for an
  instance of an existing scale set the only question is whether its own name matches some arm, and
  that answer is the same on both sides. So nothing a running instance does changes, whether it is
  reimaged or not; a new or reimaged-after-upgrade instance gets the new script, which is equally
  right for it. Judged strictly: the group's only changed rendered files are the script and the
  user-data, the user-data differs by the script's content alone (parsed as the cloud-config it is:
  a YAML comment is inert), the script differs only in its case arms, each arm is a plain glob of
  lowercase letters, digits, '-' and brackets with an empty body, no existing scale set (at the base
  and still at the head) changes whether it matches (a shrink's
  re-merged arms included), and nothing else that goes into the custom data
  moved (the join token's generation, kilonode.review.risks._token_generations; the TLS and random
  resources whose values the second MIME part carries, kilonode.azure.custom_data and
  kilonode.azure.tls). Anything else keeps fleet-rollout.
- SSH keys (`ssh-keys-not-on-running-nodes`): a change to a pool's `sshKeys` changes only the scale
  sets' model (virtualMachineProfile.osProfile.linuxConfiguration.ssh.publicKeys). The catalogue
  (infra/kilonode/catalog/effects.toml) says that path applies "to new instances and to those upgraded
  to the new model (`az vmss update-instances`), not to a reimaged one, which keeps its own model", and
  Azure writes a machine's keys when it provisions it (docs/operations.md, "Getting a shell on a
  machine": "a key added later reaches a pool's new and reimaged instances, but an existing VM only
  when it is replaced"), so no running node gets a new key from `pulumi up`, and none loses a
  removed one. The review used to say nothing of it. A control-plane VM's key change is Azure's
  PropertyChangeNotAllowed (effects.toml, VirtualMachine osProfile.linuxConfiguration.ssh.publicKeys:
  refused), which risks.refused already says as update-refused.

Pure: a StackDiff in, findings out.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from kilonode.render.files import USER_DATA
from kilonode.render.pool import FABRIC_SCRIPT
from kilonode.review import rules
from kilonode.review.compare import UPDATE, StackDiff, covers
from kilonode.review.finding import MEDIUM, Finding
from kilonode.yamlio import load_yaml

VMSS = "azure-native:compute:VirtualMachineScaleSet"
SSH_KEYS = "virtualMachineProfile.osProfile.linuxConfiguration.ssh.publicKeys"
# the resources whose values the custom data's second part carries: certificates, keys, join tokens
SECRET_TYPES = ("tls:", "random:")
# one arm of the fabric-label case: a plain glob, an empty body (fabric-label.j2)
ARM = re.compile(r"^\s*([a-z0-9\-\[\]]+)\) ;;$")


@dataclass(frozen=True)
class Inert:
    """A registration group (role) whose custom-data change no running instance can see."""

    role: str
    added: tuple[str, ...]  # the arms only the head has
    removed: tuple[str, ...]  # the arms only the base has (scale sets removed with the change)


def _vmss(entry: Mapping[str, Any] | None) -> dict[str, Mapping[str, Any]]:
    return {r["name"]: r for r in (entry or {}).get("resources") or []
            if isinstance(r, Mapping) and r.get("type") == VMSS and isinstance(r.get("name"), str)}


def _prefix(record: Mapping[str, Any]) -> str | None:
    """The scale set's computer-name prefix: what fabric-label sees of an instance's host name."""
    profile = ((record.get("inputs") or {}).get("virtualMachineProfile") or {}).get("osProfile") or {}
    prefix = profile.get("computerNamePrefix") if isinstance(profile, Mapping) else None
    return prefix if isinstance(prefix, str) else None


def _role(record: Mapping[str, Any]) -> str | None:
    return rules.Resource(VMSS, str(record.get("name")), record.get("inputs") or {}).role


def _arms(script: str) -> tuple[list[str], list[str], list[str]] | None:
    """(lines before the arms, the arms' patterns, lines after), or None where the arms are not one
    run of lines or a pattern is not a plain glob."""
    lines = script.splitlines()
    at = [i for i, line in enumerate(lines) if ARM.match(line)]
    if not at or at != list(range(at[0], at[-1] + 1)):
        return None
    patterns = [ARM.match(lines[i]).group(1) for i in at]  # type: ignore[union-attr]
    return lines[:at[0]], patterns, lines[at[-1] + 1:]


def _accepts(patterns: list[str], name: str) -> bool:
    # fnmatchcase on the restricted alphabet (ARM: no '!', '*', '?', quotes) reads a pattern as the
    # shell's case does (POSIX 2.13.1: bracket expressions and ranges, other characters themselves)
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def _cloud_config(text: str) -> Any:
    try:
        return text.split("\n", 1)[0], load_yaml(text)
    except yaml.YAMLError:
        return None


def _without_script(config: Any) -> tuple[Any, str | None]:
    """The cloud-config with the fabric script's content taken out, and that content."""
    if not (isinstance(config, tuple) and isinstance(config[1], dict)):
        return config, None
    first, body = config
    files, content = [], None
    for f in body.get("write_files") or []:
        if isinstance(f, Mapping) and f.get("path") == "/" + FABRIC_SCRIPT:
            content = f.get("content")
            f = {k: v for k, v in f.items() if k != "content"}
        files.append(f)
    return (first, {**body, "write_files": files}), content if isinstance(content, str) else None


def _generations(plan: Mapping[str, Any]) -> dict[str, set[int]]:
    found: dict[str, set[int]] = {}
    for token in plan.get("joinTokens") or []:
        if isinstance(token, Mapping) and token.get("pool") is not None:
            found.setdefault(str(token["pool"]), set()).add(int(token.get("generation") or 0))
    return found


def _plan(entry: Mapping[str, Any] | None) -> Mapping[str, Any]:
    text = ((entry or {}).get("files") or {}).get("plan.yaml")
    try:
        plan = load_yaml(text) if isinstance(text, str) else None
    except yaml.YAMLError:
        return {}
    return plan if isinstance(plan, Mapping) else {}


def inert_custom_data(diff: StackDiff) -> dict[str, Inert]:
    """role -> why its scale sets' new custom data changes nothing a running instance does, for the
    roles where that holds (module docstring: every condition strict)."""
    if any(c.type.startswith(SECRET_TYPES) for c in diff.resources):
        return {}
    if _generations(_plan(diff.base)) != _generations(_plan(diff.head)):
        return {}
    base_files = (diff.base or {}).get("files") or {}
    head_files = (diff.head or {}).get("files") or {}
    base_sets, head_sets = _vmss(diff.base), _vmss(diff.head)
    hosts: dict[str, set[str]] = {}
    for f in diff.files:
        if f.host.startswith("pool-"):
            hosts.setdefault(f.host, set()).add(f.path.split("/", 1)[1] if "/" in f.path else f.path)
    found = {}
    for host, paths in sorted(hosts.items()):
        if paths != {USER_DATA, FABRIC_SCRIPT}:
            continue
        script = f"{host}/{FABRIC_SCRIPT}"
        before, after = base_files.get(script), head_files.get(script)
        if not (isinstance(before, str) and isinstance(after, str)):
            continue
        base_cfg, base_embedded = _without_script(_cloud_config(str(base_files.get(f"{host}/{USER_DATA}"))))
        head_cfg, head_embedded = _without_script(_cloud_config(str(head_files.get(f"{host}/{USER_DATA}"))))
        if base_cfg is None or base_cfg != head_cfg or base_embedded != before or head_embedded != after:
            continue
        was, now = _arms(before), _arms(after)
        if was is None or now is None or was[0] != now[0] or was[2] != now[2]:
            continue
        # every scale set on both sides: is it accepted before and after alike (its own, and no other
        # role's newly let in)
        kept = [_prefix(r) for name, r in base_sets.items() if name in head_sets]
        if any(p is None for p in kept) or any(_accepts(was[1], p) != _accepts(now[1], p) for p in kept if p):
            continue
        # and the group's existing scale sets are this role's, accepted on both sides
        own = [_prefix(r) for name, r in base_sets.items() if name in head_sets and _role(r) == host]
        if not own or not all(p and _accepts(now[1], p) for p in own):
            continue
        found[host] = Inert(host, tuple(p for p in now[1] if p not in was[1]),
                            tuple(p for p in was[1] if p not in now[1]))
    return found


def inert_findings(diff: StackDiff, inert: Mapping[str, Inert], sets: Mapping[str, set[str]],
                   capacity: Mapping[str, int]) -> list[Finding]:
    """One line per role whose custom data changes inertly: `sets` role -> its existing scale sets
    whose custom data the change touches."""
    found = []
    for role, why in sorted(inert.items()):
        names = sorted(sets.get(role) or ())
        if not names:
            continue
        nodes = sum(capacity.get(n, 0) for n in names)
        arms = "; ".join(part for part in (
            f"added: {', '.join(f'`{p}`' for p in why.added)}" if why.added else "",
            f"removed: {', '.join(f'`{p}`' for p in why.removed)}" if why.removed else "") if part)
        found.append(Finding(
            MEDIUM, "custom-data-inert",
            f"every scale set of {role} ({len(names)}, {nodes:,} nodes) gets a new custom data in its model, but "
            "nothing a running instance does changes: the only difference is the fabric-label script's case arms "
            f"({arms}), which accept every remaining scale set as before and differ only on scale sets that do not "
            "exist yet or that this change deletes, so each running instance's host name still matches its own "
            "scale set's arm and it names the same fabric. Instances get the new script "
            "when next upgraded and reimaged, and new instances at once; do not roll the pool for this",
            tuple(names)))
    return found


def _keys(record: Mapping[str, Any] | None) -> list[str]:
    os_profile = (((record or {}).get("inputs") or {}).get("virtualMachineProfile") or {}).get("osProfile") or {}
    keys = ((os_profile.get("linuxConfiguration") or {}).get("ssh") or {}).get("publicKeys") or []
    return [str(k.get("keyData")) for k in keys if isinstance(k, Mapping)]


GENERATED = "the key kilonode generates for the role"


def _comment(key: str) -> str:
    """A key as a reader knows it: its comment (user@host), else its type and the start of its data;
    a key kilonode generates (no private half anywhere) as that."""
    if key.startswith("[secret") or "mock:" in key:
        return GENERATED
    parts = key.split()
    return parts[2] if len(parts) > 2 else f"{parts[0]} {parts[1][:16]}..." if len(parts) > 1 else key[:24]


def ssh_keys(diff: StackDiff) -> list[Finding]:
    """A pool's SSH keys changed: medium, one line per pool (module docstring)."""
    pools: dict[str, list[str]] = {}
    added: dict[str, set[str]] = {}
    removed: dict[str, set[str]] = {}
    capacity: dict[str, int] = {}
    for c in diff.resources:
        if c.type != VMSS or c.action != UPDATE or not c.role:
            continue
        if not any(covers(i.path, (SSH_KEYS,)) and not i.ignored for i in c.inputs):
            continue
        pool = c.role.split(".", 1)[0]
        pools.setdefault(pool, []).append(c.name)
        before, after = _keys(c.base), _keys(c.head)
        added.setdefault(pool, set()).update(_comment(k) for k in after if k not in before)
        removed.setdefault(pool, set()).update(_comment(k) for k in before if k not in after)
        sku = ((c.base or {}).get("inputs") or {}).get("sku") or {}
        capacity[c.name] = int(sku.get("capacity") or 0) if isinstance(sku, Mapping) else 0
    found = []
    for pool, names in sorted(pools.items()):
        nodes = sum(capacity[n] for n in names)
        change = "; ".join(part for part in (
            f"added: {', '.join(sorted(added[pool]))}" if added[pool] else "",
            f"removed: {', '.join(sorted(removed[pool]))}" if removed[pool] else "") if part) or "changed"
        # the generated key's private half is nowhere (kilonode.azure.ssh): its staying is no access
        gone = (" A removed key stays authorized on every running node until it is reimaged after the upgrade "
                "or replaced: offboarding by this change alone leaves the key working.") \
            if removed[pool] - {GENERATED} else ""
        found.append(Finding(
            MEDIUM, "ssh-keys-not-on-running-nodes",
            f"{pool}'s SSH keys change ({change}) in the model of its {len(names)} scale set(s) only: none of its "
            f"{nodes:,} running nodes gets the change from `pulumi up`. Azure writes a machine's keys when it "
            "provisions it, so a key reaches new instances at once and a running one only when it is upgraded to "
            "the model (`az vmss update-instances`) and then reimaged (`az vmss reimage`), which restarts it and "
            "kills its pods (docs/operations.md, \"Getting a shell on a machine\"). On-call will find the new key "
            "on no running node: until the pool is rolled, reach a node with Azure's run command (`az vmss "
            "run-command invoke ... --command-id RunShellScript`, the same section), or roll the pool as for new "
            "custom data (cordon and drain first)." + gone, tuple(sorted(names))))
    return found
