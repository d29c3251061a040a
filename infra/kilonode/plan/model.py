"""ClusterPlan: everything derived from a ClusterConfig, computed once by `resolve`.

Renderers, Pulumi components, the image build and the explain command read these values;
none of them re-derives an address, a count or a name.
"""

from __future__ import annotations

from ipaddress import IPv4Address, IPv4Network
from typing import Literal

from pydantic import Field, SerializerFunctionWrapHandler, model_serializer

from kilonode.catalog.limits import limits
from kilonode.config.model import (
    CONTROL_PLANE_IMAGE,
    ETCD_IMAGE,
    LocalDiskConfig,
    StrictModel,
)
from kilonode.plan.defaults.access import POOL_BOOTSTRAP_GROUP_PREFIX
from kilonode.plan.encryption import provider_keys
from kilonode.plan.wellknown import TEAM_LABEL, team_taint


class DiskTierPlan(StrictModel):
    """A Premium SSD tier (kilonode.catalog.disks, Azure's table), carried for preflight."""

    name: str
    size_gib: int
    iops: int
    mbps: int


class DisksPlan(StrictModel):
    """A role's disks as the plan decided them (kilonode.plan.resolve.disks): the managed OS disk
    (`diskSizeGB` of its VMs or scale sets) and the local SSD the VM size brings."""

    os_disk_gib: int
    os_disk_tier: str  # the Premium SSD tier that size is provisioned as (kilonode.catalog.disks)
    os_disk_iops: int
    # the VM size's local SSD (its temp disk, or its NVMe disks together; catalogue), None: the
    # size is not in the catalogue, or the stack names another device
    local_disk_gib: int | None
    # cloud-init's name for the local disk when it is Azure's temp disk ("ephemeral0": the Azure
    # datasource's disk alias), so that the render overrides its built-in disk config by that key;
    # None: another device, formatted as named
    local_disk_alias: str | None = None
    reason: str  # why this OS disk size, in one line (kilonode explain)


class AuditLogPlan(StrictModel):
    """The apiserver's audit log: where (on the local SSD, unless the stack says otherwise) and
    how many files, sized to that disk (kilonode.plan.resolve.disks)."""

    path: str
    max_age_days: int
    max_backup: int
    max_size_mb: int
    reason: str


class EtcdMember(StrictModel):
    name: str  # etcd --name, and the host directory: etcd-main-0
    vm_name: str  # Azure VM name: <cluster>-etcd-main-0
    index: int
    ip: IPv4Address
    zone: str
    vm_size: str  # the cluster's vmSize, or the member's vmSizeOverrides entry (a rolling resize)
    client_url: str
    peer_url: str
    metrics_url: str


class EtcdClusterPlan(StrictModel):
    role: Literal["main", "events", "leases"]
    token: str  # --initial-cluster-token: distinct per cluster so members never cross-join
    members: tuple[EtcdMember, ...]
    initial_cluster: str
    client_endpoints: tuple[str, ...]
    quota_backend_bytes: int
    # etcd's cost of the largest write it accepts (its default --max-request-bytes, which kilonode
    # keeps, plus the per-key overhead its quota counts): a member within this of its quota may
    # raise NOSPACE on the next write (kilonode.render.monitoring KilonodeEtcdNoSpace)
    largest_write_bytes: int
    auto_compaction_retention: str
    snapshot_count: int
    vm_size: str
    local_disk: LocalDiskConfig
    disks: DisksPlan
    data_dir: str


class ApiserverInstance(StrictModel):
    name: str  # apiserver-0
    vm_name: str
    index: int
    ip: IPv4Address
    zone: str


class ControlPlanePlan(StrictModel):
    instances: tuple[ApiserverInstance, ...]
    load_balancer_ip: IPv4Address
    endpoint: str  # https://<lb>:6443, what kubelets and clients use
    etcd_servers: str  # --etcd-servers (main)
    # /events#https://...;https://... and, with the leases cluster,
    # ,coordination.k8s.io/leases#https://...;https://...
    etcd_servers_overrides: str
    service_cidr: IPv4Network
    kubernetes_service_ip: IPv4Address
    cluster_dns_ip: IPv4Address
    audit_log: AuditLogPlan
    vm_size: str
    local_disk: LocalDiskConfig
    disks: DisksPlan


class ScaleSetShard(StrictModel):
    name: str  # <cluster>-<pool>-000
    index: int
    capacity: int
    zone: str
    single_placement_group: bool
    # the team whose nodes these are (kilonode.plan.capacity), None: shared capacity
    team: str | None = None


class NodeGroup(StrictModel):
    """One cluster-autoscaler node group: a shard's scale set with its bounds (--nodes)."""

    shard: str  # the scale set's name
    min_size: int
    max_size: int


