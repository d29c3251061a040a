"""ClusterAutoscaler: kubernetes/autoscaler's cluster-autoscaler on the pools with `autoscaling`,
one node group per shared scale-set shard, with the bounds the plan set (kilonode.plan.capacity).

References, read at the pinned tags (the catalogue's clusterAutoscaler row, components.yaml:
cluster-autoscaler-1.32.7 f645beb1, -1.33.6 be4b5a18, -1.34.5 cb2123ed, -1.35.2 2d425888,
paths under cluster-autoscaler/ in kubernetes/autoscaler):

- ServiceAccount and RBAC: exactly what cloudprovider/azure/examples/cluster-autoscaler-vmss-msi.yaml
  grants at each tag (1.34.5 and 1.35.2 add `volumeattachments` to the storage.k8s.io rule).
  The names are kilonode's; the rules are upstream's, rule by rule.
- Flags: config/flags/flags.go (1.33+) or main.go (1.32), each flag's registration cited in
  tests/k8s/test_autoscaler.py; `--leader-elect` from k8s.io/component-base
  config/options/leaderelectionconfig.go, `--v` from klog (klog.InitFlags in main.go).
- Node groups: `--nodes=<min>:<max>:<scale set name>` per shard (cloudprovider/azure/
  azure_manager.go buildNodeGroupFromSpec: vmType vmss -> NewScaleSet), never
  `--node-group-auto-discovery`: the plan is the source of the bounds. A node group never goes
  below its min size: scale-down counts every node it picks, and those being deleted, against
  it (core/scaledown/unneeded/nodes.go verifyMinSize, l.253-303 at 1.34.5), and the Azure scale
  set refuses a deletion at its min size (azure_scale_set.go DeleteNodes). So no pool goes below
  half of its nodes, whatever the autoscaler sees; no flag does this (see
  shared/docs/limits-and-modern-equivalents.md).

Azure access: the cloud provider's azure.json with the autoscaler's own identity, from the
`cluster-autoscaler-azure` ConfigMap (kilonode.k8s.cloud_provider AUTOSCALER_CONFIG_NAME).
The autoscaler parses it into its own Config
(cloudprovider/azure/azure_config.go BuildAzureConfig: json.Unmarshal into a struct that
embeds cloud-provider-azure's Config, v1.29.4 with pkg/azclient v0.0.13 for 1.32-1.34, v1.34.3
with pkg/azclient v0.9.2 for 1.35), and every field it needs for uniform scale sets with a
user-assigned identity is there under the same name: resourceGroup (where the scale sets
are), subscriptionId (else it asks the instance metadata service), vmType "vmss",
useManagedIdentityExtension + userAssignedIdentityID (a client ID, which both its ARM
clients and the agent-pool client accept), cloud. The CCM's load-balancer and network
fields are parsed and not used by the autoscaler: they are the CCM's settings, not its. The
identity is its own, on the controller pools' scale sets only: Reader on the pools' resource
group (it LISTs the group's scale sets and VMs) and a custom role of only the scale-set actions
it calls on each node group's scale set (kilonode.azure.identity AUTOSCALER_ACTIONS): enough
to change a scale set's capacity and delete its instances, and nothing of the control plane.
The test checks each key's name and JSON type against both structs, so a type the autoscaler
cannot decode (it would refuse to start) fails there.

What "unhealthy" does, at every pinned tag (core/static_autoscaler.go RunOnce, 1.34.5
l.417-422; clusterstate/clusterstate.go IsClusterHealthy, 1.34.5 l.418-430): the cluster is
unhealthy when its unready nodes number more than --ok-total-unready-count AND more than
--max-total-unready-percentage of all registered nodes -- every node of the cluster,
autoscaled or not. Nodes younger than 15 minutes (MaxNodeStartupTime) count as starting, not
unready; nodes with a --startup-taint count as unready. (So would GPU nodes whose GPUs are
not allocatable yet, but only those labelled kubernetes.azure.com/accelerator, the Azure
provider's GPU label, which kilonode's nodes do not carry: processors/customresources/
gpu_processor.go. A node is a GPU node to it by its nvidia.com/gpu allocatable.)
While unhealthy, each loop records a ClusterUnhealthy event, forgets every
node it had marked unneeded (so scale-down timers restart after recovery), and returns
before deleting failed-to-create nodes, fixing node-group sizes, scale-up and scale-down:
it halts ALL scale-up and scale-down, not scale-down only. Two things are not stopped:
node deletions started in an earlier loop finish (the actuator deletes in the background),
and, earlier in the loop, VMs that never registered as nodes within --max-node-provision-time
are removed, never taking a node group below its min size (removeOldUnregisteredNodes,
without --force-delete-unregistered-nodes).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import groupby

import pulumi
from pulumi_kubernetes import apps, core, meta, policy, rbac

from kilonode.k8s.bootstrap import KUBE_SYSTEM, RBAC_GROUP
from kilonode.k8s.cloud_provider import (
    AUTOSCALER_CONFIG_NAME,
    CONFIG_DIR,
    AzureTarget,
    autoscaler_config_data,
    controller_affinity,
)
from kilonode.k8s.gpu import POOL_LABEL
from kilonode.k8s.pod_security import NONROOT_USER, container_security_context
from kilonode.k8s.pods import awaited, config_digest_annotation, system_pod_spec, tolerate_uninitialized_nodes
from kilonode.node.gpu import protocol
from kilonode.paths import shown_vm_sizes
from kilonode.plan import defaults
from kilonode.plan.model import ClusterPlan, NodeGroup, NodePoolPlan

APP = "cluster-autoscaler"
RBAC_NAME = f"kilonode:{APP}"
# The leader-election Lease (main.go leaderElectionConfiguration: ResourceName
# "cluster-autoscaler", ResourceLock leases, in --namespace, kube-system by default) and the
# status ConfigMap (--status-config-map-name's default): the names upstream's RBAC grants by name.
LEASE_NAME = APP
STATUS_CONFIGMAP = "cluster-autoscaler-status"
# The image's binary (cluster-autoscaler/Dockerfile: COPY ... /cluster-autoscaler).
BINARY = "/cluster-autoscaler"
# Upstream's example mounts the node's CA bundle over the image's (distroless) one, so the
# trust store for Azure Resource Manager follows the node's OS updates.
CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
CLOUD_CONFIG = f"{CONFIG_DIR}/azure.json"

# (apiGroups, resources, verbs, resourceNames): cloudprovider/azure/examples/
# cluster-autoscaler-vmss-msi.yaml, ClusterRole cluster-autoscaler, l.18-65, in upstream's order.
_STORAGE = ["storageclasses", "csinodes", "csidrivers", "csistoragecapacities"]
Rule = tuple[list[str], list[str], list[str], list[str]]


def cluster_rules(minor: int) -> list[Rule]:
    """Upstream's ClusterRole at the tag for this minor. 1.34.5 and 1.35.2 (examples at commit
    12e6e2e1) add volumeattachments to the storage.k8s.io rule; 1.32.7 and 1.33.6 (715e1fdb) do not."""
    storage = [*_STORAGE, "volumeattachments"] if minor >= 34 else list(_STORAGE)
    return [
        ([""], ["events", "endpoints"], ["create", "patch"], []),
        ([""], ["pods/eviction"], ["create"], []),
        ([""], ["pods/status"], ["update"], []),
        ([""], ["endpoints"], ["get", "update"], [APP]),
        ([""], ["nodes"], ["watch", "list", "get", "update"], []),
        ([""], ["namespaces", "pods", "services", "replicationcontrollers", "persistentvolumeclaims",
                "persistentvolumes"], ["watch", "list", "get"], []),
        (["extensions"], ["replicasets", "daemonsets"], ["watch", "list", "get"], []),
        (["policy"], ["poddisruptionbudgets"], ["watch", "list"], []),
        (["apps"], ["statefulsets", "replicasets", "daemonsets"], ["watch", "list", "get"], []),
        (["storage.k8s.io"], storage, ["get", "list", "watch"], []),
        (["batch"], ["jobs", "cronjobs"], ["watch", "list", "get"], []),
        (["coordination.k8s.io"], ["leases"], ["create"], []),
        (["coordination.k8s.io"], ["leases"], ["get", "update"], [LEASE_NAME]),
    ]


# ... and its Role cluster-autoscaler in kube-system, l.69-85 (the same at every pinned tag).
NAMESPACE_RULES: list[Rule] = [
    ([""], ["configmaps"], ["create", "list", "watch"], []),
    ([""], ["configmaps"], ["delete", "get", "update", "watch"],
     [STATUS_CONFIGMAP, "cluster-autoscaler-priority-expander"]),
]


def _policy(rules: Sequence[Rule]) -> list[rbac.v1.PolicyRuleArgs]:
    return [rbac.v1.PolicyRuleArgs(api_groups=groups, resources=resources, verbs=verbs,
                                   resource_names=names or None)
            for groups, resources, verbs, names in rules]


def node_group_flags(plan: ClusterPlan) -> list[str]:
    """One --nodes per node group of every autoscaled pool, in plan order: the shared shards,
    with the bounds the plan set. Teams' shards are never node groups."""
    return [f"--nodes={group.min_size}:{group.max_size}:{group.shard}"
            for pool in plan.autoscaled_pools
            for group in _groups(pool)]


