"""A complete NCCL all-reduce gang over InfiniBand, generated from the plan (`kilonode gpu
nccl-job`, docs/nccl-job.md): nothing in it is hand-written, so nothing can drift from the nodes.

Kubernetes offers no way here to add the NCCL topology and environment to a user's pods (a
MutatingAdmissionPolicy is not in every supported minor, and kilonode runs no mutating webhook),
so kilonode writes the job instead. From a ClusterPlan and one InfiniBand GPU pool it builds:

- a ConfigMap with the benchmark (kilonode.k8s.nccl_allreduce, this package's own file);
- a PodGroup (minMember = nodes, minResources = their GPUs) for the gang scheduler;
- a headless Service whose records exist before the pods are ready (publishNotReadyAddresses),
  so pod 0's name resolves as soon as it has an address: torchrun's rendezvous;
- an Indexed Job of one pod per node: the pool's nodeSelector (and its NCCL topology label, and
  the team's label for a team's job), a toleration for each taint the pool's nodes register
  with (the stack's pool taints, and the team's taint for a team's job; not the GPU health
  agent's, so a node runs the job only once its GPUs passed their checks), the fabric affinity
  of kilonode.k8s.gang, every GPU of the node and the RDMA resource, /dev/shm in memory, the
  topology file mounted read-only from a second ConfigMap at the path NCCL_TOPO_FILE names, the
  family's NCCL environment (kilonode.plan.wellknown.nccl_pod_environment), and torchrun with
  a static rendezvous at pod 0.

Admitted under PodSecurity `baseline` (the default of every unlabelled namespace,
kilonode.k8s.pod_security): no hostPath volume and no added capability. The topology file comes
in a ConfigMap, not from the node, and IPC_LOCK is not needed (container() says why).

Pure: plan and the topology file's text in, plain Kubernetes objects out (the CLI finds and
verifies the file, kilonode.image.topology, and prints the objects as YAML). No Pulumi.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kilonode.digest import sha256_text
from kilonode.k8s.gang import (
    CROSS_FABRIC_ANNOTATION,
    GANG_SCHEDULER_NAME,
    POD_GROUP_API_VERSION,
    POD_GROUP_LABEL,
    fabric_affinity,
)
from kilonode.node.gpu import protocol
from kilonode.plan import defaults, wellknown
from kilonode.plan.model import ClusterPlan, NodePoolPlan
from kilonode.yamlio import block_yaml

SCRIPT = Path(__file__).with_name("nccl_allreduce.py")
SCRIPT_KEY = "allreduce.py"
SCRIPT_DIR = "/opt/kilonode-nccl"
TOPOLOGY_KEY = "topo.xml"
# on the topology ConfigMap: which pinned file it carries (node-image/binaries.toml), and its digest
TOPOLOGY_COMPONENT_ANNOTATION = "kilonode.io/nccl-topology-component"
TOPOLOGY_SHA256_ANNOTATION = "kilonode.io/nccl-topology-sha256"
POOL_LABEL = "kilonode.io/pool"
# the Job controller's label on its pods (batch.kubernetes.io/job-name, Kubernetes >= 1.27)
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
LABELS = {"app.kubernetes.io/managed-by": "kilonode", "app.kubernetes.io/part-of": "kilonode-nccl-job"}
# Taints no job tolerates: the GPU health agent's (a node takes GPU work only once it passed).
HEALTH_TAINTS = frozenset({protocol.STARTUP_TAINT, protocol.FAULT_TAINT, protocol.CHECK_TAINT})
# NCCL's log, for reading the output (docs/nccl-job.md): INIT says which transport each ring
# uses (NET/IB or NET/Socket) and NET lists the HCAs NCCL opened.
NCCL_DEBUG = (("NCCL_DEBUG", "INFO"), ("NCCL_DEBUG_SUBSYS", "INIT,NET"))
# The network NCCL uses, named (NCCL_NET, NCCL 2.10+: "forces NCCL to use a specific network"
# and never fall back to another): its own InfiniBand transport, the path this job's GPUDirect RDMA
# is traced on (NVIDIA/nccl v2.18.3-1 src/transport/net_ib.cc, DMA-BUF), not whichever external
# net plugin the image may carry, and never a silent fallback to sockets: a pod without its HCAs
# then fails at NCCL's init instead of running at TCP speed.
# NCCL_NET picks the first network of that name, and a net plugin the image carries
# (libnccl-net.so) comes before NCCL's own; the nccl-rdma-sharp plugin also calls itself "IB" and
# finds GPUDirect RDMA only through nvidia-peermem, which these nodes lack. NCCL_NET_PLUGIN=none
# makes 2.18.3 dlopen libnccl-net-none.so, which no image has, and use its internal transport
# (NVIDIA/nccl v2.18.3-1 src/net.cc:170-180: "No plugin found, using internal implementation").
FABRIC_NCCL = (("NCCL_NET", "IB"), ("NCCL_NET_PLUGIN", "none"))
# A gang across fabrics: InfiniBand does not reach from one scale set to another, so NCCL's IB
# transport would fail to connect the pods of different fabrics; it runs over sockets instead.
CROSS_FABRIC_NCCL = (("NCCL_IB_DISABLE", "1"), ("NCCL_NET", "Socket"))
# A gang over InfiniBand fails unless every NCCL channel between its nodes says /GDRDMA
# (kilonode.k8s.nccl_allreduce reads NCCL's log: NVIDIA/nccl v2.18.3-1 src/transport/net.cc:186-190
# and 227-228 write `via NET/IB/<dev>/GDRDMA` only where the connection uses GPUDirect RDMA). NCCL
# loads the container's libibverbs, not the node's: without ibv_reg_dmabuf_mr (rdma-core older than
# 34) it turns GPUDirect RDMA off silently, and the node's checks cannot see the image's library.
REQUIRE_GDRDMA = (("REQUIRE_GDRDMA", "1"),)
# ... and unless every rank's NCCL opened as many InfiniBand HCAs as the size has links (the plan's
# infiniband_links count): NCCL lists the ports it opened in one line, `NET/IB : Using [0]<dev>:<port>/IB
# ...` (NVIDIA/nccl v2.18.3-1 src/transport/net_ib.cc:258-265), and a pod that got only some of the
# node's HCAs (the RDMA device plugin hands out its last scan, kilonode.k8s.rdma) runs on fewer links.
REQUIRE_IB_HCAS = "REQUIRE_IB_HCAS"


class NcclJobError(ValueError):
    """The request cannot be met by the plan: the message says why and what would."""


@dataclass(frozen=True)
class NcclTopology:
    """The pool's NCCL topology file for the job's ConfigMap: its pinned component
    (node-image/binaries.toml `nccl-topology-<family>`), the pinned sha256, and its text; None
    for the digest-only rendering (docs/nccl-job.md), which names the file instead of carrying
    it and is for reading, not for applying."""

    component: str
    sha256: str
    content: str | None = None

    def data(self) -> str:
        if self.content is not None:
            return self.content
        return (f"<!-- digest-only rendering: here kilonode gpu nccl-job puts {self.component}, sha256 {self.sha256} "
                "(docs/nccl-job.md) -->\n")


@dataclass(frozen=True)
class NcclJobRequest:
    pool: str
    nodes: int = defaults.NCCL_JOB_NODES
    namespace: str = "default"
    team: str | None = None  # run on this team's reserved nodes (the pool's shared ones when None)
    cross_fabric: bool = False  # let the gang span fabrics (no RDMA between them)
    name: str = "nccl-allreduce"


def gpu_pool(plan: ClusterPlan, name: str) -> NodePoolPlan:
    """The named pool, if NCCL over InfiniBand can run on it, or an error saying why not."""
    pools = {pool.name: pool for pool in plan.node_pools}
    usable = [p.name for p in plan.node_pools if p.gpus_per_node and p.infiniband and p.nccl_topology]
    hint = f"InfiniBand GPU pools of {plan.cluster}: {', '.join(usable) or 'none'}"
    pool = pools.get(name)
    if pool is None:
        raise NcclJobError(f"no pool is named {name!r}; {hint}")
    if not pool.gpus_per_node:
        raise NcclJobError(f"pool {name!r} ({pool.vm_size}) has no GPUs; {hint}")
    if not pool.infiniband:
        raise NcclJobError(f"pool {name!r} has no InfiniBand (infiniband: false): NCCL would run over TCP on the "
                           f"front-end NIC; {hint}")
    if not pool.nccl_topology:
        raise NcclJobError(f"pool {name!r} ({pool.vm_size}): the size catalogue names no NCCL topology for it, so "
                           f"there is no topology file on its nodes to mount; {hint}")
    return pool


def fabric_sizes(pool: NodePoolPlan, team: str | None) -> dict[str, int]:
    """The fabrics (scale sets) a job of `team` (None: shared capacity) may use, and the most
    nodes each can hold: an autoscaled shard's node-group ceiling, else its planned capacity."""
    ceilings = {g.shard: g.max_size for g in pool.autoscaling.node_groups} if pool.autoscaling else {}
    return {s.name: max(s.capacity, ceilings.get(s.name, 0)) for s in pool.shards if s.team == team}


