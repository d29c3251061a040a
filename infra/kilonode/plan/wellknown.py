"""Ports, and the paths on each host that several layers must agree on: the renderers write
them into flags and configs, the Pulumi program delivers certificates and kubeconfigs to
them, the planner builds URLs from the ports. One home, in the plan layer, so no layer
reaches into another's internals.

TLS material: the Pulumi program creates the certificates and delivers them to exactly
these paths. The trust layout:

- each etcd cluster (main, events, and leases where the stack has it) has its own CA; members'
  server and peer certificates
  are signed by it, and `--peer-trusted-ca-file` is that CA alone, so a member of one
  cluster can never join the other;
- kube-apiserver has one etcd client certificate (one `--etcd-certfile` serves both
  `--etcd-servers` and `--etcd-servers-overrides`), signed by the main etcd CA; each
  cluster's `--trusted-ca-file` (ETCD_CLIENT_CA) therefore holds the main etcd CA (plus,
  for the events and leases clusters, its own CA for local etcdctl);
- kube-apiserver's `--etcd-cafile` is a bundle of every etcd cluster's CA.
"""

# The resource each etcd cluster but main holds, as kube-apiserver's --etcd-servers-overrides
# names it: `group/resource`, the core group empty (k8s.io/apiserver pkg/server/options/etcd.go:
# AddFlags "group/resource#servers, where servers are URLs, semicolon separated", entries comma
# separated; Validate splits each entry at "#" and its resource at "/"; the storage factory's
# New() calls SetEtcdLocation(GroupResource{group, resource}, servers)). Every Lease is
# coordination.k8s.io's `leases`: node heartbeats (kube-node-lease) and leader elections alike.
ETCD_OVERRIDE_RESOURCES = {"events": "/events", "leases": "coordination.k8s.io/leases"}

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
# The aggregation layer (kube-apiserver --requestheader-client-ca-file, --proxy-client-*): the
# front-proxy CA, a CA of its own (kilonode.plan.pki says why), and each apiserver's client
# certificate from it, which the apiserver presents to aggregated API servers (metrics-server).
# kubeadm's file names (cmd/kubeadm/app/constants: FrontProxyCACertName, FrontProxyClientCertName).
FRONT_PROXY_CA = f"{K8S_PKI_DIR}/front-proxy-ca.crt"
FRONT_PROXY_CLIENT_CERT = f"{K8S_PKI_DIR}/front-proxy-client.crt"
FRONT_PROXY_CLIENT_KEY = f"{K8S_PKI_DIR}/front-proxy-client.key"
SERVICE_ACCOUNT_KEY = f"{K8S_PKI_DIR}/sa.key"
SERVICE_ACCOUNT_PUB = f"{K8S_PKI_DIR}/sa.pub"
# kube-scheduler's and kube-controller-manager's serving certificates (--tls-cert-file): each
# signed by the cluster CA for its host's address, so the cluster's Prometheus verifies them
# with the CA its ServiceAccount mounts (kilonode.plan.pki).
SCHEDULER_SERVING_CERT = f"{K8S_PKI_DIR}/kube-scheduler.crt"
SCHEDULER_SERVING_KEY = f"{K8S_PKI_DIR}/kube-scheduler.key"
CONTROLLER_MANAGER_SERVING_CERT = f"{K8S_PKI_DIR}/kube-controller-manager.crt"
CONTROLLER_MANAGER_SERVING_KEY = f"{K8S_PKI_DIR}/kube-controller-manager.key"

# Kubeconfigs the Pulumi program delivers (signed client certificates inside).
SCHEDULER_KUBECONFIG = "/etc/kubernetes/scheduler.kubeconfig"
CONTROLLER_MANAGER_KUBECONFIG = "/etc/kubernetes/controller-manager.kubeconfig"
# The GPU health taint controller (kilonode.gpu.controller) on every apiserver VM, as the
# user kilonode:gpu-health-controller (kilonode.k8s.gpu binds its ClusterRole).
GPU_HEALTH_CONTROLLER_KUBECONFIG = "/etc/kubernetes/gpu-health-controller.kubeconfig"
# The node client approver (kilonode.node.node_client_approver) on every apiserver VM, as the
# user kilonode:node-client-approver (kilonode.k8s.bootstrap binds its ClusterRole).
NODE_CLIENT_APPROVER_KUBECONFIG = "/etc/kubernetes/node-client-approver.kubeconfig"
# kube-apiserver's EncryptionConfiguration (kilonode.plan.encryption): it holds the key that
# encrypts Secrets in etcd, so only the apiservers' custom data carries it (0600, root).
ENCRYPTION_CONFIG = "/etc/kubernetes/encryption-config.yaml"
KUBELET_KUBECONFIG = "/etc/kubernetes/kubelet.kubeconfig"
KUBELET_BOOTSTRAP_KUBECONFIG = "/etc/kubernetes/bootstrap-kubelet.kubeconfig"

