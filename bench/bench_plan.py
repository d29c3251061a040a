"""Benchmark: `kilonode plan` of research-7500 and of variants scaled to 30,000 and 59,000 nodes
(bench/variants.py: 59,000 is the largest that validates; 60,000 and 100,000 are refused, and
their refusals are recorded), wall and CPU seconds; and the planner placing 256 unrecorded pool
subnets, in-process.

Targets (issue 27): research-7500 <= 3 s wall on an idle 2-core machine, process startup
included; the 59,000-node variant (594 scale sets to research-7500's 79) <= 1.3x research-7500,
i.e. planning grows little with scale sets; 256 unrecorded pools planned in < 1 s in-process.
The plan runs the whole Pulumi program under Pulumi's mock engine: this is the cost of building
the graph (every registration and its inputs), not of talking to Azure.

Each case is the median of REPEATS runs of the process, after one run not counted: wall
(perf_counter) and CPU (getrusage RUSAGE_CHILDREN: user + system of the process), with the
1-minute load average before it, since other work on the two cores stretches wall time but not
CPU time. kilonode's bytecode is compiled first (`compile_package`), as an installed package
has it: where PYTHONDONTWRITEBYTECODE is set and no __pycache__/ was ever written, every run
compiles its ~200 modules again (about 0.1 s of CPU of a render, 0.2 s of a plan).

Writes bench/results/plan.json. Run: `make bench` or `.venv/bin/python bench/bench_plan.py`.
"""

from __future__ import annotations

import compileall
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from variants import LARGEST_VALID, MIDDLE, many_pools, scaled, write_results

ROOT = Path(__file__).resolve().parents[1]
KILONODE = str(Path(sys.executable).parent / "kilonode")
RESULTS = ROOT / "bench" / "results" / "plan.json"
REPEATS = 5
TARGET_S = 3.0
TARGET_RATIO = 1.3
POOLS = 256
POOLS_TARGET_S = 1.0
SCALE_SET = "azure-native:compute:VirtualMachineScaleSet"


def load() -> float:
    return round(os.getloadavg()[0], 2)


def compile_package() -> None:
    """kilonode's bytecode written (__pycache__/ is ignored by git), as pip's install writes it."""
    import kilonode

    compileall.compile_dir(Path(kilonode.__file__).parent, quiet=1)


def run(args: list[str]) -> tuple[float, float, subprocess.CompletedProcess[str]]:
    """One `kilonode` process: wall seconds, CPU seconds (user + system), the result."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run([KILONODE, *args], capture_output=True, text=True, timeout=600, check=False, cwd=ROOT)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), done


def figures(walls: list[float], cpus: list[float], load_before: float) -> dict[str, Any]:
    return {
        "wall_median_s": round(statistics.median(walls), 3), "wall_min_s": round(min(walls), 3),
        "wall_max_s": round(max(walls), 3), "cpu_median_s": round(statistics.median(cpus), 3),
        "cpu_min_s": round(min(cpus), 3), "cpu_max_s": round(max(cpus), 3), "load_average_1m_before": load_before,
    }


def bench_plan(stack: str) -> dict[str, Any]:
    run(["plan", stack, "--format", "json"])  # not counted: the files read into the page cache
    load_before = load()
    walls, cpus, output = [], [], ""
    for _ in range(REPEATS):
        wall, cpu, done = run(["plan", stack, "--format", "json"])
        if done.returncode != 0:
            raise SystemExit(f"kilonode plan {stack} failed:\n{done.stderr[-3000:]}")
        walls.append(wall)
        cpus.append(cpu)
        output = done.stdout
    plan = json.loads(output)
    return figures(walls, cpus, load_before) | {
        "resources": len(plan["resources"]), "scale_sets": plan["counts"].get(SCALE_SET, 0),
        "resources_per_type": plan["counts"],
    }


def refused(stack: Path) -> dict[str, Any]:
    _, _, done = run(["validate", str(stack)])
    lines = [line for line in done.stderr.strip().splitlines() if not line.startswith("warning:")]
    return {"exit_code": done.returncode, "message": lines[-1] if lines else "", "ok": done.returncode == 2}


def bench_pools() -> dict[str, Any]:
    """The planner (validation's cross-field checks and resolve) on POOLS unrecorded pools, in-process."""
    from kilonode.config import load_stack
    from kilonode.config.checks import cross_field_problems
    from kilonode.config.model import ClusterConfig
    from kilonode.plan import resolve

    profile = load_stack("local").sysctl_profile
    config = ClusterConfig.model_validate(many_pools(POOLS))
    load_before = load()
    walls, cpus, plan = [], [], None
    for _ in range(REPEATS):
        start, cpu = time.perf_counter(), time.process_time()
        problems = cross_field_problems(config, profile)
        plan = resolve(config, profile)
        walls.append(time.perf_counter() - start)
        cpus.append(time.process_time() - cpu)
        assert not problems, problems
    assert plan is not None
    median = statistics.median(walls)
    return figures(walls, cpus, load_before) | {
        "pools": POOLS, "unrecorded_subnets": len(plan.network.unrecorded),
        "target_s": POOLS_TARGET_S, "ok": median < POOLS_TARGET_S,
    }


def main() -> None:
    compile_package()
    start_load = load()
    research = bench_plan("research-7500")
    with tempfile.TemporaryDirectory(prefix="kilonode-bench-plan-") as tmp:
        work = Path(tmp)
        variants = {nodes: bench_plan(str(scaled(nodes, work))) for nodes in (MIDDLE, LARGEST_VALID)}
        refusals = {nodes: refused(scaled(nodes, work)) for nodes in (60_000, 100_000)}
    pools = bench_pools()
    base, base_sets = research["wall_median_s"], research["scale_sets"]
    results: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "machine": platform.machine(),
                    "load_average_1m_before": start_load},
        "method": f"wall (perf_counter) and CPU (getrusage RUSAGE_CHILDREN) of the `kilonode plan STACK --format "
                  f"json` process, median of {REPEATS} after one not counted, kilonode's bytecode compiled first; "
                  f"variants from bench/variants.py; the pools case in-process (cross_field_problems and resolve), "
                  f"wall and process_time, median of {REPEATS}",
        "research_7500": research | {"target_s": TARGET_S, "ok": base <= TARGET_S},
    }
    for nodes, case in variants.items():
        ratio = case["wall_median_s"] / base
        added = case["scale_sets"] - base_sets
        results[f"scaled_{nodes}_nodes"] = case | {
            "ratio_to_research_7500": round(ratio, 2),
            "cpu_ratio_to_research_7500": round(case["cpu_median_s"] / research["cpu_median_s"], 2),
            # what each scale set beyond research-7500's adds (its role assignments and timers too)
            "cpu_ms_per_added_scale_set": round(1000 * (case["cpu_median_s"] - research["cpu_median_s"]) / added, 2),
            "target_ratio": TARGET_RATIO, "ok": ratio <= TARGET_RATIO,
        }
    for nodes, refusal in refusals.items():
        results[f"scaled_{nodes}_nodes_refused"] = refusal
    results[f"unrecorded_pools_{POOLS}_in_process"] = pools
    write_results(RESULTS, results)


if __name__ == "__main__":
    main()