def check_placement(pool: NodePoolPlan, request: NcclJobRequest) -> None:
    """A gang that fits: the team's (or the shared) shards exist, and the gang fits in one of
    them unless it may cross fabrics."""
    if request.nodes < 1:
        raise NcclJobError(f"a gang needs at least one node, not {request.nodes}")
    if request.team is not None and request.team not in pool.teams:
        raise NcclJobError(f"team {request.team!r} has no nodes in pool {pool.name!r}; "
                           f"its teams: {', '.join(pool.teams) or 'none'}")
    fabrics = fabric_sizes(pool, request.team)
    if not fabrics:
        raise NcclJobError(f"every node of pool {pool.name!r} is reserved for a team ({', '.join(pool.teams)}): "
                           "pass --team with one of them")
    whose = f"team {request.team}'s scale sets" if request.team else "the shared scale sets"
    largest, total = max(fabrics.values()), sum(fabrics.values())
    if request.nodes > total:
        raise NcclJobError(f"{request.nodes} nodes: {whose} of pool {pool.name!r} hold {total} in all")
    if request.nodes > largest and not request.cross_fabric:
        raise NcclJobError(
            f"{request.nodes} nodes do not fit in one InfiniBand fabric: the largest of {whose} of pool "
            f"{pool.name!r} holds {largest} (RDMA reaches only the VMs of one scale set); ask for at most "
            f"{largest}, or pass --cross-fabric to run the gang across fabrics over TCP, without InfiniBand")


