"""Built-in choices that are not stack settings: named once here with their reasons, read by
the renderers and the Azure components, and listed in the README ("Built-in defaults").
Change one here, run `make golden`, and the review shows every file it reaches."""

# The Azure load balancer's health probe on each apiserver: HTTPS GET /readyz, which the
# apiserver answers anonymously (AuthenticationConfiguration, KEP-4633) and which turns
# 500 while it cannot reach etcd, so a cut-off apiserver leaves the pool within
# LB_PROBE_INTERVAL_S x LB_PROBE_THRESHOLD = 10 s.
LB_PROBE_PATH = "/readyz"
LB_PROBE_INTERVAL_S = 5
LB_PROBE_THRESHOLD = 2
# Watches are long-lived: reset idle connections after 30 min (Azure's maximum) with a TCP
# reset rather than dropping them silently, so clients re-watch at once.
LB_IDLE_TIMEOUT_MIN = 30

# Certificates (pulumi-tls, ECDSA P-256): CAs for ten years; leaves for one year, re-issued
# by the first `pulumi up` in their last 30 days, which re-delivers them through custom data
# (a control-plane VM replacement, one member at a time: see the README).
CA_VALIDITY_HOURS = 10 * 365 * 24
LEAF_VALIDITY_HOURS = 365 * 24
LEAF_RENEW_BEFORE_HOURS = 30 * 24

# Container logs on every node (Docker's json-file driver; the kubelet's containerLogMax*
# for containerd): 3 files of 100 MiB per container, so a chatty training job cannot fill
# the OS disk.
CONTAINER_LOG_MAX_SIZE = "100Mi"
CONTAINER_LOG_MAX_FILES = 3

# Node TLS bootstrap (kubeadm's scheme). The group every node's bootstrap token adds (it
# must start with system:bootstrappers:); the bindings below grant it what kubeadm grants
# its system:bootstrappers:kubeadm:default-node-token group.
BOOTSTRAP_GROUP = "system:bootstrappers:kilonode:nodes"
# Who the exported admin kubeconfig is: a group bound to cluster-admin by a
# ClusterRoleBinding (revocable), not system:masters (which no RBAC change can revoke;
# kubeadm moved admin.conf off it in 1.29 for that reason). The super-admin identity in
# system:masters exists only inside the Pulumi state, for the program's own provider.
CLUSTER_ADMINS_GROUP = "kilonode:cluster-admins"
SUPER_ADMIN_GROUP = "system:masters"
# `pulumi up` waits this long for the apiserver to answer /readyz through the load balancer
# before it creates in-cluster objects (first boot: cloud-init, packages, certificates).
APISERVER_READY_TIMEOUT_S = 900

# Kubelet serving certificates (serverTLSBootstrap: true) are approved by
# postfinance/kubelet-csr-approver: only CSRs for the kubernetes.io/kubelet-serving signer
# from a system:node:<name> user whose CN is that user, whose one DNS name is a pool host
# name, and whose IPs fall in the pools' subnets. DNS resolution is bypassed: Azure's
# internal DNS names are not what the kubelet puts in its CSR; the IP scope carries the check.
# Pinned by tag: a digest needs a registry query this machine cannot make.
SERVING_CERT_APPROVER_IMAGE = "ghcr.io/postfinance/kubelet-csr-approver:v1.2.14"

# Cluster DNS (CoreDNS). The 2,500-node post: packing put 10+ kube-dns pods on one node and
# exceeded the VM's ~200 QPS limit for external lookups, so replicas need *required* pod
# anti-affinity on kubernetes.io/hostname (each one's external lookups leave from its own
# VM). Replicas: one per DNS_NODES_PER_REPLICA nodes, at least 2 -- at one external lookup
# per node every 5 s, 250 nodes need 50 QPS: a quarter of one VM's limit, headroom for bursts.
DNS_NODES_PER_REPLICA = 250
DNS_MIN_REPLICAS = 2
# kubeadm's CoreDNS for Kubernetes 1.34 (cmd/kubeadm/app/constants: CoreDNSVersion v1.12.1);
# CoreDNS reads the API through EndpointSlices, stable across the supported 1.32-1.35.
COREDNS_IMAGE = "registry.k8s.io/coredns/coredns:v1.12.1"

