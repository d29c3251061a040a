"""GangScheduler: gang scheduling with the Coscheduling plugin of kubernetes-sigs/scheduler-plugins,
as a second scheduler in the cluster.

Field notes (7,500 nodes): two experiments each asking for 100% of the cluster deadlock when half
of each is scheduled; the answer is gang scheduling, the Coscheduling plugin. A gang is a PodGroup
(scheduling.x-k8s.io/v1alpha1) with spec.minMember; its pods name it in the label
`scheduling.x-k8s.io/pod-group` (apis/scheduling/v1alpha1/types.go PodGroupLabel) and ask for
this scheduler with `schedulerName: kilonode-gang`. The plugin lets no pod of a group bind until
minMember of them have a node (Permit), and gives the nodes back if that does not happen.

Why a second scheduler, not the default one replaced:
- the control-plane VMs run kube-scheduler from the pinned Kubernetes release archives
  (kilonode.render.control_plane), and scheduler-plugins publishes only container images
  (registry.k8s.io/scheduler-plugins/kube-scheduler, .../controller: README "Compatibility
  Matrix"), so the plugin cannot go into the systemd unit without building a binary ourselves;
- a Deployment leaves the in-tree scheduler, and with it the cluster, working when the gang
  scheduler is down: only pods that opted in (schedulerName: kilonode-gang) wait;
- jobs opt in; everything else keeps the default scheduler and its packing profile.
The cost, which upstream names (doc/install.md, "second scheduler: con"): two schedulers can
place pods on the same node at the same moment, and the kubelet then refuses the later one.
It is small here: whole-node GPU pods go to kilonode-gang, the default scheduler places small
system pods that request no GPU, so only a GPU pod that asks for nearly all of a node's CPU or
memory can collide with one (docs/gang-scheduling.md: leave that headroom).

What runs (kube-system), after the second-scheduler chart of the pinned tag
(manifests/install/charts/as-a-second-scheduler at v0.34.7; RBAC identical at v0.32.7 and
v0.33.5 but for a resource.k8s.io read rule they lack):
- the scheduler: 2 replicas with leader election on a Lease of its own (never the in-tree
  scheduler's `kube-scheduler` Lease), one profile `kilonode-gang`: the default profile's
  packing scores (kilonode.render.control_plane.scheduler_config) plus Coscheduling as upstream's
  manifests/coscheduling/scheduler-config.yaml enables it (multiPoint, and queueSort in place of
  PrioritySort);
- the controller (PodGroup status: phase, running, succeeded, failed), 2 replicas with leader
  election. It also reconciles ElasticQuotas, unconditionally (cmd/controller/app/server.go:
  ElasticQuotaReconciler.SetupWithManager), and controller-runtime (v0.22.3 at v0.34.7,
  v0.20.4 before) fails its start when a watched kind has no CRD
  (pkg/internal/source/kind.go: "if kind is a CRD, it should be installed before calling
  Start", then the 2-minute CacheSyncTimeout), so both CRDs are installed;
- the PodGroup and ElasticQuota CRDs, vendored verbatim (kilonode/k8s/crds/);
- RBAC: upstream's chart rules for each, and for the scheduler the bindings the Kubernetes
  docs' "Configure Multiple Schedulers" example gives its my-scheduler ServiceAccount
  (system:kube-scheduler, system:volume-scheduler), so every in-tree plugin of the cluster's
  version has what the apiserver grants its own scheduler.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pulumi
from pulumi_kubernetes import apiextensions, apps, core, meta, policy, rbac

from kilonode.k8s.admission import admission_policy
from kilonode.k8s.bootstrap import KUBE_SYSTEM, RBAC_GROUP
from kilonode.k8s.gang import CROSS_FABRIC_ANNOTATION, GANG_SCHEDULER_NAME, POD_GROUP_API_VERSION, POD_GROUP_LABEL
from kilonode.k8s.pod_security import NONROOT_USER, container_security_context
from kilonode.k8s.pods import awaited, config_digest_annotation, on_pools, system_pod_spec
from kilonode.plan.model import AwaitsPlan, ClusterPlan
from kilonode.plan.wellknown import FABRIC_LABEL, GPU_RESOURCE
from kilonode.yamlio import load_yaml_all, plain_yaml

# What a job names (GANG_SCHEDULER_NAME, POD_GROUP_LABEL, ...) lives in kilonode.k8s.gang, free
# of Pulumi, which job builders share; imported here, and read as scheduling.<NAME> as before.
__all__ = ["CROSS_FABRIC_ANNOTATION", "GANG_SCHEDULER_NAME", "POD_GROUP_API_VERSION", "POD_GROUP_LABEL"]

SCHEDULER = "kilonode-gang-scheduler"  # Deployment, ServiceAccount, ClusterRole, ConfigMap
CONTROLLER = "kilonode-gang-controller"
# The scheduler's leader-election Lease in kube-system: its own name, so its replicas never
# contend with the in-tree scheduler for `kube-scheduler` (the v1 config's default resourceName).
LEASE = GANG_SCHEDULER_NAME
CONFIG_DIR = "/etc/kubernetes/kilonode-gang"
CONFIG_FILE = "scheduler-config.yaml"
SCHEDULER_PORT = 10259  # kube-scheduler's secure port: /healthz, as upstream's chart probes it
CONTROLLER_PROBE_PORT = 8081  # the controller's --probeAddr default (cmd/controller/app/options.go)
CRD_DIR = Path(__file__).parent / "crds"
CRD_FILES = ("scheduling.x-k8s.io_podgroups.yaml", "scheduling.x-k8s.io_elasticquotas.yaml")

# How long the first permitted pod of a gang waits, holding its node, for the rest of the gang
# (CoschedulingArgs.permitWaitingTimeSeconds, apis/config/v1/types.go; default 60,
# apis/config/v1/defaults.go). The first pod waits while the scheduler places all the others, so
# the wait must cover the largest gang: the field notes' jobs ask for 100% of a 7,500-node
# cluster, which 300 s covers at 25 pods/s where 60 s would need 125 pods/s. A gang that cannot
# fit does not wait it out: when a member fails Filter with more than 10% of minMember still
# unplaced, PostFilter rejects the waiting members at once. A PodGroup's own
# spec.scheduleTimeoutSeconds overrides it (pkg/util/podgroup.go GetWaitTimeDuration); the
# framework caps any permit wait at 15 minutes (pkg/scheduler/framework/runtime/framework.go
# maxTimeout). Only fields every pinned release decodes: the scheduler's config decoding is
# strict (serializer.EnableStrict), and podGroupRejectPercentage exists only from v0.34.
PERMIT_WAITING_TIME_SECONDS = 300

# Both keep every Pod and Node of the cluster in informer caches (the scheduler for its
# snapshot; the controller's PodGroup reconciler watches all Pods), so their memory grows with
# the cluster. Requests: sizes for a 7,500-node cluster's watch caches, small beside a GPU node.
# Limits at four times the request: an estimate, not a measurement, with the room a cluster
# at Kubernetes' documented ceiling of 150,000 pods ("Considerations for large clusters") needs
# at a few KiB per cached Pod, while a leak stops there instead of taking the system node's
# memory from everything else on it. Reaching the limit OOM-kills the one container; the other
# replica takes the lease (a standby holds the same caches, so both are sized alike). No CPU
# limit: a throttled scheduler is a slow one (CKV_K8S_11 in policy/security-exceptions.yaml).
SCHEDULER_REQUESTS = {"cpu": "1", "memory": "1Gi"}
SCHEDULER_LIMITS = {"memory": "4Gi"}
CONTROLLER_REQUESTS = {"cpu": "200m", "memory": "512Mi"}
CONTROLLER_LIMITS = {"memory": "2Gi"}
REPLICAS = 2

# (apiGroups, resources, verbs, resourceNames). Upstream's chart at v0.34.7,
# manifests/install/charts/as-a-second-scheduler/templates/rbac.yaml l.1-89 (ClusterRole
# scheduler-plugins-scheduler, the scheduler's name as the lease and endpoints name; the rules
# behind `{{- if has "NetworkOverhead" / "PreemptionToleration" / "SySched" }}` left out, as the
# chart leaves them out for its default plugins and kilonode-gang enables none of them).
Rule = tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...], tuple[str, ...]]
SCHEDULER_RULES: list[Rule] = [
    (("",), ("namespaces",), ("get", "list", "watch"), ()),
    (("", "events.k8s.io"), ("events",), ("create", "patch", "update"), ()),
    (("coordination.k8s.io",), ("leases",), ("create",), ()),
    (("coordination.k8s.io",), ("leases",), ("get", "update"), (LEASE,)),
    (("",), ("endpoints",), ("create",), ()),
    (("",), ("endpoints",), ("get", "update"), (LEASE,)),
    (("",), ("nodes",), ("get", "list", "watch", "patch"), ()),
    (("",), ("pods",), ("delete", "get", "list", "watch", "update"), ()),
    (("",), ("bindings", "pods/binding"), ("create",), ()),
    (("",), ("pods/status",), ("patch", "update"), ()),
    (("",), ("replicationcontrollers", "services"), ("get", "list", "watch"), ()),
    (("apps", "extensions"), ("replicasets",), ("get", "list", "watch"), ()),
    (("apps",), ("statefulsets",), ("get", "list", "watch"), ()),
    (("policy",), ("poddisruptionbudgets",), ("get", "list", "watch"), ()),
    (("",), ("persistentvolumeclaims", "persistentvolumes"), ("get", "list", "watch", "patch", "update"), ()),
    (("authentication.k8s.io",), ("tokenreviews",), ("create",), ()),
    (("authorization.k8s.io",), ("subjectaccessreviews",), ("create",), ()),
    (("resource.k8s.io",), ("deviceclasses", "resourceclaims", "resourceslices"), ("get", "list", "watch"), ()),
    (("storage.k8s.io",), ("csinodes", "storageclasses", "csidrivers", "csistoragecapacities", "volumeattachments"),
     ("get", "list", "watch"), ()),
    (("topology.node.k8s.io",), ("noderesourcetopologies",), ("get", "list", "watch"), ()),
    (("scheduling.x-k8s.io",), ("podgroups", "elasticquotas", "podgroups/status", "elasticquotas/status"),
     ("get", "list", "watch", "create", "delete", "update", "patch"), ()),
]
# The chart's ClusterRole scheduler-plugins-controller (same file, l.104-132).
CONTROLLER_RULES: list[Rule] = [
    (("",), ("pods",), ("get", "list", "watch"), ()),
    (("",), ("events",), ("create", "patch", "update"), ()),
    (("coordination.k8s.io",), ("leases",), ("create", "get", "update"), ()),
    (("",), ("nodes",), ("get", "list", "watch", "patch"), ()),
    (("topology.node.k8s.io",), ("noderesourcetopologies",), ("get", "list", "watch"), ()),
    (("scheduling.x-k8s.io",), ("podgroups", "elasticquotas", "podgroups/status", "elasticquotas/status"),
     ("get", "list", "watch", "create", "delete", "update", "patch"), ()),
]
# The in-tree roles the scheduler's ServiceAccount is bound to, as the kube-scheduler user is:
# what every in-tree plugin of the cluster's own version needs (the apiserver keeps them current;
# e.g. DynamicResources' writes to resourceclaims/status, which the chart's role lacks), as the
# all-in-one install (manifests/install/all-in-one.yaml: the scheduler *is* system:kube-scheduler)
# and the noderesourcetopology example (manifests/noderesourcetopology/cluster-role.yaml:
# system:volume-scheduler) grant it.
SCHEDULER_SYSTEM_ROLES = ("system:kube-scheduler", "system:volume-scheduler")
# The delegated authentication of both secure ports reads the extension-apiserver-authentication
# ConfigMap (the chart's RoleBinding sched-plugins::extension-apiserver-authentication-reader,
# same file l.147-161, for both ServiceAccounts).
AUTH_READER_ROLE = "extension-apiserver-authentication-reader"


def _labels(app: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": app, "app.kubernetes.io/part-of": GANG_SCHEDULER_NAME,
            "app.kubernetes.io/managed-by": "kilonode"}


def _selector(app: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": app}


def packing_score(gpu: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """The default profile's packing (kilonode.render.control_plane.scheduler_config: field notes,
    2,500 nodes: MostRequestedPriority weight 1 + InterPodAffinityPriority weight 2, no spreading):
    the score plugin set and NodeResourcesFit's args."""
    resources: list[dict[str, Any]] = [{"name": "cpu", "weight": 1}, {"name": "memory", "weight": 1}]
    if gpu:
        resources.append({"name": GPU_RESOURCE, "weight": 1})
    score = {
        "disabled": [{"name": "NodeResourcesBalancedAllocation"}],
        "enabled": [{"name": "NodeResourcesFit", "weight": 1}, {"name": "InterPodAffinity", "weight": 2}],
    }
    return score, {"scoringStrategy": {"type": "MostAllocated", "resources": resources}}


