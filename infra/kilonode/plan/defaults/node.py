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

# The kubelet's podPidsLimit (KubeletConfiguration, kubernetes/kubelet config/v1beta1/types.go at
# kubernetes-1.34.2: `PodPidsLimit *int64`, "the maximum number of PIDs in any pod", default -1 =
# none; CIS Kubernetes Benchmark 4.2.13). The pids cgroup counts tasks, threads included, so a
# training pod's bound is its processes times their threads. One pod takes a whole GPU node
# (ND96: 96 vCPUs, 8 GPUs): 8 ranks, each a trainer (about 64 threads: its OpenMP pool of
# 96/8 = 12, CUDA's and NCCL's helper threads, PyTorch's pin-memory and autograd threads), up to
# 12 data-loader worker processes (one per vCPU of its share) of up to 32 threads each (decoders,
# their own OpenMP pools) and torch.compile's up to 32 compile workers (inductor's compile_threads,
# min(32, CPUs)): 8 x (64 + 12 x 32 + 32) = 3,840 tasks. 32,768 is 8.5 times that: a job that
# hits it is a runaway, not a big job, where a limit too low would fail the job's fork() or
# clone() with EAGAIN. The node keeps its PIDs: kernel.pid_max is systemd's 4,194,304 on 64-bit
# (/usr/lib/sysctl.d/50-pid-max.conf, shipped by Debian bookworm's systemd 252, the node image's
# base), and POD_PIDS_LIMIT x maxPods must stay below it so that no set of pods at their limit
# exhausts the node (tests/security/test_pids.py checks every shipped pool: research-7500's
# largest maxPods, 24, is 786,432 PIDs).
POD_PIDS_LIMIT = 32768
# The tasks (processes and threads: the pids cgroup counts both) of one training rank, one per GPU,
# as estimated above: its trainer's 64 threads, 12 data-loader workers (its 96/8 vCPUs' share on an
# ND96) of up to 32 threads each, and torch.compile's up to 32 compile workers. A GPU pool's
# training pod takes all its GPUs, so its tasks are gpusPerNode x this; the kubelet's podPidsLimit
# must be at least that (preflight kubelet-config) or the pod's fork() and clone() fail with EAGAIN.
TRAINING_RANK_TASKS = 64 + 12 * 32 + 32  # 480
# the estimate for the 8-GPU node above: 3,840 tasks, which POD_PIDS_LIMIT is 8.5 times
TRAINING_POD_TASKS = 8 * TRAINING_RANK_TASKS
# kernel.pid_max where no sysctl (the profile or a stack's sysctl.overrides) sets it: systemd's
# sysctl.d/50-pid-max.conf ("2^22 ... is possible maximum of 64bit ... kernels"), which
# systemd-sysctl.service applies at every boot; also the kernel's PID_MAX_LIMIT on 64-bit
# (include/linux/threads.h: 4 * 1024 * 1024), so no setting can raise it.
KERNEL_PID_MAX = 4194304
