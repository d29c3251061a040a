"""The exporters the cluster's Prometheus scrapes beside the kubelets (kilonode.k8s.exporters):
NVIDIA's dcgm-exporter on the GPU pools, node-exporter on every node, kube-state-metrics once.

What each is told to collect is chosen here, from what the alert rules (kilonode.render.monitoring
exporter_group) and the runbooks read, because at 7,500 nodes every per-node series is multiplied by
7,500 (the 7,500-node post's Prometheus ran out of memory until they dropped what they never looked
at). The series each adds per node are derived from these lists (kilonode.plan.resolve.monitoring
exporter_series), so Prometheus's memory and disk are sized for them.
"""

from __future__ import annotations

# --- dcgm-exporter ------------------------------------------------------------------------------
# The counters CSV (its -f file, DCGM_EXPORTER_COLLECTORS): DCGM field, Prometheus type, help, in
# the format of etc/default-counters.csv (NVIDIA/dcgm-exporter at 4.5.3-4.8.2, "DCGM FIELD,
# Prometheus metric type, help message"); each field's line there is named. The exporter emits each
# field as a series named after it, one per GPU (labels gpu, UUID, pci_bus_id, device, modelName,
# Hostname; pod, namespace, container while a pod holds the GPU).
DCGM_FIELDS: tuple[tuple[str, str, str], ...] = (
    # utilisation and memory: who uses the GPUs, for capacity (default-counters.csv l.23, l.45-46)
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %)."),
    ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB)."),
    ("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB)."),
    # the value of the last Xid, which KilonodeGpuXidError classes by NVIDIA's catalogue (l.29)
    ("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered."),
    # uncorrectable ECC since the driver loaded, and row remapping's outcome on A100/H100
    # (l.51 commented there, l.72, l.74)
    ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter", "Total number of double-bit volatile ECC errors."),
    ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter", "Number of remapped rows for uncorrectable errors"),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed"),
    # NVLink: bandwidth for the dashboards, and the error counters the NVLink alert reads, each the
    # sum over the GPU's links (l.61-65, the error counters commented there)
    ("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "counter", "Total number of NVLink bandwidth counters for all lanes."),
    ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "counter", "Total number of NVLink flow-control CRC errors."),
    ("DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", "counter", "Total number of NVLink data CRC errors."),
    ("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "counter", "Total number of NVLink retries."),
    ("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", "counter", "Total number of NVLink recovery errors."),
    # thermal: the temperature, and the time the GPU spent slowed for it (l.11, l.31 commented there)
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C)."),
    ("DCGM_FI_DEV_THERMAL_VIOLATION", "counter", "Throttling duration due to thermal constraints (in ns)."),
    # power draw, for the dashboards and the pool's power budget (l.14)
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W)."),
    # "a GPU node is slow" (research-7500's on-call trace): the SM clock, the time slowed to stay within
    # the power limit (KilonodeGpuPowerThrottling), and why the clocks are held down now, a bitmask of
    # DCGM's clock-event reasons (l.6; l.30 commented there; the field's current name, which the exporter
    # resolves through go-dcgm's GetFieldID: NVIDIA/go-dcgm ec245c09 pkg/dcgm/const_fields.go l.1331, 112, the
    # old DCGM_FI_DEV_CLOCK_THROTTLE_REASONS its legacy alias; the go.mod of dcgm-exporter 4.5.3-4.8.2 pins
    # that go-dcgm)
    ("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz)."),
    ("DCGM_FI_DEV_POWER_VIOLATION", "counter", "Throttling duration due to power constraints (in ns)."),
    ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "gauge", "Current clock event reasons (bitmask)."),
    # PCIe link retries (l.20: a marginal riser or slot) and rows remapped for correctable errors (l.73:
    # memory wearing, before the uncorrectable ones above)
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries."),
    ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter", "Number of remapped rows for correctable errors"),
    # the exporter's own Xid count (l.40 commented there): enabled by naming it in the counters file
    # (internal/pkg/collector/xid_collector.go IsDCGMExpXIDErrorsCountEnabled; pkg/cmd/app.go l.925-938 adds
    # DCGM_FI_DEV_XID_ERRORS to the watch), counted over --xid-count-window-size /
    # DCGM_EXPORTER_XID_COUNT_WINDOW_SIZE (app.go l.237-243, default 5 minutes). One series per GPU with value 0
    # and no `xid` label when none fell in the window, else one per Xid seen with labels xid and
    # window_size_in_ms (internal/pkg/collector/expcollector.go l.74-105): every Xid of the window, where
    # DCGM_FI_DEV_XID_ERRORS keeps only the last.
    ("DCGM_EXP_XID_ERRORS_COUNT", "counter", "Count of XID Errors within the window (xid-count-window-size)."),
)
# Not the profiling (DCP) fields, DCGM_FI_PROF_* (dcp-metrics-included.csv): DCGM's profiling module holds the
# GPUs' performance counters that CUPTI-based profilers need. NVIDIA's DCGM documentation, command-line
# reference "dcgmi profile": "--pause ... Pausing releases profiling resources so developer tools such as Nsight
# Compute or Nsight Systems can use them"; and its API reference "Profiling" (dcgmProfGetSupportedMetricGroups):
# groups that "utilize the same hardware resource" cannot be watched together. A user's Nsight run in a job would
# then fail or need an operator to pause DCGM on the node: on a shared research cluster the jobs' profilers come
# first, a documented choice (docs/monitoring.md, "The exporters").
# How often the exporter asks DCGM for the fields (its -c, DCGM_EXPORTER_INTERVAL, in ms; upstream's
# default 30000): the scrape interval of its job, so no reading is taken that no scrape collects.
# The plan's per-node interval (kilonode.plan.resolve.monitoring) sets it.

