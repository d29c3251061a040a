"""Capacity: priorities with meaning, the autoscaler's balloons, and the teams' borrowing rule.

- PriorityClasses (kilonode.plan.defaults says why each value): infrastructure, team work
  (the default for a pod that names none), borrowable low-priority work, and the balloon class
  at the autoscaler's expendable cutoff.
- Balloons (field notes: the autoscaler buffer, "a Deployment of 'max size' low-priority
  placeholder pods"): per autoscaled pool with warmNodes, a Deployment of that many pause pods,
  each requesting the whole node (every GPU, or all but one vCPU) and one per node, so the
  autoscaler keeps that many nodes warm. Any other pod preempts one at once (the balloon class
  is the lowest; balloons never preempt), the Deployment re-creates it, it goes pending, and
  the autoscaler adds a node for it: the buffer refills itself. They use the pause image every
  node has preloaded, so a balloon never pulls.
- Teams (kilonode.plan.capacity): a team's nodes register with the `kilonode.io/team=<team>`
  label and a NoSchedule taint of the same key. The team's own pods tolerate their value;
  borrowers tolerate the key with operator Exists (any team) -- and the admission policy here
  lets only the borrowable and balloon classes do that, so a team's work cannot squat on
  another team's nodes at team priority, where it could not be preempted back.
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
from pulumi_kubernetes import apps, core, meta, scheduling

from kilonode.k8s.admission import admission_policy
from kilonode.k8s.network_policy import default_deny
from kilonode.k8s.node_agents import AGENT_USERS, NODE_AGENTS, NODE_SPEC_RULE, OWN_NODE_RULE
from kilonode.k8s.pod_security import RUNTIME_DEFAULT_SECCOMP, kilonode_namespace
from kilonode.k8s.pods import SKIP_AWAIT
from kilonode.node.gpu import protocol
from kilonode.plan import defaults, wellknown
from kilonode.plan.model import ClusterPlan, NodePoolPlan

NAMESPACE = "kilonode-capacity"
POOL_LABEL = wellknown.POOL_LABEL
LABELS = {"app.kubernetes.io/managed-by": "kilonode", "app.kubernetes.io/part-of": "kilonode-capacity"}
BALLOON_APP = "kilonode-balloon"


@dataclass(frozen=True)
class Priority:
    name: str
    value: int
    global_default: bool
    preempts: bool
    description: str


PRIORITIES = (
    Priority("kilonode-infrastructure", defaults.PRIORITY_INFRASTRUCTURE, False, True,
             "Cluster services users add (monitoring, log shipping): above all work, below system-*-critical."),
    Priority("kilonode-team", defaults.PRIORITY_TEAM, True, True,
             "Team work: the default for pods that name no class. Runs on its team's nodes or shared ones."),
    Priority("kilonode-borrowable", defaults.PRIORITY_BORROWABLE, False, True,
             "Low-priority work that may borrow any team's idle nodes (tolerate kilonode.io/team with operator "
             "Exists); preempted first when the team's own work arrives."),
    Priority("kilonode-balloon", defaults.PRIORITY_BALLOON, False, False,
             "The autoscaler's placeholder pods: at its expendable cutoff, so it keeps their nodes warm; every "
             "other pod preempts them, and they never preempt."),
)
BORROWING_CLASSES = ("kilonode-borrowable", "kilonode-balloon")

# The admission rule, in CEL (ValidatingAdmissionPolicy, admissionregistration.k8s.io/v1, GA
# in 1.30). A toleration reaches a team's nodes in three forms, and each is checked:
# - key kilonode.io/team, operator Exists: every team's nodes;
# - no key, operator Exists: every taint at all, every team's among them (core/v1 Toleration:
#   "Empty means match all taint keys. If the key is empty, operator must be Exists");
# - key kilonode.io/team, operator Equal (the default when none is given) with a value: that
#   one team's nodes.
# Borrowing (the first two, or another team's value) needs a borrowing class, so the team it
# borrows from can preempt it. A team's own value is admitted when the pod's namespace carries
# that team's label (`kilonode.io/team=<team>` on the Namespace: namespaces are labelled by
# whoever may update them, not by the pod's author). kube-system is exempt: its DaemonSets are
# the per-node agents every node needs, and they tolerate everything.
_TEAM = wellknown.TEAM_LABEL
_NAMESPACE_TEAM = (
    f"(has(namespaceObject.metadata.labels) && '{_TEAM}' in namespaceObject.metadata.labels "
    f"? namespaceObject.metadata.labels['{_TEAM}'] : '')"
)
_BORROWS = (
    "((!has(t.key) || t.key == '') && has(t.operator) && t.operator == 'Exists') || "
    f"(has(t.key) && t.key == '{_TEAM}' && has(t.operator) && t.operator == 'Exists') || "
    f"(has(t.key) && t.key == '{_TEAM}' && (!has(t.operator) || t.operator == 'Equal') && "
    f"(!has(t.value) || t.value != {_NAMESPACE_TEAM}))"
)
BORROW_RULE = (
    "request.namespace == 'kube-system' || !has(object.spec.tolerations) || "
    f"!object.spec.tolerations.exists(t, {_BORROWS}) || "
    "(has(object.spec.priorityClassName) && object.spec.priorityClassName in "
    f"[{', '.join(repr(name) for name in BORROWING_CLASSES)}])"
)


# Who writes a Node object and is held to the node-identity rules below:
# - a kubelet, as system:node:<name>. NodeRestriction (on in every apiserver) keeps it to its own
#   Node and, after registration, its taints; for labels it refuses only node-restriction.kubernetes.io/
#   keys and kubernetes.io/ or k8s.io/ keys outside the kubelet's own set, on create and update
#   (kubernetes plugin/pkg/admission/noderestriction/admission.go, admitNode: getForbiddenLabels).
#   kilonode.io/ labels pass it untouched: a node's --node-labels (or a stolen node credential)
#   could name any pool, team or fabric;
# - cloud-node-manager's ServiceAccount. Its pod runs on every node (a DaemonSet) with a token whose
#   ClusterRole may update and patch every Node and nodes/status (kilonode.k8s.cloud_provider
#   CNM_RULES), and NodeRestriction does not apply to a ServiceAccount: whoever owns one node holds
#   that token, and could relabel any node. It sets only cloud labels (zone, region, instance type)
#   and never the ones checked here, so an honest write always keeps them as the name implies;
# - calico-node's ServiceAccount (kilonode.k8s.calico), on every node for the same reason: upstream's
#   ClusterRole updates and patches nodes/status (Calico keeps annotations on the Node), and a
#   nodes/status write may change the Node's labels. It writes none of the labels checked here.
# Both agents (kilonode.k8s.node_agents NODE_AGENTS) are also held to their own Node and to what
# they write there (OWN_NODE_RULE, NODE_SPEC_RULE). Administrators and the other controllers are
# not checked: they are not a node.
NODE_WRITER = (
    "(request.userInfo.username.startsWith('system:node:') || "
    f"request.userInfo.username in [{', '.join(repr(u) for u in AGENT_USERS)}])"
)


def _label(key: str) -> str:
    """CEL: the Node's value of label `key`, '' where it has none."""
    return f"(has(object.metadata.labels) && '{key}' in object.metadata.labels ? object.metadata.labels['{key}'] : '')"


