"""gpu-runtime: each GPU pool's image holds one driver release with Fabric Manager and the
container toolkit, and its container runtime and the device plugin hand a pod its GPUs.

Followed for every GPU pool (a size with GPUs in the catalogue), from what its image will hold
to what a pod gets:

1. the image recipe for the pool (node-image/recipe.toml with its package lists, for the
   pool's runtime and extras) declares the driver (`[extras.gpu.vendor] equal_versions`'
   driver package, node-image/packages/gpu.txt), Fabric Manager and NSCQ (on NVSwitch sizes;
   NVIDIA's apt repository) and the four container toolkit packages
   (kilonode.image.gpu.TOOLKIT_PACKAGES), each at one exact Debian version: a package with
   none, or with a glob, is whatever apt finds on the day of the build;
2. the driver, Fabric Manager and NSCQ are one release (the same upstream version, compared by
   kilonode.image.vendor_apt.version_problems, the function the image build refuses an image
   with): Fabric Manager refuses to start, and NSCQ to load, against another driver;
3. on an NVSwitch size (the plan's `nvswitch`, from the size catalogue) the image build
   enables the Fabric Manager unit (kilonode.image.gpu.fabric_manager_to_enable; with
   `--images`, the built manifest's `gpu.fabric_manager.enabled`): without it CUDA cannot
   initialise on the node (cudaErrorSystemNotReady, 802). Enabled on a size without NVSwitch,
   nv-fabricmanager finds no NVSwitch and exits 1 at every boot (NV_WARN_NOTHING_TO_DO,
   NVIDIA/gpu-operator#610): a `warn`, since nothing of the node's bring-up waits for the unit
   and CUDA needs no Fabric Manager there, but every node reports a failed unit;
4. the toolkit's config (kilonode.image.gpu.TOOLKIT_SETTINGS over the upstream defaults,
   kilonode.plan.wellknown.TOOLKIT_DEFAULTS) refuses NVIDIA_VISIBLE_DEVICES from unprivileged
   containers: with the NVIDIA runtime as every container's default, any pod that sets the
   variable would see every GPU of its node, requested or not; and the device plugin
   DaemonSet of the recorded graph hands the device list over by a strategy
   (`DEVICE_LIST_STRATEGY`, a comma list) that config accepts
   (kilonode.plan.wellknown.DEVICE_LIST_TOOLKIT_KEY), or GPU pods start without GPUs;
5. on every host of the pool, the rendered runtime configuration the image build points the
   runtime at (kilonode.image.gpu.nvidia_runtime_config: Docker's daemon-nvidia.json or
   containerd's config-nvidia.toml) makes the NVIDIA runtime the default, names its binary
   (Docker's `runtimes.<default>.path`, containerd's runc-v2 `options.BinaryName`), and that
   binary is one the image installs (node-image/binaries.toml `[debian]`, the toolkit's
   packages); the build's drop-in (kilonode.image.gpu.runtime_dropin) is for the pool's
   runtime unit and starts it on that configuration. With `--images`, a built image without
   the toolkit is a break: its runtime keeps runc and no container gets a GPU.

Seeded breaks (tests/preflight/test_gpu_runtime.py), each named under this check: the driver
left out of packages/gpu.txt or unversioned; Fabric Manager dropped from its repository
(NVSwitch pools break, research-2500's PCIe NC A100 v4 pool does not); NSCQ named nowhere; a
toolkit package at a glob version; Fabric Manager of an older release than the driver; no
Fabric Manager unit in the recipe, a built manifest with it not enabled, and it enabled on a
size without NVSwitch (the warning); the env-var device list accepted; DEVICE_LIST_STRATEGY
envvar, cdi-annotations or unset, and volume mounts left at the toolkit's default; no device
plugin DaemonSet; daemon-nvidia.json with runc as default, without `runtimes.nvidia`, or naming
a binary no package installs; containerd's BinaryName likewise; the toolkit-base package
dropped; the drop-in written for another unit; a built image without the toolkit.
"""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Mapping
from functools import cache
from typing import Any

from kilonode.image import gpu as image_gpu
from kilonode.image import vendor_apt
from kilonode.image.needs import SERVICE_PATH, Catalog, ImageSpec, load_catalog, providers
from kilonode.image.recipe import Extra, Recipe, load_recipe
from kilonode.k8s import gpu as k8s_gpu
from kilonode.plan import wellknown
from kilonode.plan.model import NodePoolPlan
from kilonode.preflight.model import Finding, Inputs, Resource
from kilonode.render.files import RenderedFile
from kilonode.render.pool import runtime_unit

NAME = "gpu-runtime"
TITLE = ("GPU pools: driver, Fabric Manager, NSCQ and toolkit pinned as one release; the runtime and the device "
         "plugin hand a pod its GPUs")
