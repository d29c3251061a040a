"""Benchmark: `kilonode diff --base HEAD~1` on research-7500, as a reviewer runs it: wall time
and CPU time (the command and every process it starts), with and without cached snapshots.

Target (issues 13, 26 and 38): <= 10 s wall on an idle 2-core machine, process startup included,
with no cache, for a one-line change to the stack file; and fewer CPU-seconds than before
(docs/review.md has the figures): the two sides' snapshots share the two cores, so on a loaded
CI machine wall time follows CPU time.

A temporary git repository holds the toolkit and the shipped stacks (one commit), then
research-7500's main etcd VM size changed (a second commit); `kilonode diff --base HEAD~1
--fail-on high` renders and records research-7500 at both refs, each with its own code, and
must exit 3 (the quorum risk). Three cases, each with its own ${XDG_CACHE_HOME}:

- cold: an empty cache, both sides rendered (and written to the cache);
- warm: the base's snapshot cached, as under every pull request against the same main: the
  head rendered;
- hot: both cached, a review run again with nothing changed.

And a second repository whose last commit adds a taint to the H100 pool (issue 38: its review
places every workload with preflight's model on both sides, a high `daemonset-stranded`), cold.

Each case is the median of REPEATS runs; the reports of all runs must be the same but for
their time. CPU is getrusage(RUSAGE_CHILDREN) around each run: the command and its children
(the snapshot processes, git). The load average before each case is recorded, since the two
sides share the two cores with whatever else runs.

Writes bench/results/diff.json. Run: `make bench-diff` (or `.venv/bin/python bench/bench_diff.py`).
"""

from __future__ import annotations

import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from kilonode.review.refs import INPUTS

ROOT = Path(__file__).resolve().parents[1]
KILONODE = str(Path(sys.executable).parent / "kilonode")
RESULTS = ROOT / "bench" / "results" / "diff.json"
REPEATS = 5
TARGET_S = 10.0
STACK = "research-7500"
COMMAND = ["diff", "--base", "HEAD~1", "--fail-on", "high", "--format", "json"]
AUTHOR = ["-c", "user.email=bench@example.invalid", "-c", "user.name=bench"]


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True).stdout


def _etcd_size(cluster: dict[str, Any]) -> None:
    cluster["etcd"]["main"]["vmSize"] = "Standard_D32ds_v5"


def _pool_taint(cluster: dict[str, Any]) -> None:
    [pool] = [p for p in cluster["nodePools"] if p["name"] == "h100-ib"]
    pool["taints"] = ["dedicated=training:NoSchedule"]


# One-line changes to the stack file, each the last commit of a repository of its own: the etcd VM
# size (what the figures before issue 38 measured), and a taint on the H100 pool, whose review
# places every workload on both sides with preflight's model (kilonode.review.placement).
CHANGES: dict[str, Callable[[dict[str, Any]], None]] = {"etcd size": _etcd_size, "h100 pool taint": _pool_taint}


def make_repo(root: Path, change: str = "etcd size") -> None:
    for path in git(ROOT, "ls-files", "-co", "--exclude-standard").splitlines():
        if path.startswith(INPUTS) and (ROOT / path).is_file():
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / path, root / path)
    git(root, "init", "-q", "-b", "main")
    git(root, *AUTHOR, "add", "-A")
    git(root, *AUTHOR, "commit", "-q", "-m", "base")
    stack = root / "stacks" / f"Pulumi.{STACK}.yaml"
    document = yaml.safe_load(stack.read_text())
    CHANGES[change](document["config"]["kilonode:cluster"])
    stack.write_text(yaml.safe_dump(document, sort_keys=False))
    git(root, *AUTHOR, "commit", "-q", "-am", change)


