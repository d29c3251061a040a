"""Benchmark: the node image's cold build, warm rebuild, and boot + verify wall times.

Targets (issue 4): cold build <= 4 min, warm rebuild <= 45 s, boot + verify <= 2 min, on a
2-core machine where qemu runs under TCG (no usable KVM here: a paravirtual KVM hangs a stock kernel).

- cold: `kilonode image build local --pool cpu` with an empty XDG_CACHE_HOME, so the base
  root filesystem is made by mmdebstrap from this machine's mirror;
- warm: the same build again: the base comes from the cache, the rest is redone;
- boot + verify: `kilonode image verify` on the result (boot, first-boot checks, reboot,
  persistence checks, shutdown), with its phase timings.

Writes bench/results/image.json. Run: `.venv/bin/python bench/bench_image.py`
(add `--no-cold` to reuse your cache and skip the cold build).
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "image.json"
KILONODE = [sys.executable, "-m", "kilonode.cli"]
TARGETS_S = {"cold_build": 240, "warm_rebuild": 45, "boot_and_verify": 120}


def timed(args: list[str], env: dict[str, str]) -> tuple[float, subprocess.CompletedProcess[str]]:
    start = time.perf_counter()
    result = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600, check=False)
    elapsed = time.perf_counter() - start
    if result.returncode != 0:
        tail = f"{result.stdout[-3000:]}\n{result.stderr[-2000:]}"
        sys.exit(f"{' '.join(args[2:])} failed ({result.returncode}):\n{tail}")
    return elapsed, result


def main() -> None:
    cold_run = "--no-cold" not in sys.argv
    out = ROOT / "build" / "bench-image"
    shutil.rmtree(out, ignore_errors=True)
    env = dict(os.environ)
    results: dict[str, object] = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "qemu_accel": "tcg"},
        "targets_s": TARGETS_S,
    }
    times: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="kilonode-cold-cache-") as cold_cache:
        if cold_run:
            env_cold = {**env, "XDG_CACHE_HOME": cold_cache}
            times["cold_build"], _ = timed([*KILONODE, "image", "build", "local", "--pool", "cpu", "--out", str(out)],
                                           env_cold)
            env = env_cold  # the warm rebuild reuses what the cold build cached
        else:
            # make sure the (real) cache is warm before timing the warm rebuild
            timed([*KILONODE, "image", "build", "local", "--pool", "cpu", "--out", str(out)], env)
        times["warm_rebuild"], warm = timed(
            [*KILONODE, "image", "build", "local", "--pool", "cpu", "--out", str(out)], env
        )
        assert "base reused from cache" in warm.stdout, warm.stdout
        manifest = json.loads((out / "local-cpu.manifest.json").read_text())
        results["warm_rebuild_steps_s"] = manifest["timings_s"]
        work = out / "verify"
        times["boot_and_verify"], _ = timed(
            [*KILONODE, "image", "verify", str(out / "local-cpu.raw"), "--workdir", str(work)], env
        )
        summary = json.loads((work / "verify-summary.json").read_text())
        results["verify_phases_s"] = summary["timings_s"]
        results["verify_counts"] = summary["counts"]
    results["wall_s"] = {k: round(v, 1) for k, v in times.items()}
    results["met"] = {k: times[k] <= TARGETS_S[k] for k in times}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
