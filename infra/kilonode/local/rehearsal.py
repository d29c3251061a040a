"""`kilonode local up|status|down|renew-certs`: a stack's etcd clusters, run here from its rendered units,
and one worker VM booted from its first node pool's image.

    up      issue the PKI layout (kilonode.local.pki), start every etcd member of both
            clusters from its rendered etcd.service (kilonode.local.units), wait until each
            cluster answers, check the rendered apiserver etcd flags against them
            (kilonode.local.check); then the worker VM (kilonode.local.worker): build the
            first pool's image if the cache has none, boot it detached with the pool's
            cloud-init and a blank local SSD, wait until it has settled, read its live facts
            against the plan; summarise. Members and a worker already running are left
            alone; a member whose process died is started again on its kept data, a worker
            that is off is powered on again on its kept disks;
    status  what runs, from the state directory alone (no stack needed);
    down    stop what `up` started, by PID (the worker: guest poweroff first); remove the
            state unless kept;
    renew   one host's certificates issued again and that member alone restarted, checked
            to serve the new ones (`kilonode local renew-certs HOST`: a certificate
            generation's rehearsal).

Everything lives in one state directory (`default_state_dir`), described by its
`rehearsal.json`: a directory without that file is never deleted.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from cryptography import x509

from kilonode.config import Stack
from kilonode.config.load import project_root
from kilonode.image.build import ImageInputs, image_name
from kilonode.local import etcd
from kilonode.local import worker as workers
from kilonode.local.addresses import address_map
from kilonode.local.check import ApiserverCheck, check_apiserver_etcd
from kilonode.local.etcd import ClientTls, EtcdError, Member, ProcessState
from kilonode.local.pki import IssueReport, LocalPki, issue_plan, renew_host
from kilonode.local.units import UnitError, environment, exec_start, flag, flags_of, localise
from kilonode.local.worker import WorkerRecord, WorkerSummary
from kilonode.plan import pki
from kilonode.plan.model import ClusterPlan
from kilonode.render import render_cluster
from kilonode.render.etcd import ETCD_UNIT
from kilonode.render.files import HostFiles

RECORD = "rehearsal.json"
RECORD_VERSION = 1
APISERVER_UNIT = "etc/systemd/system/kube-apiserver.service"
HEALTH_TIMEOUT_S = 60.0
LISTEN_FLAGS = ("listen-client-urls", "listen-peer-urls", "listen-metrics-urls")

Progress = Callable[[str], None]


class RehearsalError(RuntimeError):
    """up/status/down cannot go on; the message says what to do."""


def default_state_dir(stack_name: str) -> Path:
    """`$XDG_STATE_HOME/kilonode/local/<stack>`, `~/.local/state/...` when it is unset or not
    absolute (the XDG Base Directory specification ignores relative values)."""
    base = os.environ.get("XDG_STATE_HOME", "")
    root = Path(base) if base and os.path.isabs(base) else Path.home() / ".local" / "state"
    return root / "kilonode" / "local" / stack_name


@dataclass(frozen=True)
class NotStarted:
    what: str
    where: str
    why: str


@dataclass(frozen=True)
class ClusterRecord:
    role: str
    members: tuple[Member, ...]
    tls: ClientTls  # for etcdctl: the cluster's own CA, the apiserver's etcd client pair
    quota_bytes: int  # --quota-backend-bytes as rendered

    @property
    def endpoints(self) -> list[str]:
        return [m.client_url for m in self.members]


@dataclass(frozen=True)
class Record:
    """What `up` set up, so that status and down need nothing else."""

    stack: str
    stack_file: str
    state_dir: Path
    etcd_binary: str
    etcd_version: str
    clusters: tuple[ClusterRecord, ...]
    not_started: tuple[NotStarted, ...]
    worker: WorkerRecord | None = None  # the worker VM, once powered on

    def save(self) -> None:
        document = {
            "version": RECORD_VERSION, "stack": self.stack, "stack_file": self.stack_file,
            "etcd_binary": self.etcd_binary, "etcd_version": self.etcd_version,
            "clusters": [{"role": c.role, "quota_bytes": c.quota_bytes, "tls": c.tls.to_json(),
                          "members": [m.to_json() for m in c.members]} for c in self.clusters],
            "not_started": [vars(n) for n in self.not_started],
            "worker": self.worker.to_json() if self.worker else None,
        }
        temporary = self.state_dir / f".{RECORD}.tmp"
        temporary.write_text(json.dumps(document, indent=2) + "\n")
        temporary.replace(self.state_dir / RECORD)

    @classmethod
    def load(cls, state_dir: Path) -> Record | None:
        path = state_dir / RECORD
        if not path.exists():
            return None
        try:
            data = json.loads(path.read_text())
            if data.get("version") != RECORD_VERSION:
                raise ValueError(f"version {data.get('version')}, this kilonode reads {RECORD_VERSION}")
            return cls(
                data["stack"], data["stack_file"], state_dir, data["etcd_binary"], data["etcd_version"],
                tuple(ClusterRecord(c["role"], tuple(Member.from_json(m) for m in c["members"]),
                                    ClientTls(**{k: Path(v) for k, v in c["tls"].items()}), int(c["quota_bytes"]))
                      for c in data["clusters"]),
                tuple(NotStarted(**n) for n in data["not_started"]),
                # absent from records written before the worker VM existed
                WorkerRecord.from_json(data["worker"]) if data.get("worker") else None,
            )
        except (ValueError, KeyError, TypeError) as error:
            raise RehearsalError(f"{path} cannot be read ({error}): stop its members and the worker VM by hand "
                                 f"(their PIDs are in {state_dir}/etcd/*/etcd.pid and {state_dir}/"
                                 f"{workers.WORKER_DIR}/qemu.pid), then remove {state_dir}") from None

    @property
    def members(self) -> list[Member]:
        return [m for c in self.clusters for m in c.members]


@dataclass
class ClusterSummary:
    role: str
    members: list[tuple[Member, ProcessState]]
    endpoints: list[str]
    tls: ClientTls
    quota_bytes: int
    healthy: bool = False
    cluster_id: int | None = None
    leader: str | None = None
    db_size: int | None = None
    alarms: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "endpoints": self.endpoints,
            "cluster_id": f"{self.cluster_id:x}" if self.cluster_id is not None else None,
            **self.tls.to_json(),
            "healthy": self.healthy,
            "leader": self.leader,
            "db_size_bytes": self.db_size,
            "quota_bytes": self.quota_bytes,
            "alarms": self.alarms,
            "members": [{"name": m.name, "address": m.address, "client_url": m.client_url, "pid": s.pid,
                         "state": s.state, "log": str(m.log_file)} for m, s in self.members],
            "errors": self.errors,
        }


@dataclass
class UpResult:
    record: Record
    pki: IssueReport
    started: list[tuple[str, int, str]]  # (member, PID, why)
    clusters: list[ClusterSummary]
    checks: list[ApiserverCheck]
    worker: WorkerSummary | None = None
    worker_action: str | None = None  # what `up` did to the worker VM; None: nothing

    @property
    def unchanged(self) -> bool:
        return (not self.started and not self.pki.created and not self.pki.reissued and not self.pki.files_written
                and self.worker_action is None)

    @property
    def ok(self) -> bool:
        return (all(c.healthy and not c.errors for c in self.clusters) and all(c.ok for c in self.checks)
                and (self.worker is None or self.worker.ok))


def etcd_members(plan: ClusterPlan, rendered: dict[str, HostFiles], state_dir: Path, layout: pki.PkiLayout,
                 addresses: dict[str, str], etcd_binary: str) -> list[ClusterRecord]:
    """Each member's command line: its rendered etcd.service, localised."""
    where = LocalPki(state_dir)
    clusters = []
    for cluster in plan.etcd_clusters:
        members = []
        quota = 0
        for m in cluster.members:
            unit_name = f"{m.name}/{ETCD_UNIT}"
            unit = rendered[m.name][ETCD_UNIT].content
            argv = exec_start(unit, unit_name)
            env = tuple(environment(unit, unit_name).items())
            flags = flags_of(argv, unit_name)
            directory = state_dir / "etcd" / m.name
            files = {path: str(local) for path, local in where.host_files(m.name, layout).items()}
            files[flag(flags, "data-dir")] = str(directory / "data")
            args = localise(flags, addresses, files)
            local = flags_of(["etcd", *args])
            listens = []
            for name in LISTEN_FLAGS:
                for url in flag(local, name).split(","):
                    parts = urlsplit(url)
                    if parts.hostname is None or parts.port is None:
                        raise UnitError(f"{unit_name}: --{name} has {url!r}, not a URL with an address and port")
                    listens.append((parts.hostname, parts.port, name))
            quota = int(flag(local, "quota-backend-bytes"))
            members.append(Member(cluster.role, m.name, addresses[str(m.ip)], (etcd_binary, *args), directory,
                                  flag(local, "advertise-client-urls").split(",")[0], tuple(listens), env))
        # the rehearsal reaches etcd as the first apiserver does, with its client certificate
        client = pki.apiserver_etcd_client(plan.control_plane.instances[0].name)
        tls = ClientTls(where.cert(pki.etcd_ca_name(cluster.role), "authority"),
                        where.cert(client, "leaf"), where.key(client, "leaf"))
        clusters.append(ClusterRecord(cluster.role, tuple(members), tls, quota))
    return clusters


