"""ClusterConfig: the typed, fully defaulted description of one cluster.

A stack file holds overrides only; every default lives here, once, with the reason it
has the value it has. Field names are snake_case in Python and camelCase in YAML, like
Pulumi and Kubernetes YAML. Unknown keys are errors: a typo must never be ignored.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from ipaddress import IPv4Network
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    PrivateAttr,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic.alias_generators import to_camel

from kilonode.catalog import vm as vm_catalog
from kilonode.config import tokens
from kilonode.config.values import (
    Bool,
    Cidr,
    ControlPlaneHost,
    DevicePath,
    GalleryVersion,
    Generation,
    IndexKey,
    Int,
    LabelKey,
    LabelValue,
    LogFile,
    MountPoint,
    PoolLabelKey,
    PullDeadline,
    ReadBy,
    RelativePath,
    Retention,
    SshPublicKey,
    Str,
    SysctlKey,
    SysctlValue,
    Taint,
    VmSize,
    shown,
)

GIB = 1024**3

# Kubernetes minors this toolkit renders flags for. From 1.32 the apiserver can allow
# anonymous requests on the health endpoints only (KEP-4633: beta 1.32, GA 1.34), which
# the Azure load balancer's /readyz probe needs while everything else stays authenticated;
# above 1.35 nothing is verified.
SUPPORTED_KUBERNETES_MINORS = range(32, 36)
# The control plane's images, named like pools' (<stack>-<name>, gallery image <name>), so no
# pool may take these names. The same names are the binaries.toml roles they carry.
ETCD_IMAGE = "etcd"
CONTROL_PLANE_IMAGE = "control-plane"
ROLE_IMAGES = (ETCD_IMAGE, CONTROL_PLANE_IMAGE)

NAME_PATTERN = r"^[a-z]([a-z0-9-]{0,30}[a-z0-9])?$"
# The longest alerting.webhookUrl taken: far above a real endpoint's, so a pasted file is refused.
ALERTING_URL_MAX = 2048
# alerting.azureAlertEmails: Azure takes up to 1,000 e-mail receivers in an action group (Azure Monitor
# service limits, "Action groups"); a handful is what a team names, and more would be a list to maintain elsewhere.
AZURE_ALERT_EMAILS_MAX = 10
# An address as Azure's action group takes it: one @, a dotted domain, no spaces (RFC 5321 caps a path at 254).
EMAIL = re.compile(r"[A-Za-z0-9._%+'-]+@[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)+")
EMAIL_MAX = 254


# The most entries of each stack value that grows a machine's custom data (Azure takes 64 KiB of
# it: kilonode.azure.custom_data), far above any stack's (research-7500: a few sysctl overrides,
# labels and taints per pool) and each well inside the room a pool's custom data has
# (research-7500's largest takes 41 KB of 65,535): a sysctl override costs ~120 bytes of it, a
# label or taint up to ~450 at its longest, an archive ~150 (sshKeys go in the VM's osProfile,
# not its custom data). Together they can still overfill it: every command that plans measures
# each role's custom data and refuses it over the cap (kilonode.azure.custom_data_size, the program too).
CUSTOM_DATA_BOUNDS = {
    "overrides": 128,  # sysctl.overrides: every machine's /etc/sysctl.d file
    "labels": 64,  # nodePools[].labels: the kubelet's --node-labels
    "taints": 32,  # nodePools[].taints: --register-with-taints
    "preload_images": 32,  # nodePools[].preloadImages: the pool's image preload unit
    "boot_image_archives": 32,  # bootImageArchives: every machine's boot images
}


class StrictModel(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        alias_generator=to_camel,
        populate_by_name=True,
        frozen=True,
    )


class LocalDiskConfig(StrictModel):
    """The instance's local (temp or NVMe) SSD, formatted and mounted at first boot."""

    device: DevicePath = Field(
        default="/dev/disk/cloud/azure_resource",
        description=(
            "Azure exposes the temp (resource) disk of `d` sizes through cloud-init's udev link. For a node pool"
            " whose size has local NVMe disks (vm_sizes.yaml nvmeDisks) this default means those disks instead,"
            " as one RAID 0 array when there are several, made at every boot; another device is used as named."
        ),
    )
    mount_point: MountPoint = Field(
        default="/mnt/local-ssd",
        description=(
            "Where the local disk is mounted; etcd's data and the runtime root go below it."
        ),
    )
    filesystem: Literal["ext4", "xfs"] = Field(
        default="ext4",
        description=(
            "The filesystem made on the local disk at first boot."
        ),
    )


