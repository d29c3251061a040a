"""`kilonode image build`: a pool's bootable disk image, assembled offline.

    plan + rendered pool artefacts + recipe (node-image/)
        -> base root filesystem (mmdebstrap; cached by the hash of its inputs)
        -> + recipe overlay, rendered files, preloaded image archives, binaries, hygiene
        -> GPT disk (ESP with GRUB + ext4 root) -> raw + fixed VHD + manifest + user-data
"""

from __future__ import annotations

import hashlib
import shutil
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar

from kilonode.config import Stack
from kilonode.image import binaries as pinned
from kilonode.image import disk, mirror, rootfs
from kilonode.image.containers import compile_pause, describe_archive, single_binary_image
from kilonode.image.manifest import FORMAT, Manifest
from kilonode.image.recipe import Recipe, load_recipe
from kilonode.plan import ClusterPlan
from kilonode.plan.model import NodePoolPlan
from kilonode.render.files import USER_DATA, HostFiles

Progress = Callable[[str], None]
T = TypeVar("T")


@dataclass
class BuildResult:
    raw: Path
    vhd: Path
    manifest: Path
    user_data: Path
    base_cached: bool
    timings: dict[str, float] = field(default_factory=dict)


class Steps:
    """Times each build step and reports it; the CLI shows the lines as they come."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.timings: dict[str, float] = {}

    def run(self, name: str, fn: Callable[[], T]) -> T:
        self.progress(f"{name} ...")
        start = time.monotonic()
        value = fn()
        self.timings[name] = round(time.monotonic() - start, 2)
        self.progress(f"{name}: done in {self.timings[name]:.1f} s")
        return value


@dataclass(frozen=True)
class Baked:
    """What the build put into the root filesystem on top of the base, for the manifest."""

    artefacts: list[dict[str, str]]
    images: list[dict[str, str]]
    binaries: list[pinned.BinaryResult]


def find_pool(plan: ClusterPlan, name: str) -> NodePoolPlan:
    for pool in plan.node_pools:
        if pool.name == name:
            return pool
    names = ", ".join(p.name for p in plan.node_pools)
    raise rootfs.BuildError(f"no node pool {name!r} in cluster {plan.cluster}; its pools: {names}")


@dataclass(frozen=True)
class ImageInputs:
    """What a pool's image is built from, handed over by the caller (who loaded, planned and
    rendered the stack): the build itself never loads or renders a stack."""

    stack: Stack
    plan: ClusterPlan
    pool: NodePoolPlan
    files: HostFiles  # the pool's rendered files, render_cluster(plan)[f"pool-{pool.name}"]
    project_dir: Path  # a relative preload archive path is relative to this (the stack's project)


def image_name(stack: Stack, pool: NodePoolPlan) -> str:
    return f"{stack.name}-{pool.name}"


def build_image(
    inputs: ImageInputs,
    out: Path,
    *,
    progress: Progress = lambda _line: None,
    binaries_dir: Path | None = None,
    fetch: bool = False,
    recipe: Recipe | None = None,
) -> BuildResult:
    """Build the pool's image into `out`. Raises BuildError."""
    recipe = recipe or load_recipe()
    stack, plan, pool, files = inputs.stack, inputs.plan, inputs.pool, inputs.files
    steps = Steps(progress)
    out.mkdir(parents=True, exist_ok=True)
    name = image_name(stack, pool)
    work = out / f".work-{name}"
    if work.exists():
        shutil.rmtree(work)
    work.mkdir()
    tree = work / "rootfs"
    try:
        base = steps.run("base root filesystem", lambda: rootfs.base_rootfs(recipe, pool.runtime, progress))
        progress(f"base root filesystem: {'reused from cache' if base.cached else 'built'} ({base.key[:12]})")
        steps.run("unpack base", lambda: rootfs.extract(base.tarball, tree))

        def customise() -> Baked:
            artefacts = []
            for path in rootfs.copy_overlay(recipe.overlay_dir, tree):
                placed = rootfs.host_path(tree, path)
                mode = f"{placed.stat().st_mode & 0o7777:04o}"
                artefacts.append({"path": path, "sha256": _sha(placed.read_bytes()), "mode": mode, "source": "recipe"})
            for path, rendered in sorted(files.items()):
                if path == USER_DATA:
                    continue
                data = rendered.content.encode()
                rootfs.put(tree, "/" + path, data, rendered.mode)
                artefacts.append(
                    {"path": "/" + path, "sha256": _sha(data), "mode": f"{rendered.mode:04o}", "source": "render"}
                )
            images = preload(pool, recipe, tree, work, inputs.project_dir)
            binaries = pinned.place_role(
                tree, pinned.load(recipe.binaries_file), pinned.pool_role(pool.runtime), plan.kubernetes_version,
                local_dir=binaries_dir, allow_fetch=fetch, downloads=pinned.Downloads(work / "downloads"),
            )
            return Baked(artefacts, images, binaries)

        baked = steps.run("bake artefacts and preloaded images", customise)
        # deterministic: the same inputs give the same filesystem UUID (and GRUB config)
        root_uuid = str(uuid.uuid5(uuid.NAMESPACE_URL, f"kilonode:{name}:{base.key}:{_sha(repr(baked).encode())}"))

        def boot_config() -> None:
            rootfs.put(
                tree, "/boot/grub/grub.cfg",
                (
                    "# kilonode node image: the ESP's standalone GRUB chains here.\n"
                    "set timeout=0\nset default=0\n"
                    "menuentry 'kilonode node' {\n"
                    f"  linux /vmlinuz root=UUID={root_uuid} {recipe.kernel_cmdline}\n"
                    "  initrd /initrd.img\n}\n"
                ).encode(),
                0o644,
            )
            rootfs.put(tree, "/etc/fstab", f"UUID={root_uuid} / ext4 defaults,errors=remount-ro 0 1\n".encode(), 0o644)
            rootfs.systemctl(tree, "enable", recipe.enable_units)
            rootfs.systemctl(tree, "disable", recipe.disable_units)

        steps.run("boot loader config and units", boot_config)

        def hygiene() -> None:
            rootfs.scrub_image(tree)
            hits = rootfs.find_mirror_names(tree, mirror.mirror_hosts())
            if hits:
                raise rootfs.BuildError(f"the build host's mirror is named in the image: {', '.join(hits)}")

        steps.run("image hygiene", hygiene)
        packages = rootfs.installed_packages(tree)
        raw = out / f"{name}.raw"
        vhd = out / f"{name}.vhd"
        esp = work / "esp.img"
        steps.run("EFI system partition", lambda: disk.make_esp(esp, recipe.esp_size_mib, root_uuid, work))
        root_part = steps.run(
            "GPT disk",
            lambda: disk.assemble(
                raw, tree, esp, size_mib=recipe.disk_size_mib, esp_size_mib=recipe.esp_size_mib,
                root_uuid=root_uuid, root_label=recipe.root_label,
            ),
        )
        steps.run("fixed VHD", lambda: disk.to_vhd(raw, vhd))
        user_data = out / f"{name}.user-data"
        user_data.write_text(files[USER_DATA].content)
        manifest = Manifest(
            {
                "format": FORMAT,
                "name": name,
                "built_at": datetime.now(UTC).isoformat(timespec="seconds"),
                "stack": stack.name,
                "stack_file_sha256": _sha(stack.file.read_bytes()),
                "cluster": plan.cluster,
                "pool": pool.name,
                "runtime": pool.runtime,
                "kubernetes_version": plan.kubernetes_version,
                "disk": {
                    "raw": raw.name,
                    "vhd": vhd.name,
                    "size_bytes": raw.stat().st_size,
                    "vhd_size_bytes": vhd.stat().st_size,
                    "partition_table": "gpt",
                    "boot": "uefi (standalone GRUB at EFI/BOOT/BOOTX64.EFI)",
                    "root_uuid": root_uuid,
                    "root_partition": {"start": root_part.start, "size": root_part.size},
                },
                "inputs": {
                    "recipe_version": recipe.version,
                    "suite": recipe.suite,
                    "variant": recipe.variant,
                    "base_cache_key": base.key,
                    "base_reused_from_cache": base.cached,
                    "packages_requested": recipe.package_list(pool.runtime),
                    "recipe_files": {
                        f"node-image/{p.relative_to(recipe.root).as_posix()}": _sha(p.read_bytes())
                        for p in sorted(recipe.root.rglob("*"))
                        if p.is_file() and "__pycache__" not in p.parts
                    },
                },
                "packages": packages,
                "artefacts": baked.artefacts,
                "preloaded_images": baked.images,
                # images the cluster starts on every node that the stack gave no archive for
                # (bootImageArchives): the node pulls them at first start
                "boot_images_not_supplied": [
                    {"image": image, "reason": "no archive in the stack's bootImageArchives: pulled at first start"}
                    for image in pool.boot_images_not_preloaded
                ],
                # node-image/binaries.toml's components for this pool: "binaries" are those a
                # unit runs and is skipped without (kubelet, cri-dockerd), "other_binaries"
                # the rest (crictl, CNI plugins; containerd and runc for containerd pools).
                "binaries": [b.manifest_entry() for b in baked.binaries if b.unit],
                "other_binaries": [b.manifest_entry() for b in baked.binaries if not b.unit],
                "user_data": {"file": user_data.name, "sha256": _sha(user_data.read_bytes())},
                "pool_plan": pool.model_dump(mode="json"),
                "timings_s": steps.timings,
            },
            out / f"{name}.manifest.json",
        )
        manifest.write()
        return BuildResult(raw, vhd, manifest.path, user_data, base.cached, steps.timings)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def preload(pool: NodePoolPlan, recipe: Recipe, tree: Path, work: Path, base_dir: Path) -> list[dict[str, str]]:
    """Bake every preload entry of the plan at its baked_path; returns manifest entries."""
    entries = []
    for item in pool.preload_images:
        staged = work / "preload" / Path(item.baked_path).name
        if item.source == "build:pause":
            binary = compile_pause(recipe.pause_source, work / "pause" / "pause")
            archive = single_binary_image(item.image, binary, "/pause", staged)
        elif item.source == "archive":
            src = Path(item.archive or "")
            if not src.is_absolute():
                src = base_dir / src
            if not src.is_file():
                raise rootfs.BuildError(f"preload {item.image}: archive {src} not found")
            archive = describe_archive(item.image, src)
        else:
            raise rootfs.BuildError(
                f"preload {item.image}: source 'pull' needs a registry at build time and none is reachable "
                "here; supply a docker-archive (`docker save -o FILE IMAGE`) as source 'archive'"
            )
        rootfs.put(tree, item.baked_path, archive.path.read_bytes(), 0o644)
        entries.append(
            {
                "image": item.image,
                "source": item.source,
                "path": item.baked_path,
                "sha256": archive.sha256,
                "image_id": archive.image_id,
            }
        )
    return entries


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
