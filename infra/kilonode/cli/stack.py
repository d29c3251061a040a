"""The stack commands: validate, allocate, render, explain (registered in kilonode.cli's COMMANDS)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape
from rich.table import Table

from kilonode.cli.common import StackArg, die, load_and_plan, out

# kilonode.config and kilonode.render are imported inside the commands: `kilonode --help`
# lists these commands without loading the stack model, and `validate` never renders
if TYPE_CHECKING:
    from kilonode.plan.model import ClusterPlan, NodePoolPlan


def validate(stack: StackArg) -> None:
    """Check a stack: schema, cross-field rules and every limit in the plan. Exit 2 on problems."""
    from kilonode.config.load import display_path

    loaded, plan = load_and_plan(stack)  # the same loader and checks as every command and `pulumi up`
    shards = sum(len(p.shards) for p in plan.node_pools)
    out.print(
        f"[green]✓[/] {display_path(loaded.file)}: valid — {plan.total_nodes:,} nodes in {len(plan.node_pools)} "
        f"pool(s), {shards} scale set(s), {'+'.join(str(len(c.members)) for c in plan.etcd_clusters)} "
        f"etcd members, {len(plan.control_plane.instances)} apiserver(s)"
    )
    for warning in plan.warnings:
        out.print(f"[yellow]![/] {warning}")


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
    """Render every host's artefacts: etcd-main-<i>/, etcd-events-<i>/ (etcd-leases-<i>/ where the stack has
    that cluster), apiserver-<i>/, pool-<name>/.

    Inside each directory the files sit at the paths where they land on the host, plus
    `user-data` (the cloud-init user-data Azure receives as custom data). At the top:
    config.yaml (the fully defaulted config) and plan.yaml (the resolved plan).
    """
    from kilonode.render import render_tree
    from kilonode.render.write import OutputDirError, write_tree

    loaded, plan = load_and_plan(stack)
    tree = render_tree(loaded.config, plan)
    try:
        write_tree(tree, out_dir, stack=loaded.name, force=force)
    except OutputDirError as error:
        die(str(error))
    hosts = sorted({path.split("/", 1)[0] for path in tree if "/" in path})
    out.print(f"[green]✓[/] rendered {loaded.name}: {len(tree)} files for {len(hosts)} hosts/pools into {out_dir}")


def allocate(stack: StackArg) -> None:
    """Record in the stack file every subnet and team shard the plan placed, so that no later
    change moves them.

    Subnets not recorded in the stack are placed by the plan, first fit around the recorded
    ones; a change to another pool could then move them, and with them the static etcd,
    apiserver and load-balancer IPs or a pool's scale sets. This writes each one into the
    stack file (comments and layout kept, atomically): network.controlPlaneSubnet,
    network.etcdSubnet and nodePools[].subnet. Teams' scale sets likewise: teams[].firstShard,
    so a change to one team never moves another's nodes to other scale sets. Run it before
    the first `pulumi up`, after adding a pool or a team, and commit the file. Give a pool
    `maxNodes` first to size its subnet for growth. A second run writes nothing.
    """
    from kilonode.config.load import CONFIG_KEY, display_path
    from kilonode.config.record import RECORDED, RECORDED_SHARD, record_values
    from kilonode.problems import Loc, undotted

    loaded, plan = load_and_plan(stack)
    subnets = plan.network.unrecorded
    teams = [team for team in plan.teams if not team.recorded]
    if not subnets and not teams:
        out.print(f"[green]✓[/] {display_path(loaded.file)}: every subnet and team shard is already recorded; "
                  "nothing written")
        return
    entries: list[tuple[Loc, str | int, str]] = [(undotted(u.field), str(u.subnet), RECORDED) for u in subnets]
    entries += [(undotted(team.field), team.first_shard, RECORDED_SHARD) for team in teams]
    try:
        record_values(loaded.file, CONFIG_KEY, entries)
    except OSError as error:
        die(f"cannot write {display_path(loaded.file)}: {error.strerror or error}; nothing was recorded (make "
            "the file writable, or copy the stack into your own repository)")
    reloaded, replanned = load_and_plan(str(loaded.file))
    assert not replanned.network.unrecorded, replanned.network.unrecorded
    assert all(team.recorded for team in replanned.teams), replanned.teams
    for entry in subnets:
        out.print(f"  recorded {entry.field}: {entry.subnet}")
    for team in teams:
        out.print(f"  recorded {team.field}: {team.first_shard} (team {team.name}: {team.shards[0]} to "
                  f"{team.shards[-1]})")
    out.print(f"[green]✓[/] {display_path(reloaded.file)}: {len(subnets)} subnet(s) and {len(teams)} team shard(s) "
              "recorded; commit the file")


def _local_disk_text(pool: NodePoolPlan) -> str:
    storage = pool.local_storage
    what = {
        "nvme-raid0": f"RAID 0 of {storage.nvme_count} NVMe",
        "nvme": "1 NVMe",
        "device": str(storage.device),
    }[storage.kind]
    return f"{what} → {storage.mount_point}"


def _shard_range(names: tuple[str, ...]) -> str:
    return names[0] if len(names) == 1 else f"{names[0]} … {names[-1].rsplit('-', 1)[-1]}"


def _capacity_tables(plan: ClusterPlan) -> None:
    """Teams' scale sets and what is left shared, per pool; the autoscaler's bounds."""
    if plan.teams or plan.autoscaled_pools:
        split = Table(title="Capacity: teams' scale sets (labelled and tainted at registration) and shared ones",
                      title_justify="left")
        for column in ("pool", "team", "scale sets", "nodes", "asked", "autoscaled"):
            split.add_column(column)
        for pool in plan.node_pools:
            teams = [t for t in plan.teams if t.pool == pool.name]
            for team in teams:
                split.add_row(pool.name, team.name, f"{len(team.shards)}: {_shard_range(team.shards)}",
                              f"{team.nodes:,}", f"{team.requested:,}", "no (fixed)")
            shared = tuple(s.name for s in pool.shards if s.team is None)
            if teams or pool.autoscaling:
                nodes = sum(s.capacity for s in pool.shards if s.team is None)
                scaling = pool.autoscaling
                split.add_row(pool.name, "(shared)", f"{len(shared)}: {_shard_range(shared)}" if shared else "0",
                              f"{nodes:,}", "-",
                              f"{sum(g.min_size for g in scaling.node_groups):,}–"
                              f"{sum(g.max_size for g in scaling.node_groups):,}" if scaling else "no")
        out.print(split)
        for pool in plan.autoscaled_pools:
            assert pool.autoscaling is not None
            out.print(f"pool {pool.name} autoscaling: {pool.autoscaling.reason}; {pool.autoscaling.warm_nodes} "
                      "kept warm by balloon pods")


def _in_cluster(plan: ClusterPlan) -> None:
    """The in-cluster layer's lessons, one heading each (kilonode.k8s.*.describe)."""
    # Imported here: the in-cluster modules import pulumi (~0.5 s), which only explain pays.
    from kilonode.k8s import autoscaler, calico, capacity, exporters, flowcontrol, metrics_server, scheduling
    from kilonode.plan.resolve import joins
    from kilonode.plan.resolve import monitoring as prometheus
    from kilonode.render import monitoring

    out.print("[bold]In the cluster[/] (kilonode:k8s:*, created by `pulumi up` once the apiservers answer)")
    sections = {
        "gang scheduling": scheduling.describe(plan),
        "priorities, team borrowing, balloons": capacity.describe(plan),
        "cluster autoscaler": autoscaler.describe(plan),
        "apiserver protection (API Priority and Fairness)": flowcontrol.describe(plan),
        "metrics-server (kubectl top, HorizontalPodAutoscalers)": metrics_server.describe(plan),
        "NetworkPolicy engine (docs/in-cluster.md)": calico.describe(plan),
        "node joins (how many boot at once, against what the apiservers are sized for)": joins.describe(plan),
        "exporters Prometheus scrapes (docs/monitoring.md, The exporters)": exporters.describe(plan),
        "Prometheus: series, memory, disk (docs/monitoring.md)": prometheus.describe(plan.prometheus),
        "alerts it evaluates (docs/monitoring.md)": monitoring.describe(plan),
    }
    for title, lines in sections.items():
        out.print(f"  [bold]{title}[/]")
        for line in lines:
            out.print(f"    {escape(line)}")
    out.print(f"  [bold]the control plane's clients[/] (kube-controller-manager --kube-api-qps, kube-scheduler "
              f"clientConnection.qps; kilonode.plan.resolve.clients)\n    {escape(plan.controller_clients.reason)}")
    out.print(f"  [bold]how long `pulumi up` waits[/] (Deployments, the DNS Service; DaemonSets, balloons and "
              f"Calico's Typha: not at all)\n    {escape(plan.components.awaits.reason)}")