# Ports (the projects' defaults; the NSG rules and the load balancer use the same numbers).
ETCD_CLIENT_PORT = 2379
ETCD_PEER_PORT = 2380
ETCD_METRICS_PORT = 2381
APISERVER_PORT = 6443
# kube-scheduler's and kube-controller-manager's secure ports (/healthz, /metrics): their defaults
# (kubernetes pkg/scheduler/apis/config/types.go DefaultKubeSchedulerPort 10259, pkg/cluster/ports/ports.go
# KubeControllerManagerPort 10257), rendered explicitly so the flag, the NSG rule and the scrape job
# name one number.
SCHEDULER_PORT = 10259
CONTROLLER_MANAGER_PORT = 10257
# kilonode's own: each control-plane host's certificate expiry metrics (kilonode.render.cert_metrics);
# a port no component of the control plane uses
CERT_METRICS_PORT = 9479
# kilonode's own: each pool node's per-pod traffic metrics (kilonode.render.pod_traffic); next to
# the one above, used by no component of the nodes
POD_TRAFFIC_METRICS_PORT = 9480
# kilonode's own: the GPU health agent's metrics on each GPU node and the taint controller's on each
# apiserver VM (kilonode.render.gpu_metrics). Next to the two above, so kilonode's exporters sit in
# one block; no component kilonode runs on those hosts listens on either (the kubelet 10250,
# kube-proxy 10249/10256, the apiserver 6443, the certificate metrics 9479, the pod traffic
# 9480), nor do the exporters a user is likeliest to add there (node-exporter 9100, NVIDIA's
# DCGM exporter 9400). Two ports, not one: the control-plane NSG admits only the controller's.
GPU_HEALTH_AGENT_METRICS_PORT = 9481
GPU_HEALTH_CONTROLLER_METRICS_PORT = 9482
# The exporters' own ports, as upstream sets them (kilonode.k8s.exporters): node-exporter's
# --web.listen-address default :9100 (prometheus/node_exporter Dockerfile at v1.12.1: EXPOSE 9100)
# and dcgm-exporter's -a default :9400 (NVIDIA/dcgm-exporter pkg/cmd/app.go at 4.5.3-4.8.2 l.133).
# Host-network pods: the node firewall keeps both to the Prometheus pool (catalog/listeners.yaml).
NODE_EXPORTER_PORT = 9100
DCGM_EXPORTER_PORT = 9400

# Where the node image bakes preloaded image archives.
PRELOAD_DIR = "/opt/kilonode/preload"

# NCCL on the InfiniBand GPU sizes Azure publishes a topology for: the file where Azure's own
# HPC images put it (Azure/azhpc-images components/customizations/<family>.sh), so a job
# written for those images finds it at the same path; the label names the family.
NCCL_CONF = "/etc/nccl.conf"
NCCL_TOPOLOGY_LABEL = "kilonode.io/nccl-topology"


def nccl_topology_file(family: str) -> str:
    return f"/opt/microsoft/{family}/topo.xml"


def nccl_topology_component(family: str) -> str:
    """The node-image/binaries.toml component that pins the family's topology file."""
    return f"nccl-topology-{family}"


# The NCCL settings of a topology family, one home for the host's /etc/nccl.conf
# (kilonode.render.pool.nccl_conf) and a job's environment (kilonode.k8s.nccl_job): as Azure's
# HPC images write /etc/nccl.conf (Azure/azhpc-images 8e9d055f components/customizations/
# ndv4.sh l.11-15, ndv5.sh l.11-15, ndv2.sh l.11-14): relaxed PCIe ordering on the A100 and
# H100/H200 families only, the published topology, and CPU affinity left to the job.
NCCL_RELAXED_ORDERING_FAMILIES = ("ndv4", "ndv5")


