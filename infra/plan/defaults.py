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