def _groups(pool: NodePoolPlan) -> tuple[NodeGroup, ...]:
    return pool.autoscaling.node_groups if pool.autoscaling is not None else ()


def pool_ceiling(pool: NodePoolPlan) -> int:
    """The most nodes a pool can have: its node groups' max sizes plus the teams' shards
    (fixed); a pool the autoscaler does not touch keeps its nodes."""
    if pool.autoscaling is None:
        return pool.nodes
    fixed = sum(s.capacity for s in pool.shards if s.team is not None)
    return fixed + sum(g.max_size for g in pool.autoscaling.node_groups)


def resource_ceilings(plan: ClusterPlan) -> tuple[int, int]:
    """--cores-total and --memory-total maxima (vCPUs, GiB): the planned cluster at its ceiling.

    Needed, not decorative: upstream's defaults (config/const.go DefaultMaxClusterCores =
    5000 * 64, DefaultMaxClusterMemory = 5000 * 64 * 20 GiB) count every node of the cluster
    and are below a 7,500-node cluster of 96-vCPU, 900-1,900 GiB GPU VMs: it would refuse
    every scale-up. "0" is no way out: 1.32-1.34 read a max of 0 as no limit
    (core/scaleup/resource/manager.go ResourcesLeft), 1.35 as a limit of 0
    (resourcequotas/factory.go NewQuotasTracker). The sizes come from kilonode's VM-size
    catalogue, as the plan carries them; the memory there is the VM's, a little above what the kubelet reports, so the
    ceiling never binds before the node groups' max sizes do.
    """
    cores = memory = 0.0
    for pool in plan.node_pools:
        if pool.vcpus is None or pool.memory_gib is None:
            raise ValueError(
                f"pool {pool.name}: {pool.vm_size} is not in kilonode's VM-size catalogue, so the cluster "
                "autoscaler's --cores-total/--memory-total cannot be set from the plan (upstream's defaults would "
                f"stop scale-up at 320,000 vCPUs); add the size to {shown_vm_sizes()}")
        cores += pool_ceiling(pool) * pool.vcpus
        memory += pool_ceiling(pool) * pool.memory_gib
    return int(cores), math.ceil(memory)