def scheduler_config(gpu: bool) -> dict[str, Any]:
    """KubeSchedulerConfiguration (kubescheduler.config.k8s.io/v1; field names from
    kubernetes/kube-scheduler config/v1/types.go and component-base config/v1alpha1/types.go at
    v0.32.7-v0.34.7; CoschedulingArgs from scheduler-plugins apis/config/v1/types.go)."""
    score, fit_args = packing_score(gpu)
    return {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        # clientConnection.kubeconfig unset: the pod's ServiceAccount (in-cluster config).
        "leaderElection": {"leaderElect": True, "resourceLock": "leases", "resourceName": LEASE,
                           "resourceNamespace": KUBE_SYSTEM},
        # As the default scheduler (CIS 1.4.1): no profiling handlers on the secure port.
        "enableProfiling": False,
        "profiles": [{
            "schedulerName": GANG_SCHEDULER_NAME,
            "plugins": {
                # upstream's manifests/coscheduling/scheduler-config.yaml: Coscheduling at every
                # point it implements (QueueSort, PreFilter, PostFilter, Permit, Reserve:
                # pkg/coscheduling/coscheduling.go l.51-55) ...
                "multiPoint": {"enabled": [{"name": "Coscheduling"}]},
                # ... and as the one queue sort: upstream disables "*"; PrioritySort is the only
                # in-tree QueueSort plugin, and a profile with two fails at start ("only one queue
                # sort plugin required", framework/runtime/framework.go NewFramework), never silently.
                "queueSort": {"enabled": [{"name": "Coscheduling"}], "disabled": [{"name": "PrioritySort"}]},
                "score": score,
            },
            "pluginConfig": [
                {"name": "Coscheduling", "args": {"permitWaitingTimeSeconds": PERMIT_WAITING_TIME_SECONDS}},
                {"name": "NodeResourcesFit", "args": fit_args},
            ],
        }],
    }


