"""disks: every writer on every machine has a disk with room and IOPS for the stack's size, with
the arithmetic shown.

Where each writer writes is read from the render (etcd's `--data-dir`, the apiserver's
`--audit-log-*` flags, Docker's `data-root` and log options, containerd's `root`, the kubelet's
`containerLogMax*`), and which disk backs that path from the same render: a path below a mount
point the role's cloud-init `mounts` (or its local-disk.json, for NVMe disks) names is on the
local SSD, whose size is the VM size's (the plan's `disks.local_disk_gib`); anything else is on
the OS disk, whose size is the graph's `storageProfile.osDisk.diskSizeGB` of the role's VMs or
scale sets. Without `diskSizeGB` Azure makes the OS disk the image's size (node-image/recipe.toml
`[disk] size_mib`, 4 GiB): a P1 Premium SSD of 120 IOPS (Azure's tier table,
kilonode.catalog.disks), on which the image itself already sits.

Writers, per role:
- etcd members: the data directory must be on the local SSD (2,500-node post: ~200 us fsync
  there, ~2 ms on a managed disk; etcd's hardware guide asks 500 sequential IOPS for a heavily
  loaded cluster), and the backend quota must fit that disk.
- apiservers: the audit log must be on the local SSD (the model's placement; the OS disk is
  small and shared with the journal), its files ((maxbackup + 1) x maxsize) must fit its disk,
  and at the stack's size (an estimate: ~0.3 audited requests per node per second, ~1 KiB each,
  spread over the apiservers; kilonode.plan.defaults.disks) the finding says how long one file
  and the whole retention last; a retention shorter than `--audit-log-maxage` is a warning.
- pools: the container runtime's root (images, writable layers, and with Docker the container
  logs) must be on the local SSD; the kubelet root (/var/lib/kubelet: emptyDirs, pod volumes)
  and, with containerd, the pod logs (/var/log/pods: containerLogMaxSize x containerLogMaxFiles
  x maxPods) stay on the OS disk, beside the journal (journald's default cap: 10% of the disk, at
  most 4 GiB) and the image (whose size includes the preloaded image archives). The kubelet
  evicts pods below 10% free (nodefs.available), so the room is 90% of the disk, less the image
  and the journal; a log budget larger than that room is a break.
- every role: an OS disk without `diskSizeGB` is a break (the image's size leaves no room), and
  so is an explicit one smaller than the image (Azure refuses it) or one that leaves no room once
  the image and the journal are on it (on a node: above the kubelet's 10% eviction threshold);
  every unit that writes below a local-SSD mount (its unit or drop-in names a path there, or a
  runtime whose root is there) must fail when the mount is missing (`AssertPathIsMountPoint=`):
  with a `Condition...=` it is skipped silently, with neither it fills the OS disk under the
  empty mount point.

What it cannot see: the real write rates of a workload (emptyDir use is the job's own), and
ephemeral OS disks (none are used: `diffDiskSettings` would carve the OS disk out of the same
temp disk the local SSD uses).
"""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache

from kilonode.image.recipe import load_recipe
from kilonode.plan import defaults
from kilonode.plan.model import ClusterPlan, DisksPlan, DiskTierPlan
from kilonode.preflight.model import Finding, Inputs, Resource
from kilonode.preflight.nodes import KUBELET_CONFIG, unit_exec_args
from kilonode.yamlio import load_yaml

NAME = "disks"
TITLE = "every writer (etcd, audit log, journal, kubelet root, runtime root, logs) has a disk with room and IOPS"

