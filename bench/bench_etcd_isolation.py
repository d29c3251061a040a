"""Benchmark: what the separate events etcd cluster buys (issue 12, item 7).

The 7,500-node post sends Kubernetes Events to their own etcd cluster so that an event spike
cannot hurt the main store (docs/field-notes.md). This measures it on this machine, side by
side in one run: `kilonode local up research-2500` (5 main + 3 events members, real etcd,
TLS with client certificates from the project's PKI; all eight members share the machine's
cores), then three phases of PHASE_S seconds each, ROUNDS times in turn (other work on the
machine comes and goes; each layout should meet as much of it as the other):

    idle               the main load alone (the events cluster idle);
    storm_into_events  the main load, and an event storm into the events cluster (isolated);
    storm_into_main    the main load, and the same storm into the main cluster (the layout
                       without isolation: one cluster for everything).

Each phase's figures pool all its rounds' puts (percentiles over all of them, not an average
of per-round percentiles); each round's own figures are kept beside them.

Main load: open loop at RATE puts/s, each a ~1 KiB value overwriting one of 2,500 keys (a
node's status, say), round-robin over the 5 main members (as an apiserver's etcd client
spreads its requests). Each put is sent at its scheduled time whether or not earlier ones
have been answered (gRPC multiplexes them on one HTTP/2 connection per member), and its
latency runs from the scheduled time: a stall shows up in every put scheduled during it
instead of being hidden behind one slow put (coordinated omission). A put unanswered when
the phase ends counts with the time it has waited so far.

Event storm: STORM_CLIENTS processes, each as fast as it can with STORM_WINDOW puts in
flight, each put a new key with a ~1 KiB value attached to a lease, as kube-apiserver writes
an Event: `--event-ttl` (default 1 h) through its lease manager, which reuses one lease for
at most 60 s and 1,000 objects (k8s.io/apiserver pkg/storage/etcd3/lease_manager.go:
defaultLeaseReuseDurationSeconds = 60, defaultLeaseMaxObjectCount = 1000; the TTL granted is
the event TTL plus the reuse window). Leased puts, not plain ones: a leased put costs more to
apply, and on the etcd here (Debian's 3.4.23) more with every key already on the lease
(etcd-io/etcd#15993; mitigated without auth by #16005, backported to 3.4 by #16020 after
3.4.23), so plain puts would understate what an event storm costs the cluster it hits. When
a storm phase's main load has been measured, its clients revoke their leases (deleting the
keys, as the TTL would), so that no phase inherits another's events.

Storm window: the clients keep STORM_WINDOW puts in flight each because etcd batches what
is in flight into one raft entry and one fsync, so the storm's rate rises with the window and
does not level off before the machine's cores run out. Measured here alone into the events
cluster (2026-11-23, 6 s each, no main load): 1 in flight: ~520 events/s, 4: ~910, 8:
~1,220, 16: ~1,640, 32: ~2,100, 64: ~2,420, the machine at 1.8-2.0 of its 2 cores throughout.
32 is close to the ~1,600-2,250 events/s of the earlier measurement in docs/field-notes.md.

Client: etcd's gRPC API through grpcio (already installed: the Pulumi SDK is built on it),
with the few messages it needs (PutRequest, LeaseGrantRequest, LeaseRevokeRequest, and the
revision and lease ID of the replies) encoded here by hand (field numbers from etcd's
etcdserverpb/rpc.proto). It was measured against the JSON gateway (`/v3/kv/put` over TLS
with http.client, no dependency), one put in flight: ~10-15% more client CPU per put
(~410-540 us against ~370-480 us), ~0.5 ms less etcd CPU per put (the gateway decodes JSON
and re-sends each request to etcd's own gRPC server: registerGateway in embed/serve.go), so
less in all; and it keeps puts in flight without a thread or connection each.
`measure_client_cost` repeats that comparison in every run (results: "client_cost"). PyPI's
etcd clients were no better here: etcd3gw (gateway, requests) costs ~3x the client CPU and
its `ca_cert` loses to $REQUESTS_CA_BUNDLE (set on this machine); aetcd (gRPC) opens
insecure channels only (no TLS); python-etcd3 was last released in 2020.

The measuring client must not be the bottleneck: it runs in its own process (the storm
clients in theirs), at nice -10 where allowed, and the results record its CPU use and how
late each put left against its schedule ("send_lag_ms"); a late send is counted in the
latency anyway. Its headroom, checked with `--phases idle --rate 640` (4x RATE): 639.6 of 640
puts/s answered, the client at 0.39 of a core, sends 1.7 ms late at the median (2026-11-23).

Writes bench/results/etcd-isolation.json. Run: `make bench-etcd` or
`.venv/bin/python bench/bench_etcd_isolation.py [--phase-s 30 --rounds 2]` (~4 minutes).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import datetime
import http.client
import inspect
import json
import math
import multiprocessing
import os
import platform
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "etcd-isolation.json"
STACK = "research-2500"  # 5 main + 3 events members: the shape the issue measures

RATE = 160.0  # main puts/s, offered
# two rounds of the three phases, in turn: other work on the machine comes and goes, and each
# layout should meet as much of it as the other
ROUNDS = 2
PHASE_S = 30.0
STORM_WARMUP_S = 3.0  # the storm runs this long before the main load starts, to reach its pace
STORM_CLIENTS = 2
STORM_WINDOW = 32  # puts in flight per storm client (see the docstring)
VALUE_BYTES = 1024  # an Event (and a typical object) stored by kube-apiserver: ~1 KiB
MAIN_KEYS = 2500  # the main load overwrites these in turn
MAIN_KEY_FORMAT = b"/registry/bench/objects/%04d"
EVENT_TTL_S = 3600  # kube-apiserver --event-ttl default
LEASE_REUSE_S = 60  # lease_manager.go: min(5% of the TTL, 60 s)
LEASE_MAX_KEYS = 1000  # lease_manager.go: defaultLeaseMaxObjectCount
PUT_TIMEOUT_S = 10.0
DRAIN_S = 10.0  # after a phase, how long unanswered puts may still finish
CLIENT_COST_PUTS = 800
CLK_TCK = os.sysconf("SC_CLK_TCK")
# phase -> where the storm goes (None: no storm). The shared layout runs last: its storm leaves
# its events in the main cluster, which the other phases should not carry
PHASES: dict[str, str | None] = {"idle": None, "storm_into_events": "events", "storm_into_main": "main"}


# --- protobuf, by hand: the few etcdserverpb messages this uses ------------------------------
# etcd-io/etcd api/etcdserverpb/rpc.proto (v3.4: etcdserver/etcdserverpb/rpc.proto):
#   PutRequest { bytes key = 1; bytes value = 2; int64 lease = 3; ... }
#   PutResponse { ResponseHeader header = 1; ... }
#   ResponseHeader { uint64 cluster_id = 1; uint64 member_id = 2; int64 revision = 3; uint64 raft_term = 4; }
#   LeaseGrantRequest { int64 TTL = 1; int64 ID = 2; }
#   LeaseGrantResponse { ResponseHeader header = 1; int64 ID = 2; int64 TTL = 3; string error = 4; }
#   LeaseRevokeRequest { int64 ID = 1; }

def varint(value: int) -> bytes:
    if value < 0:
        value += 1 << 64  # int64 on the wire: two's complement, ten bytes
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _length_delimited(field: int, data: bytes) -> bytes:
    return varint(field << 3 | 2) + varint(len(data)) + data


def put_request(key: bytes, value: bytes, lease: int = 0) -> bytes:
    message = _length_delimited(1, key) + _length_delimited(2, value)
    if lease:  # proto3: a zero field is not sent
        message += varint(3 << 3) + varint(lease)
    return message


def lease_grant_request(ttl_s: int) -> bytes:
    return varint(1 << 3) + varint(ttl_s)


def lease_revoke_request(lease_id: int) -> bytes:
    return varint(1 << 3) + varint(lease_id)


def fields(message: bytes) -> dict[int, list[int | bytes]]:
    """Top-level fields of a protobuf message: varints as ints, length-delimited as bytes."""
    found: dict[int, list[int | bytes]] = {}
    i = 0

    def read_varint() -> int:
        nonlocal i
        shift = result = 0
        while True:
            byte = message[i]
            i += 1
            result |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                return result

    while i < len(message):
        tag = read_varint()
        number, wire = tag >> 3, tag & 7
        value: int | bytes
        if wire == 0:
            value = read_varint()
        elif wire == 2:
            length = read_varint()
            value, i = message[i:i + length], i + length
        elif wire == 1:
            value, i = int.from_bytes(message[i:i + 8], "little"), i + 8
        elif wire == 5:
            value, i = int.from_bytes(message[i:i + 4], "little"), i + 4
        else:
            raise ValueError(f"protobuf wire type {wire} in field {number}")
        found.setdefault(number, []).append(value)
    return found


def revision_of(put_response: bytes) -> int:
    """The revision a put was committed at (its header's field 3): proof it was applied."""
    header = fields(put_response).get(1, [b""])[0]
    assert isinstance(header, bytes)
    revision = fields(header).get(3, [0])[0]
    assert isinstance(revision, int)
    return revision


def lease_id_of(grant_response: bytes) -> int:
    found = fields(grant_response)
    if 4 in found:
        error = found[4][0]
        raise RuntimeError(f"LeaseGrant: {error.decode() if isinstance(error, bytes) else error}")
    lease = found.get(2, [0])[0]
    assert isinstance(lease, int)
    return lease


# --- schedule and statistics ---------------------------------------------------------------

def schedule(rate: float, duration_s: float) -> list[float]:
    """Offsets (s) from the start at which an open-loop client sends: one every 1/rate."""
    return [i / rate for i in range(math.floor(rate * duration_s + 1e-9))]


def percentile(ordered: Sequence[float], p: float) -> float:
    """Nearest-rank percentile of an ascending sequence: the smallest value with at least p%
    of the values at or below it (no interpolation, so p99 is a latency that happened)."""
    if not ordered:
        return math.nan
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


@dataclass(frozen=True)
class Outcome:
    """One scheduled put: when it was due, when it left, when its answer came (None: never)."""

    due: float
    sent: float | None
    done: float | None
    ok: bool


def latencies(outcomes: Sequence[Outcome], end: float) -> list[float]:
    """Each put's latency from its scheduled time, ascending. An answered put (error or not)
    counts until its answer; an unanswered one until `end`, the time it has waited so far."""
    return sorted((o.done if o.done is not None else max(end, o.due)) - o.due for o in outcomes)


@dataclass(frozen=True)
class Run:
    """One phase's main load: its puts, when its window started, when the client stopped waiting."""

    outcomes: Sequence[Outcome]
    start: float
    end: float


def summarise_runs(runs: Sequence[Run], duration_s: float) -> dict[str, Any]:
    """Percentiles over the puts of all runs together (not an average of percentiles)."""
    values = sorted(v for r in runs for v in latencies(r.outcomes, r.end))
    outcomes = [o for r in runs for o in r.outcomes]
    ok = [o for o in outcomes if o.ok and o.done is not None]
    # answered within the phase's window: what the cluster kept up with
    in_window = sum(1 for r in runs for o in r.outcomes
                    if o.ok and o.done is not None and o.done <= r.start + duration_s)
    lags = sorted(o.sent - o.due for o in outcomes if o.sent is not None)
    seconds = duration_s * len(runs)
    ms = 1000.0
    return {
        "scheduled": len(outcomes),
        "ok": len(ok),
        "errors": sum(1 for o in outcomes if not o.ok and o.done is not None),
        "unanswered": sum(1 for o in outcomes if o.done is None),
        "offered_puts_per_s": round(len(outcomes) / seconds, 1),
        "achieved_puts_per_s": round(in_window / seconds, 1),
        "latency_ms": {
            "p50": round(percentile(values, 50) * ms, 2),
            "p90": round(percentile(values, 90) * ms, 2),
            "p99": round(percentile(values, 99) * ms, 2),
            "p999": round(percentile(values, 99.9) * ms, 2),
            "max": round(values[-1] * ms, 2) if values else math.nan,
        },
        "send_lag_ms": {
            "p50": round(percentile(lags, 50) * ms, 3),
            "p99": round(percentile(lags, 99) * ms, 3),
            "max": round(lags[-1] * ms, 3) if lags else math.nan,
        },
    }


def summarise(outcomes: Sequence[Outcome], start: float, duration_s: float, end: float) -> dict[str, Any]:
    return summarise_runs([Run(outcomes, start, end)], duration_s)


def worst_per_second(outcomes: Sequence[Outcome], start: float, duration_s: float, end: float) -> list[float]:
    """The longest latency (ms) of the puts due in each second of the phase: where stalls were."""
    worst = [0.0] * max(1, math.ceil(duration_s))
    for o in outcomes:
        slot = int(o.due - start)
        if 0 <= slot < len(worst):
            waited = (o.done if o.done is not None else max(end, o.due)) - o.due
            worst[slot] = max(worst[slot], round(waited * 1000, 1))
    return worst


def per_second(times: Sequence[float], start: float, duration_s: float) -> list[int]:
    counts = [0] * max(1, math.ceil(duration_s))
    for t in times:
        slot = int(t - start)
        if 0 <= slot < len(counts):
            counts[slot] += 1
    return counts


# --- the gRPC client ----------------------------------------------------------------------

@dataclass(frozen=True)
class Tls:
    ca: str
    cert: str
    key: str


class Channel:
    """One member's gRPC connection (TLS with the apiserver's etcd client certificate)."""

    def __init__(self, endpoint: str, tls: Tls) -> None:
        import grpc  # here, not at import: the parent process never opens a channel

        self.target = endpoint.removeprefix("https://")
        credentials = grpc.ssl_channel_credentials(
            Path(tls.ca).read_bytes(), Path(tls.key).read_bytes(), Path(tls.cert).read_bytes())
        self.channel = grpc.secure_channel(self.target, credentials)
        # bytes in, bytes out: the messages are encoded above
        self.put = self.channel.unary_unary("/etcdserverpb.KV/Put")
        self.grant = self.channel.unary_unary("/etcdserverpb.Lease/LeaseGrant")
        self.revoke = self.channel.unary_unary("/etcdserverpb.Lease/LeaseRevoke")

    def close(self) -> None:
        self.channel.close()


def _error_text(error: BaseException) -> str:
    code = getattr(error, "code", None)
    details = getattr(error, "details", None)
    if callable(code) and callable(details):
        return f"{code().name}: {(details() or '')[:120]}"
    return repr(error)[:160]


def _cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system


def _renice(increment: int) -> int:
    """Lower this process's nice value (more CPU priority) if allowed; the nice value it has."""
    with contextlib.suppress(OSError):
        os.nice(increment)
    return os.nice(0)


def open_loop_worker(endpoints: list[str], tls: Tls, rate: float, key_format: bytes, keys: int, value_bytes: int,
                     first: int, stride: int, pipe: Connection) -> None:
    """The measuring client: open loop at `rate` puts/s over the members, from one thread that
    only sends; answers are recorded by gRPC's callbacks. Put i overwrites the key `key_format`
    writes for (first + i * stride) % keys, so several such clients interleave over one key
    set. Sends "ready" once its TLS handshakes are done, then waits for (start, duration_s).
    bench_lease_split.py runs it too."""
    nice = _renice(-10)
    channels = [Channel(e, tls) for e in endpoints]
    value = os.urandom(value_bytes)
    for channel in channels:  # TLS handshakes before the clock starts
        channel.put(put_request(b"/registry/bench/warmup", value), timeout=PUT_TIMEOUT_S)
    pipe.send("ready")
    start, duration_s = pipe.recv()
    offsets = schedule(rate, duration_s)
    due = [start + offset for offset in offsets]
    sent: list[float | None] = [None] * len(offsets)
    done: list[float | None] = [None] * len(offsets)
    ok = [False] * len(offsets)
    errors: Counter[str] = Counter()
    lock = threading.Lock()

    def answered(i: int) -> Callable[[Any], None]:
        def record(future: Any) -> None:
            now = time.monotonic()
            try:
                revision_of(future.result())
                good = True
            except Exception as error:  # a failed put is a result, not a crash
                good = False
                with lock:
                    errors[_error_text(error)] += 1
            ok[i] = good
            done[i] = now  # last: the sending thread waits on `done`
        return record

    cpu0 = _cpu_seconds()
    for i in range(len(offsets)):
        wait = due[i] - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        key = key_format % ((first + i * stride) % keys)
        sent[i] = time.monotonic()
        future = channels[i % len(channels)].put.future(put_request(key, value), timeout=PUT_TIMEOUT_S)
        future.add_done_callback(answered(i))
    deadline = max(time.monotonic(), start + duration_s) + DRAIN_S
    while any(d is None for d in done) and time.monotonic() < deadline:
        time.sleep(0.05)
    cpu = _cpu_seconds() - cpu0
    drained = time.monotonic()
    for channel in channels:
        channel.close()
    pipe.send({"due": due, "sent": sent, "done": done, "ok": ok, "errors": dict(errors), "start": start,
               "drained_at": drained, "cpu_s": cpu, "nice": nice})


def storm_worker(index: int, endpoints: list[str], tls: Tls, window: int, pipe: Connection) -> None:
    """An event storm client: new keys under leases, as fast as it goes with `window` puts in
    flight, until told to stop."""
    channel = Channel(endpoints[index % len(endpoints)], tls)
    value = os.urandom(VALUE_BYTES)
    run = os.urandom(4).hex().encode()  # new keys even when a kept state dir already has a run's events
    slots = threading.Semaphore(window)
    completions: list[float] = []
    errors: Counter[str] = Counter()
    lock = threading.Lock()
    grants = 0
    leases: list[int] = []
    lease, lease_keys, lease_since = 0, 0, 0.0

    def record(future: Any) -> None:
        try:
            revision_of(future.result())
            with lock:
                completions.append(time.monotonic())
        except Exception as error:  # a failed put is a result, not a crash
            with lock:
                errors[_error_text(error)] += 1
        slots.release()

    channel.put(put_request(b"/registry/bench/warmup", value), timeout=PUT_TIMEOUT_S)
    pipe.send("ready")
    pipe.recv()  # go
    cpu0 = _cpu_seconds()
    started = time.monotonic()
    n = 0
    while not pipe.poll():  # until told to stop
        if not slots.acquire(timeout=0.2):
            continue
        now = time.monotonic()
        if lease == 0 or lease_keys >= LEASE_MAX_KEYS or now - lease_since >= LEASE_REUSE_S:
            try:
                lease = lease_id_of(channel.grant(lease_grant_request(EVENT_TTL_S + LEASE_REUSE_S),
                                                  timeout=PUT_TIMEOUT_S))
                lease_keys, lease_since = 0, now
                grants += 1
                leases.append(lease)
            except Exception as error:  # counted; the next slot tries again
                with lock:
                    errors[f"LeaseGrant {_error_text(error)}"] += 1
                slots.release()
                time.sleep(0.05)
                continue
        # /registry/events/<namespace>/<object name>.<unique suffix>: a new key each time
        key = b"/registry/events/bench-%d-%s/pod-%05d.%016x" % (index, run, n % 50_000, n)
        n += 1
        lease_keys += 1
        channel.put.future(put_request(key, value, lease), timeout=PUT_TIMEOUT_S).add_done_callback(record)
    stopped = time.monotonic()
    pipe.recv()  # stop
    for _ in range(window):  # let what is in flight land (bounded by the put timeout)
        slots.acquire(timeout=PUT_TIMEOUT_S)
    cpu = _cpu_seconds() - cpu0
    # once the main load has been measured: revoke the leases, which deletes their keys, as
    # their TTL would; the next phase (or round) then starts from a cluster without them
    pipe.recv()  # clean up
    cleanup0 = time.monotonic()
    for lease_id in leases:
        try:
            channel.revoke(lease_revoke_request(lease_id), timeout=60)
        except Exception as error:  # reported: the keys stay until their TTL ends
            errors[f"LeaseRevoke {_error_text(error)}"] += 1
    cleanup_s = time.monotonic() - cleanup0
    channel.close()
    pipe.send({"completions": completions, "errors": dict(errors), "sent": n, "grants": grants,
               "started": started, "stopped": stopped, "cpu_s": cpu, "cleanup_s": cleanup_s})


# --- CPU accounting from /proc --------------------------------------------------------------

def machine_cpu() -> tuple[float, float, float]:
    """(busy, steal, irq + softirq) CPU seconds of the whole machine since boot, from
    /proc/stat. Steal: time the hypervisor gave this VM's vCPUs to someone else."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    busy = values[0] + values[1] + values[2] + values[5] + values[6]  # user nice system irq softirq
    return busy / CLK_TCK, values[7] / CLK_TCK, (values[5] + values[6]) / CLK_TCK


def process_cpu(pids: Sequence[int]) -> float:
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError, IndexError):
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(stat[11]) + int(stat[12])  # utime, stime
    return total / CLK_TCK


def all_processes() -> dict[int, tuple[str, float]]:
    """Every process's (name, CPU seconds): kernel threads included (fsync work shows up in
    jbd2 and kworker threads, not in etcd's own time)."""
    found = {}
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                text = (proc / "stat").read_text()
                name = text[text.index("(") + 1:text.rindex(")")]
                stat = text.rsplit(")", 1)[1].split()
                found[int(proc.name)] = (name, (int(stat[11]) + int(stat[12])) / CLK_TCK)
    return found


def top_others(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]], ours: set[int],
               seconds: float, count: int = 6) -> dict[str, float]:
    """The processes not of this bench that used the most CPU in between (cores, by name)."""
    used: Counter[str] = Counter()
    for pid, (name, cpu) in after.items():
        if pid not in ours:
            used[name] += cpu - before.get(pid, (name, 0.0))[1]  # a process born in between counts whole
    return {name: round(cpu / seconds, 3) for name, cpu in used.most_common(count) if cpu > 0}


