"""`kilonode image verify`: boot the image and run the testinfra suite (node-image/verify).

Phases, each a pytest run with its own JUnit XML, merged into one report:

    offline      the image file itself, read with debugfs: what was baked (artefacts,
                 preloaded archives, sysctl values) and its hygiene (empty machine-id, no
                 host keys, no mirror, sshd config). A node rewrites some of these from
                 cloud-init on first boot, so only the image shows what was built.
    first-boot   a fresh VM (throwaway overlay, blank local SSD as /dev/vdb, the pool's
                 user-data as a NoCloud seed) or, with --host, any SSH host: kernel params,
                 services, runtime, preloaded images, files, hygiene.
    after-reboot the checks marked `persistent`, after the guest's `systemctl reboot` ended
                 its qemu (`-no-reboot`) and a fresh qemu powered on the same OS disk,
                 local SSD, seed and UEFI NVRAM: a power cycle, as an Azure restart
                 keeps the disks (see kilonode.image.qemu for why not a reset in place).

The verdict is the union: any failed or errored check fails the run, and is named.

Figures a check measures travel as <testsuite> properties of its phase's JUnit XML: the ARP
lesson's (suite/test_arp_lesson.py, kilonode.image.arp_lesson) become verify-summary.json's
`arp` section and a few progress lines.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from kilonode.image import arp_lesson
from kilonode.image.manifest import Manifest
from kilonode.image.qemu import Vm, VmConfig
from kilonode.image.seed import make_keypair, make_seed, meta_data
from kilonode.paths import VERIFY_SUITE_DIR

CONTEXT_ENV = "KILONODE_VERIFY_CONTEXT"
# The cloud-init default user of Debian's cloud.cfg; it gets passwordless sudo. Root
# login over SSH is closed in the image.
DEFAULT_USER = "debian"

Progress = Callable[[str], None]


@dataclass(frozen=True)
class SshTarget:
    user: str
    address: str
    port: int = 22
    key_file: Path | None = None

    @classmethod
    def parse(cls, spec: str, key_file: Path | None = None) -> SshTarget:
        """user@addr[:port]"""
        user, _, rest = spec.rpartition("@")
        address, _, port = rest.partition(":")
        return cls(user or DEFAULT_USER, address, int(port) if port else 22, key_file)


@dataclass
class VerifyReport:
    junit: Path
    failures: list[str] = field(default_factory=list)  # "phase: nodeid — message"
    counts: dict[str, dict[str, int]] = field(default_factory=dict)  # phase -> outcome -> n
    timings: dict[str, float] = field(default_factory=dict)
    boots: list[dict[str, object]] = field(default_factory=list)  # the VM's power-ons (qemu.BootRecord)
    arp: dict[str, object] | None = None  # the ARP lesson's figures (arp_lesson.Lesson's JSON), when it ran

    @property
    def passed(self) -> bool:
        return not self.failures and any(c.get("passed", 0) for c in self.counts.values())


def write_ssh_config(path: Path, target: SshTarget) -> Path:
    lines = [
        f"Host {target.address}",
        f"  HostName {target.address}",
        f"  Port {target.port}",
        f"  User {target.user}",
        # throwaway VMs get new host keys every boot; on loopback there is no one to spoof
        "  StrictHostKeyChecking no",
        "  UserKnownHostsFile /dev/null",
    ]
    if target.key_file:
        lines.append(f"  IdentityFile {target.key_file}")
    path.write_text("\n".join(lines) + "\n")
    return path


def run_phase(phase: str, *, manifest: Manifest, image: Path | None, target: SshTarget | None,
              workdir: Path, progress: Progress, disposable: bool = False) -> Path:
    """One pytest run of the suite; returns its JUnit XML. `disposable`: the target is the VM
    verify booted, so checks may change kernel-wide state for a moment (the ARP lesson)."""
    context = {
        "phase": phase,
        "manifest": str(manifest.path.resolve()),
        "image": str(image.resolve()) if image else None,
        "ssh": None,
    }
    if target is not None:
        ssh_config = write_ssh_config(workdir / "ssh_config", target)
        context["ssh"] = {
            "hostspec": f"paramiko://{target.user}@{target.address}:{target.port}?sudo=true",
            "ssh_config": str(ssh_config),
            "address": target.address,
            "port": target.port,
            "user": target.user,
            "key_file": str(target.key_file) if target.key_file else None,
            "disposable": disposable,
        }
    context_file = workdir / f"context-{phase}.json"
    context_file.write_text(json.dumps(context, indent=2))
    junit = workdir / f"junit-{phase}.xml"
    # The suite runs on its own: its own (empty) ini and rootdir in the workdir, no conftest
    # from above it, so it behaves the same from a checkout and from an installed wheel.
    ini = workdir / "pytest.ini"
    ini.write_text("[pytest]\n")
    cmd = [
        sys.executable, "-m", "pytest", str(VERIFY_SUITE_DIR), "-c", str(ini), "--rootdir", str(workdir),
        "--confcutdir", str(VERIFY_SUITE_DIR), "-q", "-rfEs", "-p", "no:cacheprovider",
        f"--junitxml={junit}", "-o", f"junit_suite_name={phase}", "-o", "junit_family=xunit2",
    ]
    env = {**os.environ, CONTEXT_ENV: str(context_file)}
    progress(f"{phase}: running checks ...")
    started = time.monotonic()
    with (workdir / f"pytest-{phase}.log").open("w") as log:
        subprocess.run(cmd, cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT, check=False, timeout=900)
    if not junit.exists():
        raise RuntimeError(f"{phase}: pytest wrote no report; see {workdir / f'pytest-{phase}.log'}")
    suite = ET.parse(junit).getroot()
    suite = suite if suite.tag == "testsuite" else suite[0]
    bad = int(suite.get("failures", 0)) + int(suite.get("errors", 0))
    progress(
        f"{phase}: {int(suite.get('tests', 0)) - int(suite.get('skipped', 0)) - bad} passed, {bad} failed, "
        f"{suite.get('skipped', 0)} skipped in {time.monotonic() - started:.0f} s"
    )
    return junit


def merge(junits: list[Path], out: Path, report: VerifyReport) -> None:
    """One <testsuites> with a <testsuite> per phase; collect failures and counts."""
    merged = ET.Element("testsuites", name="kilonode image verify")
    for junit in junits:
        root = ET.parse(junit).getroot()
        suites = [root] if root.tag == "testsuite" else list(root)
        for suite in suites:
            phase = suite.get("name", junit.stem)
            counts = report.counts.setdefault(phase, {})
            for case in suite.iter("testcase"):
                # the module alone: its package differs between a checkout and a wheel
                name = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name', '')}"
                outcome = "passed"
                for child in case:
                    if child.tag in ("failure", "error"):
                        outcome = "failed" if child.tag == "failure" else "error"
                        message = (child.get("message") or child.text or "").strip().splitlines()
                        report.failures.append(f"{phase}: {name} — {message[0][:300] if message else child.tag}")
                    elif child.tag == "skipped":
                        outcome = "skipped"
                counts[outcome] = counts.get(outcome, 0) + 1
            for prop in suite.iterfind("properties/property"):
                if prop.get("name") == arp_lesson.PROPERTY:
                    try:
                        report.arp = {"phase": phase, **json.loads(prop.get("value") or "")}
                    except (ValueError, TypeError):  # keep what came, say so below, judge nothing by it
                        report.arp = {"phase": phase, "unreadable": prop.get("value")}
            merged.append(suite)
    ET.ElementTree(merged).write(out, encoding="utf-8", xml_declaration=True)


def arp_summary_lines(report: VerifyReport) -> list[str]:
    """The ARP lesson's figures in words, or why there are none to word."""
    if report.arp is None:
        return []
    try:
        lines = arp_lesson.summary_lines(arp_lesson.Lesson.from_json(report.arp))
        if "check_s" in report.arp:
            lines[-1] += f" ({report.arp['check_s']} s as a check, SSH included)"
        return lines
    except (KeyError, TypeError, ValueError) as error:  # a half-written record must not hide the verdict
        return [f"ARP lesson: figures unreadable ({type(error).__name__}: {error}); see verify-summary.json"]


