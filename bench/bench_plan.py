"""Benchmark: wall time of `kilonode plan research-7500` and the size of its resource graph.

Target (issue 3): <= 5 s on this machine, process startup included. The plan runs the
whole Pulumi program under Pulumi's mock engine, so this is the cost of building the graph
(every resource registration and its inputs), not of talking to Azure.

Writes bench/results/plan.json. Run: `.venv/bin/python bench/bench_plan.py`.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KILONODE = str(Path(sys.executable).parent / "kilonode")
RESULTS = ROOT / "bench" / "results" / "plan.json"
REPEATS = 5
TARGET_S = 5.0


def main() -> None:
    times: list[float] = []
    output = ""
    for _ in range(REPEATS):
        start = time.perf_counter()
        result = subprocess.run(
            [KILONODE, "plan", "research-7500", "--format", "json"],
            capture_output=True, text=True, timeout=300, check=False, cwd=ROOT,
        )
        times.append(time.perf_counter() - start)
        if result.returncode != 0:
            raise SystemExit(f"kilonode plan research-7500 failed:\n{result.stderr}")
        output = result.stdout
    plan = json.loads(output)
    counts = plan["counts"]
    median = statistics.median(times)
    results: dict[str, object] = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "machine": platform.machine(),
            "load_average_1m": round(os.getloadavg()[0], 2),
        },
        "method": f"wall time of the `kilonode plan research-7500 --format json` process, median of {REPEATS}",
        "research_7500": {
            "median_s": round(median, 3),
            "min_s": round(min(times), 3),
            "max_s": round(max(times), 3),
            "target_s": TARGET_S,
            "ok": median <= TARGET_S,
            "resources": len(plan["resources"]),
            "resources_per_type": counts,
        },
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))
    if median > TARGET_S:
        sys.exit(1)


if __name__ == "__main__":
    main()