VM = "azure-native:compute:VirtualMachine"
VMSS = "azure-native:compute:VirtualMachineScaleSet"
ROLE_TAG = "kilonode-role"
ETCD_UNIT = "etc/systemd/system/etcd.service"
APISERVER_UNIT = "etc/systemd/system/kube-apiserver.service"
DOCKER_DAEMON_JSON = "etc/docker/daemon.json"
CONTAINERD_CONFIG = "etc/containerd/config.toml"
LOCAL_DISK_CONFIG = "etc/kilonode/local-disk.json"
# the kubelet's default --root-dir and where it has CRI runtimes write pod logs (containerd)
KUBELET_ROOT = "/var/lib/kubelet"
POD_LOGS = "/var/log/pods"
# etcd's hardware guide (etcd.io/docs/v3.5/op-guide/hardware/#disks): "Typically 50 sequential
# IOPS (e.g., a 7200 RPM disk) is required. For heavily loaded clusters, 500 sequential IOPS (e.g.,
# a typical local SSD or a high performance virtualized block device) is recommended."
ETCD_HEAVY_LOAD_IOPS = 500
# journald.conf(5), SystemMaxUse=: "defaults to 10% ... of the size of the respective file
# system, but ... capped to 4G". The images set no journald limit of their own.
JOURNAL_SHARE = 0.10
JOURNAL_CAP_GIB = 4.0
# The kubelet's default evictionHard nodefs.available<10% (DefaultEvictionHard,
# pkg/kubelet/apis/config/v1beta1/defaults_linux.go): below 10% free on the kubelet root's
# filesystem it evicts pods.
KUBELET_NODEFS_EVICTION_SHARE = 0.10
GIB = 1024**3
MIB = 1024**2
_UNITS = {"": 1, "k": 1024, "ki": 1024, "m": MIB, "mi": MIB, "g": GIB, "gi": GIB}


@cache
def image_gib() -> float:
    """The node images' disk (recipe.toml [disk] size_mib): an OS disk without diskSizeGB."""
    return load_recipe().disk_size_mib / 1024


def size_bytes(text: str) -> int:
    """A Kubernetes quantity (100Mi) or a Docker size (100m: binary units), in bytes."""
    match = re.fullmatch(r"(\d+)\s*([kKmMgG]i?)?[bB]?", text.strip())
    if not match:
        raise ValueError(f"not a size: {text!r}")
    return int(match[1]) * _UNITS[(match[2] or "").lower()]


def flags_of(unit: str) -> dict[str, str]:
    """--name=value flags of a unit's ExecStart."""
    return dict(word[2:].partition("=")[::2] for word in unit_exec_args(unit)[1:] if word.startswith("--"))


def premium_ssd_tier(tiers: tuple[DiskTierPlan, ...], size_gib: float) -> DiskTierPlan:
    """The tier a managed disk of `size_gib` is provisioned as (the plan's copy of Azure's table:
    a size between two tiers performs as the larger)."""
    return next((t for t in tiers if size_gib <= t.size_gib), tiers[-1])


@dataclass(frozen=True)
class HostDisks:
    host: str
    os_disk_gib: float
    os_disk_given: bool  # diskSizeGB set; False: the image's size
    mounts: tuple[str, ...]  # local-SSD mount points
    local_gib: int | None
    tiers: tuple[DiskTierPlan, ...]

    @property
    def os_tier(self) -> DiskTierPlan:
        return premium_ssd_tier(self.tiers, self.os_disk_gib)

    @property
    def tier(self) -> str:
        return f"{self.os_tier.name} ({self.os_tier.iops:,} IOPS)"

    def on_local(self, path: str) -> str | None:
        """The local-SSD mount point `path` is below, None: the OS disk."""
        return next((m for m in self.mounts if path == m or path.startswith(m.rstrip("/") + "/")), None)

    def os_disk(self) -> str:
        given = "diskSizeGB" if self.os_disk_given else "no diskSizeGB: the image's size"
        return f"the {self.os_disk_gib:g} GiB OS disk ({given}, {self.tier})"

    def journal_gib(self) -> float:
        return min(self.os_disk_gib * JOURNAL_SHARE, JOURNAL_CAP_GIB)


