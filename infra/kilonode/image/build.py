"""`kilonode image build`: a bootable disk image, assembled offline, for a node pool or for
the etcd members or the apiservers (the control-plane roles).

    plan + rendered pool artefacts + recipe (node-image/)
        -> base root filesystem (mmdebstrap; cached by the hash of its inputs)
        -> + recipe overlay, role overlay, rendered files, preloaded image archives,
             pinned binaries, hygiene
        -> GPT disk (ESP with GRUB + ext4 root) -> raw + fixed VHD + manifest (+ user-data)

A pool's image bakes the pool's rendered files: every node of a pool is alike. A role image
bakes none: each etcd member and apiserver differs (name, address, certificates), and its
files come with its own custom data; the image carries what they all run.
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from kilonode.catalog import binaries as pins
from kilonode.config import Stack
from kilonode.config.model import CONTROL_PLANE_IMAGE, ETCD_IMAGE
from kilonode.digest import sha256_bytes, sha256_file, sha256_text
from kilonode.image import binaries as pinned
from kilonode.image import disk, mirror, needs, rootfs, vendor_apt
from kilonode.image import gpu as accel
from kilonode.image.containers import compile_pause, describe_archive, single_binary_image
from kilonode.image.manifest import FORMAT, Manifest
from kilonode.image.recipe import BaseSpec, Extra, Flavour, Recipe, load_recipe
from kilonode.node.ship import GPU_HEALTH, NodeProgram, programs_for
from kilonode.plan import ClusterPlan, wellknown
from kilonode.plan.model import NodePoolPlan
from kilonode.render.files import USER_DATA, HostFiles

Progress = Callable[[str], None]
T = TypeVar("T")


# The control-plane roles an image is built for, besides the pools: the image each role's VMs
# boot (the gallery image definitions of the same names), and the binaries.toml role it carries.
ROLE_IMAGES: dict[str, str] = {
    ETCD_IMAGE: "etcd members of both clusters (main and events)",
    CONTROL_PLANE_IMAGE: "apiservers (kube-apiserver, kube-controller-manager, kube-scheduler)",
}


@dataclass
class BuildResult:
    raw: Path
    vhd: Path
    manifest: Path
    user_data: Path | None  # a pool's cloud-init user-data (verify seeds it); None for a role
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
    toolkit_packages: dict[str, str] = field(default_factory=dict)
    runtime_dropin: str | None = None  # the NVIDIA runtime drop-in, written with the toolkit only
    # the GPU health package's files (kilonode.gpu on the node), where the image carries it
    agent: list[dict[str, str]] = field(default_factory=list)
    # packages from the extras' vendor apt repositories (Fabric Manager, NSCQ, the toolkit)
    vendor: accel.VendorInstall = field(default_factory=accel.VendorInstall)
    fabric_manager: dict[str, Any] | None = None  # its unit, enabled on NVSwitch sizes only


def find_pool(plan: ClusterPlan, name: str) -> NodePoolPlan:
    for pool in plan.node_pools:
        if pool.name == name:
            return pool
    names = ", ".join(p.name for p in plan.node_pools)
    raise rootfs.BuildError(f"no node pool {name!r} in cluster {plan.cluster}; its pools: {names}")


@dataclass(frozen=True)
class ImageInputs:
    """What an image is built from, handed over by the caller (who loaded, planned and
    rendered the stack): the build itself never loads or renders a stack. A pool's image
    gives `pool` and the pool's files; a role image gives `role` and no files."""

    stack: Stack
    plan: ClusterPlan
    pool: NodePoolPlan | None
    files: HostFiles  # the pool's rendered files, render_cluster(plan)[pool.role()]; {} for a role
    project_dir: Path  # a relative preload archive path is relative to this (the stack's project)
    role: str | None = None  # a key of ROLE_IMAGES, when pool is None

    @property
    def kubernetes_version(self) -> str:
        """The version the image's binaries are pinned at: the pool's own (nodePools[].kubernetesVersion,
        during a minor upgrade), else the stack's."""
        return (self.pool.kubernetes_version if self.pool else "") or self.plan.kubernetes_version

    def __post_init__(self) -> None:
        if (self.pool is None) == (self.role is None):
            raise ValueError("give exactly one of pool and role")
        if self.role is not None and self.role not in ROLE_IMAGES:
            raise rootfs.BuildError(f"no role image {self.role!r}; the roles: {', '.join(ROLE_IMAGES)}")

    @property
    def target(self) -> str:
        """The pool's name, or the role's: the image is <stack>-<target>."""
        return self.pool.name if self.pool else str(self.role)

    @property
    def flavour(self) -> Flavour:
        return self.pool.runtime if self.pool else "control"

    @property
    def binaries_role(self) -> str:
        return pins.pool_role(self.pool.runtime) if self.pool else str(self.role)

    @property
    def extras(self) -> tuple[Extra, ...]:
        """What the pool's VM size adds to its base: GPU software, the RDMA user space."""
        return self.pool.image_extras if self.pool else ()

    @property
    def base(self) -> BaseSpec:
        return BaseSpec(self.flavour, self.extras)

    @property
    def carries_gpu_agent(self) -> bool:
        """GPU pools run the health agent; the apiservers run its taint controller."""
        return GPU_HEALTH in self.node_programs

    @property
    def node_programs(self) -> tuple[NodeProgram, ...]:
        """The node programs the image carries, as kilonode.node.ship says (programs_for)."""
        return programs_for(self.role, self.extras)


