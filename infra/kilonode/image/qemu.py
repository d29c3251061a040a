"""A throwaway qemu VM booting a built image under UEFI, reachable over SSH on loopback.

Measured on these machines: KVM here is paravirtual and hangs a
stock kernel, so qemu runs under TCG. The VM boots a qcow2 overlay over the image (the
image stays pristine), has a blank second disk standing in for the instance's local SSD
(/dev/vdb, as in the `local` stack) and the NoCloud seed as a third disk. Its SSH port is
forwarded to 127.0.0.1 only. Every wait is bounded; the VM is stopped by its PID.

Reboot is a power cycle the harness controls. qemu runs with `-no-reboot`, so the guest's
own `systemctl reboot` (its whole shutdown path) ends the qemu process instead of resetting
the machine in place; the harness then powers on a fresh qemu on the same OS overlay,
local-SSD disk, seed and UEFI NVRAM. Resetting in place (qemu's default) left the guest
silent after `reboot: machine restart`, never reaching the firmware again, in a measured
share of reboots under TCG (bench/bench_reboot.py, bench/results/reboot.json); a fresh
qemu process has never shown it. KubeVirt took the same path for the same reason (its
"cold reboot" VEP 171: qemu terminates on a guest reboot and the controller starts it).
A fresh power-on is also what an Azure deallocate/start does to a node.

A boot that prints nothing at all for FIRMWARE_SILENCE_S (the firmware prints within ~5 s)
never reached the image; it is powered on once more and reported. A kernel that printed its
banner and then nothing for KERNEL_SILENCE_S before it started init is the same kind of
emulator stall (measured once in CI on a loaded 2-core runner: Debian's kernel silent for
420 s after "clocksource: Switched to clocksource hpet" at 1.27 s, where the same image's
other boots print the next line within 2 s and reach init within 6 s): it too is powered on
once more, noted on the boot record, and reported if it happens again. Anything after init
started, and any failure that is not silence, is the image's: it fails, with the console tail.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import paramiko

# paramiko logs every refused early connection (qemu's port forward accepts before sshd
# listens) as a traceback; the waits below handle those, so keep the log quiet.
logging.getLogger("paramiko").setLevel(logging.CRITICAL)

OVMF_CODE = Path("/usr/share/OVMF/OVMF_CODE_4M.fd")
OVMF_VARS = Path("/usr/share/OVMF/OVMF_VARS_4M.fd")

# Markers on the serial console, in boot order (measured, OVMF + standalone GRUB + Debian):
# OVMF clears the screen first, then hands over to the boot loader, which starts the kernel.
KERNEL_MARK = b"Linux version "
HANDOFF_MARK = b"BdsDxe: starting "
# The kernel hands over to userspace (init/main.c: "Run %s as init process"), from here on
# the image's own code runs.
INIT_MARK = b" as init process"
RESTART_MARKS = (b"reboot: Restarting system", b"reboot: machine restart")
# Both NICs' MAC (qemu's default prefix); the primary is the virtio one.
NIC_MAC = "52:54:00:12:34:56"
# The firmware prints within ~5 s of power-on under TCG; this much silence means it never ran.
FIRMWARE_SILENCE_S = 90.0
# Between its banner and init the kernel prints every few seconds under TCG (measured: the
# longest gap 2.3 s, the initramfs unpacking); this much silence there is a stalled emulator.
KERNEL_SILENCE_S = 120.0
# The kernel's own report that a virtual CPU's timer stopped firing (RCU's "Possible timer
# handling issue", kernel/rcu/tree_stall.h in 6.1): seen on a loaded 2-core runner under TCG
# after a power-cycle, the guest then printing only stall reports until the SSH timeout. It
# names the emulated timer, not code the image runs, so it is treated like a kernel stall.
TIMER_STALL_MARK = b"kthread timer wakeup didn't happen"
# SSH is tried once the kernel's banner shows, or after this long for an image whose kernel
# does not print on the serial console.
KERNEL_WAIT_S = 45.0
# A clean guest shutdown under TCG takes ~10-20 s; leave room for a busy 2-core machine.
SHUTDOWN_TIMEOUT_S = 180.0

RebootMode = Literal["power-cycle", "warm-reset"]


class VmError(RuntimeError):
    pass


class FirmwareHang(VmError):
    """The machine went silent before its firmware printed anything (not the image's fault)."""


class KernelStall(VmError):
    """The kernel went silent after its banner and before init, or reported that its timer
    stopped firing before SSH answered, twice (the emulator's, not the image's)."""


@dataclass
class BootRecord:
    """Seconds from the power-on (or the guest's restart) to each milestone; None if unseen."""

    how: str  # "power-on", "power-cycle" or "warm-reset"
    firmware_s: float | None = None  # first console output of the new boot
    handoff_s: float | None = None  # the firmware starts the boot loader
    kernel_s: float | None = None  # the kernel's banner
    ssh_s: float | None = None  # SSH answered with a new boot ID
    shutdown_s: float | None = None  # the guest's shutdown, until qemu exited (power-cycle)
    firmware_retries: int = 0  # power-ons that printed nothing and were repeated
    kernel_retries: int = 0  # power-ons whose kernel stalled before init and were repeated
    notes: list[str] = field(default_factory=list)


def image_format(image: Path) -> str:
    # `qemu-img info` calls a fixed VHD "raw": say vpc explicitly (measured).
    return "vpc" if image.suffix.lower() == ".vhd" else ("qcow2" if image.suffix == ".qcow2" else "raw")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class VmConfig:
    image: Path
    seed: Path
    workdir: Path
    user: str
    key_file: Path
    memory_mib: int = 2048
    cpus: int = 2
    local_ssd_gib: int = 4
    # blank NVMe disks, each on its own controller as Azure's local NVMe disks are (qemu's
    # model string is "QEMU NVMe Ctrl"): nvme0n1, nvme1n1, ...
    nvme_disks: int = 0
    nvme_disk_gib: int = 1
    # seconds of console silence after a power-on that mean the firmware never ran
    firmware_silence_s: float = FIRMWARE_SILENCE_S
    # seconds of console silence between the kernel's banner and init that mean a stalled emulator
    kernel_silence_s: float = KERNEL_SILENCE_S
    extra_qemu_args: tuple[str, ...] = ()  # appended to the command line (tests: `-S`)
    # Detached mode (`kilonode local up`'s worker): the VM outlives this process. qemu already
    # runs in its own session (no terminal signal reaches it); with a PID file, each power-on
    # also writes qemu's PID there and gives it /dev/null as stdin, so another process (a
    # later `up`, `down`) can find it, check /proc/<pid>/cmdline and stop it by PID.
    pid_file: Path | None = None


class Vm:
    """Start with `with Vm(config) as vm:`; the VM is always stopped on exit.

    `reboot_mode="warm-reset"` keeps qemu's in-place reset (no `-no-reboot`): only the
    reboot benchmark uses it, to measure the hang that made reboots a power cycle.
    """

    def __init__(self, config: VmConfig, reboot_mode: RebootMode = "power-cycle",
                 progress: Callable[[str], None] = lambda _line: None) -> None:
        self.config = config
        self.reboot_mode: RebootMode = reboot_mode
        self.progress = progress
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.console = config.workdir / "console.log"
        self.monitor = config.workdir / "monitor.sock"
        self.boots: list[BootRecord] = []
        self._console_mark = 0  # console offset where the current boot's output begins
        self._boot_started = 0.0  # monotonic time of the current power-on (or guest restart)
        self._console_seen = (0, 0.0)  # console size last seen, and the monotonic time it last grew

    def __enter__(self) -> Vm:
        self.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    # --- power -----------------------------------------------------------------------------
    def start(self) -> BootRecord:
        """Make the throwaway disks and NVRAM, then power on."""
        if shutil.which("qemu-system-x86_64") is None:
            raise VmError("qemu-system-x86_64 not found: run `make setup`")
        cfg = self.config
        work = cfg.workdir
        work.mkdir(parents=True, exist_ok=True)
        for path in (self._overlay, self._ssd, self.console, work / "qemu.log"):
            path.unlink(missing_ok=True)
        subprocess.run(
            ["qemu-img", "create", "-q", "-f", "qcow2", "-b", str(cfg.image.resolve()),
             "-F", image_format(cfg.image), str(self._overlay)],
            check=True,
        )
        subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(self._ssd), f"{cfg.local_ssd_gib}G"],
                       check=True)
        for index in range(cfg.nvme_disks):
            self.blank_nvme_disk(index)
        shutil.copyfile(OVMF_VARS, self._vars)
        self.port = free_port()
        return self.power_on("power-on")

    @property
    def _overlay(self) -> Path:
        return self.config.workdir / "os-overlay.qcow2"

    @property
    def _ssd(self) -> Path:
        return self.config.workdir / "local-ssd.qcow2"

    def nvme_disk(self, index: int) -> Path:
        return self.config.workdir / f"nvme-{index}.qcow2"

    def blank_nvme_disk(self, index: int) -> None:
        """A new blank file for NVMe disk `index`, as Azure hands a deallocated VM's local
        NVMe disk back. Only while the VM is off (qemu holds the file while it runs)."""
        if self.proc is not None and self.proc.poll() is None:
            raise VmError("blank_nvme_disk: the VM is running; power it off first")
        path = self.nvme_disk(index)
        path.unlink(missing_ok=True)
        subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(path), f"{self.config.nvme_disk_gib}G"],
                       check=True)

    @property
    def _vars(self) -> Path:
        return self.config.workdir / "OVMF_VARS.fd"

    def _command(self) -> list[str]:
        cfg = self.config
        cmd = [
            "qemu-system-x86_64",
            "-machine", "q35", "-accel", "tcg,thread=multi", "-cpu", "max",
            "-smp", str(cfg.cpus), "-m", str(cfg.memory_mib),
            "-display", "none", "-no-user-config", "-nodefaults",
            # one console log across power cycles (a plain `-serial file:` truncates it)
            "-chardev", f"file,id=console,path={self.console},append=on", "-serial", "chardev:console",
            "-monitor", f"unix:{self.monitor},server,nowait",
            "-drive", f"if=pflash,format=raw,readonly=on,file={OVMF_CODE}",
            # the NVRAM copy persists across power cycles, as a VM's does
            "-drive", f"if=pflash,format=raw,file={self._vars}",
            # order matters: vda = OS disk, vdb = local SSD (the plan's device), vdc = seed
            "-drive", f"if=virtio,format=qcow2,file={self._overlay}",
            "-drive", f"if=virtio,format=qcow2,file={self._ssd}",
            "-drive", f"if=virtio,format=raw,file={cfg.seed}",
            *[arg for index in range(cfg.nvme_disks) for arg in (
                "-drive", f"if=none,id=nvme{index},format=qcow2,file={self.nvme_disk(index)}",
                "-device", f"nvme,serial=kn-nvme-{index},drive=nvme{index}",
            )],
            "-netdev", f"user,id=n0,hostfwd=tcp:127.0.0.1:{self.port}-:22",
            "-device", f"virtio-net-pci,netdev=n0,mac={NIC_MAC}",
            # Accelerated networking's stand-in: a second NIC with the *same MAC* on another
            # driver (vmxnet3: Debian's cloud kernel has it, not e1000), on an isolated
            # network. The image's networkd must leave it alone (node-image/verify/
            # test_network.py), as it must Azure's virtual function.
            "-netdev", "user,id=n1,restrict=on",
            "-device", f"vmxnet3,netdev=n1,mac={NIC_MAC}",
            "-device", "virtio-rng-pci",
        ]
        if self.reboot_mode == "power-cycle":
            # a guest reset ends qemu; the harness powers on a fresh one (module docstring)
            cmd.append("-no-reboot")
        return [*cmd, *self.config.extra_qemu_args]

    def _launch(self) -> None:
        if not _port_free(self.port):  # taken while the VM was off: SSH moves with it
            self.port = free_port()
        self.monitor.unlink(missing_ok=True)
        self._console_mark = self._console_size()
        self._boot_started = time.monotonic()
        self._console_seen = (self._console_mark, self._boot_started)
        pid_file = self.config.pid_file
        with (self.config.workdir / "qemu.log").open("ab") as log:
            self.proc = subprocess.Popen(self._command(), stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True,
                                         stdin=subprocess.DEVNULL if pid_file is not None else None)
        if pid_file is not None:
            # written whole (rename), so a reader never sees a half-written PID
            temporary = pid_file.with_name(pid_file.name + ".tmp")
            temporary.write_text(f"{self.proc.pid}\n")
            temporary.replace(pid_file)

    def power_on(self, how: str) -> BootRecord:
        record = BootRecord(how)
        self.boots.append(record)
        self._launch()
        return record

    def _kill(self) -> None:
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)

    def seconds_since_boot_began(self) -> float:
        """Since the current boot's power-on (or, for a reset in place, its restart line)."""
        return time.monotonic() - self._boot_started

    # --- console ---------------------------------------------------------------------------
    def _console_size(self) -> int:
        return self.console.stat().st_size if self.console.exists() else 0

    def _boot_output(self) -> bytes:
        """What the console received since the current boot began."""
        if not self.console.exists():
            return b""
        with self.console.open("rb") as f:
            f.seek(self._console_mark)
            return f.read()

    def _watch_console(self, record: BootRecord) -> None:
        """Note the milestones the console shows; handle a firmware that never printed."""
        output = self._boot_output()
        elapsed = time.monotonic() - self._boot_started
        if output and record.firmware_s is None:
            record.firmware_s = round(elapsed, 1)
        if record.handoff_s is None and HANDOFF_MARK in output:
            record.handoff_s = round(elapsed, 1)
        if record.kernel_s is None and KERNEL_MARK in output:
            record.kernel_s = round(elapsed, 1)
        self._watch_kernel(record, output)
        silence = self.config.firmware_silence_s
        if output or elapsed < silence:
            return
        what = f"no console output {silence:.0f} s after the {record.how} (the firmware never ran)"
        if record.how == "warm-reset" or record.firmware_retries >= 1:
            raise FirmwareHang(f"{what}\n{self.console_tail()}")
        record.firmware_retries += 1
        record.notes.append(what + "; powered on again")
        self.progress(f"{what}; powering on again")
        self._kill()
        self._launch()

    def _watch_kernel(self, record: BootRecord, output: bytes) -> None:
        """Power on once more if the kernel went silent after its banner and before init, or
        reported its timer stopped firing (only ever called before SSH answered)."""
        if record.how == "warm-reset" or record.kernel_s is None:
            return
        if TIMER_STALL_MARK in output:
            self._kernel_stalled(record, "the kernel reported its timer stopped firing (RCU: \"timer wakeup "
                                         "didn't happen\"; an emulator stall)")
            return
        now = time.monotonic()
        size = self._console_mark + len(output)
        if size != self._console_seen[0]:
            self._console_seen = (size, now)
            return
        silent = now - self._console_seen[1]
        if INIT_MARK in output or silent < self.config.kernel_silence_s:
            return
        self._kernel_stalled(record, f"the kernel printed nothing for {silent:.0f} s after its banner, before "
                                     f"init (an emulator stall: no image code had run)")

    def _kernel_stalled(self, record: BootRecord, what: str) -> None:
        if record.kernel_retries >= 1:
            raise KernelStall(f"{what}, again after a fresh power-on\n{self.console_tail()}")
        record.kernel_retries += 1
        record.kernel_s = record.handoff_s = record.firmware_s = None
        record.notes.append(what + "; powered on again")
        self.progress(f"{what}; powering on again")
        self._kill()
        self._launch()

    def console_tail(self, chars: int = 3000) -> str:
        if not self.console.exists():
            return "(no console output)"
        return "console tail:\n" + self.console.read_text(errors="replace")[-chars:]

    # --- SSH -------------------------------------------------------------------------------
    def connect(self, timeout: float = 10.0) -> paramiko.SSHClient:
        client = paramiko.SSHClient()
        client.set_missing_host_key_policy(paramiko.AutoAddPolicy())
        client.connect(
            "127.0.0.1", port=self.port, username=self.config.user, key_filename=str(self.config.key_file),
            timeout=timeout, banner_timeout=timeout, auth_timeout=timeout, allow_agent=False, look_for_keys=False,
        )
        return client

    def run(self, command: str, timeout: float = 300.0, connect_timeout: float = 10.0) -> tuple[int, str]:
        with contextlib.closing(self.connect(timeout=connect_timeout)) as client:
            _stdin, stdout, stderr = client.exec_command(command, timeout=timeout)
            out = stdout.read().decode(errors="replace") + stderr.read().decode(errors="replace")
            return stdout.channel.recv_exit_status(), out

    def boot_id(self) -> str:
        return self.run("cat /proc/sys/kernel/random/boot_id", timeout=15, connect_timeout=5)[1].strip()

    def wait_ssh(self, timeout: float = 420.0, old_boot: str | None = None) -> float:
        """Seconds until SSH accepted our key (in a boot other than `old_boot`).

        Raises VmError with the console tail on timeout, or when qemu exits: with
        `-no-reboot` a guest that resets or powers off by itself while booting ends qemu,
        and that is the image's failure, never retried.
        """
        record = self.boots[-1]
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            self._check_alive()
            self._watch_console(record)
            if record.kernel_s is None and self.seconds_since_boot_began() < KERNEL_WAIT_S:
                # no sshd before a kernel: watch the console closely (exact milestones)
                time.sleep(0.25)
                continue
            try:
                # short timeouts: while the guest boots, qemu's forward accepts the TCP
                # connection but no banner comes, and each attempt would wait that long
                boot = self.boot_id()
                if boot and boot != old_boot:
                    record.ssh_s = round(time.monotonic() - self._boot_started, 1)
                    return time.monotonic() - start
            except (OSError, paramiko.SSHException, EOFError):
                pass
            time.sleep(2)
        raise VmError(f"no SSH on 127.0.0.1:{self.port} {timeout:.0f} s after the {record.how}\n"
                      f"{self.console_tail()}")

    def wait_settled(self, timeout: float = 420.0) -> str:
        """Wait for cloud-init and systemd to finish starting; returns systemd's state."""
        t = int(timeout)
        self.run(f"sudo timeout {t} cloud-init status --wait >/dev/null 2>&1; true", timeout=timeout + 30)
        _rc, state = self.run(f"sudo timeout {t} systemctl is-system-running --wait", timeout=timeout + 30)
        return state.strip()

    def reboot(self, timeout: float = 420.0) -> BootRecord:
        """Reboot through systemd in the guest and wait for SSH in the new boot.

        power-cycle: the guest shuts down, qemu exits (`-no-reboot`), a fresh qemu starts on
        the same disks and NVRAM. warm-reset: qemu resets the machine in place (the bench's
        baseline); FirmwareHang if the firmware never prints again.
        """
        old_boot = self.boot_id()
        before = self._console_size()
        requested = time.monotonic()
        with contextlib.suppress(Exception):
            self.run("sudo systemctl reboot", timeout=20)
        if self.reboot_mode == "power-cycle":
            proc = self.proc
            assert proc is not None
            try:
                proc.wait(timeout=SHUTDOWN_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                raise VmError(f"the guest did not finish shutting down within {SHUTDOWN_TIMEOUT_S:.0f} s of "
                              f"`systemctl reboot`\n{self.console_tail()}") from None
            shutdown_s = round(time.monotonic() - requested, 1)
            record = self.power_on("power-cycle")
            record.shutdown_s = shutdown_s
        else:
            record = BootRecord("warm-reset")
            self.boots.append(record)
            self._await_restart_line(before, requested)
            record.shutdown_s = round(time.monotonic() - requested, 1)
        self.wait_ssh(timeout, old_boot=old_boot)
        return record

    def power_off(self) -> None:
        """Shut the guest down through systemd and wait for qemu to exit: the VM is off, its
        disks kept (an Azure deallocation, before `power_on("power-on")` starts it again)."""
        proc = self.proc
        assert proc is not None
        with contextlib.suppress(Exception):
            self.run("sudo systemctl poweroff", timeout=20)
        try:
            proc.wait(timeout=SHUTDOWN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise VmError(f"the guest did not power off within {SHUTDOWN_TIMEOUT_S:.0f} s of `systemctl poweroff`\n"
                          f"{self.console_tail()}") from None

    def _await_restart_line(self, offset: int, requested: float) -> None:
        """warm-reset: wait for the kernel's restart line; the new boot's output starts after it."""
        while time.monotonic() - requested < SHUTDOWN_TIMEOUT_S:
            self._check_alive()
            with self.console.open("rb") as f:
                f.seek(offset)
                tail = f.read()
            # the last restart line ("Restarting system" comes before "machine restart")
            at = max(tail.rfind(mark) for mark in RESTART_MARKS)
            end = tail.find(b"\n", at) if at >= 0 else -1
            if end >= 0:
                self._console_mark = offset + end + 1
                self._boot_started = time.monotonic()
                return
            time.sleep(0.2)
        raise VmError(f"no restart line on the console within {SHUTDOWN_TIMEOUT_S:.0f} s of `systemctl reboot`\n"
                      f"{self.console_tail()}")

    # --- lifecycle -------------------------------------------------------------------------
    def _check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            log = (self.config.workdir / "qemu.log").read_text(errors="replace")[-2000:]
            raise VmError(f"qemu exited ({self.proc.returncode}) while waiting for the guest: the guest reset or "
                          f"powered off by itself, or qemu failed\n{log}\n{self.console_tail()}")

    def monitor_command(self, command: str) -> None:
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(5)
            s.connect(str(self.monitor))
            s.sendall(command.encode() + b"\n")
            time.sleep(1)  # let qemu read the command before the socket closes

    def stop(self, timeout: float = 20.0) -> None:
        """Power off through the guest, then qemu's `quit`, then SIGKILL by PID.

        The overlay is thrown away, so a clean guest shutdown is a courtesy, not a need.
        (ACPI `system_powerdown` is not used: the cloud kernel flavour ignored it here.)
        """
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        if self.boots and self.boots[-1].ssh_s is not None:  # a guest that never answered cannot power off
            with contextlib.suppress(Exception):
                self.run("sudo systemctl poweroff", timeout=10)
            try:
                proc.wait(timeout=timeout)
                return
            except subprocess.TimeoutExpired:
                pass
        with contextlib.suppress(OSError):
            self.monitor_command("quit")
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._kill()


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        # as qemu binds its forward (SO_REUSEADDR): connections in TIME_WAIT do not block it
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True