def _mounts(files: Mapping[str, str]) -> tuple[str, ...]:
    found: list[str] = []
    data = load_yaml(files.get("user-data", "")) or {}
    found += [str(entry[1]) for entry in data.get("mounts") or [] if len(entry) > 1 and entry[1]]
    if LOCAL_DISK_CONFIG in files:
        found.append(json.loads(files[LOCAL_DISK_CONFIG])["mountPoint"])
    return tuple(found)


def _os_disk_of(resources: Iterable[Resource]) -> float | None:
    """The smallest diskSizeGB of the role's VMs or scale sets; None: one has none."""
    sizes = []
    for r in resources:
        profile = r.inputs.get("virtualMachineProfile") or r.inputs
        size = ((profile.get("storageProfile") or {}).get("osDisk") or {}).get("diskSizeGB")
        if size is None:
            return None
        sizes.append(float(size))
    return min(sizes) if sizes else None


def _machines(inputs: Inputs, host: str) -> list[Resource]:
    """The VMs (etcd members, apiservers: by their planned VM name) or scale sets (pools: by
    their role tag) that run the host role."""
    plan = inputs.plan
    vm_names = {m.name: m.vm_name for c in plan.etcd_clusters for m in c.members}
    vm_names |= {i.name: i.vm_name for i in plan.control_plane.instances}
    if host in vm_names:
        return [r for r in inputs.of_type(VM) if r.inputs.get("vmName") == vm_names[host]]
    return [r for r in inputs.of_type(VMSS) if (r.inputs.get("tags") or {}).get(ROLE_TAG) == host]


def _plan_disks(plan: ClusterPlan, host: str) -> DisksPlan | None:
    for cluster in plan.etcd_clusters:
        if any(m.name == host for m in cluster.members):
            return cluster.disks
    if any(i.name == host for i in plan.control_plane.instances):
        return plan.control_plane.disks
    return next((p.disks for p in plan.node_pools if host == p.role() or host.startswith(p.role() + ".")), None)


def host_disks(inputs: Inputs, host: str) -> HostDisks | None:
    machines = _machines(inputs, host)
    planned = _plan_disks(inputs.plan, host)
    if not machines or planned is None:
        return None  # a role the graph does not create (or the plan does not know): nothing to size
    size = _os_disk_of(machines)
    return HostDisks(host, size if size is not None else image_gib(), size is not None,
                     _mounts(inputs.host_files(host)), planned.local_disk_gib, inputs.plan.disk_tiers)


def check(inputs: Inputs) -> list[Finding]:
    findings: list[Finding] = []
    for host in inputs.hosts():
        disks = host_disks(inputs, host)
        if disks is None:
            continue
        files = inputs.host_files(host)
        if not disks.os_disk_given:
            findings.append(_no_disk_size(disks))
        else:
            findings += _too_small(disks, KUBELET_CONFIG in files)
        if ETCD_UNIT in files:
            findings += _etcd(inputs.plan, disks, files[ETCD_UNIT])
        if APISERVER_UNIT in files:
            findings += _audit(inputs.plan, disks, files[APISERVER_UNIT])
        if KUBELET_CONFIG in files:
            findings += _pool(disks, files)
        findings += _mount_asserted(disks, files)
    return findings


UNIT_FILE = re.compile(r"^etc/systemd/system/(?P<unit>[^/]+\.service)(?:\.d/[^/]+\.conf)?$")
# The runtimes keep their root in their own config, not in their unit (kilonode.render).
RUNTIME_ROOTS = {"docker.service": ("etc/docker/daemon.json", re.compile(r'"data-root":\s*"([^"]+)"')),
                 "containerd.service": ("etc/containerd/config.toml", re.compile(r'^root\s*=\s*"([^"]+)"', re.M))}


