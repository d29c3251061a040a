"""Certificates and identities: validity, the groups nodes and admins are, the serving-certificate
approver's scope (its image: the catalogue's kubeletCsrApprover)."""

# Certificates (pulumi-tls, ECDSA P-256): CAs for ten years (renewing one is not automated:
# docs/runbooks/certificate-renewal.md); leaves for one year.
CA_VALIDITY_HOURS = 10 * 365 * 24
LEAF_VALIDITY_HOURS = 365 * 24
# A control-plane host's leaves are renewed only when the stack raises that host's
# certificateGenerations entry: one host per `pulumi up`, a VM replacement the restart guard
# allows. pulumi-tls's own early renewal is off for them (0 hours): it would re-issue every leaf
# of the first `pulumi up` in the same later `pulumi up`, replacing every control-plane VM at once.
# At 0, pulumi-tls re-issues a leaf only once it has expired (terraform-provider-tls
# common_cert.go, modifyPlanIfCertificateReadyForRenewal: ready when now >= notAfter - hours),
# which the expiry alert exists to prevent (and the restart guard still refuses a majority).
HOST_LEAF_EARLY_RENEWAL_HOURS = 0
# The administrators' client certificates are on no host (Pulumi state and the exported
# kubeconfig only): pulumi-tls renews them in the first `pulumi up` of their last 30 days,
# which replaces no machine. The program's own provider names its cluster (clusterIdentifier),
# so its new kubeconfig updates the provider rather than replacing every in-cluster object.
LEAF_RENEW_BEFORE_HOURS = 30 * 24
# The expiry alert (kilonode.render.monitoring): a warning this many days before a
# certificate's notAfter (time to renew one host a day, with room), critical at the second.
CERT_EXPIRY_WARNING_DAYS = 45
CERT_EXPIRY_CRITICAL_DAYS = 14

# Node TLS bootstrap (kubeadm's scheme). The group every node's bootstrap token adds (it
# must start with system:bootstrappers:); the bindings below grant it what kubeadm grants
# its system:bootstrappers:kubeadm:default-node-token group.
BOOTSTRAP_GROUP = "system:bootstrappers:kilonode:nodes"
# Each pool's tokens add a group of their own, <prefix><pool>: the node client approver
# (kilonode.node.node_client_approver, which holds the same prefix) approves a first client
# certificate only for a name of that pool's scale sets. Pool names ([a-z0-9-]) keep it inside
# cluster-bootstrap's BootstrapGroupPattern, \Asystem:bootstrappers:[a-z0-9:-]{0,255}[a-z0-9]\z.
POOL_BOOTSTRAP_GROUP_PREFIX = "system:bootstrappers:kilonode:pool:"
# `kilonode preflight` warns this many days before the current join tokens expire: time for a
# rotation (a stack change and `pulumi up`) while new nodes still join.
JOIN_TOKEN_WARN_DAYS = 30
# The node client approver's identity on the apiserver VMs: a client certificate (CN = this
# user, no group), bound by name to its own ClusterRole (kilonode.k8s.bootstrap).
NODE_CLIENT_APPROVER_USER = "kilonode:node-client-approver"
# The apiservers' identity towards aggregated API servers (metrics-server): the CN of each
# apiserver's front-proxy client certificate and the one name --requestheader-allowed-names
# admits, kubeadm's (cmd/kubeadm/app/constants: FrontProxyClientCertCommonName).
FRONT_PROXY_CLIENT_USER = "front-proxy-client"
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
