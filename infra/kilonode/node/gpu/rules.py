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

from . import infiniband as ib
from .readings import FABRIC_STATE, FABRIC_STATUS, NOT_APPLICABLE, GpuReading, NodeReadings, XidEvent

HERE = Path(__file__).parent
THRESHOLDS = HERE / "thresholds.toml"
XID_CATALOG = HERE / "xid_catalog.toml"
# NVIDIA's "immediate action" buckets that leave the node in service: the application's own
# fault (restart it), nothing to do, and Xid 45's workflow: the catalogue's trigger is an
# application torn down (Control-C, SIGKILL, a GPU reset), "Not Solo: IGNORE (follow other
# Xid)"; with a real fault beside it (say Xid 48), that Xid takes the node out. Every other
# bucket (RESET_GPU, RESTART_BM, CONTACT_SUPPORT, the other workflows) does.
NOT_TAINTING = {"RESTART_APP", "IGNORE", "WORKFLOW_XID_45"}

# A GPU's NVSwitch fabric registration (readings: <fabric><state>, <status>; the values and
# their sources are there), as the checks read it:
FABRIC_NONE = "none"  # N/A, Not Supported, no element: the GPU has no fabric (nothing to wait for)
FABRIC_WAITING = "waiting"  # Not Started, In Progress: Fabric Manager has not registered it
FABRIC_COMPLETED = "completed"  # Completed with status Success
FABRIC_FAILED = "failed"  # Completed with another status, or a state not known here
FABRIC_WAITING_STATES = {"not started", "in progress"}
# What to do about a fabric that is not registered: kilonode's choice, not an NVIDIA catalogue
# row. The fault is sticky for the boot (the agent's state), and a reboot restarts the driver
# and Fabric Manager in order (the unit's After=) and checks again: the catalogue's RESTART_BM
# bucket ("Restart bare metal, system should be restarted").
FABRIC_ACTION = "RESTART_BM"


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


def fabric_phase(g: GpuReading) -> str:
    """FABRIC_NONE, FABRIC_WAITING, FABRIC_COMPLETED or FABRIC_FAILED. The status counts only
    once the state is Completed (NVML, nvmlGpuFabricInfo_t.status: "Must be checked only if
    state returns complete"); a state this agent does not know is never read as healthy."""
    state = (g.fabric_state or "").strip().lower()
    if not state or state in NOT_APPLICABLE:
        return FABRIC_NONE
    if state in FABRIC_WAITING_STATES:
        return FABRIC_WAITING
    if state == "completed" and (g.fabric_status or "").strip().lower() == "success":
        return FABRIC_COMPLETED
    return FABRIC_FAILED


def fabric_evidence(g: GpuReading) -> str:
    return f"{FABRIC_STATE} = {g.fabric_state}, {FABRIC_STATUS} = {g.fabric_status}"


def fabric_findings(g: GpuReading) -> list[Finding]:
    """A GPU whose fabric is not registered, at any check: the agent waits for registration
    before its first active check of a boot (kilonode.gpu.agent, fabric_wait_s), so a GPU found
    Not Started or In Progress afterwards was registered and is no longer (Fabric Manager died
    or restarted) or never was (the wait ran out); a Completed registration with a status
    other than Success failed. Either way no CUDA work can start on it (cudaErrorSystemNotReady)."""
    phase = fabric_phase(g)
    if phase == FABRIC_WAITING:
        return [Finding("fabric-not-completed", _gpu(g), "not registered with the NVSwitch fabric: Fabric Manager "
                        "is not running, restarted, or has not finished training the fabric", fabric_evidence(g),
                        action=FABRIC_ACTION)]
    if phase == FABRIC_FAILED:
        return [Finding("fabric-failed", _gpu(g), "NVSwitch fabric registration failed", fabric_evidence(g),
                        action=FABRIC_ACTION)]
    return []


def unknown_findings(g: GpuReading, limits: dict[str, Any]) -> list[Finding]:
    """A reading the XML did not give is unknown, never healthy. A required one takes the node
    out (condition False, reason Unknown<Reading>): the agent cannot vouch for a GPU it cannot
    read, and a node left True would keep taking work (the controller leaves a node as it is
    on any Unknown status but the check request). The others are recorded."""
    required = set(limits["readings"]["required"])
    return [Finding(f"unknown-{reading}", _gpu(g), f"{reading} unknown: nvidia-smi's output does not carry it "
                    "as this agent reads it (driver schema not known?)", why,
                    taints=reading in required,
                    action="read the driver's nvidia-smi -q -x and map the element (kilonode.gpu.readings)")
            for reading, why in g.unknown]


