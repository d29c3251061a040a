"""The local NVMe disks on a booted node: RAID 0 made at first boot, kept over a power cycle,
made anew after a disk comes back blank (an Azure deallocation), untouched by a second run.

One VM, two boots under TCG (each costs a minute or more): the first boot makes the array,
a power cycle assembles it again with the data kept. The blank disk is then made in the
running guest, with what a boot would find reproduced: the runtime and the unit stopped
(the unit's ExecStop unmounts and stops the array, as at shutdown), the disk's RAID
superblock wiped, and the leftover members handed to `mdadm --incremental` (what udev does
with them at boot: an inactive array of the two survivors); then the unit runs again. The
boot-time ordering (unit before the runtime) is what the two real boots show. The image is
the `local` stack's docker pool built from the cached base, with a plan made here: the
pool's local storage is three NVMe disks of qemu's model ("QEMU NVMe Ctrl", what qemu's
NVMe controller reports as its model number), so the rendered config, the script and the
unit the node runs are exactly those an ND H100 v5 pool gets, with another selector.
"""

from __future__ import annotations

import json
import shlex
import time
from pathlib import Path

import pytest

from kilonode.cli.common import load_and_plan
from kilonode.config.load import project_root
from kilonode.image.build import ImageInputs, build_image
from kilonode.image.qemu import Vm, VmConfig
from kilonode.image.seed import make_keypair, make_seed, meta_data
from kilonode.image.verify import DEFAULT_USER
from kilonode.node.ship import LOCAL_DISK_SETUP
from kilonode.plan.model import LocalStoragePlan
from kilonode.render import render_cluster
from kilonode.render.pool import LOCAL_DISK_CONFIG

pytestmark = pytest.mark.slow

# hw/nvme/ctrl.c (qemu 7.2): the Identify Controller model number, space padded
QEMU_NVME_MODEL = "QEMU NVMe Ctrl"
DISKS = 3
MOUNT = "/mnt/local-ssd"
UNIT = "kilonode-local-disk.service"


def nvme_image(work: Path):  # type: ignore[no-untyped-def]
    stack, plan = load_and_plan("local")
    [pool] = plan.node_pools
    storage = LocalStoragePlan(
        kind="nvme-raid0", mount_point=MOUNT, filesystem="ext4", device=None,
        nvme_models=(QEMU_NVME_MODEL,), nvme_count=DISKS, reason="test: qemu's NVMe disks",
    )
    pool = pool.model_copy(update={"local_storage": storage})
    plan = plan.model_copy(update={"node_pools": (pool,)})
    files = render_cluster(plan)[f"pool-{pool.name}"]
    config = json.loads(files[LOCAL_DISK_CONFIG].content)
    assert config["models"] == [QEMU_NVME_MODEL] and config["count"] == DISKS
    inputs = ImageInputs(stack=stack, plan=plan, pool=pool, files=files,
                         project_dir=project_root(stack.file.parent) or stack.file.parent)
    return build_image(inputs, work / "image", allow_incomplete=True)


class Node:
    def __init__(self, vm: Vm) -> None:
        self.vm = vm

    def sh(self, command: str, ok: bool = True) -> str:
        rc, out = self.vm.run(f"sudo sh -c {shlex.quote(command)}", timeout=300)
        if ok:
            assert rc == 0, f"{command}: exit {rc}\n{out}"
        return out

    def array(self) -> dict[str, str]:
        """The md array mounted at MOUNT: its device, UUID, level, member count, members."""
        source = self.sh(f"findmnt -n -o SOURCE --mountpoint {MOUNT}").strip()
        assert source.startswith("/dev/md"), f"{MOUNT} is mounted from {source!r}, not an md array"
        detail = self.sh(f"mdadm --detail --export {source}")
        values = dict(line.split("=", 1) for line in detail.splitlines() if "=" in line)
        values["source"] = source
        values["members"] = " ".join(sorted(v for k, v in values.items() if k.startswith("MD_DEVICE_") and
                                            k.endswith("_DEV")))
        return values

    def serial_to_path(self) -> dict[str, str]:
        found = json.loads(self.sh("lsblk --json --nodeps -o PATH,SERIAL,MODEL"))["blockdevices"]
        return {d["serial"]: d["path"] for d in found if (d.get("model") or "").strip() == QEMU_NVME_MODEL}

    def wait_runtime(self) -> None:
        """A boot after the first: cloud-init has nothing left to do, so wait only for what
        this test reads (the unit, then docker ordered after it), not for the whole system."""
        # one unit per is-active: with several it succeeds when any one is active
        self.sh(f"timeout 300 sh -c 'until systemctl is-active -q {UNIT} && systemctl is-active -q docker.service;"
                " do sleep 1; done'")

    def journal(self) -> str:
        return self.sh(f"journalctl -b -u {UNIT} --no-pager -o cat")


