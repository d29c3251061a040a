"""`kilonode local up|status|down|renew-certs`: rehearse a stack's etcd clusters and a worker VM on this machine."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape
from rich.table import Table

from kilonode.cli.common import die, load_and_plan, out
from kilonode.exit_codes import ExitCode

if TYPE_CHECKING:
    from kilonode.local.rehearsal import ClusterSummary, NotStarted, UpResult
    from kilonode.local.worker import WorkerSummary

local_app = typer.Typer(
    name="local",
    help=(
        "Rehearse a stack on this machine with the very artefacts `pulumi up` would deliver. "
        "`up` issues the stack's PKI (the same trust layout as in Azure, with each host's address mapped "
        "to its own loopback address: 10.A.B.C -> 127.A.B.C) and starts both etcd clusters (main and "
        "events) as real processes from the flags rendered into each member's etcd.service: TLS between "
        "peers and to clients, client-certificate auth, the standard ports. It then checks the rendered "
        "kube-apiserver etcd flags against what runs: every endpoint of --etcd-servers and of the /events "
        "override answers over TLS with the apiserver's etcd client certificate and belongs to the right "
        "cluster (cluster ID). Then it boots one worker VM from the stack's first node pool image (built "
        "first if the cache has none) with the pool's cloud-init user-data and a blank local SSD, as "
        "`kilonode image verify` does, and reads its live sysctls, runtime root and preloaded images against "
        "the plan. kube-apiserver, kubelet and cri-dockerd are in no registry this machine reaches: `up` "
        "lists what it did not start, and why.\n\n"
        "State (PKI, data, logs, PID files, the worker's disks) lives in $XDG_STATE_HOME/kilonode/local/STACK "
        "(~/.local/state/... by default); --state-dir picks another. The pool image is cached in "
        "$XDG_CACHE_HOME/kilonode/images (~/.cache/... by default). Members and the worker's qemu run "
        "detached: they outlive the command until `kilonode local down`.\n\n"
        "Typical session: `kilonode local up`, then `kilonode local status --json` for the endpoints and "
        "certificates to use with etcdctl, then `kilonode local down`."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

LocalStackArg = Annotated[
    str,
    typer.Argument(
        metavar="STACK",
        help="A stack name in stacks/ (e.g. local, research-7500) or a path to a stack file.",
    ),
]
StateDirOption = Annotated[
    Path | None,
    typer.Option(
        "--state-dir",
        help="The rehearsal's directory (PKI, etcd data, logs, PID files). Default: "
        "$XDG_STATE_HOME/kilonode/local/STACK, or ~/.local/state/kilonode/local/STACK.",
        show_default=False,
    ),
]


def _state_dir(stack: str, state_dir: Path | None) -> Path:
    from kilonode.config.load import stack_name_of
    from kilonode.local.rehearsal import default_state_dir

    if state_dir is not None:
        return state_dir.absolute()
    name = stack_name_of(Path(stack)) if stack.endswith((".yaml", ".yml")) or "/" in stack else stack
    return default_state_dir(name)


def _errors() -> tuple[type[Exception], ...]:
    from kilonode.local.addresses import AddressError
    from kilonode.local.etcd import EtcdError
    from kilonode.local.rehearsal import RehearsalError
    from kilonode.local.units import UnitError
    from kilonode.local.worker import WorkerError

    return RehearsalError, EtcdError, UnitError, AddressError, WorkerError


class _Progress:
    def __init__(self) -> None:
        self.start = time.monotonic()

    def __call__(self, line: str) -> None:
        out.print(f"[dim]{time.monotonic() - self.start:6.1f}s[/] {escape(line)}")


@local_app.command()
def up(
    stack: LocalStackArg = "local",
    state_dir: StateDirOption = None,
    timeout: Annotated[
        float, typer.Option("--timeout", help="Seconds to wait for each etcd cluster to answer.", min=1)
    ] = 60.0,
    no_worker: Annotated[
        bool,
        typer.Option("--no-worker", help="Do not build or boot the worker VM: only the etcd clusters, up in "
                     "seconds instead of minutes, with no qemu guest taking 2 GiB and both cores (for the "
                     "etcd fault drills and benchmarks, or a machine without qemu). A worker an earlier `up` "
                     "left running is left as it is."),
    ] = False,
    worker_timeout: Annotated[
        float,
        typer.Option("--worker-timeout", min=30,
                     help="Seconds to wait for the worker VM's SSH, and again for cloud-init and systemd to settle."),
    ] = 600.0,
) -> None:
    """Start the stack's etcd clusters from its rendered units, check the apiserver's etcd
    flags against them, boot the worker VM from the first pool's image, and print a summary.

    The worker VM: the pool's image from the cache, built first if the cache has none (a
    minute or two with the base root filesystem cached; `make test-artefacts` or `kilonode
    image prepare` caches it), booted under qemu (TCG, UEFI) from a throwaway overlay with the
    pool's cloud-init user-data as its NoCloud seed and a blank local SSD; SSH is forwarded on
    127.0.0.1 only. First boot takes 2-3 minutes on 2 cores.

    Idempotent: members and a worker already running are left as they are (a second `up`
    says that nothing changed); a member whose process died is started again on its kept
    data, a worker that is off is powered on again on its kept disks; keys and certificates
    still valid are reused. Exit status: 0 when both clusters are healthy, the apiserver
    flag check passes and the worker's facts match the plan, 1 when they run but a check
    fails, 2 when the rehearsal could not be brought up (a port taken by another process, a
    unit that cannot run here, a worker that did not boot: the message names it and what to
    do).
    """
    from kilonode.local import rehearsal

    directory = _state_dir(stack, state_dir)
    loaded, plan = load_and_plan(stack)
    try:
        result = rehearsal.up(loaded, plan, directory, _Progress(), health_timeout_s=timeout,
                              worker=not no_worker, worker_timeout_s=worker_timeout)
    except _errors() as error:
        die(escape(str(error)), "kilonode local up")
    hint = stack if state_dir is None else f"{stack} --state-dir {directory}"
    _summary(result, hint)
    if not result.ok:
        raise typer.Exit(code=ExitCode.FAILED)


@local_app.command()
def status(
    stack: LocalStackArg = "local",
    state_dir: StateDirOption = None,
    as_json: Annotated[
        bool,
        typer.Option("--json", help="One JSON document: per cluster its client endpoints, cluster ID, the CA, "
                     "client certificate and key to use with etcdctl, members and PIDs, leader, DB size, "
                     "quota and alarms; the worker VM's PID, SSH port, user and key, and its live facts."),
    ] = False,
) -> None:
    """What the rehearsal in the state directory runs, asked of the members and the worker VM
    themselves.

    Reads only the state directory (not the stack file). With the listed files,
    `etcdctl --endpoints=... --cacert=CA --cert=CERT --key=KEY endpoint health` reaches a
    cluster, and `ssh -i KEY -p PORT USER@127.0.0.1` the worker. Exit status 1 when a member
    or the worker is not running, a cluster does not answer, or a worker fact departs from
    the plan.
    """
    from kilonode.local import rehearsal

    directory = _state_dir(stack, state_dir)
    try:
        record, clusters, worker = rehearsal.status(directory)
    except _errors() as error:
        die(escape(str(error)), "kilonode local status")
    healthy = all(c.healthy and not c.errors for c in clusters) and (worker is None or worker.ok)
    if as_json:
        print(json.dumps({
            "stack": record.stack,
            "stack_file": record.stack_file,
            "state_dir": str(record.state_dir),
            "etcd": {"binary": record.etcd_binary, "version": record.etcd_version},
            "healthy": healthy,
            "clusters": {c.role: c.to_json() for c in clusters},
            "worker": worker.to_json() if worker is not None else None,
            "not_started": [vars(n) for n in record.not_started],
        }, indent=2))
    else:
        out.print(f"stack {escape(record.stack)}, state in {escape(str(record.state_dir))}, "
                  f"etcd {escape(record.etcd_version)} ({escape(record.etcd_binary)})")
        for cluster in clusters:
            _cluster_table(cluster)
        if worker is not None:
            _worker_table(worker)
        _not_started(list(record.not_started))
        if not healthy:
            hint = stack if state_dir is None else f"{stack} --state-dir {directory}"
            out.print(f"`kilonode local up {escape(hint)}` starts the members and the worker that are not running, "
                      "on their kept data")
    if not healthy:
        raise typer.Exit(code=ExitCode.FAILED)


@local_app.command()
def down(
    stack: LocalStackArg = "local",
    state_dir: StateDirOption = None,
    keep: Annotated[
        bool, typer.Option("--keep", help="Keep the state directory (data, PKI, logs): the next `up` resumes on it.")
    ] = False,
) -> None:
    """Stop the worker VM (the guest powers off over SSH; a bounded wait, then SIGTERM and
    SIGKILL by its PID) and every member `up` started, by the PID in its PID file (SIGTERM, a
    bounded wait, then SIGKILL), one member per cluster at a time; then remove the state
    directory (the worker's overlay and local SSD with it) unless --keep.

    A PID that no longer belongs to the member (the process died and the PID was reused) is
    left alone and named. A directory that holds no rehearsal is never removed.
    """
    from kilonode.local import rehearsal

    directory = _state_dir(stack, state_dir)
    progress = _Progress()
    try:
        rehearsal.down(directory, keep, progress)
    except _errors() as error:
        die(escape(str(error)), "kilonode local down")


@local_app.command("renew-certs")
def renew_certs(
    host: Annotated[str, typer.Argument(metavar="HOST", help="A control-plane host: etcd-main-N, etcd-events-N, "
                                        "etcd-leases-N (where the stack has it) or apiserver-N.")],
    stack: LocalStackArg = "local",
    state_dir: StateDirOption = None,
    timeout: Annotated[
        float, typer.Option("--timeout", help="Seconds to wait for the member's cluster to answer again.", min=1)
    ] = 60.0,
) -> None:
    """Renew one host's certificates on the running rehearsal, as raising its
    certificateGenerations entry does in Azure (docs/runbooks/certificate-renewal.md).

    Refuses unless the host's etcd cluster is healthy. Issues the host's leaves again (new
    keys, the same CA, new serials), restarts that member alone from its rendered unit's command
    line, waits for its cluster to answer, and checks that the member serves the new
    certificates on its client and peer ports. For an apiserver the files are issued again; no
    kube-apiserver runs here. Exit status 2 when the renewal could not be done or checked.
    """
    from kilonode.local import rehearsal

    directory = _state_dir(stack, state_dir)
    loaded, plan = load_and_plan(stack)
    try:
        done = rehearsal.renew(loaded, plan, directory, host, _Progress(), health_timeout_s=timeout)
    except _errors() as error:
        die(escape(str(error)), "kilonode local renew-certs")
    for listener, (old, new) in done.serials.items():
        out.print(f"{escape(host)} {listener} certificate: serial {old:x} -> {new:x}")
    out.print(f"{escape(host)}: {len(done.renewed)} certificate(s) renewed"
              + (f"; {escape(done.restarted)}" if done.restarted else ""))


def _size(value: int | None) -> str:
    if value is None:
        return "?"
    for unit, size in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if value >= size:
            return f"{value / size:.1f} {unit}"
    return f"{value} B"


def _cluster_table(cluster: ClusterSummary) -> None:
    cluster_id = f"{cluster.cluster_id:x}" if cluster.cluster_id is not None else "?"
    share = f" ({100 * cluster.db_size / cluster.quota_bytes:.2f}%)" if cluster.db_size and cluster.quota_bytes else ""
    title = (f"etcd {cluster.role}: cluster ID {cluster_id}, leader {cluster.leader or 'none'}, "
             f"DB {_size(cluster.db_size)} of {_size(cluster.quota_bytes)} quota{share}, "
             f"alarms: {', '.join(cluster.alarms) or 'none'}")
    # the title on its own line: a table title wraps at the table's (narrow) width
    out.print(escape(title))
    table = Table()
    for column in ("member", "address", "PID", "state"):
        table.add_column(column)
    for member, state in cluster.members:
        table.add_row(member.name, member.address, str(state.pid or "-"), escape(state.detail))
    out.print(table)
    for error in cluster.errors:
        out.print(f"  [red]problem:[/] {escape(error)}")


def _worker_table(worker: WorkerSummary) -> None:
    record = worker.record
    pid = f"PID {worker.state.pid}" if worker.state.pid else "no PID"
    out.print(escape(f"worker VM, pool {record.pool.name}: image {record.image_name} ({record.image_key[:12]}), "
                     f"qemu {worker.state.detail} ({pid}), SSH {record.user}@127.0.0.1:{record.port} "
                     f"(key {record.key_file}), systemd {worker.systemd or '?'}"))
    if worker.state.state != "running":
        for problem in worker.problems:
            out.print(f"  [red]problem:[/] {escape(problem)}")
        return
    table = Table()
    for column in ("on the node", "plan", "live", ""):
        table.add_column(column)
    for sysctl in worker.sysctls:
        table.add_row(sysctl.name, sysctl.plan, sysctl.live or "(absent)", "ok" if sysctl.ok else "DIFFERS")
    storage = record.pool.local_storage
    table.add_row(f"{record.pool.runtime} root", record.pool.runtime_root, worker.runtime_root or "?",
                  "ok" if worker.runtime_root == record.pool.runtime_root else "DIFFERS")
    table.add_row("  its mount (local SSD)", f"{storage.mount_point} on {storage.device or storage.kind}",
                  f"{worker.root_mount or '?'} on {worker.root_source or '?'}",
                  "ok" if worker.root_on_local_ssd else "NOT THE LOCAL SSD")
    for image in worker.preloaded:
        live = "in the store" if image["in_store"] else "absent"
        if image["id_matches"] is not None:
            live += ", baked ID" if image["id_matches"] else f", ID {image['store_id']}"
        table.add_row("preloaded" + (" (pause)" if image["pause"] else ""), image["image"], live,
                      "ok" if image["in_store"] and image["id_matches"] is not False else "DIFFERS")
    out.print(table)
    out.print(escape(f"  {record.pool.runtime} store: {', '.join(worker.store) or 'empty'}; storage driver "
                     f"{worker.storage_driver or '?'}"))
    for problem in worker.problems:
        out.print(f"  [red]problem:[/] {escape(problem)}")


def _not_started(items: list[NotStarted]) -> None:
    out.print("Not started here, and why:")
    table = Table()
    for column in ("what", "where", "why"):
        table.add_column(column)
    for item in items:
        table.add_row(escape(item.what), escape(item.where), escape(item.why))
    out.print(table)


def _summary(result: UpResult, hint: str) -> None:
    record = result.record
    out.print(f"etcd {escape(record.etcd_version)} ({escape(record.etcd_binary)}) runs each member's rendered flags")
    for cluster in result.clusters:
        _cluster_table(cluster)
    for check in result.checks:
        count = len(check.endpoints)
        if check.ok:
            # each override and the cluster it reached: /events, coordination.k8s.io/leases
            overrides = dict.fromkeys((c.flag.partition("=")[2].rstrip("#"), c.expected) for c in check.endpoints
                                      if c.flag.startswith("--etcd-servers-overrides="))
            out.print(f"[green]ok[/] {check.host} kube-apiserver etcd flags: all {count} endpoints answer over TLS "
                      "with its etcd client certificate and CA bundle; --etcd-servers reach the main cluster, "
                      + ", ".join(f"the {resource} override the {role} cluster" for resource, role in overrides))
        for problem in check.problems:
            out.print(f"[red]problem[/] {check.host} kube-apiserver etcd flags: {escape(problem)}")
    if result.worker is not None:
        if result.worker_action:
            out.print(escape(f"worker VM: {result.worker_action}"))
        _worker_table(result.worker)
    _not_started(list(result.record.not_started))
    if result.unchanged:
        out.print("Nothing changed: the rehearsal was already up.")
    out.print(f"`kilonode local status {escape(hint)} --json` lists the endpoints and the certificates to use with "
              f"etcdctl, and the worker's SSH port, user and key; `kilonode local down {escape(hint)}` stops it all.")
