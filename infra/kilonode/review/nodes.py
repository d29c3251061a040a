"""What a change does to running nodes that the resource diff shows only as a delete or an update
(a second independent trace of kilonode diff on research-7500, findings 1 to 3 and 6):

- scale sets (or VMs) deleted: a pool shrink (a100-ib 5,000 -> 4,000 deletes the scale sets
  040-049) removes whole scale sets, and Azure deletes a scale set with every instance in it
  (VirtualMachineScaleSets_Delete, "Deletes a VM scale set"; no drain: Azure knows nothing of
  Kubernetes). The nodes' pods die with their VMs, with no cordon, no eviction and no
  PodDisruptionBudget consulted, and a gang (a training job whose pods must all run) that had one
  pod there fails as a whole. Judged for any shrink, not only past half (risks.pools says that);
- a NAT gateway's public IP prefix resized (its prefixLength follows the pool's node count: the
  plan sizes each pool's SNAT ports, kilonode.plan.model.NatGatewayPlan). Azure's REST spec gives
  prefixLength no x-ms-mutability mark (Azure/azure-rest-api-specs@132b90d1:specification/network/
  resource-manager/Microsoft.Network/stable/2024-05-01/publicIpPrefix.json,
  #/definitions/PublicIPPrefixPropertiesFormat/properties/prefixLength), so pulumi-azure-native
  previews an in-place update; Microsoft Learn describes the prefix size as chosen when the prefix
  is created ("You create a public IP address prefix in an Azure region and subscription by
  specifying a name and prefix size", learn.microsoft.com azure/virtual-network/ip-services/
  public-ip-address-prefix; "Manage a public IP address prefix" lists the size among the creation
  settings only, and no way to change it). Whether ARM refuses the update or allocates another
  range is not confirmed here: either `pulumi up` stops there, or the pool's outbound addresses
  change (whoever allow-lists them, a partner's firewall, a registry's, stops admitting the nodes);
- a team's shards moved (teams[].firstShard, its node count, or anything that changes which scale
  sets a team owns): the head's `kilonode-node-identity` admission policy (kilonode.k8s.capacity
  node_identity_rules, team_node_rule; failurePolicy Fail, validationActions Deny, on CREATE and
  UPDATE of nodes and nodes/status) is updated by the same `pulumi up`, and from then on it expects
  the new team from each node's name. The running nodes still carry the old team label (a kubelet
  never relabels its Node: kilonode.review.lifecycle), so every write their own identities make to
  their Node is denied: the kubelet's node status (conditions, capacity and allocatable, the device
  plugins' nvidia.com/gpu and rdma/ib counts among them), calico-node's and cloud-node-manager's
  writes (kilonode.k8s.node_agents), the GPU health agent's condition (it writes as the node,
  system:node:<name>: kilonode.k8s.gpu describe), so the GPU health controller never taints a
  failing GPU node. The nodes do NOT go NotReady for it: the kubelet's heartbeat is also its Lease
  (coordination.k8s.io, which the policy does not cover), and the node lifecycle controller counts a
  renewed Lease as a probe ("If kubelet never posted the node status, but continues renewing the
  heartbeat leases, the node controller will assume the node is healthy and take no action":
  kubernetes/kubernetes pkg/controller/nodelifecycle/node_lifecycle_controller.go tryUpdateNodeHealth,
  read at 003e8629 in the search index, not at the pinned v1.34.2 tag). So each Node keeps its last
  status, Ready, whatever happens to the machine afterwards. An administrator's write is not checked
  (the policy holds only the node's identities), so relabelling and retainting each affected Node
  with an admin credential right after the policy changes (or just before) is the way through;
- a DaemonSet's image moved (kube-proxy under a kubernetesVersion patch bump): the DaemonSet
  controller replaces its pod on every node it runs on, each node pulling the new image from its
  registry (not preloaded: plan.yaml bootImagesNotPreloaded lists the images no node image carries).

From a third independent trace on research-7500:

- a DaemonSet replaced (its spec.selector changed): pulumi-kubernetes' forceNew table keys apps/v1
  "DaemonSet" since #1951 (pulumi/pulumi-kubernetes@e4bb2bd0; v4.32.0
  provider/pkg/provider/diff.go:45-57,164-169), so a selector change is a replacement, and a
  fixed-name object is replaced delete-before-replace (provider/pkg/provider/provider.go:1645-1658
  at v4.32.0). The old DaemonSet is deleted with its pods (foreground or background, the pods go),
  on every node it covers, before the new one exists; for the NVIDIA device plugin every GPU node's
  allocatable nvidia.com/gpu is 0 meanwhile. High, naming the nodes it covers (preflight's placement
  model, kilonode.review.placement.daemonset_nodes) and the way through: keep the selector, or add a
  new DaemonSet under a new name first and delete the old one in a later change;
- any change to a DaemonSet's pod template (not only an image): the controller rolls a new pod onto
  every node, maxUnavailable at a time (a percentage rounded up over the nodes it covers: kubernetes
  pkg/controller/daemon/util/daemonset_util.go UnavailableCount, GetScaledValueFromIntOrPercent
  with roundUp; read in the search index, not at the pinned tag). kilonode's DaemonSets carry
  pulumi.com/skipAwait (kilonode.k8s.pods.SKIP_AWAIT), so `pulumi up` returns as soon as the object
  is updated while the rollout runs on for as long as it takes.

Where the kube-proxy ConfigMap's `mode` changes (a sixth independent trace: KUBE_PROXY_MODE), the
rollout line says more: each new kube-proxy, at its start, removes the rules of the modes it does not
run (kubernetes cmd/kube-proxy/app/server_linux.go platformCleanup: the iptables and IPVS rules when
the mode is nftables, the nftables table when it is iptables or ipvs) and only then programs its own on
its first full sync, so from the cleanup to that sync the node's Services are not programmed: its pods'
connections to ClusterIPs and NodePorts fail.

Pure: a StackDiff in, findings out.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from kilonode.catalog.limits import limits
from kilonode.k8s.pods import SKIP_AWAIT_ANNOTATION
from kilonode.plan import wellknown
from kilonode.review import autoscaler, placement
from kilonode.review.compare import CREATE, DELETE, REPLACE, UPDATE, ResourceChange, StackDiff, natural
from kilonode.review.finding import HIGH, MEDIUM, Finding
from kilonode.review.lifecycle import NODE_IDENTITY_POLICY, identity_policy_denies, load_yaml, plan_of, shards
from kilonode.review.rules import ETCD_GROUPS, VM, VMSS

PUBLIC_IP_PREFIX = "azure-native:network:PublicIPPrefix"
DAEMONSET = "kubernetes:apps/v1:DaemonSet"


def _inputs(record: Mapping[str, Any] | None) -> Mapping[str, Any]:
    found = (record or {}).get("inputs")
    return found if isinstance(found, Mapping) else {}


def _capacity(change: ResourceChange) -> int:
    return int((_inputs(change.base).get("sku") or {}).get("capacity") or 0)


def _short(name: str, stack: str) -> str:
    return name.removeprefix(f"{stack}-")


def _pool(role: str | None) -> str:
    """`pool-a100-ib.team-language` -> `a100-ib`; another role as it is."""
    role = str(role or "")
    return role.split(".", 1)[0].removeprefix("pool-") if role.startswith("pool-") else role


def deleted_nodes(diff: StackDiff) -> list[Finding]:
    """Scale sets deleted, per pool (with their node count), and VMs deleted that no etcd rule speaks
    for (an etcd member's removal is lifecycle.etcd_shrink's)."""
    sets: dict[str, list[ResourceChange]] = {}
    for c in diff.resources:
        if c.action == DELETE and c.type == VMSS:
            sets.setdefault(_pool(c.role), []).append(c)
    found = []
    for pool, changes in sorted(sets.items()):
        changes.sort(key=lambda c: natural(c.name))
        nodes = sum(_capacity(c) for c in changes)
        names = ", ".join(_short(c.name, diff.stack) for c in changes)
        found.append(Finding(HIGH, "nodes-deleted", (
            f"pool {pool}: {len(changes)} scale set(s) deleted ({names}), {nodes:,} node(s) by their recorded "
            "capacity: Azure deletes a scale set with every instance in it, with no cordon and no drain (it knows "
            "nothing of Kubernetes), so their pods die with the VMs, no PodDisruptionBudget is consulted, and every "
            "gang with a pod there fails as a whole. Before `pulumi up`: cordon those nodes (their names start with "
            "the scale sets' names; `kubectl cordon`), drain them (`kubectl drain --ignore-daemonsets "
            "--delete-emptydir-data`, so the jobs' pods leave as their owners allow), and let the jobs on them "
            "finish or move; the autoscaler's ceiling and the teams' reservations shrink with them"),
            tuple(c.name for c in changes), cause=f"pool {pool} shrink"))
    vms = sorted((c for c in diff.resources if c.action == DELETE and c.type == VM and c.role not in ETCD_GROUPS),
                 key=lambda c: natural(c.name))
    if vms:
        found.append(Finding(HIGH, "vms-deleted", (
            f"{len(vms)} VM(s) deleted ({', '.join(_short(c.name, diff.stack) for c in vms)}): Azure deletes each "
            "with whatever runs on it, nothing drained first. Take each out of service before `pulumi up` (a node: "
            "cordon and drain it; an apiserver: out of the load balancer's pool, its clients pointed elsewhere)"),
            tuple(c.name for c in vms)))
    return found


def nat_prefix(diff: StackDiff) -> list[Finding]:
    """A public IP prefix whose prefixLength changes in place (a pool's NAT gateway's)."""
    found = []
    for c in diff.resources:
        if c.type != PUBLIC_IP_PREFIX or c.action != UPDATE:
            continue
        moved = [i for i in c.inputs if i.path == "prefixLength" and not i.ignored]
        if not moved:
            continue
        was, now = moved[0].before, moved[0].after
        sizes = ""
        if isinstance(was, int) and isinstance(now, int):
            sizes = f" ({2 ** (32 - was)} -> {2 ** (32 - now)} addresses)"
        found.append(Finding(HIGH, "nat-prefix-resized", (
            f"{c.name}: prefixLength /{was} -> /{now}{sizes} in place. Azure chooses a public IP prefix's range "
            "when the prefix is created (Microsoft Learn, \"Public IP address prefix\": a prefix is created by "
            "name and size), and the size is no property to change afterwards (terraform-provider-azurerm, from "
            "the same ARM API, marks azurerm_public_ip_prefix's prefix_length ForceNew); Pulumi's azure-native "
            "schema does not mark it replace-on-change, so it previews an update that ARM is expected to refuse: "
            "`pulumi up` stops there with Azure's error, after changing what came before it. Were a new range "
            "given, the outbound addresses of every subnet behind this NAT gateway would change: whoever admits "
            "them by address (a partner's allow-list, a registry's or storage account's firewall) stops admitting "
            f"the nodes. The plan sizes the prefix from the pool's nodes x network.minSnatPortsPerNode "
            f"(kilonode.plan.resolve.network). {_nat_fix(was, now)}"), (c.name,), cause="prefixLength"))
    return found


def _nat_fix(was: Any, now: Any) -> str:
    """What keeps the prefix, by the way it moves: a longer length (fewer addresses) from fewer
    nodes or fewer ports each, a shorter one (more) from more."""
    if not (isinstance(was, int) and isinstance(now, int)):
        return "Keep its length, or plan the new range with the allow-lists updated first."
    cap = limits().azure.nat_ips_per_gateway.value
    if now < was:  # more addresses wanted
        spare = cap - 2 ** (32 - was)
        second = next((n for n in sorted(limits().azure.nat_prefix_lengths.value, reverse=True)
                       if 2 ** (32 - n) <= spare and 2 ** (32 - n) >= 2 ** (32 - now) - 2 ** (32 - was)), None)
        beside = (f"a second /{second} beside this one would keep the present addresses and add "
                  f"{2 ** (32 - second)} (a gateway takes at most {cap}, prefixes and single IPs together: Azure "
                  "NAT gateway limits), which the stack cannot express today" if second is not None else
                  f"no second prefix beside this one can bring it there (a gateway takes at most {cap} addresses: "
                  "Azure NAT gateway limits): split the pool in two pools, each subnet with its own gateway")
        return ("To keep the outbound addresses: lower network.minSnatPortsPerNode (or the pool's node count) "
                f"so /{was} still results. The plan gives each gateway one prefix, so more addresses from the stack "
                f"means a new range (every allow-list updated for it first); {beside}.")
    return (f"The plan now wants fewer addresses: to keep the prefix, keep network.minSnatPortsPerNode and the "
            f"pool's node count where /{was} results (a larger prefix than needed costs only its addresses).")


def _teams(plan: Mapping[str, Any]) -> dict[str, tuple[str, str]]:
    """scale set -> (pool, its team or '')."""
    return {name: (pool, str(team or "")) for name, (pool, _, team) in shards(plan).items()}


def team_moves(diff: StackDiff) -> dict[str, list[str]]:
    """'pool P: team A -> team B' -> the scale sets (present on both sides) whose team changes."""
    before, after = _teams(plan_of(diff.base)), _teams(plan_of(diff.head))
    groups: dict[str, list[str]] = {}
    for name, (pool, team) in after.items():
        if name in before and before[name][1] != team:
            groups.setdefault(f"pool {pool}: team {before[name][1] or '(shared)'} -> {team or '(shared)'}",
                              []).append(name)
    return groups


def node_identity(diff: StackDiff) -> list[Finding]:
    """A team's scale sets changed under the node-identity policy: the nodes' own writes are denied."""
    if not identity_policy_denies(diff.head):
        return []  # lifecycle.registration's labels-until-reimaged says what stays
    found = []
    for what, names in sorted(team_moves(diff).items()):
        names.sort(key=natural)
        new_team = what.rsplit("-> ", 1)[1]
        relabel = (f"`kubectl label node <name> {wellknown.TEAM_LABEL}={new_team} --overwrite` and `kubectl taint "
                   f"node <name> {wellknown.TEAM_LABEL}={new_team}:{wellknown.TEAM_TAINT_EFFECT} --overwrite`, "
                   f"removing the old team's taint (`{wellknown.TEAM_LABEL}-`)"
                   if new_team != "(shared)" else
                   f"`kubectl label node <name> {wellknown.TEAM_LABEL}-` and `kubectl taint node <name> "
                   f"{wellknown.TEAM_LABEL}-`")
        found.append(Finding(HIGH, "node-identity-denied", (
            f"{what} for {len(names)} scale set(s) ({', '.join(_short(n, diff.stack) for n in names)}): the same "
            f"`pulumi up` updates the {NODE_IDENTITY_POLICY} admission policy (failurePolicy Fail, Deny; CREATE and "
            "UPDATE of nodes and nodes/status), which from then on expects the new team from each node's name, "
            "while the running nodes keep their old team label (a kubelet never relabels its Node). So every write "
            "these nodes' own identities make to their Node is denied: the kubelet's node status (conditions, "
            "capacity, the device plugins' GPU and RDMA counts), calico-node, cloud-node-manager, and the GPU health "
            "agent's condition, so a failing GPU node is never tainted. They do not go NotReady for it (the kubelet's "
            "Lease, which the policy does not cover, keeps them alive to the node lifecycle controller): each Node "
            "keeps its last status, Ready, whatever happens to the machine after, and the scheduler keeps placing "
            "pods there. Right after `pulumi up` applies the policy (or just before), relabel and retaint every "
            "Node of these scale sets "
            f"with an administrator's credential (the policy does not check it): {relabel}; a reimage does not do "
            "it (the kubelet keeps an existing Node's labels)"),
            tuple(names), cause=what))
    return found


# --- capacity that changes owner, and the autoscaler's floors lowered (a ninth independent trace of
# kilonode diff on research-7500, 9d: onboarding team robotics with 500 nodes on the autoscaled h100-ib pool
# was said as node-identity-denied and fleet-rollout only).
#
# kilonode.azure.node_pool gives a scale set `ignoreChanges: ["sku.capacity"]` only while its shard is one of
# the pool's autoscaler node groups (GpuNodePool._scaled: the pool's autoscaling.node_groups); a team's
# shards are no node group (kilonode.plan.capacity: "Teams' shards keep their capacity and are not node
# groups at all"), so a shared shard that becomes a team's, or a pool whose autoscaling is removed, goes
# from autoscaler-owned capacity to program-owned. From that `pulumi up` on, Pulumi compares sku.capacity
# like any input (with it ignored, the engine puts the old input in its place: pulumi/pulumi pkg/resource/
# deploy step_generator.go processIgnoreChanges(news, olds, ...), read in the search index), and
# pulumi-azure-native writes a scale set with a PUT of its whole model built from the new inputs (provider/
# pkg/provider/provider.go defaultUpdate: PrepareAzureRESTBody(inputs), CreateOrUpdate; the v3 line, read in
# the search index, not at the pinned 3.29.0): the update this same change makes (new custom data) carries the
# plan's capacity, and so does any later one. A PUT's sku.capacity is the scale set's size, whatever scaled it
# before (Azure/vm-scale-sets#70: an ARM deployment's sku.capacity resets an autoscaled scale set; the reason
# kubernetes/autoscaler#2959 made cluster-autoscaler send the capacity alone). Below it, Azure creates the
# missing VMs at once, from the new model; above it, it removes instances by the scale-in policy (Uniform,
# Default: balanced across zones and fault domains, then the highest instance IDs: Microsoft Learn, "Use custom
# scale-in policies with Azure Virtual Machine Scale Sets"), deleted with whatever runs on them, no cordon, no
# drain. The live size is not in a snapshot: the base's --nodes bounds say how far it can be from the plan's
# (the autoscaler does not take a node group beyond min:max: kubernetes/autoscaler cluster-autoscaler FAQ.md,
# "My cluster is below minimum / above maximum number of nodes, but CA did not fix that! Why?").
#
# The autoscaler's node groups' minimums lowered (the same onboarding: the 20 shared groups' --nodes went
# from 50:100 to 38:100 and 37:100, as kilonode.plan.capacity spreads the pool's floor less the team's
# fixed 500 over them): the pool's floor holds, but the shared groups may lose more nodes than before.
# Which nodes go is the scale-down thresholds' (kilonode.review.autoscaler): at kilonode's GPU threshold
# (0.000001, kilonode.plan.defaults.autoscaler) only a GPU node no pod requests a GPU of; above 1/gpus a
# node running a job's pod, whose gang then stops whole (the autoscaler-scale-down-raised reasoning).
CAPACITY_RULE = "capacity-takes-over"
FLOOR_RULE = "autoscaler-floor-lowered"
CAPACITY_PATH = "sku.capacity"
DEPLOYMENT = "kubernetes:apps/v1:Deployment"
AUTOSCALER = ("kube-system", "cluster-autoscaler")  # kilonode.k8s.autoscaler
_NODES_FLAG = re.compile(r"^--nodes=(\d+):(\d+):(\S+)$")


def _scale_sets(entry: Mapping[str, Any] | None) -> dict[str, Mapping[str, Any]]:
    """resource name -> its recorded scale set."""
    return {str(r.get("name")): r for r in (entry or {}).get("resources") or [] if r.get("type") == VMSS}


def _set_name(record: Mapping[str, Any]) -> str:
    return str(_inputs(record).get("vmScaleSetName") or record.get("name"))


def _ignores_capacity(record: Mapping[str, Any]) -> bool:
    return CAPACITY_PATH in (record.get("ignoreChanges") or [])


def _node_group_bounds(entry: Mapping[str, Any] | None) -> dict[str, tuple[int, int]]:
    """scale set -> (min, max) from the side's cluster-autoscaler `--nodes=min:max:set` flags (kilonode.k8s.
    autoscaler renders one per node group, on the Deployment kube-system/cluster-autoscaler)."""
    found: dict[str, tuple[int, int]] = {}
    for r in (entry or {}).get("resources") or []:
        meta = _inputs(r).get("metadata") or {}
        if r.get("type") != DEPLOYMENT or (meta.get("namespace"), meta.get("name")) != AUTOSCALER:
            continue
        spec = ((_inputs(r).get("spec") or {}).get("template") or {}).get("spec") or {}
        for container in spec.get("containers") or []:
            for word in [*(container.get("command") or []), *(container.get("args") or [])]:
                matched = _NODES_FLAG.match(str(word))
                if matched:
                    found[matched.group(3)] = (int(matched.group(1)), int(matched.group(2)))
    return found


def _pools_by_name(entry: Mapping[str, Any] | None) -> dict[str, Mapping[str, Any]]:
    return {str(p.get("name")): p for p in plan_of(entry).get("nodePools") or [] if isinstance(p, Mapping)}


def capacity_takes_over(diff: StackDiff) -> list[Finding]:
    """Scale sets whose capacity the autoscaler owned (ignored by Pulumi) and the program now sets."""
    before, after = _scale_sets(diff.base), _scale_sets(diff.head)
    bounds = _node_group_bounds(diff.base)
    owners = {name: (pool, str(team or "")) for name, (pool, _, team) in shards(plan_of(diff.head)).items()}
    pools = _pools_by_name(diff.head)
    taken: dict[str, list[tuple[str, int, tuple[int, int] | None]]] = {}
    for name, record in after.items():
        was = before.get(name)
        if was is None or not _ignores_capacity(was) or _ignores_capacity(record):
            continue
        set_name = _set_name(record)
        capacity_now = int((_inputs(record).get("sku") or {}).get("capacity") or 0)
        pool = owners.get(set_name, ("(not in the plan)", ""))[0]
        taken.setdefault(pool, []).append((set_name, capacity_now, bounds.get(set_name)))
    found = []
    joins = int(((plan_of(diff.head).get("components") or {}).get("joins") or {}).get("sizedForPerMin") or 0)
    for pool_name, sets in sorted(taken.items()):
        sets.sort(key=lambda s: natural(s[0]))
        pool = pools.get(pool_name) or {}
        gpus, vcpus = int(pool.get("gpusPerNode") or 0), int(pool.get("vcpus") or 0)
        size = str(pool.get("vmSize") or "VMs")
        teams = sorted({owners[s][1] for s, _, _ in sets if s in owners and owners[s][1]})
        why = (f"they become team {', '.join(teams)}'s and leave the autoscaler's node groups (its --nodes list)"
               if teams else "the pool is no longer autoscaled")
        created = sum(max(0, n - b[0]) for _, n, b in sets if b is not None)
        deleted = sum(max(0, b[1] - n) for _, n, b in sets if b is not None)
        each = "; ".join(f"{_short(s, diff.stack)} {n:,}" + (f" (autoscaler {b[0]}:{b[1]}: up to {max(0, n - b[0]):,} "
                                                            "created" + (f", or up to {b[1] - n:,} deleted"
                                                                         if b[1] > n else "") + ")"
                                                            if b is not None else "")
                         for s, n, b in sets)
        unknown = [s for s, _, b in sets if b is None]
        if created:
            spent = [f"{created * gpus:,} GPUs"] if gpus else []
            spent += [f"{created * vcpus:,} vCPUs of the region's quota for the size's family"] if vcpus else []
            cost = (f"up to {created:,} {size} VMs created at once" + (f" ({', '.join(spent)})" if spent else "")
                    + ", paid from the moment they run, each allocated in its scale set's zone and placement group, "
                    "so Azure's capacity for the size in the region decides whether they come (an allocation failure "
                    "stops `pulumi up` at that scale set)")
        else:
            cost = "no VM created (the autoscaler could not hold any below its plan size)"
        if created and joins and created > joins:
            cost += f"; more than the {joins:,} joins a minute the apiservers are sized for (components.joins)"
        removal = (f"; where the autoscaler had one above it, up to {deleted:,} VMs deleted in all, chosen by the "
                   "scale-in policy (Uniform, Default: balanced across zones and fault domains, then the highest "
                   "instance IDs) with no cordon and no drain, every gang with a pod there failing whole"
                   if deleted else "")
        level = HIGH if gpus and (created or deleted or unknown) else MEDIUM
        found.append(Finding(level, CAPACITY_RULE, (
            f"pool {pool_name}: {len(sets)} scale set(s) go from autoscaler-owned to program-owned capacity ({why}, "
            "and kilonode.azure.node_pool ignores sku.capacity only for a node group's scale set): from this `pulumi "
            "up` on, Pulumi sets sku.capacity like any input, and pulumi-azure-native PUTs a scale set's whole model, "
            "so the first update of each (this change's, where it changes the model; after a refresh, the "
            "autoscaler's size itself shows as a difference) sets it to the plan's size whatever the autoscaler "
            f"left it at: {each}. The live sizes are not in the review (the autoscaler kept each within its "
            f"--nodes bounds): {cost}{removal}"
            + (f"; {', '.join(_short(s, diff.stack) for s in unknown)}: no --nodes bounds on the base, size unknown"
               if unknown else "")
            + ". The VMs it adds boot from the head's model (the new custom data). Before `pulumi up`: read each "
            "one's size (`az vmss show --query sku.capacity`) and bring it to the plan's size by hand, in steps the "
            "region's capacity and the join rate allow (`az vmss scale --new-capacity`), cordoning and draining "
            "first any node that would go; or onboard the team's nodes in steps (a smaller teams[].nodes, raised in "
            "later changes); or keep the pool's shards autoscaled (no team on an autoscaled pool)"),
            tuple(s for s, _, _ in sets), cause=f"pool {pool_name} capacity owner"))
    return found


def _drains_running(head: Mapping[str, str] | None, gpus: int) -> bool:
    """Whether the head's GPU threshold makes a node running a 1-GPU pod removable (utilization at or below it:
    cluster-autoscaler core/scaledown/eligibility/eligibility.go isNodeAtOrBelowUtilizationThreshold at the
    pinned releases, which keep a node only while its utilization is above the threshold)."""
    key = "scale-down-gpu-utilization-threshold"
    text = (head or {}).get(key, autoscaler.DEFAULTS[key])
    try:
        return gpus > 0 and float(text) >= 1 / gpus
    except ValueError:
        return False


def floors_lowered(diff: StackDiff) -> list[Finding]:
    """Node groups (present on both sides) whose autoscaler min size falls: more of them removable."""
    before, after = _node_group_bounds(diff.base), _node_group_bounds(diff.head)
    owners = {name: pool for name, (pool, _, _) in shards(plan_of(diff.head)).items()}
    pools = _pools_by_name(diff.head)
    lowered: dict[str, list[tuple[str, int, int, int]]] = {}
    for name, (low, high) in after.items():
        was = before.get(name)
        if was is not None and low < was[0]:
            lowered.setdefault(owners.get(name, name), []).append((name, was[0], low, high))
    if not lowered:
        return []
    head_flags = autoscaler.flags(diff.head)
    found = []
    for pool_name, groups in sorted(lowered.items()):
        groups.sort(key=lambda g: natural(g[0]))
        gpus = int((pools.get(pool_name) or {}).get("gpusPerNode") or 0)
        high = sum(h for *_, h in groups)
        was_low, now_low = sum(g[1] for g in groups), sum(g[2] for g in groups)
        mins = ", ".join(sorted({f"{g[1]} -> {g[2]}" for g in groups}))
        running = _drains_running(head_flags, gpus)
        floor = int(((pools.get(pool_name) or {}).get("autoscaling") or {}).get("minNodes") or 0)
        keep = (f"To keep the old floor: autoscaling.minNodes {floor:,} -> {floor + was_low - now_low:,} (a team's "
                "fixed nodes count toward the pool's minNodes, and the rest is spread over the shared node groups: "
                "kilonode.plan.capacity)" if floor else
                "To keep the old floor, raise autoscaling.minNodes by the difference (kilonode.plan.capacity)")
        which = (("a GPU node running a job's pod is removable at the head's --scale-down-gpu-utilization-threshold, "
                  "so each removed node running part of a job stops the whole job (a gang dies with any member) and "
                  "its pods pend until a scale-up brings nodes back") if running else
                 ("the scale-down thresholds leave only nodes no pod requests a GPU of (kilonode.plan.defaults."
                  "autoscaler), so no running job is drained, but idle GPU nodes go that only a scale-up brings back "
                  "(--max-node-provision-time to Ready, and only if Azure has the size's capacity in the region)"
                  if gpus else "only nodes below the scale-down utilization threshold go"))
        found.append(Finding(HIGH if running else MEDIUM, FLOOR_RULE, (
            f"pool {pool_name}: the cluster autoscaler's min size falls on {len(groups)} node group(s) ({mins}; "
            f"--nodes=min:max:set), so it may remove up to {high - now_low:,} of their {high:,} nodes, was "
            f"{high - was_low:,}: {was_low - now_low:,} more (down to {now_low:,}). Scale-down stops at each node "
            "group's min size (\"Cluster Autoscaler will not scale the cluster beyond these limits\": "
            "kubernetes/autoscaler cluster-autoscaler/FAQ.md, \"My cluster is below minimum / above maximum number "
            "of nodes, but CA did not fix that! Why?\"); "
            f"{which}. {keep}"),
            tuple(g[0] for g in groups), cause=f"pool {pool_name} floor"))
    return found


def _plan_nodes(diff: StackDiff) -> int:
    return sum(int(p.get("nodes") or 0) for p in plan_of(diff.head).get("nodePools") or [] if isinstance(p, Mapping))


def _name(change: ResourceChange, record: Mapping[str, Any] | None) -> tuple[str, str]:
    meta = _inputs(record).get("metadata") or {}
    return str(meta.get("namespace") or "default"), str(meta.get("name") or change.name)


def _covered(diff: StackDiff, change: ResourceChange) -> tuple[int, str]:
    """The nodes the base's DaemonSet runs on (preflight's placement model), as a count and a line
    by pool ("a100-ib 5,000, h100-ib 2,500"); the plan's whole node count where it cannot say."""
    namespace, name = _name(change, change.base)
    roles = placement.daemonset_nodes(diff, namespace, name)
    if roles is None:
        total = _plan_nodes(diff)
        return total, f"up to {total:,} nodes: every node the plan has"
    pools: dict[str, int] = {}
    for role, count in roles.items():
        pools[_pool(role)] = pools.get(_pool(role), 0) + count
    total = sum(pools.values())
    return total, f"{total:,} nodes: " + ", ".join(f"{pool} {count:,}" for pool, count in sorted(pools.items()))


