"""`kilonode gpu-health --from DIR`: the GPU health agent's rules, off the node.

The same parsers and rules the agent runs on a GPU node, applied to outputs recorded there
(support, tests, a rehearsal): exit 0 healthy, 1 a fault (one line each: the check, the GPU,
the evidence, the action), 2 unusable input.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from kilonode.cli.common import die, out

# What the agent puts on a node it takes out (README: "GPU health").
TAINT_KEY = "kilonode.io/gpu-unhealthy"
CONDITION_TYPE = "GPUHealthy"


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
        bool, typer.Option("--dry-run", help="Also print the taint, Node condition and Event the agent would set.")
    ] = False,
) -> None:
    """Evaluate recorded GPU outputs with the health agent's rules; exit 1 on a fault.

    Checks: GPU count against --expect-gpus; uncorrectable ECC (volatile and lifetime);
    remapped rows pending or failed; retired pages pending; clock slowdowns that mean
    thermal or power protection (not the power cap of a GPU under load); PCIe link width,
    and generation while busy; inactive NVLink links; Xid events classified by NVIDIA's Xid
    catalogue (an application's fault is reported, not acted on); the active check's GEMM
    throughput, correctness and memory bandwidth against the model's floors. Thresholds and
    the catalogue are data in infra/gpu/, each with its source.
    """
    from kilonode.gpu.readings import UnusableInput, read_dir
    from kilonode.gpu.rules import evaluate

    try:
        readings = read_dir(source)
    except UnusableInput as error:
        die(str(error), "kilonode gpu-health")
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
        checks = ",".join(sorted({f.check for f in faults}))
        out.print(f"dry-run: would taint the node {TAINT_KEY}={checks}:NoSchedule", markup=False)
        out.print(f"dry-run: would set condition {CONDITION_TYPE}=False reason=GPUFault message="
                  + "; ".join(f.line() for f in faults), markup=False)
        out.print("dry-run: would record a Warning Event GPUUnhealthy on the node with the same message", markup=False)
    raise typer.Exit(code=1)
