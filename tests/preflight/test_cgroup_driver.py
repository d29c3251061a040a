"""contracts: the kubelet's cgroupDriver against the runtime's (catalog/contracts.yaml containerd and
criDockerd, kubelet-cgroup-driver).

At the pinned versions the kubelet (1.34, KubeletCgroupDriverFromCRI GA) asks its runtime for the
cgroup driver over the CRI RuntimeConfig call. containerd 1.7.34 does not implement it (cri-api
v0.27.1), so on containerd pools the kubelet runs with its own field: a kubelet on cgroupfs with
runc on systemd leaves every pod sandbox failing, and the reverse runs the pods outside the kubelet's
cgroups; both are breaks. cri-dockerd (0.3.26, release/0.3) answers with Docker's driver and the
kubelet uses it: on Docker pools the field is inert, a disagreement a warning. The shipped stacks
pass; research-2500 runs containerd, research-7500 and local Docker."""

from __future__ import annotations

import json
import tomllib
from collections.abc import Callable

import pytest
import tomli_w
import yaml

from kilonode.preflight import run
from kilonode.preflight.checks.contracts import default_handler, runtime_cgroup_drivers
from kilonode.preflight.model import Finding
from tests.preflight.conftest import artefacts, inputs_of

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

KUBELET = "etc/kubernetes/kubelet-config.yaml"
CONTAINERD = ("etc/containerd/config.toml", "etc/containerd/config-nvidia.toml")
DOCKER = ("etc/docker/daemon.json", "etc/docker/daemon-nvidia.json")
LINES = {"containerd/kubelet-cgroup-driver", "criDockerd/kubelet-cgroup-driver"}


def driver_findings(stack: str, files: dict[str, str]) -> list[Finding]:
    """The contracts check's findings on the cgroup-driver lines."""
    return [f for f in run(inputs_of(stack, files=files), ["contracts"])
            if any(f"contract line {line}:" in f.what for line in LINES)]


def edit(files: dict[str, str], ending: tuple[str, ...] | str, change: Callable[[str], str]) -> list[str]:
    """Every host file whose path ends with one of `ending` rewritten by `change`; the hosts."""
    endings = (ending,) if isinstance(ending, str) else ending
    hosts = []
    for path in sorted(p for p in files if p.endswith(endings)):
        changed = change(files[path])
        assert changed != files[path], path
        files[path] = changed
        hosts.append(path.split("/", 1)[0])
    return sorted(set(hosts))


def kubelet_driver(driver: str) -> Callable[[str], str]:
    def change(text: str) -> str:
        document = yaml.safe_load(text)
        document["cgroupDriver"] = driver
        return yaml.safe_dump(document)
    return change


def docker_driver(driver: str) -> Callable[[str], str]:
    def change(text: str) -> str:
        document = json.loads(text)
        document["exec-opts"] = [f"native.cgroupdriver={driver}"]
        return json.dumps(document)
    return change


def test_the_shipped_stacks_kubelets_and_runtimes_agree(shipped: str) -> None:
    assert driver_findings(shipped, artefacts(shipped)[0]) == []


def test_the_shipped_runtime_configurations_say_systemd_for_every_handler() -> None:
    files, _ = artefacts("research-2500")
    nvidia = [p for p in files if p.endswith(CONTAINERD[1])]
    assert nvidia, "research-2500 has GPU pools on containerd"
    text = files[nvidia[0]]
    assert runtime_cgroup_drivers(text, "containerdRuncOptions") == {"runc": "systemd", "nvidia": "systemd"}
    assert default_handler(text, "containerdRuncOptions") == "nvidia"
    files, _ = artefacts("research-7500")
    daemon = next(p for p in files if p.endswith(DOCKER[1]))
    assert runtime_cgroup_drivers(files[daemon], "dockerExecOpts") == {"*": "systemd"}


def test_a_cgroupfs_kubelet_with_containerds_systemd_runc_is_a_break_on_every_containerd_host() -> None:
    files, _ = artefacts("research-2500")
    hosts = edit(files, KUBELET, kubelet_driver("cgroupfs"))
    found = driver_findings("research-2500", files)
    assert sorted(f.where.split(":")[0] for f in found) == hosts and len(hosts) >= 3
    assert all(f.level == "break" and "contract line containerd/kubelet-cgroup-driver" in f.what for f in found)
    what = found[0].what
    assert "the kubelet runs with cgroupDriver cgroupfs" in what
    assert "handler runc systemd" in what
    assert 'runc under the systemd cgroup manager refuses it' in what
    assert "RunPodSandbox fails for every pod of the node" in what
    gpu = [f for f in found if "config-nvidia.toml handler nvidia systemd" in f.what]
    assert gpu, "the NVIDIA handler is judged too"


def test_a_systemd_kubelet_with_containerds_cgroupfs_runc_is_a_break() -> None:
    files, _ = artefacts("research-2500")
    hosts = edit(files, CONTAINERD, lambda t: t.replace("SystemdCgroup = true", "SystemdCgroup = false"))
    found = driver_findings("research-2500", files)
    assert sorted(f.where.split(":")[0] for f in found) == hosts
    assert all(f.level == "break" for f in found)
    assert "the containers run outside the kubelet's pod and QoS cgroups" in found[0].what


def test_the_nvidia_handler_alone_on_another_driver_is_a_break_on_the_gpu_pools() -> None:
    files, _ = artefacts("research-2500")

    def nvidia_cgroupfs(text: str) -> str:
        document = tomllib.loads(text)
        runtimes = document["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]
        runtimes["nvidia"]["options"]["SystemdCgroup"] = False
        return tomli_w.dumps(document)

    hosts = edit(files, CONTAINERD[1], nvidia_cgroupfs)
    found = driver_findings("research-2500", files)
    assert sorted(f.where.split(":")[0] for f in found) == hosts
    assert all(f.level == "break" and "config-nvidia.toml handler nvidia cgroupfs" in f.what
               and "handler runc" not in f.what for f in found)


@pytest.mark.parametrize("kubelet, docker", [("cgroupfs", None), ("systemd", "cgroupfs")])
def test_on_docker_pools_a_disagreement_is_a_warning_the_kubelet_takes_dockers_driver(
        kubelet: str, docker: str | None) -> None:
    files, _ = artefacts("research-7500")
    hosts = edit(files, KUBELET, kubelet_driver(kubelet)) if kubelet != "systemd" else []
    if docker:
        hosts = edit(files, DOCKER, docker_driver(docker))
    found = driver_findings("research-7500", files)
    assert sorted(f.where.split(":")[0] for f in found) == hosts and hosts
    assert all(f.level == "warn" and "contract line criDockerd/kubelet-cgroup-driver" in f.what for f in found)
    assert "the kubelet asks the runtime and uses its driver, so the field is inert" in found[0].what


def test_a_kubelet_without_a_cgroup_driver_is_read_as_cgroupfs() -> None:
    files, _ = artefacts("research-2500")

    def drop(text: str) -> str:
        document = yaml.safe_load(text)
        del document["cgroupDriver"]
        return yaml.safe_dump(document)

    edit(files, KUBELET, drop)
    found = driver_findings("research-2500", files)
    assert found and all("the kubelet runs with cgroupDriver cgroupfs" in f.what for f in found)
