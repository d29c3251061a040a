"""Seeded breaks of Azure Disk CSI's contract (catalog/contracts.yaml azureDiskCsi): each line,
violated in a copy of research-7500's recorded graph, is named by preflight's `contracts` check."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.preflight.conftest import artefacts, resource
from tests.preflight.test_contracts import findings, lines

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

NODE = "csi-azuredisk-node"
CONTROLLER = "csi-azuredisk-controller"


def _pod(graph: dict[str, Any], kind: str, name: str) -> dict[str, Any]:
    spec: dict[str, Any] = resource(graph, kind, name)["inputs"]["spec"]["template"]["spec"]
    return spec


def _container(spec: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in spec["containers"] if c["name"] == name)


def _no_propagation(spec: dict[str, Any]) -> None:
    for mount in _container(spec, "azuredisk")["volumeMounts"]:
        mount.pop("mountPropagation", None)


def _registers_elsewhere(spec: dict[str, Any]) -> None:
    for env in _container(spec, "node-driver-registrar")["env"]:
        if env["name"] == "DRIVER_REG_SOCK_PATH":
            env["value"] = "/var/lib/kubelet/plugins/disk.csi.azure.com-old/csi.sock"


@pytest.mark.parametrize(("kind", "name", "plant", "line", "expected"), [
    ("DaemonSet", NODE, lambda spec: _container(spec, "azuredisk")["securityContext"].update(privileged=False),
     "azureDiskCsi/node-plugin-pod", "container azuredisk is not privileged"),
    ("DaemonSet", NODE, _no_propagation, "azureDiskCsi/node-plugin-pod",
     "mounts the host's /var/lib/kubelet/ with propagation None, not Bidirectional"),
    ("DaemonSet", NODE, lambda spec: spec.update(volumes=[v for v in spec["volumes"] if v["name"] != "device-dir"]),
     "azureDiskCsi/node-plugin-pod", "does not mount the host's /dev"),
    ("DaemonSet", NODE, _registers_elsewhere, "azureDiskCsi/registration-socket", "DRIVER_REG_SOCK_PATH="),
    ("DaemonSet", NODE, lambda spec: _container(spec, "liveness-probe").update(
        args=["--csi-address=/csi/csi.sock", "--http-endpoint=:29603"]),
     "azureDiskCsi/health-endpoints-on-loopback", "runs without --http-endpoint=localhost:29603"),
    ("Deployment", CONTROLLER, lambda spec: spec.update(hostNetwork=False),
     "azureDiskCsi/controller-on-the-host-network", "hostNetwork is False, not True"),
])
def test_a_csi_pod_unlike_upstreams_is_a_break(kind: str, name: str, plant: Callable[[dict[str, Any]], None],
                                               line: str, expected: str) -> None:
    _, graph = artefacts("research-7500")
    plant(_pod(graph, kind, name))
    found = [f for f in findings(graph=graph) if "azureDiskCsi/" in f.what]
    assert lines(found) == {line} and expected in found[0].what


def test_a_node_plugin_that_may_not_read_its_node_is_a_break() -> None:
    _, graph = artefacts("research-7500")
    role = resource(graph, "ClusterRole", "csi-azuredisk-node-role")["inputs"]
    role["rules"] = [r for r in role["rules"] if r["resources"] != ["nodes"]]
    found = [f for f in findings(graph=graph) if "azureDiskCsi/" in f.what]
    assert lines(found) == {"azureDiskCsi/node-plugin-api-reads"}


def test_a_controller_without_lease_rights_is_a_break() -> None:
    _, graph = artefacts("research-7500")
    for name in ("azuredisk-external-provisioner-role", "azuredisk-external-attacher-role",
                 "azuredisk-external-resizer-role"):
        role = resource(graph, "ClusterRole", name)["inputs"]
        role["rules"] = [r for r in role["rules"] if r["resources"] != ["leases"]]
    found = [f for f in findings(graph=graph) if "azureDiskCsi/" in f.what]
    assert lines(found) == {"azureDiskCsi/controller-api-writes"}