def not_started(plan: ClusterPlan, rendered: dict[str, HostFiles], worker_pool: str | None) -> list[NotStarted]:
    """What the stack runs in Azure that the rehearsal does not start here, and why.
    `worker_pool`: the pool whose image the worker VM boots (None: `up --no-worker`)."""
    found = []
    # the units each host runs (drop-ins are not units of their own)
    services = {host: sorted(os.path.basename(path) for path in files
                             if path.startswith("etc/systemd/system/") and path.endswith(".service"))
                for host, files in rendered.items()}
    apiservers = [i.name for i in plan.control_plane.instances]
    if apiservers:
        found.append(NotStarted(
            ", ".join(services[apiservers[0]]), _hosts(apiservers),
            "release binaries in no package registry this machine reaches; the apiserver's etcd flags are "
            "checked against the running clusters instead",
        ))
    for pool in plan.node_pools:
        hosts = [h for h in rendered if h == pool.role() or h.startswith(f"{pool.role()}.")]
        missing = "kubelet and cri-dockerd are release binaries" if pool.runtime == "docker" else \
            "kubelet is a release binary"
        if pool.name == worker_pool:
            # the worker runs the pool's other units; these are the ones it cannot
            units = [u for u in workers.release_units(pool) if u in services[hosts[0]]]
            found.append(NotStarted(
                ", ".join(units), f"pool {pool.name} (the worker VM)",
                f"the image installs the pool's units, but {missing} in no package registry this machine "
                "reaches: they stay inactive, so the node cannot join (nor is there a kube-apiserver to join)",
            ))
        else:
            found.append(NotStarted(
                ", ".join(services[hosts[0]]), f"pool {pool.name}",
                f"{missing} in no package registry this machine reaches; the pool's units run inside its nodes",
            ))
            found.append(worker_vm(pool.name, worker_pool, plan.node_pools[0].name))
    return found