def crd_documents() -> list[dict[str, Any]]:
    """The vendored CustomResourceDefinitions, as upstream wrote them."""
    documents: list[dict[str, Any]] = []
    for file in CRD_FILES:
        documents += [d for d in load_yaml_all((CRD_DIR / file).read_text()) if d]
    return documents


def _rules(rules: list[Rule]) -> list[rbac.v1.PolicyRuleArgs]:
    return [rbac.v1.PolicyRuleArgs(api_groups=list(groups), resources=list(resources), verbs=list(verbs),
                                   resource_names=list(names) or None)
            for groups, resources, verbs, names in rules]


def _anti_affinity(app: str) -> core.v1.AffinityArgs:
    """The two replicas on two nodes: one node's loss never takes both."""
    return core.v1.AffinityArgs(pod_anti_affinity=core.v1.PodAntiAffinityArgs(
        required_during_scheduling_ignored_during_execution=[core.v1.PodAffinityTermArgs(
            label_selector=meta.v1.LabelSelectorArgs(match_labels=_selector(app)),
            topology_key="kubernetes.io/hostname",
        )],
    ))


def _container_security() -> core.v1.SecurityContextArgs:
    """Both images run as 65532 (build/scheduler/Dockerfile and build/controller/Dockerfile at
    v0.32.7, v0.33.5 and v0.34.7: distroless, USER 65532:65532) and need nothing more. Neither
    writes a file: kube-scheduler makes its serving certificate in memory (kubernetes
    cmd/kube-scheduler/app/options/options.go: CertDirectory ""), the controller serves only
    plain-HTTP metrics and probes and registers no webhook (cmd/controller/app/server.go), and
    no code of either under cmd/ or pkg/ writes to disk: a read-only root filesystem."""
    return container_security_context(NONROOT_USER)