def nccl_host_settings(family: str) -> tuple[tuple[str, str], ...]:
    """/etc/nccl.conf's KEY=VALUE pairs for a family, in the order Azure's images write them."""
    relaxed = (("NCCL_IB_PCI_RELAXED_ORDERING", "1"),) if family in NCCL_RELAXED_ORDERING_FAMILIES else ()
    return (*relaxed, ("NCCL_TOPO_FILE", nccl_topology_file(family)), ("NCCL_IGNORE_CPU_AFFINITY", "1"))


# What a pod needs beyond the host file, which NCCL in a container never reads (it reads the
# container's /etc). As Azure's own NCCL runs on these sizes set them (Azure/azhpc-images
# 8e9d055f tests/test-definitions.sh l.245-256, the standard_nd96*v4 case, and
# tests/health_checks/NDv4/test-nccl.sh l.38-40): NCCL's bootstrap and socket traffic on eth0
# (in a pod: its own network interface; the InfiniBand HCAs carry the data over verbs, and
# without this NCCL may pick another interface), and CUDA's device order by PCI bus ID, the
# order the topology file describes; and NCCL_NET_GDR_LEVEL=5 (SYS), as those runs set it:
# GPUDirect RDMA between every GPU and HCA the topology file pairs, whatever PCI distance the VM's
# flattened bus shows. The nodes register GPU memory by DMA-BUF (the open kernel module,
# catalog/contracts.yaml gpuDirectRdma); where NCCL finds no GDR support it says so
# ("GPU Direct RDMA Disabled") and stages through host memory rather than failing.
NCCL_POD_SETTINGS: tuple[tuple[str, str], ...] = (
    ("NCCL_SOCKET_IFNAME", "eth0"), ("CUDA_DEVICE_ORDER", "PCI_BUS_ID"), ("NCCL_NET_GDR_LEVEL", "5"))


# What the job image's NCCL (2.18.3: catalog/components.yaml ncclBenchmark) must be told on a
# family's nodes to run a multi-node gang at full speed, where its defaults are wrong there. On ndv5
# (H100/H200: NVSwitch, sm90, CUDA reports multicast) two, each until the release that fixed it (the
# contract ncclBenchmark in catalog/contracts.yaml breaks preflight while the image's NCCL is older
# and a setting is missing; tests/k8s/test_nccl_job.py fails once the image's NCCL has both fixes,
# so that they are dropped then). Read at NVIDIA/nccl v2.18.3-1:
# - NCCL_NVLS_ENABLE=0: NVLS is on by default wherever CUDA reports multicast (src/transport/nvls.cc
#   l.230 NVLS_ENABLE default 2, l.247-251), as on an HGX H100. Its inter-node graph search sizes
#   `nets` per NIC (src/graph/search.cc l.511-513) but reads nets[graph->nChannels] (l.532-533),
#   the channel count bounded only by maxChannels (l.426), and hands that NET id on where a GPU
#   index is wanted: fixed by 8ed014ba ("Fix inter-node NVLS graph search ... could cause crashes",
#   naming NVIDIA/nccl#931, whose thread was not read here), released in v2.18.5-1. With 0 NCCL
#   never searches the NVLS graph (nvlsSupport stays 0, nvls.cc l.239; src/init.cc l.907-912) and
#   runs its rings and trees.
# - NCCL_NET_FORCE_FLUSH=0: 2.18.3 flushes every GPUDirect receive on Hopper too (src/graph/paths.cc
#   l.403 NET_FORCE_FLUSH default 1, l.411 applies it from compute capability 9.0), an extra read
#   through the HCA per receive; v2.19.1-1 made 0 the default (f9c3dc25, "Disable network flush by
#   default on H100"), and l.402's own comment says 0 disables it on Hopper.
# Left as it is (docs/nccl-job.md says so): 2.18.3's IB send truncates its FIFO index to an int
# (src/transport/net_ib.cc l.1067), fixed by 6e24ef4e in v2.18.5-1; no setting avoids it.
NCCL_FAMILY_POD_SETTINGS: dict[str, tuple[tuple[str, str], ...]] = {
    "ndv5": (("NCCL_NVLS_ENABLE", "0"), ("NCCL_NET_FORCE_FLUSH", "0")),
}