def tolerations(pool: NodePoolPlan, team: str | None) -> list[dict[str, str]]:
    """One toleration for each taint the pool's nodes (the team's, for a team) register with,
    read from the plan, less the GPU health agent's."""
    found = [wellknown.toleration_of(taint) for taint in pool.registration(team).taints]
    return [t for t in found if t["key"] not in HEALTH_TAINTS]


def node_selector(pool: NodePoolPlan, team: str | None) -> dict[str, str]:
    family = pool.nccl_topology
    assert family is not None
    selector = {POOL_LABEL: pool.name, wellknown.NCCL_TOPOLOGY_LABEL: family}
    if team is not None:
        selector[wellknown.TEAM_LABEL] = team
    return selector


def requests(pool: NodePoolPlan, rdma: bool = True) -> dict[str, Any]:
    """Every GPU and (unless the gang crosses fabrics) the RDMA devices; a share of the node's
    vCPUs and memory where the size catalogue knows them (defaults.NCCL_JOB_NODE_SHARE_PERCENT
    says why)."""
    share = defaults.NCCL_JOB_NODE_SHARE_PERCENT
    sized: dict[str, Any] = {}
    if pool.vcpus is not None:
        sized["cpu"] = str(pool.vcpus * share // 100)
    if pool.memory_gib is not None:
        sized["memory"] = f"{int(pool.memory_gib * share // 100)}Gi"
    return {**sized, wellknown.GPU_RESOURCE: pool.gpus_per_node, **({wellknown.RDMA_RESOURCE: 1} if rdma else {})}


def launcher(request: NcclJobRequest, gpus: int) -> str:
    """The container's shell: wait for pod 0's name, then torchrun with a static rendezvous
    there, this pod's rank its Indexed Job completion index. An Indexed Job's pod is named
    `$(job-name)-$(index)` in DNS under its subdomain's headless Service and finds its index in
    JOB_COMPLETION_INDEX (kubernetes/website content/en/docs/concepts/workloads/controllers/
    job.md, "Completion mode"). torchrun's flags in their underscore spelling, which every
    torchrun accepts (torch/distributed/run.py: --nnodes, --nproc_per_node, --node_rank,
    --master_addr, --master_port; static rendezvous by default)."""
    master = f"{request.name}-0.{request.name}"
    return "\n".join([
        "set -eu",
        f"timeout {defaults.NCCL_JOB_DNS_WAIT_S} sh -c 'until getent hosts {master} >/dev/null; do sleep 2; done'",
        f"exec torchrun --nnodes={request.nodes} --nproc_per_node={gpus} --node_rank=\"$JOB_COMPLETION_INDEX\" "
        f"--master_addr={master} --master_port={defaults.NCCL_JOB_MASTER_PORT} {SCRIPT_DIR}/{SCRIPT_KEY}",
    ]) + "\n"


def environment(family: str, cross_fabric: bool, infiniband_gbps: int | None = None,
                nodes: int = defaults.NCCL_JOB_NODES, infiniband_hcas: int | None = None) -> list[dict[str, str]]:
    """The container's environment; a gang over InfiniBand (more than one node, one fabric) is
    judged against the pool's links, must use GPUDirect RDMA on every NCCL channel and, where the
    size's link count is known (`infiniband_hcas`), open that many HCAs on every rank."""
    over_infiniband = not cross_fabric and nodes > 1
    pairs = (*wellknown.nccl_pod_environment(family), *(CROSS_FABRIC_NCCL if cross_fabric else FABRIC_NCCL),
             *NCCL_DEBUG,
             ("ALLREDUCE_MAX_BYTES", str(defaults.NCCL_JOB_MAX_BYTES)),
             *(() if cross_fabric else judged_against(infiniband_gbps)),
             *(REQUIRE_GDRDMA if over_infiniband else ()),
             *(((REQUIRE_IB_HCAS, str(infiniband_hcas)),) if over_infiniband and infiniband_hcas else ()))
    return [{"name": key, "value": value} for key, value in pairs]


def judged_against(infiniband_gbps: int | None) -> tuple[tuple[str, str], ...]:
    """What the benchmark judges its peak against (kilonode.k8s.nccl_allreduce.verdict): the pool's
    network ceiling in GB/s (its InfiniBand links' Gb/s / 8) and the floor below which the run
    fails (defaults.NCCL_JOB_BUSBW_FLOOR_SHARE of it); nothing for a size whose links the
    catalogue does not record, or a gang across fabrics (sockets: no InfiniBand figure holds)."""
    if not infiniband_gbps:
        return ()
    ceiling = infiniband_gbps / 8
    return (("NETWORK_CEILING_GBPS", f"{ceiling:g}"),
            ("BUSBW_FLOOR_GBPS", f"{ceiling * defaults.NCCL_JOB_BUSBW_FLOOR_SHARE:g}"))


def container(plan: ClusterPlan, pool: NodePoolPlan, request: NcclJobRequest) -> dict[str, Any]:
    family = pool.nccl_topology
    assert family is not None
    wants = requests(pool, rdma=not request.cross_fabric)
    extended = {k: v for k, v in wants.items() if k in (wellknown.GPU_RESOURCE, wellknown.RDMA_RESOURCE)}
    return {
        "name": "allreduce",
        "image": plan.components.nccl_benchmark_image,
        "command": ["bash", "-c", launcher(request, pool.gpus_per_node)],
        "env": environment(family, request.cross_fabric, pool.infiniband_gbps, request.nodes,
                           pool.infiniband_links.count if pool.infiniband_links else None),
        # extended resources are requested through limits (requests equal them)
        "resources": {"requests": wants, "limits": extended},
        # No securityContext adding IPC_LOCK (PodSecurity baseline refuses it): RDMA registers
        # (pins) NCCL's buffers, which the kernel bounds by RLIMIT_MEMLOCK unless the process
        # has CAP_IPC_LOCK, and every container on an InfiniBand pool already starts with
        # memlock unlimited (kilonode.render.pool: Docker's daemon.json `default-ulimits`,
        # the runtime unit's LimitMEMLOCK=infinity; preflight's `rdma` check proves it).
        "volumeMounts": [
            {"name": "dshm", "mountPath": "/dev/shm"},
            # subPath: the one file at the path NCCL_TOPO_FILE names, the directory left as is
            {"name": "nccl-topology", "mountPath": wellknown.nccl_topology_file(family), "subPath": TOPOLOGY_KEY,
             "readOnly": True},
            {"name": "benchmark", "mountPath": SCRIPT_DIR, "readOnly": True},
        ],
    }


def topology_config_map_name(request: NcclJobRequest) -> str:
    return f"{request.name}-nccl-topology"


def check_topology(pool: NodePoolPlan, topology: NcclTopology) -> None:
    """The file is the pool's family's, and its text is the pinned one."""
    assert pool.nccl_topology is not None
    wanted = wellknown.nccl_topology_component(pool.nccl_topology)
    if topology.component != wanted:
        raise NcclJobError(f"pool {pool.name!r} needs {wanted}, not {topology.component}")
    if topology.content is not None and (got := sha256_text(topology.content)) != topology.sha256:
        raise NcclJobError(f"the {topology.component} text given has sha256 {got}, not the pinned {topology.sha256}")


def topology_config_map(request: NcclJobRequest, topology: NcclTopology) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": topology_config_map_name(request), "namespace": request.namespace,
                         "labels": dict(LABELS),
                         "annotations": {TOPOLOGY_COMPONENT_ANNOTATION: topology.component,
                                         TOPOLOGY_SHA256_ANNOTATION: topology.sha256}},
            "data": {TOPOLOGY_KEY: topology.data()}}