def describe(plan: ClusterPlan) -> list[str]:
    """What `kilonode explain` says about gang scheduling: one line each."""
    components = plan.components
    version = components.scheduler_plugins_version
    lines = [
        f"gang scheduler: schedulerName {GANG_SCHEDULER_NAME}, Deployment {KUBE_SYSTEM}/{SCHEDULER} "
        f"({REPLICAS} replicas, leader election on Lease {KUBE_SYSTEM}/{LEASE}), scheduler-plugins {version} "
        f"({components.scheduler_plugins_scheduler_image})",
        f"profile {GANG_SCHEDULER_NAME}: Coscheduling (queue sort in place of PrioritySort, PreFilter, "
        f"PostFilter, Permit, Reserve; permit wait {PERMIT_WAITING_TIME_SECONDS} s unless the PodGroup sets "
        "scheduleTimeoutSeconds) with the default scheduler's packing (NodeResourcesFit MostAllocated on "
        + ", ".join(r["name"] for r in packing_score(bool(plan.gpu_pools))[1]["scoringStrategy"]["resources"])
        + "; InterPodAffinity weight 2)",
        f"a gang job sets: a PodGroup ({POD_GROUP_API_VERSION}, spec.minMember) and on every pod "
        f"schedulerName: {GANG_SCHEDULER_NAME} and the label {POD_GROUP_LABEL}: <PodGroup name>",
        f"PodGroup status: Deployment {KUBE_SYSTEM}/{CONTROLLER} "
        f"({components.scheduler_plugins_controller_image})",
    ]
    args = GangSchedulerArgs.of(plan)
    if args.fabric_locality:
        nodes, gpus = args.largest_fabric
        lines.append(f"one InfiniBand fabric per gang: a gang's GPU pods need required podAffinity on {FABRIC_LABEL} "
                     f"(policy kilonode-gang-fabric); a PodGroup larger than the largest fabric ({nodes} nodes, "
                     f"{gpus} GPUs) is refused (kilonode-gang-size); {CROSS_FABRIC_ANNOTATION}: \"true\" opts out")
    skew = components.scheduler_plugins_skew
    if skew:
        lines.append(f"Kubernetes {plan.kubernetes_version}: {skew}")
    return lines


