"""The GPUDirect RDMA probe (kilonode.gpu.gpudirect) and the agent's use of it: on pools whose
config says expectGpuDirectRdma, each GPU's memory, exported as a dma-buf, must register on
each InfiniBand HCA, or the node is taken out.

No GPU and no HCA here: two fake shared libraries stand in, built from C beside this file
(fake_libcuda.c, fake_libibverbs.c) with the real signatures and found as libcuda.so.1 and
libibverbs.so.1 through LD_LIBRARY_PATH, so the probe's ctypes declarations are exercised as
on a node: each answers per environment variables and logs the calls it gets, and what was
left allocated, open or registered at exit."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from kilonode.node.gpu import active, agent, gpudirect
from kilonode.node.gpu.rules import gpudirect_findings
from kilonode.plan import ClusterPlan
from kilonode.render.pool import GPU_HEALTH_CONFIG, render_pool
from tests.node.gpu.nodes import DEBIAN_PYTHON, node_pythonpath
from tests.node.gpu.test_active_child import booting
from tests.node.gpu.test_agent import FakeClock, config_file, fake_nvidia_smi
from tests.node.gpu.test_gpu_health import FIXTURES

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

HERE = Path(__file__).parent
BURN = json.loads((FIXTURES / "burn.json").read_text())


@pytest.fixture(scope="module")
def fake_libraries(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Directories holding the fakes: "current" (rdma-core with ibv_reg_dmabuf_mr) and "old"
    (before v34, without it), each with libcuda.so.1 and libibverbs.so.1."""
    if not shutil.which("gcc"):
        pytest.fail("gcc missing: run `make setup` (installs .ci/debian-packages.txt)")
    built = {}
    for flavour, flags in (("current", []), ("old", ["-DOLD_RDMA_CORE"])):
        where = tmp_path_factory.mktemp(f"fake-libs-{flavour}")
        for source, library in (("fake_libcuda.c", "libcuda.so.1"), ("fake_libibverbs.c", "libibverbs.so.1")):
            subprocess.run(["gcc", "-shared", "-fPIC", "-Wall", "-Werror", *flags, "-o", str(where / library),
                            str(HERE / source)], check=True, capture_output=True, text=True)
        built[flavour] = where
    return built


def fakes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, libraries: dict[str, Path], flavour: str = "current",
          **env: str) -> Path:
    """The probe's child finds the fakes (the environment it inherits); returns their call log."""
    log = tmp_path / "fake-calls.log"
    monkeypatch.setenv("LD_LIBRARY_PATH", str(libraries[flavour]))
    monkeypatch.setenv("FAKE_LOG", str(log))
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(gpudirect, "SYS_INFINIBAND", tmp_path / "no-sysfs")  # link layers unknown: probed
    return log


def calls(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def lines(probe: dict[str, Any]) -> list[str]:
    return [f.line() for f in gpudirect_findings(probe)]


def loaded_here(library: str) -> bool:
    return library in Path("/proc/self/maps").read_text()


# --- the probe, in its child process, on the fakes ---------------------------------------------

def test_every_gpus_dma_buf_registers_on_every_infiniband_hca_and_all_is_freed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_libraries: dict[str, Path]) -> None:
    log = fakes(tmp_path, monkeypatch, fake_libraries)
    probe = gpudirect.run(timeout_s=60)
    assert probe["failures"] == [] and lines(probe) == []
    assert probe["gpus"] == [{"index": 0, "busId": "0000:10:00.0", "dmabuf": True},
                             {"index": 1, "busId": "0000:11:00.0", "dmabuf": True}]
    assert probe["hcas"] == ["mlx5_ib0", "mlx5_ib1"] and probe["registered"] == 4
    log_lines = calls(log)
    registrations = [line for line in log_lines if "ibv_reg_dmabuf_mr(" in line]
    # the fake libcuda allocates 0x100 past a page boundary: the range exported and registered
    # is the next page-aligned 2 MiB, NCCL's access flags, each GPU on each HCA, all accepted
    assert [re.sub(r"^\d+ ", "", line) for line in registrations] == [
        f"ibverbs ibv_reg_dmabuf_mr({hca}, offset 0, length 2097152, iova 0x7f00{gpu}0001000, GPU {gpu}, "
        "access 7) = 0" for gpu in (0, 1) for hca in ("mlx5_ib0", "mlx5_ib1")]
    assert not [line for line in log_lines if "LEAK" in line], "every fd, allocation, context, PD, MR freed"
    # per GPU, NCCL's two questions of CUDA, in NCCL's order: GPUDirect RDMA (116), then DMA-BUF (124)
    assert [re.sub(r"^\d+ cuda ", "", line) for line in log_lines if "cuDeviceGetAttribute" in line] == [
        f"cuDeviceGetAttribute({attribute}, GPU {gpu}) = 1" for gpu in (0, 1) for attribute in (116, 124)]
    child = {line.split()[0] for line in log_lines}
    assert len(child) == 1 and str(os.getpid()) not in child, "the CUDA and verbs work ran in a child process"
    assert not loaded_here("libibverbs.so.1") and not loaded_here("libcuda.so.1")


