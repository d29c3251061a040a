"""gpu-runtime: the shipped GPU pools' images hold one driver release with Fabric Manager, NSCQ
and the container toolkit, their runtimes run containers with the NVIDIA runtime and the device
plugin's device list is one the toolkit takes; each seeded break in that chain (a package
missing or unpinned, FM of another release, FM's unit not enabled on an NVSwitch size or
enabled without one, the env-var device list accepted, a strategy the toolkit refuses, a runtime
configuration without the NVIDIA runtime or naming a binary the image lacks, a drop-in for the
wrong unit, a built image without the toolkit) is named under the check."""

from __future__ import annotations

import json
import tomllib
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import tomli_w

from kilonode.image import gpu as image_gpu
from kilonode.image.recipe import Recipe
from kilonode.image.vendor_apt import upstream_version
from kilonode.k8s import gpu as k8s_gpu
from kilonode.plan import wellknown
from kilonode.preflight import Finding, breaks, run
from kilonode.preflight.checks import gpu_runtime
from kilonode.render import pool as render_pool
from tests.preflight.conftest import artefacts, inputs_of, resource

CHECK = ["gpu-runtime"]
CUDA_REPO = "nvidia-cuda-debian12"
TOOLKIT_REPO = "nvidia-container-toolkit"


def found(stack: str = "research-7500", files: dict[str, str] | None = None, graph: dict[str, Any] | None = None,
          images: dict[str, Any] | None = None) -> list[Finding]:
    inputs = inputs_of(stack, files=files, graph=graph)
    return run(replace(inputs, images=images) if images is not None else inputs, CHECK)


def whats(findings: list[Finding], level: str = "break") -> list[tuple[str, str]]:
    assert all(f.check == "gpu-runtime" for f in findings)
    return [(f.where, f.what) for f in findings if f.level == level]


def use(monkeypatch: pytest.MonkeyPatch, edit: Callable[[Recipe], Recipe]) -> None:
    """The check reads this recipe instead of node-image/recipe.toml."""
    recipe, catalog = gpu_runtime._data()
    monkeypatch.setattr(gpu_runtime, "_data", lambda: (edit(recipe), catalog))


def with_gpu(recipe: Recipe, **changes: Any) -> Recipe:
    return replace(recipe, extras={**recipe.extras, "gpu": replace(recipe.extras["gpu"], **changes)})


def with_pin(recipe: Recipe, repo: str, package: str, version: str | None) -> Recipe:
    """The recipe with one vendor package at another version (None: not declared at all)."""
    old = recipe.apt_repositories[repo]
    pins = tuple(replace(p, version=version) if p.name == package else p
                 for p in old.packages if version is not None or p.name != package)
    return replace(recipe, apt_repositories={**recipe.apt_repositories, repo: replace(old, packages=pins)})


def gpu_list(tmp_path: Path, recipe: Recipe, edit: Callable[[str], str]) -> Recipe:
    """The recipe with its gpu package list edited (a copy under tmp_path)."""
    original = recipe.extras["gpu"].package_file
    copy = tmp_path / "gpu.txt"
    text = original.read_text()
    assert edit(text) != text
    copy.write_text(edit(text))
    return with_gpu(recipe, package_file=copy)


def test_the_shipped_stacks_have_no_gpu_runtime_finding(shipped: str) -> None:
    assert found(shipped) == []


# --- 1: every package declared, at an exact version ----------------------------------------------


@pytest.mark.parametrize(("edit", "expected"), [
    (lambda t: t.replace("nvidia-open-kernel-dkms=535.261.03-1\n", ""),
     "driver nvidia-open-kernel-dkms is in no package list or vendor repository of the docker+gpu+infiniband image: no "
     "GPU is visible on the node"),
    (lambda t: t.replace("nvidia-open-kernel-dkms=535.261.03-1", "nvidia-open-kernel-dkms"),
     "driver nvidia-open-kernel-dkms is not pinned to an exact version (none, "),
])
def test_a_driver_missing_or_unpinned_is_a_break(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, edit: Any,
                                                 expected: str) -> None:
    use(monkeypatch, lambda r: gpu_list(tmp_path, r, edit))
    breaks_ = whats(found())
    assert [w for w, _ in breaks_] == ["pool-a100-ib: image recipe", "pool-h100-ib: image recipe"]
    assert all(what.startswith(expected) for _, what in breaks_), breaks_


