"""What the GPU health agent and the taint controller have been doing, as Prometheus metrics.

Each writes a small record of its own work to a JSON file in its runtime directory (/run,
tmpfs), replaced atomically; a socket unit (Accept=yes, kilonode.render.gpu_metrics) starts
this module once per scrape, which reads the record and answers one HTTP request on stdin and
stdout:

    python3 -m kilonode.gpu.metrics agent --state /run/kilonode/gpu-health/metrics.json
    python3 -m kilonode.gpu.metrics controller --state /run/kilonode/gpu-health-controller/metrics.json
    (--print: the metrics alone on stdout, by hand)

Why a record and not a listener in the agent and the controller: neither is a server, and a
port held by a long-running process with the kubelet's credentials (the agent) or a
cluster-wide Node writer (the controller) is more to harden than a short-lived process that
reads one file as a dynamic user and exits. The record says what a scrape cannot see from the
Node objects kube-state-metrics exports: when the checks last ran and what they found, what
the active check measured, when the agent last managed to write its condition; when each
controller last had a current view of the Nodes, and what it wrote.

A record that is missing, unreadable, of another shape, or (the agent's) of another boot gives
the series `..._state_readable 0` and nothing else, never an error answer: the scrape
succeeds and the alert rules see it (docs/monitoring.md). Standard library only, and nothing
of the agent's or the controller's own modules but the protocol's names: this runs per scrape.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import tempfile
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from . import protocol as p

# Where each keeps its record: the agent's runtime directory (its unit's RuntimeDirectory, the
# default stateDir of kilonode.gpu.agent) and the controller's (its unit's RuntimeDirectory).
AGENT_STATE_DIR = "/run/kilonode/gpu-health"
CONTROLLER_STATE_DIR = "/run/kilonode/gpu-health-controller"
METRICS_FILE = "metrics.json"
AGENT_RECORD = f"{AGENT_STATE_DIR}/{METRICS_FILE}"
CONTROLLER_RECORD = f"{CONTROLLER_STATE_DIR}/{METRICS_FILE}"
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
FORMAT = 1  # the record's layout; a reader finding another says so (state_readable 0)

# The agent's two kinds of check and the results each can have (one series per pair, 1 for the
# last result): passive readings pass or fail; the active check may also not run (unusable: no
# CUDA libraries) or be voided (shared: a GPU pod or process appeared while it ran).
PASSIVE, ACTIVE = "passive", "active"
RESULTS = {PASSIVE: ("passed", "failed"), ACTIVE: ("passed", "failed", "unusable", "shared")}
STATUSES = ("True", "False", "Unknown")
# The taints the controller adds and removes (kilonode.gpu.protocol): one counter each.
TAINTS = (p.STARTUP_TAINT, p.FAULT_TAINT, p.CHECK_TAINT)
MAX_REQUEST = 8192  # a scrape's request line and one header; anything longer is not Prometheus
MAX_HEADERS = 100
# What a record of another shape raises while it is read (each means: not readable).
BAD_RECORD = (ValueError, TypeError, KeyError, AttributeError)


def write_atomic(path: Path, data: dict[str, Any]) -> None:
    """Replace `path` with `data` as JSON in one rename, so a scrape reads the old record or the
    new one, never half of one. 0644: the per-scrape process runs as a dynamic user, and the
    record holds counts, times and figures only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(data, handle, indent=1, sort_keys=True, allow_nan=False)
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("format") == FORMAT else None


# --- the agent's record ---------------------------------------------------------------------------
@dataclass
class Figures:
    """One GPU's active-check figures, as burn.json records them (kilonode.gpu.active)."""

    gpu: str
    gemm_bf16_tflops_median: float | None = None
    gemm_max_relative_error: float | None = None
    copy_tbps: float | None = None