# kube-proxy in nftables mode (GA in 1.33, beta and on by default in 1.32): a Service or
# endpoint change is an incremental nftables update, where iptables mode re-writes the
# whole ruleset (cost grows with services x endpoints, which at 7,500 nodes means multi-
# second syncs), and IPVS mode is the one upstream now steers away from (KEP-3866,
# "Add an nftables-based kube-proxy backend"). Local traffic is what comes from Azure CNI's
# pod interfaces, named azv* (AKS runs kube-proxy with the same InterfaceNamePrefix=azv).
KUBE_PROXY_MODE = "nftables"
# The cluster's own version: kube-proxy must not be newer than the apiserver, nor older than
# it by more than the skew policy allows; the same version is the simple answer.
KUBE_PROXY_IMAGE = "registry.k8s.io/kube-proxy:v{kubernetes_version}"
KUBE_PROXY_POD_INTERFACE_PREFIX = "azv"
# A DaemonSet update over 7,500 nodes: 10% at a time, not one node after another.
KUBE_PROXY_MAX_UNAVAILABLE = "10%"

# The cloud provider (kubernetes-sigs/cloud-provider-azure): cloud-controller-manager (load
# balancers for Services) and cloud-node-manager (node initialization: provider ID, zone,
# addresses, and it lifts the node.cloudprovider.kubernetes.io/uninitialized taint the
# kubelet registers with under --cloud-provider=external). Its minor matches Kubernetes'
# ("Minor release versions match Kubernetes minor release versions", its README); the
# newest patch of each minor in the copy of the repository read here (tags v1.32.20
# dbfb0288, v1.33.17 0479db5b, v1.34.13 44b37e17, v1.35.8 b93010ae). From Kubernetes 1.32
# the images are published under mcr.microsoft.com/oss/v2/kubernetes (the helm chart's
# template rewrites the old /oss/kubernetes path for 1.32+). Pinned by tag: no source read
# here lists their digests, and a digest needs a registry query this machine cannot make.
CLOUD_PROVIDER_AZURE_VERSIONS = {32: "v1.32.20", 33: "v1.33.17", 34: "v1.34.13", 35: "v1.35.8"}
CLOUD_CONTROLLER_MANAGER_IMAGE = "mcr.microsoft.com/oss/v2/kubernetes/azure-cloud-controller-manager:{version}"
CLOUD_NODE_MANAGER_IMAGE = "mcr.microsoft.com/oss/v2/kubernetes/azure-cloud-node-manager:{version}"
# Two replicas with leader election: one acts, the other takes over within a lease period.
CLOUD_CONTROLLER_MANAGER_REPLICAS = 2
# The helm chart's port (values.yaml securePort); hostNetwork pods share the node's ports, and
# 10268 is clear of the kubelet (10250), kube-proxy (10249, 10256) and the chart's CNM.
CLOUD_CONTROLLER_MANAGER_PORT = 10268
# A DaemonSet update over 7,500 nodes: 10% at a time, as kube-proxy.
CLOUD_NODE_MANAGER_MAX_UNAVAILABLE = "10%"


def cloud_provider_azure_version(kubernetes_version: str) -> str:
    """The cloud-provider-azure release for this Kubernetes version (same minor)."""
    minor = int(kubernetes_version.split(".")[1])
    return CLOUD_PROVIDER_AZURE_VERSIONS[minor]

