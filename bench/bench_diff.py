"""Benchmark: wall time of `kilonode diff --base HEAD~1` on research-7500, as a reviewer runs it.

Target (issue 13): <= 10 s on 2 cores, process startup included. A temporary git repository
holds the toolkit and the shipped stacks (one commit), then research-7500's main etcd VM size
changed (a second commit); `kilonode diff --base HEAD~1 --fail-on high` renders and records
research-7500 at both refs, each in its own worktree with its own code, the two sides in
parallel, and must exit 3 (the quorum risk). Median of 5 runs; the load average is recorded,
since the two sides share the two cores.

Writes bench/results/diff.json. Run: `make bench-diff` (or `.venv/bin/python bench/bench_diff.py`).
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from kilonode.review.refs import TOOLKIT

ROOT = Path(__file__).resolve().parents[1]
KILONODE = str(Path(sys.executable).parent / "kilonode")
RESULTS = ROOT / "bench" / "results" / "diff.json"
REPEATS = 5
TARGET_S = 10.0
KEEP = (*TOOLKIT, "stacks/")  # what rendering needs: the toolkit and the stacks


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True).stdout


def make_repo(root: Path) -> None:
    for path in git(ROOT, "ls-files", "-co", "--exclude-standard").splitlines():
        if path.startswith(KEEP) and (ROOT / path).is_file():
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / path, root / path)
    git(root, "init", "-q", "-b", "main")
    git(root, "-c", "user.email=bench@example.invalid", "-c", "user.name=bench", "add", "-A")
    git(root, "-c", "user.email=bench@example.invalid", "-c", "user.name=bench", "commit", "-q", "-m", "base")
    stack = root / "stacks" / "Pulumi.research-7500.yaml"
    document = yaml.safe_load(stack.read_text())
    document["config"]["kilonode:cluster"]["etcd"]["main"]["vmSize"] = "Standard_D32ds_v5"
    stack.write_text(yaml.safe_dump(document, sort_keys=False))
    git(root, "-c", "user.email=bench@example.invalid", "-c", "user.name=bench", "commit", "-q", "-am", "etcd size")


def main() -> None:
    load_before = os.getloadavg()[0]
    times: list[float] = []
    with tempfile.TemporaryDirectory(prefix="kilonode-bench-diff-") as tmp:
        repo = Path(tmp)
        make_repo(repo)
        report = ""
        for _ in range(REPEATS):
            start = time.perf_counter()
            done = subprocess.run([KILONODE, "diff", "--base", "HEAD~1", "--fail-on", "high", "--format", "json"],
                                  cwd=repo, capture_output=True, text=True, timeout=600, check=False)
            times.append(time.perf_counter() - start)
            if done.returncode != 3:
                raise SystemExit(f"kilonode diff exited {done.returncode}, not 3:\n{done.stderr[-3000:]}")
            report = done.stdout
    data = json.loads(report)
    median = statistics.median(times)
    results = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "machine": platform.machine(),
                    "load_average_1m_before": round(load_before, 2)},
        "method": f"wall time of `kilonode diff --base HEAD~1 --fail-on high --format json` in a temporary "
                  f"repository whose last commit changes research-7500's etcd.main.vmSize; median of {REPEATS}",
        "research_7500": {
            "median_s": round(median, 2), "min_s": round(min(times), 2), "max_s": round(max(times), 2),
            "target_s": TARGET_S, "ok": median <= TARGET_S,
            "resources_changed": len(data["changes"]["research-7500"]["resources"]),
            "files_changed": len(data["changes"]["research-7500"]["files"]),
            "risks": [f"{r['level']} {r['rule']}" for r in data["risks"]],
        },
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))
    if median > TARGET_S:
        sys.exit(1)


if __name__ == "__main__":
    main()
