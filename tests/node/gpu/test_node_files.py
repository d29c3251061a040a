"""What puts the agent on a GPU node: its unit in the GPU image (systemd accepts it; it can
reach the GPUs) and, per pool, its config, its start by cloud-init and the startup taint the
kubelet registers with; none of it on pools without GPUs."""

from __future__ import annotations

import configparser
import json
import shutil
from pathlib import Path

import pytest
import yaml

from kilonode.node.gpu import agent, metrics, protocol
from kilonode.node.ship import GPU_HEALTH
from kilonode.paths import REPO_ROOT
from kilonode.plan import ClusterPlan, wellknown
from kilonode.render import USER_DATA, gpu_metrics
from kilonode.render.pool import GPU_HEALTH_CONFIG, KUBELET_CONFIG, render_pool
from tests.render.consumers import systemd_verify

UNIT = REPO_ROOT / "node-image" / "gpu" / "rootfs" / "etc" / "systemd" / "system" / "kilonode-gpu-health.service"


def test_systemd_accepts_the_agents_unit_and_it_runs_the_agent_as_specified(tmp_path: Path) -> None:
    if not shutil.which("systemd-analyze"):
        pytest.fail("systemd-analyze missing: run `make setup` (installs .ci/debian-packages.txt)")
    unit_dir = tmp_path / "units"
    unit_dir.mkdir()
    shutil.copy(UNIT, unit_dir)
    assert systemd_verify(unit_dir, [unit_dir / UNIT.name]) == []
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(UNIT.read_text())
    service, unit = parser["Service"], parser["Unit"]
    assert service["ExecStart"] == "/usr/bin/python3 -m kilonode.gpu.agent --config /etc/kilonode/gpu-health.json"
    assert f"/{GPU_HEALTH_CONFIG}" == "/etc/kilonode/gpu-health.json"
    # the unit runs the package where kilonode.node.ship puts it
    assert GPU_HEALTH.module == "kilonode.gpu" and f"-m {GPU_HEALTH.module}.agent " in service["ExecStart"]
    assert "PYTHONPATH=" + str(GPU_HEALTH.pythonpath) in UNIT.read_text()
    assert {"kubelet.service", "nvidia-persistenced.service"} <= set(unit["After"].split())
    # Fabric Manager: start order only; the wait for the fabric's registration is the agent's
    assert "nvidia-fabricmanager.service" in unit["After"].split()
    assert "kilonode.gpu.agent await_fabric" in " ".join(UNIT.read_text().split())
    assert callable(agent.Agent.await_fabric)
    # restarts, bounded
    assert service["Restart"] == "on-failure" and int(unit["StartLimitBurst"]) > 0
    # its per-boot state: /run (tmpfs), kept across restarts of the agent
    assert service["RuntimeDirectory"] == "kilonode/gpu-health" and service["RuntimeDirectoryPreserve"] == "yes"
    # the agent's default stateDir is that directory, and its metrics record is there
    config = tmp_path / "gpu-health.json"
    config.write_text(json.dumps({"expectGpus": 8, "kubeconfig": wellknown.KUBELET_KUBECONFIG}))
    assert agent.load_config(config).state_dir == Path("/run/kilonode/gpu-health") == Path(metrics.AGENT_STATE_DIR)
    assert f"/run/{service['RuntimeDirectory']}/{metrics.METRICS_FILE}" == metrics.AGENT_RECORD
    # hardening that leaves the GPUs reachable: /dev/nvidia* device nodes, nvidia-uvm loading
    # (systemd.exec(5): ProtectClock implies DeviceAllow=char-rtc r, and any DeviceAllow turns
    # the default DevicePolicy=auto into an allow-list; ProtectKernelLogs hides /dev/kmsg)
    for blocking in ("PrivateDevices", "DevicePolicy", "DeviceAllow", "ProtectClock", "ProtectKernelLogs",
                     "ProtectKernelModules", "User", "CapabilityBoundingSet"):
        assert blocking not in service, f"{blocking} would keep the agent from the GPUs"
    assert service["ProtectSystem"] == "strict"


def gpu_and_cpu_pools(plan: ClusterPlan) -> tuple[list, list]:  # type: ignore[type-arg]
    return ([p for p in plan.node_pools if p.gpus_per_node], [p for p in plan.node_pools if not p.gpus_per_node])


@pytest.mark.parametrize("stack", ["local", "research-2500", "research-7500"])
def test_gpu_pools_get_the_agent_its_config_and_the_startup_taint(plans: dict[str, ClusterPlan], stack: str,
                                                                  tmp_path: Path) -> None:
    plan = plans[stack]
    gpu, cpu = gpu_and_cpu_pools(plan)
    startup = f"{protocol.STARTUP_TAINT}={protocol.STARTUP_VALUE}:NoSchedule"
    for pool in gpu:
        files = render_pool(plan, pool)
        path = tmp_path / f"{pool.name}.json"
        path.write_text(files[GPU_HEALTH_CONFIG].content)
        config = agent.load_config(path)  # the agent's own checks
        assert config.expect_gpus == pool.gpus_per_node and config.kubeconfig == Path(wellknown.KUBELET_KUBECONFIG)
        assert config.node_name is None, "the hostname, lower-cased, as the kubelet names itself"
        assert "hostname-override" not in files["etc/systemd/system/kubelet.service"].content
        assert startup in pool.taints
        kubelet = yaml.safe_load(files[KUBELET_CONFIG].content.split("\n", 1)[1])
        assert {"key": protocol.STARTUP_TAINT, "value": protocol.STARTUP_VALUE, "effect": "NoSchedule"} \
            in kubelet["registerWithTaints"]
        runcmd = yaml.safe_load(files[USER_DATA].content)["runcmd"]
        enable = next(c for c in runcmd if c[:3] == ["systemctl", "enable", "--now"] and "kubelet.service" in c)
        # the agent after the kubelet, then the socket that answers for it
        assert enable[-2:] == ["kilonode-gpu-health.service", gpu_metrics.AGENT_SOCKET]
        assert enable.index("kubelet.service") < len(enable) - 2
        assert set(gpu_metrics.agent_metrics_files()) <= set(files)
    for pool in cpu:
        files = render_pool(plan, pool)
        assert GPU_HEALTH_CONFIG not in files and startup not in pool.taints
        assert "kilonode-gpu-health" not in files[USER_DATA].content
        assert not set(gpu_metrics.agent_metrics_files()) & set(files)
    if stack == "research-2500":
        assert [p.name for p in gpu] == ["nc-a100"]
        assert json.loads(render_pool(plan, gpu[0])[GPU_HEALTH_CONFIG].content)["gpuModel"] == "NVIDIA A100 80GB PCIe"
