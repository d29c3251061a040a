"""Disk facts the plan and preflight size against, each with its source: Azure's Premium SSD
tiers, and the upstream defaults that decide how much of a disk a writer takes."""

from __future__ import annotations

from dataclasses import dataclass

PREMIUM_SSD_SOURCE = (
    "MicrosoftDocs/azure-docs includes/disk-storage-premium-ssd-sizes.md (ms.date 03/16/2023), the table of "
    "https://learn.microsoft.com/azure/virtual-machines/disks-types#premium-ssd-size"
)


@dataclass(frozen=True)
class DiskTier:
    name: str  # P10
    size_gib: int
    iops: int  # base provisioned IOPS (P1-P20 burst to 3,500 for up to 30 min on credits)
    mbps: int  # base provisioned throughput, MB/s


# A disk whose size falls between two tiers is billed and performs as the larger one.
PREMIUM_SSD_TIERS: tuple[DiskTier, ...] = (
    DiskTier("P1", 4, 120, 25),
    DiskTier("P2", 8, 120, 25),
    DiskTier("P3", 16, 120, 25),
    DiskTier("P4", 32, 120, 25),
    DiskTier("P6", 64, 240, 50),
    DiskTier("P10", 128, 500, 100),
    DiskTier("P15", 256, 1100, 125),
    DiskTier("P20", 512, 2300, 150),
    DiskTier("P30", 1024, 5000, 200),
    DiskTier("P40", 2048, 7500, 250),
)


def premium_ssd_tier(size_gib: float) -> DiskTier:
    """The Premium SSD tier a managed disk of `size_gib` is provisioned (and performs) as."""
    for tier in PREMIUM_SSD_TIERS:
        if size_gib <= tier.size_gib:
            return tier
    return PREMIUM_SSD_TIERS[-1]


# etcd's hardware guide (etcd.io/docs/v3.5/op-guide/hardware/#disks): "Typically 50 sequential
# IOPS (e.g., a 7200 RPM disk) is required. For heavily loaded clusters, 500 sequential IOPS (e.g.,
# a typical local SSD or a high performance virtualized block device) is recommended."
ETCD_HEAVY_LOAD_IOPS = 500

# journald.conf(5), SystemMaxUse=: "defaults to 10% ... of the size of the respective file
# system, but ... capped to 4G". The images set no journald limit of their own.
JOURNAL_SHARE = 0.10
JOURNAL_CAP_GIB = 4.0

# The kubelet's default evictionHard nodefs.available<10% (DefaultEvictionHard,
# pkg/kubelet/apis/config/v1beta1/defaults_linux.go):
# below 10% free on the kubelet root's filesystem it evicts pods.
KUBELET_NODEFS_EVICTION_SHARE = 0.10