def role_inputs(stack: Stack, plan: ClusterPlan, role: str, project_dir: Path) -> ImageInputs:
    return ImageInputs(stack=stack, plan=plan, pool=None, files={}, project_dir=project_dir, role=role)


def image_name(stack: Stack, target: str) -> str:
    return f"{stack.name}-{target}"


def build_image(
    inputs: ImageInputs,
    out: Path,
    *,
    progress: Progress = lambda _line: None,
    binaries_dir: Path | None = None,
    fetch: bool = False,
    recipe: Recipe | None = None,
    allow_incomplete: bool = False,
) -> BuildResult:
    """Build the pool's image into `out`. Raises BuildError, also for an image missing a
    program its units or conflists run, or a required component (unless `allow_incomplete`:
    then the progress and the manifest say what is missing)."""
    recipe = recipe or load_recipe()
    stack, pool, files = inputs.stack, inputs.pool, inputs.files
    steps = Steps(progress)
    out.mkdir(parents=True, exist_ok=True)
    name = image_name(stack, inputs.target)
    work = out / f".work-{name}"
    if work.exists():
        shutil.rmtree(work)
    work.mkdir()
    tree = work / "rootfs"
    extras = inputs.extras
    runtime_config = accel.nvidia_runtime_config(pool, files) if pool and "gpu" in extras else None
    try:
        if pool and (refused := accel.unsupported_gpu(recipe, pool)):
            raise rootfs.BuildError(refused)
        if pool and pool.runtime == "docker" and (refused := pins.load(recipe.binaries_file).docker_api_problem(
                inputs.kubernetes_version, recipe.package_list(inputs.flavour, extras))):
            raise rootfs.BuildError(refused)
        base = steps.run("base root filesystem", lambda: rootfs.base_rootfs(recipe, inputs.base, progress))
        progress(f"base root filesystem {inputs.base.label}: {'reused from cache' if base.cached else 'built'} "
                 f"({base.key[:12]})")
        steps.run("unpack base", lambda: rootfs.extract(base.tarball, tree))

        baked = steps.run(
            "bake artefacts and preloaded images",
            lambda: _bake(inputs, recipe, tree, work, runtime_config, binaries_dir=binaries_dir, fetch=fetch),
        )
        if "gpu" in extras and (mismatch := vendor_apt.version_problems(
                rootfs.installed_packages(tree), recipe.extras["gpu"].equal_versions)):
            raise rootfs.BuildError(f"image {name}: the GPU software is not one driver release: {'; '.join(mismatch)}")
        missing = incomplete(inputs, recipe, tree, baked)
        if missing and not allow_incomplete:
            raise rootfs.BuildError(
                f"image {name} would miss what its machines run: {'; '.join(missing)}. Build with --fetch "
                "(pinned and locked downloads) or --binaries DIR, or pass --allow-incomplete to build it anyway")
        for line in missing:
            progress(f"incomplete (--allow-incomplete): {line}")
        # deterministic: the same inputs give the same filesystem UUID (and GRUB config)
        root_uuid = str(uuid.uuid5(uuid.NAMESPACE_URL, f"kilonode:{name}:{base.key}:{sha256_text(repr(baked))}"))

        steps.run("boot loader config and units", lambda: _boot_config(tree, recipe, root_uuid))

        steps.run("image hygiene", lambda: _hygiene(tree))
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
        user_data: Path | None = None
        if pool:
            user_data = out / f"{name}.user-data"
            user_data.write_text(files[USER_DATA].content)
        built = _Built(name, tree, base, baked, packages, runtime_config, root_uuid, root_part, raw, vhd, user_data,
                       steps.timings)
        manifest = Manifest(_manifest(inputs, recipe, built), out / f"{name}.manifest.json")
        manifest.write()
        return BuildResult(raw, vhd, manifest.path, user_data, base.cached, steps.timings)
    finally:
        shutil.rmtree(work, ignore_errors=True)


