"""`kilonode gpu-health --from DIR`: the GPU health agent's rules, off the node.

The same parsers and rules the agent runs on a GPU node, applied to outputs recorded there
(support, tests, a rehearsal): exit 0 healthy, 1 a fault (one line each: the check, the GPU,
the evidence, the action), 2 unusable input.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from kilonode.cli.common import die, out
from kilonode.exit_codes import ExitCode

if TYPE_CHECKING:
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
