"""Each role's disks: the managed OS disk's size (kilonode.plan.defaults.disks, with its reason)
and the local SSD its VM size brings; the apiserver's audit log placed on that local SSD and
its retention sized to it."""

from __future__ import annotations

from collections.abc import Iterable

from kilonode.catalog.disks import PREMIUM_SSD_TIERS, premium_ssd_tier
from kilonode.catalog.vm import AZURE_TEMP_DISK, vm_size
from kilonode.config.model import ApiserverConfig, LocalDiskConfig
from kilonode.plan import defaults
from kilonode.plan.model import AuditLogPlan, DisksPlan, DiskTierPlan, LocalStoragePlan

# cloud-init's Azure datasource names the temp disk so (DataSourceAzure.py at 22.4.2,
# BUILTIN_DS_CONFIG disk_aliases: {"ephemeral0": "/dev/disk/cloud/azure_resource"})
AZURE_TEMP_DISK_ALIAS = "ephemeral0"


def disk_tiers() -> tuple[DiskTierPlan, ...]:
    return tuple(DiskTierPlan(name=t.name, size_gib=t.size_gib, iops=t.iops, mbps=t.mbps) for t in PREMIUM_SSD_TIERS)


def _disks(os_disk_gib: int, local_disk_gib: int | None, why: str, temp_disk: bool) -> DisksPlan:
    tier = premium_ssd_tier(os_disk_gib)
    return DisksPlan(
        os_disk_gib=os_disk_gib, os_disk_tier=tier.name, os_disk_iops=tier.iops, local_disk_gib=local_disk_gib,
        local_disk_alias=AZURE_TEMP_DISK_ALIAS if temp_disk else None,
        reason=f"{why}; {tier.name}: {tier.size_gib} GiB, {tier.iops:,} IOPS",
    )


def temp_disk_gib(sizes: Iterable[str], disk: LocalDiskConfig) -> int | None:
    """The temp disk every one of `sizes` has (the smallest), where the local disk is Azure's
    temp disk; None when the stack names another device or a size is not in the catalogue."""
    if disk.device != AZURE_TEMP_DISK:
        return None
    found = [vm_size(name) for name in sizes]
    return min(size.temp_disk_gib for size in found if size) if found and all(found) else None  # type: ignore[union-attr]


def etcd_disks(sizes: Iterable[str], disk: LocalDiskConfig) -> DisksPlan:
    return _disks(defaults.ETCD_OS_DISK_GIB, temp_disk_gib(sizes, disk),
                  "etcd member: the OS and the journal only, its data and snapshots on the local SSD",
                  disk.device == AZURE_TEMP_DISK)


def apiserver_disks(api: ApiserverConfig) -> DisksPlan:
    return _disks(defaults.APISERVER_OS_DISK_GIB, temp_disk_gib([api.vm_size], api.local_disk),
                  "apiserver: the OS and the journal only, the audit log on the local SSD",
                  api.local_disk.device == AZURE_TEMP_DISK)


def pool_disks(size_name: str, gpus: int, storage: LocalStoragePlan, monitoring: bool = False) -> DisksPlan:
    size = vm_size(size_name)
    if storage.kind != "device":
        local = size.nvme_disks.count * size.nvme_disks.size_gib if size and size.nvme_disks else None
    else:
        local = size.temp_disk_gib if size and storage.device == AZURE_TEMP_DISK else None
    # an NVMe pool's temp disk is the datasource's too: its default /mnt mount is dropped by name
    temp = storage.kind != "device" or storage.device == AZURE_TEMP_DISK
    if gpus:
        return _disks(defaults.GPU_POOL_OS_DISK_GIB, local,
                      "GPU pool: the kubelet root (emptyDirs of training jobs), pod logs and the journal", temp)
    if monitoring:
        return _disks(defaults.MONITORING_POOL_OS_DISK_GIB, local,
                      "monitoring pool: pod logs and the journal; Prometheus' data is on a disk of its own, sized "
                      "from this one (kilonode.plan.resolve.monitoring)",
                      temp)
    return _disks(defaults.POOL_OS_DISK_GIB, local, "pool: the kubelet root (emptyDirs), pod logs and the journal",
                  temp)


def audit_log_plan(api: ApiserverConfig, disks: DisksPlan) -> AuditLogPlan:
    """The stack's audit log settings, with what it leaves open decided here: the file on the
    local SSD (the OS disk is small and shared with the journal; the 7,500-node shape rotates
    10 x 100 MB in minutes), and as many files as AUDIT_DISK_SHARE of that disk holds."""
    audit = api.audit_log
    path = audit.path or f"{api.local_disk.mount_point}/{defaults.AUDIT_DIR}/audit.log"
    if audit.max_backup is not None:
        backups, why = audit.max_backup, "maxBackup from the stack"
    elif disks.local_disk_gib:
        fit = int(disks.local_disk_gib * 1024 * defaults.AUDIT_DISK_SHARE // audit.max_size_mb) - 1
        backups = max(defaults.AUDIT_MIN_BACKUPS, fit)
        why = (f"{backups:,} backups + the live file of {audit.max_size_mb} MB fill "
               f"{defaults.AUDIT_DISK_SHARE:.0%} of the {disks.local_disk_gib:,} GiB local disk")
    else:
        backups, why = defaults.AUDIT_MIN_BACKUPS, "the local disk's size is unknown: CIS 1.2.18's 10 backups"
    return AuditLogPlan(path=path, max_age_days=audit.max_age_days, max_backup=backups,
                        max_size_mb=audit.max_size_mb, reason=why)