def _mount_asserted(disks: HostDisks, files: Mapping[str, str]) -> list[Finding]:
    """Every unit that writes below a local-SSD mount (its unit text names a path there, or it is
    a runtime whose root is there) fails when the mount is missing: `AssertPathIsMountPoint=`.
    A `Condition...=` instead skips the unit silently (systemd.unit(5): a failed condition is
    not a failure), so etcd, the runtime and with it the kubelet would just not run, or a unit
    without either would fill the OS disk under the empty mount point."""
    units: dict[str, str] = {}
    for path, text in sorted(files.items()):
        found = UNIT_FILE.match(path)
        if found:
            units[found["unit"]] = units.get(found["unit"], "") + "\n" + text
    findings = []
    for unit, text in units.items():
        written = {m for m in disks.mounts if re.search(rf"{re.escape(m.rstrip('/'))}/", text)}
        if unit in RUNTIME_ROOTS:
            config, root = RUNTIME_ROOTS[unit]
            match = root.search(files.get(config, ""))
            mount = disks.on_local(match.group(1)) if match else None
            written |= {mount} if mount else set()
        for mount in sorted(written):
            if re.search(rf"^AssertPathIsMountPoint={re.escape(mount)}$", text, re.M):
                continue
            skipped = re.search(rf"^Condition\w+={re.escape(mount)}", text, re.M)
            findings.append(Finding(
                NAME, "break", f"{disks.host}: {unit}",
                f"it writes below {mount} (the local SSD) but "
                + ("only skips by a Condition when the mount is missing: the unit silently does not run, and "
                   "`systemctl status` shows no failure" if skipped else
                   "nothing stops it when the mount is missing: it fills the OS disk under the empty mount point"),
                f"give the unit (or a drop-in) RequiresMountsFor={mount} and AssertPathIsMountPoint={mount}",
            ))
    return findings


def _no_disk_size(disks: HostDisks) -> Finding:
    return Finding(
        NAME, "break", disks.host,
        f"its OS disk has no diskSizeGB, so Azure makes it the image's {image_gib():g} GiB, a {disks.tier} Premium "
        f"SSD, on which the image already sits: the journal ({disks.journal_gib():.1f} GiB at journald's 10% cap), "
        "the kubelet root and pod logs fill it within hours, and sustained writes drop to the tier's base IOPS "
        "once its 30-minute burst credits are spent",
        "set storageProfile.osDisk.diskSizeGB on the role's VMs / scale sets (kilonode.plan.defaults.disks sizes "
        f"each role; tiers: {', '.join(f'{t.name} {t.size_gib} GiB {t.iops} IOPS' for t in disks.tiers[5:8])})",
    )


def _too_small(disks: HostDisks, kubelet: bool) -> list[Finding]:
    """An explicit diskSizeGB below the image's size is refused by Azure at creation (an OS disk
    is never smaller than its image); one that holds the image but leaves no room beside the
    journal (and, on a node, above the kubelet's 10% eviction threshold) is full at first boot."""
    usable = disks.os_disk_gib * (1 - KUBELET_NODEFS_EVICTION_SHARE) if kubelet else disks.os_disk_gib
    room = usable - image_gib() - disks.journal_gib()
    if room > 0:
        return []
    below_image = disks.os_disk_gib < image_gib()
    arithmetic = (f"{disks.os_disk_gib:g}{' x 90% (the kubelet evicts below 10% free)' if kubelet else ''} - "
                  f"{image_gib():g} image - {disks.journal_gib():.1f} journal = {room:,.1f} GiB")
    return [Finding(
        NAME, "break", disks.host,
        (f"its OS disk's diskSizeGB {disks.os_disk_gib:g} is smaller than the {image_gib():g} GiB image: Azure refuses "
         "to create the machines (an OS disk cannot be smaller than its image)" if below_image else
         f"its OS disk leaves no room once the image and the journal are on it: {arithmetic}; "
         + ("the kubelet reports disk pressure and evicts every pod at first boot" if kubelet else
            "the first writes after boot fail (ENOSPC)")),
        "raise storageProfile.osDisk.diskSizeGB (remove the stack's override: kilonode.plan.defaults.disks sizes each "
        "role)",
    )]