def volumes(request: NcclJobRequest) -> list[dict[str, Any]]:
    return [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": defaults.NCCL_JOB_SHM_SIZE}},
        # the pinned file itself, not the node's copy by hostPath: PodSecurity baseline
        # refuses hostPath volumes in the namespaces users run in
        {"name": "nccl-topology", "configMap": {"name": topology_config_map_name(request)}},
        {"name": "benchmark", "configMap": {"name": f"{request.name}-benchmark"}},
    ]


def pod_spec(plan: ClusterPlan, pool: NodePoolPlan, request: NcclJobRequest) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "schedulerName": GANG_SCHEDULER_NAME,
        "subdomain": request.name,
        "restartPolicy": "Never",
        "nodeSelector": node_selector(pool, request.team),
    }
    if wanted := tolerations(pool, request.team):
        spec["tolerations"] = wanted
    if not request.cross_fabric:
        spec["affinity"] = fabric_affinity(request.name)
    return {**spec, "containers": [container(plan, pool, request)], "volumes": volumes(request)}


def job(plan: ClusterPlan, pool: NodePoolPlan, request: NcclJobRequest) -> dict[str, Any]:
    template_meta: dict[str, Any] = {"labels": {**LABELS, POD_GROUP_LABEL: request.name}}
    if request.cross_fabric:
        template_meta["annotations"] = {CROSS_FABRIC_ANNOTATION: "true"}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": request.name, "namespace": request.namespace, "labels": dict(LABELS)},
        "spec": {
            "completionMode": "Indexed",
            "completions": request.nodes,
            "parallelism": request.nodes,
            # one rank lost is the whole all-reduce lost: fail the Job, never restart one pod
            "backoffLimit": 0,
            "template": {"metadata": template_meta, "spec": pod_spec(plan, pool, request)},
        },
    }


