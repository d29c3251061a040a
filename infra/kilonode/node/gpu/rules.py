"""The GPU health rules: readings in (kilonode.gpu.readings), findings out. Pure.

A finding either takes the node out (`taints`: the agent sets a NoSchedule taint, a Node
condition and an Event; recovery by a person, or a reboot whose checks pass) or is
recorded only (an application's fault, per NVIDIA's Xid catalogue). Thresholds and the Xid
catalogue are data beside this file (thresholds.toml, xid_catalog.toml), each value with
its source.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from .readings import GpuReading, NodeReadings, XidEvent

HERE = Path(__file__).parent
THRESHOLDS = HERE / "thresholds.toml"
XID_CATALOG = HERE / "xid_catalog.toml"
# NVIDIA's "immediate action" buckets that leave the node in service: the application's own
# fault (restart it), nothing to do, and Xid 45's workflow: the catalogue's trigger is an
# application torn down (Control-C, SIGKILL, a GPU reset), "Not Solo: IGNORE (follow other
# Xid)"; with a real fault beside it (say Xid 48), that Xid takes the node out. Every other
# bucket (RESET_GPU, RESTART_BM, CONTACT_SUPPORT, the other workflows) does.
NOT_TAINTING = {"RESTART_APP", "IGNORE", "WORKFLOW_XID_45"}


@dataclass(frozen=True)
class Finding:
    check: str  # a short stable name: gpu-count, ecc-volatile, xid, ...
    gpu: str | None  # "0 (GPU-7b81...)" or None for the node
    message: str
    evidence: str
    taints: bool = True
    action: str = "drain"  # what NVIDIA or the rule says to do: drain, RESET_GPU, RESTART_APP, ...

    def line(self) -> str:
        where = f"GPU {self.gpu}: " if self.gpu is not None else ""
        return f"{self.check}: {where}{self.message} [{self.evidence}] -> {self.action}"


@cache
def thresholds() -> dict[str, Any]:
    return tomllib.loads(THRESHOLDS.read_text())


@cache
def xid_catalog() -> dict[int, dict[str, Any]]:
    data = tomllib.loads(XID_CATALOG.read_text())
    return {int(code): row for code, row in data.get("xid", {}).items()}


def _gpu(g: GpuReading) -> str:
    return f"{g.index} ({g.uuid})"


def gpu_findings(g: GpuReading, limits: dict[str, Any]) -> list[Finding]:
    found = []
    ecc = limits["ecc"]
    if g.ecc_uncorrectable_volatile > ecc["uncorrectable_volatile_max"]:
        found.append(Finding("ecc-volatile", _gpu(g), "uncorrectable ECC errors since the driver loaded",
                             f"ecc_errors/volatile uncorrectable = {g.ecc_uncorrectable_volatile}"))
    if g.ecc_uncorrectable_aggregate > ecc["uncorrectable_aggregate_max"]:
        found.append(Finding("ecc-aggregate", _gpu(g), "uncorrectable ECC errors in the GPU's lifetime",
                             f"ecc_errors/aggregate uncorrectable = {g.ecc_uncorrectable_aggregate}"))
    if g.remapped_rows_failure:
        found.append(Finding("remapped-rows-failure", _gpu(g), "row remapping failed: the memory cannot be repaired",
                             "remapped_rows/remapped_row_failure = Yes", action="drain (RMA)"))
    if g.remapped_rows_pending:
        found.append(Finding("remapped-rows-pending", _gpu(g), "a row remap waits for a GPU reset",
                             "remapped_rows/remapped_row_pending = Yes", action="RESET_GPU"))
    if g.retired_pages_pending:
        found.append(Finding("retired-pages-pending", _gpu(g), "a page retirement waits for a GPU reset",
                             "retired_pages/pending_retirement = Yes", action="RESET_GPU"))
    slowed = sorted(g.clock_event_reasons & set(limits["clock_event_reasons"]["fault"]))
    if slowed:
        found.append(Finding("clock-slowdown", _gpu(g), "the GPU is slowing itself down",
                             "clocks_event_reasons active: " + ", ".join(slowed)))
    if g.pcie_width and g.pcie_width[0] < g.pcie_width[1]:
        found.append(Finding("pcie-width", _gpu(g), "PCIe link narrower than its maximum",
                             f"link width x{g.pcie_width[0]} of x{g.pcie_width[1]}"))
    busy = "gpu_idle" not in g.clock_event_reasons
    if limits["pcie"]["check_generation_when_busy"] and busy and g.pcie_gen and g.pcie_gen[0] < g.pcie_gen[1]:
        found.append(Finding("pcie-generation", _gpu(g), "PCIe link below its maximum generation while busy",
                             f"link gen {g.pcie_gen[0]} of {g.pcie_gen[1]}"))
    if g.nvlink_down:
        found.append(Finding("nvlink-down", _gpu(g), "NVLink links inactive",
                             "links " + ", ".join(map(str, g.nvlink_down))))
    return found


def xid_finding(event: XidEvent) -> Finding:
    row = xid_catalog().get(event.code)
    if row is None:
        return Finding("xid", None, f"Xid {event.code} is not in NVIDIA's catalogue as read here", event.line,
                       action="CONTACT_SUPPORT")
    action = str(row.get("immediate", "CONTACT_SUPPORT"))
    return Finding("xid", None, f"Xid {event.code} {row.get('mnemonic', '')}: {row.get('description', '')}".strip(),
                   event.line, taints=action not in NOT_TAINTING, action=action)


def burn_findings(readings: NodeReadings, limits: dict[str, Any]) -> list[Finding]:
    """The active check's figures against the model's floors: one run (burn.json as recorded
    with PyTorch) or one per GPU under "gpus" (kilonode.gpu.active, with each GPU's index)."""
    burn = readings.burn
    if not burn:
        return []
    model = str(burn.get("device", ""))
    floors = limits.get("models", {}).get(model)
    if floors is None:
        return [Finding("active-check", None, f"no floors for {model!r} in thresholds.toml", "burn.json",
                        taints=False, action="add the model's floors")]
    found = []
    for run in burn.get("gpus") or [burn]:
        gpu = str(run["index"]) if "index" in run else None
        median = run.get("gemm_bf16_8192", {}).get("tflops_median")
        if median is not None and median < floors["gemm_bf16_tflops_floor"]:
            found.append(Finding("active-gemm", gpu, "GEMM throughput below the model's floor",
                                 f"bf16 GEMM median {median:.0f} TFLOP/s < {floors['gemm_bf16_tflops_floor']}"))
        error = run.get("gemm_bf16_max_rel_error_vs_fp64")
        if error is not None and error > floors["gemm_max_relative_error"]:
            found.append(Finding("active-gemm-correctness", gpu, "GEMM results wrong beyond bf16 rounding",
                                 f"max relative error {error:.4g} > {floors['gemm_max_relative_error']}"))
        copy = run.get("d2d_copy_TBps_read_plus_write")
        if copy is not None and copy < floors["copy_tbps_floor"]:
            found.append(Finding("active-memory-bandwidth", gpu, "memory bandwidth below the model's floor",
                                 f"device copy {copy:.2f} TB/s < {floors['copy_tbps_floor']}"))
    return found


def evaluate(readings: NodeReadings, expect_gpus: int | None = None) -> list[Finding]:
    """Every finding for the node, tainting or not, in a stable order."""
    limits = thresholds()
    found: list[Finding] = []
    if expect_gpus is not None and len(readings.gpus) != expect_gpus:
        found.append(Finding("gpu-count", None, f"{len(readings.gpus)} GPUs visible, the size has {expect_gpus}",
                             f"nvidia-smi lists {len(readings.gpus)}: "
                             + (", ".join(g.bus_id for g in readings.gpus) or "none")))
    for gpu in readings.gpus:
        found += gpu_findings(gpu, limits)
    for event in readings.xids or ():
        found.append(xid_finding(event))
    found += burn_findings(readings, limits)
    return found