@pytest.mark.parametrize(("env", "flavour", "expected"), [
    # NCCL's own first question (NVIDIA/nccl v2.18.3-1 src/net.cc:291-302): without it no GPUDirect path at all
    ({"FAKE_CUDA_NO_GDR": "0"}, "current", [
        "gpudirect-rdma-unavailable: GPU 0 (0000:10:00.0): GPUDirect RDMA (DMA-BUF) unavailable: NCCL would stage "
        "through host memory [cuDeviceGetAttribute(CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED): 0: CUDA says the "
        "GPU does not support GPUDirect RDMA, so NCCL (ncclGpuGdrSupport) gives it no GPUDirect path to any HCA, "
        "DMA-BUF or not] -> drain"]),
    ({"FAKE_CUDA_NO_DMABUF": "1"}, "current", [
        "gpudirect-rdma-unavailable: GPU 1 (0000:11:00.0): GPUDirect RDMA (DMA-BUF) unavailable: NCCL would stage "
        "through host memory [cuDeviceGetAttribute(CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED): 0: the GPU cannot export "
        "dma-bufs (the proprietary kernel module, not the open one, or a kernel without DMA-BUF)] -> drain"]),
    ({"FAKE_CUDA_EXPORT_FAIL": "0:801"}, "current", [
        "gpudirect-rdma-unavailable: GPU 0 (0000:10:00.0): GPUDirect RDMA (DMA-BUF) unavailable: NCCL would stage "
        "through host memory [cuMemGetHandleForAddressRange(CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD): CUDA error 801 "
        "(CUDA_ERROR_NOT_SUPPORTED)] -> drain"]),
    ({"FAKE_IB_REG_FAIL": "mlx5_ib1:95"}, "current", [
        f"gpudirect-rdma-unavailable: GPU {gpu} (0000:1{gpu}:00.0): GPUDirect RDMA (DMA-BUF) unavailable: NCCL "
        "would stage through host memory [ibv_reg_dmabuf_mr on HCA mlx5_ib1: errno 95 (EOPNOTSUPP: Operation not "
        "supported): the kernel or the HCA's driver registers no dma-buf (NCCL's own test, ncclIbDmaBufSupport, "
        "would turn GPUDirect RDMA off)] -> drain" for gpu in (0, 1)]),
    ({"FAKE_IB_DEVICES": ""}, "current", [
        "gpudirect-rdma-no-hca: no InfiniBand device: GPUDirect RDMA cannot be used (the RDMA stack, ib_uverbs or "
        "the HCAs are missing) [ibv_get_device_list: libibverbs lists no RDMA device (ib_uverbs not loaded, or the "
        "InfiniBand virtual functions not attached)] -> drain"]),
    ({"FAKE_IB_LIST_ERRNO": "38"}, "current", [
        "gpudirect-rdma-no-hca: no InfiniBand device: GPUDirect RDMA cannot be used (the RDMA stack, ib_uverbs or "
        "the HCAs are missing) [ibv_get_device_list: libibverbs finds no RDMA support in the kernel: errno 38 "
        "(ENOSYS: Function not implemented) (ib_uverbs not loaded?)] -> drain"]),
    ({"FAKE_IB_OPEN_FAIL": "mlx5_ib0:19"}, "current", [
        "gpudirect-rdma-unavailable: GPUDirect RDMA (DMA-BUF) unavailable: NCCL would stage through host memory "
        "[HCA mlx5_ib0: ibv_open_device: errno 19 (ENODEV: No such device)] -> drain"]),
    ({}, "old", [
        "gpudirect-rdma-unavailable: GPUDirect RDMA (DMA-BUF) unavailable: NCCL would stage through host memory "
        "[ibv_reg_dmabuf_mr: libibverbs.so.1 lacks it (IBVERBS_1.12: rdma-core older than v34)] -> drain"]),
])
def test_each_failing_step_is_a_finding_naming_the_gpu_the_hca_and_the_call(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_libraries: dict[str, Path], env: dict[str, str],
        flavour: str, expected: list[str]) -> None:
    log = fakes(tmp_path, monkeypatch, fake_libraries, flavour, **env)
    probe = gpudirect.run(timeout_s=60)
    assert lines(probe) == expected
    assert all(f.taints for f in gpudirect_findings(probe)), "each takes the node out"
    assert not [line for line in calls(log) if "LEAK" in line], "freed on the failing paths too"
    # the other GPU and HCA are still probed: a failure on one hides nothing on the others
    if "FAKE_CUDA_NO_GDR" in env or "FAKE_CUDA_NO_DMABUF" in env or "FAKE_CUDA_EXPORT_FAIL" in env:
        assert probe["registered"] == 2
    if "FAKE_IB_OPEN_FAIL" in env:
        assert probe["hcas"] == ["mlx5_ib1"] and probe["registered"] == 2


