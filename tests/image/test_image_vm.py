"""The node image end to end: build the `local` stack's pool image, verify it on a booted VM,
and show that verify fails, naming the check, for each seeded defect.

Cost control (CI: 90 minutes on 2 cores, qemu under TCG): one image is built per session
(the base root filesystem comes from the cache after the first build), one VM verifies the
clean image, and one more VM verifies a defective copy carrying all six defects at once
(one boot: `--no-reboot`): each defect is still caught by its own, separately named check.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from kilonode.cli.image import image_inputs
from kilonode.image import rootfs
from kilonode.image.build import BuildResult, build_image
from kilonode.image.disk import ImageFs
from kilonode.image.manifest import Manifest
from kilonode.image.recipe import BaseSpec, load_recipe
from kilonode.paths import EXAMPLE_STACKS_DIR, REPO_ROOT
from tests.conftest import module_workdir

pytestmark = pytest.mark.slow



@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Everything these tests build and boot, outside the source tree; the disk images go
    when the module is done, the logs and reports stay."""
    yield from module_workdir(tmp_path_factory, "image")

KILONODE = [sys.executable, "-m", "kilonode.cli"]


def kilonode(*args: str, timeout: float = 1800) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*KILONODE, *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout,
                          check=False)


@pytest.fixture(scope="module")
def built(work: Path) -> BuildResult:
    """The `local` stack's pool image, built once per session (base rootfs from the cache)."""
    return build_image(image_inputs("local", "cpu"), work / "clean", allow_incomplete=True)


@dataclass(frozen=True)
class VerifyRun:
    returncode: int
    output: str
    failed: list[str]  # the FAILED lines verify printed


@pytest.fixture(scope="module")
def clean_run(built: BuildResult, work: Path) -> VerifyRun:
    result = kilonode("image", "verify", str(built.raw), "--workdir", str(work / "verify-clean"),
                      "--junit", str(work / "clean.xml"))
    output = result.stdout + result.stderr
    return VerifyRun(result.returncode, output, [line for line in output.splitlines() if line.startswith("FAILED")])


def test_build_writes_raw_vhd_and_manifest(built: BuildResult) -> None:
    manifest = Manifest.load(built.manifest)
    assert built.raw.stat().st_size == 4096 << 20
    assert built.vhd.stat().st_size == built.raw.stat().st_size + 512
    assert manifest.data["packages"]["docker.io"].startswith("20.10")
    assert [i["image"] for i in manifest.preloaded_images] == ["registry.k8s.io/pause:3.10"]
    assert all(len(i["sha256"]) == 64 and i["image_id"].startswith("sha256:") for i in manifest.preloaded_images)
    assert {b["name"]: b["present"] for b in manifest.binaries} == {"kubelet": False, "cri-dockerd": False}
    assert "/etc/sysctl.d/90-kilonode.conf" in {a["path"] for a in manifest.artefacts}


def test_clean_image_passes_verify(clean_run: VerifyRun, work: Path) -> None:
    assert clean_run.returncode == 0, clean_run.output[-6000:]
    assert clean_run.failed == []
    # the three phases ran and did real work
    for phase in ("offline", "first-boot", "after-reboot"):
        assert f"  {phase}" in clean_run.output
    # the after-reboot checks ran in a second boot that came from a fresh power-on of the same disks
    boots = json.loads((work / "verify-clean" / "verify-summary.json").read_text())["boots"]
    assert [b["how"] for b in boots] == ["power-on", "power-cycle"]
    assert all(b["ssh_s"] is not None and b["kernel_s"] is not None for b in boots)
    assert boots[1]["shutdown_s"] is not None
    # the ARP lesson ran in the first boot (node-image/verify/test_arp_lesson.py): the kernel's
    # defaults overflow, the image's values hold 50,000 entries
    arp = json.loads((work / "verify-clean" / "verify-summary.json").read_text())["arp"]
    defaults_run, image_run = arp["runs"]
    assert defaults_run["failed"] > 0 and defaults_run["errors"].keys() == {"ENOBUFS"}
    assert any("neighbor table overflow" in line for line in defaults_run["log"])
    assert image_run["attempted"] == 50_000 and image_run["failed"] == 0
    assert arp["thresholds_after"] == arp["thresholds_before"]