def test_fabric_manager_missing_breaks_nvswitch_pools_only(monkeypatch: pytest.MonkeyPatch) -> None:
    use(monkeypatch, lambda r: with_pin(r, CUDA_REPO, "nvidia-fabricmanager-535", None))
    for pool in ("a100-ib", "h100-ib"):
        assert (f"pool-{pool}: image recipe", "fabric_manager nvidia-fabricmanager-535 is in no package list or vendor "
                "repository of the docker+gpu+infiniband image: on an NVSwitch size CUDA cannot initialise "
                "(cudaErrorSystemNotReady, 802)") in whats(found())
    assert found("research-2500") == []  # NC A100 v4: PCIe cards, no NVSwitch, no Fabric Manager needed


def test_nscq_named_nowhere_is_a_break(monkeypatch: pytest.MonkeyPatch) -> None:
    recipe, _ = gpu_runtime._data()
    equal = {k: v for k, v in recipe.extras["gpu"].equal_versions.items() if k != "nscq"}
    use(monkeypatch, lambda r: with_gpu(r, equal_versions=equal))
    assert [w for _, w in whats(found())] == [
        "the recipe names no nscq package: Fabric Manager's and the GPU tools' NVSwitch queries fail"] * 2


def test_a_toolkit_package_with_a_glob_is_a_break(monkeypatch: pytest.MonkeyPatch) -> None:
    use(monkeypatch, lambda r: with_pin(r, TOOLKIT_REPO, "nvidia-container-toolkit", "1.17.*"))
    [(where, what)] = whats(found("research-2500"))
    assert where == "pool-nc-a100: image recipe" and what.startswith(
        "container toolkit nvidia-container-toolkit is not pinned to an exact version (1.17.*, node-image/recipe.toml "
        "[apt_repositories.nvidia-container-toolkit.packages])")


# --- 2: one driver release ------------------------------------------------------------------------


def test_fabric_manager_of_another_release_is_a_break(monkeypatch: pytest.MonkeyPatch) -> None:
    use(monkeypatch, lambda r: with_pin(r, CUDA_REPO, "nvidia-fabricmanager-535", "535.216.03-1"))
    for stack, pool in (("research-7500", "a100-ib"), ("research-7500", "h100-ib"), ("research-2500", "nc-a100")):
        assert (f"pool-{pool}: image recipe",
                "fabric_manager nvidia-fabricmanager-535 535.216.03-1 is not the driver's release 535.261.03 "
                "(nvidia-open-kernel-dkms 535.261.03-1): Fabric Manager and NSCQ refuse a driver of another "
                "version, and without them CUDA cannot initialise on an NVSwitch system") in whats(found(stack))


# --- 3: Fabric Manager's unit ---------------------------------------------------------------------


def test_fabric_manager_not_enabled_on_an_nvswitch_size_is_a_break(monkeypatch: pytest.MonkeyPatch) -> None:
    use(monkeypatch, lambda r: with_gpu(r, fabric_manager_unit=None))
    breaks_ = whats(found())
    assert [w for w, _ in breaks_] == ["pool-a100-ib: the Fabric Manager unit", "pool-h100-ib: the Fabric Manager unit"]
    assert all("joined by NVSwitch and the image build (kilonode.image.gpu.fabric_manager_to_enable) does not "
               "enable" in what and "cudaErrorSystemNotReady" in what for _, what in breaks_)


def test_fabric_manager_enabled_without_nvswitch_is_a_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(image_gpu, "fabric_manager_to_enable", lambda *_: "nvidia-fabricmanager.service")
    findings = found("research-2500")
    assert not breaks(findings)
    [(where, what)] = whats(findings, "warn")
    assert where == "pool-nc-a100: nvidia-fabricmanager.service"
    assert "Standard_NC24ads_A100_v4, which has no NVSwitch" in what and "NV_WARN_NOTHING_TO_DO" in what


