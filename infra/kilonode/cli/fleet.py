"""`kilonode fleet STACK --nodes N`: the largest cluster of a stack's shape, and the stacks of a
fleet that holds N nodes, each validated and checked by preflight."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from kilonode.cli.common import StackArg, die, err, load_and_plan, out
from kilonode.exit_codes import ExitCode

if TYPE_CHECKING:
    from kilonode.plan.fleet import Fleet, Member


@dataclass(frozen=True)
class Checked:
    """A written stack as `pulumi up` would take it: its Pulumi resources and preflight's findings."""

    name: str
    file: str
    resources: int
    breaks: tuple[str, ...]
    warnings: int


HEADER = """\
# Written by `kilonode fleet {stack} {target}`: cluster {index} of {count} of {stack}'s shape
# ({nodes:,} work nodes). Its VNet range never overlaps another of the fleet's, so any two can
# be peered. Give it its own Azure subscription (NICs, VNets and vCPU quota are counted per
# subscription and region): `pulumi config set azure-native:subscriptionId <id>` in its stack.
# Subnets are recorded (`kilonode allocate`); teams are not carried over (fleet.md says why).
"""


def fleet(
    stack: StackArg,
    nodes: Annotated[int | None, typer.Option("--nodes", metavar="N", show_default=False,
                                              help="Work nodes the fleet holds in all (the stack's pools that are "
                                                   "neither system nor monitoring, in its proportions).")] = None,
    gpus: Annotated[int | None, typer.Option("--gpus", metavar="G", show_default=False,
                                             help="GPUs the fleet holds in all, instead of --nodes.")] = None,
    out_dir: Annotated[Path | None, typer.Option("--out", metavar="DIR", show_default=False,
                                                 help="Where the stacks and fleet.md go (a new or empty folder). "
                                                      "Default: fleet-<stack> here.")] = None,
    peered: Annotated[bool, typer.Option("--peered", help="The clusters' VNets will be peered together: refuse a "
                                                          "fleet past Azure's cap on a peered group's addresses.")]
    = False,
) -> None:
    """Say how large one cluster of a stack's shape can be, and write the fleet that holds N nodes.

    The shape is the stack's pools in their proportions: its work pools (neither system nor
    monitoring) grow together, the system and monitoring pools and the control plane stay.
    The planner itself says whether a size can exist (every budget and refusal `kilonode
    validate` has: VNet addresses at maxNodes, NICs, SNAT ports per NAT gateway, subnets, the
    etcd quota, the cluster's Prometheus on its pool, ...); the largest size is found by
    bisection, and what the next node up is refused with is the binding limit. A limit of the
    stack's own settings that the fleet knows how to lift is lifted and said: the monitoring
    pool moves up the Edsv5 sizes when its Prometheus outgrows one.

    The fleet is the fewest clusters of at most that size, the nodes spread evenly. Each gets
    its own name (<cluster>-00, -01, ...) and VNet range (the stack's size, the next free
    block of the private ranges: none overlap), its subnets placed and recorded, its NAT
    gateways sized by the planner. Every stack is then validated, rendered, recorded under
    Pulumi's mock engine (its Pulumi resource count) and checked by `kilonode preflight`.
    fleet.md and fleet.json say how many clusters, which limit sizes them, and what each
    costs: machines, NICs, public IPs, vCPUs per quota family, Pulumi resources.

    Exit 0 when every stack passes preflight, 1 when one has a break (the stacks are written,
    fleet.md names it), 2 on unusable input (a bad stack, no target, a folder in the way, a
    peered fleet past the cap).

    Example: kilonode fleet research-7500 --nodes 100000 --out fleet-100k
    """
    from kilonode.plan.fleet import FleetError, plan_fleet

    loaded, _plan = load_and_plan(stack)  # the same loader and checks as every command and `pulumi up`
    target = Path(out_dir) if out_dir is not None else Path(f"fleet-{loaded.name}")
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        die(f"{target} is in the way: give --out a new or empty folder (nothing was written)", "kilonode fleet")
    try:
        planned = plan_fleet(loaded.name, loaded.config, loaded.raw, loaded.file, nodes=nodes, gpus=gpus,
                             peered=peered, progress=lambda line: err.print(line))
    except FleetError as error:
        die(str(error), "kilonode fleet")
    partial = target.with_name(f".{target.name}.partial-{os.getpid()}")
    try:
        checked = _write_and_check(planned, partial)
        summary = summary_markdown(planned, checked)
        (partial / "fleet.md").write_text(summary, encoding="utf-8")
        (partial / "fleet.json").write_text(json.dumps(summary_json(planned, checked), indent=2) + "\n",
                                            encoding="utf-8")
        if target.exists():
            target.rmdir()  # empty: checked above
        partial.rename(target)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    out.print(summary, markup=False, highlight=False)
    out.print(f"written: {target}/ ({len(planned.members)} stack(s), fleet.md, fleet.json)")
    raise typer.Exit(ExitCode.FAILED if any(c.breaks for c in checked) else ExitCode.OK)