def worker_vm(pool: str, worker_pool: str | None, first_pool: str) -> NotStarted:
    """Why no worker VM boots `pool`'s image."""
    if worker_pool is None and pool == first_pool:
        return NotStarted("worker VM", f"pool {pool}", "skipped (`up --no-worker`): only the etcd clusters were "
                          "rehearsed; without the flag, `up` boots this pool's image (minutes under TCG)")
    return NotStarted("worker VM", f"pool {pool}", f"one worker VM, for the first pool ({first_pool}): one guest "
                      "under TCG is what two cores hold")


def _hosts(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{names[0]} … {names[-1]} ({len(names)})"


def _etcd_version(binary: str) -> str:
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("etcd Version")),
                "unknown")


def up(stack: Stack, plan: ClusterPlan, state_dir: Path, progress: Progress,
       health_timeout_s: float = HEALTH_TIMEOUT_S, worker: bool = True,
       worker_timeout_s: float = workers.READY_TIMEOUT_S) -> UpResult:
    state_dir = state_dir.absolute()  # it is in every member's command line: one spelling
    existing = Record.load(state_dir) if state_dir.exists() else None
    if existing is not None and existing.stack_file != str(stack.file):
        raise RehearsalError(
            f"{state_dir} holds the rehearsal of stack {existing.stack} ({existing.stack_file}): "
            f"`kilonode local down {existing.stack} --state-dir {state_dir}` first, or pass another --state-dir"
        )
    progress(f"rendering stack {stack.name} ...")
    rendered = render_cluster(plan)
    addresses = address_map(plan)
    binary = etcd.find_tool("etcd")
    etcd.find_tool("etcdctl")
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    layout, report = issue_plan(plan, state_dir)
    progress(f"PKI ({len(layout.authorities)} CAs, {len(layout.leaves)} certificates, {len(layout.keys)} bare key) "
             f"in {state_dir / 'pki'}: {report.line()}")
    try:
        clusters = etcd_members(plan, rendered, state_dir, layout, addresses, binary)
    except UnitError as error:
        raise RehearsalError(f"the rendered etcd unit cannot run here: {error}") from None
    previous = existing.worker if existing is not None else None
    inputs, key = _worker_inputs(stack, plan, rendered, previous, state_dir, worker)
    first_pool = plan.node_pools[0] if plan.node_pools else None
    # a worker left by an earlier `up` stays in the record (so status and down find it) until replaced
    shown_pool = first_pool.name if first_pool is not None and (inputs is not None or previous) else None
    record = Record(stack.name, str(stack.file), state_dir, binary, _etcd_version(binary), tuple(clusters),
                    tuple(not_started(plan, rendered, shown_pool)), previous)
    if existing is not None:
        _refuse_restarts(existing, record, stack, state_dir)
    record.save()

    started = _start_members(record, progress)

    for cluster in record.clusters:
        progress(f"waiting for the {cluster.role} cluster ({len(cluster.members)} members) to answer ...")
        _wait(cluster, health_timeout_s)
    summaries = [summarise(c) for c in record.clusters]
    progress("checking the rendered kube-apiserver etcd flags against the running clusters ...")
    checks = apiserver_checks(plan, rendered, record, layout, addresses, summaries)
    action = None
    if inputs is not None:
        try:
            record, action = _worker_up(record, inputs, key, progress, worker_timeout_s)
        except workers.WorkerError as error:
            raise RehearsalError(f"{error}\nThe etcd clusters keep running: `kilonode local down` stops them "
                                 "(and the worker's state); `up --no-worker` leaves the worker out") from None
    worker_summary = None
    # with --no-worker, a worker an earlier `up` left running is still summarised; one left off is not
    if record.worker is not None and (inputs is not None or workers.probe(record.worker).state == "running"):
        progress("worker VM: reading its live sysctls, runtime root and image store over SSH ...")
        worker_summary = workers.summarise(record.worker)
    return UpResult(record, report, started, summaries, checks, worker_summary, action)


