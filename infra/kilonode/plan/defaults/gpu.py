"""GPU pools: the NVIDIA device plugin (release, digest and image: the catalogue's devicePlugin)
and the GPU health taint controller."""

# A DaemonSet update over thousands of GPU nodes: 10% at a time, as kube-proxy. While a
# node's plugin restarts, the kubelet keeps the GPUs already allocated to running pods.
DEVICE_PLUGIN_MAX_UNAVAILABLE = "10%"
# The device plugin's requests. Upstream's manifest and chart set none (resources: {}), which
# makes its pod BestEffort: the first the kubelet evicts under memory pressure, taking the
# node's nvidia.com/gpu away until it comes back. A small Go daemon (ListAndWatch, Allocate):
# the RDMA plugin's figures (kilonode.k8s.rdma), not measured here. No limit: an OOM kill would
# unregister the GPUs.
DEVICE_PLUGIN_REQUESTS = {"cpu": "10m", "memory": "32Mi"}
# The GPU health taint controller's identity: a client certificate signed by the cluster CA
# (CN = this user, no group), bound by name to its own ClusterRole (kilonode.k8s.gpu).
GPU_HEALTH_CONTROLLER_USER = "kilonode:gpu-health-controller"

# The NCCL all-reduce job kilonode generates (kilonode.k8s.nccl_job, `kilonode gpu nccl-job`):
# A gang of two nodes by default: the smallest gang whose traffic crosses InfiniBand.
NCCL_JOB_NODES = 2
# Each pod asks for this share of its node's vCPUs and memory (rounded down): whole-node GPU
# pods, leaving about 15% to the DaemonSets and the few system pods the default scheduler
# places beside them, so that the two schedulers cannot collide on CPU or memory
# (docs/gang-scheduling.md, "The race between two schedulers").
NCCL_JOB_NODE_SHARE_PERCENT = 85
# /dev/shm as a memory-backed emptyDir of this size: a container runtime's default /dev/shm is
# 64 MiB, and NCCL's shared-memory transport and proxy buffers live there; a bound, since its
# pages count against the pod's memory.
NCCL_JOB_SHM_SIZE = "16Gi"
# torchrun's static rendezvous (rank 0's TCP store) on this port of pod 0: torchrun's own default.
NCCL_JOB_MASTER_PORT = 29500
# The benchmark's largest all-reduce, in bytes: 8 GiB per GPU, the top of the range Azure's and
# NVIDIA's all_reduce_perf runs use (`-e 8G`), which fits the 40 GB of an A100 with room.
NCCL_JOB_MAX_BYTES = 8 * 1024**3
# The run fails below this share of the pool's two-node network ceiling (its InfiniBand links'
# signalling rate, in GB/s: 8 x 400 Gb/s = 400 GB/s on ND H100 v5, 200 GB/s on ND A100 v4).
# Why 60%: staged through host memory (no GPUDirect RDMA) the pinned topologies' shared PCIe
# uplinks cap all-reduce at about half the ceiling on ND H100 v5 and a quarter on ND A100 v4,
# and a gang on sockets far below; NCCL over InfiniBand with GPUDirect runs well above 60% of
# signalling rate on two nodes. A floor that separates the two, not a measured figure for these
# sizes (none was published or measured here): move it when a run on them is recorded.
NCCL_JOB_BUSBW_FLOOR_SHARE = 0.6
# How long pod 1..N waits for pod 0's DNS name (the headless Service's record) before giving up.
NCCL_JOB_DNS_WAIT_S = 300