class AutoscalingPlan(StrictModel):
    """The autoscaler on one pool (kilonode.plan.capacity): the shared shards are its node
    groups; the teams' shards keep their planned capacity and are not handed to it."""

    min_nodes: int  # the pool's floor, teams' shards included (>= half of nodes)
    max_nodes: int  # the pool's ceiling (maxNodes, bounded by its scale sets' limits)
    warm_nodes: int  # balloon placeholders, one whole node each
    # what each placeholder requests so that it takes a whole node: every GPU of a GPU node,
    # else all but one vCPU (the DaemonSets' share)
    balloon_requests: dict[str, str]
    node_groups: tuple[NodeGroup, ...]
    reason: str  # how the bounds were derived, in one line (kilonode explain)


class PreloadImage(StrictModel):
    image: str
    # "build:pause": built by the node-image recipe; "archive": a user-supplied docker
    # archive at `archive`; "pull": pulled at build time where a registry is reachable.
    source: Literal["build:pause", "archive", "pull"]
    archive: str | None = None
    # Where the node image bakes the archive; the boot-time loader reads it from here.
    baked_path: str
    # The image ID the archive must hold (a bootImageArchives entry's imageId): the build refuses another.
    image_id: str | None = None


class SysctlSetting(StrictModel):
    name: str
    value: int | str
    reason: str


class LocalStoragePlan(StrictModel):
    """A pool's local disk as the plan decided it from the VM size (resolve._local_storage)."""

    # "nvme-raid0": the size's local NVMe disks as one RAID 0 array; "nvme": its only NVMe
    # disk; both made and mounted by kilonode-local-disk.service at every boot. "device": one
    # named block device (Azure's temp disk by default) that cloud-init formats and mounts.
    kind: Literal["nvme-raid0", "nvme", "device"]
    mount_point: str
    filesystem: Literal["ext4", "xfs"]
    device: str | None  # kind "device" only
    # kind "nvme*": the NVMe controllers' model strings that select the disks, and how many
    # there must be: fewer, or more, and the node refuses rather than guess
    nvme_models: tuple[str, ...] = ()
    nvme_count: int = 0
    reason: str  # why, in one line (kilonode explain)


class InfinibandLinksPlan(StrictModel):
    """A VM size's InfiniBand links as its catalogue row states them (kilonode.catalog.vm
    InfinibandLinks): `count` HCAs of one port each, each at `gbps` (the signalling rate sysfs
    shows as `<gbps> Gb/sec (4X NDR)`)."""

    count: int
    gbps: int