def gpu_findings(g: GpuReading, limits: dict[str, Any]) -> list[Finding]:
    found = unknown_findings(g, limits)
    ecc = limits["ecc"]
    volatile, aggregate = g.ecc_uncorrectable_volatile, g.ecc_uncorrectable_aggregate
    if volatile is not None and volatile > ecc["uncorrectable_volatile_max"]:
        found.append(Finding("ecc-volatile", _gpu(g), "uncorrectable ECC errors since the driver loaded",
                             f"ecc_errors/volatile uncorrectable = {volatile}"))
    if aggregate is not None and aggregate > ecc["uncorrectable_aggregate_max"]:
        found.append(Finding("ecc-aggregate", _gpu(g), "uncorrectable ECC errors in the GPU's lifetime",
                             f"ecc_errors/aggregate uncorrectable = {aggregate}"))
    if g.remapped_rows_failure:
        found.append(Finding("remapped-rows-failure", _gpu(g), "row remapping failed: the memory cannot be repaired",
                             "remapped_rows/remapped_row_failure = Yes", action="drain (RMA)"))
    if g.remapped_rows_pending:
        found.append(Finding("remapped-rows-pending", _gpu(g), "a row remap waits for a GPU reset",
                             "remapped_rows/remapped_row_pending = Yes", action="RESET_GPU"))
    if g.retired_pages_pending:
        found.append(Finding("retired-pages-pending", _gpu(g), "a page retirement waits for a GPU reset",
                             "retired_pages/pending_retirement = Yes", action="RESET_GPU"))
    reasons = g.clock_event_reasons
    slowed = sorted((reasons or frozenset()) & set(limits["clock_event_reasons"]["fault"]))
    if slowed:
        found.append(Finding("clock-slowdown", _gpu(g), "the GPU is slowing itself down",
                             "clock event reasons active: " + ", ".join(slowed)))
    # The link's current generation and width "may be reduced when the GPU is not in use"
    # (nvidia-smi(1), 535: GPU Link information, Current): at idle a link below its maximum
    # is power management, so it is judged only while the GPU is known to be busy (the idle
    # reason known and not active). At idle a narrower link is recorded, not tainting.
    busy = reasons is not None and "gpu_idle" not in reasons
    pcie = limits["pcie"]
    if g.pcie_width and g.pcie_width[0] < g.pcie_width[1]:
        judged = busy or not pcie["width_only_when_busy"]
        found.append(Finding("pcie-width" if judged else "pcie-width-idle", _gpu(g),
                             "PCIe link narrower than its maximum" + ("" if judged else " at idle"),
                             f"link width x{g.pcie_width[0]} of x{g.pcie_width[1]}", taints=judged,
                             action="drain" if judged else "none: judged again under load"))
    if busy and pcie["check_generation_when_busy"] and g.pcie_gen and g.pcie_gen[0] < g.pcie_gen[1]:
        found.append(Finding("pcie-generation", _gpu(g), "PCIe link below its maximum generation while busy",
                             f"link gen {g.pcie_gen[0]} of {g.pcie_gen[1]}"))
    if g.nvlink_down:
        found.append(Finding("nvlink-down", _gpu(g), "NVLink links inactive",
                             "links " + ", ".join(map(str, g.nvlink_down))))
    found += fabric_findings(g)
    return found


def xid_finding(event: XidEvent) -> Finding:
    row = xid_catalog().get(event.code)
    if row is None:
        return Finding("xid", None, f"Xid {event.code} is not in NVIDIA's catalogue as read here", event.line,
                       action="CONTACT_SUPPORT")
    action = str(row.get("immediate", "CONTACT_SUPPORT"))
    return Finding("xid", None, f"Xid {event.code} {row.get('mnemonic', '')}: {row.get('description', '')}".strip(),
                   event.line, taints=action not in NOT_TAINTING, action=action)


def burn_stack(burn: dict[str, Any]) -> str:
    """Which library measured: "stack" as kilonode.gpu.active writes it ("cublas11"), or a
    PyTorch recording's build ("torch": "2.11.0+cu130" -> "pytorch_cu130")."""
    if "stack" in burn:
        return str(burn["stack"])
    if "torch" in burn:
        return "pytorch_" + str(burn["torch"]).partition("+")[2]
    return ""