def nccl_pod_environment(family: str) -> tuple[tuple[str, str], ...]:
    """A container's NCCL environment on a family's nodes: the host file's settings (the
    topology file mounted at the same path), what a pod needs besides, and what the job
    image's NCCL must be told on that family (NCCL_FAMILY_POD_SETTINGS)."""
    return (*nccl_host_settings(family), *NCCL_POD_SETTINGS, *NCCL_FAMILY_POD_SETTINGS.get(family, ()))

# A scale set's name ends in its index within the pool, zero-padded to this many digits (more
# past 999): kilonode.plan.resolve.pools.shard_name writes it, the fabric-label script's
# patterns match it (kilonode.render.pool.index_patterns).
SHARD_INDEX_DIGITS = 3


def shard_index(index: int) -> str:
    return f"{index:0{SHARD_INDEX_DIGITS}d}"


# Team capacity (kilonode.plan.capacity): a team's shards register with this label and a
# NoSchedule taint of the same key, so only pods that tolerate it (the team's own, and
# low-priority borrowers that tolerate the key with any value) land there.
# Every node registers with its pool's name under this label (kilonode.plan.resolve.pools); the
# device plugins, the balloons and CoreDNS's autoscaler select pools by it.
POOL_LABEL = "kilonode.io/pool"
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
# How often that plugin looks for the node's HCAs again (its config's periodicUpdateInterval,
# seconds), and so how long after an HCA appears a pod may still be handed the devices of an older
# scan, without it: Mellanox/k8s-rdma-shared-dev-plugin v1.5.3 scans at its start and then on this
# ticker (pkg/resources/resources_manager.go:386-420; 60 s when unset, l.51, 300 in upstream's
# example ConfigMap), and Allocate gives a pod the last scan's device specs (server.go:369-391).
# The GPU health agent holds a node's startup taint until this long after its InfiniBand ports are
# up (kilonode.render.pool gpu_health_config, the agent's await_rdma_plugin), so a gang pod never
# meets a partial list at boot; later, a virtual function that comes back (a VF re-attached in
# service) is re-listed within it. 30 s: a scan walks the PCI devices in sysfs and asks netlink for
# each netdev (resources_manager.go:293-337, pci_net_device.go:25-70), logs a line per network
# device, and tells the kubelet nothing unless the list changed (server.go:461-466), so it is cheap
# at 30 s; the agent's hold overlaps its active check (minutes), so a shorter interval would not
# shorten a boot, while a longer one leaves a re-attached HCA out of new pods for longer.
RDMA_PLUGIN_RESCAN_S = 30
TEAM_TAINT_EFFECT = "NoSchedule"


def team_taint(team: str) -> str:
    return f"{TEAM_LABEL}={team}:{TEAM_TAINT_EFFECT}"


def toleration_of(taint: str) -> dict[str, str]:
    """The toleration (a pod spec's dict) that tolerates exactly one taint as the plan writes
    it, `key[=value]:effect` (the kubelet's --register-with-taints form): Equal on its value,
    Exists when it has none."""
    key_value, _, effect = taint.partition(":")
    key, _, value = key_value.partition("=")
    return {"key": key, "operator": "Equal", "value": value, "effect": effect} if value else {
        "key": key, "operator": "Exists", "effect": effect}

# System pools (NodePoolConfig.system): their nodes register with this label, and the
# cluster's own workloads prefer nodes that carry it (kilonode.k8s.pods.system_pod_spec).
SYSTEM_LABEL = "kilonode.io/system"

# The extended resource the NVIDIA device plugin registers for each GPU (kilonode.k8s.gpu).
GPU_RESOURCE = "nvidia.com/gpu"