class NodePoolPlan(StrictModel):
    name: str
    nodes: int
    # the pool's kubelet and node binaries' Kubernetes version: nodePools[].kubernetesVersion, else the
    # stack's (a minor upgrade moves the control plane first, then each pool through its own image)
    kubernetes_version: str = ""
    runtime: Literal["docker", "containerd"]
    infiniband: bool
    vm_size: str
    gpus_per_node: int
    # the size catalogue's GPU model (None: not in the catalogue, or no GPUs); the GPU health
    # agent reports it beside what nvidia-smi names
    gpu_model: str | None = None
    # the NCCL topology family Azure publishes for the size (catalogue `ncclTopology`) on an
    # InfiniBand pool: the image carries /opt/microsoft/<family>/topo.xml and /etc/nccl.conf
    nccl_topology: str | None = None
    # the size's GPUs are joined by NVSwitch (catalogue `nvswitch`): the image enables NVIDIA
    # Fabric Manager, without which CUDA cannot initialise there
    nvswitch: bool = False
    # the size's InfiniBand links (catalogue infinibandLinks: one port each, its rate), on an
    # InfiniBand pool whose size records them: the GPU health agent keeps a node out until that
    # many ports are active at that rate (kilonode.render.pool.gpu_health_config)
    infiniband_links: InfinibandLinksPlan | None = None
    # those links together, in Gb/s (count x rate): the ceiling of a two-node NCCL gang
    # (kilonode.k8s.nccl_job)
    infiniband_gbps: int | None = None
    # the size's vCPUs and memory (catalogue; None for a size not in it): the autoscaler's ceilings
    vcpus: int | None = None
    memory_gib: float | None = None
    subnet: IPv4Network
    pods_per_node: int
    ip_configs_per_nic: int  # 1 primary + pods_per_node secondary
    max_pods: int  # pods_per_node + kilonode's DaemonSet pods + host_network_pods (pools.max_pods)
    host_network_pods: int = 0  # the stack's own hostNetwork pods per node (NodePoolConfig.host_network_pods)
    max_vms_per_scale_set: int
    shards: tuple[ScaleSetShard, ...]
    local_disk: LocalDiskConfig
    local_storage: LocalStoragePlan
    disks: DisksPlan
    runtime_root: str
    max_concurrent_downloads: int
    max_parallel_image_pulls: int
    image_pull_progress_deadline: str
    pause_image: str
    preload_images: tuple[PreloadImage, ...]
    # Images the cluster needs on every node at boot that the stack gave no archive for: the
    # node pulls them at first start (the image manifest records them as not supplied).
    boot_images_not_preloaded: tuple[str, ...] = ()
    sysctls: tuple[SysctlSetting, ...]
    labels: dict[str, str]
    taints: tuple[str, ...]
    # a system pool (NodePoolConfig.system): labelled kilonode.io/system=true, preferred by
    # the cluster's own workloads
    system: bool = False
    # the pool the stack names for the cluster's Prometheus (NodePoolConfig.monitoring)
    monitoring: bool = False
    # the kubelet's resolvConf: the file whose nameservers dnsPolicy Default and hostNetwork
    # pods get (kilonode.plan.defaults.node), and why
    resolv_conf: str
    resolv_conf_reason: str
    autoscaling: AutoscalingPlan | None = None
    # What the pool's image carries beyond its runtime's base, decided here once for the image
    # build, the Pulumi program, the review and preflight: the recipe's extras (node-image/
    # recipe.toml [extras.*]: GPU software where the size has GPUs, the RDMA user space and its
    # kernel where it has InfiniBand) and the binaries.toml roles it takes (its runtime's, and
    # its NCCL topology family's).
    image_extras: tuple[Literal["gpu", "infiniband"], ...] = ()
    binary_roles: tuple[str, ...] = ()

    def registration(self, team: str | None) -> NodePoolPlan:
        """The pool as a team's shards register: the team's label and taint added to the
        kubelet's --node-labels and registerWithTaints (kilonode.plan.capacity)."""
        if team is None:
            return self
        return self.model_copy(update={
            "labels": {**self.labels, TEAM_LABEL: team},
            "taints": (*self.taints, team_taint(team)),
        })

    def role(self, team: str | None = None) -> str:
        """The pool's host role: pool-<name> for its shared scale sets (and its image), and
        pool-<name>.team-<team> for a team's, which differ only in how their nodes register.
        Names its rendered directory and its scale sets' kilonode-role tag."""
        return f"pool-{self.name}" if team is None else f"pool-{self.name}.team-{team}"

    @property
    def teams(self) -> tuple[str, ...]:
        """The teams with shards in this pool, in shard order."""
        return tuple(dict.fromkeys(s.team for s in self.shards if s.team is not None))

    @property
    def largest_scale_set(self) -> int:
        """The most nodes one of the pool's scale sets can hold: its planned capacity, or the
        autoscaler's ceiling for the shards it grows. On an InfiniBand pool, the largest gang
        one fabric can take (RDMA reaches only the VMs of one scale set)."""
        grown = [g.max_size for g in self.autoscaling.node_groups] if self.autoscaling else []
        return max([s.capacity for s in self.shards] + grown)


class TeamPlan(StrictModel):
    """A team's reserved capacity: a contiguous run of whole shards of one pool."""

    name: str
    pool: str
    requested: int  # the stack's nodes
    first_shard: int
    shards: tuple[str, ...]
    nodes: int  # what the shards hold: requested rounded up to whole scale sets
    recorded: bool  # first_shard comes from the stack file (kilonode allocate), not placed by the plan
    field: str  # the stack field that records it: teams[1].firstShard


class Budget(StrictModel):
    """A quantity checked against a limit; headroom = limit - used."""

    name: str
    used: int
    limit: int
    source: str
    hard: bool  # a hard limit is an error when exceeded; a soft one is a warning

    @property
    def headroom(self) -> int:
        return self.limit - self.used


class UnrecordedSubnet(StrictModel):
    """A subnet the plan placed because the stack file does not record it (yet)."""

    field: str  # the stack field that records it: network.etcdSubnet, nodePools[2].subnet
    subnet: IPv4Network


class NatGatewayPlan(StrictModel):
    """One NAT gateway and its public IP prefix: the way out of the subnets it serves."""

    name: str  # control-plane, or pool-<name>: also its subnets' key
    subnets: tuple[str, ...]  # subnet keys it is attached to (control-plane, etcd, pool-<name>)
    prefix_length: int  # the public IP prefix: /31 = 2 addresses ... /28 = 16
    nodes: int  # machines behind it, sized for the pool's declared room (maxNodes)
    min_ports_per_node: int  # the stack's floor

    @property
    def public_ips(self) -> int:
        return 2 ** (32 - self.prefix_length)

    @property
    def ports_per_node(self) -> int:
        return self.public_ips * limits().azure.snat_ports_per_ip.value // max(self.nodes, 1)


class DeployerPlan(StrictModel):
    """Where `pulumi up` runs (the stack's `deployer`), and so which apiserver frontend its
    Kubernetes provider and readiness check use."""

    network: Literal["internet", "peered"]
    cidrs: tuple[IPv4Network, ...]
    vnet_id: str | None  # peered: the runner's VNet (resource ID)

    @property
    def public_frontend(self) -> bool:
        """The apiservers get a public load balancer admitting `cidrs`: the deployer has no other way in."""
        return self.network == "internet"


