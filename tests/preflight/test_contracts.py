"""contracts: research-7500 meets every component contract of catalog/contracts.yaml, and each
requirement, violated in a copy of its render, graph, image recipe or built manifest, is named by
its contract and line."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from kilonode.catalog import components as catalog_components
from kilonode.catalog.contracts import Contract, contracts
from kilonode.image import gpu as image_gpu
from kilonode.plan import wellknown
from kilonode.preflight import breaks, run
from kilonode.preflight.checks import contracts as check
from kilonode.preflight.model import Finding
from tests.preflight.conftest import artefacts, inputs_of, resource

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

CHECK = ["contracts"]
PLUGIN = "nvidia-device-plugin-daemonset"


def findings(files: dict[str, str] | None = None, graph: dict[str, Any] | None = None,
             images: dict[str, Any] | None = None) -> list[Finding]:
    inputs = inputs_of("research-7500", files=files, graph=graph)
    return breaks(run(dataclasses.replace(inputs, images=images) if images is not None else inputs, CHECK))


def lines(found: list[Finding]) -> set[str]:
    """The contract lines the findings name ("devicePlugin/nvml-from-image-env")."""
    return {f.what.split("contract line ", 1)[1].split(":", 1)[0] for f in found if "contract line " in f.what}


def plugin_spec(graph: dict[str, Any]) -> dict[str, Any]:
    return resource(graph, "DaemonSet", PLUGIN)["inputs"]["spec"]["template"]["spec"]


@pytest.fixture
def recipe_kernel(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Change the image recipe the check judges: yields a function taking the recipe's replacement."""
    original = check._recipe()

    def swap(**changes: Any) -> None:
        monkeypatch.setattr(check, "_recipe", lambda: dataclasses.replace(original, **changes))

    yield original, swap


# --- the catalogue itself ---------------------------------------------------------------------------


def test_every_contract_is_read_at_the_version_its_pin_names() -> None:
    plan_version = inputs_of("research-7500").plan.kubernetes_version
    for name, contract in contracts().items():
        assert check.pinned_version(contract.pin, plan_version) == contract.version, (
            f"{name}: read at {contract.version}, pinned {check.pinned_version(contract.pin, plan_version)}: read "
            "every line again at the new version")


def test_every_requirement_has_an_evaluator_and_a_source_naming_a_version_or_a_document() -> None:
    for name, contract in contracts().items():
        for requirement in contract.requirements:
            assert requirement.kind in check.EVALUATORS, f"{name}/{requirement.id}"
            # owner/repo@tag:path, owner/repo#issue, a vendor document, or a fixture recorded here
            cited = (re.match(r"[\w.-]+/[\w.-]+[@#]", s) or "documentation" in s or "guide" in s.lower()
                     or s.startswith(("kilonode.", "../shared/")) for s in requirement.source)
            assert all(cited), f"{name}/{requirement.id}: {requirement.source}"


def test_the_shipped_stacks_meet_every_contract() -> None:
    assert findings() == []
    assert breaks(run(inputs_of("local"), CHECK)) == []  # no GPU pools: nothing applies


def test_a_contract_read_at_another_version_is_a_break(monkeypatch: pytest.MonkeyPatch) -> None:
    table = dict(contracts())
    table["devicePlugin"] = Contract.model_validate({**table["devicePlugin"].model_dump(by_alias=True),
                                                     "version": "v0.16.2"})
    monkeypatch.setattr(check, "contracts", lambda: table)
    [finding] = findings()
    assert finding.where == "catalog/contracts.yaml devicePlugin" and "read at v0.16.2" in finding.what
    assert "pins v0.17.4" in finding.what


# --- the device plugin -------------------------------------------------------------------------------


def test_an_unprivileged_plugin_relying_on_its_image_env_is_a_break() -> None:
    _, graph = artefacts("research-7500")
    caps = plugin_spec(graph)["containers"][0]["securityContext"]["capabilities"]
    assert caps["add"] == ["SYS_ADMIN"]
    del caps["add"]
    found = findings(graph=graph)
    assert lines(found) == {"devicePlugin/nvml-from-image-env"}
    assert {f.where.rsplit(" on ", 1)[1] for f in found} == {"pool-a100-ib", "pool-h100-ib"}  # each GPU pool's image
    assert "NVIDIA_VISIBLE_DEVICES=all is ignored" in found[0].what and "add SYS_ADMIN" in found[0].fix


def test_the_same_plugin_passes_where_the_toolkit_takes_the_env_var_from_anyone(
        monkeypatch: pytest.MonkeyPatch) -> None:
    _, graph = artefacts("research-7500")
    del plugin_spec(graph)["containers"][0]["securityContext"]["capabilities"]["add"]
    monkeypatch.setattr(image_gpu, "TOOLKIT_SETTINGS",
                        {**image_gpu.TOOLKIT_SETTINGS, "accept-nvidia-visible-devices-envvar-when-unprivileged": True})
    assert findings(graph=graph) == []


def test_a_plugin_that_does_not_wait_for_the_nodes_devices_is_a_break() -> None:
    _, graph = artefacts("research-7500")
    plugin_spec(graph)["initContainers"] = []
    found = findings(graph=graph)
    assert lines(found) == {"devicePlugin/driver-ready-before-start"}
    assert "no init container waits for /run/kilonode/nvidia/ready" in found[0].what