def test_an_ethernet_rdma_device_is_not_an_infiniband_hca(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          fake_libraries: dict[str, Path]) -> None:
    # Azure's accelerated-networking NIC is an mlx5 RDMA device too, with an Ethernet link layer
    sysfs = tmp_path / "sys-class-infiniband"
    for device, layer in (("mlx5_an0", "Ethernet"), ("mlx5_ib0", "InfiniBand")):
        (sysfs / device / "ports" / "1").mkdir(parents=True)
        (sysfs / device / "ports" / "1" / "link_layer").write_text(layer + "\n")
    fakes(tmp_path, monkeypatch, fake_libraries, FAKE_IB_DEVICES="mlx5_an0,mlx5_ib0")
    monkeypatch.setattr(gpudirect, "SYS_INFINIBAND", sysfs)
    probe = gpudirect.run(timeout_s=60)
    assert (probe["hcas"], probe["skipped"], probe["registered"], probe["failures"]) == (
        ["mlx5_ib0"], {"mlx5_an0": "Ethernet"}, 2, [])
    monkeypatch.setenv("FAKE_IB_DEVICES", "mlx5_an0")
    assert lines(gpudirect.run(timeout_s=60)) == [
        "gpudirect-rdma-no-hca: no InfiniBand device: GPUDirect RDMA cannot be used (the RDMA stack, ib_uverbs or "
        "the HCAs are missing) [ibv_get_device_list: libibverbs lists 1 RDMA device(s), none InfiniBand: mlx5_an0 "
        "(link layer Ethernet) (ib_uverbs not loaded, or the InfiniBand virtual functions not attached)] -> drain"]


def test_a_probe_that_hangs_is_killed_and_the_node_not_vouched_for(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_libraries: dict[str, Path]) -> None:
    assert agent.thresholds()["agent"]["gpudirect_timeout_s"] == 120
    fakes(tmp_path, monkeypatch, fake_libraries, FAKE_CUDA_HANG="1")
    [finding] = gpudirect_findings(gpudirect.run(timeout_s=2))
    assert (finding.check, finding.taints) == ("gpudirect-rdma-unverified", True)
    assert re.fullmatch(r"the probe's process: the GPUDirect RDMA probe did not finish within 2 s "
                        r"\(gpudirect_timeout_s\): its process \(pid \d+\) was killed; a GPU or its driver hung",
                        finding.evidence)


