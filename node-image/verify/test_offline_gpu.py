"""GPU and InfiniBand software in the image file (read with debugfs, nothing booted).

Which checks apply is derived from the manifest, never guessed: `gpu` is null for an image
whose pool's size has no GPUs (its GPU checks are skipped saying so, and instead no NVIDIA
package may be in it); `infiniband` is null for a size without InfiniBand (then no RDMA
package may be in it). What each check reads is the image itself: its dpkg database, its
kernel, its module files, its unit drop-ins.
"""

from __future__ import annotations

import hashlib
import json
import lzma
import re
import tomllib
from typing import Any

import pytest

from kilonode.catalog.vm import nvswitch_of
from kilonode.image.disk import ImageFs
from kilonode.image.manifest import Manifest
from kilonode.plan.model import NodePoolPlan

# The driver's packages that must all be at one version: the kernel module refuses a user
# space (libcuda, NVML, nvidia-smi) or GSP firmware of another version.
# The open module (GPUDirect RDMA by DMA-BUF, node-image/packages/gpu.txt); nvidia-modprobe is a
# source package of its own, at its own version.
DRIVER_SET = (
    "nvidia-open-kernel-dkms", "nvidia-open-kernel-support", "firmware-nvidia-gsp", "nvidia-alternative",
    "nvidia-smi", "libcuda1", "libnvidia-ml1",
)
RDMA_PACKAGES = ("rdma-core", "ibverbs-utils", "infiniband-diags", "perftest")
NVIDIA_RUNTIME_BINARY = "/usr/bin/nvidia-container-runtime"


def dpkg_installed(image_fs: ImageFs) -> dict[str, str]:
    """name -> version of every installed package, from the image's own dpkg database."""
    packages: dict[str, str] = {}
    for stanza in (image_fs.read_text("/var/lib/dpkg/status") or "").split("\n\n"):
        fields = dict(re.findall(r"^([A-Za-z-]+): (.*)$", stanza, re.M))
        if fields.get("Status", "").endswith(" installed") and "Package" in fields:
            packages[fields["Package"]] = fields.get("Version", "")
    return packages


def gpu_record_module(manifest: Manifest) -> str:
    """The package that builds the driver's kernel module (the manifest names it)."""
    return str(manifest.data["gpu"]["driver"]["kernel_module"])


def readlink(image_fs: ImageFs, path: str) -> str | None:
    """A symlink's target as stored, or None for anything else (debugfs prints a fast link's
    destination in `stat`)."""
    text = image_fs._debugfs(f'stat "{path}"').stdout.decode(errors="replace")
    if not re.search(r"Type:\s+symlink", text):
        return None
    match = re.search(r'Fast link dest: "([^"]*)"', text)
    if match:
        return match.group(1)
    # a target of 60 bytes or more is kept in a data block: `cat` gives it
    return image_fs._debugfs(f'cat "{path}"').stdout.decode(errors="replace").rstrip("\0")


def resolve(image_fs: ImageFs, path: str, hops: int = 40) -> str:
    """Follow symlinks inside the image, in every component (Debian's alternatives chain links
    through /etc/alternatives and through directory links like /etc/nvidia/nvidia-<version>)."""
    done: list[str] = []
    todo = [part for part in path.split("/") if part]
    while todo:
        part = todo.pop(0)
        if part == "..":
            if done:
                done.pop()
            continue
        if part == ".":
            continue
        current = "/" + "/".join([*done, part])
        target = readlink(image_fs, current)
        if target is None:
            done.append(part)
            continue
        hops -= 1
        assert hops > 0, f"too many symlinks resolving {path}"
        if target.startswith("/"):
            done = []
        todo = [p for p in target.split("/") if p] + todo
    return "/" + "/".join(done)


def boot_kernel(image_fs: ImageFs) -> str:
    """The kernel release GRUB boots: grub.cfg loads /vmlinuz, a link to boot/vmlinuz-<release>."""
    grub = image_fs.read_text("/boot/grub/grub.cfg") or ""
    match = re.search(r"^\s*linux\s+(\S+)", grub, re.M)
    assert match, "/boot/grub/grub.cfg has no linux line"
    target = resolve(image_fs, match.group(1))
    name = target.rsplit("/", 1)[-1]
    assert name.startswith("vmlinuz-"), f"{match.group(1)} leads to {target}, not a vmlinuz-<release>"
    return name.removeprefix("vmlinuz-")


