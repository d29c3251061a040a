"""Built-in choices on every node."""

# Container logs on every node (Docker's json-file driver; the kubelet's containerLogMax*
# for containerd): 3 files of 100 MiB per container, so a chatty training job cannot fill
# the OS disk.
CONTAINER_LOG_MAX_SIZE = "100Mi"
CONTAINER_LOG_MAX_FILES = 3

# The resolver file the kubelet gives pods (KubeletConfiguration resolvConf): dnsPolicy
# Default pods, hostNetwork pods, and CoreDNS's upstreams (`forward . /etc/resolv.conf`).
# The node image enables systemd-resolved (node-image/recipe.toml [units] enable), so the
# kubelet's default, /etc/resolv.conf, is resolved's stub naming 127.0.0.53: inside a pod's
# network namespace that is the pod itself, and CoreDNS's `loop` plugin halts it
# (coredns plugin/loop/README.md at v1.12.1, "Troubleshooting Loops In Kubernetes Clusters").
# resolved's own file lists the upstream servers DHCP gave (Azure's 168.63.129.16); kubeadm
# sets the same path when systemd-resolved is active (cmd/kubeadm/app/componentconfigs/
# kubelet_unix.go mutateResolverConfig, kubeletSystemdResolverConfig).
KUBELET_RESOLV_CONF = "/run/systemd/resolve/resolv.conf"
KUBELET_RESOLV_CONF_REASON = (
    "the node image runs systemd-resolved, whose /etc/resolv.conf stub (127.0.0.53) is the pod itself inside a "
    "pod; resolved's /run/systemd/resolve/resolv.conf names the upstream servers (kubeadm's choice too)"
)

# A new VM's way to a Ready node that takes work, at most: Azure allocation (InfiniBand sizes
# in one placement group), boot, the kubelet's TLS bootstrap and registration, cloud-node-manager
# lifting the uninitialized taint, then on GPU nodes the health checks under the startup taint
# (field notes: active GPU tests need seconds to minutes). The cluster autoscaler's
# --max-node-provision-time (kilonode.plan.defaults.autoscaler) and `pulumi up`'s awaits of
# in-cluster workloads (kilonode.plan.resolve.components.awaits_plan) are sized from it.
NODE_READY_MIN = 30
