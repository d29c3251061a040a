"""Azure's Premium SSD tiers, with their source: what a managed disk of a given size is
provisioned (and billed) as. Read by the plan, which sizes the OS disks and carries the table
on for preflight."""

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