def check_array_serves_the_runtime(node: Node, paths: set[str]) -> dict[str, str]:
    array = node.array()
    assert array["MD_LEVEL"] == "raid0" and array["MD_DEVICES"] == str(DISKS), array
    assert set(array["members"].split()) == paths, array
    mdstat = node.sh("cat /proc/mdstat")
    assert "active raid0" in mdstat and all(Path(p).name in mdstat for p in paths), mdstat
    assert node.sh(f"systemctl is-active {UNIT}").strip() == "active"
    # the runtime's root is on the array (docker started after the unit, on the mount)
    assert node.sh("docker info --format '{{.DockerRootDir}}'").strip() == f"{MOUNT}/docker"
    assert node.sh(f"findmnt -n -o SOURCE -T {MOUNT}/docker").strip() == array["source"]
    return array


def test_nvme_raid0_first_boot_reboot_and_blank_disk(tmp_path: Path) -> None:
    started = time.monotonic()
    built = nvme_image(tmp_path)
    key_file, public_key = make_keypair(tmp_path)
    seed = make_seed(tmp_path / "seed.img", built.user_data.read_text(), meta_data(public_key, "nvme-test"))
    config = VmConfig(image=built.raw, seed=seed, workdir=tmp_path / "vm", user=DEFAULT_USER, key_file=key_file,
                      nvme_disks=DISKS)
    timings: dict[str, float] = {"build": round(time.monotonic() - started, 1)}
    with Vm(config) as vm:
        node = Node(vm)
        # --- first boot: three blank disks -> one RAID 0 array, formatted, the runtime on it
        vm.wait_ssh()
        vm.wait_settled()
        timings["first boot"] = round(time.monotonic() - started - sum(timings.values()), 1)
        by_serial = node.serial_to_path()
        assert len(by_serial) == DISKS, by_serial
        paths = set(by_serial.values())
        first = check_array_serves_the_runtime(node, paths)
        assert "created" in node.journal() and "a new array" in node.journal()
        node.sh(f"echo kept > {MOUNT}/marker && sync")
        # a second run changes nothing: same array, same filesystem, the marker still there
        fs_uuid = node.sh(f"blkid -s UUID -o value {first['source']}").strip()
        node.sh(f"systemctl restart {UNIT}")
        assert node.array()["MD_UUID"] == first["MD_UUID"]
        assert node.sh(f"blkid -s UUID -o value {first['source']}").strip() == fs_uuid
        assert node.sh(f"cat {MOUNT}/marker").strip() == "kept"
        assert any("already mounted" in line for line in node.journal().splitlines()[-4:])
        # fewer disks than the config expects: refused, nothing touched, said plainly
        expect_four = {**json.loads(node.sh(f"cat /{LOCAL_DISK_CONFIG}")), "count": 4, "diskWaitSeconds": 3,
                       "mountPoint": "/mnt/elsewhere"}
        node.sh(f"echo {shlex.quote(json.dumps(expect_four))} > /tmp/four.json")
        refused = node.sh(f"{LOCAL_DISK_SETUP.machine_path} /tmp/four.json; echo rc=$?", ok=False)
        assert "refusing: 3 local NVMe disk(s)" in refused and "the VM size has 4" in refused, refused
        assert "rc=1" in refused.splitlines()
        assert node.array()["MD_UUID"] == first["MD_UUID"]

        # --- power cycle: the same array assembled again, data kept
        vm.reboot()
        node.wait_runtime()
        timings["power cycle"] = round(time.monotonic() - started - sum(timings.values()), 1)
        again = check_array_serves_the_runtime(node, paths)
        assert again["MD_UUID"] == first["MD_UUID"]
        assert node.sh(f"cat {MOUNT}/marker").strip() == "kept"
        assert "data kept" in node.journal()

        # --- deallocation: one disk comes back blank -> array and filesystem made anew
        blank = by_serial["kn-nvme-1"]
        survivors = sorted(paths - {blank})
        node.sh(f"systemctl stop docker.socket docker.service {UNIT}")
        assert node.sh(f"findmnt -n --mountpoint {MOUNT}; echo $?", ok=False).strip() == "1"
        node.sh(f"wipefs --all --quiet {blank}")
        assert "MD_UUID" not in node.sh(f"mdadm --examine --export {blank}", ok=False)
        for disk in survivors:
            node.sh(f"mdadm --incremental {disk}", ok=False)
        assert "inactive" in node.sh("cat /proc/mdstat"), "the survivors did not form an inactive array"
        node.sh(f"systemctl start {UNIT} docker.service")
        timings["blank disk"] = round(time.monotonic() - started - sum(timings.values()), 1)
        third = check_array_serves_the_runtime(node, paths)
        assert third["MD_UUID"] != first["MD_UUID"]
        assert node.sh(f"test -e {MOUNT}/marker; echo $?", ok=False).strip() == "1"
        journal = node.journal()
        assert "recreating RAID 0 array kilonode-local over" in journal, journal
        assert f"{blank} has no RAID superblock (blank)" in journal, journal
        # and, once more, a second run changes nothing
        node.sh(f"systemctl restart {UNIT}")
        assert node.array()["MD_UUID"] == third["MD_UUID"]
        print("failed units:", node.sh("systemctl --failed --no-legend --plain", ok=False).strip() or "none")
    timings["total"] = round(time.monotonic() - started, 1)
    print(f"timings (s): {timings}")