def _worker_inputs(stack: Stack, plan: ClusterPlan, rendered: dict[str, HostFiles], previous: WorkerRecord | None,
                   state_dir: Path, worker: bool) -> tuple[ImageInputs | None, str]:
    """The worker image's inputs and key (None and "" when no worker is to run: --no-worker, or
    no pool); refuses to go on while a worker of another image runs."""
    first_pool = plan.node_pools[0] if plan.node_pools else None
    inputs: ImageInputs | None = None
    key = ""
    if worker and first_pool is not None:
        inputs = ImageInputs(stack=stack, plan=plan, pool=first_pool, files=rendered[first_pool.role()],
                             project_dir=project_root(stack.file.parent) or stack.file.parent)
        key = workers.image_key(inputs)
        if previous is not None and previous.image_key != key and workers.probe(previous).state == "running":
            # as for a member: `up` never replaces a running worker behind the user's back
            raise RehearsalError(
                f"the worker VM runs image {previous.image_name} ({previous.image_key[:12]}); the stack now makes "
                f"{image_name(stack, first_pool.name)} ({key[:12]}): `kilonode local down {stack.name} --keep "
                f"--state-dir {state_dir}`, then up again (the worker boots afresh from the new image)"
            )
    return inputs, key


def _refuse_restarts(existing: Record, record: Record, stack: Stack, state_dir: Path) -> None:
    # a member that runs with what the stack rendered before keeps running until `down`:
    # `up` never restarts a healthy member behind the user's back
    now = {m.name: m for m in record.members}
    # a member the stack no longer has counts too: the new record would lose its PID file
    stale = [m.name for m in existing.members if now.get(m.name) != m and etcd.probe(m).state == "running"]
    if stale:
        raise RehearsalError(
            f"the stack now renders other flags for {', '.join(stale)} than the running rehearsal uses: "
            f"`kilonode local down {stack.name} --keep --state-dir {state_dir}`, then up again (data is kept)"
        )