# Keep a gang inside one InfiniBand fabric (on Azure one scale set: RDMA reaches only its own
# VMs). The mechanism: every GPU pod of a gang carries required pod affinity to its own
# PodGroup's pods with topologyKey kilonode.io/fabric (each IB node's scale set,
# kilonode.render.pool). The first pod may go to any fabric (the scheduler's rule for a pod
# that matches its own affinity term and finds no peer); every other pod then only to that one,
# and Coscheduling's Permit holds them all until minMember fit: a gang is placed inside one
# fabric or waits (its scheduleTimeoutSeconds, then it tries again). Chosen over Kueue's
# topology-aware scheduling (another controller, queue and CRDs to run and pin) and over a
# scheduler-plugins extension (none at the pinned releases places a group by a node label):
# it uses what is already deployed. What it cannot do: pick the fabric with room first (a
# full fabric chosen by the first pod waits out the timeout). A job that may span fabrics (it
# gives up RDMA between them) says so: kilonode.io/cross-fabric: "true" on its pods. The
# affinity itself: kilonode.k8s.gang.fabric_affinity, which this rule admits.
POLICY_LABELS = {"app.kubernetes.io/managed-by": "kilonode", "app.kubernetes.io/part-of": "kilonode-gang"}
GANG_FABRIC_RULE = (
    f"!has(object.metadata.labels) || !('{POD_GROUP_LABEL}' in object.metadata.labels) || "
    f"(has(object.metadata.annotations) && '{CROSS_FABRIC_ANNOTATION}' in object.metadata.annotations && "
    f"object.metadata.annotations['{CROSS_FABRIC_ANNOTATION}'] == 'true') || "
    "!object.spec.containers.exists(c, has(c.resources) && has(c.resources.limits) && "
    f"'{GPU_RESOURCE}' in c.resources.limits) || "
    "(has(object.spec.affinity) && has(object.spec.affinity.podAffinity) && "
    "has(object.spec.affinity.podAffinity.requiredDuringSchedulingIgnoredDuringExecution) && "
    "object.spec.affinity.podAffinity.requiredDuringSchedulingIgnoredDuringExecution.exists(t, "
    f"t.topologyKey == '{FABRIC_LABEL}' && has(t.labelSelector) && has(t.labelSelector.matchLabels) && "
    f"'{POD_GROUP_LABEL}' in t.labelSelector.matchLabels && "
    f"t.labelSelector.matchLabels['{POD_GROUP_LABEL}'] == object.metadata.labels['{POD_GROUP_LABEL}']))"
)
GANG_FABRIC_MESSAGE = (
    f"a gang's GPU pod ({POD_GROUP_LABEL} label, {GPU_RESOURCE} limit) must stay inside one InfiniBand fabric: give it "
    f"required podAffinity to its PodGroup's pods (labelSelector.matchLabels {POD_GROUP_LABEL}: <group>) with "
    f"topologyKey {FABRIC_LABEL} (docs/gang-scheduling.md), or annotate it {CROSS_FABRIC_ANNOTATION}: \"true\" "
    "if it may span fabrics without RDMA between them"
)



