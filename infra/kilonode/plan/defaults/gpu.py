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