def _start_members(record: Record, progress: Progress) -> list[tuple[str, int, str]]:
    """Start every member not running (refusing to if one runs with other flags, or a port is
    taken); returns (member, PID, why) of each started."""
    states = {m.name: etcd.probe(m) for m in record.members}
    changed = [f"{name}: {s.detail}" for name, s in states.items() if s.state == "changed"]
    if changed:
        raise RehearsalError(f"{'; '.join(changed)}: `kilonode local down --keep`, then up again")
    to_start = [m for m in record.members if states[m.name].state != "running"]
    try:
        # every port first: a taken one stops `up` before it has started anything
        for member in to_start:
            etcd.check_ports(member)
    except EtcdError as error:
        raise RehearsalError(str(error)) from None
    started: list[tuple[str, int, str]] = []
    for member in to_start:
        state = states[member.name]
        why = "first start" if state.state == "stopped" and not (member.directory / "data").exists() else \
            "its data kept, not running" if state.state == "stopped" else state.detail
        (member.directory / "data").mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            pid = etcd.start(member)
        except EtcdError as error:
            raise RehearsalError(str(error)) from None
        started.append((member.name, pid, why))
        progress(f"started {member.name} on {member.address} (PID {pid}): {why}")
    if not started:
        progress(f"all {len(record.members)} etcd members were already running")
    return started


def _worker_up(record: Record, inputs: ImageInputs, key: str, progress: Progress,
               timeout_s: float) -> tuple[Record, str | None]:
    """Leave a running worker alone (waiting until it is ready); power a stopped one on again on
    its kept disks when they are of the same image; else boot a fresh one, building the image
    first if the cache has none. Returns the record (saved) and what was done (None: nothing)."""
    assert inputs.pool is not None
    previous = record.worker
    directory = record.state_dir / workers.WORKER_DIR
    if previous is not None:
        state = workers.probe(previous)
        if state.state == "running":
            progress(f"worker VM already running (PID {state.pid}, SSH on 127.0.0.1:{previous.port}): checking that "
                     "it has settled ...")
            workers.wait_ready(previous, progress, timeout_s)
            return record, None

    def save(worker: WorkerRecord) -> None:
        replace(record, worker=worker).save()

    raw, built = workers.cached_image(inputs, key, progress)
    if previous is not None and previous.image_key == key and previous.directory == directory \
            and previous.overlay.is_file() and previous.image.is_file():
        worker = workers.power_on_kept(previous, progress, save, timeout_s)
        action = "powered on again on its kept disks"
    else:
        worker = workers.boot_fresh(inputs.pool, raw, key, directory, progress, save, timeout_s)
        action = "booted from a fresh overlay" + (" (pool image built)" if built else " (pool image from the cache)")
    record = replace(record, worker=worker)
    record.save()
    return record, action


