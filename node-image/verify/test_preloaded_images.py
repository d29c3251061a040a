"""Preloaded images: in the runtime's store after boot, with the IDs the build baked."""

from __future__ import annotations

from typing import Any

import pytest
import testinfra

from kilonode.image.probes import run_ok
from kilonode.plan.model import NodePoolPlan


@pytest.mark.persistent
def test_preloaded_image_in_runtime_store(host: testinfra.host.Host, pool: NodePoolPlan,
                                          preloaded: dict[str, Any]) -> None:
    image = preloaded["image"]
    if pool.runtime == "docker":
        result = host.run(f"docker image inspect -f '{{{{.Id}}}}' {image}")
        assert result.rc == 0, f"{image} is not in docker's store"
        assert result.stdout.strip() == preloaded["image_id"], f"{image} is {result.stdout.strip()}, not the baked one"
    else:
        listed = run_ok(host, "ctr -n k8s.io images ls -q").split()
        assert image in listed, f"{image} not in containerd's k8s.io namespace"


def test_baked_archive_on_node(host: testinfra.host.Host, preloaded: dict[str, Any]) -> None:
    archive = host.file(preloaded["path"])
    assert archive.exists, f"{preloaded['path']} missing"
    assert archive.sha256sum == preloaded["sha256"]


def test_sandbox_image_is_the_preloaded_pause_image(host: testinfra.host.Host, pool: NodePoolPlan,
                                                    manifest: Any) -> None:
    preloaded = {i["image"] for i in manifest.preloaded_images}
    if pool.runtime == "docker":
        exec_start = run_ok(host, "systemctl show cri-docker.service -p ExecStart --value")
        flags = [w for w in exec_start.split() if w.startswith("--pod-infra-container-image=")]
        assert flags, "cri-docker.service has no --pod-infra-container-image"
        sandbox = flags[0].split("=", 1)[1].rstrip(";")
    else:
        dump = run_ok(host, "containerd config dump")
        sandbox = next(
            (line.split("=", 1)[1].strip().strip('"') for line in dump.splitlines() if "sandbox_image" in line), ""
        )
    assert sandbox == pool.pause_image, f"sandbox image {sandbox!r}, the plan says {pool.pause_image!r}"
    assert sandbox in preloaded, f"sandbox image {sandbox} is not preloaded: the first pod would need a pull"


@pytest.mark.persistent
def test_loader_is_idempotent(host: testinfra.host.Host, pool: NodePoolPlan, manifest: Any) -> None:
    """Running the boot-time loader again changes nothing and succeeds."""
    out = run_ok(host, "/usr/local/lib/kilonode/load-preloaded-images")
    for image in manifest.preloaded_images:
        assert f"already present: {image['image']}" in out, out