def test_cuda_not_ready_in_the_probe_is_the_fabric_waits_not_a_finding(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_libraries: dict[str, Path]) -> None:
    fakes(tmp_path, monkeypatch, fake_libraries, FAKE_CUDA_INIT="802")
    with pytest.raises(active.SystemNotReady) as error:
        gpudirect.run(timeout_s=60)
    assert str(error.value) == "cuInit: CUDA error 802 (CUDA_ERROR_SYSTEM_NOT_READY)" and error.value.code == 802


def test_the_probe_runs_under_debians_python3_alone_as_on_a_node(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_libraries: dict[str, Path]) -> None:
    log = fakes(tmp_path, monkeypatch, fake_libraries)
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(node_pythonpath(tmp_path)), "FAKE_LOG": str(log),
           "LD_LIBRARY_PATH": str(fake_libraries["current"])}
    result = subprocess.run([DEBIAN_PYTHON, "-S", "-m", "kilonode.gpu.gpudirect", "--sysfs", str(tmp_path / "none")],
                            capture_output=True, text=True, env=env, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    answer = json.loads(result.stdout)
    assert answer["probe"]["registered"] == 4 and answer["probe"]["failures"] == []


# --- the agent: the config key, the report, and nodes without it --------------------------------

def booted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **config: object) -> tuple[agent.Agent, Any, FakeClock]:
    """An agent at its first start in a boot, its active check answering the recorded H100's
    figures (no CUDA 11.8 here), the probe's child on the fakes."""
    monkeypatch.setattr(active, "run", lambda model: json.loads(json.dumps(BURN)))
    return booting(tmp_path, monkeypatch, **config)


def test_a_node_that_must_have_gpudirect_rdma_and_has_it_passes_saying_so(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_libraries: dict[str, Path]) -> None:
    log = fakes(tmp_path, monkeypatch, fake_libraries)
    runner, recorder, _ = booted(tmp_path, monkeypatch, expectGpuDirectRdma=True)
    assert runner.config.expect_gpudirect_rdma is True
    runner.startup()
    assert recorder.sent == [("True", "Passed")]
    assert "GPUDirect RDMA (DMA-BUF): 2 GPUs on 2 InfiniBand HCAs, 4 registrations" in (runner.state.message or "")
    assert any("ibv_reg_dmabuf_mr(" in line for line in calls(log))


def test_a_node_whose_hca_refuses_dma_buf_is_taken_out_and_stays_out(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_libraries: dict[str, Path]) -> None:
    fakes(tmp_path, monkeypatch, fake_libraries, FAKE_IB_REG_FAIL="*:95")
    runner, recorder, _ = booted(tmp_path, monkeypatch, expectGpuDirectRdma=True)
    runner.startup()
    assert recorder.sent == [("False", "GpudirectRdmaUnavailable")]
    message = runner.state.message or ""
    assert message.startswith("gpudirect-rdma-unavailable: GPU 0 (0000:10:00.0): ")
    assert "ibv_reg_dmabuf_mr on HCA mlx5_ib0, mlx5_ib1: errno 95 (EOPNOTSUPP" in message
    assert runner.record is not None
    assert (runner.record.checks["active"]["result"], runner.record.checks["passive"]["result"]) == \
        ("failed", "passed"), "the probe's findings are the active check's"
    # the next passive check judges the probe's recorded answer again: still named, still out
    readings, found, _ = agent.check(runner.config, runner.config.state_dir / "readings", False, None)
    assert readings is not None and readings.gpudirect is not None
    assert {f.check for f in found} == {"gpudirect-rdma-unavailable"}


def test_no_infiniband_device_at_boot_is_awaited_until_the_fabric_waits_deadline(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_libraries: dict[str, Path]) -> None:
    log = fakes(tmp_path, monkeypatch, fake_libraries, FAKE_IB_DEVICES="")
    runner, recorder, clock = booted(tmp_path, monkeypatch, expectGpuDirectRdma=True, fabricWaitSeconds=30)
    sleep = clock.sleep

    def attach(seconds: float) -> None:  # the InfiniBand virtual functions arrive 20 s in
        sleep(seconds)
        if clock.now >= 20:
            os.environ["FAKE_IB_DEVICES"] = "mlx5_ib0"

    monkeypatch.setattr(clock, "sleep", attach)
    runner.startup()
    assert recorder.sent == [("True", "Passed")] and clock.now == 20
    assert len({line.split()[0] for line in calls(log)}) == 3, "probed at 0, 10 and 20 s, each in a new child"
    # never there: a fault once the wait is up, naming what is missing
    (tmp_path / "never").mkdir()
    fakes(tmp_path / "never", monkeypatch, fake_libraries, FAKE_IB_DEVICES="")
    runner, recorder, clock = booted(tmp_path / "never", monkeypatch, expectGpuDirectRdma=True, fabricWaitSeconds=30)
    runner.startup()
    assert recorder.sent == [("False", "GpudirectRdmaNoHca")] and clock.now == 30
    assert "libibverbs lists no RDMA device" in (runner.state.message or "")