@dataclass(frozen=True)
class _Built:
    """What build_image's steps made, for the manifest."""

    name: str
    tree: Path
    base: rootfs.BaseRootfs
    baked: Baked
    packages: dict[str, str]
    runtime_config: str | None
    root_uuid: str
    root_part: disk.Partition
    raw: Path
    vhd: Path
    user_data: Path | None
    timings: dict[str, float]


def _manifest(inputs: ImageInputs, recipe: Recipe, built: _Built) -> dict[str, Any]:
    """The image's manifest (<image>.manifest.json): what it is for, its disk, what it was
    built from and what it carries."""
    stack, plan, pool = inputs.stack, inputs.plan, inputs.pool
    baked, packages, extras, user_data = built.baked, built.packages, inputs.extras, built.user_data
    return {
        "format": FORMAT,
        "name": built.name,
        "built_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "stack": stack.name,
        "stack_file_sha256": sha256_file(stack.file),
        "cluster": plan.cluster,
        # what the image is for: a pool, or a control-plane role (ROLE_IMAGES)
        "pool": pool.name if pool else None,
        "role": inputs.role,
        "runtime": pool.runtime if pool else None,
        "kubernetes_version": pool.kubernetes_version if pool and pool.kubernetes_version else plan.kubernetes_version,
        "disk": _disk_record(built),
        "inputs": _inputs_record(inputs, recipe, built),
        "packages": packages,
        "artefacts": baked.artefacts,
        "preloaded_images": baked.images,
        # images the cluster starts on every node that the stack gave no archive for
        # (bootImageArchives): the node pulls them at first start
        "boot_images_not_supplied": [
            {"image": image, "reason": "no archive in the stack's bootImageArchives: pulled at first start"}
            for image in (pool.boot_images_not_preloaded if pool else ())
        ],
        # node-image/binaries.toml's components for this image: "binaries" are those a
        # unit runs and fails to start without (kubelet, cri-dockerd; etcd; the control
        # plane), "other_binaries" the rest (crictl, CNI plugins, containerd, runc).
        "binaries": [b.manifest_entry() for b in baked.binaries if b.unit],
        "other_binaries": [b.manifest_entry() for b in baked.binaries if not b.unit],
        # GPU pools: driver, kernel modules and the kernel they were built for, GSP
        # firmware, CUDA libraries, the container toolkit installed or absent (and so whether
        # the runtime names the NVIDIA runtime), the device plugin image; null otherwise
        "gpu": accel.gpu_record(
            recipe, extras, pool, built.tree, packages, baked.toolkit_packages,
            baked.runtime_dropin, baked.agent, baked.images, built.runtime_config,
            plan.components.device_plugin_image, baked.vendor, baked.fabric_manager,
        ) if pool else None,
        "infiniband": accel.infiniband_record(recipe, extras, packages),
        # the kernel the image boots and the options of its config that component contracts name
        # (kilonode preflight --images judges these instead of catalog/kernels.yaml)
        "kernel": accel.kernel_record(built.tree),
        # the command line the boot loader gives that kernel (the grub.cfg this build writes): the
        # kubelet's cgroup contract reads it (systemd's legacy-hierarchy parameters)
        "kernel_cmdline": recipe.kernel_cmdline,
        # kilonode.gpu (agent, taint controller) where this image carries it
        "gpu_agent": {"pythonpath": GPU_HEALTH.pythonpath, "files": baked.agent} if baked.agent else None,
        "user_data": {"file": user_data.name, "sha256": sha256_file(user_data)} if user_data else None,
        "pool_plan": pool.model_dump(mode="json") if pool else None,
        "timings_s": built.timings,
    }


def _disk_record(built: _Built) -> dict[str, Any]:
    """The image's disk: its files, partitions and root filesystem UUID."""
    return {
        "raw": built.raw.name,
        "vhd": built.vhd.name,
        "size_bytes": built.raw.stat().st_size,
        "vhd_size_bytes": built.vhd.stat().st_size,
        "partition_table": "gpt",
        "boot": "uefi (standalone GRUB at EFI/BOOT/BOOTX64.EFI)",
        "root_uuid": built.root_uuid,
        "root_partition": {"start": built.root_part.start, "size": built.root_part.size},
    }