# --- node-exporter ------------------------------------------------------------------------------
# Only these collectors (--collector.disable-defaults, then --collector.<name>; node_exporter
# README.md at v1.12.1). Not `cpu`: node_cpu_seconds_total is one series per vCPU and mode (96
# vCPUs x 8 modes = 768 on an ND96 node, 5.8 million at 7,500 nodes: half of everything Prometheus
# held before the exporters); CPU saturation shows in `pressure` and `loadavg`, and the pods' CPU
# in cAdvisor's per-container series. `conntrack` (collector/conntrack_linux.go at v1.12.1 l.44: enabled by
# default, so off here until named, --collector.disable-defaults): the node's connection-tracking table, whose
# exhaustion drops new connections (a team's jobs "cannot reach the internet" while every pod looks healthy).
NODE_EXPORTER_COLLECTORS = ("meminfo", "loadavg", "pressure", "diskstats", "filesystem", "netdev", "infiniband",
                            "conntrack")
# Filters by the flags upstream gives each collector (README.md at v1.12.1, the include/exclude table):
NODE_EXPORTER_FLAGS: tuple[tuple[str, str], ...] = (
    # the kubelet's pod volumes and the runtimes' layers: one mount per pod volume or container
    # (collector/filesystem_linux.go l.36 excludes docker's and containers/storage's, not the kubelet's)
    ("collector.filesystem.mount-points-exclude",
     "^/(dev|proc|run|sys|var/lib/kubelet/.+|var/lib/docker/.+|var/lib/containerd/.+|host/.+)($|/)"),
    # the node's own NICs: eth0 and accelerated networking's VF; not the azv* interface of every pod
    # (Azure CNI) nor IPoIB's ib* (the InfiniBand collector counts the HCAs' traffic)
    ("collector.netdev.device-include", "^eth[0-9]+$"),
    # the eight HDR/NDR HCAs, under either naming: Azure's HPC images rename them mlx5_ib0..7 (their
    # azure_persistent_rdma_naming; Azure/azurehpc-health-checks conf/nd96isr_h100_v5.conf), while Debian's
    # rdma-core (44.0, kilonode's image: node-image/packages/infiniband.txt) names them by its udev rule
    # 60-rdma-persistent-naming.rules, `rdma_rename %k NAME_FALLBACK`: an InfiniBand link layer takes the
    # "ib" prefix with the onboard, slot or PCI path (ibo<n>, ibs<n>, ibp<bus>s<slot>, ibP<domain>p...;
    # rdma-core kernel-boot/rdma_rename.c), an Ethernet one "roce". The 40th issue's independent trace found
    # the mlx5_ib-only filter matched nothing on kilonode's own image. Not the accelerated-networking VF
    # (mlx5_an0, or roce...): Ethernet, no InfiniBand port to watch.
    ("collector.infiniband.device-include", "^(mlx5_ib[0-9]+|ib[osSpP][0-9].*)$"),
)
# What the scrape job keeps of each collector's series (metric_relabel_configs keep): what the rules
# and the runbooks read, and the capacity views; the rest is dropped before it is stored. Each name
# with what it counts per node (NODE_EXPORTER_PER: how many series one name makes on a node), so that
# the plan's series estimate (kilonode.plan.resolve.monitoring node_exporter_series) follows this list:
# a name kept is a name counted, and a per-CPU name (node_cpu_seconds_total: one series per vCPU and
# mode) is counted per vCPU (the 15th independent trace of kilonode diff added it as one series).
NODE_EXPORTER_KEPT: tuple[tuple[str, str], ...] = (
    ("node_memory_MemTotal_bytes", "node"), ("node_memory_MemAvailable_bytes", "node"),
    ("node_load1", "node"), ("node_load15", "node"),
    ("node_pressure_cpu_waiting_seconds_total", "node"), ("node_pressure_memory_stalled_seconds_total", "node"),
    ("node_pressure_io_stalled_seconds_total", "node"),
    ("node_disk_read_bytes_total", "disk"), ("node_disk_written_bytes_total", "disk"),
    ("node_disk_io_time_seconds_total", "disk"),
    ("node_filesystem_avail_bytes", "filesystem"), ("node_filesystem_size_bytes", "filesystem"),
    ("node_filesystem_readonly", "filesystem"),
    ("node_network_receive_bytes_total", "nic"), ("node_network_transmit_bytes_total", "nic"),
    ("node_network_receive_errs_total", "nic"), ("node_network_transmit_errs_total", "nic"),
    # packets the NIC or the kernel dropped (a full ring, no buffer: a node's egress "slow" while no error counts),
    # eth* only (the device filter): collector/netdev_common.go at v1.12.1 l.99 names each statistic
    # node_network_<key>_total, and its legacy() (without --collector.netdev.enable-detailed-metrics) renames
    # rtnetlink's receive_dropped (plus receive_missed_errors) and transmit_dropped to receive_drop and
    # transmit_drop; collector/netdev_linux.go l.169, l.177 reads them
    ("node_network_receive_drop_total", "nic"), ("node_network_transmit_drop_total", "nic"),
    # collector/infiniband_linux.go at v1.12.1 l.187-219
    ("node_infiniband_state_id", "ib_port"), ("node_infiniband_physical_state_id", "ib_port"),
    ("node_infiniband_link_downed_total", "ib_port"), ("node_infiniband_link_error_recovery_total", "ib_port"),
    ("node_infiniband_port_errors_received_total", "ib_port"), ("node_infiniband_symbol_error_total", "ib_port"),
    ("node_infiniband_port_data_received_bytes_total", "ib_port"),
    ("node_infiniband_port_data_transmitted_bytes_total", "ib_port"),
    # the port's signalling rate (l.189: procfs v0.21.1 sysfs/class_infiniband.go parseRate, Gb/s x 125,000,000,
    # so 400 Gb/s NDR is 5e10) against the VM size's (KilonodeInfinibandPortSlow), and the ticks the port had
    # data but could not send (l.214, PortXmitWait: congestion, a slow receiver)
    ("node_infiniband_rate_bytes_per_second", "ib_port"), ("node_infiniband_port_transmit_wait_total", "ib_port"),
    # the connection-tracking table: /proc/sys/net/netfilter/nf_conntrack_count and _max (conntrack_linux.go
    # at v1.12.1 l.48-56, l.108-120), and of /proc/net/stat/nf_conntrack, summed over the CPUs (l.157-176), the
    # new connections dropped for want of a slot (drop, early_drop) and inserts that failed (insert_failed: the
    # DNS-over-UDP race as well as a full table); one series each per node, in the host's network namespace
    # (the DaemonSet is host-network). Not found, invalid, ignore, insert, search_restart: no rule reads them.
    ("node_nf_conntrack_entries", "node"), ("node_nf_conntrack_entries_limit", "node"),
    ("node_nf_conntrack_stat_drop", "node"), ("node_nf_conntrack_stat_early_drop", "node"),
    ("node_nf_conntrack_stat_insert_failed", "node"),
    # whether each collector answered (node_exporter's own, per collector)
    ("node_scrape_collector_success", "collector"),
)
# Series one kept name makes on a node, by what it counts (ESTIMATES where devices vary): disks: the OS
# disk, the resource disk and up to 8 local NVMe (ND96asr_v4, ND96isr_H100_v5); filesystems: /,
# /boot/efi, the resource disk, the runtime's root; NICs: eth0 and the accelerated-networking VF;
# InfiniBand ports: one HCA per GPU on the InfiniBand GPU sizes, one port each (exact); per vCPU: the
# 8 modes of collector/cpu_linux.go (user, nice, system, idle, iowait, irq, softirq, steal).
NODE_EXPORTER_DISKS = 10
NODE_EXPORTER_FILESYSTEMS = 4
NODE_EXPORTER_NICS = 2
NODE_EXPORTER_CPU_MODES = 8
NODE_EXPORTER_USER = 65534  # the image's (Dockerfile at v1.12.1: USER nobody)
NODE_EXPORTER_ROOTFS = "/host"  # where the host's / is mounted (README.md "Docker": --path.rootfs)

