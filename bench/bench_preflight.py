"""Benchmark: `kilonode preflight research-7500`, the whole process as a user runs it and as
`pulumi up`'s gate runs it (the stack loaded, planned, rendered and recorded under Pulumi's mock
engine, then every check), wall and CPU seconds, median of 5. Target (issue 22): a few seconds.

Writes bench/results/preflight.json. Run: `make bench-preflight`.
"""

from __future__ import annotations

import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "preflight.json"
REPEATS = 5
TARGET_S = 5.0


def one_run(stack: str) -> tuple[float, float, dict[str, int]]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "kilonode", "preflight", stack, "--format", "json"],
                            capture_output=True, text=True, timeout=300, check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if result.returncode not in (0, 1):
        raise SystemExit(f"preflight {stack} failed (exit {result.returncode}):\n{result.stderr}")
    findings = json.loads(result.stdout)
    levels = {level: sum(f["level"] == level for f in findings) for level in ("break", "warn")}
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, levels


def main() -> None:
    figures = {}
    for stack in ("research-7500", "local"):
        runs = [one_run(stack) for _ in range(REPEATS)]
        figures[stack] = {
            "wall_median_s": round(statistics.median(r[0] for r in runs), 2),
            "wall_max_s": round(max(r[0] for r in runs), 2),
            "cpu_median_s": round(statistics.median(r[1] for r in runs), 2),
            "findings": runs[-1][2],
        }
    report = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "machine": platform.machine()},
        "method": f"wall and CPU (user+sys) seconds of the `kilonode preflight STACK` process, median of {REPEATS}",
        "target_s": TARGET_S,
        **figures,
        "ok": figures["research-7500"]["wall_median_s"] <= TARGET_S,
    }
    RESULTS.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