@dataclass
class AgentRecord:
    """What the agent did in this boot. Checks: kind -> {"at": time.time(), "result"}; findings
    of the last check: [rule, tainting, count]."""

    boot_id: str
    first_start: float  # the agent's first start in this boot (restarts keep it)
    checks: dict[str, dict[str, Any]] = field(default_factory=dict)
    condition: str | None = None  # the status the agent last reported or would report
    findings: list[list[Any]] = field(default_factory=list)
    gpus: int | None = None  # GPUs nvidia-smi listed in the last check
    expect_gpus: int | None = None
    driver: str | None = None
    model: str | None = None
    figures: list[Figures] = field(default_factory=list)  # of the last active check in this boot
    last_report: float | None = None  # the last condition written to the API
    errors: int = 0  # steps that failed (API, kubeconfig, file, tool timeout) and were retried
    format: int = FORMAT

    @classmethod
    def begin(cls, path: Path, boot: str, now: float, expect_gpus: int) -> AgentRecord:
        """This boot's record as a restarted agent left it, or a new one."""
        data = read_json(path)
        if data is not None and data.get("boot_id") == boot:
            with contextlib.suppress(*BAD_RECORD):
                record = cls.from_json(data)
                record.expect_gpus = expect_gpus
                return record
        return cls(boot, now, expect_gpus=expect_gpus)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> AgentRecord:
        """The record as written; ValueError (or TypeError, KeyError) for anything else."""
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        record = cls(**{**known, "figures": [Figures(**f) for f in known.get("figures", [])]})
        _check_agent(record)
        return record

    def note_check(self, check: str, at: float, result: str) -> None:
        if result not in RESULTS[check]:
            raise ValueError(f"{check} check result {result!r}: not one of {RESULTS[check]}")
        self.checks[check] = {"at": at, "result": result}

    def note_findings(self, found: Iterable[tuple[str, bool]]) -> None:
        """The last check's findings, (rule, tainting) each, counted per pair."""
        counts: dict[tuple[str, bool], int] = {}
        for rule, tainting in found:
            counts[(rule, tainting)] = counts.get((rule, tainting), 0) + 1
        self.findings = [[rule, tainting, n] for (rule, tainting), n in sorted(counts.items())]

    def save(self, path: Path) -> None:
        write_atomic(path, asdict(self))


def _number(value: Any, where: str, optional: bool = True) -> None:
    if (value is None and optional) or (isinstance(value, int | float) and not isinstance(value, bool)):
        return
    raise ValueError(f"{where}: not a number: {value!r}")


def _check_agent(r: AgentRecord) -> None:
    _number(r.first_start, "first_start", optional=False)
    for check, last in r.checks.items():
        if check not in RESULTS or last.get("result") not in RESULTS[check]:
            raise ValueError(f"checks.{check}: {last!r}")
        _number(last.get("at"), f"checks.{check}.at", optional=False)
    if r.condition not in (None, *STATUSES):
        raise ValueError(f"condition: {r.condition!r}")
    for rule, tainting, count in r.findings:
        if not (isinstance(rule, str) and isinstance(tainting, bool) and isinstance(count, int)):
            raise ValueError(f"findings: {[rule, tainting, count]!r}")
    for name in ("gpus", "expect_gpus", "last_report"):
        _number(getattr(r, name), name)
    _number(r.errors, "errors", optional=False)
    for f in r.figures:
        for name in ("gemm_bf16_tflops_median", "gemm_max_relative_error", "copy_tbps"):
            _number(getattr(f, name), f"figures.{name}")


# --- the controller's record ----------------------------------------------------------------------
# The controller changes Nodes often at scale (a node's every GPUHealthy change); its record is
# written at most every SAVE_EVERY_S while it works, and at once after a list or a watch.
SAVE_EVERY_S = 10.0


@dataclass
class ControllerRecord:
    start: float
    last_sync: float | None = None  # a list reconciled, or a watch the apiserver ended normally
    lists: int = 0
    nodes: int = 0  # Nodes in the last list
    nodes_reporting: int = 0  # of which with a GPUHealthy condition
    taints_added: dict[str, int] = field(default_factory=dict)
    taints_removed: dict[str, int] = field(default_factory=dict)
    writes: int = 0  # Node PUTs that took
    conflicts: int = 0  # PUTs refused 409 (decided again on the Node as it then was)
    gave_up: int = 0  # Nodes left to the next resync after CONFLICT_RETRIES conflicts
    event_errors: int = 0  # Events that could not be recorded
    errors: int = 0  # list or watch failures (the loop listed again)
    format: int = FORMAT
    saved: float = field(default=0.0, metadata={"local": True})  # when last written (not in the file)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ControllerRecord:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__ and k != "saved"}
        record = cls(**known)
        _number(record.start, "start", optional=False)
        _number(record.last_sync, "last_sync")
        for name in ("lists", "nodes", "nodes_reporting", "writes", "conflicts", "gave_up", "event_errors",
                     "errors"):
            _number(getattr(record, name), name, optional=False)
        for counts in (record.taints_added, record.taints_removed):
            for key, n in counts.items():
                _number(n, f"taints.{key}", optional=False)
        return record

    def note_write(self, before: dict[str, Any], after: dict[str, Any]) -> None:
        """A Node PUT that took: the taint keys it added and removed."""
        self.writes += 1
        old, new = _taint_keys(before), _taint_keys(after)
        for key in new - old:
            self.taints_added[key] = self.taints_added.get(key, 0) + 1
        for key in old - new:
            self.taints_removed[key] = self.taints_removed.get(key, 0) + 1

    def note_list(self, items: list[dict[str, Any]], at: float) -> None:
        self.lists += 1
        self.nodes = len(items)
        self.nodes_reporting = sum(1 for node in items if p.gpu_condition(node) is not None)
        self.last_sync = at

    def save(self, path: Path, now: float, force: bool = False) -> None:
        if not force and now - self.saved < SAVE_EVERY_S:
            return
        data = {k: v for k, v in asdict(self).items() if k != "saved"}
        write_atomic(path, data)
        self.saved = now


