"""What a GPU node reports, read from the outputs the health agent collects (on the node) or
that support recorded (off the node, `kilonode gpu-health --from DIR`), laid out as:

    nvidia-smi-q.xml    `nvidia-smi -q -x`                         (required)
    dmesg-xid.txt       the kernel log's NVIDIA lines (NVRM, Xid)  (optional)
    nvml.json           NVML readings (nvidia-ml-py), NVLink state (optional)
    burn.json           the active check's figures                 (optional)

Parsing only: no rule lives here (kilonode.gpu.rules). A file that is present but cannot be
read as what it should be raises UnusableInput, naming the file and what is wrong.
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SMI_XML = "nvidia-smi-q.xml"
KERNEL_LOG = "dmesg-xid.txt"
NVML_JSON = "nvml.json"
BURN_JSON = "burn.json"

# `NVRM: Xid (PCI:0000:5a:00): 79, GPU has fallen off the bus.` or, with the process known,
# `NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, ...`: the driver's format (open-gpu-kernel-modules
# src/nvidia/src/kernel/gpu/rc/kernel_rc.c, "NVRM: Xid (" attr "): %d, ..."), the device
# (PCI:dddd:bb:dd, with GPU-I/GPU-CI appended on a MIG GPU) then the code.
XID_LINE = re.compile(r"NVRM: Xid \((?P<device>[^)]*)\): (?P<code>\d+),\s*(?P<text>.*)$")


class UnusableInput(ValueError):
    """The recorded outputs cannot be evaluated (exit 2)."""


@dataclass(frozen=True)
class XidEvent:
    code: int
    device: str  # e.g. PCI:0000:10:1c
    text: str
    line: str  # the kernel log line as recorded


@dataclass(frozen=True)
class GpuReading:
    index: int
    name: str
    uuid: str
    bus_id: str
    ecc_uncorrectable_volatile: int
    ecc_uncorrectable_aggregate: int
    remapped_rows_pending: bool
    remapped_rows_failure: bool
    retired_pages_pending: bool | None  # None: not reported (row remapping GPUs say N/A)
    clock_event_reasons: frozenset[str]  # the active ones: "hw_slowdown", "sw_power_cap", ...
    pcie_gen: tuple[int, int] | None  # (current, max)
    pcie_width: tuple[int, int] | None  # (current, max)
    nvlink_down: tuple[int, ...] = ()  # links NVML reports inactive, where the GPU has links


@dataclass(frozen=True)
class NodeReadings:
    source: Path
    driver: str
    gpus: tuple[GpuReading, ...]
    xids: tuple[XidEvent, ...] | None  # None: no kernel log recorded
    burn: dict[str, Any] | None = None
    notes: tuple[str, ...] = field(default=())


def _text(element: ET.Element | None, path: str, where: str) -> str:
    found = element.find(path) if element is not None else None
    if found is None or found.text is None:
        raise UnusableInput(f"{where}: no <{path}>")
    return found.text.strip()


def _int(value: str) -> int:
    """'0' -> 0; 'N/A' and friends count as 0 (not reported)."""
    return int(value) if value.isdigit() else 0


def _yes(value: str) -> bool:
    return value.strip().lower() == "yes"


def _link(value: str) -> int | None:
    digits = value.rstrip("x")
    return int(digits) if digits.isdigit() else None


def parse_smi_xml(text: str, where: str) -> tuple[str, list[GpuReading]]:
    try:
        root = ET.fromstring(text)
    except ET.ParseError as error:
        raise UnusableInput(f"{where}: not XML ({error})") from None
    if root.tag != "nvidia_smi_log":
        raise UnusableInput(f"{where}: not `nvidia-smi -q -x` output (root <{root.tag}>)")
    driver = _text(root, "driver_version", where)
    gpus = []
    for index, gpu in enumerate(root.findall("gpu")):
        at = f"{where} gpu {gpu.get('id', index)}"
        ecc = gpu.find("ecc_errors")

        def uncorrectable(kind: str, ecc: ET.Element | None = ecc, at: str = at) -> int:
            block = ecc.find(kind) if ecc is not None else None
            if block is None:
                raise UnusableInput(f"{at}: no <ecc_errors><{kind}>")
            return sum(_int((block.findtext(name) or "0").strip())
                       for name in ("dram_uncorrectable", "sram_uncorrectable_parity", "sram_uncorrectable_secded"))

        reasons = gpu.find("clocks_event_reasons")
        active = frozenset(
            child.tag.removeprefix("clocks_event_reason_")
            for child in (reasons if reasons is not None else [])
            if (child.text or "").strip() == "Active"
        )
        link = gpu.find("pci/pci_gpu_link_info")
        gen = width = None
        if link is not None:
            current_gen, max_gen = (_link(link.findtext(f"pcie_gen/{k}") or "") for k in
                                    ("current_link_gen", "max_link_gen"))
            current_w, max_w = (_link(link.findtext(f"link_widths/{k}") or "") for k in
                                ("current_link_width", "max_link_width"))
            gen = (current_gen, max_gen) if current_gen and max_gen else None
            width = (current_w, max_w) if current_w and max_w else None
        pending_retire = (gpu.findtext("retired_pages/pending_retirement") or "N/A").strip()
        gpus.append(GpuReading(
            index=index,
            name=_text(gpu, "product_name", at),
            uuid=_text(gpu, "uuid", at),
            bus_id=gpu.get("id", ""),
            ecc_uncorrectable_volatile=uncorrectable("volatile"),
            ecc_uncorrectable_aggregate=uncorrectable("aggregate"),
            remapped_rows_pending=_yes(gpu.findtext("remapped_rows/remapped_row_pending") or "No"),
            remapped_rows_failure=_yes(gpu.findtext("remapped_rows/remapped_row_failure") or "No"),
            retired_pages_pending=None if pending_retire == "N/A" else _yes(pending_retire),
            clock_event_reasons=active,
            pcie_gen=gen,
            pcie_width=width,
        ))
    declared = root.findtext("attached_gpus")
    if declared is not None and declared.strip().isdigit() and int(declared) != len(gpus):
        raise UnusableInput(f"{where}: attached_gpus says {declared.strip()} but {len(gpus)} <gpu> elements")
    return driver, gpus


def parse_kernel_log(text: str) -> list[XidEvent]:
    events = []
    for line in text.splitlines():
        match = XID_LINE.search(line)
        if match:
            events.append(XidEvent(int(match["code"]), match["device"], match["text"].strip(), line.strip()))
    return events


def nvlink_down(nvml: dict[str, Any], uuid: str) -> tuple[int, ...]:
    """Links NVML reports inactive (state 0) on a GPU that has links; a GPU whose every link
    query is unsupported has none (a single PCIe GPU, as the fixtures' H100)."""
    for gpu in nvml.get("gpus", []):
        if gpu.get("uuid") != uuid:
            continue
        states = gpu.get("nvlink_state", [])
        if all(isinstance(s, dict) for s in states):
            return ()
        return tuple(i for i, s in enumerate(states) if s == 0)
    return ()


def read_dir(directory: Path) -> NodeReadings:
    """Everything recorded in `directory`. Raises UnusableInput."""
    if not directory.is_dir():
        raise UnusableInput(f"{directory}: not a directory")
    smi = directory / SMI_XML
    if not smi.is_file():
        raise UnusableInput(f"{directory}: no {SMI_XML} (`nvidia-smi -q -x > {SMI_XML}`)")
    driver, gpus = parse_smi_xml(smi.read_text(errors="replace"), str(smi))
    notes = []
    log = directory / KERNEL_LOG
    xids = parse_kernel_log(log.read_text(errors="replace")) if log.is_file() else None
    if xids is None:
        notes.append(f"no {KERNEL_LOG}: Xid events not checked")
    nvml_path = directory / NVML_JSON
    if nvml_path.is_file():
        try:
            nvml = json.loads(nvml_path.read_text())
        except json.JSONDecodeError as error:
            raise UnusableInput(f"{nvml_path}: not JSON ({error})") from None
        gpus = [GpuReading(**{**g.__dict__, "nvlink_down": nvlink_down(nvml, g.uuid)}) for g in gpus]
    else:
        notes.append(f"no {NVML_JSON}: NVLink state not checked")
    burn_path = directory / BURN_JSON
    burn = None
    if burn_path.is_file():
        try:
            burn = json.loads(burn_path.read_text())
        except json.JSONDecodeError as error:
            raise UnusableInput(f"{burn_path}: not JSON ({error})") from None
    else:
        notes.append(f"no {BURN_JSON}: no active check figures")
    return NodeReadings(directory, driver, tuple(gpus), None if xids is None else tuple(xids), burn, tuple(notes))
