"""The VM harness's reboot and boot-failure rules, on a real qemu (no image needed).

The harness powers a VM on afresh instead of resetting it in place (infra/kilonode/image/qemu.py):
these tests hold it to the rules that keep that honest: a machine whose firmware never
prints, or whose kernel goes silent after its banner and before init (or reports that its
timer stopped firing), is powered on once more and then reported, and a guest that resets by
itself after the firmware ran ends qemu and fails at once, with the console tail, never retried.
"""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

import pytest

from kilonode.image.qemu import FirmwareHang, KernelStall, Vm, VmConfig, VmError

pytestmark = pytest.mark.slow  # starts qemu


def config(tmp_path: Path, **kwargs: object) -> VmConfig:
    blank = tmp_path / "blank.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(blank), "64M"], check=True)
    seed = tmp_path / "seed.img"
    seed.write_bytes(b"\0" * 4096)
    return VmConfig(image=blank, seed=seed, workdir=tmp_path / "vm", user="nobody", key_file=tmp_path / "none",
                    memory_mib=256, cpus=1, local_ssd_gib=1, **kwargs)  # type: ignore[arg-type]


def test_command_line_powers_off_on_reset_and_keeps_the_console(tmp_path: Path) -> None:
    vm = Vm(config(tmp_path))
    cmd = vm._command()
    assert "-no-reboot" in cmd
    assert any(arg.startswith("file,id=console,") and arg.endswith(",append=on") for arg in cmd)
    assert "-no-reboot" not in Vm(config(tmp_path), reboot_mode="warm-reset")._command()


def test_silent_firmware_is_powered_on_once_more_then_reported(tmp_path: Path) -> None:
    # `-S`: the CPUs never start, so the console stays empty, as in a firmware hang
    cfg = config(tmp_path, firmware_silence_s=3.0, extra_qemu_args=("-S",))
    notes: list[str] = []
    with Vm(cfg, progress=notes.append) as vm:
        first_pid = vm.proc.pid if vm.proc else None
        with pytest.raises(FirmwareHang, match="no console output 3 s after the power-on"):
            vm.wait_ssh(timeout=60)
        record = vm.boots[-1]
        assert record.firmware_retries == 1 and record.firmware_s is None
        assert vm.proc is not None and vm.proc.pid != first_pid, "the retry must be a fresh qemu"
        assert notes == ["no console output 3 s after the power-on (the firmware never ran); powering on again"]
    assert vm.proc is not None and vm.proc.poll() is not None, "the VM is stopped on exit"


def test_a_reset_after_the_firmware_ran_fails_at_once_with_the_console(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    with Vm(cfg) as vm:
        deadline = time.monotonic() + 60
        def printed() -> bool:
            return vm.console.exists() and vm.console.stat().st_size > 0

        while not printed() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert printed(), "OVMF printed nothing in 60 s"
        vm.monitor_command("system_reset")  # what a guest's own reboot or triple fault does
        started = time.monotonic()
        with pytest.raises(VmError, match="qemu exited") as caught:
            vm.wait_ssh(timeout=120)
        assert time.monotonic() - started < 30, "a reset must fail at once, not wait out the timeout"
        assert "console tail:" in str(caught.value)
        assert len(vm.boots) == 1 and vm.boots[0].firmware_retries == 0, "never retried"


def test_a_kernel_silent_before_init_is_powered_on_once_more_then_reported(tmp_path: Path) -> None:
    # `-S` keeps the CPUs stopped (qemu itself runs: its console file and port forward are
    # real); the kernel's banner is put on each boot's console by hand, as a kernel that
    # printed it and then stalled before init would leave it
    cfg = config(tmp_path, firmware_silence_s=60.0, kernel_silence_s=3.0, extra_qemu_args=("-S",))
    notes: list[str] = []
    done = threading.Event()
    with Vm(cfg, progress=notes.append) as vm:
        pids: list[int] = []

        def print_banners() -> None:  # once per qemu process, as each boot's kernel would
            while not done.is_set():
                proc = vm.proc
                if proc is not None and proc.pid not in pids:
                    pids.append(proc.pid)
                    with vm.console.open("ab") as console:
                        console.write(b"[    0.000000] Linux version 6.1.0 (test)\n[    1.27] clocksource: hpet\n")
                time.sleep(0.1)

        printer = threading.Thread(target=print_banners, daemon=True)
        printer.start()
        try:
            started = time.monotonic()
            with pytest.raises(KernelStall, match="again after a fresh power-on") as caught:
                vm.wait_ssh(timeout=120)
            assert time.monotonic() - started < 60, "a stall is found in seconds, not at the SSH timeout"
        finally:
            done.set()
            printer.join(timeout=5)
        record = vm.boots[-1]
        assert record.kernel_retries == 1 and len(pids) == 2, "one fresh qemu, then reported"
        assert "console tail:" in str(caught.value) and "clocksource: hpet" in str(caught.value)
        assert len(notes) == 1 and notes[0].endswith("before init (an emulator stall: no image code had run); "
                                                     "powering on again")


def test_a_kernel_reporting_its_timer_stopped_is_powered_on_once_more_then_reported(tmp_path: Path) -> None:
    # what a loaded 2-core runner's TCG guest printed after a power-cycle (CI, 2026-12-07): RCU's
    # stall reports every ~20 s, so the console never went silent; past init, before SSH
    cfg = config(tmp_path, firmware_silence_s=60.0, kernel_silence_s=600.0, extra_qemu_args=("-S",))
    stall = (b"[    0.0] Linux version 6.1.0 (test)\n[    5.0] Run /init as init process\n"
             b"[  379.8] rcu: rcu_preempt kthread timer wakeup didn't happen for 15753 jiffies!\n")
    notes: list[str] = []
    done = threading.Event()
    with Vm(cfg, progress=notes.append) as vm:
        pids: list[int] = []

        def print_stalls() -> None:
            while not done.is_set():
                proc = vm.proc
                if proc is not None and proc.pid not in pids:
                    pids.append(proc.pid)
                    with vm.console.open("ab") as console:
                        console.write(stall)
                time.sleep(0.1)

        printer = threading.Thread(target=print_stalls, daemon=True)
        printer.start()
        try:
            started = time.monotonic()
            with pytest.raises(KernelStall, match=r"timer stopped firing.*again after a fresh power-on"):
                vm.wait_ssh(timeout=120)
            assert time.monotonic() - started < 60
        finally:
            done.set()
            printer.join(timeout=5)
        assert vm.boots[-1].kernel_retries == 1 and len(pids) == 2, "one fresh qemu, then reported"
        assert len(notes) == 1 and notes[0].endswith("powering on again")


def test_a_kernel_that_reached_init_is_never_retried_for_silence(tmp_path: Path) -> None:
    # after init the image's own code runs: silence there is the image's, and waits out the timeout
    cfg = config(tmp_path, firmware_silence_s=60.0, kernel_silence_s=2.0, extra_qemu_args=("-S",))
    with Vm(cfg) as vm:
        with vm.console.open("ab") as console:
            console.write(b"[    0.0] Linux version 6.1.0 (test)\n[    5.0] Run /init as init process\n")
        with pytest.raises(VmError, match=r"no SSH on 127\.0\.0\.1") as caught:
            vm.wait_ssh(timeout=15)
        assert not isinstance(caught.value, KernelStall)
        assert vm.boots[-1].kernel_retries == 0 and len(vm.boots) == 1