def _taint_keys(node: dict[str, Any]) -> set[str]:
    return {str(t.get("key")) for t in node.get("spec", {}).get("taints") or []}


# --- the exposition ---------------------------------------------------------------------------------
def label(raw: str) -> str:
    """A label value as the text format needs it: backslash, double quote and line feed escaped,
    other control characters replaced (a driver string is the only text not kilonode's own)."""
    text = "".join(c if c == "\n" or c.isprintable() else "\ufffd" for c in raw)
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def value(number: float) -> str:
    if math.isnan(number):
        return "NaN"
    if math.isinf(number):
        return "+Inf" if number > 0 else "-Inf"
    return repr(float(number)) if isinstance(number, float) else str(number)


class Exposition:
    """Families in order, each HELP and TYPE once, then its samples."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def family(self, name: str, kind: str, text: str, samples: Iterable[tuple[dict[str, str], float]]) -> None:
        self.lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}"]
        for labels, number in samples:
            inner = ",".join(f'{k}="{label(v)}"' for k, v in labels.items())
            self.lines.append(f"{name}{{{inner}}} {value(number)}" if inner else f"{name} {value(number)}")

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def _readable(out: Exposition, prefix: str, readable: bool, why_not: str) -> None:
    out.family(f"{prefix}_state_readable", "gauge", f"Whether the record could be read (1) or not (0: {why_not}).",
               [({}, int(readable))])


A = "kilonode_gpu_health"
AGENT_UNREADABLE = "missing, unparsable, or another boot's"


def agent_metrics(data: dict[str, Any] | None, boot: str | None) -> str:
    """The agent's exposition from its record (None: none could be read); `boot`: this boot's ID."""
    out = Exposition()
    try:
        record = AgentRecord.from_json(data) if data is not None else None
    except BAD_RECORD:
        record = None
    if record is None or (boot is not None and record.boot_id != boot):
        _readable(out, A, False, AGENT_UNREADABLE)
        return out.text()
    _readable(out, A, True, AGENT_UNREADABLE)
    _agent_checks(out, record)
    _agent_gpus(out, record)
    return out.text()


def _agent_checks(out: Exposition, r: AgentRecord) -> None:
    out.family(f"{A}_first_start_timestamp_seconds", "gauge", "When the agent first started in this boot.",
               [({}, r.first_start)])
    out.family(f"{A}_last_check_timestamp_seconds", "gauge",
               "When the last check of each kind finished in this boot (every check reads the passive readings; "
               "absent: none yet).", [({"check": c}, r.checks[c]["at"]) for c in RESULTS if c in r.checks])
    out.family(f"{A}_check_result", "gauge", "The last check's result (1), by kind; all 0 before the first.",
               [({"check": c, "result": result}, int(r.checks.get(c, {}).get("result") == result))
                for c, results in RESULTS.items() for result in results])
    out.family(f"{A}_condition", "gauge", f"The {p.CONDITION} status the agent last reported (1).",
               [({"status": s}, int(r.condition == s)) for s in STATUSES])
    out.family(f"{A}_findings", "gauge",
               "Findings of the last check by rule, tainting (takes the node out) or recorded only; absent: none.",
               [({"rule": rule, "tainting": str(tainting).lower()}, n) for rule, tainting, n in r.findings])
    out.family(f"{A}_last_report_timestamp_seconds", "gauge",
               f"When the agent last wrote its {p.CONDITION} condition to the API (absent: not in this boot).",
               [({}, r.last_report)] if r.last_report is not None else [])
    out.family(f"{A}_errors_total", "counter",
               "Steps that failed (API, kubeconfig, file or tool timeout) and were tried again, in this boot.",
               [({}, r.errors)])


def _agent_gpus(out: Exposition, r: AgentRecord) -> None:
    out.family(f"{A}_gpus", "gauge", "GPUs nvidia-smi listed in the last check.",
               [({}, r.gpus)] if r.gpus is not None else [])
    out.family(f"{A}_gpus_expected", "gauge", "GPUs the node's size has.",
               [({}, r.expect_gpus)] if r.expect_gpus is not None else [])
    out.family(f"{A}_driver_info", "gauge", "The NVIDIA driver nvidia-smi reported, and the GPUs' model.",
               [({"driver": r.driver, "model": r.model or ""}, 1)] if r.driver else [])
    figures = [(f.gpu, f) for f in r.figures]
    out.family(f"{A}_active_gemm_bf16_flops_per_second", "gauge",
               "The last active check's bf16 GEMM (8192^3) median throughput, per GPU.",
               [({"gpu": g}, f.gemm_bf16_tflops_median * 1e12) for g, f in figures
                if f.gemm_bf16_tflops_median is not None])
    out.family(f"{A}_active_gemm_max_relative_error", "gauge",
               "The last active check's largest GEMM error relative to a float64 reference, per GPU.",
               [({"gpu": g}, f.gemm_max_relative_error) for g, f in figures if f.gemm_max_relative_error is not None])
    out.family(f"{A}_active_copy_bytes_per_second", "gauge",
               "The last active check's device-to-device copy, bytes read plus written per second, per GPU.",
               [({"gpu": g}, f.copy_tbps * 1e12) for g, f in figures if f.copy_tbps is not None])


C = "kilonode_gpu_health_controller"
CONTROLLER_UNREADABLE = "missing (the controller stopped), or unparsable"


def controller_metrics(data: dict[str, Any] | None) -> str:
    out = Exposition()
    try:
        record = ControllerRecord.from_json(data) if data is not None else None
    except BAD_RECORD:
        record = None
    if record is None:
        _readable(out, C, False, CONTROLLER_UNREADABLE)
        return out.text()
    r = record
    _readable(out, C, True, CONTROLLER_UNREADABLE)
    out.family(f"{C}_start_timestamp_seconds", "gauge", "When this controller process started.", [({}, r.start)])
    out.family(f"{C}_last_sync_timestamp_seconds", "gauge",
               "When the controller last had a current view of every Node: a list reconciled, or a watch the "
               "apiserver ended normally (absent: none yet).",
               [({}, r.last_sync)] if r.last_sync is not None else [])
    out.family(f"{C}_lists_total", "counter", "Full lists of the Nodes, each reconciled.", [({}, r.lists)])
    out.family(f"{C}_nodes", "gauge", "Nodes in the last list.", [({}, r.nodes)])
    out.family(f"{C}_nodes_reporting", "gauge", f"Nodes in the last list with a {p.CONDITION} condition.",
               [({}, r.nodes_reporting)])
    out.family(f"{C}_taints_added_total", "counter", "Taints the controller added, by key.",
               [({"taint": t}, r.taints_added.get(t, 0)) for t in TAINTS])
    out.family(f"{C}_taints_removed_total", "counter", "Taints the controller removed, by key.",
               [({"taint": t}, r.taints_removed.get(t, 0)) for t in TAINTS])
    out.family(f"{C}_node_writes_total", "counter", "Node writes (PUT) that took.", [({}, r.writes)])
    out.family(f"{C}_write_conflicts_total", "counter",
               "Node writes refused with 409 Conflict (the Node changed since it was read; decided again).",
               [({}, r.conflicts)])
    out.family(f"{C}_write_give_ups_total", "counter",
               "Nodes left to the next resync after repeated conflicting writes.", [({}, r.gave_up)])
    out.family(f"{C}_event_errors_total", "counter", "Events that could not be recorded.", [({}, r.event_errors)])
    out.family(f"{C}_errors_total", "counter", "List or watch failures, after each of which it listed again.",
               [({}, r.errors)])
    return out.text()


# --- one answer per connection ---------------------------------------------------------------------
def serve(stdin: BinaryIO, stdout: BinaryIO, body: str) -> None:
    """Answer one HTTP request (socket activation: the connection is stdin and stdout)."""
    method = stdin.readline(MAX_REQUEST).split(b" ", 1)[0]
    for _header in range(MAX_HEADERS):  # the headers, bounded: nothing in them changes the answer
        if stdin.readline(MAX_REQUEST) in (b"", b"\r\n", b"\n"):
            break
    if method not in (b"GET", b"HEAD"):
        stdout.write(b"HTTP/1.0 405 Method Not Allowed\r\nContent-Length: 0\r\n\r\n")
        stdout.flush()
        return
    data = body.encode()
    stdout.write(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n"
                 + f"Content-Length: {len(data)}\r\n\r\n".encode() + (data if method == b"GET" else b""))
    stdout.flush()


def this_boot() -> str | None:
    try:
        return BOOT_ID.read_text().strip()
    except OSError:
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m kilonode.gpu.metrics", description=__doc__.splitlines()[0])
    parser.add_argument("program", choices=("agent", "controller"))
    parser.add_argument("--state", type=Path, help="the record (default: where the program writes it)")
    parser.add_argument("--print", action="store_true", help="the metrics on stdout; no HTTP")
    args = parser.parse_args(argv)
    if args.program == "agent":
        body = agent_metrics(read_json(args.state or Path(AGENT_RECORD)), this_boot())
    else:
        body = controller_metrics(read_json(args.state or Path(CONTROLLER_RECORD)))
    if args.print:
        sys.stdout.write(body)
    else:
        serve(sys.stdin.buffer, sys.stdout.buffer, body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
