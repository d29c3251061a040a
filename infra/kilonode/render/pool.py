"""Worker node pool artefacts: kubelet, container runtime, sysctls, preloaded images."""

from __future__ import annotations

import re
import textwrap
from collections.abc import Iterable
from typing import Any

import tomli_w

from kilonode.plan import defaults, wellknown
from kilonode.plan.model import ClusterPlan, NodePoolPlan
from kilonode.render import cni, gpu_metrics, metadata_block, node_ports, pod_traffic
from kilonode.render.cloud_init import LOCAL_SSD_LABEL, user_data
from kilonode.render.common import GENERATED, EndsInVariable, Flag, render_template, systemd_exec, to_json
from kilonode.render.files import USER_DATA, HostFiles, RenderedFile
from kilonode.yamlio import block_yaml

KUBELET_BINARY = "/usr/local/bin/kubelet"
CRI_DOCKERD_BINARY = "/usr/local/bin/cri-dockerd"
KUBELET_CONFIG = "etc/kubernetes/kubelet-config.yaml"
DOCKER_DAEMON_JSON = "etc/docker/daemon.json"
CONTAINERD_CONFIG = "etc/containerd/config.toml"
SYSCTL_FILE = "etc/sysctl.d/90-kilonode.conf"
PRELOAD_MANIFEST = "etc/kilonode/preload-images.json"
PRELOAD_LOADER = "usr/local/lib/kilonode/load-preloaded-images"
PRELOAD_UNIT = "etc/systemd/system/kilonode-preload-images.service"
FABRIC_SCRIPT = "usr/local/lib/kilonode/fabric-label"
FABRIC_UNIT = "etc/systemd/system/kilonode-fabric-label.service"
# The local NVMe disks: what the node image's kilonode-local-disk.service reads, at every boot.
LOCAL_DISK_CONFIG = "etc/kilonode/local-disk.json"
LOCAL_DISK_UNIT = "kilonode-local-disk.service"
# How long the node waits for all its NVMe disks to appear before it gives up (they are
# there within seconds; a missing one never comes, and the unit then fails saying so).
LOCAL_DISK_WAIT_S = 120
# The GPU health agent (kilonode.gpu.agent) on GPU pools: its config, and its unit in the GPU image.
GPU_HEALTH_CONFIG = "etc/kilonode/gpu-health.json"
GPU_HEALTH_UNIT = "kilonode-gpu-health.service"
CRI_DOCKERD_SOCKET = "unix:///run/cri-dockerd.sock"
CONTAINERD_SOCKET = "unix:///run/containerd/containerd.sock"
# GPU pools: the runtime configuration that names the NVIDIA container runtime, beside the
# plain one. The runtime reads it only where the image build installed the NVIDIA container
# toolkit: then, and only then, the image carries a drop-in that starts dockerd with
# `--config-file` / containerd with `--config` pointing here (kilonode.image.build). A default
# runtime naming a binary that is not there would fail every container, the pause container
# and so every pod included; so an image without the toolkit keeps runc and runs pods, without
# GPUs, and its manifest and `kilonode image build` say so.
NVIDIA_RUNTIME = "nvidia"
# The runc wrapper of nvidia-container-toolkit-base (NVIDIA/nvidia-container-toolkit's .deb)
NVIDIA_CONTAINER_RUNTIME = "/usr/bin/nvidia-container-runtime"
DOCKER_DAEMON_NVIDIA_JSON = "etc/docker/daemon-nvidia.json"
CONTAINERD_NVIDIA_CONFIG = "etc/containerd/config-nvidia.toml"


def _nft_guards(plan: ClusterPlan, pool: NodePoolPlan) -> HostFiles:
    """The node's two nftables tables, each loaded before the kubelet, which requires both: pods'
    traffic to the instance metadata service and the WireServer dropped (kilonode.render.
    metadata_block), and the node's unauthenticated ports admitted from the cluster's Prometheus and
    the node alone (kilonode.render.node_ports)."""
    return {
        metadata_block.RULESET: RenderedFile(metadata_block.ruleset()),
        metadata_block.UNIT: RenderedFile(metadata_block.unit()),
        node_ports.RULESET: RenderedFile(node_ports.ruleset(node_ports.node_ports(plan, pool))),
        node_ports.UNIT: RenderedFile(node_ports.unit()),
    }


