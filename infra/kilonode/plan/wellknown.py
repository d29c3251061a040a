"""Ports, and the paths on each host that several layers must agree on: the renderers write
them into flags and configs, the Pulumi program delivers certificates and kubeconfigs to
them, the planner builds URLs from the ports. One home, in the plan layer, so no layer
reaches into another's internals.

TLS material: the Pulumi program creates the certificates and delivers them to exactly
these paths. The trust layout:

- each etcd cluster (main, events) has its own CA; members' server and peer certificates
  are signed by it, and `--peer-trusted-ca-file` is that CA alone, so a member of one
  cluster can never join the other;
- kube-apiserver has one etcd client certificate (one `--etcd-certfile` serves both
  `--etcd-servers` and `--etcd-servers-overrides`), signed by the main etcd CA; each
  cluster's `--trusted-ca-file` (ETCD_CLIENT_CA) therefore holds the main etcd CA (plus,
  for the events cluster, its own CA for local etcdctl);
- kube-apiserver's `--etcd-cafile` is a bundle of both etcd CAs.
"""

ETCD_PKI_DIR = "/etc/etcd/pki"
ETCD_CA = f"{ETCD_PKI_DIR}/ca.crt"
ETCD_CLIENT_CA = f"{ETCD_PKI_DIR}/client-ca.crt"
ETCD_SERVER_CERT = f"{ETCD_PKI_DIR}/server.crt"
ETCD_SERVER_KEY = f"{ETCD_PKI_DIR}/server.key"
ETCD_PEER_CERT = f"{ETCD_PKI_DIR}/peer.crt"
ETCD_PEER_KEY = f"{ETCD_PKI_DIR}/peer.key"

K8S_PKI_DIR = "/etc/kubernetes/pki"
K8S_CA = f"{K8S_PKI_DIR}/ca.crt"
K8S_CA_KEY = f"{K8S_PKI_DIR}/ca.key"
APISERVER_CERT = f"{K8S_PKI_DIR}/apiserver.crt"
APISERVER_KEY = f"{K8S_PKI_DIR}/apiserver.key"
APISERVER_ETCD_CA_BUNDLE = f"{K8S_PKI_DIR}/etcd-ca-bundle.crt"
APISERVER_ETCD_CLIENT_CERT = f"{K8S_PKI_DIR}/apiserver-etcd-client.crt"
APISERVER_ETCD_CLIENT_KEY = f"{K8S_PKI_DIR}/apiserver-etcd-client.key"
APISERVER_KUBELET_CLIENT_CERT = f"{K8S_PKI_DIR}/apiserver-kubelet-client.crt"
APISERVER_KUBELET_CLIENT_KEY = f"{K8S_PKI_DIR}/apiserver-kubelet-client.key"
SERVICE_ACCOUNT_KEY = f"{K8S_PKI_DIR}/sa.key"
SERVICE_ACCOUNT_PUB = f"{K8S_PKI_DIR}/sa.pub"

# Kubeconfigs the Pulumi program delivers (signed client certificates inside).
SCHEDULER_KUBECONFIG = "/etc/kubernetes/scheduler.kubeconfig"
CONTROLLER_MANAGER_KUBECONFIG = "/etc/kubernetes/controller-manager.kubeconfig"
# The GPU health taint controller (kilonode.gpu.controller) on every apiserver VM, as the
# user kilonode:gpu-health-controller (kilonode.k8s.gpu binds its ClusterRole).
GPU_HEALTH_CONTROLLER_KUBECONFIG = "/etc/kubernetes/gpu-health-controller.kubeconfig"
KUBELET_KUBECONFIG = "/etc/kubernetes/kubelet.kubeconfig"
KUBELET_BOOTSTRAP_KUBECONFIG = "/etc/kubernetes/bootstrap-kubelet.kubeconfig"

# Ports (the projects' defaults; the NSG rules and the load balancer use the same numbers).
ETCD_CLIENT_PORT = 2379
ETCD_PEER_PORT = 2380
ETCD_METRICS_PORT = 2381
APISERVER_PORT = 6443

# Where the node image bakes preloaded image archives.
PRELOAD_DIR = "/opt/kilonode/preload"

# NCCL on the InfiniBand GPU sizes Azure publishes a topology for: the file where Azure's own
# HPC images put it (Azure/azhpc-images components/customizations/<family>.sh), so a job
# written for those images finds it at the same path; the label names the family.
NCCL_CONF = "/etc/nccl.conf"
NCCL_TOPOLOGY_LABEL = "kilonode.io/nccl-topology"


def nccl_topology_file(family: str) -> str:
    return f"/opt/microsoft/{family}/topo.xml"

# Team capacity (kilonode.plan.capacity): a team's shards register with this label and a
# NoSchedule taint of the same key, so only pods that tolerate it (the team's own, and
# low-priority borrowers that tolerate the key with any value) land there.
TEAM_LABEL = "kilonode.io/team"
# InfiniBand pools: every node is labelled with its fabric, the scale set it is an instance of
# (on Azure RDMA reaches only the VMs of one scale set). The kubelet gets the value at boot from
# the file a unit writes (kilonode.render.pool: fabric-label), from the node's own host name.
FABRIC_LABEL = "kilonode.io/fabric"
FABRIC_ENV_VAR = "KILONODE_FABRIC"
FABRIC_ENV_FILE = "/run/kilonode/fabric.env"
# What a pod asks for to get the node's InfiniBand devices (/dev/infiniband/*): the RDMA shared
# device plugin's resource, "rdma/" + its configured resourceName (kilonode.k8s.rdma).
RDMA_RESOURCE_NAME = "ib"
RDMA_RESOURCE = f"rdma/{RDMA_RESOURCE_NAME}"
TEAM_TAINT_EFFECT = "NoSchedule"


def team_taint(team: str) -> str:
    return f"{TEAM_LABEL}={team}:{TEAM_TAINT_EFFECT}"

# System pools (NodePoolConfig.system): their nodes register with this label, and the
# cluster's own workloads prefer nodes that carry it (kilonode.k8s.pods.system_pod_spec).
SYSTEM_LABEL = "kilonode.io/system"

# The extended resource the NVIDIA device plugin registers for each GPU (kilonode.k8s.gpu).
GPU_RESOURCE = "nvidia.com/gpu"

# Azure's host endpoints, at the same addresses in every VM ("Azure Instance Metadata
# Service", learn.microsoft.com/azure/virtual-machines/instance-metadata-service: 169.254.169.254,
# non-routable, HTTP on port 80, where managed-identity tokens are issued; "What is IP address
# 168.63.129.16", learn.microsoft.com/azure/virtual-network/what-is-ip-address-168-63-129-16:
# the WireServer on 80 and the HostGAPlugin on 32526, both serving the VM agent, and Azure's
# DNS resolver on 53, which pods' resolvers need). Every pool node drops pods' traffic to the
# first and to the second's TCP ports (kilonode.render.metadata_block).
AZURE_IMDS_ADDRESS = "169.254.169.254"
AZURE_WIRESERVER_ADDRESS = "168.63.129.16"
AZURE_WIRESERVER_TCP_PORTS = (80, 32526)