def loadavg() -> list[float]:
    return [float(v) for v in Path("/proc/loadavg").read_text().split()[:3]]


# --- the rehearsal and the phases ------------------------------------------------------------

@dataclass(frozen=True)
class Cluster:
    role: str
    endpoints: list[str]
    tls: Tls
    pids: list[int]


def clusters_of(state_dir: Path) -> dict[str, Cluster]:
    from kilonode.local.etcd import probe
    from kilonode.local.rehearsal import Record

    record = Record.load(state_dir)
    if record is None:
        raise SystemExit(f"no rehearsal in {state_dir}")
    found = {}
    for c in record.clusters:
        pids = [s.pid for s in (probe(m) for m in c.members) if s.state == "running" and s.pid is not None]
        found[c.role] = Cluster(c.role, c.endpoints, Tls(str(c.tls.ca), str(c.tls.cert), str(c.tls.key)), pids)
    return found


@dataclass(frozen=True)
class PhaseRun:
    """One round of one phase: the main load's puts, and what the round's report says."""

    run: Run
    detail: dict[str, Any]
    storm_in_window: int  # storm puts answered during the main load's window
    storm_totals: dict[str, Any]


def run_phase(name: str, clusters: dict[str, Cluster], storm_into: str | None, rate: float, duration_s: float,
              window: int, progress: Callable[[str], None]) -> PhaseRun:
    context = multiprocessing.get_context("spawn")  # fresh interpreters: gRPC and fork do not mix
    main = clusters["main"]
    load_end, load_child = context.Pipe()
    load = context.Process(target=open_loop_worker, args=(main.endpoints, main.tls, rate, MAIN_KEY_FORMAT, MAIN_KEYS,
                                                          VALUE_BYTES, 0, 1, load_child),
                           name="bench-load")
    storms: list[tuple[Any, Connection]] = []
    if storm_into is not None:
        target = clusters[storm_into]
        for i in range(STORM_CLIENTS):
            parent, child = context.Pipe()
            process = context.Process(target=storm_worker, args=(i, target.endpoints, target.tls, window, child),
                                      name=f"bench-storm-{i}")
            storms.append((process, parent))
    children = [load, *(p for p, _ in storms)]
    for child in children:
        child.start()
    try:
        for pipe in [load_end, *(p for _, p in storms)]:
            if not pipe.poll(30) or pipe.recv() != "ready":
                raise RuntimeError("a client did not get ready in 30 s")
        etcd_pids = {role: c.pids for role, c in clusters.items()}
        client_pids = [c.pid for c in children if c.pid is not None]
        load0, busy0, etcd0 = loadavg(), machine_cpu(), {r: process_cpu(p) for r, p in etcd_pids.items()}
        clients0 = process_cpu(client_pids)
        procs0 = all_processes()
        wall0 = time.monotonic()
        for _, pipe in storms:
            pipe.send("go")
        if storms:
            progress(f"  {name}: storm of {STORM_CLIENTS} clients into the {storm_into} cluster, "
                     f"{STORM_WARMUP_S:.0f} s to reach its pace ...")
            time.sleep(STORM_WARMUP_S)
        start = time.monotonic() + 0.2
        load_end.send((start, duration_s))
        progress(f"  {name}: {rate:.0f} puts/s into the main cluster for {duration_s:.0f} s ...")
        # the whole machine, etcd and the clients over the load window, read at its end
        time.sleep(max(0.0, start + duration_s - time.monotonic()))
        load1, busy1, etcd1 = loadavg(), machine_cpu(), {r: process_cpu(p) for r, p in etcd_pids.items()}
        clients1 = process_cpu(client_pids)
        procs1 = all_processes()
        wall1 = time.monotonic()
        for _, pipe in storms:
            pipe.send("stop")
        if not load_end.poll(duration_s + DRAIN_S + 30):
            raise RuntimeError("the load client did not report")
        result = load_end.recv()
        for _, pipe in storms:
            pipe.send("clean up")
        storm_results = []
        for _, pipe in storms:
            if not pipe.poll(PUT_TIMEOUT_S + 120):
                raise RuntimeError("a storm client did not report")
            storm_results.append(pipe.recv())
    finally:
        for child in children:
            child.join(timeout=PUT_TIMEOUT_S + 5)
            if child.is_alive():
                child.kill()  # ours, by its PID (multiprocessing keeps it)
                child.join(timeout=5)

    outcomes = [Outcome(d, s, e, k) for d, s, e, k in zip(result["due"], result["sent"], result["done"], result["ok"],
                                                          strict=True)]
    run = Run(outcomes, result["start"], result["drained_at"])
    summary = summarise_runs([run], duration_s)
    main_done = [o.done for o in outcomes if o.ok and o.done is not None]
    window_s = wall1 - wall0
    phase: dict[str, Any] = {
        "main": summary | {
            "errors_by_kind": result["errors"],
            "achieved_per_second": per_second(main_done, result["start"], duration_s),
            "worst_latency_ms_per_second": worst_per_second(outcomes, result["start"], duration_s,
                                                            result["drained_at"]),
            "client_cpu_fraction_of_a_core": round(result["cpu_s"] / (result["drained_at"] - result["start"]), 3),
            "client_nice": result["nice"],
        },
        "load_average": {"start": load0, "end": load1},
        "cpu_cores_used": {
            "whole_machine": round((busy1[0] - busy0[0]) / window_s, 2),
            "stolen_by_the_hypervisor": round((busy1[1] - busy0[1]) / window_s, 2),
            "machine_cores": os.cpu_count(),
            **{f"etcd_{role}": round((etcd1[role] - etcd0[role]) / window_s, 2) for role in etcd_pids},
            "bench_clients": round((clients1 - clients0) / window_s, 2),
            # everything else on the machine: other sessions, CI, this script's parent
            "others": round(((busy1[0] - busy0[0]) - sum(etcd1[r] - etcd0[r] for r in etcd_pids)
                             - (clients1 - clients0)) / window_s, 2),
            # of which: interrupts (loopback TCP and disk completions are mostly softirq), and the
            # busiest processes that are neither etcd nor a bench client (kernel threads too)
            "irq_and_softirq": round((busy1[2] - busy0[2]) / window_s, 2),
            "top_other_processes": top_others(procs0, procs1, {*client_pids, *(p for ps in etcd_pids.values()
                                                                               for p in ps)}, window_s),
        },
    }
    in_window = 0
    totals: dict[str, Any] = {}
    if storm_results:
        times = sorted(t for s in storm_results for t in s["completions"])
        in_window = sum(1 for t in times if result["start"] <= t <= result["start"] + duration_s)
        errors: Counter[str] = Counter()
        for s in storm_results:
            errors.update(s["errors"])
        totals = {"events_written": len(times), "errors_by_kind": errors,
                  "lease_grants": sum(s["grants"] for s in storm_results)}
        phase["storm"] = {
            "events_per_s_during_main_load": round(in_window / duration_s, 1),
            "events_written": len(times),
            "errors": sum(errors.values()),
            "errors_by_kind": dict(errors),
            "lease_grants": totals["lease_grants"],
            "client_cpu_fraction_of_a_core": [round(s["cpu_s"] / (s["stopped"] - s["started"]), 3)
                                              for s in storm_results],
            "lease_revoke_s": [round(s["cleanup_s"], 2) for s in storm_results],
        }
    return PhaseRun(run, phase, in_window, totals)