class NetworkPlan(StrictModel):
    vnet_cidr: IPv4Network
    control_plane_subnet: IPv4Network
    etcd_subnet: IPv4Network
    apiserver_allowed_cidrs: tuple[IPv4Network, ...]
    admin_cidr: IPv4Network | None
    public_ips_on_control_plane: bool
    # None: the stack does not say where `pulumi up` runs; preflight's deployer-path refuses it
    deployer: DeployerPlan | None = None
    # Placed by this plan, not recorded in the stack: `kilonode allocate` records them, and
    # the Pulumi program refuses to create them until then (they could move otherwise).
    unrecorded: tuple[UnrecordedSubnet, ...] = ()
    # Outbound: one NAT gateway per pool subnet, one for the control-plane and etcd subnets.
    nat_gateways: tuple[NatGatewayPlan, ...] = ()


class AwaitsPlan(StrictModel):
    """How long `pulumi up` waits for an in-cluster workload it waits for (the `customTimeouts`
    of the Deployments and the DNS Service; kilonode.plan.defaults.awaits): decided by
    kilonode.plan.resolve.components.awaits_plan. DaemonSets over pool nodes and the balloons
    are not waited for at all (`pulumi.com/skipAwait`, kilonode.k8s.pods)."""

    create_min: int  # a first run: the nodes are still on their way
    update_min: int  # a later run: a rolling update of the largest one-at-a-time Deployment
    reason: str  # how, in one line (kilonode explain)


class JoinPlan(StrictModel):
    """How fast nodes may join (kilonode.plan.resolve.joins): what the apiservers are sized for,
    and the waves of scale sets a `pulumi up` starts one after the other, paced by timers, so
    that nodes join no faster than that (kilonode.azure.join_waves, kilonode.azure.cluster)."""

    # nodes per minute the levels a join lands in serve, with one apiserver down, at the
    # share of their seats joins may take (kilonode.plan.defaults.joins)
    sized_for_per_min: int
    wave_nodes: int  # the most nodes one wave may boot at once: one interval's worth of that rate
    # scale-set shard names, wave by wave; the first holds the pools the cluster's own workloads
    # run on, so `pulumi up`'s awaits (components.awaits) need no later wave (preflight's scheduling)
    waves: tuple[tuple[str, ...], ...]
    # shards of more nodes than wave_nodes (a scale set cannot be split without moving its
    # name): each boots alone, as its own wave
    over_bound: tuple[str, ...] = ()
    # one per wave after the first: how long after the wave before it may start (its timer's
    # sleep): one interval (kilonode.plan.defaults.JOIN_WAVE_INTERVAL_S) per wave_nodes the wave
    # before holds, so a wave over the bound holds the next one back for as long as its nodes take
    wave_gaps_s: tuple[int, ...] = ()
    # a wave also waits until the wave this many before it is created: at most this many waves'
    # scale sets are being created at once, whatever Azure's creation time
    in_flight_waves: int
    admitted_per_min: int  # the most nodes one wave starts per minute until the next may start
    bring_up_min: int  # a first `pulumi up`: every wave created, the last one's nodes Ready
    reason: str  # the arithmetic, in one line (kilonode explain)


class SeriesTerm(StrictModel):
    """One line of the Prometheus series estimate: targets x series per target."""

    what: str
    targets: int
    per_target: int
    interval_s: int  # the job's scrape interval

    @property
    def series(self) -> int:
        return self.targets * self.per_target


class PrometheusPlan(StrictModel):
    """The cluster's Prometheus (kilonode.k8s.monitoring, kilonode.plan.resolve.monitoring):
    where it runs, what it is estimated to hold, and every flag sized from that."""

    pool: str  # the pool it runs on (nodeSelector kilonode.io/pool)
    pool_taints: tuple[str, ...]  # that pool's taints, each tolerated
    vm_size: str
    why_pool: str
    terms: tuple[SeriesTerm, ...]
    series: int
    samples_per_s: int
    head_bytes_per_series: int  # cardinality + ingestion at the per-node interval
    head_bytes: int
    per_node_interval_s: int
    control_plane_interval_s: int
    cpus: int  # request = limit = GOMAXPROCS
    memory_gib: int  # request = limit
    query_timeout: str
    query_max_concurrency: int
    query_max_samples: int
    query_bytes: int  # concurrency x samples x bytes per sample
    disk_gib: int  # the disk the TSDB is sized for (retention.size is a share of it)
    retention_size_gib: int
    retention_days: int
    daily_bytes: int
    # its PersistentVolumeClaim (kilonode.k8s.monitoring): disk_gib rounded up to its Premium SSD tier
    volume_gib: int
    volume_tier: str
    wal_compression: bool = True


