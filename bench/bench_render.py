"""Benchmark: wall time of `kilonode render` for research-7500 and a 60,000-node variant.

Targets (issue 2): research-7500 <= 2 s on a 2-core machine; the 60,000-node variant
<= 1.5x that. The variant is generated here: one InfiniBand pool of 60,000 nodes with
podsPerNode 0 (hostNetwork pods), so that it fits one VNet's 65,536 private IPs, in 600
scale sets. Also records that a 100,000-node pool is refused by `validate` (exit 2).

Writes bench/results/render.json. Run: `make bench` or `.venv/bin/python bench/bench_render.py`.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
KILONODE = str(Path(sys.executable).parent / "kilonode")
RESULTS = ROOT / "bench" / "results" / "render.json"
REPEATS = 5


def variant(nodes: int, name: str, directory: Path) -> Path:
    document = yaml.safe_load((ROOT / "stacks" / "Pulumi.research-7500.yaml").read_text())
    cluster = document["config"]["kilonode:cluster"]
    cluster["name"] = name
    # A /15 address space so a /16-sized pool subnet and the control-plane subnets align;
    # Azure still counts at most 65,536 private IPs in the VNet.
    # One pool is one subnet and one NAT gateway (16 IPs x 64,512 ports): 17 ports per node
    # is what 60,000 nodes behind one gateway get.
    cluster["network"] = {"vnetCidr": "10.0.0.0/15", "minSnatPortsPerNode": 17}
    cluster["nodePools"] = [{
        "name": "ib", "nodes": nodes, "podsPerNode": 0, "infiniband": True, "runtime": "docker",
    }]
    path = directory / f"Pulumi.{name}.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def time_command(args: list[str]) -> tuple[float, subprocess.CompletedProcess[str]]:
    start = time.perf_counter()
    result = subprocess.run(args, capture_output=True, text=True, timeout=120, check=False)
    return time.perf_counter() - start, result


def bench_render(stack: str, out: Path) -> dict[str, float]:
    times = []
    for _ in range(REPEATS):
        elapsed, result = time_command([KILONODE, "render", stack, "--out", str(out)])
        if result.returncode != 0:
            raise SystemExit(f"render {stack} failed:\n{result.stderr}")
        times.append(elapsed)
    files = sum(1 for p in out.rglob("*") if p.is_file())
    return {"median_s": round(statistics.median(times), 3), "max_s": round(max(times), 3), "files": files}


def main() -> None:
    with tempfile.TemporaryDirectory() as work:
        work_dir = Path(work)
        r7500 = bench_render("research-7500", work_dir / "r7500")
        r60k = bench_render(str(variant(60_000, "bench-60000", work_dir)), work_dir / "r60k")
        _, refused = time_command([KILONODE, "validate", str(variant(100_000, "bench-100000", work_dir))])
    results = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "machine": platform.machine()},
        "method": f"wall time of the `kilonode render` process (startup included), median of {REPEATS}",
        "research_7500": r7500 | {"target_s": 2.0, "ok": r7500["median_s"] <= 2.0},
        "variant_60000_nodes_600_scale_sets": r60k | {
            "target_s": round(1.5 * r7500["median_s"], 3),
            "ratio_to_7500": round(r60k["median_s"] / r7500["median_s"], 2),
            "ok": r60k["median_s"] <= 1.5 * r7500["median_s"],
        },
        "pool_of_100000_nodes_refused": {
            "exit_code": refused.returncode,
            "message": refused.stderr.strip().splitlines()[-1] if refused.stderr.strip() else "",
            "ok": refused.returncode == 2 and "100000 × (1 + 0)" in refused.stderr,
        },
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2, ensure_ascii=False) + "\n")
    print(json.dumps(results, indent=2, ensure_ascii=False))
    if not all(section.get("ok", True) for section in results.values() if isinstance(section, dict)):
        sys.exit(1)


if __name__ == "__main__":
    main()
