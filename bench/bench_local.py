"""Benchmark: `kilonode local up` (both etcd clusters and the worker VM) cold and warm, a second
`up` on the running rehearsal, and `down`, in wall time, with the load average.

- cold: the pool image is not in the cache, so `up` builds it; the base root filesystem IS
  cached (`make test-artefacts` / `kilonode image prepare` made it: mmdebstrap from the mirror
  adds ~100 s more). The image cache is a temporary XDG_CACHE_HOME with the real base root
  filesystems linked in, so the user's own image cache is neither used nor touched;
- again: `up` on the running rehearsal (nothing to do: it checks and summarises);
- down: the guest powers off, the members stop, the state goes;
- warm: `up` from a fresh state directory with the image cached: everything but the boot cached.

The worker's first boot runs cloud-init (host keys, the local-SSD format and mount, sysctls,
the preloaded images loaded into docker), which dominates; qemu runs under TCG on 2 cores.
The machine may be shared: the load average before and after each phase, and the qemu
processes that were not ours, go into the results.

Writes bench/results/local.json. Run: `.venv/bin/python bench/bench_local.py` (`make
bench-local`); `--stack NAME` for another stack (its rehearsal's loopback addresses must be free).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from kilonode.image import cache

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "local.json"
KILONODE = [sys.executable, "-m", "kilonode.cli", "local"]
# the progress lines `up` prints ("  93.4s worker VM: SSH answers ..."): the phases inside it
MILESTONES = {
    "image_built_s": r"pool image \S+: built in",
    "etcd_checked_s": r"checking the rendered kube-apiserver etcd flags",
    "worker_power_on_s": r"worker VM: powering on",
    "worker_ssh_s": r"worker VM: SSH answers",
    "worker_settled_s": r"worker VM: systemd '",
    "worker_facts_read_s": r"worker VM: reading its live sysctls",
}


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def other_qemus(ours: Path) -> int:
    """qemu processes running now that this benchmark did not start (a CI run, other sessions):
    ours name their disks under `ours`."""
    count = 0
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                argv = (proc / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if argv and argv[0].endswith(b"qemu-system-x86_64") and not any(str(ours).encode() in a for a in argv):
                count += 1
    return count


def run(phase: str, args: list[str], env: dict[str, str], results: dict[str, object], ours: Path) -> str:
    before, qemus = loadavg(), other_qemus(ours)
    start = time.perf_counter()
    result = subprocess.run([*KILONODE, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600,
                            check=False)
    elapsed = time.perf_counter() - start
    output = result.stdout + result.stderr
    if result.returncode != 0:
        sys.exit(f"{phase}: `kilonode local {' '.join(args)}` exited {result.returncode}:\n{output[-5000:]}")
    record: dict[str, object] = {"wall_s": round(elapsed, 1), "load_before": before, "load_after": loadavg(),
                                 "other_qemu_processes_before": qemus, "other_qemu_processes_after": other_qemus(ours)}
    inside = {}
    for key, pattern in MILESTONES.items():
        match = re.search(r"^\s*([\d.]+)s " + pattern, output, re.MULTILINE)
        if match:
            inside[key] = float(match.group(1))
    if inside:
        record["milestones_s"] = inside
    # the timed progress lines themselves (the summary tables left out), to read a figure back
    record["progress"] = [line.strip() for line in output.splitlines() if re.match(r"^\s*[\d.]+s ", line)]
    results[phase] = record
    print(f"{phase}: {elapsed:.1f} s (load {before} -> {record['load_after']}, other qemu: {qemus})", flush=True)
    return output


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stack", default="local")
    stack = parser.parse_args().stack
    base_cache = cache.cache_root() / "rootfs"
    results: dict[str, object] = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "qemu_accel": "tcg"},
        "stack": stack,
        "cold_means": "pool image not in the cache (built by `up`); base root filesystem cached",
        "base_root_filesystems_cached": sorted(p.name[:12] for p in base_cache.glob("*.tar")),
    }
    with tempfile.TemporaryDirectory(prefix="kilonode-bench-local-") as tmp:
        work = Path(tmp)
        (work / "cache" / "kilonode").mkdir(parents=True)
        (work / "cache" / "kilonode" / "rootfs").symlink_to(base_cache, target_is_directory=True)
        env = os.environ | {"XDG_CACHE_HOME": str(work / "cache"), "COLUMNS": "200"}
        state = ["--state-dir", str(work / "state")]
        try:
            cold = run("cold_up", ["up", stack, *state], env, results, work)
            if "built in" not in cold:
                sys.exit(f"cold_up did not build the pool image:\n{cold[-3000:]}")
            again = run("second_up", ["up", stack, *state], env, results, work)
            if "Nothing changed" not in again:
                sys.exit(f"second_up changed something:\n{again[-3000:]}")
            run("down_after_cold", ["down", stack, *state], env, results, work)
            warm = run("warm_up", ["up", stack, *state], env, results, work)
            if "in the cache" not in warm:
                sys.exit(f"warm_up did not find the pool image in the cache:\n{warm[-3000:]}")
            run("down_after_warm", ["down", stack, *state], env, results, work)
        finally:
            # whatever failed, stop what was started (by its PID files)
            subprocess.run([*KILONODE, "down", stack, *state], cwd=ROOT, env=env, capture_output=True,
                           timeout=600, check=False)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