def autoscaler_args(plan: ClusterPlan) -> list[str]:
    """cluster-autoscaler's command line for this plan, one flag per entry (reasons in
    kilonode.plan.defaults; flag names checked against the pinned tag in the test)."""
    cores, memory = resource_ceilings(plan)
    gpu_groups = any(pool.gpus_per_node for pool in plan.autoscaled_pools)
    return [
        "--cloud-provider=azure",
        # the cloud provider's azure.json: identity, subscription, resource group, vmType vmss
        f"--cloud-config={CLOUD_CONFIG}",
        *node_group_flags(plan),
        # one replica acts; main.go defaults it to true, stated so a reader need not know
        "--leader-elect=true",
        # --- the 2,500-node guards ---------------------------------------------------------
        # halt everything while >10% (and >3) of the cluster's nodes are unready (see above)
        f"--max-total-unready-percentage={defaults.CLUSTER_AUTOSCALER_MAX_TOTAL_UNREADY_PERCENTAGE}",
        f"--ok-total-unready-count={defaults.CLUSTER_AUTOSCALER_OK_TOTAL_UNREADY_COUNT}",
        # how much one loop removes; the floor itself is the node groups' min sizes. At 1.32
        # --max-empty-bulk-delete (deprecated, removed in 1.33) follows this one when only this
        # one is given (main.go l.316-324)
        f"--max-scale-down-parallelism={defaults.CLUSTER_AUTOSCALER_MAX_SCALE_DOWN_PARALLELISM}",
        f"--max-drain-parallelism={defaults.CLUSTER_AUTOSCALER_MAX_DRAIN_PARALLELISM}",
        # --- gradual scale-up ----------------------------------------------------------------
        # Upstream documents this flag as a bound on one scale-up's size for the algorithm's
        # latency, "not a tool to rate-limit scale-up throughput": the loop after a scale-up
        # starts at once and can add this many again. It bounds a burst to a wave of the plan's
        # joins; it is not a rate limit (none exists at the tag).
        f"--max-nodes-per-scaleup={max_nodes_per_scaleup(plan)}",
        # one pool's node groups per scale-up (upstream's default, stated)
        f"--parallel-scale-up={str(defaults.CLUSTER_AUTOSCALER_PARALLEL_SCALE_UP).lower()}",
        f"--max-node-provision-time={defaults.CLUSTER_AUTOSCALER_MAX_NODE_PROVISION_TIME}",
        # the shards of one pool are alike (labels differ only in zone, which the Azure
        # comparator ignores: processors/nodegroupset/azure_nodegroups.go + BasicIgnoredLabels);
        # pools differ in kilonode.io/pool, so each pool is balanced on its own. Not with an
        # autoscaled InfiniBand pool: each of its shards is one fabric (RDMA reaches only the VMs
        # of one scale set), and a gang's new nodes split over several would be nodes its pods
        # cannot use together; unbalanced, one scale-up grows one scale set (the expander's
        # choice among those that fit the pods, their fabric affinity included).
        f"--balance-similar-node-groups={'false' if _grows_fabrics(plan) else 'true'}",
        # the planned cluster at its ceiling (upstream's defaults would refuse every scale-up)
        f"--cores-total=0:{cores}",
        f"--memory-total=0:{memory}",
        # --- scale-down of one-pod-per-node GPU work ------------------------------------------
        f"--scale-down-utilization-threshold={defaults.CLUSTER_AUTOSCALER_SCALE_DOWN_UTILIZATION_THRESHOLD}",
        f"--scale-down-gpu-utilization-threshold={defaults.CLUSTER_AUTOSCALER_SCALE_DOWN_GPU_UTILIZATION_THRESHOLD}",
        "--ignore-daemonsets-utilization=true",
        f"--scale-down-unneeded-time={defaults.CLUSTER_AUTOSCALER_SCALE_DOWN_UNNEEDED_TIME}",
        f"--scale-down-delay-after-add={defaults.CLUSTER_AUTOSCALER_SCALE_DOWN_DELAY_AFTER_ADD}",
        # Pods below this priority neither trigger a scale-up nor keep a node; the balloons sit
        # at it, so they do keep their nodes warm (kilonode.plan.defaults: priorities).
        f"--expendable-pods-priority-cutoff={defaults.AUTOSCALER_EXPENDABLE_PRIORITY_CUTOFF}",
        # GPU jobs keep scratch in emptyDir; what keeps a GPU job's node is its GPU request (the
        # threshold above), not its scratch volume. With the default (true) one emptyDir pod that
        # borrowed an idle GPU node would pin that node forever. Upstream's Azure examples say false.
        # A pod that must not move says so: cluster-autoscaler.kubernetes.io/safe-to-evict: "false".
        "--skip-nodes-with-local-storage=false",
        *(_gpu_taint_flags() if gpu_groups else []),
        f"--v={defaults.CLUSTER_AUTOSCALER_VERBOSITY}",
    ]


