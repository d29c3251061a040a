"""identities: no identity a pool node carries can act on the control plane, and no pod of a
pool node can ask for that identity's token.

A managed identity on a scale set hands a token to anything on its instances that reaches the
instance metadata service (IMDS, 169.254.169.254). With Virtual Machine Contributor on the
resource group that holds the apiserver VMs, such a token runs a command on an apiserver VM
through Azure (`runCommand`) and reads the cluster CA's key. Two halves, each a break:

1. From the recorded graph: every user-assigned identity a pool scale set carries
   (`identity.userAssignedIdentities`), every role assignment of its principal (`principalId`),
   and what the assignment's `scope` contains: the subscription contains everything, a resource
   group every resource in it, a resource itself and its children (a VNet its subnets, a
   storage account its containers, a gallery its images). A break when that includes a
   control-plane resource: the etcd and apiserver VMs, what they reference (their NICs, subnets
   and NSGs, the load balancers their NICs sit behind, the image versions they boot, their
   identities), what their identities may write (the etcd snapshot container: the key
   material), and the groups holding any of those. Disks and run commands are children of the
   VMs' group: a role on the group covers them. kilonode keeps the pools in a group of their
   own and scopes each controller's roles to the pools' resources (kilonode.azure.identity).
   A scale set outside the plan's controller pools that carries an identity is a warning: its
   nodes need none. One exception, by what the role holds: a custom role of the graph whose
   actions are all linked-access actions (kilonode.azure.identity.LINKED_ACCESS_ACTIONS:
   cloud-controller-manager's `virtualNetworks/joinLoadBalancer/action` on the VNet, which
   IP-based backend pools need) changes nothing in its scope; the flows such a pool brings to a
   control-plane address keep their source and meet the control plane's NSGs as direct ones do
   (kilonode.azure.identity says why). Any other action beside them, or a built-in role, and the
   assignment is judged by its scope as every other.
1b. From the recorded graph: every role assignment whose role may write scale-set models
   (virtualMachineScaleSets/write, by name or wildcard; Owner, Contributor, Virtual Machine Contributor)
   covers only scale sets the autoscaler scales (its node groups): a model is what every new instance
   boots, so a wider scope is root on the next instances of every pool it reaches. A break.
2. From each pool role's user-data (what its nodes are given): the metadata block, which drops
   pods' traffic to IMDS (every port) and to the WireServer (168.63.129.16, TCP 80 and 32526)
   on the forward hook, is written, loaded by its unit, started with the node's units, and
   required by the kubelet (kilonode.render.metadata_block). Without it, any pod on the node
   gets the token of every identity the scale set carries.

What no offline check shows: role assignments made outside this program (by hand, by policy,
inherited from a management group), and a pod allowed on the host network (it sends as the
host, past the block): pod security must keep such pods off nodes that carry an identity.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

import yaml

from kilonode.azure.identity import LINKED_ACCESS_ACTIONS
from kilonode.azure.mockplan import AZURE_NAME_INPUT, MOCK_PRINCIPAL
from kilonode.plan.wellknown import AZURE_IMDS_ADDRESS, AZURE_WIRESERVER_ADDRESS, AZURE_WIRESERVER_TCP_PORTS
from kilonode.preflight.model import Finding, Inputs, Resource
from kilonode.preflight.nodes import KUBELET_UNIT
from kilonode.render import metadata_block
from kilonode.render.files import USER_DATA
from kilonode.yamlio import load_yaml

NAME = "identities"
TITLE = "no pool identity reaches a control-plane resource; pods of every pool are kept from IMDS"

SCALE_SET = "azure-native:compute:VirtualMachineScaleSet"
VM = "azure-native:compute:VirtualMachine"
ROLE_ASSIGNMENT = "azure-native:authorization:RoleAssignment"
RESOURCE_GROUP = "azure-native:resources:ResourceGroup"
ROLE_DEFINITION = "azure-native:authorization:RoleDefinition"
# What the recorded graph names (kilonode.azure.mockplan): a resource's ID is
# `mock:<type>::<logical name>`, a user-assigned identity's principal MOCK_PRINCIPAL<logical name>;
# each resource's own name is its AZURE_NAME_INPUT input.
# Built-in roles by GUID, for the message ("Azure built-in roles", learn.microsoft.com/azure/
# role-based-access-control/built-in-roles); any other is shown by its GUID.
ROLE_NAMES = {
    "8e3af657-a8ff-443c-a75c-2fe8c4bcb635": "Owner",
    "b24988ac-6180-42a0-ab88-20f7382dd24c": "Contributor",
    "acdd72a7-3385-48ef-bd42-f606fba81ae7": "Reader",
    "4d97b98b-1d4f-4787-a291-c67834d212e7": "Network Contributor",
    "9980e02c-c2be-4d73-94e8-173b1dc7cf3c": "Virtual Machine Contributor",
    "ba92f5b4-2d11-453d-a403-e96b0029c9fe": "Storage Blob Data Contributor",
}
# How a finding lists what a scope reaches: the machines first, then what reaches into them.
_SHOWN_FIRST = (VM, "azure-native:network:NetworkInterface", "azure-native:network:LoadBalancer",
                "azure-native:storage:BlobContainer")
_MOCK_REF = re.compile(r"mock:(azure-native:[A-Za-z]+:[A-Za-z]+)::([A-Za-z0-9._-]+)")
# /subscriptions/<s>[/resourceGroups/<g>[/providers/<namespace>/<type>/<name>[/<type>/<name>]...]]
_ARM_ID = re.compile(r"^/subscriptions/[^/]+(?:/resourceGroups/(?P<rg>[^/]+)"
                     r"(?:/providers/[^/]+(?P<path>(?:/[^/]+/[^/]+)+))?)?/?$", re.IGNORECASE)


def check(inputs: Inputs) -> list[Finding]:
    blocks = [f for host in inputs.hosts() if host.startswith("pool-")
              for f in _block_findings(host, inputs.host_files(host))]
    return _role_findings(inputs) + _model_write_findings(inputs) + blocks


# --- 1b. who may rewrite a scale set's model ----------------------------------------------------
# virtualMachineScaleSets/write sets a scale set's model (its custom data, image, extensions), which
# every new instance boots: root on each (kilonode.azure.identity). Only the cluster autoscaler needs
# it, on the scale sets it scales (its node groups), and kilonode assigns its role there alone. A role
# that grants it at a wider scope (the pools' resource group: the 15th independent trace of kilonode diff
# moved the autoscaler's 25 per-scale-set assignments to one on the group) reaches every pool, fixed
# GPU pools, the system and the monitoring pool included.
MODEL_WRITE = "microsoft.compute/virtualmachinescalesets/write"
# built-in roles that hold it (Azure built-in roles: Owner, Contributor "*"; Virtual Machine Contributor
# Microsoft.Compute/virtualMachineScaleSets/*)
_BUILT_IN_MODEL_WRITERS = {"8e3af657-a8ff-443c-a75c-2fe8c4bcb635", "b24988ac-6180-42a0-ab88-20f7382dd24c",
                           "9980e02c-c2be-4d73-94e8-173b1dc7cf3c"}


def _grants_model_write(actions: Iterable[str]) -> bool:
    """An action list that holds virtualMachineScaleSets/write, by name or by wildcard (Azure RBAC's `*`)."""
    for action in (a.lower() for a in actions):
        pattern = "^" + re.escape(action).replace("\\*", ".*") + "$"
        if re.match(pattern, MODEL_WRITE):
            return True
    return False


def _model_writers(graph: _Graph) -> dict[str, str]:
    """The role definition GUIDs (lower case) that hold virtualMachineScaleSets/write, with their names: the
    graph's custom roles whose actions grant it, and the built-in roles that do."""
    found = {guid: ROLE_NAMES[guid] for guid in _BUILT_IN_MODEL_WRITERS}
    for role in graph.of(ROLE_DEFINITION):
        actions = [a for p in role.inputs.get("permissions") or [] if isinstance(p, Mapping)
                   for a in p.get("actions") or []]
        if _grants_model_write(actions):
            guid = str(role.inputs.get("roleDefinitionId", "")).lower()
            found[guid] = str(role.inputs.get("roleName") or guid)
    return found


def _model_write_findings(inputs: Inputs) -> list[Finding]:
    graph = _Graph(inputs)
    writers = _model_writers(graph)
    scaled = {g.shard for p in inputs.plan.autoscaled_pools for g in (p.autoscaling.node_groups if p.autoscaling
                                                                      else ())}
    findings = []
    for assignment in graph.of(ROLE_ASSIGNMENT):
        guid = str(assignment.inputs.get("roleDefinitionId", "")).rpartition("/")[2].lower()
        if guid not in writers:
            continue
        scope = str(assignment.inputs.get("scope", ""))
        beyond = sorted(str(r.inputs.get("vmScaleSetName", r.name)) for r in graph.contained(scope)
                        if r.type == SCALE_SET and str(r.inputs.get("vmScaleSetName", r.name)) not in scaled)
        if not beyond:
            continue
        pools = {shard.name: pool.name for pool in inputs.plan.node_pools for shard in pool.shards}
        counts: dict[str, int] = {}
        for name in beyond:
            counts[pools.get(name, "outside the plan")] = counts.get(pools.get(name, "outside the plan"), 0) + 1
        by_pool = ", ".join(f"{pool} {n}" for pool, n in sorted(counts.items()))
        findings.append(Finding(
            NAME, "break", assignment.describe(),
            f"{_principal_name(assignment) or 'its principal'} holds {writers[guid]}, which may write "
            f"scale-set models (virtualMachineScaleSets/write), at {scope}: that reaches {len(beyond)} scale set(s) "
            f"no autoscaler scales (by pool: {by_pool}; {_shown(beyond)}), whose model (custom data, image, "
            "extensions) every new instance boots: a token of it is root on each of those pools' next instances",
            "assign the role on each autoscaled node group's scale set alone (kilonode.azure.identity "
            "grant_node_groups), never on the pools' resource group or wider"))
    return findings


# --- 1. the identities' scopes ------------------------------------------------------------------

class _Graph:
    def __init__(self, inputs: Inputs) -> None:
        self.azure = [r for r in inputs.resources if r.type.startswith("azure-native:")]
        self.by_ref = {(r.type, r.name): r for r in self.azure}

    def referenced(self, resource: Resource) -> list[Resource]:
        """What a resource's inputs point at: recorded IDs, and Azure IDs of a sub-resource
        (a load balancer's backend pool) as the resource in the graph that owns it."""
        text = str(dict(resource.inputs))
        found = [self.by_ref[key] for key in _MOCK_REF.findall(text) if key in self.by_ref]
        for match in re.finditer(r"/resourceGroups/([^/'\"]+)/providers/[^/]+/[^/]+/([^/'\"]+)", text):
            found += [r for r in self.azure if _group(r) == match[1] and _own_name(r) == match[2]]
        return found

    def control_plane(self) -> set[tuple[str, str]]:
        """The control-plane VMs and everything they reference, transitively, and the scopes their
        identities may write to (the snapshot container)."""
        todo = [r for r in self.azure if r.type == VM]
        seen: set[tuple[str, str]] = set()
        while todo:
            r = todo.pop()
            if (r.type, r.name) in seen:
                continue
            seen.add((r.type, r.name))
            todo += self.referenced(r)
        identities = {name for kind, name in seen if kind.endswith(":UserAssignedIdentity")}
        for assignment in self.of(ROLE_ASSIGNMENT):
            if _principal_name(assignment) in identities:
                seen |= {(r.type, r.name) for r in self.contained(str(assignment.inputs.get("scope", "")))}
        return seen

    def of(self, type_: str) -> list[Resource]:
        return [r for r in self.azure if r.type == type_]

    def contained(self, scope: str) -> list[Resource]:
        """Every resource of the graph the scope contains (none: a scope outside the graph)."""
        if (ref := _MOCK_REF.fullmatch(scope)) and (key := (ref[1], ref[2])) in self.by_ref:
            return self._with_children(self.by_ref[key])
        match = _ARM_ID.match(scope)
        if match is None:
            return []
        if match["rg"] is None:  # the subscription
            return list(self.azure)
        in_group = [r for r in self.azure if _group(r) == match["rg"]]
        if match["path"] is None:
            return in_group
        name = match["path"].rpartition("/")[2]  # the innermost resource the ID names
        return [c for r in in_group if _own_name(r) == name for c in self._with_children(r)]

    def _with_children(self, parent: Resource) -> list[Resource]:
        if parent.type == RESOURCE_GROUP:
            return [parent, *(r for r in self.azure if _group(r) == parent.inputs.get("resourceGroupName"))]
        key = AZURE_NAME_INPUT.get(parent.type)
        name = parent.inputs.get(key) if key else None
        return [parent, *(r for r in self.azure if r is not parent and r.type != parent.type and name is not None
                          and _group(r) == _group(parent) and r.inputs.get(key) == name)]


def _group(r: Resource) -> str | None:
    value = r.inputs.get("resourceGroupName")
    return value if isinstance(value, str) else None


def _own_name(r: Resource) -> str | None:
    key = AZURE_NAME_INPUT.get(r.type)
    value = r.inputs.get(key) if key else None
    return value if isinstance(value, str) else None


def _principal_name(assignment: Resource) -> str | None:
    principal = str(assignment.inputs.get("principalId", ""))
    return principal.removeprefix(MOCK_PRINCIPAL) if principal.startswith(MOCK_PRINCIPAL) else None


def _scale_set_identities(vmss: Resource) -> list[str]:
    """The logical names of the user-assigned identities a scale set carries."""
    identity = vmss.inputs.get("identity") or {}
    assigned = identity.get("userAssignedIdentities") or [] if isinstance(identity, Mapping) else []
    return [str(ref).rpartition("::")[2] for ref in (assigned.keys() if isinstance(assigned, Mapping) else assigned)]


def _linked_access_only(graph: _Graph) -> set[str]:
    """The GUIDs of the graph's custom roles whose actions are all linked-access actions: they
    change nothing in their scope (the module docstring says why)."""
    found = set()
    for role in graph.of(ROLE_DEFINITION):
        permissions = role.inputs.get("permissions") or []
        actions = [a for p in permissions if isinstance(p, Mapping) for a in p.get("actions") or []]
        others = [k for p in permissions if isinstance(p, Mapping) for k in ("notActions", "dataActions")
                  if p.get(k)]
        if actions and not others and set(actions) <= LINKED_ACCESS_ACTIONS:
            found.add(str(role.inputs.get("roleDefinitionId", "")).lower())
    return found


def _role_findings(inputs: Inputs) -> list[Finding]:
    graph = _Graph(inputs)
    linked_only = _linked_access_only(graph)
    control_plane = graph.control_plane()
    controller_shards = {s.name for p in inputs.plan.controller_pools for s in p.shards}
    findings: list[Finding] = []
    carried: dict[str, list[str]] = {}
    for vmss in graph.of(SCALE_SET):
        name = str(vmss.inputs.get("vmScaleSetName", vmss.name))
        identity = vmss.inputs.get("identity") or {}
        if "systemassigned" in str(identity.get("type", "") if isinstance(identity, Mapping) else "").lower():
            findings.append(Finding(
                NAME, "break", vmss.describe(),
                "the scale set has a system-assigned identity: its role assignments cannot be traced before Azure "
                "creates it, and any process on its instances that reaches the instance metadata service acts as it",
                "give pool scale sets user-assigned identities only, on the controller pools "
                "(kilonode.azure.identity)"))
        for identity_name in _scale_set_identities(vmss):
            carried.setdefault(identity_name, []).append(name)
            if name not in controller_shards:
                findings.append(Finding(
                    NAME, "warn", vmss.describe(),
                    f"carries identity {identity_name}, but no controller that acts on Azure runs on this pool (the "
                    "plan's controller pools: the system pools): a host-network pod on its nodes gets that identity's "
                    "token for nothing",
                    "attach the controllers' identities to the controller pools' scale sets only "
                    "(kilonode.azure.cluster _node_pools)"))
    for assignment in graph.of(ROLE_ASSIGNMENT):
        principal = _principal_name(assignment)
        if principal not in carried:
            continue
        scope = str(assignment.inputs.get("scope", ""))
        if str(assignment.inputs.get("roleDefinitionId", "")).rpartition("/")[2].lower() in linked_only:
            continue
        reached = sorted((r for r in graph.contained(scope) if (r.type, r.name) in control_plane),
                         key=lambda r: (_SHOWN_FIRST.index(r.type) if r.type in _SHOWN_FIRST else len(_SHOWN_FIRST),
                                        r.name))
        if reached:
            shown = ", ".join(r.describe() for r in reached[:4]) + (f" and {len(reached) - 4} more"
                                                                   if len(reached) > 4 else "")
            guid = str(assignment.inputs.get("roleDefinitionId", "")).rpartition("/")[2]
            role = ROLE_NAMES.get(guid.lower(), guid)
            findings.append(Finding(
                NAME, "break", assignment.describe(),
                f"identity {principal}, carried by {_shown(carried[principal])}, holds role {role} at {scope}, which "
                f"contains control-plane resources ({shown}): any process on those nodes that reaches the instance "
                "metadata service can act on the control plane (with a VM role: run a command on an apiserver VM and "
                "read the cluster CA key)",
                "scope the assignment to the pools' own resources (their resource group, NSG, subnets, scale sets: "
                "kilonode.azure.identity), never the cluster's resource group, the subscription or the VNet"))
    return findings


def _shown(names: list[str]) -> str:
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more scale sets" if len(names) > 3 else "")


# --- 2. the metadata block on every pool role ---------------------------------------------------

def _block_findings(host: str, files: Mapping[str, str]) -> list[Finding]:
    """What the role's nodes are given (its user-data's files) against the metadata block."""
    user_data = _user_data(files.get(USER_DATA, ""))
    written = {str(f.get("path", "")).lstrip("/"): str(f.get("content", ""))
               for f in user_data.get("write_files") or [] if isinstance(f, Mapping)}
    started = [w for cmd in user_data.get("runcmd") or [] if isinstance(cmd, list)
               and cmd[:3] == ["systemctl", "enable", "--now"] for w in cmd[3:]]
    problems = _ruleset_problems(written.get(metadata_block.RULESET))
    unit = written.get(metadata_block.UNIT)
    if unit is None:
        problems.append(f"no {metadata_block.UNIT_NAME} loads it")
    elif f"-f /{metadata_block.RULESET}" not in unit:
        problems.append(f"{metadata_block.UNIT_NAME} does not load /{metadata_block.RULESET}")
    if metadata_block.UNIT_NAME not in started:
        problems.append(f"cloud-init does not start {metadata_block.UNIT_NAME}")
    kubelet = written.get(KUBELET_UNIT, "")
    if not {f"Requires={metadata_block.UNIT_NAME}", f"After={metadata_block.UNIT_NAME}"} <= set(kubelet.splitlines()):
        problems.append(f"the kubelet neither requires nor waits for {metadata_block.UNIT_NAME}: pods may start "
                        "before the block, or without it")
    if not problems:
        return []
    return [Finding(
        NAME, "break", host,
        f"pods on this role's nodes reach the instance metadata service ({'; '.join(problems)}): any pod gets a token "
        "for every identity its scale set carries, and the WireServer's VM settings",
        "render the metadata block into the role's user-data (kilonode.render.metadata_block: "
        f"/{metadata_block.RULESET}, {metadata_block.UNIT_NAME} before the kubelet, which requires it)")]


def _user_data(text: str) -> dict[str, Any]:
    try:
        value = load_yaml(text) if text else None
    except yaml.YAMLError:
        return {}
    return value if isinstance(value, dict) else {}


def _ruleset_problems(text: str | None) -> list[str]:
    if text is None:
        return [f"no /{metadata_block.RULESET} in its user-data"]
    forward = _forward_rules(text)
    if forward is None:
        return [f"/{metadata_block.RULESET} has no chain on the forward hook (pods' traffic passes there)"]
    problems = []
    if not any(_drops(rule, AZURE_IMDS_ADDRESS, ()) for rule in forward):
        problems.append(f"no forward rule drops {AZURE_IMDS_ADDRESS}")
    if not any(_drops(rule, AZURE_WIRESERVER_ADDRESS, AZURE_WIRESERVER_TCP_PORTS) for rule in forward):
        ports = ", ".join(str(p) for p in AZURE_WIRESERVER_TCP_PORTS)
        problems.append(f"no forward rule drops {AZURE_WIRESERVER_ADDRESS} TCP {ports}")
    return problems


def _forward_rules(text: str) -> list[str] | None:
    """The rules of the ruleset's first chain on the forward hook (None: no such chain)."""
    lines = [line.split("#", 1)[0].strip() for line in text.splitlines()]
    for start, line in enumerate(lines):
        if re.match(r"chain \S+ \{$", line) and start + 1 < len(lines) and "hook forward" in lines[start + 1]:
            body = []
            for rule in lines[start + 2:]:
                if rule == "}":
                    return body
                if rule:
                    body.append(rule)
    return None


def _drops(rule: str, address: str, tcp_ports: Iterable[int]) -> bool:
    """The rule drops packets to `address`: every packet, or TCP to at least `tcp_ports`."""
    words = rule.split(' comment "', 1)[0].split()
    if "drop" not in words or not any(words[i:i + 3] == ["ip", "daddr", address] for i in range(len(words))):
        return False
    ports = re.search(r"tcp dport (\{[^}]*\}|\d+)", rule)
    if ports is None:
        return "dport" not in rule and "tcp" not in words and "udp" not in words
    given = {int(p) for p in re.findall(r"\d+", ports[1])}
    return bool(tcp_ports) and set(tcp_ports) <= given