# How a GPU pod's device list travels from the NVIDIA device plugin (kilonode.k8s.gpu) to the
# container toolkit in the node image (kilonode.image.gpu): the two must agree, and neither
# may import the other. The plugin's device-list strategies (NVIDIA/k8s-device-plugin v0.17.4,
# ... and with this taint, so that only pods that tolerate it land beside the controllers and
# their ServiceAccount tokens. AKS's convention for its system node pools: the only NoSchedule
# taint AKS admits on one (its API's SystemPoolHasRestrictedTaint error, quoted in Azure/AKS#2578:
# "Placing custom taints on system pool is not supported(except 'CriticalAddonsOnly' taint ...)",
# aka.ms/aks/system-taints), used to keep application pods off it (cilium/cilium#17529: "a system
# node pool tainted with CriticalAddonsOnly=true:NoSchedule, preventing application pods from being
# scheduled on it"); the key the add-ons already tolerate (kilonode.k8s.pods.tolerate_critical_addons).
CRITICAL_ADDONS_KEY = "CriticalAddonsOnly"
SYSTEM_TAINT = f"{CRITICAL_ADDONS_KEY}=true:NoSchedule"
# fd56a747, api/config/v1/consts.go l.39-42: envvar, volume-mounts, cdi-annotations, cdi-cri).
DEVICE_LIST_ENVVAR = "envvar"
DEVICE_LIST_VOLUME_MOUNTS = "volume-mounts"
# The toolkit's config.toml keys that decide what it takes from an unprivileged container
# (NVIDIA/nvidia-container-toolkit v1.17.8, f202b80a, internal/config/config.go l.62-63), and
# their values when the file leaves them out (GetDefault l.100: AcceptEnvvarUnprivileged true;
# AcceptDeviceListAsVolumeMounts is Go's zero value, false).
TOOLKIT_ENVVAR_WHEN_UNPRIVILEGED = "accept-nvidia-visible-devices-envvar-when-unprivileged"
TOOLKIT_VOLUME_MOUNTS = "accept-nvidia-visible-devices-as-volume-mounts"
TOOLKIT_DEFAULTS = {TOOLKIT_ENVVAR_WHEN_UNPRIVILEGED: True, TOOLKIT_VOLUME_MOUNTS: False}
# Which key must be true for the toolkit to take a device list handed over by that strategy
# (its hook, cmd/nvidia-container-runtime-hook/container_config.go l.162-179 at v1.17.8: the
# volume mounts first when accepted, then NVIDIA_VISIBLE_DEVICES when the container is
# privileged or the envvar key is true). The CDI strategies need a CDI spec on
# the node (`nvidia-ctk cdi generate`), which the image does not write: no key takes them.
DEVICE_LIST_TOOLKIT_KEY = {
    DEVICE_LIST_ENVVAR: TOOLKIT_ENVVAR_WHEN_UNPRIVILEGED,
    DEVICE_LIST_VOLUME_MOUNTS: TOOLKIT_VOLUME_MOUNTS,
}
# The GPU image's unit that makes the NVIDIA device nodes and the /dev/char links once the driver
# is loaded (kilonode.image.gpu NVIDIA_DEVICES_UNIT_TEXT), and the marker it writes when done: the
# device plugin's init container waits for it (kilonode.k8s.gpu), as GPU Operator's plugin waits
# for its toolkit-ready file. Shared by the image and the in-cluster side, which import neither.
NVIDIA_DEVICES_UNIT = "kilonode-nvidia-devices.service"
NVIDIA_READY_DIR = "/run/kilonode/nvidia"
NVIDIA_READY_MARKER = f"{NVIDIA_READY_DIR}/ready"
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


# A DaemonSet's stated per-node API load (kilonode.preflight.apiload): what its pods list or watch,
# why, and how it is bounded. A DaemonSet whose ServiceAccount may list or watch cluster-wide
# and carries no such annotation is refused by the policy pack and flagged by `kilonode diff`.
API_LOAD_BUDGET_ANNOTATION = "kilonode.io/api-load-budget"

# How many pods of one node may hold the shared HCAs at once (the RDMA shared device plugin's
# rdmaHcaMax, kilonode.k8s.rdma): more than a node ever runs pods (research-7500's podsPerNode is
# 3); a bound, not a target. Upstream's example uses 1,000. Here because the autoscaler's node
# template of an empty InfiniBand scale set names it too (kilonode.plan.node_templates).
RDMA_HCA_MAX = 100

# The tag on the cluster's resource group while its stack is armed for `pulumi destroy`
# (ClusterConfig.teardown): the policy pack's etcd-protected invariant reads it
# (kilonode.review.rules), so that an unprotected etcd VM is refused everywhere else.
TEARDOWN_TAG = "kilonode-teardown"
TEARDOWN_ARMED = "armed"