def test_a_built_image_without_fabric_manager_or_the_toolkit_is_a_break() -> None:
    manifest = {"name": "research-7500-h100-ib", "pool": "h100-ib", "gpu": {
        "fabric_manager": {"enabled": False, "nvswitch": True},
        "container_toolkit": {"present": False, "runtime_dropin": None,
                              "origin": "absent: nvidia-container-toolkit 1.17.8-1 (apt repository ...): no --fetch"}}}
    breaks_ = dict(whats(found(images={manifest["name"]: manifest})))
    assert "the built image research-7500-h100-ib (--images) does not enable" in \
        breaks_["pool-h100-ib: nvidia-fabricmanager.service"]
    assert breaks_["pool-h100-ib: built image research-7500-h100-ib"].startswith(
        "the image has no NVIDIA container toolkit (absent: nvidia-container-toolkit 1.17.8-1")
    assert len(breaks_) == 2  # a100-ib has no built manifest here: its recipe is what counts


# --- 4: the toolkit's config and the device plugin's device list ---------------------------------


def test_the_env_var_device_list_accepted_from_unprivileged_containers_is_a_break(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(image_gpu, "TOOLKIT_SETTINGS", {wellknown.TOOLKIT_VOLUME_MOUNTS: True})  # the default: true
    [(where, what)] = whats(found())
    assert where == "GPU images: /etc/nvidia-container-runtime/config.toml (kilonode.image.gpu.TOOLKIT_SETTINGS)"
    assert what.startswith("accept-nvidia-visible-devices-envvar-when-unprivileged is not false")


def plugin_env(graph: dict[str, Any]) -> list[dict[str, str]]:
    daemonset = resource(graph, "DaemonSet", k8s_gpu.DAEMONSET_NAME)
    return daemonset["inputs"]["spec"]["template"]["spec"]["containers"][0]["env"]


@pytest.mark.parametrize("strategy", ["envvar", "cdi-annotations", None])
def test_a_device_list_strategy_the_toolkit_refuses_is_a_break(strategy: str | None) -> None:
    _, graph = artefacts("research-7500")
    env = plugin_env(graph)
    [entry] = [e for e in env if e["name"] == "DEVICE_LIST_STRATEGY"]
    if strategy is None:
        env.remove(entry)  # unset: the plugin's default, envvar
    else:
        entry["value"] = strategy
    [(where, what)] = whats(found(graph=graph))
    assert where == "DaemonSet kube-system/nvidia-device-plugin-daemonset"
    assert what.startswith(f"DEVICE_LIST_STRATEGY={strategy or 'envvar'}: the image's toolkit config takes none")
    assert "GPU pods start without their GPUs" in what


def test_volume_mounts_the_toolkit_does_not_accept_is_a_break(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = {wellknown.TOOLKIT_ENVVAR_WHEN_UNPRIVILEGED: False}  # volume mounts left at the default, false
    monkeypatch.setattr(image_gpu, "TOOLKIT_SETTINGS", settings)
    [(_, what)] = whats(found())
    assert what.startswith("DEVICE_LIST_STRATEGY=volume-mounts: the image's toolkit config takes none")


def test_no_device_plugin_is_a_break() -> None:
    _, graph = artefacts("research-7500")
    graph["resources"].remove(resource(graph, "DaemonSet", k8s_gpu.DAEMONSET_NAME))
    assert whats(found(graph=graph)) == [("GPU pools", "no nvidia-device-plugin-daemonset DaemonSet in the graph: "
                                                       "GPU nodes register no nvidia.com/gpu, and no pod can ask for a "
                                                       "GPU")]


# --- 5: the runtime runs containers with the NVIDIA runtime -------------------------------------

DOCKER_NVIDIA = f"pool-h100-ib/{render_pool.DOCKER_DAEMON_NVIDIA_JSON}"
CONTAINERD_NVIDIA = f"pool-nc-a100/{render_pool.CONTAINERD_NVIDIA_CONFIG}"


def docker(edit: Callable[[dict[str, Any]], None]) -> dict[str, str]:
    files, _ = artefacts("research-7500")
    config = json.loads(files[DOCKER_NVIDIA])
    edit(config)
    files[DOCKER_NVIDIA] = json.dumps(config)
    return files


def test_no_configuration_with_the_nvidia_runtime_as_default_is_a_break() -> None:
    files = docker(lambda c: c.update({"default-runtime": "runc"}))
    [(where, what)] = whats(found(files=files))
    assert where == "pool-h100-ib: docker.service"
    assert what.startswith("no rendered docker configuration makes the nvidia runtime the default")


@pytest.mark.parametrize(("edit", "expected"), [
    (lambda c: c["runtimes"].clear(), "the default runtime nvidia names no binary"),
    (lambda c: c["runtimes"]["nvidia"].update(path="/usr/local/bin/nvidia-container-runtime"),
     "the default runtime nvidia runs /usr/local/bin/nvidia-container-runtime, which the image does not install"),
])
def test_a_docker_nvidia_runtime_without_its_binary_is_a_break(edit: Any, expected: str) -> None:
    [(where, what)] = whats(found(files=docker(edit)))
    assert where == f"pool-h100-ib: {render_pool.DOCKER_DAEMON_NVIDIA_JSON}" and what.startswith(expected)


def test_a_containerd_nvidia_runtime_naming_a_binary_the_image_lacks_is_a_break() -> None:
    files, _ = artefacts("research-2500")
    config = tomllib.loads(files[CONTAINERD_NVIDIA])
    config["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]["nvidia"]["options"]["BinaryName"] = \
        "/usr/bin/nvidia-container-runtime.cdi"
    files[CONTAINERD_NVIDIA] = tomli_w.dumps(config)
    [(where, what)] = whats(found("research-2500", files=files))
    assert where == f"pool-nc-a100: {render_pool.CONTAINERD_NVIDIA_CONFIG}"
    assert "runs /usr/bin/nvidia-container-runtime.cdi, which the image does not install" in what


def test_the_runtime_binary_whose_package_the_recipe_drops_is_a_break(monkeypatch: pytest.MonkeyPatch) -> None:
    use(monkeypatch, lambda r: with_pin(r, TOOLKIT_REPO, "nvidia-container-toolkit-base", None))
    breaks_ = whats(found("research-2500"))
    assert ("pool-nc-a100: etc/containerd/config-nvidia.toml", "the default runtime nvidia runs "
            "/usr/bin/nvidia-container-runtime, which the image does not install: every container of the node, the "
            "pause container and so every pod included, fails to start") in breaks_
    assert any(w.startswith("container toolkit nvidia-container-toolkit-base is in no package list")
               for _, w in breaks_)


def test_a_drop_in_for_another_unit_is_a_break(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(image_gpu, "DOCKER_DROPIN", "/etc/systemd/system/cri-docker.service.d/30-nvidia.conf")
    breaks_ = whats(found())
    assert {w for w, _ in breaks_} == {f"{h}: /etc/systemd/system/cri-docker.service.d/30-nvidia.conf" for h in (
        "pool-a100-ib", "pool-a100-ib.team-language", "pool-a100-ib.team-vision", "pool-h100-ib")}
    assert all(w.startswith("the image build's drop-in does not start docker.service on /etc/docker/daemon-nvidia.json")
               for _, w in breaks_)


def test_the_pinned_versions_are_the_recipes_not_the_checks() -> None:
    """The check names no version of its own: what it compares comes from the recipe."""
    source = Path(gpu_runtime.__file__).read_text()
    recipe, _ = gpu_runtime._data()
    versions = {p.version for r in recipe.apt_repositories.values() for p in r.packages}
    versions |= {upstream_version(v) for v in versions}
    assert versions and not [v for v in versions if v in source]