@pytest.fixture(scope="module")
def gpu(manifest: Manifest, pool: NodePoolPlan) -> dict[str, Any]:
    record = manifest.data.get("gpu")
    if record is None:
        pytest.skip(
            f"not a GPU image: the manifest's `gpu` is null (pool {pool.name}: {pool.vm_size}, "
            f"{pool.gpus_per_node} GPUs); test_no_nvidia_package_outside_gpu_images checks it has none"
        )
    return dict(record)


@pytest.fixture(scope="module")
def installed(image_fs: ImageFs) -> dict[str, str]:
    return dpkg_installed(image_fs)


def test_no_nvidia_package_outside_gpu_images(
    manifest: Manifest, pool: NodePoolPlan, installed: dict[str, str]
) -> None:
    """A pool without GPUs carries no NVIDIA software; a GPU pool's image carries the driver."""
    nvidia = sorted(n for n in installed if "nvidia" in n or n.startswith(("libcuda", "libcublas", "libcudart")))
    if manifest.data.get("gpu") is None:
        assert pool.gpus_per_node == 0, f"pool {pool.name} has {pool.gpus_per_node} GPUs but its manifest's gpu is null"
        assert nvidia == [], f"NVIDIA/CUDA packages in an image for a size without GPUs: {nvidia}"
    else:
        assert pool.gpus_per_node > 0
        assert gpu_record_module(manifest) in nvidia and "libcuda1" in nvidia, nvidia


def test_rdma_packages_only_on_infiniband_pools(
    manifest: Manifest, pool: NodePoolPlan, installed: dict[str, str]
) -> None:
    present = [p for p in RDMA_PACKAGES if p in installed]
    if manifest.data.get("infiniband") is None:
        assert not pool.infiniband, f"pool {pool.name} has InfiniBand but its manifest's infiniband is null"
        assert present == [], f"RDMA packages in an image for a size without InfiniBand: {present}"
    else:
        assert pool.infiniband
        assert present == list(RDMA_PACKAGES), f"missing RDMA packages: {sorted(set(RDMA_PACKAGES) - set(present))}"


def test_driver_set_is_one_version(gpu: dict[str, Any], installed: dict[str, str]) -> None:
    """The open kernel module, its user space and the GSP firmware at exactly one version."""
    versions = {name: installed.get(name) for name in DRIVER_SET}
    assert None not in versions.values(), f"driver packages missing: {[n for n, v in versions.items() if v is None]}"
    assert len(set(versions.values())) == 1, f"driver packages at different versions: {versions}"
    assert gpu["driver"]["version"] == next(iter(versions.values())).split("-", 1)[0]


def test_nvidia_modules_built_for_the_kernel_the_image_boots(image_fs: ImageFs, gpu: dict[str, Any]) -> None:
    """DKMS built nvidia.ko under the booted kernel's own module tree, for that kernel (its
    vermagic), and the files are the ones the manifest lists."""
    kernel = boot_kernel(image_fs)
    assert gpu["driver"]["kernel"] == kernel, f"manifest says {gpu['driver']['kernel']}, the image boots {kernel}"
    assert image_fs.listdir("/lib/modules") == [kernel], f"module trees: {image_fs.listdir('/lib/modules')}"
    directory = f"/lib/modules/{kernel}/updates/dkms"
    names = image_fs.listdir(directory)
    for module in gpu["driver"]["dkms_modules_required"]:
        assert any(n.split(".ko", 1)[0] == module for n in names), f"no {module}.ko in {directory}: {names}"
    listed = {m["path"]: m["sha256"] for m in gpu["driver"]["modules"]}
    assert set(listed) == {f"{directory}/{n}" for n in names if ".ko" in n}, (listed, names)
    # the driver itself: the first module the recipe requires (Debian: nvidia-current.ko)
    driver = gpu["driver"]["dkms_modules_required"][0]
    nvidia = next(n for n in names if n.split(".ko", 1)[0] == driver)
    data = image_fs.read(f"{directory}/{nvidia}") or b""
    assert hashlib.sha256(data).hexdigest() == listed[f"{directory}/{nvidia}"]
    if nvidia.endswith(".xz"):
        data = lzma.decompress(data)
    match = re.search(rb"vermagic=(\S+)", data)
    assert match, f"{nvidia} has no vermagic"
    built_for = match.group(1).decode()
    assert built_for == kernel, f"{nvidia} was built for {built_for}, the image boots {kernel}"
    # depmod ran for that kernel: modprobe finds the module by name
    deps = image_fs.read_text(f"/lib/modules/{kernel}/modules.dep") or ""
    assert f"updates/dkms/{nvidia}:" in deps, f"{nvidia} is not in modules.dep: modprobe nvidia would not find it"