def _max_unavailable(record: Mapping[str, Any] | None, nodes: int) -> str:
    """maxUnavailable as written and, for a percentage, the nodes it is (rounded up, as the
    DaemonSet controller's UnavailableCount does)."""
    strategy = ((_inputs(record).get("spec") or {}).get("updateStrategy") or {})
    if strategy.get("type") == "OnDelete":
        return "OnDelete: a node's pod changes only when it is deleted"
    value = (strategy.get("rollingUpdate") or {}).get("maxUnavailable", 1)
    text = str(value)
    if text.endswith("%") and text[:-1].isdigit():
        at_once = max(1, math.ceil(int(text[:-1]) * nodes / 100))
        return f"maxUnavailable {text}: {at_once:,} node(s) at a time"
    return "maxUnavailable 1: one node at a time" if text == "1" else f"maxUnavailable {text} node(s) at a time"


def _not_awaited(record: Mapping[str, Any] | None) -> bool:
    annotations = (_inputs(record).get("metadata") or {}).get("annotations") or {}
    return str(annotations.get(SKIP_AWAIT_ANNOTATION, "")).lower() == "true"


def daemonsets_replaced(diff: StackDiff) -> list[Finding]:
    """A DaemonSet replaced: deleted with its pods on every node before the new one exists."""
    found = []
    for c in diff.resources:
        if c.type != DAEMONSET or c.action != REPLACE:
            continue
        (namespace, name), (new_ns, new_name) = _name(c, c.base), _name(c, c.head)
        _, where = _covered(diff, c)
        why = c.reason() or "an input that forces a new DaemonSet"
        fixed = (namespace, name) == (new_ns, new_name)
        order = ("pulumi-kubernetes deletes a fixed-name object before it creates the new one, so its pod on every "
                 "node it covers is deleted before the new DaemonSet exists, and stays deleted if the create fails "
                 "(`pulumi up` stops there)") if fixed else (
                 f"the new {new_ns}/{new_name} is created first, then the old one is deleted with its pods on every "
                 "node (both run side by side meanwhile)")
        found.append(Finding(HIGH, "daemonset-replaced", (
            f"DaemonSet {namespace}/{name} is replaced ({why}; pulumi-kubernetes' forceNew table, #1951), on "
            f"{where}: {order}{placement.without([name])}. Keep the selector; or create a new DaemonSet under a new "
            "name first and delete the old one in a later change"),
            (c.name,), cause=f"DaemonSet {name} replaced"))
    return found