# A gang larger than the largest fabric can never be placed inside one: with the affinity above
# its pods would wait out every scheduleTimeoutSeconds, forever. Refused when the PodGroup is
# created instead, with the reason. A PodGroup says its size in pods (spec.minMember) and, if it
# chooses, in resources (spec.minResources, a ResourceList: int-or-string quantities in the
# CRD). An NCCL gang is one pod per node (all of a node's GPUs, its HCAs): minMember is then its
# node count. A gang of smaller pods states its GPUs in minResources, which is judged instead
# (a GPU count is a whole number: any other quantity form is refused, as no GPU is fractional).
def gang_size_rule(fabric_nodes: int, fabric_gpus: int) -> str:
    """The CEL rule on PodGroups: the gang fits the largest fabric (`fabric_nodes` nodes,
    `fabric_gpus` GPUs), or it opts into crossing fabrics."""
    gpus = f"object.spec.minResources['{GPU_RESOURCE}']"
    return (
        f"(has(object.metadata.annotations) && '{CROSS_FABRIC_ANNOTATION}' in object.metadata.annotations && "
        f"object.metadata.annotations['{CROSS_FABRIC_ANNOTATION}'] == 'true') || !has(object.spec) || "
        f"((has(object.spec.minResources) && '{GPU_RESOURCE}' in object.spec.minResources) ? "
        f"(string({gpus}).matches('^[0-9]+$') && int(string({gpus})) <= {fabric_gpus}) : "
        f"(!has(object.spec.minMember) || object.spec.minMember <= {fabric_nodes}))"
    )


def gang_size_message(fabric_nodes: int, fabric_gpus: int) -> str:
    return (
        f"this PodGroup can never be placed inside one InfiniBand fabric: the largest holds {fabric_nodes} nodes, "
        f"{fabric_gpus} GPUs (one scale set of the GPU pools; RDMA reaches only its own VMs). Split the job, or "
        f"if its pods share nodes state its GPUs as spec.minResources {GPU_RESOURCE} (a whole number), or annotate "
        f"the PodGroup and its pods {CROSS_FABRIC_ANNOTATION}: \"true\" if it may span fabrics without RDMA "
        "between them (docs/gang-scheduling.md)"
    )


def largest_fabric(plan: ClusterPlan) -> tuple[int, int]:
    """(nodes, GPUs) of the largest InfiniBand fabric among the GPU pools."""
    ib = [p for p in plan.gpu_pools if p.infiniband]
    return (max((p.largest_scale_set for p in ib), default=0),
            max((p.largest_scale_set * p.gpus_per_node for p in ib), default=0))


@dataclass(frozen=True)
class GangSchedulerArgs:
    # the plan's scheduler-plugins images (components: the release for the cluster's minor)
    scheduler_image: str
    controller_image: str
    gpu: bool  # the plan has GPU pools: nvidia.com/gpu joins the packing score, as in the default profile
    awaits: AwaitsPlan  # the plan's (components): how long `pulumi up` waits for the replicas
    # every GPU pool is InfiniBand: a gang's GPU pods must keep to one fabric (GANG_FABRIC_RULE).
    # With a GPU pool without InfiniBand (no fabric label) the rule would strand its gangs.
    fabric_locality: bool = False
    # (nodes, GPUs) of the largest fabric: a PodGroup larger is refused (gang_size_rule)
    largest_fabric: tuple[int, int] = (0, 0)
    # where the replicas may run (ClusterPlan.controller_pools), required: both tokens patch Nodes,
    # the scheduler's also updates, deletes and binds every pod (upstream's RBAC), so a replica on a
    # GPU node would hand them to whoever owns that node (independent trace of issue 37, round 4)
    controller_pools: tuple[str, ...] = ()

    @staticmethod
    def of(plan: ClusterPlan) -> GangSchedulerArgs:
        return GangSchedulerArgs(scheduler_image=plan.components.scheduler_plugins_scheduler_image,
                                 controller_image=plan.components.scheduler_plugins_controller_image,
                                 gpu=bool(plan.gpu_pools), awaits=plan.components.awaits,
                                 fabric_locality=bool(plan.gpu_pools) and all(p.infiniband for p in plan.gpu_pools),
                                 largest_fabric=largest_fabric(plan),
                                 controller_pools=tuple(p.name for p in plan.controller_pools))