class DnsAutoscalePlan(StrictModel):
    """How CoreDNS's replicas follow the nodes it may run on (kilonode.k8s.dns): the
    cluster-proportional-autoscaler's linear parameters, decided once here. It counts only the
    Ready nodes `node_selector` matches, those CoreDNS may be scheduled on, so that its required
    one-per-node anti-affinity can always be met by nodes that exist: on a first `pulumi up` the
    replicas grow as those nodes join instead of waiting for nodes of a later wave."""

    # a Kubernetes label selector (the autoscaler's --nodelabels): nodes of these pools without a
    # team, where CoreDNS's tolerations admit it
    node_selector: str
    eligible_nodes: int  # how many such nodes the cluster may reach (pools at their ceiling)
    nodes_per_replica: float  # eligible nodes per replica: `replicas` of them at the ceiling
    min_replicas: int
    max_replicas: int  # the plan's dns_replicas: one per DNS_NODES_PER_REPLICA nodes of the cluster


class MetricsServerPlan(StrictModel):
    """metrics-server (kilonode.k8s.metrics_server): its replicas, and its requests sized by
    upstream's figures (catalogue limits, metricsServer) for the nodes the cluster may reach."""

    replicas: int
    nodes: int  # the nodes the cluster may reach (pools at their ceiling): what it scrapes
    cpu_millis: int
    memory_mib: int
    resolution_s: int  # --metric-resolution: how often it scrapes every kubelet
    # None, or why the cluster is past what upstream says metrics-server supports (shown by
    # `kilonode explain`)
    past_supported: str | None = None


class NetworkPolicyPlan(StrictModel):
    """The NetworkPolicy engine (kilonode.k8s.calico): Typha's replicas for the nodes the cluster
    may reach, by the Tigera operator's rule (catalogue limits, calicoTypha)."""

    nodes: int  # the nodes the cluster may reach (pools at their ceiling)
    typha_replicas: int
    rule: str  # how typha_replicas follows from nodes, for `kilonode explain`


class ControllerClientsPlan(StrictModel):
    """The control plane's own API clients, sized for the joins (kilonode.plan.resolve.clients): every joining
    node's DaemonSet pods are created by kube-controller-manager's DaemonSet controller and bound by
    kube-scheduler, each at its client's rate."""

    daemonset_pods_per_node: int  # the most of kilonode's DaemonSets any pool's node runs
    daemonset_pods: int  # every node's DaemonSet pods, the cluster at its ceiling
    daemonset_pods_per_s: float  # at the rate the apiservers are sized to admit joins (joins.sized_for_per_min)
    controller_manager_qps: int  # --kube-api-qps
    controller_manager_burst: int  # --kube-api-burst
    scheduler_qps: int  # KubeSchedulerConfiguration clientConnection.qps
    scheduler_burst: int
    # upstream's defaults where a unit or file sets none (catalogue limits.yaml kubernetes.*Qps): what a
    # component reads when its flag is absent (preflight's controller-clients)
    controller_manager_qps_default: int
    scheduler_qps_default: int
    fill_min: int  # minutes the DaemonSet controller takes to create every node's pods at its QPS
    default_fill_min: int  # ... at upstream's default QPS
    reason: str  # the arithmetic, in one line (kilonode explain)


class ComponentsPlan(StrictModel):
    """What the cluster's components run, decided once: releases and image references for the
    stack's Kubernetes minor (from the catalogue), and the numbers derived from the plan's size.
    The renderers and the in-cluster modules read these; none looks a release up itself."""

    kubernetes_minor: int  # parsed once, here
    kube_proxy_image: str
    coredns_image: str
    prometheus_image: str  # the cluster's Prometheus (kilonode.k8s.monitoring)
    grafana_image: str  # Grafana beside it, the dashboards (kilonode.k8s.grafana)
    alertmanager_image: str  # Alertmanager beside it, the receivers (kilonode.k8s.alertmanager)
    # the exporters it scrapes (kilonode.k8s.exporters): GPU pools, every node, one Deployment
    dcgm_exporter_image: str
    node_exporter_image: str
    kube_state_metrics_image: str
    serving_cert_approver_image: str
    cloud_provider_azure_version: str
    cloud_controller_manager_image: str
    cloud_node_manager_image: str
    scheduler_plugins_version: str
    # why this minor runs another minor's scheduler-plugins release (None: its own)
    scheduler_plugins_skew: str | None = None
    scheduler_plugins_scheduler_image: str
    scheduler_plugins_controller_image: str
    cluster_autoscaler_version: str
    cluster_autoscaler_image: str
    device_plugin_image: str
    rdma_device_plugin_image: str  # InfiniBand pools: rdma/ib for pods (kilonode.k8s.rdma)
    azure_disk_csi_version: str  # Azure Disk CSI (kilonode.k8s.storage)
    azure_disk_csi_images: dict[str, str]  # its images by role (catalogue components.yaml azureDiskCsi)
    # the image of the NCCL all-reduce job kilonode generates (kilonode.k8s.nccl_job); no node
    # runs it at boot, so it is in no preload list
    nccl_benchmark_image: str
    cni_version: str  # the Azure CNI conflist's cniVersion
    # upstream's suggested API Priority and Fairness levels and their shares
    apf_builtin_shares: dict[str, int]
    # --max-requests-inflight / --max-mutating-requests-inflight of each apiserver
    apiserver_max_requests_inflight: int
    apiserver_max_mutating_requests_inflight: int
    dns_replicas: int  # CoreDNS replicas for the nodes the cluster may reach
    dns_autoscaler_image: str
    dns_autoscale: DnsAutoscalePlan
    metrics_server_image: str
    metrics_server: MetricsServerPlan
    calico_node_image: str  # calico/node: Felix on every node (kilonode.k8s.calico)
    calico_typha_image: str  # calico/typha: the apiserver's watches, fanned out to the Felixes
    network_policy: NetworkPolicyPlan
    awaits: AwaitsPlan
    joins: JoinPlan  # how fast nodes may join, and the waves of scale sets that bound it