def burn_findings(readings: NodeReadings, limits: dict[str, Any]) -> list[Finding]:
    """The active check's figures against the model's floors for the stack that measured: one
    run (burn.json as recorded with PyTorch) or one per GPU under "gpus" (kilonode.gpu.active,
    with each GPU's index)."""
    burn = readings.burn
    if not burn:
        return []
    model, stack = str(burn.get("device", "")), burn_stack(burn)
    floors = limits.get("models", {}).get(model, {}).get(stack)
    if floors is None:
        return [Finding("active-check", None, f"no floors for {model!r} measured with {stack or 'an unnamed stack'!r} "
                        "in thresholds.toml", "burn.json", taints=False, action="add the model's floors")]
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


# The GPUDirect RDMA probe's rules (kilonode.gpu.gpudirect; gpudirect.json's failures by kind).
# All take the node out, with the default action, as gpu-count and nvlink-down do: the node lacks
# a path its size promises (NCCL would stage every transfer through host memory, a half or a
# quarter of line rate for the whole gang), and only a person, or a reboot whose checks pass,
# returns it; a node that must have it and whose probe did not answer is not vouched for.
GPUDIRECT_RULES = {
    "unavailable": ("gpudirect-rdma-unavailable",
                    "GPUDirect RDMA (DMA-BUF) unavailable: NCCL would stage through host memory"),
    "no-hca": ("gpudirect-rdma-no-hca", "no InfiniBand device: GPUDirect RDMA cannot be used (the RDMA stack, "
               "ib_uverbs or the HCAs are missing)"),
    "unverified": ("gpudirect-rdma-unverified", "the GPUDirect RDMA probe did not answer: not vouched for"),
}


def gpudirect_findings(probe: dict[str, Any] | None) -> list[Finding]:
    """gpudirect.json's failures: per GPU one finding (its failing calls, each with the HCAs it
    failed on), per HCA one (a step of its own failed), and one per failure of the node's."""
    if not probe:
        return []
    grouped: dict[tuple[str, str | None, str | None], dict[tuple[str, str], list[str]]] = {}
    for item in probe.get("failures") or []:
        gpu = None if item.get("gpu") is None else f"{item['gpu']} ({item.get('busId') or 'bus id unknown'})"
        hca = item.get("hca")
        steps = grouped.setdefault((str(item.get("kind")), gpu, None if gpu is not None else hca), {})
        hcas = steps.setdefault((str(item.get("call")), str(item.get("message"))), [])
        if hca and gpu is not None:
            hcas.append(str(hca))
    found = []
    for (kind, gpu, hca), steps in grouped.items():
        rule, message = GPUDIRECT_RULES.get(kind, GPUDIRECT_RULES["unverified"])
        evidence = "; ".join(f"{call}{' on HCA ' + ', '.join(hcas) if hcas else ''}: {text}"
                             for (call, text), hcas in steps.items())
        found.append(Finding(rule, gpu, message, (f"HCA {hca}: " if hca else "") + evidence))
    return found


# The InfiniBand ports' rules (kilonode.gpu.infiniband; infiniband.json against the size's
# links). All take the node out: NCCL would run on fewer or slower links for the whole gang.
INFINIBAND_RULES = {
    "missing": ("infiniband-ports-missing", "InfiniBand ports present, the size has {expected} (a virtual function "
                "not attached, or its driver not bound)"),
    "down": ("infiniband-port-down", "InfiniBand {port} is not ACTIVE"),
    "slow": ("infiniband-port-slow", "InfiniBand {port} runs below the size's rate"),
}


def infiniband_findings(found: dict[str, Any] | None) -> list[Finding]:
    """infiniband.json's shortfalls: the count once, each port down or slow by name."""
    if not found:
        return []
    expected = (found.get("expected") or {}).get("ports")
    out = []
    for kind, subject, evidence in ib.problems(found):
        rule, message = INFINIBAND_RULES[kind]
        text = f"{subject} {message.format(expected=expected)}" if kind == "missing" else message.format(port=subject)
        out.append(Finding(rule, None, text, evidence))
    return out


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
    found += infiniband_findings(readings.infiniband)
    found += gpudirect_findings(readings.gpudirect)
    return found