def write_summary(report: VerifyReport, path: Path) -> None:
    path.write_text(
        json.dumps(
            {
                "passed": report.passed,
                "failures": report.failures,
                "counts": report.counts,
                "timings_s": report.timings,
                "boots": report.boots,
                "arp": report.arp,
            },
            indent=2,
        )
        + "\n"
    )


def _vm_config(image: Path, manifest: Manifest, workdir: Path, user_data: str | None) -> VmConfig:
    """The throwaway VM's configuration: a fresh key pair, the seed with the pool's user-data (or
    `user_data`), and the pool's blank local NVMe disks."""
    key_file, public_key = make_keypair(workdir)
    seed = make_seed(
        workdir / "seed.img",
        user_data if user_data is not None else manifest.user_data_path.read_text(),
        meta_data(public_key, f"{manifest.data['name']}-verify"),
    )
    # a pool whose plan chose local NVMe disks gets that many blank ones (qemu's model: only a
    # plan naming it, as tests/image/test_local_nvme.py's does, finds them)
    storage = manifest.pool.local_storage if manifest.pool else None
    nvme = storage.nvme_count if storage and storage.kind != "device" else 0
    return VmConfig(image=image, seed=seed, workdir=workdir, user=DEFAULT_USER, key_file=key_file,
                    nvme_disks=nvme)


