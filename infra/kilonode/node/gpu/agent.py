"""The GPU health agent on a GPU node: checks the GPUs and reports the GPUHealthy Node
condition (and an Event) with the node's own identity; kilonode.gpu.controller turns the
condition into taints.

    python3 -m kilonode.gpu.agent --config /etc/kilonode/gpu-health.json [--dry-run] [--once]
                                  [--from DIR]

At start: on NVSwitch systems, a bounded wait for every GPU's fabric registration
(fabric_wait_s; Unknown/FabricRegistrationPending meanwhile), and on InfiniBand pools for every
port the size has to be ACTIVE at its rate (within the same deadline;
Unknown/InfinibandLinksPending meanwhile), then passive checks (nvidia-smi -q -x, the kernel
log's NVIDIA lines since boot, NVLink state through NVML, the InfiniBand ports in sysfs) and
the active check (kilonode.gpu.active: its CUDA work in a child process, bounded by
active_timeout_s; CUDA's "system not ready" (802) there is pending until the fabric wait's
deadline, then a fault), then a report. Then passive checks every
passive_interval_s, and every active_interval_s an idle re-check when no pod on the node
requests nvidia.com/gpu and no process uses a GPU: it asks for the GPUs (Unknown/
ActiveCheckRequested), waits for the controller's check-running taint, makes sure no GPU
pod arrived, runs, reports. Sticky per boot: once False, never True again in this boot (the
state in /run, tmpfs, records the boot). Beside that state it keeps a record of its work for
Prometheus (kilonode.gpu.metrics: when each kind of check last ran and what it found, the
condition, the active check's figures, the last write to the API). `--dry-run` prints the
bodies it would send and changes nothing; `--from DIR` reads recorded outputs (the `kilonode
gpu-health` layout) instead of running the tools. Exit (with --once): 0 reported True, 1
False, 2 unusable.
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import infiniband, nvml
from . import protocol as p
from .metrics import ACTIVE, AGENT_STATE_DIR, METRICS_FILE, PASSIVE, AgentRecord, Figures
from .readings import (
    BURN_JSON,
    GPUDIRECT_JSON,
    INFINIBAND_JSON,
    KERNEL_LOG,
    NVML_JSON,
    SMI_XML,
    GpuReading,
    NodeReadings,
    UnusableInput,
    parse_smi_xml,
    read_dir,
)
from .rules import (
    FABRIC_ACTION,
    FABRIC_FAILED,
    FABRIC_WAITING,
    Finding,
    evaluate,
    fabric_evidence,
    fabric_phase,
    thresholds,
)

AGENT = "kilonode.io/gpu-health-agent"
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
STATE_FILE = "state.json"
TOOL_TIMEOUT_S = 120  # nvidia-smi -q on 8 GPUs takes seconds; a hung driver must not hang the agent
RETRY_S = 30  # after a failed API call or tool run: the kubelet's TLS bootstrap takes about this long
POLL_S = 5  # how often the agent reads its Node while waiting for the check-running taint
# How often it reads the GPUs' fabric state while waiting for it (one nvidia-smi -q -x, about a
# second on 8 GPUs); the wait itself is bounded by fabric_wait_s (thresholds.toml [agent]).
FABRIC_POLL_S = 5
# How long the agent sleeps after an active check met cudaErrorSystemNotReady (802) before it
# tries again in a fresh child process (kilonode.gpu.active; each try also maps the CUDA
# libraries, cuBLAS Lt alone some hundred MB, and runs nvidia-smi): Fabric Manager trains an
# HGX fabric in about a minute or two (see fabric_wait_s), and the deadline bounds the tries.
CUDA_RETRY_S = 10
GPU_RESOURCE = "nvidia.com/gpu"
SHARED = "active-check-shared"  # the finding of an active check a GPU pod or process shared
# The active check's own findings are named so (rules.burn_findings, and active-check-error and
# SHARED here; the GPUDirect RDMA probe, which runs with it, rules.gpudirect_findings); every
# other finding is of the passive readings.
ACTIVE_RULES = ("active-", "gpudirect-rdma-")
# How long the agent sleeps before it reads the InfiniBand ports again while the size's are not
# all there, ACTIVE and at their rate (await_infiniband), and before it probes GPUDirect RDMA
# again when no InfiniBand device is there yet (kilonode.gpu.gpudirect), until the fabric wait's
# deadline: Azure attaches the InfiniBand virtual functions to a booting VM, and udev loads
# ib_uverbs for them, on its own schedule. Later in the boot (no deadline) a node without them
# is a fault at once.
HCA_RETRY_S = 10


class ConfigError(ValueError):
    """The agent's config file is wrong; the message names the file and the field."""


@dataclass(frozen=True)
class AgentConfig:
    expect_gpus: int
    gpu_model: str | None  # the size catalogue's name, reported for people; floors key on nvidia-smi's
    kubeconfig: Path
    node_name: str | None  # None: the hostname, lower-cased, as the kubelet names itself
    passive_interval_s: int
    active_interval_s: int
    taint_wait_s: int
    heartbeat_s: int
    state_dir: Path
    fabric_wait_s: int = 300  # load_config reads thresholds.toml [agent] fabric_wait_s
    # the pool's nodes must have GPUDirect RDMA (InfiniBand pools): the active check probes it
    # (kilonode.gpu.gpudirect); false: never probed, libibverbs never loaded
    expect_gpudirect_rdma: bool = False
    # (ports, Gb/s): the size's InfiniBand links (InfiniBand pools; the size catalogue's
    # infinibandLinks): every check reads the ports in sysfs (kilonode.gpu.infiniband) and the
    # first waits for them; None: never read
    expect_infiniband: tuple[int, int] | None = None
    # The RDMA shared device plugin's rescan interval (its periodicUpdateInterval), on pools that
    # expect InfiniBand: the first pass of a boot is not reported (the startup taint stays) until
    # this long after the agent saw every port there, so that the plugin has listed every HCA
    # since (await_rdma_plugin says why); 0: no such wait
    rdma_plugin_rescan_s: int = 0