# The NVIDIA device plugin (NVIDIA/k8s-device-plugin) on GPU pools: it registers
# nvidia.com/gpu with the kubelet. v0.17.4, the newest v0.17 patch, pinned by digest: the
# digest is the one NVIDIA's own GPU Operator pins for this version -- at its tags v25.3.3
# (1f1f9cda3340d30558dbfa3926e689b83bee8665) and v25.3.4
# (d73a0086a6ba41c5972a704f8d36e3a162ee656f), bundle/manifests/
# gpu-operator-certified.clusterserviceversion.yaml relatedImages `device-plugin-image`
# (l.213) names this digest while deployments/gpu-operator/values.yaml devicePlugin.version
# (l.234) is v0.17.4; the OLM bundle lists the multi-arch index (the operator is certified
# for amd64 and arm64). A second, unrelated record of a running v0.17.4 shows the same
# digest. The tag stays in the reference for readers; the runtime resolves the digest.
DEVICE_PLUGIN_VERSION = "v0.17.4"
DEVICE_PLUGIN_DIGEST = "sha256:3c54348fe5a57e5700e7d8068e7531d2ef2d5f3ccb70c8f6bac0953432527abd"
DEVICE_PLUGIN_IMAGE = f"nvcr.io/nvidia/k8s-device-plugin:{DEVICE_PLUGIN_VERSION}@{DEVICE_PLUGIN_DIGEST}"
# A DaemonSet update over thousands of GPU nodes: 10% at a time, as kube-proxy. While a
# node's plugin restarts, the kubelet keeps the GPUs already allocated to running pods.
DEVICE_PLUGIN_MAX_UNAVAILABLE = "10%"
# The GPU health taint controller's identity: a client certificate signed by the cluster CA
# (CN = this user, no group), bound by name to its own ClusterRole (kilonode.k8s.gpu).
GPU_HEALTH_CONTROLLER_USER = "kilonode:gpu-health-controller"

# Priorities (kilonode.k8s.capacity). The built-in system-cluster-critical and
# system-node-critical stay the control plane's; below them, with meaning:
# - infrastructure: cluster services users add (monitoring, log shippers), above all work;
# - team work: the default for every pod that names no class (globalDefault);
# - borrowable: low-priority work that may run on any team's idle nodes (it tolerates every
#   team's taint, field notes: team capacity) and is the first preempted when a team wants
#   its nodes back;
# - balloon: the autoscaler buffer's placeholder pods (field notes), preempted by anything.
PRIORITY_INFRASTRUCTURE = 100_000
PRIORITY_TEAM = 1_000
PRIORITY_BORROWABLE = 0
# cluster-autoscaler treats pods with priority *below* its --expendable-pods-priority-cutoff
# (default -10) as expendable: they neither cause a scale-up nor keep a node. The balloons sit
# exactly at the cutoff: the lowest priority that still makes the autoscaler keep their nodes
# warm, while every other class preempts them (the overprovisioning recipe of the
# autoscaler's FAQ, which uses -1 under the same cutoff).
AUTOSCALER_EXPENDABLE_PRIORITY_CUTOFF = -10
PRIORITY_BALLOON = AUTOSCALER_EXPENDABLE_PRIORITY_CUTOFF

# Gang scheduling (kilonode.k8s.scheduling): a second scheduler, kubernetes-sigs/scheduler-plugins'
# kube-scheduler image with the Coscheduling plugin, and its controller (PodGroup status). Its
# releases pair with Kubernetes minors ("The minor version of the scheduler-plugins matches the
# minor version of the k8s client packages that it is compiled with", README "Compatibility
# Matrix"); read in kubernetes-sigs/scheduler-plugins at its tags: v0.32.7 (f83c6ac7), v0.33.5
# (c595039e), v0.34.7 (8283b145), each go.mod's k8s.io/kubernetes v1.32.7 / v1.33.5 / v1.34.7,
# each manifests/install/charts/as-a-second-scheduler/values.yaml naming both images at that
# tag; the README's matrix (master, 903da7df) lists exactly these three for 1.32-1.34.
# Kubernetes 1.35 has no release: only the tag v0.35.4-devel (2c75c8b5, "upgrade k8s to
# v1.35"), a development tag the matrix does not list. A 1.35 cluster runs v0.34.7: a
# kube-scheduler one minor older than the apiserver is within Kubernetes' version skew policy
# ("may be up to one minor version older", kubernetes/website content/en/releases/
# version-skew-policy.md), at the cost that it does not know scheduling features new in 1.35
# (a gang pod using one is placed as a 1.34 scheduler understands it).
# Pinned by tag: a digest needs a registry query this machine cannot make.
SCHEDULER_PLUGINS_VERSIONS = {32: "v0.32.7", 33: "v0.33.5", 34: "v0.34.7", 35: "v0.34.7"}
# The minors served by another minor's release, and why (shown by `kilonode explain`).
SCHEDULER_PLUGINS_SKEW = {
    35: "no scheduler-plugins release for Kubernetes 1.35 (only v0.35.4-devel); v0.34.7 runs one minor "
        "behind the apiserver, as the version skew policy allows",
}
SCHEDULER_PLUGINS_SCHEDULER_IMAGE = "registry.k8s.io/scheduler-plugins/kube-scheduler:{version}"
SCHEDULER_PLUGINS_CONTROLLER_IMAGE = "registry.k8s.io/scheduler-plugins/controller:{version}"


