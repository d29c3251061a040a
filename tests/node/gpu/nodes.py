"""Node objects for the agent and controller tests, shaped as a kubelet registers them, and
the Kubernetes OpenAPI check (kubernetes-validate) the results must pass."""

from __future__ import annotations

import copy
import os
import subprocess
from pathlib import Path, PurePosixPath
from typing import Any

import kubernetes_validate

from kilonode.node.ship import GPU_HEALTH

# The Kubernetes version the shipped stacks run (their kubernetesVersion's minor).
K8S_VERSION = "1.34.0"
DEBIAN_PYTHON = "/usr/bin/python3"  # Debian's python3, as on the nodes: no venv, no numpy


def node(name: str = "nc-a100-000001", boot: str = "boot-1", taints: list[dict[str, str]] | None = None,
         conditions: list[dict[str, Any]] | None = None, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": "0b6c1d2e-3f40-4a5b-8c6d-7e8f90a1b2c3",
            "resourceVersion": "4711",
            "labels": {"kubernetes.io/hostname": name, "kilonode.io/pool": "nc-a100"},
            "annotations": dict(annotations or {}),
        },
        "spec": {
            "providerID": "azure:///subscriptions/x/resourceGroups/rg/providers/Microsoft.Compute/"
                          "virtualMachineScaleSets/nc-a100-0/virtualMachines/1",
            "taints": list(taints or []),
        },
        "status": {
            "conditions": [
                {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready",
                 "lastHeartbeatTime": "2026-11-23T10:00:00Z", "lastTransitionTime": "2026-11-23T09:59:00Z"},
                *(conditions or []),
            ],
            "nodeInfo": {
                "machineID": "m", "systemUUID": "s", "bootID": boot, "kernelVersion": "6.1.0-28-cloud-amd64",
                "osImage": "Debian GNU/Linux 12 (bookworm)", "containerRuntimeVersion": "containerd://1.6.20",
                "kubeletVersion": "v1.34.2", "kubeProxyVersion": "", "operatingSystem": "linux",
                "architecture": "amd64",
            },
        },
    }


def apply_status_patch(current: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """The apiserver's strategic merge of a conditions patch: items merge by `type`
    (NodeStatus.conditions, patchMergeKey type), fields of the patch win."""
    result = copy.deepcopy(current)
    conditions = result["status"].setdefault("conditions", [])
    for change in patch["status"]["conditions"]:
        existing = next((c for c in conditions if c["type"] == change["type"]), None)
        if existing is None:
            conditions.append(dict(change))
        else:
            existing.update(change)
    return result


def validate(obj: dict[str, Any]) -> None:
    kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def node_pythonpath(tmp_path: Path) -> Path:
    """tmp_path/python holding the GPU health package as the image does under its PYTHONPATH
    (the files kilonode.node.ship ships, at their paths below it); made once per tmp_path."""
    root = tmp_path / "python"
    if not root.exists():
        for path, data, _mode in GPU_HEALTH.files():
            target = root / PurePosixPath(path).relative_to(str(GPU_HEALTH.pythonpath))
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
    return root


def run_debian(tmp_path: Path, module: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run a kilonode.gpu module as the node does: Debian's python3 without the project's venv,
    the package shipped alone to a PYTHONPATH directory (the image's
    /usr/local/lib/kilonode/python). -S keeps even Debian's dist-packages out: the standard
    library alone must do (numpy is imported only inside the active check)."""
    if not Path(DEBIAN_PYTHON).is_file():
        raise AssertionError(f"{DEBIAN_PYTHON} missing: the tests run the agent with Debian's python3, as the "
                             "nodes do (Debian package python3, .ci/debian-packages.txt)")
    root = node_pythonpath(tmp_path)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(root), "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run([DEBIAN_PYTHON, "-S", "-m", module, *args], capture_output=True, text=True, env=env,
                          timeout=120, check=False)