def daemonset_templates(diff: StackDiff) -> list[Finding]:
    """A DaemonSet whose pod template changes (an image, an env var, a toleration, ...): a rollout
    over every node it runs on, maxUnavailable at a time, which `pulumi up` does not wait for."""
    preloaded_not = {str(i) for p in plan_of(diff.head).get("nodePools") or [] if isinstance(p, Mapping)
                     for i in p.get("bootImagesNotPreloaded") or []}
    found = []
    for c in diff.resources:
        if c.type != DAEMONSET or c.action != UPDATE:
            continue
        changed = [i for i in c.inputs if not i.ignored and i.path.startswith("spec.template.")]
        if not changed:
            continue
        namespace, name = _name(c, c.head)
        nodes, where = _covered(diff, c)
        moved = [i for i in changed if i.path.startswith("spec.template.spec.") and i.path.endswith("].image")
                 and i.before != i.after]
        if moved:
            images = "; ".join(f"{i.before} -> {i.after}" for i in moved)
            pulls = [str(i.after) for i in moved if str(i.after) in preloaded_not]
            what = f"not preloaded: {', '.join(pulls)}" if pulls else "the image as the stack names it"
            head = (f"DaemonSet {name}: image {images}. The DaemonSet controller replaces its pod on every node it "
                    f"runs on ({where}; {_max_unavailable(c.head, nodes)}), and each node pulls the new image from "
                    f"its registry ({what}): {nodes:,} pulls")
        else:
            paths = ", ".join(dict.fromkeys(short_path(i.path) for i in changed))
            head = (f"DaemonSet {name}: its pod template changes ({paths}). The DaemonSet controller replaces its "
                    f"pod on every node it runs on ({where}; {_max_unavailable(c.head, nodes)})")
        wait = ("`pulumi up` returns as soon as the object is updated (not awaited: pulumi.com/skipAwait, "
                "kilonode.k8s.pods.SKIP_AWAIT) while the rollout runs on, long after it"
                if _not_awaited(c.head) else "`pulumi up` waits for the whole rollout")
        switch = _proxy_mode(diff) if name == PROXY[1] and namespace == PROXY[0] else None
        # platformCleanup removes the other modes' rules only across nftables (iptables and ipvs share chains)
        if switch and (switch[0] == "nftables") != (switch[1] == "nftables"):
            head += (f". The kube-proxy mode changes ({switch[0]} -> {switch[1]}): each restarted kube-proxy first "
                     f"cleans the {switch[0]} rules the old one left (kubernetes cmd/kube-proxy/app/server_linux.go "
                     f"platformCleanup) and programs the {switch[1]} ones only at its first full sync, so the "
                     "Services on that node are unprogrammed for that window (ClusterIP and NodePort connections "
                     "from its pods fail); roll it on a few nodes first and watch kubeproxy_sync_proxy_rules_"
                     "duration_seconds")
        found.append(Finding(MEDIUM, "daemonset-rollout", (
            f"{head}, and while a node's pod restarts what it serves there pauses; {wait}. Watch the first nodes "
            f"(`kubectl rollout status daemonset/{name} -n {namespace}`)" + (" and the registry's pull limits"
                                                                          if moved else "")),
            (c.name,)))
    return found