def team_node_rule(plan: ClusterPlan) -> str:
    """CEL: a node writing a Node object (NODE_WRITER) carries the team label of the scale set
    its name comes from (a scale set's computer-name prefix is its shard name,
    kilonode.azure.node_pool), and none on a shared scale set; when it registers (CREATE), the
    team's NoSchedule taint too. NodeRestriction already keeps a kubelet to its own Node and
    forbids it to change taints after registration; it does not restrict kilonode.io/ labels,
    so without this a node (its kubelet flags, or a stolen node credential) could claim any
    team's capacity or join a team without its taint."""
    expected = "''"
    for team in reversed(plan.teams):
        prefixes = ", ".join(repr(shard) for shard in team.shards)
        expected = f"([{prefixes}].exists(p, object.metadata.name.startsWith(p)) ? '{team.name}' : {expected})"
    tainted = (f"has(object.spec.taints) && object.spec.taints.exists(t, t.key == '{_TEAM}' && has(t.value) && "
               f"t.value == {expected} && t.effect == '{wellknown.TEAM_TAINT_EFFECT}')")
    return (f"!{NODE_WRITER} || ({_label(_TEAM)} == {expected} && "
            f"(request.operation != 'CREATE' || {expected} == '' || ({tainted})))")


# CEL: a node's own fabric label (kilonode.render.pool: fabric-label) names the scale set its
# name comes from; a node writing its Node object cannot name another.
FABRIC_NODE_RULE = (
    f"!{NODE_WRITER} || !has(object.metadata.labels) || "
    f"!('{wellknown.FABRIC_LABEL}' in object.metadata.labels) || "
    f"(object.metadata.name.startsWith(object.metadata.labels['{wellknown.FABRIC_LABEL}']) && "
    f"size(object.metadata.name) == size(object.metadata.labels['{wellknown.FABRIC_LABEL}']) + 6)"
)