def _inputs_record(inputs: ImageInputs, recipe: Recipe, built: _Built) -> dict[str, Any]:
    """What the image was built from."""
    return {
        "recipe_version": recipe.version,
        "suite": recipe.suite,
        "variant": recipe.variant,
        "base_cache_key": built.base.key,
        "base_reused_from_cache": built.base.cached,
        "flavour": inputs.flavour,
        # what the pool's size added to the base (recipe.toml [extras.*]); [] for none
        "extras": list(inputs.extras),
        "base": inputs.base.label,
        "packages_requested": recipe.package_list(inputs.flavour, inputs.extras),
        "recipe_files": _recipe_files(recipe),
    }


def _recipe_files(recipe: Recipe) -> dict[str, str]:
    """node-image/<path> -> sha256 of every recipe file the image is built from."""
    return {
        f"node-image/{p.relative_to(recipe.root).as_posix()}": sha256_file(p)
        for p in sorted(recipe.root.rglob("*"))
        # verify/ checks the image and is not part of it
        if p.is_file() and "__pycache__" not in p.parts and not p.is_relative_to(recipe.root / "verify")
    }


def _bake(
    inputs: ImageInputs, recipe: Recipe, tree: Path, work: Path, runtime_config: str | None, *,
    binaries_dir: Path | None, fetch: bool,
) -> Baked:
    """Everything the image adds to its base: the overlays, the rendered files, the preloaded
    images, the pinned binaries, the NVIDIA toolkit and the GPU agent, each recorded."""
    pool = inputs.pool
    artefacts = _place_overlays(inputs, recipe, tree)
    # the node programs this image carries (kilonode.node.ship), at their paths on the machine
    shipped = {program: rootfs.place_program(tree, program) for program in inputs.node_programs}
    artefacts += [entry for entries in shipped.values() for entry in entries]
    artefacts += _place_rendered(inputs.files, tree)
    images = preload(pool, recipe, tree, work, inputs.project_dir) if pool else []
    binaries = _place_binaries(inputs, recipe, tree, binaries_dir=binaries_dir, fetch=fetch)
    toolkit_packages: dict[str, str] = {}
    dropin: str | None = None
    fabric_manager: dict[str, Any] | None = None
    vendor = accel.VendorInstall()
    if pool and "gpu" in inputs.extras:
        vendor = accel.install_vendor(recipe, inputs.extras, tree, work, fetch=fetch)
        fabric_manager = accel.fabric_manager_unit(recipe, inputs.extras, pool, vendor, tree)
    if pool and accel.TOOLKIT in vendor.installed:
        if runtime_config is None:
            raise rootfs.BuildError(
                f"pool {pool.name}: its rendered files hold no runtime configuration naming the NVIDIA "
                "runtime (kilonode/render/pool.py renders one for GPU pools): the toolkit would go unused"
            )
        toolkit_packages = {p: vendor.installed.get(p, "") for p in accel.TOOLKIT_PACKAGES}
        rootfs.put(tree, accel.TOOLKIT_CONFIG, accel.TOOLKIT_CONFIG_TEXT.encode(), 0o644)
        artefacts.append({"path": accel.TOOLKIT_CONFIG, "sha256": sha256_text(accel.TOOLKIT_CONFIG_TEXT),
                          "mode": "0644", "source": "build:gpu"})
        pinned_containerd = next((b for b in binaries if b.name == "containerd" and b.present), None)
        dropin, text = accel.runtime_dropin(
            pool, runtime_config, pinned_containerd.path if pinned_containerd else "/usr/bin/containerd"
        )
        rootfs.put(tree, dropin, text.encode(), 0o644)
        artefacts.append({"path": dropin, "sha256": sha256_text(text), "mode": "0644", "source": "build:gpu"})
        # the device nodes and /dev/char links, and the device plugin's ready marker (kilonode.image.gpu)
        rootfs.put(tree, accel.NVIDIA_DEVICES_UNIT_PATH, accel.NVIDIA_DEVICES_UNIT_TEXT.encode(), 0o644)
        rootfs.systemctl(tree, "enable", [wellknown.NVIDIA_DEVICES_UNIT])
        artefacts.append({"path": accel.NVIDIA_DEVICES_UNIT_PATH, "sha256": sha256_text(accel.NVIDIA_DEVICES_UNIT_TEXT),
                          "mode": "0644", "source": "build:gpu"})
    return Baked(artefacts, images, binaries, toolkit_packages, dropin, shipped.get(GPU_HEALTH, []), vendor,
                 fabric_manager)