def _write_and_check(planned: Fleet, folder: Path) -> list[Checked]:
    """Each member's stack file, its subnets recorded, then validated, recorded and preflighted."""
    from kilonode.config.load import CONFIG_KEY
    from kilonode.yamlio import block_yaml

    folder.mkdir(parents=True)
    checked = []
    for index, member in enumerate(planned.members):
        file = folder / f"Pulumi.{member.name}.yaml"
        header = HEADER.format(stack=planned.stack, target=_target_text(planned), index=index + 1,
                               count=len(planned.members), nodes=member.work_nodes)
        file.write_text(header + block_yaml({"config": {CONFIG_KEY: member.raw}}), encoding="utf-8")
        _record(file)
        err.print(f"checking {member.name} ({index + 1}/{len(planned.members)}): render, Pulumi mock engine, "
                  "preflight ...")
        checked.append(_check(file, member))
    return checked


def _target_text(planned: Fleet) -> str:
    return f"--gpus {planned.target_gpus}" if planned.target_gpus is not None else f"--nodes {planned.target_nodes}"


def _record(file: Path) -> None:
    """`kilonode allocate` on the written file: every subnet the plan placed, recorded."""
    from kilonode.config import load_stack
    from kilonode.config.load import CONFIG_KEY
    from kilonode.config.record import RECORDED, record_values
    from kilonode.plan import checked_plan
    from kilonode.problems import undotted

    plan = checked_plan(load_stack(str(file)))
    record_values(file, CONFIG_KEY, [(undotted(u.field), str(u.subnet), RECORDED) for u in plan.network.unrecorded])


def _check(file: Path, member: Member) -> Checked:
    from kilonode.azure.mockplan import run_plan
    from kilonode.config import load_stack
    from kilonode.plan import checked_plan
    from kilonode.preflight import run
    from kilonode.preflight.load import from_parts
    from kilonode.render.cluster import render_tree

    loaded = load_stack(str(file))
    plan = checked_plan(loaded)
    if plan.network.unrecorded:
        raise RuntimeError(f"{file}: subnets still unrecorded after recording them")
    files = {path: rendered.content for path, rendered in render_tree(loaded.config, plan).items()}
    graph = run_plan(loaded)
    findings = run(from_parts(plan, files, graph.to_json(), None, source=f"stack {loaded.name} ({file})"), ())
    breaks = tuple(f"{f.check} at {f.where}: {f.what}" for f in findings if f.level == "break")
    return Checked(member.name, file.name, len(graph.resources), breaks, sum(f.level == "warn" for f in findings))


def _vcpus(member: Member) -> dict[str, int]:
    """vCPUs per quota family at the size the member may reach (the plan's vcpu_quota, without
    the region's total)."""
    from kilonode.plan.resolve.quota import REGIONAL

    return {need.family: need.vcpus for need in member.plan.vcpu_quota if need.family != REGIONAL}