def max_nodes_per_scaleup(plan: ClusterPlan) -> int:
    """One scale-up: a placement group's worth, never more than one wave of the plan's joins."""
    return min(defaults.CLUSTER_AUTOSCALER_MAX_NODES_PER_SCALEUP, plan.components.joins.wave_nodes)


def _grows_fabrics(plan: ClusterPlan) -> bool:
    """An autoscaled InfiniBand pool: its node groups are fabrics, never to be balanced."""
    return any(pool.infiniband for pool in plan.autoscaled_pools)


def _gpu_taint_flags() -> list[str]:
    """kilonode's GPU health taints (kilonode.gpu.protocol) as the autoscaler must read them.

    A taint unknown to it stays in the node template it copies from a live node of the group,
    so no pending pod (none tolerates it) would fit a new node and no scale-up would happen.
    The startup check and a fault are startup taints: such a node is not ready for work, so it
    counts as unready (a fleet-wide fault halts the autoscaler, the 2,500-node guard). A faulty
    node, and a node still pending its first checks (the startup taint: its NVSwitch fabric may
    take minutes to register), is not removed as an unready, empty one after
    --scale-down-unready-time: the GPU health controller marks it
    `cluster-autoscaler.kubernetes.io/scale-down-disabled` while it carries either taint
    (kilonode.gpu.controller), so a faulty node stays with its evidence until a reboot or a
    person returns it. The idle re-check is a status taint: ignored in templates,
    the node still counts as ready (utils/taints/taints.go NewTaintConfig, and
    FilterOutNodesWithStartupTaints).
    """
    return [
        f"--startup-taint={protocol.STARTUP_TAINT}",
        f"--startup-taint={protocol.FAULT_TAINT}",
        f"--status-taint={protocol.CHECK_TAINT}",
    ]