def incomplete(inputs: ImageInputs, recipe: Recipe, tree: Path, baked: Baked) -> list[str]:
    """What the image lacks: each required component (binaries.toml: no `absent_means`) not
    placed, and each program the baked units, drop-ins, conflists, runtime configs and scripts
    run that is not in the tree (kilonode.image.needs)."""
    catalog = pins.load(recipe.binaries_file)
    missing = [f"{b.name} ({b.path}): {b.origin}" for b in baked.binaries
               if not b.present and catalog.components[b.name].required]
    # Fabric Manager, NSCQ and the container toolkit (vendor apt repositories): required on GPU pools
    missing += baked.vendor.missing
    files = {path: rendered.content for path, rendered in inputs.files.items() if path != USER_DATA}
    for need in needs.programs_invoked(files, needs.known_programs(catalog)):
        if not any(os.path.lexists(rootfs.host_path(tree, p)) for p in need.paths):
            line = f"{need.path} ({need.why} in {need.file})"
            if line not in missing and not any(m.endswith(f"({need.path}): ") for m in missing):
                missing.append(line)
    return missing


def _place_overlays(inputs: ImageInputs, recipe: Recipe, tree: Path) -> list[dict[str, str]]:
    """The recipe's overlay, the role's and the extras' (node-image/gpu/rootfs, the GPU health
    agent's unit, in GPU pools' images only), then the service users they declare."""
    overlays = [(recipe.overlay_dir, "recipe")]
    if inputs.role and recipe.role_overlay_dir(inputs.role).is_dir():
        overlays.append((recipe.role_overlay_dir(inputs.role), f"recipe:{inputs.role}"))
    overlays += [(recipe.extra_overlay_dir(e), f"recipe:{e}") for e in inputs.extras
                 if recipe.extra_overlay_dir(e).is_dir()]
    artefacts = []
    placed_paths = []
    for overlay, source in overlays:
        for path in rootfs.copy_overlay(overlay, tree):
            placed_paths.append(path)
            placed = rootfs.host_path(tree, path)
            mode = f"{placed.stat().st_mode & 0o7777:04o}"
            artefacts.append({"path": path, "sha256": sha256_file(placed), "mode": mode, "source": source})
    # service users the overlays declare (sysusers.d), made now: a fixed uid in the
    # image, and the user exists before cloud-init writes files owned by it
    rootfs.sysusers(tree, [p for p in placed_paths if p.startswith("/usr/lib/sysusers.d/")])
    return artefacts


def _place_rendered(files: HostFiles, tree: Path) -> list[dict[str, str]]:
    """The pool's rendered files at their host paths (user-data stays beside the image)."""
    artefacts = []
    for path, rendered in sorted(files.items()):
        if path == USER_DATA:
            continue
        data = rendered.content.encode()
        rootfs.put(tree, "/" + path, data, rendered.mode)
        artefacts.append({
            "path": "/" + path, "sha256": sha256_bytes(data), "mode": f"{rendered.mode:04o}", "source": "render",
        })
    return artefacts


def _place_binaries(
    inputs: ImageInputs, recipe: Recipe, tree: Path, *, binaries_dir: Path | None, fetch: bool,
) -> list[pinned.BinaryResult]:
    """node-image/binaries.toml's components for the image's roles, placed in the tree."""
    pool = inputs.pool
    catalog = pins.load(recipe.binaries_file)
    # kept between builds (named by the pinned digest): a rebuild does not fetch a pinned file
    # it has again, and `kilonode gpu nccl-job` finds the NCCL topology file there
    downloads = pinned.Downloads(pinned.download_cache())
    roles = (
        list(pool.binary_roles) if pool
        else [inputs.binaries_role]
    )
    binaries: list[pinned.BinaryResult] = []
    for binaries_role in roles:
        binaries += pinned.place_role(
            tree, catalog, binaries_role, inputs.kubernetes_version,
            local_dir=binaries_dir, allow_fetch=fetch, downloads=downloads,
        )
    return binaries


def _boot_config(tree: Path, recipe: Recipe, root_uuid: str) -> None:
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


def _hygiene(tree: Path) -> None:
    rootfs.scrub_image(tree)
    hits = rootfs.find_mirror_names(tree, mirror.mirror_hosts())
    if hits:
        raise rootfs.BuildError(f"the build host's mirror is named in the image: {', '.join(hits)}")


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
            if item.image_id is not None and archive.image_id != item.image_id:
                raise rootfs.BuildError(
                    f"preload {item.image}: archive {src} holds image {archive.image_id}, not the {item.image_id} the "
                    "stack's bootImageArchives names: rebuild it from the image you mean, or name that ID")
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