PROXY = ("kube-system", "kube-proxy")  # kilonode.k8s.proxy: its DaemonSet and ConfigMap
PROXY_CONFIG_KEY = "config.conf"
CONFIG_MAP = "kubernetes:core/v1:ConfigMap"


def _proxy_mode_of(entry: Mapping[str, Any] | None) -> str | None:
    for r in (entry or {}).get("resources", []):
        meta = _inputs(r).get("metadata") or {}
        if r.get("type") == CONFIG_MAP and (meta.get("namespace"), meta.get("name")) == PROXY:
            text = (_inputs(r).get("data") or {}).get(PROXY_CONFIG_KEY)
            config = load_yaml(text) if isinstance(text, str) else None
            return str(config.get("mode") or "") if isinstance(config, Mapping) else None
    return None


def _proxy_mode(diff: StackDiff) -> tuple[str, str] | None:
    """(before, after) of kube-proxy's mode where the change moves it ('' is kube-proxy's default)."""
    was, now = _proxy_mode_of(diff.base), _proxy_mode_of(diff.head)
    if was is None or now is None or was == now:
        return None
    return was or "iptables", now or "iptables"  # the Linux default (server_linux.go platformApplyDefaults)


def short_path(path: str) -> str:
    """`spec.template.spec.containers[name=x].env[name=Y].value` -> `containers[name=x].env[name=Y]`."""
    rest = path.removeprefix("spec.template.").removeprefix("spec.")
    return rest.rsplit(".", 1)[0] if rest.endswith((".value", ".name")) and "[" in rest else rest


