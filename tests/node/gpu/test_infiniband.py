"""The InfiniBand ports (kilonode.gpu.infiniband) and the agent's use of them: on pools whose
config says expectInfiniband (the size catalogue's infinibandLinks), every port the size has
must be there, ACTIVE and at its rate, or the node is kept pending at boot and then taken out,
each missing, down or slow port named.

No HCA here: a fake /sys/class/infiniband tree, laid out as the kernel writes it
(drivers/infiniband/core/sysfs.c: `state` "4: ACTIVE", `rate` "400 Gb/sec (4X NDR)"), with
Azure's accelerated-networking device beside the InfiniBand ones (an mlx5 RDMA device whose
link layer is Ethernet)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kilonode.catalog.vm import vm_size
from kilonode.k8s import rdma
from kilonode.node.gpu import active, agent, infiniband, protocol
from kilonode.node.gpu.readings import read_dir
from kilonode.node.gpu.rules import evaluate, infiniband_findings
from kilonode.plan import ClusterPlan
from kilonode.render.pool import GPU_HEALTH_CONFIG, render_pool
from tests.node.gpu.test_active_child import booting
from tests.node.gpu.test_agent import config_file
from tests.node.gpu.test_gpu_health import FIXTURES

BURN = json.loads((FIXTURES / "burn.json").read_text())
NDR = "400 Gb/sec (4X NDR)"
HDR = "200 Gb/sec (4X HDR)"
ACTIVE, INIT, DOWN = "4: ACTIVE", "2: INIT", "1: DOWN"
LINK_UP, POLLING = "5: LinkUp", "2: Polling"
H100 = {"ports": 8, "gbps": 400}  # Standard_ND96isr_H100_v5's infinibandLinks


def port(sysfs: Path, device: str, *, layer: str = "InfiniBand", state: str | None = ACTIVE,
         phys: str = LINK_UP, rate: str | None = NDR) -> None:
    """One device with port 1, as sysfs shows it (an attribute None: unreadable)."""
    where = sysfs / device / "ports" / "1"
    where.mkdir(parents=True, exist_ok=True)
    for name, value in (("link_layer", layer), ("state", state), ("phys_state", phys), ("rate", rate)):
        if value is None:
            (where / name).unlink(missing_ok=True)
        else:
            (where / name).write_text(value + "\n")


def nd_h100(sysfs: Path, hcas: int = 8, **changes: dict[str, Any]) -> Path:
    """An ND H100 v5's tree: mlx5_an0 (Ethernet, accelerated networking) and `hcas` InfiniBand
    VFs (mlx5_ib0..), each ACTIVE at NDR unless `changes` says otherwise for it."""
    port(sysfs, "mlx5_an0", layer="Ethernet", rate="100 Gb/sec (2X EDR)")
    for n in range(hcas):
        port(sysfs, f"mlx5_ib{n}", **changes.get(f"mlx5_ib{n}", {}))
    return sysfs


def lines(found: dict[str, Any]) -> list[str]:
    return [f.line() for f in infiniband_findings(found)]


# --- the reading and the rules, on fake trees ------------------------------------------------------

def test_eight_active_ndr_ports_pass_and_the_ethernet_device_is_left_out(tmp_path: Path) -> None:
    found = infiniband.reading(8, 400, nd_h100(tmp_path / "sys"))
    assert [p["device"] for p in found["ports"]] == [f"mlx5_ib{n}" for n in range(8)]
    assert found["skipped"] == {"mlx5_an0/1": "Ethernet"}
    assert found["ports"][0] == {"device": "mlx5_ib0", "port": 1, "linkLayer": "InfiniBand", "state": ACTIVE,
                                 "physState": LINK_UP, "rate": NDR}
    assert infiniband.ready(found) and lines(found) == []


def test_a_missing_virtual_function_is_named_by_what_is_there(tmp_path: Path) -> None:
    found = infiniband.reading(8, 400, nd_h100(tmp_path / "sys", hcas=7))
    assert lines(found) == [
        "infiniband-ports-missing: 7 of 8 InfiniBand ports present, the size has 8 (a virtual function not attached, "
        "or its driver not bound) [/sys/class/infiniband lists 7 InfiniBand port(s): mlx5_ib0 port 1, mlx5_ib1 port "
        "1, mlx5_ib2 port 1, mlx5_ib3 port 1, mlx5_ib4 port 1, mlx5_ib5 port 1, mlx5_ib6 port 1; not InfiniBand: "
        "mlx5_an0/1 (link layer Ethernet)] -> drain"]
    # no RDMA device at all (ib_core not loaded, nothing attached): none present, none judged
    assert lines(infiniband.reading(8, 400, tmp_path / "absent")) == [
        "infiniband-ports-missing: 0 of 8 InfiniBand ports present, the size has 8 (a virtual function not attached, "
        "or its driver not bound) [/sys/class/infiniband lists 0 InfiniBand port(s): none] -> drain"]


def test_each_port_down_or_below_the_sizes_rate_is_named(tmp_path: Path) -> None:
    sysfs = nd_h100(tmp_path / "sys", mlx5_ib3={"state": DOWN, "phys": POLLING, "rate": "10 Gb/sec (4X SDR)"},
                    mlx5_ib5={"rate": HDR}, mlx5_ib6={"state": INIT}, mlx5_ib7={"rate": None})
    assert lines(infiniband.reading(8, 400, sysfs)) == [
        "infiniband-port-down: InfiniBand mlx5_ib3 port 1 is not ACTIVE [state 1: DOWN, phys_state 2: Polling, rate "
        "10 Gb/sec (4X SDR)] -> drain",
        "infiniband-port-slow: InfiniBand mlx5_ib5 port 1 runs below the size's rate [state 4: ACTIVE, phys_state "
        "5: LinkUp, rate 200 Gb/sec (4X HDR) (the size's links run at 400 Gb/s)] -> drain",
        "infiniband-port-down: InfiniBand mlx5_ib6 port 1 is not ACTIVE [state 2: INIT, phys_state 5: LinkUp, rate "
        "400 Gb/sec (4X NDR)] -> drain",
        # a rate that cannot be read is never taken for the size's
        "infiniband-port-slow: InfiniBand mlx5_ib7 port 1 runs below the size's rate [state 4: ACTIVE, phys_state "
        "5: LinkUp, rate unknown (the size's links run at 400 Gb/s)] -> drain"]
    assert all(f.taints for f in infiniband_findings(infiniband.reading(8, 400, sysfs))), "each takes the node out"


def test_an_a100_sizes_hdr_ports_pass_at_its_own_rate(tmp_path: Path) -> None:
    sysfs = tmp_path / "sys"
    for n in range(8):
        port(sysfs, f"mlx5_ib{n}", rate=HDR)
    assert infiniband.ready(infiniband.reading(8, 200, sysfs))
    assert not infiniband.ready(infiniband.reading(8, 400, sysfs)), "the same ports on an NDR size are slow"


@pytest.mark.parametrize(("text", "gbps"), [(NDR, 400.0), (HDR, 200.0), ("2.5 Gb/sec (1X SDR)", 2.5),
                                            ("garbage", None), (None, None)])
def test_the_rate_is_read_as_the_kernel_writes_it(text: str | None, gbps: float | None) -> None:
    assert infiniband.rate_gbps(text) == gbps


def test_recorded_ports_are_judged_with_the_other_readings(tmp_path: Path) -> None:
    recorded = tmp_path / "recorded"
    recorded.mkdir()
    (recorded / "nvidia-smi-q.xml").write_bytes((FIXTURES / "nvidia-smi-q.xml").read_bytes())
    found = infiniband.reading(8, 400, nd_h100(tmp_path / "sys", mlx5_ib2={"state": DOWN}))
    (recorded / "infiniband.json").write_text(json.dumps(found))
    assert [f.check for f in evaluate(read_dir(recorded), 1) if f.taints] == ["infiniband-port-down"]


# --- the agent: the config key, the wait at boot, the report ----------------------------------------

def booted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sysfs: Path, **config: object) -> tuple[agent.Agent,
                                                                                                   Any, Any]:
    """An agent at its first start in a boot (the recorded H100's active figures: no CUDA here),
    reading its InfiniBand ports from `sysfs`."""
    monkeypatch.setattr(active, "run", lambda model: json.loads(json.dumps(BURN)))
    monkeypatch.setattr(infiniband, "SYS_INFINIBAND", sysfs)
    return booting(tmp_path, monkeypatch, **config)


def test_a_node_with_every_port_active_at_its_rate_passes_saying_so(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    runner, recorder, clock = booted(tmp_path, monkeypatch, nd_h100(tmp_path / "sys"), expectInfiniband=H100)
    assert runner.config.expect_infiniband == (8, 400)
    runner.startup()
    assert recorder.sent == [("True", "Passed")] and clock.now == 0
    assert "InfiniBand: 8 ports ACTIVE at >= 400 Gb/s" in (runner.state.message or "")
    assert runner.state.last_active > 0, "the active check ran"


def test_ports_still_coming_up_at_boot_keep_the_node_pending_then_it_passes(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    # 20 s in: the eighth virtual function attached and the subnet manager activated the others
    sysfs = nd_h100(tmp_path / "sys", hcas=7, mlx5_ib0={"state": INIT}, mlx5_ib1={"state": DOWN, "phys": POLLING})
    runner, recorder, clock = booted(tmp_path, monkeypatch, sysfs, expectInfiniband=H100, fabricWaitSeconds=60)
    sleep = clock.sleep

    def come_up(seconds: float) -> None:
        sleep(seconds)
        if clock.now >= 20:
            nd_h100(sysfs)

    monkeypatch.setattr(clock, "sleep", come_up)
    runner.startup()
    assert recorder.sent == [("Unknown", protocol.REASON_INFINIBAND_PENDING), ("True", "Passed")]
    assert clock.now == 20 and runner.state.last_active > 0


def test_ports_never_up_are_a_fault_naming_each_once_the_wait_is_up(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    sysfs = nd_h100(tmp_path / "sys", hcas=7, mlx5_ib4={"state": DOWN, "phys": POLLING}, mlx5_ib6={"rate": HDR})
    runner, recorder, clock = booted(tmp_path, monkeypatch, sysfs, expectInfiniband=H100, fabricWaitSeconds=30)
    runner.startup()
    assert recorder.sent == [("Unknown", protocol.REASON_INFINIBAND_PENDING), ("False", "InfinibandPortsMissing")]
    assert clock.now == 30, "bounded by fabric_wait_s, polled every HCA_RETRY_S"
    message = runner.state.message or ""
    assert [line.split(":")[0] for line in message.splitlines()] == [
        "infiniband-ports-missing", "infiniband-port-down", "infiniband-port-slow"]
    assert "mlx5_ib4 port 1 is not ACTIVE" in message and "mlx5_ib6 port 1 runs below" in message
    assert runner.state.last_active == 0, "no active check: the node is out either way"


def test_a_port_that_goes_down_later_is_seen_at_the_next_passive_check(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    sysfs = nd_h100(tmp_path / "sys")
    runner, recorder, _ = booted(tmp_path, monkeypatch, sysfs, expectInfiniband=H100)
    runner.startup()
    assert recorder.sent == [("True", "Passed")]
    port(sysfs, "mlx5_ib2", state=DOWN, phys=POLLING)
    readings, found, _ = agent.check(runner.config, runner.config.state_dir / "readings", False, None)
    assert readings is not None and readings.infiniband is not None
    assert [(f.check, f.taints) for f in found] == [("infiniband-port-down", True)]
    runner.full_check(active=False)
    assert recorder.sent[-1] == ("False", "InfinibandPortDown")


# --- the RDMA device plugin's rescan: a node is not reported before it has listed every HCA ---------

RESCAN = {"expectInfiniband": H100, "rdmaDevicePluginRescanSeconds": 30}


def test_a_first_pass_waits_one_plugin_rescan_after_the_ports_were_up(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # the active check is instant here: the pass would come at 0 s, before the plugin's next scan
    runner, recorder, clock = booted(tmp_path, monkeypatch, nd_h100(tmp_path / "sys"), **RESCAN)
    assert runner.config.rdma_plugin_rescan_s == 30
    said: list[str] = []
    send = runner.send
    monkeypatch.setattr(runner, "send", lambda report: (said.append(report.condition["message"]), send(report)))
    runner.startup()
    assert recorder.sent == [("Unknown", protocol.REASON_INFINIBAND_PENDING), ("True", "Passed")]
    assert clock.now == 30, "one periodicUpdateInterval after the ports were seen up"
    assert said[0].startswith("every InfiniBand port is up; waiting until 30 s (the RDMA device plugin's "
                              "periodicUpdateInterval) have passed since")
    # later checks of the boot never wait again
    runner.full_check(active=False)
    assert clock.now == 30 and recorder.sent[-1] == ("True", "Passed")


def test_the_rescan_is_counted_from_the_last_port_not_from_the_boot(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    sysfs = nd_h100(tmp_path / "sys", hcas=7)  # the eighth virtual function arrives at 20 s
    runner, recorder, clock = booted(tmp_path, monkeypatch, sysfs, fabricWaitSeconds=60, **RESCAN)
    sleep = clock.sleep

    def arrive(seconds: float) -> None:
        sleep(seconds)
        if clock.now >= 20:
            nd_h100(sysfs)

    monkeypatch.setattr(clock, "sleep", arrive)
    runner.startup()
    assert recorder.sent == [("Unknown", protocol.REASON_INFINIBAND_PENDING),
                             ("Unknown", protocol.REASON_INFINIBAND_PENDING), ("True", "Passed")]
    assert clock.now == 20 + 30


def test_an_active_check_longer_than_the_rescan_adds_no_wait(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    runner, recorder, clock = booted(tmp_path, monkeypatch, nd_h100(tmp_path / "sys"), **RESCAN)

    def slow(model: str) -> dict[str, Any]:
        clock.sleep(120)  # about what 8 GPUs take
        return json.loads(json.dumps(BURN))

    monkeypatch.setattr(active, "run", slow)
    runner.startup()
    assert recorder.sent == [("True", "Passed")] and clock.now == 120


def test_a_fault_is_reported_without_waiting_for_the_rescan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runner, recorder, clock = booted(tmp_path, monkeypatch, nd_h100(tmp_path / "sys"), **RESCAN)
    monkeypatch.setattr(active, "run", lambda model: {**json.loads(json.dumps(BURN)), "gemm_bf16_8192": {
        **BURN["gemm_bf16_8192"], "tflops_median": 1.0}})
    runner.startup()
    assert recorder.sent[-1][0] == "False" and clock.now == 0
    assert ("Unknown", protocol.REASON_INFINIBAND_PENDING) not in recorder.sent


@pytest.mark.parametrize("value", [-1, "30", True, 1.5])
def test_the_rescan_must_be_whole_seconds(tmp_path: Path, value: object) -> None:
    with pytest.raises(agent.ConfigError, match="rdmaDevicePluginRescanSeconds must be a whole number"):
        agent.load_config(config_file(tmp_path, expectInfiniband=H100, rdmaDevicePluginRescanSeconds=value))


def test_the_rescan_needs_the_ports_it_counts_from(tmp_path: Path) -> None:
    with pytest.raises(agent.ConfigError, match="rdmaDevicePluginRescanSeconds needs expectInfiniband"):
        agent.load_config(config_file(tmp_path, rdmaDevicePluginRescanSeconds=30))


def test_without_the_config_key_no_port_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sysfs = nd_h100(tmp_path / "sys", hcas=3)  # it would fail, were it read
    runner, recorder, _ = booted(tmp_path, monkeypatch, sysfs)
    assert runner.config.expect_infiniband is None
    runner.startup()
    assert recorder.sent == [("True", "Passed")] and "InfiniBand" not in (runner.state.message or "")
    assert not (runner.config.state_dir / "readings" / "infiniband.json").exists()


@pytest.mark.parametrize("value", [8, {"ports": 8}, {"ports": 0, "gbps": 400}, {"ports": 8, "gbps": "400"},
                                   {"ports": True, "gbps": 400}, {"ports": 8, "gbps": 400, "rate": 1}])
def test_expect_infiniband_must_name_a_positive_count_and_rate(tmp_path: Path, value: object) -> None:
    with pytest.raises(agent.ConfigError, match="expectInfiniband must be "):
        agent.load_config(config_file(tmp_path, expectInfiniband=value))


# --- the rendered config: from the size catalogue, through the plan ---------------------------------

@pytest.mark.parametrize("stack", ["local", "research-2500", "research-7500"])
def test_the_rendered_config_expects_the_sizes_links_on_infiniband_pools(plans: dict[str, ClusterPlan], stack: str,
                                                                        tmp_path: Path) -> None:
    expected = {}
    for pool in (p for p in plans[stack].node_pools if p.gpus_per_node):
        path = tmp_path / f"{pool.name}.json"
        path.write_text(render_pool(plans[stack], pool)[GPU_HEALTH_CONFIG].content)
        size = vm_size(pool.vm_size)
        links = size.infiniband_links if size and pool.infiniband else None
        assert json.loads(path.read_text()).get("expectInfiniband") == (
            {"ports": links.count, "gbps": links.gbps} if links else None), pool.name
        assert agent.load_config(path).expect_infiniband == ((links.count, links.gbps) if links else None)
        # where the ports are awaited, the first pass also waits one rescan of the RDMA device plugin
        assert agent.load_config(path).rdma_plugin_rescan_s == (rdma.PERIODIC_UPDATE_INTERVAL_S if links else 0)
        expected[pool.vm_size] = agent.load_config(path).expect_infiniband
    if stack == "research-7500":
        # by hand, from Azure's own checks (azurehpc-health-checks conf/nd96isr_h100_v5.conf,
        # conf/nd96asr_v4.conf): eight ports each, NDR on H100 v5, HDR on A100 v4
        assert expected["Standard_ND96isr_H100_v5"] == (8, 400)
        assert expected["Standard_ND96asr_v4"] == (8, 200)
    if stack == "research-2500":  # a GPU pool without InfiniBand (NC A100 v4, PCIe) reads no port
        assert set(expected.values()) == {None}
