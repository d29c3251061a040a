"""What a GPU (or InfiniBand) pool's image carries beyond a plain pool's, and its record.

The packages themselves (the NVIDIA driver built by DKMS, the GSP firmware, CUDA's runtime
and cuBLAS, the RDMA user space) are in the pool's cached base (recipe.toml [extras.*]). This
module does the rest of the build for them, on the unpacked tree:

- refuses a GPU model the recipe's driver set cannot drive (recipe [extras.gpu.unsupported_models]);
- installs Fabric Manager, NSCQ and the NVIDIA container toolkit from NVIDIA's signed apt
  repositories (kilonode.image.vendor_apt; recipe.toml [apt_repositories.*]), enables Fabric
  Manager's unit on NVSwitch sizes, and only with the toolkit installed writes its config and
  the drop-in that points the container runtime at the rendered NVIDIA runtime configuration
  (kilonode.render.pool: daemon-nvidia.json / config-nvidia.toml);
- describes it all for the manifest: driver packages and version, the kernel the modules were
  built for and the module files, the GSP firmware, the toolkit installed or absent and why, the
  RDMA packages, the device plugin image.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tomllib
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import tomli_w

from kilonode.digest import sha256_file
from kilonode.image import vendor_apt
from kilonode.image.recipe import Extra, Recipe
from kilonode.image.rootfs import BuildError, host_path
from kilonode.node.ship import GPU_HEALTH
from kilonode.plan import wellknown
from kilonode.plan.model import NodePoolPlan
from kilonode.render.files import HostFiles

TOOLKIT = "nvidia-container-toolkit"
# The package whose DKMS module is the driver: the open one (node-image/packages/gpu.txt says why)
DRIVER_MODULE_PACKAGE = "nvidia-open-kernel-dkms"
# The toolkit's .deb packages (recipe.toml [apt_repositories.nvidia-container-toolkit.packages]),
# each depending on the ones before.
TOOLKIT_PACKAGES = (
    "libnvidia-container1",
    "libnvidia-container-tools",
    "nvidia-container-toolkit-base",
    "nvidia-container-toolkit",
)
# The drop-ins that make the container runtime read the NVIDIA variant of its configuration.
# 30-: after the pinned containerd's 20- drop-in, whose ExecStart this one replaces.
DOCKER_DROPIN = "/etc/systemd/system/docker.service.d/30-kilonode-nvidia-runtime.conf"
CONTAINERD_DROPIN = "/etc/systemd/system/containerd.service.d/30-kilonode-nvidia-runtime.conf"
# Debian docker.io 20.10's ExecStart (/lib/systemd/system/docker.service), with --config-file
# added: dockerd then reads only that file (the plain daemon.json stays for a node without the
# toolkit). $DOCKER_OPTS (from /etc/default/docker) still applies as in the packaged unit.
DOCKERD_EXEC = "/usr/sbin/dockerd -H fd:// --containerd=/run/containerd/containerd.sock"
# The runtime name the rendered NVIDIA configuration makes the default (kilonode.render.pool)
NVIDIA_RUNTIME = "nvidia"
# The toolkit's own configuration (the runtime and its hook read it), as data: its keys and
# the upstream defaults are kilonode.plan.wellknown's (TOOLKIT_*), shared with the device
# plugin's side. An unprivileged container's NVIDIA_VISIBLE_DEVICES is ignored (a pod that
# requests no GPU cannot name all eight) and the device list comes only as volume mounts under
# /var/run/nvidia-container-devices, which the device plugin's volume-mounts strategy writes.
# Written after the packages are installed (their maintainer scripts may write a default one);
# the other keys keep the toolkit's defaults.
TOOLKIT_CONFIG = "/etc/nvidia-container-runtime/config.toml"
TOOLKIT_SETTINGS: dict[str, bool] = {
    wellknown.TOOLKIT_ENVVAR_WHEN_UNPRIVILEGED: False,
    wellknown.TOOLKIT_VOLUME_MOUNTS: True,
}
TOOLKIT_CONFIG_TEXT = ("# kilonode: GPUs reach a container only through the device plugin's volume-mounts device "
                       "list.\n" + tomli_w.dumps(TOOLKIT_SETTINGS))
VENDOR_STAGING = "/var/lib/kilonode/vendor-debs"
# The NVIDIA device nodes and their /dev/char links, made on the host once the driver is loaded,
# then the marker the device plugin's init container waits for (kilonode.plan.wellknown). Why the
# links: with the systemd cgroup driver, cgroup v2 and the toolkit's legacy hook, the device rules
# systemd keeps for a container name /dev/char/<major>:<minor>; without the links a daemon-reload
# drops the GPUs from running containers ("Failed to initialize NVML: Unknown Error",
# NVIDIA/nvidia-docker#1730; the fix NVIDIA names there, `nvidia-ctk system
# create-dev-char-symlinks`, is the toolkit's own, v1.17.8 cmd/nvidia-ctk/system/
# create-dev-char-symlinks). --create-all makes the links for every possible device, so a GPU
# node whose /dev/nvidiaN appear later (nvidia-persistenced, the first CUDA call) is covered;
# --load-kernel-modules and --create-device-nodes load the driver and make the control nodes
# first. Written, and enabled, only with the toolkit (its nvidia-toolkit-base has nvidia-ctk).
NVIDIA_CTK = "/usr/bin/nvidia-ctk"
NVIDIA_DEVICES_UNIT_PATH = f"/etc/systemd/system/{wellknown.NVIDIA_DEVICES_UNIT}"
NVIDIA_DEVICES_UNIT_TEXT = f"""# kilonode: the NVIDIA driver loaded, its device nodes and /dev/char links made,
# then the marker {wellknown.NVIDIA_READY_MARKER} the device plugin's init container waits for
# (kilonode.image.gpu).
[Unit]
Description=kilonode NVIDIA device nodes and /dev/char links
After=systemd-modules-load.service systemd-udev-settle.service
Before=kubelet.service nvidia-persistenced.service