def scale_set_policy(diff: StackDiff) -> list[Finding]:
    """Two scale-set settings the rollouts and the fabrics rest on (a thirteenth independent trace,
    x03 and x04: both were "No risk found"):
    - upgradePolicy.mode off Manual: Azure then upgrades the instances to every model change itself,
      "the scale set might take down all VMs at the same time" with Automatic (Microsoft Learn,
      "Upgrade policies for Virtual Machine Scale Sets"), no cordon, no drain, no gang waited for:
      every image or custom-data change afterwards restarts whole pools under running jobs, and the
      rollout (kilonode.rollout) and the review's advice, which assume Manual, no longer hold;
    - singlePlacementGroup true -> false on an InfiniBand pool: allowed in place and never back (the
      effects catalogue's row for it), and InfiniBand reaches only the VMs of one placement group, so
      instances placed outside it lose the fabric NCCL runs on."""
    opened: list[str] = []
    policies: dict[tuple[str, str], list[str]] = {}
    for c in diff.resources:
        if c.type != VMSS or c.action not in (UPDATE, REPLACE):
            continue
        for change in c.inputs:
            if change.ignored:
                continue
            if change.path == "upgradePolicy.mode" and str(change.before) == "Manual" and str(change.after) != "Manual":
                policies.setdefault((str(change.before), str(change.after)), []).append(c.name)
            if change.path == "singlePlacementGroup" and change.before is True and change.after is False:
                opened.append(c.name)
    found = []
    for (was, now), names in sorted(policies.items()):
        found.append(Finding(HIGH, "upgrade-policy-not-manual", (
            f"{len(names)} scale set(s) ({_names(names, diff.stack)}): upgradePolicy {was} -> {now}: Azure then "
            "brings every instance to each new model itself (Automatic: \"the scale set might take down all VMs at "
            "the same time\", Microsoft Learn, Upgrade policies for Virtual Machine Scale Sets), with no cordon, no "
            "drain and no gang waited for: every later image or custom-data change restarts the pools under their "
            "jobs, and kilonode's rollout and this review's advice assume Manual. Keep Manual "
            "(kilonode.azure.node_pool)"), tuple(sorted(names)), cause="upgrade policy"))
    if opened:
        found.append(Finding(HIGH, "placement-group-opened", (
            f"{len(opened)} scale set(s) ({_names(opened, diff.stack)}): singlePlacementGroup true -> false: Azure "
            "allows it in place and never back, and InfiniBand reaches only the VMs of one placement group: "
            "instances placed outside it lose the fabric their gangs' NCCL runs on, and nothing holds a scale set to "
            "one fabric's 100 VMs any more. Keep it true on an InfiniBand pool"), tuple(sorted(opened)),
            cause="placement group"))
    return found


