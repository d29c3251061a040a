"""The image file itself (read with debugfs, nothing booted): what was baked, and hygiene.

On a node, cloud-init rewrites the rendered files from user-data on first boot, so only the
image shows what the build baked: an edited line in the image is caught here.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
from pathlib import Path
from typing import Any

from kilonode.image import mirror
from kilonode.image.disk import ImageFs, gpt_partitions
from kilonode.image.manifest import Manifest
from kilonode.plan.model import NodePoolPlan, SysctlSetting


def test_image_machine_id_empty(image_fs: ImageFs) -> None:
    """systemd must make each node's own machine-id; a baked one is shared by every node."""
    content = image_fs.read("/etc/machine-id")
    assert content is not None, "/etc/machine-id missing (systemd then treats boots as first boots)"
    assert content == b"", f"/etc/machine-id is not empty: {content[:40]!r}"
    assert image_fs.read("/var/lib/dbus/machine-id") in (None, b"")


def test_image_has_no_ssh_host_keys(image_fs: ImageFs) -> None:
    keys = [n for n in image_fs.listdir("/etc/ssh") if n.startswith("ssh_host_")]
    assert keys == [], f"SSH host keys baked into the image: {keys}"


def first_sshd_value(image_fs: ImageFs, keyword: str) -> str | None:
    """sshd's rule: the first value read wins; the Include of sshd_config.d comes first."""
    main = image_fs.read_text("/etc/ssh/sshd_config") or ""
    lines: list[str] = []
    for line in main.splitlines():
        if line.strip().lower().startswith("include") and "sshd_config.d" in line:
            for name in sorted(image_fs.listdir("/etc/ssh/sshd_config.d")):
                if name.endswith(".conf"):
                    lines += (image_fs.read_text(f"/etc/ssh/sshd_config.d/{name}") or "").splitlines()
        else:
            lines.append(line)
    for line in lines:
        words = line.split("#", 1)[0].split()
        if len(words) >= 2 and words[0].lower() == keyword.lower():
            return words[1].lower()
    return None


def test_image_password_ssh_disabled(image_fs: ImageFs) -> None:
    assert first_sshd_value(image_fs, "PasswordAuthentication") == "no"
    assert first_sshd_value(image_fs, "KbdInteractiveAuthentication") in ("no", None)


def test_image_no_usable_passwords(image_fs: ImageFs) -> None:
    shadow = image_fs.read_text("/etc/shadow") or ""
    usable = [f.split(":")[0] for f in shadow.splitlines() if ":" in f and not re.match(r"^[!*]", f.split(":")[1])]
    assert usable == [], f"accounts with a password (or an empty one) in the image: {usable}"


def test_image_no_apt_sources_or_mirror(image_fs: ImageFs) -> None:
    listed = image_fs.listdir("/etc/apt/sources.list.d")
    assert not [n for n in listed if n.endswith((".list", ".sources"))], f"apt sources in the image: {listed}"
    assert image_fs.stat("/etc/apt/sources.list") is None
    assert image_fs.stat("/etc/apt/apt.conf.d/99mmdebstrap") is None, "mmdebstrap's apt options left in the image"
    assert image_fs.stat("/etc/hostname") is None, "the build host's hostname left in the image"
    hosts = mirror.mirror_hosts()
    for path in ("/etc/hosts", "/etc/resolv.conf", "/etc/cloud/cloud.cfg.d/90-kilonode.cfg"):
        text = (image_fs.read_text(path) or "").lower()
        named = any(h in text for h in hosts)  # a bool: the names never reach a report
        assert not named, f"{path} names the build host's mirror"


def test_baked_artefact_matches_build(image_fs: ImageFs, artefact: dict[str, Any]) -> None:
    data = image_fs.read(artefact["path"])
    assert data is not None, f"{artefact['path']} missing from the image"
    assert hashlib.sha256(data).hexdigest() == artefact["sha256"], (
        f"{artefact['path']} in the image differs from the {artefact['source']} output it was built from"
    )


def test_baked_sysctl_matches_plan(image_fs: ImageFs, sysctl: SysctlSetting) -> None:
    """Hand-parsed like systemd-sysctl: files in name order, the last assignment wins."""
    value = None
    for name in sorted(image_fs.listdir("/etc/sysctl.d")):
        if not name.endswith(".conf"):
            continue
        for line in (image_fs.read_text(f"/etc/sysctl.d/{name}") or "").splitlines():
            key, sep, val = line.split("#", 1)[0].partition("=")
            if sep and key.strip() == sysctl.name:
                value = val.strip()
    assert value == str(sysctl.value), f"{sysctl.name} = {value} in the image's sysctl.d, the plan says {sysctl.value}"


def test_baked_preload_archive(image_fs: ImageFs, preloaded: dict[str, Any]) -> None:
    data = image_fs.read(preloaded["path"])
    assert data is not None, f"{preloaded['image']}: archive {preloaded['path']} missing from the image"
    assert hashlib.sha256(data).hexdigest() == preloaded["sha256"], f"{preloaded['path']} differs from the build"


def test_baked_runtime_root_on_local_ssd(image_fs: ImageFs, pool: NodePoolPlan) -> None:
    if pool.runtime == "docker":
        import json

        config = json.loads(image_fs.read_text("/etc/docker/daemon.json") or "{}")
        root = config.get("data-root")
    else:
        text = image_fs.read_text("/etc/containerd/config.toml") or ""
        match = re.search(r'^root\s*=\s*"([^"]+)"', text, re.M)
        root = match.group(1) if match else None
    assert root == pool.runtime_root
    assert root.startswith(pool.local_disk.mount_point.rstrip("/") + "/")


def test_uefi_boot_loader_on_esp(image_fs: ImageFs) -> None:
    """GPT with an EFI system partition holding the removable-media boot path (Azure Gen2)."""
    esp = next(p for p in gpt_partitions(image_fs.disk) if p.type_guid == "C12A7328-F81F-11D2-BA4B-00A0C93EC93B")
    listing = subprocess.run(
        ["mdir", "-b", "-i", f"{image_fs.disk}@@{esp.start}", "::/EFI/BOOT"], capture_output=True, text=True,
        check=False,
    ).stdout
    assert "BOOTX64.EFI" in listing.upper(), f"no EFI/BOOT/BOOTX64.EFI on the ESP: {listing!r}"


def test_fixed_vhd_beside_image(manifest: Manifest) -> None:
    vhd = Path(manifest.path.parent / manifest.data["disk"]["vhd"])
    raw = Path(manifest.path.parent / manifest.data["disk"]["raw"])
    assert vhd.is_file(), f"{vhd} missing"
    with vhd.open("rb") as f:
        f.seek(-512, 2)
        footer = f.read(512)
    assert footer[:8] == b"conectix", "no VHD footer"
    assert int.from_bytes(footer[60:64], "big") == 2, "VHD is not fixed-size (Azure needs fixed)"
    if raw.is_file():
        assert vhd.stat().st_size == raw.stat().st_size + 512
    assert vhd.stat().st_size % (1 << 20) == 512, "VHD size must be a whole MiB plus the footer"