def test_modprobe_nvidia_loads_the_built_module(image_fs: ImageFs, gpu: dict[str, Any]) -> None:
    """nvidia-modprobe, nvidia-smi and the device plugin load `nvidia`: Debian's modprobe.d
    alias (an alternatives link) must map it to the module DKMS built."""
    conf = resolve(image_fs, "/etc/modprobe.d/nvidia.conf")
    text = image_fs.read_text(conf)
    assert text is not None, f"/etc/modprobe.d/nvidia.conf leads to {conf}, which is not in the image"
    driver = gpu["driver"]["dkms_modules_required"][0]
    # Debian: `install nvidia modprobe -i nvidia-current $CMDLINE_OPTS` (or an alias)
    loads = re.findall(r"^install\s+nvidia\s+modprobe\s+-i\s+(\S+)", text, re.M)
    loads += re.findall(r"^alias\s+nvidia\s+(\S+)", text, re.M)
    assert loads == [driver], f"{conf}: `modprobe nvidia` loads {loads}, not {driver}"
    blacklist = image_fs.read_text(resolve(image_fs, "/etc/modprobe.d/nvidia-blacklists-nouveau.conf")) or ""
    assert re.search(r"^blacklist\s+nouveau", blacklist, re.M), "nouveau is not blacklisted"


def test_nvidia_smi_present(image_fs: ImageFs, gpu: dict[str, Any]) -> None:
    target = resolve(image_fs, "/usr/bin/nvidia-smi")
    stat = image_fs.stat(target)
    assert stat is not None and stat["type"] == "regular", f"/usr/bin/nvidia-smi -> {target}: not a file ({stat})"
    assert int(stat["mode"], 8) & 0o111, f"{target} is not executable"


def test_gsp_firmware_for_the_driver_version(image_fs: ImageFs, gpu: dict[str, Any]) -> None:
    """The open module loads the GSP firmware of its own version from /lib/firmware/nvidia/<version>/."""
    version = gpu["driver"]["version"]
    names = image_fs.listdir(f"/lib/firmware/nvidia/{version}")
    # 535: gsp_tu10x.bin (Turing) and gsp_ga10x.bin (Ampere, Ada, Hopper)
    assert {"gsp_ga10x.bin", "gsp_tu10x.bin"} <= set(names), f"/lib/firmware/nvidia/{version}: {names}"
    for entry in gpu["gsp_firmware"]["files"]:
        data = image_fs.read(entry["path"])
        assert data and hashlib.sha256(data).hexdigest() == entry["sha256"], entry["path"]


def test_cuda_libraries_for_the_active_check(image_fs: ImageFs, gpu: dict[str, Any], installed: dict[str, str]) -> None:
    """The agent's active check loads cuBLAS and the CUDA runtime by soname through ctypes."""
    for package in ("libcudart11.0", "libcublas11", "python3-numpy"):
        assert package in installed, f"{package} not installed"
    libs = image_fs.listdir("/usr/lib/x86_64-linux-gnu")
    for soname in ("libcudart.so.11.0", "libcublas.so.11", "libcuda.so.1", "libnvidia-ml.so.1"):
        assert soname in libs, f"{soname} not in /usr/lib/x86_64-linux-gnu"


