#!/usr/bin/python3
"""Make the node's local NVMe disks its local SSD: one RAID 0 array over all of them (or the
one disk), formatted and mounted where the runtime's root lives. Run at every boot by
kilonode-local-disk.service; reads the JSON file the pool's cloud-init writes
(/etc/kilonode/local-disk.json, rendered by kilonode.render.pool.local_disk_config):

    models      NVMe controller model strings that select the disks (Azure: "Microsoft
                NVMe Direct Disk"); no other disk is ever touched
    count       how many such disks the VM size has: fewer or more, and nothing is done
    array       the md array's name (several disks)
    filesystem  ext4 or xfs; label: the filesystem label; mountPoint: where it is mounted
    diskWaitSeconds  how long to wait for the disks to appear (they probe asynchronously)

Each boot, in order: the array already mounted -> nothing to do. The disks still form the
array (every one a member of the same RAID 0 array of `count` devices) -> assemble it (if
udev has not) and mount it, data kept. Anything else (Azure hands local NVMe disks back
blank after a deallocation, so a blank member or a member count that does not match) ->
RAID 0 has lost its data anyway: stop what the kernel assembled from the leftovers, wipe
the expected disks, create the array and the filesystem anew, and mount; every step says
why in the journal. Exit status 1, with the reason, when the disks are not all there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

CONFIG = Path("/etc/kilonode/local-disk.json")


def log(message: str) -> None:
    print(message, flush=True)


def run(*cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if check and result.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({result.returncode}): {(result.stderr or result.stdout).strip()}")
    return result


def nvme_disks(models: list[str]) -> list[str]:
    """Whole NVMe disks whose controller's model is one of `models`, as /dev paths, sorted."""
    found = json.loads(run("lsblk", "--json", "--nodeps", "--output", "PATH,TYPE,MODEL").stdout)
    return sorted(
        d["path"] for d in found["blockdevices"]
        if d["type"] == "disk" and os.path.basename(d["path"]).startswith("nvme")
        and (d.get("model") or "").strip() in models
    )


def wait_for_disks(models: list[str], count: int, wait_s: float) -> list[str]:
    deadline = time.monotonic() + wait_s
    while True:
        run("udevadm", "settle", "--timeout=30", check=False)
        disks = nvme_disks(models)
        if len(disks) >= count or time.monotonic() > deadline:
            return disks
        time.sleep(2)


def examine(disk: str) -> dict[str, str]:
    """The disk's md superblock (mdadm --examine --export), {} when it has none."""
    result = run("mdadm", "--examine", "--export", disk, check=False)
    if result.returncode != 0:
        return {}
    return dict(line.split("=", 1) for line in result.stdout.splitlines() if "=" in line)


def active_arrays(disks: list[str]) -> dict[str, set[str]]:
    """md devices the kernel holds with any of `disks` in them: /dev/mdN -> member paths."""
    names = {os.path.basename(d): d for d in disks}
    arrays: dict[str, set[str]] = {}
    for md in Path("/sys/block").glob("md*"):
        members = {p.name for p in (md / "slaves").iterdir()} if (md / "slaves").is_dir() else set()
        if members & set(names):
            arrays[f"/dev/{md.name}"] = members
    return arrays


def why_not_the_array(disks: list[str], count: int, name: str) -> str | None:
    """None when every disk is a member of one RAID 0 array of `count` devices named `name`;
    otherwise what is wrong, for the journal."""
    supers = {d: examine(d) for d in disks}
    reasons = []
    for disk, sb in supers.items():
        if not sb:
            reasons.append(f"{disk} has no RAID superblock (blank)")
        elif sb.get("MD_LEVEL") != "raid0" or sb.get("MD_DEVICES") != str(count):
            reasons.append(f"{disk} belongs to a {sb.get('MD_LEVEL')} array of {sb.get('MD_DEVICES')} devices, "
                           f"not raid0 of {count}")
        elif sb.get("MD_NAME", "").rpartition(":")[2] != name:
            reasons.append(f"{disk} belongs to array {sb.get('MD_NAME')!r}, not {name!r}")
    uuids = {sb.get("MD_UUID") for sb in supers.values() if sb}
    if not reasons and len(uuids) != 1:
        reasons.append(f"the disks belong to {len(uuids)} different arrays")
    return "; ".join(reasons) or None


def filesystem_of(device: str) -> tuple[str, str]:
    """(TYPE, LABEL) blkid reports, empty strings for none."""
    out = run("blkid", "--probe", "--output", "export", device, check=False).stdout
    values = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    return values.get("TYPE", ""), values.get("LABEL", "")


def make_filesystem(device: str, filesystem: str, label: str, why: str) -> None:
    log(f"creating {filesystem} (label {label}) on {device}: {why}")
    # Azure hands the disks over blank: skip the whole-device discard, which takes minutes on TiBs
    options = ["-E", "nodiscard", "-F"] if filesystem == "ext4" else ["-K", "-f"]
    run(f"mkfs.{filesystem}", *options, "-L", label, device)


def mount(device: str, mount_point: str) -> None:
    Path(mount_point).mkdir(parents=True, exist_ok=True)
    run("mount", "-o", "defaults,noatime", device, mount_point)
    log(f"mounted {device} at {mount_point}")