def scheduler_plugins_version(kubernetes_version: str) -> str:
    """The scheduler-plugins release for this Kubernetes version (same minor, or see SCHEDULER_PLUGINS_SKEW)."""
    minor = int(kubernetes_version.split(".")[1])
    if minor not in SCHEDULER_PLUGINS_VERSIONS:
        known = ", ".join(f"1.{m}" for m in sorted(SCHEDULER_PLUGINS_VERSIONS))
        raise ValueError(f"no scheduler-plugins release is pinned for Kubernetes {kubernetes_version} "
                         f"(pinned: {known}); add one to SCHEDULER_PLUGINS_VERSIONS")
    return SCHEDULER_PLUGINS_VERSIONS[minor]

# API Priority and Fairness and the apiservers' concurrency (kilonode.k8s.flowcontrol,
# kilonode.render.control_plane apiserver_flags). Field notes: monitoring agents that LIST/poll
# the apiserver from every node drove 500 MB/s of reads from etcd; avoid DaemonSets that talk
# to the apiserver; alert on 429s. Today's mechanism: flowcontrol.apiserver.k8s.io/v1 (GA 1.29).
#
# Upstream's suggested priority levels and their nominalConcurrencyShares, identical at
# kubernetes/apiserver tags kubernetes-1.32.0, 1.33.0, 1.34.2 and 1.35.0
# (pkg/apis/flowcontrol/bootstrap/default.go l.84-275 at kubernetes-1.34.2, 92c4c2c3): the
# exempt and catch-all levels the apiserver always has, and the six it creates unless told not
# to. Each apiserver divides its concurrency limit among all levels by these shares.
APF_BUILTIN_SHARES = {
    "exempt": 0, "catch-all": 5, "system": 30, "node-high": 40, "leader-election": 10,
    "workload-high": 40, "workload-low": 100, "global-default": 20,
}
# kilonode's two levels. Per-node agents (kube-proxy, cloud-node-manager: one ServiceAccount
# each for thousands of pods) would otherwise share workload-high with kube-scheduler and
# kube-controller-manager (the built-in kube-system-service-accounts schema); monitoring agents
# would share workload-low or global-default with every workload. Their shares are half and a
# quarter of workload-high's: a DaemonSet rollout over 10% of 7,500 nodes re-LISTs from the watch
# cache (a few seats for milliseconds each; never more than 15% of the level's seats per
# request: apf_controller.go l.886-892 at kubernetes-1.34.2), which ~160 seats per apiserver
# clear in well under a second; a monitoring fleet that LISTs from etcd is what the field
# notes warn of, and gets the smallest level.
APF_NODE_AGENTS_SHARES = 20
APF_MONITORING_SHARES = 10
# What each lends to other levels while idle (watches hold no seat once started, so agents are
# idle most of the time): half for node agents (kube-proxy keeps the data plane in step with
# Services; half its seats are always its own), 90% for monitoring, as upstream's own
# least-important level (workload-low) lends.
APF_NODE_AGENTS_LENDABLE_PERCENT = 50
APF_MONITORING_LENDABLE_PERCENT = 90
# Borrowing nothing: a busy agent fleet never holds more than its own nominal seats, however
# idle the control plane's levels look at that moment (nil would let it borrow up to the whole
# server limit: apf_controller.go l.868-872 at kubernetes-1.34.2).
APF_AGENTS_BORROWING_LIMIT_PERCENT = 0
# Queuing (queues, handSize, queueLengthLimit). Each ServiceAccount is one flow (ByUser), so
# all 7,500 kube-proxies share one flow: its room to wait is handSize x queueLengthLimit (800)
# per apiserver, beside ~160 seats that serve a cache LIST in milliseconds -- a 10% DaemonSet
# rollout sends about 1,500 LISTs and watch starts to each apiserver (750 pods x ~10 requests
# / 5), spread over the seconds the pods take to start; few flows (two agents) need few
# queues. Monitoring: upstream's suggested 64 x 6 x 50 (default.go
# system/node-high): many agents (each ServiceAccount or group member a flow) shuffle-sharded
# so one noisy agent fills its own queues only. Both within the shuffle-sharding limit
# ceil(log2(queues)) x handSize <= 60 bits (pkg/util/shufflesharding/shufflesharding.go l.24-36).
APF_NODE_AGENTS_QUEUING = (16, 8, 100)
APF_MONITORING_QUEUING = (64, 6, 50)
# matchingPrecedence (lower wins; ties by name: pkg/util/apihelpers/helpers.go l.95-102). After
# every built-in schema that names control-plane identities -- probes 2, system-leader-election
# 100, endpoint-controller 150 and workload-leader-election 200 (1.32/1.33 only),
# system-node-high 400, system-nodes 500, kube-controller-manager and kube-scheduler 800 -- so
# those requests keep their levels even from an identity also listed here; before the broad
# ones that would otherwise take these agents: kube-system-service-accounts 900 (kube-proxy,
# cloud-node-manager -> workload-high), service-accounts 9000 (monitoring ServiceAccounts ->
# workload-low), global-default 9900 (the group's members -> global-default).
APF_NODE_AGENTS_PRECEDENCE = 850
APF_MONITORING_PRECEDENCE = 860
# The hook for monitoring agents: ServiceAccounts in this namespace, or any identity in this
# group (a client certificate's O=, an OIDC groups claim). The group grants nothing (no RBAC
# names it); it only classifies requests.
MONITORING_NAMESPACE = "monitoring"
MONITORING_AGENTS_GROUP = "kilonode:monitoring-agents"

