"""A GPU + InfiniBand pool's image, built for real: research-7500's h100-ib pool
(Standard_ND96isr_H100_v5: 8 H100, InfiniBand), the cheapest shipped pool that has both.

Its base (docker+gpu+infiniband: the NVIDIA driver DKMS built for the image's kernel, GSP
firmware, CUDA's runtime and cuBLAS, the RDMA user space) comes from the cache that
`make test-artefacts` filled (`kilonode image prepare --stack research-7500`). The image is
read offline by the verify suite (nothing here has a GPU to boot it with), its manifest is
checked, and a seeded defect (a runtime drop-in naming the NVIDIA runtime in an image without
the toolkit) must be named by its check; and the control-plane image is checked for the taint
controller. The toolkit comes only from NVIDIA's apt repository (unreachable here), so the
build's installed-toolkit branch is not built here.
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest

from kilonode.cli.image import image_inputs
from kilonode.image import gpu as accel
from kilonode.image.build import BuildResult, build_image
from kilonode.image.disk import ImageFs
from kilonode.image.manifest import Manifest
from kilonode.image.recipe import load_recipe
from kilonode.image.verify import VerifyReport, verify_image
from kilonode.node.ship import GPU_HEALTH
from tests.conftest import module_workdir

pytestmark = pytest.mark.slow

GPU_CHECKS = {
    "test_no_nvidia_package_outside_gpu_images",
    "test_rdma_packages_only_on_infiniband_pools",
    "test_driver_set_is_one_version",
    "test_nvidia_modules_built_for_the_kernel_the_image_boots",
    "test_nvidia_smi_present",
    "test_modprobe_nvidia_loads_the_built_module",
    "test_gsp_firmware_for_the_driver_version",
    "test_cuda_libraries_for_the_active_check",
    "test_runtime_names_nvidia_runtime_iff_toolkit_placed",
    "test_gpu_health_agent_delivered_not_enabled",
    "test_fabric_manager_enabled_on_nvswitch_sizes",
    "test_driver_fabric_manager_and_nscq_are_one_release",
}


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield from module_workdir(tmp_path_factory, "gpu-image")


@pytest.fixture(scope="module")
def built(work: Path) -> BuildResult:
    return build_image(image_inputs("research-7500", "h100-ib"), work / "out", allow_incomplete=True)


@pytest.fixture(scope="module")
def manifest(built: BuildResult) -> Manifest:
    return Manifest.load(built.manifest)


def outcomes(report: VerifyReport) -> dict[str, str]:
    """check name (parameters dropped) -> passed/failed/skipped, from the merged JUnit XML."""
    found: dict[str, str] = {}
    for case in ET.parse(report.junit).getroot().iter("testcase"):
        name = re.sub(r"\[.*\]$", "", case.get("name", ""))
        tags = {child.tag for child in case}
        outcome = "failed" if tags & {"failure", "error"} else "skipped" if "skipped" in tags else "passed"
        if found.get(name) != "failed":
            found[name] = outcome
    return found


def test_the_manifest_records_the_gpu_software(built: BuildResult, manifest: Manifest) -> None:
    data = manifest.data
    assert data["inputs"]["base"] == "docker+gpu+infiniband" and data["inputs"]["extras"] == ["gpu", "infiniband"]
    assert data["disk"]["size_bytes"] == load_recipe().disk_size_mib << 20
    gpu = data["gpu"]
    assert gpu["model"] == "NVIDIA H100 80GB" and gpu["gpus_per_node"] == 8
    driver = gpu["driver"]
    assert driver["version"] == "535.261.03" and driver["kernel_module"] == "nvidia-open-kernel-dkms"
    assert {driver["packages"][p] for p in ("nvidia-open-kernel-dkms", "libcuda1", "nvidia-smi",
                                            "firmware-nvidia-gsp")} == {"535.261.03-1"}
    # the InfiniBand extra boots Debian's generic kernel (IPoIB: recipe.toml [extras.infiniband.kernel])
    assert re.fullmatch(r"6\.1\.0-\d+-amd64", driver["kernel"]), driver["kernel"]
    modules = {m["path"].rsplit("/", 1)[-1].split(".ko")[0] for m in driver["modules"]}
    assert {"nvidia-current-open", "nvidia-current-open-uvm"} <= modules, modules
    assert all(m["path"].startswith(f"/lib/modules/{driver['kernel']}/updates/dkms/") for m in driver["modules"])
    assert {f["path"].rsplit("/", 1)[-1] for f in gpu["gsp_firmware"]["files"]} >= {"gsp_ga10x.bin", "gsp_tu10x.bin"}
    assert {"libcudart11.0", "libcublas11", "python3-numpy"} <= set(gpu["cuda_libraries"])
    # no toolkit can be had here: absent, saying what the node lacks, and no runtime drop-in
    toolkit = gpu["container_toolkit"]
    assert toolkit["present"] is False and toolkit["runtime_dropin"] is None and toolkit["packages"] == {}
    assert toolkit["origin"].startswith("absent: nvidia-container-toolkit 1.17.8-1 (apt repository ")
    assert "no --fetch" in toolkit["origin"] and toolkit["config"] is None
    # Fabric Manager, NSCQ and the toolkit come from NVIDIA's apt repositories, unreachable here:
    # listed missing (the build without --allow-incomplete refuses the image, naming them)
    missing = " ".join(gpu["vendor_packages"]["missing"])
    for package in ("nvidia-fabricmanager-535", "libnvidia-nscq-535", "nvidia-container-toolkit",
                    "libnvidia-container1"):
        assert package in missing, package
    versions = gpu["versions"]
    assert versions["driver"]["installed"] == "535.261.03-1" and versions["driver"]["release"] == "535.261.03"
    assert versions["fabric_manager"]["declared"] == "535.261.03-1" and versions["fabric_manager"]["installed"] is None
    assert versions["nscq"]["declared"] == "535.261.03-1" and versions["container_toolkit"]["declared"] == "1.17.8-1"
    assert versions["driver_fm_nscq_equal"] is False
    assert gpu["fabric_manager"] == {"package": "nvidia-fabricmanager-535", "version": None, "present": False,
                                     "unit": "nvidia-fabricmanager.service", "nvswitch": True, "enabled": False}
    assert toolkit["runtime_config"] == "/etc/docker/daemon-nvidia.json"
    plugin = gpu["device_plugin_image"]
    if plugin is not None:  # named by the plan (components.device_plugin_image)
        assert plugin["image"].startswith("nvcr.io/nvidia/k8s-device-plugin:")
        assert plugin["preloaded"] or plugin["pulled_at_first_start"]
    assert data["infiniband"] == {"packages": {p: data["packages"][p] for p in
                                               ("rdma-core", "ibverbs-utils", "infiniband-diags", "perftest")}}
    agent = {f["path"] for f in data["gpu_agent"]["files"]}
    assert f"{GPU_HEALTH.machine_path}/agent.py" in agent and f"{GPU_HEALTH.machine_path}/__init__.py" in agent
    assert any(a["path"] == "/etc/systemd/system/kilonode-gpu-health.service" and a["source"] == "recipe:gpu"
               for a in data["artefacts"])
    # the toolkit has one source, NVIDIA's apt repository: no binaries.toml component for it
    assert not [b for b in data["binaries"] + data["other_binaries"] if b["name"] == accel.TOOLKIT]
    # ND H100 v5's NCCL topology (binaries.toml nccl-ndv5): pinned, not downloaded here
    topo = next(b for b in data["other_binaries"] if b["name"] == "nccl-topology-ndv5")
    assert topo["present"] is False and topo["version"] == "2026.7.29"


def test_offline_verify_runs_every_gpu_check_and_passes(built: BuildResult, work: Path) -> None:
    report = verify_image(built.raw, workdir=work / "verify", boot=False)
    assert report.passed, report.failures
    seen = outcomes(report)
    assert {name: seen.get(name) for name in GPU_CHECKS} == dict.fromkeys(GPU_CHECKS, "passed")
    summary = json.loads((work / "verify" / "verify-summary.json").read_text())
    assert summary["counts"]["offline"].get("failed", 0) == 0


def test_a_runtime_pointed_at_a_missing_nvidia_runtime_is_named(
    built: BuildResult, manifest: Manifest, work: Path
) -> None:
    """Seeded: the docker drop-in the build writes only with the toolkit, in an image without it
    (every container, the pause container included, would fail to start)."""
    pool = manifest.pool
    path, text = accel.runtime_dropin(pool, manifest.data["gpu"]["container_toolkit"]["runtime_config"],
                                      "/usr/bin/containerd")
    fs = ImageFs(built.raw)
    fs.write(path, text.encode())
    try:
        report = verify_image(built.raw, workdir=work / "verify-defect", boot=False)
    finally:
        fs.remove(path)
    assert not report.passed
    failed = {f.split(" — ")[0] for f in report.failures}
    assert failed == {"offline: test_offline_gpu::test_runtime_names_nvidia_runtime_iff_toolkit_placed"}, (
        report.failures
    )


def test_the_control_plane_image_carries_the_taint_controller(work: Path) -> None:
    """The apiservers run the GPU health taint controller: kilonode.gpu is in their image, and
    nothing of the GPU pools' software is."""
    result = build_image(image_inputs("research-7500", None, "control-plane"), work / "control-plane",
                         allow_incomplete=True)
    data = Manifest.load(result.manifest).data
    assert data["gpu"] is None and data["infiniband"] is None and data["inputs"]["extras"] == []
    files = {f["path"] for f in data["gpu_agent"]["files"]}
    assert {f"{GPU_HEALTH.machine_path}/controller.py", f"{GPU_HEALTH.pythonpath}/kilonode/__init__.py"} <= files
    assert not [p for p in data["packages"] if "nvidia" in p], "NVIDIA packages in the control-plane image"
    fs = ImageFs(result.raw)
    for path in files:
        assert fs.stat(path) is not None, path
    assert fs.stat("/etc/systemd/system/kilonode-gpu-health.service") is None, "the node agent's unit is for GPU pools"