def _bounds(pool: NodePoolPlan) -> str:
    """Node groups grouped by bounds: '25 x 50..100 (first ... last)'."""
    groups = _groups(pool)
    parts = []
    for (low, high), run in groupby(groups, key=lambda g: (g.min_size, g.max_size)):
        names = [g.shard for g in run]
        span = names[0] if len(names) == 1 else f"{names[0]} ... {names[-1]}"
        parts.append(f"{len(names)} x {low}..{high} ({span})")
    return "; ".join(parts)


def describe(plan: ClusterPlan) -> list[str]:
    """What `kilonode explain` says about the cluster autoscaler: one line each."""
    pools = plan.autoscaled_pools
    if not pools:
        return ["no pool has autoscaling: no cluster autoscaler; every scale set keeps its planned capacity"]
    version = plan.components.cluster_autoscaler_version
    lines = [
        f"cluster-autoscaler {version}: Deployment {KUBE_SYSTEM}/{APP}, {defaults.CLUSTER_AUTOSCALER_REPLICAS} "
        f"replicas, one active (Lease {KUBE_SYSTEM}/{LEASE_NAME}); Azure as its own user-assigned "
        f"identity, from azure.json in ConfigMap {KUBE_SYSTEM}/{AUTOSCALER_CONFIG_NAME} (vmType vmss)",
    ]
    for pool in pools:
        assert pool.autoscaling is not None
        teams = len([s for s in pool.shards if s.team is not None])
        lines.append(
            f"pool {pool.name}: node groups (--nodes min:max:scale set) {_bounds(pool)}; the pool between "
            f"{pool.autoscaling.min_nodes:,} and {pool_ceiling(pool):,} nodes"
            + (f"; {teams} teams' scale sets are not node groups" if teams else ""))
    lines += [
        f"guard: halts all scale-up and scale-down while more than "
        f"{defaults.CLUSTER_AUTOSCALER_MAX_TOTAL_UNREADY_PERCENTAGE}% (and more than "
        f"{defaults.CLUSTER_AUTOSCALER_OK_TOTAL_UNREADY_COUNT}) of the cluster's nodes are unready "
        "(upstream: 45%); no pool below its node groups' min sizes (half of its nodes, or minNodes)",
        f"scale-up: at most {max_nodes_per_scaleup(plan)} nodes per scale-up (a wave of joins: "
        f"{plan.components.joins.wave_nodes}), one pool at a time, balanced over its scale sets; not a rate limit "
        "(the next loop starts at once after a scale-up); a new node has "
        f"{defaults.CLUSTER_AUTOSCALER_MAX_NODE_PROVISION_TIME} to become ready",
        "scale-down: only nodes where no pod requests a GPU (GPU nodes) or anything (other nodes), DaemonSets "
        f"aside, unneeded for {defaults.CLUSTER_AUTOSCALER_SCALE_DOWN_UNNEEDED_TIME}; at most "
        f"{defaults.CLUSTER_AUTOSCALER_MAX_SCALE_DOWN_PARALLELISM} nodes deleted at once, "
        f"{defaults.CLUSTER_AUTOSCALER_MAX_DRAIN_PARALLELISM} drained",
    ]
    try:
        cores, memory = resource_ceilings(plan)
        lines.append(f"cluster ceiling: {cores:,} vCPUs, {memory:,} GiB (--cores-total, --memory-total: the planned "
                     "maximum; upstream's defaults stop at 320,000 vCPUs)")
    except ValueError as error:
        lines.append(f"cannot be deployed as planned: {error}")
    return lines