# --max-requests-inflight / --max-mutating-requests-inflight. With APF on (the default, and
# set), "This and --max-mutating-requests-inflight are summed to determine the server's total
# concurrency limit" (kubernetes/apiserver kubernetes-1.34.2 pkg/server/options/
# server_run_options.go l.350-360; pkg/server/options/feature.go l.77-85 hands the sum to
# utilflowcontrol.New). Upstream's own large-cluster sizing: kube-up raises them to 1500/500
# past 500 nodes and 3000/1000 past 3,000 (kubernetes/kubernetes cluster/gce/gci/
# configure-kubeapiserver.sh, start-kube-apiserver, "If the cluster is large, increase
# max-requests-inflight limit in apiserver", read at 0214969e); apiserver defaults 400/200
# (pkg/server/config.go l.442-443). kube-up has one apiserver; here the bracket is chosen by the
# nodes each apiserver carries with one of them down (a rolling restart): 7,500 / 4 = 1,875 ->
# 1500/500. Five apiservers then hold 10,000 seats (8,000 with one down), above what kube-up
# gives 5,000 nodes scaled to 7,500 (4,000 x 1.5 = 6,000).
APISERVER_INFLIGHT_BRACKETS = ((3000, 3000, 1000), (500, 1500, 500))  # (more than N nodes, reads, mutating)
APISERVER_INFLIGHT_DEFAULT = (400, 200)
# goaway-chance: behind the Azure load balancer an HTTP/2 client keeps one connection, so after
# a rolling restart every client stays on the apiservers that stayed up. "Min is 0 (off), Max is
# .02 (1/50 requests); .001 (1/1000) is a recommended starting point"; "Clusters with single
# apiservers, or which don't use a load balancer, should NOT enable this" (server_run_options.go
# l.367-371 at kubernetes-1.34.2, validated to [0, 0.02] at l.208): set only with 2+ apiservers.
APISERVER_GOAWAY_CHANCE = "0.001"
# shutdown-delay-duration: on stop the apiserver fails /readyz at once and keeps serving this
# long, "to allow load balancer to stop sending traffic to this server" (l.387-390): the load
# balancer needs LB_PROBE_INTERVAL_S x LB_PROBE_THRESHOLD = 10 s of failed probes, plus 5 s
# margin. With 2+ apiservers only (one apiserver has nowhere to send clients). The unit's stop
# timeout (systemd's default 90 s) covers it and the 60 s request timeout's drain.
APISERVER_SHUTDOWN_DELAY_S = LB_PROBE_INTERVAL_S * LB_PROBE_THRESHOLD + 5


