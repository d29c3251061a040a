"""Benchmark: what the optional leases etcd cluster (etcd.leases) buys the main store (issue 27).

Every kubelet renews its node Lease (kube-node-lease) every 10 s: nodes/10 writes per second,
each an update of a ~787-byte Lease (limits.yaml leaseObjectBytes, measured). With etcd.leases,
kube-apiserver's `--etcd-servers-overrides=...,coordination.k8s.io/leases#...` sends them to a
cluster of their own. This measures, on this machine and with real etcd, the main cluster's put
latency while the renewals go into it (shared) and while they go into the leases cluster
(split), side by side in one run: the rehearsal of research-7500 with a 3-member leases cluster
added (written to a scratch stack file; the shipped stack has none) through `kilonode local up`
(5 main + 3 events + 3 leases members, real etcd, TLS with client certificates from the
project's PKI; all eleven share the machine's cores), then three phases of PHASE_S seconds,
ROUNDS times in turn:

    idle               the main load alone (no renewals anywhere);
    leases_split       the main load, and the renewals into the leases cluster (etcd.leases set);
    leases_in_main     the main load, and the same renewals into the main cluster (unset).

Main load: open loop at RATE puts/s, each overwriting one Node's key (/registry/minions/node-N,
N over the stack's nodes) with a value of the measured Node size (limits.yaml nodeObjectBytes),
round-robin over the main members: node-status-like writes, standing for everything else the
main store takes (statuses, pods, controllers). Latency runs from each put's scheduled time
(coordinated omission corrected, as bench_etcd_isolation.py, whose client, protobuf encoding and
statistics this reuses): a stall shows in every put scheduled during it.

Lease load: LEASE_CLIENTS processes, open loop together at the lease rate, each put overwriting
one node's Lease (/registry/leases/kube-node-lease/node-N, in node order as renewals come round)
with a LEASE_BYTES value, round-robin over the target cluster's members; their latency is kept
too. It starts LEASE_WARMUP_S before the main load and stops when the main load's window ends.
After a leases_in_main phase the Lease keys are deleted from the main cluster, so the next phase
does not inherit them.

The rate, scaled to this machine: research-7500's nodes renew at nodes/10 = ~750 writes/s (at
100,000 nodes it would be 10,000/s). Before the phases a calibration measures how many such
puts the main cluster absorbs here with nothing else running (closed loop, CALIBRATE_WINDOW
puts in flight per client, CALIBRATE_S seconds), and the lease rate is the smaller of nodes/10
and LOAD_FRACTION of that (about 2,350-2,500/s here, so about 470-500 renewals/s: two thirds of
research-7500's, a twentieth of 100,000 nodes'): loaded, not saturated, when it shares the main
cluster. The result says both figures and the factor. Note what one machine cannot show: the split layout's leases
cluster runs on the same two cores and the same disk as the main one, so the split here isolates
etcd's raft log, its backend and its fsyncs, not CPU or disk; on separate VMs it isolates those
too.

Writes bench/results/lease-split.json. Run: `make bench-leases` or
`.venv/bin/python bench/bench_lease_split.py [--phase-s 30 --rounds 2]` (~4-5 minutes).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.util
import inspect
import json
import math
import multiprocessing
import os
import resource
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "lease-split.json"
STACK = "research-7500"  # the largest shipped shape; the bench adds etcd.leases to a scratch copy
LEASES_MEMBERS = 3


def _isolation() -> ModuleType:
    """bench_etcd_isolation.py beside this file: its gRPC client, protobuf and statistics."""
    name = "bench_etcd_isolation"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


iso = _isolation()

RATE = 160.0  # main puts/s, offered (the isolation bench's rate)
ROUNDS = 2
PHASE_S = 30.0
LEASE_WARMUP_S = 3.0
LEASE_CLIENTS = 2
LEASE_RENEW_S = 10  # kubelet: a quarter of nodeLeaseDurationSeconds (40 s); limits.yaml leaseRenewSeconds
CALIBRATE_S = 6.0
CALIBRATE_WINDOW = 32  # puts in flight per calibration client
# of the calibrated capacity: the most the lease load may offer. The calibration's closed loop
# batches 64 puts into each fsync and raft entry; open-loop renewals batch far less, so they cost
# more each: at 0.5 (750/s here, 2026-11-27) the split layout alone took both cores, and the
# comparison measured CPU starvation, not etcd. 0.2 leaves the machine headroom.
LOAD_FRACTION = 0.2
PUT_TIMEOUT_S = 10.0
DRAIN_S = 10.0
LEASE_PREFIX = b"/registry/leases/kube-node-lease/"
NODE_PREFIX = b"/registry/minions/"
# phase -> where the renewals go (None: nowhere). The shared layout runs last: its Leases are
# deleted from the main cluster after it, but its history stays until compaction
PHASES: dict[str, str | None] = {"idle": None, "leases_split": "leases", "leases_in_main": "main"}


def delete_range_request(prefix: bytes) -> bytes:
    """etcdserverpb DeleteRangeRequest { bytes key = 1; bytes range_end = 2; }: every key under
    `prefix` (range_end is the prefix with its last byte plus one, etcd's prefix convention)."""
    end = prefix[:-1] + bytes([prefix[-1] + 1])
    return iso._length_delimited(1, prefix) + iso._length_delimited(2, end)


def lease_rate(nodes: int, capacity: float, fraction: float = LOAD_FRACTION) -> tuple[float, float]:
    """(offered renewals/s, scale factor): nodes/10, or `fraction` of what the main cluster
    absorbed in the calibration where that is less."""
    wanted = nodes / LEASE_RENEW_S
    rate = min(wanted, math.floor(capacity * fraction))
    return float(rate), rate / wanted


# --- the load clients -------------------------------------------------------------------------

def calibrate_worker(endpoints: list[str], tls: Any, window: int, duration_s: float, keys: int, value_bytes: int,
                     index: int, pipe: Connection) -> None:
    """Closed loop: `window` Lease-sized puts in flight for `duration_s`; puts answered."""
    channel = iso.Channel(endpoints[index % len(endpoints)], tls)
    value = os.urandom(value_bytes)
    slots = threading.Semaphore(window)
    answered: list[float] = []
    lock = threading.Lock()

    def record(future: Any) -> None:
        with contextlib.suppress(Exception):
            iso.revision_of(future.result())
            with lock:
                answered.append(time.monotonic())
        slots.release()

    channel.put(iso.put_request(b"/registry/bench/warmup", b"x"), timeout=PUT_TIMEOUT_S)
    pipe.send("ready")
    start = pipe.recv()
    n = index
    while time.monotonic() < start + duration_s:
        if not slots.acquire(timeout=0.2):
            continue
        key = LEASE_PREFIX + b"node-%05d" % (n % keys)
        n += LEASE_CLIENTS
        channel.put.future(iso.put_request(key, value), timeout=PUT_TIMEOUT_S).add_done_callback(record)
    for _ in range(window):
        slots.acquire(timeout=PUT_TIMEOUT_S)
    channel.close()
    pipe.send(sum(1 for t in answered if start <= t <= start + duration_s))


def delete_prefix(cluster: Any, prefix: bytes) -> None:
    channel = iso.Channel(cluster.endpoints[0], cluster.tls)
    try:
        channel.channel.unary_unary("/etcdserverpb.KV/DeleteRange")(delete_range_request(prefix), timeout=60)
    finally:
        channel.close()


def _spawn(target: Callable[..., None], *args: Any) -> tuple[Any, Connection]:
    context = multiprocessing.get_context("spawn")  # fresh interpreters: gRPC and fork do not mix
    parent, child = context.Pipe()
    process = context.Process(target=target, args=(*args, child))
    process.start()
    return process, parent


def _ready(pipes: Sequence[Connection]) -> None:
    for pipe in pipes:
        if not pipe.poll(30) or pipe.recv() != "ready":
            raise RuntimeError("a client did not get ready in 30 s")


def _join(processes: Sequence[Any]) -> None:
    for process in processes:
        process.join(timeout=PUT_TIMEOUT_S + 5)
        if process.is_alive():
            process.kill()  # ours, by its PID (multiprocessing keeps it)
            process.join(timeout=5)


def calibrate(main: Any, nodes: int, duration_s: float, progress: Callable[[str], None]) -> dict[str, Any]:
    """How many Lease-sized puts the main cluster absorbs here with nothing else running."""
    clients = [_spawn(calibrate_worker, main.endpoints, main.tls, CALIBRATE_WINDOW, duration_s, nodes,
                      LEASE_BYTES, i) for i in range(LEASE_CLIENTS)]
    try:
        _ready([p for _, p in clients])
        start = time.monotonic() + 0.2
        for _, pipe in clients:
            pipe.send(start)
        counts = []
        for _, pipe in clients:
            if not pipe.poll(duration_s + PUT_TIMEOUT_S + 30):
                raise RuntimeError("a calibration client did not report")
            counts.append(pipe.recv())
    finally:
        _join([p for p, _ in clients])
    delete_prefix(main, LEASE_PREFIX)
    capacity = sum(counts) / duration_s
    progress(f"calibration: the main cluster alone absorbed {capacity:.0f} Lease puts/s "
             f"({LEASE_CLIENTS} clients x {CALIBRATE_WINDOW} in flight, {duration_s:g} s)")
    return {"puts_per_s": round(capacity, 1), "clients": LEASE_CLIENTS, "in_flight_per_client": CALIBRATE_WINDOW,
            "seconds": duration_s, "value_bytes": LEASE_BYTES}


# --- a phase ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PhaseRun:
    main: Any  # iso.Run
    leases: list[Any]  # iso.Run per lease client
    detail: dict[str, Any]


def _run_of(result: dict[str, Any]) -> Any:
    outcomes = [iso.Outcome(d, s, e, k) for d, s, e, k in zip(result["due"], result["sent"], result["done"],
                                                               result["ok"], strict=True)]
    return iso.Run(outcomes, result["start"], result["drained_at"])


def run_phase(name: str, clusters: dict[str, Any], target: str | None, rate: float, renewals: float,
              duration_s: float, nodes: int, progress: Callable[[str], None]) -> PhaseRun:
    main = clusters["main"]
    load = _spawn(iso.open_loop_worker, main.endpoints, main.tls, rate, NODE_PREFIX + b"node-%05d", nodes,
                  NODE_BYTES, 0, 1)
    leases = []
    if target is not None:
        where = clusters[target]
        leases = [_spawn(iso.open_loop_worker, where.endpoints, where.tls, renewals / LEASE_CLIENTS,
                         LEASE_PREFIX + b"node-%05d", nodes, LEASE_BYTES, i, LEASE_CLIENTS)
                  for i in range(LEASE_CLIENTS)]
    processes = [load[0], *(p for p, _ in leases)]
    try:
        _ready([load[1], *(p for _, p in leases)])
        etcd_pids = {role: c.pids for role, c in clusters.items()}
        client_pids = [p.pid for p in processes if p.pid is not None]
        now = time.monotonic()
        lease_start, start = now + 0.2, now + 0.2 + (LEASE_WARMUP_S if leases else 0.0)
        for i, (_, pipe) in enumerate(leases):
            # the clients' schedules interleave: client i's puts fall between the others'
            pipe.send((lease_start + i / max(renewals, 1e-9), duration_s + LEASE_WARMUP_S))
        load[1].send((start, duration_s))
        if leases:
            progress(f"  {name}: {renewals:.0f} Lease renewals/s into the {target} cluster, "
                     f"{LEASE_WARMUP_S:.0f} s before the main load ...")
        time.sleep(max(0.0, start - time.monotonic()))
        load0, busy0 = iso.loadavg(), iso.machine_cpu()
        etcd0 = {r: iso.process_cpu(p) for r, p in etcd_pids.items()}
        clients0 = iso.process_cpu(client_pids)
        wall0 = time.monotonic()
        progress(f"  {name}: {rate:.0f} node-status puts/s into the main cluster for {duration_s:.0f} s ...")
        time.sleep(max(0.0, start + duration_s - time.monotonic()))
        load1, busy1 = iso.loadavg(), iso.machine_cpu()
        etcd1 = {r: iso.process_cpu(p) for r, p in etcd_pids.items()}
        clients1 = iso.process_cpu(client_pids)
        window = time.monotonic() - wall0
        results = []
        for pipe in [load[1], *(p for _, p in leases)]:
            if not pipe.poll(duration_s + LEASE_WARMUP_S + DRAIN_S + 30):
                raise RuntimeError("a load client did not report")
            results.append(pipe.recv())
    finally:
        _join(processes)
    if target == "main":
        delete_prefix(main, LEASE_PREFIX)  # the next phase starts without them
    main_run, lease_runs = _run_of(results[0]), [_run_of(r) for r in results[1:]]
    etcd_cpu = {role: etcd1[role] - etcd0[role] for role in etcd_pids}
    detail: dict[str, Any] = {
        "main": iso.summarise_runs([main_run], duration_s) | {
            "errors_by_kind": results[0]["errors"],
            "worst_latency_ms_per_second": iso.worst_per_second(main_run.outcomes, main_run.start, duration_s,
                                                                main_run.end),
            "client_cpu_fraction_of_a_core": round(results[0]["cpu_s"] / (main_run.end - main_run.start), 3),
        },
        "load_average": {"start": load0, "end": load1},
        "cpu_seconds": {**{f"etcd_{role}": round(cpu, 2) for role, cpu in etcd_cpu.items()},
                        "bench_clients": round(clients1 - clients0, 2),
                        "whole_machine": round(busy1[0] - busy0[0], 2),
                        "window_s": round(window, 2)},
        "cpu_cores_used": {
            "whole_machine": round((busy1[0] - busy0[0]) / window, 2),
            "stolen_by_the_hypervisor": round((busy1[1] - busy0[1]) / window, 2),
            **{f"etcd_{role}": round(cpu / window, 2) for role, cpu in etcd_cpu.items()},
            "bench_clients": round((clients1 - clients0) / window, 2),
            "others": round(((busy1[0] - busy0[0]) - sum(etcd_cpu.values()) - (clients1 - clients0)) / window, 2),
        },
    }
    if lease_runs:
        detail["leases"] = _lease_summary(lease_runs, main_run.start, duration_s, [r["errors"] for r in results[1:]])
    return PhaseRun(main_run, lease_runs, detail)


def _lease_summary(runs: Sequence[Any], window_start: float, duration_s: float,
                   errors: Sequence[dict[str, int]]) -> dict[str, Any]:
    """The renewals answered during the main load's window, and their latency over the whole load."""
    total: Counter[str] = Counter()
    for e in errors:
        total.update(e)
    in_window = sum(1 for r in runs for o in r.outcomes
                    if o.ok and o.done is not None and window_start <= o.done <= window_start + duration_s)
    everything = iso.summarise_runs(runs, duration_s + LEASE_WARMUP_S)
    return {"achieved_puts_per_s_during_main_load": round(in_window / duration_s, 1),
            "offered_puts_per_s": round(everything["offered_puts_per_s"] * len(runs), 1),
            "latency_ms": everything["latency_ms"], "ok": everything["ok"], "errors": sum(total.values()),
            "errors_by_kind": dict(total)}


def pooled(runs: Sequence[PhaseRun], target: str | None, duration_s: float) -> dict[str, Any]:
    phase: dict[str, Any] = {"renewals_into": target,
                             "main": iso.summarise_runs([r.main for r in runs], duration_s)}
    if target is not None:
        phase["leases"] = {
            "achieved_puts_per_s_during_main_load": round(
                sum(r.detail["leases"]["achieved_puts_per_s_during_main_load"] for r in runs) / len(runs), 1),
            "latency_ms": iso.summarise_runs([x for r in runs for x in r.leases],
                                             duration_s + LEASE_WARMUP_S)["latency_ms"],
            "errors": sum(r.detail["leases"]["errors"] for r in runs),
        }
    keys = runs[0].detail["cpu_seconds"]
    phase["cpu_seconds"] = {k: round(sum(r.detail["cpu_seconds"][k] for r in runs), 2) for k in keys}
    phase["rounds"] = [r.detail for r in runs]
    return phase


# --- main ---------------------------------------------------------------------------------------

def _limits() -> tuple[int, int]:
    from kilonode.catalog.limits import limits

    etcd = limits().etcd
    return etcd.node_object_bytes.value, etcd.lease_object_bytes.value


NODE_BYTES, LEASE_BYTES = _limits()


def scratch_stack(directory: Path) -> Path:
    """research-7500 with etcd.leases (LEASES_MEMBERS members, the events cluster's shape), as a
    stack file of the same name in `directory`."""
    from kilonode.paths import EXAMPLE_STACKS_DIR

    document = yaml.safe_load((EXAMPLE_STACKS_DIR / f"Pulumi.{STACK}.yaml").read_text())
    etcd = document["config"]["kilonode:cluster"]["etcd"]
    etcd["leases"] = {**{k: v for k, v in etcd.get("events", {}).items() if k != "members"},
                      "members": LEASES_MEMBERS}
    path = directory / f"Pulumi.{STACK}.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def _ratios(phases: dict[str, Any]) -> dict[str, Any] | None:
    if "leases_split" not in phases or "leases_in_main" not in phases:
        return None
    split, shared = phases["leases_split"]["main"], phases["leases_in_main"]["main"]

    def ratio(a: float, b: float) -> float | None:
        return round(a / b, 2) if b else None

    return {"main_p50": ratio(shared["latency_ms"]["p50"], split["latency_ms"]["p50"]),
            "main_p99": ratio(shared["latency_ms"]["p99"], split["latency_ms"]["p99"]),
            "main_max": ratio(shared["latency_ms"]["max"], split["latency_ms"]["max"]),
            "etcd_main_cpu_s": ratio(phases["leases_in_main"]["cpu_seconds"]["etcd_main"],
                                     phases["leases_split"]["cpu_seconds"]["etcd_main"])}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--phase-s", type=float, default=PHASE_S, help="seconds of main load per phase and round")
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="times the phases run, in turn")
    parser.add_argument("--rate", type=float, default=RATE, help="main (node-status) puts/s, open loop")
    parser.add_argument("--lease-rate", type=float, default=None,
                        help="renewals/s (default: nodes/10, or LOAD_FRACTION of the calibrated capacity if less)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if (args.phase_s, args.rounds, args.rate, args.lease_rate) != (PHASE_S, ROUNDS, RATE, None) \
            and args.out == RESULTS:
        parser.error(f"a run with other settings does not replace {RESULTS.relative_to(ROOT)}: pass --out")

    from kilonode.config import load_stack
    from kilonode.local import rehearsal
    from kilonode.plan import plan_stack

    def progress(line: str) -> None:
        print(line, flush=True)

    began, cpu_began = time.monotonic(), _own_cpu()
    before = iso.loadavg()
    progress(f"load average before: {before} ({os.cpu_count()} cores)")
    scratch = Path(tempfile.mkdtemp(prefix="kilonode-bench-leases-"))
    state_dir = scratch / "state"
    stack = load_stack(str(scratch_stack(scratch)))
    plan = plan_stack(stack)
    nodes = plan.most_nodes
    etcd_only = {"worker": False} if "worker" in inspect.signature(rehearsal.up).parameters else {}
    etcd_cpu_total: dict[str, float] = {}
    try:
        up0 = time.monotonic()
        result = rehearsal.up(stack, plan, state_dir, lambda line: progress(f"  {line}"), **etcd_only)
        up_s = time.monotonic() - up0
        if not result.ok:
            raise SystemExit("the rehearsal is not healthy: " + "; ".join(e for c in result.clusters for e in c.errors))
        clusters = iso.clusters_of(state_dir.absolute())
        members = {role: len(c.pids) for role, c in clusters.items()}
        progress(f"rehearsal up in {up_s:.1f} s: {members}")
        etcd0 = {role: iso.process_cpu(c.pids) for role, c in clusters.items()}
        calibration = calibrate(clusters["main"], nodes, CALIBRATE_S, progress)
        if args.lease_rate is not None:
            renewals, scale = args.lease_rate, args.lease_rate / (nodes / LEASE_RENEW_S)
        else:
            renewals, scale = lease_rate(nodes, calibration["puts_per_s"])
        progress(f"renewals: {nodes:,} nodes / {LEASE_RENEW_S} s = {nodes / LEASE_RENEW_S:.0f}/s wanted, "
                 f"{renewals:.0f}/s offered (x{scale:.2f})")
        runs: dict[str, list[PhaseRun]] = {name: [] for name in PHASES}
        for round_ in range(1, args.rounds + 1):
            for name, target in PHASES.items():
                progress(f"round {round_}/{args.rounds}, {name}:")
                run = run_phase(name, clusters, target, args.rate, renewals, args.phase_s, nodes, progress)
                runs[name].append(run)
                m = run.detail["main"]
                progress(f"  {name}: main p50 {m['latency_ms']['p50']} ms, p99 {m['latency_ms']['p99']} ms, "
                         f"max {m['latency_ms']['max']} ms, {m['achieved_puts_per_s']} puts/s, errors {m['errors']}"
                         + (f"; renewals {run.detail['leases']['achieved_puts_per_s_during_main_load']}/s, p99 "
                            f"{run.detail['leases']['latency_ms']['p99']} ms" if "leases" in run.detail else "")
                         + f"; etcd main {run.detail['cpu_cores_used']['etcd_main']} cores, machine "
                         f"{run.detail['cpu_cores_used']['whole_machine']}")
        phases = {name: pooled(r, PHASES[name], args.phase_s) for name, r in runs.items()}
        etcd_cpu_total = {role: round(iso.process_cpu(c.pids) - etcd0[role], 1) for role, c in clusters.items()}
        db = {s.role: s.db_size for s in rehearsal.status(state_dir)[1]}
    finally:
        record = rehearsal.Record.load(state_dir.absolute()) if state_dir.exists() else None
        if record is not None and record.stack == STACK:
            rehearsal.down(state_dir, keep=False, progress=lambda line: None)  # stops what up started, by PID
        (scratch / f"Pulumi.{STACK}.yaml").unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            scratch.rmdir()

    ratios = _ratios(phases)
    document = {
        "what": "main etcd put latency with the kubelets' Lease renewals in the main cluster (leases_in_main) and in "
                "a leases cluster of their own (leases_split, etcd.leases), and with no renewals (idle): issue 27",
        "date_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": iso.machine(),
        "etcd_version": result.record.etcd_version,
        "stack": f"{STACK} with etcd.leases ({LEASES_MEMBERS} members) added in a scratch copy",
        "members": members,
        "nodes": nodes,
        "renewals": {
            "wanted_per_s": round(nodes / LEASE_RENEW_S, 1),
            "offered_per_s": renewals,
            "scale": round(scale, 3),
            "how_scaled": f"nodes/{LEASE_RENEW_S} s is what the stack's kubelets write; offered is the smaller of that "
                          f"and {LOAD_FRACTION:g} of the Lease puts the main cluster absorbed here alone in the "
                          "calibration (closed loop), so that the shared layout is loaded, not saturated, on this "
                          f"{os.cpu_count()}-core machine where all {sum(members.values())} members and the clients "
                          "share the cores and one disk",
            "calibration": calibration,
        },
        "method": {
            "main_load": f"open loop, {args.rate:g} puts/s, each a {NODE_BYTES} B value (a Node as measured, "
                         f"limits.yaml) overwriting one of {nodes:,} node keys, round-robin over the main members, "
                         "gRPC over TLS with the apiserver's etcd client certificate; latency from each put's "
                         "scheduled time; nearest-rank percentiles over both rounds' puts",
            "lease_load": f"{LEASE_CLIENTS} open-loop clients together at the offered rate, each put a {LEASE_BYTES} "
                          f"B value overwriting one of {nodes:,} node Lease keys, round-robin over the target "
                          f"cluster's members; starts {LEASE_WARMUP_S:g} s before the main load; the Lease keys are "
                          "deleted from the main cluster after each leases_in_main phase",
            "phase_s": args.phase_s,
            "rounds": args.rounds,
            "order": list(PHASES),
            "one_machine": "the split layout's leases cluster shares the cores and the disk with the main one here: "
                           "it isolates etcd's raft log, backend and fsyncs, not CPU or disk (on Azure each cluster "
                           "has its own VMs)",
        },
        "load_average_before": before,
        "rehearsal_up_s": round(up_s, 1),
        "db_size_bytes_after": db,
        "phases": phases,
        "shared_over_split": ratios,
        "etcd_cpu_s_whole_run": etcd_cpu_total,
        "bench_wall_s": round(time.monotonic() - began, 1),
        "bench_process_cpu_s": round(_own_cpu() - cpu_began, 1),
        "bench_clients_cpu_s": round(sum(p["cpu_seconds"]["bench_clients"] for p in phases.values()), 1),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(document, indent=2) + "\n")
    if ratios is not None:
        progress(f"renewals in main / in their own cluster: main p50 x{ratios['main_p50']}, p99 x{ratios['main_p99']}, "
                 f"main etcd CPU x{ratios['etcd_main_cpu_s']}")
    progress(f"wrote {args.out}")
    return 0


def _own_cpu() -> float:
    """CPU seconds of this process alone (the load clients' are per phase, etcd's per cluster,
    both read from /proc)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    return own.ru_utime + own.ru_stime


if __name__ == "__main__":
    sys.exit(main())
