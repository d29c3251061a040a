"""What a GPU node reports, read from the outputs the health agent collects (on the node) or
that support recorded (off the node, `kilonode gpu-health --from DIR`), laid out as:

    nvidia-smi-q.xml    `nvidia-smi -q -x`                         (required)
    dmesg-xid.txt       the kernel log's NVIDIA lines (NVRM, Xid)  (optional)
    nvml.json           NVML readings (nvidia-ml-py), NVLink state (optional)
    burn.json           the active check's figures                 (optional)
    gpudirect.json      the GPUDirect RDMA probe's answer          (optional; kilonode.gpu.gpudirect)
    infiniband.json     the InfiniBand ports against the size's    (optional; kilonode.gpu.infiniband)

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
GPUDIRECT_JSON = "gpudirect.json"
INFINIBAND_JSON = "infiniband.json"

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
    """One GPU's readings. None in a reading the XML should carry means unknown: the elements
    that hold it were not found (a schema this parser does not know) or held no number. It is
    never read as healthy; `unknown` names each such reading and what was looked for
    (kilonode.gpu.rules judges them). Where nvidia-smi itself says N/A for a feature the GPU
    does not have (page retirement on a row-remapping GPU), the reading is None and not
    unknown."""

    index: int
    name: str
    uuid: str
    bus_id: str
    ecc_uncorrectable_volatile: int | None
    ecc_uncorrectable_aggregate: int | None
    remapped_rows_pending: bool | None  # None: the GPU does not remap rows (N/A), or unknown
    remapped_rows_failure: bool | None
    retired_pages_pending: bool | None  # None: not reported (row remapping GPUs say N/A)
    clock_event_reasons: frozenset[str] | None  # the active ones: "hw_slowdown", "sw_power_cap", ...
    pcie_gen: tuple[int, int] | None  # (current, max)
    pcie_width: tuple[int, int] | None  # (current, max)
    nvlink_down: tuple[int, ...] = ()  # links NVML reports inactive, where the GPU has links
    unknown: tuple[tuple[str, str], ...] = ()  # (reading, what was looked for and not found)
    # NVSwitch fabric registration, <fabric><state> and <status> as nvidia-smi writes them
    # ("In Progress", "Completed", "Success", ...); None: no <fabric> element (v11).
    # kilonode.gpu.rules.fabric_phase says what they mean.
    fabric_state: str | None = None
    fabric_status: str | None = None


@dataclass(frozen=True)
class NodeReadings:
    source: Path
    driver: str
    gpus: tuple[GpuReading, ...]
    xids: tuple[XidEvent, ...] | None  # None: no kernel log recorded
    burn: dict[str, Any] | None = None
    notes: tuple[str, ...] = field(default=())
    # the GPUDirect RDMA probe's answer (kilonode.gpu.gpudirect); None: not probed (only pools
    # whose config says expectGpuDirectRdma are, so its absence is no note)
    gpudirect: dict[str, Any] | None = None
    # the InfiniBand ports with the size's expectation (kilonode.gpu.infiniband); None: not read
    # (only pools whose config says expectInfiniband are, so its absence is no note)
    infiniband: dict[str, Any] | None = None


def _text(element: ET.Element | None, path: str, where: str) -> str:
    found = element.find(path) if element is not None else None
    if found is None or found.text is None:
        raise UnusableInput(f"{where}: no <{path}>")
    return found.text.strip()


# Where each reading lives in `nvidia-smi -q -x`, per schema. The schemas: nvsmi_device_v11
# (driver 470, Debian bullseye's nvidia-smi 470.256.02-2), v12 (driver 535: Debian bookworm's
# nvidia-smi 535.261.03-1, the driver the GPU image ships, and 535.309.01-0+deb12u1), both read
# from the DTD embedded in those binaries (element lists derived in
# tests/node/gpu/fixtures/nvsmi/); v13 (driver 580) from the real H100 recording in
# tests/node/gpu/fixtures/h100-80gb-hbm3/ (no v13 DTD is packaged in Debian bookworm).
#
# Uncorrectable ECC counters under ecc_errors/volatile and ecc_errors/aggregate, one of the
# DTDs' alternatives per GPU:
#   (single_bit, double_bit)                                v11, v12: pre-Ampere; double_bit/total
#   (sram_correctable, sram_uncorrectable, dram_*)          v11, v12: e.g. A100 on 535
#   (sram_correctable, sram_uncorrectable_parity,
#    sram_uncorrectable_secded, dram_*)                     v12, v13: e.g. H100 on 535 and 580
ECC_UNCORRECTABLE = ("dram_uncorrectable", "sram_uncorrectable", "sram_uncorrectable_parity",
                     "sram_uncorrectable_secded", "double_bit/total")
# The clock event reasons: v12 and v13 name them clocks_event_reasons/clocks_event_reason_*;
# v11 (and drivers before 535) clocks_throttle_reasons/clocks_throttle_reason_*, the same
# suffixes (gpu_idle, hw_slowdown, hw_thermal_slowdown, sw_thermal_slowdown, ...).
CLOCK_REASONS = (("clocks_event_reasons", "clocks_event_reason_"),
                 ("clocks_throttle_reasons", "clocks_throttle_reason_"))
# The same in v11, v12 and v13: pci/pci_gpu_link_info/pcie_gen/{current,max}_link_gen,
# pci/pci_gpu_link_info/link_widths/{current,max}_link_width, remapped_rows/
# remapped_row_{pending,failure} (text N/A where the GPU does not remap rows),
# retired_pages/pending_retirement.
LINK = "pci/pci_gpu_link_info"
NOT_APPLICABLE = {"n/a", "not supported", "[n/a]", "[not supported]"}

# NVSwitch fabric registration, per GPU: <fabric><state>...</state><status>...</status></fabric>
# in v12 (the 535 DTD declares `fabric: state status`, tests/node/gpu/fixtures/nvsmi/
# nvsmi_device_v12.elements) and v13 (which adds cliqueId, clusterUuid, health). The real H100
# recording (../shared/fixtures/gpu/h100-80gb-hbm3/nvidia-smi-q.xml, copied to
# tests/node/gpu/fixtures/h100-80gb-hbm3/; driver 580) has <state>N/A</state> and
# <status>N/A</status>: it is ONE H100 passed through to a VM, no NVSwitch, so it shows the
# element names and the not-applicable value, not an HGX baseboard's values. Its
# help-query-gpu.txt: fabric.state "Current state of GPU fabric registration process",
# fabric.status "Error status, valid only if gpu fabric registration state is "completed"".
# The states are NVML's nvmlGpuFabricState_t (NVML API Reference, "Fabric definitions":
# NVML_GPU_FABRIC_STATE_NOT_SUPPORTED 0, NOT_STARTED 1, IN_PROGRESS 2, COMPLETED 3); the text
# nvidia-smi writes for them, "Not Started" -> "In Progress" -> "Completed" with status
# "Success", is as NVIDIA's NVSentinel reads `nvidia-smi --query-gpu=fabric.state,
# fabric.status` (health-monitors/system-services-monitor/.../fabric_state_check.py); a
# failed registration on Azure showed "Completed" with status "Insufficient Resources"
# (Azure/azhpc-images pull request 506). No recording of an HGX here: unmeasured.
# Where the GPU has no fabric nvidia-smi says N/A or Not Supported: a PCIe or lone GPU (the
# recording), and an A100 (State N/A on AWS p4d, 8x A100 with Fabric Manager running:
# bottlerocket-os/bottlerocket pull request 3873); v11 (470) has no <fabric> element at all.
# kilonode.gpu.rules.fabric_phase says what the values mean.
FABRIC_STATE, FABRIC_STATUS = "fabric/state", "fabric/status"


def _number(value: str | None) -> int | None:
    """'0' -> 0; anything else (missing, N/A, an error text) -> None: not a reading."""
    value = (value or "").strip()
    return int(value) if value.isdigit() else None


def _yes_no(value: str | None) -> bool | None:
    value = (value or "").strip().lower()
    return {"yes": True, "no": False}.get(value)


def _stripped(value: str | None) -> str | None:
    return None if value is None else value.strip()


def _link(value: str | None) -> int | None:
    digits = (value or "").strip().rstrip("x")
    return int(digits) if digits.isdigit() else None


def _ecc(ecc: ET.Element | None, kind: str) -> tuple[int | None, str]:
    """The sum of the uncorrectable counters in ecc_errors/<kind>, or None and what was
    missing. A block with no counter that reads as a number is unknown (N/A: ECC off)."""
    block = ecc.find(kind) if ecc is not None else None
    if block is None:
        return None, f"no <ecc_errors><{kind}>"
    values = {path: _number(block.findtext(path)) for path in ECC_UNCORRECTABLE if block.find(path) is not None}
    counted = [v for v in values.values() if v is not None]
    if not counted:
        seen = ", ".join(f"{k}={(block.findtext(k) or '').strip()!r}" for k in values) or "none of them"
        return None, f"<ecc_errors><{kind}>: no uncorrectable counter as a number ({'|'.join(ECC_UNCORRECTABLE)}; " \
                     f"found {seen})"
    return sum(counted), ""


def _clock_reasons(gpu: ET.Element) -> frozenset[str] | None:
    for block, prefix in CLOCK_REASONS:
        reasons = gpu.find(block)
        if reasons is not None and len(reasons):
            return frozenset(child.tag.removeprefix(prefix) for child in reasons
                             if (child.text or "").strip() == "Active")
    return None


def _remapped(gpu: ET.Element, name: str) -> tuple[bool | None, str]:
    rows = gpu.find("remapped_rows")
    if rows is None:
        return None, "no <remapped_rows>"
    if not len(rows) and (rows.text or "").strip().lower() in NOT_APPLICABLE:
        return None, ""  # the GPU does not remap rows (pre-Ampere): not applicable
    value = _yes_no(rows.findtext(name))
    return value, "" if value is not None else f"<remapped_rows><{name}> not Yes/No"


def _pair(link: ET.Element | None, block: str, kind: str) -> tuple[int, int] | None:
    if link is None:
        return None
    current, top = (_link(link.findtext(f"{block}/{which}_{kind}")) for which in ("current", "max"))
    return (current, top) if current and top else None


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
        unknown: list[tuple[str, str]] = []
        ecc = gpu.find("ecc_errors")
        volatile, why = _ecc(ecc, "volatile")
        if volatile is None:
            unknown.append(("ecc-volatile", why))
        aggregate, why = _ecc(ecc, "aggregate")
        if aggregate is None:
            unknown.append(("ecc-aggregate", why))
        reasons = _clock_reasons(gpu)
        if reasons is None:
            unknown.append(("clock-event-reasons", "no <clocks_event_reasons> (v12, v13) nor "
                                                   "<clocks_throttle_reasons> (v11) with reasons in it"))
        pending, why_pending = _remapped(gpu, "remapped_row_pending")
        failure, why_failure = _remapped(gpu, "remapped_row_failure")
        if why_pending or why_failure:
            unknown.append(("remapped-rows", why_pending or why_failure))
        link = gpu.find(LINK)
        gen, width = _pair(link, "pcie_gen", "link_gen"), _pair(link, "link_widths", "link_width")
        if gen is None:
            unknown.append(("pcie-generation", f"no number in <{LINK}/pcie_gen/current_link_gen|max_link_gen>"))
        if width is None:
            unknown.append(("pcie-width", f"no number in <{LINK}/link_widths/current_link_width|max_link_width>"))
        pending_retire = (gpu.findtext("retired_pages/pending_retirement") or "N/A").strip()
        gpus.append(GpuReading(
            index=index,
            name=_text(gpu, "product_name", at),
            uuid=_text(gpu, "uuid", at),
            bus_id=gpu.get("id", ""),
            ecc_uncorrectable_volatile=volatile,
            ecc_uncorrectable_aggregate=aggregate,
            remapped_rows_pending=pending,
            remapped_rows_failure=failure,
            retired_pages_pending=_yes_no(pending_retire),
            clock_event_reasons=reasons,
            pcie_gen=gen,
            pcie_width=width,
            unknown=tuple(unknown),
            fabric_state=_stripped(gpu.findtext(FABRIC_STATE)),
            fabric_status=_stripped(gpu.findtext(FABRIC_STATUS)),
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
    burn = _json_file(burn_path) if burn_path.is_file() else None
    if not burn_path.is_file():
        notes.append(f"no {BURN_JSON}: no active check figures")
    gpudirect_path = directory / GPUDIRECT_JSON
    gpudirect = _json_file(gpudirect_path) if gpudirect_path.is_file() else None
    if gpudirect_path.is_file() and (not isinstance(gpudirect, dict)
                                     or not isinstance(gpudirect.get("failures"), list)):
        raise UnusableInput(f"{gpudirect_path}: expected an object with a list of failures")
    infiniband_path = directory / INFINIBAND_JSON
    infiniband = _json_file(infiniband_path) if infiniband_path.is_file() else None
    if infiniband_path.is_file() and (not isinstance(infiniband, dict)
                                      or not isinstance(infiniband.get("expected"), dict)
                                      or not isinstance(infiniband.get("ports"), list)):
        raise UnusableInput(f"{infiniband_path}: expected an object with the expected ports and a list of ports")
    return NodeReadings(directory, driver, tuple(gpus), None if xids is None else tuple(xids), burn, tuple(notes),
                        gpudirect, infiniband)


def _json_file(path: Path) -> Any:
    """A recorded JSON file's content; UnusableInput naming it when it is not JSON."""
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise UnusableInput(f"{path}: not JSON ({error})") from None