def mounted_source(mount_point: str) -> str | None:
    result = run("findmnt", "--noheadings", "--output", "SOURCE", "--mountpoint", mount_point, check=False)
    return result.stdout.strip() or None


def single_disk(disk: str, cfg: dict[str, object]) -> None:
    fstype, label = filesystem_of(disk)
    if (fstype, label) != (cfg["filesystem"], cfg["label"]):
        found = f"{fstype or 'no'} filesystem" + (f" labelled {label}" if label else "")
        run("wipefs", "--all", disk)
        make_filesystem(disk, str(cfg["filesystem"]), str(cfg["label"]), f"it holds {found} (blank after a "
                        "deallocation, or never made)")
    else:
        log(f"{disk} already holds the {fstype} filesystem {label}: data kept")
    mount(disk, str(cfg["mountPoint"]))


def array(disks: list[str], cfg: dict[str, object]) -> None:
    name, count = str(cfg["array"]), int(str(cfg["count"]))
    held = active_arrays(disks)
    foreign = {md: members for md, members in held.items() if members - {os.path.basename(d) for d in disks}}
    if foreign:
        raise SystemExit(f"refusing: {', '.join(foreign)} also holds disks that are not the expected ones: {foreign}")
    problem = why_not_the_array(disks, count, name)
    if problem is None:
        complete = [md for md, members in held.items() if len(members) == count]
        device = next((md for md in complete if _running(md)), None)
        if device is None:
            for md in held:
                run("mdadm", "--stop", md)
            device = f"/dev/md/{name}"
            run("mdadm", "--assemble", device, *disks)
            log(f"assembled {device} from {', '.join(disks)}: the existing array, data kept")
        else:
            log(f"{device} is already assembled from {', '.join(disks)}: the existing array, data kept")
        fstype, label = filesystem_of(device)
        if (fstype, label) != (cfg["filesystem"], cfg["label"]):
            make_filesystem(device, str(cfg["filesystem"]), str(cfg["label"]),
                            f"the array holds {fstype or 'no'} filesystem {label} (made but never formatted)")
        mount(device, str(cfg["mountPoint"]))
        return
    log(f"recreating RAID 0 array {name} over {', '.join(disks)}: {problem}; RAID 0 keeps no data without all "
        "its members (Azure wipes local NVMe disks on deallocation)")
    for md in held:
        log(f"stopping {md} (assembled from the leftovers: {', '.join(sorted(held[md]))})")
        run("mdadm", "--stop", md)
    for disk in disks:
        run("mdadm", "--zero-superblock", disk, check=False)
        run("wipefs", "--all", disk)
    device = f"/dev/md/{name}"
    run("mdadm", "--create", device, "--run", "--level=0", f"--raid-devices={count}", "--metadata=1.2",
        f"--name={name}", *disks)
    run("udevadm", "settle", "--timeout=30", check=False)
    log(f"created {device} (RAID 0 of {count}) from {', '.join(disks)}")
    make_filesystem(device, str(cfg["filesystem"]), str(cfg["label"]), "a new array")
    mount(device, str(cfg["mountPoint"]))


def _running(md: str) -> bool:
    state = Path("/sys/block", os.path.basename(md), "md", "array_state")
    return state.is_file() and state.read_text().strip() in ("clean", "active", "active-idle", "readonly")


def stop(cfg: dict[str, object]) -> int:
    """At shutdown: unmount and stop the array while the node is still orderly. Measured under
    qemu: left to systemd-shutdown's last "Stopping MD devices" step (right after its final
    sync), Debian 12's 6.1 kernel oopsed in md_submit_flush_data and the reboot hung."""
    mount_point = str(cfg["mountPoint"])
    if mounted_source(mount_point) is not None:
        # recursively: container overlay mounts may sit below it
        result = run("umount", "--recursive", mount_point, check=False)
        if result.returncode != 0:
            log(f"{mount_point} is still busy ({result.stderr.strip()}): left to systemd's own unmount and stop")
            return 0
        log(f"unmounted {mount_point}")
    disks = nvme_disks(list(map(str, cfg["models"])))  # type: ignore[call-overload]
    for md in active_arrays(disks):
        run("mdadm", "--stop", md)
        log(f"stopped {md}")
    return 0


def main(argv: list[str]) -> int:
    args = argv[1:]
    stopping = args[:1] == ["--stop"]
    args = args[1:] if stopping else args
    config_path = Path(args[0]) if args else CONFIG
    cfg = json.loads(config_path.read_text())
    if stopping:
        return stop(cfg)
    models, count, mount_point = list(cfg["models"]), int(cfg["count"]), str(cfg["mountPoint"])
    source = mounted_source(mount_point)
    if source is not None:
        log(f"{mount_point} is already mounted from {source}: nothing to do")
        return 0
    disks = wait_for_disks(models, count, float(cfg["diskWaitSeconds"]))
    if len(disks) != count:
        print(f"refusing: {len(disks)} local NVMe disk(s) with model {' or '.join(map(repr, models))} present "
              f"({', '.join(disks) or 'none'}), the VM size has {count} ({config_path}); nothing was touched, "
              f"{mount_point} stays unmounted and the container runtime will not start", file=sys.stderr)
        return 1
    if count == 1:
        single_disk(disks[0], cfg)
    else:
        array(disks, cfg)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