def _names(names: list[str], stack: str) -> str:
    shown = sorted(names, key=natural)
    return ", ".join(_short(n, stack) for n in shown[:4]) + (f", and {len(shown) - 4} more" if len(shown) > 4 else "")


def _head_capacity(change: ResourceChange) -> int:
    return int((_inputs(change.head).get("sku") or {}).get("capacity") or 0)


def added_nodes(diff: StackDiff) -> list[Finding]:
    """Scale sets created on a running cluster, per pool: the VMs Azure creates at once in this `pulumi up`
    (their recorded capacity), the vCPUs and GPUs they take from the region's quota, and the pool's autoscaler
    bounds where they move (the fifteenth independent trace, PR 07: 1,000 H100 VMs and a floor raised by 500, said
    only in the resource list)."""
    if not any(str(r.get("type", "")).startswith("kubernetes:") for r in (diff.base or {}).get("resources", [])):
        return []  # a first `pulumi up`: the join waves (kilonode explain) are the plan's story
    pools = {str(p.get("name")): p for p in plan_of(diff.head).get("nodePools") or [] if isinstance(p, Mapping)}
    before = {str(p.get("name")): p for p in plan_of(diff.base).get("nodePools") or [] if isinstance(p, Mapping)}
    sets: dict[str, list[ResourceChange]] = {}
    for c in diff.resources:
        if c.action == CREATE and c.type == VMSS:
            sets.setdefault(_pool(c.role), []).append(c)
    found = []
    for pool, changes in sorted(sets.items()):
        nodes = sum(_head_capacity(c) for c in changes)
        plan = pools.get(pool) or {}
        vcpus, gpus = int(plan.get("vcpus") or 0) * nodes, int(plan.get("gpusPerNode") or 0) * nodes
        bounds = ""
        was, now = ((before.get(pool) or {}).get("autoscaling") or {}), (plan.get("autoscaling") or {})
        if was.get("minNodes") != now.get("minNodes") or was.get("maxNodes") != now.get("maxNodes"):
            bounds = (f"; the autoscaler's bounds move: floor {was.get('minNodes', '-')} -> {now.get('minNodes', '-')}"
                      f", ceiling {was.get('maxNodes', '-')} -> {now.get('maxNodes', '-')} (the floor is held: "
                      "those nodes are never scaled down)")
        found.append(Finding(MEDIUM, "nodes-added", (
            f"pool {pool}: {len(changes)} scale set(s) created with {nodes:,} VM(s) at once in this `pulumi up` "
            f"({plan.get('vmSize', 'its size')}: {vcpus:,} vCPUs" + (f", {gpus:,} GPUs" if gpus else "") + " of the "
            "region's quota for the size's family, taken at creation; a shortfall fails the create and `pulumi up` "
            "stops there), every new node joining, pulling its images and registering with the apiservers together"
            + bounds + ". Check the family's quota (`az vm list-usage`) and grow in steps where the join load matters"),
            tuple(c.name for c in sorted(changes, key=lambda c: natural(c.name))), cause=f"pool {pool} growth"))
    return found


def assess(diff: StackDiff) -> list[Finding]:
    return [*deleted_nodes(diff), *added_nodes(diff), *nat_prefix(diff), *node_identity(diff),
            *capacity_takes_over(diff), *floors_lowered(diff), *daemonsets_replaced(diff), *daemonset_templates(diff),
            *scale_set_policy(diff)]