def runtime_unit(pool: NodePoolPlan) -> str:
    return "docker.service" if pool.runtime == "docker" else "containerd.service"


def cri_unit(pool: NodePoolPlan) -> str:
    """The unit serving kubelet's CRI socket."""
    return "cri-docker.service" if pool.runtime == "docker" else "containerd.service"


def render_pool(plan: ClusterPlan, pool: NodePoolPlan) -> HostFiles:
    files: HostFiles = {
        # CIS 4.1.1/4.1.9: the kubelet's unit and config, root's alone (the kubelet runs as root)
        KUBELET_CONFIG: RenderedFile(kubelet_config(plan, pool), mode=0o600),
        "etc/systemd/system/kubelet.service": RenderedFile(render_template(
            "etc/systemd/system/kubelet.service",
            cri_unit=cri_unit(pool),
            binary=KUBELET_BINARY,
            exec_start=systemd_exec(KUBELET_BINARY, kubelet_flags(pool)),
            fabric_unit=FABRIC_UNIT.rpartition("/")[2] if pool.infiniband else None,
            fabric_env=wellknown.FABRIC_ENV_FILE if pool.infiniband else None,
            metadata_block_unit=metadata_block.UNIT_NAME,
            node_ports_unit=node_ports.UNIT_NAME,
        ), mode=0o600),
        # pods kept from the instance metadata service, the node's own ports kept to their scraper
        **_nft_guards(plan, pool),
        # bytes and packets per pod, by namespace, for Prometheus
        **pod_traffic.pod_traffic_files(),
        f"etc/systemd/system/{runtime_unit(pool)}.d/10-kilonode-local-ssd.conf": RenderedFile(render_template(
            "etc/systemd/system/RUNTIME.service.d/10-kilonode-local-ssd.conf",
            mount_point=pool.local_storage.mount_point,
            setup_unit=_local_disk_unit(pool),
        )),
        SYSCTL_FILE: RenderedFile(sysctl_conf(pool)),
        # Every pool, hostNetwork-only ones too: without a CNI configuration the kubelet
        # reports the node's network as not ready.
        cni.CONFLIST: RenderedFile(cni.azure_conflist_text(plan, pool)),
        PRELOAD_MANIFEST: RenderedFile(to_json([
            {"image": image.image, "path": image.baked_path, "source": image.source}
            for image in pool.preload_images
        ])),
        PRELOAD_LOADER: RenderedFile(preload_loader(pool), mode=0o755),
        PRELOAD_UNIT: RenderedFile(render_template(
            PRELOAD_UNIT, runtime_unit=runtime_unit(pool), loader=f"/{PRELOAD_LOADER}",
        )),
    }
    if _local_disk_unit(pool):
        files[LOCAL_DISK_CONFIG] = RenderedFile(to_json(local_disk_config(pool)))
    if pool.runtime == "docker":
        files[DOCKER_DAEMON_JSON] = RenderedFile(to_json(docker_daemon_json(pool)))
        if pool.gpus_per_node > 0:
            files[DOCKER_DAEMON_NVIDIA_JSON] = RenderedFile(to_json(docker_daemon_json(pool, nvidia=True)))
        files["etc/systemd/system/cri-docker.service"] = RenderedFile(render_template(
            "etc/systemd/system/cri-docker.service",
            binary=CRI_DOCKERD_BINARY,
            exec_start=systemd_exec(CRI_DOCKERD_BINARY, cri_dockerd_flags(pool)),
        ))
    else:
        files[CONTAINERD_CONFIG] = RenderedFile(containerd_config(pool))
        if pool.gpus_per_node > 0:
            files[CONTAINERD_NVIDIA_CONFIG] = RenderedFile(containerd_config(pool, nvidia=True))
    units = [runtime_unit(pool), "kilonode-preload-images.service", metadata_block.UNIT_NAME, node_ports.UNIT_NAME,
             *pod_traffic.UNIT_NAMES, "kubelet.service"]
    if pool.gpus_per_node:
        agent_files, agent_units = gpu_health_files(pool)
        files |= agent_files
        units += agent_units
    if pool.nccl_topology:
        files[wellknown.NCCL_CONF.lstrip("/")] = RenderedFile(nccl_conf(pool.nccl_topology))
    if pool.infiniband:
        files[f"etc/systemd/system/{runtime_unit(pool)}.d/20-kilonode-memlock.conf"] = RenderedFile(render_template(
            "etc/systemd/system/RUNTIME.service.d/20-kilonode-memlock.conf"))
        files[FABRIC_SCRIPT] = RenderedFile(fabric_script(pool), mode=0o755)
        files[FABRIC_UNIT] = RenderedFile(render_template(
            FABRIC_UNIT, script=f"/{FABRIC_SCRIPT}", output=wellknown.FABRIC_ENV_FILE,
        ))
        units.insert(units.index("kubelet.service"), FABRIC_UNIT.rpartition("/")[2])
    if pool.runtime == "docker":
        units.insert(1, "cri-docker.service")
    files[USER_DATA] = RenderedFile(user_data(
        role=f"pool {pool.name} of cluster {plan.cluster}",
        local_disk=pool.local_disk,
        local_disk_alias=pool.disks.local_disk_alias,
        files=files,
        restart_units=[runtime_unit(pool)],
        start_units=units[1:],
        apply_sysctls=True,
        local_disk_unit=_local_disk_unit(pool),
    ))
    return dict(sorted(files.items()))