def _etcd(plan: ClusterPlan, disks: HostDisks, unit: str) -> list[Finding]:
    flags = flags_of(unit)
    data_dir = flags.get("data-dir", "")
    quota = int(flags.get("quota-backend-bytes", "0"))
    mount = disks.on_local(data_dir)
    if mount is None:
        iops = disks.os_tier.iops
        return [Finding(
            NAME, "break", disks.host,
            f"etcd's data directory {data_dir} is on {disks.os_disk()}, not the local SSD: every write waits for "
            f"an fsync on a managed disk (~2 ms, against ~200 us on the local SSD; 2,500-node post), and {iops:,} "
            f"IOPS {'<' if iops < ETCD_HEAVY_LOAD_IOPS else 'vs'} the {ETCD_HEAVY_LOAD_IOPS} sequential IOPS "
            "etcd's hardware guide asks for a heavily loaded cluster: leader elections and apiserver timeouts "
            "under load",
            "put --data-dir below the local-SSD mount (the plan's etcd data_dir is <localDisk.mountPoint>/etcd)",
        )]
    if disks.local_gib is not None and quota > disks.local_gib * GIB:
        return [Finding(
            NAME, "break", disks.host,
            f"etcd's backend quota {quota / GIB:g} GiB > the {disks.local_gib:,} GiB local SSD at {mount}: the "
            "database fills the disk before it reaches its quota, and etcd stops with ENOSPC, not NOSPACE alarm",
            "lower etcd quotaBackendBytes or choose a vmSize with a larger temp disk",
        )]
    return []


def _audit(plan: ClusterPlan, disks: HostDisks, unit: str) -> list[Finding]:
    flags = flags_of(unit)
    path = flags.get("audit-log-path")
    if not path or path == "-":
        return []
    size_mb = int(flags.get("audit-log-maxsize", "100"))
    backups = int(flags.get("audit-log-maxbackup", "0"))
    max_age_days = int(flags.get("audit-log-maxage", "0"))
    kept = (backups + 1) * size_mb * MIB
    apiservers = max(len(plan.control_plane.instances), 1)
    rate = plan.most_nodes * defaults.AUDIT_REQUESTS_PER_NODE_PER_S * defaults.AUDIT_EVENT_BYTES / apiservers
    per_file_s = size_mb * MIB / rate if rate else float("inf")
    covered_s = kept / rate if rate else float("inf")
    arithmetic = (
        f"{plan.most_nodes:,} nodes x {defaults.AUDIT_REQUESTS_PER_NODE_PER_S} requests/s x "
        f"{defaults.AUDIT_EVENT_BYTES} B / {apiservers} apiservers = {rate / 1024:,.0f} KiB/s per apiserver: one "
        f"{size_mb} MB file lasts {_duration(per_file_s)}, {backups + 1:,} files ({kept / GIB:,.1f} GiB) "
        f"{_duration(covered_s)}"
    )
    mount = disks.on_local(path)
    findings = []
    if mount is None:
        room = disks.os_disk_gib - image_gib() - disks.journal_gib()
        findings.append(Finding(
            NAME, "break", disks.host,
            f"the audit log {path} is on {disks.os_disk()}, not the apiserver's local SSD, beside the journal "
            f"({room:,.1f} GiB left after the image and the journal); {arithmetic}",
            "leave apiserver.auditLog.path unset (the plan puts it below the local-disk mount) or name a path "
            "below apiserver.localDisk.mountPoint",
        ))
    elif disks.local_gib is not None and kept > disks.local_gib * GIB:
        findings.append(Finding(
            NAME, "break", disks.host,
            f"the audit files kept, {backups + 1:,} x {size_mb} MB = {kept / GIB:,.1f} GiB, exceed the "
            f"{disks.local_gib:,} GiB local SSD at {mount}: the apiserver fails its writes once it is full "
            f"and, with a blocking audit backend, its requests; {arithmetic}",
            "leave apiserver.auditLog.maxBackup unset (the plan sizes it to half the local disk) or lower it",
        ))
    if max_age_days and covered_s < max_age_days * 86400:
        findings.append(Finding(
            NAME, "warn", disks.host,
            f"the audit files cover about {_duration(covered_s)}, less than --audit-log-maxage={max_age_days} days: "
            f"{arithmetic} (an estimate, kilonode.plan.defaults.disks)",
            "ship the audit log off the machine (a log agent) if investigations need the whole maxage",
        ))
    return findings