[Service]
Type=oneshot
RemainAfterExit=yes
RuntimeDirectory={wellknown.NVIDIA_READY_DIR.removeprefix("/run/")}
RuntimeDirectoryPreserve=yes
ExecStart={NVIDIA_CTK} system create-dev-char-symlinks --create-all --load-kernel-modules --create-device-nodes
ExecStartPost=/usr/bin/touch {wellknown.NVIDIA_READY_MARKER}

[Install]
WantedBy=multi-user.target
"""


def unsupported_gpu(recipe: Recipe, pool: NodePoolPlan) -> str | None:
    """Why the recipe's GPU software cannot drive this pool's GPUs, or None when it can."""
    if pool.gpus_per_node <= 0 or "gpu" not in recipe.extras:
        return None
    model = gpu_model(pool)
    reason = recipe.extras["gpu"].unsupported_models.get(model or "")
    if reason is None:
        return None
    return (
        f"pool {pool.name}: {pool.vm_size} has {model} GPUs, which this image's GPU software cannot drive: "
        f"{reason} (node-image/recipe.toml [extras.gpu.unsupported_models])"
    )


def gpu_model(pool: NodePoolPlan) -> str | None:
    """The size catalogue's GPU model, as the plan carries it."""
    return pool.gpu_model


# --- packages from vendor apt repositories (Fabric Manager, NSCQ, the container toolkit) ----------


@dataclass(frozen=True)
class VendorInstall:
    """What the build installed from the extras' vendor apt repositories, or why not."""

    installed: dict[str, str] = field(default_factory=dict)  # package -> version, as dpkg has it
    fetched: list[dict[str, Any]] = field(default_factory=list)  # vendor_apt.Fetched entries
    missing: list[str] = field(default_factory=list)  # "<package> <version> (apt repository <r>): <why>"
    lock_written: list[str] = field(default_factory=list)  # packages the first fetch locked

    def declared(self, recipe: Recipe, extras: tuple[Extra, ...]) -> dict[str, str]:
        return {p.name: p.version for r in recipe.vendor_repositories(extras) for p in r.packages}