def _local_disk_unit(pool: NodePoolPlan) -> str | None:
    """The unit that makes the pool's local disk, when the node does it (NVMe) and not cloud-init."""
    return None if pool.local_storage.kind == "device" else LOCAL_DISK_UNIT


def local_disk_config(pool: NodePoolPlan) -> dict[str, Any]:
    """/etc/kilonode/local-disk.json: which disks to assemble, and where to mount them.

    Read by kilonode/node/local_disk_setup.py, the image's local-disk-setup (its docstring says
    what it does with each field)."""
    storage = pool.local_storage
    return {
        "models": list(storage.nvme_models),
        "count": storage.nvme_count,
        # the md array's name in its superblock (several disks only)
        "array": "kilonode-local",
        "filesystem": storage.filesystem,
        "label": LOCAL_SSD_LABEL,
        "mountPoint": storage.mount_point,
        # NVMe controllers probe asynchronously after boot; past this the node refuses
        "diskWaitSeconds": LOCAL_DISK_WAIT_S,
    }


def gpu_health_files(pool: NodePoolPlan) -> tuple[HostFiles, list[str]]:
    """A GPU pool's files and units of the GPU health agent: its config (the unit is in the GPU
    image, node-image/gpu/rootfs), and the socket that answers Prometheus for it."""
    files = {GPU_HEALTH_CONFIG: RenderedFile(to_json(gpu_health_config(pool))), **gpu_metrics.agent_metrics_files()}
    return files, [GPU_HEALTH_UNIT, *gpu_metrics.AGENT_UNITS]


