"""The image's local-disk script decides what to do from what the disks hold: run here with
the tools it calls (lsblk, mdadm, blkid, findmnt, mount, mkfs, wipefs, udevadm) replaced by
stubs that answer from a scenario and log every call. The real tools on real (qemu NVMe)
disks are tests/image/test_local_nvme.py; this covers the cases a VM would need many boots for.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kilonode.node.ship import LOCAL_DISK_SETUP

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

SCRIPT = LOCAL_DISK_SETUP.path
MODEL = "Microsoft NVMe Direct Disk"

# One stub for every tool (sh: a Python stub per call made this test slow): answers from the
# scenario's files beside it, logs its argv to calls.log.
STUB = r"""#!/bin/sh
d=$(dirname "$0"); tool=$(basename "$0"); echo "$tool $*" >> "$d/calls.log"
eval last=\${$#}
case "$tool" in
    lsblk) cat "$d/lsblk.out" ;;
    findmnt) [ -s "$d/findmnt.out" ] && cat "$d/findmnt.out" || exit 1 ;;
    mdadm)
        if [ "$1" = --examine ]; then
            f="$d/answers/examine/$(basename "$last")"; [ -s "$f" ] && cat "$f" || exit 1
        fi ;;
    blkid) f="$d/answers/blkid/$(basename "$last")"; [ -s "$f" ] && cat "$f" || exit 2 ;;