def install_vendor(recipe: Recipe, extras: tuple[Extra, ...], tree: Path, work: Path, *, fetch: bool) -> VendorInstall:
    """Fetch the extras' vendor packages (kilonode.image.vendor_apt: the pinned key, the exact
    versions, the sha256 pin or lock) and install them in the tree with dpkg. Without --fetch, or
    with the repository unreachable, nothing is installed and each package is listed missing with
    the reason. A refusal (key, signature, version, digest) raises: it is never "incomplete"."""
    repos = recipe.vendor_repositories(extras)
    if not repos:
        return VendorInstall()
    if not fetch:
        why = "not fetched (no --fetch): build with --fetch to download it from NVIDIA's signed apt repository"
        return VendorInstall(missing=[f"{p.name} {p.version} (apt repository {r.name}): {why}"
                                      for r in repos for p in r.packages])
    try:
        result = vendor_apt.fetch(repos, work / "vendor-apt", recipe.apt_lock_file)
    except vendor_apt.RepositoryUnreachable as error:
        return VendorInstall(missing=[f"{p.name} {p.version} (apt repository {r.name}): absent: {error}"
                                      for r in repos for p in r.packages])
    staging = host_path(tree, VENDOR_STAGING)
    staging.mkdir(parents=True, exist_ok=True)
    for fetched in result.fetched:
        shutil.copyfile(fetched.path, staging / fetched.path.name)
    outcome = subprocess.run(
        ["chroot", str(tree), "dpkg", "--install", *(f"{VENDOR_STAGING}/{f.path.name}" for f in result.fetched)],
        capture_output=True, text=True, check=False,
    )
    shutil.rmtree(staging)
    if outcome.returncode != 0:
        raise BuildError(f"vendor packages: dpkg --install failed in the image:\n"
                         f"{(outcome.stdout + outcome.stderr)[-3000:]}")
    versions = installed(tree)
    return VendorInstall(
        installed={f.package: versions.get(f.package, "") for f in result.fetched},
        fetched=[f.manifest_entry() for f in result.fetched],
        lock_written=[e.package for e in result.lock_written],
    )


def fabric_manager_to_enable(recipe: Recipe, extras: tuple[Extra, ...], pool: NodePoolPlan) -> str | None:
    """The Fabric Manager unit the build enables for this pool where its package is installed:
    on a size whose GPUs are joined by NVSwitch (the plan's `nvswitch`, from the size
    catalogue), where CUDA cannot initialise without it (cudaErrorSystemNotReady, 802); None
    elsewhere, where nv-fabricmanager finds no NVSwitch and exits 1 (NV_WARN_NOTHING_TO_DO,
    NVIDIA/gpu-operator#610), and for an image without the GPU extra."""
    if "gpu" not in extras or not pool.nvswitch:
        return None
    spec = recipe.extras["gpu"]
    return spec.fabric_manager_unit if spec.equal_versions.get(vendor_apt.FABRIC_MANAGER) else None


def fabric_manager_unit(recipe: Recipe, extras: tuple[Extra, ...], pool: NodePoolPlan, vendor: VendorInstall,
                        tree: Path) -> dict[str, Any] | None:
    """Enable Fabric Manager's unit where fabric_manager_to_enable says, if its package was
    installed; the manifest's record. None for an image without the GPU extra."""
    if "gpu" not in extras:
        return None
    spec = recipe.extras["gpu"]
    package = spec.equal_versions.get(vendor_apt.FABRIC_MANAGER)
    unit = fabric_manager_to_enable(recipe, extras, pool)
    present = bool(package and package in vendor.installed)
    if unit and present:
        from kilonode.image.rootfs import systemctl

        systemctl(tree, "enable", [unit])
    return {"package": package, "version": vendor.installed.get(package or ""), "present": present,
            "unit": spec.fabric_manager_unit, "nvswitch": pool.nvswitch, "enabled": bool(unit and present)}


def nvidia_runtime_config(pool: NodePoolPlan, files: HostFiles) -> str | None:
    """The host path of the pool's rendered runtime configuration whose default runtime is the
    NVIDIA one (kilonode.render.pool renders it beside the plain one for GPU pools), found in
    the rendered files the caller gives by what it says, not by name; None when there is none."""
    for path, rendered in sorted(files.items()):
        try:
            if pool.runtime == "docker" and path.startswith("etc/docker/") and path.endswith(".json"):
                default = json.loads(rendered.content).get("default-runtime")
            elif pool.runtime == "containerd" and path.startswith("etc/containerd/") and path.endswith(".toml"):
                cri = tomllib.loads(rendered.content)["plugins"]["io.containerd.grpc.v1.cri"]
                default = cri["containerd"]["default_runtime_name"]
            else:
                continue
        except (ValueError, KeyError, TypeError, AttributeError):
            continue
        if default == NVIDIA_RUNTIME:
            return "/" + path
    return None