def gpu_health_config(pool: NodePoolPlan) -> dict[str, Any]:
    """/etc/kilonode/gpu-health.json, read by kilonode.gpu.agent.load_config (its fields and
    their checks are there). No nodeName: the agent takes the hostname, lower-cased, as the
    kubelet does when no --hostname-override is given (kubelet_flags gives none). The
    intervals are left to the agent's defaults (kilonode/node/gpu/thresholds.toml [agent], each
    with its reason)."""
    config: dict[str, Any] = {
        "expectGpus": pool.gpus_per_node,
        # the kubelet's own credentials after TLS bootstrap: NodeRestriction lets them patch
        # this Node's status, create Events and list the pods bound to it
        "kubeconfig": wellknown.KUBELET_KUBECONFIG,
    }
    if pool.gpu_model:
        config["gpuModel"] = pool.gpu_model
    if pool.infiniband:
        # its gangs need GPUDirect RDMA (DMA-BUF): the agent's active check proves each GPU's
        # memory registers on each InfiniBand HCA (kilonode.gpu.gpudirect), or takes the node out
        config["expectGpuDirectRdma"] = True
    if pool.infiniband_links:
        # every link the size has, active at its rate (kilonode.gpu.infiniband): a node short of a
        # virtual function, or with a port down or trained to a lower rate, would join the gang
        # and NCCL would run on fewer or slower links
        config["expectInfiniband"] = {"ports": pool.infiniband_links.count, "gbps": pool.infiniband_links.gbps}
        # and the first pass of a boot is reported (the startup taint lifted) only one rescan of the
        # RDMA device plugin after those ports were up, so rdma/ib hands a gang pod every HCA
        # (wellknown.RDMA_PLUGIN_RESCAN_S; the plugin's periodicUpdateInterval, kilonode.k8s.rdma)
        config["rdmaDevicePluginRescanSeconds"] = wellknown.RDMA_PLUGIN_RESCAN_S
    return config


def kubelet_config(plan: ClusterPlan, pool: NodePoolPlan) -> str:
    config: dict[str, Any] = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        # CIS Kubernetes Benchmark 4.2.1-4.2.4: no anonymous access, no AlwaysAllow, no
        # read-only port.
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": wellknown.K8S_CA},
        },
        "authorization": {"mode": "Webhook"},
        "readOnlyPort": 0,
        # CIS 4.2.11/4.2.12: rotate client certificates, bootstrap serving certificates.
        "rotateCertificates": True,
        "serverTLSBootstrap": True,
        # CIS 4.2.12: forward-secret AEAD suites of the benchmark's kubelet list, for TLS 1.2
        # clients (the apiserver and the metrics scrapers are Go and speak TLS 1.3 anyway).
        "tlsCipherSuites": list(defaults.TLS_CIPHER_SUITES),  # AEAD only (CIS 4.2.12)
        # Refuse to start unless the kernel tunables the kubelet checks already hold its values,
        # rather than quietly setting them itself: the node's sysctl profile sets them before the
        # kubelet starts (sysctl/, catalog/contracts.yaml kubelet kernel-tunables), so a node whose
        # kernel says otherwise stays out of the cluster instead of running with rewritten tunables.
        "protectKernelDefaults": True,
        "cgroupDriver": "systemd",
        "containerRuntimeEndpoint": CRI_DOCKERD_SOCKET if pool.runtime == "docker" else CONTAINERD_SOCKET,
        "clusterDomain": "cluster.local",
        "clusterDNS": [str(plan.control_plane.cluster_dns_ip)],
        # what dnsPolicy Default and hostNetwork pods (CoreDNS's upstreams among them) get:
        # the plan's choice and its reason (kilonode.plan.defaults.node KUBELET_RESOLV_CONF)
        "resolvConf": pool.resolv_conf,
        # One pod IP per NIC secondary address, plus the hostNetwork DaemonSet pods, which
        # need none.
        "maxPods": pool.max_pods,
        # 2,500-node post: serialized pulls let one 17 GB image block every other pull.
        "serializeImagePulls": False,
        "maxParallelImagePulls": pool.max_parallel_image_pulls,
        # kilonode.plan.defaults: a chatty training job cannot fill the OS disk.
        "containerLogMaxSize": defaults.CONTAINER_LOG_MAX_SIZE,
        "containerLogMaxFiles": defaults.CONTAINER_LOG_MAX_FILES,
        # CIS 4.2.13: one pod cannot take every PID of the node; sized to training pods'
        # processes times their threads (kilonode.plan.defaults.node POD_PIDS_LIMIT).
        "podPidsLimit": defaults.POD_PIDS_LIMIT,
    }
    if pool.taints:
        config["registerWithTaints"] = [_taint(t) for t in pool.taints]
    return f"# {GENERATED}\n" + block_yaml(config)