def _row(member: Member, check: Checked, planned: Fleet) -> dict[str, Any]:
    plan = member.plan
    budgets = {b.name: b.used for b in plan.budgets}
    return {
        "name": member.name, "file": check.file, "workNodes": member.work_nodes,
        "nodes": sum(p.nodes for p in plan.node_pools), "gpus": planned.shape.gpus_at(member.work_nodes),
        "vnet": str(plan.network.vnet_cidr), "vnetPrivateIps": budgets["VNet private IPs"],
        "nics": budgets["NICs per subscription and region"],
        "natPublicIps": sum(g.public_ips for g in plan.network.nat_gateways),
        "scaleSets": sum(len(p.shards) for p in plan.node_pools),
        "vcpusByFamily": _vcpus(member), "pulumiResources": check.resources,
        "preflight": {"breaks": list(check.breaks), "warnings": check.warnings},
    }


def summary_json(planned: Fleet, checked: Sequence[Checked]) -> dict[str, Any]:
    big = planned.largest
    return {
        "stack": planned.stack, "targetWorkNodes": planned.target_nodes, "targetGpus": planned.target_gpus,
        "clusters": len(planned.members), "peered": planned.peered,
        "largestCluster": {"workNodes": big.work_nodes, "bindingLimit": big.binding,
                           "lifted": [{"limit": what, "atWorkNodes": at, "change": change}
                                      for what, at, change in big.lifted]},
        "members": [_row(m, c, planned) for m, c in zip(planned.members, checked, strict=True)],
        "notes": list(planned.notes),
    }


def summary_markdown(planned: Fleet, checked: Sequence[Checked]) -> str:
    data = summary_json(planned, checked)
    rows = data["members"]
    big = planned.largest
    soft = limits_soft()
    lines = [f"# Fleet: {planned.target_nodes:,} work nodes of {planned.stack}'s shape"
             + (f" ({planned.target_gpus:,} GPUs asked)" if planned.target_gpus is not None else ""), ""]
    lines.append(f"**{len(rows)} cluster(s)** of {min(r['workNodes'] for r in rows):,} to "
                 f"{max(r['workNodes'] for r in rows):,} work nodes; {sum(r['gpus'] for r in rows):,} GPUs in all.")
    lines.append("")
    if big.binding:
        lines.append(f"**Largest single cluster of this shape: {big.work_nodes:,} work nodes.** One more is refused:")
        lines += [f"- {problem}" for problem in big.binding]
    else:
        lines.append(f"One cluster holds the target ({big.work_nodes:,} work nodes): no limit was reached.")
    for what, at, change in big.lifted:
        lines.append(f"- lifted at {at:,} work nodes: {change} (it was: {what})")
    lines += ["", "| cluster | work nodes | GPUs | VNet | VNet IPs (of 65,536) | NICs | NAT public IPs | scale sets "
              "| vCPUs by quota family | Pulumi resources | preflight |", "|" + "---|" * 11]
    for row in rows:
        vcpus = "; ".join(f"{family} {count:,}" for family, count in row["vcpusByFamily"].items())
        pre = row["preflight"]
        verdict = f"{len(pre['breaks'])} break(s)" if pre["breaks"] else f"passes ({pre['warnings']} warning(s))"
        lines.append(f"| {row['name']} | {row['workNodes']:,} | {row['gpus']:,} | {row['vnet']} | "
                     f"{row['vnetPrivateIps']:,} | {row['nics']:,} | {row['natPublicIps']} | {row['scaleSets']} | "
                     f"{vcpus} | {row['pulumiResources']:,} | {verdict} |")
    heaviest = max(r["pulumiResources"] for r in rows)
    lines += ["", f"Pulumi: at most {heaviest:,} resources per stack"
              + (f", above the {soft:,} past which public reports show previews of minutes to hours "
                 "(pulumi/pulumi#7682, pulumi/pulumi-azure-native#4516)" if heaviest > soft else
                 f" (public reports show slow previews past about {soft:,})") + "."]
    if planned.peered:
        used = sum(r["vnetPrivateIps"] for r in rows)
        lines.append(f"Peered: {used:,} private addresses in the group, within Azure's 128,000.")
    for row in rows:
        for problem in row["preflight"]["breaks"]:
            lines.append(f"- {row['name']}: preflight break: {problem}")
    lines += ["", *(f"- {note}" for note in planned.notes), ""]
    return "\n".join(lines)


def limits_soft() -> int:
    from kilonode.catalog.limits import limits

    return limits().pulumi.stack_resources_soft.value