def test_verify_leaves_the_image_pristine(built: BuildResult, clean_run: VerifyRun) -> None:
    """The VM booted an overlay: the image's machine-id is still empty, no host keys appeared."""
    assert clean_run.returncode == 0
    fs = ImageFs(built.raw)
    assert fs.read("/etc/machine-id") == b""
    assert not [n for n in fs.listdir("/etc/ssh") if n.startswith("ssh_host_")]


def stand_in_containerd(target: Path) -> Path:
    """containerd, its shim, ctr and runc as Debian packages them (taken from the cached
    containerd base), to stand in for the pinned 1.7 release that cannot be downloaded here:
    the image places them where the release goes and activates them the same way."""
    base = rootfs.base_rootfs(load_recipe(), BaseSpec("containerd"), lambda _line: None)
    target.mkdir(parents=True, exist_ok=True)
    members = ["./usr/bin/containerd", "./usr/bin/containerd-shim-runc-v2", "./usr/bin/ctr", "./usr/sbin/runc"]
    subprocess.run(["tar", "-C", str(target), "-xf", str(base.tarball), *members], check=True, timeout=300)
    for member in members:
        (target / member).rename(target / Path(member).name)
    return target


def test_containerd_pool_verifies_booting_its_vhd(work: Path) -> None:
    """The other runtime, booted from the fixed VHD that goes to Azure: the `local` stack
    with its pool switched to containerd (the shipped containerd pool names Azure's
    resource disk, which a local VM does not have). Its containerd and runc are given with
    --binaries, so the drop-in that runs /usr/local/bin/containerd instead of the package's
    is exercised on a booted node (suite: test_containerd_runs_the_binary_the_image_placed)."""
    stack = work / "stacks" / "Pulumi.local-containerd.yaml"
    stack.parent.mkdir(parents=True, exist_ok=True)
    text = (EXAMPLE_STACKS_DIR / "Pulumi.local.yaml").read_text()
    assert text.count("runtime: docker") == 1
    stack.write_text(text.replace("runtime: docker", "runtime: containerd"))
    given = stand_in_containerd(work / "containerd-binaries")
    built = build_image(image_inputs(str(stack), "cpu"), work / "containerd", binaries_dir=given,
                        allow_incomplete=True)
    manifest = Manifest.load(built.manifest)
    assert "containerd" in manifest.data["packages"] and "docker.io" not in manifest.data["packages"]
    placed = {b["name"]: b for b in manifest.data["other_binaries"]}
    assert placed["containerd"]["present"] and placed["runc"]["present"]
    dropin = "/etc/systemd/system/containerd.service.d/20-kilonode-pinned-containerd.conf"
    assert placed["containerd"]["activated"] == dropin
    assert "taken as given: the pin is the release archive's digest" in placed["containerd"]["origin"]
    result = kilonode("image", "verify", str(built.vhd), "--workdir", str(work / "verify-containerd"))
    assert result.returncode == 0, (result.stdout + result.stderr)[-6000:]
    # the check ran on the booted node, before and after the reboot, and was not skipped
    report = ET.parse(work / "verify-containerd" / "verify-report.xml")
    cases = [c for c in report.iter("testcase") if c.get("name") == "test_containerd_runs_the_binary_the_image_placed"]
    outcomes = [[child.tag for child in c if child.tag in ("failure", "error", "skipped")] for c in cases]
    assert outcomes == [[], []], [ET.tostring(c)[:400] for c in cases]


# --- seeded defects --------------------------------------------------------------------------