def runtime_dropin(pool: NodePoolPlan, config: str, containerd_binary: str) -> tuple[str, str]:
    """(path, text) of the drop-in that runs the pool's runtime with its NVIDIA configuration
    `config` (nvidia_runtime_config). Written only when the toolkit was installed: a default
    runtime naming a missing binary would fail every container (kilonode.render.pool says more)."""
    why = (
        "# kilonode: the NVIDIA runtime configuration (rendered beside the plain one), read only\n"
        "# because the image build installed the NVIDIA container toolkit.\n"
    )
    if pool.runtime == "docker":
        return DOCKER_DROPIN, (
            f"{why}[Service]\nExecStart=\nExecStart={DOCKERD_EXEC} --config-file={config} $DOCKER_OPTS\n"
        )
    return CONTAINERD_DROPIN, f"{why}[Service]\nExecStart=\nExecStart={containerd_binary} --config {config}\n"


# --- what the manifest records ------------------------------------------------------------------


def installed(tree: Path) -> dict[str, str]:
    from kilonode.image.rootfs import installed_packages

    return installed_packages(tree)


def _files(tree: Path, pattern: str) -> list[dict[str, str]]:
    entries = []
    for path in sorted(tree.glob(pattern)):
        if path.is_file() and not path.is_symlink():
            entries.append({
                "path": "/" + path.relative_to(tree).as_posix(),
                "sha256": sha256_file(path),
            })
    return entries


def boot_kernel(tree: Path) -> str | None:
    """The kernel release the image boots: /vmlinuz (what grub.cfg loads) -> boot/vmlinuz-<release>."""
    link = tree / "vmlinuz"
    if not link.is_symlink():
        return None
    name = PurePosixPath(str(link.readlink())).name
    return name.removeprefix("vmlinuz-") if name.startswith("vmlinuz-") else None


def gpu_record(
    recipe: Recipe, extras: tuple[Extra, ...], pool: NodePoolPlan, tree: Path, packages: dict[str, str],
    toolkit_packages: dict[str, str], dropin: str | None,
    agent: list[dict[str, str]], preloaded: list[dict[str, str]], runtime_config: str | None,
    device_plugin: str, vendor: VendorInstall | None = None, fabric_manager: dict[str, Any] | None = None,
) -> dict[str, Any] | None:
    """The manifest's `gpu` section; None for an image without the GPU extra (verify skips its
    GPU checks by this, and checks instead that no NVIDIA package is in the image)."""
    if "gpu" not in extras:
        return None
    kernel = boot_kernel(tree)
    driver_packages = {
        name: version for name, version in packages.items()
        if name.startswith(("nvidia-", "libnvidia-", "libcuda", "firmware-nvidia"))
        and name not in TOOLKIT_PACKAGES
    }
    dkms_version = packages.get(DRIVER_MODULE_PACKAGE, "")
    driver_version = dkms_version.split("-", 1)[0] if dkms_version else None
    modules = _files(tree, f"lib/modules/{kernel}/updates/dkms/*.ko*") if kernel else []
    return {
        "model": gpu_model(pool),
        "gpus_per_node": pool.gpus_per_node,
        "driver": {
            "version": driver_version,
            "kernel_module": DRIVER_MODULE_PACKAGE,
            "packages": driver_packages,
            # the kernel the modules were built for = the one the image boots (verify checks it)
            "kernel": kernel,
            "modules": modules,
            "dkms_modules_required": list(recipe.dkms_modules(extras)),
        },
        "gsp_firmware": {
            "package": packages.get("firmware-nvidia-gsp"),
            "files": _files(tree, f"lib/firmware/nvidia/{driver_version}/gsp*.bin") if driver_version else [],
        },
        "cuda_libraries": {
            name: packages[name] for name in ("libcudart11.0", "libcublas11", "libcublaslt11", "python3-numpy")
            if name in packages
        },
        "container_toolkit": {
            "present": TOOLKIT in (vendor or VendorInstall()).installed,
            **_toolkit_origin(vendor or VendorInstall()),
            "packages": toolkit_packages,
            # its own configuration: the env-var device list refused for unprivileged containers,
            # the volume-mounts device list accepted (written with the toolkit only)
            "config": TOOLKIT_CONFIG if toolkit_packages else None,
            # what that configuration sets (over the toolkit's defaults), as written
            "settings": dict(TOOLKIT_SETTINGS) if toolkit_packages else None,
            # the drop-in that makes the runtime read its NVIDIA configuration; None: it runs
            # runc only, and containers get no GPU
            "runtime_dropin": dropin,
            # the rendered configuration naming the NVIDIA runtime (the drop-in points at it)
            "runtime_config": runtime_config,
            # the device nodes and /dev/char links unit, and the marker it writes (written with the
            # toolkit only); None: a daemon-reload drops running containers' GPUs
            "devices_unit": NVIDIA_DEVICES_UNIT_PATH if dropin else None,
            "devices_unit_exec": _exec_lines(NVIDIA_DEVICES_UNIT_TEXT) if dropin else [],
        },
        # driver, Fabric Manager, NSCQ and the toolkit: the versions the recipe declares and the
        # versions installed (the build refused the image if driver, FM and NSCQ differ)
        "versions": _versions(recipe, extras, packages, vendor or VendorInstall()),
        "fabric_manager": fabric_manager,
        "vendor_packages": {
            "fetched": (vendor or VendorInstall()).fetched,
            "missing": (vendor or VendorInstall()).missing,
        },
        "device_plugin_image": {
            "image": device_plugin,
            "preloaded": any(i["image"] == device_plugin for i in preloaded),
            "pulled_at_first_start": device_plugin in pool.boot_images_not_preloaded,
        },
        "agent": {"pythonpath": GPU_HEALTH.pythonpath, "files": agent},
    }