def pooled(runs: Sequence[PhaseRun], storm_into: str | None, duration_s: float, window: int) -> dict[str, Any]:
    """A phase over all its rounds: percentiles of all its puts together, rates over all its time."""
    phase: dict[str, Any] = {"storm_into": storm_into, "main": summarise_runs([r.run for r in runs], duration_s)}
    if storm_into is not None:
        errors: Counter[str] = Counter()
        for r in runs:
            errors.update(r.storm_totals["errors_by_kind"])
        phase["storm"] = {
            "clients": STORM_CLIENTS, "in_flight_per_client": window, "value_bytes": VALUE_BYTES,
            "events_per_s_during_main_load": round(sum(r.storm_in_window for r in runs) / (duration_s * len(runs)), 1),
            "events_written": sum(r.storm_totals["events_written"] for r in runs),
            "lease_grants": sum(r.storm_totals["lease_grants"] for r in runs),
            "errors": sum(errors.values()),
            "errors_by_kind": dict(errors),
        }
    phase["rounds"] = [r.detail for r in runs]
    return phase


# --- client cost: gRPC against the JSON gateway -----------------------------------------------

def _gateway_put(endpoint: str, tls: Tls) -> Callable[[int, bytes], None]:
    host, port = endpoint.removeprefix("https://").split(":")
    context = ssl.create_default_context(cafile=tls.ca)
    context.load_cert_chain(tls.cert, tls.key)
    connection = http.client.HTTPSConnection(host, int(port), context=context, timeout=PUT_TIMEOUT_S)

    def put(i: int, value: bytes) -> None:
        body = json.dumps({"key": base64.b64encode(b"/registry/bench/cost/gw/%d" % i).decode(),
                           "value": base64.b64encode(value).decode()})
        connection.request("POST", "/v3/kv/put", body, {"Content-Type": "application/json"})
        response = connection.getresponse()
        payload = json.loads(response.read())
        if response.status != 200 or "header" not in payload:
            raise RuntimeError(f"gateway put: {response.status} {payload}")
    return put