def apiserver_inflight(total_nodes: int, apiservers: int) -> tuple[int, int]:
    """(--max-requests-inflight, --max-mutating-requests-inflight) for one apiserver.

    The bracket's seats are what upstream gives its built-in levels; kilonode's two levels
    bring their own on top (added to the read limit, their traffic being mostly reads), so each
    built-in level keeps at least the seats the bracket alone would give it.
    """
    per_apiserver = -(-total_nodes // max(1, apiservers - 1))  # rounded up
    reads, mutating = next(((r, m) for above, r, m in APISERVER_INFLIGHT_BRACKETS if per_apiserver > above),
                           APISERVER_INFLIGHT_DEFAULT)
    builtin = sum(APF_BUILTIN_SHARES.values())
    extra = -(-(reads + mutating) * (APF_NODE_AGENTS_SHARES + APF_MONITORING_SHARES) // builtin)  # rounded up
    return reads + extra, mutating

# The cluster autoscaler (kilonode.k8s.autoscaler) on pools with `autoscaling` (Azure VMSS).
# Its minor matches Kubernetes' (kubernetes/autoscaler cluster-autoscaler/README.md,
# "Releases": "versioning scheme was changed to match Kubernetes minor releases exactly");
# the newest patch of each minor among the repository's tags read here:
# cluster-autoscaler-1.32.7 (f645beb1), -1.33.6 (be4b5a18), -1.34.5 (cb2123ed),
# -1.35.2 (2d425888). The image tag is v<version> (the chart's values.yaml image.tag at
# 1.35.2). Pinned by tag: no source read here lists the images' digests, and a digest needs
# a registry query this machine cannot make.
CLUSTER_AUTOSCALER_VERSIONS = {32: "v1.32.7", 33: "v1.33.6", 34: "v1.34.5", 35: "v1.35.2"}
CLUSTER_AUTOSCALER_IMAGE = "registry.k8s.io/autoscaling/cluster-autoscaler:{version}"
# Two replicas, one active (leader election on a Lease): the other takes over within the
# lease period when a node goes away.
CLUSTER_AUTOSCALER_REPLICAS = 2
# Its FAQ ("What are the Service Level Objectives"): "request full 1 core ... for CA pod in
# bigger clusters". Memory: it keeps every Node and Pod in informers plus a simulated copy
# of the cluster each loop; 2 GiB requested, 8 GiB at most, for ~7,500 nodes is an estimate,
# not a measurement. No CPU limit: a throttled loop is the FAQ's "overloaded node".
CLUSTER_AUTOSCALER_REQUESTS = {"cpu": "1", "memory": "2Gi"}
CLUSTER_AUTOSCALER_LIMITS = {"memory": "8Gi"}
# --address (its default :8085): /metrics and /health-check. hostNetwork, so the port is the
# node's; clear of the kubelet (10250), kube-proxy (10249, 10256) and the CCM (10268).
CLUSTER_AUTOSCALER_PORT = 8085
# Gradual scale-up (field notes: adding hundreds of nodes at once overloads the apiservers):
# one scale-up adds at most one InfiniBand scale set's worth of nodes (100, a placement
# group), split over a pool's similar scale sets; the next loop adds more only for pods the
# nodes already on their way cannot hold.
CLUSTER_AUTOSCALER_MAX_NODES_PER_SCALEUP = 100
# A GPU VM's way to a Ready node: Azure allocation (InfiniBand sizes in one placement group),
# boot, registration, then the GPU health checks under the startup taint before the node
# takes work (field notes: active GPU tests need seconds to minutes). Upstream's 15m is for
# ordinary VMs.
CLUSTER_AUTOSCALER_MAX_NODE_PROVISION_TIME = "30m"
# The 2,500-node guard (field notes: an etcd outage failed every node's health check and the
# autoscaler tried to remove the fleet). It halts all activity while more than this share of
# the cluster's nodes (and more than the count below) is unready; upstream's 45% lets a
# partial outage (a zone, a third of the fleet) go on scaling down. 10% of 7,500 is 750 nodes:
# far above the GPU faults a healthy fleet carries, far below an outage.
CLUSTER_AUTOSCALER_MAX_TOTAL_UNREADY_PERCENTAGE = 10
# Upstream's 3, kept: the count only matters below 30 nodes (3 = 10% of 30), where one or two
# unready nodes must not stop every scale-up; at this toolkit's scale the percentage decides.
CLUSTER_AUTOSCALER_OK_TOTAL_UNREADY_COUNT = 3
# How much one loop removes (the node groups' min sizes keep every pool at half or more):
# at most 10 nodes being deleted at once (upstream's default, stated), of which at most one
# drained (evicting a pod of an MPI job restarts the whole job; field notes).
CLUSTER_AUTOSCALER_MAX_SCALE_DOWN_PARALLELISM = 10
CLUSTER_AUTOSCALER_MAX_DRAIN_PARALLELISM = 1
# One pod per GPU node (field notes): a node is a scale-down candidate only when no pod on it
# requests a GPU (GPU nodes are judged on GPUs alone) or, on nodes without GPUs, when no pod
# requests CPU or memory; DaemonSet pods do not count (--ignore-daemonsets-utilization). The
# scheduler packs nodes, so idle capacity shows as empty nodes; the autoscaler removes those
# and never evicts running work to consolidate half-used nodes (upstream's 0.5 would drain a
# node running a 4-GPU job).
CLUSTER_AUTOSCALER_SCALE_DOWN_UTILIZATION_THRESHOLD = "0"
CLUSTER_AUTOSCALER_SCALE_DOWN_GPU_UTILIZATION_THRESHOLD = "0"
# A GPU node idle for less than it takes to get one back (provision time) is churn: jobs
# arrive in bursts (field notes: a new job creates hundreds of pods at once).
CLUSTER_AUTOSCALER_SCALE_DOWN_UNNEEDED_TIME = "30m"
# No scale-down while the nodes of the last scale-up may still be on their way.
CLUSTER_AUTOSCALER_SCALE_DOWN_DELAY_AFTER_ADD = CLUSTER_AUTOSCALER_MAX_NODE_PROVISION_TIME
# Verbosity: its FAQ ("How can I increase the information that the CA is logging?"): 0 or 1
# suffices to follow its activity; more slows it past 1,000 nodes.
CLUSTER_AUTOSCALER_VERBOSITY = 1


def cluster_autoscaler_version(kubernetes_version: str) -> str:
    """The cluster-autoscaler release for this Kubernetes version (same minor)."""
    minor = int(kubernetes_version.split(".")[1])
    return CLUSTER_AUTOSCALER_VERSIONS[minor]

# Scheduled etcd snapshots (kilonode.render.etcd_snapshot on every member of both clusters;
# kilonode.azure.backup for the storage account). etcd tolerates the loss of a minority; past
# that only a snapshot brings the data back, and "all that is needed is a single snapshot" of
# the cluster (etcd-io/website content/en/docs/v3.5/op-guide/recovery.md, which asks to "save
# snapshots periodically" without naming an interval). Every 15 minutes: the interval kOps'
# etcd-manager backs its clusters up at by default (kubernetes-sigs/etcd-manager
# cmd/etcd-manager/main.go InitDefaults, BackupInterval "15m", read at 08036abf), so a restore
# loses at most a quarter of an hour of writes; controllers rebuild most derived state (pods,
# endpoints, leases) after it, what is lost for good is what users wrote in that window. The
# cost is one DB-sized read on the leader plus the copy. Measured here (etcd 3.4, 2 cores at
# load 3.9): a 295 MB DB saved in 3.0 s, ~100 MB/s; at that rate a DB at the 8 GiB quota
# ceiling takes ~85 s to save, and its upload (not measured: no Azure here) as long again at
# 100 MB/s to storage: minutes, inside the interval. The timer fires on every member at the
# same wall-clock minutes (so it must divide 60), and only the member leading the cluster at
# that moment takes the snapshot: one per cluster per interval, not one per member.
ETCD_SNAPSHOT_INTERVAL_MIN = 15
# A run that has not finished in 10 minutes is stopped (and the unit fails, visibly) before the
# next one is due; the next run starts afresh.
ETCD_SNAPSHOT_TIMEOUT_S = 600
# Newest snapshots kept on the member's local SSD beside the data dir (an hour's worth): the
# quickest restore when the VMs survived; Azure's copy is the one that survives a deallocation,
# which wipes the local SSD. 4 x 8 GiB at the quota ceiling fits the smallest etcd size's
# temp disk (Standard_D4ds_v5: 150 GiB) with the data dir.
ETCD_SNAPSHOT_KEEP_LOCAL = 4
# The Azure copies: deleted by the storage account's lifecycle policy after 7 days. A week is
# the horizon etcd's restore guidance sizes its revision bump for ("cover a week old snapshot
# with bumping by 1'000'000'000 assuming that etcd runs with less than 1500 writes per
# second", op-guide/recovery.md v3.5) and how long etcd-manager keeps its hourly backups
# (pkg/backupcontroller/cleanup.go HourlyBackupsRetention). At one snapshot per 15 minutes a
# week is 672 blobs per cluster: ~670 GiB for a 1 GiB DB, ~5.3 TiB at the 8 GiB ceiling.
ETCD_SNAPSHOT_BLOB_RETENTION_DAYS = 7
# One container for both clusters, a prefix per cluster (main/, events/): the etcd VMs share one
# identity, so separate containers would not keep one cluster's members from the other's
# snapshots, and one role assignment is scoped to exactly the one container.
ETCD_SNAPSHOT_CONTAINER = "etcd-snapshots"
# Blob upload block size: Put Block takes at most 4,000 MiB per block from x-ms-version
# 2019-12-12 and a blob at most 50,000 blocks (learn.microsoft.com rest/api/storageservices
# put-block; the Blob storage scale targets); 64 MiB blocks keep the uploader's memory small and
# reach 3 TiB, and an 8 GiB snapshot is 128 of them.
ETCD_SNAPSHOT_BLOCK_BYTES = 64 * 1024 * 1024
# Where the Pulumi program delivers the Azure half of the snapshot job's config (account's blob
# endpoint, container, the identity's client ID: known only once Azure created them), beside the
# rendered /etc/kilonode/etcd-snapshot.json that names this path. No file: no upload (a local
# rehearsal). A host path both layers must agree on: it belongs with kilonode.plan.wellknown.
ETCD_SNAPSHOT_AZURE_CONFIG = "/etc/kilonode/etcd-snapshot-azure.json"