def nccl_job(plan: ClusterPlan, request: NcclJobRequest, topology: NcclTopology) -> list[dict[str, Any]]:
    """The ConfigMaps (benchmark, topology file), PodGroup, headless Service and Indexed Job of
    an all-reduce gang, in the order to apply them (the PodGroup before its pods)."""
    pool = gpu_pool(plan, request.pool)
    check_placement(pool, request)
    check_topology(pool, topology)
    meta = {"namespace": request.namespace, "labels": dict(LABELS)}
    return [
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"{request.name}-benchmark", **meta},
         "data": {SCRIPT_KEY: SCRIPT.read_text()}},
        topology_config_map(request, topology),
        {"apiVersion": POD_GROUP_API_VERSION, "kind": "PodGroup", "metadata": {"name": request.name, **meta},
         "spec": {"minMember": request.nodes,
                  "minResources": {wellknown.GPU_RESOURCE: request.nodes * pool.gpus_per_node}}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": request.name, **meta},
         "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                  "selector": {JOB_NAME_LABEL: request.name}}},
        job(plan, pool, request),
    ]


def to_yaml(objects: list[dict[str, Any]]) -> str:
    """The objects as one multi-document YAML stream, for `kubectl apply -f -`."""
    return "---\n".join(block_yaml(obj) for obj in objects)