def _grpc_put(endpoint: str, tls: Tls) -> Callable[[int, bytes], None]:
    channel = Channel(endpoint, tls)

    def put(i: int, value: bytes) -> None:
        revision_of(channel.put(put_request(b"/registry/bench/cost/grpc/%d" % i, value), timeout=PUT_TIMEOUT_S))
    return put


def client_cost_worker(kind: str, endpoint: str, tls: Tls, puts: int, etcd_pids: list[int],
                       pipe: Connection) -> None:
    make = {"grpc": _grpc_put, "gateway_json_http_client": _gateway_put}[kind]
    put = make(endpoint, tls)
    value = os.urandom(VALUE_BYTES)
    put(-1, value)
    cpu0, etcd0, wall0 = _cpu_seconds(), process_cpu(etcd_pids), time.monotonic()
    for i in range(puts):
        put(i, value)
    pipe.send({"client_cpu_s": _cpu_seconds() - cpu0, "etcd_cpu_s": process_cpu(etcd_pids) - etcd0,
               "wall_s": time.monotonic() - wall0})


def measure_client_cost(main: Cluster, puts: int, progress: Callable[[str], None]) -> dict[str, Any]:
    """Sequential puts (one in flight) to one main member: CPU per put in the client and in
    the five main members, each kind in its own process, twice in alternation."""
    context = multiprocessing.get_context("spawn")
    idle0, wall0 = process_cpu(main.pids), time.monotonic()
    time.sleep(2.0)
    idle_cores = (process_cpu(main.pids) - idle0) / (time.monotonic() - wall0)  # heartbeats, timers
    runs: dict[str, list[dict[str, float]]] = {"grpc": [], "gateway_json_http_client": []}
    for _ in range(2):
        for kind in runs:
            parent, child = context.Pipe()
            process = context.Process(target=client_cost_worker,
                                      args=(kind, main.endpoints[1], main.tls, puts, main.pids, child))
            process.start()
            if not parent.poll(120):
                process.kill()
                raise RuntimeError(f"client cost ({kind}) did not report")
            runs[kind].append(parent.recv())
            process.join(timeout=10)
    progress(f"  client cost measured ({puts} puts per kind, twice)")
    found: dict[str, Any] = {"puts_per_run": puts, "runs": 2, "idle_etcd_main_cores": round(idle_cores, 3)}
    for kind, results in runs.items():
        client = sum(r["client_cpu_s"] for r in results)
        wall = sum(r["wall_s"] for r in results)
        etcd = sum(r["etcd_cpu_s"] for r in results) - idle_cores * wall
        n = puts * len(results)
        found[kind] = {"client_cpu_us_per_put": round(client / n * 1e6), "etcd_cpu_us_per_put": round(etcd / n * 1e6),
                       "wall_ms_per_put": round(wall / n * 1e3, 2)}
    return found


