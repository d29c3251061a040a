"""A GPT + UEFI disk assembled from files, with no loop devices and no mounts.

Measured recipe (on these machines): the ESP is made as a FAT image with mtools, the
root filesystem with `mkfs.ext4 -d` straight into its partition's byte range, and the GPT
with sgdisk on a sparse file. The same byte offsets let debugfs read and edit the root
filesystem of a built image in place (`ImageFs`), which the verifier uses to check what
was baked and the defect tests use to seed defects.
"""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

SECTOR = 512
MIB = 1 << 20
ESP_TYPE = "C12A7328-F81F-11D2-BA4B-00A0C93EC93B"
LINUX_ROOT_X86_64 = "4F68BCE3-E8CD-4DB1-96E7-FBCAF984B709"


class DiskError(RuntimeError):
    pass


def run(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(cmd, capture_output=True, text=True, check=False, **kwargs)  # type: ignore[call-overload]
    if result.returncode != 0:
        raise DiskError(f"{' '.join(cmd[:3])}... failed ({result.returncode}): {result.stderr.strip()[-2000:]}")
    return result


@dataclass(frozen=True)
class Partition:
    number: int
    type_guid: str
    start: int  # bytes
    size: int  # bytes
    name: str


def gpt_partitions(disk: Path) -> list[Partition]:
    """Read the primary GPT (works on a raw disk and on a fixed VHD, whose footer is at the end)."""
    with disk.open("rb") as f:
        f.seek(SECTOR)
        header = f.read(92)
        if header[:8] != b"EFI PART":
            raise DiskError(f"{disk}: no GPT header at LBA 1")
        entries_lba, count, entry_size = struct.unpack_from("<QII", header, 72)
        f.seek(entries_lba * SECTOR)
        table = f.read(count * entry_size)
    parts = []
    for i in range(count):
        entry = table[i * entry_size : (i + 1) * entry_size]
        if entry[:16] == b"\0" * 16:
            continue
        first, last = struct.unpack_from("<QQ", entry, 32)
        name = entry[56:128].decode("utf-16-le").rstrip("\0")
        parts.append(
            Partition(
                number=i + 1,
                type_guid=str(uuid.UUID(bytes_le=entry[:16])).upper(),
                start=first * SECTOR,
                size=(last - first + 1) * SECTOR,
                name=name,
            )
        )
    return parts


def root_partition(disk: Path) -> Partition:
    for part in gpt_partitions(disk):
        if part.type_guid == LINUX_ROOT_X86_64:
            return part
    raise DiskError(f"{disk}: no Linux root (x86-64) partition in its GPT")


def make_esp(out: Path, size_mib: int, root_uuid: str, workdir: Path) -> Path:
    """A FAT32 ESP whose only file is a standalone GRUB at the removable-media path.

    The embedded config finds the root filesystem by UUID and hands over to its
    /boot/grub/grub.cfg, so kernel command-line changes need no ESP rebuild. (Secure Boot /
    Trusted Launch needs Debian's signed shim + GRUB instead: see docs/node-images.md, "What cannot exist here".)
    """
    embedded = workdir / "grub-embedded.cfg"
    embedded.write_text(
        f"search --no-floppy --fs-uuid --set=root {root_uuid}\n"
        "set prefix=($root)/boot/grub\n"
        "configfile ($root)/boot/grub/grub.cfg\n"
    )
    efi = workdir / "BOOTX64.EFI"
    run(
        [
            "grub-mkstandalone", "-O", "x86_64-efi", "-o", str(efi),
            "--modules=part_gpt fat ext2 search search_fs_uuid configfile normal linux echo test",
            "--install-modules=part_gpt fat ext2 search search_fs_uuid configfile normal linux echo test "
            "all_video gzio",
            "--locales=", "--fonts=", "--themes=",
            f"boot/grub/grub.cfg={embedded}",
        ]
    )
    out.unlink(missing_ok=True)
    run(["mkfs.vfat", "-F", "32", "-n", "EFI", "-C", str(out), str(size_mib * 1024)])
    run(["mmd", "-i", str(out), "::/EFI", "::/EFI/BOOT"])
    run(["mcopy", "-i", str(out), str(efi), "::/EFI/BOOT/BOOTX64.EFI"])
    return out


def copy_sparse(src: Path, dst: Path, offset: int) -> None:
    """Copy src into dst at `offset`, skipping src's holes (dst is sparse already)."""
    with src.open("rb") as fin, dst.open("r+b") as fout:
        size = os.fstat(fin.fileno()).st_size
        pos = 0
        while pos < size:
            try:
                data_start = os.lseek(fin.fileno(), pos, os.SEEK_DATA)
            except OSError:
                break  # only a hole remains
            hole = os.lseek(fin.fileno(), data_start, os.SEEK_HOLE)
            fin.seek(data_start)
            fout.seek(offset + data_start)
            remaining = hole - data_start
            while remaining:
                block = fin.read(min(remaining, 8 * MIB))
                fout.write(block)
                remaining -= len(block)
            pos = hole


def assemble(disk: Path, rootdir: Path, esp: Path, *, size_mib: int, esp_size_mib: int,
             root_uuid: str, root_label: str) -> Partition:
    """GPT disk: partition 1 = ESP, partition 2 = ext4 root filled from `rootdir`."""
    disk.unlink(missing_ok=True)
    with disk.open("wb") as f:
        f.truncate(size_mib * MIB)
    run(
        [
            "sgdisk", "--clear",
            "-n", f"1:1MiB:+{esp_size_mib}MiB", "-t", "1:EF00", "-c", "1:EFI system",
            "-n", "2:0:0", "-t", "2:8304", "-c", "2:kilonode root",
            str(disk),
        ]
    )
    parts = {p.number: p for p in gpt_partitions(disk)}
    esp_part, root = parts[1], parts[2]
    copy_sparse(esp, disk, esp_part.start)
    # mkfs writes straight into the root partition's byte range: no temporary 4 GB file.
    run(
        [
            "mkfs.ext4", "-F", "-q", "-U", root_uuid, "-L", root_label,
            "-E", f"offset={root.start}", "-d", str(rootdir),
            str(disk), f"{root.size // 1024}k",
        ]
    )
    return root


def to_vhd(raw: Path, vhd: Path) -> Path:
    """Fixed VHD for the Azure Compute Gallery; force_size keeps the size a whole MiB."""
    run(["qemu-img", "convert", "-f", "raw", "-O", "vpc", "-o", "subformat=fixed,force_size=on", str(raw), str(vhd)])
    return vhd


class ImageFs:
    """Read (and, for seeded defects, edit) the root filesystem of a disk image via debugfs."""

    def __init__(self, disk: Path) -> None:
        if shutil.which("debugfs") is None:
            raise DiskError("debugfs not found (apt-get install e2fsprogs)")
        self.disk = disk
        self.root = root_partition(disk)
        self._spec = f"{disk}?offset={self.root.start}"

    def _debugfs(self, request: str, *, write: bool = False) -> subprocess.CompletedProcess[bytes]:
        cmd = ["debugfs", *(["-w"] if write else []), "-R", request, self._spec]
        return subprocess.run(cmd, capture_output=True, check=False)

    def read(self, path: str) -> bytes | None:
        """File contents, or None when the path does not exist (symlinks are not followed)."""
        if self.stat(path) is None:
            return None
        result = self._debugfs(f'cat "{path}"')
        return result.stdout

    def read_text(self, path: str) -> str | None:
        data = self.read(path)
        return None if data is None else data.decode("utf-8", errors="replace")

    def stat(self, path: str) -> dict[str, str] | None:
        """{"type", "mode" (octal text), "uid", "gid", "size"}, or None when absent."""
        text = self._debugfs(f'stat "{path}"').stdout.decode(errors="replace")
        if "Inode:" not in text:
            return None
        fields = {}
        for key, pattern in (("type", r"Type:\s+(\S+)"), ("mode", r"Mode:\s+(\d+)"), ("uid", r"User:\s+(\d+)"),
                             ("gid", r"Group:\s+(\d+)"), ("size", r"Size:\s+(\d+)")):
            match = re.search(pattern, text)
            fields[key] = match.group(1) if match else ""
        return fields

    def listdir(self, path: str) -> list[str]:
        """Names in a directory (`ls -p` lines are /inode/mode/uid/gid/name/size/)."""
        result = self._debugfs(f'ls -p "{path}"')
        names = []
        for line in result.stdout.decode(errors="replace").splitlines():
            parts = line.strip().strip("/").split("/")
            if len(parts) >= 5 and parts[4] not in (".", ".."):
                names.append(parts[4])
        return names

    def write(self, path: str, data: bytes, mode: int = 0o644) -> None:
        """Replace (or create) a regular file owned by root with `data`."""
        with tempfile.NamedTemporaryFile() as tmp:
            tmp.write(data)
            tmp.flush()
            self._debugfs(f'rm "{path}"', write=True)
            result = self._debugfs(f'write "{tmp.name}" "{path}"', write=True)
            if self.stat(path) is None:
                raise DiskError(f"debugfs could not write {path}: {result.stderr.decode(errors='replace')}")
            self._debugfs(f'sif "{path}" mode 0{0o100000 | mode:o}', write=True)
            self._debugfs(f'sif "{path}" uid 0', write=True)
            self._debugfs(f'sif "{path}" gid 0', write=True)

    def remove(self, path: str) -> None:
        self._debugfs(f'rm "{path}"', write=True)
        if self.stat(path) is not None:
            raise DiskError(f"debugfs could not remove {path}")