def _wait(cluster: ClusterRecord, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        health = etcd.etcdctl(cluster.endpoints, cluster.tls, "endpoint", "health", timeout_s=3)
        if health.returncode == 0:
            return
        dead = [m for m in cluster.members if etcd.probe(m).state != "running"]
        if dead:
            m = dead[0]
            raise RehearsalError(f"{m.name} exited: {etcd.log_tail(m)} (log {m.log_file}); "
                                 f"`kilonode local down` stops the others")
        if time.monotonic() > deadline:
            last = (health.stderr or health.stdout).strip().splitlines()[-1:]
            raise RehearsalError(f"the {cluster.role} cluster did not answer within {timeout_s:.0f} s "
                                 f"({last[0] if last else 'no output'}); logs in {cluster.members[0].directory.parent}")
        time.sleep(0.3)


def summarise(cluster: ClusterRecord) -> ClusterSummary:
    states = [(m, etcd.probe(m)) for m in cluster.members]
    summary = ClusterSummary(cluster.role, states, cluster.endpoints, cluster.tls, cluster.quota_bytes)
    running = [m.client_url for m, s in states if s.state == "running"]
    summary.errors += [f"{m.name}: {s.detail}" for m, s in states if s.state != "running"]
    if not running:
        return summary
    # a member known not to run would only make etcdctl wait out its dial timeout
    statuses = etcd.endpoint_status(running, cluster.tls)
    summary.errors += [f"{s.endpoint}: {s.error}" for s in statuses if s.error]
    answered = [s for s in statuses if s.error is None]
    ids = {s.cluster_id for s in answered}
    if len(ids) > 1:
        summary.errors.append(f"members report {len(ids)} cluster IDs: {', '.join(f'{i:x}' for i in ids)}")
    if answered:
        summary.cluster_id = answered[0].cluster_id
        summary.db_size = max(s.db_size or 0 for s in answered)
        names = etcd.member_names(running, cluster.tls)
        leaders = {s.leader for s in answered}
        summary.leader = ", ".join(names.get(x, f"{x:x}") for x in leaders if x) or None
        summary.alarms = etcd.alarms(running, cluster.tls)
    summary.healthy = len(answered) == len(cluster.members) and summary.leader is not None and len(ids) == 1
    return summary


def apiserver_checks(plan: ClusterPlan, rendered: dict[str, HostFiles], record: Record, layout: pki.PkiLayout,
                     addresses: dict[str, str], summaries: list[ClusterSummary]) -> list[ApiserverCheck]:
    where = LocalPki(record.state_dir)
    cluster_ids = {s.role: s.cluster_id for s in summaries if s.cluster_id is not None}
    member_urls = {c.role: c.endpoints for c in record.clusters}
    return [
        check_apiserver_etcd(rendered[i.name][APISERVER_UNIT].content, i.name, addresses,
                             where.host_files(i.name, layout), cluster_ids, member_urls)
        for i in plan.control_plane.instances
    ]


@dataclass(frozen=True)
class Renewal:
    """What `renew` did to one host."""

    host: str
    renewed: tuple[str, ...]  # the leaves issued again (new keys, new serials)
    # for an etcd member: listener ("client", "peer") -> (serial served before, serial served after)
    serials: dict[str, tuple[int, int]] = field(default_factory=dict)
    restarted: str | None = None  # "stopped (PID n), started (PID m)"; None: not run here (an apiserver)


def renew(stack: Stack, plan: ClusterPlan, state_dir: Path, host: str, progress: Progress,
          health_timeout_s: float = HEALTH_TIMEOUT_S) -> Renewal:
    """Renew one host's certificates as a new generation does in Azure, on the running rehearsal:
    refuse unless the host's etcd cluster is healthy (every member answers), issue the host's
    leaves again (new keys, the same CAs, new serials), restart that member alone from its
    rendered unit's command line (the same command: the files changed, not the flags), wait for
    the cluster to answer, and check that the member now serves the new certificates, on its
    client and its peer port. An apiserver's leaves are issued again and its files rewritten;
    no kube-apiserver runs here to restart."""
    state_dir = state_dir.absolute()
    record = Record.load(state_dir) if state_dir.exists() else None
    if record is None or record.stack_file != str(stack.file):
        raise RehearsalError(f"no rehearsal of stack {stack.name} in {state_dir}: `kilonode local up` starts one")
    layout = pki.pki_layout(plan)
    where = LocalPki(state_dir)
    found = [(c, m) for c in record.clusters for m in c.members if m.name == host]
    if not found:
        if host not in layout.hosts:
            raise RehearsalError(f"{host} is no control-plane host of stack {stack.name} ("
                                 f"{', '.join(layout.hosts)})")
        report = _renew_files(layout, state_dir, plan, host)
        progress(f"{host}: issued again {', '.join(report.created)}; its files in {where.host_dir(host)} rewritten "
                 "(no kube-apiserver runs here to restart)")
        return Renewal(host, tuple(report.created))
    cluster, member = found[0]
    health = etcd.etcdctl(cluster.endpoints, cluster.tls, "endpoint", "health")
    if health.returncode != 0:
        raise RehearsalError(f"the {cluster.role} cluster is not healthy ({(health.stderr or health.stdout).strip()}): "
                             f"renewing {host} now would take another member down; `kilonode local status` first")
    before = _served_serials(cluster, member, where)
    report = _renew_files(layout, state_dir, plan, host)
    progress(f"{host}: issued again {', '.join(report.created)} (new keys, same CA)")
    stopped = etcd.stop([[member]])[member.name]
    progress(f"{host}: {stopped}; starting it again from its unit's command line ...")
    try:
        pid = etcd.start(member)
    except EtcdError as error:
        raise RehearsalError(str(error)) from None
    _wait(cluster, health_timeout_s)
    after = _served_serials(cluster, member, where)
    serials = {name: (before[name], after[name]) for name in before}
    same = [name for name, (old, new) in serials.items() if old == new]
    if same:
        raise RehearsalError(f"{host} still serves its old certificate on its {', '.join(same)} port(s) after the "
                             f"restart (log {member.log_file})")
    progress(f"{host}: started (PID {pid}); the {cluster.role} cluster answers; it serves the new certificates")
    return Renewal(host, tuple(report.created), serials, f"{stopped}, started (PID {pid})")


def _renew_files(layout: pki.PkiLayout, state_dir: Path, plan: ClusterPlan, host: str) -> IssueReport:
    try:
        return renew_host(layout, state_dir, address_map(plan), host)
    except ValueError as error:
        raise RehearsalError(str(error)) from None


def _served_serials(cluster: ClusterRecord, member: Member, where: LocalPki) -> dict[str, int]:
    """The serial of the certificate `member` presents on its client and on its peer port, each
    verified against its cluster's CA. The peer port asks for a peer of the same cluster, so the
    handshake shows another member's peer certificate (a member of the cluster that stays up)."""
    peers = [m for m in cluster.members if m.name != member.name] or [member]
    peer_tls = ClientTls(cluster.tls.ca, where.cert(f"{peers[0].name}-peer", "leaf"),
                         where.key(f"{peers[0].name}-peer", "leaf"))
    found = {}
    for listener, tls in (("client", cluster.tls), ("peer", peer_tls)):
        flag_name = f"listen-{listener}-urls"
        address, port = next((a, p) for a, p, f in member.listens if f == flag_name)
        der = etcd.served_certificate(address, port, tls)
        found[listener] = x509.load_der_x509_certificate(der).serial_number
    return found


def status(state_dir: Path) -> tuple[Record, list[ClusterSummary], WorkerSummary | None]:
    state_dir = state_dir.absolute()
    record = Record.load(state_dir) if state_dir.exists() else None
    if record is None:
        raise RehearsalError(f"no rehearsal in {state_dir}: `kilonode local up` starts one")
    worker = workers.summarise(record.worker) if record.worker is not None else None
    return record, [summarise(c) for c in record.clusters], worker


def down(state_dir: Path, keep: bool, progress: Progress) -> dict[str, str]:
    """Stop the members (by their PID files), then remove the state directory unless `keep`."""
    state_dir = state_dir.absolute()
    record = Record.load(state_dir) if state_dir.exists() else None
    if record is None:
        progress(f"no rehearsal in {state_dir}: nothing to stop")
        return {}
    outcome: dict[str, str] = {}
    if record.worker is not None:
        outcome["worker VM"] = workers.stop(record.worker, progress)
        progress(f"worker VM: {outcome['worker VM']}")
        if workers.probe(record.worker).state == "running":
            raise RehearsalError(f"the worker VM is still running; state kept in {state_dir}")
    progress(f"stopping {len(record.members)} etcd members, one per cluster at a time (SIGTERM, up to "
             f"{etcd.STOP_TIMEOUT_S:.0f} s each, then SIGKILL) ...")
    stopped = etcd.stop(c.members for c in record.clusters)
    for name, what in stopped.items():
        progress(f"{name}: {what}")
    outcome |= stopped
    left = [m for m in record.members if etcd.probe(m).state in ("running", "changed")]
    if left:
        raise RehearsalError(f"{', '.join(m.name for m in left)} still running; state kept in {state_dir}")
    if keep:
        progress(f"state kept in {state_dir} (data, PKI, logs, the worker's disks): `kilonode local up` resumes on it")
    else:
        shutil.rmtree(state_dir)
        progress(f"removed {state_dir}")
    return outcome
