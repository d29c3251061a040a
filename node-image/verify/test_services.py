"""Services: nothing failed, cloud-init finished cleanly, the node's daemons run."""

from __future__ import annotations

import json
from typing import Any

import pytest
import testinfra

from kilonode.image.probes import run_ok
from kilonode.plan.model import NodePoolPlan


@pytest.mark.persistent
def test_no_failed_units(host: testinfra.host.Host) -> None:
    failed = [line.split()[0] for line in run_ok(host, "systemctl list-units --failed --no-legend --plain").splitlines()
              if line.strip()]
    assert failed == [], f"failed units: {', '.join(failed)}"


@pytest.mark.persistent
def test_system_running(host: testinfra.host.Host) -> None:
    state = host.run("systemctl is-system-running").stdout.strip()
    assert state == "running", f"systemd reports {state!r}"


def test_cloud_init_finished_without_errors(host: testinfra.host.Host) -> None:
    status = run_ok(host, "cloud-init status --long")
    assert "status: done" in status, status
    result = json.loads(run_ok(host, "cat /run/cloud-init/result.json"))
    assert result["v1"]["errors"] == [], f"cloud-init errors: {result['v1']['errors']}"


def runtime_unit(pool: NodePoolPlan) -> str:
    return "docker.service" if pool.runtime == "docker" else "containerd.service"


@pytest.mark.persistent
@pytest.mark.parametrize(
    "unit", ["runtime", "ssh.service", "systemd-networkd.service", "kilonode-preload-images.service",
             # pods' traffic to the instance metadata service dropped (kilonode.render.metadata_block)
             "kilonode-metadata-block.service",
             # the node's unauthenticated ports kept to their scraper (kilonode.render.node_ports)
             "kilonode-node-ports.service"]
)
def test_service_active(host: testinfra.host.Host, pool: NodePoolPlan, unit: str) -> None:
    name = runtime_unit(pool) if unit == "runtime" else unit
    state = host.run(f"systemctl is-active {name}").stdout.strip()
    assert state == "active", f"{name} is {state!r}"


@pytest.mark.persistent
def test_runtime_enabled_at_boot(host: testinfra.host.Host, pool: NodePoolPlan) -> None:
    assert host.service(runtime_unit(pool).removesuffix(".service")).is_enabled


def unit_property(host: testinfra.host.Host, unit: str, prop: str) -> str:
    return run_ok(host, f"systemctl show {unit} -p {prop} --value").strip()


@pytest.mark.persistent
def test_kubernetes_unit_installed_and_enabled(host: testinfra.host.Host, binary: dict[str, Any]) -> None:
    """Everything around kubelet / cri-dockerd is in place, binary or not."""
    unit = f"{'cri-docker' if binary['name'] == 'cri-dockerd' else binary['name']}.service"
    assert unit_property(host, unit, "LoadState") == "loaded", f"{unit} not loaded"
    assert unit_property(host, unit, "UnitFileState") == "enabled", f"{unit} not enabled"


@pytest.mark.persistent
def test_kubernetes_binary_service_running(host: testinfra.host.Host, binary: dict[str, Any]) -> None:
    unit = f"{'cri-docker' if binary['name'] == 'cri-dockerd' else binary['name']}.service"
    on_node = host.file(binary["path"]).exists
    if not binary["present"] and not on_node:
        # An image built --allow-incomplete: the unit must then be skipped by its condition, not failed.
        assert unit_property(host, unit, "ConditionResult") == "no"
        pytest.skip(f"{binary['name']} not in the image ({binary['origin']}); {unit} skipped by its condition")
    assert unit_property(host, unit, "ActiveState") == "active", f"{unit} not active"