# --- main ----------------------------------------------------------------------------------

def machine() -> dict[str, Any]:
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), "unknown")
    import grpc

    return {"cpus": os.cpu_count(), "cpu_model": model, "kernel": platform.release(),
            "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
            "python": platform.python_version(), "grpcio": grpc.__version__, "arch": platform.machine()}


def _filesystem(path: str) -> str:
    result = subprocess.run(["df", "--output=fstype,source", path], capture_output=True, text=True, check=False)
    lines = result.stdout.strip().splitlines()
    return " ".join(lines[-1].split()) if len(lines) > 1 else "unknown"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--phase-s", type=float, default=PHASE_S, help="seconds of main load per phase and round")
    parser.add_argument("--rounds", type=int, default=ROUNDS,
                        help="times the phases run, in turn (their figures are pooled over the rounds)")
    parser.add_argument("--rate", type=float, default=RATE, help="main puts/s, open loop")
    parser.add_argument("--storm-window", type=int, default=STORM_WINDOW, help="puts in flight per storm client")
    parser.add_argument("--state-dir", type=Path, default=None,
                        help="the rehearsal's directory (default: a new temporary one); stopped and removed at the end "
                        "unless --keep")
    parser.add_argument("--keep", action="store_true", help="leave the rehearsal running")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--skip-client-cost", action="store_true")
    parser.add_argument("--phases", default=",".join(PHASES),
                        help=f"comma-separated, run in order given: {', '.join(PHASES)} (a partial run needs --out)")
    args = parser.parse_args(argv)
    chosen = [name.strip() for name in args.phases.split(",") if name.strip()]
    if not chosen or any(name not in PHASES for name in chosen):
        parser.error(f"--phases: choose from {', '.join(PHASES)}")
    if chosen != list(PHASES) and args.out == RESULTS:
        parser.error(f"a partial run does not replace {RESULTS.relative_to(ROOT)}: pass --out")

    from kilonode.config import load_stack
    from kilonode.local import rehearsal
    from kilonode.plan import plan_stack

    def progress(line: str) -> None:
        print(line, flush=True)

    began = time.monotonic()
    before = loadavg()
    progress(f"load average before: {before} ({os.cpu_count()} cores)")
    state_dir = args.state_dir or Path(tempfile.mkdtemp(prefix="kilonode-bench-etcd-"))
    stack = load_stack(STACK)
    plan = plan_stack(stack)
    filesystem = _filesystem(str(state_dir if state_dir.exists() else state_dir.parent))
    up0 = time.monotonic()
    # the etcd clusters only: a worker VM under TCG would take both cores for minutes (and its
    # image an hour to build), and this measures etcd; older `up`s had no worker at all
    etcd_only = {"worker": False} if "worker" in inspect.signature(rehearsal.up).parameters else {}
    try:
        result = rehearsal.up(stack, plan, state_dir, lambda line: progress(f"  {line}"), **etcd_only)
        up_s = time.monotonic() - up0
        if not result.ok:
            raise SystemExit("the rehearsal is not healthy: " + "; ".join(e for c in result.clusters for e in c.errors))
        clusters = clusters_of(state_dir.absolute())
        members = {role: len(c.pids) for role, c in clusters.items()}
        progress(f"rehearsal up in {up_s:.1f} s: {members}")
        cost = None if args.skip_client_cost else measure_client_cost(clusters["main"], CLIENT_COST_PUTS, progress)
        runs: dict[str, list[PhaseRun]] = {name: [] for name in chosen}
        for round_ in range(1, args.rounds + 1):
            for name in chosen:
                progress(f"round {round_}/{args.rounds}, {name}:")
                phase_run = run_phase(name, clusters, PHASES[name], args.rate, args.phase_s, args.storm_window,
                                      progress)
                runs[name].append(phase_run)
                m, detail = phase_run.detail["main"], phase_run.detail
                progress(f"  {name}: main p50 {m['latency_ms']['p50']} ms, p99 {m['latency_ms']['p99']} ms, "
                         f"max {m['latency_ms']['max']} ms, {m['achieved_puts_per_s']} puts/s, errors {m['errors']}, "
                         f"unanswered {m['unanswered']}"
                         + (f"; storm {detail['storm']['events_per_s_during_main_load']} events/s"
                            if "storm" in detail else "")
                         + f"; load {detail['load_average']['end']}; others "
                         f"{detail['cpu_cores_used']['others']} cores")
        phases = {name: pooled(r, PHASES[name], args.phase_s, args.storm_window) for name, r in runs.items()}
        summaries = rehearsal.status(state_dir)[1]
        db = {s.role: s.db_size for s in summaries}
    finally:
        # stops what up started (by PID), even if up failed half-way, and removes the state; a
        # directory holding another stack's rehearsal (up refused it) is left alone
        record = rehearsal.Record.load(state_dir.absolute()) if state_dir.exists() else None
        if not args.keep and record is not None and record.stack == STACK:
            rehearsal.down(state_dir, keep=False, progress=lambda line: None)

    def ratio(a: float, b: float) -> float | None:
        return round(a / b, 2) if b else None

    ratios = None
    if "storm_into_events" in phases and "storm_into_main" in phases:
        isolated, shared = phases["storm_into_events"]["main"], phases["storm_into_main"]["main"]
        ratios = {
            "main_p99": ratio(shared["latency_ms"]["p99"], isolated["latency_ms"]["p99"]),
            "main_p50": ratio(shared["latency_ms"]["p50"], isolated["latency_ms"]["p50"]),
            "main_max": ratio(shared["latency_ms"]["max"], isolated["latency_ms"]["max"]),
            "main_achieved_puts_per_s": ratio(shared["achieved_puts_per_s"], isolated["achieved_puts_per_s"]),
            "storm_events_per_s": ratio(phases["storm_into_main"]["storm"]["events_per_s_during_main_load"],
                                        phases["storm_into_events"]["storm"]["events_per_s_during_main_load"]),
        }

    document = {
        "what": "main etcd cluster put latency and throughput at a steady offered rate, with the events cluster "
                "idle, with an event storm into the events cluster (isolated layout), and with the same storm into "
                "the main cluster (shared layout): issue 12 item 7",
        "date_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "etcd_version": result.record.etcd_version,
        "stack": STACK,
        "members": members,
        "etcd_data_filesystem": filesystem,
        "method": {
            "main_load": f"open loop, {args.rate:g} puts/s of {VALUE_BYTES} B values overwriting {MAIN_KEYS} keys, "
                         "round-robin over the main members, gRPC over TLS with the apiserver's etcd client "
                         "certificate; latency from each put's scheduled time (coordinated omission corrected); "
                         "nearest-rank percentiles; unanswered puts count with the time waited",
            "storm": f"{STORM_CLIENTS} client processes, {args.storm_window} puts in flight each, as fast as they go: "
                     f"new keys /registry/events/..., {VALUE_BYTES} B values, each under a lease (TTL "
                     f"{EVENT_TTL_S}+{LEASE_REUSE_S} s, one lease per {LEASE_MAX_KEYS} keys or {LEASE_REUSE_S} s, as "
                     "kube-apiserver's lease manager does); it starts "
                     f"{STORM_WARMUP_S:g} s before the main load and stops when the load's window ends",
            "phase_s": args.phase_s,
            "rounds": args.rounds,
            "order": list(phases),
            "pooled": "each phase's figures are over all its rounds' puts together; per round under rounds",
            "all_members_and_clients_share_the_machine": True,
            "cpu_cores_used": "over each round's load window, from /proc: others = the whole machine less etcd "
                              "and the bench's clients (within ±0.05 of zero is sampling noise)",
            "load_average": "/proc/loadavg at the start and end of each round's window; it counts etcd's "
                            "threads waiting on fsync too, so it rises with the bench's own work",
        },
        "load_average_before": before,
        "rehearsal_up_s": round(up_s, 1),
        "db_size_bytes_after": db,
        "client_cost": cost,
        "phases": phases,
        "shared_over_isolated_under_the_same_storm": ratios,
        "bench_wall_s": round(time.monotonic() - began, 1),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(document, indent=2) + "\n")
    if ratios is not None:
        progress(f"shared / isolated under the same storm: main p99 ×{ratios['main_p99']}, p50 ×{ratios['main_p50']}, "
                 f"throughput ×{ratios['main_achieved_puts_per_s']}")
    progress(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
