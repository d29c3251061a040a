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