def _taint(text: str) -> dict[str, str]:
    key_value, _, effect = text.partition(":")
    key, _, value = key_value.partition("=")
    taint = {"key": key, "effect": effect}
    if value:
        taint["value"] = value
    return taint


def kubelet_flags(pool: NodePoolPlan) -> list[Flag]:
    labels = ",".join(f"{k}={v}" for k, v in sorted(pool.labels.items()))
    # the node's fabric (InfiniBand pools), known at boot only: systemd fills it in from the
    # EnvironmentFile the fabric-label unit writes
    node_labels: str | EndsInVariable = (
        EndsInVariable(f"{labels},{wellknown.FABRIC_LABEL}=", wellknown.FABRIC_ENV_VAR) if pool.infiniband else labels
    )
    return [
        ("config", f"/{KUBELET_CONFIG}"),
        ("kubeconfig", wellknown.KUBELET_KUBECONFIG),
        ("bootstrap-kubeconfig", wellknown.KUBELET_BOOTSTRAP_KUBECONFIG),
        # Node addresses and routes come from Azure (native pod networking).
        ("cloud-provider", "external"),
        ("node-labels", node_labels),
    ]


SHARD_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def fabric_script(pool: NodePoolPlan) -> str:
    """The boot script naming the node's fabric: this role's scale sets (its team's, or the
    shared ones), each name checked so that it is safe as a shell case pattern.

    The scale sets are named `<cluster>-<pool>-<index>` (kilonode.plan.resolve.pools), so the
    script accepts them as a few patterns over runs of indexes (`index_patterns`), not one
    line per scale set: a pool's custom data would otherwise grow ~48 base64 bytes a scale set
    and pass Azure's limit at a few hundred of them (kilonode.azure.custom_data)."""
    team = pool.labels.get(wellknown.TEAM_LABEL)
    shards = [s for s in pool.shards if s.team == team]
    # every shard's name is one prefix and its index (kilonode.plan.resolve.pools.shard_name)
    prefix = shards[0].name.removesuffix(wellknown.shard_index(shards[0].index)) if shards else ""
    for shard in shards:
        if not SHARD_NAME.match(shard.name) or len(shard.name) > 63:
            raise ValueError(f"scale set name {shard.name!r} is not a label value (lowercase, digits, '-'; 63 at most)")
        if shard.name != prefix + wellknown.shard_index(shard.index):
            raise ValueError(f"scale set name {shard.name!r} is not {prefix!r} followed by its index {shard.index}")
    patterns = [prefix + p for p in index_patterns(s.index for s in shards)]
    return render_template(FABRIC_SCRIPT, label=wellknown.FABRIC_LABEL, variable=wellknown.FABRIC_ENV_VAR,
                           patterns=patterns, role=pool.role(team))


def index_patterns(indexes: Iterable[int]) -> list[str]:
    """Shell glob patterns matching exactly the indexes given, each as the shard names write it
    (wellknown.shard_index: three digits at least, more past 999), and no other such string.

    Runs of consecutive indexes become patterns of digit ranges, as in `0[0-6][0-9]` for
    000-069: at most two per digit of the run's width, whatever its length."""
    wanted = sorted(set(indexes))
    if any(i < 0 for i in wanted):
        raise ValueError(f"indexes must not be negative: {wanted}")
    runs: list[tuple[int, int]] = []
    for i in wanted:
        if runs and runs[-1][1] == i - 1:
            runs[-1] = (runs[-1][0], i)
        else:
            runs.append((i, i))
    patterns: list[str] = []
    for low, high in runs:
        # a run split where the written width changes (999 -> 1000)
        while low <= high:
            width = max(wellknown.SHARD_INDEX_DIGITS, len(str(low)))
            top = min(high, 10**width - 1)
            patterns += _range_globs(f"{low:0{width}d}", f"{top:0{width}d}")
            low = top + 1
    return patterns