def _checks_in_vm(vm: Vm, manifest: Manifest, workdir: Path, report: VerifyReport, reboot: bool,
                  progress: Progress) -> list[Path]:
    """The guest phases in the booted `vm`: first boot, then (`reboot`) after a reboot; their
    timings go into `report`. Returns the phases' JUnit files."""
    key_file = vm.config.key_file
    junits: list[Path] = []
    t = time.monotonic()
    vm.wait_ssh()
    report.timings["boot to SSH"] = round(time.monotonic() - t, 1)
    state = vm.wait_settled()
    report.timings["boot to settled"] = round(time.monotonic() - t, 1)
    progress(f"VM up: SSH after {report.timings['boot to SSH']} s, systemd '{state}' after "
             f"{report.timings['boot to settled']} s")
    target = SshTarget(DEFAULT_USER, "127.0.0.1", vm.port, key_file)
    t = time.monotonic()
    junits.append(run_phase("first-boot", manifest=manifest, image=None, target=target, workdir=workdir,
                            progress=progress, disposable=True))
    report.timings["first-boot checks"] = round(time.monotonic() - t, 1)
    if reboot:
        progress("rebooting the VM (guest `systemctl reboot`, then a fresh power-on) ...")
        t2 = time.monotonic()
        record = vm.reboot()
        vm.wait_settled()
        report.timings["reboot to settled"] = round(time.monotonic() - t2, 1)
        progress(f"VM back after the reboot: shut down in {record.shutdown_s} s, firmware after "
                 f"{record.firmware_s} s, SSH after {record.ssh_s} s of the power-on, settled "
                 f"{report.timings['reboot to settled']} s after the request")
        for note in record.notes:
            progress(f"note: {note}")
        target = SshTarget(DEFAULT_USER, "127.0.0.1", vm.port, key_file)
        t = time.monotonic()
        junits.append(run_phase("after-reboot", manifest=manifest, image=None, target=target,
                                workdir=workdir, progress=progress, disposable=True))
        report.timings["after-reboot checks"] = round(time.monotonic() - t, 1)
    return junits


def verify_image(
    image: Path,
    *,
    workdir: Path,
    host: SshTarget | None = None,
    reboot: bool = True,
    user_data: str | None = None,
    progress: Progress = lambda _line: None,
    boot: bool = True,
) -> VerifyReport:
    """Verify `image` (raw or VHD, with its manifest beside it). See the module docstring.

    `user_data` replaces the pool's rendered user-data in the seed (the defect tests use it);
    `host` runs the guest phases against that SSH host instead of booting a VM; `boot=False`
    (and no host) runs the offline phase alone: a GPU image's driver, modules and runtime
    configuration are read from the file, where a VM without a GPU could not show them.
    """
    manifest = Manifest.for_image(image)
    if manifest.data.get("pool") is None:
        # its VMs need their member's static address, peers and certificates: tests/image/
        # test_role_images.py reads what such an image holds, test_etcd_real runs its flags
        raise ValueError(
            f"{image} is the {manifest.data.get('role')} image: verify boots node pool images (a pool's "
            "nodes are alike and its user-data is the image's); a role image is checked offline by "
            "tests/image/test_role_images.py"
        )
    workdir = workdir.resolve()  # the suite runs with the workdir as its working directory
    workdir.mkdir(parents=True, exist_ok=True)
    report = VerifyReport(junit=workdir / "verify-report.xml")
    junits: list[Path] = []
    start = time.monotonic()
    if image.is_file():
        junits.append(run_phase("offline", manifest=manifest, image=image, target=None, workdir=workdir,
                                progress=progress))
        report.timings["offline"] = round(time.monotonic() - start, 1)
    if host is not None:
        junits.append(run_phase("first-boot", manifest=manifest, image=None, target=host, workdir=workdir,
                                progress=progress))
        report.timings["host checks"] = round(time.monotonic() - start - report.timings.get("offline", 0), 1)
    elif not boot:
        if not image.is_file():
            raise FileNotFoundError(f"{image} not found: the offline checks read the image file")
    else:
        config = _vm_config(image, manifest, workdir, user_data)
        progress("booting a VM from a throwaway overlay (qemu, TCG, UEFI) ...")
        with Vm(config, progress=progress) as vm:
            junits.extend(_checks_in_vm(vm, manifest, workdir, report, reboot, progress))
            progress("stopping the VM ...")
            report.boots = [asdict(record) for record in vm.boots]
        progress("VM stopped")
    merge(junits, report.junit, report)
    for line in arp_summary_lines(report):
        progress(line)
    report.timings["total"] = round(time.monotonic() - start, 1)
    write_summary(report, workdir / "verify-summary.json")
    return report