class VmSizeFacts(StrictModel):
    """What the quota check needs of a VM size (catalogue; None: the size is not in it)."""

    vcpus: int | None
    quota_family: str | None  # Azure's vCPU quota family (Compute Usage API name.value)
    # whether the size supports encryption at host (catalogue); None: no first-party source says
    encryption_at_host: bool | None = None


class VcpuNeed(StrictModel):
    """The vCPUs of one Azure quota family the stack's machines take at the size it may reach
    (every pool at maxNodes), per subscription and region (kilonode.plan.resolve.quota)."""

    # the Compute Usage API's name.value; "cores" is Total Regional vCPUs; a size the catalogue
    # does not know is "<size> (family unknown)", with 0 vCPUs
    family: str
    machines: int
    vcpus: int


class JoinTokenPlan(StrictModel):
    """One registration group's join (bootstrap) token of one generation: a pool's shared shards,
    or one team's shards of it (kilonode.plan.resolve.join_tokens)."""

    pool: str
    generation: int
    # RFC 3339, UTC (the token Secret's `expiration`); None: the stack sets no expiry
    expires: str | None
    # the generation in the pool's custom data (else: the previous one, valid while it drains)
    current: bool
    # the group's scale-set computerNamePrefixes: the names its token may get a certificate for
    prefixes: tuple[str, ...]
    # the team whose shards these are; None: the pool's shared shards. A token per team: root on one
    # node reads its group's token from the custom data, and with a pool-wide token could register
    # a Node under another team's unused name and receive that team's pods (independent trace of
    # issue 37, round 5, finding 2)
    team: str | None = None

    @property
    def registration(self) -> str:
        """The registration group's name in the approver's table: the pool, or <pool>:team:<team>."""
        return self.pool if self.team is None else f"{self.pool}:team:{self.team}"

    @property
    def group(self) -> str:
        """The token's extra group (cluster-bootstrap auth-extra-groups), one per registration group
        (BootstrapGroupPattern: [a-z0-9:-], which pool and team names keep to)."""
        return f"{POOL_BOOTSTRAP_GROUP_PREFIX}{self.registration}"


class BootImage(StrictModel):
    """One disk image the cluster's machines boot: a pool's (named after the pool) or a
    control-plane role's (etcd, control-plane). Its gallery image definition has this name."""

    name: str
    version: str  # its gallery version (stack: nodeImage.version, etcdImage.version, ...)
    replicas: int  # gallery replicas of that version
    role: bool  # a control-plane role's image (`kilonode image build --role NAME`), else a pool's
    # the version before it, kept published beside it (nodeImage.previous, ...): the rollback target
    # and the image of every machine not rolled yet; never uploaded again (kilonode.azure.node_image)
    previous: str | None = None

    @property
    def versions(self) -> tuple[str, ...]:
        """Every version of this image the gallery keeps: the one machines boot, then the one before."""
        return (self.version,) if self.previous is None else (self.version, self.previous)


class AlertingPlan(StrictModel):
    """Where the cluster's Alertmanager sends alerts (ClusterConfig.alerting; kilonode.render.alertmanager):
    which receivers exist, never their secrets (Pulumi secret config, read by the program)."""

    pager_duty: bool = False  # critical alerts page PagerDuty (routing key: a Pulumi secret)
    pager_duty_warnings: bool = False  # warnings to PagerDuty too, as severity `warning` (low urgency)
    webhook_url: str | None = None  # every alert POSTed here
    webhook_bearer_token: bool = False  # with a bearer token (a Pulumi secret)
    heartbeat_url: str | None = None  # KilonodeWatchdog POSTed here every 5 minutes (a dead man's switch)
    azure_alert_emails: tuple[str, ...] = ()  # Azure Monitor's own alerts (the NAT gateways') e-mailed here

    @property
    def pages(self) -> bool:
        """Whether a critical alert reaches anything at all."""
        return self.pager_duty or self.webhook_url is not None