def _range_globs(low: str, high: str) -> list[str]:
    """Globs for the digit strings from `low` to `high` (same width, low <= high)."""
    if low == high:
        return [low]
    if len(low) == 1:
        return [f"[{low}-{high}]"]
    rest = len(low) - 1
    first, last = low[0], high[0]
    if first == last:
        return [first + g for g in _range_globs(low[1:], high[1:])]
    globs: list[str] = []
    # whole blocks: the first digit's block if `low` starts it, the last's if `high` ends it
    start = int(first) if low[1:] == "0" * rest else int(first) + 1
    end = int(last) if high[1:] == "9" * rest else int(last) - 1
    if start > int(first):
        globs += [first + g for g in _range_globs(low[1:], "9" * rest)]
    if start <= end:
        digits = str(start) if start == end else f"[{start}-{end}]"
        globs.append(digits + "[0-9]" * rest)
    if end < int(last):
        globs += [last + g for g in _range_globs("0" * rest, high[1:])]
    return globs


def docker_daemon_json(pool: NodePoolPlan, *, nvidia: bool = False) -> dict[str, Any]:
    """daemon.json; with `nvidia`, the GPU pool's variant (DOCKER_DAEMON_NVIDIA_JSON): the same
    plus the NVIDIA runtime as Docker's default. Keys as Docker 20.10 reads them (moby
    daemon/config: `runtimes` of api/types.Runtime {`path`, `runtimeArgs`}, `default-runtime`)."""
    config: dict[str, Any] = {
        # 2,500-node post: Docker's root on the instance's local SSD.
        "data-root": pool.runtime_root,
        # 2,500-node post: parallel pulls need overlay2 (not AUFS).
        "storage-driver": "overlay2",
        # 2,500-node post: max-concurrent-downloads 10 for huge images.
        "max-concurrent-downloads": pool.max_concurrent_downloads,
        "exec-opts": ["native.cgroupdriver=systemd"],
        # Semi-stateful pods (field notes): a dockerd restart must not kill them.
        "live-restore": True,
        "log-driver": "json-file",
        # kilonode.plan.defaults, in Docker's units (100Mi -> 100m)
        "log-opts": {
            "max-size": defaults.CONTAINER_LOG_MAX_SIZE.removesuffix("Mi") + "m",
            "max-file": str(defaults.CONTAINER_LOG_MAX_FILES),
        },
    }
    if pool.infiniband:
        # RDMA registers (pins) the memory it sends from: with the default 64 KiB memlock
        # limit, ibv_reg_mr fails and NCCL falls back to sockets. Unlimited, for every container
        # of an InfiniBand node (moby api/types/container Ulimit {Name, Hard, Soft}; -1: unlimited).
        config["default-ulimits"] = {"memlock": {"Name": "memlock", "Hard": -1, "Soft": -1}}
    if nvidia:
        config["runtimes"] = {NVIDIA_RUNTIME: {"path": NVIDIA_CONTAINER_RUNTIME}}
        # the default, not only a named runtime: the device plugin's pod and pods without a
        # runtimeClass (the usual GPU job) get their GPUs through it; cri-dockerd has no
        # per-pod runtime choice of its own. It wraps runc and changes nothing for a container
        # that asks for no GPU.
        config["default-runtime"] = NVIDIA_RUNTIME
    return config


def cri_dockerd_flags(pool: NodePoolPlan) -> list[Flag]:
    return [
        ("container-runtime-endpoint", CRI_DOCKERD_SOCKET),
        ("network-plugin", "cni"),
        # Field notes: the pause image is preloaded; naming it here means no pull.
        ("pod-infra-container-image", pool.pause_image),
        # 2,500-node post: big pulls were cancelled for "lack of progress".
        ("image-pull-progress-deadline", pool.image_pull_progress_deadline),
        # exec, attach and port-forward streams: the kubelet alone calls it, on the URL cri-dockerd
        # hands it; without an address it listens on every address (catalog/listeners.yaml
        # cri-dockerd-streaming), a port any pod could knock on. Port 0: one the kernel picks.
        ("streaming-bind-addr", "127.0.0.1"),
    ]