CRI = "io.containerd.grpc.v1.cri"
RUNC_V2 = "io.containerd.runc.v2"  # the shim that honours options.BinaryName (containerd 1.6/1.7)


@cache
def _data() -> tuple[Recipe, Catalog]:
    recipe = load_recipe()
    return recipe, load_catalog(recipe)


def check(inputs: Inputs) -> list[Finding]:
    pools = [p for p in inputs.plan.node_pools if p.gpus_per_node > 0]
    if not pools:
        return []
    recipe, catalog = _data()
    findings = []
    for pool in pools:
        extras = pool.image_extras
        manifest = next((m for m in (inputs.images or {}).values() if m.get("pool") == pool.name), None)
        findings += _packages(recipe, pool, extras)
        findings += _one_release(recipe, pool, extras)
        findings += _fabric_manager(recipe, pool, extras, manifest)
        spec = ImageSpec(pool.binary_roles, pool.runtime, extras,
                         pool.kubernetes_version or inputs.plan.kubernetes_version)
        for host in (h for h in inputs.hosts() if h in {pool.role(), *(pool.role(t) for t in pool.teams)}):
            findings += _runtime(inputs.host_files(host), host, pool, providers(catalog, recipe, spec))
        findings += _toolkit_built(pool, manifest)
    return findings + _device_list(inputs)


# --- 1, 2: the recipe declares each package at one exact version, driver/FM/NSCQ one release ------


def _required(recipe: Recipe, pool: NodePoolPlan) -> list[tuple[str, str | None]]:
    """(what, package) the pool's image must hold; package None: the recipe names none."""
    equal = recipe.extras["gpu"].equal_versions
    roles = [vendor_apt.DRIVER, *((vendor_apt.FABRIC_MANAGER, vendor_apt.NSCQ) if pool.nvswitch else ())]
    return [*((role, equal.get(role)) for role in roles),
            *(("container toolkit", package) for package in image_gpu.TOOLKIT_PACKAGES)]


def _packages(recipe: Recipe, pool: NodePoolPlan, extras: tuple[Extra, ...]) -> list[Finding]:
    declared = recipe.declared_packages(pool.runtime, extras)
    where = f"{pool.role()}: image recipe"
    findings = []
    for what, package in _required(recipe, pool):
        entry = declared.get(package or "")
        if package is None:
            findings.append(Finding(NAME, "break", where, f"the recipe names no {what} package: {_without(what)}",
                                    f"name it in node-image/recipe.toml [extras.gpu.vendor] equal_versions.{what}"))
        elif entry is None:
            findings.append(Finding(
                NAME, "break", where, f"{what} {package} is in no package list or vendor repository of the "
                f"{'+'.join((pool.runtime, *extras))} image: {_without(what)}",
                f"add {package}=<version> to {recipe.shown(recipe.extras['gpu'].package_file)} or to the packages "
                "of a repository node-image/recipe.toml [extras.gpu.vendor] lists"))
        elif not vendor_apt.exact_version(entry.version):
            findings.append(Finding(
                NAME, "break", where, f"{what} {package} is not pinned to an exact version "
                f"({entry.version or 'none'}, {entry.where}): each build installs whatever apt finds that day, and "
                "the driver, Fabric Manager, NSCQ and the toolkit drift apart between images",
                f"pin it as {package}=<exact Debian version> in {entry.where}"))
    return findings


def _without(what: str) -> str:
    """What a node whose image lacks this piece does."""
    return {
        vendor_apt.DRIVER: "no GPU is visible on the node",
        vendor_apt.FABRIC_MANAGER: "on an NVSwitch size CUDA cannot initialise (cudaErrorSystemNotReady, 802)",
        vendor_apt.NSCQ: "Fabric Manager's and the GPU tools' NVSwitch queries fail",
    }.get(what, "the runtime keeps runc and no container gets a GPU")


def _one_release(recipe: Recipe, pool: NodePoolPlan, extras: tuple[Extra, ...]) -> list[Finding]:
    declared = recipe.declared_packages(pool.runtime, extras)
    equal = recipe.extras["gpu"].equal_versions
    versions = {p: d.version for p in equal.values() if (d := declared.get(p)) and d.version}
    return [Finding(NAME, "break", f"{pool.role()}: image recipe", problem,
                    "pin the driver (node-image/packages/gpu.txt) and Fabric Manager and NSCQ (node-image/recipe.toml "
                    "[apt_repositories.*.packages]) to one driver release, and move them together")
            for problem in vendor_apt.version_problems(versions, equal)]


# --- 3: Fabric Manager's unit on NVSwitch sizes ---------------------------------------------------


