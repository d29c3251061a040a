"""A throwaway qemu VM booting a built image under UEFI, reachable over SSH on loopback.

Measured on these machines (docs/local-substrate.md): KVM here is paravirtual and hangs a
stock kernel, so qemu runs under TCG. The VM boots a qcow2 overlay over the image (the
image stays pristine), has a blank second disk standing in for the instance's local SSD
(/dev/vdb, as in the `local` stack) and the NoCloud seed as a third disk. Its SSH port is
forwarded to 127.0.0.1 only. Every wait is bounded; the VM is stopped by its PID.
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
from dataclasses import dataclass
from pathlib import Path

import paramiko

# paramiko logs every refused early connection (qemu's port forward accepts before sshd
# listens) as a traceback; the waits below handle those, so keep the log quiet.
logging.getLogger("paramiko").setLevel(logging.CRITICAL)

OVMF_CODE = Path("/usr/share/OVMF/OVMF_CODE_4M.fd")
OVMF_VARS = Path("/usr/share/OVMF/OVMF_VARS_4M.fd")


class VmError(RuntimeError):
    pass


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


class Vm:
    """Start with `with Vm(config) as vm:`; the VM is always stopped on exit."""

    def __init__(self, config: VmConfig) -> None:
        self.config = config
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.console = config.workdir / "console.log"

    def __enter__(self) -> Vm:
        self.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def start(self) -> None:
        if shutil.which("qemu-system-x86_64") is None:
            raise VmError("qemu-system-x86_64 not found: run `make setup`")
        cfg = self.config
        work = cfg.workdir
        work.mkdir(parents=True, exist_ok=True)
        overlay = work / "os-overlay.qcow2"
        ssd = work / "local-ssd.qcow2"
        vars_fd = work / "OVMF_VARS.fd"
        for path in (overlay, ssd):
            path.unlink(missing_ok=True)
        subprocess.run(
            ["qemu-img", "create", "-q", "-f", "qcow2", "-b", str(cfg.image.resolve()),
             "-F", image_format(cfg.image), str(overlay)],
            check=True,
        )
        subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(ssd), f"{cfg.local_ssd_gib}G"], check=True)
        shutil.copyfile(OVMF_VARS, vars_fd)
        self.port = free_port()
        self.monitor = work / "monitor.sock"
        self.monitor.unlink(missing_ok=True)
        cmd = [
            "qemu-system-x86_64",
            "-machine", "q35", "-accel", "tcg,thread=multi", "-cpu", "max",
            "-smp", str(cfg.cpus), "-m", str(cfg.memory_mib),
            "-display", "none", "-no-user-config", "-nodefaults",
            "-serial", f"file:{self.console}",
            "-monitor", f"unix:{self.monitor},server,nowait",
            "-drive", f"if=pflash,format=raw,readonly=on,file={OVMF_CODE}",
            "-drive", f"if=pflash,format=raw,file={vars_fd}",
            # order matters: vda = OS disk, vdb = local SSD (the plan's device), vdc = seed
            "-drive", f"if=virtio,format=qcow2,file={overlay}",
            "-drive", f"if=virtio,format=qcow2,file={ssd}",
            "-drive", f"if=virtio,format=raw,file={cfg.seed}",
            "-netdev", f"user,id=n0,hostfwd=tcp:127.0.0.1:{self.port}-:22",
            "-device", "virtio-net-pci,netdev=n0",
            "-device", "virtio-rng-pci",
        ]
        log = (work / "qemu.log").open("wb")
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

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

    def wait_ssh(self, timeout: float = 420.0) -> float:
        """Seconds until SSH accepted our key; raises VmError (with the console tail) on timeout."""
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            self._check_alive()
            try:
                # short timeouts: while the guest boots, qemu's forward accepts the TCP
                # connection but no banner comes, and each attempt would wait that long
                with contextlib.closing(self.connect(timeout=5)):
                    return time.monotonic() - start
            except (OSError, paramiko.SSHException, EOFError):
                time.sleep(2)
        raise VmError(f"no SSH on 127.0.0.1:{self.port} after {timeout:.0f} s\n{self.console_tail()}")

    def wait_settled(self, timeout: float = 420.0) -> str:
        """Wait for cloud-init and systemd to finish starting; returns systemd's state."""
        t = int(timeout)
        self.run(f"sudo timeout {t} cloud-init status --wait >/dev/null 2>&1; true", timeout=timeout + 30)
        _rc, state = self.run(f"sudo timeout {t} systemctl is-system-running --wait", timeout=timeout + 30)
        return state.strip()

    def reboot(self, timeout: float = 420.0) -> float:
        """Reboot through systemd and wait for SSH again (after it has gone away)."""
        old_boot = self.run("cat /proc/sys/kernel/random/boot_id")[1].strip()
        with contextlib.suppress(Exception):
            self.run("sudo systemctl reboot", timeout=20)
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            self._check_alive()
            try:
                rc, boot = self.run("cat /proc/sys/kernel/random/boot_id", timeout=15, connect_timeout=5)
                if rc == 0 and boot.strip() and boot.strip() != old_boot:
                    return time.monotonic() - start
            except (OSError, paramiko.SSHException, EOFError):
                pass
            time.sleep(1)
        raise VmError(f"VM did not come back from reboot in {timeout:.0f} s\n{self.console_tail()}")

    # --- lifecycle -------------------------------------------------------------------------
    def _check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            log = (self.config.workdir / "qemu.log").read_text(errors="replace")[-2000:]
            raise VmError(f"qemu exited ({self.proc.returncode}): {log}\n{self.console_tail()}")

    def console_tail(self, chars: int = 3000) -> str:
        if not self.console.exists():
            return "(no console output)"
        return "console tail:\n" + self.console.read_text(errors="replace")[-chars:]

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
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