def _labels() -> dict[str, str]:
    return {"k8s-app": APP, "app.kubernetes.io/managed-by": "kilonode"}


@dataclass(frozen=True)
class ClusterAutoscalerArgs:
    plan: ClusterPlan
    # where the cloud provider acts: its azure.json (kilonode.k8s.cloud_provider autoscaler_config_data),
    # whose digest the pod template carries
    target: pulumi.Output[AzureTarget]


def _pod_spec(plan: ClusterPlan, account: core.v1.ServiceAccount) -> core.v1.PodSpecArgs:
    """cluster-autoscaler's pod: on the host network, preferably off the nodes it may remove."""
    port = defaults.CLUSTER_AUTOSCALER_PORT
    return system_pod_spec(
        "cluster",  # upstream's chart: the cluster's own capacity depends on it
        service_account=account,
        system_pool=True,
        # as cloud-controller-manager: the control-plane VMs run no kubelet, so
        # it runs on the controller pools, whose scale sets alone carry its
        # identity, on the host network, where the instance metadata service
        # gives the identity's token (upstream's MSI example too)
        host_network=True,
        tolerations=tolerate_uninitialized_nodes(),
        # Required: the controller pools. Preferably off the nodes it may remove: a node it
        # runs on is one whose removal restarts it (a kube-system pod with a PDB: evictable,
        # not pinned).
        affinity=controller_affinity(plan, preferred=[
            core.v1.PreferredSchedulingTermArgs(
                weight=100,
                preference=core.v1.NodeSelectorTermArgs(match_expressions=[
                    core.v1.NodeSelectorRequirementArgs(
                        key=POOL_LABEL, operator="NotIn",
                        values=[p.name for p in plan.autoscaled_pools]),
                ]),
            ),
        ]),
        # replicas on different nodes: one node's loss leaves the other, and
        # the host-network port is the node's
        topology_spread_constraints=[core.v1.TopologySpreadConstraintArgs(
            max_skew=1, topology_key="kubernetes.io/hostname", when_unsatisfiable="DoNotSchedule",
            label_selector=meta.v1.LabelSelectorArgs(match_labels={"k8s-app": APP}),
        )],
        containers=[core.v1.ContainerArgs(
            name=APP,
            image=plan.components.cluster_autoscaler_image,
            command=[BINARY],
            args=autoscaler_args(plan),
            ports=[core.v1.ContainerPortArgs(name="metrics", container_port=port, protocol="TCP")],
            resources=core.v1.ResourceRequirementsArgs(
                requests=defaults.CLUSTER_AUTOSCALER_REQUESTS,
                limits=defaults.CLUSTER_AUTOSCALER_LIMITS),
            # upstream's chart: /health-check on --address. 200 on a standby
            # replica; on the active one 500 once no loop succeeded for
            # --max-failing-time (15m) or none ran for --max-inactivity (10m)
            # (metrics/liveness.go). A loop that halts for unready nodes succeeds.
            liveness_probe=core.v1.ProbeArgs(
                http_get=core.v1.HTTPGetActionArgs(path="/health-check", port=port),
                initial_delay_seconds=30, period_seconds=10, timeout_seconds=5,
            ),
            # the image runs as distroless's nonroot user (cluster-autoscaler/Dockerfile at every
            # pinned tag, 1.32.7 to 1.35.2: FROM gcr.io/distroless/static:nonroot, no USER of its
            # own), named here for the kubelet's runAsNonRoot check, and writes nothing
            security_context=container_security_context(NONROOT_USER),
            volume_mounts=[
                core.v1.VolumeMountArgs(name="cloud-config", mount_path=CONFIG_DIR, read_only=True),
                core.v1.VolumeMountArgs(name="ssl-certs", mount_path=CA_BUNDLE, read_only=True),
            ],
        )],
        volumes=[
            core.v1.VolumeArgs(name="cloud-config", config_map=core.v1.ConfigMapVolumeSourceArgs(
                name=AUTOSCALER_CONFIG_NAME)),
            core.v1.VolumeArgs(name="ssl-certs", host_path=core.v1.HostPathVolumeSourceArgs(
                path=CA_BUNDLE, type="File")),
        ],
    )