def _exec_lines(unit: str) -> list[str]:
    """A unit's ExecStart=/ExecStartPost= command lines, as the manifest records them."""
    return [line.split("=", 1)[1] for line in unit.splitlines() if line.startswith(("ExecStart=", "ExecStartPost="))]


def _toolkit_origin(vendor: VendorInstall) -> dict[str, Any]:
    if TOOLKIT in vendor.installed:
        return {"version": vendor.installed[TOOLKIT], "origin": "apt repository nvidia-container-toolkit "
                "(node-image/recipe.toml, signed by the pinned key, sha256 as published)"}
    missing = [m for m in vendor.missing if m.startswith(f"{TOOLKIT} ")]
    return {"version": None, "origin": "absent: " + (missing[0] if missing else "not declared")}


def _versions(recipe: Recipe, extras: tuple[Extra, ...], packages: dict[str, str],
              vendor: VendorInstall) -> dict[str, Any]:
    equal = recipe.extras["gpu"].equal_versions if "gpu" in recipe.extras else {}
    declared = vendor.declared(recipe, extras)
    roles = {**equal, "container_toolkit": TOOLKIT}
    entries = {
        role: {"package": package, "declared": declared.get(package), "installed": packages.get(package),
               "release": vendor_apt.upstream_version(packages[package]) if package in packages else None}
        for role, package in roles.items()
    }
    releases = {entries[r]["release"] for r in equal if entries[r]["release"]}
    present = all(entries[r]["installed"] for r in equal)
    return {**entries, "driver_fm_nscq_equal": present and len(releases) == 1,
            "missing": [f"{r} ({entries[r]['package']})" for r in roles if not entries[r]["installed"]]}


# The kernel options the component contracts judge (catalog/contracts.yaml: IPoIB for the RDMA
# plugin's link types, DMA-BUF and mlx5's on-demand paging for GPUDirect RDMA), as a pattern: the
# image layer reads no catalogue, so it records the families these options belong to.
KERNEL_OPTIONS = re.compile(r"^(CONFIG_(?:INFINIBAND|MLX5|DMA_SHARED_BUFFER|DMABUF|PCI_P2PDMA)\w*)=([ym])$", re.M)


def kernel_record(tree: Path) -> dict[str, Any] | None:
    """The booted kernel's release and its config's options of KERNEL_OPTIONS (y or m; an option
    left out is not set), read from the image's /boot/config-<release>; None without a kernel."""
    kernel = boot_kernel(tree)
    config = tree / "boot" / f"config-{kernel}" if kernel else None
    if kernel is None or config is None or not config.is_file():
        return None
    loads = sorted(tree.glob("etc/modules-load.d/*.conf")) + sorted(tree.glob("usr/lib/modules-load.d/*.conf"))
    modules = sorted({line.split("#", 1)[0].strip() for path in loads if path.is_file()
                      for line in path.read_text(errors="replace").splitlines()} - {""})
    return {"release": kernel, "config": dict(KERNEL_OPTIONS.findall(config.read_text(errors="replace"))),
            # modules-load.d: what systemd-modules-load loads at every boot
            "boot_modules": modules}


def infiniband_record(recipe: Recipe, extras: tuple[Extra, ...], packages: dict[str, str]) -> dict[str, Any] | None:
    if "infiniband" not in extras:
        return None
    from kilonode.image.recipe import read_list

    wanted = read_list(recipe.extras["infiniband"].package_file)
    return {"packages": {name: packages.get(name) for name in wanted}}