esac
exit 0
"""
TOOLS = ("lsblk", "findmnt", "mdadm", "blkid", "mount", "umount", "mkfs.ext4", "wipefs", "udevadm")


def disk(path: str, model: str = MODEL) -> dict[str, str]:
    return {"path": path, "type": "disk", "model": model.ljust(40)}


def member(uuid: str = "a:b:c:d", devices: int = 3) -> dict[str, str]:
    return {"MD_LEVEL": "raid0", "MD_DEVICES": str(devices), "MD_NAME": "node-0:kilonode-local", "MD_UUID": uuid}


def run(tmp_path: Path, scenario: dict[str, Any], count: int = 3, *flags: str) -> tuple[int, str, list[str]]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for tool in TOOLS:
        (bin_dir / tool).write_text(STUB)
        (bin_dir / tool).chmod(0o755)
    (bin_dir / "calls.log").unlink(missing_ok=True)
    (bin_dir / "lsblk.out").write_text(json.dumps({"blockdevices": scenario["disks"]}))
    (bin_dir / "findmnt.out").write_text(scenario.get("mounted", ""))
    superblocks = {k: "\n".join(f"{a}={b}" for a, b in v.items()) for k, v in scenario.get("superblocks", {}).items()}
    filesystems = {k: f"TYPE={v[0]}\nLABEL={v[1]}" for k, v in scenario.get("filesystems", {}).items()}
    shutil.rmtree(bin_dir / "answers", ignore_errors=True)
    for sub, answers in (("examine", superblocks), ("blkid", filesystems)):
        (bin_dir / "answers" / sub).mkdir(parents=True)
        for device, text in answers.items():
            (bin_dir / "answers" / sub / Path(device).name).write_text(text + "\n")
    config = tmp_path / "local-disk.json"
    config.write_text(json.dumps({
        "models": [MODEL, f"{MODEL} v2"], "count": count, "array": "kilonode-local", "filesystem": "ext4",
        "label": "kn-local-ssd", "mountPoint": str(tmp_path / "mnt"), "diskWaitSeconds": 0,
    }))
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    result = subprocess.run([sys.executable, str(SCRIPT), *flags, str(config)], capture_output=True, text=True, env=env,
                            timeout=60, check=False)
    log = bin_dir / "calls.log"
    calls = log.read_text().splitlines() if log.exists() else []
    return result.returncode, result.stdout + result.stderr, calls


def changes(calls: list[str]) -> list[str]:
    """The calls that change a disk (everything but the read-only queries)."""
    return [c for c in calls if c.split()[0] in ("mount", "umount", "mkfs.ext4", "wipefs")
            or c.startswith(("mdadm --create", "mdadm --assemble", "mdadm --stop", "mdadm --zero-superblock"))]


THREE = [disk("/dev/nvme0n1"), disk("/dev/nvme1n1"), disk("/dev/nvme2n1")]
# the OS disk on an NVMe-attached size: another model, never to be touched
OS_DISK = disk("/dev/nvme9n1", "MSFT NVMe Accelerator v1.0")


def test_blank_disks_become_one_raid0_array(tmp_path: Path) -> None:
    rc, out, calls = run(tmp_path, {"disks": [OS_DISK, *THREE]})
    assert rc == 0, out
    [create] = [c for c in calls if c.startswith("mdadm --create")]
    assert "--level=0 --raid-devices=3" in create and create.endswith("/dev/nvme0n1 /dev/nvme1n1 /dev/nvme2n1")
    assert "/dev/nvme0n1 has no RAID superblock (blank)" in out
    assert not any("nvme9n1" in c for c in changes(calls)), "the OS disk was touched"
    assert any(c.startswith("mkfs.ext4") and "kn-local-ssd" in c for c in calls)
    assert changes(calls)[-1].startswith("mount")


def test_an_intact_array_is_assembled_and_its_data_kept(tmp_path: Path) -> None:
    supers = {d["path"]: member() for d in THREE}
    rc, out, calls = run(tmp_path, {"disks": THREE, "superblocks": supers,
                                    "filesystems": {"/dev/md/kilonode-local": ["ext4", "kn-local-ssd"]}})
    assert rc == 0, out
    assert [c.split()[0:2] for c in changes(calls)] == [["mdadm", "--assemble"], ["mount", "-o"]]
    assert "data kept" in out


def test_a_blank_member_means_a_new_array(tmp_path: Path) -> None:
    supers = {"/dev/nvme0n1": member(), "/dev/nvme2n1": member()}
    rc, out, calls = run(tmp_path, {"disks": THREE, "superblocks": supers})
    assert rc == 0, out
    assert "recreating RAID 0 array kilonode-local" in out and "/dev/nvme1n1 has no RAID superblock (blank)" in out
    assert any(c.startswith("mdadm --create") for c in calls)


def test_a_member_count_mismatch_means_a_new_array(tmp_path: Path) -> None:
    supers = {d["path"]: member(devices=4) for d in THREE}
    rc, out, calls = run(tmp_path, {"disks": THREE, "superblocks": supers})
    assert rc == 0, out
    assert "belongs to a raid0 array of 4 devices, not raid0 of 3" in out
    assert any(c.startswith("mdadm --create") for c in calls)


def test_fewer_disks_than_the_size_has_are_refused_untouched(tmp_path: Path) -> None:
    rc, out, calls = run(tmp_path, {"disks": [OS_DISK, *THREE[:2]]})
    assert rc == 1
    assert "refusing: 2 local NVMe disk(s)" in out and "the VM size has 3" in out
    assert changes(calls) == []


def test_already_mounted_changes_nothing(tmp_path: Path) -> None:
    rc, out, calls = run(tmp_path, {"disks": THREE, "mounted": "/dev/md127"})
    assert rc == 0 and "nothing to do" in out
    assert changes(calls) == []


def test_one_disk_is_formatted_without_an_array_and_kept_when_formatted(tmp_path: Path) -> None:
    rc, out, calls = run(tmp_path, {"disks": THREE[:1]}, count=1)
    assert rc == 0, out
    assert not any(c.startswith("mdadm --create") for c in calls)
    assert any(c.startswith("mkfs.ext4") and c.endswith("/dev/nvme0n1") for c in calls)
    rc, out, calls = run(tmp_path, {"disks": THREE[:1], "filesystems": {"/dev/nvme0n1": ["ext4", "kn-local-ssd"]}},
                         count=1)
    assert rc == 0 and "data kept" in out
    assert [c.split()[0] for c in changes(calls)] == ["mount"]


def test_stop_unmounts_before_shutdown(tmp_path: Path) -> None:
    rc, out, calls = run(tmp_path, {"disks": THREE, "mounted": "/dev/md127"}, 3, "--stop")
    assert rc == 0 and "unmounted" in out, out
    assert changes(calls) == [f"umount --recursive {tmp_path / 'mnt'}"]
