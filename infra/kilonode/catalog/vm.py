"""Azure facts kilonode checks a stack against, kept as data with their sources.

vm_sizes.yaml: per VM size its vCPUs, memory, GPUs and model, InfiniBand, local temp disk,
local NVMe disks, NICs, accelerated networking and Hyper-V generations, each row citing
its Microsoft Learn size page. regions.yaml: the public-cloud region names `location`
takes. Pools derive their GPU count, InfiniBand and local-disk expectations from here, and
a stack that contradicts its size is refused.
"""

from __future__ import annotations

from functools import cache

from pydantic import Field, model_validator

from kilonode.catalog import CATALOG_DIR, Row, load

# The temp (resource) disk as cloud-init's udev rules name it on Azure: the LocalDiskConfig
# default, so a size without a temp disk needs another device.
AZURE_TEMP_DISK = "/dev/disk/cloud/azure_resource"
# How a size's local NVMe disks (`nvmeDisks`) present themselves to Linux: the model string
# of their NVMe controller, one controller per disk. "Microsoft NVMe Direct Disk" is the
# first generation (e.g. LSv2/LSv3), "... v2" the v6 and newer sizes; the OS and
# data disks are SCSI, or "MSFT NVMe Accelerator v1" on NVMe-attached sizes, so never chosen.
# Source: Azure/azure-vm-utils doc/disk-identification.md, "Azure NVMe Controllers".
AZURE_NVME_LOCAL_MODELS = ("Microsoft NVMe Direct Disk", "Microsoft NVMe Direct Disk v2")


class NvmeDisks(Row):
    count: int = Field(ge=1)
    size_gib: int = Field(ge=1)


class InfinibandLinks(Row):
    count: int = Field(ge=1)
    gbps: int = Field(ge=1)


class VmSize(Row):
    vcpus: int = Field(ge=1)
    memory_gib: float = Field(gt=0)
    gpus: int = Field(ge=0)
    gpu_model: str | None
    infiniband: bool
    temp_disk_gib: int = Field(ge=0)
    nvme_disks: NvmeDisks | None
    max_nics: int = Field(ge=1)
    # the InfiniBand links of an InfiniBand size, as its page states them (count x Gb/s
    # signalling rate): what a two-node NCCL gang's bus bandwidth is bounded by; None where not
    # recorded
    infiniband_links: InfinibandLinks | None = None
    accelerated_networking: bool
    generations: tuple[int, ...]
    # The NCCL topology family Azure publishes for the size (Azure/azhpc-images topology/
    # <family>-topo.xml, chosen per size by components/setup_sku_customizations.sh): NCCL
    # cannot discover the virtualised PCIe/NVLink/IB layout of these VMs on its own.
    nccl_topology: str | None = None
    # the vCPU quota family Azure counts the size against (vm_sizes.yaml's header cites it)
    quota_family: str | None = None
    # Whether the size's GPUs are joined by NVSwitch (an HGX board): then NVIDIA Fabric Manager
    # must run, at the driver's exact version, before CUDA can initialise (the GPU image enables
    # nvidia-fabricmanager.service on such sizes only). Every GPU size states it, citing its page.
    nvswitch: bool | None = None
    # Whether the size supports encryption at host (Resource SKUs capability EncryptionAtHostSupported).
    # Microsoft publishes the list only through that API ("Use the Azure CLI to enable end-to-end
    # encryption using encryption at host", Supported VM sizes: "can be pulled programmatically"),
    # not on the size pages: null (unknown) unless a first-party page says; vm_sizes.yaml's header.
    encryption_at_host: bool | None = None
    source: str = Field(pattern=r"^https://")

    @model_validator(mode="after")
    def _nvswitch_stated(self) -> VmSize:
        if self.gpus > 0 and self.nvswitch is None:
            raise ValueError("a GPU size must state nvswitch: true|false (its page says whether its GPUs "
                             "are joined by NVSwitch)")
        if self.gpus == 0 and self.nvswitch:
            raise ValueError("nvswitch: true on a size without GPUs")
        return self


class _SizeFile(Row):
    sizes: dict[str, VmSize]


class _RegionFile(Row):
    source: str = Field(pattern=r"^https://")
    regions: tuple[str, ...]


@cache
def vm_sizes() -> dict[str, VmSize]:
    return load(_SizeFile, CATALOG_DIR / "vm_sizes.yaml").sizes


@cache
def _region_file() -> _RegionFile:
    return load(_RegionFile, CATALOG_DIR / "regions.yaml")


def regions() -> tuple[str, ...]:
    return _region_file().regions


def regions_source() -> str:
    return _region_file().source


def vm_size(name: str) -> VmSize | None:
    return vm_sizes().get(name)


def gpus_of(vm: str, explicit: int | None) -> int:
    """A pool's GPUs per node: as given, else the size's (0 for a size not in the catalogue)."""
    if explicit is not None:
        return explicit
    size = vm_size(vm)
    return size.gpus if size else 0


def nvswitch_of(vm: str) -> bool:
    """Whether the size's GPUs are joined by NVSwitch (Fabric Manager must run); False for a size
    not in the catalogue."""
    size = vm_size(vm)
    return bool(size and size.nvswitch)


def infiniband_of(vm: str, explicit: bool | None) -> bool:
    """Whether a pool uses InfiniBand: as given, else whether its size has it."""
    if explicit is not None:
        return explicit
    size = vm_size(vm)
    return bool(size and size.infiniband)
