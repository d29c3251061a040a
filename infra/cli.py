"""`kilonode`: a thin command line over config -> plan -> render.

Every command takes STACK: a stack name in stacks/ (`research-7500`) or a path to a stack
file. A stack with problems exits 2 and prints one line per problem: file:line, field,
what is wrong and what to do; nothing is written.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from rich.console import Console
from rich.table import Table

from infra.azure.cli import plan_command
from infra.config import Stack, load_stack
from infra.config.load import display_path
from infra.image.cli import image_app
from infra.plan import ClusterPlan, plan_stack
from infra.problems import StackError
from infra.render import render_tree
from infra.render.write import OutputDirError, write_tree

app = typer.Typer(
    name="kilonode",
    help=(
        "Stand up and tune very large GPU Kubernetes clusters on Azure. "
        "One stack file (stacks/Pulumi.<stack>.yaml) describes one cluster; kilonode validates "
        "it, resolves the plan (names, static IPs, subnets, scale-set shards, budgets against "
        "Azure and etcd limits) and renders every node's artefacts."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
out = Console()
if not out.is_terminal:
    # piped or in CI: rich would assume 80 columns and wrap every table row
    out = Console(width=140)
err = Console(stderr=True, soft_wrap=True)  # an error stays one line, whatever the width

StackArg = Annotated[
    str,
    typer.Argument(
        metavar="STACK",
        help="A stack name in stacks/ (e.g. local, research-7500) or a path to a stack file.",
        show_default=False,
    ),
]


def load_and_plan(ref: str) -> tuple[Stack, ClusterPlan]:
    """Load, validate and plan a stack, or print its problems and exit 2."""
    try:
        stack = load_stack(ref)
        return stack, plan_stack(stack)
    except StackError as error:
        fail(error)


def fail(error: StackError) -> NoReturn:
    count = len(error.problems)
    err.print(f"[bold red]kilonode:[/] {count} problem{'s' * (count != 1)} in {error.file}; nothing was written")
    for problem in error.problems:
        # plain print: a problem line must stay one line, whatever the terminal width
        print(problem.format(error.file), file=sys.stderr)
    raise typer.Exit(code=2)


@app.command()
def validate(stack: StackArg) -> None:
    """Check a stack: schema, cross-field rules and every limit in the plan. Exit 2 on problems."""
    loaded, plan = load_and_plan(stack)
    shards = sum(len(p.shards) for p in plan.node_pools)
    out.print(
        f"[green]✓[/] {display_path(loaded.file)}: valid — {plan.total_nodes:,} nodes in {len(plan.node_pools)} "
        f"pool(s), {shards} scale set(s), {len(plan.etcd_main.members)}+{len(plan.etcd_events.members)} "
        f"etcd members, {len(plan.control_plane.instances)} apiserver(s)"
    )
    for warning in plan.warnings:
        out.print(f"[yellow]![/] {warning}")


@app.command()
def render(
    stack: StackArg,
    out_dir: Annotated[
        Path,
        typer.Option(
            "--out",
            help=(
                "Directory to write. It is replaced as a whole (written beside it, then swapped "
                "in). Only an empty directory or a previous render of the same stack (marked by "
                ".kilonode-render.json) is replaced; files the last render did not write, or "
                "rendered files changed since, are named and refused unless --force."
            ),
        ),
    ],
    force: Annotated[
        bool,
        typer.Option("--force", help="Replace a previous render even if it holds files the last render did not "
                     "write, changed files, or another stack's render (they are deleted)."),
    ] = False,
) -> None:
    """Render every host's artefacts: etcd-main-<i>/, etcd-events-<i>/, apiserver-<i>/, pool-<name>/.

    Inside each directory the files sit at the paths where they land on the host, plus
    `user-data` (the cloud-init user-data Azure receives as custom data). At the top:
    config.yaml (the fully defaulted config) and plan.yaml (the resolved plan).
    """
    loaded, plan = load_and_plan(stack)
    tree = render_tree(loaded.config, plan)
    try:
        write_tree(tree, out_dir, stack=loaded.name, force=force)
    except OutputDirError as error:
        err.print(f"[bold red]kilonode:[/] {error}")
        raise typer.Exit(code=2) from None
    hosts = sorted({path.split("/", 1)[0] for path in tree if "/" in path})
    out.print(f"[green]✓[/] rendered {loaded.name}: {len(tree)} files for {len(hosts)} hosts/pools into {out_dir}")


@app.command()
def allocate(stack: StackArg) -> None:
    """Record in the stack file every subnet the plan placed, so that no later change moves it.

    Subnets not recorded in the stack are placed by the plan, first fit around the recorded
    ones; a change to another pool could then move them, and with them the static etcd,
    apiserver and load-balancer IPs or a pool's scale sets. This writes each one into the
    stack file (comments and layout kept, atomically): network.controlPlaneSubnet,
    network.etcdSubnet and nodePools[].subnet. Run it before the first `pulumi up` and after
    adding a pool, and commit the file. Give a pool `maxNodes` first to size its subnet for
    growth. A second run writes nothing.
    """
    from infra.config.load import CONFIG_KEY
    from infra.config.record import record_subnets
    from infra.problems import undotted

    loaded, plan = load_and_plan(stack)
    placed = plan.network.unrecorded
    if not placed:
        out.print(f"[green]✓[/] {display_path(loaded.file)}: every subnet is already recorded; nothing written")
        return
    try:
        record_subnets(loaded.file, CONFIG_KEY, [(undotted(u.field), str(u.subnet)) for u in placed])
    except OSError as error:
        err.print(f"[bold red]kilonode:[/] cannot write {display_path(loaded.file)}: {error.strerror or error}; "
                  "nothing was recorded (make the file writable, or copy the stack into your own repository)")
        raise typer.Exit(code=2) from None
    reloaded, replanned = load_and_plan(str(loaded.file))
    assert not replanned.network.unrecorded, replanned.network.unrecorded
    for entry in placed:
        out.print(f"  recorded {entry.field}: {entry.subnet}")
    out.print(f"[green]✓[/] {display_path(reloaded.file)}: {len(placed)} subnet(s) recorded; commit the file")


@app.command()
def explain(stack: StackArg) -> None:
    """A readable summary: counts, subnets, scale-set shards, IP budget and headroom per limit."""
    loaded, plan = load_and_plan(stack)
    cp = plan.control_plane
    out.print(f"[bold]{plan.cluster}[/] ({display_path(loaded.file)}) — Kubernetes {plan.kubernetes_version}, "
              f"{plan.location}, zones {', '.join(plan.zones)}")

    control = Table(title="Control plane", title_justify="left")
    for column in ("role", "count", "VM size", "addresses", "local SSD"):
        control.add_column(column)
    for cluster in plan.etcd_clusters:
        control.add_row(
            f"etcd {cluster.role}", str(len(cluster.members)), cluster.vm_size,
            ", ".join(str(m.ip) for m in cluster.members),
            f"{cluster.data_dir} (quota {cluster.quota_backend_bytes:,} B)",
        )
    control.add_row(
        "kube-apiserver", str(len(cp.instances)), cp.vm_size,
        ", ".join(str(i.ip) for i in cp.instances) + f"; LB {cp.load_balancer_ip}",
        cp.local_disk.mount_point,
    )
    out.print(control)
    out.print(f"--etcd-servers-overrides={cp.etcd_servers_overrides}")

    pools = Table(title="Node pools", title_justify="left")
    for column in ("pool", "nodes", "runtime", "VM size", "subnet", "IPs/NIC", "maxPods", "scale sets"):
        pools.add_column(column)
    for pool in plan.node_pools:
        sizes = sorted({s.capacity for s in pool.shards})
        shard_text = f"{len(pool.shards)} × {'/'.join(map(str, sizes))} (≤ {pool.max_vms_per_scale_set}"
        shard_text += ", single placement group)" if pool.infiniband else ")"
        pools.add_row(
            pool.name, f"{pool.nodes:,}", pool.runtime, pool.vm_size + (" + IB" if pool.infiniband else ""),
            str(pool.subnet), str(pool.ip_configs_per_nic), str(pool.max_pods), shard_text,
        )
    out.print(pools)

    budgets = Table(title="Budgets against limits", title_justify="left")
    for column in ("budget", "used", "limit", "headroom", "source"):
        budgets.add_column(column)
    for budget in plan.budgets:
        style = "red" if budget.headroom < 0 else ("yellow" if budget.headroom < budget.limit * 0.1 else "green")
        budgets.add_row(
            budget.name, f"{budget.used:,}", f"{budget.limit:,}" + ("" if budget.hard else " (soft)"),
            f"[{style}]{budget.headroom:,}[/]", budget.source,
        )
    out.print(budgets)
    out.print(
        f"VNet {plan.network.vnet_cidr}: control plane {plan.network.control_plane_subnet}, "
        f"etcd {plan.network.etcd_subnet}; Compute Gallery replicas: {plan.gallery_replicas}"
    )
    for warning in plan.warnings:
        out.print(f"[yellow]![/] {warning}")


# subcommands from other stages
app.command("plan")(plan_command)
app.add_typer(image_app, name="image")


def main() -> None:
    """Run the CLI; every expected failure ends as one line per problem and exit 2.

    The one place where error types become messages and exit codes: 2 for anything that
    stopped a command (a bad stack, a file that cannot be read or written, a tool that
    failed or timed out), 1 only where checks ran and failed (each command says so itself).
    """
    import subprocess

    try:
        app()
    except StackError as error:
        try:
            fail(error)
        except typer.Exit as done:
            sys.exit(done.exit_code)
    except subprocess.CalledProcessError as error:
        command = " ".join(map(str, error.cmd)) if isinstance(error.cmd, list | tuple) else str(error.cmd)
        detail = (error.stderr or error.output or b"")
        text = detail.decode(errors="replace") if isinstance(detail, bytes) else str(detail)
        last = text.strip().splitlines()[-1:] or [""]
        _die(f"`{command[:200]}` failed with exit status {error.returncode}" + (f": {last[0]}" if last[0] else ""))
    except subprocess.TimeoutExpired as error:
        _die(f"`{' '.join(map(str, error.cmd))[:200]}` did not finish within {error.timeout:.0f} s")
    except OSError as error:
        where = f"{error.filename}: " if error.filename else ""
        _die(f"{where}{error.strerror or error}")
    except RuntimeError as error:
        _die(str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__)


def _die(message: str) -> NoReturn:
    err.print(f"[bold red]kilonode:[/] {message}", markup=True, highlight=False)
    sys.exit(2)


if __name__ == "__main__":
    main()