DEFECTS = {
    # defect -> the checks that must be named (every one of them)
    "wrong gc_thresh3": ["test_baked_sysctl_matches_plan[net.ipv4.neigh.default.gc_thresh3]"],
    "runtime root on the OS disk": [
        "test_runtime_root_is_the_plans_root",
        "test_runtime_root_on_local_ssd_mount",
    ],
    "a preloaded image missing": [
        "test_baked_preload_archive[registry.k8s.io/pause:3.10]",
        "test_preloaded_image_in_runtime_store[registry.k8s.io/pause:3.10]",
    ],
    "password SSH on": [
        "test_image_password_ssh_disabled",
        "test_sshd_refuses_passwords",
        "test_sshd_effective_config",
    ],
    "non-empty machine-id": ["test_image_machine_id_empty"],
    # the old networkd file, matching by name: it runs DHCP on the MAC twin as well
    "DHCP matched by name": ["test_networkd_configures_the_synthetic_nic_and_leaves_its_mac_twin_alone"],
}


def seed_defects(built: BuildResult, target: Path) -> Path:
    """A defective copy of the image (edited in place with debugfs) and a defective user-data."""
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    raw = target / built.raw.name
    subprocess.run(["cp", "--sparse=always", str(built.raw), str(raw)], check=True)
    shutil.copy(built.manifest, target / built.manifest.name)
    shutil.copy(built.user_data, target / built.user_data.name)
    (target / built.vhd.name).symlink_to(built.vhd.resolve())
    fs = ImageFs(raw)
    sysctl = (fs.read_text("/etc/sysctl.d/90-kilonode.conf") or "").replace(
        "gc_thresh3 = 100000", "gc_thresh3 = 1024"
    )
    assert "gc_thresh3 = 1024" in sysctl
    fs.write("/etc/sysctl.d/90-kilonode.conf", sysctl.encode())
    fs.write("/etc/machine-id", b"0123456789abcdef0123456789abcdef\n", 0o444)
    sshd = (fs.read_text("/etc/ssh/sshd_config.d/50-kilonode.conf") or "").replace(
        "PasswordAuthentication no", "PasswordAuthentication yes"
    )
    assert "PasswordAuthentication yes" in sshd
    fs.write("/etc/ssh/sshd_config.d/50-kilonode.conf", sshd.encode())
    fs.remove("/opt/kilonode/preload/registry.k8s.io_pause_3.10.tar")
    fs.write("/etc/systemd/network/80-kilonode-dhcp.network", b"[Match]\nName=eth* en*\n\n[Network]\nDHCP=yes\n")
    # Azure custom data (the seed): the runtime's root on the OS disk, and cloud-init told to
    # allow passwords (otherwise its own ssh_pwauth: false would still close them on the node)
    user_data = built.user_data.read_text()
    assert '"data-root": "/mnt/local-ssd/docker"' in user_data and "ssh_pwauth: false" in user_data
    bad = target / "defective.user-data"
    bad.write_text(
        user_data.replace('"data-root": "/mnt/local-ssd/docker"', '"data-root": "/var/lib/docker"').replace(
            "ssh_pwauth: false", "ssh_pwauth: true"
        )
    )
    return raw


@pytest.fixture(scope="module")
def defect_run(built: BuildResult, work: Path) -> VerifyRun:
    raw = seed_defects(built, work / "defective")
    result = kilonode(
        "image", "verify", str(raw), "--workdir", str(work / "verify-defective"),
        "--user-data", str(raw.parent / "defective.user-data"),
        # every seeded defect is named in the offline or first-boot phase; the reboot and
        # its persistence checks would add two minutes and no finding
        "--no-reboot",
    )
    output = result.stdout + result.stderr
    return VerifyRun(result.returncode, output, [line for line in output.splitlines() if line.startswith("FAILED")])


@pytest.mark.parametrize("defect", list(DEFECTS))
def test_seeded_defect_fails_verify_and_is_named(defect_run: VerifyRun, defect: str) -> None:
    assert defect_run.returncode == 1, defect_run.output[-4000:]
    for check in DEFECTS[defect]:
        assert any(check in line for line in defect_run.failed), (
            f"{defect}: verify did not name {check}; it named:\n" + "\n".join(defect_run.failed)
        )


def test_seeded_defects_are_not_reported_by_the_clean_image(clean_run: VerifyRun) -> None:
    """The checks that name the defects pass on the clean image: they fail because of the defects."""
    for checks in DEFECTS.values():
        for check in checks:
            assert not any(check in line for line in clean_run.failed)
