"""Azure facts kilonode checks a stack against, kept as data with their sources.

vm_sizes.yaml: per VM size its vCPUs, memory, GPUs and model, InfiniBand, local temp disk,
local NVMe disks, NICs, accelerated networking and Hyper-V generations, each row citing
its Microsoft Learn size page. regions.yaml: the public-cloud regions, programmatic name and
display name, that `location` takes. vm_regions.yaml: where a size is sold, per region, with the
dated source of each row. Pools derive their GPU count, InfiniBand and local-disk expectations
from here, and a stack that contradicts its size, or asks for it where it is not sold, is refused.
"""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path
from typing import Literal

import yaml
from pydantic import Field, ValidationError, model_validator
from pydantic.alias_generators import to_camel

from kilonode.catalog import CATALOG_DIR, Row, load, read
from kilonode.paths import PROJECT_VM_SIZES, user_project

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
    regions: dict[str, str]  # programmatic name -> display name


class RegionSource(Row):
    """Where a vm_regions.yaml row was read: what a refusal quotes."""

    title: str
    url: str = Field(pattern=r"^https://")
    file: str  # the page's source file, repository@commit path
    date: str  # the page's own date
    read: str  # when kilonode read it


class SizeRegions(Row):
    # `all`, the regions that sell the size, or None: not recorded (not checked)
    regions: Literal["all"] | tuple[str, ...] | None
    source: str | None


class _AvailabilityFile(Row):
    sources: dict[str, RegionSource]
    sizes: dict[str, SizeRegions]

    @model_validator(mode="after")
    def _known(self) -> _AvailabilityFile:
        known = set(regions())
        for name, row in self.sizes.items():
            if name not in vm_sizes():
                raise ValueError(f"{name}: not a size in vm_sizes.yaml")
            if (row.regions is None) != (row.source is None):
                raise ValueError(f"{name}: a recorded row needs its source, and only a recorded row has one")
            if row.source is not None and row.source not in self.sources:
                raise ValueError(f"{name}: source {row.source!r} is not among sources")
            if isinstance(row.regions, tuple) and not set(row.regions) <= known:
                raise ValueError(f"{name}: {sorted(set(row.regions) - known)} not in regions.yaml")
        return self


class CatalogError(RuntimeError):
    """A project's catalogue addition is malformed or contradicts the packaged catalogue (one
    line: the CLI prints it and stops, exit 2; `pulumi up` stops with it)."""


def vm_sizes() -> dict[str, VmSize]:
    """The packaged sizes, with those the user's project adds (<project>/catalog/vm_sizes.yaml,
    kilonode.paths.user_project) where kilonode runs in one."""
    return _sizes_in(os.getcwd())


@cache
def _sizes_in(cwd: str) -> dict[str, VmSize]:
    # per working directory: a walk up the tree on each of the planner's many calls would cost
    project = user_project(Path(cwd))
    added = project / PROJECT_VM_SIZES if project is not None else None
    if added is None or not added.is_file():
        return _packaged_sizes()
    return _merged(_packaged_sizes(), added)


@cache
def _packaged_sizes() -> dict[str, VmSize]:
    return load(_SizeFile, CATALOG_DIR / "vm_sizes.yaml").sizes


def _merged(packaged: dict[str, VmSize], added: Path) -> dict[str, VmSize]:
    """The packaged sizes and the project's. A size both name must agree on every value the
    packaged row states: the project's row may state what kilonode's leaves unknown (null, e.g.
    encryptionAtHost, quotaFamily), never change a stated value (a packaged row that changes in
    an upgrade is then refused, never silently shadowed)."""
    try:
        raw = read(added)
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as error:
        raise CatalogError(f"{added}: cannot be read as YAML: {' '.join(str(error).split())}") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("sizes", {}), dict) or set(raw) - {"sizes"}:
        raise CatalogError(f"{added}: must be a mapping with one key, `sizes:` (size name -> row), like "
                           "kilonode's own catalog/vm_sizes.yaml")
    try:
        sizes = _SizeFile.model_validate({"sizes": raw.get("sizes") or {}}).sizes
    except ValidationError as error:
        problems = "; ".join(f"sizes.{'.'.join(map(str, e['loc'][1:]))}: {e['msg']}" for e in error.errors())
        raise CatalogError(f"{added}: {problems}") from None
    conflicts = [f"{name}.{to_camel(field)}" for name, row in sorted(sizes.items()) if name in packaged
                 for field, known in packaged[name] if known is not None and getattr(row, field) != known]
    if conflicts:
        raise CatalogError(f"{added}: {', '.join(conflicts)} differ from kilonode's own catalogue (a project "
                           "row may only state what kilonode's leaves null); copy kilonode's values, or if "
                           "Microsoft's page says otherwise, report it to kilonode")
    return packaged | sizes


@cache
def _region_file() -> _RegionFile:
    return load(_RegionFile, CATALOG_DIR / "regions.yaml")


def regions() -> tuple[str, ...]:
    """The programmatic names."""
    return tuple(_region_file().regions)


def region_display_names() -> dict[str, str]:
    """Programmatic name -> display name ("westus3" -> "West US 3")."""
    return _region_file().regions


def regions_source() -> str:
    return _region_file().source


def region_name(written: str) -> str | None:
    """The programmatic name of a region written either way, in any case and spacing ("West US 3",
    "westus 3", "WestUS3" -> "westus3"), as ARM compares them; None for no known region."""
    squeezed = "".join(written.split()).lower()
    by_display = {"".join(d.split()).lower(): name for name, d in region_display_names().items()}
    return squeezed if squeezed in region_display_names() else by_display.get(squeezed)


@cache
def _availability() -> _AvailabilityFile:
    return load(_AvailabilityFile, CATALOG_DIR / "vm_regions.yaml")


def size_regions(name: str) -> tuple[SizeRegions, RegionSource] | None:
    """Where the catalogue says a size is sold, with the row's source; None where it does not say."""
    file = _availability()
    row = file.sizes.get(name)
    if row is None or row.regions is None or row.source is None:
        return None
    return row, file.sources[row.source]


def sold_in(name: str, region: str) -> bool | None:
    """Whether the catalogue says the size is sold in the region; None where it does not say."""
    found = size_regions(name)
    if found is None:
        return None
    regions_ = found[0].regions
    return regions_ == "all" or region in (regions_ or ())


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