def containerd_config(pool: NodePoolPlan, *, nvidia: bool = False) -> str:
    """config.toml (version 2); with `nvidia`, the GPU pool's variant (CONTAINERD_NVIDIA_CONFIG):
    the same plus an `nvidia` runtime, the default. Keys as containerd 1.7's CRI plugin reads
    them (pkg/cri/config: ContainerdConfig `default_runtime_name`, `runtimes`; Runtime
    `runtime_type`, `options`, decoded into runc's options, whose `BinaryName` names the binary
    the runc v2 shim runs instead of runc).

    A runc v2 runtime with BinaryName, not CDI: containerd's CDI support (`enable_cdi`) exists
    only from 1.7, while an image without the pinned 1.7 runs Debian's 1.6; CDI also needs a
    spec generated on the node after the driver loads (`nvidia-ctk cdi generate`) and the
    device plugin switched to CDI. The runtime wrapper works with 1.6 and 1.7 and the device
    plugin's default (environment variable) device list."""
    cri = "io.containerd.grpc.v1.cri"
    runtimes: dict[str, Any] = {
        "runc": {
            "runtime_type": "io.containerd.runc.v2",
            "options": {"SystemdCgroup": True},
        },
    }
    if nvidia:
        runtimes[NVIDIA_RUNTIME] = {
            "runtime_type": "io.containerd.runc.v2",
            "options": {"BinaryName": NVIDIA_CONTAINER_RUNTIME, "SystemdCgroup": True},
        }
    config = {
        # containerd 1.6/1.7 configuration schema.
        "version": 2,
        # 2,500-node post: the runtime's root on the instance's local SSD.
        "root": pool.runtime_root,
        "state": "/run/containerd",
        "plugins": {
            cri: {
                # Field notes: the preloaded pause image, so no node pulls it.
                "sandbox_image": pool.pause_image,
                # exec, attach and port-forward streams for the kubelet alone (catalog/listeners.yaml
                # containerd-streaming): loopback, whatever the release's default
                "stream_server_address": "127.0.0.1",
                # 2,500-node post: 10 concurrent layer downloads (containerd's default is 3).
                "max_concurrent_downloads": pool.max_concurrent_downloads,
                # 2,500-node post: don't cancel slow pulls of huge images (containerd 1.7+).
                "image_pull_progress_timeout": pool.image_pull_progress_deadline,
                "containerd": {
                    "snapshotter": "overlayfs",
                    # GPU pools' variant: pods without a runtimeClass (the device plugin's, the
                    # GPU jobs) get their GPUs through the NVIDIA runtime, as with Docker
                    "default_runtime_name": NVIDIA_RUNTIME if nvidia else "runc",
                    "runtimes": runtimes,
                },
            },
        },
    }
    return f"# {GENERATED}\n" + tomli_w.dumps(config)


def sysctl_conf(pool: NodePoolPlan) -> str:
    settings = [
        {
            "name": s.name,
            "value": s.value,
            "reason": "\n# ".join(textwrap.wrap(s.reason, 86)),
        }
        for s in pool.sysctls
    ]
    return render_template(SYSCTL_FILE, sysctls=settings)


def preload_loader(pool: NodePoolPlan) -> str:
    if pool.runtime == "docker":
        present = 'docker image inspect "$image" >/dev/null 2>&1'
        load = 'docker load -i "$archive"'
    else:
        present = '[ -n "$(ctr -n k8s.io images ls -q "name==$image")" ]'
        load = 'ctr -n k8s.io images import "$archive"'
    return render_template(
        PRELOAD_LOADER,
        runtime=pool.runtime,
        present_command=present,
        load_command=load,
        images=pool.preload_images,
    )


def nccl_conf(family: str) -> str:
    """/etc/nccl.conf (NCCL reads it as KEY=VALUE lines) as Azure's HPC images write it for the
    size's family (kilonode.plan.wellknown.nccl_host_settings says which and where they were
    read). It serves NCCL run on the host (fabric checks); a container reads its own files, so
    a job mounts the topology file and takes the same settings as its environment
    (kilonode.k8s.nccl_job, docs/nccl-job.md)."""
    lines = [f"# {GENERATED}", *(f"{key}={value}" for key, value in wellknown.nccl_host_settings(family))]
    return "\n".join(lines) + "\n"