def kilonode(repo: Path, cache: Path, args: list[str], expect: int) -> tuple[float, float, str]:
    """One run: wall seconds, CPU seconds (it and its children), stdout."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run([KILONODE, *args], cwd=repo, capture_output=True, text=True, timeout=600, check=False,
                          env={**os.environ, "XDG_CACHE_HOME": str(cache)})
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != expect:
        raise SystemExit(f"kilonode {' '.join(args)} exited {done.returncode}, not {expect}:\n{done.stderr[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, done.stdout


def case(repo: Path, prepare: Callable[[int], Path]) -> tuple[dict[str, Any], list[str]]:
    """REPEATS runs, each in the cache `prepare(i)` returns: the figures and the reports."""
    load = os.getloadavg()[0]
    walls, cpus, reports = [], [], []
    for i in range(REPEATS):
        wall, cpu, report = kilonode(repo, prepare(i), COMMAND, 3)
        walls.append(wall)
        cpus.append(cpu)
        reports.append(report)
    figures = {
        "wall_median_s": round(statistics.median(walls), 2), "wall_min_s": round(min(walls), 2),
        "wall_max_s": round(max(walls), 2), "cpu_median_s": round(statistics.median(cpus), 2),
        "cpu_min_s": round(min(cpus), 2), "cpu_max_s": round(max(cpus), 2),
        "load_average_1m_before": round(load, 2),
    }
    return figures, reports


def without_time(report: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(report)
    data.pop("seconds", None)
    return data


def main() -> None:
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="kilonode-bench-diff-") as tmp:
        scratch = Path(tmp)
        repo = scratch / "repo"
        repo.mkdir()
        make_repo(repo)
        # the base alone, as a pull request's base is cached: both sides at HEAD~1 are one key, one child
        seed = scratch / "seed"
        kilonode(repo, seed, ["diff", "--base", "HEAD~1", "--head", "HEAD~1", "--stack", STACK], 0)
        hot = scratch / "hot"
        kilonode(repo, hot, COMMAND, 3)

        def cold(i: int) -> Path:
            return scratch / f"cold-{i}"

        def warm(i: int) -> Path:
            shutil.copytree(seed, scratch / f"warm-{i}")
            return scratch / f"warm-{i}"

        def again(_: int) -> Path:
            return hot

        cases = {"cold": case(repo, cold), "warm_base_cached": case(repo, warm), "hot_both_cached": case(repo, again)}
        taint_repo = scratch / "taint"
        taint_repo.mkdir()
        make_repo(taint_repo, "h100 pool taint")

        def taint_cold(i: int) -> Path:
            return scratch / f"taint-cold-{i}"

        taint, taint_reports = case(taint_repo, taint_cold)
    if any(without_time(r) != without_time(taint_reports[0]) for r in taint_reports):
        raise SystemExit("the reviews of the pool taint differ between runs")
    taint_risks = [f"{r['level']} {r['rule']}" for r in without_time(taint_reports[0])["risks"]]
    reports = [without_time(r) for _, runs in cases.values() for r in runs]
    if any(r != reports[0] for r in reports):
        raise SystemExit("the reviews differ between runs or between cached and uncached snapshots")
    data = reports[0]
    cold_median = cases["cold"][0]["wall_median_s"]
    results = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "machine": platform.machine(),
                    "load_average_1m_before": round(load_before, 2)},
        "method": f"`kilonode {' '.join(COMMAND)}` in a temporary repository whose last commit changes {STACK}'s "
                  f"etcd.main.vmSize; wall (perf_counter) and CPU (getrusage RUSAGE_CHILDREN: the command and its "
                  f"children) per run, median of {REPEATS}; cold: empty cache; warm: the base's snapshot cached; "
                  f"hot: both cached",
        STACK: {name: figures for name, (figures, _) in cases.items()} | {
            "target_s": TARGET_S, "ok": cold_median <= TARGET_S,
            "resources_changed": len(data["changes"][STACK]["resources"]),
            "files_changed": len(data["changes"][STACK]["files"]),
            "risks": [f"{r['level']} {r['rule']}" for r in data["risks"]],
        },
        f"{STACK}, h100 pool taint": {"cold": taint, "target_s": TARGET_S, "ok": taint["wall_median_s"] <= TARGET_S,
                                      "risks": taint_risks},
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    partial = RESULTS.with_name(RESULTS.name + ".tmp")
    partial.write_text(json.dumps(results, indent=2) + "\n")
    partial.replace(RESULTS)
    print(json.dumps(results, indent=2))
    if cold_median > TARGET_S or taint["wall_median_s"] > TARGET_S:
        sys.exit(1)


if __name__ == "__main__":
    main()