HtmlOption = Annotated[Path | None, typer.Option(
    "--html", metavar="PATH", show_default=False,
    help="Also write one self-contained HTML page (inline SVG, nothing fetched) drawing the plan: the address "
         "space, the scale sets and their fabrics, the join waves, the budgets against their limits "
         "(docs/explain.md).")]


def _write_pictures(plan: ClusterPlan, html: Path | None, source: str) -> None:
    """`explain --html`: the page kilonode.render.pictures draws from the plan."""
    if html is None:
        return
    from kilonode.render.pictures import page

    try:
        html.write_text(page(plan, source), encoding="utf-8")
    except OSError as error:
        die(f"cannot write {html}: {error.strerror or error}")


def explain(stack: StackArg, html: HtmlOption = None) -> None:
    """A readable summary: counts, subnets, scale-set shards, IP budget and headroom per limit."""
    from kilonode.config.load import display_path

    loaded, plan = load_and_plan(stack)
    _write_pictures(plan, html, display_path(loaded.file))
    cp = plan.control_plane
    out.print(f"[bold]{plan.cluster}[/] ({display_path(loaded.file)}) — Kubernetes {plan.kubernetes_version}, "
              f"{plan.location}, zones {', '.join(plan.zones)}")

    control = Table(title="Control plane", title_justify="left")
    for column in ("role", "count", "VM size", "addresses", "local SSD"):
        control.add_column(column)
    for cluster in plan.etcd_clusters:
        control.add_row(
            f"etcd {cluster.role}", str(len(cluster.members)),
            cluster.vm_size + "".join(f"; {m.name}: {m.vm_size} (rolling resize)"
                                      for m in cluster.members if m.vm_size != cluster.vm_size),
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
    for column in ("pool", "nodes", "runtime", "VM size", "subnet", "IPs/NIC", "maxPods", "scale sets", "local disk"):
        pools.add_column(column)
    for pool in plan.node_pools:
        sizes = sorted({s.capacity for s in pool.shards})
        shard_text = f"{len(pool.shards)} × {'/'.join(map(str, sizes))} (≤ {pool.max_vms_per_scale_set}"
        shard_text += ", single placement group)" if pool.infiniband else ")"
        pools.add_row(
            pool.name, f"{pool.nodes:,}", pool.runtime, pool.vm_size + (" + IB" if pool.infiniband else ""),
            str(pool.subnet), str(pool.ip_configs_per_nic), str(pool.max_pods), shard_text,
            _local_disk_text(pool),
        )
    out.print(pools)
    for pool in plan.node_pools:
        out.print(f"pool {pool.name} local disk: {pool.local_storage.reason}; runtime root {pool.runtime_root}")
    for pool in plan.node_pools:
        if pool.boot_images_not_preloaded:
            out.print(f"[yellow]![/] pool {pool.name}: pulled at first start (no archive in bootImageArchives): "
                      + ", ".join(pool.boot_images_not_preloaded))

    _capacity_tables(plan)
    _in_cluster(plan)

    outbound = Table(title="Outbound (one NAT gateway per row; 64,512 SNAT ports per public IP)",
                     title_justify="left")
    for column in ("gateway", "subnets", "public IPs", "machines", "SNAT ports per machine", "floor"):
        outbound.add_column(column)
    for gateway in plan.network.nat_gateways:
        outbound.add_row(
            gateway.name, ", ".join(gateway.subnets), f"{gateway.public_ips} (/{gateway.prefix_length} prefix)",
            f"{gateway.nodes:,}", f"{gateway.ports_per_node:,}", f"{gateway.min_ports_per_node:,}",
        )
    out.print(outbound)

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
    _quota_table(plan)
    out.print(
        f"VNet {plan.network.vnet_cidr}: control plane {plan.network.control_plane_subnet}, "
        f"etcd {plan.network.etcd_subnet}; Compute Gallery replicas: {plan.gallery_replicas}"
    )
    for warning in plan.warnings:
        out.print(f"[yellow]![/] {warning}")


def _quota_table(plan: ClusterPlan) -> None:
    """The vCPUs per quota family: a quota, not a fixed limit, so preflight's quota check is
    what compares it with Azure (its Compute Usage API)."""
    from kilonode.plan.resolve.quota import REGIONAL

    quota = Table(title="vCPU quota per subscription and region (pools at maxNodes; preflight asks Azure)",
                  title_justify="left")
    for column in ("quota family", "machines", "vCPUs"):
        quota.add_column(column)
    for need in plan.vcpu_quota:
        quota.add_row(need.family + (" (Total Regional vCPUs)" if need.family == REGIONAL else ""),
                      f"{need.machines:,}", f"{need.vcpus:,}")
    out.print(quota)