def load_config(path: Path) -> AgentConfig:
    where = str(path)
    try:
        data = json.loads(path.read_text())
    except OSError as error:
        raise ConfigError(f"{where}: {error.strerror}") from None
    except json.JSONDecodeError as error:
        raise ConfigError(f"{where}: not JSON ({error})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a JSON object")
    defaults = thresholds().get("agent", {})
    known = {"expectGpus", "gpuModel", "kubeconfig", "nodeName", "passiveIntervalSeconds",
             "activeIntervalSeconds", "taintWaitSeconds", "heartbeatSeconds", "stateDir", "fabricWaitSeconds",
             "expectGpuDirectRdma", "expectInfiniband", "rdmaDevicePluginRescanSeconds"}
    if unknown := sorted(set(data) - known):
        raise ConfigError(f"{where}: unknown field(s) {', '.join(unknown)} (known: {', '.join(sorted(known))})")
    if not isinstance(expect_rdma := data.get("expectGpuDirectRdma", False), bool):
        raise ConfigError(f"{where}: expectGpuDirectRdma must be true or false, not {expect_rdma!r}")
    expect_ib = _expect_infiniband(where, data.get("expectInfiniband"))
    rescan = data.get("rdmaDevicePluginRescanSeconds", 0)
    if not isinstance(rescan, int) or isinstance(rescan, bool) or rescan < 0:
        raise ConfigError(f"{where}: rdmaDevicePluginRescanSeconds must be a whole number of seconds, not {rescan!r}")
    if rescan and expect_ib is None:
        raise ConfigError(f"{where}: rdmaDevicePluginRescanSeconds needs expectInfiniband (it counts from the ports)")

    def positive(name: str, default: int | None) -> int:
        value = data.get(name, default)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(f"{where}: {name} must be a positive integer, not {value!r}")
        return value

    def text(name: str, required: bool) -> str | None:
        value = data.get(name)
        if value is None and not required:
            return None
        if not isinstance(value, str) or not value:
            raise ConfigError(f"{where}: {name} must be a non-empty string, not {value!r}")
        return value

    return AgentConfig(
        expect_gpus=positive("expectGpus", None),
        gpu_model=text("gpuModel", False),
        kubeconfig=Path(text("kubeconfig", True) or ""),
        node_name=text("nodeName", False),
        passive_interval_s=positive("passiveIntervalSeconds", defaults.get("passive_interval_s")),
        active_interval_s=positive("activeIntervalSeconds", defaults.get("active_interval_s")),
        taint_wait_s=positive("taintWaitSeconds", defaults.get("taint_wait_s")),
        heartbeat_s=positive("heartbeatSeconds", defaults.get("heartbeat_s")),
        state_dir=Path(text("stateDir", False) or AGENT_STATE_DIR),
        fabric_wait_s=positive("fabricWaitSeconds", defaults.get("fabric_wait_s")),
        expect_gpudirect_rdma=expect_rdma,
        expect_infiniband=expect_ib,
        rdma_plugin_rescan_s=rescan,
    )


def _expect_infiniband(where: str, value: Any) -> tuple[int, int] | None:
    """expectInfiniband: {"ports": <count>, "gbps": <rate>}, both positive integers, or absent."""
    if value is None:
        return None
    numbers = [value.get(k) for k in ("ports", "gbps")] if isinstance(value, dict) else []
    if (not isinstance(value, dict) or set(value) != {"ports", "gbps"}
            or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in numbers)):
        raise ConfigError(f"{where}: expectInfiniband must be {{\"ports\": <positive integer>, \"gbps\": "
                          f"<positive integer>}}, not {value!r}")
    return numbers[0], numbers[1]


# --- decisions (pure) -----------------------------------------------------------------------