def test_an_image_unit_that_writes_another_marker_is_a_break(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(image_gpu, "NVIDIA_DEVICES_UNIT_TEXT",
                        image_gpu.NVIDIA_DEVICES_UNIT_TEXT.replace("nvidia/ready", "nvidia/done"))
    found = findings()
    assert lines(found) == {"devicePlugin/driver-ready-before-start"}
    assert {f.where for f in found} == {"pool-a100-ib: image", "pool-h100-ib: image"}


def test_a_plugin_off_the_host_network_is_a_break() -> None:
    _, graph = artefacts("research-7500")
    plugin_spec(graph)["hostNetwork"] = False
    [finding] = findings(graph=graph)
    assert lines([finding]) == {"devicePlugin/no-pod-ip"} and "pod IPs" in finding.what


# --- the toolkit's /dev/char links ---------------------------------------------------------------


def test_an_image_without_the_dev_char_links_is_a_break_where_the_runtime_uses_systemd_cgroups(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(image_gpu, "NVIDIA_DEVICES_UNIT_TEXT", image_gpu.NVIDIA_DEVICES_UNIT_TEXT.replace(
        "ExecStart=/usr/bin/nvidia-ctk system create-dev-char-symlinks", "ExecStart=/usr/bin/nvidia-ctk system x"))
    found = findings()
    assert lines(found) == {"containerToolkit/dev-char-links"}
    assert {f.where.split(":")[0].split(".")[0] for f in found} == {"pool-a100-ib", "pool-h100-ib"}
    # the kubelet's field alone on cgroupfs: inert on these Docker pools (cri-dockerd reports Docker's
    # systemd and the kubelet uses it), so runc still runs the GPU containers on systemd: still a break
    files, _ = artefacts("research-7500")
    for key in [k for k in files if k.endswith("etc/kubernetes/kubelet-config.yaml")]:
        files[key] = files[key].replace("cgroupDriver: systemd", "cgroupDriver: cgroupfs")
    assert lines(findings(files=files)) == {"containerToolkit/dev-char-links"}
    # Docker's GPU variant on cgroupfs: the line holds for the systemd driver only (its whenCgroupDriver)
    for key in [k for k in files if k.endswith("etc/docker/daemon-nvidia.json")]:
        files[key] = files[key].replace("native.cgroupdriver=systemd", "native.cgroupdriver=cgroupfs")
    assert findings(files=files) == []


def test_a_built_image_without_the_devices_unit_is_a_break() -> None:
    manifest = {"name": "research-7500-h100-ib", "pool": "h100-ib",
                "gpu": {"container_toolkit": {"present": True, "devices_unit": None, "devices_unit_exec": []}}}
    found = findings(images={manifest["name"]: manifest})
    assert lines(found) == {"containerToolkit/dev-char-links", "devicePlugin/driver-ready-before-start"}
    assert all(f.where.startswith("pool-h100-ib") for f in found)
    assert any("the built image research-7500-h100-ib" in f.what for f in found)


# --- the RDMA plugin's selector and the image's kernel ---------------------------------------------------


def test_a_link_type_selector_on_a_kernel_without_ipoib_is_a_break(recipe_kernel: Any) -> None:
    original, swap = recipe_kernel
    extras = {**original.extras, "infiniband": dataclasses.replace(original.extras["infiniband"], kernel=None)}
    swap(extras=extras)
    found = findings()
    assert "rdmaSharedDevicePlugin/link-type-needs-netdev" in lines(found)
    ipoib = [f for f in found if "link-type-needs-netdev" in f.what]
    assert {f.where for f in ipoib} == {"pool-a100-ib: image kernel", "pool-h100-ib: image kernel"}
    assert "linux-image-cloud-amd64 (catalog/kernels.yaml) is built without CONFIG_INFINIBAND_IPOIB" in ipoib[0].what


def test_ipoib_as_a_module_the_image_never_loads_is_a_break(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(check, "_boot_modules", lambda inputs, pool: set())
    found = findings()
    assert lines(found) == {"rdmaSharedDevicePlugin/link-type-needs-netdev"}
    assert "loads no ib_ipoib at boot" in found[0].what


def test_a_selector_that_needs_no_netdev_is_not_judged_against_the_kernel(recipe_kernel: Any) -> None:
    original, swap = recipe_kernel
    swap(extras={**original.extras, "infiniband": dataclasses.replace(original.extras["infiniband"], kernel=None)})
    _, graph = artefacts("research-7500")
    config = resource(graph, "ConfigMap", "rdma-devices")["inputs"]["data"]
    data = json.loads(config["config.json"])
    data["configList"][0]["selectors"] = {"vendors": ["15b3"], "deviceIDs": ["101c", "101e"]}
    config["config.json"] = json.dumps(data)
    assert "rdmaSharedDevicePlugin/link-type-needs-netdev" not in lines(findings(graph=graph))


def test_a_built_image_whose_kernel_lacks_ipoib_is_a_break() -> None:
    manifest = {"name": "research-7500-a100-ib", "pool": "a100-ib",
                "kernel": {"release": "6.1.0-57-cloud-amd64", "config": {"CONFIG_DMA_SHARED_BUFFER": "y"}}}
    found = findings(images={manifest["name"]: manifest})
    ipoib = [f for f in found if "link-type-needs-netdev" in f.what]
    assert [f.where for f in ipoib] == ["pool-a100-ib: image kernel"]
    assert "the built image research-7500-a100-ib" in ipoib[0].what


# --- GPUDirect RDMA ----------------------------------------------------------------------------------------


def test_an_infiniband_pool_without_a_gpudirect_path_is_a_break(recipe_kernel: Any, tmp_path: Any) -> None:
    original, swap = recipe_kernel
    gpu_list = tmp_path / "gpu.txt"
    gpu_list.write_text(original.extras["gpu"].package_file.read_text().replace(
        "nvidia-open-kernel-dkms=", "nvidia-kernel-dkms="))
    swap(extras={**original.extras, "gpu": dataclasses.replace(original.extras["gpu"], package_file=gpu_list)})
    found = [f for f in findings() if "dmabuf-path" in f.what]
    assert {f.where for f in found} == {"pool-a100-ib: GPUDirect RDMA", "pool-h100-ib: GPUDirect RDMA"}
    assert "the image's GPU kernel module is nvidia-kernel-dkms, not nvidia-open-kernel-dkms" in found[0].what


def test_an_nccl_older_than_dma_buf_is_a_break(monkeypatch: pytest.MonkeyPatch) -> None:
    table = catalog_components.components()
    old = table.model_copy(update={"nccl_benchmark": table.nccl_benchmark.model_copy(update={"provides": {
        "nccl": "2.12.12"}})})
    monkeypatch.setattr(catalog_components, "components", lambda: old)
    found = findings()
    assert lines(found) == {"gpuDirectRdma/dmabuf-path"}
    assert "NCCL is 2.12.12, older than 2.13" in found[0].what


def test_a_job_image_with_an_old_rdma_core_is_a_break_and_an_unknown_one_a_warning(
        monkeypatch: pytest.MonkeyPatch) -> None:
    inputs = inputs_of("research-7500")
    # the catalogue records the 23.08 image's rdma-core (39.0, unverified: its source says so)
    assert catalog_components.components().nccl_benchmark.provides["rdma-core"] == "39.0"
    assert [f for f in run(inputs, CHECK) if f.level == "warn"] == []
    table = catalog_components.components()
    unknown = table.model_copy(update={"nccl_benchmark": table.nccl_benchmark.model_copy(update={"provides": {
        "nccl": "2.18.3"}})})
    monkeypatch.setattr(catalog_components, "components", lambda: unknown)
    [warning] = [f for f in run(inputs, CHECK) if f.level == "warn"]
    assert "rdma-core is not recorded" in warning.what and warning.where.startswith("NCCL job image")
    old = table.model_copy(update={"nccl_benchmark": table.nccl_benchmark.model_copy(update={"provides": {
        "nccl": "2.18.3", "rdma-core": "33.2"}})})
    monkeypatch.setattr(catalog_components, "components", lambda: old)
    found = findings()
    assert lines(found) == {"gpuDirectRdma/dmabuf-path"} and "rdma-core 33.2 is older than 34" in found[0].what
    assert [f for f in run(inputs, CHECK) if f.level == "warn"] == []


# --- the RDMA plugin's rescan, and the agent's hold of a booting InfiniBand GPU node ------------------------


def rdma_config(graph: dict[str, Any]) -> dict[str, Any]:
    return json.loads(resource(graph, "ConfigMap", "rdma-devices")["inputs"]["data"]["config.json"])


@pytest.mark.parametrize(("interval", "expected"), [
    (0, "periodicUpdateInterval is 0: the component never looks for devices again after its start"),
    # unset: the plugin's own 60 s (resources_manager.go:51), longer than the agents' 30 s hold
    (None, "rdmaDevicePluginRescanSeconds is 30, short of the 60 s periodicUpdateInterval"),
])
def test_an_rdma_plugin_that_never_rescans_or_outlasts_the_agents_hold_is_a_break(interval: int | None,
                                                                                   expected: str) -> None:
    _, graph = artefacts("research-7500")
    assert rdma_config(graph)["periodicUpdateInterval"] == 30
    config = rdma_config(graph)
    if interval is None:
        del config["periodicUpdateInterval"]
    else:
        config["periodicUpdateInterval"] = interval
    resource(graph, "ConfigMap", "rdma-devices")["inputs"]["data"]["config.json"] = json.dumps(config)
    found = findings(graph=graph)
    assert lines(found) == {"rdmaSharedDevicePlugin/hcas-listed-by-a-rescan"}
    assert all(expected in f.what for f in found)


def test_an_infiniband_gpu_node_released_before_a_rescan_is_a_break() -> None:
    files, _ = artefacts("research-7500")
    held = [k for k in files if k.endswith("etc/kilonode/gpu-health.json")
            and "rdmaDevicePluginRescanSeconds" in json.loads(files[k])]
    assert {k.split("/")[0].split(".")[0] for k in held} == {"pool-a100-ib", "pool-h100-ib"}
    for key in held:
        files[key] = json.dumps({k: v for k, v in json.loads(files[key]).items()
                                 if k != "rdmaDevicePluginRescanSeconds"})
    found = findings(files=files)
    assert lines(found) == {"rdmaSharedDevicePlugin/hcas-listed-by-a-rescan"}
    assert {f.where.split(":")[0] for f in found} == {k.split("/")[0] for k in held}
    assert "rdmaDevicePluginRescanSeconds is None, short of the 30 s periodicUpdateInterval" in found[0].what


# --- the NCCL job's image on H100 (NCCL 2.18.3) ------------------------------------------------------------


def with_nccl(monkeypatch: pytest.MonkeyPatch, version: str) -> None:
    """The job image's NCCL, as the catalogue would record another image's."""
    table = catalog_components.components()
    provides = {**table.nccl_benchmark.provides, "nccl": version}
    monkeypatch.setattr(catalog_components, "components", lambda: table.model_copy(update={
        "nccl_benchmark": table.nccl_benchmark.model_copy(update={"provides": provides})}))


def test_an_h100_job_under_nccl_2_18_3_with_nvls_or_the_hopper_flush_on_is_a_break(
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert catalog_components.components().nccl_benchmark.provides["nccl"] == "2.18.3"
    monkeypatch.setattr(wellknown, "NCCL_FAMILY_POD_SETTINGS", {})
    found = findings()
    assert lines(found) == {"ncclBenchmark/nvls-off-before-2-18-5", "ncclBenchmark/flush-off-before-2-19-1"}
    # the H100 pool only: NVLS and the Hopper flush do not apply to A100 (ndv4)
    assert {f.where for f in found} == {"pool-h100-ib: NCCL job environment (ndv5)"}
    assert any("NCCL is 2.18.3, older than 2.18.5, and in the job generated for a gang on Standard_ND96isr_H100_v5 "
               "NCCL_NVLS_ENABLE is unset" in f.what for f in found)
    # one setting back: only the other line
    monkeypatch.setattr(wellknown, "NCCL_FAMILY_POD_SETTINGS", {"ndv5": (("NCCL_NVLS_ENABLE", "0"),)})
    assert lines(findings()) == {"ncclBenchmark/flush-off-before-2-19-1"}
    # NVLS asked for by name is no better than the default
    monkeypatch.setattr(wellknown, "NCCL_FAMILY_POD_SETTINGS", {"ndv5": (
        ("NCCL_NVLS_ENABLE", "1"), ("NCCL_NET_FORCE_FLUSH", "0"))})
    [finding] = findings()
    assert "NCCL_NVLS_ENABLE is '1'" in finding.what


@pytest.mark.parametrize(("nccl", "expected"), [
    ("2.18.5", {"ncclBenchmark/flush-off-before-2-19-1"}),  # 8ed014ba's release: NVLS fixed, the flush not yet
    ("2.19.3", set()),
])
def test_an_nccl_with_the_fixes_is_not_judged_on_them(monkeypatch: pytest.MonkeyPatch, nccl: str,
                                                       expected: set[str]) -> None:
    monkeypatch.setattr(wellknown, "NCCL_FAMILY_POD_SETTINGS", {})
    with_nccl(monkeypatch, nccl)
    assert lines(findings()) == expected


# --- the health agent and the NVSwitch fabric ---------------------------------------------------------------


def test_an_agent_told_not_to_wait_for_the_fabric_is_a_break_on_nvswitch_pools_only() -> None:
    files, _ = artefacts("research-7500")
    for key in [k for k in files if k.endswith("etc/kilonode/gpu-health.json")]:
        files[key] = json.dumps({**json.loads(files[key]), "fabricWaitSeconds": 0})
    found = findings(files=files)
    assert lines(found) == {"gpuHealthAgent/fabric-state-completed"}
    assert {f.where.split(":")[0].split(".")[0] for f in found} == {"pool-a100-ib", "pool-h100-ib"}


# --- held out: breaks planted in a built image's manifest only (--images) ----------------------------


def test_a_built_image_whose_toolkit_takes_no_env_var_and_a_plugin_without_sys_admin_is_a_break() -> None:
    _, graph = artefacts("research-7500")
    del plugin_spec(graph)["containers"][0]["securityContext"]["capabilities"]["add"]
    lenient = {"name": "research-7500-h100-ib", "pool": "h100-ib", "gpu": {"container_toolkit": {
        "present": True, "settings": {"accept-nvidia-visible-devices-envvar-when-unprivileged": True},
        "devices_unit": image_gpu.NVIDIA_DEVICES_UNIT_PATH,
        "devices_unit_exec": check._devices_unit(inputs_of("research-7500"),
                                                 inputs_of("research-7500").plan.node_pools[1])[1]}}}
    found = findings(graph=graph, images={lenient["name"]: lenient})
    # the lenient built image lets the plugin's env var through; the a100 image (no manifest) does not
    assert [f.where for f in found] == ["DaemonSet kube-system/nvidia-device-plugin-daemonset container "
                                        "nvidia-device-plugin-ctr on pool-a100-ib"]


def test_a_built_image_with_the_proprietary_module_or_without_ib_ipoib_at_boot_is_a_break() -> None:
    manifest = {"name": "research-7500-a100-ib", "pool": "a100-ib",
                "gpu": {"driver": {"kernel_module": "nvidia-kernel-dkms"}},
                "kernel": {"release": "6.1.0-57-amd64", "boot_modules": [],
                           "config": {"CONFIG_INFINIBAND_IPOIB": "m", "CONFIG_DMA_SHARED_BUFFER": "y",
                                      "CONFIG_INFINIBAND_ON_DEMAND_PAGING": "y", "CONFIG_INFINIBAND_USER_MEM": "y"}}}
    found = findings(images={manifest["name"]: manifest})
    assert {(f.where, f.what.split("contract line ", 1)[1].split(":", 1)[0]) for f in found} == {
        ("pool-a100-ib: image kernel", "rdmaSharedDevicePlugin/link-type-needs-netdev"),
        ("pool-a100-ib: GPUDirect RDMA", "gpuDirectRdma/dmabuf-path")}
    assert any("the built image's GPU kernel module is nvidia-kernel-dkms" in f.what for f in found)
    assert any("loads no ib_ipoib at boot" in f.what for f in found)


def test_an_infiniband_pool_whose_agent_does_not_probe_gpudirect_is_a_break() -> None:
    files, _ = artefacts("research-7500")
    key = "pool-a100-ib.team-vision/etc/kilonode/gpu-health.json"
    files[key] = json.dumps({k: v for k, v in json.loads(files[key]).items() if k != "expectGpuDirectRdma"})
    [finding] = findings(files=files)
    assert lines([finding]) == {"gpuDirectRdma/probed-on-every-node"}
    assert finding.where == f"{key.split('/', 1)[0]}: /etc/kilonode/gpu-health.json" and "is None there" in finding.what


def test_a_plugin_that_keeps_the_gpus_out_of_the_containers_spec_is_a_break() -> None:
    _, graph = artefacts("research-7500")
    [container] = plugin_spec(graph)["containers"]
    container["env"] = [e for e in container["env"] if e["name"] != "PASS_DEVICE_SPECS"]
    [finding] = findings(graph=graph)
    assert lines([finding]) == {"containerToolkit/dev-char-links"} and "PASS_DEVICE_SPECS is unset" in finding.what


# --- the cloud provider --------------------------------------------------------------------------------


@pytest.mark.parametrize(("kind", "workload", "line"), [
    ("DaemonSet", "cloud-node-manager", "cloudProviderAzure/node-manager-host-network"),
    ("Deployment", "cloud-controller-manager", "cloudProviderAzure/controller-manager-host-network"),
])
def test_a_cloud_provider_workload_off_the_host_network_is_a_break(kind: str, workload: str, line: str) -> None:
    _, graph = artefacts("research-7500")
    resource(graph, kind, workload)["inputs"]["spec"]["template"]["spec"]["hostNetwork"] = False
    [finding] = findings(graph=graph)
    assert lines([finding]) == {line} and finding.where == f"{kind} kube-system/{workload}"
    assert "hostNetwork is False, not True" in finding.what


def test_a_controller_manager_that_configures_cloud_routes_with_azure_cni_is_a_break() -> None:
    _, graph = artefacts("research-7500")
    spec = resource(graph, "Deployment", "cloud-controller-manager")["inputs"]["spec"]["template"]["spec"]
    [container] = spec["containers"]
    key = "args" if "--configure-cloud-routes=false" in (container.get("args") or []) else "command"
    container[key] = [a.replace("=false", "=true") if a.startswith("--configure-cloud-routes") else a
                      for a in container[key]]
    [finding] = findings(graph=graph)
    assert lines([finding]) == {"cloudProviderAzure/no-cloud-routes-with-azure-cni"}
    assert "runs without --configure-cloud-routes=false" in finding.what


def test_a_contract_read_at_each_minor_holds_for_every_minor_it_names(monkeypatch: pytest.MonkeyPatch) -> None:
    contract = contracts()["cloudProviderAzure"]
    assert {check.pinned_version(contract.pin, f"1.{minor}.0") for minor in (32, 33, 34, 35)} == {
        contract.version, *contract.also_read_at}
    table = dict(contracts())
    table["cloudProviderAzure"] = contract.model_copy(update={"also_read_at": []})
    monkeypatch.setattr(check, "contracts", lambda: table)
    inputs = inputs_of("research-7500")
    other_minor = dataclasses.replace(inputs, plan=inputs.plan.model_copy(update={"kubernetes_version": "1.33.5"}))
    # (kube-proxy's contract, read at the shipped stacks' own version only, is stale there too)
    [stale] = [f for f in breaks(run(other_minor, CHECK)) if "cloudProviderAzure" in f.where]
    assert stale.where == "catalog/contracts.yaml cloudProviderAzure" and "pins v1.33.17" in stale.what


@pytest.mark.parametrize(("plant", "expected"), [
    (lambda spec: spec.update(hostNetwork=False), "hostNetwork is False, not True"),
    (lambda spec: spec["containers"][0]["securityContext"].update(privileged=False), "is not privileged"),
    (lambda spec: spec.update(volumes=[v for v in spec["volumes"] if v["name"] != "devs"]),
     "does not mount the host's /dev/"),
])
def test_an_rdma_plugin_unlike_upstreams_pod_is_a_break(plant: Any, expected: str) -> None:
    _, graph = artefacts("research-7500")
    plant(resource(graph, "DaemonSet", "rdma-shared-dp-ds")["inputs"]["spec"]["template"]["spec"])
    found = [f for f in findings(graph=graph) if "upstream-pod" in f.what]
    assert lines(found) == {"rdmaSharedDevicePlugin/upstream-pod"} and expected in found[0].what


# --- Azure CNI and kube-proxy -------------------------------------------------------------------------


def _config_map(graph: dict[str, Any], name: str) -> dict[str, str]:
    data: dict[str, str] = resource(graph, "ConfigMap", name)["inputs"]["data"]
    return data


def test_kube_proxy_told_another_pod_interface_prefix_is_a_break() -> None:
    _, graph = artefacts("research-7500")
    data = _config_map(graph, "kube-proxy")
    data["config.conf"] = data["config.conf"].replace("interfaceNamePrefix: azv", "interfaceNamePrefix: veth")
    [finding] = findings(graph=graph)
    assert lines([finding]) == {"azureCni/kube-proxy-knows-pod-interfaces"}
    assert finding.where == "ConfigMap kube-system/kube-proxy config.conf"
    assert "detectLocal.interfaceNamePrefix is 'veth', not 'azv'" in finding.what


def test_kube_proxy_started_with_another_file_than_its_config_map_is_a_break() -> None:
    _, graph = artefacts("research-7500")
    [container] = resource(graph, "DaemonSet", "kube-proxy")["inputs"]["spec"]["template"]["spec"]["containers"]
    container["command"] = [w.replace("--config=/var/lib/kube-proxy/", "--config=/etc/kube-proxy/")
                            for w in container["command"]]
    [finding] = findings(graph=graph)
    assert lines([finding]) == {"azureCni/kube-proxy-knows-pod-interfaces"}
    assert "its --config (/etc/kube-proxy/config.conf) is no mount of kube-proxy's config.conf" in finding.what


def test_a_conflist_in_bridge_mode_is_a_break_on_every_pool_host() -> None:
    files, _ = artefacts("research-7500")
    conflists = [k for k in files if k.endswith("etc/cni/net.d/10-azure.conflist")]
    for key in conflists:
        files[key] = files[key].replace('"mode": "transparent"', '"mode": "bridge"')
    found = findings(files=files)
    assert lines(found) == {"azureCni/transparent-mode"}
    assert {f.where.split(":")[0] for f in found} == {k.split("/", 1)[0] for k in conflists}
    assert "plugins.0.mode is 'bridge' there" in found[0].what


@pytest.mark.parametrize(("plant", "expected"), [
    (lambda spec: spec["containers"][0]["securityContext"].update(privileged=False), "is not privileged"),
    (lambda spec: spec.update(volumes=[v for v in spec["volumes"] if v["name"] != "xtables-lock"]),
     "does not mount the host's /run/xtables.lock"),
    (lambda spec: spec.update(hostNetwork=False), "hostNetwork is False, not True"),
])
def test_a_kube_proxy_unlike_upstreams_pod_is_a_break(plant: Any, expected: str) -> None:
    _, graph = artefacts("research-7500")
    plant(resource(graph, "DaemonSet", "kube-proxy")["inputs"]["spec"]["template"]["spec"])
    [finding] = findings(graph=graph)
    assert lines([finding]) == {"kubeProxy/upstream-pod"} and expected in finding.what


def test_nftables_mode_on_a_kernel_older_than_5_13_is_a_break_and_iptables_mode_is_not_judged() -> None:
    old = {"name": "research-7500-system", "pool": "system", "kernel": {"release": "5.10.0-28-cloud-amd64"}}
    [finding] = findings(images={old["name"]: old})
    assert lines([finding]) == {"kubeProxy/nftables-kernel"} and finding.where == "pool-system: image kernel"
    assert "the built image research-7500-system boots 5.10.0-28-cloud-amd64, older than 5.13" in finding.what
    _, graph = artefacts("research-7500")
    data = _config_map(graph, "kube-proxy")
    data["config.conf"] = data["config.conf"].replace("mode: nftables", "mode: iptables")
    assert findings(graph=graph, images={old["name"]: old}) == []


def test_kube_proxy_unbound_from_system_node_proxier_is_a_break() -> None:
    _, graph = artefacts("research-7500")
    graph["resources"].remove(resource(graph, "ClusterRoleBinding", "kilonode:node-proxier"))
    [finding] = findings(graph=graph)
    assert lines([finding]) == {"kubeProxy/api-reads"}
    assert "may not list services cluster-wide" in finding.what
    assert "list discovery.k8s.io/endpointslices cluster-wide" in finding.what


# --- CoreDNS ----------------------------------------------------------------------------------------------


def test_coredns_without_its_endpointslice_reads_is_a_break() -> None:
    _, graph = artefacts("research-7500")
    role = resource(graph, "ClusterRole", "system:coredns")["inputs"]
    role["rules"] = [r for r in role["rules"] if "endpointslices" not in r["resources"]]
    [finding] = findings(graph=graph)
    assert lines([finding]) == {"coredns/api-reads"} and finding.where == "Deployment kube-system/coredns"
    assert "may not list discovery.k8s.io/endpointslices cluster-wide" in finding.what


def test_a_dns_autoscaler_that_may_not_scale_coredns_is_a_break() -> None:
    """Its Role names the one Deployment it scales: a Role naming another leaves CoreDNS at one replica."""
    _, graph = artefacts("research-7500")
    role = resource(graph, "Role", "coredns-autoscaler")["inputs"]
    for rule in role["rules"]:
        if rule["resources"] == ["deployments/scale"]:
            rule["resourceNames"] = ["kube-dns"]
    [finding] = findings(graph=graph)
    assert lines([finding]) == {"dnsAutoscaler/api-access"}
    assert finding.where == "Deployment kube-system/coredns-autoscaler"
    assert "update apps/deployments/scale coredns in kube-system" in finding.what, finding.what


def test_coredns_without_a_token_is_a_break() -> None:
    _, graph = artefacts("research-7500")
    resource(graph, "Deployment", "coredns")["inputs"]["spec"]["template"]["spec"][
        "automountServiceAccountToken"] = False
    [finding] = findings(graph=graph)
    assert lines([finding]) == {"coredns/api-reads"} and "mount no token" in finding.what


def test_coredns_without_net_bind_service_is_a_break() -> None:
    _, graph = artefacts("research-7500")
    [container] = resource(graph, "Deployment", "coredns")["inputs"]["spec"]["template"]["spec"]["containers"]
    container["securityContext"]["capabilities"]["add"] = []
    [finding] = findings(graph=graph)
    assert lines([finding]) == {"coredns/bind-port-53"}
    assert "container coredns is not privileged and adds no NET_BIND_SERVICE" in finding.what


@pytest.mark.parametrize(("before", "after", "expected"), [
    ("    loadbalance\n", "    kubernetai\n", "the Corefile names kubernetai, which v1.12.1 is not built with"),
    ("    ready\n", "", "its readinessProbe asks /ready on 8181, and the Corefile enables no ready"),
    ("    ready\n", "    ready :8282\n", "its readinessProbe asks /ready on 8181, and ready serves it on 8282"),
])
def test_a_corefile_the_image_or_the_probes_disagree_with_is_a_break(before: str, after: str, expected: str) -> None:
    _, graph = artefacts("research-7500")
    data = _config_map(graph, "coredns")
    assert before in data["Corefile"]
    data["Corefile"] = data["Corefile"].replace(before, after)
    [finding] = findings(graph=graph)
    assert lines([finding]) == {"coredns/corefile-plugins"} and expected in finding.what


# --- the cluster autoscaler ------------------------------------------------------------------------------


def test_an_autoscaler_without_its_status_config_map_is_a_break() -> None:
    _, graph = artefacts("research-7500")
    role = resource(graph, "Role", "kilonode:cluster-autoscaler")["inputs"]
    role["rules"] = [r for r in role["rules"] if not r.get("resourceNames")]
    [finding] = findings(graph=graph)
    assert lines([finding]) == {"clusterAutoscaler/upstream-rbac"}
    assert "may not delete configmaps cluster-autoscaler-status in kube-system" in finding.what


def test_volume_attachment_reads_are_judged_only_where_upstream_grants_them() -> None:
    _, graph = artefacts("research-7500")
    for rule in resource(graph, "ClusterRole", "kilonode:cluster-autoscaler")["inputs"]["rules"]:
        if "volumeattachments" in rule["resources"]:
            rule["resources"].remove("volumeattachments")
    [finding] = findings(graph=graph)
    assert lines([finding]) == {"clusterAutoscaler/upstream-rbac-volumeattachments"}
    # at 1.33 (cluster-autoscaler-1.33.6) upstream's manifest has no such rule: the line is not judged
    inputs = inputs_of("research-7500", graph=graph)
    at_133 = dataclasses.replace(inputs, plan=inputs.plan.model_copy(update={"kubernetes_version": "1.33.5"}))
    assert "clusterAutoscaler/upstream-rbac-volumeattachments" not in lines(run(at_133, CHECK))


def test_an_autoscaler_off_the_host_network_is_a_break() -> None:
    _, graph = artefacts("research-7500")
    resource(graph, "Deployment", "cluster-autoscaler")["inputs"]["spec"]["template"]["spec"]["hostNetwork"] = False
    [finding] = findings(graph=graph)
    assert lines([finding]) == {"clusterAutoscaler/host-network"}


@pytest.mark.parametrize("value", [None, "nodeIPConfiguration"])
def test_a_cloud_provider_config_that_puts_scale_sets_into_the_pools_is_a_break(value: str | None) -> None:
    """Unset, the backend pool type defaults to nodeIPConfiguration: scale-set PUTs the
    controller's role does not allow (kilonode.azure.identity)."""
    _, graph = artefacts("research-7500")
    data = _config_map(graph, "azure-cloud-provider")
    config = json.loads(data["azure.json"])
    config.pop("loadBalancerBackendPoolConfigurationType")
    if value is not None:
        config["loadBalancerBackendPoolConfigurationType"] = value
    data["azure.json"] = json.dumps(config)
    [finding] = findings(graph=graph)
    assert lines([finding]) == {"cloudProviderAzure/backend-pools-by-ip"}


def test_an_autoscaler_azure_config_it_refuses_or_does_not_read_is_a_break() -> None:
    _, graph = artefacts("research-7500")
    data = _config_map(graph, "cluster-autoscaler-azure")
    config = json.loads(data["azure.json"])
    config["vmType"] = "standard"
    del config["resourceGroup"]
    data["azure.json"] = json.dumps(config)
    [container] = resource(graph, "Deployment", "cluster-autoscaler")["inputs"]["spec"]["template"]["spec"][
        "containers"]
    container["args"] = [a.replace("azure.json", "cloud.json") if a.startswith("--cloud-config") else a
                         for a in container["args"]]
    [finding] = findings(graph=graph)  # node-groups-writable leaves a file without a resource group to this line
    assert lines([finding]) == {"clusterAutoscaler/azure-config"}
    assert "vmType is 'standard', not 'vmss'; resourceGroup is not set" in finding.what
    assert "container cluster-autoscaler is not given it: its --cloud-config" in finding.what


def test_a_node_group_outside_the_listed_group_or_without_the_identitys_role_is_a_break() -> None:
    _, graph = artefacts("research-7500")
    graph["resources"] = [r for r in graph["resources"]
                          if not r["name"].endswith("-autoscaler-research-7500-h100-ib-003")]
    moved = next(r for r in graph["resources"] if r["type"].endswith(":VirtualMachineScaleSet")
                 and r["inputs"].get("vmScaleSetName") == "research-7500-h100-ib-004")
    moved["inputs"]["resourceGroupName"] = "research-7500"
    found = findings(graph=graph)
    assert lines(found) == {"clusterAutoscaler/node-groups-writable"}
    by_group = {f.where.rsplit(" ", 1)[1]: f.what for f in found}
    assert set(by_group) == {"research-7500-h100-ib-003", "research-7500-h100-ib-004"}
    assert "holds no Virtual Machine Contributor or Contributor or Owner, nor a custom role with " \
           "Microsoft.Compute/virtualMachineScaleSets/write, " \
           "Microsoft.Compute/virtualMachineScaleSets/delete/action, on a scope containing scale set " \
           "research-7500-h100-ib-003" in by_group["research-7500-h100-ib-003"]
    assert "lists the scale sets of resourceGroup research-7500-nodes only" in by_group["research-7500-h100-ib-004"]


def test_a_custom_role_without_delete_instances_does_not_make_a_node_group_writable() -> None:
    _, graph = artefacts("research-7500")
    [role] = [r for r in graph["resources"] if r["type"] == "azure-native:authorization:RoleDefinition"
              and r["name"].endswith("-autoscaler-role")]
    actions = role["inputs"]["permissions"][0]["actions"]
    actions.remove("Microsoft.Compute/virtualMachineScaleSets/delete/action")
    found = findings(graph=graph)
    assert lines(found) == {"clusterAutoscaler/node-groups-writable"}
    assert all("nor a custom role with" in f.what for f in found)


# --- Prometheus -------------------------------------------------------------------------------------------


def test_a_discovery_namespace_without_endpointslice_reads_is_a_break_for_the_job_that_needs_them() -> None:
    _, graph = artefacts("research-7500")
    [role] = [r for r in graph["resources"] if r["type"].endswith(":Role")
              and r["inputs"]["metadata"] == {**r["inputs"]["metadata"], "name": "kilonode:prometheus",
                                              "namespace": "kube-system"}]
    role["inputs"]["rules"] = [r for r in role["inputs"]["rules"] if "endpointslices" not in r["resources"]]
    found = findings(graph=graph)
    assert lines(found) == {"prometheus/discovery-rbac"}
    # each job that discovers in kube-system by its EndpointSlices: kube-state-metrics and CoreDNS
    assert sorted(f.where for f in found) == [
        f"StatefulSet monitoring/prometheus job {job} (role endpointslice)"
        for job in ("kilonode-coredns", "kilonode-kube-state-metrics")]
    assert all("may not list discovery.k8s.io/endpointslices in kube-system" in f.what for f in found)


def test_prometheus_without_node_reads_breaks_every_node_discovery_job() -> None:
    _, graph = artefacts("research-7500")
    role = resource(graph, "ClusterRole", "kilonode:prometheus")["inputs"]
    role["rules"] = [r for r in role["rules"] if r.get("resources") != ["nodes"]]
    found = findings(graph=graph)
    assert lines(found) == {"prometheus/discovery-rbac"}
    assert all("(role node)" in f.where and "may not list nodes cluster-wide" in f.what for f in found)
    assert len(found) >= 4  # kubelet, cAdvisor, pod traffic, GPU health agent


def test_prometheus_without_nodes_metrics_is_a_break() -> None:
    _, graph = artefacts("research-7500")
    role = resource(graph, "ClusterRole", "kilonode:prometheus")["inputs"]
    role["rules"] = [r for r in role["rules"] if r.get("resources") != ["nodes/metrics"]]
    [finding] = findings(graph=graph)
    assert lines([finding]) == {"prometheus/scrape-rights"} and "may not get nodes/metrics cluster-wide" in finding.what


# --- scheduler-plugins ----------------------------------------------------------------------------------


def test_a_gang_scheduler_without_the_pod_group_crd_is_a_break() -> None:
    _, graph = artefacts("research-7500")
    graph["resources"].remove(resource(graph, "CustomResourceDefinition", "podgroups.scheduling.x-k8s.io"))
    [finding] = findings(graph=graph)
    assert lines([finding]) == {"schedulerPlugins/crds-installed"}
    assert "no CustomResourceDefinition podgroups.scheduling.x-k8s.io" in finding.what


def test_a_gang_scheduler_configuration_of_another_api_version_is_a_break() -> None:
    _, graph = artefacts("research-7500")
    data = _config_map(graph, "kilonode-gang-scheduler")
    data["scheduler-config.yaml"] = data["scheduler-config.yaml"].replace(
        "kubescheduler.config.k8s.io/v1", "kubescheduler.config.k8s.io/v1beta3")
    [finding] = findings(graph=graph)
    assert lines([finding]) == {"schedulerPlugins/config-api-version"}
    assert "apiVersion is 'kubescheduler.config.k8s.io/v1beta3'" in finding.what


def test_a_gang_controller_without_pod_reads_is_a_break() -> None:
    _, graph = artefacts("research-7500")
    role = resource(graph, "ClusterRole", "kilonode:kilonode-gang-controller")["inputs"]
    role["rules"] = [r for r in role["rules"] if r["resources"] != ["pods"]]
    [finding] = findings(graph=graph)
    assert lines([finding]) == {"schedulerPlugins/controller-rbac"} and "may not get pods cluster-wide" in finding.what


def test_a_gang_scheduler_lease_its_role_does_not_name_is_a_warning_where_a_builtin_role_might_grant_it() -> None:
    _, graph = artefacts("research-7500")
    data = _config_map(graph, "kilonode-gang-scheduler")
    data["scheduler-config.yaml"] = data["scheduler-config.yaml"].replace(
        "resourceName: kilonode-gang\n", "resourceName: kilonode-gang-2\n")
    inputs = inputs_of("research-7500", graph=graph)
    assert breaks(run(inputs, CHECK)) == []
    [warning] = [f for f in run(inputs, CHECK) if "scheduler-rbac" in f.what]
    assert warning.level == "warn" and lines([warning]) == {"schedulerPlugins/scheduler-rbac"}
    assert "may not get coordination.k8s.io/leases kilonode-gang-2 in kube-system" in warning.what
    assert "unless ClusterRole system:kube-scheduler" in warning.what


def _with_coscheduling_arg(graph: dict[str, Any], key: str, value: int) -> None:
    data = _config_map(graph, "kilonode-gang-scheduler")
    config = yaml.safe_load(data["scheduler-config.yaml"])
    [args] = [c["args"] for p in config["profiles"] for c in p["pluginConfig"] if c["name"] == "Coscheduling"]
    args[key] = value
    data["scheduler-config.yaml"] = yaml.safe_dump(config)


def test_a_coscheduling_argument_the_release_does_not_decode_is_a_break() -> None:
    _, graph = artefacts("research-7500")
    _with_coscheduling_arg(graph, "kubeConfigPath", 1)
    [finding] = findings(graph=graph)
    assert lines([finding]) == {"schedulerPlugins/coscheduling-args-v0-34"}
    assert "profiles.*.pluginConfig.name=Coscheduling.args has kubeConfigPath, a field it does not decode" in \
        finding.what


def test_pod_group_reject_percentage_is_decoded_from_v0_34_only() -> None:
    _, graph = artefacts("research-7500")
    _with_coscheduling_arg(graph, "podGroupRejectPercentage", 10)
    assert findings(graph=graph) == []  # v0.34.7, the 1.34 stacks' release
    inputs = inputs_of("research-7500", graph=graph)
    at_133 = dataclasses.replace(inputs, plan=inputs.plan.model_copy(update={"kubernetes_version": "1.33.5"}))
    [finding] = [f for f in breaks(run(at_133, CHECK)) if "coscheduling-args" in f.what]
    assert lines([finding]) == {"schedulerPlugins/coscheduling-args"} and "podGroupRejectPercentage" in finding.what


# --- metrics-server and the apiservers' aggregation layer -------------------------------------------------

METRICS_SERVER = "Deployment kube-system/metrics-server"
APISERVER_UNIT = "etc/systemd/system/kube-apiserver.service"


def test_metrics_server_without_the_kubelets_metrics_is_a_break() -> None:
    _, graph = artefacts("research-7500")
    role = resource(graph, "ClusterRole", "system:metrics-server")["inputs"]
    role["rules"] = [r for r in role["rules"] if r["resources"] != ["nodes/metrics"]]
    [finding] = findings(graph=graph)
    assert lines([finding]) == {"metricsServer/api-reads"} and finding.where == METRICS_SERVER
    assert "may not get nodes/metrics cluster-wide" in finding.what


@pytest.mark.parametrize(("kind", "name", "expected"), [
    ("RoleBinding", "metrics-server-auth-reader",
     "may not get configmaps extension-apiserver-authentication in kube-system, list configmaps"),
    ("ClusterRoleBinding", "metrics-server:system:auth-delegator",
     "may not create authorization.k8s.io/subjectaccessreviews cluster-wide, create authentication.k8s.io/"),
])
def test_metrics_server_unbound_from_the_apiservers_delegation_roles_is_a_break(kind: str, name: str,
                                                                                expected: str) -> None:
    """Both roles are the apiserver's own (catalog/rbac.yaml): judged, not merely warned about."""
    _, graph = artefacts("research-7500")
    graph["resources"].remove(resource(graph, kind, name))
    [finding] = findings(graph=graph)
    assert lines([finding]) == {"metricsServer/delegated-auth"} and expected in finding.what, finding.what


def test_a_binding_to_a_role_the_apiserver_does_not_create_is_only_a_warning() -> None:
    _, graph = artefacts("research-7500")
    resource(graph, "RoleBinding", "metrics-server-auth-reader")["inputs"]["roleRef"]["name"] = "someone-elses-role"
    found = run(inputs_of("research-7500", graph=graph), CHECK)
    [warning] = [f for f in found if lines([f]) == {"metricsServer/delegated-auth"}]
    assert warning.level == "warn" and "unless Role someone-elses-role in kube-system (not readable here)" in \
        warning.what


def _apiserver_unit(files: dict[str, str], host: str, old: str, new: str) -> None:
    unit = f"{host}/{APISERVER_UNIT}"
    assert old in files[unit]
    files[unit] = files[unit].replace(old, new)


@pytest.mark.parametrize(("old", "new", "line", "expected"), [
    ("    --proxy-client-cert-file=/etc/kubernetes/pki/front-proxy-client.crt \\\n", "",
     "metricsServer/aggregation-layer", "it runs without --proxy-client-cert-file"),
    ("--requestheader-username-headers=X-Remote-User", "--requestheader-username-headers=X-User",
     "metricsServer/aggregation-layer", "--requestheader-username-headers=X-User, not X-Remote-User"),
    ("--requestheader-client-ca-file=/etc/kubernetes/pki/front-proxy-ca.crt",
     "--requestheader-client-ca-file=/etc/kubernetes/pki/aggregator-ca.crt",
     "metricsServer/aggregation-layer",
     "--requestheader-client-ca-file=/etc/kubernetes/pki/aggregator-ca.crt names a file the host does not receive"),
    ("    --enable-aggregator-routing=true \\\n", "",
     "metricsServer/aggregator-routing", "it runs without --enable-aggregator-routing"),
])
def test_an_apiserver_without_the_aggregation_layer_is_a_break(old: str, new: str, line: str, expected: str) -> None:
    files, _ = artefacts("research-7500")
    _apiserver_unit(files, "apiserver-2", old, new)
    [finding] = findings(files=files)
    assert lines([finding]) == {line} and finding.where == f"apiserver-2: /{APISERVER_UNIT}"
    assert expected in finding.what, finding.what


def test_aggregator_routing_is_not_asked_of_an_apiserver_host_that_runs_kube_proxy() -> None:
    files, _ = artefacts("research-7500")
    _apiserver_unit(files, "apiserver-2", "    --enable-aggregator-routing=true \\\n", "")
    files["apiserver-2/etc/systemd/system/kube-proxy.service"] = "[Service]\nExecStart=/usr/local/bin/kube-proxy\n"
    assert findings(files=files) == []


def test_pools_closed_to_the_control_plane_on_metrics_servers_port_are_a_break() -> None:
    _, graph = artefacts("research-7500")
    [nsg] = [r for r in graph["resources"] if r["name"] == "research-7500-network-pools-nsg"]
    nsg["inputs"]["securityRules"] = [r for r in nsg["inputs"]["securityRules"]
                                      if r["name"] != "allow-all-from-control-plane"]
    found = findings(graph=graph)
    assert lines(found) == {"metricsServer/apiserver-reach"}
    # where its pods may run: the system pool now, the untainted GPU pools once their health check passes;
    # never the teams' or the monitoring pool (taints it does not tolerate)
    assert sorted(f.where for f in found) == [f"{METRICS_SERVER} on pool-{p}" for p in ("a100-ib", "h100-ib", "system")]
    assert "refuses the control-plane subnet (10.0.0.0/24) on 10250/TCP" in found[0].what


def test_metrics_server_serving_another_port_than_its_contract_says_is_a_break() -> None:
    _, graph = artefacts("research-7500")
    spec = resource(graph, "Deployment", "metrics-server")["inputs"]["spec"]["template"]["spec"]
    spec["containers"][0]["ports"][0]["containerPort"] = 4443
    [finding] = findings(graph=graph)
    assert lines([finding]) == {"metricsServer/apiserver-reach"} and "declares no port 10250" in finding.what


# --- the kubelet ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("plant", "expected"), [
    (lambda text: text.replace("vm.overcommit_memory = 1", "vm.overcommit_memory = 0"), "vm.overcommit_memory is 0"),
    (lambda text: text.replace("kernel.panic = 10", "# kernel.panic = 10"), "kernel.panic is not set"),
    # systemd-sysctl's last setting wins, a later `/` spelling included
    (lambda text: text + "\nkernel/keys/root_maxkeys = 200\n", "kernel.keys.root_maxkeys is 200"),
])
def test_a_pool_whose_sysctls_differ_from_what_the_kubelet_checks_is_a_break(plant: Any, expected: str) -> None:
    files, _ = artefacts("research-7500")
    conf = [k for k in files if k.endswith("etc/sysctl.d/90-kilonode.conf")]
    files[conf[0]] = plant(files[conf[0]])
    [finding] = findings(files=files)
    assert lines([finding]) == {"kubelet/kernel-tunables"} and expected in finding.what
    assert finding.where.startswith(conf[0].split("/", 1)[0] + ":")


def test_every_pool_kubelet_protects_the_kernel_defaults_the_profile_sets() -> None:
    """By hand: protectKernelDefaults on every pool's kubelet, and the six values of
    k8s.io/component-helpers@v0.34.2 node/util/sysctl in every pool's sysctl file."""
    files, _ = artefacts("research-7500")
    kubelets = {k: yaml.safe_load(v) for k, v in files.items() if k.endswith("etc/kubernetes/kubelet-config.yaml")}
    assert kubelets and all(config["protectKernelDefaults"] is True for config in kubelets.values())
    expected = {"vm.overcommit_memory": "1", "vm.panic_on_oom": "0", "kernel.panic": "10", "kernel.panic_on_oops": "1",
                "kernel.keys.root_maxkeys": "1000000", "kernel.keys.root_maxbytes": str(1000000 * 25)}
    for key, text in files.items():
        if key.endswith("etc/sysctl.d/90-kilonode.conf"):
            assert expected.items() <= check.sysctl_file_values(text).items(), key


# --- the kubelet's cgroup v2 line (1.35: failCgroupV1 defaults to true) ------------------------------


def _legacy_recipe(monkeypatch: pytest.MonkeyPatch) -> None:
    recipe = check._recipe()
    monkeypatch.setattr(check, "_recipe", lambda: dataclasses.replace(
        recipe, kernel_cmdline=recipe.kernel_cmdline + " systemd.unified_cgroup_hierarchy=0"))


def test_a_legacy_cgroup_boot_breaks_the_kubelets_line_and_failcgroupv1_false_lifts_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    _legacy_recipe(monkeypatch)
    contract = contracts()["kubelet"]
    [line] = [r for r in contract.requirements if r.id == "cgroup-v2"]
    inputs = inputs_of("research-7500")
    found = check._cgroup_v2(inputs, "kubelet", contract, line)
    assert found and all("systemd.unified_cgroup_hierarchy=0" in f.what for f in found)
    pools = {h for h in inputs.hosts() if h.startswith("pool-")}
    assert {f.where.split(":")[0] for f in found} == pools
    files = {path: text + ("failCgroupV1: false\n" if path.endswith("etc/kubernetes/kubelet-config.yaml") else "")
             for path, text in inputs.files.items()}
    assert check._cgroup_v2(inputs_of("research-7500", files=files), "kubelet", contract, line) == []


def test_the_cgroup_line_holds_at_1_35_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """At 1.34 the kubelet only warns on cgroup v1 (failCgroupV1 defaulted to false): the line is `onlyAt` 1.35.4."""
    _legacy_recipe(monkeypatch)
    found = run(inputs_of("research-7500"), ["contracts"])
    assert not [f for f in found if "cgroup-v2" in f.what]


def test_the_shipped_recipe_boots_the_unified_hierarchy() -> None:
    contract = contracts()["kubelet"]
    [line] = [r for r in contract.requirements if r.id == "cgroup-v2"]
    assert check._cgroup_v2(inputs_of("research-7500"), "kubelet", contract, line) == []


def test_at_1_35_4_a_legacy_cgroup_boot_is_a_break(monkeypatch: pytest.MonkeyPatch) -> None:
    from kilonode.preflight.load import from_parts
    from tests import shared
    from tests.preflight.conftest import _files, _graph_json

    _legacy_recipe(monkeypatch)
    plan = shared.plan("research-7500").model_copy(update={"kubernetes_version": "1.35.4"})
    inputs = from_parts(plan, _files("research-7500"), _graph_json("research-7500"), source="research-7500 at 1.35.4")
    found = [f for f in check.check(inputs) if "kubelet/cgroup-v2" in f.what]
    assert found and all(f.level == "break" and "kernel command line" in f.where for f in found)


# --- the exporters (kilonode.k8s.exporters) ---------------------------------------------------------------


def _pod(graph: dict[str, Any], kind: str, name: str) -> dict[str, Any]:
    spec: dict[str, Any] = resource(graph, kind, name)["inputs"]["spec"]["template"]["spec"]
    return spec


def test_a_dcgm_exporter_without_sys_admin_is_a_break_for_nvml_and_for_upstreams_pod() -> None:
    _, graph = artefacts("research-7500")
    del _pod(graph, "DaemonSet", "dcgm-exporter")["containers"][0]["securityContext"]["capabilities"]["add"]
    found = findings(graph=graph)
    assert lines(found) == {"dcgmExporter/nvml-from-image-env", "dcgmExporter/upstream-pod"}
    assert any("NVIDIA_VISIBLE_DEVICES=all is ignored" in f.what for f in found)


@pytest.mark.parametrize(("plant", "line", "expected"), [
    (lambda spec: spec.update(volumes=[v for v in spec["volumes"] if v["name"] != "pod-gpu-resources"]),
     "dcgmExporter/upstream-pod", "does not mount the host's /var/lib/kubelet/pod-resources"),
    (lambda spec: spec["containers"][0].update(env=[e for e in spec["containers"][0]["env"]
                                                   if e["name"] != "DCGM_EXPORTER_KUBERNETES"]),
     "dcgmExporter/upstream-pod", "DCGM_EXPORTER_KUBERNETES=None"),
    (lambda spec: spec.update(hostNetwork=False), "dcgmExporter/no-pod-ip", "pod IPs"),
])
def test_a_dcgm_exporter_unlike_upstreams_pod_is_a_break(plant: Any, line: str, expected: str) -> None:
    _, graph = artefacts("research-7500")
    plant(_pod(graph, "DaemonSet", "dcgm-exporter"))
    found = findings(graph=graph)
    assert lines(found) == {line} and expected in found[0].what


@pytest.mark.parametrize(("plant", "expected"), [
    (lambda spec: spec.update(hostPID=False), "hostPID is False, not True"),
    (lambda spec: spec.update(hostNetwork=False), "hostNetwork is False, not True"),
    (lambda spec: spec["containers"][0].update(args=[a for a in spec["containers"][0]["args"]
                                                    if not a.startswith("--path.rootfs")]),
     "runs without --path.rootfs=/host"),
    (lambda spec: spec.update(volumes=[]), "does not mount the host's /"),
])
def test_a_node_exporter_unlike_upstreams_pod_is_a_break(plant: Any, expected: str) -> None:
    _, graph = artefacts("research-7500")
    plant(_pod(graph, "DaemonSet", "node-exporter"))
    found = findings(graph=graph)
    assert lines(found) == {"nodeExporter/upstream-pod"} and expected in found[0].what


def test_kube_state_metrics_without_node_reads_or_the_pool_label_is_a_break() -> None:
    _, graph = artefacts("research-7500")
    graph["resources"].remove(resource(graph, "ClusterRoleBinding", "kube-state-metrics"))
    container = _pod(graph, "Deployment", "kube-state-metrics")["containers"][0]
    container["args"] = [a for a in container["args"] if not a.startswith("--metric-labels-allowlist")]
    found = findings(graph=graph)
    assert lines(found) == {"kubeStateMetrics/node-reads", "kubeStateMetrics/pool-label"}