def test_without_the_config_key_the_probe_never_runs_and_libibverbs_is_never_loaded(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_libraries: dict[str, Path]) -> None:
    log = fakes(tmp_path, monkeypatch, fake_libraries, FAKE_IB_REG_FAIL="*:95")  # it would fail, were it run
    runner, recorder, _ = booted(tmp_path, monkeypatch)
    assert runner.config.expect_gpudirect_rdma is False
    runner.startup()
    assert recorder.sent == [("True", "Passed")] and runner.state.last_active > 0, "the active check ran"
    assert calls(log) == [], "no process loaded the fake libibverbs or libcuda"
    assert not loaded_here("libibverbs.so.1")
    assert "GPUDirect" not in (runner.state.message or "")
    assert not (runner.config.state_dir / "readings" / "gpudirect.json").exists()
    # the control: the same node with the key probes, and fails
    (tmp_path / "with").mkdir()
    log = fakes(tmp_path / "with", monkeypatch, fake_libraries, FAKE_IB_REG_FAIL="*:95")
    runner, recorder, _ = booted(tmp_path / "with", monkeypatch, expectGpuDirectRdma=True)
    runner.startup()
    assert recorder.sent == [("False", "GpudirectRdmaUnavailable")] and any("ibverbs loaded" in x for x in calls(log))


def test_a_passive_check_never_probes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      fake_libraries: dict[str, Path]) -> None:
    log = fakes(tmp_path, monkeypatch, fake_libraries)
    monkeypatch.setenv("PATH", f"{fake_nvidia_smi(tmp_path)}:{os.environ['PATH']}")
    config = agent.load_config(config_file(tmp_path, expectGpuDirectRdma=True))
    readings, found, _ = agent.check(config, tmp_path / "work", False, None)
    assert readings is not None and readings.gpudirect is None and found == []
    assert calls(log) == [], "the GPUs may be a job's: no CUDA context, no registration"


@pytest.mark.parametrize("value", ["true", 1, None])
def test_expect_gpudirect_rdma_must_be_a_boolean(tmp_path: Path, value: object) -> None:
    path = config_file(tmp_path, expectGpuDirectRdma=value)
    if value is None:  # left out: false
        assert agent.load_config(path).expect_gpudirect_rdma is False
        return
    with pytest.raises(agent.ConfigError, match=f"expectGpuDirectRdma must be true or false, not {value!r}"):
        agent.load_config(path)


@pytest.mark.parametrize("stack", ["local", "research-2500", "research-7500"])
def test_the_rendered_config_asks_infiniband_pools_only_for_the_probe(plans: dict[str, ClusterPlan], stack: str,
                                                                      tmp_path: Path) -> None:
    pools = [pool for pool in plans[stack].node_pools if pool.gpus_per_node]
    for pool in pools:
        path = tmp_path / f"{pool.name}.json"
        path.write_text(render_pool(plans[stack], pool)[GPU_HEALTH_CONFIG].content)
        assert json.loads(path.read_text()).get("expectGpuDirectRdma", False) is pool.infiniband, pool.name
        assert agent.load_config(path).expect_gpudirect_rdma is pool.infiniband
    if stack == "research-7500":
        assert {p.name for p in pools if p.infiniband} >= {"a100-ib", "h100-ib"}
    if stack == "research-2500":  # a GPU pool without InfiniBand (NC A100 v4, PCIe) is not asked
        assert [(p.name, p.infiniband) for p in pools] == [("nc-a100", False)]
