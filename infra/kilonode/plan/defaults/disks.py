"""OS disk sizes per role, and how the apiserver's audit log is sized to its disk.

Every OS disk is a Premium SSD whose tier is its size (kilonode.catalog.disks, Azure's table):
without `diskSizeGB` Azure makes it the image's size, 4 GiB, a P1 disk of 120 IOPS, whatever
the role writes. The sizes below leave the writers that stay on the OS disk (the journal, the
kubelet root with its emptyDirs, containerd's pod logs, the images' preloaded archives) room
and IOPS; what is hot (etcd's data, the runtime root, the audit log) is on the local SSD.
"""

# etcd members: the OS disk holds the OS and the journal; data and snapshots are on the local
# SSD. P10 (128 GiB, 500 IOPS) rather than P4 (32 GiB, 120 IOPS): a sustained journal at 120 IOPS
# stalls every unit that logs, etcd included, once the P1-P20 burst credits (30 min) run out.
ETCD_OS_DISK_GIB = 128
# apiservers: the same, their audit log on the local SSD (ControlPlanePlan.audit_log).
APISERVER_OS_DISK_GIB = 128
# CPU pools: the kubelet root (/var/lib/kubelet: emptyDirs, pod volumes) and, with containerd,
# /var/log/pods stay on the OS disk: P10.
POOL_OS_DISK_GIB = 128
# GPU pools: the same writers, with training jobs' emptyDirs and logs at 8 GPUs per node; a
# P20 (512 GiB, 2,300 IOPS) is small beside the VM's price and keeps the kubelet from evicting
# a job's pods for nodefs pressure (10% free).
GPU_POOL_OS_DISK_GIB = 512
# The monitoring pool (NodePoolConfig.monitoring): Prometheus' data was an emptyDir on the kubelet
# root, on this disk; it is now a disk of its own (kilonode.k8s.monitoring, a claim), still sized
# from this one (kilonode.plan.resolve.monitoring: 60%, rounded up to its tier). P30 (1,024 GiB,
# 5,000 IOPS): at research-7500 ~32 GiB a day, 15 days in 60% of it. Sizing the claim from the
# series and retention instead, and this disk back to a pool's, is not done.
MONITORING_POOL_OS_DISK_GIB = 1024

# The apiserver audit log, when the stack leaves its retention to the plan: as many
# maxSize files as this share of the apiserver's local disk holds (the rest stays free for
# anything else put there), never fewer than CIS 1.2.18's 10 backups.
AUDIT_DISK_SHARE = 0.5
AUDIT_MIN_BACKUPS = 10
AUDIT_DIR = "kubernetes/audit"  # below the apiserver's local-disk mount point

# How fast the audit log grows, for the arithmetic preflight shows (an estimate, not a
# measurement): a Metadata-level event (the audit policy, kilonode.render.control_plane) is
# about 1 KiB of JSON; each node makes about 0.3 audited requests per second at rest (the
# kubelet's lease renewal every 10 s, its node status check every 10 s, and the DaemonSets'
# watches and status writes); Events are not audited (policy level None). The requests spread
# over the apiservers behind the load balancer.
AUDIT_EVENT_BYTES = 1024
AUDIT_REQUESTS_PER_NODE_PER_S = 0.3