# --- kube-state-metrics -------------------------------------------------------------------------
# --resources: what the rules read (kube_node_labels, _info, _spec_taint, _status_condition:
# kilonode.render.monitoring gpu_group), and the node data plane's DaemonSets and CoreDNS's Deployment
# (kube_daemonset_status_number_unavailable, kube_deployment_status_replicas_unavailable: internal/store/daemonset.go
# and deployment.go at v2.18.0), which research-7500's on-call trace found unwatched: a kube-proxy or calico-node
# pod missing on a node broke that node's Services or pod network with nothing saying so. Not pods: 25 series per
# pod, 1.5 million at research-7500's 60,000 pods, that no rule reads.
KSM_RESOURCES = ("nodes", "daemonsets", "deployments")
# The namespaced resources among them (API group apps) and the one namespace they are read in (--namespaces):
# kilonode's node agents and CoreDNS all run in kube-system (kilonode.k8s.proxy, calico, exporters, gpu, dns), and
# a team's own DaemonSets and Deployments elsewhere are not kube-state-metrics' to count (their series, and a list
# and watch of every namespace's workloads). With one namespace the builder makes one store per resource
# (internal/store/builder.go at v2.18.0 l.516-547: a store per namespace listed), the Node store included, whose
# list and watch ignore the namespace (internal/store/node.go l.523-531): so Nodes are still read once,
# cluster-wide. Two namespaces here would list every Node twice. RBAC follows: a Role in kube-system for these.
KSM_NAMESPACED_RESOURCES = ("daemonsets", "deployments")
KSM_NAMESPACED_GROUP = "apps"
KSM_NAMESPACE = "kube-system"
# Their series, per object (internal/store/daemonset.go at v2.18.0: created, status_current_number_scheduled,
# _desired_number_scheduled, _number_available, _number_misscheduled, _number_ready, _number_unavailable,
# _observed_generation, _updated_number_scheduled, metadata_generation; deletion_timestamp only while deleted,
# annotations and labels none without an allowlist for them: 10. deployment.go: owner (one, empty without an
# owner), created, status_replicas, _ready, _available, _unavailable, _updated, _terminating_replicas (when set),
# _observed_generation, status_condition (Available and Progressing x true/false/unknown: 6), spec_replicas,
# spec_paused, the rolling update's max_unavailable and max_surge, metadata_generation: 21), and how many kube-system
# holds (ESTIMATES: kilonode's research-7500 has 8 DaemonSets and 11 Deployments there; doubled for what an operator
# adds). A few hundred series in all: counted once in the plan's series estimate
# (kilonode.plan.resolve.monitoring series_terms). Their memory in kube-state-metrics' cache (a few dozen objects of
# some KiB each) is well inside upstream's 250 MiB base below: the formula is not changed for them.
KSM_SERIES_PER_DAEMONSET = 10
KSM_SERIES_PER_DEPLOYMENT = 21
KSM_DAEMONSETS = 16
KSM_DEPLOYMENTS = 24
# kube_node_labels carries a node's labels only when allowlisted (cli-arguments.md l.66): the pool.
# The team and the fabric too (kilonode.io/team, kilonode.io/fabric): one kube_node_labels series per node
# carries them, and a query joins any per-node series to it (`* on (node) group_left (label_kilonode_io_team)
# kube_node_labels`, docs/monitoring.md), cheaper than relabelling them onto every per-node job's series. Several
# keys per resource: cli-arguments.md at v2.18.0 l.65 ("namespaces=[k8s-label-1,k8s-label-n,...]").
KSM_LABELS_ALLOWLIST = "nodes=[kilonode.io/pool,kilonode.io/team,kilonode.io/fabric]"
KSM_USER = 65534  # examples/standard/deployment.yaml runAsUser
KSM_PORT = 8080  # --port's default (cli-arguments.md), named http-metrics in upstream's Service
KSM_TELEMETRY_PORT = 8081
# Its memory: upstream's general rule (README.md "Resource recommendation": 250MiB, 0.1 cores) plus,
# per Node it watches, an ESTIMATE: the decoded Node in the informer's cache (its status lists up to
# 50 images: ~20 KiB) and its ~40 rendered series (~8 KiB), doubled for Go's garbage collector.
KSM_BASE_MEMORY_MIB = 250
KSM_MEMORY_KIB_PER_NODE = 56
KSM_BASE_CPU_MILLIS = 100
# ... and a core per 10,000 nodes for the watch's churn (status updates every 10 s per node,
# the kubelet's nodeStatusUpdateFrequency): an estimate.
KSM_CPU_MILLIS_PER_1000_NODES = 100