# The labels that steer the cluster's own workloads and the jobs: the pool (the device plugins,
# the balloons, CoreDNS's autoscaler, Prometheus select by it), the system label
# (cloud-controller-manager requires it; CoreDNS, the autoscaler, the gang scheduler, the CSR
# approver and metrics-server prefer it: kilonode.k8s.pods.prefer_system_pool) and the NCCL
# topology family (a training job selects the nodes whose topo.xml it mounts). A node that could
# call itself a system node would receive those pods and their ServiceAccount tokens.
#
# Upstream's own answer is a node-restriction.kubernetes.io/ label, which a kubelet may not set at
# all (admission.go above, v1.LabelNamespaceNodeRestriction): then something else must label every
# node after it registers -- a controller with patch on every Node, running before any system pod
# can land (7,500 nodes joining in waves, the autoscaler adding more) -- and that label still does
# not stop cloud-node-manager's token, which NodeRestriction does not govern. The plan already knows
# what each name means (each pool's shards are its scale sets' computer-name prefixes, and a node
# is named <prefix><6 base-36 characters>, kilonode.node.node_client_approver.rules), so the kubelet
# keeps registering its labels and the policy checks them against its name: no new controller, the
# same labels every selector already uses, and both writers held to it.
PLACEMENT_LABELS = (POOL_LABEL, wellknown.SYSTEM_LABEL, wellknown.NCCL_TOPOLOGY_LABEL)


def _named_from(shards: list[str]) -> str:
    """CEL: the Node's name is one of `shards`' computer-name prefixes and 6 characters (so a
    shard whose name is another's prefix is not mistaken for it)."""
    prefixes = ", ".join(repr(shard.lower()) for shard in shards)
    return f"[{prefixes}].exists(p, object.metadata.name.startsWith(p) && size(object.metadata.name) == size(p) + 6)"


def implied_label(plan: ClusterPlan, key: str) -> str:
    """CEL: the value of label `key` the node's name implies -- its pool's (NodePoolPlan.labels,
    what its kubelet registers with), '' where the pool has none or the name is no pool's.
    Shards grouped by value, so each shard's prefix is tried once per label: ~80 prefixes at
    7,500 nodes, far inside the apiserver's cost limits (tests/k8s/test_capacity.py counts)."""
    by_value: dict[str, list[str]] = {}
    for pool in plan.node_pools:
        value = pool.labels.get(key)
        if value:
            by_value.setdefault(value, []).extend(shard.name for shard in pool.shards)
    expected = "''"
    for value, shards in reversed(by_value.items()):
        expected = f"({_named_from(shards)} ? {value!r} : {expected})"
    return expected


def placement_node_rule(plan: ClusterPlan) -> str:
    """CEL: a Node written by a node (NODE_WRITER) carries exactly the pool, system and NCCL
    topology labels its name implies: none it may add, change or drop."""
    checks = " && ".join(f"{_label(key)} == {implied_label(plan, key)}" for key in PLACEMENT_LABELS)
    return f"!{NODE_WRITER} || ({checks})"