@dataclass
class State:
    """What the agent reported in this boot (kept in /run: a reboot clears it)."""

    boot_id: str
    status: str | None = None
    reason: str | None = None
    message: str | None = None
    transition: str | None = None  # lastTransitionTime of the current status
    failed: bool = False  # reported False in this boot: sticky
    last_active: float = 0.0  # time.time() of the last active check in this boot (0: none yet)
    last_sent: float = 0.0  # time.time() of the last condition written to the API

    @classmethod
    def load(cls, directory: Path, boot: str) -> State:
        try:
            data = json.loads((directory / STATE_FILE).read_text())
        except (OSError, json.JSONDecodeError):
            return cls(boot)
        if data.get("boot_id") != boot:
            return cls(boot)  # another boot's (a /run that is not tmpfs): ignore it
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})

    def save(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        temporary = directory / (STATE_FILE + ".new")
        temporary.write_text(json.dumps(self.__dict__, indent=2))
        temporary.replace(directory / STATE_FILE)


@dataclass
class Report:
    condition: dict[str, Any]
    event: dict[str, Any] | None  # None: nothing new to tell people
    state: State
    faults: list[Finding] = field(default_factory=list)
    changed: bool = True  # status, reason or message differ from the last report


def summary(readings: NodeReadings, expect_gpus: int, gpu_model: str | None) -> str:
    """One line with the figures, for a True condition."""
    models = ", ".join(sorted({g.name for g in readings.gpus})) or "none"
    parts = [f"{len(readings.gpus)} of {expect_gpus} GPUs ({models}"
             + (f"; the size says {gpu_model}" if gpu_model else "") + f"), driver {readings.driver}"]
    if readings.xids is not None:
        parts.append(f"{len(readings.xids)} Xid in the kernel log, none tainting" if readings.xids else "no Xid")
    runs = (readings.burn or {}).get("gpus") or ([readings.burn] if readings.burn else [])
    if runs:
        medians = [r["gemm_bf16_8192"]["tflops_median"] for r in runs if "gemm_bf16_8192" in r]
        errors = [r["gemm_bf16_max_rel_error_vs_fp64"] for r in runs if "gemm_bf16_max_rel_error_vs_fp64" in r]
        copies = [r["d2d_copy_TBps_read_plus_write"] for r in runs if "d2d_copy_TBps_read_plus_write" in r]
        parts.append(f"active: bf16 GEMM median >= {min(medians):.0f} TFLOP/s, max rel. error "
                     f"{max(errors):.2g}, copy >= {min(copies):.2f} TB/s")
    links = readings.infiniband
    if links and infiniband.ready(links):
        parts.append(f"InfiniBand: {len(links['ports'])} ports ACTIVE at >= {links['expected']['gbps']} Gb/s")
    probe = readings.gpudirect
    if probe and not probe.get("failures"):
        parts.append(f"GPUDirect RDMA (DMA-BUF): {len(probe.get('gpus') or [])} GPUs on "
                     f"{len(probe.get('hcas') or [])} InfiniBand HCAs, {probe.get('registered')} registrations")
    parts += [f"note: {note}" for note in readings.notes]  # what was not checked
    return "; ".join(parts)


def decide(state: State, findings: list[Finding], ok_summary: str, at: str,
           node_name: str, node_uid: str | None = None) -> Report:
    """The condition to report after a check, sticky per boot. Pure (`at` is the time)."""
    faults = [f for f in findings if f.taints]
    if faults:
        status, reason = "False", p.camel(faults[0].check)
        if faults[0].check == "xid":
            reason = "Xid" + faults[0].message.split()[1]  # "Xid 79 ..." -> Xid79
        message = p.cut("\n".join(f.line() for f in faults), p.MESSAGE_LIMIT,
                        f"all faults: journalctl -u kilonode-gpu-health on {node_name}")
    elif state.failed:
        # sticky: a fault seen earlier in this boot stays reported until a reboot or a person
        status, reason, message = "False", state.reason or "Failed", state.message or ""
    else:
        # what was seen but does not take the node out (an application's Xid, a model
        # without floors) is said too: a pass names what it did not judge
        recorded = [f.line() for f in findings if not f.taints]
        text = ok_summary + ("".join(f"\nrecorded, not tainting: {line}" for line in recorded))
        status, reason, message = "True", p.REASON_PASSED, p.cut(text, p.MESSAGE_LIMIT, "see the agent's log")
    return _report(state, status, reason, message, at, node_name, node_uid, faults)


def request_check(state: State, at: str, node_name: str) -> Report:
    return _report(state, "Unknown", p.REASON_CHECK_REQUESTED,
                   "no GPU pod and no GPU process on the node: the agent asks for the GPUs for its idle active "
                   "check", at, node_name, None, [], event=False)


def fabric_pending(state: State, at: str, node_name: str, waiting: list[GpuReading], wait_s: int) -> Report:
    """Unknown while the GPUs' fabric registration is awaited. The message names how many GPUs
    and the bound, not each GPU's state, so it does not change (and is not written again) as
    the GPUs register one by one."""
    return _report(state, "Unknown", p.REASON_FABRIC_PENDING,
                   f"waiting for NVSwitch fabric registration (Fabric Manager) of {len(waiting)} GPU(s) before the "
                   f"first active check, at most {wait_s} s", at, node_name, None, [], event=False)


def cuda_pending(state: State, at: str, node_name: str, wait_s: int) -> Report:
    """Unknown, the same reason as fabric_pending, while the active check's CUDA says the
    system is not ready (cudaErrorSystemNotReady, 802): where nvidia-smi cannot show the
    fabric's state (A100 HGX: N/A even with Fabric Manager running), CUDA says it. The message
    does not change between tries, so it is written once."""
    return _report(state, "Unknown", p.REASON_FABRIC_PENDING,
                   "CUDA reports the system not ready (cudaErrorSystemNotReady, 802): waiting for Fabric Manager "
                   f"to finish training the NVSwitch fabric before the first active check, at most {wait_s} s", at,
                   node_name, None, [], event=False)


def infiniband_pending(state: State, at: str, node_name: str, expected: tuple[int, int], wait_s: int) -> Report:
    """Unknown while the size's InfiniBand ports are awaited (attached, ACTIVE, at their rate)
    before the first check. The message names the expectation and the bound, not each port's
    state, so it does not change (and is not written again) as the ports come up."""
    return _report(state, "Unknown", p.REASON_INFINIBAND_PENDING,
                   f"waiting for {expected[0]} InfiniBand ports ACTIVE at {expected[1]} Gb/s (the size's links) before "
                   f"the first check, at most {wait_s} s in all with the fabric wait", at, node_name, None, [],
                   event=False)


def rdma_plugin_pending(state: State, at: str, node_name: str, rescan_s: int) -> Report:
    """Unknown, the InfiniBand reason, while a first pass waits for the RDMA device plugin's next
    rescan (await_rdma_plugin). Written once: the message does not change while it waits."""
    return _report(state, "Unknown", p.REASON_INFINIBAND_PENDING,
                   f"every InfiniBand port is up; waiting until {rescan_s} s (the RDMA device plugin's "
                   "periodicUpdateInterval) have passed since, so that rdma/ib hands a pod every HCA, before the "
                   "first report", at, node_name, None, [], event=False)


def _report(state: State, status: str, reason: str, message: str, at: str, node_name: str,
            node_uid: str | None, faults: list[Finding], event: bool = True) -> Report:
    changed = (status, reason, message) != (state.status, state.reason, state.message)
    transition = state.transition if status == state.status and state.transition else at
    new = State(state.boot_id, status, reason, message, transition, state.failed or status == "False",
                state.last_active, state.last_sent)
    condition = {"type": p.CONDITION, "status": status, "reason": reason, "message": message,
                 "lastHeartbeatTime": at, "lastTransitionTime": transition}
    node = {"metadata": {"name": node_name, "uid": node_uid or node_name}}
    record = None
    if changed and event:
        record = p.node_event(node, kind="Warning" if status == "False" else "Normal",
                              reason="GPUUnhealthy" if status == "False" else "GPUHealthy",
                              message=message, action="Check", controller=AGENT, instance=node_name)
    return Report(condition, record, new, faults, changed)


def check_results(findings: list[Finding], active_ran: bool, unusable: str | None) -> dict[str, str]:
    """Each kind of check's result, for the metrics record: the passive readings fail on a
    tainting finding of theirs; the active check (when it was asked for and the GPUs could be
    queried at all) on a tainting finding of its own, unless it could not run or was voided."""
    passive = [f for f in findings if not f.check.startswith(ACTIVE_RULES)]
    results = {PASSIVE: "failed" if any(f.taints for f in passive) else "passed"}
    if active_ran:
        own = [f for f in findings if f.check.startswith(ACTIVE_RULES)]
        results[ACTIVE] = ("unusable" if unusable else "shared" if any(f.check == SHARED for f in own)
                           else "failed" if any(f.taints for f in own) else "passed")
    return results


def burn_figures(burn: dict[str, Any] | None) -> list[Figures]:
    """Per GPU, the figures the rules judged (burn.json: one run, or one per GPU under "gpus")."""
    def number(x: Any) -> float | None:
        return float(x) if isinstance(x, int | float) and not isinstance(x, bool) else None

    runs = (burn or {}).get("gpus") or ([burn] if burn else [])
    return [Figures(str(run.get("index", i)), number((run.get("gemm_bf16_8192") or {}).get("tflops_median")),
                    number(run.get("gemm_bf16_max_rel_error_vs_fp64")),
                    number(run.get("d2d_copy_TBps_read_plus_write")))
            for i, run in enumerate(runs) if isinstance(run, dict)]


def status_patch(condition: dict[str, Any]) -> dict[str, Any]:
    """A strategic merge patch of nodes/<name>/status: conditions merge by `type`
    (patchMergeKey in k8s.io/api core/v1 NodeStatus), so only GPUHealthy changes."""
    return {"status": {"conditions": [condition]}}


def gpu_pods(pods: list[dict[str, Any]]) -> list[str]:
    """Pods on the node, not finished, whose containers request or limit nvidia.com/gpu."""
    found = []
    for pod in pods:
        if pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
            continue
        spec = pod.get("spec", {})
        for container in [*spec.get("containers", []), *(spec.get("initContainers") or [])]:
            resources = container.get("resources", {}) or {}
            wanted = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
            if str(wanted.get(GPU_RESOURCE, "0")) not in ("0", ""):
                meta = pod.get("metadata", {})
                found.append(f"{meta.get('namespace', '')}/{meta.get('name', '')}")
                break
    return found


# --- collecting (runs the tools) -----------------------------------------------------------

def _run(command: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, capture_output=True, text=True, timeout=TOOL_TIMEOUT_S, check=False)


def smi_xml() -> str:
    """`nvidia-smi -q -x`. Raises UnusableInput when nvidia-smi cannot run at all."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        raise UnusableInput("nvidia-smi is not installed (the GPU image's NVIDIA driver utilities)")
    result = _run([smi, "-q", "-x"])
    if result.returncode != 0:
        raise UnusableInput(f"nvidia-smi -q -x exited {result.returncode}: {result.stderr.strip()[:300]}")
    return result.stdout


def collect(directory: Path, expect_infiniband: tuple[int, int] | None = None) -> None:
    """Record the passive outputs in `directory` in read_dir's layout (the InfiniBand ports
    where the size's are expected). Raises UnusableInput when nvidia-smi cannot run at all (the
    caller reports that as a fault)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / SMI_XML).write_text(smi_xml())
    ports = directory / INFINIBAND_JSON
    if expect_infiniband is not None:
        ports.write_text(json.dumps(infiniband.reading(*expect_infiniband, sysfs=infiniband.SYS_INFINIBAND), indent=2))
    else:
        ports.unlink(missing_ok=True)
    # NVLink state (kilonode.gpu.nvml); without NVML read_dir notes it as not checked
    links = nvml.nvlink_states()
    if links is not None:
        (directory / NVML_JSON).write_text(json.dumps(links, indent=2))
    else:
        (directory / NVML_JSON).unlink(missing_ok=True)
    # the kernel log since this boot (journald keeps it even after the ring buffer wraps),
    # filtered here: `--grep` exits 1 both for "no match" and for "no journal at all"
    target = directory / KERNEL_LOG
    log = _run(["journalctl", "-k", "-b", "-o", "short-monotonic", "--no-pager"])
    if log.returncode == 0 and "No journal files were found" not in log.stderr:
        target.write_text("".join(line + "\n" for line in log.stdout.splitlines() if "NVRM" in line))
    else:
        # not a GPU fault: read_dir notes the kernel log as not checked, and a pass says so
        target.unlink(missing_ok=True)
        print(f"the kernel log cannot be read (journalctl -k -b: exit {log.returncode}, {log.stderr.strip()[:200]!r})",
              file=sys.stderr)


