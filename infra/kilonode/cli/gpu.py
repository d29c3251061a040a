"""`kilonode gpu-health --from DIR`: the GPU health agent's rules, off the node; and `kilonode
gpu nccl-job STACK --pool POOL`: an NCCL all-reduce gang over InfiniBand, generated from the plan.

gpu-health applies the same parsers and rules the agent runs on a GPU node to outputs recorded
there (support, tests, a rehearsal): exit 0 healthy, 1 a fault (one line each: the check, the
GPU, the evidence, the action), 2 unusable input.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from kilonode.cli.common import StackArg, die, load_and_plan, out
from kilonode.exit_codes import ExitCode

if TYPE_CHECKING:
    from kilonode.k8s.nccl_job import NcclTopology
    from kilonode.node.gpu.rules import Finding

def gpu_health(
    source: Annotated[
        Path,
        typer.Option(
            "--from", metavar="DIR",
            help="Recorded outputs: nvidia-smi-q.xml (`nvidia-smi -q -x`, required), dmesg-xid.txt (the kernel "
            "log's NVRM lines), nvml.json, burn.json (the active check's figures).",
        ),
    ],
    expect_gpus: Annotated[
        int | None, typer.Option("--expect-gpus", min=1, help="GPUs the VM size has (the size catalogue's count).")
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Also print the Node condition the agent would report and the "
                           "taint the controller would add (kilonode.gpu.agent, kilonode.gpu.controller).")
    ] = False,
    active: Annotated[
        bool, typer.Option("--active", help="Run the active check on this machine's GPUs first (CUDA 11.8's "
                           "cuBLAS through ctypes) and judge its figures instead of a recorded burn.json; exit 2 "
                           "if it cannot run here.")
    ] = False,
) -> None:
    """Evaluate recorded GPU outputs with the health agent's rules; exit 1 on a fault.

    Checks: GPU count against --expect-gpus; uncorrectable ECC (volatile and lifetime);
    remapped rows pending or failed; retired pages pending; clock slowdowns that mean
    thermal or power protection (not the power cap of a GPU under load); PCIe link width,
    and generation while busy; inactive NVLink links; Xid events classified by NVIDIA's Xid
    catalogue (an application's fault is reported, not acted on); the active check's GEMM
    throughput, correctness and memory bandwidth against the model's floors. Thresholds and
    the catalogue are data in kilonode/node/gpu/, each with its source.
    """
    from dataclasses import replace

    from kilonode.node.gpu import active as active_check
    from kilonode.node.gpu.readings import UnusableInput, read_dir
    from kilonode.node.gpu.rules import evaluate

    try:
        readings = read_dir(source)
    except UnusableInput as error:
        die(str(error), "kilonode gpu-health")
    if active:
        try:
            readings = replace(readings, burn=active_check.run(readings.gpus[0].name if readings.gpus else ""))
        except active_check.Unusable as error:
            die(f"the active check could not run: {error}", "kilonode gpu-health")
    findings = evaluate(readings, expect_gpus)
    faults = [f for f in findings if f.taints]
    models = sorted({g.name for g in readings.gpus})
    out.print(f"{source}: {len(readings.gpus)} GPU(s) ({', '.join(models) or 'none'}), driver {readings.driver}")
    for note in readings.notes:
        out.print(f"  note: {note}")
    for finding in findings:
        if not finding.taints:
            out.print(f"  recorded (no taint): {finding.line()}", markup=False)
    if not faults:
        out.print("healthy")
        return
    for finding in faults:
        out.print(f"FAULT {finding.line()}", markup=False)
    if dry_run:
        for line in _dry_run(findings):
            out.print(f"dry-run: {line}", markup=False)
    raise typer.Exit(code=ExitCode.FAILED)


def _dry_run(findings: list[Finding]) -> list[str]:
    """What the agent would report for these findings, and what the controller would do."""
    from kilonode.node.gpu import agent, controller, protocol

    at = protocol.now()
    report = agent.decide(agent.State("recorded"), findings, "", at, "NODE")
    condition = report.condition
    node = {"metadata": {"name": "NODE"}, "spec": {"taints": [protocol.taint(protocol.STARTUP_TAINT,
                                                                               protocol.STARTUP_VALUE)]},
            "status": {"conditions": [condition], "nodeInfo": {"bootID": "recorded"}}}
    change = controller.decide(node).node or node
    taints = [f"{t['key']}={t.get('value', '')}:{t['effect']}" for t in change["spec"].get("taints", [])]
    return [f"the agent would report condition {condition['type']}={condition['status']} "
            f"reason={condition['reason']}", *[f"  {line}" for line in condition["message"].splitlines()],
            f"the controller would leave the node with taints: {', '.join(taints) or 'none'}"]


gpu_app = typer.Typer(
    name="gpu",
    help="GPU work on the cluster a stack describes: jobs generated from its plan.",
    no_args_is_help=True,
)


@gpu_app.command("nccl-job")
def nccl_job(
    stack: StackArg,
    pool: Annotated[str, typer.Option("--pool", help="The InfiniBand GPU pool to run on (e.g. h100-ib).")],
    nodes: Annotated[
        int | None,
        typer.Option("--nodes", min=1, show_default=False,
                     help="Nodes in the gang, one pod of all their GPUs each. Default: 2, the smallest gang whose "
                     "traffic crosses InfiniBand."),
    ] = None,
    namespace: Annotated[str, typer.Option("--namespace", help="The namespace of every object.")] = "default",
    team: Annotated[
        str | None,
        typer.Option("--team", help="Run on this team's reserved nodes of the pool (tolerating its taint); the "
                     "namespace must carry the label kilonode.io/team=<team>. Without it: the pool's shared nodes."),
    ] = None,
    cross_fabric: Annotated[
        bool,
        typer.Option("--cross-fabric", help="Let the gang span InfiniBand fabrics (scale sets): no fabric affinity, "
                     "the kilonode.io/cross-fabric annotation, no rdma/ib, and NCCL over TCP (NCCL_IB_DISABLE=1), "
                     "since InfiniBand does not reach from one scale set to another."),
    ] = False,
    name: Annotated[str, typer.Option("--name", help="The name of the Job, PodGroup and Service.")]
    = "nccl-allreduce",
    binaries: Annotated[
        Path | None,
        typer.Option("--binaries", metavar="DIR",
                     help="Directory holding the pool's NCCL topology file (node-image/binaries.toml "
                     "nccl-topology-<family>) as `kilonode image build --binaries` takes it: topo.xml, or "
                     "<family>-topo.xml. Without it: the verified download `kilonode image build --fetch` kept."),
    ] = None,
    topology_digest_only: Annotated[
        bool,
        typer.Option("--topology-digest-only",
                     help="Put a line naming the pinned topology file and its sha256 in its ConfigMap instead "
                     "of the file (how docs/nccl-job.md shows the job): for reading, not for applying."),
    ] = False,
) -> None:
    """Print a complete NCCL all-reduce gang over InfiniBand for a pool, as YAML for `kubectl apply -f -`.

    Generated from the stack's plan, nothing hand-written: a ConfigMap with the benchmark
    (torch.distributed all_reduce from 1 MiB to 8 GiB per GPU, printing algbw and busbw as
    nccl-tests defines them), a PodGroup of --nodes pods for the gang scheduler, a headless
    Service, and an Indexed Job whose pods select the pool's nodes, tolerate the taints they
    register with, keep to one InfiniBand fabric, ask for every GPU and rdma/ib, mount the
    size's NCCL topology file (a second ConfigMap: no hostPath) where NCCL_TOPO_FILE names it,
    carry the size's NCCL settings, and run torchrun with its rendezvous at pod 0. Admitted
    under PodSecurity baseline: no hostPath, no added capability.

    Refused (exit 2, with the reason): a pool without GPUs, without InfiniBand, or whose size
    has no NCCL topology; a team with no nodes in the pool; a gang larger than the pool's
    largest fabric (a scale set: RDMA reaches only its own VMs) unless --cross-fabric; the
    topology file pinned in node-image/binaries.toml neither in --binaries DIR nor among
    --fetch's downloads, or a file there that is not the pinned one.

    Run it: kilonode gpu nccl-job research-7500 --pool h100-ib | kubectl apply -f -, then follow
    pod 0's log (kubectl logs -f -l batch.kubernetes.io/job-completion-index=0,...). How to read
    the output, and the bandwidth to expect per size: docs/nccl-job.md.
    """
    from dataclasses import replace

    from kilonode.k8s.nccl_job import NcclJobError, NcclJobRequest, check_placement, gpu_pool, to_yaml
    from kilonode.k8s.nccl_job import nccl_job as build

    _, plan = load_and_plan(stack)
    request = NcclJobRequest(pool=pool, namespace=namespace, team=team, cross_fabric=cross_fabric, name=name)
    if nodes is not None:
        request = replace(request, nodes=nodes)
    try:
        # the request's own refusals before the topology file's: they do not depend on it
        planned = gpu_pool(plan, pool)
        check_placement(planned, request)
        assert planned.nccl_topology is not None  # gpu_pool refuses a pool without one
        objects = build(plan, request, _topology(planned.nccl_topology, binaries, topology_digest_only))
    except NcclJobError as error:
        die(str(error), "kilonode gpu nccl-job")
    print(to_yaml(objects), end="")


def _topology(family: str, binaries: Path | None, digest_only: bool) -> NcclTopology:
    """The family's pinned topology file, found and verified (kilonode.image.topology), or only
    its name and digest (--topology-digest-only). Exit 2 when it cannot be had."""
    from kilonode.image import topology
    from kilonode.k8s.nccl_job import NcclTopology

    try:
        if digest_only:
            pin = topology.pinned(family)
            return NcclTopology(pin.component, pin.sha256)
        found = topology.find(family, binaries)
    except topology.TopologyUnavailable as error:
        die(str(error), "kilonode gpu nccl-job")
    return NcclTopology(found.pinned.component, found.pinned.sha256, found.content)