class ClusterAutoscaler(pulumi.ComponentResource):
    def __init__(self, name: str, args: ClusterAutoscalerArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("kilonode:k8s:ClusterAutoscaler", name, None, opts)
        plan = args.plan
        if not plan.autoscaled_pools:
            raise ValueError("ClusterAutoscaler needs a pool with autoscaling; a cluster without one gets none")
        child = pulumi.ResourceOptions(parent=self)
        labels = _labels()

        account = core.v1.ServiceAccount(
            f"{name}-sa", metadata=meta.v1.ObjectMetaArgs(name=APP, namespace=KUBE_SYSTEM, labels=labels), opts=child)
        subject = rbac.v1.SubjectArgs(kind="ServiceAccount", name=APP, namespace=KUBE_SYSTEM)
        role = rbac.v1.ClusterRole(
            f"{name}-role", metadata=meta.v1.ObjectMetaArgs(name=RBAC_NAME, labels=labels),
            rules=_policy(cluster_rules(plan.kubernetes_minor)), opts=child)
        rbac.v1.ClusterRoleBinding(
            f"{name}-binding", metadata=meta.v1.ObjectMetaArgs(name=RBAC_NAME, labels=labels),
            role_ref=rbac.v1.RoleRefArgs(api_group=RBAC_GROUP, kind="ClusterRole", name=role.metadata.name),
            subjects=[subject], opts=child)
        ns_role = rbac.v1.Role(
            f"{name}-ns-role", metadata=meta.v1.ObjectMetaArgs(name=RBAC_NAME, namespace=KUBE_SYSTEM, labels=labels),
            rules=_policy(NAMESPACE_RULES), opts=child)
        rbac.v1.RoleBinding(
            f"{name}-ns-binding",
            metadata=meta.v1.ObjectMetaArgs(name=RBAC_NAME, namespace=KUBE_SYSTEM, labels=labels),
            role_ref=rbac.v1.RoleRefArgs(api_group=RBAC_GROUP, kind="Role", name=ns_role.metadata.name),
            subjects=[subject], opts=child)

        selector = {"k8s-app": APP}
        apps.v1.Deployment(
            f"{name}-deployment",
            metadata=meta.v1.ObjectMetaArgs(name=APP, namespace=KUBE_SYSTEM, labels=labels),
            spec=apps.v1.DeploymentSpecArgs(
                replicas=defaults.CLUSTER_AUTOSCALER_REPLICAS,
                selector=meta.v1.LabelSelectorArgs(match_labels=selector),
                template=core.v1.PodTemplateSpecArgs(
                    # Rolls on an azure.json change (kilonode.k8s.pods.CONFIG_DIGEST_ANNOTATION): the
                    # autoscaler opens --cloud-config once, when it builds its cloud provider
                    # (cloudprovider/azure/azure_cloud_provider.go BuildAzure: os.Open, then
                    # CreateAzureManager), and never reads it again.
                    metadata=meta.v1.ObjectMetaArgs(
                        labels=labels,
                        annotations=config_digest_annotation(autoscaler_config_data(plan, args.target))),
                    spec=_pod_spec(plan, account),
                ),
            ),
            # its pods wait for the first pool node, still allocating on a first run. spec.replicas
            # is set at creation and left after: the documented pause (`kubectl -n kube-system scale
            # deployment cluster-autoscaler --replicas=0` for a `pulumi up` that sends the autoscaled
            # scale sets' sizes, docs/azure.md) makes kubectl's manager own the field, and a later
            # server-side apply of this Deployment (a new image at a minor upgrade) sending its own
            # value would then fail with a field conflict, or, forced, start the autoscaler mid-run;
            # ignored, pulumi-kubernetes leaves the field out of its apply (provider/pkg/await
            # handleSSAIgnoreFields).
            opts=pulumi.ResourceOptions.merge(awaited(child, plan.components.awaits),
                                              pulumi.ResourceOptions(ignore_changes=["spec.replicas"])),
        )
        policy.v1.PodDisruptionBudget(
            f"{name}-pdb",
            metadata=meta.v1.ObjectMetaArgs(name=APP, namespace=KUBE_SYSTEM, labels=labels),
            spec=policy.v1.PodDisruptionBudgetSpecArgs(
                max_unavailable=1, selector=meta.v1.LabelSelectorArgs(match_labels=selector)),
            opts=child,
        )
        self.register_outputs({})