def _fabric_manager(recipe: Recipe, pool: NodePoolPlan, extras: tuple[Extra, ...],
                    manifest: Mapping[str, Any] | None) -> list[Finding]:
    unit = recipe.extras["gpu"].fabric_manager_unit or "the Fabric Manager unit"
    built = ((manifest or {}).get("gpu") or {}).get("fabric_manager")
    if manifest is not None and built is not None:
        enabled, source = bool(built.get("enabled")), f"the built image {manifest.get('name')} (--images)"
    else:
        enabled = image_gpu.fabric_manager_to_enable(recipe, extras, pool) is not None
        source = "the image build (kilonode.image.gpu.fabric_manager_to_enable)"
    where = f"{pool.role()}: {unit}"
    if pool.nvswitch and not enabled:
        return [Finding(NAME, "break", where,
                        f"{pool.vm_size}'s GPUs are joined by NVSwitch and {source} does not enable {unit}: CUDA "
                        "cannot initialise on its nodes (cudaErrorSystemNotReady, 802), and every GPU job fails",
                        "enable it on NVSwitch sizes: node-image/recipe.toml [extras.gpu.vendor] fabric_manager_unit "
                        "and equal_versions.fabric_manager, installed with `kilonode image build --fetch`")]
    if enabled and not pool.nvswitch:
        return [Finding(NAME, "warn", where,
                        f"{source} enables {unit} on {pool.vm_size}, which has no NVSwitch: nv-fabricmanager exits 1 "
                        "at every boot (NV_WARN_NOTHING_TO_DO); nothing waits for it and CUDA needs no Fabric Manager "
                        "here, but every node reports a failed unit",
                        "enable it on NVSwitch sizes only (kilonode.image.gpu.fabric_manager_to_enable, the plan's "
                        "nvswitch)")]
    return []


# --- 4: the toolkit's config and the device plugin's device list ------------------------------------


def _device_list(inputs: Inputs) -> list[Finding]:
    settings = {**wellknown.TOOLKIT_DEFAULTS, **image_gpu.TOOLKIT_SETTINGS}
    config = f"{image_gpu.TOOLKIT_CONFIG} (kilonode.image.gpu.TOOLKIT_SETTINGS)"
    findings = []
    if settings[wellknown.TOOLKIT_ENVVAR_WHEN_UNPRIVILEGED] is not False:
        findings.append(Finding(
            NAME, "break", f"GPU images: {config}",
            f"{wellknown.TOOLKIT_ENVVAR_WHEN_UNPRIVILEGED} is not false: with the NVIDIA runtime as every container's "
            "default, an unprivileged pod that sets NVIDIA_VISIBLE_DEVICES=all sees every GPU of its node, requested "
            "or not, beside the pods that were given them",
            f"set {wellknown.TOOLKIT_ENVVAR_WHEN_UNPRIVILEGED} = false in kilonode.image.gpu.TOOLKIT_SETTINGS"))
    plugins = [r for r in inputs.of_type("kubernetes:apps/v1:DaemonSet")
               if (r.inputs.get("metadata") or {}).get("name") == k8s_gpu.DAEMONSET_NAME]
    if not plugins:
        return [*findings, Finding(
            NAME, "break", "GPU pools", f"no {k8s_gpu.DAEMONSET_NAME} DaemonSet in the graph: GPU nodes register no "
            f"{wellknown.GPU_RESOURCE}, and no pod can ask for a GPU", "deploy it (kilonode.k8s.gpu.DevicePlugin)")]
    for plugin in plugins:
        strategies = _strategies(plugin)
        if not any(settings.get(wellknown.DEVICE_LIST_TOOLKIT_KEY.get(s, ""), False) for s in strategies):
            findings.append(Finding(
                NAME, "break", plugin.describe(),
                f"{k8s_gpu.DEVICE_LIST_STRATEGY_ENV}={','.join(strategies)}: the image's toolkit config takes none of "
                f"these from an unprivileged container ({config}: {_accepted(settings)}), so GPU pods start "
                "without their GPUs",
                f"set {k8s_gpu.DEVICE_LIST_STRATEGY_ENV} to {_accepted(settings)} (kilonode.k8s.gpu), or change "
                "kilonode.image.gpu.TOOLKIT_SETTINGS with it"))
    return findings


def _strategies(plugin: Resource) -> list[str]:
    """The plugin container's device-list strategies (its flag's default when the variable is unset)."""
    spec = ((plugin.inputs.get("spec") or {}).get("template") or {}).get("spec") or {}
    for container in spec.get("containers") or []:
        for env in container.get("env") or []:
            if env.get("name") == k8s_gpu.DEVICE_LIST_STRATEGY_ENV:
                return [s.strip() for s in str(env.get("value", "")).split(",") if s.strip()]
    return [k8s_gpu.DEVICE_LIST_STRATEGY_DEFAULT]


