"""Benchmark: `kilonode render` of research-7500 and of variants scaled to 30,000 and 59,000 nodes
(bench/variants.py: 59,000 is the largest that validates), and `kilonode validate` of
research-7500, wall and CPU seconds; 60,000 and 100,000 nodes are refused by `validate` (exit 2),
and their refusals are recorded.

Targets: research-7500's render <= 0.5 s (issue 27; issue 2 asked 2 s) on an idle 2-core
machine, process startup included, and its validate, a part of it, likewise; a variant's render
<= 1.5x research-7500's (issue 2): rendering grows with pools and hosts, not with scale sets.

Each case is the median of REPEATS runs of the process, after one not counted: wall
(perf_counter) and CPU (getrusage RUSAGE_CHILDREN), with the 1-minute load average before it;
kilonode's bytecode compiled first (bench_plan.compile_package says why).

Writes bench/results/render.json. Run: `make bench` or `.venv/bin/python bench/bench_render.py`.
"""

from __future__ import annotations

import os
import platform
import tempfile
from pathlib import Path
from typing import Any

from bench_plan import compile_package, figures, load, refused, run
from variants import LARGEST_VALID, MIDDLE, scaled, write_results

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "render.json"
REPEATS = 5
TARGET_S = 0.5
TARGET_RATIO = 1.5


def bench(args: list[str]) -> dict[str, Any]:
    run(args)  # not counted: the files read into the page cache
    load_before = load()
    walls, cpus = [], []
    for _ in range(REPEATS):
        wall, cpu, done = run(args)
        if done.returncode != 0:
            raise SystemExit(f"kilonode {' '.join(args)} failed:\n{done.stderr[-3000:]}")
        walls.append(wall)
        cpus.append(cpu)
    return figures(walls, cpus, load_before)


def bench_render(stack: str, out: Path) -> dict[str, Any]:
    # each run after the first replaces the last one's render, as a user's second render does
    case = bench(["render", stack, "--out", str(out)])
    return case | {"files": sum(1 for p in out.rglob("*") if p.is_file())}


def main() -> None:
    compile_package()
    start_load = load()
    with tempfile.TemporaryDirectory(prefix="kilonode-bench-render-") as tmp:
        work = Path(tmp)
        research = bench_render("research-7500", work / "research-7500")
        validate = bench(["validate", "research-7500"])
        variants = {nodes: bench_render(str(scaled(nodes, work)), work / f"scaled-{nodes}")
                    for nodes in (MIDDLE, LARGEST_VALID)}
        refusals = {nodes: refused(scaled(nodes, work)) for nodes in (60_000, 100_000)}
    base = research["wall_median_s"]
    results: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "machine": platform.machine(),
                    "load_average_1m_before": start_load},
        "method": f"wall (perf_counter) and CPU (getrusage RUSAGE_CHILDREN) of the `kilonode render` (and "
                  f"`validate`) process, median of {REPEATS} after one not counted, kilonode's bytecode compiled "
                  f"first; variants from bench/variants.py",
        "research_7500": research | {"target_s": TARGET_S, "ok": base <= TARGET_S},
        "validate_research_7500": validate | {"target_s": TARGET_S, "ok": validate["wall_median_s"] <= TARGET_S},
    }
    for nodes, case in variants.items():
        ratio = case["wall_median_s"] / base
        results[f"scaled_{nodes}_nodes"] = case | {
            "ratio_to_research_7500": round(ratio, 2), "target_ratio": TARGET_RATIO, "ok": ratio <= TARGET_RATIO,
        }
    for nodes, refusal in refusals.items():
        results[f"scaled_{nodes}_nodes_refused"] = refusal
    write_results(RESULTS, results)


if __name__ == "__main__":
    main()
