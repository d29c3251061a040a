"""Benchmark: how often a VM reboot under TCG never comes back, per reboot mechanism.

Boots the node image once, then reboots it N times the way `kilonode image verify` does
(the guest's `systemctl reboot`, then wait for SSH in a new boot and for cloud-init and
systemd to settle), recording per cycle the seconds from the power-on (or, for a reset in
place, from the kernel's `reboot: machine restart` line) until the firmware prints, the
kernel's banner, SSH, and systemd settled, and whether it hung.

Mechanisms (`--mode`):
- warm-reset: qemu's default, the machine reset in place. The baseline that hung in CI: a
  cycle counts as hung when the console stays silent for FIRMWARE_SILENCE_S after the
  restart line; the bench then kills that qemu, powers on a fresh one and goes on.
- power-cycle: what verify does now: `-no-reboot` ends qemu on the guest's reset and the
  harness powers on a fresh qemu on the same disks and NVRAM. A cycle counts as hung when
  the fresh qemu prints nothing (the harness's one retry is recorded too).

Writes bench/results/reboot.json (each mode's section replaced, the other kept). Run:
    .venv/bin/python bench/bench_reboot.py --mode both --cycles 20
(builds the `local` stack's cpu pool image first if --image is not given and none is built).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from kilonode.image.qemu import FIRMWARE_SILENCE_S, BootRecord, FirmwareHang, Vm, VmConfig, VmError
from kilonode.image.seed import make_keypair, make_seed, meta_data

ROOT = Path(__file__).resolve().parents[1]

RESULTS = ROOT / "bench" / "results" / "reboot.json"
WORK = ROOT / "build" / "bench-reboot"


def ensure_image(image: Path | None) -> Path:
    if image is not None:
        return image
    raw = WORK / "image" / "local-cpu.raw"
    if not raw.exists():
        print("building the local stack's cpu pool image ...", flush=True)
        subprocess.run([sys.executable, "-m", "kilonode.cli", "image", "build", "local", "--pool", "cpu",
                        "--out", str(raw.parent)], cwd=ROOT, check=True)
    return raw


def cycle_row(n: int, record: BootRecord | None, settled_s: float | None, hung: bool, error: str | None,
              state: str | None) -> dict[str, Any]:
    return {
        "cycle": n,
        "hung": hung,
        "shutdown_s": record.shutdown_s if record else None,
        "firmware_s": record.firmware_s if record else None,
        "handoff_s": record.handoff_s if record else None,
        "kernel_s": record.kernel_s if record else None,
        "ssh_s": record.ssh_s if record else None,
        "settled_s": settled_s,
        "systemd_state": state,
        "firmware_retries": record.firmware_retries if record else 0,
        "error": error,
    }


def run_mode(mode: str, image: Path, cycles: int) -> dict[str, Any]:
    work = WORK / mode
    work.mkdir(parents=True, exist_ok=True)
    key_file, public_key = make_keypair(work)
    user_data = (image.parent / (image.stem + ".user-data")).read_text()
    seed = make_seed(work / "seed.img", user_data, meta_data(public_key, "bench-reboot"))
    config = VmConfig(image=image, seed=seed, workdir=work, user="debian", key_file=key_file)
    rows: list[dict[str, Any]] = []
    started = time.monotonic()
    with Vm(config, reboot_mode=mode, progress=lambda line: print(f"  {line}", flush=True)) as vm:  # type: ignore[arg-type]
        vm.wait_ssh()
        state = vm.wait_settled()
        first = vm.boots[-1]
        print(f"{mode}: first boot: firmware {first.firmware_s} s, SSH {first.ssh_s} s, {state}", flush=True)
        for n in range(1, cycles + 1):
            record: BootRecord | None = None
            try:
                record = vm.reboot()
                state = vm.wait_settled()
                rows.append(cycle_row(n, record, round(vm.seconds_since_boot_began(), 1), False, None, state))
            except FirmwareHang as error:
                rows.append(cycle_row(n, vm.boots[-1], None, True, str(error).splitlines()[0], None))
                recover(vm)
            except VmError as error:
                rows.append(cycle_row(n, vm.boots[-1], None, False, str(error)[:2000], None))
                recover(vm)
            row = rows[-1]
            print(f"{mode} {n:2}/{cycles}: " + ("HUNG" if row["hung"] else "error" if row["error"] else "ok")
                  + f"  shutdown {row['shutdown_s']} s, firmware {row['firmware_s']} s, "
                  f"boot loader {row['handoff_s']} s, kernel {row['kernel_s']} s,"
                  f" SSH {row['ssh_s']} s, settled {row['settled_s']} s", flush=True)
    ok = [r for r in rows if not r["hung"] and not r["error"]]

    def median(key: str) -> float | None:
        values = [r[key] for r in ok if r[key] is not None]
        return round(statistics.median(values), 1) if values else None

    return {
        "cycles": cycles,
        "hangs": sum(r["hung"] for r in rows),
        "hang_rate": round(sum(r["hung"] for r in rows) / cycles, 3) if cycles else 0.0,
        "other_failures": sum(bool(r["error"]) and not r["hung"] for r in rows),
        "firmware_retries": sum(r["firmware_retries"] for r in rows),
        "median_s": {k: median(k) for k in ("shutdown_s", "firmware_s", "handoff_s", "kernel_s", "ssh_s", "settled_s")},
        "wall_s": round(time.monotonic() - started, 1),
        "per_cycle": rows,
    }


def recover(vm: Vm) -> None:
    """After a hung cycle: a fresh qemu on the same disks, so the next cycle can run."""
    vm.stop(timeout=5)
    vm.power_on("power-on")
    vm.wait_ssh()
    vm.wait_settled()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=["warm-reset", "power-cycle", "both"], default="power-cycle")
    parser.add_argument("--cycles", type=int, default=20, help="reboots per mode (default 20)")
    parser.add_argument("--image", type=Path, help="a built .raw or .vhd with its .user-data beside it")
    args = parser.parse_args()
    image = ensure_image(args.image)
    qemu = subprocess.run(["qemu-system-x86_64", "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    results: dict[str, Any] = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    results["machine"] = {"cpus": os.cpu_count(), "python": platform.python_version(), "qemu": qemu,
                          "accel": "tcg,thread=multi", "vm": "q35, 2 vCPUs, 2 GiB, OVMF 4M"}
    results["hang_rule"] = (f"hung = no console output {FIRMWARE_SILENCE_S:.0f} s after the restart (warm-reset) or "
                            "after a power-on that was retried once (power-cycle)")
    modes = ["warm-reset", "power-cycle"] if args.mode == "both" else [args.mode]
    for mode in modes:
        section = run_mode(mode, image, args.cycles)
        section["measured"] = time.strftime("%Y-%m-%d")
        section["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
        results[mode] = section
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        tmp = RESULTS.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(results, indent=2) + "\n")
        tmp.replace(RESULTS)
        print(f"{mode}: {section['hangs']} hung of {args.cycles} (other failures {section['other_failures']}); "
              f"medians {section['median_s']}", flush=True)


if __name__ == "__main__":
    main()