def _accepted(settings: Mapping[str, bool]) -> str:
    taken = [s for s, key in wellknown.DEVICE_LIST_TOOLKIT_KEY.items() if settings.get(key)]
    return " or ".join(taken) if taken else "no strategy"


# --- 5: the runtime runs containers with the NVIDIA runtime, whose binary the image has ----------


def _runtime(files: Mapping[str, str], host: str, pool: NodePoolPlan, have: Mapping[str, Any]) -> list[Finding]:
    config = image_gpu.nvidia_runtime_config(pool, {p: RenderedFile(t) for p, t in files.items()})
    if config is None:
        return [Finding(NAME, "break", f"{host}: {runtime_unit(pool)}",
                        f"no rendered {pool.runtime} configuration makes the {image_gpu.NVIDIA_RUNTIME} runtime the "
                        "default: the image build refuses to install the toolkit unused, and without it containers "
                        "run on runc and get no GPU",
                        "render the NVIDIA variant of the runtime configuration for GPU pools (kilonode.render.pool)")]
    name, binary = _default_runtime(pool.runtime, files[config.lstrip("/")])
    where = f"{host}: {config.lstrip('/')}"
    if binary is None:
        return [Finding(NAME, "break", where,
                        f"the default runtime {name} names no binary (Docker: runtimes.{name}.path; containerd: a "
                        f"{RUNC_V2} runtime's options.BinaryName): {runtime_unit(pool)} cannot run containers with it",
                        "name the toolkit's runtime binary there (kilonode.render.pool NVIDIA_CONTAINER_RUNTIME)")]
    paths = (binary,) if binary.startswith("/") else tuple(f"{d}/{binary}" for d in SERVICE_PATH)
    if not any(have[p].status == "ok" for p in paths if p in have):
        return [Finding(NAME, "break", where,
                        f"the default runtime {name} runs {binary}, which the image does not install: every "
                        "container of the node, the pause container and so every pod included, fails to start",
                        "name the binary the toolkit's packages install, or add its package (node-image/binaries.toml "
                        "[debian], node-image/recipe.toml)")]
    return _dropin(host, pool, config)


def _default_runtime(runtime: str, text: str) -> tuple[str, str | None]:
    """(the default runtime's name, the binary it runs) of a rendered runtime configuration."""
    if runtime == "docker":
        data = json.loads(text)
        name = str(data.get("default-runtime", ""))
        return name, ((data.get("runtimes") or {}).get(name) or {}).get("path")
    containerd = tomllib.loads(text)["plugins"][CRI]["containerd"]
    name = str(containerd.get("default_runtime_name", ""))
    entry = (containerd.get("runtimes") or {}).get(name) or {}
    return name, (entry.get("options") or {}).get("BinaryName") if entry.get("runtime_type") == RUNC_V2 else None


def _dropin(host: str, pool: NodePoolPlan, config: str) -> list[Finding]:
    """The drop-in the build writes with the toolkit starts the pool's runtime on `config`."""
    path, text = image_gpu.runtime_dropin(pool, config, "/usr/bin/containerd")
    unit = runtime_unit(pool)
    starts = re.findall(r"^ExecStart=(.+)$", text, re.M)
    # the configuration as an argument of its own (containerd --config X) or a flag's value (--config-file=X)
    reads = any(word == config or word.endswith(f"={config}") for start in starts for word in start.split())
    if path.startswith(f"/etc/systemd/system/{unit}.d/") and reads:
        return []
    return [Finding(NAME, "break", f"{host}: {path}",
                    f"the image build's drop-in does not start {unit} on {config} (it is for {path.split('/')[-2]}, "
                    f"ExecStart {starts or 'none'}): the runtime keeps its plain configuration with runc as default, "
                    "and no container gets a GPU",
                    "keep kilonode.image.gpu.runtime_dropin writing the pool's runtime unit's drop-in with the NVIDIA "
                    "configuration")]


def _toolkit_built(pool: NodePoolPlan, manifest: Mapping[str, Any] | None) -> list[Finding]:
    """A built image (--images) without the toolkit runs every container on runc."""
    toolkit = ((manifest or {}).get("gpu") or {}).get("container_toolkit")
    if manifest is None or toolkit is None or (toolkit.get("present") and toolkit.get("runtime_dropin")):
        return []
    return [Finding(NAME, "break", f"{pool.role()}: built image {manifest.get('name')}",
                    f"the image has no NVIDIA container toolkit ({toolkit.get('origin')}): its runtime keeps runc as "
                    "the default, and no container on the pool gets a GPU",
                    "build the pool's image with --fetch (NVIDIA's apt repository, node-image/recipe.toml)")]
