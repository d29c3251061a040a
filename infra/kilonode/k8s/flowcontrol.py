"""ApiProtection: API Priority and Fairness (flowcontrol.apiserver.k8s.io/v1, GA in 1.29) for the
traffic the field notes warn of: agents on every node that LIST and WATCH the apiserver.

Three Limited priority levels of kilonode's own, each with one FlowSchema (numbers and their
reasons in kilonode.plan.defaults, APF_*):

- kilonode-node-agents: the per-node DaemonSets of this repository that talk to the apiserver,
  by ServiceAccount -- kube-proxy (kube-system/kube-proxy, kilonode.k8s.proxy: LIST/WATCH of
  Services, EndpointSlices and its own Node, Events) and cloud-node-manager
  (kube-system/cloud-node-manager, kilonode.k8s.cloud_provider: its Node, nodes/status).
  and Calico (kilonode.k8s.calico): calico-node on every node (kube-system/calico-node: at start its
  Node and default config objects, then the node-status reporter's watch) and Typha
  (kube-system/calico-typha: a few dozen replicas that LIST and WATCH Pods, Namespaces, policies and
  Calico's kinds for every Felix). Typha is not per node, but it is the per-node agents' reads
  moved to one place: its re-lists after a rollout are the same load, so it queues beside them.
  Without this schema all of them fall to the built-in kube-system-service-accounts schema, i.e. into
  workload-high beside kube-scheduler and kube-controller-manager, where 7,500 kube-proxies
  re-listing after a rollout compete with scheduling.
- kilonode-monitoring: the hook for monitoring agents -- every ServiceAccount in the
  `monitoring` namespace, and any identity in the group kilonode:monitoring-agents (the group
  grants nothing; it only classifies). The FlowSchema carries the label kilonode.io/hook=
  monitoring-agents and an annotation saying how to join. Without it such agents land in
  workload-low (ServiceAccounts) or global-default (everyone else), next to every workload and
  every cluster admin.
- kilonode-node-bootstrap: joining nodes, as long as they authenticate with a bootstrap token
  (group system:bootstrappers: creating their client CSR and waiting for it). Without it they
  land in global-default beside every user, and since every node uses the one token, as one
  flow there: a wave of joins would fill that flow's queues and be answered 429. Here they
  have their own seats and a deep queue (kilonode.plan.defaults APF_BOOTSTRAP_*).

The levels borrow nothing (a busy fleet never holds more than its nominal seats) and queue
per ServiceAccount or user (ByUser), so a burst waits in its own queues and is answered 429
only past them. None takes seats from the built-in levels: the apiservers' concurrency limit
grows by these levels' shares (kilonode.plan.resolve.components.apiserver_inflight), and
tests/k8s/test_flowcontrol.py computes every level's seats as the apiserver does.

Not covered, on purpose:
- The NVIDIA device plugin (kilonode.k8s.gpu) does not talk to the apiserver: at v0.17.4
  (fd56a747) cmd/nvidia-device-plugin imports no Kubernetes client (only the kubelet's
  device-plugin gRPC API, k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1); client-go is used by
  cmd/gpu-feature-discovery and cmd/config-manager, which kilonode does not deploy.
- The GPU health agent on each GPU node acts as the node itself (the kubelet's client
  certificate: user system:node:<node>, group system:nodes; kilonode.gpu.agent). Its few
  requests are classified as the kubelet's: GET of its Node and PATCH of nodes/status by the
  built-in system-node-high schema (precedence 400, level node-high); its Events and the LIST of
  pods on its node by system-nodes (500, level system). That is fine: a handful of requests per
  node every passive interval, beside the kubelet's own status updates every 10 s; they are
  node-health reports, which node-high exists to keep flowing; and both schemas distinguish
  ByUser, so each node is its own flow -- a misbehaving agent queues behind its own kubelet
  only. kilonode's schemas name no system:nodes identity and come after both.
- The kubelet of a joining node, once it has its client certificate: its Node, nodes/status and
  Lease stay in the built-in system-node-high (level node-high), the rest in system-nodes
  (level system), as any kubelet's; a new node's are the same requests as a running one's, and
  node-high exists so that node heartbeats are never starved. How many nodes join at once is
  bounded where they are created (kilonode.plan.resolve.joins), not by moving their requests.
- Deployments (CoreDNS, cloud-controller-manager, the CSR approver) run a few replicas, not
  one per node, and keep the built-in kube-system-service-accounts schema. The GPU health
  controller (user kilonode:gpu-health-controller, one per apiserver VM) falls to
  global-default.

The objects carry no apf.kubernetes.io/autoupdate-spec annotation: the apiserver deletes
FlowSchemas and levels with that annotation whose names are not in its bootstrap set
(kubernetes/kubernetes pkg/registry/flowcontrol/ensurer/strategy.go getRemoveCandidate).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pulumi
from pulumi_kubernetes import flowcontrol, meta

from kilonode.k8s.bootstrap import KUBE_SYSTEM
from kilonode.k8s.calico import NODE as CALICO_NODE
from kilonode.k8s.calico import TYPHA as CALICO_TYPHA
from kilonode.k8s.cloud_provider import CNM
from kilonode.k8s.storage import NODE_ACCOUNT as CSI_NODE_ACCOUNT
from kilonode.plan import defaults
from kilonode.plan.model import ClusterPlan
from kilonode.plan.resolve.joins import nominal_seats

API_VERSION = "flowcontrol.apiserver.k8s.io/v1"
NODE_AGENTS = defaults.APF_NODE_AGENTS_LEVEL
MONITORING = defaults.APF_MONITORING_LEVEL
BOOTSTRAP = defaults.APF_BOOTSTRAP_LEVEL
# The group every bootstrap token authenticates in (kubernetes/cluster-bootstrap token/api/
# types.go BootstrapDefaultGroup l.91, added to every token's groups by util/secrets/secrets.go
# GetGroups l.94, at kubernetes-1.32.0 and -1.35.0).
BOOTSTRAPPERS = "system:bootstrappers"
HOOK_LABEL = "kilonode.io/hook"
HOOK_ANNOTATION = "kilonode.io/how-to-join"
KUBE_PROXY_SERVICE_ACCOUNT = "kube-proxy"  # kilonode.k8s.proxy's ServiceAccount
# The per-node DaemonSets of this repository that call the apiserver, by (namespace, name) of
# their ServiceAccount. tests/k8s/test_flowcontrol.py finds every DaemonSet in the program and
# fails if one with an API client is missing here.
NODE_AGENT_SERVICE_ACCOUNTS: tuple[tuple[str, str], ...] = (
    (KUBE_SYSTEM, KUBE_PROXY_SERVICE_ACCOUNT),
    (KUBE_SYSTEM, CNM),
    (KUBE_SYSTEM, CALICO_NODE),
    (KUBE_SYSTEM, CALICO_TYPHA),  # not per node: the per-node agents' reads, fanned out (the docstring)
    (KUBE_SYSTEM, CSI_NODE_ACCOUNT),  # Azure Disk CSI's node plugin: its Node and CSINode (kilonode.k8s.storage)
)
# The wildcards of the v1 API (k8s.io/api flowcontrol/v1 types.go: VerbAll, APIGroupAll,
# ResourceAll, NamespaceEvery, NonResourceAll, NameAll).
ALL = "*"


def _labels(extra: Mapping[str, str]) -> dict[str, str]:
    return {"app.kubernetes.io/name": "api-protection", "app.kubernetes.io/managed-by": "kilonode", **extra}


@dataclass(frozen=True)
class Subject:
    """A FlowSchema subject: a ServiceAccount (name may be `*`: all in the namespace) or a group."""

    kind: str  # "ServiceAccount" or "Group"
    name: str
    namespace: str | None = None  # ServiceAccounts only

    def __str__(self) -> str:
        return f"ServiceAccount {self.namespace}/{self.name}" if self.kind == "ServiceAccount" else f"group {self.name}"

    def args(self) -> flowcontrol.v1.SubjectArgs:
        v1 = flowcontrol.v1
        if self.kind == "ServiceAccount":
            return v1.SubjectArgs(kind=self.kind, service_account=v1.ServiceAccountSubjectArgs(
                namespace=self.namespace, name=self.name))
        return v1.SubjectArgs(kind=self.kind, group=v1.GroupSubjectArgs(name=self.name))


@dataclass(frozen=True)
class Level:
    """One kilonode priority level and the FlowSchema that fills it."""

    name: str
    shares: int
    lendable_percent: int
    queuing: tuple[int, int, int]  # queues, handSize, queueLengthLimit
    precedence: int
    subjects: tuple[Subject, ...]
    borrowing_limit_percent: int = defaults.APF_AGENTS_BORROWING_LIMIT_PERCENT
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ApiProtectionArgs:
    node_agents: Sequence[tuple[str, str]] = NODE_AGENT_SERVICE_ACCOUNTS
    monitoring_namespace: str = defaults.MONITORING_NAMESPACE
    monitoring_group: str = defaults.MONITORING_AGENTS_GROUP
    bootstrap_group: str = BOOTSTRAPPERS


def levels(args: ApiProtectionArgs) -> tuple[Level, ...]:
    join = (f"run the agent under a ServiceAccount in namespace {args.monitoring_namespace}, or authenticate "
            f"it with group {args.monitoring_group} (a client certificate's O=, an OIDC groups claim); its "
            f"requests then queue in priority level {MONITORING}, not beside the control plane's")
    return (
        Level(NODE_AGENTS, defaults.APF_NODE_AGENTS_SHARES, defaults.APF_NODE_AGENTS_LENDABLE_PERCENT,
              defaults.APF_NODE_AGENTS_QUEUING, defaults.APF_NODE_AGENTS_PRECEDENCE,
              tuple(Subject("ServiceAccount", name, ns) for ns, name in args.node_agents)),
        Level(MONITORING, defaults.APF_MONITORING_SHARES, defaults.APF_MONITORING_LENDABLE_PERCENT,
              defaults.APF_MONITORING_QUEUING, defaults.APF_MONITORING_PRECEDENCE,
              (Subject("ServiceAccount", ALL, args.monitoring_namespace), Subject("Group", args.monitoring_group)),
              labels={HOOK_LABEL: "monitoring-agents"}, annotations={HOOK_ANNOTATION: join}),
        Level(BOOTSTRAP, defaults.APF_BOOTSTRAP_SHARES, defaults.APF_BOOTSTRAP_LENDABLE_PERCENT,
              defaults.APF_BOOTSTRAP_QUEUING, defaults.APF_BOOTSTRAP_PRECEDENCE,
              (Subject("Group", args.bootstrap_group),)),
    )


def describe(plan: ClusterPlan) -> list[str]:
    """What `kilonode explain` says about API Priority and Fairness: one line each."""
    args = ApiProtectionArgs()
    components = plan.components
    reads, mutating = components.apiserver_max_requests_inflight, components.apiserver_max_mutating_requests_inflight
    ours = levels(args)
    seats = nominal_seats(reads + mutating, {**components.apf_builtin_shares, **{lv.name: lv.shares for lv in ours}})
    lines = [f"API Priority and Fairness ({API_VERSION}): {reads + mutating} seats per apiserver "
             f"(--max-requests-inflight={reads} + --max-mutating-requests-inflight={mutating})"]
    for level in ours:
        who = ", ".join(str(s) for s in level.subjects)
        queues, hand, length = level.queuing
        lines.append(
            f"{level.name}: {seats[level.name]} seats (shares {level.shares}, lends {level.lendable_percent}%, "
            f"borrows {level.borrowing_limit_percent}%), {queues} queues, hand {hand}, {length} per queue; "
            f"FlowSchema {level.name} (precedence {level.precedence}): {who}")
    builtin = ", ".join(f"{name} {seats[name]}" for name in components.apf_builtin_shares if name != "exempt")
    lines.append(f"built-in levels keep their seats: {builtin}")
    lines.append(f"joining nodes: {BOOTSTRAP} while on the bootstrap token (CSR create, LIST, WATCH); then the "
                 "kubelet's built-in system-node-high (Node, Lease) and system-nodes; how many join at once: "
                 "`node joins` below")
    if plan.gpu_pools:
        lines.append("GPU health agent (the node's identity, group system:nodes): the kubelet's built-in "
                     "system-node-high and system-nodes schemas; NVIDIA device plugin: no API client")
    return lines


class ApiProtection(pulumi.ComponentResource):
    def __init__(self, name: str, args: ApiProtectionArgs | None = None,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("kilonode:k8s:ApiProtection", name, None, opts)
        args = args or ApiProtectionArgs()
        child = pulumi.ResourceOptions(parent=self)
        v1 = flowcontrol.v1
        for level in levels(args):
            queues, hand, length = level.queuing
            priority = v1.PriorityLevelConfiguration(
                f"{name}-{level.name}-level",
                metadata=meta.v1.ObjectMetaArgs(name=level.name, labels=_labels(level.labels)),
                spec=v1.PriorityLevelConfigurationSpecArgs(
                    type="Limited",
                    limited=v1.LimitedPriorityLevelConfigurationArgs(
                        nominal_concurrency_shares=level.shares,
                        lendable_percent=level.lendable_percent,
                        borrowing_limit_percent=level.borrowing_limit_percent,
                        limit_response=v1.LimitResponseArgs(
                            type="Queue",
                            queuing=v1.QueuingConfigurationArgs(queues=queues, hand_size=hand,
                                                                queue_length_limit=length),
                        ),
                    ),
                ),
                opts=child,
            )
            v1.FlowSchema(
                f"{name}-{level.name}-schema",
                metadata=meta.v1.ObjectMetaArgs(name=level.name, labels=_labels(level.labels),
                                                annotations=dict(level.annotations) or None),
                spec=v1.FlowSchemaSpecArgs(
                    # the level's own output: the schema is created after the level it names
                    priority_level_configuration=v1.PriorityLevelConfigurationReferenceArgs(
                        name=priority.metadata.name),
                    matching_precedence=level.precedence,
                    # one flow per ServiceAccount or user: fair queuing between agents
                    distinguisher_method=v1.FlowDistinguisherMethodArgs(type="ByUser"),
                    rules=[v1.PolicyRulesWithSubjectsArgs(
                        subjects=[s.args() for s in level.subjects],
                        # every request of these identities: reads, writes, discovery
                        resource_rules=[v1.ResourcePolicyRuleArgs(
                            verbs=[ALL], api_groups=[ALL], resources=[ALL], namespaces=[ALL], cluster_scope=True)],
                        non_resource_rules=[v1.NonResourcePolicyRuleArgs(verbs=[ALL], non_resource_urls=[ALL])],
                    )],
                ),
                opts=child,
            )
        self.register_outputs({})