class EtcdClusterConfig(StrictModel):
    members: Int = Field(
        default=5,
        description=(
            "7,500-node post: 5 etcd nodes for the main store; 3 tolerate 1 failure, 5 tolerate 2."
        ),
    )
    quota_backend_bytes: Annotated[Int, ReadBy("etcdQuotaBackendBytes")] = Field(
        default=8 * GIB,
        description=(
            "2,500-node post: the 2 GB default quota was hit past 1,000 nodes and stopped all writes; etcd "
            "documents 8 GiB as the suggested maximum."
        ),
    )
    acknowledge_quota_above_suggested_maximum: Bool = Field(
        default=False,
        description=(
            "Above 8 GiB etcd only warns; we refuse unless the stack says it knows."
        ),
    )
    vm_size: VmSize = Field(
        default="Standard_D16ds_v5",
        description=(
            'etcd hardware guide "xLarge" (~3,000-node cluster): 16 vCPU, 64 GB RAM; the `d` in Ddsv5 gives a'
            " local temp SSD (2,500-node post: ~200 us fsync vs ~2 ms on premium SSD)."
        ),
    )
    vm_size_overrides: dict[IndexKey, VmSize] = Field(
        default_factory=dict,
        description=(
            "A rolling resize, one member per commit: member index -> VM size. Azure resizes a VM by restarting "
            "it, so a new vmSize restarts every member at once (quorum lost; `pulumi up` refuses it). Instead add "
            "one member here per change (each `pulumi up` restarts one member, which rejoins from its peers), and "
            "when all but one are moved, set vmSize and remove the overrides: that last change restarts the last "
            "member only. Overrides that move every member at once are refused (the same as a new vmSize). "
            "`kilonode diff` reports each step."
        ),
    )
    local_disk: LocalDiskConfig = Field(
        default=LocalDiskConfig(),
        description=(
            "The local SSD that holds etcd's data directory (2,500-node post: ~200 us fsync vs ~2 ms on a "
            "remote disk)."
        ),
    )
    auto_compaction_retention: Retention = Field(
        default="1h",
        description=(
            "kube-apiserver compacts every 5 min; etcd's own periodic compaction is the backstop that keeps "
            "history bounded if every apiserver is down."
        ),
    )
    snapshot_count: Annotated[Int, ReadBy("etcdSnapshotCount")] = Field(
        default=10000, ge=100,
        description=(
            "etcd --snapshot-count: committed transactions between snapshots (etcd's own default since 3.2)."
        ),
    )

    rejoining: tuple[Int, ...] = Field(
        default=(),
        description=(
            "Deprecated, must stay empty: a member whose data dir is blank (a replaced, resized or deallocated "
            "VM's new local SSD) now rejoins by itself at boot (etcd.service runs /usr/local/lib/kilonode/etcd-join: "
            "it removes and re-adds the member while the others hold quorum; docs/runbooks/"
            "etcd-member-lost-its-disk.md). The key used to render --initial-cluster-state=existing, which changed "
            "the member's custom data and so replaced its VM twice (once set, once removed)."
        ),
    )

    @field_validator("rejoining")
    @classmethod
    def _rejoining_is_gone(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        # An error, not a warning: the stack asked for an action that no longer happens, and a
        # silent no-op would leave the user waiting for it.
        if value:
            raise ValueError(
                "no longer used: a member with a blank data dir rejoins by itself at boot (etcd.service runs "
                "/usr/local/lib/kilonode/etcd-join, which removes and re-adds it while the others hold quorum); "
                "remove the key. docs/runbooks/etcd-member-lost-its-disk.md says what to check."
            )
        return value

    @field_validator("members")
    @classmethod
    def _odd_and_small(cls, value: int) -> int:
        if not 1 <= value <= 7:
            raise ValueError(f"must be 1, 3, 5 or 7 (got {value}); etcd advises at most 7 members")
        if value % 2 == 0:
            raise ValueError(
                f"must be odd (got {value}): {value} members tolerate no more failures than "
                f"{value - 1} do; use {value - 1} or {value + 1}"
            )
        return value

    @field_validator("quota_backend_bytes")
    @classmethod
    def _quota_positive(cls, value: int) -> int:
        if value < 64 * 1024**2:
            raise ValueError(f"must be at least 67108864 (64 MiB) (got {value})")
        return value


class LeasesEtcdClusterConfig(EtcdClusterConfig):
    """The leases cluster: the shape of the others, at least 3 members (every Lease lives there)."""

    members: Int = Field(
        default=3,
        description=(
            "3 tolerate 1 failure, 5 tolerate 2. At least 3: unlike Events, losing the Leases stops the control "
            "plane (the scheduler and controller manager lose their leader election, no kubelet can renew its "
            "node Lease), so one member is never enough."
        ),
    )

    @field_validator("members")
    @classmethod
    def _at_least_three(cls, value: int) -> int:
        if value < 3:
            raise ValueError(
                f"must be 3, 5 or 7 (got {value}): every Lease (each node's heartbeat, every leader election) "
                "lives in this cluster, so it must survive losing a member"
            )
        return value


class EtcdConfig(StrictModel):
    main: EtcdClusterConfig = Field(
        default=EtcdClusterConfig(),
        description=(
            "The main etcd cluster: every object but Events (and Leases, when etcd.leases is set)."
        ),
    )
    events: EtcdClusterConfig = Field(
        default=EtcdClusterConfig(members=3),
        description=(
            "7,500-node post: Events in their own etcd so event storms cannot hurt the main store; 3 members "
            "tolerate 1 failure, and losing Events is survivable."
        ),
    )
    leases: LeasesEtcdClusterConfig | None = Field(
        default=None,
        description=(
            "An optional third cluster for every Lease (coordination.k8s.io/leases, through kube-apiserver's "
            "--etcd-servers-overrides, as kops shards it for very large clusters): each kubelet renews its node "
            "Lease every 10 s, nodes/10 writes per second, each revision kept until the next compaction, which "
            "past tens of thousands of nodes is the main etcd's largest write load and history (the plan's "
            "'main etcd' budget lines). It moves ALL Leases: node heartbeats and the leader elections of the "
            "scheduler, controller manager and the tool's controllers. Unset: Leases stay in the main cluster. "
            "Set it when the cluster is created: added later it copies no Lease, and while the apiservers roll "
            "two leaders may act at once (docs/architecture.md, \"The etcd clusters\")."
        ),
    )

    @model_serializer(mode="wrap")
    def _absent_leases_unwritten(self, handler: SerializerFunctionWrapHandler) -> dict[str, object]:
        # a stack without the leases cluster dumps as it did before the key existed: the
        # rendered config of such a stack, and everything keyed by it, stays the same
        data: dict[str, object] = handler(self)
        if self.leases is None:
            data.pop("leases", None)
        return data

    def clusters(self) -> tuple[tuple[str, EtcdClusterConfig], ...]:
        """(role, config) of every etcd cluster the stack has: main, events, then leases if set."""
        found: tuple[tuple[str, EtcdClusterConfig], ...] = (("main", self.main), ("events", self.events))
        return found + ((("leases", self.leases),) if self.leases is not None else ())


class AuditLogConfig(StrictModel):
    path: LogFile | None = Field(
        default=None,
        description=(
            "2,500-node post: audit logs found the slow and excessive queries. Default:"
            " kubernetes/audit/audit.log below the apiserver's localDisk mountPoint (the local SSD, not the OS disk)."
        ),
    )
    max_age_days: Annotated[Int, ReadBy("auditLogMaxAgeDays")] = Field(
        default=30, ge=1,
        description=(
            "CIS Kubernetes Benchmark 1.2.17-1.2.19: maxage 30, maxbackup 10, maxsize 100."
        ),
    )
    max_backup: Annotated[Int, ReadBy("auditLogMaxBackup")] | None = Field(
        default=None, ge=1,
        description=(
            "CIS Kubernetes Benchmark 1.2.18: rotated audit files kept. Default: as many maxSizeMb files as half the"
            " apiserver's local disk holds, at least 10."
        ),
    )
    max_size_mb: Annotated[Int, ReadBy("auditLogMaxSizeMb")] = Field(
        default=100, ge=1,
        description=(
            "CIS Kubernetes Benchmark 1.2.19: audit file size before rotation."
        ),
    )


def supported_kubernetes_version(value: str) -> str:
    """A Kubernetes version kilonode renders for: 1.<minor>.<patch>, the minor supported."""
    match = re.fullmatch(r"1\.(\d+)\.(\d+)", value)
    if not match:
        raise ValueError(f"must look like '1.34.2' (got {shown(value)})")
    minor = int(match.group(1))
    if minor not in SUPPORTED_KUBERNETES_MINORS:
        first, last = SUPPORTED_KUBERNETES_MINORS[0], SUPPORTED_KUBERNETES_MINORS[-1]
        raise ValueError(f"1.{minor} is not supported; use 1.{first} to 1.{last}")
    return value


class ApiserverConfig(StrictModel):
    replicas: Int = Field(default=5, ge=1, le=15, description="7,500-node post: 5 dedicated apiserver nodes.")
    vm_size: VmSize = Field(
        default="Standard_D32ds_v5",
        description=(
            "7,500-node post: dedicated apiserver VMs; 32 vCPUs and a local temp disk for the audit log."
        ),
    )
    audit_log: AuditLogConfig = Field(
        default=AuditLogConfig(),
        description=(
            "The apiserver's audit log file and its rotation."
        ),
    )
    local_disk: LocalDiskConfig = Field(default=LocalDiskConfig(), description="The apiserver VM's local SSD.")


# An image reference as the runtimes parse it (distribution/reference's grammar, reference.go: a
# domain with an optional port, then path components of lower-case letters and digits joined by
# one `.` or `_`, two `_`, or dashes; a tag of word characters, `.` and `-`, at most 128; a digest),
# lower-case only here. `..`, `//` or an empty component would pass a looser pattern and be judged
# by its text (a publisher prefix) while the runtime refuses it (independent trace of issue 37,
# round 4, finding 4).
_DOMAIN_LABEL = r"[a-z0-9](?:[a-z0-9-]*[a-z0-9])?"
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
IMAGE_REFERENCE = (rf"(?:{_DOMAIN_LABEL}(?:\.{_DOMAIN_LABEL})*(?::[0-9]{{1,5}})?/)?"
                   rf"{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*"
                   r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[0-9a-f]{64})?")


def image_reference(value: str) -> str:
    if len(value) > 255 or not re.fullmatch(IMAGE_REFERENCE, value):
        raise ValueError(f"is not an image reference like 'registry/name:tag' (got {shown(value)})")
    return value


def image_prefix(value: str) -> str:
    """A registry host (a DNS name, an optional port), optionally followed by a repository path."""
    label = r"[a-z0-9]([a-z0-9-]*[a-z0-9])?"
    path = r"[a-z0-9]+([._-][a-z0-9]+)*"
    if len(value) > 253 or not re.fullmatch(rf"{label}(\.{label})*(:[0-9]{{1,5}})?(/{path})*", value):
        raise ValueError(f"is not a registry, or a registry and account, like 'myregistry.azurecr.io' or "
                         f"'ghcr.io/my-org' (got {shown(value)})")
    return value


ImagePrefix = Annotated[Str, AfterValidator(image_prefix)]


class PreloadImageConfig(StrictModel):
    """An image baked into the node image so a fresh node needs no pull for it."""

    image: Str = Field(description="The image reference, like 'registry/name:tag' (a digest may follow).")
    archive: RelativePath | None = Field(
        default=None,
        description=(
            "A docker-archive tarball supplied by the user (a path relative to the stack's project, the "
            "folder of its Pulumi.yaml); without it the image build pulls `image` where a registry is "
            "reachable."
        ),
    )

    @field_validator("image")
    @classmethod
    def _reference(cls, value: str) -> str:
        return image_reference(value)


class BootImageArchiveConfig(PreloadImageConfig):
    """A component's own image, baked from an archive the stack supplies (an air-gapped build, a
    registry outage at boot): what every node runs for that component, privileged for some."""

    archive: RelativePath = Field(  # type: ignore[assignment]
        description=(
            "A docker-archive tarball (`docker save -o FILE IMAGE`), a path relative to the stack's project "
            "(the folder of its Pulumi.yaml)."
        ),
    )
    image_id: Str = Field(
        pattern=r"^sha256:[0-9a-f]{64}$",
        description=(
            "The image's ID, as `docker inspect --format '{{.Id}}' IMAGE` prints it (the sha256 of its config), "
            "which the image build checks the archive against. The archive replaces the component on every "
            "node (it runs by tag, pulled only if not present), calico-node and kube-proxy privileged: the stack "
            "names exactly which image that is, and a reviewer sees it change (independent trace of issue 37, "
            "round 4, finding 2)."
        ),
    )


class PoolAutoscalingConfig(StrictModel):
    """The cluster autoscaler on one pool: its shards not given to a team become node groups."""

    min_nodes: Annotated[Int, ReadBy("autoscalerNodes")] | None = Field(
        default=None, ge=0,
        description=(
            "The fewest nodes the autoscaler may leave in the pool (teams' shards included, which it never "
            "touches). At least half of `nodes`: the 2,500-node post's guard (an etcd outage failed every "
            "health check and the autoscaler tried to remove the whole fleet; never let it act on more than "
            "half). Unset: half of `nodes`, rounded up. The most is maxNodes (or nodes)."
        ),
    )
    warm_nodes: Annotated[Int, ReadBy("balloonReplicas")] = Field(
        default=0, ge=0,
        description=(
            "Balloon pods: placeholder pods of the lowest priority that each take a whole node, so the "
            "autoscaler keeps that many nodes warm; real work evicts them at once (field notes: autoscaler "
            "buffer). 0: none."
        ),
    )


class NodePoolConfig(StrictModel):
    name: Str = Field(
        pattern=NAME_PATTERN,
        description=(
            "The pool's name: it names its scale sets (<cluster>-<pool>-000), subnet and render directory. "
            "Not 'etcd' or 'control-plane': those name the control plane's images."
        ),
    )

    @field_validator("name")
    @classmethod
    def _not_a_role_image(cls, value: str) -> str:
        if value in ROLE_IMAGES:
            raise ValueError(
                f"{value!r} names the control plane's image (`kilonode image build --role {value}`, the gallery "
                "image of the same name); give the pool another name"
            )
        return value

    nodes: Annotated[Int, ReadBy("autoscalerNodes")] = Field(
        ge=1, description="How many nodes the pool has now (see maxNodes for its room to grow).")
    pods_per_node: Annotated[Int, ReadBy("kubeletMaxPods")] = Field(
        default=8, ge=0,
        description=(
            "Native pod networking: routable secondary NIC IPs per node (field notes: flannel capped pods at "
            "~2 Gbit/s). One GPU pod per node is the common shape; 0 means hostNetwork pods only."
        ),
    )
    host_network_pods: Int = Field(
        default=0, ge=0, le=100,
        description=(
            "Your own hostNetwork DaemonSet pods on each node (a log agent, an exporter): they need no pod IP but "
            "count towards the kubelet's maxPods. kilonode's own (kube-proxy, cloud-node-manager, the device "
            "plugins) are counted by the plan. maxPods is podsPerNode plus both, so the scheduler never places "
            "more pod-network pods on a node than it has pod IPs: a room held here for pods that never come lets "
            "it place that many pods without an address (ContainerCreating, \"no available addresses\")."
        ),
    )
    kubernetes_version: Str | None = Field(
        default=None,
        description=(
            "This pool's kubelet version, when it is not the stack's kubernetesVersion: a minor upgrade moves "
            "the control plane first and each pool after it, one at a time, through its own image and rollout "
            "(`kilonode upgrade`; docs/operations.md). Never newer than kubernetesVersion, and at most three "
            "minors older (the Kubernetes version skew policy for the kubelet)."
        ),
    )

    @field_validator("kubernetes_version")
    @classmethod
    def _pool_version(cls, value: str | None) -> str | None:
        return None if value is None else supported_kubernetes_version(value)

    runtime: Literal["docker", "containerd"] = Field(
        default="containerd",
        description=(
            "Field notes (Kubernetes today): containerd is the default CRI; `docker` means Docker behind cri-"
            "dockerd, as the 2,500/7,500-node clusters ran it."
        ),
    )
    infiniband: Bool | None = Field(
        default=None,
        description=(
            "7,500-node post: GPU nodes with InfiniBand; a scale set then keeps a single placement group, so "
            "at most 100 VMs per scale set. Unset: whether the size has InfiniBand "
            "(infra/kilonode/catalog/vm_sizes.yaml); true on a size without it is refused."
        ),
    )
    vm_size: VmSize = Field(
        default="Standard_ND96asr_v4",
        description=(
            "The 7,500-node post's GPU nodes: 8 A100s with InfiniBand (ND A100 v4)."
        ),
    )
    gpus_per_node: Int | None = Field(
        default=None, ge=0, le=16,
        description=(
            "Unset: the size's GPU count from the catalogue; a different number is refused."
        ),
    )
    local_disk: LocalDiskConfig = Field(
        default=LocalDiskConfig(),
        description=(
            "2,500-node post: the container runtime's root on the instance's local SSD, not the OS disk."
        ),
    )
    max_concurrent_downloads: Annotated[Int, ReadBy("runtimeMaxConcurrentDownloads")] = Field(
        default=10, ge=1, le=64,
        description=(
            "2,500-node post: Docker max-concurrent-downloads 10 so big layers pull in parallel."
        ),
    )
    max_parallel_image_pulls: Annotated[Int, ReadBy("kubeletMaxParallelImagePulls")] = Field(
        default=10, ge=1, le=64,
        description=(
            "2,500-node post: serialized pulls let one 17 GB image block all others."
        ),
    )
    image_pull_progress_deadline: PullDeadline = Field(
        default="30m", pattern=r"^[0-9]+[smh]$",
        description=(
            '2,500-node post: big pulls were cancelled for "lack of progress" at the default.'
        ),
    )
    preload_images: tuple[PreloadImageConfig, ...] = Field(
        default=(),
        max_length=CUSTOM_DATA_BOUNDS["preload_images"],
        description=(
            "Images baked into the node image besides the pause image, so a fresh node pulls none of them."
        ),
    )
    max_nodes: Annotated[Int, ReadBy("autoscalerNodes")] | None = Field(
        default=None, ge=1,
        description=(
            "The most nodes this pool may grow to. Its subnet is sized for max(nodes, maxNodes) when it is "
            "first allocated, so growing up to maxNodes never moves an address. Unset: nodes (no room planned"
            " beyond what the subnet's power-of-two size happens to leave)."
        ),
    )
    subnet: Cidr | None = Field(
        default=None,
        description=(
            "Recorded by `kilonode allocate` (or pinned by hand): once recorded, no change to another pool or"
            " role moves it. Unset: the plan places it, and warns until it is recorded."
        ),
    )
    labels: dict[PoolLabelKey, LabelValue] = Field(
        default_factory=dict,
        max_length=CUSTOM_DATA_BOUNDS["labels"],
        description=(
            "Node labels the kubelet registers with (kilonode.io/pool is always set). Keys and values as "
            "Kubernetes' own (apimachinery's IsQualifiedName, IsValidLabelValue); none under kubernetes.io/, k8s.io/ "
            "or kilonode.io/, which are the kubelet's and kilonode's."
        ),
    )
    taints: tuple[Taint, ...] = Field(
        default=(),
        max_length=CUSTOM_DATA_BOUNDS["taints"],
        description=(
            "`key[=value]:Effect`, registered by the kubelet so no pod lands before it is tolerated; one per key "
            "and effect, as Kubernetes allows."
        ),
    )
    system: Bool = Field(
        default=False,
        description=(
            "A system pool: its nodes register with kilonode.io/system=true and the taint "
            "CriticalAddonsOnly=true:NoSchedule (AKS's system-pool convention), and the cluster's own workloads "
            "(CoreDNS, cloud-controller-manager, cluster-autoscaler, the gang scheduler, the CSR approver) "
            "tolerate that taint and prefer it (the CSR approver requires it); other pods stay off it (the taint, "
            "and the kilonode-reserved-pools admission policy outside kube-system and monitoring). A stack whose "
            "every pool carries a taint "
            "they do not tolerate (a GPU pool's health startup taint) needs one, with no other taint, or DNS and "
            "node initialisation wait on the GPU driver path."
        ),
    )
    monitoring: Bool = Field(
        default=False,
        description=(
            "The pool the cluster's Prometheus runs on (kilonode.io/pool selects it; it tolerates the pool's "
            "taints). At most one. Unset everywhere: the first system pool, else the first untainted pool; the "
            "plan refuses a pool whose VM size cannot hold the Prometheus it estimates (docs/monitoring.md)."
        ),
    )

    autoscaling: PoolAutoscalingConfig | None = Field(
        default=None,
        description=(
            "Let the cluster autoscaler grow and shrink this pool between minNodes and maxNodes. Unset: the "
            "pool keeps `nodes`, and `pulumi up` sets each scale set's capacity."
        ),
    )


class SysctlConfig(StrictModel):
    profile: Str = Field(
        default="gpu-worker", pattern=r"^[a-z0-9-]+$",
        description=(
            "A file in sysctl/ (without .yaml) with a value and a reason per key."
        ),
    )
    overrides: dict[SysctlKey, SysctlValue] = Field(
        default_factory=dict,
        max_length=CUSTOM_DATA_BOUNDS["overrides"],
        description=(
            "Sysctl values that replace the profile's, each reported as a stack override. An integer where the "
            "profile has one; a string is words of letters, digits and `_.,:-` (never a path or a pipe, which "
            "kernel.core_pattern or kernel.modprobe would run as root). Not the tunables the kubelet checks at start "
            "(vm.overcommit_memory, vm.panic_on_oom, kernel.panic, kernel.panic_on_oops, kernel.keys.root_max*: "
            "protectKernelDefaults keeps a kubelet whose kernel differs from starting), unless at its value."
        ),
    )


class NetworkConfig(StrictModel):
    vnet_cidr: Cidr = Field(
        default=IPv4Network("10.0.0.0/16"),
        description=(
            "One VNet per cluster; Azure counts at most 65,536 private IPs in it, whatever its address space,"
            " so a larger space only helps subnet alignment."
        ),
    )
    control_plane_subnet: Cidr | None = Field(
        default=None,
        description=(
            "Recorded by `kilonode allocate` (or pinned by hand); unset, the plan places them and warns until"
            " they are recorded, since the static etcd/apiserver/LB IPs derive from them."
        ),
    )
    etcd_subnet: Cidr | None = Field(
        default=None,
        description=(
            "Recorded by `kilonode allocate` (or pinned by hand): the etcd members' static IPs sit at fixed "
            "offsets in it."
        ),
    )
    service_cidr: Cidr = Field(
        default=IPv4Network("172.16.0.0/16"),
        description=(
            "Kubernetes Service IPs: virtual, outside the VNet; .1 is the kubernetes Service, .10 cluster "
            "DNS."
        ),
    )
    apiserver_allowed_cidrs: tuple[Cidr, ...] = Field(
        default=(),
        description=(
            "Who may reach the apiserver load balancer on 6443 besides the VNet itself."
        ),
    )
    admin_cidr: Cidr | None = Field(
        default=None,
        description=(
            "SSH (22) is allowed only from here; none means no SSH rule at all."
        ),
    )
    public_ips_on_control_plane: Bool = Field(
        default=False,
        description=(
            "Public IPs on etcd and apiserver VMs; off by default: the control plane is reached from inside "
            "the VNet."
        ),
    )
    min_snat_ports_per_node: Int = Field(
        default=128, ge=1, le=64_512,
        description=(
            "Outbound: each subnet leaves through its own NAT gateway (at most 16 public IPs x 64,512 SNAT "
            "ports); the plan sizes each gateway's public IP prefix for its pool's maxNodes at this many ports "
            "per node and refuses a pool it cannot serve. 128: a port is held per concurrent connection to "
            "one destination, and a node's busiest destination is its registry while it pulls images "
            "(maxParallelImagePulls 10 x the runtime's 10 concurrent layer downloads = 100 connections); "
            "bulk data to Azure services belongs on private endpoints, not on the NAT."
        ),
    )
    acknowledge_world_open_access: Bool = Field(
        default=False,
        description=(
            "apiserverAllowedCidrs (with deployer.cidrs) admitting more than a /8 of internet addresses, or "
            "adminCidr more than a /24 of them, opens the apiserver or SSH to the world; "
            "refused unless this says the stack means it. It never lifts adminCidr's other rule: no "
            "address of the VNet (pods have pool-subnet addresses)."
        ),
    )


VNET_ID = (
    r"^/subscriptions/[0-9a-fA-F-]{36}/resourceGroups/[-\w._()]{1,90}"
    r"/providers/Microsoft\.Network/virtualNetworks/[A-Za-z0-9][-A-Za-z0-9_.]{0,62}[A-Za-z0-9_]$"
)


class DeployerConfig(StrictModel):
    """Where `pulumi up` runs, so that its Kubernetes objects reach the apiserver on the first run.

    The in-cluster layer (bootstrap token, RBAC, kube-proxy, CoreDNS, the cloud provider: without
    them no node joins) is created through the apiserver by the machine running `pulumi up`. The
    apiservers sit behind an internal load balancer in a VNet that the same run creates, so a
    laptop or a hosted CI runner has no path to them unless the stack makes one (docs/azure.md,
    "How `pulumi up` reaches the apiserver")."""

    network: Literal["internet", "peered"] = Field(
        description=(
            "`internet`: a laptop or hosted CI runner; the apiservers get a second, public Standard load "
            "balancer admitting 6443 only from `cidrs` (as AKS's authorized IP ranges), and the program's "
            "kubeconfig names it. `peered`: a runner in a VNet of yours (`vnetId`); the program peers it "
            "with the cluster's VNet both ways and admits `cidrs`; no public address."
        ),
    )
    cidrs: tuple[Cidr, ...] = Field(
        min_length=1,
        description=(
            "The deployer's source addresses as the apiserver sees them: its egress (NAT) addresses for "
            "`internet`, its subnet for `peered`. Admitted on 6443 only."
        ),
    )
    vnet_id: Str | None = Field(
        default=None, pattern=VNET_ID,
        description=(
            "`peered` only: the runner's VNet, as an Azure resource ID. Its address space must not overlap "
            "the cluster's VNet (Azure refuses to peer them)."
        ),
    )

    @model_validator(mode="after")
    def _vnet_for_peered(self) -> DeployerConfig:
        if self.network == "peered" and self.vnet_id is None:
            raise ValueError("network: peered needs vnetId, the runner's VNet resource ID")
        if self.network == "internet" and self.vnet_id is not None:
            raise ValueError("vnetId is for network: peered; an internet deployer has no VNet to peer")
        return self


class PoolImageConfig(StrictModel):
    """One pool's node image versions, apart from the stack-wide nodeImage.version."""

    version: GalleryVersion = Field(
        pattern=r"^[0-9]+\.[0-9]+\.[0-9]+$",
        description="The gallery version of this pool's node image (`kilonode image build STACK --pool NAME`).")
    previous: GalleryVersion | None = Field(
        pattern=r"^[0-9]+\.[0-9]+\.[0-9]+$",
        default=None,
        description=(
            "This pool's version before `version`, kept published beside it: its rollback target, and the image "
            "of its nodes not rolled yet (nodeImage.previous says more)."
        ),
    )

    @model_validator(mode="after")
    def _previous_is_another(self) -> PoolImageConfig:
        if self.previous is not None and self.previous == self.version:
            raise ValueError(f"previous is the same version as version ({self.version}): name the version before it, "
                             "or remove previous")
        return self


class NodeImageConfig(StrictModel):
    max_concurrent_vm_creates: Int = Field(
        default=1000, ge=1,
        description=(
            "Azure Compute Gallery: 1 replica per 20 VMs created at once, >= 3 for production, at most 100 "
            "per version. The largest burst is one wave of scale-set creation."
        ),
    )
    min_replicas: Annotated[Int, ReadBy("galleryReplicaCount")] = Field(
        default=3, ge=1, le=100,
        description=(
            "Azure Compute Gallery guidance: at least 3 replicas for production images."
        ),
    )
    version: GalleryVersion = Field(
        default="1.0.0",
        pattern=r"^[0-9]+\.[0-9]+\.[0-9]+$",
        description=(
            "The Azure Compute Gallery version of every pool's node image (a pool in `pools` may have its own). "
            "A gallery version is immutable: rolling a new image is a new version here (a stack change, reviewed "
            "like any other), then the scale sets' manual upgrade, one scale set at a time (`kilonode rollout`; "
            "docs/operations.md)."
        ),
    )
    previous: GalleryVersion | None = Field(
        pattern=r"^[0-9]+\.[0-9]+\.[0-9]+$",
        default=None,
        description=(
            "The version before `version`, kept published beside it (its gallery version and its VHD) for "
            "every pool that has no entry in `pools`: the rollback target while the scale sets roll, and the "
            "image of every node not rolled yet. Without it, the new version's `pulumi up` deletes the old one "
            "(`kilonode diff`: rollback-target-removed). Set it to the old version in the same change that raises "
            "`version`; remove it in a later change once every node runs the new one."
        ),
    )
    pools: dict[Str, PoolImageConfig] = Field(
        default_factory=dict,
        description=(
            "Per pool (by its name), its own version and previous version in place of the two above: a canary "
            "pool rolls a new image before the rest, and a pool rolls back on its own."
        ),
    )

    def of_pool(self, pool: str) -> PoolImageConfig:
        """The pool's version and previous version: its own entry, else the stack-wide pair."""
        return self.pools.get(pool) or PoolImageConfig(version=self.version, previous=self.previous)


class RoleImageConfig(StrictModel):
    """The gallery version of one control-plane role's image (etcd members, or apiservers)."""

    version: GalleryVersion = Field(
        default="1.0.0",
        pattern=r"^[0-9]+\.[0-9]+\.[0-9]+$",
        description=(
            "The Azure Compute Gallery version of this role's image, built by `kilonode image build STACK "
            "--role ...`. Its own version, apart from the pools' and the other role's: a new pool image never "
            "replaces an etcd member. A new version replaces the role's VMs (a new OS disk), so it goes "
            "through the restart guard one machine at a time (docs/azure.md: \"Rolling the control plane\")."
        ),
    )
    previous: GalleryVersion | None = Field(
        pattern=r"^[0-9]+\.[0-9]+\.[0-9]+$",
        default=None,
        description=(
            "The version before `version`, kept published beside it while the role's machines move one at a "
            "time: the image of every machine not moved yet, and the one to go back to."
        ),
    )

    @model_validator(mode="before")
    @classmethod
    def _not_a_marketplace_image(cls, value: object) -> object:
        if isinstance(value, dict) and {"publisher", "offer", "sku"} & set(value):
            raise ValueError(
                "the control plane no longer boots a Marketplace image: etcd members and apiservers boot the "
                "images kilonode builds (`kilonode image build STACK --role etcd|control-plane`), published in "
                "the stack's gallery. Keep only `version` (that image's gallery version) and remove publisher, "
                "offer and sku"
            )
        return value


class JoinTokenConfig(StrictModel):
    """One generation of the pools' join (bootstrap) tokens."""

    generation: Int = Field(
        ge=1,
        description=(
            "Which tokens: each pool's token of this generation is random and kept in the Pulumi state; a new "
            "number is a new token for every pool (the old one's state is dropped once no entry names it)."
        ),
    )
    expires: AwareDatetime = Field(
        description=(
            "When the apiserver stops accepting these tokens and kube-controller-manager's token cleaner deletes "
            "them (the token Secret's `expiration`, RFC 3339 in UTC): e.g. 2027-05-31T00:00:00Z. "
            f"At most {tokens.JOIN_TOKEN_MAX_DAYS} days ahead (of KILONODE_NOW when set). `kilonode preflight` "
            "warns 30 days before and refuses once it has passed."
        ),
    )

    @field_validator("expires")
    @classmethod
    def _utc(cls, value: datetime) -> datetime:
        value = value.astimezone(UTC)
        # bounded where the stack is read (kilonode.config.tokens: the one rule, preflight's too)
        problem = tokens.lifetime_problem(value, tokens.now())
        if problem is not None:
            raise ValueError(problem)
        return value


class JoinTokensConfig(StrictModel):
    """The pools' join tokens: the one new VMs get, and the one before it while it drains."""

    current: JoinTokenConfig = Field(
        description="The generation in every scale set's custom data: what a VM created from now on joins with."
    )
    previous: JoinTokenConfig | None = Field(
        default=None,
        description=(
            "The generation before `current`, kept valid until its own expiry after a rotation: a VM Azure "
            "created from a scale-set model older than the rotation still joins (docs/azure.md, \"Node join "
            "credentials\"). Its generation is current's minus one."
        ),
    )

    @model_validator(mode="after")
    def _previous_before_current(self) -> JoinTokensConfig:
        if self.previous is None:
            return self
        if self.previous.generation != self.current.generation - 1:
            raise ValueError(
                f"previous.generation must be current.generation - 1 ({self.current.generation - 1}), got "
                f"{self.previous.generation}: another number would be a new random token, not the one VMs hold"
            )
        if self.previous.expires > self.current.expires:
            raise ValueError("previous.expires is after current.expires: the older token must not outlive the newer")
        return self


class TeamConfig(StrictModel):
    """A team's reserved capacity: whole scale-set shards of a pool, labelled and tainted for
    the team when their nodes register (field notes: team capacity)."""

    name: Str = Field(
        pattern=NAME_PATTERN,
        description="The team: the value of the kilonode.io/team label and taint on its nodes.",
    )
    pool: Str | None = Field(
        default=None, pattern=NAME_PATTERN, description="The pool its nodes come from (or give nodeSelector instead)."
    )
    node_selector: dict[LabelKey, LabelValue] | None = Field(
        default=None,
        description=(
            "Labels the pool must carry (its `labels`, kilonode.io/pool, kilonode.io/nccl-topology): exactly "
            "one pool must match. Use it where the team's need is a kind of node rather than a pool name."
        ),
    )
    nodes: Int = Field(
        ge=1,
        description=(
            "How many nodes the team gets, rounded up to whole scale sets (a shard is one scale set: 100 VMs "
            "on InfiniBand pools): labels and taints are set per scale set, at registration."
        ),
    )
    first_shard: Int | None = Field(
        default=None, ge=0,
        description=(
            "The first of the team's contiguous scale sets in its pool (<cluster>-<pool>-<NNN>). Recorded by "
            "`kilonode allocate`: once recorded, no change to another team moves this team's nodes. Unset: "
            "the plan places it in the first free run of shards, and warns until it is recorded."
        ),
    )

    @model_validator(mode="after")
    def _one_source(self) -> TeamConfig:
        if (self.pool is None) == (self.node_selector is None):
            raise ValueError("give exactly one of pool or nodeSelector")
        return self


class AlertingConfig(StrictModel):
    """Where the cluster's Alertmanager sends alerts (kilonode.render.alertmanager; docs/monitoring.md,
    "Alertmanager"). The secrets are not here: `kilonode:cluster` takes none (kilonode.config.load); they
    are Pulumi secret config of their own (`pulumi config set --secret kilonode:<key>`), read by the
    program and mounted into the pod as files that alertmanager.yml names."""

    pager_duty: Bool = Field(
        default=False,
        description=(
            "Critical alerts page through PagerDuty's Events API v2: the integration's routing key is the Pulumi "
            "secret `kilonode:alertingPagerDutyRoutingKey` (`pulumi config set --secret "
            "kilonode:alertingPagerDutyRoutingKey <key>`); `pulumi up` refuses the stack without it."
        ),
    )
    pager_duty_warnings: Bool = Field(
        default=False,
        description=(
            "Warnings go to PagerDuty too, as events of severity `warning` (critical alerts as `critical`): set the "
            "PagerDuty service's \"How should responders be notified\" to dynamic notifications based on alert "
            "severity, so that they arrive as low-urgency incidents that notify without waking anyone and never "
            "escalate (PagerDuty's Dynamic Notifications). On a service set to high urgency always they would page "
            "like critical ones. Needs pagerDuty."
        ),
    )
    webhook_url: Str | None = Field(
        default=None, max_length=ALERTING_URL_MAX,
        description=(
            "Every alert, warning and critical, is POSTed here as Alertmanager's webhook JSON (and only here when "
            "pagerDuty is off, so critical alerts then page only if this endpoint pages). https only, no user or "
            "password in it. Not a secret: a URL that is itself a credential (a chat tool's incoming-webhook URL) "
            "does not belong here; put a relay in front that takes a bearer token (webhookBearerToken)."
        ),
    )
    webhook_bearer_token: Bool = Field(
        default=False,
        description=(
            "The webhook is called with `Authorization: Bearer <token>`, the token the Pulumi secret "
            "`kilonode:alertingWebhookToken`; `pulumi up` refuses the stack without it."
        ),
    )

    azure_alert_emails: tuple[Str, ...] = Field(
        default=(), max_length=AZURE_ALERT_EMAILS_MAX,
        description=(
            "E-mail addresses Azure Monitor's own alerts (the NAT gateways': SNAT exhaustion, datapath down) are "
            "sent to, through the cluster's action group, in the common alert schema: the alerts Prometheus and "
            "Alertmanager cannot see. An incident tool's e-mail integration address (a PagerDuty service's, for "
            "one) works as well as a person's. Not secrets: an address alone lets one send mail to it."
        ),
    )
    heartbeat_url: Str | None = Field(
        default=None, max_length=ALERTING_URL_MAX,
        description=(
            "A dead man's switch: KilonodeWatchdog, an alert that fires for as long as Prometheus evaluates its "
            "rules and scrapes itself, is POSTed here every 5 minutes (Alertmanager's webhook JSON, no credentials) "
            "and to no other receiver. Point it at a service outside the cluster that alarms when the posts stop "
            "(a heartbeat or cron monitor; set its period to 5 minutes with 10 or more of grace): the only way to "
            "learn that Prometheus, Alertmanager or the cluster's way out is gone, since none of them can send "
            "that alert itself. https only, no user or password in it; anyone who learns it can only keep the "
            "switch quiet, so use an unguessable URL the monitor gives."
        ),
    )

    @field_validator("webhook_url", "heartbeat_url")
    @classmethod
    def _https_url(cls, value: str | None) -> str | None:
        if value is None:
            return value
        parts = urlsplit(value)
        if parts.scheme != "https" or not parts.hostname:
            raise ValueError(f"must be an https:// URL with a host (got {shown(value)})")
        if parts.username is not None or parts.password is not None:
            raise ValueError("must not hold a user or password: it is written, unencrypted, into a ConfigMap")
        if any(c.isspace() for c in value) or "{{" in value:
            # Alertmanager 0.34 reads the webhook URL as a template (notify/webhook/config.go: SecretTemplateURL)
            raise ValueError(f"must not hold spaces or '{{{{' (got {shown(value)})")
        return value

    @field_validator("azure_alert_emails")
    @classmethod
    def _emails(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for address in value:
            if not EMAIL.fullmatch(address) or len(address) > EMAIL_MAX:
                raise ValueError(f"not an e-mail address: {shown(address)}")
        if len(set(value)) != len(value):
            raise ValueError("an address is listed twice")
        return value

    @model_validator(mode="after")
    def _token_needs_webhook(self) -> AlertingConfig:
        if self.webhook_bearer_token and self.webhook_url is None:
            raise ValueError("webhookBearerToken without webhookUrl: the token would be sent nowhere")
        if self.pager_duty_warnings and not self.pager_duty:
            raise ValueError("pagerDutyWarnings without pagerDuty: there is no PagerDuty integration to send them to")
        return self


class ClusterConfig(StrictModel):
    name: Str = Field(pattern=NAME_PATTERN, description="The cluster's name: it prefixes every Azure resource name.")
    location: Str = Field(
        default="westus2", pattern=r"^[A-Za-z0-9]+( [A-Za-z0-9]+)*$",
        description=(
            "An Azure region, checked against infra/kilonode/catalog/regions.yaml: its programmatic name "
            "(`westus3`), or its display name as the portal and `az account list-locations` show it (`West US "
            "3`) in any case and spacing, which kilonode takes as the programmatic name, with a note: ARM "
            "ignores case and spaces in a location, and one spelling keeps names, the cloud provider's "
            "azure.json and `kilonode diff` stable."
        ),
    )
    sizes_confirmed_in_location: tuple[VmSize, ...] = Field(
        default=(),
        description=(
            "VM sizes you have confirmed Azure sells in `location` although kilonode's catalogue "
            "(infra/kilonode/catalog/vm_regions.yaml, a dated reading of Microsoft's lists) does not list them "
            "there: without it such a size is refused. Confirm with `az vm list-skus --location <location> --size "
            "<size> --all --output table` (listed, no restrictions). Each must be a size the stack uses that the "
            "catalogue does not already list in `location`."
        ),
    )
    zones: tuple[Str, ...] = Field(
        default=("1", "2", "3"),
        description=(
            "Availability zones the members and scale-set shards spread over, round robin."
        ),
    )
    kubernetes_version: Str = Field(
        default="1.34.2",
        description=(
            "A minor in SUPPORTED_KUBERNETES_MINORS; flags and config fields are rendered for it."
        ),
    )
    control_plane_emulated_version: Str | None = Field(
        default=None,
        description=(
            "`1.<minor>`, only the minor below kubernetesVersion's, and only while every pool is pinned at it "
            "(nodePools[].kubernetesVersion): kube-apiserver, kube-controller-manager and kube-scheduler run "
            "kubernetesVersion's binaries with --emulated-version at this minor, and the in-cluster components "
            "stay at the pools' version. Set by `kilonode upgrade`'s control-plane step so the binaries can go "
            "back while it is set; removing it (raising the emulated version) is the upgrade's point of no "
            "return (docs/operations.md, \"Upgrading Kubernetes by one minor\"). Unset: no flag, as before."
        ),
    )
    pause_image: Str = Field(
        default="registry.k8s.io/pause:3.10",
        description=(
            "Preloaded on every node (field notes: a registry quota hit on the pause pull blocks the whole "
            "node); the node image builds it, so nothing is pulled."
        ),
    )
    trusted_image_prefixes: tuple[ImagePrefix, ...] = Field(
        default=(), max_length=16,
        description=(
            "Publishers besides the components' own that pauseImage and nodePools[].preloadImages may name, as "
            "image-name prefixes: a registry of yours whole ('myregistry.azurecr.io'), or an account on a shared "
            "one ('ghcr.io/my-org'). The components' own: registry.k8s.io and mcr.microsoft.com whole (one "
            "publisher curates each), and on quay.io, ghcr.io and nvcr.io only the accounts that publish the "
            "catalogue's images (quay.io/calico, not quay.io: anyone publishes there). The pause image runs in "
            "every pod's sandbox and a preloaded image on every node of its pool: trusting a publisher is a "
            "decision a reviewer should see."
        ),
    )
    network: NetworkConfig = Field(
        default=NetworkConfig(),
        description=(
            "The VNet, its subnets and who may reach the control plane."
        ),
    )
    deployer: DeployerConfig | None = Field(
        default=None,
        description=(
            "Where `pulumi up` runs and how it reaches the apiserver. None: the stack does not say, "
            "`kilonode preflight` (and so `pulumi up`) refuses: no first run could create the in-cluster "
            "objects."
        ),
    )
    etcd: EtcdConfig = Field(default=EtcdConfig(), description="The etcd clusters: main, events, and leases if set.")
    apiserver: ApiserverConfig = Field(
        default=ApiserverConfig(),
        description=(
            "The dedicated kube-apiserver VMs behind an internal load balancer."
        ),
    )
    node_pools: tuple[NodePoolConfig, ...] = Field(
        min_length=1,
        description=(
            "The node pools: each a set of scale sets of one VM size."
        ),
    )
    sysctl: SysctlConfig = Field(
        default=SysctlConfig(),
        description=(
            "Kernel parameters for every node: a profile in sysctl/ plus overrides."
        ),
    )
    boot_image_archives: tuple[BootImageArchiveConfig, ...] = Field(
        default=(),
        max_length=CUSTOM_DATA_BOUNDS["boot_image_archives"],
        description=(
            "Docker-archive tarballs of the images every node needs at its first start (kube-proxy, CoreDNS, "
            "the serving-certificate approver: `kilonode explain` lists them); each one given is baked into "
            "every pool's image, like the pause image (field notes: a registry hiccup at boot must not keep a "
            "node from Ready). An image without an archive is pulled at first start and the image manifest "
            "says so."
        ),
    )
    node_image: NodeImageConfig = Field(
        default=NodeImageConfig(), description="The node image's gallery version and how it is replicated."
    )
    etcd_image: RoleImageConfig = Field(
        default=RoleImageConfig(),
        description="The image every etcd member (of every cluster) boots: `kilonode image build STACK --role etcd`.",
    )
    control_plane_image: RoleImageConfig = Field(
        default=RoleImageConfig(),
        description="The image the apiservers boot: `kilonode image build STACK --role control-plane`.",
    )
    teams: tuple[TeamConfig, ...] = Field(
        default=(),
        description=(
            "Reserved capacity per team (field notes: a team-resource-manager labelled and tainted nodes per "
            "team; low-priority pods tolerate any team's taint to borrow idle capacity). Whole scale sets are "
            "given in order; what is left is shared. `kilonode explain` shows the split."
        ),
    )
    ssh_keys: dict[Str, tuple[SshPublicKey, ...]] = Field(
        default_factory=dict,
        description=(
            "Operators' OpenSSH public keys per role (`etcd-main`, `etcd-events`, `etcd-leases` where the stack "
            "has that cluster, `apiservers`, or a pool's "
            "name): the admin login's authorized keys on that role's machines, reached only from "
            "network.adminCidr. A role not named gets a key of its own whose private half no output holds "
            "(docs/operations.md: getting a shell). Azure sets the keys when it creates a machine: a change "
            "reaches existing VMs only by replacing them (kilonode diff says so)."
        ),
    )
    join_tokens: JoinTokensConfig = Field(
        description=(
            "The node pools' join (bootstrap) tokens: one per pool and generation, each with an expiry at most "
            f"{tokens.JOIN_TOKEN_MAX_DAYS} days ahead. Rotate before `current.expires` (docs/azure.md, \"Node join "
            "credentials\"). Required: every pool's custom data carries a token, and one without an expiry could "
            "join nodes forever."
        ),
    )
    teardown: Bool = Field(
        default=False,
        description=(
            "Arms `pulumi destroy`: the etcd VMs lose `protect` (which otherwise stops any deletion of a member's "
            "data) and the cluster's resource group is tagged kilonode-teardown=armed, which the policy pack's "
            "etcd-protected invariant reads. Set it, review (`kilonode diff` calls it high), `pulumi up`, then "
            "`pulumi destroy --exclude-protected`: the etcd backup account stays, protected, with its snapshots "
            "(docs/operations.md, \"Tearing a cluster down\"). Never set it on a cluster you mean to keep."
        ),
    )
    acknowledge_restart: tuple[Literal["etcd-main", "etcd-events", "etcd-leases", "apiservers"], ...] = Field(
        default=(),
        description=(
            "Groups of control-plane machines that the next `pulumi up` may restart or replace all at "
            "once: without it, an update that would take down a majority of an etcd cluster (quorum lost) "
            "or every apiserver is refused, naming the machines. Set it for that one update, then remove it."
        ),
    )
    admin_generation: Generation = Field(
        default=0,
        description=(
            "The exported admin credential's generation (absent: 0). Raising it by one makes the next `pulumi up` "
            "issue a new admin key and certificate in a new group (kilonode:cluster-admins:g<N>) and point the "
            "kilonode:cluster-admins ClusterRoleBinding at that group alone: every copy of the previous "
            "adminKubeconfig loses its rights at that `pulumi up` (docs/operations.md, \"Revoking the admin "
            "credential\"). No machine is replaced. Never lower it: an old generation's group would be bound again."
        ),
    )
    alerting: AlertingConfig | None = Field(
        default=None,
        description=(
            "Where the cluster's Alertmanager sends alerts: critical ones page (pagerDuty), every one goes to "
            "webhookUrl. None: Alertmanager still runs and shows every alert (its UI and API, Grafana), but "
            "nothing is sent anywhere, and `kilonode preflight` warns that nothing pages."
        ),
    )
    certificate_generations: dict[ControlPlaneHost, Generation] = Field(
        default_factory=dict,
        description=(
            "Certificate renewal, one host at a time: control-plane host (etcd-main-N, etcd-events-N, etcd-leases-N, "
            "apiserver-N) "
            "-> its renewal generation (absent: 0). Raising a host's generation by one makes the next `pulumi up` "
            "issue that host's certificates again with new keys (the CAs stay) and replace that VM alone, which "
            "the restart guard allows one member at a time. An apiserver's generation also renews the client "
            "certificates it holds (its etcd and kubelet clients, its scheduler's and controller manager's). "
            "Leaf certificates last one year and are never renewed behind your back: the "
            "KilonodeCertificateExpiresSoon alert says when (docs/runbooks/certificate-renewal.md). Never lower or "
            "remove a generation: any change renews."
        ),
    )

    # The location as the stack wrote it, where that is not the programmatic name (the plan notes it).
    _location_as_written: str | None = PrivateAttr(default=None)

    # Why a display name is taken rather than refused: ARM compares locations ignoring case and spaces,
    # so `West US 3` deploys as `westus3` with az, ARM templates and Pulumi alike: pulumi-azure-native
    # diffs a location that way ("casing and spaces are not significant": provider/pkg/provider/diff.go,
    # applyAzureSpecificDiff, at 03707ff7; pulumi/pulumi-azure-native#2281: "All location properties in
    # Azure are case- and space- insensitive"; Azure/azure-sdk-for-net#1223, 2015: "Azure locations can
    # be specified without regard to case and with embedded spaces"). A platform engineer pasting the
    # portal's name expects it to work; no Microsoft page found states the rule, so those are the
    # sources (unverified against ARM here). kilonode still writes one spelling,
    # the programmatic one, everywhere: not every consumer compares loosely (App Service compared the raw
    # strings: Azure/azure-rest-api-specs#3747), and resource names, the cloud provider's azure.json and
    # `kilonode diff` must not change with the spelling. Names close to none are refused (checks._location).
    @field_validator("location")
    @classmethod
    def _programmatic_location(cls, value: str) -> str:
        return vm_catalog.region_name(value) or value

    @model_validator(mode="wrap")
    @classmethod
    def _remember_location(cls, data: object, handler: ModelWrapValidatorHandler[ClusterConfig]) -> ClusterConfig:
        config = handler(data)
        written = data.get("location") if isinstance(data, dict) else None
        if isinstance(written, str) and written != config.location:
            config._location_as_written = written
        return config

    @property
    def location_as_written(self) -> str | None:
        """The stack's own spelling of `location`, where it is not the programmatic name."""
        return self._location_as_written

    @field_validator("kubernetes_version")
    @classmethod
    def _supported_version(cls, value: str) -> str:
        return supported_kubernetes_version(value)

    # --emulated-version (KEP-4330; k8s.io/component-base compatibility/registry.go at kubernetes-1.35.4,
    # AddFlags/toVersionMap: major.minor only, a patch refused; k8s.io/apiserver pkg/util/compatibility/
    # version.go at kubernetes-1.35.4, kubeEffectiveVersionFloors: binary-3 up to the binary's minor, no
    # feature gate). kilonode takes only binary-1, the one step `kilonode upgrade` needs: the binaries can be
    # rolled back to that minor while it is set (KEP-4330 README, Goals: "A Kubernetes binary with emulation
    # version set to N does not enable any changes (storage versions, CEL feature, features) that would
    # prevent it from being rolled back to N-1"; the emulated N is the old minor here). Kubelets (and
    # kube-proxy) must not be newer than the apiserver's emulated version (KEP-4330 README, "Skew" and
    # "--emulation-version"), so every pool stays pinned at the old minor while it is set.
    @field_validator("control_plane_emulated_version")
    @classmethod
    def _emulated_form(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"1\.\d+", value):
            raise ValueError(f"must be a minor like '1.34', no patch (got {shown(value)})")
        return value

    # The cross-field rules (one minor below kubernetesVersion, every pool pinned there) are
    # kilonode.config.checks._emulated_version's, so a refusal names this field.

    @model_serializer(mode="wrap")
    def _unset_emulation_unwritten(self, handler: SerializerFunctionWrapHandler) -> dict[str, object]:
        # a stack without the key dumps as it did before the key existed (the rendered config and
        # everything keyed by it stay the same), as EtcdConfig does for `leases`
        data: dict[str, object] = handler(self)
        if self.control_plane_emulated_version is None:
            data.pop("controlPlaneEmulatedVersion", None)
            data.pop("control_plane_emulated_version", None)
        if self.alerting is None:  # likewise (kilonode.k8s.alertmanager: no receiver)
            data.pop("alerting", None)
        return data

    @property
    def in_cluster_version(self) -> str:
        """The Kubernetes version the in-cluster components (kube-proxy, cloud-controller-manager,
        ...) run: kubernetesVersion, or while controlPlaneEmulatedVersion is set the pools' (the oldest,
        all at that minor), which none of them may be newer than (KEP-4330, "Skew")."""
        if self.control_plane_emulated_version is None:
            return self.kubernetes_version
        pinned = {p.kubernetes_version or self.kubernetes_version for p in self.node_pools}
        return min(pinned, key=lambda v: tuple(int(x) for x in v.split(".")))

    @field_validator("pause_image")
    @classmethod
    def _pause_reference(cls, value: str) -> str:
        return image_reference(value)

    @field_validator("zones")
    @classmethod
    def _zones(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if not value or len(set(value)) != len(value) or not all(z in {"1", "2", "3"} for z in value):
            raise ValueError(f"must be distinct Azure zones among '1', '2', '3' (got {shown(list(value))})")
        return value

    @property
    def kubernetes_minor(self) -> int:
        return int(self.kubernetes_version.split(".")[1])