def _pool(disks: HostDisks, files: Mapping[str, str]) -> list[Finding]:
    kubelet = load_yaml(files[KUBELET_CONFIG]) or {}
    max_pods = int(kubelet.get("maxPods", 110))
    findings = []
    if DOCKER_DAEMON_JSON in files:
        daemon = json.loads(files[DOCKER_DAEMON_JSON])
        root = daemon.get("data-root", "/var/lib/docker")
        opts = daemon.get("log-opts") or {}
        log_size, log_files = size_bytes(opts.get("max-size", "0")), int(opts.get("max-file", "1"))
        logs_at, logs_what = root, "Docker's json-file logs (daemon.json log-opts)"
    else:
        root = tomllib.loads(files.get(CONTAINERD_CONFIG, "")).get("root", "/var/lib/containerd")
        log_size = size_bytes(str(kubelet.get("containerLogMaxSize", "10Mi")))
        log_files = int(kubelet.get("containerLogMaxFiles", 5))
        logs_at, logs_what = POD_LOGS, "the kubelet's pod logs (containerLogMaxSize x containerLogMaxFiles)"
    if disks.on_local(root) is None:
        findings.append(Finding(
            NAME, "break", disks.host,
            f"the container runtime's root {root} (images, writable layers) is on {disks.os_disk()}: a few GPU "
            "images of 10-20 GB fill it, and every pull and layer write shares its IOPS with the kubelet and the "
            "journal",
            "put the runtime root below the local-SSD mount "
            "(the plan's runtime_root is <localDisk.mountPoint>/<runtime>)",
        ))
    logs = log_size * log_files * max_pods  # at least one container per pod
    local = disks.on_local(logs_at)
    if local is None:
        room = disks.os_disk_gib * (1 - KUBELET_NODEFS_EVICTION_SHARE) - image_gib() - disks.journal_gib()
        arithmetic = (f"{logs_what}: {log_size / MIB:g} MiB x {log_files} x {max_pods} pods = {logs / GIB:,.1f} GiB "
                      f"in {logs_at}, vs room on {disks.os_disk()} beside the kubelet root {KUBELET_ROOT}: "
                      f"{disks.os_disk_gib:g} x 90% (the kubelet evicts below 10% free) - {image_gib():g} image - "
                      f"{disks.journal_gib():.1f} journal = {room:,.1f} GiB")
        if logs > room * GIB:
            findings.append(Finding(
                NAME, "break", disks.host,
                f"the container log budget does not fit the kubelet root's disk: {arithmetic}; the kubelet evicts "
                "the node's pods for disk pressure before the logs rotate",
                "lower containerLogMaxSize/containerLogMaxFiles or raise the pool's OS disk "
                "(kilonode.plan.defaults.disks)",
            ))
    elif disks.local_gib is not None and logs > disks.local_gib * GIB:
        findings.append(Finding(
            NAME, "break", disks.host,
            f"{logs_what}: {log_size / MIB:g} MiB x {log_files} x {max_pods} pods = {logs / GIB:,.1f} GiB > the "
            f"{disks.local_gib:,} GiB local SSD at {local}",
            "lower the log size or file count",
        ))
    return findings


def _duration(seconds: float) -> str:
    if seconds == float("inf"):
        return "forever"
    for unit, span in (("days", 86400), ("h", 3600), ("min", 60)):
        if seconds >= span:
            return f"{seconds / span:,.1f} {unit}"
    return f"{seconds:.0f} s"