def node_identity_rules(plan: ClusterPlan) -> list[tuple[str, str]]:
    """The `kilonode-node-identity` policy's rules (CEL, message), on nodes and nodes/status."""
    node_rules = [(
        placement_node_rule(plan),
        f"a node's {', '.join(PLACEMENT_LABELS)} labels must be those of the pool its name comes from "
        "(its scale set's computer-name prefix): a node cannot make itself a system node, another pool's "
        "or another topology's",
    )]
    if plan.teams:
        node_rules.append((
            team_node_rule(plan),
            f"a node's {wellknown.TEAM_LABEL} label (and, when it registers, its NoSchedule taint) must name the "
            "team its scale set is reserved for, and no team on a shared scale set: a node cannot choose its "
            "team",
        ))
    if any(pool.infiniband for pool in plan.node_pools):
        node_rules.append((
            FABRIC_NODE_RULE,
            f"a node's {wellknown.FABRIC_LABEL} label must name its own scale set (its name less the 6 "
            "characters of the instance): a node cannot join another InfiniBand fabric's gangs",
        ))
    # The per-node agents' tokens: their own Node only, and there only what they write
    # (kilonode.k8s.node_agents; preflight's node-writers check finds every DaemonSet account
    # that may write Nodes among them).
    agents = ", ".join(agent.account for agent in NODE_AGENTS)
    node_rules += [
        (OWN_NODE_RULE,
         f"a per-node agent ({agents}) may update only the Node its pod runs on (its token's "
         "authentication.kubernetes.io/node-name): a token not bound to a pod on this node may not write it"),
        (NODE_SPEC_RULE,
         f"a per-node agent ({agents}) may not cordon a Node, add, change or remove its taints (cloud-node-manager "
         "may only lift the cloud provider's uninitialized taint) or change a providerID already set"),
    ]
    # nodes/status too: an update of the status subresource can change labels as well, and
    # cloud-node-manager may patch it. UPDATE covers PATCH: the apiserver admits a patch as an
    # update (kilonode.k8s.node_agents), and failurePolicy is Fail (kilonode.k8s.admission).
    return node_rules


@dataclass(frozen=True)
class CapacityArgs:
    plan: ClusterPlan


def balloon_name(pool: str) -> str:
    return f"balloon-{pool}"


def balloon_tolerations(pool: NodePoolPlan) -> list[dict[str, str]]:
    """The stack's own taints of the pool (which its work tolerates too), not the GPU health
    agent's (a balloon waits for a checked node like any pod) nor a team's (balloons keep the
    shared scale sets warm: the autoscaler's node groups)."""
    skip = {protocol.STARTUP_TAINT, wellknown.TEAM_LABEL}
    found = [wellknown.toleration_of(taint) for taint in pool.taints]
    return [t for t in found if t["key"] not in skip]


def balloon_pod_spec(pool: NodePoolPlan) -> dict[str, object]:
    assert pool.autoscaling is not None
    selector = {"app": BALLOON_APP, POOL_LABEL: pool.name}
    requests = dict(pool.autoscaling.balloon_requests)
    return {
        "priorityClassName": "kilonode-balloon",
        # preempted: gone at once, so the real pod starts without waiting
        "terminationGracePeriodSeconds": 0,
        "automountServiceAccountToken": False,
        "securityContext": dict(RUNTIME_DEFAULT_SECCOMP),
        "nodeSelector": {POOL_LABEL: pool.name},
        "tolerations": balloon_tolerations(pool),
        "affinity": {
            # one balloon per node: each stands for a whole warm node
            "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": selector}, "topologyKey": "kubernetes.io/hostname"},
            ]},
            # the shared scale sets only: the autoscaler's node groups (a team's nodes are the
            # team's, and tainted against balloons anyway)
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": wellknown.TEAM_LABEL, "operator": "DoesNotExist"}]},
            ]}},
        },
        "containers": [{
            "name": "placeholder",
            # preloaded on every node (the pause image is in every pool image): no pull
            "image": pool.pause_image,
            "resources": {"requests": requests, "limits": requests},
            "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                "runAsNonRoot": True, "runAsUser": 65535,
                                "capabilities": {"drop": ["ALL"]}},
        }],
    }


