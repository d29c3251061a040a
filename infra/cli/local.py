"""`kilonode local up|status|down`: rehearse a stack's etcd clusters on this machine."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape
from rich.table import Table

from kilonode.cli.common import die, load_and_plan, out

if TYPE_CHECKING:
    from kilonode.local.rehearsal import ClusterSummary, NotStarted, UpResult

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
        "cluster (cluster ID). kube-apiserver, kubelet and cri-dockerd are in no registry this machine "
        "reaches: `up` lists what it did not start, and why.\n\n"
        "State (PKI, data, logs, PID files) lives in $XDG_STATE_HOME/kilonode/local/STACK "
        "(~/.local/state/... by default); --state-dir picks another. Members run detached: they outlive "
        "the command until `kilonode local down`.\n\n"
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

    return RehearsalError, EtcdError, UnitError, AddressError


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
) -> None:
    """Start the stack's etcd clusters from its rendered units, check the apiserver's etcd
    flags against them, and print a summary.

    Idempotent: members already running are left as they are (a second `up` says that nothing
    changed); a member whose process died is started again on its kept data; keys and
    certificates still valid are reused. Exit status: 0 when both clusters are healthy and
    the apiserver flag check passes, 1 when they run but a check fails, 2 when the rehearsal
    could not be brought up (a port taken by another process, a unit that cannot run here:
    the message names it and what to do).
    """
    from kilonode.local import rehearsal

    directory = _state_dir(stack, state_dir)
    loaded, plan = load_and_plan(stack)
    try:
        result = rehearsal.up(loaded, plan, directory, _Progress(), health_timeout_s=timeout)
    except _errors() as error:
        die(escape(str(error)), "kilonode local up")
    hint = stack if state_dir is None else f"{stack} --state-dir {directory}"
    _summary(result, hint)
    if not result.ok:
        raise typer.Exit(code=1)


@local_app.command()
def status(
    stack: LocalStackArg = "local",
    state_dir: StateDirOption = None,
    as_json: Annotated[
        bool,
        typer.Option("--json", help="One JSON document: per cluster its client endpoints, cluster ID, the CA, "
                     "client certificate and key to use with etcdctl, members and PIDs, leader, DB size, "
                     "quota and alarms."),
    ] = False,
) -> None:
    """What the rehearsal in the state directory runs, asked of the members themselves.

    Reads only the state directory (not the stack file). With the listed files,
    `etcdctl --endpoints=... --cacert=CA --cert=CERT --key=KEY endpoint health` reaches a
    cluster. Exit status 1 when a member is not running or a cluster does not answer.
    """
    from kilonode.local import rehearsal

    directory = _state_dir(stack, state_dir)
    try:
        record, clusters = rehearsal.status(directory)
    except _errors() as error:
        die(escape(str(error)), "kilonode local status")
    healthy = all(c.healthy and not c.errors for c in clusters)
    if as_json:
        print(json.dumps({
            "stack": record.stack,
            "stack_file": record.stack_file,
            "state_dir": str(record.state_dir),
            "etcd": {"binary": record.etcd_binary, "version": record.etcd_version},
            "healthy": healthy,
            "clusters": {c.role: c.to_json() for c in clusters},
            "not_started": [vars(n) for n in record.not_started],
        }, indent=2))
    else:
        out.print(f"stack {escape(record.stack)}, state in {escape(str(record.state_dir))}, "
                  f"etcd {escape(record.etcd_version)} ({escape(record.etcd_binary)})")
        for cluster in clusters:
            _cluster_table(cluster)
        _not_started(list(record.not_started))
        if not healthy:
            hint = stack if state_dir is None else f"{stack} --state-dir {directory}"
            out.print(f"`kilonode local up {escape(hint)}` starts the members that are not running, on their "
                      "kept data")
    if not healthy:
        raise typer.Exit(code=1)


@local_app.command()
def down(
    stack: LocalStackArg = "local",
    state_dir: StateDirOption = None,
    keep: Annotated[
        bool, typer.Option("--keep", help="Keep the state directory (data, PKI, logs): the next `up` resumes on it.")
    ] = False,
) -> None:
    """Stop every member `up` started, by the PID in its PID file (SIGTERM, a bounded wait,
    then SIGKILL), one member per cluster at a time; then remove the state directory unless
    --keep.

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
            out.print(f"[green]ok[/] {check.host} kube-apiserver etcd flags: all {count} endpoints answer over TLS "
                      "with its etcd client certificate and CA bundle; --etcd-servers reach the main cluster, "
                      "the /events override the events cluster")
        for problem in check.problems:
            out.print(f"[red]problem[/] {check.host} kube-apiserver etcd flags: {escape(problem)}")
    _not_started(list(result.record.not_started))
    if result.unchanged:
        out.print("Nothing changed: the rehearsal was already up.")
    out.print(f"`kilonode local status {escape(hint)} --json` lists the endpoints and the certificates to use with "
              f"etcdctl; `kilonode local down {escape(hint)}` stops it all.")