class EgressAlertPlan(StrictModel):
    """One Azure Monitor metric alert every NAT gateway gets (kilonode.azure.egress_alerts): a row of
    the catalogue's nat_gateway_alerts.yaml, each number there with Microsoft's source."""

    key: str  # the rule's name is <cluster>-<gateway>-nat-<key>
    metric: str
    namespace: str  # the metric namespace (Microsoft.Network/natGateways)
    aggregation: str
    dimension: str | None = None
    dimension_values: tuple[str, ...] = ()
    operator: str
    threshold: float
    window: str  # ISO 8601
    frequency: str  # ISO 8601
    severity: int
    summary: str


class ClusterPlan(StrictModel):
    cluster: str
    location: str
    zones: tuple[str, ...]
    kubernetes_version: str
    # --emulated-version of the control-plane programs (ClusterConfig.control_plane_emulated_version);
    # None: unset, and not written (plan.yaml as before the field existed)
    control_plane_emulated_version: str | None = None
    network: NetworkPlan
    etcd_main: EtcdClusterPlan
    etcd_events: EtcdClusterPlan
    # every Lease (coordination.k8s.io/leases), where the stack has etcd.leases; None: in main
    etcd_leases: EtcdClusterPlan | None = None
    control_plane: ControlPlanePlan
    node_pools: tuple[NodePoolPlan, ...]
    gallery_replicas: int
    node_image_version: str  # the Compute Gallery image version every pool's scale sets use but those below
    # the stack armed for `pulumi destroy` (ClusterConfig.teardown): etcd VMs unprotected
    teardown: bool = False
    # pool -> its own version (nodeImage.pools: a canary pool)
    pool_image_versions: dict[str, str] = Field(default_factory=dict)
    # image name -> the version before its current one, kept published (the rollback target)
    image_previous: dict[str, str] = Field(default_factory=dict)
    # gallery versions of the role images (`kilonode image build --role`): etcd members', apiservers'
    etcd_image_version: str
    control_plane_image_version: str
    role_image_replicas: int  # gallery replicas of each role image version
    # control-plane groups the next `pulumi up` may restart all at once (kilonode.azure.rollout)
    acknowledge_restart: tuple[str, ...] = ()
    # control-plane host -> its certificate renewal generation (kilonode.plan.pki); absent: 0
    certificate_generations: dict[str, int] = Field(default_factory=dict)
    # the exported admin credential's generation: its group and key (kilonode.plan.pki.cluster_admins_group)
    admin_generation: int = 0
    # every pool's join tokens, the current generation first (kilonode.plan.resolve.join_tokens)
    join_tokens: tuple[JoinTokenPlan, ...] = ()
    teams: tuple[TeamPlan, ...] = ()
    budgets: tuple[Budget, ...]
    warnings: tuple[str, ...]
    components: ComponentsPlan
    # kube-controller-manager's and kube-scheduler's client rates, sized for components.joins
    controller_clients: ControllerClientsPlan
    # the cluster's Prometheus; None where no pool can take it (the plan warns)
    prometheus: PrometheusPlan | None = None
    # where Alertmanager sends alerts; None: no receiver (it runs, shows alerts, sends nothing)
    alerting: AlertingPlan | None = None
    # the Azure Monitor metric alerts every NAT gateway gets (kilonode.azure.egress_alerts)
    egress_alerts: tuple[EgressAlertPlan, ...] = ()
    # every VM size the plan's machines use -> its vCPUs and quota family (preflight's quota)
    vm_sizes: dict[str, VmSizeFacts] = Field(default_factory=dict)
    # the vCPU quota the subscription needs per family, and the region's total ("cores") last
    vcpu_quota: tuple[VcpuNeed, ...] = ()
    # Azure's Premium SSD tiers, smallest first: what preflight sizes any OS disk of the graph by
    disk_tiers: tuple[DiskTierPlan, ...] = ()
    # machine role (etcd-main, etcd-events, etcd-leases, apiservers, a pool's name) -> the operators' SSH keys the
    # stack gives it; a role not here gets a generated key whose private half nothing exports
    ssh_keys: dict[str, tuple[str, ...]] = Field(default_factory=dict)
    # what encrypts Secrets at rest, without the key (kilonode.plan.encryption.provider_keys):
    # "<provider>:<key name>" in the apiservers' order, the first one writing
    secrets_encryption: tuple[str, ...] = Field(default_factory=provider_keys)

    def encryption_at_host(self, vm_size: str) -> bool:
        """Whether the machines of this size get encryption at host: unless the catalogue says
        the size lacks it. Unknown sizes get it too: Azure then refuses an unsupported size at
        creation, loudly, where leaving it off would leave the disks' host cache unencrypted
        silently (preflight's encryption-at-host warns of each unknown size)."""
        facts = self.vm_sizes.get(vm_size)
        return facts is None or facts.encryption_at_host is not False

    @model_serializer(mode="wrap")
    def _absent_leases_unwritten(self, handler: SerializerFunctionWrapHandler) -> dict[str, object]:
        # a plan without the leases cluster dumps as it did before the field existed (plan.yaml,
        # and what `kilonode diff` compares)
        data: dict[str, object] = handler(self)
        if self.etcd_leases is None:
            data.pop("etcdLeases", None)
            data.pop("etcd_leases", None)
        if self.control_plane_emulated_version is None:
            data.pop("controlPlaneEmulatedVersion", None)
            data.pop("control_plane_emulated_version", None)
        return data

    @property
    def etcd_clusters(self) -> tuple[EtcdClusterPlan, ...]:
        """Every etcd cluster: main, events, then leases where the stack has it."""
        return (self.etcd_main, self.etcd_events, *((self.etcd_leases,) if self.etcd_leases else ()))

    @property
    def kubernetes_minor(self) -> int:
        return self.components.kubernetes_minor

    @property
    def total_nodes(self) -> int:
        return sum(pool.nodes for pool in self.node_pools)

    @property
    def most_nodes(self) -> int:
        """The nodes the cluster may reach: autoscaled pools at their ceiling. What the
        control plane is sized for (apiserver concurrency, DNS replicas)."""
        return sum(pool.autoscaling.max_nodes if pool.autoscaling else pool.nodes for pool in self.node_pools)

    @property
    def autoscaled_pools(self) -> tuple[NodePoolPlan, ...]:
        return tuple(pool for pool in self.node_pools if pool.autoscaling is not None)

    @property
    def system_pools(self) -> tuple[NodePoolPlan, ...]:
        """Pools the stack marks as system pools (NodePoolConfig.system)."""
        return tuple(pool for pool in self.node_pools if pool.system)

    @property
    def controller_pools(self) -> tuple[NodePoolPlan, ...]:
        """Where the controllers that act on Azure run (cloud-controller-manager, the cluster
        autoscaler) and so the only scale sets that carry their identities: the system pools,
        or, in a stack without one, the pools with untainted shared nodes (the ones those
        controllers can land on at bootstrap; resolve refuses a stack with neither). A GPU
        pool's nodes carry no identity where a system pool exists (kilonode.azure.identity)."""
        if self.system_pools:
            return self.system_pools
        return tuple(pool for pool in self.node_pools
                     if not pool.taints and any(s.team is None for s in pool.shards))

    @property
    def disk_plugin_pools(self) -> tuple[str, ...]:
        """Where Azure Disk CSI's node plugin runs, and so the only scale sets whose instances its
        controller's identity may write (attach and detach, kilonode.azure.identity): every pool
        with no GPUs, a monitoring or system pool, and the Prometheus pool (kilonode.k8s.storage
        node_plugin_pools says why not the GPU pools; kilonode.plan.resolve.components
        runs_disk_plugin counts its pod there)."""
        pools = {p.name for p in self.node_pools if not p.gpus_per_node or p.monitoring or p.system}
        if self.prometheus is not None:
            pools.add(self.prometheus.pool)
        return tuple(sorted(pools))

    @property
    def node_resource_group(self) -> str:
        """The resource group of the pools' scale sets and of the Service load balancers and
        public IPs cloud-controller-manager creates: apart from the cluster's own group (named
        after the cluster), which holds the control plane, so that the controllers' roles can be
        scoped to a group holding no control-plane resource (kilonode.azure.identity)."""
        return f"{self.cluster}-nodes"

    def image_version_of(self, pool: str) -> str:
        """The gallery version the pool's scale sets boot: its own (nodeImage.pools), else the stack's."""
        return self.pool_image_versions.get(pool, self.node_image_version)

    @property
    def boot_images(self) -> tuple[BootImage, ...]:
        """Every disk image the cluster's machines boot, one per pool then one per control-plane
        role: the one list that `kilonode image build --all` builds, `pulumi up` uploads (and
        refuses to start without) and the runbook names."""
        return (
            *(BootImage(name=pool.name, version=self.image_version_of(pool.name), replicas=self.gallery_replicas,
                        role=False, previous=self.image_previous.get(pool.name))
              for pool in self.node_pools),
            *(BootImage(name=role, version=version, replicas=self.role_image_replicas, role=True,
                        previous=self.image_previous.get(role))
              for role, version in ((ETCD_IMAGE, self.etcd_image_version),
                                    (CONTROL_PLANE_IMAGE, self.control_plane_image_version))),
        )

    @property
    def gpu_pools(self) -> tuple[NodePoolPlan, ...]:
        """Pools whose size has GPUs: where the device plugin and the GPU health agent run."""
        return tuple(pool for pool in self.node_pools if pool.gpus_per_node)