class Capacity(pulumi.ComponentResource):
    def __init__(self, name: str, args: CapacityArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("kilonode:k8s:Capacity", name, None, opts)
        # its namespace, where it makes one (balloons): kilonode.k8s.service_accounts patches its default account
        self.namespace: core.v1.Namespace | None = None
        plan = args.plan
        child = pulumi.ResourceOptions(parent=self)
        for priority in PRIORITIES:
            scheduling.v1.PriorityClass(
                f"{name}-{priority.name}",
                metadata=meta.v1.ObjectMetaArgs(name=priority.name, labels=LABELS),
                value=priority.value,
                global_default=priority.global_default,
                preemption_policy="PreemptLowerPriority" if priority.preempts else "Never",
                description=priority.description,
                opts=child,
            )
        if plan.teams:
            admission_policy(
                f"{name}-borrowing", "kilonode-team-borrowing", "pods", [(
                    BORROW_RULE,
                    f"a pod that tolerates another team's taint ({wellknown.TEAM_LABEL} with operator Exists, a "
                    f"toleration of every taint, or a team value its namespace's {wellknown.TEAM_LABEL} label does "
                    f"not name) borrows that team's nodes: give it priorityClassName {BORROWING_CLASSES[0]}, so "
                    "the team it borrows from can preempt it",
                )],
                LABELS, child,
            )
        admission_policy(f"{name}-node-identity", "kilonode-node-identity", ["nodes", "nodes/status"],
                         node_identity_rules(plan),
                         LABELS, child)
        balloons = [pool for pool in plan.autoscaled_pools if pool.autoscaling and pool.autoscaling.warm_nodes]
        if not balloons:
            self.register_outputs({})
            return
        namespace = self.namespace = kilonode_namespace(f"{name}-namespace", NAMESPACE, LABELS,
                                                        plan.kubernetes_minor, child)
        # pause containers: they serve nothing and call nothing (no service-account token)
        default_deny(f"{name}-default-deny", namespace.metadata.name, LABELS, egress=True, opts=child)
        for pool in balloons:
            assert pool.autoscaling is not None
            selector = {"app": BALLOON_APP, POOL_LABEL: pool.name}
            # Not waited for (kilonode.k8s.pods.SKIP_AWAIT): a balloon pod is Pending by design
            # whenever its pool has no free node (the autoscaler adds one for it, up to the
            # pool's ceiling; at the ceiling it stays Pending), and it exists to be preempted.
            # Its readiness says nothing about the cluster, so no timeout would be right.
            apps.v1.Deployment(
                f"{name}-{balloon_name(pool.name)}",
                metadata=meta.v1.ObjectMetaArgs(name=balloon_name(pool.name), namespace=namespace.metadata.name,
                                                labels={**LABELS, **selector}, annotations=SKIP_AWAIT),
                spec=apps.v1.DeploymentSpecArgs(
                    replicas=pool.autoscaling.warm_nodes,
                    selector=meta.v1.LabelSelectorArgs(match_labels=selector),
                    template=core.v1.PodTemplateSpecArgs(
                        metadata=meta.v1.ObjectMetaArgs(labels=selector),
                        spec=balloon_pod_spec(pool),  # type: ignore[arg-type]
                    ),
                ),
                opts=child,
            )
        self.register_outputs({})


def describe(plan: ClusterPlan) -> list[str]:
    """Priorities, teams' borrowing rule and balloons, one line each (kilonode explain)."""
    lines = ["priorities: " + ", ".join(f"{p.name} {p.value:,}" + (" (default)" if p.global_default else "")
                                        for p in PRIORITIES)
             + "; system-cluster-critical and system-node-critical stay the control plane's"]
    if plan.teams:
        lines.append(f"borrowing: pods tolerating {wellknown.TEAM_LABEL} (operator Exists) must be "
                     f"{BORROWING_CLASSES[0]} (ValidatingAdmissionPolicy kilonode-team-borrowing)")
    for pool in plan.autoscaled_pools:
        assert pool.autoscaling is not None
        if pool.autoscaling.warm_nodes:
            wants = ", ".join(f"{k}: {v}" for k, v in pool.autoscaling.balloon_requests.items())
            lines.append(f"balloons: {NAMESPACE}/{balloon_name(pool.name)}, {pool.autoscaling.warm_nodes} pods of "
                         f"{wants} (one per node, class kilonode-balloon {defaults.PRIORITY_BALLOON})")
    return lines