def runtime_dropins(image_fs: ImageFs, pool: NodePoolPlan) -> dict[str, str]:
    unit = "docker.service" if pool.runtime == "docker" else "containerd.service"
    directory = f"/etc/systemd/system/{unit}.d"
    return {f"{directory}/{n}": image_fs.read_text(f"{directory}/{n}") or "" for n in image_fs.listdir(directory)}


def test_runtime_names_nvidia_runtime_iff_toolkit_placed(
    image_fs: ImageFs, gpu: dict[str, Any], pool: NodePoolPlan
) -> None:
    """With the toolkit, the runtime starts on the configuration whose default runtime is
    nvidia, and that runtime's binary is in the image; without it, nothing points the runtime
    there (a default runtime naming a missing binary would fail every container)."""
    toolkit = gpu["container_toolkit"]
    config_path = toolkit["runtime_config"]
    naming = {p: t for p, t in runtime_dropins(image_fs, pool).items() if config_path in t}
    if not toolkit["present"]:
        assert naming == {}, f"the toolkit is absent but {sorted(naming)} start the runtime on {config_path}"
        assert image_fs.stat(NVIDIA_RUNTIME_BINARY) is None
        plain_path = "/etc/docker/daemon.json" if pool.runtime == "docker" else "/etc/containerd/config.toml"
        plain = image_fs.read_text(plain_path)
        assert plain is not None and "nvidia" not in plain, "the plain runtime config names the NVIDIA runtime"
        return
    assert list(naming) == [toolkit["runtime_dropin"]], naming
    exec_lines = [line for line in naming[toolkit["runtime_dropin"]].splitlines() if line.startswith("ExecStart=")]
    assert exec_lines[0] == "ExecStart=" and config_path in exec_lines[-1], exec_lines
    assert (image_fs.stat(NVIDIA_RUNTIME_BINARY) or {}).get("type") == "regular", f"{NVIDIA_RUNTIME_BINARY} missing"
    text = image_fs.read_text(config_path) or ""
    if pool.runtime == "docker":
        config = json.loads(text)
        assert config["default-runtime"] == "nvidia"
        assert config["runtimes"]["nvidia"]["path"] == NVIDIA_RUNTIME_BINARY
    else:
        containerd = tomllib.loads(text)["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]
        assert containerd["default_runtime_name"] == "nvidia"
        assert containerd["runtimes"]["nvidia"]["options"]["BinaryName"] == NVIDIA_RUNTIME_BINARY


def wants_links(image_fs: ImageFs, unit: str) -> list[str]:
    """Every /etc/systemd/system/<target>.wants/<unit> link in the image (what `enable` made)."""
    return [f"/etc/systemd/system/{d}/{unit}" for d in image_fs.listdir("/etc/systemd/system")
            if d.endswith(".wants") and unit in image_fs.listdir(f"/etc/systemd/system/{d}")]


def test_fabric_manager_enabled_on_nvswitch_sizes(
    image_fs: ImageFs, gpu: dict[str, Any], pool: NodePoolPlan, installed: dict[str, str]
) -> None:
    """On a size whose GPUs are joined by NVSwitch (the size catalogue, not the manifest, says
    which), Fabric Manager is installed and its unit enabled; on any other size it is not
    enabled. An image built without it (--allow-incomplete) must say so in its manifest."""
    fabric_manager = gpu["fabric_manager"]
    package, unit = fabric_manager["package"], fabric_manager["unit"]
    links = wants_links(image_fs, unit)
    if package not in installed:
        assert links == [], f"{unit} enabled but {package} is not installed"
        assert any(m.startswith(f"{package} ") for m in gpu["vendor_packages"]["missing"]), \
            f"{package} is absent and the manifest does not list it missing"
        return
    if nvswitch_of(pool.vm_size):
        assert links, f"{pool.vm_size} has NVSwitch: {unit} must be enabled (CUDA cannot initialise without it)"
        assert resolve(image_fs, links[0]).endswith(f"/{unit}"), links
    else:
        assert links == [], f"{pool.vm_size} has no NVSwitch, yet {unit} is enabled: {links}"


def test_driver_fabric_manager_and_nscq_are_one_release(gpu: dict[str, Any], installed: dict[str, str]) -> None:
    """From the image's own dpkg database: the driver's kernel module package, Fabric Manager and
    NSCQ (those installed) have one upstream version; the manifest's record agrees."""
    versions = gpu["versions"]
    releases = {}
    for role in ("driver", "fabric_manager", "nscq"):
        package = versions[role]["package"]
        if package in installed:
            release = installed[package].split(":", 1)[-1].rsplit("-", 1)[0]
            releases[role] = release
            assert versions[role]["installed"] == installed[package], (role, package)
    assert len(set(releases.values())) <= 1, f"driver, Fabric Manager and NSCQ differ: {releases}"
    assert versions["driver_fm_nscq_equal"] == (len(releases) == 3)


def test_gpu_health_agent_delivered_not_enabled(image_fs: ImageFs, gpu: dict[str, Any]) -> None:
    """kilonode.gpu is importable from the unit's PYTHONPATH; the unit is installed but left to
    the pool's cloud-init to start (enabled in the image, it would run before its config exists)."""
    pythonpath = gpu["agent"]["pythonpath"]
    assert "agent.py" in image_fs.listdir(f"{pythonpath}/kilonode/gpu")
    # what the pool's kilonode-gpu-health-metrics.socket runs per scrape (kilonode.render.gpu_metrics)
    assert "metrics.py" in image_fs.listdir(f"{pythonpath}/kilonode/gpu")
    assert image_fs.stat(f"{pythonpath}/kilonode/__init__.py") is not None
    unit = "kilonode-gpu-health.service"
    assert image_fs.stat(f"/etc/systemd/system/{unit}") is not None, f"{unit} not in the image"
    for wants in image_fs.listdir("/etc/systemd/system"):
        if wants.endswith((".wants", ".requires")):
            assert unit not in image_fs.listdir(f"/etc/systemd/system/{wants}"), f"{unit} enabled in {wants}"


def test_infiniband_images_boot_a_kernel_with_ipoib_and_load_it(
    image_fs: ImageFs, manifest: Manifest, pool: NodePoolPlan
) -> None:
    """The RDMA device plugin's link-type selector sees an HCA only through its IPoIB netdev
    (catalog/contracts.yaml rdmaSharedDevicePlugin): the booted kernel has ib_ipoib and the
    image loads it at boot; the manifest records the kernel's options preflight --images judges."""
    if not pool.infiniband:
        pytest.skip(f"pool {pool.name} has no InfiniBand: no RDMA plugin runs there")
    kernel = boot_kernel(image_fs)
    record = manifest.data["kernel"]
    assert record["release"] == kernel and record["config"].get("CONFIG_INFINIBAND_IPOIB") in {"y", "m"}, record
    modules = image_fs.read_text(f"/lib/modules/{kernel}/modules.dep") or ""
    assert re.search(r"^kernel/drivers/infiniband/ulp/ipoib/ib_ipoib\.ko[^:]*:", modules, re.M), \
        f"{kernel} has no ib_ipoib module"
    loads = [line.strip() for d in ("/etc/modules-load.d",) for name in image_fs.listdir(d) if name.endswith(".conf")
             for line in (image_fs.read_text(f"{d}/{name}") or "").splitlines()]
    assert "ib_ipoib" in loads, f"no modules-load.d file loads ib_ipoib: {loads}"


def test_the_devices_unit_comes_with_the_toolkit(image_fs: ImageFs, gpu: dict[str, Any]) -> None:
    """With the toolkit: kilonode-nvidia-devices.service makes the /dev/char links (nvidia-ctk)
    and the device plugin's ready marker, and is enabled; without it, it is absent (its
    nvidia-ctk would be missing)."""
    toolkit = gpu["container_toolkit"]
    unit = "/etc/systemd/system/kilonode-nvidia-devices.service"
    if not toolkit["present"]:
        assert image_fs.stat(unit) is None and toolkit.get("devices_unit") is None
        return
    text = image_fs.read_text(unit) or ""
    assert "nvidia-ctk system create-dev-char-symlinks --create-all" in text, text
    assert "/run/kilonode/nvidia/ready" in text and toolkit["devices_unit"] == unit
    assert wants_links(image_fs, "kilonode-nvidia-devices.service"), "kilonode-nvidia-devices.service is not enabled"