def gpu_processes() -> list[str]:
    result = _run(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"])
    if result.returncode != 0:
        return [f"nvidia-smi failed: {result.stderr.strip()[:200]}"]  # unknown: count as busy
    return [line.strip() for line in result.stdout.splitlines() if line.strip()]


def check(config: AgentConfig, work: Path, active: bool, recorded: Path | None,
          busy: Callable[[], list[str]] | None = None,
          not_ready_until: float | None = None) -> tuple[NodeReadings | None, list[Finding], str | None]:
    """Passive checks, and the active one if asked. Returns the readings, the findings, and
    why the active check could not run (None: it ran, or was not asked). `busy` (the GPU
    pods and processes now on the node) is asked again once the active check has run: a
    GPU pod that got onto the node meanwhile (bound before the check taint landed, or one
    that tolerates it) shared the GPUs, so the figures are thrown away, not judged.
    `not_ready_until` (time.monotonic(), the fabric wait's deadline): before it, an active
    check that met cudaErrorSystemNotReady (802) raises active.SystemNotReady for the caller
    to try again; from it (or without it), that is a fault naming the error and the wait."""
    from . import active as active_check

    unusable = None
    shared: Finding | None = None
    if recorded is not None:
        source = recorded
    else:
        source = work
        if active:
            # a passive check keeps judging this boot's last active figures (work is in /run)
            (work / BURN_JSON).unlink(missing_ok=True)
        if active or not config.expect_gpudirect_rdma:
            (work / GPUDIRECT_JSON).unlink(missing_ok=True)  # and the last probe's answer, where asked for
        try:
            collect(work, config.expect_infiniband)
        except UnusableInput as error:
            return None, [Finding("nvidia-smi", None, "the GPUs cannot be queried", str(error))], None
        if active:
            try:
                burn = active_check.run(config.gpu_model or "")
                names = sorted({g.name for g in read_dir(work).gpus})
                burn["device"] = names[0] if len(names) == 1 else burn["device"]
                sharing = busy() if busy is not None else []
                if sharing:
                    shared = Finding(SHARED, None, "a GPU pod or process appeared during the active check: its "
                                     "figures are not judged", ", ".join(sharing), taints=False,
                                     action="active check again when the node is idle")
                else:
                    (work / BURN_JSON).write_text(json.dumps(burn, indent=2))
            except active_check.SystemNotReady as error:
                return _not_ready(config, work, error, not_ready_until)
            except active_check.CudaFailure as error:
                readings = read_dir(work)
                return readings, [*evaluate(readings, config.expect_gpus),
                                  Finding("active-check-error", None, "a CUDA call of the active check failed",
                                          str(error))], None
            except active_check.Unusable as error:
                unusable = str(error)
            if config.expect_gpudirect_rdma and shared is None:
                # with the GPUs to itself, as the active check (a CUDA context on each); after it,
                # so CUDA is known to start (the fabric trained) where the active check could run
                try:
                    probe = probe_gpudirect(not_ready_until)
                except active_check.SystemNotReady as error:
                    return _not_ready(config, work, error, not_ready_until)
                (work / GPUDIRECT_JSON).write_text(json.dumps(probe, indent=2))
    readings = read_dir(source)
    return readings, [*evaluate(readings, config.expect_gpus), *([shared] if shared else [])], unusable


def _not_ready(config: AgentConfig, work: Path, error: Exception,
               not_ready_until: float | None) -> tuple[NodeReadings, list[Finding], None]:
    """cudaErrorSystemNotReady (802) at CUDA's initialisation, in the active check's child or
    the GPUDirect RDMA probe's: raised again until the fabric wait's deadline (the fabric may
    still be training: the agent reports pending and tries again), a fault from it."""
    if not_ready_until is not None and time.monotonic() < not_ready_until:
        raise error
    waited = (f"; still so at the end of the {config.fabric_wait_s} s fabric wait (fabric_wait_s)"
              if not_ready_until is not None else "")
    readings = read_dir(work)
    return readings, [*evaluate(readings, config.expect_gpus),
                      Finding("active-check-error", None, "CUDA reports the system not ready "
                              "(cudaErrorSystemNotReady, 802): the NVSwitch fabric is not trained "
                              "(Fabric Manager not running, failed, or still training)",
                              str(error) + waited, action=FABRIC_ACTION)], None


def probe_gpudirect(not_ready_until: float | None) -> dict[str, Any]:
    """gpudirect.json (kilonode.gpu.gpudirect, its work in a child process). Where no InfiniBand
    device is there yet, probed again every HCA_RETRY_S until `not_ready_until` (the fabric
    wait's deadline, at the first check of a boot): the virtual functions may still be
    arriving. Raises active.SystemNotReady as the active check does."""
    from . import gpudirect

    while True:
        probe = gpudirect.run()
        missing = [f for f in probe.get("failures") or [] if f.get("kind") == gpudirect.KIND_NO_HCA]
        if not (missing and not_ready_until is not None and time.monotonic() < not_ready_until):
            return probe
        print(f"GPUDirect RDMA probe: {missing[0].get('message')}; trying again in {HCA_RETRY_S} s",
              file=sys.stderr)
        time.sleep(HCA_RETRY_S)


# --- the loop ---------------------------------------------------------------------------------

class Agent:
    def __init__(self, config: AgentConfig, dry_run: bool, recorded: Path | None) -> None:
        self.config = config
        self.dry_run = dry_run
        self.recorded = recorded
        self.node_name = config.node_name or socket.gethostname().strip().lower()
        boot = BOOT_ID.read_text().strip() if BOOT_ID.exists() else "unknown"
        self.state = State(boot) if dry_run else State.load(config.state_dir, boot)
        # what it did, for Prometheus (kilonode.gpu.metrics); none in a dry run
        self.record = None if dry_run else AgentRecord.begin(config.state_dir / METRICS_FILE, boot, time.time(),
                                                             config.expect_gpus)
        self.client: Any = None
        self.fabric_deadline: float | None = None  # time.monotonic() the fabric wait ends (set once)
        # time.monotonic() await_infiniband last saw every port there (None: not awaited, or reported since)
        self.links_up_at: float | None = None

    def api(self) -> Any:
        if self.client is None:
            from .kubeapi import Client, load_kubeconfig

            self.client = Client(load_kubeconfig(self.config.kubeconfig))
        return self.client

    def save_record(self) -> None:
        """The metrics record; a failure to write it is said, and changes nothing else."""
        if self.record is None:
            return
        try:
            self.record.save(self.config.state_dir / METRICS_FILE)
        except OSError as error:
            print(f"the metrics record cannot be written: {error}", file=sys.stderr)

    def observe(self, active: bool, readings: NodeReadings | None, findings: list[Finding],
                unusable: str | None) -> None:
        if self.record is None:
            return
        at = time.time()
        for kind, result in check_results(findings, active and readings is not None, unusable).items():
            self.record.note_check(kind, at, result)
        self.record.note_findings((f.check, f.taints) for f in findings)
        if readings is None:
            self.record.gpus = None  # nvidia-smi could not say
        else:
            self.record.gpus, self.record.driver = len(readings.gpus), readings.driver
            self.record.model = ", ".join(sorted({g.name for g in readings.gpus})) or None
            self.record.figures = burn_figures(readings.burn)
        self.save_record()

    def send(self, report: Report) -> None:
        patch = status_patch(report.condition)
        if self.record is not None:
            self.record.condition = report.condition["status"]
        if not self.dry_run and not report.changed and time.time() - self.state.last_sent < self.config.heartbeat_s:
            # nothing changed: no write (each Node write is a watch event for every Node
            # watcher in the cluster); a heartbeat now and then says the agent still runs
            self.state = report.state
            self.state.save(self.config.state_dir)
            self.save_record()
            return
        if self.dry_run:
            print(json.dumps({"patch": f"/api/v1/nodes/{self.node_name}/status",
                              "contentType": "application/strategic-merge-patch+json", "body": patch}, indent=2))
            if report.event:
                print(json.dumps({"create": f"/api/v1/namespaces/{p.EVENT_NAMESPACE}/events",
                                  "body": report.event}, indent=2))
        else:
            node = self.api().patch_node_status(self.node_name, patch)
            if report.event:
                report.event["involvedObject"]["uid"] = node.get("metadata", {}).get("uid", self.node_name)
                self.api().create_event(report.event)
            report.state.last_sent = time.time()
            if self.record is not None:
                self.record.last_report = report.state.last_sent
        self.state = report.state
        if not self.dry_run:
            self.state.save(self.config.state_dir)
            self.save_record()
        for fault in report.faults:
            print(f"FAULT {fault.line()}", file=sys.stderr)

    def busy(self) -> list[str]:
        """The GPU pods bound to this node (any phase but finished: bound and not yet running
        counts) and the processes using a GPU: while there is one, the GPUs are not the
        agent's to take."""
        return gpu_pods(self.api().list_pods_on(self.node_name)) or gpu_processes()

    def full_check(self, active: bool) -> int:
        if self.dry_run:
            with tempfile.TemporaryDirectory(prefix="kilonode-gpu-health-") as work:
                return self._full_check(Path(work), active)
        return self._full_check(self.config.state_dir / "readings", active)

    def _full_check(self, work: Path, active: bool) -> int:
        from .active import SystemNotReady

        # --from and --dry-run read no cluster: there is no pod to share the GPUs with
        guard = None if self.dry_run else self.busy
        told = False
        while True:
            # cudaErrorSystemNotReady (802) is sticky for the process that met it; the active
            # check's CUDA ran in a child that is gone, so a try after the sleep starts afresh.
            # Until the fabric wait's deadline (set by await_fabric before the first active
            # check of a boot; none later) it is pending, as the fabric wait is: on A100 HGX
            # nvidia-smi shows the fabric state N/A (bottlerocket-os/bottlerocket PR #3873), so
            # await_fabric had nothing to wait for and this is where the training shows.
            try:
                readings, findings, unusable = check(self.config, work, active, self.recorded, guard,
                                                     self.fabric_deadline)
                break
            except SystemNotReady as error:
                print(f"active check: {error}; the NVSwitch fabric is not trained yet, trying again in "
                      f"{CUDA_RETRY_S} s", file=sys.stderr)
                if not told and not self.state.failed:
                    self.send(cuda_pending(self.state, p.now(), self.node_name, self.config.fabric_wait_s))
                    told = True
                time.sleep(CUDA_RETRY_S)
        if active and not any(f.check == SHARED for f in findings):
            self.state.last_active = time.time()  # a shared run does not count: the re-check stays due
        self.observe(active, readings, findings, unusable)
        if unusable and not any(f.taints for f in findings):
            # not a pass and not a GPU fault: the node stays pending (no True)
            print(f"active check unusable: {unusable}", file=sys.stderr)
            report = _report(self.state, "Unknown", "ActiveCheckUnusable", p.cut(unusable, p.MESSAGE_LIMIT, "log"),
                             p.now(), self.node_name, None, [])
            self.send(report)
            return 2
        ok = summary(readings, self.config.expect_gpus, self.config.gpu_model) if readings else ""
        report = decide(self.state, findings, ok, p.now(), self.node_name)
        if report.condition["status"] == "True" and self.await_rdma_plugin():
            report = decide(self.state, findings, ok, p.now(), self.node_name)
        self.send(report)
        return 0 if report.condition["status"] == "True" else 1

    def idle_recheck(self) -> bool:
        """Ask for the GPUs, wait for the controller's taint, run the active check. False: it
        did not run (a GPU pod or process, or no taint in time); the caller checks passively,
        which also lifts the taint (the condition leaves Unknown)."""
        api = self.api()
        if self.busy():
            return False
        self.send(request_check(self.state, p.now(), self.node_name))
        deadline = time.monotonic() + self.config.taint_wait_s
        while time.monotonic() < deadline:
            taints = api.get_node(self.node_name).get("spec", {}).get("taints") or []
            if any(t.get("key") == p.CHECK_TAINT for t in taints):
                break
            time.sleep(POLL_S)
        else:
            print("the controller did not add the check-running taint in time: no idle check", file=sys.stderr)
            return False
        if self.busy():
            return False  # a GPU pod was bound before the taint landed: leave the GPUs to it
        self.full_check(active=True)
        return True

    def fabric_gpus(self) -> list[GpuReading]:
        """The GPUs as nvidia-smi -q -x reports them now (or as recorded, with --from)."""
        if self.recorded is not None:
            path = self.recorded / SMI_XML
            return parse_smi_xml(path.read_text(errors="replace"), str(path))[1]
        return parse_smi_xml(smi_xml(), "nvidia-smi -q -x")[1]

    def await_fabric(self) -> bool:
        """Before the first active check of a boot: wait until every GPU that has an NVSwitch
        fabric is registered with it (state Completed, status Success). The unit starts after
        nvidia-fabricmanager.service has started, not after Fabric Manager has trained the
        fabric, and CUDA initialised before that fails with cudaErrorSystemNotReady (802),
        sticky for the process. GPUs without a fabric state (N/A, Not Supported: PCIe sizes,
        and A100 HGX, whose nvidia-smi says N/A even with Fabric Manager running) are not
        waited for here; on them an 802 from the active check's child process is pending
        until the same deadline (_full_check). Reports Unknown/FabricRegistrationPending while it waits (not over
        a failure already reported in this boot: that stays). The wait is bounded, once per
        agent process, by fabric_wait_s from the first call (an API error that restarts
        startup does not extend it). True: the active check may run. False: the deadline
        passed or a registration failed; the caller checks passively, and the rules
        (fabric-not-completed, fabric-failed) name each GPU, its state and its status."""
        if self.fabric_deadline is None:
            self.fabric_deadline = time.monotonic() + self.config.fabric_wait_s
        told = False
        while True:
            try:
                gpus = self.fabric_gpus()
            except UnusableInput:
                return True  # nvidia-smi cannot say: the check itself reports that, as a fault
            failed = [g for g in gpus if fabric_phase(g) == FABRIC_FAILED]
            waiting = [g for g in gpus if fabric_phase(g) == FABRIC_WAITING]
            if failed:
                print("NVSwitch fabric registration failed: " + "; ".join(
                    f"GPU {g.index} ({g.uuid}): {fabric_evidence(g)}" for g in failed), file=sys.stderr)
                return False
            if not waiting:
                return True
            if time.monotonic() >= self.fabric_deadline:
                print(f"NVSwitch fabric registration not Completed within {self.config.fabric_wait_s} s: " + "; ".join(
                    f"GPU {g.index} ({g.uuid}): {fabric_evidence(g)}" for g in waiting), file=sys.stderr)
                return False
            if not told and not self.state.failed:
                self.send(fabric_pending(self.state, p.now(), self.node_name, waiting, self.config.fabric_wait_s))
                told = True
            time.sleep(FABRIC_POLL_S)

    def await_infiniband(self) -> bool:
        """Before the first check of a boot, on pools that expect InfiniBand: wait until every
        port the size has is there, ACTIVE and at its rate (kilonode.gpu.infiniband). Azure
        attaches the InfiniBand virtual functions to a booting VM on its own schedule, and a port
        is ACTIVE only once the fabric's subnet manager has configured it. Reports
        Unknown/InfinibandLinksPending while it waits (not over a failure already reported in
        this boot), polling every HCA_RETRY_S, within the fabric wait's deadline (one bound for
        both: fabric_wait_s from the first of them). True: all there. False: the deadline
        passed; the caller checks passively, and the rules (infiniband-ports-missing,
        infiniband-port-down, infiniband-port-slow) name each port. Recorded outputs (--from)
        are judged as recorded: nothing to wait for."""
        expected = self.config.expect_infiniband
        if expected is None or self.recorded is not None:
            return True
        if self.fabric_deadline is None:
            self.fabric_deadline = time.monotonic() + self.config.fabric_wait_s
        told = False
        while True:
            found = infiniband.reading(*expected, sysfs=infiniband.SYS_INFINIBAND)
            if infiniband.ready(found):
                self.links_up_at = time.monotonic()
                return True
            if time.monotonic() >= self.fabric_deadline:
                print(f"InfiniBand ports not all ACTIVE at {expected[1]} Gb/s within {self.config.fabric_wait_s} s: "
                      + "; ".join(f"{kind} {subject}: {evidence}" for kind, subject, evidence
                                  in infiniband.problems(found)), file=sys.stderr)
                return False
            if not told and not self.state.failed:
                self.send(infiniband_pending(self.state, p.now(), self.node_name, expected,
                                             self.config.fabric_wait_s))
                told = True
            time.sleep(HCA_RETRY_S)

    def await_rdma_plugin(self) -> bool:
        """Before the first pass of a boot is reported (the controller then lifts the startup taint):
        wait until rdma_plugin_rescan_s have passed since await_infiniband saw every port there.
        Mellanox/k8s-rdma-shared-dev-plugin v1.5.3 finds the HCAs at its start and then once per
        periodicUpdateInterval (pkg/resources/resources_manager.go:386-420), lists one only when
        its netdev and its rdma_cm, umad and uverbs device nodes are there
        (pkg/resources/pci_net_device.go:31-58, rdma_device_spec.go:19), and hands a pod the devices
        of its last scan (server.go:369-391 Allocate, 445-490 UpdateDevices): a pod placed while a
        virtual function was still arriving gets fewer HCAs, and NCCL runs on fewer links. Any
        stretch of one interval holds a scan (or the plugin's start) after the ports were up, so
        by then every HCA is listed: its netdev and device nodes come with the HCA's registration
        (ib_ipoib, ib_umad and ib_uverbs loaded), before the subnet manager activates its port,
        which is what the agent waits for (not checked apart here). The active check usually takes
        longer than the interval, so this rarely waits. Once per boot; True if it waited (the
        caller decides again)."""
        up, self.links_up_at = self.links_up_at, None
        if up is None or not self.config.rdma_plugin_rescan_s:
            return False
        left = up + self.config.rdma_plugin_rescan_s - time.monotonic()
        if left <= 0:
            return False
        if not self.state.failed:
            self.send(rdma_plugin_pending(self.state, p.now(), self.node_name, self.config.rdma_plugin_rescan_s))
        time.sleep(left)
        return True

    def startup(self) -> None:
        """The first check of a boot. Its GPUs' fabric first (await_fabric): not registered in
        time, a passive check reports it. At the node's first registration the kubelet's startup
        taint keeps every GPU pod away: check at once. After a reboot the Node keeps its
        taints and its old condition (registerWithTaints applies at registration only) and
        its pods restart: ask for the GPUs as for an idle re-check, or check passively."""
        if self.state.last_active:
            self.full_check(active=False)  # a restart later in the boot: never take GPUs from a job
            return
        if not self.await_fabric() or not self.await_infiniband():
            # no CUDA on an unregistered fabric, no pass without the size's links: the passive
            # rules name each GPU or port
            self.full_check(active=False)
            return
        taints = self.api().get_node(self.node_name).get("spec", {}).get("taints") or []
        if any(t.get("key") == p.STARTUP_TAINT for t in taints):
            # the startup taint keeps the scheduler's pods away, not a pod that tolerates it
            # or one created with spec.nodeName (no scheduler, no taint check): with one
            # there, check passively and leave the active check to an idle re-check
            if self.busy():
                print("a GPU pod or process is on the node at startup: passive check only", file=sys.stderr)
                self.full_check(active=False)
            else:
                self.full_check(active=True)
        elif not self.idle_recheck():
            self.full_check(active=False)

    def loop(self) -> None:
        """Runs until stopped. An API or tool failure is logged and the step tried again
        after RETRY_S: the checks are local, and an apiserver outage or a kubelet still in
        its TLS bootstrap (no kubeconfig yet) must not end the agent."""
        from .kubeapi import ApiError, KubeconfigError

        started = False
        self.save_record()  # readable from the start: the first check takes minutes
        while True:
            try:
                if not started:
                    self.startup()
                    started = True
                else:
                    # due: a day after the last active check, or at once in a boot that has had none
                    due = time.time() - self.state.last_active >= self.config.active_interval_s
                    if not (due and self.state.status == "True" and self.idle_recheck()):
                        self.full_check(active=False)
            except (ApiError, KubeconfigError, OSError, subprocess.TimeoutExpired) as error:
                print(f"error: {error}; trying again in {RETRY_S} s", file=sys.stderr)
                if self.record is not None:
                    self.record.errors += 1
                    self.save_record()
                time.sleep(RETRY_S)
                continue
            time.sleep(self.config.passive_interval_s)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m kilonode.gpu.agent", description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--dry-run", action="store_true", help="print the bodies it would send; change nothing")
    parser.add_argument("--once", action="store_true", help="one full check and report, then exit")
    parser.add_argument("--from", dest="recorded", type=Path, metavar="DIR",
                        help="recorded outputs (nvidia-smi-q.xml, dmesg-xid.txt, nvml.json, burn.json) instead of "
                        "running nvidia-smi and the active check")
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config)
        agent = Agent(config, args.dry_run, args.recorded)
        if args.once or args.dry_run:
            # recorded outputs are judged as recorded; on the node, the fabric is awaited first
            return agent.full_check(active=args.recorded is not None
                                    or (agent.await_fabric() and agent.await_infiniband()))
        agent.loop()
    except (ConfigError, UnusableInput) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