class GangScheduler(pulumi.ComponentResource):
    def __init__(self, name: str, args: GangSchedulerArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("kilonode:k8s:GangScheduler", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)

        self.controller_pools = args.controller_pools
        crds = self._crds(name)
        # the two Deployments: after the CRDs they watch; their pods wait for pool nodes,
        # still allocating on a first run
        after_crds = awaited(pulumi.ResourceOptions(parent=self, depends_on=crds), args.awaits)

        accounts = self._service_accounts(name)

        data = {CONFIG_FILE: plain_yaml(scheduler_config(args.gpu))}
        config = core.v1.ConfigMap(
            f"{name}-config",
            metadata=meta.v1.ObjectMetaArgs(name=SCHEDULER, namespace=KUBE_SYSTEM, labels=_labels(SCHEDULER)),
            data=data,
            opts=child,
        )
        scheduler_probe = core.v1.HTTPGetActionArgs(path="/healthz", port=SCHEDULER_PORT, scheme="HTTPS")
        self._deployment(
            f"{name}-scheduler", SCHEDULER, accounts[SCHEDULER], after_crds,
            core.v1.ContainerArgs(
                name="kube-scheduler",
                image=args.scheduler_image,
                command=["/bin/kube-scheduler"],  # the image's entrypoint (build/scheduler/Dockerfile)
                args=[f"--config={CONFIG_DIR}/{CONFIG_FILE}"],
                ports=[core.v1.ContainerPortArgs(name="https", container_port=SCHEDULER_PORT, protocol="TCP")],
                liveness_probe=core.v1.ProbeArgs(http_get=scheduler_probe, initial_delay_seconds=15),
                readiness_probe=core.v1.ProbeArgs(http_get=scheduler_probe),
                resources=core.v1.ResourceRequirementsArgs(requests=SCHEDULER_REQUESTS, limits=SCHEDULER_LIMITS),
                security_context=_container_security(),
                volume_mounts=[core.v1.VolumeMountArgs(name="config", mount_path=CONFIG_DIR, read_only=True)],
            ),
            volumes=[core.v1.VolumeArgs(name="config", config_map=core.v1.ConfigMapVolumeSourceArgs(
                name=config.metadata.name))],
            # Rolls on a config change (kilonode.k8s.pods.CONFIG_DIGEST_ANNOTATION): scheduler-plugins'
            # kube-scheduler is upstream's command (cmd/scheduler/main.go: app.NewSchedulerCommand), which
            # reads --config once at start (cmd/kube-scheduler/app/options/options.go Options.ApplyTo:
            # LoadConfigFromFile) and watches nothing: profiles and plugin args apply only to new pods.
            annotations=config_digest_annotation(data),
        )
        self._deployment(
            f"{name}-controller", CONTROLLER, accounts[CONTROLLER], after_crds,
            core.v1.ContainerArgs(
                name="controller",
                image=args.controller_image,
                command=["/bin/controller"],  # build/controller/Dockerfile
                # Lease kube-system/sched-plugins-controllers (cmd/controller/app/server.go); the
                # chart's flag for its controller.leaderElect value.
                args=["--enableLeaderElection"],
                ports=[core.v1.ContainerPortArgs(name="probes", container_port=CONTROLLER_PROBE_PORT,
                                                 protocol="TCP")],
                liveness_probe=core.v1.ProbeArgs(http_get=core.v1.HTTPGetActionArgs(
                    path="/healthz", port=CONTROLLER_PROBE_PORT), initial_delay_seconds=15),
                readiness_probe=core.v1.ProbeArgs(http_get=core.v1.HTTPGetActionArgs(
                    path="/readyz", port=CONTROLLER_PROBE_PORT)),
                resources=core.v1.ResourceRequirementsArgs(requests=CONTROLLER_REQUESTS, limits=CONTROLLER_LIMITS),
                security_context=_container_security(),
            ),
        )
        if args.fabric_locality:
            admission_policy(f"{name}-fabric", "kilonode-gang-fabric", "pods",
                             [(GANG_FABRIC_RULE, GANG_FABRIC_MESSAGE)], POLICY_LABELS, child)
            group, version = POD_GROUP_API_VERSION.split("/")
            admission_policy(f"{name}-gang-size", "kilonode-gang-size", "podgroups",
                             [(gang_size_rule(*args.largest_fabric), gang_size_message(*args.largest_fabric))],
                             POLICY_LABELS, child, group_version=(group, version))
        self.register_outputs({})

    def _crds(self, name: str) -> list[apiextensions.v1.CustomResourceDefinition]:
        """scheduler-plugins' CustomResourceDefinitions (crd_documents), one resource each."""
        child = pulumi.ResourceOptions(parent=self)
        crds: list[apiextensions.v1.CustomResourceDefinition] = []
        for document in crd_documents():
            plural = document["spec"]["names"]["plural"]
            metadata = document["metadata"]
            crds.append(apiextensions.v1.CustomResourceDefinition(
                f"{name}-crd-{plural}",
                metadata=meta.v1.ObjectMetaArgs(name=metadata["name"], annotations=metadata["annotations"]),
                spec=document["spec"],
                opts=child,
            ))
        return crds

    def _service_accounts(self, name: str) -> dict[str, core.v1.ServiceAccount]:
        """The scheduler's and the controller's accounts (app -> account) and their RBAC."""
        child = pulumi.ResourceOptions(parent=self)
        accounts: dict[str, core.v1.ServiceAccount] = {}
        parts = (("scheduler", SCHEDULER, SCHEDULER_RULES), ("controller", CONTROLLER, CONTROLLER_RULES))
        for part, app, rules in parts:
            accounts[app] = core.v1.ServiceAccount(
                f"{name}-{part}-sa", metadata=meta.v1.ObjectMetaArgs(name=app, namespace=KUBE_SYSTEM,
                                                                    labels=_labels(app)),
                opts=child,
            )
            role = rbac.v1.ClusterRole(
                f"{name}-{part}-role", metadata=meta.v1.ObjectMetaArgs(name=f"kilonode:{app}", labels=_labels(app)),
                rules=_rules(rules), opts=child,
            )
            rbac.v1.ClusterRoleBinding(
                f"{name}-{part}-binding",
                metadata=meta.v1.ObjectMetaArgs(name=f"kilonode:{app}", labels=_labels(app)),
                role_ref=rbac.v1.RoleRefArgs(api_group=RBAC_GROUP, kind="ClusterRole", name=role.metadata.name),
                subjects=[rbac.v1.SubjectArgs(kind="ServiceAccount", name=app, namespace=KUBE_SYSTEM)],
                opts=child,
            )
        for system_role in SCHEDULER_SYSTEM_ROLES:
            short = system_role.removeprefix("system:")
            rbac.v1.ClusterRoleBinding(
                f"{name}-scheduler-{short}",
                metadata=meta.v1.ObjectMetaArgs(name=f"kilonode:{SCHEDULER}:{short}", labels=_labels(SCHEDULER)),
                role_ref=rbac.v1.RoleRefArgs(api_group=RBAC_GROUP, kind="ClusterRole", name=system_role),
                subjects=[rbac.v1.SubjectArgs(kind="ServiceAccount", name=SCHEDULER, namespace=KUBE_SYSTEM)],
                opts=child,
            )
        rbac.v1.RoleBinding(
            f"{name}-auth-reader",
            metadata=meta.v1.ObjectMetaArgs(name=f"kilonode:{GANG_SCHEDULER_NAME}:{AUTH_READER_ROLE}",
                                            namespace=KUBE_SYSTEM, labels=_labels(SCHEDULER)),
            role_ref=rbac.v1.RoleRefArgs(api_group=RBAC_GROUP, kind="Role", name=AUTH_READER_ROLE),
            subjects=[rbac.v1.SubjectArgs(kind="ServiceAccount", name=app, namespace=KUBE_SYSTEM)
                      for app in (SCHEDULER, CONTROLLER)],
            opts=child,
        )
        return accounts

    def _deployment(self, prefix: str, app: str, account: core.v1.ServiceAccount, opts: pulumi.ResourceOptions,
                    container: core.v1.ContainerArgs, volumes: list[core.v1.VolumeArgs] | None = None,
                    annotations: dict[str, pulumi.Input[str]] | None = None) -> None:
        selector = _selector(app)
        apps.v1.Deployment(
            f"{prefix}-deployment",
            metadata=meta.v1.ObjectMetaArgs(name=app, namespace=KUBE_SYSTEM, labels=_labels(app)),
            spec=apps.v1.DeploymentSpecArgs(
                replicas=REPLICAS,
                selector=meta.v1.LabelSelectorArgs(match_labels=selector),
                # no surge: with one replica per node required, a third pod may find no node
                strategy=apps.v1.DeploymentStrategyArgs(
                    type="RollingUpdate",
                    rolling_update=apps.v1.RollingUpdateDeploymentArgs(max_unavailable=1, max_surge=0)),
                template=core.v1.PodTemplateSpecArgs(
                    # the controller's: none, it mounts no ConfigMap (flags only)
                    metadata=meta.v1.ObjectMetaArgs(labels=_labels(app), annotations=annotations),
                    # placed by the default scheduler (no schedulerName): it must not wait for itself
                    spec=system_pod_spec(
                        "cluster",
                        service_account=account,
                        system_pool=True,
                        affinity=on_pools(self.controller_pools, _anti_affinity(app)),
                        containers=[container],
                        volumes=volumes,
                    ),
                ),
            ),
            opts=opts,
        )
        policy.v1.PodDisruptionBudget(
            f"{prefix}-pdb",
            metadata=meta.v1.ObjectMetaArgs(name=app, namespace=KUBE_SYSTEM, labels=_labels(app)),
            spec=policy.v1.PodDisruptionBudgetSpecArgs(
                max_unavailable=1, selector=meta.v1.LabelSelectorArgs(match_labels=selector)),
            opts=pulumi.ResourceOptions(parent=self),
        )
